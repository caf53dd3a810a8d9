//! Tests of the permit-expirable semaphore's rule (tables, one row a case); a child of `rule.rs`, so they see its private items.

use super::*;

const K: &[u8] = b"e";
const Z: &[u8] = b"{e}:timeout";

fn id(n: u8) -> [u8; ID_BYTES] {
    [n; ID_BYTES]
}

fn state(available: i64, permits: &[(u8, i64)]) -> ExpState {
    ExpState {
        available: Some(available),
        permits: permits
            .iter()
            .map(|&(n, at)| (id(n).to_vec(), at))
            .collect(),
        expire_at: None,
    }
}

fn zset_key() -> KeyRef {
    KeyRef::Aux(Z.to_vec())
}

#[test]
fn names_and_ids_follow_redisson() {
    assert_eq!(timeout_key(b"e"), Z.to_vec());
    assert_eq!(timeout_key(b"{a}:e"), b"{a}:e:timeout".to_vec());
    assert_eq!(channel(b"e"), b"redisson_sc:{e}".to_vec());
    assert_eq!(id_to_hex(&[0x00, 0xab, 0x7f]), b"00ab7f".to_vec());
    assert_eq!(parse_permit_id(b"00AB7f"), Ok(vec![0x00, 0xab, 0x7f]));
    for bad in [&b""[..], b"abc", b"zz", &[b'a'; 66]] {
        assert_eq!(parse_permit_id(bad), Err(ERR_PERMIT_ID), "{bad:?}");
    }
    assert_eq!(parse_permit_id(&id_to_hex(&id(7))), Ok(id(7).to_vec()));
}

#[test]
fn state_reads_integer_scores_only() {
    let s = parse_state(Some(b"2"), 5000, vec![(vec![1], 1500.0)], 1000).unwrap();
    assert_eq!(s.available, Some(2));
    assert_eq!(s.expire_at, Some(6000));
    assert_eq!(s.permits.get(&vec![1]), Some(&1500));
    assert_eq!(parse_state(None, -2, vec![], 0).unwrap().expire_at, None);
    for bad in [1.5, -1.0, f64::NAN, f64::INFINITY, 1e300] {
        assert_eq!(
            parse_state(None, -2, vec![(vec![1], bad)], 0),
            Err(ERR_NOT_A_PERMIT_SET),
            "{bad}"
        );
    }
}

#[test]
fn acquire_writes_redissons_layout() {
    let p = acquire(state(2, &[]), K, 1, Some(500), &[id(1)], false, 1000, false).unwrap();
    assert_eq!(
        p.effects.to_vec(),
        vec![
            Effect::IncrBy(KeyRef::Main, -1, 1),
            Effect::ZAdd(zset_key(), vec![(1500, id(1).to_vec())]),
        ]
    );
    assert_eq!(p.reply, Reply::Bulk(id_to_hex(&id(1))));
    assert!(p.message.is_none() && !p.wake);
    assert_eq!(p.state.next_expiry(), Some(1500));
    // No lease: Redisson's score; several permits: an array.
    let p = acquire(
        state(2, &[]),
        K,
        2,
        None,
        &[id(1), id(2)],
        true,
        1000,
        false,
    )
    .unwrap();
    assert_eq!(
        p.effects[1],
        Effect::ZAdd(
            zset_key(),
            vec![(NO_LEASE, id(1).to_vec()), (NO_LEASE, id(2).to_vec())]
        )
    );
    assert_eq!(
        p.reply,
        Reply::Array(vec![
            Reply::Bulk(id_to_hex(&id(1))),
            Reply::Bulk(id_to_hex(&id(2)))
        ])
    );
    assert_eq!(p.state.next_expiry(), None);
    // The count key's TTL goes to the zset.
    let mut s = state(1, &[]);
    s.expire_at = Some(9000);
    let p = acquire(s.clone(), K, 1, None, &[id(1)], false, 1000, false).unwrap();
    assert_eq!(p.effects.last(), Some(&Effect::PExpireAt(zset_key(), 9000)));
}

#[test]
fn acquire_refuses_without_permits_or_behind_a_queue() {
    // (state, permits, queued)
    for (s, permits, queued) in [
        (state(1, &[]), 2, false),
        (state(2, &[]), 1, true),
        (ExpState::default(), 1, false),
        (state(-1, &[]), 1, false),
    ] {
        let ids = [id(1), id(2)];
        let p = acquire(s.clone(), K, permits, Some(10), &ids, false, 0, queued).unwrap();
        assert_eq!(
            (p.reply, p.outcome),
            (Reply::Nil, Outcome::Contended),
            "{s:?}"
        );
        assert!(p.effects.is_empty());
    }
    assert_eq!(
        acquire(state(3, &[]), K, 2, None, &[id(1)], true, 0, false),
        Err(ERR_INTERNAL),
        "fewer ids than permits"
    );
    assert_eq!(
        acquire(state(3, &[(1, 50)]), K, 1, None, &[id(1)], false, 0, false),
        Err(ERR_INTERNAL),
        "an id already held"
    );
}

#[test]
fn every_plan_reclaims_expired_permits_first() {
    let s = state(0, &[(1, 100), (2, 200), (3, NO_LEASE)]);
    let p = acquire(s.clone(), K, 1, Some(50), &[id(9)], false, 200, false).unwrap();
    assert_eq!(
        p.effects[..2],
        [
            Effect::ZRem(zset_key(), vec![id(1).to_vec(), id(2).to_vec()]),
            Effect::IncrBy(KeyRef::Main, 2, 2),
        ]
    );
    assert_eq!(
        p.message,
        Some(b"2".to_vec()),
        "Redisson publishes the reclaimed count"
    );
    assert_eq!(p.state.available, Some(1));
    assert_eq!(p.state.permits.len(), 2);
    // A refused acquire still reclaims.
    let p = acquire(
        s.clone(),
        K,
        3,
        None,
        &[id(7), id(8), id(9)],
        true,
        150,
        false,
    )
    .unwrap();
    assert_eq!(p.outcome, Outcome::Contended);
    assert_eq!(p.state.available, Some(1));
    assert!(p.wake, "reclaimed permits may serve the queue");
}

#[test]
fn expire_is_exact_at_the_lease_end() {
    let s = state(0, &[(1, 100)]);
    let p = expire(s.clone(), K, 99).unwrap();
    assert!(p.effects.is_empty() && !p.wake && p.reply == Reply::Int(0));
    let p = expire(s.clone(), K, 100).unwrap();
    assert_eq!(p.reply, Reply::Int(1));
    assert_eq!(p.state.available, Some(1));
    assert!(p.state.permits.is_empty() && p.wake);
    assert_eq!(available(&s, 99), 0);
    assert_eq!(available(&s, 100), 1);
    // Redisson's count may be missing while permits are out: INCRBY creates it.
    let s = ExpState {
        permits: state(0, &[(1, 100)]).permits,
        ..ExpState::default()
    };
    assert_eq!(expire(s.clone(), K, 100).unwrap().state.available, Some(1));
}

#[test]
fn release_returns_a_held_permit_only() {
    let s = state(0, &[(1, 500), (2, 100)]);
    let p = release(s.clone(), K, &id(1), 200).unwrap();
    assert_eq!(p.reply, Reply::Int(1));
    assert_eq!(p.state.available, Some(2), "its permit and the expired one");
    assert_eq!(p.message, Some(b"2".to_vec()));
    assert_eq!(
        p.effects[2..],
        [
            Effect::ZRem(zset_key(), vec![id(1).to_vec()]),
            Effect::IncrBy(KeyRef::Main, 1, 2)
        ]
    );
    let p = release(s.clone(), K, &id(2), 200).unwrap();
    assert_eq!((p.reply, p.outcome), (Reply::Int(0), Outcome::NotHeld));
    assert_eq!(
        p.state.available,
        Some(1),
        "expired: reclaimed, not released"
    );
    let p = release(s.clone(), K, &id(9), 0).unwrap();
    assert!(p.effects.is_empty() && p.reply == Reply::Int(0));
}

#[test]
fn update_lease_time_moves_a_held_permits_end() {
    let s = state(0, &[(1, 500)]);
    let p = update_lease_time(s.clone(), K, &id(1), Some(1000), 400).unwrap();
    assert_eq!(
        p.effects.to_vec(),
        vec![Effect::ZAdd(zset_key(), vec![(1400, id(1).to_vec())])]
    );
    assert_eq!(p.reply, Reply::Int(1));
    assert_eq!(p.state.next_expiry(), Some(1400));
    let p = update_lease_time(s.clone(), K, &id(1), None, 400).unwrap();
    assert_eq!(p.state.permits[&id(1).to_vec()], NO_LEASE);
    assert_eq!(
        update_lease_time(s.clone(), K, &id(1), Some(10), 500)
            .unwrap()
            .reply,
        Reply::Int(0)
    );
    assert_eq!(lease_time(&s, &id(1), 400), 100);
    assert_eq!(lease_time(&s, &id(1), 500), -2);
    assert_eq!(lease_time(&p.state, &id(1), 400), -1);
}

#[test]
fn it_refuses_setpermits_whose_sum_or_step_would_wrap() {
    // A count at i64's ends, written by hand: an error, never a panic (the fuzz found
    // `available + held` wrapping on RPSEMAPHORE.SETPERMITS).
    let full = state(i64::MAX, &[(1, NO_LEASE)]);
    assert_eq!(
        set_permits(full.clone(), K, 2, 0).err(),
        Some(ERR_PERMITS_OVERFLOW)
    );
    let low = state(i64::MIN, &[]);
    assert_eq!(
        set_permits(low.clone(), K, 2, 0).err(),
        Some(ERR_PERMITS_OVERFLOW)
    );
    let p = set_permits(state(i64::MAX - 1, &[(1, NO_LEASE)]), K, i64::MAX, 0).unwrap();
    assert!(p.effects.is_empty(), "exactly the total: nothing to change");
}

#[test]
fn setting_and_adding_permits_match_redisson() {
    let p = try_set_permits(ExpState::default(), K, 3, 0).unwrap();
    assert_eq!(
        p.effects.to_vec(),
        vec![Effect::Set(KeyRef::Main, b"3".to_vec().into(), None)]
    );
    assert_eq!((p.message.as_deref(), p.wake), (Some(&b"3"[..]), true));
    assert_eq!(
        try_set_permits(state(0, &[]), K, 3, 0).unwrap().reply,
        Reply::Int(0)
    );
    // setPermits: available + held == permits.
    let p = set_permits(state(1, &[(1, NO_LEASE)]), K, 5, 0).unwrap();
    assert_eq!(p.effects.to_vec(), vec![Effect::IncrBy(KeyRef::Main, 3, 4)]);
    assert_eq!(p.message, Some(b"5".to_vec()));
    let p = set_permits(state(4, &[(1, NO_LEASE)]), K, 5, 0).unwrap();
    assert!(p.effects.is_empty() && p.message.is_none());
    // addPermits publishes the delta, only when positive, and SETs (TTL dropped).
    let mut s = state(1, &[]);
    s.expire_at = Some(100);
    let p = add_permits(s.clone(), K, 2, 0).unwrap();
    assert_eq!(
        p.effects.to_vec(),
        vec![Effect::Set(KeyRef::Main, b"3".to_vec().into(), None)]
    );
    assert_eq!(
        (p.message.as_deref(), p.state.expire_at),
        (Some(&b"2"[..]), None)
    );
    let p = add_permits(s.clone(), K, -2, 0).unwrap();
    assert_eq!((p.message, p.wake, p.reply), (None, false, Reply::Int(-1)));
}

#[test]
fn grant_stops_at_a_head_that_does_not_fit() {
    let s = state(1, &[(1, 100)]);
    let big = Request {
        permits: 3,
        lease: None,
        ids: vec![id(7), id(8), id(9)],
        many: true,
    };
    assert!(grant(s.clone(), K, &big, 100).is_none());
    let two = Request {
        permits: 2,
        lease: Some(10),
        ids: vec![id(7), id(8)],
        many: true,
    };
    let p = grant(s.clone(), K, &two, 100).unwrap().unwrap();
    assert_eq!(p.state.available, Some(0), "the expired permit counted");
    assert!(grant(s.clone(), K, &two, 99).is_none());
}

#[test]
fn parsers_name_the_bad_argument() {
    assert_eq!(parse_lease(b"-1"), Ok(None));
    assert_eq!(parse_lease(b"5"), Ok(Some(5)));
    for bad in [&b"0"[..], b"-2", b"x", b"3153600000001"] {
        assert_eq!(parse_lease(bad), Err(ERR_PERMIT_LEASE), "{bad:?}");
    }
    let (lease, o) =
        parse_acquire(&[b"100", b"PERMITS", b"3", b"WAIT", b"0", b"ID", b"r"]).unwrap();
    assert_eq!(
        (lease, o.permits, o.wait, o.id),
        (Some(100), Some(3), Some(0), Some(&b"r"[..]))
    );
    assert_eq!(
        parse_acquire(&[b"100", b"PERMITS", b"1025"]).unwrap_err(),
        crate::vocab::errors::ERR_PERMIT_COUNT
    );
    assert_eq!(parse_acquire(&[]).unwrap_err(), ERR_SYNTAX);
    assert_eq!(parse_release(&[b"0a", b"ID", b"r"]).unwrap().0, vec![10]);
    assert_eq!(
        parse_release(&[b"0a", b"WAIT", b"1"]).unwrap_err(),
        ERR_SYNTAX
    );
    assert_eq!(parse_update(&[b"0a", b"-1"]), Ok((vec![10], None)));
    assert_eq!(parse_update(&[b"0a"]), Err(ERR_SYNTAX));
    assert_eq!(parse_permits(&[b"-1"]).unwrap_err(), ERR_PERMITS);
    assert_eq!(parse_add(&[b"-3"]).unwrap().0, -3);
}

mod model {
    use super::super::*;
    use super::K;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(i64, Option<i64>),
        Release(usize),
        Update(usize, Option<i64>),
        Add(i64),
        Tick(i64),
        Timer,
    }

    fn op() -> impl Strategy<Value = Op> {
        let lease = proptest::option::weighted(0.8, 1..200i64);
        prop_oneof![
            (1..4i64, lease.clone()).prop_map(|(n, l)| Op::Acquire(n, l)),
            any::<usize>().prop_map(Op::Release),
            (any::<usize>(), lease).prop_map(|(i, l)| Op::Update(i, l)),
            (-2..4i64).prop_map(Op::Add),
            (0..150i64).prop_map(Op::Tick),
            Just(Op::Timer),
        ]
    }

    /// The `i`-th held permit (modulo), if any.
    fn pick(s: &ExpState, i: usize) -> Option<Vec<u8>> {
        s.permits.keys().nth(i % s.permits.len().max(1)).cloned()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// available + live permits == total after every plan (expired ones are back
        /// in the count), and a permit is held exactly until its lease end.
        #[test]
        fn permits_are_conserved_and_expire_exactly_at_their_lease(
            start in 0..6i64, ops in proptest::collection::vec(op(), 1..60)
        ) {
            let mut now = 1_000i64;
            let mut total = start;
            let mut s = try_set_permits(ExpState::default(), K, start, now).unwrap().state;
            let mut next_id = 0u8;
            // What the model says each permit's end is.
            let mut ends: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
            for op in ops {
                let plan = match op {
                    Op::Acquire(n, lease) => {
                        let ids: Vec<[u8; ID_BYTES]> = (0..n)
                            .map(|_| {
                                next_id += 1;
                                [next_id; ID_BYTES]
                            })
                            .collect();
                        if ids.iter().any(|i| s.permits.contains_key(&i[..])) { continue; }
                        let p = acquire(s.clone(), K, n, lease, &ids, true, now, false).unwrap();
                        if p.outcome == Outcome::Acquired {
                            for i in &ids { ends.insert(i.to_vec(), expiry(lease, now)); }
                        }
                        p
                    }
                    Op::Release(i) => {
                        let Some(id) = pick(&s, i) else { continue };
                        let p = release(s.clone(), K, &id, now).unwrap();
                        prop_assert_eq!(p.reply.clone(), Reply::Int((ends[&id] > now) as i64));
                        ends.remove(&id);
                        p
                    }
                    Op::Update(i, lease) => {
                        let Some(id) = pick(&s, i) else { continue };
                        let p = update_lease_time(s.clone(), K, &id, lease, now).unwrap();
                        if p.reply == Reply::Int(1) { ends.insert(id, expiry(lease, now)); }
                        p
                    }
                    Op::Add(d) => { total += d; add_permits(s.clone(), K, d, now).unwrap() }
                    Op::Tick(ms) => { now += ms; continue; }
                    Op::Timer => {
                        let Some(at) = s.next_expiry() else { continue };
                        now = now.max(at);
                        expire(s.clone(), K, now).unwrap()
                    }
                };
                s = plan.state;
                ends.retain(|id, _| s.permits.contains_key(id));
                let live = s.permits.values().filter(|&&at| at > now).count() as i64;
                prop_assert_eq!(s.permits.len() as i64, live, "no expired permit left in a plan's state");
                prop_assert_eq!(s.available() + live, total, "conserved");
                for (id, &end) in &s.permits {
                    prop_assert_eq!(Some(&end), ends.get(id));
                    prop_assert!(end > now, "held only before its end");
                }
                let earliest = s.permits.values().copied().filter(|&a| a != NO_LEASE).min();
                prop_assert_eq!(s.next_expiry(), earliest);
            }
        }

        /// A permit leased for `lease` ms is held at now + lease - 1 and back at now + lease.
        #[test]
        fn a_permit_expires_exactly_at_its_lease(
            lease in 1..10_000_000i64,
            now in 0..2_000_000_000_000i64
        ) {
            let s = try_set_permits(ExpState::default(), K, 1, now).unwrap().state;
            let s = acquire(s.clone(), K, 1, Some(lease), &[[1; ID_BYTES]], false, now, false).unwrap().state;
            prop_assert_eq!(s.next_expiry(), Some(now + lease));
            let before = expire(s.clone(), K, now + lease - 1).unwrap();
            prop_assert_eq!(before.state.available(), 0);
            prop_assert!(before.effects.is_empty());
            let at = expire(s.clone(), K, now + lease).unwrap();
            prop_assert_eq!(at.state.available(), 1);
            prop_assert!(at.state.permits.is_empty());
            prop_assert!(at.wake);
        }
    }
}
