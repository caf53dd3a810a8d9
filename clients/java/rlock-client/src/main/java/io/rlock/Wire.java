// How the rlock Java client talks to the server (clients/java, internal): every command of
// a client goes out on its Transport's command connection, read as Reply's values, with
// retries of transient failures (capped exponential backoff and jitter) and request ids.
package io.rlock;

import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisCommandTimeoutException;
import io.lettuce.core.RedisConnectionException;
import io.lettuce.core.protocol.ProtocolKeyword;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Locale;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Supplier;

final class Wire {
    private final Transport transport;
    private final ScheduledExecutorService scheduler;
    private final RlockOptions options;
    private volatile Backend backend;
    private static final ConcurrentHashMap<String, ProtocolKeyword> KEYWORDS = new ConcurrentHashMap<>();
    /** Request ids: this process's random prefix and a counter (unique per client and call). */
    private static final String ID_PREFIX = UUID.randomUUID().toString().substring(0, 8);
    private static final AtomicLong ID_SEQ = new AtomicLong();

    Wire(Transport transport, ScheduledExecutorService scheduler, RlockOptions options) {
        this.transport = transport;
        this.scheduler = scheduler;
        this.options = options;
    }

    /** A fresh request id (`ID` argument): names one call, so that its retry is not applied twice. */
    static String requestId() {
        return ID_PREFIX + "-" + Long.toString(ID_SEQ.incrementAndGet(), 36);
    }

    static ProtocolKeyword keyword(String name) {
        return KEYWORDS.computeIfAbsent(name.toUpperCase(Locale.ROOT), n -> new ProtocolKeyword() {
            private final byte[] bytes = n.getBytes(StandardCharsets.US_ASCII);

            @Override
            public byte[] getBytes() {
                return bytes;
            }

            @Override
            public String toString() {
                return n;
            }
        });
    }

    /** Sends one command once on the command connection; its reply as Reply's values. */
    CompletableFuture<Object> send(List<String> args) {
        return sendOnce(() -> transport.send(args));
    }

    /**
     * Sends one command once: a waiter's ticket command (`channel` its ticket channel) to
     * the server whose notifications that channel was subscribed on, anything else
     * (`channel` null) on the command connection.
     */
    CompletableFuture<Object> send(String channel, List<String> args) {
        return sendOnce(() -> channel == null ? transport.send(args) : transport.sendTicket(channel, args));
    }

    private CompletableFuture<Object> sendOnce(Supplier<CompletableFuture<Object>> call) {
        CompletableFuture<Object> reply;
        try {
            reply = call.get();
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        // A refusal of the module becomes its RlockServerException (its code word's kind).
        CompletableFuture<Object> out = new CompletableFuture<>();
        reply.whenComplete((v, e) -> {
            if (e == null) {
                out.complete(v);
            } else {
                out.completeExceptionally(RlockServerException.of(unwrap(e)));
            }
        });
        return out;
    }

    /**
     * Sends one command, and again after a transient failure (a broken connection, a
     * timeout, a server still loading), up to the options' attempts with capped
     * exponential backoff and jitter. Only commands that are safe to repeat come here:
     * idempotent ones, or ones carrying an `ID` (the server then replays the first reply).
     */
    CompletableFuture<Object> sendRetrying(List<String> args) {
        Backend b = backend;
        if (b != null && Backend.isModuleCommand(args)) {
            return b.send(args); // the module's, or Redisson's scripts where it is absent
        }
        return retrying(args);
    }

    /** Where module commands go (the client's Backend, set once at construction). */
    void route(Backend b) {
        this.backend = b;
    }

    /** {@link #sendRetrying} without the routing of module commands: straight to the server. */
    CompletableFuture<Object> retrying(List<String> args) {
        return sendRetrying(null, args);
    }

    /**
     * {@link #retrying(List)} of a waiter's ticket command (see {@link #send(String, List)}):
     * tickets are the module's, so no Backend routing.
     */
    CompletableFuture<Object> sendRetrying(String channel, List<String> args) {
        CompletableFuture<Object> out = new CompletableFuture<>();
        attempt(() -> channel == null ? transport.send(args) : transport.sendTicket(channel, args), 1, out);
        return out;
    }

    /**
     * {@link #retrying(List)} bounded by time instead of the options' attempts: sent again
     * after each transient failure (a refused connect, a server still loading its AOF...),
     * pausing `firstPauseMs` doubling up to `maxPauseMs`, until an answer or until
     * `forMs` have passed since it was first sent. (One try may itself last longer: Lettuce
     * holds a command written on a connection that broke for its reconnect.)
     */
    CompletableFuture<Object> retryingFor(List<String> args, long forMs, long firstPauseMs, long maxPauseMs) {
        CompletableFuture<Object> out = new CompletableFuture<>();
        attemptUntil(args, System.nanoTime() + forMs * 1_000_000, firstPauseMs, maxPauseMs, out);
        return out;
    }

    private void attemptUntil(List<String> args, long until, long pause, long maxPause, CompletableFuture<Object> out) {
        sendOnce(() -> transport.send(args)).whenComplete((v, e) -> {
            long left = (until - System.nanoTime()) / 1_000_000;
            if (e == null) {
                out.complete(v);
            } else if ((isTransient(e) || refusedConnection(e)) && left > 0) {
                scheduler.schedule(() -> attemptUntil(args, until, Math.min(pause * 2, maxPause), maxPause, out),
                        Math.min(pause, left), TimeUnit.MILLISECONDS);
            } else {
                out.completeExceptionally(unwrap(e));
            }
        });
    }

    /** {@link #retrying} of a command whose arguments are bytes ({@link Transport#sendBytes}). */
    CompletableFuture<Object> retryingBytes(List<byte[]> args) {
        CompletableFuture<Object> out = new CompletableFuture<>();
        attempt(() -> transport.sendBytes(args), 1, out);
        return out;
    }

    /**
     * Scripts mode's script that must not run twice (Scripts.MAY_RETRY): sent at most once
     * ({@link Transport#sendOnce}); retried only after a failure that came before the write
     * (no connection, a server that refused it unrun); a failure that may have come after
     * it fails the call with {@link RlockOutcomeUnknownException}.
     */
    CompletableFuture<Object> atMostOnce(List<String> args) {
        CompletableFuture<Object> out = new CompletableFuture<>();
        attempt(() -> transport.sendOnce(args), 1, out, true);
        return out;
    }

    /** {@link #atMostOnce} of a command whose arguments are bytes. */
    CompletableFuture<Object> atMostOnceBytes(List<byte[]> args) {
        CompletableFuture<Object> out = new CompletableFuture<>();
        attempt(() -> transport.sendBytesOnce(args), 1, out, true);
        return out;
    }

    private void attempt(Supplier<CompletableFuture<Object>> call, int n, CompletableFuture<Object> out) {
        attempt(call, n, out, false);
    }

    private void attempt(Supplier<CompletableFuture<Object>> call, int n, CompletableFuture<Object> out, boolean once) {
        sendOnce(call).whenComplete((v, e) -> {
            boolean unknown = once && mayHaveRun(e);
            if (e == null) {
                out.complete(v);
            } else if (n < options.retryAttempts() && isTransient(e) && !unknown && !out.isDone()) {
                long cap = options.retryMaxDelay().toMillis();
                long base = Math.min(cap, options.retryBaseDelay().toMillis() << Math.min(n - 1, 20));
                long delay = base / 2 + ThreadLocalRandom.current().nextLong(base / 2 + 1);
                scheduler.schedule(() -> attempt(call, n + 1, out, once), delay, TimeUnit.MILLISECONDS);
            } else if (unknown && !(unwrap(e) instanceof RlockOutcomeUnknownException)) {
                out.completeExceptionally(new RlockOutcomeUnknownException("the connection failed after a script"
                        + " that must not run twice was sent (" + unwrap(e) + "): it may or may not have run,"
                        + " and is not sent again", unwrap(e)));
            } else {
                out.completeExceptionally(unwrap(e));
            }
        });
    }

    /**
     * A failure after which a sent command may have run: a reply lost with its connection
     * or timed out. Not: a connection that could not be made, a server error (the server
     * refused it: LOADING, BUSY...).
     */
    static boolean mayHaveRun(Throwable e) {
        if (e == null) {
            return false;
        }
        e = unwrap(e);
        return e instanceof RlockOutcomeUnknownException || e instanceof RedisCommandTimeoutException
                || e instanceof IOException
                || (isTransient(e) && !(e instanceof RedisConnectionException)
                    && !(e instanceof RedisCommandExecutionException));
    }

    static Throwable unwrap(Throwable e) {
        while ((e instanceof CompletionException || e instanceof ExecutionException) && e.getCause() != null) {
            e = e.getCause();
        }
        return e;
    }

    /** Failures worth a retry: the command may not have run, or ran and lost its reply. */
    static boolean isTransient(Throwable e) {
        e = unwrap(e);
        if (e instanceof RlockOutcomeUnknownException) {
            return false;
        }
        if (e instanceof RedisConnectionException || e instanceof RedisCommandTimeoutException
                || e instanceof IOException) {
            return true;
        }
        if (e instanceof RedisCommandExecutionException) {
            String m = String.valueOf(e.getMessage());
            // The codes the module's vectors class as "retry" (spec/vectors/errors.json) and
            // the server's own "not now" replies.
            return m.startsWith("LOADING") || m.startsWith("TRYAGAIN") || m.startsWith("CLUSTERDOWN")
                    || m.startsWith("MASTERDOWN") || m.startsWith("READONLY") || m.startsWith("BUSY ");
        }
        return e instanceof io.lettuce.core.RedisException
                && String.valueOf(e.getMessage()).contains("Connection closed");
    }

    /**
     * A connection the server refused at its `maxclients` (`ERR max number of clients
     * reached`, its answer on a new connection): nothing ran, and a later try may get in.
     * Tried again by {@link #retryingFor} (a held grant's confirmation), not read as the
     * answer; Lettuce's own reconnect usually hides it (it keeps the command meanwhile),
     * a transport that opens connections per command (a pool) may not.
     */
    static boolean refusedConnection(Throwable e) {
        String err = serverError(e);
        return err != null && err.startsWith("ERR max number of clients reached");
    }

    /**
     * A cluster redirection (`MOVED slot host:port`, `ASK slot host:port`): the key's slot
     * is served elsewhere, or moving there.
     */
    static boolean isRedirect(String error) {
        return error != null && (error.startsWith("MOVED ") || error.startsWith("ASK "));
    }

    static boolean isRedirect(Throwable e) {
        return isRedirect(serverError(e));
    }

    /** A server error's text, or null when the failure is not a server error. */
    static String serverError(Throwable e) {
        e = unwrap(e);
        return e instanceof RedisCommandExecutionException ? String.valueOf(e.getMessage()) : null;
    }
}
