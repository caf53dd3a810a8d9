// Several locks taken as one, all or none (clients/java; Redisson's RedissonMultiLock, the
// Rust client's MultiLock in clients/rust/src/aio/multi.rs). Each part is an ordinary
// RlockLock of its own client (one server, a cluster, or several servers): it waits in its
// server's queue, is renewed by its client's watchdog and released as usual.
package io.rlock;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;

/**
 * Holds every one of its locks or none. The locks are taken one after the other in one
 * order (by name), so two multi-locks over overlapping sets wait for each other in the
 * servers' queues instead of deadlocking; a wait without limit goes in rounds (at most
 * {@link #ROUND_WAIT_PER_LOCK_MS} per lock each), giving back what it took between rounds,
 * as Redisson's {@code lock()} does.
 *
 * <pre>{@code
 * RlockMultiLock both = new RlockMultiLock(rlock.getLock("account:1"), rlock.getLock("account:2"));
 * if (both.tryLock(5, 30, TimeUnit.SECONDS)) {
 *     try { ... } finally { both.unlock(); }
 * }
 * }</pre>
 */
public class RlockMultiLock implements Lock {
    /** How long one round of a wait without limit may take, per lock. */
    public static final long ROUND_WAIT_PER_LOCK_MS = 1_500;
    /** Upper bound of the random pause between two rounds. */
    static final long ROUND_PAUSE_MS = 100;

    final List<RlockLock> locks;

    public RlockMultiLock(RlockLock... locks) {
        this(List.of(locks));
    }

    public RlockMultiLock(List<RlockLock> locks) {
        if (locks.isEmpty()) {
            throw new IllegalArgumentException("a multi-lock needs at least one lock");
        }
        List<RlockLock> sorted = new ArrayList<>(locks);
        sorted.sort(Comparator.comparing(RlockLock::getName)); // stable: equal names keep their order
        this.locks = List.copyOf(sorted);
    }

    /** The parts, in the order they are taken. */
    public List<RlockLock> getLocks() {
        return locks;
    }

    // ---- the core -----------------------------------------------------------------------------

    /**
     * Takes every part for `threadId`, one after the other, within `waitMs` in all (-1: one
     * try each). Completes false (nothing held) when one could not be had; cancelling the
     * future ends the wait in progress and gives back what was taken.
     */
    CompletableFuture<Boolean> acquire(long waitMs, long leaseTime, TimeUnit unit, long threadId) {
        RlockLock.leaseOf(leaseTime, unit); // refuses a zero lease before anything is taken
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(Math.max(0, waitMs));
        CompletableFuture<Boolean> result = new CompletableFuture<>();
        step(result, 0, waitMs < 0, deadline, leaseTime, unit, threadId);
        return result;
    }

    private void step(CompletableFuture<Boolean> result, int i, boolean once, long deadline, long leaseTime,
                      TimeUnit unit, long threadId) {
        if (i == locks.size()) {
            if (!result.complete(true)) {
                giveBack(i, threadId); // cancelled meanwhile
            }
            return;
        }
        if (result.isDone()) {
            giveBack(i, threadId);
            return;
        }
        // What is left of the wait; 0 or less is one try.
        long left = once ? -1 : TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
        CompletableFuture<Boolean> part = locks.get(i).tryLockAsync(left, leaseMs(leaseTime, unit),
                TimeUnit.MILLISECONDS, threadId);
        result.whenComplete((v, e) -> {
            if (result.isCancelled()) {
                part.cancel(true); // the part's wait leaves nothing behind
            }
        });
        part.whenComplete((ok, e) -> {
            if (e == null && ok) {
                step(result, i + 1, once, deadline, leaseTime, unit, threadId);
                return;
            }
            giveBack(i, threadId);
            if (e != null) {
                result.completeExceptionally(Wire.unwrap(e));
            } else {
                result.complete(false);
            }
        });
    }

    /** A lease in ms for the parts: -1 (the watchdog) for any negative one. */
    static long leaseMs(long leaseTime, TimeUnit unit) {
        return leaseTime < 0 ? -1 : Math.max(1, unit.toMillis(leaseTime));
    }

    /** Releases the first `n` parts (one hold each), whatever fails. */
    private void giveBack(int n, long threadId) {
        for (int j = n - 1; j >= 0; j--) {
            locks.get(j).unlockAsync(threadId).exceptionally(e -> null);
        }
    }

    /** Rounds of {@link #acquire} until every part is held. */
    CompletableFuture<Void> acquireForever(long leaseTime, TimeUnit unit, long threadId) {
        CompletableFuture<Void> out = new CompletableFuture<>();
        round(out, leaseTime, unit, threadId);
        return out;
    }

    private void round(CompletableFuture<Void> out, long leaseTime, TimeUnit unit, long threadId) {
        if (out.isDone()) {
            return;
        }
        CompletableFuture<Boolean> r = acquire(ROUND_WAIT_PER_LOCK_MS * locks.size(), leaseTime, unit, threadId);
        out.whenComplete((v, e) -> {
            if (out.isCancelled()) {
                r.cancel(true);
            }
        });
        r.whenComplete((ok, e) -> {
            if (e != null) {
                out.completeExceptionally(Wire.unwrap(e));
            } else if (ok) {
                if (!out.complete(null)) {
                    giveBack(locks.size(), threadId);
                }
            } else {
                long pause = ThreadLocalRandom.current().nextLong(ROUND_PAUSE_MS + 1);
                CompletableFuture.delayedExecutor(pause, TimeUnit.MILLISECONDS)
                        .execute(() -> round(out, leaseTime, unit, threadId));
            }
        });
    }

    // ---- java.util.concurrent.locks.Lock ------------------------------------------------------

    /** Waits (uninterruptibly) until every part is held; the watchdog keeps them. */
    @Override
    public void lock() {
        Sync.uninterruptibly(acquireForever(-1, TimeUnit.MILLISECONDS, RlockLock.currentThreadId()));
    }

    /** Waits until every part is held for `leaseTime` (-1: the watchdog keeps them). */
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

    /** One try of each part, no wait: all held, or none. */
    @Override
    public boolean tryLock() {
        return Sync.join(acquire(-1, -1, TimeUnit.MILLISECONDS, RlockLock.currentThreadId()));
    }

    /** Waits up to `time` in all for every part. */
    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        return tryLock(time, -1, unit);
    }

    /** Redisson's tryLock(waitTime, leaseTime, unit); leaseTime -1: the watchdog keeps the parts. */
    public boolean tryLock(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        return Sync.interruptibly(acquire(waitTime <= 0 ? -1 : Math.max(1, unit.toMillis(waitTime)), leaseTime, unit,
                RlockLock.currentThreadId()));
    }

    /**
     * Releases every part (one hold each), all of them tried.
     *
     * @throws IllegalMonitorStateException (or the first failure) when a part was not held:
     *         lost meanwhile, or never taken
     */
    @Override
    public void unlock() {
        Sync.join(unlockAsync(RlockLock.currentThreadId()));
    }

    /** Not supported, as for {@link RlockLock#newCondition()}. */
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

    public CompletableFuture<Void> unlockAsync(long threadId) {
        return releaseAll(locks, threadId);
    }

    /** Releases one hold of each of `parts`; fails with the first failure once all were tried. */
    static CompletableFuture<Void> releaseAll(List<RlockLock> parts, long threadId) {
        List<CompletableFuture<Void>> all = new ArrayList<>();
        for (int i = parts.size() - 1; i >= 0; i--) {
            all.add(parts.get(i).unlockAsync(threadId));
        }
        return CompletableFuture.allOf(all.toArray(CompletableFuture[]::new)).handle((v, e) -> {
            for (CompletableFuture<Void> f : all) {
                if (f.isCompletedExceptionally()) {
                    throw Sync.rethrow(f.handle((x, err) -> err).join());
                }
            }
            return null;
        });
    }
}
