//! The countdown latch (`client.latch(name)`), blocking and async, against a real
//! module-loaded redis-server.

mod support;

use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use redis::Commands;
use rlock_client::Client;
use support::{assert_took_at_least, quick_retries, rlock_stat, wait_until, LossyProxy, Server};

fn waiters(r: &mut redis::Connection) -> u64 {
    rlock_stat(r, "rlock_waiters")
}

#[test]
fn it_sets_counts_down_reads_and_deletes() {
    let s = Server::start();
    let c = Client::open(s.url()).unwrap();
    let mut r = s.conn();
    let latch = c.latch("l");
    assert_eq!(latch.name(), "l");
    assert_eq!(latch.count().unwrap(), 0);
    assert!(latch.try_set_count(2).unwrap());
    assert!(!latch.try_set_count(5).unwrap());
    let v: String = r.get("l").unwrap();
    assert_eq!(v, "2", "Redisson's layout");
    assert_eq!(latch.count_down().unwrap(), 1);
    assert_eq!(latch.count().unwrap(), 1);
    assert!(
        !latch.await_timeout(Duration::ZERO).unwrap(),
        "closed: looks once"
    );
    assert_eq!(latch.count_down().unwrap(), 0);
    assert_eq!(latch.count_down().unwrap(), 0, "no latch");
    assert!(latch.await_timeout(Duration::ZERO).unwrap());
    assert!(latch.try_set_count(1).unwrap());
    assert!(latch.delete().unwrap());
    assert!(!latch.delete().unwrap());
    assert!(
        latch.try_set_count(0).is_err(),
        "the server refuses a zero count"
    );
}

#[test]
fn awaiters_are_released_together_at_zero() {
    let s = Server::start();
    let c = Client::open(s.url()).unwrap();
    let mut r = s.conn();
    let latch = c.latch("l");
    latch.try_set_count(2).unwrap();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let l = latch.clone();
            thread::spawn(move || l.await_zero())
        })
        .collect();
    assert!(wait_until(Duration::from_secs(5), || waiters(&mut r) == 8));
    latch.count_down().unwrap();
    assert_eq!(waiters(&mut r), 8, "one left: nobody goes");
    latch.count_down().unwrap();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    assert_eq!(waiters(&mut r), 0);
}

#[test]
fn an_await_with_a_timeout_gives_up_in_time() {
    let s = Server::start();
    let c = Client::open(s.url()).unwrap();
    let latch = c.latch("l");
    latch.try_set_count(1).unwrap();
    let t = Instant::now();
    assert!(!latch.await_timeout(Duration::from_millis(50)).unwrap());
    assert_took_at_least(t.elapsed(), Duration::from_millis(50));
    let other = c.latch("l");
    let waiter = thread::spawn(move || other.await_timeout(Duration::from_secs(10)));
    let mut r = s.conn();
    assert!(wait_until(Duration::from_secs(5), || waiters(&mut r) == 1));
    latch.count_down().unwrap();
    assert!(waiter.join().unwrap().unwrap());
}

#[test]
fn a_count_down_whose_reply_is_lost_counts_once() {
    let s = Server::start();
    let proxy = LossyProxy::start(s.port);
    let c = Client::open_with(proxy.url(), quick_retries()).unwrap();
    let latch = c.latch("l");
    latch.try_set_count(3).unwrap();
    proxy.lose_next_reply_to("RLATCH.COUNTDOWN");
    assert_eq!(
        latch.count_down().unwrap(),
        2,
        "the retry gets the first reply"
    );
    assert_eq!(proxy.lost.load(Ordering::SeqCst), 1, "the fault fired");
    assert_eq!(latch.count().unwrap(), 2, "counted once");
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_latch_does_the_same() {
    let s = Server::start();
    let c = rlock_client::aio::Client::open(s.url()).await.unwrap();
    let latch = c.latch("l");
    assert!(latch.try_set_count(2).await.unwrap());
    assert!(!latch
        .await_timeout(Duration::from_millis(20))
        .await
        .unwrap());
    let awaiters: Vec<_> = (0..4)
        .map(|_| {
            let l = latch.clone();
            tokio::spawn(async move { l.await_zero().await })
        })
        .collect();
    let mut r = s.conn();
    for _ in 0..500 {
        if waiters(&mut r) == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(waiters(&mut r), 4);
    assert_eq!(latch.count_down().await.unwrap(), 1);
    assert_eq!(latch.count().await.unwrap(), 1);
    assert_eq!(latch.count_down().await.unwrap(), 0);
    for a in awaiters {
        a.await.unwrap().unwrap();
    }
    assert!(latch.await_timeout(Duration::ZERO).await.unwrap());
    assert!(!latch.delete().await.unwrap());
}
