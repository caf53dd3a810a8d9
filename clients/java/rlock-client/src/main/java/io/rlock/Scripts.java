// Scripts mode (clients/java, internal; docs/scripts-mode.md): the module's commands done
// with Redisson's own Lua scripts, for servers where the module cannot be loaded (every
// managed Redis and Valkey). The primitives speak the module's commands; where the module
// is absent, Backend hands each one here, and this sends the script Redisson 4.7 sends
// (resources io/rlock/lua/*.lua, byte-identical copies of clients/python/rlock/lua: the
// same keys, KEYS/ARGV, channels and messages, so Redisson services, scripts-mode clients
// and module-loaded servers share names) and answers what the module would have answered.
// The Python client's _scripts.py is the reference; this is the same table in Java.
package io.rlock;

import io.lettuce.core.RedisCommandExecutionException;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Function;

final class Scripts {
    /** How long an unlock's reply is remembered for its retries (Redisson's unlock latch). */
    static final long UNLOCK_LATCH_MS = 10_000;
    /** RPermitExpirableSemaphore's score of a permit without a lease. */
    static final long NON_EXPIRABLE = 922337203685477L;
    /** Redisson's messages: LockPubSub's unlock (wake one) and read-unlock (wake all). */
    static final String UNLOCK_MESSAGE = "0";
    static final String READ_UNLOCK_MESSAGE = "1";
    /** CountDownLatchPubSub's: the count reached zero / a count was set or deleted. */
    static final String ZERO_COUNT_MESSAGE = "0";
    static final String NEW_COUNT_MESSAGE = "1";
    /** The module's texts for refusals scripts mode makes itself (src/vocab/errors.rs). */
    static final String ERR_RW_READ_HELD = "READHELD this owner holds the read lock: release the read lock first"
            + " (a writer waiting on its own read would wait forever)";
    static final String ERR_PERMITS = "BADPERMITS permits must be an integer from 0 to 2147483647";

    private static final Set<String> OPTIONS = Set.of("ID", "WAIT", "ASYNC", "PERMITS", "PX");
    private static final Map<String, Script> LOADED = new ConcurrentHashMap<>();
    private static final SecureRandom RANDOM = new SecureRandom();

    /** One Lua file: its text and SHA1 (what EVALSHA names). */
    record Script(String name, String text, String sha) {}

    /**
     * A module command's outcome: the module's reply and, for a try that did not get in,
     * how long until the holder's lease ends (ms; -1 no lease; null: not known), which a
     * waiter sleeps at most.
     */
    record Outcome(Object reply, Long hint) {
        static Outcome of(Object reply) {
            return new Outcome(reply, null);
        }
    }

    /**
     * Whether a script may be sent again after a failure that may have come after the
     * server received it (a broken connection, a timeout after the write). Without the
     * module no request id makes a re-run safe, so only a script whose second run after an
     * applied first run changes nothing and answers the same may: the others go out at
     * most once (Wire.atMostOnce), and such a failure fails the call with
     * RlockOutcomeUnknownException. A failure before the write is retried as before. The
     * same table in every client (docs/scripts-mode.md, "Retries"; Python's
     * _scripts.MAY_RETRY).
     */
    static final Map<String, Boolean> MAY_RETRY = Map.ofEntries(
            Map.entry("lock_acquire", false),          // HINCRBY: a second run is a second hold
            Map.entry("fenced_acquire", false),        // INCR of the token, HINCRBY
            Map.entry("fenced_acquire_token", false),
            Map.entry("read_acquire", false),          // HINCRBY
            Map.entry("write_acquire", false),
            Map.entry("lock_unlock", true),            // the unlock latch key (the release's request id)
            Map.entry("read_unlock", true),            //   answers a re-run what the first run answered
            Map.entry("write_unlock", true),
            Map.entry("lock_renew", true),             // PEXPIRE
            Map.entry("read_renew", true),
            Map.entry("lock_force_unlock", false),     // a re-run answers 0 where the first deleted
            Map.entry("read_force_unlock", false),
            Map.entry("write_force_unlock", false),
            Map.entry("semaphore_try_set", false),     // a re-run answers 0 where the first set
            Map.entry("semaphore_try_set_ttl", false),
            Map.entry("semaphore_add", false),         // INCRBY
            Map.entry("semaphore_release", false),     // INCRBY: permits beyond the count
            Map.entry("semaphore_release_if_exists", false),
            Map.entry("semaphore_try_acquire", false), // DECRBY
            Map.entry("semaphore_drain", false),       // a re-run answers 0: the drained count is lost
            Map.entry("pes_try_acquire", false),       // DECRBY + ZADD
            Map.entry("pes_add", false),               // INCRBY
            Map.entry("pes_release", false),           // a re-run answers 0 (not held) where the first released
            Map.entry("pes_release_many", false),
            Map.entry("pes_set_permits", true),        // sets to a target: a re-run finds it set
            Map.entry("pes_update_lease", true),       // ZADD of the same id's expiry
            Map.entry("pes_available", true),          // reads (reclaiming expired ids happens once)
            Map.entry("pes_get_permits", true),
            Map.entry("pes_acquired", true),
            Map.entry("pes_lease_time", true),
            Map.entry("latch_try_set", false),         // a re-run answers 0 where the first set
            Map.entry("latch_count_down", false),      // DECR: awaiters released early
            Map.entry("latch_delete", false));         // a re-run answers 0 where the first deleted

    private final Wire wire;
    /** The lease a reentrant release sets again (Redisson's internalLockLeaseTime). */
    private final long releaseLeaseMs;
    /**
     * The scripts' publish command, Redisson's choice: "spublish" on a cluster that has
     * sharded pub/sub (Backend asks a node once), else "publish".
     */
    private volatile String publish = "publish";

    Scripts(Wire wire, long releaseLeaseMs) {
        this.wire = wire;
        this.releaseLeaseMs = releaseLeaseMs;
    }

    /** Sets the scripts' publish command ("publish" or "spublish"). */
    void publishWith(String command) {
        this.publish = command;
    }

    String publish() {
        return publish;
    }

    static Script script(String name) {
        return LOADED.computeIfAbsent(name, n -> {
            try (InputStream in = Scripts.class.getResourceAsStream("lua/" + n + ".lua")) {
                if (in == null) {
                    throw new IllegalStateException("no script lua/" + n + ".lua in the rlock jar");
                }
                byte[] text = in.readAllBytes();
                byte[] sha = MessageDigest.getInstance("SHA-1").digest(text);
                return new Script(n, new String(text, StandardCharsets.UTF_8), HexFormat.of().formatHex(sha));
            } catch (IOException | NoSuchAlgorithmException e) {
                throw new IllegalStateException("cannot read lua/" + n + ".lua: " + e, e);
            }
        });
    }

    /** EVALSHA of the script `name`; on NOSCRIPT (a failover or SCRIPT FLUSH emptied the cache) EVAL, which caches it again. */
    CompletableFuture<Object> eval(String name, List<String> keys, List<String> argv) {
        Script s = script(name);
        List<String> tail = new ArrayList<>(keys.size() + argv.size() + 1);
        tail.add(Integer.toString(keys.size()));
        tail.addAll(keys);
        tail.addAll(argv);
        List<String> sha = new ArrayList<>(tail.size() + 2);
        sha.add("EVALSHA");
        sha.add(s.sha());
        sha.addAll(tail);
        Function<List<String>, CompletableFuture<Object>> send =
                MAY_RETRY.get(name) ? wire::retrying : wire::atMostOnce;
        return send.apply(sha).exceptionallyCompose(e -> {
            String m = Wire.serverError(e);
            if (m == null || !m.startsWith("NOSCRIPT")) {
                return CompletableFuture.failedFuture(Wire.unwrap(e));
            }
            List<String> text = new ArrayList<>(tail.size() + 2);
            text.add("EVAL");
            text.add(s.text());
            text.addAll(tail);
            return send.apply(text);
        });
    }

    /**
     * {@link #eval} with arguments that may be raw bytes (a permit id Redisson made):
     * those go out as bytes ({@link Transport#sendBytes}), the rest as UTF-8.
     */
    CompletableFuture<Object> evalRaw(String name, List<String> keys, List<Object> argv) {
        if (argv.stream().allMatch(a -> a instanceof String)) {
            return eval(name, keys, argv.stream().map(String.class::cast).toList());
        }
        Script s = script(name);
        List<byte[]> tail = new ArrayList<>(keys.size() + argv.size() + 1);
        tail.add(utf8(Integer.toString(keys.size())));
        keys.forEach(k -> tail.add(utf8(k)));
        argv.forEach(a -> tail.add(a instanceof byte[] b ? b : utf8((String) a)));
        List<byte[]> sha = new ArrayList<>(List.of(utf8("EVALSHA"), utf8(s.sha())));
        sha.addAll(tail);
        Function<List<byte[]>, CompletableFuture<Object>> send =
                MAY_RETRY.get(name) ? wire::retryingBytes : wire::atMostOnceBytes;
        return send.apply(sha).exceptionallyCompose(e -> {
            String m = Wire.serverError(e);
            if (m == null || !m.startsWith("NOSCRIPT")) {
                return CompletableFuture.failedFuture(Wire.unwrap(e));
            }
            List<byte[]> text = new ArrayList<>(List.of(utf8("EVAL"), utf8(s.text())));
            text.addAll(tail);
            return send.apply(text);
        });
    }

    private static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    // ---- Redisson's names (RedissonObject.prefixName / suffixName) ----------------------

    /** `prefix:{name}`, or `prefix:name` when the name has a `{` of its own. */
    static String prefixName(String prefix, String name) {
        return name.contains("{") ? prefix + ":" + name : prefix + ":{" + name + "}";
    }

    /** `{name}:suffix`, or `name:suffix` when the name has a `{` of its own. */
    static String suffixName(String name, String suffix) {
        return name.contains("{") ? name + ":" + suffix : "{" + name + "}:" + suffix;
    }

    static String lockChannel(String name) {
        return prefixName("redisson_lock__channel", name);
    }

    static String rwChannel(String name) {
        return prefixName("redisson_rwlock", name);
    }

    static String semaphoreChannel(String name) {
        return prefixName("redisson_sc", name);
    }

    /** Always braces (RedissonCountDownLatch.getChannelName has no prefixName rule). */
    static String latchChannel(String name) {
        return "redisson_countdownlatch__channel__{" + name + "}";
    }

    static String tokenKey(String name) {
        return prefixName("redisson_lock_token", name);
    }

    static String timeoutZset(String name) {
        return suffixName(name, "timeout");
    }

    /** `{name}:<owner>:rwlock_timeout`: read hold n's timeout key is this + `:n`. */
    static String rwTimeoutPrefix(String name, String owner) {
        return suffixName(name, owner) + ":rwlock_timeout";
    }

    /** RedissonReadLock.getKeyPrefix: `{name}` (`name` when it has a `{`). */
    static String rwKeyPrefix(String name) {
        return name.contains("{") ? name : "{" + name + "}";
    }

    static String unlockLatch(String name, String requestId) {
        return prefixName("redisson_unlock_latch", name) + ":" + requestId;
    }

    /** The channel a waiter of this (waiting) module command listens on. */
    static String channelOf(List<String> args) {
        String cmd = args.get(0).toUpperCase(Locale.ROOT), name = args.get(1);
        return switch (cmd) {
            case "RLOCK.ACQUIRE", "RFENCED.ACQUIRE" -> lockChannel(name);
            case "RRWLOCK.ACQUIRE" -> rwChannel(name);
            case "RSEMAPHORE.ACQUIRE", "RPSEMAPHORE.ACQUIRE" -> semaphoreChannel(name);
            case "RLATCH.AWAIT" -> latchChannel(name);
            default -> throw new IllegalArgumentException("rlock scripts mode: " + cmd + " does not wait");
        };
    }

    /** Whether a waiting command's reply ends the wait (the module's meaning). */
    static boolean granted(String cmd, Object reply) {
        return switch (cmd.toUpperCase(Locale.ROOT)) {
            case "RLOCK.ACQUIRE", "RRWLOCK.ACQUIRE" -> reply == null;
            case "RFENCED.ACQUIRE" -> reply instanceof List<?> l && l.get(0) == null;
            case "RPSEMAPHORE.ACQUIRE" -> reply != null;
            default -> Long.valueOf(1).equals(reply); // RSEMAPHORE.ACQUIRE, RLATCH.AWAIT
        };
    }

    // ---- the commands -------------------------------------------------------------------

    /** A module command's positional arguments (at least `fixed`, after the command) and options. */
    record Parsed(List<String> pos, Map<String, String> opts) {
        String opt(String name, String otherwise) {
            return opts.getOrDefault(name, otherwise);
        }
    }

    static Parsed parse(List<String> args, int fixed) {
        List<String> pos = new ArrayList<>();
        int i = 1;
        while (i < args.size() && (pos.size() < fixed || !OPTIONS.contains(args.get(i).toUpperCase(Locale.ROOT)))) {
            pos.add(args.get(i++));
        }
        if (pos.size() < fixed) {
            throw new IllegalArgumentException("rlock scripts mode: " + args.get(0) + " needs " + fixed + " arguments");
        }
        Map<String, String> opts = new HashMap<>();
        while (i < args.size()) {
            String word = args.get(i).toUpperCase(Locale.ROOT);
            if (word.equals("ASYNC")) {
                opts.put(word, "");
                i++;
            } else {
                opts.put(word, i + 1 < args.size() ? args.get(i + 1) : "");
                i += 2;
            }
        }
        return new Parsed(pos, opts);
    }

    private static CompletableFuture<Outcome> done(Object reply) {
        return CompletableFuture.completedFuture(new Outcome(reply, null));
    }

    private static RedisCommandExecutionException refused(String text) {
        return (RedisCommandExecutionException) RlockServerException.of(new RedisCommandExecutionException(text));
    }

    private static long asLong(Object v) {
        return v == null ? 0 : Sync.asLong(v);
    }

    /** A permit count as the module takes it (0 to 2^31 - 1), else the module's refusal. */
    private static String permits(String value) {
        long n;
        try {
            n = Long.parseLong(value);
        } catch (NumberFormatException e) {
            n = -1;
        }
        if (n < 0 || n > Integer.MAX_VALUE) {
            throw refused(ERR_PERMITS);
        }
        return value;
    }

    private static String now() {
        return Long.toString(System.currentTimeMillis());
    }

    private String rid(Parsed p) {
        return p.opt("ID", Wire.requestId());
    }

    private CompletableFuture<Long> getLong(String key) {
        return wire.retrying(List.of("GET", key)).thenApply(Scripts::asLong);
    }

    /** The module command `args` done with Redisson's scripts: the module's reply, and a wait hint. */
    CompletableFuture<Outcome> command(List<String> args) {
        try {
            return dispatch(args);
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    private CompletableFuture<Outcome> dispatch(List<String> args) {
        String cmd = args.get(0).toUpperCase(Locale.ROOT);
        switch (cmd) {
            case "RLOCK.ACQUIRE": {
                Parsed p = parse(args, 3);
                return eval("lock_acquire", List.of(p.pos.get(0)), List.of(p.pos.get(2), p.pos.get(1)))
                        .thenApply(r -> new Outcome(r, r == null ? null : asLong(r)));
            }
            case "RLOCK.RELEASE": {
                Parsed p = parse(args, 2);
                String name = p.pos.get(0);
                return eval("lock_unlock", List.of(name, lockChannel(name), unlockLatch(name, rid(p))),
                        List.of(UNLOCK_MESSAGE, Long.toString(releaseLeaseMs), p.pos.get(1), publish,
                                Long.toString(UNLOCK_LATCH_MS))).thenApply(Outcome::of);
            }
            case "RLOCK.RENEW": {
                Parsed p = parse(args, 3);
                return eval("lock_renew", List.of(p.pos.get(0)), List.of(p.pos.get(2), p.pos.get(1))).thenApply(Outcome::of);
            }
            case "RLOCK.FORCERELEASE": {
                String name = parse(args, 1).pos.get(0);
                return eval("lock_force_unlock", List.of(name, lockChannel(name)), List.of(UNLOCK_MESSAGE, publish)).thenApply(Outcome::of);
            }
            case "RFENCED.ACQUIRE": {
                Parsed p = parse(args, 3);
                String name = p.pos.get(0);
                return eval("fenced_acquire_token", List.of(name, tokenKey(name)), List.of(p.pos.get(2), p.pos.get(1)))
                        .thenApply(r -> {
                            List<?> l = (List<?>) r;
                            long ttl = asLong(l.get(0));
                            return ttl == -1 ? new Outcome(Arrays.asList(null, asLong(l.get(1))), null)
                                    : new Outcome(Arrays.asList(ttl, null), ttl);
                        });
            }
            case "RFENCED.GETTOKEN": {
                String name = parse(args, 1).pos.get(0);
                return wire.retrying(List.of("GET", tokenKey(name))).thenApply(v -> new Outcome(v == null ? null : asLong(v), null));
            }
            case "RRWLOCK.ACQUIRE":
                return rwAcquire(parse(args, 4));
            case "RRWLOCK.RELEASE":
                return rwRelease(parse(args, 3));
            case "RRWLOCK.RENEW": {
                Parsed p = parse(args, 4);
                String name = p.pos.get(0), owner = p.pos.get(2), lease = p.pos.get(3);
                if (p.pos.get(1).equalsIgnoreCase("READ")) {
                    return eval("read_renew", List.of(name, rwKeyPrefix(name)), List.of(lease, "1", owner))
                            .thenApply(r -> new Outcome(asLong(((List<?>) r).get(0)), null));
                }
                return eval("lock_renew", List.of(name), List.of(lease, owner + ":write")).thenApply(Outcome::of);
            }
            case "RRWLOCK.FORCERELEASE": {
                Parsed p = parse(args, 1);
                String name = p.pos.get(0);
                // Redisson's forceUnlock of one side frees the lock only when it is held in that mode.
                boolean read = p.pos.size() < 2 || p.pos.get(1).equalsIgnoreCase("READ");
                return eval(read ? "read_force_unlock" : "write_force_unlock", List.of(name, rwChannel(name)),
                        List.of(read ? UNLOCK_MESSAGE : READ_UNLOCK_MESSAGE, publish)).thenApply(Outcome::of);
            }
            case "RSEMAPHORE.TRYSETPERMITS", "RPSEMAPHORE.TRYSETPERMITS": {
                Parsed p = parse(args, 2);
                String name = p.pos.get(0), n = permits(p.pos.get(1));
                List<String> keys = List.of(name, semaphoreChannel(name));
                if (cmd.startsWith("RSEMAPHORE") && p.opts.containsKey("PX")) {
                    return eval("semaphore_try_set_ttl", keys, List.of(n, publish, p.opts.get("PX"))).thenApply(Outcome::of);
                }
                return eval("semaphore_try_set", keys, List.of(n, publish)).thenApply(Outcome::of);
            }
            case "RSEMAPHORE.ADDPERMITS": {
                Parsed p = parse(args, 2);
                String name = p.pos.get(0);
                return eval("semaphore_add", List.of(name, semaphoreChannel(name)), List.of(p.pos.get(1), publish))
                        .thenCompose(x -> getLong(name)).thenApply(Outcome::of);
            }
            case "RSEMAPHORE.ACQUIRE": {
                Parsed p = parse(args, 2);
                if (Long.parseLong(p.pos.get(1)) == 0) {
                    return done(1L); // Redisson answers without a call
                }
                return eval("semaphore_try_acquire", List.of(p.pos.get(0)), List.of(p.pos.get(1))).thenApply(Outcome::of);
            }
            case "RSEMAPHORE.RELEASE": {
                Parsed p = parse(args, 2);
                String name = p.pos.get(0);
                CompletableFuture<Object> released = Long.parseLong(p.pos.get(1)) == 0 ? CompletableFuture.completedFuture(null)
                        : eval("semaphore_release", List.of(name, semaphoreChannel(name)), List.of(p.pos.get(1), publish));
                return released.thenCompose(x -> getLong(name)).thenApply(Outcome::of);
            }
            case "RSEMAPHORE.AVAILABLEPERMITS":
                return getLong(parse(args, 1).pos.get(0)).thenApply(Outcome::of);
            case "RSEMAPHORE.DRAINPERMITS": {
                String name = parse(args, 1).pos.get(0);
                return eval("semaphore_drain", List.of(name), List.of()).thenApply(r -> new Outcome(asLong(r), null));
            }
            case "RPSEMAPHORE.SETPERMITS": {
                Parsed p = parse(args, 2);
                String name = p.pos.get(0);
                return eval("pes_set_permits", List.of(name, semaphoreChannel(name), timeoutZset(name)),
                        List.of(permits(p.pos.get(1)), publish)).thenCompose(x -> pesAvailable(name));
            }
            case "RPSEMAPHORE.ADDPERMITS": {
                Parsed p = parse(args, 2);
                String name = p.pos.get(0);
                return eval("pes_add", List.of(name, semaphoreChannel(name)), List.of(p.pos.get(1), publish))
                        .thenCompose(x -> pesAvailable(name));
            }
            case "RPSEMAPHORE.AVAILABLEPERMITS":
                return pesAvailable(parse(args, 1).pos.get(0));
            case "RPSEMAPHORE.ACQUIREDPERMITS": {
                String name = parse(args, 1).pos.get(0);
                return eval("pes_acquired", pesKeys(name), List.of(now(), publish)).thenApply(r -> new Outcome(asLong(r), null));
            }
            case "RPSEMAPHORE.ACQUIRE":
                return pesAcquire(parse(args, 2));
            case "RPSEMAPHORE.RELEASE": {
                Parsed p = parse(args, 2);
                String name = p.pos.get(0);
                return evalRaw("pes_release", List.of(name, semaphoreChannel(name), timeoutZset(name)),
                        List.of(rawId(p.pos.get(1)), "1", now(), publish)).thenApply(Outcome::of);
            }
            case "RPSEMAPHORE.UPDATELEASETIME": {
                Parsed p = parse(args, 3);
                long now = System.currentTimeMillis();
                return evalRaw("pes_update_lease", pesKeys(p.pos.get(0)), List.of(rawId(p.pos.get(1)),
                        expiry(Long.parseLong(p.pos.get(2)), now), Long.toString(now), publish)).thenApply(Outcome::of);
            }
            case "RPSEMAPHORE.LEASETIME": {
                Parsed p = parse(args, 2);
                return evalRaw("pes_lease_time", pesKeys(p.pos.get(0)), List.of(rawId(p.pos.get(1)),
                        Long.toString(NON_EXPIRABLE), now(), publish)).thenApply(Outcome::of);
            }
            case "RLATCH.TRYSETCOUNT": {
                Parsed p = parse(args, 2);
                String name = p.pos.get(0);
                return eval("latch_try_set", List.of(name, latchChannel(name)), List.of(NEW_COUNT_MESSAGE, p.pos.get(1), publish))
                        .thenApply(Outcome::of);
            }
            case "RLATCH.COUNTDOWN": {
                String name = parse(args, 1).pos.get(0);
                return eval("latch_count_down", List.of(name, latchChannel(name)), List.of(ZERO_COUNT_MESSAGE, publish))
                        .thenCompose(x -> getLong(name)).thenApply(n -> new Outcome(Math.max(0, n), null));
            }
            case "RLATCH.GETCOUNT":
                return getLong(parse(args, 1).pos.get(0)).thenApply(n -> new Outcome(Math.max(0, n), null));
            case "RLATCH.DELETE": {
                String name = parse(args, 1).pos.get(0);
                return eval("latch_delete", List.of(name, latchChannel(name)), List.of(NEW_COUNT_MESSAGE, publish))
                        .thenApply(Outcome::of);
            }
            case "RLATCH.AWAIT":
                return getLong(parse(args, 1).pos.get(0)).thenApply(n -> new Outcome(n <= 0 ? 1L : 0L, null));
            default:
                throw refused("ERR rlock scripts mode: " + args.get(0) + " needs the rlock module (no Redisson script does it)");
        }
    }

    private CompletableFuture<Outcome> rwAcquire(Parsed p) {
        String name = p.pos.get(0), owner = p.pos.get(2), lease = p.pos.get(3), writer = owner + ":write";
        if (p.pos.get(1).equalsIgnoreCase("READ")) {
            return eval("read_acquire", List.of(name, rwTimeoutPrefix(name, owner)), List.of(lease, owner, writer))
                    .thenApply(r -> new Outcome(r, r == null ? null : asLong(r)));
        }
        return eval("write_acquire", List.of(name), List.of(lease, writer)).thenCompose(r -> {
            if (r == null) {
                return done(null);
            }
            // The module refuses an upgrade at once; Redisson's script would let the owner
            // wait for itself until its own read leases end. Only this owner changes its
            // own read field, so looking after the script is not a race.
            return wire.retrying(List.of("HMGET", name, "mode", owner)).thenApply(v -> {
                List<?> l = (List<?>) v;
                if ("read".equals(l.get(0)) && l.get(1) != null) {
                    throw refused(ERR_RW_READ_HELD);
                }
                return new Outcome(r, asLong(r));
            });
        });
    }

    private CompletableFuture<Outcome> rwRelease(Parsed p) {
        String name = p.pos.get(0), owner = p.pos.get(2), latch = unlockLatch(name, rid(p));
        if (p.pos.get(1).equalsIgnoreCase("READ")) {
            return eval("read_unlock", List.of(name, rwChannel(name), rwTimeoutPrefix(name, owner), rwKeyPrefix(name), latch),
                    List.of(UNLOCK_MESSAGE, owner, publish, Long.toString(UNLOCK_LATCH_MS))).thenApply(Outcome::of);
        }
        return eval("write_unlock", List.of(name, rwChannel(name), latch), List.of(READ_UNLOCK_MESSAGE,
                Long.toString(releaseLeaseMs), owner + ":write", publish, Long.toString(UNLOCK_LATCH_MS))).thenApply(Outcome::of);
    }

    /** The reclaiming scripts' KEYS: name, timeout zset, channel. */
    private static List<String> pesKeys(String name) {
        return List.of(name, timeoutZset(name), semaphoreChannel(name));
    }

    private CompletableFuture<Outcome> pesAvailable(String name) {
        return eval("pes_available", pesKeys(name), List.of(now(), publish)).thenApply(r -> new Outcome(asLong(r), null));
    }

    private static String expiry(long leaseMs, long now) {
        return Long.toString(leaseMs < 0 ? NON_EXPIRABLE : now + leaseMs);
    }

    /**
     * A permit id: 16 random bytes, each below 0x80 so that the bytes the zset holds (what
     * Redisson's scripts keep) travel as UTF-8 text on any transport; 112 random bits.
     */
    static String newPermitId() {
        byte[] b = new byte[16];
        RANDOM.nextBytes(b);
        for (int i = 0; i < b.length; i++) {
            b[i] &= 0x7f;
        }
        return HexFormat.of().formatHex(b);
    }

    /**
     * A permit id (32 hex digits) as the 16 bytes the zset holds: text when every byte is
     * below 0x80 (this client's ids), else the bytes (an id Redisson made, which needs a
     * transport that carries bytes, {@link Transport#sendBytes}); the module's refusal when
     * it is not an id.
     */
    static Object rawId(String permitId) {
        byte[] raw;
        try {
            raw = HexFormat.of().parseHex(permitId);
        } catch (IllegalArgumentException e) {
            raw = new byte[0];
        }
        if (raw.length != 16) {
            throw refused("BADPERMITID scripts mode takes Redisson's permit ids: 32 hex digits");
        }
        StringBuilder s = new StringBuilder(16);
        for (byte x : raw) {
            if (x < 0) {
                return raw;
            }
            s.append((char) x);
        }
        return s.toString();
    }

    private CompletableFuture<Outcome> pesAcquire(Parsed p) {
        String name = p.pos.get(0);
        int n = Integer.parseInt(p.opt("PERMITS", "1"));
        long now = System.currentTimeMillis();
        List<String> ids = new ArrayList<>(n);
        List<String> argv = new ArrayList<>(List.of(Integer.toString(n), expiry(Long.parseLong(p.pos.get(1)), now),
                Long.toString(now), Long.toString(NON_EXPIRABLE), publish));
        for (int i = 0; i < n; i++) {
            String id = newPermitId();
            ids.add(id);
            argv.add((String) rawId(id)); // below 0x80: text
        }
        return eval("pes_try_acquire", pesKeys(name), argv).thenApply(r -> {
            if ("OK".equals(r)) {
                return new Outcome(n == 1 ? ids.get(0) : new ArrayList<Object>(ids), null);
            }
            if (r instanceof String s && s.startsWith(":")) {
                long until = (long) Double.parseDouble(s.substring(1));
                return new Outcome(null, Math.max(1, until - now));
            }
            return new Outcome(null, null);
        });
    }
}
