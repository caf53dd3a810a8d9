/* The floor of bench/instr.py: a module that subscribes to exactly what librlock
 * subscribes to on this server, with callbacks that do nothing. What it costs a command
 * is the server's own price for delivering the event to any module, which no module
 * can go below. Mirrors the choice in src/events.rs: where the server reports key
 * removal and overwrite (post-notification jobs exist, Redis 7.2+ / Valkey), the key
 * server event and no keyspace classes; otherwise (7.0) the keyspace classes that can
 * remove, replace or spoil a hash. */
#define REDISMODULE_MAIN
#include "redismodule.h"

static int on_keyspace(RedisModuleCtx *ctx, int type, const char *event, RedisModuleString *key) {
    (void)ctx; (void)type; (void)event; (void)key;
    return REDISMODULE_OK;
}

static void on_key(RedisModuleCtx *ctx, RedisModuleEvent e, uint64_t sub, void *data) {
    (void)ctx; (void)e; (void)sub; (void)data;
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv; (void)argc;
    if (RedisModule_Init(ctx, "rlockfloor", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    if (RedisModule_AddPostNotificationJob != NULL) {
        RedisModuleEvent key = {REDISMODULE_EVENT_KEY, 1};
        return RedisModule_SubscribeToServerEvent(ctx, key, on_key);
    }
    int classes = REDISMODULE_NOTIFY_GENERIC | REDISMODULE_NOTIFY_STRING | REDISMODULE_NOTIFY_SET
        | REDISMODULE_NOTIFY_ZSET | REDISMODULE_NOTIFY_HASH | REDISMODULE_NOTIFY_EXPIRED | REDISMODULE_NOTIFY_EVICTED;
    return RedisModule_SubscribeToKeyspaceEvents(ctx, classes, on_keyspace);
}
