// rlock-spring on a Redis Cluster (issue 41): a Spring Boot application whose connection
// factory is a Lettuce cluster factory gets an RlockClient on that factory's own cluster
// client (SpringClients), so its LockRegistry's locks live on their slots' masters and its
// waits queue there; a Jedis cluster factory is refused at start-up with a clear reason.
// A real 3-master module-loaded cluster (io.rlock.TestCluster), two application contexts.
package io.rlock.spring;

import io.rlock.RlockClient;
import io.rlock.TestCluster;
import io.rlock.TestServer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.ConfigurableApplicationContext;
import org.springframework.integration.support.locks.DistributedLock;
import org.springframework.integration.support.locks.LockRegistry;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Collectors;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(120)
class SpringClusterTest {
    static TestCluster cluster;

    @SpringBootApplication
    static class App {}

    @BeforeAll
    static void start() {
        cluster = new TestCluster();
    }

    @AfterAll
    static void stop() {
        cluster.close();
    }

    static String nodes() {
        return cluster.masters.stream().map(m -> "127.0.0.1:" + m.port).collect(Collectors.joining(","));
    }

    static ConfigurableApplicationContext app(Apps.Driver driver) {
        return Apps.start(App.class, cluster.masters.get(0).port, driver, "spring.data.redis.cluster.nodes=" + nodes());
    }

    /** A lock key of the registry per master: `registry:<key>` lands on each node once. */
    static List<String> keyPerNode() {
        Map<Integer, String> byPort = new ConcurrentHashMap<>();
        for (int i = 0; byPort.size() < cluster.masters.size() && i < 10_000; i++) {
            String k = "spring-cluster-" + i;
            byPort.putIfAbsent(cluster.ownerOf("rlock-registry:" + k).port, k);
        }
        assertEquals(cluster.masters.size(), byPort.size());
        return new ArrayList<>(byPort.values());
    }

    static long waiters(TestServer node) {
        return Long.parseLong(node.info("rlock", "rlock_waiters"));
    }

    @Test
    void a_lettuce_cluster_factory_routes_every_lock_to_its_node_and_waits_there() throws Exception {
        List<String> keys = keyPerNode();
        try (ConfigurableApplicationContext a = app(Apps.Driver.LETTUCE);
             ConfigurableApplicationContext b = app(Apps.Driver.LETTUCE)) {
            @SuppressWarnings("unchecked")
            LockRegistry<DistributedLock> ra = a.getBean(LockRegistry.class);
            @SuppressWarnings("unchecked")
            LockRegistry<DistributedLock> rb = b.getBean(LockRegistry.class);
            for (String k : keys) {
                String name = "rlock-registry:" + k;
                TestServer node = cluster.ownerOf(name);
                DistributedLock held = ra.obtain(k);
                held.lock();
                // Held on the slot's own master, in Redisson's layout.
                assertEquals(1, node.redis().exists(name));
                assertTrue(node.redis().hkeys(name).get(0).startsWith(a.getBean(RlockClient.class).getId() + ":"));
                // The other application's wait queues on that node, blocking no connection.
                long base = waiters(node);
                AtomicReference<Boolean> got = new AtomicReference<>();
                Thread w = new Thread(() -> {
                    DistributedLock l = rb.obtain(k);
                    try {
                        boolean ok = l.tryLock(30, TimeUnit.SECONDS);
                        got.set(ok);
                        if (ok) {
                            l.unlock();
                        }
                    } catch (InterruptedException e) {
                        got.set(false);
                    }
                });
                w.start();
                TestServer.waitUntil(Duration.ofSeconds(10), "b's waiter queued on " + node.port, () -> waiters(node) == base + 1);
                assertEquals("0", node.info("clients", "blocked_clients"), "a ticket, not a blocked connection");
                held.unlock();
                w.join(30_000);
                assertEquals(Boolean.TRUE, got.get(), "b was handed the lock on " + node.port);
                assertEquals(0, node.redis().exists(name));
            }
            // Both applications through executeLocked on every node's key: one holder at a time per key.
            Map<String, AtomicInteger> inside = new ConcurrentHashMap<>();
            AtomicInteger overlaps = new AtomicInteger();
            AtomicInteger runs = new AtomicInteger();
            AtomicReference<Throwable> failure = new AtomicReference<>();
            List<Thread> threads = new ArrayList<>();
            for (LockRegistry<DistributedLock> r : List.of(ra, rb)) {
                for (String k : keys) {
                    Thread t = new Thread(() -> {
                        try {
                            for (int i = 0; i < 5; i++) {
                                r.executeLocked(k, () -> {
                                    if (inside.computeIfAbsent(k, x -> new AtomicInteger()).incrementAndGet() != 1) {
                                        overlaps.incrementAndGet();
                                    }
                                    runs.incrementAndGet();
                                    inside.get(k).decrementAndGet();
                                });
                            }
                        } catch (Throwable e) {
                            failure.compareAndSet(null, e);
                        }
                    });
                    t.start();
                    threads.add(t);
                }
            }
            for (Thread t : threads) {
                t.join(60_000);
            }
            assertNull(failure.get());
            assertEquals(0, overlaps.get());
            assertEquals(2 * keys.size() * 5, runs.get());
        }
    }

    @Test
    void a_jedis_cluster_factory_is_refused_at_start_up_with_the_reason() {
        Exception e = assertThrows(Exception.class, () -> app(Apps.Driver.JEDIS).close());
        String messages = "";
        for (Throwable c = e; c != null; c = c.getCause()) {
            messages += c.getMessage() + "\n";
        }
        assertTrue(messages.contains("cannot run on a Jedis connection factory in cluster mode"), messages);
    }
}
