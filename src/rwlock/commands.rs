//! The read-write lock's commands (RRWLOCK.*, design.md 4.1) on the shared pipeline: each
//! declares its parsing and its plan (`rwlock`'s rule on the hash and its timeout keys);
//! the pipeline serves a pending queue first, replays request ids and waits or queues;
//! here the effects are written, waiters served and Redisson's message published. And
//! [`RwAsk`], what a queued RRWLOCK.ACQUIRE asks of the engine: its grant rule.
//!
//! Layer: the top, beside `lock::commands` and `pipeline`; calls down into `pipeline`,
//! `engine`, `store` and the pure `rwlock`; nothing calls up into it.
//!
//! Every command first serves the key's queue if it has one (the pipeline's opening: a key
//! freed by DEL or expiry whose handoff is pending goes to the first waiter) and then works on the state with
//! the read holds past their own lease dropped (`rwlock`'s plans all start with that), so
//! a dead reader loses its hold at its lease end even while other readers renew.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::rc::Rc;

use redis_module::redisvalue::RedisValueKey;
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::engine::ticket::Names;
use crate::engine::{self, Ask, Check, Grant, Path};
use crate::pipeline::{
    err, release_command, remember, waiting_command, write_command, Answer, Parsed, Waiting,
};
use crate::rwlock::{self, Mode, Outcome, Plan, RwState, Side};
use crate::server::ffi::{self, KeyKind, LockKey};
use crate::server::store;
use crate::server::{guard, replication, stats};
use crate::vocab::apply::Word;
use crate::vocab::args;
use crate::vocab::effects::{Effect, KeyRef};
use crate::vocab::errors::{ERR_RW_ACQUIREAT_INTERNAL, ERR_WRONGTYPE};
use crate::vocab::reply;

fn count(plan: &Plan, side: Option<Side>) {
    match (plan.outcome, side) {
        (Outcome::Acquired | Outcome::Reentered, Some(Side::Read)) => {
            stats::bump(|s| &s.rw_read_acquisitions)
        }
        (Outcome::Acquired | Outcome::Reentered, _) => stats::bump(|s| &s.rw_write_acquisitions),
        (Outcome::Contended, _) => stats::bump(|s| &s.rw_contended),
        (Outcome::Released | Outcome::Decremented, _) => stats::bump(|s| &s.rw_releases),
        (Outcome::ForceReleased, _) => stats::bump(|s| &s.rw_forced_releases),
        (Outcome::Renewed, _) => stats::bump(|s| &s.rw_renewals),
        (Outcome::NotHeld | Outcome::NoLock | Outcome::Expired, _) => {}
    }
    for _ in 0..plan.dropped {
        stats::bump(|s| &s.rw_read_leases_ended);
    }
}

fn rs(bytes: &[u8]) -> RedisString {
    RedisString::create_from_slice(std::ptr::null_mut(), bytes)
}

/// An absolute expiry as PTTL answers it (-1 none, -2 no key), for `HashView::into_state`.
fn abs_to_pttl(at: i64, now: i64) -> i64 {
    if at < 0 {
        at
    } else {
        (at - now).max(0)
    }
}

/// Reads the lock: the hash, its expiry and the expiry of every read hold's timeout key.
/// A missing key is a free lock; a hash not in Redisson's RW layout (a plain RLOCK lock
/// among them) is `ERR_NOT_A_RWLOCK`; any other type `WRONGTYPE`.
fn read_state(ctx: &Context, name: &[u8], now: i64) -> Result<RwState, &'static str> {
    state_of(ctx, &LockKey::open(ctx, &rs(name), false), name, now)
}

/// [`read_state`] for a command that writes what it read: the lock's key opened once,
/// for writing, and handed back for [`write`] to write through (a second open costs a
/// key lookup and a handle, about 600 instructions).
fn open_state(
    ctx: &Context,
    name: &RedisString,
    now: i64,
) -> Result<(LockKey, RwState), &'static str> {
    let key = LockKey::open(ctx, name, true);
    let state = state_of(ctx, &key, name.as_slice(), now)?;
    Ok((key, state))
}

/// The state of the lock `name`, its key open as `key`.
fn state_of(ctx: &Context, key: &LockKey, name: &[u8], now: i64) -> Result<RwState, &'static str> {
    let fields = match key.kind() {
        KeyKind::Empty => return Ok(RwState::free()),
        KeyKind::Hash => key.hash_fields(),
        _ => return Err(ERR_WRONGTYPE),
    };
    let at = key.abs_expire();
    let view = rwlock::parse_hash(fields)?;
    let pttls: Vec<i64> = view
        .timeout_keys(name)
        .iter()
        .map(|k| abs_to_pttl(LockKey::open(ctx, &rs(k), false).abs_expire(), now))
        .collect();
    Ok(view.into_state(abs_to_pttl(at, now), &pttls, now))
}

/// How long a waiter of `side` may wait before the state can change by itself: the next
/// read lease end or hash expiry; for a reader also the poll where the server does not
/// report a foreign write in place (a Redisson writer leaving while it still reads turns
/// the lock to read mode without removing the hash). Negative: only an event can help.
fn wait_pttl(state: &RwState, side: Side, now: i64) -> i64 {
    let deadline = state
        .next_deadline()
        .map_or(-1, |at| (at.saturating_sub(now)).max(0));
    let poll = match (side, engine::wait_for_write()) {
        (Side::Read, Check::Wait { pttl }) => pttl,
        _ => -1,
    };
    match (deadline, poll) {
        (d, p) if p < 0 => d,
        (d, p) if d < 0 => p,
        (d, p) => d.min(p),
    }
}

/// After a plan: waiters are served if it may have let them in, then Redisson's message
/// goes out unless a queued writer took the lock (nobody else could have); a key still
/// with waiters gets its timer at the next deadline.
fn settle_after(ctx: &Context, db: i32, name: &RedisString, plan: &Plan, now: i64) {
    let mut message = plan.message;
    if plan.wake && engine::has_waiters(db, name.as_slice()) {
        engine::serve(ctx, db, name, Path::Command);
        let state = read_state(ctx, name.as_slice(), ffi::now_ms()).unwrap_or_default();
        message = rwlock::message_after_grants(message, &state);
    }
    if let Some(message) = message {
        store::publish(ctx, &rwlock::channel(name.as_slice()), message);
    }
    if engine::has_waiters(db, name.as_slice()) {
        if let Some(at) = plan.state.next_deadline() {
            engine::note_expiry(ctx, db, name.as_slice(), (at - now).max(0));
        }
    }
}

/// `RRWLOCK.ACQUIRE <key> READ|WRITE <owner> <lease-ms> [WAIT <timeout-ms> [ASYNC [NOTIFY <tag>] [QUIET]]] [ID <request-id>]`
pub fn acquire(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        waiting_command(
            ctx,
            args,
            5..=usize::MAX,
            |a| {
                let (side, a) = rwlock::parse_rw_acquire(a)?;
                let waiting = Waiting {
                    timeout: a.wait,
                    queued: a.queued,
                    notify: a.notify,
                    quiet: a.quiet,
                };
                Ok(((side, a.owner, a.lease, a.id), a.id, waiting))
            },
            |db, name, (side, owner, lease, id), request| {
                let now = ffi::now_ms();
                let (key, state) = open_state(ctx, name, now).map_err(err)?;
                let queued = engine::has_waiters(db, name.as_slice());
                let plan =
                    rwlock::acquire(&state, name.as_slice(), side, owner, lease, now, queued)
                        .map_err(err)?;
                let reply = if request.is_none() && rwlock::writes_alone(&plan) {
                    // A hold taken or re-entered, nothing written after it: it replicates
                    // as RRWLOCK.ACQUIREAT, itself with this server's clock (design.md 1.4).
                    let words = [
                        Word::Bytes(name.as_slice()),
                        Word::Bytes(side.as_bytes()),
                        Word::Bytes(owner),
                        Word::Int(lease),
                        Word::Int(now),
                    ];
                    ffi::as_rewritten_alone(ctx, c"RRWLOCK.ACQUIREAT", &words, || {
                        write(ctx, name, key, &plan, Some(side), request)
                    })
                } else {
                    write(ctx, name, key, &plan, Some(side), request)
                };
                // Whatever the plan dropped (dead readers) may concern those already
                // queued, whether or not this call joins them.
                settle_after(ctx, db, name, &plan, now);
                if plan.outcome != Outcome::Contended {
                    return Ok(Answer::Now(reply));
                }
                let ask = move || {
                    let ask = RwAsk::new(side, owner, lease, id);
                    let pttl = wait_pttl(&plan.state, side, now);
                    (Rc::new(ask) as engine::Request, pttl)
                };
                Ok(Answer::Contended { reply, ask })
            },
        )
    })
}

/// `RRWLOCK.ACQUIREAT [<key>] <payload>`: internal (design.md 1.4; the key first in
/// cluster mode, see server/ffi/replication.rs), what RRWLOCK.ACQUIRE replicates when
/// it takes or re-enters a hold and writes nothing after it: the command made
/// deterministic, its key, side, owner, lease and the primary's clock as one argument (a
/// RESP array of the five). The clock decides the lease ends and which read holds had
/// ended; a replica or an AOF reload reads the same keys (the primary's deletions of
/// expired ones come before this in its stream) and runs the acquire's rule with it: the
/// same hash, timeout keys and expiries, the plain commands' notifications. No counter and
/// no request-id record (the primary never sends this with one); refused from ordinary
/// clients, whose holds would otherwise end whenever they chose.
pub fn acquire_at(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        let words = replication::internal_words(ctx, args, ERR_RW_ACQUIREAT_INTERNAL, 5)?;
        let [name, side, owner, lease, now] = words[..] else {
            unreachable!("internal_words returns as many words as asked")
        };
        let (side, a) = rwlock::parse_rw_acquire(&[side, owner, lease]).map_err(err)?;
        let now = replication::internal_time(now)?;
        let name = ctx.create_string(name);
        let (key, state) = open_state(ctx, &name, now).map_err(err)?;
        let plan = rwlock::acquire(&state, name.as_slice(), side, a.owner, a.lease, now, false)
            .map_err(err)?;
        if plan.outcome == Outcome::Contended {
            // The primary took the hold: the replica's data had diverged.
            ctx.log_warning("rlock: RRWLOCK.ACQUIREAT found the hold refused");
        }
        // Deterministic: onward (a replica's own AOF and replicas) as it came.
        ffi::as_called_alone(|| store::apply_effects_in(ctx, &name, key, &plan.effects));
        Ok(ffi::value(plan.reply.into()))
    })
}

/// Writes a plan's effects (through the lock's key, closed then), counts its outcome and
/// remembers its reply under the request id if it changed the lock; the reply.
fn write(
    ctx: &Context,
    name: &RedisString,
    key: LockKey,
    plan: &Plan,
    side: Option<Side>,
    request: Option<&RedisString>,
) -> RedisValue {
    store::apply_effects_in(ctx, name, key, &plan.effects);
    count(plan, side);
    let reply: reply::Reply = plan.reply.into();
    remember(ctx, request, rwlock::remembers(plan.outcome), &reply);
    ffi::value(reply)
}

/// A changing command without waiting: the pipeline's opening (the queue served first),
/// the lock read with the clock the plan will use, `plan` (which also says the side its
/// outcome is counted under), [`write`], then waiters served and Redisson's message
/// ([`settle_after`]).
///
/// `collects`: the command is a release, which may end with `COLLECT grant-id` after its
/// first `collects` words ([`release_command`]).
fn change<'a, P>(
    ctx: &Context,
    args: &'a [RedisString],
    arity: std::ops::RangeInclusive<usize>,
    collects: Option<usize>,
    parse: impl FnOnce(&[&'a [u8]]) -> Parsed<'a, P>,
    plan: impl FnOnce(&RwState, &[u8], P, i64) -> (Plan, Option<Side>),
) -> RedisResult {
    let body = |db, name: &RedisString, parsed, request: Option<&RedisString>| {
        let now = ffi::now_ms();
        let (key, state) = open_state(ctx, name, now).map_err(err)?;
        let (plan, side) = plan(&state, name.as_slice(), parsed, now);
        let reply = write(ctx, name, key, &plan, side, request);
        settle_after(ctx, db, name, &plan, now);
        Ok(reply)
    };
    match collects {
        Some(fixed) => release_command(ctx, args, fixed, arity, parse, body),
        None => write_command(ctx, args, arity, parse, body),
    }
}

/// `RRWLOCK.RELEASE <key> READ|WRITE <owner> [<lease-ms>] [ID <request-id>] [COLLECT <grant-id>]`
pub fn release(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        change(
            ctx,
            args,
            4..=7,
            Some(4),
            |a| {
                let (side, a) = rwlock::parse_rw_release(a)?;
                Ok(((side, a.owner, a.lease), a.id))
            },
            |state, name, (side, owner, lease), now| {
                let plan = rwlock::release(state, name, side, owner, lease, now);
                (plan, Some(side))
            },
        )
    })
}

/// `RRWLOCK.RENEW <key> READ|WRITE <owner> <lease-ms>`
pub fn renew(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        change(
            ctx,
            args,
            5..=5,
            None,
            |a| Ok((rwlock::parse_rw_renew(a)?, None)),
            |state, name, (side, owner, lease), now| {
                let plan = rwlock::renew(state, name, side, owner, lease, now);
                (plan, Some(side))
            },
        )
    })
}

/// `RRWLOCK.FORCERELEASE <key> [READ|WRITE]`
pub fn force_release(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        change(
            ctx,
            args,
            2..=3,
            None,
            |a| Ok((rwlock::parse_rw_force(a)?, None)),
            |state, name, side, now| (rwlock::force_release(state, name, side, now), side),
        )
    })
}

fn key(s: &str) -> RedisValueKey {
    RedisValueKey::String(s.into())
}

/// `RRWLOCK.INFO <key>`: read-only, so read holds past their lease are left out of the
/// answer rather than dropped (the next write command drops them).
pub fn info(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        if args.len() != 2 {
            return Err(RedisError::WrongArity);
        }
        let name = &args[1];
        let now = ffi::now_ms();
        let state = read_state(ctx, name.as_slice(), now).map_err(err)?;
        // What the next command will see: the dropping plan, not applied.
        let state = rwlock::expire(&state, name.as_slice(), now).state;
        let Some(mode) = state.mode else {
            return Ok(RedisValue::Null);
        };
        let waiting = engine::with(|q| q.len(ffi::selected_db(ctx), name.as_slice()));
        let writer = match &state.writer {
            Some(w) => RedisValue::OrderedMap(BTreeMap::from([(
                RedisValueKey::BulkString(w.owner.clone()),
                RedisValue::Integer(w.count),
            )])),
            None => RedisValue::Null,
        };
        let readers = state
            .read_holds(now)
            .into_iter()
            .map(|(owner, holds, remaining)| {
                (
                    RedisValueKey::BulkString(owner.to_vec()),
                    RedisValue::Array(vec![
                        RedisValue::Integer(holds),
                        RedisValue::Integer(remaining),
                    ]),
                )
            })
            .collect();
        let mode = match mode {
            Mode::Read => "read",
            Mode::Write => "write",
        };
        // An ordered map: a map under RESP3, flat pairs under RESP2, keys in a stable order.
        Ok(RedisValue::OrderedMap(BTreeMap::from([
            (key("mode"), RedisValue::BulkString(mode.into())),
            (key("pttl"), RedisValue::Integer(state.pttl(now))),
            (key("readers"), RedisValue::OrderedMap(readers)),
            (key("waiters"), RedisValue::Integer(waiting as i64)),
            (key("writer"), writer),
        ])))
    })
}

/// A queued `RRWLOCK.ACQUIRE ... WAIT`.
#[derive(Debug, Clone)]
pub struct RwAsk {
    /// The owner and the call's request id (a handoff remembers its reply under it).
    names: Names,
    side: Side,
    lease: i64,
    /// The owner's hold count on its side right after the grant (0 before): a take-back
    /// releases only a grant nobody has touched since. 32 bits keep a queued ticket
    /// within its memory budget (libc malloc's next size class; a grant's count is 1 or a
    /// reader's few); a count beyond them is kept as 0, which no take-back matches: that
    /// grant is left to its lease.
    granted: Cell<u32>,
}

impl RwAsk {
    pub fn new(side: Side, owner: &[u8], lease: i64, request_id: Option<&[u8]>) -> RwAsk {
        RwAsk {
            names: Names::new(owner, request_id),
            side,
            lease,
            granted: Cell::new(0),
        }
    }

    fn owner(&self) -> &[u8] {
        self.names.owner()
    }

    fn request_id(&self) -> Option<&[u8]> {
        self.names.id()
    }

    /// What the pure core's queue rule asks about.
    fn request(&self) -> rwlock::Request {
        rwlock::Request {
            side: self.side,
            owner: self.owner().to_vec(),
            lease: self.lease,
        }
    }

    fn holds(&self, state: &RwState) -> i64 {
        match self.side {
            Side::Read => state.read_count(self.owner()),
            Side::Write => state
                .writer
                .as_ref()
                .filter(|w| w.owner == self.owner())
                .map_or(0, |w| w.count),
        }
    }
}

impl Ask for RwAsk {
    fn names(&self) -> (&[u8], Option<&[u8]>) {
        (self.owner(), self.request_id())
    }

    fn granted(&self, holds: i64) {
        self.granted.set(u32::try_from(holds).unwrap_or(0));
    }

    fn check(&self, ctx: &Context, name: &RedisString, now: i64) -> Check {
        let key = name.as_slice();
        // A key overwritten with something else counts as free, as for the lock: the
        // waiters were promised the lock at this key, so the head gets it.
        let (state, replace) = match read_state(ctx, key, now) {
            Ok(state) => (state, false),
            Err(_) => (RwState::free(), true),
        };
        match rwlock::grant(&state, key, &self.request(), now) {
            Some(Ok(mut plan)) => {
                if replace {
                    plan.effects.insert(0, Effect::Del(KeyRef::Main));
                }
                let ask = self.clone();
                Check::Grant(Box::new(move |ctx, name| {
                    ask.write_grant(ctx, name, &plan, now)
                }))
            }
            Some(Err(e)) => Check::Refuse(e),
            None => {
                // Dead readers go now, even though the head still waits (for a live one).
                let dropped = rwlock::expire(&state, key, now);
                if !replace && !dropped.effects.is_empty() {
                    store::apply_effects(ctx, name, &dropped.effects);
                    count(&dropped, None);
                }
                Check::Wait {
                    pttl: wait_pttl(&dropped.state, self.side, now),
                }
            }
        }
    }

    fn timed_out(&self, ctx: &Context, name: &RedisString) -> reply::Reply {
        reply::Reply::Int(LockKey::open(ctx, name, false).pttl())
    }

    /// Released as its owner would, if the owner's holds on that side are still exactly
    /// what the grant left.
    fn take_back(&self, ctx: &Context, db: i32, name: &RedisString) {
        let now = ffi::now_ms();
        let Ok(state) = read_state(ctx, name.as_slice(), now) else {
            return;
        };
        let holds = self.holds(&state);
        let untold = holds > 0 && holds == i64::from(self.granted.get());
        if untold || holds == 0 {
            // The client was never told: a retry with its request id must not be answered
            // "acquired" from the record the handoff wrote.
            if let Some(id) = self.request_id() {
                store::forget_request(ctx, &args::request_key(name.as_slice(), id));
            }
        }
        if !untold {
            return;
        }
        let plan = rwlock::release(&state, name.as_slice(), self.side, self.owner(), None, now);
        store::apply_effects(ctx, name, &plan.effects);
        stats::bump(|s| &s.revoked_handoffs);
        let mut message = plan.message;
        if plan.wake && engine::has_waiters(db, name.as_slice()) {
            engine::serve(ctx, db, name, Path::Event);
            let state = read_state(ctx, name.as_slice(), ffi::now_ms()).unwrap_or_default();
            message = rwlock::message_after_grants(message, &state);
        }
        if let Some(message) = message {
            store::publish(ctx, &rwlock::channel(name.as_slice()), message);
        }
    }
}

impl RwAsk {
    /// Writes the grant and remembers its reply under the request's id. Readers let the
    /// engine look at the next head (consecutive readers go in together); a writer stops
    /// it for its lease.
    fn write_grant(&self, ctx: &Context, name: &RedisString, plan: &Plan, now: i64) -> Grant {
        store::apply_effects(ctx, name, &plan.effects);
        count(plan, Some(self.side));
        let reply: reply::Reply = plan.reply.into();
        if let Some(id) = self.request_id() {
            let request = rs(&args::request_key(name.as_slice(), id));
            store::remember(ctx, &request, &reply, now);
        }
        // The plan may have dropped dead readers and freed the lock before granting: a
        // reader granted from there leaves the lock readable, so Redisson's waiters hear.
        if let Some(message) = rwlock::message_after_grants(plan.message, &plan.state) {
            store::publish(ctx, &rwlock::channel(name.as_slice()), message);
        }
        Grant {
            memo: self.holds(&plan.state),
            reply,
            look_again: match self.side {
                Side::Read => None,
                Side::Write => Some(plan.state.pttl(now)),
            },
        }
    }
}
