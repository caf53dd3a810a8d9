// Tests of how the Java client's waiting acquires start (clients/java; spec/vectors/waits.json,
// the rule in Contention) against a real module-loaded server: an uncontended waiting
// acquire asks without WAIT and queues no ticket; a handle that had to queue lately queues
// at once, with no failed try first; a try that finds the lock held is followed by the
// queued wait, first come first served. Commands are counted in INFO commandstats.
package io.rlock;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.time.Duration;
import java.util.Collections;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

import static org.junit.jupiter.api.Assertions.*;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

@Timeout(60)
class TriesFirstTest {
    static TestServer server;
    /** The holder's client, and the waiter's: each its own connections. */
    static RlockClient holder;
    static RlockClient waiter;

    @BeforeAll
    static void start() {
        server = new TestServer();
        holder = RlockClient.create(server.uri(), RlockOptions.defaults());
        waiter = RlockClient.create(server.uri(), RlockOptions.defaults());
    }

    @AfterAll
    static void stop() {
        holder.close();
        waiter.close();
        server.close();
    }

    static String key(String what) {
        return "java:triesfirst:" + what + ":" + System.nanoTime();
    }

    /** How many times the server ran `command` (INFO commandstats; 0 if never). */
    static long calls(String command) {
        String stat = server.info("commandstats", "cmdstat_" + command);
        return stat == null ? 0 : Long.parseLong(stat.split(",")[0].substring("calls=".length()));
    }

    static long subscribes() {
        return calls("subscribe") + calls("ssubscribe");
    }

    static long ticketsQueued() {
        return Long.parseLong(server.info("rlock", "rlock_tickets_queued"));
    }

    static long serverWaiters() {
        return Long.parseLong(server.info("rlock", "rlock_waiters"));
    }

    static Thread spawn(Runnable r) {
        Thread t = new Thread(r);
        t.setDaemon(true);
        t.start();
        return t;
    }

    @Test
    void an_uncontended_waiting_acquire_asks_without_a_ticket() throws Exception {
        // A fresh key: a ticket would subscribe its channel first (ticket or not, the
        // server answers a free lock at once, so tickets_queued alone cannot tell).
        RlockLock lock = waiter.getLock(key("lock"));
        long acquires = calls("rlock.acquire");
        long subs = subscribes();
        long queued = ticketsQueued();
        assertTrue(lock.tryLock(5, TimeUnit.SECONDS));
        assertEquals(1, calls("rlock.acquire") - acquires, "one command: the try");
        assertEquals(subs, subscribes(), "no ticket channel subscribed");
        assertEquals(queued, ticketsQueued());
        assertTrue(lock.isHeldByCurrentThread());
        lock.unlock();

        RlockSemaphore sem = waiter.getSemaphore(key("sem"));
        assertTrue(sem.trySetPermits(1));
        acquires = calls("rsemaphore.acquire");
        sem.acquire();
        assertEquals(1, calls("rsemaphore.acquire") - acquires);
        assertEquals(subs, subscribes(), "no ticket channel subscribed");
        sem.release();

        RlockPermitExpirableSemaphore psem = waiter.getPermitExpirableSemaphore(key("psem"));
        assertTrue(psem.trySetPermits(1));
        acquires = calls("rpsemaphore.acquire");
        String id = psem.tryAcquire(5, TimeUnit.SECONDS);
        assertNotNull(id);
        assertEquals(1, calls("rpsemaphore.acquire") - acquires);
        assertEquals(subs, subscribes(), "no ticket channel subscribed");
        assertEquals(queued, ticketsQueued());
        psem.release(id);
    }

    @Test
    void a_handle_that_had_to_queue_lately_queues_at_once() throws Exception {
        String name = key("queued");
        RlockLock h = holder.getLock(name);
        RlockLock b = waiter.getLock(name);
        long base = serverWaiters(); // the server's count: other tests' waits may still be in
        waiter.waits().deferConfirmsFor(60_000); // sent by flushHeldBack below, and only there
        h.lock();
        Thread t = spawn(b::lock); // tries (held), then queues
        TestServer.waitUntil(Duration.ofSeconds(10), "the waiter queued", () -> serverWaiters() == base + 1);
        h.forceUnlock();
        t.join(10_000);
        long granted = System.nanoTime(); // b found it held (its grant was QUEUED first)
        // Its grant's confirmation, held back for a release that forceUnlock is not, goes
        // now: not inside the window counted below.
        waiter.waits().flushHeldBack().get(10, TimeUnit.SECONDS);
        assertTrue(b.isLocked());
        b.forceUnlock();
        h.lock();

        long acquires = calls("rlock.acquire");
        AtomicBoolean got = new AtomicBoolean();
        Thread t2 = spawn(() -> {
            try {
                got.set(b.tryLock(10, TimeUnit.SECONDS));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        TestServer.waitUntil(Duration.ofSeconds(10), "the waiter queued again", () -> serverWaiters() == base + 1);
        // Within the second (a loaded machine may take longer: then the rule rightly tries).
        assumeTrue(System.nanoTime() - granted < Contention.CONTENDED_FOR_MS * 900_000L, "took over 0.9 s");
        assertEquals(1, calls("rlock.acquire") - acquires, "the ticket alone, no failed try first");
        h.forceUnlock();
        t2.join(10_000);
        assertTrue(got.get());
        b.forceUnlock();
    }

    @Test
    void a_try_that_finds_it_held_queues_behind_earlier_waiters() throws Exception {
        String name = key("fifo");
        RlockLock h = holder.getLock(name);
        long base = serverWaiters(); // the server's count: other tests' waits may still be in
        h.lock();
        List<String> order = Collections.synchronizedList(new ArrayList<>());
        RlockClient first = RlockClient.create(server.uri(), RlockOptions.defaults());
        try {
            RlockLock w1 = first.getLock(name);
            Thread t1 = spawn(() -> {
                w1.lock();
                order.add("first");
                w1.unlock();
            });
            TestServer.waitUntil(Duration.ofSeconds(10), "the first waiter queued", () -> serverWaiters() == base + 1);
            long acquires = calls("rlock.acquire");
            RlockLock b = waiter.getLock(name); // a fresh handle: it tries first
            AtomicBoolean got = new AtomicBoolean();
            Thread t2 = spawn(() -> {
                try {
                    got.set(b.tryLock(10, TimeUnit.SECONDS));
                    order.add("second");
                    b.unlock();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            });
            TestServer.waitUntil(Duration.ofSeconds(10), "the second waiter queued", () -> serverWaiters() == base + 2);
            assertEquals(2, calls("rlock.acquire") - acquires, "the try (held), then the ticket");
            h.forceUnlock();
            t1.join(10_000);
            t2.join(10_000);
            assertTrue(got.get());
            assertEquals(List.of("first", "second"), order, "first come, first served");
        } finally {
            first.close();
        }
    }
}
