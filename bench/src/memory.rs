//! Server memory: `used_memory` per held lock and per queued waiter, as the difference
//! between two settled readings divided by the count.

use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::locks::Shas;
use crate::resp::{encode, RawConn, Reply};
use crate::server::Server;
use crate::Res;

const OWNER: &[u8] = b"6f1c2e0a-94d4-4c1b-9a57-0f6a3b2d8e11:1";

fn info_field(c: &mut redis::Connection, section: &str, field: &str) -> Res<i64> {
    let info: String = redis::cmd("INFO").arg(section).query(c)?;
    for line in info.lines() {
        if let Some(v) = line.strip_prefix(field).and_then(|r| r.strip_prefix(':')) {
            return Ok(v.trim().parse()?);
        }
    }
    Err(format!("INFO {section} has no {field}").into())
}

/// How long to let memory settle before a reading (see [`settled_used_memory`]).
#[derive(Clone, Copy, Debug)]
pub struct Settle {
    /// Wait at least this long first.
    pub idle: Duration,
    /// Then wait until the reading is stable for a second; off in the quick smoke run,
    /// whose memory figures are not meant to be read.
    pub stable: bool,
}

/// Reads `used_memory` once it has stopped moving, after at least `idle`. Redis 7.0
/// gives every client that sent a command a 16 KiB query buffer and only shrinks it
/// once the client has been idle for more than 2 s (clientsCron, one pass per second),
/// so a reading taken sooner would count transient buffers as per-waiter cost.
fn settled_used_memory(c: &mut redis::Connection, settle: Settle) -> Res<i64> {
    sleep(settle.idle);
    if !settle.stable {
        return info_field(c, "memory", "used_memory");
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut last = info_field(c, "memory", "used_memory")?;
    let mut stable = 0;
    loop {
        sleep(Duration::from_millis(250));
        let now = info_field(c, "memory", "used_memory")?;
        // Stable for a full second: four readings within 64 bytes.
        stable = if (now - last).abs() <= 64 {
            stable + 1
        } else {
            0
        };
        last = now;
        if stable >= 4 || Instant::now() > deadline {
            return Ok(now);
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeldKind {
    Rlock,
    Redisson,
    SetNx,
}

impl HeldKind {
    pub fn label(self) -> &'static str {
        match self {
            HeldKind::Rlock => "RLOCK.ACQUIRE (hash + TTL)",
            HeldKind::Redisson => "Redisson acquire script (hash + TTL)",
            HeldKind::SetNx => "SET NX PX (string + TTL)",
        }
    }
}

/// Bytes of `used_memory` per held lock, over `n` locks on distinct keys.
pub fn per_held_lock(
    server: &Server,
    kind: HeldKind,
    n: u64,
    shas: &Shas,
    settle: Settle,
) -> Res<f64> {
    let mut admin = server.client()?;
    redis::cmd("FLUSHALL").exec(&mut admin)?;
    let before = settled_used_memory(
        &mut admin,
        Settle {
            idle: Duration::ZERO,
            ..settle
        },
    )?;
    let mut c = RawConn::connect(server.port)?;
    c.load(
        n,
        |j, buf| {
            let key = format!("mem:{j:08}");
            let k = key.as_bytes();
            match kind {
                HeldKind::Rlock => encode(buf, &[b"RLOCK.ACQUIRE", k, OWNER, b"3600000"]),
                HeldKind::Redisson => encode(
                    buf,
                    &[
                        b"EVALSHA",
                        shas.acquire.as_bytes(),
                        b"1",
                        k,
                        b"3600000",
                        OWNER,
                    ],
                ),
                HeldKind::SetNx => encode(buf, &[b"SET", k, OWNER, b"NX", b"PX", b"3600000"]),
            }
        },
        |r| match r {
            Reply::Nil | Reply::Status => Ok(()),
            r => Err(format!("{}: lock creation answered {r:?}", kind.label()).into()),
        },
    )?;
    drop(c);
    let after = settled_used_memory(
        &mut admin,
        Settle {
            idle: Duration::ZERO,
            ..settle
        },
    )?;
    redis::cmd("FLUSHALL").exec(&mut admin)?;
    Ok((after - before) as f64 / n as f64)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaiterKind {
    /// A client blocked in `RLOCK.ACQUIRE ... WAIT`.
    Rlock,
    /// A Redisson waiter: a client subscribed to the lock's unlock channel.
    RedissonSubscriber,
    /// Redis's own blocking (BLPOP on one list), as a reference for what a blocked
    /// client costs when no module is involved.
    NativeBlpop,
}

impl WaiterKind {
    pub fn label(self) -> &'static str {
        match self {
            WaiterKind::Rlock => "rlock queued waiter (blocked RLOCK.ACQUIRE WAIT)",
            WaiterKind::RedissonSubscriber => "Redisson waiter (SUBSCRIBE to the unlock channel)",
            WaiterKind::NativeBlpop => "reference: Redis-native blocked client (BLPOP)",
        }
    }
}

/// Server memory per waiter, in bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct WaiterMemory {
    /// `used_memory` difference per waiter: everything the waiting costs the server.
    pub total: f64,
    /// The part Redis accounts to the waiting connections themselves
    /// (`mem_clients_normal`: buffers, argv, subscriptions).
    pub client_buffers: f64,
}

/// Bytes of `used_memory` per waiter, over `n` waiters on one held lock. The
/// connections are opened, used once and left to settle before the baseline, so the
/// difference is the waiting itself (queue entry, blocked-client state, subscription),
/// not the cost of a connection.
pub fn per_waiter(
    server: &Server,
    kind: WaiterKind,
    n: usize,
    shas: &Shas,
    settle: Settle,
) -> Res<WaiterMemory> {
    let key: &[u8] = b"mem:waited";
    let mut admin = server.client()?;
    redis::cmd("FLUSHALL").exec(&mut admin)?;
    // The holder keeps the lock for the whole measurement.
    let held: redis::Value = redis::cmd("EVALSHA")
        .arg(&shas.acquire)
        .arg(1)
        .arg(key)
        .arg(3_600_000)
        .arg("holder:1")
        .query(&mut admin)?;
    if held != redis::Value::Nil {
        return Err("memory: could not take the waited-on lock".into());
    }
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = RawConn::connect(server.port)?;
        if c.call(&[b"PING"])? != Reply::Status {
            return Err("memory: PING failed".into());
        }
        conns.push(c);
    }
    let before = settled_used_memory(&mut admin, settle)?;
    let clients_before = info_field(&mut admin, "memory", "mem_clients_normal")?;
    let chan = crate::locks::channel_of("mem:waited");
    for (i, c) in conns.iter_mut().enumerate() {
        let mut buf = Vec::new();
        match kind {
            WaiterKind::Rlock => {
                let owner = format!("waiter:{i}");
                encode(
                    &mut buf,
                    &[
                        b"RLOCK.ACQUIRE",
                        key,
                        owner.as_bytes(),
                        b"30000",
                        b"WAIT",
                        b"600000",
                    ],
                );
            }
            WaiterKind::RedissonSubscriber => encode(&mut buf, &[b"SUBSCRIBE", chan.as_bytes()]),
            WaiterKind::NativeBlpop => encode(&mut buf, &[b"BLPOP", b"mem:list", b"600"]),
        }
        c.send(&buf)?;
    }
    // Wait (bounded) until the server has really parked every one of them.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let parked = match kind {
            WaiterKind::Rlock | WaiterKind::NativeBlpop => {
                info_field(&mut admin, "clients", "blocked_clients")?
            }
            WaiterKind::RedissonSubscriber => {
                let v: (String, i64) = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(&chan)
                    .query(&mut admin)?;
                v.1
            }
        };
        if parked == n as i64 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("memory: only {parked} of {n} waiters parked").into());
        }
        sleep(Duration::from_millis(20));
    }
    let after = settled_used_memory(&mut admin, settle)?;
    let clients_after = info_field(&mut admin, "memory", "mem_clients_normal")?;
    drop(conns);
    // Disconnected waiters leave the queue; then drop the lock itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    while info_field(&mut admin, "clients", "connected_clients")? > 1 && Instant::now() < deadline {
        sleep(Duration::from_millis(20));
    }
    redis::cmd("FLUSHALL").exec(&mut admin)?;
    // Closed blocked clients are freed over the next seconds; the next measurement
    // must not start while that memory is still going away.
    settled_used_memory(&mut admin, settle)?;
    Ok(WaiterMemory {
        total: (after - before) as f64 / n as f64,
        client_buffers: (clients_after - clients_before) as f64 / n as f64,
    })
}
