// The interop proof for scripts mode (clients/java tests; docs/scripts-mode.md): the real
// Redisson and the rlock Java client in scripts mode on the same names against one server
// without the module, rlock logged in as a managed service's restricted user. Every test
// of RedissonInteropTest runs here again: both directions for every primitive, they exclude
// each other, an rlock waiter is woken by Redisson's release message and a Redisson waiter
// by rlock's, each far below any lease or timeout that could otherwise have woken it.
package io.rlock;

import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.redisson.api.RPermitExpirableSemaphore;

import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(120)
@Tag(RedissonInteropTest.SCRIPTS_MODE) // RedissonInteropTest.start makes the fixtures without the module
class ScriptsRedissonInteropTest extends RedissonInteropTest {
    /**
     * A permit Redisson took (its id: 16 random bytes, most of them 0x80 or more) is renewed
     * and released by rlock, which sends the raw bytes, and rlock's permit by Redisson.
     */
    @Test
    void permit_ids_pass_both_ways() throws Exception {
        String n = name("psem-ids");
        RPermitExpirableSemaphore r = redisson.getPermitExpirableSemaphore(n);
        RlockPermitExpirableSemaphore m = rlock.getPermitExpirableSemaphore(n);
        assertTrue(m.trySetPermits(2));
        for (int i = 0; i < 3; i++) {
            String rid = r.tryAcquire(0, 30, TimeUnit.SECONDS);
            assertTrue(m.updateLeaseTime(rid, 20, TimeUnit.SECONDS), "rlock renews Redisson's " + rid);
            assertTrue(m.tryRelease(rid), "rlock releases Redisson's " + rid);
            String mid = m.tryAcquire(0, 30_000, TimeUnit.MILLISECONDS);
            assertTrue(onRedissonThread(() -> r.tryRelease(mid)), "Redisson releases rlock's " + mid);
        }
        assertEquals(2, m.availablePermits());
    }

    /** rlock's waiters here sleep on Redisson's channels, not in the server's queue. */
    @Override
    long moduleWaiters() {
        return rlock.scriptsAsleep();
    }
}
