// The client's connections on a Lettuce RedisClusterClient (clients/java, internal): commands
// routed by key to the slot's master (Lettuce follows MOVED and ASK), and for waits, per node
// with waiters, the cluster connection's own connection to that node (tickets are queued and
// collected there) and one sharded pub/sub connection (SSUBSCRIBE: the module SPUBLISHes in
// cluster mode). A ticket channel shares its key's slot (Waits.channel keeps the hash tag), so
// both go to one node. The Go client's hubs (clients/go/tickets.go) are the same design.
// Scripts mode (docs/scripts-mode.md) rides on the same: a script goes to its first key's
// node (its KEYS share a slot), a script that must not run twice goes out on that node's
// connection at most once (sendOnce), and Redisson's channels are heard on the node's
// sharded pub/sub connection, or with classic SUBSCRIBE on a cluster without sharded
// pub/sub (before Redis 7), where Redisson's scripts PUBLISH.
package io.rlock;

import io.lettuce.core.RedisChannelHandler;
import io.lettuce.core.RedisConnectionStateListener;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.cluster.RedisClusterClient;
import io.lettuce.core.cluster.SlotHash;
import io.lettuce.core.cluster.api.StatefulRedisClusterConnection;
import io.lettuce.core.cluster.models.partitions.RedisClusterNode;
import io.lettuce.core.cluster.pubsub.StatefulRedisClusterPubSubConnection;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.StatusOutput;
import io.lettuce.core.protocol.AsyncCommand;
import io.lettuce.core.protocol.Command;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.CommandType;
import io.lettuce.core.protocol.ProtocolKeyword;
import io.lettuce.core.protocol.RedisCommand;
import io.lettuce.core.pubsub.RedisPubSubAdapter;
import io.lettuce.core.pubsub.StatefulRedisPubSubConnection;
import io.lettuce.core.resource.ClientResources;

import java.net.SocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BiConsumer;
import java.util.function.Consumer;

final class LettuceClusterTransport implements Transport {
    private final RedisClusterClient redis;
    private final boolean ownsRedis;
    private final ClientResources ownResources;
    private final StatefulRedisClusterConnection<String, String> conn;
    private volatile StatefulRedisClusterPubSubConnection<String, String> pubsub;
    private volatile BiConsumer<String, String> listener = (c, m) -> { };
    private final List<Runnable> hooks = new CopyOnWriteArrayList<>();
    private final List<Consumer<String>> dropHooks = new CopyOnWriteArrayList<>();
    /** Where each ticket channel is subscribed (node id): its tickets are queued there. */
    private final Map<String, String> subscribedOn = new ConcurrentHashMap<>();
    /** Our own SUNSUBSCRIBEs not yet confirmed, per node and channel: any other is the server's. */
    private final Map<String, AtomicInteger> leaving = new ConcurrentHashMap<>();
    /** The per-node pub/sub connections we listen on. */
    private final Set<Object> listened = ConcurrentHashMap.newKeySet();
    /** Connections of ours (the per-node ones included), and those seen connected once. */
    private final Set<Object> ours = ConcurrentHashMap.newKeySet();
    private final Set<Object> seen = ConcurrentHashMap.newKeySet();
    private final RedisConnectionStateListener reconnects;
    private final Object connecting = new Object();
    /** At-most-once commands under way, each with the node connection it went out on. */
    private final Map<LettuceTransport.Once, Object> once = new ConcurrentHashMap<>();
    /** Channels subscribed with classic SUBSCRIBE (a cluster without sharded pub/sub). */
    private final Set<String> classic = ConcurrentHashMap.newKeySet();
    /** False on a cluster without sharded pub/sub (Backend asks in scripts mode). */
    private volatile boolean sharded = true;
    /** How many redirects an at-most-once command follows (each means it did not run). */
    private static final int ONCE_REDIRECTS = 5;

    LettuceClusterTransport(RedisClusterClient redis, boolean ownsRedis, ClientResources ownResources) {
        this.redis = redis;
        this.ownsRedis = ownsRedis;
        this.ownResources = ownResources;
        this.conn = redis.connect(StringCodec.UTF8);
        conn.async().clientSetname(RlockClient.CONNECTION_NAME); // every node connection takes it
        ours.add(conn);
        seen.add(conn);
        this.reconnects = new RedisConnectionStateListener() {
            @Override
            public void onRedisConnected(RedisChannelHandler<?, ?> c, SocketAddress a) {
                // Runs on Lettuce's event loop: takes no lock. A node connection of ours that
                // connects again lost its tickets (or, pub/sub, maybe a grant message).
                if (ours.contains(c) && !seen.add(c)) {
                    hooks.forEach(Runnable::run);
                }
            }

            @Override
            public void onRedisDisconnected(RedisChannelHandler<?, ?> c) {
                // As LettuceTransport's: on the node connection's event loop, before its
                // reconnect would write its commands again, an at-most-once command written
                // on it fails (done: Lettuce does not write it again); one not written waits.
                once.forEach((o, on) -> {
                    if (on == c && o.written) {
                        o.result.completeExceptionally(LettuceTransport.lostAfterWrite(o));
                    }
                });
            }
        };
        redis.addListener(reconnects);
    }

    /** The id of the master that serves `key`'s slot, as this client last learnt it (null: none). */
    private String nodeId(String key) {
        RedisClusterNode n = conn.getPartitions().getMasterBySlot(SlotHash.getSlot(key));
        return n == null ? null : n.getNodeId();
    }

    @Override
    public String nodeOf(String key) {
        String id = nodeId(key);
        return id == null ? "" : id;
    }

    @Override
    public CompletableFuture<Object> send(List<String> args) {
        // Keyed: Lettuce routes by the key's slot and follows MOVED and ASK. Keyless
        // (RLOCK.HELLO): any node; every node has the module.
        return LettuceTransport.send(conn.async(), args);
    }

    /** Keyed by the first of KEYS for a script (LettuceTransport.keyIndex), bytes as they are. */
    @Override
    public CompletableFuture<Object> sendBytes(List<byte[]> args) {
        return LettuceTransport.sendBytes(conn.async(), args);
    }

    /**
     * At most once, as LettuceTransport's: on the connection of the key's node itself (the
     * cluster connection's routing would hide which node connection wrote it), failed with
     * RlockOutcomeUnknownException when that connection breaks after the write. A MOVED
     * or ASK (the script did not run) is followed here, to a bound.
     */
    @Override
    public CompletableFuture<Object> sendOnce(List<String> args) {
        return once(LettuceTransport.keyOf(args), Wire.keyword(args.get(0)), LettuceTransport.commandArgs(args),
                null, false, 0);
    }

    @Override
    public CompletableFuture<Object> sendBytesOnce(List<byte[]> args) {
        return once(LettuceTransport.keyOf(args), Wire.keyword(new String(args.get(0), StandardCharsets.US_ASCII)),
                LettuceTransport.bytesArgs(args), null, false, 0);
    }

    /** `at`: the node (host:port) a redirect named, else null (the key's node); `asking`: an ASK's. */
    private CompletableFuture<Object> once(String key, ProtocolKeyword type, CommandArgs<String, String> a,
                                           String at, boolean asking, int redirects) {
        CompletableFuture<StatefulRedisConnection<String, String>> to;
        if (at != null) {
            int colon = at.lastIndexOf(':');
            to = conn.getConnectionAsync(at.substring(0, colon), Integer.parseInt(at.substring(colon + 1)))
                    .thenApply(c -> {
                        if (ours.add(c)) {
                            seen.add(c);
                        }
                        return c;
                    });
        } else {
            to = key == null ? CompletableFuture.completedFuture(null) : node(nodeId(key));
        }
        return to.thenCompose(c -> {
            if (c == null) { // keyless (no script of scripts mode is): any node, as send does
                return conn.async().dispatch(type, new Reply(), a).toCompletableFuture();
            }
            LettuceTransport.Once cmd = new LettuceTransport.Once(type, a);
            AsyncCommand<String, String, Object> async = new AsyncCommand<>(cmd);
            cmd.result = async;
            once.put(cmd, c);
            async.whenComplete((v, e) -> once.remove(cmd));
            try {
                if (asking) {
                    // ASKING and the command in one write: nothing else comes between them.
                    AsyncCommand<String, String, String> askingCmd =
                            new AsyncCommand<>(new Command<>(CommandType.ASKING, new StatusOutput<>(StringCodec.UTF8)));
                    c.dispatch(List.<RedisCommand<String, String, ?>>of(askingCmd, async));
                } else {
                    c.dispatch(async);
                }
            } catch (RuntimeException e) {
                once.remove(cmd);
                return CompletableFuture.<Object>failedFuture(e);
            }
            return async.toCompletableFuture();
        }).exceptionallyCompose(e -> {
            String m = Wire.serverError(e);
            if (!Wire.isRedirect(m) || redirects >= ONCE_REDIRECTS) {
                return CompletableFuture.failedFuture(Wire.unwrap(e));
            }
            // MOVED: the slot is served there now (and the layout is learnt again for the
            // next command); ASK: there, this once, after ASKING (a slot being migrated).
            String[] f = m.split(" ");
            boolean ask = f[0].equals("ASK");
            if (!ask) {
                relearn();
            }
            return once(key, type, a, f[2], ask, redirects + 1);
        });
    }

    private CompletableFuture<StatefulRedisConnection<String, String>> node(String id) {
        if (id == null) {
            return CompletableFuture.failedFuture(new io.lettuce.core.RedisException("no master serves the slot"));
        }
        RedisClusterNode n = conn.getPartitions().getPartitionByNodeId(id);
        if (n == null) {
            return CompletableFuture.failedFuture(new io.lettuce.core.RedisException("no node " + id));
        }
        // By address, as Lettuce keys the connection it routes the slot's commands on: the
        // same connection, so a ticket and the key's other commands share it.
        return conn.getConnectionAsync(n.getUri().getHost(), n.getUri().getPort()).thenApply(c -> {
            if (ours.add(c)) {
                seen.add(c); // connected now: a later connect is a reconnect
            }
            return c;
        });
    }

    @Override
    public CompletableFuture<Object> sendTo(String key, List<String> args) {
        // The connection the key's commands went on: WAIT counts that connection's writes.
        return node(nodeId(key)).thenCompose(c -> LettuceTransport.send(c.async(), args));
    }

    @Override
    public CompletableFuture<Object> sendTicket(String channel, List<String> args) {
        // The node that publishes the channel we subscribed: its tickets' messages reach us
        // only there. No redirect is followed: a MOVED or ASK comes back to Waits, which
        // learns the layout again and moves the waiter, subscription first.
        String id = subscribedOn.get(channel);
        return node(id != null ? id : nodeId(args.get(1))).thenCompose(c -> LettuceTransport.send(c.async(), args));
    }

    @Override
    public void listen(BiConsumer<String, String> l) {
        this.listener = l;
    }

    @Override
    public void onChannelDropped(Consumer<String> hook) {
        dropHooks.add(hook);
    }

    @Override
    public CompletableFuture<Void> relearn() {
        return redis.refreshPartitionsAsync().toCompletableFuture();
    }

    private StatefulRedisClusterPubSubConnection<String, String> pubsub() {
        StatefulRedisClusterPubSubConnection<String, String> p = pubsub;
        if (p != null) {
            return p;
        }
        synchronized (connecting) {
            if (pubsub == null) {
                pubsub = redis.connectPubSub(StringCodec.UTF8);
                ours.add(pubsub);
                seen.add(pubsub);
            }
            return pubsub;
        }
    }

    private CompletableFuture<StatefulRedisPubSubConnection<String, String>> pubsubOf(String id) {
        return pubsub().getConnectionAsync(id).thenApply(p -> {
            if (listened.add(p)) {
                ours.add(p);
                seen.add(p);
                p.addListener(new RedisPubSubAdapter<>() {
                    @Override
                    public void smessage(String ch, String message) {
                        listener.accept(ch, message);
                    }

                    @Override
                    public void message(String ch, String message) {
                        listener.accept(ch, message);
                    }

                    @Override
                    public void sunsubscribed(String ch, long count) {
                        AtomicInteger n = leaving.get(id + " " + ch);
                        if (n != null && n.getAndUpdate(v -> Math.max(0, v - 1)) > 0) {
                            return; // ours
                        }
                        // The server's own: the channel's slot left the node (Valkey 9's
                        // atomic slot migration, or a slot handed over with SETSLOT).
                        if (subscribedOn.remove(ch, id)) {
                            dropHooks.forEach(h -> h.accept(ch));
                        }
                    }
                });
                p.async().clientSetname(Waits.CONNECTION_NAME);
            }
            return p;
        });
    }

    @Override
    public CompletableFuture<Void> subscribe(String channel) {
        String id = nodeId(channel);
        if (id == null) {
            return CompletableFuture.failedFuture(new io.lettuce.core.RedisException("no master serves the slot of " + channel));
        }
        if (!sharded) {
            // Before Redis 7: a classic PUBLISH reaches every node's subscribers; the
            // channel's node is as good as any.
            classic.add(channel);
            return pubsubOf(id).thenCompose(p -> p.async().subscribe(channel).toCompletableFuture())
                    .thenRun(() -> subscribedOn.put(channel, id));
        }
        // Lettuce completes SSUBSCRIBE on the server's confirmation (a MOVED if the slot
        // is elsewhere: Waits learns the layout again).
        return pubsubOf(id).thenCompose(p -> p.async().ssubscribe(channel).toCompletableFuture())
                .thenRun(() -> subscribedOn.put(channel, id));
    }

    @Override
    public void shardedPubSub(boolean has) {
        this.sharded = has;
    }

    @Override
    public boolean cluster() {
        return true;
    }

    @Override
    public void unsubscribe(String channel) {
        String id = subscribedOn.remove(channel);
        if (id == null) {
            return; // never confirmed, or the server dropped it already
        }
        if (classic.remove(channel)) {
            pubsubOf(id).thenAccept(p -> p.async().unsubscribe(channel));
            return;
        }
        leaving.computeIfAbsent(id + " " + channel, k -> new AtomicInteger()).incrementAndGet();
        pubsubOf(id).thenAccept(p -> p.async().sunsubscribe(channel));
    }

    @Override
    public void onReconnect(Runnable hook) {
        hooks.add(hook);
    }

    @Override
    public Dedicated dedicated() {
        // A cluster connection of its own: routed by key, and a MOVED or ASK answered to the
        // blocked command (its slot moved) is followed to the new owner, the same request id.
        StatefulRedisClusterConnection<String, String> c = redis.connect(StringCodec.UTF8);
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
        StatefulRedisClusterPubSubConnection<String, String> p;
        synchronized (connecting) {
            p = pubsub;
            pubsub = null;
        }
        if (p != null) {
            p.close();
        }
        conn.close();
        if (ownsRedis) {
            redis.shutdown(Duration.ZERO, Duration.ofSeconds(2));
        }
        if (ownResources != null) {
            ownResources.shutdown(0, 2, TimeUnit.SECONDS);
        }
    }
}
