//! The sans-IO core of the client: what to send, what a reply means, what a handle knows.
//! No connection and no clock of its own here; `aio` (and through it `blocking`) runs it.
//!
//! - `cmd`: command builders and reply parsers.
//! - `hello`: the capability probe (`RLOCK.HELLO`) and what its answer allows.
//! - `logic`: the decisions of an acquire and a release (route, retry, backoff).
//! - `state`: one handle's hold state and the lost-lock signal.
//! - `watchdog`: the renewal registry (what is due, what an outcome means).
//! - `backoff`: jitter for retry delays and owner ids.
//! - `replicas`: how many replicas a key's node has (replica sync's default).
//! - `scripts`: scripts mode's Redisson scripts, names and argument reading.

pub(crate) mod backoff;
pub(crate) mod cmd;
pub mod hello;
pub(crate) mod logic;
pub(crate) mod replicas;
pub(crate) mod scripts;
pub(crate) mod state;
pub(crate) mod watchdog;
