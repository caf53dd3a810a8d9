//! The fenced lock (RFENCED.*, design.md 4.2): the lock plus a fencing token that only ever
//! increases, across restarts and failovers (a hybrid logical clock in Redisson's token key).
//!
//! - `rule`: the pure algorithm, re-exported here; it builds on the lock's rule.
//! - `commands`: RFENCED.ACQUIRE and RFENCED.GETTOKEN (release, renew and info are RLOCK.*).

pub mod commands;
mod rule;
pub use rule::*;
