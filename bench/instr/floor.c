/* The floors of `make bench-instr`, in one do-nothing-more module.
 *
 * 1. The tax floors (bench/instr.py), loaded with arguments: a mode, then command names
 *    (librlock's, as the server lists them), each registered as a command that does
 *    nothing; the FLOOR.* commands below are then not registered.
 *    `commands NAME...`: the names and nothing else. What it costs another command is the
 *    server's price of a module with those commands: the command table is a dict that
 *    every call looks its command up in, and the names change its bucket chains (Redis
 *    7.0's 240 commands grow it from 256 to 512 buckets once a 17th name joins; a
 *    module's command goes to the head of its chain, in front of a built-in command that
 *    shares its bucket), so a lookup compares a few names more or fewer.
 *    `events NAME...`: the same names, and subscribed to exactly what librlock subscribes
 *    to while somebody waits, with callbacks that do nothing: the server's own price for
 *    delivering the event to any module, which no module can go below. Mirrors the
 *    choice in src/engine/events.rs: where the server reports key removal and overwrite
 *    (post-notification jobs exist, Redis 7.2+ / Valkey), the key server event and no
 *    keyspace classes; otherwise (7.0) the keyspace classes that can remove, replace or
 *    spoil a hash.
 *    Without arguments (bench/floors_instr.py): the FLOOR.* commands, subscribed as in
 *    `events`.
 *
 * 2. The command floors (bench/floors_instr.py): FLOOR.* commands that do only what the
 *    design.md makes an rlock command do for one case, with no logic, no parsing beyond the
 *    lease and no read beyond the key's type: write with the key API, replicate each
 *    effect as its plain command with absolute expiries (design.md 1.4), fire the keyspace
 *    notifications the plain command fires, signal WATCH (src/server/store.rs does the same, in
 *    the same order; the module also turns off the implicit signal as librlock does).
 *    What such a command costs is the least any module command that keeps those promises
 *    can cost. Variants (FLOOR.LOCK.*) try cheaper ways to do the same.
 *
 *    FLOOR.NOP key                    the module command dispatch alone: reply nil
 *    FLOOR.LOCK key owner lease-ms    RLOCK.ACQUIRE, new lock: HSET key owner 1,
 *                                     PEXPIREAT key now+lease; "hset", "expire"; nil
 *    FLOOR.LOCK.NOREPL ...            the same without replicating: what RM_Replicate costs
 *    FLOOR.LOCK.V ...                 replicated with the "v" format and strings built
 *                                     once (constants at load, the expiry as a string)
 *    FLOOR.LOCK.CALL ...              RM_Call("HSET", "!...") + RM_Call("PEXPIREAT", "!...")
 *                                     : the server's own commands write, notify, signal and
 *                                     replicate
 *    FLOOR.LOCK.APPLY ...             FLOOR.LOCK replicated as `rlock.replication commands`
 *                                     replicates it: one command with one argument that
 *                                     carries both writes (here the key, the owner and the
 *                                     deadline, copied into one buffer: the least any
 *                                     encoding of them can be; FLOOR.APPLY applies nothing)
 *    FLOOR.RENEW key owner lease-ms   RLOCK.RENEW: the field exists? PEXPIREAT; "expire"; 1
 *    FLOOR.RENEW.READ ...             FLOOR.RENEW reading the owner's count, as design.md 1.6
 *                                     makes RLOCK.RENEW (a hash whose value is not a
 *                                     positive integer is not a lock, and is not renewed)
 *    FLOOR.RWREAD key owner lease-ms  RRWLOCK.ACQUIRE READ, new lock, Redisson's layout:
 *                                     HSET key mode read owner 1;
 *                                     SET {key}:owner:rwlock_timeout:1 1 PXAT at ("set",
 *                                     "expire"); PEXPIREAT key at ("expire"); nil
 */
#define REDISMODULE_MAIN
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include "redismodule.h"

static RedisModuleString *s_one, *s_mode, *s_read;

static int on_keyspace(RedisModuleCtx *ctx, int type, const char *event, RedisModuleString *key) {
    (void)ctx; (void)type; (void)event; (void)key;
    return REDISMODULE_OK;
}

static void on_key(RedisModuleCtx *ctx, RedisModuleEvent e, uint64_t sub, void *data) {
    (void)ctx; (void)e; (void)sub; (void)data;
}

/* The lease in ms and the absolute expiry; 0 on bad input (replied to). */
static long long expiry(RedisModuleCtx *ctx, RedisModuleString *lease_arg) {
    long long lease;
    if (RedisModule_StringToLongLong(lease_arg, &lease) != REDISMODULE_OK || lease <= 0) {
        RedisModule_ReplyWithError(ctx, "ERR bad lease");
        return 0;
    }
    return RedisModule_Milliseconds() + lease;
}

static int floor_nop(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 2) return RedisModule_WrongArity(ctx);
    return RedisModule_ReplyWithNull(ctx);
}

enum how { REPLICATE, NO_REPLICATE, REPLICATE_V, REPLICATE_ONE };

/* FLOOR.LOCK.APPLY's one replicated command: the key, the owner and the deadline's digits
 * in one argument. */
static void replicate_one(RedisModuleCtx *ctx, RedisModuleString *name,
                          RedisModuleString *owner, long long at) {
    size_t nlen, olen;
    const char *n = RedisModule_StringPtrLen(name, &nlen);
    const char *o = RedisModule_StringPtrLen(owner, &olen);
    char buf[512];
    if (nlen + olen + 24 > sizeof buf) return;
    memcpy(buf, n, nlen);
    memcpy(buf + nlen, o, olen);
    size_t len = nlen + olen;
    char digits[24];
    int d = 0;
    for (unsigned long long v = (unsigned long long)at; v; v /= 10) digits[d++] = (char)('0' + v % 10);
    while (d) buf[len++] = digits[--d];
    RedisModule_Replicate(ctx, "FLOOR.APPLY", "b", buf, len);
}

static int lock_with(RedisModuleCtx *ctx, RedisModuleString **argv, int argc, enum how how) {
    if (argc != 4) return RedisModule_WrongArity(ctx);
    long long at = expiry(ctx, argv[3]);
    if (!at) return REDISMODULE_OK;
    RedisModuleString *name = argv[1], *owner = argv[2];
    RedisModuleKey *key = RedisModule_OpenKey(ctx, name, REDISMODULE_READ | REDISMODULE_WRITE);
    if (RedisModule_KeyType(key) != REDISMODULE_KEYTYPE_EMPTY) {
        /* Held: a real acquire would answer the PTTL; every run here takes new keys. */
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithError(ctx, "ERR held");
    }
    RedisModule_HashSet(key, REDISMODULE_HASH_NONE, owner, s_one, NULL);
    if (how == REPLICATE) {
        RedisModule_Replicate(ctx, "HSET", "ssl", name, owner, 1LL);
    } else if (how == REPLICATE_V) {
        RedisModuleString *args[3] = {name, owner, s_one};
        RedisModule_Replicate(ctx, "HSET", "v", args, (size_t)3);
    }
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_HASH, "hset", name);
    RedisModule_SetAbsExpire(key, at);
    if (how == REPLICATE) {
        RedisModule_Replicate(ctx, "PEXPIREAT", "sl", name, at);
    } else if (how == REPLICATE_V) {
        RedisModuleString *args[2] = {name, RedisModule_CreateStringFromLongLong(NULL, at)};
        RedisModule_Replicate(ctx, "PEXPIREAT", "v", args, (size_t)2);
        RedisModule_FreeString(NULL, args[1]);
    }
    if (how == REPLICATE_ONE) replicate_one(ctx, name, owner, at);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_GENERIC, "expire", name);
    RedisModule_CloseKey(key);
    RedisModule_SignalModifiedKey(ctx, name);
    return RedisModule_ReplyWithNull(ctx);
}

static int floor_lock(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return lock_with(ctx, argv, argc, REPLICATE);
}

static int floor_lock_norepl(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return lock_with(ctx, argv, argc, NO_REPLICATE);
}

static int floor_lock_v(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return lock_with(ctx, argv, argc, REPLICATE_V);
}

static int floor_lock_apply(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return lock_with(ctx, argv, argc, REPLICATE_ONE);
}

/* FLOOR.APPLY payload: what FLOOR.LOCK.APPLY replicates; never run by the bench (no
 * replica, and the AOF is not loaded back). */
static int floor_apply(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 2) return RedisModule_WrongArity(ctx);
    return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

static int floor_lock_call(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 4) return RedisModule_WrongArity(ctx);
    long long at = expiry(ctx, argv[3]);
    if (!at) return REDISMODULE_OK;
    RedisModuleString *name = argv[1], *owner = argv[2];
    RedisModuleKey *key = RedisModule_OpenKey(ctx, name, REDISMODULE_READ);
    int empty = RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_EMPTY;
    RedisModule_CloseKey(key);
    if (!empty) return RedisModule_ReplyWithError(ctx, "ERR held");
    RedisModuleCallReply *r = RedisModule_Call(ctx, "HSET", "!sss", name, owner, s_one);
    if (r) RedisModule_FreeCallReply(r);
    r = RedisModule_Call(ctx, "PEXPIREAT", "!sl", name, at);
    if (r) RedisModule_FreeCallReply(r);
    return RedisModule_ReplyWithNull(ctx);
}

static int renew_with(RedisModuleCtx *ctx, RedisModuleString **argv, int argc, int read) {
    if (argc != 4) return RedisModule_WrongArity(ctx);
    long long at = expiry(ctx, argv[3]);
    if (!at) return REDISMODULE_OK;
    RedisModuleString *name = argv[1], *owner = argv[2];
    RedisModuleKey *key = RedisModule_OpenKey(ctx, name, REDISMODULE_READ | REDISMODULE_WRITE);
    int exists = 0;
    if (RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_HASH) {
        if (read) {
            RedisModuleString *count = NULL;
            long long n = 0;
            RedisModule_HashGet(key, REDISMODULE_HASH_NONE, owner, &count, NULL);
            exists = count && RedisModule_StringToLongLong(count, &n) == REDISMODULE_OK && n >= 1;
            if (count) RedisModule_FreeString(ctx, count);
        } else {
            RedisModule_HashGet(key, REDISMODULE_HASH_EXISTS, owner, &exists, NULL);
        }
    }
    if (!exists) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithLongLong(ctx, 0);
    }
    RedisModule_SetAbsExpire(key, at);
    RedisModule_Replicate(ctx, "PEXPIREAT", "sl", name, at);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_GENERIC, "expire", name);
    RedisModule_CloseKey(key);
    RedisModule_SignalModifiedKey(ctx, name);
    return RedisModule_ReplyWithLongLong(ctx, 1);
}

static int floor_renew(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return renew_with(ctx, argv, argc, 0);
}

static int floor_renew_read(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    return renew_with(ctx, argv, argc, 1);
}

static int floor_rwread(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 4) return RedisModule_WrongArity(ctx);
    long long at = expiry(ctx, argv[3]);
    if (!at) return REDISMODULE_OK;
    RedisModuleString *name = argv[1], *owner = argv[2];
    size_t nlen, olen;
    const char *n = RedisModule_StringPtrLen(name, &nlen);
    const char *o = RedisModule_StringPtrLen(owner, &olen);
    /* Redisson's suffixName: {name}:owner, or name:owner when name has a hash tag. */
    char buf[512];
    int braced = memchr(n, '{', nlen) != NULL;
    int len = snprintf(buf, sizeof buf, braced ? "%.*s:%.*s:rwlock_timeout:1"
                                               : "{%.*s}:%.*s:rwlock_timeout:1",
                       (int)nlen, n, (int)olen, o);
    if (len < 0 || (size_t)len >= sizeof buf) return RedisModule_ReplyWithError(ctx, "ERR long");

    RedisModuleKey *key = RedisModule_OpenKey(ctx, name, REDISMODULE_READ | REDISMODULE_WRITE);
    if (RedisModule_KeyType(key) != REDISMODULE_KEYTYPE_EMPTY) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithError(ctx, "ERR held");
    }
    RedisModule_HashSet(key, REDISMODULE_HASH_NONE, s_mode, s_read, owner, s_one, NULL);
    RedisModuleString *hset[5] = {name, s_mode, s_read, owner, s_one};
    RedisModule_Replicate(ctx, "HSET", "v", hset, (size_t)5);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_HASH, "hset", name);

    RedisModuleString *timeout = RedisModule_CreateString(ctx, buf, (size_t)len);
    RedisModuleKey *tkey = RedisModule_OpenKey(ctx, timeout, REDISMODULE_READ | REDISMODULE_WRITE);
    RedisModule_StringSet(tkey, s_one);
    RedisModule_SetAbsExpire(tkey, at);
    RedisModule_Replicate(ctx, "SET", "sscl", timeout, s_one, "PXAT", at);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_STRING, "set", timeout);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_GENERIC, "expire", timeout);
    RedisModule_CloseKey(tkey);

    RedisModule_SetAbsExpire(key, at);
    RedisModule_Replicate(ctx, "PEXPIREAT", "sl", name, at);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_GENERIC, "expire", name);
    RedisModule_CloseKey(key);
    RedisModule_SignalModifiedKey(ctx, name);
    RedisModule_SignalModifiedKey(ctx, timeout);
    return RedisModule_ReplyWithNull(ctx);
}

/* A tax floor's stand-in for one of librlock's commands: never called by the bench. */
static int floor_named(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv; (void)argc;
    return RedisModule_ReplyWithNull(ctx);
}

static int subscribe(RedisModuleCtx *ctx) {
    if (RedisModule_AddPostNotificationJob != NULL) {
        RedisModuleEvent key = {REDISMODULE_EVENT_KEY, 1};
        return RedisModule_SubscribeToServerEvent(ctx, key, on_key);
    }
    int classes = REDISMODULE_NOTIFY_GENERIC | REDISMODULE_NOTIFY_STRING | REDISMODULE_NOTIFY_SET
        | REDISMODULE_NOTIFY_ZSET | REDISMODULE_NOTIFY_HASH | REDISMODULE_NOTIFY_EXPIRED | REDISMODULE_NOTIFY_EVICTED;
    return RedisModule_SubscribeToKeyspaceEvents(ctx, classes, on_keyspace);
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (RedisModule_Init(ctx, "rlockfloor", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    if (argc > 0) {
        /* A tax floor: `commands|events NAME...`. */
        const char *mode = RedisModule_StringPtrLen(argv[0], NULL);
        int events = !strcasecmp(mode, "events");
        if (!events && strcasecmp(mode, "commands")) {
            RedisModule_Log(ctx, "warning", "floor: mode must be commands or events");
            return REDISMODULE_ERR;
        }
        for (int i = 1; i < argc; i++)
            if (RedisModule_CreateCommand(ctx, RedisModule_StringPtrLen(argv[i], NULL),
                                          floor_named, "write", 1, 1, 1) == REDISMODULE_ERR)
                return REDISMODULE_ERR;
        return events ? subscribe(ctx) : REDISMODULE_OK;
    }
    RedisModule_SetModuleOptions(ctx, REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED);
    s_one = RedisModule_CreateString(NULL, "1", 1);
    s_mode = RedisModule_CreateString(NULL, "mode", 4);
    s_read = RedisModule_CreateString(NULL, "read", 4);
    struct { const char *name; RedisModuleCmdFunc f; const char *flags; } cmds[] = {
        {"floor.nop", floor_nop, "write deny-oom"},
        {"floor.lock", floor_lock, "write deny-oom"},
        {"floor.lock.norepl", floor_lock_norepl, "write deny-oom"},
        {"floor.lock.v", floor_lock_v, "write deny-oom"},
        {"floor.lock.call", floor_lock_call, "write deny-oom"},
        {"floor.lock.apply", floor_lock_apply, "write deny-oom"},
        {"floor.apply", floor_apply, "write"},
        {"floor.renew", floor_renew, "write"},
        {"floor.renew.read", floor_renew_read, "write"},
        {"floor.rwread", floor_rwread, "write deny-oom"},
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (RedisModule_CreateCommand(ctx, cmds[i].name, cmds[i].f, cmds[i].flags, 1, 1, 1)
            == REDISMODULE_ERR)
            return REDISMODULE_ERR;
    return subscribe(ctx);
}
