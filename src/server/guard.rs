//! Panics never cross into Redis: a panic inside a callback would abort redis-server
//! (redis-module has no catch_unwind). A command that panics answers an error instead.

use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::{RedisError, RedisResult};

use crate::vocab::errors::ERR_INTERNAL;

/// Runs a command body; a panic becomes `ERR rlock internal error`. The panic message goes
/// to the server's stderr through the default hook, where the operator can find it.
pub fn command(body: impl FnOnce() -> RedisResult) -> RedisResult {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(Err(RedisError::Str(ERR_INTERNAL)))
}

/// Runs a callback that has no reply to turn a panic into (timers, events, disconnects).
pub fn quietly(body: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(body));
}
