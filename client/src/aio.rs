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

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{IntoConnectionInfo, RedisResult, Value};
use tokio::runtime::Handle;
use tokio::sync::Notify;

use crate::backoff::Jitter;
use crate::cmd::{self, Acquired, LockInfo, Released};
use crate::conn::{renewal_outcome, renewal_pipelines, AConn, Target};
use crate::error::{poisons_connection, Error, Result};
use crate::options::{millis, AcquireOptions, ClientOptions, Wait};
use crate::state::{LockShared, Lost, LostReason, OwnerIds};
use crate::watchdog::{Due, Outcome, Registry};
use crate::ReleaseOutcome;

/// Extra time a waiting acquire allows beyond its wait limit for the reply to travel.
const WAIT_REPLY_MARGIN: Duration = Duration::from_secs(2);

fn lock_ignoring_poison<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // No critical section here can panic half-way through an update.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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
    inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.inner.ids.client_id())
            .field("target", &self.inner.target)
            .finish_non_exhaustive()
    }
}

struct ClientInner {
    target: Target,
    opts: ClientOptions,
    ids: OwnerIds,
    jitter: Jitter,
    runtime: Handle,
    cmd_conn: tokio::sync::Mutex<Option<AConn>>,
    wait_pool: Mutex<Vec<AConn>>,
    watchdog: Arc<Watchdog>,
    worker: tokio::task::AbortHandle,
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
        let c = redis::cluster::ClusterClient::new(nodes)?;
        Ok(Self::new(Target::Cluster(Box::new(c)), opts))
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
        let runtime = Handle::current();
        let watchdog = Arc::new(Watchdog {
            registry: Mutex::new(Registry::new(opts.renew_interval(), opts.retry.clone())),
            notify: Notify::new(),
        });
        let worker = runtime
            .spawn(renewal_task(
                watchdog.clone(),
                target.clone(),
                crate::blocking::renewal_timeout(&opts),
            ))
            .abort_handle();
        Client {
            inner: Arc::new(ClientInner {
                target,
                ids: OwnerIds::new(),
                jitter: Jitter::new(),
                runtime,
                cmd_conn: tokio::sync::Mutex::new(None),
                wait_pool: Mutex::new(Vec::new()),
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
        let c = cmd::info(name);
        cmd::parse_info(self.inner.with_retries(|| self.inner.run(&c)).await?)
    }

    /// Frees lock `name` whoever holds it; whether there was one.
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        let c = cmd::force_release(name);
        cmd::parse_force_release(self.inner.with_retries(|| self.inner.run(&c)).await?)
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
    async fn run(&self, c: &redis::Cmd) -> Result<Value> {
        let mut conn = self.conn().await?;
        let r = c.query_async::<Value>(&mut conn).await;
        if let Err(e) = &r {
            if poisons_connection(e) {
                *self.cmd_conn.lock().await = None;
            }
        }
        Ok(r?)
    }

    async fn with_retries<T, F, Fut>(&self, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut n = 0;
        loop {
            match attempt().await {
                Err(e) if e.is_transient() && n + 1 < self.opts.retry.max_attempts() => {
                    tokio::time::sleep(self.opts.retry.delay(n, &self.jitter)).await;
                    n += 1;
                }
                r => return r,
            }
        }
    }

    /// Runs a blocking command on a connection of its own, bounded by `limit`.
    async fn on_wait_conn<T, F, Fut>(&self, limit: Option<Duration>, f: F) -> RedisResult<T>
    where
        F: FnOnce(AConn) -> Fut,
        Fut: std::future::Future<Output = (AConn, RedisResult<T>)>,
    {
        let pooled = lock_ignoring_poison(&self.wait_pool).pop();
        let conn = match pooled {
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
        let sound = match &r {
            Ok(_) => true,
            Err(e) => !poisons_connection(e),
        };
        if sound {
            let mut pool = lock_ignoring_poison(&self.wait_pool);
            if pool.len() < self.opts.idle_wait_connections {
                pool.push(conn);
            }
        }
        r
    }

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
        for (shared, epoch, why) in lost {
            shared.mark_lost(epoch, why);
        }
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
        let lost: Vec<_> = {
            let mut reg = lock_ignoring_poison(&wd.registry);
            due.iter()
                .zip(results)
                .filter_map(|(d, (o, at))| reg.apply(d, o, at))
                .collect()
        };
        for (shared, epoch, why) in lost {
            shared.mark_lost(epoch, why);
        }
    }
}

async fn renew_batch(
    target: &Target,
    conn: &mut Option<AConn>,
    timeout: Option<Duration>,
    due: &[Due],
) -> Vec<(Outcome, Instant)> {
    let mut out: Vec<(Outcome, Instant)> = due
        .iter()
        .map(|_| (Outcome::Failed, Instant::now()))
        .collect();
    for (idx, pipe) in renewal_pipelines(due, target.is_cluster()) {
        if conn.is_none() {
            match target.connect_async(timeout).await {
                Ok(c) => *conn = Some(c),
                Err(_) => continue,
            }
        }
        let c = conn.as_mut().expect("connected above");
        let sent_at = Instant::now();
        match pipe.query_async::<Vec<RedisResult<Value>>>(c).await {
            Ok(replies) => {
                for (i, r) in idx.iter().zip(replies) {
                    out[*i] = (renewal_outcome(r), sent_at);
                }
            }
            Err(e) => {
                if poisons_connection(&e) {
                    *conn = None;
                }
            }
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
    /// Dropping the future while it waits closes its private connection, which takes
    /// it out of the server's queue. If the server handed it the lock at that very
    /// moment, the lock stays held until its lease runs out (it is never renewed).
    pub async fn acquire(&self) -> Result<LockGuard> {
        match self.acquire_with(AcquireOptions::new()).await? {
            Some(g) => Ok(g),
            None => Err(Error::UnexpectedReply(
                "RLOCK.ACQUIRE WAIT 0 timed out".into(),
            )),
        }
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
        let c = &self.client;
        let shared = &self.shared;
        let lease = opts.lease.unwrap_or(c.opts.watchdog_timeout);
        if lease.is_zero() {
            return Err(Error::InvalidArgument("lease must be positive"));
        }
        let lease_ms = millis(lease);
        let until = match opts.wait {
            Wait::Up(d) => Some(Instant::now() + d),
            _ => None,
        };
        let mut start = shared.begin_acquire();
        let mut retry = 0u32;
        // One request id for this acquire and all its retries (see the blocking API).
        let mut request = cmd::request_id();
        // The send time of the earliest attempt that may have taken the lock.
        let mut lease_from: Option<Instant> = None;
        loop {
            let sent = Instant::now();
            let attempt: Result<Acquired> = async {
                let wait_ms = match opts.wait {
                    _ if start.holds > 0 => None,
                    Wait::No => None,
                    Wait::Forever => Some(0),
                    Wait::Up(_) => {
                        let left =
                            until.map_or(Duration::ZERO, |u| u.saturating_duration_since(sent));
                        (!left.is_zero()).then(|| millis(left))
                    }
                };
                let command = cmd::acquire(&shared.key, &shared.owner, lease_ms, wait_ms, &request);
                let v = match wait_ms {
                    None => c.run(&command).await?,
                    Some(w) => {
                        let limit = (w > 0).then(|| {
                            Duration::from_millis(w)
                                + WAIT_REPLY_MARGIN.max(c.opts.response_timeout.unwrap_or_default())
                        });
                        c.on_wait_conn(limit, |mut conn| async move {
                            let r = command.query_async::<Value>(&mut conn).await;
                            (conn, r)
                        })
                        .await?
                    }
                };
                cmd::parse_acquire(v)
            }
            .await;
            let from = *lease_from.get_or_insert(sent);
            match attempt {
                Ok(Acquired::Yes) => match confirm_fresh(c, shared, lease, lease_ms, from).await? {
                    Some(at) => {
                        lease_from = Some(at);
                        break;
                    }
                    None => {
                        if start.holds > 0 {
                            shared.mark_lost(start.epoch, LostReason::NotHeld);
                            c.unregister(shared.handle);
                        }
                        start = shared.begin_acquire();
                        request = cmd::request_id();
                        lease_from = None;
                        if opts.wait == Wait::No {
                            return Ok(None);
                        }
                    }
                },
                Ok(Acquired::HeldFor(_)) if start.holds > 0 => {
                    shared.mark_lost(start.epoch, LostReason::NotHeld);
                    c.unregister(shared.handle);
                    start = shared.begin_acquire();
                    request = cmd::request_id();
                    lease_from = None;
                    if opts.wait == Wait::No {
                        return Ok(None);
                    }
                }
                Ok(Acquired::HeldFor(_)) => return Ok(None),
                Err(e) if e.is_transient() && retry + 1 < c.opts.retry.max_attempts() => {
                    tokio::time::sleep(c.opts.retry.delay(retry, &c.jitter)).await;
                    retry += 1;
                }
                Err(e) => return Err(e),
            }
        }
        let last_sent = lease_from.expect("set when the lock was taken");
        let holds = shared.acquired(start.epoch, last_sent, lease);
        if holds == 1 {
            c.register(shared, start.epoch, lease, opts.lease.is_none(), last_sent);
        } else {
            c.rearmed(shared.handle, start.epoch, lease, last_sent);
        }
        let guard = LockGuard {
            client: c.clone(),
            shared: shared.clone(),
            epoch: start.epoch,
            release_lease_ms: opts.lease.is_none().then_some(lease_ms),
            done: false,
        };
        if let Some(rs) = c.opts.replica_sync {
            let pipe = cmd::replica_check(
                &shared.key,
                &shared.owner,
                lease_ms,
                rs.replicas(),
                millis(rs.timeout()),
            );
            let checked = c
                .on_wait_conn(
                    Some(rs.timeout() + WAIT_REPLY_MARGIN),
                    |mut conn| async move {
                        let r = pipe.query_async::<Vec<Value>>(&mut conn).await;
                        (conn, r)
                    },
                )
                .await
                .map_err(Error::from)
                .and_then(|mut v| match v.pop() {
                    Some(w) => cmd::parse_wait(w),
                    None => Err(Error::UnexpectedReply("WAIT: no reply".into())),
                });
            let acked = match checked {
                Ok(n) => n,
                Err(e) => {
                    let _ = guard.release().await;
                    return Err(e);
                }
            };
            if acked < rs.replicas() {
                // Do not leave behind a lock the caller will not know it holds.
                let _ = guard.release().await;
                return Err(Error::ReplicaSync {
                    key: shared.key.clone(),
                    wanted: rs.replicas(),
                    acked,
                });
            }
        }
        Ok(Some(guard))
    }
}

/// When the lease of a lock just taken can be counted from; see the blocking API's
/// `confirm_fresh`. `None`: the server says the lock is no longer ours.
async fn confirm_fresh(
    c: &ClientInner,
    shared: &LockShared,
    lease: Duration,
    lease_ms: u64,
    from: Instant,
) -> Result<Option<Instant>> {
    if from.elapsed() < lease / 3 {
        return Ok(Some(from));
    }
    let sent = Instant::now();
    let renew = cmd::renew(&shared.key, &shared.owner, lease_ms);
    match c
        .with_retries(|| c.run(&renew))
        .await
        .and_then(cmd::parse_renew)
    {
        Ok(true) => Ok(Some(sent)),
        Ok(false) => Ok(None),
        Err(e) if e.is_transient() => Ok(Some(from)),
        Err(e) => Err(e),
    }
}

async fn release_inner(
    c: &ClientInner,
    shared: &LockShared,
    epoch: u64,
    lease_ms: Option<u64>,
    retries: bool,
) -> Result<ReleaseOutcome> {
    let not_held = || Error::NotHeld {
        key: shared.key.clone(),
    };
    let Some(holds) = shared.current(epoch) else {
        return Err(not_held());
    };
    if holds == 1 {
        // Stop renewing before the lock can be freed.
        c.unregister(shared.handle);
    }
    let max = if retries {
        c.opts.retry.max_attempts()
    } else {
        1
    };
    // One request id for this release and its retries: never applied twice.
    let request = cmd::request_id();
    let command = cmd::release(&shared.key, &shared.owner, lease_ms, &request);
    let mut retry = 0;
    let reply = loop {
        match c.run(&command).await.and_then(cmd::parse_release) {
            Err(e) if e.is_transient() && retry + 1 < max => {
                tokio::time::sleep(c.opts.retry.delay(retry, &c.jitter)).await;
                retry += 1;
            }
            r => break r?,
        }
    };
    match reply {
        Released::StillHeld => {
            shared.released(epoch, false);
            Ok(ReleaseOutcome::StillHeld)
        }
        Released::Freed => {
            shared.released(epoch, true);
            c.unregister(shared.handle);
            Ok(ReleaseOutcome::Freed)
        }
        Released::NotHeld => {
            shared.mark_lost(epoch, LostReason::NotHeld);
            c.unregister(shared.handle);
            Err(not_held())
        }
    }
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
        let rt = client.runtime.clone();
        drop(rt.spawn(async move {
            let _ = release_inner(&client, &shared, epoch, lease, false).await;
        }));
    }
}
