// The Java client on a real 3-master Redis Cluster (clients/java tests; one cluster for the
// class): every primitive routed to its key's node and waiting there (tickets heard with
// SSUBSCRIBE), one notification connection per node however many wait, and waiters that
// follow their key when the slot moves: classic resharding (MIGRATE, then SETSLOT NODE) for
// two queued tickets and for a blocked wait, and Valkey 9's atomic slot migration (CLUSTER
// MIGRATESLOTS; skipped on other servers) for two queued tickets, each served in turn on
// the new owner; a multi-lock over keys on every node; two clients waiting on one key, each
// on its own tagged channel (NOTIFY) of the key's slot.
package io.rlock;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(90)
class ClusterTest {
    static TestCluster cluster;
    static RlockClient rlock;

    @BeforeAll
    static void start() {
        cluster = new TestCluster();
        rlock = RlockClient.createCluster(cluster.masters.get(0).address());
    }

    @AfterAll
    static void stop() {
        if (rlock != null) {
            rlock.close();
        }
        cluster.close();
    }

    static long waiters(TestServer node) {
        return Long.parseLong(node.info("rlock", "rlock_waiters"));
    }

    /** `n` names whose slots fall on every master in turn. */
    static List<String> spread(String what, int n) {
        List<String> names = new ArrayList<>();
        Set<Integer> ports = new HashSet<>();
        for (int i = 0; names.size() < n; i++) {
            String name = "java:cluster:" + what + ":" + System.nanoTime() + ":" + i;
            int port = cluster.ownerOf(name).port;
            if (ports.add(port) || ports.size() == 3) {
                names.add(name);
                if (ports.size() == 3) {
                    ports.clear();
                }
            }
        }
        return names;
    }

    /** How many connections `node` has named `name` (CLIENT LIST). */
    static long named(TestServer node, String name) {
        return node.redis().clientList().lines().filter(l -> l.contains(" name=" + name + " ")).count();
    }

    @Test
    void every_primitive_waits_and_is_served_on_its_keys_node() throws Exception {
        assertTrue(rlock.capabilities().tickets(), "the cluster's module queues tickets: " + rlock.capabilities());
        for (String name : spread("prim", 3)) {
            TestServer node = cluster.ownerOf(name);
            long base = waiters(node);

            RlockLock lock = rlock.getLock(name + ":lock");
            assertTrue(lock.tryLockAsync(1).get());
            assertFalse(lock.tryLockAsync(2).get());
            TestServer lockNode = cluster.ownerOf(name + ":lock");
            long lockBase = waiters(lockNode);
            CompletableFuture<Boolean> w = lock.tryLockAsync(10, -1, TimeUnit.SECONDS, 2);
            TestServer.waitUntil(Duration.ofSeconds(5), "lock waiter queued", () -> waiters(lockNode) == lockBase + 1);
            lock.unlockAsync(1).get();
            assertTrue(w.get(5, TimeUnit.SECONDS));
            assertEquals("1", lockNode.redis().hget(name + ":lock", lock.ownerOf(2)));
            lock.unlockAsync(2).get();

            // The other primitives on `name` itself (its node: `node`).
            RlockFencedLock fenced = rlock.getFencedLock(name);
            Long t1 = fenced.tryLockAndGetToken();
            CompletableFuture<Long> fw = fenced.tryLockAndGetTokenAsync(10, -1, TimeUnit.SECONDS, 99);
            TestServer.waitUntil(Duration.ofSeconds(5), "fenced waiter queued", () -> waiters(node) == base + 1);
            fenced.unlock();
            assertTrue(fw.get(5, TimeUnit.SECONDS) > t1);
            fenced.unlockAsync(99).get();

            RlockReadWriteLock rw = rlock.getReadWriteLock(name + ":rw{" + name + "}");
            assertTrue(rw.readLock().tryLockAsync(1).get());
            CompletableFuture<Boolean> writer = rw.writeLock().tryLockAsync(10, -1, TimeUnit.SECONDS, 3);
            TestServer.waitUntil(Duration.ofSeconds(5), "writer queued", () -> waiters(node) == base + 1);
            rw.readLock().unlockAsync(1).get();
            assertTrue(writer.get(5, TimeUnit.SECONDS));
            rw.writeLock().unlockAsync(3).get();

            RlockSemaphore sem = rlock.getSemaphore(name + ":sem{" + name + "}");
            assertTrue(sem.trySetPermits(1));
            sem.acquire(1);
            CompletableFuture<Boolean> sw = sem.tryAcquireAsync(1, 10, TimeUnit.SECONDS);
            TestServer.waitUntil(Duration.ofSeconds(5), "semaphore waiter queued", () -> waiters(node) == base + 1);
            sem.release(1);
            assertTrue(sw.get(5, TimeUnit.SECONDS));
            sem.release(1);

            RlockPermitExpirableSemaphore psem = rlock.getPermitExpirableSemaphore(name + ":psem{" + name + "}");
            assertTrue(psem.trySetPermits(1));
            String id = psem.tryAcquire(0, 10, TimeUnit.SECONDS);
            assertNotNull(id);
            CompletableFuture<String> pw = CompletableFuture.supplyAsync(() -> {
                try {
                    return psem.tryAcquire(10, 10, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    throw new IllegalStateException(e);
                }
            });
            TestServer.waitUntil(Duration.ofSeconds(5), "permit waiter queued", () -> waiters(node) == base + 1);
            psem.release(id);
            String next = pw.get(5, TimeUnit.SECONDS);
            assertNotNull(next);
            psem.release(next);

            RlockCountDownLatch latch = rlock.getCountDownLatch(name + ":latch{" + name + "}");
            assertTrue(latch.trySetCount(1));
            CompletableFuture<Boolean> aw = latch.awaitAsync(10, TimeUnit.SECONDS);
            TestServer.waitUntil(Duration.ofSeconds(5), "latch awaiter queued", () -> waiters(node) == base + 1);
            latch.countDown();
            assertTrue(aw.get(5, TimeUnit.SECONDS));
        }
        assertEquals(0, rlock.registeredWaiters());
        // Every master had waiters; each has one notification connection of this client.
        for (TestServer m : cluster.masters) {
            assertEquals(1, named(m, RlockClient.NOTIFICATION_CONNECTION_NAME), "notification connections on " + m.port + ":\n" + m.redis().clientList());
        }
    }

    /** Sharded subscribers of `channel` on `node` (PUBSUB SHARDNUMSUB). */
    static long shardSubscribers(TestServer node, String channel) {
        return Sync.asLong(((List<?>) node.call("PUBSUB", "SHARDNUMSUB", channel)).get(1));
    }

    @Test
    void two_clients_waiting_on_one_key_each_hear_on_their_own_sharded_channel() throws Exception {
        assertTrue(rlock.capabilities().has("ticket-notify"), "the module names ticket-notify: " + rlock.capabilities());
        try (RlockClient other = RlockClient.createCluster(cluster.masters.get(1).address())) {
            String name = "java:cluster:notify:" + System.nanoTime();
            TestServer node = cluster.ownerOf(name);
            String mine = Waits.channel(name, rlock.waits().tag()), theirs = Waits.channel(name, other.waits().tag());
            long base = waiters(node);
            RlockLock lock = rlock.getLock(name);
            assertTrue(lock.tryLockAsync(1).get());
            CompletableFuture<Boolean> a = lock.tryLockAsync(20, -1, TimeUnit.SECONDS, 2);
            TestServer.waitUntil(Duration.ofSeconds(10), "a queued", () -> waiters(node) == base + 1);
            CompletableFuture<Boolean> b = other.getLock(name).tryLockAsync(20, -1, TimeUnit.SECONDS, 3);
            TestServer.waitUntil(Duration.ofSeconds(10), "b queued", () -> waiters(node) == base + 2);
            // Each client on its own channel of the key's slot, on the key's node; nobody on the key's channel.
            assertEquals(0, shardSubscribers(node, Waits.channel(name)));
            assertEquals(1, shardSubscribers(node, mine));
            assertEquals(1, shardSubscribers(node, theirs));
            lock.unlockAsync(1).get();
            assertTrue(a.get(10, TimeUnit.SECONDS));
            assertFalse(b.isDone());
            TestServer.waitUntil(Duration.ofSeconds(10), "a's channel unsubscribed", () -> shardSubscribers(node, mine) == 0);
            lock.unlockAsync(2).get();
            assertTrue(b.get(10, TimeUnit.SECONDS));
            other.getLock(name).unlockAsync(3).get();
            TestServer.waitUntil(Duration.ofSeconds(10), "b's channel unsubscribed", () -> shardSubscribers(node, theirs) == 0);
        }
    }

    @Test
    void many_waiters_on_one_node_share_its_two_connections() throws Exception {
        String name = "java:cluster:many:" + System.nanoTime();
        TestServer node = cluster.ownerOf(name);
        RlockLock lock = rlock.getLock(name);
        assertTrue(lock.tryLockAsync(1).get());
        long base = waiters(node);
        int before = node.connections();
        Map<Long, CompletableFuture<Boolean>> ws = new ConcurrentHashMap<>();
        for (long tid = 100; tid < 120; tid++) {
            ws.put(tid, lock.tryLockAsync(30, -1, TimeUnit.SECONDS, tid));
        }
        TestServer.waitUntil(Duration.ofSeconds(10), "20 waiters queued", () -> waiters(node) == base + 20);
        assertTrue(node.connections() <= before + 1, "at most the node's notification connection was added:\n"
                + node.redis().clientList());
        lock.unlockAsync(1).get();
        // Served one at a time, in the server's order: each releases for the next.
        while (!ws.isEmpty()) {
            TestServer.waitUntil(Duration.ofSeconds(10), "a waiter served",
                    () -> ws.values().stream().anyMatch(CompletableFuture::isDone));
            long tid = ws.entrySet().stream().filter(e -> e.getValue().isDone()).findFirst().orElseThrow().getKey();
            assertTrue(ws.remove(tid).get());
            lock.unlockAsync(tid).get();
        }
    }

    @Test
    void a_multi_lock_spans_the_nodes() throws Exception {
        List<String> names = spread("multi", 3);
        List<RlockLock> parts = new ArrayList<>();
        for (String n : names) {
            parts.add(rlock.getLock(n));
        }
        RlockMultiLock m = new RlockMultiLock(parts);
        assertTrue(m.tryLockAsync(0, 30, TimeUnit.SECONDS, 1).get());
        for (String n : names) {
            assertEquals("1", cluster.ownerOf(n).redis().hget(n, rlock.getLock(n).ownerOf(1)));
        }
        assertFalse(m.tryLockAsync(0, 30, TimeUnit.SECONDS, 2).get());
        m.unlockAsync(1).get();
        for (String n : names) {
            assertEquals(0, cluster.ownerOf(n).redis().exists(n));
        }
    }

    /** A held lock with `count` waiters of `client` queued on its node, the slot then moved by `move`. */
    static void waitersFollowTheirKey(RlockClient client, String what, int count,
                                      java.util.function.BiConsumer<String, TestServer> move) throws Exception {
        String name = "java:cluster:" + what + ":" + System.nanoTime();
        TestServer src = cluster.ownerOf(name);
        TestServer dst = cluster.other(src);
        RlockLock lock = client.getLock(name);
        assertTrue(lock.tryLockAsync(0, 60, TimeUnit.SECONDS, 1).get());
        long srcBase = waiters(src), dstBase = waiters(dst);
        Map<Long, CompletableFuture<Boolean>> ws = new ConcurrentHashMap<>();
        for (long tid = 2; tid < 2 + count; tid++) {
            ws.put(tid, lock.tryLockAsync(30, -1, TimeUnit.SECONDS, tid));
            long n = tid - 1;
            TestServer.waitUntil(Duration.ofSeconds(10), "waiter " + n + " queued on the source", () -> waiters(src) == srcBase + n);
        }
        move.accept(name, dst);
        TestServer.waitUntil(Duration.ofSeconds(20), "the waiters queued again on the new owner",
                () -> waiters(dst) == dstBase + count);
        assertEquals(srcBase, waiters(src), "nothing left waiting on the source");
        assertTrue(ws.values().stream().noneMatch(CompletableFuture::isDone), "the lock is still held");
        lock.unlockAsync(1).get();
        // One waiter at a time is served on the new owner, then releases for the other.
        for (int served = 0; served < count; served++) {
            TestServer.waitUntil(Duration.ofSeconds(10), "a waiter served",
                    () -> ws.values().stream().anyMatch(CompletableFuture::isDone));
            long tid = ws.entrySet().stream().filter(e -> e.getValue().isDone()).findFirst().orElseThrow().getKey();
            assertTrue(ws.remove(tid).get());
            assertEquals("1", dst.redis().hget(name, lock.ownerOf(tid)), "held on the new owner");
            assertTrue(ws.values().stream().noneMatch(CompletableFuture::isDone), "one holder at a time");
            lock.unlockAsync(tid).get();
        }
        assertEquals(0, dst.redis().exists(name));
    }

    /** Classic resharding of `name`'s slot to `dst`: MIGRATE its keys, then SETSLOT NODE. */
    static void reshard(String name, TestServer dst) {
        int slot = cluster.slot(name);
        TestServer src = cluster.ownerOf(name);
        cluster.beginMigration(slot, src, dst);
        cluster.finishMigration(slot, src, dst);
    }

    @Test
    void a_queued_ticket_follows_its_key_through_classic_resharding() throws Exception {
        waitersFollowTheirKey(rlock, "reshard-ticket", 2, ClusterTest::reshard);
        assertEquals(0, rlock.registeredWaiters());
    }

    @Test
    void a_blocked_waiter_follows_its_key_through_classic_resharding() throws Exception {
        try (RlockClient blocking = RlockClient.createCluster(List.of(cluster.masters.get(0).uri()),
                RlockOptions.defaults().withWaitMode(RlockOptions.WaitMode.BLOCKING))) {
            waitersFollowTheirKey(blocking, "reshard-blocked", 1, ClusterTest::reshard);
        }
    }

    @Test
    void a_queued_ticket_follows_its_key_through_an_atomic_slot_migration() throws Exception {
        String info = cluster.masters.get(0).redis().info("server");
        String version = info.lines().filter(l -> l.startsWith("valkey_version:")).findFirst().orElse("");
        Assumptions.assumeTrue(info.contains("server_name:valkey") && !version.startsWith("valkey_version:7.")
                        && !version.startsWith("valkey_version:8."),
                "atomic slot migration (CLUSTER MIGRATESLOTS) is Valkey 9.0+; this server is " + TestServer.serverBinary());
        waitersFollowTheirKey(rlock, "asm", 2, (name, dst) -> {
            String slot = Integer.toString(cluster.slot(name));
            cluster.ownerOf(name).call("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot, "NODE", cluster.id(dst));
            cluster.waitOwner(cluster.slot(name), dst);
        });
        assertEquals(0, rlock.registeredWaiters());
    }
}
