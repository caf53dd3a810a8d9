// The semaphore of the rlock Java client (clients/java; design.md 4.3): java.util.concurrent
// .Semaphore's shape over RSEMAPHORE.*, Redisson's RSemaphore layout, plus Redisson's
// trySetPermits/addPermits. FIFO in the server: a request for 5 at the head is served
// before a later request for 1. Nobody records who holds permits (Redisson's layout): a
// holder that dies leaks them; RlockPermitExpirableSemaphore does not.
package io.rlock;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

public final class RlockSemaphore {
    private final RlockClient client;
    private final String name;

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

    /** Takes `permits`: -1 one try, 0 waits without limit, else waits up to waitMs. */
    CompletableFuture<Boolean> take(int permits, long waitMs) {
        checkPermits(permits);
        List<String> args = new ArrayList<>(List.of("RSEMAPHORE.ACQUIRE", name, Integer.toString(permits)));
        CompletableFuture<Object> raw;
        if (waitMs < 0) {
            args.addAll(List.of("ID", Wire.requestId()));
            raw = client.wire().sendRetrying(args);
        } else {
            args.addAll(List.of("WAIT", Long.toString(waitMs), "ID", Wire.requestId()));
            raw = client.waits().await(args, reply -> Long.valueOf(1).equals(reply)
                    ? List.of(List.of("RSEMAPHORE.RELEASE", name, Integer.toString(permits), "ID", Wire.requestId()))
                    : List.of());
        }
        return Sync.linked(raw.thenApply(v -> client.counters().count(Sync.asLong(v) == 1)), raw);
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

    /** Gives back `permits` (served to the queue's head first). */
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

    public CompletableFuture<Void> releaseAsync(int permits) {
        checkPermits(permits);
        return client.wire().sendRetrying(List.of("RSEMAPHORE.RELEASE", name, Integer.toString(permits), "ID", Wire.requestId()))
                .thenApply(v -> null);
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
