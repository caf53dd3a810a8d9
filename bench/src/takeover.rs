//! Takeover: a holder takes the lock with lease L and vanishes without releasing; a
//! waiter is already waiting. Measured: time from the end of the lease until the
//! waiter holds the lock. 50 000 unrelated keys with TTLs sit in the database so that
//! Redis's sampling active-expire cycle is unlikely to pick the lock key early: an
//! implementation relying on it would show up here.

use std::time::{Duration, Instant};

use crate::locks::{Algo, Locker, Shas};
use crate::resp::{encode, RawConn, Reply};
use crate::server::Server;
use crate::Res;

/// Fills the database with `n` unrelated keys carrying a one-hour TTL.
pub fn preload(server: &Server, n: u64) -> Res<()> {
    RawConn::connect(server.port)?.load(
        n,
        |j, buf| {
            encode(
                buf,
                &[
                    b"SET",
                    format!("other:{j}").as_bytes(),
                    b"x",
                    b"PX",
                    b"3600000",
                ],
            )
        },
        |r| match r {
            Reply::Status => Ok(()),
            _ => Err("preload SET failed".into()),
        },
    )
}

/// One sample: milliseconds from the end of the holder's lease until the waiter holds
/// the lock. The lease end is taken from the moment the holder's acquire was sent,
/// which is at most one round trip early, so the result errs on the slow side.
pub struct Takeover {
    holder: Locker,
    waiter: Locker,
    lease_ms: u64,
}

impl Takeover {
    pub fn new(server: &Server, algo: Algo, shas: &Shas, lease_ms: u64) -> Res<Takeover> {
        let sub = |s: &Server| -> Res<Option<redis::Connection>> {
            Ok(if algo == Algo::Redisson {
                Some(s.client()?)
            } else {
                None
            })
        };
        let holder = Locker::new(
            algo,
            server.client()?,
            sub(server)?,
            shas,
            "x",
            "holder:1",
            lease_ms,
        )?;
        let waiter = Locker::new(
            algo,
            server.client()?,
            sub(server)?,
            shas,
            "x",
            "waiter:1",
            10_000,
        )?;
        Ok(Takeover {
            holder,
            waiter,
            lease_ms,
        })
    }

    pub fn sample(&mut self, key: &str) -> Res<f64> {
        self.holder.set_key(key);
        self.waiter.set_key(key);
        let sent = Instant::now();
        if !self.holder.try_acquire()? {
            return Err(format!("takeover: {key} was not free").into());
        }
        let lease_end = sent + Duration::from_millis(self.lease_ms);
        if !self.waiter.acquire(lease_end + Duration::from_secs(2))? {
            return Err(format!(
                "takeover: the waiter did not get {key} within 2 s of the lease end"
            )
            .into());
        }
        let got = Instant::now();
        if got < lease_end {
            return Err(format!(
                "takeover: the waiter got {key} before the holder's lease ran out"
            )
            .into());
        }
        self.waiter.release()?;
        Ok(got.saturating_duration_since(lease_end).as_secs_f64() * 1000.0)
    }
}
