//! `make bench-rw`: read-write lock contention, rlock's RRWLOCK (waiting in the server,
//! FIFO with readers at the head granted together) against Redisson's RW algorithm (its
//! read/write lock and unlock scripts, a subscription to `redisson_rwlock:{name}`, retry
//! on each message or at the holder's TTL), on one private redis-server.
//!
//! N clients (default 64; every 8th a writer) loop acquire → critical section → release
//! for a fixed time. A writer's section INCRs a counter, a reader's GETs it. Reported:
//! acquisitions per second (both sides: each is a handoff or a shared grant), handoffs per
//! second (see [`handoffs`]), writer and reader wait percentiles, writer acquisitions.
//! Checked, so that a fast-but-wrong run cannot pass: the counter equals the writer
//! acquisitions, and no writer's observed section overlaps any other section.
//!
//! Usage: rw_contention --module PATH [--redis-server PATH] [--clients 64]
//!        [--seconds 5] [--rounds 2]

#[path = "../server.rs"]
mod server;
#[path = "../stats.rs"]
#[allow(dead_code)]
mod stats;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use redis::{Connection, Value};

pub type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const KEY: &str = "bench:rw";
const CHANNEL: &str = "redisson_rwlock:{bench:rw}";
const COUNTER: &str = "bench:rw:counter";
const LEASE_MS: u64 = 10_000;
const GRACE: Duration = Duration::from_secs(3);
const LATCH_MS: u64 = 13_500;

// Redisson 4.7.0's scripts (tests/support/redisson_rw.py holds the same text with comments).
const READ_ACQUIRE: &str = "local mode = redis.call('hget', KEYS[1], 'mode'); if (mode == false) then redis.call('hset', KEYS[1], 'mode', 'read'); redis.call('hset', KEYS[1], ARGV[2], 1); redis.call('set', KEYS[2] .. ':1', 1); redis.call('pexpire', KEYS[2] .. ':1', ARGV[1]); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; if (mode == 'read') or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then local ind = redis.call('hincrby', KEYS[1], ARGV[2], 1); local key = KEYS[2] .. ':' .. ind; redis.call('set', key, 1); redis.call('pexpire', key, ARGV[1]); local remainTime = redis.call('pttl', KEYS[1]); redis.call('pexpire', KEYS[1], math.max(remainTime, ARGV[1])); return nil; end; return redis.call('pttl', KEYS[1]);";
const READ_UNLOCK: &str = "local val = redis.call('get', KEYS[5]); if val ~= false then return tonumber(val); end; local mode = redis.call('hget', KEYS[1], 'mode'); if (mode == false) then redis.call(ARGV[3], KEYS[2], ARGV[1]); redis.call('set', KEYS[5], 1, 'px', ARGV[4]); return nil; end; local lockExists = redis.call('hexists', KEYS[1], ARGV[2]); if (lockExists == 0) then return nil; end; local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1); if (counter == 0) then redis.call('hdel', KEYS[1], ARGV[2]); end; redis.call('del', KEYS[3] .. ':' .. (counter+1)); if (redis.call('hlen', KEYS[1]) > 1) then local maxRemainTime = -3; local keys = redis.call('hkeys', KEYS[1]); for n, key in ipairs(keys) do counter = tonumber(redis.call('hget', KEYS[1], key)); if type(counter) == 'number' then for i=counter, 1, -1 do local remainTime = redis.call('pttl', KEYS[4] .. ':' .. key .. ':rwlock_timeout:' .. i); maxRemainTime = math.max(remainTime, maxRemainTime); end; end; end; if maxRemainTime > 0 then redis.call('pexpire', KEYS[1], maxRemainTime); redis.call('set', KEYS[5], 0, 'px', ARGV[4]); return 0; end; if mode == 'write' then redis.call('set', KEYS[5], 0, 'px', ARGV[4]); return 0; end; end; redis.call('del', KEYS[1]); redis.call(ARGV[3], KEYS[2], ARGV[1]); redis.call('set', KEYS[5], 1, 'px', ARGV[4]); return 1;";
const WRITE_ACQUIRE: &str = "local mode = redis.call('hget', KEYS[1], 'mode'); if (mode == false) then redis.call('hset', KEYS[1], 'mode', 'write'); redis.call('hset', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; if (mode == 'write') then if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('hincrby', KEYS[1], ARGV[2], 1); local currentExpire = redis.call('pttl', KEYS[1]); redis.call('pexpire', KEYS[1], currentExpire + ARGV[1]); return nil; end; end; return redis.call('pttl', KEYS[1]);";
const WRITE_UNLOCK: &str = "local val = redis.call('get', KEYS[3]); if val ~= false then return tonumber(val); end; local mode = redis.call('hget', KEYS[1], 'mode'); if (mode == false) then redis.call(ARGV[4], KEYS[2], ARGV[1]); redis.call('set', KEYS[3], 1, 'px', ARGV[5]); return nil; end; if (mode == 'write') then local lockExists = redis.call('hexists', KEYS[1], ARGV[3]); if (lockExists == 0) then return nil; else local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); redis.call('set', KEYS[3], 0, 'px', ARGV[5]); return 0; else redis.call('hdel', KEYS[1], ARGV[3]); if (redis.call('hlen', KEYS[1]) == 1) then redis.call('del', KEYS[1]); redis.call(ARGV[4], KEYS[2], ARGV[1]); else redis.call('hset', KEYS[1], 'mode', 'read'); end; redis.call('set', KEYS[3], 1, 'px', ARGV[5]); return 1; end; end; end; return nil;";

static REQUEST_IDS: AtomicU64 = AtomicU64::new(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algo {
    Rlock,
    Redisson,
}

impl Algo {
    fn label(self) -> &'static str {
        match self {
            Algo::Rlock => "rlock RRWLOCK WAIT",
            Algo::Redisson => "Redisson RW algorithm",
        }
    }
}

#[derive(Clone)]
struct Shas {
    read: String,
    read_unlock: String,
    write: String,
    write_unlock: String,
}

struct Client {
    algo: Algo,
    writer: bool,
    owner: String,
    con: Connection,
    sub: Connection,
    shas: Shas,
}

/// Redisson's read or write acquire script: None acquired, Some(pttl) held against us.
fn try_script(con: &mut Connection, shas: &Shas, writer: bool, owner: &str) -> Res<Option<i64>> {
    let mut c = redis::cmd("EVALSHA");
    if writer {
        c.arg(&shas.write).arg(1).arg(KEY).arg(LEASE_MS);
        c.arg(format!("{owner}:write"));
    } else {
        c.arg(&shas.read).arg(2).arg(KEY);
        c.arg(format!("{{{KEY}}}:{owner}:rwlock_timeout"));
        c.arg(LEASE_MS).arg(owner);
        c.arg(format!("{owner}:write"));
    }
    match c.query(con)? {
        Value::Nil => Ok(None),
        Value::Int(t) => Ok(Some(t)),
        other => Err(format!("Redisson acquire answered {other:?}").into()),
    }
}

impl Client {
    fn side(&self) -> &'static str {
        if self.writer {
            "WRITE"
        } else {
            "READ"
        }
    }

    fn try_script(&mut self) -> Res<Option<i64>> {
        try_script(&mut self.con, &self.shas, self.writer, &self.owner)
    }

    /// Waits no later than `deadline`; false when the wait ran out.
    fn acquire(&mut self, deadline: Instant) -> Res<bool> {
        match self.algo {
            Algo::Rlock => {
                let left = deadline
                    .saturating_duration_since(Instant::now())
                    .as_millis() as u64;
                let v: Value = redis::cmd("RRWLOCK.ACQUIRE")
                    .arg(KEY)
                    .arg(self.side())
                    .arg(&self.owner)
                    .arg(LEASE_MS)
                    .arg("WAIT")
                    .arg(left.max(1))
                    .query(&mut self.con)?;
                Ok(v == Value::Nil)
            }
            Algo::Redisson => {
                if self.try_script()?.is_none() {
                    return Ok(true);
                }
                // RedissonLock.lock: subscribe, then try → wait for a message up to the
                // holder's TTL → retry, until acquired (one JVM per client).
                let (con, shas, writer, owner) =
                    (&mut self.con, &self.shas, self.writer, &self.owner);
                let mut ps = self.sub.as_pubsub();
                ps.subscribe(CHANNEL)?;
                let outcome = loop {
                    let Some(ttl) = try_script(con, shas, writer, owner)? else {
                        break Ok(true);
                    };
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break Ok(false);
                    }
                    let wait = if ttl >= 0 {
                        left.min(Duration::from_millis(ttl as u64))
                    } else {
                        left
                    };
                    if wait.is_zero() {
                        continue;
                    }
                    ps.set_read_timeout(Some(wait))?;
                    match ps.get_message() {
                        Ok(_) => {}
                        Err(e) if e.is_timeout() => {}
                        Err(e) => break Err(e.into()),
                    }
                };
                // Dropping `ps` unsubscribes and reads the confirmation: a sane timeout.
                ps.set_read_timeout(Some(Duration::from_secs(10)))?;
                outcome
            }
        }
    }

    fn release(&mut self) -> Res<()> {
        let v: Value = match self.algo {
            Algo::Rlock => redis::cmd("RRWLOCK.RELEASE")
                .arg(KEY)
                .arg(self.side())
                .arg(&self.owner)
                .query(&mut self.con)?,
            Algo::Redisson => {
                let id = REQUEST_IDS.fetch_add(1, Ordering::Relaxed);
                let latch = format!(
                    "redisson_unlock_latch:{{{KEY}}}:{:08x}-{id:016x}",
                    std::process::id()
                );
                let mut c = redis::cmd("EVALSHA");
                if self.writer {
                    c.arg(&self.shas.write_unlock)
                        .arg(3)
                        .arg(KEY)
                        .arg(CHANNEL)
                        .arg(latch);
                    c.arg(1).arg(LEASE_MS).arg(format!("{}:write", self.owner));
                    c.arg("publish").arg(LATCH_MS);
                } else {
                    c.arg(&self.shas.read_unlock).arg(5).arg(KEY).arg(CHANNEL);
                    c.arg(format!("{{{KEY}}}:{}:rwlock_timeout", self.owner));
                    c.arg(format!("{{{KEY}}}")).arg(latch);
                    c.arg(0).arg(&self.owner).arg("publish").arg(LATCH_MS);
                }
                c.query(&mut self.con)?
            }
        };
        match v {
            Value::Int(0 | 1) => Ok(()),
            other => Err(format!("{}: release answered {other:?}", self.algo.label()).into()),
        }
    }
}

struct Log {
    client: usize,
    writer: bool,
    count: u64,
    late: u64,
    /// Acquires that had not been granted when the run's grace ran out.
    censored: u64,
    waits_us: Vec<u64>,
    /// (start, end) in µs since the run's epoch, and whether it started within the run.
    sections: Vec<(u64, u64, bool)>,
}

struct Outcome {
    algo: Algo,
    per_s: f64,
    handoffs_per_s: f64,
    writer_per_s: f64,
    w_p50: u64,
    w_p99: u64,
    r_p50: u64,
    r_p99: u64,
    w_censored: u64,
}

/// One critical section as its client saw it (inside the real hold: after the grant's
/// reply, before the release was sent).
struct Section {
    start: u64,
    end: u64,
    writer: bool,
    client: usize,
    in_run: bool,
}

/// Handoffs: the times the lock passed from one holder set to a different one. A write
/// acquisition counts unless the previous acquisition was the same writer's (re-taking
/// its own lock); a read acquisition counts when it opens a new read phase, i.e. when the
/// previous acquisition was a write (readers joining or following readers share the
/// phase). The first acquisition counts (from nobody). `sections` must be sorted by start:
/// since no writer's section overlaps any other (checked before), that is the order of
/// the real holds, so the count is exact. Only acquisitions within the run count.
fn handoffs(sections: &[Section]) -> u64 {
    let mut prev: Option<(bool, usize)> = None;
    let mut n = 0;
    for s in sections {
        let change = match prev {
            None => true,
            Some((prev_writer, prev_client)) => {
                if s.writer {
                    !(prev_writer && prev_client == s.client)
                } else {
                    prev_writer
                }
            }
        };
        if change && s.in_run {
            n += 1;
        }
        prev = Some((s.writer, s.client));
    }
    n
}

fn run(server: &server::Server, algo: Algo, shas: &Shas, n: usize, dur: Duration) -> Res<Outcome> {
    let mut admin = server.client()?;
    redis::cmd("FLUSHALL").exec(&mut admin)?;
    let barrier = Arc::new(Barrier::new(n + 1));
    let epoch = Instant::now();
    let mut handles = Vec::new();
    for i in 0..n {
        let mut client = Client {
            algo,
            writer: i % 8 == 0,
            owner: format!("6f1c2e0a-94d4-4c1b-9a57-{:012x}:{i}", std::process::id()),
            con: server.client()?,
            sub: server.client()?,
            shas: shas.clone(),
        };
        client.con.set_read_timeout(Some(Duration::from_secs(15)))?;
        let barrier = barrier.clone();
        handles.push(std::thread::spawn(move || -> Res<Log> {
            let mut log = Log {
                client: i,
                writer: client.writer,
                count: 0,
                late: 0,
                censored: 0,
                waits_us: Vec::new(),
                sections: Vec::new(),
            };
            barrier.wait();
            let stop = Instant::now() + dur;
            let hard = stop + GRACE;
            while Instant::now() < stop {
                let t0 = Instant::now();
                if !client.acquire(hard)? {
                    // Still waiting when the grace ran out: a wait at least this long.
                    log.waits_us.push((Instant::now() - t0).as_micros() as u64);
                    log.censored += 1;
                    break;
                }
                let t1 = Instant::now();
                if client.writer {
                    redis::cmd("INCR").arg(COUNTER).exec(&mut client.con)?;
                } else {
                    redis::cmd("GET").arg(COUNTER).exec(&mut client.con)?;
                }
                let t2 = Instant::now();
                client.release()?;
                log.sections.push((
                    (t1 - epoch).as_micros() as u64,
                    (t2 - epoch).as_micros() as u64,
                    t1 <= stop,
                ));
                // Every wait counts, also one that ended after the run (a starved writer's).
                log.waits_us.push((t1 - t0).as_micros() as u64);
                if t1 <= stop {
                    log.count += 1;
                } else {
                    log.late += 1;
                }
            }
            Ok(log)
        }));
    }
    barrier.wait();
    let mut logs = Vec::new();
    for h in handles {
        logs.push(h.join().map_err(|_| "client panicked")??);
    }
    let writes: u64 = logs
        .iter()
        .filter(|l| l.writer)
        .map(|l| l.count + l.late)
        .sum();
    let counter: Option<u64> = redis::cmd("GET").arg(COUNTER).query(&mut admin)?;
    if counter.unwrap_or(0) != writes {
        return Err(format!("{}: counter {counter:?} but {writes} writes", algo.label()).into());
    }
    // No writer's section may overlap any other: sweep by start time.
    let mut all: Vec<Section> = logs
        .iter()
        .flat_map(|l| {
            l.sections.iter().map(move |&(start, end, in_run)| Section {
                start,
                end,
                writer: l.writer,
                client: l.client,
                in_run,
            })
        })
        .collect();
    all.sort_unstable_by_key(|s| (s.start, s.end, s.client));
    let (mut max_end, mut max_writer_end) = (0u64, 0u64);
    for &Section {
        start, end, writer, ..
    } in &all
    {
        if start < max_writer_end || (writer && start < max_end) {
            return Err(format!("{}: a writer's section overlaps another", algo.label()).into());
        }
        max_end = max_end.max(end);
        if writer {
            max_writer_end = max_writer_end.max(end);
        }
    }
    let waits = |w: bool| {
        let mut v: Vec<u64> = logs
            .iter()
            .filter(|l| l.writer == w)
            .flat_map(|l| l.waits_us.iter().copied())
            .collect();
        v.sort_unstable();
        v
    };
    let (ww, rw) = (waits(true), waits(false));
    let total: u64 = logs.iter().map(|l| l.count).sum();
    Ok(Outcome {
        algo,
        per_s: total as f64 / dur.as_secs_f64(),
        handoffs_per_s: handoffs(&all) as f64 / dur.as_secs_f64(),
        writer_per_s: logs
            .iter()
            .filter(|l| l.writer)
            .map(|l| l.count)
            .sum::<u64>() as f64
            / dur.as_secs_f64(),
        w_p50: stats::percentile(&ww, 50.0),
        w_p99: stats::percentile(&ww, 99.0),
        r_p50: stats::percentile(&rw, 50.0),
        r_p99: stats::percentile(&rw, 99.0),
        w_censored: logs.iter().filter(|l| l.writer).map(|l| l.censored).sum(),
    })
}

fn main() -> Res<()> {
    let mut module = None;
    let mut redis_server = PathBuf::from("redis-server");
    let (mut n, mut secs, mut rounds) = (64usize, 5u64, 2usize);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--module" => module = Some(PathBuf::from(val()?)),
            "--redis-server" => redis_server = PathBuf::from(val()?),
            "--clients" => n = val()?.parse()?,
            "--seconds" => secs = val()?.parse()?,
            "--rounds" => rounds = val()?.parse()?,
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    let module = module.ok_or("--module PATH is required")?;
    let server = server::Server::start(&redis_server, Some(&module))?;
    let mut admin = server.client()?;
    let mut load =
        |s: &str| -> Res<String> { Ok(redis::cmd("SCRIPT").arg("LOAD").arg(s).query(&mut admin)?) };
    let shas = Shas {
        read: load(READ_ACQUIRE)?,
        read_unlock: load(READ_UNLOCK)?,
        write: load(WRITE_ACQUIRE)?,
        write_unlock: load(WRITE_UNLOCK)?,
    };
    println!(
        "RW contention: {n} clients (every 8th a writer), {secs} s per run, {rounds} rounds, lease {LEASE_MS} ms"
    );
    println!("| round | algorithm | handoffs/s | acquisitions/s | writer acq/s | writer p50 µs | writer p99 µs | reader p50 µs | reader p99 µs | writers never served |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut best: Vec<(Algo, Vec<Outcome>)> = vec![(Algo::Rlock, vec![]), (Algo::Redisson, vec![])];
    for round in 1..=rounds {
        for (algo, outs) in best.iter_mut() {
            let o = run(&server, *algo, &shas, n, Duration::from_secs(secs))?;
            println!(
                "| {round} | {} | {:.1} | {:.0} | {:.0} | {} | {} | {} | {} | {} |",
                o.algo.label(),
                o.handoffs_per_s,
                o.per_s,
                o.writer_per_s,
                o.w_p50,
                o.w_p99,
                o.r_p50,
                o.r_p99,
                o.w_censored
            );
            outs.push(o);
        }
    }
    let med = |v: &[Outcome], f: fn(&Outcome) -> f64| {
        let xs: Vec<f64> = v.iter().map(f).collect();
        stats::median(&xs)
    };
    let (m, r) = (&best[0].1, &best[1].1);
    println!(
        "median ratios: handoffs/s rlock/Redisson {:.2}x; acquisitions/s rlock/Redisson {:.2}x; writer acq/s {:.2}x; writer p99 wait Redisson/rlock {:.2}x",
        med(m, |o| o.handoffs_per_s) / med(r, |o| o.handoffs_per_s),
        med(m, |o| o.per_s) / med(r, |o| o.per_s),
        med(m, |o| o.writer_per_s) / med(r, |o| o.writer_per_s),
        med(r, |o| o.w_p99 as f64) / med(m, |o| o.w_p99 as f64)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(start: u64, writer: bool, client: usize) -> Section {
        Section {
            start,
            end: start + 1,
            writer,
            client,
            in_run: true,
        }
    }

    #[test]
    fn handoffs_count_holder_set_changes() {
        // R1 (from nobody), R2 joins, W3 (change), W3 again (same writer), W4 (change),
        // R1 (new read phase), R5 (same phase), W3 (change).
        let seq = [
            s(1, false, 1),
            s(2, false, 2),
            s(3, true, 3),
            s(4, true, 3),
            s(5, true, 4),
            s(6, false, 1),
            s(7, false, 5),
            s(8, true, 3),
        ];
        assert_eq!(handoffs(&seq), 5);
        let mut late = seq;
        late[7].in_run = false;
        assert_eq!(handoffs(&late), 4);
    }
}
