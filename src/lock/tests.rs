//! Tests of the lock's rule (tables, one row a case) and its properties; a child of `rule.rs`, so they see its private items.

use super::*;
use crate::vocab::args::*;
use crate::vocab::errors::*;

const NOW: i64 = 1_700_000_000_000;

fn held(holders: &[(&str, i64)], pttl: i64) -> LockState<'static> {
    LockState::Held {
        holders: holders
            .iter()
            .map(|(o, c)| Holder {
                owner: o.as_bytes().to_vec(),
                count: *c,
            })
            .collect(),
        pttl,
    }
}

fn plan(
    delete: bool,
    write: Option<Write>,
    expire_at: Option<i64>,
    reply: Reply,
    outcome: Outcome,
    freed: bool,
) -> Plan {
    Plan {
        delete,
        write,
        expire_at,
        reply,
        outcome,
        freed,
    }
}

#[test]
fn acquire_table() {
    use Outcome::*;
    use Reply::*;
    let rows: Vec<(&str, LockState, &str, Plan)> = vec![
        // A free lock is created for the caller with its lease.
        (
            "it_creates_a_free_lock",
            LockState::Free,
            "a",
            plan(
                false,
                Some(Write::Set(1)),
                Some(NOW + 100),
                Nil,
                Acquired,
                false,
            ),
        ),
        // The holder re-enters: count + 1 and the lease re-armed.
        (
            "it_reenters_for_the_holder",
            held(&[("a", 2)], 5),
            "a",
            plan(
                false,
                Some(Write::IncrBy(1, 3)),
                Some(NOW + 100),
                Nil,
                Reentered,
                false,
            ),
        ),
        // Another owner gets the holder's PTTL and nothing changes.
        (
            "it_reports_pttl_to_others",
            held(&[("a", 1)], 42),
            "b",
            plan(false, None, None, Int(42), Contended, false),
        ),
        // A lock with no TTL reports -1, like PTTL.
        (
            "it_reports_minus_one_without_ttl",
            held(&[("a", 1)], -1),
            "b",
            plan(false, None, None, Int(-1), Contended, false),
        ),
    ];
    for (name, state, owner, want) in rows {
        assert_eq!(
            acquire(&state, owner.as_bytes(), 100, NOW).unwrap(),
            want,
            "{name}"
        );
    }
}

#[test]
fn it_refuses_a_reentry_that_would_overflow() {
    let state = held(&[("a", i64::MAX)], 5);
    assert_eq!(acquire(&state, b"a", 100, NOW), Err(ERR_COUNT_OVERFLOW));
}

#[test]
fn release_table() {
    use Outcome::*;
    use Reply::*;
    let rows: Vec<(&str, LockState, &str, Option<i64>, Plan)> = vec![
        // Count > 1 goes down and keeps the expiry when no lease is given.
        (
            "it_decrements_without_rearming",
            held(&[("a", 3)], 5),
            "a",
            None,
            plan(
                false,
                Some(Write::IncrBy(-1, 2)),
                None,
                Int(0),
                Decremented,
                false,
            ),
        ),
        // Count > 1 with a lease re-arms the expiry.
        (
            "it_decrements_and_rearms",
            held(&[("a", 2)], 5),
            "a",
            Some(50),
            plan(
                false,
                Some(Write::IncrBy(-1, 1)),
                Some(NOW + 50),
                Int(0),
                Decremented,
                false,
            ),
        ),
        // The last hold frees the lock.
        (
            "it_frees_on_the_last_hold",
            held(&[("a", 1)], 5),
            "a",
            Some(50),
            plan(true, None, None, Int(1), Released, true),
        ),
        // One owner of a shared hash leaves; the others still hold it.
        (
            "it_leaves_a_shared_hash_held",
            held(&[("a", 1), ("b", 1)], 5),
            "a",
            None,
            plan(false, Some(Write::Remove), None, Int(1), Released, false),
        ),
        // A non-owner changes nothing.
        (
            "it_rejects_release_by_non_owner",
            held(&[("a", 1)], 5),
            "b",
            None,
            plan(false, None, None, Nil, NotHeld, false),
        ),
        // Nothing to release.
        (
            "it_rejects_release_of_a_free_lock",
            LockState::Free,
            "a",
            None,
            plan(false, None, None, Nil, NotHeld, false),
        ),
    ];
    for (name, state, owner, lease, want) in rows {
        assert_eq!(
            release(&state, owner.as_bytes(), lease, NOW),
            want,
            "{name}"
        );
    }
}

#[test]
fn renew_and_force_release_table() {
    use Outcome::*;
    use Reply::*;
    // The holder renews: expiry re-armed, count untouched.
    assert_eq!(
        renew(&held(&[("a", 2)], 5), b"a", 70, NOW),
        plan(false, None, Some(NOW + 70), Int(1), Renewed, false)
    );
    // A non-holder cannot renew.
    assert_eq!(
        renew(&held(&[("a", 2)], 5), b"b", 70, NOW),
        plan(false, None, None, Int(0), NotHeld, false)
    );
    assert_eq!(
        renew(&LockState::Free, b"b", 70, NOW),
        plan(false, None, None, Int(0), NotHeld, false)
    );
    // Force release frees whatever the count.
    assert_eq!(
        force_release(&held(&[("a", 9)], 5)),
        plan(true, None, None, Int(1), ForceReleased, true)
    );
    assert_eq!(
        force_release(&LockState::Free),
        plan(false, None, None, Int(0), NoLock, false)
    );
}

#[test]
fn it_grants_with_or_without_replacing() {
    assert!(grant(true, 10, NOW).delete);
    assert_eq!(
        grant_head(&Ok(LockState::Free), 10, NOW),
        Ok(grant(false, 10, NOW))
    );
    assert_eq!(
        grant_head(&Err("WRONGTYPE"), 10, NOW),
        Ok(grant(true, 10, NOW))
    );
    let held = LockState::Held {
        holders: vec![],
        pttl: 42,
    };
    assert_eq!(grant_head(&Ok(held), 10, NOW), Err(42));
    assert_eq!(grant(false, 10, NOW).expire_at, Some(NOW + 10));
}

#[test]
fn parse_holders_table() {
    let ok = |v: &[(&str, &str)]| {
        parse_holders(v.iter().map(|(f, v)| (f.as_bytes().to_vec(), v.as_bytes())))
    };
    assert_eq!(
        ok(&[("a", "2")]).unwrap(),
        vec![Holder {
            owner: b"a".to_vec(),
            count: 2
        }]
    );
    // Zero, negative, non-numeric, padded and float values are not hold counts.
    for bad in ["0", "-1", "x", " 1", "1.5", "01", "+1", ""] {
        assert_eq!(ok(&[("a", bad)]), Err(ERR_NOT_A_LOCK), "{bad:?}");
    }
    assert_eq!(ok(&[]), Err(ERR_NOT_A_LOCK));
}

#[test]
fn parse_i64_table() {
    for (input, want) in [
        ("0", Some(0)),
        ("7", Some(7)),
        ("-7", Some(-7)),
        ("9223372036854775807", Some(i64::MAX)),
        ("9223372036854775808", None),
        ("-0", None),
        ("007", None),
        ("+7", None),
        ("7 ", None),
        ("", None),
        ("-", None),
        ("1e3", None),
    ] {
        assert_eq!(parse_i64(input.as_bytes()), want, "{input:?}");
    }
}

#[test]
fn parse_acquire_table() {
    fn p<'a>(a: &[&'a str]) -> Result<AcquireArgs<'a>, &'static str> {
        parse_acquire(&a.iter().map(|s| s.as_bytes()).collect::<Vec<_>>())
    }
    assert_eq!(
        p(&["o", "100"]).unwrap(),
        AcquireArgs {
            owner: b"o",
            lease: 100,
            wait: None,
            id: None,
            queued: false,
            notify: None,
            quiet: false,
        }
    );
    assert_eq!(
        p(&["o", "100", "ID", "r1", "WAIT", "5"]).unwrap(),
        AcquireArgs {
            owner: b"o",
            lease: 100,
            wait: Some(5),
            id: Some(b"r1"),
            queued: false,
            notify: None,
            quiet: false,
        }
    );
    let queued = p(&["o", "100", "WAIT", "5", "async", "ID", "r1"]).unwrap();
    assert!(queued.queued && queued.wait == Some(5) && !queued.quiet);
    // QUIET: a queued ticket gets no reply; it means nothing without ASYNC.
    let quiet = p(&["o", "100", "WAIT", "5", "ASYNC", "quiet", "ID", "r1"]).unwrap();
    assert!(quiet.queued && quiet.quiet);
    assert_eq!(
        p(&["o", "100", "WAIT", "5", "QUIET", "ID", "r1"]),
        Err(ERR_QUIET_ASYNC)
    );
    assert_eq!(
        p(&["o", "100", "WAIT", "5", "ASYNC", "QUIET", "QUIET", "ID", "r1"]),
        Err(ERR_SYNTAX)
    );
    assert!(
        p(&["o", "100", "ASYNC", "ID", "r1", "WAIT", "0"])
            .unwrap()
            .queued
    );
    // NOTIFY names a ticket's own channel, anywhere among the options.
    let tagged = p(&[
        "o",
        "100",
        "notify",
        "c7f3-a9e1_.X",
        "WAIT",
        "5",
        "ASYNC",
        "ID",
        "r1",
    ]);
    assert_eq!(tagged.unwrap().notify, Some(&b"c7f3-a9e1_.X"[..]));
    let longest = "t".repeat(64);
    assert_eq!(
        p(&["o", "100", "WAIT", "5", "ASYNC", "ID", "r1", "NOTIFY", &longest])
            .unwrap()
            .notify
            .map(<[u8]>::len),
        Some(64)
    );
    assert_eq!(p(&["o", "100", "wait", "0"]).unwrap().wait, Some(0));
    assert_eq!(p(&["o", "100", "WAIT", "250"]).unwrap().wait, Some(250));
    let too_long = "t".repeat(65);
    for (args, err) in [
        (&["", "100"][..], ERR_EMPTY_OWNER),
        (&["o", "0"], ERR_LEASE),
        (&["o", "-5"], ERR_LEASE),
        (&["o", "abc"], ERR_LEASE),
        (&["o", "99999999999999999999"], ERR_LEASE),
        (&["o", "3153600000001"], ERR_LEASE),
        (&["o", "100", "WAIT"], ERR_SYNTAX),
        (&["o", "100", "WAIT", "-1"], ERR_TIMEOUT),
        (&["o", "100", "WAIT", "x"], ERR_TIMEOUT),
        (&["o", "100", "WAIT", "1", "WAIT", "2"], ERR_SYNTAX),
        (&["o", "100", "NOPE"], ERR_SYNTAX),
        (&["o", "100", "NOPE", "1"], ERR_SYNTAX),
        (&["o", "100", "ID"], ERR_SYNTAX),
        (&["o", "100", "ID", ""], ERR_EMPTY_ID),
        (&["o", "100", "ID", "a", "ID", "b"], ERR_SYNTAX),
        (&["o", "100", "ASYNC"], ERR_ASYNC),
        (&["o", "100", "WAIT", "5", "ASYNC"], ERR_ASYNC),
        (&["o", "100", "ID", "r", "ASYNC"], ERR_ASYNC),
        (
            &["o", "100", "WAIT", "5", "ASYNC", "ASYNC", "ID", "r"],
            ERR_SYNTAX,
        ),
        // NOTIFY: only with ASYNC, a tag of 1 to 64 safe bytes, once.
        (
            &["o", "100", "WAIT", "5", "NOTIFY", "t", "ID", "r"],
            ERR_NOTIFY_ASYNC,
        ),
        (&["o", "100", "NOTIFY", "t"], ERR_NOTIFY_ASYNC),
        (
            &["o", "100", "WAIT", "5", "ASYNC", "ID", "r", "NOTIFY"],
            ERR_SYNTAX,
        ),
        (
            &["o", "100", "WAIT", "5", "ASYNC", "ID", "r", "NOTIFY", ""],
            ERR_NOTIFY_TAG,
        ),
        (
            &["o", "100", "WAIT", "5", "ASYNC", "ID", "r", "NOTIFY", "{t}"],
            ERR_NOTIFY_TAG,
        ),
        (
            &["o", "100", "WAIT", "5", "ASYNC", "ID", "r", "NOTIFY", "a:b"],
            ERR_NOTIFY_TAG,
        ),
        (
            &["o", "100", "WAIT", "5", "ASYNC", "ID", "r", "NOTIFY", "a b"],
            ERR_NOTIFY_TAG,
        ),
        (
            &["o", "100", "WAIT", "5", "ASYNC", "ID", "r", "NOTIFY", "é"],
            ERR_NOTIFY_TAG,
        ),
        (
            &[
                "o", "100", "WAIT", "5", "ASYNC", "ID", "r", "NOTIFY", &too_long,
            ],
            ERR_NOTIFY_TAG,
        ),
        (
            &[
                "o", "100", "WAIT", "5", "ASYNC", "ID", "r", "NOTIFY", "a", "NOTIFY", "b",
            ],
            ERR_SYNTAX,
        ),
    ] {
        assert_eq!(p(args), Err(err), "{args:?}");
    }
}

#[test]
fn parse_release_and_renew_table() {
    let rel = |owner: &'static [u8], lease, id| Ok(ReleaseArgs { owner, lease, id });
    assert_eq!(parse_release(&[b"o"]), rel(b"o", None, None));
    assert_eq!(parse_release(&[b"o", b"10"]), rel(b"o", Some(10), None));
    assert_eq!(
        parse_release(&[b"o", b"id", b"r"]),
        rel(b"o", None, Some(&b"r"[..]))
    );
    assert_eq!(
        parse_release(&[b"o", b"10", b"ID", b"r"]),
        rel(b"o", Some(10), Some(&b"r"[..]))
    );
    assert_eq!(parse_release(&[b"o", b"0"]), Err(ERR_LEASE));
    assert_eq!(parse_release(&[b"o", b"10", b"x"]), Err(ERR_SYNTAX));
    assert_eq!(parse_release(&[b"o", b"10", b"ID"]), Err(ERR_SYNTAX));
    assert_eq!(parse_release(&[b"o", b"ID", b""]), Err(ERR_EMPTY_ID));
    assert_eq!(parse_release(&[b""]), Err(ERR_EMPTY_OWNER));
    assert_eq!(parse_renew(&[b"o", b"10"]), Ok((&b"o"[..], 10)));
    assert_eq!(parse_renew(&[b"o", b"ten"]), Err(ERR_LEASE));
}

#[test]
fn parse_collect_reads_only_its_own_option() {
    assert_eq!(parse_collect(b"COLLECT", b"g1"), Some(Ok(&b"g1"[..])));
    assert_eq!(parse_collect(b"collect", b"g1"), Some(Ok(&b"g1"[..])));
    assert_eq!(parse_collect(b"COLLECT", b""), Some(Err(ERR_EMPTY_ID)));
    assert_eq!(parse_collect(b"ID", b"g1"), None);
    assert_eq!(parse_collect(b"COLLECTS", b"g1"), None);
}

#[test]
fn request_ids_live_in_the_locks_slot_and_replies_round_trip() {
    assert_eq!(
        request_key(b"lock", b"r1"),
        b"rlock_request:{lock}:r1".to_vec()
    );
    assert_eq!(
        request_key(b"{a}:l", b"r1"),
        b"rlock_request:{a}:l:r1".to_vec()
    );
    assert!(
        remembers(Outcome::Reentered)
            && !remembers(Outcome::Contended)
            && !remembers(Outcome::NotHeld)
    );
}

#[test]
fn unlock_channel_follows_redissons_prefix_rule() {
    assert_eq!(
        unlock_channel(b"lock"),
        b"redisson_lock__channel:{lock}".to_vec()
    );
    assert_eq!(
        unlock_channel(b"{app}:lock"),
        b"redisson_lock__channel:{app}:lock".to_vec()
    );
    assert_eq!(
        unlock_channel(b"a{b"),
        b"redisson_lock__channel:a{b".to_vec()
    );
}

/// Property tests: arbitrary input to the parsers, and arbitrary operation sequences run
/// through the core against a simulated key, checked against the design's rules.
mod props {
    use super::super::*;
    use crate::vocab::args::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn arg() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..12),
            Just(b"WAIT".to_vec()),
            Just(b"wait".to_vec()),
            Just(b"ID".to_vec()),
            any::<i64>().prop_map(|n| n.to_string().into_bytes()),
            (0..MAX_MS + 2).prop_map(|n| n.to_string().into_bytes()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn parsers_never_panic_and_accept_only_valid_values(args in proptest::collection::vec(arg(), 2..8)) {
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            if let Ok(a) = parse_acquire(&args) {
                prop_assert!(!a.owner.is_empty());
                prop_assert!((1..=MAX_MS).contains(&a.lease));
                prop_assert!(a.wait.is_none_or(|w| (0..=MAX_MS).contains(&w)));
                prop_assert!(a.id.is_none_or(|id| !id.is_empty()));
            }
            if let Ok(r) = parse_release(&args) {
                prop_assert!(!r.owner.is_empty());
                prop_assert!(r.lease.is_none_or(|l| (1..=MAX_MS).contains(&l)));
            }
            if let Ok((owner, lease)) = parse_renew(&args[..2]) {
                prop_assert!(!owner.is_empty() && (1..=MAX_MS).contains(&lease));
            }
        }

        #[test]
        fn parse_i64_agrees_with_canonical_formatting(n in any::<i64>(), junk in "[ +0a-z.]{0,2}") {
            prop_assert_eq!(parse_i64(n.to_string().as_bytes()), Some(n));
            let padded = format!("{junk}{n}");
            if !junk.is_empty() && padded != n.to_string() {
                prop_assert_eq!(parse_i64(padded.as_bytes()), None);
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(u8, i64),
        Release(u8, Option<i64>),
        Renew(u8, i64),
        Force,
        Tick(i64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..3u8, 1..100i64).prop_map(|(o, l)| Op::Acquire(o, l)),
            (0..3u8, proptest::option::of(1..100i64)).prop_map(|(o, l)| Op::Release(o, l)),
            (0..3u8, 1..100i64).prop_map(|(o, l)| Op::Renew(o, l)),
            Just(Op::Force),
            (1..60i64).prop_map(Op::Tick),
        ]
    }

    /// A simulated lock key: owner -> count, absolute expiry.
    #[derive(Debug, Default)]
    struct Key {
        fields: BTreeMap<Vec<u8>, i64>,
        expire_at: Option<i64>,
    }

    impl Key {
        /// The key as `store::read_for` reads it for `owner`: [`LockState::Alone`] when
        /// that owner alone holds it, else every field and the lease.
        fn state_for<'a>(&mut self, owner: &'a [u8], now: i64) -> LockState<'a> {
            let state = self.state(now);
            match self.fields.iter().next() {
                Some((o, c)) if self.fields.len() == 1 && o.as_slice() == owner => {
                    LockState::Alone { owner, count: *c }
                }
                _ => state,
            }
        }

        fn state(&mut self, now: i64) -> LockState<'static> {
            if self.expire_at.is_some_and(|at| now >= at) {
                self.fields.clear();
                self.expire_at = None;
            }
            if self.fields.is_empty() {
                return LockState::Free;
            }
            let holders = self
                .fields
                .iter()
                .map(|(o, c)| Holder {
                    owner: o.clone(),
                    count: *c,
                })
                .collect();
            LockState::Held {
                holders,
                pttl: self.expire_at.map_or(-1, |at| at - now),
            }
        }

        fn apply(&mut self, owner: &[u8], plan: &Plan) {
            if plan.delete {
                self.fields.clear();
                self.expire_at = None;
            }
            match plan.write {
                Some(Write::Set(n)) => {
                    self.fields.insert(owner.to_vec(), n);
                }
                Some(Write::IncrBy(delta, next)) => {
                    let c = self.fields.entry(owner.to_vec()).or_insert(0);
                    assert_eq!(*c + delta, next, "IncrBy's result matches the field");
                    *c = next;
                }
                Some(Write::Remove) => {
                    self.fields.remove(owner);
                }
                None => {}
            }
            if let Some(at) = plan.expire_at {
                self.expire_at = Some(at);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// Whatever happens: one owner at most, counts stay positive, replies follow the
        /// design.md, and the freed flag is set exactly when the key disappears.
        #[test]
        fn the_core_keeps_the_lock_invariants(ops in proptest::collection::vec(op(), 1..60)) {
            let mut key = Key::default();
            let mut now = 1_000_000i64;
            for op in ops {
                let state = key.state(now);
                let before: Option<Vec<u8>> = key.fields.keys().next().cloned();
                let (owner, plan) = match op {
                    Op::Tick(ms) => { now += ms; continue; }
                    Op::Acquire(o, lease) => {
                        let o = [o];
                        let state = key.state_for(&o, now);
                        let plan = acquire(&state, &o, lease, now).unwrap();
                        match (&state, state.count_of(&o)) {
                            (LockState::Free, _) | (_, Some(_)) => prop_assert_eq!(plan.reply, Reply::Nil),
                            (held, None) => {
                                prop_assert!(matches!(held, LockState::Held { .. }), "a contended state is a full read");
                                prop_assert_eq!(plan.reply, Reply::Int(held.pttl()));
                                prop_assert!(!plan.writes(), "a contended acquire writes nothing");
                            }
                        }
                        (o.to_vec(), plan)
                    }
                    Op::Release(o, lease) => {
                        let o = [o];
                        let state = key.state_for(&o, now);
                        let plan = release(&state, &o, lease, now);
                        let want = match state.count_of(&o) {
                            None => Reply::Nil,
                            Some(1) => Reply::Int(1),
                            Some(_) => Reply::Int(0),
                        };
                        prop_assert_eq!(plan.reply, want);
                        (o.to_vec(), plan)
                    }
                    Op::Renew(o, lease) => {
                        let o = [o];
                        let state = key.state_for(&o, now);
                        let plan = renew(&state, &o, lease, now);
                        prop_assert_eq!(plan.reply, Reply::Int(state.count_of(&o).map_or(0, |_| 1)));
                        (o.to_vec(), plan)
                    }
                    Op::Force => (vec![], force_release(&state)),
                };
                key.apply(&owner, &plan);
                prop_assert!(key.fields.len() <= 1, "never two owners: {:?}", key.fields);
                prop_assert!(key.fields.values().all(|c| *c >= 1));
                prop_assert!(key.fields.is_empty() || key.expire_at.is_some(), "a held lock always has a lease");
                prop_assert_eq!(plan.freed, before.is_some() && key.fields.is_empty());
                if let Some(held) = &before {
                    if !key.fields.is_empty() {
                        prop_assert_eq!(key.fields.keys().next(), Some(held), "nobody takes a held lock");
                    }
                }
            }
        }
    }
}

/// The store's one-field read for the owner (`LockState::Alone`) plans exactly what a
/// full read of the same hash does, for each of the owner's commands; another owner sees
/// the lock held.
#[test]
fn a_lock_read_for_its_owner_alone_plans_as_a_full_read() {
    for count in [1, 2, 7] {
        let alone = LockState::Alone { owner: b"a", count };
        let full = held(&[("a", count)], 500);
        assert_eq!(alone.count_of(b"a"), Some(count));
        assert_eq!(alone.count_of(b"b"), None);
        assert_eq!(alone.holder_count(), full.holder_count());
        assert_eq!(
            acquire(&alone, b"a", 70, NOW),
            acquire(&full, b"a", 70, NOW)
        );
        for lease in [None, Some(70)] {
            assert_eq!(
                release(&alone, b"a", lease, NOW),
                release(&full, b"a", lease, NOW)
            );
        }
        assert_eq!(renew(&alone, b"a", 70, NOW), renew(&full, b"a", 70, NOW));
        assert_eq!(force_release(&alone), force_release(&full));
        assert_eq!(release(&alone, b"b", None, NOW).outcome, Outcome::NotHeld);
        assert_eq!(renew(&alone, b"b", 70, NOW).outcome, Outcome::NotHeld);
        let contended = acquire(&alone, b"b", 70, NOW).unwrap();
        assert_eq!(contended.outcome, Outcome::Contended);
        assert!(!contended.writes());
    }
}
