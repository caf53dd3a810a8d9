//! Contention: N clients on one lock, each looping acquire (waiting) → INCR → release
//! for a fixed time. Reports owner changes per second (the lock passing to another
//! client: a handoff) apart from acquisitions per second (which, for a barging lock,
//! count the releaser taking it straight back), wait percentiles and Jain's index,
//! and checks two safety properties so a fast-but-wrong implementation cannot pass:
//! the shared counter equals the number of acquisitions, and no two critical sections
//! observed by the clients overlap in time.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::locks::{Algo, Locker, Shas};
use crate::server::Server;
use crate::stats::{jain, percentile};
use crate::Res;

const KEY: &str = "bench:contended";
const COUNTER: &str = "bench:counter";
/// Lease of the contended lock: far above any critical section, so expiry never
/// decides a handoff here (takeover is measured on its own).
const LEASE_MS: u64 = 10_000;
/// How long past the end of a run a client's last acquire may take.
const GRACE: Duration = Duration::from_secs(3);

#[derive(Clone, Debug)]
pub struct ContentionResult {
    pub algo: Algo,
    pub clients: usize,
    /// Acquisitions whose holder differs from the previous holder's, per second.
    pub owner_changes_per_s: f64,
    /// Every acquisition, per second.
    pub acquisitions_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    pub jain: f64,
    pub acquisitions: u64,
    pub owner_changes: u64,
}

struct ClientLog {
    /// Acquisitions within the timed run.
    count: u64,
    /// Acquisitions completed after it (the final drain).
    late: u64,
    waits_us: Vec<u64>,
    /// (acquire reply received, release about to be sent, client index, inside the timed
    /// run), times in µs since the start.
    sections: Vec<(u64, u64, usize, bool)>,
}

pub fn run(
    server: &Server,
    algo: Algo,
    clients: usize,
    dur: Duration,
    shas: &Shas,
) -> Res<ContentionResult> {
    let mut admin = server.client()?;
    redis::cmd("DEL").arg(KEY).arg(COUNTER).exec(&mut admin)?;
    let barrier = Arc::new(Barrier::new(clients + 1));
    // One epoch for every client: section times from different threads are compared.
    let epoch = Instant::now();
    let mut handles = Vec::new();
    for i in 0..clients {
        let con = server.client()?;
        let sub = if algo == Algo::Redisson {
            Some(server.client()?)
        } else {
            None
        };
        let owner = format!("6f1c2e0a-94d4-4c1b-9a57-{:012x}:{}", std::process::id(), i);
        let mut locker = Locker::new(algo, con, sub, shas, KEY, &owner, LEASE_MS)?;
        let barrier = barrier.clone();
        handles.push(std::thread::spawn(move || -> Res<ClientLog> {
            let mut log = ClientLog {
                count: 0,
                late: 0,
                waits_us: Vec::new(),
                sections: Vec::new(),
            };
            barrier.wait();
            let stop = Instant::now() + dur;
            // Waits may run past `stop` by up to GRACE, so the run ends with every
            // client's last acquire granted rather than timed out: acquisitions after
            // `stop` are checked but not counted, and no measurement depends on how an
            // implementation handles a timeout racing a release.
            let hard = stop + GRACE;
            while Instant::now() < stop && log.count < 10_000_000 {
                let t0 = Instant::now();
                if !locker.acquire(hard)? {
                    break;
                }
                let t1 = Instant::now();
                redis::cmd("INCR").arg(COUNTER).exec(locker.con())?;
                let t2 = Instant::now();
                locker.release()?;
                log.sections.push((
                    (t1 - epoch).as_micros() as u64,
                    (t2 - epoch).as_micros() as u64,
                    i,
                    t1 <= stop,
                ));
                if t1 <= stop {
                    log.count += 1;
                    log.waits_us.push((t1 - t0).as_micros() as u64);
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
        logs.push(h.join().map_err(|_| "contention client panicked")??);
    }

    let counts: Vec<u64> = logs.iter().map(|l| l.count).collect();
    let total: u64 = counts.iter().sum();
    let all = total + logs.iter().map(|l| l.late).sum::<u64>();
    let counter: Option<u64> = redis::cmd("GET").arg(COUNTER).query(&mut admin)?;
    if counter.unwrap_or(0) != all {
        return Err(format!(
            "{} with {clients} clients: counter is {counter:?} but {all} acquisitions were made",
            algo.label()
        )
        .into());
    }
    let mut sections: Vec<(u64, u64, usize, bool)> = logs
        .iter()
        .flat_map(|l| l.sections.iter().copied())
        .collect();
    sections.sort_unstable();
    for w in sections.windows(2) {
        // Observed sections lie inside the true hold intervals, so any overlap here
        // is a real mutual-exclusion violation (the converse does not hold).
        if w[1].0 < w[0].1 {
            return Err(format!(
                "{} with {clients} clients: critical sections overlap ({:?} and {:?} µs)",
                algo.label(),
                (w[0].0, w[0].1),
                (w[1].0, w[1].1)
            )
            .into());
        }
    }
    let owner_changes = owner_changes(&sections);
    let mut waits: Vec<u64> = logs
        .iter()
        .flat_map(|l| l.waits_us.iter().copied())
        .collect();
    waits.sort_unstable();
    Ok(ContentionResult {
        algo,
        clients,
        owner_changes_per_s: owner_changes as f64 / dur.as_secs_f64(),
        acquisitions_per_s: total as f64 / dur.as_secs_f64(),
        p50_us: percentile(&waits, 50.0),
        p99_us: percentile(&waits, 99.0),
        max_us: waits.last().copied().unwrap_or(0),
        jain: jain(&counts),
        acquisitions: total,
        owner_changes,
    })
}

/// How many times the lock passed to another client within the timed run. `sections`
/// (start, end, client, in the run) must be sorted by start: they do not overlap (checked
/// before), so that is the order of the holders. The first holder counts (from nobody),
/// as rw_contention's `handoffs` counts.
fn owner_changes(sections: &[(u64, u64, usize, bool)]) -> u64 {
    let mut prev = None;
    let mut n = 0;
    for &(_, _, client, in_run) in sections {
        if in_run && prev != Some(client) {
            n += 1;
        }
        prev = Some(client);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::owner_changes;

    #[test]
    fn a_releaser_taking_the_lock_back_is_no_owner_change() {
        let s = |start, client, in_run| (start, start + 1, client, in_run);
        // 0 from nobody, 0 again (barging), 1, 1, 0, then 2 after the run.
        let seq = [
            s(0, 0, true),
            s(2, 0, true),
            s(4, 1, true),
            s(6, 1, true),
            s(8, 0, true),
            s(10, 2, false),
        ];
        assert_eq!(owner_changes(&seq), 3);
        assert_eq!(owner_changes(&[]), 0);
    }
}
