// Micrometer meters of an RlockClient (rlock-spring): its counters (acquisitions, failed
// acquisitions, waits, lost locks) as function counters, read when the registry publishes;
// the auto-configuration registers one for the application's client.
package io.rlock.spring;

import io.micrometer.core.instrument.FunctionCounter;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Tag;
import io.micrometer.core.instrument.binder.MeterBinder;
import io.rlock.RlockClient;
import io.rlock.RlockStats;

import java.util.List;
import java.util.Objects;
import java.util.function.ToDoubleFunction;

/**
 * Binds {@code rlock.acquisitions}, {@code rlock.acquisitions.failed}, {@code rlock.waits}
 * and {@code rlock.locks.lost}, tagged {@code client=<client id>}.
 */
public class RlockMeterBinder implements MeterBinder {
    private final RlockClient client;

    public RlockMeterBinder(RlockClient client) {
        this.client = Objects.requireNonNull(client, "client");
    }

    @Override
    public void bindTo(MeterRegistry registry) {
        List<Tag> tags = List.of(Tag.of("client", client.getId()));
        RlockStats s = client.stats();
        counter(registry, "rlock.acquisitions", "holds taken (locks, re-entries, permits)", s, RlockStats::acquisitions, tags);
        counter(registry, "rlock.acquisitions.failed", "acquires that ended without the hold (taken, or the wait ran out)",
                s, RlockStats::failedAcquisitions, tags);
        counter(registry, "rlock.waits", "calls that waited in the server's queue", s, RlockStats::waits, tags);
        counter(registry, "rlock.locks.lost", "holds found gone before their release", s, RlockStats::lostLocks, tags);
    }

    private static void counter(MeterRegistry r, String name, String what, RlockStats s,
                                ToDoubleFunction<RlockStats> f, List<Tag> tags) {
        FunctionCounter.builder(name, s, f).description(what).tags(tags).register(r);
    }
}
