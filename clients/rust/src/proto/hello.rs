//! The capability probe: what `RLOCK.HELLO` says about the server a connection reached.
//! Every connection that needs a capability (the ticket connection, one per server or
//! cluster node) asks it once, when it connects, and again after each reconnect, so that
//! a failover to a server without the module is noticed; nothing here guesses from error
//! texts. Pure: the command and the reading of its reply, no I/O.

use redis::{RedisError, RedisResult, Value};

/// The protocol version this client speaks (the module's `protocol` field): a server
/// that answers a lower one lacks something this client sends.
pub const PROTOCOL_VERSION: i64 = 1;

/// What the server a connection reached can do.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Capabilities {
    /// The rlock module answered `RLOCK.HELLO`.
    Module(ModuleInfo),
    /// The server does not know `RLOCK.HELLO`: no rlock module (or one older than the
    /// command). Waits then block a connection in the server (`WAIT`), never queue
    /// tickets.
    NoModule,
}

/// The module's answer to `RLOCK.HELLO`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModuleInfo {
    /// The module's version, "major.minor.patch".
    pub version: String,
    /// The wire protocol's version, compared with [`PROTOCOL_VERSION`].
    pub protocol: i64,
    /// Feature words: `tickets`, `ticket-holds`, `request-ids`, one per primitive (`lock`, `fenced`,
    /// `rwlock`, `semaphore`, `permit-expirable-semaphore`, `latch`),
    /// `sharded-channels` in cluster mode.
    pub features: Vec<String>,
    /// The module's `rlock.replication` setting: `commands` or `effects`.
    pub replication: String,
}

impl Capabilities {
    /// Whether the server queues tickets (`WAIT t ASYNC ID id`).
    pub fn tickets(&self) -> bool {
        self.has("tickets")
    }

    /// Whether the server names `feature` among its features.
    pub fn has(&self, feature: &str) -> bool {
        match self {
            Capabilities::Module(m) => {
                m.protocol >= PROTOCOL_VERSION && m.features.iter().any(|f| f == feature)
            }
            Capabilities::NoModule => false,
        }
    }
}

/// The probe's command.
pub(crate) fn hello_args() -> Vec<Vec<u8>> {
    vec![b"RLOCK.HELLO".to_vec()]
}

/// Reads the probe's reply: a map (RESP3) or flat pairs (RESP2), read by field name so
/// that the module may add fields. "unknown command" is [`Capabilities::NoModule`]; any
/// other error (an ACL refusal, a server loading) is the caller's.
pub(crate) fn parse(reply: RedisResult<Value>) -> RedisResult<Capabilities> {
    let v = match reply {
        Ok(v) => v,
        Err(e) if unknown_command(&e) => return Ok(Capabilities::NoModule),
        Err(e) => return Err(e),
    };
    let pairs: Vec<(Value, Value)> = match v {
        Value::Map(pairs) => pairs,
        Value::Array(items) if items.len() % 2 == 0 => {
            let mut it = items.into_iter();
            std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
        }
        other => return Err(malformed(&format!("{other:?}"))),
    };
    let mut info = ModuleInfo {
        version: String::new(),
        protocol: 0,
        features: Vec::new(),
        replication: String::new(),
    };
    for (k, v) in pairs {
        match (text(&k).as_deref(), v) {
            (Some("version"), v) => info.version = text(&v).unwrap_or_default(),
            (Some("protocol"), Value::Int(n)) => info.protocol = n,
            (Some("features"), Value::Array(words) | Value::Set(words)) => {
                info.features = words.iter().filter_map(text).collect()
            }
            (Some("replication"), v) => info.replication = text(&v).unwrap_or_default(),
            _ => {}
        }
    }
    if info.protocol == 0 {
        return Err(malformed("no protocol field"));
    }
    Ok(Capabilities::Module(info))
}

/// The server's standard refusal of a command it does not have.
fn unknown_command(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.to_ascii_lowercase().starts_with("unknown command"))
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn malformed(detail: &str) -> RedisError {
    RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "RLOCK.HELLO answered something else than its map",
        detail.to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn fields() -> Vec<(Value, Value)> {
        vec![
            (
                bulk("features"),
                Value::Array(vec![bulk("tickets"), bulk("lock")]),
            ),
            (bulk("module"), bulk("rlock")),
            (bulk("protocol"), Value::Int(1)),
            (bulk("replication"), bulk("commands")),
            (bulk("version"), bulk("0.1.0")),
            (bulk("a-field-added-later"), Value::Int(7)),
        ]
    }

    #[test]
    fn it_reads_the_resp3_map_and_the_resp2_pairs_alike() {
        let map = parse(Ok(Value::Map(fields()))).unwrap();
        let flat = fields().into_iter().flat_map(|(k, v)| [k, v]).collect();
        assert_eq!(parse(Ok(Value::Array(flat))).unwrap(), map);
        let Capabilities::Module(info) = &map else {
            panic!("{map:?}")
        };
        assert_eq!(info.version, "0.1.0");
        assert_eq!(info.replication, "commands");
        assert!(map.tickets());
        assert!(map.has("lock") && !map.has("latch"));
    }

    /// An error reply as redis-rs reads it off the wire.
    fn server_error(wire: &[u8]) -> RedisResult<Value> {
        redis::Parser::new()
            .parse_value(wire)
            .unwrap()
            .extract_error()
    }

    #[test]
    fn it_takes_an_unknown_command_for_no_module_and_keeps_other_errors() {
        // What a server without the module answers, as redis-rs parses it.
        let caps = parse(server_error(
            b"-ERR unknown command 'RLOCK.HELLO', with args beginning with: \r\n",
        ))
        .unwrap();
        assert_eq!(caps, Capabilities::NoModule);
        assert!(!caps.tickets());
        let noperm =
            server_error(b"-NOPERM User has no permissions to run the 'rlock.hello' command\r\n");
        assert!(
            parse(noperm).is_err(),
            "an ACL refusal is not an absent module"
        );
    }

    #[test]
    fn it_refuses_a_reply_without_a_protocol_and_an_older_protocol_has_no_features() {
        assert!(parse(Ok(Value::Int(1))).is_err());
        assert!(parse(Ok(Value::Map(vec![(bulk("module"), bulk("rlock"))]))).is_err());
        let old = Capabilities::Module(ModuleInfo {
            version: "0.0.1".into(),
            protocol: 0,
            features: vec!["tickets".into()],
            replication: "commands".into(),
        });
        assert!(!old.tickets());
    }
}
