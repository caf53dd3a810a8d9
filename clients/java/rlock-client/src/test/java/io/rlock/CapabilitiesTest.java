// The capability probe (clients/java): RLOCK.HELLO read into Capabilities, asked once per
// command connection and again after a reconnect, and what the client does when the
// server cannot be probed. Against a real module-loaded server (TestServer).
package io.rlock;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

class CapabilitiesTest {
    static TestServer server;

    @BeforeAll
    static void start() {
        server = new TestServer();
    }

    @AfterAll
    static void stop() {
        server.close();
    }

    /** How many times the server ran RLOCK.HELLO (INFO commandstats). */
    static long helloCalls() {
        String stat = server.info("commandstats", "cmdstat_rlock.hello");
        return stat == null ? 0 : Long.parseLong(stat.split(",")[0].substring("calls=".length()));
    }

    @Test
    void it_reads_a_map_by_field_name_and_an_unknown_command_is_no_module() {
        Capabilities c = Capabilities.parse(List.of("features", List.of("tickets", "lock"), "module", "rlock",
                "protocol", 1L, "replication", "effects", "version", "0.1.0", "added-later", 7L));
        assertTrue(c.module() && c.tickets() && c.has("lock"));
        assertFalse(c.has("latch"));
        assertEquals("effects", c.replication());
        assertEquals("0.1.0", c.version());
        assertThrows(IllegalStateException.class, () -> Capabilities.parse(List.of("module", "rlock")));
        assertThrows(IllegalStateException.class, () -> Capabilities.parse(1L));
        var unknown = new io.lettuce.core.RedisCommandExecutionException(
                "ERR unknown command 'RLOCK.HELLO', with args beginning with: ");
        assertEquals(Capabilities.NO_MODULE, Capabilities.fromError(unknown));
        assertEquals(null, Capabilities.fromError(new io.lettuce.core.RedisCommandExecutionException(
                "NOPERM User has no permissions to run the 'rlock.hello' command")));
    }

    @Test
    void the_client_probes_once_per_connection_and_again_after_a_reconnect() {
        try (RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            long before = helloCalls();
            Capabilities caps = c.capabilities();
            assertTrue(caps.module() && caps.tickets() && caps.has("permit-expirable-semaphore"), caps.toString());
            assertEquals(Capabilities.PROTOCOL_VERSION, caps.protocol());
            assertEquals("commands", caps.replication());
            assertFalse(caps.has("sharded-channels"));
            // A waiting call uses the answer already had.
            RlockLock lock = c.getLock("java:caps:" + System.nanoTime());
            assertTrue(lock.tryLock());
            lock.unlock();
            assertEquals(before + 1, helloCalls());
            // Killed (every plain connection but the admin's), Lettuce reconnects the
            // client's command connection, and the client asks again.
            server.call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes");
            TestServer.waitUntil(Duration.ofSeconds(20), "probed again", () -> helloCalls() == before + 2);
            assertTrue(c.capabilities().tickets());
        }
    }

    @Test
    void a_server_without_the_module_is_no_module() {
        try (TestServer bare = new TestServer();
             RlockClient c = RlockClient.create(bare.uri(), RlockOptions.defaults())) {
            bare.call("MODULE", "UNLOAD", "rlock");
            assertEquals(Capabilities.NO_MODULE, c.capabilities());
        }
    }

    /**
     * A user who may not run RLOCK.HELLO: the client cannot learn that the server queues
     * tickets, so it blocks a connection instead (a wait that works wherever the module is).
     */
    @Test
    void a_user_who_may_not_probe_waits_the_blocking_way() throws Exception {
        server.call("ACL", "SETUSER", "noprobe", "on", ">pw", "~*", "&*", "+@all", "-rlock.hello");
        String key = "java:caps:noprobe:" + System.nanoTime();
        var uri = io.lettuce.core.RedisURI.create("redis://noprobe:pw@127.0.0.1:" + server.uri().getPort());
        try (RlockClient holder = RlockClient.create(server.uri(), RlockOptions.defaults());
             RlockClient c = RlockClient.create(uri, RlockOptions.defaults())) {
            RlockLock held = holder.getLock(key);
            held.lock();
            AtomicReference<Boolean> got = new AtomicReference<>();
            Thread t = new Thread(() -> {
                try {
                    RlockLock lock = c.getLock(key);
                    got.set(lock.tryLock(10, TimeUnit.SECONDS));
                    lock.unlock();
                } catch (InterruptedException e) {
                    throw new RuntimeException(e);
                }
            });
            t.setDaemon(true);
            t.start();
            TestServer.waitUntil(Duration.ofSeconds(10), "blocked", () ->
                    Long.parseLong(server.info("clients", "blocked_clients")) == 1);
            held.unlock();
            t.join(10_000);
            assertEquals(Boolean.TRUE, got.get());
        } finally {
            server.call("ACL", "DELUSER", "noprobe");
        }
    }
}
