//! What a read-write lock holds, in Redisson's RReadWriteLock layout: the constants and
//! names of that layout, the state types ([`RwState`], [`Writer`], [`Mode`], [`Side`]), and
//! the reading of the hash and its timeout keys into them ([`parse_hash`], [`HashView`]).
//! Pure; `rule.rs` plans on these.

use std::collections::BTreeMap;

use crate::vocab::apply::itoa;
use crate::vocab::args::parse_i64;
use crate::vocab::effects::{prefix_name, suffix_name_with};
use crate::vocab::errors::{ERR_NOT_A_RWLOCK, ERR_RW_TOO_MANY_HOLDS};

pub const MODE_FIELD: &[u8] = b"mode";
/// The writer's hash field is its owner id with this suffix (RedissonWriteLock.getLockName).
pub const WRITE_SUFFIX: &[u8] = b":write";
/// LockPubSub.UNLOCK_MESSAGE: Redisson wakes one waiter. Sent when the last reader leaves.
pub const UNLOCK_MESSAGE: &[u8] = b"0";
/// LockPubSub.READ_UNLOCK_MESSAGE: Redisson wakes every waiter. Sent when a writer leaves.
pub const READ_UNLOCK_MESSAGE: &[u8] = b"1";
/// Each read hold has a timeout key that the glue must read on every command, so one
/// owner's re-entries are bounded (Redisson's scripts loop over them the same way).
pub const MAX_READ_HOLDS: i64 = 1024;
/// An expiry that never comes: a key without TTL.
pub const NEVER: i64 = i64::MAX;
/// The end of a read hold whose timeout key is missing: it is over.
pub const GONE: i64 = i64::MIN;

/// Which half of the lock a command is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Read,
    Write,
}

impl Side {
    /// The word RRWLOCK.ACQUIRE takes for it (`rule::parse_side` reads it back).
    pub fn as_bytes(self) -> &'static [u8] {
        match self {
            Side::Read => b"READ",
            Side::Write => b"WRITE",
        }
    }
}

/// The hash's `mode` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
}

impl Mode {
    pub fn as_bytes(self) -> &'static [u8] {
        match self {
            Mode::Read => b"read",
            Mode::Write => b"write",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writer {
    /// The owner id, without the `:write` suffix its field carries.
    pub owner: Vec<u8>,
    pub count: i64,
}

/// What the keys of one read-write lock hold, as far as the algorithm cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RwState {
    /// `None`: no key, nobody holds the lock.
    pub mode: Option<Mode>,
    /// Only in write mode.
    pub writer: Option<Writer>,
    /// Read owner -> the absolute end of each of its holds: index 0 is hold 1 (timeout key
    /// `:1`). [`GONE`] when that key is missing, [`NEVER`] when it has no TTL. In write mode
    /// these are the writer's own read holds (nobody else may read then).
    pub readers: BTreeMap<Vec<u8>, Vec<i64>>,
    /// The hash's absolute expiry, [`NEVER`] without TTL; [`NEVER`] when free.
    pub expire_at: i64,
}

impl Default for RwState {
    fn default() -> Self {
        RwState::free()
    }
}

impl RwState {
    pub fn free() -> RwState {
        RwState {
            mode: None,
            writer: None,
            readers: BTreeMap::new(),
            expire_at: NEVER,
        }
    }

    pub fn is_free(&self) -> bool {
        self.mode.is_none()
    }

    pub fn read_count(&self, owner: &[u8]) -> i64 {
        self.readers.get(owner).map_or(0, |ends| ends.len() as i64)
    }

    pub fn is_writer(&self, owner: &[u8]) -> bool {
        self.writer.as_ref().is_some_and(|w| w.owner == owner)
    }

    /// The remaining lease as PTTL reports it: -1 without TTL (and for a free lock, which
    /// a contended reply never reports).
    pub fn pttl(&self, now: i64) -> i64 {
        if self.is_free() || self.expire_at == NEVER {
            -1
        } else {
            (self.expire_at - now).max(0)
        }
    }

    /// For `RRWLOCK.INFO`: each read owner with its hold count and remaining lease in ms
    /// (-1 when a hold has no TTL).
    pub fn read_holds(&self, now: i64) -> Vec<(&[u8], i64, i64)> {
        self.readers
            .iter()
            .map(|(owner, ends)| {
                let remaining = match lease_end(ends) {
                    NEVER => -1,
                    end => (end - now).max(0),
                };
                (owner.as_slice(), ends.len() as i64, remaining)
            })
            .collect()
    }

    /// The longest read lease still running, or `None` with no readers.
    pub(super) fn read_end(&self) -> Option<i64> {
        self.readers.values().map(|ends| lease_end(ends)).max()
    }

    /// The earliest moment the lock changes by itself: a read owner's lease end (which only
    /// this module acts on) or the hash's expiry (which Redis acts on, but not promptly
    /// enough for waiters). The engine arms a timer there and calls [`expire`](crate::rwlock::expire).
    pub fn next_deadline(&self) -> Option<i64> {
        self.readers
            .values()
            .map(|ends| lease_end(ends))
            .chain((!self.is_free()).then_some(self.expire_at))
            .filter(|&at| at != NEVER)
            .min()
    }
}

/// A read owner's lease ends with its last hold's.
pub(super) fn lease_end(ends: &[i64]) -> i64 {
    ends.iter().copied().max().unwrap_or(GONE)
}

/// The timeout key of an owner's `n`-th read hold: `{name}:<owner>:rwlock_timeout:<n>`
/// (RedissonReadLock.getReadWriteTimeoutNamePrefix, in the name's slot).
pub fn timeout_key(key: &[u8], owner: &[u8], n: i64) -> Vec<u8> {
    suffix_name_with(key, owner, &[b":rwlock_timeout:", itoa(n).as_bytes()])
}

/// Both halves publish on `redisson_rwlock:{name}`.
pub fn channel(key: &[u8]) -> Vec<u8> {
    prefix_name(b"redisson_rwlock", key)
}

pub(super) fn writer_field(owner: &[u8]) -> Vec<u8> {
    [owner, WRITE_SUFFIX].concat()
}

/// The hash as read, before the timeout keys: says which timeout keys the glue must read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashView {
    pub mode: Mode,
    pub writer: Option<Writer>,
    /// Read owners with their hold counts, in field order.
    pub readers: Vec<(Vec<u8>, i64)>,
}

/// Reads the hash fields. It must be Redisson's layout: a `mode` of `read` or `write`,
/// positive counts, one `:write` field in write mode and none in read mode; otherwise it
/// is somebody else's data and no command may touch it.
pub fn parse_hash<F, V>(fields: impl IntoIterator<Item = (F, V)>) -> Result<HashView, &'static str>
where
    F: Into<Vec<u8>>,
    V: AsRef<[u8]>,
{
    let mut mode = None;
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for (field, value) in fields {
        let field: Vec<u8> = field.into();
        let value = value.as_ref();
        if field == MODE_FIELD {
            mode = Some(match value {
                b"read" => Mode::Read,
                b"write" => Mode::Write,
                _ => return Err(ERR_NOT_A_RWLOCK),
            });
            continue;
        }
        let count = match parse_i64(value) {
            Some(count) if count >= 1 => count,
            _ => return Err(ERR_NOT_A_RWLOCK),
        };
        match field.strip_suffix(WRITE_SUFFIX) {
            Some(owner) => writers.push(Writer {
                owner: owner.to_vec(),
                count,
            }),
            None if count > MAX_READ_HOLDS => return Err(ERR_RW_TOO_MANY_HOLDS),
            None => readers.push((field, count)),
        }
    }
    let mode = mode.ok_or(ERR_NOT_A_RWLOCK)?;
    let writer = match (mode, writers.len()) {
        (Mode::Write, 1) => writers.pop(),
        (Mode::Read, 0) => None,
        _ => return Err(ERR_NOT_A_RWLOCK),
    };
    Ok(HashView {
        mode,
        writer,
        readers,
    })
}

impl HashView {
    /// The timeout keys to read (PTTL of each), reader by reader, hold 1 first.
    pub fn timeout_keys(&self, key: &[u8]) -> Vec<Vec<u8>> {
        self.readers
            .iter()
            .flat_map(|(owner, count)| (1..=*count).map(move |n| timeout_key(key, owner, n)))
            .collect()
    }

    /// The state, given the hash's PTTL and the PTTLs of [`HashView::timeout_keys`] in
    /// that order (missing ones count as -2, a key gone).
    pub fn into_state(self, pttl: i64, timeout_pttls: &[i64], now: i64) -> RwState {
        let mut pttls = timeout_pttls.iter().copied();
        let readers = self
            .readers
            .into_iter()
            .map(|(owner, count)| {
                let ends = (0..count)
                    .map(|_| pttl_to_at(pttls.next().unwrap_or(-2), now))
                    .collect();
                (owner, ends)
            })
            .collect();
        RwState {
            mode: Some(self.mode),
            writer: self.writer,
            readers,
            expire_at: match pttl_to_at(pttl, now) {
                GONE => NEVER,
                at => at,
            },
        }
    }
}

/// PTTL's answer as an absolute time: -1 (no TTL) is [`NEVER`], -2 (no key) is [`GONE`].
pub fn pttl_to_at(pttl: i64, now: i64) -> i64 {
    match pttl {
        -1 => NEVER,
        p if p < 0 => GONE,
        p => now.saturating_add(p),
    }
}
