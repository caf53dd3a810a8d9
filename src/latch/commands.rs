//! The countdown latch's commands (RLATCH.*, design.md 4.5) on the shared pipeline: each
//! declares its parsing and its plan (the `latch` rule); the pipeline replays request ids,
//! serves a pending queue first and waits or queues an AWAIT; here the effects are
//! written, awaiters granted and Redisson's message published. And [`LatchAsk`], what a
//! queued RLATCH.AWAIT asks of the engine: its grant rule.
//!
//! Layer: the top, beside `lock::commands` and `pipeline`; calls down into `pipeline`, `engine`
//! (waiting, serving), `store` (key reads, effects, publish) and the pure `latch` core;
//! nothing calls up into it.
//!
//! The latch's grant writes nothing (awaiting changes no state), so every queued awaiter is
//! granted in the turn the count reaches zero: `look_again: None` keeps the engine asking
//! the next head, and each asks the same question of the same, open, key. A Java client's
//! countDown to zero DELs the key, and a removal is reported to the module on every
//! server, so a head waits for that event alone (or for the key's TTL, should a user have
//! set one) and nothing polls.

use std::rc::Rc;

use redis_module::redisvalue::RedisValueKey;
use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::engine::{self, Ask, Check, Grant, Path};
use crate::latch::{self, LatchState};
use crate::pipeline::{self, err, remember, waiting_command, Answer, Waiting};
use crate::semaphore::{parse_options, remembers, Allowed, Outcome, Plan};
use crate::server::ffi::LockKey;
use crate::server::store::{self, Value};
use crate::server::{ffi, guard, stats};
use crate::vocab::errors::ERR_WRONGTYPE;
use crate::vocab::reply::Reply;

/// The latch a key holds; a key of another type, or a string that is no count, is the
/// error the command answers.
fn read_state(ctx: &Context, name: &RedisString) -> Result<LatchState, &'static str> {
    store::parse_string(ctx, name, latch::parse_state)
}

/// [`read_state`] for a writing command: the key stays open to be written through.
fn open_state(ctx: &Context, name: &RedisString) -> (LockKey, Result<LatchState, &'static str>) {
    store::open_string(ctx, name, latch::parse_state)
}

/// [`read_state`] and the key's absolute expiry (-1 none, -2 no key).
fn read(ctx: &Context, name: &RedisString) -> (Result<LatchState, &'static str>, i64) {
    let (value, at) = store::read_key(ctx, name);
    let state = match value {
        Value::Missing => Ok(LatchState::default()),
        Value::String(v) => latch::parse_state(Some(&v)),
        _ => Err(ERR_WRONGTYPE),
    };
    (state, at)
}

/// Remaining ms of an absolute expiry read by [`read`] (-1: none, so no timer is armed).
fn pttl(at: i64, now: i64) -> i64 {
    if at >= 0 {
        (at - now).max(0)
    } else {
        -1
    }
}

fn count(outcome: Outcome) {
    match outcome {
        Outcome::Set => stats::bump(|s| &s.latch_sets),
        Outcome::CountedDown => stats::bump(|s| &s.latch_count_downs),
        Outcome::Opened => {
            stats::bump(|s| &s.latch_count_downs);
            stats::bump(|s| &s.latch_openings);
        }
        Outcome::Deleted => {
            stats::bump(|s| &s.latch_deletes);
            stats::bump(|s| &s.latch_openings);
        }
        Outcome::Acquired => stats::bump(|s| &s.latch_awaits_open),
        _ => {}
    }
}

/// What every writing RLATCH command does once its core has planned: write the effects
/// (with their keyspace events; a latch's writes follow from the count alone, so a
/// command that writes nothing else replicates as itself), remember the reply under the
/// request id, grant every awaiter when the latch opened, then publish Redisson's message
/// for its pub/sub awaiters.
fn carry_out(
    ctx: &Context,
    db: i32,
    name: &RedisString,
    key: LockKey,
    request: Option<&RedisString>,
    plan: Plan<LatchState>,
) -> RedisValue {
    let recorded = request.is_some() && remembers(plan.outcome);
    store::apply_own_effects_in(ctx, name, key, &plan.effects, plan.alone(recorded));
    count(plan.outcome);
    remember(ctx, request, recorded, &plan.reply);
    if plan.wake {
        engine::serve(ctx, db, name, Path::Command);
    }
    if let Some(message) = &plan.message {
        store::publish(ctx, &latch::channel(name.as_slice()), message);
    }
    ffi::value(plan.reply)
}

/// The `[ID request-id]` of a writing command, the only option it takes.
fn parse_id<'a>(args: &[&'a [u8]]) -> Result<Option<&'a [u8]>, &'static str> {
    Ok(parse_options(args, Allowed::default())?.id)
}

/// `RLATCH.TRYSETCOUNT <key> <count> [ID <request-id>]`
pub fn try_set_count(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        // The shared opening serves the awaiters of a latch that opened a moment ago (a
        // DEL whose handoff is pending) before a new count closes it again.
        pipeline::write_command(
            ctx,
            args,
            3..=5,
            |a| latch::parse_try_set(a).map(|(n, o)| (n, o.id)),
            |db, name, n, request| {
                let (key, state) = open_state(ctx, name);
                let plan = latch::try_set_count(&state.map_err(err)?, n);
                Ok(carry_out(ctx, db, name, key, request, plan))
            },
        )
    })
}

/// `RLATCH.COUNTDOWN <key> [ID <request-id>]`
pub fn count_down(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        pipeline::write_command(
            ctx,
            args,
            2..=4,
            |a| parse_id(a).map(|id| ((), id)),
            |db, name, (), request| {
                let (key, state) = open_state(ctx, name);
                let plan = latch::count_down(&state.map_err(err)?).map_err(err)?;
                Ok(carry_out(ctx, db, name, key, request, plan))
            },
        )
    })
}

/// `RLATCH.DELETE <key> [ID <request-id>]`
pub fn delete(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        pipeline::write_command(
            ctx,
            args,
            2..=4,
            |a| parse_id(a).map(|id| ((), id)),
            |db, name, (), request| {
                let (key, state) = open_state(ctx, name);
                let plan = latch::delete(&state.map_err(err)?);
                Ok(carry_out(ctx, db, name, key, request, plan))
            },
        )
    })
}

/// `RLATCH.GETCOUNT <key>`
pub fn get_count(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        if args.len() != 2 {
            return Err(RedisError::WrongArity);
        }
        let state = read_state(ctx, &args[1]).map_err(err)?;
        Ok(RedisValue::Integer(state.count()))
    })
}

/// `RLATCH.AWAIT <key> [WAIT <timeout-ms> [ASYNC ID <ticket-id> [NOTIFY <tag>]]]`
pub fn await_open(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        waiting_command(
            ctx,
            args,
            2..=10,
            |a| {
                let o = latch::parse_await(a)?;
                let waiting = Waiting {
                    timeout: o.wait,
                    queued: o.queued,
                    notify: o.notify,
                    quiet: o.quiet,
                };
                // Its ID names a queued ticket, not a request to replay: awaiting changes
                // nothing, so there is no first reply to remember.
                Ok((o.id, None, waiting))
            },
            |_db, name, ticket_id, _request| {
                let (state, at) = read(ctx, name);
                let plan = latch::await_open(&state.map_err(err)?);
                count(plan.outcome);
                let reply = ffi::value(plan.reply);
                // A replica is never told of the master's count-down in a way that could
                // serve a queue (its keys are its master's to change): it answers at once.
                let replica = ctx.get_flags().contains(ContextFlags::SLAVE);
                if plan.outcome != Outcome::Contended || replica {
                    return Ok(Answer::Now(reply));
                }
                let ask = move || {
                    let ask = LatchAsk {
                        ticket_id: ticket_id.map(Into::into),
                    };
                    (Rc::new(ask) as engine::Request, pttl(at, ffi::now_ms()))
                };
                Ok(Answer::Contended { reply, ask })
            },
        )
    })
}

/// `RLATCH.INFO <key>`: count (0 without latch), PTTL (-2 without key, -1 without TTL),
/// and how many clients await it here.
pub fn info(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        if args.len() != 2 {
            return Err(RedisError::WrongArity);
        }
        let name = &args[1];
        let (state, at) = read(ctx, name);
        let state = state.map_err(err)?;
        let waiting = engine::with(|q| q.len(ffi::selected_db(ctx), name.as_slice()));
        let field = |k: &str, v: i64| (RedisValueKey::String(k.into()), RedisValue::Integer(v));
        // An ordered map: a map under RESP3, flat pairs under RESP2, keys in a stable order.
        Ok(RedisValue::OrderedMap(
            [
                field("count", state.count()),
                field(
                    "pttl",
                    if at == -2 {
                        -2
                    } else {
                        pttl(at, ffi::now_ms())
                    },
                ),
                field("waiters", waiting as i64),
            ]
            .into_iter()
            .collect(),
        ))
    })
}

/// A queued `RLATCH.AWAIT ... WAIT`: it asks only that the latch be open.
#[derive(Debug, Clone)]
pub struct LatchAsk {
    /// A queued ticket's id, which its message names (docs/commands/tickets.md).
    ticket_id: Option<Box<[u8]>>,
}

impl Ask for LatchAsk {
    fn names(&self) -> (&[u8], Option<&[u8]>) {
        (b"", self.ticket_id.as_deref())
    }

    /// The latch's opening writes nothing: nothing to collect or take back.
    fn grant_is_written(&self) -> bool {
        false
    }

    fn check(&self, ctx: &Context, name: &RedisString, now: i64) -> Check {
        match read(ctx, name) {
            (Ok(state), _) if latch::grant(&state, &latch::Request, now).is_some() => {
                Check::Grant(Box::new(|_, _| {
                    stats::bump(|s| &s.latch_awaits_released);
                    Grant {
                        memo: 0,
                        reply: Reply::Int(1),
                        look_again: None,
                    }
                }))
            }
            // Closed, or no latch at all any more (a hash, a word): only a write of that
            // key can change the answer, and the ones that open a latch (countDown's DEL,
            // an expiry) are removals, reported on every server. With a TTL, the engine
            // looks again when it runs out.
            (_, at) => Check::Wait {
                pttl: pttl(at, now),
            },
        }
    }

    /// The wait ran out: 1 if the latch is open all the same (a write the server did not
    /// report), else 0.
    fn timed_out(&self, ctx: &Context, name: &RedisString) -> Reply {
        stats::bump(|s| &s.latch_await_timeouts);
        let open = matches!(read_state(ctx, name), Ok(state) if state.is_open());
        Reply::Int(open as i64)
    }

    /// A grant wrote nothing and takes nothing from anyone: nothing to take back.
    fn take_back(&self, _ctx: &Context, _db: i32, _name: &RedisString) {}

    fn queued(&self, _ctx: &Context, _db: i32, _name: &RedisString) {
        stats::bump(|s| &s.latch_awaits_queued);
    }
}
