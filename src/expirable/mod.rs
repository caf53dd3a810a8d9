//! The permit-expirable semaphore (RPSEMAPHORE.*, design.md 4.4): permits with ids and leases,
//! returned to the pool at their expiry by a module key timer; Redisson's layout.
//!
//! - `rule`: the pure algorithm, re-exported here (tests in `tests.rs`).
//! - `commands`: the RPSEMAPHORE.* handlers, the queued acquire and the lease timer.

pub mod commands;
mod rule;
pub use rule::*;
