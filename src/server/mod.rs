//! What talks to Redis. Everything else in the module reaches the server through here.
//!
//! - `ffi`: the only unsafe code; RAII wrappers over the module API (keys, blocked
//!   clients, timers, server events, replication, pub/sub).
//! - `store`: reads keys into the primitives' pure states and writes their plans and
//!   effects back (replication, keyspace notifications, WATCH), publishes messages,
//!   remembers request ids.
//! - `replication`: `RLOCK.APPLY`, how a replica or an AOF reload applies the one command
//!   a module command replicates (`rlock.replication commands`).
//! - `tracking`: the lock keys the module wrote, and the marker for its own writes.
//! - `docs`: commands.json, read for COMMAND DOCS (registered through `ffi`).
//! - `hello`: `RLOCK.HELLO`, the module's name, version, protocol and features.
//! - `cluster`: where a key lives (redirections for waiters whose slot moved).
//! - `config` (module configs), `stats` (the `INFO rlock` counters), `guard` (a panic
//!   becomes an error reply).

pub mod cluster;
pub mod config;
pub mod docs;
pub mod ffi;
pub mod guard;
pub mod hello;
pub mod replication;
pub mod stats;
pub mod store;
pub mod tracking;
