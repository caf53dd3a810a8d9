// The interop proof for scripts mode (clients/java tests; docs/scripts-mode.md): the real
// Redisson and the rlock Java client in scripts mode on the same names against one server
// without the module, rlock logged in as a managed service's restricted user. Every test
// of RedissonInteropTest runs here again: both directions for every primitive, they exclude
// each other, an rlock waiter is woken by Redisson's release message and a Redisson waiter
// by rlock's, each far below any lease or timeout that could otherwise have woken it.
package io.rlock;

import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Timeout;

@Timeout(120)
@Tag(RedissonInteropTest.SCRIPTS_MODE) // RedissonInteropTest.start makes the fixtures without the module
class ScriptsRedissonInteropTest extends RedissonInteropTest {
    /** rlock's waiters here sleep on Redisson's channels, not in the server's queue. */
    @Override
    long moduleWaiters() {
        return rlock.scriptsAsleep();
    }
}
