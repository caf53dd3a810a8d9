//! Unit tests of the ticket machinery (`machine.rs` and the connection's bookkeeping).

use super::*;

fn args(v: &[Vec<u8>]) -> Vec<String> {
    v.iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

fn lock_cmd(wait: u64) -> redis::Cmd {
    crate::proto::cmd::acquire("k", None, "o:1", 30000, Some(wait), "r1")
}

#[test]
fn it_names_the_channel_like_redissons_prefix_name() {
    assert_eq!(channel(b"lock"), b"rlock_ticket:{lock}".to_vec());
    assert_eq!(channel(b"{app}:lock"), b"rlock_ticket:{app}:lock".to_vec());
}

#[test]
fn it_turns_an_error_note_into_the_servers_error() {
    let e = note_error("MOVED 12 127.0.0.1:7001");
    assert_eq!(e.code(), Some("MOVED"));
    let e = note_error("ERR too many waiters");
    assert_eq!(e.code(), Some("ERR"));
}

#[test]
fn it_adds_async_and_keeps_the_id() {
    let s = Shape::of(&lock_cmd(250)).unwrap();
    assert_eq!(s.key(), b"k");
    assert_eq!(s.id(), "r1");
    assert_eq!(
        args(&s.ticketed(100)),
        [
            "RLOCK.ACQUIRE",
            "k",
            "o:1",
            "30000",
            "WAIT",
            "100",
            "ID",
            "r1",
            "ASYNC"
        ]
    );
    assert_eq!(
        args(&s.look()),
        ["RLOCK.ACQUIRE", "k", "o:1", "30000", "ID", "r1"]
    );
}

#[test]
fn it_adds_an_id_to_the_latch_for_async_only() {
    let mut c = redis::cmd("RLATCH.AWAIT");
    c.arg("l").arg("WAIT").arg(0);
    let s = Shape::of(&c).unwrap();
    let t = args(&s.ticketed(0));
    assert_eq!(t[..5], ["RLATCH.AWAIT", "l", "WAIT", "0", "ASYNC"]);
    assert_eq!(t[5], "ID");
    assert_eq!(t[6], s.id());
    assert_eq!(args(&s.look()), ["RLATCH.AWAIT", "l"]);
}

#[test]
fn it_leaves_commands_without_wait_alone() {
    assert!(Shape::of(&crate::proto::cmd::acquire("k", None, "o", 1, None, "r")).is_none());
    assert!(Shape::of(&redis::cmd("PING")).is_none());
}

#[test]
fn it_counts_down_the_wait_of_a_resend() {
    let s = Shape::of(&lock_cmd(1000)).unwrap();
    assert_eq!(s.wait_left(Duration::from_millis(400)), Some(600));
    assert_eq!(s.wait_left(Duration::from_millis(1000)), None);
    let forever = Shape::of(&lock_cmd(0)).unwrap();
    assert_eq!(forever.wait_left(Duration::from_secs(99)), Some(0));
}

#[test]
fn it_rewrites_the_wait_left_for_a_blocked_wait_taking_over() {
    let cmd_args = |c: redis::Cmd| {
        c.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            })
            .collect::<Vec<_>>()
    };
    let s = Shape::of(&lock_cmd(1000)).unwrap();
    let left = cmd_args(s.rewaited(Duration::from_millis(300)));
    assert_eq!(
        left,
        [
            "RLOCK.ACQUIRE",
            "k",
            "o:1",
            "30000",
            "WAIT",
            "700",
            "ID",
            "r1"
        ]
    );
    let over = cmd_args(s.rewaited(Duration::from_secs(2)));
    assert_eq!(over, ["RLOCK.ACQUIRE", "k", "o:1", "30000", "ID", "r1"]);
    let forever = Shape::of(&lock_cmd(0)).unwrap();
    assert_eq!(cmd_args(forever.rewaited(Duration::from_secs(9)))[5], "0");
}

fn machine(wait: u64, known: bool) -> (Machine, Instant) {
    let now = Instant::now();
    (
        Machine::new(Shape::of(&lock_cmd(wait)).unwrap(), now, known),
        now,
    )
}

fn sent(step: &Step) -> Vec<String> {
    match step {
        Step::Send(a) => args(a),
        other => panic!("expected a send, got {other:?}"),
    }
}

#[test]
fn it_collects_a_grant_with_the_same_id() {
    let (mut m, now) = machine(0, false);
    assert!(sent(&m.start(now)).contains(&"ASYNC".to_owned()));
    m.sent(1);
    let queued = Event::Reply(Ok(Value::SimpleString("QUEUED".into())));
    assert_eq!(m.on(queued, now), Step::Wait);
    assert!(m.outstanding, "a queued ticket is outstanding");
    let collect = sent(&m.on(Event::Note(Note::Granted(Vec::new())), now));
    assert_eq!(collect, ["RLOCK.ACQUIRE", "k", "o:1", "30000", "ID", "r1"]);
    m.sent(1);
    assert_eq!(
        m.on(Event::Reply(Ok(Value::Nil)), now),
        Step::Done(Ok(Value::Nil))
    );
    assert!(!m.outstanding);
    assert!(m.known);
}

#[test]
fn it_takes_an_ordinary_reply_at_once() {
    let (mut m, now) = machine(0, false);
    m.start(now);
    m.sent(1);
    assert_eq!(
        m.on(Event::Reply(Ok(Value::Int(5))), now),
        Step::Done(Ok(Value::Int(5)))
    );
}

#[test]
fn it_takes_a_timeout_message_as_the_reply_of_a_wait_that_ran_out() {
    let (mut m, now) = machine(500, true);
    m.start(now);
    m.sent(1);
    m.on(Event::Reply(Ok(Value::SimpleString("QUEUED".into()))), now);
    // It came a little before the deadline (the server's wait is shorter): the wait
    // still lasts until then, and nothing is sent again if the connection breaks.
    assert_eq!(m.on(Event::Note(Note::Timeout), now), Step::Wait);
    assert!(!m.outstanding, "no orphan: the ticket is known gone");
    assert_eq!(m.on(Event::Lost(1), now), Step::Wait);
    assert_eq!(
        m.expire(Vec::new(), now + Duration::from_millis(500)),
        (Step::Done(Ok(Value::Int(-1))), Leaves::Nothing)
    );
    // At or after the deadline it is the answer at once.
    let (mut late, now) = machine(500, true);
    late.start(now);
    late.sent(1);
    assert_eq!(
        late.on(Event::Note(Note::Timeout), now + Duration::from_millis(500)),
        Step::Done(Ok(Value::Int(-1)))
    );
}

#[test]
fn it_looks_once_after_a_timeout_on_a_connection_sent_again() {
    let (mut m, now) = machine(500, true);
    m.start(now);
    m.sent(1);
    // The old connection may have granted the same id: the collect replays that.
    m.on(Event::Lost(1), now);
    m.sent(2);
    m.on(Event::Reply(Ok(Value::SimpleString("QUEUED".into()))), now);
    let look = sent(&m.on(Event::Note(Note::Timeout), now));
    assert!(!look.contains(&"WAIT".to_owned()) && !look.contains(&"ASYNC".to_owned()));
    m.sent(1);
    assert_eq!(
        m.on(Event::Reply(Ok(Value::Int(80))), now),
        Step::Done(Ok(Value::Int(80)))
    );
}

#[test]
fn it_reports_an_error_note_as_the_servers_error() {
    let (mut m, now) = machine(0, true);
    m.start(now);
    m.sent(1);
    let step = m.on(Event::Note(Note::Error("MOVED 1 h:1".into())), now);
    assert!(matches!(step, Step::Done(Err(_))));
    assert_eq!(m.take_error().unwrap().code(), Some("MOVED"));
}

#[test]
fn it_resends_after_its_connection_is_lost_with_the_wait_left() {
    let (mut m, t0) = machine(1000, true);
    m.start(t0);
    m.sent(3);
    m.on(Event::Reply(Ok(Value::SimpleString("QUEUED".into()))), t0);
    // A connection it never used: nothing of ours was lost.
    assert_eq!(m.on(Event::Lost(2), t0), Step::Wait);
    let again = sent(&m.on(Event::Lost(3), t0 + Duration::from_millis(300)));
    assert_eq!(again[5], "690", "the wait left, TIMEOUT_LEAD_MS sooner");
    assert_eq!(again[7], "r1", "the same id");
    // The wait ran out while disconnected: look once.
    m.sent(4);
    let look = sent(&m.on(Event::Lost(4), t0 + Duration::from_secs(2)));
    assert!(!look.contains(&"WAIT".to_owned()));
}

/// Whether the server takes `ASYNC` is the capability probe's to say (RLOCK.HELLO, on
/// connect): an error reply is the call's error, whatever its text.
#[test]
fn it_reports_an_error_reply_as_the_calls_error_and_never_guesses_from_its_text() {
    let (mut m, now) = machine(0, false);
    m.start(now);
    m.sent(1);
    let step = m.on(Event::Reply(Err(note_error("ERR syntax error"))), now);
    assert!(matches!(step, Step::Done(Err(_))), "{step:?}");
    assert!(m.take_error().is_some());
}

#[test]
fn it_releases_what_an_abandoned_grant_took() {
    let a = |v: &[&str]| v.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
    let packed = |cs: Vec<redis::Cmd>| {
        cs.iter()
            .map(|c| {
                let s = Shape::of(c);
                assert!(s.is_none());
                c.args_iter()
                    .take(4)
                    .map(|x| match x {
                        redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                        _ => String::new(),
                    })
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    let lock = a(&["RLOCK.ACQUIRE", "k", "o", "100", "ID", "r"]);
    assert_eq!(
        packed(undo_commands(&lock, &Value::Nil))[0],
        ["RLOCK.RELEASE", "k", "o", "ID"]
    );
    assert!(
        undo_commands(&lock, &Value::Int(50)).is_empty(),
        "not granted"
    );
    let fenced = a(&["RFENCED.ACQUIRE", "k", "o", "100", "ID", "r"]);
    let tok = Value::Array(vec![Value::Nil, Value::Int(7)]);
    assert_eq!(packed(undo_commands(&fenced, &tok))[0][0], "RLOCK.RELEASE");
    let rw = a(&["RRWLOCK.ACQUIRE", "k", "READ", "o", "100", "ID", "r"]);
    assert_eq!(
        packed(undo_commands(&rw, &Value::Nil))[0],
        ["RRWLOCK.RELEASE", "k", "READ", "o"]
    );
    let sem = a(&["RSEMAPHORE.ACQUIRE", "s", "3", "ID", "r"]);
    assert_eq!(
        packed(undo_commands(&sem, &Value::Int(1)))[0],
        ["RSEMAPHORE.RELEASE", "s", "3", "ID"]
    );
    assert!(undo_commands(&sem, &Value::Int(0)).is_empty());
    let exp = a(&["RPSEMAPHORE.ACQUIRE", "e", "100", "ID", "r"]);
    let ids = Value::Array(vec![
        Value::BulkString(b"aa".to_vec()),
        Value::BulkString(b"bb".to_vec()),
    ]);
    let got = packed(undo_commands(&exp, &ids));
    assert_eq!(got.len(), 2);
    assert_eq!(got[1][..3], ["RPSEMAPHORE.RELEASE", "e", "bb"]);
    assert!(undo_commands(&a(&["RLATCH.AWAIT", "l"]), &Value::Int(1)).is_empty());
}

#[test]
fn it_counts_subscribe_pushes_apart_from_replies() {
    let mut p: VecDeque<Pending> = [
        Pending::Subscribe(2),
        Pending::Reply("r".into()),
        Pending::Unsubscribe(1),
    ]
    .into();
    count_down(&mut p, false);
    assert_eq!(
        p.len(),
        3,
        "an unsubscribe push does not answer a SUBSCRIBE"
    );
    count_down(&mut p, true);
    assert_eq!(p.front(), Some(&Pending::Subscribe(1)));
    count_down(&mut p, true);
    assert_eq!(p.front(), Some(&Pending::Reply("r".into())));
    count_down(&mut p, true);
    assert_eq!(p.len(), 2, "a reply is owed first");
    p.pop_front();
    count_down(&mut p, false);
    assert!(p.is_empty());
}

/// The shape of a lock wait on `key` with request id `id`.
fn shape(key: &str, id: &str) -> Shape {
    Shape::of(&crate::proto::cmd::acquire(
        key,
        None,
        "o:1",
        30000,
        Some(100),
        id,
    ))
    .unwrap()
}

#[test]
fn a_retry_whose_late_grant_was_given_back_waits_under_a_new_id() {
    // The orphan of "f" was granted and its grant given back; the server remembers "f"
    // as granted. The retry must not send "f" again: it would be told "granted" for
    // what was given back (one permit used twice).
    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let t = Tickets::new(&client, WaitMode::Auto, "t1".into()).unwrap();
    let sink: Sink = Arc::new(|_| {});
    lock_ignoring_poison(&t.shared.state).gave_back("f");
    let mut retry = shape("k", "f");
    assert_eq!(t.join(&mut retry, sink.clone(), None), None);
    assert_ne!(retry.id(), "f");
    let sent = args(&retry.ticketed(100));
    assert!(!sent.contains(&"f".to_string()), "{sent:?}");
    assert!(sent.contains(&retry.id().to_string()), "{sent:?}");
    t.leave(retry.id(), None);
    // Only once: a later call that happens to reuse the id is not renewed again.
    let mut again = shape("k", "f");
    t.join(&mut again, sink, None);
    assert_eq!(again.id(), "f");
}

#[test]
fn it_refcounts_channels_and_keeps_orphans_until_their_fate_is_known() {
    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let t = Tickets::new(&client, WaitMode::Auto, "t1".into()).unwrap();
    let sink: Sink = Arc::new(|_| {});
    t.join(&mut shape("k", "a"), sink.clone(), None);
    t.join(&mut shape("k", "b"), sink.clone(), None);
    t.join(&mut shape("j", "c"), sink.clone(), None);
    assert_eq!(t.counts(), (3, 2));
    t.leave("a", None);
    assert_eq!(t.counts(), (2, 2), "k still has b");
    t.leave("b", None);
    assert_eq!(t.counts(), (1, 1), "k unsubscribed");
    // Without a connection nothing can be queued: no orphan is kept.
    t.leave("c", Some((vec![], false)));
    assert_eq!(t.counts(), (0, 0));
    // A retry of the same id takes over its registration without a second reference.
    assert_eq!(t.join(&mut shape("k", "d"), sink.clone(), None), None);
    assert_eq!(t.join(&mut shape("k", "d"), sink.clone(), None), None);
    t.leave("d", None);
    assert_eq!(t.counts(), (0, 0));
    // ... and an orphan's queued ticket, on the current connection.
    t.join(&mut shape("k", "e"), sink.clone(), None);
    {
        let mut st = lock_ignoring_poison(&t.shared.state);
        st.gen = 7;
        let slot = st.waiters.remove("e").unwrap();
        let channel = slot.channel().to_vec();
        st.waiters.insert(
            "e".into(),
            Slot::Orphan {
                channel,
                look: vec![],
                latch: false,
            },
        );
    }
    assert_eq!(t.join(&mut shape("k", "e"), sink, None), Some(7));
    assert_eq!(t.counts(), (1, 1));
    t.leave("e", None);
    assert_eq!(t.counts(), (0, 0));
}

#[test]
fn a_confirm_runs_its_hook_once_taken_back_whenever_the_hook_comes() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let n = Arc::new(AtomicUsize::new(0));
    let hook = |n: &Arc<AtomicUsize>| {
        let n = n.clone();
        move || {
            n.fetch_add(1, Ordering::SeqCst);
        }
    };
    // Hooked before the outcome, then taken back.
    let c = Confirm::default();
    c.on_taken_back(hook(&n));
    assert_eq!(n.load(Ordering::SeqCst), 0);
    c.settle(Outcome::TakenBack);
    assert_eq!(n.load(Ordering::SeqCst), 1);
    // Taken back before the holder hooked on: runs at once.
    let c = Confirm::default();
    c.settle(Outcome::TakenBack);
    c.on_taken_back(hook(&n));
    assert_eq!(n.load(Ordering::SeqCst), 2);
    // Confirmed, before or after: never runs.
    let c = Confirm::default();
    c.on_taken_back(hook(&n));
    c.settle(Outcome::Confirmed);
    assert!(c.is_confirmed());
    let c = Confirm::default();
    c.settle(Outcome::Confirmed);
    c.on_taken_back(hook(&n));
    assert_eq!(n.load(Ordering::SeqCst), 2);
}

/// A held grant's outcome waits for its confirmation; a call whose grant was a reply has
/// nothing to confirm (the semaphore's release waits on this, design.md 5).
#[tokio::test]
async fn an_outcome_waits_for_the_confirmation_of_a_held_grant_only() {
    let c = Confirm::default();
    assert_eq!(c.outcome_now(), Some(Outcome::Confirmed));
    assert_eq!(c.outcome().await, Outcome::Confirmed);
    let c = Arc::new(Confirm::default());
    c.begin(Weak::new(), "r".into());
    assert_eq!(c.outcome_now(), None);
    let waiting = tokio::spawn({
        let c = c.clone();
        async move { c.outcome().await }
    });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished());
    c.settle(Outcome::TakenBack);
    assert_eq!(waiting.await.unwrap(), Outcome::TakenBack);
    assert_eq!(c.outcome_now(), Some(Outcome::TakenBack));
    // A refusal other than TAKENBACK leaves the hold in doubt, not taken back.
    assert_eq!(Outcome::of(&Err(note_error("ERR no"))), Outcome::Doubt);
    assert_eq!(
        Outcome::of(&Err(note_error("TAKENBACK the grant was taken back"))),
        Outcome::TakenBack
    );
    assert_eq!(Outcome::of(&Ok(Value::Nil)), Outcome::Confirmed);
}

#[test]
fn a_lock_waiter_holds_on_its_grant_and_a_fenced_one_collects() {
    let now = Instant::now();
    let mut m = Machine::new(Shape::of(&lock_cmd(5000)).unwrap(), now, true);
    m.hold_on_grant = true;
    m.sent(1);
    assert_eq!(
        m.on(Event::Note(Note::Granted(Vec::new())), now),
        Step::Done(Ok(Value::Nil))
    );
    assert!(!m.outstanding);
    let mut fenced = redis::cmd("RFENCED.ACQUIRE");
    fenced
        .arg("k")
        .arg("o")
        .arg(30_000)
        .arg("WAIT")
        .arg(5000)
        .arg("ID")
        .arg("r1");
    let mut m = Machine::new(Shape::of(&fenced).unwrap(), now, true);
    m.hold_on_grant = true;
    m.sent(1);
    assert!(matches!(
        m.on(Event::Note(Note::Granted(Vec::new())), now),
        Step::Send(_)
    ));
}

#[test]
fn a_late_confirmation_follows_moved_and_ask_and_stays_for_tryagain() {
    let home = redis::Client::open("redis://127.0.0.1:7000/").unwrap();
    assert!(redirection(&note_error("MOVED 12 127.0.0.1:7001")));
    assert!(redirection(&note_error("TRYAGAIN slot busy")));
    assert!(!redirection(&note_error(
        "TAKENBACK the grant was taken back"
    )));
    let addr = |t: &Target| match t {
        Target::Home => "home".to_string(),
        Target::Moved(c) => format!("moved {:?}", c.get_connection_info().addr()),
        Target::Asked(c) => format!("asked {:?}", c.get_connection_info().addr()),
    };
    let moved = Target::Home.after(&note_error("MOVED 12 127.0.0.1:7001"), &home);
    assert!(addr(&moved).starts_with("moved") && addr(&moved).contains("7001"));
    let asked = moved.after(&note_error("ASK 12 127.0.0.1:7002"), &home);
    assert!(addr(&asked).starts_with("asked") && addr(&asked).contains("7002"));
    let stays = asked.after(&note_error("TRYAGAIN try later"), &home);
    assert!(addr(&stays).starts_with("asked") && addr(&stays).contains("7002"));
}

#[test]
fn each_client_draws_its_own_sixteen_hex_digit_tag() {
    let (a, b) = (
        crate::proto::cmd::notify_tag(),
        crate::proto::cmd::notify_tag(),
    );
    for t in [&a, &b] {
        assert_eq!(t.len(), 16, "{t}");
        assert!(
            t.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
            "{t}"
        );
    }
    assert_ne!(a, b);
}

#[test]
fn a_connection_that_notifies_subscribes_the_tagged_channel_and_knows_it_back() {
    let mut st = State {
        tag: "c7f3a9e1".into(),
        ..State::default()
    };
    let key = channel(b"{app}:lock");
    assert_eq!(st.wire(&key), key, "no ticket-notify: the key channel");
    assert_eq!(st.key_channel(&key), key.as_slice());
    st.notify = true;
    assert_eq!(st.wire(&key), b"rlock_ticket:{app}:lock:c7f3a9e1".to_vec());
    assert_eq!(st.key_channel(&st.wire(&key)), key.as_slice());
}

#[test]
fn only_a_ticketed_command_takes_notify() {
    let s = shape("k", "a");
    assert!(s.is_ticketed(&s.ticketed(100)));
    assert!(!s.is_ticketed(&s.look()));
    let mut latch = redis::cmd("RLATCH.AWAIT");
    latch.arg("k").arg("WAIT").arg(1000);
    let l = Shape::of(&latch).unwrap();
    assert!(l.is_ticketed(&l.ticketed(5)) && !l.is_ticketed(&l.look()));
}

#[test]
fn it_asks_the_server_to_end_its_wait_a_little_before_the_clients_deadline() {
    // Table: the wait left (ms) -> the server's wait: 10 ms sooner, at most a quarter.
    for (left, server) in [(0, 0), (1, 1), (3, 3), (20, 15), (40, 30), (1000, 990)] {
        assert_eq!(server_wait(left), server, "left {left}");
    }
    let (mut m, now) = machine(300, true);
    assert_eq!(sent(&m.start(now))[5], "290");
    assert_eq!(m.deadline(), Some(now + Duration::from_millis(300)));
    let (mut forever, now) = machine(0, true);
    assert_eq!(sent(&forever.start(now))[5], "0");
    assert_eq!(forever.deadline(), None);
}

#[test]
fn it_answers_each_commands_not_now_when_its_deadline_comes_first() {
    let cmd = |name: &str| {
        let mut c = redis::cmd(name);
        c.arg("k").arg("o").arg("WAIT").arg(100).arg("ID").arg("r");
        Shape::of(&c).unwrap().ran_out()
    };
    // Table: the command -> its "not now" reply (docs/commands/tickets.md).
    for (name, want) in [
        ("RLOCK.ACQUIRE", Value::Int(-1)),
        ("RRWLOCK.ACQUIRE", Value::Int(-1)),
        (
            "RFENCED.ACQUIRE",
            Value::Array(vec![Value::Int(-1), Value::Nil]),
        ),
        ("RSEMAPHORE.ACQUIRE", Value::Int(0)),
        ("RPSEMAPHORE.ACQUIRE", Value::Nil),
        ("RLATCH.AWAIT", Value::Int(0)),
    ] {
        assert_eq!(cmd(name), want, "{name}");
    }
}

#[test]
fn it_leaves_an_orphan_when_its_deadline_comes_with_the_ticket_queued() {
    let queued = Event::Reply(Ok(Value::SimpleString("QUEUED".into())));
    // Table: the events heard but not read at the deadline -> outcome, what it leaves.
    let cases: Vec<(Vec<Event>, Step, Leaves)> = vec![
        // Nothing heard: still queued.
        (vec![queued], Step::Done(Ok(Value::Int(-1))), Leaves::Orphan),
        // The grant heard, not collected: given back.
        (
            vec![Event::Note(Note::Granted(Vec::new()))],
            Step::Done(Ok(Value::Int(-1))),
            Leaves::Undo,
        ),
        // Its timeout message: nothing left.
        (
            vec![Event::Note(Note::Timeout)],
            Step::Done(Ok(Value::Int(-1))),
            Leaves::Nothing,
        ),
        // An answer heard in time is the answer.
        (
            vec![Event::Reply(Ok(Value::Nil))],
            Step::Done(Ok(Value::Nil)),
            Leaves::Nothing,
        ),
    ];
    for (heard, step, leaves) in cases {
        let (mut m, now) = machine(300, true);
        m.start(now);
        m.sent(1);
        assert_eq!(m.expire(heard, now), (step, leaves));
    }
    // A grant held on its message is the caller's, heard just before the deadline.
    let (mut h, now) = machine(300, true);
    h.hold_on_grant = true;
    h.start(now);
    h.sent(1);
    let (step, leaves) = h.expire(vec![Event::Note(Note::Granted(Vec::new()))], now);
    assert_eq!(
        (step, leaves),
        (Step::Done(Ok(Value::Nil)), Leaves::Nothing)
    );
    assert!(h.held);
    // A collect in flight when the deadline comes: its reply goes to the orphan.
    let (mut c, now) = machine(300, true);
    c.start(now);
    c.sent(1);
    c.on(Event::Note(Note::Granted(Vec::new())), now);
    c.sent(1);
    assert_eq!(c.expire(Vec::new(), now).1, Leaves::Orphan);
}

/// A ticket connection's state (no server) whose writes go to one end of a socket pair;
/// the other end, non-blocking, for [`drain`].
#[cfg(unix)]
fn wired() -> (Tickets, UnixStream) {
    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let t = Tickets::new(&client, WaitMode::Auto, "t1".into()).unwrap();
    let (ours, server) = UnixStream::pair().unwrap();
    server.set_nonblocking(true).unwrap();
    lock_ignoring_poison(&t.shared.state).writer = Some(Stream::Unix(ours));
    (t, server)
}

/// Everything written to `s` so far.
#[cfg(unix)]
fn drain(s: &mut UnixStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// Grant "g", heard on `t`, held by `confirm`: confirming, its confirmation deferred (as
/// `route_note` leaves a held grant).
#[cfg(unix)]
fn hold_back(t: &Tickets, st: &mut State, confirm: &Arc<Confirm>) {
    st.waiters.insert(
        "g".into(),
        Slot::Confirming {
            channel: b"c".to_vec(),
            look: vec![b"RSEMAPHORE.ACQUIRE".to_vec()],
            confirm: confirm.clone(),
        },
    );
    defer_locked(&t.shared, st, b"confirm;");
}

/// A held grant's confirmation waits for the connection's next write and goes out in
/// front of it (one write, so the server reads both at once); with nothing else to send,
/// the flusher writes it alone a moment later.
#[cfg(unix)]
#[test]
fn a_deferred_confirmation_rides_with_the_next_write_or_goes_alone_soon_after() {
    let (t, mut server) = wired();
    let read_all = drain;
    {
        let mut st = lock_ignoring_poison(&t.shared.state);
        defer_locked(&t.shared, &mut st, b"confirm;");
        assert!(read_all(&mut server).is_empty(), "deferred, not written");
        write_locked(&mut st, b"next;");
    }
    assert_eq!(
        read_all(&mut server),
        b"confirm;next;",
        "in front of the next write"
    );
    {
        let mut st = lock_ignoring_poison(&t.shared.state);
        defer_locked(&t.shared, &mut st, b"alone;");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.is_empty() && Instant::now() < deadline {
        std::thread::sleep(CONFIRM_DEFER);
        got = read_all(&mut server);
    }
    assert_eq!(got, b"alone;", "the flusher wrote it");
}

/// A command sent behind a held grant's confirmation goes in the same write while the
/// confirmation is still held back, and only while the grant is being confirmed on that
/// connection (a plain semaphore's release, design.md 5).
#[test]
fn a_command_rides_behind_its_grants_confirmation_only_while_it_is_unanswered() {
    let (t, mut server) = wired();
    let mut read_all = || drain(&mut server);
    let confirm = Arc::new(Confirm::default());
    let release = redis::cmd("PING");
    // Not heard on a ticket connection: nothing rides.
    assert!(confirm.send_behind(&release).is_none());
    confirm.begin(Arc::downgrade(&t.shared), "g".into());
    {
        let mut st = lock_ignoring_poison(&t.shared.state);
        st.pending.push_back(Pending::Reply("g".into()));
        hold_back(&t, &mut st, &confirm);
    }
    let reply = confirm
        .send_behind(&release)
        .expect("the confirmation is out");
    let mut want = b"confirm;".to_vec();
    want.extend_from_slice(&release.get_packed_command());
    assert_eq!(
        read_all(),
        want,
        "one write, the release behind the confirmation"
    );
    {
        let st = lock_ignoring_poison(&t.shared.state);
        assert!(matches!(st.pending.back(), Some(Pending::Command(_))));
    }
    drop(reply);
    // Answered (no longer confirming there): the release goes the usual way.
    lock_ignoring_poison(&t.shared.state).waiters.remove("g");
    assert!(confirm.send_behind(&release).is_none());
}

/// Where the server collects a grant in a release (`release-collects`), a release sent
/// while its grant's confirmation is still held back takes the confirmation's place: the
/// confirmation is never written, the release goes with `COLLECT <id>` (behind a fence
/// deferred in front of the confirmation, which stays), and its reply settles the grant.
/// Not the last thing deferred, or without the feature, it rides behind as before.
#[test]
fn a_release_collects_its_grant_in_place_of_a_held_back_confirmation() {
    let (t, mut server) = wired();
    let mut read_all = || drain(&mut server);
    let release = redis::cmd("RSEMAPHORE.RELEASE");
    // A grant heard on this connection whose confirmation is held back, as `route_note`
    // leaves it: its reply expected last, its bytes last in `deferred`.
    let held_back = |collects: bool, fence: bool| {
        let confirm = Arc::new(Confirm::default());
        confirm.begin(Arc::downgrade(&t.shared), "g".into());
        let mut st = lock_ignoring_poison(&t.shared.state);
        st.collects = collects;
        if fence {
            st.pending.push_back(Pending::Fence);
            st.deferred.extend_from_slice(b"fence;");
        }
        let at = st.deferred.len();
        st.pending.push_back(Pending::Reply("g".into()));
        st.deferred_last = Some(("g".into(), at));
        hold_back(&t, &mut st, &confirm);
        confirm
    };
    let confirm = held_back(true, true);
    let _reply = confirm.send_behind(&release).expect("held back here");
    let mut collecting = release.clone();
    collecting.arg("COLLECT").arg("g");
    let mut want = b"fence;".to_vec();
    want.extend_from_slice(&collecting.get_packed_command());
    assert_eq!(read_all(), want, "no confirmation; the release collects");
    {
        let mut st = lock_ignoring_poison(&t.shared.state);
        assert!(matches!(st.pending.back(), Some(Pending::Collecting(id, _)) if id == "g"));
        assert_eq!(st.deferred_last, None);
        // Its reply settles the grant as the confirmation's would.
        st.pending.clear();
        collected(&t.shared, &mut st, "g", &Ok(Value::Int(1)));
        assert!(st.waiters.is_empty());
    }
    assert_eq!(
        confirm.state.lock().unwrap().outcome,
        Some(Outcome::Confirmed)
    );

    let confirm = held_back(true, false);
    let _reply = confirm.send_behind(&release).expect("held back here");
    read_all();
    {
        let mut st = lock_ignoring_poison(&t.shared.state);
        st.pending.clear();
        let taken = note_error("TAKENBACK the grant was taken back");
        collected(&t.shared, &mut st, "g", &Err(taken));
    }
    assert_eq!(
        confirm.state.lock().unwrap().outcome,
        Some(Outcome::TakenBack)
    );

    // Without the feature: behind the confirmation, in the same write.
    let confirm = held_back(false, false);
    let _reply = confirm.send_behind(&release).expect("held back here");
    let mut want = b"confirm;".to_vec();
    want.extend_from_slice(&release.get_packed_command());
    assert_eq!(read_all(), want);
    let mut st = lock_ignoring_poison(&t.shared.state);
    assert!(matches!(st.pending.back(), Some(Pending::Command(_))));
    st.pending.clear();
    st.waiters.clear();
}
