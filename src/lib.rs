//! rlock: distributed locks done natively inside Redis.
//!
//! A Redis module whose commands keep Redisson's lock layout (a hash of owner -> hold
//! count, the key's TTL as the lease, the same unlock channel and message) but run the
//! lock logic in the server, and let contended clients wait there, first come first served.
//!
//! Layout: `core` is the pure algorithm; `commands` the handlers; `store` reads and writes
//! keys; `waiters` queues and hands off; `events` watches the keyspace; `ffi` holds the only
//! unsafe code; `config`, `stats` and `errors` are what their names say.

pub mod cluster;
pub mod commands;
pub mod config;
pub mod core;
pub mod errors;
pub mod events;
pub mod ffi;
pub mod guard;
pub mod stats;
pub mod store;
pub mod waiters;

// Pure cores of the other Redisson synchronizers (SPEC 4), and their write vocabulary.
// Not wired to commands yet: the shared waiting engine comes first (issue 12).
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
        on_timeout: waiters::on_timeout,
        on_disconnect: waiters::on_disconnect,
        on_replied: waiters::on_replied,
    });
    ffi::set_timer_handler(events::on_timer);
    ffi::on_swapdb(ctx, events::on_swapdb);
    events::subscribe(ctx);
    Status::Ok
}

fn info(ctx: &InfoContext, for_crash_report: bool) {
    let _ = stats::info(ctx, for_crash_report);
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
        ["rlock.acquire", commands::acquire, "write deny-oom", 1, 1, 1, ""],
        ["rlock.release", commands::release, "write", 1, 1, 1, ""],
        ["rlock.renew", commands::renew, "write", 1, 1, 1, ""],
        ["rlock.forcerelease", commands::force_release, "write", 1, 1, 1, ""],
        ["rlock.info", commands::info, "readonly", 1, 1, 1, ""],
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
