// Tests of per-client ticket notification in the rlock Java client (clients/java;
// docs/commands/tickets.md, design.md 5, issue 40) against a real module-loaded server: two
// clients waiting on one lock each hear only their own ticket's messages (each queues with
// `NOTIFY <its tag>` and subscribes its tagged channel, nobody the key's channel), the tagged
// channel stays subscribed after its last waiter (idle: one SUBSCRIBE for many waits, at most
// Waits.MAX_IDLE_CHANNELS of them, the one idle the longest unsubscribed first, forgotten and
// subscribed again after the notification connection is killed), and a client whose server
// does not name `ticket-notify` (a test double of the probe's answer) waits on the key's
// channel as before, side by side with one that does, and leaves that channel after its last
// waiter. A Transport wrapper counts what each client hears.
package io.rlock;

import io.lettuce.core.RedisClient;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.function.BiConsumer;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(60)
class NotifyTest {
    static TestServer server;

    @BeforeAll
    static void start() {
        server = new TestServer();
    }

    @AfterAll
    static void stop() {
        server.close();
    }

    static String key(String what) {
        return "java:notify:" + what + ":" + System.nanoTime();
    }

    static long waiters() {
        return Long.parseLong(server.info("rlock", "rlock_waiters"));
    }

    /** Subscribers of `channel` (PUBSUB NUMSUB). */
    static long numsub(String channel) {
        List<?> r = (List<?>) server.call("PUBSUB", "NUMSUB", channel);
        return (Long) r.get(1);
    }

    /**
     * The client's own Lettuce transport, keeping every message its listener hears and
     * every waiting command it sends; optionally with `ticket-notify` taken out of
     * RLOCK.HELLO's answer (a server that does not name it).
     */
    static final class Counting implements Transport {
        final LettuceTransport inner;
        final boolean hideNotify;
        final List<String> heard = new CopyOnWriteArrayList<>();
        final List<List<String>> queued = new CopyOnWriteArrayList<>();
        /** The client's tag, once the test has read it. */
        volatile String tag;
        /** Every channel the client asked to subscribe (Lettuce's own resubscribes not). */
        final List<String> subscribed = new CopyOnWriteArrayList<>();

        Counting(boolean hideNotify) {
            this.inner = new LettuceTransport(RedisClient.create(server.uri()), true, null);
            this.hideNotify = hideNotify;
        }

        @Override
        public CompletableFuture<Object> send(List<String> args) {
            if (args.contains("ASYNC")) {
                queued.add(args);
            }
            CompletableFuture<Object> r = inner.send(args);
            return hideNotify && args.equals(Capabilities.HELLO) ? r.thenApply(Counting::withoutNotify) : r;
        }

        static Object withoutNotify(Object reply) {
            List<Object> flat = new ArrayList<>((List<?>) reply);
            for (int i = 0; i + 1 < flat.size(); i += 2) {
                if ("features".equals(flat.get(i))) {
                    List<Object> words = new ArrayList<>((List<?>) flat.get(i + 1));
                    words.remove("ticket-notify");
                    flat.set(i + 1, words);
                }
            }
            return flat;
        }

        /** The messages heard but the test's own markers. */
        List<String> tickets() {
            return heard.stream().filter(m -> !m.startsWith("marker")).toList();
        }

        @Override
        public void listen(BiConsumer<String, String> l) {
            inner.listen((c, m) -> {
                heard.add(m);
                l.accept(c, m);
            });
        }

        @Override
        public CompletableFuture<Void> subscribe(String channel) {
            subscribed.add(channel);
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

    /**
     * Everything published to `channel` before now has reached `t`: a marker published
     * after it comes in order on the same subscription.
     */
    static void drained(Counting t, String channel) {
        String marker = "marker-" + System.nanoTime();
        assertEquals(1L, server.call("PUBLISH", channel, marker));
        TestServer.waitUntil(Duration.ofSeconds(10), "the marker heard", () -> t.heard.contains(marker));
    }

    @Test
    void each_client_draws_its_own_tag() {
        try (RlockClient a = RlockClient.create(server.uri(), RlockOptions.defaults()); RlockClient b = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            String ta = a.waits().tag(), tb = b.waits().tag();
            assertTrue(ta.matches("[0-9a-f]{16}"), ta);
            assertTrue(tb.matches("[0-9a-f]{16}"), tb);
            assertNotEquals(ta, tb);
        }
    }

    @Test
    void two_clients_waiting_on_one_lock_never_hear_each_others_grants() throws Exception {
        Counting ta = new Counting(false), tb = new Counting(false);
        try (RlockClient a = RlockClient.create(ta, RlockOptions.defaults());
             RlockClient b = RlockClient.create(tb, RlockOptions.defaults())) {
            assertTrue(a.capabilities().has("ticket-notify"), "the module names ticket-notify: " + a.capabilities());
            String name = key("two");
            String keyChannel = Waits.channel(name);
            String chanA = Waits.channel(name, a.waits().tag()), chanB = Waits.channel(name, b.waits().tag());
            ta.tag = a.waits().tag();
            tb.tag = b.waits().tag();
            assertNull(server.call("RLOCK.ACQUIRE", name, "holder", "30000"));
            CompletableFuture<Boolean> fa = a.getLock(name).tryLockAsync(20, -1, TimeUnit.SECONDS, 1);
            TestServer.waitUntil(Duration.ofSeconds(10), "a queued", () -> waiters() == 1);
            CompletableFuture<Boolean> fb = b.getLock(name).tryLockAsync(20, -1, TimeUnit.SECONDS, 2);
            TestServer.waitUntil(Duration.ofSeconds(10), "b queued", () -> waiters() == 2);
            // Each on its own channel, nobody on the key's.
            assertEquals(0, numsub(keyChannel));
            assertEquals(1, numsub(chanA));
            assertEquals(1, numsub(chanB));
            assertTrue(ta.queued.get(0).containsAll(List.of("NOTIFY", a.waits().tag())), ta.queued.toString());
            assertTrue(tb.queued.get(0).containsAll(List.of("NOTIFY", b.waits().tag())), tb.queued.toString());

            // The handoff to a: a hears its grant, b hears nothing.
            assertEquals(1L, server.call("RLOCK.RELEASE", name, "holder"));
            assertTrue(fa.get(10, TimeUnit.SECONDS));
            drained(tb, chanB);
            assertEquals(1, ta.tickets().size(), ta.heard.toString());
            assertTrue(ta.tickets().get(0).startsWith("granted:"), ta.heard.toString());
            assertEquals(List.of(), tb.tickets(), "b heard a's grant");
            assertFalse(fb.isDone());
            // a's channel stays subscribed after its last waiter (idle: only a's own messages
            // come there); b's while b waits.
            TestServer.waitUntil(Duration.ofSeconds(10), "a's channel idle", () -> a.waits().idle(chanA));
            assertEquals(1, numsub(chanA));
            assertEquals(1, numsub(chanB));

            // The handoff to b: a hears nothing more.
            a.getLock(name).unlockAsync(1).get(10, TimeUnit.SECONDS);
            assertTrue(fb.get(10, TimeUnit.SECONDS));
            assertEquals(1, tb.tickets().size(), tb.heard.toString());
            assertEquals(1, ta.tickets().size(), ta.heard.toString());
            b.getLock(name).unlockAsync(2).get(10, TimeUnit.SECONDS);
            TestServer.waitUntil(Duration.ofSeconds(10), "b's channel idle", () -> b.waits().idle(chanB));
            assertEquals(1, numsub(chanB));
            assertEquals(0, a.registeredWaiters() + b.registeredWaiters());
        }
        // Closed, they took their idle channels with their notification connections.
        TestServer.waitUntil(Duration.ofSeconds(10), "the idle channels gone with their clients",
                () -> ((List<?>) server.call("PUBSUB", "CHANNELS", "rlock_ticket:*:" + ta.tag)).isEmpty()
                        && ((List<?>) server.call("PUBSUB", "CHANNELS", "rlock_ticket:*:" + tb.tag)).isEmpty());
    }

    @Test
    void every_waiting_primitive_queues_with_its_tag_and_hears_on_its_channel() throws Exception {
        Counting t = new Counting(false);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults())) {
            String name = key("prims");
            String mine = Waits.channel(name, c.waits().tag());
            RlockCountDownLatch latch = c.getCountDownLatch(name);
            assertTrue(latch.trySetCount(1));
            CompletableFuture<Boolean> opened = latch.awaitAsync(20, TimeUnit.SECONDS);
            TestServer.waitUntil(Duration.ofSeconds(10), "latch waiter subscribed", () -> numsub(mine) == 1);
            latch.countDown();
            assertTrue(opened.get(10, TimeUnit.SECONDS));

            RlockSemaphore sem = c.getSemaphore(key("sem"));
            assertTrue(sem.trySetPermits(1));
            assertTrue(sem.tryAcquire(1)); // one try: no ticket
            CompletableFuture<Boolean> permit = sem.tryAcquireAsync(1, 20, TimeUnit.SECONDS);
            String semMine = Waits.channel(sem.getName(), c.waits().tag());
            TestServer.waitUntil(Duration.ofSeconds(10), "semaphore waiter subscribed", () -> numsub(semMine) == 1);
            sem.release(1);
            assertTrue(permit.get(10, TimeUnit.SECONDS));
            for (List<String> q : t.queued) {
                assertTrue(q.containsAll(List.of("NOTIFY", c.waits().tag())), q.toString());
            }
            assertEquals(2, t.queued.size(), t.queued.toString());
        }
    }

    @Test
    void a_client_whose_server_does_not_name_ticket_notify_waits_on_the_keys_channel() throws Exception {
        Counting old = new Counting(true), tagged = new Counting(false);
        try (RlockClient a = RlockClient.create(old, RlockOptions.defaults());
             RlockClient b = RlockClient.create(tagged, RlockOptions.defaults())) {
            assertFalse(a.capabilities().has("ticket-notify"));
            String name = key("fallback");
            String keyChannel = Waits.channel(name), chanB = Waits.channel(name, b.waits().tag());
            assertNull(server.call("RLOCK.ACQUIRE", name, "holder", "30000"));
            CompletableFuture<Boolean> fa = a.getLock(name).tryLockAsync(20, -1, TimeUnit.SECONDS, 1);
            TestServer.waitUntil(Duration.ofSeconds(10), "a queued", () -> waiters() == 1);
            CompletableFuture<Boolean> fb = b.getLock(name).tryLockAsync(20, -1, TimeUnit.SECONDS, 2);
            TestServer.waitUntil(Duration.ofSeconds(10), "b queued", () -> waiters() == 2);
            assertEquals(1, numsub(keyChannel), "the fallback subscribes the key's channel");
            assertEquals(0, numsub(Waits.channel(name, a.waits().tag())));
            assertEquals(1, numsub(chanB));
            assertFalse(old.queued.get(0).contains("NOTIFY"), old.queued.toString());

            // FIFO across both ways of hearing: a first (on the key's channel), then b.
            assertEquals(1L, server.call("RLOCK.RELEASE", name, "holder"));
            assertTrue(fa.get(10, TimeUnit.SECONDS));
            drained(tagged, chanB);
            assertEquals(List.of(), tagged.tickets(), "b heard a's grant");
            a.getLock(name).unlockAsync(1).get(10, TimeUnit.SECONDS);
            assertTrue(fb.get(10, TimeUnit.SECONDS));
            assertEquals(1, old.tickets().size(), "the fallback heard only its own grant: " + old.heard);
            b.getLock(name).unlockAsync(2).get(10, TimeUnit.SECONDS);
            // The key's channel carries every client's messages: left after its last waiter.
            // The tagged one stays, idle.
            TestServer.waitUntil(Duration.ofSeconds(10), "key channel unsubscribed", () -> numsub(keyChannel) == 0);
            assertFalse(a.waits().idle(keyChannel));
            assertEquals(0, a.waits().idleChannels());
            assertEquals(1, numsub(chanB));
            TestServer.waitUntil(Duration.ofSeconds(10), "the channel idle", () -> b.waits().idle(chanB));
        }
    }

    /** `calls` of `command` in INFO commandstats (0: not called since CONFIG RESETSTAT). */
    static long calls(String command) {
        String stat = server.info("commandstats", "cmdstat_" + command);
        if (stat == null) {
            return 0;
        }
        for (String part : stat.split(",")) {
            if (part.startsWith("calls=")) {
                return Long.parseLong(part.substring("calls=".length()));
            }
        }
        return 0;
    }

    /**
     * `c` waits for `name`, held by the test's own connection, so that the wait really
     * queues a ticket; the test releases, the client holds and unlocks. On a thread of its
     * own with the blocking API when `blocking`, else with the async one.
     */
    static void oneQueuedWait(RlockClient c, String name, boolean blocking) throws Exception {
        assertNull(server.call("RLOCK.ACQUIRE", name, "holder", "30000"));
        long base = waiters();
        RlockLock lock = c.getLock(name);
        CompletableFuture<Boolean> got;
        if (blocking) {
            got = CompletableFuture.supplyAsync(() -> {
                try {
                    boolean ok = lock.tryLock(20, TimeUnit.SECONDS);
                    if (ok) {
                        lock.unlock();
                    }
                    return ok;
                } catch (InterruptedException e) {
                    throw new java.util.concurrent.CompletionException(e);
                }
            });
        } else {
            got = lock.tryLockAsync(20, -1, TimeUnit.SECONDS, 7)
                    .thenCompose(ok -> ok ? lock.unlockAsync(7).thenApply(v -> true) : CompletableFuture.completedFuture(false));
        }
        TestServer.waitUntil(Duration.ofSeconds(10), "the ticket queued on " + name, () -> waiters() == base + 1);
        assertEquals(1L, server.call("RLOCK.RELEASE", name, "holder"));
        assertTrue(got.get(10, TimeUnit.SECONDS), "granted " + name);
        assertEquals(0L, server.redis().exists(name), "released " + name);
    }

    @Test
    void one_subscribe_serves_many_waits_on_a_key_the_channel_staying_subscribed_between_them() throws Exception {
        try (RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            assertTrue(c.capabilities().has("ticket-notify"));
            String name = key("idle");
            String mine = Waits.channel(name, c.waits().tag());
            server.call("CONFIG", "RESETSTAT");
            for (int i = 0; i < 5; i++) {
                oneQueuedWait(c, name, i % 2 == 1); // async and blocking alike
            }
            assertEquals(1, calls("subscribe"), "one SUBSCRIBE for 5 waits");
            assertEquals(0, calls("unsubscribe"), "no UNSUBSCRIBE");
            assertEquals(1, numsub(mine));
            TestServer.waitUntil(Duration.ofSeconds(10), "the channel idle", () -> c.waits().idle(mine));
            assertEquals(0, c.registeredWaiters());
        }
    }

    @Test
    void at_most_64_idle_channels_stay_subscribed_the_one_idle_the_longest_unsubscribed_first() throws Exception {
        try (RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            String tag = c.waits().tag();
            String base = key("bounded");
            List<String> chans = new ArrayList<>();
            for (int i = 0; i <= Waits.MAX_IDLE_CHANNELS; i++) { // 65 keys in turn
                oneQueuedWait(c, base + ":" + i, false);
                chans.add(Waits.channel(base + ":" + i, tag));
            }
            TestServer.waitUntil(Duration.ofSeconds(10), "the first key's channel unsubscribed", () -> numsub(chans.get(0)) == 0);
            List<?> subscribed = (List<?>) server.call("PUBSUB", "CHANNELS", "rlock_ticket:*:" + tag);
            assertEquals(Waits.MAX_IDLE_CHANNELS, subscribed.size(), subscribed.toString());
            for (int i = 1; i <= Waits.MAX_IDLE_CHANNELS; i++) {
                assertEquals(1, numsub(chans.get(i)), chans.get(i));
            }
            TestServer.waitUntil(Duration.ofSeconds(10), "64 idle", () -> c.waits().idleChannels() == Waits.MAX_IDLE_CHANNELS);
            assertFalse(c.waits().idle(chans.get(0)));

            // A wait on an idle channel makes it the newest idle: key 1's, used again,
            // outlives key 2's at the next eviction.
            oneQueuedWait(c, base + ":1", true);
            oneQueuedWait(c, base + ":new", false);
            TestServer.waitUntil(Duration.ofSeconds(10), "key 2's channel unsubscribed", () -> numsub(chans.get(2)) == 0);
            assertEquals(1, numsub(chans.get(1)), "key 1's channel, used again, stays");
            TestServer.waitUntil(Duration.ofSeconds(10), "64 idle", () -> c.waits().idleChannels() == Waits.MAX_IDLE_CHANNELS);
            assertEquals(Waits.MAX_IDLE_CHANNELS,
                    ((List<?>) server.call("PUBSUB", "CHANNELS", "rlock_ticket:*:" + tag)).size());
        }
    }

    @Test
    void an_idle_channel_is_forgotten_when_the_notification_connection_is_killed_and_subscribed_again() throws Exception {
        Counting t = new Counting(false);
        try (RlockClient c = RlockClient.create(t, RlockOptions.defaults())) {
            String name = key("reconnect");
            String mine = Waits.channel(name, c.waits().tag());
            oneQueuedWait(c, name, false);
            TestServer.waitUntil(Duration.ofSeconds(10), "the channel idle", () -> c.waits().idle(mine));
            assertEquals(1, numsub(mine));
            assertEquals(1L, server.call("CLIENT", "KILL", "TYPE", "pubsub"), "the client's one notification connection");
            // Lettuce subscribes its channels again on the new connection; the client then
            // unsubscribes the idle ones and forgets them.
            TestServer.waitUntil(Duration.ofSeconds(10), "the idle channel forgotten", () -> c.waits().idleChannels() == 0);
            TestServer.waitUntil(Duration.ofSeconds(10), "the idle channel unsubscribed on the new connection",
                    () -> numsub(mine) == 0);
            assertEquals(1, java.util.Collections.frequency(t.subscribed, mine));

            // The next wait on the key subscribes again (confirmed before its ticket) and is granted.
            oneQueuedWait(c, name, true);
            assertEquals(2, java.util.Collections.frequency(t.subscribed, mine), t.subscribed.toString());
            assertEquals(1, numsub(mine));
            TestServer.waitUntil(Duration.ofSeconds(10), "the channel idle", () -> c.waits().idle(mine));
        }
    }
}
