//! The Rust client's reader of the protocol contract, `spec/vectors/` at the repository's
//! root (its README: the format, and who reads what). Each test runs one vector file
//! through the client's own code: the ticket channel, the ticket message parser and what
//! a waiter does with each note, the error kinds; so that a vector changed by hand, or a
//! client change the vectors do not follow, fails `cargo test -p rlock-client --lib`.
//! Test-only.

use std::path::PathBuf;
use std::time::Instant;

use redis::Value;
use serde_json::Value as Json;

use crate::error::Error;
use crate::net::tickets::{channel, parse_message, Event, Machine, Note, Shape, Step};

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
    for case in cases(&load("channels.json"), "cases") {
        let got = channel(s(&case, "key").as_bytes());
        assert_eq!(
            String::from_utf8(got).unwrap(),
            s(&case, "ticket"),
            "{case}"
        );
    }
}

/// What the waiter of a `RLOCK.ACQUIRE ... WAIT` does with a note: `granted` and
/// `collect` both send the command without `WAIT` (the latch's `granted` returns 1),
/// `fail` ends the call with the detail.
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
        (Step::Send(_), false) if *note == Note::Granted => "granted",
        (Step::Send(_), false) => "collect",
        (Step::Done(Err(_)), _) => "fail",
        (other, _) => panic!("{note:?}: {other:?}"),
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
    }
}
