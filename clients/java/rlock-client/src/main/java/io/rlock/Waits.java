// Waiting in the server (clients/java, internal; design.md 5, docs/commands/tickets.md): every waiting
// call of one client queues a ticket (`WAIT t ASYNC ID id`) on the client's command
// connection and hears its fate on the client's one notification (pub/sub) connection, so
// the client holds two connections however many threads wait. The Rust client's
// net/tickets is the reference; this is the same protocol over the client's Transport.
//
// Where the server names `ticket-notify`, each ticket carries `NOTIFY <tag>`, the client's
// own random tag, and its messages come on the key's ticket channel + ":" + tag, which only
// this client subscribes: a handoff wakes the one client whose ticket it is, not every
// client waiting on the key. Otherwise (an older module) the key's channel, as before.
// On a single server, a tagged channel stays subscribed after its last waiter leaves
// (idle, at most MAX_IDLE_CHANNELS per notification connection, the one idle the longest
// unsubscribed first), so a process that waits on one lock at a time sends no SUBSCRIBE
// and UNSUBSCRIBE per ticket: nothing but this client's own messages ever comes there, and
// one that comes with no waiter for its id is ignored. The key's channel carries every
// client's messages, and a cluster node drops its shard channels by itself when a slot
// leaves (design.md 5): both are still left after their last waiter. A reconnect forgets
// the idle channels.
//
// A lock, RW lock, fenced lock, expirable or plain semaphore waiter holds on its `granted`
// message when the server names `ticket-holds`, its grant's reply read from the message
// (nil; the fencing token or the permit ids in its detail; 1 for the plain semaphore): the
// listener (Lettuce's event loop) completes the waiter's future on the spot, with no round
// trip and no executor between the message and the waiting thread. The confirmation (the
// same command and id without WAIT) is written there too for the expirable semaphore; a
// lock's and a plain semaphore's is held back for the holder's release to carry in one
// write (sendBehind; the semaphore's pinned to the connection that queued the ticket,
// sendPinnedBehind), or sent alone by the sweep after CONFIRM_DEFER_MS. Its reply settles
// the waiter's Confirm (TAKENBACK: the hold is reported lost; a plain semaphore's release
// that cannot carry it waits for it, see SemaphoreDebts). A detail it cannot read (an
// older module) and the latch's waits collect first.
//
// A timed wait ends at its own deadline on the client's clock (the wait counted from the
// call), whatever the server has said by then: a frozen or loaded server's answer comes
// late. The server's wait is asked to end a little sooner (TIMEOUT_LEAD_MS), so that its
// `timeout` message is normally in first; that message is the answer, without a collect's
// round trip, for a ticket queued once on the connection that heard it (after a re-send
// the same id may have been granted on the old connection: it collects). A waiter whose
// deadline comes first with its ticket maybe still queued, or its grant's collect in
// flight, stays registered as an orphan: a grant that comes after all is collected and
// given back (its undo), never kept by a caller that was told no.
package io.rlock;

import io.lettuce.core.RedisCommandExecutionException;

import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executor;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

final class Waits {
    /** The name the notification connection gives itself (`CLIENT LIST` shows it). */
    static final String CONNECTION_NAME = RlockClient.NOTIFICATION_CONNECTION_NAME;
    /** How long after a ticket's deadline the client looks for itself (see ticketed). */
    static final long LATE_LOOK_MS = 2_000;
    /**
     * How much sooner than the caller's deadline a timed ticket's wait ends in the server
     * (at most a quarter of the wait): the server counts from the command's arrival and its
     * `timeout` message takes hops back (server, event loop, waiter), each waiting for a
     * CPU on a loaded machine, so that message is normally in before the deadline and the
     * waiter knows its ticket gone: it leaves no orphan.
     */
    static final long TIMEOUT_LEAD_MS = 10;
    /**
     * How long a held grant's confirmation is tried again after a transient failure (its
     * connection broke, the server refused connects or answered LOADING), until a definite
     * answer: the grant (kept) or TAKENBACK (lost); past it, the hold is reported lost.
     * Longer than the server's grace (`rlock.ticket-confirm-ms`, 1 s) on purpose: a server
     * that took the grant back answers TAKENBACK from then on, so trying longer never keeps
     * a hold the server gave away, and a server that restarted (down for longer than the
     * grace) reloads the grant from its AOF and answers it.
     */
    static final long CONFIRM_RETRY_FOR_MS = 5_000;
    /**
     * The first pause between a confirmation's tries, doubled up to
     * CONFIRM_RETRY_MAX_PAUSE_MS: a broken connection is usually back at once, a
     * restarting server takes a while.
     */
    static final long CONFIRM_RETRY_PAUSE_MS = 10;
    static final long CONFIRM_RETRY_MAX_PAUSE_MS = 200;
    /**
     * How long a lock's held grant's confirmation waits for the holder's release to carry
     * it ({@link #sendBehind}) before it goes alone: a holder that releases at once sends
     * both in one write, which the server reads at once and answers in one write
     * (design.md 5). Far below the server's grace, which only starts when the connection
     * that queued the ticket closes.
     */
    static final long CONFIRM_DEFER_MS = 10;

    /** The server's part of a wait of `left` ms (0: no limit), {@link #TIMEOUT_LEAD_MS} sooner. */
    static long serverWait(long left) {
        return left - Math.min(TIMEOUT_LEAD_MS, left / 4);
    }

    /**
     * The command's "not now" reply (docs/commands/tickets.md), for a timed wait ended by
     * the client's deadline or answered by its `timeout` message: what the server answers a
     * wait that ran out, with -1 where that reply carries the holder's PTTL (not known
     * without asking, and no caller reads it).
     */
    static Object ranOut(List<String> args) {
        return switch (args.get(0).toUpperCase(Locale.ROOT)) {
            case "RFENCED.ACQUIRE" -> java.util.Arrays.asList(-1L, null);
            case "RLOCK.ACQUIRE", "RRWLOCK.ACQUIRE" -> -1L;
            case "RPSEMAPHORE.ACQUIRE" -> null;
            default -> 0L; // RSEMAPHORE.ACQUIRE, RLATCH.AWAIT
        };
    }
    /**
     * How many times one waiter follows its key's slot to another node (a redirect, or its
     * channel dropped by the server) before it fails with the redirect: a slot migrating
     * answers ASK until it has moved, so the waiter backs off (up to REROUTE_MAX_DELAY_MS)
     * meanwhile.
     */
    static final int MAX_REROUTES = 20;
    static final long REROUTE_MAX_DELAY_MS = 1_000;

    private final Transport transport;
    private final RlockStats stats;
    private final Wire wire;
    private final Executor executor;
    private final ScheduledExecutorService scheduler;
    /**
     * Lock confirmations held back (see {@link #CONFIRM_DEFER_MS}), the oldest first; those a
     * release took along stay until the sweep passes them. Guarded by itself.
     */
    private final ArrayDeque<Confirm> heldBack = new ArrayDeque<>();
    /** A sweep of {@link #heldBack} is scheduled. Guarded by heldBack. */
    private boolean sweeping;
    /** {@link #CONFIRM_DEFER_MS} in nanoseconds (tests lengthen it to hold one back for sure). */
    private volatile long deferNanos = TimeUnit.MILLISECONDS.toNanos(CONFIRM_DEFER_MS);
    private final RlockOptions.WaitMode waitMode;
    /** This client's ticket tag (`NOTIFY tag`): 16 lowercase hex characters, drawn once. */
    private final String tag = newTag();
    /**
     * The command connection's capability probe ({@code RLOCK.HELLO}): asked before the
     * first waiting call and again when that connection comes back (a failover may reach
     * another server); null until asked, and after a failed probe. Written under
     * {@code connecting}.
     */
    private volatile CompletableFuture<Capabilities> probe;

    /**
     * How many tagged ticket channels with no waiter stay subscribed on the notification
     * connection: one more idle evicts the one idle the longest.
     */
    static final int MAX_IDLE_CHANNELS = 64;

    /** Ticket channels subscribed, with their waiter counts (idle ones at 0). Guarded by `this`. */
    private final Map<String, Sub> subs = new HashMap<>();
    /**
     * Per node ({@link Transport#nodeOf}, "" off a cluster): the tagged channels subscribed
     * with no waiter, the one idle the longest first. Guarded by `this`.
     */
    private final Map<String, LinkedHashMap<String, Sub>> idle = new HashMap<>();
    /** Waiters by request id, until their ticket's fate is known (cancelled ones too). */
    private final Map<String, Waiter> waiters = new ConcurrentHashMap<>();
    private final Object connecting = new Object();
    private volatile Backend backend;

    private static final class Sub {
        final String channel;
        /**
         * This client's own tagged channel on a single server: only its own tickets'
         * messages come there, so it may stay subscribed between waits at no cost but the
         * server's subscription entry. The key's channel (no tag) carries every client's
         * messages and is left after its last waiter; so is a cluster node's shard channel,
         * which the node drops by itself when the key's slot leaves (idle shard channels
         * lost grants in the fault harness's migrate cell, design.md 5).
         */
        final boolean tagged;
        /** The node whose notification connection holds the subscription ("" off a cluster). */
        final String node;
        int refs;
        CompletableFuture<Void> ready;

        Sub(String channel, boolean tagged, String node) {
            this.channel = channel;
            this.tagged = tagged;
            this.node = node;
        }
    }

    /** A fresh tag: 8 bytes of a secure random source in lowercase hex. */
    static String newTag() {
        byte[] b = new byte[8];
        new SecureRandom().nextBytes(b);
        StringBuilder out = new StringBuilder(16);
        for (byte x : b) {
            out.append(Character.forDigit((x >> 4) & 0xf, 16)).append(Character.forDigit(x & 0xf, 16));
        }
        return out.toString();
    }

    /** This client's ticket tag. */
    String tag() {
        return tag;
    }

    Waits(Transport transport, Wire wire, Executor executor, ScheduledExecutorService scheduler,
          RlockOptions.WaitMode waitMode, RlockStats stats) {
        this.transport = transport;
        this.stats = stats;
        this.wire = wire;
        this.executor = executor;
        this.scheduler = scheduler;
        this.waitMode = waitMode;
        transport.listen(this::onMessage);
        // A ticket lives as long as the connection that queued it, and a grant message sent
        // while the subscriber was away is lost: after either connection comes back, every
        // waiter sends its command again with the same request id. The server replays a
        // grant already made under that id and queues anything else anew. The server may be
        // another one (a failover): it is asked what it can do first. Idle channels are
        // unsubscribed and forgotten first (see forgetIdle).
        transport.onReconnect(() -> {
            forgetIdle();
            probe = null;
            capabilities().whenComplete((caps, e) -> resendAll(e == null ? caps : null));
        });
        // In a cluster, a slot that left a node takes its ticket channels with it (Valkey 9's
        // atomic slot migration unsubscribes them): the tickets queued there are answered
        // MOVED on a channel we no longer hear, so their waiters queue again on the new owner.
        transport.onChannelDropped(this::dropped);
    }

    /** The ticket channel of `key` (Redisson's prefixName rule keeps it in the key's slot). */
    static String channel(String key) {
        return key.contains("{") ? "rlock_ticket:" + key : "rlock_ticket:{" + key + "}";
    }

    /** The channel of `key`'s tickets queued with `NOTIFY tag` (the key's channel's slot). */
    static String channel(String key, String tag) {
        return channel(key) + ":" + tag;
    }

    /**
     * A grant held on its {@code granted} message and confirmed off the holder's path: its
     * outcome, and what to run if it was taken back (the lock's lost signal), registered by
     * the holder before or after the outcome is known. A wait that collected its grant
     * instead (no `ticket-holds`, a blocked wait, scripts mode) leaves it unheld and pending
     * for ever.
     */
    static final class Confirm {
        /** How a held grant's confirmation ended. */
        enum Outcome {
            /** The server answered the grant: it is kept. */
            CONFIRMED,
            /** The server answered TAKENBACK: it gave the grant back (released it, handed it on). */
            TAKEN_BACK,
            /**
             * No definite answer within {@link #CONFIRM_RETRY_FOR_MS} (a server unreachable
             * that long), or another error: the hold is reported lost, but the grant may
             * still stand in the server.
             */
            IN_DOUBT
        }

        /**
         * null: pending; an Outcome: settled; else the hook to run if lost. A state machine,
         * not a future, on the holder's path: no allocation but the hook.
         */
        private Object state;
        /** The outcome as a future, made when asked for (a plain semaphore's release, an undo). */
        private CompletableFuture<Outcome> future;
        /** Held on its grant message: a confirmation is under way (set before the holder proceeds). */
        private volatile boolean held;
        /** Whether, and how, the holder's release may carry the confirmation. */
        enum Ride {
            /** It may not: the confirmation goes as soon as the grant is held. */
            NONE,
            /**
             * On any connection (a lock's: the server's take-back checks the owner still
             * holds what the grant wrote, so a release run first leaves nothing to take).
             */
            ANY,
            /**
             * Only on the connection that queued the ticket (a plain semaphore's, whose
             * release must run behind confirmations that stood): where the transport can
             * pin a batch to it ({@link Transport#generation}); else the confirmation goes
             * at once, so the release need not wait for it.
             */
            PINNED
        }

        /**
         * How the holder's release may carry the confirmation. One that may is held back,
         * to go out in front of that release in one write, or alone after
         * {@link #CONFIRM_DEFER_MS}.
         */
        final Ride ride;
        /** The confirmation held back, not yet written (null: none, or sent). Guarded by this. */
        private List<String> heldBack;
        /** When it was held back (System.nanoTime). */
        private long heldBackAt;
        /**
         * The command connection's generation ({@link Transport#generation}) that queued the
         * ticket, for a ticket queued once (never sent again); -1 otherwise. A semaphore's
         * release rides only on that connection ({@link #sendPinnedBehind}).
         */
        volatile long gen = -1;

        /** A confirmation sent as soon as the grant is held on its message (an expirable permit's). */
        Confirm() {
            this(Ride.NONE);
        }

        Confirm(Ride ride) {
            this.ride = ride;
        }

        /** Whether its confirmation is held back now (not yet written). */
        synchronized boolean isHeldBack() {
            return heldBack != null;
        }

        synchronized void holdBack(List<String> confirmation) {
            heldBack = confirmation;
            heldBackAt = System.nanoTime();
        }

        /** The held-back confirmation, taken to be written now by the caller (null: none left). */
        synchronized List<String> takeHeldBack() {
            List<String> a = heldBack;
            heldBack = null;
            return a;
        }

        /** Nanoseconds until a held-back confirmation is due alone (<= 0: due; Long.MIN_VALUE: none held back). */
        synchronized long dueIn(long now, long deferNanos) {
            return heldBack == null ? Long.MIN_VALUE : deferNanos - (now - heldBackAt);
        }

        /** Runs `hook` once if the grant turns out lost, taken back or in doubt (at once if it was already). */
        void onTakenBack(Runnable hook) {
            synchronized (this) {
                if (!(state instanceof Outcome)) {
                    state = hook;
                    return;
                }
                if (state == Outcome.CONFIRMED) {
                    return;
                }
            }
            hook.run();
        }

        /** The confirmation's outcome (the first settles it). */
        void settle(Outcome o) {
            Object hook;
            CompletableFuture<Outcome> f;
            synchronized (this) {
                if (state instanceof Outcome) {
                    return;
                }
                hook = state;
                state = o;
                f = future;
            }
            if (o != Outcome.CONFIRMED && hook != null) {
                ((Runnable) hook).run();
            }
            if (f != null) {
                f.complete(o);
            }
        }

        /** Completes with the confirmation's outcome; never, for a grant that was collected. */
        CompletableFuture<Outcome> outcome() {
            synchronized (this) {
                if (future == null) {
                    future = state instanceof Outcome o ? CompletableFuture.completedFuture(o) : new CompletableFuture<>();
                }
                return future;
            }
        }

        /** Whether the wait held on its grant message (its confirmation under way or answered). */
        boolean held() {
            return held;
        }

        void markHeld() {
            held = true;
        }

        /** The outcome of a confirmation that ended with `e` (null: answered). */
        static Outcome of(Throwable e) {
            if (e == null) {
                return Outcome.CONFIRMED;
            }
            String err = Wire.serverError(e);
            return err != null && err.startsWith("TAKENBACK") ? Outcome.TAKEN_BACK : Outcome.IN_DOUBT;
        }
    }

    /** A waiting command taken apart. */
    static final class Waiter {
        final List<String> args;
        final int waitAt;
        final long waitMs;
        final String id;
        final boolean addedId;
        final boolean latch;
        /** The key's ticket channel. */
        final String keyChannel;
        /**
         * Where this waiter's messages come: the key's channel, or its tagged one when its
         * ticket carries `NOTIFY notify`. Changed only with its subscription (see resendAll).
         */
        volatile String channel;
        /** The tag its ticket carries (null: none, the key's channel). */
        volatile String notify;
        final long started = System.nanoTime();
        /** When a timed wait ends on this client's clock (System.nanoTime; unused for no limit). */
        final long deadline;
        /**
         * Its command was sent again (a reconnect, a reroute): a `timeout` message may then
         * hide a grant made under the same id on the old connection, which a collect replays.
         */
        volatile boolean resent;
        /**
         * Its `timeout` message came before its deadline: nothing is queued any more, and the
         * wait ends, not granted, at the deadline (a timed wait never ends sooner).
         */
        volatile boolean gone;
        /** Waits on a blocked connection (the fallback): its reply ends it, not the deadline. */
        volatile boolean blocked;
        final Function<Object, List<List<String>>> undo;
        final CompletableFuture<Object> result = new CompletableFuture<>();
        /** Non-null for a wait that may hold on its grant message (see heldReply). */
        final Confirm confirm;
        /** Holds on its `granted` message (a readable one): `confirm` and a server naming `ticket-holds`. */
        volatile boolean holds;
        /** The confirmation (`look()`), made before the grant, off its path. */
        List<String> confirmArgs;
        volatile boolean finished;
        /** The command connection's generation when its ticket was last sent. */
        volatile long gen = -1;
        /** Counted as a wait once (a resent ticket queued again is the same wait). */
        volatile boolean queued;
        /** The subscription this waiter counts in (null: none, or one the server dropped). Guarded by Waits.this. */
        Sub sub;
        /** Moving to the slot's new owner (see reroute). Guarded by this waiter. */
        boolean rerouting;
        int reroutes;

        Waiter(List<String> args, Function<Object, List<List<String>>> undo) {
            this(args, undo, null);
        }

        Waiter(List<String> args, Function<Object, List<List<String>>> undo, Confirm confirm) {
            this.args = args;
            this.undo = undo;
            this.confirm = confirm;
            int w = find(args, "WAIT");
            if (w < 0) {
                throw new IllegalArgumentException("not a waiting command: " + args);
            }
            this.waitAt = w + 1;
            this.waitMs = Long.parseLong(args.get(waitAt));
            this.deadline = started + waitMs * 1_000_000;
            int i = find(args, "ID");
            this.addedId = i < 0;
            this.id = addedId ? Wire.requestId() : args.get(i + 1);
            this.latch = args.get(0).equalsIgnoreCase("RLATCH.AWAIT");
            this.keyChannel = channel(args.get(1));
            this.channel = keyChannel;
        }

        /** Queues with `NOTIFY tag` from now on (null: on the key's channel). */
        void notifyOn(String tag) {
            this.notify = tag;
            this.channel = tag == null ? keyChannel : keyChannel + ":" + tag;
        }

        static int find(List<String> args, String opt) {
            for (int i = args.size() - 2; i >= 2; i--) {
                if (args.get(i).equalsIgnoreCase(opt)) {
                    return i;
                }
            }
            return -1;
        }

        /** The wait left: 0 for no limit, -1 when over. */
        long waitLeft() {
            if (waitMs == 0) {
                return 0;
            }
            long left = waitMs - (System.nanoTime() - started) / 1_000_000;
            return left > 0 ? left : -1;
        }

        List<String> ticketed() {
            long left = waitLeft();
            if (left < 0) {
                return look();
            }
            List<String> a = new ArrayList<>(args);
            a.set(waitAt, Long.toString(serverWait(left)));
            a.add("ASYNC");
            String t = notify;
            if (t != null) {
                a.add("NOTIFY");
                a.add(t);
            }
            if (addedId) {
                a.add("ID");
                a.add(id);
            }
            return a;
        }

        /** The command without WAIT: answers at once (a remembered grant under the same id, or the state now). */
        List<String> look() {
            List<String> a = new ArrayList<>(args);
            a.remove(waitAt);
            a.remove(waitAt - 1);
            return a;
        }

        /** The command with what is left of its wait, blocking a connection (the fallback). */
        List<String> blocking() {
            long left = waitLeft();
            if (left < 0) {
                return look();
            }
            List<String> a = new ArrayList<>(args);
            a.set(waitAt, Long.toString(left));
            return a;
        }
    }

    /**
     * Waits for a command carrying `WAIT t` (and `ID`, but for the latch). The future
     * completes with the command's ordinary reply. Cancelling it (an interrupted or
     * abandoned wait) leaves nothing behind: a grant that comes after all is collected and
     * given back with the commands `undo` makes from its reply.
     */
    CompletableFuture<Object> await(List<String> args, Function<Object, List<List<String>>> undo) {
        return await(args, undo, null);
    }

    /**
     * As {@link #await(List, Function)}, for an acquire whose grant's reply its `granted`
     * message carries ({@link #heldReply}): with a `confirm`, the wait completes with that
     * reply on the message if the server names `ticket-holds` (design.md 5), and `confirm`
     * tells whether the server kept the grant. A blocked wait, a server without
     * `ticket-holds`, a message without a readable detail or a scripts-mode wait (a
     * Backend) collects first and leaves `confirm` pending for ever.
     */
    CompletableFuture<Object> await(List<String> args, Function<Object, List<List<String>>> undo, Confirm confirm) {
        Backend b = backend;
        return b != null ? b.await(args, undo, confirm) : awaitModule(args, undo, confirm);
    }

    /**
     * As {@link #await(List, Function, Confirm)}, for a handle's waiting acquire: in module
     * mode it asks without WAIT first unless `seen` found it held lately ({@link Contention});
     * `satisfied` tells a grant from a reply.
     */
    CompletableFuture<Object> await(List<String> args, Function<Object, List<List<String>>> undo, Confirm confirm,
                                    Contention seen, java.util.function.Predicate<Object> satisfied) {
        Backend b = backend;
        return b != null ? b.await(args, undo, confirm, seen, satisfied) : awaitModule(args, undo, confirm);
    }

    /** Where waits go first (the client's Backend: the module's tickets, or Redisson's way). */
    void route(Backend b) {
        this.backend = b;
    }

    /** Ask the capability probe again at the next call (the module went, say). */
    void forgetCapabilities() {
        probe = null;
    }

    /** {@link #await} with the module: tickets, or a blocked connection. */
    CompletableFuture<Object> awaitModule(List<String> args, Function<Object, List<List<String>>> undo) {
        return awaitModule(args, undo, null);
    }

    /** {@link #await(List, Function, Confirm)} with the module. */
    CompletableFuture<Object> awaitModule(List<String> args, Function<Object, List<List<String>>> undo, Confirm confirm) {
        return started(args, undo, confirm).result;
    }

    /**
     * {@link #awaitModule(List, Function, Confirm)} telling whether its reply came at once
     * (the ticket answered with the grant itself, not QUEUED first; a blocked wait cannot
     * tell, so never at once). Cancelling it cancels the wait; a grant that comes when the
     * result is cancelled is given back with `undo`.
     */
    CompletableFuture<Contention.Waited> awaitModuleWaited(List<String> args, Function<Object, List<List<String>>> undo,
                                                           Confirm confirm) {
        Waiter w = started(args, undo, confirm);
        CompletableFuture<Contention.Waited> out = new CompletableFuture<>();
        out.whenComplete((v, x) -> {
            if (out.isCancelled()) {
                w.result.cancel(true);
            }
        });
        w.result.whenComplete((reply, x) -> {
            if (x != null) {
                out.completeExceptionally(Wire.unwrap(x));
            } else if (!out.complete(new Contention.Waited(reply, !w.queued && !w.blocked))) {
                undo.apply(reply).forEach(wire::sendRetrying);
            }
        });
        return out;
    }

    private Waiter started(List<String> args, Function<Object, List<List<String>>> undo, Confirm confirm) {
        Waiter w = new Waiter(args, undo, confirm);
        if (waitMode == RlockOptions.WaitMode.BLOCKING) {
            blockingWait(w);
            return w;
        }
        if (w.waitMs > 0) {
            // Counted from here, whatever the probe, the subscription or the server take.
            CompletableFuture.delayedExecutor(w.waitMs, TimeUnit.MILLISECONDS, executor).execute(() -> expire(w));
        }
        capabilities().whenComplete((caps, e) -> {
            if (e == null && caps.tickets()) {
                w.notifyOn(caps.has("ticket-notify") ? tag : null);
                if (w.confirm != null && caps.has("ticket-holds")) {
                    w.confirmArgs = w.look();
                    w.holds = true;
                }
                ticketed(w);
            } else if (waitMode == RlockOptions.WaitMode.TICKETS) {
                w.result.completeExceptionally(e != null ? Wire.unwrap(e)
                        : new IllegalStateException("the server queues no tickets (" + caps + "); use WaitMode.AUTO or BLOCKING"));
            } else {
                // No tickets, or a probe the server refused (an ACL without rlock.hello):
                // what cannot be learnt is not assumed; a blocked wait works wherever the
                // module is.
                blockingWait(w);
            }
        });
        return w;
    }

    /**
     * What the server of the command connection can do: the probe's answer, asked once
     * per connection (see {@link #probe}).
     */
    CompletableFuture<Capabilities> capabilities() {
        CompletableFuture<Capabilities> p = probe;
        if (p != null) {
            return p;
        }
        synchronized (connecting) {
            if (probe != null) {
                return probe;
            }
            {
                CompletableFuture<Capabilities> asked = wire.sendRetrying(Capabilities.HELLO).handle((reply, e) -> {
                    if (e == null) {
                        return Capabilities.parse(reply);
                    }
                    Capabilities c = Capabilities.fromError(e);
                    if (c == null) {
                        throw new CompletionException(Wire.unwrap(e));
                    }
                    return c;
                });
                probe = asked;
                // A failed probe is asked again by the next caller.
                asked.whenComplete((c, e) -> {
                    if (e != null) {
                        synchronized (connecting) {
                            if (probe == asked) {
                                probe = null;
                            }
                        }
                    }
                });
                // This probe, not the field: a probe refused at once has already cleared it.
                return asked;
            }
        }
    }

    private void ticketed(Waiter w) {
        if (w.result.isDone()) {
            return; // its deadline came, or it was cancelled, before anything was queued
        }
        waiters.put(w.id, w);
        joinAndSend(w);
        if (w.waitMs > 0) {
            // The server ends a ticket at its deadline and says so; should that message be
            // lost, the client looks once itself a little later (the same id: a grant made
            // meanwhile is replayed, else the state now), so no wait outlives its time.
            CompletableFuture.delayedExecutor(w.waitMs + LATE_LOOK_MS, TimeUnit.MILLISECONDS, executor)
                    .execute(() -> send(w, w.look()));
        }
    }

    /** Subscribes the waiter's channel (confirmed), then queues its ticket on the same node. */
    private void joinAndSend(Waiter w) {
        join(w).whenComplete((ok, e) -> {
            if (e != null && Wire.isRedirect(e)) {
                channelMoved(w.channel, e, false); // subscribed where the slot no longer is
            } else if (e != null) {
                finish(w, null, e);
            } else {
                send(w, w.ticketed());
            }
        });
    }

    private void send(Waiter w, List<String> args) {
        if (w.finished) {
            return;
        }
        boolean ticketed = args.contains("ASYNC");
        if (ticketed) {
            w.gen = transport.generation();
        }
        wire.sendRetrying(w.channel, args).whenComplete((reply, e) -> onReply(w, ticketed, reply, e));
    }

    /**
     * The waiter's key is served by another node now (a redirect answered to its command
     * or told in its ticket's `error` message, or its channel dropped by the server): learn
     * the layout again, subscribe on the new owner and queue there with the same request id
     * (a grant made under it is replayed, anything else queued anew). A slot still moving
     * answers ASK: the waiter backs off and asks again until it has moved.
     */
    private void reroute(Waiter w, Throwable why) {
        int n;
        synchronized (w) {
            if (w.finished || w.rerouting || w.gone) {
                return; // gone: nothing queued to move
            }
            w.rerouting = true;
            n = ++w.reroutes;
        }
        if (n > MAX_REROUTES) {
            synchronized (w) {
                w.rerouting = false;
            }
            finish(w, null, why);
            return;
        }
        leave(w);
        long delay = n == 1 ? 0 : Math.min(REROUTE_MAX_DELAY_MS, 25L << Math.min(n - 2, 10));
        CompletableFuture.delayedExecutor(delay, TimeUnit.MILLISECONDS, executor).execute(() ->
                transport.relearn().whenComplete((v, e) -> {
                    synchronized (w) {
                        w.rerouting = false;
                    }
                    if (!w.finished) {
                        w.resent = true;
                        joinAndSend(w);
                    }
                }));
    }

    /** The server dropped our subscription to `channel` (its slot left the node). */
    private void dropped(String channel) {
        channelMoved(channel, new RedisCommandExecutionException("MOVED (the slot of " + channel + " left the node)"), false);
    }

    /**
     * `channel`'s key is served elsewhere: its subscription here is forgotten (and
     * unsubscribed, when the server still has it) and every waiter on it moves, so that the
     * next one to join subscribes afresh on the new owner. (Moving one waiter alone would
     * leave the others' count holding the old subscription.)
     */
    private void channelMoved(String channel, Throwable why, boolean stillSubscribed) {
        synchronized (this) {
            Sub s = subs.remove(channel);
            if (s != null) {
                unidle(s); // a channel the server dropped leaves the idle ones too
                for (Waiter w : waiters.values()) {
                    if (w.sub == s) {
                        w.sub = null;
                    }
                }
                if (stillSubscribed) {
                    transport.unsubscribe(channel);
                }
            }
        }
        for (Waiter w : waiters.values()) {
            if (w.channel.equals(channel)) {
                reroute(w, why);
            }
        }
    }

    private void onReply(Waiter w, boolean ticketed, Object reply, Throwable e) {
        if (e != null && Wire.isRedirect(e)) {
            channelMoved(w.channel, e, true);
        } else if (e != null) {
            finish(w, null, e);
        } else if (ticketed && "QUEUED".equals(reply)) {
            if (!w.queued) {
                w.queued = true;
                stats.waits.increment();
            }
        } else {
            finish(w, reply, null);
        }
    }

    /**
     * A ticket message, on the transport's listener thread (Lettuce: the event loop that
     * read it). For a holder this is the whole critical path: parse, look up, write the
     * confirmation, complete the future the waiting thread is parked on.
     */
    private void onMessage(String channel, String message) {
        if (!channel.startsWith("rlock_ticket:")) {
            Backend b = backend;
            if (b != null) {
                b.onMessage(channel, message); // Redisson's channels: scripts-mode waits
            }
            return;
        }
        Note n = Note.parse(message);
        if (n == null) {
            return;
        }
        Waiter w = waiters.get(n.id);
        if (w == null || !w.channel.equals(channel)) {
            return;
        }
        switch (n.action()) {
            case GRANTED:
                Object held;
                if (w.latch) {
                    finish(w, 1L, null);
                } else if (w.holds && (held = heldReply(w.args, n.detail)) != COLLECT) {
                    hold(w, held);
                } else {
                    send(w, w.look()); // collect: the same id replays the grant
                }
                break;
            case COLLECT:
                if (n.kind().equals("timeout") && !w.resent && w.waitMs > 0) {
                    // Removed, nothing granted: the reply of a wait that ran out, without a
                    // collect's round trip; given at the deadline (see expire), or now if
                    // that has come.
                    w.gone = true;
                    if (System.nanoTime() - w.deadline >= 0 || w.result.isDone()) {
                        finish(w, ranOut(w.args), null);
                    }
                    break;
                }
                // A timeout after a re-send, or a kind this client does not know: the
                // ticket left its queue all the same, and the reply without WAIT tells what
                // happened (granted under this id, or not). A cancelled waiter gives back
                // what it gets.
                send(w, w.look());
                break;
            case FAIL:
                if (Wire.isRedirect(n.detail)) {
                    // The key migrated away while queued (classic MIGRATE): ASK or MOVED.
                    channelMoved(w.channel, new RedisCommandExecutionException(n.detail), true);
                } else {
                    finish(w, null, new RedisCommandExecutionException(n.detail));
                }
        }
    }

    /**
     * Held on the `granted` message: the grant is written in the server (design.md 5). The
     * confirmation goes out first, so that it precedes on the command connection anything
     * the woken holder sends (its release); its reply settles the Confirm. A TAKENBACK (the
     * connection closed and no confirmation came within rlock.ticket-confirm-ms) or any
     * other failure settles it lost; a transient one (a broken connection, a restarting
     * server) is tried again for CONFIRM_RETRY_FOR_MS. Then the waiter's future completes
     * here, with the grant's reply read from the message.
     */
    private void hold(Waiter w, Object reply) {
        if (w.finished) {
            return;
        }
        Confirm c = w.confirm;
        c.markHeld();
        c.gen = w.resent ? -1 : w.gen;
        if (c.ride == Confirm.Ride.ANY || (c.ride == Confirm.Ride.PINNED && c.gen >= 0)) {
            c.holdBack(w.confirmArgs);
            deferred(c);
        } else {
            confirm(c, w.confirmArgs);
        }
        finish(w, reply, null);
    }

    /**
     * Sends confirmation `args` of `c` until a definite answer settles it. Straight to the
     * module (a ticket is the module's; no Backend stage to pass through), on the command
     * connection, which follows a MOVED to where the grant's slot went.
     */
    private void confirm(Confirm c, List<String> args) {
        wire.retryingFor(args, CONFIRM_RETRY_FOR_MS, CONFIRM_RETRY_PAUSE_MS, CONFIRM_RETRY_MAX_PAUSE_MS)
                .whenComplete((r, e) -> c.settle(Confirm.of(e)));
    }

    /** Holds `c`'s confirmation back for a release to carry; the sweep sends it alone when due. */
    private void deferred(Confirm c) {
        boolean schedule;
        synchronized (heldBack) {
            heldBack.add(c);
            schedule = !sweeping;
            sweeping = true;
        }
        if (schedule) {
            sweepIn(deferNanos);
        }
    }

    /** Schedules the sweep; on a client closing (its scheduler gone), sends what is held back now. */
    private void sweepIn(long nanos) {
        try {
            scheduler.schedule(this::sweep, nanos, TimeUnit.NANOSECONDS);
        } catch (RejectedExecutionException closing) {
            List<Confirm> all;
            synchronized (heldBack) {
                all = new ArrayList<>(heldBack);
                heldBack.clear();
                sweeping = false;
            }
            sendHeldBack(all);
        }
    }

    /**
     * Sends alone every held-back confirmation that is due and no release took along, and
     * comes back for the next one: one scheduled task at a time, however many holders,
     * and none while nothing is held back.
     */
    private void sweep() {
        List<Confirm> due = new ArrayList<>();
        long next = -1;
        long now = System.nanoTime();
        synchronized (heldBack) {
            for (Confirm c; (c = heldBack.peek()) != null; ) {
                long in = c.dueIn(now, deferNanos);
                if (in == Long.MIN_VALUE || in <= 0) {
                    heldBack.poll();
                    if (in != Long.MIN_VALUE) {
                        due.add(c);
                    }
                } else {
                    next = in;
                    break;
                }
            }
            sweeping = next >= 0;
        }
        for (Confirm c : due) {
            List<String> args = c.takeHeldBack();
            if (args != null) {
                confirm(c, args);
            }
        }
        if (next >= 0) {
            sweepIn(next);
        }
    }

    /**
     * Sends `command` (a plain semaphore's release) right behind the held-back confirmations
     * `cs`, all in one write, pinned to the command connection that queued their tickets
     * ({@link Transport#sendPinned}): the server takes a grant back only after that
     * connection closed, and runs its commands in order, so a release it runs there follows
     * confirmations that stood (design.md 5). Null when that cannot be (a confirmation no
     * longer held back, a ticket sent again, that connection broken since, a transport that
     * cannot pin): the confirmations still held back are sent alone, and the caller takes
     * the usual way (waiting for their outcomes). The returned future fails with
     * {@link Transport.NotSent} or {@link RlockOutcomeUnknownException} when the
     * connection broke around the batch: the caller then waits for the outcomes too and
     * sends `command` again under its request id (the server replays it if it ran).
     */
    CompletableFuture<Object> sendPinnedBehind(List<Confirm> cs, List<String> command) {
        long gen = transport.generation();
        List<List<String>> confirmations = new ArrayList<>(cs.size());
        boolean pinnable = gen >= 0;
        for (Confirm c : cs) {
            List<String> a = c.takeHeldBack();
            if (a == null || c.gen != gen) {
                pinnable = false;
            }
            confirmations.add(a);
        }
        List<CompletableFuture<Object>> replies = null;
        if (pinnable) {
            List<List<String>> batch = new ArrayList<>(confirmations);
            batch.add(command);
            replies = transport.sendPinned(gen, batch);
        }
        for (int i = 0; i < cs.size(); i++) {
            Confirm c = cs.get(i);
            List<String> a = confirmations.get(i);
            if (a == null) {
                continue; // already sent alone
            }
            if (replies == null) {
                confirm(c, a);
            } else {
                settleRidden(c, a, replies.get(i));
            }
        }
        return replies == null ? null : replies.get(cs.size());
    }

    /** Sends alone, now, those of `cs` still held back (a release that cannot carry them waits for them). */
    void sendHeldBack(List<Confirm> cs) {
        for (Confirm c : cs) {
            List<String> a = c.takeHeldBack();
            if (a != null) {
                confirm(c, a);
            }
        }
    }

    /** Tests: sends every held-back confirmation now; completes once each has its outcome. */
    CompletableFuture<Void> flushHeldBack() {
        List<Confirm> all;
        synchronized (heldBack) {
            all = new ArrayList<>(heldBack);
        }
        List<CompletableFuture<Confirm.Outcome>> outcomes = new ArrayList<>();
        for (Confirm c : all) {
            List<String> args = c.takeHeldBack();
            if (args != null) {
                confirm(c, args);
                outcomes.add(c.outcome());
            }
        }
        return CompletableFuture.allOf(outcomes.toArray(CompletableFuture[]::new));
    }

    /** Tests: hold lock confirmations back for `ms` instead of {@link #CONFIRM_DEFER_MS}. */
    void deferConfirmsFor(long ms) {
        deferNanos = TimeUnit.MILLISECONDS.toNanos(ms);
    }

    /**
     * Sends `command` (a lock's release) right behind `c`'s held-back confirmation, both in
     * one write on the command connection (design.md 5): the server runs them in that order
     * and answers both in one write. Null when there is nothing held back (no confirmation,
     * already sent, or a grant that was collected): the caller sends `command` itself. The
     * confirmation settles `c` as it would alone, tried again alone after a transient
     * failure; `command`, after one, goes through the usual retries (it carries an `ID`).
     * Where the server collects a grant in a release (`release-collects`), the
     * confirmation is not sent at all: `command` collects the grant itself
     * ({@link #sendCollecting}).
     */
    CompletableFuture<Object> sendBehind(Confirm c, List<String> command) {
        List<String> confirmation = c == null ? null : c.takeHeldBack();
        if (confirmation == null) {
            return null;
        }
        Capabilities caps = capabilities().getNow(null);
        int id = Waiter.find(confirmation, "ID");
        if (caps != null && caps.has("release-collects") && id >= 0) {
            return sendCollecting(c, confirmation, command, confirmation.get(id + 1));
        }
        List<CompletableFuture<Object>> both = transport.sendBoth(confirmation, command);
        settleRidden(c, confirmation, both.get(0));
        CompletableFuture<Object> out = new CompletableFuture<>();
        both.get(1).whenComplete((r, e) -> {
            if (e == null) {
                out.complete(r);
            } else if (Wire.isTransient(e)) {
                wire.sendRetrying(command).whenComplete((r2, e2) -> {
                    if (e2 == null) {
                        out.complete(r2);
                    } else {
                        out.completeExceptionally(Wire.unwrap(e2));
                    }
                });
            } else {
                out.completeExceptionally(Wire.unwrap(e));
            }
        });
        return out;
    }

    /**
     * Sends `command` (a lock's release) with `COLLECT grant` in place of `c`'s held-back
     * confirmation `confirmation` (design.md 5): the server collects the grant and
     * releases in one command, so the handoff runs no confirmation at all. Its reply
     * settles `c` as the confirmation's would. `TAKENBACK`: the release changed nothing
     * and `c` is lost; `command` then goes as usual and finds the hold gone. Another
     * failure leaves the grant open: the confirmation goes alone (its answer decides), and
     * the failure is the caller's, as the release's own. The retries are the usual ones:
     * the release's `ID` replays it, and collecting again is answered as a confirmation.
     */
    private CompletableFuture<Object> sendCollecting(Confirm c, List<String> confirmation, List<String> command,
                                                     String grant) {
        List<String> collecting = new ArrayList<>(command.size() + 2);
        collecting.addAll(command);
        collecting.add("COLLECT");
        collecting.add(grant);
        CompletableFuture<Object> out = new CompletableFuture<>();
        wire.sendRetrying(collecting).whenComplete((r, e) -> {
            Throwable x = e == null ? null : Wire.unwrap(e);
            Confirm.Outcome o = Confirm.of(x);
            if (o == Confirm.Outcome.IN_DOUBT) {
                confirm(c, confirmation);
                out.completeExceptionally(x);
                return;
            }
            c.settle(o);
            if (o == Confirm.Outcome.CONFIRMED) {
                out.complete(r);
                return;
            }
            wire.sendRetrying(command).whenComplete((r2, e2) -> {
                if (e2 == null) {
                    out.complete(r2);
                } else {
                    out.completeExceptionally(Wire.unwrap(e2));
                }
            });
        });
        return out;
    }

    /**
     * Settles `c` from the reply of its confirmation `args`, sent in a batch with a release:
     * where the batch may not have run it (a transient failure, a refused connection, a
     * batch not sent, or one in doubt) the confirmation is sent again alone, with its usual
     * retries (the same command and request id: the server replays it if it ran).
     */
    private void settleRidden(Confirm c, List<String> args, CompletableFuture<Object> reply) {
        reply.whenComplete((r, e) -> {
            Throwable x = e == null ? null : Wire.unwrap(e);
            if (x != null && (Wire.isTransient(x) || Wire.refusedConnection(x)
                    || x instanceof Transport.NotSent || x instanceof RlockOutcomeUnknownException)) {
                confirm(c, args);
            } else {
                c.settle(Confirm.of(e));
            }
        });
    }

    /** {@link #heldReply}'s answer when the grant's reply cannot be read from its message. */
    static final Object COLLECT = new Object();

    /**
     * The reply of acquire `args` read from its `granted` message's `detail`
     * (spec/vectors/tickets.json, `holds`; the module writes it): nil for the lock and the
     * RW lock, `[nil, token]` for the fenced lock, a permit id for the expirable semaphore
     * (a list of them with `PERMITS n`), 1 for the plain semaphore (an empty detail);
     * {@link #COLLECT} for any other command, and for a
     * detail that is missing (an older module) or unreadable.
     */
    static Object heldReply(List<String> args, String detail) {
        switch (args.get(0).toUpperCase(Locale.ROOT)) {
            case "RLOCK.ACQUIRE", "RRWLOCK.ACQUIRE" -> {
                return null;
            }
            case "RFENCED.ACQUIRE" -> {
                if (detail.isEmpty() || detail.length() > 19 || !allIn(detail, "0123456789")) {
                    return COLLECT;
                }
                try {
                    return java.util.Arrays.asList(null, Long.parseLong(detail));
                } catch (NumberFormatException tooLarge) {
                    return COLLECT;
                }
            }
            case "RPSEMAPHORE.ACQUIRE" -> {
                boolean many = false;
                for (int i = 3; i < args.size() && !args.get(i).equalsIgnoreCase("WAIT"); i++) {
                    many |= args.get(i).equalsIgnoreCase("PERMITS");
                }
                List<String> ids = List.of(detail.split(",", -1));
                for (String id : ids) {
                    if (id.isEmpty() || id.length() % 2 != 0 || !allIn(id, "0123456789abcdefABCDEF")) {
                        return COLLECT;
                    }
                }
                return many ? ids : ids.size() == 1 ? ids.get(0) : COLLECT;
            }
            case "RSEMAPHORE.ACQUIRE" -> {
                // Its reply is always 1 and the module writes no detail for it.
                return detail.isEmpty() ? (Object) 1L : COLLECT;
            }
            default -> {
                return COLLECT;
            }
        }
    }

    private static boolean allIn(String s, String chars) {
        for (int i = 0; i < s.length(); i++) {
            if (chars.indexOf(s.charAt(i)) < 0) {
                return false;
            }
        }
        return true;
    }

    /** What a waiter does with a ticket message (spec/vectors/tickets.json, `then`). */
    enum Action { GRANTED, COLLECT, FAIL }

    /**
     * A ticket message `<kind>:<id-len>:<owner-len>:<id><owner><detail>`, its lengths in
     * bytes of the UTF-8 text (the module's): read on the bytes, not on UTF-16 units.
     */
    record Note(String kind, String id, String owner, String detail) {
        static Note parse(String m) {
            // The usual message is ASCII (ids and owners the clients make): its byte offsets
            // are its char offsets, so it is read in place, allocating only what it names.
            for (int i = 0; i < m.length(); i++) {
                if (m.charAt(i) >= 0x80) {
                    return parseBytes(m);
                }
            }
            int c1 = m.indexOf(':'), c2 = c1 < 0 ? -1 : m.indexOf(':', c1 + 1), c3 = c2 < 0 ? -1 : m.indexOf(':', c2 + 1);
            if (c3 < 0) {
                return null;
            }
            long idLen = length(m, c1 + 1, c2), ownerLen = length(m, c2 + 1, c3);
            int rest = c3 + 1;
            if (idLen < 0 || ownerLen < 0 || m.length() - rest < idLen + ownerLen) {
                return null;
            }
            int ownerAt = rest + (int) idLen, detailAt = ownerAt + (int) ownerLen;
            return new Note(kindOf(m, c1), m.substring(rest, ownerAt), m.substring(ownerAt, detailAt),
                    detailAt == m.length() ? "" : m.substring(detailAt));
        }

        private static String kindOf(String m, int c1) {
            for (String k : KINDS) {
                if (k.length() == c1 && m.startsWith(k)) {
                    return k;
                }
            }
            return m.substring(0, c1);
        }

        private static final String[] KINDS = {"granted", "timeout", "error"};

        private static long length(String m, int from, int to) {
            if (to - from < 1 || to - from > 10) {
                return -1;
            }
            long n = 0;
            for (int i = from; i < to; i++) {
                char ch = m.charAt(i);
                if (ch < '0' || ch > '9') {
                    return -1;
                }
                n = n * 10 + (ch - '0');
            }
            return n;
        }

        /** Any message: read on its UTF-8 bytes, as the module counts its lengths. */
        static Note parseBytes(String m) {
            byte[] b = m.getBytes(StandardCharsets.UTF_8);
            int c1 = indexOf(b, 0), c2 = indexOf(b, c1 + 1), c3 = indexOf(b, c2 + 1);
            if (c1 < 0 || c2 < 0 || c3 < 0) {
                return null;
            }
            long idLen = length(b, c1 + 1, c2), ownerLen = length(b, c2 + 1, c3);
            int rest = c3 + 1;
            if (idLen < 0 || ownerLen < 0 || b.length - rest < idLen + ownerLen) {
                return null;
            }
            int ownerAt = rest + (int) idLen, detailAt = ownerAt + (int) ownerLen;
            return new Note(text(b, 0, c1), text(b, rest, ownerAt), text(b, ownerAt, detailAt),
                    text(b, detailAt, b.length));
        }

        /** The kind word alone decides; a detail after `granted` or `timeout` is ignored. */
        Action action() {
            return switch (kind) {
                case "granted" -> Action.GRANTED;
                case "error" -> Action.FAIL;
                default -> Action.COLLECT;
            };
        }

        private static int indexOf(byte[] b, int from) {
            for (int i = from; i < b.length; i++) {
                if (b[i] == ':') {
                    return i;
                }
            }
            return -1;
        }

        /** 1 to 10 ASCII digits, as the module writes them; -1 for anything else. */
        private static long length(byte[] b, int from, int to) {
            if (to - from < 1 || to - from > 10) {
                return -1;
            }
            long n = 0;
            for (int i = from; i < to; i++) {
                if (b[i] < '0' || b[i] > '9') {
                    return -1;
                }
                n = n * 10 + (b[i] - '0');
            }
            return n;
        }

        private static String text(byte[] b, int from, int to) {
            return new String(b, from, to - from, StandardCharsets.UTF_8);
        }
    }

    /**
     * A timed wait's deadline, on the client's clock: its ticket known gone (its `timeout`
     * message came first), the wait ends now; otherwise the caller is told no now and the
     * waiter stays registered as an orphan until its ticket's fate is known (its message,
     * or the late look): a grant that comes after all, or whose collect is in flight, is
     * given back by {@link #finish} (the result taken already). A wait on a blocked
     * connection ends with that connection's reply.
     */
    private void expire(Waiter w) {
        if (w.blocked || w.finished) {
            return;
        }
        if (w.gone) {
            finish(w, ranOut(w.args), null);
        } else {
            w.result.complete(ranOut(w.args));
        }
    }

    private void finish(Waiter w, Object reply, Throwable e) {
        synchronized (w) {
            if (w.finished) {
                return;
            }
            w.finished = true;
        }
        boolean registered = waiters.remove(w.id, w);
        // The waiting thread first: leaving the channel after may write an UNSUBSCRIBE (the
        // key's channel's last waiter, or the idle channel it evicts), which is no part of
        // the holder's path.
        boolean delivered = e == null ? w.result.complete(reply) : w.result.completeExceptionally(Wire.unwrap(e));
        if (registered) {
            leave(w);
        }
        if (!delivered && e == null) {
            // Nobody takes this reply any more (the wait was cancelled): give back what it
            // granted. A grant held on its message is given back once its confirmation has
            // answered, and not at all if the server took it back: a plain semaphore's
            // release would otherwise add permits on top of the server's own give-back.
            List<List<String>> undo = w.undo.apply(reply);
            Confirm c = w.confirm;
            if (c != null && c.held()) {
                c.outcome().thenAccept(o -> {
                    if (o != Confirm.Outcome.TAKEN_BACK) {
                        undo.forEach(wire::sendRetrying);
                    }
                });
            } else {
                undo.forEach(wire::sendRetrying);
            }
        }
    }

    // ---- the notification connection ----------------------------------------------------

    private CompletableFuture<Void> join(Waiter w) {
        synchronized (this) {
            Sub s = subs.get(w.channel);
            if (s == null) {
                s = new Sub(w.channel, w.notify != null && !transport.cluster(), transport.nodeOf(w.channel));
                subs.put(w.channel, s);
            }
            w.sub = s;
            if (s.refs++ == 0) {
                if (s.ready != null) {
                    // Idle: still subscribed on the notification connection as it is now (a
                    // reconnect forgets the idle ones), so no SUBSCRIBE and no grant missed.
                    unidle(s);
                    return s.ready;
                }
                // Subscribed before the ticket is sent, so its message cannot be missed.
                Sub sub = s;
                s.ready = transport.subscribe(w.channel);
                s.ready.whenComplete((ok, e) -> {
                    if (e != null) {
                        forget(sub.channel, sub); // the next waiter subscribes again
                    }
                });
            }
            return s.ready;
        }
    }

    private synchronized void forget(String channel, Sub s) {
        if (subs.remove(channel, s)) {
            unidle(s);
        }
    }

    /**
     * A waiter left its channel. The last one leaves a tagged channel on a single server
     * subscribed, idle (a process waiting on one lock at a time would otherwise send
     * SUBSCRIBE and UNSUBSCRIBE per ticket), up to {@link #MAX_IDLE_CHANNELS}; the key's
     * channel and a cluster node's are left.
     */
    private void leave(Waiter w) {
        synchronized (this) {
            Sub s = w.sub;
            w.sub = null;
            if (s == null || --s.refs != 0 || subs.get(s.channel) != s) {
                return;
            }
            if (!s.tagged) {
                subs.remove(s.channel);
                transport.unsubscribe(s.channel);
                return;
            }
            LinkedHashMap<String, Sub> on = idle.computeIfAbsent(s.node, n -> new LinkedHashMap<>());
            on.put(s.channel, s);
            if (on.size() > MAX_IDLE_CHANNELS) {
                Iterator<Sub> oldest = on.values().iterator();
                Sub o = oldest.next();
                oldest.remove();
                subs.remove(o.channel, o);
                transport.unsubscribe(o.channel);
            }
        }
    }

    /** `s` is no longer idle (a waiter came, or it is forgotten). Guarded by `this`. */
    private void unidle(Sub s) {
        LinkedHashMap<String, Sub> on = idle.get(s.node);
        if (on != null && on.remove(s.channel, s) && on.isEmpty()) {
            idle.remove(s.node);
        }
    }

    /**
     * A connection came back: the idle channels are unsubscribed and forgotten (Lettuce
     * subscribes its channels again by itself, before this runs), so that the next waiter
     * on one subscribes afresh and knows the subscription live; only waiters' channels stay.
     */
    private synchronized void forgetIdle() {
        for (LinkedHashMap<String, Sub> on : idle.values()) {
            for (Sub s : on.values()) {
                if (subs.remove(s.channel, s)) {
                    transport.unsubscribe(s.channel);
                }
            }
        }
        idle.clear();
    }

    /** Whether `channel` stays subscribed with no waiter (tests). */
    synchronized boolean idle(String channel) {
        Sub s = subs.get(channel);
        LinkedHashMap<String, Sub> on = s == null ? null : idle.get(s.node);
        return on != null && on.get(channel) == s;
    }

    /** How many channels stay subscribed with no waiter (tests). */
    synchronized int idleChannels() {
        int n = 0;
        for (LinkedHashMap<String, Sub> on : idle.values()) {
            n += on.size();
        }
        return n;
    }

    /**
     * Every waiter's command again (after a reconnect), on what the new probe says (`caps`,
     * null when it failed): a waiter whose server now answers otherwise about
     * `ticket-notify` (a failover to another module version) moves to the other channel,
     * subscribed before it queues again.
     */
    private void resendAll(Capabilities caps) {
        String want = caps == null || !caps.tickets() ? null : caps.has("ticket-notify") ? tag : null;
        for (Waiter w : waiters.values()) {
            if (w.finished || w.gone) {
                continue; // a ticket known gone: nothing to send again
            }
            w.resent = true;
            if (caps != null && !java.util.Objects.equals(want, w.notify)) {
                leave(w);
                w.notifyOn(want);
                joinAndSend(w);
            } else {
                send(w, w.ticketed());
            }
        }
    }

    // ---- the fallback: a blocked connection per waiter ---------------------------------

    private void blockingWait(Waiter w) {
        w.blocked = true;
        if (waitMode == RlockOptions.WaitMode.TICKETS) {
            w.result.completeExceptionally(new IllegalStateException(
                    "the server queues no tickets; use WaitMode.AUTO or BLOCKING"));
            return;
        }
        stats.waits.increment();
        CompletableFuture.runAsync(() -> {
            if (w.result.isDone()) {
                return;
            }
            Transport.Dedicated c;
            try {
                c = transport.dedicated();
            } catch (RuntimeException e) {
                w.result.completeExceptionally(e);
                return;
            }
            // Closing the connection removes the waiter from the server's queue, or makes
            // the server take back a lock it had just handed over: a cancelled wait leaves
            // nothing behind.
            w.result.whenComplete((v, e) -> c.close());
            c.send(w.blocking()).whenComplete((reply, e) -> {
                if (e != null) {
                    w.result.completeExceptionally(Wire.unwrap(e));
                } else if (!w.result.complete(reply)) {
                    for (List<String> cmd : w.undo.apply(reply)) {
                        wire.sendRetrying(cmd);
                    }
                }
            });
        }, executor);
    }

    /** How many waiters this client has registered (tests: nothing left behind). */
    int registered() {
        return waiters.size();
    }
}
