// The proof for Spring Integration users (rlock-spring): two Spring Boot application
// contexts on one module-loaded server, each with the auto-configured RlockClient and
// LockRegistry on Boot's own RedisConnectionFactory (Lettuce, then Jedis), contend through
// executeLocked and LockRegistryLeaderInitiator exactly as they would through
// RedisLockRegistry; the Micrometer binder counts what they did.
package io.rlock.spring;

import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import io.rlock.RlockClient;
import io.rlock.RlockOptions;
import io.rlock.TestServer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.data.redis.connection.RedisConnectionFactory;
import org.springframework.data.redis.core.StringRedisTemplate;
import org.springframework.integration.leader.Context;
import org.springframework.integration.leader.DefaultCandidate;
import org.springframework.integration.support.leader.LockRegistryLeaderInitiator;
import org.springframework.integration.support.locks.DistributedLock;
import org.springframework.integration.support.locks.LockRegistry;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(120)
class LockRegistryAppTest {
    static TestServer server;

    /** The test application: nothing but what Boot and rlock-spring configure. */
    @SpringBootApplication
    static class App {}

    @BeforeAll
    static void start() {
        server = new TestServer();
    }

    @AfterAll
    static void stop() {
        server.close();
    }

    @ParameterizedTest
    @EnumSource(Apps.Driver.class)
    void two_applications_take_turns_through_execute_locked(Apps.Driver driver) throws Exception {
        String counter = "spring:app:counter:" + driver;
        try (ConfigurableApplicationContext a = Apps.start(App.class, server.port, driver);
             ConfigurableApplicationContext b = Apps.start(App.class, server.port, driver)) {
            // Boot's own factory, of the driver asked for, carries rlock: no client of its own.
            for (ConfigurableApplicationContext c : List.of(a, b)) {
                String factory = c.getBean(RedisConnectionFactory.class).getClass().getSimpleName();
                assertTrue(factory.toLowerCase().startsWith(driver.name().toLowerCase()), factory);
                assertInstanceOf(RlockLockRegistry.class, c.getBean(LockRegistry.class));
                // Redisson's replica check, on by default (rlock.replica-sync).
                assertEquals(RlockOptions.REPLICAS_CONNECTED, c.getBean(RlockClient.class).options().replicas());
            }
            AtomicInteger inside = new AtomicInteger();
            AtomicInteger most = new AtomicInteger();
            int perThread = 15;
            List<Thread> threads = new ArrayList<>();
            AtomicReference<Throwable> failure = new AtomicReference<>();
            for (ConfigurableApplicationContext c : List.of(a, b)) {
                @SuppressWarnings("unchecked")
                LockRegistry<DistributedLock> registry = c.getBean(LockRegistry.class);
                StringRedisTemplate redis = new StringRedisTemplate(c.getBean(RedisConnectionFactory.class));
                for (int t = 0; t < 3; t++) {
                    Thread th = new Thread(() -> {
                        try {
                            for (int i = 0; i < perThread; i++) {
                                registry.executeLocked("counter", () -> {
                                    most.accumulateAndGet(inside.incrementAndGet(), Math::max);
                                    // A read-modify-write that loses updates unless exclusive.
                                    String v = redis.opsForValue().get(counter);
                                    redis.opsForValue().set(counter, Integer.toString(v == null ? 1 : Integer.parseInt(v) + 1));
                                    inside.decrementAndGet();
                                });
                            }
                        } catch (Throwable e) {
                            failure.compareAndSet(null, e);
                        }
                    });
                    th.start();
                    threads.add(th);
                }
            }
            for (Thread th : threads) {
                th.join(90_000);
            }
            assertNull(failure.get());
            assertEquals(1, most.get(), "one holder at a time across both applications");
            assertEquals(Integer.toString(2 * 3 * perThread), server.redis().get(counter));
            assertEquals(0, server.redis().exists("rlock-registry:counter"), "the lock is free after");

            // The binder shows what the client counted.
            SimpleMeterRegistry meters = new SimpleMeterRegistry();
            a.getBean(RlockMeterBinder.class).bindTo(meters);
            double acquired = meters.get("rlock.acquisitions").functionCounter().count();
            assertEquals(a.getBean(RlockClient.class).stats().acquisitions(), (long) acquired);
            assertTrue(acquired >= 3 * perThread, "acquisitions " + acquired);
            assertTrue(meters.get("rlock.waits").functionCounter().count() > 0, "some calls waited");
            assertEquals(0.0, meters.get("rlock.locks.lost").functionCounter().count());
        }
    }

    @ParameterizedTest
    @EnumSource(Apps.Driver.class)
    void leadership_passes_to_the_other_application_when_the_leader_stops(Apps.Driver driver) throws Exception {
        ConfigurableApplicationContext a = Apps.start(App.class, server.port, driver);
        ConfigurableApplicationContext b = Apps.start(App.class, server.port, driver);
        AtomicReference<String> leader = new AtomicReference<>();
        AtomicInteger leaders = new AtomicInteger();
        AtomicInteger grants = new AtomicInteger();
        List<LockRegistryLeaderInitiator> initiators = new ArrayList<>();
        try {
            for (String name : List.of("a", "b")) {
                ConfigurableApplicationContext c = name.equals("a") ? a : b;
                LockRegistryLeaderInitiator li = new LockRegistryLeaderInitiator(c.getBean(LockRegistry.class),
                        new DefaultCandidate(name, "leader-" + driver) {
                            @Override
                            public void onGranted(Context ctx) {
                                leaders.incrementAndGet();
                                grants.incrementAndGet();
                                leader.set(name);
                            }

                            @Override
                            public void onRevoked(Context ctx) {
                                leaders.decrementAndGet();
                                leader.compareAndSet(name, null);
                            }
                        });
                li.setHeartBeatMillis(200);
                li.setBusyWaitMillis(50);
                li.start();
                initiators.add(li);
            }
            TestServer.waitUntil(Duration.ofSeconds(20), "a leader", () -> leader.get() != null);
            String first = leader.get();
            // Steady: the leader keeps its lock through its heartbeats' re-entrant tryLock, and
            // the other application never leads beside it.
            steadyFor(Duration.ofSeconds(1), leaders, leader, first);
            assertEquals(1, grants.get());
            LockRegistryLeaderInitiator firstLi = initiators.get(first.equals("a") ? 0 : 1);
            firstLi.stop();
            String other = first.equals("a") ? "b" : "a";
            try {
                TestServer.waitUntil(Duration.ofSeconds(30), "the other application leads", () -> other.equals(leader.get()));
            } catch (AssertionError e) {
                throw new AssertionError(e.getMessage() + "; lock " + server.redis().hgetall("rlock-registry:leader-" + driver)
                        + " pttl " + server.redis().pttl("rlock-registry:leader-" + driver) + " waiters "
                        + server.info("rlock", "rlock_waiters") + " leader " + leader.get() + " first " + first
                        + " a " + a.getBean(RlockClient.class).getId() + " b " + b.getBean(RlockClient.class).getId());
            }
            // (The initiator unlocks before it tells its candidate it was revoked: the count of
            // leaders may read 2 for that instant, so it is checked once the handover is over.)
            TestServer.waitUntil(Duration.ofSeconds(10), "one leader", () -> leaders.get() == 1);
            steadyFor(Duration.ofMillis(600), leaders, leader, other);
            assertEquals(2, grants.get());
        } finally {
            initiators.forEach(LockRegistryLeaderInitiator::stop);
            a.close();
            b.close();
        }
    }

    /** Asserts for `d` that exactly one candidate leads, and that it is `who`. */
    private static void steadyFor(Duration d, AtomicInteger leaders, AtomicReference<String> leader, String who)
            throws InterruptedException {
        long end = System.nanoTime() + d.toNanos();
        while (System.nanoTime() < end) {
            assertEquals(1, leaders.get(), "one leader");
            assertEquals(who, leader.get());
            Thread.sleep(20);
        }
    }
}
