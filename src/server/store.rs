//! Keys read by type ([`read_any`]) and a rule's effects written back
//! ([`apply_effects`]), with everything a plain command would do around a write:
//! replication as plain commands, keyspace notifications and the WATCH signal; Redisson's
//! messages; the request-id records.
//!
//! Layer: below the primitives, the pipeline and `engine`, above `tracking` and `ffi`; it
//! names no primitive and never calls up (the lock's own hash reads and key-API writes,
//! its hot path, live in `lock::store`).
//!
//! Writes use the direct key API (measurably faster than `ctx.call`), so the module does
//! by hand what the call path would have done for it.

use redis_module::{Context, ContextFlags, NotifyEvent, RedisString};
use smallvec::{smallvec, SmallVec};

use crate::server::ffi::{self, Arg, KeyKind, LockKey};
use crate::server::tracking::OwnWrite;
use crate::vocab::effects::{Bytes, Effect, KeyRef};
use crate::vocab::errors::ERR_WRONGTYPE;
use crate::vocab::reply::{self, Reply};

fn number(n: i64) -> RedisString {
    ffi::long_string(n)
}

/// An effect's bytes as a server string: the module's kept one for a constant word
/// ([`ffi::kept_string`]), else one made for this write.
enum Word {
    Kept(&'static RedisString),
    Made(RedisString),
}

impl std::ops::Deref for Word {
    type Target = RedisString;
    fn deref(&self) -> &RedisString {
        match self {
            Word::Kept(s) => s,
            Word::Made(s) => s,
        }
    }
}

/// A server string made for this write (a key name, a message). A key's own value
/// (`SET`) is always one of these, never a kept one: the server keeps the string object
/// itself as the value (a hash copies its fields instead), so a shared object would share
/// its LRU/LFU clock between keys, and Valkey re-makes a value to embed its key in it.
fn made(b: &[u8]) -> RedisString {
    RedisString::create_from_slice(std::ptr::null_mut(), b)
}

/// For a hash's field or value, which the server copies (see [`made`] for a key's value).
fn word(b: &Bytes) -> Word {
    match b {
        Bytes::Borrowed(w) => ffi::kept_string(w).map_or_else(|| Word::Made(made(w)), Word::Kept),
        Bytes::Owned(v) => Word::Made(made(v)),
    }
}

/// Publishes a Redisson message on one of its channels (every primitive's messages go
/// out this way). In cluster mode it goes out with SPUBLISH to the key's shard (the
/// cluster bus reaches the shard's replicas); otherwise with PUBLISH, replicated, so that
/// subscribers connected to replicas hear it too.
pub fn publish(ctx: &Context, channel: &[u8], message: &[u8]) {
    let channel = made(channel);
    let message = made(message);
    let cluster = ctx.get_flags().contains(ContextFlags::CLUSTER);
    ffi::publish(ctx, &channel, &message, cluster);
    if !cluster {
        ffi::replicate(ctx, c"PUBLISH", &[Arg::Str(&channel), Arg::Str(&message)]);
    }
    // A command run again on a replica would publish again; in cluster mode the message
    // already reaches the shard's replicas (SPUBLISH), unreplicated: never as itself.
    ffi::not_as_called();
}

/// Publishes a message to this node's subscribers only, not replicated (a queued ticket's
/// end, docs/commands/tickets.md: its client listens where it queued the ticket): SPUBLISH in
/// cluster mode, else PUBLISH.
pub fn publish_here(ctx: &Context, channel: &[u8], message: &[u8]) {
    let channel = made(channel);
    let message = made(message);
    let cluster = ctx.get_flags().contains(ContextFlags::CLUSTER);
    ffi::publish(ctx, &channel, &message, cluster);
}

/// The reply remembered for a request id (see [`remember`]), if the window is still open.
pub fn remembered(ctx: &Context, request: &RedisString) -> Option<Reply> {
    match record(ctx, request)? {
        Record::Reply(reply) => Some(reply),
        Record::TakenBack => None,
    }
}

/// What a request id's record holds.
pub enum Record {
    /// The call's first reply, replayed to a retry.
    Reply(Reply),
    /// The mark of a ticket's grant taken back (see [`remember_taken_back`]).
    TakenBack,
}

/// The mark [`remember_taken_back`] stores: no reply encodes to it (`reply::decode` reads
/// it as nothing), so an old module reading it replays nothing.
const TAKEN_BACK: &[u8] = b"!taken-back";

/// A request id's record, if the window is still open.
pub fn record(ctx: &Context, request: &RedisString) -> Option<Record> {
    let key = LockKey::open(ctx, request, false);
    if !key.is_string() {
        return None;
    }
    let stored = key.string_get();
    if stored.as_slice() == TAKEN_BACK {
        return Some(Record::TakenBack);
    }
    reply::decode(&stored).map(Record::Reply)
}

/// Marks a request id whose ticket's grant was taken back (design.md 5): its client may
/// have proceeded on the `granted` message, so a retry (its late confirmation) must hear
/// that the hold is gone rather than be served afresh as a new call. Kept for the
/// request-id window like a reply; replicated like one.
pub fn remember_taken_back(ctx: &Context, request: &[u8], now: i64) {
    let name = made(request);
    remember_bytes(ctx, &name, TAKEN_BACK, now);
}

/// Remembers the reply of a call that changed the lock, under its request id, for
/// `rlock.request-id-window-ms`. It is a plain string key with an absolute expiry in the
/// lock's slot (Redisson's unlock latch does the same): it replicates and persists like
/// the lock, so a client retrying after a failover still gets the first reply.
pub fn remember(ctx: &Context, request: &RedisString, reply: &Reply, now: i64) {
    remember_bytes(ctx, request, &reply::encode(reply), now);
}

fn remember_bytes(ctx: &Context, request: &RedisString, bytes: &[u8], now: i64) {
    let key = LockKey::open(ctx, request, true);
    if !matches!(key.kind(), KeyKind::Empty) && !key.is_string() {
        return; // somebody else's data: never overwrite it
    }
    let _own = OwnWrite::begin();
    let value = made(bytes);
    let at = now + crate::server::config::request_id_window_ms();
    set_px_at(ctx, &key, request, &value, at);
    ffi::signal_modified(ctx, request);
}

/// `SET key value PXAT at` through the key API, replicated and notified as that command
/// ("set", then "expire"). `target` is the key's name.
fn set_px_at(ctx: &Context, key: &LockKey, target: &RedisString, value: &RedisString, at: i64) {
    key.string_set(value);
    key.set_abs_expire(at);
    ffi::replicate(
        ctx,
        c"SET",
        &[
            Arg::Str(target),
            Arg::Str(value),
            Arg::Word(c"PXAT"),
            Arg::Int(at),
        ],
    );
    ffi::notify(ctx, NotifyEvent::STRING, c"set", target);
    ffi::notify(ctx, NotifyEvent::GENERIC, c"expire", target);
}

/// Deletes a remembered reply (a handoff taken back before its client was told).
pub fn forget_request(ctx: &Context, request: &[u8]) {
    let name = made(request);
    let key = LockKey::open(ctx, &name, true);
    if !key.is_string() {
        return;
    }
    let _own = OwnWrite::begin();
    key.delete();
    ffi::replicate(ctx, c"DEL", &[Arg::Str(&name)]);
    ffi::notify(ctx, NotifyEvent::GENERIC, c"del", &name);
    ffi::signal_modified(ctx, &name);
}

// ---- Any key read, and a rule's effects applied ----

/// What a key holds, for the primitives' rules: its value read by type, and
/// its absolute expiry. The error for a key of another type than the primitive reads is
/// the caller's to pick (its cores name it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Value {
    #[default]
    Missing,
    String(Vec<u8>),
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
    /// (member, score) pairs, lowest score first.
    Zset(Vec<(Vec<u8>, i64)>),
    /// A list, set, stream or module type: no primitive's.
    Other,
}

/// A key's [`Value`] and its absolute expiry (-1: none; -2: missing), in the selected db.
pub fn read_any(ctx: &Context, name: &[u8]) -> (Value, i64) {
    read_key(ctx, &made(name))
}

/// The string value at `name` parsed where it lies (no copy, no expiry read): `parse(None)`
/// for a missing key, the wrong-type error for a key of another type. The counters'
/// (semaphore, latch) read on every call.
pub fn parse_string<T>(
    ctx: &Context,
    name: &RedisString,
    parse: impl FnOnce(Option<&[u8]>) -> Result<T, &'static str>,
) -> Result<T, &'static str> {
    let key = LockKey::open(ctx, name, false);
    match key.kind() {
        KeyKind::Empty => parse(None),
        KeyKind::String => key.with_string(|v| parse(Some(v))),
        _ => Err(ERR_WRONGTYPE),
    }
}

/// [`parse_string`] for a command that writes what it read: the key opened once, for
/// writing, and handed back to be written through ([`apply_own_effects_in`]), as the
/// command it stands for (DECRBY, INCRBY) looks its key up once. A second open costs a
/// key lookup and a handle, about 800 instructions.
pub fn open_string<T>(
    ctx: &Context,
    name: &RedisString,
    parse: impl FnOnce(Option<&[u8]>) -> Result<T, &'static str>,
) -> (LockKey, Result<T, &'static str>) {
    let key = LockKey::open(ctx, name, true);
    let state = match key.kind() {
        KeyKind::Empty => parse(None),
        KeyKind::String => key.with_string(|v| parse(Some(v))),
        _ => Err(ERR_WRONGTYPE),
    };
    (key, state)
}

/// [`read_any`] of a key named by a string the caller has (the command's own key): no
/// copy of the name made to open it.
pub fn read_key(ctx: &Context, name: &RedisString) -> (Value, i64) {
    let key = LockKey::open(ctx, name, false);
    let value = match key.kind() {
        KeyKind::Empty => return (Value::Missing, -2),
        KeyKind::String => Value::String(key.string_get()),
        KeyKind::Hash => Value::Hash(key.hash_fields()),
        KeyKind::Zset => Value::Zset(key.zset_items()),
        KeyKind::Other => Value::Other,
    };
    (value, key.abs_expire())
}

/// Applies the running command's own effects, decided by its arguments and the key's
/// state, through its key already open for writing ([`open_string`]; closed after them,
/// before anything serves the key's queue): replicated as the command itself when they
/// are all it replicates (`ffi::as_called`), unless they carry a time (an expiry, a lease
/// score), which the command would compute again from another clock on a replica or at a
/// reload. `alone`: the command's plan says nothing follows them (no grant, no message,
/// no request-id record), so they need not even be recorded (`ffi::as_called_alone`).
pub fn apply_own_effects_in(
    ctx: &Context,
    name: &RedisString,
    key: LockKey,
    effects: &[Effect],
    alone: bool,
) {
    let timed = effects
        .iter()
        .any(|e| matches!(e, Effect::PExpireAt(..) | Effect::ZAdd(..)));
    let apply = || apply_effects_with(ctx, name, Some(&key), effects);
    if timed {
        apply();
    } else if alone {
        ffi::as_called_alone(apply);
    } else {
        ffi::as_called(apply);
    }
}

/// Applies a core's effects in order on the key `name` (the command's key, for
/// [`KeyRef::Main`]) and the auxiliary keys it names (always in `name`'s slot). Each is
/// done as its plain command would: written with the key API, replicated as that command
/// (absolute expiries, design.md 1.4), its keyspace notification fired, WATCH signalled.
pub fn apply_effects(ctx: &Context, name: &RedisString, effects: &[Effect]) {
    apply_effects_with(ctx, name, None, effects);
}

/// [`apply_effects`] through the command's own key, which the caller opened for writing
/// when it read it (one key lookup, not two); closed after them.
pub fn apply_effects_in(ctx: &Context, name: &RedisString, key: LockKey, effects: &[Effect]) {
    apply_effects_with(ctx, name, Some(&key), effects);
}

/// [`apply_effects`], writing the command's own key through `main` when the caller has it
/// open for writing: every write to it goes through that one handle (a second handle on
/// a key one of them replaced would point at a freed value).
fn apply_effects_with(
    ctx: &Context,
    name: &RedisString,
    main: Option<&LockKey>,
    effects: &[Effect],
) {
    if effects.is_empty() {
        return;
    }
    let _own = OwnWrite::begin();
    // The keys written, each signalled once at the end: the command's own key apart, as
    // most commands write only it. Another key's string is kept by reference (retained,
    // not copied); a read hold writes one.
    let mut main_touched = false;
    let mut touched: SmallVec<[RedisString; 2]> = SmallVec::new();
    let mut touch = |target: &RedisString| {
        if std::ptr::eq(target, name) || target.as_slice() == name.as_slice() {
            main_touched = true;
        } else if !touched.iter().any(|t| t.as_slice() == target.as_slice()) {
            touched.push(RedisString::new(None, target.inner));
        }
    };
    let mut i = 0;
    while i < effects.len() {
        let effect = &effects[i];
        i += 1;
        // Consecutive HSETs of one key (a new RW lock's mode and first hold) are written
        // as one HSET of several fields: the same writes and notification as that command;
        // one command replicated, not one per field (each costs the server a command
        // lookup and a propagated argv).
        if let Some(merged) = merged_run(&effects[i - 1..]) {
            i += merged - 1;
            apply_merged(ctx, name, main, &effects[i - merged..i], &mut touch);
            continue;
        }
        let key_ref = match effect {
            Effect::Del(k)
            | Effect::HSet(k, ..)
            | Effect::HIncrBy(k, ..)
            | Effect::HDel(k, ..)
            | Effect::Set(k, ..)
            | Effect::PExpireAt(k, ..)
            | Effect::Persist(k)
            | Effect::IncrBy(k, ..)
            | Effect::ZAdd(k, ..)
            | Effect::ZRem(k, ..) => k,
        };
        let aux;
        let target: &RedisString = match key_ref {
            KeyRef::Main => name,
            KeyRef::Aux(n) => {
                aux = made(n);
                &aux
            }
        };
        let key = Handle::of(ctx, key_ref, target, main);
        match effect {
            Effect::Del(_) => {
                if key.kind() == KeyKind::Empty {
                    continue; // DEL of a missing key changes nothing and replicates nothing
                }
                key.delete();
                ffi::replicate(ctx, c"DEL", &[Arg::Str(target)]);
                ffi::notify(ctx, NotifyEvent::GENERIC, c"del", target);
            }
            Effect::HSet(_, field, value) => {
                let (field, value) = (word(field), word(value));
                key.hash_set(&field, &value);
                ffi::replicate_argv(ctx, c"HSET", &[target, &field, &value]);
                ffi::notify(ctx, NotifyEvent::HASH, c"hset", target);
            }
            Effect::HIncrBy(_, field, delta, result) => {
                let field = word(field);
                key.hash_set(&field, &number(*result));
                ffi::replicate(
                    ctx,
                    c"HINCRBY",
                    &[Arg::Str(target), Arg::Str(&field), Arg::Int(*delta)],
                );
                ffi::notify(ctx, NotifyEvent::HASH, c"hincrby", target);
            }
            Effect::HDel(_, field) => {
                let field = word(field);
                key.hash_del(&field);
                ffi::replicate(ctx, c"HDEL", &[Arg::Str(target), Arg::Str(&field)]);
                ffi::notify(ctx, NotifyEvent::HASH, c"hdel", target);
            }
            Effect::Set(_, value, None) => {
                let value = made(value);
                key.string_set(&value);
                ffi::replicate(ctx, c"SET", &[Arg::Str(target), Arg::Str(&value)]);
                ffi::notify(ctx, NotifyEvent::STRING, c"set", target);
            }
            Effect::Set(_, value, Some(at)) => {
                set_px_at(ctx, &key, target, &made(value), *at);
            }
            Effect::PExpireAt(_, at) => {
                key.set_abs_expire(*at);
                ffi::replicate(ctx, c"PEXPIREAT", &[Arg::Str(target), Arg::Int(*at)]);
                ffi::notify(ctx, NotifyEvent::GENERIC, c"expire", target);
            }
            Effect::Persist(_) => {
                key.persist();
                ffi::replicate(ctx, c"PERSIST", &[Arg::Str(target)]);
                ffi::notify(ctx, NotifyEvent::GENERIC, c"persist", target);
            }
            Effect::IncrBy(_, delta, result) => {
                // In place, keeping the key's TTL as INCRBY does.
                key.string_write_number(*result);
                let (cmd, event, by) = if *delta < 0 {
                    (c"DECRBY", c"decrby", -*delta)
                } else {
                    (c"INCRBY", c"incrby", *delta)
                };
                ffi::replicate(ctx, cmd, &[Arg::Str(target), Arg::Int(by)]);
                ffi::notify(ctx, NotifyEvent::STRING, event, target);
            }
            Effect::ZAdd(_, items) => {
                // Scores go out as integers: no string is made for one unless the write
                // is replicated on its own (`effects` mode).
                let members: SmallVec<[RedisString; 2]> = items
                    .iter()
                    .map(|(score, member)| {
                        let member = made(member);
                        key.zset_add(*score, &member);
                        member
                    })
                    .collect();
                let mut args: SmallVec<[Arg; 5]> = smallvec![Arg::Str(target)];
                for ((score, _), member) in items.iter().zip(&members) {
                    args.push(Arg::Int(*score));
                    args.push(Arg::Str(member));
                }
                ffi::replicate(ctx, c"ZADD", &args);
                ffi::notify(ctx, NotifyEvent::ZSET, c"zadd", target);
            }
            Effect::ZRem(_, members) => {
                let members: Vec<RedisString> = members.iter().map(|m| made(m)).collect();
                for member in &members {
                    key.zset_rem(member);
                }
                let mut args: Vec<&RedisString> = vec![target];
                args.extend(members.iter());
                ffi::replicate_argv(ctx, c"ZREM", &args);
                ffi::notify(ctx, NotifyEvent::ZSET, c"zrem", target);
            }
        }
        touch(target);
    }
    if main_touched {
        ffi::signal_modified(ctx, name);
    }
    for key in &touched {
        ffi::signal_modified(ctx, key);
    }
}

/// The key an effect writes, open for writing: the command's own key through the
/// caller's handle when it has one (every write to it must go through that handle),
/// else opened now and closed when dropped.
enum Handle<'a> {
    Lent(&'a LockKey),
    Opened(LockKey),
}

impl<'a> Handle<'a> {
    fn of(
        ctx: &Context,
        key_ref: &KeyRef,
        target: &RedisString,
        main: Option<&'a LockKey>,
    ) -> Self {
        match (key_ref, main) {
            (KeyRef::Main, Some(main)) => Handle::Lent(main),
            _ => Handle::Opened(LockKey::open(ctx, target, true)),
        }
    }
}

impl std::ops::Deref for Handle<'_> {
    type Target = LockKey;
    fn deref(&self) -> &LockKey {
        match self {
            Handle::Lent(key) => key,
            Handle::Opened(key) => key,
        }
    }
}

/// How many effects from the start of `effects` go out as one merged command (see
/// [`apply_effects`]), if at least two do.
fn merged_run(effects: &[Effect]) -> Option<usize> {
    match effects {
        [Effect::HSet(k, ..), ..] => {
            let run = effects
                .iter()
                .take_while(|e| matches!(e, Effect::HSet(k2, ..) if k2 == k))
                .count();
            (run > 1).then_some(run)
        }
        _ => None,
    }
}

/// Applies a run [`merged_run`] found: written with the key API, replicated as one
/// command, notified as that command notifies.
fn apply_merged(
    ctx: &Context,
    name: &RedisString,
    main: Option<&LockKey>,
    run: &[Effect],
    touch: &mut impl FnMut(&RedisString),
) {
    let Effect::HSet(key_ref, ..) = &run[0] else {
        return;
    };
    let aux;
    let target: &RedisString = match key_ref {
        KeyRef::Main => name,
        KeyRef::Aux(n) => {
            aux = made(n);
            &aux
        }
    };
    let key = Handle::of(ctx, key_ref, target, main);
    match run {
        // Two fields (a read-write lock's mode and first hold): one call to the key API,
        // no vector.
        [Effect::HSet(_, f1, v1), Effect::HSet(_, f2, v2)] => {
            let (f1, v1, f2, v2) = (word(f1), word(v1), word(f2), word(v2));
            key.hash_set2(&f1, &v1, &f2, &v2);
            ffi::replicate_argv(ctx, c"HSET", &[target, &f1, &v1, &f2, &v2]);
            ffi::notify(ctx, NotifyEvent::HASH, c"hset", target);
        }
        _ => {
            let mut argv: Vec<Word> = Vec::with_capacity(run.len() * 2);
            for effect in run {
                if let Effect::HSet(_, field, value) = effect {
                    let (field, value) = (word(field), word(value));
                    key.hash_set(&field, &value);
                    argv.push(field);
                    argv.push(value);
                }
            }
            let mut args: Vec<&RedisString> = vec![target];
            args.extend(argv.iter().map(|w| &**w));
            ffi::replicate_argv(ctx, c"HSET", &args);
            // One HSET of several fields fires one "hset".
            ffi::notify(ctx, NotifyEvent::HASH, c"hset", target);
        }
    }
    touch(target);
}
