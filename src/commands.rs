//! Command handlers: parse -> read -> core -> write/replicate/notify -> reply.
//!
//! Layer: the top, with `events` beside it. Calls down into `engine` (waiting, handoff,
//! freeing), `store` (reads and writes) and the pure `core`; nothing calls up into it.

use redis_module::redisvalue::RedisValueKey;
use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::core::{self, LockState, Outcome, Reply};
use crate::engine::{self, Path, Request, Waiter};
use crate::ffi::{self, LockKey};
use crate::{guard, stats, store, tracking};

fn err(msg: &'static str) -> RedisError {
    RedisError::Str(msg)
}

fn count(outcome: Outcome) {
    match outcome {
        Outcome::Acquired => stats::bump(|s| &s.acquisitions),
        Outcome::Reentered => stats::bump(|s| &s.reentries),
        Outcome::Contended => stats::bump(|s| &s.contended),
        Outcome::Released | Outcome::Decremented => stats::bump(|s| &s.releases),
        Outcome::ForceReleased => stats::bump(|s| &s.forced_releases),
        Outcome::Renewed => stats::bump(|s| &s.renewals),
        Outcome::NotHeld | Outcome::NoLock => {}
    }
}

fn value(reply: Reply) -> RedisValue {
    match reply {
        Reply::Nil => RedisValue::Null,
        Reply::Int(n) => RedisValue::Integer(n),
    }
}

/// The key remembering a request id's reply, if the call has an id.
fn request_key(name: &RedisString, id: Option<&[u8]>) -> Option<RedisString> {
    id.map(|id| {
        RedisString::create_from_slice(
            std::ptr::null_mut(),
            &core::request_key(name.as_slice(), id),
        )
    })
}

fn args_after_key(args: &[RedisString]) -> Vec<&[u8]> {
    args[2..].iter().map(RedisString::as_slice).collect()
}

/// Opens the lock key for writing and reads it. If it holds no lock but clients wait for
/// it (freed by DEL, expiry, overwrite... a moment ago, with the handoff still pending),
/// the first waiter is served before the caller looks: nobody barges past the queue.
fn open_for_write(
    ctx: &Context,
    db: i32,
    name: &RedisString,
    owner: Option<&RedisString>,
) -> (LockKey, Result<LockState, &'static str>) {
    let read = |key: &LockKey| match owner {
        Some(owner) => store::read_for(key, owner),
        None => store::read(key),
    };
    let key = LockKey::open(ctx, name, true);
    let state = read(&key);
    if !matches!(state, Ok(LockState::Held { .. })) && engine::has_waiters(db, name.as_slice()) {
        drop(key);
        engine::serve(ctx, db, name, Path::Command);
        let key = LockKey::open(ctx, name, true);
        let state = read(&key);
        return (key, state);
    }
    if state.is_err() && tracking::is_tracked(db, name.as_slice()) {
        // A lock of ours replaced by something that is no lock, by a command whose
        // events the module does not watch on this server (SORT ... STORE on 7.0): its
        // unlock message goes out now, lazily (README, "Freeing and handoff").
        drop(key);
        engine::settle(ctx, db, name);
        let key = LockKey::open(ctx, name, true);
        let state = read(&key);
        return (key, state);
    }
    (key, state)
}

/// Where a client may not block (MULTI/EXEC, scripts, replicated or loading streams,
/// deny-blocking contexts), WAIT is ignored and the command answers at once.
fn may_block(ctx: &Context) -> bool {
    let no = ContextFlags::MULTI
        | ContextFlags::LUA
        | ContextFlags::DENY_BLOCKING
        | ContextFlags::REPLICATED
        | ContextFlags::LOADING;
    !ctx.get_flags().intersects(no)
}

/// RLOCK.ACQUIRE <key> <owner> <lease-ms> [WAIT <timeout-ms>] [ID <request-id>]
pub fn acquire(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard::command(|| {
        if args.len() < 4 {
            return Err(RedisError::WrongArity);
        }
        let a = core::parse_acquire(&args_after_key(&args)).map_err(err)?;
        let (name, owner) = (&args[1], &args[2]);
        let request = request_key(name, a.id);
        if let Some(first) = request.as_ref().and_then(|req| store::remembered(ctx, req)) {
            return Ok(value(first));
        }
        let db = ffi::selected_db(ctx);
        let now = ffi::now_ms();
        let (key, state) = open_for_write(ctx, db, name, Some(owner));
        let plan = core::acquire(&state.map_err(err)?, a.owner, a.lease, now).map_err(err)?;
        store::apply(ctx, &key, name, owner, &plan);
        drop(key);
        count(plan.outcome);
        if let Some(req) = request.as_ref().filter(|_| core::remembers(plan.outcome)) {
            store::remember(ctx, req, plan.reply, now);
        }
        match (plan.outcome, plan.reply, a.wait) {
            (Outcome::Contended, Reply::Int(pttl), Some(timeout)) if may_block(ctx) => {
                let waiter = Waiter::new(Request::lock(a.owner, a.lease, a.id));
                engine::wait(ctx, db, name, waiter, timeout, pttl).map_err(err)?;
                Ok(RedisValue::NoReply)
            }
            _ => {
                engine::note_expiry(ctx, db, name.as_slice(), a.lease);
                Ok(value(plan.reply))
            }
        }
    })
}

/// RLOCK.RELEASE <key> <owner> [<lease-ms>] [ID <request-id>]
pub fn release(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard::command(|| {
        if !(3..=6).contains(&args.len()) {
            return Err(RedisError::WrongArity);
        }
        let a = core::parse_release(&args_after_key(&args)).map_err(err)?;
        let (name, lease) = (&args[1], a.lease);
        let request = request_key(name, a.id);
        if let Some(first) = request.as_ref().and_then(|req| store::remembered(ctx, req)) {
            return Ok(value(first));
        }
        let db = ffi::selected_db(ctx);
        let now = ffi::now_ms();
        let (key, state) = open_for_write(ctx, db, name, Some(&args[2]));
        let plan = core::release(&state.map_err(err)?, a.owner, lease, now);
        store::apply(ctx, &key, name, &args[2], &plan);
        drop(key);
        count(plan.outcome);
        if let Some(req) = request.as_ref().filter(|_| core::remembers(plan.outcome)) {
            store::remember(ctx, req, plan.reply, now);
        }
        if plan.freed {
            engine::freed(ctx, db, name, Path::Command);
        } else if let Some(lease) = lease.filter(|_| plan.expire_at.is_some()) {
            engine::note_expiry(ctx, db, name.as_slice(), lease);
        }
        Ok(value(plan.reply))
    })
}

/// RLOCK.RENEW <key> <owner> <lease-ms>
pub fn renew(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard::command(|| {
        if args.len() != 4 {
            return Err(RedisError::WrongArity);
        }
        let (owner, lease) = core::parse_renew(&args_after_key(&args)).map_err(err)?;
        let name = &args[1];
        let db = ffi::selected_db(ctx);
        let (key, state) = open_for_write(ctx, db, name, Some(&args[2]));
        let plan = core::renew(&state.map_err(err)?, owner, lease, ffi::now_ms());
        store::apply(ctx, &key, name, &args[2], &plan);
        drop(key);
        count(plan.outcome);
        if plan.expire_at.is_some() {
            engine::note_expiry(ctx, db, name.as_slice(), lease);
        }
        Ok(value(plan.reply))
    })
}

/// RLOCK.FORCERELEASE <key>
pub fn force_release(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard::command(|| {
        if args.len() != 2 {
            return Err(RedisError::WrongArity);
        }
        let name = &args[1];
        let db = ffi::selected_db(ctx);
        let (key, state) = open_for_write(ctx, db, name, None);
        let plan = core::force_release(&state.map_err(err)?);
        store::apply(ctx, &key, name, name, &plan);
        drop(key);
        count(plan.outcome);
        if plan.freed {
            engine::freed(ctx, db, name, Path::Command);
        }
        Ok(value(plan.reply))
    })
}

/// RLOCK.INFO <key>
pub fn info(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    guard::command(|| {
        if args.len() != 2 {
            return Err(RedisError::WrongArity);
        }
        let name = &args[1];
        let key = LockKey::open(ctx, name, false);
        let (holders, pttl) = match store::read(&key).map_err(err)? {
            LockState::Free => return Ok(RedisValue::Null),
            LockState::Held { holders, pttl } => (holders, pttl),
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
