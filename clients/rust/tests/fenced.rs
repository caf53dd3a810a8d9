//! The fenced lock (`Client::fenced_lock`, design.md 4.2), blocking and async, against a real
//! module-loaded redis-server: tokens grow over acquires, re-entries and handoffs; the
//! guard is the plain guard (watchdog, lost signal, release); a retry after a lost reply
//! gets the first token back.

mod support;

use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;

use rlock_client::{
    AcquireOptions, Client, ClientOptions, Error, LostReason, ReleaseOutcome, Wait,
};
use support::{exists, hget, pttl, queued, quick_retries, LossyProxy, Server};

fn token_key(name: &str) -> String {
    format!("redisson_lock_token:{{{name}}}")
}

fn stored_token(r: &mut redis::Connection, name: &str) -> Option<i64> {
    redis::cmd("GET").arg(token_key(name)).query(r).unwrap()
}

#[test]
fn tokens_grow_over_acquires_and_reentries_and_the_guard_is_a_lock_guard() {
    let s = Server::start();
    let c = Client::open(s.url()).unwrap();
    let mut r = s.conn();
    assert_eq!(c.fenced_token("f").unwrap(), None);
    let lock = c.fenced_lock("f");
    let g1 = lock.acquire().unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // A clock-made token: now_ms << 10, within the test's own second.
    assert!(((g1.token() >> 10) - now_ms).abs() < 5000, "{}", g1.token());
    assert!(g1.token() < 1 << 53);
    let g2 = lock.try_acquire().unwrap().expect("re-entry");
    assert!(g2.token() > g1.token());
    assert_eq!(lock.hold_count(), 2);
    assert_eq!(hget(&mut r, "f", lock.owner()), Some(2));
    assert_eq!(c.fenced_token("f").unwrap(), Some(g2.token()));
    assert_eq!(stored_token(&mut r, "f"), Some(g2.token()));
    assert!(g2.is_held());
    let ttl = pttl(&mut r, "f");
    assert!(ttl > 25_000 && ttl <= 30_000, "watchdog lease: {ttl}");
    // Another handle is refused, with no token spent.
    assert!(c.fenced_lock("f").try_acquire().unwrap().is_none());
    assert_eq!(c.fenced_token("f").unwrap(), Some(g2.token()));
    let last = g2.token();
    assert_eq!(g2.release().unwrap(), ReleaseOutcome::StillHeld);
    assert_eq!(g1.release().unwrap(), ReleaseOutcome::Freed);
    assert!(!exists(&mut r, "f"));
    let g3 = c.fenced_lock("f").acquire().unwrap();
    assert!(g3.token() > last);
    assert_eq!(c.fenced_token("f").unwrap(), Some(g3.token()));
    drop(g3); // releases best-effort, as a LockGuard
    assert!(support::wait_until(Duration::from_secs(5), || !exists(
        &mut r, "f"
    )));
}

#[test]
fn a_handoff_carries_a_larger_token_and_a_wait_limit_gives_up() {
    let s = Server::start();
    let c = Client::open(s.url()).unwrap();
    let holder = c.fenced_lock("h").acquire().unwrap();
    let first = holder.token();
    let none = c
        .fenced_lock("h")
        .acquire_timeout(Duration::from_millis(100))
        .unwrap();
    assert!(none.is_none());
    let c2 = c.clone();
    let waiter = thread::spawn(move || {
        let lock = c2.fenced_lock("h");
        let g = lock.acquire().unwrap();
        (g.token(), g.release().unwrap())
    });
    assert!(queued(&c, "h"));
    holder.release().unwrap();
    let (token, released) = waiter.join().unwrap();
    assert!(token > first);
    assert_eq!(released, ReleaseOutcome::Freed);
}

#[test]
fn a_fenced_lock_and_a_plain_lock_on_one_name_exclude_each_other() {
    let s = Server::start();
    let c = Client::open(s.url()).unwrap();
    let plain = c.lock("m").acquire().unwrap();
    assert!(c.fenced_lock("m").try_acquire().unwrap().is_none());
    plain.release().unwrap();
    let fenced = c.fenced_lock("m").acquire().unwrap();
    assert!(c.lock("m").try_acquire().unwrap().is_none());
    fenced.release().unwrap();
}

#[test]
fn a_fixed_lease_runs_out_and_the_guard_reports_it() {
    let s = Server::start();
    let c = Client::open(s.url()).unwrap();
    let opts = AcquireOptions::new()
        .with_wait(Wait::No)
        .with_lease(Duration::from_millis(300));
    let g = c.fenced_lock("l").acquire_with(opts).unwrap().unwrap();
    assert_eq!(
        g.wait_lost(Some(Duration::from_secs(5))),
        Some(LostReason::LeaseExpired)
    );
    // The next holder's token fences off the lost one.
    let next = c.fenced_lock("l").acquire().unwrap();
    assert!(next.token() > g.token());
    assert!(matches!(g.release(), Err(Error::NotHeld { .. })));
    next.release().unwrap();
}

#[test]
fn the_watchdog_renews_a_fenced_lock_and_reports_a_force_release() {
    let s = Server::start();
    let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_millis(600));
    let c = Client::open_with(s.url(), opts).unwrap();
    let mut r = s.conn();
    let g = c.fenced_lock("w").acquire().unwrap();
    thread::sleep(Duration::from_millis(1500)); // the point: longer than the lease
    assert!(g.is_held(), "{:?}", g.lost_reason());
    assert!(pttl(&mut r, "w") > 0);
    assert!(c.force_release("w").unwrap());
    assert_eq!(
        g.wait_lost(Some(Duration::from_secs(5))),
        Some(LostReason::NotHeld)
    );
}

#[test]
fn a_retry_after_a_lost_reply_gets_the_first_token_and_counts_once() {
    let s = Server::start();
    let proxy = LossyProxy::start(s.port);
    let c = Client::open_with(proxy.url(), quick_retries()).unwrap();
    let mut r = s.conn();
    let lock = c.fenced_lock("q");
    let g1 = lock.try_acquire().unwrap().unwrap();
    proxy.lose_next_reply_to("RFENCED.ACQUIRE");
    let g2 = lock.try_acquire().unwrap().expect("re-entered");
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 1, "the fault fired");
    assert_eq!(hget(&mut r, "q", lock.owner()), Some(2), "applied once");
    // The token the server issued for this acquire, not one of a second re-entry.
    assert_eq!(stored_token(&mut r, "q"), Some(g2.token()));
    assert!(g2.token() > g1.token());
    g2.release().unwrap();
    g1.release().unwrap();
}

#[test]
fn a_handoff_whose_reply_was_lost_is_learned_with_its_token() {
    let s = Server::start();
    let proxy = LossyProxy::start(s.port);
    let c = Client::open_with(proxy.url(), quick_retries()).unwrap();
    let other = Client::open(s.url()).unwrap();
    let mut r = s.conn();
    let holder = other.fenced_lock("x").acquire().unwrap();
    proxy.lose_next_reply_to("RFENCED.ACQUIRE");
    let waiter = thread::spawn(move || {
        let lock = c.fenced_lock("x");
        let g = lock.acquire_timeout(Duration::from_secs(10)).unwrap();
        (lock, g)
    });
    assert!(queued(&other, "x"));
    holder.release().unwrap();
    let (lock, g) = waiter.join().unwrap();
    let g = g.expect("the retry learns of the handoff");
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 1, "the fault fired");
    assert_eq!(
        hget(&mut r, "x", lock.owner()),
        Some(1),
        "handoff counted once"
    );
    assert_eq!(stored_token(&mut r, "x"), Some(g.token()));
    g.release().unwrap();
}

#[cfg(feature = "tokio")]
mod aio {
    use super::*;
    use rlock_client::aio::Client;

    #[tokio::test]
    async fn tokens_grow_and_handoffs_carry_tokens_async() {
        let s = Server::start();
        let c = Client::open(s.url()).await.unwrap();
        assert_eq!(c.fenced_token("a").await.unwrap(), None);
        let lock = c.fenced_lock("a");
        let g1 = lock.acquire().await.unwrap();
        let g2 = lock.try_acquire().await.unwrap().expect("re-entry");
        assert!(g2.token() > g1.token());
        assert_eq!(c.fenced_token("a").await.unwrap(), Some(g2.token()));
        assert!(c.fenced_lock("a").try_acquire().await.unwrap().is_none());
        let c2 = c.clone();
        let waiter = tokio::spawn(async move {
            let g = c2.fenced_lock("a").acquire().await.unwrap();
            let t = g.token();
            g.release().await.unwrap();
            t
        });
        let mut queued = false;
        for _ in 0..500 {
            if c.info("a").await.unwrap().is_some_and(|i| i.waiters == 1) {
                queued = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(queued);
        let last = g2.token();
        g2.release().await.unwrap();
        assert_eq!(g1.release().await.unwrap(), ReleaseOutcome::Freed);
        let handed = waiter.await.unwrap();
        assert!(handed > last);
        let none = c
            .fenced_lock("a")
            .acquire_timeout(Duration::from_millis(10))
            .await
            .unwrap();
        assert!(none.is_some(), "free again");
    }
}
