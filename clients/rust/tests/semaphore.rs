//! The semaphore guards against a real module-loaded redis-server.

mod support;

use std::thread;
use std::time::Duration;

use redis::Commands;
use rlock_client::{Client, ClientOptions, Error, LostReason};
use support::{wait_until, Server};

fn client(s: &Server) -> Client {
    Client::open(s.url()).unwrap()
}

fn info_field(r: &mut redis::Connection, cmd: &str, key: &str, field: &str) -> i64 {
    let flat: Vec<redis::Value> = redis::cmd(cmd).arg(key).query(r).unwrap();
    for pair in flat.chunks(2) {
        if let (redis::Value::BulkString(k), redis::Value::Int(v)) = (&pair[0], &pair[1]) {
            if k == field.as_bytes() {
                return *v;
            }
        }
    }
    panic!("{field} not in {cmd}")
}

#[test]
fn permits_are_taken_released_and_returned_on_drop() {
    let s = Server::start();
    let c = client(&s);
    let mut r = s.conn();
    let sem = c.semaphore("jobs");
    assert!(sem.try_set_permits(3).unwrap());
    assert!(!sem.try_set_permits(9).unwrap());
    let two = sem.acquire(2).unwrap();
    assert_eq!(two.permits(), 2);
    assert_eq!(sem.available().unwrap(), 1);
    assert!(sem.try_acquire(2).unwrap().is_none());
    {
        let _one = sem.try_acquire(1).unwrap().expect("one is free");
        assert_eq!(sem.available().unwrap(), 0);
    }
    assert_eq!(
        sem.available().unwrap(),
        1,
        "dropping the guard released it"
    );
    assert_eq!(two.release().unwrap(), 3);
    assert_eq!(sem.add_permits(-1).unwrap(), 2);
    assert_eq!(sem.drain().unwrap(), 2);
    let v: String = r.get("jobs").unwrap();
    assert_eq!(v, "0");
    assert!(sem
        .acquire_timeout(1, Duration::from_millis(50))
        .unwrap()
        .is_none());
}

#[test]
fn a_waiting_acquire_is_served_by_a_release_first_come_first_served() {
    let s = Server::start();
    let c = client(&s);
    let mut r = s.conn();
    let sem = c.semaphore("s");
    sem.try_set_permits(0).unwrap();
    let big = {
        let sem = sem.clone();
        thread::spawn(move || sem.acquire(3).map(|p| p.release()))
    };
    assert!(wait_until(Duration::from_secs(5), || info_field(
        &mut r,
        "RSEMAPHORE.INFO",
        "s",
        "waiters"
    ) == 1));
    let small = {
        let sem = sem.clone();
        thread::spawn(move || {
            sem.acquire_timeout(1, Duration::from_secs(10))
                .map(|p| p.is_some())
        })
    };
    assert!(wait_until(Duration::from_secs(5), || info_field(
        &mut r,
        "RSEMAPHORE.INFO",
        "s",
        "waiters"
    ) == 2));
    sem.release(2).unwrap();
    assert_eq!(
        info_field(&mut r, "RSEMAPHORE.INFO", "s", "waiters"),
        2,
        "the head wants 3"
    );
    sem.release(1).unwrap();
    big.join().unwrap().unwrap().unwrap();
    assert!(small.join().unwrap().unwrap());
}

#[test]
fn an_expirable_permit_has_an_id_and_a_fixed_lease() {
    let s = Server::start();
    let c = client(&s);
    let mut r = s.conn();
    let sem = c.expirable_semaphore("p");
    assert!(sem.try_set_permits(1).unwrap());
    let p = sem.acquire(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(p.id().len(), 32);
    let members: Vec<Vec<u8>> = r.zrange("{p}:timeout", 0, -1).unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(
        members[0]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>(),
        p.id(),
        "Redisson's layout: the raw bytes of the hex id"
    );
    assert!(sem.try_acquire(None).unwrap().is_none());
    assert_eq!((sem.available().unwrap(), sem.acquired().unwrap()), (0, 1));
    assert!(p.is_held());
    p.release().unwrap();
    assert_eq!(sem.available().unwrap(), 1);
}

#[test]
fn a_permit_whose_lease_ran_out_reports_it_and_release_says_not_held() {
    let s = Server::start();
    let c = client(&s);
    let sem = c.expirable_semaphore("p");
    sem.try_set_permits(1).unwrap();
    let p = sem.acquire(Some(Duration::from_millis(100))).unwrap();
    assert_eq!(
        p.wait_lost(Some(Duration::from_secs(5))),
        Some(LostReason::LeaseExpired)
    );
    assert!(!p.is_held());
    // The client counts the lease from before its first send, so it may call the permit
    // lost a few ms before the server's timer takes it back (the safe side): wait for it.
    assert!(wait_until(Duration::from_secs(5), || sem
        .acquired()
        .unwrap()
        == 0));
    let rel = p.release();
    assert!(matches!(rel, Err(Error::NotHeld { .. })), "{rel:?}");
    assert_eq!(
        sem.available().unwrap(),
        1,
        "the module's timer gave it back"
    );
}

#[test]
fn a_watchdog_permit_is_renewed_and_a_lost_one_is_reported() {
    let s = Server::start();
    let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_millis(300));
    let c = Client::open_with(s.url(), opts).unwrap();
    let mut r = s.conn();
    let sem = c.expirable_semaphore("p");
    sem.try_set_permits(2).unwrap();
    let p = sem.acquire(None).unwrap();
    thread::sleep(Duration::from_millis(900)); // three leases: only renewals keep it
    assert!(p.is_held());
    let left: i64 = redis::cmd("RPSEMAPHORE.LEASETIME")
        .arg("p")
        .arg(p.id())
        .query(&mut r)
        .unwrap();
    assert!(left > 0 && left <= 300, "{left}");
    p.release().unwrap();

    let q = sem.acquire(None).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    q.on_lost(move |why| tx.send(why).unwrap());
    // Someone takes the permit away (a Java client's release of our id, say).
    let released: i64 = redis::cmd("RPSEMAPHORE.RELEASE")
        .arg("p")
        .arg(q.id())
        .query(&mut r)
        .unwrap();
    assert_eq!(released, 1);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        LostReason::NotHeld
    );
    assert!(!q.is_held());
    assert!(matches!(q.release(), Err(Error::NotHeld { .. })));
}

#[test]
fn dropping_an_expirable_permit_releases_it_and_a_waiter_gets_it() {
    let s = Server::start();
    let c = client(&s);
    let sem = c.expirable_semaphore("p");
    sem.try_set_permits(1).unwrap();
    let p = sem.acquire(Some(Duration::from_secs(60))).unwrap();
    let waiter = {
        let sem = sem.clone();
        thread::spawn(move || {
            sem.acquire_timeout(Some(Duration::from_secs(60)), Duration::from_secs(10))
                .map(|p| p.map(|p| p.id().to_string()))
        })
    };
    let mut r = s.conn();
    assert!(wait_until(Duration::from_secs(5), || info_field(
        &mut r,
        "RPSEMAPHORE.INFO",
        "p",
        "waiters"
    ) == 1));
    drop(p);
    let id = waiter.join().unwrap().unwrap().expect("served");
    assert_eq!(id.len(), 32);
    assert_eq!(
        sem.available().unwrap(),
        1,
        "the waiter's guard was dropped too"
    );
}

#[cfg(feature = "tokio")]
mod aio {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_permits_wait_release_and_drop() {
        let s = Server::start();
        let c = rlock_client::aio::Client::open(s.url()).await.unwrap();
        let sem = c.semaphore("a");
        assert!(sem.try_set_permits(1).await.unwrap());
        let p = sem.acquire(1).await.unwrap();
        assert!(sem.try_acquire(1).await.unwrap().is_none());
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire_timeout(1, Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(p.release().await.unwrap(), 1);
        let q = waiter.await.unwrap().unwrap().expect("served");
        drop(q);
        // The drop's release runs on a spawned task.
        let mut back = false;
        for _ in 0..500 {
            if sem.available().await.unwrap() == 1 {
                back = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(back, "the dropped guard's permit came back");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_expirable_permits_renew_and_report_loss() {
        let s = Server::start();
        let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_millis(300));
        let c = rlock_client::aio::Client::open_with(s.url(), opts)
            .await
            .unwrap();
        let sem = c.expirable_semaphore("p");
        sem.try_set_permits(1).await.unwrap();
        let p = sem.acquire(None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(p.is_held(), "renewed by its task");
        let mut r = s.conn();
        let _: i64 = redis::cmd("RPSEMAPHORE.RELEASE")
            .arg("p")
            .arg(p.id())
            .query(&mut r)
            .unwrap();
        let why = tokio::time::timeout(Duration::from_secs(5), p.lost())
            .await
            .unwrap();
        assert_eq!(why, LostReason::NotHeld);
        assert!(matches!(p.release().await, Err(Error::NotHeld { .. })));
        let q = sem.acquire(Some(Duration::from_millis(100))).await.unwrap();
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(5), q.lost())
                .await
                .unwrap(),
            LostReason::LeaseExpired
        );
    }
}

/// A waiter that misses its own limit while its grant is on the way (a paused process,
/// a stalled network) leaves an orphan whose late grant is given back; the call's retry
/// must then not claim the same grant by replaying its request id. Found by the fault
/// harness (faults/: a paused waiter of a plain semaphore came back holding a second
/// permit of one). Here a proxy stalls the server's bytes instead of a SIGSTOP.
#[test]
fn a_waiter_whose_late_grant_was_given_back_does_not_also_keep_it() {
    let s = Server::start();
    let proxy = support::LossyProxy::start(s.port);
    let opts = ClientOptions::default()
        .with_response_timeout(Some(Duration::from_millis(100)))
        .with_retry(
            rlock_client::RetryPolicy::new()
                .with_max_attempts(3)
                .with_base_delay(Duration::from_millis(400))
                .with_max_delay(Duration::from_millis(400)),
        );
    let waiter = Client::open_with(proxy.url(), opts).unwrap();
    let holder = client(&s);
    let mut r = s.conn();
    assert!(holder.semaphore("s").try_set_permits(1).unwrap());
    let held = holder.semaphore("s").acquire(1).unwrap();
    // Connect the waiter's connections before the stall.
    assert_eq!(waiter.semaphore("s").available().unwrap(), 0);
    let w = thread::spawn(move || {
        let got = waiter
            .semaphore("s")
            .acquire_timeout(1, Duration::from_millis(100));
        let acquired = got.unwrap().map(|p| {
            let n = p.permits();
            std::mem::forget(p); // keep it: the check below reads the server
            n
        });
        (acquired, waiter)
    });
    assert!(wait_until(Duration::from_secs(5), || {
        info_field(&mut r, "RSEMAPHORE.INFO", "s", "waiters") == 1
    }));
    proxy.hold_replies(true);
    held.release().unwrap(); // granted to the waiter's ticket; the message is held back
                             // Past the waiter's limit (100 ms + 100 ms margin), but before its retry (400 ms).
    thread::sleep(Duration::from_millis(350));
    proxy.hold_replies(false);
    let (acquired, _waiter) = w.join().unwrap();
    // Whatever the waiter was told, the server must agree once the give-back (on a
    // thread of the waiter's client) is done.
    let want = match acquired {
        Some(1) => 0,
        None => 1,
        other => panic!("unexpected {other:?}"),
    };
    assert!(
        wait_until(Duration::from_secs(5), || r.get::<_, i64>("s").unwrap()
            == want),
        "told {acquired:?}, but the server has {} available",
        r.get::<_, i64>("s").unwrap()
    );
}
