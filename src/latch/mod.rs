//! The countdown latch (RLATCH.*, design.md 4.5): every awaiter released in the turn the count
//! reaches zero; Redisson's zero message published for Java waiters.
//!
//! - `rule`: the pure algorithm, re-exported here.
//! - `commands`: the RLATCH.* handlers and the queued await.

pub mod commands;
mod rule;
pub use rule::*;
