//! The blocking API: [`Client`], [`Lock`] and [`LockGuard`].

pub(crate) mod multi;
pub(crate) mod rwlock;
pub(crate) mod semaphore;

use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis::{IntoConnectionInfo, RedisResult, Value};

use crate::error::{poisons_connection, Error, Result};
use crate::net::conn::{record_renewals, renewal_pipelines, unanswered, Conn, Target, WaitPool};
use crate::options::{AcquireOptions, ClientOptions, Wait};
use crate::proto::backoff::Jitter;
use crate::proto::cmd::{self, LockInfo};
use crate::proto::logic::{self, lock_ignoring_poison, Acquiring, Next, Renewals, Retries, Route};
use crate::proto::state::{LockShared, Lost, LostReason, OwnerIds};
use crate::proto::watchdog::{report, Due, Outcome, Registry};
use crate::ReleaseOutcome;

/// How long the idle renewal worker sleeps when it watches nothing; any new lock wakes it.
const IDLE_SLEEP: Duration = Duration::from_secs(3600);

/// A blocking rlock client: one server or a cluster, one renewal worker thread.
///
/// Cloning is cheap and shares everything (connections, owner id space, worker).
///
/// # Examples
///
/// ```no_run
/// use rlock_client::Client;
///
/// # fn main() -> rlock_client::Result<()> {
/// let client = Client::open("redis://127.0.0.1:6379/")?;
/// let lock = client.lock("orders:42");
/// let guard = lock.acquire()?; // waits in the server; watchdog lease
/// // ... the critical section ...
/// guard.release()?; // Err(NotHeld) if the lock was lost meanwhile
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.inner.ids.client_id())
            .field("target", &self.inner.target)
            .finish_non_exhaustive()
    }
}

pub(crate) struct ClientInner {
    target: Target,
    pub(crate) opts: ClientOptions,
    ids: OwnerIds,
    jitter: Jitter,
    cmd_conn: Mutex<Option<Conn>>,
    wait_pool: WaitPool<Conn>,
    watchdog: Arc<Watchdog>,
    // Queued tickets (SPEC 5): the shared ticket connection (None: a cluster, or blocking mode).
    tickets: Option<crate::net::tickets::Tickets>,
    // Queued tickets on a cluster: one ticket connection per node with waiters.
    cluster_tickets: Option<crate::net::cluster_tickets::ClusterTickets>,
}

struct Watchdog {
    state: Mutex<WatchdogState>,
    cond: Condvar,
}

struct WatchdogState {
    registry: Registry,
    stop: bool,
    running: bool,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // The last handle is gone (guards hold one too), so nothing is left to renew.
        lock_ignoring_poison(&self.watchdog.state).stop = true;
        self.watchdog.cond.notify_all();
    }
}

impl Client {
    /// A client of one server, with default options.
    ///
    /// ```no_run
    /// let client = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn open<T: IntoConnectionInfo>(info: T) -> Result<Self> {
        Self::open_with(info, ClientOptions::new())
    }

    /// A client of one server, with options.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use rlock_client::{Client, ClientOptions};
    /// let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_secs(10));
    /// let client = Client::open_with("redis://127.0.0.1/", opts)?;
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn open_with<T: IntoConnectionInfo>(info: T, opts: ClientOptions) -> Result<Self> {
        Ok(Self::from_redis(redis::Client::open(info)?, opts))
    }

    /// A client of a Redis Cluster, given some of its nodes.
    ///
    /// ```no_run
    /// let client = rlock_client::Client::open_cluster(vec!["redis://127.0.0.1:7000/"])?;
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn open_cluster<T: IntoConnectionInfo>(nodes: impl IntoIterator<Item = T>) -> Result<Self> {
        Self::open_cluster_with(nodes, ClientOptions::new())
    }

    /// A client of a Redis Cluster, with options.
    pub fn open_cluster_with<T: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
        opts: ClientOptions,
    ) -> Result<Self> {
        let nodes = nodes
            .into_iter()
            .map(|n| n.into_connection_info())
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let template = nodes.first().cloned();
        let c = redis::cluster::ClusterClient::new(nodes)?;
        Ok(Self::new_with_template(
            Target::Cluster(Box::new(c)),
            opts,
            template,
        ))
    }

    /// A client over an existing redis-rs client (its TLS, auth and database).
    ///
    /// ```no_run
    /// let redis = redis::Client::open("redis://127.0.0.1/")?;
    /// let client = rlock_client::Client::from_redis(redis, Default::default());
    /// # Ok::<_, redis::RedisError>(())
    /// ```
    pub fn from_redis(client: redis::Client, opts: ClientOptions) -> Self {
        Self::new(Target::Single(client), opts)
    }

    /// A client over an existing redis-rs cluster client.
    pub fn from_cluster(client: redis::cluster::ClusterClient, opts: ClientOptions) -> Self {
        Self::new(Target::Cluster(Box::new(client)), opts)
    }

    fn new(target: Target, opts: ClientOptions) -> Self {
        Self::new_with_template(target, opts, None)
    }

    /// `template`: the settings of a cluster's nodes (for its ticket connections).
    fn new_with_template(
        target: Target,
        opts: ClientOptions,
        template: Option<redis::ConnectionInfo>,
    ) -> Self {
        let registry = Registry::new(opts.renew_interval(), opts.retry.clone());
        let tickets = match &target {
            Target::Single(c) => crate::net::tickets::Tickets::new(c, opts.wait_mode),
            Target::Cluster(_) => None,
        };
        let cluster_tickets = match &target {
            Target::Cluster(_) => {
                crate::net::cluster_tickets::ClusterTickets::new(template, opts.wait_mode)
            }
            Target::Single(_) => None,
        };
        Client {
            inner: Arc::new(ClientInner {
                tickets,
                cluster_tickets,
                target,
                ids: OwnerIds::new(),
                jitter: Jitter::new(),
                cmd_conn: Mutex::new(None),
                wait_pool: WaitPool::new(opts.idle_wait_connections),
                watchdog: Arc::new(Watchdog {
                    state: Mutex::new(WatchdogState {
                        registry,
                        stop: false,
                        running: false,
                    }),
                    cond: Condvar::new(),
                }),
                opts,
            }),
        }
    }

    /// This client's uuid, the first part of its owner ids.
    pub fn id(&self) -> &str {
        self.inner.ids.client_id()
    }

    /// The options the client was made with.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.opts
    }

    /// A handle on the lock `name`, with a new owner id (`<client id>:<n>`).
    ///
    /// A handle is one owner: acquiring through it again re-enters. Two handles
    /// exclude each other, even in one thread.
    ///
    /// ```no_run
    /// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// let a = client.lock("k");
    /// let b = client.lock("k");
    /// let _held = a.acquire()?;
    /// assert!(b.try_acquire()?.is_none());
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        let owner = self.inner.ids.next_owner();
        self.lock_with_owner(name, owner)
    }

    /// A handle on the lock `name` with an owner id of the caller's choosing, for
    /// example to take over a lock after a restart, or to match a Redisson owner.
    ///
    /// The retry logic assumes this handle is the owner id's only user.
    pub fn lock_with_owner(&self, name: impl Into<String>, owner: impl Into<String>) -> Lock {
        Lock {
            client: self.inner.clone(),
            shared: Arc::new(LockShared::new(
                name.into(),
                owner.into(),
                self.inner.ids.next_handle(),
            )),
        }
    }

    /// What the server knows about lock `name` (`RLOCK.INFO`); `None` if it is free.
    pub fn info(&self, name: &str) -> Result<Option<LockInfo>> {
        let c = &self.inner;
        cmd::parse_info(c.with_retries(c.retries(), || c.run(&cmd::info(name)))?)
    }

    /// Frees lock `name` whoever holds it (`RLOCK.FORCERELEASE`); whether there was one.
    /// Its holder finds out at its next renewal or release.
    pub fn force_release(&self, name: &str) -> Result<bool> {
        let c = &self.inner;
        cmd::parse_force_release(c.with_retries(c.retries(), || c.run(&cmd::force_release(name)))?)
    }
}

// Read-write lock (client/src/rwlock.rs): a handle on one side of it, and a plain
// command with the client's retries.
impl Client {
    pub(crate) fn side_lock(&self, name: String, side: &'static str, owner: String) -> Lock {
        Lock {
            client: self.inner.clone(),
            shared: Arc::new(LockShared::with_side(
                name,
                Some(side),
                owner,
                self.inner.ids.next_handle(),
            )),
        }
    }

    pub(crate) fn next_owner(&self) -> String {
        self.inner.ids.next_owner()
    }

    pub(crate) fn query_with_retries(&self, command: &redis::Cmd) -> Result<Value> {
        let c = &self.inner;
        c.with_retries(c.retries(), || c.run(command))
    }
}

impl ClientInner {
    /// Runs one quick command on the shared connection, reconnecting if needed.
    pub(crate) fn run(&self, c: &redis::Cmd) -> Result<Value> {
        self.run_raw(c).map_err(Error::from)
    }

    fn run_raw(&self, c: &redis::Cmd) -> RedisResult<Value> {
        let mut slot = lock_ignoring_poison(&self.cmd_conn);
        if slot.is_none() {
            *slot = Some(self.target.connect(self.opts.response_timeout)?);
        }
        let conn = slot.as_mut().expect("connected above");
        let r = conn.query(c);
        if let Err(e) = &r {
            if poisons_connection(e) {
                *slot = None;
            }
        }
        r
    }

    /// Runs `f` on a connection of its own (for a command that blocks in the server),
    /// then returns the connection to the pool if it is still sound.
    pub(crate) fn on_wait_conn<T>(
        &self,
        read_timeout: Option<Duration>,
        f: impl FnOnce(&mut Conn) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let mut conn = match self.wait_pool.take() {
            Some(c) => c,
            None => self.target.connect(read_timeout)?,
        };
        let r = conn
            .set_read_timeout(read_timeout)
            .and_then(|()| f(&mut conn));
        self.wait_pool.give_back(conn, &r);
        r
    }

    /// Runs a waiting command (one with `WAIT`): with a queued ticket on the shared
    /// ticket connection where the module supports it (SPEC 5), else blocked on a
    /// connection of its own. `limit` bounds the wait for the answer.
    pub(crate) fn wait_query(
        &self,
        limit: Option<Duration>,
        cmd: &redis::Cmd,
    ) -> RedisResult<Value> {
        if let Some(t) = self.tickets.as_ref().filter(|t| t.enabled()) {
            if let Some(r) = t.wait_blocking(cmd, limit) {
                return r;
            }
        }
        if let Some(t) = self.cluster_tickets.as_ref().filter(|t| t.enabled()) {
            let slots = || self.run_raw(&crate::net::cluster_tickets::slots_cmd());
            match t.wait_blocking(cmd, limit, slots) {
                Ok(r) => return r,
                // Blocked for what is left of the wait.
                Err((Some(rest), limit)) => {
                    return self.on_wait_conn(limit, |conn| conn.query(&rest))
                }
                Err((None, _)) => {}
            }
        }
        self.on_wait_conn(limit, |conn| conn.query(cmd))
    }

    /// As many attempts as the client's retry policy allows.
    pub(crate) fn retries(&self) -> Retries<'_> {
        Retries::new(&self.opts.retry, &self.jitter)
    }

    /// Runs `attempt` until it succeeds or `retries` says to give up, sleeping between.
    pub(crate) fn with_retries<T>(
        &self,
        mut retries: Retries<'_>,
        mut attempt: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        loop {
            match attempt() {
                Err(e) => match retries.backoff(&e) {
                    Some(pause) => thread::sleep(pause),
                    None => return Err(e),
                },
                ok => return ok,
            }
        }
    }
}

impl Renewals for ClientInner {
    fn register(
        &self,
        shared: &Arc<LockShared>,
        epoch: u64,
        lease: Duration,
        renew: bool,
        at: Instant,
    ) {
        let mut st = lock_ignoring_poison(&self.watchdog.state);
        st.registry.insert(shared.clone(), epoch, lease, renew, at);
        if !st.running {
            st.running = true;
            let wd = self.watchdog.clone();
            let target = self.target.clone();
            let timeout = logic::renewal_timeout(&self.opts);
            let spawned = thread::Builder::new()
                .name("rlock-renewal".into())
                .spawn(move || renewal_worker(wd, target, timeout));
            if spawned.is_err() {
                // Out of threads: the next registration tries again. Meanwhile the lock
                // is not renewed, and `is_held` turns false at its lease's deadline.
                st.running = false;
            }
        }
        drop(st);
        self.watchdog.cond.notify_all();
    }

    fn rearmed(&self, handle: u64, epoch: u64, lease: Duration, at: Instant) {
        lock_ignoring_poison(&self.watchdog.state)
            .registry
            .rearmed(handle, epoch, lease, at);
    }

    fn unregister(&self, handle: u64) {
        lock_ignoring_poison(&self.watchdog.state)
            .registry
            .remove(handle);
    }
}

/// The renewal worker: one thread per client, renewing every due lock in one
/// pipeline (per cluster slot) on a connection of its own.
fn renewal_worker(wd: Arc<Watchdog>, target: Target, timeout: Option<Duration>) {
    let mut conn: Option<Conn> = None;
    let mut st = lock_ignoring_poison(&wd.state);
    loop {
        if st.stop {
            return;
        }
        let now = Instant::now();
        let (due, lost) = st.registry.plan(now);
        if due.is_empty() && lost.is_empty() {
            let sleep = st
                .registry
                .next_wake()
                .map_or(IDLE_SLEEP, |w| w.saturating_duration_since(now));
            st = wd
                .cond
                .wait_timeout(st, sleep)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            continue;
        }
        drop(st);
        report(lost);
        let results = renew_batch(&target, &mut conn, timeout, &due);
        st = lock_ignoring_poison(&wd.state);
        let lost = st.registry.apply_all(&due, results);
        if !lost.is_empty() {
            drop(st);
            report(lost);
            st = lock_ignoring_poison(&wd.state);
        }
    }
}

fn renew_batch(
    target: &Target,
    conn: &mut Option<Conn>,
    timeout: Option<Duration>,
    due: &[Due],
) -> Vec<(Outcome, Instant)> {
    let mut out = unanswered(due);
    for (idx, pipe) in renewal_pipelines(due, target.is_cluster()) {
        if conn.is_none() {
            match target.connect(timeout) {
                Ok(c) => *conn = Some(c),
                Err(_) => continue,
            }
        }
        let c = conn.as_mut().expect("connected above");
        let sent_at = Instant::now();
        if !record_renewals(&mut out, &idx, pipe.query(c), sent_at) {
            *conn = None;
        }
    }
    out
}

/// A handle on one lock, as one owner.
///
/// Acquiring through the same handle again re-enters (the hold count goes up; each
/// guard releases one hold). Handles are cheap: make one per task or thread that
/// must exclude the others.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
/// let lock = client.lock("report");
/// match lock.acquire_timeout(Duration::from_secs(2))? {
///     Some(guard) => {
///         // ... build the report ...
///         guard.release()?;
///     }
///     None => println!("someone else is building it"),
/// }
/// # Ok::<_, rlock_client::Error>(())
/// ```
pub struct Lock {
    client: Arc<ClientInner>,
    shared: Arc<LockShared>,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.shared.key)
            .field("owner", &self.shared.owner)
            .finish()
    }
}

impl Lock {
    /// The lock's name (its key).
    pub fn name(&self) -> &str {
        &self.shared.key
    }

    /// This handle's owner id.
    pub fn owner(&self) -> &str {
        &self.shared.owner
    }

    /// Takes the lock, waiting in the server for as long as it takes; watchdog lease.
    ///
    /// # Errors
    /// Transport errors that outlive the retries, server errors (`WRONGTYPE` when the
    /// key is not a lock), [`Error::ReplicaSync`] with replica safety on.
    pub fn acquire(&self) -> Result<LockGuard> {
        logic::taken(
            self.acquire_with(AcquireOptions::new())?,
            "RLOCK.ACQUIRE WAIT 0 timed out",
        )
    }

    /// Takes the lock if it is free (or already ours); never waits.
    ///
    /// ```no_run
    /// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// if let Some(guard) = client.lock("cron:nightly").try_acquire()? {
    ///     // only one instance runs the job
    ///     guard.release()?;
    /// }
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::No))
    }

    /// Takes the lock, waiting in the server at most `wait`; `None` if it did not
    /// come free in time.
    pub fn acquire_timeout(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::Up(wait)))
    }

    /// Takes the lock with explicit options (wait limit, fixed lease).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use rlock_client::{AcquireOptions, Wait};
    /// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// let opts = AcquireOptions::new()
    ///     .with_wait(Wait::Up(Duration::from_millis(500)))
    ///     .with_lease(Duration::from_secs(5)); // expires after 5 s, no renewal
    /// let guard = client.lock("k").acquire_with(opts)?;
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn acquire_with(&self, opts: AcquireOptions) -> Result<Option<LockGuard>> {
        self.acquire_as(opts, cmd::ACQUIRE, cmd::parse_acquire)
    }

    /// [`Self::acquire_with`] sending `command` (the fenced lock's `RFENCED.ACQUIRE`,
    /// same arguments) and reading each reply with `parse` (which may keep what else
    /// the reply carries: the fencing token).
    pub(crate) fn acquire_as(
        &self,
        opts: AcquireOptions,
        command: &'static str,
        mut parse: impl FnMut(Value) -> Result<cmd::Acquired>,
    ) -> Result<Option<LockGuard>> {
        let c = &self.client;
        let shared = &self.shared;
        let mut run = Acquiring::new(shared, opts, &c.opts, &c.jitter)?.with_command(command);
        loop {
            let sent = Instant::now();
            let (command, route) = run.attempt(shared, sent);
            let reply = match route {
                Route::Shared => c.run(&command),
                Route::Waiting { limit } => c.wait_query(limit, &command).map_err(Error::from),
            };
            let mut next = run.after_attempt(&**c, shared, sent, reply.and_then(&mut parse));
            if let Next::Renew = next {
                let sent = Instant::now();
                let renew = run.renew_command(shared);
                let renewed = c
                    .with_retries(c.retries(), || c.run(&renew))
                    .and_then(cmd::parse_renew);
                next = run.after_renew(&**c, shared, sent, renewed);
            }
            match next {
                Next::Taken => break,
                Next::Renew | Next::Again => {}
                Next::Backoff(pause) => thread::sleep(pause),
                Next::NotTaken => return Ok(None),
                Next::Fail(e) => return Err(e),
            }
        }
        let took = run.finish(&**c, shared);
        let guard = LockGuard {
            client: c.clone(),
            shared: shared.clone(),
            epoch: took.epoch,
            release_lease_ms: took.release_lease_ms,
            done: false,
        };
        if let Some(rs) = c.opts.replica_sync {
            let (pipe, read) = logic::replica_check(shared, took.lease_ms, rs);
            let reply = c.on_wait_conn(Some(read), |conn| pipe.query(conn));
            if let Err(e) = logic::replica_outcome(shared, rs, reply) {
                let _ = guard.release();
                return Err(e);
            }
        }
        Ok(Some(guard))
    }

    /// This handle's hold count as the client knows it (0: not held).
    pub fn hold_count(&self) -> u64 {
        self.shared.local_holds()
    }

    /// Another handle on the same owner state, for a thread of a combined lock. Only
    /// one operation may run on a handle at a time; the caller sees to that.
    pub(crate) fn same_handle(&self) -> Lock {
        Lock {
            client: self.client.clone(),
            shared: self.shared.clone(),
        }
    }

    /// The lease an acquire with `opts` asks for.
    pub(crate) fn lease_for(&self, opts: &AcquireOptions) -> Duration {
        opts.lease_or(self.client.opts.watchdog_timeout)
    }
}

/// Releases one hold of `epoch`, retrying transient failures (if `retries`) without
/// releasing twice.
fn release_inner(
    c: &ClientInner,
    shared: &LockShared,
    epoch: u64,
    lease_ms: Option<u64>,
    retries: bool,
) -> Result<ReleaseOutcome> {
    let command = logic::begin_release(c, shared, epoch, lease_ms)?;
    let retries = if retries {
        c.retries()
    } else {
        c.retries().once()
    };
    let reply = c.with_retries(retries, || c.run(&command).and_then(cmd::parse_release))?;
    logic::released(c, shared, epoch, reply)
}

/// One hold of a lock. Release it with [`release`](Self::release) to learn whether
/// the lock was still held; dropping it releases best-effort.
///
/// # Drop
/// Dropping the guard stops its renewal and sends one `RLOCK.RELEASE` (no retries),
/// ignoring the outcome: a lost lock or an unreachable server goes unreported, and
/// an unreleased lock expires with its lease. Inside a tokio runtime (with the
/// `tokio` feature) the release runs on the runtime's blocking pool instead, so that
/// dropping never blocks a runtime thread.
///
/// # Cancel safety
/// The blocking API has no cancellation; see [`aio`](crate::aio) for the async one.
///
/// # Examples
///
/// ```no_run
/// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
/// let guard = client.lock("k").acquire()?;
/// guard.on_lost(|why| eprintln!("lock lost: {why:?}; stop writing"));
/// assert!(guard.is_held());
/// guard.release()?;
/// # Ok::<_, rlock_client::Error>(())
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    client: Arc<ClientInner>,
    shared: Arc<LockShared>,
    epoch: u64,
    release_lease_ms: Option<u64>,
    done: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.shared.key)
            .field("owner", &self.shared.owner)
            .field("held", &self.is_held())
            .finish()
    }
}

impl LockGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.shared.key
    }

    /// The owner id holding it.
    pub fn owner(&self) -> &str {
        &self.shared.owner
    }

    /// Whether the lock is still held, as far as this client knows: not found lost
    /// by a renewal or release, and its lease not run out without renewal. Costs no
    /// round trip.
    pub fn is_held(&self) -> bool {
        self.shared.is_held(self.epoch)
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason(self.epoch)
    }

    /// When the lease must have run out, by this client's clock (None: not held).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.shared.deadline(self.epoch)
    }

    /// Blocks until the lock is lost (`Some(reason)`), or `timeout` passes, or the
    /// lock is released through another guard of the same handle (`None`).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.lock("k").acquire()?;
    /// if let Some(why) = guard.wait_lost(Some(Duration::from_secs(1))) {
    ///     eprintln!("lost: {why:?}");
    /// }
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<LostReason> {
        self.shared.wait_lost(self.epoch, timeout)
    }

    /// A future that completes when the lock is lost (any executor).
    pub fn lost(&self) -> Lost<'_> {
        Lost {
            shared: &self.shared,
            epoch: self.epoch,
        }
    }

    /// Calls `f` once when the lock is lost, or at once if it already was. It runs on
    /// whichever thread finds the loss, usually the client's renewal worker, which
    /// serves all its locks: keep it short and non-blocking. It has run by the time
    /// `wait_lost` or `lost()` report the loss. It is dropped uncalled if the lock is
    /// released normally.
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        self.shared.on_lost(self.epoch, Box::new(f));
    }

    /// Releases this hold, retrying transient failures.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock was no longer held by this owner: the
    /// critical section ran (at least partly) unprotected. Transport errors after
    /// the retries: renewal has then stopped and the lock expires with its lease.
    pub fn release(mut self) -> Result<ReleaseOutcome> {
        self.done = true;
        release_inner(
            &self.client,
            &self.shared,
            self.epoch,
            self.release_lease_ms,
            true,
        )
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (client, shared, epoch, lease) = (
            self.client.clone(),
            self.shared.clone(),
            self.epoch,
            self.release_lease_ms,
        );
        if shared.current(epoch) == Some(1) {
            client.unregister(shared.handle);
        }
        let job = move || {
            let _ = release_inner(&client, &shared, epoch, lease, false);
        };
        #[cfg(feature = "tokio")]
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            drop(rt.spawn_blocking(job));
            return;
        }
        job();
    }
}

// Fenced lock (SPEC 4.2): one quick command with the client's retries, for fenced.rs.
impl Client {
    pub(crate) fn query_retried(&self, command: &redis::Cmd) -> Result<Value> {
        let c = &self.inner;
        c.with_retries(c.retries(), || c.run(command))
    }
}
