//! The async API (feature `tokio`): [`Client`], [`Lock`] and [`LockGuard`], the
//! same shape as the blocking ones, built on the same command builders.
//!
//! ```no_run
//! # async fn run() -> rlock_client::Result<()> {
//! let client = rlock_client::aio::Client::open("redis://127.0.0.1/").await?;
//! let guard = client.lock("orders:42").acquire().await?;
//! // ... the critical section ...
//! guard.release().await?;
//! # Ok(()) }
//! ```

pub(crate) mod rwlock;
pub(crate) mod semaphore;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{IntoConnectionInfo, RedisResult, Value};
use tokio::runtime::Handle;
use tokio::sync::Notify;

pub use crate::aio::rwlock::RwLock;
use crate::error::{poisons_connection, Error, Result};
use crate::net::conn::{record_renewals, renewal_pipelines, unanswered, AConn, Target, WaitPool};
use crate::options::{AcquireOptions, ClientOptions, Wait};
use crate::proto::backoff::Jitter;
use crate::proto::cmd::{self, LockInfo};
use crate::proto::logic::{self, lock_ignoring_poison, Acquiring, Next, Renewals, Retries, Route};
use crate::proto::state::{LockShared, Lost, LostReason, OwnerIds};
use crate::proto::watchdog::{report, Due, Outcome, Registry};
use crate::ReleaseOutcome;

// Countdown latch (client/src/latch.rs): `client.latch(name)`.
pub use crate::latch::aio::CountDownLatch;
// Fenced lock (SPEC 4.2): its async handle and guard.
pub use crate::fenced::aio_fenced::{FencedGuard, FencedLock};
// Semaphores (RSEMAPHORE.*, RPSEMAPHORE.*), async.
pub use crate::aio::semaphore::{ExpirablePermit, ExpirableSemaphore, Semaphore, SemaphorePermit};

/// An async rlock client: one server or a cluster, one renewal task.
///
/// Must be created inside a tokio runtime; its renewal task and the best-effort
/// releases of dropped guards run on that runtime. Cloning is cheap and shares
/// everything.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> rlock_client::Result<()> {
/// use std::time::Duration;
/// let client = rlock_client::aio::Client::open("redis://127.0.0.1/").await?;
/// if let Some(guard) = client.lock("k").acquire_timeout(Duration::from_secs(1)).await? {
///     guard.release().await?;
/// }
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
    pub(crate) runtime: Handle,
    cmd_conn: tokio::sync::Mutex<Option<AConn>>,
    wait_pool: WaitPool<AConn>,
    watchdog: Arc<Watchdog>,
    worker: tokio::task::AbortHandle,
    // Queued tickets (SPEC 5): the shared ticket connection (None: a cluster, or blocking mode).
    tickets: Option<crate::net::tickets::Tickets>,
    // Queued tickets on a cluster: one ticket connection per node with waiters.
    cluster_tickets: Option<crate::net::cluster_tickets::ClusterTickets>,
}

struct Watchdog {
    registry: Mutex<Registry>,
    notify: Notify,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // Guards hold the client too: when it goes, no lock is left to renew.
        self.worker.abort();
    }
}

impl Client {
    /// A client of one server, with default options.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub async fn open<T: IntoConnectionInfo>(info: T) -> Result<Self> {
        Self::open_with(info, ClientOptions::new()).await
    }

    /// A client of one server, with options.
    pub async fn open_with<T: IntoConnectionInfo>(info: T, opts: ClientOptions) -> Result<Self> {
        Ok(Self::new(Target::Single(redis::Client::open(info)?), opts))
    }

    /// A client of a Redis Cluster, given some of its nodes.
    pub async fn open_cluster<T: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<Self> {
        Self::open_cluster_with(nodes, ClientOptions::new()).await
    }

    /// A client of a Redis Cluster, with options.
    pub async fn open_cluster_with<T: IntoConnectionInfo>(
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

    /// A client over an existing redis-rs client. Must be called inside a tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn from_redis(client: redis::Client, opts: ClientOptions) -> Self {
        Self::new(Target::Single(client), opts)
    }

    /// A client over an existing redis-rs cluster client. Must be called inside a
    /// tokio runtime.
    ///
    /// # Panics
    /// Outside a tokio runtime.
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
        let runtime = Handle::current();
        let watchdog = Arc::new(Watchdog {
            registry: Mutex::new(Registry::new(opts.renew_interval(), opts.retry.clone())),
            notify: Notify::new(),
        });
        let worker = runtime
            .spawn(renewal_task(
                watchdog.clone(),
                target.clone(),
                logic::renewal_timeout(&opts),
            ))
            .abort_handle();
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
                runtime,
                cmd_conn: tokio::sync::Mutex::new(None),
                wait_pool: WaitPool::new(opts.idle_wait_connections),
                watchdog,
                worker,
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

    /// A handle on lock `name` with a new owner id; see [`crate::Client::lock`].
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        let owner = self.inner.ids.next_owner();
        self.lock_with_owner(name, owner)
    }

    /// A handle on lock `name` with the caller's owner id.
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

    /// What the server knows about lock `name`; `None` if it is free.
    pub async fn info(&self, name: &str) -> Result<Option<LockInfo>> {
        let (c, info) = (&self.inner, cmd::info(name));
        cmd::parse_info(c.with_retries(c.retries(), || c.run(&info)).await?)
    }

    /// Frees lock `name` whoever holds it; whether there was one.
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        let (c, force) = (&self.inner, cmd::force_release(name));
        cmd::parse_force_release(c.with_retries(c.retries(), || c.run(&force)).await?)
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

    pub(crate) async fn query_with_retries(&self, command: &redis::Cmd) -> Result<Value> {
        let c = &self.inner;
        c.with_retries(c.retries(), || c.run(command)).await
    }
}

impl ClientInner {
    async fn conn(&self) -> RedisResult<AConn> {
        let mut slot = self.cmd_conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = self
            .target
            .connect_async(self.opts.response_timeout)
            .await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// One quick command on the shared multiplexed connection.
    pub(crate) async fn run(&self, c: &redis::Cmd) -> Result<Value> {
        let mut conn = self.conn().await?;
        let r = c.query_async::<Value>(&mut conn).await;
        if let Err(e) = &r {
            if poisons_connection(e) {
                *self.cmd_conn.lock().await = None;
            }
        }
        Ok(r?)
    }

    /// As many attempts as the client's retry policy allows.
    pub(crate) fn retries(&self) -> Retries<'_> {
        Retries::new(&self.opts.retry, &self.jitter)
    }

    /// Runs `attempt` until it succeeds or `retries` says to give up, sleeping between.
    pub(crate) async fn with_retries<T, F, Fut>(
        &self,
        mut retries: Retries<'_>,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        loop {
            match attempt().await {
                Err(e) => match retries.backoff(&e) {
                    Some(pause) => tokio::time::sleep(pause).await,
                    None => return Err(e),
                },
                ok => return ok,
            }
        }
    }

    /// Runs a waiting command (one with `WAIT`): with a queued ticket on the shared
    /// ticket connection where the module supports it (SPEC 5), else blocked on a
    /// connection of its own. `limit` bounds the wait for the answer. Cancel safe: a
    /// ticket granted after its future was dropped is collected and given back.
    pub(crate) async fn wait_query(
        &self,
        limit: Option<Duration>,
        cmd: &redis::Cmd,
    ) -> RedisResult<Value> {
        if let Some(t) = self.tickets.as_ref().filter(|t| t.enabled()) {
            if let Some(r) = t.wait_async(cmd, limit).await {
                return r;
            }
        }
        if let Some(t) = self.cluster_tickets.as_ref().filter(|t| t.enabled()) {
            let slots = || async {
                let mut conn = self.conn().await?;
                crate::net::cluster_tickets::slots_cmd()
                    .query_async::<Value>(&mut conn)
                    .await
            };
            match t.wait_async(cmd, limit, slots).await {
                Ok(r) => return r,
                // Blocked for what is left of the wait.
                Err((Some(rest), left)) => {
                    return self
                        .on_wait_conn(left, |mut conn| async move {
                            let r = rest.query_async::<Value>(&mut conn).await;
                            (conn, r)
                        })
                        .await
                }
                Err((None, _)) => {}
            }
        }
        let cmd = cmd.clone();
        self.on_wait_conn(limit, |mut conn| async move {
            let r = cmd.query_async::<Value>(&mut conn).await;
            (conn, r)
        })
        .await
    }

    /// Runs a blocking command on a connection of its own, bounded by `limit`.
    pub(crate) async fn on_wait_conn<T, F, Fut>(
        &self,
        limit: Option<Duration>,
        f: F,
    ) -> RedisResult<T>
    where
        F: FnOnce(AConn) -> Fut,
        Fut: std::future::Future<Output = (AConn, RedisResult<T>)>,
    {
        let conn = match self.wait_pool.take() {
            Some(c) => c,
            // No response timeout on these: the wait is bounded by the server and by `limit`.
            None => self.target.connect_async(None).await?,
        };
        let run = f(conn);
        let (conn, r) = match limit {
            Some(l) => match tokio::time::timeout(l, run).await {
                Ok(x) => x,
                // The connection went with the timed-out future; the server drops the
                // waiter when the connection closes.
                Err(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no reply to a waiting command",
                    )
                    .into())
                }
            },
            None => run.await,
        };
        self.wait_pool.give_back(conn, &r);
        r
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
        lock_ignoring_poison(&self.watchdog.registry).insert(
            shared.clone(),
            epoch,
            lease,
            renew,
            at,
        );
        self.watchdog.notify.notify_one();
    }

    fn rearmed(&self, handle: u64, epoch: u64, lease: Duration, at: Instant) {
        lock_ignoring_poison(&self.watchdog.registry).rearmed(handle, epoch, lease, at);
    }

    fn unregister(&self, handle: u64) {
        lock_ignoring_poison(&self.watchdog.registry).remove(handle);
    }
}

/// The renewal task: one per client, every due renewal pipelined (per cluster slot)
/// on a connection of its own.
async fn renewal_task(wd: Arc<Watchdog>, target: Target, timeout: Option<Duration>) {
    let mut conn: Option<AConn> = None;
    loop {
        let (due, lost, wake) = {
            let mut reg = lock_ignoring_poison(&wd.registry);
            let (due, lost) = reg.plan(Instant::now());
            (due, lost, reg.next_wake())
        };
        report(lost);
        if due.is_empty() {
            // notify_one stores a permit, so a lock registered between plan() and
            // here still wakes us.
            match wake {
                Some(w) => {
                    let _ = tokio::time::timeout_at(w.into(), wd.notify.notified()).await;
                }
                None => wd.notify.notified().await,
            }
            continue;
        }
        let results = renew_batch(&target, &mut conn, timeout, &due).await;
        let lost = lock_ignoring_poison(&wd.registry).apply_all(&due, results);
        report(lost);
    }
}

async fn renew_batch(
    target: &Target,
    conn: &mut Option<AConn>,
    timeout: Option<Duration>,
    due: &[Due],
) -> Vec<(Outcome, Instant)> {
    let mut out = unanswered(due);
    for (idx, pipe) in renewal_pipelines(due, target.is_cluster()) {
        if conn.is_none() {
            match target.connect_async(timeout).await {
                Ok(c) => *conn = Some(c),
                Err(_) => continue,
            }
        }
        let c = conn.as_mut().expect("connected above");
        let sent_at = Instant::now();
        if !record_renewals(&mut out, &idx, pipe.query_async(c).await, sent_at) {
            *conn = None;
        }
    }
    out
}

/// A handle on one lock, as one owner; see [`crate::Lock`].
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

    /// This handle's hold count as the client knows it (0: not held).
    pub fn hold_count(&self) -> u64 {
        self.shared.local_holds()
    }

    /// Takes the lock, waiting in the server without limit; watchdog lease.
    ///
    /// # Cancel safety
    /// With queued tickets (the default where the module has them; see
    /// [`WaitMode`](crate::WaitMode)), dropping the future leaves its ticket queued until
    /// its wait ends in the server; if it is granted meanwhile, the client collects the
    /// grant and releases it at once. With blocking `WAIT` (`WaitMode::Blocking`,
    /// or a cluster slot half-way through a migration), dropping the future closes its private connection, which
    /// takes it out of the server's queue; if the server handed it the lock at that very
    /// moment, the lock stays held until its lease runs out (it is never renewed).
    pub async fn acquire(&self) -> Result<LockGuard> {
        logic::taken(
            self.acquire_with(AcquireOptions::new()).await?,
            "RLOCK.ACQUIRE WAIT 0 timed out",
        )
    }

    /// Takes the lock if it is free (or already ours); never waits.
    ///
    /// ```no_run
    /// # async fn run(client: rlock_client::aio::Client) -> rlock_client::Result<()> {
    /// if let Some(guard) = client.lock("k").try_acquire().await? {
    ///     guard.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::No))
            .await
    }

    /// Takes the lock, waiting in the server at most `wait`.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::Up(wait)))
            .await
    }

    /// Takes the lock with explicit options.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_with(&self, opts: AcquireOptions) -> Result<Option<LockGuard>> {
        self.acquire_as(opts, cmd::ACQUIRE, cmd::parse_acquire)
            .await
    }

    /// [`Self::acquire_with`] sending `command` (the fenced lock's `RFENCED.ACQUIRE`,
    /// same arguments) and reading each reply with `parse` (which may keep what else
    /// the reply carries: the fencing token).
    pub(crate) async fn acquire_as(
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
                Route::Shared => c.run(&command).await,
                Route::Waiting { limit } => {
                    c.wait_query(limit, &command).await.map_err(Error::from)
                }
            };
            let mut next = run.after_attempt(&**c, shared, sent, reply.and_then(&mut parse));
            if let Next::Renew = next {
                let sent = Instant::now();
                let renew = run.renew_command(shared);
                let renewed = c
                    .with_retries(c.retries(), || c.run(&renew))
                    .await
                    .and_then(cmd::parse_renew);
                next = run.after_renew(&**c, shared, sent, renewed);
            }
            match next {
                Next::Taken => break,
                Next::Renew | Next::Again => {}
                Next::Backoff(pause) => tokio::time::sleep(pause).await,
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
            let (pipe, limit) = logic::replica_check(shared, took.lease_ms, rs);
            let reply = c
                .on_wait_conn(Some(limit), |mut conn| async move {
                    let r = pipe.query_async::<Vec<Value>>(&mut conn).await;
                    (conn, r)
                })
                .await;
            if let Err(e) = logic::replica_outcome(shared, rs, reply) {
                let _ = guard.release().await;
                return Err(e);
            }
        }
        Ok(Some(guard))
    }
}

impl Lock {
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
async fn release_inner(
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
    let reply = c
        .with_retries(retries, || async {
            c.run(&command).await.and_then(cmd::parse_release)
        })
        .await?;
    logic::released(c, shared, epoch, reply)
}

/// One hold of a lock, async; see [`crate::LockGuard`].
///
/// # Drop
/// Dropping the guard stops its renewal at once and spawns one best-effort
/// `RLOCK.RELEASE` (no retries) on the client's runtime: it never blocks, and it
/// works from any thread. Its outcome is not reported; if it cannot run (the runtime
/// is shutting down) the lock expires with its lease.
///
/// # Cancel safety
/// [`release`](Self::release) consumes the guard: if its future is dropped before
/// completing, the release may or may not have reached the server, renewal has
/// stopped, and the lock is freed by the server or expires with its lease. The
/// [`lost`](Self::lost) future is cancel safe.
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: rlock_client::aio::Client) -> rlock_client::Result<()> {
/// let guard = client.lock("k").acquire().await?;
/// tokio::select! {
///     _ = do_work() => guard.release().await.map(drop)?,
///     why = guard.lost() => eprintln!("lock lost ({why:?}); work abandoned"),
/// }
/// # Ok(()) }
/// # async fn do_work() {}
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

    /// Whether the lock is still held, as far as this client knows (no round trip).
    pub fn is_held(&self) -> bool {
        self.shared.is_held(self.epoch)
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason(self.epoch)
    }

    /// Completes when the lock is lost (`Some(reason)`) or released through another
    /// guard of the same handle (`None`). Cancel safe.
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
    /// [`Error::NotHeld`] when the lock was no longer held by this owner.
    ///
    /// # Cancel safety
    /// See the type's documentation.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        self.done = true;
        release_inner(
            &self.client,
            &self.shared,
            self.epoch,
            self.release_lease_ms,
            true,
        )
        .await
    }
}

impl LockGuard {
    /// When the lease must have run out, by this client's clock (None: not held).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.shared.deadline(self.epoch)
    }

    /// Blocks the calling thread until the lock is lost (`Some(reason)`), `timeout`
    /// passes, or the lock is released through another guard of the same handle
    /// (`None`): the blocking API's `wait_lost`, on the handle's own condition variable.
    pub(crate) fn wait_lost(&self, timeout: Option<Duration>) -> Option<LostReason> {
        self.shared.wait_lost(self.epoch, timeout)
    }

    /// Marks the guard done and stops its renewal; what a best-effort release needs.
    fn give_up(&mut self) -> (Arc<ClientInner>, Arc<LockShared>, u64, Option<u64>) {
        self.done = true;
        if self.shared.current(self.epoch) == Some(1) {
            self.client.unregister(self.shared.handle);
        }
        (
            self.client.clone(),
            self.shared.clone(),
            self.epoch,
            self.release_lease_ms,
        )
    }

    /// What dropping the guard does, awaited: stop renewal, one `RLOCK.RELEASE` (no
    /// retries), outcome ignored. The blocking guard's drop runs this to its end.
    pub(crate) async fn release_once(mut self) {
        let (client, shared, epoch, lease) = self.give_up();
        let _ = release_inner(&client, &shared, epoch, lease, false).await;
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (client, shared, epoch, lease) = self.give_up();
        let rt = client.runtime.clone();
        drop(rt.spawn(async move {
            let _ = release_inner(&client, &shared, epoch, lease, false).await;
        }));
    }
}

// Fenced lock (SPEC 4.2): one quick command with the client's retries, for fenced.rs.
impl Client {
    pub(crate) async fn query_retried(&self, command: &redis::Cmd) -> Result<Value> {
        let c = &self.inner;
        c.with_retries(c.retries(), || c.run(command)).await
    }
}
