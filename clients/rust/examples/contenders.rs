//! Contention across processes (issue 40's numbers for the Rust client; `make bench-rust`):
//! contender processes loop acquire / give back (an empty critical section) on one lock or
//! on a 4-permit semaphore, for four ways of waiting side by side on one server:
//!
//! - `tickets`: this client's default, a queued ticket per wait, told of its grant on its
//!   own tagged channel (`NOTIFY`, design.md 5);
//! - `blocking`: the same module commands with a blocked `WAIT` per waiting call
//!   (`WaitMode::Blocking`), the machine's floor: the server hands over inside one command;
//! - `scripts`: Redisson's algorithm (its Lua scripts and pub/sub: this client's scripts
//!   mode, docs/scripts-mode.md);
//! - `setnx`: polling `SET key token NX PX`, a try every 1 to 5 ms (random), released by
//!   a compare-and-delete script; the semaphore: 4 such keys, tried in random order.
//!
//! Each process stamps every hold with the wall clock; the parent puts the stamps of all
//! processes in one order and counts owner changes (a hold whose process differs from the
//! one before), acquisitions, the p50 and p99 wait (asking to holding; a wait cut by the
//! end of the run counts as its length so far), Jain's index over the processes'
//! acquisitions, the connections the server had mid-run and its CPU time (INFO cpu) per
//! acquisition over the measured window, which starts once every process has connected.
//!
//! ```text
//! cargo run --release -p rlock-client --example contenders -- bench <redis-server> <module.so> [seconds] [report.md]
//! cargo run --release -p rlock-client --example contenders -- <redis-url> <client> <lock|semaphore> <procs> <seconds>
//! ```
//!
//! `bench` starts its own servers (the module loaded; a second one with AOF on, fsync
//! every second) and writes its table between the `bench-rust` markers of the report.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rlock_client::{Client, ClientOptions, Mode, WaitMode};

const CLIENTS: [&str; 4] = ["tickets", "blocking", "scripts", "setnx"];
const PERMITS: u32 = 4;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64
}

/// A small xorshift generator for the pollers' jitter (no dependency for a bench).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// One contender's way to take and give back its hold.
trait Contender {
    /// Holds within `wait`, or `None`.
    fn take(&mut self, wait: Duration) -> Result<Option<Box<dyn FnOnce()>>, String>;
}

struct RlockLock(rlock_client::Lock);

impl Contender for RlockLock {
    fn take(&mut self, wait: Duration) -> Result<Option<Box<dyn FnOnce()>>, String> {
        let g = self.0.acquire_timeout(wait).map_err(|e| e.to_string())?;
        Ok(g.map(|g| Box::new(move || drop(g.release())) as Box<dyn FnOnce()>))
    }
}

struct RlockSemaphore(rlock_client::Semaphore);

impl Contender for RlockSemaphore {
    fn take(&mut self, wait: Duration) -> Result<Option<Box<dyn FnOnce()>>, String> {
        let p = self.0.acquire_timeout(1, wait).map_err(|e| e.to_string())?;
        Ok(p.map(|p| Box::new(move || drop(p.release())) as Box<dyn FnOnce()>))
    }
}

/// Polling `SET NX PX` on `keys` (one for the lock, 4 for the semaphore).
struct SetNx {
    conn: std::rc::Rc<std::cell::RefCell<redis::Connection>>,
    keys: Vec<String>,
    token: String,
    rng: Rng,
}

const CAS_DEL: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

impl Contender for SetNx {
    fn take(&mut self, wait: Duration) -> Result<Option<Box<dyn FnOnce()>>, String> {
        let until = Instant::now() + wait;
        loop {
            let start = (self.rng.next() % self.keys.len() as u64) as usize;
            for i in 0..self.keys.len() {
                let key = self.keys[(start + i) % self.keys.len()].clone();
                let ok: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg(&self.token)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query(&mut *self.conn.borrow_mut())
                    .map_err(|e| e.to_string())?;
                if ok.is_some() {
                    let (conn, token) = (self.conn.clone(), self.token.clone());
                    return Ok(Some(Box::new(move || {
                        let _: redis::RedisResult<i64> = redis::cmd("EVAL")
                            .arg(CAS_DEL)
                            .arg(1)
                            .arg(&key)
                            .arg(&token)
                            .query(&mut *conn.borrow_mut());
                    })));
                }
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_micros(1000 + self.rng.next() % 4000));
        }
    }
}

fn contender(
    url: &str,
    client: &str,
    primitive: &str,
    key: &str,
) -> Result<Box<dyn Contender>, Box<dyn std::error::Error>> {
    if client == "setnx" {
        let keys = if primitive == "lock" {
            vec![key.to_owned()]
        } else {
            (0..PERMITS).map(|i| format!("{key}:{i}")).collect()
        };
        return Ok(Box::new(SetNx {
            conn: std::rc::Rc::new(std::cell::RefCell::new(
                redis::Client::open(url)?.get_connection()?,
            )),
            keys,
            token: format!("{}:{}", std::process::id(), now_us()),
            rng: Rng(now_us() | 1),
        }));
    }
    let opts = ClientOptions::new().with_replica_sync(None);
    let opts = match client {
        "tickets" => opts
            .with_mode(Mode::Module)
            .with_wait_mode(WaitMode::Tickets),
        "blocking" => opts
            .with_mode(Mode::Module)
            .with_wait_mode(WaitMode::Blocking),
        "scripts" => opts.with_mode(Mode::Scripts),
        other => return Err(format!("no client {other}").into()),
    };
    let c = Client::open_with(url, opts)?;
    Ok(if primitive == "lock" {
        Box::new(RlockLock(c.lock(key)))
    } else {
        Box::new(RlockSemaphore(c.semaphore(key)))
    })
}

/// One contender process: connects, says `ready`, waits for the start (`start_us`),
/// loops for `seconds`, then prints `W <wait µs>...` and `S <stamp µs>...`.
fn child(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let [url, client, primitive, key, start_us, seconds] = args else {
        return Err("child: bad arguments".into());
    };
    let mut c = contender(url, client, primitive, key)?;
    let start: u64 = start_us.parse()?;
    let end = start + seconds.parse::<u64>()? * 1_000_000;
    println!("ready");
    let now = now_us();
    if now < start {
        std::thread::sleep(Duration::from_micros(start - now));
    }
    let (mut waits, mut stamps) = (Vec::new(), Vec::new());
    loop {
        let t = now_us();
        if t >= end {
            break;
        }
        let held = c.take(Duration::from_micros(end - t))?;
        let got = now_us();
        waits.push(got - t);
        let Some(give_back) = held else { break };
        stamps.push(got);
        give_back();
    }
    let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
    println!("W {}", join(&waits));
    println!("S {}", join(&stamps));
    Ok(())
}

/// A row of the table.
struct Row {
    changes: f64,
    acquisitions: f64,
    p50_ms: f64,
    p99_ms: f64,
    jain: f64,
    connections: usize,
    cpu_us: f64,
}

fn cpu_seconds(admin: &mut redis::Connection) -> Result<f64, redis::RedisError> {
    let info: String = redis::cmd("INFO").arg("cpu").query(admin)?;
    Ok(info
        .lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            (k == "used_cpu_sys" || k == "used_cpu_user").then(|| v.parse::<f64>().ok())?
        })
        .sum())
}

fn run(
    url: &str,
    client: &str,
    primitive: &str,
    procs: usize,
    seconds: u64,
) -> Result<Row, Box<dyn std::error::Error>> {
    let key = format!("bench:{client}:{primitive}:{procs}:{}", now_us());
    let mut admin = redis::Client::open(url)?.get_connection()?;
    if primitive == "semaphore" && client != "setnx" {
        let mode = if client == "scripts" {
            Mode::Scripts
        } else {
            Mode::Module
        };
        let c = Client::open_with(url, ClientOptions::new().with_mode(mode))?;
        c.semaphore(key.as_str()).try_set_permits(PERMITS)?;
    }
    let exe = std::env::current_exe()?;
    // Start far enough ahead for every process to connect (64 on a loaded machine).
    let start = now_us() + 3_000_000 + procs as u64 * 50_000;
    let mut children: Vec<Child> = (0..procs)
        .map(|_| {
            Command::new(&exe)
                .arg("child")
                .args([url, client, primitive, &key])
                .arg(start.to_string())
                .arg(seconds.to_string())
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut readers: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().expect("piped")))
        .collect();
    for r in &mut readers {
        let mut line = String::new();
        r.read_line(&mut line)?;
        if line.trim() != "ready" {
            return Err(format!("a contender did not start: {line:?}").into());
        }
    }
    if now_us() > start {
        return Err("the contenders connected after the start: raise the lead".into());
    }
    std::thread::sleep(Duration::from_micros(start - now_us()));
    let cpu0 = cpu_seconds(&mut admin)?;
    std::thread::sleep(Duration::from_micros(seconds * 500_000));
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut admin)?;
    let connections = list.lines().count() - 1;
    let end = start + seconds * 1_000_000;
    let left = end.saturating_sub(now_us());
    std::thread::sleep(Duration::from_micros(left));
    let cpu1 = cpu_seconds(&mut admin)?;
    let (mut waits, mut stamps, mut shares) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (mut r, mut ch)) in readers.into_iter().zip(children).enumerate() {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut r, &mut text)?;
        let status = ch.wait()?;
        if !status.success() {
            return Err(format!("a {client} contender failed: {status}").into());
        }
        let mut n = 0.0;
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("W") => waits.extend(words.map(|w| w.parse::<u64>().unwrap_or(0))),
                Some("S") => {
                    for w in words {
                        stamps.push((w.parse::<u64>()?, i));
                        n += 1.0;
                    }
                }
                _ => {}
            }
        }
        shares.push(n);
    }
    stamps.sort_unstable();
    let changes = stamps.windows(2).filter(|w| w[0].1 != w[1].1).count();
    waits.sort_unstable();
    let pct = |p: usize| {
        waits
            .get(waits.len().saturating_sub(1) * p / 100)
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    };
    let total: f64 = shares.iter().sum();
    let squares: f64 = shares.iter().map(|x| x * x).sum();
    let jain = if squares > 0.0 {
        total * total / (shares.len() as f64 * squares)
    } else {
        0.0
    };
    let secs = seconds as f64;
    Ok(Row {
        changes: changes as f64 / secs,
        acquisitions: total / secs,
        p50_ms: pct(50),
        p99_ms: pct(99),
        jain,
        connections,
        cpu_us: if total > 0.0 {
            (cpu1 - cpu0) * 1e6 / total
        } else {
            f64::NAN
        },
    })
}

/// A server of its own on a free port, killed on drop.
struct Server {
    child: Child,
    port: u16,
    _dir: std::path::PathBuf,
}

impl Server {
    fn start(bin: &str, module: &str, aof: bool) -> Result<Server, Box<dyn std::error::Error>> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = std::env::temp_dir().join(format!("rlock-contenders-{port}"));
        std::fs::create_dir_all(&dir)?;
        let mut cmd = Command::new(bin);
        cmd.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .arg("--dir")
        .arg(&dir)
        .args(["--loadmodule", module])
        .args(["--appendonly", if aof { "yes" } else { "no" }])
        .stdout(Stdio::null());
        let child = cmd.spawn()?;
        let s = Server {
            child,
            port,
            _dir: dir,
        };
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let ping = redis::Client::open(s.url().as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if ping.is_ok() {
                return Ok(s);
            }
            if Instant::now() > until {
                return Err("the server did not start".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

fn line(primitive: &str, procs: usize, client: &str, aof: bool, r: &Row) -> String {
    let name = if aof {
        format!("{client} (AOF on)")
    } else {
        client.to_owned()
    };
    format!(
        "| {primitive} | {procs} | {name} | {:.0} | {:.0} | {:.2} | {:.2} | {:.3} | {} | {:.1} |",
        r.changes, r.acquisitions, r.p50_ms, r.p99_ms, r.jain, r.connections, r.cpu_us
    )
}

fn bench(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let (bin, module) = match args {
        [bin, module, ..] => (bin.as_str(), module.as_str()),
        _ => {
            return Err(
                "usage: contenders bench <redis-server> <module.so> [seconds] [report.md]".into(),
            )
        }
    };
    let seconds: u64 = args.get(2).map_or(Ok(5), |s| s.parse())?;
    let report = args.get(3);
    let version = Command::new(bin).arg("--version").output()?.stdout;
    let version = String::from_utf8_lossy(&version).trim().to_owned();
    let load_start = loadavg();
    let mut rows = Vec::new();
    let mut ratios = Vec::new();
    let plain = Server::start(bin, module, false)?;
    for primitive in ["lock", "semaphore"] {
        for procs in [1, 8, 64] {
            let mut got = Vec::new();
            for client in CLIENTS {
                let r = run(&plain.url(), client, primitive, procs, seconds)?;
                let l = line(primitive, procs, client, false, &r);
                eprintln!("{l}");
                rows.push(l);
                got.push(r);
            }
            let (t, b, s, n) = (&got[0], &got[1], &got[2], &got[3]);
            let x = |a: f64, b: f64| {
                if b > 0.0 {
                    format!("{:.1}x", a / b)
                } else {
                    "∞".into()
                }
            };
            // One contender never changes owner: its acquisitions/s instead.
            let rate = |r: &Row| {
                if procs == 1 {
                    r.acquisitions
                } else {
                    r.changes
                }
            };
            ratios.push(format!(
                "| {primitive} | {procs} | {} | {} | {} | {} | {} | {} |",
                x(rate(t), rate(s)),
                x(rate(t), rate(n)),
                x(rate(t), rate(b)),
                x(s.p99_ms, t.p99_ms),
                x(n.p99_ms, t.p99_ms),
                x(t.cpu_us, s.cpu_us),
            ));
        }
    }
    drop(plain);
    let aof = Server::start(bin, module, true)?;
    for client in CLIENTS {
        let r = run(&aof.url(), client, "lock", 8, seconds)?;
        let l = line("lock", 8, client, true, &r);
        eprintln!("{l}");
        rows.push(l);
    }
    drop(aof);
    let load_end = loadavg();
    let mut out = String::new();
    out.push_str(&format!(
        "{version}, module release build, {seconds} s measured per row (after every process \
         connected), one run; load average {load_start} at the start, {load_end} at the end \
         (2 cores shared with other work: absolute figures are bounded by it, the ratios are \
         the claim).\n\n"
    ));
    out.push_str("| primitive | contenders | client | owner changes/s | acquisitions/s | p50 wait (ms) | p99 wait (ms) | Jain | connections | server CPU/acq (µs) |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in &rows {
        out.push_str(r);
        out.push('\n');
    }
    out.push_str("\nTickets against the others (owner changes/s, at 1 contender acquisitions/s: tickets over the other; p99 wait: the other's over tickets; above 1, tickets ahead; CPU: tickets' server CPU per acquisition over Redisson's algorithm's):\n\n| primitive | contenders | changes/s vs Redisson's algorithm | vs SET NX | vs blocked WAIT (floor) | p99: Redisson's algorithm / tickets | SET NX / tickets | server CPU/acq vs Redisson's algorithm |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in &ratios {
        out.push_str(r);
        out.push('\n');
    }
    println!("{out}");
    if let Some(path) = report {
        let (begin, end) = ("<!-- bench-rust:begin -->", "<!-- bench-rust:end -->");
        let text = std::fs::read_to_string(path)?;
        let block = format!("{begin}\n{out}{end}");
        let new = match (text.find(begin), text.find(end)) {
            (Some(a), Some(b)) if a < b => {
                format!("{}{block}{}", &text[..a], &text[b + end.len()..])
            }
            _ => format!(
                "{}\n## Rust client: contenders in separate processes (`make bench-rust`)\n\n{block}\n",
                text.trim_end()
            ),
        };
        std::fs::write(path, new)?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("child") => child(&args[1..]),
        Some("bench") => bench(&args[1..]),
        _ => {
            let [url, client, primitive, procs, seconds] = args.as_slice() else {
                return Err(
                    "usage: contenders <redis-url> <client> <lock|semaphore> <procs> <seconds>"
                        .into(),
                );
            };
            let r = run(url, client, primitive, procs.parse()?, seconds.parse()?)?;
            println!("{}", line(primitive, procs.parse()?, client, false, &r));
            Ok(())
        }
    }
}
