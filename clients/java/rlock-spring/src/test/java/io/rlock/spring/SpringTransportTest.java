// Tests of the client on a Spring RedisConnectionFactory (rlock-spring's SpringTransport),
// with each driver, against a real module-loaded server: every reply shape, server errors as
// the client's errors, waits on queued tickets first come first served holding no blocked
// connection, a ticket connection killed under a waiter, and the blocking fallback.
package io.rlock.spring;

import io.rlock.RlockClient;
import io.rlock.RlockLock;
import io.rlock.RlockOptions;
import io.rlock.RlockSemaphore;
import io.rlock.TestServer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import org.springframework.data.redis.connection.RedisConnectionFactory;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(60)
class SpringTransportTest {
    static TestServer server;

    @BeforeAll
    static void start() {
        server = new TestServer();
    }

    @AfterAll
    static void stop() {
        server.close();
    }

    static String key(String what) {
        return "spring:transport:" + what + ":" + System.nanoTime();
    }

    long serverInfo(String field) {
        return Long.parseLong(server.info("rlock", field));
    }

    interface Body {
        void run(RlockClient rlock) throws Exception;
    }

    static void withClient(Apps.Driver driver, RlockOptions options, Body body) throws Exception {
        RedisConnectionFactory f = Apps.factory(driver, server.port);
        try (RlockClient rlock = RlockClient.create(new SpringTransport(f), options)) {
            body.run(rlock);
        } finally {
            Apps.destroy(f);
        }
    }

    @ParameterizedTest
    @EnumSource(Apps.Driver.class)
    void replies_and_errors_read_as_with_lettuce(Apps.Driver driver) throws Exception {
        RedisConnectionFactory f = Apps.factory(driver, server.port);
        try (SpringTransport t = new SpringTransport(f)) {
            String k = key("replies");
            assertNull(t.send(List.of("RLOCK.ACQUIRE", k, "a", "10000")).get(5, TimeUnit.SECONDS));
            assertInstanceOf(Long.class, t.send(List.of("RLOCK.ACQUIRE", k, "b", "10000")).get(5, TimeUnit.SECONDS));
            assertEquals("QUEUED", t.send(List.of("RLOCK.ACQUIRE", k, "b", "10000", "WAIT", "1000", "ASYNC", "ID", "x"))
                    .get(5, TimeUnit.SECONDS));
            List<?> fenced = (List<?>) t.send(List.of("RFENCED.ACQUIRE", k + "f", "a", "10000")).get(5, TimeUnit.SECONDS);
            assertNull(fenced.get(0));
            assertInstanceOf(Long.class, fenced.get(1));
            assertEquals("PONG", t.send(List.of("PING")).get(5, TimeUnit.SECONDS));
            server.redis().set(k + "s", "not a lock");
            Exception e = assertThrows(Exception.class,
                    () -> t.send(List.of("RLOCK.ACQUIRE", k + "s", "a", "10000")).get(5, TimeUnit.SECONDS));
            assertInstanceOf(io.lettuce.core.RedisCommandExecutionException.class, e.getCause());
            assertTrue(e.getCause().getMessage().startsWith("WRONGTYPE"), e.getCause().getMessage());
        } finally {
            Apps.destroy(f);
        }
    }

    @ParameterizedTest
    @EnumSource(Apps.Driver.class)
    void bytes_that_are_not_text_go_out_as_they_are(Apps.Driver driver) throws Exception {
        // Scripts mode sends Redisson's raw permit ids this way; as UTF-8 text they would not survive.
        RedisConnectionFactory f = Apps.factory(driver, server.port);
        try (SpringTransport t = new SpringTransport(f)) {
            String k = key("bytes");
            byte[] raw = {(byte) 0xff, 0x00, (byte) 0x80, 0x41};
            assertEquals("OK", t.sendBytes(List.of("SET".getBytes(), k.getBytes(), raw)).get(5, TimeUnit.SECONDS));
            assertEquals(4L, t.send(List.of("STRLEN", k)).get(5, TimeUnit.SECONDS));
            // 0xff, 0x00, 0x80 and 'A' (0x41): 8 + 0 + 1 + 2 bits set.
            assertEquals(11L, t.send(List.of("BITCOUNT", k)).get(5, TimeUnit.SECONDS));
        } finally {
            Apps.destroy(f);
        }
    }

    @ParameterizedTest
    @EnumSource(Apps.Driver.class)
    void waiters_queue_tickets_first_come_first_served_without_blocked_connections(Apps.Driver driver) throws Exception {
        withClient(driver, RlockOptions.defaults(), rlock -> {
            RlockLock lock = rlock.getLock(key("fifo"));
            lock.lock();
            int before = server.connections();
            List<Integer> order = Collections.synchronizedList(new ArrayList<>());
            List<Thread> threads = new ArrayList<>();
            for (int i = 0; i < 6; i++) {
                int n = i;
                Thread t = new Thread(() -> {
                    lock.lock();
                    order.add(n);
                    lock.unlock();
                });
                t.setDaemon(true);
                t.start();
                threads.add(t);
                long want = i + 1;
                TestServer.waitUntil(Duration.ofSeconds(10), "waiter queued", () -> serverInfo("rlock_waiters") >= want);
            }
            assertEquals("0", server.info("clients", "blocked_clients"), "tickets block no connection");
            assertTrue(server.connections() <= before + 2, "a ticket and a notification connection at most");
            lock.unlock();
            for (Thread t : threads) {
                t.join(20_000);
            }
            assertEquals(List.of(0, 1, 2, 3, 4, 5), order);
            assertTrue(rlock.stats().waits() >= 6, rlock.stats().toString());
        });
    }

    @ParameterizedTest
    @EnumSource(Apps.Driver.class)
    void a_waiter_whose_ticket_connection_was_killed_is_served_all_the_same(Apps.Driver driver) throws Exception {
        withClient(driver, RlockOptions.defaults(), rlock -> {
            RlockSemaphore sem = rlock.getSemaphore(key("killed"));
            // No permits yet: the acquire waits.
            CompletableFuture<Boolean> got = sem.tryAcquireAsync(1, 30, TimeUnit.SECONDS);
            TestServer.waitUntil(Duration.ofSeconds(10), "waiter queued", () -> serverInfo("rlock_waiters") == 1);
            // Every connection but the test's own: the ticket dies with its connection.
            server.call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes");
            TestServer.waitUntil(Duration.ofSeconds(10), "the ticket dropped", () -> serverInfo("rlock_waiters") == 0);
            // Queued again by the client (the transport saw its connection change).
            TestServer.waitUntil(Duration.ofSeconds(15), "the waiter queued again", () -> serverInfo("rlock_waiters") == 1);
            server.call("RSEMAPHORE.RELEASE", sem.getName(), "1");
            assertTrue(got.get(20, TimeUnit.SECONDS));
        });
    }

    @ParameterizedTest
    @EnumSource(Apps.Driver.class)
    void the_blocking_fallback_waits_on_a_connection_of_its_own_and_a_cancel_leaves_nothing(Apps.Driver driver)
            throws Exception {
        withClient(driver, RlockOptions.defaults().withWaitMode(RlockOptions.WaitMode.BLOCKING), rlock -> {
            RlockLock lock = rlock.getLock(key("blocking"));
            lock.lock();
            CompletableFuture<Boolean> waiter = lock.tryLockAsync(30, -1, TimeUnit.SECONDS, 4242);
            TestServer.waitUntil(Duration.ofSeconds(10), "a blocked client", () ->
                    "1".equals(server.info("clients", "blocked_clients")));
            waiter.cancel(true);
            TestServer.waitUntil(Duration.ofSeconds(10), "the blocked client gone", () ->
                    "0".equals(server.info("clients", "blocked_clients")) && serverInfo("rlock_waiters") == 0);
            CompletableFuture<Boolean> second = lock.tryLockAsync(30, -1, TimeUnit.SECONDS, 4343);
            TestServer.waitUntil(Duration.ofSeconds(10), "a blocked client", () ->
                    "1".equals(server.info("clients", "blocked_clients")));
            lock.unlock();
            assertTrue(second.get(20, TimeUnit.SECONDS));
            lock.unlockAsync(4343).get(5, TimeUnit.SECONDS);
            assertEquals(0, server.redis().exists(lock.getName()));
        });
    }
}
