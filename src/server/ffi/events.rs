//! Noticing removed keys (keyspace events, or the key server event on 7.2+) and
//! post-notification jobs (Redis 7.2+, Valkey). A child of `ffi`.

use super::*;

// ---------------------------------------------------------------------------------------
// Noticing removed keys: keyspace events (every server) or the key server event (7.2+)

/// How a key left (or was replaced), as the key server event reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Deleted,
    Expired,
    Evicted,
    Overwritten,
}

/// Called with the db, whether the key expired, and the key's name.
pub type KeyHandler = fn(&Context, i32, Removal, &[u8]);

static KEYSPACE_HANDLER: OnceLock<(fn() -> bool, KeyHandler)> = OnceLock::new();
static KEY_EVENT_HANDLER: OnceLock<(fn() -> bool, KeyHandler)> = OnceLock::new();

extern "C" fn keyspace_cb(
    ctx: *mut raw::RedisModuleCtx,
    class: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if let Some((watching, f)) = KEYSPACE_HANDLER.get() {
        if !watching() {
            return raw::REDISMODULE_OK as c_int;
        }
        let context = Context::new(ctx);
        let removal = if class & raw::REDISMODULE_NOTIFY_EXPIRED != 0 {
            Removal::Expired
        } else if class & raw::REDISMODULE_NOTIFY_EVICTED != 0 {
            Removal::Evicted
        } else {
            Removal::Deleted
        };
        let db = selected_db(&context);
        f(&context, db, removal, string_bytes(key));
    }
    raw::REDISMODULE_OK as c_int
}

/// Subscribes `f` to the keyspace event classes that can remove, replace or spoil a lock
/// hash: generic (DEL, UNLINK, RENAME, MOVE, COPY, RESTORE), string (SET, BITOP), set
/// and zset (the *STORE commands), hash (a field written that is no hold count), expired,
/// evicted. Not list or stream: no command of theirs touches a hash (SORT ... STORE
/// replaces one, and is noticed lazily, see engine/events.rs).
///
/// `watching` is asked first, before the key's name is read: false turns the event away.
pub fn subscribe_keyspace(ctx: &Context, watching: fn() -> bool, f: KeyHandler) {
    let _ = KEYSPACE_HANDLER.set((watching, f));
    let classes = raw::REDISMODULE_NOTIFY_GENERIC
        | raw::REDISMODULE_NOTIFY_STRING
        | raw::REDISMODULE_NOTIFY_SET
        | raw::REDISMODULE_NOTIFY_ZSET
        | raw::REDISMODULE_NOTIFY_HASH
        | raw::REDISMODULE_NOTIFY_EXPIRED
        | raw::REDISMODULE_NOTIFY_EVICTED;
    unsafe {
        raw::RedisModule_SubscribeToKeyspaceEvents.unwrap()(ctx.ctx, classes, Some(keyspace_cb));
    }
}

extern "C" fn key_event_cb(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    let Some((anyone_waits, f)) = KEY_EVENT_HANDLER.get() else {
        return;
    };
    let info = unsafe { &*data.cast::<raw::RedisModuleKeyInfo>() };
    // Only a hash can be a lock, and only a string a semaphore or latch (which matter only
    // with waiters): everything else is turned away here, before the key's name is even
    // looked at. (For an overwrite this is the old value's type.)
    match unsafe { raw::RedisModule_KeyType.unwrap()(info.key) } as isize {
        raw::REDISMODULE_KEYTYPE_HASH => {}
        raw::REDISMODULE_KEYTYPE_STRING if anyone_waits() => {}
        _ => return,
    }
    let removal = match subevent {
        raw::REDISMODULE_SUBEVENT_KEY_EXPIRED => Removal::Expired,
        raw::REDISMODULE_SUBEVENT_KEY_EVICTED => Removal::Evicted,
        raw::REDISMODULE_SUBEVENT_KEY_OVERWRITTEN => Removal::Overwritten,
        _ => Removal::Deleted,
    };
    let context = Context::new(ctx);
    let name = unsafe { raw::RedisModule_GetKeyNameFromModuleKey.unwrap()(info.key) };
    let db = selected_db(&context);
    f(&context, db, removal, string_bytes(name));
}

/// Where the server has post-notification jobs (Redis 7.2+, Valkey), it also reports every
/// key removed, expired, evicted or overwritten to modules directly (the key server
/// event): subscribes `f` to it and returns true. False on 7.0, which has neither.
/// Strings pass only while `anyone_waits()`.
pub fn subscribe_key_removals(ctx: &Context, anyone_waits: fn() -> bool, f: KeyHandler) -> bool {
    if !has_post_jobs() {
        return false;
    }
    let Some(subscribe) = (unsafe { raw::RedisModule_SubscribeToServerEvent }) else {
        return false;
    };
    let event = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_KEY,
        dataver: raw::REDISMODULE_KEYINFO_VERSION as u64,
    };
    let _ = KEY_EVENT_HANDLER.set((anyone_waits, f));
    unsafe { subscribe(ctx.ctx, event, Some(key_event_cb)) == raw::REDISMODULE_OK as c_int }
}

// ---------------------------------------------------------------------------------------
// Post-notification jobs (Redis 7.2+, Valkey)

/// True where the server runs post-notification jobs. Checked at run time: on 7.0 the
/// function pointer is simply missing.
pub fn has_post_jobs() -> bool {
    unsafe { raw::RedisModule_AddPostNotificationJob }.is_some()
}

static JOB_HANDLER: OnceLock<fn(&Context)> = OnceLock::new();

/// Installs the function every post-notification job runs. Called once from init.
pub fn set_post_job_handler(f: fn(&Context)) {
    let _ = JOB_HANDLER.set(f);
}

extern "C" fn post_job_cb(ctx: *mut raw::RedisModuleCtx, _pd: *mut c_void) {
    let context = Context::new(ctx);
    if let Some(f) = JOB_HANDLER.get() {
        crate::server::guard::quietly(|| f(&context));
    }
}

/// Asks the server to run the job handler once the current command (or expiry, eviction)
/// is done and propagated, still inside it: its writes reach replicas and the AOF after
/// the cause, and no other client runs in between. False where the server has no such
/// jobs, or refuses them (a read-only replica, while loading).
pub fn add_post_job(ctx: &Context) -> bool {
    let Some(add) = (unsafe { raw::RedisModule_AddPostNotificationJob }) else {
        return false;
    };
    unsafe {
        add(ctx.ctx, Some(post_job_cb), ptr::null_mut(), None) == raw::REDISMODULE_OK as c_int
    }
}
