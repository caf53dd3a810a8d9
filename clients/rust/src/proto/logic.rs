//! The decisions of an acquire and a release, shared by the blocking and async APIs:
//! which command to send and where, what a reply means for the handle's state, when
//! to retry and how long to pause first. No I/O here: each API runs the commands
//! (`query` / `query_async`) and sleeps (thread / tokio) itself, and asks this module
//! what to do next.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use redis::{Cmd, RedisResult, Value};

use crate::error::{Error, Result};
use crate::options::{millis, AcquireOptions, ClientOptions, ReplicaSync, RetryPolicy, Wait};
use crate::proto::backoff::Jitter;
use crate::proto::cmd::{self, Acquired, Released};
use crate::proto::state::{LockShared, LostReason, Start};
use crate::ReleaseOutcome;

/// Extra read time a waiting command (a waiting acquire, a replica check) allows
/// beyond its own limit, for the reply to travel: the server itself answers at the limit.
pub(crate) const WAIT_REPLY_MARGIN: Duration = Duration::from_secs(2);

/// Locks `m` even if a thread panicked while holding it: every critical section of
/// this crate leaves its data consistent before anything in it can panic.
pub(crate) fn lock_ignoring_poison<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The renewal connection's read timeout: a renewal that takes longer than a renewal
/// interval is better abandoned and retried on a fresh connection, while the lease
/// still has two intervals to go.
pub(crate) fn renewal_timeout(opts: &ClientOptions) -> Option<Duration> {
    let interval = opts.renew_interval().max(Duration::from_millis(1));
    Some(opts.response_timeout.map_or(interval, |t| t.min(interval)))
}

/// A wait without limit only ends with the lock (or an error): `None` from one is a
/// broken promise, reported as `UnexpectedReply(what)`.
pub(crate) fn taken<G>(guard: Option<G>, what: &str) -> Result<G> {
    guard.ok_or_else(|| Error::UnexpectedReply(what.into()))
}

/// The renewal registry of a client, as the acquire and release logic sees it. The
/// blocking client keeps it behind its worker thread's mutex, the async one behind
/// its renewal task's.
pub(crate) trait Renewals {
    /// Starts watching `shared`'s lock in `epoch` (renewing it if `renew`), its lease
    /// counted from `at`.
    fn register(
        &self,
        shared: &Arc<LockShared>,
        epoch: u64,
        lease: Duration,
        renew: bool,
        at: Instant,
    );
    /// A re-entry re-armed the lease of a lock already watched.
    fn rearmed(&self, handle: u64, epoch: u64, lease: Duration, at: Instant);
    /// Stops watching the handle's lock.
    fn unregister(&self, handle: u64);
}

/// How many attempts an operation may still make, and the pause before each: capped
/// exponential backoff with jitter ([`RetryPolicy`]), transient errors only.
pub(crate) struct Retries<'a> {
    policy: &'a RetryPolicy,
    jitter: &'a Jitter,
    max_attempts: u32,
    retried: u32,
}

impl<'a> Retries<'a> {
    /// As many attempts as `policy` allows.
    pub(crate) fn new(policy: &'a RetryPolicy, jitter: &'a Jitter) -> Self {
        Retries {
            policy,
            jitter,
            max_attempts: policy.max_attempts(),
            retried: 0,
        }
    }

    /// One attempt only, no retry (a best-effort release).
    pub(crate) fn once(mut self) -> Self {
        self.max_attempts = 1;
        self
    }

    /// After an attempt failed with `e`: the pause before the next one, or `None` to
    /// give up with `e` (not transient, or no attempt left).
    pub(crate) fn backoff(&mut self, e: &Error) -> Option<Duration> {
        if !e.is_transient() || self.retried + 1 >= self.max_attempts {
            return None;
        }
        let d = self.policy.delay(self.retried, self.jitter);
        self.retried += 1;
        Some(d)
    }
}

/// Where an acquire attempt is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// The shared connection: the server answers at once.
    Shared,
    /// A connection of its own, since the command waits in the server; `limit` bounds
    /// the wait for its reply (None: no limit, a wait without end).
    Waiting { limit: Option<Duration> },
}

/// What an acquire does after an attempt.
pub(crate) enum Next {
    /// The lock is taken: build the guard ([`Acquiring::finish`]).
    Taken,
    /// The lock was granted long after the attempt was sent: re-arm its lease with
    /// [`Acquiring::renew_command`] and hand the result to [`Acquiring::after_renew`].
    Renew,
    /// Attempt again at once (the handle's lock was lost; a new epoch started).
    Again,
    /// Attempt again after this pause (a transient failure).
    Backoff(Duration),
    /// Give up: the lock is held by another owner (past the wait limit).
    NotTaken,
    /// Give up with this error.
    Fail(Error),
}

/// What an acquire that took the lock hands to its guard.
pub(crate) struct Took {
    pub(crate) epoch: u64,
    /// The lease, as sent.
    pub(crate) lease_ms: u64,
    /// The lease a release re-arms a re-entered lock with: the watchdog lease, or
    /// none for a fixed lease.
    pub(crate) release_lease_ms: Option<u64>,
}

/// One acquire in progress, across its attempts and retries.
pub(crate) struct Acquiring<'a> {
    opts: AcquireOptions,
    lease: Duration,
    lease_ms: u64,
    response_timeout: Option<Duration>,
    until: Option<Instant>,
    start: Start,
    retries: Retries<'a>,
    /// One request id for this acquire and all its retries: a retry of an attempt
    /// that did take effect (a re-entry, or a handoff to a waiter whose connection
    /// then broke) gets the first reply back and changes nothing.
    request: String,
    /// The send time of the earliest attempt that may have taken the lock: the
    /// lease cannot have started before it.
    lease_from: Option<Instant>,
    /// The acquire command: `RLOCK.ACQUIRE`, or `RFENCED.ACQUIRE` ([`Self::with_command`]).
    command: &'static str,
    /// A waiting acquire's first attempt asks without waiting ([`LockShared::tries_first`]).
    trying_first: bool,
}

impl<'a> Acquiring<'a> {
    /// Starts an acquire through `shared` with `opts`, on a client with `client`'s options.
    pub(crate) fn new(
        shared: &LockShared,
        opts: AcquireOptions,
        client: &'a ClientOptions,
        jitter: &'a Jitter,
    ) -> Result<Self> {
        let lease = opts.lease_or(client.watchdog_timeout);
        if lease.is_zero() {
            return Err(Error::InvalidArgument("lease must be positive"));
        }
        let now = Instant::now();
        let start = shared.begin_acquire();
        let trying_first = start.holds == 0 && opts.wait != Wait::No && shared.tries_first(now);
        Ok(Acquiring {
            trying_first,
            lease,
            lease_ms: millis(lease),
            response_timeout: client.response_timeout,
            until: opts.wait_until(now),
            opts,
            start,
            retries: Retries::new(&client.retry, jitter),
            request: cmd::request_id(),
            lease_from: None,
            command: cmd::ACQUIRE,
        })
    }

    /// Sends `command` (same arguments as `RLOCK.ACQUIRE`) instead: the fenced lock.
    pub(crate) fn with_command(mut self, command: &'static str) -> Self {
        self.command = command;
        self
    }

    /// The command of an attempt sent at `sent`, and where to send it.
    pub(crate) fn attempt(&self, shared: &LockShared, sent: Instant) -> (Cmd, Route) {
        // Re-entry never waits (the server answers at once), and neither does a try:
        // both go on the shared connection.
        let wait_ms = match self.opts.wait {
            _ if self.start.holds > 0 || self.trying_first => None,
            Wait::No => None,
            Wait::Forever => Some(0),
            Wait::Up(_) => {
                let left = self
                    .until
                    .map_or(Duration::ZERO, |u| u.saturating_duration_since(sent));
                // Rounded up: the ticket's wait ends at the call's start plus this, on
                // the client's clock, and must not end before the caller's deadline.
                (!left.is_zero())
                    .then(|| u64::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX))
            }
        };
        let command = cmd::acquire_named(
            self.command,
            &shared.key,
            shared.side,
            &shared.owner,
            self.lease_ms,
            wait_ms,
            &self.request,
        );
        let route = match wait_ms {
            None => Route::Shared,
            Some(w) => Route::Waiting {
                limit: (w > 0).then(|| {
                    Duration::from_millis(w)
                        + WAIT_REPLY_MARGIN.max(self.response_timeout.unwrap_or_default())
                }),
            },
        };
        (command, route)
    }

    /// What to do after the attempt sent at `sent` got `reply`.
    pub(crate) fn after_attempt(
        &mut self,
        c: &impl Renewals,
        shared: &LockShared,
        sent: Instant,
        reply: Result<Acquired>,
    ) -> Next {
        let from = *self.lease_from.get_or_insert(sent);
        match reply {
            // A lock handed over after a wait started its lease at the handoff,
            // somewhere between the send and the reply; counting from the send is
            // safe but, after a long wait, says the lease is (nearly) over. When the
            // renewal would already be due, the lease is re-armed now with
            // `RLOCK.RENEW`, whose send time is then a safe start.
            Ok(Acquired::Yes) if from.elapsed() < self.lease / 3 => Next::Taken,
            Ok(Acquired::Yes) => Next::Renew,
            // We thought we held it and someone else does: ours was lost.
            Ok(Acquired::HeldFor(_)) if self.start.holds > 0 => self.lost(c, shared),
            Ok(Acquired::HeldFor(_)) if self.trying_first => {
                // Held: wait for it at once, in the queue.
                self.trying_first = false;
                self.lease_from = None;
                shared.found(true, Instant::now());
                Next::Again
            }
            Ok(Acquired::HeldFor(_)) => Next::NotTaken,
            Err(e) => match self.retries.backoff(&e) {
                Some(d) => Next::Backoff(d),
                None => Next::Fail(e),
            },
        }
    }

    /// The `RLOCK.RENEW` that re-arms the lease of a lock just granted ([`Next::Renew`]).
    pub(crate) fn renew_command(&self, shared: &LockShared) -> Cmd {
        cmd::renew(&shared.key, shared.side, &shared.owner, self.lease_ms)
    }

    /// What to do after the renewal asked for by [`Next::Renew`], sent at `sent` (with
    /// its own retries), answered `renewed`.
    pub(crate) fn after_renew(
        &mut self,
        c: &impl Renewals,
        shared: &LockShared,
        sent: Instant,
        renewed: Result<bool>,
    ) -> Next {
        match renewed {
            Ok(true) => {
                self.lease_from = Some(sent);
                Next::Taken
            }
            // Handed the lock, then it was gone before we could renew it.
            Ok(false) => self.lost(c, shared),
            // Unconfirmed: count from the first send, which may report the lease run
            // out early.
            Err(e) if e.is_transient() => Next::Taken,
            Err(e) => Next::Fail(e),
        }
    }

    /// The handle's lock turned out lost: reports it, and starts over in a new epoch
    /// with a new request id (a try gives up instead).
    fn lost(&mut self, c: &impl Renewals, shared: &LockShared) -> Next {
        if self.start.holds > 0 {
            shared.mark_lost(self.start.epoch, LostReason::NotHeld);
            c.unregister(shared.handle);
        }
        self.start = shared.begin_acquire();
        self.request = cmd::request_id();
        self.lease_from = None;
        if self.opts.wait == Wait::No {
            Next::NotTaken
        } else {
            Next::Again
        }
    }

    /// Tells the handle what this acquire, which took the lock, found: held by another
    /// (`waited`: its ticket was queued, or it waited without being told) or free. A
    /// re-entry or a try says nothing about it.
    pub(crate) fn found(&self, shared: &LockShared, waited: bool) {
        if self.start.holds == 0 && self.opts.wait != Wait::No {
            shared.found(waited, Instant::now());
        }
    }

    /// Tells the handle this acquire gave up, the lock held by another.
    pub(crate) fn found_held(&self, shared: &LockShared) {
        if self.opts.wait != Wait::No {
            shared.found(true, Instant::now());
        }
    }

    /// Records the lock taken ([`Next::Taken`]) in the handle's state and the renewal
    /// registry; what the guard needs.
    pub(crate) fn finish(self, c: &impl Renewals, shared: &Arc<LockShared>) -> Took {
        let at = self.lease_from.expect("set when the lock was taken");
        let epoch = self.start.epoch;
        if shared.acquired(epoch, at, self.lease) == 1 {
            c.register(shared, epoch, self.lease, self.opts.lease.is_none(), at);
        } else {
            c.rearmed(shared.handle, epoch, self.lease, at);
        }
        Took {
            epoch,
            lease_ms: self.lease_ms,
            release_lease_ms: self.opts.lease.is_none().then_some(self.lease_ms),
        }
    }
}

/// The replica check after an acquire (`RENEW` then `WAIT`, one pipeline on a
/// connection of its own), and the read limit for its reply.
pub(crate) fn replica_check(
    shared: &LockShared,
    lease_ms: u64,
    rs: ReplicaSync,
    wanted: u32,
    scripts: bool,
) -> (redis::Pipeline, Duration) {
    let pipe = cmd::replica_check(
        &shared.key,
        shared.side,
        &shared.owner,
        lease_ms,
        wanted,
        millis(rs.timeout()),
        scripts,
    );
    (pipe, rs.timeout() + WAIT_REPLY_MARGIN)
}

/// Whether the replica check's `reply` shows enough replicas. On an error the caller
/// releases the lock it just took: it must not leave behind a lock the caller will not
/// know it holds.
pub(crate) fn replica_outcome(
    shared: &LockShared,
    wanted: u32,
    reply: RedisResult<Vec<Value>>,
) -> Result<()> {
    let acked = match reply?.pop() {
        Some(w) => cmd::parse_wait(w)?,
        None => return Err(Error::UnexpectedReply("WAIT: no reply".into())),
    };
    if acked < wanted {
        return Err(Error::ReplicaSync {
            key: shared.key.clone(),
            wanted,
            acked,
        });
    }
    Ok(())
}

fn not_held(shared: &LockShared) -> Error {
    Error::NotHeld {
        key: shared.key.clone(),
    }
}

/// Starts releasing one hold of `epoch`: the `RLOCK.RELEASE` to send (with a fresh
/// request id, the same for all its retries, so that a retry of a release that did
/// reach the server gets the first reply and is not applied twice), or
/// [`Error::NotHeld`] when the epoch is over.
pub(crate) fn begin_release(
    c: &impl Renewals,
    shared: &LockShared,
    epoch: u64,
    lease_ms: Option<u64>,
) -> Result<Cmd> {
    let holds = shared.current(epoch).ok_or_else(|| not_held(shared))?;
    if holds == 1 {
        // Stop renewing before the lock can be freed, so a late renewal never reports
        // a loss of a lock we gave up on purpose.
        c.unregister(shared.handle);
    }
    Ok(cmd::release(
        &shared.key,
        shared.side,
        &shared.owner,
        lease_ms,
        &cmd::request_id(),
    ))
}

/// Records what the server said to a release of one hold of `epoch`.
pub(crate) fn released(
    c: &impl Renewals,
    shared: &LockShared,
    epoch: u64,
    reply: Released,
) -> Result<ReleaseOutcome> {
    match reply {
        Released::StillHeld => {
            shared.released(epoch, false);
            Ok(ReleaseOutcome::StillHeld)
        }
        Released::Freed => {
            shared.released(epoch, true);
            c.unregister(shared.handle);
            Ok(ReleaseOutcome::Freed)
        }
        Released::NotHeld => {
            shared.mark_lost(epoch, LostReason::NotHeld);
            c.unregister(shared.handle);
            Err(not_held(shared))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal registry that only counts what it is told.
    #[derive(Default)]
    struct Counts(Mutex<(u32, u32, u32)>);

    impl Renewals for Counts {
        fn register(&self, _: &Arc<LockShared>, _: u64, _: Duration, _: bool, _: Instant) {
            lock_ignoring_poison(&self.0).0 += 1;
        }
        fn rearmed(&self, _: u64, _: u64, _: Duration, _: Instant) {
            lock_ignoring_poison(&self.0).1 += 1;
        }
        fn unregister(&self, _: u64) {
            lock_ignoring_poison(&self.0).2 += 1;
        }
    }

    impl Counts {
        /// (registered, re-armed, unregistered)
        fn get(&self) -> (u32, u32, u32) {
            *lock_ignoring_poison(&self.0)
        }
    }

    fn transient() -> Error {
        Error::Server {
            code: "LOADING".into(),
            message: String::new(),
        }
    }

    fn shared() -> Arc<LockShared> {
        Arc::new(LockShared::new("k".into(), "c:1".into(), 1))
    }

    /// Takes the lock through `shared` as if the server said yes at once.
    fn take(c: &Counts, shared: &Arc<LockShared>, opts: AcquireOptions) -> Took {
        let (client, jitter) = (ClientOptions::new(), Jitter::seeded(1));
        let mut run = Acquiring::new(shared, opts, &client, &jitter).unwrap();
        let next = run.after_attempt(c, shared, Instant::now(), Ok(Acquired::Yes));
        assert!(matches!(next, Next::Taken));
        run.finish(c, shared)
    }

    #[test]
    fn it_retries_only_transient_errors_up_to_max_attempts() {
        let policy = RetryPolicy::new().with_max_attempts(3);
        let jitter = Jitter::seeded(1);
        let mut r = Retries::new(&policy, &jitter);
        assert!(r.backoff(&Error::InvalidArgument("x")).is_none());
        assert!(r.backoff(&transient()).is_some());
        assert!(r.backoff(&transient()).is_some());
        assert!(r.backoff(&transient()).is_none(), "three attempts in all");
        let mut once = Retries::new(&policy, &jitter).once();
        assert!(once.backoff(&transient()).is_none());
    }

    #[test]
    fn it_waits_on_a_connection_of_its_own_unless_it_reenters_or_tries() {
        let (client, jitter, c) = (ClientOptions::new(), Jitter::seeded(1), Counts::default());
        let up = Duration::from_secs(1);
        // Table: (already held, wait) -> route.
        for (held, wait, want) in [
            (false, Wait::No, Route::Shared),
            (false, Wait::Forever, Route::Waiting { limit: None }),
            (
                false,
                Wait::Up(up),
                Route::Waiting {
                    limit: Some(
                        up + ClientOptions::DEFAULT_RESPONSE_TIMEOUT.max(WAIT_REPLY_MARGIN),
                    ),
                },
            ),
            (true, Wait::Forever, Route::Shared),
        ] {
            let s = shared();
            if held {
                take(&c, &s, AcquireOptions::new());
            }
            // Found held lately: it queues at once (waits.json: tries first otherwise).
            s.found(true, Instant::now());
            let opts = AcquireOptions::new().with_wait(wait);
            let run = Acquiring::new(&s, opts, &client, &jitter).unwrap();
            // Sent at the deadline minus the whole wait: exactly `up` left.
            let sent = run.until.map_or_else(Instant::now, |u| u - up);
            assert_eq!(run.attempt(&s, sent).1, want, "{held} {wait:?}");
        }
    }

    #[test]
    fn it_renews_a_lock_granted_after_a_third_of_its_lease() {
        let (client, jitter, c) = (ClientOptions::new(), Jitter::seeded(1), Counts::default());
        let s = shared();
        let mut run = Acquiring::new(&s, AcquireOptions::new(), &client, &jitter).unwrap();
        let long_ago = Instant::now() - client.watchdog_timeout() / 2;
        let next = run.after_attempt(&c, &s, long_ago, Ok(Acquired::Yes));
        assert!(matches!(next, Next::Renew));
        let sent = Instant::now();
        let next = run.after_renew(&c, &s, sent, Ok(true));
        assert!(matches!(next, Next::Taken));
        let took = run.finish(&c, &s);
        assert_eq!(
            s.deadline(took.epoch),
            Some(sent + client.watchdog_timeout())
        );
        assert_eq!(c.get(), (1, 0, 0), "registered for renewal");
    }

    #[test]
    fn it_counts_a_reentry_and_rearms_instead_of_registering() {
        let c = Counts::default();
        let s = shared();
        let first = take(&c, &s, AcquireOptions::new());
        let second = take(&c, &s, AcquireOptions::new());
        assert_eq!(first.epoch, second.epoch);
        assert_eq!(s.current(first.epoch), Some(2));
        assert_eq!(c.get(), (1, 1, 0));
        assert_eq!(second.release_lease_ms, Some(second.lease_ms));
        let fixed = AcquireOptions::new().with_lease(Duration::from_secs(5));
        assert_eq!(take(&c, &shared(), fixed).release_lease_ms, None);
    }

    #[test]
    fn it_reports_the_lock_lost_when_a_reentry_finds_another_owner() {
        let (client, jitter, c) = (ClientOptions::new(), Jitter::seeded(1), Counts::default());
        let s = shared();
        let took = take(&c, &s, AcquireOptions::new());
        let try_opts = AcquireOptions::new().with_wait(Wait::No);
        let mut run = Acquiring::new(&s, try_opts, &client, &jitter).unwrap();
        let next = run.after_attempt(&c, &s, Instant::now(), Ok(Acquired::HeldFor(500)));
        assert!(matches!(next, Next::NotTaken), "a try gives up");
        assert_eq!(s.lost_reason(took.epoch), Some(LostReason::NotHeld));
        assert_eq!(c.get().2, 1, "unregistered");
    }

    #[test]
    fn it_maps_release_replies_to_state_and_outcome() {
        // Table: reply -> outcome, holds left in the epoch, renewal stopped.
        for (reply, outcome, holds, unregistered) in [
            (
                Released::StillHeld,
                Some(ReleaseOutcome::StillHeld),
                Some(1),
                0,
            ),
            (Released::Freed, Some(ReleaseOutcome::Freed), None, 1),
            (Released::NotHeld, None, None, 1),
        ] {
            let (c, s) = (Counts::default(), shared());
            let epoch = take(&c, &s, AcquireOptions::new()).epoch;
            take(&c, &s, AcquireOptions::new());
            begin_release(&c, &s, epoch, None).unwrap();
            let got = released(&c, &s, epoch, reply);
            match outcome {
                Some(o) => assert_eq!(got.unwrap(), o, "{reply:?}"),
                None => assert!(matches!(got, Err(Error::NotHeld { .. })), "{reply:?}"),
            }
            assert_eq!(s.current(epoch), holds, "{reply:?}");
            assert_eq!(c.get().2, unregistered, "{reply:?}");
        }
    }

    #[test]
    fn it_refuses_to_release_an_epoch_that_is_over() {
        let (c, s) = (Counts::default(), shared());
        let epoch = take(&c, &s, AcquireOptions::new()).epoch;
        s.mark_lost(epoch, LostReason::NotHeld);
        assert!(matches!(
            begin_release(&c, &s, epoch, None),
            Err(Error::NotHeld { .. })
        ));
    }

    #[test]
    fn it_fails_the_replica_check_with_too_few_acknowledgements() {
        let s = shared();
        let reply = |n| Ok(vec![Value::Int(1), Value::Int(n)]);
        assert!(replica_outcome(&s, 2, reply(2)).is_ok());
        assert!(matches!(
            replica_outcome(&s, 2, reply(1)),
            Err(Error::ReplicaSync {
                wanted: 2,
                acked: 1,
                ..
            })
        ));
        assert!(matches!(
            replica_outcome(&s, 2, Ok(vec![])),
            Err(Error::UnexpectedReply(_))
        ));
    }
}
