// The watchdog of one client (clients/java, internal): every hold taken without a lease
// is renewed every third of the watchdog timeout by the client's one scheduler thread
// (Redisson's lockWatchdogTimeout, 30 s by default). A renewal that finds the hold gone,
// or that keeps failing until the lease must have run out, reports the loss.
package io.rlock;

import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import java.util.function.Predicate;

final class Watchdog {
    private final ScheduledExecutorService scheduler;
    private final Wire wire;
    private final RlockStats stats;
    private final long leaseMs;
    /** One entry per held thing (a key and an owner, or a permit id). */
    private final Map<String, Entry> entries = new ConcurrentHashMap<>();

    private final class Entry {
        final String name;
        final List<String> renew;
        final Predicate<Object> renewed;
        final Consumer<String> lost;
        /** Re-entrant holds counted here (Redisson's ExpirationEntry): renewal stops at 0. */
        int holds;
        volatile long lastRenewedNanos = System.nanoTime();
        ScheduledFuture<?> task;

        Entry(String name, List<String> renew, Predicate<Object> renewed, Consumer<String> lost) {
            this.name = name;
            this.renew = renew;
            this.renewed = renewed;
            this.lost = lost;
        }

        void tick() {
            wire.sendRetrying(renew).whenComplete((v, e) -> {
                if (e == null && renewed.test(v)) {
                    lastRenewedNanos = System.nanoTime();
                } else if (e == null || Wire.serverError(e) != null) {
                    drop(this, "the server no longer holds it (RENEW answered " + (e == null ? v : e.getMessage()) + ")");
                } else if (System.nanoTime() - lastRenewedNanos >= leaseMs * 1_000_000) {
                    // Transient failures are retried at the next tick; past the lease the hold is gone.
                    drop(this, "renewals failed until the lease ran out: " + e);
                }
            });
        }
    }

    Watchdog(ScheduledExecutorService scheduler, Wire wire, long leaseMs, RlockStats stats) {
        this.scheduler = scheduler;
        this.stats = stats;
        this.wire = wire;
        this.leaseMs = leaseMs;
    }

    long leaseMs() {
        return leaseMs;
    }

    /**
     * Counts one hold of `name` (the lease just set by an acquire) and renews it until
     * its holds are all released. `renewed` reads the renew command's reply.
     */
    void hold(String name, List<String> renew, Predicate<Object> renewed, Consumer<String> lost) {
        entries.compute(name, (k, e) -> {
            if (e == null) {
                e = new Entry(name, renew, renewed, lost);
                Entry entry = e;
                long period = Math.max(1, leaseMs / 3);
                e.task = scheduler.scheduleAtFixedRate(entry::tick, period, period, TimeUnit.MILLISECONDS);
            }
            e.holds++;
            e.lastRenewedNanos = System.nanoTime();
            return e;
        });
    }

    /** One hold of `name` released (`all`: every hold, the thing is free). */
    void release(String name, boolean all) {
        entries.computeIfPresent(name, (k, e) -> {
            if (all || --e.holds <= 0) {
                e.task.cancel(false);
                return null;
            }
            return e;
        });
    }

    boolean watching(String name) {
        return entries.containsKey(name);
    }

    private void drop(Entry e, String why) {
        if (entries.remove(e.name, e)) {
            e.task.cancel(false);
            stats.lostLocks.increment();
            e.lost.accept(why);
        }
    }

    void close() {
        for (Entry e : entries.values()) {
            e.task.cancel(false);
        }
        entries.clear();
    }
}
