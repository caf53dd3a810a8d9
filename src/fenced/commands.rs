//! The fenced lock's commands (RFENCED.*, design.md 4.2): `RFENCED.ACQUIRE` and
//! `RFENCED.GETTOKEN`; and [`FencedAsk`], what a queued `RFENCED.ACQUIRE` asks of the
//! engine.
//!
//! The fenced lock is the plain lock (Redisson's RFencedLock extends RedissonLock): the
//! same hash, lease, channel and message, plus the token key
//! `redisson_lock_token:{name}`. So the lock half is the lock's, reused as is (its parser,
//! its key read, its writes with `lock::store::apply`, its counters, its take-back), and release,
//! renew, force release and info are the `RLOCK.*` commands on the same key; this file
//! adds the token (`fenced`'s pure rule, written with `store::apply_effects`).
//!
//! Layer: the top, above `lock::commands` and `lock::store` (which it reuses; the lock never
//! names it), beside `pipeline`, on which its acquire runs. Calls down into `pipeline`,
//! `engine`, `store` and the pure `fenced`/`lock::rule`.

use std::rc::Rc;

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::engine::{self, Ask, Check, Grant};
use crate::fenced::{self, FencedPlan, FencedReply, Head};
use crate::lock;
use crate::lock::commands::{self as lock_commands, LockAsk};
use crate::lock::store as lock_store;
use crate::pipeline::{err, remember, waiting_command, Answer};
use crate::server::ffi::{self, LockKey};
use crate::server::store::{self, Value};
use crate::server::{guard, replication, stats};
use crate::vocab::apply::Word;
use crate::vocab::args;
use crate::vocab::errors::{ERR_FENCED_ACQUIREAT_INTERNAL, ERR_NOT_A_TOKEN};
use crate::vocab::reply::Reply;

/// The last token issued for `name` (0 before the first), from its token key. A key of
/// another type, or a string that is no integer, is somebody else's data: refused.
fn last_token(ctx: &Context, name: &[u8]) -> Result<Option<i64>, &'static str> {
    match store::read_any(ctx, &fenced::token_key(name)).0 {
        Value::Missing => Ok(None),
        Value::String(bytes) => fenced::parse_token(Some(&bytes)).map(Some),
        _ => Err(ERR_NOT_A_TOKEN),
    }
}

/// Writes the token of a plan that issues one (`SET`, replicated as such: a replica or
/// the AOF holds the value itself, never an increment to redo); true if it did.
fn write_token(ctx: &Context, name: &RedisString, plan: &FencedPlan) -> bool {
    let Some(effect) = plan.token_effect(name.as_slice()) else {
        return false;
    };
    store::apply_effects(ctx, name, &[effect]);
    true
}

/// Writes a plan's lock half through the lock's key (closed then) and its token.
fn write(
    ctx: &Context,
    key: LockKey,
    name: &RedisString,
    owner: &RedisString,
    plan: &FencedPlan,
) -> bool {
    lock_store::apply(ctx, &key, name, owner, &plan.lock);
    drop(key);
    write_token(ctx, name, plan)
}

/// `RFENCED.ACQUIRE <key> <owner> <lease-ms> [WAIT <timeout-ms> [ASYNC [NOTIFY <tag>]]] [ID <request-id>]`
///
/// `[nil, token]` when acquired or re-entered (a new token each time, as Redisson's
/// lockAndGetToken), `[pttl, nil]` when another owner holds it; with WAIT the caller
/// queues and a handoff answers `[nil, token]` with a token issued at the handoff.
pub fn acquire(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        waiting_command(
            ctx,
            args,
            4..=usize::MAX,
            lock_commands::parse_acquire,
            |db, name, a, request| {
                let owner = &args[2];
                let now = ffi::now_ms();
                let (key, state) = lock_store::open_for_write(ctx, db, name, Some(owner));
                let last = || last_token(ctx, name.as_slice()).map(|t| t.unwrap_or(0));
                let state = state.map_err(err)?;
                let plan = match engine::turn_left(db, name.as_slice(), now) {
                    Some(left) if state == lock::LockState::Free => fenced::left_to_scripts(left),
                    _ => fenced::acquire(&state, last, a.owner, a.lease, now).map_err(err)?,
                };
                let issued = match plan.lock.expire_at {
                    // A new lock or a re-entry, nothing written after it: it replicates as
                    // RFENCED.ACQUIREAT, itself with this server's clock (design.md 1.4), which
                    // decides the lease's end and the token.
                    Some(_) if request.is_none() => {
                        let words = [
                            Word::Bytes(name.as_slice()),
                            Word::Bytes(a.owner),
                            Word::Int(a.lease),
                            Word::Int(now),
                        ];
                        ffi::as_rewritten_alone(ctx, c"RFENCED.ACQUIREAT", &words, || {
                            write(ctx, key, name, owner, &plan)
                        })
                    }
                    _ => write(ctx, key, name, owner, &plan),
                };
                if issued {
                    stats::bump(|s| &s.fenced_tokens_issued);
                }
                lock_store::count(plan.lock.outcome);
                let reply: Reply = plan.reply.into();
                remember(ctx, request, lock::remembers(plan.lock.outcome), &reply);
                if let FencedReply::Contended(pttl) = plan.reply {
                    let ask = move || {
                        let ask = FencedAsk(LockAsk::new(a.owner, a.lease, a.id));
                        (Rc::new(ask) as engine::Request, pttl)
                    };
                    return Ok(Answer::Contended {
                        reply: ffi::value(reply),
                        ask,
                    });
                }
                // A new lease: waiters behind it are looked at when it ends.
                engine::note_expiry(ctx, db, name.as_slice(), a.lease);
                Ok(Answer::Now(ffi::value(reply)))
            },
        )
    })
}

/// `RFENCED.ACQUIREAT [<key>] <payload>`: internal (design.md 1.4; the key first in
/// cluster mode, see server/ffi/replication.rs), what RFENCED.ACQUIRE replicates for a
/// new lock or a re-entry: the command made deterministic, its key, owner, lease and the
/// primary's clock as one argument (a RESP array of the four). The clock decides the
/// lease's end and the token (`max(last + 1, now << 10)`); a replica or an AOF reload runs
/// the acquire's rule on the same state with it: the same hash, PEXPIRETIME and token.
/// No counter; refused from ordinary clients.
pub fn acquire_at(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        let words = replication::internal_words(ctx, args, ERR_FENCED_ACQUIREAT_INTERNAL, 4)?;
        let [name, owner, lease, now] = words[..] else {
            unreachable!("internal_words returns as many words as asked")
        };
        let (a, _, _) = lock_commands::parse_acquire(&[owner, lease]).map_err(err)?;
        let now = replication::internal_time(now)?;
        let (name, owner) = (ctx.create_string(name), ctx.create_string(owner));
        let (key, state) =
            lock_store::open_for_write(ctx, ffi::selected_db(ctx), &name, Some(&owner));
        let last = || last_token(ctx, name.as_slice()).map(|t| t.unwrap_or(0));
        let plan = fenced::acquire(&state.map_err(err)?, last, owner.as_slice(), a.lease, now)
            .map_err(err)?;
        if let FencedReply::Contended(_) = plan.reply {
            // The primary found the lock free or its own: the replica's data had diverged.
            ctx.log_warning("rlock: RFENCED.ACQUIREAT found the lock held by another owner");
        }
        // Deterministic: onward (a replica's own AOF and replicas) as it came.
        ffi::as_called_alone(|| write(ctx, key, &name, &owner, &plan));
        Ok(ffi::value(plan.reply.into()))
    })
}

/// `RFENCED.GETTOKEN <key>`
///
/// The last token issued for the lock (Redisson's getToken), nil before the first.
pub fn get_token(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        if args.len() != 2 {
            return Err(RedisError::WrongArity);
        }
        Ok(match last_token(ctx, args[1].as_slice()).map_err(err)? {
            Some(token) => RedisValue::Integer(token),
            None => RedisValue::Null,
        })
    })
}

/// A queued `RFENCED.ACQUIRE ... WAIT`: the lock's request ([`LockAsk`]), granted with a
/// token. Taking back a grant is the lock's: the token it issued stays spent (tokens may
/// skip numbers, never repeat them).
#[derive(Debug, Clone)]
pub struct FencedAsk(pub LockAsk);

impl Ask for FencedAsk {
    fn check(&self, ctx: &Context, name: &RedisString, now: i64) -> Check {
        let state = lock_store::read(&LockKey::open(ctx, name, false));
        let last = || last_token(ctx, name.as_slice()).map(|t| t.unwrap_or(0));
        match fenced::grant_head(&state, last, self.0.lease, now) {
            Head::Grant(plan) => {
                let ask = self.clone();
                Check::Grant(Box::new(move |ctx, name| {
                    ask.write_grant(ctx, name, &plan, now)
                }))
            }
            Head::Wait(pttl) => Check::Wait { pttl },
            Head::Refuse(error) => Check::Refuse(error),
        }
    }

    /// `[pttl, nil]`, as a non-waiting acquire that found the lock held.
    fn timed_out(&self, ctx: &Context, name: &RedisString) -> Reply {
        FencedReply::Contended(LockKey::open(ctx, name, false).pttl()).into()
    }

    fn take_back(&self, ctx: &Context, db: i32, name: &RedisString) {
        self.0.take_back(ctx, db, name);
    }

    fn names(&self) -> (&[u8], Option<&[u8]>) {
        self.0.names()
    }

    /// The token: a ticket's holder needs it before it proceeds.
    fn detail_on_grant(&self) -> bool {
        true
    }
}

impl FencedAsk {
    /// Writes the handoff (the lock, then the token) and remembers its reply under the
    /// request's id. Nobody behind the new holder can be granted before its lease ends.
    fn write_grant(&self, ctx: &Context, name: &RedisString, plan: &FencedPlan, now: i64) -> Grant {
        let key = LockKey::open(ctx, name, true);
        let owner = RedisString::create_from_slice(std::ptr::null_mut(), self.0.owner());
        if write(ctx, key, name, &owner, plan) {
            stats::bump(|s| &s.fenced_tokens_issued);
        }
        let reply: Reply = plan.reply.into();
        if let Some(id) = self.0.request_id() {
            let request = RedisString::create_from_slice(
                std::ptr::null_mut(),
                &args::request_key(name.as_slice(), id),
            );
            store::remember(ctx, &request, &reply, now);
        }
        Grant {
            memo: 0,
            reply,
            look_again: Some(self.0.lease),
        }
    }
}
