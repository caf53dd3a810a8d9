// The connections under an RlockClient (clients/java): what the client's one implementation
// of the locks, waits and watchdog needs from a Redis driver, so that the same client runs
// on its own Lettuce RedisClient (LettuceTransport, here) or on an application's Spring Data
// Redis RedisConnectionFactory, Lettuce or Jedis behind it (rlock-spring's SpringTransport).
package io.rlock;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.function.BiConsumer;
import java.util.function.Consumer;

/**
 * The connections of one client: a command connection, one notification (pub/sub)
 * connection for every waiting call, and a connection of its own for a blocking wait.
 *
 * <p>Replies come as {@link Reply}'s plain values ({@code null}, {@code Long}, UTF-8
 * {@code String}, {@code List<Object>}); a queued ticket's {@code +QUEUED} as the string
 * {@code "QUEUED"}. Failures speak Lettuce's exceptions, whatever the driver, so the client
 * classifies them once: a server error is {@code RedisCommandExecutionException} whose
 * message is the error text, a broken connection {@code RedisConnectionException}, a timeout
 * {@code RedisCommandTimeoutException}.
 *
 * <p>An implementation must keep a ticket's promise (docs/commands/tickets.md): a ticket lives as
 * long as the connection that queued it, and a grant published while the notification
 * connection was away is lost. When either happened it calls the reconnect hook, and the
 * client sends every waiting command again under its request id.
 */
public interface Transport extends AutoCloseable {
    /** Sends one command once: `args[0]` the command, `args[1]` its key. */
    CompletableFuture<Object> send(List<String> args);

    /**
     * Sends one command whose arguments are bytes, not all text (scripts mode: a permit id
     * Redisson made is 16 raw bytes). The default sends them as UTF-8 text, so it carries
     * only arguments that are valid UTF-8 and fails on any other.
     */
    default CompletableFuture<Object> sendBytes(List<byte[]> args) {
        List<String> text = new ArrayList<>(args.size());
        for (byte[] a : args) {
            try {
                text.add(StandardCharsets.UTF_8.newDecoder().decode(ByteBuffer.wrap(a)).toString());
            } catch (CharacterCodingException e) {
                return CompletableFuture.failedFuture(new UnsupportedOperationException(
                        "this transport carries text only, and an argument of " + text.get(0) + " is not UTF-8"));
            }
        }
        return send(text);
    }

    /**
     * Sends one command at most once (scripts mode's scripts that must not run twice,
     * Scripts.MAY_RETRY): where the driver would send it again after a reconnect
     * (Lettuce's at-least-once), it fails it instead with {@link RlockOutcomeUnknownException}
     * once it was written. The default is {@link #send}: a driver that replays commands on
     * its own then still may (rlock-spring's transport).
     */
    default CompletableFuture<Object> sendOnce(List<String> args) {
        return send(args);
    }

    /**
     * Sends two commands on the same connection, `first` then `second` (a lock's held-back
     * confirmation and its release, design.md 5), and their replies in that order. A
     * driver that can writes both at once, so the server reads them together and answers
     * both in one write; the default sends them one after the other.
     */
    default List<CompletableFuture<Object>> sendBoth(List<String> first, List<String> second) {
        CompletableFuture<Object> a = send(first);
        return List.of(a, send(second));
    }

    /**
     * The command connection's generation, which changes whenever that connection breaks;
     * -1 for a transport that cannot tell (it then sends no {@link #sendPinned} batch).
     */
    default long generation() {
        return -1;
    }

    /**
     * Sends `commands` in one write on the command connection, only if that connection is
     * still generation `gen` (it queued the tickets whose confirmations lead the batch), and
     * never on another: each command that was not written on it before it broke fails with
     * {@link NotSent} (Lettuce would write it again after its reconnect; it does not), each
     * that was, with {@link RlockOutcomeUnknownException}. Null when it cannot be sent so
     * (another generation, a transport that cannot tell): nothing was sent.
     */
    default List<CompletableFuture<Object>> sendPinned(long gen, List<List<String>> commands) {
        return null;
    }

    /** A pinned command that was never written (its connection broke first): it did not run. */
    final class NotSent extends RuntimeException {
        public NotSent(String message) {
            super(message, null, false, false);
        }
    }

    /** {@link #sendOnce} of a command whose arguments are bytes ({@link #sendBytes}). */
    default CompletableFuture<Object> sendBytesOnce(List<byte[]> args) {
        return sendBytes(args);
    }

    /**
     * Where notification messages go: `(channel, message)` of every subscribed channel, on
     * whatever thread the driver delivers them. Called once, before any subscribe.
     */
    void listen(BiConsumer<String, String> listener);

    /**
     * Subscribes the notification connection (opened on first use) to `channel`; completes
     * once a message published on it from now on is certain to be heard.
     */
    CompletableFuture<Void> subscribe(String channel);

    void unsubscribe(String channel);

    /** Runs `hook` (taking no lock, quickly) whenever queued tickets or grant messages may have been lost. */
    void onReconnect(Runnable hook);

    /**
     * A connection of its own for one blocking command (the fallback for a module without
     * tickets); closing it while the command runs ends the command in the server (the
     * server then drops the waiter, or takes back a grant it had just made).
     */
    Dedicated dedicated();

    /** One blocking command's connection. */
    interface Dedicated extends AutoCloseable {
        CompletableFuture<Object> send(List<String> args);

        @Override
        void close();
    }

    // ---- cluster routing (LettuceClusterTransport); one server needs none of it ----------

    /** Which server holds `key` (a cluster node's id; "" for a transport of one server). */
    default String nodeOf(String key) {
        return "";
    }

    /**
     * Sends a keyless command (ROLE, WAIT after an acquire) to the server that holds `key`,
     * on the connection that key's commands use.
     */
    default CompletableFuture<Object> sendTo(String key, List<String> args) {
        return send(args);
    }

    /**
     * Sends a waiter's ticket command (queue, collect, look) to the server whose
     * notifications `channel` was subscribed on, following no redirect: a MOVED or ASK is
     * the server error it fails with.
     */
    default CompletableFuture<Object> sendTicket(String channel, List<String> args) {
        return send(args);
    }

    /**
     * Runs `hook(channel)` when the server itself drops a subscription (its slot left the
     * node): the tickets queued there will never be heard of again.
     */
    default void onChannelDropped(Consumer<String> hook) {
    }

    /** Whether this is a cluster's transport (scripts mode then asks for sharded pub/sub). */
    default boolean cluster() {
        return false;
    }

    /**
     * Whether the cluster has sharded pub/sub (SSUBSCRIBE; Redis 7 and later, Valkey):
     * without it subscriptions are classic ones. Ignored off a cluster.
     */
    default void shardedPubSub(boolean has) {
    }

    /** Learns again which server holds which key (after a redirect). */
    default CompletableFuture<Void> relearn() {
        return CompletableFuture.completedFuture(null);
    }

    /** Closes what the transport opened (not what the application lent it). */
    @Override
    void close();
}
