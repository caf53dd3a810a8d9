//! The lock's key, opened, read and written: the hash read into the pure [`LockState`]
//! (with the one-field fast read of a command by its holder), a [`Plan`] written back with
//! everything a plain command would do around it (replication as plain commands,
//! keyspace notifications, WATCH; then its `INFO rlock` counter and its request-id
//! record), and Redisson's unlock message once the lock is free.
//!
//! Layer: inside the lock's folder, below `commands` (its users, with the fenced lock's);
//! calls down into `engine` (tracking a new lock, serving a freed one, settling a
//! replaced one), `server::{ffi, store, tracking, stats}` and the pure `lock::rule`. The server layer stays
//! free of the lock: these functions lived in `server::store` until the pipeline issue
//! moved them up here, unchanged.
//!
//! Writes use the direct key API (measurably faster than `ctx.call`, and than the
//! generic `store::apply_effects`, which allocates a name per effect): the lock's hot
//! path reads one field and writes with the key API, so the module does by hand what
//! the call path would have done for it.

use redis_module::{Context, NotifyEvent, RedisString};

use crate::engine::{self, Owed, Path, Served};
use crate::lock::{self, LockState, Outcome, Plan, Write};
use crate::server::ffi::{self, Arg, KeyKind, LockKey};
use crate::server::tracking::{self, OwnWrite};
use crate::server::{stats, store};
use crate::vocab::args;
use crate::vocab::errors::ERR_WRONGTYPE;

/// The lock a key holds, or the error a command must answer when it is not a lock.
pub fn read(key: &LockKey) -> Result<LockState<'static>, &'static str> {
    match key.kind() {
        KeyKind::Empty => Ok(LockState::Free),
        KeyKind::Hash => Ok(LockState::Held {
            holders: lock::parse_holders(key.hash_fields())?,
            pttl: key.pttl(),
        }),
        _ => Err(ERR_WRONGTYPE),
    }
}

/// [`read`] for a command by `owner`. The common lock, one owner's field alone, is read
/// with one field lookup, nothing copied and no TTL lookup ([`LockState::Alone`]);
/// anything else (another holder, several, a bad value) falls back to reading every
/// field, which also validates them.
pub fn read_for<'a>(key: &LockKey, owner: &'a RedisString) -> Result<LockState<'a>, &'static str> {
    if key.kind() != KeyKind::Hash || key.value_length() != 1 {
        return read(key);
    }
    match key.hash_get_with(owner, args::parse_i64) {
        Some(Some(count)) if count >= 1 => Ok(LockState::Alone {
            owner: owner.as_slice(),
            count,
        }),
        _ => read(key),
    }
}

/// What the engine does for a lock key the module wrote, once nobody waits for it: is it
/// still a lock, and if not, its unlock message (see `engine::Owed`).
static UNLOCK_OWED: Owed = Owed {
    held: still_held,
    send: publish_unlock,
};

/// True while the key still holds a lock (any owner's): its unlock message is not due.
fn still_held(ctx: &Context, name: &RedisString) -> bool {
    matches!(
        read(&LockKey::open(ctx, name, false)),
        Ok(LockState::Held { .. })
    )
}

/// Bumps the `INFO rlock` counter of a lock outcome (also the fenced lock's, `fenced::commands`).
pub fn count(outcome: Outcome) {
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

/// Opens the lock key for writing and reads it (for `owner`'s command: its one field, on
/// the fast path). The pipeline has served the key's queue already; but a lock of ours
/// replaced by something that is no lock, by a command whose events the module does not
/// watch on this server (SORT ... STORE on 7.0), gets its unlock message now, lazily
/// (docs/commands/lock.md, "Freeing and handoff"), and the key is read again.
pub fn open_for_write<'a>(
    ctx: &Context,
    db: i32,
    name: &RedisString,
    owner: Option<&'a RedisString>,
) -> (LockKey, Result<LockState<'a>, &'static str>) {
    let read = |key: &LockKey| match owner {
        Some(owner) => read_for(key, owner),
        None => read(key),
    };
    let key = LockKey::open(ctx, name, true);
    let state = read(&key);
    if state.is_err() && tracking::is_tracked(db, name.as_slice()) {
        drop(key);
        engine::settle(ctx, db, name);
        let key = LockKey::open(ctx, name, true);
        let state = read(&key);
        return (key, state);
    }
    (key, state)
}

/// Writes a plan on the open key (closed after), counts its outcome and remembers its
/// reply under the request id if it changed the lock.
pub fn write(
    ctx: &Context,
    key: LockKey,
    name: &RedisString,
    owner: &RedisString,
    plan: &Plan,
    request: Option<&RedisString>,
    now: i64,
) {
    apply(ctx, &key, name, owner, plan);
    drop(key);
    count(plan.outcome);
    if let Some(req) = request.filter(|_| lock::remembers(plan.outcome)) {
        store::remember(ctx, req, &plan.reply.into(), now);
    }
}

/// Applies a plan for `owner` on the open key `key` named `name`.
///
/// Each effect is replicated as the plain command that has the same result (HSET, HINCRBY,
/// HDEL, DEL, and PEXPIREAT with the absolute time), never as the RLOCK command, so that a
/// replica or an AOF reload needs no module and lands on the same absolute expiry.
pub fn apply(ctx: &Context, key: &LockKey, name: &RedisString, owner: &RedisString, plan: &Plan) {
    if !plan.writes() {
        return;
    }
    // Our own notifications must not look like somebody else's write to the waiter glue.
    let _own = OwnWrite::begin();
    if plan.delete {
        key.delete();
        ffi::replicate(ctx, c"DEL", &[Arg::Str(name)]);
        ffi::notify(ctx, NotifyEvent::GENERIC, c"del", name);
    }
    match plan.write {
        Some(Write::Set(n)) => {
            // A new lock (or a handoff): remember the key, so that if it goes away by
            // expiry, DEL or overwrite, the module still publishes its unlock message.
            // Only while tracking is on (somebody waits somewhere): else not even the
            // name is looked at.
            if tracking::active() {
                engine::track(ffi::selected_db(ctx), name.as_slice(), &UNLOCK_OWED);
            }
            ffi::with_count_string(n, |value| key.hash_set(owner, value));
            ffi::replicate(
                ctx,
                c"HSET",
                &[Arg::Str(name), Arg::Str(owner), Arg::Int(n)],
            );
            ffi::notify(ctx, NotifyEvent::HASH, c"hset", name);
        }
        Some(Write::IncrBy(delta, next)) => {
            // We know the count already, so we write the result; replicas get the HINCRBY
            // whose result is the same.
            ffi::with_count_string(next, |value| key.hash_set(owner, value));
            ffi::replicate(
                ctx,
                c"HINCRBY",
                &[Arg::Str(name), Arg::Str(owner), Arg::Int(delta)],
            );
            ffi::notify(ctx, NotifyEvent::HASH, c"hincrby", name);
        }
        Some(Write::Remove) => {
            key.hash_del(owner);
            ffi::replicate(ctx, c"HDEL", &[Arg::Str(name), Arg::Str(owner)]);
            ffi::notify(ctx, NotifyEvent::HASH, c"hdel", name);
        }
        None => {}
    }
    if let Some(at) = plan.expire_at {
        key.set_abs_expire(at);
        ffi::replicate(ctx, c"PEXPIREAT", &[Arg::Str(name), Arg::Int(at)]);
        ffi::notify(ctx, NotifyEvent::GENERIC, c"expire", name);
    }
    ffi::signal_modified(ctx, name);
}

/// Publishes Redisson's unlock message for `name`, as every primitive's messages go out
/// (`store::publish`: SPUBLISH to the lock's shard in cluster mode, else PUBLISH,
/// replicated so that subscribers connected to replicas hear it too).
pub fn publish_unlock(ctx: &Context, name: &RedisString) {
    store::publish(
        ctx,
        &lock::unlock_channel(name.as_slice()),
        lock::UNLOCK_MESSAGE,
    );
}

/// After a lock was freed: hand it to the first waiter, or tell pub/sub waiters
/// (Redisson's) that it is free. A handoff publishes nothing: the lock never was free.
///
/// A release by a module command may first leave the lock to script-side waiters for a
/// moment (engine/turns.rs, design.md 1.8): then the unlock message goes out now and the
/// queue's head gets the lock when that turn ends.
pub fn freed(ctx: &Context, db: i32, name: &RedisString, path: Path) {
    let key = name.as_slice();
    if path == Path::Command
        && engine::anyone_waits()
        && engine::open_script_turn(ctx, db, key, || lock::unlock_channel(key))
    {
        tracking::untrack(db, key);
        publish_unlock(ctx, name);
        return;
    }
    match engine::serve(ctx, db, name, path) {
        Served::Handed | Served::Redirected => {}
        // Writes paused: the sweep serves the key once they resume.
        Served::StillHeld if ffi::writes_paused() => {}
        _ => {
            tracking::untrack(db, name.as_slice());
            publish_unlock(ctx, name);
        }
    }
}
