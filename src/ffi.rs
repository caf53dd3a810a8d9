//! The only unsafe code of the module: thin RAII wrappers over the Redis module API where
//! redis-module 2.0.8 has no safe (or no binary-safe) wrapper.
//!
//! - [`LockKey`]: an open key, closed on drop; binary-safe hash reads and writes, absolute
//!   expiry. The crate's own hash helpers take `&str` fields, but owner ids are binary.
//! - Blocked clients: `BlockClient` with reply, timeout, free and disconnect callbacks
//!   (the crate's `block_client()` has none of them), and `UnblockClient`.
//! - Timers: create and stop with our own data type (the crate's `stop_timer` casts the
//!   stored box wrongly, see the shared notes).
//! - Pub/sub and a few context helpers.
//!
//! Every function here checks that the server exports the API it calls and degrades
//! instead of unwrapping a missing pointer, which would abort the server.
//!
//! Key calls follow the narrowest contract of the three tested servers (Redis 7.0, Redis
//! 8.2, Valkey 9.1), not the widest: a key's expiry is read only when the key exists
//! (Redis 8 dereferences the value unchecked), and a value is read only through the
//! call of its own type. [`LockKey`] checks the key's type itself before each read, so a
//! caller cannot get this wrong.

use std::ffi::{c_int, c_long, c_void};
use std::os::raw::c_char;
use std::ptr;
use std::sync::OnceLock;

use redis_module::{raw, Context, RedisString};

use crate::reply::Reply;

/// Milliseconds since the epoch by the server's clock (the clock key expiry uses).
pub fn now_ms() -> i64 {
    unsafe { raw::RedisModule_Milliseconds.map_or(0, |f| f()) }
}

/// What a key holds, as far as locks care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Empty,
    Hash,
    String,
    Zset,
    Other,
}

/// An open key, closed when dropped.
pub struct LockKey {
    ctx: *mut raw::RedisModuleCtx,
    key: *mut raw::RedisModuleKey,
}

impl LockKey {
    /// Opens `name` in the context's selected db. Opening may expire the key lazily, which
    /// fires the "expired" notification synchronously, before this returns.
    pub fn open(ctx: &Context, name: &RedisString, write: bool) -> LockKey {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        let key = unsafe { raw::RedisModule_OpenKey.unwrap()(ctx.ctx, name.inner, mode as c_int) };
        LockKey {
            ctx: ctx.ctx,
            key: key.cast(),
        }
    }

    pub fn kind(&self) -> KeyKind {
        if self.key.is_null() {
            return KeyKind::Empty;
        }
        match unsafe { raw::RedisModule_KeyType.unwrap()(self.key) } as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY => KeyKind::Empty,
            raw::REDISMODULE_KEYTYPE_HASH => KeyKind::Hash,
            raw::REDISMODULE_KEYTYPE_STRING => KeyKind::String,
            raw::REDISMODULE_KEYTYPE_ZSET => KeyKind::Zset,
            _ => KeyKind::Other,
        }
    }

    /// Remaining TTL in ms, -1 when the key has no expiry and -2 when there is no key (as
    /// PTTL answers).
    ///
    /// An empty key is answered here, never asked of the server: Redis 8's `GetExpire` and
    /// `GetAbsExpire` read the expiry through the key's value without checking for one, so
    /// on an empty (missing, just deleted) key they dereference NULL and kill the server.
    /// Redis 7.0 and Valkey look the name up and answer "no expiry" instead.
    pub fn pttl(&self) -> i64 {
        if self.kind() == KeyKind::Empty {
            return -2;
        }
        let ttl = unsafe { raw::RedisModule_GetExpire.unwrap()(self.key) };
        if ttl == raw::REDISMODULE_NO_EXPIRE as i64 {
            -1
        } else {
            ttl
        }
    }

    /// The absolute expiry in ms since the epoch, or -1 without one (-2: no key). An empty
    /// key is answered here, as in [`LockKey::pttl`] (Redis 8 would crash on it).
    pub fn abs_expire(&self) -> i64 {
        if self.kind() == KeyKind::Empty {
            return -2;
        }
        match unsafe { raw::RedisModule_GetAbsExpire } {
            Some(get) => {
                let at = unsafe { get(self.key) };
                if at == raw::REDISMODULE_NO_EXPIRE as i64 {
                    -1
                } else {
                    at
                }
            }
            None => match self.pttl() {
                ttl if ttl < 0 => ttl,
                ttl => now_ms() + ttl,
            },
        }
    }

    /// The number of fields of a hash (elements of any other type).
    pub fn value_length(&self) -> usize {
        if self.kind() == KeyKind::Empty {
            return 0;
        }
        unsafe { raw::RedisModule_ValueLength.unwrap()(self.key) }
    }

    /// Calls `f` with the value of one hash field (binary-safe), if the field exists. One
    /// lookup, where reading the whole hash needs a scan cursor and a string per field.
    pub fn hash_get_with<R>(&self, field: &RedisString, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        if self.kind() != KeyKind::Hash {
            return None;
        }
        let mut value: *mut raw::RedisModuleString = ptr::null_mut();
        unsafe {
            raw::RedisModule_HashGet.unwrap()(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                ptr::addr_of_mut!(value),
                ptr::null::<c_char>(),
            );
        }
        if value.is_null() {
            return None;
        }
        let out = f(string_bytes(value));
        unsafe { raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), value) };
        Some(out)
    }

    /// All (field, value) pairs of a hash key.
    pub fn hash_fields(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        extern "C" fn collect(
            _key: *mut raw::RedisModuleKey,
            field: *mut raw::RedisModuleString,
            value: *mut raw::RedisModuleString,
            privdata: *mut c_void,
        ) {
            let out = unsafe { &mut *privdata.cast::<Vec<(Vec<u8>, Vec<u8>)>>() };
            out.push((string_bytes(field).to_vec(), string_bytes(value).to_vec()));
        }
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        if self.kind() != KeyKind::Hash {
            return out;
        }
        unsafe {
            let cursor = raw::RedisModule_ScanCursorCreate.unwrap()();
            while raw::RedisModule_ScanKey.unwrap()(
                self.key,
                cursor,
                Some(collect),
                ptr::addr_of_mut!(out).cast(),
            ) != 0
            {}
            raw::RedisModule_ScanCursorDestroy.unwrap()(cursor);
        }
        out
    }

    /// `HSET key field value` (binary-safe field).
    pub fn hash_set(&self, field: &RedisString, value: &RedisString) {
        unsafe {
            raw::RedisModule_HashSet.unwrap()(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                value.inner,
                ptr::null::<c_char>(),
            );
        }
    }

    /// `HDEL key field` (binary-safe field).
    pub fn hash_del(&self, field: &RedisString) {
        unsafe {
            raw::RedisModule_HashSet.unwrap()(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                raw::REDISMODULE_HASH_DELETE,
                ptr::null::<c_char>(),
            );
        }
    }

    /// The value of a string key (copied out).
    pub fn string_get(&self) -> Vec<u8> {
        if self.kind() != KeyKind::String {
            return Vec::new();
        }
        let mut len: usize = 0;
        unsafe {
            let p = raw::RedisModule_StringDMA.unwrap()(
                self.key,
                &mut len,
                raw::REDISMODULE_READ as c_int,
            );
            if p.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec()
            }
        }
    }

    /// `SET key value` on a key opened for writing.
    pub fn string_set(&self, value: &RedisString) {
        unsafe {
            raw::RedisModule_StringSet.unwrap()(self.key, value.inner);
        }
    }

    /// `ZADD key score member` on a key opened for writing (scores are integer ms, exact
    /// as doubles below 2^53).
    pub fn zset_add(&self, score: i64, member: &RedisString) {
        unsafe {
            raw::RedisModule_ZsetAdd.unwrap()(
                self.key,
                score as f64,
                member.inner,
                ptr::null_mut(),
            );
        }
    }

    /// `ZREM key member` on a key opened for writing.
    pub fn zset_rem(&self, member: &RedisString) {
        let mut deleted: c_int = 0;
        unsafe {
            raw::RedisModule_ZsetRem.unwrap()(self.key, member.inner, &mut deleted);
        }
    }

    /// Every (member, score) of a sorted set, lowest score first (non-integer scores as
    /// i64::MIN; out-of-range ones saturate).
    pub fn zset_items(&self) -> Vec<(Vec<u8>, i64)> {
        let mut out = Vec::new();
        if self.kind() != KeyKind::Zset {
            return out;
        }
        unsafe {
            let first = raw::RedisModule_ZsetFirstInScoreRange.unwrap()(
                self.key,
                f64::NEG_INFINITY,
                f64::INFINITY,
                0,
                0,
            );
            if first == raw::REDISMODULE_OK as c_int {
                while raw::RedisModule_ZsetRangeEndReached.unwrap()(self.key) == 0 {
                    let mut score: f64 = 0.0;
                    let member =
                        raw::RedisModule_ZsetRangeCurrentElement.unwrap()(self.key, &mut score);
                    if member.is_null() {
                        break;
                    }
                    // A score that is no integer reads as i64::MIN, which no primitive
                    // writes and every reader refuses (a spoiled permit set).
                    let score = if score.fract() == 0.0 {
                        score as i64
                    } else {
                        i64::MIN
                    };
                    out.push((string_bytes(member).to_vec(), score));
                    raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), member);
                    if raw::RedisModule_ZsetRangeNext.unwrap()(self.key) == 0 {
                        break;
                    }
                }
            }
            raw::RedisModule_ZsetRangeStop.unwrap()(self.key);
        }
        out
    }

    /// `PERSIST key`: drops the key's TTL.
    pub fn persist(&self) {
        if self.kind() == KeyKind::Empty {
            return;
        }
        unsafe {
            raw::RedisModule_SetExpire.unwrap()(self.key, raw::REDISMODULE_NO_EXPIRE as i64);
        }
    }

    /// Whether the key holds a string.
    pub fn is_string(&self) -> bool {
        !self.key.is_null()
            && unsafe { raw::RedisModule_KeyType.unwrap()(self.key) } as isize
                == raw::REDISMODULE_KEYTYPE_STRING
    }

    pub fn delete(&self) {
        unsafe {
            raw::RedisModule_DeleteKey.unwrap()(self.key);
        }
    }

    /// Sets the absolute expiry (ms since the epoch). Falls back to a relative expiry on a
    /// server without `SetAbsExpire`; the replicated PEXPIREAT is absolute either way.
    pub fn set_abs_expire(&self, at: i64) {
        if self.kind() == KeyKind::Empty {
            return;
        }
        unsafe {
            match raw::RedisModule_SetAbsExpire {
                Some(set_abs) => {
                    set_abs(self.key, at);
                }
                None => {
                    raw::RedisModule_SetExpire.unwrap()(self.key, (at - now_ms()).max(1));
                }
            }
        }
    }
}

impl Drop for LockKey {
    fn drop(&mut self) {
        if !self.key.is_null() {
            unsafe { raw::RedisModule_CloseKey.unwrap()(self.key) };
        }
        let _ = self.ctx;
    }
}

/// The bytes of a module string (valid while the string lives).
fn string_bytes<'a>(s: *const raw::RedisModuleString) -> &'a [u8] {
    let mut len: usize = 0;
    unsafe {
        let p = raw::RedisModule_StringPtrLen.unwrap()(s, &mut len);
        if p.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        }
    }
}

/// The db the context has selected.
pub fn selected_db(ctx: &Context) -> i32 {
    unsafe { raw::RedisModule_GetSelectedDb.unwrap()(ctx.ctx) }
}

/// Selects a db in this context (timer contexts start on db 0).
pub fn select_db(ctx: &Context, db: i32) -> bool {
    unsafe { raw::RedisModule_SelectDb.unwrap()(ctx.ctx, db) == raw::REDISMODULE_OK as c_int }
}

/// Tells WATCH and client-side caching that the key changed. The module turns off Redis's
/// implicit signal on every write-opened key, so that a contended ACQUIRE (which writes
/// nothing) does not abort other clients' transactions.
pub fn signal_modified(ctx: &Context, key: &RedisString) {
    unsafe {
        if let Some(signal) = raw::RedisModule_SignalModifiedKey {
            signal(ctx.ctx, key.inner);
        }
    }
}

pub fn disable_implicit_signal(ctx: &Context) {
    unsafe {
        if let Some(set) = raw::RedisModule_SetModuleOptions {
            set(
                ctx.ctx,
                raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int,
            );
        }
    }
}

/// PUBLISH (or SPUBLISH when `shard`) to subscribers of this server and, in cluster mode,
/// to the cluster bus. Replicas are reached by replicating the command (see store.rs).
pub fn publish(ctx: &Context, channel: &RedisString, message: &RedisString, shard: bool) {
    unsafe {
        let f = if shard {
            raw::RedisModule_PublishMessageShard.or(raw::RedisModule_PublishMessage)
        } else {
            raw::RedisModule_PublishMessage
        };
        if let Some(f) = f {
            f(ctx.ctx, channel.inner, message.inner);
        }
    }
}

/// A keyspace notification, as the plain command would fire it. The event name is a
/// static C string: the crate's wrapper allocates one per call, on every lock write.
pub fn notify(
    ctx: &Context,
    class: redis_module::NotifyEvent,
    event: &std::ffi::CStr,
    key: &RedisString,
) {
    unsafe {
        raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
            ctx.ctx,
            class.bits(),
            event.as_ptr(),
            key.inner,
        );
    }
}

/// A module string holding the decimal form of `n`, without a Rust `String` in between.
pub fn long_string(n: i64) -> RedisString {
    let s = unsafe { raw::RedisModule_CreateStringFromLongLong.unwrap()(ptr::null_mut(), n) };
    RedisString::from_redis_module_string(ptr::null_mut(), s)
}

/// True while clients are paused for writes (CLIENT PAUSE WRITE/ALL, a failover). Redis
/// then keeps expired keys in place while reporting them missing, so a timer that wrote
/// a lock over one would hit an assertion; timers wait for the pause to end instead.
pub fn writes_paused() -> bool {
    unsafe { raw::RedisModule_AvoidReplicaTraffic.is_some_and(|f| f() != 0) }
}

pub fn reply_null(ctx: &Context) {
    unsafe {
        raw::RedisModule_ReplyWithNull.unwrap()(ctx.ctx);
    }
}

pub fn reply_error(ctx: &Context, msg: &str) {
    ctx.reply_error_string(msg);
}

pub fn reply_integer(ctx: &Context, n: i64) {
    unsafe {
        raw::RedisModule_ReplyWithLongLong.unwrap()(ctx.ctx, n);
    }
}

/// Replies with any primitive's [`Reply`] (a woken waiter's, from a callback).
pub fn reply_with(ctx: &Context, reply: &Reply) {
    match reply {
        Reply::Nil => reply_null(ctx),
        Reply::Int(n) => reply_integer(ctx, *n),
        Reply::Bulk(bytes) => unsafe {
            raw::RedisModule_ReplyWithStringBuffer.unwrap()(
                ctx.ctx,
                bytes.as_ptr().cast::<c_char>(),
                bytes.len(),
            );
        },
        Reply::Array(items) => {
            unsafe { raw::RedisModule_ReplyWithArray.unwrap()(ctx.ctx, items.len() as c_long) };
            for item in items {
                reply_with(ctx, item);
            }
        }
    }
}

/// A [`Reply`] as the value a command handler returns.
pub fn value(reply: Reply) -> redis_module::RedisValue {
    use redis_module::RedisValue;
    match reply {
        Reply::Nil => RedisValue::Null,
        Reply::Int(n) => RedisValue::Integer(n),
        Reply::Bulk(bytes) => RedisValue::StringBuffer(bytes),
        Reply::Array(items) => RedisValue::Array(items.into_iter().map(value).collect()),
    }
}

// ---------------------------------------------------------------------------------------
// Blocked clients

/// An opaque blocked-client handle. Every handle must be given back to Redis exactly once
/// with [`unblock`]; `engine.rs` owns them and guarantees that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Blocked(pub usize);

/// What a woken waiter is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// Granted, or its wait ran out: reply this (the primitive decides what).
    Reply(Reply),
    /// Reply with this error.
    Error(std::borrow::Cow<'static, str>),
}

/// Callbacks the blocking glue provides. Plain function pointers keep this module free
/// of lock logic.
pub struct BlockCallbacks {
    /// The client's wait timed out (or CLIENT UNBLOCK): reply and forget the waiter.
    pub on_timeout: fn(&Context, Blocked),
    /// The client went away (or CLIENT UNBLOCK ... ERROR): forget the waiter.
    pub on_disconnect: fn(&Context, Blocked),
    /// The reply of a woken client was sent.
    pub on_replied: fn(Blocked),
}

static CALLBACKS: OnceLock<BlockCallbacks> = OnceLock::new();

/// Installs the blocking callbacks. Called once from the module's init.
pub fn set_block_callbacks(cb: BlockCallbacks) {
    let _ = CALLBACKS.set(cb);
}

fn callbacks() -> Option<&'static BlockCallbacks> {
    CALLBACKS.get()
}

extern "C" fn reply_cb(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let wake = unsafe { raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx) }.cast::<Wake>();
    match unsafe { wake.as_ref() } {
        Some(Wake::Reply(reply)) => reply_with(&context, reply),
        Some(Wake::Error(msg)) => reply_error(&context, msg),
        None => reply_error(&context, crate::errors::ERR_INTERNAL),
    }
    let bc = unsafe { raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx) };
    if let Some(cb) = callbacks() {
        crate::guard::quietly(|| (cb.on_replied)(Blocked(bc as usize)));
    }
    raw::REDISMODULE_OK as c_int
}

extern "C" fn timeout_cb(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let bc = unsafe { raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx) };
    if let Some(cb) = callbacks() {
        crate::guard::quietly(|| (cb.on_timeout)(&context, Blocked(bc as usize)));
    }
    raw::REDISMODULE_OK as c_int
}

extern "C" fn free_privdata_cb(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    if !privdata.is_null() {
        drop(unsafe { Box::from_raw(privdata.cast::<Wake>()) });
    }
}

extern "C" fn disconnect_cb(ctx: *mut raw::RedisModuleCtx, bc: *mut raw::RedisModuleBlockedClient) {
    let context = Context::new(ctx);
    if let Some(cb) = callbacks() {
        crate::guard::quietly(|| (cb.on_disconnect)(&context, Blocked(bc as usize)));
    }
}

/// Blocks the client running the current command, with no Redis-side timeout.
///
/// The module times waits out itself (see `engine::wait`): when Redis times out a client
/// that the module unblocked in the same event-loop turn, it sends no reply at all and the
/// client hangs. The timeout callback stays registered for `CLIENT UNBLOCK`.
pub fn block_client(ctx: &Context) -> Blocked {
    unsafe {
        let bc = raw::RedisModule_BlockClient.unwrap()(
            ctx.ctx,
            Some(reply_cb),
            Some(timeout_cb),
            Some(free_privdata_cb),
            0,
        );
        if let Some(set) = raw::RedisModule_SetDisconnectCallback {
            set(bc, Some(disconnect_cb));
        }
        Blocked(bc as usize)
    }
}

/// Gives a handle back to Redis. With `Some(wake)` the client is answered by the reply
/// callback; with `None` (after a timeout or disconnect) nothing is sent.
pub fn unblock(handle: Blocked, wake: Option<Wake>) {
    let privdata = wake.map_or(ptr::null_mut(), |w| {
        Box::into_raw(Box::new(w)).cast::<c_void>()
    });
    unsafe {
        raw::RedisModule_UnblockClient.unwrap()(
            handle.0 as *mut raw::RedisModuleBlockedClient,
            privdata,
        );
    }
}

// ---------------------------------------------------------------------------------------
// Server events the crate has no wrapper for

static SWAPDB_HANDLER: OnceLock<fn(&Context, i32, i32)> = OnceLock::new();

extern "C" fn swapdb_cb(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
    let context = Context::new(ctx);
    if let Some(f) = SWAPDB_HANDLER.get() {
        crate::guard::quietly(|| f(&context, info.dbnum_first, info.dbnum_second));
    }
}

/// Calls `f(ctx, db1, db2)` after every SWAPDB. Called once from init.
pub fn on_swapdb(ctx: &Context, f: fn(&Context, i32, i32)) {
    let _ = SWAPDB_HANDLER.set(f);
    unsafe {
        if let Some(subscribe) = raw::RedisModule_SubscribeToServerEvent {
            let event = raw::RedisModuleEvent {
                id: raw::REDISMODULE_EVENT_SWAPDB,
                dataver: raw::REDISMODULE_SWAPDBINFO_VERSION as u64,
            };
            subscribe(ctx.ctx, event, Some(swapdb_cb));
        }
    }
}

static CLIENT_GONE_HANDLER: OnceLock<fn(&Context, u64)> = OnceLock::new();

extern "C" fn client_change_cb(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED || data.is_null() {
        return;
    }
    let info = unsafe { &*data.cast::<raw::RedisModuleClientInfo>() };
    let context = Context::new(ctx);
    if let Some(f) = CLIENT_GONE_HANDLER.get() {
        crate::guard::quietly(|| f(&context, info.id));
    }
}

/// Calls `f(ctx, client_id)` whenever a client connection closes (queued tickets live as
/// long as the connection that queued them). Called once from init. The callback runs
/// while the server frees the client: it may only note what to do, not write keys.
pub fn on_client_gone(ctx: &Context, f: fn(&Context, u64)) {
    let _ = CLIENT_GONE_HANDLER.set(f);
    unsafe {
        if let Some(subscribe) = raw::RedisModule_SubscribeToServerEvent {
            let event = raw::RedisModuleEvent {
                id: raw::REDISMODULE_EVENT_CLIENT_CHANGE,
                dataver: raw::REDISMODULE_CLIENTINFO_VERSION as u64,
            };
            subscribe(ctx.ctx, event, Some(client_change_cb));
        }
    }
}

/// The id of the connection running the current command (`CLIENT ID`).
pub fn client_id(ctx: &Context) -> u64 {
    unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(ctx.ctx)) }
}

// ---------------------------------------------------------------------------------------
// Timers

/// A module timer id.
pub type TimerId = u64;

static TIMER_HANDLER: OnceLock<fn(&Context, u64)> = OnceLock::new();

/// Installs the function every timer calls with its `tag`. Called once from init.
pub fn set_timer_handler(f: fn(&Context, u64)) {
    let _ = TIMER_HANDLER.set(f);
}

extern "C" fn timer_cb(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    let context = Context::new(ctx);
    let tag = data as u64;
    if let Some(f) = TIMER_HANDLER.get() {
        crate::guard::quietly(|| f(&context, tag));
    }
}

/// Runs the timer handler with `tag` after `delay_ms`. The tag is carried in the data
/// pointer itself, so a timer owns no memory and stopping one frees nothing.
pub fn create_timer(ctx: &Context, delay_ms: i64, tag: u64) -> TimerId {
    unsafe {
        raw::RedisModule_CreateTimer.unwrap()(
            ctx.ctx,
            delay_ms.max(0),
            Some(timer_cb),
            tag as *mut c_void,
        )
    }
}

pub fn stop_timer(ctx: &Context, id: TimerId) {
    unsafe {
        raw::RedisModule_StopTimer.unwrap()(ctx.ctx, id, ptr::null_mut());
    }
}

/// `RedisModule_Replicate` with the command name as a static C string and a format
/// string, without the per-call `CString` and argument `Vec` of redis-module's
/// `Context::replicate`: replication runs on every lock write, so its allocations show
/// up in profiles (about 9% of an uncontended `RLOCK.ACQUIRE`). Integers go as `l`
/// (long long), so no `RedisString` is built for them either.
pub enum Arg<'a> {
    Str(&'a RedisString),
    Int(i64),
    /// A constant word (an option name such as PXAT).
    Word(&'static std::ffi::CStr),
}

pub fn replicate(ctx: &Context, cmd: &std::ffi::CStr, args: &[Arg]) {
    let Some(f) = (unsafe { raw::RedisModule_Replicate }) else {
        return;
    };
    use std::ffi::c_longlong;
    let c = ctx.ctx;
    let name = cmd.as_ptr();
    unsafe {
        match args {
            [Arg::Str(a)] => f(c, name, c"s".as_ptr(), a.inner),
            [Arg::Str(a), Arg::Str(b)] => f(c, name, c"ss".as_ptr(), a.inner, b.inner),
            [Arg::Str(a), Arg::Int(n)] => f(c, name, c"sl".as_ptr(), a.inner, *n as c_longlong),
            [Arg::Str(a), Arg::Str(b), Arg::Int(n)] => {
                f(c, name, c"ssl".as_ptr(), a.inner, b.inner, *n as c_longlong)
            }
            [Arg::Str(a), Arg::Str(b), Arg::Word(w), Arg::Int(n)] => f(
                c,
                name,
                c"sscl".as_ptr(),
                a.inner,
                b.inner,
                w.as_ptr(),
                *n as c_longlong,
            ),
            _ => unreachable!("no other argument shape is replicated"),
        };
    }
}

/// Replicates `cmd` with any number of string arguments (the effects of the other
/// primitives: ZADD with many members, ...). The fixed shapes of [`replicate`] stay for
/// the lock's hot path, which they keep free of a vector.
pub fn replicate_argv(ctx: &Context, cmd: &std::ffi::CStr, args: &[&RedisString]) {
    let Some(f) = (unsafe { raw::RedisModule_Replicate }) else {
        return;
    };
    let mut argv: Vec<*mut raw::RedisModuleString> = args.iter().map(|a| a.inner).collect();
    unsafe {
        f(
            ctx.ctx,
            cmd.as_ptr(),
            c"v".as_ptr(),
            argv.as_mut_ptr(),
            argv.len(),
        );
    }
}

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
/// replaces one, and is noticed lazily, see events.rs).
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
        crate::guard::quietly(|| f(&context));
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
