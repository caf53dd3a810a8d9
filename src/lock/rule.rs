//! The lock algorithm, pure: no Redis, no clock, no I/O.
//!
//! Given what the key holds now, the caller's owner id, the lease and the current time,
//! each function returns a [`Plan`]: what to write (in the order delete, write, expire)
//! and what to reply. The glue in `commands.rs` reads the key into a [`LockState`], runs
//! the plan through `server::store`, and replies. Keeping this free of Redis types is what lets
//! every branch be tested as a table, without a server.
//!
//! The data model is Redisson's on purpose: a hash whose fields are owner ids and whose
//! values are hold counts, with the key's TTL as the lease. A lock nobody holds does not
//! exist as a key.

use crate::vocab::args::parse_i64;
use crate::vocab::effects::prefix_name;
use crate::vocab::errors::{ERR_COUNT_OVERFLOW, ERR_NOT_A_LOCK};

/// One owner's entry in the lock hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub owner: Vec<u8>,
    pub count: i64,
}

/// What the lock key holds, as far as the algorithm cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockState<'a> {
    /// No key: nobody holds the lock.
    Free,
    /// A valid lock hash. `pttl` is the remaining lease in ms, or -1 for a key with no TTL.
    Held { holders: Vec<Holder>, pttl: i64 },
    /// Read for one owner's command (`store::read_for`): that owner alone holds the lock,
    /// `count` times. Nothing else is read (no copy of the name, no lease): its own
    /// commands never answer the lease, only a contended acquire does.
    Alone { owner: &'a [u8], count: i64 },
}

/// The lease a contended caller would be told for an [`LockState::Alone`] read for
/// another owner, which the store never does. Absurd on purpose.
pub const PTTL_NOT_READ: i64 = i64::MIN;

impl LockState<'_> {
    /// The caller's hold count, if it holds the lock.
    pub fn count_of(&self, owner: &[u8]) -> Option<i64> {
        match self {
            LockState::Free => None,
            LockState::Held { holders, .. } => {
                holders.iter().find(|h| h.owner == owner).map(|h| h.count)
            }
            LockState::Alone { owner: o, count } => (*o == owner).then_some(*count),
        }
    }

    /// How many owners hold the lock.
    pub fn holder_count(&self) -> usize {
        match self {
            LockState::Free => 0,
            LockState::Held { holders, .. } => holders.len(),
            LockState::Alone { .. } => 1,
        }
    }

    /// The remaining lease, as a contended acquire answers it.
    pub fn pttl(&self) -> i64 {
        match self {
            LockState::Free => -2,
            LockState::Held { pttl, .. } => *pttl,
            LockState::Alone { .. } => PTTL_NOT_READ,
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

/// The reply a lock command sends when it answers at once: nil or an integer (the shared
/// vocabulary's [`ShortReply`](crate::vocab::reply::ShortReply)), so its plans stay `Copy`.
pub use crate::vocab::reply::ShortReply as Reply;

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
        _ => match state.count_of(owner) {
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
            None => Ok(Plan::reply_only(
                Reply::Int(state.pttl()),
                Outcome::Contended,
            )),
        },
    }
}

/// `RLOCK.ACQUIRE` (and the fenced lock's) on a free lock left to script-side waiters for
/// `left` more ms (design.md 1.8): contended, as if held that long, so that the caller
/// waits behind the module's queue instead of passing it.
pub fn left_to_scripts(left: i64) -> Plan {
    Plan::reply_only(Reply::Int(left), Outcome::Contended)
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
        Ok(LockState::Free) => Ok(grant(false, lease, now)),
        Ok(held) => Err(held.pttl()),
        Err(_) => Ok(grant(true, lease, now)),
    }
}

/// `RLOCK.RELEASE`: count down; the last release frees the lock.
pub fn release(state: &LockState, owner: &[u8], lease: Option<i64>, now: i64) -> Plan {
    let Some(count) = state.count_of(owner) else {
        return Plan::reply_only(Reply::Nil, Outcome::NotHeld);
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
    let last = state.holder_count() == 1;
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
        LockState::Held { .. } | LockState::Alone { .. } => Plan {
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

/// Only calls that changed the lock are remembered: re-running a call that changed
/// nothing (a contended ACQUIRE, a RELEASE by a non-holder) is as good as replaying it.
pub fn remembers(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Acquired | Outcome::Reentered | Outcome::Decremented | Outcome::Released
    )
}

/// The unlock channel of a lock, by Redisson's `prefixName` rule: the key goes in braces
/// (so the channel hashes to the lock's cluster slot) unless it already has a `{`.
pub fn unlock_channel(key: &[u8]) -> Vec<u8> {
    prefix_name(b"redisson_lock__channel", key)
}

/// The message Redisson's LockPubSub treats as "unlocked".
pub const UNLOCK_MESSAGE: &[u8] = b"0";

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
