//! The countdown latch (design.md 4.5, `RLATCH.*`): [`aio::CountDownLatch`], the
//! implementation, on the command builders and reply parsers below, and
//! [`CountDownLatch`], its blocking face.
//!
//! The latch lives in Redisson's layout (a string count at the name; missing = 0 = open),
//! so a Java `RCountDownLatch` on the same name counts down the same latch and wakes on
//! the same channel. Awaiting happens in the server (`RLATCH.AWAIT ... WAIT`), on a
//! connection of its own: every awaiter is answered in the turn the count reaches zero.
//!
//! Retries: `try_set_count`, `count_down` and `delete` send one fresh request id with all
//! their retries, so a count-down whose reply was lost is not counted twice. Awaiting
//! and reading change nothing and are simply retried.

use std::time::{Duration, Instant};

use redis::{Cmd, Value};

use crate::blocking::Client;
use crate::error::{Error, Result};
use crate::proto::logic::WAIT_REPLY_MARGIN;

/// `RLATCH.TRYSETCOUNT key count ID request-id`.
fn try_set_count_cmd(key: &str, count: u64, id: &str) -> Cmd {
    let mut c = redis::cmd("RLATCH.TRYSETCOUNT");
    c.arg(key).arg(count).arg("ID").arg(id);
    c
}

/// `RLATCH.COUNTDOWN key ID request-id`.
fn count_down_cmd(key: &str, id: &str) -> Cmd {
    let mut c = redis::cmd("RLATCH.COUNTDOWN");
    c.arg(key).arg("ID").arg(id);
    c
}

/// `RLATCH.GETCOUNT key`.
fn get_count_cmd(key: &str) -> Cmd {
    let mut c = redis::cmd("RLATCH.GETCOUNT");
    c.arg(key);
    c
}

/// `RLATCH.DELETE key ID request-id`.
fn delete_cmd(key: &str, id: &str) -> Cmd {
    let mut c = redis::cmd("RLATCH.DELETE");
    c.arg(key).arg("ID").arg(id);
    c
}

/// `RLATCH.AWAIT key [WAIT ms]`: `None` looks once, `Some(0)` waits without limit.
fn await_cmd(key: &str, wait_ms: Option<u64>) -> Cmd {
    let mut c = redis::cmd("RLATCH.AWAIT");
    c.arg(key);
    if let Some(ms) = wait_ms {
        c.arg("WAIT").arg(ms);
    }
    c
}

fn int(what: &str, v: Value) -> Result<i64> {
    match v {
        Value::Int(n) => Ok(n),
        other => Err(Error::UnexpectedReply(format!("{what}: {other:?}"))),
    }
}

fn flag(what: &str, v: Value) -> Result<bool> {
    match int(what, v)? {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(Error::UnexpectedReply(format!("{what}: {n}"))),
    }
}

/// One await attempt: the `WAIT` to send and how long to wait for its reply, for a wait
/// that ends at `until` (`None`: no end). A wait already over looks once (no `WAIT`); a
/// remaining wait under 1 ms is rounded up, since `WAIT 0` means no limit.
fn await_attempt(
    until: Option<Instant>,
    response_timeout: Option<Duration>,
) -> (Option<u64>, Option<Duration>) {
    match until {
        None => (Some(0), None),
        Some(end) => {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return (None, response_timeout);
            }
            let ms = u64::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
            let margin = WAIT_REPLY_MARGIN.max(response_timeout.unwrap_or_default());
            (Some(ms.max(1)), Some(Duration::from_millis(ms) + margin))
        }
    }
}

impl Client {
    /// A handle on the countdown latch `name` (Redisson's `RCountDownLatch` layout).
    ///
    /// ```no_run
    /// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// let latch = client.latch("batch:7");
    /// latch.try_set_count(3)?;
    /// // ... three workers call latch.count_down() ...
    /// latch.await_zero()?; // waits in the server until the count reaches zero
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn latch(&self, name: impl Into<String>) -> CountDownLatch {
        CountDownLatch {
            inner: self.inner.latch(name),
            client: self.clone(),
        }
    }
}

/// A countdown latch (blocking API): set a count, count it down, wait until it is zero.
/// The blocking face of [`crate::aio::CountDownLatch`].
#[derive(Debug, Clone)]
pub struct CountDownLatch {
    inner: aio::CountDownLatch,
    client: Client,
}

impl CountDownLatch {
    /// The latch's name (its key).
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Sets the count if no latch exists (Redisson's `trySetCount`); whether it was set.
    /// `count` must be 1 to `i64::MAX` (the server refuses others).
    pub fn try_set_count(&self, count: u64) -> Result<bool> {
        self.client.rt.block_on(self.inner.try_set_count(count))
    }

    /// Counts down by one; the count after (0 once open, or when there was no latch).
    /// Retried with one request id: a count-down is never applied twice.
    pub fn count_down(&self) -> Result<i64> {
        self.client.rt.block_on(self.inner.count_down())
    }

    /// The current count (0 without latch).
    pub fn count(&self) -> Result<i64> {
        self.client.rt.block_on(self.inner.count())
    }

    /// Deletes the latch, which opens it (module awaiters return; Redisson's own stay
    /// asleep, as with Redisson); whether there was one.
    pub fn delete(&self) -> Result<bool> {
        self.client.rt.block_on(self.inner.delete())
    }

    /// Waits in the server until the count is zero (or the latch gone).
    pub fn await_zero(&self) -> Result<()> {
        self.client.rt.block_on(self.inner.await_zero())
    }

    /// Waits at most `wait` for the count to reach zero; whether it did.
    /// `Duration::ZERO` only looks.
    pub fn await_timeout(&self, wait: Duration) -> Result<bool> {
        self.client.rt.block_on(self.inner.await_timeout(wait))
    }
}

/// The async latch ([`crate::aio::CountDownLatch`]).
pub(crate) mod aio {
    use std::time::{Duration, Instant};

    use redis::{Cmd, Value};

    use super::{
        await_attempt, await_cmd, count_down_cmd, delete_cmd, flag, get_count_cmd, int,
        try_set_count_cmd,
    };
    use crate::aio::Client;
    use crate::error::Result;
    use crate::proto::cmd::request_id;

    impl Client {
        /// A handle on the countdown latch `name` (Redisson's `RCountDownLatch` layout).
        ///
        /// ```no_run
        /// # async fn run() -> rlock_client::Result<()> {
        /// let client = rlock_client::aio::Client::open("redis://127.0.0.1/").await?;
        /// let latch = client.latch("batch:7");
        /// latch.try_set_count(1).await?;
        /// latch.count_down().await?;
        /// latch.await_zero().await?;
        /// # Ok(()) }
        /// ```
        pub fn latch(&self, name: impl Into<String>) -> CountDownLatch {
            CountDownLatch {
                client: self.clone(),
                name: name.into(),
            }
        }
    }

    /// A countdown latch (async API); the same operations as the blocking
    /// [`crate::CountDownLatch`].
    #[derive(Debug, Clone)]
    pub struct CountDownLatch {
        client: Client,
        name: String,
    }

    impl CountDownLatch {
        /// The latch's name (its key).
        pub fn name(&self) -> &str {
            &self.name
        }

        async fn run_retried(&self, c: &Cmd) -> Result<Value> {
            let inner = &self.client.inner;
            inner.with_retries(inner.retries(), || inner.run(c)).await
        }

        /// Sets the count if no latch exists; whether it was set.
        pub async fn try_set_count(&self, count: u64) -> Result<bool> {
            let c = try_set_count_cmd(&self.name, count, &request_id());
            flag("RLATCH.TRYSETCOUNT", self.run_retried(&c).await?)
        }

        /// Counts down by one; the count after. Retried with one request id.
        pub async fn count_down(&self) -> Result<i64> {
            let c = count_down_cmd(&self.name, &request_id());
            int("RLATCH.COUNTDOWN", self.run_retried(&c).await?)
        }

        /// The current count (0 without latch).
        pub async fn count(&self) -> Result<i64> {
            int(
                "RLATCH.GETCOUNT",
                self.run_retried(&get_count_cmd(&self.name)).await?,
            )
        }

        /// Deletes the latch (which opens it); whether there was one.
        pub async fn delete(&self) -> Result<bool> {
            let c = delete_cmd(&self.name, &request_id());
            flag("RLATCH.DELETE", self.run_retried(&c).await?)
        }

        /// Waits in the server until the count is zero (or the latch gone).
        pub async fn await_zero(&self) -> Result<()> {
            self.await_until(None).await.map(|_| ())
        }

        /// Waits at most `wait` for the count to reach zero; whether it did.
        pub async fn await_timeout(&self, wait: Duration) -> Result<bool> {
            self.await_until(Some(Instant::now() + wait)).await
        }

        async fn await_until(&self, until: Option<Instant>) -> Result<bool> {
            let inner = &self.client.inner;
            let timeout = inner.opts.response_timeout;
            let name = &self.name;
            inner
                .with_retries(inner.retries(), || async move {
                    let (wait, limit) = await_attempt(until, timeout);
                    let c = await_cmd(name, wait);
                    let reply = match wait {
                        None => inner.run(&c).await?,
                        Some(_) => inner.wait_query(limit, &c, None).await?,
                    };
                    flag("RLATCH.AWAIT", reply)
                })
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(c: &Cmd) -> Vec<String> {
        c.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<other>".into(),
            })
            .collect()
    }

    #[test]
    fn it_builds_the_commands_with_the_key_at_position_1() {
        assert_eq!(
            args(&try_set_count_cmd("l", 3, "r")),
            ["RLATCH.TRYSETCOUNT", "l", "3", "ID", "r"]
        );
        assert_eq!(
            args(&count_down_cmd("l", "r")),
            ["RLATCH.COUNTDOWN", "l", "ID", "r"]
        );
        assert_eq!(
            args(&delete_cmd("l", "r")),
            ["RLATCH.DELETE", "l", "ID", "r"]
        );
        assert_eq!(args(&get_count_cmd("l")), ["RLATCH.GETCOUNT", "l"]);
        assert_eq!(args(&await_cmd("l", None)), ["RLATCH.AWAIT", "l"]);
        assert_eq!(
            args(&await_cmd("l", Some(0))),
            ["RLATCH.AWAIT", "l", "WAIT", "0"]
        );
    }

    #[test]
    fn an_await_never_sends_wait_0_for_a_short_wait() {
        assert_eq!(await_attempt(None, None), (Some(0), None));
        let soon = Instant::now() + Duration::from_micros(300);
        let (wait, limit) = await_attempt(Some(soon), None);
        assert_eq!(wait, Some(1), "rounded up, never the endless WAIT 0");
        assert!(limit.unwrap() >= WAIT_REPLY_MARGIN);
        let past = Instant::now() - Duration::from_millis(1);
        assert_eq!(await_attempt(Some(past), None).0, None, "over: look once");
    }

    #[test]
    fn it_reads_flags_and_counts() {
        assert!(flag("x", Value::Int(1)).unwrap());
        assert!(!flag("x", Value::Int(0)).unwrap());
        assert!(flag("x", Value::Int(2)).is_err());
        assert!(int("x", Value::Nil).is_err());
        assert_eq!(int("x", Value::Int(-3)).unwrap(), -3);
    }
}
