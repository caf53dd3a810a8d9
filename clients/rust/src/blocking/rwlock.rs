//! The blocking read-write lock: [`Client::rw_lock`] gives an [`RwLock`] whose halves are
//! blocking [`Lock`] handles over the async lock's halves (`aio/rwlock.rs` says what the
//! halves share and how they behave).

use super::{Client, Lock};
use crate::aio;
use crate::aio::rwlock::RwLockInfo;
use crate::error::Result;

/// A read-write lock as one owner: a read half and a write half.
///
/// # Examples
///
/// ```no_run
/// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
/// let rw = client.rw_lock("catalog");
/// {
///     let reading = rw.read().acquire()?; // many readers at once
///     // ... read the catalog ...
///     reading.release()?;
/// }
/// let writing = rw.write().acquire()?; // alone; queued readers wait behind it
/// // ... rewrite the catalog ...
/// writing.release()?;
/// # Ok::<_, rlock_client::Error>(())
/// ```
#[derive(Debug)]
pub struct RwLock {
    inner: aio::RwLock,
    read: Lock,
    write: Lock,
    client: Client,
}

impl Client {
    /// A handle on the read-write lock `name`, with a new owner id (`<client id>:<n>`).
    /// Two handles exclude each other as two Redisson threads would.
    pub fn rw_lock(&self, name: impl Into<String>) -> RwLock {
        self.rw(self.inner.rw_lock(name))
    }

    /// A handle on the read-write lock `name` with an owner id of the caller's choosing
    /// (a Redisson thread's is `<uuid>:<thread id>`). It must not end in `:write`.
    pub fn rw_lock_with_owner(&self, name: impl Into<String>, owner: impl Into<String>) -> RwLock {
        self.rw(self.inner.rw_lock_with_owner(name, owner))
    }

    fn rw(&self, inner: aio::RwLock) -> RwLock {
        RwLock {
            read: Lock::new(inner.read().same_handle(), &self.rt),
            write: Lock::new(inner.write().same_handle(), &self.rt),
            inner,
            client: self.clone(),
        }
    }
}

impl RwLock {
    /// The lock's name (its key).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// This handle's owner id, shared by both halves.
    pub fn owner(&self) -> &str {
        self.inner.owner()
    }

    /// The read half: shared with other readers, excluded by a writer.
    pub fn read(&self) -> &Lock {
        &self.read
    }

    /// The write half: exclusive (this owner may still take the read half meanwhile).
    pub fn write(&self) -> &Lock {
        &self.write
    }

    /// What the server knows about the lock (`RRWLOCK.INFO`); `None` if it is free.
    pub fn info(&self) -> Result<Option<RwLockInfo>> {
        self.client.rt.block_on(self.inner.info())
    }

    /// Frees the lock whoever holds it, in any mode (`RRWLOCK.FORCERELEASE`); whether
    /// there was one. Its holders find out at their next renewal or release.
    pub fn force_release(&self) -> Result<bool> {
        self.client.rt.block_on(self.inner.force_release())
    }
}
