//! What one lock handle knows about its lock, shared by its guards and the
//! renewal worker, and the lost-lock signal built on it. No I/O here.
//!
//! A handle's life is cut into *epochs*: an epoch starts with an acquire made while
//! the handle held nothing (or had lost the lock) and ends when the hold count
//! returns to zero or the lock is found lost. A guard remembers its epoch, so a
//! guard from a lost epoch can never release or count as holding a lock that the
//! same handle took again later.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// Why a held lock was lost.
///
/// ```
/// use rlock_client::LostReason;
/// assert_ne!(LostReason::NotHeld, LostReason::LeaseExpired);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The server said this owner no longer holds it (RENEW answered 0, or RELEASE
    /// nil): it expired, was force-released, or the key was deleted or overwritten.
    NotHeld,
    /// Renewals failed (transiently) until the lease must have run out, or a fixed
    /// lease ran out while the guard was still alive.
    LeaseExpired,
}

type Callback = Box<dyn FnOnce(LostReason) + Send + 'static>;

/// Makes owner ids `<client uuid v4>:<n>`, Redisson's `<uuid>:<thread id>` shape.
#[derive(Debug)]
pub(crate) struct OwnerIds {
    client_id: String,
    next: AtomicU64,
    next_handle: AtomicU64,
}

impl OwnerIds {
    pub(crate) fn new() -> Self {
        OwnerIds {
            client_id: uuid::Uuid::new_v4().to_string(),
            next: AtomicU64::new(1),
            next_handle: AtomicU64::new(1),
        }
    }

    pub(crate) fn client_id(&self) -> &str {
        &self.client_id
    }

    /// A new owner id, never handed out before by this client.
    pub(crate) fn next_owner(&self) -> String {
        format!(
            "{}:{}",
            self.client_id,
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// A new number for a handle (the renewal registry's key).
    pub(crate) fn next_handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }
}

#[derive(Default)]
struct Inner {
    epoch: u64,
    holds: u64,
    lost: Option<LostReason>,
    /// Set once the loss's callbacks have run: waiters wake only then, so that a
    /// callback has always run by the time `wait_lost` or `lost()` returns.
    announced: bool,
    /// The last epoch that ended lost, and why: what its stale guards report.
    last_lost: Option<(u64, LostReason)>,
    /// When the lease must have run out, by the client's clock: the send time of the
    /// last confirmed acquire or renewal plus the lease. The server applied it
    /// later than that, so the real expiry is never earlier.
    deadline: Option<Instant>,
    wakers: Vec<Waker>,
    callbacks: Vec<Callback>,
}

/// One handle's lock state.
pub(crate) struct LockShared {
    pub(crate) key: String,
    /// `Some("READ" | "WRITE")`: this handle is one side of a read-write lock, whose
    /// commands are `RRWLOCK.*` with the side after the key (clients/rust/src/rwlock.rs).
    pub(crate) side: Option<&'static str>,
    pub(crate) owner: String,
    pub(crate) handle: u64,
    inner: Mutex<Inner>,
    cond: Condvar,
    contention: Contention,
}

impl std::fmt::Debug for LockShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockShared")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

/// How long a handle's acquires go straight to waiting after one found its lock held
/// ([`Contention::tries_first`]): a contended loop acquires far more often than this.
pub(crate) const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// What a handle's acquires found lately, so that a waiting acquire knows whether to
/// ask without waiting first, on the quick path (for the blocking API, the calling
/// thread's own connection), and queue only if the lock or the permits are taken. An
/// uncontended lock then costs one round trip on the caller's thread, not a wait's
/// hand-off between threads; a contended one does not pay a try that fails before
/// every wait.
#[derive(Debug, Default)]
pub(crate) struct Contention {
    /// When an acquire last found it taken.
    at: Mutex<Option<Instant>>,
}

impl Contention {
    /// True unless an acquire found it taken within [`CONTENDED_FOR`].
    pub(crate) fn tries_first(&self, now: Instant) -> bool {
        let at = *self.at.lock().unwrap_or_else(|p| p.into_inner());
        at.is_none_or(|t| now.saturating_duration_since(t) >= CONTENDED_FOR)
    }

    /// What an acquire found: taken by another (`held`, at `now`), or free.
    pub(crate) fn found(&self, held: bool, now: Instant) {
        *self.at.lock().unwrap_or_else(|p| p.into_inner()) = held.then_some(now);
    }
}

/// What an acquire starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Start {
    pub(crate) epoch: u64,
    /// The hold count this handle has in that epoch (0 = a fresh acquire).
    pub(crate) holds: u64,
}

impl LockShared {
    pub(crate) fn new(key: String, owner: String, handle: u64) -> Self {
        Self::with_side(key, None, owner, handle)
    }

    /// A handle on one side of a read-write lock (`side`: `READ` or `WRITE`).
    pub(crate) fn with_side(
        key: String,
        side: Option<&'static str>,
        owner: String,
        handle: u64,
    ) -> Self {
        LockShared {
            key,
            side,
            owner,
            handle,
            inner: Mutex::new(Inner::default()),
            cond: Condvar::new(),
            contention: Contention::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panicking callback cannot leave Inner half-updated (callbacks run outside
        // the lock), so a poisoned mutex still holds consistent state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a waiting acquire should first ask without waiting ([`Contention`]).
    pub(crate) fn tries_first(&self, now: Instant) -> bool {
        self.contention.tries_first(now)
    }

    /// What an acquire found ([`Contention::found`]).
    pub(crate) fn found(&self, held: bool, now: Instant) {
        self.contention.found(held, now);
    }

    /// The epoch and count an acquire starts from; opens a new epoch when the handle
    /// holds nothing or has lost the lock.
    pub(crate) fn begin_acquire(&self) -> Start {
        let mut g = self.lock();
        let expired = g.deadline.is_some_and(|d| Instant::now() >= d);
        if g.holds == 0 || g.lost.is_some() || expired {
            if g.holds > 0 && g.lost.is_none() {
                g.last_lost = Some((g.epoch, LostReason::LeaseExpired));
            }
            g.epoch += 1;
            g.holds = 0;
            g.lost = None;
            g.announced = false;
            g.deadline = None;
            g.callbacks.clear();
            // Wakers of the old epoch must see it end; they re-check and stay pending
            // only if their own epoch is still current, which it is not.
            for w in g.wakers.drain(..) {
                w.wake();
            }
            self.cond.notify_all();
        }
        Start {
            epoch: g.epoch,
            holds: g.holds,
        }
    }

    /// Records a successful acquire in `epoch`, sent at `sent_at` with `lease`.
    /// Returns the new hold count (1 = the handle must be registered for renewal).
    pub(crate) fn acquired(&self, epoch: u64, sent_at: Instant, lease: Duration) -> u64 {
        let mut g = self.lock();
        if g.epoch != epoch {
            // Cannot happen with one operation at a time per handle; count it anyway.
            return g.holds;
        }
        g.holds += 1;
        let d = sent_at + lease;
        g.deadline = Some(g.deadline.map_or(d, |old| old.max(d)));
        g.holds
    }

    /// Whether `epoch` is current and not lost (the lease is not checked).
    pub(crate) fn current(&self, epoch: u64) -> Option<u64> {
        let g = self.lock();
        (g.epoch == epoch && g.lost.is_none() && g.holds > 0).then_some(g.holds)
    }

    /// The current epoch's hold count, 0 when lost or not held.
    pub(crate) fn local_holds(&self) -> u64 {
        let g = self.lock();
        if Self::reason_locked(&g, g.epoch).is_some() {
            0
        } else {
            g.holds
        }
    }

    /// Records a release in `epoch` that the server acknowledged.
    pub(crate) fn released(&self, epoch: u64, freed: bool) {
        let mut g = self.lock();
        if g.epoch != epoch {
            return;
        }
        g.holds = if freed { 0 } else { g.holds.saturating_sub(1) };
        if g.holds == 0 {
            // The epoch ended normally: nobody is left to tell, and an old callback
            // must not fire for a later epoch.
            g.callbacks.clear();
            g.deadline = None;
            for w in g.wakers.drain(..) {
                w.wake();
            }
            self.cond.notify_all();
        }
    }

    /// When the lease of `epoch` must have run out, if it is current and not lost.
    pub(crate) fn deadline(&self, epoch: u64) -> Option<Instant> {
        let g = self.lock();
        if g.epoch == epoch && g.lost.is_none() && g.holds > 0 {
            g.deadline
        } else {
            None
        }
    }

    /// Moves the lease deadline after a confirmed renewal.
    pub(crate) fn renewed(&self, epoch: u64, deadline: Instant) {
        let mut g = self.lock();
        if g.epoch == epoch && g.lost.is_none() {
            g.deadline = Some(g.deadline.map_or(deadline, |old| old.max(deadline)));
        }
    }

    /// Marks `epoch` lost and tells everyone waiting for it; false if it was over.
    pub(crate) fn mark_lost(&self, epoch: u64, reason: LostReason) -> bool {
        let callbacks = {
            let mut g = self.lock();
            if g.epoch != epoch || g.holds == 0 || g.lost.is_some() {
                return false;
            }
            g.lost = Some(reason);
            g.last_lost = Some((epoch, reason));
            std::mem::take(&mut g.callbacks)
        };
        // Outside the lock: a callback may call back into the guard.
        for cb in callbacks {
            cb(reason);
        }
        let wakers = {
            let mut g = self.lock();
            g.announced = true;
            std::mem::take(&mut g.wakers)
        };
        for w in wakers {
            w.wake();
        }
        self.cond.notify_all();
        true
    }

    /// Whether a waiter of `epoch` may return `reason_locked`'s answer yet: not while
    /// a loss is recorded but its callbacks are still running.
    fn settled(g: &Inner, epoch: u64) -> bool {
        g.epoch != epoch || g.lost.is_none() || g.announced
    }

    /// Why `epoch` was lost, if it was (a lease past its deadline counts).
    pub(crate) fn lost_reason(&self, epoch: u64) -> Option<LostReason> {
        let g = self.lock();
        Self::reason_locked(&g, epoch)
    }

    fn reason_locked(g: &Inner, epoch: u64) -> Option<LostReason> {
        if g.epoch == epoch {
            if let Some(r) = g.lost {
                return Some(r);
            }
            if g.holds > 0 && g.deadline.is_some_and(|d| Instant::now() >= d) {
                return Some(LostReason::LeaseExpired);
            }
            return None;
        }
        // A later epoch exists, so this one ended; a live guard of it means it was lost.
        Some(match g.last_lost {
            Some((e, r)) if e == epoch => r,
            _ => LostReason::NotHeld,
        })
    }

    /// Whether `epoch` still holds the lock as far as this client knows.
    pub(crate) fn is_held(&self, epoch: u64) -> bool {
        let g = self.lock();
        g.epoch == epoch && g.holds > 0 && Self::reason_locked(&g, epoch).is_none()
    }

    /// Blocks until `epoch` is lost or `timeout` passes (None: no limit).
    pub(crate) fn wait_lost(&self, epoch: u64, timeout: Option<Duration>) -> Option<LostReason> {
        let until = timeout.map(|t| Instant::now() + t);
        let mut g = self.lock();
        loop {
            let settled = Self::settled(&g, epoch);
            if let Some(r) = Self::reason_locked(&g, epoch).filter(|_| settled) {
                return Some(r);
            }
            if settled && (g.epoch != epoch || g.holds == 0) {
                // Released normally: it will never be lost.
                return None;
            }
            // Wake at the lease deadline too: a lapsed fixed lease is a loss even if
            // nobody signals it (unless the loss is being announced right now).
            let mut wake = if settled { g.deadline } else { None };
            if let Some(u) = until {
                wake = Some(wake.map_or(u, |w| w.min(u)));
            }
            g = match wake {
                Some(w) => {
                    let now = Instant::now();
                    if until.is_some_and(|u| now >= u) {
                        return None;
                    }
                    self.cond
                        .wait_timeout(g, w.saturating_duration_since(now))
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                None => self.cond.wait(g).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }

    /// Registers `f` to run once when `epoch` is lost; runs it now if it already was.
    pub(crate) fn on_lost(&self, epoch: u64, f: Callback) {
        let now = {
            let mut g = self.lock();
            match Self::reason_locked(&g, epoch) {
                Some(r) => Some(r),
                None if g.epoch == epoch && g.holds > 0 => {
                    g.callbacks.push(f);
                    return;
                }
                None => return,
            }
        };
        if let Some(r) = now {
            f(r);
        }
    }

    fn poll_lost(&self, epoch: u64, cx: &mut Context<'_>) -> Poll<Option<LostReason>> {
        let mut g = self.lock();
        if Self::settled(&g, epoch) {
            if let Some(r) = Self::reason_locked(&g, epoch) {
                return Poll::Ready(Some(r));
            }
            if g.epoch != epoch || g.holds == 0 {
                return Poll::Ready(None);
            }
        }
        if !g.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            g.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// A future that completes when a guard's lock is lost; see
/// [`LockGuard::lost`](crate::LockGuard::lost).
///
/// It does not depend on any runtime. It resolves to `Some(reason)` when the lock is
/// lost and to `None` if the lock is released normally by another guard of the same
/// handle; it stays pending while the lock is held.
///
/// A fixed-lease lock that runs out is reported by the client's renewal worker, at
/// the lease's deadline.
#[must_use = "futures do nothing unless awaited"]
pub struct Lost<'a> {
    pub(crate) shared: &'a LockShared,
    pub(crate) epoch: u64,
}

impl std::fmt::Debug for Lost<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lost")
            .field("key", &self.shared.key)
            .finish()
    }
}

impl Future for Lost<'_> {
    type Output = Option<LostReason>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.shared.poll_lost(self.epoch, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    fn shared() -> LockShared {
        LockShared::new("k".into(), "c:1".into(), 1)
    }

    const LONG: Duration = Duration::from_secs(60);

    /// A handle holding its lock once, with a long lease, and the epoch it holds.
    fn held() -> (LockShared, u64) {
        let s = shared();
        let a = s.begin_acquire();
        s.acquired(a.epoch, Instant::now(), LONG);
        (s, a.epoch)
    }

    /// A callback that counts its calls in `n`.
    fn counting(n: &Arc<AtomicUsize>) -> Callback {
        let n = n.clone();
        Box::new(move |_| {
            n.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[test]
    fn it_makes_owner_ids_from_one_uuid_and_a_counter() {
        let ids = OwnerIds::new();
        let a = ids.next_owner();
        let b = ids.next_owner();
        assert_ne!(a, b);
        let (uuid_a, n_a) = a.rsplit_once(':').unwrap();
        let (uuid_b, _) = b.rsplit_once(':').unwrap();
        assert_eq!(uuid_a, uuid_b);
        assert_eq!(uuid_a, ids.client_id());
        assert_eq!(uuid::Uuid::parse_str(uuid_a).unwrap().get_version_num(), 4);
        assert_eq!(n_a, "1");
        assert!(b.ends_with(":2"), "{b}");
        assert_ne!(OwnerIds::new().client_id(), ids.client_id());
    }

    #[test]
    fn it_counts_reentries_within_one_epoch() {
        let s = shared();
        let a = s.begin_acquire();
        assert_eq!(a.holds, 0);
        assert_eq!(s.acquired(a.epoch, Instant::now(), LONG), 1);
        let b = s.begin_acquire();
        assert_eq!(
            b,
            Start {
                epoch: a.epoch,
                holds: 1
            }
        );
        assert_eq!(s.acquired(b.epoch, Instant::now(), LONG), 2);
        s.released(a.epoch, false);
        assert!(s.is_held(a.epoch));
        s.released(a.epoch, true);
        assert!(!s.is_held(a.epoch));
        assert_eq!(s.wait_lost(a.epoch, Some(Duration::ZERO)), None);
    }

    #[test]
    fn it_opens_a_new_epoch_after_a_loss() {
        let (s, epoch) = held();
        assert!(s.mark_lost(epoch, LostReason::NotHeld));
        assert!(!s.mark_lost(epoch, LostReason::NotHeld), "reported twice");
        let b = s.begin_acquire();
        assert_ne!(epoch, b.epoch);
        assert_eq!(b.holds, 0);
        s.acquired(b.epoch, Instant::now(), LONG);
        // The stale guard still reads lost, the new one held.
        assert_eq!(s.lost_reason(epoch), Some(LostReason::NotHeld));
        assert!(s.is_held(b.epoch));
        assert!(s.current(epoch).is_none());
    }

    #[test]
    fn it_runs_callbacks_once_and_at_once_when_already_lost() {
        let (s, epoch) = held();
        let n = Arc::new(AtomicUsize::new(0));
        s.on_lost(epoch, counting(&n));
        s.mark_lost(epoch, LostReason::LeaseExpired);
        s.mark_lost(epoch, LostReason::LeaseExpired);
        assert_eq!(n.load(Ordering::SeqCst), 1);
        let n3 = n.clone();
        s.on_lost(
            epoch,
            Box::new(move |r| {
                assert_eq!(r, LostReason::LeaseExpired);
                n3.fetch_add(1, Ordering::SeqCst);
            }),
        );
        assert_eq!(n.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn it_drops_callbacks_of_an_epoch_released_normally() {
        let (s, epoch) = held();
        let n = Arc::new(AtomicUsize::new(0));
        s.on_lost(epoch, counting(&n));
        s.released(epoch, true);
        let b = s.begin_acquire();
        s.acquired(b.epoch, Instant::now(), LONG);
        s.mark_lost(b.epoch, LostReason::NotHeld);
        assert_eq!(n.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn it_reads_a_lapsed_lease_as_lost() {
        let s = shared();
        let a = s.begin_acquire();
        s.acquired(a.epoch, Instant::now(), Duration::from_millis(30));
        assert!(s.is_held(a.epoch));
        // wait_lost wakes at the deadline by itself; the bound keeps a bug from hanging.
        let got = s.wait_lost(a.epoch, Some(Duration::from_secs(10)));
        assert_eq!(got, Some(LostReason::LeaseExpired));
        assert!(!s.is_held(a.epoch));
    }

    #[test]
    fn it_wakes_a_blocked_waiter_when_lost() {
        let (s, epoch) = held();
        let s = Arc::new(s);
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.wait_lost(epoch, Some(Duration::from_secs(30))));
        // Until the waiter is parked, mark_lost may run first; both orders must work.
        s.mark_lost(epoch, LostReason::NotHeld);
        assert_eq!(t.join().unwrap(), Some(LostReason::NotHeld));
    }

    #[test]
    fn it_runs_callbacks_before_waking_waiters() {
        let (s, epoch) = held();
        let s = Arc::new(s);
        let ran = Arc::new(AtomicUsize::new(0));
        let r2 = ran.clone();
        s.on_lost(
            epoch,
            Box::new(move |_| {
                std::thread::sleep(Duration::from_millis(50));
                r2.fetch_add(1, Ordering::SeqCst);
            }),
        );
        let (s2, r3) = (s.clone(), ran.clone());
        let t = std::thread::spawn(move || {
            let got = s2.wait_lost(epoch, Some(Duration::from_secs(30)));
            (got, r3.load(Ordering::SeqCst))
        });
        s.mark_lost(epoch, LostReason::NotHeld);
        assert_eq!(t.join().unwrap(), (Some(LostReason::NotHeld), 1));
        assert!(!s.is_held(epoch));
    }

    #[test]
    fn it_resolves_the_lost_future_without_a_runtime() {
        use std::task::Wake;
        struct Flag(AtomicUsize);
        impl Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let (s, epoch) = held();
        let flag = Arc::new(Flag(AtomicUsize::new(0)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut fut = Lost { shared: &s, epoch };
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
        s.mark_lost(epoch, LostReason::NotHeld);
        assert_eq!(flag.0.load(Ordering::SeqCst), 1);
        assert_eq!(
            Pin::new(&mut fut).poll(&mut cx),
            Poll::Ready(Some(LostReason::NotHeld))
        );
    }
}
