//! The countdown latch algorithm (design.md 4.5), pure: no Redis, no clock, no I/O.
//!
//! Beside `semaphore` (whose [`Plan`], [`Reply`] and option parser it shares): the glue
//! reads the key into a [`LatchState`], calls one function per command, applies the plan
//! and replies; when the plan says `wake`, the engine calls [`grant`] on its queue head
//! until `None`, which here grants every awaiter at once when the latch is open.
//!
//! The layout is Redisson's RCountDownLatch (docs/internals/redisson-sync-layouts.md): a string at
//! the name holding the count; a missing key is count 0, an open latch. Its channel is
//! `redisson_countdownlatch__channel__{name}`, always with braces (Redisson does not use
//! its prefixName rule here). Messages: `0` when the count reaches zero, `1` when a count
//! is set or the latch deleted. Redisson's awaiters return when the count is <= 0; so do
//! the module's, and since a deleted or expired latch reads as 0, they return then too
//! (Redisson's own awaiters stay asleep until a `0` message in that case).

use crate::semaphore::{parse_int, parse_options, Allowed, Options, Outcome, Plan, Reply};
use crate::vocab::args::parse_i64;
use crate::vocab::effects::{Effect, KeyRef};
use crate::vocab::errors::{ERR_LATCH_COUNT, ERR_LATCH_OVERFLOW, ERR_NOT_A_LATCH, ERR_SYNTAX};

/// CountDownLatchPubSub.ZERO_COUNT_MESSAGE: awaiters return.
pub const ZERO_COUNT_MESSAGE: &[u8] = b"0";
/// CountDownLatchPubSub.NEW_COUNT_MESSAGE: a new count (or the latch went); awaiters wait.
pub const NEW_COUNT_MESSAGE: &[u8] = b"1";

/// `redisson_countdownlatch__channel__{name}`, braces even around a name that has its own.
pub fn channel(key: &[u8]) -> Vec<u8> {
    [b"redisson_countdownlatch__channel__{", key, b"}"].concat()
}

/// What the latch's key holds. `None`: no key, count 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatchState {
    pub count: Option<i64>,
}

impl LatchState {
    /// `GET` as Redisson's getCount reads it: a missing key is 0.
    pub fn count(&self) -> i64 {
        self.count.unwrap_or(0)
    }

    /// Awaiters may go: Redisson's await loops while the count is above zero.
    pub fn is_open(&self) -> bool {
        self.count() <= 0
    }
}

/// Reads the key's value (GET): a decimal integer, or somebody else's data.
pub fn parse_state(value: Option<&[u8]>) -> Result<LatchState, &'static str> {
    let count = value
        .map(|v| parse_i64(v).ok_or(ERR_NOT_A_LATCH))
        .transpose()?;
    Ok(LatchState { count })
}

/// `RLATCH.TRYSETCOUNT key count`: 1 and the count set when there is no latch (Redisson
/// publishes `1`), else 0 and nothing changes.
pub fn try_set_count(state: &LatchState, count: i64) -> Plan<LatchState> {
    if state.count.is_some() {
        return Plan::new(*state, Reply::Int(0), Outcome::NotSet);
    }
    let mut plan = Plan::new(
        LatchState { count: Some(count) },
        Reply::Int(1),
        Outcome::Set,
    );
    plan.effects.push(Effect::Set(
        KeyRef::Main,
        count.to_string().into_bytes().into(),
        None,
    ));
    plan.message = Some(NEW_COUNT_MESSAGE.to_vec());
    plan
}

/// `RLATCH.COUNTDOWN key`: the count goes down by one; at zero or below the key goes, and
/// exactly at zero the latch opens: every awaiter is granted and `0` published. Reply:
/// the count after (0 once open). No latch: 0, nothing changes (Redisson's DECR makes -1
/// and deletes it again in the same script).
pub fn count_down(state: &LatchState) -> Result<Plan<LatchState>, &'static str> {
    let Some(count) = state.count else {
        return Ok(Plan::new(*state, Reply::Int(0), Outcome::Nothing));
    };
    let next = count.checked_sub(1).ok_or(ERR_LATCH_OVERFLOW)?;
    if next > 0 {
        let mut plan = Plan::new(
            LatchState { count: Some(next) },
            Reply::Int(next),
            Outcome::CountedDown,
        );
        plan.effects.push(Effect::IncrBy(KeyRef::Main, -1, next));
        return Ok(plan);
    }
    let mut plan = Plan::new(LatchState { count: None }, Reply::Int(0), Outcome::Opened);
    plan.effects.push(Effect::Del(KeyRef::Main));
    plan.wake = true;
    if next == 0 {
        plan.message = Some(ZERO_COUNT_MESSAGE.to_vec());
    }
    Ok(plan)
}

/// `RLATCH.DELETE key`: 1 and the latch gone (Redisson publishes `1`), 0 when there was
/// none. Awaiters are granted: a missing latch is open.
pub fn delete(state: &LatchState) -> Plan<LatchState> {
    if state.count.is_none() {
        return Plan::new(*state, Reply::Int(0), Outcome::Nothing);
    }
    let mut plan = Plan::new(LatchState { count: None }, Reply::Int(1), Outcome::Deleted);
    plan.effects.push(Effect::Del(KeyRef::Main));
    plan.wake = true;
    plan.message = Some(NEW_COUNT_MESSAGE.to_vec());
    plan
}

/// `RLATCH.AWAIT key [WAIT timeout-ms]`: 1 when the latch is open, else 0 (a WAIT caller
/// queues until it opens). Changes nothing.
pub fn await_open(state: &LatchState) -> Plan<LatchState> {
    if state.is_open() {
        Plan::new(*state, Reply::Int(1), Outcome::Acquired)
    } else {
        Plan::new(*state, Reply::Int(0), Outcome::Contended)
    }
}

/// A queued await: nothing to remember but the waiter itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Request;

/// The queue-head rule: an open latch grants the head, and so, looped, every awaiter in
/// the same turn; a closed one grants nobody.
pub fn grant(state: &LatchState, _request: &Request, _now: i64) -> Option<Plan<LatchState>> {
    let plan = await_open(state);
    (plan.outcome == Outcome::Acquired).then_some(plan)
}

/// `count [ID request-id]` of `TRYSETCOUNT` (after the key).
pub fn parse_try_set<'a>(args: &[&'a [u8]]) -> Result<(i64, Options<'a>), &'static str> {
    let [count, rest @ ..] = args else {
        return Err(ERR_SYNTAX);
    };
    let count = parse_int(count, 1, i64::MAX, ERR_LATCH_COUNT)?;
    Ok((count, parse_options(rest, Allowed::default())?))
}

/// `[WAIT timeout-ms [ASYNC ID ticket-id]]` of `AWAIT`: it changes nothing, so it takes
/// a request id only to name its queued ticket (docs/commands/tickets.md).
pub fn parse_await<'a>(args: &[&'a [u8]]) -> Result<Options<'a>, &'static str> {
    let allowed = Allowed {
        wait: true,
        ..Allowed::default()
    };
    match parse_options(args, allowed)? {
        Options {
            id: Some(_),
            queued: false,
            ..
        } => Err(ERR_SYNTAX),
        o => Ok(o),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latch(n: i64) -> LatchState {
        LatchState { count: Some(n) }
    }
    const NONE: LatchState = LatchState { count: None };

    #[test]
    fn channel_always_has_braces() {
        assert_eq!(
            channel(b"l"),
            b"redisson_countdownlatch__channel__{l}".to_vec()
        );
        assert_eq!(
            channel(b"{app}:l"),
            b"redisson_countdownlatch__channel__{{app}:l}".to_vec()
        );
    }

    #[test]
    fn it_reads_decimal_counts_only() {
        assert_eq!(parse_state(None), Ok(NONE));
        assert_eq!(parse_state(Some(b"0")), Ok(latch(0)));
        assert_eq!(parse_state(Some(b"2x")), Err(ERR_NOT_A_LATCH));
    }

    #[test]
    fn try_set_count_creates_and_publishes_new_count() {
        let p = try_set_count(&NONE, 3);
        assert_eq!(
            p.effects.to_vec(),
            vec![Effect::Set(KeyRef::Main, b"3".to_vec().into(), None)]
        );
        assert_eq!(
            (p.reply.clone(), p.message.clone()),
            (Reply::Int(1), Some(b"1".to_vec()))
        );
        assert!(!p.wake);
        let p = try_set_count(&latch(1), 3);
        assert_eq!((p.reply, p.effects.len()), (Reply::Int(0), 0));
    }

    #[test]
    fn count_down_opens_exactly_at_zero() {
        // (count, reply, effects, message, wake)
        type Row = (LatchState, i64, Vec<Effect>, Option<&'static [u8]>, bool);
        let table: Vec<Row> = vec![
            (
                latch(3),
                2,
                vec![Effect::IncrBy(KeyRef::Main, -1, 2)],
                None,
                false,
            ),
            (
                latch(1),
                0,
                vec![Effect::Del(KeyRef::Main)],
                Some(b"0"),
                true,
            ),
            // A count Java set to 0 or below: the key goes, but no zero message (Redisson).
            (latch(0), 0, vec![Effect::Del(KeyRef::Main)], None, true),
            (NONE, 0, vec![], None, false),
        ];
        for (state, reply, effects, message, wake) in table {
            let p = count_down(&state).unwrap();
            assert_eq!(p.reply, Reply::Int(reply), "{state:?}");
            assert_eq!(p.effects.to_vec(), effects, "{state:?}");
            assert_eq!(p.message.as_deref(), message, "{state:?}");
            assert_eq!(p.wake, wake, "{state:?}");
        }
        assert_eq!(
            count_down(&latch(i64::MIN)).unwrap_err(),
            ERR_LATCH_OVERFLOW
        );
    }

    #[test]
    fn delete_publishes_new_count_and_opens() {
        let p = delete(&latch(2));
        assert_eq!(p.effects.to_vec(), vec![Effect::Del(KeyRef::Main)]);
        assert_eq!(
            (p.message.as_deref(), p.wake),
            (Some(NEW_COUNT_MESSAGE), true)
        );
        assert_eq!(delete(&NONE).reply, Reply::Int(0));
    }

    #[test]
    fn await_and_grant_follow_the_open_state() {
        for (state, open) in [
            (NONE, true),
            (latch(0), true),
            (latch(-1), true),
            (latch(1), false),
        ] {
            assert_eq!(
                await_open(&state).reply,
                Reply::Int(open as i64),
                "{state:?}"
            );
            assert_eq!(grant(&state, &Request, 0).is_some(), open, "{state:?}");
        }
    }

    #[test]
    fn parsers_name_the_bad_argument() {
        assert_eq!(parse_try_set(&[b"5"]).unwrap().0, 5);
        assert_eq!(parse_try_set(&[b"0"]), Err(ERR_LATCH_COUNT));
        assert_eq!(parse_try_set(&[]), Err(ERR_SYNTAX));
        assert_eq!(
            parse_try_set(&[b"1", b"ID", b"r"]).unwrap().1.id,
            Some(&b"r"[..])
        );
        assert_eq!(parse_await(&[]).map(|o| o.wait), Ok(None));
        assert_eq!(parse_await(&[b"WAIT", b"0"]).map(|o| o.wait), Ok(Some(0)));
        let o = parse_await(&[b"WAIT", b"0", b"ASYNC", b"ID", b"t"]).unwrap();
        assert!(o.queued && o.id == Some(&b"t"[..]));
        assert_eq!(parse_await(&[b"ID", b"x"]), Err(ERR_SYNTAX));
    }

    mod model {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(500))]

            /// Any count, any number of awaiters arriving between count-downs: nobody is
            /// granted before the count reaches zero, and all are in the turn it does.
            #[test]
            fn all_waiters_are_granted_at_zero(
                count in 1..20i64,
                arrivals in proptest::collection::vec(0..4usize, 1..25)
            ) {
                let mut s = try_set_count(&LatchState::default(), count).state;
                let mut queue = 0usize;
                let mut granted = 0usize;
                let mut zero_messages = 0;
                let mut count_downs = 0;
                for (i, arriving) in arrivals.iter().enumerate() {
                    for _ in 0..*arriving {
                        if await_open(&s).outcome == Outcome::Acquired { granted += 1 } else { queue += 1 }
                    }
                    if i as i64 >= count + 2 { break; }
                    let plan = count_down(&s).unwrap();
                    count_downs += 1;
                    zero_messages += (plan.message.as_deref() == Some(ZERO_COUNT_MESSAGE)) as i64;
                    s = plan.state;
                    if plan.wake {
                        while queue > 0 {
                            let Some(p) = grant(&s, &Request, 0) else { break };
                            s = p.state;
                            queue -= 1;
                            granted += 1;
                        }
                    }
                    if s.is_open() {
                        prop_assert_eq!(queue, 0, "everyone granted once open");
                    } else {
                        prop_assert_eq!(granted, 0, "nobody before zero");
                    }
                }
                prop_assert_eq!(zero_messages, (count_downs >= count) as i64, "one zero message, at zero");
            }
        }
    }
}
