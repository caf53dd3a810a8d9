//! Work done after the current command: the pending list and sweep that serve keys freed
//! by DEL, expiry, overwrite, FLUSH or SWAPDB once the cause has propagated, grants taken
//! back, and key timers (a primitive's state that changes by itself). A child of `engine`.

use super::*;

// ---- The pending list: keys to look at once the current command has propagated ----

/// The tag of the pending-list timer; expiry timers use tags from 1 up.
const SWEEP_TAG: u64 = 0;

thread_local! {
    pub(super) static PENDING: RefCell<Vec<(i32, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
    static SWEEP_ARMED: Cell<bool> = const { Cell::new(false) };
    /// The sweep's timer while armed (so that [`settle_now`] can stop it).
    static SWEEP_TIMER: Cell<Option<TimerId>> = const { Cell::new(None) };
    static JOB_ARMED: Cell<bool> = const { Cell::new(false) };
    /// The sweep is running (the idle check waits for its end).
    static SWEEPING: Cell<bool> = const { Cell::new(false) };
    static REVOKES: RefCell<Vec<Untold>> = const { RefCell::new(Vec::new()) };
    /// Ticket grants whose grace ran out, with their request-id keys, to take back.
    static TICKET_REVOKES: RefCell<Vec<(Box<[u8]>, Untold)>> = const { RefCell::new(Vec::new()) };
    /// The take-back timer's deadline, while one is armed.
    static TAKE_BACK_ARMED: Cell<Option<i64>> = const { Cell::new(None) };
}

/// The tag of the timer that takes back ticket grants whose connection closed unconfirmed.
const TAKE_BACK_TAG: u64 = 1 << 60;

/// Makes sure the take-back timer fires within `delay_ms` (a connection with ticket grants
/// not yet confirmed closed; they are taken back when their grace ends).
pub(super) fn arm_take_back(ctx: &Context, delay_ms: i64) {
    let at = ffi::now_ms() + delay_ms;
    if matches!(TAKE_BACK_ARMED.with(Cell::get), Some(armed) if armed <= at) {
        return; // it fires first, and arms again for what is left
    }
    TAKE_BACK_ARMED.with(|a| a.set(Some(at)));
    ffi::create_timer(ctx, delay_ms.max(0), TAKE_BACK_TAG);
}

/// The take-back timer: the grants whose grace ended go to the sweep; armed again for the
/// next. An earlier timer superseded by none fires harmlessly (nothing due yet).
fn on_take_back_timer(ctx: &Context) {
    TAKE_BACK_ARMED.with(|a| a.set(None));
    let now = ffi::now_ms();
    let (due, next) = with(|q| q.due_take_backs(now));
    if !due.is_empty() {
        TICKET_REVOKES.with(|r| r.borrow_mut().extend(due));
        arm_sweep(ctx, 0);
    }
    if let Some(at) = next {
        arm_take_back(ctx, at - now);
    }
}

/// Whether the ticket grant remembered under `request_key` (its request id's record) is
/// being taken back: its grace ended (the take-back timer fired) and the sweep that takes
/// it back has not run yet. Its record still replays the grant until then, and a client
/// that collected it in that gap would hold a grant about to be passed on; it must hear
/// `TAKENBACK` instead, as it will from the record once the sweep has run.
pub fn taking_back(request_key: &[u8]) -> bool {
    TICKET_REVOKES.with(|r| {
        let r = r.borrow();
        !r.is_empty() && r.iter().any(|(k, _)| &**k == request_key)
    })
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
/// current loop of the server (evictions: see engine/events.rs).
pub fn schedule_after_loop(ctx: &Context, db: i32, key: &[u8]) {
    PENDING.with(|p| p.borrow_mut().push((db, key.to_vec())));
    arm_sweep(ctx, 0);
}

fn arm_sweep(ctx: &Context, delay_ms: i64) {
    if !SWEEP_ARMED.with(|a| a.replace(true)) {
        let id = ffi::create_timer(ctx, delay_ms, SWEEP_TAG);
        SWEEP_TIMER.with(|t| t.set(Some(id)));
    }
}

/// Nobody waits any more, in a timer's callback (a wait's deadline, a ticket's): the work
/// left for later is done now rather than from zero-delay timers, which fire only after
/// whatever the server reads next. The client told last may send `MODULE UNLOAD` at once,
/// and the server refuses it while the module holds a timer (design.md 10: unload succeeds as
/// soon as the last waiter has its reply). A timer's callback is where the sweep runs
/// anyway: its writes propagate, after everything that caused them.
pub(super) fn settle_now(ctx: &Context) {
    if anyone_waits() {
        return;
    }
    if sweep_due() && !JOB_ARMED.with(Cell::get) && !SWEEPING.with(Cell::get) {
        if let Some(id) = SWEEP_TIMER.with(Cell::take) {
            ffi::stop_timer(ctx, id);
        }
        sweep(ctx);
    }
    events::idle_now(ctx);
}

/// While writes are paused, look at the key again a little later (not at once: that
/// would spin the event loop for the whole pause).
pub(super) fn retry_later(ctx: &Context, db: i32, key: &[u8]) {
    PENDING.with(|p| p.borrow_mut().push((db, key.to_vec())));
    arm_sweep(ctx, PAUSED_RETRY_MS);
}

const PAUSED_RETRY_MS: i64 = 10;

/// True while the sweep has work queued or armed (the idle check waits for it: a key it
/// settles may need its unlock message, which needs tracking).
pub fn sweep_due() -> bool {
    SWEEP_ARMED.with(Cell::get)
        || JOB_ARMED.with(Cell::get)
        || SWEEPING.with(Cell::get)
        || PENDING.with(|p| !p.borrow().is_empty())
        || REVOKES.with(|r| !r.borrow().is_empty())
        || TICKET_REVOKES.with(|r| !r.borrow().is_empty())
        || TAKE_BACK_ARMED.with(|a| a.get().is_some())
}

/// The key `key` in `db` was found missing by its primitive while grants made on it may
/// still be taken back (a waiter that vanished untold, a ticket whose connection closed
/// unconfirmed): the key was deleted since (DEL, expiry, FLUSH...), and what those grants
/// took went with it. Taking them back now would give to whatever is created under the
/// name next: a plain semaphore's take-back is a release, so a semaphore deleted and
/// initialized again would gain permits that never existed in it. They are forgotten
/// instead. Cheap when nothing waits to be taken back (the usual case).
pub fn void_grants_of(db: i32, key: &[u8]) {
    let mut voided = with(|q| q.void_uncollected_of(db, key));
    REVOKES.with(|r| {
        let mut r = r.borrow_mut();
        let before = r.len();
        r.retain(|u| u.db != db || *u.key != *key);
        voided += before - r.len();
    });
    TICKET_REVOKES.with(|r| {
        let mut r = r.borrow_mut();
        let before = r.len();
        r.retain(|(_, u)| u.db != db || *u.key != *key);
        voided += before - r.len();
    });
    for _ in 0..voided {
        stats::bump(|s| &s.voided_handoffs);
    }
}

/// Takes back, on the next sweep, a grant handed to a client that vanished untold.
pub(super) fn revoke_later(ctx: &Context, granted: Untold) {
    REVOKES.with(|r| r.borrow_mut().push(granted));
    arm_sweep(ctx, 0);
}

/// Every module timer lands here: the sweep, a wait's deadline, a key timer, or a key's
/// expiry timer.
pub fn on_timer(ctx: &Context, tag: u64) {
    if tag == SWEEP_TAG {
        sweep(ctx);
    } else if tag == TAKE_BACK_TAG {
        on_take_back_timer(ctx);
    } else if tag == events::IDLE_TAG {
        events::on_idle(ctx);
    } else if tag & DEADLINE_BIT != 0 {
        on_deadline(ctx, Blocked((tag & !DEADLINE_BIT) as usize));
    } else if tag & KEY_TIMER_BIT != 0 {
        on_key_timer(ctx, tag);
    } else {
        on_queue_timer(ctx, tag);
    }
}

// ---- Key timers: a primitive's state that changes by itself, waiters or not ----
//
// The expiry timer above serves waiters. Some state changes at a time of its own (a
// permit-expirable semaphore's permit returns to the pool at its lease end, with Redisson's
// message), and while the key has waiters it is written then, for the waiters and for
// clients that only read the keys or listen on pub/sub. A primitive registers one callback
// at init (lib.rs) and arms a key timer with it, only while its key has waiters (design.md 1: no
// timer while nobody waits): the next command on the key brings the state up to date
// lazily otherwise, and the last waiter's leaving stops the key's timers. The engine keeps
// at most one timer per (callback, db, key), the earliest, and calls the callback with `db`
// selected where writes are allowed: not on a replica (its keys are its master's), and not
// while writes are paused (it retries shortly). The callback does its write and arms again
// for its next time, if any. Timers live in memory only: after a restart or a failover the
// state is brought up to date by the next command on the key (every primitive that uses
// them reads its state that way).

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
        // Nothing armed is the common case (timers only while someone waits): no key
        // copied, nothing hashed.
        if t.armed.is_empty() {
            return None;
        }
        let old = t.armed.remove(&(kind, db, key.to_vec()))?;
        t.tags.remove(&old.tag);
        Some(old)
    });
    if let Some(old) = old {
        ffi::stop_timer(ctx, old.id);
    }
}

/// Stops every key timer of `key` in `db` (its last waiter left: with nobody waiting, a
/// primitive's state that changes by itself is brought up to date lazily, by the next
/// command on the key; see the section's top).
pub(super) fn disarm_key_timers_of(ctx: &Context, db: i32, key: &[u8]) {
    let kinds = KEY_TIMERS.with(|t| t.borrow().kinds.len());
    if KEY_TIMERS.with(|t| t.borrow().armed.is_empty()) {
        return;
    }
    for kind in 0..kinds {
        disarm_key_timer(ctx, kind, db, key);
    }
}

/// Stops every key timer (the server turned replica and every waiter was answered).
pub(super) fn disarm_all_key_timers(ctx: &Context) {
    let armed = KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        t.tags.clear();
        std::mem::take(&mut t.armed)
    });
    for timer in armed.into_values() {
        ffi::stop_timer(ctx, timer.id);
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

/// Stops the key timers of keys nobody waits for (after SWAPDB: a timer followed its key
/// to the other db, where its waiters are not).
pub fn disarm_key_timers_without_waiters(ctx: &Context) {
    let slots: Vec<KeyTimerKey> = KEY_TIMERS.with(|t| t.borrow().armed.keys().cloned().collect());
    for (kind, db, key) in slots {
        if !has_waiters(db, &key) {
            disarm_key_timer(ctx, kind, db, &key);
        }
    }
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
    SWEEP_TIMER.with(|t| t.set(None));
    JOB_ARMED.with(|a| a.set(false));
    {
        // Reset on the way out even if a step panics (guard::quietly catches it): a flag
        // left set would keep the idle check waiting forever.
        struct Sweeping;
        impl Drop for Sweeping {
            fn drop(&mut self) {
                SWEEPING.with(|s| s.set(false));
            }
        }
        SWEEPING.with(|s| s.set(true));
        let _sweeping = Sweeping;
        sweep_lists(ctx);
    }
    if !anyone_waits() {
        events::idle_soon(ctx); // the sweep may have been what the idle check waited for
    }
}

fn sweep_lists(ctx: &Context) {
    if ctx.get_flags().contains(ContextFlags::SLAVE) {
        // A replica's keys are its master's to change.
        PENDING.with(|p| p.borrow_mut().clear());
        REVOKES.with(|r| r.borrow_mut().clear());
        TICKET_REVOKES.with(|r| r.borrow_mut().clear());
        return;
    }
    for granted in REVOKES.with(|r| std::mem::take(&mut *r.borrow_mut())) {
        if ffi::select_db(ctx, granted.db) {
            revoke(ctx, &granted);
        }
    }
    for (record, granted) in TICKET_REVOKES.with(|r| std::mem::take(&mut *r.borrow_mut())) {
        if ffi::select_db(ctx, granted.db) {
            revoke_ticket(ctx, record, granted);
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
    if moved_away(ctx, &untold.key) {
        return;
    }
    let name = RedisString::create_from_slice(std::ptr::null_mut(), &untold.key);
    untold.request.take_back(ctx, untold.db, &name);
}

/// Whether `key`'s slot is served elsewhere now (cluster mode only; a migration still in
/// progress keeps it here).
fn moved_away(ctx: &Context, key: &[u8]) -> bool {
    matches!(
        cluster::route_of(ctx, key),
        cluster::Route::Redirect(e) if e.starts_with("MOVED")
    )
}

/// Takes back a ticket's grant whose connection closed unconfirmed; if the primitive
/// forgot its request id's reply (the grant was still as written, or gone already), marks
/// the id taken back, so that the client's late confirmation hears it lost the hold
/// (design.md 5). A grant its owner built on meanwhile (re-entered) stays, and so does
/// its reply.
fn revoke_ticket(ctx: &Context, record: Box<[u8]>, untold: Untold) {
    if ffi::writes_paused() {
        TICKET_REVOKES.with(|r| r.borrow_mut().push((record, untold)));
        arm_sweep(ctx, PAUSED_RETRY_MS);
        return;
    }
    // The grant's slot left this node (an atomic slot migration): the lock and its
    // request id's record went with it, and the client confirms on the new owner (or the
    // lease ends it there). Writing here would leave keys in a slot this node no longer
    // serves.
    if moved_away(ctx, &untold.key) {
        return;
    }
    let name = RedisString::create_from_slice(std::ptr::null_mut(), &untold.key);
    untold.request.take_back(ctx, untold.db, &name);
    let id = RedisString::create_from_slice(std::ptr::null_mut(), &record);
    if store::record(ctx, &id).is_none() {
        store::remember_taken_back(ctx, &record, ffi::now_ms());
    }
}

// ---- Tracked keys: a message owed when a key the module wrote goes away ----
//
// A primitive may owe its clients a message when its key goes away by any means, even a
// plain DEL, expiry or overwrite (the lock: Redisson's unlock message). It tracks such a
// key (`server::tracking`) with [`track`]; when the key is looked at and nobody waits for
// it, [`settle`] asks the primitive, through its [`Owed`], whether the key still holds what
// it wrote, and if not has it send the message, once. The engine names no primitive: the
// `Owed` comes with the first tracked key (only the lock tracks keys), so there is nothing
// to register at load, and a settle before any key was tracked has nothing to look at.

/// What a primitive that tracks its keys answers about one of them.
pub struct Owed {
    /// True while the key (in the selected db) still holds what the primitive wrote.
    pub held: fn(&Context, &RedisString) -> bool,
    /// Sends what is owed for a key that no longer does (the lock's unlock message).
    pub send: fn(&Context, &RedisString),
}

static OWED: std::sync::OnceLock<&'static Owed> = std::sync::OnceLock::new();

/// Tracks a key the module just wrote, whose primitive owes a message when it goes away.
pub fn track(db: i32, key: &[u8], owed: &'static Owed) {
    OWED.get_or_init(|| owed);
    tracking::track(db, key);
}

/// Looks at a tracked key after something touched it: a freed key goes to the first
/// waiter, or, with nobody waiting, its message is sent (once: the key is forgotten).
/// Runs where writes propagate (a command or a timer), with `db` selected.
pub fn settle(ctx: &Context, db: i32, name: &RedisString) {
    if serve(ctx, db, name, Path::Event) != Served::NoWaiters {
        return;
    }
    if ffi::writes_paused() {
        retry_later(ctx, db, name.as_slice());
        return;
    }
    let Some(owed) = OWED.get() else {
        return; // no key was ever tracked
    };
    if !(owed.held)(ctx, name) && tracking::untrack(db, name.as_slice()) {
        (owed.send)(ctx, name);
    }
}
