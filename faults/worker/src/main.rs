//! The fault harness's client process (see faults/README.md). One process drives one
//! primitive of rlock through the Rust client crate's public API and records every
//! operation it makes in a history file (JSON lines): an `invoke` line before the call,
//! then `ok`, `fail` (the server definitely did not do it) or `info` (unknown: an error
//! after the retries, a timeout) after it, each with CLOCK_MONOTONIC nanoseconds, which
//! every process on the machine shares, so the checker can order events across
//! processes. The harness (faults/harness.py) starts several of these, injects faults,
//! and runs the checkers (faults/checker) on the files.
//!
//! Under the lock (and the fenced lock) the worker also writes a shared resource on a
//! separate, never-faulted Redis: a plain read-modify-write of a counter, and for the
//! fenced lock a fenced one that the resource refuses when it has seen a higher token.

use std::fs::OpenOptions;
use std::io::{LineWriter, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rlock_client::{
    AcquireOptions, Client, ClientOptions, Error, Mode, ReleaseOutcome, ReplicaSync,
};

const USAGE: &str = "usage: rlock-faults-worker --url URL --primitive lock|fenced|rwlock|semaphore|expirable|latch \
--name KEY --hist FILE --proc N [--resource URL] [--ops N] [--seconds S] [--watchdog-ms MS] \
[--hold-ms MS] [--wait-ms MS] [--permits N] [--latch-count N] [--round-ms MS] [--replica-sync N] \
[--cluster 0|1] [--mode auto|module|scripts]";

/// Reads a resource value (registering the token) unless a higher token was seen.
/// Tokens are compared as decimal strings (length, then text): Lua numbers are doubles
/// and fencing tokens (`now_ms << 16`) need more than 53 bits.
const FENCED_READ: &str = "local m = redis.call('HGET', KEYS[1], 'max') or '0' \
local t = ARGV[1] \
if #t < #m or (#t == #m and t < m) then return -1 end \
redis.call('HSET', KEYS[1], 'max', t) \
return tonumber(redis.call('HGET', KEYS[1], 'value') or '0')";
/// Writes the resource value unless a higher token was seen.
const FENCED_WRITE: &str = "local m = redis.call('HGET', KEYS[1], 'max') or '0' \
local t = ARGV[1] \
if #t < #m or (#t == #m and t < m) then return -1 end \
redis.call('HSET', KEYS[1], 'max', t, 'value', ARGV[2]) \
return 1";

struct Args {
    url: String,
    primitive: String,
    name: String,
    hist: String,
    proc_id: u64,
    resource: Option<String>,
    ops: u64,
    seconds: u64,
    watchdog_ms: u64,
    hold_ms: u64,
    wait_ms: u64,
    permits: u32,
    latch_count: u64,
    round_ms: u64,
    replica_sync: u32,
    /// `--url` names one node of a Redis Cluster: the client routes by slot and follows
    /// MOVED/ASK (the `migrate` nemesis moves the name's slot under it).
    cluster: bool,
    /// How the client talks to the server (docs/scripts-mode.md): the harness's
    /// scripts-mode cells run `auto` against servers without the module, as a managed
    /// service's user would.
    mode: Mode,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        url: String::new(),
        primitive: String::new(),
        name: String::new(),
        hist: String::new(),
        proc_id: 0,
        resource: None,
        ops: 10_000,
        seconds: 60,
        watchdog_ms: 1_000,
        hold_ms: 2,
        wait_ms: 1_000,
        permits: 2,
        latch_count: 3,
        round_ms: 200,
        replica_sync: 0,
        cluster: false,
        mode: Mode::Auto,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "--url" => a.url = v,
            "--primitive" => a.primitive = v,
            "--name" => a.name = v,
            "--hist" => a.hist = v,
            "--proc" => a.proc_id = num(&v)?,
            "--resource" => a.resource = Some(v),
            "--ops" => a.ops = num(&v)?,
            "--seconds" => a.seconds = num(&v)?,
            "--watchdog-ms" => a.watchdog_ms = num(&v)?,
            "--hold-ms" => a.hold_ms = num(&v)?,
            "--wait-ms" => a.wait_ms = num(&v)?,
            "--permits" => a.permits = num(&v)? as u32,
            "--latch-count" => a.latch_count = num(&v)?,
            "--round-ms" => a.round_ms = num(&v)?.max(10),
            "--replica-sync" => a.replica_sync = num(&v)? as u32,
            "--cluster" => a.cluster = num(&v)? != 0,
            "--mode" => {
                a.mode = match v.as_str() {
                    "auto" => Mode::Auto,
                    "module" => Mode::Module,
                    "scripts" => Mode::Scripts,
                    _ => return Err(format!("--mode: auto, module or scripts, not {v}")),
                }
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.url.is_empty() || a.primitive.is_empty() || a.name.is_empty() || a.hist.is_empty() {
        return Err("--url, --primitive, --name and --hist are required".into());
    }
    Ok(a)
}

/// CLOCK_MONOTONIC in nanoseconds: the same clock in every process (Python's
/// `time.monotonic_ns()` reads it too), so histories of several processes merge.
fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// The history file of this process; shared with the lost-signal callbacks, which run
/// on the client's threads. Every line is written at once (LineWriter), so a `kill -9`
/// loses at most the line being written.
#[derive(Clone)]
struct History {
    out: Arc<Mutex<LineWriter<std::fs::File>>>,
    proc_id: u64,
}

impl History {
    fn line(&self, f: &str, kind: &str, extra: &str) {
        let line = format!(
            "{{\"p\":{},\"f\":\"{}\",\"type\":\"{}\",\"t\":{}{}}}\n",
            self.proc_id,
            f,
            kind,
            now_ns(),
            extra
        );
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = out.write_all(line.as_bytes());
    }
    fn invoke(&self, f: &str, extra: &str) {
        self.line(f, "invoke", extra)
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The outcome line of a failed call: `fail` where the server definitely did not do
/// it, `info` (unknown) otherwise.
fn err_line(h: &History, f: &str, e: &Error) {
    let kind = match e {
        Error::NotHeld { .. } => "fail",
        Error::ReplicaSync { .. } => "fail",
        Error::Server { .. } | Error::WrongType(_) | Error::InvalidArgument(_) => "fail",
        _ => "info",
    };
    let why = match e {
        Error::NotHeld { .. } => "notheld".to_string(),
        Error::ReplicaSync { .. } => "replica-sync".to_string(),
        other => format!("{other}"),
    };
    h.line(f, kind, &format!(",\"error\":{}", json_str(&why)));
}

/// A small xorshift generator: the workload's choices need no crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// The shared resource the lock protects, on its own Redis (never faulted by the
/// harness; cut off with the worker only when the worker's namespace is).
struct Resource {
    conn: redis::Connection,
    plain: String,
    fenced: String,
}

impl Resource {
    fn open(url: &str, name: &str) -> Option<Resource> {
        let c = redis::Client::open(url).ok()?;
        let conn = c.get_connection_with_timeout(Duration::from_secs(2)).ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        conn.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
        Some(Resource {
            conn,
            plain: format!("res:plain:{name}"),
            fenced: format!("res:fenced:{name}"),
        })
    }

    /// Plain read-modify-write of the counter, with the hold time between the read and
    /// the write: what an unfenced critical section does.
    fn plain_update(&mut self, h: &History, hold: Duration) {
        h.invoke("write", "");
        let read: redis::RedisResult<Option<i64>> =
            redis::cmd("GET").arg(&self.plain).query(&mut self.conn);
        let v = match read {
            Ok(v) => v.unwrap_or(0),
            Err(e) => {
                return h.line(
                    "write",
                    "fail",
                    &format!(",\"error\":{}", json_str(&e.to_string())),
                )
            }
        };
        std::thread::sleep(hold);
        let w: redis::RedisResult<()> = redis::cmd("SET")
            .arg(&self.plain)
            .arg(v + 1)
            .query(&mut self.conn);
        match w {
            Ok(()) => h.line("write", "ok", &format!(",\"read\":{v},\"wrote\":{}", v + 1)),
            Err(e) => h.line(
                "write",
                "info",
                &format!(",\"read\":{v},\"error\":{}", json_str(&e.to_string())),
            ),
        }
    }

    /// The same update, fenced: the resource refuses a token lower than one it saw.
    fn fenced_update(&mut self, h: &History, token: i64, hold: Duration) {
        h.invoke("fwrite", &format!(",\"token\":{token}"));
        let read: redis::RedisResult<i64> = redis::cmd("EVAL")
            .arg(FENCED_READ)
            .arg(1)
            .arg(&self.fenced)
            .arg(token.to_string())
            .query(&mut self.conn);
        let v = match read {
            Ok(-1) => {
                return h.line(
                    "fwrite",
                    "fail",
                    &format!(",\"token\":{token},\"error\":\"refused\""),
                )
            }
            Ok(v) => v,
            Err(e) => {
                return h.line(
                    "fwrite",
                    "fail",
                    &format!(",\"error\":{}", json_str(&e.to_string())),
                )
            }
        };
        std::thread::sleep(hold);
        let w: redis::RedisResult<i64> = redis::cmd("EVAL")
            .arg(FENCED_WRITE)
            .arg(1)
            .arg(&self.fenced)
            .arg(token.to_string())
            .arg(v + 1)
            .query(&mut self.conn);
        match w {
            Ok(1) => h.line(
                "fwrite",
                "ok",
                &format!(",\"token\":{token},\"read\":{v},\"wrote\":{}", v + 1),
            ),
            Ok(_) => h.line(
                "fwrite",
                "fail",
                &format!(",\"token\":{token},\"error\":\"refused\""),
            ),
            Err(e) => h.line(
                "fwrite",
                "info",
                &format!(",\"token\":{token},\"error\":{}", json_str(&e.to_string())),
            ),
        }
    }
}

fn lost_hook(h: &History) -> impl FnOnce(rlock_client::LostReason) + Send + 'static {
    let h = h.clone();
    move |why| h.line("lost", "event", &format!(",\"why\":\"{why:?}\""))
}

fn main() {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&a.hist)
        .unwrap_or_else(|e| {
            eprintln!("cannot open {}: {e}", a.hist);
            std::process::exit(2)
        });
    let h = History {
        out: Arc::new(Mutex::new(LineWriter::new(file))),
        proc_id: a.proc_id,
    };
    let mut opts = ClientOptions::new()
        .with_mode(a.mode)
        .with_watchdog_timeout(Duration::from_millis(a.watchdog_ms))
        .with_response_timeout(Some(Duration::from_millis(1_500)));
    // The harness's cells say whether replica sync is on (`--replica-sync n`), so the
    // client's default (every connected replica) is not what a "without" cell measures.
    opts = opts.with_replica_sync(
        (a.replica_sync > 0).then(|| ReplicaSync::new(a.replica_sync, Duration::from_millis(500))),
    );
    let opened = if a.cluster {
        redis::cluster::ClusterClient::new(vec![a.url.as_str()])
            .map(|c| Client::from_cluster(c, opts))
            .map_err(|e| e.to_string())
    } else {
        Client::open_with(a.url.as_str(), opts).map_err(|e| e.to_string())
    };
    let client = match opened {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot open {}: {e}", a.url);
            std::process::exit(2);
        }
    };
    let mut rng = Rng(now_ns() as u64 ^ (std::process::id() as u64) << 32 | 1);
    let deadline = now_ns() + a.seconds as i64 * 1_000_000_000;
    let resource = a
        .resource
        .as_deref()
        .and_then(|u| Resource::open(u, &a.name));
    let hold = Duration::from_millis(a.hold_ms);
    let wait = Duration::from_millis(a.wait_ms);
    let done = |ops: u64| ops >= a.ops || now_ns() >= deadline;
    match a.primitive.as_str() {
        "lock" | "fenced" => run_lock(&a, &client, &h, resource, &mut rng, hold, wait, &done),
        "rwlock" => run_rw(&a, &client, &h, &mut rng, hold, wait, &done),
        "semaphore" => run_semaphore(&a, &client, &h, hold, wait, &done),
        "expirable" => run_expirable(&a, &client, &h, hold, wait, &done),
        "latch" => run_latch(&a, &client, &h, &mut rng, &done),
        other => {
            eprintln!("unknown primitive {other}\n{USAGE}");
            std::process::exit(2);
        }
    }
}

/// Lock or fenced lock: acquire (waiting at most `wait`), sometimes re-enter, update
/// the resource, release each hold. One handle, so one owner, per process.
#[allow(clippy::too_many_arguments)]
fn run_lock(
    a: &Args,
    client: &Client,
    h: &History,
    mut resource: Option<Resource>,
    rng: &mut Rng,
    hold: Duration,
    wait: Duration,
    done: &dyn Fn(u64) -> bool,
) {
    let fenced = a.primitive == "fenced";
    let lock = client.lock(a.name.clone());
    let flock = client.fenced_lock(a.name.clone());
    let owner = if fenced {
        flock.owner().to_string()
    } else {
        lock.owner().to_string()
    };
    h.line(
        "start",
        "event",
        &format!(",\"owner\":{}", json_str(&owner)),
    );
    let opts = AcquireOptions::new().with_wait(rlock_client::Wait::Up(wait));
    let mut ops = 0u64;
    while !done(ops) {
        let holds = if rng.chance(25) { 2 } else { 1 };
        let mut guards = Vec::new();
        let mut token = None;
        for _ in 0..holds {
            h.invoke("acquire", "");
            ops += 1;
            let r = if fenced {
                flock.acquire_with(opts).map(|g| {
                    g.map(|g| {
                        let t = g.token();
                        (g.into_guard(), Some(t))
                    })
                })
            } else {
                lock.acquire_with(opts).map(|g| g.map(|g| (g, None)))
            };
            match r {
                Ok(Some((g, t))) => {
                    let tok = t.map(|t| format!(",\"token\":{t}")).unwrap_or_default();
                    h.line("acquire", "ok", &tok);
                    g.on_lost(lost_hook(h));
                    token = t.or(token);
                    guards.push(g);
                }
                Ok(None) => h.line("acquire", "fail", ",\"error\":\"timeout\""),
                Err(e) => err_line(h, "acquire", &e),
            }
        }
        if guards.is_empty() {
            continue;
        }
        if let Some(res) = resource.as_mut() {
            res.plain_update(h, hold);
            ops += 1;
            if let Some(t) = token {
                res.fenced_update(h, t, hold);
                ops += 1;
            }
        } else {
            std::thread::sleep(hold);
        }
        while let Some(g) = guards.pop() {
            h.invoke("release", "");
            ops += 1;
            match g.release() {
                Ok(ReleaseOutcome::Freed) => h.line("release", "ok", ",\"outcome\":\"freed\""),
                Ok(ReleaseOutcome::StillHeld) => h.line("release", "ok", ",\"outcome\":\"still\""),
                Err(e) => err_line(h, "release", &e),
            }
        }
    }
}

/// Read-write lock: a third of the holds are writes.
fn run_rw(
    a: &Args,
    client: &Client,
    h: &History,
    rng: &mut Rng,
    hold: Duration,
    wait: Duration,
    done: &dyn Fn(u64) -> bool,
) {
    let rw = client.rw_lock(a.name.clone());
    h.line(
        "start",
        "event",
        &format!(",\"owner\":{}", json_str(rw.owner())),
    );
    let mut ops = 0u64;
    while !done(ops) {
        let mode = if rng.chance(33) { "write" } else { "read" };
        let half = if mode == "write" {
            rw.write()
        } else {
            rw.read()
        };
        let ex = format!(",\"mode\":\"{mode}\"");
        h.invoke("acquire", &ex);
        ops += 1;
        let g = match half.acquire_timeout(wait) {
            Ok(Some(g)) => {
                h.line("acquire", "ok", &ex);
                g.on_lost(lost_hook(h));
                g
            }
            Ok(None) => {
                h.line("acquire", "fail", ",\"error\":\"timeout\"");
                continue;
            }
            Err(e) => {
                err_line(h, "acquire", &e);
                continue;
            }
        };
        std::thread::sleep(hold);
        h.invoke("release", &ex);
        ops += 1;
        match g.release() {
            Ok(_) => h.line("release", "ok", &ex),
            Err(e) => err_line(h, "release", &e),
        }
    }
}

/// Semaphore (no owners, no leases: Redisson's RSemaphore): acquire one permit, hold,
/// release it.
fn run_semaphore(
    a: &Args,
    client: &Client,
    h: &History,
    hold: Duration,
    wait: Duration,
    done: &dyn Fn(u64) -> bool,
) {
    let sem = client.semaphore(a.name.clone());
    h.line("start", "event", &format!(",\"permits\":{}", a.permits));
    let _ = sem.try_set_permits(a.permits);
    let mut ops = 0u64;
    while !done(ops) {
        h.invoke("acquire", "");
        ops += 1;
        let p = match sem.acquire_timeout(1, wait) {
            Ok(Some(p)) => {
                h.line("acquire", "ok", "");
                p
            }
            Ok(None) => {
                h.line("acquire", "fail", ",\"error\":\"timeout\"");
                continue;
            }
            Err(e) => {
                err_line(h, "acquire", &e);
                continue;
            }
        };
        std::thread::sleep(hold);
        h.invoke("release", "");
        ops += 1;
        match p.release() {
            Ok(n) => h.line("release", "ok", &format!(",\"available\":{n}")),
            Err(e) => err_line(h, "release", &e),
        }
    }
}

/// Permit-expirable semaphore: permits with ids and watchdog leases.
fn run_expirable(
    a: &Args,
    client: &Client,
    h: &History,
    hold: Duration,
    wait: Duration,
    done: &dyn Fn(u64) -> bool,
) {
    let sem = client.expirable_semaphore(a.name.clone());
    h.line("start", "event", &format!(",\"permits\":{}", a.permits));
    let _ = sem.try_set_permits(a.permits);
    let mut ops = 0u64;
    while !done(ops) {
        h.invoke("acquire", "");
        ops += 1;
        let p = match sem.acquire_timeout(None, wait) {
            Ok(Some(p)) => {
                h.line("acquire", "ok", &format!(",\"id\":{}", json_str(p.id())));
                p.on_lost(lost_hook(h));
                p
            }
            Ok(None) => {
                h.line("acquire", "fail", ",\"error\":\"timeout\"");
                continue;
            }
            Err(e) => {
                err_line(h, "acquire", &e);
                continue;
            }
        };
        std::thread::sleep(hold);
        h.invoke("release", "");
        ops += 1;
        match p.release() {
            Ok(()) => h.line("release", "ok", ""),
            Err(e) => err_line(h, "release", &e),
        }
    }
}

/// Countdown latch in rounds of the shared monotonic clock (`round = now / round-ms`),
/// so that a restarted worker joins the current round: each worker sets the count (one
/// wins), counts down once within the round's first quarter, and awaits zero until the
/// round's end.
fn run_latch(a: &Args, client: &Client, h: &History, rng: &mut Rng, done: &dyn Fn(u64) -> bool) {
    h.line("start", "event", &format!(",\"count\":{}", a.latch_count));
    let round_ns = a.round_ms as i64 * 1_000_000;
    let mut ops = 0u64;
    let mut last_round = -1i64;
    while !done(ops) {
        let round = now_ns() / round_ns;
        if round == last_round {
            let next = (round + 1) * round_ns;
            std::thread::sleep(Duration::from_nanos((next - now_ns()).max(0) as u64));
            continue;
        }
        last_round = round;
        let latch = client.latch(format!("{}:{round}", a.name));
        let ex = format!(",\"latch\":{round}");
        h.invoke("set", &ex);
        ops += 1;
        match latch.try_set_count(a.latch_count) {
            Ok(won) => h.line("set", "ok", &format!("{ex},\"won\":{won}")),
            Err(e) => err_line(h, "set", &e),
        }
        std::thread::sleep(Duration::from_millis(rng.next() % (a.round_ms / 4 + 1)));
        h.invoke("countdown", &ex);
        ops += 1;
        match latch.count_down() {
            Ok(n) => h.line("countdown", "ok", &format!("{ex},\"count\":{n}")),
            Err(e) => err_line(h, "countdown", &e),
        }
        h.invoke("await", &ex);
        ops += 1;
        // The wait ends with the round, so that every worker starts each round in step
        // (a wait running into later rounds would leave it out of phase for good).
        let left = ((round + 1) * round_ns - now_ns()).max(1_000_000) as u64;
        match latch.await_timeout(Duration::from_nanos(left)) {
            Ok(true) => h.line("await", "ok", &ex),
            Ok(false) => h.line("await", "fail", &format!("{ex},\"error\":\"timeout\"")),
            Err(e) => err_line(h, "await", &e),
        }
    }
}
