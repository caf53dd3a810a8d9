//! Tests of the read-write lock's rule (tables, one row a case) and its properties; a child of `rule.rs`, so they see its private items.

use super::*;
use crate::vocab::errors::ERR_NOT_A_RWLOCK;

const NOW: i64 = 1_700_000_000_000;
const K: &[u8] = b"rw";

fn tk(owner: &str, n: i64) -> KeyRef {
    KeyRef::Aux(timeout_key(K, owner.as_bytes(), n))
}
fn main_hset(field: &str, value: &str) -> Effect {
    Effect::HSet(
        KeyRef::Main,
        field.as_bytes().to_vec().into(),
        value.as_bytes().to_vec().into(),
    )
}
fn incr(field: &str, delta: i64, result: i64) -> Effect {
    Effect::HIncrBy(
        KeyRef::Main,
        field.as_bytes().to_vec().into(),
        delta,
        result,
    )
}
fn hdel(field: &str) -> Effect {
    Effect::HDel(KeyRef::Main, field.as_bytes().to_vec().into())
}
fn expire_main(at: i64) -> Effect {
    Effect::PExpireAt(KeyRef::Main, at)
}

/// A read-mode lock: (owner, ends relative to NOW), hash expiry relative to NOW.
fn reading(readers: &[(&str, &[i64])], expire_in: i64) -> RwState {
    RwState {
        mode: Some(Mode::Read),
        writer: None,
        readers: readers
            .iter()
            .map(|(o, ends)| {
                (
                    o.as_bytes().to_vec(),
                    ends.iter().map(|e| NOW + e).collect(),
                )
            })
            .collect(),
        expire_at: NOW + expire_in,
    }
}

fn writing(owner: &str, count: i64, reads: &[i64], expire_in: i64) -> RwState {
    let mut s = reading(&[], expire_in);
    s.mode = Some(Mode::Write);
    s.writer = Some(Writer {
        owner: owner.into(),
        count,
    });
    if !reads.is_empty() {
        s.readers
            .insert(owner.into(), reads.iter().map(|e| NOW + e).collect());
    }
    s
}

fn acq(s: &RwState, side: Side, owner: &str, lease: i64, queued: bool) -> Plan {
    acquire(s, K, side, owner.as_bytes(), lease, NOW, queued).unwrap()
}

#[test]
fn acquire_table() {
    use Outcome::*;
    use Side::*;
    // (name, state, side, owner, queued, reply, outcome, effects)
    type Row<'a> = (
        &'a str,
        RwState,
        Side,
        &'a str,
        bool,
        Reply,
        Outcome,
        Vec<Effect>,
    );
    let rows: Vec<Row> = vec![
        (
            "it_creates_a_read_lock_with_its_timeout_key",
            RwState::free(),
            Read,
            "a",
            false,
            Reply::Nil,
            Acquired,
            vec![
                main_hset("mode", "read"),
                main_hset("a", "1"),
                Effect::Set(tk("a", 1), b"1".to_vec().into(), Some(NOW + 100)),
                expire_main(NOW + 100),
            ],
        ),
        (
            "it_creates_a_write_lock",
            RwState::free(),
            Write,
            "w",
            false,
            Reply::Nil,
            Acquired,
            vec![
                main_hset("mode", "write"),
                main_hset("w:write", "1"),
                expire_main(NOW + 100),
            ],
        ),
        (
            "a_second_reader_joins_and_the_hash_lives_as_long_as_the_longest_lease",
            reading(&[("a", &[50])], 50),
            Read,
            "b",
            false,
            Reply::Nil,
            Acquired,
            vec![
                main_hset("b", "1"),
                Effect::Set(tk("b", 1), b"1".to_vec().into(), Some(NOW + 100)),
                expire_main(NOW + 100),
            ],
        ),
        (
            "a_reader_reenters_with_a_new_timeout_key_and_the_hash_keeps_a_longer_lease",
            reading(&[("a", &[500])], 500),
            Read,
            "a",
            true,
            Reply::Nil,
            Reentered,
            vec![
                incr("a", 1, 2),
                Effect::Set(tk("a", 2), b"1".to_vec().into(), Some(NOW + 100)),
            ],
        ),
        (
            "a_new_reader_queues_behind_a_waiting_writer",
            reading(&[("a", &[500])], 500),
            Read,
            "b",
            true,
            Reply::Int(500),
            Contended,
            vec![],
        ),
        (
            "a_writer_is_kept_out_by_readers",
            reading(&[("a", &[500])], 500),
            Write,
            "w",
            false,
            Reply::Int(500),
            Contended,
            vec![],
        ),
        (
            "a_reader_is_kept_out_by_a_writer",
            writing("w", 1, &[], 300),
            Read,
            "a",
            false,
            Reply::Int(300),
            Contended,
            vec![],
        ),
        (
            "the_writer_reenters_and_its_lease_is_rearmed",
            writing("w", 1, &[], 300),
            Write,
            "w",
            true,
            Reply::Nil,
            Reentered,
            vec![incr("w:write", 1, 2), expire_main(NOW + 100)],
        ),
        (
            "the_writer_may_read_and_the_hash_covers_both_leases",
            writing("w", 1, &[], 50),
            Read,
            "w",
            false,
            Reply::Nil,
            Acquired,
            vec![
                main_hset("w", "1"),
                Effect::Set(tk("w", 1), b"1".to_vec().into(), Some(NOW + 100)),
                expire_main(NOW + 100),
            ],
        ),
        (
            "readers_past_their_lease_are_dropped_before_the_writer_is_considered",
            reading(&[("dead", &[-1]), ("b", &[0])], 200),
            Write,
            "w",
            false,
            Reply::Nil,
            Acquired,
            vec![
                hdel("b"),
                Effect::Del(tk("b", 1)),
                hdel("dead"),
                Effect::Del(tk("dead", 1)),
                Effect::Del(KeyRef::Main),
                main_hset("mode", "write"),
                main_hset("w:write", "1"),
                expire_main(NOW + 100),
            ],
        ),
        (
            "a_lock_that_nobody_holds_is_not_refused_to_a_newcomer_without_queue",
            RwState::free(),
            Read,
            "b",
            false,
            Reply::Nil,
            Acquired,
            vec![
                main_hset("mode", "read"),
                main_hset("b", "1"),
                Effect::Set(tk("b", 1), b"1".to_vec().into(), Some(NOW + 100)),
                expire_main(NOW + 100),
            ],
        ),
        (
            "a_free_lock_with_a_queue_sends_the_caller_behind_it_and_wakes_the_queue",
            RwState::free(),
            Write,
            "b",
            true,
            Reply::Int(0),
            Contended,
            vec![],
        ),
    ];
    for (name, state, side, owner, queued, reply, outcome, effects) in rows {
        let plan = acq(&state, side, owner, 100, queued);
        assert_eq!(
            (plan.reply, plan.outcome, &plan.effects.to_vec()),
            (reply, outcome, &effects),
            "{name}"
        );
    }
}

#[test]
fn it_refuses_a_reader_asking_for_the_write_lock_at_once() {
    let s = reading(&[("a", &[500]), ("b", &[500])], 500);
    assert_eq!(
        acquire(&s, K, Side::Write, b"a", 100, NOW, false),
        Err(ERR_RW_READ_HELD)
    );
    // ...also from the queue head, where the engine answers it and moves on.
    let req = Request {
        side: Side::Write,
        owner: b"a".to_vec(),
        lease: 100,
    };
    assert_eq!(grant(&s, K, &req, NOW), Some(Err(ERR_RW_READ_HELD)));
}

#[test]
fn it_bounds_read_reentries_and_write_counts() {
    let ends: Vec<i64> = vec![500; MAX_READ_HOLDS as usize];
    let s = reading(&[("a", &ends)], 500);
    assert_eq!(
        acquire(&s, K, Side::Read, b"a", 100, NOW, false),
        Err(ERR_RW_TOO_MANY_HOLDS)
    );
    let s = writing("w", i64::MAX, &[], 500);
    assert_eq!(
        acquire(&s, K, Side::Write, b"w", 100, NOW, false),
        Err(ERR_COUNT_OVERFLOW)
    );
}

#[test]
fn release_table() {
    use Outcome::*;
    use Side::*;
    // (name, state, side, owner, lease, reply, outcome, effects, wake, message)
    type Row<'a> = (
        &'a str,
        RwState,
        Side,
        &'a str,
        Option<i64>,
        Reply,
        Outcome,
        Vec<Effect>,
        bool,
        Option<&'static [u8]>,
    );
    let rows: Vec<Row> = vec![
        (
            "a_reader_counts_down_and_its_newest_timeout_key_goes",
            reading(&[("a", &[300, 100])], 300),
            Read,
            "a",
            None,
            Reply::Int(0),
            Decremented,
            vec![incr("a", -1, 1), Effect::Del(tk("a", 2))],
            false,
            None,
        ),
        (
            "a_reader_leaving_others_shrinks_the_hash_to_their_longest_lease",
            reading(&[("a", &[900]), ("b", &[200])], 900),
            Read,
            "a",
            None,
            Reply::Int(1),
            Released,
            vec![hdel("a"), Effect::Del(tk("a", 1)), expire_main(NOW + 200)],
            false,
            None,
        ),
        (
            "the_last_reader_frees_the_lock_with_message_0",
            reading(&[("a", &[900])], 900),
            Read,
            "a",
            Some(50),
            Reply::Int(1),
            Released,
            vec![
                hdel("a"),
                Effect::Del(tk("a", 1)),
                Effect::Del(KeyRef::Main),
            ],
            true,
            Some(UNLOCK_MESSAGE),
        ),
        (
            "a_reader_whose_older_holds_ran_out_is_gone_with_its_newest",
            reading(&[("a", &[-5, 300]), ("b", &[200])], 300),
            Read,
            "a",
            None,
            Reply::Int(1),
            Released,
            vec![
                incr("a", -1, 1),
                Effect::Del(tk("a", 2)),
                hdel("a"),
                Effect::Del(tk("a", 1)),
                expire_main(NOW + 200),
            ],
            false,
            None,
        ),
        (
            "a_non_reader_changes_nothing",
            reading(&[("a", &[900])], 900),
            Read,
            "b",
            None,
            Reply::Nil,
            NotHeld,
            vec![],
            false,
            None,
        ),
        (
            "the_writer_counts_down_and_a_lease_rearms_it",
            writing("w", 2, &[], 300),
            Write,
            "w",
            Some(50),
            Reply::Int(0),
            Decremented,
            vec![incr("w:write", -1, 1), expire_main(NOW + 50)],
            false,
            None,
        ),
        (
            "the_writer_leaves_with_message_1",
            writing("w", 1, &[], 300),
            Write,
            "w",
            None,
            Reply::Int(1),
            Released,
            vec![hdel("w:write"), Effect::Del(KeyRef::Main)],
            true,
            Some(READ_UNLOCK_MESSAGE),
        ),
        (
            "the_writer_leaves_its_reads_behind_in_read_mode_and_wakes_readers",
            writing("w", 1, &[80], 300),
            Write,
            "w",
            None,
            Reply::Int(1),
            Released,
            vec![
                hdel("w:write"),
                main_hset("mode", "read"),
                expire_main(NOW + 80),
            ],
            true,
            Some(READ_UNLOCK_MESSAGE),
        ),
        (
            "the_writer_drops_a_read_and_keeps_the_write_lock",
            writing("w", 1, &[80], 300),
            Read,
            "w",
            None,
            Reply::Int(1),
            Released,
            vec![hdel("w"), Effect::Del(tk("w", 1))],
            false,
            None,
        ),
        (
            "a_reader_cannot_release_the_write_side",
            reading(&[("a", &[900])], 900),
            Write,
            "a",
            None,
            Reply::Nil,
            NotHeld,
            vec![],
            false,
            None,
        ),
    ];
    for (name, state, side, owner, lease, reply, outcome, effects, wake, message) in rows {
        let plan = release(&state, K, side, owner.as_bytes(), lease, NOW);
        assert_eq!(
            (
                plan.reply,
                plan.outcome,
                &plan.effects.to_vec(),
                plan.wake,
                plan.message
            ),
            (reply, outcome, &effects, wake, message),
            "{name}"
        );
    }
}

#[test]
fn renew_rearms_every_hold_of_the_owner_on_its_side() {
    let s = reading(&[("a", &[10, 20]), ("b", &[900])], 900);
    let plan = renew(&s, K, Side::Read, b"a", 1000, NOW);
    assert_eq!(plan.reply, Reply::Int(1));
    assert_eq!(
        plan.effects.to_vec(),
        vec![
            Effect::PExpireAt(tk("a", 1), NOW + 1000),
            Effect::PExpireAt(tk("a", 2), NOW + 1000),
            expire_main(NOW + 1000),
        ]
    );
    // A hold whose key already ran out (the owner lives on its other hold) gets its
    // key back.
    let s2 = reading(&[("a", &[-10, 20])], 20);
    assert_eq!(
        renew(&s2, K, Side::Read, b"a", 1000, NOW).effects.to_vec(),
        vec![
            Effect::Set(tk("a", 1), b"1".to_vec().into(), Some(NOW + 1000)),
            Effect::PExpireAt(tk("a", 2), NOW + 1000),
            expire_main(NOW + 1000),
        ]
    );
    assert_eq!(
        renew(&s, K, Side::Write, b"a", 1000, NOW).reply,
        Reply::Int(0)
    );
    assert_eq!(
        renew(&s, K, Side::Read, b"c", 1000, NOW).reply,
        Reply::Int(0)
    );
    let w = writing("w", 1, &[], 300);
    let plan = renew(&w, K, Side::Write, b"w", 1000, NOW);
    assert_eq!(
        (plan.reply, plan.effects.to_vec()),
        (Reply::Int(1), vec![expire_main(NOW + 1000)])
    );
}

#[test]
fn force_release_frees_any_mode_or_only_its_own() {
    let r = reading(&[("a", &[900])], 900);
    let w = writing("w", 3, &[], 300);
    assert_eq!(
        force_release(&r, K, Some(Side::Write), NOW).reply,
        Reply::Int(0)
    );
    assert_eq!(
        force_release(&w, K, Some(Side::Read), NOW).reply,
        Reply::Int(0)
    );
    let plan = force_release(&r, K, Some(Side::Read), NOW);
    assert_eq!(
        (
            plan.reply,
            plan.effects.to_vec(),
            plan.message,
            plan.state.is_free()
        ),
        (
            Reply::Int(1),
            vec![Effect::Del(tk("a", 1)), Effect::Del(KeyRef::Main)],
            Some(UNLOCK_MESSAGE),
            true
        )
    );
    let plan = force_release(&w, K, None, NOW);
    assert_eq!(
        (plan.reply, plan.message),
        (Reply::Int(1), Some(READ_UNLOCK_MESSAGE))
    );
    assert_eq!(
        force_release(&RwState::free(), K, None, NOW).outcome,
        Outcome::NoLock
    );
}

#[test]
fn each_read_hold_ends_at_its_own_lease_while_others_renew() {
    // "dead" stopped renewing at NOW-1; "live" renewed to NOW+900.
    let s = reading(&[("dead", &[-1, -5]), ("live", &[900])], 900);
    let plan = expire(&s, K, NOW);
    assert_eq!(plan.dropped, 1);
    assert_eq!(
        plan.effects.to_vec(),
        vec![
            hdel("dead"),
            Effect::Del(tk("dead", 1)),
            Effect::Del(tk("dead", 2))
        ]
    );
    assert!(!plan.wake, "a reader remains: nobody new can be served");
    // One live hold of an owner keeps it: its lease is its longest hold's.
    let s = reading(&[("a", &[-1, 400])], 400);
    assert_eq!(expire(&s, K, NOW).effects.to_vec(), vec![]);
    // The last reader's lease ends: the lock is freed as by its unlock.
    let s = reading(&[("a", &[0])], 900);
    let plan = expire(&s, K, NOW);
    assert_eq!(
        (plan.wake, plan.message, plan.state),
        (true, Some(UNLOCK_MESSAGE), RwState::free())
    );
    // The writer's own reads end too, the write lock stays.
    let s = writing("w", 1, &[-3], 500);
    let plan = expire(&s, K, NOW);
    assert_eq!(plan.state, writing("w", 1, &[], 500));
    assert!(!plan.wake);
}

#[test]
fn next_deadline_is_the_earliest_lease_end() {
    let s = reading(&[("a", &[40, 70]), ("b", &[20])], 900);
    assert_eq!(s.next_deadline(), Some(NOW + 20));
    assert_eq!(writing("w", 1, &[], 300).next_deadline(), Some(NOW + 300));
    assert_eq!(RwState::free().next_deadline(), None);
    let mut forever = writing("w", 1, &[], 0);
    forever.expire_at = NEVER;
    assert_eq!(forever.next_deadline(), None);
}

#[test]
fn grant_serves_consecutive_readers_and_stops_at_a_writer() {
    let req = |side, owner: &str| Request {
        side,
        owner: owner.into(),
        lease: 100,
    };
    let queue = [
        req(Side::Read, "r1"),
        req(Side::Read, "r2"),
        req(Side::Write, "w"),
        req(Side::Read, "r3"),
    ];
    let mut state = RwState::free();
    let mut served = vec![];
    for r in &queue {
        match grant(&state, K, r, NOW) {
            Some(Ok(plan)) => {
                state = plan.state;
                served.push(r.owner.clone());
            }
            _ => break,
        }
    }
    assert_eq!(served, vec![b"r1".to_vec(), b"r2".to_vec()]);
    // A writer at the head of a write-held lock waits, and so does a reader.
    let w = writing("x", 1, &[], 300);
    assert!(grant(&w, K, &queue[2], NOW).is_none());
    assert!(grant(&w, K, &queue[0], NOW).is_none());
}

#[test]
fn the_message_is_held_back_when_a_writer_took_the_lock() {
    let w = writing("x", 1, &[], 300);
    let r = reading(&[("a", &[900])], 900);
    assert_eq!(message_after_grants(Some(READ_UNLOCK_MESSAGE), &w), None);
    assert_eq!(
        message_after_grants(Some(READ_UNLOCK_MESSAGE), &r),
        Some(READ_UNLOCK_MESSAGE)
    );
    assert_eq!(
        message_after_grants(Some(UNLOCK_MESSAGE), &RwState::free()),
        Some(UNLOCK_MESSAGE)
    );
    assert_eq!(message_after_grants(None, &r), None);
}

#[test]
fn parse_hash_table() {
    let p = |v: &[(&str, &str)]| {
        parse_hash(v.iter().map(|(f, v)| (f.as_bytes().to_vec(), v.as_bytes())))
    };
    let view = p(&[("mode", "write"), ("w:write", "2"), ("w", "1")]).unwrap();
    assert_eq!(view.mode, Mode::Write);
    assert_eq!(
        view.writer,
        Some(Writer {
            owner: b"w".to_vec(),
            count: 2
        })
    );
    assert_eq!(view.readers, vec![(b"w".to_vec(), 1)]);
    assert_eq!(
        view.timeout_keys(b"rw"),
        vec![b"{rw}:w:rwlock_timeout:1".to_vec()]
    );
    assert!(
        p(&[("mode", "read")]).is_ok(),
        "a leftover mode field: freed on sight"
    );
    for (bad, err) in [
        (&[("a", "1")][..], ERR_NOT_A_RWLOCK),
        (&[("mode", "READ"), ("a", "1")], ERR_NOT_A_RWLOCK),
        (&[("mode", "read"), ("a", "0")], ERR_NOT_A_RWLOCK),
        (&[("mode", "read"), ("a", "x")], ERR_NOT_A_RWLOCK),
        (&[("mode", "read"), ("a:write", "1")], ERR_NOT_A_RWLOCK),
        (&[("mode", "write"), ("a", "1")], ERR_NOT_A_RWLOCK),
        (
            &[("mode", "write"), ("a:write", "1"), ("b:write", "1")],
            ERR_NOT_A_RWLOCK,
        ),
        (&[("mode", "read"), ("a", "1025")], ERR_RW_TOO_MANY_HOLDS),
    ] {
        assert_eq!(p(bad), Err(err), "{bad:?}");
    }
}

#[test]
fn into_state_reads_ttls_as_absolute_times() {
    let view = parse_hash([
        (b"mode".to_vec(), &b"read"[..]),
        (b"a".to_vec(), b"2"),
        (b"b".to_vec(), b"1"),
    ])
    .unwrap();
    let state = view.into_state(500, &[100, -2, -1], NOW);
    assert_eq!(state.expire_at, NOW + 500);
    assert_eq!(state.readers[&b"a".to_vec()], vec![NOW + 100, GONE]);
    assert_eq!(state.readers[&b"b".to_vec()], vec![NEVER]);
    assert_eq!(pttl_to_at(-1, NOW), NEVER);
    assert_eq!(pttl_to_at(0, NOW), NOW);
}

#[test]
fn read_holds_report_counts_and_remaining_leases() {
    let mut s = reading(&[("a", &[10, 40]), ("b", &[5])], 40);
    s.readers.insert(b"c".to_vec(), vec![NEVER]);
    assert_eq!(
        s.read_holds(NOW),
        vec![(&b"a"[..], 2, 40), (&b"b"[..], 1, 5), (&b"c"[..], 1, -1)]
    );
}

#[test]
fn only_changes_of_holds_are_remembered_under_a_request_id() {
    assert!(remembers(Outcome::Acquired) && remembers(Outcome::Released));
    assert!(!remembers(Outcome::Contended) && !remembers(Outcome::NotHeld));
    assert!(!remembers(Outcome::Expired) && !remembers(Outcome::Renewed));
}

#[test]
fn parsers_table() {
    let a =
        |v: &[&'static str]| parse_rw_acquire(&v.iter().map(|s| s.as_bytes()).collect::<Vec<_>>());
    let (side, args) = a(&["read", "o", "100", "WAIT", "0"]).unwrap();
    assert_eq!(
        (side, args.owner, args.lease, args.wait),
        (Side::Read, &b"o"[..], 100, Some(0))
    );
    assert_eq!(a(&["WRITE", "o", "5"]).unwrap().0, Side::Write);
    assert_eq!(a(&["both", "o", "5"]).unwrap_err(), ERR_RW_SIDE);
    assert_eq!(
        a(&["READ", "o:write", "5"]).unwrap_err(),
        ERR_RW_OWNER_SUFFIX
    );
    assert_eq!(a(&["READ", "o"]).unwrap_err(), ERR_SYNTAX);
    assert_eq!(
        a(&["READ", "o", "0"]).unwrap_err(),
        crate::vocab::errors::ERR_LEASE
    );
    let r =
        |v: &[&'static str]| parse_rw_release(&v.iter().map(|s| s.as_bytes()).collect::<Vec<_>>());
    assert_eq!(r(&["write", "o", "10"]).unwrap().1.lease, Some(10));
    assert_eq!(r(&["write"]).unwrap_err(), ERR_SYNTAX);
    assert_eq!(
        parse_rw_renew(&[b"READ", b"o", b"10"]),
        Ok((Side::Read, &b"o"[..], 10))
    );
    assert_eq!(parse_rw_renew(&[b"READ", b"o"]), Err(ERR_SYNTAX));
    assert_eq!(parse_rw_force(&[]), Ok(None));
    assert_eq!(parse_rw_force(&[b"write"]), Ok(Some(Side::Write)));
    assert_eq!(parse_rw_force(&[b"x"]), Err(ERR_RW_SIDE));
    assert_eq!(parse_rw_force(&[b"READ", b"x"]), Err(ERR_SYNTAX));
    assert_eq!(
        channel(b"rw"),
        b"redisson_rwlock:{rw}".to_vec(),
        "Redisson's channel"
    );
}
