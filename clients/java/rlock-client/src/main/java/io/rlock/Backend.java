// Module or scripts (clients/java, internal; docs/scripts-mode.md): which backend serves a
// client's module commands. The primitives speak the module's commands through Wire and
// Waits; those hand every such command here, and this sends it to the server as is
// (module) or does it with Redisson's scripts (Scripts, ScriptWaits) where the module is
// absent. The mode (RlockOptions.Mode) is AUTO by default: the capability probe
// (RLOCK.HELLO, an unknown command meaning no module) is asked once per connection, and
// again after a reconnect (a failover may reach another server) or when a module command
// comes back unknown. The Python client's _mode.py is the reference.
package io.rlock;

import java.util.List;
import java.util.Locale;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.ScheduledExecutorService;
import java.util.function.Consumer;
import java.util.function.Function;
import java.util.function.Predicate;

final class Backend {
    /** The module's command families: what is routed (the probe itself is not). */
    private static final List<String> FAMILIES =
            List.of("RLOCK.", "RFENCED.", "RRWLOCK.", "RSEMAPHORE.", "RPSEMAPHORE.", "RLATCH.");

    private final RlockOptions.Mode setting;
    private final Wire wire;
    private final Waits waits;
    private final Scripts scripts;
    private final ScriptWaits scriptWaits;
    /** True: scripts; false: the module; null: ask at the next module command (AUTO). */
    private volatile CompletableFuture<Boolean> found;
    private final Transport transport;
    /** On a cluster in scripts mode: whether it has sharded pub/sub, asked once (null: not yet). */
    private volatile CompletableFuture<Void> sharded;

    private Backend(RlockOptions.Mode setting, Transport transport, Wire wire, Waits waits, Scripts scripts,
                    ScriptWaits scriptWaits) {
        this.setting = setting;
        this.transport = transport;
        this.wire = wire;
        this.waits = waits;
        this.scripts = scripts;
        this.scriptWaits = scriptWaits;
    }

    /** Makes the client's backend and puts it between the primitives and the server. */
    static Backend install(Transport transport, Wire wire, Waits waits, ScheduledExecutorService scheduler,
                           Executor executor, RlockOptions options, RlockStats stats) {
        Scripts scripts = new Scripts(wire, options.watchdogTimeout().toMillis());
        ScriptWaits sw = new ScriptWaits(transport, scripts, wire, scheduler, executor, stats);
        Backend b = new Backend(options.mode(), transport, wire, waits, scripts, sw);
        transport.onReconnect(b::forget);
        wire.route(b);
        waits.route(b);
        return b;
    }

    static boolean isModuleCommand(List<String> args) {
        String cmd = args.get(0).toUpperCase(Locale.ROOT);
        if (cmd.equals("RLOCK.HELLO")) {
            return false;
        }
        for (String f : FAMILIES) {
            if (cmd.startsWith(f)) {
                return true;
            }
        }
        return false;
    }

    /** Ask again at the next module command (AUTO only). */
    void forget() {
        found = null;
    }

    /** Whether module commands go through Redisson's scripts (asked once, see above). */
    CompletableFuture<Boolean> scripts() {
        if (setting != RlockOptions.Mode.AUTO) {
            return CompletableFuture.completedFuture(setting == RlockOptions.Mode.SCRIPTS);
        }
        CompletableFuture<Boolean> f = found;
        if (f != null) {
            return f;
        }
        synchronized (this) {
            if (found == null) {
                CompletableFuture<Boolean> asked = waits.capabilities().handle((caps, e) -> e == null
                        ? CompletableFuture.completedFuture(!caps.module())
                        // The user may not run RLOCK.HELLO (an ACL that predates it): ask with
                        // a module command that changes nothing without its arguments.
                        : wire.retrying(List.of("RLOCK.ACQUIRE")).handle((v, x) -> x != null && noSuchCommand(x)))
                        .thenCompose(Function.identity());
                found = asked;
                asked.whenComplete((s, e) -> {
                    if (e != null) {
                        synchronized (this) {
                            if (found == asked) {
                                found = null; // a failed probe is asked again by the next caller
                            }
                        }
                    }
                });
            }
            return found;
        }
    }

    /**
     * Scripts mode's readiness for `key`: on a cluster, whether it has sharded pub/sub,
     * asked once of the key's node (Redisson's choice: its scripts then SPUBLISH, and
     * waiters SSUBSCRIBE on the key's node; else PUBLISH and SUBSCRIBE). Off a cluster,
     * nothing to ask. SPUBLISH without arguments changes nothing: a wrong number of
     * arguments means it is there.
     */
    private CompletableFuture<Void> shardedKnown(String key) {
        if (!transport.cluster()) {
            return CompletableFuture.completedFuture(null);
        }
        CompletableFuture<Void> f = sharded;
        if (f != null) {
            return f;
        }
        synchronized (this) {
            if (sharded == null) {
                CompletableFuture<Void> asked = transport.sendTo(key, List.of("SPUBLISH"))
                        .handle((v, e) -> {
                            if (e != null && Wire.serverError(e) == null) {
                                throw new java.util.concurrent.CompletionException(Wire.unwrap(e)); // not an answer: ask again
                            }
                            return e == null || !noSuchCommand(e);
                        })
                        .thenAccept(has -> {
                            transport.shardedPubSub(has);
                            scripts.publishWith(has ? "spublish" : "publish");
                        });
                sharded = asked;
                asked.whenComplete((v, e) -> {
                    if (e != null) {
                        synchronized (this) {
                            if (sharded == asked) {
                                sharded = null;
                            }
                        }
                    }
                });
            }
            return sharded;
        }
    }

    private CompletableFuture<Object> viaScripts(List<String> args) {
        return shardedKnown(args.get(1)).thenCompose(x -> scripts.command(args)).thenApply(Scripts.Outcome::reply);
    }

    /** The server has no such command, or this user may not run it: the module cannot be used. */
    static boolean noSuchCommand(Throwable e) {
        String m = Wire.serverError(e);
        return m != null && (m.toLowerCase(Locale.ROOT).startsWith("err unknown command") || m.startsWith("NOPERM"));
    }

    /** A module command, answered as the module would (retries of transient failures included). */
    CompletableFuture<Object> send(List<String> args) {
        return scripts().thenCompose(s -> s ? viaScripts(args) : module(args, true));
    }

    private CompletableFuture<Object> module(List<String> args, boolean again) {
        return wire.retrying(args).exceptionallyCompose(e -> {
            if (again && setting == RlockOptions.Mode.AUTO && noSuchCommand(e)) {
                // The module went (a failover to a server without it): ask again, once.
                forget();
                waits.forgetCapabilities();
                return scripts().thenCompose(s -> s ? viaScripts(args) : module(args, false));
            }
            return CompletableFuture.failedFuture(Wire.unwrap(e));
        });
    }

    /** A waiting module command (`WAIT t`): the module's tickets or Redisson's way. */
    CompletableFuture<Object> await(List<String> args, Function<Object, List<List<String>>> undo) {
        return await(args, undo, null);
    }

    /** {@link #await(List, Function)} with a lock's Confirm (Waits: held on the grant message in module mode). */
    CompletableFuture<Object> await(List<String> args, Function<Object, List<List<String>>> undo, Waits.Confirm confirm) {
        return await(args, undo, confirm, null, null);
    }

    /**
     * {@link #await(List, Function, Waits.Confirm)} for a handle's waiting acquire: in module
     * mode, as {@link Contention#start} says from `seen` (null: queued at once, as the
     * latch); `satisfied` tells a grant. Scripts-mode waits ask first anyway (Redisson's way).
     */
    CompletableFuture<Object> await(List<String> args, Function<Object, List<List<String>>> undo, Waits.Confirm confirm,
                                    Contention seen, Predicate<Object> satisfied) {
        CompletableFuture<Boolean> mode = scripts();
        if (mode.isDone() && !mode.isCompletedExceptionally()) {
            return route(mode.join(), args, undo, confirm, seen, satisfied);
        }
        CompletableFuture<Object> out = new CompletableFuture<>();
        mode.whenComplete((s, e) -> {
            if (e != null) {
                out.completeExceptionally(Wire.unwrap(e));
                return;
            }
            CompletableFuture<Object> inner = route(s, args, undo, confirm, seen, satisfied);
            out.whenComplete((v, x) -> {
                if (out.isCancelled()) {
                    inner.cancel(true);
                }
            });
            inner.whenComplete((v, x) -> {
                if (x != null) {
                    out.completeExceptionally(Wire.unwrap(x));
                } else if (!out.complete(v)) {
                    undo.apply(v).forEach(wire::sendRetrying);
                }
            });
        });
        return out;
    }

    private CompletableFuture<Object> route(boolean scriptsMode, List<String> args,
                                            Function<Object, List<List<String>>> undo, Waits.Confirm confirm,
                                            Contention seen, Predicate<Object> satisfied) {
        if (!scriptsMode && seen == null) {
            return waits.awaitModule(args, undo, confirm);
        }
        if (!scriptsMode) {
            // The try carries the wait's request id: a try that found it held changed
            // nothing (the server records no reply for it), so the wait reuses the id.
            Consumer<Object> giveBack = r -> undo.apply(r).forEach(wire::sendRetrying);
            long waitMs = Long.parseLong(args.get(Waits.Waiter.find(args, "WAIT") + 1));
            return Contention.start(seen, waitMs, System::nanoTime,
                    () -> wire.sendRetrying(Contention.withoutWait(args)), satisfied, giveBack,
                    left -> waits.awaitModuleWaited(Contention.withWait(args, left), undo, confirm));
        }
        CompletableFuture<Void> ready = shardedKnown(args.get(1));
        if (ready.isDone() && !ready.isCompletedExceptionally()) {
            return scriptWaits.await(args, undo);
        }
        // The first wait on a cluster: asked first, then waited (a cancel reaches the wait).
        CompletableFuture<Object> out = new CompletableFuture<>();
        ready.whenComplete((x, e) -> {
            if (e != null) {
                out.completeExceptionally(Wire.unwrap(e));
                return;
            }
            CompletableFuture<Object> inner = scriptWaits.await(args, undo);
            out.whenComplete((v, y) -> {
                if (out.isCancelled()) {
                    inner.cancel(true);
                }
            });
            inner.whenComplete((v, y) -> {
                if (y != null) {
                    out.completeExceptionally(Wire.unwrap(y));
                } else {
                    out.complete(v);
                }
            });
        });
        return out;
    }

    /** A message on a channel that is not a ticket channel: Redisson's, for scripts-mode waits. */
    void onMessage(String channel, String message) {
        scriptWaits.onMessage(channel, message);
    }

    /** How many scripts-mode waits sleep until a message or a lease end. */
    int scriptsAsleep() {
        return scriptWaits.asleep();
    }

    /** How many scripts-mode waits are under way. */
    int scriptWaiting() {
        return scriptWaits.waiting();
    }
}
