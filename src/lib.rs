//! rlock: distributed locks and synchronizers done natively inside Redis.
//!
//! A Redis module whose commands keep Redisson's layouts (the lock: a hash of owner ->
//! hold count with the key's TTL as the lease; the read-write lock, fenced lock,
//! semaphores and countdown latch likewise) and publish Redisson's messages, but run the
//! logic in the server, and let contended clients wait there, first come first served.
//!
//! Layout: folders by layer, top-down; a layer imports only the layers below it
//! (`grep -rn 'crate::' src` shows every arrow).
//! - `lib` (this file): the registration table (every command with its flags and key
//!   positions), callbacks wired to the engine, INFO's gauges.
//! - One folder per primitive, each with the same two rooms: `rule` (the pure algorithm,
//!   state in, plan out, no Redis) and `commands` (its handlers, declared on the pipeline:
//!   a parser and a plan; and its queued request, an `engine::Ask`, whose `check` is the
//!   grant rule): [`lock`] (RLOCK.*, with `store`, its hash read and written on the key
//!   API), [`fenced`] (RFENCED.*, on the lock's rule and store), [`rwlock`] (RRWLOCK.*),
//!   [`semaphore`] (RSEMAPHORE.*, and the plan vocabulary the two below share),
//!   [`expirable`] (RPSEMAPHORE.*), [`latch`] (RLATCH.*). `docs/internals/adding-a-primitive.md`
//!   walks through adding one.
//! - [`pipeline`]: the one journey of every changing command: arity, parsing, request-id
//!   replay, the key's queue served first, the primitive's plan, then waiting or queueing
//!   or the reply.
//! - [`engine`]: one FIFO queue per key of waiters of any primitive (blocked clients and
//!   queued tickets), the handoff loop that asks the head's `Ask`, deadlines, disconnects,
//!   grants taken back, key timers, the pending list that serves keys freed by DEL,
//!   expiry, FLUSH or SWAPDB, and `events`, which turns keyspace and server events into
//!   engine calls. It names no primitive: a tracked key (the lock's, whose unlock message
//!   is owed when it goes away) comes with an `Owed` that answers for it.
//! - [`server`]: what talks to Redis: `ffi` (the only unsafe code), `store` (keys read by
//!   type, effects written back with replication, notifications and WATCH, messages,
//!   request-id records), `tracking`, `cluster`, `config`, `stats`, `guard`.
//! - [`vocab`]: the shared vocabulary, pure: `args`, `errors`, `reply`, `effects`.

// Top-down: registration (this file) -> one folder per primitive -> the command pipeline
// -> the waiting engine -> what talks to Redis -> the shared vocabulary.
pub mod expirable;
pub mod fenced;
pub mod latch;
pub mod lock;
pub mod rwlock;
pub mod semaphore;

pub mod engine;
pub mod pipeline;
pub mod server;
pub mod vocab;

// The module's side of spec/vectors (the contract every client's suite reads too).
#[cfg(test)]
mod vectors;

use engine::events;
use server::{config, ffi, stats, tracking};

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

/// Registers each command with its own entry point, which hands the call to
/// `ffi::dispatch` with the command's function (see `ffi/commands.rs` for why not
/// `redis_module!`'s command list). Each entry is `[name, function, flags, first key,
/// last key, key step]`.
/// The same table also makes [`COMMAND_NAMES`], which a unit test holds against
/// commands.json (one description per registered command).
macro_rules! register_commands {
    ($( [$name:literal, $handler:path, $flags:literal, $first:literal, $last:literal, $step:literal] ),* $(,)?) => {
        /// Every registered command's name, in the table's order.
        pub const COMMAND_NAMES: &[&str] = &[$($name),*];

        fn register(ctx: &Context) -> Status {
        $(
            {
                extern "C" fn entry(
                    ctx: *mut redis_module::raw::RedisModuleCtx,
                    argv: *mut *mut redis_module::raw::RedisModuleString,
                    argc: std::ffi::c_int,
                ) -> std::ffi::c_int {
                    ffi::dispatch(ctx, argv, argc, $handler)
                }
                let name = concat!($name, "\0");
                let flags = concat!($flags, "\0");
                let to_cstr = |s: &'static str| {
                    std::ffi::CStr::from_bytes_with_nul(s.as_bytes()).expect("a literal")
                };
                if ffi::create_command(ctx, to_cstr(name), entry, to_cstr(flags), ($first, $last, $step))
                    == Status::Err
                {
                    return Status::Err;
                }
            }
        )*
            Status::Ok
        }
    };
}

// One line per command: the table reads as one. Each is described in commands.json
// (COMMAND DOCS, server/docs.rs).
register_commands! {
        // Key at position 1 and nowhere else, so Redis Cluster routes every command.
        // On 7.0 module commands get no ACL category (docs/configuration.md, ACL).
        ["rlock.acquire", lock::commands::acquire, "write deny-oom", 1, 1, 1],
        ["rlock.release", lock::commands::release, "write", 1, 1, 1],
        ["rlock.renew", lock::commands::renew, "write", 1, 1, 1],
        ["rlock.forcerelease", lock::commands::force_release, "write", 1, 1, 1],
        ["rlock.info", lock::commands::info, "readonly", 1, 1, 1],
        // What the module is and can do (server/hello.rs): no key, so any node answers
        // it, a replica too (stale or loading: it reads no data); allowed in scripts and
        // while a script runs long (allow-busy): a client's fence behind a QUIET ticket
        // (docs/commands/tickets.md) must not be refused where the ticket was accepted.
        ["rlock.hello", server::hello::hello, "readonly fast allow-stale allow-loading allow-busy", 0, 0, 0],
        // Countdown latch (design.md 4.5). AWAIT changes nothing: readonly (a replica answers
        // it at once, never queues it).
        ["rlatch.trysetcount", latch::commands::try_set_count, "write deny-oom", 1, 1, 1],
        ["rlatch.countdown", latch::commands::count_down, "write", 1, 1, 1],
        ["rlatch.getcount", latch::commands::get_count, "readonly", 1, 1, 1],
        ["rlatch.await", latch::commands::await_open, "readonly", 1, 1, 1],
        ["rlatch.delete", latch::commands::delete, "write", 1, 1, 1],
        ["rlatch.info", latch::commands::info, "readonly", 1, 1, 1],
        // Fenced lock (design.md 4.2); release, renew, force release and info are RLOCK.*.
        ["rfenced.acquire", fenced::commands::acquire, "write deny-oom", 1, 1, 1],
        ["rfenced.gettoken", fenced::commands::get_token, "readonly", 1, 1, 1],
        // Semaphore (design.md 4.3, docs/internals/sync-commands.md).
        ["rsemaphore.trysetpermits", semaphore::commands::try_set_permits, "write deny-oom", 1, 1, 1],
        ["rsemaphore.addpermits", semaphore::commands::add_permits, "write deny-oom", 1, 1, 1],
        ["rsemaphore.acquire", semaphore::commands::acquire, "write deny-oom", 1, 1, 1],
        ["rsemaphore.release", semaphore::commands::release, "write", 1, 1, 1],
        ["rsemaphore.drainpermits", semaphore::commands::drain_permits, "write", 1, 1, 1],
        ["rsemaphore.availablepermits", semaphore::commands::available_permits, "readonly", 1, 1, 1],
        ["rsemaphore.info", semaphore::commands::info, "readonly", 1, 1, 1],
        // Permit-expirable semaphore (design.md 4.4, docs/internals/sync-commands.md).
        ["rpsemaphore.trysetpermits", expirable::commands::try_set_permits, "write deny-oom", 1, 1, 1],
        ["rpsemaphore.setpermits", expirable::commands::set_permits, "write deny-oom", 1, 1, 1],
        ["rpsemaphore.addpermits", expirable::commands::add_permits, "write deny-oom", 1, 1, 1],
        ["rpsemaphore.acquire", expirable::commands::acquire, "write deny-oom", 1, 1, 1],
        ["rpsemaphore.release", expirable::commands::release, "write", 1, 1, 1],
        ["rpsemaphore.updateleasetime", expirable::commands::update_lease_time, "write", 1, 1, 1],
        ["rpsemaphore.leasetime", expirable::commands::lease_time, "readonly", 1, 1, 1],
        ["rpsemaphore.availablepermits", expirable::commands::available_permits, "readonly", 1, 1, 1],
        ["rpsemaphore.acquiredpermits", expirable::commands::acquired_permits, "readonly", 1, 1, 1],
        ["rpsemaphore.info", expirable::commands::info, "readonly", 1, 1, 1],
        // Read-write lock (design.md 4.1)
        ["rrwlock.acquire", rwlock::commands::acquire, "write deny-oom", 1, 1, 1],
        ["rrwlock.release", rwlock::commands::release, "write", 1, 1, 1],
        ["rrwlock.renew", rwlock::commands::renew, "write", 1, 1, 1],
        ["rrwlock.forcerelease", rwlock::commands::force_release, "write", 1, 1, 1],
        ["rrwlock.info", rwlock::commands::info, "readonly", 1, 1, 1],
        // Internal (design.md 1.4): what a module command replicates under
        // `rlock.replication commands`; refused from ordinary clients. Read only from a
        // primary's stream, a slot migration's or an AOF. In cluster mode it comes as
        // `<key> <payload>`: the key at position 1 gives the server the slot a migration
        // streams it for (server/ffi/replication.rs); elsewhere as `<payload>` alone.
        ["rlock.apply", server::replication::apply_command, "write", 1, 1, 1],
        // RLOCK.ACQUIRE with its lease's absolute end, what a new lock or a re-entry
        // replicates (lock/commands.rs); its key is also inside its payload.
        ["rlock.acquireat", lock::commands::acquire_at, "write", 1, 1, 1],
        // The same for the read-write lock's acquire (its clock, for the read holds' lease
        // ends, as well) and the fenced lock's (rwlock/commands.rs, fenced/commands.rs).
        ["rrwlock.acquireat", rwlock::commands::acquire_at, "write", 1, 1, 1],
        ["rfenced.acquireat", fenced::commands::acquire_at, "write", 1, 1, 1],
}

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    if register(ctx) == Status::Err {
        return Status::Err;
    }
    // COMMAND DOCS: commands.json is checked by the unit tests; a server that cannot take
    // the docs gets none, never a failed load.
    match server::docs::parse(server::docs::COMMANDS_JSON) {
        Ok(docs) => ffi::set_command_docs(ctx, &docs),
        Err(e) => ctx.log_warning(&format!("rlock: commands.json: {e}")),
    }
    // What the module handles, told to the server so that it turns none of those features
    // off (ffi/options.rs): after the configs, which may say not to.
    ffi::declare_options(ctx, config::declare_server_options());
    ffi::set_cluster_mode(
        ctx.get_flags()
            .contains(redis_module::ContextFlags::CLUSTER),
    );
    ffi::set_block_callbacks(ffi::BlockCallbacks {
        on_timeout: engine::on_timeout,
        on_disconnect: engine::on_disconnect,
        on_replied: engine::on_replied,
    });
    ffi::set_timer_handler(engine::on_timer);
    // The permit-expirable semaphore's lease timer (engine key timers name no primitive).
    expirable::commands::init();
    // Handlers only: the module subscribes to events while somebody waits (design.md 1: it
    // holds nothing while nobody waits), see engine/events.rs.
    events::init();
    // The replication gate's fork handler (ffi/replication.rs): flags only, no listener.
    ffi::watch_forks();
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
    // What the module holds of the server: lease timers armed (engine key timers); whether
    // it listens to the server's events now (only while somebody waits, and on Redis 7.0
    // the keyspace subscription it cannot drop); the replication gate (ffi/replication.rs):
    // whether every write is replicated, and whether the module listens for that becoming
    // so (a fork, a master link), which it does only on a server with neither an AOF nor
    // a replica, from its first skipped write on.
    stats::section(
        ctx,
        stats::SECTIONS[6],
        &[
            ("key_timers", engine::key_timers_armed() as u64),
            ("watching", u64::from(events::is_watching())),
            ("event_subscriptions", events::subscriptions() as u64),
            ("propagation_open", u64::from(ffi::propagation_open())),
            (
                "propagation_listeners",
                u64::from(ffi::watching_propagation()),
            ),
        ],
    );
}

redis_module! {
    name: "rlock",
    version: 1,
    allocator: (Allocator, ALLOCATOR),
    data_types: [],
    init: init,
    info: info,
    configurations: [
        i64: [
            ["max-waiters-per-key", &config::MAX_WAITERS_PER_KEY, config::DEFAULT_MAX_WAITERS_PER_KEY,
             config::MIN_MAX_WAITERS_PER_KEY, config::MAX_MAX_WAITERS_PER_KEY, ConfigurationFlags::DEFAULT, None],
            ["request-id-window-ms", &config::REQUEST_ID_WINDOW_MS, config::DEFAULT_REQUEST_ID_WINDOW_MS,
             config::MIN_REQUEST_ID_WINDOW_MS, config::MAX_REQUEST_ID_WINDOW_MS, ConfigurationFlags::DEFAULT, None],
            ["ticket-confirm-ms", &config::TICKET_CONFIRM_MS, config::DEFAULT_TICKET_CONFIRM_MS,
             config::MIN_TICKET_CONFIRM_MS, config::MAX_TICKET_CONFIRM_MS, ConfigurationFlags::DEFAULT, None],
            ["script-waiter-grace-ms", &config::SCRIPT_WAITER_GRACE_MS, config::DEFAULT_SCRIPT_WAITER_GRACE_MS,
             config::MIN_SCRIPT_WAITER_GRACE_MS, config::MAX_SCRIPT_WAITER_GRACE_MS, ConfigurationFlags::DEFAULT, None],
            ["script-waiter-window-ms", &config::SCRIPT_WAITER_WINDOW_MS, config::DEFAULT_SCRIPT_WAITER_WINDOW_MS,
             config::MIN_SCRIPT_WAITER_WINDOW_MS, config::MAX_SCRIPT_WAITER_WINDOW_MS, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [
            ["declare-server-options", &config::DECLARE_SERVER_OPTIONS, true,
             ConfigurationFlags::IMMUTABLE, None],
        ],
        enum: [
            ["replication", &config::REPLICATION, config::Replication::commands,
             ConfigurationFlags::DEFAULT, None],
            ["replication-gate", &config::REPLICATION_GATE, config::ReplicationGate::auto,
             ConfigurationFlags::DEFAULT, None],
        ],
        module_args_as_configuration: true,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// commands.json describes exactly the registered commands: one entry each, no more.
    #[test]
    fn commands_json_names_exactly_the_registration_tables_commands() {
        let docs = server::docs::parse(server::docs::COMMANDS_JSON).unwrap();
        let mut described: Vec<&str> = docs.iter().map(|d| d.name.as_str()).collect();
        let mut registered = COMMAND_NAMES.to_vec();
        described.sort_unstable();
        registered.sort_unstable();
        assert_eq!(described, registered);
    }
}
