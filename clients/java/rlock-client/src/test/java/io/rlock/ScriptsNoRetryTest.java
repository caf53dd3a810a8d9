// Scripts mode never applies a script that must not run twice twice (clients/java, issue
// 39; docs/scripts-mode.md, "Retries"): through a proxy that closes the connection after the
// server ran the armed script and before its reply reaches the client, a semaphore release
// and a latch countDown change the server exactly once and fail with
// RlockOutcomeUnknownException (Lettuce would otherwise write them again after its
// reconnect, and Wire would retry them); a connection lost before the write is sent once
// after the reconnect. Self-contained: a server of its own without the module.
package io.rlock;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import io.lettuce.core.RedisURI;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.atomic.AtomicInteger;

class ScriptsNoRetryTest {
    static TestServer server;
    static LossyProxy proxy;

    @BeforeAll
    static void start() throws IOException {
        server = TestServer.withoutModule();
        proxy = new LossyProxy(server.uri().getPort());
    }

    @AfterAll
    static void stop() {
        proxy.close();
        server.close();
    }

    static RlockClient client() {
        return RlockClient.create(RedisURI.create("127.0.0.1", proxy.port()),
                RlockOptions.defaults().withMode(RlockOptions.Mode.SCRIPTS));
    }

    static String name(String what) {
        return "java:noretry:" + what + ":" + System.nanoTime();
    }

    @Test
    void a_lost_release_reply_adds_the_permits_once_and_says_the_outcome_is_unknown() {
        String n = name("sem");
        try (RlockClient c = client()) {
            RlockSemaphore sem = c.getSemaphore(n);
            sem.trySetPermits(3);
            assertEquals(true, sem.tryAcquire(1));
            proxy.arm("semaphore_release");
            assertThrows(RlockOutcomeUnknownException.class, () -> sem.release(1));
            assertEquals(1, proxy.runs.get(), "sent once");
            assertEquals("3", server.call("GET", n), "no permit beyond the count");
            assertEquals(3, sem.availablePermits()); // the client goes on after its reconnect
            proxy.arm("semaphore_add");
            assertThrows(RlockOutcomeUnknownException.class, () -> sem.addPermits(2));
            assertEquals("5", server.call("GET", n));
        }
    }

    @Test
    void a_lost_count_down_reply_counts_once() {
        String n = name("latch");
        try (RlockClient c = client()) {
            RlockCountDownLatch latch = c.getCountDownLatch(n);
            latch.trySetCount(2);
            proxy.arm("latch_count_down");
            assertThrows(RlockOutcomeUnknownException.class, latch::countDown);
            assertEquals(1, proxy.runs.get());
            assertEquals("1", server.call("GET", n), "one count down, not two");
            assertEquals(1, latch.getCount());
        }
    }

    @Test
    void a_connection_lost_before_the_write_is_sent_once_after_the_reconnect() throws Exception {
        String n = name("before");
        LettuceTransport t = new LettuceTransport(
                io.lettuce.core.RedisClient.create(RedisURI.create("127.0.0.1", proxy.port())), true, null);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults().withMode(RlockOptions.Mode.SCRIPTS))) {
            RlockSemaphore sem = c.getSemaphore(n);
            sem.trySetPermits(0);
            proxy.pause();
            proxy.cutAll();
            TestServer.waitUntil(Duration.ofSeconds(5), "the client disconnected", () -> !t.connection().isOpen());
            CompletableFuture<Void> release = sem.releaseAsync(1); // held by Lettuce: not written
            proxy.resume();
            release.get(10, TimeUnit.SECONDS);
            assertEquals("1", server.call("GET", n));
        }
    }

    /**
     * A TCP proxy to the server that, once armed with a script, closes the client's
     * connection after the server answered that script's EVALSHA or EVAL (the server ran
     * it; its reply is lost). A NOSCRIPT answer is passed on and the arm kept for the EVAL.
     */
    static final class LossyProxy implements AutoCloseable {
        final ServerSocket listener;
        final int target;
        volatile boolean paused;
        final AtomicInteger runs = new AtomicInteger();
        final List<Socket> sockets = new CopyOnWriteArrayList<>();
        volatile String[] armed;
        final int port;

        LossyProxy(int target) throws IOException {
            this.target = target;
            // One listener for the proxy's life: closing it and binding the port again races
            // with anything else on the machine that takes the freed port (a client's own
            // reconnect can even connect to itself on it).
            listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
            port = listener.getLocalPort();
            Thread t = new Thread(() -> accept(listener), "lossy-proxy");
            t.setDaemon(true);
            t.start();
        }

        /**
         * Until {@link #resume}, closes every new connection before it reaches the server:
         * the client's handshake fails, so nothing it holds back is written.
         */
        void pause() {
            paused = true;
        }

        void resume() {
            paused = false;
        }

        int port() {
            return port;
        }

        void arm(String script) {
            Scripts.Script s = Scripts.script(script);
            runs.set(0);
            String text = s.text();
            armed = new String[] {s.sha(), text.substring(0, Math.min(60, text.length()))};
        }

        void cutAll() {
            for (Socket s : sockets) {
                try {
                    s.close();
                } catch (IOException ignored) {
                    // closing
                }
            }
        }

        private void accept(ServerSocket l) {
            while (!l.isClosed()) {
                try {
                    Socket client = l.accept();
                    if (paused) {
                        client.close();
                        continue;
                    }
                    Socket upstream = new Socket(InetAddress.getLoopbackAddress(), target);
                    sockets.add(client);
                    sockets.add(upstream);
                    java.util.concurrent.atomic.AtomicBoolean watching = new java.util.concurrent.atomic.AtomicBoolean();
                    pump(client, upstream, chunk -> {
                        String[] a = armed;
                        if (a != null && (chunk.contains(a[0]) || chunk.contains(a[1]))) {
                            watching.set(true);
                        }
                        return true;
                    });
                    pump(upstream, client, chunk -> {
                        if (!watching.getAndSet(false)) {
                            return true;
                        }
                        if (chunk.startsWith("-")) {
                            return true; // NOSCRIPT: not run; the EVAL follows
                        }
                        armed = null;
                        runs.incrementAndGet();
                        return false; // the reply is lost with the connection
                    });
                } catch (IOException e) {
                    if (l.isClosed()) {
                        return;
                    }
                    // one connection failed; keep serving the next
                }
            }
        }

        interface Filter {
            /** False: drop this chunk and close both sides. */
            boolean pass(String chunk);
        }

        private void pump(Socket from, Socket to, Filter filter) {
            Thread t = new Thread(() -> {
                byte[] buf = new byte[65536];
                try (InputStream in = from.getInputStream(); OutputStream out = to.getOutputStream()) {
                    int n;
                    while ((n = in.read(buf)) > 0) {
                        if (!filter.pass(new String(buf, 0, n, StandardCharsets.ISO_8859_1))) {
                            break;
                        }
                        out.write(buf, 0, n);
                        out.flush();
                    }
                } catch (IOException ignored) {
                    // one side closed
                } finally {
                    try {
                        from.close();
                        to.close();
                    } catch (IOException ignored) {
                        // closing
                    }
                }
            }, "lossy-proxy-pump");
            t.setDaemon(true);
            t.start();
        }

        @Override
        public void close() {
            try {
                listener.close();
            } catch (IOException ignored) {
                // closing
            }
            cutAll();
        }
    }
}
