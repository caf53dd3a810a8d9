//! Every way into the module from Redis runs through here: a command, a timer, an event,
//! a blocked client's callback. Two things are done for each, written once:
//! - panics never cross into Redis: a panic inside a callback would abort redis-server
//!   (redis-module has no catch_unwind). A command that panics answers an error instead.
//! - each is one unit of work for replication: under `rlock.replication commands` its
//!   writes go out as one command when it ends (see `ffi::replication`).

use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{RedisError, RedisResult};

use crate::server::ffi;
use crate::vocab::errors::ERR_INTERNAL;

/// Runs a command body; a panic becomes `ERR rlock internal error`. The panic message goes
/// to the server's stderr through the default hook, where the operator can find it.
pub fn command(body: impl FnOnce() -> RedisResult) -> RedisResult {
    ffi::unit_enter();
    let result = catch_unwind(AssertUnwindSafe(body));
    // Sent even after a panic: whatever was written before it must reach replicas too.
    ffi::unit_leave();
    result.unwrap_or(Err(RedisError::Str(ERR_INTERNAL)))
}

/// Runs a callback that has no reply to turn a panic into (timers, events, disconnects).
pub fn quietly(body: impl FnOnce()) {
    ffi::unit_enter();
    let _ = catch_unwind(AssertUnwindSafe(body));
    ffi::unit_leave();
}
