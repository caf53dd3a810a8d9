// Scripts mode on a real 3-master Redis Cluster without the module (clients/java tests,
// issue 39; docs/scripts-mode.md): two cluster clients logged in as a managed service's
// restricted user, AUTO finding no module; every primitive's waiter in one client woken by
// the other client's release message, far before any lease end, on names spread over the
// three nodes (scripts routed to their key's node, SPUBLISH, SSUBSCRIBE on the key's node,
// one notification connection per node); a waiter whose pub/sub connection was killed
// subscribed again and woken; a script that must not run twice not written again after
// its node connection broke; a waiter following its channel through classic resharding; on
// a cluster that answers the probe as one without sharded pub/sub (before Redis 7), PUBLISH
// and classic SUBSCRIBE; the real Redisson 4.7 in cluster mode and rlock waking each other.
// One cluster for the class.
package io.rlock;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(90)
class ScriptsClusterTest {
    static TestCluster cluster;
    /** The waiting client and the releasing one. */
    static RlockClient a;
    static RlockClient b;
    /** Every wake-up here is a message: the holders' leases are 30 s, the waits 30 s. */
    static final long WAKE_LIMIT_MS = 2000;

    @BeforeAll
    static void start() {
        cluster = new TestCluster(false);
        cluster.masters.forEach(TestServer::addRestrictedUser);
        a = RlockClient.createCluster(List.of(cluster.masters.get(0).restrictedUri()), RlockOptions.defaults());
        b = RlockClient.createCluster(List.of(cluster.masters.get(1).restrictedUri()), RlockOptions.defaults());
    }

    @AfterAll
    static void stop() {
        if (a != null) {
            a.close();
        }
        if (b != null) {
            b.close();
        }
        cluster.close();
    }

    /** `n` names whose slots fall on every master in turn. */
    static List<String> spread(String what, int n) {
        List<String> names = new ArrayList<>();
        Set<Integer> ports = new HashSet<>();
        for (int i = 0; names.size() < n; i++) {
            String name = "java:scripts-cluster:" + what + ":" + System.nanoTime() + ":" + i;
            if (ports.add(cluster.ownerOf(name).port)) {
                names.add(name);
                if (ports.size() == 3) {
                    ports.clear();
                }
            }
        }
        return names;
    }

    static long shardSubscribers(String channel) {
        List<?> n = (List<?>) cluster.ownerOf(channel).call("PUBSUB", "SHARDNUMSUB", channel);
        return Sync.asLong(n.get(1));
    }

    static long ms(long fromNanos) {
        return (System.nanoTime() - fromNanos) / 1_000_000;
    }

    /** `f` (a's waiter on `channel`) is asleep, then completes within the wake limit after `release`. */
    static <T> T wokenBy(CompletableFuture<T> f, String channel, Runnable release) throws Exception {
        TestServer.waitUntil(Duration.ofSeconds(5), "the waiter subscribed (sharded) on its key's node",
                () -> shardSubscribers(channel) >= 1);
        TestServer.waitUntil(Duration.ofSeconds(5), "the waiter asleep", () -> a.scriptsAsleep() >= 1);
        assertFalse(f.isDone(), "served before the release");
        long t0 = System.nanoTime();
        release.run();
        T v = f.get(10, TimeUnit.SECONDS);
        long woke = ms(t0);
        assertTrue(woke < WAKE_LIMIT_MS, "woke after " + woke + " ms: not by the message");
        System.out.printf("scripts cluster: %s's waiter served %d ms after the release began%n",
                channel.substring(0, channel.indexOf(':')), woke);
        return v;
    }

    static long spublishCalls(TestServer node) {
        String v = node.info("commandstats", "cmdstat_spublish");
        return v == null ? 0 : Long.parseLong(v.split(",")[0].substring("calls=".length()));
    }

    /** MOVED replies the cluster gave (INFO errorstats): a command sent to a node that does not serve its key. */
    static long moved() {
        long n = 0;
        for (TestServer node : cluster.masters) {
            String v = node.info("errorstats", "errorstat_MOVED");
            n += v == null ? 0 : Long.parseLong(v.substring("count=".length()));
        }
        return n;
    }

    @Test
    void every_primitive_waits_on_its_keys_node_and_wakes_on_the_other_clients_release() throws Exception {
        assertEquals(RlockOptions.Mode.SCRIPTS, a.mode(), "AUTO finds no module on the cluster");
        List<String> names = spread("prim", 6);
        long spublished = cluster.masters.stream().mapToLong(ScriptsClusterTest::spublishCalls).sum();
        long movedBefore = moved();

        String n = names.get(0);
        RlockLock bl = b.getLock(n);
        assertTrue(bl.tryLockAsync(-1, 30_000, TimeUnit.MILLISECONDS, 1).get());
        assertEquals("1", cluster.ownerOf(n).redis().hget(n, bl.ownerOf(1)), "Redisson's hash, on the key's node");
        CompletableFuture<Boolean> lw = a.getLock(n).tryLockAsync(30, 30, TimeUnit.SECONDS, 1);
        assertTrue(wokenBy(lw, Scripts.lockChannel(n), () -> bl.unlockAsync(1).join()));
        a.getLock(n).unlockAsync(1).get();

        n = names.get(1);
        RlockFencedLock bf = b.getFencedLock(n);
        Long t1 = bf.tryLockAndGetTokenAsync(-1, 30_000, TimeUnit.MILLISECONDS, 1).get();
        assertNotNull(t1);
        CompletableFuture<Long> fw = a.getFencedLock(n).tryLockAndGetTokenAsync(30, 30, TimeUnit.SECONDS, 1);
        assertTrue(wokenBy(fw, Scripts.lockChannel(n), () -> bf.unlockAsync(1).join()) > t1);
        a.getFencedLock(n).unlockAsync(1).get();

        n = names.get(2);
        RlockReadWriteLock brw = b.getReadWriteLock(n);
        assertTrue(brw.readLock().tryLockAsync(-1, 30_000, TimeUnit.MILLISECONDS, 1).get());
        CompletableFuture<Boolean> ww = a.getReadWriteLock(n).writeLock().tryLockAsync(30, 30, TimeUnit.SECONDS, 1);
        assertTrue(wokenBy(ww, Scripts.rwChannel(n), () -> brw.readLock().unlockAsync(1).join()));
        CompletableFuture<Boolean> rw = b.getReadWriteLock(n).readLock().tryLockAsync(30, 30, TimeUnit.SECONDS, 1);
        TestServer.waitUntil(Duration.ofSeconds(5), "b's reader asleep", () -> b.scriptsAsleep() >= 1);
        a.getReadWriteLock(n).writeLock().unlockAsync(1).get();
        assertTrue(rw.get(WAKE_LIMIT_MS, TimeUnit.MILLISECONDS), "a's write unlock woke b's reader");
        b.getReadWriteLock(n).readLock().unlockAsync(1).get();

        n = names.get(3);
        RlockSemaphore bs = b.getSemaphore(n);
        assertTrue(bs.trySetPermits(1));
        assertTrue(bs.tryAcquire());
        CompletableFuture<Boolean> sw = a.getSemaphore(n).tryAcquireAsync(1, 30, TimeUnit.SECONDS);
        assertTrue(wokenBy(sw, Scripts.semaphoreChannel(n), () -> bs.release(1)));
        assertEquals(0, bs.availablePermits());

        n = names.get(4);
        RlockPermitExpirableSemaphore bp = b.getPermitExpirableSemaphore(n);
        assertTrue(bp.trySetPermits(1));
        String id = bp.tryAcquire(-1, 30_000, TimeUnit.MILLISECONDS);
        assertNotNull(id);
        CompletableFuture<String> pw = a.getPermitExpirableSemaphore(n).tryAcquireAsync(30, 30_000, TimeUnit.SECONDS);
        String second = wokenBy(pw, Scripts.semaphoreChannel(n), () -> bp.release(id));
        assertNotNull(second);
        assertTrue(a.getPermitExpirableSemaphore(n).tryRelease(second));

        n = names.get(5);
        RlockCountDownLatch bc = b.getCountDownLatch(n);
        assertTrue(bc.trySetCount(1));
        CompletableFuture<Boolean> cw = a.getCountDownLatch(n).awaitAsync(30, TimeUnit.SECONDS);
        assertTrue(wokenBy(cw, Scripts.latchChannel(n), bc::countDown));

        long now = cluster.masters.stream().mapToLong(ScriptsClusterTest::spublishCalls).sum();
        assertTrue(now - spublished >= 6, "the scripts SPUBLISH on a cluster with sharded pub/sub: " + (now - spublished));
        assertEquals(movedBefore, moved(), "every script went to its key's node at once");
        for (TestServer node : cluster.masters) {
            long subs = node.redis().clientList().lines()
                    .filter(l -> l.contains(" name=" + RlockClient.NOTIFICATION_CONNECTION_NAME + " ")).count();
            assertTrue(subs <= 2, subs + " notification connections on a node: one per client at most");
        }
        TestServer.waitUntil(Duration.ofSeconds(2), "no wait left", () -> a.scriptWaiting() == 0 && b.scriptWaiting() == 0);
    }

    @Test
    void a_waiter_whose_pubsub_connection_was_killed_subscribes_again_and_wakes_on_the_message() throws Exception {
        String n = spread("resub", 1).get(0);
        String channel = Scripts.lockChannel(n);
        TestServer node = cluster.ownerOf(n);
        RlockLock bl = b.getLock(n);
        assertTrue(bl.tryLockAsync(-1, 30_000, TimeUnit.MILLISECONDS, 1).get());
        CompletableFuture<Boolean> w = a.getLock(n).tryLockAsync(30, 30, TimeUnit.SECONDS, 1);
        TestServer.waitUntil(Duration.ofSeconds(5), "subscribed", () -> shardSubscribers(channel) >= 1);
        node.call("CLIENT", "KILL", "TYPE", "pubsub");
        // Lettuce connects again and subscribes the shard channel again; the client's waiters
        // try once more meanwhile (a message may have been lost) and sleep again.
        TestServer.waitUntil(Duration.ofSeconds(10), "subscribed again", () -> shardSubscribers(channel) >= 1);
        assertTrue(wokenBy(w, channel, () -> bl.unlockAsync(1).join()));
        a.getLock(n).unlockAsync(1).get();
    }

    @Test
    void an_acquire_written_before_its_connection_broke_is_not_written_again() throws Exception {
        String n = spread("once", 1).get(0);
        TestServer node = cluster.ownerOf(n);
        // A client of its own, so that no other script runs on its connections meanwhile.
        try (RlockClient c = RlockClient.createCluster(List.of(cluster.masters.get(0).restrictedUri()),
                RlockOptions.defaults().withMode(RlockOptions.Mode.SCRIPTS))) {
            once(c, n, node);
        }
    }

    private static void once(RlockClient c, String n, TestServer node) throws Exception {
        RlockLock lock = c.getLock(n);
        assertFalse(lock.isLocked()); // the node connection is up
        // The node holds writes (CLIENT PAUSE WRITE postpones scripts unrun), the acquire is
        // written and held there, then the connection is killed: the script never ran. Lettuce
        // would write it again on the new connection; the client fails it instead.
        node.call("CLIENT", "PAUSE", "5000", "WRITE");
        try {
            CompletableFuture<Boolean> acquire = lock.tryLockAsync(1);
            // Held: a connection of the client blocked (flags b) on an EVALSHA.
            TestServer.waitUntil(Duration.ofSeconds(5), "the acquire held by the pause", () -> node.redis().clientList()
                    .lines().anyMatch(l -> l.contains(" name=" + RlockClient.CONNECTION_NAME + " ")
                            && l.contains(" flags=b ") && l.contains(" cmd=evalsha ")));
            node.call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes");
            ExecutionException e = assertThrows(ExecutionException.class, () -> acquire.get(10, TimeUnit.SECONDS));
            assertInstanceOf(RlockOutcomeUnknownException.class, Wire.unwrap(e), String.valueOf(e.getCause()));
        } finally {
            node.call("CLIENT", "UNPAUSE");
        }
        // The connection is back (this read went on it) and nothing wrote the acquire again.
        assertFalse(lock.isLocked());
        assertEquals(0L, node.redis().exists(n));
        assertTrue(lock.tryLockAsync(1).get(), "the next acquire goes");
        lock.unlockAsync(1).get();
    }

    @Test
    void a_waiter_follows_its_channel_when_the_slot_moves() throws Exception {
        String n = spread("reshard", 1).get(0);
        String channel = Scripts.lockChannel(n);
        RlockLock bl = b.getLock(n);
        assertTrue(bl.tryLockAsync(-1, 30_000, TimeUnit.MILLISECONDS, 1).get());
        CompletableFuture<Boolean> w = a.getLock(n).tryLockAsync(30, 30, TimeUnit.SECONDS, 1);
        TestServer.waitUntil(Duration.ofSeconds(5), "the waiter asleep", () -> a.scriptsAsleep() >= 1);
        TestServer src = cluster.ownerOf(n), dst = cluster.other(src);
        int slot = cluster.slot(n);
        // Classic resharding: the old owner drops the slot's shard subscriptions when it
        // gives the slot up; the waiter subscribes again on the new owner.
        cluster.beginMigration(slot, src, dst);
        cluster.finishMigration(slot, src, dst);
        assertSame(dst, cluster.ownerOf(n));
        assertTrue(wokenBy(w, channel, () -> bl.unlockAsync(1).join()));
        a.getLock(n).unlockAsync(1).get();
    }

    /** A cluster transport that answers the probe as a cluster without sharded pub/sub (before Redis 7). */
    static Transport withoutShardedPubSub(Transport t) {
        return new Transport() {
            public CompletableFuture<Object> send(List<String> args) { return t.send(args); }
            public CompletableFuture<Object> sendBytes(List<byte[]> args) { return t.sendBytes(args); }
            public CompletableFuture<Object> sendOnce(List<String> args) { return t.sendOnce(args); }
            public CompletableFuture<Object> sendBytesOnce(List<byte[]> args) { return t.sendBytesOnce(args); }
            public void listen(java.util.function.BiConsumer<String, String> l) { t.listen(l); }
            public CompletableFuture<Void> subscribe(String channel) { return t.subscribe(channel); }
            public void unsubscribe(String channel) { t.unsubscribe(channel); }
            public void onReconnect(Runnable hook) { t.onReconnect(hook); }
            public Dedicated dedicated() { return t.dedicated(); }
            public String nodeOf(String key) { return t.nodeOf(key); }
            public CompletableFuture<Object> sendTicket(String channel, List<String> args) { return t.sendTicket(channel, args); }
            public void onChannelDropped(java.util.function.Consumer<String> hook) { t.onChannelDropped(hook); }
            public CompletableFuture<Void> relearn() { return t.relearn(); }
            public boolean cluster() { return t.cluster(); }
            public void shardedPubSub(boolean has) { t.shardedPubSub(has); }
            public void close() { t.close(); }

            public CompletableFuture<Object> sendTo(String key, List<String> args) {
                return args.get(0).equals("SPUBLISH")
                        ? CompletableFuture.failedFuture(new io.lettuce.core.RedisCommandExecutionException(
                                "ERR unknown command 'SPUBLISH', with args beginning with: "))
                        : t.sendTo(key, args);
            }
        };
    }

    static long plainSubscribers(String channel) {
        long n = 0;
        for (TestServer node : cluster.masters) {
            n += node.redis().pubsubNumsub(channel).getOrDefault(channel, 0L);
        }
        return n;
    }

    @Test
    void without_sharded_pub_sub_the_scripts_publish_and_waiters_subscribe_classic() throws Exception {
        io.lettuce.core.cluster.RedisClusterClient redis =
                io.lettuce.core.cluster.RedisClusterClient.create(List.of(cluster.masters.get(0).restrictedUri()));
        try (RlockClient c = RlockClient.create(withoutShardedPubSub(new LettuceClusterTransport(redis, true, null)),
                RlockOptions.defaults().withMode(RlockOptions.Mode.SCRIPTS))) {
            String n = spread("classic", 1).get(0);
            String channel = Scripts.lockChannel(n);
            RlockLock lock = c.getLock(n);
            assertTrue(lock.tryLockAsync(-1, 30_000, TimeUnit.MILLISECONDS, 1).get());
            CompletableFuture<Boolean> w = lock.tryLockAsync(30, 30, TimeUnit.SECONDS, 2);
            TestServer.waitUntil(Duration.ofSeconds(5), "subscribed (classic)", () -> plainSubscribers(channel) >= 1);
            TestServer.waitUntil(Duration.ofSeconds(5), "the waiter asleep", () -> c.scriptsAsleep() >= 1);
            assertEquals(0, shardSubscribers(channel));
            long t0 = System.nanoTime();
            lock.unlockAsync(1).get();
            assertTrue(w.get(10, TimeUnit.SECONDS));
            assertTrue(ms(t0) < WAKE_LIMIT_MS, "woke after " + ms(t0) + " ms: not by the message");
            lock.unlockAsync(2).get();
            TestServer.waitUntil(Duration.ofSeconds(2), "unsubscribed", () -> plainSubscribers(channel) == 0);
        }
    }

    @Test
    void redisson_in_cluster_mode_and_rlock_wake_each_other() throws Exception {
        ExecutorService rt = Executors.newSingleThreadExecutor();
        Config config = new Config();
        config.useClusterServers().addNodeAddress(cluster.masters.get(0).address())
                .setMasterConnectionMinimumIdleSize(1).setSlaveConnectionMinimumIdleSize(0)
                .setSubscriptionConnectionMinimumIdleSize(1);
        RedissonClient redisson = Redisson.create(config);
        try {
            for (String n : spread("redisson", 2)) {
                RLock r = redisson.getLock(n);
                RlockLock m = a.getLock(n);
                String channel = Scripts.lockChannel(n);
                // Redisson waits; rlock's release wakes it.
                assertTrue(m.tryLockAsync(-1, 30_000, TimeUnit.MILLISECONDS, 1).get());
                long[] got = new long[1];
                CompletableFuture<Boolean> rw = CompletableFuture.supplyAsync(() -> {
                    try {
                        boolean ok = r.tryLock(30, 30, TimeUnit.SECONDS);
                        got[0] = System.nanoTime();
                        return ok;
                    } catch (InterruptedException e) {
                        throw new RuntimeException(e);
                    }
                }, rt);
                TestServer.waitUntil(Duration.ofSeconds(10), "Redisson subscribed (sharded)",
                        () -> shardSubscribers(channel) >= 1);
                assertFalse(rw.isDone());
                long t0 = System.nanoTime();
                m.unlockAsync(1).get();
                assertTrue(rw.get(10, TimeUnit.SECONDS));
                long redissonWoke = (got[0] - t0) / 1_000_000;
                assertTrue(redissonWoke < WAKE_LIMIT_MS, "Redisson woke after " + redissonWoke + " ms");
                // rlock waits behind Redisson's hold; Redisson's unlock wakes it.
                CompletableFuture<Boolean> mw = m.tryLockAsync(30, 30, TimeUnit.SECONDS, 1);
                assertTrue(wokenBy(mw, channel, () -> {
                    try {
                        rt.submit(() -> r.unlock()).get();
                    } catch (Exception e) {
                        throw new RuntimeException(e);
                    }
                }));
                m.unlockAsync(1).get();
                System.out.printf("scripts cluster interop: Redisson's waiter woke %d ms after rlock's release%n",
                        redissonWoke);
            }
        } finally {
            redisson.shutdown();
            rt.shutdownNow();
        }
    }
}
