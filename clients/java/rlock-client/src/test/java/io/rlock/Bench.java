// `make bench-java` (clients/java, test scope): the rlock Java client against Redisson on
// the same module-loaded server, one run, side by side: 64 threads on one lock, 1 000
// waiting tasks on one lock, and 64 threads on a 4-permit semaphore. Reports handoffs/s,
// p99 wait, Jain fairness over the contenders, connections held (CLIENT LIST) and server
// CPU per acquisition, and writes the table into BENCHMARK.md under its own heading.
package io.rlock;

import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RSemaphore;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLongArray;

public final class Bench {
    /** One contender's loop body: take, give back; returns false when it should stop. */
    interface Contender {
        void take() throws Exception;

        void give() throws Exception;
    }

    /** An async contender: take then give, for task `i`. */
    interface AsyncContender {
        CompletableFuture<?> take(int i);

        CompletableFuture<?> give(int i);
    }

    record Result(String scenario, String side, double handoffsPerSec, double p99Ms, double jain,
                  int connections, double cpuUsPerAcq) {}

    static final long RUN_MS = Long.getLong("bench.ms", 5000);
    /** Run before measuring (JIT, connections, subscriptions), for both sides alike. */
    static final long WARM_MS = Long.getLong("bench.warm.ms", 1000);

    static int connections(TestServer s) {
        return s.connections();
    }

    static double cpu(TestServer s) {
        return Double.parseDouble(s.info("cpu", "used_cpu_sys")) + Double.parseDouble(s.info("cpu", "used_cpu_user"));
    }

    static double jain(long[] xs) {
        double sum = 0, sq = 0;
        for (long x : xs) {
            sum += x;
            sq += (double) x * x;
        }
        return sq == 0 ? 0 : sum * sum / (xs.length * sq);
    }

    static double p99(ConcurrentLinkedQueue<Long> waitsNanos) {
        long[] w = waitsNanos.stream().mapToLong(Long::longValue).toArray();
        if (w.length == 0) {
            return Double.NaN;
        }
        Arrays.sort(w);
        return w[(int) Math.min(w.length - 1, Math.ceil(w.length * 0.99) - 1)] / 1e6;
    }

    /** `threads` threads loop take/give for RUN_MS. */
    static Result threads(String scenario, String side, TestServer s, int threads, int baseConns, Contender c)
            throws Exception {
        AtomicLongArray counts = new AtomicLongArray(threads);
        ConcurrentLinkedQueue<Long> waits = new ConcurrentLinkedQueue<>();
        long from = System.nanoTime() + WARM_MS * 1_000_000;
        long end = from + RUN_MS * 1_000_000;
        double[] cpu0 = new double[1];
        int[] conns = new int[1];
        List<Thread> ts = new ArrayList<>();
        for (int i = 0; i < threads; i++) {
            int n = i;
            Thread t = new Thread(() -> {
                try {
                    while (System.nanoTime() < end) {
                        long t0 = System.nanoTime();
                        c.take();
                        if (t0 >= from) {
                            waits.add(System.nanoTime() - t0);
                            counts.incrementAndGet(n);
                        }
                        c.give();
                    }
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            });
            t.start();
            ts.add(t);
        }
        Thread.sleep(WARM_MS);
        cpu0[0] = cpu(s);
        Thread.sleep(RUN_MS / 2);
        conns[0] = connections(s) - baseConns;
        for (Thread t : ts) {
            t.join();
        }
        double cpu1 = cpu(s) - cpu0[0];
        long[] cs = new long[threads];
        long total = 0;
        for (int i = 0; i < threads; i++) {
            cs[i] = counts.get(i);
            total += cs[i];
        }
        return new Result(scenario, side, total * 1000.0 / RUN_MS, p99(waits), jain(cs), conns[0],
                cpu1 * 1e6 / Math.max(1, total));
    }

    /** `tasks` async tasks loop take/give for RUN_MS, all on the caller's client. */
    static Result tasks(String scenario, String side, TestServer s, int tasks, int baseConns, AsyncContender c)
            throws Exception {
        AtomicLongArray counts = new AtomicLongArray(tasks);
        ConcurrentLinkedQueue<Long> waits = new ConcurrentLinkedQueue<>();
        long from = System.nanoTime() + WARM_MS * 1_000_000;
        long end = from + RUN_MS * 1_000_000;
        List<CompletableFuture<Void>> done = new ArrayList<>();
        for (int i = 0; i < tasks; i++) {
            CompletableFuture<Void> f = new CompletableFuture<>();
            done.add(f);
            loop(c, i, from, end, counts, waits, f);
        }
        Thread.sleep(WARM_MS);
        double cpu0 = cpu(s);
        Thread.sleep(RUN_MS / 2);
        int conns = connections(s) - baseConns;
        CompletableFuture.allOf(done.toArray(new CompletableFuture[0])).get(RUN_MS + 60_000, TimeUnit.MILLISECONDS);
        double cpu1 = cpu(s);
        long[] cs = new long[tasks];
        long total = 0;
        for (int i = 0; i < tasks; i++) {
            cs[i] = counts.get(i);
            total += cs[i];
        }
        return new Result(scenario, side, total * 1000.0 / RUN_MS, p99(waits), jain(cs), conns,
                (cpu1 - cpu0) * 1e6 / Math.max(1, total));
    }

    private static void loop(AsyncContender c, int i, long from, long end, AtomicLongArray counts,
                             ConcurrentLinkedQueue<Long> waits, CompletableFuture<Void> done) {
        if (System.nanoTime() >= end) {
            done.complete(null);
            return;
        }
        long t0 = System.nanoTime();
        c.take(i).thenCompose(x -> {
            if (t0 >= from) {
                waits.add(System.nanoTime() - t0);
                counts.incrementAndGet(i);
            }
            return c.give(i);
        }).whenComplete((x, e) -> {
            if (e != null) {
                done.completeExceptionally(e);
            } else {
                loop(c, i, from, end, counts, waits, done);
            }
        });
    }

    static RedissonClient redisson(TestServer s) {
        Config config = new Config();
        // Redisson's defaults (a pool of 64 connections, 24 kept idle; 50 subscription connections at most).
        config.useSingleServer().setAddress(s.address());
        return Redisson.create(config);
    }

    public static void main(String[] args) throws Exception {
        String report = null;
        for (int i = 0; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--module" -> System.setProperty("rlock.module", args[i + 1]);
                case "--server" -> System.setProperty("redis.server", args[i + 1]);
                case "--report" -> report = args[i + 1];
                default -> throw new IllegalArgumentException("unknown option " + args[i]
                        + " (use --module PATH --server PATH --report FILE)");
            }
        }
        List<Result> results = new ArrayList<>();
        String version;
        try (TestServer s = new TestServer()) {
            String v = s.info("server", "valkey_version");
            version = v != null ? "Valkey " + v : "Redis " + s.info("server", "redis_version");
            int base = s.connections();
            // ---- 64 threads, one lock ----
            try (RlockClient c = RlockClient.create(s.uri(), RlockOptions.defaults())) {
                RlockLock l = c.getLock("bench:lock:rlock");
                results.add(threads("64 threads, one lock", "rlock (Java client)", s, 64, base, new Contender() {
                    public void take() { l.lock(); }
                    public void give() { l.unlock(); }
                }));
            }
            RedissonClient r = redisson(s);
            try {
                RLock l = r.getLock("bench:lock:redisson");
                results.add(threads("64 threads, one lock", "Redisson RLock", s, 64, base, new Contender() {
                    public void take() { l.lock(); }
                    public void give() { l.unlock(); }
                }));
            } finally {
                r.shutdown();
            }
            // ---- 1 000 tasks, one lock ----
            try (RlockClient c = RlockClient.create(s.uri(), RlockOptions.defaults())) {
                RlockLock l = c.getLock("bench:tasks:rlock");
                results.add(tasks("1 000 tasks, one lock", "rlock (Java client)", s, 1000, base, new AsyncContender() {
                    public CompletableFuture<?> take(int i) { return l.lockAsync(-1, TimeUnit.MILLISECONDS, 10_000 + i); }
                    public CompletableFuture<?> give(int i) { return l.unlockAsync(10_000 + i); }
                }));
            }
            r = redisson(s);
            try {
                RLock l = r.getLock("bench:tasks:redisson");
                results.add(tasks("1 000 tasks, one lock", "Redisson RLock", s, 1000, base, new AsyncContender() {
                    public CompletableFuture<?> take(int i) { return l.lockAsync(10_000 + i).toCompletableFuture(); }
                    public CompletableFuture<?> give(int i) { return l.unlockAsync(10_000 + i).toCompletableFuture(); }
                }));
            } finally {
                r.shutdown();
            }
            // ---- 64 threads, 4 permits ----
            try (RlockClient c = RlockClient.create(s.uri(), RlockOptions.defaults())) {
                RlockSemaphore sem = c.getSemaphore("bench:sem:rlock");
                sem.trySetPermits(4);
                results.add(threads("64 threads, 4 permits", "rlock (Java client)", s, 64, base, new Contender() {
                    public void take() throws Exception { sem.acquire(); }
                    public void give() { sem.release(); }
                }));
            }
            r = redisson(s);
            try {
                RSemaphore sem = r.getSemaphore("bench:sem:redisson");
                sem.trySetPermits(4);
                results.add(threads("64 threads, 4 permits", "Redisson RSemaphore", s, 64, base, new Contender() {
                    public void take() throws Exception { sem.acquire(); }
                    public void give() { sem.release(); }
                }));
            } finally {
                r.shutdown();
            }
        }
        String table = table(results, version);
        System.out.println(table);
        if (report != null) {
            write(Path.of(report), table);
        }
    }

    static String table(List<Result> rs, String version) {
        StringBuilder b = new StringBuilder();
        b.append(HEADING).append("\n\n");
        b.append("`make bench-java`, one run of ").append(RUN_MS / 1000).append(" s per row (after ")
                .append(WARM_MS).append(" ms of warm-up) on ").append(version)
                .append(" with the release module, the same server for both sides, on this project's 2-core machine."
                        + " Each contender loops take → give back with an empty critical section; no lease (both"
                        + " sides run their watchdog). Wait = from asking to holding. Jain fairness is over the"
                        + " contenders' acquisition counts (1 = equal shares). Connections = CLIENT LIST during"
                        + " the run less the server's own before it. CPU = the server's user+sys time over the run"
                        + " divided by the acquisitions. Redisson " + "4.7.0" + " with its default pool;"
                        + " rlock's Java client with its defaults (queued tickets).\n\n");
        b.append("| scenario | client | handoffs/s | p99 wait (ms) | Jain fairness | connections | server CPU/acq (µs) |\n");
        b.append("|---|---|---:|---:|---:|---:|---:|\n");
        for (Result r : rs) {
            b.append(String.format("| %s | %s | %.0f | %.1f | %.3f | %d | %.1f |%n", r.scenario(), r.side(),
                    r.handoffsPerSec(), r.p99Ms(), r.jain(), r.connections(), r.cpuUsPerAcq()));
        }
        b.append("\nRatios (rlock / Redisson):");
        for (int i = 0; i + 1 < rs.size(); i += 2) {
            Result m = rs.get(i), o = rs.get(i + 1);
            b.append(String.format(" %s: %.1fx handoffs/s, p99 wait %.2fx;", m.scenario(),
                    m.handoffsPerSec() / Math.max(1e-9, o.handoffsPerSec()), m.p99Ms() / Math.max(1e-9, o.p99Ms())));
        }
        b.setLength(b.length() - 1);
        b.append(".\n\nIssue 22's goals: at least 5x handoffs/s, p99 wait at most 1/10, and a constant number"
                + " of connections per client however many wait. Load average at the end of this run: ")
                .append(loadAverage()).append(" (on 2 cores; other work shares the machine, so rerun on a quiet one"
                        + " before reading much into the ratios).\n");
        return b.toString();
    }

    static String loadAverage() {
        try {
            return Files.readString(Path.of("/proc/loadavg")).split(" ")[0];
        } catch (Exception e) {
            return "unknown";
        }
    }

    static final String HEADING = "## Java client vs Redisson (make bench-java)";

    /** Replaces this section of the report (from its heading to the next `## `), or appends it. */
    static void write(Path report, String section) throws Exception {
        write(report, HEADING, section);
    }

    /** Replaces the section `heading` opens (to the next `## `) with `section`, or appends it (other benches too). */
    public static void write(Path report, String heading, String section) throws Exception {
        String old = Files.exists(report) ? Files.readString(report) : "";
        int at = old.indexOf(heading);
        String out;
        if (at < 0) {
            out = old + (old.endsWith("\n") || old.isEmpty() ? "" : "\n") + "\n" + section;
        } else {
            int next = old.indexOf("\n## ", at + heading.length());
            out = old.substring(0, at) + section + (next < 0 ? "" : old.substring(next));
        }
        Files.writeString(report, out);
    }
}
