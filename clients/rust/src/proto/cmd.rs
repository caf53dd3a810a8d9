//! The command builders and reply parsers, shared by the blocking and async APIs:
//! only the executor differs (`query` / `query_async`), as in redis-rs.
//!
//! Every command names the lock key at position 1 and nowhere else, so a cluster
//! connection routes it to the key's node without help.

use std::collections::HashMap;

use redis::{Cmd, Value};

use crate::error::{Error, Result};

/// A fresh request id (a v4 uuid) for one logical acquire or release. Every retry of
/// that operation sends the same id, so the server answers a retry of a call that did
/// take effect with the first reply instead of applying it again (README, "Request ids").
pub(crate) fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A client's ticket notification tag (`NOTIFY <tag>`, docs/commands/tickets.md): 16
/// lowercase hex digits, 64 bits from the OS's secure random source (a v4 uuid's random
/// bits: all but its 4 version and 2 variant bits), so that two clients never share a
/// channel, and one client cannot guess another's.
pub(crate) fn notify_tag() -> String {
    let u = uuid::Uuid::new_v4().as_u128();
    // The top 48 bits and the low 16 are random (version: bits 76-79, variant: 62-63).
    let bits = ((u >> 80) as u64) << 16 | (u as u64 & 0xffff);
    format!("{bits:016x}")
}

/// `RLOCK.<verb> key`, or for one side of a read-write lock (`side` = `READ`/`WRITE`)
/// `RRWLOCK.<verb> key side`: the RW commands take the plain lock's arguments after it.
fn named(verb: &str, key: &str, side: Option<&str>) -> Cmd {
    let mut c = match side {
        None => redis::cmd(&format!("RLOCK.{verb}")),
        Some(side) => {
            let mut c = redis::cmd(&format!("RRWLOCK.{verb}"));
            c.arg(key).arg(side);
            return c;
        }
    };
    c.arg(key);
    c
}

/// `RLOCK.ACQUIRE key owner lease-ms [WAIT timeout-ms] ID request-id`;
/// `wait_ms = Some(0)` waits without a limit.
#[cfg(test)] // the plain lock's form; the APIs send `acquire_named` via `logic::Acquiring`
pub(crate) fn acquire(
    key: &str,
    side: Option<&str>,
    owner: &str,
    lease_ms: u64,
    wait_ms: Option<u64>,
    request_id: &str,
) -> Cmd {
    acquire_named(ACQUIRE, key, side, owner, lease_ms, wait_ms, request_id)
}

/// The plain lock's acquire command.
pub(crate) const ACQUIRE: &str = "RLOCK.ACQUIRE";

/// [`acquire`] under another command name with the same arguments (the fenced lock's
/// `RFENCED.ACQUIRE`); with a `side`, the read-write lock's `RRWLOCK.ACQUIRE key side`.
pub(crate) fn acquire_named(
    name: &str,
    key: &str,
    side: Option<&str>,
    owner: &str,
    lease_ms: u64,
    wait_ms: Option<u64>,
    request_id: &str,
) -> Cmd {
    let mut c = match side {
        None => {
            let mut c = redis::cmd(name);
            c.arg(key);
            c
        }
        Some(_) => named("ACQUIRE", key, side),
    };
    c.arg(owner).arg(lease_ms);
    if let Some(w) = wait_ms {
        c.arg("WAIT").arg(w);
    }
    c.arg("ID").arg(request_id);
    c
}

/// `RLOCK.RELEASE key owner [lease-ms] ID request-id`: the lease re-arms the expiry of
/// a lock that stays held (a re-entrant release), so a watchdog lock keeps its full lease.
pub(crate) fn release(
    key: &str,
    side: Option<&str>,
    owner: &str,
    lease_ms: Option<u64>,
    request_id: &str,
) -> Cmd {
    let mut c = named("RELEASE", key, side);
    c.arg(owner);
    if let Some(l) = lease_ms {
        c.arg(l);
    }
    c.arg("ID").arg(request_id);
    c
}

/// `RLOCK.RENEW key owner lease-ms`.
pub(crate) fn renew(key: &str, side: Option<&str>, owner: &str, lease_ms: u64) -> Cmd {
    let mut c = named("RENEW", key, side);
    c.arg(owner).arg(lease_ms);
    c
}

/// The renewal as sent: `RENEW`, or in scripts mode Redisson's renewal script as one
/// `EVAL` (it goes in pipelines, after which nothing could resend it on NOSCRIPT).
pub(crate) fn renew_as(
    key: &str,
    side: Option<&str>,
    owner: &str,
    lease_ms: u64,
    scripts: bool,
) -> Cmd {
    let c = renew(key, side, owner, lease_ms);
    if scripts {
        crate::proto::scripts::renew_eval(&crate::proto::scripts::words(&c))
    } else {
        c
    }
}

/// `RLOCK.FORCERELEASE key`.
pub(crate) fn force_release(key: &str) -> Cmd {
    let mut c = redis::cmd("RLOCK.FORCERELEASE");
    c.arg(key);
    c
}

/// `RLOCK.INFO key`.
pub(crate) fn info(key: &str) -> Cmd {
    let mut c = redis::cmd("RLOCK.INFO");
    c.arg(key);
    c
}

/// `RENEW` then `WAIT replicas timeout-ms`, to be sent as one pipeline on a
/// connection of its own. The RENEW is a write made on that very connection, so
/// WAIT (which counts acknowledgements of the connection's own writes) covers the
/// lock even when the lock was written by another client's handoff. The pipeline
/// is routed by its first command, which puts WAIT on the lock's node in a cluster.
pub(crate) fn replica_check(
    key: &str,
    side: Option<&str>,
    owner: &str,
    lease_ms: u64,
    replicas: u32,
    timeout_ms: u64,
    scripts: bool,
) -> redis::Pipeline {
    let mut p = redis::pipe();
    p.add_command(renew_as(key, side, owner, lease_ms, scripts));
    p.cmd("WAIT").arg(replicas).arg(timeout_ms);
    p
}

/// The reply of `RLOCK.ACQUIRE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// Nil: the lock is ours (new, re-entered, or handed to us).
    Yes,
    /// Integer: held by another owner, with this PTTL (-1: no TTL).
    HeldFor(i64),
}

pub(crate) fn parse_acquire(v: Value) -> Result<Acquired> {
    match v {
        Value::Nil => Ok(Acquired::Yes),
        Value::Int(n) => Ok(Acquired::HeldFor(n)),
        other => Err(unexpected("RLOCK.ACQUIRE", &other)),
    }
}

/// The reply of `RLOCK.RELEASE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// 0: the count went down; the owner still holds the lock.
    StillHeld,
    /// 1: the lock is free (or handed to the next waiter).
    Freed,
    /// Nil: this owner did not hold it.
    NotHeld,
}

pub(crate) fn parse_release(v: Value) -> Result<Released> {
    match v {
        Value::Int(0) => Ok(Released::StillHeld),
        Value::Int(1) => Ok(Released::Freed),
        Value::Nil => Ok(Released::NotHeld),
        other => Err(unexpected("RLOCK.RELEASE", &other)),
    }
}

/// The reply of `RLOCK.RENEW`: whether the owner still held the lock.
pub(crate) fn parse_renew(v: Value) -> Result<bool> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected("RLOCK.RENEW", &other)),
    }
}

/// The reply of `RLOCK.FORCERELEASE`: whether a lock was freed.
pub(crate) fn parse_force_release(v: Value) -> Result<bool> {
    match v {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected("RLOCK.FORCERELEASE", &other)),
    }
}

/// The reply of `WAIT`: replicas that acknowledged.
pub(crate) fn parse_wait(v: Value) -> Result<u32> {
    match v {
        Value::Int(n) if n >= 0 => Ok(u32::try_from(n).unwrap_or(u32::MAX)),
        other => Err(unexpected("WAIT", &other)),
    }
}

/// What `RLOCK.INFO` says about a lock.
///
/// ```no_run
/// # fn main() -> rlock_client::Result<()> {
/// let client = rlock_client::Client::open("redis://127.0.0.1/")?;
/// if let Some(info) = client.info("orders:42")? {
///     println!("held by {:?}, {} ms left, {} waiting", info.owners, info.pttl_ms, info.waiters);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockInfo {
    /// Owner ids and their hold counts (one owner for an exclusive lock).
    pub owners: HashMap<String, u64>,
    /// Remaining lease in milliseconds (-1: no TTL).
    pub pttl_ms: i64,
    /// Clients queued in the server for this lock.
    pub waiters: u64,
}

/// Parses `RLOCK.INFO`: nil, a RESP3 map, or RESP2 flat pairs; `owners` itself is
/// a map or flat pairs too. Unknown fields are ignored so that the module may add some.
pub(crate) fn parse_info(v: Value) -> Result<Option<LockInfo>> {
    if matches!(v, Value::Nil) {
        return Ok(None);
    }
    let fields = pairs(&v).ok_or_else(|| unexpected("RLOCK.INFO", &v))?;
    let mut info = LockInfo::default();
    for (k, val) in fields {
        match as_string(k).as_deref() {
            Some("owners") => {
                let owners = pairs(val).ok_or_else(|| unexpected("RLOCK.INFO owners", val))?;
                for (o, n) in owners {
                    let o = as_string(o).ok_or_else(|| unexpected("RLOCK.INFO owner", o))?;
                    let n = as_u64(n).ok_or_else(|| unexpected("RLOCK.INFO count", n))?;
                    info.owners.insert(o, n);
                }
            }
            Some("pttl") => {
                info.pttl_ms = as_i64(val).ok_or_else(|| unexpected("RLOCK.INFO pttl", val))?
            }
            Some("waiters") => {
                info.waiters = as_u64(val).ok_or_else(|| unexpected("RLOCK.INFO waiters", val))?
            }
            _ => {}
        }
    }
    Ok(Some(info))
}

pub(crate) fn pairs(v: &Value) -> Option<Vec<(&Value, &Value)>> {
    match v {
        Value::Map(m) => Some(m.iter().map(|(k, v)| (k, v)).collect()),
        Value::Array(a) if a.len() % 2 == 0 => {
            Some(a.chunks_exact(2).map(|c| (&c[0], &c[1])).collect())
        }
        _ => None,
    }
}

pub(crate) fn as_string(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

pub(crate) fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        _ => as_string(v)?.parse().ok(),
    }
}

pub(crate) fn as_u64(v: &Value) -> Option<u64> {
    as_i64(v).and_then(|n| u64::try_from(n).ok())
}

pub(crate) fn unexpected(what: &str, v: &Value) -> Error {
    Error::UnexpectedReply(format!("{what}: {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn args(c: &Cmd) -> Vec<String> {
        c.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<other>".into(),
            })
            .collect()
    }

    // Every builder's words: spec/vectors/commands.json (crate::vectors reads it).

    #[test]
    fn it_pipelines_renew_before_wait_for_replica_safety() {
        let p = replica_check("k", None, "o", 500, 2, 100, false);
        let cmds: Vec<Vec<String>> = p.cmd_iter().map(args).collect();
        assert_eq!(
            cmds,
            vec![
                vec!["RLOCK.RENEW", "k", "o", "500"],
                vec!["WAIT", "2", "100"]
            ]
        );
    }

    #[test]
    fn it_reads_acquire_replies_as_redisson_does() {
        assert_eq!(parse_acquire(Value::Nil).unwrap(), Acquired::Yes);
        assert_eq!(
            parse_acquire(Value::Int(1234)).unwrap(),
            Acquired::HeldFor(1234)
        );
        assert_eq!(
            parse_acquire(Value::Int(-1)).unwrap(),
            Acquired::HeldFor(-1)
        );
        assert!(parse_acquire(Value::Okay).is_err());
    }

    #[test]
    fn it_reads_release_replies() {
        assert_eq!(parse_release(Value::Int(0)).unwrap(), Released::StillHeld);
        assert_eq!(parse_release(Value::Int(1)).unwrap(), Released::Freed);
        assert_eq!(parse_release(Value::Nil).unwrap(), Released::NotHeld);
        assert!(parse_release(Value::Int(2)).is_err());
    }

    #[test]
    fn it_reads_renew_and_force_release_replies() {
        assert!(parse_renew(Value::Int(1)).unwrap());
        assert!(!parse_renew(Value::Int(0)).unwrap());
        assert!(parse_renew(Value::Nil).is_err());
        assert!(parse_force_release(Value::Int(1)).unwrap());
        assert!(!parse_force_release(Value::Int(0)).unwrap());
    }

    #[test]
    fn it_makes_a_fresh_v4_uuid_per_request() {
        let (a, b) = (request_id(), request_id());
        assert_ne!(a, b);
        assert_eq!(uuid::Uuid::parse_str(&a).unwrap().get_version_num(), 4);
    }

    #[test]
    fn it_reads_info_as_resp2_flat_pairs() {
        let v = Value::Array(vec![
            bulk("owners"),
            Value::Array(vec![bulk("c:1"), Value::Int(2)]),
            bulk("pttl"),
            Value::Int(900),
            bulk("waiters"),
            Value::Int(3),
        ]);
        let info = parse_info(v).unwrap().unwrap();
        assert_eq!(info.owners.get("c:1"), Some(&2));
        assert_eq!(info.pttl_ms, 900);
        assert_eq!(info.waiters, 3);
    }

    #[test]
    fn it_reads_info_as_a_resp3_map_and_ignores_new_fields() {
        let v = Value::Map(vec![
            (bulk("owners"), Value::Map(vec![(bulk("c:1"), bulk("1"))])),
            (bulk("pttl"), Value::Int(-1)),
            (bulk("waiters"), Value::Int(0)),
            (bulk("future-field"), bulk("x")),
        ]);
        let info = parse_info(v).unwrap().unwrap();
        assert_eq!(info.owners.get("c:1"), Some(&1));
        assert_eq!(info.pttl_ms, -1);
    }

    #[test]
    fn it_reads_nil_info_as_no_lock() {
        assert_eq!(parse_info(Value::Nil).unwrap(), None);
        assert!(parse_info(Value::Int(1)).is_err());
    }
}
