//! The blocking [`MultiLock`] and [`RedLock`]: thin faces over their async twins in
//! `aio/multi.rs`, the one implementation (rounds, give-backs, the Redlock quorum and
//! validity, the loss signal). Each blocking call runs the async one to its end on the
//! runtime of the first lock's client, whose context the parts' tasks and timers then
//! use (each part's sockets stay driven by its own client's runtime); the guards wrap
//! the parts' async guards as blocking [`LockGuard`]s, each on its own lock's runtime.

use std::time::Duration;

use super::{Lock, LockGuard, Rt};
use crate::aio;
use crate::aio::multi::{tally, Group, Part};
use crate::error::{Error, Result};
use crate::options::AcquireOptions;
use crate::proto::logic::taken;
use crate::proto::state::LostReason;

pub use crate::aio::multi::{redlock_drift, redlock_validity};

impl Part for LockGuard {
    fn part_is_held(&self) -> bool {
        self.is_held()
    }

    fn part_deadline(&self) -> Option<std::time::Instant> {
        self.deadline()
    }

    fn part_on_lost(&self, f: Box<dyn FnOnce(LostReason) + Send + 'static>) {
        self.on_lost(f)
    }
}

impl Group<LockGuard> {
    fn release(self) -> (usize, Option<Error>) {
        tally(
            self.guards
                .into_iter()
                .map(LockGuard::release)
                .collect::<Vec<_>>(),
        )
    }
}

/// The blocking parts of an async group: each part's guard on the runtime of the lock
/// (of `locks`) whose owner it is.
fn blocking_group(group: Group<aio::LockGuard>, locks: &[Lock]) -> Group<LockGuard> {
    group.map(|g| {
        let lock = locks
            .iter()
            .find(|l| l.owner() == g.owner() && l.name() == g.name())
            .unwrap_or(&locks[0]);
        LockGuard::new(g, lock.rt())
    })
}

/// The runtime a combined call runs on: the first lock's client's.
fn first_rt(locks: &[Lock], what: &'static str) -> Result<Rt> {
    locks
        .first()
        .map(|l| l.rt().clone())
        .ok_or(Error::InvalidArgument(what))
}

/// Several locks taken together, all or none (Redisson's `RedissonMultiLock`).
///
/// The locks may live on one server or on several, through one client or several.
/// They are taken one after another in the order given, each waiting at most what is
/// left of the wait limit; when one cannot be had (held past the limit, or an error),
/// those already taken are released and the acquire fails. Each lock is renewed by its
/// own client's watchdog; the guard counts as lost as soon as any lock is lost.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use rlock_client::{Client, MultiLock};
///
/// # fn main() -> rlock_client::Result<()> {
/// let a = Client::open("redis://10.0.0.1/")?;
/// let b = Client::open("redis://10.0.0.2/")?;
/// let both = MultiLock::new([a.lock("account:1"), b.lock("account:2")]);
/// if let Some(guard) = both.acquire_timeout(Duration::from_secs(2))? {
///     // ... move money between the two accounts ...
///     guard.release()?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MultiLock {
    locks: Vec<Lock>,
    inner: aio::MultiLock,
}

impl MultiLock {
    /// All of `locks`, taken in this order.
    pub fn new(locks: impl IntoIterator<Item = Lock>) -> MultiLock {
        let locks: Vec<Lock> = locks.into_iter().collect();
        let inner = aio::MultiLock::new(locks.iter().map(|l| l.inner().same_handle()));
        MultiLock { locks, inner }
    }

    /// The locks.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// Takes all the locks, waiting as long as it takes; watchdog leases.
    ///
    /// Waits in rounds of 1.5 s per lock: a round that cannot take them all gives
    /// back what it took and starts again after a short random pause.
    pub fn acquire(&self) -> Result<MultiGuard> {
        taken(
            self.acquire_with(AcquireOptions::new())?,
            "a wait without limit ended",
        )
    }

    /// Takes all the locks if each is free (or already ours); never waits.
    pub fn try_acquire(&self) -> Result<Option<MultiGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(crate::Wait::No))
    }

    /// Takes all the locks, waiting at most `wait` in all.
    pub fn acquire_timeout(&self, wait: Duration) -> Result<Option<MultiGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(crate::Wait::Up(wait)))
    }

    /// Takes all the locks with explicit options; `opts.wait()` bounds the whole.
    ///
    /// # Errors
    /// The first error of a part (after that part's own retries); the locks taken
    /// before it have been released. [`Error::InvalidArgument`] with no locks.
    pub fn acquire_with(&self, opts: AcquireOptions) -> Result<Option<MultiGuard>> {
        let rt = first_rt(&self.locks, "a MultiLock needs at least one lock")?;
        let taken = rt.block_on(self.inner.acquire_with(opts))?;
        Ok(taken.map(|g| MultiGuard {
            group: blocking_group(g.group, &self.locks),
        }))
    }
}

/// All the locks of a [`MultiLock`], held.
///
/// # Drop
/// Dropping it drops every part's guard: each stops its renewal and releases
/// best-effort (see [`LockGuard`]'s `# Drop`).
///
/// # Examples
///
/// ```no_run
/// # use rlock_client::{Client, MultiLock};
/// # let c = Client::open("redis://127.0.0.1/")?;
/// let guard = MultiLock::new([c.lock("a"), c.lock("b")]).acquire()?;
/// guard.on_lost(|why| eprintln!("one of the locks was lost: {why:?}"));
/// assert!(guard.is_held());
/// guard.release()?;
/// # Ok::<_, rlock_client::Error>(())
/// ```
#[must_use = "dropping the guard releases the locks at once"]
pub struct MultiGuard {
    group: Group<LockGuard>,
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("locks", &self.group.guards)
            .finish()
    }
}

impl MultiGuard {
    /// The parts' guards, in the order the locks were given.
    pub fn guards(&self) -> &[LockGuard] {
        &self.group.guards
    }

    /// Whether every lock is still held, as far as the clients know.
    pub fn is_held(&self) -> bool {
        self.group.is_held()
    }

    /// Why the whole was lost (the reason of the first lock lost), if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.group.lost_reason()
    }

    /// Blocks until a lock is lost (`Some(reason)`) or `timeout` passes (`None`).
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<LostReason> {
        self.group.wait_lost(timeout)
    }

    /// Calls `f` once when the first lock is lost, or at once if one already was.
    /// It runs on the thread that finds the loss; keep it short.
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        self.group.on_lost(f)
    }

    /// Releases every lock.
    ///
    /// # Errors
    /// After trying them all: [`Error::NotHeld`] if some lock was no longer held (the
    /// critical section ran partly unprotected), else the first other error.
    pub fn release(self) -> Result<()> {
        match self.group.release() {
            (_, None) => Ok(()),
            (_, Some(e)) => Err(e),
        }
    }
}

/// A lock on N independent servers, held when a majority of them grant it within
/// its validity time: Redis's Redlock algorithm (Redisson's `RedissonRedLock`).
///
/// Give it one [`Lock`] per server, each from a [`Client`](crate::Client) of that
/// server. An acquire asks all servers at once, each without waiting in the server,
/// and waits at most the *server timeout* (default
/// [`DEFAULT_SERVER_TIMEOUT`](Self::DEFAULT_SERVER_TIMEOUT)) for their answers; a
/// server that answers later counts as refused, and what it grants is released. It
/// succeeds when at least `N / 2 + 1` servers granted the lock and the validity
/// `lease - elapsed - drift` (drift = 1 % of the lease + 2 ms, [`redlock_drift`]) is
/// still positive; otherwise it releases every part and tries again after a random
/// pause, until its wait limit.
///
/// With the watchdog (no fixed lease) each part is renewed by its own client, and the
/// guard stays held while a majority is: one server dying does not lose it.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use rlock_client::{AcquireOptions, Client, RedLock};
///
/// # fn main() -> rlock_client::Result<()> {
/// let servers = ["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"];
/// let clients = servers.iter().map(|u| Client::open(*u)).collect::<Result<Vec<_>, _>>()?;
/// let lock = RedLock::new(clients.iter().map(|c| c.lock("payments")));
/// let opts = AcquireOptions::new().with_lease(Duration::from_secs(10));
/// if let Some(guard) = lock.acquire_with(opts)? {
///     // The work must end within guard.validity().
///     println!("valid for {:?}", guard.validity());
///     guard.release()?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedLock {
    locks: Vec<Lock>,
    inner: aio::RedLock,
}

impl RedLock {
    /// How long an acquire waits for each server's answer.
    pub const DEFAULT_SERVER_TIMEOUT: Duration = aio::RedLock::DEFAULT_SERVER_TIMEOUT;

    /// A RedLock over `locks`, one per independent server.
    pub fn new(locks: impl IntoIterator<Item = Lock>) -> RedLock {
        let locks: Vec<Lock> = locks.into_iter().collect();
        let inner = aio::RedLock::new(locks.iter().map(|l| l.inner().same_handle()));
        RedLock { locks, inner }
    }

    /// How long an acquire waits for each server's answer: small next to the lease,
    /// so that a dead server costs little of the validity.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let c = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// let lock = rlock_client::RedLock::new([c.lock("k")])
    ///     .with_server_timeout(Duration::from_millis(50));
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn with_server_timeout(mut self, d: Duration) -> RedLock {
        self.inner = self.inner.with_server_timeout(d);
        self
    }

    /// The locks, one per server.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// Servers that must grant the lock: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum()
    }

    /// Takes the lock, trying again for as long as it takes; watchdog leases.
    pub fn acquire(&self) -> Result<RedLockGuard> {
        taken(
            self.acquire_with(AcquireOptions::new())?,
            "a wait without limit ended",
        )
    }

    /// One attempt: `None` if no majority granted it in time.
    pub fn try_acquire(&self) -> Result<Option<RedLockGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(crate::Wait::No))
    }

    /// Attempts until one succeeds or `wait` has passed.
    pub fn acquire_timeout(&self, wait: Duration) -> Result<Option<RedLockGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(crate::Wait::Up(wait)))
    }

    /// Takes the lock with explicit options: `opts.wait()` bounds the attempts (each
    /// server is asked without waiting in the server), `opts.lease()` fixes the lease.
    ///
    /// # Errors
    /// When more servers failed with an error than the majority can spare, the first
    /// of those errors (whatever was granted has been released).
    /// [`Error::InvalidArgument`] with no locks or a zero lease.
    pub fn acquire_with(&self, opts: AcquireOptions) -> Result<Option<RedLockGuard>> {
        let rt = first_rt(&self.locks, "a RedLock needs at least one lock")?;
        let taken = rt.block_on(self.inner.acquire_with(opts))?;
        Ok(taken.map(|g| RedLockGuard {
            group: blocking_group(g.group, &self.locks),
            servers: g.servers,
        }))
    }
}

/// A [`RedLock`] held by a majority of its servers.
///
/// # Drop
/// Dropping it drops every part's guard: each stops its renewal and releases
/// best-effort (see [`LockGuard`]'s `# Drop`).
///
/// # Examples
///
/// ```no_run
/// # use rlock_client::{Client, RedLock};
/// # let cs: Vec<Client> = vec![];
/// let guard = RedLock::new(cs.iter().map(|c| c.lock("k"))).acquire()?;
/// guard.on_lost(|why| eprintln!("a majority was lost: {why:?}"));
/// assert!(guard.held_count() >= 2);
/// guard.release()?;
/// # Ok::<_, rlock_client::Error>(())
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct RedLockGuard {
    group: Group<LockGuard>,
    servers: usize,
}

impl std::fmt::Debug for RedLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedLockGuard")
            .field("held", &self.held_count())
            .field("servers", &self.servers)
            .field("validity", &self.validity())
            .finish()
    }
}

impl RedLockGuard {
    /// The guards of the servers that granted the lock.
    pub fn guards(&self) -> &[LockGuard] {
        &self.group.guards
    }

    /// Servers on which the lock is still held, as far as their clients know.
    pub fn held_count(&self) -> usize {
        self.group.held_count()
    }

    /// How long the lock is still valid: the lease left on the majority's servers,
    /// less the drift allowance (zero when lost). Renewals move it forward.
    pub fn validity(&self) -> Duration {
        self.group.validity()
    }

    /// Whether a majority still holds the lock within its validity.
    pub fn is_held(&self) -> bool {
        self.group.is_held()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.group.lost_reason()
    }

    /// Blocks until the majority is lost (`Some(reason)`) or `timeout` passes.
    ///
    /// A server's loss is found by its client (a renewal answered 0, or its lease run
    /// out), so this reports at most the drift allowance after `validity()` reached 0.
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<LostReason> {
        self.group.wait_lost(timeout)
    }

    /// Calls `f` once when the majority is lost, or at once if it already was.
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        self.group.on_lost(f)
    }

    /// Releases the lock on every server that granted it; how many released it.
    ///
    /// # Errors
    /// When fewer than a majority could be released: [`Error::NotHeld`] if some
    /// server no longer held it (the work may have run unprotected), else the first
    /// other error. Servers that cannot be reached keep it until its lease runs out.
    pub fn release(self) -> Result<usize> {
        let need = self.group.quorum;
        match self.group.release() {
            (n, _) if n >= need => Ok(n),
            (_, Some(e)) => Err(e),
            (_, None) => Err(Error::UnexpectedReply("no server released".into())),
        }
    }
}
