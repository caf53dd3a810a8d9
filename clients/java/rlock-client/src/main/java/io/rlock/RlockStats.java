// The counters of one RlockClient (clients/java): what a metrics system reads to watch the
// locks of an application (rlock-spring binds them to Micrometer). Counted by the one
// implementation of acquire, wait and watchdog, so every primitive and transport counts alike.
package io.rlock;

import java.util.concurrent.atomic.LongAdder;

/** Monotonic counters since the client was made. Thread-safe; reads are cheap. */
public final class RlockStats {
    final LongAdder acquisitions = new LongAdder();
    final LongAdder failedAcquisitions = new LongAdder();
    final LongAdder waits = new LongAdder();
    final LongAdder lostLocks = new LongAdder();

    RlockStats() {}

    /** Counts one acquire's outcome; returns it, so the acquire paths count inline. */
    boolean count(boolean held) {
        (held ? acquisitions : failedAcquisitions).increment();
        return held;
    }

    /** Holds taken: locks (re-entrant, fenced, read-write; each re-entry too), semaphore permits, expirable permits. */
    public long acquisitions() {
        return acquisitions.sum();
    }

    /** Acquires that ended without the hold: a one-try that found it taken, or a wait that ran out. */
    public long failedAcquisitions() {
        return failedAcquisitions.sum();
    }

    /** Calls that had to wait in the server's queue (a queued ticket or a blocked connection). */
    public long waits() {
        return waits.sum();
    }

    /**
     * Holds found gone before their release: by the watchdog (expired, force-released, lost in
     * a failover), or a ticket's grant the server took back before it was confirmed.
     */
    public long lostLocks() {
        return lostLocks.sum();
    }

    @Override
    public String toString() {
        return "RlockStats{acquisitions=" + acquisitions() + ", failedAcquisitions=" + failedAcquisitions()
                + ", waits=" + waits() + ", lostLocks=" + lostLocks() + "}";
    }
}
