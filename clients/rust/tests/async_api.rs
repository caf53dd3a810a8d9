//! The async API (feature `tokio`) against a real module-loaded redis-server.
#![cfg(feature = "tokio")]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rlock_client::aio::Client;
use rlock_client::{AcquireOptions, ClientOptions, Error, LostReason, ReleaseOutcome, ReplicaSync};
use support::{
    assert_took_at_least, eventually, exists, hget, pttl, quick_retries, write_lock, Cluster,
    LossyProxy, Server,
};

/// Whether one acquire of `key` comes to wait in the server within 5 s, as `c` sees it.
async fn queued(c: &Client, key: &str) -> bool {
    for _ in 0..500 {
        if c.info(key).await.unwrap().is_some_and(|i| i.waiters == 1) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

async fn client_with_watchdog(s: &Server, ms: u64) -> Client {
    let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_millis(ms));
    Client::open_with(s.url(), opts).await.unwrap()
}

#[tokio::test]
async fn it_acquires_reenters_and_releases() {
    let s = Server::start();
    let c = Client::open(s.url()).await.unwrap();
    let mut r = s.conn();
    let lock = c.lock("k");
    let g1 = lock.acquire().await.unwrap();
    let g2 = lock.try_acquire().await.unwrap().expect("re-entry");
    assert_eq!(hget(&mut r, "k", lock.owner()), Some(2));
    let ttl = pttl(&mut r, "k");
    assert!(ttl > 25_000, "{ttl}");
    assert_eq!(g2.release().await.unwrap(), ReleaseOutcome::StillHeld);
    assert_eq!(g1.release().await.unwrap(), ReleaseOutcome::Freed);
    assert!(!exists(&mut r, "k"));
}

#[tokio::test]
async fn it_excludes_two_handles_and_times_out() {
    let s = Server::start();
    let c = Client::open(s.url()).await.unwrap();
    let a = c.lock("k");
    let b = c.lock("k");
    let ga = a.acquire().await.unwrap();
    assert!(b.try_acquire().await.unwrap().is_none());
    let t = Instant::now();
    assert!(b
        .acquire_timeout(Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
    assert_took_at_least(t.elapsed(), Duration::from_millis(250));
    ga.release().await.unwrap();
    b.try_acquire()
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_hands_the_lock_to_a_waiting_task() {
    let s = Server::start();
    let c = Client::open(s.url()).await.unwrap();
    let holder = c.lock("k").acquire().await.unwrap();
    let c2 = c.clone();
    let waiter = tokio::spawn(async move {
        let g = c2.lock("k").acquire().await.unwrap();
        g.release().await.unwrap()
    });
    assert!(queued(&c, "k").await, "waiter never queued");
    holder.release().await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out, ReleaseOutcome::Freed);
}

#[tokio::test]
async fn it_renews_with_one_task_and_stops_after_release() {
    let s = Server::start();
    let c = client_with_watchdog(&s, 1000).await;
    let other = Client::open(s.url()).await.unwrap();
    let mut r = s.conn();
    let g = c.lock_with_owner("k", "holder").acquire().await.unwrap();
    let t = Instant::now();
    let mut rearmed = 0;
    let mut last = pttl(&mut r, "k");
    while t.elapsed() < Duration::from_secs(4) {
        let now = pttl(&mut r, "k");
        assert!(now > 0, "expired after {:?}", t.elapsed());
        if now > last {
            rearmed += 1;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(rearmed >= 6, "re-armed {rearmed} times");
    assert!(other.lock("k").try_acquire().await.unwrap().is_none());
    g.release().await.unwrap();
    assert!(!exists(&mut r, "k"));
    write_lock(&mut r, "k", "holder", 800);
    assert!(eventually(Duration::from_secs(5), || !exists(&mut r, "k")).await);
}

#[tokio::test]
async fn it_signals_a_lost_lock_to_awaiters_and_callbacks() {
    let s = Server::start();
    let c = client_with_watchdog(&s, 900).await;
    let g = c.lock("k").acquire().await.unwrap();
    let fired = Arc::new(AtomicUsize::new(0));
    let f2 = fired.clone();
    g.on_lost(move |_| {
        f2.fetch_add(1, Ordering::SeqCst);
    });
    assert!(c.force_release("k").await.unwrap());
    let t = Instant::now();
    let why = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .unwrap();
    assert_eq!(why, Some(LostReason::NotHeld));
    assert!(
        t.elapsed() < Duration::from_millis(300 + 700),
        "{:?}",
        t.elapsed()
    );
    assert!(!g.is_held());
    assert_eq!(fired.load(Ordering::SeqCst), 1);
    assert!(matches!(g.release().await, Err(Error::NotHeld { .. })));
}

#[tokio::test]
async fn it_does_not_delay_renewals_behind_a_waiting_acquire() {
    let s = Server::start();
    // Margins sized for a loaded 2-core machine: a renewal stalled behind the waiting
    // acquire (6 s) would let the 1.2 s lease run out within the 2 s watched; a release
    // queued behind it would take the 4 s the waiter still has, not under 2 s.
    let c = client_with_watchdog(&s, 1200).await;
    let other = Client::open(s.url()).await.unwrap();
    let mut r = s.conn();
    let held = c.lock("renewed").acquire().await.unwrap();
    let to_release = c.lock("released").acquire().await.unwrap();
    let blocker = other.lock("contended").acquire().await.unwrap();
    let c2 = c.clone();
    let waiter = tokio::spawn(async move {
        let lock = c2.lock("contended");
        lock.acquire_timeout(Duration::from_secs(6))
            .await
            .unwrap()
            .is_some()
    });
    assert!(queued(&other, "contended").await);
    let t = Instant::now();
    let mut min_ttl = i64::MAX;
    while t.elapsed() < Duration::from_millis(2000) {
        min_ttl = min_ttl.min(pttl(&mut r, "renewed"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(min_ttl > 0, "renewals stalled: TTL fell to {min_ttl}");
    let t = Instant::now();
    to_release.release().await.unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "release took {:?}",
        t.elapsed()
    );
    assert!(!waiter.await.unwrap());
    blocker.release().await.unwrap();
    held.release().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn it_releases_on_drop_without_blocking_the_runtime() {
    let s = Server::start();
    let c = Client::open(s.url()).await.unwrap();
    let mut r = s.conn();
    let g = c.lock("k").acquire().await.unwrap();
    // On a single-threaded runtime a blocking release in drop would deadlock: the
    // connection's I/O runs on this very thread.
    let t = Instant::now();
    drop(g);
    assert!(
        t.elapsed() < Duration::from_millis(50),
        "drop blocked {:?}",
        t.elapsed()
    );
    assert!(
        exists(&mut r, "k"),
        "released before the runtime ran: drop blocked"
    );
    assert!(eventually(Duration::from_secs(5), || !exists(&mut r, "k")).await);
}

#[tokio::test(flavor = "current_thread")]
async fn it_drops_a_blocking_guard_inside_a_runtime_without_blocking_it() {
    let s = Server::start();
    let url = s.url();
    let g = tokio::task::spawn_blocking(move || {
        let c = rlock_client::Client::open(url).unwrap();
        c.lock("k").acquire().unwrap()
    })
    .await
    .unwrap();
    let mut r = s.conn();
    drop(g); // on the runtime thread: handed to the blocking pool
    assert!(eventually(Duration::from_secs(5), || !exists(&mut r, "k")).await);
}

#[tokio::test]
async fn it_keeps_a_fixed_lease_unrenewed() {
    let s = Server::start();
    let c = Client::open(s.url()).await.unwrap();
    let opts = AcquireOptions::new().with_lease(Duration::from_millis(300));
    let g = c.lock("k").acquire_with(opts).await.unwrap().unwrap();
    let why = tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .unwrap();
    assert_eq!(why, Some(LostReason::LeaseExpired));
    let mut r = s.conn();
    assert!(eventually(Duration::from_secs(2), || !exists(&mut r, "k")).await);
    assert!(matches!(g.release().await, Err(Error::NotHeld { .. })));
}

#[tokio::test]
async fn it_checks_replicas_after_acquire() {
    let (master, _replica) = support::master_and_replica();
    let ok =
        ClientOptions::new().with_replica_sync(Some(ReplicaSync::new(1, Duration::from_secs(2))));
    let c = Client::open_with(master.url(), ok).await.unwrap();
    c.lock("a")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let too_many = ClientOptions::new()
        .with_replica_sync(Some(ReplicaSync::new(2, Duration::from_millis(100))));
    let c = Client::open_with(master.url(), too_many).await.unwrap();
    match c.lock("b").acquire().await {
        Err(Error::ReplicaSync { wanted, acked, .. }) => assert_eq!((wanted, acked), (2, 1)),
        other => panic!("{other:?}"),
    }
    let mut r = master.conn();
    assert!(!exists(&mut r, "b"), "the lock was left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_locks_keys_on_every_master_of_a_cluster() {
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_millis(900));
    let c = Client::open_cluster_with(cluster.urls(), opts)
        .await
        .unwrap();
    let other = Client::open_cluster(cluster.urls()).await.unwrap();
    let keys: Vec<String> = (0..3).map(|i| cluster.key_on(i, "alock")).collect();
    let mut guards = Vec::new();
    for k in &keys {
        guards.push(c.lock(k.as_str()).acquire().await.unwrap());
        assert!(other
            .lock(k.as_str())
            .try_acquire()
            .await
            .unwrap()
            .is_none());
    }
    tokio::time::sleep(Duration::from_millis(2000)).await;
    for (k, g) in keys.iter().zip(&guards) {
        assert!(g.is_held(), "{k}");
        assert!(pttl(&mut cluster.conn_for(k), k) > 0, "{k} expired");
    }
    let waiter = {
        let (other, k) = (other.clone(), keys[2].clone());
        tokio::spawn(async move { other.lock(k).acquire_timeout(Duration::from_secs(10)).await })
    };
    assert!(queued(&c, &keys[2]).await);
    for g in guards {
        assert_eq!(g.release().await.unwrap(), ReleaseOutcome::Freed);
    }
    let handed = waiter.await.unwrap().unwrap().expect("handed the lock");
    handed.release().await.unwrap();
    for k in &keys {
        assert!(!exists(&mut cluster.conn_for(k), k));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn it_applies_a_reentry_and_a_release_once_when_their_replies_are_lost() {
    let s = Server::start();
    let proxy = LossyProxy::start(s.port);
    let c = Client::open_with(proxy.url(), quick_retries())
        .await
        .unwrap();
    let mut r = s.conn();
    let lock = c.lock("k");
    let fixed = AcquireOptions::new()
        .with_wait(rlock_client::Wait::No)
        .with_lease(Duration::from_secs(30));
    let g1 = lock.acquire_with(fixed).await.unwrap().unwrap();
    proxy.lose_next_reply_to("RLOCK.ACQUIRE");
    let g2 = lock.acquire_with(fixed).await.unwrap().expect("re-entered");
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 1, "the fault fired");
    assert_eq!(
        hget(&mut r, "k", lock.owner()),
        Some(2),
        "re-entry applied once"
    );
    proxy.lose_next_reply_to("RLOCK.RELEASE");
    assert_eq!(g2.release().await.unwrap(), ReleaseOutcome::StillHeld);
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 2);
    assert_eq!(
        hget(&mut r, "k", lock.owner()),
        Some(1),
        "release applied once"
    );
    assert_eq!(g1.release().await.unwrap(), ReleaseOutcome::Freed);
    assert!(!exists(&mut r, "k"));
}
