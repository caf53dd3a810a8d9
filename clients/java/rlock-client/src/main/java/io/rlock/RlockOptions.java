// Options of an RlockClient (clients/java): the watchdog, retries, how waits are done,
// replica sync and the mode (module or Redisson's scripts). Immutable; every option is a
// `with*` method returning a copy, with its default in a DEFAULT_* constant, as the Rust
// client's options are.
package io.rlock;

import java.time.Duration;
import java.util.Objects;

/** How an {@link RlockClient} waits, renews and retries. Immutable; start from {@link #defaults()}. */
public final class RlockOptions {
    /** Lease of a lock taken without one, renewed every third of it (Redisson's lockWatchdogTimeout). */
    public static final Duration DEFAULT_WATCHDOG_TIMEOUT = Duration.ofSeconds(30);
    /** Tries of a command that failed transiently (first try included). */
    public static final int DEFAULT_RETRY_ATTEMPTS = 3;
    public static final Duration DEFAULT_RETRY_BASE_DELAY = Duration.ofMillis(50);
    public static final Duration DEFAULT_RETRY_MAX_DELAY = Duration.ofSeconds(1);
    /** How long an acquire waits for replicas to acknowledge it (Redisson's slavesSyncTimeout). */
    public static final Duration DEFAULT_REPLICA_TIMEOUT = Duration.ofSeconds(1);
    /** Replica sync's default: wait for every replica the server has connected (Redisson's checkLockSyncedSlaves). */
    public static final int REPLICAS_CONNECTED = -1;

    /** How a waiting call waits in the server. */
    public enum WaitMode {
        /** Queued tickets when the module takes them (design.md 5), else a blocked connection per waiter. */
        AUTO,
        /** Queued tickets only: a module without them is an error. */
        TICKETS,
        /** `WAIT` without `ASYNC`: each waiting call blocks a connection of its own in the server. */
        BLOCKING
    }

    /** Which backend runs the primitives (docs/scripts-mode.md). */
    public enum Mode {
        /**
         * The module where the server has it, else Redisson's scripts: asked once with
         * {@code RLOCK.HELLO} (an unknown command means no module) and again after a
         * reconnect or when a module command comes back unknown.
         */
        AUTO,
        /** The module's commands; without the module they fail with the server's unknown command. */
        MODULE,
        /** Redisson's Lua scripts and pub/sub, also on a module-loaded server (both interoperate on the same names). */
        SCRIPTS
    }

    private final Duration watchdogTimeout;
    private final int retryAttempts;
    private final Duration retryBaseDelay;
    private final Duration retryMaxDelay;
    private final WaitMode waitMode;
    private final int replicas;
    private final Duration replicaTimeout;
    private final Mode mode;

    private RlockOptions(Duration watchdogTimeout, int retryAttempts, Duration retryBaseDelay,
                         Duration retryMaxDelay, WaitMode waitMode, int replicas, Duration replicaTimeout, Mode mode) {
        this.watchdogTimeout = watchdogTimeout;
        this.retryAttempts = retryAttempts;
        this.retryBaseDelay = retryBaseDelay;
        this.retryMaxDelay = retryMaxDelay;
        this.waitMode = waitMode;
        this.replicas = replicas;
        this.replicaTimeout = replicaTimeout;
        this.mode = mode;
    }

    public static RlockOptions defaults() {
        return new RlockOptions(DEFAULT_WATCHDOG_TIMEOUT, DEFAULT_RETRY_ATTEMPTS, DEFAULT_RETRY_BASE_DELAY,
                DEFAULT_RETRY_MAX_DELAY, WaitMode.AUTO, REPLICAS_CONNECTED, DEFAULT_REPLICA_TIMEOUT, Mode.AUTO);
    }

    private static Duration positive(Duration d, String what) {
        Objects.requireNonNull(d, what);
        if (d.isNegative() || d.isZero()) {
            throw new IllegalArgumentException(what + " must be positive, got " + d);
        }
        return d;
    }

    /** Lease of locks and permits taken without a lease; renewed every third of it. */
    public RlockOptions withWatchdogTimeout(Duration d) {
        positive(d, "watchdogTimeout");
        if (d.toMillis() < 3) {
            throw new IllegalArgumentException("watchdogTimeout must be at least 3 ms, got " + d);
        }
        return new RlockOptions(d, retryAttempts, retryBaseDelay, retryMaxDelay, waitMode, replicas, replicaTimeout, mode);
    }

    /** Tries of a transiently failing command, the first included (1: no retry). */
    public RlockOptions withRetryAttempts(int n) {
        if (n < 1) {
            throw new IllegalArgumentException("retryAttempts must be at least 1, got " + n);
        }
        return new RlockOptions(watchdogTimeout, n, retryBaseDelay, retryMaxDelay, waitMode, replicas, replicaTimeout, mode);
    }

    /** First retry delay (doubled per retry up to the max, with jitter) and the cap. */
    public RlockOptions withRetryDelays(Duration base, Duration max) {
        positive(base, "retryBaseDelay");
        positive(max, "retryMaxDelay");
        return new RlockOptions(watchdogTimeout, retryAttempts, base, max, waitMode, replicas, replicaTimeout, mode);
    }

    public RlockOptions withWaitMode(WaitMode waitMode) {
        return new RlockOptions(watchdogTimeout, retryAttempts, retryBaseDelay, retryMaxDelay,
                Objects.requireNonNull(waitMode, "waitMode"), replicas, replicaTimeout, mode);
    }

    /** Module or scripts (default {@link Mode#AUTO}: the module where the server has it). */
    public RlockOptions withMode(Mode mode) {
        return new RlockOptions(watchdogTimeout, retryAttempts, retryBaseDelay, retryMaxDelay, waitMode, replicas,
                replicaTimeout, Objects.requireNonNull(mode, "mode"));
    }

    /**
     * Replica sync (Redisson's checkLockSyncedSlaves, on by default as there): after every
     * lock acquire, `WAIT replicas timeout`; when fewer replicas acknowledge, the acquire is
     * undone and fails with {@link ReplicaSyncException}. `replicas`: a count, 0 for no
     * wait, or {@link #REPLICAS_CONNECTED} (the default) for every replica the server has
     * connected, read with ROLE at most once a second (none: no WAIT is sent at all).
     */
    public RlockOptions withReplicaSync(int replicas, Duration timeout) {
        if (replicas < REPLICAS_CONNECTED) {
            throw new IllegalArgumentException("replicas must be >= 0, or REPLICAS_CONNECTED, got " + replicas);
        }
        positive(timeout, "replicaTimeout");
        return new RlockOptions(watchdogTimeout, retryAttempts, retryBaseDelay, retryMaxDelay, waitMode, replicas, timeout, mode);
    }

    /** No replica sync: an acquire answers as soon as the primary granted it. */
    public RlockOptions withoutReplicaSync() {
        return new RlockOptions(watchdogTimeout, retryAttempts, retryBaseDelay, retryMaxDelay, waitMode, 0, replicaTimeout, mode);
    }

    public Duration watchdogTimeout() { return watchdogTimeout; }
    public int retryAttempts() { return retryAttempts; }
    public Duration retryBaseDelay() { return retryBaseDelay; }
    public Duration retryMaxDelay() { return retryMaxDelay; }
    public WaitMode waitMode() { return waitMode; }
    public int replicas() { return replicas; }
    public Duration replicaTimeout() { return replicaTimeout; }
    public Mode mode() { return mode; }
}
