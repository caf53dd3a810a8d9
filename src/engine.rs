//! The waiting engine: clients waiting in the server, and the handoff that serves them.
//!
//! Layer: below `commands` and `events` (which only translate keyspace and server events
//! into calls here), above `store`, `tracking`, `cluster`, `stats` and `ffi`. The pure
//! rules of each primitive (`core` for the lock) sit beside it: state in, plan out.
//!
//! Each key with waiters has one FIFO queue, whatever primitive its waiters ask for (a
//! [`Request`]). When the key may have changed, [`serve`] asks the head's primitive
//! "can the head be granted in this state, and with what plan?" and keeps granting heads
//! until the answer is no (the lock grants at most one). A granted waiter is answered in
//! the same event-loop turn, so nobody else ever sees the lock free (strict first come,
//! first served, no thundering herd of pub/sub wake-ups).
//!
//! Written once here for every primitive: blocking, deadline timers, expiry timers,
//! disconnects, grants taken back from clients that vanished untold, cluster redirection,
//! and the pending list that serves keys freed by DEL, expiry, overwrite, FLUSH or SWAPDB
//! once the cause has propagated (a post-notification job, or a zero-delay timer on 7.0;
//! see events.rs for why the handoff is not written from inside the notification).
//!
//! [`Queues`] is the bookkeeping, pure and unit-tested; the functions below it are the
//! glue that blocks clients, arms timers and performs handoffs.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use redis_module::{Context, ContextFlags, RedisString};

use crate::cluster;
use crate::core::LockState;
use crate::errors::{ERR_INTERNAL, ERR_TOO_MANY_WAITERS};
use crate::ffi::{self, Blocked, LockKey, TimerId, Wake};
use crate::reply::Reply;
use crate::stats;
use crate::store;
use crate::tracking;

/// A lock key: its db and name. Shared (`Rc`) between the queue map and the handle index.
pub type KeyName = Rc<[u8]>;

/// What a waiter asks for: one primitive's request, behind the few questions the engine
/// asks of it. Each primitive implements it beside its commands (`cmd_lock`, ...), above
/// this layer, so the engine never names a primitive and imports none of them.
pub trait Ask: std::fmt::Debug {
    /// Can this request, at the head of its key's queue, be granted in the key's current
    /// state (`name` in the selected db)? Reads only: the grant is written by the
    /// returned [`Check::Grant`], which the engine runs after its own checks.
    fn check(&self, ctx: &Context, name: &RedisString, now: i64) -> Check;
    /// The reply of a waiter whose wait ran out (the lock: the holder's PTTL).
    fn timed_out(&self, ctx: &Context, name: &RedisString) -> Reply;
    /// Takes back a grant handed to a client that vanished before being told, if the key
    /// still holds exactly what the grant wrote, and passes it on (or publishes what a
    /// release would). Runs from a timer, `db` selected.
    fn take_back(&self, ctx: &Context, db: i32, name: &RedisString);
    /// How many units the request asks for (a semaphore's permits), which `…INFO`
    /// commands sum over a queue ([`queued_units`]); 1 where there is no such notion.
    fn units(&self) -> i64 {
        1
    }
}

/// A queued request (shared: the granted list keeps it until the reply goes out).
pub type Request = Rc<dyn Ask>;

/// Writes a grant on the key named by the second argument and says what to tell the
/// waiter.
pub type GrantWrite = Box<dyn FnOnce(&Context, &RedisString) -> Grant>;

/// What [`Ask::check`] answers.
pub enum Check {
    /// Grantable: the engine runs this to write the grant.
    Grant(GrantWrite),
    /// The head waits; the time in ms until the state may change by itself (a lease or a
    /// permit running out), to look again then (negative: only a write or a keyspace
    /// event can change the answer).
    Wait { pttl: i64 },
    /// The head can never be granted as asked (the fenced lock: its token key holds
    /// somebody else's data; the RW lock: a writer-to-be that started reading while it
    /// waited): it leaves the queue with this error, nothing written, and the next head
    /// is asked.
    Refuse(&'static str),
}

/// A grant written by a [`GrantWrite`].
#[derive(Debug)]
pub struct Grant {
    /// What the woken waiter is answered.
    pub reply: Reply,
    /// `Some(pttl)` when nobody behind the head can be granted before that many ms (the
    /// lock: its lease); `None` to keep asking the next head (readers, permits, a latch).
    pub look_again: Option<i64>,
}

/// One blocked client waiting for a key.
#[derive(Debug)]
pub struct Waiter {
    pub request: Request,
    pub handle: Blocked,
    /// The timer that ends the wait (0: waits without limit), see [`wait`].
    pub deadline_timer: TimerId,
    /// When the wait ends, in ms since the epoch (0: no limit).
    pub deadline_at: i64,
}

impl Waiter {
    /// A waiter not yet blocked (its handle is set by [`wait`]).
    pub fn new(request: Request) -> Waiter {
        Waiter {
            request,
            handle: Blocked(0),
            deadline_timer: 0,
            deadline_at: 0,
        }
    }
}

/// A grant handed to a waiter that has not been told yet: what it asked for, to take back
/// (and its request id's remembered reply to forget) if it vanishes untold.
#[derive(Debug, Clone)]
pub struct Untold {
    pub db: i32,
    pub key: KeyName,
    pub request: Request,
}

/// The expiry timer armed for a key with waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArmedTimer {
    pub id: TimerId,
    pub tag: u64,
    pub fire_at: i64,
}

#[derive(Debug, Default)]
struct Queue {
    /// Keyed by arrival sequence number: FIFO order, and O(log n) removal of a waiter that
    /// times out or disconnects from the middle of a long queue.
    waiters: BTreeMap<u64, Waiter>,
    timer: Option<ArmedTimer>,
}

/// Every queue of the server, plus the indexes the callbacks need.
#[derive(Debug, Default)]
pub struct Queues {
    dbs: HashMap<i32, HashMap<KeyName, Queue>>,
    /// Timeout and disconnect callbacks only get the blocked-client handle.
    by_handle: HashMap<Blocked, (i32, KeyName, u64)>,
    /// Expiry timers carry a tag; a tag no longer here belongs to a stale timer.
    timers: HashMap<u64, (i32, KeyName)>,
    /// Waiters handed the lock whose reply is not sent yet (it goes out before Redis
    /// sleeps). If such a client disconnects or is unblocked in between, it never learns
    /// it holds the lock, so the lock is taken back (see [`on_disconnect`]).
    granted: HashMap<Blocked, Untold>,
    next_seq: u64,
    next_tag: u64,
    total: usize,
}

impl Queues {
    pub fn total(&self) -> usize {
        self.total
    }

    pub fn keys_with_waiters(&self) -> usize {
        self.dbs.values().map(HashMap::len).sum()
    }

    pub fn len(&self, db: i32, key: &[u8]) -> usize {
        self.queue(db, key).map_or(0, |q| q.waiters.len())
    }

    fn queue(&self, db: i32, key: &[u8]) -> Option<&Queue> {
        self.dbs.get(&db)?.get(key)
    }

    fn queue_mut(&mut self, db: i32, key: &[u8]) -> Option<&mut Queue> {
        self.dbs.get_mut(&db)?.get_mut(key)
    }

    /// Appends a waiter; refused (and handed back) when the key already has `limit` waiters.
    pub fn push(
        &mut self,
        db: i32,
        key: &[u8],
        waiter: Waiter,
        limit: usize,
    ) -> Result<(), Waiter> {
        let keys = self.dbs.entry(db).or_default();
        let name: KeyName = match keys.get_key_value(key) {
            Some((_, q)) if q.waiters.len() >= limit => return Err(waiter),
            Some((name, _)) => name.clone(),
            None if limit == 0 => return Err(waiter),
            None => Rc::from(key),
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.by_handle
            .insert(waiter.handle, (db, name.clone(), seq));
        keys.entry(name).or_default().waiters.insert(seq, waiter);
        self.total += 1;
        Ok(())
    }

    /// The first waiter of a key, without removing it.
    pub fn head(&self, db: i32, key: &[u8]) -> Option<&Waiter> {
        self.queue(db, key)?.waiters.values().next()
    }

    /// Removes and returns the first waiter of a key, remembering it as granted until
    /// its reply is sent.
    pub fn pop(&mut self, db: i32, key: &[u8]) -> Option<Waiter> {
        let (_, waiter) = self.queue_mut(db, key)?.waiters.pop_first()?;
        if let Some((db, key, _)) = self.by_handle.remove(&waiter.handle) {
            let request = waiter.request.clone();
            self.granted
                .insert(waiter.handle, Untold { db, key, request });
        }
        self.total -= 1;
        Some(waiter)
    }

    /// The deadline of a queued waiter (0 when it waits without limit).
    pub fn deadline_of(&self, handle: Blocked) -> Option<i64> {
        let (db, name, seq) = self.by_handle.get(&handle)?;
        Some(self.queue(*db, name)?.waiters.get(seq)?.deadline_at)
    }

    /// Removes and returns the first waiter of a key that is answered without the lock.
    pub fn take(&mut self, db: i32, key: &[u8]) -> Option<Waiter> {
        let (_, waiter) = self.queue_mut(db, key)?.waiters.pop_first()?;
        self.by_handle.remove(&waiter.handle);
        self.total -= 1;
        Some(waiter)
    }

    /// The reply of a granted waiter went out: nothing more to watch.
    pub fn replied(&mut self, handle: Blocked) {
        self.granted.remove(&handle);
    }

    /// A granted waiter vanished before its reply: the lock it was handed, to take back.
    pub fn ungrant(&mut self, handle: Blocked) -> Option<Untold> {
        self.granted.remove(&handle)
    }

    /// Removes the waiter with this handle wherever it queues; returns it with its key.
    pub fn remove(&mut self, handle: Blocked) -> Option<(i32, KeyName, Waiter)> {
        let (db, name, seq) = self.by_handle.remove(&handle)?;
        let waiter = self.queue_mut(db, &name)?.waiters.remove(&seq)?;
        self.total -= 1;
        Some((db, name, waiter))
    }

    /// Drops the queue of a key that has no waiters left; returns its timer to stop.
    pub fn forget_if_empty(&mut self, db: i32, key: &[u8]) -> Option<ArmedTimer> {
        let keys = self.dbs.get_mut(&db)?;
        if !keys.get(key)?.waiters.is_empty() {
            return None;
        }
        let queue = keys.remove(key)?;
        if keys.is_empty() {
            self.dbs.remove(&db);
        }
        let timer = queue.timer?;
        self.timers.remove(&timer.tag);
        Some(timer)
    }

    /// Decides whether a key needs its expiry timer (re)armed for a lock expiring at
    /// `expire_at`. A timer that fires earlier is kept: it finds the lock still held and
    /// re-arms, which costs less than stopping a timer on every renewal. Returns the timer
    /// to stop (if any) and the tag for the new one.
    pub fn plan_timer(
        &mut self,
        db: i32,
        key: &[u8],
        fire_at: i64,
    ) -> Option<(Option<ArmedTimer>, u64)> {
        let queue = self.queue(db, key)?;
        if queue.waiters.is_empty() {
            return None;
        }
        let old = queue.timer;
        if matches!(old, Some(t) if t.fire_at <= fire_at) {
            return None;
        }
        if let Some(t) = old {
            self.timers.remove(&t.tag);
        }
        self.next_tag += 1;
        Some((old, self.next_tag))
    }

    /// Records the timer armed after [`Queues::plan_timer`].
    pub fn set_timer(&mut self, db: i32, key: &[u8], timer: ArmedTimer) {
        if let Some((name, queue)) = self.dbs.get_mut(&db).and_then(|k| {
            k.get_key_value(key)
                .map(|(n, _)| n.clone())
                .zip(k.get_mut(key))
        }) {
            queue.timer = Some(timer);
            self.timers.insert(timer.tag, (db, name));
        }
    }

    /// The key of a firing timer, if the timer is still the one armed for it.
    pub fn fired(&mut self, tag: u64) -> Option<(i32, KeyName)> {
        let (db, name) = self.timers.remove(&tag)?;
        if let Some(queue) = self.queue_mut(db, &name) {
            if matches!(queue.timer, Some(t) if t.tag == tag) {
                queue.timer = None;
            }
        }
        Some((db, name))
    }

    /// All keys with waiters (for a flush, which deletes keys without per-key events).
    pub fn all_keys(&self) -> Vec<(i32, KeyName)> {
        self.dbs
            .iter()
            .flat_map(|(db, keys)| keys.keys().map(move |k| (*db, k.clone())))
            .collect()
    }

    /// Gives back the indexes' memory once nobody waits: hash maps keep the capacity of
    /// their largest moment, so a burst of 10 000 waiters would otherwise hold their
    /// index (hundreds of KB) for the server's lifetime. Cheap when already small.
    fn shrink_when_idle(&mut self) {
        if self.by_handle.capacity() > 0 && self.by_handle.is_empty() {
            self.by_handle.shrink_to_fit();
        }
        if self.granted.capacity() > 0 && self.granted.is_empty() {
            self.granted.shrink_to_fit();
        }
        if self.timers.capacity() > 0 && self.timers.is_empty() {
            self.timers.shrink_to_fit();
        }
        if self.dbs.capacity() > 0 && self.dbs.is_empty() {
            self.dbs.shrink_to_fit();
        }
    }

    /// Empties every queue; returns the handles to answer and the timers to stop.
    pub fn drain(&mut self) -> (Vec<Blocked>, Vec<TimerId>) {
        let mut handles = Vec::with_capacity(self.total);
        let mut timers = Vec::new();
        for (_, keys) in self.dbs.drain() {
            for (_, queue) in keys {
                for w in queue.waiters.into_values() {
                    handles.push(w.handle);
                    timers.extend((w.deadline_timer != 0).then_some(w.deadline_timer));
                }
                timers.extend(queue.timer.map(|t| t.id));
            }
        }
        self.by_handle.clear();
        self.timers.clear();
        self.granted.clear();
        self.total = 0;
        (handles, timers)
    }
}

thread_local! {
    // All module callbacks run on Redis's main thread. Borrows are kept short and never
    // held across a key write or a notification: those re-enter the event handler.
    static QUEUES: RefCell<Queues> = RefCell::new(Queues::default());
}

/// `total() > 0`, kept beside the queues so that the keyspace callback, which runs on
/// every event of the server, reads one flag instead of borrowing them. A plain static:
/// only Redis's main thread touches it.
static ANYONE_WAITS: AtomicBool = AtomicBool::new(false);

pub fn with<R>(f: impl FnOnce(&mut Queues) -> R) -> R {
    QUEUES.with(|q| {
        let mut q = q.borrow_mut();
        let out = f(&mut q);
        ANYONE_WAITS.store(q.total > 0, Relaxed);
        if q.total == 0 {
            q.shrink_when_idle();
        }
        out
    })
}

/// Whether the server tells the module of every write to a key with waiters (Redis 7.0's
/// keyspace events, to which the module subscribes for strings, hashes and sorted sets),
/// or only of removals (7.2+/Valkey's key server event: no tax on other writes). Set once
/// by `events::subscribe`.
static WRITES_REPORTED: AtomicBool = AtomicBool::new(true);

pub fn set_writes_reported(reported: bool) {
    WRITES_REPORTED.store(reported, Relaxed);
}

/// How often a queue looks again at a key where a write it is not told of could let its
/// head in (a semaphore raised by a Java client's INCRBY, where only removals are
/// reported): the bound on how late such a waiter is served.
pub const UNREPORTED_WRITE_POLL_MS: i64 = 10;

/// The [`Check`] of a head that only a write can let in: wait for the write's keyspace
/// event where the server reports it, else look again every [`UNREPORTED_WRITE_POLL_MS`].
pub fn wait_for_write() -> Check {
    let pttl = if WRITES_REPORTED.load(Relaxed) {
        -1
    } else {
        UNREPORTED_WRITE_POLL_MS
    };
    Check::Wait { pttl }
}

/// True when any client waits for any lock.
pub fn anyone_waits() -> bool {
    ANYONE_WAITS.load(Relaxed)
}

/// True when somebody waits for this key. Cheap when nobody waits anywhere.
pub fn has_waiters(db: i32, key: &[u8]) -> bool {
    with(|q| q.total > 0 && q.len(db, key) > 0)
}

/// The sum of [`Ask::units`] over a key's queue (0 without waiters).
pub fn queued_units(db: i32, key: &[u8]) -> i64 {
    with(|q| {
        q.queue(db, key).map_or(0, |queue| {
            queue.waiters.values().map(|w| w.request.units()).sum()
        })
    })
}

/// Blocks the current client until it is handed the lock or `timeout_ms` passes.
/// `pttl` is the holder's remaining lease, to arm the expiry timer.
pub fn wait(
    ctx: &Context,
    db: i32,
    name: &RedisString,
    mut waiter: Waiter,
    timeout_ms: i64,
    pttl: i64,
) -> Result<(), &'static str> {
    let key = name.as_slice();
    let limit = crate::config::max_waiters_per_key();
    if with(|q| q.len(db, key)) >= limit {
        return Err(ERR_TOO_MANY_WAITERS);
    }
    let handle = ffi::block_client(ctx);
    waiter.handle = handle;
    // The module ends the wait itself, with a timer of its own, rather than giving Redis
    // a timeout: a handoff and a timeout then both go through the queue, and whichever
    // takes the waiter out first answers it, exactly once. (Redis's timeout of a client
    // the module unblocked in the same turn sends no reply.) It is also on time, where
    // Redis checks timeouts only when serverCron wakes it, up to 1000/hz ms late.
    if timeout_ms > 0 {
        waiter.deadline_at = ffi::now_ms() + timeout_ms;
        waiter.deadline_timer = ffi::create_timer(ctx, timeout_ms, DEADLINE_BIT | handle.0 as u64);
    }
    if let Err(refused) = with(|q| q.push(db, key, waiter, limit)) {
        // Cannot happen (checked above, single-threaded), but a handle must never leak.
        stop_deadline(ctx, &refused);
        ffi::unblock(handle, Some(Wake::Error(ERR_TOO_MANY_WAITERS.into())));
    }
    note_expiry(ctx, db, key, pttl);
    Ok(())
}

/// Makes sure a key with waiters is looked at again when its lock expires (`pttl` from
/// now; negative means no TTL, so only a release or a keyspace event can free it).
///
/// This is what makes an expired lock with waiters change hands within a few ms of its
/// TTL: Redis's own active expiry samples keys and may take far longer to notice.
pub fn note_expiry(ctx: &Context, db: i32, key: &[u8], pttl: i64) {
    if pttl < 0 || !has_waiters(db, key) {
        return;
    }
    // Expiry is `now > when`, so the key is gone one ms after its PTTL runs out.
    let fire_at = ffi::now_ms() + pttl + 1;
    if let Some((old, tag)) = with(|q| q.plan_timer(db, key, fire_at)) {
        if let Some(old) = old {
            ffi::stop_timer(ctx, old.id);
        }
        let id = ffi::create_timer(ctx, pttl + 1, tag);
        with(|q| q.set_timer(db, key, ArmedTimer { id, tag, fire_at }));
    }
}

/// Who is asking [`serve`] to look at a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// An RLOCK command on this key, which Redis Cluster routed here: the key is ours.
    Command,
    /// A keyspace event, flush, swap or timer: the key may have left this node.
    Event,
}

/// What [`serve`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The key's slot is migrating or lives on another node: the waiters were redirected.
    Redirected,
    /// At least the head of the queue was granted (for the lock: the first waiter holds it).
    Handed,
    /// The head cannot be granted (the lock is held); waiters keep waiting, the expiry
    /// timer is armed.
    StillHeld,
    /// Nobody waits for this key.
    NoWaiters,
}

/// Grants the waiters of `name` in `db` from the head of the queue while the head's
/// primitive says it can be granted. Must run where writes are allowed and propagated: a
/// command or a timer. `ctx` must have `db` selected.
pub fn serve(ctx: &Context, db: i32, name: &RedisString, path: Path) -> Served {
    let key_bytes = name.as_slice();
    if with(|q| q.head(db, key_bytes).is_none()) {
        forget_if_empty(ctx, db, key_bytes);
        return Served::NoWaiters;
    }
    if ffi::writes_paused() {
        retry_later(ctx, db, key_bytes);
        return Served::StillHeld;
    }
    // An RLOCK command on this key was routed here by Redis Cluster: the key is ours.
    let mut routed = path == Path::Command;
    let mut handed = false;
    // The answer when the loop stops: Handed if it granted anyone, else `otherwise`.
    let done = |handed: bool, otherwise: Served| if handed { Served::Handed } else { otherwise };
    loop {
        let Some(head) = with(|q| q.head(db, key_bytes).map(|w| w.request.clone())) else {
            forget_if_empty(ctx, db, key_bytes);
            return done(handed, Served::NoWaiters);
        };
        let write = match head.check(ctx, name, ffi::now_ms()) {
            Check::Grant(write) => write,
            Check::Wait { pttl } => {
                note_expiry(ctx, db, key_bytes, pttl);
                return done(handed, Served::StillHeld);
            }
            Check::Refuse(error) => {
                if let Some(waiter) = with(|q| q.take(db, key_bytes)) {
                    stop_deadline(ctx, &waiter);
                    ffi::unblock(waiter.handle, Some(Wake::Error(error.into())));
                }
                continue;
            }
        };
        if !routed {
            routed = true;
            if let cluster::Route::Redirect(error) = cluster::route_of(ctx, key_bytes) {
                redirect(ctx, db, key_bytes, error);
                return Served::Redirected;
            }
        }
        let Some(waiter) = with(|q| q.pop(db, key_bytes)) else {
            return done(handed, Served::NoWaiters);
        };
        let grant = write(ctx, name);
        stop_deadline(ctx, &waiter);
        ffi::unblock(waiter.handle, Some(Wake::Reply(grant.reply)));
        stats::bump(|s| &s.handoffs);
        handed = true;
        if let Some(pttl) = grant.look_again {
            forget_if_empty(ctx, db, key_bytes);
            note_expiry(ctx, db, key_bytes, pttl);
            return Served::Handed;
        }
    }
}

/// Answers every waiter of a key with a cluster redirection (the key left this node).
fn redirect(ctx: &Context, db: i32, key: &[u8], error: String) {
    while let Some(waiter) = with(|q| q.take(db, key)) {
        stop_deadline(ctx, &waiter);
        ffi::unblock(waiter.handle, Some(Wake::Error(error.clone().into())));
    }
    forget_if_empty(ctx, db, key);
}

/// Timer tags with this bit end a wait; the other bits are the waiter's blocked-client
/// handle (a pointer, far below 2^63). Expiry timers use small counters, the sweep 0.
pub const DEADLINE_BIT: u64 = 1 << 63;

/// Stops a waiter's deadline timer once it leaves the queue early, so no timer outlives
/// its waiter (a pending timer would also keep MODULE UNLOAD from succeeding).
fn stop_deadline(ctx: &Context, waiter: &Waiter) {
    if waiter.deadline_timer != 0 {
        ffi::stop_timer(ctx, waiter.deadline_timer);
    }
}

fn forget_if_empty(ctx: &Context, db: i32, key: &[u8]) {
    if let Some(timer) = with(|q| q.forget_if_empty(db, key)) {
        ffi::stop_timer(ctx, timer.id);
    }
}

/// A wait's deadline timer fired: the waiter leaves the queue and gets the holder's PTTL,
/// as a non-waiting ACQUIRE would (-2 if the lock is, for this instant, gone).
pub fn on_deadline(ctx: &Context, handle: Blocked) {
    // Every way out of the queue stops this timer, so the waiter is the one it was armed
    // for; the deadline check guards against a handle reused by a later waiter anyway.
    let due = with(|q| q.deadline_of(handle)).is_some_and(|at| at <= ffi::now_ms());
    let Some((db, name, waiter)) = due.then(|| with(|q| q.remove(handle))).flatten() else {
        return;
    };
    stats::bump(|s| &s.wait_timeouts);
    let reply = if ffi::select_db(ctx, db) {
        let name_rs = RedisString::create_from_slice(std::ptr::null_mut(), &name);
        waiter.request.timed_out(ctx, &name_rs)
    } else {
        Reply::Int(-2)
    };
    forget_if_empty(ctx, db, &name);
    ffi::unblock(handle, Some(Wake::Reply(reply)));
}

/// Timeout callback, reached only through `CLIENT UNBLOCK <id> TIMEOUT` (the module gives
/// Redis no timeout): the waiter leaves the queue and gets the holder's PTTL.
pub fn on_timeout(ctx: &Context, handle: Blocked) {
    let Some((db, name, waiter)) = with(|q| q.remove(handle)) else {
        // Already handed the lock: Redis does not time out an unblocked client, so this
        // is unreachable; answer something rather than leave the client hanging.
        ffi::reply_error(ctx, ERR_INTERNAL);
        return;
    };
    stats::bump(|s| &s.wait_timeouts);
    stop_deadline(ctx, &waiter); // fired already, unless this is CLIENT UNBLOCK
                                 // The timeout context belongs to the blocked client, whose db is the waiter's db.
    let name_rs = RedisString::create_from_slice(std::ptr::null_mut(), &name);
    ffi::reply_with(ctx, &waiter.request.timed_out(ctx, &name_rs));
    forget_if_empty(ctx, db, &name);
    ffi::unblock(handle, None);
}

/// Disconnect callback (also CLIENT UNBLOCK, CLIENT KILL): the waiter leaves the queue.
///
/// A client handed the lock whose reply had not gone out yet never learns it holds the
/// lock: that lock would sit unused for a whole lease while others wait. It is taken
/// back (released as its owner would) and passes to the next waiter. Its handle was
/// already given back to Redis at the handoff.
pub fn on_disconnect(ctx: &Context, handle: Blocked) {
    if let Some((db, name, waiter)) = with(|q| q.remove(handle)) {
        stop_deadline(ctx, &waiter);
        forget_if_empty(ctx, db, &name);
        ffi::unblock(handle, None);
    } else if let Some(granted) = with(|q| q.ungrant(handle)) {
        revoke_later(ctx, granted);
    }
}

/// Reply callback hook: a woken waiter was told.
pub fn on_replied(handle: Blocked) {
    with(|q| q.replied(handle));
}

/// An expiry timer fired: serve the key if its lock is gone.
fn on_expiry_timer(ctx: &Context, tag: u64) {
    if let Some((db, name)) = with(|q| q.fired(tag)) {
        if ffi::select_db(ctx, db) {
            let name_rs = RedisString::create_from_slice(std::ptr::null_mut(), &name);
            serve(ctx, db, &name_rs, Path::Event);
        }
    }
}

/// The server stopped being a master: a replica cannot grant locks, so every waiter is
/// answered with an error now rather than left waiting for a handoff that cannot come,
/// and the pending list is dropped (a replica's keys are its master's to change).
pub fn fail_all(ctx: &Context, error: &'static str) {
    PENDING.with(|p| p.borrow_mut().clear());
    let (handles, timers) = with(Queues::drain);
    for id in timers {
        ffi::stop_timer(ctx, id);
    }
    for handle in handles {
        ffi::unblock(handle, Some(Wake::Error(error.into())));
    }
}

// ---- The pending list: keys to look at once the current command has propagated ----

/// The tag of the pending-list timer; expiry timers use tags from 1 up.
const SWEEP_TAG: u64 = 0;

thread_local! {
    static PENDING: RefCell<Vec<(i32, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
    static SWEEP_ARMED: Cell<bool> = const { Cell::new(false) };
    static JOB_ARMED: Cell<bool> = const { Cell::new(false) };
    static REVOKES: RefCell<Vec<Untold>> = const { RefCell::new(Vec::new()) };
}

/// Puts a key on the pending list, served by a post-notification job where the server
/// has them, else by a zero-delay timer.
pub fn schedule(ctx: &Context, db: i32, key: &[u8]) {
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

/// Puts a key on the pending list served by the zero-delay timer alone, after the
/// current loop of the server (evictions: see events.rs).
pub fn schedule_after_loop(ctx: &Context, db: i32, key: &[u8]) {
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
fn retry_later(ctx: &Context, db: i32, key: &[u8]) {
    PENDING.with(|p| p.borrow_mut().push((db, key.to_vec())));
    arm_sweep(ctx, PAUSED_RETRY_MS);
}

const PAUSED_RETRY_MS: i64 = 10;

/// Takes back, on the next sweep, a grant handed to a client that vanished untold.
fn revoke_later(ctx: &Context, granted: Untold) {
    REVOKES.with(|r| r.borrow_mut().push(granted));
    arm_sweep(ctx, 0);
}

/// Every module timer lands here: the sweep, a wait's deadline, a key timer, or a key's
/// expiry timer.
pub fn on_timer(ctx: &Context, tag: u64) {
    if tag == SWEEP_TAG {
        sweep(ctx);
    } else if tag & DEADLINE_BIT != 0 {
        on_deadline(ctx, Blocked((tag & !DEADLINE_BIT) as usize));
    } else if tag & KEY_TIMER_BIT != 0 {
        on_key_timer(ctx, tag);
    } else {
        on_expiry_timer(ctx, tag);
    }
}

// ---- Key timers: a primitive's state that changes by itself, waiters or not ----
//
// The expiry timer above serves waiters. Some state changes at a time of its own even when
// nobody waits, and must be written then for clients that only read the keys or listen on
// pub/sub (a permit-expirable semaphore's permit returns to the pool at its lease end, with
// Redisson's message). A primitive registers one callback at init (lib.rs) and arms a key
// timer with it; the engine keeps at most one timer per (callback, db, key), the earliest,
// and calls the callback with `db` selected where writes are allowed: not on a replica
// (its keys are its master's), and not while writes are paused (it retries shortly).
// The callback does its write and arms again for its next time, if any. Timers live in
// memory only: after a restart or a failover the state is brought up to date by the next
// command on the key (every primitive that uses them reads its state that way).

/// Timer tags with this bit (and not [`DEADLINE_BIT`]) are key timers; the other bits
/// count up. Expiry timers' counters stay far below it.
pub const KEY_TIMER_BIT: u64 = 1 << 62;

/// A key timer's callback: `db` is selected, `name` is the key it was armed for.
pub type KeyTimerFn = fn(&Context, i32, &RedisString);

/// Which registered callback a key timer runs (an index handed out by
/// [`register_key_timer`]).
pub type KeyTimerKind = usize;

type KeyTimerKey = (KeyTimerKind, i32, Vec<u8>);

#[derive(Default)]
struct KeyTimers {
    kinds: Vec<KeyTimerFn>,
    armed: HashMap<KeyTimerKey, ArmedTimer>,
    tags: HashMap<u64, KeyTimerKey>,
    next_tag: u64,
}

thread_local! {
    static KEY_TIMERS: RefCell<KeyTimers> = RefCell::new(KeyTimers::default());
}

/// Registers a primitive's key timer callback (once, at init); returns its kind.
pub fn register_key_timer(f: KeyTimerFn) -> KeyTimerKind {
    KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        t.kinds.push(f);
        t.kinds.len() - 1
    })
}

/// Makes sure `kind`'s callback runs for `key` in `db` at `fire_at` (ms since the epoch)
/// or earlier. An earlier timer already armed is kept: it fires, finds nothing due yet
/// and arms again, which costs less than stopping a timer on every renewal.
pub fn arm_key_timer(ctx: &Context, kind: KeyTimerKind, db: i32, key: &[u8], fire_at: i64) {
    let slot = (kind, db, key.to_vec());
    let old = KEY_TIMERS.with(|t| {
        let t = t.borrow();
        t.armed.get(&slot).copied()
    });
    if matches!(old, Some(t) if t.fire_at <= fire_at) {
        return;
    }
    if let Some(old) = old {
        ffi::stop_timer(ctx, old.id);
    }
    // Rounded up from the wall clock's microseconds: Redis fires a timer once its delay
    // has passed, and the callback must then read `now_ms() >= fire_at` (a permit expires
    // when its score <= now), not a millisecond short of it, which would cost a re-arm.
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let delay = (fire_at.saturating_mul(1000) - now_us + 999).div_euclid(1000);
    let tag = KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        if let Some(old) = old {
            t.tags.remove(&old.tag);
        }
        t.next_tag += 1;
        KEY_TIMER_BIT | t.next_tag
    });
    let id = ffi::create_timer(ctx, delay, tag);
    KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        t.tags.insert(tag, slot.clone());
        t.armed.insert(slot, ArmedTimer { id, tag, fire_at });
    });
}

/// Stops `kind`'s timer for `key` in `db`, if one is armed (the state has no time of its
/// own left, say every leased permit was released): no timer outlives its reason.
pub fn disarm_key_timer(ctx: &Context, kind: KeyTimerKind, db: i32, key: &[u8]) {
    let old = KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        let old = t.armed.remove(&(kind, db, key.to_vec()))?;
        t.tags.remove(&old.tag);
        Some(old)
    });
    if let Some(old) = old {
        ffi::stop_timer(ctx, old.id);
    }
}

/// SWAPDB exchanged two dbs' contents: the key timers armed for keys of either db now
/// belong to the other number, where their keys went (else a permit's lease end would be
/// looked for in the db it left, and only the next command on the key would reclaim it).
pub fn swap_key_timers(a: i32, b: i32) {
    let other = |db: i32| {
        if db == a {
            b
        } else if db == b {
            a
        } else {
            db
        }
    };
    KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        let armed = std::mem::take(&mut t.armed);
        t.armed = armed
            .into_iter()
            .map(|((kind, db, key), timer)| ((kind, other(db), key), timer))
            .collect();
        for slot in t.tags.values_mut() {
            slot.1 = other(slot.1);
        }
    });
}

/// How many key timers are armed (INFO, leak tests).
pub fn key_timers_armed() -> usize {
    KEY_TIMERS.with(|t| t.borrow().armed.len())
}

fn on_key_timer(ctx: &Context, tag: u64) {
    let Some(((kind, db, key), f)) = KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        let slot = t.tags.remove(&tag)?;
        if matches!(t.armed.get(&slot), Some(a) if a.tag == tag) {
            t.armed.remove(&slot);
        }
        let f = *t.kinds.get(slot.0)?;
        Some((slot, f))
    }) else {
        return;
    };
    if ctx.get_flags().contains(ContextFlags::SLAVE) {
        return; // a replica's keys are its master's to change
    }
    if ffi::writes_paused() {
        arm_key_timer(ctx, kind, db, &key, ffi::now_ms() + PAUSED_RETRY_MS);
        return;
    }
    if ffi::select_db(ctx, db) {
        let name = RedisString::create_from_slice(std::ptr::null_mut(), &key);
        f(ctx, db, &name);
    }
}

/// The pending list's server: a timer's callback, or a post-notification job's.
pub fn sweep(ctx: &Context) {
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

/// Takes back a grant handed to a waiter that vanished before being told (its primitive
/// checks the key still holds what the grant wrote), then serves the next waiter.
fn revoke(ctx: &Context, untold: &Untold) {
    if ffi::writes_paused() {
        REVOKES.with(|r| r.borrow_mut().push(untold.clone()));
        arm_sweep(ctx, PAUSED_RETRY_MS);
        return;
    }
    let name = RedisString::create_from_slice(std::ptr::null_mut(), &untold.key);
    untold.request.take_back(ctx, untold.db, &name);
}

/// After a lock was freed: hand it to the first waiter, or tell pub/sub waiters
/// (Redisson's) that it is free. A handoff publishes nothing: the lock never was free.
pub fn freed(ctx: &Context, db: i32, name: &RedisString, path: Path) {
    match serve(ctx, db, name, path) {
        Served::Handed | Served::Redirected => {}
        // Writes paused: the sweep serves the key once they resume.
        Served::StillHeld if ffi::writes_paused() => {}
        _ => {
            tracking::untrack(db, name.as_slice());
            store::publish_unlock(ctx, name);
        }
    }
}

/// Looks at a lock key after something touched it: a freed lock goes to the first waiter,
/// or, with nobody waiting, its unlock message is published (once: the key is forgotten).
/// Runs where writes propagate (a command or a timer), with `db` selected.
pub fn settle(ctx: &Context, db: i32, name: &RedisString) {
    if serve(ctx, db, name, Path::Event) != Served::NoWaiters {
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
    if !held && tracking::untrack(db, name.as_slice()) {
        store::publish_unlock(ctx, name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request that is never asked anything: these tests are about the bookkeeping.
    #[derive(Debug)]
    #[allow(dead_code)] // read through Debug only
    struct Probe(usize);

    impl Ask for Probe {
        fn check(&self, _: &Context, _: &RedisString, _: i64) -> Check {
            unreachable!()
        }
        fn timed_out(&self, _: &Context, _: &RedisString) -> Reply {
            unreachable!()
        }
        fn take_back(&self, _: &Context, _: i32, _: &RedisString) {
            unreachable!()
        }
    }

    fn waiter(n: usize) -> Waiter {
        Waiter {
            handle: Blocked(n),
            ..Waiter::new(Rc::new(Probe(n)))
        }
    }

    #[test]
    fn it_serves_waiters_first_come_first_served() {
        let mut q = Queues::default();
        for n in 1..=5 {
            q.push(0, b"k", waiter(n), 100).unwrap();
        }
        let order: Vec<usize> = std::iter::from_fn(|| q.pop(0, b"k").map(|w| w.handle.0)).collect();
        assert_eq!(order, vec![1, 2, 3, 4, 5]);
        assert_eq!(q.total(), 0);
    }

    #[test]
    fn it_removes_a_waiter_from_the_middle_and_keeps_the_order() {
        let mut q = Queues::default();
        for n in 1..=4 {
            q.push(0, b"k", waiter(n), 100).unwrap();
        }
        let (db, name, w) = q.remove(Blocked(2)).unwrap();
        assert_eq!((db, &name[..], w.handle), (0, &b"k"[..], Blocked(2)));
        assert!(q.remove(Blocked(2)).is_none(), "a handle is removed once");
        assert_eq!(q.pop(0, b"k").unwrap().handle, Blocked(1));
        assert_eq!(q.pop(0, b"k").unwrap().handle, Blocked(3));
        assert_eq!(q.total(), 1);
    }

    #[test]
    fn it_keeps_keys_and_dbs_apart() {
        let mut q = Queues::default();
        q.push(0, b"a", waiter(1), 10).unwrap();
        q.push(1, b"a", waiter(2), 10).unwrap();
        q.push(0, b"b", waiter(3), 10).unwrap();
        assert_eq!((q.len(0, b"a"), q.len(1, b"a"), q.len(0, b"b")), (1, 1, 1));
        assert_eq!(q.keys_with_waiters(), 3);
        assert_eq!(q.pop(1, b"a").unwrap().handle, Blocked(2));
    }

    #[test]
    fn it_refuses_waiters_beyond_the_limit() {
        let mut q = Queues::default();
        q.push(0, b"k", waiter(1), 2).unwrap();
        q.push(0, b"k", waiter(2), 2).unwrap();
        assert!(q.push(0, b"k", waiter(3), 2).is_err());
        assert!(q.push(0, b"other", waiter(4), 0).is_err());
        assert_eq!(q.total(), 2);
    }

    #[test]
    fn it_forgets_an_empty_queue_and_returns_its_timer() {
        let mut q = Queues::default();
        q.push(0, b"k", waiter(1), 10).unwrap();
        let (old, tag) = q.plan_timer(0, b"k", 1000).unwrap();
        assert!(old.is_none());
        let t = ArmedTimer {
            id: 7,
            tag,
            fire_at: 1000,
        };
        q.set_timer(0, b"k", t);
        assert!(q.forget_if_empty(0, b"k").is_none(), "not empty yet");
        q.pop(0, b"k");
        assert_eq!(q.forget_if_empty(0, b"k"), Some(t));
        assert_eq!(q.keys_with_waiters(), 0);
        assert!(q.fired(tag).is_none(), "the stopped timer's tag is stale");
    }

    #[test]
    fn it_keeps_an_earlier_timer_and_replaces_a_later_one() {
        let mut q = Queues::default();
        q.push(0, b"k", waiter(1), 10).unwrap();
        let (_, tag) = q.plan_timer(0, b"k", 1000).unwrap();
        q.set_timer(
            0,
            b"k",
            ArmedTimer {
                id: 1,
                tag,
                fire_at: 1000,
            },
        );
        // A renewal pushes the expiry later: the armed timer fires first and re-arms.
        assert!(q.plan_timer(0, b"k", 5000).is_none());
        // A shorter lease needs an earlier timer: the old one is returned to be stopped.
        let (old, tag2) = q.plan_timer(0, b"k", 500).unwrap();
        assert_eq!(old.unwrap().id, 1);
        q.set_timer(
            0,
            b"k",
            ArmedTimer {
                id: 2,
                tag: tag2,
                fire_at: 500,
            },
        );
        assert!(q.fired(tag).is_none(), "the replaced timer is stale");
        assert_eq!(
            q.fired(tag2).map(|(db, k)| (db, k.to_vec())),
            Some((0, b"k".to_vec()))
        );
    }

    #[test]
    fn it_remembers_a_granted_waiter_until_its_reply_goes_out() {
        let mut q = Queues::default();
        q.push(0, b"k", waiter(1), 10).unwrap();
        q.push(0, b"k", waiter(2), 10).unwrap();
        q.pop(0, b"k").unwrap();
        q.pop(0, b"k").unwrap();
        q.replied(Blocked(1));
        assert!(
            q.ungrant(Blocked(1)).is_none(),
            "told: nothing to take back"
        );
        let g = q.ungrant(Blocked(2)).unwrap();
        assert_eq!((g.db, &g.key[..]), (0, &b"k"[..]));
        assert_eq!(format!("{:?}", g.request), "Probe(2)");
        assert!(q.ungrant(Blocked(2)).is_none());
    }

    #[test]
    fn it_drains_every_queue() {
        let mut q = Queues::default();
        q.push(0, b"a", waiter(1), 10).unwrap();
        q.push(3, b"b", waiter(2), 10).unwrap();
        let (mut handles, _) = q.drain();
        handles.sort_by_key(|h| h.0);
        assert_eq!(handles, vec![Blocked(1), Blocked(2)]);
        assert_eq!((q.total(), q.keys_with_waiters()), (0, 0));
        assert!(q.remove(Blocked(1)).is_none());
    }

    #[test]
    fn it_gives_back_its_indexes_memory_once_nobody_waits() {
        let mut q = Queues::default();
        for n in 1..=1000 {
            q.push(0, format!("k{n}").as_bytes(), waiter(n), 10)
                .unwrap();
        }
        assert!(q.by_handle.capacity() >= 1000);
        q.shrink_when_idle();
        assert!(q.by_handle.capacity() >= 1000, "not while anyone waits");
        for n in 1..=1000 {
            q.remove(Blocked(n));
            q.forget_if_empty(0, format!("k{n}").as_bytes());
        }
        q.shrink_when_idle();
        assert_eq!((q.by_handle.capacity(), q.dbs.capacity()), (0, 0));
    }
}
