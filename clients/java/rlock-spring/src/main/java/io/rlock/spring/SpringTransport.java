// The rlock client's connections on a Spring Data Redis RedisConnectionFactory (rlock-spring):
// the application's Lettuce or Jedis factory carries rlock's commands, its tickets and their
// notifications, so a Spring application needs no Redis client of its own for locks. The
// client's logic (io.rlock: waits, watchdog, retries) is the one every transport shares;
// this class only moves commands and messages.
package io.rlock.spring;

import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisCommandTimeoutException;
import io.lettuce.core.RedisConnectionException;
import io.rlock.Reply;
import io.rlock.Transport;
import org.springframework.dao.QueryTimeoutException;
import org.springframework.data.redis.RedisConnectionFailureException;
import org.springframework.data.redis.connection.RedisConnection;
import org.springframework.data.redis.connection.RedisConnectionFactory;
import org.springframework.data.redis.connection.Subscription;
import org.springframework.data.redis.connection.lettuce.LettuceConnection;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BiConsumer;

/**
 * An rlock {@link Transport} over a {@link RedisConnectionFactory}, whichever driver is
 * behind it. Give it to {@code RlockClient.create(transport, options)}; the client closes it.
 *
 * <p>Connections: plain commands borrow a connection per call (Jedis: from the pool;
 * Lettuce: the shared native connection); queued tickets go out on one connection held for
 * the transport's life, because a ticket lives as long as the connection that queued it;
 * notifications come on one subscribed connection ({@link RedisConnection#subscribe}).
 * While anybody waits, a check every second asks the ticket connection its {@code CLIENT
 * ID}: a new id (the driver reconnected) or a broken subscription means tickets or grant
 * messages may be lost, and the client then sends its waiting commands again.
 *
 * <p>Driver calls block (Jedis always, Lettuce through Spring's synchronous API), so they run
 * on this transport's own daemon threads and the client's futures stay asynchronous.
 */
public final class SpringTransport implements Transport {
    private static final String PROBE_PREFIX = "rlock-probe-";
    private static final AtomicLong SEQ = new AtomicLong();

    private final RedisConnectionFactory factory;
    private final ExecutorService io;
    private final ScheduledExecutorService guard;
    /**
     * Subscription changes, one at a time in the order asked: an UNSUBSCRIBE of a channel's
     * last waiter must not overtake the SUBSCRIBE of its next one.
     */
    private final ExecutorService subs;
    private final List<Runnable> hooks = new CopyOnWriteArrayList<>();
    private volatile BiConsumer<String, String> listener = (c, m) -> { };
    private volatile boolean closed;

    /** The connection tickets are queued on, and its CLIENT ID when opened. Guarded by `ticketLock`. */
    private final Object ticketLock = new Object();
    private RedisConnection ticketConn;
    private long ticketConnId = -1;

    /** The notification connection: a channel of this transport's own keeps it subscribed. */
    private final String home = "rlock_ticket:{rlock-java-" + UUID.randomUUID() + "}";
    private final Object subLock = new Object();
    private volatile RedisConnection subConn;
    /** Channels wanted subscribed (home excluded). Guarded by `subLock`. */
    private final Set<String> channels = ConcurrentHashMap.newKeySet();
    /** Probes published and not yet heard, by probe message. */
    private final Map<String, CompletableFuture<Void>> probes = new ConcurrentHashMap<>();

    public SpringTransport(RedisConnectionFactory factory) {
        this.factory = Objects.requireNonNull(factory, "factory");
        this.io = Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r, "rlock-spring-io-" + SEQ.incrementAndGet());
            t.setDaemon(true);
            return t;
        });
        this.guard = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "rlock-spring-guard");
            t.setDaemon(true);
            return t;
        });
        this.subs = Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, "rlock-spring-subscriptions");
            t.setDaemon(true);
            return t;
        });
        guard.scheduleWithFixedDelay(this::check, 1, 1, TimeUnit.SECONDS);
    }

    // ---- commands ----------------------------------------------------------------------------

    /** Runs one command on `c`, its reply as the client's values; failures in Lettuce's terms. */
    static Object execute(RedisConnection c, List<String> args) {
        try {
            return Reply.normalize(raw(c, args));
        } catch (RuntimeException e) {
            throw translate(e);
        }
    }

    /** One command as the driver answers it (null while pipelined). */
    private static Object raw(RedisConnection c, List<String> args) {
        byte[][] a = new byte[args.size() - 1][];
        for (int i = 1; i < args.size(); i++) {
            a[i - 1] = args.get(i).getBytes(StandardCharsets.UTF_8);
        }
        return raw(c, args.get(0), a);
    }

    private static Object raw(RedisConnection c, String command, byte[][] a) {
        if (c instanceof LettuceConnection lc) {
            // Spring's own output for a command it does not know reads only bulk strings.
            return lc.execute(command, new Reply(), a);
        }
        return c.execute(command, a);
    }

    /**
     * A driver's or Spring's failure in the client's terms (see {@link Transport}): the
     * server's error text as RedisCommandExecutionException, a broken connection as
     * RedisConnectionException, a timeout as RedisCommandTimeoutException.
     */
    static RuntimeException translate(Throwable e) {
        for (Throwable c = e; c != null; c = c.getCause() == c ? null : c.getCause()) {
            if (c instanceof RedisCommandExecutionException r) {
                return r;
            }
            if (isA(c, "redis.clients.jedis.exceptions.JedisDataException")) {
                return new RedisCommandExecutionException(c.getMessage());
            }
        }
        for (Throwable c = e; c != null; c = c.getCause() == c ? null : c.getCause()) {
            if (c instanceof QueryTimeoutException || c instanceof RedisCommandTimeoutException) {
                return new RedisCommandTimeoutException(c.getMessage());
            }
            if (c instanceof RedisConnectionFailureException || c instanceof RedisConnectionException
                    || c instanceof IOException || isA(c, "redis.clients.jedis.exceptions.JedisConnectionException")) {
                return new RedisConnectionException(String.valueOf(c.getMessage()), e);
            }
        }
        return e instanceof RuntimeException r ? r : new IllegalStateException(e);
    }

    /** Whether `t`'s class is `name` or extends it (Jedis is optional: matched by name). */
    private static boolean isA(Throwable t, String name) {
        for (Class<?> k = t.getClass(); k != null; k = k.getSuperclass()) {
            if (k.getName().equals(name)) {
                return true;
            }
        }
        return false;
    }

    private <T> CompletableFuture<T> async(java.util.function.Supplier<T> call) {
        try {
            return CompletableFuture.supplyAsync(call, io);
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    @Override
    public CompletableFuture<Object> send(List<String> args) {
        if (args.contains("ASYNC")) {
            return async(() -> sendTicket(args));
        }
        return async(() -> {
            try (RedisConnection c = factory.getConnection()) {
                return execute(c, args);
            }
        });
    }

    /** Bytes as they are: a raw permit id Redisson made (scripts mode) is not text. */
    @Override
    public CompletableFuture<Object> sendBytes(List<byte[]> args) {
        String command = new String(args.get(0), StandardCharsets.US_ASCII);
        byte[][] a = args.subList(1, args.size()).toArray(new byte[0][]);
        return async(() -> {
            try (RedisConnection c = factory.getConnection()) {
                return Reply.normalize(raw(c, command, a));
            } catch (RuntimeException e) {
                throw translate(e);
            }
        });
    }

    /** A ticketed command, on the held ticket connection (opened on first use, and after a break). */
    private Object sendTicket(List<String> args) {
        synchronized (ticketLock) {
            if (closed) {
                throw new RedisConnectionException("the rlock transport is closed");
            }
            if (ticketConn == null) {
                RedisConnection c = factory.getConnection();
                try {
                    ticketConnId = (Long) execute(c, List.of("CLIENT", "ID"));
                } catch (RuntimeException e) {
                    c.close();
                    throw e;
                }
                ticketConn = c;
            }
            try {
                return execute(ticketConn, args);
            } catch (RedisConnectionException | RedisCommandTimeoutException e) {
                // Tickets queued on it are gone with it; the next ticket opens another.
                dropTicketConnection();
                fireHooksLater();
                throw e;
            }
        }
    }

    private void dropTicketConnection() {
        RedisConnection c = ticketConn;
        ticketConn = null;
        ticketConnId = -1;
        if (c != null) {
            try {
                c.close();
            } catch (RuntimeException ignored) {
                // Already broken.
            }
        }
    }

    private void fireHooksLater() {
        // Not on the thread that holds a lock of ours: the hooks send commands.
        io.execute(() -> hooks.forEach(Runnable::run));
    }

    /**
     * Runs every second: while anybody waits, a ticket connection answering another CLIENT
     * ID than when it was opened was reconnected by its driver, dropping its tickets.
     */
    private void check() {
        if (closed || channels.isEmpty()) {
            return;
        }
        boolean lost = false;
        synchronized (ticketLock) {
            if (ticketConn != null) {
                try {
                    Object id = execute(ticketConn, List.of("CLIENT", "ID"));
                    if (!Long.valueOf(ticketConnId).equals(id)) {
                        ticketConnId = id instanceof Long l ? l : -1;
                        lost = true;
                    }
                } catch (RuntimeException e) {
                    dropTicketConnection();
                    lost = true;
                }
            }
        }
        if (lost) {
            fireHooksLater();
        }
    }

    // ---- notifications -------------------------------------------------------------------------

    @Override
    public void listen(BiConsumer<String, String> l) {
        this.listener = l;
    }

    private void onMessage(String channel, String message) {
        if (message.startsWith(PROBE_PREFIX)) {
            CompletableFuture<Void> p = probes.remove(message);
            if (p != null) {
                p.complete(null);
            }
            return;
        }
        listener.accept(channel, message);
    }

    private final org.springframework.data.redis.connection.MessageListener springListener = (m, pattern) ->
            onMessage(new String(m.getChannel(), StandardCharsets.UTF_8), new String(m.getBody(), StandardCharsets.UTF_8));

    /**
     * Opens the subscribed connection with `home` and every wanted channel in one SUBSCRIBE.
     * Jedis's subscribe holds its thread until the subscription ends, Lettuce's returns: each
     * runs on a thread of its own, and a Jedis subscription that ends while the transport is
     * open is opened again (its messages meanwhile may be lost: the hooks run).
     */
    private RedisConnection openSubscription() {
        CompletableFuture<RedisConnection> ready = new CompletableFuture<>();
        Thread t = new Thread(() -> runSubscription(ready), "rlock-spring-notifications");
        t.setDaemon(true);
        t.start();
        RedisConnection c = ready.join();
        probe(home).join();
        return c;
    }

    private void runSubscription(CompletableFuture<RedisConnection> ready) {
        boolean first = true;
        while (!closed) {
            RedisConnection c;
            try {
                c = factory.getConnection();
            } catch (RuntimeException e) {
                if (first) {
                    ready.completeExceptionally(translate(e));
                    return;
                }
                pause(500);
                continue;
            }
            List<byte[]> names = new ArrayList<>();
            names.add(home.getBytes(StandardCharsets.UTF_8));
            for (String ch : channels) {
                names.add(ch.getBytes(StandardCharsets.UTF_8));
            }
            subConn = c;
            if (first) {
                // Jedis's subscribe does not return while subscribed: readiness is told from aside.
                Thread watcher = new Thread(() -> {
                    for (int i = 0; i < 10_000 && !c.isSubscribed() && !ready.isDone(); i++) {
                        pause(1);
                    }
                    ready.complete(c);
                }, "rlock-spring-notifications-ready");
                watcher.setDaemon(true);
                watcher.start();
            } else {
                // Once the new SUBSCRIBE is in force, the waiters send their commands again.
                probe(home).whenComplete((v, e) -> hooks.forEach(Runnable::run));
            }
            first = false;
            try {
                c.subscribe(springListener, names.toArray(new byte[0][]));
                if (c.isSubscribed()) {
                    return; // Lettuce: subscribed without holding this thread; it reconnects by itself.
                }
            } catch (RuntimeException e) {
                if (!ready.isDone()) {
                    ready.completeExceptionally(translate(e));
                    closeQuietly(c);
                    return;
                }
            }
            closeQuietly(c);
            pause(100);
        }
    }

    private static void pause(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private static void closeQuietly(RedisConnection c) {
        try {
            c.close();
        } catch (RuntimeException ignored) {
            // Broken already.
        }
    }

    /**
     * Completes when a message published on `channel` now is heard: SUBSCRIBE on one
     * connection and PUBLISH on another are not ordered, and Jedis does not tell when a
     * subscription took effect, so a probe is published (again every 20 ms) until it comes back.
     */
    private CompletableFuture<Void> probe(String channel) {
        String msg = PROBE_PREFIX + home.hashCode() + "-" + SEQ.incrementAndGet();
        CompletableFuture<Void> heard = new CompletableFuture<>();
        probes.put(msg, heard);
        io.execute(() -> {
            long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (!heard.isDone() && !closed && System.nanoTime() < end) {
                try (RedisConnection c = factory.getConnection()) {
                    execute(c, List.of("PUBLISH", channel, msg));
                } catch (RuntimeException e) {
                    // Tried again below until the deadline.
                }
                try {
                    heard.get(20, TimeUnit.MILLISECONDS);
                } catch (Exception e) {
                    // Not heard yet.
                }
            }
            probes.remove(msg);
            heard.completeExceptionally(new RedisConnectionException(
                    "the notification connection did not hear channel " + channel + " within 10 s"));
        });
        return heard;
    }

    @Override
    public CompletableFuture<Void> subscribe(String channel) {
        CompletableFuture<Void> changed;
        try {
            changed = CompletableFuture.supplyAsync(() -> {
            synchronized (subLock) {
                if (subConn == null) {
                    channels.add(channel);
                    subConn = openSubscription();
                    return null;
                }
                channels.add(channel);
                subscription().subscribe(channel.getBytes(StandardCharsets.UTF_8));
                return null;
            }
            }, subs);
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        return changed.thenCompose(v -> probe(channel));
    }

    private Subscription subscription() {
        Subscription s = subConn.getSubscription();
        if (s == null) {
            throw new RedisConnectionException("the notification connection is not subscribed");
        }
        return s;
    }

    @Override
    public void unsubscribe(String channel) {
        if (closed) {
            return;
        }
        subs.execute(() -> {
            synchronized (subLock) {
                if (channels.remove(channel) && subConn != null) {
                    try {
                        subscription().unsubscribe(channel.getBytes(StandardCharsets.UTF_8));
                    } catch (RuntimeException ignored) {
                        // A broken subscription is opened again without the channel.
                    }
                }
            }
        });
    }

    @Override
    public void onReconnect(Runnable hook) {
        hooks.add(hook);
    }

    // ---- the blocking fallback -----------------------------------------------------------------

    /**
     * A connection of the factory's own for one blocking command. Pipelined, so that even the
     * Lettuce factory's shared connection is not blocked (Spring pipelines on a dedicated
     * connection); named, so that closing it mid-command can end it with CLIENT UNBLOCK. A
     * grant that raced the cancel is given back by the client, as on any transport.
     */
    @Override
    public Dedicated dedicated() {
        String name = "rlock-java-wait-" + SEQ.incrementAndGet();
        return new Dedicated() {
            private volatile boolean busy;

            @Override
            public CompletableFuture<Object> send(List<String> args) {
                return async(() -> {
                    busy = true;
                    try (RedisConnection c = factory.getConnection()) {
                        c.openPipeline();
                        raw(c, List.of("CLIENT", "SETNAME", name));
                        raw(c, args);
                        List<Object> out;
                        try {
                            out = c.closePipeline();
                        } catch (org.springframework.data.redis.connection.RedisPipelineException e) {
                            out = e.getPipelineResult();
                        }
                        Object r = out.size() > 1 ? out.get(1) : null;
                        if (r instanceof Throwable t) {
                            throw translate(t);
                        }
                        return Reply.normalize(r);
                    } catch (RuntimeException e) {
                        throw translate(e);
                    } finally {
                        busy = false;
                    }
                });
            }

            @Override
            public void close() {
                if (busy) {
                    // End the command in the server as if its wait ran out (the waiter leaves the
                    // queue). Not CLIENT KILL: Lettuce would reconnect and send the command again.
                    io.execute(() -> {
                        try (RedisConnection c = factory.getConnection()) {
                            Object list = execute(c, List.of("CLIENT", "LIST"));
                            for (String line : String.valueOf(list).split("\n")) {
                                if (line.contains(" name=" + name + " ") && line.startsWith("id=")) {
                                    String id = line.substring(3, line.indexOf(' '));
                                    execute(c, List.of("CLIENT", "UNBLOCK", id));
                                }
                            }
                        } catch (RuntimeException ignored) {
                            // Gone already.
                        }
                    });
                }
            }
        };
    }

    // ---- closing -------------------------------------------------------------------------------

    /** Gives back the held connections; the factory stays the application's. */
    @Override
    public void close() {
        closed = true;
        guard.shutdownNow();
        synchronized (ticketLock) {
            dropTicketConnection();
        }
        RedisConnection s;
        synchronized (subLock) {
            s = subConn;
            subConn = null;
            channels.clear();
        }
        if (s != null) {
            try {
                Subscription sub = s.getSubscription();
                if (sub != null) {
                    sub.close();
                }
            } catch (RuntimeException ignored) {
                // Broken already.
            }
            closeQuietly(s);
        }
        subs.shutdown();
        io.shutdown();
    }
}
