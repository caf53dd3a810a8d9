//! Keyspace and server events: noticing a lock that went away some other way than a
//! release (expiry, DEL/UNLINK, eviction, overwrite, FLUSHDB/FLUSHALL). With waiters, the
//! first one is handed the lock; without, Redisson's unlock message is published, as for
//! a release, so pub/sub waiters wake at once instead of at the old lease's end.
//!
//! The module knows which keys are locks it wrote (`TRACKED`): a key is tracked when an
//! RLOCK command or a handoff creates a lock there, and forgotten when the lock is freed.
//!
//! How removals are noticed costs every other command of the server, so it depends on
//! what the server offers (checked at run time, never required at load):
//! - Redis 7.2+ and Valkey report every key removed, expired, evicted or overwritten to
//!   modules directly (the key server event), and only those: a SET of a new key, an
//!   INCR, an LPUSH never reach the module. A key that is not a hash is turned away in
//!   ffi.rs before its name is read.
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
//! delete and be wiped by it. The key goes on a pending list, served
//! - where the server has post-notification jobs (7.2+, Valkey), by a job that runs when
//!   the cause is done and propagated, still inside the same command: no other client,
//!   not even a Lua script in the same pipeline, sees the lock free;
//! - on 7.0, by a zero-delay timer, whose writes also propagate after the cause. Until it
//!   fires the key has waiters and no lock: every RLOCK command that finds it so serves
//!   the queue first (see commands.rs), so no RLOCK client can barge in; a Lua script can
//!   (README, "Freeing and handoff").

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize};

use redis_module::{
    server_events::FlushSubevent, server_events::ServerRole, Context, ContextFlags, RedisString,
};
use redis_module_macros::{flush_event_handler, role_changed_event_handler};

use crate::core::LockState;
use crate::errors::ERR_ROLE_CHANGED;
use crate::ffi::{self, LockKey, Removal};
use crate::stats;
use crate::store;
use crate::waiters::{self, Granted, Path, Served};

/// The tag of the pending-list timer; expiry timers use tags from 1 up.
const SWEEP_TAG: u64 = 0;

/// The lock keys the module wrote, per db, behind [`FILTER`], which answers "surely not"
/// for almost every other key at the cost of a cheap hash. The set hashes with foldhash,
/// seeded at random per set: key names come from clients, so a fixed hash would let them
/// pile keys into one bucket; SipHash (std's default) cost 6 % of a new lock's ACQUIRE.
#[derive(Default)]
struct Tracked {
    dbs: HashMap<i32, HashSet<Box<[u8]>, foldhash::fast::RandomState>>,
}

/// 2^17 counters: with 10 000 locks tracked, 7 % of other keys pass the filter.
const FILTER_BITS: u32 = 17;

/// Saturating counters indexed by [`quick_hash`] of the tracked keys (their db is not
/// hashed). Zero means no tracked key has that hash; a saturated one never goes down.
/// Plain statics rather than thread-locals: the keyspace callback reads them on every
/// event of the server, and a thread-local in a shared library costs a call to find.
/// Only Redis's main thread touches them (Relaxed loads and stores are plain moves).
static FILTER: [AtomicU8; 1 << FILTER_BITS] = [const { AtomicU8::new(0) }; 1 << FILTER_BITS];
/// How many keys are tracked: zero turns every event away before the key is hashed.
static TRACKED_KEYS: AtomicUsize = AtomicUsize::new(0);

/// A fast hash of a key name for the filter: 8 bytes at a time, a multiply per word.
fn quick_hash(key: &[u8]) -> usize {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = key.len() as u64;
    let mut words = key.chunks_exact(8);
    for w in &mut words {
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))).wrapping_mul(K);
    }
    let mut last = [0u8; 8];
    last[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h.rotate_left(5) ^ u64::from_le_bytes(last)).wrapping_mul(K);
    (h >> (64 - FILTER_BITS)) as usize
}

impl Tracked {
    fn insert(&mut self, db: i32, key: &[u8]) {
        if self.dbs.entry(db).or_default().insert(key.into()) {
            let c = &FILTER[quick_hash(key)];
            c.store(c.load(Relaxed).saturating_add(1), Relaxed);
            TRACKED_KEYS.fetch_add(1, Relaxed);
        }
    }

    fn remove(&mut self, db: i32, key: &[u8]) -> bool {
        let Some(keys) = self.dbs.get_mut(&db) else {
            return false;
        };
        let removed = keys.remove(key);
        if keys.is_empty() {
            self.dbs.remove(&db);
        }
        if removed {
            let c = &FILTER[quick_hash(key)];
            let n = c.load(Relaxed);
            if n != u8::MAX {
                c.store(n - 1, Relaxed);
            }
            TRACKED_KEYS.fetch_sub(1, Relaxed);
        }
        removed
    }

    fn contains(&self, db: i32, key: &[u8]) -> bool {
        self.dbs.get(&db).is_some_and(|keys| keys.contains(key))
    }

    fn clear(&mut self) {
        self.dbs.clear();
        for c in &FILTER {
            c.store(0, Relaxed);
        }
        TRACKED_KEYS.store(0, Relaxed);
    }
}

/// False for a key surely not tracked in any db; true means "look in the set".
fn might_be_tracked(key: &[u8]) -> bool {
    FILTER[quick_hash(key)].load(Relaxed) != 0
}

/// False when no event can concern the module: no lock tracked, nobody waiting. Asked
/// before the key's name is even read.
fn watching() -> bool {
    TRACKED_KEYS.load(Relaxed) != 0 || waiters::anyone_waits()
}

/// Nesting depth of the module's own writes (see [`OwnWrite`]); main thread only.
static OWN_WRITES: AtomicU32 = AtomicU32::new(0);

thread_local! {
    static PENDING: RefCell<Vec<(i32, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
    static SWEEP_ARMED: Cell<bool> = const { Cell::new(false) };
    static JOB_ARMED: Cell<bool> = const { Cell::new(false) };
    static REVOKES: RefCell<Vec<Granted>> = const { RefCell::new(Vec::new()) };
    static TRACKED: RefCell<Tracked> = RefCell::new(Tracked::default());
}

/// Subscribes to key removals the cheapest way the server offers (see the top of file).
pub fn subscribe(ctx: &Context) {
    ffi::set_post_job_handler(sweep);
    if !ffi::subscribe_key_removals(ctx, on_removed) {
        ffi::subscribe_keyspace(ctx, watching, on_removed);
    }
}

/// Remembers that `key` in `db` holds a lock the module wrote.
pub fn track(db: i32, key: &[u8]) {
    TRACKED.with(|t| t.borrow_mut().insert(db, key));
}

/// Forgets a lock key; true if it was tracked.
pub fn untrack(db: i32, key: &[u8]) -> bool {
    TRACKED.with(|t| t.borrow_mut().remove(db, key))
}

/// True if the module wrote a lock at this key that it has not seen freed.
pub fn is_tracked(db: i32, key: &[u8]) -> bool {
    TRACKED.with(|t| t.borrow().contains(db, key))
}

/// How many lock keys the module tracks (for INFO).
pub fn tracked_count() -> usize {
    TRACKED.with(|t| t.borrow().dbs.values().map(HashSet::len).sum())
}

/// Marks the module's own writes, whose notifications need no handoff check.
pub struct OwnWrite(());

impl OwnWrite {
    pub fn begin() -> OwnWrite {
        OWN_WRITES.fetch_add(1, Relaxed);
        OwnWrite(())
    }
}

impl Drop for OwnWrite {
    fn drop(&mut self) {
        OWN_WRITES.fetch_sub(1, Relaxed);
    }
}

/// A key was removed, expired, evicted or overwritten (or, on 7.0, touched by a command
/// of a class that can do that). Runs on every such event of the server: the common case,
/// a key that is no lock with nobody waiting anywhere, returns after the filter.
fn on_removed(ctx: &Context, db: i32, removal: Removal, key: &[u8]) {
    if OWN_WRITES.load(Relaxed) != 0 {
        return; // the module's own write: it knows what it did
    }
    if !waiters::anyone_waits() && !might_be_tracked(key) {
        return;
    }
    crate::guard::quietly(|| noticed(ctx, db, removal, key));
}

fn noticed(ctx: &Context, db: i32, removal: Removal, key: &[u8]) {
    let waiting = waiters::has_waiters(db, key);
    if !waiting && !is_tracked(db, key) {
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
        PENDING.with(|p| p.borrow_mut().push((db, key.to_vec())));
        arm_sweep(ctx, 0);
    } else {
        schedule(ctx, db, key);
    }
}

/// Puts a key on the pending list, served by a post-notification job where the server
/// has them, else by a zero-delay timer.
fn schedule(ctx: &Context, db: i32, key: &[u8]) {
    PENDING.with(|p| p.borrow_mut().push((db, key.to_vec())));
    if JOB_ARMED.with(Cell::get) {
        return;
    }
    if ffi::add_post_job(ctx) {
        JOB_ARMED.with(|a| a.set(true));
    } else {
        arm_sweep(ctx, 0);
    }
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

/// The pending list's server: a timer's callback, or a post-notification job's.
fn sweep(ctx: &Context) {
    SWEEP_ARMED.with(|a| a.set(false));
    JOB_ARMED.with(|a| a.set(false));
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
        for (db, tracked) in t.borrow().dbs.iter() {
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
        let mut union: Vec<Box<[u8]>> = [a, b]
            .iter()
            .filter_map(|db| t.dbs.get(db))
            .flat_map(|keys| keys.iter().cloned())
            .collect();
        union.sort_unstable();
        union.dedup();
        for key in &union {
            for db in [a, b] {
                t.remove(db, key);
                t.insert(db, key);
            }
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
