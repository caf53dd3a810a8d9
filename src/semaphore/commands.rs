//! The semaphore's commands (RSEMAPHORE.*, design.md 4.3): parse -> read -> core -> write/
//! replicate/notify -> serve the queue -> publish Redisson's message -> reply; and
//! [`SemAsk`], what a queued RSEMAPHORE.ACQUIRE asks of the engine.
//!
//! Layer: the top, beside `lock::commands` (the model) and `pipeline` (what command files share).
//! Calls down into `engine`, `store` and the pure `semaphore` core; nothing calls up.
//!
//! Layout: Redisson's RSemaphore (docs/internals/redisson-sync-layouts.md), a string counter at the
//! key and the channel `redisson_sc:{key}`. Waiters queue FIFO in the engine: a request for
//! 5 at the head holds back a later request for 1, and a release serves every head it can
//! in the same turn. Only a change of the count lets a head in (a module command, or a
//! Java client's INCRBY, which reaches the engine as a keyspace event on 7.0 and by a poll
//! where the server reports removals only: `engine::wait_for_write`).

use std::rc::Rc;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::engine::{self, Ask, Check, Grant, Path};
use crate::pipeline::{
    self, err, int_map as map, remember, request_key, waiting_command, Answer, Waiting,
};
use crate::semaphore::{self, Outcome, Plan, SemState};
use crate::server::ffi::{KeyKind, LockKey};
use crate::server::store::{self, Value};
use crate::server::{ffi, guard, stats};
use crate::vocab::args;
use crate::vocab::errors::ERR_WRONGTYPE;
use crate::vocab::reply::Reply;

/// The count at `name` (the selected db), or the error a command must answer.
fn read(ctx: &Context, name: &RedisString) -> Result<SemState, &'static str> {
    store::parse_string(ctx, name, semaphore::parse_state)
}

/// [`read`] for a writing command: the key stays open to be written through ([`finish`]).
/// Opens the key for a command. A missing key voids the grants made on it that could
/// still be taken back (engine::void_grants_of): it was deleted since, and a take-back,
/// a release, would add permits to whatever semaphore is made under the name next.
fn open(ctx: &Context, name: &RedisString) -> (LockKey, Result<SemState, &'static str>) {
    let (key, state) = store::open_string(ctx, name, semaphore::parse_state);
    if key.kind() == KeyKind::Empty {
        engine::void_grants_of(ffi::selected_db(ctx), name.as_slice());
    }
    (key, state)
}

/// [`read`] and the key's absolute expiry (-1 none, -2 no key), for RSEMAPHORE.INFO.
fn read_with_expiry(ctx: &Context, name: &RedisString) -> Result<(SemState, i64), &'static str> {
    match store::read_key(ctx, name) {
        (Value::Missing, at) => Ok((SemState::default(), at)),
        (Value::String(v), at) => Ok((semaphore::parse_state(Some(&v))?, at)),
        _ => Err(ERR_WRONGTYPE),
    }
}

fn count(outcome: Outcome) {
    match outcome {
        Outcome::Acquired => stats::bump(|s| &s.sem_acquisitions),
        Outcome::Contended => stats::bump(|s| &s.sem_contended),
        Outcome::Released => stats::bump(|s| &s.sem_releases),
        _ => {}
    }
}

/// Writes a plan, remembers its reply under the request id, serves the queue when the
/// count went up, then publishes Redisson's message: what the plan would publish, capped
/// by what the queue left (Java waiters read it as "up to m permits may be free").
fn finish(
    ctx: &Context,
    db: i32,
    name: &RedisString,
    key: LockKey,
    plan: &Plan<SemState>,
    request: Option<&RedisString>,
    path: Path,
) {
    let recorded = request.is_some() && semaphore::remembers(plan.outcome);
    store::apply_own_effects_in(ctx, name, key, &plan.effects, plan.alone(recorded));
    count(plan.outcome);
    remember(ctx, request, recorded, &plan.reply);
    let mut available = plan.state.available();
    if plan.wake && engine::has_waiters(db, name.as_slice()) {
        engine::serve(ctx, db, name, path);
        available = read(ctx, name).map_or(0, |s| s.available());
    }
    if let Some(m) = semaphore::message_after_grants(plan.message.as_deref(), available) {
        store::publish(ctx, &semaphore::channel(name.as_slice()), &m);
    }
}

/// A changing command: [`pipeline::write_command`]'s shared opening (a release's,
/// [`pipeline::release_command`], which may end with `COLLECT grant-id` after its first
/// `collects` words), then the semaphore's read, core, [`finish`] and reply.
fn write_command<'a, P>(
    ctx: &Context,
    args: &'a [RedisString],
    arity: std::ops::RangeInclusive<usize>,
    collects: Option<usize>,
    parse: impl FnOnce(&[&'a [u8]]) -> Result<(P, Option<&'a [u8]>), &'static str>,
    run: impl FnOnce(&SemState, P) -> Result<Plan<SemState>, &'static str>,
) -> RedisResult {
    let body = |db, name: &RedisString, parsed, request: Option<&RedisString>| {
        let (key, state) = open(ctx, name);
        let plan = run(&state.map_err(err)?, parsed).map_err(err)?;
        finish(ctx, db, name, key, &plan, request, Path::Command);
        Ok(ffi::value(plan.reply))
    };
    match collects {
        Some(fixed) => pipeline::release_command(ctx, args, fixed, arity, parse, body),
        None => pipeline::write_command(ctx, args, arity, parse, body),
    }
}

/// `RSEMAPHORE.TRYSETPERMITS <key> <permits> [PX <ttl-ms>] [ID <request-id>]`
pub fn try_set_permits(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        write_command(
            ctx,
            args,
            3..=7,
            None,
            |a| semaphore::parse_try_set(a).map(|(n, o)| ((n, o.px), o.id)),
            |state, (permits, px)| {
                Ok(semaphore::try_set_permits(
                    state,
                    permits,
                    px,
                    ffi::now_ms(),
                ))
            },
        )
    })
}

/// `RSEMAPHORE.ADDPERMITS <key> <delta> [ID <request-id>]`
pub fn add_permits(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        write_command(
            ctx,
            args,
            3..=5,
            None,
            |a| semaphore::parse_add(a).map(|(n, o)| (n, o.id)),
            semaphore::add_permits,
        )
    })
}

/// `RSEMAPHORE.RELEASE <key> <permits> [ID <request-id>] [COLLECT <grant-id>]`
pub fn release(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        write_command(
            ctx,
            args,
            3..=5,
            Some(3),
            |a| semaphore::parse_release(a).map(|(n, o)| (n, o.id)),
            semaphore::release,
        )
    })
}

/// `RSEMAPHORE.DRAINPERMITS <key> [ID <request-id>]`
pub fn drain_permits(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        write_command(
            ctx,
            args,
            2..=4,
            None,
            |a| semaphore::parse_id_only(a).map(|id| ((), id)),
            |state, ()| Ok(semaphore::drain(state)),
        )
    })
}

/// `RSEMAPHORE.ACQUIRE <key> <permits> [WAIT <timeout-ms> [ASYNC [NOTIFY <tag>] [QUIET]]] [ID <request-id>]`
pub fn acquire(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        waiting_command(
            ctx,
            args,
            3..=11,
            |a| {
                let (permits, o) = semaphore::parse_acquire(a)?;
                let waiting = Waiting {
                    timeout: o.wait,
                    queued: o.queued,
                    notify: o.notify,
                    quiet: o.quiet,
                };
                Ok(((permits, o.id), o.id, waiting))
            },
            |db, name, (permits, id), request| {
                let (key, state) = open(ctx, name);
                let queued = engine::has_waiters(db, name.as_slice());
                let plan = semaphore::acquire(&state.map_err(err)?, permits, queued);
                finish(ctx, db, name, key, &plan, request, Path::Command);
                let reply = ffi::value(plan.reply);
                if plan.outcome != Outcome::Contended {
                    return Ok(Answer::Now(reply));
                }
                let ask = move || {
                    let Check::Wait { pttl } = engine::wait_for_write() else {
                        unreachable!("wait_for_write only waits")
                    };
                    let ask = SemAsk {
                        permits,
                        request_id: id.map(Into::into),
                    };
                    (Rc::new(ask) as engine::Request, pttl)
                };
                Ok(Answer::Contended { reply, ask })
            },
        )
    })
}

/// `RSEMAPHORE.AVAILABLEPERMITS <key>`
pub fn available_permits(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        if args.len() != 2 {
            return Err(RedisError::WrongArity);
        }
        let state = read(ctx, &args[1]).map_err(err)?;
        Ok(RedisValue::Integer(state.available()))
    })
}

/// `RSEMAPHORE.INFO <key>`: available, pttl, waiters, waiting-permits (a map under RESP3,
/// flat pairs under RESP2).
pub fn info(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        if args.len() != 2 {
            return Err(RedisError::WrongArity);
        }
        let name = &args[1];
        let (state, at) = read_with_expiry(ctx, name).map_err(err)?;
        let db = ffi::selected_db(ctx);
        let pttl = if at >= 0 {
            (at - ffi::now_ms()).max(0)
        } else {
            at
        };
        let waiters = engine::with(|q| q.len(db, name.as_slice())) as i64;
        Ok(map(&[
            ("available", state.available()),
            ("pttl", pttl),
            ("waiters", waiters),
            ("waiting_permits", engine::queued_units(db, name.as_slice())),
        ]))
    })
}

/// A queued `RSEMAPHORE.ACQUIRE ... WAIT`: `permits` permits.
#[derive(Debug, Clone)]
pub struct SemAsk {
    pub permits: i64,
    /// The call's request id: a grant remembers its reply like an immediate acquire.
    pub request_id: Option<Box<[u8]>>,
}

impl SemAsk {
    fn request(&self, name: &RedisString) -> Option<RedisString> {
        request_key(name, self.request_id.as_deref())
    }
}

impl Ask for SemAsk {
    fn names(&self) -> (&[u8], Option<&[u8]>) {
        (b"", self.request_id.as_deref())
    }

    fn check(&self, ctx: &Context, name: &RedisString, now: i64) -> Check {
        let Ok(state) = read(ctx, name) else {
            // Not a count (somebody else's data for now): only a write can change that.
            return engine::wait_for_write();
        };
        let request = semaphore::Request {
            permits: self.permits,
        };
        match semaphore::grant(&state, &request, now) {
            Some(plan) => {
                let ask = self.clone();
                Check::Grant(Box::new(move |ctx, name| {
                    store::apply_effects(ctx, name, &plan.effects);
                    stats::bump(|s| &s.sem_granted_after_wait);
                    remember(ctx, ask.request(name).as_ref(), true, &plan.reply);
                    Grant {
                        memo: 0,
                        reply: plan.reply,
                        look_again: None,
                    }
                }))
            }
            None => engine::wait_for_write(),
        }
    }

    fn timed_out(&self, _ctx: &Context, _name: &RedisString) -> Reply {
        Reply::Int(0)
    }

    /// The client never learned it holds the permits: they go back (a release of the same
    /// number, served to the next waiters), and its request id is forgotten so a retry
    /// does not read "acquired". Not into a key deleted since: its permits went with it.
    fn take_back(&self, ctx: &Context, db: i32, name: &RedisString) {
        if let Some(id) = &self.request_id {
            store::forget_request(ctx, &args::request_key(name.as_slice(), id));
        }
        let (key, Ok(state)) = open(ctx, name) else {
            return;
        };
        if key.kind() == KeyKind::Empty {
            return;
        }
        let Ok(plan) = semaphore::release(&state, self.permits) else {
            return;
        };
        stats::bump(|s| &s.revoked_handoffs);
        finish(ctx, db, name, key, &plan, None, Path::Event);
    }

    fn units(&self) -> i64 {
        self.permits
    }
}
