// The permit-expirable semaphore of the rlock Java client (clients/java; design.md 4.4):
// Redisson's RPermitExpirableSemaphore over RPSEMAPHORE.*: every permit has an id and a
// lease, and returns to the pool at its lease end (a module timer), handed to waiters at
// once. A permit taken without a lease is kept by the client's watchdog (renewed with
// UPDATELEASETIME), as the Rust client does, so a crashed holder's permit comes back. A
// waiter holds its permit on the ticket's `granted` message, which carries the permit's id
// (design.md 5); a grant the server took back before its confirmation is a lost permit.
package io.rlock;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;

public final class RlockPermitExpirableSemaphore {
    private final RlockClient client;
    private final String name;
    private final List<LockLostListener> listeners = new CopyOnWriteArrayList<>();
    /** What this handle's waiting acquires found lately (whether the next one asks first). */
    final Contention seen = new Contention();

    RlockPermitExpirableSemaphore(RlockClient client, String name) {
        if (name == null || name.isEmpty()) {
            throw new IllegalArgumentException("a semaphore needs a non-empty name");
        }
        this.client = client;
        this.name = name;
    }

    public String getName() {
        return name;
    }

    /**
     * Listeners told when a permit is found gone: by the watchdog (expired, released
     * elsewhere), or a waiter's grant the server took back before it was confirmed
     * (TAKENBACK: the connection that queued it closed and no confirmation came within
     * rlock.ticket-confirm-ms; the server released the permit).
     */
    public void addLostListener(LockLostListener l) {
        listeners.add(l);
    }

    private String watchName(String permit) {
        return "rpsemaphore\u0000" + name + "\u0000" + permit;
    }

    /** One permit: -1 one try, 0 waits without limit; leaseMs <= 0 the watchdog. Null when not acquired. */
    CompletableFuture<String> take(long waitMs, long leaseMs) {
        long lease = leaseMs > 0 ? leaseMs : client.watchdog().leaseMs();
        List<String> args = new ArrayList<>(List.of("RPSEMAPHORE.ACQUIRE", name, Long.toString(lease)));
        CompletableFuture<Object> raw;
        Waits.Confirm confirm = null;
        if (waitMs < 0) {
            args.addAll(List.of("ID", Wire.requestId()));
            raw = client.wire().sendRetrying(args);
        } else {
            args.addAll(List.of("WAIT", Long.toString(waitMs), "ID", Wire.requestId()));
            confirm = new Waits.Confirm(); // held on the grant message, which names the permit
            raw = client.waits().await(args, reply -> reply instanceof String id
                    ? List.of(List.of("RPSEMAPHORE.RELEASE", name, id, "ID", Wire.requestId()))
                    : List.of(), confirm, seen, reply -> reply instanceof String);
        }
        Waits.Confirm held = confirm;
        CompletableFuture<String> out = raw.thenApply(v -> {
            String id = (String) v;
            client.counters().count(id != null);
            if (id != null && leaseMs <= 0) {
                client.watchdog().hold(watchName(id),
                        List.of("RPSEMAPHORE.UPDATELEASETIME", name, id, Long.toString(lease)),
                        r -> Long.valueOf(1).equals(r), why -> reportLost(id, why));
            }
            if (id != null && held != null) {
                held.onTakenBack(() -> {
                    client.watchdog().release(watchName(id), true);
                    client.counters().lostLocks.increment();
                    reportLost(id, "the server took back the grant of its ticket (TAKENBACK): the connection that"
                            + " queued it closed and no confirmation came within rlock.ticket-confirm-ms");
                });
            }
            return id;
        });
        return Sync.linked(out, raw);
    }

    private void reportLost(String permit, String why) {
        for (LockLostListener l : listeners) {
            try {
                l.lost(name, permit, why);
            } catch (RuntimeException ignored) {
                // A listener's failure must not stop the others from being told.
            }
        }
    }

    private static long lease(long leaseTime, TimeUnit unit) {
        return RlockLock.leaseOf(leaseTime, unit);
    }

    /** Waits for a permit kept by the watchdog; its id. */
    public String acquire() throws InterruptedException {
        return acquire(-1, TimeUnit.MILLISECONDS);
    }

    /** Waits for a permit with a lease (-1: the watchdog keeps it); its id. */
    public String acquire(long leaseTime, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        return Sync.interruptibly(take(0, lease(leaseTime, unit)));
    }

    /** One try; the permit id or null. */
    public String tryAcquire() {
        return Sync.join(take(-1, -1));
    }

    public String tryAcquire(long waitTime, TimeUnit unit) throws InterruptedException {
        return tryAcquire(waitTime, -1, unit);
    }

    public String tryAcquire(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        return Sync.interruptibly(take(RlockLock.waitOf(waitTime, unit), lease(leaseTime, unit)));
    }

    /** Releases a permit; false when it is not held (unknown, released or expired). */
    public boolean tryRelease(String permitId) {
        return Sync.join(tryReleaseAsync(permitId));
    }

    /**
     * Releases a permit.
     *
     * @throws IllegalArgumentException when the permit is not held (Redisson's message)
     */
    public void release(String permitId) {
        if (!tryRelease(permitId)) {
            throw new IllegalArgumentException("Permit with id " + permitId
                    + " has already been released or doesn't exist");
        }
    }

    /** Sets a new lease on a held permit; false when it is not held. */
    public boolean updateLeaseTime(String permitId, long leaseTime, TimeUnit unit) {
        return Sync.join(updateLeaseTimeAsync(permitId, leaseTime, unit));
    }

    public int availablePermits() {
        return Sync.join(availablePermitsAsync());
    }

    public int acquiredPermits() {
        return Sync.join(acquiredPermitsAsync());
    }

    public boolean trySetPermits(int permits) {
        return Sync.join(trySetPermitsAsync(permits));
    }

    public void addPermits(int delta) {
        Sync.join(addPermitsAsync(delta));
    }

    public CompletableFuture<Boolean> updateLeaseTimeAsync(String permitId, long leaseTime, TimeUnit unit) {
        return client.wire().sendRetrying(List.of("RPSEMAPHORE.UPDATELEASETIME", name, permitId,
                Long.toString(lease(leaseTime, unit)))).thenApply(v -> Sync.asLong(v) == 1);
    }

    public CompletableFuture<Integer> availablePermitsAsync() {
        return read("RPSEMAPHORE.AVAILABLEPERMITS").thenApply(Long::intValue);
    }

    public CompletableFuture<Integer> acquiredPermitsAsync() {
        return read("RPSEMAPHORE.ACQUIREDPERMITS").thenApply(Long::intValue);
    }

    public CompletableFuture<Boolean> trySetPermitsAsync(int permits) {
        if (permits < 0) {
            throw new IllegalArgumentException("permits must be >= 0, got " + permits);
        }
        return client.wire().sendRetrying(List.of("RPSEMAPHORE.TRYSETPERMITS", name, Integer.toString(permits),
                "ID", Wire.requestId())).thenApply(v -> Sync.asLong(v) == 1);
    }

    public CompletableFuture<Void> addPermitsAsync(int delta) {
        return client.wire().sendRetrying(List.of("RPSEMAPHORE.ADDPERMITS", name, Integer.toString(delta),
                "ID", Wire.requestId())).thenApply(v -> null);
    }

    private CompletableFuture<Long> read(String cmd) {
        return client.wire().sendRetrying(List.of(cmd, name)).thenApply(Sync::asLong);
    }

    // ---- CompletionStage twins ----------------------------------------------------------------

    public CompletableFuture<String> acquireAsync(long leaseTime, TimeUnit unit) {
        return take(0, lease(leaseTime, unit));
    }

    public CompletableFuture<String> tryAcquireAsync(long waitTime, long leaseTime, TimeUnit unit) {
        return take(RlockLock.waitOf(waitTime, unit), lease(leaseTime, unit));
    }

    public CompletableFuture<Boolean> tryReleaseAsync(String permitId) {
        return client.wire().sendRetrying(List.of("RPSEMAPHORE.RELEASE", name, permitId, "ID", Wire.requestId()))
                .thenApply(v -> {
                    client.watchdog().release(watchName(permitId), true);
                    return Sync.asLong(v) == 1;
                });
    }
}
