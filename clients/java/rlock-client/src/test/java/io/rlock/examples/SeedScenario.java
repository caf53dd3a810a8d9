// The scenario of seed 000 (easy-redisson), runnable (clients/java examples): a team on
// Jedis/RedisTemplate re-wrote Redisson's re-entrant lock and watchdog by hand; here the
// same thing is two calls. Two threads contend on one lock; each one's work outlasts the
// lease, and the watchdog keeps the lock held until unlock. SeedScenarioTest runs it.
//
//   mvn -q test-compile exec:java -Dexec.classpathScope=test \
//       -Dexec.mainClass=io.rlock.examples.SeedScenario -Dexec.args="redis://127.0.0.1:6379"
package io.rlock.examples;

import io.lettuce.core.RedisURI;
import io.rlock.RlockClient;
import io.rlock.RlockLock;
import io.rlock.RlockOptions;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

public final class SeedScenario {
    /** What one worker saw: when it held the lock, and whether it held it all along. */
    public record Turn(String worker, long startNanos, long endNanos, boolean heldThroughout) {}

    private SeedScenario() {}

    /**
     * Two workers take `lock` in turn and each works `work` (longer than the watchdog
     * timeout) while checking that the lock is still theirs.
     */
    public static List<Turn> run(RlockClient client, String lockName, Duration work) throws InterruptedException {
        List<Turn> turns = Collections.synchronizedList(new ArrayList<>());
        RlockLock lock = client.getLock(lockName);
        Runnable worker = () -> {
            lock.lock(); // no lease: the watchdog's, renewed every third of it
            try {
                long start = System.nanoTime();
                boolean held = true;
                while (System.nanoTime() - start < work.toNanos()) {
                    held &= lock.isHeldByCurrentThread();
                    try {
                        Thread.sleep(50); // stands for a slice of the real work
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                        break;
                    }
                }
                turns.add(new Turn(Thread.currentThread().getName(), start, System.nanoTime(), held && !lock.isLost()));
            } finally {
                lock.unlock();
            }
        };
        Thread a = new Thread(worker, "worker-a");
        Thread b = new Thread(worker, "worker-b");
        a.start();
        b.start();
        a.join();
        b.join();
        return turns;
    }

    public static void main(String[] args) throws Exception {
        String uri = args.length > 0 ? args[0] : "redis://127.0.0.1:6379";
        Duration watchdog = Duration.ofSeconds(3);
        RlockOptions options = RlockOptions.defaults().withWatchdogTimeout(watchdog);
        try (RlockClient client = RlockClient.create(RedisURI.create(uri), options)) {
            for (Turn t : run(client, "seed:orders", watchdog.multipliedBy(2))) {
                System.out.printf("%s held the lock for %d ms (lease %d ms), held throughout: %s%n", t.worker(),
                        (t.endNanos() - t.startNanos()) / 1_000_000, watchdog.toMillis(), t.heldThroughout());
            }
        }
    }
}
