//! rlock-bench: rlock vs Redisson's Lua scripts vs SET NX PX, side by side against one
//! private redis-server, in alternating rounds, reported as ratios of medians.
//!
//! Absolute numbers on a shared 2-core machine drift with whatever else runs; ratios
//! between implementations measured in the same minute, against the same server,
//! drift far less. Hence: one server, rounds that rotate the order, medians.
//!
//! Usage: rlock-bench [--quick] [--module PATH] [--redis-server PATH]
//!                    [--report PATH] [--chart PATH] [--notes PATH]
//!                    [--only throughput,contention,takeover,memory] [--clients 1,8,64]

mod chart;
mod contention;
mod locks;
mod memory;
mod report;
mod resp;
mod server;
mod stats;
mod takeover;
mod throughput;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use locks::{Algo, Shas};
use server::Server;
use throughput::Workload;

pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// How much of everything to run. `quick` exists so `make test` exercises every code
/// path (and the safety checks) in seconds; its numbers mean nothing.
#[derive(Clone, Debug)]
pub struct Plan {
    pub quick: bool,
    pub tp_rounds: usize,
    pub tp_dur: Duration,
    pub tp_conns: usize,
    pub rb_rounds: usize,
    pub rb_requests: u64,
    pub ct_rounds: usize,
    pub ct_dur: Duration,
    pub ct_clients: Vec<usize>,
    pub to_samples: usize,
    pub to_lease_ms: u64,
    pub to_other_keys: u64,
    pub mem_locks: u64,
    pub mem_waiters: usize,
    pub mem_settle: memory::Settle,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            quick: false,
            tp_rounds: 5,
            tp_dur: Duration::from_millis(1000),
            tp_conns: 4,
            rb_rounds: 3,
            rb_requests: 300_000,
            ct_rounds: 3,
            ct_dur: Duration::from_millis(2000),
            ct_clients: vec![1, 8, 64],
            to_samples: 100,
            to_lease_ms: 50,
            to_other_keys: 50_000,
            mem_locks: 100_000,
            mem_waiters: 10_000,
            mem_settle: memory::Settle {
                idle: Duration::from_millis(4500),
                stable: true,
            },
        }
    }

    fn quick() -> Plan {
        Plan {
            quick: true,
            tp_rounds: 1,
            tp_dur: Duration::from_millis(200),
            tp_conns: 2,
            rb_rounds: 0,
            rb_requests: 0,
            ct_rounds: 1,
            ct_dur: Duration::from_millis(300),
            ct_clients: vec![1, 8, 64],
            to_samples: 4,
            to_lease_ms: 20,
            to_other_keys: 2_000,
            mem_locks: 2_000,
            mem_waiters: 100,
            // Too short for client buffers to shrink: quick's memory figures are noise.
            mem_settle: memory::Settle {
                idle: Duration::ZERO,
                stable: false,
            },
        }
    }
}

struct Args {
    plan: Plan,
    module: Option<PathBuf>,
    redis_server: PathBuf,
    report: Option<PathBuf>,
    chart: Option<PathBuf>,
    /// Hand-written analysis appended to the report (profiles, bounds, proposals).
    notes: Option<PathBuf>,
    /// Scenario names to run (throughput, contention, takeover, memory); empty = all.
    only: Vec<String>,
}

impl Args {
    fn wants(&self, scenario: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == scenario)
    }
}

fn parse_args() -> Res<Args> {
    let mut args = Args {
        plan: Plan::full(),
        module: std::env::var_os("RLOCK_MODULE").map(PathBuf::from),
        redis_server: std::env::var_os("REDIS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/bin/redis-server")),
        report: None,
        chart: None,
        only: Vec::new(),
        notes: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--quick" => args.plan = Plan::quick(),
            "--module" => args.module = Some(PathBuf::from(val()?)),
            "--no-module" => args.module = None,
            "--redis-server" => args.redis_server = PathBuf::from(val()?),
            "--report" => args.report = Some(PathBuf::from(val()?)),
            "--chart" => args.chart = Some(PathBuf::from(val()?)),
            "--notes" => args.notes = Some(PathBuf::from(val()?)),
            "--only" => args.only = val()?.split(',').map(str::to_string).collect(),
            "--clients" => {
                args.plan.ct_clients = val()?
                    .split(',')
                    .map(|n| n.parse::<usize>())
                    .collect::<Result<_, _>>()?
            }
            "-h" | "--help" => {
                println!("usage: rlock-bench [--quick] [--module PATH | --no-module] [--redis-server PATH] [--report PATH] [--chart PATH] [--notes PATH] [--only throughput,contention,takeover,memory] [--clients 1,8,64]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    // redis-server runs in a scratch directory, so a relative module path would not resolve.
    if let Some(m) = &args.module {
        args.module =
            Some(std::fs::canonicalize(m).map_err(|e| format!("module {}: {e}", m.display()))?);
    }
    Ok(args)
}

/// Everything measured in one run; the report is written from this alone.
#[derive(Default)]
pub struct Results {
    pub machine: Vec<(String, String)>,
    /// (workload, per-round ops/s)
    pub throughput: Vec<(Workload, Vec<f64>)>,
    /// (workload, per-round server time per operation in µs, from INFO commandstats)
    pub server_usec: Vec<(Workload, Vec<f64>)>,
    /// redis-benchmark cross-check: (workload, per-round requests/s)
    pub redis_benchmark: Vec<(Workload, Vec<f64>)>,
    /// per (algo, clients): the per-round results
    pub contention: Vec<Vec<contention::ContentionResult>>,
    /// (algo, samples in ms past the lease)
    pub takeover: Vec<(Algo, Vec<f64>)>,
    pub held_memory: Vec<(memory::HeldKind, f64)>,
    pub waiter_memory: Vec<(memory::WaiterKind, memory::WaiterMemory)>,
    pub module_loaded: bool,
    pub elapsed: Duration,
}

fn rotated<T: Copy>(items: &[T], round: usize) -> Vec<T> {
    let k = round % items.len().max(1);
    items[k..]
        .iter()
        .chain(items[..k].iter())
        .copied()
        .collect()
}

fn push_sample<K: PartialEq + Copy, V>(v: &mut Vec<(K, Vec<V>)>, k: K, x: V) {
    match v.iter_mut().find(|(kk, _)| *kk == k) {
        Some((_, xs)) => xs.push(x),
        None => v.push((k, vec![x])),
    }
}

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn machine_info(args: &Args) -> Vec<(String, String)> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem = meminfo
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .nth(1)
        .unwrap_or("0");
    let mem_gib = mem.parse::<f64>().unwrap_or(0.0) / 1024.0 / 1024.0;
    let rs = args.redis_server.to_string_lossy().to_string();
    vec![
        ("Date (UTC)".into(), sh("date", &["-u", "+%Y-%m-%d %H:%M"])),
        (
            "CPU".into(),
            format!(
                "{cpu}, {} logical cores",
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(0)
            ),
        ),
        ("Memory".into(), format!("{mem_gib:.1} GiB")),
        ("Kernel".into(), sh("uname", &["-sr"])),
        ("Redis".into(), sh(&rs, &["--version"])),
        ("rustc".into(), sh("rustc", &["--version"])),
        (
            "Load average at start".into(),
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
                .to_string(),
        ),
    ]
}

/// redis-benchmark's own view of the acquire commands (its C client is leaner than
/// ours), as a cross-check of the in-house driver. Returns requests per second.
fn redis_benchmark(port: u16, w: Workload, shas: &Shas, n: u64) -> Res<f64> {
    let owner = "6f1c2e0a-94d4-4c1b-9a57-0f6a3b2d8e11:1";
    let key = "lock:__rand_int__";
    let cmd: Vec<&str> = match w {
        Workload::RlockAcquire => vec!["RLOCK.ACQUIRE", key, owner, "30000"],
        Workload::RedissonAcquire => vec!["EVALSHA", &shas.acquire, "1", key, "30000", owner],
        Workload::SetNx => vec!["SET", key, owner, "NX", "PX", "30000"],
        _ => return Err("redis-benchmark runs acquire workloads only".into()),
    };
    let port_s = port.to_string();
    let n_s = n.to_string();
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port_s,
            "-P",
            "16",
            "-c",
            "50",
            "-n",
            &n_s,
        ])
        // Keys from a space of 10^9 are essentially all new, as in the in-house driver.
        .args(["-r", "1000000000", "--csv"])
        .args(&cmd)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines().skip(1) {
        let cols: Vec<&str> = line.split(',').map(|c| c.trim_matches('"')).collect();
        if cols.len() > 1 {
            if let Ok(v) = cols[1].parse::<f64>() {
                return Ok(v);
            }
        }
    }
    Err(format!(
        "could not parse redis-benchmark output: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    )
    .into())
}

/// Microseconds the server spent executing lock commands since the last CONFIG
/// RESETSTAT (INFO commandstats `usec`): the cost inside the command, without the
/// network and parsing work that every command shares. Noisy neighbours inflate wall
/// time far more than this figure.
fn workload_usec(admin: &mut redis::Connection) -> Res<f64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(admin)?;
    let mut usec = 0.0;
    for line in info.lines() {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        // Only the workload's own commands; the harness's CONFIG/INFO are not lock work.
        if !matches!(name, "set" | "evalsha" | "rlock.acquire" | "rlock.release") {
            continue;
        }
        if let Some(u) = stats.split(',').find_map(|kv| kv.strip_prefix("usec=")) {
            usec += u.parse::<f64>()?;
        }
    }
    Ok(usec)
}

fn flushall(server: &Server) -> Res<()> {
    let mut c = server.client()?;
    redis::cmd("FLUSHALL").exec(&mut c)?;
    Ok(())
}

fn run(args: &Args) -> Res<Results> {
    let started = Instant::now();
    let plan = &args.plan;
    let mut res = Results {
        machine: machine_info(args),
        ..Results::default()
    };
    let server = Server::start(&args.redis_server, args.module.as_deref())?;
    res.module_loaded = args.module.is_some();
    println!(
        "redis-server on 127.0.0.1:{} ({})",
        server.port,
        args.module
            .as_ref()
            .map(|m| m.display().to_string())
            .unwrap_or_else(|| "no module: rlock rows skipped".into())
    );
    let shas = Shas::load(&mut server.client()?)?;
    let have = |w: Workload| res.module_loaded || !w.needs_module();
    let algos: Vec<Algo> = [Algo::Rlock, Algo::Redisson, Algo::Polling]
        .into_iter()
        .filter(|&a| res.module_loaded || a != Algo::Rlock)
        .collect();

    // 1. Uncontended throughput: the acquire workloads, then the cycle workloads,
    // each round in a rotated order, FLUSHALL between runs so every run starts empty.
    println!(
        "\n== 1. uncontended pipelined throughput ({} conns x {} deep) ==",
        plan.tp_conns,
        throughput::DEPTH
    );
    let tp_groups = if args.wants("throughput") {
        vec![Workload::ACQUIRE, Workload::CYCLE]
    } else {
        vec![]
    };
    for group in tp_groups {
        let ws: Vec<Workload> = group.iter().copied().filter(|&w| have(w)).collect();
        for round in 0..plan.tp_rounds {
            for w in rotated(&ws, round) {
                flushall(&server)?;
                let tag = round as u64;
                let mut admin = server.client()?;
                redis::cmd("CONFIG").arg("RESETSTAT").exec(&mut admin)?;
                let (n, secs) =
                    throughput::run(server.port, w, plan.tp_conns, plan.tp_dur, &shas, tag)?;
                let ops = n as f64 / secs;
                let usec = workload_usec(&mut admin)? / n.max(1) as f64;
                push_sample(&mut res.server_usec, w, usec);
                println!(
                    "  round {round}  {:<48} {:>10.0} ops/s  {usec:>5.2} µs server time per op",
                    w.label(),
                    ops
                );
                push_sample(&mut res.throughput, w, ops);
            }
        }
    }
    if plan.rb_rounds > 0 && args.wants("throughput") {
        println!("\n== 1b. redis-benchmark cross-check (-P 16 -c 50, random keys) ==");
        let ws: Vec<Workload> = Workload::ACQUIRE
            .iter()
            .copied()
            .filter(|&w| have(w))
            .collect();
        for round in 0..plan.rb_rounds {
            for w in rotated(&ws, round) {
                flushall(&server)?;
                let rps = redis_benchmark(server.port, w, &shas, plan.rb_requests)?;
                println!("  round {round}  {:<48} {:>10.0} req/s", w.label(), rps);
                push_sample(&mut res.redis_benchmark, w, rps);
            }
        }
    }
    flushall(&server)?;

    // 2. Contention.
    println!(
        "\n== 2. contention: N clients, one lock, {:?} per run ==",
        plan.ct_dur
    );
    let mut cells: Vec<Vec<contention::ContentionResult>> = Vec::new();
    let ct_rounds = if args.wants("contention") {
        plan.ct_rounds
    } else {
        0
    };
    for round in 0..ct_rounds {
        for &n in &plan.ct_clients {
            for a in rotated(&algos, round) {
                let r = contention::run(&server, a, n, plan.ct_dur, &shas)?;
                println!(
                    "  round {round}  {:<26} {:>3} clients {:>9.0} owner changes/s {:>9.0} acquisitions/s  wait p50 {:>7} µs p99 {:>8} µs max {:>8} µs  Jain {:.4}",
                    a.label(),
                    n,
                    r.owner_changes_per_s,
                    r.acquisitions_per_s,
                    r.p50_us,
                    r.p99_us,
                    r.max_us,
                    r.jain
                );
                match cells
                    .iter_mut()
                    .find(|c| c[0].algo == a && c[0].clients == n)
                {
                    Some(c) => c.push(r),
                    None => cells.push(vec![r]),
                }
            }
        }
    }
    res.contention = cells;
    flushall(&server)?;

    // 3. Takeover, alternating implementations sample by sample.
    println!(
        "\n== 3. takeover after a vanished holder (lease {} ms, {} other keys) ==",
        plan.to_lease_ms, plan.to_other_keys
    );
    let to_algos: Vec<Algo> = algos
        .iter()
        .copied()
        .filter(|&a| a != Algo::Polling && args.wants("takeover"))
        .collect();
    if !to_algos.is_empty() {
        takeover::preload(&server, plan.to_other_keys)?;
    }
    let mut takers = Vec::new();
    for &a in &to_algos {
        takers.push((
            a,
            takeover::Takeover::new(&server, a, &shas, plan.to_lease_ms)?,
        ));
    }
    for i in 0..plan.to_samples {
        for (a, t) in takers.iter_mut() {
            let ms = t.sample(&format!("takeover:{i}:{}", *a as u8))?;
            push_sample(&mut res.takeover, *a, ms);
        }
    }
    for (a, v) in &res.takeover {
        let mut s = v.clone();
        s.sort_by(f64::total_cmp);
        println!(
            "  {:<26} p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms past the lease",
            a.label(),
            stats::percentile(&s, 50.0),
            stats::percentile(&s, 99.0),
            s.last().copied().unwrap_or(0.0)
        );
    }
    drop(takers);
    flushall(&server)?;

    // 4. Memory.
    println!("\n== 4. memory ==");
    let held: Vec<memory::HeldKind> = [
        memory::HeldKind::Rlock,
        memory::HeldKind::Redisson,
        memory::HeldKind::SetNx,
    ]
    .into_iter()
    .filter(|&k| res.module_loaded || k != memory::HeldKind::Rlock)
    .filter(|_| args.wants("memory"))
    .collect();
    for k in held {
        let b = memory::per_held_lock(&server, k, plan.mem_locks, &shas, plan.mem_settle)?;
        println!(
            "  {:<48} {:>8.1} bytes per held lock ({} locks)",
            k.label(),
            b,
            plan.mem_locks
        );
        res.held_memory.push((k, b));
    }
    let waiters: Vec<memory::WaiterKind> = [
        memory::WaiterKind::Rlock,
        memory::WaiterKind::RedissonSubscriber,
        memory::WaiterKind::NativeBlpop,
    ]
    .into_iter()
    .filter(|&k| res.module_loaded || k != memory::WaiterKind::Rlock)
    .filter(|_| args.wants("memory"))
    .collect();
    for k in waiters {
        let b = memory::per_waiter(&server, k, plan.mem_waiters, &shas, plan.mem_settle)?;
        println!(
            "  {:<48} {:>8.1} bytes per waiter, of which {:.1} in client buffers ({} waiters)",
            k.label(),
            b.total,
            b.client_buffers,
            plan.mem_waiters
        );
        res.waiter_memory.push((k, b));
    }
    res.machine.push((
        "Load average at end".into(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
            .to_string(),
    ));
    res.elapsed = started.elapsed();
    Ok(res)
}

/// The `<!-- NAME:begin -->` ... `<!-- NAME:end -->` blocks of a report, in order.
fn kept_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(begin) = rest.find("<!-- ") {
        let after = &rest[begin + 5..];
        let Some(name_end) = after.find(":begin -->") else {
            rest = after;
            continue;
        };
        let name = &after[..name_end];
        let end_marker = format!("<!-- {name}:end -->");
        match rest[begin..].find(&end_marker) {
            Some(end) if !name.contains(char::is_whitespace) => {
                let stop = begin + end + end_marker.len();
                out.push(rest[begin..stop].to_string());
                rest = &rest[stop..];
            }
            _ => rest = after,
        }
    }
    out
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rlock-bench: {e}");
            std::process::exit(2);
        }
    };
    let res = match run(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rlock-bench: FAILED: {e}");
            std::process::exit(1);
        }
    };
    let notes = args
        .notes
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok());
    let md = report::markdown(&args.plan, &res, args.chart.as_deref(), notes.as_deref());
    if args.plan.quick {
        println!(
            "\nquick smoke run: debug build, tiny counts, no settling; the numbers mean nothing"
        );
    }
    println!("\n{}", report::goals_table(&res));
    if let Some(p) = &args.report {
        // `make bench-instr` writes its tables into the same file, between markers
        // (`<!-- instr:begin -->`, `<!-- instr-rw:begin -->`, ...): keep every such block,
        // so either benchmark can be rerun alone.
        let blocks = std::fs::read_to_string(p)
            .map(|old| kept_blocks(&old))
            .unwrap_or_default();
        let md = if blocks.is_empty() {
            md
        } else {
            format!("{}\n\n{}\n", md.trim_end(), blocks.join("\n\n"))
        };
        if let Err(e) = std::fs::write(p, &md) {
            eprintln!("rlock-bench: cannot write {}: {e}", p.display());
            std::process::exit(1);
        }
        println!("wrote {}", p.display());
    }
    if let Some(p) = &args.chart {
        if let Err(e) = std::fs::write(p, report::chart(&res)) {
            eprintln!("rlock-bench: cannot write {}: {e}", p.display());
            std::process::exit(1);
        }
        println!("wrote {}", p.display());
    }
    println!("done in {:.1} s", res.elapsed.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::kept_blocks;

    #[test]
    fn it_keeps_every_marked_block_of_the_old_report() {
        let old = "# title\n<!-- instr:begin -->\nA\n<!-- instr:end -->\ntext <!-- note -->\n\
                   <!-- instr-rw:begin -->\nB\n<!-- instr-rw:end -->\n<!-- x:begin -->unclosed";
        assert_eq!(
            kept_blocks(old),
            vec![
                "<!-- instr:begin -->\nA\n<!-- instr:end -->".to_string(),
                "<!-- instr-rw:begin -->\nB\n<!-- instr-rw:end -->".to_string(),
            ]
        );
    }
}
