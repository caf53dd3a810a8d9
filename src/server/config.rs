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

/// `rlock.request-id-window-ms`: how long the first reply of a call made with
/// `ID request-id` is remembered, so that a retry within it is answered without being
/// applied twice.
pub static REQUEST_ID_WINDOW_MS: AtomicI64 = AtomicI64::new(DEFAULT_REQUEST_ID_WINDOW_MS);
pub const DEFAULT_REQUEST_ID_WINDOW_MS: i64 = 60_000;
pub const MIN_REQUEST_ID_WINDOW_MS: i64 = 1;
pub const MAX_REQUEST_ID_WINDOW_MS: i64 = 86_400_000;

pub fn request_id_window_ms() -> i64 {
    REQUEST_ID_WINDOW_MS.load(Ordering::Relaxed)
}
