//! Uncontended, pipelined throughput: every command is on a fresh key, as an
//! application taking many independent locks would be. Each worker thread owns one
//! connection and keeps `DEPTH` commands in flight (redis-benchmark's `-P 16`).

use std::io::Write;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::locks::{channel_of, Shas, REDISSON_LATCH_MS};
use crate::resp::{encode, RawConn, Reply};
use crate::Res;

/// Commands in flight per connection.
pub const DEPTH: usize = 16;
/// Lease of every throughput lock: long enough that nothing expires during a run.
const LEASE: &[u8] = b"30000";
/// Redisson's owner id shape: `<uuid>:<thread id>`. Every implementation gets an
/// owner (or token) of this length so key and value sizes match.
const OWNER: &[u8] = b"6f1c2e0a-94d4-4c1b-9a57-0f6a3b2d8e11:1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    RlockAcquire,
    RedissonAcquire,
    SetNx,
    RlockCycle,
    RedissonCycle,
    RedisPyCycle,
}

impl Workload {
    pub const ACQUIRE: [Workload; 3] = [
        Workload::RlockAcquire,
        Workload::RedissonAcquire,
        Workload::SetNx,
    ];
    pub const CYCLE: [Workload; 3] = [
        Workload::RlockCycle,
        Workload::RedissonCycle,
        Workload::RedisPyCycle,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Workload::RlockAcquire => "RLOCK.ACQUIRE",
            Workload::RedissonAcquire => "Redisson acquire script (EVALSHA)",
            Workload::SetNx => "SET key v NX PX",
            Workload::RlockCycle => "RLOCK.ACQUIRE + RLOCK.RELEASE",
            Workload::RedissonCycle => "Redisson acquire + unlock scripts",
            Workload::RedisPyCycle => "SET NX PX + compare-and-delete (redis-py Lock)",
        }
    }

    pub fn needs_module(self) -> bool {
        matches!(self, Workload::RlockAcquire | Workload::RlockCycle)
    }

    fn commands_per_op(self) -> usize {
        match self {
            Workload::RlockAcquire | Workload::RedissonAcquire | Workload::SetNx => 1,
            _ => 2,
        }
    }

    /// Appends one operation on `key` and returns nothing; the expected replies are
    /// checked by `expect`.
    fn push_op(self, buf: &mut Vec<u8>, key: &[u8], shas: &Shas, scratch: &mut Vec<u8>) {
        match self {
            Workload::RlockAcquire => encode(buf, &[b"RLOCK.ACQUIRE", key, OWNER, LEASE]),
            Workload::RedissonAcquire => encode(
                buf,
                &[b"EVALSHA", shas.acquire.as_bytes(), b"1", key, LEASE, OWNER],
            ),
            Workload::SetNx => encode(buf, &[b"SET", key, OWNER, b"NX", b"PX", LEASE]),
            Workload::RlockCycle => {
                encode(buf, &[b"RLOCK.ACQUIRE", key, OWNER, LEASE]);
                encode(buf, &[b"RLOCK.RELEASE", key, OWNER]);
            }
            Workload::RedissonCycle => {
                encode(
                    buf,
                    &[b"EVALSHA", shas.acquire.as_bytes(), b"1", key, LEASE, OWNER],
                );
                let k = std::str::from_utf8(key).expect("ascii key");
                let chan = channel_of(k);
                scratch.clear();
                scratch.extend_from_slice(b"redisson_unlock_latch:{");
                scratch.extend_from_slice(key);
                scratch.extend_from_slice(b"}:r");
                scratch.extend_from_slice(key);
                encode(
                    buf,
                    &[
                        b"EVALSHA",
                        shas.unlock.as_bytes(),
                        b"3",
                        key,
                        chan.as_bytes(),
                        scratch,
                        b"0",
                        LEASE,
                        OWNER,
                        b"publish",
                        REDISSON_LATCH_MS.as_bytes(),
                    ],
                );
            }
            Workload::RedisPyCycle => {
                encode(buf, &[b"SET", key, OWNER, b"NX", b"PX", LEASE]);
                encode(buf, &[b"EVALSHA", shas.cad.as_bytes(), b"1", key, OWNER]);
            }
        }
    }

    /// The reply the `i`th command of an operation must get on a fresh key.
    fn expect(self, i: usize, r: &Reply) -> bool {
        match (self, i) {
            (Workload::RlockAcquire | Workload::RedissonAcquire, _) => *r == Reply::Nil,
            (Workload::SetNx, _) => *r == Reply::Status,
            (Workload::RlockCycle | Workload::RedissonCycle, 0) => *r == Reply::Nil,
            (Workload::RedisPyCycle, 0) => *r == Reply::Status,
            (_, _) => *r == Reply::Int(1),
        }
    }
}

/// Runs `w` on `conns` connections for `dur` and returns (operations, seconds); an
/// operation is one acquire, or one acquire + release cycle. Every reply is checked, so
/// a broken implementation fails the run instead of looking fast.
pub fn run(
    port: u16,
    w: Workload,
    conns: usize,
    dur: Duration,
    shas: &Shas,
    tag: u64,
) -> Res<(u64, f64)> {
    let barrier = Arc::new(Barrier::new(conns + 1));
    let mut handles = Vec::new();
    for t in 0..conns {
        let barrier = barrier.clone();
        let shas = shas.clone();
        handles.push(std::thread::spawn(move || -> Res<(u64, Duration)> {
            let mut c = RawConn::connect(port)?;
            let per_batch = (DEPTH / w.commands_per_op()).max(1);
            let mut buf = Vec::with_capacity(DEPTH * 200);
            let mut key = Vec::with_capacity(32);
            let mut scratch = Vec::with_capacity(64);
            let mut seq: u64 = 0;
            barrier.wait();
            let start = Instant::now();
            // Bounded in time and, should the clock misbehave, in count.
            while start.elapsed() < dur && seq < 100_000_000 {
                buf.clear();
                for _ in 0..per_batch {
                    key.clear();
                    write!(key, "tp:{tag}:{t}:{seq}")?;
                    w.push_op(&mut buf, &key, &shas, &mut scratch);
                    seq += 1;
                }
                c.send(&buf)?;
                for _ in 0..per_batch {
                    for i in 0..w.commands_per_op() {
                        let r = c.read_reply()?;
                        if !w.expect(i, &r) {
                            return Err(format!("{}: command {i} answered {r:?}", w.label()).into());
                        }
                    }
                }
            }
            Ok((seq, start.elapsed()))
        }));
    }
    barrier.wait();
    let mut ops = 0u64;
    let mut longest = Duration::ZERO;
    for h in handles {
        let (n, d) = h.join().map_err(|_| "throughput worker panicked")??;
        ops += n;
        longest = longest.max(d);
    }
    Ok((ops, longest.as_secs_f64()))
}
