//! Script-side waiters' turns (design.md 1.8): a mixed fleet stays live. A child of
//! `engine`.
//!
//! Waiters that run Redisson's scripts (Redisson itself, rlock clients in scripts mode)
//! wait on the lock's pub/sub channel, not in the module's queue, and are woken only by an
//! unlock message or at the lease they were told. When the module frees a lock with its
//! own waiters queued it hands it over in the same turn and publishes nothing, so under
//! steady module contention such a waiter would never see the lock free. So, at most once
//! per `rlock.script-waiter-window-ms` for a key, a release that finds module waiters
//! queued looks at the lock's channel; if somebody other than the module listens there,
//! the module publishes the unlock message and leaves the lock free for
//! `rlock.script-waiter-grace-ms` (a *turn*) before the head of its queue gets it. During
//! a turn the module's own commands treat the lock as held (a new ACQUIRE is contended and
//! queues behind the waiters: FIFO among module waiters is kept), while a script that runs
//! then finds it free. The turn ends at its end (the queue's expiry timer, armed for it),
//! or earlier once the key changes under a script (its removal, or on Redis 7.0 any write
//! the server reports): a script took the lock, and the module serves its queue as after
//! any Redisson release.
//!
//!
//! A listener that never takes the lock (a monitoring `SUBSCRIBE`, a waiter that gave up
//! but stayed subscribed) would cost the lock a turn every window. So a turn nobody took
//! backs the key's looks off: after two unused turns in a row the window doubles with each
//! further one, up to [`MAX_BACKOFF`] times the window; a turn a script takes brings the
//! window back at once. A single missed turn (a waiter woken just too late) changes nothing.
//!
//! [`Turns`] is the bookkeeping, pure and unit-tested; the glue below it counts
//! subscribers, publishes and arms the timer.

use super::*;

/// When to look for script-side waiters and which locks are free for them now, per key.
/// No clock of its own: every call takes `now` (ms).
#[derive(Debug, Default)]
pub struct Turns {
    keys: HashMap<i32, HashMap<Box<[u8]>, Turn>>,
    /// The latest end of any turn: while `now` is past it no turn is open anywhere, and
    /// [`Turns::open_for`] answers without hashing the key (every ACQUIRE asks while
    /// anybody waits).
    latest_end: i64,
    /// Entries held; pruned once they reach `prune_at` (a key whose look is due and whose
    /// turn has ended is as good as absent).
    len: usize,
    /// [`PRUNE_AT`], or twice what the last prune kept: many keys released within one
    /// window are pruned in amortised constant time, not rescanned at every insert.
    prune_at: usize,
    /// Turns opened whose outcome (taken by a script or not) is not known yet: while
    /// none is, [`Turns::settle`] answers without hashing the key (every handoff asks).
    unsettled: usize,
}

#[derive(Debug, Clone, Copy)]
struct Turn {
    /// When the channel was last looked at.
    looked: i64,
    /// No look at the channel before this time.
    next_look: i64,
    /// The lock is left to scripts until this time (exclusive).
    end: i64,
    /// A turn was opened and whether a script took it is not known yet.
    open: bool,
    /// Turns in a row that nobody took.
    unused: u32,
}

impl Turn {
    /// The window between looks after `unused` turns nobody took: the window itself for
    /// none or one, then doubling, at most [`MAX_BACKOFF`] times it.
    fn window(&self, window: i64) -> i64 {
        let doublings = self
            .unused
            .saturating_sub(1)
            .min(MAX_BACKOFF.trailing_zeros());
        window.saturating_mul(1 << doublings)
    }
}

/// The most the window between looks grows for a key whose turns go unused: a listener
/// that never takes the lock then costs it one grace every `MAX_BACKOFF` windows, and a
/// script-side waiter that starts waiting then gets its turn within that many windows.
pub const MAX_BACKOFF: i64 = 16;

/// How many keys [`Turns`] remembers before it drops the ones that are as good as absent.
const PRUNE_AT: usize = 256;

impl Turns {
    /// A release with module waiters queued: is it time to look at the channel? If so,
    /// the next look is `window` ms from now, whatever the look finds (a look costs a
    /// subscriber count; with no script-side waiter that is its whole cost, once a window).
    pub fn look_due(&mut self, db: i32, key: &[u8], now: i64, window: i64) -> bool {
        if let Some(turn) = self.keys.get_mut(&db).and_then(|k| k.get_mut(key)) {
            if now < turn.next_look {
                return false;
            }
            turn.looked = now;
            turn.next_look = now + turn.window(window);
            return true;
        }
        if self.len >= self.prune_at.max(PRUNE_AT) {
            self.prune(now);
            self.prune_at = 2 * self.len;
        }
        let turn = Turn {
            looked: now,
            next_look: now + window,
            end: 0,
            open: false,
            unused: 0,
        };
        self.keys.entry(db).or_default().insert(key.into(), turn);
        self.len += 1;
        true
    }

    /// Opens a turn for scripts on `key` until `now + grace`; returns its end.
    pub fn open(&mut self, db: i32, key: &[u8], now: i64, grace: i64) -> i64 {
        let end = now + grace;
        if let Some(turn) = self.keys.get_mut(&db).and_then(|k| k.get_mut(key)) {
            turn.end = end;
            if !turn.open {
                turn.open = true;
                self.unsettled += 1;
            }
        }
        self.latest_end = self.latest_end.max(end);
        end
    }

    /// The outcome of `key`'s last turn, once known: `taken` by a script (the window comes
    /// back) or not (one more unused turn, which may back the next look off). Nothing when
    /// no turn awaits its outcome; no hashing while none anywhere does.
    pub fn settle(&mut self, db: i32, key: &[u8], taken: bool, window: i64) {
        if self.unsettled == 0 {
            return;
        }
        let Some(turn) = self.keys.get_mut(&db).and_then(|k| k.get_mut(key)) else {
            return;
        };
        if !turn.open {
            return;
        }
        turn.open = false;
        self.unsettled -= 1;
        turn.unused = if taken {
            0
        } else {
            turn.unused.saturating_add(1)
        };
        turn.next_look = turn.looked + turn.window(window);
    }

    /// The ms left of a turn open on `key` now, if one is.
    pub fn open_for(&self, db: i32, key: &[u8], now: i64) -> Option<i64> {
        if now >= self.latest_end {
            return None;
        }
        let turn = self.keys.get(&db)?.get(key)?;
        (now < turn.end).then(|| turn.end - now)
    }

    /// Ends the turn on `key` now (a script took the lock).
    pub fn close(&mut self, db: i32, key: &[u8], window: i64) {
        if let Some(turn) = self.keys.get_mut(&db).and_then(|k| k.get_mut(key)) {
            turn.end = 0;
        }
        self.settle(db, key, true, window);
    }

    /// Drops the keys whose look is due and whose turn has ended: absent, they answer the
    /// same.
    fn prune(&mut self, now: i64) {
        for keys in self.keys.values_mut() {
            keys.retain(|_, t| now < t.next_look || now < t.end || t.open);
        }
        self.keys.retain(|_, k| !k.is_empty());
        self.len = self.keys.values().map(HashMap::len).sum();
    }

    /// Keys remembered (for the tests).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

thread_local! {
    static TURNS: RefCell<Turns> = RefCell::new(Turns::default());
}

fn turns<R>(f: impl FnOnce(&mut Turns) -> R) -> R {
    TURNS.with(|t| f(&mut t.borrow_mut()))
}

/// The ms left of a script turn on `key`, if one is open: the module's own commands treat
/// the lock as held that long. One flag and a comparison while nobody waits anywhere.
pub fn turn_left(db: i32, key: &[u8], now: i64) -> Option<i64> {
    if !anyone_waits() {
        return None;
    }
    turns(|t| t.open_for(db, key, now))
}

/// Ends a turn early: the key changed under a script (it took the lock).
pub(super) fn end_turn(db: i32, key: &[u8]) {
    let window = crate::server::config::script_waiter_window_ms();
    turns(|t| t.close(db, key, window));
}

/// The queue of `key` is being served after a turn ended: the lock free means nobody took
/// the turn, held means a script did. One counter load while no turn awaits its outcome.
pub(super) fn settle_turn(db: i32, key: &[u8], taken: bool) {
    let window = crate::server::config::script_waiter_window_ms();
    turns(|t| t.settle(db, key, taken, window));
}

/// A lock with module waiters queued was just freed by a module command (RELEASE,
/// FORCERELEASE), before any handoff: opens a turn for script-side waiters if one is due
/// and somebody listens on `channel()` (the lock's unlock channel, made only then). True if it did: the
/// caller then publishes the unlock message and hands nothing over now; the queue's
/// timer serves the head when the turn ends.
pub fn open_script_turn(
    ctx: &Context,
    db: i32,
    key: &[u8],
    channel: impl FnOnce() -> Vec<u8>,
) -> bool {
    let grace = crate::server::config::script_waiter_grace_ms();
    if grace == 0 || !has_waiters(db, key) {
        return false;
    }
    let now = ffi::now_ms();
    let window = crate::server::config::script_waiter_window_ms();
    if !turns(|t| t.look_due(db, key, now, window)) {
        return false;
    }
    // The module itself never subscribes: every listener is a script-side waiter (or a
    // monitoring client, which costs one turn per window).
    let shard = ctx.get_flags().contains(ContextFlags::CLUSTER);
    if ffi::subscribers(ctx, &channel(), shard) == 0 {
        return false;
    }
    turns(|t| t.open(db, key, now, grace));
    stats::bump(|s| &s.script_turns);
    // The queue's expiry timer serves the head once the turn is over.
    note_expiry(ctx, db, key, grace);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000;
    const WINDOW: i64 = 50;
    const GRACE: i64 = 10;

    #[test]
    fn it_looks_once_per_window_per_key() {
        let mut t = Turns::default();
        // (ms after NOW, key, due?) in order
        let rows: &[(i64, &[u8], bool)] = &[
            (0, b"k", true),           // first release with waiters: look
            (1, b"k", false),          // within the window: no count
            (WINDOW - 1, b"k", false), // still within
            (WINDOW - 1, b"j", true),  // another key has its own window
            (WINDOW, b"k", true),      // the window has passed
            (WINDOW + 5, b"k", false),
        ];
        for &(at, key, due) in rows {
            assert_eq!(t.look_due(0, key, NOW + at, WINDOW), due, "{at} {key:?}");
        }
        assert!(t.look_due(1, b"k", NOW + 1, WINDOW), "dbs are apart");
    }

    #[test]
    fn it_leaves_the_lock_to_scripts_for_the_grace_only() {
        let mut t = Turns::default();
        assert_eq!(t.open_for(0, b"k", NOW), None, "no turn before one opens");
        assert!(t.look_due(0, b"k", NOW, WINDOW));
        assert_eq!(t.open(0, b"k", NOW, GRACE), NOW + GRACE);
        let rows: &[(i64, &[u8], Option<i64>)] = &[
            (0, b"k", Some(GRACE)),
            (GRACE - 1, b"k", Some(1)),
            (GRACE, b"k", None), // the end is exclusive: the timer finds it over
            (1, b"j", None),     // only that key
        ];
        for &(at, key, left) in rows {
            assert_eq!(t.open_for(0, key, NOW + at), left, "{at} {key:?}");
        }
        assert_eq!(t.open_for(1, b"k", NOW), None, "only that db");
    }

    #[test]
    fn it_ends_a_turn_early_when_a_script_took_the_lock() {
        let mut t = Turns::default();
        t.look_due(0, b"k", NOW, WINDOW);
        t.open(0, b"k", NOW, GRACE);
        t.close(0, b"k", WINDOW);
        assert_eq!(t.open_for(0, b"k", NOW + 1), None);
        assert!(
            !t.look_due(0, b"k", NOW + 2, WINDOW),
            "the window still holds"
        );
    }

    /// Opens a turn at `at` (the look due then) and settles it as `taken`.
    fn turn(t: &mut Turns, at: i64, taken: bool) {
        assert!(
            t.look_due(0, b"k", NOW + at, WINDOW),
            "a look is due at {at}"
        );
        t.open(0, b"k", NOW + at, GRACE);
        t.settle(0, b"k", taken, WINDOW);
    }

    /// The first time after `from` (ms after NOW) at which a look is due.
    fn next_due(t: &mut Turns, from: i64) -> i64 {
        let mut at = from;
        while at < from + 100 * WINDOW {
            if t.look_due(0, b"k", NOW + at, WINDOW) {
                return at;
            }
            at += 1;
        }
        panic!("no look due within 100 windows of {from}");
    }

    #[test]
    fn unused_turns_back_the_looks_off_and_a_taken_one_brings_the_window_back() {
        let mut t = Turns::default();
        turn(&mut t, 0, false);
        // One unused turn: the window as before.
        assert_eq!(next_due(&mut t, 1), WINDOW);
        t.open(0, b"k", NOW + WINDOW, GRACE);
        t.settle(0, b"k", false, WINDOW);
        // Two in a row: twice the window from that look; then 4, 8, 16 times, and no more.
        let mut at = WINDOW;
        for factor in [2, 4, 8, 16, 16, 16] {
            let due = next_due(&mut t, at + 1);
            assert_eq!(due - at, factor * WINDOW, "after the look at {at}");
            t.open(0, b"k", NOW + due, GRACE);
            t.settle(0, b"k", false, WINDOW);
            at = due;
        }
        // A script takes the next turn: the window at once.
        let due = next_due(&mut t, at + 1);
        t.open(0, b"k", NOW + due, GRACE);
        t.close(0, b"k", WINDOW);
        assert_eq!(next_due(&mut t, due + 1) - due, WINDOW);
    }

    #[test]
    fn settling_is_once_per_turn_and_free_when_nothing_awaits() {
        let mut t = Turns::default();
        t.settle(0, b"k", false, WINDOW); // nothing known of the key: nothing happens
        assert!(t.is_empty());
        turn(&mut t, 0, false);
        turn(&mut t, WINDOW, false);
        // Settled already: a second outcome for the same turn changes nothing.
        t.settle(0, b"k", false, WINDOW);
        t.settle(0, b"k", false, WINDOW);
        assert_eq!(next_due(&mut t, WINDOW + 1), 3 * WINDOW);
        assert_eq!(t.unsettled, 0);
    }

    #[test]
    fn it_prunes_in_amortised_time_when_every_key_is_fresh() {
        let mut t = Turns::default();
        for i in 0..(4 * PRUNE_AT) {
            t.look_due(0, format!("k{i}").as_bytes(), NOW, WINDOW);
        }
        // Nothing could go (all within their window); the threshold moved up each time.
        assert_eq!(t.len(), 4 * PRUNE_AT);
        assert!(t.prune_at >= 4 * PRUNE_AT);
    }

    #[test]
    fn it_forgets_keys_that_answer_as_absent() {
        let mut t = Turns::default();
        for i in 0..PRUNE_AT {
            t.look_due(0, format!("k{i}").as_bytes(), NOW, WINDOW);
        }
        assert_eq!(t.len(), PRUNE_AT);
        // One key still within its window, the rest past it: they go at the next insert.
        t.look_due(0, b"k0", NOW + WINDOW, WINDOW);
        t.look_due(0, b"new", NOW + WINDOW, WINDOW);
        assert_eq!(t.len(), 2);
        assert!(
            !t.look_due(0, b"k0", NOW + WINDOW + 1, WINDOW),
            "kept with its window"
        );
        assert!(
            t.look_due(0, b"k1", NOW + WINDOW + 1, WINDOW),
            "dropped: due, as before"
        );
    }
}
