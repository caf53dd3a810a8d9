// The module's refusals in the Java client (clients/java): each code word read as its
// RlockServerException kind, and a real refusal raised as one, against a real
// module-loaded server (TestServer).
package io.rlock;

import io.lettuce.core.RedisCommandExecutionException;
import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;

class ErrorsTest {
    @Test
    void each_module_code_word_has_its_kind() {
        String[][] cases = {
            // code word, kind (empty: not the module's)
            {"BADLEASE", "BAD_ARGUMENT"}, {"BADPERMITID", "BAD_ARGUMENT"},
            {"NOTALOCK", "NOT_THIS_PRIMITIVE"}, {"NOTALATCH", "NOT_THIS_PRIMITIVE"},
            {"OVERFLOW", "OVERFLOW"}, {"TOOMANYWAITERS", "TOO_MANY_WAITERS"},
            {"TOOMANYHOLDS", "TOO_MANY_HOLDS"}, {"READHELD", "READ_HELD"},
            {"INTERNALCMD", "INTERNAL"}, {"RLOCKBUG", "MODULE_BUG"}, {"ERR", ""}, {"NOPERM", ""},
        };
        for (String[] c : cases) {
            RedisCommandExecutionException e = new RedisCommandExecutionException(c[0] + " some text");
            Throwable mapped = RlockServerException.of(e);
            if (c[1].isEmpty()) {
                assertSame(e, mapped, c[0]);
            } else {
                RlockServerException r = assertInstanceOf(RlockServerException.class, mapped, c[0]);
                assertEquals(c[0], r.code());
                assertEquals(RlockServerException.Kind.valueOf(c[1]), r.kind());
                assertEquals(c[0] + " some text", r.getMessage());
            }
        }
    }

    @Test
    void a_reader_asking_for_the_write_lock_gets_read_held() {
        try (TestServer server = new TestServer();
             RlockClient c = RlockClient.create(server.uri(), RlockOptions.defaults())) {
            RlockReadWriteLock rw = c.getReadWriteLock("java:errors:rw");
            rw.readLock().lock();
            RlockServerException e = assertThrows(RlockServerException.class, () -> rw.writeLock().tryLock());
            assertEquals("READHELD", e.code());
            assertEquals(RlockServerException.Kind.READ_HELD, e.kind());
            rw.readLock().unlock();
        }
    }
}
