// The entry point of the rlock Java client (clients/java; design.md 6): one shared command
// connection, one notification connection for every waiting call, one scheduler thread for
// the watchdog and retries. Hands out the primitives by name, as Redisson's RedissonClient
// does. It opens its own Lettuce RedisClient, rides on the application's, or runs on any
// Transport (rlock-spring's over a Spring RedisConnectionFactory).
package io.rlock;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.resource.ClientResources;
import io.lettuce.core.resource.DefaultClientResources;

import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ForkJoinPool;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;

/**
 * A client of the rlock module. Thread-safe; make one per application and share it.
 *
 * <pre>{@code
 * try (RlockClient rlock = RlockClient.create("redis://127.0.0.1:6379")) {
 *     Lock lock = rlock.getLock("orders:42");
 *     lock.lock();            // no lease: the watchdog keeps it (30 s, renewed every 10 s)
 *     try { ... } finally { lock.unlock(); }
 * }
 * }</pre>
 *
 * On Spring Data Redis, rlock-spring's {@code SpringTransport} runs it on the application's
 * {@code RedisConnectionFactory} (Lettuce or Jedis) instead of a Lettuce client of its own.
 */
public final class RlockClient implements AutoCloseable {
    /** The name the command connection gives itself (`CLIENT LIST` shows it). */
    public static final String CONNECTION_NAME = "rlock-java";
    /** The name the notification (pub/sub) connection gives itself. */
    public static final String NOTIFICATION_CONNECTION_NAME = "rlock-java-tickets";

    private final String id = UUID.randomUUID().toString();
    private final Transport transport;
    private final RlockOptions options;
    private final ScheduledExecutorService scheduler;
    private final RlockStats stats = new RlockStats();
    private final Wire wire;
    private final Waits waits;
    private final Watchdog watchdog;
    private final Backend backend;
    /** The plain semaphores' grants held on their messages: their releases go through it. */
    private final SemaphoreDebts semaphoreDebts = new SemaphoreDebts();

    private RlockClient(Transport transport, RlockOptions options) {
        this.transport = Objects.requireNonNull(transport, "transport");
        this.options = Objects.requireNonNull(options, "options");
        ScheduledThreadPoolExecutor s = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, "rlock-scheduler-" + id.substring(0, 8));
            t.setDaemon(true);
            return t;
        });
        s.setRemoveOnCancelPolicy(true);
        this.scheduler = Executors.unconfigurableScheduledExecutorService(s);
        this.wire = new Wire(transport, scheduler, options);
        this.waits = new Waits(transport, wire, ForkJoinPool.commonPool(), scheduler, options.waitMode(), stats);
        this.watchdog = new Watchdog(scheduler, wire, options.watchdogTimeout().toMillis(), stats);
        this.backend = Backend.install(transport, wire, waits, scheduler, ForkJoinPool.commonPool(), options, stats);
    }

    /** Connects to `uri` (`redis://host:port`) with its own Lettuce client. */
    public static RlockClient create(String uri) {
        return create(RedisURI.create(uri), RlockOptions.defaults());
    }

    public static RlockClient create(RedisURI uri, RlockOptions options) {
        // One I/O thread for both connections: a grant heard on the notification connection
        // is collected on the command connection without crossing to another thread, which
        // is the handoff's critical path.
        ClientResources resources = DefaultClientResources.builder().ioThreadPoolSize(1)
                .computationThreadPoolSize(1).build();
        RedisClient redis = RedisClient.create(resources, uri);
        try {
            return new RlockClient(new LettuceTransport(redis, true, resources), options);
        } catch (RuntimeException e) {
            redis.shutdown();
            resources.shutdown();
            throw e;
        }
    }

    /**
     * Rides on the application's Lettuce client (its default URI): two connections are
     * opened from it, and closing this client leaves `redis` running.
     */
    public static RlockClient create(RedisClient redis) {
        return create(redis, RlockOptions.defaults());
    }

    public static RlockClient create(RedisClient redis, RlockOptions options) {
        return new RlockClient(new LettuceTransport(Objects.requireNonNull(redis, "redis"), false, null), options);
    }

    /**
     * Connects to a Redis Cluster through `seeds` (`redis://host:port` of one or more of its
     * nodes) with its own Lettuce cluster client: every command goes to the master of its
     * key's slot (MOVED and ASK followed), and each wait queues and listens (SSUBSCRIBE) on
     * that node, following the key when its slot moves.
     */
    public static RlockClient createCluster(List<RedisURI> seeds, RlockOptions options) {
        ClientResources resources = DefaultClientResources.builder().ioThreadPoolSize(1)
                .computationThreadPoolSize(1).build();
        RedisClusterClient redis = RedisClusterClient.create(resources, seeds);
        try {
            return new RlockClient(new LettuceClusterTransport(redis, true, resources), options);
        } catch (RuntimeException e) {
            redis.shutdown();
            resources.shutdown();
            throw e;
        }
    }

    public static RlockClient createCluster(String seed) {
        return createCluster(List.of(RedisURI.create(seed)), RlockOptions.defaults());
    }

    /**
     * Rides on the application's Lettuce cluster client: a cluster connection and, once
     * something waits, a sharded pub/sub connection per node with waiters are opened from
     * it; closing this client leaves `redis` running.
     */
    public static RlockClient create(RedisClusterClient redis, RlockOptions options) {
        return new RlockClient(new LettuceClusterTransport(Objects.requireNonNull(redis, "redis"), false, null), options);
    }

    /**
     * Runs on other connections: rlock-spring's transport over a Spring Data Redis
     * RedisConnectionFactory, or any {@link Transport}. Closing the client closes the transport.
     */
    public static RlockClient create(Transport transport, RlockOptions options) {
        return new RlockClient(transport, options);
    }

    /** This client's id: the first half of every owner id it uses (`<id>:<thread id>`). */
    public String getId() {
        return id;
    }

    public RlockOptions options() {
        return options;
    }

    /** Counters of acquisitions, waits and lost locks since this client was made. */
    public RlockStats stats() {
        return stats;
    }
    /** A re-entrant lock (RLOCK.*), Redisson's RLock layout. */
    public RlockLock getLock(String name) {
        return new RlockLock(this, name);
    }

    /** A lock that returns a fencing token with every acquire (RFENCED.*), Redisson's RFencedLock. */
    public RlockFencedLock getFencedLock(String name) {
        return new RlockFencedLock(this, name);
    }

    /** A read-write lock (RRWLOCK.*), Redisson's RReadWriteLock. */
    public RlockReadWriteLock getReadWriteLock(String name) {
        return new RlockReadWriteLock(this, name);
    }

    /** A semaphore (RSEMAPHORE.*), Redisson's RSemaphore. */
    public RlockSemaphore getSemaphore(String name) {
        return new RlockSemaphore(this, name);
    }

    /** A semaphore of permits with ids and leases (RPSEMAPHORE.*), Redisson's RPermitExpirableSemaphore. */
    public RlockPermitExpirableSemaphore getPermitExpirableSemaphore(String name) {
        return new RlockPermitExpirableSemaphore(this, name);
    }

    /** A countdown latch (RLATCH.*), Redisson's RCountDownLatch. */
    public RlockCountDownLatch getCountDownLatch(String name) {
        return new RlockCountDownLatch(this, name);
    }

    Wire wire() { return wire; }
    /**
     * What the server can do ({@code RLOCK.HELLO}, asked once per command connection and
     * again after it reconnects): the module's version, protocol and features, or
     * {@link Capabilities#NO_MODULE}.
     */
    public Capabilities capabilities() {
        return Sync.join(waits.capabilities());
    }

    /**
     * How this client runs the primitives: {@link RlockOptions.Mode#MODULE} or
     * {@link RlockOptions.Mode#SCRIPTS} (Redisson's scripts, where the module is absent);
     * in AUTO, asks the server when not known yet.
     */
    public RlockOptions.Mode mode() {
        return Sync.join(backend.scripts()) ? RlockOptions.Mode.SCRIPTS : RlockOptions.Mode.MODULE;
    }

    /** How many scripts-mode waits sleep until a message or a lease end (tests). */
    int scriptsAsleep() {
        return backend.scriptsAsleep();
    }

    /** How many scripts-mode waits are under way (tests: nothing left behind). */
    int scriptWaiting() {
        return backend.scriptWaiting();
    }

    RlockStats counters() { return stats; }
    Waits waits() { return waits; }
    SemaphoreDebts semaphoreDebts() { return semaphoreDebts; }
    Watchdog watchdog() { return watchdog; }
    ScheduledExecutorService scheduler() { return scheduler; }

    /** How many waiters the client has registered (tests: a cancelled wait leaves nothing behind). */
    int registeredWaiters() {
        return waits.registered();
    }

    /**
     * After an acquire of `key`: `WAIT replicas timeout` when replica sync is on, on the
     * server (in a cluster, the node) that holds it. Completes with null when enough
     * replicas acknowledged, else fails with ReplicaSyncException (the caller gives the
     * acquire back).
     */
    CompletableFuture<Void> syncReplicas(String key) {
        int want = options.replicas();
        if (want == 0) {
            return CompletableFuture.completedFuture(null);
        }
        CompletableFuture<Integer> count = want > 0 ? CompletableFuture.completedFuture(want) : connectedReplicas(key);
        return count.thenCompose(n -> {
            if (n == 0) {
                return CompletableFuture.completedFuture(null);
            }
            return transport.sendTo(key, List.of("WAIT", Integer.toString(n), Long.toString(options.replicaTimeout().toMillis())))
                    .thenApply(v -> {
                        long acked = Sync.asLong(v);
                        if (acked < n) {
                            throw new ReplicaSyncException(acked, n);
                        }
                        return null;
                    });
        });
    }

    /**
     * Whether an acquire of `key` waits for replicas: not when replica sync is off, nor when
     * the server is known (its last ROLE read) to have none connected.
     */
    boolean syncsReplicas(String key) {
        int want = options.replicas();
        if (want >= 0) {
            return want > 0;
        }
        CompletableFuture<Integer> n = connectedReplicas(key);
        return !n.isDone() || n.join() != 0; // the read never fails: a failure counts as none
    }

    /** The last read of how many replicas a server has, and when it was asked (nanoTime). */
    private record ReplicasRead(CompletableFuture<Integer> count, long at) { }

    /** Per server (Transport.nodeOf: one entry but in a cluster). */
    private final Map<String, ReplicasRead> replicasRead = new ConcurrentHashMap<>();

    /**
     * How many replicas the server holding `key` has connected (ROLE), asked at most once
     * a second per server; a refused or failed read counts as none, as the Rust client's does.
     */
    CompletableFuture<Integer> connectedReplicas(String key) {
        String node = transport.nodeOf(key);
        ReplicasRead r = replicasRead.get(node);
        long now = System.nanoTime();
        if (r != null && now - r.at() < 1_000_000_000L) {
            return r.count();
        }
        synchronized (this) {
            if (replicasRead.get(node) == r) {
                r = new ReplicasRead(transport.sendTo(key, List.of("ROLE")).handle((v, e) -> {
                    if (e != null || !(v instanceof List<?> role) || role.isEmpty() || !("master".equals(role.get(0)) || "primary".equals(role.get(0)))) {
                        return 0;
                    }
                    return role.size() > 2 && role.get(2) instanceof List<?> replicas ? replicas.size() : 0;
                }), now);
                replicasRead.put(node, r);
            }
            return replicasRead.get(node).count();
        }
    }

    /** Stops renewals and closes the connections (and the Lettuce client, if this client made it). */
    @Override
    public void close() {
        watchdog.close();
        scheduler.shutdownNow();
        transport.close();
    }
}
