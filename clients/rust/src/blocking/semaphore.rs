//! Semaphores, blocking: the faces of the async [`crate::aio::Semaphore`] and
//! [`crate::aio::ExpirableSemaphore`] (`aio/semaphore.rs`, the implementation, says what
//! they do), each call run on the client's runtime.

use std::time::Duration;

use super::{Client, Held, Rt};
use crate::aio;
use crate::error::Result;
use crate::proto::state::LostReason;

impl Client {
    /// A handle on the semaphore `name` (Redisson's `RSemaphore` layout).
    ///
    /// ```no_run
    /// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// let jobs = client.semaphore("jobs");
    /// jobs.try_set_permits(4)?;
    /// let permit = jobs.acquire(1)?; // waits in the server, FIFO
    /// // ... at most 4 of these at once ...
    /// permit.release()?;
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn semaphore(&self, name: impl Into<String>) -> Semaphore {
        Semaphore {
            inner: self.inner.semaphore(name),
            rt: self.rt.clone(),
        }
    }

    /// A handle on the permit-expirable semaphore `name` (Redisson's
    /// `RPermitExpirableSemaphore` layout).
    ///
    /// ```no_run
    /// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// let slots = client.expirable_semaphore("slots");
    /// slots.try_set_permits(2)?;
    /// let permit = slots.acquire(None)?; // watchdog lease, renewed while held
    /// println!("holding {}", permit.id());
    /// permit.release()?; // Err(NotHeld) if it expired meanwhile
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn expirable_semaphore(&self, name: impl Into<String>) -> ExpirableSemaphore {
        ExpirableSemaphore {
            inner: self.inner.expirable_semaphore(name),
            rt: self.rt.clone(),
        }
    }
}

// ---- RSEMAPHORE --------------------------------------------------------------------------

/// A handle on one semaphore. Cheap to clone.
///
/// Redisson's semaphore records nobody's permits: a process that dies holding some
/// leaks them for good. Use [`ExpirableSemaphore`] when holders may crash.
#[derive(Clone)]
pub struct Semaphore {
    inner: aio::Semaphore,
    rt: Rt,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Semaphore {
    /// The semaphore's key.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Sets the number of permits if the semaphore has none yet; true if it was set.
    pub fn try_set_permits(&self, permits: u32) -> Result<bool> {
        self.rt.block_on(self.inner.try_set_permits(permits))
    }

    /// Adds (or, negative, removes) permits; returns the new count.
    pub fn add_permits(&self, delta: i32) -> Result<i64> {
        self.rt.block_on(self.inner.add_permits(delta))
    }

    /// Takes every available permit; returns how many.
    pub fn drain(&self) -> Result<i64> {
        self.rt.block_on(self.inner.drain())
    }

    /// Returns `permits` permits without a guard (Redisson lets anyone release); returns
    /// the count after the release. Permits taken by an acquire are returned by their
    /// guard, which knows whether the server took its grant back ([`SemaphorePermit`]).
    pub fn release(&self, permits: u32) -> Result<i64> {
        self.rt.block_on(self.inner.release(permits))
    }

    /// The permits available now.
    pub fn available(&self) -> Result<i64> {
        self.rt.block_on(self.inner.available())
    }

    /// Waits (in the server, without limit) for `permits` permits.
    pub fn acquire(&self, permits: u32) -> Result<SemaphorePermit> {
        let permit = self.rt.block_on(self.inner.acquire(permits))?;
        Ok(self.permit(permit))
    }

    /// Takes `permits` permits if they are free now and nobody waits before us.
    pub fn try_acquire(&self, permits: u32) -> Result<Option<SemaphorePermit>> {
        let taken = self.rt.block_on(self.inner.try_acquire(permits))?;
        Ok(taken.map(|p| self.permit(p)))
    }

    /// Waits at most `wait` for `permits` permits.
    pub fn acquire_timeout(&self, permits: u32, wait: Duration) -> Result<Option<SemaphorePermit>> {
        let taken = self
            .rt
            .block_on(self.inner.acquire_timeout(permits, wait))?;
        Ok(taken.map(|p| self.permit(p)))
    }

    fn permit(&self, inner: aio::SemaphorePermit) -> SemaphorePermit {
        SemaphorePermit {
            held: Held::new(inner, &self.rt),
        }
    }
}

/// Permits taken from a [`Semaphore`]. Release them with [`SemaphorePermit::release`].
///
/// # Drop
/// Dropping the guard releases its permits best-effort (one attempt; inside a tokio
/// runtime as a task on the client's runtime, never blocking the caller's).
#[must_use = "dropping the guard releases the permits at once"]
#[derive(Debug)]
pub struct SemaphorePermit {
    held: Held<aio::SemaphorePermit>,
}

impl SemaphorePermit {
    fn held(&self) -> &aio::SemaphorePermit {
        self.held.get()
    }

    /// How many permits this guard holds.
    pub fn permits(&self) -> u32 {
        self.held().permits()
    }

    /// False once the server is known to have taken the grant back (see
    /// [`crate::aio::SemaphorePermit`]), or its confirmation got no definite answer.
    pub fn is_held(&self) -> bool {
        self.held().is_held()
    }

    /// Returns the permits (one request id across retries); the count after.
    /// [`crate::Error::NotHeld`] without sending anything when the server had taken the
    /// grant back.
    pub fn release(mut self) -> Result<i64> {
        let permit = self.held.take();
        self.held.rt.block_on(permit.release())
    }
}

// ---- RPSEMAPHORE -------------------------------------------------------------------------

/// A handle on one permit-expirable semaphore. Cheap to clone.
///
/// Each permit has an id and a lease: a holder that dies loses its permit at the lease
/// end, when the module returns it to the pool (and to the first waiter) at once.
#[derive(Clone)]
pub struct ExpirableSemaphore {
    inner: aio::ExpirableSemaphore,
    rt: Rt,
}

impl std::fmt::Debug for ExpirableSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl ExpirableSemaphore {
    /// The semaphore's key (its permits are in `{name}:timeout`).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Sets the number of permits if there is no count yet; true if it was set.
    pub fn try_set_permits(&self, permits: u32) -> Result<bool> {
        self.rt.block_on(self.inner.try_set_permits(permits))
    }

    /// Makes available + held equal `permits`; returns the available count.
    pub fn set_permits(&self, permits: u32) -> Result<i64> {
        self.rt.block_on(self.inner.set_permits(permits))
    }

    /// Adds (or removes) available permits; returns the new available count.
    pub fn add_permits(&self, delta: i32) -> Result<i64> {
        self.rt.block_on(self.inner.add_permits(delta))
    }

    /// Permits available now (expired ones count as back).
    pub fn available(&self) -> Result<i64> {
        self.rt.block_on(self.inner.available())
    }

    /// Permits held and not expired.
    pub fn acquired(&self) -> Result<i64> {
        self.rt.block_on(self.inner.acquired())
    }

    /// Waits (in the server, without limit) for a permit. `lease` None: the watchdog's
    /// lease, renewed while the guard lives.
    pub fn acquire(&self, lease: Option<Duration>) -> Result<ExpirablePermit> {
        let permit = self.rt.block_on(self.inner.acquire(lease))?;
        Ok(self.permit(permit))
    }

    /// Takes a permit if one is free now and nobody waits before us.
    pub fn try_acquire(&self, lease: Option<Duration>) -> Result<Option<ExpirablePermit>> {
        let taken = self.rt.block_on(self.inner.try_acquire(lease))?;
        Ok(taken.map(|p| self.permit(p)))
    }

    /// Waits at most `wait` for a permit.
    pub fn acquire_timeout(
        &self,
        lease: Option<Duration>,
        wait: Duration,
    ) -> Result<Option<ExpirablePermit>> {
        let taken = self.rt.block_on(self.inner.acquire_timeout(lease, wait))?;
        Ok(taken.map(|p| self.permit(p)))
    }

    fn permit(&self, inner: aio::ExpirablePermit) -> ExpirablePermit {
        ExpirablePermit {
            held: Held::new(inner, &self.rt),
        }
    }
}

/// One permit of an [`ExpirableSemaphore`], with its id.
///
/// Without a lease it is renewed (`RPSEMAPHORE.UPDATELEASETIME`) every third of the
/// watchdog timeout by a thread of its own; with a lease it ends there. A permit found
/// lost (renewal answered 0, or renewals failed until the lease ran out, or a fixed lease
/// ran out while the guard lived) is reported: [`ExpirablePermit::is_held`],
/// [`ExpirablePermit::wait_lost`], [`ExpirablePermit::on_lost`]; and
/// [`ExpirablePermit::release`] then answers [`Error::NotHeld`](crate::Error::NotHeld).
///
/// # Drop
/// Dropping stops the renewal and releases the permit best-effort (one attempt).
#[must_use = "dropping the guard releases the permit at once"]
#[derive(Debug)]
pub struct ExpirablePermit {
    held: Held<aio::ExpirablePermit>,
}

impl ExpirablePermit {
    fn held(&self) -> &aio::ExpirablePermit {
        self.held.get()
    }

    /// The permit id (32 hex digits).
    pub fn id(&self) -> &str {
        self.held().id()
    }

    /// False once the permit is known lost or its lease ran out.
    pub fn is_held(&self) -> bool {
        self.held().is_held()
    }

    /// Why the permit was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.held().lost_reason()
    }

    /// Blocks until the permit is lost (Some) or `timeout` passes (None).
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<LostReason> {
        let (lost, rt) = (self.held().lost(), &self.held.rt);
        match timeout {
            Some(t) => rt.block_on(async { tokio::time::timeout(t, lost).await.ok() }),
            None => Some(rt.block_on(lost)),
        }
    }

    /// Runs `f` once the permit is lost (at once if it already is).
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        self.held().on_lost(f)
    }

    /// Re-arms a fixed lease to `lease` from now; false when the permit is not held.
    pub fn update_lease(&self, lease: Duration) -> Result<bool> {
        self.held.rt.block_on(self.held().update_lease(lease))
    }

    /// Releases the permit (retried with one request id).
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the server no longer had it (it
    /// expired or was lost): the work under the guard ran unprotected for a while.
    pub fn release(mut self) -> Result<()> {
        let permit = self.held.take();
        self.held.rt.block_on(permit.release())
    }
}
