//! The re-entrant lock (RLOCK.*, SPEC 1): Redisson's hash of owner -> hold count, the
//! key's TTL as the lease.
//!
//! - `rule`: the pure algorithm (state in, plan out; no Redis), re-exported here as the
//!   primitive's face (`lock::acquire`, `lock::LockState`, ...).
//! - `commands`: the RLOCK.* handlers and the queued acquire (an `engine::Ask`).

pub mod commands;
mod rule;
pub use rule::*;
