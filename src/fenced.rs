//! The fenced lock (SPEC 4.2), pure: the lock of `core` plus a fencing token.
//!
//! Layout (Redisson's RFencedLock, docs/redisson-layouts.md): the lock is the plain lock's
//! hash at the name, released on `redisson_lock__channel:{name}` with message `0`; the
//! token is a string key `redisson_lock_token:{name}` without TTL, which Redisson INCRs on
//! every acquire and re-entry (also plain `lock()`), and `getToken()` GETs.
//!
//! Redisson's INCR only increases on one server: a failover to a replica that missed the
//! last increments issues those numbers again. Here each token is a hybrid logical clock,
//! `max(last + 1, now_ms << 16)`, written with SET (so a replica or the AOF holds the
//! value itself, and Java clients' INCRs keep counting from it). It always increases on
//! one server, whatever its clock does, and after a failover or a restart that lost
//! writes, the first token exceeds every token issued before as long as
//!
//! ```text
//!     now_ms(new master, first token)  >  last_token(old master) >> 16
//! ```
//!
//! `last_token >> 16` is the old master's clock at its last token (in ms), plus its
//! "lead": how far bursts of more than 65 536 tokens per ms on this one name pushed the
//! counter ahead of its clock (0 otherwise). So with no such bursts: the promoted
//! replica's clock may lag the old master's by less than the failover took (from the old
//! master's last token to the new one's first), minus 1 ms. Sentinel and cluster
//! failovers take seconds; NTP keeps masters within milliseconds. Without any clock
//! help (a clock set back by more than the outage), tokens are still as good as
//! Redisson's: never lower than the replicated `last + 1`.

use crate::core::{self, LockState, Outcome, Plan, Reply, Write};
use crate::effects::{prefix_name, Effect, KeyRef};
use crate::errors::{ERR_NOT_A_TOKEN, ERR_TOKEN_OVERFLOW};

/// Tokens keep the wall clock in their high bits: 2^16 tokens per millisecond.
pub const CLOCK_SHIFT: u32 = 16;
/// The last millisecond whose shifted value fits an i64 (year 6429); later clocks are
/// clamped, and tokens go on by `last + 1`.
pub const MAX_CLOCK_MS: i64 = i64::MAX >> CLOCK_SHIFT;

/// `redisson_lock_token:{name}` (RedissonFencedLock's tokenName).
pub fn token_key(key: &[u8]) -> Vec<u8> {
    prefix_name(b"redisson_lock_token", key)
}

/// The token key's value: missing counts as 0 (where Redisson's INCR starts). Anything
/// but an integer is somebody else's data.
pub fn parse_token(value: Option<&[u8]>) -> Result<i64, &'static str> {
    match value {
        None => Ok(0),
        Some(bytes) => core::parse_i64(bytes).ok_or(ERR_NOT_A_TOKEN),
    }
}

/// The next token: `max(last + 1, now_ms << 16)`. A clock before the epoch counts as 0
/// and one past [`MAX_CLOCK_MS`] as that; only `last = i64::MAX` cannot go on.
pub fn next_token(last: i64, now_ms: i64) -> Result<i64, &'static str> {
    let bumped = last.checked_add(1).ok_or(ERR_TOKEN_OVERFLOW)?;
    let clock = now_ms.clamp(0, MAX_CLOCK_MS) << CLOCK_SHIFT;
    Ok(bumped.max(clock))
}

/// What `RFENCED.ACQUIRE` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedReply {
    /// Acquired or re-entered, with a new token.
    Acquired(i64),
    /// Held by another owner: its PTTL (-1 without TTL), as `RLOCK.ACQUIRE`.
    Contended(i64),
}

/// The lock's plan plus the token write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencedPlan {
    pub lock: Plan,
    /// `SET redisson_lock_token:{name} <token>` after the lock's effects.
    pub token: Option<i64>,
    pub reply: FencedReply,
}

impl FencedPlan {
    fn new(lock: Plan, last: i64, now: i64) -> Result<FencedPlan, &'static str> {
        match lock.reply {
            Reply::Nil => {
                let token = next_token(last, now)?;
                Ok(FencedPlan {
                    lock,
                    token: Some(token),
                    reply: FencedReply::Acquired(token),
                })
            }
            Reply::Int(pttl) => Ok(FencedPlan {
                lock,
                token: None,
                reply: FencedReply::Contended(pttl),
            }),
        }
    }

    /// The plan in the effect vocabulary, in order: the lock hash, then the token.
    pub fn effects(&self, key: &[u8], owner: &[u8]) -> Vec<Effect> {
        let mut out = Vec::with_capacity(4);
        if self.lock.delete {
            out.push(Effect::Del(KeyRef::Main));
        }
        match self.lock.write {
            Some(Write::Set(n)) => out.push(Effect::HSet(
                KeyRef::Main,
                owner.to_vec(),
                n.to_string().into_bytes(),
            )),
            Some(Write::IncrBy(delta, result)) => {
                out.push(Effect::HIncrBy(KeyRef::Main, owner.to_vec(), delta, result))
            }
            Some(Write::Remove) => out.push(Effect::HDel(KeyRef::Main, owner.to_vec())),
            None => {}
        }
        if let Some(at) = self.lock.expire_at {
            out.push(Effect::PExpireAt(KeyRef::Main, at));
        }
        if let Some(token) = self.token {
            out.push(Effect::Set(
                KeyRef::Aux(token_key(key)),
                token.to_string().into_bytes(),
            ));
        }
        out
    }
}

/// `RFENCED.ACQUIRE key owner lease-ms`: the lock's rule (`core::acquire`), and a new
/// token for every acquire and re-entry, as Redisson's lockAndGetToken. `last` is the
/// token key's value ([`parse_token`]).
pub fn acquire(
    state: &LockState,
    last: i64,
    owner: &[u8],
    lease: i64,
    now: i64,
) -> Result<FencedPlan, &'static str> {
    FencedPlan::new(core::acquire(state, owner, lease, now)?, last, now)
}

/// The handoff to a queued `RFENCED.ACQUIRE` waiter: the lock's grant plus its token.
pub fn grant(replace: bool, last: i64, lease: i64, now: i64) -> Result<FencedPlan, &'static str> {
    FencedPlan::new(core::grant(replace, lease, now), last, now)
}

/// True for the outcomes that issue a token (for the counters).
pub fn issues_token(outcome: Outcome) -> bool {
    matches!(outcome, Outcome::Acquired | Outcome::Reentered)
}
