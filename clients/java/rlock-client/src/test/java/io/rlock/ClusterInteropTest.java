// Redisson in cluster mode against the project's 3-master test cluster (clients/java
// tests; design.md 1.5, 6): Redisson's RLock (its Lua scripts routed by its cluster client,
// woken through sharded pub/sub) and the module's lock on one name exclude each other, a
// module waiter is served when Redisson unlocks, and a Redisson waiter wakes when the
// module releases (the module SPUBLISHes in cluster mode). The rlock Java client here talks
// to the node owning the name's slot alone, with blocking waits; its own cluster routing
// is ClusterTest's.
package io.rlock;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

class ClusterInteropTest {
    @Test
    @Timeout(90)
    void redisson_cluster_lock_and_module_lock_exclude_and_hand_over_both_ways() throws Exception {
        ExecutorService rt = Executors.newSingleThreadExecutor();
        try (TestCluster cluster = new TestCluster()) {
            Config config = new Config();
            config.useClusterServers().addNodeAddress(cluster.masters.get(0).address())
                    .setMasterConnectionMinimumIdleSize(1).setSlaveConnectionMinimumIdleSize(0)
                    .setSubscriptionConnectionMinimumIdleSize(1);
            RedissonClient redisson = Redisson.create(config);
            String name = "java:cluster:lock:" + System.nanoTime();
            TestServer node = cluster.ownerOf(name);
            try (RlockClient rlock = RlockClient.create(node.uri(), RlockOptions.defaults()
                    .withWaitMode(RlockOptions.WaitMode.BLOCKING))) {
                RLock r = redisson.getLock(name);
                RlockLock m = rlock.getLock(name);

                assertTrue(rt.submit(() -> r.tryLock(0, 30, TimeUnit.SECONDS)).get());
                assertFalse(m.tryLock(), "Redisson holds it");
                CompletableFuture<Boolean> wait = m.tryLockAsync(30, 30000, TimeUnit.SECONDS, 1);
                TestServer.waitUntil(Duration.ofSeconds(10), "module waiter blocked",
                        () -> Long.parseLong(node.info("clients", "blocked_clients")) == 1);
                long t0 = System.nanoTime();
                rt.submit(() -> r.unlock()).get();
                assertTrue(wait.get(10, TimeUnit.SECONDS));
                long served = (System.nanoTime() - t0) / 1_000_000;
                assertFalse(rt.submit(() -> r.tryLock()).get(), "the module holds it");

                String channel = "redisson_lock__channel:{" + name + "}";
                long[] done = new long[1];
                CompletableFuture<Boolean> rw = CompletableFuture.supplyAsync(() -> {
                    try {
                        boolean ok = r.tryLock(30, 30, TimeUnit.SECONDS);
                        done[0] = System.nanoTime();
                        r.unlock();
                        return ok;
                    } catch (InterruptedException e) {
                        throw new RuntimeException(e);
                    }
                }, Executors.newSingleThreadExecutor());
                TestServer.waitUntil(Duration.ofSeconds(10), "Redisson subscribed (sharded) to " + channel, () -> {
                    List<?> n = (List<?>) node.call("PUBSUB", "SHARDNUMSUB", channel);
                    List<?> plain = (List<?>) node.call("PUBSUB", "NUMSUB", channel);
                    return Sync.asLong(n.get(1)) + Sync.asLong(plain.get(1)) >= 1;
                });
                Thread.sleep(100); // let Redisson's retry after subscribing fail first
                assertFalse(rw.isDone());
                long t1 = System.nanoTime();
                m.unlockAsync(1).join();
                assertTrue(rw.get(20, TimeUnit.SECONDS));
                long woke = (done[0] - t1) / 1_000_000;
                assertTrue(woke < 2000, "Redisson woke after " + woke + " ms: not through pub/sub");
                System.out.printf("interop %-28s module waiter served in %d ms, Redisson waiter woke in %d ms%n",
                        "RLock (cluster, 3 masters)", served, woke);
            } finally {
                redisson.shutdown();
            }
        } finally {
            rt.shutdownNow();
        }
    }
}
