// A grant published while the client's notification connection is away (issue 41): the
// server hands the lock to the queued ticket, its message reaches nobody, and a wait
// without a time limit (lock(), acquire()) must still end holding. The client learns of the
// lost connection from Lettuce's reconnect event and asks again under the same request id,
// which the server answers with the grant it made. A real module-loaded server of the
// test's own; the subscriber is killed and the lock released in one MULTI, so the message
// is certain to go out while no subscriber is there.
package io.rlock;

import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.protocol.CommandArgs;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(60)
class ReconnectTest {
    /** Kills the client's pub/sub connection and runs `release` in the same transaction. */
    static void killSubscriberAnd(TestServer s, String... release) {
        var conn = s.redis();
        conn.multi();
        conn.dispatch(Wire.keyword("CLIENT"), new Reply(), args("KILL", "TYPE", "pubsub"));
        conn.dispatch(Wire.keyword(release[0]), new Reply(), args(List.of(release).subList(1, release.length).toArray(String[]::new)));
        io.lettuce.core.TransactionResult replies = conn.exec();
        assertEquals((Object) 1L, replies.get(0), "the client's one notification connection killed: " + replies);
    }

    static CommandArgs<String, String> args(String... a) {
        return new CommandArgs<>(StringCodec.UTF8).addValues(a);
    }

    /**
     * A thread that waits for the lock (tryLock, 30 s), tells whether it got it, holds it
     * until told to release, then unlocks.
     */
    private static final class Holder {
        final CompletableFuture<Boolean> held = new CompletableFuture<>();
        final CompletableFuture<Void> release = new CompletableFuture<>();
        final CompletableFuture<Void> released = new CompletableFuture<>();
        final Thread thread;

        Holder(RlockLock lock) {
            thread = new Thread(() -> {
                try {
                    held.complete(lock.tryLock(30, TimeUnit.SECONDS));
                    release.get(30, TimeUnit.SECONDS);
                    lock.unlock();
                    released.complete(null);
                } catch (Throwable e) {
                    held.completeExceptionally(e);
                    released.completeExceptionally(e);
                }
            });
            thread.setDaemon(true);
            thread.start();
        }
    }

    /**
     * Releases `name` held by "outside" (granting the queued ticket: in the AOF, fsync
     * always, before EXEC answers) and pauses writes, in one transaction; with
     * `killSubscriber`, the client's pub/sub connection is killed in between, so the
     * grant's message reaches nobody.
     */
    static void grantAndPauseWrites(TestServer own, String name, boolean killSubscriber) {
        var conn = own.redis();
        conn.multi();
        conn.dispatch(Wire.keyword("RLOCK.RELEASE"), new Reply(), args(name, "outside"));
        if (killSubscriber) {
            conn.dispatch(Wire.keyword("CLIENT"), new Reply(), args("KILL", "TYPE", "pubsub"));
        }
        conn.dispatch(Wire.keyword("CLIENT"), new Reply(), args("PAUSE", "60000", "WRITE"));
        conn.exec();
    }

    static long waiters(TestServer s) {
        return Long.parseLong(s.info("rlock", "rlock_waiters"));
    }

    /**
     * The lock is granted to the queued ticket and the server dies before the waiter heard
     * of it (its message gone with the subscriber, its ask again held by a pause); it comes
     * back on the same port from its AOF, which kept the grant and its request id's reply.
     * The wait must reconnect until then and find the grant under the same id, not give up
     * and leave the lock held by an owner that does not know it.
     */
    @Test
    void a_wait_rides_out_a_restart_and_finds_the_grant_made_before_it() throws Exception {
        try (TestServer own = new TestServer("--appendonly", "yes", "--appendfsync", "always");
             RlockClient c = RlockClient.create(own.uri(), RlockOptions.defaults())) {
            String name = "java:restart:lock:" + System.nanoTime();
            assertNull(own.call("RLOCK.ACQUIRE", name, "outside", "30000"));
            Holder h = new Holder(c.getLock(name));
            TestServer.waitUntil(Duration.ofSeconds(10), "the ticket queued", () -> waiters(own) == 1);
            grantAndPauseWrites(own, name, true);
            List<String> owners = own.redis().hkeys(name);
            assertEquals(1, owners.size(), "granted before the restart: " + owners);
            assertNotEquals("outside", owners.get(0));
            // Down for 3 s: longer than a wait that gave up at the first refused reconnect.
            own.restart(Duration.ofSeconds(3));
            assertTrue(h.held.get(20, TimeUnit.SECONDS), "the wait ended holding");
            assertEquals(java.util.Map.of(owners.get(0), "1"), own.redis().hgetall(name));
            h.release.complete(null);
            TestServer.waitUntil(Duration.ofSeconds(10), "released after", () -> own.redis().exists(name) == 0);
        }
    }

    /**
     * A wait that heard its grant holds on it and confirms off its path (design.md 5); the
     * server dies after the grant message went out and before the confirmation got through
     * (held by CLIENT PAUSE WRITE, which the restart forgets), and stays down for longer
     * than the server's grace (rlock.ticket-confirm-ms, 1 s). The restarted server kept the
     * grant (AOF, fsync always) and has no ticket connection left to take it back from, so
     * the confirmation, sent again under the same request id, finds it: the holder keeps the
     * lock (no lost signal) and its unlock frees it.
     */
    @Test
    void a_held_grant_is_confirmed_after_a_restart_longer_than_the_grace() throws Exception {
        heldGrantConfirmedAcrossARestart(false);
    }

    /**
     * As above, the restarted server still loading (answering LOADING) when the client
     * reconnects and sends the confirmation again: its AOF's base holds 1 000 keys of 1 KB,
     * each read 2 ms late (`key-load-delay`, a test config of the server), with client
     * events served every 1 KB read. The confirmation is tried until the load is done, not
     * given up after a few LOADING answers.
     */
    @Test
    void a_held_grant_is_confirmed_after_a_restart_while_the_server_still_loads() throws Exception {
        heldGrantConfirmedAcrossARestart(true);
    }

    private static void heldGrantConfirmedAcrossARestart(boolean loadSlowly) throws Exception {
        List<String> serverArgs = new java.util.ArrayList<>(List.of("--appendonly", "yes", "--appendfsync", "always"));
        if (loadSlowly) {
            serverArgs.addAll(List.of("--key-load-delay", "2000", "--loading-process-events-interval-bytes", "1024"));
        }
        // Without replica sync: its WAIT would be held by the pause too.
        try (TestServer own = new TestServer(serverArgs.toArray(String[]::new));
             RlockClient c = RlockClient.create(own.uri(), RlockOptions.defaults().withoutReplicaSync())) {
            String name = "java:restart:confirm:" + System.nanoTime();
            if (loadSlowly) {
                // The padding goes into the AOF's base (a rewrite), which a restart loads first.
                String rewrites = own.info("persistence", "aof_rewrites");
                assertEquals("OK", own.call("DEBUG", "POPULATE", "1000", "pad", "1024"));
                own.call("BGREWRITEAOF");
                TestServer.waitUntil(Duration.ofSeconds(20), "the AOF rewritten", () ->
                        !rewrites.equals(own.info("persistence", "aof_rewrites"))
                                && "0".equals(own.info("persistence", "aof_rewrite_in_progress")));
            }
            assertNull(own.call("RLOCK.ACQUIRE", name, "outside", "30000"));
            RlockLock lock = c.getLock(name);
            CompletableFuture<String> lost = new CompletableFuture<>();
            lock.addLostListener((n, owner, why) -> lost.complete(why));
            Holder h = new Holder(lock);
            TestServer.waitUntil(Duration.ofSeconds(10), "the ticket queued", () -> waiters(own) == 1);
            // The grant and its message go out; the pause, in force from the end of the
            // EXEC, holds the confirmation the message sets off until the server goes away.
            grantAndPauseWrites(own, name, false);
            assertTrue(h.held.get(10, TimeUnit.SECONDS), "held on the grant message");
            assertFalse(lost.isDone(), "no lost signal through the pause");
            own.restart(Duration.ofMillis(1500));
            // The confirmation run by the restarted server (answered the grant), or the
            // client gave up on it and reported the hold lost.
            TestServer.waitUntil(Duration.ofSeconds(15), "the confirmation run, or the hold reported lost",
                    () -> lost.isDone() || calls(own.info("commandstats", "cmdstat_rlock.acquire")) > 0);
            String owner = own.redis().hkeys(name).get(0);
            assertEquals(Map.of(owner, "1"), own.redis().hgetall(name), "the holder's, once");
            h.release.complete(null);
            h.released.get(10, TimeUnit.SECONDS);
            assertFalse(lost.isDone(), "the hold was not reported lost: " + lost.getNow(null));
            assertFalse(lock.isLost(h.thread.getId()));
            assertEquals(0, c.counters().lostLocks.sum());
            TestServer.waitUntil(Duration.ofSeconds(10), "released after", () -> own.redis().exists(name) == 0);
        }
    }

    /** The `calls` of an INFO commandstats line (`calls=n,usec=...`; 0 when absent). */
    static long calls(String stat) {
        if (stat == null || !stat.startsWith("calls=")) {
            return 0;
        }
        return Long.parseLong(stat.substring("calls=".length(), stat.indexOf(',')));
    }

    @Test
    void an_untimed_lock_whose_grant_message_was_lost_still_ends_holding() throws Exception {
        try (TestServer own = new TestServer();
             RlockClient c = RlockClient.create(own.uri(), RlockOptions.defaults())) {
            String name = "java:reconnect:lock:" + System.nanoTime();
            assertNull(own.call("RLOCK.ACQUIRE", name, "holder", "30000"));
            RlockLock lock = c.getLock(name);
            CompletableFuture<Boolean> held = new CompletableFuture<>();
            Thread t = new Thread(() -> {
                lock.lock();
                held.complete(lock.isHeldByCurrentThread());
                lock.unlock();
            });
            t.setDaemon(true);
            t.start();
            TestServer.waitUntil(Duration.ofSeconds(10), "the ticket queued", () -> waiters(own) == 1);
            long before = Long.parseLong(own.info("rlock", "rlock_tickets_granted"));
            killSubscriberAnd(own, "RLOCK.RELEASE", name, "holder");
            assertEquals(before + 1, Long.parseLong(own.info("rlock", "rlock_tickets_granted")),
                    "granted while nobody listened");
            assertTrue(held.get(20, TimeUnit.SECONDS), "lock() returned holding");
            TestServer.waitUntil(Duration.ofSeconds(10), "released after", () -> own.redis().exists(name) == 0);
        }
    }

    @Test
    void an_untimed_semaphore_acquire_whose_grant_message_was_lost_still_gets_its_permit() throws Exception {
        try (TestServer own = new TestServer();
             RlockClient c = RlockClient.create(own.uri(), RlockOptions.defaults())) {
            String name = "java:reconnect:sem:" + System.nanoTime();
            RlockSemaphore sem = c.getSemaphore(name);
            assertTrue(sem.trySetPermits(0));
            CompletableFuture<Boolean> got = new CompletableFuture<>();
            Thread t = new Thread(() -> {
                try {
                    sem.acquire();
                    got.complete(true);
                } catch (InterruptedException e) {
                    got.complete(false);
                }
            });
            t.setDaemon(true);
            t.start();
            TestServer.waitUntil(Duration.ofSeconds(10), "the ticket queued", () -> waiters(own) == 1);
            killSubscriberAnd(own, "RSEMAPHORE.RELEASE", name, "1");
            assertTrue(got.get(20, TimeUnit.SECONDS), "acquire() returned with the permit");
            assertEquals("0", own.redis().get(name), "the one permit is the waiter's, given once");
        }
    }
}
