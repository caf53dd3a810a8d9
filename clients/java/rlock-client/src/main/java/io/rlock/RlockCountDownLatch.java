// The countdown latch of the rlock Java client (clients/java; design.md 4.5):
// java.util.concurrent.CountDownLatch's shape over RLATCH.*, Redisson's RCountDownLatch
// layout, plus Redisson's trySetCount and delete. Every awaiter is released in the turn
// the count reaches zero.
package io.rlock;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

public final class RlockCountDownLatch {
    private final RlockClient client;
    private final String name;

    RlockCountDownLatch(RlockClient client, String name) {
        if (name == null || name.isEmpty()) {
            throw new IllegalArgumentException("a latch needs a non-empty name");
        }
        this.client = client;
        this.name = name;
    }

    public String getName() {
        return name;
    }

    /** Waits: -1 no wait, 0 without limit, else up to waitMs. True when open. */
    CompletableFuture<Boolean> open(long waitMs) {
        CompletableFuture<Object> raw = waitMs < 0
                ? client.wire().sendRetrying(List.of("RLATCH.AWAIT", name))
                : client.waits().await(new ArrayList<>(List.of("RLATCH.AWAIT", name, "WAIT", Long.toString(waitMs))),
                        reply -> List.of());
        return Sync.linked(raw.thenApply(v -> Sync.asLong(v) == 1), raw);
    }

    /** Waits until the count reaches zero (or the latch is deleted). */
    public void await() throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        Sync.interruptibly(open(0));
    }

    /** Waits up to `timeout`; true when the count reached zero. */
    public boolean await(long timeout, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException();
        }
        return Sync.interruptibly(open(RlockLock.waitOf(timeout, unit)));
    }

    public void countDown() {
        Sync.join(countDownAsync());
    }

    public long getCount() {
        return Sync.join(getCountAsync());
    }

    /** Sets the count when no latch exists; true if it was set. */
    public boolean trySetCount(long count) {
        return Sync.join(trySetCountAsync(count));
    }

    /** Deletes the latch (which opens it for rlock awaiters); true if there was one. */
    public boolean delete() {
        return Sync.join(deleteAsync());
    }

    public CompletableFuture<Boolean> deleteAsync() {
        return client.wire().sendRetrying(List.of("RLATCH.DELETE", name, "ID", Wire.requestId()))
                .thenApply(v -> Sync.asLong(v) == 1);
    }

    // ---- CompletionStage twins ----------------------------------------------------------------

    public CompletableFuture<Void> awaitAsync() {
        return open(0).thenApply(x -> null);
    }

    public CompletableFuture<Boolean> awaitAsync(long timeout, TimeUnit unit) {
        return open(RlockLock.waitOf(timeout, unit));
    }

    public CompletableFuture<Void> countDownAsync() {
        return client.wire().sendRetrying(List.of("RLATCH.COUNTDOWN", name, "ID", Wire.requestId())).thenApply(v -> null);
    }

    public CompletableFuture<Long> getCountAsync() {
        return client.wire().sendRetrying(List.of("RLATCH.GETCOUNT", name)).thenApply(Sync::asLong);
    }

    public CompletableFuture<Boolean> trySetCountAsync(long count) {
        if (count < 1) {
            throw new IllegalArgumentException("count must be >= 1, got " + count);
        }
        return client.wire().sendRetrying(List.of("RLATCH.TRYSETCOUNT", name, Long.toString(count), "ID", Wire.requestId()))
                .thenApply(v -> Sync.asLong(v) == 1);
    }
}
