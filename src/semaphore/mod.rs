//! The semaphore (RSEMAPHORE.*, design.md 4.3): a permit count in Redisson's layout, FIFO over
//! waiters (a big request at the head is served before small ones behind it).
//!
//! - `rule`: the pure algorithm, re-exported here, with the plan vocabulary (`Plan`,
//!   `Outcome`, options) that the permit-expirable semaphore and the latch share.
//! - `commands`: the RSEMAPHORE.* handlers and the queued acquire.

pub mod commands;
mod rule;
pub use rule::*;
