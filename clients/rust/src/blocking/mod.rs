//! The blocking API: a thin layer over the async implementation ([`crate::aio`]), as
//! reqwest's `blocking` client is over its async one. Each blocking handle holds its
//! async twin and the client's runtime ([`Rt`]); a blocking call runs the async call to
//! its end on the calling thread, while the runtime's one worker thread drives the
//! sockets, the timers, the renewal task and the ticket dispatcher. The logic (retries,
//! request ids, waiting, renewal, the lost signal) is written once, async.
//!
//! - this file: [`Rt`] and [`Client`];
//! - `lock`: [`Lock`] and [`LockGuard`]; `rwlock`, `semaphore`: the other primitives'
//!   handles and guards; `multi`: [`crate::MultiLock`] and [`crate::RedLock`], over their
//!   async twins in `aio/multi.rs`.

pub(crate) mod lock;
pub(crate) mod multi;
pub(crate) mod rwlock;
pub(crate) mod semaphore;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

use redis::IntoConnectionInfo;

use crate::aio::{self, ReleaseOnce};
use crate::error::Result;
use crate::options::ClientOptions;
use crate::proto::cmd::LockInfo;

pub use lock::{Lock, LockGuard};

/// The runtime of one blocking client: one worker thread of its own, shut down (without
/// waiting) when the client's last handle, guard included, is gone.
#[derive(Clone)]
pub(crate) struct Rt(Arc<Owned>);

struct Owned(Option<tokio::runtime::Runtime>);

impl Drop for Owned {
    fn drop(&mut self) {
        // `shutdown_background` never blocks, so the last handle may go anywhere, even
        // inside another tokio runtime (a plain drop would panic there).
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Wakes the thread that polls a blocking call.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

impl Rt {
    fn new() -> Result<Rt> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("rlock-client")
            .enable_all()
            .build()
            .map_err(redis::RedisError::from)?;
        Ok(Rt(Arc::new(Owned(Some(rt)))))
    }

    /// The runtime's handle.
    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        self.0
             .0
            .as_ref()
            .expect("the runtime lives as long as its handles")
            .handle()
    }

    /// Runs `f` to its end on the calling thread, inside this runtime's context (so its
    /// sockets and timers belong to the runtime, whose worker drives them). Unlike
    /// `Runtime::block_on` it works from any thread, a runtime's own included, as the
    /// blocking API did before: it blocks that thread, as any blocking call does.
    pub(crate) fn block_on<F: Future>(&self, f: F) -> F::Output {
        let _context = self.handle().enter();
        let waker = Waker::from(Arc::new(Unpark(thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut f = pin!(f);
        // Its quick commands may do their I/O right here (net/conn.rs, `CallerConns`).
        crate::net::conn::as_blocking_caller(|| loop {
            if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
                return out;
            }
            thread::park();
        })
    }

    /// A guard's best-effort release on drop: to its end where blocking is fine, or
    /// spawned on the client's runtime when dropped inside an async runtime, so that
    /// dropping never blocks a runtime thread.
    pub(crate) fn finish<F>(&self, f: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        if tokio::runtime::Handle::try_current().is_ok() {
            // The task keeps the runtime alive until the release is done (the guard may
            // have held the client's last handle). It then lets a thread of its own drop
            // that handle: a runtime is not shut down from one of its workers.
            let keep = self.clone();
            drop(self.handle().spawn(async move {
                f.await;
                thread::spawn(move || drop(keep));
            }));
        } else {
            self.block_on(f);
        }
    }
}

/// The async guard inside a blocking one, written once for every blocking guard:
/// borrowed while held, taken by an explicit release, released best-effort on drop.
pub(crate) struct Held<G: ReleaseOnce> {
    // `None` once the explicit release took it.
    inner: Option<G>,
    pub(crate) rt: Rt,
}

impl<G: ReleaseOnce> Held<G> {
    pub(crate) fn new(inner: G, rt: &Rt) -> Held<G> {
        Held {
            inner: Some(inner),
            rt: rt.clone(),
        }
    }

    /// The async guard (only an explicit release takes it, and that consumes the face).
    pub(crate) fn get(&self) -> &G {
        self.inner
            .as_ref()
            .expect("a guard is only taken by its release")
    }

    /// The async guard, for an explicit release.
    pub(crate) fn take(&mut self) -> G {
        self.inner.take().expect("a guard is released once")
    }
}

impl<G: ReleaseOnce + std::fmt::Debug> std::fmt::Debug for Held<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl<G: ReleaseOnce> Drop for Held<G> {
    fn drop(&mut self) {
        if let Some(guard) = self.inner.take() {
            self.rt.finish(guard.release_once());
        }
    }
}

/// A blocking rlock client: one server or a cluster, one worker thread that renews
/// its locks and dispatches its queued tickets.
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
    pub(crate) inner: aio::Client,
    pub(crate) rt: Rt,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
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
        let rt = Rt::new()?;
        let inner = rt.block_on(aio::Client::open_with(info, opts))?;
        Ok(Client { inner, rt })
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
        let rt = Rt::new()?;
        let inner = rt.block_on(aio::Client::open_cluster_with(nodes, opts))?;
        Ok(Client { inner, rt })
    }

    /// A client over an existing redis-rs client (its TLS, auth and database).
    ///
    /// ```no_run
    /// let redis = redis::Client::open("redis://127.0.0.1/")?;
    /// let client = rlock_client::Client::from_redis(redis, Default::default());
    /// # Ok::<_, redis::RedisError>(())
    /// ```
    ///
    /// # Panics
    /// When the operating system refuses the client its worker thread.
    pub fn from_redis(client: redis::Client, opts: ClientOptions) -> Self {
        let rt = Rt::new().expect("rlock-client: cannot start the client's worker thread");
        let inner = {
            let _context = rt.handle().enter();
            aio::Client::from_redis(client, opts)
        };
        Client { inner, rt }
    }

    /// A client over an existing redis-rs cluster client.
    ///
    /// # Panics
    /// When the operating system refuses the client its worker thread.
    pub fn from_cluster(client: redis::cluster::ClusterClient, opts: ClientOptions) -> Self {
        let rt = Rt::new().expect("rlock-client: cannot start the client's worker thread");
        let inner = {
            let _context = rt.handle().enter();
            aio::Client::from_cluster(client, opts)
        };
        Client { inner, rt }
    }

    /// This client's uuid, the first part of its owner ids.
    pub fn id(&self) -> &str {
        self.inner.id()
    }

    /// The options the client was made with.
    pub fn options(&self) -> &ClientOptions {
        self.inner.options()
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
        Lock::new(self.inner.lock(name), &self.rt)
    }

    /// A handle on the lock `name` with an owner id of the caller's choosing, for
    /// example to take over a lock after a restart, or to match a Redisson owner.
    ///
    /// The retry logic assumes this handle is the owner id's only user.
    pub fn lock_with_owner(&self, name: impl Into<String>, owner: impl Into<String>) -> Lock {
        Lock::new(self.inner.lock_with_owner(name, owner), &self.rt)
    }

    /// What the server knows about lock `name` (`RLOCK.INFO`); `None` if it is free.
    pub fn info(&self, name: &str) -> Result<Option<LockInfo>> {
        self.rt.block_on(self.inner.info(name))
    }

    /// Frees lock `name` whoever holds it (`RLOCK.FORCERELEASE`); whether there was one.
    /// Its holder finds out at its next renewal or release.
    pub fn force_release(&self, name: &str) -> Result<bool> {
        self.rt.block_on(self.inner.force_release(name))
    }

    /// Whether the primitives run on the module or on Redisson's scripts; see
    /// [`crate::aio::Client::mode`].
    pub fn mode(&self) -> Result<crate::Mode> {
        self.rt.block_on(self.inner.mode())
    }

    /// What the server can do (`RLOCK.HELLO`): the module's version, protocol and
    /// features, or [`crate::Capabilities::NoModule`].
    pub fn capabilities(&self) -> Result<crate::Capabilities> {
        self.rt.block_on(self.inner.capabilities())
    }
}
