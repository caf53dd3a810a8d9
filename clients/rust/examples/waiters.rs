//! Many tasks of one async client waiting on one lock, with queued tickets and with
//! blocking `WAIT`, side by side: the client's connections and the server's memory while
//! they all wait, and how long it takes to serve them all once the lock comes free.
//!
//! ```text
//! cargo run --release -p rlock-client --features tokio --example waiters -- redis-url [tasks]
//! ```
//!
//! The server must have the module loaded and `maxclients` above `tasks` (blocking mode
//! opens a connection per waiting task). Keys used: `example:waiters`.

use std::time::{Duration, Instant};

use rlock_client::{AcquireOptions, ClientOptions, WaitMode};

const KEY: &str = "example:waiters";

fn info_field(r: &mut redis::Connection, section: &str, field: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg(section).query(r).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1)
}

fn waiters(r: &mut redis::Connection) -> i64 {
    let v: redis::Value = redis::cmd("RLOCK.INFO").arg(KEY).query(r).unwrap();
    let redis::Value::Array(items) = v else {
        return 0;
    };
    items
        .chunks(2)
        .find_map(|kv| match kv {
            [redis::Value::BulkString(k), redis::Value::Int(n)] if k == b"waiters" => Some(*n),
            _ => None,
        })
        .unwrap_or(0)
}

async fn run(url: &str, tasks: usize, mode: WaitMode) -> Result<(), Box<dyn std::error::Error>> {
    let mut r = redis::Client::open(url)?.get_connection()?;
    let _: () = redis::cmd("DEL").arg(KEY).query(&mut r)?;
    // Held by someone else until every task waits.
    let _: () = redis::cmd("RLOCK.ACQUIRE")
        .arg(KEY)
        .arg("holder")
        .arg(600_000)
        .query(&mut r)?;
    let clients_before = info_field(&mut r, "clients", "connected_clients");
    let mem_before = info_field(&mut r, "memory", "used_memory");
    let client =
        rlock_client::aio::Client::open_with(url, ClientOptions::new().with_wait_mode(mode))
            .await?;
    let mut handles = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        let lock = client.lock(KEY);
        handles.push(tokio::spawn(async move {
            let opts = AcquireOptions::new().with_lease(Duration::from_secs(60));
            let g = lock.acquire_with(opts).await?.expect("waits without limit");
            g.release().await.map(drop)
        }));
    }
    let until = Instant::now() + Duration::from_secs(120);
    while waiters(&mut r) < tasks as i64 {
        if Instant::now() > until {
            return Err("the tasks did not all queue in 120 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let conns = info_field(&mut r, "clients", "connected_clients") - clients_before;
    let mem = info_field(&mut r, "memory", "used_memory") - mem_before;
    let blocked = info_field(&mut r, "clients", "blocked_clients");
    let start = Instant::now();
    let _: () = redis::cmd("RLOCK.RELEASE")
        .arg(KEY)
        .arg("holder")
        .query(&mut r)?;
    for h in handles {
        h.await??;
    }
    let took = start.elapsed();
    println!(
        "{mode:?}: {tasks} waiting tasks: {conns} client connections, {blocked} blocked, \
         server memory +{} KB ({} B per waiter); all served in {:.1} ms ({:.1} us per handoff)",
        mem / 1024,
        mem / tasks as i64,
        took.as_secs_f64() * 1e3,
        took.as_secs_f64() * 1e6 / tasks as f64
    );
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or("usage: waiters redis-url [tasks]")?;
    let tasks = args.next().map_or(Ok(1000), |t| t.parse())?;
    for mode in [WaitMode::Tickets, WaitMode::Blocking] {
        run(&url, tasks, mode).await?;
    }
    Ok(())
}
