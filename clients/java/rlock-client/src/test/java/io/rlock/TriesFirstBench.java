// A side-by-side measure of how a waiting acquire starts (clients/java, test scope; run by
// hand, not by `make test`: mvn -f clients/java/pom.xml -pl rlock-client test-compile
// exec:java -Dexec.classpathScope=test -Dexec.mainClass=io.rlock.TriesFirstBench, with
// REDIS_SERVER and RLOCK_MODULE as the tests take them): the same RLOCK.ACQUIRE
// ... WAIT 0 sent through Waits.await as a handle's waiting acquire (Contention: try
// first, unless held lately) and as before (a ticket at once), one run, on one server:
// one thread's uncontended acquire+release loop (acquisitions/s), then 8 clients' threads
// on one lock (owner changes/s), four rounds (the first warms the JIT). Prints a line
// per case; writes nothing.
package io.rlock;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

public final class TriesFirstBench {
    static final long RUN_MS = 3_000;

    /** One acquire+release of `name` by `owner` on `c`, through the rule or straight to a ticket. */
    static void cycle(RlockClient c, String name, String owner, Contention seen) {
        List<String> args = new ArrayList<>(List.of("RLOCK.ACQUIRE", name, owner, "30000", "WAIT", "0",
                "ID", Wire.requestId()));
        Object reply = seen == null
                ? Sync.join(c.waits().await(args, r -> List.of(), null))
                : Sync.join(c.waits().await(args, r -> List.of(), null, seen, r -> r == null));
        if (reply != null) {
            throw new IllegalStateException("not granted: " + reply);
        }
        Sync.join(c.wire().sendRetrying(List.of("RLOCK.RELEASE", name, owner, "ID", Wire.requestId())));
    }

    static double alone(RlockClient c, boolean rule) {
        String name = "bench:tf:alone:" + rule + ":" + System.nanoTime();
        Contention seen = rule ? new Contention() : null;
        for (int i = 0; i < 200; i++) {
            cycle(c, name, "o", seen); // warm up
        }
        long n = 0;
        long t0 = System.nanoTime();
        while (System.nanoTime() - t0 < RUN_MS * 1_000_000) {
            cycle(c, name, "o", seen);
            n++;
        }
        return n / ((System.nanoTime() - t0) / 1e9);
    }

    static double contended(List<RlockClient> cs, boolean rule) throws InterruptedException {
        String name = "bench:tf:eight:" + rule + ":" + System.nanoTime();
        AtomicBoolean stop = new AtomicBoolean();
        AtomicLong n = new AtomicLong();
        List<Thread> ts = new ArrayList<>();
        for (int i = 0; i < cs.size(); i++) {
            RlockClient c = cs.get(i);
            String owner = "o" + i;
            Contention seen = rule ? new Contention() : null;
            Thread t = new Thread(() -> {
                while (!stop.get()) {
                    cycle(c, name, owner, seen);
                    n.incrementAndGet();
                }
            });
            t.setDaemon(true);
            ts.add(t);
        }
        long t0 = System.nanoTime();
        ts.forEach(Thread::start);
        Thread.sleep(RUN_MS);
        long got = n.get();
        double secs = (System.nanoTime() - t0) / 1e9;
        stop.set(true);
        for (Thread t : ts) {
            t.join(10_000);
        }
        return got / secs;
    }

    public static void main(String[] args) throws Exception {
        try (TestServer server = new TestServer()) {
            List<RlockClient> cs = new ArrayList<>();
            for (int i = 0; i < 8; i++) {
                cs.add(RlockClient.create(server.uri(), RlockOptions.defaults()));
            }
            try {
                for (int round = 0; round < 4; round++) {
                    double before = alone(cs.get(0), false);
                    double after = alone(cs.get(0), true);
                    System.out.printf("alone: ticket at once %.0f/s, try first %.0f/s, ratio %.2f%n",
                            before, after, after / before);
                    double cb = contended(cs, false);
                    double ca = contended(cs, true);
                    System.out.printf("8 clients: ticket at once %.0f/s, rule %.0f/s, ratio %.2f%n", cb, ca, ca / cb);
                }
            } finally {
                cs.forEach(RlockClient::close);
            }
        }
    }
}
