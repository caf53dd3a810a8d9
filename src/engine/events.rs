//! Keyspace and server events: noticing a lock that went away some other way than a
//! release (expiry, DEL/UNLINK, eviction, overwrite, FLUSHDB/FLUSHALL, SWAPDB). With
//! waiters, the first one is handed the lock; without, Redisson's unlock message is
//! published, as for a release, so pub/sub waiters wake at once instead of at the old
//! lease's end.
//!
//! Layer: the top of `engine` (its way in from the server's events), above the rest of
//! it: this file only translates events into engine calls (the pending list, the sweep,
//! the handoff and the unlock message live there). It knows which keys are locks the
//! module wrote from `tracking`.
//!
//! Only while somebody waits (design.md 1: the module holds nothing while nobody waits). The
//! module subscribes when the first waiter is queued ([`watch`], before it is queued, so
//! no removal can be missed) and drops every subscription in the first turn of the event
//! loop after the last waiter left ([`idle_soon`], [`on_idle`]). While nobody waits the
//! server runs every command as without the module. Redis 7.0 alone cannot drop a keyspace
//! subscription: there it stays from the first wait since start, its callback turning
//! every event away at its first check.
//!
//! How removals are noticed costs every other command of the server, so it depends on
//! what the server offers (checked at run time, never required at load):
//! - Redis 7.2+ and Valkey report every key removed, expired, evicted or overwritten to
//!   modules directly (the key server event), and only those: a SET of a new key, an
//!   INCR, an LPUSH never reach the module. A key that is not a hash is turned away in
//!   ffi before its name is read.
//!   Not reported there: a lock spoiled in place (HSET of a field that is no hold count).
//!   It is noticed lazily: by the next RLOCK command on the key, or, with waiters, by the
//!   expiry timer they already arm for the old lease's end.
//! - Redis 7.0 has only keyspace events. The module subscribes to the classes that can
//!   remove, replace or spoil a hash (generic, string, set, zset, hash, expired, evicted),
//!   not list or stream. The one command left out that can replace a hash, SORT ... STORE,
//!   is noticed lazily, as above.
//!
//! In both, the callback rejects a key that is no lock in a handful of instructions: a
//! counting filter over a cheap hash of the tracked keys sits in front of the set.
//!
//! The handoff is not written from inside the notification: Redis propagates the command
//! that caused the event (DEL, FLUSHALL, the expiry's DEL) *after* the notification
//! returns, so a lock written from there would reach replicas and the AOF before the
//! delete and be wiped by it. The key goes on the engine's pending list, served
//! - where the server has post-notification jobs (7.2+, Valkey), by a job that runs when
//!   the cause is done and propagated, still inside the same command: no other client,
//!   not even a Lua script in the same pipeline, sees the lock free;
//! - on 7.0, by a zero-delay timer, whose writes also propagate after the cause. Until it
//!   fires the key has waiters and no lock: every RLOCK command that finds it so serves
//!   the queue first (see pipeline.rs), so no RLOCK client can barge in; a Lua script can
//!   (docs/commands/lock.md, "Freeing and handoff").

use std::cell::Cell;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use redis_module::Context;

use crate::engine;
use crate::server::ffi::{self, Hook, Removal};
use crate::server::stats;
use crate::server::tracking;
use crate::vocab::errors::ERR_ROLE_CHANGED;

/// True while the module watches: subscribed to what it needs to notice removals, and
/// tracking new locks. Main thread only.
static WATCHING: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The idle check's timer is armed (at most one).
    static IDLE_ARMED: Cell<bool> = const { Cell::new(false) };
    /// Its id while armed (so that [`idle_now`] can stop it).
    static IDLE_TIMER: Cell<Option<ffi::TimerId>> = const { Cell::new(None) };
}

/// The tag of the idle check's timer: far above the queues' counters, below the key
/// timers' and deadlines' bits (engine::on_timer tells them apart).
pub const IDLE_TAG: u64 = 1 << 61;

/// How long the idle check waits before looking again while the engine still has work of
/// its own queued (the sweep, writes paused).
const IDLE_RETRY_MS: i64 = 10;

/// False when no event can concern the module: no lock tracked, nobody waiting. Asked
/// before the key's name is even read.
fn watching() -> bool {
    tracking::any_tracked() || engine::anyone_waits()
}

/// Installs the handlers (from init). Subscribes to nothing: the module listens only
/// while it watches ([`watch`]).
pub fn init() {
    ffi::reset_subscriptions();
    WATCHING.store(false, Relaxed);
    IDLE_ARMED.with(|a| a.set(false));
    IDLE_TIMER.with(|t| t.set(None));
    tracking::set_active(false);
    ffi::set_post_job_handler(engine::sweep);
    ffi::set_after_reply_handler(engine::publish_grants);
    ffi::set_key_handlers(watching, engine::anyone_waits, on_removed);
    ffi::set_flush_and_replica_handlers(on_flush, on_replica);
    ffi::on_swapdb(on_swapdb);
    ffi::on_slots_exported(on_slots_exported);
    // Queued tickets live as long as the connection that queued them.
    ffi::on_client_gone(engine::on_client_gone);
    // Writes in place (a Java client's INCRBY on a semaphore) are reported on 7.0 only (its
    // keyspace events); elsewhere the queues that one can let in look again now and then
    // (engine::wait_for_write).
    engine::set_writes_reported(!ffi::key_event_available());
}

/// True while the module is subscribed and tracking (INFO).
pub fn is_watching() -> bool {
    WATCHING.load(Relaxed)
}

/// How many subscriptions the module holds now: server events, plus one for the keyspace
/// subscription (INFO `event_subscriptions`; 0 while nobody waits, except on Redis 7.0
/// after the first wait since start, and while a ticket's grant is uncollected).
pub fn subscriptions() -> usize {
    ffi::ALL_HOOKS.iter().filter(|h| ffi::hooked(**h)).count()
        + usize::from(ffi::keyspace_subscribed())
}

/// Starts watching, if not already: subscribes to key removals the cheapest way the server
/// offers (see the top of file), to FLUSH, SWAPDB, role changes and client disconnects,
/// and tracks new locks. Called before a waiter is queued, so that no event it needs can
/// come before the subscription (everything runs on the main thread: an event comes from
/// some later command, expiry or eviction).
pub fn watch(ctx: &Context) {
    if WATCHING.load(Relaxed) {
        return;
    }
    if !ffi::hook(ctx, Hook::Key) {
        ffi::subscribe_keyspace(ctx);
    }
    for hook in [
        Hook::Flush,
        Hook::RoleChanged,
        Hook::SwapDb,
        Hook::ClientChange,
        Hook::SlotMigration,
    ] {
        ffi::hook(ctx, hook);
    }
    tracking::set_active(true);
    WATCHING.store(true, Relaxed);
}

/// The last waiter left (or a grant was taken back, a connection with ticket grants
/// closed): looks whether the module can stop watching. At once where that is safe (a
/// command, a timer, the sweep's end), so that `MODULE UNLOAD` right after the last waiter
/// left succeeds; from inside a server event's callback, where dropping a listener is not
/// safe, or while the sweep has work left, a moment later, by a timer that fires in the
/// next turn of the event loop. Cheap when nothing is held or the check is armed already.
pub fn idle_soon(ctx: &Context) {
    if !(WATCHING.load(Relaxed) || ffi::hooked(Hook::ClientChange)) || IDLE_ARMED.with(Cell::get) {
        return;
    }
    if ffi::in_event() {
        arm_idle(ctx, 0);
    } else {
        check_idle(ctx);
    }
}

fn arm_idle(ctx: &Context, delay_ms: i64) {
    IDLE_ARMED.with(|a| a.set(true));
    let id = ffi::create_timer(ctx, delay_ms, IDLE_TAG);
    IDLE_TIMER.with(|t| t.set(Some(id)));
}

/// The idle check now, from a timer's callback, where dropping listeners is safe: an idle
/// check armed for later is stopped first (see `pending::settle_now`, why not later).
pub fn idle_now(ctx: &Context) {
    if ffi::in_event() {
        return idle_soon(ctx);
    }
    if IDLE_ARMED.with(|a| a.replace(false)) {
        if let Some(id) = IDLE_TIMER.with(Cell::take) {
            ffi::stop_timer(ctx, id);
        }
    }
    if WATCHING.load(Relaxed) || ffi::hooked(Hook::ClientChange) {
        check_idle(ctx);
    }
}

/// The idle check: with nobody waiting and nothing left for the sweep, every subscription
/// is dropped and tracking stops. Two exceptions:
/// - a ticket's grant that its connection has not collected yet (within the request-id
///   window) is taken back if the connection closes first (docs/commands/tickets.md): the
///   client-change event stays until a closing connection finds no such grant left. It
///   fires on connects and disconnects only, never on commands, and holds no timer.
/// - Redis 7.0 cannot drop a keyspace subscription (no `UnsubscribeFromKeyspaceEvents`):
///   it stays, and its callback turns every event away at its first check.
pub fn on_idle(ctx: &Context) {
    IDLE_ARMED.with(|a| a.set(false));
    IDLE_TIMER.with(|t| t.set(None));
    check_idle(ctx);
}

fn check_idle(ctx: &Context) {
    if engine::anyone_waits() {
        return;
    }
    if engine::sweep_due() {
        // The sweep runs first (it may publish unlock messages, which need tracking): at
        // once, unless writes are paused, when it waits for the pause itself.
        arm_idle(
            ctx,
            if ffi::writes_paused() {
                IDLE_RETRY_MS
            } else {
                0
            },
        );
        return;
    }
    let window = crate::server::config::request_id_window_ms();
    let grants_out = engine::with(|q| q.uncollected_until(ffi::now_ms(), window)).is_some();
    for hook in ffi::ALL_HOOKS {
        if !(grants_out && hook == Hook::ClientChange) {
            ffi::unhook(ctx, hook);
        }
    }
    ffi::unsubscribe_keyspace(ctx);
    tracking::set_active(false);
    WATCHING.store(false, Relaxed);
}

/// A key was removed, expired, evicted or overwritten (or, on 7.0, touched by a command
/// of a class that can do that). Runs on every such event of the server while the module
/// watches: the common case, a key that is no lock with nobody waiting for it, returns
/// after the filter.
fn on_removed(ctx: &Context, db: i32, removal: Removal, key: &[u8]) {
    if tracking::own_write_in_progress() {
        return; // the module's own write: it knows what it did
    }
    if !engine::anyone_waits() && !tracking::might_be_tracked(key) {
        return;
    }
    crate::server::guard::quietly(|| noticed(ctx, db, removal, key));
}

fn noticed(ctx: &Context, db: i32, removal: Removal, key: &[u8]) {
    let waiting = engine::has_waiters(db, key);
    if !waiting && !tracking::is_tracked(db, key) {
        return;
    }
    if waiting && removal == Removal::Expired {
        stats::bump(|s| &s.expired_with_waiters);
    }
    if removal == Removal::Evicted {
        // Evictions run in a loop until memory is under the limit, and a job would run
        // inside it, after each key: a lock handed over there is likely evicted again at
        // once. The timer serves the queue after the loop (RLOCK commands in between
        // serve it first, as on 7.0).
        engine::schedule_after_loop(ctx, db, key);
    } else {
        engine::schedule(ctx, db, key);
    }
}

/// Every key with waiters and every tracked lock key.
fn watched_keys() -> Vec<(i32, Vec<u8>)> {
    let mut keys: Vec<(i32, Vec<u8>)> = engine::with(|q| q.all_keys())
        .into_iter()
        .map(|(db, k)| (db, k.to_vec()))
        .collect();
    keys.extend(tracking::all_keys());
    keys
}

/// FLUSHDB/FLUSHALL delete keys without per-key events: look at every key with waiters
/// and every tracked lock (those still there are found held and left alone).
fn on_flush(ctx: &Context) {
    for (db, key) in watched_keys() {
        engine::schedule(ctx, db, &key);
    }
}

/// SWAPDB exchanges two dbs' contents without per-key events. Every lock key of either
/// db is tracked in both and looked at again: where a lock still is, it stays tracked;
/// where one was and is no more, its unlock message goes out. Waiters keep their db
/// number, so what they wait for may now be free: they are looked at too.
pub fn on_swapdb(ctx: &Context, a: i32, b: i32) {
    tracking::swap(a, b);
    engine::swap_key_timers(a, b);
    // Waiters keep their db number: a timer that followed its key to the other db has
    // nobody waiting there (no timer while nobody waits; the next write reclaims).
    engine::disarm_key_timers_without_waiters(ctx);
    for (db, key) in watched_keys()
        .into_iter()
        .filter(|(db, _)| *db == a || *db == b)
    {
        engine::schedule(ctx, db, &key);
    }
}

/// Slots this node exported by an atomic slot migration (Valkey 9) belong to another node
/// now. Their keys leave this node by a delete the server makes once it sees the new
/// owner, which the removal handler notices like any other; this event covers what that
/// cannot: a waiter whose key was never here (a semaphore nobody set up yet) and a lock
/// tracked here, which has not been freed and owes no unlock message. Every waiter of those
/// slots is answered with the redirect a cluster client follows (`MOVED`), never granted
/// here; their timers stop with their queues.
fn on_slots_exported(ctx: &Context, ranges: &[(u16, u16)]) {
    let moved = |key: &[u8]| {
        let slot = crate::vocab::slot::key_slot(key);
        ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot))
    };
    for (db, key) in tracking::all_keys() {
        if moved(&key) {
            tracking::untrack(db, &key);
        }
    }
    let keys: Vec<(i32, Vec<u8>)> = engine::with(|q| q.all_keys())
        .into_iter()
        .filter(|(_, key)| moved(key))
        .map(|(db, key)| (db, key.to_vec()))
        .collect();
    for (db, key) in keys {
        engine::redirect_away(ctx, db, &key);
    }
}

/// A server turned replica (REPLICAOF, failover) can grant no locks. Redis 7.0 already
/// answers and drops every blocked client before this event (`UNBLOCKED force unblock
/// ...`), which empties the queues through the disconnect callback; this is the safety
/// net for anything left, and it forgets the lock keys tracked as a master.
fn on_replica(ctx: &Context) {
    // A replica's keys follow its master; what we tracked here no longer applies.
    tracking::clear();
    engine::fail_all(ctx, ERR_ROLE_CHANGED);
}
