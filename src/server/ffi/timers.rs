//! Module timers with our own data (create, stop) and replication of commands. A child
//! of `ffi`.

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

/// Replicates `pipeline` with any number of string arguments (the effects of the other
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
