// The seed 000 scenario as a test (clients/java tests): two threads contend on one lock,
// the work outlasts the lease three times, the watchdog keeps each holder's lock, and the
// two critical sections never overlap.
package io.rlock;

import io.rlock.examples.SeedScenario;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.time.Duration;
import java.util.Comparator;
import java.util.List;

import static org.junit.jupiter.api.Assertions.*;

class SeedScenarioTest {
    @Test
    @Timeout(30)
    void two_threads_contend_and_the_watchdog_outlives_the_lease() throws Exception {
        Duration lease = Duration.ofMillis(300);
        try (TestServer server = new TestServer();
             RlockClient client = RlockClient.create(server.uri(), RlockOptions.defaults().withWatchdogTimeout(lease))) {
            List<SeedScenario.Turn> turns = SeedScenario.run(client, "seed:orders", lease.multipliedBy(3));
            assertEquals(2, turns.size());
            turns.sort(Comparator.comparingLong(SeedScenario.Turn::startNanos));
            for (SeedScenario.Turn t : turns) {
                assertTrue(t.heldThroughout(), t.worker() + " lost the lock while working");
                assertTrue(t.endNanos() - t.startNanos() >= lease.multipliedBy(3).toNanos());
            }
            assertTrue(turns.get(0).endNanos() <= turns.get(1).startNanos(), "the critical sections overlapped");
            assertEquals(0, server.redis().exists("seed:orders"));
        }
    }
}
