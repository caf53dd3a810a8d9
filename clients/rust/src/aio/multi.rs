//! Locks made of several locks, async, and the one implementation of both APIs:
//! [`MultiLock`] (all of them, or none) and [`RedLock`] (a majority, within a validity
//! time), as Redisson's `RedissonMultiLock` and `RedissonRedLock`. The blocking
//! [`crate::MultiLock`] and [`crate::RedLock`] (`blocking/multi.rs`) run these on a
//! client's runtime and wrap the parts' guards; the combined guard's bookkeeping
//! ([`Group`]: the parts, the quorum, the loss signal, the validity) is shared by both.
//!
//! Each part is an ordinary [`Lock`] of its own [`Client`](crate::aio::Client): it
//! waits, retries and is renewed by that client's renewal task as usual. The combined
//! guard holds the parts' guards and reports the whole lost when too many parts are lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::aio::{Lock, LockGuard};
use crate::error::{Error, Result};
use crate::options::{AcquireOptions, Wait};
use crate::proto::backoff::Jitter;
use crate::proto::logic::{lock_ignoring_poison, taken};
use crate::proto::state::LostReason;

/// How long one round of a [`MultiLock`] acquired without limit may wait for each of
/// its locks (times the number of locks), as Redisson's `lock()` does, so that two
/// multi-locks taking the same locks in different orders cannot wait for each other
/// forever: each gives up what it took and starts again.
const MULTI_ROUND_WAIT_PER_LOCK: Duration = Duration::from_millis(1500);

/// Upper bound of the random pause between two rounds.
const ROUND_PAUSE: Duration = Duration::from_millis(100);

/// The clock-drift allowance of a lease, Redis's Redlock formula: 1 % of the lease
/// plus 2 ms.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(rlock_client::redlock_drift(Duration::from_secs(10)), Duration::from_millis(102));
/// ```
pub fn redlock_drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// The validity left to a lock taken with `lease` in `elapsed`: `lease - elapsed -
/// drift`, or `None` when nothing is left (the Redlock acquire failed).
///
/// ```
/// use std::time::Duration;
/// use rlock_client::redlock_validity;
/// let lease = Duration::from_secs(10);
/// assert_eq!(redlock_validity(lease, Duration::from_millis(98)), Some(Duration::from_millis(9800)));
/// assert_eq!(redlock_validity(lease, Duration::from_millis(9898)), None);
/// ```
pub fn redlock_validity(lease: Duration, elapsed: Duration) -> Option<Duration> {
    lease
        .checked_sub(elapsed)?
        .checked_sub(redlock_drift(lease))
        .filter(|v| !v.is_zero())
}

/// The majority of `n`: `n / 2 + 1`.
fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// The loss signal of a combined guard: the whole is lost once more parts are lost
/// than it can spare. Waited on by a blocked thread (`cond`) or a task (`notify`).
struct Signal {
    state: Mutex<SignalState>,
    cond: Condvar,
    notify: Notify,
}

type Callback = Box<dyn FnOnce(LostReason) + Send + 'static>;

struct SignalState {
    /// Parts that may be lost before the whole is.
    spare: usize,
    lost_parts: usize,
    lost: Option<LostReason>,
    callbacks: Vec<Callback>,
}

impl Signal {
    fn new(spare: usize) -> Signal {
        Signal {
            state: Mutex::new(SignalState {
                spare,
                lost_parts: 0,
                lost: None,
                callbacks: Vec::new(),
            }),
            cond: Condvar::new(),
            notify: Notify::new(),
        }
    }

    fn part_lost(&self, why: LostReason) {
        let callbacks = {
            let mut st = lock_ignoring_poison(&self.state);
            st.lost_parts += 1;
            if st.lost.is_some() || st.lost_parts <= st.spare {
                return;
            }
            st.lost = Some(why);
            std::mem::take(&mut st.callbacks)
        };
        for cb in callbacks {
            cb(why);
        }
        self.cond.notify_all();
        self.notify.notify_waiters();
    }
}

/// What a combined guard needs of a part's guard: the async [`LockGuard`] here, the
/// blocking [`crate::LockGuard`] in `blocking/multi.rs`.
pub(crate) trait Part {
    fn part_is_held(&self) -> bool;
    fn part_deadline(&self) -> Option<Instant>;
    fn part_on_lost(&self, f: Box<dyn FnOnce(LostReason) + Send + 'static>);
}

impl Part for LockGuard {
    fn part_is_held(&self) -> bool {
        self.is_held()
    }

    fn part_deadline(&self) -> Option<Instant> {
        self.deadline()
    }

    fn part_on_lost(&self, f: Box<dyn FnOnce(LostReason) + Send + 'static>) {
        self.on_lost(f)
    }
}

/// What a combined guard holds: the parts' guards and how many of them it needs.
pub(crate) struct Group<G: Part> {
    pub(crate) guards: Vec<G>,
    pub(crate) quorum: usize,
    drift: Duration,
    signal: Arc<Signal>,
}

impl<G: Part> Group<G> {
    fn new(guards: Vec<G>, quorum: usize, drift: Duration) -> Group<G> {
        let signal = Arc::new(Signal::new(guards.len().saturating_sub(quorum)));
        for g in &guards {
            let s = signal.clone();
            g.part_on_lost(Box::new(move |why| s.part_lost(why)));
        }
        Group {
            guards,
            quorum,
            drift,
            signal,
        }
    }

    /// The same group with each part's guard wrapped (the blocking faces): a new loss
    /// signal, told at once of a part already lost.
    pub(crate) fn map<H: Part>(self, f: impl FnMut(G) -> H) -> Group<H> {
        Group::new(
            self.guards.into_iter().map(f).collect(),
            self.quorum,
            self.drift,
        )
    }

    pub(crate) fn held_count(&self) -> usize {
        self.guards.iter().filter(|g| g.part_is_held()).count()
    }

    /// The quorum-th latest lease deadline among the parts still held, less the drift.
    pub(crate) fn validity(&self) -> Duration {
        let mut deadlines: Vec<Instant> = self
            .guards
            .iter()
            .filter_map(|g| g.part_deadline())
            .collect();
        if deadlines.len() < self.quorum || self.quorum == 0 {
            return Duration::ZERO;
        }
        deadlines.sort_unstable_by(|a, b| b.cmp(a));
        let until = deadlines[self.quorum - 1];
        until
            .saturating_duration_since(Instant::now())
            .saturating_sub(self.drift)
    }

    pub(crate) fn is_held(&self) -> bool {
        self.held_count() >= self.quorum && !self.validity().is_zero()
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        if let Some(why) = lock_ignoring_poison(&self.signal.state).lost {
            return Some(why);
        }
        (!self.is_held()).then_some(LostReason::LeaseExpired)
    }

    /// Blocks the calling thread until the whole is lost, or `timeout` passes.
    pub(crate) fn wait_lost(&self, timeout: Option<Duration>) -> Option<LostReason> {
        let until = timeout.map(|t| Instant::now() + t);
        let mut st = lock_ignoring_poison(&self.signal.state);
        loop {
            if let Some(why) = st.lost {
                return Some(why);
            }
            let now = Instant::now();
            let left = match until {
                Some(u) if now >= u => return None,
                Some(u) => u - now,
                None => Duration::from_secs(3600),
            };
            st = self
                .signal
                .cond
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Completes when the whole is lost. Cancel safe.
    pub(crate) async fn lost(&self) -> LostReason {
        loop {
            // Registered before the state is read, so a loss in between still wakes it.
            let notified = self.signal.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(why) = lock_ignoring_poison(&self.signal.state).lost {
                return why;
            }
            notified.await;
        }
    }

    pub(crate) fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        let now = {
            let mut st = lock_ignoring_poison(&self.signal.state);
            match st.lost {
                Some(why) => why,
                None => {
                    st.callbacks.push(Box::new(f));
                    return;
                }
            }
        };
        f(now);
    }
}

/// The parts' releases summed up: how many succeeded, and the error to report, a
/// [`Error::NotHeld`] rather than another (the caller must learn the section ran
/// unprotected).
pub(crate) fn tally<T>(results: impl IntoIterator<Item = Result<T>>) -> (usize, Option<Error>) {
    let mut released = 0;
    let mut first: Option<Error> = None;
    for r in results {
        match r {
            Ok(_) => released += 1,
            Err(e) => {
                let prefer = matches!(e, Error::NotHeld { .. })
                    && !matches!(first, Some(Error::NotHeld { .. }));
                if first.is_none() || prefer {
                    first = Some(e);
                }
            }
        }
    }
    (released, first)
}

impl Group<LockGuard> {
    async fn release(self) -> (usize, Option<Error>) {
        let mut results = Vec::with_capacity(self.guards.len());
        for g in self.guards {
            results.push(g.release().await);
        }
        tally(results)
    }
}

/// Gives back the locks of a round that failed, best-effort: a lock that cannot be
/// released expires with its lease.
async fn give_back(guards: Vec<LockGuard>) {
    for g in guards {
        let _ = g.release().await;
    }
}

/// Several locks taken together, all or none (Redisson's `RedissonMultiLock`), async;
/// see [`crate::MultiLock`], its blocking face, for the rules.
///
/// # Cancel safety
/// Dropping an acquire's future drops the guards it had taken so far, and each dropped
/// guard releases its lock best-effort (see [`LockGuard`]'s `# Drop`).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use rlock_client::aio::{Client, MultiLock};
///
/// # async fn run() -> rlock_client::Result<()> {
/// let a = Client::open("redis://10.0.0.1/").await?;
/// let b = Client::open("redis://10.0.0.2/").await?;
/// let both = MultiLock::new([a.lock("account:1"), b.lock("account:2")]);
/// if let Some(guard) = both.acquire_timeout(Duration::from_secs(2)).await? {
///     // ... move money between the two accounts ...
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct MultiLock {
    locks: Vec<Lock>,
    jitter: Jitter,
}

impl MultiLock {
    /// All of `locks`, taken in this order.
    pub fn new(locks: impl IntoIterator<Item = Lock>) -> MultiLock {
        MultiLock {
            locks: locks.into_iter().collect(),
            jitter: Jitter::new(),
        }
    }

    /// The locks.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// Takes all the locks, waiting as long as it takes; watchdog leases. Waits in
    /// rounds of 1.5 s per lock: a round that cannot take them all gives back what it
    /// took and starts again after a short random pause.
    pub async fn acquire(&self) -> Result<MultiGuard> {
        taken(
            self.acquire_with(AcquireOptions::new()).await?,
            "a wait without limit ended",
        )
    }

    /// Takes all the locks if each is free (or already ours); never waits.
    pub async fn try_acquire(&self) -> Result<Option<MultiGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::No))
            .await
    }

    /// Takes all the locks, waiting at most `wait` in all.
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<MultiGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::Up(wait)))
            .await
    }

    /// Takes all the locks with explicit options; `opts.wait()` bounds the whole.
    ///
    /// # Errors
    /// The first error of a part (after that part's own retries); the locks taken
    /// before it have been released. [`Error::InvalidArgument`] with no locks.
    pub async fn acquire_with(&self, opts: AcquireOptions) -> Result<Option<MultiGuard>> {
        if self.locks.is_empty() {
            return Err(Error::InvalidArgument(
                "a MultiLock needs at least one lock",
            ));
        }
        if opts.wait != Wait::Forever {
            return self.round(opts).await;
        }
        let per_round =
            MULTI_ROUND_WAIT_PER_LOCK * u32::try_from(self.locks.len()).unwrap_or(u32::MAX);
        loop {
            if let Some(g) = self.round(opts.with_wait(Wait::Up(per_round))).await? {
                return Ok(Some(g));
            }
            tokio::time::sleep(self.jitter.up_to(ROUND_PAUSE)).await;
        }
    }

    async fn round(&self, opts: AcquireOptions) -> Result<Option<MultiGuard>> {
        let until = opts.wait_until(Instant::now());
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let wait = match until {
                Some(u) => Wait::Up(u.saturating_duration_since(Instant::now())),
                None => opts.wait,
            };
            match lock.acquire_with(opts.with_wait(wait)).await {
                Ok(Some(g)) => guards.push(g),
                Ok(None) => {
                    give_back(guards).await;
                    return Ok(None);
                }
                Err(e) => {
                    give_back(guards).await;
                    return Err(e);
                }
            }
        }
        let n = guards.len();
        Ok(Some(MultiGuard {
            group: Group::new(guards, n, Duration::ZERO),
        }))
    }
}

/// All the locks of a [`MultiLock`], async; see [`crate::MultiGuard`].
///
/// # Drop
/// Dropping it drops every part's guard: each releases its lock best-effort.
#[must_use = "dropping the guard releases the locks at once"]
pub struct MultiGuard {
    pub(crate) group: Group<LockGuard>,
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("locks", &self.group.guards)
            .finish()
    }
}

impl MultiGuard {
    /// The guards of the parts, in the order of the locks.
    pub fn guards(&self) -> &[LockGuard] {
        &self.group.guards
    }

    /// Whether every lock is still held, as far as the clients know.
    pub fn is_held(&self) -> bool {
        self.group.is_held()
    }

    /// Why the locks were lost (the first part lost), if they were.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.group.lost_reason()
    }

    /// Completes when any of the locks is lost. Cancel safe.
    pub async fn lost(&self) -> LostReason {
        self.group.lost().await
    }

    /// Calls `f` once when any of the locks is lost (at once if one already was).
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        self.group.on_lost(f)
    }

    /// Releases every lock (each with its own retries).
    ///
    /// # Errors
    /// [`Error::NotHeld`] if any lock was no longer held, else the first other error;
    /// the other locks are released all the same.
    pub async fn release(self) -> Result<()> {
        match self.group.release().await {
            (_, None) => Ok(()),
            (_, Some(e)) => Err(e),
        }
    }
}

/// The Redlock algorithm over independent servers (Redisson's `RedissonRedLock`),
/// async; see [`crate::RedLock`], its blocking face, for the rules.
///
/// # Cancel safety
/// Dropping an acquire's future leaves its requests running as tasks of their own;
/// each grant nobody takes any more is released by its task.
///
/// # Examples
///
/// ```no_run
/// use rlock_client::aio::{Client, RedLock};
///
/// # async fn run() -> rlock_client::Result<()> {
/// let mut locks = Vec::new();
/// for url in ["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"] {
///     locks.push(Client::open(url).await?.lock("report:daily"));
/// }
/// let redlock = RedLock::new(locks);
/// if let Some(guard) = redlock.try_acquire().await? {
///     // ... at most one process runs the report ...
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedLock {
    locks: Vec<Lock>,
    /// One flag per server: a request of an earlier round still running there.
    busy: Vec<Arc<AtomicBool>>,
    server_timeout: Duration,
    jitter: Jitter,
}

/// Clears a server's busy flag when its request's task ends.
struct NotBusy(Arc<AtomicBool>);

impl Drop for NotBusy {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl RedLock {
    /// How long a round waits for each server's answer by default.
    pub const DEFAULT_SERVER_TIMEOUT: Duration = Duration::from_millis(250);

    /// One lock per independent server; the majority of them is needed.
    pub fn new(locks: impl IntoIterator<Item = Lock>) -> RedLock {
        let locks: Vec<Lock> = locks.into_iter().collect();
        RedLock {
            busy: locks.iter().map(|_| Arc::default()).collect(),
            locks,
            server_timeout: Self::DEFAULT_SERVER_TIMEOUT,
            jitter: Jitter::new(),
        }
    }

    /// How long a round waits for each server's answer (at least 1 ms).
    pub fn with_server_timeout(mut self, d: Duration) -> RedLock {
        self.server_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// The locks, one per server.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// How many servers must grant the lock: a strict majority.
    pub fn quorum(&self) -> usize {
        quorum(self.locks.len())
    }

    /// Takes the lock on a majority, trying again as long as it takes.
    pub async fn acquire(&self) -> Result<RedLockGuard> {
        taken(
            self.acquire_with(AcquireOptions::new()).await?,
            "a wait without limit ended",
        )
    }

    /// One round: the lock on a majority now, or nothing.
    pub async fn try_acquire(&self) -> Result<Option<RedLockGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::No))
            .await
    }

    /// Rounds until a majority grants the lock, at most `wait` in all.
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<RedLockGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::Up(wait)))
            .await
    }

    /// Rounds with explicit options; `opts.wait()` bounds the whole.
    ///
    /// # Errors
    /// The first error when more servers failed than the majority can spare;
    /// [`Error::InvalidArgument`] with no locks or a zero lease.
    pub async fn acquire_with(&self, opts: AcquireOptions) -> Result<Option<RedLockGuard>> {
        if self.locks.is_empty() {
            return Err(Error::InvalidArgument("a RedLock needs at least one lock"));
        }
        if opts.lease.is_some_and(|l| l.is_zero()) {
            return Err(Error::InvalidArgument("lease must be positive"));
        }
        let until = opts.wait_until(Instant::now());
        loop {
            if let Some(g) = self.round(opts).await? {
                return Ok(Some(g));
            }
            let pause = self.jitter.up_to(ROUND_PAUSE);
            match (opts.wait, until) {
                (Wait::No, _) => return Ok(None),
                (_, Some(u)) if Instant::now() + pause >= u => return Ok(None),
                _ => tokio::time::sleep(pause).await,
            }
        }
    }

    /// One round: every server asked at once (a task each), the answers that come
    /// within the server timeout counted.
    async fn round(&self, opts: AcquireOptions) -> Result<Option<RedLockGuard>> {
        let lease = self
            .locks
            .iter()
            .map(|l| l.lease_for(&opts))
            .min()
            .expect("at least one lock");
        let part_opts = opts.with_wait(Wait::No);
        let start = Instant::now();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Result<Option<LockGuard>>>();
        let mut asked = 0;
        for (lock, busy) in self.locks.iter().zip(&self.busy) {
            if busy.swap(true, Ordering::SeqCst) {
                continue; // still busy with an earlier round: counts as refused
            }
            let (lock, tx, not_busy) = (lock.same_handle(), tx.clone(), NotBusy(busy.clone()));
            drop(tokio::spawn(async move {
                let r = lock.acquire_with(part_opts).await;
                // If the round gave up on this server, the guard comes back in the
                // error and is dropped here, which releases it; only then is the
                // handle free for the next round.
                drop(tx.send(r));
                drop(not_busy);
            }));
            asked += 1;
        }
        drop(tx);
        let deadline = tokio::time::Instant::from_std(start + self.server_timeout);
        let mut granted = Vec::new();
        let mut errors = Vec::new();
        for _ in 0..asked {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Ok(Some(g)))) => granted.push(g),
                Ok(Some(Ok(None))) => {}
                Ok(Some(Err(e))) => errors.push(e),
                Ok(None) | Err(_) => break,
            }
        }
        // Answers still on their way are released by their tasks (or here, if one is
        // already queued in the channel).
        drop(rx);
        let n = self.locks.len();
        let need = quorum(n);
        let valid = redlock_validity(lease, start.elapsed());
        if granted.len() >= need && valid.is_some() {
            return Ok(Some(RedLockGuard {
                group: Group::new(granted, need, redlock_drift(lease)),
                servers: n,
            }));
        }
        give_back(granted).await;
        if errors.len() > n - need {
            return Err(errors.swap_remove(0));
        }
        Ok(None)
    }
}

/// A lock held on a majority of a [`RedLock`]'s servers, async; see
/// [`crate::RedLockGuard`].
///
/// # Drop
/// Dropping it drops every part's guard: each releases its lock best-effort.
#[must_use = "dropping the guard releases the lock at once"]
pub struct RedLockGuard {
    pub(crate) group: Group<LockGuard>,
    pub(crate) servers: usize,
}

impl std::fmt::Debug for RedLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedLockGuard")
            .field("held", &self.held_count())
            .field("servers", &self.servers)
            .field("validity", &self.validity())
            .finish()
    }
}

impl RedLockGuard {
    /// The guards of the servers that granted the lock.
    pub fn guards(&self) -> &[LockGuard] {
        &self.group.guards
    }

    /// How many servers still hold it, as far as the clients know.
    pub fn held_count(&self) -> usize {
        self.group.held_count()
    }

    /// How long the lock is valid yet: the majority's lease left, less the drift.
    pub fn validity(&self) -> Duration {
        self.group.validity()
    }

    /// Whether a majority still holds it within its validity.
    pub fn is_held(&self) -> bool {
        self.group.is_held()
    }

    /// Why it was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.group.lost_reason()
    }

    /// Completes when more servers lost it than the majority can spare. Cancel safe.
    pub async fn lost(&self) -> LostReason {
        self.group.lost().await
    }

    /// Calls `f` once when it is lost (at once if it already was).
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        self.group.on_lost(f)
    }

    /// Releases it on every server that granted it; `Ok(n)` when a majority released.
    ///
    /// # Errors
    /// The first error when fewer than a majority released.
    pub async fn release(self) -> Result<usize> {
        let need = self.group.quorum;
        match self.group.release().await {
            (n, _) if n >= need => Ok(n),
            (_, Some(e)) => Err(e),
            (_, None) => Err(Error::UnexpectedReply("no server released".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_allows_redis_redlock_drift() {
        // Table: lease -> 1 % + 2 ms.
        for (lease, drift) in [(10_000, 102), (30_000, 302), (1_000, 12), (100, 3)] {
            assert_eq!(
                redlock_drift(Duration::from_millis(lease)),
                Duration::from_millis(drift),
                "{lease}"
            );
        }
    }

    #[test]
    fn it_fails_a_redlock_whose_validity_ran_out() {
        let lease = Duration::from_millis(1000);
        // Table: elapsed -> validity left (1000 - elapsed - 12).
        for (elapsed, left) in [
            (0, Some(988)),
            (500, Some(488)),
            (987, Some(1)),
            (988, None),
            (2000, None),
        ] {
            assert_eq!(
                redlock_validity(lease, Duration::from_millis(elapsed)),
                left.map(Duration::from_millis),
                "{elapsed}"
            );
        }
    }

    #[test]
    fn it_needs_a_strict_majority() {
        for (n, q) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)] {
            assert_eq!(quorum(n), q, "{n}");
        }
    }

    #[test]
    fn it_signals_the_loss_once_more_parts_are_lost_than_spared() {
        let s = Signal::new(1);
        let fired = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let f = fired.clone();
        lock_ignoring_poison(&s.state)
            .callbacks
            .push(Box::new(move |_| {
                f.fetch_add(1, Ordering::SeqCst);
            }));
        s.part_lost(LostReason::LeaseExpired);
        assert_eq!(fired.load(Ordering::SeqCst), 0, "one part can be spared");
        s.part_lost(LostReason::NotHeld);
        s.part_lost(LostReason::NotHeld);
        assert_eq!(fired.load(Ordering::SeqCst), 1, "fired once");
        assert_eq!(
            lock_ignoring_poison(&s.state).lost,
            Some(LostReason::NotHeld)
        );
    }

    #[test]
    fn it_prefers_not_held_when_summing_up_releases() {
        let (n, e) = tally([
            Ok(()),
            Err(Error::InvalidArgument("x")),
            Err(Error::NotHeld { key: "k".into() }),
            Err(Error::InvalidArgument("y")),
        ]);
        assert_eq!(n, 1);
        assert!(matches!(e, Some(Error::NotHeld { .. })), "{e:?}");
        assert!(matches!(tally::<()>([]), (0, None)));
    }
}
