//! rlock: distributed locks done natively inside Redis.
//!
//! A Redis module whose commands keep Redisson's lock layout (a hash of owner -> hold
//! count, the key's TTL as the lease, the same unlock channel and message) but run the
//! lock logic in the server, and let contended clients wait there, first come first served.
//!
//! Layout, top-down (a module imports only modules below it; `grep 'crate::' src/*.rs`):
//! - `lib` (this file): registration, callbacks wired to the engine, INFO's gauges.
//! - `commands` (RLOCK.* handlers; `cmd_rwlock`, RRWLOCK.*) and `events` (keyspace and server events, translated
//!   into engine calls); neither imports the other.
//! - `engine`: one FIFO queue per key of waiters of any primitive, blocking, deadlines,
//!   the handoff loop, grants taken back, cluster redirection, the pending list and the
//!   sweep that serve keys freed by DEL, expiry, FLUSH or SWAPDB.
//! - `store`: reads keys into pure states and writes plans back (replication, keyspace
//!   notifications, WATCH signal), publishes unlock messages, remembers request ids.
//! - `tracking`: the lock keys the module wrote, and the marker for its own writes.
//! - `cluster` (where a key lives), `stats` (counters), `config`, `guard` (panics become
//!   error replies), `errors`, and `ffi`, the only unsafe code.
//! - Beside them, pure (no Redis): `core`, the lock's rules, state in, plan out; and the
//!   cores of the other primitives (`rwlock`, wired by `cmd_rwlock`; `fenced`,
//!   `semaphore`, `expirable`, `latch`), with `effects`.

pub mod cluster;
pub mod cmd;
pub mod cmd_lock;
pub mod cmd_rwlock;
pub mod config;
pub mod core;
pub mod engine;
pub mod errors;
pub mod events;
pub mod ffi;
pub mod guard;
pub mod reply;
pub mod stats;
pub mod store;
pub mod tracking;

// Pure cores of the other Redisson synchronizers (SPEC 4), and their write vocabulary.
// `rwlock` is wired by `cmd_rwlock` (RRWLOCK.*); the others by their command files.
pub mod effects;
pub mod expirable;
pub mod fenced;
pub mod latch;
pub mod rwlock;
pub mod semaphore;

use redis_module::configuration::ConfigurationFlags;
use redis_module::{redis_module, Context, InfoContext, RedisResult, RedisString, Status};

// Redis's allocator in the server, so that `used_memory` and MEMORY USAGE see the module;
// the system allocator under `cargo test`, where there is no server to allocate from.
#[cfg(not(test))]
type Allocator = redis_module::alloc::RedisAlloc;
#[cfg(not(test))]
const ALLOCATOR: Allocator = redis_module::alloc::RedisAlloc;
#[cfg(test)]
type Allocator = std::alloc::System;
#[cfg(test)]
const ALLOCATOR: Allocator = std::alloc::System;

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    ffi::disable_implicit_signal(ctx);
    ffi::set_block_callbacks(ffi::BlockCallbacks {
        on_timeout: engine::on_timeout,
        on_disconnect: engine::on_disconnect,
        on_replied: engine::on_replied,
    });
    ffi::set_timer_handler(engine::on_timer);
    ffi::on_swapdb(ctx, events::on_swapdb);
    events::subscribe(ctx);
    Status::Ok
}

fn info(ctx: &InfoContext, _for_crash_report: bool) {
    let (waiters, keys_with_waiters) = engine::with(|q| (q.total(), q.keys_with_waiters()));
    let gauges = stats::Gauges {
        waiters,
        keys_with_waiters,
        tracked_locks: tracking::tracked_count(),
    };
    let _ = stats::info(ctx, gauges);
}

redis_module! {
    name: "rlock",
    version: 1,
    allocator: (Allocator, ALLOCATOR),
    data_types: [],
    init: init,
    info: info,
    commands: [
        // Key at position 1 and nowhere else, so Redis Cluster routes every command.
        // On 7.0 module commands get no ACL category (see the README's ACL note).
        ["rlock.acquire", cmd_lock::acquire, "write deny-oom", 1, 1, 1, ""],
        ["rlock.release", cmd_lock::release, "write", 1, 1, 1, ""],
        ["rlock.renew", cmd_lock::renew, "write", 1, 1, 1, ""],
        ["rlock.forcerelease", cmd_lock::force_release, "write", 1, 1, 1, ""],
        ["rlock.info", cmd_lock::info, "readonly", 1, 1, 1, ""],
        // Read-write lock (SPEC 4.1)
        ["rrwlock.acquire", cmd_rwlock::acquire, "write deny-oom", 1, 1, 1, ""],
        ["rrwlock.release", cmd_rwlock::release, "write", 1, 1, 1, ""],
        ["rrwlock.renew", cmd_rwlock::renew, "write", 1, 1, 1, ""],
        ["rrwlock.forcerelease", cmd_rwlock::force_release, "write", 1, 1, 1, ""],
        ["rrwlock.info", cmd_rwlock::info, "readonly", 1, 1, 1, ""],
    ],
    configurations: [
        i64: [
            ["max-waiters-per-key", &config::MAX_WAITERS_PER_KEY, config::DEFAULT_MAX_WAITERS_PER_KEY,
             config::MIN_MAX_WAITERS_PER_KEY, config::MAX_MAX_WAITERS_PER_KEY, ConfigurationFlags::DEFAULT, None],
            ["request-id-window-ms", &config::REQUEST_ID_WINDOW_MS, config::DEFAULT_REQUEST_ID_WINDOW_MS,
             config::MIN_REQUEST_ID_WINDOW_MS, config::MAX_REQUEST_ID_WINDOW_MS, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [],
        enum: [],
        module_args_as_configuration: true,
    ]
}
