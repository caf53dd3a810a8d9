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

mod lock;
pub(crate) mod multi;
pub(crate) mod rwlock;
pub(crate) mod semaphore;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{IntoConnectionInfo, RedisResult, Value};
use tokio::runtime::Handle;
use tokio::sync::Notify;

pub use crate::aio::rwlock::RwLock;
use crate::error::{poisons_connection, Error, Result};
use crate::net::conn::{
    caller_blocks, record_renewals, renewal_pipelines, unanswered, AConn, CallerConns, Target,
    WaitPool,
};
use crate::net::tickets::Confirm;
use crate::options::{AcquireOptions, ClientOptions, Mode, Wait};
use crate::proto::backoff::Jitter;
use crate::proto::cmd::{self, LockInfo};
use crate::proto::logic::{self, lock_ignoring_poison, Acquiring, Next, Renewals, Retries, Route};
use crate::proto::scripts;
use crate::proto::state::{LockShared, Lost, LostReason, OwnerIds};
use crate::proto::watchdog::{report, Due, Outcome, Registry};
use crate::ReleaseOutcome;
pub use lock::{Lock, LockGuard};
// Several locks at once (all or a majority): the one implementation, the blocking
// MultiLock and RedLock run it.
pub use multi::{MultiGuard, MultiLock, RedLock, RedLockGuard};

// Countdown latch (clients/rust/src/latch.rs): `client.latch(name)`.
pub use crate::latch::aio::CountDownLatch;
// Fenced lock (design.md 4.2): its async handle and guard.
pub use crate::fenced::aio_fenced::{FencedGuard, FencedLock};
// Semaphores (RSEMAPHORE.*, RPSEMAPHORE.*), async.
pub use crate::aio::semaphore::{ExpirablePermit, ExpirableSemaphore, Semaphore, SemaphorePermit};

/// The publish command scripts mode's scripts get: classic pub/sub on a single server
/// and on a cluster without sharded pub/sub (it reaches every node's subscribers).
const PUBLISH: &str = "publish";

/// On a cluster that has sharded pub/sub (Redis 7+, Valkey), as Redisson 4.7 publishes
/// there: a Redisson waiter listens with `SSUBSCRIBE` and would not hear a `PUBLISH`.
const SPUBLISH: &str = "spublish";

/// Whether `c` is one of the module's commands (what scripts mode does otherwise).
fn is_module(c: &redis::Cmd) -> bool {
    match c.args_iter().next() {
        Some(redis::Arg::Simple(verb)) => scripts::is_module_command(&[verb.to_vec()]),
        _ => false,
    }
}

/// The server has no such command, or this user may not run it: either way the module's
/// commands cannot be used here.
fn no_module(e: &Error) -> bool {
    match e {
        Error::Server { code, message } => {
            code == "NOPERM"
                || (code == "ERR" && message.to_ascii_lowercase().starts_with("unknown command"))
        }
        _ => false,
    }
}

/// A guard that can give itself up: stop renewal, one release attempt, outcome ignored.
/// What dropping a guard does; the blocking guards run it to its end when dropped.
pub(crate) trait ReleaseOnce: Send + 'static {
    /// The release, as a future the caller awaits or spawns.
    fn release_once(self) -> impl Future<Output = ()> + Send + 'static;
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
    // A single server's connections for blocking API callers' quick commands.
    caller_conns: Option<CallerConns>,
    // A cluster opened by this crate: scripts mode's connection, without redis-rs's own
    // retries (None: scripts go on `cmd_conn`).
    scripts_target: Option<Target>,
    scripts_conn: tokio::sync::Mutex<Option<AConn>>,
    wait_pool: WaitPool<AConn>,
    watchdog: Arc<Watchdog>,
    worker: tokio::task::AbortHandle,
    // Queued tickets (design.md 5): the shared ticket connection (None: a cluster, or blocking mode).
    tickets: Option<crate::net::tickets::Tickets>,
    // Queued tickets on a cluster: one ticket connection per node with waiters.
    cluster_tickets: Option<crate::net::cluster_tickets::ClusterTickets>,
    // Replica sync's default: the replicas each node had when last asked.
    replica_counts: tokio::sync::Mutex<crate::proto::replicas::ReplicaCounts>,
    // Module or Redisson's scripts (docs/scripts-mode.md): what the probe found.
    backend: Arc<Backend>,
    // Scripts mode's subscriber connection (opened at the first wait; on a cluster with
    // sharded pub/sub, one per node with waiters).
    subscriber: crate::net::pubsub::Subscribers,
    // A cluster's scripts' publish command, once asked (Python's `detect` alike).
    publish: Mutex<Option<&'static str>>,
}

/// What a client's probe found, and when (scripts mode asks again every `REPROBE`).
pub(crate) struct Backend {
    setting: Mode,
    found: Mutex<Option<(Mode, Instant)>>,
    // Held while asking, so that calls starting together ask once.
    asking: tokio::sync::Mutex<()>,
}

/// How often a client in scripts mode (setting `Auto`) asks again whether the module is
/// there: scripts keep working on a server that gained the module, so no error would tell.
const REPROBE: Duration = Duration::from_secs(30);

impl Backend {
    fn new(setting: Mode) -> Self {
        Backend {
            setting,
            found: Mutex::new(None),
            asking: tokio::sync::Mutex::new(()),
        }
    }

    /// Module or Scripts if known and fresh; None: ask the server.
    fn known(&self) -> Option<Mode> {
        match self.setting {
            Mode::Auto => match *lock_ignoring_poison(&self.found) {
                Some((Mode::Scripts, at)) if at.elapsed() >= REPROBE => None,
                Some((m, _)) => Some(m),
                None => None,
            },
            m => Some(m),
        }
    }

    /// Ask again at the next module command (setting `Auto` only).
    pub(crate) fn forget(&self) {
        *lock_ignoring_poison(&self.found) = None;
    }

    fn set(&self, m: Mode) {
        *lock_ignoring_poison(&self.found) = Some((m, Instant::now()));
    }

    /// Whether renewals go as scripts (the last known mode; a lock is renewed only after
    /// an acquire found it).
    pub(crate) fn scripts_now(&self) -> bool {
        match self.setting {
            Mode::Auto => matches!(*lock_ignoring_poison(&self.found), Some((Mode::Scripts, _))),
            m => m == Mode::Scripts,
        }
    }
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
        // Scripts mode's connection: without redis-rs's retries, which would send a script
        // again after a failure past the write (docs/scripts-mode.md, Retries).
        let once = redis::cluster::ClusterClientBuilder::new(nodes.clone())
            .retries(0)
            .build()?;
        let c = redis::cluster::ClusterClient::new(nodes)?;
        let client = Self::new_with_template(Target::Cluster(Box::new(c)), opts, template);
        Ok(client.with_scripts_target(Target::Cluster(Box::new(once))))
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

    /// Scripts mode's commands go to `target` (just made: nothing shares the client yet).
    fn with_scripts_target(mut self, target: Target) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.scripts_target = Some(target);
        }
        self
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
        let backend = Arc::new(Backend::new(opts.mode));
        let worker = runtime
            .spawn(renewal_task(
                watchdog.clone(),
                target.clone(),
                logic::renewal_timeout(&opts),
                backend.clone(),
            ))
            .abort_handle();
        // A single server's one subscriber; a cluster's, per node (sharded pub/sub) or one
        // (classic pub/sub reaches every node). A cluster client made from a redis-rs
        // ClusterClient has no node address to give them: its scripts-mode waits fail,
        // saying so.
        let single = match &target {
            Target::Single(c) => Some(c.clone()),
            Target::Cluster(_) => None,
        };
        let forget = backend.clone();
        let subscriber = crate::net::pubsub::Subscribers::new(
            single,
            target.is_cluster(),
            template.clone(),
            move || forget.forget(),
        );
        // One tag per client (design.md 5): its tickets' messages reach it alone.
        let tag: Arc<str> = crate::proto::cmd::notify_tag().into();
        let tickets = match &target {
            Target::Single(c) => crate::net::tickets::Tickets::new(c, opts.wait_mode, tag.clone()),
            Target::Cluster(_) => None,
        };
        let cluster_tickets = match &target {
            Target::Cluster(_) => {
                crate::net::cluster_tickets::ClusterTickets::new(template, opts.wait_mode, tag)
            }
            Target::Single(_) => None,
        };
        let caller_conns = match &target {
            Target::Single(c) => Some(CallerConns::new(c.clone(), opts.response_timeout)),
            Target::Cluster(_) => None,
        };
        Client {
            inner: Arc::new(ClientInner {
                caller_conns,
                tickets,
                cluster_tickets,
                target,
                ids: OwnerIds::new(),
                jitter: Jitter::new(),
                runtime,
                cmd_conn: tokio::sync::Mutex::new(None),
                scripts_target: None,
                scripts_conn: tokio::sync::Mutex::new(None),
                replica_counts: Default::default(),
                backend,
                subscriber,
                publish: Mutex::new(None),
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

    /// Whether the primitives run on the module ([`Mode::Module`]) or on Redisson's
    /// scripts ([`Mode::Scripts`]): the setting, or with [`Mode::Auto`] what the server
    /// answers (asked now if not known).
    pub async fn mode(&self) -> Result<Mode> {
        self.inner.mode().await
    }

    /// What the server can do (`RLOCK.HELLO`, asked now on the command connection; on a
    /// cluster, any one node): [`Capabilities::NoModule`](crate::Capabilities::NoModule) when the server does not know
    /// the command. The ticket connection asks the same on each connect by itself.
    pub async fn capabilities(&self) -> Result<crate::Capabilities> {
        let c = &self.inner;
        let mut probe = redis::Cmd::new();
        for a in crate::proto::hello::hello_args() {
            probe.arg(a);
        }
        let attempt = || async {
            let mut conn = c.conn().await?;
            let reply = probe.query_async::<Value>(&mut conn).await;
            Ok(crate::proto::hello::parse(reply)?)
        };
        c.with_retries(c.retries(), attempt).await
    }
}

// Read-write lock (clients/rust/src/rwlock.rs): a handle on one side of it, and a plain
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

    /// Scripts mode's connection: the shared one, or on a cluster this crate opened, one
    /// without redis-rs's retries.
    async fn scripts_conn(&self) -> RedisResult<AConn> {
        let Some(target) = &self.scripts_target else {
            return self.conn().await;
        };
        let mut slot = self.scripts_conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = target.connect_async(self.opts.response_timeout).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// One quick command on the shared multiplexed connection; a module command goes
    /// as Redisson's scripts where the module is absent (docs/scripts-mode.md).
    pub(crate) async fn run(&self, c: &redis::Cmd) -> Result<Value> {
        if !is_module(c) {
            return self.run_raw(c).await;
        }
        for attempt in 0..2 {
            if self.mode().await? == Mode::Scripts {
                let words = scripts::words(c);
                let publish = self.publish().await?;
                let mut conn = self.scripts_conn().await?;
                let r = crate::net::scripts::command(&mut conn, &words, publish).await;
                return self.after(r.map(|(v, _)| v)).await;
            }
            match self.run_raw(c).await {
                Err(e) if attempt == 0 && self.backend.setting == Mode::Auto && no_module(&e) => {
                    // The module went (a failover to a server without it): ask again.
                    self.backend.forget();
                }
                r => return self.after(r).await,
            }
        }
        unreachable!("the second attempt returns")
    }

    /// After a module command: on a connection error, drop the connection and, in
    /// `Auto`, ask again at the next one (a failover may have changed the server).
    async fn after(&self, r: Result<Value>) -> Result<Value> {
        if let Err(Error::Redis(e) | Error::OutcomeUnknown { cause: e, .. }) = &r {
            if poisons_connection(e) {
                *self.cmd_conn.lock().await = None;
                *self.scripts_conn.lock().await = None;
                self.backend.forget();
            }
        }
        r
    }

    /// Module or Scripts for the next module command, asking the server if not known.
    pub(crate) async fn mode(&self) -> Result<Mode> {
        if let Some(m) = self.backend.known() {
            return Ok(m);
        }
        let _asking = self.backend.asking.lock().await;
        if let Some(m) = self.backend.known() {
            return Ok(m); // another call asked meanwhile
        }
        let found = self.probe().await;
        if let Err(Error::Redis(e)) = &found {
            if poisons_connection(e) {
                *self.cmd_conn.lock().await = None;
            }
        }
        let found = found?;
        self.backend.set(found);
        Ok(found)
    }

    /// `RLOCK.HELLO` ("unknown command": no module). A user not allowed it is asked
    /// `RLOCK.ACQUIRE` without arguments instead (the module answers a wrong-arity
    /// error, which changes nothing; "unknown command" or NOPERM: no module).
    async fn probe(&self) -> Result<Mode> {
        let mut hello = redis::Cmd::new();
        for a in crate::proto::hello::hello_args() {
            hello.arg(a);
        }
        let reply = self.raw(&hello).await;
        match crate::proto::hello::parse(reply) {
            Ok(crate::Capabilities::NoModule) => Ok(Mode::Scripts),
            Ok(_) => Ok(Mode::Module),
            Err(e) if e.code() == Some("NOPERM") => {
                let r = self.raw(&redis::cmd("RLOCK.ACQUIRE")).await;
                match r.map_err(Error::from) {
                    Err(e) if no_module(&e) => Ok(Mode::Scripts),
                    _ => Ok(Mode::Module),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The scripts' publish command: on a cluster, asked once whether it has sharded pub/sub
    /// (`SPUBLISH` to a channel nobody hears; "unknown command" or `NOPERM`: it has not).
    async fn publish(&self) -> Result<&'static str> {
        if !self.target.is_cluster() {
            return Ok(PUBLISH);
        }
        if let Some(p) = *lock_ignoring_poison(&self.publish) {
            return Ok(p);
        }
        let probe = redis::cmd("SPUBLISH")
            .arg("rlock:probe:spublish")
            .arg("")
            .to_owned();
        let found = match self.run_raw(&probe).await {
            Ok(_) => SPUBLISH,
            Err(e) if no_module(&e) => PUBLISH,
            Err(Error::Server { .. }) => SPUBLISH,
            Err(e) => return Err(e),
        };
        *lock_ignoring_poison(&self.publish) = Some(found);
        Ok(found)
    }

    /// One command as it is, on the shared multiplexed connection.
    async fn run_raw(&self, c: &redis::Cmd) -> Result<Value> {
        Ok(self.raw(c).await?)
    }

    /// `c` on this thread's own connection where the caller blocks, else on the shared one.
    async fn raw(&self, c: &redis::Cmd) -> RedisResult<Value> {
        if let Some(cc) = self.caller_conns.as_ref().filter(|_| caller_blocks()) {
            if let Some(r) = cc.query(c) {
                return r;
            }
        }
        let mut conn = self.conn().await?;
        let r = c.query_async::<Value>(&mut conn).await;
        if let Err(e) = &r {
            if poisons_connection(e) {
                *self.cmd_conn.lock().await = None;
            }
        }
        r
    }

    /// The replicas connected to the node serving `key`, as last read (at most once per
    /// `replicas::REFRESH`). A failed or refused read counts as none until the next one:
    /// replica sync must not turn a server that hides its topology into failed acquires.
    pub(crate) async fn connected_replicas(&self, key: &[u8]) -> u32 {
        use crate::proto::replicas;
        // Held across the read, so that concurrent acquires ask once.
        let mut counts = self.replica_counts.lock().await;
        let now = Instant::now();
        let cluster = self.target.is_cluster();
        if counts.stale(now) {
            let read = if cluster {
                crate::net::cluster_tickets::slots_cmd()
            } else {
                redis::cmd("ROLE")
            };
            match self.run(&read).await {
                Ok(v) if cluster => counts.set_ranges(replicas::slot_replicas(&v), now),
                Ok(v) => counts.set_single(replicas::role_replicas(&v), now),
                Err(_) if cluster => counts.set_ranges(Vec::new(), now),
                Err(_) => counts.set_single(None, now),
            }
        }
        if cluster {
            counts.of_slot(crate::proto::watchdog::slot(key))
        } else {
            counts.single()
        }
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
    /// ticket connection where the module supports it (design.md 5), else blocked on a
    /// connection of its own. `limit` bounds the wait for the answer. Cancel safe: a
    /// ticket granted after its future was dropped is collected and given back.
    ///
    /// With `confirm`, a lock's or RW lock's ticket returns on its `granted` message, its
    /// confirmation sent off the path; `confirm` then says whether it was taken back.
    pub(crate) async fn wait_query(
        &self,
        limit: Option<Duration>,
        cmd: &redis::Cmd,
        confirm: Option<&Arc<Confirm>>,
    ) -> Result<Value> {
        if is_module(cmd) && self.mode().await? == Mode::Scripts {
            let words = scripts::words(cmd);
            let publish = self.publish().await?;
            let mut conn = self.scripts_conn().await?;
            let r = crate::net::scripts::wait(&mut conn, &self.subscriber, &words, limit, publish);
            return self.after(r.await).await;
        }
        let r = self
            .wait_module(limit, cmd, confirm)
            .await
            .map_err(Error::from);
        if let Err(e) = &r {
            if self.backend.setting == Mode::Auto && (no_module(e) || e.is_transient()) {
                self.backend.forget();
            }
        }
        r
    }

    /// [`Self::wait_query`] with the module.
    async fn wait_module(
        &self,
        limit: Option<Duration>,
        cmd: &redis::Cmd,
        confirm: Option<&Arc<Confirm>>,
    ) -> RedisResult<Value> {
        if let Some(t) = self.tickets.as_ref().filter(|t| t.enabled()) {
            if let Some(r) = t.wait_async(cmd, limit, confirm).await {
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
            match t.wait_async(cmd, limit, slots, confirm).await {
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
        let wake = lock_ignoring_poison(&self.watchdog.registry).insert(
            shared.clone(),
            epoch,
            lease,
            renew,
            at,
        );
        if wake {
            self.watchdog.notify.notify_one();
        }
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
async fn renewal_task(
    wd: Arc<Watchdog>,
    target: Target,
    timeout: Option<Duration>,
    backend: Arc<Backend>,
) {
    let mut conn: Option<AConn> = None;
    loop {
        let (due, lost, wake) = {
            let mut reg = lock_ignoring_poison(&wd.registry);
            let (due, lost) = reg.plan(Instant::now());
            let wake = reg.next_wake();
            if due.is_empty() {
                reg.worker_sleeps(wake);
            }
            (due, lost, wake)
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
        // Bounded by the earliest lease end: past it the lock is lost whatever the
        // renewal's fate, and its holder must hear so then (a stalled connection would
        // otherwise hold the report back until its own timeout, or the partition heals).
        let limit = lock_ignoring_poison(&wd.registry).earliest_deadline();
        let batch = renew_batch(&target, &mut conn, timeout, &due, backend.scripts_now());
        let results = match limit {
            Some(at) => match tokio::time::timeout_at(at.into(), batch).await {
                Ok(results) => results,
                Err(_) => {
                    conn = None; // its pipeline may still be in flight
                    unanswered(&due)
                }
            },
            None => batch.await,
        };
        let lost = lock_ignoring_poison(&wd.registry).apply_all(&due, results);
        report(lost);
    }
}

async fn renew_batch(
    target: &Target,
    conn: &mut Option<AConn>,
    timeout: Option<Duration>,
    due: &[Due],
    scripts: bool,
) -> Vec<(Outcome, Instant)> {
    let mut out = unanswered(due);
    for (idx, pipe) in renewal_pipelines(due, target.is_cluster(), scripts) {
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

// Fenced lock (design.md 4.2): one quick command with the client's retries, for fenced.rs.
impl Client {
    pub(crate) async fn query_retried(&self, command: &redis::Cmd) -> Result<Value> {
        let c = &self.inner;
        c.with_retries(c.retries(), || c.run(command)).await
    }
}
