// The fenced lock of the rlock Java client (clients/java; design.md 4.2): the re-entrant lock
// acquired with RFENCED.ACQUIRE, which returns a fencing token with every acquire and
// handoff (Redisson's RFencedLock: lockAndGetToken, tryLockAndGetToken, getToken). Release,
// renewal and the rest are the plain lock's commands on the same key.
package io.rlock;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

/** A lock whose every acquire returns a fencing token; tokens of one name only increase. */
public final class RlockFencedLock extends RlockLock {
    RlockFencedLock(RlockClient client, String name) {
        super(client, name);
    }

    @Override
    List<String> acquireArgs(String owner, long leaseMs) {
        return new ArrayList<>(List.of("RFENCED.ACQUIRE", name, owner, Long.toString(leaseMs)));
    }

    /** `[nil, token]` when acquired, `[pttl, nil]` when not. */
    @Override
    Acquired parseAcquire(Object reply) {
        if (!(reply instanceof List<?> l) || l.size() != 2) {
            throw new IllegalStateException("unexpected RFENCED.ACQUIRE reply " + reply);
        }
        return l.get(0) == null ? new Acquired(true, Sync.asLong(l.get(1)), null)
                : new Acquired(false, null, Sync.asLong(l.get(0)));
    }

    /** Waits until held (watchdog lease); the token of this acquire. */
    public Long lockAndGetToken() {
        return Sync.uninterruptibly(acquire(0, -1, currentThreadId())).token();
    }

    public Long lockAndGetToken(long leaseTime, TimeUnit unit) {
        return Sync.uninterruptibly(acquire(0, leaseOf(leaseTime, unit), currentThreadId())).token();
    }

    /** One try: the token, or null when the lock is held by another owner. */
    public Long tryLockAndGetToken() {
        return Sync.join(acquire(-1, -1, currentThreadId())).token();
    }

    public Long tryLockAndGetToken(long waitTime, TimeUnit unit) throws InterruptedException {
        return tryLockAndGetToken(waitTime, -1, unit);
    }

    public Long tryLockAndGetToken(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        return Sync.interruptibly(acquire(waitOf(waitTime, unit), leaseOf(leaseTime, unit), currentThreadId())).token();
    }

    /** The last token issued for this name (null if none). */
    public Long getToken() {
        return Sync.join(getTokenAsync());
    }

    public CompletableFuture<Long> getTokenAsync() {
        return client.wire().sendRetrying(List.of("RFENCED.GETTOKEN", name)).thenApply(v -> v == null ? null : Sync.asLong(v));
    }

    public CompletableFuture<Long> lockAndGetTokenAsync(long leaseTime, TimeUnit unit, long threadId) {
        CompletableFuture<Acquired> a = acquire(0, leaseOf(leaseTime, unit), threadId);
        return Sync.linked(a.thenApply(Acquired::token), a);
    }

    public CompletableFuture<Long> tryLockAndGetTokenAsync(long waitTime, long leaseTime, TimeUnit unit, long threadId) {
        CompletableFuture<Acquired> a = acquire(waitOf(waitTime, unit), leaseOf(leaseTime, unit), threadId);
        return Sync.linked(a.thenApply(Acquired::token), a);
    }
}
