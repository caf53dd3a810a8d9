//! The blocking API against a real module-loaded redis-server.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use rlock_client::{
    AcquireOptions, Client, ClientOptions, Error, LostReason, ReleaseOutcome, ReplicaSync,
    RetryPolicy, Wait,
};
use support::{
    assert_took_at_least, exists, hget, pttl, queued, quick_retries, wait_until, write_lock,
    Cluster, LossyProxy, Server,
};

fn client(s: &Server) -> Client {
    Client::open(s.url()).unwrap()
}

fn client_with_watchdog(s: &Server, ms: u64) -> Client {
    let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_millis(ms));
    Client::open_with(s.url(), opts).unwrap()
}

#[test]
fn it_acquires_with_a_watchdog_lease_and_releases() {
    let s = Server::start();
    let c = client(&s);
    let mut r = s.conn();
    let lock = c.lock("k");
    assert!(lock.owner().starts_with(c.id()));
    let g = lock.acquire().unwrap();
    assert!(g.is_held());
    assert_eq!(hget(&mut r, "k", lock.owner()), Some(1));
    let ttl = pttl(&mut r, "k");
    assert!(
        ttl > 25_000 && ttl <= 30_000,
        "watchdog lease is 30 s: {ttl}"
    );
    let info = c.info("k").unwrap().unwrap();
    assert_eq!(info.owners.get(lock.owner()), Some(&1));
    assert_eq!(g.release().unwrap(), ReleaseOutcome::Freed);
    assert!(!exists(&mut r, "k"));
    assert_eq!(c.info("k").unwrap(), None);
}

#[test]
fn it_reenters_through_the_same_handle() {
    let s = Server::start();
    let c = client(&s);
    let mut r = s.conn();
    let lock = c.lock("k");
    let g1 = lock.acquire().unwrap();
    let g2 = lock.try_acquire().unwrap().expect("re-entry never waits");
    let g3 = lock
        .acquire_timeout(Duration::from_millis(10))
        .unwrap()
        .unwrap();
    assert_eq!(hget(&mut r, "k", lock.owner()), Some(3));
    assert_eq!(lock.hold_count(), 3);
    assert_eq!(g3.release().unwrap(), ReleaseOutcome::StillHeld);
    assert_eq!(g1.release().unwrap(), ReleaseOutcome::StillHeld);
    assert_eq!(hget(&mut r, "k", lock.owner()), Some(1));
    assert!(g2.is_held());
    assert_eq!(g2.release().unwrap(), ReleaseOutcome::Freed);
    assert!(!exists(&mut r, "k"));
}

#[test]
fn it_excludes_two_handles_of_one_client() {
    let s = Server::start();
    let c = client(&s);
    let a = c.lock("k");
    let b = c.lock("k");
    assert_ne!(a.owner(), b.owner());
    let ga = a.acquire().unwrap();
    assert!(b.try_acquire().unwrap().is_none());
    ga.release().unwrap();
    let gb = b.try_acquire().unwrap().expect("free now");
    gb.release().unwrap();
}

#[test]
fn it_takes_a_caller_supplied_owner_id() {
    let s = Server::start();
    let c = client(&s);
    let mut r = s.conn();
    let lock = c.lock_with_owner("k", "my-service:42");
    let g = lock.acquire().unwrap();
    assert_eq!(hget(&mut r, "k", "my-service:42"), Some(1));
    g.release().unwrap();
}

#[test]
fn it_gives_up_after_the_wait_limit() {
    let s = Server::start();
    let c = client(&s);
    let holder = c.lock("k").acquire().unwrap();
    let t = Instant::now();
    let got = c
        .lock("k")
        .acquire_timeout(Duration::from_millis(300))
        .unwrap();
    let took = t.elapsed();
    assert!(got.is_none());
    assert_took_at_least(took, Duration::from_millis(250));
    assert!(took < Duration::from_secs(3), "returned late: {took:?}");
    holder.release().unwrap();
}

#[test]
fn it_hands_the_lock_to_a_waiter_on_release() {
    let s = Server::start();
    let c = client(&s);
    let holder = c.lock("k").acquire().unwrap();
    let (tx, rx) = mpsc::channel();
    let c2 = c.clone();
    let waiter = thread::spawn(move || {
        let lock = c2.lock("k");
        let g = lock.acquire().unwrap();
        tx.send(()).unwrap();
        g.release().unwrap()
    });
    // The waiter is parked in the server until we let go.
    let mut r = s.conn();
    assert!(queued(&c, "k"));
    assert!(rx.try_recv().is_err());
    holder.release().unwrap();
    rx.recv_timeout(Duration::from_secs(5))
        .expect("waiter got the lock");
    assert_eq!(waiter.join().unwrap(), ReleaseOutcome::Freed);
    assert!(!exists(&mut r, "k"));
}

#[test]
fn it_keeps_a_fixed_lease_unrenewed_and_reports_it_run_out() {
    let s = Server::start();
    let c = client(&s);
    let mut r = s.conn();
    let lock = c.lock("k");
    let opts = AcquireOptions::new().with_lease(Duration::from_millis(300));
    let g = lock.acquire_with(opts).unwrap().unwrap();
    let ttl = pttl(&mut r, "k");
    assert!(ttl > 0 && ttl <= 300, "{ttl}");
    assert!(wait_until(Duration::from_secs(5), || !exists(&mut r, "k")));
    assert_eq!(
        g.wait_lost(Some(Duration::from_secs(5))),
        Some(LostReason::LeaseExpired)
    );
    assert!(!g.is_held());
    assert!(matches!(g.release(), Err(Error::NotHeld { .. })));
}

#[test]
fn it_renews_a_watchdog_lock_for_as_long_as_it_is_held() {
    let s = Server::start();
    let c = client_with_watchdog(&s, 1000);
    let other = client(&s);
    let mut r = s.conn();
    let lock = c.lock_with_owner("k", "holder");
    let g = lock.acquire().unwrap();
    // Held for 4 s, four times the lease: without renewals it would expire at 1 s.
    let t = Instant::now();
    let mut rearmed = 0;
    let mut last = pttl(&mut r, "k");
    while t.elapsed() < Duration::from_secs(4) {
        let now = pttl(&mut r, "k");
        assert!(now > 0, "lock expired after {:?}", t.elapsed());
        if now > last {
            rearmed += 1;
        }
        last = now;
        thread::sleep(Duration::from_millis(50));
    }
    assert!(rearmed >= 6, "TTL re-armed only {rearmed} times in 4 s");
    assert!(g.is_held());
    assert!(other.lock("k").try_acquire().unwrap().is_none());
    g.release().unwrap();
    assert!(!exists(&mut r, "k"));
    // Renewal has stopped: a lock written by hand for the same owner is left to run out.
    write_lock(&mut r, "k", "holder", 800);
    assert!(wait_until(Duration::from_secs(5), || !exists(&mut r, "k")));
}

#[test]
fn it_reports_a_force_released_lock_lost_within_one_renewal_interval() {
    let s = Server::start();
    let c = client_with_watchdog(&s, 900); // renewal every 300 ms
    let g = c.lock("k").acquire().unwrap();
    let fired = Arc::new(AtomicUsize::new(0));
    let f2 = fired.clone();
    g.on_lost(move |why| {
        assert_eq!(why, LostReason::NotHeld);
        f2.fetch_add(1, Ordering::SeqCst);
    });
    assert!(client(&s).force_release("k").unwrap());
    let t = Instant::now();
    let why = g.wait_lost(Some(Duration::from_secs(5)));
    assert_eq!(why, Some(LostReason::NotHeld));
    // One interval plus generous slack for a loaded machine.
    assert!(
        t.elapsed() < Duration::from_millis(300 + 700),
        "{:?}",
        t.elapsed()
    );
    assert!(!g.is_held());
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    match g.release() {
        Err(Error::NotHeld { key }) => assert_eq!(key, "k"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn it_reports_a_release_of_a_lost_lock() {
    let s = Server::start();
    let c = client(&s);
    let g = c.lock("k").acquire().unwrap();
    assert!(c.force_release("k").unwrap());
    // Without waiting for the watchdog: the release itself finds out.
    assert!(matches!(g.release(), Err(Error::NotHeld { .. })));
}

#[test]
fn it_does_not_delay_renewals_or_releases_behind_a_waiting_acquire() {
    let s = Server::start();
    // Margins sized for a loaded 2-core machine: renewed every 400 ms, a 1.2 s lease;
    // the waiting acquire below waits 6 s.
    let c = client_with_watchdog(&s, 1200);
    let other = client(&s);
    let mut r = s.conn();
    let held = c.lock("renewed").acquire().unwrap();
    let to_release = c.lock("released").acquire().unwrap();
    let blocker = other.lock("contended").acquire().unwrap();
    let c2 = c.clone();
    let waiter = thread::spawn(move || {
        let lock = c2.lock("contended");
        lock.acquire_timeout(Duration::from_secs(6))
            .unwrap()
            .map(|g| g.release())
    });
    assert!(queued(&other, "contended"));
    // While the same client waits in the server, its renewals keep the lease up...
    let t = Instant::now();
    let mut min_ttl = i64::MAX;
    while t.elapsed() < Duration::from_millis(2000) {
        min_ttl = min_ttl.min(pttl(&mut r, "renewed"));
        thread::sleep(Duration::from_millis(20));
    }
    // Renewed every 400 ms, so the TTL stays near 800..1200; renewals stalled behind
    // the waiting acquire would let the key expire within the 2 s watched.
    assert!(min_ttl > 0, "renewals stalled: TTL fell to {min_ttl}");
    // ...and a release of the same client goes through at once.
    let t = Instant::now();
    to_release.release().unwrap();
    // Queued behind the waiting acquire, it would take the 4 s that wait has left.
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "release took {:?}",
        t.elapsed()
    );
    assert!(waiter.join().unwrap().is_none(), "blocker still held it");
    blocker.release().unwrap();
    held.release().unwrap();
}

#[test]
fn it_releases_on_drop() {
    let s = Server::start();
    let c = client(&s);
    let mut r = s.conn();
    {
        let _g = c.lock("k").acquire().unwrap();
        assert!(exists(&mut r, "k"));
    }
    // The blocking guard releases inline, before drop returns.
    assert!(!exists(&mut r, "k"));
}

#[test]
fn it_does_not_double_count_a_reentry_whose_reply_was_lost() {
    let s = Server::start();
    let proxy = LossyProxy::start(s.port);
    let c = Client::open_with(proxy.url(), quick_retries()).unwrap();
    let mut r = s.conn();
    let lock = c.lock("k");
    let fixed = AcquireOptions::new()
        .with_wait(Wait::No)
        .with_lease(Duration::from_secs(30));
    let g1 = lock.acquire_with(fixed).unwrap().unwrap();
    proxy.lose_next_reply_to("RLOCK.ACQUIRE");
    let g2 = lock.acquire_with(fixed).unwrap().expect("re-entered");
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 1, "the fault fired");
    assert_eq!(
        hget(&mut r, "k", lock.owner()),
        Some(2),
        "re-entry applied once"
    );
    proxy.lose_next_reply_to("RLOCK.RELEASE");
    assert_eq!(g2.release().unwrap(), ReleaseOutcome::StillHeld);
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 2);
    assert_eq!(
        hget(&mut r, "k", lock.owner()),
        Some(1),
        "release applied once"
    );
    assert_eq!(g1.release().unwrap(), ReleaseOutcome::Freed);
    assert!(!exists(&mut r, "k"));
}

#[test]
fn it_keeps_a_lock_handed_over_just_before_the_wait_connection_broke() {
    let s = Server::start();
    let proxy = LossyProxy::start(s.port);
    let c = Client::open_with(proxy.url(), quick_retries()).unwrap();
    let other = client(&s);
    let mut r = s.conn();
    let holder = other.lock("k").acquire().unwrap();
    // The waiting acquire is the only ACQUIRE through the proxy: the server hands it
    // the lock on release, and the reply is lost with the connection.
    proxy.lose_next_reply_to("RLOCK.ACQUIRE");
    let lock = c.lock("k");
    let owner = lock.owner().to_owned();
    let waiter = thread::spawn(move || {
        let g = lock.acquire_timeout(Duration::from_secs(10)).unwrap();
        (lock, g)
    });
    assert!(queued(&other, "k"));
    holder.release().unwrap();
    let (lock, g) = waiter.join().unwrap();
    let g = g.expect("the retry learns of the handoff");
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 1, "the fault fired");
    // Re-sent without its id, the retry would have re-entered: count 2.
    assert_eq!(hget(&mut r, "k", &owner), Some(1), "handoff counted once");
    assert_eq!(lock.hold_count(), 1);
    assert!(g.is_held());
    assert_eq!(g.release().unwrap(), ReleaseOutcome::Freed);
    assert!(!exists(&mut r, "k"));
}

#[test]
fn it_keeps_a_lock_handed_over_after_a_wait_longer_than_the_lease() {
    let s = Server::start();
    let c = client_with_watchdog(&s, 600);
    let other = client(&s);
    let mut r = s.conn();
    let holder = other.lock("k").acquire().unwrap();
    let lock = c.lock("k");
    let waiter = thread::spawn(move || {
        let g = lock.acquire().unwrap();
        (lock, g)
    });
    assert!(queued(&other, "k"));
    // The point is the elapsed time: the waiter waits longer than its 600 ms lease.
    thread::sleep(Duration::from_millis(800));
    holder.release().unwrap();
    let (lock, g) = waiter.join().unwrap();
    // Counted from the send of the waiting acquire, the lease would be over already.
    assert!(g.is_held(), "{:?}", g.lost_reason());
    let ttl = pttl(&mut r, "k");
    assert!(ttl > 300, "re-armed at the handoff: {ttl}");
    // And the watchdog keeps it: still held after two leases.
    assert_eq!(g.wait_lost(Some(Duration::from_millis(1200))), None);
    assert_eq!(hget(&mut r, "k", lock.owner()), Some(1));
    g.release().unwrap();
}

/// The module remembers a handoff's reply under the waiter's request id, and takes the
/// lock back when the waiter vanishes before the reply goes out. It must forget the id
/// then too, or the retry would be told "acquired" for a lock that is free.
#[test]
fn it_does_not_believe_a_handoff_the_server_took_back() {
    let s = Server::start();
    // A blocked WAIT (the ticket variant is in tests/tickets.rs).
    let opts = quick_retries().with_wait_mode(rlock_client::WaitMode::Blocking);
    let c = Client::open_with(s.url(), opts).unwrap();
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
    let mut waiting_id = None;
    assert!(wait_until(Duration::from_secs(5), || {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut r).unwrap();
        waiting_id = list
            .lines()
            .find(|l| l.contains("cmd=rlock.acquire") && l.contains("flags=b"))
            .and_then(|l| l.strip_prefix("id="))
            .and_then(|l| l.split(' ').next())
            .map(str::to_owned);
        waiting_id.is_some()
    }));
    // Handed the lock, killed before its reply goes out: the module takes it back.
    let (released, killed): (i64, i64) = redis::pipe()
        .cmd("RLOCK.RELEASE")
        .arg("k")
        .arg("holder")
        .cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(waiting_id.unwrap())
        .query(&mut r)
        .unwrap();
    assert_eq!((released, killed), (1, 1));
    let (_lock, g) = waiter.join().unwrap();
    if let Some(g) = g {
        assert_eq!(
            hget(&mut r, "k", &owner),
            Some(1),
            "the client believes it holds a lock the server took back"
        );
        g.release().unwrap();
    }
}

#[test]
fn it_gives_up_after_max_attempts_when_the_server_is_gone() {
    let s = Server::start();
    let url = s.url();
    drop(s);
    let opts = ClientOptions::new().with_retry(
        RetryPolicy::new()
            .with_max_attempts(3)
            .with_base_delay(Duration::from_millis(20)),
    );
    let c = Client::open_with(url, opts).unwrap();
    let t = Instant::now();
    let err = c.lock("k").try_acquire().unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    // Two backoff delays of at least 10 and 20 ms.
    assert_took_at_least(t.elapsed(), Duration::from_millis(30));
}

#[test]
fn it_maps_wrongtype_replies() {
    let s = Server::start();
    let c = client(&s);
    let mut r = s.conn();
    let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut r).unwrap();
    match c.lock("k").try_acquire() {
        Err(Error::WrongType(_)) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn it_acquires_when_a_replica_acknowledges() {
    let (master, _replica) = support::master_and_replica();
    let opts =
        ClientOptions::new().with_replica_sync(Some(ReplicaSync::new(1, Duration::from_secs(2))));
    let c = Client::open_with(master.url(), opts).unwrap();
    let g = c.lock("k").acquire().unwrap();
    assert!(g.is_held());
    g.release().unwrap();
}

#[test]
fn it_fails_and_releases_when_no_replica_acknowledges() {
    let s = Server::start();
    let opts = ClientOptions::new()
        .with_replica_sync(Some(ReplicaSync::new(1, Duration::from_millis(100))));
    let c = Client::open_with(s.url(), opts).unwrap();
    let mut r = s.conn();
    match c.lock("k").acquire() {
        Err(Error::ReplicaSync { wanted, acked, .. }) => assert_eq!((wanted, acked), (1, 0)),
        other => panic!("{other:?}"),
    }
    assert!(!exists(&mut r, "k"), "the lock was left behind");
}

#[test]
fn it_locks_keys_on_every_master_of_a_cluster() {
    let cluster = Cluster::start();
    let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_millis(900));
    let c = Client::open_cluster_with(cluster.urls(), opts).unwrap();
    let other = Client::open_cluster(cluster.urls()).unwrap();
    let keys: Vec<String> = (0..3).map(|i| cluster.key_on(i, "lock")).collect();
    let guards: Vec<_> = keys
        .iter()
        .map(|k| c.lock(k.as_str()).acquire().unwrap())
        .collect();
    for k in &keys {
        let mut node = cluster.conn_for(k);
        assert!(exists(&mut node, k), "{k} not on its node");
        assert!(other.lock(k.as_str()).try_acquire().unwrap().is_none());
    }
    // Renewals reach every node: held well past the 900 ms lease.
    thread::sleep(Duration::from_millis(2000));
    for (k, g) in keys.iter().zip(&guards) {
        assert!(g.is_held(), "{k}");
        let mut node = cluster.conn_for(k);
        assert!(pttl(&mut node, k) > 0, "{k} expired");
    }
    // A waiting acquire on a cluster node is handed the lock.
    let waiter = {
        let (other, k) = (other.clone(), keys[1].clone());
        thread::spawn(move || {
            other
                .lock(k)
                .acquire_timeout(Duration::from_secs(10))
                .unwrap()
        })
    };
    assert!(queued(&c, &keys[1]));
    for g in guards {
        assert_eq!(g.release().unwrap(), ReleaseOutcome::Freed);
    }
    let handed = waiter.join().unwrap().expect("handed the lock");
    handed.release().unwrap();
    for k in &keys {
        let mut node = cluster.conn_for(k);
        assert!(!exists(&mut node, k));
    }
}

#[test]
fn it_retries_a_failed_renewal_within_the_lease() {
    let s = Server::start();
    let proxy = LossyProxy::start(s.port);
    let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_millis(900));
    let c = Client::open_with(proxy.url(), opts).unwrap();
    let mut r = s.conn();
    let g = c.lock("k").acquire().unwrap();
    // The first renewal reaches the server but its reply is lost with the connection.
    proxy.lose_next_reply_to("RLOCK.RENEW");
    assert!(wait_until(Duration::from_secs(5), || proxy
        .lost
        .load(Ordering::SeqCst)
        == 1));
    // The worker reconnects and renews again before the lease runs out: still held
    // two leases later.
    thread::sleep(Duration::from_millis(1800));
    assert!(g.is_held(), "{:?}", g.lost_reason());
    assert!(pttl(&mut r, "k") > 0);
    g.release().unwrap();
}

#[test]
fn it_reports_the_lease_run_out_when_renewals_keep_failing() {
    let s = Server::start();
    let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_millis(900));
    let c = Client::open_with(s.url(), opts).unwrap();
    let g = c.lock("k").acquire().unwrap();
    let t = Instant::now();
    drop(s); // the server is gone: every renewal fails
    assert_eq!(
        g.wait_lost(Some(Duration::from_secs(5))),
        Some(LostReason::LeaseExpired)
    );
    // Not before the lease could have run out, and not much after.
    let took = t.elapsed();
    assert!(took < Duration::from_millis(900 + 700), "{took:?}");
    assert!(!g.is_held());
}

/// A holder cut off from the server (a partition: every byte from the server held back)
/// hears that its lock is lost when the lease ends, not when its stalled renewal gives
/// up or the partition heals. Found by the fault harness (faults/: the lost signal came
/// 1.8 s after the lease, once the partition healed, while another client held the lock).
#[test]
fn a_partitioned_holder_hears_of_the_loss_when_its_lease_ends() {
    let s = Server::start();
    let proxy = LossyProxy::start(s.port);
    let opts = ClientOptions::new()
        .with_watchdog_timeout(Duration::from_millis(900))
        // Far longer than the lease: the report must not wait for it.
        .with_response_timeout(Some(Duration::from_secs(10)));
    let c = Client::open_with(proxy.url(), opts).unwrap();
    let g = c.lock("k").acquire().unwrap();
    let cut = Instant::now();
    proxy.hold_replies(true);
    let why = g.wait_lost(Some(Duration::from_secs(8)));
    let after = cut.elapsed();
    proxy.hold_replies(false);
    assert_eq!(why, Some(LostReason::LeaseExpired));
    // The lease ends at most 900 ms after the cut (the last renewal was before it).
    assert!(
        after < Duration::from_millis(1600),
        "lost reported after {after:?}"
    );
    drop(g);
}

/// Starts logging every command the server runs, with its words (the slow log at 0 µs).
fn log_commands(r: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-max-len")
        .arg(100_000)
        .query(r)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .query(r)
        .unwrap();
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query(r).unwrap();
}

/// The `RLOCK.ACQUIRE`s the server ran for `owner` since [`log_commands`], oldest first,
/// as "try" (no `WAIT`) or "wait", leaving out a held grant's confirmation (the same
/// request id as the ticket before it, without `WAIT`).
fn acquires_sent(r: &mut redis::Connection, owner: &str) -> Vec<&'static str> {
    let log: Vec<redis::Value> = redis::cmd("SLOWLOG").arg("GET").arg(-1).query(r).unwrap();
    let mut out = Vec::new();
    let mut waited_ids = Vec::new();
    for entry in log.into_iter().rev() {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let words: Vec<String> = match &fields[3] {
            redis::Value::Array(a) => a
                .iter()
                .map(|w| redis::from_redis_value::<String>(w.clone()).unwrap())
                .collect(),
            _ => continue,
        };
        if !words[0].eq_ignore_ascii_case("RLOCK.ACQUIRE")
            || words.get(2).map(String::as_str) != Some(owner)
        {
            continue;
        }
        let id = words
            .iter()
            .position(|w| w == "ID")
            .map(|i| words[i + 1].clone());
        if words.iter().any(|w| w == "WAIT") {
            waited_ids.push(id);
            out.push("wait");
        } else if !waited_ids.contains(&id) {
            out.push("try");
        }
    }
    out
}

/// Connections the server has besides `r`'s.
fn other_connections(r: &mut redis::Connection) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(r).unwrap();
    list.lines().count() - 1
}

#[test]
fn an_uncontended_wait_is_one_round_trip_on_the_callers_own_connection() {
    let s = Server::start();
    let mut r = s.conn();
    log_commands(&mut r);
    let c = Client::open_with(s.url(), ClientOptions::new().with_replica_sync(None)).unwrap();
    let lock = c.lock("k");
    let sem = c.semaphore("s");
    assert!(sem.try_set_permits(1).unwrap());
    for _ in 0..3 {
        let g = lock
            .acquire_timeout(Duration::from_secs(5))
            .unwrap()
            .unwrap();
        assert_eq!(g.release().unwrap(), ReleaseOutcome::Freed);
        lock.acquire().unwrap().release().unwrap();
        let p = sem
            .acquire_timeout(1, Duration::from_secs(5))
            .unwrap()
            .unwrap();
        p.release().unwrap();
    }
    // Asked without waiting, and taken: no ticket, so no ticket connection; every call
    // on the calling thread's own connection, so not the shared multiplexed one either.
    assert_eq!(acquires_sent(&mut r, lock.owner()), ["try"; 6]);
    assert_eq!(support::rlock_stat(&mut r, "rlock_tickets_queued"), 0);
    let sem_waits: Vec<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query(&mut r)
        .unwrap();
    assert!(
        !format!("{sem_waits:?}").contains("\"WAIT\""),
        "no semaphore acquire waited: {sem_waits:?}"
    );
    assert_eq!(other_connections(&mut r), 1, "one connection for the calls");
}

#[test]
fn a_handle_that_found_its_lock_held_queues_at_once_for_a_second() {
    let s = Server::start();
    let mut r = s.conn();
    let holder = client(&s);
    let c = Client::open_with(s.url(), ClientOptions::new().with_replica_sync(None)).unwrap();
    let lock = c.lock("k");
    log_commands(&mut r);
    let g = holder.lock("k").acquire().unwrap();
    thread::scope(|scope| {
        let waiter = scope.spawn(|| {
            let g = lock
                .acquire_timeout(Duration::from_secs(10))
                .unwrap()
                .unwrap();
            g.release().unwrap();
            // Free now, but this handle found it held a moment ago: straight to the queue.
            let g = lock
                .acquire_timeout(Duration::from_secs(10))
                .unwrap()
                .unwrap();
            g.release().unwrap();
        });
        assert!(queued(&holder, "k"), "the waiter's ticket is queued");
        g.release().unwrap();
        waiter.join().unwrap();
    });
    // First come, first served kept: the try found it held, then it queued and was granted.
    assert_eq!(acquires_sent(&mut r, lock.owner()), ["try", "wait", "wait"]);
}

#[test]
fn many_threads_share_a_few_caller_connections() {
    let s = Server::start();
    let mut r = s.conn();
    let c = Client::open_with(s.url(), ClientOptions::new().with_replica_sync(None)).unwrap();
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let c = c.clone();
            thread::spawn(move || {
                let lock = c.lock(format!("k{i}"));
                for _ in 0..200 {
                    lock.try_acquire().unwrap().unwrap().release().unwrap();
                }
            })
        })
        .collect();
    let mut peak = 0;
    while !threads.iter().all(|t| t.is_finished()) {
        peak = peak.max(other_connections(&mut r));
        thread::sleep(Duration::from_millis(1));
    }
    for t in threads {
        t.join().unwrap();
    }
    // Two calls at once on callers' own connections, the rest on the shared one.
    assert!((1..=3).contains(&peak), "{peak} connections for 16 threads");
}
