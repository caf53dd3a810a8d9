//! Contention across processes, module mode against scripts mode (docs/scripts-mode.md):
//! `procs` contender processes loop acquire / hold 1 ms / release on one lock for
//! `seconds`; the parent prints acquisitions/s, the p99 wait, Jain's fairness index over the
//! processes' shares, and the connections the server had mid-run.
//!
//! ```text
//! cargo run --release -p rlock-client --example contenders -- <redis-url> <module|scripts> <procs> <seconds>
//! ```
//!
//! The URL names a server with the module for `module`, any server for `scripts`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rlock_client::{Client, ClientOptions, Mode};

const LOCK: &str = "bench:contenders";

fn mode_of(s: &str) -> Mode {
    if s == "scripts" {
        Mode::Scripts
    } else {
        Mode::Module
    }
}

/// One contender: prints `<acquisitions> <wait µs>...`.
fn child(url: &str, mode: Mode, seconds: u64) -> Result<(), rlock_client::Error> {
    let opts = ClientOptions::new().with_mode(mode).with_replica_sync(None);
    let c = Client::open_with(url, opts)?;
    let lock = c.lock(LOCK);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut waits = Vec::new();
    while Instant::now() < end {
        let t = Instant::now();
        let Some(g) = lock.acquire_timeout(Duration::from_secs(seconds))? else {
            continue;
        };
        waits.push(t.elapsed().as_micros() as u64);
        std::thread::sleep(Duration::from_millis(1));
        g.release()?;
    }
    let words: Vec<String> = waits.iter().map(u64::to_string).collect();
    println!("{} {}", waits.len(), words.join(" "));
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("child") {
        child(&args[1], mode_of(&args[2]), args[3].parse()?)?;
        return Ok(());
    }
    let [url, mode, procs, seconds] = args.as_slice() else {
        return Err("usage: contenders <redis-url> <module|scripts> <procs> <seconds>".into());
    };
    let procs: usize = procs.parse()?;
    let exe = std::env::current_exe()?;
    let children: Vec<_> = (0..procs)
        .map(|_| {
            Command::new(&exe)
                .args(["child", url, mode, seconds])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    // Connections mid-run, as the server counts them (less this one).
    std::thread::sleep(Duration::from_secs(seconds.parse::<u64>()? / 2 + 1));
    let mut admin = redis::Client::open(url.as_str())?.get_connection()?;
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut admin)?;
    let conns = list.lines().count() - 1;
    let mut shares = Vec::new();
    let mut waits = Vec::new();
    for ch in children {
        let out = ch.wait_with_output()?;
        let text = String::from_utf8(out.stdout)?;
        let mut words = text.split_whitespace();
        shares.push(words.next().unwrap_or("0").parse::<f64>()?);
        waits.extend(words.map(|w| w.parse::<u64>().unwrap_or(0)));
    }
    waits.sort_unstable();
    let total: f64 = shares.iter().sum();
    let jain = total * total / (shares.len() as f64 * shares.iter().map(|x| x * x).sum::<f64>());
    let p99 = waits
        .get(waits.len().saturating_sub(1) * 99 / 100)
        .copied()
        .unwrap_or(0);
    println!(
        "{mode:8} {procs:3} procs: {:8.0} acquisitions/s  p99 wait {:8.1} ms  Jain {:.3}  connections {conns}",
        total / seconds.parse::<f64>()?,
        p99 as f64 / 1000.0,
        jain
    );
    Ok(())
}
