//! `RLOCK.HELLO`: what this module is and what it can do, asked once per connection by
//! the clients instead of guessing from error texts (docs/commands: "Capabilities").
//!
//! Layer: in `server` because its answer is about the server (cluster mode, the
//! replication setting); it names the primitives only as feature words, never imports
//! them. The words are pure ([`features`]) so that a unit test pins them.

use redis_module::redisvalue::RedisValueKey;
use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::server::{ffi, guard};

/// The module's name, as `MODULE LIST` shows it.
pub const MODULE_NAME: &str = "rlock";

/// The wire protocol's version, an integer a client compares (`>=`): raised when a
/// command, a reply or a ticket message changes in a way an older client would misread.
/// Adding a feature word does not raise it.
pub const PROTOCOL_VERSION: i64 = 1;

/// The feature words every build of this module has: tickets (`WAIT t ASYNC ID id`),
/// `ticket-holds` (a `granted` message means held: an unconfirmed grant outlives its
/// connection by `rlock.ticket-confirm-ms`, then its id answers `TAKENBACK`; design.md 5),
/// `ticket-notify` (`NOTIFY tag`: a ticket's messages on its own channel, design.md 5),
/// `ticket-quiet` (`QUIET`: a queued ticket gets no reply, design.md 5),
/// `release-collects` (a release's `COLLECT grant-id` collects the ticket grant it gives
/// back, design.md 5), request ids (`ID id` replays), and one word per primitive.
const ALWAYS: [&str; 12] = [
    "tickets",
    "ticket-holds",
    "ticket-notify",
    "ticket-quiet",
    "release-collects",
    "request-ids",
    "lock",
    "fenced",
    "rwlock",
    "semaphore",
    "permit-expirable-semaphore",
    "latch",
];

/// The feature words of a server: `ALWAYS`, plus `sharded-channels` in cluster mode
/// (messages go out with SPUBLISH to the key's shard, so a client listens with
/// SSUBSCRIBE on the key's node).
pub fn features(cluster: bool) -> Vec<&'static str> {
    let mut words = ALWAYS.to_vec();
    if cluster {
        words.push("sharded-channels");
    }
    words
}

/// The `rlock.replication` setting's word.
pub fn replication_word(commands_mode: bool) -> &'static str {
    if commands_mode {
        "commands"
    } else {
        "effects"
    }
}

/// RLOCK.HELLO
///
/// A map under RESP3, flat pairs under RESP2, keys in sorted order: `features` (an array
/// of words), `module` ("rlock"), `protocol` (an integer), `replication` ("commands" or
/// "effects"), `version` (the module's version, "major.minor.patch"). Clients read it by
/// key, never by position, so that fields can be added.
pub fn hello(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        if args.len() != 1 {
            return Err(RedisError::WrongArity);
        }
        let cluster = ctx.get_flags().contains(ContextFlags::CLUSTER);
        let text = |s: &str| RedisValue::BulkString(s.to_owned());
        let words = features(cluster).into_iter().map(text).collect();
        let field = |name: &str| RedisValueKey::String(name.to_owned());
        Ok(RedisValue::OrderedMap(
            [
                (field("module"), text(MODULE_NAME)),
                (field("version"), text(env!("CARGO_PKG_VERSION"))),
                (field("protocol"), RedisValue::Integer(PROTOCOL_VERSION)),
                (field("features"), RedisValue::Array(words)),
                (
                    field("replication"),
                    text(replication_word(ffi::commands_mode())),
                ),
            ]
            .into_iter()
            .collect(),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_names_sharded_channels_only_in_cluster_mode() {
        assert!(!features(false).contains(&"sharded-channels"));
        assert!(features(true).contains(&"sharded-channels"));
        // Every primitive and both ways of waiting, on any server.
        for cluster in [false, true] {
            for word in ALWAYS {
                assert!(features(cluster).contains(&word), "{word}");
            }
        }
    }
}
