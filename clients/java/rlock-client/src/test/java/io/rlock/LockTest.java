// Tests of the rlock Java client's lock (clients/java) against a real module-loaded
// server: JDK conventions, re-entry, FIFO waiting on queued tickets, the watchdog and the
// lost-lock signal, cancelled waits leaving nothing behind, constant connections, the
// async twins, the blocking fallback and riding on an application's Lettuce client.
package io.rlock;

import io.lettuce.core.RedisClient;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.locks.Lock;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(60)
class LockTest {
    static TestServer server;
    static RlockClient rlock;

    @BeforeAll
    static void start() {
        server = new TestServer();
        rlock = RlockClient.create(server.uri(), RlockOptions.defaults());
    }

    @AfterAll
    static void stop() {
        rlock.close();
        server.close();
    }

    static String key(String what) {
        return "java:lock:" + what + ":" + System.nanoTime();
    }

    /** Runs `r` on a new thread and returns it started. */
    static Thread spawn(Runnable r) {
        Thread t = new Thread(r);
        t.setDaemon(true);
        t.start();
        return t;
    }

    long serverWaiters() {
        return Long.parseLong(server.info("rlock", "rlock_waiters"));
    }

    @Test
    void it_is_reentrant_per_thread_and_exclusive_between_threads() throws Exception {
        RlockLock lock = rlock.getLock(key("reentry"));
        lock.lock();
        lock.lock();
        assertEquals(2, lock.getHoldCount());
        assertTrue(lock.isHeldByCurrentThread());
        AtomicReference<Boolean> other = new AtomicReference<>();
        Thread t = spawn(() -> other.set(lock.tryLock()));
        t.join();
        assertFalse(other.get(), "another thread is another owner");
        lock.unlock();
        assertTrue(lock.isLocked(), "one hold left");
        lock.unlock();
        assertFalse(lock.isLocked());
        assertEquals(0, lock.getHoldCount());
    }

    @Test
    void it_throws_illegal_monitor_state_on_unlock_by_a_non_holder() throws Exception {
        RlockLock lock = rlock.getLock(key("ims"));
        assertThrows(IllegalMonitorStateException.class, lock::unlock);
        lock.lock();
        AtomicReference<Throwable> err = new AtomicReference<>();
        spawn(() -> {
            try {
                lock.unlock();
            } catch (Throwable e) {
                err.set(e);
            }
        }).join();
        assertInstanceOf(IllegalMonitorStateException.class, err.get());
        lock.unlock();
    }

    @Test
    void it_refuses_new_condition_and_says_why() {
        Lock lock = rlock.getLock(key("cond"));
        UnsupportedOperationException e = assertThrows(UnsupportedOperationException.class, lock::newCondition);
        assertTrue(e.getMessage().contains("wait-set"), e.getMessage());
    }

    @Test
    void it_rejects_bad_arguments_with_a_clear_error() {
        assertThrows(IllegalArgumentException.class, () -> rlock.getLock(""));
        RlockLock lock = rlock.getLock(key("bad"));
        assertThrows(IllegalArgumentException.class, () -> lock.lock(0, TimeUnit.SECONDS));
        server.redis().set(lock.getName(), "not a lock");
        RuntimeException e = assertThrows(RuntimeException.class, lock::tryLock);
        assertTrue(e.getMessage().startsWith("WRONGTYPE"), e.getMessage());
    }

    @Test
    void waiters_are_served_first_come_first_served() throws Exception {
        RlockLock lock = rlock.getLock(key("fifo"));
        lock.lock();
        List<Integer> order = Collections.synchronizedList(new ArrayList<>());
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < 8; i++) {
            int n = i;
            threads.add(spawn(() -> {
                lock.lock();
                order.add(n);
                lock.unlock();
            }));
            // Each waiter is queued before the next starts: arrival order is known.
            long want = i + 1;
            TestServer.waitUntil(Duration.ofSeconds(5), "waiter queued", () -> serverWaiters() >= want);
        }
        lock.unlock();
        for (Thread t : threads) {
            t.join();
        }
        assertEquals(List.of(0, 1, 2, 3, 4, 5, 6, 7), order);
    }

    @Test
    void try_lock_with_a_wait_is_served_by_a_handoff_or_times_out_leaving_no_ticket() throws Exception {
        RlockLock lock = rlock.getLock(key("trylock"));
        lock.lock();
        AtomicReference<Boolean> got = new AtomicReference<>();
        long t0 = System.nanoTime();
        spawn(() -> {
            try {
                got.set(lock.tryLock(200, TimeUnit.MILLISECONDS));
            } catch (InterruptedException e) {
                throw new RuntimeException(e);
            }
        }).join();
        long ms = (System.nanoTime() - t0) / 1_000_000;
        assertFalse(got.get());
        assertTrue(ms >= 190 && ms < 2000, "waited " + ms + " ms");
        // The server's own deadline may come a little after the client's (it counts from
        // when the command arrived): the ticket left queued times out there a moment later,
        // and its message ends the client's registration.
        TestServer.waitUntil(Duration.ofSeconds(5), "a timed-out wait leaves no ticket in the server",
                () -> serverWaiters() == 0);
        TestServer.waitUntil(Duration.ofSeconds(5), "nor a registration in the client",
                () -> rlock.registeredWaiters() == 0);
        Thread t = spawn(() -> {
            try {
                got.set(lock.tryLock(10, TimeUnit.SECONDS));
                lock.unlock();
            } catch (InterruptedException e) {
                throw new RuntimeException(e);
            }
        });
        TestServer.waitUntil(Duration.ofSeconds(5), "waiter queued", () -> serverWaiters() == 1);
        lock.unlock();
        t.join();
        assertTrue(got.get());
    }

    @Test
    void an_interrupted_wait_leaves_no_ticket_or_grant_behind() throws Exception {
        RlockLock lock = rlock.getLock(key("interrupt"));
        lock.lock();
        AtomicReference<Throwable> err = new AtomicReference<>();
        Thread t = spawn(() -> {
            try {
                lock.lockInterruptibly();
                err.set(new AssertionError("acquired"));
            } catch (Throwable e) {
                err.set(e);
            }
        });
        TestServer.waitUntil(Duration.ofSeconds(5), "waiter queued", () -> serverWaiters() == 1);
        t.interrupt();
        t.join();
        assertInstanceOf(InterruptedException.class, err.get());
        // The holder leaves: the abandoned ticket is granted, collected and given back by
        // the client, so the lock ends up free and nobody is registered.
        lock.unlock();
        TestServer.waitUntil(Duration.ofSeconds(5), "the abandoned grant given back",
                () -> server.redis().exists(lock.getName()) == 0 && rlock.registeredWaiters() == 0);
        assertEquals(0, serverWaiters());
        assertTrue(lock.tryLock());
        lock.unlock();
    }

    @Test
    void the_watchdog_keeps_a_lock_past_its_lease_and_reports_a_lost_one() throws Exception {
        // A lease long enough that a loaded machine's scheduling pauses do not end it between
        // two renewals; the test waits for the server to see renewals past the first lease's
        // end rather than sleeping a fixed time.
        Duration lease = Duration.ofMillis(1500);
        try (RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults()
                .withWatchdogTimeout(lease))) {
            RlockLock lock = c.getLock(key("watchdog"));
            List<String> lost = Collections.synchronizedList(new ArrayList<>());
            lock.addLostListener((name, owner, why) -> lost.add(owner));
            long renewals = renewCalls(server);
            long firstLeaseEnd = System.nanoTime() + lease.toNanos();
            lock.lock();
            long pttl = lock.remainTimeToLive();
            assertTrue(pttl > 0 && pttl <= lease.toMillis(), "lease is the watchdog timeout: " + pttl);
            // The work outlasts the first lease, renewed meanwhile.
            TestServer.waitUntil(Duration.ofSeconds(30), "renewals past the first lease's end",
                    () -> System.nanoTime() > firstLeaseEnd && renewCalls(server) >= renewals + 4);
            assertTrue(lock.isHeldByCurrentThread(), "renewed");
            assertFalse(lock.isLost());
            // Someone frees it behind our back: the next renewal notices and tells us.
            assertTrue(rlock.getLock(lock.getName()).forceUnlock());
            TestServer.waitUntil(Duration.ofSeconds(3), "loss reported", () -> !lost.isEmpty());
            assertEquals(lock.ownerOf(Thread.currentThread().getId()), lost.get(0));
            assertTrue(lock.isLost());
            IllegalMonitorStateException e = assertThrows(IllegalMonitorStateException.class, lock::unlock);
            assertTrue(e.getMessage().contains("lost"), e.getMessage());
        }
    }

    @Test
    void a_fixed_lease_is_not_renewed() throws Exception {
        RlockLock lock = rlock.getLock(key("lease"));
        lock.lock(150, TimeUnit.MILLISECONDS);
        TestServer.waitUntil(Duration.ofSeconds(3), "lease ran out", () -> !lock.isLocked());
        assertThrows(IllegalMonitorStateException.class, lock::unlock);
    }

    @Test
    void many_waiters_share_two_connections() throws Exception {
        try (RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            RlockLock lock = c.getLock(key("conns"));
            lock.lock();
            int before = server.connections();
            CountDownLatch done = new CountDownLatch(100);
            for (int i = 0; i < 100; i++) {
                long owner = 1000 + i;
                lock.lockAsync(-1, TimeUnit.MILLISECONDS, owner)
                        .thenCompose(x -> lock.unlockAsync(owner))
                        .whenComplete((x, e) -> done.countDown());
            }
            TestServer.waitUntil(Duration.ofSeconds(5), "100 queued", () -> serverWaiters() == 100);
            int during = server.connections();
            assertTrue(during <= before + 1, "connections " + before + " -> " + during
                    + " (the notification connection opens with the first waiter)");
            lock.unlock();
            assertTrue(done.await(20, TimeUnit.SECONDS));
        }
    }

    @Test
    void the_async_twins_take_an_explicit_owner() throws Exception {
        RlockLock lock = rlock.getLock(key("async"));
        lock.lockAsync(-1, TimeUnit.MILLISECONDS, 42).get(5, TimeUnit.SECONDS);
        assertTrue(lock.isHeldByThread(42));
        assertFalse(lock.tryLockAsync(43).get(5, TimeUnit.SECONDS));
        CompletableFuture<Boolean> waiting = lock.tryLockAsync(5, -1, TimeUnit.SECONDS, 43);
        TestServer.waitUntil(Duration.ofSeconds(5), "queued", () -> serverWaiters() == 1);
        // Released from another thread than the one that took it, by naming the owner.
        CompletableFuture.runAsync(() -> lock.unlockAsync(42).join()).get(5, TimeUnit.SECONDS);
        assertTrue(waiting.get(5, TimeUnit.SECONDS));
        assertTrue(lock.isHeldByThread(43));
        lock.unlockAsync(43).get(5, TimeUnit.SECONDS);
    }

    @Test
    void the_blocking_fallback_waits_on_a_connection_of_its_own() throws Exception {
        try (RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults()
                .withWaitMode(RlockOptions.WaitMode.BLOCKING))) {
            RlockLock lock = c.getLock(key("blocking"));
            lock.lock();
            AtomicReference<Boolean> got = new AtomicReference<>();
            Thread t = spawn(() -> {
                try {
                    got.set(lock.tryLock(10, TimeUnit.SECONDS));
                    lock.unlock();
                } catch (InterruptedException e) {
                    throw new RuntimeException(e);
                }
            });
            TestServer.waitUntil(Duration.ofSeconds(5), "blocked", () ->
                    Long.parseLong(server.info("clients", "blocked_clients")) == 1);
            lock.unlock();
            t.join();
            assertTrue(got.get());
        }
    }

    @Test
    void it_rides_on_an_application_lettuce_client() {
        RedisClient app = RedisClient.create(server.uri());
        try {
            try (RlockClient c = RlockClient.create(app)) {
                RlockLock lock = c.getLock(key("ride"));
                assertTrue(lock.tryLock());
                lock.unlock();
            }
            // Closing the rlock client leaves the application's client working.
            try (var conn = app.connect()) {
                assertEquals("PONG", conn.sync().ping());
            }
        } finally {
            app.shutdown();
        }
    }

    @Test
    void a_waiter_whose_connections_were_killed_queues_again_and_is_served() throws Exception {
        try (TestServer own = new TestServer();
             RlockClient c = RlockClient.create(own.uri(), RlockOptions.defaults())) {
            String name = key("killed");
            assertNull(own.call("RLOCK.ACQUIRE", name, "holder", "30000"));
            CompletableFuture<Boolean> wait = c.getLock(name).tryLockAsync(20, -1, TimeUnit.SECONDS, 7);
            TestServer.waitUntil(Duration.ofSeconds(5), "queued",
                    () -> "1".equals(own.info("rlock", "rlock_waiters")));
            // Every connection but the test's own goes: the server drops the ticket with
            // its connection. Lettuce reconnects; the client sends the ticket again with the
            // same request id after each of its two connections is back (a grant message may
            // have been missed by the subscriber too), so it may queue twice: the server
            // grants one request id once and drops the other ticket silently.
            own.call("CLIENT", "KILL", "SKIPME", "yes");
            TestServer.waitUntil(Duration.ofSeconds(10), "queued again after the reconnect",
                    () -> Long.parseLong(own.info("rlock", "rlock_waiters")) >= 1);
            assertEquals(1L, own.call("RLOCK.RELEASE", name, "holder"));
            assertTrue(wait.get(10, TimeUnit.SECONDS));
            assertTrue(c.getLock(name).isHeldByThread(7));
            c.getLock(name).unlockAsync(7).get(5, TimeUnit.SECONDS);
            TestServer.waitUntil(Duration.ofSeconds(5), "the duplicate ticket dropped, the lock free",
                    () -> "0".equals(own.info("rlock", "rlock_waiters")) && own.redis().exists(name) == 0);
        }
    }

    @Test
    void replica_sync_gives_the_lock_back_when_too_few_replicas_acknowledge() throws Exception {
        try (RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults()
                .withReplicaSync(1, Duration.ofMillis(100)))) {
            RlockLock lock = c.getLock(key("replicas"));
            // The test server has no replica: WAIT 1 answers 0.
            ReplicaSyncException e = assertThrows(ReplicaSyncException.class, lock::tryLock);
            assertEquals(0, e.acknowledged());
            TestServer.waitUntil(Duration.ofSeconds(5), "the lock given back", () -> !lock.isLocked());
        }
    }

    /** How many WAIT commands `s` has run. */
    /** How many times the server ran RLOCK.RENEW (INFO commandstats). */
    static long renewCalls(TestServer s) {
        String stat = s.info("commandstats", "cmdstat_rlock.renew");
        return stat == null ? 0 : Long.parseLong(stat.split(",")[0].substring("calls=".length()));
    }

    static long waitCalls(TestServer s) {
        String line = s.redis().info("commandstats").lines().filter(l -> l.startsWith("cmdstat_wait:"))
                .findFirst().orElse("cmdstat_wait:calls=0,");
        return Long.parseLong(line.substring(line.indexOf("calls=") + 6, line.indexOf(',', line.indexOf("calls="))));
    }

    @Test
    void replica_sync_is_on_by_default_for_every_connected_replica_as_in_redisson() throws Exception {
        try (TestServer primary = new TestServer();
             TestServer replica = new TestServer("--replicaof", "127.0.0.1", Integer.toString(primary.port))) {
            // ROLE is what the client counts, and it lists a replica only once the primary
            // has it online, a moment after INFO's connected_slaves and the replica's link
            // say so (seen on Redis 7.0).
            TestServer.waitUntil(Duration.ofSeconds(20), "the replica in sync and listed by ROLE", () ->
                    "up".equals(replica.info("replication", "master_link_status"))
                            && primary.redis().role().size() > 2
                            && primary.redis().role().get(2) instanceof java.util.List<?> listed
                            && listed.size() == 1);
            try (RlockClient c = RlockClient.create(primary.uri(), RlockOptions.defaults())) {
                RlockLock lock = c.getLock(key("synced"));
                long before = waitCalls(primary);
                assertTrue(lock.tryLock());
                lock.unlock();
                assertEquals(before + 1, waitCalls(primary), "one WAIT 1 after the acquire");
                // A replica that stops answering: the acquire is not acknowledged, and given back.
                replica.signal("STOP");
                try {
                    ReplicaSyncException e = assertThrows(ReplicaSyncException.class, lock::tryLock);
                    assertEquals(0, e.acknowledged());
                    assertEquals(1, e.wanted());
                    TestServer.waitUntil(Duration.ofSeconds(5), "the lock given back", () -> !lock.isLocked());
                } finally {
                    replica.signal("CONT");
                }
            }
            try (RlockClient c = RlockClient.create(primary.uri(), RlockOptions.defaults().withoutReplicaSync())) {
                long before = waitCalls(primary);
                RlockLock lock = c.getLock(key("unsynced"));
                assertTrue(lock.tryLock());
                lock.unlock();
                assertEquals(before, waitCalls(primary), "no WAIT when turned off");
            }
        }
    }

    @Test
    void replica_sync_sends_no_wait_when_the_server_has_no_replica() throws Exception {
        long before = waitCalls(server);
        RlockLock lock = rlock.getLock(key("no-replica"));
        assertTrue(lock.tryLock());
        lock.unlock();
        assertEquals(before, waitCalls(server));
    }
}
