//! The re-entrant lock's commands (RLOCK.*) on the shared pipeline: each declares its
//! parsing, its plan (`lock::rule`, on the key as `lock::store` opens, reads and writes
//! it) and its next step (serve the queue when the lock is freed); `pipeline` does the
//! rest (arity, request-id replay, the queue served first, waiting or queueing). And
//! [`LockAsk`], what a queued RLOCK.ACQUIRE asks of the engine: its grant rule.
//!
//! Layer: the top, one folder per primitive beside `pipeline` (what they share). Calls
//! down into `pipeline`, `engine` (waiting, handoff), `lock::store` (the hash read and
//! written), `server::store` (request-id records) and the pure `lock::rule`; only the
//! fenced lock, built on it, calls into it.

use std::rc::Rc;

use redis_module::redisvalue::RedisValueKey;
use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::engine::ticket::Names;
use crate::engine::{self, Ask, Check, Grant, Path};
use crate::lock::store::{apply, freed, open_for_write, read, write};
use crate::lock::{self, LockState, Outcome, Plan, Reply};
use crate::pipeline::{
    err, release_command, waiting_command, write_command, Answer, Parsed, Waiting,
};
use crate::server::ffi::{self, LockKey};
use crate::server::{guard, replication, stats, store};
use crate::vocab::apply::Word;
use crate::vocab::args::{self, AcquireArgs};
use crate::vocab::errors::{ERR_ACQUIREAT_INTERNAL, ERR_EMPTY_OWNER};
use crate::vocab::reply;

fn value(reply: Reply) -> RedisValue {
    match reply {
        Reply::Nil => RedisValue::Null,
        Reply::Int(n) => RedisValue::Integer(n),
    }
}

/// The arguments of an acquire (`owner lease-ms [WAIT timeout-ms [ASYNC [NOTIFY <tag>] [QUIET]]] [ID id]`), its
/// request id and how it may wait, for the pipeline (also the fenced lock's).
pub fn parse_acquire<'a>(
    args: &[&'a [u8]],
) -> Result<(AcquireArgs<'a>, Option<&'a [u8]>, Waiting<'a>), &'static str> {
    let a = args::parse_acquire(args)?;
    let (id, waiting) = (
        a.id,
        Waiting {
            timeout: a.wait,
            queued: a.queued,
            notify: a.notify,
            quiet: a.quiet,
        },
    );
    Ok((a, id, waiting))
}

/// `RLOCK.ACQUIRE <key> <owner> <lease-ms> [WAIT <timeout-ms> [ASYNC [NOTIFY <tag>] [QUIET]]] [ID <request-id>]`
pub fn acquire(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        waiting_command(
            ctx,
            args,
            4..=usize::MAX,
            parse_acquire,
            |db, name, a, request| {
                let owner = &args[2];
                let now = ffi::now_ms();
                let (key, state) = open_for_write(ctx, db, name, Some(owner));
                let name_bytes = name.as_slice();
                let state = state.map_err(err)?;
                let plan = match engine::turn_left(db, name_bytes, now) {
                    Some(left) if state == LockState::Free => lock::left_to_scripts(left),
                    _ => lock::acquire(&state, a.owner, a.lease, now).map_err(err)?,
                };
                let recorded = request.is_some() && lock::remembers(plan.outcome);
                match plan.expire_at {
                    // A new lock or a re-entry, nothing written after it: it replicates
                    // as RLOCK.ACQUIREAT, itself with the lease's absolute end (design.md 1.4).
                    Some(at) if !recorded => ffi::as_rewritten_alone(
                        ctx,
                        c"RLOCK.ACQUIREAT",
                        &[Word::Bytes(name_bytes), Word::Bytes(a.owner), Word::Int(at)],
                        || write(ctx, key, name, owner, &plan, request, now),
                    ),
                    _ => write(ctx, key, name, owner, &plan, request, now),
                }
                if let (Outcome::Contended, Reply::Int(pttl)) = (plan.outcome, plan.reply) {
                    let ask = move || {
                        let ask = LockAsk::new(a.owner, a.lease, a.id);
                        (Rc::new(ask) as engine::Request, pttl)
                    };
                    return Ok(Answer::Contended {
                        reply: value(plan.reply),
                        ask,
                    });
                }
                // A new lease: waiters behind it are looked at when it ends.
                engine::note_expiry(ctx, db, name_bytes, a.lease);
                Ok(Answer::Now(value(plan.reply)))
            },
        )
    })
}

/// `RLOCK.ACQUIREAT [<key>] <payload>`: internal (design.md 1.4; the key first in
/// cluster mode, see server/ffi/replication.rs), what RLOCK.ACQUIRE replicates for a
/// new lock or a re-entry: the command made deterministic, its key, owner and lease's
/// absolute end as one argument (a RESP array of the three, `vocab::apply::push_words`).
/// A replica or an AOF reload runs the acquire's rule on the same state with that end:
/// the same hash, the same PEXPIRETIME, the notifications and WATCH signal of the plain
/// commands. Nothing else an acquire does on a primary happens here (no counter, no
/// request-id record: the primary replicated those itself, and never with this).
/// Refused from ordinary clients, whose locks would otherwise end whenever they chose.
pub fn acquire_at(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        let (name, owner, at) = acquire_at_words(ctx, args)?;
        let (name, owner) = (ctx.create_string(name), ctx.create_string(owner));
        let (key, state) = open_for_write(ctx, ffi::selected_db(ctx), &name, Some(&owner));
        let plan = lock::acquire(&state.map_err(err)?, owner.as_slice(), 0, at).map_err(err)?;
        if plan.outcome == Outcome::Contended {
            // The primary found the lock free or its own: the replica's data had diverged.
            ctx.log_warning("rlock: RLOCK.ACQUIREAT found the lock held by another owner");
        }
        // Deterministic: onward (a replica's own AOF and replicas) as it came.
        ffi::as_called_alone(|| apply(ctx, &key, &name, &owner, &plan));
        Ok(value(plan.reply))
    })
}

/// The key, owner and lease end RLOCK.ACQUIREAT carries, checked as RLOCK.ACQUIRE checks
/// them.
fn acquire_at_words<'a>(
    ctx: &Context,
    args: &'a [RedisString],
) -> Result<(&'a [u8], &'a [u8], i64), RedisError> {
    let words = replication::internal_words(ctx, args, ERR_ACQUIREAT_INTERNAL, 3)?;
    let [name, owner, at] = words[..] else {
        unreachable!("internal_words returns as many words as asked")
    };
    let at = replication::internal_time(at)?;
    if owner.is_empty() {
        return Err(RedisError::Str(ERR_EMPTY_OWNER));
    }
    Ok((name, owner, at))
}

/// `RLOCK.RELEASE <key> <owner> [<lease-ms>] [ID <request-id>] [COLLECT <grant-id>]`
pub fn release(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        release_command(
            ctx,
            args,
            3,
            3..=6,
            |a| {
                args::parse_release(a)
                    .map(|a| (a.id, a))
                    .map(|(id, a)| (a, id))
            },
            |db, name, a, request| {
                let owner = &args[2];
                let now = ffi::now_ms();
                let (key, state) = open_for_write(ctx, db, name, Some(owner));
                let plan = lock::release(&state.map_err(err)?, a.owner, a.lease, now);
                write(ctx, key, name, owner, &plan, request, now);
                if plan.freed {
                    freed(ctx, db, name, Path::Command);
                } else if let Some(lease) = a.lease.filter(|_| plan.expire_at.is_some()) {
                    engine::note_expiry(ctx, db, name.as_slice(), lease);
                }
                Ok(value(plan.reply))
            },
        )
    })
}

/// `owner lease-ms`, for the pipeline: RENEW takes no `ID` (running it again only sets
/// the lease again).
fn parse_renew<'a>(args: &[&'a [u8]]) -> Parsed<'a, (&'a [u8], i64)> {
    Ok((args::parse_renew(args)?, None))
}

/// `RLOCK.RENEW <key> <owner> <lease-ms>`
pub fn renew(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        write_command(
            ctx,
            args,
            4..=4,
            parse_renew,
            |db, name, (owner, lease), request| {
                let (key, state) = open_for_write(ctx, db, name, Some(&args[2]));
                let now = ffi::now_ms();
                let plan = lock::renew(&state.map_err(err)?, owner, lease, now);
                // One PEXPIREAT, nothing after it (a renewal is not remembered).
                ffi::direct(|| write(ctx, key, name, &args[2], &plan, request, now));
                if plan.expire_at.is_some() {
                    engine::note_expiry(ctx, db, name.as_slice(), lease);
                }
                Ok(value(plan.reply))
            },
        )
    })
}

/// `RLOCK.FORCERELEASE <key>`
pub fn force_release(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        write_command(
            ctx,
            args,
            2..=2,
            |_| Ok(((), None)),
            |db, name, (), request| {
                let (key, state) = open_for_write(ctx, db, name, None);
                let plan = lock::force_release(&state.map_err(err)?);
                write(ctx, key, name, name, &plan, request, 0);
                if plan.freed {
                    freed(ctx, db, name, Path::Command);
                }
                Ok(value(plan.reply))
            },
        )
    })
}

/// `RLOCK.INFO <key>`
pub fn info(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        if args.len() != 2 {
            return Err(RedisError::WrongArity);
        }
        let name = &args[1];
        let key = LockKey::open(ctx, name, false);
        let (holders, pttl) = match read(&key).map_err(err)? {
            LockState::Free => return Ok(RedisValue::Null),
            LockState::Held { holders, pttl } => (holders, pttl),
            LockState::Alone { owner, count } => (
                vec![lock::Holder {
                    owner: owner.to_vec(),
                    count,
                }],
                key.pttl(),
            ),
        };
        let waiting = engine::with(|q| q.len(ffi::selected_db(ctx), name.as_slice()));
        let owners = holders
            .into_iter()
            .map(|h| {
                (
                    RedisValueKey::BulkString(h.owner),
                    RedisValue::Integer(h.count),
                )
            })
            .collect();
        // An ordered map: a map under RESP3, flat pairs under RESP2, keys in a stable order.
        Ok(RedisValue::OrderedMap(
            [
                (
                    RedisValueKey::String("owners".into()),
                    RedisValue::OrderedMap(owners),
                ),
                (
                    RedisValueKey::String("pttl".into()),
                    RedisValue::Integer(pttl),
                ),
                (
                    RedisValueKey::String("waiters".into()),
                    RedisValue::Integer(waiting as i64),
                ),
            ]
            .into_iter()
            .collect(),
        ))
    })
}

/// A queued `RLOCK.ACQUIRE ... WAIT`: `owner` takes the lock for `lease` ms.
#[derive(Debug, Clone)]
pub struct LockAsk {
    /// The owner and the call's request id (a handoff remembers its reply under it).
    names: Names,
    pub lease: i64,
}

impl LockAsk {
    pub fn new(owner: &[u8], lease: i64, request_id: Option<&[u8]>) -> LockAsk {
        LockAsk {
            names: Names::new(owner, request_id),
            lease,
        }
    }

    pub fn owner(&self) -> &[u8] {
        self.names.owner()
    }

    /// The call's request id: a handoff remembers its reply like an immediate acquire.
    pub fn request_id(&self) -> Option<&[u8]> {
        self.names.id()
    }
}

impl Ask for LockAsk {
    fn names(&self) -> (&[u8], Option<&[u8]>) {
        (self.owner(), self.request_id())
    }

    fn check(&self, ctx: &Context, name: &RedisString, now: i64) -> Check {
        let state = read(&LockKey::open(ctx, name, false));
        match lock::grant_head(&state, self.lease, now) {
            Ok(plan) => {
                let ask = self.clone();
                Check::Grant(Box::new(move |ctx, name| {
                    ask.write_grant(ctx, name, &plan, now)
                }))
            }
            Err(pttl) => Check::Wait { pttl },
        }
    }

    fn timed_out(&self, ctx: &Context, name: &RedisString) -> reply::Reply {
        reply::Reply::Int(LockKey::open(ctx, name, false).pttl())
    }

    /// Released as its owner would, if still that owner alone with count 1.
    fn take_back(&self, ctx: &Context, db: i32, name: &RedisString) {
        let key = LockKey::open(ctx, name, true);
        let Ok(state) = read(&key) else { return };
        let count = state.count_of(self.owner());
        // Still exactly what the handoff wrote: that owner alone, count 1.
        let untold = count == Some(1) && state.holder_count() == 1;
        if untold || count.is_none() {
            // The client was never told: a retry with its request id must not be answered
            // "acquired" from the record the handoff wrote.
            if let Some(id) = self.request_id() {
                store::forget_request(ctx, &args::request_key(name.as_slice(), id));
            }
        }
        if !untold {
            return; // re-entered since by the same owner elsewhere, or already gone
        }
        let owner = RedisString::create_from_slice(std::ptr::null_mut(), self.owner());
        let plan = lock::release(&state, self.owner(), None, ffi::now_ms());
        apply(ctx, &key, name, &owner, &plan);
        drop(key);
        stats::bump(|s| &s.revoked_handoffs);
        freed(ctx, db, name, Path::Event);
    }
}

impl LockAsk {
    /// Writes the handoff and remembers its reply under the request's id. Nobody behind
    /// the new holder can be granted before its lease runs out.
    fn write_grant(&self, ctx: &Context, name: &RedisString, plan: &Plan, now: i64) -> Grant {
        let key = LockKey::open(ctx, name, true);
        let owner = RedisString::create_from_slice(std::ptr::null_mut(), self.owner());
        apply(ctx, &key, name, &owner, plan);
        drop(key);
        if let Some(id) = self.request_id() {
            let request = RedisString::create_from_slice(
                std::ptr::null_mut(),
                &args::request_key(name.as_slice(), id),
            );
            store::remember(ctx, &request, &plan.reply.into(), now);
        }
        Grant {
            memo: 0,
            reply: plan.reply.into(),
            look_again: Some(self.lease),
        }
    }
}
