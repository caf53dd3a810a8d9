//! What every primitive's command file shares: argument slicing, error mapping, the
//! request-id record (replay before doing anything, remember after a change), and the
//! "may this client block?" test.
//!
//! Layer: the top, beside the command files (`cmd_lock`, ...) that use it; calls down into
//! `engine` and `store` only.

use redis_module::{Context, ContextFlags, RedisError, RedisString, RedisValue};

use crate::core;
use crate::engine;
use crate::ffi;
use crate::reply::Reply;
use crate::store;

/// A named error constant (`errors.rs`) as a command's error reply.
pub fn err(msg: &'static str) -> RedisError {
    RedisError::Str(msg)
}

/// The arguments after the key, as bytes, for the cores' parsers.
pub fn args_after_key(args: &[RedisString]) -> Vec<&[u8]> {
    args[2..].iter().map(RedisString::as_slice).collect()
}

/// The key remembering a request id's reply, if the call has an id. It is named after the
/// primitive's key, so it lives in the key's cluster slot.
pub fn request_key(name: &RedisString, id: Option<&[u8]>) -> Option<RedisString> {
    id.map(|id| {
        RedisString::create_from_slice(
            std::ptr::null_mut(),
            &core::request_key(name.as_slice(), id),
        )
    })
}

/// The first reply of a call retried with the same request id, if it is remembered.
pub fn replay(ctx: &Context, request: Option<&RedisString>) -> Option<RedisValue> {
    request
        .and_then(|req| store::remembered(ctx, req))
        .map(ffi::value)
}

/// Remembers a call's reply under its request id (when it has one and `changed` says the
/// call changed something: re-running a call that changed nothing is as good as a replay).
pub fn remember(ctx: &Context, request: Option<&RedisString>, changed: bool, reply: &Reply) {
    if let Some(req) = request.filter(|_| changed) {
        store::remember(ctx, req, reply, ffi::now_ms());
    }
}

/// Where a client may not block (MULTI/EXEC, scripts, replicated or loading streams,
/// deny-blocking contexts), WAIT is ignored and the command answers at once.
pub fn may_block(ctx: &Context) -> bool {
    let no = ContextFlags::MULTI
        | ContextFlags::LUA
        | ContextFlags::DENY_BLOCKING
        | ContextFlags::REPLICATED
        | ContextFlags::LOADING;
    !ctx.get_flags().intersects(no)
}

/// Serves a key's queue before a command looks at it, if anybody waits: a key freed a
/// moment ago (DEL, expiry, a permit's lease) whose handoff is still pending goes to the
/// first waiter, so no command barges past the queue.
pub fn serve_first(ctx: &Context, db: i32, name: &RedisString) {
    if engine::has_waiters(db, name.as_slice()) {
        engine::serve(ctx, db, name, engine::Path::Command);
    }
}

/// An `…INFO` reply of integers (semaphores): an ordered map, a map under RESP3 and flat
/// pairs under RESP2, keys in a stable order.
pub fn int_map(fields: &[(&str, i64)]) -> RedisValue {
    RedisValue::OrderedMap(
        fields
            .iter()
            .map(|&(k, v)| {
                (
                    redis_module::redisvalue::RedisValueKey::String(k.into()),
                    RedisValue::Integer(v),
                )
            })
            .collect(),
    )
}
