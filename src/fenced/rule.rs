//! The fenced lock (design.md 4.2), pure: the lock of `lock::rule` plus a fencing token.
//!
//! Layout (Redisson's RFencedLock, docs/internals/redisson-layouts.md): the lock is the plain lock's
//! hash at the name, released on `redisson_lock__channel:{name}` with message `0`; the
//! token is a string key `redisson_lock_token:{name}` without TTL, which Redisson INCRs on
//! every acquire and re-entry (also plain `lock()`), and `getToken()` GETs.
//!
//! Redisson's INCR only increases on one server: a failover to a replica that missed the
//! last increments issues those numbers again. Here each token is a hybrid logical clock,
//! `max(last + 1, now_ms << 10)`, written with SET (so a replica or the AOF holds the
//! value itself, and Java clients' INCRs keep counting from it). It always increases on
//! one server, whatever its clock does, and after a failover or a restart that lost
//! writes, the first token exceeds every token issued before as long as
//!
//! ```text
//!     now_ms(new master, first token)  >  last_token(old master) >> 10
//! ```
//!
//! `last_token >> 10` is the old master's clock at its last token (in ms), plus its
//! "lead": how far bursts of more than 1024 tokens per ms on this one name pushed the
//! counter ahead of its clock (0 otherwise). So with no such bursts: the promoted
//! replica's clock may lag the old master's by less than the failover took (from the old
//! master's last token to the new one's first), minus 1 ms. Sentinel and cluster
//! failovers take seconds; NTP keeps masters within milliseconds. Without any clock
//! help (a clock set back by more than the outage), tokens are still as good as
//! Redisson's: never lower than the replicated `last + 1`.
//!
//! Why 10 bits and not 16: Redisson's lockAndGetToken returns the INCR result through its
//! Lua script, and Lua numbers are doubles, exact only below 2^53. `now_ms << CLOCK_SHIFT` is about
//! 2^57 today and came back rounded to a multiple of 16 (tests/interop/test_redisson_rw_scripts.py
//! shows it), so Java clients would see repeated tokens. `now_ms << 10` stays below 2^53
//! until the year 2248 ([`LUA_EXACT_UNTIL_MS`]), and 1024 tokens per millisecond on one
//! lock name is beyond what one Redis serves.

use crate::lock::{self, LockState, Outcome, Plan, Reply, Write};
use crate::vocab::args;
use crate::vocab::effects::{prefix_name, Effect, KeyRef};
use crate::vocab::errors::{ERR_NOT_A_TOKEN, ERR_TOKEN_OVERFLOW};

/// Tokens keep the wall clock in their high bits: 1024 tokens per millisecond.
pub const CLOCK_SHIFT: u32 = 10;
/// Until this clock (2^43 ms, September 2248) clock-made tokens stay below 2^53, so they
/// pass exactly through Lua numbers (Redisson's scripts). Later they are still exact in
/// Redis and in `RFENCED.*` replies.
pub const LUA_EXACT_UNTIL_MS: i64 = 1 << (53 - CLOCK_SHIFT);
/// The last millisecond whose shifted value fits an i64; later clocks are clamped, and
/// tokens go on by `last + 1`.
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
        Some(bytes) => args::parse_i64(bytes).ok_or(ERR_NOT_A_TOKEN),
    }
}

/// The next token: `max(last + 1, now_ms << 10)`. A clock before the epoch counts as 0
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
                owner.to_vec().into(),
                n.to_string().into_bytes().into(),
            )),
            Some(Write::IncrBy(delta, result)) => out.push(Effect::HIncrBy(
                KeyRef::Main,
                owner.to_vec().into(),
                delta,
                result,
            )),
            Some(Write::Remove) => out.push(Effect::HDel(KeyRef::Main, owner.to_vec().into())),
            None => {}
        }
        if let Some(at) = self.lock.expire_at {
            out.push(Effect::PExpireAt(KeyRef::Main, at));
        }
        out.extend(self.token_effect(key));
        out
    }

    /// `SET redisson_lock_token:{key} <token>`, when the plan issues a token: the write
    /// after the lock's own (which the glue writes as the plain lock's, `lock::store::apply`).
    pub fn token_effect(&self, key: &[u8]) -> Option<Effect> {
        self.token.map(|token| {
            Effect::Set(
                KeyRef::Aux(token_key(key)),
                token.to_string().into_bytes().into(),
                None,
            )
        })
    }
}

impl From<FencedReply> for crate::vocab::reply::Reply {
    /// `[nil, token]` when acquired, `[pttl, nil]` when held by another: position 1 keeps
    /// `RLOCK.ACQUIRE`'s nil/PTTL contract, so no value of one can be read as the other
    /// (Redisson's `{-1, token}` / `{pttl, -1}` is ambiguous for a lock without TTL).
    fn from(reply: FencedReply) -> crate::vocab::reply::Reply {
        use crate::vocab::reply::Reply as R;
        match reply {
            FencedReply::Acquired(token) => R::Array(vec![R::Nil, R::Int(token)]),
            FencedReply::Contended(pttl) => R::Array(vec![R::Int(pttl), R::Nil]),
        }
    }
}

/// What the engine does with a queued `RFENCED.ACQUIRE` at the head of its key's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// The lock is free (or overwritten: replaced, as `lock::grant_head`): hand it over
    /// with a new token.
    Grant(FencedPlan),
    /// Held: look again after this PTTL.
    Wait(i64),
    /// The token key cannot give a token (not an integer, or at `i64::MAX`): the waiter
    /// gets this error and nothing is written, rather than a lock without a token.
    Refuse(&'static str),
}

/// The engine's rule for a queued fenced acquire: the lock's (`lock::grant_head`), then
/// the token. `last` is the token key as read ([`parse_token`]); it is only looked at
/// when the lock can be granted.
pub fn grant_head(
    state: &Result<LockState, &str>,
    last: impl FnOnce() -> Result<i64, &'static str>,
    lease: i64,
    now: i64,
) -> Head {
    let replace = match state {
        Ok(LockState::Free) => false,
        Ok(held) => return Head::Wait(held.pttl()),
        Err(_) => true,
    };
    match last().and_then(|last| grant(replace, last, lease, now)) {
        Ok(plan) => Head::Grant(plan),
        Err(e) => Head::Refuse(e),
    }
}

/// `RFENCED.ACQUIRE key owner lease-ms`: the lock's rule (`lock::acquire`), and a new
/// token for every acquire and re-entry, as Redisson's lockAndGetToken. `last` reads the
/// token key's value ([`parse_token`]); it is called only when a token is due, so a
/// contended call reads one key.
pub fn acquire(
    state: &LockState,
    last: impl FnOnce() -> Result<i64, &'static str>,
    owner: &[u8],
    lease: i64,
    now: i64,
) -> Result<FencedPlan, &'static str> {
    let lock = lock::acquire(state, owner, lease, now)?;
    let last = match lock.reply {
        Reply::Nil => last()?,
        Reply::Int(_) => 0, // no token: not read
    };
    FencedPlan::new(lock, last, now)
}

/// `RFENCED.ACQUIRE` on a free lock left to script-side waiters (`lock::left_to_scripts`).
pub fn left_to_scripts(left: i64) -> FencedPlan {
    FencedPlan {
        lock: lock::left_to_scripts(left),
        token: None,
        reply: FencedReply::Contended(left),
    }
}

/// The handoff to a queued `RFENCED.ACQUIRE` waiter: the lock's grant plus its token.
pub fn grant(replace: bool, last: i64, lease: i64, now: i64) -> Result<FencedPlan, &'static str> {
    FencedPlan::new(lock::grant(replace, lease, now), last, now)
}

/// True for the outcomes that issue a token (for the counters).
pub fn issues_token(outcome: Outcome) -> bool {
    matches!(outcome, Outcome::Acquired | Outcome::Reentered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::Holder;

    const NOW: i64 = 1_700_000_000_000;

    fn held(owner: &str, count: i64, pttl: i64) -> LockState<'static> {
        LockState::Held {
            holders: vec![Holder {
                owner: owner.into(),
                count,
            }],
            pttl,
        }
    }

    #[test]
    fn next_token_table() {
        // (name, last, now_ms, next)
        for (name, last, now, want) in [
            ("it_starts_from_the_clock", 0, 1000, 1000 << CLOCK_SHIFT),
            (
                "it_counts_within_one_millisecond",
                (1000 << CLOCK_SHIFT) + 5,
                1000,
                (1000 << CLOCK_SHIFT) + 6,
            ),
            (
                "it_jumps_to_a_later_clock",
                (1000 << CLOCK_SHIFT) + 5,
                1001,
                1001 << CLOCK_SHIFT,
            ),
            (
                "it_never_goes_back_with_the_clock",
                5000 << CLOCK_SHIFT,
                10,
                (5000 << CLOCK_SHIFT) + 1,
            ),
            (
                "it_continues_a_java_incr_counter",
                41,
                NOW,
                NOW << CLOCK_SHIFT,
            ),
            ("a_clock_before_the_epoch_counts_as_zero", 7, -5, 8),
            ("a_negative_token_goes_up", -10, -1, 0),
            (
                "a_clock_past_an_i64_is_clamped",
                0,
                i64::MAX,
                MAX_CLOCK_MS << CLOCK_SHIFT,
            ),
            (
                "past_the_clamp_it_counts",
                MAX_CLOCK_MS << CLOCK_SHIFT,
                i64::MAX,
                (MAX_CLOCK_MS << CLOCK_SHIFT) + 1,
            ),
        ] {
            assert_eq!(next_token(last, now), Ok(want), "{name}");
        }
        assert_eq!(next_token(i64::MAX, NOW), Err(ERR_TOKEN_OVERFLOW));
        assert_eq!(next_token(i64::MAX - 1, NOW), Ok(i64::MAX));
    }

    #[test]
    fn parse_token_table() {
        assert_eq!(parse_token(None), Ok(0));
        assert_eq!(parse_token(Some(b"42")), Ok(42));
        assert_eq!(parse_token(Some(b"-3")), Ok(-3));
        for bad in [&b""[..], b"x", b"1.5", b" 1", b"99999999999999999999"] {
            assert_eq!(parse_token(Some(bad)), Err(ERR_NOT_A_TOKEN), "{bad:?}");
        }
    }

    #[test]
    fn acquire_issues_a_token_on_every_acquire_and_reentry_only() {
        // A free lock: created, token from the clock, written after the lock.
        let plan = acquire(&LockState::Free, || Ok(3), b"a", 100, NOW).unwrap();
        assert_eq!(plan.reply, FencedReply::Acquired(NOW << CLOCK_SHIFT));
        assert_eq!(
            plan.effects(b"f", b"a"),
            vec![
                Effect::HSet(KeyRef::Main, b"a".to_vec().into(), b"1".to_vec().into()),
                Effect::PExpireAt(KeyRef::Main, NOW + 100),
                Effect::Set(
                    KeyRef::Aux(b"redisson_lock_token:{f}".to_vec()),
                    (NOW << CLOCK_SHIFT).to_string().into_bytes().into(),
                    None
                ),
            ]
        );
        // A re-entry gets a new token, as with Redisson's lockAndGetToken.
        let last = NOW << CLOCK_SHIFT;
        let plan = acquire(&held("a", 1, 50), || Ok(last), b"a", 100, NOW).unwrap();
        assert_eq!(plan.reply, FencedReply::Acquired(last + 1));
        assert_eq!(
            plan.effects(b"f", b"a")[0],
            Effect::HIncrBy(KeyRef::Main, b"a".to_vec().into(), 1, 2)
        );
        // Another owner: the PTTL, no token, nothing written.
        let plan = acquire(&held("a", 1, 50), || unreachable!(), b"b", 100, NOW).unwrap();
        assert_eq!(plan.reply, FencedReply::Contended(50));
        assert!(plan.effects(b"f", b"b").is_empty());
        assert!(!issues_token(plan.lock.outcome));
        // A handoff to a queued waiter carries a token too.
        let plan = grant(false, last, 100, NOW + 1).unwrap();
        assert_eq!(plan.reply, FencedReply::Acquired((NOW + 1) << CLOCK_SHIFT));
        assert_eq!(
            acquire(&held("a", 1, 50), || Ok(i64::MAX), b"a", 100, NOW),
            Err(ERR_TOKEN_OVERFLOW)
        );
    }

    #[test]
    fn a_queued_acquire_waits_while_held_and_is_refused_on_a_bad_token_key() {
        let free: Result<LockState, &str> = Ok(LockState::Free);
        let held: Result<LockState, &str> = Ok(held("a", 1, 70));
        let overwritten: Result<LockState, &str> = Err(crate::vocab::errors::ERR_WRONGTYPE);
        // Held: the token key is not even read.
        assert_eq!(
            grant_head(&held, || unreachable!(), 100, NOW),
            Head::Wait(70)
        );
        let Head::Grant(plan) = grant_head(&free, || Ok(5), 100, NOW) else {
            panic!("a free lock is granted")
        };
        assert_eq!(plan.reply, FencedReply::Acquired(NOW << CLOCK_SHIFT));
        assert!(!plan.lock.delete);
        let Head::Grant(plan) = grant_head(&overwritten, || Ok(5), 100, NOW) else {
            panic!("an overwritten key is replaced")
        };
        assert!(plan.lock.delete);
        assert_eq!(
            grant_head(&free, || Err(ERR_NOT_A_TOKEN), 100, NOW),
            Head::Refuse(ERR_NOT_A_TOKEN)
        );
        assert_eq!(
            grant_head(&free, || Ok(i64::MAX), 100, NOW),
            Head::Refuse(ERR_TOKEN_OVERFLOW)
        );
    }

    #[test]
    fn replies_are_unambiguous_arrays() {
        use crate::vocab::reply::Reply as R;
        assert_eq!(
            R::from(FencedReply::Acquired(7)),
            R::Array(vec![R::Nil, R::Int(7)])
        );
        // A lock without TTL: -1 in position 1 still means "held by another".
        assert_eq!(
            R::from(FencedReply::Contended(-1)),
            R::Array(vec![R::Int(-1), R::Nil])
        );
    }

    #[test]
    fn a_failover_that_lost_tokens_is_covered_when_the_clock_moved_past_them() {
        // The old master issued 3 tokens in one ms; the replica got only the first.
        let t_a = NOW;
        let t1 = next_token(0, t_a).unwrap();
        let t2 = next_token(t1, t_a).unwrap();
        let t3 = next_token(t2, t_a).unwrap();
        // Promoted 5 s later with a clock 2 s behind: the bound holds (5 s > 2 s).
        let t_b = t_a + 5000 - 2000;
        assert!(t_b > t3 >> CLOCK_SHIFT);
        assert!(next_token(t1, t_b).unwrap() > t3);
        // A replica clock behind by more than the failover took: Redisson's guarantee
        // only (t1 + 1), which repeats a lost token. This is the documented bound.
        let late = t_a - 1;
        assert_eq!(next_token(t1, late).unwrap(), t2);
    }

    #[test]
    fn clock_made_tokens_stay_exact_in_lua_until_2248() {
        let year_2248 = 8_771_000_000_000; // 2247-12-12
        assert!(LUA_EXACT_UNTIL_MS > year_2248);
        assert!(next_token(0, LUA_EXACT_UNTIL_MS - 1).unwrap() < 1 << 53);
        assert!(next_token(0, NOW).unwrap() < 1 << 53);
    }

    #[test]
    fn token_key_follows_the_prefix_rule() {
        assert_eq!(token_key(b"f"), b"redisson_lock_token:{f}".to_vec());
        assert_eq!(token_key(b"{a}:f"), b"redisson_lock_token:{a}:f".to_vec());
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// On one server tokens strictly increase, whatever the clock does.
        #[test]
        fn tokens_increase_under_any_clock(start in 0..i64::MAX / 2, clocks in proptest::collection::vec(any::<i64>(), 1..50)) {
            let mut last = start;
            for now in clocks {
                let next = next_token(last, now).unwrap();
                prop_assert!(next > last);
                prop_assert!(next >= now.clamp(0, MAX_CLOCK_MS) << CLOCK_SHIFT);
                last = next;
            }
        }

        /// The failover bound: a new master whose clock reads later than the old master's
        /// last token's millisecond issues a larger token, however many increments it
        /// missed (`replicated` is any earlier token the replica had).
        #[test]
        fn a_new_master_past_the_old_tokens_millisecond_issues_a_larger_token(
            t_a in 0..MAX_CLOCK_MS / 2,
            burst in 1..200_000u32,
            lost in 0..200_000u32,
            ahead in 1..10_000i64,
        ) {
            let mut issued = vec![0i64];
            for _ in 0..burst.min(300) {
                let next = next_token(*issued.last().unwrap(), t_a).unwrap();
                issued.push(next);
            }
            // Bursts beyond 300 per ms are modelled by jumping the counter.
            let extra = i64::from(burst.saturating_sub(300));
            let last_a = *issued.last().unwrap() + extra;
            let replicated = last_a - i64::from(lost).min(last_a);
            let t_b = (last_a >> CLOCK_SHIFT) + ahead;
            prop_assert!(next_token(replicated, t_b).unwrap() > last_a);
        }
    }
}
