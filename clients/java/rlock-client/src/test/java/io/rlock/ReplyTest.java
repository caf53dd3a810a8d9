// Tests of the generic reply reader (clients/java, Reply) against a real server: every
// reply shape the rlock commands use comes back as plain Java values, under RESP3 (Lettuce's
// default on servers that speak it) and RESP2.
package io.rlock;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisClient;
import io.lettuce.core.protocol.ProtocolVersion;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

import java.util.List;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

class ReplyTest {
    @ParameterizedTest
    @EnumSource(value = ProtocolVersion.class)
    void every_reply_shape_reads_as_java_values(ProtocolVersion protocol) throws Exception {
        try (TestServer server = new TestServer()) {
            RedisClient c = RedisClient.create(server.uri());
            c.setOptions(ClientOptions.builder().protocolVersion(protocol).build());
            try (LettuceTransport t = new LettuceTransport(c, false, null)) {
                Wire w = new Wire(t, null, RlockOptions.defaults().withRetryAttempts(1));
                assertNull(get(w, "RLOCK.ACQUIRE", "k", "a", "10000"));
                Object pttl = get(w, "RLOCK.ACQUIRE", "k", "b", "10000");
                assertInstanceOf(Long.class, pttl);
                assertEquals("QUEUED", get(w, "RLOCK.ACQUIRE", "k", "b", "10000", "WAIT", "1000", "ASYNC", "ID", "x"));
                List<?> fenced = (List<?>) get(w, "RFENCED.ACQUIRE", "f", "a", "10000");
                assertNull(fenced.get(0));
                assertInstanceOf(Long.class, fenced.get(1));
                assertEquals(List.of(), get(w, "KEYS", "nothing*"));
                get(w, "RRWLOCK.ACQUIRE", "rw", "READ", "a", "10000");
                List<?> info = (List<?>) get(w, "RRWLOCK.INFO", "rw");
                assertEquals("mode", info.get(0));
                assertEquals("read", info.get(1));
                assertTrue(info.contains("waiters"), info.toString());
                assertEquals("PONG", get(w, "PING"));
                ExecutionErr e = new ExecutionErr(w);
                assertTrue(e.text("RLOCK.ACQUIRE", "k", "a", "nope").startsWith("BADLEASE"));
            } finally {
                c.shutdown();
            }
        }
    }

    private static Object get(Wire w, String... args) throws Exception {
        return w.send(List.of(args)).get(5, TimeUnit.SECONDS);
    }

    private record ExecutionErr(Wire w) {
        String text(String... args) {
            try {
                w.send(List.of(args)).get(5, TimeUnit.SECONDS);
                return "no error";
            } catch (Exception e) {
                return Wire.serverError(e);
            }
        }
    }
}
