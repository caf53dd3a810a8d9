// Scripts mode of the rlock Java client (clients/java tests; docs/scripts-mode.md): every
// primitive on Redisson's scripts against a server without the module, the client logged in
// as a user restricted like a managed service's (`+@all -@dangerous`), found by the AUTO
// probe; SCRIPT FLUSH mid-run; Redisson's way of waiting (one subscriber connection, woken
// by the message or at the holder's lease end, no polling); cancelled waits leave nothing.
// Self-contained: it starts its own servers, whatever REDIS_SERVER it is run with.
package io.rlock;

import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.cluster.SlotHash;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(60)
class ScriptsModeTest {
    static TestServer server;
    static RlockClient rlock;
    /** Every wake-up here is a message, or a lease end far below this: every wait is longer. */
    static final long WAKE_LIMIT_MS = 2000;
    /**
     * The watchdog tests' lease: renewed every third of it, so a renewal may come up to
     * two thirds late (a loaded machine) before the hold is lost.
     */
    static final long WATCHDOG_MS = 1500;

    @BeforeAll
    static void start() {
        server = TestServer.withoutModule();
        server.addRestrictedUser();
        rlock = RlockClient.create(server.restrictedUri(), RlockOptions.defaults());
    }

    @AfterAll
    static void stop() {
        rlock.close();
        server.close();
    }

    static String name(String what) {
        return "java:scripts:" + what + ":" + System.nanoTime();
    }

    /** EVALSHA and EVAL calls the server has run (INFO commandstats). */
    static long scriptCalls() {
        long n = 0;
        for (String c : List.of("cmdstat_evalsha", "cmdstat_eval")) {
            String v = server.info("commandstats", c);
            if (v != null) {
                n += Long.parseLong(v.split(",")[0].substring("calls=".length()));
            }
        }
        return n;
    }

    static long subscribers(String channel) {
        return server.redis().pubsubNumsub(channel).getOrDefault(channel, 0L);
    }

    static long notificationConnections() {
        return server.redis().clientList().lines()
                .filter(l -> l.contains(" name=" + RlockClient.NOTIFICATION_CONNECTION_NAME + " ")).count();
    }

    static long ms(long fromNanos) {
        return (System.nanoTime() - fromNanos) / 1_000_000;
    }

    /** `f` (a waiter subscribed to `channel`) completes within the wake limit after `release`. */
    static <T> T wokenBy(CompletableFuture<T> f, String channel, Runnable release) throws Exception {
        TestServer.waitUntil(Duration.ofSeconds(5), "the waiter subscribed", () -> subscribers(channel) >= 1);
        TestServer.waitUntil(Duration.ofSeconds(5), "the waiter asleep", () -> rlock.scriptsAsleep() >= 1);
        assertFalse(f.isDone(), "served before the release");
        long t0 = System.nanoTime();
        release.run();
        T v = f.get(10, TimeUnit.SECONDS);
        assertTrue(ms(t0) < WAKE_LIMIT_MS, "woke after " + ms(t0) + " ms: not by the message");
        return v;
    }

    // ---- the probe ---------------------------------------------------------------------------

    @Test
    void auto_finds_no_module_under_a_restricted_user_and_module_mode_says_so() {
        assertEquals(RlockOptions.Mode.SCRIPTS, rlock.mode());
        assertEquals(Capabilities.NO_MODULE, rlock.capabilities());
        try (RlockClient m = RlockClient.create(server.restrictedUri(),
                RlockOptions.defaults().withMode(RlockOptions.Mode.MODULE))) {
            assertEquals(RlockOptions.Mode.MODULE, m.mode());
            RedisCommandExecutionException e = assertThrows(RedisCommandExecutionException.class,
                    () -> m.getLock(name("module")).tryLock());
            assertTrue(e.getMessage().toLowerCase().contains("unknown command"), e.getMessage());
        }
    }

    @Test
    void a_user_refused_the_probe_on_a_module_server_still_finds_the_module() {
        try (TestServer native_ = new TestServer()) {
            native_.call("ACL", "SETUSER", "nohello", "on", ">pw", "~*", "&*", "+@all", "-rlock.hello");
            io.lettuce.core.RedisURI uri = io.lettuce.core.RedisURI.builder().withHost("127.0.0.1")
                    .withPort(native_.port).withAuthentication("nohello", "pw").build();
            try (RlockClient c = RlockClient.create(uri, RlockOptions.defaults())) {
                assertEquals(RlockOptions.Mode.MODULE, c.mode());
                assertTrue(c.getLock(name("nohello")).tryLock());
            }
        }
    }

    // ---- every primitive ---------------------------------------------------------------------

    @Test
    void lock_is_reentrant_exclusive_and_a_waiter_wakes_on_the_unlock_message() throws Exception {
        String n = name("lock");
        RlockLock lock = rlock.getLock(n);
        assertTrue(lock.tryLockAsync(1).get());
        assertTrue(lock.tryLockAsync(1).get(), "re-entrant");
        assertEquals("2", server.redis().hget(n, lock.ownerOf(1)), "Redisson's layout: a hash of owner -> count");
        assertFalse(lock.tryLockAsync(2).get(), "exclusive");
        CompletableFuture<Boolean> waiter = lock.tryLockAsync(30, -1, TimeUnit.SECONDS, 2);
        lock.unlockAsync(1).get();
        assertFalse(waiter.isDone(), "one hold left");
        assertTrue(wokenBy(waiter, Scripts.lockChannel(n), () -> lock.unlockAsync(1).join()));
        assertTrue(lock.isHeldByThread(2));
        assertThrows(IllegalMonitorStateException.class, () -> Sync.join(lock.unlockAsync(1)));
        lock.unlockAsync(2).get();
        assertFalse(lock.isLocked());
        assertTrue(lock.tryLock(50, TimeUnit.MILLISECONDS), "blocking face, current thread");
        lock.unlock();
        assertThrows(IllegalMonitorStateException.class, lock::unlock);
    }

    @Test
    void a_try_with_a_wait_times_out_and_leaves_nothing_behind() throws Exception {
        RlockLock lock = rlock.getLock(name("timeout"));
        assertTrue(lock.tryLockAsync(1).get());
        long t0 = System.nanoTime();
        assertFalse(lock.tryLockAsync(200, -1, TimeUnit.MILLISECONDS, 2).get());
        assertTrue(ms(t0) >= 190, "waited " + ms(t0));
        TestServer.waitUntil(Duration.ofSeconds(2), "no wait left", () -> rlock.scriptWaiting() == 0);
        lock.unlockAsync(1).get();
    }

    @Test
    void a_waiter_wakes_at_the_holders_lease_end_without_a_message_and_without_polling() throws Exception {
        RlockLock lock = rlock.getLock(name("lease"));
        long t0 = System.nanoTime();
        assertTrue(lock.tryLockAsync(-1, 400, TimeUnit.MILLISECONDS, 1).get()); // never unlocked: a dead holder
        long calls = scriptCalls();
        assertTrue(lock.tryLockAsync(10, 30_000, TimeUnit.SECONDS, 2).get(5, TimeUnit.SECONDS));
        long waited = ms(t0);
        assertTrue(waited >= 390 && waited < WAKE_LIMIT_MS, "woke " + waited + " ms after the 400 ms lease began");
        long ran = scriptCalls() - calls;
        assertTrue(ran <= 4, ran + " script runs: polling");
        lock.unlockAsync(2).get();
    }

    @Test
    void an_interrupted_wait_leaves_no_wait_and_a_late_grant_is_given_back() throws Exception {
        RlockLock lock = rlock.getLock(name("cancel"));
        assertTrue(lock.tryLockAsync(1).get());
        CompletableFuture<Boolean> waiter = lock.tryLockAsync(30, -1, TimeUnit.SECONDS, 2);
        TestServer.waitUntil(Duration.ofSeconds(5), "the waiter subscribed", () -> rlock.scriptWaiting() == 1);
        waiter.cancel(true);
        TestServer.waitUntil(Duration.ofSeconds(2), "no wait left", () -> rlock.scriptWaiting() == 0);
        // The UNSUBSCRIBE goes out once the wait is gone; the server counts it when it has read it.
        TestServer.waitUntil(Duration.ofSeconds(2), "unsubscribed",
                () -> subscribers(Scripts.lockChannel(lock.getName())) == 0);
        lock.unlockAsync(1).get();
        assertFalse(lock.isLocked(), "nobody took it");
    }

    @Test
    void the_watchdog_keeps_a_lock_and_reports_it_lost() throws Exception {
        try (RlockClient c = RlockClient.create(server.restrictedUri(),
                RlockOptions.defaults().withWatchdogTimeout(Duration.ofMillis(WATCHDOG_MS)))) {
            String n = name("watchdog");
            RlockLock lock = c.getLock(n);
            ConcurrentLinkedQueue<String> lost = new ConcurrentLinkedQueue<>();
            lock.addLostListener((name, owner, why) -> lost.add(why));
            lock.lockAsync(-1, TimeUnit.MILLISECONDS, 1).get();
            Thread.sleep(WATCHDOG_MS + 500); // past the first lease: renewed by Redisson's renewal script
            assertTrue(lock.isLocked());
            server.redis().del(n);
            TestServer.waitUntil(Duration.ofSeconds(3), "loss reported", () -> !lost.isEmpty());
            assertTrue(lock.isLost(1));
        }
    }

    @Test
    void fenced_tokens_increase_with_every_acquire() throws Exception {
        String n = name("fenced");
        RlockFencedLock lock = rlock.getFencedLock(n);
        Long t1 = lock.lockAndGetTokenAsync(-1, TimeUnit.MILLISECONDS, 1).get();
        Long t2 = lock.tryLockAndGetTokenAsync(-1, -1, TimeUnit.MILLISECONDS, 1).get();
        assertTrue(t2 > t1);
        assertNull(lock.tryLockAndGetTokenAsync(-1, -1, TimeUnit.MILLISECONDS, 2).get());
        CompletableFuture<Long> waiter = lock.tryLockAndGetTokenAsync(30, -1, TimeUnit.SECONDS, 2);
        lock.unlockAsync(1).get();
        Long t3 = wokenBy(waiter, Scripts.lockChannel(n), () -> lock.unlockAsync(1).join());
        assertTrue(t3 > t2);
        assertEquals(t3, lock.getToken());
        lock.unlockAsync(2).get();
    }

    @Test
    void read_write_lock_shares_readers_excludes_a_writer_and_refuses_an_upgrade() throws Exception {
        String n = name("rw");
        RlockReadWriteLock rw = rlock.getReadWriteLock(n);
        assertTrue(rw.readLock().tryLockAsync(1).get());
        assertTrue(rw.readLock().tryLockAsync(2).get(), "readers share");
        assertFalse(rw.writeLock().tryLockAsync(3).get());
        RedisCommandExecutionException e = assertThrows(RedisCommandExecutionException.class,
                () -> Sync.join(rw.writeLock().tryLockAsync(1)));
        assertTrue(e.getMessage().startsWith("READHELD"), e.getMessage());
        CompletableFuture<Boolean> writer = rw.writeLock().tryLockAsync(30, -1, TimeUnit.SECONDS, 3);
        rw.readLock().unlockAsync(1).get();
        assertTrue(wokenBy(writer, Scripts.rwChannel(n), () -> rw.readLock().unlockAsync(2).join()));
        assertTrue(rw.writeLock().isLocked());
        assertTrue(rw.readLock().tryLockAsync(3).get(), "the writer may read");
        CompletableFuture<Boolean> reader = rw.readLock().tryLockAsync(30, -1, TimeUnit.SECONDS, 4);
        rw.readLock().unlockAsync(3).get();
        assertTrue(wokenBy(reader, Scripts.rwChannel(n), () -> rw.writeLock().unlockAsync(3).join()));
        rw.readLock().unlockAsync(4).get();
        assertFalse(rw.readLock().isLocked());
    }

    @Test
    void semaphore_counts_permits_and_a_waiter_wakes_on_a_release() throws Exception {
        String n = name("sem");
        RlockSemaphore s = rlock.getSemaphore(n);
        assertTrue(s.trySetPermits(2));
        assertFalse(s.trySetPermits(5));
        assertTrue(s.tryAcquire(2));
        assertFalse(s.tryAcquire());
        assertEquals(0, s.availablePermits());
        CompletableFuture<Boolean> waiter = s.tryAcquireAsync(1, 30, TimeUnit.SECONDS);
        assertTrue(wokenBy(waiter, Scripts.semaphoreChannel(n), () -> s.release(1)));
        s.addPermits(3);
        assertEquals(3, s.availablePermits());
        assertEquals(3, s.drainPermits());
        assertEquals(0, s.availablePermits());
        RedisCommandExecutionException e = assertThrows(RedisCommandExecutionException.class,
                () -> Sync.join(rlock.wire().sendRetrying(List.of("RSEMAPHORE.TRYSETPERMITS", name("bad"), "-3"))));
        assertTrue(e.getMessage().startsWith("BADPERMITS"), e.getMessage());
    }

    @Test
    void permit_expirable_semaphore_gives_ids_leases_and_wakes_at_a_permits_expiry() throws Exception {
        String n = name("pes");
        RlockPermitExpirableSemaphore s = rlock.getPermitExpirableSemaphore(n);
        assertTrue(s.trySetPermits(1));
        String id = s.tryAcquire(-1, 30_000, TimeUnit.MILLISECONDS);
        assertNotNull(id);
        assertTrue(id.matches("[0-9a-f]{32}"), id);
        assertNull(s.tryAcquire());
        assertEquals(0, s.availablePermits());
        assertEquals(1, s.acquiredPermits());
        CompletableFuture<String> waiter = s.tryAcquireAsync(30, 30_000, TimeUnit.SECONDS);
        String second = wokenBy(waiter, Scripts.semaphoreChannel(n), () -> s.release(id));
        assertNotNull(second);
        assertFalse(s.tryRelease(id), "released already");
        assertTrue(s.updateLeaseTime(second, 300, TimeUnit.MILLISECONDS));
        // Nobody releases it: a waiter wakes at its expiry, without a message.
        long t0 = System.nanoTime();
        String third = s.tryAcquire(10, 30_000, TimeUnit.SECONDS);
        assertNotNull(third);
        assertTrue(ms(t0) < WAKE_LIMIT_MS, "woke after " + ms(t0));
        s.release(third);
        s.addPermits(2);
        assertEquals(3, s.availablePermits());
        assertFalse(s.tryRelease("ff" + third.substring(2)), "an unknown id, as raw bytes");
        RedisCommandExecutionException e = assertThrows(RedisCommandExecutionException.class,
                () -> s.tryRelease("not-an-id"));
        assertTrue(e.getMessage().startsWith("BADPERMITID"), e.getMessage());
    }

    @Test
    void a_permit_taken_without_a_lease_is_kept_by_the_watchdog() throws Exception {
        try (RlockClient c = RlockClient.create(server.restrictedUri(),
                RlockOptions.defaults().withWatchdogTimeout(Duration.ofMillis(WATCHDOG_MS)))) {
            RlockPermitExpirableSemaphore s = c.getPermitExpirableSemaphore(name("pes-watchdog"));
            assertTrue(s.trySetPermits(1));
            String id = s.tryAcquire();
            Thread.sleep(WATCHDOG_MS + 500);
            assertEquals(0, s.availablePermits(), "renewed past the first lease");
            s.release(id);
            assertEquals(1, s.availablePermits());
        }
    }

    @Test
    void latch_releases_every_awaiter_when_the_count_reaches_zero() throws Exception {
        String n = name("latch");
        RlockCountDownLatch latch = rlock.getCountDownLatch(n);
        assertTrue(latch.trySetCount(2));
        assertFalse(latch.trySetCount(5));
        assertEquals(2, latch.getCount());
        CompletableFuture<Boolean> a = latch.awaitAsync(30, TimeUnit.SECONDS);
        CompletableFuture<Boolean> b = latch.awaitAsync(30, TimeUnit.SECONDS);
        latch.countDown();
        assertEquals(1, latch.getCount());
        assertTrue(wokenBy(a, Scripts.latchChannel(n), latch::countDown));
        assertTrue(b.get(2, TimeUnit.SECONDS));
        assertEquals(0, latch.getCount());
        assertTrue(latch.await(1, TimeUnit.MILLISECONDS), "open");
        assertTrue(latch.trySetCount(1));
        assertTrue(latch.delete());
    }

    // ---- a managed service's realities ----------------------------------------------------------

    @Test
    void a_flushed_script_cache_is_loaded_again_mid_run() throws Exception {
        String n = name("flush");
        RlockLock lock = rlock.getLock(n);
        assertTrue(lock.tryLockAsync(1).get());
        CompletableFuture<Boolean> waiter = lock.tryLockAsync(30, -1, TimeUnit.SECONDS, 2);
        TestServer.waitUntil(Duration.ofSeconds(5), "the waiter subscribed", () -> subscribers(Scripts.lockChannel(n)) >= 1);
        server.call("SCRIPT", "FLUSH");
        lock.unlockAsync(1).get(); // NOSCRIPT: sent again as EVAL, which caches it
        assertTrue(waiter.get(5, TimeUnit.SECONDS), "served after the flush");
        server.call("SCRIPT", "FLUSH");
        lock.unlockAsync(2).get();
        assertFalse(lock.isLocked());
    }

    @Test
    void all_waits_of_a_client_share_one_subscriber_connection_and_each_unlock_wakes_one() throws Exception {
        long before = notificationConnections();
        try (RlockClient c = RlockClient.create(server.restrictedUri(), RlockOptions.defaults())) {
            List<CompletableFuture<Boolean>> waits = new ArrayList<>();
            List<RlockLock> locks = new ArrayList<>();
            for (int i = 0; i < 10; i++) {
                RlockLock l = c.getLock(name("many" + i));
                assertTrue(l.tryLockAsync(1).get());
                locks.add(l);
                waits.add(l.tryLockAsync(30, -1, TimeUnit.SECONDS, 2));
            }
            // Ten waiters of one client on one more lock, served one by one by unlock messages.
            RlockLock one = c.getLock(name("one"));
            assertTrue(one.tryLockAsync(1000).get());
            AtomicInteger inside = new AtomicInteger(), most = new AtomicInteger();
            List<CompletableFuture<Void>> queue = new ArrayList<>();
            for (long t = 0; t < 10; t++) {
                long tid = t;
                queue.add(one.tryLockAsync(30, -1, TimeUnit.SECONDS, tid).thenCompose(ok -> {
                    assertTrue(ok);
                    most.accumulateAndGet(inside.incrementAndGet(), Math::max);
                    inside.decrementAndGet();
                    return one.unlockAsync(tid);
                }));
            }
            TestServer.waitUntil(Duration.ofSeconds(5), "every wait under way", () -> c.scriptWaiting() == 20);
            assertEquals(1, notificationConnections() - before, "one subscriber connection for twenty waits");
            one.unlockAsync(1000).get();
            CompletableFuture.allOf(queue.toArray(new CompletableFuture[0])).get(10, TimeUnit.SECONDS);
            assertEquals(1, most.get(), "one holder at a time");
            for (RlockLock l : locks) {
                l.unlockAsync(1).get();
            }
            for (CompletableFuture<Boolean> w : waits) {
                assertTrue(w.get(5, TimeUnit.SECONDS));
            }
        }
    }

    @Test
    void every_key_the_scripts_touch_is_in_the_names_slot() throws Exception {
        for (String n : List.of(name("slot"), "{" + name("tagged") + "}:x")) {
            RlockReadWriteLock rw = rlock.getReadWriteLock(n);
            assertTrue(rw.readLock().tryLockAsync(1).get());
            assertTrue(rw.readLock().tryLockAsync(2).get());
            long slot = SlotHash.getSlot(n);
            for (String k : server.redis().keys("*" + n.replace("{", "\\{").replace("}", "\\}") + "*")) {
                assertEquals(slot, SlotHash.getSlot(k), k + " is in " + n + "'s slot");
            }
            rw.readLock().unlockAsync(1).get();
            rw.readLock().unlockAsync(2).get();
            assertEquals(List.of(), server.redis().keys("*" + n.replace("{", "\\{").replace("}", "\\}") + ":*rwlock*"));
        }
    }
}
