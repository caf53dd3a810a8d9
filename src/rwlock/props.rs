//! Property tests: random operation sequences against a simulated keyspace (a hash and
//! string keys with expiries, as Redis keeps them) and a simulated waiting engine (a FIFO
//! queue served with [`grant`]), checked against design.md 4.1 and an independent lease model.
//!
//! A child of `rule.rs`, beside `tests.rs`.

use std::collections::BTreeMap;

use super::*;
use crate::vocab::args::parse_i64;
use proptest::prelude::*;
use std::collections::VecDeque;

const K: &[u8] = b"rw";

#[derive(Debug, Clone)]
enum Val {
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
    Str,
}

/// Redis as far as the effects go: values and absolute expiries; a key is gone at
/// its expiry (the core must not rely on Redis's sampling for read holds).
#[derive(Debug, Default)]
struct Store {
    vals: BTreeMap<KeyRef, Val>,
    expiry: BTreeMap<KeyRef, i64>,
}

impl Store {
    fn expire(&mut self, now: i64) {
        let due: Vec<KeyRef> = self
            .expiry
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            self.vals.remove(&k);
            self.expiry.remove(&k);
        }
    }

    fn hash(&mut self, k: &KeyRef) -> &mut BTreeMap<Vec<u8>, Vec<u8>> {
        match self
            .vals
            .entry(k.clone())
            .or_insert_with(|| Val::Hash(BTreeMap::new()))
        {
            Val::Hash(h) => h,
            Val::Str => panic!("hash effect on a string key {k:?}"),
        }
    }

    fn apply(&mut self, effects: &[Effect], now: i64) {
        for e in effects {
            match e {
                Effect::Del(k) => {
                    self.vals.remove(k);
                    self.expiry.remove(k);
                }
                Effect::HSet(k, f, v) => {
                    self.hash(k).insert(f.to_vec(), v.to_vec());
                }
                Effect::HIncrBy(k, f, delta, result) => {
                    let h = self.hash(k);
                    let cur = h.get(&f[..]).map_or(0, |v| parse_i64(v).unwrap());
                    assert_eq!(cur + delta, *result, "HINCRBY's stated result");
                    h.insert(f.to_vec(), result.to_string().into_bytes());
                }
                Effect::HDel(k, f) => {
                    let h = self.hash(k);
                    h.remove(&f[..]);
                    if h.is_empty() {
                        self.vals.remove(k);
                        self.expiry.remove(k);
                    }
                }
                Effect::Set(k, _, at) => {
                    self.vals.insert(k.clone(), Val::Str);
                    match at {
                        Some(at) => self.expiry.insert(k.clone(), *at),
                        None => self.expiry.remove(k),
                    };
                }
                Effect::PExpireAt(k, at) => {
                    if self.vals.contains_key(k) {
                        self.expiry.insert(k.clone(), *at);
                    }
                }
                Effect::Persist(k) => {
                    self.expiry.remove(k);
                }
                Effect::IncrBy(..) | Effect::ZAdd(..) | Effect::ZRem(..) => {
                    panic!("the read-write lock writes no counters or sorted sets: {e:?}")
                }
            }
        }
        self.expire(now);
    }

    fn pttl(&self, k: &KeyRef, now: i64) -> i64 {
        match (self.vals.contains_key(k), self.expiry.get(k)) {
            (false, _) => -2,
            (true, None) => -1,
            (true, Some(at)) => at - now,
        }
    }

    /// What the glue will do: HGETALL, PTTL, then PTTL of each timeout key.
    fn state(&mut self, now: i64) -> RwState {
        self.expire(now);
        let fields = match self.vals.get(&KeyRef::Main) {
            None => return RwState::free(),
            Some(Val::Hash(h)) => h.clone(),
            Some(Val::Str) => panic!("main key became a string"),
        };
        let view = parse_hash(fields).expect("the core only writes valid locks");
        let pttls: Vec<i64> = view
            .timeout_keys(K)
            .into_iter()
            .map(|k| self.pttl(&KeyRef::Aux(k), now))
            .collect();
        let pttl = self.pttl(&KeyRef::Main, now);
        view.into_state(pttl, &pttls, now)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(Side, u8, i64, bool),
    Release(Side, u8, Option<i64>),
    Renew(Side, u8, i64),
    Force(Option<Side>),
    /// A queued waiter times out or disconnects.
    Cancel(usize),
    Tick(i64),
}

fn side() -> impl Strategy<Value = Side> {
    prop_oneof![Just(Side::Read), Just(Side::Write)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (side(), 0..5u8, 1..200i64, any::<bool>()).prop_map(|(s, o, l, w)| Op::Acquire(s, o, l, w)),
        3 => (side(), 0..5u8, proptest::option::of(1..200i64)).prop_map(|(s, o, l)| Op::Release(s, o, l)),
        2 => (side(), 0..5u8, 1..200i64).prop_map(|(s, o, l)| Op::Renew(s, o, l)),
        1 => proptest::option::of(side()).prop_map(Op::Force),
        1 => (0..4usize).prop_map(Op::Cancel),
        3 => (1..120i64).prop_map(Op::Tick),
    ]
}

fn owner(o: u8) -> Vec<u8> {
    vec![b'o', b'0' + o]
}

/// The lease model, kept apart from the core: each owner's read hold ends, pushed on
/// acquire, the newest popped on release, all re-armed on renew, and the owner gone
/// when its longest hold has ended, whatever the others do.
#[derive(Debug, Default)]
struct Leases(BTreeMap<Vec<u8>, Vec<i64>>);

impl Leases {
    fn tick(&mut self, now: i64) {
        self.0
            .retain(|_, ends| ends.iter().max().is_some_and(|e| *e > now));
        // A hold past its end has lost its timeout key: the keys say GONE for it.
        for e in self.0.values_mut().flatten() {
            if *e <= now {
                *e = GONE;
            }
        }
    }
}

struct World {
    store: Store,
    /// Waiters with their arrival number.
    queue: VecDeque<(u64, Request)>,
    leases: Leases,
    now: i64,
    /// Arrival numbers of the waiters served, in serving order.
    granted: Vec<u64>,
}

impl World {
    fn state(&mut self) -> RwState {
        self.store.state(self.now)
    }

    fn apply(&mut self, plan: &Plan) -> Result<(), TestCaseError> {
        self.store.apply(&plan.effects, self.now);
        let read_back = self.state();
        prop_assert_eq!(&read_back, &plan.state, "the keys hold what the plan says");
        self.leases.tick(self.now);
        let model: BTreeMap<Vec<u8>, Vec<i64>> = self.leases.0.clone();
        prop_assert_eq!(
            &read_back.readers,
            &model,
            "each read hold ends at its own lease"
        );
        check(&read_back, self.now)
    }

    fn track(&mut self, side: Side, owner: &[u8], lease: i64, plan: &Plan) {
        if side == Side::Read && matches!(plan.outcome, Outcome::Acquired | Outcome::Reentered) {
            self.leases
                .0
                .entry(owner.to_vec())
                .or_default()
                .push(self.now + lease);
        }
    }

    /// The engine: serve the head while it can be granted.
    fn serve(&mut self) -> Result<(), TestCaseError> {
        while let Some((arrival, head)) = self.queue.front().cloned() {
            let state = self.state();
            match grant(&state, K, &head, self.now) {
                None => {
                    // A head that waits is excluded for real: readers wait only on a
                    // writer, a writer on anyone else.
                    match head.side {
                        Side::Read => prop_assert!(
                            state.mode == Some(Mode::Write) && !state.is_writer(&head.owner)
                        ),
                        Side::Write => {
                            prop_assert!(!state.is_free() && !state.is_writer(&head.owner))
                        }
                    }
                    break;
                }
                Some(Ok(plan)) => {
                    self.queue.pop_front();
                    self.track(head.side, &head.owner, head.lease, &plan);
                    self.apply(&plan)?;
                    self.granted.push(arrival);
                }
                Some(Err(e)) => {
                    prop_assert_eq!(e, ERR_RW_READ_HELD);
                    self.queue.pop_front();
                }
            }
        }
        let state = self.state();
        prop_assert!(
            !state.is_free() || self.queue.is_empty(),
            "a free lock has no waiters"
        );
        Ok(())
    }

    /// Before a command on a key with waiters, and on the timer: drop what ran out.
    fn expire(&mut self) -> Result<(), TestCaseError> {
        let state = self.state();
        let plan = expire(&state, K, self.now);
        self.apply(&plan)?;
        // A hash that Redis expired (or anything else deleted) frees the lock too: the
        // engine hears of it from the keyspace event and serves the queue (design.md 1.3).
        if plan.wake || plan.state.is_free() {
            self.serve()?;
        }
        Ok(())
    }
}

/// Never a writer with anyone else; the hash lives exactly as long as its longest
/// read lease in read mode; nothing past its lease is left.
fn check(s: &RwState, now: i64) -> Result<(), TestCaseError> {
    match s.mode {
        None => prop_assert!(s.writer.is_none() && s.readers.is_empty()),
        Some(Mode::Write) => {
            let w = s.writer.as_ref().expect("write mode has a writer");
            prop_assert!(
                s.readers.keys().all(|o| *o == w.owner),
                "a writer with other readers"
            );
            prop_assert!(s.expire_at > now);
        }
        Some(Mode::Read) => {
            prop_assert!(s.writer.is_none());
            prop_assert!(!s.readers.is_empty());
            prop_assert_eq!(Some(s.expire_at), s.read_end());
        }
    }
    for ends in s.readers.values() {
        prop_assert!(lease_end(ends) > now);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn the_rw_core_keeps_its_invariants_fifo_and_per_hold_leases(ops in proptest::collection::vec(op(), 1..80)) {
        let mut w = World {
            store: Store::default(),
            queue: VecDeque::new(),
            leases: Leases::default(),
            now: 1_000_000,
            granted: vec![],
        };
        let mut arrivals = 0u64;
        for op in ops {
            // Owners blocked in the queue send nothing until they are served.
            let busy = |o: u8, w: &World| w.queue.iter().any(|(_, r)| r.owner == owner(o));
            if !w.queue.is_empty() {
                w.expire()?;
            }
            let state = w.state();
            match op {
                Op::Tick(ms) => {
                    w.now += ms;
                    w.expire()?;
                }
                Op::Acquire(side, o, lease, wait) => {
                    if busy(o, &w) { continue; }
                    let id = owner(o);
                    let queued = !w.queue.is_empty();
                    match acquire(&state, K, side, &id, lease, w.now, queued) {
                        Err(e) => {
                            prop_assert_eq!(e, ERR_RW_READ_HELD);
                            prop_assert!(side == Side::Write && state.read_count(&id) > 0 && !state.is_writer(&id));
                        }
                        Ok(plan) => {
                            // The writer reading its own lock counts as a re-entry: it
                            // would otherwise wait on the readers queued behind it.
                            let reentry = match side {
                                Side::Read => state.read_count(&id) > 0 || state.is_writer(&id),
                                Side::Write => state.is_writer(&id),
                            };
                            if queued && !reentry {
                                prop_assert_eq!(plan.outcome, Outcome::Contended, "no barging past the queue");
                            }
                            if plan.outcome == Outcome::Contended {
                                prop_assert!(plan.effects.is_empty());
                                let pttl = if state.is_free() { 0 } else { state.pttl(w.now) };
                                prop_assert_eq!(plan.reply, Reply::Int(pttl));
                            } else {
                                prop_assert_eq!(plan.reply, Reply::Nil);
                            }
                            w.track(side, &id, lease, &plan);
                            w.apply(&plan)?;
                            if plan.outcome == Outcome::Contended && wait {
                                let req = Request { side, owner: id, lease };
                                arrivals += 1;
                                w.queue.push_back((arrivals, req));
                            }
                            if plan.wake { w.serve()?; }
                        }
                    }
                }
                Op::Release(side, o, lease) => {
                    if busy(o, &w) { continue; }
                    let id = owner(o);
                    let plan = release(&state, K, side, &id, lease, w.now);
                    let want = match side {
                        Side::Read => match state.readers.get(&id) {
                            None => Reply::Nil,
                            Some(ends) => {
                                // 0 while some hold left is alive (or re-armed by the lease).
                                let rest = &ends[..ends.len() - 1];
                                let alive = lease.is_some() && !rest.is_empty() || rest.iter().any(|e| *e > w.now);
                                Reply::Int(if alive { 0 } else { 1 })
                            }
                        },
                        Side::Write => match &state.writer {
                            Some(wr) if wr.owner == id => Reply::Int(if wr.count == 1 { 1 } else { 0 }),
                            _ => Reply::Nil,
                        },
                    };
                    prop_assert_eq!(plan.reply, want);
                    if side == Side::Read && want != Reply::Nil {
                        let ends = w.leases.0.get_mut(&id).unwrap();
                        ends.pop();
                        if let Some(l) = lease { ends.iter_mut().for_each(|e| *e = w.now + l); }
                    }
                    w.apply(&plan)?;
                    if plan.wake { w.serve()?; }
                }
                Op::Renew(side, o, lease) => {
                    if busy(o, &w) { continue; }
                    let id = owner(o);
                    let plan = renew(&state, K, side, &id, lease, w.now);
                    if side == Side::Read {
                        if let Some(ends) = w.leases.0.get_mut(&id) {
                            ends.iter_mut().for_each(|e| *e = w.now + lease);
                        }
                    }
                    w.apply(&plan)?;
                }
                Op::Force(side) => {
                    let plan = force_release(&state, K, side, w.now);
                    if plan.outcome == Outcome::ForceReleased {
                        w.leases.0.clear();
                    }
                    w.apply(&plan)?;
                    if plan.wake { w.serve()?; }
                }
                Op::Cancel(i) => {
                    if i < w.queue.len() {
                        w.queue.remove(i);
                        // A head that leaves may unblock the readers behind it.
                        w.serve()?;
                    }
                }
            }
        }
        // FIFO: waiters were served in the order they arrived.
        prop_assert!(w.granted.windows(2).all(|p| p[0] < p[1]), "served out of order: {:?}", w.granted);
    }

    #[test]
    fn parsers_never_panic(args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..8), 0..7)) {
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let _ = parse_rw_acquire(&args);
        let _ = parse_rw_release(&args);
        let _ = parse_rw_renew(&args);
        let _ = parse_rw_force(&args);
        let pairs = args.chunks(2).map(|c| (c[0].to_vec(), c.get(1).copied().unwrap_or(b"")));
        if let Ok(view) = parse_hash(pairs) {
            let keys = view.timeout_keys(K);
            let _ = view.into_state(5, &vec![1; keys.len()], 0);
        }
    }
}
