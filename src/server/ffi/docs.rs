//! Command docs handed to the server: `RedisModule_SetCommandInfo` with what
//! `server::docs` read from commands.json, so that `COMMAND DOCS` (and redis-cli's
//! argument hints) describe every command. A child of `ffi`.
//!
//! Redis 7.0 and Valkey have the call; a server without it (or that refuses one
//! command's docs) gets no docs, logged, and the module loads all the same. The server
//! copies everything it is given, so the strings and arrays built here live only for the
//! call.

use std::ffi::CString;
use std::mem::size_of;

use super::*;
use crate::server::docs::{ArgDoc, ArgType, CommandDoc};

/// What the C structs point into, kept until the server has copied them.
#[derive(Default)]
struct Arena {
    strings: Vec<CString>,
    arrays: Vec<Vec<raw::RedisModuleCommandArg>>,
}

impl Arena {
    /// A C string of `s` (a string with a NUL in it is cut there: commands.json has none).
    fn text(&mut self, s: &str) -> *const c_char {
        let c = CString::new(s.split('\0').next().unwrap_or("")).unwrap_or_default();
        let p = c.as_ptr();
        self.strings.push(c);
        p
    }

    /// `args` as the server reads them: an array ended by an all-zero entry.
    fn args(&mut self, args: &[ArgDoc]) -> *mut raw::RedisModuleCommandArg {
        if args.is_empty() {
            return ptr::null_mut();
        }
        let mut out: Vec<raw::RedisModuleCommandArg> = Vec::with_capacity(args.len() + 1);
        for a in args {
            let subargs = self.args(&a.args);
            let mut flags = 0;
            if a.optional {
                flags |= raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int;
            }
            if a.multiple {
                flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE as c_int;
            }
            if a.multiple_token {
                flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE_TOKEN as c_int;
            }
            out.push(raw::RedisModuleCommandArg {
                name: self.text(&a.name),
                type_: arg_type(a.kind),
                key_spec_index: a.key_spec_index.unwrap_or(-1),
                token: a.token.as_deref().map_or(ptr::null(), |t| self.text(t)),
                summary: ptr::null(),
                since: ptr::null(),
                flags,
                deprecated_since: ptr::null(),
                subargs,
                display_text: ptr::null(),
            });
        }
        // The terminator: the server stops at the first entry without a name.
        out.push(unsafe { std::mem::zeroed() });
        // The heap buffer does not move when the Vec itself is moved into the arena.
        let p = out.as_mut_ptr();
        self.arrays.push(out);
        p
    }
}

fn arg_type(kind: ArgType) -> raw::RedisModuleCommandArgType {
    match kind {
        ArgType::String => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
        ArgType::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
        ArgType::Double => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE,
        ArgType::Key => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
        ArgType::Pattern => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PATTERN,
        ArgType::UnixTime => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME,
        ArgType::PureToken => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
        ArgType::OneOf => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
        ArgType::Block => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK,
    }
}

/// Registers each command's docs (during load, after the commands). Never fails the
/// load: a server without the API, or refusing one command's docs, is logged.
pub fn set_command_docs(ctx: &Context, docs: &[CommandDoc]) {
    let (Some(get), Some(set)) = (unsafe { raw::RedisModule_GetCommand }, unsafe {
        raw::RedisModule_SetCommandInfo
    }) else {
        ctx.log_notice("rlock: this server has no RedisModule_SetCommandInfo: no COMMAND DOCS");
        return;
    };
    let version = raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: size_of::<raw::RedisModuleCommandArg>(),
    };
    for doc in docs {
        let mut arena = Arena::default();
        let name = arena.text(&doc.name);
        let command = unsafe { get(ctx.ctx, name) };
        if command.is_null() {
            ctx.log_warning(&format!(
                "rlock: commands.json names {}, not registered",
                doc.name
            ));
            continue;
        }
        let info = raw::RedisModuleCommandInfo {
            version: &version,
            summary: arena.text(&doc.summary),
            complexity: arena.text(&doc.complexity),
            since: arena.text(&doc.since),
            history: ptr::null_mut(),
            tips: ptr::null(),
            // 0: the arity stays the registration's (-1), so that every call reaches the
            // command and its errors stay the module's own.
            arity: 0,
            // None: the key spec Redis made from the registration's key positions stays
            // (index 0, what a key argument names).
            key_specs: ptr::null_mut(),
            args: arena.args(&doc.args),
        };
        if unsafe { set(command, &info) } != raw::REDISMODULE_OK as c_int {
            ctx.log_warning(&format!(
                "rlock: the server refused the docs of {}",
                doc.name
            ));
        }
    }
}
