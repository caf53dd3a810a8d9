//! The permit-expirable semaphore algorithm (SPEC 4.4), pure: no Redis, no clock, no I/O,
//! no randomness (the glue passes the random bytes of new permit ids in).
//!
//! Beside `semaphore` (whose [`Plan`], [`Reply`] and option parser it shares): the glue
//! reads both keys into an [`ExpState`], calls one function per command with `now`,
//! applies the plan and replies; when the plan says `wake` the engine calls [`grant`] on
//! its queue head until `None`, and it arms a timer at [`ExpState::next_expiry`] and calls
//! [`expire`] there, so a permit returns to the pool at its lease end.
//!
//! The layout is Redisson's RPermitExpirableSemaphore (docs/redisson-sync-layouts.md): a
//! string at the name with the available count; a sorted set `{name}:timeout` with one
//! member per acquired permit, the member being the id's 16 raw bytes (the client sees
//! them as 32 lowercase hex digits), the score its absolute expiry in ms, or
//! [`NO_LEASE`] for a permit without lease. Channel `redisson_sc:{name}`, shared with
//! RSemaphore. A permit is expired when its score is <= now (Redisson's
//! `ZRANGEBYSCORE 0 now`): exactly at its lease end. Every plan first reclaims expired
//! permits as Redisson's scripts do (ZREM them, INCRBY the count, publish it), so the
//! keys a Java client reads are the same whether the timer or a command got there first.

use std::collections::BTreeMap;

use crate::core::MAX_MS;
use crate::effects::{suffix_name, Effect, KeyRef};
use crate::errors::{
    ERR_INTERNAL, ERR_NOT_A_PERMIT_SET, ERR_PERMITS, ERR_PERMITS_DELTA, ERR_PERMITS_OVERFLOW,
    ERR_PERMIT_ID, ERR_PERMIT_LEASE, ERR_SYNTAX,
};
use crate::semaphore::{
    parse_count, parse_int, parse_options, Allowed, Options, Outcome, Plan, Reply, MAX_PERMITS,
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
    effects: Vec<Effect>,
    wake: bool,
    message: Option<Vec<u8>>,
    reclaimed: i64,
}

impl Build {
    /// Every plan starts here: permits whose lease ended at or before `now` go back to the
    /// pool, as the prefix of Redisson's scripts does it (one ZREM, one INCRBY, and the new
    /// count published when positive).
    fn start(state: &ExpState, key: &[u8], now: i64) -> Result<Build, &'static str> {
        let mut b = Build {
            zset: timeout_key(key),
            s: state.clone(),
            effects: Vec::new(),
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
        self.effects
            .push(Effect::Set(KeyRef::Main, value.to_string().into_bytes()));
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
pub fn expire(state: &ExpState, key: &[u8], now: i64) -> Result<Plan<ExpState>, &'static str> {
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
    state: &ExpState,
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
    let hex: Vec<Vec<u8>> = ids.iter().map(|id| id_to_hex(id)).collect();
    let reply = if many {
        Reply::Array(hex.into_iter().map(Reply::Bulk).collect())
    } else {
        Reply::Bulk(hex.into_iter().next().unwrap_or_default())
    };
    Ok(b.finish(reply, Outcome::Acquired))
}

/// `RPSEMAPHORE.RELEASE key permit-id`: 1 and the permit back in the pool (the new count
/// published), or 0 when no such permit is held, expired ones included (their reclaim
/// already returned them, as Redisson's release does while answering 0).
pub fn release(
    state: &ExpState,
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
    state: &ExpState,
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
    state: &ExpState,
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
    state: &ExpState,
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
            // would wrap (found by tests/test_fuzz_all.py), so both are checked.
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
    state: &ExpState,
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
    state: &ExpState,
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
mod tests {
    use super::*;

    const K: &[u8] = b"e";
    const Z: &[u8] = b"{e}:timeout";

    fn id(n: u8) -> [u8; ID_BYTES] {
        [n; ID_BYTES]
    }

    fn state(available: i64, permits: &[(u8, i64)]) -> ExpState {
        ExpState {
            available: Some(available),
            permits: permits
                .iter()
                .map(|&(n, at)| (id(n).to_vec(), at))
                .collect(),
            expire_at: None,
        }
    }

    fn zset_key() -> KeyRef {
        KeyRef::Aux(Z.to_vec())
    }

    #[test]
    fn names_and_ids_follow_redisson() {
        assert_eq!(timeout_key(b"e"), Z.to_vec());
        assert_eq!(timeout_key(b"{a}:e"), b"{a}:e:timeout".to_vec());
        assert_eq!(channel(b"e"), b"redisson_sc:{e}".to_vec());
        assert_eq!(id_to_hex(&[0x00, 0xab, 0x7f]), b"00ab7f".to_vec());
        assert_eq!(parse_permit_id(b"00AB7f"), Ok(vec![0x00, 0xab, 0x7f]));
        for bad in [&b""[..], b"abc", b"zz", &[b'a'; 66]] {
            assert_eq!(parse_permit_id(bad), Err(ERR_PERMIT_ID), "{bad:?}");
        }
        assert_eq!(parse_permit_id(&id_to_hex(&id(7))), Ok(id(7).to_vec()));
    }

    #[test]
    fn state_reads_integer_scores_only() {
        let s = parse_state(Some(b"2"), 5000, vec![(vec![1], 1500.0)], 1000).unwrap();
        assert_eq!(s.available, Some(2));
        assert_eq!(s.expire_at, Some(6000));
        assert_eq!(s.permits.get(&vec![1]), Some(&1500));
        assert_eq!(parse_state(None, -2, vec![], 0).unwrap().expire_at, None);
        for bad in [1.5, -1.0, f64::NAN, f64::INFINITY, 1e300] {
            assert_eq!(
                parse_state(None, -2, vec![(vec![1], bad)], 0),
                Err(ERR_NOT_A_PERMIT_SET),
                "{bad}"
            );
        }
    }

    #[test]
    fn acquire_writes_redissons_layout() {
        let p = acquire(
            &state(2, &[]),
            K,
            1,
            Some(500),
            &[id(1)],
            false,
            1000,
            false,
        )
        .unwrap();
        assert_eq!(
            p.effects,
            vec![
                Effect::IncrBy(KeyRef::Main, -1, 1),
                Effect::ZAdd(zset_key(), vec![(1500, id(1).to_vec())]),
            ]
        );
        assert_eq!(p.reply, Reply::Bulk(id_to_hex(&id(1))));
        assert!(p.message.is_none() && !p.wake);
        assert_eq!(p.state.next_expiry(), Some(1500));
        // No lease: Redisson's score; several permits: an array.
        let p = acquire(
            &state(2, &[]),
            K,
            2,
            None,
            &[id(1), id(2)],
            true,
            1000,
            false,
        )
        .unwrap();
        assert_eq!(
            p.effects[1],
            Effect::ZAdd(
                zset_key(),
                vec![(NO_LEASE, id(1).to_vec()), (NO_LEASE, id(2).to_vec())]
            )
        );
        assert_eq!(
            p.reply,
            Reply::Array(vec![
                Reply::Bulk(id_to_hex(&id(1))),
                Reply::Bulk(id_to_hex(&id(2)))
            ])
        );
        assert_eq!(p.state.next_expiry(), None);
        // The count key's TTL goes to the zset.
        let mut s = state(1, &[]);
        s.expire_at = Some(9000);
        let p = acquire(&s, K, 1, None, &[id(1)], false, 1000, false).unwrap();
        assert_eq!(p.effects.last(), Some(&Effect::PExpireAt(zset_key(), 9000)));
    }

    #[test]
    fn acquire_refuses_without_permits_or_behind_a_queue() {
        // (state, permits, queued)
        for (s, permits, queued) in [
            (state(1, &[]), 2, false),
            (state(2, &[]), 1, true),
            (ExpState::default(), 1, false),
            (state(-1, &[]), 1, false),
        ] {
            let ids = [id(1), id(2)];
            let p = acquire(&s, K, permits, Some(10), &ids, false, 0, queued).unwrap();
            assert_eq!(
                (p.reply, p.outcome),
                (Reply::Nil, Outcome::Contended),
                "{s:?}"
            );
            assert!(p.effects.is_empty());
        }
        assert_eq!(
            acquire(&state(3, &[]), K, 2, None, &[id(1)], true, 0, false),
            Err(ERR_INTERNAL),
            "fewer ids than permits"
        );
        assert_eq!(
            acquire(&state(3, &[(1, 50)]), K, 1, None, &[id(1)], false, 0, false),
            Err(ERR_INTERNAL),
            "an id already held"
        );
    }

    #[test]
    fn every_plan_reclaims_expired_permits_first() {
        let s = state(0, &[(1, 100), (2, 200), (3, NO_LEASE)]);
        let p = acquire(&s, K, 1, Some(50), &[id(9)], false, 200, false).unwrap();
        assert_eq!(
            p.effects[..2],
            [
                Effect::ZRem(zset_key(), vec![id(1).to_vec(), id(2).to_vec()]),
                Effect::IncrBy(KeyRef::Main, 2, 2),
            ]
        );
        assert_eq!(
            p.message,
            Some(b"2".to_vec()),
            "Redisson publishes the reclaimed count"
        );
        assert_eq!(p.state.available, Some(1));
        assert_eq!(p.state.permits.len(), 2);
        // A refused acquire still reclaims.
        let p = acquire(&s, K, 3, None, &[id(7), id(8), id(9)], true, 150, false).unwrap();
        assert_eq!(p.outcome, Outcome::Contended);
        assert_eq!(p.state.available, Some(1));
        assert!(p.wake, "reclaimed permits may serve the queue");
    }

    #[test]
    fn expire_is_exact_at_the_lease_end() {
        let s = state(0, &[(1, 100)]);
        let p = expire(&s, K, 99).unwrap();
        assert!(p.effects.is_empty() && !p.wake && p.reply == Reply::Int(0));
        let p = expire(&s, K, 100).unwrap();
        assert_eq!(p.reply, Reply::Int(1));
        assert_eq!(p.state.available, Some(1));
        assert!(p.state.permits.is_empty() && p.wake);
        assert_eq!(available(&s, 99), 0);
        assert_eq!(available(&s, 100), 1);
        // Redisson's count may be missing while permits are out: INCRBY creates it.
        let s = ExpState {
            permits: state(0, &[(1, 100)]).permits,
            ..ExpState::default()
        };
        assert_eq!(expire(&s, K, 100).unwrap().state.available, Some(1));
    }

    #[test]
    fn release_returns_a_held_permit_only() {
        let s = state(0, &[(1, 500), (2, 100)]);
        let p = release(&s, K, &id(1), 200).unwrap();
        assert_eq!(p.reply, Reply::Int(1));
        assert_eq!(p.state.available, Some(2), "its permit and the expired one");
        assert_eq!(p.message, Some(b"2".to_vec()));
        assert_eq!(
            p.effects[2..],
            [
                Effect::ZRem(zset_key(), vec![id(1).to_vec()]),
                Effect::IncrBy(KeyRef::Main, 1, 2)
            ]
        );
        let p = release(&s, K, &id(2), 200).unwrap();
        assert_eq!((p.reply, p.outcome), (Reply::Int(0), Outcome::NotHeld));
        assert_eq!(
            p.state.available,
            Some(1),
            "expired: reclaimed, not released"
        );
        let p = release(&s, K, &id(9), 0).unwrap();
        assert!(p.effects.is_empty() && p.reply == Reply::Int(0));
    }

    #[test]
    fn update_lease_time_moves_a_held_permits_end() {
        let s = state(0, &[(1, 500)]);
        let p = update_lease_time(&s, K, &id(1), Some(1000), 400).unwrap();
        assert_eq!(
            p.effects,
            vec![Effect::ZAdd(zset_key(), vec![(1400, id(1).to_vec())])]
        );
        assert_eq!(p.reply, Reply::Int(1));
        assert_eq!(p.state.next_expiry(), Some(1400));
        let p = update_lease_time(&s, K, &id(1), None, 400).unwrap();
        assert_eq!(p.state.permits[&id(1).to_vec()], NO_LEASE);
        assert_eq!(
            update_lease_time(&s, K, &id(1), Some(10), 500)
                .unwrap()
                .reply,
            Reply::Int(0)
        );
        assert_eq!(lease_time(&s, &id(1), 400), 100);
        assert_eq!(lease_time(&s, &id(1), 500), -2);
        assert_eq!(lease_time(&p.state, &id(1), 400), -1);
    }

    #[test]
    fn it_refuses_setpermits_whose_sum_or_step_would_wrap() {
        // A count at i64's ends, written by hand: an error, never a panic (the fuzz found
        // `available + held` wrapping on RPSEMAPHORE.SETPERMITS).
        let full = state(i64::MAX, &[(1, NO_LEASE)]);
        assert_eq!(
            set_permits(&full, K, 2, 0).err(),
            Some(ERR_PERMITS_OVERFLOW)
        );
        let low = state(i64::MIN, &[]);
        assert_eq!(set_permits(&low, K, 2, 0).err(), Some(ERR_PERMITS_OVERFLOW));
        let p = set_permits(&state(i64::MAX - 1, &[(1, NO_LEASE)]), K, i64::MAX, 0).unwrap();
        assert!(p.effects.is_empty(), "exactly the total: nothing to change");
    }

    #[test]
    fn setting_and_adding_permits_match_redisson() {
        let p = try_set_permits(&ExpState::default(), K, 3, 0).unwrap();
        assert_eq!(p.effects, vec![Effect::Set(KeyRef::Main, b"3".to_vec())]);
        assert_eq!((p.message.as_deref(), p.wake), (Some(&b"3"[..]), true));
        assert_eq!(
            try_set_permits(&state(0, &[]), K, 3, 0).unwrap().reply,
            Reply::Int(0)
        );
        // setPermits: available + held == permits.
        let p = set_permits(&state(1, &[(1, NO_LEASE)]), K, 5, 0).unwrap();
        assert_eq!(p.effects, vec![Effect::IncrBy(KeyRef::Main, 3, 4)]);
        assert_eq!(p.message, Some(b"5".to_vec()));
        let p = set_permits(&state(4, &[(1, NO_LEASE)]), K, 5, 0).unwrap();
        assert!(p.effects.is_empty() && p.message.is_none());
        // addPermits publishes the delta, only when positive, and SETs (TTL dropped).
        let mut s = state(1, &[]);
        s.expire_at = Some(100);
        let p = add_permits(&s, K, 2, 0).unwrap();
        assert_eq!(p.effects, vec![Effect::Set(KeyRef::Main, b"3".to_vec())]);
        assert_eq!(
            (p.message.as_deref(), p.state.expire_at),
            (Some(&b"2"[..]), None)
        );
        let p = add_permits(&s, K, -2, 0).unwrap();
        assert_eq!((p.message, p.wake, p.reply), (None, false, Reply::Int(-1)));
    }

    #[test]
    fn grant_stops_at_a_head_that_does_not_fit() {
        let s = state(1, &[(1, 100)]);
        let big = Request {
            permits: 3,
            lease: None,
            ids: vec![id(7), id(8), id(9)],
            many: true,
        };
        assert!(grant(&s, K, &big, 100).is_none());
        let two = Request {
            permits: 2,
            lease: Some(10),
            ids: vec![id(7), id(8)],
            many: true,
        };
        let p = grant(&s, K, &two, 100).unwrap().unwrap();
        assert_eq!(p.state.available, Some(0), "the expired permit counted");
        assert!(grant(&s, K, &two, 99).is_none());
    }

    #[test]
    fn parsers_name_the_bad_argument() {
        assert_eq!(parse_lease(b"-1"), Ok(None));
        assert_eq!(parse_lease(b"5"), Ok(Some(5)));
        for bad in [&b"0"[..], b"-2", b"x", b"3153600000001"] {
            assert_eq!(parse_lease(bad), Err(ERR_PERMIT_LEASE), "{bad:?}");
        }
        let (lease, o) =
            parse_acquire(&[b"100", b"PERMITS", b"3", b"WAIT", b"0", b"ID", b"r"]).unwrap();
        assert_eq!(
            (lease, o.permits, o.wait, o.id),
            (Some(100), Some(3), Some(0), Some(&b"r"[..]))
        );
        assert_eq!(
            parse_acquire(&[b"100", b"PERMITS", b"1025"]).unwrap_err(),
            crate::errors::ERR_PERMIT_COUNT
        );
        assert_eq!(parse_acquire(&[]).unwrap_err(), ERR_SYNTAX);
        assert_eq!(parse_release(&[b"0a", b"ID", b"r"]).unwrap().0, vec![10]);
        assert_eq!(
            parse_release(&[b"0a", b"WAIT", b"1"]).unwrap_err(),
            ERR_SYNTAX
        );
        assert_eq!(parse_update(&[b"0a", b"-1"]), Ok((vec![10], None)));
        assert_eq!(parse_update(&[b"0a"]), Err(ERR_SYNTAX));
        assert_eq!(parse_permits(&[b"-1"]).unwrap_err(), ERR_PERMITS);
        assert_eq!(parse_add(&[b"-3"]).unwrap().0, -3);
    }

    mod model {
        use super::super::*;
        use super::K;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Acquire(i64, Option<i64>),
            Release(usize),
            Update(usize, Option<i64>),
            Add(i64),
            Tick(i64),
            Timer,
        }

        fn op() -> impl Strategy<Value = Op> {
            let lease = proptest::option::weighted(0.8, 1..200i64);
            prop_oneof![
                (1..4i64, lease.clone()).prop_map(|(n, l)| Op::Acquire(n, l)),
                any::<usize>().prop_map(Op::Release),
                (any::<usize>(), lease).prop_map(|(i, l)| Op::Update(i, l)),
                (-2..4i64).prop_map(Op::Add),
                (0..150i64).prop_map(Op::Tick),
                Just(Op::Timer),
            ]
        }

        /// The `i`-th held permit (modulo), if any.
        fn pick(s: &ExpState, i: usize) -> Option<Vec<u8>> {
            s.permits.keys().nth(i % s.permits.len().max(1)).cloned()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1000))]

            /// available + live permits == total after every plan (expired ones are back
            /// in the count), and a permit is held exactly until its lease end.
            #[test]
            fn permits_are_conserved_and_expire_exactly_at_their_lease(
                start in 0..6i64, ops in proptest::collection::vec(op(), 1..60)
            ) {
                let mut now = 1_000i64;
                let mut total = start;
                let mut s = try_set_permits(&ExpState::default(), K, start, now).unwrap().state;
                let mut next_id = 0u8;
                // What the model says each permit's end is.
                let mut ends: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
                for op in ops {
                    let plan = match op {
                        Op::Acquire(n, lease) => {
                            let ids: Vec<[u8; ID_BYTES]> = (0..n)
                                .map(|_| {
                                    next_id += 1;
                                    [next_id; ID_BYTES]
                                })
                                .collect();
                            if ids.iter().any(|i| s.permits.contains_key(&i[..])) { continue; }
                            let p = acquire(&s, K, n, lease, &ids, true, now, false).unwrap();
                            if p.outcome == Outcome::Acquired {
                                for i in &ids { ends.insert(i.to_vec(), expiry(lease, now)); }
                            }
                            p
                        }
                        Op::Release(i) => {
                            let Some(id) = pick(&s, i) else { continue };
                            let p = release(&s, K, &id, now).unwrap();
                            prop_assert_eq!(p.reply.clone(), Reply::Int((ends[&id] > now) as i64));
                            ends.remove(&id);
                            p
                        }
                        Op::Update(i, lease) => {
                            let Some(id) = pick(&s, i) else { continue };
                            let p = update_lease_time(&s, K, &id, lease, now).unwrap();
                            if p.reply == Reply::Int(1) { ends.insert(id, expiry(lease, now)); }
                            p
                        }
                        Op::Add(d) => { total += d; add_permits(&s, K, d, now).unwrap() }
                        Op::Tick(ms) => { now += ms; continue; }
                        Op::Timer => {
                            let Some(at) = s.next_expiry() else { continue };
                            now = now.max(at);
                            expire(&s, K, now).unwrap()
                        }
                    };
                    s = plan.state;
                    ends.retain(|id, _| s.permits.contains_key(id));
                    let live = s.permits.values().filter(|&&at| at > now).count() as i64;
                    prop_assert_eq!(s.permits.len() as i64, live, "no expired permit left in a plan's state");
                    prop_assert_eq!(s.available() + live, total, "conserved");
                    for (id, &end) in &s.permits {
                        prop_assert_eq!(Some(&end), ends.get(id));
                        prop_assert!(end > now, "held only before its end");
                    }
                    let earliest = s.permits.values().copied().filter(|&a| a != NO_LEASE).min();
                    prop_assert_eq!(s.next_expiry(), earliest);
                }
            }

            /// A permit leased for `lease` ms is held at now + lease - 1 and back at now + lease.
            #[test]
            fn a_permit_expires_exactly_at_its_lease(
                lease in 1..10_000_000i64,
                now in 0..2_000_000_000_000i64
            ) {
                let s = try_set_permits(&ExpState::default(), K, 1, now).unwrap().state;
                let s = acquire(&s, K, 1, Some(lease), &[[1; ID_BYTES]], false, now, false).unwrap().state;
                prop_assert_eq!(s.next_expiry(), Some(now + lease));
                let before = expire(&s, K, now + lease - 1).unwrap();
                prop_assert_eq!(before.state.available(), 0);
                prop_assert!(before.effects.is_empty());
                let at = expire(&s, K, now + lease).unwrap();
                prop_assert_eq!(at.state.available(), 1);
                prop_assert!(at.state.permits.is_empty());
                prop_assert!(at.wake);
            }
        }
    }
}
