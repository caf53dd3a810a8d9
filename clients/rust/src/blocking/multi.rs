//! Locks made of several locks, on one server or on several independent ones:
//! [`MultiLock`] (all of them, or none) and [`RedLock`] (a majority, within a
//! validity time), as Redisson's `RedissonMultiLock` and `RedissonRedLock`.
//!
//! Each part is an ordinary [`Lock`] of its own [`Client`](crate::Client): it waits,
//! retries and is renewed by that client's watchdog as usual. The combined guard
//! holds the parts' guards and reports the whole lost when too many parts are lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::blocking::{Lock, LockGuard};
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
/// than it can spare.
struct Signal {
    state: Mutex<SignalState>,
    cond: Condvar,
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
    }
}

/// What a combined guard holds: the parts' guards and how many of them it needs.
struct Group {
    guards: Vec<LockGuard>,
    quorum: usize,
    drift: Duration,
    signal: Arc<Signal>,
}

impl Group {
    fn new(guards: Vec<LockGuard>, quorum: usize, drift: Duration) -> Group {
        let signal = Arc::new(Signal {
            state: Mutex::new(SignalState {
                spare: guards.len().saturating_sub(quorum),
                lost_parts: 0,
                lost: None,
                callbacks: Vec::new(),
            }),
            cond: Condvar::new(),
        });
        for g in &guards {
            let s = signal.clone();
            g.on_lost(move |why| s.part_lost(why));
        }
        Group {
            guards,
            quorum,
            drift,
            signal,
        }
    }

    fn held_count(&self) -> usize {
        self.guards.iter().filter(|g| g.is_held()).count()
    }

    /// The quorum-th latest lease deadline among the parts still held, less the drift.
    fn validity(&self) -> Duration {
        let mut deadlines: Vec<Instant> = self.guards.iter().filter_map(|g| g.deadline()).collect();
        if deadlines.len() < self.quorum || self.quorum == 0 {
            return Duration::ZERO;
        }
        deadlines.sort_unstable_by(|a, b| b.cmp(a));
        let until = deadlines[self.quorum - 1];
        until
            .saturating_duration_since(Instant::now())
            .saturating_sub(self.drift)
    }

    fn is_held(&self) -> bool {
        self.held_count() >= self.quorum && !self.validity().is_zero()
    }

    fn lost_reason(&self) -> Option<LostReason> {
        if let Some(why) = lock_ignoring_poison(&self.signal.state).lost {
            return Some(why);
        }
        (!self.is_held()).then_some(LostReason::LeaseExpired)
    }

    fn wait_lost(&self, timeout: Option<Duration>) -> Option<LostReason> {
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

    fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
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

    /// Releases every part; how many were released, and the errors of the others
    /// (a lost part's [`Error::NotHeld`] first).
    fn release(self) -> (usize, Option<Error>) {
        let mut released = 0;
        let mut first: Option<Error> = None;
        for g in self.guards {
            match g.release() {
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
}

/// Releases guards taken by a round that failed, ignoring the outcome: each one that
/// cannot be released expires with its lease.
fn give_back(guards: Vec<LockGuard>) {
    for g in guards {
        let _ = g.release();
    }
}

/// Several locks taken together, all or none (Redisson's `RedissonMultiLock`).
///
/// The locks may live on one server or on several, through one client or several.
/// They are taken one after another in the order given, each waiting at most what is
/// left of the wait limit; when one cannot be had (held past the limit, or an error),
/// those already taken are released and the acquire fails. Each lock is renewed by its
/// own client's watchdog; the guard counts as lost as soon as any lock is lost.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use rlock_client::{Client, MultiLock};
///
/// # fn main() -> rlock_client::Result<()> {
/// let a = Client::open("redis://10.0.0.1/")?;
/// let b = Client::open("redis://10.0.0.2/")?;
/// let both = MultiLock::new([a.lock("account:1"), b.lock("account:2")]);
/// if let Some(guard) = both.acquire_timeout(Duration::from_secs(2))? {
///     // ... move money between the two accounts ...
///     guard.release()?;
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

    /// Takes all the locks, waiting as long as it takes; watchdog leases.
    ///
    /// Waits in rounds of 1.5 s per lock: a round that cannot take them all gives
    /// back what it took and starts again after a short random pause.
    pub fn acquire(&self) -> Result<MultiGuard> {
        taken(
            self.acquire_with(AcquireOptions::new())?,
            "a wait without limit ended",
        )
    }

    /// Takes all the locks if each is free (or already ours); never waits.
    pub fn try_acquire(&self) -> Result<Option<MultiGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::No))
    }

    /// Takes all the locks, waiting at most `wait` in all.
    pub fn acquire_timeout(&self, wait: Duration) -> Result<Option<MultiGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::Up(wait)))
    }

    /// Takes all the locks with explicit options; `opts.wait()` bounds the whole.
    ///
    /// # Errors
    /// The first error of a part (after that part's own retries); the locks taken
    /// before it have been released. [`Error::InvalidArgument`] with no locks.
    pub fn acquire_with(&self, opts: AcquireOptions) -> Result<Option<MultiGuard>> {
        if self.locks.is_empty() {
            return Err(Error::InvalidArgument(
                "a MultiLock needs at least one lock",
            ));
        }
        if opts.wait != Wait::Forever {
            return self.round(opts);
        }
        let per_round =
            MULTI_ROUND_WAIT_PER_LOCK * u32::try_from(self.locks.len()).unwrap_or(u32::MAX);
        loop {
            if let Some(g) = self.round(opts.with_wait(Wait::Up(per_round)))? {
                return Ok(Some(g));
            }
            thread::sleep(self.jitter.up_to(ROUND_PAUSE));
        }
    }

    fn round(&self, opts: AcquireOptions) -> Result<Option<MultiGuard>> {
        let until = opts.wait_until(Instant::now());
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let wait = match until {
                Some(u) => Wait::Up(u.saturating_duration_since(Instant::now())),
                None => opts.wait,
            };
            match lock.acquire_with(opts.with_wait(wait)) {
                Ok(Some(g)) => guards.push(g),
                Ok(None) => {
                    give_back(guards);
                    return Ok(None);
                }
                Err(e) => {
                    give_back(guards);
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

/// All the locks of a [`MultiLock`], held.
///
/// # Drop
/// Dropping it drops every part's guard: each stops its renewal and releases
/// best-effort (see [`LockGuard`]'s `# Drop`).
///
/// # Examples
///
/// ```no_run
/// # use rlock_client::{Client, MultiLock};
/// # let c = Client::open("redis://127.0.0.1/")?;
/// let guard = MultiLock::new([c.lock("a"), c.lock("b")]).acquire()?;
/// guard.on_lost(|why| eprintln!("one of the locks was lost: {why:?}"));
/// assert!(guard.is_held());
/// guard.release()?;
/// # Ok::<_, rlock_client::Error>(())
/// ```
#[must_use = "dropping the guard releases the locks at once"]
pub struct MultiGuard {
    group: Group,
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("locks", &self.group.guards)
            .finish()
    }
}

impl MultiGuard {
    /// The parts' guards, in the order the locks were given.
    pub fn guards(&self) -> &[LockGuard] {
        &self.group.guards
    }

    /// Whether every lock is still held, as far as the clients know.
    pub fn is_held(&self) -> bool {
        self.group.is_held()
    }

    /// Why the whole was lost (the reason of the first lock lost), if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.group.lost_reason()
    }

    /// Blocks until a lock is lost (`Some(reason)`) or `timeout` passes (`None`).
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<LostReason> {
        self.group.wait_lost(timeout)
    }

    /// Calls `f` once when the first lock is lost, or at once if one already was.
    /// It runs on the thread that finds the loss; keep it short.
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        self.group.on_lost(f)
    }

    /// Releases every lock.
    ///
    /// # Errors
    /// After trying them all: [`Error::NotHeld`] if some lock was no longer held (the
    /// critical section ran partly unprotected), else the first other error.
    pub fn release(self) -> Result<()> {
        match self.group.release() {
            (_, None) => Ok(()),
            (_, Some(e)) => Err(e),
        }
    }
}

/// A lock on N independent servers, held when a majority of them grant it within
/// its validity time: Redis's Redlock algorithm (Redisson's `RedissonRedLock`).
///
/// Give it one [`Lock`] per server, each from a [`Client`](crate::Client) of that
/// server. An acquire asks all servers at once, each without waiting in the server,
/// and waits at most the *server timeout* (default
/// [`DEFAULT_SERVER_TIMEOUT`](Self::DEFAULT_SERVER_TIMEOUT)) for their answers; a
/// server that answers later counts as refused, and what it grants is released. It
/// succeeds when at least `N / 2 + 1` servers granted the lock and the validity
/// `lease - elapsed - drift` (drift = 1 % of the lease + 2 ms, [`redlock_drift`]) is
/// still positive; otherwise it releases every part and tries again after a random
/// pause, until its wait limit.
///
/// With the watchdog (no fixed lease) each part is renewed by its own client, and the
/// guard stays held while a majority is: one server dying does not lose it.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use rlock_client::{AcquireOptions, Client, RedLock};
///
/// # fn main() -> rlock_client::Result<()> {
/// let servers = ["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"];
/// let clients = servers.iter().map(|u| Client::open(*u)).collect::<Result<Vec<_>, _>>()?;
/// let lock = RedLock::new(clients.iter().map(|c| c.lock("payments")));
/// let opts = AcquireOptions::new().with_lease(Duration::from_secs(10));
/// if let Some(guard) = lock.acquire_with(opts)? {
///     // The work must end within guard.validity().
///     println!("valid for {:?}", guard.validity());
///     guard.release()?;
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedLock {
    locks: Vec<Lock>,
    /// One flag per part: an attempt still running there (a straggler of an earlier
    /// round), so that two operations never run on one handle at once.
    busy: Vec<Arc<AtomicBool>>,
    server_timeout: Duration,
    jitter: Jitter,
}

/// Clears a part's busy flag when its attempt is over, whatever happened.
struct NotBusy(Arc<AtomicBool>);

impl Drop for NotBusy {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

impl RedLock {
    /// How long an acquire waits for each server's answer.
    pub const DEFAULT_SERVER_TIMEOUT: Duration = Duration::from_millis(250);

    /// A RedLock over `locks`, one per independent server.
    pub fn new(locks: impl IntoIterator<Item = Lock>) -> RedLock {
        let locks: Vec<Lock> = locks.into_iter().collect();
        RedLock {
            busy: locks.iter().map(|_| Arc::default()).collect(),
            locks,
            server_timeout: Self::DEFAULT_SERVER_TIMEOUT,
            jitter: Jitter::new(),
        }
    }

    /// How long an acquire waits for each server's answer: small next to the lease,
    /// so that a dead server costs little of the validity.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let c = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// let lock = rlock_client::RedLock::new([c.lock("k")])
    ///     .with_server_timeout(Duration::from_millis(50));
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn with_server_timeout(mut self, d: Duration) -> RedLock {
        self.server_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// The locks, one per server.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// Servers that must grant the lock: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum(self.locks.len())
    }

    /// Takes the lock, trying again for as long as it takes; watchdog leases.
    pub fn acquire(&self) -> Result<RedLockGuard> {
        taken(
            self.acquire_with(AcquireOptions::new())?,
            "a wait without limit ended",
        )
    }

    /// One attempt: `None` if no majority granted it in time.
    pub fn try_acquire(&self) -> Result<Option<RedLockGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::No))
    }

    /// Attempts until one succeeds or `wait` has passed.
    pub fn acquire_timeout(&self, wait: Duration) -> Result<Option<RedLockGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::Up(wait)))
    }

    /// Takes the lock with explicit options: `opts.wait()` bounds the attempts (each
    /// server is asked without waiting in the server), `opts.lease()` fixes the lease.
    ///
    /// # Errors
    /// When more servers failed with an error than the majority can spare, the first
    /// of those errors (whatever was granted has been released).
    /// [`Error::InvalidArgument`] with no locks or a zero lease.
    pub fn acquire_with(&self, opts: AcquireOptions) -> Result<Option<RedLockGuard>> {
        if self.locks.is_empty() {
            return Err(Error::InvalidArgument("a RedLock needs at least one lock"));
        }
        if opts.lease.is_some_and(|l| l.is_zero()) {
            return Err(Error::InvalidArgument("lease must be positive"));
        }
        let until = opts.wait_until(Instant::now());
        loop {
            if let Some(g) = self.round(opts)? {
                return Ok(Some(g));
            }
            let pause = self.jitter.up_to(ROUND_PAUSE);
            match (opts.wait, until) {
                (Wait::No, _) => return Ok(None),
                (_, Some(u)) if Instant::now() + pause >= u => return Ok(None),
                _ => thread::sleep(pause),
            }
        }
    }

    fn round(&self, opts: AcquireOptions) -> Result<Option<RedLockGuard>> {
        let lease = self
            .locks
            .iter()
            .map(|l| l.lease_for(&opts))
            .min()
            .expect("at least one lock");
        let part_opts = opts.with_wait(Wait::No);
        let start = Instant::now();
        let (tx, rx) = mpsc::channel::<Result<Option<LockGuard>>>();
        let mut asked = 0;
        for (lock, busy) in self.locks.iter().zip(&self.busy) {
            if busy.swap(true, Ordering::SeqCst) {
                continue; // still busy with an earlier round: counts as refused
            }
            let (lock, tx, not_busy) = (lock.same_handle(), tx.clone(), NotBusy(busy.clone()));
            let spawned = thread::Builder::new()
                .name("rlock-redlock".into())
                .spawn(move || {
                    let r = lock.acquire_with(part_opts);
                    // If the round gave up on this server, the guard comes back in
                    // the error and is dropped here, which releases it; only then is
                    // the handle free for the next round.
                    drop(tx.send(r));
                    drop(not_busy);
                });
            if spawned.is_ok() {
                asked += 1;
            }
        }
        drop(tx);
        let deadline = start + self.server_timeout;
        let mut granted = Vec::new();
        let mut errors = Vec::new();
        for _ in 0..asked {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(Ok(Some(g))) => granted.push(g),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => errors.push(e),
                Err(_) => break,
            }
        }
        // Answers still on their way are released by their threads (or here, if one
        // is already queued in the channel).
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
        give_back(granted);
        if errors.len() > n - need {
            return Err(errors.swap_remove(0));
        }
        Ok(None)
    }
}

/// A [`RedLock`] held by a majority of its servers.
///
/// # Drop
/// Dropping it drops every part's guard: each stops its renewal and releases
/// best-effort (see [`LockGuard`]'s `# Drop`).
///
/// # Examples
///
/// ```no_run
/// # use rlock_client::{Client, RedLock};
/// # let cs: Vec<Client> = vec![];
/// let guard = RedLock::new(cs.iter().map(|c| c.lock("k"))).acquire()?;
/// guard.on_lost(|why| eprintln!("a majority was lost: {why:?}"));
/// assert!(guard.held_count() >= 2);
/// guard.release()?;
/// # Ok::<_, rlock_client::Error>(())
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct RedLockGuard {
    group: Group,
    servers: usize,
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

    /// Servers on which the lock is still held, as far as their clients know.
    pub fn held_count(&self) -> usize {
        self.group.held_count()
    }

    /// How long the lock is still valid: the lease left on the majority's servers,
    /// less the drift allowance (zero when lost). Renewals move it forward.
    pub fn validity(&self) -> Duration {
        self.group.validity()
    }

    /// Whether a majority still holds the lock within its validity.
    pub fn is_held(&self) -> bool {
        self.group.is_held()
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.group.lost_reason()
    }

    /// Blocks until the majority is lost (`Some(reason)`) or `timeout` passes.
    ///
    /// A server's loss is found by its client (a renewal answered 0, or its lease run
    /// out), so this reports at most the drift allowance after `validity()` reached 0.
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<LostReason> {
        self.group.wait_lost(timeout)
    }

    /// Calls `f` once when the majority is lost, or at once if it already was.
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        self.group.on_lost(f)
    }

    /// Releases the lock on every server that granted it; how many released it.
    ///
    /// # Errors
    /// When fewer than a majority could be released: [`Error::NotHeld`] if some
    /// server no longer held it (the work may have run unprotected), else the first
    /// other error. Servers that cannot be reached keep it until its lease runs out.
    pub fn release(self) -> Result<usize> {
        let need = self.group.quorum;
        match self.group.release() {
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
        let s = Signal {
            state: Mutex::new(SignalState {
                spare: 1,
                lost_parts: 0,
                lost: None,
                callbacks: Vec::new(),
            }),
            cond: Condvar::new(),
        };
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
}
