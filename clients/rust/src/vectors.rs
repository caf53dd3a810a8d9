//! The Rust client's reader of the protocol contract, `spec/vectors/` at the repository's
//! root (its README: the format, and who reads what). Each test runs one vector file
//! through the client's own code: the ticket channel (tagged too), the ticket message parser and what
//! a waiter does with each note, the error kinds; so that a vector changed by hand, or a
//! client change the vectors do not follow, fails `cargo test -p rlock-client --lib`.
//! Test-only.

use std::path::PathBuf;
use std::time::Instant;

use redis::Value;
use serde_json::Value as Json;

use crate::error::{Error, Refusal};
use crate::net::tickets::{
    channel, parse_message, tagged_channel, Event, Machine, Note, Shape, Step,
};

fn load(name: &str) -> Json {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../spec/vectors")
        .join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn cases(file: &Json, field: &str) -> Vec<Json> {
    let rows = file[field].as_array().expect(field).clone();
    assert!(!rows.is_empty(), "no {field}");
    rows
}

fn s<'a>(v: &'a Json, field: &str) -> &'a str {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} is not a string in {v}"))
}

#[test]
fn it_names_every_ticket_channel_as_the_vectors_do() {
    let file = load("channels.json");
    let tag = s(&file, "notify_tag");
    for case in cases(&file, "cases") {
        let got = channel(s(&case, "key").as_bytes());
        assert_eq!(
            String::from_utf8(got.clone()).unwrap(),
            s(&case, "ticket"),
            "{case}"
        );
        // The channel of a ticket queued with `NOTIFY tag`.
        assert_eq!(
            String::from_utf8(tagged_channel(&got, tag)).unwrap(),
            s(&case, "ticket_notify"),
            "{case}"
        );
    }
}

/// What the waiter of a `RLOCK.ACQUIRE ... WAIT` does with a note: `granted` and
/// `collect` both send the command without `WAIT` (the latch's `granted` returns 1; a
/// `timeout` answers what that collect would), `fail` ends the call with the detail.
fn then(note: &Note, latch: bool) -> &'static str {
    let mut c = redis::cmd("RLATCH.AWAIT");
    if !latch {
        c = crate::proto::cmd::acquire("k", None, "o", 100, Some(1000), "r1");
    } else {
        c.arg("k").arg("WAIT").arg(1000);
    }
    let now = Instant::now();
    let mut m = Machine::new(Shape::of(&c).unwrap(), now, true);
    let _ = m.start(now);
    m.sent(0);
    match (m.on(Event::Note(note.clone()), now), latch) {
        (Step::Done(Ok(Value::Int(1))), true) => "granted",
        (Step::Send(_), true) => "collect",
        (Step::Send(_), false) if matches!(note, Note::Granted(_)) => "granted",
        (Step::Send(_), false) => "collect",
        // A timeout on the connection that queued the ticket: the reply its collect
        // would get (the wait's "not now") is known without the round trip, given at the
        // wait's deadline.
        (Step::Wait, _) if matches!(note, Note::Timeout) => "collect",
        (Step::Done(Err(_)), _) => "fail",
        (other, _) => panic!("{note:?}: {other:?}"),
    }
}

/// A JSON reply of `tickets.json`'s `holds` as the client reads replies.
fn value_of(v: &Json) -> Value {
    match v {
        Json::Null => Value::Nil,
        Json::Number(n) => Value::Int(n.as_i64().expect("an i64")),
        Json::String(s) => Value::BulkString(s.as_bytes().to_vec()),
        Json::Array(items) => Value::Array(items.iter().map(value_of).collect()),
        other => panic!("no reply reads as {other}"),
    }
}

#[test]
fn it_holds_on_a_granted_message_as_the_vectors_do() {
    for case in cases(&load("tickets.json"), "holds") {
        let verb = s(&case, "command");
        let mut c = redis::cmd(verb);
        c.arg("k");
        match verb {
            "RLOCK.ACQUIRE" | "RFENCED.ACQUIRE" => c.arg("o").arg(30_000),
            "RRWLOCK.ACQUIRE" => c.arg("WRITE").arg("o").arg(30_000),
            "RPSEMAPHORE.ACQUIRE" => c.arg(30_000),
            "RSEMAPHORE.ACQUIRE" => c.arg(1),
            _ => &mut c,
        };
        if case["permits"].as_bool() == Some(true) {
            c.arg("PERMITS").arg(2);
        }
        c.arg("WAIT").arg(0).arg("ID").arg("r1");
        let shape = Shape::of(&c).unwrap();
        let detail = s(&case, "detail").as_bytes();
        let got = shape.hold().reply(detail);
        match s(&case, "then") {
            "hold" => assert_eq!(got, Some(value_of(&case["reply"])), "{case}"),
            _ => assert_eq!(got, None, "{case}"),
        }
        // The waiter that holds does the same on its note: done with that reply, or
        // the collect sent.
        let now = Instant::now();
        let mut m = Machine::new(shape, now, true);
        m.hold_on_grant = true;
        let _ = m.start(now);
        m.sent(0);
        match (m.on(Event::Note(Note::Granted(detail.to_vec())), now), got) {
            (Step::Done(Ok(v)), Some(want)) => assert_eq!(v, want, "{case}"),
            (Step::Send(_), None) if verb != "RLATCH.AWAIT" => {}
            (Step::Done(Ok(Value::Int(1))), None) if verb == "RLATCH.AWAIT" => {}
            (other, _) => panic!("{case}: {other:?}"),
        }
    }
}

#[test]
fn it_reads_every_ticket_message_as_the_vectors_do() {
    for case in cases(&load("tickets.json"), "cases") {
        let got = parse_message(s(&case, "message").as_bytes());
        let parsed = &case["parsed"];
        let Some((note, id)) = got else {
            assert!(parsed.is_null(), "refused, but the vectors read {case}");
            continue;
        };
        assert!(
            !parsed.is_null(),
            "read as {note:?}, but the vectors refuse {case}"
        );
        assert_eq!(id, s(parsed, "id"), "{case}");
        if let Note::Error(detail) = &note {
            assert_eq!(detail, s(parsed, "detail"), "{case}");
        }
        let want = s(&case, "then");
        assert_eq!(then(&note, false), want, "{case}");
        // The latch's await: a grant is the whole answer; anything else as for a lock.
        let latch_want = if want == "granted" { "granted" } else { want };
        assert_eq!(then(&note, true), latch_want, "{case} (latch)");
    }
}

#[test]
fn it_gives_every_module_error_the_vectors_kind() {
    for row in cases(&load("errors.json"), "errors") {
        let text = s(&row, "text");
        let wire = format!("-{text}\r\n");
        let e = match redis::parse_redis_value(wire.as_bytes()).unwrap() {
            Value::ServerError(e) => redis::RedisError::from(e),
            other => panic!("not an error: {other:?}"),
        };
        assert_eq!(e.code(), Some(s(&row, "code")), "{row}");
        let err = Error::from(e);
        assert_eq!(
            err.is_transient(),
            s(&row, "kind") == "retry",
            "{row}: {err:?}"
        );
        match &err {
            Error::WrongType(_) => assert_eq!(s(&row, "code"), "WRONGTYPE", "{row}"),
            Error::Server { code, .. } => assert_eq!(code, s(&row, "code"), "{row}"),
            Error::Redis(_) => assert_eq!(s(&row, "kind"), "retry", "{row}"),
            other => panic!("{row}: {other:?}"),
        }
        assert!(
            err.to_string().contains(text.split_once(' ').unwrap().1),
            "{row}"
        );
        // The module's code words: the client's Refusal falls in the vectors' kind.
        let family = match err.refusal() {
            Some(Refusal::BadArgument) => Some("argument"),
            Some(Refusal::NotThisPrimitive) => Some("wrong-type"),
            Some(Refusal::Internal | Refusal::ModuleBug) => Some("internal"),
            Some(_) => Some("refused"),
            None => None,
        };
        if let Some(family) = family {
            assert_eq!(family, s(&row, "kind"), "{row}");
        }
    }
}

fn words(v: &Json, field: &str) -> Vec<String> {
    v[field]
        .as_array()
        .unwrap_or_else(|| panic!("{field} is not an array in {v}"))
        .iter()
        .map(|w| w.as_str().expect("a word").to_owned())
        .collect()
}

fn strings(args: Vec<Vec<u8>>) -> Vec<String> {
    args.into_iter()
        .map(|a| String::from_utf8(a).unwrap())
        .collect()
}

fn cmd_words(c: &redis::Cmd) -> Vec<String> {
    strings(
        c.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => b"<cursor>".to_vec(),
            })
            .collect(),
    )
}

#[test]
fn it_shapes_every_waiting_command_as_the_vectors_do() {
    for case in cases(&load("commands.json"), "waiting") {
        let mut c = redis::Cmd::new();
        for w in words(&case, "command") {
            c.arg(w);
        }
        let shape = Shape::of(&c).unwrap_or_else(|| panic!("not a waiting command: {case}"));
        let wait_ms = case["wait_ms"].as_u64().expect("wait_ms");
        let with_id = |ws: Vec<String>| -> Vec<String> {
            ws.into_iter()
                .map(|w| if w == "$id" { shape.id().to_owned() } else { w })
                .collect()
        };
        assert_eq!(
            strings(shape.ticketed(wait_ms)),
            with_id(words(&case, "ticketed")),
            "{case}"
        );
        assert_eq!(strings(shape.look()), words(&case, "look"), "{case}");
        if let Some(id) = case["id"].as_str() {
            assert_eq!(shape.id(), id, "{case}");
        }
    }
}

#[test]
fn it_builds_every_command_as_the_vectors_do() {
    use crate::proto::cmd;
    for case in cases(&load("commands.json"), "builders") {
        let side = case["side"].as_str();
        let key = s(&case, "key");
        let lease = case["lease_ms"].as_u64();
        let c = match s(&case, "op") {
            "acquire" => cmd::acquire(
                key,
                side,
                s(&case, "owner"),
                lease.expect("lease_ms"),
                case["wait_ms"].as_u64(),
                s(&case, "id"),
            ),
            "release" => cmd::release(key, side, s(&case, "owner"), lease, s(&case, "id")),
            "renew" => cmd::renew(key, side, s(&case, "owner"), lease.expect("lease_ms")),
            "force_release" => cmd::force_release(key),
            "info" => cmd::info(key),
            op => panic!("no builder for {op}: {case}"),
        };
        assert_eq!(cmd_words(&c), words(&case, "wire"), "{case}");
    }
}

/// A reply of replies.json as the server's value; an integer known within bounds
/// becomes each bound in turn (both must read the same).
fn values(j: &Json) -> Vec<Value> {
    match j {
        Json::Null => vec![Value::Nil],
        Json::Number(n) => vec![Value::Int(n.as_i64().expect("an i64"))],
        Json::String(s) => vec![Value::SimpleString(s.clone())],
        Json::Object(o) => o["between"]
            .as_array()
            .expect("between")
            .iter()
            .map(|b| Value::Int(b.as_i64().expect("a bound")))
            .collect(),
        Json::Array(items) => {
            // Every combination is not needed: each item's bounds, the others' first.
            let each: Vec<Vec<Value>> = items.iter().map(values).collect();
            let first: Vec<Value> = each.iter().map(|v| v[0].clone()).collect();
            let mut out = vec![Value::Array(first.clone())];
            for (i, vs) in each.iter().enumerate() {
                for v in &vs[1..] {
                    let mut a = first.clone();
                    a[i] = v.clone();
                    out.push(Value::Array(a));
                }
            }
            out
        }
        Json::Bool(_) => panic!("no boolean replies: {j}"),
    }
}

/// What the client makes of `reply` to `command`, in replies.json's words.
fn outcome(command: &str, reply: Value) -> String {
    use crate::proto::cmd::{self, Acquired, Released};
    let acquired = |a: Acquired| match a {
        Acquired::Yes => "acquired",
        Acquired::HeldFor(n) => {
            assert!(n == -1 || n > 0, "a PTTL: {n}");
            "held"
        }
    };
    let out = match command {
        "RLOCK.ACQUIRE" | "RRWLOCK.ACQUIRE" if reply == Value::SimpleString("QUEUED".into()) => {
            // A queued ticket's reply: its waiter waits for the ticket's message.
            let mut c = cmd::acquire("k", None, "o", 100, Some(1000), "r1");
            c.arg("ASYNC");
            let now = Instant::now();
            let mut m = Machine::new(Shape::of(&c).unwrap(), now, false);
            let _ = m.start(now);
            m.sent(0);
            match m.on(Event::Reply(Ok(reply)), now) {
                Step::Wait => "queued",
                other => panic!("QUEUED: {other:?}"),
            }
        }
        "RLOCK.ACQUIRE" | "RRWLOCK.ACQUIRE" => acquired(cmd::parse_acquire(reply).unwrap()),
        "RFENCED.ACQUIRE" => match crate::fenced::parse_acquire(reply).unwrap() {
            (Acquired::Yes, Some(token)) if token > 0 => "acquired",
            (a @ Acquired::HeldFor(_), None) => acquired(a),
            other => panic!("{other:?}"),
        },
        "RLOCK.RELEASE" | "RRWLOCK.RELEASE" => match cmd::parse_release(reply).unwrap() {
            Released::Freed => "freed",
            Released::StillHeld => "still-held",
            Released::NotHeld => "not-held",
        },
        "RLOCK.RENEW" | "RRWLOCK.RENEW" => match cmd::parse_renew(reply).unwrap() {
            true => "renewed",
            false => "not-held",
        },
        "RLOCK.FORCERELEASE" => match cmd::parse_force_release(reply).unwrap() {
            true => "force-freed",
            false => "nothing-to-free",
        },
        other => panic!("no reader of {other}'s reply"),
    };
    out.to_owned()
}

#[test]
fn it_reads_every_reply_as_the_vectors_outcome() {
    for case in cases(&load("replies.json"), "cases") {
        let send = words(&case, "send");
        for reply in values(&case["reply"]) {
            assert_eq!(
                outcome(&send[0], reply.clone()),
                s(&case, "outcome"),
                "{case}: {reply:?}"
            );
        }
    }
}

/// `waits.json`'s finding as the handle keeps it: `Some(held)`, or none yet.
fn finding(v: &Json) -> Option<bool> {
    match v.as_str() {
        None => None,
        Some("held") => Some(true),
        Some("free") => Some(false),
        Some(other) => panic!("no finding {other}"),
    }
}

#[test]
fn it_tries_first_as_the_vectors_say() {
    use crate::proto::state::{Contention, CONTENDED_FOR};
    let file = load("waits.json");
    assert_eq!(
        file["contended_for_ms"].as_u64(),
        Some(CONTENDED_FOR.as_millis() as u64)
    );
    for case in cases(&file, "tries_first") {
        let hint = Contention::default();
        let t0 = Instant::now();
        if let Some(held) = finding(&case["found"]) {
            hint.found(held, t0);
        }
        let ago = std::time::Duration::from_millis(case["ago_ms"].as_u64().unwrap_or(0));
        assert_eq!(
            hint.tries_first(t0 + ago),
            case["tries_first"].as_bool().unwrap(),
            "{case}"
        );
    }
}

#[test]
fn it_starts_every_waiting_acquire_as_the_vectors_say() {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::options::{AcquireOptions, ClientOptions, Wait};
    use crate::proto::backoff::Jitter;
    use crate::proto::cmd::Acquired;
    use crate::proto::logic::{Acquiring, Next, Renewals, Route};
    use crate::proto::state::LockShared;

    struct NoRenewals;
    impl Renewals for NoRenewals {
        fn register(&self, _: &Arc<LockShared>, _: u64, _: Duration, _: bool, _: Instant) {}
        fn rearmed(&self, _: u64, _: u64, _: Duration, _: Instant) {}
        fn unregister(&self, _: u64) {}
    }
    let (client, jitter) = (ClientOptions::new(), Jitter::seeded(1));
    for case in cases(&load("waits.json"), "acquires") {
        let shared = Arc::new(LockShared::new("k".into(), "c:1".into(), 1));
        if let Some(held) = finding(&case["before"]) {
            shared.found(held, Instant::now());
        }
        let opts = AcquireOptions::new().with_wait(Wait::Up(Duration::from_secs(5)));
        let mut run = Acquiring::new(&shared, opts, &client, &jitter).unwrap();
        let mut sent = Vec::new();
        for reply in cases(&case, "replies") {
            let (command, route) = run.attempt(&shared, Instant::now());
            let waits = cmd_words(&command).iter().any(|w| w == "WAIT");
            assert_eq!(waits, route != Route::Shared, "{case}");
            sent.push(if waits { "wait" } else { "try" });
            let (answer, queued) = match reply.as_str().unwrap() {
                "taken" | "at_once" => (Acquired::Yes, false),
                "queued" => (Acquired::Yes, true),
                "held" | "timeout" => (Acquired::HeldFor(100), false),
                other => panic!("no reply {other}"),
            };
            match run.after_attempt(&NoRenewals, &shared, Instant::now(), Ok(answer)) {
                Next::Taken => run.found(&shared, queued),
                Next::NotTaken => run.found_held(&shared),
                Next::Again => {}
                _ => panic!("{case}: an unexpected step"),
            }
        }
        let sends = cases(&case, "sends");
        let want: Vec<&str> = sends.iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(sent, want, "{case}");
        let after = finding(&case["after"]).expect("an acquire finds");
        assert_eq!(shared.tries_first(Instant::now()), !after, "{case}");
    }
}
