// Test support (clients/java tests): a real module-loaded server (or, for scripts mode, one
// without the module) on a free port of 127.0.0.1, started by the tests themselves, as
// tests/conftest.py's RedisServer does. The module comes from RLOCK_MODULE (default
// ../../target/debug/librlock.so, which `make build` makes), the server from REDIS_SERVER
// (default redis-server on PATH).
package io.rlock;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.sync.RedisCommands;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.CommandOutput;
import io.lettuce.core.protocol.CommandArgs;

import java.io.IOException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.BooleanSupplier;

public final class TestServer implements AutoCloseable {
    public final int port;
    public final Path dir;
    private Process proc;
    /** The server's command line, for {@link #restart}. */
    private final List<String> cmd;
    private final RedisClient admin;
    private final StatefulRedisConnection<String, String> adminConn;

    public static Path module() {
        String env = System.getProperty("rlock.module", System.getenv("RLOCK_MODULE"));
        Path base = Path.of(System.getenv().getOrDefault("RLOCK_JAVA_DIR", "."));
        Path p = env != null && !env.isEmpty() ? Path.of(env) : base.resolve("../../../target/debug/librlock.so").normalize();
        if (!Files.isRegularFile(p)) {
            throw new IllegalStateException("the rlock module is not at " + p.toAbsolutePath()
                    + ": build it first (`make build` or `cargo build -p rlock` at the repository root),"
                    + " or set RLOCK_MODULE to the path of librlock.so");
        }
        return p.toAbsolutePath();
    }

    public static String serverBinary() {
        String s = System.getProperty("redis.server", System.getenv("REDIS_SERVER"));
        return s == null || s.isEmpty() ? "redis-server" : s;
    }

    /** A free TCP port whose cluster bus port (+10000) is free too. */
    public static int freePort() {
        for (int i = 0; i < 100; i++) {
            int p = 20000 + ThreadLocalRandom.current().nextInt(30000);
            if (free(p) && free(p + 10000)) {
                return p;
            }
        }
        throw new IllegalStateException("no free port found");
    }

    private static boolean free(int port) {
        try (ServerSocket s = new ServerSocket(port, 1, java.net.InetAddress.getByName("127.0.0.1"))) {
            s.setReuseAddress(true);
            return true;
        } catch (IOException e) {
            return false;
        }
    }

    /** The user a managed service gives an application (`+@all -@dangerous`), made by {@link #addRestrictedUser}. */
    public static final String RESTRICTED_USER = "app";
    public static final String RESTRICTED_PASSWORD = "app-secret";

    public TestServer(String... extra) {
        this(true, extra);
    }

    /** A server without the module, as every managed Redis and Valkey runs (scripts mode). */
    public static TestServer withoutModule(String... extra) {
        return new TestServer(false, extra);
    }

    /** How many ports a new server tries: another process may take the free one first. */
    private static final int PORT_TRIES = 5;

    private TestServer(boolean module, String... extra) {
        Started s = start(module, extra);
        this.port = s.port();
        this.dir = s.dir();
        this.cmd = s.cmd();
        this.admin = s.admin();
        this.proc = s.proc();
        this.adminConn = admin.connect(StringCodec.UTF8);
    }

    /** A server process answering on its port, with what a restart needs. */
    private record Started(int port, Path dir, List<String> cmd, RedisClient admin, Process proc) {
    }

    /** Starts a server on a free port, on another if that one is taken before it binds. */
    private static Started start(boolean module, String... extra) {
        for (int attempt = 1; ; attempt++) {
            int p = freePort();
            Path d;
            List<String> c;
            try {
                d = Files.createTempDirectory("rlock-java-" + p + "-");
                c = new ArrayList<>(List.of(serverBinary(), "--port", Integer.toString(p),
                        "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", d.toString(),
                        "--logfile", d.resolve("redis.log").toString(), "--enable-module-command", "yes",
                        "--enable-debug-command", "yes"));
                if (module) {
                    c.addAll(List.of("--loadmodule", module().toString()));
                }
                c.addAll(List.of(extra));
            } catch (IOException e) {
                throw new IllegalStateException("cannot start " + serverBinary() + ": " + e, e);
            }
            RedisClient a = RedisClient.create(RedisURI.create("redis://127.0.0.1:" + p));
            try {
                return new Started(p, d, c, a, launch(c, d, a));
            } catch (PortTaken e) {
                // Free when drawn, taken by another process before the server bound it.
                a.shutdown();
                if (attempt >= PORT_TRIES) {
                    throw new IllegalStateException("no port could be bound in " + PORT_TRIES + " tries: " + e.getMessage());
                }
            }
        }
    }

    /** The server exited because its port was taken (`bind: Address already in use`). */
    private static final class PortTaken extends RuntimeException {
        PortTaken(String log) {
            super(log);
        }
    }

    /** Starts the process again on its port (a restart). */
    private void run() {
        this.proc = launch(cmd, dir, admin);
    }

    /**
     * Starts `cmd` and waits (bounded) until it answers PING (loaded); {@link PortTaken} if
     * it exited unable to bind its port.
     */
    private static Process launch(List<String> cmd, Path dir, RedisClient admin) {
        Process proc;
        try {
            proc = new ProcessBuilder(cmd).redirectErrorStream(true)
                    .redirectOutput(ProcessBuilder.Redirect.appendTo(dir.resolve("stdout.log").toFile())).start();
        } catch (IOException e) {
            throw new IllegalStateException("cannot start " + serverBinary() + ": " + e, e);
        }
        waitUntil(Duration.ofSeconds(10), "the server answers PING", () -> {
            if (!proc.isAlive()) {
                String log = log(dir);
                if (log.contains("Address already in use")) {
                    throw new PortTaken(log);
                }
                throw new IllegalStateException("the server exited: " + log);
            }
            try (var c = admin.connect()) {
                return "PONG".equals(c.sync().ping());
            } catch (RuntimeException e) {
                return false;
            }
        });
        return proc;
    }

    /**
     * Kills the server (SIGKILL: nothing more is written), keeps its port closed for
     * `down`, and starts it again on the same port, directory and arguments (so with
     * `--appendonly yes` it reloads what it had written).
     */
    public void restart(Duration down) throws InterruptedException {
        proc.destroyForcibly().waitFor();
        Thread.sleep(down.toMillis());
        run();
    }

    /** Stops (SIGSTOP) or resumes (SIGCONT) the server process: a replica that stops answering. */
    public void signal(String sig) {
        try {
            new ProcessBuilder("kill", "-" + sig, Long.toString(proc.pid())).inheritIO().start().waitFor();
        } catch (IOException e) {
            throw new IllegalStateException(e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    public String log() {
        return log(dir);
    }

    private static String log(Path dir) {
        try {
            return Files.readString(dir.resolve("stdout.log")) + Files.readString(dir.resolve("redis.log"));
        } catch (IOException e) {
            return "(no log: " + e + ")";
        }
    }

    /**
     * Creates {@link #RESTRICTED_USER}: every command but the dangerous ones (no MODULE,
     * CONFIG, DEBUG, CLIENT KILL, ...), every key and channel, as a managed service's user.
     */
    public void addRestrictedUser() {
        call("ACL", "SETUSER", RESTRICTED_USER, "on", ">" + RESTRICTED_PASSWORD, "~*", "&*", "+@all", "-@dangerous");
    }

    /** This server's address logged in as {@link #RESTRICTED_USER}. */
    public RedisURI restrictedUri() {
        return RedisURI.builder().withHost("127.0.0.1").withPort(port)
                .withAuthentication(RESTRICTED_USER, RESTRICTED_PASSWORD).build();
    }

    public RedisURI uri() {
        return RedisURI.create("redis://127.0.0.1:" + port);
    }

    public String address() {
        return "redis://127.0.0.1:" + port;
    }

    /** Plain commands for checks. */
    public RedisCommands<String, String> redis() {
        return adminConn.sync();
    }

    /** Any command, its reply as the client's own Reply values. */
    public Object call(String... args) {
        CommandArgs<String, String> a = new CommandArgs<>(StringCodec.UTF8);
        for (int i = 1; i < args.length; i++) {
            a.add(args[i]);
        }
        CommandOutput<String, String, Object> out = new Reply();
        return adminConn.sync().dispatch(Wire.keyword(args[0]), out, a);
    }

    /** One field of INFO section (null when absent). */
    public String info(String section, String field) {
        for (String line : redis().info(section).split("\r?\n")) {
            if (line.startsWith(field + ":")) {
                return line.substring(field.length() + 1).trim();
            }
        }
        return null;
    }

    /** How many connections the server has open (CLIENT LIST). */
    public int connections() {
        return redis().clientList().split("\n").length;
    }

    public static void waitUntil(Duration timeout, String what, BooleanSupplier cond) {
        long end = System.nanoTime() + timeout.toNanos();
        while (!cond.getAsBoolean()) {
            if (System.nanoTime() > end) {
                throw new AssertionError("timed out after " + timeout + " waiting until " + what);
            }
            try {
                Thread.sleep(5);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new AssertionError("interrupted waiting until " + what);
            }
        }
    }

    @Override
    public void close() {
        try {
            adminConn.close();
        } catch (RuntimeException ignored) {
            // The server may be gone already.
        }
        admin.shutdown(Duration.ZERO, Duration.ofSeconds(2));
        proc.destroy();
        try {
            if (!proc.waitFor(5, java.util.concurrent.TimeUnit.SECONDS)) {
                proc.destroyForcibly().waitFor();
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
