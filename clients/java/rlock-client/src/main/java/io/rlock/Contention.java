// How a waiting acquire starts (clients/java, internal; spec/vectors/waits.json): by asking
// without WAIT on the command connection, or by queueing its ticket at once, from what its
// handle's last waiting acquire found. Every handle that waits (a lock, a fenced lock, a
// read-write lock's side, a semaphore, an expirable semaphore) holds one of these; the rule
// itself, start(), is the one Backend runs for every waiting acquire in module mode, and
// the one VectorsTest runs over the vectors. The Rust client's proto/state.rs Contention is
// the reference.
package io.rlock;

import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.function.LongSupplier;
import java.util.function.Predicate;
import java.util.function.Supplier;

/**
 * What a handle's waiting acquires found lately: the lock or the permits held by another
 * (when), or free. A waiting acquire asks without waiting first unless one found them held
 * within {@link #CONTENDED_FOR_MS}: an uncontended lock then costs the try's round trip, not
 * a ticket's (whose reply the notification listener hands to the waiting thread), and a
 * contended one does not pay a try that fails before every wait.
 */
final class Contention {
    /** How long a handle's acquires queue at once after one found it held. */
    static final long CONTENDED_FOR_MS = 1_000;

    /** System.nanoTime() when an acquire last found it held; meaningful while `held`. */
    private volatile long heldAt;
    private volatile boolean held;

    /** True unless an acquire found it held less than {@link #CONTENDED_FOR_MS} before `nowNanos`. */
    boolean triesFirst(long nowNanos) {
        return !held || nowNanos - heldAt >= CONTENDED_FOR_MS * 1_000_000;
    }

    /** What an acquire found at `nowNanos`: held by another, or free. */
    synchronized void found(boolean heldNow, long nowNanos) {
        this.heldAt = nowNanos;
        this.held = heldNow;
    }

    /** The end of a queued wait: its last reply, and whether that reply came at once (not QUEUED first). */
    record Waited(Object reply, boolean atOnce) {}

    /**
     * Runs a waiting acquire as the rule says: `tryCall` (the command without WAIT) first
     * unless `seen` found it held lately; if that took it, done (found free); otherwise
     * `queue` with what is left of the wait (`queue`'s argument: the wait in ms, 0 for no
     * limit) and the finding from how it ended: free only for a grant answered at once. A
     * timed wait whose time ran out during the try ends with the try's reply. `waitMs`: 0
     * no limit, else the wait; `satisfied` tells a grant, `giveBack`
     * returns a grant the try took for a caller that gave up meanwhile. The result completes with the last
     * reply; cancelling it cancels the step under way (the queued wait gives back a grant
     * that comes after all).
     */
    static CompletableFuture<Object> start(Contention seen, long waitMs, LongSupplier nanos,
                                           Supplier<CompletableFuture<Object>> tryCall,
                                           Predicate<Object> satisfied, Consumer<Object> giveBack,
                                           Function<Long, CompletableFuture<Waited>> queue) {
        long started = nanos.getAsLong();
        if (!seen.triesFirst(started)) {
            return queued(seen, nanos, queue.apply(waitMs), satisfied, giveBack);
        }
        CompletableFuture<Object> tried = tryCall.get();
        CompletableFuture<Object> out = new CompletableFuture<>();
        tried.whenComplete((reply, e) -> {
            if (e != null) {
                out.completeExceptionally(Wire.unwrap(e));
                return;
            }
            long now = nanos.getAsLong();
            if (satisfied.test(reply)) {
                seen.found(false, now);
                if (!out.complete(reply)) {
                    giveBack.accept(reply); // the caller gave up during the try
                }
                return;
            }
            seen.found(true, now);
            long left = waitMs;
            if (waitMs > 0) {
                left = waitMs - (now - started) / 1_000_000;
                if (left <= 0) {
                    out.complete(reply); // the wait ran out during the try: its reply
                    return;
                }
            }
            if (out.isDone()) {
                return; // cancelled during the try, which changed nothing
            }
            CompletableFuture<Object> inner = queued(seen, nanos, queue.apply(left), satisfied, giveBack);
            out.whenComplete((v, x) -> {
                if (out.isCancelled()) {
                    inner.cancel(true);
                }
            });
            inner.whenComplete((v, x) -> {
                if (x != null) {
                    out.completeExceptionally(Wire.unwrap(x));
                } else if (!out.complete(v)) {
                    giveBack.accept(v); // the caller gave up as the grant came
                }
            });
        });
        return out;
    }

    /** The queued wait's reply, noting what it found; a cancel reaches the wait. */
    private static CompletableFuture<Object> queued(Contention seen, LongSupplier nanos, CompletableFuture<Waited> waited,
                                                    Predicate<Object> satisfied, Consumer<Object> giveBack) {
        CompletableFuture<Object> out = new CompletableFuture<>();
        out.whenComplete((v, x) -> {
            if (out.isCancelled()) {
                waited.cancel(true);
            }
        });
        waited.whenComplete((w, x) -> {
            if (x != null) {
                out.completeExceptionally(Wire.unwrap(x));
                return;
            }
            seen.found(!(w.atOnce() && satisfied.test(w.reply())), nanos.getAsLong());
            if (!out.complete(w.reply())) {
                giveBack.accept(w.reply()); // the caller gave up as the grant came
            }
        });
        return out;
    }

    /** `args` without its `WAIT t`: the same command as a try. */
    static List<String> withoutWait(List<String> args) {
        int w = Waits.Waiter.find(args, "WAIT");
        List<String> t = new java.util.ArrayList<>(args.subList(0, w));
        t.addAll(args.subList(w + 2, args.size()));
        return t;
    }

    /** `args` with its `WAIT` set to `waitMs`. */
    static List<String> withWait(List<String> args, long waitMs) {
        int w = Waits.Waiter.find(args, "WAIT");
        List<String> t = new java.util.ArrayList<>(args);
        t.set(w + 1, Long.toString(waitMs));
        return t;
    }
}
