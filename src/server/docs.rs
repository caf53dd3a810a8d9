//! `COMMAND DOCS` from `commands.json` (the repository root), the one description of every
//! command: summary, since, group, complexity, arguments in the schema `COMMAND DOCS`
//! answers with, and whether it is internal. Embedded at build time and read once at
//! load; `ffi::set_command_docs` hands it to the server (`RedisModule_SetCommandInfo`,
//! where the server has it). Pure: parsing and its checks, no Redis.
//!
//! Layer: in `server` beside the registration it describes; imports nothing of the crate.

use serde_json::{Map, Value};

/// The command table's description, as the repository keeps it.
pub const COMMANDS_JSON: &str = include_str!("../../commands.json");

/// One command's description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandDoc {
    /// Lower case, as registered (`rlock.acquire`).
    pub name: String,
    pub summary: String,
    pub complexity: String,
    pub since: String,
    /// The primitive (`lock`, `rwlock`, ...), `module` or `internal`: commands.json's own
    /// grouping for the reference pages (COMMAND DOCS reports every module command's
    /// group as `module`).
    pub group: String,
    /// Sent only by a primary's stream or an AOF, refused from clients.
    pub internal: bool,
    pub args: Vec<ArgDoc>,
}

/// The kinds of argument `COMMAND DOCS` knows, in the module API's order
/// (`REDISMODULE_ARG_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgType {
    String,
    Integer,
    Double,
    Key,
    Pattern,
    UnixTime,
    PureToken,
    OneOf,
    Block,
}

impl ArgType {
    fn parse(word: &str) -> Option<ArgType> {
        Some(match word {
            "string" => ArgType::String,
            "integer" => ArgType::Integer,
            "double" => ArgType::Double,
            "key" => ArgType::Key,
            "pattern" => ArgType::Pattern,
            "unix-time" => ArgType::UnixTime,
            "pure-token" => ArgType::PureToken,
            "oneof" => ArgType::OneOf,
            "block" => ArgType::Block,
            _ => return None,
        })
    }

    /// Whether the kind holds sub-arguments (and only then).
    fn nests(self) -> bool {
        matches!(self, ArgType::OneOf | ArgType::Block)
    }
}

/// One argument, as `COMMAND DOCS` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgDoc {
    pub name: String,
    pub kind: ArgType,
    /// For a key: its key spec (0: the one the registration's key positions make).
    pub key_spec_index: Option<i32>,
    pub token: Option<String>,
    pub optional: bool,
    pub multiple: bool,
    pub multiple_token: bool,
    pub args: Vec<ArgDoc>,
}

/// Every command of `json`, in its order, or what is wrong with it.
pub fn parse(json: &str) -> Result<Vec<CommandDoc>, String> {
    let root: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let commands = root.as_object().ok_or("commands.json: not an object")?;
    commands
        .iter()
        .map(|(name, v)| command(name, v).map_err(|e| format!("{name}: {e}")))
        .collect()
}

fn command(name: &str, v: &Value) -> Result<CommandDoc, String> {
    let o = v.as_object().ok_or("not an object")?;
    let text = |field: &str| -> Result<String, String> {
        o.get(field)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("no {field}"))
    };
    let args = o.get("arguments").map_or(Ok(Vec::new()), arguments)?;
    Ok(CommandDoc {
        name: name.to_ascii_lowercase(),
        summary: text("summary")?,
        complexity: text("complexity")?,
        since: text("since")?,
        group: text("group")?,
        internal: o.get("internal").and_then(Value::as_bool).unwrap_or(false),
        args,
    })
}

fn arguments(v: &Value) -> Result<Vec<ArgDoc>, String> {
    v.as_array()
        .ok_or("arguments: not an array")?
        .iter()
        .map(|a| {
            a.as_object()
                .ok_or("an argument: not an object".into())
                .and_then(argument)
        })
        .collect()
}

fn argument(o: &Map<String, Value>) -> Result<ArgDoc, String> {
    let name = o
        .get("name")
        .and_then(Value::as_str)
        .ok_or("an argument without a name")?;
    let kind = o
        .get("type")
        .and_then(Value::as_str)
        .and_then(ArgType::parse)
        .ok_or_else(|| format!("{name}: no known type"))?;
    let flags: Vec<&str> = match o.get("flags") {
        None => Vec::new(),
        Some(f) => f
            .as_array()
            .ok_or_else(|| format!("{name}: flags not an array"))?
            .iter()
            .map(|w| {
                w.as_str()
                    .ok_or_else(|| format!("{name}: a flag not a word"))
            })
            .collect::<Result<_, _>>()?,
    };
    if let Some(bad) = flags
        .iter()
        .find(|f| !["optional", "multiple", "multiple_token"].contains(f))
    {
        return Err(format!("{name}: unknown flag {bad}"));
    }
    let key_spec_index = match o.get("key_spec_index") {
        None => None,
        Some(i) => Some(
            i.as_i64()
                .and_then(|i| i32::try_from(i).ok())
                .ok_or_else(|| format!("{name}: key_spec_index not an integer"))?,
        ),
    };
    // The server refuses what it cannot describe: checked here, where a unit test sees it.
    if (kind == ArgType::Key) != key_spec_index.is_some() {
        return Err(format!(
            "{name}: key_spec_index goes with a key, and only a key"
        ));
    }
    let token = o.get("token").and_then(Value::as_str).map(str::to_owned);
    if kind == ArgType::PureToken && token.is_none() {
        return Err(format!("{name}: a pure token needs its token"));
    }
    let args = o.get("arguments").map_or(Ok(Vec::new()), arguments)?;
    if kind.nests() == args.is_empty() {
        return Err(format!(
            "{name}: oneof and block have arguments, and only they"
        ));
    }
    Ok(ArgDoc {
        name: name.to_owned(),
        kind,
        key_spec_index,
        token,
        optional: flags.contains(&"optional"),
        multiple: flags.contains(&"multiple"),
        multiple_token: flags.contains(&"multiple_token"),
        args,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_json_parses() {
        let docs = parse(COMMANDS_JSON).unwrap();
        assert!(docs
            .iter()
            .all(|d| !d.summary.is_empty() && !d.since.is_empty()));
        let acquire = docs.iter().find(|d| d.name == "rlock.acquire").unwrap();
        assert_eq!(acquire.args[0].kind, ArgType::Key);
        assert_eq!(acquire.args[0].key_spec_index, Some(0));
    }

    #[test]
    fn it_refuses_what_the_server_could_not_describe() {
        let cases = [
            // (commands.json, why it is refused)
            (r#"[]"#, "not an object"),
            (
                r#"{"X": {"summary": "s", "since": "1", "group": "g"}}"#,
                "no complexity",
            ),
            (
                r#"{"X": {"summary": "s", "since": "1", "group": "g", "complexity": "O(1)",
                    "arguments": [{"name": "key", "type": "key"}]}}"#,
                "key_spec_index goes with a key",
            ),
            (
                r#"{"X": {"summary": "s", "since": "1", "group": "g", "complexity": "O(1)",
                    "arguments": [{"name": "w", "type": "block"}]}}"#,
                "oneof and block have arguments",
            ),
            (
                r#"{"X": {"summary": "s", "since": "1", "group": "g", "complexity": "O(1)",
                    "arguments": [{"name": "t", "type": "pure-token"}]}}"#,
                "needs its token",
            ),
            (
                r#"{"X": {"summary": "s", "since": "1", "group": "g", "complexity": "O(1)",
                    "arguments": [{"name": "n", "type": "integer", "flags": ["often"]}]}}"#,
                "unknown flag often",
            ),
        ];
        for (json, why) in cases {
            let e = parse(json).unwrap_err();
            assert!(e.contains(why), "{json}: {e}");
        }
    }
}
