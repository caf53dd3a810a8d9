//! Where the locks live (one server or a cluster) and the connections to it.
//!
//! A client opens three kinds of connections, so that no traffic waits behind
//! another's: one shared connection for quick commands (acquire without waiting,
//! release, info), one for the renewal worker, and one per waiting acquire, taken
//! from a small pool, because a command blocked in the server holds up everything
//! queued behind it on the same connection.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::{Cmd, RedisResult, Value};

use crate::error::poisons_connection;
use crate::proto::logic::lock_ignoring_poison;
use crate::proto::watchdog::{Due, Outcome};

/// One server or a cluster.
#[derive(Clone)]
pub(crate) enum Target {
    Single(redis::Client),
    // Boxed: the cluster client is several times the size of the single one.
    Cluster(Box<redis::cluster::ClusterClient>),
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Single(c) => write!(f, "Single({:?})", c.get_connection_info().addr()),
            Target::Cluster(_) => write!(f, "Cluster"),
        }
    }
}

impl Target {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster(_))
    }

    /// An async connection whose requests time out after `timeout` (None: never).
    pub(crate) async fn connect_async(&self, timeout: Option<Duration>) -> RedisResult<AConn> {
        Ok(match self {
            Target::Single(c) => {
                let cfg = redis::AsyncConnectionConfig::new().set_response_timeout(timeout);
                AConn::Single(c.get_multiplexed_async_connection_with_config(&cfg).await?)
            }
            Target::Cluster(c) => {
                let mut cfg = redis::cluster::ClusterConfig::new();
                if let Some(t) = timeout {
                    cfg = cfg.set_response_timeout(t);
                }
                AConn::Cluster(c.get_async_connection_with_config(cfg).await?)
            }
        })
    }
}

/// An async (multiplexed) connection to one server or a cluster.
#[derive(Clone)]
pub(crate) enum AConn {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for AConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            AConn::Single(c) => c.req_packed_command(cmd),
            AConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            AConn::Single(c) => c.req_packed_commands(cmd, offset, count),
            AConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            AConn::Single(c) => c.get_db(),
            AConn::Cluster(c) => c.get_db(),
        }
    }
}

/// The idle connections kept for waiting commands (blocking or async ones).
pub(crate) struct WaitPool<C> {
    idle: Mutex<Vec<C>>,
    max_idle: usize,
}

impl<C> WaitPool<C> {
    /// A pool that keeps at most `max_idle` idle connections.
    pub(crate) fn new(max_idle: usize) -> Self {
        WaitPool {
            idle: Mutex::new(Vec::new()),
            max_idle,
        }
    }

    /// An idle connection, if there is one.
    pub(crate) fn take(&self) -> Option<C> {
        lock_ignoring_poison(&self.idle).pop()
    }

    /// Gives `conn` back after a command that ended with `r`: kept if it is still
    /// sound and the pool is not full, else closed.
    pub(crate) fn give_back<T>(&self, conn: C, r: &RedisResult<T>) {
        let sound = match r {
            Ok(_) => true,
            Err(e) => !poisons_connection(e),
        };
        if sound {
            let mut idle = lock_ignoring_poison(&self.idle);
            if idle.len() < self.max_idle {
                idle.push(conn);
            }
        }
    }
}

/// Renewal pipelines: everything in one for a single server; one per hash slot for
/// a cluster, since a cluster pipeline is sent to a single node.
/// In scripts mode (`scripts`) each renewal is Redisson's renewal script.
pub(crate) fn renewal_pipelines(
    due: &[Due],
    cluster: bool,
    scripts: bool,
) -> Vec<(Vec<usize>, redis::Pipeline)> {
    let mut groups: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
    for (i, d) in due.iter().enumerate() {
        let slot = if cluster {
            crate::proto::watchdog::slot(d.key.as_bytes())
        } else {
            0
        };
        groups.entry(slot).or_default().push(i);
    }
    groups
        .into_values()
        .map(|idx| {
            let mut p = redis::pipe();
            // One failing RENEW (a key overwritten by another type) must not hide
            // the answers of the others.
            p.ignore_errors();
            for &i in &idx {
                p.add_command(crate::proto::cmd::renew_as(
                    &due[i].key,
                    due[i].side,
                    &due[i].owner,
                    due[i].lease_ms,
                    scripts,
                ));
            }
            (idx, p)
        })
        .collect()
}

/// The outcomes of a round of renewals before any reply: all failed (now).
pub(crate) fn unanswered(due: &[Due]) -> Vec<(Outcome, Instant)> {
    due.iter()
        .map(|_| (Outcome::Failed, Instant::now()))
        .collect()
}

/// Records in `out` the `reply` of the renewal pipeline of `due[idx]`, sent at
/// `sent_at`; false when the connection must be dropped.
pub(crate) fn record_renewals(
    out: &mut [(Outcome, Instant)],
    idx: &[usize],
    reply: RedisResult<Vec<RedisResult<Value>>>,
    sent_at: Instant,
) -> bool {
    match reply {
        Ok(replies) => {
            for (i, r) in idx.iter().zip(replies) {
                out[*i] = (renewal_outcome(r), sent_at);
            }
            true
        }
        Err(e) => !poisons_connection(&e),
    }
}

/// What one renewal's reply means for the lock.
fn renewal_outcome(r: RedisResult<Value>) -> Outcome {
    match r {
        // (Redisson's read renewal answers a list of one.)
        Ok(v) => match crate::proto::cmd::parse_renew(crate::proto::scripts::renew_reply(v)) {
            Ok(true) => Outcome::Renewed,
            Ok(false) => Outcome::NotHeld,
            Err(_) => Outcome::Failed,
        },
        // The key now holds something else: the lock is gone.
        Err(e) if e.code() == Some("WRONGTYPE") => Outcome::NotHeld,
        Err(_) => Outcome::Failed,
    }
}
