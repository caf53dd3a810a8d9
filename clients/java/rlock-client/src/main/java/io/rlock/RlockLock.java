// The re-entrant lock of the rlock Java client (clients/java; design.md 1, 6): a
// java.util.concurrent.locks.Lock over RLOCK.*, owned per thread like Redisson's RLock
// (`<client id>:<thread id>`), with Redisson's extras and a CompletionStage twin of every
// blocking method. The fenced lock and both halves of the read-write lock are this class
// with other commands (the package-private hooks below), so the waiting, watchdog, lost
// signal, retries and JDK conventions are written once.
package io.rlock;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;

/**
 * A distributed re-entrant lock. Each thread is its own owner, as with
 * {@link java.util.concurrent.locks.ReentrantLock} and Redisson's RLock; the async methods
 * take an explicit thread id for code that acquires on one thread and releases on another.
 *
 * <p>Without a lease the lock is held for the watchdog timeout (30 s) and renewed every
 * third of it until unlocked; a renewal that finds it gone tells {@link #addLostListener}
 * listeners and {@link #isLost()}. Waiting happens in the server, first come first served.
 */
public class RlockLock implements Lock {
    final RlockClient client;
    final String name;
    private final List<LockLostListener> listeners = new CopyOnWriteArrayList<>();
    /** Owners whose hold was found lost, until they acquire again. */
    private final Map<String, String> lost = new ConcurrentHashMap<>();
    /**
     * Owners holding on a grant message whose confirmation may still be held back: their
     * next release carries it ({@link Waits#sendBehind}).
     */
    private final Map<String, Waits.Confirm> unconfirmed = new ConcurrentHashMap<>();
    /** What this handle's waiting acquires found lately (whether the next one asks first). */
    final Contention seen = new Contention();

    /** The outcome of an acquire: held or not; the fenced lock's token; the holder's PTTL. */
    record Acquired(boolean held, Long token, Long pttl) {}

    RlockLock(RlockClient client, String name) {
        if (name == null || name.isEmpty()) {
            throw new IllegalArgumentException("a lock needs a non-empty name");
        }
        this.client = client;
        this.name = name;
    }

    public String getName() {
        return name;
    }

    // ---- hooks: the commands of this kind of lock -----------------------------------------

    List<String> acquireArgs(String owner, long leaseMs) {
        return new ArrayList<>(List.of("RLOCK.ACQUIRE", name, owner, Long.toString(leaseMs)));
    }

    Acquired parseAcquire(Object reply) {
        return reply == null ? new Acquired(true, null, null) : new Acquired(false, null, Sync.asLong(reply));
    }

    List<String> releaseArgs(String owner) {
        return new ArrayList<>(List.of("RLOCK.RELEASE", name, owner));
    }

    List<String> renewArgs(String owner, long leaseMs) {
        return List.of("RLOCK.RENEW", name, owner, Long.toString(leaseMs));
    }

    List<String> forceArgs() {
        return List.of("RLOCK.FORCERELEASE", name);
    }

    /** The hash field of an owner's hold. */
    String field(String owner) {
        return owner;
    }

    // ---- ownership ----------------------------------------------------------------------------

    /** The owner id of a thread: `<client id>:<thread id>`, Redisson's form. */
    public String ownerOf(long threadId) {
        return client.getId() + ":" + threadId;
    }

    static long currentThreadId() {
        return Thread.currentThread().getId();
    }

    private String watchName(String owner) {
        return String.join("\u0000", field(owner), name);
    }

    // ---- the core: everything below is one of these, awaited or not ------------------------

    /**
     * Acquires for `threadId`. `waitMs`: -1 tries once, 0 waits without limit, else the
     * wait in ms. `leaseMs` <= 0: the watchdog keeps it.
     */
    CompletableFuture<Acquired> acquire(long waitMs, long leaseMs, long threadId) {
        String owner = ownerOf(threadId);
        long lease = leaseMs > 0 ? leaseMs : client.watchdog().leaseMs();
        List<String> args = acquireArgs(owner, lease);
        CompletableFuture<Object> raw;
        Waits.Confirm confirm = null;
        if (waitMs < 0) {
            args.addAll(List.of("ID", Wire.requestId()));
            raw = client.wire().sendRetrying(args);
        } else {
            args.addAll(List.of("WAIT", Long.toString(waitMs), "ID", Wire.requestId()));
            // Held on the grant message (its token, for the fenced lock); the release may
            // carry the confirmation: the server's take-back checks the owner still holds.
            confirm = new Waits.Confirm(Waits.Confirm.Ride.ANY);
            raw = client.waits().await(args, reply -> parseAcquire(reply).held() ? List.of(undo(owner)) : List.of(),
                    confirm, seen, reply -> parseAcquire(reply).held());
        }
        Waits.Confirm held = confirm;
        CompletableFuture<Acquired> out = raw.thenCompose(reply -> {
            Acquired a = parseAcquire(reply);
            if (!client.counters().count(a.held())) {
                return CompletableFuture.completedFuture(a);
            }
            lost.remove(owner);
            if (leaseMs <= 0) {
                client.watchdog().hold(watchName(owner), renewArgs(owner, lease), v -> Long.valueOf(1).equals(v),
                        why -> reportLost(owner, why));
            }
            if (held != null) {
                // Held on the grant message: a confirmation answered TAKENBACK (its
                // connection closed and none came within the server's grace) means the
                // server gave this hold to the next waiter.
                held.onTakenBack(() -> takenBack(owner));
                if (held.held()) {
                    unconfirmed.put(owner, held);
                }
            }
            if (!client.syncsReplicas(name)) {
                return CompletableFuture.completedFuture(a); // nothing to wait for: no stage more
            }
            return client.syncReplicas(name).handle((ok, e) -> {
                if (e == null) {
                    return a;
                }
                release(threadId);
                throw Sync.rethrow(e);
            });
        });
        // A caller that gave up (an interrupt cancels `out`) once the server had granted,
        // before the rest of the acquire (replica sync) finished: the hold is given back,
        // or it would stay held and renewed with nobody to release it. A grant that comes
        // after the cancellation is the wait's own undo (Waits).
        out.whenComplete((x, e) -> {
            if (out.isCancelled() && !raw.cancel(true) && !raw.isCompletedExceptionally()
                    && parseAcquire(raw.join()).held()) {
                release(threadId);
            }
        });
        return Sync.linked(out, raw);
    }

    private List<String> undo(String owner) {
        List<String> a = releaseArgs(owner);
        a.addAll(List.of("ID", Wire.requestId()));
        return a;
    }

    /** Releases one hold of `threadId`'s owner: true when that was the last one (the lock is free). */
    CompletableFuture<Boolean> release(long threadId) {
        String owner = ownerOf(threadId);
        List<String> args = releaseArgs(owner);
        args.addAll(List.of("ID", Wire.requestId()));
        CompletableFuture<Object> sent = client.waits().sendBehind(unconfirmed.remove(owner), args);
        return (sent != null ? sent : client.wire().sendRetrying(args)).thenApply(reply -> {
            if (reply == null) {
                String why = lost.remove(owner);
                client.watchdog().release(watchName(owner), true);
                throw new IllegalMonitorStateException("attempt to unlock lock, not locked by current thread by node id: "
                        + client.getId() + " thread-id: " + threadId + " (lock " + name + ")"
                        + (why == null ? "" : "; the hold was lost: " + why));
            }
            boolean last = Sync.asLong(reply) == 1;
            client.watchdog().release(watchName(owner), last);
            return last;
        });
    }

    /** A hold taken on its grant message whose grant the server took back (design.md 5). */
    private void takenBack(String owner) {
        client.watchdog().release(watchName(owner), true);
        client.counters().lostLocks.increment();
        reportLost(owner, "the server took back the grant of its ticket (TAKENBACK): the connection that"
                + " queued it closed and no confirmation came within rlock.ticket-confirm-ms");
    }

    private void reportLost(String owner, String why) {
        lost.put(owner, why);
        for (LockLostListener l : listeners) {
            try {
                l.lost(name, owner, why);
            } catch (RuntimeException ignored) {
                // A listener's failure must not stop the others from being told.
            }
        }
    }

    static long toMillis(long time, TimeUnit unit) {
        return unit.toMillis(time);
    }

    /**
     * The WAIT for a tryLock(time): -1 (one try) when the time is not positive. Rounded up
     * to whole ms: a timed wait ends at the call's start plus this, on the client's clock
     * (Waits), and must not end before the caller's deadline.
     */
    static long waitOf(long time, TimeUnit unit) {
        if (time <= 0) {
            return -1;
        }
        long ms = unit.toMillis(time);
        if (ms < Long.MAX_VALUE && unit.convert(ms, TimeUnit.MILLISECONDS) < time) {
            ms++;
        }
        return Math.max(1, ms);
    }

    static long leaseOf(long leaseTime, TimeUnit unit) {
        if (leaseTime == 0) {
            throw new IllegalArgumentException("leaseTime must be positive, or -1 for the watchdog");
        }
        return leaseTime < 0 ? -1 : Math.max(1, unit.toMillis(leaseTime));
    }

    // ---- java.util.concurrent.locks.Lock ---------------------------------------------------

    /** Waits (uninterruptibly, as Lock#lock does) until held; the watchdog keeps it. */
    @Override
    public void lock() {
        Sync.uninterruptibly(acquire(0, -1, currentThreadId()));
    }

    /** Waits until held for `leaseTime` (no renewal); -1: the watchdog keeps it. */
    public void lock(long leaseTime, TimeUnit unit) {
        Sync.uninterruptibly(acquire(0, leaseOf(leaseTime, unit), currentThreadId()));
    }

    /** Waits until held; an interrupt ends the wait and leaves no ticket or grant behind. */
    @Override
    public void lockInterruptibly() throws InterruptedException {
        lockInterruptibly(-1, TimeUnit.MILLISECONDS);
    }

    public void lockInterruptibly(long leaseTime, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        Sync.interruptibly(acquire(0, leaseOf(leaseTime, unit), currentThreadId()));
    }

    /** One try, no wait. */
    @Override
    public boolean tryLock() {
        return Sync.join(acquire(-1, -1, currentThreadId())).held();
    }

    /** Waits up to `time` in the server's FIFO queue. */
    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        return tryLock(time, -1, unit);
    }

    /** Redisson's tryLock(waitTime, leaseTime, unit); leaseTime -1: the watchdog keeps it. */
    public boolean tryLock(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        return Sync.interruptibly(acquire(waitOf(waitTime, unit), leaseOf(leaseTime, unit), currentThreadId())).held();
    }

    /**
     * Releases one hold of the current thread.
     *
     * @throws IllegalMonitorStateException when the current thread does not hold the lock
     *         (never did, or lost it: the critical section ran unprotected)
     */
    @Override
    public void unlock() {
        Sync.join(release(currentThreadId()));
    }

    /**
     * Not supported: a Condition needs a wait-set and signal delivery tied to the lock's
     * owner, which the server does not keep (Redisson's RLock throws too). Use a
     * countdown latch or semaphore from this client for cross-process signalling.
     */
    @Override
    public Condition newCondition() {
        throw new UnsupportedOperationException("newCondition: a distributed lock keeps no wait-set for"
                + " Condition.await/signal (neither does Redisson's RLock); use RlockCountDownLatch or RlockSemaphore");
    }

    // ---- Redisson's extras ------------------------------------------------------------------

    /** Frees the lock whoever holds it, whatever the count. True if a lock was freed. */
    public boolean forceUnlock() {
        return Sync.join(forceUnlockAsync());
    }

    public CompletableFuture<Boolean> forceUnlockAsync() {
        return client.wire().sendRetrying(forceArgs()).thenApply(v -> Sync.asLong(v) == 1);
    }

    public boolean isLocked() {
        return Sync.join(isLockedAsync());
    }

    public CompletableFuture<Boolean> isLockedAsync() {
        return client.wire().sendRetrying(List.of("EXISTS", name)).thenApply(v -> Sync.asLong(v) == 1);
    }

    public boolean isHeldByCurrentThread() {
        return isHeldByThread(currentThreadId());
    }

    public boolean isHeldByThread(long threadId) {
        return Sync.join(isHeldByThreadAsync(threadId));
    }

    public CompletableFuture<Boolean> isHeldByThreadAsync(long threadId) {
        return client.wire().sendRetrying(List.of("HEXISTS", name, field(ownerOf(threadId))))
                .thenApply(v -> Sync.asLong(v) == 1);
    }

    /** The current thread's hold count (0 when it does not hold the lock). */
    public int getHoldCount() {
        return Sync.join(getHoldCountAsync(currentThreadId()));
    }

    public CompletableFuture<Integer> getHoldCountAsync(long threadId) {
        return client.wire().sendRetrying(List.of("HGET", name, field(ownerOf(threadId))))
                .thenApply(v -> v == null ? 0 : (int) Sync.asLong(v));
    }

    /** The lock's remaining lease in ms: -2 when not locked, -1 without expiry. */
    public long remainTimeToLive() {
        return Sync.join(remainTimeToLiveAsync());
    }

    public CompletableFuture<Long> remainTimeToLiveAsync() {
        return client.wire().sendRetrying(List.of("PTTL", name)).thenApply(Sync::asLong);
    }

    /**
     * Sets the current thread's hold to expire `leaseTime` from now, shorter or longer than
     * it was (Spring's renewLock, ShedLock's extend and lockAtLeastFor). False when the thread
     * does not hold the lock. A hold the watchdog keeps is renewed again at its next tick.
     */
    public boolean renewLease(long leaseTime, TimeUnit unit) {
        return Sync.join(renewLeaseAsync(leaseTime, unit, currentThreadId()));
    }

    public CompletableFuture<Boolean> renewLeaseAsync(long leaseTime, TimeUnit unit, long threadId) {
        if (leaseTime <= 0) {
            throw new IllegalArgumentException("leaseTime must be positive, got " + leaseTime);
        }
        return client.wire().sendRetrying(renewArgs(ownerOf(threadId), Math.max(1, unit.toMillis(leaseTime))))
                .thenApply(v -> Long.valueOf(1).equals(v));
    }

    /** Listeners told when a watchdog renewal finds a hold of this lock gone. */
    public void addLostListener(LockLostListener l) {
        listeners.add(l);
    }

    /** Whether the current thread's last hold was found lost (until it acquires again). */
    public boolean isLost() {
        return isLost(currentThreadId());
    }

    public boolean isLost(long threadId) {
        return lost.containsKey(ownerOf(threadId));
    }

    // ---- CompletionStage twins ----------------------------------------------------------------

    public CompletableFuture<Void> lockAsync() {
        return lockAsync(-1, TimeUnit.MILLISECONDS, currentThreadId());
    }

    /** Waits until held by `threadId`'s owner (an explicit owner for async code). */
    public CompletableFuture<Void> lockAsync(long leaseTime, TimeUnit unit, long threadId) {
        return held(acquire(0, leaseOf(leaseTime, unit), threadId));
    }

    public CompletableFuture<Boolean> tryLockAsync() {
        return tryLockAsync(currentThreadId());
    }

    public CompletableFuture<Boolean> tryLockAsync(long threadId) {
        return acquire(-1, -1, threadId).thenApply(Acquired::held);
    }

    public CompletableFuture<Boolean> tryLockAsync(long waitTime, TimeUnit unit) {
        return tryLockAsync(waitTime, -1, unit, currentThreadId());
    }

    public CompletableFuture<Boolean> tryLockAsync(long waitTime, long leaseTime, TimeUnit unit, long threadId) {
        CompletableFuture<Acquired> a = acquire(waitOf(waitTime, unit), leaseOf(leaseTime, unit), threadId);
        return Sync.linked(a.thenApply(Acquired::held), a);
    }

    public CompletableFuture<Void> unlockAsync() {
        return unlockAsync(currentThreadId());
    }

    public CompletableFuture<Void> unlockAsync(long threadId) {
        return release(threadId).thenApply(last -> null);
    }

    private static CompletableFuture<Void> held(CompletableFuture<Acquired> a) {
        return Sync.linked(a.thenApply(x -> {
            if (!x.held()) {
                throw new IllegalStateException("not acquired");
            }
            return (Void) null;
        }), a);
    }
}
