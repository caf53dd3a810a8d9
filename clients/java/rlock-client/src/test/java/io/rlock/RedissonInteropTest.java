// The interop proof (clients/java tests; design.md 6): the real Redisson (test scope, its latest
// release) and the rlock Java client on the same names against one module-loaded server,
// both directions for every primitive: they exclude each other, a module waiter is served
// when Redisson releases, and a Redisson waiter wakes when the module releases, through
// Redisson's own pub/sub (the wake-up delay is measured and must be far below any timeout
// or lease that could otherwise have woken it).
package io.rlock;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.TestInfo;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.redisson.Redisson;
import org.redisson.api.RCountDownLatch;
import org.redisson.api.RFencedLock;
import org.redisson.api.RLock;
import org.redisson.api.RPermitExpirableSemaphore;
import org.redisson.api.RReadWriteLock;
import org.redisson.api.RSemaphore;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(120)
class RedissonInteropTest {
    static TestServer server;
    static RlockClient rlock;
    static RedissonClient redisson;
    /** Redisson holders lock and unlock on one thread (Redisson owners are per thread). */
    static ExecutorService rt;
    /** A wake-up slower than this was not Redisson's pub/sub: every wait and lease here is 30 s. */
    static final long WAKE_LIMIT_MS = 2000;

    /** The tag of a subclass that runs every test here on a server without the module (scripts mode). */
    static final String SCRIPTS_MODE = "scripts-mode";

    @BeforeAll
    static void start(TestInfo run) {
        if (run.getTags().contains(SCRIPTS_MODE)) {
            server = TestServer.withoutModule();
            server.addRestrictedUser();
            rlock = RlockClient.create(server.restrictedUri(), RlockOptions.defaults());
            assertEquals(RlockOptions.Mode.SCRIPTS, rlock.mode(), "AUTO finds no module");
        } else {
            server = new TestServer();
            rlock = RlockClient.create(server.uri(), RlockOptions.defaults());
        }
        Config config = new Config();
        config.useSingleServer().setAddress(server.address()).setConnectionMinimumIdleSize(2)
                .setSubscriptionConnectionMinimumIdleSize(1);
        redisson = Redisson.create(config);
        rt = Executors.newSingleThreadExecutor();
    }

    @AfterAll
    static void stop() {
        rt.shutdownNow();
        redisson.shutdown();
        rlock.close();
        server.close();
    }

    static String name(String what) {
        return "java:interop:" + what + ":" + System.nanoTime();
    }

    static <T> T onRedissonThread(Callable<T> c) throws Exception {
        return rt.submit(c).get(40, TimeUnit.SECONDS);
    }

    static long ms(long fromNanos, long toNanos) {
        return (toNanos - fromNanos) / 1_000_000;
    }

    long moduleWaiters() {
        return Long.parseLong(server.info("rlock", "rlock_waiters"));
    }

    /**
     * A module waiter (`wait`, already started) is served when Redisson releases
     * (`release`): the delay from the release to the grant, in ms.
     */
    long moduleWaiterServed(CompletableFuture<?> wait, Callable<?> release) throws Exception {
        TestServer.waitUntil(Duration.ofSeconds(10), "the module waiter queued", () -> moduleWaiters() >= 1);
        assertFalse(wait.isDone(), "served before the release");
        long[] done = new long[1];
        CompletableFuture<?> timed = wait.whenComplete((v, e) -> done[0] = System.nanoTime());
        long t0 = System.nanoTime();
        onRedissonThread(release);
        timed.get(10, TimeUnit.SECONDS);
        return ms(t0, done[0]);
    }

    /**
     * A Redisson waiter (`waiter`, run on its own thread: acquires, notes the time, gives
     * back) wakes when the module releases (`release`): the delay in ms. The waiter is
     * released only once it has subscribed to `channel` and gone to sleep on it.
     */
    long redissonWaiterWakes(String channel, Callable<Boolean> waiter, Runnable release) throws Exception {
        long[] done = new long[1];
        CompletableFuture<Boolean> f = CompletableFuture.supplyAsync(() -> {
            try {
                boolean ok = waiter.call();
                done[0] = System.nanoTime();
                return ok;
            } catch (Exception e) {
                throw new RuntimeException(e);
            }
        }, Executors.newSingleThreadExecutor());
        TestServer.waitUntil(Duration.ofSeconds(10), "Redisson subscribed to " + channel,
                () -> server.redis().pubsubNumsub(channel).getOrDefault(channel, 0L) >= 1);
        // Redisson tries once more right after subscribing, then parks on the channel: give
        // that retry time to fail, so that the release below is what wakes it.
        Thread.sleep(100);
        assertFalse(f.isDone(), "the Redisson waiter got through before the release");
        long t0 = System.nanoTime();
        release.run();
        assertTrue(f.get(20, TimeUnit.SECONDS), "the Redisson waiter acquired");
        long delay = ms(t0, done[0]);
        assertTrue(delay < WAKE_LIMIT_MS, "woke after " + delay + " ms: not through pub/sub");
        return delay;
    }

    static void report(String what, long moduleServed, long redissonWoke) {
        System.out.printf("interop %-28s module waiter served in %d ms, Redisson waiter woke in %d ms%n",
                what, moduleServed, redissonWoke);
    }

    // ---- RLock ------------------------------------------------------------------------------

    @Test
    void lock_excludes_and_hands_over_both_ways() throws Exception {
        String n = name("lock");
        RLock r = redisson.getLock(n);
        RlockLock m = rlock.getLock(n);
        assertTrue(onRedissonThread(() -> r.tryLock(0, 30, TimeUnit.SECONDS)));
        assertFalse(m.tryLock(), "Redisson holds it");
        CompletableFuture<Boolean> wait = m.tryLockAsync(30, 30000, TimeUnit.SECONDS, 1);
        long served = moduleWaiterServed(wait, () -> {
            r.unlock();
            return null;
        });
        assertTrue(wait.get() && m.isHeldByThread(1));
        assertFalse(onRedissonThread(() -> r.tryLock()), "the module holds it");
        long woke = redissonWaiterWakes("redisson_lock__channel:{" + n + "}", () -> {
            boolean ok = r.tryLock(30, 30, TimeUnit.SECONDS);
            r.unlock();
            return ok;
        }, () -> m.unlockAsync(1).join());
        report("RLock", served, woke);
        assertFalse(r.isLocked());
    }

    // ---- RReadWriteLock -----------------------------------------------------------------------

    @Test
    void read_write_lock_excludes_shares_and_hands_over_both_ways() throws Exception {
        String n = name("rw");
        RReadWriteLock r = redisson.getReadWriteLock(n);
        RlockReadWriteLock m = rlock.getReadWriteLock(n);
        // Readers share across both.
        assertTrue(onRedissonThread(() -> r.readLock().tryLock(0, 30, TimeUnit.SECONDS)));
        assertTrue(m.readLock().tryLockAsync(1).get());
        assertFalse(m.writeLock().tryLockAsync(2).get(), "readers hold it");
        m.readLock().unlockAsync(1).get();
        // A module writer waits for Redisson's reader.
        CompletableFuture<Boolean> wait = m.writeLock().tryLockAsync(30, 30000, TimeUnit.SECONDS, 2);
        long served = moduleWaiterServed(wait, () -> {
            r.readLock().unlock();
            return null;
        });
        assertTrue(wait.get());
        assertFalse(onRedissonThread(() -> r.readLock().tryLock()), "the module's writer excludes Redisson's reader");
        assertFalse(onRedissonThread(() -> r.writeLock().tryLock()), "and Redisson's writer");
        long woke = redissonWaiterWakes("redisson_rwlock:{" + n + "}", () -> {
            boolean ok = r.writeLock().tryLock(30, 30, TimeUnit.SECONDS);
            r.writeLock().unlock();
            return ok;
        }, () -> m.writeLock().unlockAsync(2).join());
        report("RReadWriteLock", served, woke);
    }

    // ---- RFencedLock --------------------------------------------------------------------------

    @Test
    void fenced_lock_tokens_interleave_strictly_increasing_and_hand_over_both_ways() throws Exception {
        String n = name("fenced");
        RFencedLock r = redisson.getFencedLock(n);
        RlockFencedLock m = rlock.getFencedLock(n);
        List<Long> tokens = new ArrayList<>();
        for (int i = 0; i < 3; i++) {
            tokens.add(onRedissonThread(() -> {
                Long t = r.lockAndGetToken(30, TimeUnit.SECONDS);
                r.unlock();
                return t;
            }));
            tokens.add(m.lockAndGetToken(30, TimeUnit.SECONDS));
            m.unlock();
        }
        for (int i = 1; i < tokens.size(); i++) {
            assertTrue(tokens.get(i) > tokens.get(i - 1), "tokens strictly increase: " + tokens);
        }
        assertNotNull(onRedissonThread(() -> r.tryLockAndGetToken(0, 30, TimeUnit.SECONDS)));
        assertNull(m.tryLockAndGetToken(), "Redisson holds it");
        CompletableFuture<Long> wait = m.tryLockAndGetTokenAsync(30, 30000, TimeUnit.SECONDS, 1);
        long served = moduleWaiterServed(wait, () -> {
            r.unlock();
            return null;
        });
        long handed = wait.get();
        assertTrue(handed > tokens.get(tokens.size() - 1), "a handoff issues a newer token");
        assertEquals(handed, m.getToken());
        long[] redissonToken = new long[1];
        long woke = redissonWaiterWakes("redisson_lock__channel:{" + n + "}", () -> {
            Long t = r.tryLockAndGetToken(30, 30, TimeUnit.SECONDS);
            r.unlock();
            redissonToken[0] = t == null ? -1 : t;
            return t != null;
        }, () -> m.unlockAsync(1).join());
        assertTrue(redissonToken[0] > handed, "Redisson's token after the module's: " + redissonToken[0] + " > " + handed);
        report("RFencedLock", served, woke);
    }

    // ---- RSemaphore ---------------------------------------------------------------------------

    @Test
    void semaphore_counts_shared_permits_and_hands_over_both_ways() throws Exception {
        String n = name("sem");
        RSemaphore r = redisson.getSemaphore(n);
        RlockSemaphore m = rlock.getSemaphore(n);
        assertTrue(m.trySetPermits(1));
        assertFalse(r.trySetPermits(5), "already set by the module");
        assertTrue(r.tryAcquire());
        assertFalse(m.tryAcquire(), "Redisson took the only permit");
        CompletableFuture<Boolean> wait = m.tryAcquireAsync(1, 30, TimeUnit.SECONDS);
        long served = moduleWaiterServed(wait, () -> {
            r.release();
            return null;
        });
        assertTrue(wait.get());
        assertEquals(0, r.availablePermits());
        long woke = redissonWaiterWakes("redisson_sc:{" + n + "}",
                () -> r.tryAcquire(Duration.ofSeconds(30)), m::release);
        r.release();
        assertEquals(1, m.availablePermits());
        report("RSemaphore", served, woke);
    }

    // ---- RPermitExpirableSemaphore ------------------------------------------------------------

    @Test
    void permit_expirable_semaphore_shares_permits_and_hands_over_both_ways() throws Exception {
        String n = name("psem");
        RPermitExpirableSemaphore r = redisson.getPermitExpirableSemaphore(n);
        RlockPermitExpirableSemaphore m = rlock.getPermitExpirableSemaphore(n);
        assertTrue(r.trySetPermits(1));
        String rid = r.tryAcquire(0, 30, TimeUnit.SECONDS);
        assertNotNull(rid);
        assertNull(m.tryAcquire(), "Redisson holds the only permit");
        assertEquals(1, m.acquiredPermits());
        CompletableFuture<String> wait = m.tryAcquireAsync(30, 30, TimeUnit.SECONDS);
        long served = moduleWaiterServed(wait, () -> {
            r.release(rid);
            return null;
        });
        String mid = wait.get();
        assertNotNull(mid);
        assertEquals(0, r.availablePermits());
        long woke = redissonWaiterWakes("redisson_sc:{" + n + "}", () -> {
            String id = r.tryAcquire(30, 30, TimeUnit.SECONDS);
            if (id != null) {
                r.release(id);
            }
            return id != null;
        }, () -> m.release(mid));
        report("RPermitExpirableSemaphore", served, woke);
    }

    // ---- RCountDownLatch ----------------------------------------------------------------------

    @Test
    void countdown_latch_counts_down_together_and_releases_both_ways() throws Exception {
        String n = name("latch");
        RCountDownLatch r = redisson.getCountDownLatch(n);
        RlockCountDownLatch m = rlock.getCountDownLatch(n);
        assertTrue(m.trySetCount(3));
        assertFalse(r.trySetCount(9), "already set by the module");
        assertEquals(3, r.getCount());
        CompletableFuture<Boolean> wait = m.awaitAsync(30, TimeUnit.SECONDS);
        r.countDown();
        m.countDown();
        assertEquals(1, m.getCount());
        long served = moduleWaiterServed(wait, () -> {
            r.countDown();
            return null;
        });
        assertTrue(wait.get());
        // And a Redisson awaiter wakes when the module counts down to zero.
        assertTrue(r.trySetCount(1));
        long woke = redissonWaiterWakes("redisson_countdownlatch__channel__{" + n + "}",
                () -> r.await(30, TimeUnit.SECONDS), m::countDown);
        report("RCountDownLatch", served, woke);
    }
}
