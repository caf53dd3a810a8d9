//! Where the locks live (one server or a cluster) and the connections to it.
//!
//! A client opens three kinds of connections, so that no traffic waits behind
//! another's: one shared connection for quick commands (acquire without waiting,
//! release, info), one for the renewal worker, and one per waiting acquire, taken
//! from a small pool, because a command blocked in the server holds up everything
//! queued behind it on the same connection.
//!
//! The blocking API's quick commands on a single server go on [`CallerConns`] instead:
//! written and read by the calling thread itself, with no hop to the runtime's worker
//! and back (the shared connection's driver runs there), which on an uncontended lock
//! was most of a call's time.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
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

thread_local! {
    /// Set while this thread runs a blocking API call to its end (`blocking::Rt::block_on`).
    static CALLER_BLOCKS: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with this thread marked as a blocking API caller: a quick command it runs
/// meanwhile may do its I/O on this thread ([`caller_blocks`]).
pub(crate) fn as_blocking_caller<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            CALLER_BLOCKS.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(CALLER_BLOCKS.with(|c| c.replace(true)));
    f()
}

/// Whether this thread is a blocking API caller, which may block on a socket. A task on
/// the runtime never is (a guard dropped inside an async runtime releases there).
pub(crate) fn caller_blocks() -> bool {
    CALLER_BLOCKS.with(Cell::get)
}

/// Quick commands of blocking API callers on a single server, each written and read on
/// the calling thread on a connection of a small pool. At most [`CallerConns::MAX`] calls
/// use it at once; beyond that a call goes on the shared multiplexed connection, so that
/// many threads do not mean many connections.
pub(crate) struct CallerConns {
    client: redis::Client,
    timeout: Option<Duration>,
    idle: WaitPool<redis::Connection>,
    busy: AtomicUsize,
}

impl CallerConns {
    /// Calls on caller-thread connections at once (and idle connections kept).
    pub(crate) const MAX: usize = 2;

    /// A pool of `client`'s connections whose commands time out after `timeout`.
    pub(crate) fn new(client: redis::Client, timeout: Option<Duration>) -> Self {
        CallerConns {
            client,
            timeout,
            idle: WaitPool::new(Self::MAX),
            busy: AtomicUsize::new(0),
        }
    }

    /// `c`'s reply, sent and read on this thread; `None` when [`Self::MAX`] calls are at
    /// it already. A connection that failed is closed, not kept.
    pub(crate) fn query(&self, c: &Cmd) -> Option<RedisResult<Value>> {
        struct Busy<'a>(&'a AtomicUsize);
        impl Drop for Busy<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _busy = Busy(&self.busy);
        if self.busy.fetch_add(1, Ordering::AcqRel) >= Self::MAX {
            return None;
        }
        let mut conn = match self.idle.take() {
            Some(conn) => conn,
            None => match self.open() {
                Ok(conn) => conn,
                Err(e) => return Some(Err(e)),
            },
        };
        let r = c.query::<Value>(&mut conn);
        self.idle.give_back(conn, &r);
        Some(r)
    }

    fn open(&self) -> RedisResult<redis::Connection> {
        let conn = match self.timeout {
            Some(t) => self.client.get_connection_with_timeout(t)?,
            None => self.client.get_connection()?,
        };
        conn.set_read_timeout(self.timeout)?;
        conn.set_write_timeout(self.timeout)?;
        Ok(conn)
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
