//! The blocking [`Lock`] and [`LockGuard`]: each wraps its async twin
//! ([`crate::aio::Lock`], [`crate::aio::LockGuard`]) and runs its calls on the client's
//! runtime (see `blocking/mod.rs`).

use std::time::{Duration, Instant};

use super::{Held, Rt};
use crate::aio;
use crate::error::Result;
use crate::options::AcquireOptions;
use crate::proto::state::{Lost, LostReason};
use crate::ReleaseOutcome;

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
    inner: aio::Lock,
    rt: Rt,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Lock {
    pub(crate) fn new(inner: aio::Lock, rt: &Rt) -> Lock {
        Lock {
            inner,
            rt: rt.clone(),
        }
    }

    /// The lock's name (its key).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// This handle's owner id.
    pub fn owner(&self) -> &str {
        self.inner.owner()
    }

    /// Takes the lock, waiting in the server for as long as it takes; watchdog lease.
    ///
    /// # Errors
    /// Transport errors that outlive the retries, server errors (`WRONGTYPE` when the
    /// key is not a lock), [`Error::ReplicaSync`](crate::Error::ReplicaSync) with replica
    /// safety on.
    pub fn acquire(&self) -> Result<LockGuard> {
        let guard = self.rt.block_on(self.inner.acquire())?;
        Ok(LockGuard::new(guard, &self.rt))
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
        self.guard(self.rt.block_on(self.inner.try_acquire()))
    }

    /// Takes the lock, waiting in the server at most `wait`; `None` if it did not
    /// come free in time.
    pub fn acquire_timeout(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.guard(self.rt.block_on(self.inner.acquire_timeout(wait)))
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
        self.guard(self.rt.block_on(self.inner.acquire_with(opts)))
    }

    fn guard(&self, taken: Result<Option<aio::LockGuard>>) -> Result<Option<LockGuard>> {
        Ok(taken?.map(|g| LockGuard::new(g, &self.rt)))
    }

    /// This handle's hold count as the client knows it (0: not held).
    pub fn hold_count(&self) -> u64 {
        self.inner.hold_count()
    }

    /// The async twin (the combined locks drive it; `blocking/multi.rs`).
    pub(crate) fn inner(&self) -> &aio::Lock {
        &self.inner
    }

    /// The client's runtime.
    pub(crate) fn rt(&self) -> &Rt {
        &self.rt
    }
}

/// One hold of a lock. Release it with [`release`](Self::release) to learn whether
/// the lock was still held; dropping it releases best-effort.
///
/// # Drop
/// Dropping the guard stops its renewal and sends one `RLOCK.RELEASE` (no retries),
/// ignoring the outcome: a lost lock or an unreachable server goes unreported, and
/// an unreleased lock expires with its lease. Inside a tokio runtime the release runs
/// as a task on the client's own runtime instead, so that dropping never blocks a
/// runtime thread.
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
#[derive(Debug)]
pub struct LockGuard {
    held: Held<aio::LockGuard>,
}

impl LockGuard {
    pub(crate) fn new(inner: aio::LockGuard, rt: &Rt) -> LockGuard {
        LockGuard {
            held: Held::new(inner, rt),
        }
    }

    fn held(&self) -> &aio::LockGuard {
        self.held.get()
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.held().name()
    }

    /// The owner id holding it.
    pub fn owner(&self) -> &str {
        self.held().owner()
    }

    /// Whether the lock is still held, as far as this client knows: not found lost
    /// by a renewal or release, and its lease not run out without renewal. Costs no
    /// round trip.
    pub fn is_held(&self) -> bool {
        self.held().is_held()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.held().lost_reason()
    }

    /// When the lease must have run out, by this client's clock (None: not held).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.held().deadline()
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
        self.held().wait_lost(timeout)
    }

    /// A future that completes when the lock is lost (any executor).
    pub fn lost(&self) -> Lost<'_> {
        self.held().lost()
    }

    /// Calls `f` once when the lock is lost, or at once if it already was. It runs on
    /// whichever thread finds the loss, usually the client's renewal worker, which
    /// serves all its locks: keep it short and non-blocking. It has run by the time
    /// `wait_lost` or `lost()` report the loss. It is dropped uncalled if the lock is
    /// released normally.
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        self.held().on_lost(f)
    }

    /// Releases this hold, retrying transient failures.
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the lock was no longer held by this
    /// owner: the critical section ran (at least partly) unprotected. Transport errors
    /// after the retries: renewal has then stopped and the lock expires with its lease.
    pub fn release(mut self) -> Result<ReleaseOutcome> {
        let guard = self.held.take();
        self.held.rt.block_on(guard.release())
    }
}
