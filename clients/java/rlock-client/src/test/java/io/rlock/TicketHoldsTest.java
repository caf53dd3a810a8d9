// Tests of "a ticket holds when its grant arrives" in the rlock Java client (clients/java;
// design.md 5, issue 40) against a real module-loaded server: a lock's, RW lock's, fenced
// lock's (with its token) and expirable semaphore's (with its permit id) waiter holds on its
// granted message before its confirmation is even sent; a grant the server took back (the
// connection that queued it closed, no confirmation within rlock.ticket-confirm-ms) reaches
// the holder as a lost lock (a lost permit); a server without `ticket-holds` is collected from first; and
// 200 waiting threads of one client hold a few connections, none blocked in the server.
// A Transport wrapper holds back the confirmations, standing for a holder whose
// confirmation is late (a paused process, a broken connection).
package io.rlock;

import io.lettuce.core.RedisClient;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BiConsumer;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(60)
class TicketHoldsTest {
    static TestServer server;

    @BeforeAll
    static void start() {
        server = new TestServer();
    }

    /** How long the server keeps an unconfirmed grant after its connection closed. */
    static void confirmMs(long ms) {
        server.call("CONFIG", "SET", "rlock.ticket-confirm-ms", Long.toString(ms));
    }

    static long revoked() {
        return Long.parseLong(server.info("rlock", "rlock_revoked_handoffs"));
    }

    @AfterAll
    static void stop() {
        server.close();
    }

    static String key(String what) {
        return "java:holds:" + what + ":" + System.nanoTime();
    }

    /**
     * The client's own Lettuce transport, with the confirmations of ticket grants (a
     * waiting command sent again without WAIT) held back until {@link #gate} completes,
     * and optionally the `ticket-holds` word taken out of RLOCK.HELLO's answer.
     */
    static final class Gated implements Transport {
        final LettuceTransport inner;
        final boolean hideHolds;
        final CompletableFuture<Void> gate = new CompletableFuture<>();
        final AtomicInteger held = new AtomicInteger();

        Gated(boolean hideHolds) {
            this.inner = new LettuceTransport(RedisClient.create(server.uri()), true, null);
            this.hideHolds = hideHolds;
        }

        /** Request ids sent with WAIT: a ticket's (or a blocked wait's). */
        static final Set<String> waited = ConcurrentHashMap.newKeySet();

        /**
         * Whether `args` (every command a transport sends is shown here) confirms a grant:
         * an acquire without WAIT under the id of a waiting one sent before. A waiting
         * acquire's try (the same command and id without WAIT, before its ticket) is not.
         */
        static boolean confirmation(List<String> args) {
            String c = args.get(0);
            int id = args.indexOf("ID");
            if (id < 0 || !(c.equals("RLOCK.ACQUIRE") || c.equals("RRWLOCK.ACQUIRE") || c.equals("RFENCED.ACQUIRE")
                    || c.equals("RPSEMAPHORE.ACQUIRE") || c.equals("RSEMAPHORE.ACQUIRE"))) {
                return false;
            }
            if (args.contains("WAIT")) {
                waited.add(args.get(id + 1));
                return false;
            }
            return waited.contains(args.get(id + 1));
        }

        @Override
        public CompletableFuture<Object> send(List<String> args) {
            if (confirmation(args) && !gate.isDone()) {
                held.incrementAndGet();
                return gate.thenCompose(x -> inner.send(args));
            }
            CompletableFuture<Object> r = inner.send(args);
            if (hideHolds && args.equals(Capabilities.HELLO)) {
                return r.thenApply(Gated::withoutHolds);
            }
            return r;
        }

        static Object withoutHolds(Object reply) {
            List<Object> flat = new ArrayList<>((List<?>) reply);
            for (int i = 0; i + 1 < flat.size(); i += 2) {
                if ("features".equals(flat.get(i))) {
                    List<Object> words = new ArrayList<>((List<?>) flat.get(i + 1));
                    words.remove("ticket-holds");
                    flat.set(i + 1, words);
                }
            }
            return flat;
        }

        @Override
        public void listen(BiConsumer<String, String> l) {
            inner.listen(l);
        }

        @Override
        public CompletableFuture<Void> subscribe(String channel) {
            return inner.subscribe(channel);
        }

        @Override
        public void unsubscribe(String channel) {
            inner.unsubscribe(channel);
        }

        @Override
        public void onReconnect(Runnable hook) {
            inner.onReconnect(hook);
        }

        @Override
        public Dedicated dedicated() {
            return inner.dedicated();
        }

        @Override
        public void close() {
            gate.complete(null);
            inner.close();
        }
    }

    static long waiters() {
        return Long.parseLong(server.info("rlock", "rlock_waiters"));
    }

    @Test
    void a_lock_waiter_holds_on_its_granted_message_before_its_confirmation_is_answered() throws Exception {
        Gated t = new Gated(false);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults())) {
            // Held while its confirmation has not even left the client: nothing but the
            // grant message stood between the release and the holder.
            RlockLock lock = lockHeldOnGrant(c, key("held"));
            // Its confirmation went out (a lock's after its short hold-back) and waits at the gate.
            TestServer.waitUntil(Duration.ofSeconds(10), "confirmation sent", () -> t.held.get() == 1);
            assertTrue(lock.isHeldByThread(7));
            t.gate.complete(null);
            lock.unlockAsync(7).get(10, TimeUnit.SECONDS);
            assertFalse(lock.isLost(7));
            assertEquals(0, c.stats().lostLocks());
        }
    }

    @Test
    void a_lock_holders_release_collects_its_grant_in_place_of_the_held_back_confirmation() throws Exception {
        try (RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            c.waits().deferConfirmsFor(60_000); // held back until the release, however slow the machine
            String name = key("carried");
            RlockLock lock = lockHeldOnGrant(c, name);
            long acquires = calls("rlock.acquire"), releases = calls("rlock.release");
            // The confirmation was still held back: the release collected the grant itself
            // (COLLECT), one command in one read, no confirmation (an acquire) at all. Sent
            // behind the confirmation it took one acquire more; apart, a read more.
            assertEquals(1, readsDuring(() -> lock.unlockAsync(7).get(10, TimeUnit.SECONDS)),
                    "one read");
            assertEquals(0, calls("rlock.acquire") - acquires, "no confirmation");
            assertEquals(1, calls("rlock.release") - releases);
            assertEquals(0L, server.call("EXISTS", name), "released");
            assertFalse(lock.isLost(7));
            assertEquals(0, c.stats().lostLocks());
        }
    }

    /**
     * `c`'s lock `name`, held by its thread 7 on a grant message: queued behind "holder",
     * which then released.
     */
    static RlockLock lockHeldOnGrant(RlockClient c, String name) throws Exception {
        assertNull(server.call("RLOCK.ACQUIRE", name, "holder", "30000"));
        RlockLock lock = c.getLock(name);
        CompletableFuture<Boolean> waiting = lock.tryLockAsync(20, -1, TimeUnit.SECONDS, 7);
        TestServer.waitUntil(Duration.ofSeconds(10), "queued", () -> waiters() == 1);
        assertEquals(1L, server.call("RLOCK.RELEASE", name, "holder"));
        assertTrue(waiting.get(10, TimeUnit.SECONDS), "held on the grant message");
        return lock;
    }

    /**
     * `c`'s semaphore `name` of 1 permit, that permit held by `c` on a grant message:
     * queued behind a taker, which then released.
     */
    static RlockSemaphore permitHeldOnGrant(RlockClient c, String name) throws Exception {
        RlockSemaphore sem = c.getSemaphore(name);
        assertEquals(1L, server.call("RSEMAPHORE.TRYSETPERMITS", name, "1"));
        assertEquals(1L, server.call("RSEMAPHORE.ACQUIRE", name, "1"));
        CompletableFuture<Boolean> waiting = sem.tryAcquireAsync(1, 20, TimeUnit.SECONDS);
        TestServer.waitUntil(Duration.ofSeconds(10), "queued", () -> waiters() == 1);
        assertEquals(1L, server.call("RSEMAPHORE.RELEASE", name, "1"));
        assertTrue(waiting.get(10, TimeUnit.SECONDS), "held on the grant message");
        return sem;
    }

    /** The server's reads while `call` runs (less the read of the INFO that counts them). */
    static long readsDuring(java.util.concurrent.Callable<?> call) throws Exception {
        long before = Long.parseLong(server.info("stats", "total_reads_processed"));
        call.call();
        return Long.parseLong(server.info("stats", "total_reads_processed")) - before - 1;
    }

    /** Calls of `command` so far (INFO commandstats). */
    static long calls(String command) {
        String stat = server.info("commandstats", "cmdstat_" + command);
        if (stat == null) {
            return 0;
        }
        String calls = stat.split(",")[0];
        return Long.parseLong(calls.substring(calls.indexOf('=') + 1));
    }

    @Test
    void a_read_write_lock_waiter_holds_on_its_granted_message_too() throws Exception {
        Gated t = new Gated(false);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults())) {
            String name = key("rw");
            RlockReadWriteLock rw = c.getReadWriteLock(name);
            assertNull(server.call("RRWLOCK.ACQUIRE", name, "WRITE", "holder", "30000"));
            CompletableFuture<Boolean> reading = rw.readLock().tryLockAsync(20, -1, TimeUnit.SECONDS, 7);
            TestServer.waitUntil(Duration.ofSeconds(10), "queued", () -> waiters() == 1);
            server.call("RRWLOCK.RELEASE", name, "WRITE", "holder");
            assertTrue(reading.get(10, TimeUnit.SECONDS));
            // Its confirmation went out (a lock's after its short hold-back) and waits at the gate.
            TestServer.waitUntil(Duration.ofSeconds(10), "confirmation sent", () -> t.held.get() == 1);
            t.gate.complete(null);
            rw.readLock().unlockAsync(7).get(10, TimeUnit.SECONDS);
        }
    }

    @Test
    void a_fenced_lock_waiter_holds_on_its_granted_message_with_its_token() throws Exception {
        Gated t = new Gated(false);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults())) {
            String name = key("fenced");
            RlockFencedLock lock = c.getFencedLock(name);
            List<?> first = (List<?>) server.call("RFENCED.ACQUIRE", name, "holder", "30000");
            long before = (Long) first.get(1);
            CompletableFuture<Long> waiting = lock.tryLockAndGetTokenAsync(20, -1, TimeUnit.SECONDS, 7);
            TestServer.waitUntil(Duration.ofSeconds(10), "queued", () -> waiters() == 1);
            assertEquals(1L, server.call("RLOCK.RELEASE", name, "holder"));
            // Held, with its token, while its confirmation has not left the client: the
            // token came in the grant message's detail.
            long token = waiting.get(10, TimeUnit.SECONDS);
            // Its confirmation went out (a lock's after its short hold-back) and waits at the gate.
            TestServer.waitUntil(Duration.ofSeconds(10), "confirmation sent", () -> t.held.get() == 1);
            assertTrue(token > before, token + " after " + before);
            assertEquals(token, lock.getToken());
            assertTrue(lock.isHeldByThread(7));
            t.gate.complete(null);
            lock.unlockAsync(7).get(10, TimeUnit.SECONDS);
            assertEquals(0, c.stats().lostLocks());
        }
    }

    @Test
    void an_expirable_semaphore_waiter_holds_on_its_granted_message_with_its_permit() throws Exception {
        Gated t = new Gated(false);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults())) {
            String name = key("permit");
            RlockPermitExpirableSemaphore sem = c.getPermitExpirableSemaphore(name);
            assertEquals(1L, server.call("RPSEMAPHORE.TRYSETPERMITS", name, "1"));
            String other = (String) server.call("RPSEMAPHORE.ACQUIRE", name, "30000");
            CompletableFuture<String> waiting = sem.tryAcquireAsync(20, -1, TimeUnit.SECONDS);
            TestServer.waitUntil(Duration.ofSeconds(10), "queued", () -> waiters() == 1);
            assertEquals(1L, server.call("RPSEMAPHORE.RELEASE", name, other));
            String id = waiting.get(10, TimeUnit.SECONDS);
            // Its confirmation went out (a lock's after its short hold-back) and waits at the gate.
            TestServer.waitUntil(Duration.ofSeconds(10), "confirmation sent", () -> t.held.get() == 1);
            assertNotNull(id);
            assertNotEquals(other, id);
            assertEquals(1, sem.acquiredPermits());
            t.gate.complete(null);
            assertTrue(sem.tryRelease(id), "the permit named in the message is the one held");
            assertEquals(0, c.stats().lostLocks());
        }
    }

    @Test
    void a_fenced_grant_and_a_permit_taken_back_before_their_confirmations_are_reported_lost() throws Exception {
        confirmMs(200);
        Gated t = new Gated(false);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults());
             RlockClient next = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            String fname = key("fenced-takenback"), sname = key("permit-takenback");
            RlockFencedLock lock = c.getFencedLock(fname);
            RlockPermitExpirableSemaphore sem = c.getPermitExpirableSemaphore(sname);
            CountDownLatch lost = new CountDownLatch(2);
            AtomicReference<String> lostPermit = new AtomicReference<>();
            lock.addLostListener((n, owner, why) -> {
                if (owner.equals(lock.ownerOf(7)) && why.contains("TAKENBACK")) {
                    lost.countDown();
                }
            });
            sem.addLostListener((n, permit, why) -> {
                if (why.contains("TAKENBACK")) {
                    lostPermit.set(permit);
                    lost.countDown();
                }
            });
            server.call("RFENCED.ACQUIRE", fname, "holder", "30000");
            assertEquals(1L, server.call("RPSEMAPHORE.TRYSETPERMITS", sname, "1"));
            String other = (String) server.call("RPSEMAPHORE.ACQUIRE", sname, "30000");
            CompletableFuture<Long> fencing = lock.tryLockAndGetTokenAsync(20, -1, TimeUnit.SECONDS, 7);
            CompletableFuture<String> permitting = sem.tryAcquireAsync(20, -1, TimeUnit.SECONDS);
            TestServer.waitUntil(Duration.ofSeconds(10), "queued", () -> waiters() == 2);
            CompletableFuture<Long> fencedAfter = next.getFencedLock(fname).tryLockAndGetTokenAsync(20, -1, TimeUnit.SECONDS, 8);
            CompletableFuture<String> permitAfter = next.getPermitExpirableSemaphore(sname).tryAcquireAsync(20, 30, TimeUnit.SECONDS);
            TestServer.waitUntil(Duration.ofSeconds(10), "all queued", () -> waiters() == 4);
            long commandConn = Sync.asLong(t.inner.send(List.of("CLIENT", "ID")).get(10, TimeUnit.SECONDS));
            assertEquals(1L, server.call("RLOCK.RELEASE", fname, "holder"));
            assertEquals(1L, server.call("RPSEMAPHORE.RELEASE", sname, other));
            long token = fencing.get(10, TimeUnit.SECONDS);
            String permit = permitting.get(10, TimeUnit.SECONDS);
            TestServer.waitUntil(Duration.ofSeconds(10), "both held on their messages, neither confirmed",
                    () -> t.held.get() == 2);
            // The connection that queued both tickets closes before any confirmation: the
            // server takes both grants back after 200 ms and hands them to the next waiters.
            server.call("CLIENT", "KILL", "ID", Long.toString(commandConn));
            assertTrue(fencedAfter.get(10, TimeUnit.SECONDS) > token, "the next holder's token is larger");
            assertNotNull(permitAfter.get(10, TimeUnit.SECONDS));
            t.gate.complete(null);
            assertTrue(lost.await(10, TimeUnit.SECONDS), "both lost signals fired");
            assertEquals(permit, lostPermit.get());
            assertTrue(lock.isLost(7));
            assertEquals(2, c.stats().lostLocks());
            assertFalse(sem.tryRelease(permit), "the permit taken back is not held");
            next.getFencedLock(fname).unlockAsync(8).get(10, TimeUnit.SECONDS);
        }
    }

    /**
     * `lock` (of the client on `t`) held by its thread 7 on a grant message, `next`'s thread
     * 8 queued behind it; then `t`'s command connection killed before any confirmation
     * went, and the grant, taken back (rlock.ticket-confirm-ms later), handed to `next`.
     */
    static void takenBackToNext(Gated t, RlockLock lock, RlockLock next) throws Exception {
        String name = lock.getName();
        assertNull(server.call("RLOCK.ACQUIRE", name, "holder", "30000"));
        CompletableFuture<Boolean> waiting = lock.tryLockAsync(20, -1, TimeUnit.SECONDS, 7);
        TestServer.waitUntil(Duration.ofSeconds(10), "queued", () -> waiters() == 1);
        CompletableFuture<Boolean> after = next.tryLockAsync(20, -1, TimeUnit.SECONDS, 8);
        TestServer.waitUntil(Duration.ofSeconds(10), "both queued", () -> waiters() == 2);
        long commandConn = Sync.asLong(t.inner.send(List.of("CLIENT", "ID")).get(10, TimeUnit.SECONDS));
        assertEquals(1L, server.call("RLOCK.RELEASE", name, "holder"));
        assertTrue(waiting.get(10, TimeUnit.SECONDS), "held on the grant message");
        server.call("CLIENT", "KILL", "ID", Long.toString(commandConn));
        assertTrue(after.get(10, TimeUnit.SECONDS), "the next waiter got the lock taken back");
    }

    @Test
    void a_grant_taken_back_before_its_confirmation_is_reported_as_a_lost_lock() throws Exception {
        confirmMs(200);
        Gated t = new Gated(false);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults());
             RlockClient next = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            String name = key("takenback");
            RlockLock lock = c.getLock(name);
            AtomicReference<String> lostWhy = new AtomicReference<>();
            CountDownLatch lost = new CountDownLatch(1);
            lock.addLostListener((n, owner, why) -> {
                if (owner.equals(lock.ownerOf(7))) {
                    lostWhy.set(why);
                    lost.countDown();
                }
            });
            // The connection that queued the ticket closes before any confirmation (a
            // paused or cut-off holder): the server waits 200 ms, takes the grant back
            // and hands the lock to the next waiter.
            takenBackToNext(t, lock, next.getLock(name));
            assertTrue(next.getLock(name).isHeldByThread(8));
            // The late confirmation hears TAKENBACK: the holder is told it lost the lock.
            t.gate.complete(null);
            assertTrue(lost.await(10, TimeUnit.SECONDS), "the lost-lock listener fired");
            assertTrue(lostWhy.get().contains("TAKENBACK"), lostWhy.get());
            assertTrue(lock.isLost(7));
            assertEquals(1, c.stats().lostLocks());
            IllegalMonitorStateException e = assertThrows(IllegalMonitorStateException.class,
                    () -> Sync.join(lock.unlockAsync(7)));
            assertTrue(e.getMessage().contains("lost"), e.getMessage());
            next.getLock(name).unlockAsync(8).get(10, TimeUnit.SECONDS);
        }
    }

    @Test
    void a_release_collecting_a_grant_taken_back_changes_nothing_and_reports_the_lock_lost() throws Exception {
        confirmMs(200);
        Gated t = new Gated(false);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults());
             RlockClient next = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            c.waits().deferConfirmsFor(60_000); // held back: the release is what would collect the grant
            String name = key("collect-takenback");
            RlockLock lock = c.getLock(name);
            CountDownLatch lost = new CountDownLatch(1);
            lock.addLostListener((n, owner, why) -> {
                if (owner.equals(lock.ownerOf(7)) && why.contains("TAKENBACK")) {
                    lost.countDown();
                }
            });
            // Cut off before its confirmation went: the server takes the grant back after
            // 200 ms and hands the lock on.
            takenBackToNext(t, lock, next.getLock(name));
            IllegalMonitorStateException e = assertThrows(IllegalMonitorStateException.class,
                    () -> Sync.join(lock.unlockAsync(7)));
            assertTrue(e.getMessage().contains("lost"), e.getMessage());
            assertTrue(lost.await(10, TimeUnit.SECONDS), "the lost-lock listener fired");
            assertTrue(next.getLock(name).isHeldByThread(8), "the release changed nothing");
            assertEquals(1, c.stats().lostLocks());
            next.getLock(name).unlockAsync(8).get(10, TimeUnit.SECONDS);
        }
    }

    @Test
    void a_holder_whose_connection_was_killed_confirms_on_the_new_one_and_keeps_the_lock() throws Exception {
        confirmMs(1000);
        Gated t = new Gated(false);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults())) {
            String name = key("kept");
            RlockLock lock = c.getLock(name);
            long revokedBefore = revoked();
            assertNull(server.call("RLOCK.ACQUIRE", name, "holder", "30000"));
            CompletableFuture<Boolean> waiting = lock.tryLockAsync(20, -1, TimeUnit.SECONDS, 7);
            TestServer.waitUntil(Duration.ofSeconds(10), "queued", () -> waiters() == 1);
            long commandConn = Sync.asLong(t.inner.send(List.of("CLIENT", "ID")).get(10, TimeUnit.SECONDS));
            assertEquals(1L, server.call("RLOCK.RELEASE", name, "holder"));
            assertTrue(waiting.get(10, TimeUnit.SECONDS));
            // Killed, then confirmed on Lettuce's new connection, within the server's grace.
            server.call("CLIENT", "KILL", "ID", Long.toString(commandConn));
            t.gate.complete(null);
            // Past the grace (1 s from the kill): still held, nothing taken back, nothing lost.
            Thread.sleep(1500);
            assertEquals(revokedBefore, revoked());
            assertTrue(lock.isHeldByThread(7));
            assertFalse(lock.isLost(7));
            assertEquals(0, c.stats().lostLocks());
            lock.unlockAsync(7).get(10, TimeUnit.SECONDS);
        }
    }

    /**
     * Releases one permit of `name` (granting the queued ticket) and pauses writes, in one
     * transaction, with rlock.ticket-confirm-ms 0: a waiter that collected before holding
     * would wait out the pause (a collect is a write); one that holds on its `granted`
     * message proceeds at once, its confirmation held by the pause.
     */
    static void grantPermitAndPauseWrites(String name) {
        confirmMs(0);
        var conn = server.redis();
        conn.multi();
        conn.dispatch(Wire.keyword("RSEMAPHORE.RELEASE"), new Reply(), ReconnectTest.args(name, "1"));
        conn.dispatch(Wire.keyword("CLIENT"), new Reply(), ReconnectTest.args("PAUSE", "60000", "WRITE"));
        conn.exec();
    }

    static long permits(String name) {
        return Sync.asLong(server.call("RSEMAPHORE.AVAILABLEPERMITS", name));
    }

    static long releasesSent() {
        String s = server.info("commandstats", "cmdstat_rsemaphore.release");
        return s == null ? 0 : Long.parseLong(s.replaceAll("^calls=(\\d+),.*", "$1"));
    }

    @Test
    void a_semaphore_release_carries_its_held_back_confirmation_in_one_write() throws Exception {
        try (RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            c.waits().deferConfirmsFor(60_000); // held back until the release, however slow the machine
            String name = key("sem-carried");
            RlockSemaphore sem = permitHeldOnGrant(c, name);
            long acquires = calls("rsemaphore.acquire"), releases = releasesSent();
            // Not waiting for an answer first: the confirmation, still held back, and the
            // release in one read.
            assertEquals(1, readsDuring(() -> sem.releaseAsync(1).get(10, TimeUnit.SECONDS)),
                    "confirmation and release read at once");
            assertEquals(1, calls("rsemaphore.acquire") - acquires, "the confirmation went with the release");
            assertEquals(1, releasesSent() - releases);
            assertEquals(1L, permits(name));
            assertEquals(0, c.stats().lostLocks());
        }
    }

    @Test
    void where_a_release_cannot_be_pinned_a_semaphores_confirmation_goes_at_once() throws Exception {
        Gated t = new Gated(false); // cannot tell its connection's generation: no pinned batch
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults())) {
            c.waits().deferConfirmsFor(60_000);
            String name = key("sem-unpinned");
            permitHeldOnGrant(c, name);
            // Not held back for a release that could not carry it (which would then wait
            // for it): it reaches the gate at once.
            TestServer.waitUntil(Duration.ofSeconds(10), "confirmation sent", () -> t.held.get() == 1);
            t.gate.complete(null);
            c.getSemaphore(name).releaseAsync(1).get(10, TimeUnit.SECONDS);
            assertEquals(1L, permits(name));
            assertEquals(0, c.stats().lostLocks());
        }
    }

    @Test
    void a_semaphore_release_does_not_ride_on_a_connection_that_broke_since_the_grant() throws Exception {
        confirmMs(200);
        LettuceTransport t = new LettuceTransport(RedisClient.create(server.uri()), true, null);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults())) {
            c.waits().deferConfirmsFor(60_000);
            String name = key("sem-broke");
            long commandConn = Sync.asLong(t.send(List.of("CLIENT", "ID")).get(10, TimeUnit.SECONDS));
            long gen = t.generation();
            RlockSemaphore sem = permitHeldOnGrant(c, name); // its confirmation held back
            CountDownLatch lost = new CountDownLatch(1);
            sem.addLostListener((n, id, why) -> lost.countDown());
            // The connection that queued the ticket closes; Lettuce opens another at once, but
            // nothing confirms within the 200 ms grace: the server takes the permit back.
            server.call("CLIENT", "KILL", "ID", Long.toString(commandConn));
            TestServer.waitUntil(Duration.ofSeconds(10), "a new command connection", () -> t.generation() > gen);
            TestServer.waitUntil(Duration.ofSeconds(10), "taken back", () -> permits(name) == 1L);
            // Riding on the new connection, the release would run behind a TAKENBACK and
            // make a second permit. It waits for the outcome instead and sends nothing.
            sem.releaseAsync(1).get(10, TimeUnit.SECONDS);
            assertTrue(lost.await(10, TimeUnit.SECONDS), "the take-back reported");
            assertEquals(1L, permits(name), "no permit made from nothing");
            assertEquals(0, c.semaphoreDebts().debt(name));
        } finally {
            confirmMs(1000);
        }
    }

    @Test
    void a_semaphore_waiter_holds_on_its_granted_message() throws Exception {
        try (RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            String name = key("sem-held");
            RlockSemaphore sem = c.getSemaphore(name);
            assertEquals(1L, server.call("RSEMAPHORE.TRYSETPERMITS", name, "1"));
            assertEquals(1L, server.call("RSEMAPHORE.ACQUIRE", name, "1"));
            CompletableFuture<Boolean> waiting = sem.tryAcquireAsync(1, 20, TimeUnit.SECONDS);
            TestServer.waitUntil(Duration.ofSeconds(10), "queued", () -> waiters() == 1);
            grantPermitAndPauseWrites(name);
            try {
                // Held while writes are paused: its confirmation (a write) waits in the server.
                assertTrue(waiting.get(10, TimeUnit.SECONDS), "held on the grant message");
            } finally {
                server.call("CLIENT", "UNPAUSE");
                confirmMs(1000);
            }
            sem.release(1);
            assertEquals(1L, permits(name));
            assertEquals(0, c.stats().lostLocks());
        }
    }

    @Test
    void a_semaphore_grant_taken_back_is_not_released_again() throws Exception {
        LettuceTransport t = new LettuceTransport(RedisClient.create(server.uri()), true, null);
        String maxclients = server.redis().configGet("maxclients").get("maxclients");
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults())) {
            String name = key("sem-takenback");
            RlockSemaphore sem = c.getSemaphore(name);
            CountDownLatch lost = new CountDownLatch(1);
            sem.addLostListener((n, id, why) -> {
                if (n.equals(name) && why.contains("TAKENBACK")) {
                    lost.countDown();
                }
            });
            assertEquals(1L, server.call("RSEMAPHORE.TRYSETPERMITS", name, "1"));
            assertEquals(1L, server.call("RSEMAPHORE.ACQUIRE", name, "1"));
            long ticketConn = Sync.asLong(t.send(List.of("CLIENT", "ID")).get(10, TimeUnit.SECONDS));
            long revokedBefore = revoked();
            CompletableFuture<Boolean> waiting = sem.tryAcquireAsync(1, 20, TimeUnit.SECONDS);
            TestServer.waitUntil(Duration.ofSeconds(10), "queued", () -> waiters() == 1);
            grantPermitAndPauseWrites(name);
            CompletableFuture<Void> released;
            long releasesBefore;
            try {
                assertTrue(waiting.get(10, TimeUnit.SECONDS), "held on the grant message");
                // No connection accepted any more (a closed one frees no place: one below
                // the count), then the ticket connection killed with its confirmation
                // unanswered: Lettuce's reconnects are refused (max number of clients) and
                // hold the confirmation, so the server takes the grant back.
                int connected = Integer.parseInt(server.info("clients", "connected_clients"));
                server.call("CONFIG", "SET", "maxclients", Integer.toString(connected - 1));
                server.call("CLIENT", "KILL", "ID", Long.toString(ticketConn));
                server.call("CLIENT", "UNPAUSE");
                TestServer.waitUntil(Duration.ofSeconds(10), "taken back",
                        () -> revoked() == revokedBefore + 1 && permits(name) == 1);
                releasesBefore = releasesSent();
                // Released before the confirmation could answer: the release waits for it.
                released = sem.releaseAsync(1);
                Thread.sleep(200);
                assertFalse(released.isDone(), "the release waits for the confirmation in flight");
            } finally {
                server.call("CLIENT", "UNPAUSE");
                server.call("CONFIG", "SET", "maxclients", maxclients);
                confirmMs(1000);
            }
            // The confirmation reaches the server again and hears TAKENBACK: the release
            // sends nothing (the server gave the permit back already).
            released.get(20, TimeUnit.SECONDS);
            assertTrue(lost.await(10, TimeUnit.SECONDS), "the lost listener fired");
            assertEquals(1L, permits(name), "one permit, not two");
            assertEquals(releasesBefore, releasesSent(), "no RSEMAPHORE.RELEASE sent");
            assertEquals(1, c.stats().lostLocks());
            assertEquals(0, c.semaphoreDebts().debt(name));
            // And the semaphore works on: its one permit taken and given back.
            assertTrue(sem.tryAcquire(1, 10, TimeUnit.SECONDS));
            sem.release(1);
            assertEquals(1L, permits(name));
        }
    }

    /**
     * The client's Lettuce transport, whose first `refusals` confirmations are answered
     * as a server at its maxclients answers a new connection (a transport that opens one
     * per command, a pool, sees this where Lettuce's reconnect would hide it).
     */
    static final class Refusing implements Transport {
        final LettuceTransport inner = new LettuceTransport(RedisClient.create(server.uri()), true, null);
        final AtomicInteger refusals;

        Refusing(int refusals) {
            this.refusals = new AtomicInteger(refusals);
        }

        @Override
        public CompletableFuture<Object> send(List<String> args) {
            if (Gated.confirmation(args) && refusals.getAndDecrement() > 0) {
                return CompletableFuture.failedFuture(
                        new io.lettuce.core.RedisCommandExecutionException("ERR max number of clients reached"));
            }
            return inner.send(args);
        }

        @Override
        public void listen(BiConsumer<String, String> l) {
            inner.listen(l);
        }

        @Override
        public CompletableFuture<Void> subscribe(String channel) {
            return inner.subscribe(channel);
        }

        @Override
        public void unsubscribe(String channel) {
            inner.unsubscribe(channel);
        }

        @Override
        public void onReconnect(Runnable hook) {
            inner.onReconnect(hook);
        }

        @Override
        public Dedicated dedicated() {
            return inner.dedicated();
        }

        @Override
        public void close() {
            inner.close();
        }
    }

    @Test
    void a_confirmation_refused_at_maxclients_is_tried_again_not_read_as_lost() throws Exception {
        Refusing t = new Refusing(2);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults())) {
            String name = key("refused");
            RlockLock lock = c.getLock(name);
            assertNull(server.call("RLOCK.ACQUIRE", name, "holder", "30000"));
            CompletableFuture<Boolean> waiting = lock.tryLockAsync(20, -1, TimeUnit.SECONDS, 7);
            TestServer.waitUntil(Duration.ofSeconds(10), "queued", () -> waiters() == 1);
            assertEquals(1L, server.call("RLOCK.RELEASE", name, "holder"));
            assertTrue(waiting.get(10, TimeUnit.SECONDS));
            // Two refusals, then the confirmation gets in and is answered: kept, not lost.
            TestServer.waitUntil(Duration.ofSeconds(10), "confirmed after the refusals", () -> t.refusals.get() < 0);
            lock.unlockAsync(7).get(10, TimeUnit.SECONDS);
            assertFalse(lock.isLost(7));
            assertEquals(0, c.stats().lostLocks());
        }
    }

    @Test
    void without_ticket_holds_a_lock_waiter_collects_its_grant_first() throws Exception {
        Gated t = new Gated(true);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults())) {
            String name = key("collect");
            RlockLock lock = c.getLock(name);
            assertNull(server.call("RLOCK.ACQUIRE", name, "holder", "30000"));
            CompletableFuture<Boolean> waiting = lock.tryLockAsync(20, -1, TimeUnit.SECONDS, 7);
            TestServer.waitUntil(Duration.ofSeconds(10), "queued", () -> waiters() == 1);
            assertEquals(1L, server.call("RLOCK.RELEASE", name, "holder"));
            // Granted in the server, and the collect sent (held back here): the waiter does
            // not proceed on the message alone.
            TestServer.waitUntil(Duration.ofSeconds(10), "granted and collecting", () -> t.held.get() == 1);
            assertFalse(waiting.isDone());
            t.gate.complete(null);
            assertTrue(waiting.get(10, TimeUnit.SECONDS));
            lock.unlockAsync(7).get(10, TimeUnit.SECONDS);
        }
    }

    @Test
    void two_hundred_waiting_threads_hold_a_few_connections_and_none_is_blocked() throws Exception {
        try (RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            String name = key("many");
            RlockLock lock = c.getLock(name);
            assertTrue(lock.tryLock());
            int before = server.connections();
            int n = 200;
            CountDownLatch done = new CountDownLatch(n);
            AtomicInteger got = new AtomicInteger();
            for (int i = 0; i < n; i++) {
                Thread th = new Thread(() -> {
                    try {
                        if (lock.tryLock(30, TimeUnit.SECONDS)) {
                            got.incrementAndGet();
                            lock.unlock();
                        }
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    } finally {
                        done.countDown();
                    }
                });
                th.setDaemon(true);
                th.start();
            }
            TestServer.waitUntil(Duration.ofSeconds(20), "200 queued", () -> waiters() == n);
            int during = server.connections();
            String list = server.redis().clientList();
            assertEquals("0", server.info("clients", "blocked_clients"), list);
            for (String line : list.split("\n")) {
                String flags = line.replaceAll(".* flags=(\\S*) .*", "$1");
                assertFalse(flags.contains("b"), "a blocked client: " + line);
            }
            assertTrue(during <= before + 1, "connections " + before + " -> " + during
                    + " (the notification connection opens with the first waiter)");
            lock.unlock();
            assertTrue(done.await(40, TimeUnit.SECONDS));
            assertEquals(n, got.get());
        }
    }
}
