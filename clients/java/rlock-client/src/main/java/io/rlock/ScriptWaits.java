// Waiting without the module (clients/java, internal; docs/scripts-mode.md): Redisson's way.
// A waiting call subscribes the primitive's Redisson channel on the client's one
// notification connection (the Transport's, shared by every wait of the client), tries the
// script, and until the wait ends sleeps until a message on the channel or the holder's
// lease end (the PTTL the try answered, or the first permit's expiry), whichever comes
// first, then tries again: no polling loop, no thread blocked (a timer and a callback).
// As Redisson's LockPubSub: a lock's unlock message (`0`) wakes one waiter of the client,
// the one asleep longest, and is kept for the next waiter to sleep if none is asleep;
// every other message wakes them all. The Python client's _pubsub.py is the reference.
package io.rlock;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;

final class ScriptWaits {
    /**
     * A waiter behind a lease looks again this long after the PTTL its try answered, so
     * that the key has expired by then (the server counts whole milliseconds).
     */
    static final long LEASE_END_MARGIN_MS = 2;

    private final Transport transport;
    private final Scripts scripts;
    private final Wire wire;
    private final ScheduledExecutorService scheduler;
    private final Executor executor;
    private final RlockStats stats;
    /** Channels subscribed while someone waits on them. Guarded by `this`. */
    private final Map<String, Chan> chans = new HashMap<>();

    private static final class Chan {
        int refs;
        CompletableFuture<Void> ready;
        /** Messages heard and reconnects seen: a waiter that tried before one tries again. */
        long events;
        /** Wake-one messages no waiter was asleep to take (at most refs). */
        int permits;
        /** Asleep waiters, oldest first. */
        final ArrayDeque<Waiter> asleep = new ArrayDeque<>();
    }

    private final class Waiter {
        final List<String> args;
        final String cmd;
        final String channel;
        final long deadline;
        final Function<Object, List<List<String>>> undo;
        final CompletableFuture<Object> result = new CompletableFuture<>();
        Chan chan;
        long seen;
        boolean counted;
        ScheduledFuture<?> timer;

        Waiter(List<String> waiting, Function<Object, List<List<String>>> undo) {
            int w = -1;
            for (int i = waiting.size() - 2; i >= 2; i--) {
                if (waiting.get(i).equalsIgnoreCase("WAIT")) {
                    w = i;
                    break;
                }
            }
            if (w < 0) {
                throw new IllegalArgumentException("not a waiting command: " + waiting);
            }
            long waitMs = Long.parseLong(waiting.get(w + 1));
            List<String> a = new ArrayList<>(waiting);
            a.remove(w + 1);
            a.remove(w);
            this.args = a;
            this.cmd = a.get(0).toUpperCase(Locale.ROOT);
            this.channel = Scripts.channelOf(a);
            this.deadline = waitMs == 0 ? 0 : System.nanoTime() + waitMs * 1_000_000;
            this.undo = undo;
        }

        /** The wait left in ms: Long.MAX_VALUE without a limit, <= 0 when over. */
        long left() {
            return deadline == 0 ? Long.MAX_VALUE : (deadline - System.nanoTime()) / 1_000_000;
        }
    }

    ScriptWaits(Transport transport, Scripts scripts, Wire wire, ScheduledExecutorService scheduler, Executor executor,
                RlockStats stats) {
        this.transport = transport;
        this.scripts = scripts;
        this.wire = wire;
        this.scheduler = scheduler;
        this.executor = executor;
        this.stats = stats;
        // A message published while the notification connection was away is lost: every
        // waiter tries again (the driver subscribes its channels again itself).
        transport.onReconnect(this::wakeAll);
        // On a cluster, a shard channel whose slot left its node is dropped by the server:
        // subscribed again on the new owner, and its waiters try again meanwhile.
        transport.onChannelDropped(this::dropped);
    }

    private void dropped(String channel) {
        synchronized (this) {
            Chan c = chans.get(channel);
            if (c == null) {
                return;
            }
            CompletableFuture<Void> again = transport.relearn().handle((v, e) -> null)
                    .thenCompose(v -> transport.subscribe(channel));
            c.ready = again;
        }
        wake(channel);
    }

    private void wake(String channel) {
        List<Waiter> wake = new ArrayList<>();
        synchronized (this) {
            Chan c = chans.get(channel);
            if (c == null) {
                return;
            }
            takeAsleep(c, wake);
        }
        attemptAll(wake);
    }

    /** Under the lock: the channel's sleepers, their timers cancelled; counted as an event. */
    private void takeAsleep(Chan c, List<Waiter> into) {
        c.events++;
        c.asleep.forEach(this::cancelTimer);
        into.addAll(c.asleep);
        c.asleep.clear();
    }

    private void attemptAll(List<Waiter> wake) {
        for (Waiter w : wake) {
            executor.execute(() -> attempt(w));
        }
    }

    /**
     * Waits for a module command carrying `WAIT t`: completes with the module's reply to it.
     * Cancelling the future leaves nothing behind: a grant that comes after all is given
     * back with the commands `undo` makes from its reply.
     */
    CompletableFuture<Object> await(List<String> args, Function<Object, List<List<String>>> undo) {
        Waiter w = new Waiter(args, undo);
        CompletableFuture<Void> ready;
        synchronized (this) {
            Chan c = chans.computeIfAbsent(w.channel, k -> new Chan());
            if (c.refs++ == 0) {
                // Subscribed before the first try, so no release after it is missed.
                c.ready = transport.subscribe(w.channel);
            }
            w.chan = c;
            ready = c.ready;
        }
        w.result.whenComplete((v, e) -> leave(w));
        ready.whenComplete((ok, e) -> {
            if (e != null) {
                w.result.completeExceptionally(Wire.unwrap(e));
            } else {
                attempt(w);
            }
        });
        return w.result;
    }

    private void attempt(Waiter w) {
        if (w.result.isDone()) {
            return;
        }
        synchronized (this) {
            w.seen = w.chan.events;
        }
        scripts.command(w.args).whenComplete((o, e) -> {
            if (e != null) {
                w.result.completeExceptionally(Wire.unwrap(e));
            } else if (Scripts.granted(w.cmd, o.reply())) {
                if (!w.result.complete(o.reply())) {
                    // Cancelled meanwhile: nobody takes this grant; give it back.
                    for (List<String> c : w.undo.apply(o.reply())) {
                        wire.sendRetrying(c);
                    }
                }
            } else {
                long left = w.left();
                if (left <= 0) {
                    w.result.complete(o.reply());
                    return;
                }
                long sleep = left;
                Long hint = o.hint();
                if (hint != null && hint >= 0) { // -1: a key without a lease, woken by a message only
                    sleep = Math.min(sleep, hint + LEASE_END_MARGIN_MS);
                }
                sleep(w, sleep);
            }
        });
    }

    private void sleep(Waiter w, long ms) {
        boolean again = false;
        synchronized (this) {
            if (w.result.isDone()) {
                return;
            }
            Chan c = w.chan;
            if (c.events != w.seen) {
                again = true; // a message came while it tried
            } else if (c.permits > 0) {
                c.permits--; // an unlock message no one was asleep for
                again = true;
            } else {
                c.asleep.add(w);
                if (ms != Long.MAX_VALUE) {
                    w.timer = scheduler.schedule(() -> timeUp(w), ms, TimeUnit.MILLISECONDS);
                }
                if (!w.counted) {
                    w.counted = true;
                    stats.waits.increment();
                }
            }
        }
        if (again) {
            executor.execute(() -> attempt(w));
        }
    }

    private void timeUp(Waiter w) {
        synchronized (this) {
            if (!w.chan.asleep.remove(w)) {
                return; // a message woke it first
            }
            w.timer = null;
        }
        attempt(w);
    }

    /** The chanel's wake-one messages: Redisson's unlock message of the lock and read lock. */
    static boolean wakesOne(String channel, String message) {
        return "0".equals(message)
                && (channel.startsWith("redisson_lock__channel:") || channel.startsWith("redisson_rwlock:"));
    }

    /** A message on a channel (from the notification connection's listener). */
    void onMessage(String channel, String message) {
        List<Waiter> wake = new ArrayList<>();
        synchronized (this) {
            Chan c = chans.get(channel);
            if (c == null) {
                return;
            }
            if (wakesOne(channel, message)) {
                Waiter w = c.asleep.poll();
                if (w != null) {
                    wake.add(w);
                } else {
                    c.permits = Math.min(c.permits + 1, c.refs);
                }
            } else {
                c.events++;
                wake.addAll(c.asleep);
                c.asleep.clear();
            }
            for (Waiter w : wake) {
                cancelTimer(w);
            }
        }
        for (Waiter w : wake) {
            executor.execute(() -> attempt(w));
        }
    }

    private void wakeAll() {
        List<Waiter> wake = new ArrayList<>();
        synchronized (this) {
            for (Chan c : chans.values()) {
                takeAsleep(c, wake);
            }
        }
        attemptAll(wake);
    }

    private void cancelTimer(Waiter w) {
        if (w.timer != null) {
            w.timer.cancel(false);
            w.timer = null;
        }
    }

    private void leave(Waiter w) {
        Waiter next = null;
        synchronized (this) {
            Chan c = w.chan;
            c.asleep.remove(w);
            cancelTimer(w);
            if (--c.refs == 0) {
                chans.remove(w.channel);
                transport.unsubscribe(w.channel);
                return;
            }
            // A wake-one message this waiter did not take goes on to the next asleep waiter.
            c.permits = Math.min(c.permits, c.refs);
            if (c.permits > 0 && !c.asleep.isEmpty()) {
                c.permits--;
                next = c.asleep.poll();
                cancelTimer(next);
            }
        }
        if (next != null) {
            Waiter n = next;
            executor.execute(() -> attempt(n));
        }
    }

    /** How many waits sleep until a message or a lease end. */
    synchronized int asleep() {
        int n = 0;
        for (Chan c : chans.values()) {
            n += c.asleep.size();
        }
        return n;
    }

    /** How many waits are under way (tests: nothing left behind). */
    synchronized int waiting() {
        int n = 0;
        for (Chan c : chans.values()) {
            n += c.refs;
        }
        return n;
    }
}
