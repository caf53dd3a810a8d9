//! The module options: what rlock tells the server about itself at load
//! (`SetModuleOptions`), each bit only where the server knows it. A child of `ffi`.
//!
//! A server turns some of its own features off while any loaded module has not declared
//! that it handles them (docs/internals/server-options.md, for every option and
//! every tested server):
//! - `HANDLE_REPL_ASYNC_LOAD` (Redis 7.0+, Valkey): without it a replica with
//!   `repl-diskless-load swapdb` skips diskless loading. rlock holds nothing on a replica
//!   that a database swapped in under it could leave wrong: a replica refuses every
//!   waiting command (writes are READONLY, RLATCH.AWAIT answers at once), so it has no
//!   queue, no timer and no tracked key; what it applies from its primary while loading is
//!   buffered by the server and applied to the new data.
//! - `HANDLE_ATOMIC_SLOT_MIGRATION` (Valkey 9.0+): without it `CLUSTER MIGRATESLOTS` is
//!   refused on the whole node. rlock's keys are plain hashes, strings and sorted sets,
//!   which the snapshot carries as commands with absolute expiries; what it replicates
//!   names its key in a slot the server can route; waiters on the source are redirected
//!   once their key left (engine/events.rs, server/cluster.rs).
//! - Not declared: `HANDLE_IO_ERRORS`. The server asks it only of modules that register a
//!   data type (diskless loading reads their values); rlock registers none, so diskless
//!   loading is never turned off for it.
//!
//! `SetModuleOptions` replaces the module's options: every bit is set in one call, beside
//! `NO_IMPLICIT_SIGNAL_MODIFIED` (see [`super::signal_modified`]).

use super::*;

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use redis_module::RedisValue;

/// Valkey 9.0's `VALKEYMODULE_OPTIONS_HANDLE_ATOMIC_SLOT_MIGRATION` (not in the
/// redis-module crate's header, and a bit Redis does not define).
const HANDLE_ATOMIC_SLOT_MIGRATION: c_int = 1 << 5;

/// Whether the module declared Valkey's atomic slot migration (and so listens to its
/// event while somebody waits: `events.rs`).
static SLOT_MIGRATION_DECLARED: AtomicBool = AtomicBool::new(false);

pub fn slot_migration_declared() -> bool {
    SLOT_MIGRATION_DECLARED.load(Relaxed)
}

/// What the module declared at load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Declared {
    pub repl_async_load: bool,
    pub atomic_slot_migration: bool,
}

/// The server, as far as the options care: its name and its own version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Server {
    pub valkey: bool,
    pub major: u32,
}

/// Reads the server's name and version from `INFO server` (once, at load): Valkey reports
/// `redis_version:7.2.4` for compatibility and its own in `valkey_version`, so the
/// version alone cannot tell a Valkey 9 from a Redis.
pub fn server(ctx: &Context) -> Option<Server> {
    let text = match ctx.call("INFO", &["server"]) {
        Ok(RedisValue::SimpleString(s)) | Ok(RedisValue::BulkString(s)) => s,
        Ok(RedisValue::StringBuffer(b)) => String::from_utf8_lossy(&b).into_owned(),
        _ => return None,
    };
    Some(parse_server(&text))
}

/// [`server`] on `INFO server`'s text.
pub fn parse_server(info: &str) -> Server {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let valkey = field("server_name") == Some("valkey");
    let version = if valkey {
        field("valkey_version")
    } else {
        field("redis_version")
    };
    let major = version
        .and_then(|v| v.split('.').next()?.parse().ok())
        .unwrap_or(0);
    Server { valkey, major }
}

/// The bits to declare on `server`: none of the feature bits when `announce` is false
/// (`rlock.declare-server-options no`: the server then treats rlock as a module unaware
/// of them, which the tests use to show what each declaration turns on).
pub fn options_for(server: Server, announce: bool) -> (c_int, Declared) {
    let mut bits = raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int;
    let mut declared = Declared::default();
    if announce {
        // Known since Redis 7.0 and in every Valkey; an older server stores the bit unread.
        bits |= raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD as c_int;
        declared.repl_async_load = true;
        if server.valkey && server.major >= 9 {
            bits |= HANDLE_ATOMIC_SLOT_MIGRATION;
            declared.atomic_slot_migration = true;
        }
    }
    (bits, declared)
}

/// Declares the module's options (from init).
pub fn declare_options(ctx: &Context, announce: bool) -> Declared {
    let server = server(ctx).unwrap_or(Server {
        valkey: false,
        major: 0,
    });
    let (bits, declared) = options_for(server, announce);
    unsafe {
        if let Some(set) = raw::RedisModule_SetModuleOptions {
            set(ctx.ctx, bits);
        }
    }
    SLOT_MIGRATION_DECLARED.store(declared.atomic_slot_migration, Relaxed);
    declared
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_reads_the_server_name_and_its_own_version() {
        let valkey =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";
        assert_eq!(
            parse_server(valkey),
            Server {
                valkey: true,
                major: 9
            }
        );
        let redis = "# Server\r\nredis_version:8.2.3\r\nredis_mode:standalone\r\n";
        assert_eq!(
            parse_server(redis),
            Server {
                valkey: false,
                major: 8
            }
        );
        assert_eq!(
            parse_server(""),
            Server {
                valkey: false,
                major: 0
            }
        );
    }

    #[test]
    fn it_declares_slot_migration_on_valkey_9_only() {
        let table = [
            // server, announce, async load declared, atomic slot migration declared
            (
                Server {
                    valkey: true,
                    major: 9,
                },
                true,
                true,
                true,
            ),
            (
                Server {
                    valkey: true,
                    major: 8,
                },
                true,
                true,
                false,
            ),
            (
                Server {
                    valkey: false,
                    major: 9,
                },
                true,
                true,
                false,
            ),
            (
                Server {
                    valkey: false,
                    major: 7,
                },
                true,
                true,
                false,
            ),
            (
                Server {
                    valkey: true,
                    major: 9,
                },
                false,
                false,
                false,
            ),
        ];
        for (server, announce, async_load, asm) in table {
            let (bits, d) = options_for(server, announce);
            assert_eq!(
                (d.repl_async_load, d.atomic_slot_migration),
                (async_load, asm),
                "{server:?}"
            );
            assert_ne!(
                bits & raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED as c_int,
                0
            );
            assert_eq!(bits & HANDLE_ATOMIC_SLOT_MIGRATION != 0, asm);
        }
    }
}
