//! Rust client for the **rlock** Redis module: distributed locks stored exactly like
//! Redisson's (a hash of owner id to hold count, the key's TTL as the lease), with
//! waiting done inside the server.
//!
//! - [`Client::lock`] gives a [`Lock`] handle, one owner (`<client uuid>:<n>`).
//!   Acquiring through the same handle re-enters; two handles exclude each other.
//! - [`Lock::acquire`] waits in the server (`RLOCK.ACQUIRE ... WAIT 0`, first come,
//!   first served); waiting calls share one ticket connection (`WAIT t ASYNC`, see
//!   [`WaitMode`]), so a waiting acquire never delays the
//!   client's renewals or releases. [`Lock::try_acquire`] never waits;
//!   [`Lock::acquire_timeout`] waits at most so long.
//! - Without a lease, a lock is in *watchdog* mode: its lease is the watchdog timeout
//!   (30 s by default) and one worker per client renews all its locks every third of
//!   it. With [`AcquireOptions::with_lease`] the lease is fixed and never renewed.
//! - A lost lock (renewal answered 0, or renewals failed until the lease ran out) is
//!   reported: [`LockGuard::is_held`], [`LockGuard::wait_lost`], [`LockGuard::lost`]
//!   (a future), [`LockGuard::on_lost`] (a callback). [`LockGuard::release`] returns
//!   [`Error::NotHeld`] when the critical section ran unprotected.
//! - Transient failures are retried with capped exponential backoff and jitter
//!   ([`RetryPolicy`]). Each acquire and each release sends one fresh request id (a v4
//!   uuid, `ID <request-id>`) with every one of its retries; the module remembers the
//!   reply of a call that changed the lock under that id, so a retry after a lost
//!   reply gets the first reply back instead of re-entering or releasing twice. This
//!   also covers a waiting acquire whose connection broke just after the server
//!   handed it the lock: the retry, on a new connection, learns of the handoff.
//! - Optional replica safety ([`ReplicaSync`]): `WAIT n timeout` after each acquire.
//! - Several locks at once: [`MultiLock`] (all or none, on one server or several) and
//!   [`RedLock`] (a majority of independent servers, within a validity time), async as
//!   well ([`aio::MultiLock`], [`aio::RedLock`]).
//! - Read-write locks: [`Client::rw_lock`] gives an [`RwLock`] whose `read()` and
//!   `write()` halves are [`Lock`] handles (module commands `RRWLOCK.*`).
//! - One server or a Redis Cluster ([`Client::open_cluster`]).
//!
//! Two APIs, one implementation: [`aio`] is the async client (tokio), and the blocking
//! API at the crate root is a thin layer over it, as reqwest's `blocking` client is over
//! its async one: each blocking client runs the async code on a runtime of its own (one
//! worker thread, which also renews its locks and dispatches its queued tickets). Any
//! fix lands once. The `tokio` feature is kept, empty, for manifests that name it.
//!
//! # Examples
//!
//! ```no_run
//! use rlock_client::{Client, Error};
//!
//! # fn main() -> Result<(), Error> {
//! let client = Client::open("redis://127.0.0.1/")?;
//! let lock = client.lock("invoice:7");
//! let guard = lock.acquire()?;
//! // ... work that must not run twice at once ...
//! match guard.release() {
//!     Ok(_) => {}
//!     Err(Error::NotHeld { .. }) => eprintln!("the lock expired under us: check the work"),
//!     Err(e) => return Err(e),
//! }
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

// Folders by concern, top-down (see the crate's README, "Layout"):
// - `blocking`: the blocking API, a thin layer over `aio` (handles that run their async
//   twins on the client's runtime), the combined locks' (MultiLock, RedLock) included.
// - `aio`: the implementation: client, lock, read-write lock, semaphores, the combined
//   locks, renewal task.
// - `fenced`, `latch`: one primitive each: its commands and replies, the async handle
//   (the implementation, re-exported from `aio`) and its blocking face.
// - `net`: connections (one server or a cluster) and the queued-ticket connection.
// - `proto`: the sans-IO core: command builders and reply parsers, the decisions of an
//   acquire and a release, a handle's state and lost signal, the renewal registry, jitter.
pub mod aio;
mod blocking;
mod error;
mod fenced;
mod latch;
mod net;
mod options;
mod proto;
// The client's reader of spec/vectors, the protocol contract every client's suite reads.
#[cfg(test)]
mod vectors;

pub use aio::rwlock::RwLockInfo;
pub use blocking::multi::{
    redlock_drift, redlock_validity, MultiGuard, MultiLock, RedLock, RedLockGuard,
};
pub use blocking::rwlock::RwLock;
pub use blocking::semaphore::{ExpirablePermit, ExpirableSemaphore, Semaphore, SemaphorePermit};
pub use blocking::{Client, Lock, LockGuard};
pub use error::{Error, Refusal, Result};
pub use fenced::{FencedGuard, FencedLock};
pub use latch::CountDownLatch;
pub use options::{AcquireOptions, ClientOptions, Mode, ReplicaSync, RetryPolicy, Wait, WaitMode};
pub use proto::cmd::LockInfo;
pub use proto::hello::{Capabilities, ModuleInfo, PROTOCOL_VERSION};
pub use proto::state::{Lost, LostReason};

/// What a successful release did.
///
/// ```
/// use rlock_client::ReleaseOutcome;
/// assert_ne!(ReleaseOutcome::Freed, ReleaseOutcome::StillHeld);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReleaseOutcome {
    /// The hold count went down; the owner still holds the lock (it was re-entered).
    StillHeld,
    /// The lock is free (or was handed to the first waiter).
    Freed,
}
