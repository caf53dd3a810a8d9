//! Several workers contend for one lock to increment a shared counter with a plain
//! GET / SET read-modify-write, which loses updates without the lock.
//!
//! ```text
//! cargo run -p rlock-client --example counter -- [redis-url] [workers] [increments]
//! ```
//!
//! Without a URL (or with `-`) it starts its own `redis-server` with the module
//! (`$RLOCK_MODULE`, else `target/debug/librlock.so`; `$REDIS_SERVER`, else
//! `redis-server`) on a free port, and stops it at the end. It prints progress, then
//! the exact total and how fairly the lock went round: waiters are served first come,
//! first served in the server, so every worker should get about the same share.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rlock_client::Client;

const COUNTER_KEY: &str = "example:counter";
const LOCK_NAME: &str = "example:counter:lock";

/// A redis-server started for the example, killed when dropped.
struct OwnServer(Child);

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server() -> Result<(String, OwnServer), Box<dyn std::error::Error>> {
    let module = std::env::var("RLOCK_MODULE").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/debug/librlock.so"
        )
        .to_string()
    });
    if !std::path::Path::new(&module).exists() {
        return Err(
            format!("no module at {module}: run `cargo build -p rlock` or give a URL").into(),
        );
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let child = Command::new(bin)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no", "--loadmodule", &module])
        .stdout(Stdio::null())
        .spawn()?;
    let server = OwnServer(child);
    let url = format!("redis://127.0.0.1:{port}/");
    let client = redis::Client::open(url.as_str())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while client
        .get_connection_with_timeout(Duration::from_millis(200))
        .is_err()
    {
        if Instant::now() > deadline {
            return Err("redis-server did not start within 10 s".into());
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ok((url, server))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, _server) = match args.first().map(String::as_str) {
        Some(u) if u != "-" => (u.to_string(), None),
        _ => {
            let (u, s) = start_server()?;
            println!("started redis-server with the module at {u}");
            (u, Some(s))
        }
    };
    let workers: usize = args.get(1).map_or(Ok(4), |s| s.parse())?;
    let target: u64 = args.get(2).map_or(Ok(400), |s| s.parse())?;

    let client = Client::open(url.as_str())?;
    let mut plain = redis::Client::open(url.as_str())?.get_connection()?;
    let _: () = redis::cmd("SET")
        .arg(COUNTER_KEY)
        .arg(0)
        .query(&mut plain)?;

    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let (client, url, done) = (client.clone(), url.clone(), done.clone());
            thread::spawn(move || -> Result<u64, String> {
                let mut conn = redis::Client::open(url.as_str())
                    .and_then(|c| c.get_connection())
                    .map_err(|e| e.to_string())?;
                // One handle per worker: one owner each, so the workers exclude each other.
                let lock = client.lock(LOCK_NAME);
                let mut mine = 0u64;
                loop {
                    let guard = lock.acquire().map_err(|e| e.to_string())?;
                    // The read-modify-write the lock protects.
                    let v: u64 = redis::cmd("GET")
                        .arg(COUNTER_KEY)
                        .query(&mut conn)
                        .map_err(|e| e.to_string())?;
                    if v >= target {
                        guard.release().map_err(|e| e.to_string())?;
                        return Ok(mine);
                    }
                    let _: () = redis::cmd("SET")
                        .arg(COUNTER_KEY)
                        .arg(v + 1)
                        .query(&mut conn)
                        .map_err(|e| e.to_string())?;
                    guard.release().map_err(|e| format!("worker {w}: {e}"))?;
                    mine += 1;
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if n % (target / 10).max(1) == 0 {
                        println!(
                            "  progress: {n:>6}/{target} increments, {:?}",
                            started.elapsed()
                        );
                    }
                }
            })
        })
        .collect();

    let mut shares = Vec::new();
    for (w, h) in handles.into_iter().enumerate() {
        let n = h.join().map_err(|_| "worker panicked")??;
        shares.push((w, n));
    }
    let total: u64 = redis::cmd("GET").arg(COUNTER_KEY).query(&mut plain)?;
    let sum: u64 = shares.iter().map(|s| s.1).sum();
    println!(
        "total: {total} (expected {target}, counted by workers {sum}) in {:?}: {}",
        started.elapsed(),
        if total == target && sum == target {
            "exact"
        } else {
            "LOST UPDATES"
        }
    );
    // Jain's fairness index: 1.0 when every worker got the same share, 1/n when one got all.
    let xs: Vec<f64> = shares.iter().map(|s| s.1 as f64).collect();
    let jain =
        xs.iter().sum::<f64>().powi(2) / (xs.len() as f64 * xs.iter().map(|x| x * x).sum::<f64>());
    for (w, n) in &shares {
        println!(
            "  worker {w}: {n:>6} ({:5.1}%)",
            100.0 * *n as f64 / total.max(1) as f64
        );
    }
    println!("fairness (Jain's index, 1.0 = perfectly even): {jain:.3}");
    if total != target {
        return Err("the counter is wrong".into());
    }
    Ok(())
}
