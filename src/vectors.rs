//! The module's side of the protocol contract in `spec/vectors/` (its README says who
//! reads what): the vectors of what the module itself computes, checked against the
//! module's own functions, so that a vector changed by hand, or a module change the
//! vectors do not follow, fails `cargo test -p rlock`.
//!
//! - `errors.json` against `src/vocab/errors.rs`, both ways: every constant is in the
//!   file with its exact text, and the file names no constant that is gone. The file is
//!   generated from the source: `RLOCK_VECTORS_BLESS=1 cargo test -p rlock vectors`
//!   rewrites it after a deliberate change to the texts (then review the diff: every
//!   client's suite reads it).
//! - `channels.json`: every primitive's channel and the ticket channel of each key, bare
//!   and with the file's `NOTIFY` tag.
//! - `tickets.json`: every message the module writes (`module` cases) and the module's
//!   own reading of every case.
//!
//! Test-only; sits at the crate root because it reads across the primitives' folders.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::engine::ticket;
use crate::vocab::reply::Reply;

fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("spec/vectors")
        .join(name)
}

fn load(name: &str) -> Value {
    let p = path(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn str_of<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} is not a string in {v}"))
}

/// Every `pub const NAME: &str = "...";` of `src/vocab/errors.rs`, read from its source
/// so that a constant added without a vector fails too. The texts are plain literals
/// (no escapes), one or more on the lines up to the `;`.
fn error_constants() -> BTreeMap<String, String> {
    let src = include_str!("vocab/errors.rs");
    let mut out = BTreeMap::new();
    let mut rest = src;
    while let Some(at) = rest.find("pub const ") {
        rest = &rest[at + "pub const ".len()..];
        let name_end = rest.find(':').expect("a constant's type");
        let name = rest[..name_end].trim().to_owned();
        let end = rest.find(';').expect("a constant's end");
        let body = &rest[..end];
        let text: String = body
            .split('"')
            .skip(1)
            .step_by(2)
            .collect::<Vec<_>>()
            .concat();
        assert!(!body.contains('\\'), "{name}: escapes are not read here");
        out.insert(name, text);
        rest = &rest[end..];
    }
    out
}

/// The kind a client gives an error text (spec/vectors/README.md, "errors.json").
fn kind_of(name: &str) -> &'static str {
    match name {
        "ERR_ROLE_CHANGED" => "retry",
        "ERR_WRONGTYPE"
        | "ERR_NOT_A_LOCK"
        | "ERR_NOT_A_RWLOCK"
        | "ERR_NOT_A_TOKEN"
        | "ERR_NOT_A_SEMAPHORE"
        | "ERR_NOT_A_PERMIT_SET"
        | "ERR_NOT_A_LATCH" => "wrong-type",
        "ERR_COUNT_OVERFLOW"
        | "ERR_TOO_MANY_WAITERS"
        | "ERR_RW_READ_HELD"
        | "ERR_RW_TOO_MANY_HOLDS"
        | "ERR_TOKEN_OVERFLOW"
        | "ERR_PERMITS_OVERFLOW"
        | "ERR_LATCH_OVERFLOW"
        | "ERR_TAKEN_BACK" => "refused",
        n if n == "ERR_INTERNAL" || n.ends_with("_INTERNAL") => "internal",
        _ => "argument",
    }
}

/// Which primitive's value a `wrong-type` error is about (`any` for WRONGTYPE).
fn of(name: &str) -> Option<&'static str> {
    Some(match name {
        "ERR_WRONGTYPE" => "any",
        "ERR_NOT_A_LOCK" => "lock",
        "ERR_NOT_A_RWLOCK" => "rwlock",
        "ERR_NOT_A_TOKEN" => "fenced",
        "ERR_NOT_A_SEMAPHORE" => "semaphore",
        "ERR_NOT_A_PERMIT_SET" => "expirable",
        "ERR_NOT_A_LATCH" => "latch",
        _ => return None,
    })
}

fn errors_json(consts: &BTreeMap<String, String>) -> String {
    let old = load("errors.json");
    let q = |s: &str| serde_json::to_string(s).unwrap();
    let mut out = String::from("{\n");
    for head in ["about", "readers"] {
        out += &format!("  {}: {},\n", q(head), q(str_of(&old, head)));
    }
    out += "  \"errors\": [\n";
    let rows: Vec<String> = consts
        .iter()
        .map(|(name, text)| {
            let code = text.split(' ').next().unwrap_or_default();
            let mut row = format!(
                "    {{\"name\": {}, \"code\": {}, \"kind\": {}",
                q(name),
                q(code),
                q(kind_of(name))
            );
            if let Some(of) = of(name) {
                row += &format!(", \"of\": {}", q(of));
            }
            row += &format!(",\n     \"text\": {}}}", q(text));
            row
        })
        .collect();
    out += &rows.join(",\n");
    out += "\n  ]\n}\n";
    out
}

#[test]
fn errors_json_is_every_error_constant_with_its_text() {
    let consts = error_constants();
    assert!(consts.len() > 30, "read {} constants", consts.len());
    // Spot checks that the source reader reads what the compiler compiled.
    use crate::vocab::errors as e;
    assert_eq!(consts["ERR_SYNTAX"], e::ERR_SYNTAX);
    assert_eq!(consts["ERR_NOT_A_RWLOCK"], e::ERR_NOT_A_RWLOCK);
    assert_eq!(consts["ERR_ROLE_CHANGED"], e::ERR_ROLE_CHANGED);
    let want = errors_json(&consts);
    if std::env::var_os("RLOCK_VECTORS_BLESS").is_some() {
        std::fs::write(path("errors.json"), &want).unwrap();
    }
    let file = load("errors.json");
    let rows = file["errors"].as_array().expect("errors");
    let in_file: BTreeMap<&str, &Value> = rows.iter().map(|r| (str_of(r, "name"), r)).collect();
    for (name, text) in &consts {
        let row = in_file.get(name.as_str()).unwrap_or_else(|| {
            panic!("{name} is not in spec/vectors/errors.json (RLOCK_VECTORS_BLESS=1 rewrites it)")
        });
        assert_eq!(
            str_of(row, "text"),
            text,
            "{name}: errors.json differs from errors.rs"
        );
        assert_eq!(
            str_of(row, "code"),
            text.split(' ').next().unwrap(),
            "{name}"
        );
        assert_eq!(str_of(row, "kind"), kind_of(name), "{name}");
        assert_eq!(row["of"].as_str(), of(name), "{name}");
    }
    for name in in_file.keys() {
        assert!(
            consts.contains_key(*name),
            "errors.json names {name}, errors.rs has no such constant"
        );
    }
    assert_eq!(
        std::fs::read_to_string(path("errors.json")).unwrap(),
        want,
        "errors.json is not as generated (RLOCK_VECTORS_BLESS=1 rewrites it)"
    );
}

#[test]
fn channels_json_is_every_primitives_channel() {
    let file = load("channels.json");
    let cases = file["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    let tag = str_of(&file, "notify_tag").as_bytes();
    assert_eq!(
        crate::vocab::args::parse_tag(tag),
        Ok(tag),
        "a tag NOTIFY takes"
    );
    for case in cases {
        let key = str_of(case, "key").as_bytes();
        let computed: [(&str, Vec<u8>); 8] = [
            ("lock", crate::lock::unlock_channel(key)),
            ("fenced", crate::lock::unlock_channel(key)),
            ("rwlock", crate::rwlock::channel(key)),
            ("semaphore", crate::semaphore::channel(key)),
            ("expirable", crate::expirable::channel(key)),
            ("latch", crate::latch::channel(key)),
            ("ticket", ticket::channel(key)),
            ("ticket_notify", ticket::tagged_channel(key, Some(tag))),
        ];
        for (field, got) in computed {
            assert_eq!(
                String::from_utf8(got).unwrap(),
                str_of(case, field),
                "the {field} channel of {:?}",
                str_of(case, "key")
            );
        }
    }
}

#[test]
fn tickets_json_is_what_the_module_writes_and_reads() {
    let file = load("tickets.json");
    let cases = file["cases"].as_array().expect("cases");
    let mut written = 0;
    for case in cases {
        let message = str_of(case, "message").as_bytes();
        let parsed = &case["parsed"];
        // The module's reader (its tests' and the clients' rule) agrees with every case.
        match ticket::parse(message) {
            None => assert!(parsed.is_null(), "the module refuses {case}"),
            Some(p) => {
                assert!(!parsed.is_null(), "the module reads {case}");
                assert_eq!(p.kind, str_of(parsed, "kind").as_bytes(), "{case}");
                assert_eq!(p.id, str_of(parsed, "id").as_bytes(), "{case}");
                assert_eq!(p.owner, str_of(parsed, "owner").as_bytes(), "{case}");
                assert_eq!(p.detail, str_of(parsed, "detail").as_bytes(), "{case}");
            }
        }
        if case["module"].as_bool() == Some(true) {
            let detail = str_of(parsed, "detail");
            let end = match str_of(parsed, "kind") {
                "granted" => ticket::End::Granted(detail.as_bytes()),
                "timeout" => ticket::End::TimedOut,
                "error" => ticket::End::Error(detail),
                other => panic!("the module writes no {other} message"),
            };
            let id = str_of(parsed, "id").as_bytes();
            let owner = str_of(parsed, "owner").as_bytes();
            assert_eq!(ticket::message(end, id, owner), message, "{case}");
            written += 1;
        }
    }
    assert!(written >= 3, "every kind the module writes has a case");
}

/// A JSON reply of `tickets.json`'s `holds` as the module's: null nil, a number an
/// integer, a string a bulk string, an array an array.
fn reply_of(v: &Value) -> Reply {
    match v {
        Value::Null => Reply::Nil,
        Value::Number(n) => Reply::Int(n.as_i64().expect("an i64")),
        Value::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        Value::Array(items) => Reply::Array(items.iter().map(reply_of).collect()),
        other => panic!("no reply reads as {other}"),
    }
}

#[test]
fn tickets_json_holds_are_the_details_the_module_writes() {
    let file = load("tickets.json");
    let mut written = 0;
    for case in file["holds"].as_array().expect("holds") {
        if case["module"].as_bool() == Some(true) {
            let detail = ticket::reply_detail(&reply_of(&case["reply"]));
            assert_eq!(detail, str_of(case, "detail").as_bytes(), "{case}");
            written += 1;
        }
    }
    assert!(
        written >= 4,
        "the fenced lock's and the expirable semaphore's details"
    );
}
