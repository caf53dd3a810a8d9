//! The permit-expirable semaphore algorithm (design.md 4.4), pure: no Redis, no clock, no I/O,
//! no randomness (the glue passes the random bytes of new permit ids in).
//!
//! Beside `semaphore` (whose [`Plan`], [`Reply`] and option parser it shares): the glue
//! reads both keys into an [`ExpState`], calls one function per command with `now`,
//! applies the plan and replies; when the plan says `wake` the engine calls [`grant`] on
//! its queue head until `None`, and it arms a timer at [`ExpState::next_expiry`] and calls
//! [`expire`] there, so a permit returns to the pool at its lease end.
//!
//! The layout is Redisson's RPermitExpirableSemaphore (docs/internals/redisson-sync-layouts.md): a
//! string at the name with the available count; a sorted set `{name}:timeout` with one
//! member per acquired permit, the member being the id's 16 raw bytes (the client sees
//! them as 32 lowercase hex digits), the score its absolute expiry in ms, or
//! [`NO_LEASE`] for a permit without lease. Channel `redisson_sc:{name}`, shared with
//! RSemaphore. A permit is expired when its score is <= now (Redisson's
//! `ZRANGEBYSCORE 0 now`): exactly at its lease end. Every plan first reclaims expired
//! permits as Redisson's scripts do (ZREM them, INCRBY the count, publish it), so the
//! keys a Java client reads are the same whether the timer or a command got there first.

use std::collections::BTreeMap;

use crate::semaphore::{
    parse_count, parse_int, parse_options, Allowed, Options, Outcome, Plan, Reply, MAX_PERMITS,
};
use crate::vocab::args::MAX_MS;
use crate::vocab::effects::{suffix_name, Effect, Effects, KeyRef};
use crate::vocab::errors::{
    ERR_INTERNAL, ERR_NOT_A_PERMIT_SET, ERR_PERMITS, ERR_PERMITS_DELTA, ERR_PERMITS_OVERFLOW,
    ERR_PERMIT_ID, ERR_PERMIT_LEASE, ERR_SYNTAX,
};

pub use crate::semaphore::{channel, message_after_grants};

/// Redisson's `nonExpirableTimeout`: the score of a permit acquired without a lease.
pub const NO_LEASE: i64 = 922_337_203_685_477;
/// Redisson's permit ids are 16 random bytes (ServiceManager.generateId).
pub const ID_BYTES: usize = 16;
/// The longest permit id accepted from a caller, in bytes (Java accepts any hex).
pub const MAX_ID_BYTES: usize = 32;

/// The permit zset: `{name}:timeout`.
pub fn timeout_key(key: &[u8]) -> Vec<u8> {
    suffix_name(key, b"timeout")
}

/// What the two keys hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExpState {
    /// The count key; `None`: no key (0 available).
    pub available: Option<i64>,
    /// The zset: permit id bytes -> expiry (ms since the epoch, or [`NO_LEASE`]).
    pub permits: BTreeMap<Vec<u8>, i64>,
    /// The count key's absolute expiry, if it has one: Redisson copies it to the zset on
    /// every acquire.
    pub expire_at: Option<i64>,
}

impl ExpState {
    pub fn available(&self) -> i64 {
        self.available.unwrap_or(0)
    }

    /// When the timer should fire: the earliest lease end (permits without lease never
    /// end). After [`expire`] at that moment, the next one.
    pub fn next_expiry(&self) -> Option<i64> {
        self.permits
            .values()
            .copied()
            .filter(|&at| at != NO_LEASE)
            .min()
    }

    fn expired(&self, now: i64) -> Vec<Vec<u8>> {
        self.permits
            .iter()
            .filter(|(_, &at)| at <= now)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// Builds the state from the count key's value and PTTL and the zset's members with their
/// scores (ZRANGE 0 -1 WITHSCORES). A score Redisson could write is an integer ms.
pub fn parse_state<I>(
    value: Option<&[u8]>,
    pttl: i64,
    members: I,
    now: i64,
) -> Result<ExpState, &'static str>
where
    I: IntoIterator<Item = (Vec<u8>, f64)>,
{
    let mut permits = BTreeMap::new();
    for (id, score) in members {
        if !(score.is_finite() && score.fract() == 0.0 && (0.0..=NO_LEASE as f64).contains(&score))
        {
            return Err(ERR_NOT_A_PERMIT_SET);
        }
        permits.insert(id, score as i64);
    }
    Ok(ExpState {
        available: parse_count(value)?,
        permits,
        expire_at: (pttl >= 0).then(|| now.saturating_add(pttl)),
    })
}

/// Redisson's id format: the bytes as lowercase hex.
pub fn id_to_hex(id: &[u8]) -> Vec<u8> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    id.iter()
        .flat_map(|b| [HEX[(b >> 4) as usize], HEX[(b & 15) as usize]])
        .collect()
}

/// A permit id as a caller writes it (hex, any case, as Java's decodeHexDump reads it)
/// to the bytes the zset holds.
pub fn parse_permit_id(arg: &[u8]) -> Result<Vec<u8>, &'static str> {
    if arg.is_empty() || !arg.len().is_multiple_of(2) || arg.len() > 2 * MAX_ID_BYTES {
        return Err(ERR_PERMIT_ID);
    }
    let digit = |c: u8| (c as char).to_digit(16).ok_or(ERR_PERMIT_ID);
    arg.chunks(2)
        .map(|pair| Ok((digit(pair[0])? * 16 + digit(pair[1])?) as u8))
        .collect()
}

/// Builds a plan: every change goes through one method that both records the effect and
/// updates the state, so `Plan::state` is what the keys hold after `Plan::effects`.
struct Build {
    /// The permit zset's name.
    zset: Vec<u8>,
    s: ExpState,
    effects: Effects,
    wake: bool,
    message: Option<Vec<u8>>,
    reclaimed: i64,
}

impl Build {
    /// Every plan starts here: permits whose lease ended at or before `now` go back to the
    /// pool, as the prefix of Redisson's scripts does it (one ZREM, one INCRBY, and the new
    /// count published when positive).
    fn start(state: ExpState, key: &[u8], now: i64) -> Result<Build, &'static str> {
        let mut b = Build {
            zset: timeout_key(key),
            s: state,
            effects: Effects::new(),
            wake: false,
            message: None,
            reclaimed: 0,
        };
        let expired = b.s.expired(now);
        if !expired.is_empty() {
            let n = expired.len() as i64;
            for id in &expired {
                b.s.permits.remove(id);
            }
            b.effects.push(Effect::ZRem(b.zset(), expired));
            b.add(n)?;
            b.reclaimed = n;
            if b.s.available() > 0 {
                b.message = Some(b.s.available().to_string().into_bytes());
            }
        }
        Ok(b)
    }

    /// INCRBY on the count (creating it); waiters may be servable when it went up.
    fn add(&mut self, n: i64) -> Result<(), &'static str> {
        let next = self
            .s
            .available()
            .checked_add(n)
            .ok_or(ERR_PERMITS_OVERFLOW)?;
        self.effects.push(Effect::IncrBy(KeyRef::Main, n, next));
        self.s.available = Some(next);
        self.wake |= n > 0;
        Ok(())
    }

    fn set(&mut self, value: i64) {
        self.effects.push(Effect::Set(
            KeyRef::Main,
            value.to_string().into_bytes().into(),
            None,
        ));
        self.s.available = Some(value);
        // SET drops the count key's TTL.
        self.s.expire_at = None;
    }

    fn finish(self, reply: Reply, outcome: Outcome) -> Plan<ExpState> {
        Plan {
            effects: self.effects,
            reply,
            outcome,
            wake: self.wake,
            message: self.message,
            state: self.s,
        }
    }

    fn zset(&self) -> KeyRef {
        KeyRef::Aux(self.zset.clone())
    }
}

/// The score of a permit leased for `lease` ms from `now` (`None`: no lease).
fn expiry(lease: Option<i64>, now: i64) -> i64 {
    lease.map_or(NO_LEASE, |ms| now.saturating_add(ms).min(NO_LEASE - 1))
}

/// The engine's timer (and its first step on a key with waiters): reclaim what ran out.
/// Reply: how many permits came back.
pub fn expire(state: ExpState, key: &[u8], now: i64) -> Result<Plan<ExpState>, &'static str> {
    let b = Build::start(state, key, now)?;
    let n = b.reclaimed;
    Ok(b.finish(Reply::Int(n), Outcome::Expired))
}

/// `RPSEMAPHORE.ACQUIRE key lease-ms [PERMITS n]`: `permits` new permits, each with one
/// of `ids` (16 random bytes from the glue) and the lease (`None`: no lease). Reply: the
/// id (or, with `many`, the ids) in hex; nil when not enough permits are free or others
/// are `queued` first (a WAIT caller may queue). Like Redisson, a count key with a TTL
/// passes it on to the zset.
#[allow(clippy::too_many_arguments)]
pub fn acquire(
    state: ExpState,
    key: &[u8],
    permits: i64,
    lease: Option<i64>,
    ids: &[[u8; ID_BYTES]],
    many: bool,
    now: i64,
    queued: bool,
) -> Result<Plan<ExpState>, &'static str> {
    let mut b = Build::start(state, key, now)?;
    if !(1..=MAX_PERMITS).contains(&permits) || ids.len() < permits as usize {
        return Err(ERR_INTERNAL);
    }
    let ids = &ids[..permits as usize];
    if queued || b.s.available() < permits {
        return Ok(b.finish(Reply::Nil, Outcome::Contended));
    }
    if ids
        .iter()
        .enumerate()
        .any(|(i, id)| b.s.permits.contains_key(&id[..]) || ids[..i].contains(id))
    {
        // 2^-128 odds: refuse rather than let one member stand for two permits.
        return Err(ERR_INTERNAL);
    }
    let at = expiry(lease, now);
    b.add(-permits)?;
    b.effects.push(Effect::ZAdd(
        b.zset(),
        ids.iter().map(|id| (at, id.to_vec())).collect(),
    ));
    for id in ids {
        b.s.permits.insert(id.to_vec(), at);
    }
    if let Some(ttl_end) = b.s.expire_at.filter(|&end| end > now) {
        b.effects.push(Effect::PExpireAt(b.zset(), ttl_end));
    }
    let reply = if many {
        Reply::Array(ids.iter().map(|id| Reply::Bulk(id_to_hex(id))).collect())
    } else {
        Reply::Bulk(id_to_hex(&ids[0]))
    };
    Ok(b.finish(reply, Outcome::Acquired))
}

/// `RPSEMAPHORE.RELEASE key permit-id`: 1 and the permit back in the pool (the new count
/// published), or 0 when no such permit is held, expired ones included (their reclaim
/// already returned them, as Redisson's release does while answering 0).
pub fn release(
    state: ExpState,
    key: &[u8],
    id: &[u8],
    now: i64,
) -> Result<Plan<ExpState>, &'static str> {
    let mut b = Build::start(state, key, now)?;
    if b.s.permits.remove(id).is_none() {
        return Ok(b.finish(Reply::Int(0), Outcome::NotHeld));
    }
    b.effects.push(Effect::ZRem(b.zset(), vec![id.to_vec()]));
    b.add(1)?;
    b.message = Some(b.s.available().to_string().into_bytes());
    Ok(b.finish(Reply::Int(1), Outcome::Released))
}

/// `RPSEMAPHORE.UPDATELEASETIME key permit-id lease-ms`: 1 and the permit's lease
/// re-armed to `now + lease` (`None`: no lease), or 0 when it is not held (any more).
pub fn update_lease_time(
    state: ExpState,
    key: &[u8],
    id: &[u8],
    lease: Option<i64>,
    now: i64,
) -> Result<Plan<ExpState>, &'static str> {
    let mut b = Build::start(state, key, now)?;
    let at = expiry(lease, now);
    match b.s.permits.get_mut(id) {
        None => Ok(b.finish(Reply::Int(0), Outcome::NotHeld)),
        Some(end) => {
            *end = at;
            let zset = b.zset();
            b.effects.push(Effect::ZAdd(zset, vec![(at, id.to_vec())]));
            Ok(b.finish(Reply::Int(1), Outcome::Renewed))
        }
    }
}

/// `RPSEMAPHORE.TRYSETPERMITS key permits`: 1 and the count set when there is no count
/// key (Redisson publishes the permits), else 0.
pub fn try_set_permits(
    state: ExpState,
    key: &[u8],
    permits: i64,
    now: i64,
) -> Result<Plan<ExpState>, &'static str> {
    let mut b = Build::start(state, key, now)?;
    if b.s.available.is_some() {
        return Ok(b.finish(Reply::Int(0), Outcome::NotSet));
    }
    b.set(permits);
    b.wake |= permits > 0;
    b.message = Some(permits.to_string().into_bytes());
    Ok(b.finish(Reply::Int(1), Outcome::Set))
}

/// `RPSEMAPHORE.SETPERMITS key permits`: makes available + held equal `permits` (held
/// permits stay held; the available count may go negative). Reply: the available count.
/// Redisson publishes the permits when the total changed.
pub fn set_permits(
    state: ExpState,
    key: &[u8],
    permits: i64,
    now: i64,
) -> Result<Plan<ExpState>, &'static str> {
    let mut b = Build::start(state, key, now)?;
    let held = b.s.permits.len() as i64;
    let outcome = match b.s.available {
        None => {
            b.set(permits);
            b.wake |= permits > 0;
            b.message = Some(permits.to_string().into_bytes());
            Outcome::Set
        }
        Some(available) => {
            // The count key is anybody's string: near i64's ends the sum or the step
            // would wrap (found by tests/stress/test_fuzz_all.py), so both are checked.
            let total = available.checked_add(held).ok_or(ERR_PERMITS_OVERFLOW)?;
            let delta = permits.checked_sub(total).ok_or(ERR_PERMITS_OVERFLOW)?;
            if delta == 0 {
                let reply = Reply::Int(b.s.available());
                return Ok(b.finish(reply, Outcome::Nothing));
            }
            b.add(delta)?;
            b.message = Some(permits.to_string().into_bytes());
            Outcome::Changed
        }
    };
    let reply = Reply::Int(b.s.available());
    Ok(b.finish(reply, outcome))
}

/// `RPSEMAPHORE.ADDPERMITS key delta`: the available count moves by `delta` (SET, which
/// drops the count key's TTL, as Redisson). Reply: the new count. Redisson publishes the
/// delta when it is positive.
pub fn add_permits(
    state: ExpState,
    key: &[u8],
    delta: i64,
    now: i64,
) -> Result<Plan<ExpState>, &'static str> {
    let mut b = Build::start(state, key, now)?;
    let next =
        b.s.available()
            .checked_add(delta)
            .ok_or(ERR_PERMITS_OVERFLOW)?;
    b.set(next);
    if delta > 0 {
        b.wake = true;
        b.message = Some(delta.to_string().into_bytes());
    }
    Ok(b.finish(Reply::Int(next), Outcome::Changed))
}

/// `RPSEMAPHORE.AVAILABLE key`: read-only, so it also answers on replicas: the count as
/// it is once expired permits are back (what Redisson's availablePermits returns after
/// its reclaim, without writing).
pub fn available(state: &ExpState, now: i64) -> i64 {
    state
        .available()
        .saturating_add(state.expired(now).len() as i64)
}

/// Permits held and not expired at `now` (Redisson's acquiredPermits).
pub fn acquired(state: &ExpState, now: i64) -> i64 {
    state.permits.values().filter(|&&at| at > now).count() as i64
}

/// A permit's remaining lease in ms, PTTL-style: -1 without lease, -2 when it is not held
/// (Redisson's getLeaseTime answers 0 there and its client throws).
pub fn lease_time(state: &ExpState, id: &[u8], now: i64) -> i64 {
    match state.permits.get(id) {
        Some(&NO_LEASE) => -1,
        Some(&at) if at > now => at - now,
        _ => -2,
    }
}

/// A queued acquire, as the engine keeps it: the ids are drawn when the command arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub permits: i64,
    pub lease: Option<i64>,
    pub ids: Vec<[u8; ID_BYTES]>,
    pub many: bool,
}

/// The queue-head rule: the head's plan if its permits are free at `now` (expired
/// permits count, the plan reclaims them), else `None`: stop, the requests behind it wait
/// too. `Some(Err(..))` only for an internal inconsistency: answer that waiter with it.
pub fn grant(
    state: ExpState,
    key: &[u8],
    request: &Request,
    now: i64,
) -> Option<Result<Plan<ExpState>, &'static str>> {
    match acquire(
        state,
        key,
        request.permits,
        request.lease,
        &request.ids,
        request.many,
        now,
        false,
    ) {
        Ok(plan) if plan.outcome == Outcome::Contended => None,
        other => Some(other),
    }
}

/// `lease-ms`: -1 (no lease, Redisson's leaseTime -1) or 1 to 100 years.
pub fn parse_lease(arg: &[u8]) -> Result<Option<i64>, &'static str> {
    if arg == b"-1" {
        return Ok(None);
    }
    parse_int(arg, 1, MAX_MS, ERR_PERMIT_LEASE).map(Some)
}

/// `lease-ms [PERMITS n] [WAIT timeout-ms] [ID request-id]` of `ACQUIRE` (after the key).
/// `Options::permits` is `None` for one permit replied as a bulk id.
pub fn parse_acquire<'a>(args: &[&'a [u8]]) -> Result<(Option<i64>, Options<'a>), &'static str> {
    let [lease, rest @ ..] = args else {
        return Err(ERR_SYNTAX);
    };
    let lease = parse_lease(lease)?;
    let allowed = Allowed {
        wait: true,
        permits: true,
        ..Allowed::default()
    };
    Ok((lease, parse_options(rest, allowed)?))
}

/// `permit-id [ID request-id]` of `RELEASE`.
pub fn parse_release<'a>(args: &[&'a [u8]]) -> Result<(Vec<u8>, Options<'a>), &'static str> {
    let [id, rest @ ..] = args else {
        return Err(ERR_SYNTAX);
    };
    Ok((
        parse_permit_id(id)?,
        parse_options(rest, Allowed::default())?,
    ))
}

/// `permit-id lease-ms` of `UPDATELEASETIME` (idempotent: no request id).
pub fn parse_update(args: &[&[u8]]) -> Result<(Vec<u8>, Option<i64>), &'static str> {
    let [id, lease] = args else {
        return Err(ERR_SYNTAX);
    };
    Ok((parse_permit_id(id)?, parse_lease(lease)?))
}

/// `permits [ID request-id]` of `TRYSETPERMITS` and `SETPERMITS`.
pub fn parse_permits<'a>(args: &[&'a [u8]]) -> Result<(i64, Options<'a>), &'static str> {
    let [permits, rest @ ..] = args else {
        return Err(ERR_SYNTAX);
    };
    let permits = parse_int(permits, 0, MAX_PERMITS, ERR_PERMITS)?;
    Ok((permits, parse_options(rest, Allowed::default())?))
}

/// `delta [ID request-id]` of `ADDPERMITS`.
pub fn parse_add<'a>(args: &[&'a [u8]]) -> Result<(i64, Options<'a>), &'static str> {
    let [delta, rest @ ..] = args else {
        return Err(ERR_SYNTAX);
    };
    let delta = parse_int(delta, -MAX_PERMITS, MAX_PERMITS, ERR_PERMITS_DELTA)?;
    Ok((delta, parse_options(rest, Allowed::default())?))
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
