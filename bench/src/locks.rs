//! The lock algorithms under test, each written on the same blocking redis-rs
//! connection type so that only the algorithm differs between them:
//! - `Rlock`: `RLOCK.ACQUIRE ... WAIT`, the server queues and hands over;
//! - `Redisson`: Redisson's own Lua scripts and its client-side wait on the unlock channel;
//! - `Polling`: `SET NX PX` retried with jittered exponential backoff, released with
//!   redis-py's compare-and-delete script (the redis-py / redsync family).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use crate::Res;

/// Redisson's `tryLockInnerAsync`: KEYS[1]=lock, ARGV[1]=leaseMs, ARGV[2]=owner.
pub const REDISSON_ACQUIRE: &str = "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);";

/// Redisson's `unlockInnerAsync` with the unlock latch: KEYS = lock, channel, latch;
/// ARGV = message 0, leaseMs, owner, 'publish', latch timeout ms.
pub const REDISSON_UNLOCK: &str = "local val = redis.call('get', KEYS[3]); if val ~= false then return tonumber(val); end; if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end; local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); redis.call('set', KEYS[3], 0, 'px', ARGV[5]); return 0; else redis.call('del', KEYS[1]); redis.call(ARGV[4], KEYS[2], ARGV[1]); redis.call('set', KEYS[3], 1, 'px', ARGV[5]); return 1; end;";

/// redis-py `Lock.release`: delete the key only if it still holds our token.
pub const COMPARE_AND_DELETE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// Redisson's latch lifetime: (timeout 3000 + retryInterval 1500) × retryAttempts 3
/// with its default config.
pub const REDISSON_LATCH_MS: &str = "13500";

/// Source of Redisson unlock request ids, unique within this process.
static REQUEST_IDS: AtomicU64 = AtomicU64::new(1);

/// SHA1s of the three scripts, loaded once per server with SCRIPT LOAD.
#[derive(Clone, Debug)]
pub struct Shas {
    pub acquire: String,
    pub unlock: String,
    pub cad: String,
}

impl Shas {
    pub fn load(c: &mut Connection) -> Res<Shas> {
        let mut load =
            |s: &str| -> Res<String> { Ok(redis::cmd("SCRIPT").arg("LOAD").arg(s).query(c)?) };
        Ok(Shas {
            acquire: load(REDISSON_ACQUIRE)?,
            unlock: load(REDISSON_UNLOCK)?,
            cad: load(COMPARE_AND_DELETE)?,
        })
    }
}

/// Redisson's channel naming (`prefixName`): braces keep the channel in the lock's slot.
/// Redisson's acquire script: None = acquired, Some(pttl) = held by another.
fn redisson_try(
    con: &mut Connection,
    shas: &Shas,
    key: &str,
    lease_ms: u64,
    owner: &str,
) -> Res<Option<i64>> {
    let v: Value = redis::cmd("EVALSHA")
        .arg(&shas.acquire)
        .arg(1)
        .arg(key)
        .arg(lease_ms)
        .arg(owner)
        .query(con)?;
    match v {
        Value::Nil => Ok(None),
        Value::Int(t) => Ok(Some(t)),
        other => Err(format!("Redisson acquire answered {other:?}").into()),
    }
}

pub fn channel_of(key: &str) -> String {
    if key.contains('{') {
        format!("redisson_lock__channel:{key}")
    } else {
        format!("redisson_lock__channel:{{{key}}}")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    Rlock,
    Redisson,
    Polling,
}

impl Algo {
    pub fn label(self) -> &'static str {
        match self {
            Algo::Rlock => "rlock WAIT",
            Algo::Redisson => "Redisson algorithm",
            Algo::Polling => "polling SET NX + backoff",
        }
    }
}

/// One lock client: one owner identity, one command connection and, for Redisson,
/// one connection for its pub/sub subscription.
pub struct Locker {
    algo: Algo,
    key: String,
    channel: String,
    owner: String,
    lease_ms: u64,
    con: Connection,
    sub: Option<Connection>,
    shas: Shas,
    /// redis-py uses a fresh token per acquisition; this makes it unique.
    seq: u64,
    token: String,
    rng: u64,
}

/// Backoff of the polling lock: first retry after up to 1 ms, doubling to a 32 ms cap,
/// full jitter. Far more eager than the libraries' defaults (redis-py sleeps a fixed
/// 100 ms, redsync 50–250 ms), so the polling numbers are its best case.
const POLL_BASE_US: u64 = 1_000;
const POLL_CAP_US: u64 = 32_000;

impl Locker {
    pub fn new(
        algo: Algo,
        con: Connection,
        sub: Option<Connection>,
        shas: &Shas,
        key: &str,
        owner: &str,
        lease_ms: u64,
    ) -> Res<Locker> {
        // No wait in any scenario exceeds a few seconds: a reply that takes 15 s is a hang
        // in the implementation under test, reported as such rather than waited out.
        con.set_read_timeout(Some(Duration::from_secs(15)))?;
        if algo == Algo::Redisson && sub.is_none() {
            return Err("the Redisson algorithm needs a subscription connection".into());
        }
        let seed = owner.bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        Ok(Locker {
            algo,
            key: key.to_string(),
            channel: channel_of(key),
            owner: owner.to_string(),
            lease_ms,
            con,
            sub,
            shas: shas.clone(),
            seq: 0,
            token: String::new(),
            rng: seed | 1,
        })
    }

    pub fn set_key(&mut self, key: &str) {
        self.key = key.to_string();
        self.channel = channel_of(key);
    }

    pub fn con(&mut self) -> &mut Connection {
        &mut self.con
    }

    /// Acquires, waiting no later than `deadline`. Ok(false) when the wait ran out.
    pub fn acquire(&mut self, deadline: Instant) -> Res<bool> {
        match self.algo {
            Algo::Rlock => self.acquire_rlock(deadline),
            Algo::Redisson => self.acquire_redisson(deadline),
            Algo::Polling => self.acquire_polling(deadline),
        }
    }

    /// One attempt without waiting. Ok(true) when now held.
    pub fn try_acquire(&mut self) -> Res<bool> {
        match self.algo {
            Algo::Rlock => {
                let v: Value = redis::cmd("RLOCK.ACQUIRE")
                    .arg(&self.key)
                    .arg(&self.owner)
                    .arg(self.lease_ms)
                    .query(&mut self.con)?;
                Ok(v == Value::Nil)
            }
            Algo::Redisson => Ok(self.redisson_try()?.is_none()),
            Algo::Polling => self.polling_try(),
        }
    }

    pub fn release(&mut self) -> Res<()> {
        let v: Value = match self.algo {
            Algo::Rlock => redis::cmd("RLOCK.RELEASE")
                .arg(&self.key)
                .arg(&self.owner)
                .query(&mut self.con)?,
            Algo::Redisson => {
                // Redisson's request id is a fresh UUID per unlock call, and its latch key
                // outlives the call by 13.5 s: the id must be unique across runs too.
                let id = REQUEST_IDS.fetch_add(1, Ordering::Relaxed);
                let latch = format!(
                    "redisson_unlock_latch:{{{}}}:{:08x}-{id:016x}",
                    self.key,
                    std::process::id()
                );
                redis::cmd("EVALSHA")
                    .arg(&self.shas.unlock)
                    .arg(3)
                    .arg(&self.key)
                    .arg(&self.channel)
                    .arg(latch)
                    .arg(0)
                    .arg(self.lease_ms)
                    .arg(&self.owner)
                    .arg("publish")
                    .arg(REDISSON_LATCH_MS)
                    .query(&mut self.con)?
            }
            Algo::Polling => redis::cmd("EVALSHA")
                .arg(&self.shas.cad)
                .arg(1)
                .arg(&self.key)
                .arg(&self.token)
                .query(&mut self.con)?,
        };
        match v {
            Value::Int(1) => Ok(()),
            other => Err(format!(
                "{}: release of {} answered {other:?}",
                self.algo.label(),
                self.key
            )
            .into()),
        }
    }

    fn acquire_rlock(&mut self, deadline: Instant) -> Res<bool> {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .as_millis() as u64;
        if left == 0 {
            return self.try_acquire();
        }
        let v: Value = redis::cmd("RLOCK.ACQUIRE")
            .arg(&self.key)
            .arg(&self.owner)
            .arg(self.lease_ms)
            .arg("WAIT")
            .arg(left)
            .query(&mut self.con)
            .map_err(|e| format!("RLOCK.ACQUIRE {} {} WAIT {left}: {e}", self.key, self.owner))?;
        match v {
            Value::Nil => Ok(true),
            Value::Int(_) => Ok(false),
            other => Err(format!("RLOCK.ACQUIRE WAIT answered {other:?}").into()),
        }
    }

    /// Runs the acquire script. None = acquired, Some(pttl) = held by another.
    fn redisson_try(&mut self) -> Res<Option<i64>> {
        redisson_try(
            &mut self.con,
            &self.shas,
            &self.key,
            self.lease_ms,
            &self.owner,
        )
    }

    /// Redisson's `tryLock(waitTime)`: try; on a PTTL subscribe to the unlock channel,
    /// then loop try → wait for an unlock message up to min(ttl, time left) → retry.
    /// Each client models one JVM, so it subscribes per contended acquire and
    /// unsubscribes once it holds the lock, as Redisson does.
    fn acquire_redisson(&mut self, deadline: Instant) -> Res<bool> {
        if self.redisson_try()?.is_none() {
            return Ok(true);
        }
        let sub = self.sub.as_mut().expect("checked in new");
        let mut ps = sub.as_pubsub();
        ps.subscribe(&self.channel)?;
        let outcome = (|| -> Res<bool> {
            loop {
                // A free function, not the method: the subscription borrows `self.sub`.
                let Some(ttl) = redisson_try(
                    &mut self.con,
                    &self.shas,
                    &self.key,
                    self.lease_ms,
                    &self.owner,
                )?
                else {
                    return Ok(true);
                };
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(false);
                }
                let wait = if ttl >= 0 {
                    left.min(Duration::from_millis(ttl as u64))
                } else {
                    left
                };
                // Redisson's latch.tryAcquire(0) returns at once: retry immediately.
                if wait.is_zero() {
                    continue;
                }
                ps.set_read_timeout(Some(wait))?;
                match ps.get_message() {
                    Ok(_) => {}
                    Err(e) if e.is_timeout() => {}
                    Err(e) => return Err(e.into()),
                }
            }
        })();
        // The drop of `ps` unsubscribes and reads the confirmations; give it a sane
        // timeout rather than the last (possibly 1 ms) wait.
        ps.set_read_timeout(Some(Duration::from_secs(10)))?;
        outcome
    }

    fn polling_try(&mut self) -> Res<bool> {
        self.seq += 1;
        self.token = format!("{}:{}", self.owner, self.seq);
        let v: Value = redis::cmd("SET")
            .arg(&self.key)
            .arg(&self.token)
            .arg("NX")
            .arg("PX")
            .arg(self.lease_ms)
            .query(&mut self.con)?;
        Ok(v != Value::Nil)
    }

    fn acquire_polling(&mut self, deadline: Instant) -> Res<bool> {
        let mut cap = POLL_BASE_US;
        loop {
            if self.polling_try()? {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            // xorshift64: a private, dependency-free source of jitter.
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let sleep = Duration::from_micros(self.rng % (cap + 1));
            std::thread::sleep(sleep.min(left));
            cap = (cap * 2).min(POLL_CAP_US);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_names_the_channel_like_redisson() {
        assert_eq!(channel_of("lock"), "redisson_lock__channel:{lock}");
        assert_eq!(channel_of("{a}lock"), "redisson_lock__channel:{a}lock");
    }
}
