// A mixed fleet stays live (clients/java tests; design.md 1.8, issue 39 item 5): the real
// Redisson's RLock.tryLock against two rlock threads looping lock / 2 ms / unlock on the
// same name, on one module-loaded server. Before script-side waiters got turns, Redisson's
// waiter (woken only by an unlock message or at the lease it was told) did not get in
// within 4 s while rlock made over a thousand acquisitions; now it gets in within about one
// rlock.script-waiter-window-ms plus one hold each time.
package io.rlock;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.Lock;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(120)
class MixedFleetTest {
    static TestServer server;
    static RlockClient rlock;
    static RedissonClient redisson;

    @BeforeAll
    static void start() {
        server = new TestServer();
        rlock = RlockClient.create(server.uri(), RlockOptions.defaults());
        Config config = new Config();
        config.useSingleServer().setAddress(server.address());
        redisson = Redisson.create(config);
    }

    @AfterAll
    static void stop() {
        redisson.shutdown();
        rlock.close();
        server.close();
    }

    @Test
    void aRedissonWaiterBesideTwoLoopingRlockThreadsGetsInWithinTheBound() throws Exception {
        String name = "java:mixed:" + System.nanoTime();
        AtomicBoolean stop = new AtomicBoolean();
        AtomicLong moduleAcquisitions = new AtomicLong();
        List<Thread> loopers = new ArrayList<>();
        for (int i = 0; i < 2; i++) {
            Thread t = new Thread(() -> {
                Lock lock = rlock.getLock(name);
                while (!stop.get()) {
                    lock.lock();
                    try {
                        moduleAcquisitions.incrementAndGet();
                        Thread.sleep(2);
                    } catch (InterruptedException e) {
                        return;
                    } finally {
                        lock.unlock();
                    }
                }
            });
            t.setDaemon(true);
            t.start();
            loopers.add(t);
        }
        List<Long> waits = new ArrayList<>();
        try {
            TestServer.waitUntil(java.time.Duration.ofSeconds(30), "rlock threads looping",
                    () -> moduleAcquisitions.get() > 20);
            RLock java = redisson.getLock(name);
            for (int n = 0; n < 20; n++) {
                long t0 = System.nanoTime();
                boolean got = java.tryLock(4, 30, TimeUnit.SECONDS);
                assertTrue(got, "Redisson did not get the lock within 4 s (attempt " + n + "; turns "
                        + server.info("rlock", "rlock_script_turns") + ", handoffs "
                        + server.info("rlock", "rlock_handoffs") + ", releases "
                        + server.info("rlock", "rlock_releases") + ")");
                waits.add((System.nanoTime() - t0) / 1_000_000);
                Thread.sleep(2);
                java.unlock();
                Thread.sleep(10);
            }
        } finally {
            stop.set(true);
            for (Thread t : loopers) {
                t.join(5000);
            }
        }
        Collections.sort(waits);
        long worst = waits.get(waits.size() - 1);
        System.out.println("Redisson tryLock beside two looping rlock threads, 20 attempts: median "
                + waits.get(waits.size() / 2) + " ms, worst " + worst + " ms; rlock acquisitions "
                + moduleAcquisitions.get() + ", turns " + server.info("rlock", "rlock_script_turns"));
        // design.md 1.8's bound is one window (50 ms) plus one hold plus the wake-up, which
        // must fit in the grace (10 ms); a JVM woken late on a loaded machine misses that
        // turn and takes a later one, so the median is asserted with room, and every
        // attempt got in within tryLock's 4 s above (none did before turns).
        long median = waits.get(waits.size() / 2);
        assertTrue(median < 1000, "median wait " + median + " ms");
        assertTrue(moduleAcquisitions.get() > 40, "the rlock threads kept going");
    }
}
