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
//!   (README, "Freeing and handoff").

use redis_module::{server_events::FlushSubevent, server_events::ServerRole, Context};
use redis_module_macros::{flush_event_handler, role_changed_event_handler};

use crate::engine;
use crate::server::ffi::{self, Removal};
use crate::server::stats;
use crate::server::tracking;
use crate::vocab::errors::ERR_ROLE_CHANGED;

/// False when no event can concern the module: no lock tracked, nobody waiting. Asked
/// before the key's name is even read.
fn watching() -> bool {
    tracking::any_tracked() || engine::anyone_waits()
}

/// Subscribes to key removals the cheapest way the server offers (see the top of file).
pub fn subscribe(ctx: &Context) {
    ffi::set_post_job_handler(engine::sweep);
    if ffi::subscribe_key_removals(ctx, engine::anyone_waits, on_removed) {
        // Writes in place (a Java client's INCRBY on a semaphore) are not reported: the
        // queues that can be let in by one look again now and then (engine::wait_for_write).
        engine::set_writes_reported(false);
    } else {
        ffi::subscribe_keyspace(ctx, watching, on_removed);
    }
}

/// A key was removed, expired, evicted or overwritten (or, on 7.0, touched by a command
/// of a class that can do that). Runs on every such event of the server: the common case,
/// a key that is no lock with nobody waiting anywhere, returns after the filter.
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
#[flush_event_handler]
fn on_flush(ctx: &Context, subevent: FlushSubevent) {
    if let FlushSubevent::Ended = subevent {
        crate::server::guard::quietly(|| {
            for (db, key) in watched_keys() {
                engine::schedule(ctx, db, &key);
            }
        });
    }
}

/// SWAPDB exchanges two dbs' contents without per-key events. Every lock key of either
/// db is tracked in both and looked at again: where a lock still is, it stays tracked;
/// where one was and is no more, its unlock message goes out. Waiters keep their db
/// number, so what they wait for may now be free: they are looked at too.
pub fn on_swapdb(ctx: &Context, a: i32, b: i32) {
    tracking::swap(a, b);
    engine::swap_key_timers(a, b);
    for (db, key) in watched_keys()
        .into_iter()
        .filter(|(db, _)| *db == a || *db == b)
    {
        engine::schedule(ctx, db, &key);
    }
}

/// A server turned replica (REPLICAOF, failover) can grant no locks. Redis 7.0 already
/// answers and drops every blocked client before this event (`UNBLOCKED force unblock
/// ...`), which empties the queues through the disconnect callback; this is the safety
/// net for anything left, and it forgets the lock keys tracked as a master.
#[role_changed_event_handler]
fn on_role_changed(ctx: &Context, role: ServerRole) {
    if let ServerRole::Replica = role {
        crate::server::guard::quietly(|| {
            // A replica's keys follow its master; what we tracked here no longer applies.
            tracking::clear();
            engine::fail_all(ctx, ERR_ROLE_CHANGED);
        });
    }
}
