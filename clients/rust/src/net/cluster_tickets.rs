//! Queued tickets on a Redis Cluster (design.md 5): one ticket connection per node that has
//! waiters ([`Tickets::for_node`], shard channels), made when a wait first goes there.
//!
//! A waiting call goes to the node serving its key's slot, found in a slot map read
//! with `CLUSTER SLOTS` (on the client's own cluster connection, through the `slots`
//! callback) and corrected by every `MOVED` (a reply, or a ticket's `error` note when
//! the slot left its node): the call is then sent again to the new node with the same
//! request id and the wait left. An `ASK` (a slot half-way through a migration), or
//! more redirections than [`MAX_REDIRECTS`], hands the call, with the wait it has left,
//! back ([`Blocked`]) to the blocked `WAIT` path, whose cluster connection follows
//! redirections itself. A node
//! that cannot be reached fails the call (its retries try again) and makes the next
//! wait read the map again.
//!
//! Layering: below `blocking` and `aio`, above `tickets` and `watchdog` (the slot).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ConnectionInfo, RedisError, RedisResult, Value};

use crate::net::tickets::{Confirm, Shape, Tickets};
use crate::options::WaitMode;
use crate::proto::logic::lock_ignoring_poison;

/// A call handed to the blocked path: the command to send there (`None`: the call's
/// own) and the limit of its wait, both shortened by the time spent as a ticket.
pub(crate) type Blocked = (Option<redis::Cmd>, Option<Duration>);

/// What is left of a call that began at `started`, for the blocked path.
fn rest(shape: &Shape, limit: Option<Duration>, started: Instant) -> Blocked {
    let spent = started.elapsed();
    (
        Some(shape.rewaited(spent)),
        limit.map(|l| l.saturating_sub(spent)),
    )
}

/// Redirections followed per call before it is handed to the blocked path.
const MAX_REDIRECTS: usize = 5;

const SLOTS: usize = 16384;
const UNKNOWN: u16 = u16::MAX;

/// A slot map: which master serves each slot, as far as known (also the sharded
/// subscribers' of scripts mode, `net::pubsub`).
#[derive(Default)]
pub(crate) struct Map {
    /// Slot -> index in `addrs` (`UNKNOWN`: not known); empty until first read.
    slots: Vec<u16>,
    addrs: Vec<(String, u16)>,
}

/// The slot map's name outside this file.
pub(crate) type SlotMap = Map;

impl Map {
    pub(crate) fn node(&self, slot: u16) -> Option<(String, u16)> {
        let i = *self.slots.get(usize::from(slot))?;
        self.addrs.get(usize::from(i)).cloned()
    }

    pub(crate) fn set(&mut self, lo: u16, hi: u16, addr: (String, u16)) {
        if self.slots.is_empty() {
            self.slots = vec![UNKNOWN; SLOTS];
        }
        let i = match self.addrs.iter().position(|a| *a == addr) {
            Some(i) => i,
            None => {
                self.addrs.push(addr);
                self.addrs.len() - 1
            }
        };
        let i = u16::try_from(i).unwrap_or(UNKNOWN);
        for s in lo..=hi.min(SLOTS as u16 - 1) {
            self.slots[usize::from(s)] = i;
        }
    }
}

/// The slot ranges of a `CLUSTER SLOTS` reply and their masters.
pub(crate) fn parse_slots(v: &Value) -> Vec<(u16, u16, (String, u16))> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let Value::Array(ranges) = v else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|r| {
            let Value::Array(r) = r else { return None };
            let Value::Array(master) = r.get(2)? else {
                return None;
            };
            let host = text(master.first()?)?;
            // An unknown endpoint ("" or "?"): left for a MOVED to tell.
            if host.is_empty() || host == "?" {
                return None;
            }
            Some((
                int(r.first()?)?,
                int(r.get(1)?)?,
                (host, int(master.get(1)?)?),
            ))
        })
        .collect()
}

/// A cluster client's ticket connections, one per node, and its slot map.
pub(crate) struct ClusterTickets {
    /// Settings of a node connection (auth, protocol); its address is replaced per node.
    template: ConnectionInfo,
    mode: WaitMode,
    /// The client's notification tag, the same on every node's connection.
    tag: Arc<str>,
    /// The module refused tickets: every wait is a blocked one.
    off: AtomicBool,
    map: Mutex<Map>,
    nodes: Mutex<HashMap<(String, u16), Arc<Tickets>>>,
}

impl ClusterTickets {
    /// Per `mode` (None for `Blocking`, or when `template`, the settings of the nodes
    /// the client was opened with, is not plain TCP: TLS has no ticket connection).
    pub(crate) fn new(
        template: Option<ConnectionInfo>,
        mode: WaitMode,
        tag: Arc<str>,
    ) -> Option<Self> {
        if mode == WaitMode::Blocking {
            return None;
        }
        let template = match template {
            Some(t) => t,
            None => redis::IntoConnectionInfo::into_connection_info("redis://127.0.0.1/").ok()?,
        };
        if !matches!(template.addr(), ConnectionAddr::Tcp(..)) {
            return None;
        }
        Some(ClusterTickets {
            template,
            mode,
            tag,
            off: AtomicBool::new(false),
            map: Mutex::new(Map::default()),
            nodes: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn enabled(&self) -> bool {
        !self.off.load(Ordering::Relaxed)
    }

    /// Records a `CLUSTER SLOTS` reply.
    pub(crate) fn learn(&self, reply: &Value) {
        let mut map = lock_ignoring_poison(&self.map);
        for (lo, hi, addr) in parse_slots(reply) {
            map.set(lo, hi, addr);
        }
    }

    /// Whether the map needs reading (nothing known for `slot`).
    fn unknown(&self, slot: u16) -> bool {
        lock_ignoring_poison(&self.map).node(slot).is_none()
    }

    /// The ticket connection of the node serving `slot`, made if new.
    fn node(&self, slot: u16) -> Option<Arc<Tickets>> {
        let addr = lock_ignoring_poison(&self.map).node(slot)?;
        let mut nodes = lock_ignoring_poison(&self.nodes);
        if let Some(t) = nodes.get(&addr) {
            return Some(t.clone());
        }
        let info = self
            .template
            .clone()
            .set_addr(ConnectionAddr::Tcp(addr.0.clone(), addr.1));
        let client = redis::Client::open(info).ok()?;
        let t = Arc::new(Tickets::for_node(&client, self.mode, self.tag.clone())?);
        nodes.insert(addr, t.clone());
        Some(t)
    }

    /// What to do with the outcome `r` of a wait on a node: `Ok(r)` is the call's,
    /// `Err(true)` send it again (a `MOVED`, now in the map), `Err(false)` hand it to
    /// the blocked path.
    fn judge(&self, r: Option<RedisResult<Value>>) -> Result<RedisResult<Value>, bool> {
        let Some(r) = r else {
            // The module refuses tickets (or they cannot be used): blocked waits.
            self.off.store(true, Ordering::Relaxed);
            return Err(false);
        };
        let Err(e) = &r else { return Ok(r) };
        match e.code() {
            Some("MOVED") => match moved(e) {
                Some((slot, addr)) => {
                    lock_ignoring_poison(&self.map).set(slot, slot, addr);
                    Err(true)
                }
                None => Err(false),
            },
            Some("ASK" | "TRYAGAIN" | "CLUSTERDOWN") => Err(false),
            // The node may be gone (a failover): the call's error (its retries try
            // again), and the map is read afresh by the next wait.
            _ if e.is_io_error() => {
                lock_ignoring_poison(&self.map).slots.clear();
                Ok(r)
            }
            _ => Ok(r),
        }
    }

    /// Waits for `cmd` with a ticket on its key's node; `slots` runs `CLUSTER SLOTS`.
    /// `Err`: wait the old way (a blocked `WAIT`) for what is left.
    pub(crate) async fn wait_async<F, Fut>(
        &self,
        cmd: &redis::Cmd,
        limit: Option<Duration>,
        slots: F,
        confirm: Option<&Arc<Confirm>>,
    ) -> Result<RedisResult<Value>, Blocked>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = RedisResult<Value>>,
    {
        let Some(shape) = Shape::of(cmd) else {
            return Err((None, limit));
        };
        let slot = crate::proto::watchdog::slot(shape.key());
        let started = Instant::now();
        for _ in 0..MAX_REDIRECTS {
            if self.unknown(slot) {
                match slots().await {
                    Ok(v) => self.learn(&v),
                    Err(e) => return Ok(Err(e)),
                }
            }
            let Some(t) = self.node(slot) else { break };
            match self.judge(t.wait_async_since(cmd, limit, started, confirm).await) {
                Ok(r) => return Ok(r),
                Err(true) => continue,
                Err(false) => break,
            }
        }
        Err(rest(&shape, limit, started))
    }

    /// Ticket connections made so far (tests).
    #[cfg(test)]
    fn node_count(&self) -> usize {
        lock_ignoring_poison(&self.nodes).len()
    }
}

/// The slot and new address of a `MOVED`.
pub(crate) fn moved(e: &RedisError) -> Option<(u16, (String, u16))> {
    let (addr, slot) = e.redirect_node()?;
    let (host, port) = addr.rsplit_once(':')?;
    Some((slot, (host.to_owned(), port.parse().ok()?)))
}

/// `CLUSTER SLOTS`, the command of the `slots` callbacks.
pub(crate) fn slots_cmd() -> redis::Cmd {
    let mut c = redis::cmd("CLUSTER");
    c.arg("SLOTS");
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn range(lo: i64, hi: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(lo),
            Value::Int(hi),
            Value::Array(vec![bulk(host), Value::Int(port), bulk("id")]),
        ])
    }

    #[test]
    fn it_reads_cluster_slots_and_follows_moved() {
        let reply = Value::Array(vec![
            range(0, 5460, "127.0.0.1", 7000),
            range(5461, 16383, "127.0.0.1", 7001),
            range(1, 2, "?", 7002),
        ]);
        let ct = ClusterTickets::new(None, WaitMode::Auto, "t1".into()).unwrap();
        assert!(ct.unknown(0));
        ct.learn(&reply);
        let node = |s| lock_ignoring_poison(&ct.map).node(s);
        assert_eq!(node(0), Some(("127.0.0.1".into(), 7000)));
        assert_eq!(node(5461), Some(("127.0.0.1".into(), 7001)));
        assert_eq!(node(16383), Some(("127.0.0.1".into(), 7001)));
        assert_eq!(
            node(1),
            Some(("127.0.0.1".into(), 7000)),
            "unknown endpoint"
        );
        let e = crate::net::tickets::note_error("MOVED 5461 127.0.0.1:7002");
        assert!(matches!(ct.judge(Some(Err(e))), Err(true)));
        assert_eq!(node(5461), Some(("127.0.0.1".into(), 7002)));
        assert_eq!(node(5462), Some(("127.0.0.1".into(), 7001)));
        let ask = crate::net::tickets::note_error("ASK 5461 127.0.0.1:7000");
        assert!(matches!(ct.judge(Some(Err(ask))), Err(false)));
        assert!(ct.enabled());
        let other = crate::net::tickets::note_error("ERR too many waiters");
        assert!(matches!(ct.judge(Some(Err(other))), Ok(Err(_))));
        let gone = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(ct.judge(Some(Err(gone))), Ok(Err(_))));
        assert!(ct.unknown(0), "a node gone: the map is read again");
        ct.learn(&reply);
        assert!(ct.node(0).is_some() && ct.node(5461).is_some());
        assert!(ct.node(1).is_some());
        assert_eq!(ct.node_count(), 2, "one ticket connection per node");
        assert!(matches!(ct.judge(None), Err(false)));
        assert!(!ct.enabled(), "a refusal turns tickets off");
        assert!(ClusterTickets::new(None, WaitMode::Blocking, "t1".into()).is_none());
    }
}
