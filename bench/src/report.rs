//! BENCHMARK.md and the contention chart, written from one run's `Results`.

use std::fmt::Write;
use std::path::Path;

use crate::chart::{self, format_rate};
use crate::contention::ContentionResult;
use crate::locks::Algo;
use crate::memory::WaiterKind;
use crate::stats::{median, percentile};
use crate::throughput::Workload;
use crate::{Plan, Results};

fn samples(v: &[(Workload, Vec<f64>)], w: Workload) -> Option<&[f64]> {
    v.iter().find(|(k, _)| *k == w).map(|(_, s)| s.as_slice())
}

/// Median of per-round ratios a/b. Rounds are paired (each round runs every workload
/// back to back), so a slow minute on the machine hits both sides of a ratio.
fn paired_ratio(a: &[f64], b: &[f64]) -> f64 {
    let r: Vec<f64> = a
        .iter()
        .zip(b)
        .filter(|(_, y)| **y > 0.0)
        .map(|(x, y)| x / y)
        .collect();
    median(&r)
}

fn ratio_of(v: &[(Workload, Vec<f64>)], a: Workload, b: Workload) -> Option<f64> {
    Some(paired_ratio(samples(v, a)?, samples(v, b)?))
}

fn cell(res: &Results, a: Algo, n: usize) -> Option<&[ContentionResult]> {
    res.contention
        .iter()
        .find(|c| c[0].algo == a && c[0].clients == n)
        .map(|c| c.as_slice())
}

/// Handoffs: owner changes per second (the lock passing to another client).
fn handoffs(rs: &[ContentionResult]) -> Vec<f64> {
    rs.iter().map(|r| r.owner_changes_per_s).collect()
}

fn acquisitions(rs: &[ContentionResult]) -> Vec<f64> {
    rs.iter().map(|r| r.acquisitions_per_s).collect()
}

fn max_clients(res: &Results) -> usize {
    res.contention
        .iter()
        .map(|c| c[0].clients)
        .max()
        .unwrap_or(0)
}

fn takeover_p99(res: &Results, a: Algo) -> Option<f64> {
    let v = res.takeover.iter().find(|(k, _)| *k == a)?;
    let mut s = v.1.clone();
    s.sort_by(f64::total_cmp);
    Some(percentile(&s, 99.0))
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "**met**"
    } else {
        "**missed**"
    }
}

/// One row per goal of the issue, measured value and verdict.
pub fn goals_table(res: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| Goal | Target | Measured | Verdict |");
    let _ = writeln!(s, "|---|---|---|---|");
    let mut row = |goal: &str, target: &str, measured: Option<(f64, String, bool)>| {
        let (m, v) = match measured {
            Some((_, text, ok)) => (text, verdict(ok).to_string()),
            None => ("not measured in this run".to_string(), "—".to_string()),
        };
        let _ = writeln!(s, "| {goal} | {target} | {m} | {v} |");
    };
    let t = &res.throughput;
    row(
        "Acquire throughput vs `SET NX PX`",
        "≥ 0.9×",
        ratio_of(t, Workload::RlockAcquire, Workload::SetNx)
            .map(|r| (r, format!("{r:.2}×"), r >= 0.9)),
    );
    row(
        "Acquire throughput vs Redisson's script",
        "≥ 1.7×",
        ratio_of(t, Workload::RlockAcquire, Workload::RedissonAcquire)
            .map(|r| (r, format!("{r:.2}×"), r >= 1.7)),
    );
    let n = max_clients(res);
    let hr = match (cell(res, Algo::Rlock, n), cell(res, Algo::Redisson, n)) {
        (Some(a), Some(b)) => {
            let r = paired_ratio(&handoffs(a), &handoffs(b));
            Some((r, format!("{r:.1}×"), r >= 5.0))
        }
        _ => None,
    };
    row(
        &format!("Contention handoffs (owner changes)/s vs Redisson's algorithm, {n} clients"),
        "≥ 5×",
        hr,
    );
    let jain = cell(res, Algo::Rlock, n).map(|c| {
        let j = median(&c.iter().map(|r| r.jain).collect::<Vec<_>>());
        (j, format!("{j:.4}"), j >= 0.99)
    });
    row(
        &format!("Jain's fairness index, rlock, {n} clients"),
        "≥ 0.99",
        jain,
    );
    row(
        "Takeover past the lease, p99",
        "≤ 5 ms",
        takeover_p99(res, Algo::Rlock).map(|p| (p, format!("{p:.2} ms"), p <= 5.0)),
    );
    let w = res
        .waiter_memory
        .iter()
        .find(|(k, _)| *k == WaiterKind::Rlock)
        .map(|(_, b)| b.total);
    // The ≤ 256 B goal is met by queued tickets (`WAIT … ASYNC`, design.md 5), measured by
    // `make bench-tickets`; a waiter blocked in WAIT keeps Redis's per-client cost.
    row(
        "Server memory per waiter blocked in WAIT (queued tickets: `make bench-tickets`)",
        "≤ 256 B",
        w.map(|b| (b, format!("{b:.0} B"), b <= 256.0)),
    );
    s
}

pub fn chart(res: &Results) -> String {
    let mut points = Vec::new();
    let mut algos = Vec::new();
    let mut clients = Vec::new();
    for c in &res.contention {
        let (a, n) = (c[0].algo, c[0].clients);
        if !algos.contains(&a) {
            algos.push(a);
        }
        if !clients.contains(&n) {
            clients.push(n);
        }
        points.push(chart::Point {
            algo: a,
            clients: n,
            owner_changes_per_s: median(&handoffs(c)),
            jain: median(&c.iter().map(|r| r.jain).collect::<Vec<_>>()),
        });
    }
    clients.sort_unstable();
    let date = res
        .machine
        .iter()
        .find(|(k, _)| k.starts_with("Date"))
        .map(|(_, v)| v.as_str())
        .unwrap_or("");
    let rounds = res.contention.first().map(|c| c.len()).unwrap_or(0);
    chart::svg(
        &points,
        &algos,
        &clients,
        &format!("medians of {rounds} alternating rounds, one redis-server 7.0, {date}"),
    )
}

pub fn markdown(
    plan: &Plan,
    res: &Results,
    chart_path: Option<&Path>,
    notes: Option<&str>,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# rlock benchmarks\n");
    let _ = writeln!(
        s,
        "Generated by `make bench` (`rlock-bench`{}); do not edit by hand. Every number below comes from \
         one run against one private `redis-server` started for it (`--save \"\" --appendonly no`), \
         so rlock, Redisson's Lua scripts and plain `SET NX PX` are compared on the same server in the \
         same minutes. Implementations alternate round by round (the order rotates each round) and each \
         figure is the median over rounds; ratios are medians of per-round ratios.\n",
        if plan.quick { " --quick: smoke run, numbers meaningless" } else { "" }
    );
    let _ = writeln!(
        s,
        "The machine is a shared 2-core VM on which other builds and tests ran at the same time, so \
         absolute numbers drift from run to run (see the load averages); the ratios are the result.\n"
    );
    let _ = writeln!(s, "## Machine\n\n| | |\n|---|---|");
    for (k, v) in &res.machine {
        let _ = writeln!(s, "| {k} | {} |", v.replace('|', "/"));
    }
    let _ = writeln!(s, "| Run time | {:.0} s |\n", res.elapsed.as_secs_f64());

    let _ = writeln!(s, "## Goals\n\n{}", goals_table(res));

    // 1. Throughput.
    let _ = writeln!(
        s,
        "## 1. Uncontended throughput, pipelined\n\n{} connections, {} commands in flight on each \
         (`-P 16`), every lock on a fresh key, lease 30 s, owner ids of Redisson's shape \
         (`<uuid>:<thread>`, 38 bytes) for every implementation. {} rounds of {:.1} s; every reply is \
         checked (an acquire must answer nil/OK, a release 1). An operation is one acquire, or one \
         acquire + release cycle.\n",
        plan.tp_conns,
        crate::throughput::DEPTH,
        plan.tp_rounds,
        plan.tp_dur.as_secs_f64()
    );
    let _ = writeln!(
        s,
        "| Workload | ops/s (median) | rounds | server µs per op (median) |\n|---|---:|---|---:|"
    );
    for (w, v) in &res.throughput {
        let rounds: Vec<String> = v.iter().map(|x| format_rate(*x)).collect();
        let usec = samples(&res.server_usec, *w).map(median).unwrap_or(0.0);
        let _ = writeln!(
            s,
            "| {} | {:.0} | {} | {usec:.2} |",
            w.label(),
            median(v),
            rounds.join(", ")
        );
    }
    let _ = writeln!(
        s,
        "\nServer µs per op is INFO commandstats `usec` over the run divided by the operations: \
         the time inside the command implementations only. What every pipelined command costs \
         the server outside its implementation (reading, parsing, dispatch, writing the reply) \
         is about the same for all workloads, which is why wall-clock ratios are closer to 1 \
         than these. It is also far less disturbed by other load on the machine.\n"
    );
    let u = &res.server_usec;
    for (name, a, b) in [
        (
            "RLOCK.ACQUIRE / SET NX PX",
            Workload::RlockAcquire,
            Workload::SetNx,
        ),
        (
            "RLOCK.ACQUIRE / Redisson acquire script",
            Workload::RlockAcquire,
            Workload::RedissonAcquire,
        ),
        (
            "RLOCK cycle / Redisson cycle",
            Workload::RlockCycle,
            Workload::RedissonCycle,
        ),
    ] {
        if let Some(r) = ratio_of(u, a, b) {
            let _ = writeln!(s, "- server time {name}: {r:.2}×");
        }
    }
    let t = &res.throughput;
    let _ = writeln!(s);
    let ratios = [
        (
            "RLOCK.ACQUIRE / SET NX PX",
            Workload::RlockAcquire,
            Workload::SetNx,
        ),
        (
            "RLOCK.ACQUIRE / Redisson acquire script",
            Workload::RlockAcquire,
            Workload::RedissonAcquire,
        ),
        (
            "Redisson acquire script / SET NX PX",
            Workload::RedissonAcquire,
            Workload::SetNx,
        ),
        (
            "RLOCK cycle / Redisson cycle",
            Workload::RlockCycle,
            Workload::RedissonCycle,
        ),
        (
            "RLOCK cycle / redis-py cycle",
            Workload::RlockCycle,
            Workload::RedisPyCycle,
        ),
        (
            "Redisson cycle / redis-py cycle",
            Workload::RedissonCycle,
            Workload::RedisPyCycle,
        ),
    ];
    let _ = writeln!(s, "| Ratio | value |\n|---|---:|");
    for (name, a, b) in ratios {
        if let Some(r) = ratio_of(t, a, b) {
            let _ = writeln!(s, "| {name} | {r:.2}× |");
        }
    }
    if !res.redis_benchmark.is_empty() {
        let rb = &res.redis_benchmark;
        let _ = writeln!(
            s,
            "\nCross-check with `redis-benchmark -P 16 -c 50 -r 1000000000` (its C client spends less \
             CPU per request than ours, and on two cores the client competes with the server):\n"
        );
        let _ = writeln!(s, "| Command | requests/s (median) |\n|---|---:|");
        for (w, v) in rb {
            let _ = writeln!(s, "| {} | {:.0} |", w.label(), median(v));
        }
        for (name, a, b) in &ratios[..3] {
            if let Some(r) = ratio_of(rb, *a, *b) {
                let _ = writeln!(s, "\n{name} (redis-benchmark): **{r:.2}×**");
            }
        }
    }

    // 2. Contention.
    let _ = writeln!(
        s,
        "\n## 2. Contention: one lock, N clients\n\nEach client is a thread with its own connection \
         (plus a subscription connection for Redisson) looping acquire (waiting) → `INCR` → release \
         for {:.1} s; {} rounds. All clients use redis-rs, so only the algorithm differs:\n\n\
         - **rlock WAIT**: `RLOCK.ACQUIRE key owner 10000 WAIT <time left>`; the server queues waiters \
         and hands the lock to the first one on release.\n\
         - **Redisson algorithm**: the acquire script; on a PTTL, `SUBSCRIBE` to the unlock channel, then \
         retry / wait for a message up to min(ttl, time left) / retry; unsubscribe once held (each \
         client models one JVM). Release with the unlock script (with its latch key).\n\
         - **polling SET NX + backoff**: `SET NX PX`, on failure sleep a random 0..cap with cap \
         doubling from 1 ms to 32 ms; release with redis-py's compare-and-delete script. This is far \
         more eager than the libraries' defaults (redis-py sleeps 100 ms, redsync 50–250 ms).\n\n\
         Wait = from the start of the acquire call until the lock is held. Checked on every run \
         (a failure fails `make bench`): the shared counter equals the number of acquisitions, and \
         no two critical sections seen by the clients overlap in time.\n",
        plan.ct_dur.as_secs_f64(),
        plan.ct_rounds
    );
    if let Some(p) = chart_path {
        let _ = writeln!(s, "![contention chart]({})\n", p.display());
    }
    let _ = writeln!(
        s,
        "| Algorithm | Clients | Owner changes/s | Acquisitions/s | Wait p50 | Wait p99 | Wait max | Jain | Acquisitions |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mut cells: Vec<&Vec<ContentionResult>> = res.contention.iter().collect();
    cells.sort_by_key(|c| (c[0].clients, c[0].algo as u8));
    for c in cells {
        let med =
            |f: &dyn Fn(&ContentionResult) -> f64| median(&c.iter().map(f).collect::<Vec<_>>());
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {:.4} | {} |",
            c[0].algo.label(),
            c[0].clients,
            med(&|r| r.owner_changes_per_s),
            med(&|r| r.acquisitions_per_s),
            fmt_us(med(&|r| r.p50_us as f64)),
            fmt_us(med(&|r| r.p99_us as f64)),
            fmt_us(c.iter().map(|r| r.max_us).max().unwrap_or(0) as f64),
            med(&|r| r.jain),
            c.iter().map(|r| r.acquisitions).sum::<u64>()
        );
    }
    let _ = writeln!(
        s,
        "\nOwner changes/s count the lock passing to another client (a handoff); \
         acquisitions/s count every acquisition, including a releaser taking the lock \
         straight back, which a barging lock (polling) does most of the time.\n\n\
         Ratios, median of per-round ratios (owner changes; acquisitions in brackets):\n"
    );
    let mut ns: Vec<usize> = res.contention.iter().map(|c| c[0].clients).collect();
    ns.sort_unstable();
    ns.dedup();
    for n in ns {
        let r = |a: Algo, b: Algo| match (cell(res, a, n), cell(res, b, n)) {
            (Some(x), Some(y)) => format!(
                "{:.2}× ({:.2}×)",
                paired_ratio(&handoffs(x), &handoffs(y)),
                paired_ratio(&acquisitions(x), &acquisitions(y))
            ),
            _ => "—".into(),
        };
        let _ = writeln!(
            s,
            "- {n} client(s): rlock / Redisson {}, rlock / polling {}",
            r(Algo::Rlock, Algo::Redisson),
            r(Algo::Rlock, Algo::Polling)
        );
    }

    // 3. Takeover.
    let _ = writeln!(
        s,
        "\n## 3. Takeover after a vanished holder\n\nA holder takes the lock with a {} ms lease and never \
         releases; a waiter is already waiting. Measured: from the end of the lease (taken from when the \
         holder's acquire was *sent*, so it errs on the slow side by up to one round trip) until the \
         waiter holds the lock. {} other keys with TTLs are in the database, so Redis's sampling \
         active-expire cycle is unlikely to reach the lock key early. {} samples each, alternating.\n",
        plan.to_lease_ms, plan.to_other_keys, plan.to_samples
    );
    let _ = writeln!(s, "| Algorithm | p50 | p99 | max |\n|---|---:|---:|---:|");
    for (a, v) in &res.takeover {
        let mut x = v.clone();
        x.sort_by(f64::total_cmp);
        let _ = writeln!(
            s,
            "| {} | {:.2} ms | {:.2} ms | {:.2} ms |",
            a.label(),
            percentile(&x, 50.0),
            percentile(&x, 99.0),
            x.last().copied().unwrap_or(0.0)
        );
    }

    // 4. Memory.
    let _ = writeln!(
        s,
        "\n## 4. Memory\n\n`used_memory` difference between two settled readings (stable for 1 s), \
         divided by the count. Held locks: {} locks on distinct 12-byte keys with a 38-byte owner. \
         Waiters: {} connections are opened, used once (PING) and left idle for {:.1} s before the \
         baseline, and the waiters again for as long before the second reading: Redis 7.0 gives a \
         client that sent a command a 16 KiB query buffer and shrinks it only after 2 s idle. So \
         the figure is the waiting itself, not the connection. One lock is held throughout; the \
         waiters all wait for it.\n",
        plan.mem_locks,
        plan.mem_waiters,
        plan.mem_settle.idle.as_secs_f64()
    );
    let _ = writeln!(s, "| Held lock | bytes each |\n|---|---:|");
    for (k, b) in &res.held_memory {
        let _ = writeln!(s, "| {} | {:.1} |", k.label(), b);
    }
    let _ = writeln!(
        s,
        "\n| Waiter | bytes each | of which in the connection's own buffers (`mem_clients_normal`) |\n|---|---:|---:|"
    );
    for (k, b) in &res.waiter_memory {
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1} |",
            k.label(),
            b.total,
            b.client_buffers
        );
    }
    if let Some(n) = notes {
        let _ = writeln!(s, "\n{}", n.trim_end());
    }
    s
}

fn fmt_us(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}
