// The client's connections on a Lettuce RedisClient (clients/java, internal): a shared
// command connection, a lazily opened pub/sub connection, and a new connection per blocking
// wait; Lettuce's reconnect events tell the client when tickets may have been lost.
package io.rlock;

import io.lettuce.core.RedisChannelHandler;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisConnectionStateListener;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.async.BaseRedisAsyncCommands;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.protocol.AsyncCommand;
import io.lettuce.core.protocol.Command;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import io.netty.buffer.ByteBuf;
import io.lettuce.core.pubsub.RedisPubSubAdapter;
import io.lettuce.core.pubsub.StatefulRedisPubSubConnection;
import io.lettuce.core.resource.ClientResources;

import java.net.SocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.BiConsumer;

final class LettuceTransport implements Transport {
    private final RedisClient redis;
    private final boolean ownsRedis;
    /** Made with the client's own RedisClient, shut down with it; else null. */
    private final ClientResources ownResources;
    private final StatefulRedisConnection<String, String> conn;
    private volatile StatefulRedisPubSubConnection<String, String> pubsub;
    private volatile BiConsumer<String, String> listener = (c, m) -> { };
    private final List<Runnable> hooks = new CopyOnWriteArrayList<>();
    /** Connections seen connected once: a later connect event is a reconnect. */
    private final Set<Object> seen = ConcurrentHashMap.newKeySet();
    private final RedisConnectionStateListener reconnects;
    private final Object connecting = new Object();

    LettuceTransport(RedisClient redis, boolean ownsRedis, ClientResources ownResources) {
        this.redis = redis;
        this.ownsRedis = ownsRedis;
        this.ownResources = ownResources;
        this.conn = redis.connect(StringCodec.UTF8);
        conn.async().clientSetname(RlockClient.CONNECTION_NAME);
        seen.add(conn);
        this.reconnects = new RedisConnectionStateListener() {
            @Override
            public void onRedisConnected(RedisChannelHandler<?, ?> c, SocketAddress a) {
                // Runs on Lettuce's event loop: takes no lock.
                if ((c == conn || c == pubsub) && !seen.add(c)) {
                    hooks.forEach(Runnable::run);
                }
            }

            @Override
            public void onRedisDisconnected(RedisChannelHandler<?, ?> c) {
                // On the channel's event loop, before the reconnect that would write the
                // stack's commands again: an at-most-once command already written fails
                // (done, Lettuce does not write it again); one not yet written waits.
                if (c == conn) {
                    // First: a pinned batch checked against the old generation is in
                    // `pinned` by now (added before its check) and is settled just below.
                    generation.incrementAndGet();
                    for (Once o : once) {
                        if (o.written) {
                            o.result.completeExceptionally(lostAfterWrite(o));
                        }
                    }
                    for (Once p : pinned) {
                        // Done either way, so Lettuce writes neither again on the new connection.
                        p.result.completeExceptionally(p.written ? lostAfterWrite(p)
                                : new NotSent(p.getType() + " was not sent: the connection closed first"));
                    }
                }
            }
        };
        redis.addListener(reconnects);
    }

    StatefulRedisConnection<String, String> connection() {
        return conn;
    }

    /**
     * Where a command's key is in `args` (-1: none): after the command, or, for EVAL and
     * EVALSHA, the first of KEYS. Marked as a key, it routes the command on a cluster
     * connection (Lettuce routes by the first key) and nowhere else matters.
     */
    static int keyIndex(List<?> args, java.util.function.Function<Object, String> text) {
        if (args.size() < 2) {
            return -1;
        }
        String cmd = text.apply(args.get(0)).toUpperCase(java.util.Locale.ROOT);
        if (cmd.equals("EVAL") || cmd.equals("EVALSHA")) {
            return args.size() > 3 && !"0".equals(text.apply(args.get(2))) ? 3 : -1;
        }
        return 1;
    }

    static String text(Object a) {
        return a instanceof byte[] b ? new String(b, StandardCharsets.UTF_8) : (String) a;
    }

    /** `args` after the command, their key marked ({@link #keyIndex}). */
    static CommandArgs<String, String> commandArgs(List<String> args) {
        CommandArgs<String, String> a = new CommandArgs<>(StringCodec.UTF8);
        int key = keyIndex(args, LettuceTransport::text);
        for (int i = 1; i < args.size(); i++) {
            if (i == key) {
                a.addKey(args.get(i));
            } else {
                a.add(args.get(i));
            }
        }
        return a;
    }

    /** {@link #commandArgs} of byte arguments: the key as text (it is), the others as they are. */
    static CommandArgs<String, String> bytesArgs(List<byte[]> args) {
        CommandArgs<String, String> a = new CommandArgs<>(StringCodec.UTF8);
        int key = keyIndex(args, LettuceTransport::text);
        for (int i = 1; i < args.size(); i++) {
            if (i == key) {
                a.addKey(text(args.get(i)));
            } else {
                a.add(args.get(i));
            }
        }
        return a;
    }

    /** The key `args` name (the one that routes them), or null. */
    static String keyOf(List<?> args) {
        int key = keyIndex(args, LettuceTransport::text);
        return key < 0 ? null : text(args.get(key));
    }

    static CompletableFuture<Object> send(BaseRedisAsyncCommands<String, String> c, List<String> args) {
        CommandArgs<String, String> a = commandArgs(args);
        try {
            return c.dispatch(Wire.keyword(args.get(0)), new Reply(), a).toCompletableFuture();
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    @Override
    public CompletableFuture<Object> send(List<String> args) {
        return send(conn.async(), args);
    }

    /** Both on the command connection in one write: Lettuce encodes a batch into one buffer and flushes once. */
    @Override
    public List<CompletableFuture<Object>> sendBoth(List<String> first, List<String> second) {
        AsyncCommand<String, String, Object> a = command(first), b = command(second);
        try {
            conn.dispatch(List.of(a, b));
        } catch (RuntimeException e) {
            return List.of(CompletableFuture.failedFuture(e), CompletableFuture.failedFuture(e));
        }
        return List.of(a.toCompletableFuture(), b.toCompletableFuture());
    }

    private static AsyncCommand<String, String, Object> command(List<String> args) {
        return new AsyncCommand<>(new Command<>(Wire.keyword(args.get(0)), new Reply(), commandArgs(args)));
    }

    /** The command connection's generation: one more at each of its disconnects. */
    private final AtomicLong generation = new AtomicLong();
    /** Pinned commands under way (see {@link #sendPinned}). */
    private final Set<Once> pinned = ConcurrentHashMap.newKeySet();

    @Override
    public long generation() {
        return generation.get();
    }

    @Override
    public List<CompletableFuture<Object>> sendPinned(long gen, List<List<String>> commands) {
        List<Once> cmds = new java.util.ArrayList<>(commands.size());
        List<AsyncCommand<String, String, Object>> batch = new java.util.ArrayList<>(commands.size());
        List<CompletableFuture<Object>> out = new java.util.ArrayList<>(commands.size());
        for (List<String> args : commands) {
            Once cmd = new Once(Wire.keyword(args.get(0)), commandArgs(args));
            AsyncCommand<String, String, Object> async = new AsyncCommand<>(cmd);
            cmd.result = async;
            cmds.add(cmd);
            batch.add(async);
            out.add(async.toCompletableFuture());
        }
        // Registered before the generation is checked: a disconnect from here on settles them.
        pinned.addAll(cmds);
        if (generation.get() != gen) {
            pinned.removeAll(cmds);
            return null;
        }
        for (Once cmd : cmds) {
            cmd.result.whenComplete((v, e) -> pinned.remove(cmd));
        }
        try {
            conn.dispatch(batch);
        } catch (RuntimeException e) {
            for (AsyncCommand<String, String, Object> a : batch) {
                a.completeExceptionally(e);
            }
        }
        return out;
    }

    /** At-most-once commands under way on the command connection (see {@link #sendOnce}). */
    private final Set<Once> once = ConcurrentHashMap.newKeySet();

    /** A command that knows whether it was written (encoded onto the connection). */
    static final class Once extends Command<String, String, Object> {
        volatile boolean written;
        volatile AsyncCommand<String, String, Object> result;

        Once(ProtocolKeyword type, CommandArgs<String, String> args) {
            super(type, new Reply(), args);
        }

        @Override
        public void encode(ByteBuf buf) {
            written = true;
            super.encode(buf);
        }
    }

    /**
     * Lettuce is at-least-once: after a reconnect it writes again the commands whose reply
     * the broken connection lost. A command sent here is failed instead, with
     * {@link RlockOutcomeUnknownException}, when its connection breaks after it was written.
     */
    @Override
    public CompletableFuture<Object> sendOnce(List<String> args) {
        return dispatchOnce(Wire.keyword(args.get(0)), commandArgs(args));
    }

    @Override
    public CompletableFuture<Object> sendBytesOnce(List<byte[]> args) {
        return dispatchOnce(Wire.keyword(new String(args.get(0), StandardCharsets.US_ASCII)), bytesArgs(args));
    }

    /** The failure of an at-most-once command whose connection closed after it was written. */
    static RlockOutcomeUnknownException lostAfterWrite(Once o) {
        return new RlockOutcomeUnknownException("the connection closed after " + o.getType() + " was sent: it may"
                + " or may not have run, and is not sent again", null);
    }

    private CompletableFuture<Object> dispatchOnce(ProtocolKeyword type, CommandArgs<String, String> a) {
        Once cmd = new Once(type, a);
        AsyncCommand<String, String, Object> async = new AsyncCommand<>(cmd);
        cmd.result = async;
        once.add(cmd);
        async.whenComplete((v, e) -> once.remove(cmd));
        try {
            conn.dispatch(async);
        } catch (RuntimeException e) {
            once.remove(cmd);
            return CompletableFuture.failedFuture(e);
        }
        return async.toCompletableFuture();
    }

    /** Bytes as they are: a raw permit id (scripts mode) is not text. */
    @Override
    public CompletableFuture<Object> sendBytes(List<byte[]> args) {
        return sendBytes(conn.async(), args);
    }

    static CompletableFuture<Object> sendBytes(BaseRedisAsyncCommands<String, String> c, List<byte[]> args) {
        CommandArgs<String, String> a = bytesArgs(args);
        try {
            return c.dispatch(Wire.keyword(new String(args.get(0), StandardCharsets.US_ASCII)), new Reply(), a)
                    .toCompletableFuture();
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    @Override
    public void listen(BiConsumer<String, String> l) {
        this.listener = l;
    }

    private StatefulRedisPubSubConnection<String, String> pubsub() {
        StatefulRedisPubSubConnection<String, String> p = pubsub;
        if (p != null) {
            return p;
        }
        synchronized (connecting) {
            if (pubsub == null) {
                p = redis.connectPubSub(StringCodec.UTF8);
                seen.add(p);
                p.addListener(new RedisPubSubAdapter<>() {
                    @Override
                    public void message(String ch, String message) {
                        listener.accept(ch, message);
                    }
                });
                p.async().clientSetname(Waits.CONNECTION_NAME);
                pubsub = p;
            }
            return pubsub;
        }
    }

    @Override
    public CompletableFuture<Void> subscribe(String channel) {
        try {
            // Lettuce completes SUBSCRIBE on the server's confirmation.
            return pubsub().async().subscribe(channel).toCompletableFuture();
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    @Override
    public void unsubscribe(String channel) {
        StatefulRedisPubSubConnection<String, String> p = pubsub;
        if (p != null) {
            p.async().unsubscribe(channel);
        }
    }

    @Override
    public void onReconnect(Runnable hook) {
        hooks.add(hook);
    }

    @Override
    public Dedicated dedicated() {
        StatefulRedisConnection<String, String> c = redis.connect(StringCodec.UTF8);
        return new Dedicated() {
            @Override
            public CompletableFuture<Object> send(List<String> args) {
                return LettuceTransport.send(c.async(), args);
            }

            @Override
            public void close() {
                c.closeAsync();
            }
        };
    }

    @Override
    public void close() {
        redis.removeListener(reconnects);
        StatefulRedisPubSubConnection<String, String> p;
        synchronized (connecting) {
            p = pubsub;
            pubsub = null;
        }
        if (p != null) {
            p.close();
        }
        conn.close();
        if (ownsRedis) {
            // No quiet period: nothing of ours is left on the client's event loops.
            redis.shutdown(Duration.ZERO, Duration.ofSeconds(2));
        }
        if (ownResources != null) {
            ownResources.shutdown(0, 2, TimeUnit.SECONDS);
        }
    }
}
