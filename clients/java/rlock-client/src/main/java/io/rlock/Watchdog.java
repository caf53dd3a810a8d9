// The watchdog of one client (clients/java, internal): every hold taken without a lease
// is renewed about every third of the watchdog timeout by the client's one scheduler thread
// (Redisson's lockWatchdogTimeout, 30 s by default). A renewal that finds the hold gone,
// or that keeps failing until the lease must have run out, reports the loss. One ticker per
// client looks for due holds, rather than a timer per hold: taking a hold (on the grant's
// path, Lettuce's event loop) then only writes a map entry, and never wakes the scheduler
// thread.
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
        /** When the next renewal is due (nanoTime): a third of the lease after the last. */
        volatile long dueNanos;

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

    /** The ticker, started with the first hold and running until close. */
    private volatile ScheduledFuture<?> ticker;
    private final long periodNanos;

    Watchdog(ScheduledExecutorService scheduler, Wire wire, long leaseMs, RlockStats stats) {
        this.scheduler = scheduler;
        this.stats = stats;
        this.wire = wire;
        this.leaseMs = leaseMs;
        this.periodNanos = Math.max(1, leaseMs / 3) * 1_000_000;
    }

    long leaseMs() {
        return leaseMs;
    }

    /**
     * Counts one hold of `name` (the lease just set by an acquire) and renews it until
     * its holds are all released. `renewed` reads the renew command's reply.
     */
    void hold(String name, List<String> renew, Predicate<Object> renewed, Consumer<String> lost) {
        long now = System.nanoTime();
        entries.compute(name, (k, e) -> {
            if (e == null) {
                e = new Entry(name, renew, renewed, lost);
                e.dueNanos = now + periodNanos;
            }
            e.holds++;
            e.lastRenewedNanos = now;
            return e;
        });
        if (ticker == null) {
            start();
        }
    }

    /**
     * The ticker runs every sixth of the lease, so a hold is renewed between a third and
     * half of the lease after its last renewal, well before it ends.
     */
    private synchronized void start() {
        if (ticker == null) {
            long every = Math.max(1, leaseMs / 6);
            ticker = scheduler.scheduleAtFixedRate(this::tick, every, every, TimeUnit.MILLISECONDS);
        }
    }

    private void tick() {
        long now = System.nanoTime();
        for (Entry e : entries.values()) {
            if (now - e.dueNanos >= 0) {
                e.dueNanos = now + periodNanos;
                e.tick();
            }
        }
    }

    /** One hold of `name` released (`all`: every hold, the thing is free). */
    void release(String name, boolean all) {
        entries.computeIfPresent(name, (k, e) -> all || --e.holds <= 0 ? null : e);
    }

    boolean watching(String name) {
        return entries.containsKey(name);
    }

    private void drop(Entry e, String why) {
        if (entries.remove(e.name, e)) {
            stats.lostLocks.increment();
            e.lost.accept(why);
        }
    }

    synchronized void close() {
        if (ticker != null) {
            ticker.cancel(false);
        }
        entries.clear();
    }
}
