//! The only unsafe code of the module: thin RAII wrappers over the Redis module API where
//! redis-module 2.0.8 has no safe (or no binary-safe) wrapper.
//!
//! - [`LockKey`]: an open key, closed on drop; binary-safe hash reads and writes, absolute
//!   expiry. The crate's own hash helpers take `&str` fields, but owner ids are binary.
//! - Blocked clients: `BlockClient` with reply, timeout, free and disconnect callbacks
//!   (the crate's `block_client()` has none of them), and `UnblockClient`.
//! - Timers: create and stop with our own data type (the crate's `stop_timer` casts the
//!   stored box wrongly, see the shared notes).
//! - Replication: plain effects, or one command per unit of work (`replication.rs`).
//! - Commands: registered with an entry point that lends each call the server's own
//!   argument strings (`commands.rs`), and described for COMMAND DOCS (`docs.rs`).
//! - Options: what the module declares it handles (`options.rs`).
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
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicPtr, AtomicUsize};
use std::sync::OnceLock;

use redis_module::{raw, Context, RedisString};

use crate::vocab::reply::Reply;

/// Milliseconds since the epoch by the server's clock (the clock key expiry uses).
pub fn now_ms() -> i64 {
    unsafe { raw::RedisModule_Milliseconds.map_or(0, |f| f()) }
}

/// The bytes of a module string (valid while the string lives).
pub(super) fn string_bytes<'a>(s: *const raw::RedisModuleString) -> &'a [u8] {
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
/// implicit signal on every write-opened key (`NO_IMPLICIT_SIGNAL_MODIFIED`, declared in
/// `options.rs`), so that a contended ACQUIRE (which writes
/// nothing) does not abort other clients' transactions.
pub fn signal_modified(ctx: &Context, key: &RedisString) {
    unsafe {
        if let Some(signal) = raw::RedisModule_SignalModifiedKey {
            signal(ctx.ctx, key.inner);
        }
    }
}

/// PUBLISH (or SPUBLISH when `shard`) to subscribers of this server and, in cluster mode,
/// to the cluster bus. Replicas are reached by replicating the command (see server/store.rs).
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

/// How many clients of this node listen on `channel`: `PUBSUB SHARDNUMSUB` for a shard
/// channel (cluster mode, where messages go out with SPUBLISH), else `PUBSUB NUMSUB`
/// (pattern subscribers are not counted, as Redisson's waiters subscribe to the channel
/// itself). 0 if the server cannot tell. A nested call: asked only where a handoff could
/// starve a script-side waiter (engine/turns.rs), at most once per window and key.
pub fn subscribers(ctx: &Context, channel: &[u8], shard: bool) -> i64 {
    let sub = if shard { c"SHARDNUMSUB" } else { c"NUMSUB" };
    unsafe {
        let channel = raw::RedisModule_CreateString.unwrap()(
            ptr::null_mut(),
            channel.as_ptr().cast::<c_char>(),
            channel.len(),
        );
        let reply = raw::RedisModule_Call.unwrap()(
            ctx.ctx,
            c"PUBSUB".as_ptr(),
            c"cs".as_ptr(),
            sub.as_ptr(),
            channel,
        );
        raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), channel);
        if reply.is_null() {
            return 0;
        }
        // [channel, count]
        let count = if raw::RedisModule_CallReplyType.unwrap()(reply)
            == raw::REDISMODULE_REPLY_ARRAY as c_int
            && raw::RedisModule_CallReplyLength.unwrap()(reply) == 2
        {
            let n = raw::RedisModule_CallReplyArrayElement.unwrap()(reply, 1);
            if n.is_null() {
                0
            } else {
                raw::RedisModule_CallReplyInteger.unwrap()(n)
            }
        } else {
            0
        };
        raw::RedisModule_FreeCallReply.unwrap()(reply);
        count
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

/// Counts below this are written from strings made once (see [`with_count_string`]).
const SMALL_COUNTS: usize = 16;

/// Runs `f` with a module string holding the decimal form of `n`. A lock's hold count is
/// almost always small and is written on every acquire and release: 1 to 15 come from
/// strings made once, not one made and freed per call (a fortieth of an uncontended
/// RLOCK.ACQUIRE). The server copies a value's bytes into the hash and keeps no reference
/// to the string.
pub fn with_count_string<R>(n: i64, f: impl FnOnce(&RedisString) -> R) -> R {
    thread_local! {
        // Redis calls modules on its main thread only.
        static SMALL: [std::cell::OnceCell<RedisString>; SMALL_COUNTS] =
            const { [const { std::cell::OnceCell::new() }; SMALL_COUNTS] };
    }
    match usize::try_from(n) {
        Ok(i) if (1..SMALL_COUNTS).contains(&i) => {
            SMALL.with(|small| f(small[i].get_or_init(|| long_string(n))))
        }
        _ => f(&long_string(n)),
    }
}

/// At most this many words are kept (see [`kept_string`]); the layouts use a handful.
const KEPT_WORDS: usize = 32;

// The kept words (address, length) and their strings, in statics read by plain loads: a
// thread-local's lookup and borrow were half the cost of finding a word. Atomics only so
// that they may be statics: Redis calls modules on its main thread alone.
static KEPT_AT: [AtomicPtr<u8>; KEPT_WORDS] =
    [const { AtomicPtr::new(ptr::null_mut()) }; KEPT_WORDS];
static KEPT_LEN: [AtomicUsize; KEPT_WORDS] = [const { AtomicUsize::new(0) }; KEPT_WORDS];
static KEPT_STR: [AtomicPtr<RedisString>; KEPT_WORDS] =
    [const { AtomicPtr::new(ptr::null_mut()) }; KEPT_WORDS];
static KEPT_COUNT: AtomicUsize = AtomicUsize::new(0);

/// A module string of a word that lives as long as the module (a layout's `mode`,
/// `write`, `1`), made on its first use and lent on every later one, as
/// [`with_count_string`] does for counts: a new RW lock writes three such words, and
/// making and freeing a string for each was a tenth of its cost. Found by the word's
/// address (a constant's bytes stay where they are; the same word at two addresses takes
/// two entries). `None` once `KEPT_WORDS` are kept (the caller makes a string of its
/// own), so the table stays bounded whatever the callers pass. The strings are never
/// freed: they are few and small, like `with_count_string`'s.
pub fn kept_string(word: &'static [u8]) -> Option<&'static RedisString> {
    let n = KEPT_COUNT.load(Relaxed);
    for i in 0..n {
        if KEPT_AT[i].load(Relaxed).cast_const() == word.as_ptr()
            && KEPT_LEN[i].load(Relaxed) == word.len()
        {
            // Stored below from a leaked box: valid for the module's life, and only this
            // thread reads it.
            return Some(unsafe { &*KEPT_STR[i].load(Relaxed) });
        }
    }
    if n >= KEPT_WORDS {
        return None;
    }
    let s: &'static RedisString = Box::leak(Box::new(RedisString::create_from_slice(
        ptr::null_mut(),
        word,
    )));
    KEPT_STR[n].store(ptr::from_ref(s).cast_mut(), Relaxed);
    KEPT_AT[n].store(word.as_ptr().cast_mut(), Relaxed);
    KEPT_LEN[n].store(word.len(), Relaxed);
    KEPT_COUNT.store(n + 1, Relaxed);
    Some(s)
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

mod clients;
mod commands;
mod docs;
mod events;
mod key;
mod options;
mod replication;
mod timers;

pub use clients::*;
pub use commands::*;
pub use docs::*;
pub use events::*;
pub use key::*;
pub use options::*;
pub use replication::*;
pub use timers::*;
