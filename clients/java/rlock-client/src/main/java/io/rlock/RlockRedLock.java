// Redis's Redlock over independent servers (clients/java; Redisson's RedissonRedLock, the
// Rust client's RedLock in clients/rust/src/aio/multi.rs): one lock per server, each an
// RlockLock of its own client, held when a majority granted it within a validity time that
// allows for clock drift.
package io.rlock;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;

/**
 * Holds a majority ({@link #quorum()}) of its locks, each on an independent server. An
 * acquire goes in rounds: each asks every server at once for one try (waiting for each
 * answer up to the server timeout, not in the servers' queues); it succeeds when a quorum granted the lock and some
 * validity is left: the lease, less the time the acquire took, less the drift allowance
 * (1 % of the lease plus 2 ms, Redis's Redlock formula). Otherwise it gives back what it
 * got. The critical section must end within {@link #getValidity()}; a lock kept by the
 * watchdog (no lease) is valid for the watchdog's lease from the acquire, renewed as each
 * part's is. Release frees the lock on every server, granted late or not.
 *
 * <pre>{@code
 * RlockRedLock red = new RlockRedLock(a.getLock("job"), b.getLock("job"), c.getLock("job"));
 * if (red.tryLock(1, 10, TimeUnit.SECONDS)) {
 *     try { ... work within red.getValidity() ... } finally { red.unlock(); }
 * }
 * }</pre>
 */
public class RlockRedLock implements Lock {
    /** How long a round waits for each server's answer by default. */
    public static final Duration DEFAULT_SERVER_TIMEOUT = Duration.ofMillis(250);

    private final List<RlockLock> locks;
    private volatile Duration serverTimeout = DEFAULT_SERVER_TIMEOUT;
    /** When each holding thread's validity ends (nanoTime). */
    private final Map<Long, Long> validUntil = new ConcurrentHashMap<>();

    public RlockRedLock(RlockLock... locks) {
        this(List.of(locks));
    }

    public RlockRedLock(List<RlockLock> locks) {
        if (locks.isEmpty()) {
            throw new IllegalArgumentException("a RedLock needs at least one lock");
        }
        this.locks = List.copyOf(locks);
    }

    public List<RlockLock> getLocks() {
        return locks;
    }

    /**
     * How long a round waits for each server's answer (at least 1 ms): a server slower
     * than that counts as not granting (a grant that comes later is given back).
     */
    public RlockRedLock withServerTimeout(Duration d) {
        this.serverTimeout = d.toMillis() < 1 ? Duration.ofMillis(1) : d;
        return this;
    }

    /** How many locks must be held: more than half. */
    public int quorum() {
        return locks.size() / 2 + 1;
    }

    /** The clock-drift allowance of a lease: 1 % of it plus 2 ms. */
    public static Duration drift(Duration lease) {
        return lease.dividedBy(100).plusMillis(2);
    }

    /**
     * The validity left to a lock taken with `lease` in `elapsed`: lease - elapsed - drift,
     * or zero when nothing is left (the acquire failed).
     */
    public static Duration validity(Duration lease, Duration elapsed) {
        Duration v = lease.minus(elapsed).minus(drift(lease));
        return v.isNegative() ? Duration.ZERO : v;
    }

    /** The validity left to the current thread's hold (zero when it holds none). */
    public Duration getValidity() {
        return getValidity(RlockLock.currentThreadId());
    }

    public Duration getValidity(long threadId) {
        Long until = validUntil.get(threadId);
        if (until == null) {
            return Duration.ZERO;
        }
        long left = until - System.nanoTime();
        return left > 0 ? Duration.ofNanos(left) : Duration.ZERO;
    }

    // ---- the core -----------------------------------------------------------------------------

    /**
     * Rounds until held or `waitMs` has passed (-1: one round; {@link Long#MAX_VALUE}: no
     * limit). A round asks every server at once for one try and counts the grants that
     * come within the server timeout; it holds when a quorum granted with validity left,
     * else it gives back what was granted (a late grant too) and, time left, the next
     * round starts after a random pause of up to {@link RlockMultiLock#ROUND_PAUSE_MS}.
     */
    CompletableFuture<Boolean> acquire(long waitMs, long leaseTime, TimeUnit unit, long threadId) {
        long leaseMs = RlockMultiLock.leaseMs(leaseTime, unit);
        long deadline = waitMs == Long.MAX_VALUE ? Long.MAX_VALUE
                : System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(Math.max(0, waitMs));
        CompletableFuture<Boolean> result = new CompletableFuture<>();
        round(result, deadline, leaseMs, threadId);
        return result;
    }

    private void round(CompletableFuture<Boolean> result, long deadline, long leaseMs, long threadId) {
        if (result.isDone()) {
            return;
        }
        long started = System.nanoTime();
        List<CompletableFuture<Boolean>> parts = new ArrayList<>();
        for (RlockLock l : locks) {
            CompletableFuture<Boolean> asked = l.tryLockAsync(-1, leaseMs, TimeUnit.MILLISECONDS, threadId);
            // A grant that comes after the server timeout is not counted: given back.
            CompletableFuture<Boolean> counted = asked.copy()
                    .completeOnTimeout(false, serverTimeout.toMillis(), TimeUnit.MILLISECONDS);
            asked.whenComplete((ok, e) -> {
                if (e == null && ok && Boolean.FALSE.equals(counted.getNow(null))) {
                    l.release(threadId).exceptionally(x -> null);
                }
            });
            parts.add(counted);
        }
        CompletableFuture.allOf(parts.toArray(CompletableFuture[]::new)).whenComplete((v, e) -> {
            List<RlockLock> held = new ArrayList<>();
            Throwable failure = null;
            for (int i = 0; i < parts.size(); i++) {
                CompletableFuture<Boolean> p = parts.get(i);
                if (!p.isCompletedExceptionally() && Boolean.TRUE.equals(p.join())) {
                    held.add(locks.get(i));
                } else if (p.isCompletedExceptionally() && failure == null) {
                    failure = p.handle((x, err) -> err).join();
                }
            }
            // The validity counts from before the first request: each part's lease may have
            // started as early as that.
            Duration lease = Duration.ofMillis(leaseMs > 0 ? leaseMs : watchdogLeaseMs());
            Duration valid = validity(lease, Duration.ofNanos(System.nanoTime() - started));
            if (held.size() >= quorum() && !valid.isZero()) {
                validUntil.put(threadId, started + lease.minus(drift(lease)).toNanos());
                if (result.complete(true)) {
                    return;
                }
                validUntil.remove(threadId); // cancelled meanwhile
            }
            RlockMultiLock.releaseAll(held, threadId).exceptionally(x -> null);
            long pause = ThreadLocalRandom.current().nextLong(RlockMultiLock.ROUND_PAUSE_MS + 1);
            if (result.isDone()) {
                return;
            }
            if (deadline - System.nanoTime() <= TimeUnit.MILLISECONDS.toNanos(pause)) {
                if (held.isEmpty() && failure != null && failure == firstOfAll(parts)) {
                    result.completeExceptionally(Wire.unwrap(failure)); // no server answered: say why
                } else {
                    result.complete(false);
                }
                return;
            }
            CompletableFuture.delayedExecutor(pause, TimeUnit.MILLISECONDS)
                    .execute(() -> round(result, deadline, leaseMs, threadId));
        });
    }

    /** The first failure when every part failed, else null. */
    private static Throwable firstOfAll(List<CompletableFuture<Boolean>> parts) {
        Throwable first = null;
        for (CompletableFuture<Boolean> p : parts) {
            if (!p.isCompletedExceptionally()) {
                return null;
            }
            if (first == null) {
                first = p.handle((x, err) -> err).join();
            }
        }
        return first;
    }

    /** The shortest watchdog lease of the parts' clients. */
    private long watchdogLeaseMs() {
        long min = Long.MAX_VALUE;
        for (RlockLock l : locks) {
            min = Math.min(min, l.client.watchdog().leaseMs());
        }
        return min;
    }

    /** Rounds of {@link #acquire} until held. */
    CompletableFuture<Void> acquireForever(long leaseTime, TimeUnit unit, long threadId) {
        return acquire(Long.MAX_VALUE, leaseTime, unit, threadId).thenApply(ok -> null);
    }

    /**
     * Frees `threadId`'s hold on every server (one that granted after the acquire gave up
     * included). Completes true when a quorum was still held.
     */
    CompletableFuture<Boolean> releaseEverywhere(long threadId) {
        validUntil.remove(threadId);
        List<CompletableFuture<Boolean>> all = new ArrayList<>();
        for (RlockLock l : locks) {
            all.add(l.release(threadId).handle((last, e) -> e == null));
        }
        return CompletableFuture.allOf(all.toArray(CompletableFuture[]::new))
                .thenApply(v -> all.stream().filter(CompletableFuture::join).count() >= quorum());
    }

    // ---- java.util.concurrent.locks.Lock ------------------------------------------------------

    @Override
    public void lock() {
        Sync.uninterruptibly(acquireForever(-1, TimeUnit.MILLISECONDS, RlockLock.currentThreadId()));
    }

    public void lock(long leaseTime, TimeUnit unit) {
        Sync.uninterruptibly(acquireForever(leaseTime, unit, RlockLock.currentThreadId()));
    }

    @Override
    public void lockInterruptibly() throws InterruptedException {
        lockInterruptibly(-1, TimeUnit.MILLISECONDS);
    }

    public void lockInterruptibly(long leaseTime, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        Sync.interruptibly(acquireForever(leaseTime, unit, RlockLock.currentThreadId()));
    }

    /** One try on every server. */
    @Override
    public boolean tryLock() {
        return Sync.join(acquire(-1, -1, TimeUnit.MILLISECONDS, RlockLock.currentThreadId()));
    }

    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        return tryLock(time, -1, unit);
    }

    /** Each server's queue waited on up to `waitTime`; leaseTime -1: the watchdog keeps the parts. */
    public boolean tryLock(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        return Sync.interruptibly(tryLockAsync(waitTime, leaseTime, unit, RlockLock.currentThreadId()));
    }

    /**
     * Frees the lock on every server.
     *
     * @throws IllegalMonitorStateException when fewer than a quorum were still held (the
     *         validity ran out, or parts were lost: the critical section may have run
     *         unprotected)
     */
    @Override
    public void unlock() {
        long tid = RlockLock.currentThreadId();
        if (!Sync.join(releaseEverywhere(tid))) {
            throw new IllegalMonitorStateException("RedLock " + locks.get(0).getName() + ": fewer than "
                    + quorum() + " of " + locks.size() + " servers still held it for thread " + tid);
        }
    }

    @Override
    public Condition newCondition() {
        throw new UnsupportedOperationException("newCondition: a distributed lock keeps no wait-set");
    }

    // ---- CompletionStage twins ----------------------------------------------------------------

    public CompletableFuture<Void> lockAsync(long leaseTime, TimeUnit unit, long threadId) {
        return acquireForever(leaseTime, unit, threadId);
    }

    public CompletableFuture<Boolean> tryLockAsync(long waitTime, long leaseTime, TimeUnit unit, long threadId) {
        return acquire(waitTime <= 0 ? -1 : Math.max(1, unit.toMillis(waitTime)), leaseTime, unit, threadId);
    }

    /** Frees the lock on every server; true when a quorum was still held. */
    public CompletableFuture<Boolean> unlockAsync(long threadId) {
        return releaseEverywhere(threadId);
    }
}
