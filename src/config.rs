//! Module configs: `CONFIG GET/SET rlock.<name>`, also accepted as `loadmodule` arguments.

use std::sync::atomic::{AtomicI64, Ordering};

/// `rlock.max-waiters-per-key`: how many clients may wait for one lock. Beyond it, a
/// waiting ACQUIRE gets an error instead of growing server memory without bound.
pub static MAX_WAITERS_PER_KEY: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAITERS_PER_KEY);
pub const DEFAULT_MAX_WAITERS_PER_KEY: i64 = 10_000;
pub const MIN_MAX_WAITERS_PER_KEY: i64 = 0;
pub const MAX_MAX_WAITERS_PER_KEY: i64 = 10_000_000;

pub fn max_waiters_per_key() -> usize {
    MAX_WAITERS_PER_KEY.load(Ordering::Relaxed).max(0) as usize
}
