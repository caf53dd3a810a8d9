//! MultiLock and RedLock against three independent module-loaded redis-servers.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use rlock_client::{
    redlock_drift, AcquireOptions, Client, ClientOptions, Error, MultiLock, RedLock, RetryPolicy,
};
use support::{assert_took_at_least, exists, hget, pttl, queued, wait_until, Server};

fn three() -> Vec<Server> {
    (0..3).map(|_| Server::start()).collect()
}

/// One client per server: watchdog lease `ms`, quick retries (a dead server must cost
/// little of a RedLock's validity).
fn clients(servers: &[Server], ms: u64) -> Vec<Client> {
    servers
        .iter()
        .map(|s| {
            let opts = ClientOptions::new()
                .with_watchdog_timeout(Duration::from_millis(ms))
                .with_retry(
                    RetryPolicy::new()
                        .with_max_attempts(2)
                        .with_base_delay(Duration::from_millis(10)),
                );
            Client::open_with(s.url(), opts).unwrap()
        })
        .collect()
}

fn redlock(clients: &[Client], name: &str) -> RedLock {
    RedLock::new(clients.iter().map(|c| c.lock(name)))
}

fn multilock(clients: &[Client], name: &str) -> MultiLock {
    MultiLock::new(clients.iter().map(|c| c.lock(name)))
}

#[test]
fn a_multilock_takes_every_lock_or_none() {
    let servers = three();
    let (a, b) = (clients(&servers, 30_000), clients(&servers, 30_000));
    let mut conns: Vec<_> = servers.iter().map(Server::conn).collect();
    let ml = multilock(&a, "k");
    let g = ml.acquire().unwrap();
    assert!(g.is_held());
    for (conn, lock) in conns.iter_mut().zip(ml.locks()) {
        assert_eq!(hget(conn, "k", lock.owner()), Some(1));
    }
    // Another multi-lock on the same locks gets nothing, and leaves nothing behind.
    let other = multilock(&b, "k");
    assert!(other.try_acquire().unwrap().is_none());
    for (conn, lock) in conns.iter_mut().zip(other.locks()) {
        assert_eq!(hget(conn, "k", lock.owner()), None);
    }
    g.release().unwrap();
    for conn in &mut conns {
        assert!(!exists(conn, "k"));
    }
}

#[test]
fn a_multilock_gives_back_what_it_took_when_one_lock_stays_held() {
    let servers = three();
    let (a, b) = (clients(&servers, 30_000), clients(&servers, 30_000));
    let mut conns: Vec<_> = servers.iter().map(Server::conn).collect();
    let holder = b[2].lock("k").acquire().unwrap();
    let ml = multilock(&a, "k");
    let t = Instant::now();
    assert!(ml
        .acquire_timeout(Duration::from_millis(300))
        .unwrap()
        .is_none());
    assert_took_at_least(t.elapsed(), Duration::from_millis(250));
    assert!(!exists(&mut conns[0], "k"), "left behind on server 0");
    assert!(!exists(&mut conns[1], "k"), "left behind on server 1");
    // Waiting for the last lock in the server: handed over on release.
    let waiter = thread::spawn(move || {
        let g = ml.acquire_timeout(Duration::from_secs(10)).unwrap();
        (ml, g)
    });
    assert!(queued(&b[2], "k"));
    holder.release().unwrap();
    let (ml, g) = waiter.join().unwrap();
    let g = g.expect("handed the last lock");
    for (conn, lock) in conns.iter_mut().zip(ml.locks()) {
        assert_eq!(hget(conn, "k", lock.owner()), Some(1));
    }
    g.release().unwrap();
}

#[test]
fn a_multilock_fails_and_leaves_nothing_when_a_server_is_down() {
    let mut servers = three();
    let a = clients(&servers, 30_000);
    servers[1].kill();
    let ml = multilock(&a, "k");
    let err = ml.try_acquire().unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    // The lock taken on server 0 before server 1 failed was given back; server 2 was
    // never reached.
    assert!(!exists(&mut servers[0].conn(), "k"));
    assert!(!exists(&mut servers[2].conn(), "k"));
}

#[test]
fn a_multilock_is_lost_with_any_of_its_locks() {
    let servers = three();
    let a = clients(&servers, 900);
    let g = multilock(&a, "k").acquire().unwrap();
    assert!(a[1].force_release("k").unwrap());
    assert!(g.wait_lost(Some(Duration::from_secs(5))).is_some());
    assert!(!g.is_held());
    assert!(matches!(g.release(), Err(Error::NotHeld { .. })));
    for s in &servers {
        assert!(!exists(&mut s.conn(), "k"));
    }
}

#[test]
fn two_redlocks_exclude_each_other() {
    let servers = three();
    let (a, b) = (clients(&servers, 30_000), clients(&servers, 30_000));
    let (ra, rb) = (redlock(&a, "k"), redlock(&b, "k"));
    let lease = Duration::from_secs(10);
    let opts = AcquireOptions::new().with_lease(lease);
    let g = ra.acquire_with(opts).unwrap().expect("free");
    assert_eq!(g.held_count(), 3);
    let v = g.validity();
    assert!(
        v > Duration::ZERO && v <= lease - redlock_drift(lease),
        "{v:?}"
    );
    assert!(rb.try_acquire().unwrap().is_none());
    assert!(rb
        .acquire_timeout(Duration::from_millis(300))
        .unwrap()
        .is_none());
    // The failed attempts left nothing of b's behind.
    for (s, l) in servers.iter().zip(rb.locks()) {
        assert_eq!(hget(&mut s.conn(), "k", l.owner()), None);
    }
    assert_eq!(g.release().unwrap(), 3);
    let g = rb.try_acquire().unwrap().expect("free again");
    assert_eq!(g.release().unwrap(), 3);
}

#[test]
fn a_redlock_survives_one_server_dying_and_is_taken_again_by_a_majority() {
    let mut servers = three();
    let (a, b) = (clients(&servers, 900), clients(&servers, 900));
    let (ra, rb) = (redlock(&a, "k"), redlock(&b, "k"));
    let g = ra.acquire().unwrap();
    assert_eq!(g.held_count(), 3);
    servers[2].kill();
    // The dead server's part runs out after its 900 ms lease; the two others are renewed.
    assert!(
        wait_until(Duration::from_secs(5), || g.held_count() == 2),
        "held on {}",
        g.held_count()
    );
    assert!(g.is_held(), "a majority still holds it");
    assert!(g.validity() > Duration::ZERO);
    assert_eq!(g.lost_reason(), None);
    for s in &servers[..2] {
        let ttl = pttl(&mut s.conn(), "k");
        assert!(ttl > 0, "renewed past the lease: {ttl}");
    }
    // Two of three are held by a: b can have no majority.
    assert!(rb.try_acquire().unwrap().is_none());
    assert_eq!(g.release().unwrap(), 2);
    // With one server still down, b takes it on the two others.
    let t = Instant::now();
    let gb = rb.try_acquire().unwrap().expect("a majority of 2 of 3");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert_eq!(gb.held_count(), 2);
    assert!(gb.is_held());
    for (s, l) in servers[..2].iter().zip(rb.locks()) {
        assert_eq!(hget(&mut s.conn(), "k", l.owner()), Some(1));
    }
    assert_eq!(gb.release().unwrap(), 2);
}

#[test]
fn a_redlock_is_lost_when_a_majority_is_lost() {
    let servers = three();
    let a = clients(&servers, 900);
    let g = redlock(&a, "k").acquire().unwrap();
    assert!(a[0].force_release("k").unwrap());
    assert!(wait_until(Duration::from_secs(5), || g.held_count() == 2));
    assert!(g.is_held(), "one loss is spared");
    assert!(a[1].force_release("k").unwrap());
    assert!(g.wait_lost(Some(Duration::from_secs(5))).is_some());
    assert!(!g.is_held());
    assert!(g.release().is_err(), "only one server still held it");
}

#[test]
fn a_redlock_fails_without_a_majority_of_servers() {
    let mut servers = three();
    let a = clients(&servers, 30_000);
    servers[0].kill();
    servers[1].kill();
    let err = redlock(&a, "k").try_acquire().unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(!exists(&mut servers[2].conn(), "k"), "left behind");
}

// ---- the async API: the same MultiLock and RedLock (the one implementation the blocking
// faces above run), driven by tokio tasks.

mod async_api {
    use super::*;
    use rlock_client::aio;

    async fn aclients(servers: &[Server], ms: u64) -> Vec<aio::Client> {
        let mut out = Vec::new();
        for s in servers {
            let opts = ClientOptions::new()
                .with_watchdog_timeout(Duration::from_millis(ms))
                .with_retry(
                    RetryPolicy::new()
                        .with_max_attempts(2)
                        .with_base_delay(Duration::from_millis(10)),
                );
            out.push(aio::Client::open_with(s.url(), opts).await.unwrap());
        }
        out
    }

    fn amulti(clients: &[aio::Client], name: &str) -> aio::MultiLock {
        aio::MultiLock::new(clients.iter().map(|c| c.lock(name)))
    }

    fn ared(clients: &[aio::Client], name: &str) -> aio::RedLock {
        aio::RedLock::new(clients.iter().map(|c| c.lock(name)))
    }

    /// Whether `key` has a waiter queued in the server within 5 s, as `c` sees it.
    async fn aqueued(c: &aio::Client, key: &str) -> bool {
        for _ in 0..500 {
            if c.info(key).await.unwrap().is_some_and(|i| i.waiters == 1) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_async_multilock_takes_every_lock_or_none_and_waits_for_the_last() {
        let servers = three();
        let (a, b) = (
            aclients(&servers, 30_000).await,
            aclients(&servers, 30_000).await,
        );
        let mut conns: Vec<_> = servers.iter().map(Server::conn).collect();
        let ml = amulti(&a, "k");
        let g = ml.acquire().await.unwrap();
        assert!(g.is_held());
        for (conn, lock) in conns.iter_mut().zip(ml.locks()) {
            assert_eq!(hget(conn, "k", lock.owner()), Some(1));
        }
        let other = amulti(&b, "k");
        assert!(other.try_acquire().await.unwrap().is_none());
        for (conn, lock) in conns.iter_mut().zip(other.locks()) {
            assert_eq!(hget(conn, "k", lock.owner()), None, "left behind");
        }
        g.release().await.unwrap();
        for conn in &mut conns {
            assert!(!exists(conn, "k"));
        }
        // One lock held elsewhere: a bounded wait gives back the two it took...
        let holder = b[2].lock("k").acquire().await.unwrap();
        let t = Instant::now();
        assert!(ml
            .acquire_timeout(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none());
        assert_took_at_least(t.elapsed(), Duration::from_millis(250));
        assert!(!exists(&mut conns[0], "k"), "left behind on server 0");
        assert!(!exists(&mut conns[1], "k"), "left behind on server 1");
        // ...and a longer one waits in the server for the last and is handed it.
        let waiter = tokio::spawn(async move {
            let g = ml.acquire_timeout(Duration::from_secs(10)).await.unwrap();
            (ml, g)
        });
        assert!(aqueued(&b[2], "k").await);
        holder.release().await.unwrap();
        let (ml, g) = waiter.await.unwrap();
        let g = g.expect("handed the last lock");
        for (conn, lock) in conns.iter_mut().zip(ml.locks()) {
            assert_eq!(hget(conn, "k", lock.owner()), Some(1));
        }
        g.release().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_async_multilock_is_lost_with_any_of_its_locks() {
        let servers = three();
        let a = aclients(&servers, 900).await;
        let g = amulti(&a, "k").acquire().await.unwrap();
        assert!(a[1].force_release("k").await.unwrap());
        let why = tokio::time::timeout(Duration::from_secs(10), g.lost())
            .await
            .expect("the loss is reported");
        assert_eq!(g.lost_reason(), Some(why));
        assert!(!g.is_held());
        assert!(matches!(g.release().await, Err(Error::NotHeld { .. })));
        for s in &servers {
            assert!(!exists(&mut s.conn(), "k"));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_async_redlocks_exclude_each_other_and_a_majority_loss_is_reported() {
        let mut servers = three();
        let (a, b) = (aclients(&servers, 900).await, aclients(&servers, 900).await);
        let (ra, rb) = (ared(&a, "k"), ared(&b, "k"));
        let lease = Duration::from_secs(10);
        let g = ra
            .acquire_with(AcquireOptions::new().with_lease(lease))
            .await
            .unwrap()
            .expect("free");
        assert_eq!(g.held_count(), 3);
        let v = g.validity();
        assert!(
            v > Duration::ZERO && v <= lease - redlock_drift(lease),
            "{v:?}"
        );
        assert!(rb.try_acquire().await.unwrap().is_none());
        for (s, l) in servers.iter().zip(rb.locks()) {
            assert_eq!(hget(&mut s.conn(), "k", l.owner()), None, "left behind");
        }
        assert_eq!(g.release().await.unwrap(), 3);
        // Watchdog leases: one server dying is spared, a second loss is not.
        let g = rb.acquire().await.unwrap();
        servers[2].kill();
        let spared = tokio::time::timeout(Duration::from_secs(10), async {
            while g.held_count() != 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(spared.is_ok(), "held on {}", g.held_count());
        assert!(g.is_held(), "a majority still holds it");
        assert_eq!(g.lost_reason(), None);
        assert!(b[0].force_release("k").await.unwrap());
        tokio::time::timeout(Duration::from_secs(10), g.lost())
            .await
            .expect("the majority's loss is reported");
        assert!(!g.is_held());
        assert!(g.release().await.is_err(), "one server still held it");
    }
}
