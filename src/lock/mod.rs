//! The re-entrant lock (RLOCK.*, design.md 1): Redisson's hash of owner -> hold count, the
//! key's TTL as the lease.
//!
//! - `rule`: the pure algorithm (state in, plan out; no Redis), re-exported here as the
//!   primitive's face (`lock::acquire`, `lock::LockState`, ...).
//! - `store`: the lock hash read into a `LockState` and a plan written back (the key API,
//!   the hot path), the unlock message, a freed lock served.
//! - `commands`: the RLOCK.* handlers on the pipeline and the queued acquire (an
//!   `engine::Ask`).

pub mod commands;
mod rule;
pub mod store;
pub use rule::*;
