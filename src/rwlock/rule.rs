//! The read-write lock algorithm (design.md 4.1), pure: no Redis, no clock, no I/O.
//!
//! It sits beside `lock::rule` (the plain lock) and works the same way: the glue reads the keys
//! into an [`RwState`], calls one function per command with `now`, applies the returned
//! [`Plan`]'s effects in order, and replies. The waiting engine calls [`grant`] on the head
//! of a key's queue, again and again, until it answers `None`.
//!
//! The layout is Redisson's RReadWriteLock (docs/internals/redisson-layouts.md): a hash at the name
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

use super::state::*;

use crate::vocab::args::{parse_acquire, parse_release, parse_renew, AcquireArgs, ReleaseArgs};
use crate::vocab::effects::{Effect, Effects, KeyRef, ONE};
use crate::vocab::errors::{
    ERR_COUNT_OVERFLOW, ERR_RW_OWNER_SUFFIX, ERR_RW_READ_HELD, ERR_RW_SIDE, ERR_RW_TOO_MANY_HOLDS,
    ERR_SYNTAX,
};

/// The reply a command sends when it answers at once: nil or an integer, as the lock's
/// (so the request-id store's `lock::encode_reply` keeps RW replies as it is).
pub use crate::lock::Reply;

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
    pub effects: Effects,
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
    effects: Effects,
    wake: bool,
    message: Option<&'static [u8]>,
    dropped: u32,
}

impl Build<'_> {
    fn set_mode(&mut self, mode: Mode) {
        if self.s.mode != Some(mode) {
            self.effects.push(Effect::HSet(
                KeyRef::Main,
                MODE_FIELD.into(),
                mode.as_bytes().into(),
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
                    .push(Effect::HIncrBy(KeyRef::Main, field.into(), 1, next));
                w.count = next;
            }
            None => {
                self.effects
                    .push(Effect::HSet(KeyRef::Main, field.into(), ONE));
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
                .push(Effect::HIncrBy(KeyRef::Main, field.into(), -1, w.count));
            false
        } else {
            self.effects.push(Effect::HDel(KeyRef::Main, field.into()));
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
            Effect::HSet(KeyRef::Main, owner.to_vec().into(), ONE)
        } else {
            Effect::HIncrBy(KeyRef::Main, owner.to_vec().into(), 1, n)
        });
        let timeout = KeyRef::Aux(timeout_key(self.key, owner, n));
        self.effects.push(Effect::Set(timeout, ONE, Some(end)));
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
            self.effects.push(Effect::HIncrBy(
                KeyRef::Main,
                owner.to_vec().into(),
                -1,
                n - 1,
            ));
        } else {
            self.effects
                .push(Effect::HDel(KeyRef::Main, owner.to_vec().into()));
            self.s.readers.remove(owner);
        }
        self.effects
            .push(Effect::Del(KeyRef::Aux(timeout_key(self.key, owner, n))));
    }

    /// Every read hold of `owner` goes, timeout keys included.
    fn drop_reader(&mut self, owner: &[u8]) {
        if let Some(ends) = self.s.readers.remove(owner) {
            self.effects
                .push(Effect::HDel(KeyRef::Main, owner.to_vec().into()));
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
            self.effects.push(if *e <= now {
                Effect::Set(key, ONE, Some(end))
            } else {
                Effect::PExpireAt(key, end)
            });
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
/// run out loses its holds, even while other readers renew (design.md 4.1). If that leaves a
/// read-mode lock without readers, the lock is freed as by the last reader's unlock.
fn normalize<'a>(state: &RwState, key: &'a [u8], now: i64) -> Build<'a> {
    let mut b = Build {
        key,
        s: state.clone(),
        effects: Effects::new(),
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

/// An acquire that took or re-entered a hold and leaves nothing to do after its effects (no
/// waiter to look at, no message): its effects follow from its arguments, the keys and
/// the clock alone, so it can replicate as itself made deterministic (RRWLOCK.ACQUIREAT).
pub fn writes_alone(plan: &Plan) -> bool {
    matches!(plan.outcome, Outcome::Acquired | Outcome::Reentered)
        && !plan.wake
        && plan.message.is_none()
}

/// Only calls that changed the holds are remembered under a request id (as
/// `lock::remembers`): re-running any other call is as good as replaying it.
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
#[path = "tests.rs"]
mod tests;

#[cfg(test)]
#[path = "props.rs"]
mod props;
