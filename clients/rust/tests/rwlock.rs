//! The read-write lock (`Client::rw_lock`, blocking and async) against a real
//! module-loaded redis-server.

mod support;

use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;

use rlock_client::{
    AcquireOptions, Client, ClientOptions, Error, LostReason, ReleaseOutcome, Wait,
};
use support::{exists, hget, pttl, quick_retries, wait_until, LossyProxy, Server};

fn waiters(c: &Client, name: &str) -> u64 {
    c.rw_lock(name).info().unwrap().map_or(0, |i| i.waiters)
}

fn timeout_key(name: &str, owner: &str, n: u32) -> String {
    format!("{{{name}}}:{owner}:rwlock_timeout:{n}")
}

#[test]
fn readers_share_and_a_writer_excludes_them() {
    let s = Server::start();
    let c = Client::open(s.url()).unwrap();
    let mut r = s.conn();
    let (a, b, w) = (c.rw_lock("rw"), c.rw_lock("rw"), c.rw_lock("rw"));
    let ga = a.read().acquire().unwrap();
    let gb = b.read().try_acquire().unwrap().expect("readers share");
    assert!(ga.is_held() && gb.is_held());
    assert_eq!(hget(&mut r, "rw", a.owner()), Some(1));
    assert!(exists(&mut r, &timeout_key("rw", a.owner(), 1)));
    assert!(pttl(&mut r, "rw") > 25_000, "watchdog lease");
    assert!(w.write().try_acquire().unwrap().is_none());
    let info = a.info().unwrap().unwrap();
    assert_eq!(info.mode, "read");
    assert_eq!(info.readers.len(), 2);
    assert_eq!(ga.release().unwrap(), ReleaseOutcome::Freed);
    assert_eq!(gb.release().unwrap(), ReleaseOutcome::Freed);
    let gw = w.write().acquire().unwrap();
    assert_eq!(hget(&mut r, "rw", &format!("{}:write", w.owner())), Some(1));
    assert!(a
        .read()
        .acquire_timeout(Duration::from_millis(50))
        .unwrap()
        .is_none());
    // The writer may read.
    let gwr = w.read().try_acquire().unwrap().expect("the writer reads");
    assert_eq!(gw.release().unwrap(), ReleaseOutcome::Freed);
    assert_eq!(w.info().unwrap().unwrap().mode, "read");
    assert_eq!(gwr.release().unwrap(), ReleaseOutcome::Freed);
    assert!(!exists(&mut r, "rw"));
}

#[test]
fn a_reader_asking_for_the_write_lock_gets_an_error_at_once() {
    let s = Server::start();
    let c = Client::open(s.url()).unwrap();
    let rw = c.rw_lock("rw");
    let g = rw.read().acquire().unwrap();
    match rw.write().acquire_timeout(Duration::from_secs(30)) {
        Err(e @ Error::Server { .. }) => {
            assert_eq!(e.refusal(), Some(rlock_client::Refusal::ReadHeld), "{e}");
            assert!(e
                .to_string()
                .starts_with("READHELD this owner holds the read lock"));
        }
        other => panic!("expected the upgrade error, got {other:?}"),
    }
    g.release().unwrap();
}

#[test]
fn a_queued_writer_goes_before_later_readers() {
    let s = Server::start();
    let c = Client::open(s.url()).unwrap();
    let reader = c.rw_lock("rw");
    let g = reader.read().acquire().unwrap();
    let writer = c.rw_lock("rw");
    let wt = thread::spawn(move || {
        let gw = writer.write().acquire().unwrap();
        (writer, gw)
    });
    assert!(wait_until(Duration::from_secs(5), || waiters(&c, "rw") == 1));
    let late = c.rw_lock("rw");
    assert!(
        late.read().try_acquire().unwrap().is_none(),
        "a later reader does not pass the queued writer"
    );
    g.release().unwrap();
    let (_writer, gw) = wt.join().unwrap();
    assert!(gw.is_held());
    gw.release().unwrap();
    late.read()
        .try_acquire()
        .unwrap()
        .unwrap()
        .release()
        .unwrap();
}

#[test]
fn the_watchdog_renews_read_holds_and_reports_a_loss() {
    let s = Server::start();
    let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_millis(600));
    let c = Client::open_with(s.url(), opts).unwrap();
    let mut r = s.conn();
    let rw = c.rw_lock("rw");
    let g = rw.read().acquire().unwrap();
    thread::sleep(Duration::from_millis(1500));
    assert!(g.is_held(), "{:?}", g.lost_reason());
    assert!(
        exists(&mut r, &timeout_key("rw", rw.owner(), 1)),
        "renewed hold"
    );
    assert!(rw.force_release().unwrap());
    assert_eq!(
        g.wait_lost(Some(Duration::from_secs(5))),
        Some(LostReason::NotHeld)
    );
    assert!(matches!(g.release(), Err(Error::NotHeld { .. })));
}

#[test]
fn fixed_leases_and_the_write_side_renew() {
    let s = Server::start();
    let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_millis(600));
    let c = Client::open_with(s.url(), opts).unwrap();
    let mut r = s.conn();
    let rw = c.rw_lock("rw");
    let g = rw.write().acquire().unwrap();
    thread::sleep(Duration::from_millis(1500));
    assert!(g.is_held());
    assert!(pttl(&mut r, "rw") > 0);
    g.release().unwrap();
    let fixed = AcquireOptions::new()
        .with_wait(Wait::No)
        .with_lease(Duration::from_millis(200));
    let g = rw.read().acquire_with(fixed).unwrap().unwrap();
    assert!(pttl(&mut r, "rw") <= 200);
    drop(g);
}

#[test]
fn a_lost_acquire_and_release_reply_are_applied_once() {
    let s = Server::start();
    let proxy = LossyProxy::start(s.port);
    let c = Client::open_with(proxy.url(), quick_retries()).unwrap();
    let mut r = s.conn();
    let rw = c.rw_lock("rw");
    let fixed = AcquireOptions::new()
        .with_wait(Wait::No)
        .with_lease(Duration::from_secs(30));
    let g1 = rw.read().acquire_with(fixed).unwrap().unwrap();
    proxy.lose_next_reply_to("RRWLOCK.ACQUIRE");
    let g2 = rw.read().acquire_with(fixed).unwrap().expect("re-entered");
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 1, "the fault fired");
    assert_eq!(hget(&mut r, "rw", rw.owner()), Some(2), "applied once");
    proxy.lose_next_reply_to("RRWLOCK.RELEASE");
    assert_eq!(g2.release().unwrap(), ReleaseOutcome::StillHeld);
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 2);
    assert_eq!(hget(&mut r, "rw", rw.owner()), Some(1), "released once");
    assert_eq!(g1.release().unwrap(), ReleaseOutcome::Freed);
    assert!(!exists(&mut r, "rw"));
}

#[cfg(feature = "tokio")]
mod aio {
    use super::*;
    use rlock_client::aio::Client;

    #[tokio::test]
    async fn async_readers_writers_and_the_upgrade_error() {
        let s = Server::start();
        let c = Client::open(s.url()).await.unwrap();
        let (a, w) = (c.rw_lock("rw"), c.rw_lock("rw"));
        let ga = a.read().acquire().await.unwrap();
        assert!(w.write().try_acquire().await.unwrap().is_none());
        assert!(matches!(
            a.write().try_acquire().await,
            Err(Error::Server { .. })
        ));
        let info = a.info().await.unwrap().unwrap();
        assert_eq!(info.mode, "read");
        let wt = tokio::spawn(async move {
            let g = w.write().acquire().await.unwrap();
            let held = g.is_held();
            g.release().await.unwrap();
            held
        });
        for _ in 0..500 {
            if a.info().await.unwrap().is_some_and(|i| i.waiters == 1) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ga.release().await.unwrap();
        assert!(wt.await.unwrap());
        assert!(!a.force_release().await.unwrap());
    }
}
