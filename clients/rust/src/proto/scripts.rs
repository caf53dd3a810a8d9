//! Scripts mode's sans-IO part (docs/scripts-mode.md): Redisson's own Lua scripts, its
//! key and channel names, and how a module command's arguments read. `net::scripts` runs
//! the module's commands with these where the module is absent; no I/O here.
//!
//! The scripts are byte-identical copies of the Python client's `rlock/lua/*.lua` (the one
//! source; `tests/server/test_lua_copies.py` fails on a copy that differs), kept inside
//! the crate so that it packages on its own. Every key a script declares shares the
//! name's hash slot (Redisson's hash tags); Redisson's read-lock scripts also touch the
//! per-hold timeout keys, built from a declared prefix that is `{name}:...` as well, so
//! always in the declared keys' slot.

use redis::Value;

/// One of Redisson's scripts: its file name, text and SHA1 (what EVALSHA names), and
/// whether it may be sent again after a failure that may have come after the server
/// received it (`resend`, the table below).
pub(crate) struct Script {
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) name: &'static str,
    pub(crate) text: &'static str,
    pub(crate) resend: Resend,
}

/// Whether a script may be re-sent when its connection broke (or its reply timed out)
/// after the write: without the module there is no request id to make a second run
/// harmless, so only a script whose second run, after an applied first, changes nothing
/// and answers the same may go again (issue 39, docs/scripts-mode.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// A second run is harmless: retried like any transient failure.
    Yes,
    /// Never re-sent after the write: the call fails with `Error::OutcomeUnknown`.
    No,
}

impl Script {
    /// The SHA1 EVALSHA names (redis-rs computes it as the server does).
    pub(crate) fn sha(&self) -> String {
        redis::Script::new(self.text).get_hash().to_owned()
    }
}

macro_rules! scripts {
    ($($id:ident = $file:literal, $resend:ident;)*) => {
        $(pub(crate) const $id: Script = Script {
            name: $file,
            text: include_str!(concat!("../../lua/", $file, ".lua")),
            resend: Resend::$resend,
        };)*
        /// Every script the crate embeds (for the tests).
        #[cfg(test)]
        pub(crate) const ALL: &[Script] = &[$($id),*];
    };
}

// The "may retry" table, the same decisions in every client
// (docs/scripts-mode.md, "Retries").
scripts! {
    LOCK_ACQUIRE = "lock_acquire", No; // HINCRBY: a second run is a second hold
    // Redisson's unlock latch key (named by the release's request id, which every retry
    // sends again) answers a second run what the first answered.
    LOCK_UNLOCK = "lock_unlock", Yes;
    LOCK_RENEW = "lock_renew", Yes; // PEXPIRE only
    LOCK_FORCE_UNLOCK = "lock_force_unlock", No; // a second run answers "was not held"
    FENCED_ACQUIRE_TOKEN = "fenced_acquire_token", No; // INCR of the token, HINCRBY
    READ_ACQUIRE = "read_acquire", No; // HINCRBY, one more timeout key
    READ_UNLOCK = "read_unlock", Yes; // the unlock latch, as LOCK_UNLOCK
    READ_RENEW = "read_renew", Yes; // PEXPIRE only
    READ_FORCE_UNLOCK = "read_force_unlock", No; // a second run answers "was not held"
    WRITE_ACQUIRE = "write_acquire", No; // HINCRBY
    WRITE_UNLOCK = "write_unlock", Yes; // the unlock latch, as LOCK_UNLOCK
    WRITE_FORCE_UNLOCK = "write_force_unlock", No; // a second run answers "was not held"
    SEMAPHORE_TRY_SET = "semaphore_try_set", No; // a second run answers "already set"
    SEMAPHORE_TRY_SET_TTL = "semaphore_try_set_ttl", No; // the same
    SEMAPHORE_ADD = "semaphore_add", No; // SET value + n
    SEMAPHORE_TRY_ACQUIRE = "semaphore_try_acquire", No; // DECRBY
    SEMAPHORE_RELEASE = "semaphore_release", No; // INCRBY
    SEMAPHORE_DRAIN = "semaphore_drain", No; // a second run answers 0: the count is lost
    PES_AVAILABLE = "pes_available", Yes; // a read; expired ids are reclaimed once
    PES_ACQUIRED = "pes_acquired", Yes; // the same
    PES_SET_PERMITS = "pes_set_permits", Yes; // sets to a target: a second run finds it
    PES_ADD = "pes_add", No; // SET value + n
    PES_TRY_ACQUIRE = "pes_try_acquire", No; // DECRBY and ZADD of fresh ids
    PES_RELEASE = "pes_release", No; // a second run answers "not held"
    PES_UPDATE_LEASE = "pes_update_lease", Yes; // ZADD of the same id's expiry
    LATCH_TRY_SET = "latch_try_set", No; // a second run answers "already set"
    LATCH_COUNT_DOWN = "latch_count_down", No; // DECR
    LATCH_DELETE = "latch_delete", No; // a second run answers "was not there"
}

/// How long an unlock's reply is remembered for its retries (Redisson's unlock latch).
pub(crate) const UNLOCK_LATCH_MS: u64 = 10_000;
/// A waiter behind a lease looks again this long after the PTTL its try answered, so
/// that the key has expired by then (the server counts whole milliseconds).
pub(crate) const LEASE_END_MARGIN_MS: u64 = 2;
/// RPermitExpirableSemaphore's score of a permit without a lease.
pub(crate) const NON_EXPIRABLE: i64 = 922_337_203_685_477;
/// Redisson's messages: LockPubSub's unlock (wake one) and read-unlock (wake all).
pub(crate) const UNLOCK_MESSAGE: i64 = 0;
pub(crate) const READ_UNLOCK_MESSAGE: i64 = 1;
/// CountDownLatchPubSub's: the count reached zero / a count was set or deleted.
pub(crate) const ZERO_COUNT_MESSAGE: i64 = 0;
pub(crate) const NEW_COUNT_MESSAGE: i64 = 1;

/// The module's command families: what scripts mode routes.
const FAMILIES: [&[u8]; 6] = [
    b"RLOCK.",
    b"RFENCED.",
    b"RRWLOCK.",
    b"RSEMAPHORE.",
    b"RPSEMAPHORE.",
    b"RLATCH.",
];

/// The command's words, as bytes.
pub(crate) fn words(cmd: &redis::Cmd) -> Vec<Vec<u8>> {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => b.to_vec(),
            _ => b"0".to_vec(), // a scan cursor: no module command has one
        })
        .collect()
}

/// Whether `words` is one of the module's commands (other than the probe).
pub(crate) fn is_module_command(words: &[Vec<u8>]) -> bool {
    words.first().is_some_and(|w| {
        let w = w.to_ascii_uppercase();
        FAMILIES.iter().any(|f| w.starts_with(f)) && w != b"RLOCK.HELLO"
    })
}

// ---- Redisson's names (RedissonObject.prefixName / suffixName) ---------------------------

fn has_brace(name: &[u8]) -> bool {
    name.contains(&b'{')
}

/// `prefix:{name}`, or `prefix:name` when the name has a `{` of its own.
pub(crate) fn prefix_name(prefix: &str, name: &[u8]) -> Vec<u8> {
    let mut out = prefix.as_bytes().to_vec();
    if has_brace(name) {
        out.push(b':');
        out.extend_from_slice(name);
    } else {
        out.extend_from_slice(b":{");
        out.extend_from_slice(name);
        out.push(b'}');
    }
    out
}

/// `{name}:suffix`, or `name:suffix` when the name has a `{` of its own.
pub(crate) fn suffix_name(name: &[u8], suffix: &[u8]) -> Vec<u8> {
    let mut out = key_prefix(name);
    out.push(b':');
    out.extend_from_slice(suffix);
    out
}

/// RedissonReadLock.getKeyPrefix: `{name}` (`name` when it has a `{`).
pub(crate) fn key_prefix(name: &[u8]) -> Vec<u8> {
    if has_brace(name) {
        name.to_vec()
    } else {
        [b"{", name, b"}"].concat()
    }
}

pub(crate) fn lock_channel(name: &[u8]) -> Vec<u8> {
    prefix_name("redisson_lock__channel", name)
}

pub(crate) fn rw_channel(name: &[u8]) -> Vec<u8> {
    prefix_name("redisson_rwlock", name)
}

pub(crate) fn semaphore_channel(name: &[u8]) -> Vec<u8> {
    prefix_name("redisson_sc", name)
}

/// Always braces (RedissonCountDownLatch.getChannelName has no prefixName rule).
pub(crate) fn latch_channel(name: &[u8]) -> Vec<u8> {
    [b"redisson_countdownlatch__channel__{", name, b"}"].concat()
}

pub(crate) fn token_key(name: &[u8]) -> Vec<u8> {
    prefix_name("redisson_lock_token", name)
}

pub(crate) fn timeout_zset(name: &[u8]) -> Vec<u8> {
    suffix_name(name, b"timeout")
}

/// `{name}:<owner>:rwlock_timeout`: read hold n's timeout key is this + `:n`.
pub(crate) fn rw_timeout_prefix(name: &[u8], owner: &[u8]) -> Vec<u8> {
    let mut out = suffix_name(name, owner);
    out.extend_from_slice(b":rwlock_timeout");
    out
}

pub(crate) fn unlock_latch(name: &[u8], request_id: &[u8]) -> Vec<u8> {
    let mut out = prefix_name("redisson_unlock_latch", name);
    out.push(b':');
    out.extend_from_slice(request_id);
    out
}

/// The writer's field of an owner (Redisson's `<uuid>:<thread>:write`).
pub(crate) fn writer(owner: &[u8]) -> Vec<u8> {
    [owner, b":write"].concat()
}

/// The channel a waiter of this (waiting) module command listens on; None for a command
/// that does not wait.
pub(crate) fn channel_of(words: &[Vec<u8>]) -> Option<Vec<u8>> {
    let cmd = words.first()?.to_ascii_uppercase();
    let name = words.get(1)?;
    Some(match cmd.as_slice() {
        b"RLOCK.ACQUIRE" | b"RFENCED.ACQUIRE" => lock_channel(name),
        b"RRWLOCK.ACQUIRE" => rw_channel(name),
        b"RSEMAPHORE.ACQUIRE" | b"RPSEMAPHORE.ACQUIRE" => semaphore_channel(name),
        b"RLATCH.AWAIT" => latch_channel(name),
        _ => return None,
    })
}

/// Whether a message on `channel` wakes one waiter of the client rather than all: a
/// lock's or read lock's unlock message (`0`, Redisson's LockPubSub UNLOCK_MESSAGE).
pub(crate) fn wakes_one(channel: &[u8], payload: &[u8]) -> bool {
    payload == b"0"
        && (channel.starts_with(b"redisson_lock__channel:")
            || channel.starts_with(b"redisson_rwlock:"))
}

/// `RLOCK.RENEW` / `RRWLOCK.RENEW` as one EVAL (not EVALSHA: it goes in a pipeline, after
/// which nothing could resend it on NOSCRIPT): the watchdog's rounds and replica sync.
pub(crate) fn renew_eval(words: &[Vec<u8>]) -> redis::Cmd {
    let (script, keys, args) = renew_script(words);
    let mut c = redis::cmd("EVAL");
    c.arg(script.text).arg(keys.len()).arg(keys).arg(args);
    c
}

pub(crate) fn renew_script(words: &[Vec<u8>]) -> (&'static Script, Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let verb = words[0].to_ascii_uppercase();
    if verb == b"RLOCK.RENEW" {
        let a = Args::parse(words, 3);
        return (
            &LOCK_RENEW,
            vec![a.at(0).to_vec()],
            vec![a.at(2).to_vec(), a.at(1).to_vec()],
        );
    }
    let a = Args::parse(words, 4);
    let (name, owner, lease) = (a.at(0), a.at(2), a.at(3));
    if a.at(1).eq_ignore_ascii_case(b"READ") {
        let keys = vec![name.to_vec(), key_prefix(name)];
        return (
            &READ_RENEW,
            keys,
            vec![lease.to_vec(), b"1".to_vec(), owner.to_vec()],
        );
    }
    (
        &LOCK_RENEW,
        vec![name.to_vec()],
        vec![lease.to_vec(), writer(owner)],
    )
}

/// A renewal's reply as the module gives it (`read_renew` answers a list of one).
pub(crate) fn renew_reply(v: Value) -> Value {
    match v {
        Value::Array(mut items) if items.len() == 1 => items.remove(0),
        v => v,
    }
}

// ---- a module command's arguments -----------------------------------------------------------

const OPTIONS: [&[u8]; 5] = [b"ID", b"WAIT", b"ASYNC", b"PERMITS", b"PX"];

/// A module command read: its verb (upper case), positional arguments (at least
/// `fixed` of them, before any option) and options.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Args {
    pub(crate) verb: Vec<u8>,
    pub(crate) pos: Vec<Vec<u8>>,
    pub(crate) id: Option<Vec<u8>>,
    pub(crate) wait: Option<Vec<u8>>,
    pub(crate) permits: Option<Vec<u8>>,
    pub(crate) px: Option<Vec<u8>>,
}

impl Args {
    pub(crate) fn parse(words: &[Vec<u8>], fixed: usize) -> Args {
        let mut a = Args {
            verb: words
                .first()
                .map(|w| w.to_ascii_uppercase())
                .unwrap_or_default(),
            ..Args::default()
        };
        let rest = words.get(1..).unwrap_or_default();
        let mut i = 0;
        while i < rest.len() && (i < fixed || !is_option(&rest[i])) {
            a.pos.push(rest[i].clone());
            i += 1;
        }
        while i < rest.len() {
            let word = rest[i].to_ascii_uppercase();
            if word == b"ASYNC" {
                i += 1;
                continue;
            }
            let value = rest.get(i + 1).cloned().unwrap_or_default();
            match word.as_slice() {
                b"ID" => a.id = Some(value),
                b"WAIT" => a.wait = Some(value),
                b"PERMITS" => a.permits = Some(value),
                b"PX" => a.px = Some(value),
                _ => {}
            }
            i += 2;
        }
        a
    }

    /// Positional argument `i` (empty if missing: the script or the server refuses it).
    pub(crate) fn at(&self, i: usize) -> &[u8] {
        self.pos.get(i).map(Vec::as_slice).unwrap_or_default()
    }

    /// Positional argument `i` as an integer.
    pub(crate) fn int(&self, i: usize) -> Option<i64> {
        parse_int(self.at(i))
    }
}

fn is_option(w: &[u8]) -> bool {
    let w = w.to_ascii_uppercase();
    OPTIONS.contains(&w.as_slice())
}

pub(crate) fn parse_int(b: &[u8]) -> Option<i64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// How many positional arguments a waiting command has before its options.
pub(crate) fn fixed_of(words: &[Vec<u8>]) -> usize {
    let verb = words
        .first()
        .map(|w| w.to_ascii_uppercase())
        .unwrap_or_default();
    match verb.as_slice() {
        b"RLOCK.ACQUIRE" | b"RFENCED.ACQUIRE" => 3,
        b"RRWLOCK.ACQUIRE" => 4,
        b"RSEMAPHORE.ACQUIRE" | b"RPSEMAPHORE.ACQUIRE" => 2,
        _ => 1,
    }
}

/// Whether a waiting command's reply ends the wait (the module's meaning).
pub(crate) fn granted(verb: &[u8], reply: &Value) -> bool {
    match verb {
        b"RLOCK.ACQUIRE" | b"RRWLOCK.ACQUIRE" => matches!(reply, Value::Nil),
        b"RFENCED.ACQUIRE" => {
            matches!(reply, Value::Array(a) if matches!(a.first(), Some(Value::Nil)))
        }
        b"RPSEMAPHORE.ACQUIRE" => !matches!(reply, Value::Nil),
        _ => matches!(reply, Value::Int(1)), // RSEMAPHORE.ACQUIRE, RLATCH.AWAIT
    }
}

/// A permit count as the module takes it (0 to 2^31 - 1): Redisson's client refuses a
/// negative count before its script runs, the module before it writes.
pub(crate) fn valid_permits(b: &[u8]) -> bool {
    parse_int(b).is_some_and(|n| (0..=i64::from(i32::MAX)).contains(&n))
}

/// A permit id (32 hex digits) as the 16 bytes Redisson's zset holds.
pub(crate) fn raw_permit_id(hex: &[u8]) -> Option<Vec<u8>> {
    if hex.len() != 32 {
        return None;
    }
    hex.chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok())
        .collect()
}

/// 16 raw bytes as the 32 hex digits the client's API gives out.
pub(crate) fn hex(raw: &[u8]) -> String {
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// When a permit with `lease_ms` (negative: none) taken at `now_ms` expires.
pub(crate) fn expiry(lease_ms: i64, now_ms: i64) -> i64 {
    if lease_ms < 0 {
        NON_EXPIRABLE
    } else {
        now_ms + lease_ms
    }
}

/// `pes_try_acquire`'s reply: taken, not taken with the first permit's expiry (the
/// `:<ms>` string), or not taken with no expiry to wait for.
pub(crate) fn pes_outcome(reply: &Value) -> (bool, Option<i64>) {
    let bytes = match reply {
        Value::Okay => return (true, None),
        Value::SimpleString(s) => s.as_bytes().to_vec(),
        Value::BulkString(b) => b.clone(),
        _ => return (false, None),
    };
    if bytes == b"OK" {
        return (true, None);
    }
    let at = bytes
        .strip_prefix(b":")
        .and_then(|r| std::str::from_utf8(r).ok())
        .and_then(|s| s.parse::<f64>().ok());
    (false, at.map(|f| f as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_names_keys_and_channels_as_redisson_does() {
        // (name, lock channel, timeout zset, read timeout prefix of owner "o", latch channel)
        let rows: &[(&str, &str, &str, &str, &str)] = &[
            (
                "k",
                "redisson_lock__channel:{k}",
                "{k}:timeout",
                "{k}:o:rwlock_timeout",
                "redisson_countdownlatch__channel__{k}",
            ),
            (
                "{a}b",
                "redisson_lock__channel:{a}b",
                "{a}b:timeout",
                "{a}b:o:rwlock_timeout",
                "redisson_countdownlatch__channel__{{a}b}",
            ),
        ];
        for (name, chan, zset, prefix, latch) in rows {
            let n = name.as_bytes();
            assert_eq!(lock_channel(n), chan.as_bytes());
            assert_eq!(timeout_zset(n), zset.as_bytes());
            assert_eq!(rw_timeout_prefix(n, b"o"), prefix.as_bytes());
            assert_eq!(latch_channel(n), latch.as_bytes());
        }
        assert_eq!(unlock_latch(b"k", b"r1"), b"redisson_unlock_latch:{k}:r1");
        assert_eq!(token_key(b"k"), b"redisson_lock_token:{k}");
    }

    #[test]
    fn it_reads_positional_arguments_and_options() {
        let w = |s: &str| {
            s.split(' ')
                .map(|x| x.as_bytes().to_vec())
                .collect::<Vec<_>>()
        };
        let a = Args::parse(&w("rlock.acquire k o 500 WAIT 0 ASYNC ID r"), 3);
        assert_eq!(a.verb, b"RLOCK.ACQUIRE");
        assert_eq!(a.pos, vec![b"k".to_vec(), b"o".to_vec(), b"500".to_vec()]);
        assert_eq!(a.wait.as_deref(), Some(&b"0"[..]));
        assert_eq!(a.id.as_deref(), Some(&b"r"[..]));
        // An owner named like an option is still positional.
        let a = Args::parse(&w("RLOCK.RELEASE k ID ID r"), 2);
        assert_eq!(a.pos, vec![b"k".to_vec(), b"ID".to_vec()]);
        assert_eq!(a.id.as_deref(), Some(&b"r"[..]));
    }

    #[test]
    fn it_tells_module_commands_and_waiting_channels() {
        let w = |s: &str| {
            s.split(' ')
                .map(|x| x.as_bytes().to_vec())
                .collect::<Vec<_>>()
        };
        assert!(is_module_command(&w("RSEMAPHORE.ACQUIRE s 1")));
        assert!(!is_module_command(&w("RLOCK.HELLO 1")));
        assert!(!is_module_command(&w("GET k")));
        assert_eq!(
            channel_of(&w("RLATCH.AWAIT l WAIT 5")).unwrap(),
            latch_channel(b"l")
        );
        assert_eq!(channel_of(&w("RLOCK.RELEASE k o")), None);
        assert!(wakes_one(b"redisson_lock__channel:{k}", b"0"));
        assert!(!wakes_one(b"redisson_rwlock:{k}", b"1"));
        assert!(!wakes_one(b"redisson_sc:{k}", b"0"));
    }

    #[test]
    fn it_reads_permit_replies_and_ids() {
        assert_eq!(
            pes_outcome(&Value::BulkString(b"OK".to_vec())),
            (true, None)
        );
        assert_eq!(
            pes_outcome(&Value::BulkString(b":1700".to_vec())),
            (false, Some(1700))
        );
        assert_eq!(pes_outcome(&Value::Nil), (false, None));
        let raw = raw_permit_id(b"00ff10").is_none();
        assert!(raw);
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(hex(&raw_permit_id(id.as_bytes()).unwrap()), id);
        assert!(valid_permits(b"0") && valid_permits(b"2147483647"));
        assert!(!valid_permits(b"-1") && !valid_permits(b"2147483648") && !valid_permits(b"x"));
    }

    #[test]
    fn it_embeds_every_script() {
        for s in ALL {
            assert!(s.text.contains("redis.call"), "{} is a script", s.name);
            assert_eq!(s.sha().len(), 40);
        }
    }
}
