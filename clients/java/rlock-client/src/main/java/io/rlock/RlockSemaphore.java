// The semaphore of the rlock Java client (clients/java; design.md 4.3): java.util.concurrent
// .Semaphore's shape over RSEMAPHORE.*, Redisson's RSemaphore layout, plus Redisson's
// trySetPermits/addPermits. FIFO in the server: a request for 5 at the head is served
// before a later request for 1. Nobody records who holds permits (Redisson's layout): a
// holder that dies leaks them; RlockPermitExpirableSemaphore does not. A waiter holds on
// its ticket's `granted` message (design.md 5) and its confirmation goes off its path; a
// release waits for the name's confirmations in flight and sends nothing for permits the
// server took back (SemaphoreDebts).
package io.rlock;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;

public final class RlockSemaphore {
    private static final System.Logger LOG = System.getLogger(RlockSemaphore.class.getName());

    private final RlockClient client;
    private final String name;
    private final List<LockLostListener> listeners = new CopyOnWriteArrayList<>();
    /** What this handle's waiting acquires found lately (whether the next one asks first). */
    final Contention seen = new Contention();

    RlockSemaphore(RlockClient client, String name) {
        if (name == null || name.isEmpty()) {
            throw new IllegalArgumentException("a semaphore needs a non-empty name");
        }
        this.client = client;
        this.name = name;
    }

    public String getName() {
        return name;
    }

    private static void checkPermits(int permits) {
        if (permits < 0) {
            throw new IllegalArgumentException("permits must be >= 0, got " + permits);
        }
    }

    /**
     * Listeners told when a waiter's grant was taken back by the server before it was
     * confirmed (TAKENBACK: the connection that queued its ticket closed and no
     * confirmation came within rlock.ticket-confirm-ms; the server released those permits
     * itself, so the next release of as many on this name sends nothing). Called with the
     * semaphore's name, the acquire's request id and the reason; also logged at WARNING and
     * counted in {@link RlockStats#lostLocks()}.
     */
    public void addLostListener(LockLostListener l) {
        listeners.add(l);
    }

    /** Takes `permits`: -1 one try, 0 waits without limit, else waits up to waitMs. */
    CompletableFuture<Boolean> take(int permits, long waitMs) {
        checkPermits(permits);
        List<String> args = new ArrayList<>(List.of("RSEMAPHORE.ACQUIRE", name, Integer.toString(permits)));
        CompletableFuture<Object> raw;
        Waits.Confirm confirm = null;
        String id = Wire.requestId();
        if (waitMs < 0) {
            args.addAll(List.of("ID", id));
            raw = client.wire().sendRetrying(args);
        } else {
            args.addAll(List.of("WAIT", Long.toString(waitMs), "ID", id));
            // Held on the grant message where the server names ticket-holds; the release may
            // carry the confirmation, pinned to the connection that queued the ticket.
            confirm = new Waits.Confirm(Waits.Confirm.Ride.PINNED);
            raw = client.waits().await(args, reply -> Long.valueOf(1).equals(reply)
                    ? List.of(List.of("RSEMAPHORE.RELEASE", name, Integer.toString(permits), "ID", Wire.requestId()))
                    : List.of(), confirm, seen, reply -> Long.valueOf(1).equals(reply));
        }
        Waits.Confirm held = confirm;
        return Sync.linked(raw.thenApply(v -> {
            boolean got = Sync.asLong(v) == 1;
            if (got && held != null && held.held()) {
                // Registered before the caller has the permits, so that any release after
                // this acquire returned waits for the confirmation.
                client.semaphoreDebts().held(name, permits, held, () -> takenBack(id, permits));
            }
            return client.counters().count(got);
        }), raw);
    }

    private void takenBack(String requestId, int permits) {
        client.counters().lostLocks.increment();
        String why = "the server took back the grant of its ticket (TAKENBACK): the connection that queued it"
                + " closed and no confirmation came within rlock.ticket-confirm-ms; its " + permits
                + " permit(s) went back to the semaphore, and the next release of as many here sends nothing";
        LOG.log(System.Logger.Level.WARNING, "rlock semaphore {0}: acquire {1}: {2}", name, requestId, why);
        for (LockLostListener l : listeners) {
            try {
                l.lost(name, requestId, why);
            } catch (RuntimeException ignored) {
                // A listener's failure must not stop the others from being told.
            }
        }
    }

    public void acquire() throws InterruptedException {
        acquire(1);
    }

    /** Waits until `permits` are taken; an interrupt ends the wait and leaves nothing behind. */
    public void acquire(int permits) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        Sync.interruptibly(take(permits, 0));
    }

    public void acquireUninterruptibly(int permits) {
        Sync.uninterruptibly(take(permits, 0));
    }

    public boolean tryAcquire() {
        return tryAcquire(1);
    }

    public boolean tryAcquire(int permits) {
        return Sync.join(take(permits, -1));
    }

    public boolean tryAcquire(long timeout, TimeUnit unit) throws InterruptedException {
        return tryAcquire(1, timeout, unit);
    }

    public boolean tryAcquire(int permits, long timeout, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        return Sync.interruptibly(take(permits, RlockLock.waitOf(timeout, unit)));
    }

    public void release() {
        release(1);
    }

    /**
     * Gives back `permits` (served to the queue's head first). Waits first for the
     * confirmations still in flight of this client's grants on this name held on their
     * messages (normally answered long before; at most about 5 s), then sends only what the
     * permits taken back by the server (TAKENBACK) do not cover: a release they cover
     * entirely returns without a round trip.
     */
    public void release(int permits) {
        Sync.join(releaseAsync(permits));
    }

    public int availablePermits() {
        return Sync.join(availablePermitsAsync());
    }

    /** Takes every available permit; how many. */
    public int drainPermits() {
        return Sync.join(drainPermitsAsync());
    }

    /** Sets the count when the semaphore does not exist yet; true if it was set. */
    public boolean trySetPermits(int permits) {
        return Sync.join(trySetPermitsAsync(permits));
    }

    /** Adds `delta` (may be negative) to the available permits. */
    public void addPermits(int delta) {
        Sync.join(addPermitsAsync(delta));
    }

    // ---- CompletionStage twins ----------------------------------------------------------------

    public CompletableFuture<Void> acquireAsync(int permits) {
        return take(permits, 0).thenApply(x -> null);
    }

    public CompletableFuture<Boolean> tryAcquireAsync(int permits) {
        return take(permits, -1);
    }

    public CompletableFuture<Boolean> tryAcquireAsync(int permits, long timeout, TimeUnit unit) {
        return take(permits, RlockLock.waitOf(timeout, unit));
    }

    /**
     * {@link #release(int)}: completes (with null, as a sent release does) after the
     * server's reply, or without a round trip when the permits the server took back absorb
     * the whole release.
     */
    public CompletableFuture<Void> releaseAsync(int permits) {
        checkPermits(permits);
        // Grants of this name held on their messages, their confirmations held back and no
        // debt: the release goes right behind those confirmations in one write, pinned to
        // the connection that queued the tickets (design.md 5), with no wait for outcomes.
        List<Waits.Confirm> riding = client.semaphoreDebts().riders(name);
        List<String> release = List.of("RSEMAPHORE.RELEASE", name, Integer.toString(permits), "ID", Wire.requestId());
        CompletableFuture<Object> rode = riding == null ? null : client.waits().sendPinnedBehind(riding, release);
        if (rode == null) {
            if (riding == null) {
                // Not waiting for the sweep to send what the release cannot carry.
                client.waits().sendHeldBack(client.semaphoreDebts().heldBack(name));
            }
            return released(permits);
        }
        CompletableFuture<Void> out = new CompletableFuture<>();
        rode.whenComplete((r, e) -> {
            if (e == null) {
                out.complete(null);
                return;
            }
            Throwable x = Wire.unwrap(e);
            CompletableFuture<Void> again;
            if (x instanceof Transport.NotSent) {
                again = released(permits); // never written: it did not run
            } else {
                // Written, maybe run: it ran only behind confirmations that stood, so one
                // answered TAKENBACK means it did not; otherwise the same command again (the
                // server replays it if it ran).
                again = CompletableFuture.allOf(riding.stream().map(Waits.Confirm::outcome).toArray(CompletableFuture[]::new))
                        .thenCompose(v -> riding.stream().anyMatch(c -> c.outcome().join() == Waits.Confirm.Outcome.TAKEN_BACK)
                                ? released(permits)
                                : client.wire().sendRetrying(release).thenApply(w -> (Void) null));
            }
            again.whenComplete((v, e2) -> {
                if (e2 == null) {
                    out.complete(null);
                } else {
                    out.completeExceptionally(Wire.unwrap(e2));
                }
            });
        });
        return out;
    }

    /** A release the usual way: after the name's confirmations in flight, less the debt. */
    private CompletableFuture<Void> released(int permits) {
        return client.semaphoreDebts().toSend(name, permits).thenCompose(n -> n == 0 && permits > 0
                ? CompletableFuture.completedFuture(null)
                : client.wire().sendRetrying(List.of("RSEMAPHORE.RELEASE", name, Long.toString(n), "ID", Wire.requestId()))
                        .thenApply(v -> null));
    }

    public CompletableFuture<Integer> availablePermitsAsync() {
        return client.wire().sendRetrying(List.of("RSEMAPHORE.AVAILABLEPERMITS", name)).thenApply(v -> (int) Sync.asLong(v));
    }

    public CompletableFuture<Integer> drainPermitsAsync() {
        return client.wire().sendRetrying(List.of("RSEMAPHORE.DRAINPERMITS", name, "ID", Wire.requestId()))
                .thenApply(v -> (int) Sync.asLong(v));
    }

    public CompletableFuture<Boolean> trySetPermitsAsync(int permits) {
        checkPermits(permits);
        return client.wire().sendRetrying(List.of("RSEMAPHORE.TRYSETPERMITS", name, Integer.toString(permits), "ID", Wire.requestId()))
                .thenApply(v -> Sync.asLong(v) == 1);
    }

    public CompletableFuture<Void> addPermitsAsync(int delta) {
        return client.wire().sendRetrying(List.of("RSEMAPHORE.ADDPERMITS", name, Integer.toString(delta), "ID", Wire.requestId()))
                .thenApply(v -> null);
    }
}
