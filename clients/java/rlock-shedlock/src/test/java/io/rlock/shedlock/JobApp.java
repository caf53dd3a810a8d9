// The test application of rlock-shedlock's proof: a Spring Boot application whose one
// @SchedulerLock job records each run in the server (list `job:runs`, "<who>:<server ms>")
// and then returns, or (job.hang=true) hangs as a stuck or killed instance would. It runs in
// the test's JVM, and as a child JVM of its own (main) to be killed mid-job.
package io.rlock.shedlock;

import io.rlock.RlockClient;
import io.rlock.spring.Apps;
import net.javacrumbs.shedlock.core.LockProvider;
import net.javacrumbs.shedlock.spring.annotation.EnableSchedulerLock;
import net.javacrumbs.shedlock.spring.annotation.SchedulerLock;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.SpringBootConfiguration;
import org.springframework.boot.autoconfigure.EnableAutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.context.annotation.Bean;
import org.springframework.data.redis.connection.RedisConnectionFactory;
import org.springframework.data.redis.core.RedisCallback;
import org.springframework.data.redis.core.StringRedisTemplate;
import org.springframework.scheduling.annotation.EnableScheduling;
import org.springframework.scheduling.annotation.Scheduled;

@SpringBootConfiguration
@EnableAutoConfiguration
@EnableScheduling
@EnableSchedulerLock(defaultLockAtMostFor = "10s")
public class JobApp {
    /** The provider: the only line a ShedLock application changes. */
    @Bean
    LockProvider lockProvider(RlockClient rlock) {
        return new RlockLockProvider(rlock);
    }

    @Bean
    @ConditionalOnProperty("job.cron")
    EverySecond everySecond(RedisConnectionFactory factory, @Value("${job.who}") String who) {
        return new EverySecond(new Recorder(new StringRedisTemplate(factory), who));
    }

    @Bean
    @ConditionalOnProperty("job.delay")
    Leased leased(RedisConnectionFactory factory, @Value("${job.who}") String who,
                  @Value("${job.hang:false}") boolean hang) {
        return new Leased(new Recorder(new StringRedisTemplate(factory), who), hang);
    }

    /** Appends "<who>:<server ms>" to a list. */
    record Recorder(StringRedisTemplate redis, String who) {
        void record(String list) {
            Long t = redis.execute((RedisCallback<Long>) c -> c.serverCommands().time());
            redis.opsForList().rightPush(list, who + ":" + t);
        }

        /**
         * Appends "<who>:<server ms>:<the job lock's PTTL read after it>": their sum is at
         * most the lease's end (the PTTL is read later than the time), whatever time passed
         * between taking the lock and this record.
         */
        void recordLease(String list, String lockKey) {
            Long t = redis.execute((RedisCallback<Long>) c -> c.serverCommands().time());
            Long pttl = redis.getExpire(lockKey, java.util.concurrent.TimeUnit.MILLISECONDS);
            redis.opsForList().rightPush(list, who + ":" + t + ":" + pttl);
        }
    }

    public static class EverySecond {
        private final Recorder rec;

        EverySecond(Recorder rec) {
            this.rec = rec;
        }

        /** Every second on every instance; run on one of them per second. */
        @Scheduled(cron = "${job.cron}")
        @SchedulerLock(name = "every-second", lockAtLeastFor = "500ms", lockAtMostFor = "5s")
        public void run() {
            rec.record("job:runs");
        }
    }

    public static class Leased {
        private final Recorder rec;
        private final boolean hang;

        Leased(Recorder rec, boolean hang) {
            this.rec = rec;
            this.hang = hang;
        }

        /** Tried every job.delay ms on every instance; its lease (lockAtMostFor) is 3 s. */
        @Scheduled(fixedDelayString = "${job.delay}")
        @SchedulerLock(name = "leased", lockAtMostFor = "3s")
        public void run() throws InterruptedException {
            rec.recordLease("job:leased", RlockLockProvider.DEFAULT_PREFIX + ":leased");
            if (hang) {
                Thread.sleep(Long.MAX_VALUE);
            }
        }
    }

    /** A child instance: `port driver who`, the leased job hanging once it runs. */
    public static void main(String[] args) {
        Apps.start(JobApp.class, Integer.parseInt(args[0]), Apps.Driver.valueOf(args[1]),
                "job.who=" + args[2], "job.hang=true", "job.delay=100");
    }
}
