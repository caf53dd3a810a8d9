//! The async read-write lock: [`crate::aio::Client::rw_lock`] gives an
//! [`RwLock`](crate::aio::RwLock) whose halves are [`crate::aio::Lock`] handles; see
//! `rwlock.rs` (the blocking one) for what the halves share and how they behave.

use crate::aio::{Client, Lock};
use crate::blocking::rwlock::{
    force_cmd, info_cmd, parse_force, parse_rw_info, RwLockInfo, READ, WRITE,
};
use crate::error::Result;

/// A read-write lock as one owner, async: a read half and a write half.
///
/// ```no_run
/// # async fn run(client: rlock_client::aio::Client) -> rlock_client::Result<()> {
/// let rw = client.rw_lock("catalog");
/// let reading = rw.read().acquire().await?;
/// reading.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RwLock {
    client: Client,
    read: Lock,
    write: Lock,
}

impl Client {
    /// A handle on the read-write lock `name`, with a new owner id.
    pub fn rw_lock(&self, name: impl Into<String>) -> RwLock {
        let owner = self.next_owner();
        self.rw_lock_with_owner(name, owner)
    }

    /// A handle on the read-write lock `name` with the caller's owner id (not ending
    /// in `:write`).
    pub fn rw_lock_with_owner(&self, name: impl Into<String>, owner: impl Into<String>) -> RwLock {
        let (name, owner) = (name.into(), owner.into());
        RwLock {
            client: self.clone(),
            read: self.side_lock(name.clone(), READ, owner.clone()),
            write: self.side_lock(name, WRITE, owner),
        }
    }
}

impl RwLock {
    /// The lock's name (its key).
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// This handle's owner id, shared by both halves.
    pub fn owner(&self) -> &str {
        self.read.owner()
    }

    /// The read half.
    pub fn read(&self) -> &Lock {
        &self.read
    }

    /// The write half.
    pub fn write(&self) -> &Lock {
        &self.write
    }

    /// What the server knows about the lock (`RRWLOCK.INFO`); `None` if it is free.
    pub async fn info(&self) -> Result<Option<RwLockInfo>> {
        parse_rw_info(
            self.client
                .query_with_retries(&info_cmd(self.name()))
                .await?,
        )
    }

    /// Frees the lock whoever holds it (`RRWLOCK.FORCERELEASE`); whether there was one.
    pub async fn force_release(&self) -> Result<bool> {
        parse_force(
            self.client
                .query_with_retries(&force_cmd(self.name()))
                .await?,
        )
    }
}
