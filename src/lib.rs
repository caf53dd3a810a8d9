//! rlock: distributed locks and synchronizers done natively inside Redis.
//!
//! A Redis module whose commands keep Redisson's layouts (the lock: a hash of owner ->
//! hold count with the key's TTL as the lease; the read-write lock, fenced lock,
//! semaphores and countdown latch likewise) and publish Redisson's messages, but run the
//! logic in the server, and let contended clients wait there, first come first served.
//!
//! Layout, top-down (a module imports only modules below it; `grep 'crate::' src/*.rs`):
//! - `lib` (this file): registration, callbacks wired to the engine, INFO's gauges.
//! - One command file per primitive: `cmd_lock` (RLOCK.*), `cmd_fenced` (RFENCED.*, above
//!   `cmd_lock`, whose lock half it reuses), `cmd_rwlock` (RRWLOCK.*), `cmd_semaphore`
//!   (RSEMAPHORE.*), `cmd_expirable` (RPSEMAPHORE.*), `cmd_latch` (RLATCH.*); each also
//!   holds its queued request (an `engine::Ask`). Beside them `cmd` (what they share) and
//!   `events` (keyspace and server events, translated into engine calls).
//! - `engine`: one FIFO queue per key of waiters of any primitive, blocking, deadlines,
//!   the handoff loop, grants taken back, cluster redirection, key timers, the pending
//!   list and the sweep that serve keys freed by DEL, expiry, FLUSH or SWAPDB. Its queues
//!   and handoff name no primitive (they ask the head's `Ask`); only the unlock message
//!   of a freed plain lock (`freed`, `settle`) reads the lock's state.
//! - `store`: reads keys into pure states and writes plans and effects back (replication
//!   as effects, keyspace notifications, WATCH signal), publishes messages, remembers
//!   request ids.
//! - `tracking`: the lock keys the module wrote, and the marker for its own writes.
//! - `cluster` (where a key lives), `stats` (counters), `config`, `guard` (panics become
//!   error replies), `errors`, and `ffi`, the only unsafe code.
//! - Beside them, pure (no Redis): one core per primitive, state in, plan out: `core`
//!   (the lock), `fenced`, `rwlock`, `semaphore` (with the plan vocabulary the sync cores
//!   share), `expirable`, `latch`; `effects` (their writes as plain commands) and `reply`;
//!   `ticket` (a queued ticket's channel, message and names, SPEC 5).

pub mod cluster;
pub mod cmd;
pub mod cmd_expirable;
pub mod cmd_fenced;
pub mod cmd_latch;
pub mod cmd_lock;
pub mod cmd_rwlock;
pub mod cmd_semaphore;
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
pub mod effects;
pub mod expirable;
pub mod fenced;
pub mod latch;
pub mod rwlock;
pub mod semaphore;
pub mod ticket;

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
    // The permit-expirable semaphore's lease timer (engine key timers name no primitive).
    cmd_expirable::init();
    ffi::on_swapdb(ctx, events::on_swapdb);
    // Queued tickets live as long as the connection that queued them.
    ffi::on_client_gone(ctx, engine::on_client_gone);
    events::subscribe(ctx);
    Status::Ok
}

fn info(ctx: &InfoContext, _for_crash_report: bool) {
    let (waiters, tickets, keys_with_waiters) =
        engine::with(|q| (q.total(), q.tickets(), q.keys_with_waiters()));
    let gauges = stats::Gauges {
        waiters,
        tickets,
        keys_with_waiters,
        tracked_locks: tracking::tracked_count(),
    };
    let _ = stats::info(ctx, gauges);
    // Semaphores: lease timers armed (engine key timers), after the counters.
    #[allow(deprecated)]
    ctx.add_info_field_long_long("key_timers", engine::key_timers_armed() as i64);
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
        // Countdown latch (SPEC 4.5). AWAIT changes nothing: readonly (a replica answers
        // it at once, never queues it).
        ["rlatch.trysetcount", cmd_latch::try_set_count, "write deny-oom", 1, 1, 1, ""],
        ["rlatch.countdown", cmd_latch::count_down, "write", 1, 1, 1, ""],
        ["rlatch.getcount", cmd_latch::get_count, "readonly", 1, 1, 1, ""],
        ["rlatch.await", cmd_latch::await_open, "readonly", 1, 1, 1, ""],
        ["rlatch.delete", cmd_latch::delete, "write", 1, 1, 1, ""],
        ["rlatch.info", cmd_latch::info, "readonly", 1, 1, 1, ""],
        // Fenced lock (SPEC 4.2); release, renew, force release and info are RLOCK.*.
        ["rfenced.acquire", cmd_fenced::acquire, "write deny-oom", 1, 1, 1, ""],
        ["rfenced.gettoken", cmd_fenced::get_token, "readonly", 1, 1, 1, ""],
        // Semaphore (SPEC 4.3, docs/sync-commands.md).
        ["rsemaphore.trysetpermits", cmd_semaphore::try_set_permits, "write deny-oom", 1, 1, 1, ""],
        ["rsemaphore.addpermits", cmd_semaphore::add_permits, "write deny-oom", 1, 1, 1, ""],
        ["rsemaphore.acquire", cmd_semaphore::acquire, "write deny-oom", 1, 1, 1, ""],
        ["rsemaphore.release", cmd_semaphore::release, "write", 1, 1, 1, ""],
        ["rsemaphore.drainpermits", cmd_semaphore::drain_permits, "write", 1, 1, 1, ""],
        ["rsemaphore.availablepermits", cmd_semaphore::available_permits, "readonly", 1, 1, 1, ""],
        ["rsemaphore.info", cmd_semaphore::info, "readonly", 1, 1, 1, ""],
        // Permit-expirable semaphore (SPEC 4.4, docs/sync-commands.md).
        ["rpsemaphore.trysetpermits", cmd_expirable::try_set_permits, "write deny-oom", 1, 1, 1, ""],
        ["rpsemaphore.setpermits", cmd_expirable::set_permits, "write deny-oom", 1, 1, 1, ""],
        ["rpsemaphore.addpermits", cmd_expirable::add_permits, "write deny-oom", 1, 1, 1, ""],
        ["rpsemaphore.acquire", cmd_expirable::acquire, "write deny-oom", 1, 1, 1, ""],
        ["rpsemaphore.release", cmd_expirable::release, "write", 1, 1, 1, ""],
        ["rpsemaphore.updateleasetime", cmd_expirable::update_lease_time, "write", 1, 1, 1, ""],
        ["rpsemaphore.leasetime", cmd_expirable::lease_time, "readonly", 1, 1, 1, ""],
        ["rpsemaphore.availablepermits", cmd_expirable::available_permits, "readonly", 1, 1, 1, ""],
        ["rpsemaphore.acquiredpermits", cmd_expirable::acquired_permits, "readonly", 1, 1, 1, ""],
        ["rpsemaphore.info", cmd_expirable::info, "readonly", 1, 1, 1, ""],
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
