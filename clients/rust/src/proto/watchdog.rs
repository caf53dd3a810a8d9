//! The renewal registry: which held locks a client must renew, when, and what a
//! renewal's outcome means. Pure: the blocking thread and the async task that drive
//! it only add the clock, the connection and the sleeping.
//!
//! One worker per client serves every lock of that client: due renewals are sent
//! together, pipelined, rather than one thread or task per lock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::options::{millis, RetryPolicy};
use crate::proto::backoff::Jitter;
use crate::proto::state::{LockShared, LostReason};

struct Entry {
    shared: Arc<LockShared>,
    epoch: u64,
    lease: Duration,
    /// Watchdog locks are renewed; fixed-lease locks are only watched for their deadline.
    renew: bool,
    deadline: Instant,
    next_renew: Instant,
    failures: u32,
}

/// A renewal to send.
#[derive(Debug, Clone)]
pub(crate) struct Due {
    pub(crate) handle: u64,
    pub(crate) epoch: u64,
    pub(crate) key: String,
    /// `Some(READ|WRITE)`: a side of a read-write lock (`RRWLOCK.RENEW`).
    pub(crate) side: Option<&'static str>,
    pub(crate) owner: String,
    pub(crate) lease_ms: u64,
}

/// What one renewal came back with.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// RENEW answered 1.
    Renewed,
    /// RENEW answered 0, or an error that says the key is no longer a lock of ours.
    NotHeld,
    /// A transient failure: retry within the lease.
    Failed,
}

/// The registry of one client.
pub(crate) struct Registry {
    entries: HashMap<u64, Entry>,
    interval: Duration,
    retry: RetryPolicy,
    jitter: Jitter,
    /// When the worker will next look at the registry of its own accord: `None` while
    /// it is at work (it plans again before sleeping), `Some(None)` asleep without a
    /// timer. An insert wakes it only if it would otherwise look too late, so that an
    /// acquire / release loop does not wake it on every acquire.
    worker_looks: Option<Option<Instant>>,
}

/// A lock whose loss must be reported (outside the registry's lock).
pub(crate) type Lost = (Arc<LockShared>, u64, LostReason);

/// Reports `lost` to the locks' guards. Call it outside the registry's lock: the
/// guards' callbacks run here.
pub(crate) fn report(lost: Vec<Lost>) {
    for (shared, epoch, why) in lost {
        shared.mark_lost(epoch, why);
    }
}

impl Registry {
    pub(crate) fn new(interval: Duration, retry: RetryPolicy) -> Self {
        Registry {
            entries: HashMap::new(),
            interval,
            retry,
            jitter: Jitter::new(),
            worker_looks: None,
        }
    }

    /// The worker is about to sleep until `wake` (`None`: until woken), having planned
    /// under the same lock.
    pub(crate) fn worker_sleeps(&mut self, wake: Option<Instant>) {
        self.worker_looks = Some(wake);
    }

    /// Starts watching a lock acquired at `sent_at` (the send time, not the reply's:
    /// the server's expiry is never earlier than `sent_at + lease`). True when the
    /// worker must be woken to look at it in time (it is then counted as at work).
    #[must_use]
    pub(crate) fn insert(
        &mut self,
        shared: Arc<LockShared>,
        epoch: u64,
        lease: Duration,
        renew: bool,
        sent_at: Instant,
    ) -> bool {
        let deadline = sent_at + lease;
        let next_renew = if renew {
            sent_at + self.interval
        } else {
            deadline
        };
        self.entries.insert(
            shared.handle,
            Entry {
                shared,
                epoch,
                lease,
                renew,
                deadline,
                next_renew,
                failures: 0,
            },
        );
        let wake = match self.worker_looks {
            None => false,
            Some(None) => true,
            Some(Some(at)) => next_renew.min(deadline) < at,
        };
        if wake {
            self.worker_looks = None;
        }
        wake
    }

    /// A re-entrant acquire re-armed the lease at `sent_at`.
    pub(crate) fn rearmed(&mut self, handle: u64, epoch: u64, lease: Duration, sent_at: Instant) {
        if let Some(e) = self.entries.get_mut(&handle) {
            if e.epoch == epoch {
                e.deadline = e.deadline.max(sent_at + lease);
            }
        }
    }

    /// Stops watching a handle's lock (released, or found lost).
    pub(crate) fn remove(&mut self, handle: u64) {
        self.entries.remove(&handle);
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Splits off what is due at `now`: renewals to send, and locks whose lease has
    /// run out without a confirmed renewal (removed, to be reported lost).
    pub(crate) fn plan(&mut self, now: Instant) -> (Vec<Due>, Vec<Lost>) {
        let mut lost = Vec::new();
        self.entries.retain(|_, e| {
            if now >= e.deadline {
                lost.push((e.shared.clone(), e.epoch, LostReason::LeaseExpired));
                false
            } else {
                true
            }
        });
        let due = self
            .entries
            .values()
            .filter(|e| e.renew && now >= e.next_renew)
            .map(|e| Due {
                handle: e.shared.handle,
                epoch: e.epoch,
                key: e.shared.key.clone(),
                side: e.shared.side,
                owner: e.shared.owner.clone(),
                lease_ms: millis(e.lease),
            })
            .collect();
        (due, lost)
    }

    /// Applies the outcome of a renewal sent at `sent_at`; returns a loss to report.
    pub(crate) fn apply(&mut self, due: &Due, outcome: Outcome, sent_at: Instant) -> Option<Lost> {
        let e = self.entries.get_mut(&due.handle)?;
        if e.epoch != due.epoch {
            // Released and taken again while the renewal was in flight: not about this epoch.
            return None;
        }
        match outcome {
            Outcome::Renewed => {
                e.deadline = e.deadline.max(sent_at + e.lease);
                e.next_renew = sent_at + self.interval;
                e.failures = 0;
                e.shared.renewed(e.epoch, e.deadline);
                None
            }
            Outcome::NotHeld => {
                let e = self.entries.remove(&due.handle)?;
                Some((e.shared, e.epoch, LostReason::NotHeld))
            }
            Outcome::Failed => {
                // Retry with backoff, but never sleep past the deadline: the last
                // chance to renew is just before the lease runs out.
                let delay = self.retry.delay(e.failures, &self.jitter);
                e.failures = e.failures.saturating_add(1);
                let now = Instant::now();
                e.next_renew = (now + delay).min(e.deadline).max(now);
                None
            }
        }
    }

    /// Applies the outcomes of a round of renewals, `results[i]` for `due[i]`; returns
    /// the losses to report.
    pub(crate) fn apply_all(&mut self, due: &[Due], results: Vec<(Outcome, Instant)>) -> Vec<Lost> {
        due.iter()
            .zip(results)
            .filter_map(|(d, (outcome, sent_at))| self.apply(d, outcome, sent_at))
            .collect()
    }

    /// When the worker must wake next (None: nothing to watch).
    /// The earliest lease end among the watched locks: a renewal still unanswered then
    /// is abandoned, so that the loss is reported when the lease ends, not when a
    /// partitioned connection finally gives up (found by the fault harness).
    pub(crate) fn earliest_deadline(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.deadline).min()
    }

    pub(crate) fn next_wake(&self) -> Option<Instant> {
        self.entries
            .values()
            .map(|e| {
                if e.renew {
                    e.next_renew.min(e.deadline)
                } else {
                    e.deadline
                }
            })
            .min()
    }
}

/// The cluster hash slot of a key (CRC16-XMODEM of the hash tag, mod 16384), so that
/// renewals can be pipelined per slot: a cluster pipeline goes to one node.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_millis(900);
    const INTERVAL: Duration = Duration::from_millis(300);

    fn registry() -> Registry {
        Registry::new(
            INTERVAL,
            RetryPolicy::new().with_base_delay(Duration::from_millis(10)),
        )
    }

    fn held(handle: u64) -> (Arc<LockShared>, u64) {
        let s = Arc::new(LockShared::new(
            format!("k{handle}"),
            format!("c:{handle}"),
            handle,
        ));
        let start = s.begin_acquire();
        s.acquired(start.epoch, Instant::now(), LEASE);
        (s, start.epoch)
    }

    #[test]
    fn an_insert_wakes_the_worker_only_when_it_would_look_too_late() {
        let mut r = registry();
        let t0 = Instant::now();
        let (s, e) = held(1);
        assert!(
            !r.insert(s.clone(), e, LEASE, true, t0),
            "at work: it plans again"
        );
        r.remove(1);
        r.worker_sleeps(None);
        assert!(
            r.insert(s.clone(), e, LEASE, true, t0),
            "asleep without a timer"
        );
        assert!(!r.insert(s.clone(), e, LEASE, true, t0), "woken already");
        r.worker_sleeps(r.next_wake());
        r.remove(1);
        // The loop's next acquire is due later than the timer already set.
        assert!(!r.insert(s.clone(), e, LEASE, true, t0 + INTERVAL / 2));
        r.remove(1);
        // One due sooner (a shorter lease) needs it.
        let short = Duration::from_millis(60);
        assert!(r.insert(s, e, short, false, t0));
    }

    #[test]
    fn it_renews_watchdog_locks_every_interval() {
        let mut r = registry();
        let t0 = Instant::now();
        let (s, e) = held(1);
        let _ = r.insert(s, e, LEASE, true, t0);
        assert!(r.plan(t0).0.is_empty(), "nothing due at once");
        assert_eq!(r.next_wake(), Some(t0 + INTERVAL));
        let (due, lost) = r.plan(t0 + INTERVAL);
        assert_eq!(due.len(), 1);
        assert!(lost.is_empty());
        assert_eq!(due[0].lease_ms, 900);
        let sent = t0 + INTERVAL;
        assert!(r.apply(&due[0], Outcome::Renewed, sent).is_none());
        assert_eq!(r.next_wake(), Some(sent + INTERVAL));
    }

    #[test]
    fn it_reports_a_renewal_answered_zero_as_not_held() {
        let mut r = registry();
        let t0 = Instant::now();
        let (s, e) = held(1);
        let _ = r.insert(s.clone(), e, LEASE, true, t0);
        let (due, _) = r.plan(t0 + INTERVAL);
        let (_, epoch, why) = r.apply(&due[0], Outcome::NotHeld, t0 + INTERVAL).unwrap();
        assert_eq!((epoch, why), (e, LostReason::NotHeld));
        assert!(r.is_empty());
    }

    #[test]
    fn it_retries_failed_renewals_until_the_lease_runs_out() {
        let mut r = registry();
        let t0 = Instant::now();
        let (s, e) = held(1);
        let _ = r.insert(s, e, LEASE, true, t0);
        let (due, _) = r.plan(t0 + INTERVAL);
        assert!(r.apply(&due[0], Outcome::Failed, t0 + INTERVAL).is_none());
        let wake = r.next_wake().unwrap();
        assert!(wake < t0 + LEASE, "the retry comes before the deadline");
        let (_, lost) = r.plan(t0 + LEASE);
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].2, LostReason::LeaseExpired);
        assert!(r.is_empty());
    }

    #[test]
    fn it_only_watches_the_deadline_of_fixed_leases() {
        let mut r = registry();
        let t0 = Instant::now();
        let (s, e) = held(1);
        let _ = r.insert(s, e, LEASE, false, t0);
        assert_eq!(r.next_wake(), Some(t0 + LEASE));
        assert!(r.plan(t0 + INTERVAL).0.is_empty());
        assert_eq!(r.plan(t0 + LEASE).1.len(), 1);
    }

    #[test]
    fn it_ignores_outcomes_of_an_older_epoch() {
        let mut r = registry();
        let t0 = Instant::now();
        let (s, e) = held(1);
        let _ = r.insert(s.clone(), e, LEASE, true, t0);
        let (due, _) = r.plan(t0 + INTERVAL);
        // Released and re-acquired while the renewal was in flight.
        s.released(e, true);
        r.remove(1);
        let e2 = s.begin_acquire().epoch;
        s.acquired(e2, t0, LEASE);
        let _ = r.insert(s, e2, LEASE, true, t0 + INTERVAL);
        assert!(r.apply(&due[0], Outcome::NotHeld, t0 + INTERVAL).is_none());
        assert!(!r.is_empty());
    }

    #[test]
    fn it_computes_cluster_slots_like_redis() {
        // Table: key -> CLUSTER KEYSLOT on a real server.
        for (key, want) in [
            ("foo", 12182),
            ("bar", 5061),
            ("{user1000}.following", 3443),
            ("{user1000}.followers", 3443),
            ("foo{}{bar}", 8363),
            ("foo{{bar}}zap", 4015),
            ("", 0),
        ] {
            assert_eq!(slot(key.as_bytes()), want, "{key}");
        }
    }
}
