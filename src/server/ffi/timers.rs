//! Module timers with our own data (create, stop). A child of `ffi`.

use super::*;

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
        crate::server::guard::quietly(|| f(&context, tag));
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
