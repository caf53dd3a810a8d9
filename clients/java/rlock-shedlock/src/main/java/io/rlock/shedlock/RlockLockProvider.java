// ShedLock's LockProvider on rlock (rlock-shedlock): @SchedulerLock jobs take rlock's lock,
// so a scheduled job runs on one instance at a time. ShedLock never waits for a lock (a
// busy lock skips the run), so this is rlock's one-try acquire with the job's lease.
package io.rlock.shedlock;

import io.rlock.RlockClient;
import io.rlock.RlockLock;
import net.javacrumbs.shedlock.core.AbstractSimpleLock;
import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.ExtensibleLockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;

import java.time.Duration;
import java.time.Instant;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A ShedLock {@link ExtensibleLockProvider} storing each job's lock as rlock's lock (Redisson's
 * RLock layout) at {@code <prefix>:<lock name>}.
 *
 * <ul>
 *   <li>{@code lockAtMostFor} is the lock's lease: a process that dies mid-job frees the
 *       job when it runs out, and not before.</li>
 *   <li>{@code lockAtLeastFor}: an unlock before it shortens the lease to what is left of
 *       it instead of releasing, so the job does not run again elsewhere sooner.</li>
 *   <li>{@link SimpleLock#extend} sets a held lock's lease anew ({@code KeepAliveLockProvider}
 *       wraps this provider to extend long jobs).</li>
 * </ul>
 *
 * Each acquisition is its own owner ({@code <client id>:<negative sequence>}), not the
 * thread's: a job's lock is never re-entered, and a lock taken on one thread can be released
 * on another, as ShedLock allows.
 */
public class RlockLockProvider implements ExtensibleLockProvider {
    /** The default key prefix of job locks. */
    public static final String DEFAULT_PREFIX = "shedlock";
    /** Owners of acquisitions, below every real thread id. */
    private static final AtomicLong OWNERS = new AtomicLong();

    private final RlockClient client;
    private final String prefix;

    public RlockLockProvider(RlockClient client) {
        this(client, DEFAULT_PREFIX);
    }

    /** @param prefix key prefix (ShedLock's Redis provider uses the environment name alike) */
    public RlockLockProvider(RlockClient client, String prefix) {
        this.client = Objects.requireNonNull(client, "client");
        if (prefix == null || prefix.isEmpty()) {
            throw new IllegalArgumentException("prefix must be a non-empty string");
        }
        this.prefix = prefix;
    }

    /** The server key of the job lock `name`. */
    public String keyOf(String name) {
        return prefix + ":" + name;
    }

    @Override
    public Optional<SimpleLock> lock(LockConfiguration config) {
        long lease = leaseUntil(config.getLockAtMostUntil());
        if (lease <= 0) {
            return Optional.empty();
        }
        RlockLock lock = client.getLock(keyOf(config.getName()));
        long owner = -OWNERS.incrementAndGet();
        boolean held = lock.tryLockAsync(0, lease, TimeUnit.MILLISECONDS, owner).join();
        return held ? Optional.of(new Held(config, lock, owner)) : Optional.empty();
    }

    /** Milliseconds from now until `t` (0 when past). */
    private static long leaseUntil(Instant t) {
        return Math.max(0, Duration.between(ClockProvider.now(), t).toMillis());
    }

    /** One held job lock. */
    private static final class Held extends AbstractSimpleLock {
        private final RlockLock lock;
        private final long owner;

        Held(LockConfiguration config, RlockLock lock, long owner) {
            super(config);
            this.lock = lock;
            this.owner = owner;
        }

        @Override
        protected void doUnlock() {
            long keep = leaseUntil(lockConfiguration.getLockAtLeastUntil());
            if (keep > 0) {
                // lockAtLeastFor not over: the lock stays until then, and goes by itself.
                if (lock.renewLeaseAsync(keep, TimeUnit.MILLISECONDS, owner).join()) {
                    return;
                }
            }
            try {
                lock.unlockAsync(owner).join();
            } catch (java.util.concurrent.CompletionException e) {
                if (!(e.getCause() instanceof IllegalMonitorStateException)) {
                    throw e;
                }
                // The lease ran out before the job ended (lockAtMostFor too short): nothing to release.
            }
        }

        @Override
        protected Optional<SimpleLock> doExtend(LockConfiguration next) {
            long lease = leaseUntil(next.getLockAtMostUntil());
            if (lease <= 0 || !lock.renewLeaseAsync(lease, TimeUnit.MILLISECONDS, owner).join()) {
                return Optional.empty();
            }
            return Optional.of(new Held(next, lock, owner));
        }
    }
}
