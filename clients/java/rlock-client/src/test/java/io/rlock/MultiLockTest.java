// MultiLock and RedLock (clients/java tests) against real module-loaded servers: a
// multi-lock holds all of its locks or none (a failed try leaves no part held), waits in
// the queues, and two multi-locks over overlapping sets in different orders both finish;
// a RedLock over three independent servers holds with a majority, within a validity below
// its lease, gives back a minority, survives one server stopped, and frees every server.
package io.rlock;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(60)
class MultiLockTest {
    static final List<TestServer> servers = new ArrayList<>();
    static final List<RlockClient> clients = new ArrayList<>();

    @BeforeAll
    static void start() {
        for (int i = 0; i < 3; i++) {
            TestServer s = new TestServer();
            servers.add(s);
            clients.add(RlockClient.create(s.uri(), RlockOptions.defaults()));
        }
    }

    @AfterAll
    static void stop() {
        clients.forEach(RlockClient::close);
        servers.forEach(TestServer::close);
    }

    static String name(String what) {
        return "java:multi:" + what + ":" + System.nanoTime();
    }

    static RlockClient rlock() {
        return clients.get(0);
    }

    @Test
    void a_multi_lock_holds_all_of_its_locks_or_none() throws Exception {
        String a = name("a"), b = name("b"), c = name("c");
        RlockMultiLock m = new RlockMultiLock(rlock().getLock(c), rlock().getLock(a), rlock().getLock(b));
        assertEquals(List.of(a, b, c), m.getLocks().stream().map(RlockLock::getName).toList(), "taken in name order");
        assertTrue(m.tryLockAsync(0, -1, TimeUnit.SECONDS, 1).get());
        for (String n : List.of(a, b, c)) {
            assertTrue(rlock().getLock(n).isHeldByThread(1));
        }
        // Another owner: its first part is taken, so it gets nothing.
        assertFalse(m.tryLockAsync(0, -1, TimeUnit.SECONDS, 2).get());
        m.unlockAsync(1).get();
        for (String n : List.of(a, b, c)) {
            assertFalse(rlock().getLock(n).isLocked(), n + " released");
        }

        // The last part held elsewhere: the first two are given back after the wait.
        RlockLock last = rlock().getLock(c);
        assertTrue(last.tryLockAsync(9).get());
        long t0 = System.nanoTime();
        assertFalse(m.tryLockAsync(200, -1, TimeUnit.MILLISECONDS, 3).get());
        long ms = (System.nanoTime() - t0) / 1_000_000;
        assertTrue(ms >= 150 && ms < 5000, "waited " + ms + " ms in all");
        TestServer.waitUntil(Duration.ofSeconds(5), "the parts given back",
                () -> !rlock().getLock(a).isLocked() && !rlock().getLock(b).isLocked());
        // It waits in the queue of the part that is held, and gets all once it is freed.
        CompletableFuture<Boolean> w = m.tryLockAsync(10, 30, TimeUnit.SECONDS, 4);
        TestServer.waitUntil(Duration.ofSeconds(5), "queued on the held part",
                () -> "1".equals(servers.get(0).info("rlock", "rlock_waiters")));
        last.unlockAsync(9).get();
        assertTrue(w.get(5, TimeUnit.SECONDS));
        assertTrue(rlock().getLock(c).remainTimeToLive() > 20_000, "the lease was given");
        m.unlockAsync(4).get();
        assertThrows(IllegalMonitorStateException.class, () -> Sync.join(m.unlockAsync(4)), "nothing held any more");
    }

    @Test
    void multi_locks_over_overlapping_sets_in_any_order_do_not_deadlock() throws Exception {
        String a = name("x"), b = name("y");
        RlockMultiLock ab = new RlockMultiLock(rlock().getLock(a), clients.get(1).getLock(b));
        RlockMultiLock ba = new RlockMultiLock(clients.get(1).getLock(b), rlock().getLock(a));
        List<CompletableFuture<Void>> done = new ArrayList<>();
        for (int i = 0; i < 4; i++) {
            RlockMultiLock m = i % 2 == 0 ? ab : ba;
            long tid = 100 + i;
            done.add(m.lockAsync(-1, TimeUnit.MILLISECONDS, tid).thenCompose(v -> m.unlockAsync(tid)));
        }
        CompletableFuture.allOf(done.toArray(CompletableFuture[]::new)).get(30, TimeUnit.SECONDS);
        assertFalse(rlock().getLock(a).isLocked());
        assertFalse(clients.get(1).getLock(b).isLocked());
    }

    RlockRedLock redLock(String name) {
        List<RlockLock> parts = new ArrayList<>();
        for (RlockClient c : clients) {
            parts.add(c.getLock(name));
        }
        return new RlockRedLock(parts);
    }

    @Test
    void validity_is_the_lease_less_the_time_taken_and_the_drift() {
        Duration lease = Duration.ofSeconds(10);
        assertEquals(Duration.ofMillis(102), RlockRedLock.drift(lease));
        assertEquals(Duration.ofMillis(9800), RlockRedLock.validity(lease, Duration.ofMillis(98)));
        assertEquals(Duration.ZERO, RlockRedLock.validity(lease, Duration.ofMillis(9898)));
    }

    @Test
    void a_red_lock_holds_with_a_majority_and_gives_back_a_minority() throws Exception {
        String name = name("red");
        RlockRedLock red = redLock(name);
        assertEquals(2, red.quorum());
        // One server's lock is held by someone else: two of three is a majority.
        assertTrue(clients.get(2).getLock(name).tryLockAsync(9).get());
        assertTrue(red.tryLockAsync(0, 10, TimeUnit.SECONDS, 1).get());
        Duration v = red.getValidity(1);
        assertTrue(v.compareTo(Duration.ZERO) > 0 && v.compareTo(Duration.ofMillis(9898)) <= 0, "validity " + v);
        assertTrue(clients.get(0).getLock(name).isHeldByThread(1) && clients.get(1).getLock(name).isHeldByThread(1));
        assertTrue(red.unlockAsync(1).get(), "a quorum was held");
        assertFalse(clients.get(0).getLock(name).isLocked());
        assertFalse(clients.get(1).getLock(name).isLocked());
        assertEquals(Duration.ZERO, red.getValidity(1));

        // Two held elsewhere: a minority, given back.
        assertTrue(clients.get(1).getLock(name).tryLockAsync(9).get());
        assertFalse(red.tryLockAsync(100, 10_000, TimeUnit.MILLISECONDS, 2).get());
        TestServer.waitUntil(Duration.ofSeconds(5), "the minority given back", () -> !clients.get(0).getLock(name).isLocked());
        clients.get(1).getLock(name).unlockAsync(9).get();
        clients.get(2).getLock(name).unlockAsync(9).get();
    }

    @Test
    void a_red_lock_holds_with_one_server_stopped() throws Exception {
        String name = name("red-down");
        try (RlockClient quick = RlockClient.create(servers.get(2).uri(), RlockOptions.defaults().withRetryAttempts(1))) {
            List<RlockLock> parts = List.of(clients.get(0).getLock(name), clients.get(1).getLock(name), quick.getLock(name));
            RlockRedLock red = new RlockRedLock(parts);
            quick.getLock(name).isLocked(); // connected before the server stops
            servers.get(2).signal("STOP");
            try {
                // The stopped server never answers: after the server timeout (250 ms) the
                // two live ones are the majority.
                long t0 = System.nanoTime();
                assertTrue(red.tryLockAsync(0, 5, TimeUnit.SECONDS, 1).get(10, TimeUnit.SECONDS));
                long ms = (System.nanoTime() - t0) / 1_000_000;
                assertTrue(ms < 5000, "held after " + ms + " ms");
                assertTrue(red.getValidity(1).toMillis() > 4000, "validity " + red.getValidity(1));
            } finally {
                servers.get(2).signal("CONT");
            }
            // Its grant, answered once the server runs again, came too late: given back.
            TestServer.waitUntil(Duration.ofSeconds(10), "the late grant given back",
                    () -> servers.get(2).redis().exists(name) == 0 && clients.get(1).getLock(name).isLocked());
            red.unlockAsync(1).get();
            assertFalse(clients.get(0).getLock(name).isLocked());
        }
    }
}
