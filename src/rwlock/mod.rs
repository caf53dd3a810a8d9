//! The read-write lock (RRWLOCK.*, design.md 4.1): many readers or one writer, both re-entrant,
//! each read hold with its own lease, no writer starvation; Redisson's layout.
//!
//! - `rule`: the pure algorithm, re-exported here (tests in `tests.rs` and `props.rs`);
//!   `state`: what the lock holds, in Redisson's layout, and how it is read.
//! - `commands`: the RRWLOCK.* handlers and the queued acquire (an `engine::Ask`).

pub mod commands;
mod rule;
mod state;
pub use rule::*;
pub use state::*;
