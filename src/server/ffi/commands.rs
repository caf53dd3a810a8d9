//! Command registration and dispatch: how a server call reaches a command function, and
//! what runs once its reply is written. A child of `ffi`.
//!
//! redis-module's `redis_module!` command list hands each call a `Vec<RedisString>` made
//! by retaining every argument and frees them after: a vector and a reference count up
//! and down per argument, about 540 instructions per call (a twentieth of an uncontended
//! semaphore acquire). Here a command gets the server's own argument strings as a slice,
//! borrowed for the call (the server holds them until the command returns), from a
//! buffer on the stack.

use std::cell::Cell;
use std::ffi::CStr;
use std::mem::ManuallyDrop;
use std::sync::OnceLock;

use redis_module::{RedisResult, Status};

use super::*;

/// What a command function is: its context and its arguments (the name first).
pub type Handler = fn(&Context, &[RedisString]) -> RedisResult;

/// The server's C entry point of one command.
pub type Entry =
    extern "C" fn(*mut raw::RedisModuleCtx, *mut *mut raw::RedisModuleString, c_int) -> c_int;

thread_local! {
    /// How many of the module's commands are running (more than one only when a command
    /// calls another through the server): work deferred "until after the reply" runs as
    /// the outermost one returns.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

static AFTER_REPLY: OnceLock<fn(&Context)> = OnceLock::new();

/// Installs what runs after each of the module's commands has written its reply (once,
/// from init): the engine's deferred publishes (engine/serve.rs).
pub fn set_after_reply_handler(f: fn(&Context)) {
    let _ = AFTER_REPLY.set(f);
}

/// True while one of the module's commands runs, so its reply is still to be written.
pub fn in_command() -> bool {
    DEPTH.with(|d| d.get() != 0)
}

/// Marks a command's call for its lifetime, the reply included (see [`in_command`]).
struct InCommand(());

impl InCommand {
    fn enter() -> InCommand {
        DEPTH.with(|d| d.set(d.get() + 1));
        InCommand(())
    }
}

impl Drop for InCommand {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Runs `handler` on a call and replies with its result, then runs the after-reply
/// handler (the outermost command only). Called by each command's entry
/// point (see `lib.rs`) with the pointers the server called it with, and nothing else:
/// not `unsafe` to call, so that the entry points (outside `ffi`) hold no unsafe code.
pub fn dispatch(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: Handler,
) -> c_int {
    let context = Context::new(ctx);
    let status = {
        let _in = InCommand::enter();
        call(&context, argv, argc, handler)
    };
    if !in_command() {
        if let Some(after) = AFTER_REPLY.get() {
            after(&context);
        }
    }
    status
}

/// [`dispatch`]'s call: the handler on the borrowed arguments, and its reply.
fn call(
    context: &Context,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: Handler,
) -> c_int {
    let argv: &[*mut raw::RedisModuleString] = match usize::try_from(argc) {
        Ok(n) if !argv.is_null() => unsafe { std::slice::from_raw_parts(argv, n) },
        _ => &[],
    };
    // The strings are the server's, alive for the whole call: wrapped without a retain,
    // and never dropped (ManuallyDrop), so never freed here. A command that keeps one
    // beyond the call clones it (`safe_clone` retains).
    let borrow = |s: *mut raw::RedisModuleString| {
        ManuallyDrop::new(RedisString::from_redis_module_string(ptr::null_mut(), s))
    };
    const INLINE: usize = 16;
    let result = if argv.len() <= INLINE {
        let mut buf: [ManuallyDrop<RedisString>; INLINE] =
            std::array::from_fn(|_| borrow(ptr::null_mut()));
        for (slot, &s) in buf.iter_mut().zip(argv) {
            *slot = borrow(s);
        }
        handler(context, as_strings(&buf[..argv.len()]))
    } else {
        let args: Vec<ManuallyDrop<RedisString>> = argv.iter().map(|&s| borrow(s)).collect();
        handler(context, as_strings(&args))
    };
    context.reply(result) as c_int
}

/// `ManuallyDrop<T>` has `T`'s layout (repr(transparent)): the same slice, seen as the
/// strings themselves. Dropping the view drops nothing.
fn as_strings(s: &[ManuallyDrop<RedisString>]) -> &[RedisString] {
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<RedisString>(), s.len()) }
}

/// Registers a command (during load): name, entry point, flags, first key, last key,
/// key step, as `RedisModule_CreateCommand` takes them.
pub fn create_command(
    ctx: &Context,
    name: &CStr,
    entry: Entry,
    flags: &CStr,
    keys: (c_int, c_int, c_int),
) -> Status {
    let Some(create) = (unsafe { raw::RedisModule_CreateCommand }) else {
        return Status::Err;
    };
    let (first, last, step) = keys;
    let r = unsafe {
        create(
            ctx.ctx,
            name.as_ptr(),
            Some(entry),
            flags.as_ptr(),
            first,
            last,
            step,
        )
    };
    if r == raw::REDISMODULE_OK as c_int {
        Status::Ok
    } else {
        ctx.log_warning(&format!("rlock: could not create the command {name:?}"));
        Status::Err
    }
}
