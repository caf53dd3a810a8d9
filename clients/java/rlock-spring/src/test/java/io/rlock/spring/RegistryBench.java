// `make bench-java`'s second half (rlock-spring, test scope): Spring's lock registries under
// contention, each contender thread in one of several JVMs, all on one module-loaded server:
// rlock's RlockLockRegistry against Spring Integration's RedisLockRegistry (spin and pub/sub
// modes) and Redisson's RLock, at 8 and 64 contenders. Reports owner changes/s, p99 wait,
// Jain fairness over the contenders and connections held, and writes the table into
// BENCHMARK.md under its own heading. The coordinator (main) starts the server and the
// worker JVMs (main with `worker`), which wait for "GO" on stdin and print their numbers.
package io.rlock.spring;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.rlock.Bench;
import io.rlock.RlockClient;
import io.rlock.RlockOptions;
import io.rlock.TestServer;
import org.redisson.Redisson;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;
import org.springframework.data.redis.connection.RedisConnectionFactory;
import org.springframework.integration.redis.util.RedisLockRegistry;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.Lock;

public final class RegistryBench {
    static final String HEADING = "## Spring lock registries across JVMs (make bench-java)";
    static final int JVMS = 4;
    static final long RUN_MS = Long.getLong("bench.ms", 5000);
    static final long WARM_MS = Long.getLong("bench.warm.ms", 1000);
    static final List<String> SIDES = List.of("rlock", "spring-spin", "spring-pubsub", "redisson");

    record Result(String side, int contenders, double ownerChangesPerSec, double p99Ms, double jain, int connections) {}

    public static void main(String[] args) throws Exception {
        if (args.length > 0 && args[0].equals("worker")) {
            worker(args[1], Integer.parseInt(args[2]), Integer.parseInt(args[3]));
            return;
        }
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
            for (int n : new int[] {8, 64}) {
                for (String side : SIDES) {
                    Result r = run(s, side, n);
                    System.out.printf(Locale.ROOT, "%-14s %3d: %8.0f owner changes/s, p99 %7.1f ms, Jain %.3f, %d connections%n",
                            r.side(), n, r.ownerChangesPerSec(), r.p99Ms(), r.jain(), r.connections());
                    results.add(r);
                }
            }
        }
        String table = table(results, version);
        System.out.println(table);
        if (report != null) {
            Bench.write(Path.of(report), HEADING, table);
        }
    }

    /** One side at `n` contenders: JVMS worker JVMs of n/JVMS threads each, started together. */
    static Result run(TestServer s, String side, int n) throws Exception {
        s.redis().del("bench:owner");
        int base = s.connections();
        List<Process> procs = new ArrayList<>();
        List<BufferedReader> outs = new ArrayList<>();
        for (int j = 0; j < JVMS; j++) {
            Process p = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                    "-Xmx256m", "-Dbench.ms=" + RUN_MS, "-Dbench.warm.ms=" + WARM_MS,
                    "-cp", System.getProperty("java.class.path"), RegistryBench.class.getName(),
                    "worker", side, Integer.toString(s.port), Integer.toString(n / JVMS))
                    .redirectError(ProcessBuilder.Redirect.INHERIT).start();
            procs.add(p);
            outs.add(new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8)));
        }
        for (BufferedReader r : outs) {
            expect(r, "READY");
        }
        for (Process p : procs) {
            p.getOutputStream().write("GO\n".getBytes(StandardCharsets.UTF_8));
            p.getOutputStream().flush();
        }
        // Connections while every contender runs (after the warm-up).
        Thread.sleep(WARM_MS + RUN_MS / 2);
        int conns = s.connections() - base;
        List<Long> counts = new ArrayList<>();
        List<Long> waits = new ArrayList<>();
        long changes = 0;
        for (BufferedReader r : outs) {
            for (String line = r.readLine(); line != null; line = r.readLine()) {
                String[] f = line.split(" ");
                switch (f[0]) {
                    case "COUNT" -> counts.add(Long.parseLong(f[1]));
                    case "CHANGES" -> changes += Long.parseLong(f[1]);
                    case "WAITS" -> Arrays.stream(f).skip(1).forEach(w -> waits.add(Long.parseLong(w)));
                    default -> { }
                }
            }
        }
        for (Process p : procs) {
            if (!p.waitFor(60, TimeUnit.SECONDS)) {
                p.destroyForcibly();
            }
        }
        long[] xs = counts.stream().mapToLong(Long::longValue).toArray();
        long[] ws = waits.stream().mapToLong(Long::longValue).sorted().toArray();
        double p99 = ws.length == 0 ? 0 : ws[Math.min(ws.length - 1, (int) Math.ceil(ws.length * 0.99) - 1)] / 1e6;
        return new Result(side, n, changes * 1000.0 / RUN_MS, p99, jain(xs), conns);
    }

    static void expect(BufferedReader r, String what) throws Exception {
        for (String line = r.readLine(); line != null; line = r.readLine()) {
            if (line.equals(what)) {
                return;
            }
        }
        throw new IllegalStateException("a worker ended before " + what);
    }

    static double jain(long[] xs) {
        double sum = 0, sq = 0;
        for (long x : xs) {
            sum += x;
            sq += (double) x * x;
        }
        return sq == 0 ? 0 : sum * sum / (xs.length * sq);
    }

    // ---- a worker JVM ----------------------------------------------------------------------

    /**
     * `threads` contenders on one lock of `side`; each measured acquisition swaps its owner
     * into `bench:owner` (GETSET, inside the critical section), so an owner change is counted
     * where the lock really changed hands. Prints COUNT per thread, CHANGES and WAITS (ns).
     */
    static void worker(String side, int port, int threads) throws Exception {
        PrintStream out = System.out;
        System.setOut(new PrintStream(System.err, true, StandardCharsets.UTF_8));
        RedisConnectionFactory factory = Apps.factory(Apps.Driver.LETTUCE, port);
        RedisClient owners = RedisClient.create("redis://127.0.0.1:" + port);
        StatefulRedisConnection<String, String> ownerConn = owners.connect();
        AutoCloseable closer;
        java.util.function.Supplier<Lock> lockOf;
        switch (side) {
            case "rlock" -> {
                RlockClient c = RlockClient.create(new SpringTransport(factory), RlockOptions.defaults());
                RlockLockRegistry reg = new RlockLockRegistry(c, "bench");
                lockOf = () -> reg.obtain("rlock");
                closer = c;
            }
            case "spring-spin", "spring-pubsub" -> {
                RedisLockRegistry reg = new RedisLockRegistry(factory, "bench");
                reg.setRedisLockType(side.equals("spring-spin") ? RedisLockRegistry.RedisLockType.SPIN_LOCK
                        : RedisLockRegistry.RedisLockType.PUB_SUB_LOCK);
                lockOf = () -> reg.obtain(side);
                closer = reg::destroy;
            }
            case "redisson" -> {
                Config config = new Config();
                config.useSingleServer().setAddress("redis://127.0.0.1:" + port);
                RedissonClient r = Redisson.create(config);
                lockOf = () -> r.getLock("bench:redisson");
                closer = r::shutdown;
            }
            default -> throw new IllegalArgumentException("unknown side " + side);
        }
        String jvm = Long.toString(ProcessHandle.current().pid());
        long[] count = new long[threads];
        AtomicLong changes = new AtomicLong();
        List<long[]> waits = new ArrayList<>();
        long[] window = new long[2];
        List<Thread> ts = new ArrayList<>();
        java.util.concurrent.CountDownLatch go = new java.util.concurrent.CountDownLatch(1);
        // Every thread takes the lock a few times before READY: class loading, JIT and the
        // clients' connections happen before the coordinator says GO, not in the measurement.
        java.util.concurrent.CountDownLatch warmed = new java.util.concurrent.CountDownLatch(threads);
        for (int t = 0; t < threads; t++) {
            int me = t;
            long[] myWaits = new long[200_000];
            waits.add(myWaits);
            Thread th = new Thread(() -> {
                Lock lock = lockOf.get();
                String owner = jvm + ":" + me;
                int nw = 0;
                try {
                    for (int i = 0; i < 20; i++) {
                        lock.lock();
                        try {
                            ownerConn.sync().getset("bench:owner", owner);
                        } finally {
                            lock.unlock();
                        }
                    }
                    warmed.countDown();
                    go.await();
                    long warmEnd = window[0], end = window[1];
                    while (true) {
                        long t0 = System.nanoTime();
                        if (t0 >= end) {
                            break;
                        }
                        lock.lock();
                        try {
                            long got = System.nanoTime();
                            String prev = ownerConn.sync().getset("bench:owner", owner);
                            if (got >= warmEnd && got < end) {
                                count[me]++;
                                if (!owner.equals(prev)) {
                                    changes.incrementAndGet();
                                }
                                if (nw < myWaits.length) {
                                    myWaits[nw++] = got - t0;
                                }
                            }
                        } finally {
                            lock.unlock();
                        }
                    }
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                myWaits[myWaits.length - 1] = nw; // how many were recorded
            });
            th.start();
            ts.add(th);
        }
        warmed.await();
        out.println("READY");
        out.flush();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        expect(in, "GO");
        window[0] = System.nanoTime() + WARM_MS * 1_000_000;
        window[1] = window[0] + RUN_MS * 1_000_000;
        go.countDown();
        for (Thread th : ts) {
            th.join();
        }
        StringBuilder w = new StringBuilder("WAITS");
        for (long[] mw : waits) {
            int nw = (int) mw[mw.length - 1];
            for (int i = 0; i < nw && i < mw.length - 1; i++) {
                w.append(' ').append(mw[i]);
            }
        }
        for (long c : count) {
            out.println("COUNT " + c);
        }
        out.println("CHANGES " + changes.get());
        out.println(w);
        out.flush();
        closer.close();
        ownerConn.close();
        owners.shutdown();
        Apps.destroy(factory);
        System.exit(0);
    }

    static String table(List<Result> rs, String version) {
        StringBuilder b = new StringBuilder(HEADING).append("\n\n");
        b.append("One run on ").append(version).append(", ").append(JVMS).append(" worker JVMs on this machine's ")
                .append(Runtime.getRuntime().availableProcessors()).append(" cores, ").append(RUN_MS)
                .append(" ms measured after ").append(WARM_MS).append(" ms of warm-up; each contender takes the lock,"
                        + " swaps its name into a key (GETSET) and gives it back. rlock: RlockLockRegistry on"
                        + " SpringTransport; Spring: RedisLockRegistry (Spring Integration 7.0) in SPIN_LOCK"
                        + " and PUB_SUB_LOCK modes; Redisson: RLock with its defaults; all on Lettuce."
                        + " Connections: CLIENT LIST during the run, all JVMs together. With more JVMs than"
                        + " cores the figures measure the scheduler too: compare the sides, not the"
                        + " absolute numbers.\n\n");
        b.append("| contenders | registry | owner changes/s | p99 wait (ms) | Jain fairness | connections |\n");
        b.append("|---|---|---|---|---|---|\n");
        for (Result r : rs) {
            b.append(String.format(Locale.ROOT, "| %d | %s | %.0f | %.1f | %.3f | %d |%n", r.contenders(), r.side(),
                    r.ownerChangesPerSec(), r.p99Ms(), r.jain(), r.connections()));
        }
        return b.toString();
    }
}
