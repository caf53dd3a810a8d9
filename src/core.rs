//! The lock algorithm, pure: no Redis, no clock, no I/O.
//!
//! Given what the key holds now, the caller's owner id, the lease and the current time,
//! each function returns a [`Plan`]: what to write (in the order delete, write, expire)
//! and what to reply. The glue in `commands.rs` reads the key into a [`LockState`], runs
//! the plan through `store.rs`, and replies. Keeping this free of Redis types is what lets
//! every branch be tested as a table, without a server.
//!
//! The data model is Redisson's on purpose: a hash whose fields are owner ids and whose
//! values are hold counts, with the key's TTL as the lease. A lock nobody holds does not
//! exist as a key.

use crate::errors::{
    ERR_ASYNC, ERR_COUNT_OVERFLOW, ERR_EMPTY_ID, ERR_EMPTY_OWNER, ERR_LEASE, ERR_NOT_A_LOCK,
    ERR_SYNTAX, ERR_TIMEOUT,
};

/// The longest lease or wait a caller may ask for: 100 years in milliseconds. Bounded so
/// that `now + lease` can never overflow an absolute expiry, whatever the clock says.
pub const MAX_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

/// One owner's entry in the lock hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub owner: Vec<u8>,
    pub count: i64,
}

/// What the lock key holds, as far as the algorithm cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState {
    /// No key: nobody holds the lock.
    Free,
    /// A valid lock hash. `pttl` is the remaining lease in ms, or -1 for a key with no TTL.
    Held { holders: Vec<Holder>, pttl: i64 },
}

impl LockState {
    /// The caller's hold count, if it holds the lock.
    pub fn count_of(&self, owner: &[u8]) -> Option<i64> {
        match self {
            LockState::Free => None,
            LockState::Held { holders, .. } => {
                holders.iter().find(|h| h.owner == owner).map(|h| h.count)
            }
        }
    }
}

/// A hash-field write for the owner a plan is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// `HSET key owner <n>` on a key that has no such field (a new lock or a handoff).
    Set(i64),
    /// `HINCRBY key owner <delta>`; the second value is the count after the increment, so
    /// the store can write it directly without reading the field again.
    IncrBy(i64, i64),
    /// `HDEL key owner`: the owner leaves a hash that other owners still hold.
    Remove,
}

/// The reply a command sends when it answers at once: the lock only ever answers nil or
/// an integer, so its plans stay `Copy`; `reply::Reply` (which converts from it) is every
/// primitive's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
}

/// What happened, for the `INFO rlock` counters and for the glue's next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Acquired,
    Reentered,
    /// Held by another owner: a WAIT caller may block now.
    Contended,
    /// The owner's count went down but it still holds the lock.
    Decremented,
    /// The owner let go of its last hold; `Plan::freed` says whether the lock is now free.
    Released,
    NotHeld,
    Renewed,
    ForceReleased,
    NoLock,
}

/// Effects to apply, in this order: delete the key, write the owner's field, set the
/// absolute expiry. Then reply. No allocation: this is on every command's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub delete: bool,
    pub write: Option<Write>,
    /// Absolute expiry in ms since the epoch (replicated as PEXPIREAT).
    pub expire_at: Option<i64>,
    pub reply: Reply,
    pub outcome: Outcome,
    /// The lock became free: hand it to the first waiter, or publish the unlock message.
    pub freed: bool,
}

impl Plan {
    fn reply_only(reply: Reply, outcome: Outcome) -> Plan {
        Plan {
            delete: false,
            write: None,
            expire_at: None,
            reply,
            outcome,
            freed: false,
        }
    }

    /// True when the plan changes the keyspace.
    pub fn writes(&self) -> bool {
        self.delete || self.write.is_some() || self.expire_at.is_some()
    }
}

/// `RLOCK.ACQUIRE`: take a free lock, re-enter one we hold, or report the holder's PTTL.
pub fn acquire(
    state: &LockState,
    owner: &[u8],
    lease: i64,
    now: i64,
) -> Result<Plan, &'static str> {
    match state {
        LockState::Free => Ok(grant(false, lease, now)),
        LockState::Held { pttl, .. } => match state.count_of(owner) {
            Some(count) => {
                let next = count.checked_add(1).ok_or(ERR_COUNT_OVERFLOW)?;
                Ok(Plan {
                    delete: false,
                    write: Some(Write::IncrBy(1, next)),
                    expire_at: Some(now + lease),
                    reply: Reply::Nil,
                    outcome: Outcome::Reentered,
                    freed: false,
                })
            }
            None => Ok(Plan::reply_only(Reply::Int(*pttl), Outcome::Contended)),
        },
    }
}

/// The lock handed to (or created for) one owner: `{owner: 1}` expiring after its lease.
/// `replace` deletes whatever the key held first (a handoff over an overwritten key).
pub fn grant(replace: bool, lease: i64, now: i64) -> Plan {
    Plan {
        delete: replace,
        write: Some(Write::Set(1)),
        expire_at: Some(now + lease),
        reply: Reply::Nil,
        outcome: Outcome::Acquired,
        freed: false,
    }
}

/// The engine's rule for a queued ACQUIRE at the head of its key's queue (the shape the
/// other primitives' `grant` functions share): `Ok(plan)` when the head can have the lock
/// now, `Err(pttl)` while another holds it (the engine looks again at the lease's end).
///
/// A key that holds something other than a lock (`Err` state: overwritten by SET, RENAME,
/// RESTORE...) counts as free: the waiters were promised the lock at this key, so the head
/// gets it, replacing the value. One holder at a time: after one grant, nobody behind
/// the head can be granted, so the engine grants at most one per look.
pub fn grant_head(state: &Result<LockState, &str>, lease: i64, now: i64) -> Result<Plan, i64> {
    match state {
        Ok(LockState::Held { pttl, .. }) => Err(*pttl),
        Ok(LockState::Free) => Ok(grant(false, lease, now)),
        Err(_) => Ok(grant(true, lease, now)),
    }
}

/// `RLOCK.RELEASE`: count down; the last release frees the lock.
pub fn release(state: &LockState, owner: &[u8], lease: Option<i64>, now: i64) -> Plan {
    let (holders, count) = match (state, state.count_of(owner)) {
        (LockState::Held { holders, .. }, Some(count)) => (holders, count),
        _ => return Plan::reply_only(Reply::Nil, Outcome::NotHeld),
    };
    if count > 1 {
        return Plan {
            delete: false,
            write: Some(Write::IncrBy(-1, count - 1)),
            expire_at: lease.map(|l| now + l),
            reply: Reply::Int(0),
            outcome: Outcome::Decremented,
            freed: false,
        };
    }
    // Redisson never writes two owners into one lock, but a hash shared by several owners
    // is still a valid lock; the last one out frees it.
    let last = holders.len() == 1;
    Plan {
        delete: last,
        write: (!last).then_some(Write::Remove),
        expire_at: None,
        reply: Reply::Int(1),
        outcome: Outcome::Released,
        freed: last,
    }
}

/// `RLOCK.RENEW`: re-arm the lease of a lock the owner holds; the count is unchanged.
pub fn renew(state: &LockState, owner: &[u8], lease: i64, now: i64) -> Plan {
    match state.count_of(owner) {
        Some(_) => Plan {
            delete: false,
            write: None,
            expire_at: Some(now + lease),
            reply: Reply::Int(1),
            outcome: Outcome::Renewed,
            freed: false,
        },
        None => Plan::reply_only(Reply::Int(0), Outcome::NotHeld),
    }
}

/// `RLOCK.FORCERELEASE`: free the lock whoever holds it (Redisson's forceUnlock).
pub fn force_release(state: &LockState) -> Plan {
    match state {
        LockState::Free => Plan::reply_only(Reply::Int(0), Outcome::NoLock),
        LockState::Held { .. } => Plan {
            delete: true,
            write: None,
            expire_at: None,
            reply: Reply::Int(1),
            outcome: Outcome::ForceReleased,
            freed: true,
        },
    }
}

/// Reads hash fields into holders. Every value must be a positive decimal integer, or the
/// hash is not a lock and no command may touch it (it is somebody else's data).
pub fn parse_holders<F, V>(
    fields: impl IntoIterator<Item = (F, V)>,
) -> Result<Vec<Holder>, &'static str>
where
    F: Into<Vec<u8>>,
    V: AsRef<[u8]>,
{
    let holders = fields
        .into_iter()
        .map(|(owner, value)| match parse_i64(value.as_ref()) {
            Some(count) if count >= 1 => Ok(Holder {
                owner: owner.into(),
                count,
            }),
            _ => Err(ERR_NOT_A_LOCK),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if holders.is_empty() {
        // Redis deletes empty hashes, so this cannot be read from a key; refuse it anyway.
        return Err(ERR_NOT_A_LOCK);
    }
    Ok(holders)
}

/// Parses a decimal integer the way Redis writes them: optional '-', digits, no '+', no
/// spaces, no leading zeros. Anything else is not a number to us.
pub fn parse_i64(bytes: &[u8]) -> Option<i64> {
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    if digits.is_empty()
        || !digits.iter().all(u8::is_ascii_digit)
        || (digits.len() > 1 && digits[0] == b'0')
        || (digits == b"0" && digits.len() != bytes.len())
    {
        return None;
    }
    // One pass, checked: this runs on every lock read (the hold count) and every lease.
    let negative = digits.len() != bytes.len();
    let mut n: i64 = 0;
    for &d in digits {
        let d = i64::from(d - b'0');
        n = n.checked_mul(10)?;
        n = if negative {
            n.checked_sub(d)?
        } else {
            n.checked_add(d)?
        };
    }
    Some(n)
}

fn parse_ms(bytes: &[u8], min: i64, err: &'static str) -> Result<i64, &'static str> {
    match parse_i64(bytes) {
        Some(ms) if (min..=MAX_MS).contains(&ms) => Ok(ms),
        _ => Err(err),
    }
}

fn parse_owner(bytes: &[u8]) -> Result<&[u8], &'static str> {
    if bytes.is_empty() {
        Err(ERR_EMPTY_OWNER)
    } else {
        Ok(bytes)
    }
}

/// Arguments of `RLOCK.ACQUIRE key owner lease-ms [WAIT timeout-ms]` after the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireArgs<'a> {
    pub owner: &'a [u8],
    pub lease: i64,
    /// `Some(0)` waits without limit (Redis's convention for blocking commands).
    pub wait: Option<i64>,
    /// `ID request-id`: a retry with the same id gets the first call's reply.
    pub id: Option<&'a [u8]>,
    /// `ASYNC`: wait as a queued ticket, not blocked (docs/tickets.md).
    pub queued: bool,
}

/// Arguments of `RLOCK.RELEASE key owner [lease-ms] [ID request-id]` after the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseArgs<'a> {
    pub owner: &'a [u8],
    pub lease: Option<i64>,
    pub id: Option<&'a [u8]>,
}

fn is_option(arg: &[u8], name: &[u8]) -> bool {
    arg.eq_ignore_ascii_case(name)
}

fn parse_id<'a>(arg: &'a [u8], seen: &Option<&'a [u8]>) -> Result<&'a [u8], &'static str> {
    match (seen, arg.is_empty()) {
        (Some(_), _) => Err(ERR_SYNTAX),
        (None, true) => Err(ERR_EMPTY_ID),
        (None, false) => Ok(arg),
    }
}

/// Parses `owner lease-ms [WAIT timeout-ms [ASYNC]] [ID request-id]`, options in any
/// order. The arity was checked by the caller.
pub fn parse_acquire<'a>(args: &[&'a [u8]]) -> Result<AcquireArgs<'a>, &'static str> {
    let owner = parse_owner(args[0])?;
    let lease = parse_ms(args[1], 1, ERR_LEASE)?;
    let (mut wait, mut id, mut queued) = (None, None, false);
    let mut rest = &args[2..];
    loop {
        rest = match rest {
            [] => break,
            [flag, tail @ ..] if is_option(flag, b"ASYNC") && !queued => {
                queued = true;
                tail
            }
            [option, value, tail @ ..] if is_option(option, b"WAIT") && wait.is_none() => {
                wait = Some(parse_ms(value, 0, ERR_TIMEOUT)?);
                tail
            }
            [option, value, tail @ ..] if is_option(option, b"ID") => {
                id = Some(parse_id(value, &id)?);
                tail
            }
            _ => return Err(ERR_SYNTAX),
        };
    }
    check_queued(queued, wait, id)?;
    Ok(AcquireArgs {
        owner,
        lease,
        wait,
        id,
        queued,
    })
}

/// `ASYNC` needs `WAIT` (it is a way of waiting) and `ID` (the grant is collected by it).
pub fn check_queued(
    queued: bool,
    wait: Option<i64>,
    id: Option<&[u8]>,
) -> Result<(), &'static str> {
    if queued && (wait.is_none() || id.is_none()) {
        Err(ERR_ASYNC)
    } else {
        Ok(())
    }
}

/// Parses `owner [lease-ms] [ID request-id]` of `RLOCK.RELEASE`.
pub fn parse_release<'a>(args: &[&'a [u8]]) -> Result<ReleaseArgs<'a>, &'static str> {
    let owner = parse_owner(args[0])?;
    let mut rest = &args[1..];
    let mut lease = None;
    if let [first, tail @ ..] = rest {
        if !is_option(first, b"ID") {
            lease = Some(parse_ms(first, 1, ERR_LEASE)?);
            rest = tail;
        }
    }
    let id = match rest {
        [] => None,
        [option, value] if is_option(option, b"ID") => Some(parse_id(value, &None)?),
        _ => return Err(ERR_SYNTAX),
    };
    Ok(ReleaseArgs { owner, lease, id })
}

/// The key that remembers a request id's first reply, in the lock's cluster slot (the
/// same `prefixName` rule as the unlock channel, like Redisson's unlock latch).
pub fn request_key(key: &[u8], id: &[u8]) -> Vec<u8> {
    let mut name = unlock_channel_with(b"rlock_request:", key);
    name.push(b':');
    name.extend_from_slice(id);
    name
}

/// Only calls that changed the lock are remembered: re-running a call that changed
/// nothing (a contended ACQUIRE, a RELEASE by a non-holder) is as good as replaying it.
pub fn remembers(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Acquired | Outcome::Reentered | Outcome::Decremented | Outcome::Released
    )
}

/// Parses `owner lease-ms` of `RLOCK.RENEW`.
pub fn parse_renew<'a>(args: &[&'a [u8]]) -> Result<(&'a [u8], i64), &'static str> {
    Ok((parse_owner(args[0])?, parse_ms(args[1], 1, ERR_LEASE)?))
}

/// The unlock channel of a lock, by Redisson's `prefixName` rule: the key goes in braces
/// (so the channel hashes to the lock's cluster slot) unless it already has a `{`.
pub fn unlock_channel(key: &[u8]) -> Vec<u8> {
    unlock_channel_with(b"redisson_lock__channel:", key)
}

fn unlock_channel_with(prefix: &[u8], key: &[u8]) -> Vec<u8> {
    let mut channel = Vec::with_capacity(prefix.len() + key.len() + 2);
    channel.extend_from_slice(prefix);
    if key.contains(&b'{') {
        channel.extend_from_slice(key);
    } else {
        channel.push(b'{');
        channel.extend_from_slice(key);
        channel.push(b'}');
    }
    channel
}

/// The message Redisson's LockPubSub treats as "unlocked".
pub const UNLOCK_MESSAGE: &[u8] = b"0";

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000;

    fn held(holders: &[(&str, i64)], pttl: i64) -> LockState {
        LockState::Held {
            holders: holders
                .iter()
                .map(|(o, c)| Holder {
                    owner: o.as_bytes().to_vec(),
                    count: *c,
                })
                .collect(),
            pttl,
        }
    }

    fn plan(
        delete: bool,
        write: Option<Write>,
        expire_at: Option<i64>,
        reply: Reply,
        outcome: Outcome,
        freed: bool,
    ) -> Plan {
        Plan {
            delete,
            write,
            expire_at,
            reply,
            outcome,
            freed,
        }
    }

    #[test]
    fn acquire_table() {
        use Outcome::*;
        use Reply::*;
        let rows: Vec<(&str, LockState, &str, Plan)> = vec![
            // A free lock is created for the caller with its lease.
            (
                "it_creates_a_free_lock",
                LockState::Free,
                "a",
                plan(
                    false,
                    Some(Write::Set(1)),
                    Some(NOW + 100),
                    Nil,
                    Acquired,
                    false,
                ),
            ),
            // The holder re-enters: count + 1 and the lease re-armed.
            (
                "it_reenters_for_the_holder",
                held(&[("a", 2)], 5),
                "a",
                plan(
                    false,
                    Some(Write::IncrBy(1, 3)),
                    Some(NOW + 100),
                    Nil,
                    Reentered,
                    false,
                ),
            ),
            // Another owner gets the holder's PTTL and nothing changes.
            (
                "it_reports_pttl_to_others",
                held(&[("a", 1)], 42),
                "b",
                plan(false, None, None, Int(42), Contended, false),
            ),
            // A lock with no TTL reports -1, like PTTL.
            (
                "it_reports_minus_one_without_ttl",
                held(&[("a", 1)], -1),
                "b",
                plan(false, None, None, Int(-1), Contended, false),
            ),
        ];
        for (name, state, owner, want) in rows {
            assert_eq!(
                acquire(&state, owner.as_bytes(), 100, NOW).unwrap(),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn it_refuses_a_reentry_that_would_overflow() {
        let state = held(&[("a", i64::MAX)], 5);
        assert_eq!(acquire(&state, b"a", 100, NOW), Err(ERR_COUNT_OVERFLOW));
    }

    #[test]
    fn release_table() {
        use Outcome::*;
        use Reply::*;
        let rows: Vec<(&str, LockState, &str, Option<i64>, Plan)> = vec![
            // Count > 1 goes down and keeps the expiry when no lease is given.
            (
                "it_decrements_without_rearming",
                held(&[("a", 3)], 5),
                "a",
                None,
                plan(
                    false,
                    Some(Write::IncrBy(-1, 2)),
                    None,
                    Int(0),
                    Decremented,
                    false,
                ),
            ),
            // Count > 1 with a lease re-arms the expiry.
            (
                "it_decrements_and_rearms",
                held(&[("a", 2)], 5),
                "a",
                Some(50),
                plan(
                    false,
                    Some(Write::IncrBy(-1, 1)),
                    Some(NOW + 50),
                    Int(0),
                    Decremented,
                    false,
                ),
            ),
            // The last hold frees the lock.
            (
                "it_frees_on_the_last_hold",
                held(&[("a", 1)], 5),
                "a",
                Some(50),
                plan(true, None, None, Int(1), Released, true),
            ),
            // One owner of a shared hash leaves; the others still hold it.
            (
                "it_leaves_a_shared_hash_held",
                held(&[("a", 1), ("b", 1)], 5),
                "a",
                None,
                plan(false, Some(Write::Remove), None, Int(1), Released, false),
            ),
            // A non-owner changes nothing.
            (
                "it_rejects_release_by_non_owner",
                held(&[("a", 1)], 5),
                "b",
                None,
                plan(false, None, None, Nil, NotHeld, false),
            ),
            // Nothing to release.
            (
                "it_rejects_release_of_a_free_lock",
                LockState::Free,
                "a",
                None,
                plan(false, None, None, Nil, NotHeld, false),
            ),
        ];
        for (name, state, owner, lease, want) in rows {
            assert_eq!(
                release(&state, owner.as_bytes(), lease, NOW),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn renew_and_force_release_table() {
        use Outcome::*;
        use Reply::*;
        // The holder renews: expiry re-armed, count untouched.
        assert_eq!(
            renew(&held(&[("a", 2)], 5), b"a", 70, NOW),
            plan(false, None, Some(NOW + 70), Int(1), Renewed, false)
        );
        // A non-holder cannot renew.
        assert_eq!(
            renew(&held(&[("a", 2)], 5), b"b", 70, NOW),
            plan(false, None, None, Int(0), NotHeld, false)
        );
        assert_eq!(
            renew(&LockState::Free, b"b", 70, NOW),
            plan(false, None, None, Int(0), NotHeld, false)
        );
        // Force release frees whatever the count.
        assert_eq!(
            force_release(&held(&[("a", 9)], 5)),
            plan(true, None, None, Int(1), ForceReleased, true)
        );
        assert_eq!(
            force_release(&LockState::Free),
            plan(false, None, None, Int(0), NoLock, false)
        );
    }

    #[test]
    fn it_grants_with_or_without_replacing() {
        assert!(grant(true, 10, NOW).delete);
        assert_eq!(
            grant_head(&Ok(LockState::Free), 10, NOW),
            Ok(grant(false, 10, NOW))
        );
        assert_eq!(
            grant_head(&Err("WRONGTYPE"), 10, NOW),
            Ok(grant(true, 10, NOW))
        );
        let held = LockState::Held {
            holders: vec![],
            pttl: 42,
        };
        assert_eq!(grant_head(&Ok(held), 10, NOW), Err(42));
        assert_eq!(grant(false, 10, NOW).expire_at, Some(NOW + 10));
    }

    #[test]
    fn parse_holders_table() {
        let ok = |v: &[(&str, &str)]| {
            parse_holders(v.iter().map(|(f, v)| (f.as_bytes().to_vec(), v.as_bytes())))
        };
        assert_eq!(
            ok(&[("a", "2")]).unwrap(),
            vec![Holder {
                owner: b"a".to_vec(),
                count: 2
            }]
        );
        // Zero, negative, non-numeric, padded and float values are not hold counts.
        for bad in ["0", "-1", "x", " 1", "1.5", "01", "+1", ""] {
            assert_eq!(ok(&[("a", bad)]), Err(ERR_NOT_A_LOCK), "{bad:?}");
        }
        assert_eq!(ok(&[]), Err(ERR_NOT_A_LOCK));
    }

    #[test]
    fn parse_i64_table() {
        for (input, want) in [
            ("0", Some(0)),
            ("7", Some(7)),
            ("-7", Some(-7)),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", None),
            ("-0", None),
            ("007", None),
            ("+7", None),
            ("7 ", None),
            ("", None),
            ("-", None),
            ("1e3", None),
        ] {
            assert_eq!(parse_i64(input.as_bytes()), want, "{input:?}");
        }
    }

    #[test]
    fn parse_acquire_table() {
        fn p<'a>(a: &[&'a str]) -> Result<AcquireArgs<'a>, &'static str> {
            parse_acquire(&a.iter().map(|s| s.as_bytes()).collect::<Vec<_>>())
        }
        assert_eq!(
            p(&["o", "100"]).unwrap(),
            AcquireArgs {
                owner: b"o",
                lease: 100,
                wait: None,
                id: None,
                queued: false
            }
        );
        assert_eq!(
            p(&["o", "100", "ID", "r1", "WAIT", "5"]).unwrap(),
            AcquireArgs {
                owner: b"o",
                lease: 100,
                wait: Some(5),
                id: Some(b"r1"),
                queued: false
            }
        );
        let queued = p(&["o", "100", "WAIT", "5", "async", "ID", "r1"]).unwrap();
        assert!(queued.queued && queued.wait == Some(5));
        assert!(
            p(&["o", "100", "ASYNC", "ID", "r1", "WAIT", "0"])
                .unwrap()
                .queued
        );
        assert_eq!(p(&["o", "100", "wait", "0"]).unwrap().wait, Some(0));
        assert_eq!(p(&["o", "100", "WAIT", "250"]).unwrap().wait, Some(250));
        for (args, err) in [
            (&["", "100"][..], ERR_EMPTY_OWNER),
            (&["o", "0"], ERR_LEASE),
            (&["o", "-5"], ERR_LEASE),
            (&["o", "abc"], ERR_LEASE),
            (&["o", "99999999999999999999"], ERR_LEASE),
            (&["o", "3153600000001"], ERR_LEASE),
            (&["o", "100", "WAIT"], ERR_SYNTAX),
            (&["o", "100", "WAIT", "-1"], ERR_TIMEOUT),
            (&["o", "100", "WAIT", "x"], ERR_TIMEOUT),
            (&["o", "100", "WAIT", "1", "WAIT", "2"], ERR_SYNTAX),
            (&["o", "100", "NOPE"], ERR_SYNTAX),
            (&["o", "100", "NOPE", "1"], ERR_SYNTAX),
            (&["o", "100", "ID"], ERR_SYNTAX),
            (&["o", "100", "ID", ""], ERR_EMPTY_ID),
            (&["o", "100", "ID", "a", "ID", "b"], ERR_SYNTAX),
            (&["o", "100", "ASYNC"], ERR_ASYNC),
            (&["o", "100", "WAIT", "5", "ASYNC"], ERR_ASYNC),
            (&["o", "100", "ID", "r", "ASYNC"], ERR_ASYNC),
            (
                &["o", "100", "WAIT", "5", "ASYNC", "ASYNC", "ID", "r"],
                ERR_SYNTAX,
            ),
        ] {
            assert_eq!(p(args), Err(err), "{args:?}");
        }
    }

    #[test]
    fn parse_release_and_renew_table() {
        let rel = |owner: &'static [u8], lease, id| Ok(ReleaseArgs { owner, lease, id });
        assert_eq!(parse_release(&[b"o"]), rel(b"o", None, None));
        assert_eq!(parse_release(&[b"o", b"10"]), rel(b"o", Some(10), None));
        assert_eq!(
            parse_release(&[b"o", b"id", b"r"]),
            rel(b"o", None, Some(&b"r"[..]))
        );
        assert_eq!(
            parse_release(&[b"o", b"10", b"ID", b"r"]),
            rel(b"o", Some(10), Some(&b"r"[..]))
        );
        assert_eq!(parse_release(&[b"o", b"0"]), Err(ERR_LEASE));
        assert_eq!(parse_release(&[b"o", b"10", b"x"]), Err(ERR_SYNTAX));
        assert_eq!(parse_release(&[b"o", b"10", b"ID"]), Err(ERR_SYNTAX));
        assert_eq!(parse_release(&[b"o", b"ID", b""]), Err(ERR_EMPTY_ID));
        assert_eq!(parse_release(&[b""]), Err(ERR_EMPTY_OWNER));
        assert_eq!(parse_renew(&[b"o", b"10"]), Ok((&b"o"[..], 10)));
        assert_eq!(parse_renew(&[b"o", b"ten"]), Err(ERR_LEASE));
    }

    #[test]
    fn request_ids_live_in_the_locks_slot_and_replies_round_trip() {
        assert_eq!(
            request_key(b"lock", b"r1"),
            b"rlock_request:{lock}:r1".to_vec()
        );
        assert_eq!(
            request_key(b"{a}:l", b"r1"),
            b"rlock_request:{a}:l:r1".to_vec()
        );
        assert!(
            remembers(Outcome::Reentered)
                && !remembers(Outcome::Contended)
                && !remembers(Outcome::NotHeld)
        );
    }

    #[test]
    fn unlock_channel_follows_redissons_prefix_rule() {
        assert_eq!(
            unlock_channel(b"lock"),
            b"redisson_lock__channel:{lock}".to_vec()
        );
        assert_eq!(
            unlock_channel(b"{app}:lock"),
            b"redisson_lock__channel:{app}:lock".to_vec()
        );
        assert_eq!(
            unlock_channel(b"a{b"),
            b"redisson_lock__channel:a{b".to_vec()
        );
    }
}

/// Property tests: arbitrary input to the parsers, and arbitrary operation sequences run
/// through the core against a simulated key, checked against the SPEC's rules.
#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn arg() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..12),
            Just(b"WAIT".to_vec()),
            Just(b"wait".to_vec()),
            Just(b"ID".to_vec()),
            any::<i64>().prop_map(|n| n.to_string().into_bytes()),
            (0..MAX_MS + 2).prop_map(|n| n.to_string().into_bytes()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn parsers_never_panic_and_accept_only_valid_values(args in proptest::collection::vec(arg(), 2..8)) {
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            if let Ok(a) = parse_acquire(&args) {
                prop_assert!(!a.owner.is_empty());
                prop_assert!((1..=MAX_MS).contains(&a.lease));
                prop_assert!(a.wait.is_none_or(|w| (0..=MAX_MS).contains(&w)));
                prop_assert!(a.id.is_none_or(|id| !id.is_empty()));
            }
            if let Ok(r) = parse_release(&args) {
                prop_assert!(!r.owner.is_empty());
                prop_assert!(r.lease.is_none_or(|l| (1..=MAX_MS).contains(&l)));
            }
            if let Ok((owner, lease)) = parse_renew(&args[..2]) {
                prop_assert!(!owner.is_empty() && (1..=MAX_MS).contains(&lease));
            }
        }

        #[test]
        fn parse_i64_agrees_with_canonical_formatting(n in any::<i64>(), junk in "[ +0a-z.]{0,2}") {
            prop_assert_eq!(parse_i64(n.to_string().as_bytes()), Some(n));
            let padded = format!("{junk}{n}");
            if !junk.is_empty() && padded != n.to_string() {
                prop_assert_eq!(parse_i64(padded.as_bytes()), None);
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(u8, i64),
        Release(u8, Option<i64>),
        Renew(u8, i64),
        Force,
        Tick(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..3u8, 1..100i64).prop_map(|(o, l)| Op::Acquire(o, l)),
            (0..3u8, proptest::option::of(1..100i64)).prop_map(|(o, l)| Op::Release(o, l)),
            (0..3u8, 1..100i64).prop_map(|(o, l)| Op::Renew(o, l)),
            Just(Op::Force),
            (1..60i64).prop_map(Op::Tick),
        ]
    }

    /// A simulated lock key: owner -> count, absolute expiry.
    #[derive(Debug, Default)]
    struct Key {
        fields: BTreeMap<Vec<u8>, i64>,
        expire_at: Option<i64>,
    }

    impl Key {
        fn state(&mut self, now: i64) -> LockState {
            if self.expire_at.is_some_and(|at| now >= at) {
                self.fields.clear();
                self.expire_at = None;
            }
            if self.fields.is_empty() {
                return LockState::Free;
            }
            let holders = self
                .fields
                .iter()
                .map(|(o, c)| Holder {
                    owner: o.clone(),
                    count: *c,
                })
                .collect();
            LockState::Held {
                holders,
                pttl: self.expire_at.map_or(-1, |at| at - now),
            }
        }

        fn apply(&mut self, owner: &[u8], plan: &Plan) {
            if plan.delete {
                self.fields.clear();
                self.expire_at = None;
            }
            match plan.write {
                Some(Write::Set(n)) => {
                    self.fields.insert(owner.to_vec(), n);
                }
                Some(Write::IncrBy(delta, next)) => {
                    let c = self.fields.entry(owner.to_vec()).or_insert(0);
                    assert_eq!(*c + delta, next, "IncrBy's result matches the field");
                    *c = next;
                }
                Some(Write::Remove) => {
                    self.fields.remove(owner);
                }
                None => {}
            }
            if let Some(at) = plan.expire_at {
                self.expire_at = Some(at);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// Whatever happens: one owner at most, counts stay positive, replies follow the
        /// SPEC, and the freed flag is set exactly when the key disappears.
        #[test]
        fn the_core_keeps_the_lock_invariants(ops in proptest::collection::vec(op(), 1..60)) {
            let mut key = Key::default();
            let mut now = 1_000_000i64;
            for op in ops {
                let state = key.state(now);
                let before: Option<Vec<u8>> = key.fields.keys().next().cloned();
                let (owner, plan) = match op {
                    Op::Tick(ms) => { now += ms; continue; }
                    Op::Acquire(o, lease) => {
                        let plan = acquire(&state, &[o], lease, now).unwrap();
                        match (&state, state.count_of(&[o])) {
                            (LockState::Free, _) | (_, Some(_)) => prop_assert_eq!(plan.reply, Reply::Nil),
                            (LockState::Held { pttl, .. }, None) => {
                                prop_assert_eq!(plan.reply, Reply::Int(*pttl));
                                prop_assert!(!plan.writes(), "a contended acquire writes nothing");
                            }
                        }
                        (vec![o], plan)
                    }
                    Op::Release(o, lease) => {
                        let plan = release(&state, &[o], lease, now);
                        let want = match state.count_of(&[o]) {
                            None => Reply::Nil,
                            Some(1) => Reply::Int(1),
                            Some(_) => Reply::Int(0),
                        };
                        prop_assert_eq!(plan.reply, want);
                        (vec![o], plan)
                    }
                    Op::Renew(o, lease) => {
                        let plan = renew(&state, &[o], lease, now);
                        prop_assert_eq!(plan.reply, Reply::Int(state.count_of(&[o]).map_or(0, |_| 1)));
                        (vec![o], plan)
                    }
                    Op::Force => (vec![], force_release(&state)),
                };
                key.apply(&owner, &plan);
                prop_assert!(key.fields.len() <= 1, "never two owners: {:?}", key.fields);
                prop_assert!(key.fields.values().all(|c| *c >= 1));
                prop_assert!(key.fields.is_empty() || key.expire_at.is_some(), "a held lock always has a lease");
                prop_assert_eq!(plan.freed, before.is_some() && key.fields.is_empty());
                if let Some(held) = &before {
                    if !key.fields.is_empty() {
                        prop_assert_eq!(key.fields.keys().next(), Some(held), "nobody takes a held lock");
                    }
                }
            }
        }
    }
}
