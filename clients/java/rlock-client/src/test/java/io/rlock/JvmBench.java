// `make bench-java-jvms` (clients/java, test scope; part of `make bench-java`): the rlock Java
// client against the real Redisson, contenders in 4 separate JVMs on one module-loaded
// server: one lock (RlockLock vs RLock) and a 4-permit semaphore (RlockSemaphore vs
// RSemaphore), at 8 and 64 contenders (issue 40). Reports owner changes/s, acquisitions/s,
// p50 and p99 wait, Jain fairness, connections and server CPU per acquisition, and writes
// the table into BENCHMARK.md under its own heading. The coordinator (main) starts the
// server and the worker JVMs (main with `worker`). Each worker starts its contenders on
// "GO <wall-clock start>", says "WARM" once its JIT compilers have gone quiet (four JVMs
// compiling Netty, Lettuce and Redisson on two cores take tens of seconds to, and until then
// the run measures the compilers, not the clients), counts only inside the window that
// "MEASURE <from> <to>" gives, and prints its numbers. With `--floor PATH` (the Rust client's
// contenders example, which the make target builds) each pair of rows is followed by the
// machine's floor on the same server: the Rust client's blocked WAIT with as many contender
// processes (issue 40: every client against that figure in the same run).
package io.rlock;

import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RSemaphore;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLongArray;

public final class JvmBench {
    static final String HEADING = "## Java client vs Redisson across JVMs (make bench-java)";
    static final int JVMS = 4;
    static final long RUN_MS = Long.getLong("bench.ms", 5000);
    /** The least warm-up: every contender runs this long before its JVM may say WARM. */
    static final long WARM_MS = Long.getLong("bench.warm.ms", 5000);
    /** The most: a JVM whose compilers are still busy then says WARM anyway (and the table says so). */
    static final long WARM_MAX_MS = Long.getLong("bench.warm.max.ms", 120000);
    /** Quiet: the JIT compiler threads used less than this share of one core over the last QUIET_WINDOW_MS. */
    static final double QUIET_SHARE = 0.05;
    static final long QUIET_WINDOW_MS = 10000;
    static final int PERMITS = 4;
    /**
     * Only the rows matching `primitive:side:contenders` (`-Dbench.only=semaphore:rlock:8`;
     * `*` for any part), for a before/after of one row; every row when unset.
     */
    static final String ONLY = System.getProperty("bench.only", "*:*:*");

    static boolean wanted(String primitive, String side, int n) {
        String[] f = ONLY.split(":", -1);
        return f.length == 3 && (f[0].equals("*") || f[0].equals(primitive)) && (f[1].equals("*") || f[1].equals(side))
                && (f[2].equals("*") || f[2].equals(Integer.toString(n)));
    }

    record Result(String primitive, String side, int contenders, double changesPerSec, double acqPerSec,
                  double p50Ms, double p99Ms, double jain, int connections, double cpuUsPerAcq, long warmMs,
                  double jitShare) {
        boolean quiet() {
            return jitShare < QUIET_SHARE;
        }
    }

    /** Take and give back, one contender's loop body. */
    interface Contender {
        void take() throws Exception;

        void give() throws Exception;
    }

    public static void main(String[] args) throws Exception {
        if (args.length > 0 && args[0].equals("worker")) {
            worker(args[1], args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4]), Integer.parseInt(args[5]));
            return;
        }
        String report = null;
        String floor = null;
        for (int i = 0; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--module" -> System.setProperty("rlock.module", args[i + 1]);
                case "--server" -> System.setProperty("redis.server", args[i + 1]);
                case "--report" -> report = args[i + 1];
                case "--floor" -> floor = args[i + 1];
                default -> throw new IllegalArgumentException("unknown option " + args[i]
                        + " (use --module PATH --server PATH --report FILE --floor PATH)");
            }
        }
        List<Result> results = new ArrayList<>();
        String version;
        try (TestServer s = new TestServer()) {
            String v = s.info("server", "valkey_version");
            version = v != null ? "Valkey " + v : "Redis " + s.info("server", "redis_version");
            for (String primitive : List.of("lock", "semaphore")) {
                for (int n : new int[] {8, 64}) {
                    for (String side : List.of("rlock", "redisson")) {
                        if (!wanted(primitive, side, n)) {
                            continue;
                        }
                        Result r = run(s, primitive, side, n);
                        System.out.printf(Locale.ROOT, "%-9s %-8s %3d: %7.0f owner changes/s, %7.0f acq/s, p50 %6.2f ms,"
                                        + " p99 %7.2f ms, Jain %.3f, %3d connections, %6.1f us CPU/acq, warm-up %d ms%s%n",
                                primitive, side, n, r.changesPerSec(), r.acqPerSec(), r.p50Ms(), r.p99Ms(), r.jain(),
                                r.connections(), r.cpuUsPerAcq(), r.warmMs(), r.quiet() ? "" : String.format(Locale.ROOT, " (JIT still at %.0f %% of a core)", r.jitShare() * 100));
                        results.add(r);
                    }
                    if (floor != null && wanted(primitive, "floor", n)) {
                        Result r = floor(s, floor, primitive, n);
                        System.out.printf(Locale.ROOT, "%-9s %-8s %3d: %7.0f owner changes/s, %7.0f acq/s, p50 %6.2f ms,"
                                        + " p99 %7.2f ms, Jain %.3f, %3d connections, %6.1f us CPU/acq%n",
                                primitive, "floor", n, r.changesPerSec(), r.acqPerSec(), r.p50Ms(), r.p99Ms(), r.jain(),
                                r.connections(), r.cpuUsPerAcq());
                        results.add(r);
                    }
                }
            }
        }
        String table = table(results, version);
        System.out.println(table);
        if (report != null && ONLY.equals("*:*:*")) {
            Bench.write(Path.of(report), HEADING, table);
        }
    }

    static double cpu(TestServer s) {
        return Double.parseDouble(s.info("cpu", "used_cpu_sys")) + Double.parseDouble(s.info("cpu", "used_cpu_user"));
    }

    /** Connections the contenders hold: CLIENT LIST less the coordinator's own. */
    static int connections(TestServer s) {
        return s.redis().clientList().split("\n").length;
    }

    static long wallNanos() {
        Instant i = Instant.now();
        return i.getEpochSecond() * 1_000_000_000L + i.getNano();
    }

    /** One row: JVMS worker JVMs of n/JVMS contender threads each, started together. */
    static Result run(TestServer s, String primitive, String side, int n) throws Exception {
        int base = connections(s);
        List<Process> procs = new ArrayList<>();
        List<BufferedReader> outs = new ArrayList<>();
        for (int j = 0; j < JVMS; j++) {
            Process p = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                    "-Xmx256m", "-Dbench.ms=" + RUN_MS, "-Dbench.warm.ms=" + WARM_MS,
                    "-Dbench.warm.max.ms=" + WARM_MAX_MS,
                    "-cp", System.getProperty("java.class.path"), JvmBench.class.getName(),
                    "worker", primitive, side, Integer.toString(s.port), Integer.toString(n / JVMS),
                    Integer.toString(j))
                    .redirectError(ProcessBuilder.Redirect.INHERIT).start();
            procs.add(p);
            outs.add(new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8)));
        }
        for (BufferedReader r : outs) {
            expect(r, "READY");
        }
        long go = wallNanos();
        for (Process p : procs) {
            p.getOutputStream().write(("GO " + go + "\n").getBytes(StandardCharsets.UTF_8));
            p.getOutputStream().flush();
        }
        // Every JVM runs its contenders until its compilers are quiet; the slowest decides.
        double jit = 0;
        for (BufferedReader r : outs) {
            jit = Math.max(jit, Double.parseDouble(expect(r, "WARM").split(" ")[1]));
        }
        long warmMs = (wallNanos() - go) / 1_000_000;
        // One wall-clock window for every JVM: their acquisitions can be put in one order.
        long measureFrom = wallNanos() + 200_000_000L, measureTo = measureFrom + RUN_MS * 1_000_000;
        for (Process p : procs) {
            p.getOutputStream().write(("MEASURE " + measureFrom + " " + measureTo + "\n")
                    .getBytes(StandardCharsets.UTF_8));
            p.getOutputStream().flush();
        }
        sleepUntil(measureFrom);
        double cpu0 = cpu(s);
        sleepUntil(measureFrom + RUN_MS * 500_000);
        int conns = connections(s) - base;
        sleepUntil(measureTo);
        double cpu1 = cpu(s);
        List<Long> counts = new ArrayList<>();
        List<long[]> stamps = new ArrayList<>();
        List<Long> waits = new ArrayList<>();
        for (BufferedReader r : outs) {
            for (String line = r.readLine(); line != null; line = r.readLine()) {
                String[] f = line.split(" ");
                switch (f[0]) {
                    case "COUNT" -> counts.add(Long.parseLong(f[1]));
                    case "WAITS" -> Arrays.stream(f).skip(1).forEach(w -> waits.add(Long.parseLong(w)));
                    case "STAMPS" -> {
                        // STAMPS <contender> <wall ns>...
                        long who = Long.parseLong(f[1]);
                        for (int i = 2; i < f.length; i++) {
                            stamps.add(new long[] {Long.parseLong(f[i]), who});
                        }
                    }
                    default -> { }
                }
            }
        }
        for (Process p : procs) {
            if (!p.waitFor(60, TimeUnit.SECONDS)) {
                p.destroyForcibly();
            }
        }
        // Owner changes: acquisitions in time order whose contender differs from the one before.
        stamps.sort((a, b) -> Long.compare(a[0], b[0]));
        long changes = 0;
        for (int i = 1; i < stamps.size(); i++) {
            if (stamps.get(i)[1] != stamps.get(i - 1)[1]) {
                changes++;
            }
        }
        long total = counts.stream().mapToLong(Long::longValue).sum();
        long[] xs = counts.stream().mapToLong(Long::longValue).toArray();
        long[] ws = waits.stream().mapToLong(Long::longValue).sorted().toArray();
        return new Result(primitive, side, n, changes * 1000.0 / RUN_MS, total * 1000.0 / RUN_MS,
                pct(ws, 0.50), pct(ws, 0.99), Bench.jain(xs), conns, (cpu1 - cpu0) * 1e6 / Math.max(1, total), warmMs,
                jit);
    }

    /**
     * The machine's floor for one row: the Rust client's blocked WAIT, n contender processes,
     * RUN_MS long, on the same server (`exe`: its contenders example, whose one-row mode
     * prints the row as a table line: | primitive | n | client | changes/s | acq/s | p50 |
     * p99 | Jain | connections | CPU/acq |).
     */
    static Result floor(TestServer s, String exe, String primitive, int n) throws Exception {
        Process p = new ProcessBuilder(exe, "redis://127.0.0.1:" + s.port + "/", "blocking", primitive,
                Integer.toString(n), Long.toString(Math.max(1, RUN_MS / 1000)))
                .redirectError(ProcessBuilder.Redirect.INHERIT).start();
        String row = null;
        try (BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
            for (String line = r.readLine(); line != null; line = r.readLine()) {
                if (line.startsWith("|")) {
                    row = line;
                }
            }
        }
        if (!p.waitFor(120, TimeUnit.SECONDS) || p.exitValue() != 0 || row == null) {
            p.destroyForcibly();
            throw new IllegalStateException("the floor's row did not run: " + exe);
        }
        String[] f = Arrays.stream(row.split("\\|")).map(String::trim).filter(x -> !x.isEmpty())
                .toArray(String[]::new);
        return new Result(primitive, "floor", n, Double.parseDouble(f[3]), Double.parseDouble(f[4]),
                Double.parseDouble(f[5]), Double.parseDouble(f[6]), Double.parseDouble(f[7]),
                Integer.parseInt(f[8]), Double.parseDouble(f[9]), 0, 0);
    }

    static double pct(long[] sorted, double q) {
        if (sorted.length == 0) {
            return Double.NaN;
        }
        return sorted[Math.min(sorted.length - 1, (int) Math.ceil(sorted.length * q) - 1)] / 1e6;
    }

    static void sleepUntil(long wall) throws InterruptedException {
        long left = wall - wallNanos();
        if (left > 0) {
            TimeUnit.NANOSECONDS.sleep(left);
        }
    }

    static String expect(BufferedReader r, String what) throws Exception {
        for (String line = r.readLine(); line != null; line = r.readLine()) {
            if (line.startsWith(what)) {
                return line;
            }
        }
        throw new IllegalStateException("a worker ended before " + what);
    }

    // ---- a worker JVM ----------------------------------------------------------------------

    /**
     * `threads` contenders of `side` on one `primitive`, numbered from jvm * threads. Each
     * acquisition in the window is stamped (wall clock, inside the hold) and its wait
     * (asking to holding) recorded. Prints COUNT per contender, STAMPS and WAITS.
     */
    static void worker(String primitive, String side, int port, int threads, int jvm) throws Exception {
        PrintStream out = System.out;
        System.setOut(new PrintStream(System.err, true, StandardCharsets.UTF_8));
        String key = "bench:" + primitive + ":" + side;
        AutoCloseable closer;
        java.util.function.Supplier<Contender> make;
        if (side.equals("rlock")) {
            RlockClient c = RlockClient.create("redis://127.0.0.1:" + port);
            closer = c;
            if (primitive.equals("lock")) {
                RlockLock l = c.getLock(key);
                make = () -> new Contender() {
                    public void take() { l.lock(); }
                    public void give() { l.unlock(); }
                };
            } else {
                RlockSemaphore sem = c.getSemaphore(key);
                sem.trySetPermits(PERMITS);
                make = () -> new Contender() {
                    public void take() throws Exception { sem.acquire(); }
                    public void give() { sem.release(); }
                };
            }
        } else {
            Config config = new Config();
            // Redisson's defaults (a pool of 64 connections, 24 kept idle; 50 subscription connections at most).
            config.useSingleServer().setAddress("redis://127.0.0.1:" + port);
            RedissonClient r = Redisson.create(config);
            closer = r::shutdown;
            if (primitive.equals("lock")) {
                RLock l = r.getLock(key);
                make = () -> new Contender() {
                    public void take() { l.lock(); }
                    public void give() { l.unlock(); }
                };
            } else {
                RSemaphore sem = r.getSemaphore(key);
                sem.trySetPermits(PERMITS);
                make = () -> new Contender() {
                    public void take() throws Exception { sem.acquire(); }
                    public void give() { sem.release(); }
                };
            }
        }
        long[] count = new long[threads];
        long[][] stamps = new long[threads][];
        long[][] waits = new long[threads][];
        int[] recorded = new int[threads];
        // The measuring window, from MEASURE; never reached until then.
        AtomicLongArray window = new AtomicLongArray(new long[] {Long.MAX_VALUE, Long.MAX_VALUE});
        List<Thread> ts = new ArrayList<>();
        CountDownLatch go = new CountDownLatch(1);
        // Every thread takes and gives a few times before READY: class loading, JIT and the
        // clients' connections happen before GO, not in the measurement.
        CountDownLatch warmed = new CountDownLatch(threads);
        for (int t = 0; t < threads; t++) {
            int me = t;
            stamps[me] = new long[400_000];
            waits[me] = new long[400_000];
            Thread th = new Thread(() -> {
                Contender c = make.get();
                int nw = 0;
                try {
                    for (int i = 0; i < 20; i++) {
                        c.take();
                        c.give();
                    }
                    warmed.countDown();
                    go.await();
                    while (true) {
                        long t0 = System.nanoTime();
                        c.take();
                        long got = System.nanoTime();
                        long wall = wallNanos();
                        c.give();
                        if (wall >= window.get(1)) {
                            break;
                        }
                        if (wall >= window.get(0) && nw < stamps[me].length) {
                            count[me]++;
                            stamps[me][nw] = wall;
                            waits[me][nw] = got - t0;
                            nw++;
                        }
                    }
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
                recorded[me] = nw;
            });
            th.start();
            ts.add(th);
        }
        warmed.await();
        out.println("READY");
        out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        expect(in, "GO");
        long started = System.nanoTime();
        go.countDown();
        out.println("WARM " + warmUp(started));
        out.flush();
        String[] m = expect(in, "MEASURE").split(" ");
        window.set(0, Long.parseLong(m[1]));
        window.set(1, Long.parseLong(m[2]));
        for (Thread th : ts) {
            th.join();
        }
        for (int t = 0; t < threads; t++) {
            out.println("COUNT " + count[t]);
            StringBuilder sb = new StringBuilder("STAMPS ").append(jvm * threads + t);
            StringBuilder wb = new StringBuilder("WAITS");
            for (int i = 0; i < recorded[t]; i++) {
                sb.append(' ').append(stamps[t][i]);
                wb.append(' ').append(waits[t][i]);
            }
            out.println(sb);
            out.println(wb);
        }
        out.flush();
        closer.close();
        System.exit(0);
    }

    /**
     * Waits, while the contenders run, until this JVM's JIT compiler threads used less than
     * QUIET_SHARE of a core over the last QUIET_WINDOW_MS, after at least WARM_MS and at most
     * WARM_MAX_MS. Returns their share of a core over that last window. Their CPU time is read from
     * /proc/self/task (Linux); elsewhere, HotSpot's total compilation time stands in for it.
     */
    static double warmUp(long started) throws Exception {
        List<long[]> seen = new ArrayList<>(); // {nanoTime, compiler ms}
        double share = 1;
        while (true) {
            long now = System.nanoTime();
            seen.add(new long[] {now, compilerMs()});
            long ranMs = (now - started) / 1_000_000;
            if (ranMs >= WARM_MS) {
                // Over the shortest window of at least QUIET_WINDOW_MS: the newest sample
                // that old. (A window bounded above too was never found on a loaded machine,
                // where the sleeps between samples overshoot, and the share stayed unknown.)
                long[] last = seen.get(seen.size() - 1);
                for (int i = seen.size() - 2; i >= 0; i--) {
                    long[] then = seen.get(i);
                    long windowMs = (last[0] - then[0]) / 1_000_000;
                    if (windowMs >= QUIET_WINDOW_MS) {
                        share = (last[1] - then[1]) / (double) windowMs;
                        if (share < QUIET_SHARE) {
                            return share;
                        }
                        break;
                    }
                }
            }
            if (ranMs >= WARM_MAX_MS) {
                return share;
            }
            Thread.sleep(250);
        }
    }

    /** CPU milliseconds this JVM's JIT compiler threads have used. */
    static long compilerMs() {
        File[] tasks = new File("/proc/self/task").listFiles();
        if (tasks == null) {
            return ManagementFactory.getCompilationMXBean().getTotalCompilationTime();
        }
        long ticks = 0;
        for (File t : tasks) {
            try {
                String stat = Files.readString(t.toPath().resolve("stat"));
                int close = stat.lastIndexOf(')');
                String name = stat.substring(stat.indexOf('(') + 1, close);
                if (name.contains("Compiler")) {
                    String[] f = stat.substring(close + 2).split(" ");
                    ticks += Long.parseLong(f[11]) + Long.parseLong(f[12]); // utime, stime
                }
            } catch (IOException | RuntimeException gone) {
                // A thread that ended while being read.
            }
        }
        return ticks * 10; // USER_HZ is 100 on Linux
    }

    static String table(List<Result> rs, String version) {
        StringBuilder b = new StringBuilder(HEADING).append("\n\n");
        b.append("One run on ").append(version).append(" with the release module, ").append(JVMS)
                .append(" worker JVMs on this machine's ").append(Runtime.getRuntime().availableProcessors())
                .append(" cores (load average ").append(Bench.loadAverage()).append(" at the end, the bench's own"
                        + " JVMs included), ").append(RUN_MS).append(" ms measured after a warm-up in which the contenders"
                        + " run until every JVM's JIT compiler threads used under ").append(Math.round(QUIET_SHARE * 100))
                .append(" % of a core over ").append(QUIET_WINDOW_MS).append(" ms (at least ").append(WARM_MS)
                .append(" ms, at most ").append(WARM_MAX_MS).append(" ms; where a JVM's compilers were still busy then, the most busy one's share of a core is given)."
                        + " Four JVMs compiling Netty, Lettuce and Redisson on two cores take tens of seconds to"
                        + " settle, and a shorter warm-up measures their compilers more than either client."
                        + " Contenders are split evenly over the JVMs. Each contender loops take → give"
                        + " back with an empty critical section, no lease (both sides run their watchdog). rlock:"
                        + " RlockClient's defaults (a ticket per wait, heard on the client's own tagged channel (NOTIFY);"
                        + " a lock holds on its grant message);"
                        + " Redisson 4.7.0 with its defaults. Owner changes: acquisitions, put in one order by"
                        + " the wall-clock stamp each takes inside its hold, whose contender differs from the"
                        + " one before (for the semaphore: of 4 permits). Wait: asking to holding. Jain: over"
                        + " the contenders' acquisitions. Connections: CLIENT LIST during the run, every JVM"
                        + " together. CPU: the server's user+sys time over the window per acquisition.");
        if (rs.stream().anyMatch(r -> r.side().equals("floor"))) {
            b.append(" The floor: the machine's, on the same server right after each pair: the Rust client's"
                    + " blocked WAIT (the module hands the hold over inside one command; no JVM), one contender per"
                    + " process, as many processes as contenders (the rlock-client crate's contenders example),"
                    + " measured as long, without a warm-up.");
        }
        b.append("\n\n");
        b.append("| primitive | contenders | client | owner changes/s | acquisitions/s | p50 wait (ms) | p99 wait (ms)"
                + " | Jain | connections | server CPU/acq (µs) | warm-up (s) |\n");
        b.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for (Result r : rs) {
            boolean floor = r.side().equals("floor");
            b.append(String.format(Locale.ROOT, "| %s | %d | %s | %.0f | %.0f | %.2f | %.2f | %.3f | %d | %.1f | %s |%n",
                    r.primitive(), r.contenders(), floor ? "floor: Rust client, blocked WAIT, " + r.contenders() + " processes"
                            : r.side().equals("rlock") ? "rlock (Java client)"
                            : r.primitive().equals("lock") ? "Redisson RLock" : "Redisson RSemaphore",
                    r.changesPerSec(), r.acqPerSec(), r.p50Ms(), r.p99Ms(), r.jain(), r.connections(),
                    r.cpuUsPerAcq(), floor ? "–" : String.format(Locale.ROOT, "%.0f%s", r.warmMs() / 1000.0,
                            r.quiet() ? "" : String.format(Locale.ROOT, " (JIT %.0f %%)", r.jitShare() * 100))));
        }
        b.append("\nRatios (rlock / Redisson");
        if (rs.stream().anyMatch(r -> r.side().equals("floor"))) {
            b.append("; each side's owner changes/s over the floor's");
        }
        b.append("):");
        for (Result m : rs) {
            if (!m.side().equals("rlock")) {
                continue;
            }
            Result o = find(rs, m, "redisson"), f = find(rs, m, "floor");
            if (o == null) {
                continue;
            }
            b.append(String.format(Locale.ROOT, " %s at %d: %.1fx owner changes/s, %.1fx acquisitions/s, p99 wait"
                            + " %.2fx, CPU/acq %.2fx", m.primitive(), m.contenders(),
                    m.changesPerSec() / Math.max(1e-9, o.changesPerSec()),
                    m.acqPerSec() / Math.max(1e-9, o.acqPerSec()), m.p99Ms() / Math.max(1e-9, o.p99Ms()),
                    m.cpuUsPerAcq() / Math.max(1e-9, o.cpuUsPerAcq())));
            if (f != null) {
                b.append(String.format(Locale.ROOT, " (rlock %.2fx the floor, Redisson %.2fx)",
                        m.changesPerSec() / Math.max(1e-9, f.changesPerSec()),
                        o.changesPerSec() / Math.max(1e-9, f.changesPerSec())));
            }
            b.append(';');
        }
        b.setLength(b.length() - 1);
        b.append(".\n");
        return b.toString();
    }

    /** The row of `side` with m's primitive and contenders, or null. */
    static Result find(List<Result> rs, Result m, String side) {
        return rs.stream().filter(r -> r.side().equals(side) && r.primitive().equals(m.primitive())
                && r.contenders() == m.contenders()).findFirst().orElse(null);
    }
}
