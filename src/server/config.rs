//! Module configs: `CONFIG GET/SET rlock.<name>`, also accepted as `loadmodule` arguments.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use redis_module::configuration::{ConfigurationContext, ConfigurationValue};
use redis_module::{enum_configuration, RedisError};

use crate::server::ffi;

/// `rlock.max-waiters-per-key`: how many clients may wait for one lock. Beyond it, a
/// waiting ACQUIRE gets an error instead of growing server memory without bound.
pub static MAX_WAITERS_PER_KEY: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAITERS_PER_KEY);
pub const DEFAULT_MAX_WAITERS_PER_KEY: i64 = 10_000;
pub const MIN_MAX_WAITERS_PER_KEY: i64 = 0;
pub const MAX_MAX_WAITERS_PER_KEY: i64 = 10_000_000;

pub fn max_waiters_per_key() -> usize {
    MAX_WAITERS_PER_KEY.load(Ordering::Relaxed).max(0) as usize
}

/// `rlock.request-id-window-ms`: how long the first reply of a call made with
/// `ID request-id` is remembered, so that a retry within it is answered without being
/// applied twice.
pub static REQUEST_ID_WINDOW_MS: AtomicI64 = AtomicI64::new(DEFAULT_REQUEST_ID_WINDOW_MS);
pub const DEFAULT_REQUEST_ID_WINDOW_MS: i64 = 60_000;
pub const MIN_REQUEST_ID_WINDOW_MS: i64 = 1;
pub const MAX_REQUEST_ID_WINDOW_MS: i64 = 86_400_000;

pub fn request_id_window_ms() -> i64 {
    REQUEST_ID_WINDOW_MS.load(Ordering::Relaxed)
}

/// `rlock.declare-server-options` (immutable, default yes): whether the module declares
/// to the server the features it handles (`ffi::options`: async replica loading, Valkey's
/// atomic slot migration). `no` makes the server treat rlock as a module unaware of them,
/// turning those features off while it is loaded: for comparing, and for the tests that
/// show what each declaration turns on.
pub static DECLARE_SERVER_OPTIONS: AtomicBool = AtomicBool::new(true);

pub fn declare_server_options() -> bool {
    DECLARE_SERVER_OPTIONS.load(Ordering::Relaxed)
}

/// `rlock.ticket-confirm-ms`: how long a ticket's grant outlives the connection that
/// queued it when nobody confirmed it yet (design.md 5). A client proceeds as holder on the
/// `granted` message and confirms off its path; if its connection breaks meanwhile
/// (`CLIENT KILL`, a reset) it confirms again on a new one within this time and keeps the
/// grant. A client that vanished for good never does: its grant is taken back then and
/// passed on, and its request id answers `TAKENBACK` from then on. 0: taken back at once.
pub static TICKET_CONFIRM_MS: AtomicI64 = AtomicI64::new(DEFAULT_TICKET_CONFIRM_MS);
pub const DEFAULT_TICKET_CONFIRM_MS: i64 = 1_000;
pub const MIN_TICKET_CONFIRM_MS: i64 = 0;
pub const MAX_TICKET_CONFIRM_MS: i64 = 60_000;

pub fn ticket_confirm_ms() -> i64 {
    TICKET_CONFIRM_MS.load(Ordering::Relaxed)
}

/// `rlock.script-waiter-grace-ms` (design.md 1.8): how long a lock released with module
/// waiters queued is left free for waiters that run Redisson's scripts (Redisson, rlock
/// clients in scripts mode), when some listen on its channel, before the module's queue
/// head gets it. Long enough for a woken waiter's script to arrive; it is also what a turn
/// nobody takes costs the module's waiters. 0: no turns (module waiters always first).
pub static SCRIPT_WAITER_GRACE_MS: AtomicI64 = AtomicI64::new(DEFAULT_SCRIPT_WAITER_GRACE_MS);
pub const DEFAULT_SCRIPT_WAITER_GRACE_MS: i64 = 10;
pub const MIN_SCRIPT_WAITER_GRACE_MS: i64 = 0;
pub const MAX_SCRIPT_WAITER_GRACE_MS: i64 = 10_000;

pub fn script_waiter_grace_ms() -> i64 {
    SCRIPT_WAITER_GRACE_MS.load(Ordering::Relaxed)
}

/// `rlock.script-waiter-window-ms` (design.md 1.8): at most one look for script-side
/// waiters (a subscriber count), and so at most one turn, per lock per this many ms. A
/// script-side waiter gets its turn within about this plus one hold; module waiters lose
/// at most `script-waiter-grace-ms` of it to a turn nobody takes.
pub static SCRIPT_WAITER_WINDOW_MS: AtomicI64 = AtomicI64::new(DEFAULT_SCRIPT_WAITER_WINDOW_MS);
pub const DEFAULT_SCRIPT_WAITER_WINDOW_MS: i64 = 50;
pub const MIN_SCRIPT_WAITER_WINDOW_MS: i64 = 1;
pub const MAX_SCRIPT_WAITER_WINDOW_MS: i64 = 3_600_000;

pub fn script_waiter_window_ms() -> i64 {
    SCRIPT_WAITER_WINDOW_MS.load(Ordering::Relaxed)
}

enum_configuration! {
    /// `rlock.replication` (design.md 1.4): how a module command reaches replicas and the AOF.
    /// `commands`: as one command (the plain command when it writes one thing, else one
    /// `RLOCK.APPLY`); replicas and AOF reloads need the module. `effects`: as the plain
    /// commands it amounts to, which need no module.
    #[allow(non_camel_case_types)]
    pub enum Replication {
        commands = 0,
        effects = 1,
    }
}

/// The `rlock.replication` setting, kept where the replication glue reads it on every
/// write (an atomic in `ffi`), so the hot path takes no lock.
pub struct ReplicationSetting;

pub static REPLICATION: ReplicationSetting = ReplicationSetting;

impl ConfigurationValue<Replication> for ReplicationSetting {
    fn get(&self, _ctx: &ConfigurationContext) -> Replication {
        if ffi::commands_mode() {
            Replication::commands
        } else {
            Replication::effects
        }
    }

    fn set(&self, _ctx: &ConfigurationContext, val: Replication) -> Result<(), RedisError> {
        ffi::set_commands_mode(matches!(val, Replication::commands));
        Ok(())
    }
}

pub use gate::ReplicationGate;

// A module of its own: `enum_configuration!` imports its trait where it is expanded, once.
mod gate {
    use redis_module::enum_configuration;

    enum_configuration! {
        /// `rlock.replication-gate`: may the module skip building the replication of writes
        /// the server would drop (no AOF, no replica, no backlog; `ffi::replication`)?
        /// `auto`: where watching for that to change costs other commands nothing (Redis 7.0);
        /// `yes`: everywhere; `no`: never.
        #[allow(non_camel_case_types)]
        pub enum ReplicationGate {
            auto = 0,
            yes = 1,
            no = 2,
        }
    }
}

/// The `rlock.replication-gate` setting, kept in `ffi` where the gate reads it.
pub struct ReplicationGateSetting;

pub static REPLICATION_GATE: ReplicationGateSetting = ReplicationGateSetting;

impl ConfigurationValue<ReplicationGate> for ReplicationGateSetting {
    fn get(&self, _ctx: &ConfigurationContext) -> ReplicationGate {
        match ffi::gate_policy() {
            ffi::GatePolicy::Auto => ReplicationGate::auto,
            ffi::GatePolicy::Yes => ReplicationGate::yes,
            ffi::GatePolicy::No => ReplicationGate::no,
        }
    }

    fn set(&self, _ctx: &ConfigurationContext, val: ReplicationGate) -> Result<(), RedisError> {
        ffi::set_gate_policy(match val {
            ReplicationGate::auto => ffi::GatePolicy::Auto,
            ReplicationGate::yes => ffi::GatePolicy::Yes,
            ReplicationGate::no => ffi::GatePolicy::No,
        });
        Ok(())
    }
}
