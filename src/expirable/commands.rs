//! The permit-expirable semaphore's commands (RPSEMAPHORE.*, design.md 4.4): parse -> read
//! both keys -> core -> write/replicate/notify -> serve the queue -> publish -> reply;
//! [`ExpAsk`], what a queued RPSEMAPHORE.ACQUIRE asks of the engine; and the lease timer
//! that returns a permit to the pool at its lease end.
//!
//! Layer: the top, beside `semaphore::commands` (whose `finish` shape it repeats for two keys).
//! Calls down into `engine`, `store` and the pure `expirable` core; nothing calls up.
//!
//! Layout: Redisson's RPermitExpirableSemaphore (docs/internals/redisson-sync-layouts.md): the
//! count at the key, the permits in the zset `{key}:timeout` (16 raw id bytes -> expiry
//! ms), the channel `redisson_sc:{key}`. Redisson reclaims an expired permit only when a
//! caller next runs one of its scripts. Here, while the key has waiters, a key timer
//! (engine::arm_key_timer) fires at the earliest lease end, writes the reclaim as
//! Redisson's scripts would (ZREM, INCRBY, the count published) and serves the queue in
//! the same turn. With nobody waiting there is no timer (design.md 1): every read counts an
//! expired permit as available, and the next write on the semaphore reclaims it.

use std::cell::Cell;
use std::io::Read;
use std::rc::Rc;

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::engine::{self, Ask, Check, Grant, KeyTimerKind, Path};
use crate::expirable::{self, ExpState, ID_BYTES, NO_LEASE};
use crate::pipeline::{
    self, err, int_map as map, remember, request_key, waiting_command, Answer, Waiting,
};
use crate::semaphore::{self, Outcome, Plan};
use crate::server::ffi::{KeyKind, LockKey};
use crate::server::store::{self, Value};
use crate::server::{ffi, guard, stats};
use crate::vocab::args;
use crate::vocab::errors::ERR_WRONGTYPE;
use crate::vocab::reply::Reply;

thread_local! {
    /// The lease timer's kind, registered at init (lib.rs).
    static LEASE_TIMER: Cell<Option<KeyTimerKind>> = const { Cell::new(None) };
    /// Permit ids: two splitmix64 streams seeded from /dev/urandom at load.
    static IDS: Cell<(u64, u64)> = Cell::new(seed());
}

/// Registers the lease timer with the engine. Called once from lib.rs's init.
pub fn init() {
    LEASE_TIMER.with(|t| t.set(Some(engine::register_key_timer(on_lease_end))));
}

/// 16 bytes of seed. Ids need to be unique, not secret: within a process each stream is a
/// bijection of its counter, so no id repeats; across processes (restarts, replicas
/// promoted) the random seed keeps them apart, as Redisson's random ids are.
fn seed() -> (u64, u64) {
    let mut b = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if read.is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        b[..8].copy_from_slice(&t.to_le_bytes());
        b[8..].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
    }
    let (lo, hi) = b.split_at(8);
    (
        u64::from_le_bytes(lo.try_into().unwrap_or_default()),
        u64::from_le_bytes(hi.try_into().unwrap_or_default()),
    )
}

fn splitmix(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` fresh permit ids (Redisson's are 16 random bytes too).
fn new_ids(n: i64) -> Vec<[u8; ID_BYTES]> {
    IDS.with(|s| {
        (0..n)
            .map(|_| {
                let (a, b) = s.get();
                let (a, b) = (
                    a.wrapping_add(0x9E37_79B9_7F4A_7C15),
                    b.wrapping_add(0xD1B5_4A32_D192_ED03),
                );
                s.set((a, b));
                let mut id = [0u8; ID_BYTES];
                id[..8].copy_from_slice(&splitmix(a).to_le_bytes());
                id[8..].copy_from_slice(&splitmix(b).to_le_bytes());
                id
            })
            .collect()
    })
}

/// Both keys of `name` (the selected db), or the error a command must answer.
fn read(ctx: &Context, name: &[u8], now: i64) -> Result<ExpState, &'static str> {
    let members = match store::read_any(ctx, &expirable::timeout_key(name)).0 {
        Value::Missing => Vec::new(),
        Value::Zset(items) => items,
        _ => return Err(ERR_WRONGTYPE),
    };
    read_with(ctx, name, now, members)
}

/// [`read`] for an acquire: of the permits held, only those whose lease has ended (which
/// it reclaims) and the earliest lease still running (when the state may change by
/// itself), as Redisson's acquire script reads only the expired range. Reading every
/// permit made an acquire cost more with each permit held: 0.8× Redisson's script with
/// about 40 held. The count key is opened for writing and handed back, for [`finish`] to
/// write through (one lookup of it, not two).
fn read_for_acquire(
    ctx: &Context,
    name: &RedisString,
    now: i64,
) -> Result<(LockKey, ExpState), &'static str> {
    let zset_name = RedisString::create_from_slice(
        std::ptr::null_mut(),
        &expirable::timeout_key(name.as_slice()),
    );
    let zset = LockKey::open(ctx, &zset_name, false);
    let members = match zset.kind() {
        KeyKind::Empty => Vec::new(),
        KeyKind::Zset => zset.zset_through(|at| at > now),
        _ => return Err(ERR_WRONGTYPE),
    };
    drop(zset);
    let count = LockKey::open(ctx, name, true);
    let state = state_of(&count, now, members)?;
    Ok((count, state))
}

/// The state from the count key of `name` and the given permits.
fn read_with(
    ctx: &Context,
    name: &[u8],
    now: i64,
    members: Vec<(Vec<u8>, i64)>,
) -> Result<ExpState, &'static str> {
    let name = RedisString::create_from_slice(std::ptr::null_mut(), name);
    state_of(&LockKey::open(ctx, &name, false), now, members)
}

/// The state from the count key, open as `count`, and the given permits (read where they
/// lie: the count is parsed in place).
fn state_of(
    count: &LockKey,
    now: i64,
    members: Vec<(Vec<u8>, i64)>,
) -> Result<ExpState, &'static str> {
    let at = count.abs_expire();
    let pttl = if at >= 0 { (at - now).max(0) } else { -1 };
    // Scores come as integers; a spoiled one reads as i64::MIN, which the core refuses.
    let members = members.into_iter().map(|(m, s)| (m, s as f64));
    match count.kind() {
        KeyKind::Empty => expirable::parse_state(None, pttl, members, now),
        KeyKind::String => {
            count.with_string(|v| expirable::parse_state(Some(v), pttl, members, now))
        }
        _ => Err(ERR_WRONGTYPE),
    }
}

fn count(outcome: Outcome) {
    match outcome {
        Outcome::Acquired => stats::bump(|s| &s.psem_acquisitions),
        Outcome::Contended => stats::bump(|s| &s.psem_contended),
        Outcome::Released => stats::bump(|s| &s.psem_releases),
        Outcome::Renewed => stats::bump(|s| &s.psem_lease_updates),
        _ => {}
    }
}

/// Arms the lease timer at the earliest lease end of `state` while the key has waiters, or
/// stops it when no permit has a lease left or nobody waits. With nobody waiting no timer
/// is held (design.md 1): an expired permit counts as available to every read at once, and is
/// written back (ZREM, INCRBY, Redisson's message) by the next write on the semaphore,
/// this module's or a Redisson script's, as Redisson itself does.
fn arm(ctx: &Context, db: i32, name: &[u8], state: &ExpState) {
    let Some(kind) = LEASE_TIMER.with(Cell::get) else {
        return;
    };
    match state.next_expiry() {
        Some(at) if engine::has_waiters(db, name) => engine::arm_key_timer(ctx, kind, db, name, at),
        _ => engine::disarm_key_timer(ctx, kind, db, name),
    }
}

/// Writes a plan (through the count key when the caller has it open for writing, which
/// is closed then), remembers its reply, serves the queue when permits came back,
/// publishes Redisson's message capped by what the queue left, and arms the lease timer.
fn finish(
    ctx: &Context,
    db: i32,
    name: &RedisString,
    count_key: Option<LockKey>,
    plan: &Plan<ExpState>,
    request: Option<&RedisString>,
    path: Path,
) {
    match count_key {
        Some(key) => store::apply_effects_in(ctx, name, key, &plan.effects),
        None => store::apply_effects(ctx, name, &plan.effects),
    }
    // Before serving: each grant arms for the state it leaves.
    arm(ctx, db, name.as_slice(), &plan.state);
    count(plan.outcome);
    remember(
        ctx,
        request,
        semaphore::remembers(plan.outcome),
        &plan.reply,
    );
    let mut available = plan.state.available();
    if plan.wake && engine::has_waiters(db, name.as_slice()) {
        engine::serve(ctx, db, name, path);
        available = read(ctx, name.as_slice(), ffi::now_ms()).map_or(0, |s| s.available());
    }
    if let Some(m) = semaphore::message_after_grants(plan.message.as_deref(), available) {
        store::publish(ctx, &expirable::channel(name.as_slice()), &m);
    }
}

/// A changing command: [`pipeline::write_command`]'s shared opening, then the permit-expirable
/// semaphore's read, core, [`finish`] and reply.
fn write_command<'a, P>(
    ctx: &Context,
    args: &'a [RedisString],
    arity: std::ops::RangeInclusive<usize>,
    parse: impl FnOnce(&[&'a [u8]]) -> Result<(P, Option<&'a [u8]>), &'static str>,
    run: impl FnOnce(ExpState, &[u8], P, i64) -> Result<Plan<ExpState>, &'static str>,
) -> RedisResult {
    pipeline::write_command(ctx, args, arity, parse, |db, name, parsed, request| {
        let now = ffi::now_ms();
        let state = read(ctx, name.as_slice(), now).map_err(err)?;
        let plan = run(state, name.as_slice(), parsed, now).map_err(err)?;
        finish(ctx, db, name, None, &plan, request, Path::Command);
        Ok(ffi::value(plan.reply))
    })
}

/// `RPSEMAPHORE.TRYSETPERMITS <key> <permits> [ID <request-id>]`
pub fn try_set_permits(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        write_command(
            ctx,
            args,
            3..=5,
            |a| expirable::parse_permits(a).map(|(n, o)| (n, o.id)),
            expirable::try_set_permits,
        )
    })
}

/// `RPSEMAPHORE.SETPERMITS <key> <permits> [ID <request-id>]`
pub fn set_permits(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        write_command(
            ctx,
            args,
            3..=5,
            |a| expirable::parse_permits(a).map(|(n, o)| (n, o.id)),
            expirable::set_permits,
        )
    })
}

/// `RPSEMAPHORE.ADDPERMITS <key> <delta> [ID <request-id>]`
pub fn add_permits(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        write_command(
            ctx,
            args,
            3..=5,
            |a| expirable::parse_add(a).map(|(n, o)| (n, o.id)),
            expirable::add_permits,
        )
    })
}

/// `RPSEMAPHORE.RELEASE <key> <permit-id> [ID <request-id>]`
pub fn release(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        write_command(
            ctx,
            args,
            3..=5,
            |a| expirable::parse_release(a).map(|(id, o)| (id, o.id)),
            |state, key, id, now| expirable::release(state, key, &id, now),
        )
    })
}

/// `RPSEMAPHORE.UPDATELEASETIME <key> <permit-id> <lease-ms>`
pub fn update_lease_time(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        write_command(
            ctx,
            args,
            4..=4,
            |a| expirable::parse_update(a).map(|p| (p, None)),
            |state, key, (id, lease), now| {
                expirable::update_lease_time(state, key, &id, lease, now)
            },
        )
    })
}

/// `RPSEMAPHORE.ACQUIRE <key> <lease-ms> [PERMITS <n>] [WAIT <timeout-ms> [ASYNC [NOTIFY <tag>] [QUIET]]] [ID <request-id>]`
pub fn acquire(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        waiting_command(
            ctx,
            args,
            3..=13,
            |a| {
                let (lease, o) = expirable::parse_acquire(a)?;
                let waiting = Waiting {
                    timeout: o.wait,
                    queued: o.queued,
                    notify: o.notify,
                    quiet: o.quiet,
                };
                Ok(((lease, o.permits, o.id), o.id, waiting))
            },
            |db, name, (lease, permits, id), request| {
                let now = ffi::now_ms();
                let (count, state) = read_for_acquire(ctx, name, now).map_err(err)?;
                let (permits, many) = (permits.unwrap_or(1), permits.is_some());
                // New ids are not looked up in the rest of the set (the core checks those it
                // was given): a lookup scans a small set's listpack, per id, on every
                // acquire, against odds of 2^-128 (ids are a bijection of a per-process
                // counter from a random seed; Redisson's are random and unchecked).
                let ids = new_ids(permits);
                let queued = engine::has_waiters(db, name.as_slice());
                let plan = expirable::acquire(
                    state,
                    name.as_slice(),
                    permits,
                    lease,
                    &ids,
                    many,
                    now,
                    queued,
                )
                .map_err(err)?;
                finish(ctx, db, name, Some(count), &plan, request, Path::Command);
                let reply = ffi::value(plan.reply);
                if plan.outcome != Outcome::Contended {
                    return Ok(Answer::Now(reply));
                }
                let ask = move || {
                    let Check::Wait { pttl } = wait_check(&plan.state, now) else {
                        unreachable!("wait_check only waits")
                    };
                    let ask = ExpAsk {
                        lease: lease.unwrap_or(NO_LEASE_HERE),
                        many,
                        ids: ids.into_boxed_slice(),
                        request_id: id.map(Into::into),
                    };
                    (Rc::new(ask) as engine::Request, pttl)
                };
                Ok(Answer::Contended { reply, ask })
            },
        )
    })
}

/// A read command's state, with the lease timer armed on a master if it is not and the key
/// has waiters (after a restart or a failover timers are gone; a read is a good moment to
/// put them back).
fn read_only(
    ctx: &Context,
    args: &[RedisString],
    arity: usize,
) -> Result<(ExpState, i64), RedisError> {
    if args.len() != arity {
        return Err(RedisError::WrongArity);
    }
    let now = ffi::now_ms();
    let state = read(ctx, args[1].as_slice(), now).map_err(err)?;
    if ctx.get_flags().contains(ContextFlags::MASTER) {
        arm(ctx, ffi::selected_db(ctx), args[1].as_slice(), &state);
    }
    Ok((state, now))
}

/// `RPSEMAPHORE.AVAILABLEPERMITS <key>`: expired permits count as back.
pub fn available_permits(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        let (state, now) = read_only(ctx, args, 2)?;
        Ok(RedisValue::Integer(expirable::available(&state, now)))
    })
}

/// `RPSEMAPHORE.ACQUIREDPERMITS <key>`: permits held and not expired.
pub fn acquired_permits(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        let (state, now) = read_only(ctx, args, 2)?;
        Ok(RedisValue::Integer(expirable::acquired(&state, now)))
    })
}

/// `RPSEMAPHORE.LEASETIME <key> <permit-id>`: remaining ms, -1 without lease, -2 not held.
pub fn lease_time(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        if args.len() != 3 {
            return Err(RedisError::WrongArity);
        }
        let id = expirable::parse_permit_id(args[2].as_slice()).map_err(err)?;
        let (state, now) = read_only(ctx, args, 3)?;
        Ok(RedisValue::Integer(expirable::lease_time(&state, &id, now)))
    })
}

/// `RPSEMAPHORE.INFO <key>`: available, acquired, permits (their sum), next-expiry-ms (the
/// earliest lease end from now, -1 none), waiters, waiting-permits.
pub fn info(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        let (state, now) = read_only(ctx, args, 2)?;
        let name = args[1].as_slice();
        let db = ffi::selected_db(ctx);
        let (available, acquired) = (
            expirable::available(&state, now),
            expirable::acquired(&state, now),
        );
        let next = live_expiry(&state, now).map_or(-1, |at| at - now);
        Ok(map(&[
            ("available", available),
            ("acquired", acquired),
            ("permits", available.saturating_add(acquired)),
            ("next_expiry_ms", next),
            ("waiters", engine::with(|q| q.len(db, name)) as i64),
            ("waiting_permits", engine::queued_units(db, name)),
        ]))
    })
}

/// The earliest lease end after `now` (expired permits are as good as back).
fn live_expiry(state: &ExpState, now: i64) -> Option<i64> {
    state
        .permits
        .values()
        .copied()
        .filter(|&at| at != NO_LEASE && at > now)
        .min()
}

/// A head that cannot be served waits for the next lease end, or a write (a release, a
/// Java client's INCRBY: see engine::wait_for_write), whichever comes first.
fn wait_check(state: &ExpState, now: i64) -> Check {
    let Check::Wait { pttl: poll } = engine::wait_for_write() else {
        unreachable!("wait_for_write only waits")
    };
    let pttl = match live_expiry(state, now).map(|at| at - now) {
        Some(ms) if poll < 0 => ms,
        Some(ms) => ms.min(poll),
        None => poll,
    };
    Check::Wait { pttl }
}

/// The lease timer: permits whose lease ended go back to the pool now, as a Redisson
/// script's reclaim would write them, and the queue is served with them.
fn on_lease_end(ctx: &Context, db: i32, name: &RedisString) {
    let now = ffi::now_ms();
    let Ok(state) = read(ctx, name.as_slice(), now) else {
        return; // no longer a semaphore: nothing of ours to reclaim
    };
    let Ok(plan) = expirable::expire(state, name.as_slice(), now) else {
        return;
    };
    if let Reply::Int(n) = plan.reply {
        stats::add(|s| &s.psem_permits_expired, n.max(0) as u64);
    }
    finish(ctx, db, name, None, &plan, None, Path::Event);
}

/// A queued `RPSEMAPHORE.ACQUIRE ... WAIT`, its permit ids drawn when it arrived. Kept
/// small (a queued ticket holds thousands, docs/commands/tickets.md): the core's request is built
/// from it when the head is asked.
#[derive(Debug, Clone)]
pub struct ExpAsk {
    /// The lease, [`NO_LEASE_HERE`] for none.
    lease: i64,
    many: bool,
    /// One per permit asked for.
    ids: Box<[[u8; ID_BYTES]]>,
    /// The call's request id: a grant remembers its reply like an immediate acquire.
    request_id: Option<Box<[u8]>>,
}

/// [`ExpAsk::lease`] of a request without a lease (an `Option` would cost 8 bytes more).
const NO_LEASE_HERE: i64 = i64::MIN;

impl ExpAsk {
    fn request(&self) -> expirable::Request {
        expirable::Request {
            permits: self.ids.len() as i64,
            lease: (self.lease != NO_LEASE_HERE).then_some(self.lease),
            ids: self.ids.to_vec(),
            many: self.many,
        }
    }
}

impl Ask for ExpAsk {
    fn names(&self) -> (&[u8], Option<&[u8]>) {
        (b"", self.request_id.as_deref())
    }

    fn check(&self, ctx: &Context, name: &RedisString, now: i64) -> Check {
        let Ok(state) = read(ctx, name.as_slice(), now) else {
            return engine::wait_for_write();
        };
        // The state is kept for `wait_check` when the head cannot be served.
        match expirable::grant(state.clone(), name.as_slice(), &self.request(), now) {
            Some(Ok(plan)) => {
                let request = request_key(name, self.request_id.as_deref());
                Check::Grant(Box::new(move |ctx, name| {
                    let db = ffi::selected_db(ctx);
                    store::apply_effects(ctx, name, &plan.effects);
                    stats::bump(|s| &s.psem_granted_after_wait);
                    remember(ctx, request.as_ref(), true, &plan.reply);
                    // Expired permits reclaimed on the way: Redisson's message, capped.
                    let left = plan.state.available();
                    if let Some(m) = semaphore::message_after_grants(plan.message.as_deref(), left)
                    {
                        store::publish(ctx, &expirable::channel(name.as_slice()), &m);
                    }
                    arm(ctx, db, name.as_slice(), &plan.state);
                    Grant {
                        memo: 0,
                        reply: plan.reply,
                        look_again: None,
                    }
                }))
            }
            // Not servable now (or, at 2^-128 odds, an id already held): wait.
            Some(Err(_)) => engine::wait_for_write(),
            None => wait_check(&state, now),
        }
    }

    fn timed_out(&self, _ctx: &Context, _name: &RedisString) -> Reply {
        Reply::Nil
    }

    /// The client never learned its permit ids: each is released if still held, and its
    /// request id forgotten so a retry does not read the ids it never got.
    fn take_back(&self, ctx: &Context, db: i32, name: &RedisString) {
        if let Some(id) = &self.request_id {
            store::forget_request(ctx, &args::request_key(name.as_slice(), id));
        }
        for id in self.ids.iter() {
            let now = ffi::now_ms();
            let Ok(state) = read(ctx, name.as_slice(), now) else {
                return;
            };
            if let Ok(plan) = expirable::release(state, name.as_slice(), id, now) {
                if plan.outcome == Outcome::Released {
                    stats::bump(|s| &s.revoked_handoffs);
                }
                finish(ctx, db, name, None, &plan, None, Path::Event);
            }
        }
    }

    fn units(&self) -> i64 {
        self.ids.len() as i64
    }

    /// The permit ids, drawn here: a ticket's holder needs them before it proceeds.
    fn detail_on_grant(&self) -> bool {
        true
    }

    /// The key has waiters now: the lease timer is armed for its earliest lease end.
    fn queued(&self, ctx: &Context, db: i32, name: &RedisString) {
        if let Ok(state) = read(ctx, name.as_slice(), ffi::now_ms()) {
            arm(ctx, db, name.as_slice(), &state);
        }
    }
}
