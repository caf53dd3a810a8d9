//! Keyspace and server events: noticing a lock with waiters that went away some other way
//! than a release (expiry, DEL/UNLINK, eviction, overwrite, FLUSHDB/FLUSHALL).
//!
//! The handoff is not written from inside the notification. Redis propagates the command
//! that caused the event (DEL, FLUSHALL, the expiry's DEL) *after* the notification
//! returns, so a lock written from there would reach replicas and the AOF before the
//! delete and be wiped by it. Instead the key goes on a pending list served by a zero-delay
//! timer, whose writes propagate after the cause. Until then the key has waiters and no
//! lock: every RLOCK command that finds it so serves the queue first (see commands.rs), so
//! no RLOCK client can barge in between.

use std::cell::{Cell, RefCell};

use redis_module::{
    server_events::FlushSubevent, server_events::ServerRole, Context, NotifyEvent, RedisString,
};
use redis_module_macros::{flush_event_handler, role_changed_event_handler};

use crate::errors::ERR_ROLE_CHANGED;
use crate::ffi;
use crate::stats;
use crate::waiters;

/// The tag of the pending-list timer; expiry timers use tags from 1 up.
const SWEEP_TAG: u64 = 0;

thread_local! {
    static OWN_WRITES: Cell<u32> = const { Cell::new(0) };
    static PENDING: RefCell<Vec<(i32, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
    static SWEEP_ARMED: Cell<bool> = const { Cell::new(false) };
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
/// The common case (nobody waits anywhere) returns after one counter check.
pub fn on_keyspace_event(ctx: &Context, _class: NotifyEvent, event: &str, key: &[u8]) {
    if waiters::with(|q| q.total()) == 0 {
        return;
    }
    let db = ffi::selected_db(ctx);
    if !waiters::has_waiters(db, key) {
        return;
    }
    if event == "expired" {
        stats::bump(|s| &s.expired_with_waiters);
    }
    if OWN_WRITES.with(Cell::get) == 0 {
        schedule(ctx, db, key);
    }
}

fn schedule(ctx: &Context, db: i32, key: &[u8]) {
    PENDING.with(|p| p.borrow_mut().push((db, key.to_vec())));
    if !SWEEP_ARMED.with(|a| a.replace(true)) {
        ffi::create_timer(ctx, 0, SWEEP_TAG);
    }
}

/// Every module timer lands here.
pub fn on_timer(ctx: &Context, tag: u64) {
    if tag == SWEEP_TAG {
        sweep(ctx);
    } else {
        waiters::on_timer(ctx, tag);
    }
}

fn sweep(ctx: &Context) {
    SWEEP_ARMED.with(|a| a.set(false));
    let mut pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    pending.sort_unstable();
    pending.dedup();
    for (db, key) in pending {
        if ffi::select_db(ctx, db) {
            let name = RedisString::create_from_slice(std::ptr::null_mut(), &key);
            waiters::serve(ctx, db, &name);
        }
    }
}

/// FLUSHDB/FLUSHALL delete keys without per-key events: look at every key with waiters.
#[flush_event_handler]
fn on_flush(ctx: &Context, subevent: FlushSubevent) {
    if let FlushSubevent::Ended = subevent {
        crate::guard::quietly(|| {
            for (db, key) in waiters::with(|q| q.all_keys()) {
                schedule(ctx, db, &key);
            }
        });
    }
}

/// A server turned replica (REPLICAOF, failover) answers its waiters with an error.
#[role_changed_event_handler]
fn on_role_changed(ctx: &Context, role: ServerRole) {
    if let ServerRole::Replica = role {
        crate::guard::quietly(|| {
            PENDING.with(|p| p.borrow_mut().clear());
            waiters::fail_all(ctx, ERR_ROLE_CHANGED);
        });
    }
}
