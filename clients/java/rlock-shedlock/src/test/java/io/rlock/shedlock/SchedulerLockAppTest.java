// The proof for ShedLock users (rlock-shedlock): Spring Boot applications with @SchedulerLock
// jobs on RlockLockProvider, on one module-loaded server: two contexts (each driver in turn)
// run an every-second job once per second between them, and an instance killed mid-job (a
// child JVM on Jedis, SIGKILL) frees the job for one on Lettuce when its lockAtMostFor runs
// out, not before.
package io.rlock.shedlock;

import io.rlock.TestServer;
import io.rlock.spring.Apps;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;
import org.springframework.context.ConfigurableApplicationContext;

import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.*;

@Timeout(120)
class SchedulerLockAppTest {
    static TestServer server;

    @BeforeAll
    static void start() {
        server = new TestServer();
    }

    @AfterAll
    static void stop() {
        server.close();
    }

    @ParameterizedTest
    @EnumSource(Apps.Driver.class)
    void an_every_second_job_runs_once_per_second_across_two_applications(Apps.Driver driver) {
        server.redis().del("job:runs");
        try (ConfigurableApplicationContext a = Apps.start(JobApp.class, server.port, driver, "job.who=a", "job.cron=* * * * * *");
             ConfigurableApplicationContext b = Apps.start(JobApp.class, server.port, driver, "job.who=b", "job.cron=* * * * * *")) {
            TestServer.waitUntil(Duration.ofSeconds(30), "four runs", () -> server.redis().llen("job:runs") >= 4);
        }
        List<String> runs = server.redis().lrange("job:runs", 0, -1);
        Map<Long, String> bySecond = new HashMap<>();
        for (String r : runs) {
            String[] p = r.split(":");
            // A run starts within the second it is scheduled for; two in one second ran twice.
            String before = bySecond.put(Long.parseLong(p[1]) / 1000, p[0]);
            assertNull(before, "two runs in one second: " + runs);
        }
    }

    /**
     * One run (a child JVM costs seconds): the killed instance on Jedis, the one that takes
     * the job over on Lettuce, so both drivers meet on one lock.
     */
    @Test
    void an_instance_killed_mid_job_frees_the_job_when_its_lease_runs_out() throws Exception {
        server.redis().del("job:leased");
        Process child = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-cp", System.getProperty("java.class.path"), JobApp.class.getName(),
                Integer.toString(server.port), Apps.Driver.JEDIS.name(), "child")
                .redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
        try {
            TestServer.waitUntil(Duration.ofSeconds(60), "the child runs the job", () -> server.redis().llen("job:leased") >= 1);
        } catch (AssertionError e) {
            child.destroyForcibly();
            throw e;
        }
        child.destroyForcibly().waitFor();
        String[] childRun = server.redis().lindex("job:leased", 0).split(":");
        long childLeaseEnd = Long.parseLong(childRun[1]) + Long.parseLong(childRun[2]);
        try (ConfigurableApplicationContext a = Apps.start(JobApp.class, server.port, Apps.Driver.LETTUCE,
                "job.who=a", "job.delay=100")) {
            TestServer.waitUntil(Duration.ofSeconds(30), "the job runs again", () -> server.redis().llen("job:leased") >= 2);
        }
        List<String> runs = server.redis().lrange("job:leased", 0, -1);
        assertTrue(runs.get(0).startsWith("child:"), runs.toString());
        assertTrue(runs.get(1).startsWith("a:"), runs.toString());
        long early = childLeaseEnd - Long.parseLong(runs.get(1).split(":")[1]);
        assertTrue(Long.parseLong(childRun[2]) > 0, "the child's lock had a lease: " + runs);
        // Not before the killed instance's 3 s lease ran out (server clock on both sides; the
        // lease end known to the millisecond, PTTL's rounding).
        assertTrue(early <= 1, "the job ran again " + early + " ms before the killed instance's lease ended: " + runs);
    }
}
