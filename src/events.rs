//! Keyspace and server events: noticing a lock that went away some other way than a
//! release (expiry, DEL/UNLINK, eviction, overwrite, FLUSHDB/FLUSHALL). With waiters, the
//! first one is handed the lock; without, Redisson's unlock message is published, as for
//! a release, so pub/sub waiters wake at once instead of at the old lease's end.
//!
//! The module knows which keys are locks it wrote (`TRACKED`): a key is tracked when an
//! RLOCK command or a handoff creates a lock there, and forgotten when the lock is freed.
//!
//! The handoff is not written from inside the notification. Redis propagates the command
//! that caused the event (DEL, FLUSHALL, the expiry's DEL) *after* the notification
//! returns, so a lock written from there would reach replicas and the AOF before the
//! delete and be wiped by it. Instead the key goes on a pending list served by a zero-delay
//! timer, whose writes propagate after the cause. Until then the key has waiters and no
//! lock: every RLOCK command that finds it so serves the queue first (see commands.rs), so
//! no RLOCK client can barge in between.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};

use redis_module::{
    server_events::FlushSubevent, server_events::ServerRole, Context, ContextFlags, NotifyEvent,
    RedisString,
};
use redis_module_macros::{flush_event_handler, role_changed_event_handler};

use crate::core::LockState;
use crate::errors::ERR_ROLE_CHANGED;
use crate::ffi::{self, LockKey};
use crate::stats;
use crate::store;
use crate::waiters::{self, Granted, Path, Served};

/// The tag of the pending-list timer; expiry timers use tags from 1 up.
const SWEEP_TAG: u64 = 0;

thread_local! {
    static OWN_WRITES: Cell<u32> = const { Cell::new(0) };
    static PENDING: RefCell<Vec<(i32, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
    static SWEEP_ARMED: Cell<bool> = const { Cell::new(false) };
    static REVOKES: RefCell<Vec<Granted>> = const { RefCell::new(Vec::new()) };
    static TRACKED: RefCell<HashMap<i32, HashSet<Box<[u8]>>>> = RefCell::new(HashMap::new());
}

/// Remembers that `key` in `db` holds a lock the module wrote.
pub fn track(db: i32, key: &[u8]) {
    TRACKED.with(|t| {
        let mut t = t.borrow_mut();
        // Insert directly: a lock being written is almost never tracked yet, so this
        // hashes the key once instead of twice (contains, then insert).
        t.entry(db).or_default().insert(key.into());
    });
}

/// Forgets a lock key; true if it was tracked.
pub fn untrack(db: i32, key: &[u8]) -> bool {
    TRACKED.with(|t| {
        let mut t = t.borrow_mut();
        let Some(keys) = t.get_mut(&db) else {
            return false;
        };
        let removed = keys.remove(key);
        if keys.is_empty() {
            t.remove(&db);
        }
        removed
    })
}

fn is_tracked(db: i32, key: &[u8]) -> bool {
    TRACKED.with(|t| t.borrow().get(&db).is_some_and(|keys| keys.contains(key)))
}

fn nothing_tracked() -> bool {
    TRACKED.with(|t| t.borrow().is_empty())
}

/// How many lock keys the module tracks (for INFO).
pub fn tracked_count() -> usize {
    TRACKED.with(|t| t.borrow().values().map(HashSet::len).sum())
}

/// Marks the module's own writes, whose notifications need no handoff check.
pub struct OwnWrite(());

impl OwnWrite {
    pub fn begin() -> OwnWrite {
        OWN_WRITES.with(|c| c.set(c.get() + 1));
        OwnWrite(())
    }
}

impl Drop for OwnWrite {
    fn drop(&mut self) {
        OWN_WRITES.with(|c| c.set(c.get() - 1));
    }
}

/// Subscribed to every keyspace event class: any write can delete or replace a lock key.
/// A server with no locks of ours and no waiters returns after two emptiness checks; else
/// it costs a set lookup per event.
pub fn on_keyspace_event(ctx: &Context, _class: NotifyEvent, event: &str, key: &[u8]) {
    crate::guard::quietly(|| noticed(ctx, event, key));
}

fn noticed(ctx: &Context, event: &str, key: &[u8]) {
    if waiters::with(|q| q.total()) == 0 && nothing_tracked() {
        return;
    }
    let db = ffi::selected_db(ctx);
    let waiting = waiters::has_waiters(db, key);
    if !waiting && !is_tracked(db, key) {
        return;
    }
    if waiting && event == "expired" {
        stats::bump(|s| &s.expired_with_waiters);
    }
    if OWN_WRITES.with(Cell::get) == 0 {
        schedule(ctx, db, key);
    }
}

fn schedule(ctx: &Context, db: i32, key: &[u8]) {
    PENDING.with(|p| p.borrow_mut().push((db, key.to_vec())));
    arm_sweep(ctx, 0);
}

fn arm_sweep(ctx: &Context, delay_ms: i64) {
    if !SWEEP_ARMED.with(|a| a.replace(true)) {
        ffi::create_timer(ctx, delay_ms, SWEEP_TAG);
    }
}

/// While writes are paused, look at the key again a little later (not at once: that
/// would spin the event loop for the whole pause).
pub fn retry_later(ctx: &Context, db: i32, key: &[u8]) {
    const PAUSED_RETRY_MS: i64 = 10;
    PENDING.with(|p| p.borrow_mut().push((db, key.to_vec())));
    arm_sweep(ctx, PAUSED_RETRY_MS);
}

/// Takes back, on the next sweep, a lock handed to a client that vanished untold.
pub fn revoke_later(ctx: &Context, granted: Granted) {
    REVOKES.with(|r| r.borrow_mut().push(granted));
    arm_sweep(ctx, 0);
}

/// Every module timer lands here.
pub fn on_timer(ctx: &Context, tag: u64) {
    if tag == SWEEP_TAG {
        sweep(ctx);
    } else if tag & waiters::DEADLINE_BIT != 0 {
        waiters::on_deadline(ctx, ffi::Blocked((tag & !waiters::DEADLINE_BIT) as usize));
    } else {
        waiters::on_timer(ctx, tag);
    }
}

fn sweep(ctx: &Context) {
    SWEEP_ARMED.with(|a| a.set(false));
    if ctx.get_flags().contains(ContextFlags::SLAVE) {
        // A replica's keys are its master's to change.
        PENDING.with(|p| p.borrow_mut().clear());
        REVOKES.with(|r| r.borrow_mut().clear());
        return;
    }
    for granted in REVOKES.with(|r| std::mem::take(&mut *r.borrow_mut())) {
        if ffi::select_db(ctx, granted.db) {
            revoke(ctx, &granted);
        }
    }
    let mut pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    pending.sort_unstable();
    pending.dedup();
    for (db, key) in pending {
        if ffi::select_db(ctx, db) {
            let name = RedisString::create_from_slice(std::ptr::null_mut(), &key);
            settle(ctx, db, &name);
        }
    }
}

/// Releases a lock handed to a waiter that vanished before being told, if the lock is
/// still exactly what the handoff wrote (that owner, count 1), then serves the next waiter.
fn revoke(ctx: &Context, granted: &Granted) {
    if ffi::writes_paused() {
        REVOKES.with(|r| r.borrow_mut().push(granted.clone()));
        arm_sweep(ctx, 10);
        return;
    }
    let name = RedisString::create_from_slice(std::ptr::null_mut(), &granted.key);
    let key = LockKey::open(ctx, &name, true);
    let Ok(state) = store::read(&key) else { return };
    let count = state.count_of(&granted.owner);
    // Still exactly what the handoff wrote: that owner alone, count 1.
    let untold =
        count == Some(1) && matches!(&state, LockState::Held { holders, .. } if holders.len() == 1);
    if untold || count.is_none() {
        // The client was never told: a retry with its request id must not be answered
        // "acquired" from the record the handoff wrote.
        if let Some(id) = &granted.request_id {
            store::forget_request(ctx, &crate::core::request_key(&granted.key, id));
        }
    }
    if !untold {
        return; // re-entered since by the same owner elsewhere, or already gone
    }
    let owner = RedisString::create_from_slice(std::ptr::null_mut(), &granted.owner);
    let plan = crate::core::release(&state, &granted.owner, None, ffi::now_ms());
    store::apply(ctx, &key, &name, &owner, &plan);
    drop(key);
    stats::bump(|s| &s.revoked_handoffs);
    freed(ctx, granted.db, &name, Path::Event);
}

/// After a lock was freed: hand it to the first waiter, or tell pub/sub waiters
/// (Redisson's) that it is free. A handoff publishes nothing: the lock never was free.
pub fn freed(ctx: &Context, db: i32, name: &RedisString, path: Path) {
    match waiters::serve(ctx, db, name, path) {
        Served::Handed | Served::Redirected => {}
        // Writes paused: the sweep serves the key once they resume.
        Served::StillHeld if ffi::writes_paused() => {}
        _ => {
            untrack(db, name.as_slice());
            store::publish_unlock(ctx, name);
        }
    }
}

/// Looks at a lock key after something touched it: a freed lock goes to the first waiter,
/// or, with nobody waiting, its unlock message is published (once: the key is forgotten).
/// Runs where writes propagate (a command or a timer), with `db` selected.
pub fn settle(ctx: &Context, db: i32, name: &RedisString) {
    if waiters::serve(ctx, db, name, Path::Event) != Served::NoWaiters {
        return;
    }
    if ffi::writes_paused() {
        retry_later(ctx, db, name.as_slice());
        return;
    }
    let held = matches!(
        store::read(&LockKey::open(ctx, name, false)),
        Ok(LockState::Held { .. })
    );
    if !held && untrack(db, name.as_slice()) {
        store::publish_unlock(ctx, name);
    }
}

/// Every key with waiters and every tracked lock key.
fn watched_keys() -> Vec<(i32, Vec<u8>)> {
    let mut keys: Vec<(i32, Vec<u8>)> = waiters::with(|q| q.all_keys())
        .into_iter()
        .map(|(db, k)| (db, k.to_vec()))
        .collect();
    TRACKED.with(|t| {
        for (db, tracked) in t.borrow().iter() {
            keys.extend(tracked.iter().map(|k| (*db, k.to_vec())));
        }
    });
    keys
}

/// FLUSHDB/FLUSHALL delete keys without per-key events: look at every key with waiters
/// and every tracked lock (those still there are found held and left alone).
#[flush_event_handler]
fn on_flush(ctx: &Context, subevent: FlushSubevent) {
    if let FlushSubevent::Ended = subevent {
        crate::guard::quietly(|| {
            for (db, key) in watched_keys() {
                schedule(ctx, db, &key);
            }
        });
    }
}

/// SWAPDB exchanges two dbs' contents without per-key events. Every lock key of either
/// db is tracked in both and looked at again: where a lock still is, it stays tracked;
/// where one was and is no more, its unlock message goes out. Waiters keep their db
/// number, so what they wait for may now be free: they are looked at too.
pub fn on_swapdb(ctx: &Context, a: i32, b: i32) {
    TRACKED.with(|t| {
        let mut t = t.borrow_mut();
        let mut union = t.remove(&a).unwrap_or_default();
        union.extend(t.remove(&b).unwrap_or_default());
        if !union.is_empty() {
            t.insert(a, union.clone());
            t.insert(b, union);
        }
    });
    for (db, key) in watched_keys()
        .into_iter()
        .filter(|(db, _)| *db == a || *db == b)
    {
        schedule(ctx, db, &key);
    }
}

/// A server turned replica (REPLICAOF, failover) can grant no locks. Redis 7.0 already
/// answers and drops every blocked client before this event (`UNBLOCKED force unblock
/// ...`), which empties the queues through the disconnect callback; this is the safety
/// net for anything left, and it forgets the lock keys tracked as a master.
#[role_changed_event_handler]
fn on_role_changed(ctx: &Context, role: ServerRole) {
    if let ServerRole::Replica = role {
        crate::guard::quietly(|| {
            // A replica's keys follow its master; what we tracked here no longer applies.
            PENDING.with(|p| p.borrow_mut().clear());
            TRACKED.with(|t| t.borrow_mut().clear());
            waiters::fail_all(ctx, ERR_ROLE_CHANGED);
        });
    }
}
