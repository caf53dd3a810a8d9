// Tests of the rlock Java client's other primitives (clients/java) against a real
// module-loaded server: fenced tokens, the read-write lock's sharing and writer priority,
// the semaphore's FIFO, permit ids and leases (and the watchdog keeping a permit), the
// latch releasing every awaiter, and cancelled waits giving back late grants.
package io.rlock;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(60)
class PrimitivesTest {
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

    static String name(String what) {
        return "java:prim:" + what + ":" + System.nanoTime();
    }

    long serverWaiters() {
        return Long.parseLong(server.info("rlock", "rlock_waiters"));
    }

    @Test
    void fenced_tokens_increase_with_every_acquire_and_handoff() throws Exception {
        RlockFencedLock lock = rlock.getFencedLock(name("fenced"));
        Long t1 = lock.lockAndGetToken();
        Long t2 = lock.tryLockAndGetToken(); // re-entry: a new token, as Redisson's
        assertTrue(t2 > t1);
        CompletableFuture<Long> waiter = lock.tryLockAndGetTokenAsync(10, -1, TimeUnit.SECONDS, 99);
        TestServer.waitUntil(Duration.ofSeconds(5), "queued", () -> serverWaiters() == 1);
        lock.unlock();
        lock.unlock();
        Long t3 = waiter.get(5, TimeUnit.SECONDS);
        assertTrue(t3 > t2, "handoff token " + t3 + " > " + t2);
        assertEquals(t3, lock.getToken());
        assertNull(lock.tryLockAndGetToken(), "held by owner 99");
        lock.unlockAsync(99).get();
    }

    @Test
    void read_write_lock_shares_readers_and_queued_writer_goes_first() throws Exception {
        RlockReadWriteLock rw = rlock.getReadWriteLock(name("rw"));
        assertTrue(rw.readLock().tryLockAsync(1).get());
        assertTrue(rw.readLock().tryLockAsync(2).get(), "readers share");
        CompletableFuture<Boolean> writer = rw.writeLock().tryLockAsync(10, -1, TimeUnit.SECONDS, 3);
        TestServer.waitUntil(Duration.ofSeconds(5), "writer queued", () -> serverWaiters() == 1);
        // A reader arriving after a queued writer waits behind it: no writer starvation.
        CompletableFuture<Boolean> lateReader = rw.readLock().tryLockAsync(10, -1, TimeUnit.SECONDS, 4);
        TestServer.waitUntil(Duration.ofSeconds(5), "reader queued", () -> serverWaiters() == 2);
        rw.readLock().unlockAsync(1).get();
        rw.readLock().unlockAsync(2).get();
        assertTrue(writer.get(5, TimeUnit.SECONDS));
        assertFalse(lateReader.isDone());
        assertTrue(rw.writeLock().isHeldByThread(3));
        rw.writeLock().unlockAsync(3).get();
        assertTrue(lateReader.get(5, TimeUnit.SECONDS));
        rw.readLock().unlockAsync(4).get();
        // A reader asking for the write lock is refused at once instead of waiting on itself.
        rw.readLock().lock();
        RuntimeException e = assertThrows(RuntimeException.class, () -> rw.writeLock().tryLock(5, TimeUnit.SECONDS));
        assertTrue(e.getMessage().contains("release the read lock first"), e.getMessage());
        rw.readLock().unlock();
    }

    @Test
    void semaphore_serves_a_big_request_at_the_head_before_a_later_small_one() throws Exception {
        RlockSemaphore sem = rlock.getSemaphore(name("sem"));
        assertTrue(sem.trySetPermits(2));
        assertFalse(sem.trySetPermits(7));
        sem.acquire(2);
        CompletableFuture<Boolean> big = sem.tryAcquireAsync(2, 10, TimeUnit.SECONDS);
        TestServer.waitUntil(Duration.ofSeconds(5), "big queued", () -> serverWaiters() == 1);
        CompletableFuture<Boolean> small = sem.tryAcquireAsync(1, 10, TimeUnit.SECONDS);
        TestServer.waitUntil(Duration.ofSeconds(5), "small queued", () -> serverWaiters() == 2);
        sem.release(1);
        assertFalse(big.isDone() || small.isDone(), "one permit: the head wants two, the later one waits behind it");
        sem.release(1);
        assertTrue(big.get(5, TimeUnit.SECONDS));
        sem.release(2);
        assertTrue(small.get(5, TimeUnit.SECONDS));
        assertEquals(1, sem.availablePermits());
        assertEquals(1, sem.drainPermits());
        assertFalse(sem.tryAcquire(50, TimeUnit.MILLISECONDS));
        // Its `timeout` message may come after its deadline on a loaded machine (the waiter
        // stays registered until then, an orphan): nothing left once it has.
        TestServer.waitUntil(Duration.ofSeconds(5), "no waiter left", () -> rlock.registeredWaiters() == 0);
    }

    @Test
    void an_interrupted_semaphore_wait_gives_a_late_grant_back() throws Exception {
        RlockSemaphore sem = rlock.getSemaphore(name("semint"));
        sem.trySetPermits(0);
        List<Throwable> got = Collections.synchronizedList(new ArrayList<>());
        Thread t = new Thread(() -> {
            try {
                sem.acquire(1);
                got.add(new AssertionError("acquired"));
            } catch (Throwable e) {
                got.add(e);
            }
        });
        t.start();
        TestServer.waitUntil(Duration.ofSeconds(5), "queued", () -> serverWaiters() == 1);
        t.interrupt();
        t.join();
        assertInstanceOf(InterruptedException.class, got.get(0));
        sem.release(1);
        TestServer.waitUntil(Duration.ofSeconds(5), "the late grant given back",
                () -> rlock.registeredWaiters() == 0 && sem.availablePermits() == 1);
        assertEquals(0, serverWaiters());
    }

    @Test
    void expirable_permits_have_ids_leases_and_come_back_at_their_lease_end() throws Exception {
        RlockPermitExpirableSemaphore sem = rlock.getPermitExpirableSemaphore(name("psem"));
        assertTrue(sem.trySetPermits(1));
        String id = sem.tryAcquire(0, 200, TimeUnit.MILLISECONDS);
        assertNotNull(id);
        assertNull(sem.tryAcquire());
        // A waiter gets the permit when its lease ends (the module's timer), not later.
        long t0 = System.nanoTime();
        String next = sem.tryAcquire(5, 10, TimeUnit.SECONDS);
        long ms = (System.nanoTime() - t0) / 1_000_000;
        assertNotNull(next);
        assertTrue(ms < 1000, "served " + ms + " ms after asking, lease was 200 ms");
        assertFalse(sem.tryRelease(id), "the expired permit is not held any more");
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> sem.release(id));
        assertTrue(e.getMessage().contains("already been released"));
        assertTrue(sem.updateLeaseTime(next, 20, TimeUnit.SECONDS));
        sem.release(next);
        assertEquals(1, sem.availablePermits());
    }

    /** How many times the server ran RPSEMAPHORE.UPDATELEASETIME (INFO commandstats). */
    static long updateLeaseCalls() {
        String stat = server.info("commandstats", "cmdstat_rpsemaphore.updateleasetime");
        return stat == null ? 0 : Long.parseLong(stat.split(",")[0].substring("calls=".length()));
    }

    @Test
    void the_watchdog_keeps_a_permit_taken_without_a_lease() throws Exception {
        // A lease long enough that a loaded machine's scheduling pauses do not end it between
        // two renewals; the test waits for the server to see renewals past the first lease's
        // end rather than sleeping a fixed time.
        Duration lease = Duration.ofMillis(1500);
        try (RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults()
                .withWatchdogTimeout(lease))) {
            RlockPermitExpirableSemaphore sem = c.getPermitExpirableSemaphore(name("psemwd"));
            sem.trySetPermits(1);
            long renewals = updateLeaseCalls();
            long firstLeaseEnd = System.nanoTime() + lease.toNanos();
            String id = sem.acquire();
            TestServer.waitUntil(Duration.ofSeconds(30), "renewals past the first lease's end",
                    () -> System.nanoTime() > firstLeaseEnd && updateLeaseCalls() >= renewals + 4);
            assertEquals(1, sem.acquiredPermits(), "renewed");
            sem.release(id);
            assertEquals(1, sem.availablePermits());
        }
    }

    @Test
    void the_latch_releases_every_awaiter_when_it_reaches_zero() throws Exception {
        RlockCountDownLatch latch = rlock.getCountDownLatch(name("latch"));
        assertTrue(latch.trySetCount(2));
        List<CompletableFuture<Boolean>> awaiters = new ArrayList<>();
        for (int i = 0; i < 5; i++) {
            awaiters.add(latch.awaitAsync(10, TimeUnit.SECONDS));
        }
        TestServer.waitUntil(Duration.ofSeconds(5), "awaiters queued", () -> serverWaiters() == 5);
        latch.countDown();
        assertEquals(1, latch.getCount());
        assertFalse(latch.await(50, TimeUnit.MILLISECONDS));
        latch.countDown();
        for (CompletableFuture<Boolean> a : awaiters) {
            assertTrue(a.get(5, TimeUnit.SECONDS));
        }
        assertEquals(0, latch.getCount());
        assertTrue(latch.await(1, TimeUnit.SECONDS));
    }
}
