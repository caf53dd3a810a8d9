//! The lock keys the module wrote, and the marker for its own writes.
//!
//! Layer: below `store`, and below `engine` (whose `track` the lock calls when it writes a
//! new lock, and whose `events` read it); it imports nothing of the crate. A key is tracked when
//! an RLOCK command or a handoff creates a lock there, and forgotten when the lock is
//! freed, so that a lock that goes away by expiry, DEL or overwrite still gets its unlock
//! message.
//!
//! Only while the module watches (engine/events.rs: while some client waits in it, and a
//! moment after). Noticing a removal takes an event subscription, which costs every other
//! command of the server; with nobody waiting the module holds none (design.md 1), so it
//! tracks nothing either: a set it could not keep up to date would only grow. A lock freed
//! by expiry, DEL or overwrite then gets no unlock message, as with Redisson, whose
//! pub/sub waiters wake at the lease end they were told anyway (docs/commands/lock.md, "Freeing and
//! handoff").

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize};

/// The lock keys the module wrote, per db, behind [`FILTER`], which answers "surely not"
/// for almost every other key at the cost of a cheap hash. The set hashes with foldhash,
/// seeded at random per set: key names come from clients, so a fixed hash would let them
/// pile keys into one bucket; SipHash (std's default) cost 6 % of a new lock's ACQUIRE.
#[derive(Default)]
struct Tracked {
    dbs: HashMap<i32, HashSet<Box<[u8]>, foldhash::fast::RandomState>>,
}

/// 2^17 counters: with 10 000 locks tracked, 7 % of other keys pass the filter.
const FILTER_BITS: u32 = 17;

/// Saturating counters indexed by [`quick_hash`] of the tracked keys (their db is not
/// hashed). Zero means no tracked key has that hash; a saturated one never goes down.
/// Plain statics rather than thread-locals: the keyspace callback reads them on every
/// event of the server, and a thread-local in a shared library costs a call to find.
/// Only Redis's main thread touches them (Relaxed loads and stores are plain moves).
static FILTER: [AtomicU8; 1 << FILTER_BITS] = [const { AtomicU8::new(0) }; 1 << FILTER_BITS];
/// Set when a counter saturates (it never goes down then): the next clear zeroes them all.
static SATURATED: AtomicBool = AtomicBool::new(false);
/// How many keys are tracked: zero turns every event away before the key is hashed.
static TRACKED_KEYS: AtomicUsize = AtomicUsize::new(0);
/// Whether new locks are tracked (while the module watches; main thread only).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// A fast hash of a key name for the filter: 8 bytes at a time, a multiply per word.
fn quick_hash(key: &[u8]) -> usize {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = key.len() as u64;
    let mut words = key.chunks_exact(8);
    for w in &mut words {
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))).wrapping_mul(K);
    }
    let mut last = [0u8; 8];
    last[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h.rotate_left(5) ^ u64::from_le_bytes(last)).wrapping_mul(K);
    (h >> (64 - FILTER_BITS)) as usize
}

impl Tracked {
    fn insert(&mut self, db: i32, key: &[u8]) {
        if self.dbs.entry(db).or_default().insert(key.into()) {
            let c = &FILTER[quick_hash(key)];
            let n = c.load(Relaxed);
            if n == u8::MAX - 1 {
                SATURATED.store(true, Relaxed);
            }
            c.store(n.saturating_add(1), Relaxed);
            TRACKED_KEYS.fetch_add(1, Relaxed);
        }
    }

    fn remove(&mut self, db: i32, key: &[u8]) -> bool {
        let Some(keys) = self.dbs.get_mut(&db) else {
            return false;
        };
        let removed = keys.remove(key);
        if keys.is_empty() {
            self.dbs.remove(&db);
        }
        if removed {
            let c = &FILTER[quick_hash(key)];
            let n = c.load(Relaxed);
            if n != u8::MAX {
                c.store(n - 1, Relaxed);
            }
            TRACKED_KEYS.fetch_sub(1, Relaxed);
        }
        removed
    }

    fn contains(&self, db: i32, key: &[u8]) -> bool {
        self.dbs.get(&db).is_some_and(|keys| keys.contains(key))
    }

    /// Forgets every key. Each counter is the number of tracked keys with its hash until
    /// one saturates, so zeroing the tracked keys' counters zeroes the filter: a few
    /// hundred instructions when the module stops watching with a lock or two tracked
    /// (the last waiter of a queue left, on every handoff to a lone waiter), where zeroing
    /// all 2^17 counters cost 180 000. Only after a saturation, or with many keys, is the
    /// whole filter zeroed.
    fn clear(&mut self) {
        if SATURATED.load(Relaxed) || TRACKED_KEYS.load(Relaxed) > (1 << FILTER_BITS) / 64 {
            for c in &FILTER {
                c.store(0, Relaxed);
            }
            SATURATED.store(false, Relaxed);
        } else {
            for key in self.dbs.values().flatten() {
                FILTER[quick_hash(key)].store(0, Relaxed);
            }
        }
        self.dbs.clear();
        TRACKED_KEYS.store(0, Relaxed);
    }
}

thread_local! {
    static TRACKED: RefCell<Tracked> = RefCell::new(Tracked::default());
}

/// Nesting depth of the module's own writes (see [`OwnWrite`]); main thread only.
static OWN_WRITES: AtomicU32 = AtomicU32::new(0);

/// False for a key surely not tracked in any db; true means "look in the set".
pub fn might_be_tracked(key: &[u8]) -> bool {
    FILTER[quick_hash(key)].load(Relaxed) != 0
}

/// True when at least one lock key is tracked (one load, for the keyspace callback).
pub fn any_tracked() -> bool {
    TRACKED_KEYS.load(Relaxed) != 0
}

/// Remembers that `key` in `db` holds a lock the module wrote (while tracking is on: one
/// load otherwise, on the lock's hot path).
pub fn track(db: i32, key: &[u8]) {
    if ACTIVE.load(Relaxed) {
        TRACKED.with(|t| t.borrow_mut().insert(db, key));
    }
}

/// Turns tracking on (the module started watching) or off (it stopped: every key is
/// forgotten, and the set's memory given back).
pub fn set_active(on: bool) {
    ACTIVE.store(on, Relaxed);
    if !on {
        TRACKED.with(|t| {
            let mut t = t.borrow_mut();
            t.clear();
            t.dbs.shrink_to_fit();
        });
    }
}

/// True while new locks are tracked.
pub fn active() -> bool {
    ACTIVE.load(Relaxed)
}

/// Forgets a lock key; true if it was tracked.
pub fn untrack(db: i32, key: &[u8]) -> bool {
    TRACKED.with(|t| t.borrow_mut().remove(db, key))
}

/// True if the module wrote a lock at this key that it has not seen freed.
pub fn is_tracked(db: i32, key: &[u8]) -> bool {
    TRACKED.with(|t| t.borrow().contains(db, key))
}

/// How many lock keys the module tracks (for INFO).
pub fn tracked_count() -> usize {
    TRACKED_KEYS.load(Relaxed)
}

/// Every tracked lock key.
pub fn all_keys() -> Vec<(i32, Vec<u8>)> {
    TRACKED.with(|t| {
        t.borrow()
            .dbs
            .iter()
            .flat_map(|(db, keys)| keys.iter().map(move |k| (*db, k.to_vec())))
            .collect()
    })
}

/// SWAPDB: every lock key of either db becomes tracked in both (each is looked at again
/// afterwards, and forgotten where no lock is).
pub fn swap(a: i32, b: i32) {
    TRACKED.with(|t| {
        let mut t = t.borrow_mut();
        let mut union: Vec<Box<[u8]>> = [a, b]
            .iter()
            .filter_map(|db| t.dbs.get(db))
            .flat_map(|keys| keys.iter().cloned())
            .collect();
        union.sort_unstable();
        union.dedup();
        for key in &union {
            for db in [a, b] {
                t.remove(db, key);
                t.insert(db, key);
            }
        }
    });
}

/// Forgets every lock key (the server became a replica).
pub fn clear() {
    TRACKED.with(|t| t.borrow_mut().clear());
}

/// True while the module is writing (its own notifications need no handoff check).
pub fn own_write_in_progress() -> bool {
    OWN_WRITES.load(Relaxed) != 0
}

/// Marks the module's own writes, whose notifications need no handoff check.
pub struct OwnWrite(());

impl OwnWrite {
    pub fn begin() -> OwnWrite {
        OWN_WRITES.fetch_add(1, Relaxed);
        OwnWrite(())
    }
}

impl Drop for OwnWrite {
    fn drop(&mut self) {
        OWN_WRITES.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter_is_zero() -> bool {
        FILTER.iter().all(|c| c.load(Relaxed) == 0)
    }

    // The only test that touches the process-wide filter.
    #[test]
    fn clearing_zeroes_the_filter_with_few_keys_many_keys_and_after_a_saturation() {
        let mut t = Tracked::default();
        // A few keys: only their counters are zeroed, and that is all of them.
        for k in ["a", "b", "{app}:lock"] {
            t.insert(0, k.as_bytes());
        }
        t.insert(3, b"a");
        assert!(might_be_tracked(b"a") && any_tracked());
        t.clear();
        assert!(filter_is_zero() && !any_tracked() && !t.contains(0, b"a"));
        // A saturated counter never goes down: the next clear zeroes everything.
        for db in 0..300 {
            t.insert(db, b"same");
        }
        for db in 0..300 {
            t.remove(db, b"same");
        }
        assert!(!any_tracked() && might_be_tracked(b"same"), "saturated");
        t.clear();
        assert!(filter_is_zero());
        // Many keys: the whole filter.
        for n in 0..5000 {
            t.insert(0, format!("k{n}").as_bytes());
        }
        t.clear();
        assert!(filter_is_zero() && !any_tracked());
    }
}
