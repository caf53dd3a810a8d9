//! The read-write lock algorithm (SPEC 4.1), pure: no Redis, no clock, no I/O.
//!
//! It sits beside `core` (the plain lock) and works the same way: the glue reads the keys
//! into an [`RwState`], calls one function per command with `now`, applies the returned
//! [`Plan`]'s effects in order, and replies. The waiting engine calls [`grant`] on the head
//! of a key's queue, again and again, until it answers `None`.
//!
//! The layout is Redisson's RReadWriteLock (docs/redisson-layouts.md): a hash at the name
//! with `mode` = `read` | `write`, one field per read owner (`<owner>` -> hold count) and,
//! in write mode, the writer's field (`<owner>:write` -> hold count); each read hold `n` of
//! an owner has a string key `{name}:<owner>:rwlock_timeout:<n>` whose TTL is that hold's
//! lease; the hash's TTL covers the longest lease. Redisson only reads those timeout keys
//! when a reader unlocks, so a dead reader stays in the hash for as long as any other
//! reader renews. Here every command first drops the read owners whose timeout keys have
//! all run out ([`expire`]), so each reader loses its hold at its own lease end, and the
//! engine can arm a timer at [`RwState::next_deadline`] to do it without a command.
//!
//! Fairness beyond Redisson: a new reader does not join a read-held lock while anyone is
//! queued (the head is then a writer), so writers are not starved; re-entries are always
//! served (refusing them would deadlock the owner against the writer it blocks).

use std::collections::BTreeMap;

use crate::core::{parse_acquire, parse_i64, parse_release, parse_renew, AcquireArgs, ReleaseArgs};
use crate::effects::{prefix_name, suffix_name, Effect, KeyRef};
use crate::errors::{
    ERR_COUNT_OVERFLOW, ERR_NOT_A_RWLOCK, ERR_RW_OWNER_SUFFIX, ERR_RW_READ_HELD, ERR_RW_SIDE,
    ERR_RW_TOO_MANY_HOLDS, ERR_SYNTAX,
};

pub const MODE_FIELD: &[u8] = b"mode";
/// The writer's hash field is its owner id with this suffix (RedissonWriteLock.getLockName).
pub const WRITE_SUFFIX: &[u8] = b":write";
/// LockPubSub.UNLOCK_MESSAGE: Redisson wakes one waiter. Sent when the last reader leaves.
pub const UNLOCK_MESSAGE: &[u8] = b"0";
/// LockPubSub.READ_UNLOCK_MESSAGE: Redisson wakes every waiter. Sent when a writer leaves.
pub const READ_UNLOCK_MESSAGE: &[u8] = b"1";
/// Each read hold has a timeout key that the glue must read on every command, so one
/// owner's re-entries are bounded (Redisson's scripts loop over them the same way).
pub const MAX_READ_HOLDS: i64 = 1024;
/// An expiry that never comes: a key without TTL.
pub const NEVER: i64 = i64::MAX;
/// The end of a read hold whose timeout key is missing: it is over.
pub const GONE: i64 = i64::MIN;

/// Which half of the lock a command is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Read,
    Write,
}

/// The hash's `mode` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
}

impl Mode {
    pub fn as_bytes(self) -> &'static [u8] {
        match self {
            Mode::Read => b"read",
            Mode::Write => b"write",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    /// The owner id, without the `:write` suffix its field carries.
    pub owner: Vec<u8>,
    pub count: i64,
}

/// What the keys of one read-write lock hold, as far as the algorithm cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwState {
    /// `None`: no key, nobody holds the lock.
    pub mode: Option<Mode>,
    /// Only in write mode.
    pub writer: Option<Writer>,
    /// Read owner -> the absolute end of each of its holds: index 0 is hold 1 (timeout key
    /// `:1`). [`GONE`] when that key is missing, [`NEVER`] when it has no TTL. In write mode
    /// these are the writer's own read holds (nobody else may read then).
    pub readers: BTreeMap<Vec<u8>, Vec<i64>>,
    /// The hash's absolute expiry, [`NEVER`] without TTL; [`NEVER`] when free.
    pub expire_at: i64,
}

impl Default for RwState {
    fn default() -> Self {
        RwState::free()
    }
}

impl RwState {
    pub fn free() -> RwState {
        RwState {
            mode: None,
            writer: None,
            readers: BTreeMap::new(),
            expire_at: NEVER,
        }
    }

    pub fn is_free(&self) -> bool {
        self.mode.is_none()
    }

    pub fn read_count(&self, owner: &[u8]) -> i64 {
        self.readers.get(owner).map_or(0, |ends| ends.len() as i64)
    }

    pub fn is_writer(&self, owner: &[u8]) -> bool {
        self.writer.as_ref().is_some_and(|w| w.owner == owner)
    }

    /// The remaining lease as PTTL reports it: -1 without TTL (and for a free lock, which
    /// a contended reply never reports).
    pub fn pttl(&self, now: i64) -> i64 {
        if self.is_free() || self.expire_at == NEVER {
            -1
        } else {
            (self.expire_at - now).max(0)
        }
    }

    /// For `RRWLOCK.INFO`: each read owner with its hold count and remaining lease in ms
    /// (-1 when a hold has no TTL).
    pub fn read_holds(&self, now: i64) -> Vec<(&[u8], i64, i64)> {
        self.readers
            .iter()
            .map(|(owner, ends)| {
                let remaining = match lease_end(ends) {
                    NEVER => -1,
                    end => (end - now).max(0),
                };
                (owner.as_slice(), ends.len() as i64, remaining)
            })
            .collect()
    }

    /// The longest read lease still running, or `None` with no readers.
    fn read_end(&self) -> Option<i64> {
        self.readers.values().map(|ends| lease_end(ends)).max()
    }

    /// The earliest moment the lock changes by itself: a read owner's lease end (which only
    /// this module acts on) or the hash's expiry (which Redis acts on, but not promptly
    /// enough for waiters). The engine arms a timer there and calls [`expire`].
    pub fn next_deadline(&self) -> Option<i64> {
        self.readers
            .values()
            .map(|ends| lease_end(ends))
            .chain((!self.is_free()).then_some(self.expire_at))
            .filter(|&at| at != NEVER)
            .min()
    }
}

/// A read owner's lease ends with its last hold's.
fn lease_end(ends: &[i64]) -> i64 {
    ends.iter().copied().max().unwrap_or(GONE)
}

/// The timeout key of an owner's `n`-th read hold: `{name}:<owner>:rwlock_timeout:<n>`
/// (RedissonReadLock.getReadWriteTimeoutNamePrefix, in the name's slot).
pub fn timeout_key(key: &[u8], owner: &[u8], n: i64) -> Vec<u8> {
    let mut name = suffix_name(key, owner);
    name.extend_from_slice(b":rwlock_timeout:");
    name.extend_from_slice(n.to_string().as_bytes());
    name
}

/// Both halves publish on `redisson_rwlock:{name}`.
pub fn channel(key: &[u8]) -> Vec<u8> {
    prefix_name(b"redisson_rwlock", key)
}

fn writer_field(owner: &[u8]) -> Vec<u8> {
    [owner, WRITE_SUFFIX].concat()
}

/// The hash as read, before the timeout keys: says which timeout keys the glue must read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashView {
    pub mode: Mode,
    pub writer: Option<Writer>,
    /// Read owners with their hold counts, in field order.
    pub readers: Vec<(Vec<u8>, i64)>,
}

/// Reads the hash fields. It must be Redisson's layout: a `mode` of `read` or `write`,
/// positive counts, one `:write` field in write mode and none in read mode; otherwise it
/// is somebody else's data and no command may touch it.
pub fn parse_hash<F, V>(fields: impl IntoIterator<Item = (F, V)>) -> Result<HashView, &'static str>
where
    F: Into<Vec<u8>>,
    V: AsRef<[u8]>,
{
    let mut mode = None;
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for (field, value) in fields {
        let field: Vec<u8> = field.into();
        let value = value.as_ref();
        if field == MODE_FIELD {
            mode = Some(match value {
                b"read" => Mode::Read,
                b"write" => Mode::Write,
                _ => return Err(ERR_NOT_A_RWLOCK),
            });
            continue;
        }
        let count = match parse_i64(value) {
            Some(count) if count >= 1 => count,
            _ => return Err(ERR_NOT_A_RWLOCK),
        };
        match field.strip_suffix(WRITE_SUFFIX) {
            Some(owner) => writers.push(Writer {
                owner: owner.to_vec(),
                count,
            }),
            None if count > MAX_READ_HOLDS => return Err(ERR_RW_TOO_MANY_HOLDS),
            None => readers.push((field, count)),
        }
    }
    let mode = mode.ok_or(ERR_NOT_A_RWLOCK)?;
    let writer = match (mode, writers.len()) {
        (Mode::Write, 1) => writers.pop(),
        (Mode::Read, 0) => None,
        _ => return Err(ERR_NOT_A_RWLOCK),
    };
    Ok(HashView {
        mode,
        writer,
        readers,
    })
}

impl HashView {
    /// The timeout keys to read (PTTL of each), reader by reader, hold 1 first.
    pub fn timeout_keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        self.readers
            .iter()
            .flat_map(|(owner, count)| (1..=*count).map(move |n| timeout_key(key, owner, n)))
            .collect()
    }

    /// The state, given the hash's PTTL and the PTTLs of [`HashView::timeout_keys`] in
    /// that order (missing ones count as -2, a key gone).
    pub fn into_state(self, pttl: i64, timeout_pttls: &[i64], now: i64) -> RwState {
        let mut pttls = timeout_pttls.iter().copied();
        let readers = self
            .readers
            .into_iter()
            .map(|(owner, count)| {
                let ends = (0..count)
                    .map(|_| pttl_to_at(pttls.next().unwrap_or(-2), now))
                    .collect();
                (owner, ends)
            })
            .collect();
        RwState {
            mode: Some(self.mode),
            writer: self.writer,
            readers,
            expire_at: match pttl_to_at(pttl, now) {
                GONE => NEVER,
                at => at,
            },
        }
    }
}

/// PTTL's answer as an absolute time: -1 (no TTL) is [`NEVER`], -2 (no key) is [`GONE`].
pub fn pttl_to_at(pttl: i64, now: i64) -> i64 {
    match pttl {
        -1 => NEVER,
        p if p < 0 => GONE,
        p => now.saturating_add(p),
    }
}

/// The reply a command sends when it answers at once: nil or an integer, as the lock's
/// (so the request-id store's `core::encode_reply` keeps RW replies as it is).
pub use crate::core::Reply;

/// What happened, for the `INFO rlock` counters and the glue's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Acquired,
    Reentered,
    /// Held in a way that excludes the caller, or others are queued first: a WAIT caller
    /// may queue now.
    Contended,
    Decremented,
    /// The owner let go of its last hold on that side.
    Released,
    NotHeld,
    Renewed,
    ForceReleased,
    NoLock,
    /// Only [`expire`]: read holds past their lease were dropped, or nothing was due.
    Expired,
}

/// What a command does: its effects in order, its reply, and what the engine does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub effects: Vec<Effect>,
    pub reply: Reply,
    pub outcome: Outcome,
    /// Waiters may now be servable: the engine loops [`grant`] over its queue head.
    pub wake: bool,
    /// What Redisson would publish on [`channel`] for this change (for its pub/sub
    /// waiters); see [`message_after_grants`] for whether to send it.
    pub message: Option<&'static [u8]>,
    /// Read owners dropped because their lease ended (for the counters).
    pub dropped: u32,
    /// The state after the effects: the engine's next [`grant`] starts from it.
    pub state: RwState,
}

/// Builds a plan: every change goes through one method that both records the effect and
/// updates the state, so `Plan::state` is what the keys hold after `Plan::effects`.
struct Build<'a> {
    key: &'a [u8],
    s: RwState,
    effects: Vec<Effect>,
    wake: bool,
    message: Option<&'static [u8]>,
    dropped: u32,
}

impl Build<'_> {
    fn set_mode(&mut self, mode: Mode) {
        if self.s.mode != Some(mode) {
            self.effects.push(Effect::HSet(
                KeyRef::Main,
                MODE_FIELD.to_vec(),
                mode.as_bytes().to_vec(),
            ));
            self.s.mode = Some(mode);
        }
    }

    fn add_write(&mut self, owner: &[u8]) -> Result<(), &'static str> {
        let field = writer_field(owner);
        match &mut self.s.writer {
            Some(w) => {
                let next = w.count.checked_add(1).ok_or(ERR_COUNT_OVERFLOW)?;
                self.effects
                    .push(Effect::HIncrBy(KeyRef::Main, field, 1, next));
                w.count = next;
            }
            None => {
                self.effects
                    .push(Effect::HSet(KeyRef::Main, field, b"1".to_vec()));
                self.s.writer = Some(Writer {
                    owner: owner.to_vec(),
                    count: 1,
                });
            }
        }
        Ok(())
    }

    /// One write hold less; true when it was the last.
    fn pop_write(&mut self) -> bool {
        let Some(w) = &mut self.s.writer else {
            return false;
        };
        let field = writer_field(&w.owner);
        if w.count > 1 {
            w.count -= 1;
            self.effects
                .push(Effect::HIncrBy(KeyRef::Main, field, -1, w.count));
            false
        } else {
            self.effects.push(Effect::HDel(KeyRef::Main, field));
            self.s.writer = None;
            true
        }
    }

    /// One more read hold for `owner`, with its own timeout key.
    fn add_read(&mut self, owner: &[u8], end: i64) -> Result<(), &'static str> {
        let count = self.s.read_count(owner);
        if count >= MAX_READ_HOLDS {
            return Err(ERR_RW_TOO_MANY_HOLDS);
        }
        let n = count + 1;
        self.effects.push(if count == 0 {
            Effect::HSet(KeyRef::Main, owner.to_vec(), b"1".to_vec())
        } else {
            Effect::HIncrBy(KeyRef::Main, owner.to_vec(), 1, n)
        });
        let timeout = KeyRef::Aux(timeout_key(self.key, owner, n));
        self.effects
            .push(Effect::Set(timeout.clone(), b"1".to_vec()));
        self.effects.push(Effect::PExpireAt(timeout, end));
        self.s.readers.entry(owner.to_vec()).or_default().push(end);
        Ok(())
    }

    /// One read hold less (the newest, as Redisson's unlock deletes the top timeout key).
    fn pop_read(&mut self, owner: &[u8]) {
        let Some(ends) = self.s.readers.get_mut(owner) else {
            return;
        };
        let n = ends.len() as i64;
        ends.pop();
        if n > 1 {
            self.effects
                .push(Effect::HIncrBy(KeyRef::Main, owner.to_vec(), -1, n - 1));
        } else {
            self.effects
                .push(Effect::HDel(KeyRef::Main, owner.to_vec()));
            self.s.readers.remove(owner);
        }
        self.effects
            .push(Effect::Del(KeyRef::Aux(timeout_key(self.key, owner, n))));
    }

    /// Every read hold of `owner` goes, timeout keys included.
    fn drop_reader(&mut self, owner: &[u8]) {
        if let Some(ends) = self.s.readers.remove(owner) {
            self.effects
                .push(Effect::HDel(KeyRef::Main, owner.to_vec()));
            for n in 1..=ends.len() as i64 {
                self.effects
                    .push(Effect::Del(KeyRef::Aux(timeout_key(self.key, owner, n))));
            }
        }
    }

    /// Re-arms every read hold of `owner` to `end`. A hold whose key has already run out
    /// gets it back (Redisson's renewal PEXPIREs it, which does nothing on a missing key).
    fn renew_reads(&mut self, owner: &[u8], end: i64, now: i64) {
        let Some(ends) = self.s.readers.get_mut(owner) else {
            return;
        };
        for (i, e) in ends.iter_mut().enumerate() {
            let key = KeyRef::Aux(timeout_key(self.key, owner, i as i64 + 1));
            if *e <= now {
                self.effects.push(Effect::Set(key.clone(), b"1".to_vec()));
            }
            self.effects.push(Effect::PExpireAt(key, end));
            *e = end;
        }
    }

    fn set_expire(&mut self, at: i64) {
        if at != self.s.expire_at {
            self.effects.push(if at == NEVER {
                Effect::Persist(KeyRef::Main)
            } else {
                Effect::PExpireAt(KeyRef::Main, at)
            });
            self.s.expire_at = at;
        }
    }

    /// The hash lives as long as its longest hold: in read mode the longest read lease
    /// (Redisson's rule), in write mode the writer's lease (the current expiry), stretched
    /// to the writer's own read holds.
    fn fit_expiry(&mut self) {
        let reads = self.s.read_end();
        let at = match self.s.mode {
            Some(Mode::Read) => reads.unwrap_or(self.s.expire_at),
            Some(Mode::Write) => reads.map_or(self.s.expire_at, |r| r.max(self.s.expire_at)),
            None => return,
        };
        self.set_expire(at);
    }

    /// Deletes the lock (and any timeout keys still listed) and says who should hear.
    fn delete(&mut self, message: &'static [u8]) {
        let owners: Vec<Vec<u8>> = self.s.readers.keys().cloned().collect();
        for owner in owners {
            let count = self.s.read_count(&owner);
            for n in 1..=count {
                self.effects
                    .push(Effect::Del(KeyRef::Aux(timeout_key(self.key, &owner, n))));
            }
        }
        self.effects.push(Effect::Del(KeyRef::Main));
        self.s = RwState::free();
        self.freed(message);
    }

    fn freed(&mut self, message: &'static [u8]) {
        self.wake = true;
        self.message.get_or_insert(message);
    }

    fn finish(self, reply: Reply, outcome: Outcome) -> Plan {
        Plan {
            effects: self.effects,
            reply,
            outcome,
            wake: self.wake,
            message: self.message,
            dropped: self.dropped,
            state: self.s,
        }
    }
}

/// Starts every plan: drops what has run out at `now`. A hash past its expiry is gone
/// (Redis deletes it on the next access anyway); a read owner whose every timeout key has
/// run out loses its holds, even while other readers renew (SPEC 4.1). If that leaves a
/// read-mode lock without readers, the lock is freed as by the last reader's unlock.
fn normalize<'a>(state: &RwState, key: &'a [u8], now: i64) -> Build<'a> {
    let mut b = Build {
        key,
        s: state.clone(),
        effects: Vec::new(),
        wake: false,
        message: None,
        dropped: 0,
    };
    if !b.s.is_free() && b.s.expire_at <= now {
        b.delete(if b.s.mode == Some(Mode::Write) {
            READ_UNLOCK_MESSAGE
        } else {
            UNLOCK_MESSAGE
        });
        return b;
    }
    let expired: Vec<Vec<u8>> =
        b.s.readers
            .iter()
            .filter(|(_, ends)| lease_end(ends) <= now)
            .map(|(owner, _)| owner.clone())
            .collect();
    for owner in &expired {
        b.drop_reader(owner);
        b.dropped += 1;
    }
    if b.s.mode == Some(Mode::Read) && b.s.readers.is_empty() {
        b.delete(UNLOCK_MESSAGE);
    } else if !expired.is_empty() {
        b.fit_expiry();
    }
    b
}

/// The engine's timer (and its first step on a key with waiters): drop what ran out.
pub fn expire(state: &RwState, key: &[u8], now: i64) -> Plan {
    normalize(state, key, now).finish(Reply::Nil, Outcome::Expired)
}

/// `RRWLOCK.ACQUIRE key READ|WRITE owner lease-ms`: nil when acquired or re-entered, the
/// PTTL when held against the caller, an error when a reader asks for the write lock.
///
/// `queued` says whether anyone waits on the key: a newcomer then queues behind them
/// (re-entries still pass). The engine should run [`expire`] and serve its queue before
/// calling this on a key with waiters; if it did not and the lock turns out free, the
/// plan says `Contended` with `wake` set and reply 0 (retry at once), so the queue is
/// served first and FIFO holds either way.
pub fn acquire(
    state: &RwState,
    key: &[u8],
    side: Side,
    owner: &[u8],
    lease: i64,
    now: i64,
    queued: bool,
) -> Result<Plan, &'static str> {
    let mut b = normalize(state, key, now);
    let end = now.saturating_add(lease);
    let reentry = match side {
        Side::Write => b.s.is_writer(owner),
        Side::Read => b.s.read_count(owner) > 0,
    };
    if side == Side::Write && !reentry && b.s.read_count(owner) > 0 {
        return Err(ERR_RW_READ_HELD);
    }
    if b.s.is_free() && queued {
        b.wake = true;
        return Ok(b.finish(Reply::Int(0), Outcome::Contended));
    }
    let allowed = reentry
        || b.s.is_free()
        || match side {
            Side::Read => {
                (b.s.mode == Some(Mode::Read) && !queued)
                    || (b.s.mode == Some(Mode::Write) && b.s.is_writer(owner))
            }
            Side::Write => false,
        };
    if !allowed {
        let pttl = b.s.pttl(now);
        return Ok(b.finish(Reply::Int(pttl), Outcome::Contended));
    }
    let outcome = if reentry {
        Outcome::Reentered
    } else {
        Outcome::Acquired
    };
    match side {
        Side::Write => {
            b.set_mode(Mode::Write);
            b.add_write(owner)?;
            let at = b.s.read_end().map_or(end, |r| r.max(end));
            b.set_expire(at);
        }
        Side::Read => {
            if b.s.is_free() {
                b.set_mode(Mode::Read);
            }
            b.add_read(owner, end)?;
            b.fit_expiry();
        }
    }
    Ok(b.finish(Reply::Nil, outcome))
}

/// Only calls that changed the holds are remembered under a request id (as
/// `core::remembers`): re-running any other call is as good as replaying it.
pub fn remembers(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Acquired | Outcome::Reentered | Outcome::Decremented | Outcome::Released
    )
}

/// A queued request, as the engine keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub side: Side,
    pub owner: Vec<u8>,
    pub lease: i64,
}

/// The queue-head rule: can the head waiter be granted in this state, and with what plan?
/// `None`: not now, stop serving the queue. `Some(Err(..))`: answer that waiter with the
/// error (it started reading while it waited for the write lock) and go on to the next.
/// Looping this over the head grants consecutive readers together, and a writer at the
/// head holds back every reader behind it.
pub fn grant(
    state: &RwState,
    key: &[u8],
    request: &Request,
    now: i64,
) -> Option<Result<Plan, &'static str>> {
    match acquire(
        state,
        key,
        request.side,
        &request.owner,
        request.lease,
        now,
        false,
    ) {
        Ok(plan) if plan.outcome == Outcome::Contended => None,
        other => Some(other),
    }
}

/// Whether to publish a plan's message after the engine served its queue: not when a
/// queued writer now holds the lock (nobody else could take it: section 1.3's handoff);
/// otherwise yes, so Redisson's pub/sub waiters retry.
pub fn message_after_grants(
    plan_message: Option<&'static [u8]>,
    now_state: &RwState,
) -> Option<&'static [u8]> {
    plan_message.filter(|_| now_state.mode != Some(Mode::Write))
}

/// `RRWLOCK.RELEASE key READ|WRITE owner [lease-ms]`: 0 one hold less (a lease re-arms
/// the owner's remaining holds on that side), 1 the owner's last hold on that side went,
/// nil not held. Unlike Redisson's read unlock (which answers 0 while other readers hold
/// the lock), the reply is about the caller's holds, as for `RLOCK.RELEASE`.
pub fn release(
    state: &RwState,
    key: &[u8],
    side: Side,
    owner: &[u8],
    lease: Option<i64>,
    now: i64,
) -> Plan {
    let mut b = normalize(state, key, now);
    match side {
        Side::Read => {
            let count = b.s.read_count(owner);
            if count == 0 {
                return b.finish(Reply::Nil, Outcome::NotHeld);
            }
            b.pop_read(owner);
            if let Some(lease) = lease {
                b.renew_reads(owner, now.saturating_add(lease), now);
            }
            // The holds left may all have run out already (Redisson's re-entry arms only
            // the new hold's key): then the owner is gone, as at its lease end.
            let left = b.s.readers.get(owner).map(|ends| lease_end(ends));
            if left.is_some_and(|end| end > now) {
                b.fit_expiry();
                return b.finish(Reply::Int(0), Outcome::Decremented);
            }
            b.drop_reader(owner);
            if b.s.mode == Some(Mode::Read) && b.s.readers.is_empty() {
                b.delete(UNLOCK_MESSAGE);
            } else {
                b.fit_expiry();
            }
            b.finish(Reply::Int(1), Outcome::Released)
        }
        Side::Write => {
            if !b.s.is_writer(owner) {
                return b.finish(Reply::Nil, Outcome::NotHeld);
            }
            if !b.pop_write() {
                if let Some(lease) = lease {
                    let end = now.saturating_add(lease);
                    let at = b.s.read_end().map_or(end, |r| r.max(end));
                    b.set_expire(at);
                }
                return b.finish(Reply::Int(0), Outcome::Decremented);
            }
            if b.s.readers.is_empty() {
                b.delete(READ_UNLOCK_MESSAGE);
            } else {
                // The writer keeps its read holds: the lock becomes readable by all.
                // Redisson publishes nothing here; its readers would wait out their
                // timeout, so the message goes out (waking readers is its meaning).
                b.set_mode(Mode::Read);
                b.fit_expiry();
                b.freed(READ_UNLOCK_MESSAGE);
            }
            b.finish(Reply::Int(1), Outcome::Released)
        }
    }
}

/// `RRWLOCK.RENEW key READ|WRITE owner lease-ms`: 1 and every hold of the owner on that
/// side re-armed to `now + lease`, or 0 when it holds none.
pub fn renew(state: &RwState, key: &[u8], side: Side, owner: &[u8], lease: i64, now: i64) -> Plan {
    let mut b = normalize(state, key, now);
    let end = now.saturating_add(lease);
    match side {
        Side::Read if b.s.read_count(owner) > 0 => {
            b.renew_reads(owner, end, now);
            b.fit_expiry();
        }
        Side::Write if b.s.is_writer(owner) => {
            let at = b.s.read_end().map_or(end, |r| r.max(end));
            b.set_expire(at);
        }
        _ => return b.finish(Reply::Int(0), Outcome::NotHeld),
    }
    b.finish(Reply::Int(1), Outcome::Renewed)
}

/// `RRWLOCK.FORCERELEASE key [READ|WRITE]`: frees the lock whoever holds it; with a side,
/// only when the lock is in that mode (Redisson's readLock/writeLock forceUnlock). 1 freed,
/// 0 nothing to free. Timeout keys go too (Redisson leaves them to expire).
pub fn force_release(state: &RwState, key: &[u8], side: Option<Side>, now: i64) -> Plan {
    let mut b = normalize(state, key, now);
    let matches = match (b.s.mode, side) {
        (None, _) => false,
        (_, None) => true,
        (Some(Mode::Read), Some(side)) => side == Side::Read,
        (Some(Mode::Write), Some(side)) => side == Side::Write,
    };
    if !matches {
        return b.finish(Reply::Int(0), Outcome::NoLock);
    }
    b.delete(if side == Some(Side::Read) {
        UNLOCK_MESSAGE
    } else {
        READ_UNLOCK_MESSAGE
    });
    b.finish(Reply::Int(1), Outcome::ForceReleased)
}

/// `READ` or `WRITE`, any case.
pub fn parse_side(arg: &[u8]) -> Result<Side, &'static str> {
    if arg.eq_ignore_ascii_case(b"READ") {
        Ok(Side::Read)
    } else if arg.eq_ignore_ascii_case(b"WRITE") {
        Ok(Side::Write)
    } else {
        Err(ERR_RW_SIDE)
    }
}

/// A read-write lock owner must not look like a writer's field.
fn check_owner(owner: &[u8]) -> Result<(), &'static str> {
    if owner.ends_with(WRITE_SUFFIX) {
        Err(ERR_RW_OWNER_SUFFIX)
    } else {
        Ok(())
    }
}

/// Parses `READ|WRITE owner lease-ms [WAIT timeout-ms] [ID request-id]` (after the key).
pub fn parse_rw_acquire<'a>(args: &[&'a [u8]]) -> Result<(Side, AcquireArgs<'a>), &'static str> {
    if args.len() < 3 {
        return Err(ERR_SYNTAX);
    }
    let side = parse_side(args[0])?;
    let parsed = parse_acquire(&args[1..])?;
    check_owner(parsed.owner)?;
    Ok((side, parsed))
}

/// Parses `READ|WRITE owner [lease-ms] [ID request-id]`.
pub fn parse_rw_release<'a>(args: &[&'a [u8]]) -> Result<(Side, ReleaseArgs<'a>), &'static str> {
    if args.len() < 2 {
        return Err(ERR_SYNTAX);
    }
    let side = parse_side(args[0])?;
    let parsed = parse_release(&args[1..])?;
    check_owner(parsed.owner)?;
    Ok((side, parsed))
}

/// Parses `READ|WRITE owner lease-ms`.
pub fn parse_rw_renew<'a>(args: &[&'a [u8]]) -> Result<(Side, &'a [u8], i64), &'static str> {
    if args.len() != 3 {
        return Err(ERR_SYNTAX);
    }
    let side = parse_side(args[0])?;
    let (owner, lease) = parse_renew(&args[1..])?;
    check_owner(owner)?;
    Ok((side, owner, lease))
}

/// Parses the optional `READ|WRITE` of `RRWLOCK.FORCERELEASE key`.
pub fn parse_rw_force(args: &[&[u8]]) -> Result<Option<Side>, &'static str> {
    match args {
        [] => Ok(None),
        [side] => parse_side(side).map(Some),
        _ => Err(ERR_SYNTAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::ERR_NOT_A_RWLOCK;

    const NOW: i64 = 1_700_000_000_000;
    const K: &[u8] = b"rw";

    fn tk(owner: &str, n: i64) -> KeyRef {
        KeyRef::Aux(timeout_key(K, owner.as_bytes(), n))
    }
    fn main_hset(field: &str, value: &str) -> Effect {
        Effect::HSet(KeyRef::Main, field.into(), value.into())
    }
    fn incr(field: &str, delta: i64, result: i64) -> Effect {
        Effect::HIncrBy(KeyRef::Main, field.into(), delta, result)
    }
    fn hdel(field: &str) -> Effect {
        Effect::HDel(KeyRef::Main, field.into())
    }
    fn expire_main(at: i64) -> Effect {
        Effect::PExpireAt(KeyRef::Main, at)
    }

    /// A read-mode lock: (owner, ends relative to NOW), hash expiry relative to NOW.
    fn reading(readers: &[(&str, &[i64])], expire_in: i64) -> RwState {
        RwState {
            mode: Some(Mode::Read),
            writer: None,
            readers: readers
                .iter()
                .map(|(o, ends)| {
                    (
                        o.as_bytes().to_vec(),
                        ends.iter().map(|e| NOW + e).collect(),
                    )
                })
                .collect(),
            expire_at: NOW + expire_in,
        }
    }

    fn writing(owner: &str, count: i64, reads: &[i64], expire_in: i64) -> RwState {
        let mut s = reading(&[], expire_in);
        s.mode = Some(Mode::Write);
        s.writer = Some(Writer {
            owner: owner.into(),
            count,
        });
        if !reads.is_empty() {
            s.readers
                .insert(owner.into(), reads.iter().map(|e| NOW + e).collect());
        }
        s
    }

    fn acq(s: &RwState, side: Side, owner: &str, lease: i64, queued: bool) -> Plan {
        acquire(s, K, side, owner.as_bytes(), lease, NOW, queued).unwrap()
    }

    #[test]
    fn acquire_table() {
        use Outcome::*;
        use Side::*;
        // (name, state, side, owner, queued, reply, outcome, effects)
        type Row<'a> = (
            &'a str,
            RwState,
            Side,
            &'a str,
            bool,
            Reply,
            Outcome,
            Vec<Effect>,
        );
        let rows: Vec<Row> = vec![
            (
                "it_creates_a_read_lock_with_its_timeout_key",
                RwState::free(),
                Read,
                "a",
                false,
                Reply::Nil,
                Acquired,
                vec![
                    main_hset("mode", "read"),
                    main_hset("a", "1"),
                    Effect::Set(tk("a", 1), b"1".to_vec()),
                    Effect::PExpireAt(tk("a", 1), NOW + 100),
                    expire_main(NOW + 100),
                ],
            ),
            (
                "it_creates_a_write_lock",
                RwState::free(),
                Write,
                "w",
                false,
                Reply::Nil,
                Acquired,
                vec![
                    main_hset("mode", "write"),
                    main_hset("w:write", "1"),
                    expire_main(NOW + 100),
                ],
            ),
            (
                "a_second_reader_joins_and_the_hash_lives_as_long_as_the_longest_lease",
                reading(&[("a", &[50])], 50),
                Read,
                "b",
                false,
                Reply::Nil,
                Acquired,
                vec![
                    main_hset("b", "1"),
                    Effect::Set(tk("b", 1), b"1".to_vec()),
                    Effect::PExpireAt(tk("b", 1), NOW + 100),
                    expire_main(NOW + 100),
                ],
            ),
            (
                "a_reader_reenters_with_a_new_timeout_key_and_the_hash_keeps_a_longer_lease",
                reading(&[("a", &[500])], 500),
                Read,
                "a",
                true,
                Reply::Nil,
                Reentered,
                vec![
                    incr("a", 1, 2),
                    Effect::Set(tk("a", 2), b"1".to_vec()),
                    Effect::PExpireAt(tk("a", 2), NOW + 100),
                ],
            ),
            (
                "a_new_reader_queues_behind_a_waiting_writer",
                reading(&[("a", &[500])], 500),
                Read,
                "b",
                true,
                Reply::Int(500),
                Contended,
                vec![],
            ),
            (
                "a_writer_is_kept_out_by_readers",
                reading(&[("a", &[500])], 500),
                Write,
                "w",
                false,
                Reply::Int(500),
                Contended,
                vec![],
            ),
            (
                "a_reader_is_kept_out_by_a_writer",
                writing("w", 1, &[], 300),
                Read,
                "a",
                false,
                Reply::Int(300),
                Contended,
                vec![],
            ),
            (
                "the_writer_reenters_and_its_lease_is_rearmed",
                writing("w", 1, &[], 300),
                Write,
                "w",
                true,
                Reply::Nil,
                Reentered,
                vec![incr("w:write", 1, 2), expire_main(NOW + 100)],
            ),
            (
                "the_writer_may_read_and_the_hash_covers_both_leases",
                writing("w", 1, &[], 50),
                Read,
                "w",
                false,
                Reply::Nil,
                Acquired,
                vec![
                    main_hset("w", "1"),
                    Effect::Set(tk("w", 1), b"1".to_vec()),
                    Effect::PExpireAt(tk("w", 1), NOW + 100),
                    expire_main(NOW + 100),
                ],
            ),
            (
                "readers_past_their_lease_are_dropped_before_the_writer_is_considered",
                reading(&[("dead", &[-1]), ("b", &[0])], 200),
                Write,
                "w",
                false,
                Reply::Nil,
                Acquired,
                vec![
                    hdel("b"),
                    Effect::Del(tk("b", 1)),
                    hdel("dead"),
                    Effect::Del(tk("dead", 1)),
                    Effect::Del(KeyRef::Main),
                    main_hset("mode", "write"),
                    main_hset("w:write", "1"),
                    expire_main(NOW + 100),
                ],
            ),
            (
                "a_lock_that_nobody_holds_is_not_refused_to_a_newcomer_without_queue",
                RwState::free(),
                Read,
                "b",
                false,
                Reply::Nil,
                Acquired,
                vec![
                    main_hset("mode", "read"),
                    main_hset("b", "1"),
                    Effect::Set(tk("b", 1), b"1".to_vec()),
                    Effect::PExpireAt(tk("b", 1), NOW + 100),
                    expire_main(NOW + 100),
                ],
            ),
            (
                "a_free_lock_with_a_queue_sends_the_caller_behind_it_and_wakes_the_queue",
                RwState::free(),
                Write,
                "b",
                true,
                Reply::Int(0),
                Contended,
                vec![],
            ),
        ];
        for (name, state, side, owner, queued, reply, outcome, effects) in rows {
            let plan = acq(&state, side, owner, 100, queued);
            assert_eq!(
                (plan.reply, plan.outcome, &plan.effects),
                (reply, outcome, &effects),
                "{name}"
            );
        }
    }

    #[test]
    fn it_refuses_a_reader_asking_for_the_write_lock_at_once() {
        let s = reading(&[("a", &[500]), ("b", &[500])], 500);
        assert_eq!(
            acquire(&s, K, Side::Write, b"a", 100, NOW, false),
            Err(ERR_RW_READ_HELD)
        );
        // ...also from the queue head, where the engine answers it and moves on.
        let req = Request {
            side: Side::Write,
            owner: b"a".to_vec(),
            lease: 100,
        };
        assert_eq!(grant(&s, K, &req, NOW), Some(Err(ERR_RW_READ_HELD)));
    }

    #[test]
    fn it_bounds_read_reentries_and_write_counts() {
        let ends: Vec<i64> = vec![500; MAX_READ_HOLDS as usize];
        let s = reading(&[("a", &ends)], 500);
        assert_eq!(
            acquire(&s, K, Side::Read, b"a", 100, NOW, false),
            Err(ERR_RW_TOO_MANY_HOLDS)
        );
        let s = writing("w", i64::MAX, &[], 500);
        assert_eq!(
            acquire(&s, K, Side::Write, b"w", 100, NOW, false),
            Err(ERR_COUNT_OVERFLOW)
        );
    }

    #[test]
    fn release_table() {
        use Outcome::*;
        use Side::*;
        // (name, state, side, owner, lease, reply, outcome, effects, wake, message)
        type Row<'a> = (
            &'a str,
            RwState,
            Side,
            &'a str,
            Option<i64>,
            Reply,
            Outcome,
            Vec<Effect>,
            bool,
            Option<&'static [u8]>,
        );
        let rows: Vec<Row> = vec![
            (
                "a_reader_counts_down_and_its_newest_timeout_key_goes",
                reading(&[("a", &[300, 100])], 300),
                Read,
                "a",
                None,
                Reply::Int(0),
                Decremented,
                vec![incr("a", -1, 1), Effect::Del(tk("a", 2))],
                false,
                None,
            ),
            (
                "a_reader_leaving_others_shrinks_the_hash_to_their_longest_lease",
                reading(&[("a", &[900]), ("b", &[200])], 900),
                Read,
                "a",
                None,
                Reply::Int(1),
                Released,
                vec![hdel("a"), Effect::Del(tk("a", 1)), expire_main(NOW + 200)],
                false,
                None,
            ),
            (
                "the_last_reader_frees_the_lock_with_message_0",
                reading(&[("a", &[900])], 900),
                Read,
                "a",
                Some(50),
                Reply::Int(1),
                Released,
                vec![
                    hdel("a"),
                    Effect::Del(tk("a", 1)),
                    Effect::Del(KeyRef::Main),
                ],
                true,
                Some(UNLOCK_MESSAGE),
            ),
            (
                "a_reader_whose_older_holds_ran_out_is_gone_with_its_newest",
                reading(&[("a", &[-5, 300]), ("b", &[200])], 300),
                Read,
                "a",
                None,
                Reply::Int(1),
                Released,
                vec![
                    incr("a", -1, 1),
                    Effect::Del(tk("a", 2)),
                    hdel("a"),
                    Effect::Del(tk("a", 1)),
                    expire_main(NOW + 200),
                ],
                false,
                None,
            ),
            (
                "a_non_reader_changes_nothing",
                reading(&[("a", &[900])], 900),
                Read,
                "b",
                None,
                Reply::Nil,
                NotHeld,
                vec![],
                false,
                None,
            ),
            (
                "the_writer_counts_down_and_a_lease_rearms_it",
                writing("w", 2, &[], 300),
                Write,
                "w",
                Some(50),
                Reply::Int(0),
                Decremented,
                vec![incr("w:write", -1, 1), expire_main(NOW + 50)],
                false,
                None,
            ),
            (
                "the_writer_leaves_with_message_1",
                writing("w", 1, &[], 300),
                Write,
                "w",
                None,
                Reply::Int(1),
                Released,
                vec![hdel("w:write"), Effect::Del(KeyRef::Main)],
                true,
                Some(READ_UNLOCK_MESSAGE),
            ),
            (
                "the_writer_leaves_its_reads_behind_in_read_mode_and_wakes_readers",
                writing("w", 1, &[80], 300),
                Write,
                "w",
                None,
                Reply::Int(1),
                Released,
                vec![
                    hdel("w:write"),
                    main_hset("mode", "read"),
                    expire_main(NOW + 80),
                ],
                true,
                Some(READ_UNLOCK_MESSAGE),
            ),
            (
                "the_writer_drops_a_read_and_keeps_the_write_lock",
                writing("w", 1, &[80], 300),
                Read,
                "w",
                None,
                Reply::Int(1),
                Released,
                vec![hdel("w"), Effect::Del(tk("w", 1))],
                false,
                None,
            ),
            (
                "a_reader_cannot_release_the_write_side",
                reading(&[("a", &[900])], 900),
                Write,
                "a",
                None,
                Reply::Nil,
                NotHeld,
                vec![],
                false,
                None,
            ),
        ];
        for (name, state, side, owner, lease, reply, outcome, effects, wake, message) in rows {
            let plan = release(&state, K, side, owner.as_bytes(), lease, NOW);
            assert_eq!(
                (
                    plan.reply,
                    plan.outcome,
                    &plan.effects,
                    plan.wake,
                    plan.message
                ),
                (reply, outcome, &effects, wake, message),
                "{name}"
            );
        }
    }

    #[test]
    fn renew_rearms_every_hold_of_the_owner_on_its_side() {
        let s = reading(&[("a", &[10, 20]), ("b", &[900])], 900);
        let plan = renew(&s, K, Side::Read, b"a", 1000, NOW);
        assert_eq!(plan.reply, Reply::Int(1));
        assert_eq!(
            plan.effects,
            vec![
                Effect::PExpireAt(tk("a", 1), NOW + 1000),
                Effect::PExpireAt(tk("a", 2), NOW + 1000),
                expire_main(NOW + 1000),
            ]
        );
        // A hold whose key already ran out (the owner lives on its other hold) gets its
        // key back.
        let s2 = reading(&[("a", &[-10, 20])], 20);
        assert_eq!(
            renew(&s2, K, Side::Read, b"a", 1000, NOW).effects,
            vec![
                Effect::Set(tk("a", 1), b"1".to_vec()),
                Effect::PExpireAt(tk("a", 1), NOW + 1000),
                Effect::PExpireAt(tk("a", 2), NOW + 1000),
                expire_main(NOW + 1000),
            ]
        );
        assert_eq!(
            renew(&s, K, Side::Write, b"a", 1000, NOW).reply,
            Reply::Int(0)
        );
        assert_eq!(
            renew(&s, K, Side::Read, b"c", 1000, NOW).reply,
            Reply::Int(0)
        );
        let w = writing("w", 1, &[], 300);
        let plan = renew(&w, K, Side::Write, b"w", 1000, NOW);
        assert_eq!(
            (plan.reply, plan.effects),
            (Reply::Int(1), vec![expire_main(NOW + 1000)])
        );
    }

    #[test]
    fn force_release_frees_any_mode_or_only_its_own() {
        let r = reading(&[("a", &[900])], 900);
        let w = writing("w", 3, &[], 300);
        assert_eq!(
            force_release(&r, K, Some(Side::Write), NOW).reply,
            Reply::Int(0)
        );
        assert_eq!(
            force_release(&w, K, Some(Side::Read), NOW).reply,
            Reply::Int(0)
        );
        let plan = force_release(&r, K, Some(Side::Read), NOW);
        assert_eq!(
            (plan.reply, plan.effects, plan.message, plan.state.is_free()),
            (
                Reply::Int(1),
                vec![Effect::Del(tk("a", 1)), Effect::Del(KeyRef::Main)],
                Some(UNLOCK_MESSAGE),
                true
            )
        );
        let plan = force_release(&w, K, None, NOW);
        assert_eq!(
            (plan.reply, plan.message),
            (Reply::Int(1), Some(READ_UNLOCK_MESSAGE))
        );
        assert_eq!(
            force_release(&RwState::free(), K, None, NOW).outcome,
            Outcome::NoLock
        );
    }

    #[test]
    fn each_read_hold_ends_at_its_own_lease_while_others_renew() {
        // "dead" stopped renewing at NOW-1; "live" renewed to NOW+900.
        let s = reading(&[("dead", &[-1, -5]), ("live", &[900])], 900);
        let plan = expire(&s, K, NOW);
        assert_eq!(plan.dropped, 1);
        assert_eq!(
            plan.effects,
            vec![
                hdel("dead"),
                Effect::Del(tk("dead", 1)),
                Effect::Del(tk("dead", 2))
            ]
        );
        assert!(!plan.wake, "a reader remains: nobody new can be served");
        // One live hold of an owner keeps it: its lease is its longest hold's.
        let s = reading(&[("a", &[-1, 400])], 400);
        assert_eq!(expire(&s, K, NOW).effects, vec![]);
        // The last reader's lease ends: the lock is freed as by its unlock.
        let s = reading(&[("a", &[0])], 900);
        let plan = expire(&s, K, NOW);
        assert_eq!(
            (plan.wake, plan.message, plan.state),
            (true, Some(UNLOCK_MESSAGE), RwState::free())
        );
        // The writer's own reads end too, the write lock stays.
        let s = writing("w", 1, &[-3], 500);
        let plan = expire(&s, K, NOW);
        assert_eq!(plan.state, writing("w", 1, &[], 500));
        assert!(!plan.wake);
    }

    #[test]
    fn next_deadline_is_the_earliest_lease_end() {
        let s = reading(&[("a", &[40, 70]), ("b", &[20])], 900);
        assert_eq!(s.next_deadline(), Some(NOW + 20));
        assert_eq!(writing("w", 1, &[], 300).next_deadline(), Some(NOW + 300));
        assert_eq!(RwState::free().next_deadline(), None);
        let mut forever = writing("w", 1, &[], 0);
        forever.expire_at = NEVER;
        assert_eq!(forever.next_deadline(), None);
    }

    #[test]
    fn grant_serves_consecutive_readers_and_stops_at_a_writer() {
        let req = |side, owner: &str| Request {
            side,
            owner: owner.into(),
            lease: 100,
        };
        let queue = [
            req(Side::Read, "r1"),
            req(Side::Read, "r2"),
            req(Side::Write, "w"),
            req(Side::Read, "r3"),
        ];
        let mut state = RwState::free();
        let mut served = vec![];
        for r in &queue {
            match grant(&state, K, r, NOW) {
                Some(Ok(plan)) => {
                    state = plan.state;
                    served.push(r.owner.clone());
                }
                _ => break,
            }
        }
        assert_eq!(served, vec![b"r1".to_vec(), b"r2".to_vec()]);
        // A writer at the head of a write-held lock waits, and so does a reader.
        let w = writing("x", 1, &[], 300);
        assert!(grant(&w, K, &queue[2], NOW).is_none());
        assert!(grant(&w, K, &queue[0], NOW).is_none());
    }

    #[test]
    fn the_message_is_held_back_when_a_writer_took_the_lock() {
        let w = writing("x", 1, &[], 300);
        let r = reading(&[("a", &[900])], 900);
        assert_eq!(message_after_grants(Some(READ_UNLOCK_MESSAGE), &w), None);
        assert_eq!(
            message_after_grants(Some(READ_UNLOCK_MESSAGE), &r),
            Some(READ_UNLOCK_MESSAGE)
        );
        assert_eq!(
            message_after_grants(Some(UNLOCK_MESSAGE), &RwState::free()),
            Some(UNLOCK_MESSAGE)
        );
        assert_eq!(message_after_grants(None, &r), None);
    }

    #[test]
    fn parse_hash_table() {
        let p = |v: &[(&str, &str)]| {
            parse_hash(v.iter().map(|(f, v)| (f.as_bytes().to_vec(), v.as_bytes())))
        };
        let view = p(&[("mode", "write"), ("w:write", "2"), ("w", "1")]).unwrap();
        assert_eq!(view.mode, Mode::Write);
        assert_eq!(
            view.writer,
            Some(Writer {
                owner: b"w".to_vec(),
                count: 2
            })
        );
        assert_eq!(view.readers, vec![(b"w".to_vec(), 1)]);
        assert_eq!(
            view.timeout_keys(b"rw"),
            vec![b"{rw}:w:rwlock_timeout:1".to_vec()]
        );
        assert!(
            p(&[("mode", "read")]).is_ok(),
            "a leftover mode field: freed on sight"
        );
        for (bad, err) in [
            (&[("a", "1")][..], ERR_NOT_A_RWLOCK),
            (&[("mode", "READ"), ("a", "1")], ERR_NOT_A_RWLOCK),
            (&[("mode", "read"), ("a", "0")], ERR_NOT_A_RWLOCK),
            (&[("mode", "read"), ("a", "x")], ERR_NOT_A_RWLOCK),
            (&[("mode", "read"), ("a:write", "1")], ERR_NOT_A_RWLOCK),
            (&[("mode", "write"), ("a", "1")], ERR_NOT_A_RWLOCK),
            (
                &[("mode", "write"), ("a:write", "1"), ("b:write", "1")],
                ERR_NOT_A_RWLOCK,
            ),
            (&[("mode", "read"), ("a", "1025")], ERR_RW_TOO_MANY_HOLDS),
        ] {
            assert_eq!(p(bad), Err(err), "{bad:?}");
        }
    }

    #[test]
    fn into_state_reads_ttls_as_absolute_times() {
        let view = parse_hash([
            (b"mode".to_vec(), &b"read"[..]),
            (b"a".to_vec(), b"2"),
            (b"b".to_vec(), b"1"),
        ])
        .unwrap();
        let state = view.into_state(500, &[100, -2, -1], NOW);
        assert_eq!(state.expire_at, NOW + 500);
        assert_eq!(state.readers[&b"a".to_vec()], vec![NOW + 100, GONE]);
        assert_eq!(state.readers[&b"b".to_vec()], vec![NEVER]);
        assert_eq!(pttl_to_at(-1, NOW), NEVER);
        assert_eq!(pttl_to_at(0, NOW), NOW);
    }

    #[test]
    fn read_holds_report_counts_and_remaining_leases() {
        let mut s = reading(&[("a", &[10, 40]), ("b", &[5])], 40);
        s.readers.insert(b"c".to_vec(), vec![NEVER]);
        assert_eq!(
            s.read_holds(NOW),
            vec![(&b"a"[..], 2, 40), (&b"b"[..], 1, 5), (&b"c"[..], 1, -1)]
        );
    }

    #[test]
    fn only_changes_of_holds_are_remembered_under_a_request_id() {
        assert!(remembers(Outcome::Acquired) && remembers(Outcome::Released));
        assert!(!remembers(Outcome::Contended) && !remembers(Outcome::NotHeld));
        assert!(!remembers(Outcome::Expired) && !remembers(Outcome::Renewed));
    }

    #[test]
    fn parsers_table() {
        let a = |v: &[&'static str]| {
            parse_rw_acquire(&v.iter().map(|s| s.as_bytes()).collect::<Vec<_>>())
        };
        let (side, args) = a(&["read", "o", "100", "WAIT", "0"]).unwrap();
        assert_eq!(
            (side, args.owner, args.lease, args.wait),
            (Side::Read, &b"o"[..], 100, Some(0))
        );
        assert_eq!(a(&["WRITE", "o", "5"]).unwrap().0, Side::Write);
        assert_eq!(a(&["both", "o", "5"]).unwrap_err(), ERR_RW_SIDE);
        assert_eq!(
            a(&["READ", "o:write", "5"]).unwrap_err(),
            ERR_RW_OWNER_SUFFIX
        );
        assert_eq!(a(&["READ", "o"]).unwrap_err(), ERR_SYNTAX);
        assert_eq!(
            a(&["READ", "o", "0"]).unwrap_err(),
            crate::errors::ERR_LEASE
        );
        let r = |v: &[&'static str]| {
            parse_rw_release(&v.iter().map(|s| s.as_bytes()).collect::<Vec<_>>())
        };
        assert_eq!(r(&["write", "o", "10"]).unwrap().1.lease, Some(10));
        assert_eq!(r(&["write"]).unwrap_err(), ERR_SYNTAX);
        assert_eq!(
            parse_rw_renew(&[b"READ", b"o", b"10"]),
            Ok((Side::Read, &b"o"[..], 10))
        );
        assert_eq!(parse_rw_renew(&[b"READ", b"o"]), Err(ERR_SYNTAX));
        assert_eq!(parse_rw_force(&[]), Ok(None));
        assert_eq!(parse_rw_force(&[b"write"]), Ok(Some(Side::Write)));
        assert_eq!(parse_rw_force(&[b"x"]), Err(ERR_RW_SIDE));
        assert_eq!(parse_rw_force(&[b"READ", b"x"]), Err(ERR_SYNTAX));
        assert_eq!(
            channel(b"rw"),
            b"redisson_rwlock:{rw}".to_vec(),
            "Redisson's channel"
        );
    }
}

/// Property tests: random operation sequences against a simulated keyspace (a hash and
/// string keys with expiries, as Redis keeps them) and a simulated waiting engine (a FIFO
/// queue served with [`grant`]), checked against SPEC 4.1 and an independent lease model.
#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    const K: &[u8] = b"rw";

    #[derive(Debug, Clone)]
    enum Val {
        Hash(BTreeMap<Vec<u8>, Vec<u8>>),
        Str,
    }

    /// Redis as far as the effects go: values and absolute expiries; a key is gone at
    /// its expiry (the core must not rely on Redis's sampling for read holds).
    #[derive(Debug, Default)]
    struct Store {
        vals: BTreeMap<KeyRef, Val>,
        expiry: BTreeMap<KeyRef, i64>,
    }

    impl Store {
        fn expire(&mut self, now: i64) {
            let due: Vec<KeyRef> = self
                .expiry
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(k, _)| k.clone())
                .collect();
            for k in due {
                self.vals.remove(&k);
                self.expiry.remove(&k);
            }
        }

        fn hash(&mut self, k: &KeyRef) -> &mut BTreeMap<Vec<u8>, Vec<u8>> {
            match self
                .vals
                .entry(k.clone())
                .or_insert_with(|| Val::Hash(BTreeMap::new()))
            {
                Val::Hash(h) => h,
                Val::Str => panic!("hash effect on a string key {k:?}"),
            }
        }

        fn apply(&mut self, effects: &[Effect], now: i64) {
            for e in effects {
                match e {
                    Effect::Del(k) => {
                        self.vals.remove(k);
                        self.expiry.remove(k);
                    }
                    Effect::HSet(k, f, v) => {
                        self.hash(k).insert(f.clone(), v.clone());
                    }
                    Effect::HIncrBy(k, f, delta, result) => {
                        let h = self.hash(k);
                        let cur = h.get(f).map_or(0, |v| parse_i64(v).unwrap());
                        assert_eq!(cur + delta, *result, "HINCRBY's stated result");
                        h.insert(f.clone(), result.to_string().into_bytes());
                    }
                    Effect::HDel(k, f) => {
                        let h = self.hash(k);
                        h.remove(f);
                        if h.is_empty() {
                            self.vals.remove(k);
                            self.expiry.remove(k);
                        }
                    }
                    Effect::Set(k, _) => {
                        self.vals.insert(k.clone(), Val::Str);
                        self.expiry.remove(k);
                    }
                    Effect::PExpireAt(k, at) => {
                        if self.vals.contains_key(k) {
                            self.expiry.insert(k.clone(), *at);
                        }
                    }
                    Effect::Persist(k) => {
                        self.expiry.remove(k);
                    }
                    Effect::IncrBy(..) | Effect::ZAdd(..) | Effect::ZRem(..) => {
                        panic!("the read-write lock writes no counters or sorted sets: {e:?}")
                    }
                }
            }
            self.expire(now);
        }

        fn pttl(&self, k: &KeyRef, now: i64) -> i64 {
            match (self.vals.contains_key(k), self.expiry.get(k)) {
                (false, _) => -2,
                (true, None) => -1,
                (true, Some(at)) => at - now,
            }
        }

        /// What the glue will do: HGETALL, PTTL, then PTTL of each timeout key.
        fn state(&mut self, now: i64) -> RwState {
            self.expire(now);
            let fields = match self.vals.get(&KeyRef::Main) {
                None => return RwState::free(),
                Some(Val::Hash(h)) => h.clone(),
                Some(Val::Str) => panic!("main key became a string"),
            };
            let view = parse_hash(fields).expect("the core only writes valid locks");
            let pttls: Vec<i64> = view
                .timeout_keys(K)
                .into_iter()
                .map(|k| self.pttl(&KeyRef::Aux(k), now))
                .collect();
            let pttl = self.pttl(&KeyRef::Main, now);
            view.into_state(pttl, &pttls, now)
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(Side, u8, i64, bool),
        Release(Side, u8, Option<i64>),
        Renew(Side, u8, i64),
        Force(Option<Side>),
        /// A queued waiter times out or disconnects.
        Cancel(usize),
        Tick(i64),
    }

    fn side() -> impl Strategy<Value = Side> {
        prop_oneof![Just(Side::Read), Just(Side::Write)]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (side(), 0..5u8, 1..200i64, any::<bool>()).prop_map(|(s, o, l, w)| Op::Acquire(s, o, l, w)),
            3 => (side(), 0..5u8, proptest::option::of(1..200i64)).prop_map(|(s, o, l)| Op::Release(s, o, l)),
            2 => (side(), 0..5u8, 1..200i64).prop_map(|(s, o, l)| Op::Renew(s, o, l)),
            1 => proptest::option::of(side()).prop_map(Op::Force),
            1 => (0..4usize).prop_map(Op::Cancel),
            3 => (1..120i64).prop_map(Op::Tick),
        ]
    }

    fn owner(o: u8) -> Vec<u8> {
        vec![b'o', b'0' + o]
    }

    /// The lease model, kept apart from the core: each owner's read hold ends, pushed on
    /// acquire, the newest popped on release, all re-armed on renew, and the owner gone
    /// when its longest hold has ended, whatever the others do.
    #[derive(Debug, Default)]
    struct Leases(BTreeMap<Vec<u8>, Vec<i64>>);

    impl Leases {
        fn tick(&mut self, now: i64) {
            self.0
                .retain(|_, ends| ends.iter().max().is_some_and(|e| *e > now));
            // A hold past its end has lost its timeout key: the keys say GONE for it.
            for e in self.0.values_mut().flatten() {
                if *e <= now {
                    *e = GONE;
                }
            }
        }
    }

    struct World {
        store: Store,
        /// Waiters with their arrival number.
        queue: VecDeque<(u64, Request)>,
        leases: Leases,
        now: i64,
        /// Arrival numbers of the waiters served, in serving order.
        granted: Vec<u64>,
    }

    impl World {
        fn state(&mut self) -> RwState {
            self.store.state(self.now)
        }

        fn apply(&mut self, plan: &Plan) -> Result<(), TestCaseError> {
            self.store.apply(&plan.effects, self.now);
            let read_back = self.state();
            prop_assert_eq!(&read_back, &plan.state, "the keys hold what the plan says");
            self.leases.tick(self.now);
            let model: BTreeMap<Vec<u8>, Vec<i64>> = self.leases.0.clone();
            prop_assert_eq!(
                &read_back.readers,
                &model,
                "each read hold ends at its own lease"
            );
            check(&read_back, self.now)
        }

        fn track(&mut self, side: Side, owner: &[u8], lease: i64, plan: &Plan) {
            if side == Side::Read && matches!(plan.outcome, Outcome::Acquired | Outcome::Reentered)
            {
                self.leases
                    .0
                    .entry(owner.to_vec())
                    .or_default()
                    .push(self.now + lease);
            }
        }

        /// The engine: serve the head while it can be granted.
        fn serve(&mut self) -> Result<(), TestCaseError> {
            while let Some((arrival, head)) = self.queue.front().cloned() {
                let state = self.state();
                match grant(&state, K, &head, self.now) {
                    None => {
                        // A head that waits is excluded for real: readers wait only on a
                        // writer, a writer on anyone else.
                        match head.side {
                            Side::Read => prop_assert!(
                                state.mode == Some(Mode::Write) && !state.is_writer(&head.owner)
                            ),
                            Side::Write => {
                                prop_assert!(!state.is_free() && !state.is_writer(&head.owner))
                            }
                        }
                        break;
                    }
                    Some(Ok(plan)) => {
                        self.queue.pop_front();
                        self.track(head.side, &head.owner, head.lease, &plan);
                        self.apply(&plan)?;
                        self.granted.push(arrival);
                    }
                    Some(Err(e)) => {
                        prop_assert_eq!(e, ERR_RW_READ_HELD);
                        self.queue.pop_front();
                    }
                }
            }
            let state = self.state();
            prop_assert!(
                !state.is_free() || self.queue.is_empty(),
                "a free lock has no waiters"
            );
            Ok(())
        }

        /// Before a command on a key with waiters, and on the timer: drop what ran out.
        fn expire(&mut self) -> Result<(), TestCaseError> {
            let state = self.state();
            let plan = expire(&state, K, self.now);
            self.apply(&plan)?;
            // A hash that Redis expired (or anything else deleted) frees the lock too: the
            // engine hears of it from the keyspace event and serves the queue (SPEC 1.3).
            if plan.wake || plan.state.is_free() {
                self.serve()?;
            }
            Ok(())
        }
    }

    /// Never a writer with anyone else; the hash lives exactly as long as its longest
    /// read lease in read mode; nothing past its lease is left.
    fn check(s: &RwState, now: i64) -> Result<(), TestCaseError> {
        match s.mode {
            None => prop_assert!(s.writer.is_none() && s.readers.is_empty()),
            Some(Mode::Write) => {
                let w = s.writer.as_ref().expect("write mode has a writer");
                prop_assert!(
                    s.readers.keys().all(|o| *o == w.owner),
                    "a writer with other readers"
                );
                prop_assert!(s.expire_at > now);
            }
            Some(Mode::Read) => {
                prop_assert!(s.writer.is_none());
                prop_assert!(!s.readers.is_empty());
                prop_assert_eq!(Some(s.expire_at), s.read_end());
            }
        }
        for ends in s.readers.values() {
            prop_assert!(lease_end(ends) > now);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn the_rw_core_keeps_its_invariants_fifo_and_per_hold_leases(ops in proptest::collection::vec(op(), 1..80)) {
            let mut w = World {
                store: Store::default(),
                queue: VecDeque::new(),
                leases: Leases::default(),
                now: 1_000_000,
                granted: vec![],
            };
            let mut arrivals = 0u64;
            for op in ops {
                // Owners blocked in the queue send nothing until they are served.
                let busy = |o: u8, w: &World| w.queue.iter().any(|(_, r)| r.owner == owner(o));
                if !w.queue.is_empty() {
                    w.expire()?;
                }
                let state = w.state();
                match op {
                    Op::Tick(ms) => {
                        w.now += ms;
                        w.expire()?;
                    }
                    Op::Acquire(side, o, lease, wait) => {
                        if busy(o, &w) { continue; }
                        let id = owner(o);
                        let queued = !w.queue.is_empty();
                        match acquire(&state, K, side, &id, lease, w.now, queued) {
                            Err(e) => {
                                prop_assert_eq!(e, ERR_RW_READ_HELD);
                                prop_assert!(side == Side::Write && state.read_count(&id) > 0 && !state.is_writer(&id));
                            }
                            Ok(plan) => {
                                // The writer reading its own lock counts as a re-entry: it
                                // would otherwise wait on the readers queued behind it.
                                let reentry = match side {
                                    Side::Read => state.read_count(&id) > 0 || state.is_writer(&id),
                                    Side::Write => state.is_writer(&id),
                                };
                                if queued && !reentry {
                                    prop_assert_eq!(plan.outcome, Outcome::Contended, "no barging past the queue");
                                }
                                if plan.outcome == Outcome::Contended {
                                    prop_assert!(plan.effects.is_empty());
                                    let pttl = if state.is_free() { 0 } else { state.pttl(w.now) };
                                    prop_assert_eq!(plan.reply, Reply::Int(pttl));
                                } else {
                                    prop_assert_eq!(plan.reply, Reply::Nil);
                                }
                                w.track(side, &id, lease, &plan);
                                w.apply(&plan)?;
                                if plan.outcome == Outcome::Contended && wait {
                                    let req = Request { side, owner: id, lease };
                                    arrivals += 1;
                                    w.queue.push_back((arrivals, req));
                                }
                                if plan.wake { w.serve()?; }
                            }
                        }
                    }
                    Op::Release(side, o, lease) => {
                        if busy(o, &w) { continue; }
                        let id = owner(o);
                        let plan = release(&state, K, side, &id, lease, w.now);
                        let want = match side {
                            Side::Read => match state.readers.get(&id) {
                                None => Reply::Nil,
                                Some(ends) => {
                                    // 0 while some hold left is alive (or re-armed by the lease).
                                    let rest = &ends[..ends.len() - 1];
                                    let alive = lease.is_some() && !rest.is_empty() || rest.iter().any(|e| *e > w.now);
                                    Reply::Int(if alive { 0 } else { 1 })
                                }
                            },
                            Side::Write => match &state.writer {
                                Some(wr) if wr.owner == id => Reply::Int(if wr.count == 1 { 1 } else { 0 }),
                                _ => Reply::Nil,
                            },
                        };
                        prop_assert_eq!(plan.reply, want);
                        if side == Side::Read && want != Reply::Nil {
                            let ends = w.leases.0.get_mut(&id).unwrap();
                            ends.pop();
                            if let Some(l) = lease { ends.iter_mut().for_each(|e| *e = w.now + l); }
                        }
                        w.apply(&plan)?;
                        if plan.wake { w.serve()?; }
                    }
                    Op::Renew(side, o, lease) => {
                        if busy(o, &w) { continue; }
                        let id = owner(o);
                        let plan = renew(&state, K, side, &id, lease, w.now);
                        if side == Side::Read {
                            if let Some(ends) = w.leases.0.get_mut(&id) {
                                ends.iter_mut().for_each(|e| *e = w.now + lease);
                            }
                        }
                        w.apply(&plan)?;
                    }
                    Op::Force(side) => {
                        let plan = force_release(&state, K, side, w.now);
                        if plan.outcome == Outcome::ForceReleased {
                            w.leases.0.clear();
                        }
                        w.apply(&plan)?;
                        if plan.wake { w.serve()?; }
                    }
                    Op::Cancel(i) => {
                        if i < w.queue.len() {
                            w.queue.remove(i);
                            // A head that leaves may unblock the readers behind it.
                            w.serve()?;
                        }
                    }
                }
            }
            // FIFO: waiters were served in the order they arrived.
            prop_assert!(w.granted.windows(2).all(|p| p[0] < p[1]), "served out of order: {:?}", w.granted);
        }

        #[test]
        fn parsers_never_panic(args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..8), 0..7)) {
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let _ = parse_rw_acquire(&args);
            let _ = parse_rw_release(&args);
            let _ = parse_rw_renew(&args);
            let _ = parse_rw_force(&args);
            let pairs = args.chunks(2).map(|c| (c[0].to_vec(), c.get(1).copied().unwrap_or(b"")));
            if let Ok(view) = parse_hash(pairs) {
                let keys = view.timeout_keys(K);
                let _ = view.into_state(5, &vec![1; keys.len()], 0);
            }
        }
    }
}
