//! Failover: a master and its replica (both with the module), the master SIGKILLed and
//! the replica promoted with `REPLICAOF NO ONE`. The client reaches the master through
//! a proxy that stands for the failover address (a Sentinel-managed VIP or DNS name).

mod support;

use std::time::Duration;

use rlock_client::{Client, ClientOptions, Error, ReleaseOutcome, ReplicaSync, RetryPolicy};
use support::{exists, hget, pttl, replica_of, rlock_stat, wait_until, LossyProxy, Server};

fn promote(replica: &Server) {
    let mut r = replica.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut r)
        .unwrap();
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut r).unwrap();
    assert_eq!(
        role.first(),
        Some(&redis::Value::BulkString(b"master".to_vec()))
    );
}

fn options(replica_sync: Option<ReplicaSync>) -> ClientOptions {
    ClientOptions::new()
        .with_watchdog_timeout(Duration::from_millis(3000))
        .with_replica_sync(replica_sync)
        .with_retry(
            RetryPolicy::new()
                .with_max_attempts(5)
                .with_base_delay(Duration::from_millis(20)),
        )
}

#[test]
fn a_lock_taken_with_replica_safety_survives_the_masters_death() {
    let mut master = Server::start();
    let replica = replica_of(&master, master.port);
    let address = LossyProxy::start(master.port);
    let sync = ReplicaSync::new(1, Duration::from_secs(2));
    let c = Client::open_with(address.url(), options(Some(sync))).unwrap();
    let lock = c.lock("k");
    let g1 = lock.acquire().unwrap();
    let g2 = lock.acquire().unwrap(); // re-entered: count 2
                                      // WAIT 1 was acknowledged, so the replica has applied both, with the lease.
    let mut r = replica.conn();
    assert_eq!(hget(&mut r, "k", lock.owner()), Some(2));
    assert!(pttl(&mut r, "k") > 0);

    master.kill();
    promote(&replica);
    address.set_upstream(replica.port);

    // Same owner, same count, still under lease on the new master...
    assert_eq!(hget(&mut r, "k", lock.owner()), Some(2));
    assert!(pttl(&mut r, "k") > 0);
    // ...renewed there by the watchdog (every second; a replica never renews)...
    assert!(
        wait_until(Duration::from_secs(5), || rlock_stat(
            &mut r,
            "rlock_renewals"
        ) >= 1),
        "no renewal reached the new master"
    );
    assert!(g1.is_held() && g2.is_held());
    // ...and released through it, one hold at a time.
    assert_eq!(g2.release().unwrap(), ReleaseOutcome::StillHeld);
    assert_eq!(hget(&mut r, "k", lock.owner()), Some(1));
    assert_eq!(g1.release().unwrap(), ReleaseOutcome::Freed);
    assert!(!exists(&mut r, "k"));
}

/// The window that replica safety closes (the seeds' "problem 4"): an acquire the
/// master acknowledged but had not yet sent to its replica is gone after a failover,
/// and a second client takes the lock while the first still believes it holds it.
///
/// The replica reaches the master through a proxy that holds back the replication
/// stream. (Stopping the replica with SIGSTOP or DEBUG SLEEP would not do: the stream
/// would wait in the replica's socket buffer and be applied when it resumes.)
#[test]
fn without_replica_safety_a_failover_can_lose_an_acquired_lock() {
    let mut master = Server::start();
    let link = LossyProxy::start(master.port);
    let replica = replica_of(&master, link.port);
    let mut r = replica.conn();
    link.hold_replies(true);

    // With the option, the acquire fails: no replica acknowledged it.
    let sync = ReplicaSync::new(1, Duration::from_millis(300));
    let safe = Client::open_with(master.url(), options(Some(sync))).unwrap();
    match safe.lock("k").acquire() {
        Err(Error::ReplicaSync { wanted, acked, .. }) => assert_eq!((wanted, acked), (1, 0)),
        other => panic!("{other:?}"),
    }
    // Without it, the acquire succeeds on the master alone.
    let unsafe_client = Client::open_with(master.url(), options(None)).unwrap();
    let lock = unsafe_client.lock("k");
    let g = lock.acquire().unwrap();
    assert_eq!(hget(&mut master.conn(), "k", lock.owner()), Some(1));
    assert!(!exists(&mut r, "k"), "the replica has not seen it yet");

    master.kill();
    promote(&replica);

    // The lock is gone on the new master: another client takes it at once...
    assert!(
        !exists(&mut r, "k"),
        "the lock reached the replica after all"
    );
    let other = Client::open(replica.url()).unwrap();
    let theirs = other.lock("k").try_acquire().unwrap().expect("free there");
    // ...while the first holder's guard still says it holds the lock (its client cannot
    // reach anyone to learn otherwise until its lease would have run out).
    assert!(g.is_held());
    theirs.release().unwrap();
    drop(g);
}

/// `calls` of one command in the server's `INFO commandstats` (0 when never called).
fn calls(r: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(r).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Replica sync is on by default, as Redisson's `checkLockSyncedSlaves`: the client waits
/// for every replica the master has, and an acquire no replica acknowledged fails and
/// leaves no lock behind.
#[test]
fn by_default_an_acquire_waits_for_the_masters_connected_replicas() {
    let master = Server::start();
    let link = LossyProxy::start(master.port);
    let _replica = replica_of(&master, link.port);
    let mut m = master.conn();
    // "online" in the master's INFO can come before the replica answers GETACK (it may still
    // be loading what it was sent): the default's 1 s is put on trial only once the replica
    // has acknowledged the stream through the proxy.
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(15_000).query(&mut m).unwrap();
    assert_eq!(
        acked, 1,
        "the replica never acknowledged the master's stream"
    );
    let c = Client::open(master.url()).unwrap();

    let g = c.lock("synced").acquire().unwrap();
    assert_eq!(
        calls(&mut m, "wait"),
        2,
        "one WAIT for the one replica (and the test's own)"
    );
    g.release().unwrap();

    link.hold_replies(true);
    match c.lock("k").acquire() {
        Err(Error::ReplicaSync { wanted, acked, .. }) => assert_eq!((wanted, acked), (1, 0)),
        other => panic!("{other:?}"),
    }
    assert!(!exists(&mut m, "k"), "the lock was left behind");

    // Turned off, the same acquire succeeds on the master alone.
    let off =
        Client::open_with(master.url(), ClientOptions::new().with_replica_sync(None)).unwrap();
    let g = off.lock("k").acquire().unwrap();
    assert!(g.is_held());
}

/// Without replicas the default sends no `WAIT`, and asks for the topology at most once
/// a second, not once per acquire.
#[test]
fn by_default_a_master_without_replicas_pays_no_wait() {
    let master = Server::start();
    let mut m = master.conn();
    let c = Client::open(master.url()).unwrap();
    let started = std::time::Instant::now();
    for _ in 0..50 {
        c.lock("k").acquire().unwrap().release().unwrap();
    }
    let seconds = started.elapsed().as_secs();
    assert_eq!(calls(&mut m, "wait"), 0);
    let roles = calls(&mut m, "role");
    assert!(
        (1..=seconds + 1).contains(&roles),
        "{roles} ROLE calls in {seconds} s"
    );
}
