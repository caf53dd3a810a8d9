//! Waiting with queued tickets (design.md 5, docs/commands/tickets.md) against a real module-loaded
//! server: every waiting call of one client shares one ticket connection, whatever the
//! number of waiters and whatever the primitive; the lost-connection, timeout,
//! cancellation and forced-blocking paths; per-client notification (`NOTIFY tag`) and its
//! fallback to the key channel.
#![cfg(feature = "tokio")]

mod support;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use rlock_client::{AcquireOptions, ClientOptions, WaitMode};
use support::{
    blocked_clients, client_list, eventually, exists, info_waiters, wait_until, write_lock,
    LossyProxy, Server,
};

/// Bound of every wait in these tests.
const LONG: Duration = Duration::from_secs(60);

/// Connections other than `r` itself.
fn other_connections(r: &mut redis::Connection) -> usize {
    let me: u64 = redis::cmd("CLIENT").arg("ID").query(r).unwrap();
    client_list(r)
        .into_iter()
        .filter(|(id, _)| *id != me)
        .count()
}

/// The id of the client's ticket connection.
fn ticket_conn(r: &mut redis::Connection) -> Option<u64> {
    client_list(r)
        .into_iter()
        .find(|(_, name)| name == "rlock-tickets")
        .map(|(id, _)| id)
}

/// How many times the server ran `RLOCK.HELLO` (INFO commandstats; 0 before the first).
fn hello_calls(r: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(r).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_rlock.hello:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

fn lease() -> AcquireOptions {
    AcquireOptions::new().with_lease(Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tasks_wait_on_one_lock_over_a_few_connections() {
    const N: usize = 1000;
    let s = Server::start();
    let mut r = s.conn();
    write_lock(&mut r, "k", "someone-else", 60_000);
    let c = rlock_client::aio::Client::open(s.url()).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..N {
        let (lock, order) = (c.lock("k"), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = lock.acquire_with(lease()).await.unwrap().unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
    }
    let all_queued = eventually(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == N as i64).await;
    assert!(
        all_queued,
        "{} of {N} queued",
        info_waiters(&mut r, "RLOCK.INFO", "k")
    );
    let conns = other_connections(&mut r);
    assert!(conns <= 3, "{conns} connections for {N} waiters");
    assert_eq!(blocked_clients(&mut r), 0, "nobody blocks a connection");
    assert!(ticket_conn(&mut r).is_some());
    let _: () = redis::cmd("DEL").arg("k").query(&mut r).unwrap();
    for t in tasks {
        tokio::time::timeout(LONG, t).await.unwrap().unwrap();
    }
    assert_eq!(order.lock().unwrap().len(), N);
    assert!(!exists(&mut r, "k"));
    assert!(other_connections(&mut r) <= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_are_served_in_the_order_they_queued() {
    let s = Server::start();
    let mut r = s.conn();
    write_lock(&mut r, "k", "someone-else", 60_000);
    let c = rlock_client::aio::Client::open(s.url()).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (lock, order) = (c.lock("k"), order.clone());
        tasks.push(tokio::spawn(async move {
            let g = lock.acquire_with(lease()).await.unwrap().unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
        // The next one queues only once this one is in the queue.
        let queued = eventually(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == i + 1).await;
        assert!(queued);
    }
    let _: () = redis::cmd("DEL").arg("k").query(&mut r).unwrap();
    for t in tasks {
        tokio::time::timeout(LONG, t).await.unwrap().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
}

/// Issue 40 §2: 200 threads of one client wait on at most a few connections, and `CLIENT
/// LIST` shows none of them blocked in a command (a blocked `WAIT` carries the `b` flag
/// for as long as it waits).
#[test]
fn threads_of_the_blocking_api_share_the_ticket_connection() {
    const N: usize = 200;
    let s = Server::start();
    let mut r = s.conn();
    write_lock(&mut r, "k", "someone-else", 60_000);
    let c = rlock_client::Client::open(s.url()).unwrap();
    let threads: Vec<_> = (0..N)
        .map(|_| {
            let lock = c.lock("k");
            thread::spawn(move || {
                let g = lock.acquire_with(lease()).unwrap().unwrap();
                g.release().unwrap();
            })
        })
        .collect();
    assert!(wait_until(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == N as i64));
    // The ticket connection, the shared one, and the calling threads' own (at most two:
    // each wait first asked on one whether the lock was free).
    let conns = other_connections(&mut r);
    assert!(conns <= 4, "{conns} connections for {N} waiting threads");
    assert_eq!(blocked_clients(&mut r), 0);
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut r).unwrap();
    for line in list.lines() {
        let flags = line
            .split(' ')
            .find_map(|f| f.strip_prefix("flags="))
            .unwrap_or_default();
        assert!(!flags.contains('b'), "a connection blocked: {line}");
    }
    let _: () = redis::cmd("DEL").arg("k").query(&mut r).unwrap();
    for t in threads {
        t.join().unwrap();
    }
    assert!(!exists(&mut r, "k"));
}

#[test]
fn a_timed_out_ticket_is_a_timed_out_wait() {
    let s = Server::start();
    let mut r = s.conn();
    write_lock(&mut r, "k", "someone-else", 60_000);
    let c = rlock_client::Client::open(s.url()).unwrap();
    let t = Instant::now();
    let got = c
        .lock("k")
        .acquire_timeout(Duration::from_millis(300))
        .unwrap();
    assert!(got.is_none());
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert!(ticket_conn(&mut r).is_some(), "it waited with a ticket");
    // The server's own deadline may come a little after the client's (it counts from when
    // the command arrived, after the fresh client's connect): then the ticket it left
    // queued times out there a moment later.
    assert!(
        wait_until(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == 0),
        "something left queued"
    );
    // The channel was unsubscribed after its last waiter.
    let numsub: Vec<Value> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg("rlock_ticket:{k}")
        .query(&mut r)
        .unwrap();
    assert_eq!(numsub.get(1), Some(&Value::Int(0)));
    // And the lock is still the other owner's.
    assert!(exists(&mut r, "k"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_resend_when_the_ticket_connection_is_killed() {
    const N: usize = 50;
    let s = Server::start();
    let mut r = s.conn();
    write_lock(&mut r, "k", "someone-else", 60_000);
    let c = rlock_client::aio::Client::open(s.url()).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..N {
        let lock = c.lock("k");
        tasks.push(tokio::spawn(async move {
            let g = lock.acquire_with(lease()).await.unwrap().unwrap();
            g.release().await.unwrap();
        }));
    }
    assert!(eventually(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == N as i64).await);
    let old = ticket_conn(&mut r).unwrap();
    // The client asked once which mode to run in (docs/scripts-mode.md), and its ticket
    // connection once on connecting (its `HELLO 3`); `RLOCK.HELLO` is also the fence
    // behind a quiet ticket, sent or not as the tasks' timing has it.
    assert_eq!(command_calls(&mut r, "hello"), 1, "one ticket connection");
    let probes = hello_calls(&mut r);
    assert!(
        probes >= 2,
        "the client and its ticket connection probed: {probes}"
    );
    // Killing it (the only subscriber: TYPE pubsub, RESP3 or not) drops every ticket
    // queued on it, and its subscriptions.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut r)
        .unwrap();
    assert_eq!(killed, 1);
    // Every waiter re-sends on a new connection.
    assert!(
        eventually(LONG, || {
            ticket_conn(&mut r).is_some_and(|id| id != old)
                && info_waiters(&mut r, "RLOCK.INFO", "k") == N as i64
        })
        .await
    );
    assert_eq!(
        command_calls(&mut r, "hello"),
        2,
        "one new ticket connection"
    );
    assert!(
        hello_calls(&mut r) > probes,
        "the new connection probed again"
    );
    let _: () = redis::cmd("DEL").arg("k").query(&mut r).unwrap();
    for t in tasks {
        tokio::time::timeout(LONG, t).await.unwrap().unwrap();
    }
    assert!(!exists(&mut r, "k"));
}

/// `capabilities()` reads RLOCK.HELLO; a server that does not know it (the module
/// unloaded) is `NoModule`, not an error.
#[test]
fn capabilities_name_the_module_and_its_absence() {
    let s = Server::start_with(&["--enable-module-command", "yes"]);
    let c = rlock_client::Client::open(s.url()).unwrap();
    let caps = c.capabilities().unwrap();
    let rlock_client::Capabilities::Module(info) = &caps else {
        panic!("{caps:?}")
    };
    assert_eq!(info.protocol, rlock_client::PROTOCOL_VERSION);
    assert!(!info.version.is_empty());
    assert_eq!(info.replication, "commands");
    assert!(caps.tickets() && caps.has("latch") && !caps.has("sharded-channels"));
    let mut r = s.conn();
    let _: () = redis::cmd("MODULE")
        .arg("UNLOAD")
        .arg("rlock")
        .query(&mut r)
        .unwrap();
    // A new client: Redis 8.2 still runs an unloaded module's command on a connection
    // whose previous command it was (its per-connection command cache).
    let after = rlock_client::Client::open(s.url()).unwrap();
    assert_eq!(
        after.capabilities().unwrap(),
        rlock_client::Capabilities::NoModule
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_to_a_cancelled_waiter_is_given_back() {
    let s = Server::start();
    let mut r = s.conn();
    write_lock(&mut r, "k", "someone-else", 60_000);
    let c = rlock_client::aio::Client::open(s.url()).await.unwrap();
    let lock = c.lock("k");
    let cancelled = tokio::time::timeout(Duration::from_millis(200), lock.acquire()).await;
    assert!(cancelled.is_err(), "still waiting when dropped");
    // Its ticket stays queued: it is granted when the lock comes free ...
    assert_eq!(info_waiters(&mut r, "RLOCK.INFO", "k"), 1);
    let _: () = redis::cmd("DEL").arg("k").query(&mut r).unwrap();
    // ... and the client gives the grant back, long before its 30 s lease would end.
    assert!(eventually(Duration::from_secs(10), || !exists(&mut r, "k")).await);
    let g = tokio::time::timeout(LONG, c.lock("k").try_acquire())
        .await
        .unwrap()
        .unwrap();
    assert!(g.is_some(), "free again");
}

#[test]
fn forced_blocking_mode_waits_on_connections_of_their_own() {
    const N: usize = 5;
    let s = Server::start();
    let mut r = s.conn();
    write_lock(&mut r, "k", "someone-else", 60_000);
    let opts = ClientOptions::new().with_wait_mode(WaitMode::Blocking);
    let c = rlock_client::Client::open_with(s.url(), opts).unwrap();
    let threads: Vec<_> = (0..N)
        .map(|_| {
            let lock = c.lock("k");
            thread::spawn(move || {
                let g = lock.acquire_with(lease()).unwrap().unwrap();
                g.release().unwrap();
            })
        })
        .collect();
    assert!(wait_until(LONG, || blocked_clients(&mut r) == N as u64));
    assert!(ticket_conn(&mut r).is_none());
    assert!(other_connections(&mut r) >= N);
    let _: () = redis::cmd("DEL").arg("k").query(&mut r).unwrap();
    for t in threads {
        t.join().unwrap();
    }
    assert!(!exists(&mut r, "k"));
}

#[test]
fn every_primitive_waits_with_a_ticket() {
    let s = Server::start();
    let mut r = s.conn();
    let c = rlock_client::Client::open(s.url()).unwrap();

    // Fenced lock: the token comes with the collected grant.
    let holder = c.fenced_lock("f").acquire().unwrap();
    let first = holder.token();
    let waiter = c.fenced_lock("f");
    let t = thread::spawn(move || waiter.acquire_with(lease()).unwrap().unwrap());
    assert!(wait_until(LONG, || info_waiters(&mut r, "RLOCK.INFO", "f") == 1));
    assert_eq!(blocked_clients(&mut r), 0);
    holder.release().unwrap();
    let g = t.join().unwrap();
    assert!(g.token() > first, "{} after {first}", g.token());
    g.release().unwrap();

    // Read-write lock: a writer waits for a reader, then a reader for the writer.
    let rw = c.rw_lock("rw");
    let read = rw.read().acquire().unwrap();
    let writer = c.rw_lock("rw");
    let t = thread::spawn(move || {
        let w = writer.write().acquire_with(lease()).unwrap().unwrap();
        w.release().unwrap();
    });
    assert!(wait_until(LONG, || info_waiters(
        &mut r,
        "RRWLOCK.INFO",
        "rw"
    ) == 1));
    assert_eq!(blocked_clients(&mut r), 0);
    read.release().unwrap();
    t.join().unwrap();

    // Semaphore: a waiter for 2 permits.
    let sem = c.semaphore("s");
    assert!(sem.try_set_permits(1).unwrap());
    let one = sem.acquire(1).unwrap();
    let sem2 = c.semaphore("s");
    let t = thread::spawn(move || sem2.acquire(1).unwrap().release().unwrap());
    assert!(wait_until(LONG, || info_waiters(
        &mut r,
        "RSEMAPHORE.INFO",
        "s"
    ) == 1));
    assert_eq!(blocked_clients(&mut r), 0);
    one.release().unwrap();
    t.join().unwrap();
    assert_eq!(sem.available().unwrap(), 1);

    // Expirable semaphore: the permit id comes with the collected grant.
    let exp = c.expirable_semaphore("e");
    assert!(exp.try_set_permits(1).unwrap());
    let p = exp.acquire(Some(Duration::from_secs(30))).unwrap();
    let exp2 = c.expirable_semaphore("e");
    let t = thread::spawn(move || exp2.acquire(Some(Duration::from_secs(30))).unwrap());
    assert!(wait_until(LONG, || info_waiters(
        &mut r,
        "RPSEMAPHORE.INFO",
        "e"
    ) == 1));
    assert_eq!(blocked_clients(&mut r), 0);
    let first_id = p.id().to_owned();
    p.release().unwrap();
    let p2 = t.join().unwrap();
    assert!(!p2.id().is_empty() && p2.id() != first_id);
    assert!(p2.is_held());
    p2.release().unwrap();

    // Latch: the granted note is the whole answer.
    let latch = c.latch("l");
    assert!(latch.try_set_count(1).unwrap());
    let l2 = c.latch("l");
    let t = thread::spawn(move || l2.await_timeout(LONG).unwrap());
    assert!(wait_until(LONG, || info_waiters(
        &mut r,
        "RLATCH.INFO",
        "l"
    ) == 1));
    assert_eq!(blocked_clients(&mut r), 0);
    latch.count_down().unwrap();
    assert!(t.join().unwrap());

    assert!(ticket_conn(&mut r).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primitive_waits_with_a_ticket_async() {
    let s = Server::start();
    let mut r = s.conn();
    let c = rlock_client::aio::Client::open(s.url()).await.unwrap();

    let holder = c.fenced_lock("f").acquire().await.unwrap();
    let first = holder.token();
    let waiter = c.fenced_lock("f");
    let t = tokio::spawn(async move { waiter.acquire_with(lease()).await.unwrap().unwrap() });
    assert!(eventually(LONG, || info_waiters(&mut r, "RLOCK.INFO", "f") == 1).await);
    holder.release().await.unwrap();
    let g = tokio::time::timeout(LONG, t).await.unwrap().unwrap();
    assert!(g.token() > first);
    g.release().await.unwrap();

    let read = c.rw_lock("rw").read().acquire().await.unwrap();
    let writer = c.rw_lock("rw");
    let t = tokio::spawn(async move {
        let w = writer.write().acquire_with(lease()).await.unwrap().unwrap();
        w.release().await.unwrap();
    });
    assert!(eventually(LONG, || info_waiters(&mut r, "RRWLOCK.INFO", "rw") == 1).await);
    read.release().await.unwrap();
    tokio::time::timeout(LONG, t).await.unwrap().unwrap();

    let sem = c.semaphore("s");
    assert!(sem.try_set_permits(1).await.unwrap());
    let one = sem.acquire(1).await.unwrap();
    let sem2 = c.semaphore("s");
    let t = tokio::spawn(async move { sem2.acquire(1).await.unwrap().release().await.unwrap() });
    assert!(eventually(LONG, || info_waiters(&mut r, "RSEMAPHORE.INFO", "s") == 1).await);
    one.release().await.unwrap();
    tokio::time::timeout(LONG, t).await.unwrap().unwrap();

    let exp = c.expirable_semaphore("e");
    assert!(exp.try_set_permits(1).await.unwrap());
    let p = exp.acquire(Some(Duration::from_secs(30))).await.unwrap();
    let exp2 = c.expirable_semaphore("e");
    let t = tokio::spawn(async move { exp2.acquire(Some(Duration::from_secs(30))).await.unwrap() });
    assert!(eventually(LONG, || info_waiters(&mut r, "RPSEMAPHORE.INFO", "e") == 1).await);
    p.release().await.unwrap();
    let p2 = tokio::time::timeout(LONG, t).await.unwrap().unwrap();
    assert!(p2.is_held());
    p2.release().await.unwrap();

    let latch = c.latch("l");
    assert!(latch.try_set_count(1).await.unwrap());
    let l2 = c.latch("l");
    let t = tokio::spawn(async move { l2.await_timeout(LONG).await.unwrap() });
    assert!(eventually(LONG, || info_waiters(&mut r, "RLATCH.INFO", "l") == 1).await);
    assert_eq!(blocked_clients(&mut r), 0);
    latch.count_down().await.unwrap();
    assert!(tokio::time::timeout(LONG, t).await.unwrap().unwrap());
    assert!(ticket_conn(&mut r).is_some());
}

/// The module remembers a grant under the ticket's request id, and takes it back when
/// the ticket's connection closes before it is collected (forgetting the id): the
/// re-sent command must not be told "acquired" for a lock the server took back.
#[test]
fn it_does_not_believe_a_grant_the_server_took_back() {
    let s = Server::start();
    let c = rlock_client::Client::open_with(s.url(), support::quick_retries()).unwrap();
    let mut r = s.conn();
    let _: () = redis::cmd("RLOCK.ACQUIRE")
        .arg("k")
        .arg("holder")
        .arg(30_000)
        .query(&mut r)
        .unwrap();
    let lock = c.lock("k");
    let owner = lock.owner().to_owned();
    let waiter = thread::spawn(move || {
        let g = lock.acquire_timeout(Duration::from_secs(5)).unwrap();
        (lock, g)
    });
    assert!(wait_until(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == 1));
    let id = ticket_conn(&mut r).unwrap();
    // Granted, and its connection killed in the same turn, before it can collect.
    let (released, killed): (i64, i64) = redis::pipe()
        .cmd("RLOCK.RELEASE")
        .arg("k")
        .arg("holder")
        .cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(&mut r)
        .unwrap();
    assert_eq!((released, killed), (1, 1));
    let (_lock, g) = waiter.join().unwrap();
    let g = g.expect("the re-sent command finds the lock free");
    assert_eq!(
        support::hget(&mut r, "k", &owner),
        Some(1),
        "the client believes it holds a lock the server took back"
    );
    g.release().unwrap();
    assert!(!exists(&mut r, "k"));
}

/// A ticket holds on its `granted` message and confirms off the path (design.md 5). A
/// holder whose confirmation cannot reach the server within its grace (here: writes
/// paused, its ticket connection killed, `rlock.ticket-confirm-ms 0`) must be told that
/// the lock may be taken back: its lost signal fires.
#[test]
fn a_holder_whose_grant_cannot_be_confirmed_is_told_it_is_lost() {
    let s = Server::start();
    let c = rlock_client::Client::open_with(s.url(), support::quick_retries()).unwrap();
    let mut r = s.conn();
    let _: () = redis::cmd("RLOCK.ACQUIRE")
        .arg("k")
        .arg("holder")
        .arg(30_000)
        .query(&mut r)
        .unwrap();
    let lock = c.lock("k");
    let waiter = thread::spawn(move || {
        let g = lock.acquire_timeout(Duration::from_secs(30)).unwrap();
        (lock, g)
    });
    assert!(wait_until(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == 1));
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("rlock.ticket-confirm-ms")
        .arg(0)
        .query(&mut r)
        .unwrap();
    // Granted, then writes paused in the same turn: the holder's confirmation waits.
    let _: Value = redis::pipe()
        .atomic()
        .cmd("RLOCK.RELEASE")
        .arg("k")
        .arg("holder")
        .cmd("CLIENT")
        .arg("PAUSE")
        .arg(60_000)
        .arg("WRITE")
        .query(&mut r)
        .unwrap();
    let (_lock, g) = waiter.join().unwrap();
    let g = g.expect("held on the grant's message, before any confirmation");
    assert_eq!(g.lost_reason(), None);
    let id = ticket_conn(&mut r).unwrap();
    kill_client(&mut r, id);
    let told = wait_until(LONG, || g.lost_reason().is_some());
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut r).unwrap();
    assert!(told, "the holder was never told");
    assert_eq!(g.lost_reason(), Some(rlock_client::LostReason::NotHeld));
}

/// A fresh client's very first wait holds on its `granted` message too: its ticket
/// connection, made for that wait, learns `ticket-holds` from its RLOCK.HELLO before the
/// wait's command goes out (before, that wait had registered as one that collects, and
/// paid the round trip). Writes are paused as the grant is made, so a wait that collected
/// would still be waiting when the bound runs out.
#[test]
fn a_fresh_clients_first_wait_holds_on_its_grant() {
    let s = Server::start();
    let c = rlock_client::Client::open_with(s.url(), support::quick_retries()).unwrap();
    let mut r = s.conn();
    write_lock(&mut r, "k", "holder", 30_000);
    let lock = c.lock("k");
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = thread::spawn(move || {
        let g = lock.acquire_timeout(Duration::from_secs(120)).unwrap();
        let _ = tx.send(g.is_some());
        (lock, g)
    });
    assert!(wait_until(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == 1));
    grant_and_pause_writes(&mut r, redis::cmd("RLOCK.RELEASE").arg("k").arg("holder"));
    let held = rx.recv_timeout(Duration::from_secs(10));
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut r).unwrap();
    assert_eq!(
        held,
        Ok(true),
        "the first wait waited for its collect's reply"
    );
    let (_lock, g) = waiter.join().unwrap();
    let g = g.unwrap();
    assert_eq!(g.lost_reason(), None);
    g.release().unwrap();
    assert!(!exists(&mut r, "k"));
}

/// Sends `release` (which grants the queued ticket) and pauses writes in the same turn,
/// with `rlock.ticket-confirm-ms 0`: a waiter that collected before holding would wait
/// out the pause; one that holds on the `granted` message has its guard at once.
fn grant_and_pause_writes(r: &mut redis::Connection, release: &mut redis::Cmd) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("rlock.ticket-confirm-ms")
        .arg(0)
        .query(r)
        .unwrap();
    let _: Value = redis::pipe()
        .atomic()
        .add_command(release.clone())
        .cmd("CLIENT")
        .arg("PAUSE")
        .arg(60_000)
        .arg("WRITE")
        .query(r)
        .unwrap();
}

/// Kills the ticket connection while writes are paused (the confirmation cannot land),
/// waits for `lost`, and unpauses. True if `lost` came.
/// `CLIENT KILL ID id`.
fn kill_client(r: &mut redis::Connection, id: u64) {
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(r)
        .unwrap();
    assert_eq!(killed, 1, "connection {id} killed");
}

fn kill_tickets_until(r: &mut redis::Connection, mut lost: impl FnMut() -> bool) -> bool {
    let id = ticket_conn(r).unwrap();
    kill_client(r, id);
    let told = wait_until(LONG, &mut lost);
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(r).unwrap();
    told
}

/// The fenced lock's ticket holds on its `granted` message, whose detail is the token
/// (design.md 5): the guard comes before any confirmation, with the token the server
/// issued; a grant that cannot be confirmed fires the lost signal.
#[test]
fn a_fenced_ticket_holds_on_its_message_with_the_token() {
    let s = Server::start();
    let c = rlock_client::Client::open_with(s.url(), support::quick_retries()).unwrap();
    let mut r = s.conn();
    let _: Value = redis::cmd("RFENCED.ACQUIRE")
        .arg("k")
        .arg("holder")
        .arg(30_000)
        .query(&mut r)
        .unwrap();
    let lock = c.fenced_lock("k");
    let waiter = thread::spawn(move || {
        let g = lock.acquire_timeout(Duration::from_secs(30)).unwrap();
        (lock, g)
    });
    assert!(wait_until(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == 1));
    grant_and_pause_writes(&mut r, redis::cmd("RLOCK.RELEASE").arg("k").arg("holder"));
    let (_lock, g) = waiter.join().unwrap();
    let g = g.expect("held on the grant's message, before any confirmation");
    let token: i64 = redis::cmd("RFENCED.GETTOKEN")
        .arg("k")
        .query(&mut r)
        .unwrap();
    assert_eq!(g.token(), token);
    assert_eq!(g.lost_reason(), None);
    assert!(kill_tickets_until(&mut r, || g.lost_reason().is_some()));
    assert_eq!(g.lost_reason(), Some(rlock_client::LostReason::NotHeld));
}

/// The expirable semaphore's ticket holds on its `granted` message, whose detail is the
/// permit id; a grant that cannot be confirmed fires the permit's lost signal.
#[test]
fn an_expirable_ticket_holds_on_its_message_with_the_permit_id() {
    let s = Server::start();
    let c = rlock_client::Client::open_with(s.url(), support::quick_retries()).unwrap();
    let mut r = s.conn();
    let sem = c.expirable_semaphore("e");
    assert!(sem.try_set_permits(1).unwrap());
    let held: String = redis::cmd("RPSEMAPHORE.ACQUIRE")
        .arg("e")
        .arg(30_000)
        .query(&mut r)
        .unwrap();
    let waiter = thread::spawn(move || {
        let p = sem
            .acquire_timeout(Some(Duration::from_secs(30)), Duration::from_secs(30))
            .unwrap();
        (sem, p)
    });
    assert!(wait_until(LONG, || {
        info_waiters(&mut r, "RPSEMAPHORE.INFO", "e") == 1
    }));
    grant_and_pause_writes(
        &mut r,
        redis::cmd("RPSEMAPHORE.RELEASE").arg("e").arg(&held),
    );
    let (_sem, p) = waiter.join().unwrap();
    let p = p.expect("held on the grant's message, before any confirmation");
    let id = hex_bytes(p.id());
    let score: Option<i64> = redis::cmd("ZSCORE")
        .arg("{e}:timeout")
        .arg(id)
        .query(&mut r)
        .unwrap();
    assert!(score.is_some(), "the permit id the message named is held");
    assert_eq!(p.lost_reason(), None);
    assert!(kill_tickets_until(&mut r, || p.lost_reason().is_some()));
    assert_eq!(p.lost_reason(), Some(rlock_client::LostReason::NotHeld));
}

/// The semaphore's ticket holds on its `granted` message (its reply is always 1): the
/// permit comes while writes are still paused, where a collect would wait out the pause.
#[test]
fn a_semaphore_ticket_holds_on_its_message() {
    let (_s, mut r, sem, waiter) = semaphore_granted_with_writes_paused();
    let held = waiter.recv_timeout(Duration::from_secs(10));
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut r).unwrap();
    let p = held
        .expect("the wait collected first: it waited out the pause")
        .expect("granted");
    assert!(p.is_held());
    assert_eq!(p.release().unwrap(), 1);
    assert_eq!(sem.available().unwrap(), 1, "exactly the one permit again");
}

/// A permit held on its message whose grant the server then took back (the ticket
/// connection killed, and no confirmation reaching the server within the grace: it
/// refuses new connections at `maxclients`) went back to the pool with the take-back.
/// Its release, asked for before the confirmation's answer came, waits for it and sends
/// nothing: releasing too would add a permit that never existed (design.md 5).
#[test]
fn a_permit_taken_back_is_not_released_again() {
    let (_s, mut r, sem, waiter) = semaphore_granted_with_writes_paused();
    let p = waiter.recv_timeout(LONG).unwrap().expect("granted");
    assert!(p.is_held());
    // One connection fewer than now once the ticket connection is gone: none can open.
    let id = ticket_conn(&mut r).unwrap();
    let connected = client_list(&mut r).len() as i64;
    set_config(&mut r, "maxclients", connected - 1);
    kill_client(&mut r, id);
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut r).unwrap();
    let available = |r: &mut redis::Connection| -> i64 {
        redis::cmd("RSEMAPHORE.AVAILABLEPERMITS")
            .arg("s")
            .query(r)
            .unwrap()
    };
    assert!(
        wait_until(LONG, || available(&mut r) == 1),
        "the server never took the grant back"
    );
    let releasing = thread::spawn(move || p.release());
    set_config(&mut r, "maxclients", 10_000);
    let released = releasing.join().unwrap();
    assert!(
        matches!(released, Err(rlock_client::Error::NotHeld { .. })),
        "{released:?}"
    );
    assert_eq!(
        available(&mut r),
        1,
        "the taken-back permit was released again"
    );
    drop(sem);
}

/// A semaphore "s" of one permit, held by `r`, and a thread of `c` waiting for it (its
/// permit, or none, comes on the receiver).
/// A server, a connection to it, and a client's semaphore "s" whose queued waiter was
/// just granted (`grant_and_pause_writes`): writes are paused; the waiter's outcome.
fn semaphore_granted_with_writes_paused() -> (
    Server,
    redis::Connection,
    rlock_client::Semaphore,
    std::sync::mpsc::Receiver<Option<rlock_client::SemaphorePermit>>,
) {
    let s = Server::start();
    let c = rlock_client::Client::open_with(s.url(), support::quick_retries()).unwrap();
    let mut r = s.conn();
    let (sem, waiter) = semaphore_waiter_behind_a_holder(&c, &mut r);
    grant_and_pause_writes(&mut r, redis::cmd("RSEMAPHORE.RELEASE").arg("s").arg(1));
    (s, r, sem, waiter)
}

fn semaphore_waiter_behind_a_holder(
    c: &rlock_client::Client,
    r: &mut redis::Connection,
) -> (
    rlock_client::Semaphore,
    std::sync::mpsc::Receiver<Option<rlock_client::SemaphorePermit>>,
) {
    let sem = c.semaphore("s");
    assert!(sem.try_set_permits(1).unwrap());
    let taken: i64 = redis::cmd("RSEMAPHORE.ACQUIRE")
        .arg("s")
        .arg(1)
        .query(r)
        .unwrap();
    assert_eq!(taken, 1);
    let (tx, rx) = std::sync::mpsc::channel();
    let waiting = c.semaphore("s");
    thread::spawn(move || {
        let _ = tx.send(waiting.acquire_timeout(1, LONG).unwrap());
    });
    assert!(wait_until(LONG, || info_waiters(r, "RSEMAPHORE.INFO", "s") == 1));
    (sem, rx)
}

fn set_config(r: &mut redis::Connection, name: &str, value: i64) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(r)
        .unwrap();
}

fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// A client logged in as a new user `waiter` allowed every key and command but only the
/// pub/sub `channels` given (ACL patterns; none: Redis 7's default for new users).
fn client_as_user_with_channels(
    s: &Server,
    r: &mut redis::Connection,
    channels: &[&str],
) -> rlock_client::Client {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("waiter")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("+@all")
        .arg("resetchannels")
        .arg(channels)
        .query(r)
        .unwrap();
    rlock_client::Client::open(format!("redis://waiter:pw@127.0.0.1:{}/", s.port)).unwrap()
}

/// "k" held by someone else; a thread of `c` acquires it (with a lease) and releases it.
fn acquire_release_behind_someone_else(
    c: &rlock_client::Client,
    r: &mut redis::Connection,
) -> thread::JoinHandle<()> {
    write_lock(r, "k", "someone-else", 60_000);
    let lock = c.lock("k");
    thread::spawn(move || {
        lock.acquire_with(lease())
            .unwrap()
            .unwrap()
            .release()
            .unwrap();
    })
}

/// A user whose ACL denies the ticket channels (Redis 7's default for new users,
/// `resetchannels`): the refused SUBSCRIBE must not be taken for a waiter's reply; the
/// client waits the old way from then on, or, with tickets forced, reports the refusal.
#[test]
fn a_user_without_the_ticket_channels_waits_the_old_way() {
    let s = Server::start();
    let mut r = s.conn();
    let c = client_as_user_with_channels(&s, &mut r, &[]);
    let t = acquire_release_behind_someone_else(&c, &mut r);
    // It fell back: a blocked WAIT.
    assert!(wait_until(LONG, || blocked_clients(&mut r) == 1));
    let _: () = redis::cmd("DEL").arg("k").query(&mut r).unwrap();
    t.join().unwrap();

    write_lock(&mut r, "k", "someone-else", 60_000);
    let opts = ClientOptions::new().with_wait_mode(WaitMode::Tickets);
    let forced =
        rlock_client::Client::open_with(format!("redis://waiter:pw@127.0.0.1:{}/", s.port), opts)
            .unwrap();
    let got = forced
        .lock("k")
        .acquire_timeout(Duration::from_secs(5))
        .unwrap_err();
    assert!(
        matches!(&got, rlock_client::Error::Server { code, .. } if code == "NOPERM"),
        "{got:?}"
    );
    // The refused SUBSCRIBE and the ticketed command went out together, so the server
    // queued the ticket; the client closed that connection, and the server drops the
    // ticket when it reads the close, which may come after the error reached us.
    assert!(
        wait_until(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == 0),
        "nothing left queued"
    );
}

/// A user who may not run RLOCK.HELLO: the client cannot learn that the server queues
/// tickets, so it blocks a connection instead (a wait that works wherever the module is).
#[test]
fn a_user_who_may_not_probe_waits_the_old_way() {
    let s = Server::start();
    let mut r = s.conn();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "noprobe",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-rlock.hello",
        ])
        .query(&mut r)
        .unwrap();
    write_lock(&mut r, "k", "someone-else", 60_000);
    let url = format!("redis://noprobe:pw@127.0.0.1:{}/", s.port);
    let c = rlock_client::Client::open(url.as_str()).unwrap();
    let lock = c.lock("k");
    let t = thread::spawn(move || {
        lock.acquire_with(lease())
            .unwrap()
            .unwrap()
            .release()
            .unwrap();
    });
    assert!(wait_until(LONG, || blocked_clients(&mut r) == 1));
    assert!(ticket_conn(&mut r).is_none());
    let _: () = redis::cmd("DEL").arg("k").query(&mut r).unwrap();
    t.join().unwrap();
}

/// The ticket connection selects the client's database: the ticket waits for the lock
/// there, not for a key of the same name in database 0.
#[test]
fn a_client_of_another_database_waits_there() {
    let s = Server::start();
    let mut r = s.conn();
    let mut r2 = redis::Client::open(format!("redis://127.0.0.1:{}/2", s.port))
        .unwrap()
        .get_connection()
        .unwrap();
    write_lock(&mut r2, "k", "someone-else", 60_000);
    let c = rlock_client::Client::open(format!("redis://127.0.0.1:{}/2", s.port)).unwrap();
    let lock = c.lock("k");
    let t = thread::spawn(move || {
        let g = lock.acquire_with(lease()).unwrap().unwrap();
        g.release().unwrap();
    });
    assert!(wait_until(LONG, || info_waiters(
        &mut r2,
        "RLOCK.INFO",
        "k"
    ) == 1));
    assert_eq!(info_waiters(&mut r, "RLOCK.INFO", "k"), 0);
    assert!(ticket_conn(&mut r).is_some());
    let _: () = redis::cmd("DEL").arg("k").query(&mut r2).unwrap();
    t.join().unwrap();
    assert!(!exists(&mut r2, "k"));
}

/// The ticket channels subscribed for key `k`: the key channel's subscribers, and the
/// tagged channels (`rlock_ticket:{k}:<tag>`) in the server's order.
fn ticket_channels(r: &mut redis::Connection) -> (u64, Vec<String>) {
    let numsub: Vec<Value> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg("rlock_ticket:{k}")
        .query(r)
        .unwrap();
    let on_key = match numsub.get(1) {
        Some(Value::Int(n)) => *n as u64,
        other => panic!("{other:?}"),
    };
    let tagged: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("rlock_ticket:{k}:*")
        .query(r)
        .unwrap();
    (on_key, tagged)
}

/// One client waiting on `k` in a task of its own: acquires, releases, done.
fn wait_in_task(c: &rlock_client::aio::Client) -> tokio::task::JoinHandle<()> {
    let lock = c.lock("k");
    tokio::spawn(async move {
        let g = lock.acquire_with(lease()).await.unwrap().unwrap();
        g.release().await.unwrap();
    })
}

/// Two clients waiting on one lock: each hears its own grant on its own channel, and
/// nothing goes on the key channel both used to share (where each handoff woke every
/// waiting client). Fails without `NOTIFY`: no tagged channel, two key subscribers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_waiting_on_one_lock_hear_only_their_own_grants() {
    let s = Server::start();
    let mut r = s.conn();
    write_lock(&mut r, "k", "someone-else", 60_000);
    let a = rlock_client::aio::Client::open(s.url()).await.unwrap();
    let b = rlock_client::aio::Client::open(s.url()).await.unwrap();
    let ta = wait_in_task(&a);
    assert!(eventually(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == 1).await);
    let (on_key, first) = ticket_channels(&mut r);
    assert_eq!((on_key, first.len()), (0, 1), "{first:?}");
    let tb = wait_in_task(&b);
    assert!(eventually(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == 2).await);
    let (on_key, both) = ticket_channels(&mut r);
    assert_eq!((on_key, both.len()), (0, 2), "{both:?}");
    let chan_a = first[0].clone();
    let chan_b = both.iter().find(|c| **c != chan_a).unwrap().clone();
    // 16 lowercase hex digits after the key channel.
    let tag = chan_b.strip_prefix("rlock_ticket:{k}:").unwrap();
    assert!(
        tag.len() == 16
            && tag
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    // A spy on all three channels counts what each handoff publishes where.
    let mut spy = s.conn();
    let mut ps = spy.as_pubsub();
    for ch in ["rlock_ticket:{k}", chan_a.as_str(), chan_b.as_str()] {
        ps.subscribe(ch).unwrap();
    }
    let _: () = redis::cmd("DEL").arg("k").query(&mut r).unwrap();
    for t in [ta, tb] {
        tokio::time::timeout(LONG, t).await.unwrap().unwrap();
    }
    ps.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut heard: Vec<(String, String)> = Vec::new();
    while let Ok(m) = ps.get_message() {
        heard.push((m.get_channel_name().to_owned(), m.get_payload().unwrap()));
    }
    let on = |ch: &str| heard.iter().filter(|(c, _)| c == ch).count();
    assert_eq!(on("rlock_ticket:{k}"), 0, "{heard:?}");
    assert_eq!((on(&chan_a), on(&chan_b)), (1, 1), "{heard:?}");
    assert!(
        heard.iter().all(|(_, m)| m.starts_with("granted:")),
        "{heard:?}"
    );
    // Each client's channel stays subscribed after its last waiter, idle, for the next
    // wait on the key (the spy's gone first); the key channel has nobody.
    drop(ps);
    drop(spy);
    assert!(wait_until(LONG, || {
        let (on_key, mut tagged) = ticket_channels(&mut r);
        tagged.sort();
        let mut want = vec![chan_a.clone(), chan_b.clone()];
        want.sort();
        on_key == 0 && tagged == want
    }));
}

/// A process that waits on one lock again and again subscribes its channel once: it
/// stays subscribed, idle, between waits (two commands per acquisition saved, design.md
/// 5). Fails when the channel is unsubscribed after each wait.
#[test]
fn a_channel_stays_subscribed_between_waits_on_its_key() {
    let s = Server::start();
    let c = rlock_client::Client::open_with(s.url(), support::quick_retries()).unwrap();
    let mut r = s.conn();
    let lock = c.lock("k");
    // The first wait makes the ticket connection; count from the second on.
    queued_acquire_release(&c, &mut r, "k");
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut r).unwrap();
    for _ in 0..5 {
        queued_acquire_release(&c, &mut r, "k");
    }
    assert_eq!(
        (
            command_calls(&mut r, "subscribe"),
            command_calls(&mut r, "unsubscribe")
        ),
        (0, 0),
        "the channel was subscribed again for a wait"
    );
    assert_eq!(ticket_channels(&mut r).1.len(), 1);
    drop(lock);
}

/// At most 64 idle channels per ticket connection: one more unsubscribes the one idle
/// the longest.
#[test]
fn idle_channels_are_bounded() {
    let s = Server::start();
    let c = rlock_client::Client::open_with(s.url(), support::quick_retries()).unwrap();
    let mut r = s.conn();
    for i in 0..65 {
        queued_acquire_release(&c, &mut r, &format!("k{i}"));
    }
    let channels = |r: &mut redis::Connection| -> Vec<String> {
        redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .arg("rlock_ticket:*")
            .query(r)
            .unwrap()
    };
    // The last holder's channel is let go once its confirmation is answered, which may
    // come after its release (it rides with the connection's next write, or alone a
    // moment later), and the oldest idle channel's `UNSUBSCRIBE` with it.
    assert!(wait_until(LONG, || channels(&mut r).len() == 64));
    let idle = channels(&mut r);
    assert_eq!(idle.len(), 64, "{idle:?}");
    assert!(
        !idle.iter().any(|ch| ch.starts_with("rlock_ticket:{k0}")),
        "the oldest idle channel was kept"
    );
    // A wait on a key whose channel was dropped subscribes again and is granted.
    queued_acquire_release(&c, &mut r, "k0");
}

/// `key` held by someone else, a thread of `c` queued for it (a ticket), the holder's
/// release: the thread holds, then releases.
fn queued_acquire_release(c: &rlock_client::Client, r: &mut redis::Connection, key: &str) {
    write_lock(r, key, "someone-else", 60_000);
    let lock = c.lock(key);
    let t = thread::spawn(move || {
        let g = lock.acquire_timeout(LONG).unwrap().expect("granted");
        g.release().unwrap();
    });
    assert!(wait_until(LONG, || info_waiters(r, "RLOCK.INFO", key) == 1));
    let _: () = redis::cmd("RLOCK.RELEASE")
        .arg(key)
        .arg("someone-else")
        .query(r)
        .unwrap();
    t.join().unwrap();
}

/// Calls of `command` since the last `CONFIG RESETSTAT` (INFO commandstats).
fn command_calls(r: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(r).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// A server whose probe does not name `ticket-notify` (an older module; here a proxy
/// hides the word): tickets without `NOTIFY`, heard on the key channel as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ticket_notify_tickets_use_the_key_channel() {
    let s = Server::start();
    let mut r = s.conn();
    let proxy = LossyProxy::start(s.port);
    proxy.hide("ticket-notify");
    write_lock(&mut r, "k", "someone-else", 60_000);
    let c = rlock_client::aio::Client::open(proxy.url()).await.unwrap();
    let t = wait_in_task(&c);
    assert!(eventually(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == 1).await);
    assert_eq!(ticket_channels(&mut r), (1, vec![]));
    assert_eq!(blocked_clients(&mut r), 0, "a ticket, not a blocked wait");
    let _: () = redis::cmd("DEL").arg("k").query(&mut r).unwrap();
    tokio::time::timeout(LONG, t).await.unwrap().unwrap();
    assert!(wait_until(LONG, || ticket_channels(&mut r) == (0, vec![])));
}

/// `DEBUG SLEEP seconds` on a connection of its own, `after` a ticket is queued on `key`:
/// the server runs nothing meanwhile (no timer, no reply, no message). Returns when the
/// freeze is over; the instant it was sent.
fn freeze_once_queued(
    url: String,
    key: &'static str,
    after: Duration,
    seconds: f64,
) -> thread::JoinHandle<Instant> {
    thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        assert!(wait_until(LONG, || info_waiters(&mut c, "RLOCK.INFO", key) >= 1));
        thread::sleep(after);
        let sent = Instant::now();
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(seconds)
            .query(&mut c)
            .unwrap();
        sent
    })
}

/// How late past its deadline a timed wait may return on a loaded machine: a CPU for the
/// waiter's timer and thread (the server's answers come a whole freeze late).
const DEADLINE_MARGIN: Duration = Duration::from_millis(150);

/// A timed wait ends at its own deadline on the client's clock: a server frozen across
/// it answers (its `timeout` message, or a collect's reply) only after the freeze, and
/// the caller is told no on time regardless, its ticket left as an orphan.
#[test]
fn a_timed_wait_ends_at_its_deadline_while_the_server_is_frozen() {
    let s = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut r = s.conn();
    let c = rlock_client::Client::open(s.url()).unwrap();
    write_lock(&mut r, "k", "someone-else", 60_000);
    let wait = Duration::from_millis(400);
    let freeze = freeze_once_queued(s.url(), "k", Duration::from_millis(50), 1.5);
    let lock = c.lock("k");
    let t = Instant::now();
    let got = lock.acquire_timeout(wait).unwrap();
    let took = t.elapsed();
    let frozen_at = freeze.join().unwrap();
    assert!(frozen_at < t + wait, "the freeze began before the deadline");
    assert!(got.is_none());
    assert!(took >= wait && took <= wait + DEADLINE_MARGIN, "{took:?}");
    // The server's own timeout comes after the freeze, to the orphan the waiter left.
    assert!(wait_until(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == 0));
    assert!(exists(&mut r, "k"), "still the other owner's");
}

/// The holder's release reaches the frozen server after the waiter's deadline and runs
/// when it wakes: the waiter has been told no, so a grant its ticket gets is collected
/// and given back by the client, not left held (async API: the same machinery).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_made_after_the_waiter_left_at_its_deadline_is_given_back() {
    let s = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut r = s.conn();
    write_lock(&mut r, "k", "someone-else", 60_000);
    let c = rlock_client::aio::Client::open(s.url()).await.unwrap();
    let wait = Duration::from_millis(300);
    let freeze = freeze_once_queued(s.url(), "k", Duration::from_millis(50), 1.5);
    let t = Instant::now();
    let release = thread::spawn({
        let url = s.url();
        move || {
            let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
            // During the freeze, after the waiter's deadline: it runs when the server wakes.
            thread::sleep(
                (t + wait + Duration::from_millis(100)).saturating_duration_since(Instant::now()),
            );
            let sent = Instant::now();
            let _: Value = redis::cmd("RLOCK.RELEASE")
                .arg("k")
                .arg("someone-else")
                .query(&mut c)
                .unwrap();
            sent
        }
    });
    let got = tokio::time::timeout(LONG, c.lock("k").acquire_timeout(wait))
        .await
        .unwrap()
        .unwrap();
    let took = t.elapsed();
    assert!(got.is_none(), "told no");
    assert!(took >= wait && took <= wait + DEADLINE_MARGIN, "{took:?}");
    let released_at = release.join().unwrap();
    let frozen_at = freeze.join().unwrap();
    assert!(
        frozen_at < t + wait && released_at < frozen_at + Duration::from_millis(1500),
        "released during the freeze"
    );
    // Granted to the orphan (the release ran before the ticket's timer) or timed out
    // first: either way nobody holds it, long before a 30 s lease would end.
    assert!(eventually(Duration::from_secs(10), || !exists(&mut r, "k")).await);
    assert!(
        eventually(Duration::from_secs(10), || info_waiters(
            &mut r,
            "RLOCK.INFO",
            "k"
        ) == 0)
        .await
    );
    let g = c.lock("k").try_acquire().await.unwrap();
    assert!(g.is_some(), "free again");
}

/// A user whose ACL allows the keys' ticket channels but not the tagged ones (written
/// before `NOTIFY`): the refused tagged SUBSCRIBE makes the client wait with tickets on
/// the key's channel, as with a module without `ticket-notify`, not blocked.
#[test]
fn a_user_refused_the_tagged_channels_waits_on_the_keys_channel() {
    let s = Server::start();
    let mut r = s.conn();
    let c = client_as_user_with_channels(&s, &mut r, &["&rlock_ticket:{*}"]);
    let t = acquire_release_behind_someone_else(&c, &mut r);
    // Queued as a ticket, heard on the key's channel; nothing blocked. (The first
    // connection's ticket, sent behind the refused SUBSCRIBE, may be the one counted
    // for a moment, before that connection closes and the next one subscribes.)
    let on_keys_channel = |r: &mut redis::Connection| {
        let numsub: Vec<Value> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("rlock_ticket:{k}")
            .query(r)
            .unwrap();
        numsub.get(1) == Some(&Value::Int(1))
    };
    assert!(wait_until(LONG, || on_keys_channel(&mut r)
        && info_waiters(&mut r, "RLOCK.INFO", "k") == 1));
    assert_eq!(blocked_clients(&mut r), 0);
    let _: () = redis::cmd("DEL").arg("k").query(&mut r).unwrap();
    t.join().unwrap();
    assert!(!exists(&mut r, "k"));
}

/// A grant whose message reached its holder while the confirmation could not (the
/// server paused its writes, then went down for longer than the confirmation grace and
/// came back from its AOF, `appendfsync always`): the holder keeps confirming under the
/// same request id until the restarted server answers, and keeps the lock, which the AOF
/// kept for it (it used to give up within the grace and report the lock lost while the
/// server still held it for that owner).
#[test]
fn a_held_grant_is_confirmed_after_a_restart_longer_than_the_grace() {
    let mut s = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut r = s.conn();
    let _: Value = redis::cmd("RLOCK.ACQUIRE")
        .arg("k")
        .arg("holder:1")
        .arg(30_000)
        .query(&mut r)
        .unwrap();
    let client = rlock_client::Client::open(s.url()).unwrap();
    let waiter = {
        let c = client.clone();
        thread::spawn(move || c.lock("k").acquire())
    };
    assert!(wait_until(LONG, || info_waiters(&mut r, "RLOCK.INFO", "k") == 1));
    // The release grants the waiter and its message goes out; the pause holds back the
    // confirmation that message sends (a write) until the server goes down.
    let _: Value = redis::pipe()
        .atomic()
        .cmd("RLOCK.RELEASE")
        .arg("k")
        .arg("holder:1")
        .cmd("CLIENT")
        .arg("PAUSE")
        .arg(60_000)
        .arg("WRITE")
        .query(&mut r)
        .unwrap();
    let guard = waiter.join().unwrap().expect("held on the grant message");
    let owner = guard.owner().to_owned();
    s.restart(Duration::from_millis(1500));
    assert_eq!(guard.lost_reason(), None, "not lost across the restart");
    let mut r = s.conn();
    let holds: Option<i64> = redis::cmd("HGET")
        .arg("k")
        .arg(&owner)
        .query(&mut r)
        .unwrap();
    assert_eq!(holds, Some(1), "the AOF kept the grant");
    assert_eq!(
        guard.release().unwrap(),
        rlock_client::ReleaseOutcome::Freed
    );
    assert!(!exists(&mut r, "k"));
}

/// A plain semaphore's waiter holds on its grant's message and its confirmation waits
/// for the ticket connection's next write; the release, which must not run before the
/// grant is confirmed, takes its place: it goes on the ticket connection and collects
/// the grant itself (`COLLECT`, design.md 5), so the server runs no confirmation, where
/// it once read and answered one of its own and the release waited for its answer.
#[test]
fn a_semaphore_release_collects_its_grant_in_place_of_the_confirmation() {
    let s = Server::start();
    let mut r = s.conn();
    let c = rlock_client::Client::open_with(
        s.url(),
        rlock_client::ClientOptions::new().with_replica_sync(None),
    )
    .unwrap();
    let holder = rlock_client::Client::open(s.url()).unwrap();
    let held = holder.semaphore("s");
    assert!(held.try_set_permits(1).unwrap());
    let taken = held.try_acquire(1).unwrap().expect("free");
    for (name, value) in [
        ("slowlog-max-len", "100000"),
        ("slowlog-log-slower-than", "0"),
    ] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(&mut r)
            .unwrap();
    }
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query(&mut r).unwrap();
    thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let p = c.semaphore("s").acquire(1).unwrap();
            assert_eq!(p.release().unwrap(), 1);
        });
        assert!(wait_until(LONG, || info_waiters(
            &mut r,
            "RSEMAPHORE.INFO",
            "s"
        ) == 1));
        taken.release().unwrap();
        waiter.join().unwrap();
    });
    let ran = logged_commands(&mut r, "RSEMAPHORE.");
    let on_tickets: Vec<&Vec<String>> = ran
        .iter()
        .filter(|(_, name)| name == "rlock-tickets")
        .map(|(words, _)| words)
        .collect();
    // The ticket, then the release collecting its grant, on the ticket connection: no
    // confirmation in between.
    assert_eq!(on_tickets.len(), 2, "{ran:?}");
    assert_eq!(on_tickets[0][0], "RSEMAPHORE.ACQUIRE");
    assert!(on_tickets[0].iter().any(|w| w == "WAIT"), "{ran:?}");
    assert_eq!(on_tickets[1][0], "RSEMAPHORE.RELEASE");
    assert_eq!(
        collected_id(on_tickets[1]),
        ticket_id(on_tickets[0]),
        "{ran:?}"
    );
    assert_eq!(held.available().unwrap(), 1);
}

/// The request id a waiting command went under (`ID id`).
fn ticket_id(words: &[String]) -> Option<&str> {
    let at = words.iter().position(|w| w == "ID")?;
    words.get(at + 1).map(String::as_str)
}

/// The grant a release collected (`COLLECT id`).
fn collected_id(words: &[String]) -> Option<&str> {
    let at = words.iter().position(|w| w == "COLLECT")?;
    words.get(at + 1).map(String::as_str)
}

/// `total_writes_processed` (INFO stats): the server's socket writes so far.
fn writes_processed(r: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("stats").query(r).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_writes_processed:"))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// (command, its arguments, connection name) of every `RLOCK.*` command in the slow log
/// (every command is logged: see `log_every_command`), oldest first.
fn logged_lock_commands(r: &mut redis::Connection) -> Vec<(Vec<String>, String)> {
    logged_commands(r, "RLOCK.")
}

/// As [`logged_lock_commands`], for the commands whose name starts with `prefix`.
fn logged_commands(r: &mut redis::Connection, prefix: &str) -> Vec<(Vec<String>, String)> {
    let log: Vec<redis::Value> = redis::cmd("SLOWLOG").arg("GET").arg(-1).query(r).unwrap();
    log.into_iter()
        .rev()
        .filter_map(|e| {
            let redis::Value::Array(f) = e else {
                return None;
            };
            let redis::Value::Array(words) = &f[3] else {
                return None;
            };
            let words: Vec<String> = words
                .iter()
                .map(|w| redis::from_redis_value::<String>(w.clone()).unwrap_or_default())
                .collect();
            let name = redis::from_redis_value::<String>(f[5].clone()).unwrap_or_default();
            words[0].starts_with(prefix).then_some((words, name))
        })
        .collect()
}

fn log_every_command(r: &mut redis::Connection) {
    for (name, value) in [
        ("slowlog-max-len", "100000"),
        ("slowlog-log-slower-than", "0"),
    ] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(r)
            .unwrap();
    }
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query(r).unwrap();
}

/// A lock handoff to a ticket costs the server what one to a blocked `WAIT` does (issue
/// 40, design.md 5): the ticket goes `QUIET`, so the server writes nothing when it
/// queues it (where `QUEUED` was a write of its own), and the holder's release collects
/// its grant on the ticket connection (`COLLECT`) in place of the held-back
/// confirmation: the ticket and the release, the two commands a blocked handoff runs.
#[test]
fn a_lock_handoff_to_a_quiet_ticket_writes_nothing_when_queued() {
    let s = Server::start();
    let mut r = s.conn();
    let c = rlock_client::Client::open_with(s.url(), ClientOptions::new().with_replica_sync(None))
        .unwrap();
    let holder = rlock_client::Client::open(s.url()).unwrap();
    let held = holder.lock("k");
    let waiting = c.lock("k");
    let handoff = |held_guard: rlock_client::LockGuard, r: &mut redis::Connection| {
        thread::scope(|scope| {
            let waiter = scope.spawn(|| {
                let g = waiting.acquire_with(lease()).unwrap().unwrap();
                g.release().unwrap();
            });
            assert!(wait_until(LONG, || info_waiters(r, "RLOCK.INFO", "k") == 1));
            held_guard.release().unwrap();
            waiter.join().unwrap();
        });
    };
    // The first wait subscribes the key's channel, which then stays subscribed.
    handoff(held.acquire_with(lease()).unwrap().unwrap(), &mut r);
    let g = held.acquire_with(lease()).unwrap().unwrap();
    log_every_command(&mut r);
    let before = writes_processed(&mut r);
    let waiter = thread::spawn(move || {
        let g = waiting.acquire_with(lease()).unwrap().unwrap();
        g.release().unwrap();
    });
    let mut polls = 0;
    assert!(wait_until(LONG, || {
        polls += 1;
        info_waiters(&mut r, "RLOCK.INFO", "k") == 1
    }));
    // The first INFO's reply and one per poll: nothing written to the waiter.
    assert_eq!(writes_processed(&mut r) - before, 1 + polls);
    g.release().unwrap();
    waiter.join().unwrap();
    let ran = logged_lock_commands(&mut r);
    let tickets = "rlock-tickets";
    let on_tickets: Vec<&Vec<String>> = ran
        .iter()
        .filter(|(_, name)| name == tickets)
        .map(|(words, _)| words)
        .collect();
    // The quiet ticket and the release collecting its grant, in that order, on the
    // ticket connection: no confirmation (the same command without WAIT) ran.
    assert_eq!(on_tickets.len(), 2, "{ran:?}");
    assert_eq!(on_tickets[0][0], "RLOCK.ACQUIRE");
    assert!(on_tickets[0].iter().any(|w| w == "QUIET"), "{ran:?}");
    assert_eq!(on_tickets[1][0], "RLOCK.RELEASE");
    assert_eq!(
        collected_id(on_tickets[1]),
        ticket_id(on_tickets[0]),
        "{ran:?}"
    );
    assert!(!exists(&mut r, "k"));
}

fn set_maxmemory(r: &mut redis::Connection, bytes: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(bytes)
        .query(r)
        .unwrap();
}

/// A quiet ticket has no reply when queued and one otherwise, the server's own refusals
/// included (here `OOM`, given before any module code runs): its own refusal reaches
/// its waiter, and a command written behind a quiet ticket still unanswered goes behind
/// a fence, so that its reply is never taken for the ticket's (which would leave the
/// queued waiter told "refused" and the other waiting forever).
#[test]
fn replies_behind_a_quiet_ticket_stay_in_step() {
    let s = Server::start();
    let mut r = s.conn();
    let c = rlock_client::Client::open_with(s.url(), ClientOptions::new().with_replica_sync(None))
        .unwrap();
    let holder = rlock_client::Client::open(s.url()).unwrap();
    let (k1, k2) = (c.lock("k1"), c.lock("k2"));
    // Each handle learns its key contended (it then queues at once, without a try on
    // the shared connection) and subscribes its channel, which stays subscribed.
    for (key, handle) in [("k1", &k1), ("k2", &k2)] {
        let g = holder.lock(key).acquire_with(lease()).unwrap().unwrap();
        thread::scope(|scope| {
            let w = scope.spawn(|| handle.acquire_with(lease()).unwrap().unwrap().release());
            assert!(wait_until(LONG, || info_waiters(&mut r, "RLOCK.INFO", key) == 1));
            g.release().unwrap();
            w.join().unwrap().unwrap();
        });
    }
    let g1 = holder.lock("k1").acquire_with(lease()).unwrap().unwrap();
    let g2 = holder.lock("k2").acquire_with(lease()).unwrap().unwrap();
    log_every_command(&mut r);
    thread::scope(|scope| {
        // Queued quietly: nothing comes back for it.
        let first = scope.spawn(|| k1.acquire_with(lease()).unwrap().unwrap().release());
        assert!(wait_until(LONG, || info_waiters(
            &mut r,
            "RLOCK.INFO",
            "k1"
        ) == 1));
        // The server now refuses every write that could grow memory.
        set_maxmemory(&mut r, "1");
        // Behind the first, still unanswered: a fence, then this one, refused.
        let second = k2.acquire_timeout(LONG);
        assert!(
            matches!(&second, Err(e) if e.to_string().contains("OOM")),
            "{second:?}"
        );
        set_maxmemory(&mut r, "0");
        // The first, still queued, gets its grant.
        g1.release().unwrap();
        first.join().unwrap().unwrap();
        // Nothing in flight now: a quiet ticket refused outright, its refusal its answer.
        set_maxmemory(&mut r, "1");
        let third = k2.acquire_timeout(LONG);
        assert!(
            matches!(&third, Err(e) if e.to_string().contains("OOM")),
            "{third:?}"
        );
        set_maxmemory(&mut r, "0");
        g2.release().unwrap();
        let g = k2.acquire_timeout(LONG).unwrap().expect("free");
        g.release().unwrap();
    });
    let ran = logged_lock_commands(&mut r);
    assert!(
        ran.iter()
            .any(|(w, n)| w[0] == "RLOCK.HELLO" && n == "rlock-tickets"),
        "a fence went out: {ran:?}"
    );
    assert!(!exists(&mut r, "k1") && !exists(&mut r, "k2"));
}
