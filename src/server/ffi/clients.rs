//! Blocked clients (block with reply, timeout, free and disconnect callbacks; unblock)
//! and the server events the crate has no wrapper for (SWAPDB, a client gone; subscribed in
//! events.rs). A child of `ffi`.

use super::*;

// ---------------------------------------------------------------------------------------
// Blocked clients

/// An opaque blocked-client handle. Every handle must be given back to Redis exactly once
/// with [`unblock`]; `engine` owns them and guarantees that.
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
        None => reply_error(&context, crate::vocab::errors::ERR_INTERNAL),
    }
    let bc = unsafe { raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx) };
    if let Some(cb) = callbacks() {
        crate::server::guard::quietly(|| (cb.on_replied)(Blocked(bc as usize)));
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
        crate::server::guard::quietly(|| (cb.on_timeout)(&context, Blocked(bc as usize)));
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
        crate::server::guard::quietly(|| (cb.on_disconnect)(&context, Blocked(bc as usize)));
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

pub(super) extern "C" fn swapdb_cb(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut c_void,
) {
    let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
    let _in = InEvent::enter();
    let context = Context::new(ctx);
    if let Some(f) = SWAPDB_HANDLER.get() {
        crate::server::guard::quietly(|| f(&context, info.dbnum_first, info.dbnum_second));
    }
}

/// Calls `f(ctx, db1, db2)` after every SWAPDB while [`Hook::SwapDb`] is hooked
/// (engine/events.rs decides when). Called once from init.
pub fn on_swapdb(f: fn(&Context, i32, i32)) {
    let _ = SWAPDB_HANDLER.set(f);
}

static CLIENT_GONE_HANDLER: OnceLock<fn(&Context, u64)> = OnceLock::new();

pub(super) extern "C" fn client_change_cb(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED || data.is_null() {
        return;
    }
    let info = unsafe { &*data.cast::<raw::RedisModuleClientInfo>() };
    let _in = InEvent::enter();
    let context = Context::new(ctx);
    if let Some(f) = CLIENT_GONE_HANDLER.get() {
        crate::server::guard::quietly(|| f(&context, info.id));
    }
}

/// Calls `f(ctx, client_id)` whenever a client connection closes while
/// [`Hook::ClientChange`] is hooked (queued tickets live as long as the connection that
/// queued them; engine/events.rs hooks it while any may be queued). Called once from init.
/// The callback runs while the server frees the client: it may only note what to do, not
/// write keys.
pub fn on_client_gone(f: fn(&Context, u64)) {
    let _ = CLIENT_GONE_HANDLER.set(f);
}

/// The id of the connection running the current command (`CLIENT ID`).
pub fn client_id(ctx: &Context) -> u64 {
    unsafe { raw::RedisModule_GetClientId.map_or(0, |f| f(ctx.ctx)) }
}
