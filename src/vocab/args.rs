//! The shared vocabulary of arguments: how every primitive reads integers, leases,
//! timeouts, owners and the `WAIT`/`ASYNC`/`ID` options, and where a request id's first
//! reply is remembered. Pure (no Redis); it sits at the bottom with `errors`, `reply` and
//! `effects`, so a primitive's rule and its commands parse alike without reaching into
//! the lock's algorithm.

use crate::vocab::effects::prefix_name;
use crate::vocab::errors::{
    ERR_ASYNC, ERR_EMPTY_ID, ERR_EMPTY_OWNER, ERR_LEASE, ERR_NOTIFY_ASYNC, ERR_NOTIFY_TAG,
    ERR_QUIET_ASYNC, ERR_SYNTAX, ERR_TIMEOUT,
};

/// The longest lease or wait a caller may ask for: 100 years in milliseconds. Bounded so
/// that `now + lease` can never overflow an absolute expiry, whatever the clock says.
pub const MAX_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

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

pub fn parse_ms(bytes: &[u8], min: i64, err: &'static str) -> Result<i64, &'static str> {
    match parse_i64(bytes) {
        Some(ms) if (min..=MAX_MS).contains(&ms) => Ok(ms),
        _ => Err(err),
    }
}

pub fn parse_owner(bytes: &[u8]) -> Result<&[u8], &'static str> {
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
    /// `ASYNC`: wait as a queued ticket, not blocked (docs/commands/tickets.md).
    pub queued: bool,
    /// `NOTIFY tag`: the ticket's messages go to its own channel, the key's ticket
    /// channel with `:tag` appended (docs/commands/tickets.md).
    pub notify: Option<&'a [u8]>,
    /// `QUIET`: a ticket that is queued gets no reply; its message is its only answer
    /// (docs/commands/tickets.md).
    pub quiet: bool,
}

/// Arguments of `RLOCK.RELEASE key owner [lease-ms] [ID request-id]` after the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseArgs<'a> {
    pub owner: &'a [u8],
    pub lease: Option<i64>,
    pub id: Option<&'a [u8]>,
}

pub fn is_option(arg: &[u8], name: &[u8]) -> bool {
    arg.eq_ignore_ascii_case(name)
}

pub fn parse_id<'a>(arg: &'a [u8], seen: &Option<&'a [u8]>) -> Result<&'a [u8], &'static str> {
    match (seen, arg.is_empty()) {
        (Some(_), _) => Err(ERR_SYNTAX),
        (None, true) => Err(ERR_EMPTY_ID),
        (None, false) => Ok(arg),
    }
}

/// The longest `NOTIFY` tag: a client's is 16 hex digits; the bound keeps a channel name,
/// and what a queued ticket keeps of it, small.
pub const MAX_TAG: usize = 64;

/// Reads a `NOTIFY` tag: 1 to [`MAX_TAG`] bytes of `A-Z a-z 0-9 . _ -`. No braces (nor
/// anything else): appended to the key's ticket channel, the tag must never change the
/// channel's cluster slot, and a client spelling it needs no escaping.
pub fn parse_tag(tag: &[u8]) -> Result<&[u8], &'static str> {
    let ok = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if (1..=MAX_TAG).contains(&tag.len()) && tag.iter().all(ok) {
        Ok(tag)
    } else {
        Err(ERR_NOTIFY_TAG)
    }
}

/// Parses `owner lease-ms [WAIT timeout-ms [ASYNC [NOTIFY tag] [QUIET]]] [ID request-id]`,
/// options in any order. The arity was checked by the caller.
pub fn parse_acquire<'a>(args: &[&'a [u8]]) -> Result<AcquireArgs<'a>, &'static str> {
    let owner = parse_owner(args[0])?;
    let lease = parse_ms(args[1], 1, ERR_LEASE)?;
    let (mut wait, mut id, mut queued, mut notify, mut quiet) = (None, None, false, None, false);
    let mut rest = &args[2..];
    loop {
        rest = match rest {
            [] => break,
            [flag, tail @ ..] if is_option(flag, b"ASYNC") && !queued => {
                queued = true;
                tail
            }
            [flag, tail @ ..] if is_option(flag, b"QUIET") && !quiet => {
                quiet = true;
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
            [option, value, tail @ ..] if is_option(option, b"NOTIFY") && notify.is_none() => {
                notify = Some(parse_tag(value)?);
                tail
            }
            _ => return Err(ERR_SYNTAX),
        };
    }
    check_queued(queued, wait, id, notify, quiet)?;
    Ok(AcquireArgs {
        owner,
        lease,
        wait,
        id,
        queued,
        notify,
        quiet,
    })
}

/// `ASYNC` needs `WAIT` (it is a way of waiting) and `ID` (the grant is collected by it);
/// `NOTIFY` and `QUIET` need `ASYNC` (they say where and how a ticket is answered).
pub fn check_queued(
    queued: bool,
    wait: Option<i64>,
    id: Option<&[u8]>,
    notify: Option<&[u8]>,
    quiet: bool,
) -> Result<(), &'static str> {
    if notify.is_some() && !queued {
        Err(ERR_NOTIFY_ASYNC)
    } else if quiet && !queued {
        Err(ERR_QUIET_ASYNC)
    } else if queued && (wait.is_none() || id.is_none()) {
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

/// `COLLECT grant-id`, a release's last option (design.md 5), from its last two words
/// (`option`, `value`): the request id of the ticket grant the release gives back, which
/// it collects first; `None` when the words are not that option.
pub fn parse_collect<'a>(option: &[u8], value: &'a [u8]) -> Option<Result<&'a [u8], &'static str>> {
    if !is_option(option, b"COLLECT") {
        return None;
    }
    Some(if value.is_empty() {
        Err(ERR_EMPTY_ID)
    } else {
        Ok(value)
    })
}

/// The key that remembers a request id's first reply, in the lock's cluster slot (the
/// same `prefixName` rule as the unlock channel, like Redisson's unlock latch).
pub fn request_key(key: &[u8], id: &[u8]) -> Vec<u8> {
    let mut name = prefix_name(b"rlock_request", key);
    name.push(b':');
    name.extend_from_slice(id);
    name
}

/// Parses `owner lease-ms` of `RLOCK.RENEW`.
pub fn parse_renew<'a>(args: &[&'a [u8]]) -> Result<(&'a [u8], i64), &'static str> {
    Ok((parse_owner(args[0])?, parse_ms(args[1], 1, ERR_LEASE)?))
}
