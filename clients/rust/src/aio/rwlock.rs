//! The read-write lock (the module's `RRWLOCK.*`, Redisson's `RReadWriteLock` layout):
//! [`crate::aio::Client::rw_lock`] gives an [`RwLock`], one owner id, whose [`read`](RwLock::read)
//! and [`write`](RwLock::write) halves are ordinary [`Lock`] handles. Everything a `Lock`
//! does works on either half unchanged: waiting in the server (FIFO; readers at the head
//! of the queue go in together, and a queued writer keeps later readers out), the
//! watchdog (`RRWLOCK.RENEW`, every read hold of the owner at once), the lost signal,
//! request-id retries, replica safety. The blocking API wraps this one (`blocking/rwlock.rs`).
//!
//! The halves share the owner id, as Redisson's do: the writer may also take the read
//! lock, and a reader asking for the write lock gets an error at once
//! (`ERR this owner holds the read lock: release the read lock first ...`) instead of
//! waiting on itself forever.

use crate::aio::{Client, Lock};
use std::collections::HashMap;

use redis::Value;

use crate::error::Result;
use crate::proto::cmd::{as_i64, as_string, as_u64, pairs, unexpected};

/// `READ` or `WRITE`, the side word of the `RRWLOCK.*` commands.
pub(crate) const READ: &str = "READ";
pub(crate) const WRITE: &str = "WRITE";

/// A read-write lock as one owner, async: a read half and a write half.
///
/// ```no_run
/// # async fn run(client: rlock_client::aio::Client) -> rlock_client::Result<()> {
/// let rw = client.rw_lock("catalog");
/// let reading = rw.read().acquire().await?;
/// reading.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RwLock {
    client: Client,
    read: Lock,
    write: Lock,
}

impl Client {
    /// A handle on the read-write lock `name`, with a new owner id.
    pub fn rw_lock(&self, name: impl Into<String>) -> RwLock {
        let owner = self.next_owner();
        self.rw_lock_with_owner(name, owner)
    }

    /// A handle on the read-write lock `name` with the caller's owner id (not ending
    /// in `:write`).
    pub fn rw_lock_with_owner(&self, name: impl Into<String>, owner: impl Into<String>) -> RwLock {
        let (name, owner) = (name.into(), owner.into());
        RwLock {
            client: self.clone(),
            read: self.side_lock(name.clone(), READ, owner.clone()),
            write: self.side_lock(name, WRITE, owner),
        }
    }
}

impl RwLock {
    /// The lock's name (its key).
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// This handle's owner id, shared by both halves.
    pub fn owner(&self) -> &str {
        self.read.owner()
    }

    /// The read half.
    pub fn read(&self) -> &Lock {
        &self.read
    }

    /// The write half.
    pub fn write(&self) -> &Lock {
        &self.write
    }

    /// What the server knows about the lock (`RRWLOCK.INFO`); `None` if it is free.
    pub async fn info(&self) -> Result<Option<RwLockInfo>> {
        parse_rw_info(
            self.client
                .query_with_retries(&info_cmd(self.name()))
                .await?,
        )
    }

    /// Frees the lock whoever holds it (`RRWLOCK.FORCERELEASE`); whether there was one.
    pub async fn force_release(&self) -> Result<bool> {
        parse_force(
            self.client
                .query_with_retries(&force_cmd(self.name()))
                .await?,
        )
    }
}

/// What `RRWLOCK.INFO` says about a read-write lock.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RwLockInfo {
    /// `"read"` or `"write"`.
    pub mode: String,
    /// In write mode: the writer's owner id and hold count.
    pub writer: Option<(String, u64)>,
    /// Read owners: hold count and remaining lease in ms (-1: no TTL). In write mode,
    /// the writer's own read holds.
    pub readers: HashMap<String, (u64, i64)>,
    /// Remaining lease of the whole lock in ms (-1: no TTL).
    pub pttl_ms: i64,
    /// Clients queued in the server for either half.
    pub waiters: u64,
}

pub(crate) fn info_cmd(name: &str) -> redis::Cmd {
    let mut c = redis::cmd("RRWLOCK.INFO");
    c.arg(name);
    c
}

pub(crate) fn force_cmd(name: &str) -> redis::Cmd {
    let mut c = redis::cmd("RRWLOCK.FORCERELEASE");
    c.arg(name);
    c
}

pub(crate) fn parse_force(v: Value) -> Result<bool> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected("RRWLOCK.FORCERELEASE", &other)),
    }
}

/// Parses `RRWLOCK.INFO`: nil, a RESP3 map or RESP2 flat pairs (nested maps too).
/// Unknown fields are ignored so that the module may add some.
pub(crate) fn parse_rw_info(v: Value) -> Result<Option<RwLockInfo>> {
    if matches!(v, Value::Nil) {
        return Ok(None);
    }
    let bad = |what: &str, v: &Value| unexpected(&format!("RRWLOCK.INFO {what}"), v);
    let fields = pairs(&v).ok_or_else(|| bad("", &v))?;
    let mut info = RwLockInfo::default();
    for (k, val) in fields {
        match as_string(k).as_deref() {
            Some("mode") => info.mode = as_string(val).ok_or_else(|| bad("mode", val))?,
            Some("pttl") => info.pttl_ms = as_i64(val).ok_or_else(|| bad("pttl", val))?,
            Some("waiters") => info.waiters = as_u64(val).ok_or_else(|| bad("waiters", val))?,
            Some("writer") if matches!(val, Value::Nil) => info.writer = None,
            Some("writer") => {
                let w = pairs(val).ok_or_else(|| bad("writer", val))?;
                let (o, n) = w.first().ok_or_else(|| bad("writer", val))?;
                let owner = as_string(o).ok_or_else(|| bad("writer", val))?;
                info.writer = Some((owner, as_u64(n).ok_or_else(|| bad("writer", val))?));
            }
            Some("readers") => {
                for (o, holds) in pairs(val).ok_or_else(|| bad("readers", val))? {
                    let owner = as_string(o).ok_or_else(|| bad("readers", val))?;
                    let Value::Array(items) = holds else {
                        return Err(bad("readers", holds));
                    };
                    let (Some(n), Some(ms)) = (
                        items.first().and_then(as_u64),
                        items.get(1).and_then(as_i64),
                    ) else {
                        return Err(bad("readers", holds));
                    };
                    info.readers.insert(owner, (n, ms));
                }
            }
            _ => {}
        }
    }
    Ok(Some(info))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn it_reads_info_as_flat_pairs_and_as_a_map() {
        let flat = Value::Array(vec![
            bulk("mode"),
            bulk("write"),
            bulk("pttl"),
            Value::Int(900),
            bulk("readers"),
            Value::Array(vec![
                bulk("w"),
                Value::Array(vec![Value::Int(2), Value::Int(800)]),
            ]),
            bulk("waiters"),
            Value::Int(3),
            bulk("writer"),
            Value::Array(vec![bulk("w"), Value::Int(1)]),
        ]);
        let want = RwLockInfo {
            mode: "write".into(),
            writer: Some(("w".into(), 1)),
            readers: HashMap::from([("w".to_string(), (2, 800))]),
            pttl_ms: 900,
            waiters: 3,
        };
        assert_eq!(parse_rw_info(flat).unwrap(), Some(want.clone()));
        let map = Value::Map(vec![
            (bulk("mode"), bulk("write")),
            (bulk("pttl"), Value::Int(900)),
            (
                bulk("readers"),
                Value::Map(vec![(
                    bulk("w"),
                    Value::Array(vec![Value::Int(2), Value::Int(800)]),
                )]),
            ),
            (bulk("waiters"), Value::Int(3)),
            (bulk("writer"), Value::Map(vec![(bulk("w"), Value::Int(1))])),
        ]);
        assert_eq!(parse_rw_info(map).unwrap(), Some(want));
        assert_eq!(parse_rw_info(Value::Nil).unwrap(), None);
        assert!(parse_rw_info(Value::Int(1)).is_err());
    }

    #[test]
    fn it_reads_force_release_replies() {
        assert!(parse_force(Value::Int(1)).unwrap());
        assert!(!parse_force(Value::Int(0)).unwrap());
        assert!(parse_force(Value::Nil).is_err());
    }
}
