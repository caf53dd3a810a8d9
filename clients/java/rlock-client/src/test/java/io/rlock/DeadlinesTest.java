// A timed ticket wait ends by the caller's own deadline (clients/java tests; Waits, design.md
// 5), not when a frozen server's `timeout` message and the collect after it come back: the
// server is frozen with DEBUG SLEEP (TestServer allows debug commands) from a connection of
// the test's own while a tryLock waits behind a holder. A grant the frozen server makes
// after the deadline is collected and given back, never kept by a caller told no.
package io.rlock;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(60)
class DeadlinesTest {
    /** The caller's wait. */
    static final long WAIT_MS = 400;
    /**
     * How long after its deadline a wait may return: time to get a CPU on a loaded machine
     * (the Go client's test saw 87 ms at a load of 10 on 2 cores); a wait that ends with the
     * frozen server's answer returns FROZEN_S after its start.
     */
    static final long LATE_MS = 250;
    /** How long the server stays frozen: far longer than the wait. */
    static final double FROZEN_S = 1.5;

    /** A connection of the test's own, speaking RESP by hand (a frozen server's replies wait). */
    static final class Raw implements AutoCloseable {
        final Socket socket;
        final OutputStream out;
        final BufferedReader in;

        Raw(TestServer s) throws IOException {
            socket = new Socket("127.0.0.1", s.port);
            out = socket.getOutputStream();
            in = new BufferedReader(new InputStreamReader(socket.getInputStream(), StandardCharsets.UTF_8));
        }

        void send(String... args) throws IOException {
            StringBuilder b = new StringBuilder("*").append(args.length).append("\r\n");
            for (String a : args) {
                b.append('$').append(a.getBytes(StandardCharsets.UTF_8).length).append("\r\n").append(a).append("\r\n");
            }
            out.write(b.toString().getBytes(StandardCharsets.UTF_8));
            out.flush();
        }

        /** The first line of the next reply (simple replies only). */
        String line() throws IOException {
            return in.readLine();
        }

        @Override
        public void close() throws IOException {
            socket.close();
        }
    }

    /** A tryLock's outcome and how long it took. */
    record Outcome(boolean held, long ms) {}

    /**
     * The client's probe and notification connection made beforehand (a timed wait on a
     * free lock), so that the measured wait is the ticket's alone.
     */
    static void warm(RlockClient c, String name) throws InterruptedException {
        RlockLock warm = c.getLock(name + ":warm");
        assertTrue(warm.tryLock(10, TimeUnit.SECONDS));
        warm.unlock();
    }

    /** tryLock(WAIT_MS) on a thread of its own, its start written to `started` (System.nanoTime). */
    static CompletableFuture<Outcome> tryLockOnAThread(RlockLock lock, AtomicLong started) {
        CompletableFuture<Outcome> out = new CompletableFuture<>();
        Thread t = new Thread(() -> {
            long t0 = System.nanoTime();
            started.set(t0);
            try {
                boolean held = lock.tryLock(WAIT_MS, TimeUnit.MILLISECONDS);
                out.complete(new Outcome(held, (System.nanoTime() - t0) / 1_000_000));
                if (held) {
                    lock.unlock();
                }
            } catch (Throwable e) {
                out.completeExceptionally(e);
            }
        });
        t.setDaemon(true);
        t.start();
        return out;
    }

    /** Freezes the server (DEBUG SLEEP) once the waiter's ticket is queued; completes when it wakes. */
    static CompletableFuture<String> freezeOnceQueued(TestServer s, Raw raw) throws IOException {
        TestServer.waitUntil(Duration.ofSeconds(10), "the ticket queued", () -> ReconnectTest.waiters(s) == 1);
        raw.send("DEBUG", "SLEEP", Double.toString(FROZEN_S));
        return CompletableFuture.supplyAsync(() -> {
            try {
                return raw.line();
            } catch (IOException e) {
                throw new java.io.UncheckedIOException(e);
            }
        });
    }

    /** Nothing left behind: no waiter registered in the client or queued in the server. */
    static void nothingLeft(TestServer s, RlockClient c) {
        TestServer.waitUntil(Duration.ofSeconds(10), "no waiter left", () -> c.waits().registered() == 0
                && ReconnectTest.waiters(s) == 0);
    }

    @Test
    void a_timed_wait_on_a_frozen_server_ends_by_its_deadline() throws Exception {
        try (TestServer s = new TestServer();
             RlockClient c = RlockClient.create(s.uri(), RlockOptions.defaults());
             Raw raw = new Raw(s)) {
            String name = "java:deadline:frozen:" + System.nanoTime();
            assertNull(s.call("RLOCK.ACQUIRE", name, "outside", "30000"));
            warm(c, name);
            CompletableFuture<Outcome> run = tryLockOnAThread(c.getLock(name), new AtomicLong());
            CompletableFuture<String> awake = freezeOnceQueued(s, raw);
            Outcome o = run.get(10, TimeUnit.SECONDS);
            System.out.printf("frozen server: tryLock(%d ms) returned %s after %d ms%n", WAIT_MS, o.held(), o.ms());
            assertFalse(o.held(), "not held: the lock is outside's");
            assertTrue(o.ms() >= WAIT_MS, "never before the deadline: " + o.ms() + " ms");
            assertTrue(o.ms() < WAIT_MS + LATE_MS, "by the deadline, not after the freeze: " + o.ms() + " ms");
            assertEquals("+OK", awake.get(10, TimeUnit.SECONDS));
            nothingLeft(s, c);
            assertEquals(Map.of("outside", "1"), s.redis().hgetall(name));
        }
    }

    @Test
    void a_grant_made_after_the_deadline_is_given_back_by_the_caller_told_no() throws Exception {
        try (TestServer s = new TestServer();
             RlockClient c = RlockClient.create(s.uri(), RlockOptions.defaults());
             Raw raw = new Raw(s);
             Raw releaser = new Raw(s)) {
            String name = "java:deadline:late-grant:" + System.nanoTime();
            assertNull(s.call("RLOCK.ACQUIRE", name, "outside", "30000"));
            warm(c, name);
            AtomicLong started = new AtomicLong();
            CompletableFuture<Outcome> run = tryLockOnAThread(c.getLock(name), started);
            CompletableFuture<String> awake = freezeOnceQueued(s, raw);
            // The release goes out after the waiter's deadline while the server is still
            // frozen: when it wakes, the release may grant the lock to the waiter's ticket
            // before its timer ends it.
            long sendAt = started.get() + (WAIT_MS + 100) * 1_000_000;
            long pause = sendAt - System.nanoTime();
            if (pause > 0) {
                Thread.sleep(pause / 1_000_000, (int) (pause % 1_000_000));
            }
            releaser.send("RLOCK.RELEASE", name, "outside");
            Outcome o = run.get(10, TimeUnit.SECONDS);
            System.out.printf("frozen server, released after the deadline: tryLock(%d ms) returned %s after %d ms%n",
                    WAIT_MS, o.held(), o.ms());
            assertFalse(o.held(), "the caller was told no");
            assertTrue(o.ms() < WAIT_MS + LATE_MS, "by the deadline, not after the freeze: " + o.ms() + " ms");
            assertEquals("+OK", awake.get(10, TimeUnit.SECONDS));
            assertEquals(":1", releaser.line(), "outside's release");
            // Granted to the waiter's ticket or not, the lock ends free: a late grant is
            // collected and given back.
            TestServer.waitUntil(Duration.ofSeconds(10), "the lock free", () -> s.redis().exists(name) == 0);
            nothingLeft(s, c);
        }
    }
}
