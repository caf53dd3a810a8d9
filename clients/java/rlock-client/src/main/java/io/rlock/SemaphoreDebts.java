// The plain semaphore's grants held on their ticket message (clients/java, internal;
// design.md 5, spec/vectors/tickets.json `holds_about`), one per client: the confirmations
// still in flight and the debt of each semaphore name, which RlockSemaphore's release goes
// through. The Rust client's semaphore is the reference; blocking and async releases both
// come here (RlockSemaphore.release joins releaseAsync).
//
// Why: a plain semaphore's permits have no owner, so the server cannot tell the holder's
// release from its own take-back. A waiter that holds on its `granted` message confirms off
// its path; if the server took the grant back first (its ticket connection closed and no
// confirmation came within rlock.ticket-confirm-ms), it released those permits itself and
// the confirmation answers TAKENBACK. So a release here (1) waits for the name's
// confirmations in flight (a release sent before one is answered, by a client that then
// died, would be followed by the take-back: permits that never existed), then (2) takes off
// the debt, the permits whose grants were answered TAKENBACK and not released since, and
// sends only the rest. Per name, not per handle: a release may come from another handle.
// Except (riders): when every confirmation of the name in flight is still held back and
// no debt is owed, the release carries them, right behind them in one write pinned to the
// connection that queued their tickets (Waits.sendPinnedBehind), where the server runs it
// only after confirmations that stood.
package io.rlock;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

final class SemaphoreDebts {
    /**
     * How long a release waits for the confirmations in flight on its name: the confirm
     * retry limit (each confirmation ends by then but for its last try). Normally they
     * were answered long before the holder releases.
     */
    static final long WAIT_FOR_CONFIRMS_MS = Waits.CONFIRM_RETRY_FOR_MS;

    /** One name's confirmations in flight and its debt. Guarded by SemaphoreDebts.this. */
    private static final class Name {
        final List<CompletableFuture<Void>> inflight = new ArrayList<>();
        /**
         * The confirmations among those in flight that were held back for a release to
         * carry (Waits.sendPinnedBehind), until one is taken along or has its outcome.
         */
        final List<Waits.Confirm> riders = new ArrayList<>();
        long debt;
    }

    private final Map<String, Name> names = new HashMap<>();

    /**
     * What a release of `permits` sends with `debt` owed: {toSend, debtAfter}. The debt
     * absorbs as much of the release as it can (those permits went back with the take-back).
     */
    static long[] absorb(long debt, long permits) {
        long taken = Math.min(debt, permits);
        return new long[] {permits - taken, debt - taken};
    }

    /**
     * A grant of `permits` on `name` held on its message, `confirm` its confirmation: the
     * name's releases wait for it; a TAKENBACK answer adds `permits` to the debt and runs
     * `takenBack` (the report). An answer in doubt (no definite one within the retry limit,
     * another error) adds no debt: the release is sent. The server that took a grant back
     * answers TAKENBACK to every retry, so a doubt after the retries means it was
     * unreachable all along; the residual risk is a take-back the client never heard of,
     * whose permits the release then adds a second time.
     */
    void held(String name, int permits, Waits.Confirm confirm, Runnable takenBack) {
        // Completed once the debt is counted (a release waiting on the outcome itself might
        // run before the debt is).
        CompletableFuture<Void> settled = new CompletableFuture<>();
        synchronized (this) {
            Name n = names.computeIfAbsent(name, k -> new Name());
            n.inflight.add(settled);
            if (confirm.isHeldBack()) {
                n.riders.add(confirm);
            }
        }
        confirm.outcome().thenAccept(o -> {
            synchronized (this) {
                Name n = names.get(name);
                if (n != null) {
                    n.inflight.remove(settled);
                    n.riders.remove(confirm);
                    if (o == Waits.Confirm.Outcome.TAKEN_BACK) {
                        n.debt += permits;
                    }
                    tidy(name, n);
                }
            }
            settled.complete(null);
            if (o == Waits.Confirm.Outcome.TAKEN_BACK) {
                takenBack.run();
            }
        });
    }

    /**
     * How many of a release of `permits` on `name` to send: after the name's confirmations
     * in flight now have answered (or {@link #WAIT_FOR_CONFIRMS_MS} passed), the release
     * less what the debt absorbs. A confirmation still unanswered then counts as in doubt:
     * nothing absorbed for it now (a TAKENBACK it hears later is owed to a later release,
     * which keeps the total right).
     */
    CompletableFuture<Long> toSend(String name, int permits) {
        List<CompletableFuture<Void>> waiting;
        synchronized (this) {
            Name n = names.get(name);
            if (n == null) {
                return CompletableFuture.completedFuture((long) permits); // the usual case: nothing held on a message
            }
            waiting = new ArrayList<>(n.inflight);
        }
        CompletableFuture<Void> answered = waiting.isEmpty() ? CompletableFuture.completedFuture(null)
                : CompletableFuture.allOf(waiting.toArray(CompletableFuture[]::new))
                        .completeOnTimeout(null, WAIT_FOR_CONFIRMS_MS, TimeUnit.MILLISECONDS);
        return answered.thenApply(x -> {
            synchronized (this) {
                Name n = names.get(name);
                if (n == null) {
                    return (long) permits;
                }
                long[] r = absorb(n.debt, permits);
                n.debt = r[1];
                tidy(name, n);
                return r[0];
            }
        });
    }

    /**
     * The confirmations a release of `name` may carry, taken off the name's riders: every
     * confirmation of the name in flight, when all of them are riders and there is no debt
     * (so the release needs no outcome to know what to send). Null otherwise: the release
     * takes the usual way ({@link #toSend}).
     */
    synchronized List<Waits.Confirm> riders(String name) {
        Name n = names.get(name);
        if (n == null || n.debt != 0 || n.riders.isEmpty() || n.riders.size() != n.inflight.size()) {
            return null;
        }
        List<Waits.Confirm> out = new ArrayList<>(n.riders);
        n.riders.clear();
        return out;
    }

    /** The riders of `name` (a release that cannot carry them sends them first, not waiting for the sweep). */
    synchronized List<Waits.Confirm> heldBack(String name) {
        Name n = names.get(name);
        return n == null ? List.of() : new ArrayList<>(n.riders);
    }

    /** The debt of `name` (tests). */
    synchronized long debt(String name) {
        Name n = names.get(name);
        return n == null ? 0 : n.debt;
    }

    private void tidy(String name, Name n) {
        if (n.debt == 0 && n.inflight.isEmpty()) {
            names.remove(name, n);
        }
    }
}
