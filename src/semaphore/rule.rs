//! The semaphore algorithm (design.md 4.3), pure: no Redis, no clock, no I/O; and the
//! vocabulary it shares with `expirable` (the permit-expirable semaphore) and `latch`
//! (the countdown latch): [`Plan`], [`Reply`], [`Outcome`] and the option parser.
//!
//! It sits beside `lock::rule` and `rwlock` and works the same way: the glue reads the key into
//! a [`SemState`], calls one function per command, applies the returned [`Plan`]'s effects
//! in order (they are what it replicates), replies, and when the plan says `wake` the
//! waiting engine calls [`grant`] on the head of the key's queue until it answers `None`.
//!
//! The layout is Redisson's RSemaphore (docs/internals/redisson-sync-layouts.md): a string at the
//! name holding the number of available permits (a missing key is 0), its channel
//! `redisson_sc:{name}`, every message the count Redisson would publish. Nobody records
//! who holds permits, so a holder that dies keeps its permits forever: the README is to say
//! so and point to the permit-expirable semaphore (design.md 4.3).
//!
//! Fairness beyond Redisson: waiters are served first come, first served, and a request
//! for 5 at the head holds back a later request for 1 (so big requests are not starved).

use crate::vocab::args;
use crate::vocab::args::{parse_i64, MAX_MS};
use crate::vocab::effects::{prefix_name, Bytes, Effect, Effects, KeyRef};
use crate::vocab::errors::{
    ERR_EMPTY_ID, ERR_NOT_A_SEMAPHORE, ERR_PERMITS, ERR_PERMITS_DELTA, ERR_PERMITS_OVERFLOW,
    ERR_PERMIT_COUNT, ERR_SYNTAX, ERR_TIMEOUT, ERR_TTL,
};

/// Redisson's permits are Java `int`s: no call asks for more than this at once.
pub const MAX_PERMITS: i64 = i32::MAX as i64;

/// The most permits one permit-expirable acquire may take: each gets an id in the reply
/// (and the engine keeps a queued request's ids), so the count is kept small.
pub const MAX_PERMIT_IDS: i64 = 1024;

/// Both semaphores publish on `redisson_sc:{name}`.
pub fn channel(key: &[u8]) -> Vec<u8> {
    prefix_name(b"redisson_sc", key)
}

/// The reply a command sends when it answers at once (permit ids are bulk strings of hex).
pub use crate::vocab::reply::Reply;

/// What happened, for the `INFO rlock` counters and the glue's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Permits taken (or, for the latch, the await returned: the latch is open).
    Acquired,
    /// Not now: a WAIT caller may queue. The plan may still hold effects (expired permits
    /// reclaimed on the way), which the glue applies all the same.
    Contended,
    Released,
    /// The permit id is not (or no longer) held.
    NotHeld,
    /// A count was set where none was.
    Set,
    /// A count already existed: nothing set.
    NotSet,
    /// The count changed by a delta (`ADDPERMITS`, `SETPERMITS`).
    Changed,
    Drained,
    Renewed,
    /// The latch's count went down and is still above zero.
    CountedDown,
    /// The latch's count reached zero (or the latch went): every awaiter may go.
    Opened,
    Deleted,
    /// Nothing to act on (no latch to count down or delete, no permits to drain).
    Nothing,
    /// Only the timer: expired permits were reclaimed, or nothing was due.
    Expired,
}

/// What a command does: its effects in order, its reply, and what the engine does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan<S> {
    pub effects: Effects,
    pub reply: Reply,
    pub outcome: Outcome,
    /// Waiters may now be servable: the engine loops `grant` over its queue head.
    pub wake: bool,
    /// What Redisson would publish on the channel for this change, for its pub/sub
    /// waiters; the semaphores pass it through [`message_after_grants`] first.
    pub message: Option<Vec<u8>>,
    /// The state after the effects: the engine's next `grant` starts from it.
    pub state: S,
}

impl<S> Plan<S> {
    pub(crate) fn new(state: S, reply: Reply, outcome: Outcome) -> Plan<S> {
        Plan {
            effects: Effects::new(),
            reply,
            outcome,
            wake: false,
            message: None,
            state,
        }
    }

    /// True when nothing follows the plan's effects: no queue to serve (`wake`), no
    /// message, and no request-id record (`recorded`: the call has an ID and the outcome
    /// [`remembers`]). Its own writes may then go out as the command itself without being
    /// recorded first (`store::apply_own_effects_in`).
    pub fn alone(&self, recorded: bool) -> bool {
        !self.wake && self.message.is_none() && !recorded
    }
}

/// What the semaphore's key holds. `None`: no key (0 permits, as Redisson reads it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SemState {
    pub available: Option<i64>,
}

impl SemState {
    pub fn available(&self) -> i64 {
        self.available.unwrap_or(0)
    }
}

/// Reads the key's value (GET). A count Redisson could write is a decimal integer;
/// anything else is somebody else's data and no command may touch it.
pub fn parse_count(value: Option<&[u8]>) -> Result<Option<i64>, &'static str> {
    value
        .map(|v| parse_i64(v).ok_or(ERR_NOT_A_SEMAPHORE))
        .transpose()
}

pub fn parse_state(value: Option<&[u8]>) -> Result<SemState, &'static str> {
    Ok(SemState {
        available: parse_count(value)?,
    })
}

fn int(n: i64) -> Vec<u8> {
    n.to_string().into_bytes()
}

/// `RSEMAPHORE.TRYSETPERMITS key permits [PX ttl-ms]`: 1 and the count set (with an
/// expiry `ttl` ms from `now`) when there was no key, else 0 and nothing changes.
pub fn try_set_permits(
    state: &SemState,
    permits: i64,
    ttl: Option<i64>,
    now: i64,
) -> Plan<SemState> {
    if state.available.is_some() {
        return Plan::new(*state, Reply::Int(0), Outcome::NotSet);
    }
    let mut plan = Plan::new(
        SemState {
            available: Some(permits),
        },
        Reply::Int(1),
        Outcome::Set,
    );
    let at = ttl.map(|ttl| now.saturating_add(ttl));
    plan.effects
        .push(Effect::Set(KeyRef::Main, int(permits).into(), at));
    plan.wake = permits > 0;
    plan.message = Some(int(permits));
    plan
}

/// `RSEMAPHORE.ADDPERMITS key delta`: the count moves by `delta` (a missing key counts as
/// 0; it may go negative, as Redisson allows). Reply: the new count. Like Redisson this
/// SETs the key, which drops any TTL, and publishes the new count.
pub fn add_permits(state: &SemState, delta: i64) -> Result<Plan<SemState>, &'static str> {
    let next = state
        .available()
        .checked_add(delta)
        .ok_or(ERR_PERMITS_OVERFLOW)?;
    let mut plan = Plan::new(
        SemState {
            available: Some(next),
        },
        Reply::Int(next),
        Outcome::Changed,
    );
    plan.effects
        .push(Effect::Set(KeyRef::Main, int(next).into(), None));
    plan.wake = delta > 0;
    plan.message = Some(int(next));
    Ok(plan)
}

/// `RSEMAPHORE.ACQUIRE key permits`: 1 and the permits taken, or 0 (a WAIT caller may
/// queue). Zero permits are always granted at once, as Redisson's client does without a
/// call. `queued` says whether anyone waits on the key: a newcomer then queues behind
/// them even if the permits are there (FIFO).
pub fn acquire(state: &SemState, permits: i64, queued: bool) -> Plan<SemState> {
    if permits == 0 {
        return Plan::new(*state, Reply::Int(1), Outcome::Acquired);
    }
    match state.available {
        Some(available) if available >= permits && !queued => {
            let next = available - permits;
            let mut plan = Plan::new(
                SemState {
                    available: Some(next),
                },
                Reply::Int(1),
                Outcome::Acquired,
            );
            plan.effects
                .push(Effect::IncrBy(KeyRef::Main, -permits, next));
            plan
        }
        _ => Plan::new(*state, Reply::Int(0), Outcome::Contended),
    }
}

/// `RSEMAPHORE.RELEASE key permits`: the count goes up by `permits` (creating the key, as
/// Redisson's INCRBY does; nobody checks the caller held any). Reply: the count after the
/// release, before queued waiters are served. Publishes that count.
pub fn release(state: &SemState, permits: i64) -> Result<Plan<SemState>, &'static str> {
    if permits == 0 {
        return Ok(Plan::new(
            *state,
            Reply::Int(state.available()),
            Outcome::Nothing,
        ));
    }
    let next = state
        .available()
        .checked_add(permits)
        .ok_or(ERR_PERMITS_OVERFLOW)?;
    let mut plan = Plan::new(
        SemState {
            available: Some(next),
        },
        Reply::Int(next),
        Outcome::Released,
    );
    plan.effects
        .push(Effect::IncrBy(KeyRef::Main, permits, next));
    plan.wake = true;
    plan.message = Some(int(next));
    Ok(plan)
}

/// `RSEMAPHORE.DRAIN key`: takes every available permit; reply how many (Redisson's
/// drainPermits: the old value, negative ones included, reset to 0 with SET, which drops
/// any TTL). No key: 0 and nothing changes. Publishes nothing, as Redisson.
pub fn drain(state: &SemState) -> Plan<SemState> {
    match state.available {
        None => Plan::new(*state, Reply::Int(0), Outcome::Nothing),
        Some(old) => {
            let mut plan = Plan::new(
                SemState { available: Some(0) },
                Reply::Int(old),
                Outcome::Drained,
            );
            plan.effects
                .push(Effect::Set(KeyRef::Main, Bytes::Borrowed(b"0"), None));
            plan
        }
    }
}

/// A queued acquire, as the engine keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub permits: i64,
}

/// The queue-head rule: the head waiter's plan if its permits are there, else `None`
/// (stop serving: the requests behind it wait too, however small). `now` is unused here;
/// the signature is the one every primitive's engine loop calls.
pub fn grant(state: &SemState, request: &Request, _now: i64) -> Option<Plan<SemState>> {
    let plan = acquire(state, request.permits, false);
    (plan.outcome == Outcome::Acquired).then_some(plan)
}

/// The message to publish once the engine served its queue: Redisson's subscribers read a
/// message `m` as "up to m permits may be free", so it is the plan's message capped by
/// what is still available, and none when nothing is (the queue took it all, and a Java
/// waiter woken for nothing would only retry and fail).
pub fn message_after_grants(plan_message: Option<&[u8]>, available_after: i64) -> Option<Vec<u8>> {
    let sent = parse_i64(plan_message?)?;
    let m = sent.min(available_after);
    (m > 0).then(|| int(m))
}

/// Only calls that changed something are remembered under their request id: replaying a
/// call that changed nothing is as good as running it again.
pub fn remembers(outcome: Outcome) -> bool {
    !matches!(
        outcome,
        Outcome::Contended | Outcome::NotHeld | Outcome::NotSet | Outcome::Nothing
    )
}

// ---- arguments ------------------------------------------------------------------------

/// `lo..=hi` or the named error.
pub fn parse_int(arg: &[u8], lo: i64, hi: i64, err: &'static str) -> Result<i64, &'static str> {
    match parse_i64(arg) {
        Some(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(err),
    }
}

/// Which options a command takes besides `ID request-id` (which all writes take).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Allowed {
    pub wait: bool,
    pub px: bool,
    pub permits: bool,
}

/// The trailing options of a synchronizer command, in any order, each at most once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options<'a> {
    /// `WAIT timeout-ms`; `Some(0)` waits without limit (Redis's convention).
    pub wait: Option<i64>,
    /// `ID request-id`: a retry with the same id gets the first call's reply.
    pub id: Option<&'a [u8]>,
    /// `PX ttl-ms` (`TRYSETPERMITS`): the count's expiry.
    pub px: Option<i64>,
    /// `PERMITS n` (`RPSEMAPHORE.ACQUIRE`): several permits, ids replied as an array.
    pub permits: Option<i64>,
    /// `ASYNC` (with `WAIT` and `ID`): wait as a queued ticket (docs/commands/tickets.md).
    pub queued: bool,
    /// `NOTIFY tag` (with `ASYNC`): the ticket's own channel (docs/commands/tickets.md).
    pub notify: Option<&'a [u8]>,
    /// `QUIET` (with `ASYNC`): no reply when the ticket is queued (docs/commands/tickets.md).
    pub quiet: bool,
}

/// Parses `[WAIT timeout-ms [ASYNC [NOTIFY tag] [QUIET]]] [ID request-id] [PX ttl-ms] [PERMITS n]` as
/// `allowed` says.
pub fn parse_options<'a>(args: &[&'a [u8]], allowed: Allowed) -> Result<Options<'a>, &'static str> {
    let mut o = Options::default();
    let mut rest = args;
    loop {
        if let [flag, tail @ ..] = rest {
            if flag.eq_ignore_ascii_case(b"ASYNC") && allowed.wait && !o.queued {
                o.queued = true;
                rest = tail;
                continue;
            }
            if flag.eq_ignore_ascii_case(b"QUIET") && allowed.wait && !o.quiet {
                o.quiet = true;
                rest = tail;
                continue;
            }
        }
        let [option, value, tail @ ..] = rest else {
            break;
        };
        let is = |name: &[u8]| option.eq_ignore_ascii_case(name);
        if is(b"NOTIFY") && allowed.wait && o.notify.is_none() {
            o.notify = Some(args::parse_tag(value)?);
        } else if is(b"WAIT") && allowed.wait && o.wait.is_none() {
            o.wait = Some(parse_int(value, 0, MAX_MS, ERR_TIMEOUT)?);
        } else if is(b"ID") && o.id.is_none() {
            if value.is_empty() {
                return Err(ERR_EMPTY_ID);
            }
            o.id = Some(value);
        } else if is(b"PX") && allowed.px && o.px.is_none() {
            o.px = Some(parse_int(value, 1, MAX_MS, ERR_TTL)?);
        } else if is(b"PERMITS") && allowed.permits && o.permits.is_none() {
            o.permits = Some(parse_int(value, 1, MAX_PERMIT_IDS, ERR_PERMIT_COUNT)?);
        } else {
            return Err(ERR_SYNTAX);
        }
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(ERR_SYNTAX);
    }
    args::check_queued(o.queued, o.wait, o.id, o.notify, o.quiet)?;
    Ok(o)
}

/// `permits [PX ttl-ms] [ID request-id]` of `TRYSETPERMITS` (after the key).
pub fn parse_try_set<'a>(args: &[&'a [u8]]) -> Result<(i64, Options<'a>), &'static str> {
    let [permits, rest @ ..] = args else {
        return Err(ERR_SYNTAX);
    };
    let permits = parse_int(permits, 0, MAX_PERMITS, ERR_PERMITS)?;
    let allowed = Allowed {
        px: true,
        ..Allowed::default()
    };
    Ok((permits, parse_options(rest, allowed)?))
}

/// `delta [ID request-id]` of `ADDPERMITS`.
pub fn parse_add<'a>(args: &[&'a [u8]]) -> Result<(i64, Options<'a>), &'static str> {
    let [delta, rest @ ..] = args else {
        return Err(ERR_SYNTAX);
    };
    let delta = parse_int(delta, -MAX_PERMITS, MAX_PERMITS, ERR_PERMITS_DELTA)?;
    Ok((delta, parse_options(rest, Allowed::default())?))
}

/// `permits [WAIT timeout-ms] [ID request-id]` of `ACQUIRE`.
pub fn parse_acquire<'a>(args: &[&'a [u8]]) -> Result<(i64, Options<'a>), &'static str> {
    let [permits, rest @ ..] = args else {
        return Err(ERR_SYNTAX);
    };
    let permits = parse_int(permits, 0, MAX_PERMITS, ERR_PERMITS)?;
    let allowed = Allowed {
        wait: true,
        ..Allowed::default()
    };
    Ok((permits, parse_options(rest, allowed)?))
}

/// `permits [ID request-id]` of `RELEASE`.
pub fn parse_release<'a>(args: &[&'a [u8]]) -> Result<(i64, Options<'a>), &'static str> {
    let [permits, rest @ ..] = args else {
        return Err(ERR_SYNTAX);
    };
    let permits = parse_int(permits, 0, MAX_PERMITS, ERR_PERMITS)?;
    Ok((permits, parse_options(rest, Allowed::default())?))
}

/// `[ID request-id]` of `DRAIN` (and of the latch's `COUNTDOWN`, `DELETE`).
pub fn parse_id_only<'a>(args: &[&'a [u8]]) -> Result<Option<&'a [u8]>, &'static str> {
    Ok(parse_options(args, Allowed::default())?.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::errors::{ERR_NOTIFY_ASYNC, ERR_NOTIFY_TAG, ERR_QUIET_ASYNC};

    fn sem(n: i64) -> SemState {
        SemState { available: Some(n) }
    }
    const NONE: SemState = SemState { available: None };

    #[test]
    fn a_plan_is_alone_when_nothing_follows_its_effects() {
        let plan = |wake, message: Option<&[u8]>| Plan {
            wake,
            message: message.map(<[u8]>::to_vec),
            ..Plan::new(sem(1), Reply::Int(1), Outcome::Acquired)
        };
        assert!(plan(false, None).alone(false));
        assert!(
            !plan(false, None).alone(true),
            "a request-id record follows"
        );
        assert!(!plan(true, None).alone(false), "a grant may follow");
        assert!(!plan(false, Some(b"1")).alone(false), "a message follows");
    }

    #[test]
    fn channel_follows_prefix_name() {
        assert_eq!(channel(b"s"), b"redisson_sc:{s}".to_vec());
        assert_eq!(channel(b"{app}:s"), b"redisson_sc:{app}:s".to_vec());
    }

    #[test]
    fn it_reads_only_decimal_counts() {
        assert_eq!(parse_state(None), Ok(NONE));
        assert_eq!(parse_state(Some(b"-3")), Ok(sem(-3)));
        for bad in [&b"x"[..], b"1.5", b" 1", b"", b"99999999999999999999"] {
            assert_eq!(parse_state(Some(bad)), Err(ERR_NOT_A_SEMAPHORE), "{bad:?}");
        }
    }

    #[test]
    fn try_set_permits_only_creates() {
        // (state, permits, ttl, reply, effects, message)
        let p = try_set_permits(&NONE, 3, None, 1000);
        assert_eq!(p.reply, Reply::Int(1));
        assert_eq!(
            p.effects.to_vec(),
            vec![Effect::Set(KeyRef::Main, b"3".to_vec().into(), None)]
        );
        assert_eq!(p.message, Some(b"3".to_vec()));
        assert!(p.wake);
        assert_eq!(p.state, sem(3));
        let p = try_set_permits(&NONE, 2, Some(500), 1000);
        assert_eq!(
            p.effects.to_vec(),
            vec![Effect::Set(KeyRef::Main, b"2".to_vec().into(), Some(1500))]
        );
        let p = try_set_permits(&NONE, 0, None, 1000);
        assert!(!p.wake, "zero permits serve nobody");
        assert_eq!(
            p.message,
            Some(b"0".to_vec()),
            "Redisson publishes the permits"
        );
        let p = try_set_permits(&sem(1), 5, None, 1000);
        assert_eq!((p.reply, p.outcome), (Reply::Int(0), Outcome::NotSet));
        assert!(p.effects.is_empty() && p.message.is_none() && !p.wake);
    }

    #[test]
    fn acquire_takes_permits_when_there_and_nobody_queued() {
        // (state, permits, queued, reply, state after)
        for (state, permits, queued, reply, after) in [
            (sem(3), 2, false, 1, sem(1)),
            (sem(3), 3, false, 1, sem(0)),
            (sem(3), 4, false, 0, sem(3)),
            (sem(3), 1, true, 0, sem(3)),
            (NONE, 1, false, 0, NONE),
            (sem(-2), 1, false, 0, sem(-2)),
            (NONE, 0, true, 1, NONE),
            (sem(-1), 0, false, 1, sem(-1)),
        ] {
            let p = acquire(&state, permits, queued);
            assert_eq!(p.reply, Reply::Int(reply), "{state:?} {permits} {queued}");
            assert_eq!(p.state, after);
            assert!(p.message.is_none() && !p.wake);
        }
        assert_eq!(
            acquire(&sem(3), 2, false).effects.to_vec(),
            vec![Effect::IncrBy(KeyRef::Main, -2, 1)]
        );
    }

    #[test]
    fn release_adds_permits_and_publishes_the_new_count() {
        let p = release(&sem(1), 2).unwrap();
        assert_eq!(p.effects.to_vec(), vec![Effect::IncrBy(KeyRef::Main, 2, 3)]);
        assert_eq!(
            (p.reply.clone(), p.message.clone(), p.wake),
            (Reply::Int(3), Some(b"3".to_vec()), true)
        );
        let p = release(&NONE, 1).unwrap();
        assert_eq!(p.state, sem(1), "INCRBY creates the key");
        let p = release(&sem(4), 0).unwrap();
        assert!(p.effects.is_empty() && !p.wake && p.reply == Reply::Int(4));
        assert_eq!(
            release(&sem(i64::MAX), 1).unwrap_err(),
            ERR_PERMITS_OVERFLOW
        );
    }

    #[test]
    fn add_permits_sets_the_new_count_and_may_go_negative() {
        let p = add_permits(&sem(1), -3).unwrap();
        assert_eq!(
            p.effects.to_vec(),
            vec![Effect::Set(KeyRef::Main, b"-2".to_vec().into(), None)]
        );
        assert_eq!(p.message, Some(b"-2".to_vec()));
        assert!(!p.wake, "fewer permits serve nobody new");
        let p = add_permits(&NONE, 4).unwrap();
        assert_eq!((p.state, p.wake), (sem(4), true));
        assert_eq!(
            add_permits(&sem(i64::MIN), -1).unwrap_err(),
            ERR_PERMITS_OVERFLOW
        );
    }

    #[test]
    fn drain_takes_everything_and_resets_to_zero() {
        let p = drain(&sem(5));
        assert_eq!((p.reply.clone(), p.state), (Reply::Int(5), sem(0)));
        assert_eq!(
            p.effects.to_vec(),
            vec![Effect::Set(KeyRef::Main, b"0".to_vec().into(), None)]
        );
        assert!(p.message.is_none());
        assert_eq!(
            drain(&sem(-2)).reply,
            Reply::Int(-2),
            "Redisson returns a negative count as is"
        );
        let p = drain(&NONE);
        assert!(p.effects.is_empty() && p.reply == Reply::Int(0));
    }

    #[test]
    fn grant_serves_the_head_only_when_its_permits_are_there() {
        assert!(grant(&sem(4), &Request { permits: 5 }, 0).is_none());
        let p = grant(&sem(5), &Request { permits: 5 }, 0).unwrap();
        assert_eq!(p.state, sem(0));
        assert!(grant(&NONE, &Request { permits: 1 }, 0).is_none());
    }

    #[test]
    fn the_message_after_grants_is_capped_by_what_is_left() {
        assert_eq!(message_after_grants(Some(b"5"), 2), Some(b"2".to_vec()));
        assert_eq!(message_after_grants(Some(b"5"), 9), Some(b"5".to_vec()));
        assert_eq!(message_after_grants(Some(b"5"), 0), None);
        assert_eq!(message_after_grants(Some(b"-1"), 3), None);
        assert_eq!(message_after_grants(None, 3), None);
    }

    #[test]
    fn only_calls_that_changed_something_are_remembered() {
        assert!(remembers(acquire(&sem(1), 1, false).outcome));
        assert!(remembers(try_set_permits(&NONE, 1, None, 0).outcome));
        assert!(!remembers(acquire(&sem(0), 1, false).outcome));
        assert!(!remembers(try_set_permits(&sem(1), 1, None, 0).outcome));
        assert!(!remembers(drain(&NONE).outcome));
    }

    #[test]
    fn parsers_name_the_bad_argument() {
        // (parser input, expected)
        fn a<'a>(args: &[&'a str]) -> Vec<&'a [u8]> {
            args.iter().map(|s| s.as_bytes()).collect()
        }
        assert_eq!(parse_acquire(&a(&["2"])).unwrap().0, 2);
        let (n, o) = parse_acquire(&a(&["1", "wait", "100", "ID", "r1"])).unwrap();
        assert_eq!((n, o.wait, o.id), (1, Some(100), Some(&b"r1"[..])));
        let (_, o) =
            parse_acquire(&a(&["1", "NOTIFY", "t1", "WAIT", "0", "ASYNC", "ID", "r"])).unwrap();
        assert_eq!(
            (o.queued, o.notify, o.quiet),
            (true, Some(&b"t1"[..]), false)
        );
        let (_, o) = parse_acquire(&a(&["1", "WAIT", "0", "QUIET", "ASYNC", "ID", "r"])).unwrap();
        assert!(o.queued && o.quiet);
        for (args, err) in [
            (a(&["1", "WAIT", "1", "ID", "r", "QUIET"]), ERR_QUIET_ASYNC),
            (
                a(&["1", "WAIT", "1", "ASYNC", "ID", "r", "QUIET", "QUIET"]),
                ERR_SYNTAX,
            ),
            (a(&[]), ERR_SYNTAX),
            (a(&["-1"]), ERR_PERMITS),
            (a(&["2147483648"]), ERR_PERMITS),
            (a(&["x"]), ERR_PERMITS),
            (a(&["1", "WAIT"]), ERR_SYNTAX),
            (a(&["1", "WAIT", "-1"]), ERR_TIMEOUT),
            (a(&["1", "WAIT", "1", "WAIT", "1"]), ERR_SYNTAX),
            (a(&["1", "ID", ""]), ERR_EMPTY_ID),
            (a(&["1", "ID", "a", "ID", "b"]), ERR_SYNTAX),
            (a(&["1", "PX", "10"]), ERR_SYNTAX),
            (a(&["1", "NOPE", "1"]), ERR_SYNTAX),
            (
                a(&["1", "WAIT", "1", "ID", "r", "NOTIFY", "t"]),
                ERR_NOTIFY_ASYNC,
            ),
            (
                a(&["1", "WAIT", "1", "ASYNC", "ID", "r", "NOTIFY", "{t}"]),
                ERR_NOTIFY_TAG,
            ),
            (
                a(&[
                    "1", "WAIT", "1", "ASYNC", "ID", "r", "NOTIFY", "t", "NOTIFY", "t",
                ]),
                ERR_SYNTAX,
            ),
        ] {
            assert_eq!(parse_acquire(&args), Err(err), "{args:?}");
        }
        assert_eq!(
            parse_try_set(&a(&["3", "PX", "100"])).unwrap().1.px,
            Some(100)
        );
        assert_eq!(parse_try_set(&a(&["3", "PX", "0"])), Err(ERR_TTL));
        assert_eq!(parse_try_set(&a(&["3", "WAIT", "1"])), Err(ERR_SYNTAX));
        assert_eq!(parse_try_set(&a(&["3", "NOTIFY", "t"])), Err(ERR_SYNTAX));
        assert_eq!(parse_try_set(&a(&["3", "QUIET"])), Err(ERR_SYNTAX));
        assert_eq!(parse_add(&a(&["-5"])).unwrap().0, -5);
        assert_eq!(parse_add(&a(&["-2147483648"])), Err(ERR_PERMITS_DELTA));
        assert_eq!(
            parse_release(&a(&["1", "ID", "x"])).unwrap().1.id,
            Some(&b"x"[..])
        );
        assert_eq!(parse_id_only(&a(&[])), Ok(None));
        assert_eq!(parse_id_only(&a(&["ID"])), Err(ERR_SYNTAX));
    }

    mod model {
        use super::super::*;
        use proptest::prelude::*;
        use std::collections::VecDeque;

        #[derive(Debug, Clone)]
        enum Op {
            TrySet(i64),
            Add(i64),
            /// permits, waits if refused
            Acquire(i64, bool),
            /// releases the i-th current holding (modulo)
            Release(usize),
            Drain,
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0..6i64).prop_map(Op::TrySet),
                (-4..6i64).prop_map(Op::Add),
                (0..6i64, any::<bool>()).prop_map(|(n, w)| Op::Acquire(n, w)),
                any::<usize>().prop_map(Op::Release),
                Just(Op::Drain),
            ]
        }

        /// A simulated engine: the key's state, the queue, what is held, and the total
        /// the permits should add up to.
        struct Sim {
            s: SemState,
            queue: VecDeque<(u64, i64)>,
            held: Vec<i64>,
            total: i64,
            granted: Vec<u64>,
            next_seq: u64,
            /// A negative ADDPERMITS happened: Redisson lets the count go below zero then.
            shrunk: bool,
        }

        impl Sim {
            fn check(&self) -> Result<(), TestCaseError> {
                let held: i64 = self.held.iter().sum();
                prop_assert_eq!(self.s.available() + held, self.total, "permits conserved");
                prop_assert!(
                    self.shrunk || self.s.available() >= 0,
                    "never negative unless a caller took permits away"
                );
                Ok(())
            }

            fn serve(&mut self) -> Result<(), TestCaseError> {
                while let Some(&(seq, permits)) = self.queue.front() {
                    let Some(plan) = grant(&self.s, &Request { permits }, 0) else {
                        prop_assert!(
                            self.s.available() < permits,
                            "stopped with the head servable"
                        );
                        break;
                    };
                    prop_assert!(plan.state.available() >= 0, "a grant never overdraws");
                    self.s = plan.state;
                    self.queue.pop_front();
                    self.held.push(permits);
                    self.granted.push(seq);
                }
                Ok(())
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(1000))]

            #[test]
            fn permits_are_conserved_and_waiters_served_in_order(
                ops in proptest::collection::vec(op(), 1..60)
            ) {
                let mut sim = Sim {
                    s: SemState::default(),
                    queue: VecDeque::new(),
                    held: vec![],
                    total: 0,
                    granted: vec![],
                    next_seq: 0,
                    shrunk: false,
                };
                for op in ops {
                    let plan = match op {
                        Op::TrySet(n) => {
                            let p = try_set_permits(&sim.s, n, None, 0);
                            if p.outcome == Outcome::Set {
                                sim.total = n + sim.held.iter().sum::<i64>();
                            }
                            p
                        }
                        Op::Add(d) => { sim.total += d; sim.shrunk |= d < 0; add_permits(&sim.s, d).unwrap() }
                        Op::Acquire(n, wait) => {
                            let p = acquire(&sim.s, n, !sim.queue.is_empty());
                            if p.outcome == Outcome::Acquired {
                                prop_assert!(n == 0 || sim.queue.is_empty(), "no overtaking");
                                sim.held.push(n);
                            } else if wait {
                                sim.queue.push_back((sim.next_seq, n));
                            }
                            sim.next_seq += 1;
                            p
                        }
                        Op::Release(i) => {
                            if sim.held.is_empty() { continue; }
                            let n = sim.held.swap_remove(i % sim.held.len());
                            release(&sim.s, n).unwrap()
                        }
                        Op::Drain => {
                            let p = drain(&sim.s);
                            if let Reply::Int(n) = p.reply { sim.total -= n; }
                            p
                        }
                    };
                    sim.s = plan.state;
                    sim.check()?;
                    if plan.wake { sim.serve()?; }
                    sim.check()?;
                }
                prop_assert!(sim.granted.windows(2).all(|w| w[0] < w[1]), "FIFO: {:?}", sim.granted);
            }
        }
    }
}
