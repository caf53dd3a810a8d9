//! The fenced lock (design.md 4.2): [`FencedLock`] and [`FencedGuard`], async (the
//! implementation, re-exported from [`crate::aio`]) and their blocking faces.
//!
//! A fenced lock is the plain lock (same key, same `RLOCK.RENEW` watchdog, same lost
//! signal, same `RLOCK.RELEASE`) whose acquire is `RFENCED.ACQUIRE`: every acquire,
//! re-entry and handoff also returns a fencing token, a number that only ever grows
//! for this lock name (across restarts, and across a failover within the bound the
//! README states). Pass the token with every write to the protected resource, and let
//! the resource refuse a token lower than the highest it has seen: a holder that lost
//! the lock (a long pause, an expired lease) can then do no harm.
//!
//! So a [`FencedLock`] is a [`Lock`] acquired with another command and parser, and a
//! [`FencedGuard`] a [`LockGuard`] plus its token (it dereferences to the guard for
//! `is_held`, `on_lost`, `wait_lost`, ...).

use std::time::Duration;

use redis::Value;

use crate::error::{Error, Result};
use crate::options::{AcquireOptions, Wait};
use crate::proto::cmd::Acquired;
use crate::{Client, LockGuard, ReleaseOutcome};

use self::aio_fenced as aio;

/// The fenced lock's acquire: `RLOCK.ACQUIRE`'s arguments.
const ACQUIRE: &str = "RFENCED.ACQUIRE";

/// `RFENCED.ACQUIRE`'s reply: `[nil, token]` (ours, with a new token) or `[pttl, nil]`
/// (held by another owner). Anything else is not the module's.
pub(crate) fn parse_acquire(v: Value) -> Result<(Acquired, Option<i64>)> {
    match &v {
        Value::Array(items) => match items.as_slice() {
            [Value::Nil, Value::Int(token)] => Ok((Acquired::Yes, Some(*token))),
            [Value::Int(pttl), Value::Nil] => Ok((Acquired::HeldFor(*pttl), None)),
            _ => Err(unexpected(ACQUIRE, &v)),
        },
        _ => Err(unexpected(ACQUIRE, &v)),
    }
}

/// `RFENCED.GETTOKEN key`.
pub(crate) fn get_token_cmd(key: &str) -> redis::Cmd {
    let mut c = redis::cmd("RFENCED.GETTOKEN");
    c.arg(key);
    c
}

/// `RFENCED.GETTOKEN`'s reply: the last token, `None` before the first.
pub(crate) fn parse_token(v: Value) -> Result<Option<i64>> {
    match v {
        Value::Nil => Ok(None),
        Value::Int(n) => Ok(Some(n)),
        other => Err(unexpected("RFENCED.GETTOKEN", &other)),
    }
}

fn unexpected(what: &str, v: &Value) -> Error {
    Error::UnexpectedReply(format!("{what}: {v:?}"))
}

/// Reads each acquire reply, keeping the token of the last one that took the lock: the
/// attempt whose reply ends the acquire (a retry with the same request id gets the
/// first reply, token included, back).
#[derive(Default)]
pub(crate) struct Tokens {
    pub(crate) last: Option<i64>,
}

impl Tokens {
    pub(crate) fn read(&mut self, v: Value) -> Result<Acquired> {
        let (acquired, token) = parse_acquire(v)?;
        if token.is_some() {
            self.last = token;
        }
        Ok(acquired)
    }

    /// The token of the acquire that took the lock.
    pub(crate) fn taken(&self) -> Result<i64> {
        self.last.ok_or_else(|| {
            Error::UnexpectedReply("RFENCED.ACQUIRE: acquired without a token".into())
        })
    }
}

impl Client {
    /// A handle on the fenced lock `name`, with a new owner id (as [`Client::lock`]).
    ///
    /// ```no_run
    /// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.fenced_lock("ledger").acquire()?;
    /// let token = guard.token(); // send it with every write to the ledger
    /// # let _ = token;
    /// guard.release()?;
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn fenced_lock(&self, name: impl Into<String>) -> FencedLock {
        FencedLock {
            inner: self.inner.fenced_lock(name),
            client: self.clone(),
        }
    }

    /// A handle on the fenced lock `name` with an owner id of the caller's choosing.
    pub fn fenced_lock_with_owner(
        &self,
        name: impl Into<String>,
        owner: impl Into<String>,
    ) -> FencedLock {
        FencedLock {
            inner: self.inner.fenced_lock_with_owner(name, owner),
            client: self.clone(),
        }
    }

    /// The last fencing token issued for lock `name` (`RFENCED.GETTOKEN`, Redisson's
    /// `getToken`); `None` before the first.
    pub fn fenced_token(&self, name: &str) -> Result<Option<i64>> {
        self.rt.block_on(self.inner.fenced_token(name))
    }
}

/// A handle on one fenced lock, as one owner: a [`Lock`](crate::Lock) whose every acquire returns a
/// fencing token. The blocking face of [`crate::aio::FencedLock`].
#[derive(Debug)]
pub struct FencedLock {
    inner: aio::FencedLock,
    client: Client,
}

impl FencedLock {
    /// The lock's name (its key; the token lives at `redisson_lock_token:{name}`).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// This handle's owner id.
    pub fn owner(&self) -> &str {
        self.inner.owner()
    }

    /// This handle's hold count as the client knows it (0: not held).
    pub fn hold_count(&self) -> u64 {
        self.inner.hold_count()
    }

    /// Takes the lock, waiting in the server for as long as it takes; watchdog lease.
    pub fn acquire(&self) -> Result<FencedGuard> {
        let guard = self.client.rt.block_on(self.inner.acquire())?;
        Ok(self.guard(guard))
    }

    /// Takes the lock if it is free (or already ours); never waits.
    pub fn try_acquire(&self) -> Result<Option<FencedGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::No))
    }

    /// Takes the lock, waiting in the server at most `wait`.
    pub fn acquire_timeout(&self, wait: Duration) -> Result<Option<FencedGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::Up(wait)))
    }

    /// Takes the lock with explicit options (wait limit, fixed lease), as
    /// [`Lock::acquire_with`](crate::Lock::acquire_with); the guard carries the token this acquire was given.
    pub fn acquire_with(&self, opts: AcquireOptions) -> Result<Option<FencedGuard>> {
        let taken = self.client.rt.block_on(self.inner.acquire_with(opts))?;
        Ok(taken.map(|g| self.guard(g)))
    }

    fn guard(&self, g: aio::FencedGuard) -> FencedGuard {
        FencedGuard {
            token: g.token(),
            guard: LockGuard::new(g.into_guard(), &self.client.rt),
        }
    }
}

/// One hold of a fenced lock, with its fencing token. Dereferences to the [`LockGuard`]
/// (renewal, lost signal, `is_held`); dropping it releases best-effort, as the guard.
#[must_use = "dropping the guard releases the lock at once"]
#[derive(Debug)]
pub struct FencedGuard {
    guard: LockGuard,
    token: i64,
}

impl FencedGuard {
    /// The fencing token of this hold: larger than every token issued for this lock
    /// name before it (each acquire and re-entry gets its own).
    pub fn token(&self) -> i64 {
        self.token
    }

    /// Releases this hold, as [`LockGuard::release`] (`Err(NotHeld)` if it was lost).
    pub fn release(self) -> Result<ReleaseOutcome> {
        self.guard.release()
    }

    /// The plain guard, token dropped.
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }
}

impl std::ops::Deref for FencedGuard {
    type Target = LockGuard;
    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

/// The async fenced lock, re-exported from [`crate::aio`]: the implementation.
pub(crate) mod aio_fenced {
    use std::time::Duration;

    use super::{get_token_cmd, parse_token, Tokens, ACQUIRE};
    use crate::aio::{Client, Lock, LockGuard};
    use crate::error::Result;
    use crate::options::{AcquireOptions, Wait};
    use crate::ReleaseOutcome;

    impl Client {
        /// A handle on the fenced lock `name`, with a new owner id.
        pub fn fenced_lock(&self, name: impl Into<String>) -> FencedLock {
            FencedLock {
                lock: self.lock(name),
            }
        }

        /// A handle on the fenced lock `name` with an owner id of the caller's choosing.
        pub fn fenced_lock_with_owner(
            &self,
            name: impl Into<String>,
            owner: impl Into<String>,
        ) -> FencedLock {
            FencedLock {
                lock: self.lock_with_owner(name, owner),
            }
        }

        /// The last fencing token issued for lock `name`; `None` before the first.
        pub async fn fenced_token(&self, name: &str) -> Result<Option<i64>> {
            parse_token(self.query_retried(&get_token_cmd(name)).await?)
        }
    }

    /// A handle on one fenced lock, as one owner (async).
    #[derive(Debug)]
    pub struct FencedLock {
        lock: Lock,
    }

    impl FencedLock {
        /// The lock's name.
        pub fn name(&self) -> &str {
            self.lock.name()
        }

        /// This handle's owner id.
        pub fn owner(&self) -> &str {
            self.lock.owner()
        }

        /// This handle's hold count as the client knows it.
        pub fn hold_count(&self) -> u64 {
            self.lock.hold_count()
        }

        /// Takes the lock, waiting in the server for as long as it takes.
        pub async fn acquire(&self) -> Result<FencedGuard> {
            crate::proto::logic::taken(
                self.acquire_with(AcquireOptions::new()).await?,
                "RFENCED.ACQUIRE WAIT 0 timed out",
            )
        }

        /// Takes the lock if it is free (or already ours); never waits.
        pub async fn try_acquire(&self) -> Result<Option<FencedGuard>> {
            self.acquire_with(AcquireOptions::new().with_wait(Wait::No))
                .await
        }

        /// Takes the lock, waiting in the server at most `wait`.
        pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<FencedGuard>> {
            self.acquire_with(AcquireOptions::new().with_wait(Wait::Up(wait)))
                .await
        }

        /// Takes the lock with explicit options; the guard carries its token.
        ///
        /// # Cancel safety
        /// As [`Lock::acquire_with`](crate::aio::Lock::acquire_with).
        pub async fn acquire_with(&self, opts: AcquireOptions) -> Result<Option<FencedGuard>> {
            let mut tokens = Tokens::default();
            let Some(guard) = self
                .lock
                .acquire_as(opts, ACQUIRE, |v| tokens.read(v))
                .await?
            else {
                return Ok(None);
            };
            let token = tokens.taken()?;
            Ok(Some(FencedGuard { guard, token }))
        }
    }

    /// One hold of a fenced lock, with its fencing token (async).
    #[must_use = "dropping the guard releases the lock at once"]
    #[derive(Debug)]
    pub struct FencedGuard {
        guard: LockGuard,
        token: i64,
    }

    impl FencedGuard {
        /// The fencing token of this hold.
        pub fn token(&self) -> i64 {
            self.token
        }

        /// Releases this hold, as [`LockGuard::release`].
        pub async fn release(self) -> Result<ReleaseOutcome> {
            self.guard.release().await
        }

        /// The plain guard, token dropped.
        pub fn into_guard(self) -> LockGuard {
            self.guard
        }
    }

    impl std::ops::Deref for FencedGuard {
        type Target = LockGuard;
        fn deref(&self) -> &LockGuard {
            &self.guard
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_reads_acquire_replies() {
        assert_eq!(
            parse_acquire(Value::Array(vec![Value::Nil, Value::Int(7)])).unwrap(),
            (Acquired::Yes, Some(7))
        );
        // A lock without TTL: position 1 says "held", unlike Redisson's {-1, -1}.
        assert_eq!(
            parse_acquire(Value::Array(vec![Value::Int(-1), Value::Nil])).unwrap(),
            (Acquired::HeldFor(-1), None)
        );
        for bad in [
            Value::Nil,
            Value::Int(3),
            Value::Array(vec![Value::Nil, Value::Nil]),
            Value::Array(vec![Value::Int(1), Value::Int(2)]),
            Value::Array(vec![Value::Nil]),
        ] {
            assert!(parse_acquire(bad).is_err());
        }
    }

    #[test]
    fn it_keeps_the_token_of_the_reply_that_took_the_lock() {
        let mut t = Tokens::default();
        assert!(t.taken().is_err());
        t.read(Value::Array(vec![Value::Nil, Value::Int(5)]))
            .unwrap();
        t.read(Value::Array(vec![Value::Int(100), Value::Nil]))
            .unwrap();
        assert_eq!(t.taken().unwrap(), 5);
        t.read(Value::Array(vec![Value::Nil, Value::Int(9)]))
            .unwrap();
        assert_eq!(t.taken().unwrap(), 9);
    }

    #[test]
    fn it_builds_gettoken_and_reads_its_reply() {
        let words: Vec<Vec<u8>> = get_token_cmd("k")
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(words, vec![b"RFENCED.GETTOKEN".to_vec(), b"k".to_vec()]);
        assert_eq!(parse_token(Value::Nil).unwrap(), None);
        assert_eq!(parse_token(Value::Int(3)).unwrap(), Some(3));
        assert!(parse_token(Value::Okay).is_err());
    }
}
