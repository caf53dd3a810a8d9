//! `make bench-scripts`: what the module adds over scripts mode (docs/scripts-mode.md,
//! design.md 9), measured as a user sees it: N contender processes on one lock, each
//! looping acquire (waiting) / hold 1 ms / release, for three ways of taking the lock:
//!
//! - `module`: the Rust client (`rlock_client`, `Mode::Module`) on a module-loaded server;
//! - `scripts`: the same client in `Mode::Scripts` on a server WITHOUT the module
//!   (Redisson's scripts and its wait on the unlock channel, done by the client);
//! - `redisson`: Redisson's algorithm as the other benches write it (`locks.rs`: its
//!   acquire and unlock scripts, a subscription to the unlock channel, a retry on each
//!   message or at the holder's PTTL; one process models one JVM), on the same server
//!   without the module.
//!
//! One fresh server per row. Reported per row: owner changes/s (consecutive acquisitions,
//! in the shared CLOCK_MONOTONIC order, by different processes), acquisitions/s, p50/p99
//! and max wait (a wait the end of the run cut short counts as its length so far: a
//! starved process shows in the max, not in the p99), Jain over the processes' acquisitions, the server's connections mid-run, and the
//! server's CPU (INFO cpu, user + system, over the measured window) per acquisition.
//! Checked, so that a fast-but-wrong run cannot pass: no two processes' holds overlap.
//!
//! Usage: scripts_contenders --module PATH [--redis-server PATH] [--procs 8,64]
//!        [--seconds 5] [--aof-procs 8] [--report BENCHMARK.md]
//!        scripts_contenders child <module|scripts|redisson> <url> <start-ns> <seconds>

#[path = "../locks.rs"]
#[allow(dead_code)]
mod locks;
#[path = "../server.rs"]
#[allow(dead_code)]
mod server;
#[path = "../stats.rs"]
#[allow(dead_code)]
mod stats;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rlock_client::{Client, ClientOptions, Mode};

pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const LOCK: &str = "bench:scripts-contenders";
const HOLD: Duration = Duration::from_millis(1);
const MARK_START: &str = "<!-- bench-scripts:start -->";
const MARK_END: &str = "<!-- bench-scripts:end -->";

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process on the machine, so the
/// parent can merge the children's acquisitions into one order.
fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

fn sleep_until_ns(t: i64) {
    let d = t - now_ns();
    if d > 0 {
        std::thread::sleep(Duration::from_nanos(d as u64));
    }
}

/// One contender: connects, waits for the common start, then loops until the end and
/// prints one line per hold: `<acquired ns> <released ns> <wait µs>`, and one `0 0 <wait
/// µs>` for a wait the end of the run cut short (a starved process's wait counts too).
fn child(algo: &str, url: &str, start: i64, seconds: u64) -> Res<()> {
    let end = start + seconds as i64 * 1_000_000_000;
    let mut holds: Vec<(i64, i64, u64)> = Vec::new();
    let wait_left = || Duration::from_nanos((end - now_ns()).max(1) as u64);
    match algo {
        "module" | "scripts" => {
            let mode = if algo == "module" {
                Mode::Module
            } else {
                Mode::Scripts
            };
            let opts = ClientOptions::new().with_mode(mode).with_replica_sync(None);
            let c = Client::open_with(url, opts)?;
            let lock = c.lock(LOCK);
            // One call before the start: the connection (and scripts mode's subscriber)
            // is up when the measured window opens.
            if let Some(g) = lock.try_acquire()? {
                g.release()?;
            }
            sleep_until_ns(start);
            while now_ns() < end {
                let t = now_ns();
                let Some(g) = lock.acquire_timeout(wait_left())? else {
                    holds.push((0, 0, ((now_ns() - t) / 1000) as u64));
                    continue;
                };
                let got = now_ns();
                std::thread::sleep(HOLD);
                let rel = now_ns();
                g.release()?;
                holds.push((got, rel, ((got - t) / 1000) as u64));
            }
        }
        "redisson" => {
            let client = redis::Client::open(url)?;
            let mut con = client.get_connection()?;
            let sub = client.get_connection()?;
            let shas = locks::Shas::load(&mut con)?;
            let owner = format!("{:08x}-bench:1", std::process::id());
            let mut l = locks::Locker::new(
                locks::Algo::Redisson,
                con,
                Some(sub),
                &shas,
                LOCK,
                &owner,
                30_000,
            )?;
            sleep_until_ns(start);
            while now_ns() < end {
                let t = now_ns();
                let deadline = Instant::now() + wait_left();
                if !l.acquire(deadline)? {
                    holds.push((0, 0, ((now_ns() - t) / 1000) as u64));
                    continue;
                }
                let got = now_ns();
                std::thread::sleep(HOLD);
                let rel = now_ns();
                l.release()?;
                holds.push((got, rel, ((got - t) / 1000) as u64));
            }
        }
        other => return Err(format!("unknown algorithm {other}").into()),
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (a, r, w) in holds {
        writeln!(out, "{a} {r} {w}")?;
    }
    Ok(())
}

struct Row {
    algo: &'static str,
    procs: usize,
    aof: bool,
    changes_s: f64,
    acq_s: f64,
    p50_us: u64,
    p99_us: u64,
    max_us: u64,
    jain: f64,
    conns: usize,
    cpu_us_per_acq: f64,
}

fn server_cpu_s(s: &server::Server) -> Res<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query(&mut s.client()?)?;
    let field = |k: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    Ok(field("used_cpu_user") + field("used_cpu_sys"))
}

fn run_row(
    bin: &Path,
    module: &Path,
    algo: &'static str,
    procs: usize,
    seconds: u64,
    aof: bool,
) -> Res<Row> {
    let srv = server::Server::start(bin, (algo == "module").then_some(module))?;
    if aof {
        // appendfsync everysec, the default: what a persistent deployment runs.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("appendonly")
            .arg("yes")
            .query(&mut srv.client()?)?;
    }
    let url = format!("redis://127.0.0.1:{}/", srv.port);
    // Start-up of `procs` processes on a loaded machine: the window opens once all are
    // connected (each waits for this instant).
    let start = now_ns() + 2_000_000_000 + procs as i64 * 50_000_000;
    let exe = std::env::current_exe()?;
    let children: Vec<_> = (0..procs)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "child",
                    algo,
                    &url,
                    &start.to_string(),
                    &seconds.to_string(),
                ])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    sleep_until_ns(start);
    let cpu0 = server_cpu_s(&srv)?;
    sleep_until_ns(start + seconds as i64 * 500_000_000);
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut srv.client()?)?;
    // Less this connection and the one the CPU read above left idle.
    let conns = list.lines().count().saturating_sub(2);
    sleep_until_ns(start + seconds as i64 * 1_000_000_000);
    let cpu1 = server_cpu_s(&srv)?;
    let mut holds: Vec<(i64, i64, usize)> = Vec::new();
    let mut waits: Vec<u64> = Vec::new();
    let mut counts: Vec<u64> = Vec::new();
    for (p, ch) in children.into_iter().enumerate() {
        let out = ch.wait_with_output()?;
        if !out.status.success() {
            return Err(format!("{algo} contender {p} failed: {}", out.status).into());
        }
        let text = String::from_utf8(out.stdout)?;
        let mut n = 0;
        for line in text.lines() {
            let w: Vec<i64> = line.split(' ').map(|x| x.parse().unwrap_or(0)).collect();
            waits.push(w[2] as u64);
            if w[0] != 0 {
                holds.push((w[0], w[1], p));
                n += 1;
            }
        }
        counts.push(n);
    }
    holds.sort();
    for pair in holds.windows(2) {
        if pair[1].0 < pair[0].1 && pair[0].2 != pair[1].2 {
            return Err(format!("{algo}: two processes held the lock at once: {pair:?}").into());
        }
    }
    let changes = holds.windows(2).filter(|p| p[0].2 != p[1].2).count();
    waits.sort_unstable();
    let acqs = holds.len().max(1) as f64;
    Ok(Row {
        algo,
        procs,
        aof,
        changes_s: changes as f64 / seconds as f64,
        acq_s: holds.len() as f64 / seconds as f64,
        p50_us: stats::percentile(&waits, 50.0),
        p99_us: stats::percentile(&waits, 99.0),
        max_us: waits.last().copied().unwrap_or(0),
        jain: stats::jain(&counts),
        conns,
        cpu_us_per_acq: (cpu1 - cpu0) * 1e6 / acqs,
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn ms(us: u64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

fn label(algo: &str) -> &'static str {
    match algo {
        "module" => "module (Rust client, `Mode::Module`)",
        "scripts" => "scripts mode (Rust client, `Mode::Scripts`, no module)",
        _ => "Redisson's algorithm (no module)",
    }
}

fn table(rows: &[Row], version: &str, seconds: u64, load: (&str, &str)) -> String {
    let mut t = String::new();
    t += &format!(
        "{MARK_START}\nOne run, {version}, release builds, {seconds} s per row, a fresh server per \
         row; load average (1, 5, 15 min) {} at the start, {} at the end, on 2 cores shared \
         with other work: the ratios are the claim, not the absolute numbers.\n\n",
        load.0, load.1
    );
    t += "| contenders | AOF | algorithm | owner changes/s | acquisitions/s | p50 wait | p99 wait | max wait | Jain | connections | server CPU per acquisition | owner changes/s vs Redisson's algorithm |\n";
    t += "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in rows {
        let base = rows
            .iter()
            .find(|b| b.algo == "redisson" && b.procs == r.procs && b.aof == r.aof)
            .map(|b| b.changes_s)
            .unwrap_or(0.0);
        let ratio = if base > 0.0 {
            format!("{:.1}×", r.changes_s / base)
        } else {
            "–".into()
        };
        t += &format!(
            "| {} | {} | {} | {:.0} | {:.0} | {} | {} | {} | {:.3} | {} | {:.0} µs | {} |\n",
            r.procs,
            if r.aof { "everysec" } else { "off" },
            label(r.algo),
            r.changes_s,
            r.acq_s,
            ms(r.p50_us),
            ms(r.p99_us),
            ms(r.max_us),
            r.jain,
            r.conns,
            r.cpu_us_per_acq,
            ratio
        );
    }
    t += MARK_END;
    t
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("child") {
        return child(&args[1], &args[2], args[3].parse()?, args[4].parse()?);
    }
    let mut module = None;
    let mut bin = PathBuf::from("redis-server");
    let mut procs = vec![8usize, 64];
    let mut aof_procs = vec![8usize];
    let mut seconds = 5u64;
    let mut report = None;
    let mut it = args.into_iter();
    while let Some(f) = it.next() {
        let v = it.next().ok_or(format!("{f} needs a value"))?;
        let list =
            |v: &str| -> Vec<usize> { v.split(',').filter_map(|x| x.parse().ok()).collect() };
        match f.as_str() {
            "--module" => module = Some(PathBuf::from(v)),
            "--redis-server" => bin = PathBuf::from(v),
            "--procs" => procs = list(&v),
            "--aof-procs" => aof_procs = list(&v),
            "--seconds" => seconds = v.parse()?,
            "--report" => report = Some(PathBuf::from(v)),
            _ => return Err(format!("unknown flag {f}").into()),
        }
    }
    // Absolute: the server runs in a directory of its own.
    let module = std::fs::canonicalize(module.ok_or("--module PATH is required")?)?;
    let version = String::from_utf8(Command::new(&bin).arg("--version").output()?.stdout)?;
    let version = version
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let load0 = loadavg();
    let mut rows = Vec::new();
    let plan = procs
        .iter()
        .map(|&p| (p, false))
        .chain(aof_procs.iter().map(|&p| (p, true)));
    for (p, aof) in plan {
        for algo in ["module", "scripts", "redisson"] {
            let r = run_row(&bin, &module, algo, p, seconds, aof)?;
            eprintln!(
                "{p} {algo} aof={aof}: {:.0} owner changes/s, {:.0} acquisitions/s, p99 {}",
                r.changes_s,
                r.acq_s,
                ms(r.p99_us)
            );
            rows.push(r);
        }
    }
    let t = table(&rows, &version, seconds, (&load0, &loadavg()));
    println!("{t}");
    if let Some(path) = report {
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        let new = match (old.find(MARK_START), old.find(MARK_END)) {
            (Some(a), Some(b)) if a < b => {
                format!("{}{t}{}", &old[..a], &old[b + MARK_END.len()..])
            }
            _ => format!(
                "{old}\n## Scripts mode vs the module vs Redisson's algorithm: one lock, contenders in separate processes (`make bench-scripts`)\n\n{t}\n"
            ),
        };
        std::fs::write(&path, new)?;
    }
    Ok(())
}
