//! Scripts mode (docs/scripts-mode.md) against real servers: every primitive on Redisson's
//! own scripts on a server without the module, as a user restricted like a managed
//! service's (`+@all -@dangerous`), blocking and async; SCRIPT FLUSH mid-run; waiting
//! Redisson's way (one subscriber connection, woken by the release or at the lease end,
//! no polling); and interop on the same names with Redisson's scripts (the Python
//! client's files, which its scripts mode and the module suite's "Redisson" run) and with
//! module-mode clients on a module-loaded server.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis::Commands;
use rlock_client::{
    AcquireOptions, Client, ClientOptions, Error, Mode, MultiLock, ReplicaSync, Wait,
};
use support::{exists, hget, pttl, wait_until, Server};

/// A client of a server without the module, as the restricted user, in `Auto` mode.
fn scripts_client(s: &Server) -> Client {
    Client::open(s.restricted_url()).unwrap()
}

fn calls(r: &mut redis::Connection, cmd: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(r).unwrap();
    let tag = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&tag))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// EVALSHA and EVAL calls so far: how many times scripts ran.
fn script_runs(r: &mut redis::Connection) -> u64 {
    calls(r, "evalsha") + calls(r, "eval")
}

/// Connections subscribed to something (CLIENT LIST's `sub=` / `psub=` / `ssub=`).
fn subscribers(r: &mut redis::Connection) -> usize {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(r).unwrap();
    list.lines()
        .filter(|l| l.split(' ').any(|f| f.starts_with("sub=") && f != "sub=0"))
        .count()
}

/// One of Redisson's scripts, read from the Python client's files (the source every
/// client's copy must equal), run as Redisson would.
fn redisson(r: &mut redis::Connection, script: &str, keys: &[&str], args: &[&str]) -> redis::Value {
    let path = format!(
        "{}/../python/rlock/lua/{script}.lua",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(path).unwrap();
    redis::cmd("EVAL")
        .arg(text)
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .query(r)
        .unwrap()
}

#[test]
fn auto_finds_no_module_and_every_lock_call_works_for_a_restricted_user() {
    let s = Server::start_without_module();
    let url = s.restricted_url();
    // The user is restricted: CONFIG is refused.
    let mut app = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    assert!(redis::cmd("CONFIG")
        .arg("GET")
        .arg("port")
        .query::<redis::Value>(&mut app)
        .is_err());
    let c = Client::open(url).unwrap();
    assert_eq!(c.mode().unwrap(), Mode::Scripts);
    let mut r = s.conn();
    let lock = c.lock("orders");
    let g1 = lock.acquire().unwrap();
    let g2 = lock.try_acquire().unwrap().expect("re-entered");
    // Redisson's layout: a hash of owner to count, the lease as the key's TTL.
    assert_eq!(hget(&mut r, "orders", lock.owner()), Some(2));
    assert!(pttl(&mut r, "orders") > 20_000);
    let other = c.lock("orders");
    assert!(other.try_acquire().unwrap().is_none());
    assert_eq!(
        g2.release().unwrap(),
        rlock_client::ReleaseOutcome::StillHeld
    );
    assert_eq!(g1.release().unwrap(), rlock_client::ReleaseOutcome::Freed);
    assert!(!exists(&mut r, "orders"));
    // Dropping a guard releases it.
    drop(other.acquire().unwrap());
    assert!(wait_until(Duration::from_secs(5), || !exists(
        &mut r, "orders"
    )));
    // Force release.
    let g = lock.acquire().unwrap();
    assert!(c.force_release("orders").unwrap());
    assert!(matches!(g.release(), Err(Error::NotHeld { .. })));
    // A command no script does says so.
    assert!(c.info("orders").is_err());
}

#[test]
fn a_waiter_is_woken_by_the_release_and_runs_the_script_a_handful_of_times() {
    let s = Server::start_without_module();
    let c = scripts_client(&s);
    let mut r = s.conn();
    let held = c.lock("k").acquire().unwrap();
    let c2 = c.clone();
    let waiter = thread::spawn(move || {
        let t = Instant::now();
        let g = c2
            .lock("k")
            .acquire_timeout(Duration::from_secs(10))
            .unwrap();
        (g.is_some(), t.elapsed())
    });
    // Subscribed, and its first try made (the holder's acquire, the script's first run on
    // this server, was EVALSHA, NOSCRIPT, then EVAL).
    assert!(wait_until(Duration::from_secs(5), || {
        subscribers(&mut r) == 1 && script_runs(&mut r) >= 3
    }));
    let before = script_runs(&mut r);
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        script_runs(&mut r),
        before,
        "no polling while the holder holds"
    );
    let released = Instant::now();
    held.release().unwrap();
    let (got, _) = waiter.join().unwrap();
    assert!(got);
    assert!(released.elapsed() < Duration::from_secs(2));
    let runs = script_runs(&mut r) - before;
    // The release (its first on this server: EVALSHA, NOSCRIPT, EVAL), the try it was
    // woken for and its guard's release: polling would be tens.
    assert!(runs <= 4, "{runs} script runs");
}

#[test]
fn a_dead_holders_lock_is_taken_at_its_lease_end_without_polling() {
    let s = Server::start_without_module();
    let c = scripts_client(&s);
    let mut r = s.conn();
    // A Redisson holder that died: its lock is left to expire in 600 ms.
    support::write_lock(&mut r, "k", "dead-uuid:1", 600);
    let before = script_runs(&mut r);
    let t = Instant::now();
    let g = c
        .lock("k")
        .acquire_timeout(Duration::from_secs(10))
        .unwrap();
    assert!(g.is_some());
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let runs = script_runs(&mut r) - before;
    assert!(runs <= 5, "{runs} script runs: polling");
}

#[test]
fn a_wait_with_a_limit_ends_at_the_limit() {
    let s = Server::start_without_module();
    let c = scripts_client(&s);
    let _held = c.lock("k").acquire().unwrap();
    let t = Instant::now();
    assert!(c
        .lock("k")
        .acquire_timeout(Duration::from_millis(200))
        .unwrap()
        .is_none());
    support::assert_took_at_least(t.elapsed(), Duration::from_millis(190));
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[test]
fn the_watchdog_renews_and_a_lost_lock_is_reported() {
    let s = Server::start_without_module();
    let opts = ClientOptions::new().with_watchdog_timeout(Duration::from_millis(300));
    let c = Client::open_with(s.restricted_url(), opts).unwrap();
    let mut r = s.conn();
    let g = c.lock("k").acquire().unwrap();
    thread::sleep(Duration::from_millis(700));
    assert!(g.is_held() && exists(&mut r, "k"), "renewed past its lease");
    let _: () = r.del("k").unwrap();
    assert!(g.wait_lost(Some(Duration::from_secs(5))).is_some());
    // A read lock is renewed by Redisson's read renewal too.
    let rw = c.rw_lock("rw");
    let rg = rw.read().acquire().unwrap();
    thread::sleep(Duration::from_millis(700));
    assert!(rg.is_held() && exists(&mut r, "rw"));
    rg.release().unwrap();
}

#[test]
fn script_flush_mid_run_loads_the_scripts_again() {
    let s = Server::start_without_module();
    let c = scripts_client(&s);
    let mut r = s.conn();
    let g = c.lock("k").acquire().unwrap();
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut r).unwrap();
    g.release().unwrap();
    let held = c.lock("k").acquire().unwrap();
    let c2 = c.clone();
    let waiter = thread::spawn(move || c2.lock("k").acquire_timeout(Duration::from_secs(10)));
    assert!(wait_until(Duration::from_secs(5), || subscribers(&mut r) == 1));
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut r).unwrap();
    held.release().unwrap();
    assert!(waiter.join().unwrap().unwrap().is_some());
}

#[test]
fn every_wait_of_a_client_shares_one_subscriber_connection() {
    let s = Server::start_without_module();
    let c = scripts_client(&s);
    let mut r = s.conn();
    let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
    let held: Vec<_> = names.iter().map(|n| c.lock(n).acquire().unwrap()).collect();
    let waiters: Vec<_> = names
        .iter()
        .map(|n| {
            let (c, n) = (c.clone(), n.clone());
            thread::spawn(move || c.lock(n).acquire().map(Some))
        })
        .collect();
    // Every waiter's channel subscribed, all on one connection. (The holders' own
    // subscriptions, made before their first try, are given back as they hold: a look
    // may fall between such an UNSUBSCRIBE and the waiter's SUBSCRIBE again.)
    assert!(wait_until(Duration::from_secs(5), || {
        names
            .iter()
            .all(|n| numsub(&mut r, &format!("redisson_lock__channel:{{{n}}}")) == 1)
            && subscribers(&mut r) == 1
    }));
    for g in held {
        g.release().unwrap();
    }
    for w in waiters {
        assert!(w.join().unwrap().unwrap().is_some());
    }
}

#[test]
fn fenced_lock_tokens_grow_in_redissons_token_key() {
    let s = Server::start_without_module();
    let c = scripts_client(&s);
    let mut r = s.conn();
    let f = c.fenced_lock("f");
    let g1 = f.acquire().unwrap();
    let t1 = g1.token();
    g1.release().unwrap();
    let g2 = f.acquire().unwrap();
    assert!(g2.token() > t1);
    let stored: i64 = r.get("redisson_lock_token:{f}").unwrap();
    assert_eq!(stored, g2.token());
    assert_eq!(c.fenced_token("f").unwrap(), Some(g2.token()));
    let other = c.fenced_lock("f");
    assert!(other.try_acquire().unwrap().is_none());
    g2.release().unwrap();
}

#[test]
fn read_write_lock_readers_share_writers_exclude_and_an_upgrade_is_refused() {
    let s = Server::start_without_module();
    let c = scripts_client(&s);
    let (a, b) = (c.rw_lock("doc"), c.rw_lock("doc"));
    let ra = a.read().acquire().unwrap();
    let rb = b.read().acquire().unwrap();
    assert!(c.rw_lock("doc").write().try_acquire().unwrap().is_none());
    // A read holder asking for the write lock is refused, as the module refuses it.
    match a.write().try_acquire() {
        Err(Error::Server { code, .. }) => assert_eq!(code, "READHELD"),
        other => panic!("{other:?}"),
    }
    let c2 = c.clone();
    let writer = thread::spawn(move || {
        let w = c2.rw_lock("doc");
        let g = w.write().acquire_timeout(Duration::from_secs(10)).unwrap();
        g.map(|g| g.release().is_ok())
    });
    thread::sleep(Duration::from_millis(100));
    ra.release().unwrap();
    rb.release().unwrap();
    assert_eq!(writer.join().unwrap(), Some(true));
}

#[test]
fn semaphore_permits_wait_for_a_release() {
    let s = Server::start_without_module();
    let c = scripts_client(&s);
    let mut r = s.conn();
    let sem = c.semaphore("jobs");
    assert!(sem.try_set_permits(2).unwrap());
    assert!(!sem.try_set_permits(9).unwrap());
    let two = sem.acquire(2).unwrap();
    assert_eq!(sem.available().unwrap(), 0);
    assert!(sem.try_acquire(1).unwrap().is_none());
    let c2 = c.clone();
    let waiter = thread::spawn(move || {
        c2.semaphore("jobs")
            .acquire_timeout(1, Duration::from_secs(10))
            .unwrap()
            .map(|p| p.release().unwrap())
    });
    thread::sleep(Duration::from_millis(100));
    // The count is read after Redisson's script (which does not return it): the woken
    // waiter may have taken one by then (docs/scripts-mode.md).
    assert!((1..=2).contains(&two.release().unwrap()));
    assert!(waiter.join().unwrap().is_some());
    assert_eq!(sem.add_permits(1).unwrap(), 3);
    assert_eq!(sem.drain().unwrap(), 3);
    let v: String = r.get("jobs").unwrap();
    assert_eq!(v, "0");
}

#[test]
fn expirable_semaphore_permits_carry_leases_and_an_expired_one_is_taken() {
    let s = Server::start_without_module();
    let c = scripts_client(&s);
    let sem = c.expirable_semaphore("pool");
    assert!(sem.try_set_permits(1).unwrap());
    let p = sem.try_acquire(None).unwrap().expect("free");
    assert_eq!(p.id().len(), 32);
    assert_eq!(sem.available().unwrap(), 0);
    assert_eq!(sem.acquired().unwrap(), 1);
    p.release().unwrap();
    assert_eq!(sem.available().unwrap(), 1);
    // A permit with a 400 ms lease, never released: the waiter gets it at its expiry.
    let lost = sem
        .try_acquire(Some(Duration::from_millis(400)))
        .unwrap()
        .expect("free");
    std::mem::forget(lost);
    let t = Instant::now();
    let next = sem
        .acquire_timeout(Some(Duration::from_secs(5)), Duration::from_secs(10))
        .unwrap();
    assert!(next.is_some());
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[test]
fn countdown_latch_wakes_its_waiters_at_zero() {
    let s = Server::start_without_module();
    let c = scripts_client(&s);
    let latch = c.latch("l");
    assert!(latch.try_set_count(2).unwrap());
    assert!(!latch.try_set_count(5).unwrap());
    let c2 = c.clone();
    let waiter = thread::spawn(move || c2.latch("l").await_timeout(Duration::from_secs(10)));
    thread::sleep(Duration::from_millis(100));
    assert_eq!(latch.count_down().unwrap(), 1);
    assert_eq!(latch.count().unwrap(), 1);
    assert_eq!(latch.count_down().unwrap(), 0);
    assert!(waiter.join().unwrap().unwrap());
    assert!(latch.try_set_count(1).unwrap());
    assert!(latch.delete().unwrap());
}

#[test]
fn multilock_and_redlock_run_on_scripts() {
    let (s1, s2, s3) = (
        Server::start_without_module(),
        Server::start_without_module(),
        Server::start_without_module(),
    );
    let c = scripts_client(&s1);
    let m = MultiLock::new(vec![c.lock("a"), c.lock("b")]);
    let g = m.acquire().unwrap();
    assert!(c.lock("b").try_acquire().unwrap().is_none());
    g.release().unwrap();
    let clients: Vec<Client> = [&s1, &s2, &s3].iter().map(|s| scripts_client(s)).collect();
    let red = rlock_client::RedLock::new(clients.iter().map(|c| c.lock("r")).collect::<Vec<_>>());
    let g = red.acquire().unwrap();
    assert!(clients[1].lock("r").try_acquire().unwrap().is_none());
    g.release().unwrap();
}

#[test]
fn replica_sync_waits_for_the_replica_in_scripts_mode() {
    let master = Server::start_without_module();
    let replica = support::replica_without_module(&master);
    let opts =
        ClientOptions::new().with_replica_sync(Some(ReplicaSync::new(1, Duration::from_secs(2))));
    let c = Client::open_with(master.restricted_url(), opts).unwrap();
    let g = c.lock("k").acquire().unwrap();
    let mut rr = replica.conn();
    assert!(
        exists(&mut rr, "k"),
        "on the replica when the acquire returns"
    );
    g.release().unwrap();
    // Two replicas asked for, one there: the acquire fails and gives the lock back.
    let opts = ClientOptions::new()
        .with_replica_sync(Some(ReplicaSync::new(2, Duration::from_millis(200))));
    let c = Client::open_with(master.restricted_url(), opts).unwrap();
    assert!(matches!(
        c.lock("k").acquire(),
        Err(Error::ReplicaSync { .. })
    ));
    assert!(!exists(&mut master.conn(), "k"));
}

#[test]
fn interop_with_redissons_scripts_on_the_same_names() {
    let s = Server::start_without_module();
    let c = scripts_client(&s);
    let mut r = s.conn();
    // Redisson holds; the client waits and is woken by Redisson's unlock message.
    let none = redisson(
        &mut r,
        "lock_acquire",
        &["k"],
        &["30000", "redisson-uuid:7"],
    );
    assert_eq!(none, redis::Value::Nil);
    let c2 = c.clone();
    let waiter = thread::spawn(move || {
        let t = Instant::now();
        let g = c2
            .lock("k")
            .acquire_timeout(Duration::from_secs(10))
            .unwrap();
        (g.map(|g| g.release().is_ok()), t.elapsed())
    });
    assert!(wait_until(Duration::from_secs(5), || subscribers(&mut r) == 1));
    thread::sleep(Duration::from_millis(100));
    let freed = redisson(
        &mut r,
        "lock_unlock",
        &[
            "k",
            "redisson_lock__channel:{k}",
            "redisson_unlock_latch:{k}:r1",
        ],
        &["0", "30000", "redisson-uuid:7", "publish", "10000"],
    );
    assert_eq!(freed, redis::Value::Int(1));
    let (got, took) = waiter.join().unwrap();
    assert_eq!(got, Some(true));
    assert!(
        took < Duration::from_secs(3),
        "woken by the message: {took:?}"
    );
    // The client holds; Redisson's acquire sees it held, with its PTTL.
    let g = c.lock("k").acquire().unwrap();
    match redisson(
        &mut r,
        "lock_acquire",
        &["k"],
        &["30000", "redisson-uuid:7"],
    ) {
        redis::Value::Int(pttl) => assert!(pttl > 0),
        other => panic!("{other:?}"),
    }
    g.release().unwrap();
    // A Redisson semaphore release wakes the client's semaphore waiter.
    let sem = c.semaphore("sem");
    assert!(sem.try_set_permits(0).unwrap());
    let c3 = c.clone();
    let waiter = thread::spawn(move || {
        c3.semaphore("sem")
            .acquire_timeout(1, Duration::from_secs(10))
            .unwrap()
            .is_some()
    });
    thread::sleep(Duration::from_millis(150));
    redisson(
        &mut r,
        "semaphore_release",
        &["sem", "redisson_sc:{sem}"],
        &["1", "publish"],
    );
    assert!(waiter.join().unwrap());
}

#[test]
fn interop_with_module_mode_clients_on_a_module_loaded_server() {
    let s = Server::start();
    let module = Client::open_with(s.url(), ClientOptions::new().with_mode(Mode::Module)).unwrap();
    let scripts =
        Client::open_with(s.url(), ClientOptions::new().with_mode(Mode::Scripts)).unwrap();
    assert_eq!(scripts.mode().unwrap(), Mode::Scripts);
    assert_eq!(Client::open(s.url()).unwrap().mode().unwrap(), Mode::Module);
    // Each excludes the other, and each wakes the other's waiter.
    for (holder, waiter) in [(&module, &scripts), (&scripts, &module)] {
        let g = holder.lock("k").acquire().unwrap();
        assert!(waiter.lock("k").try_acquire().unwrap().is_none());
        let w = waiter.clone();
        let t = thread::spawn(move || {
            w.lock("k")
                .acquire_timeout(Duration::from_secs(10))
                .unwrap()
                .map(|g| g.release().is_ok())
        });
        thread::sleep(Duration::from_millis(150));
        g.release().unwrap();
        assert_eq!(t.join().unwrap(), Some(true));
    }
    // Semaphore and latch on the same names.
    assert!(module.semaphore("s").try_set_permits(1).unwrap());
    let p = scripts
        .semaphore("s")
        .try_acquire(1)
        .unwrap()
        .expect("the module's permit");
    assert!(module.semaphore("s").try_acquire(1).unwrap().is_none());
    p.release().unwrap();
    assert_eq!(module.semaphore("s").available().unwrap(), 1);
    assert!(scripts.latch("l").try_set_count(1).unwrap());
    assert_eq!(module.latch("l").count().unwrap(), 1);
    let fenced = scripts.fenced_lock("f").acquire().unwrap();
    let t = fenced.token();
    fenced.release().unwrap();
    let g = module.fenced_lock("f").acquire().unwrap();
    assert!(g.token() > t);
    g.release().unwrap();
}

#[test]
fn mode_module_fails_without_the_module_and_scripts_mode_is_kept() {
    let s = Server::start_without_module();
    let c = Client::open_with(s.url(), ClientOptions::new().with_mode(Mode::Module)).unwrap();
    assert!(c.lock("k").try_acquire().is_err());
    let opts = AcquireOptions::new()
        .with_wait(Wait::No)
        .with_lease(Duration::from_secs(5));
    let c = Client::open_with(s.url(), ClientOptions::new().with_mode(Mode::Scripts)).unwrap();
    let g = c.lock("k").acquire_with(opts).unwrap().expect("free");
    assert!(pttl(&mut s.conn(), "k") <= 5_000);
    g.release().unwrap();
}

#[test]
fn a_failover_to_a_server_with_the_module_is_noticed() {
    let plain = Server::start_without_module();
    let with_module = Server::start();
    let proxy = support::LossyProxy::start(plain.port);
    let c = Client::open_with(proxy.url(), support::quick_retries()).unwrap();
    assert_eq!(c.mode().unwrap(), Mode::Scripts);
    c.lock("k").acquire().unwrap().release().unwrap();
    // The "failover": the same address now reaches a module-loaded server, and the old
    // connection breaks.
    proxy.set_upstream(with_module.port);
    drop(plain);
    assert!(wait_until(Duration::from_secs(10), || {
        let _ = c.lock("k").try_acquire().map(|g| g.map(|g| g.release()));
        matches!(c.mode(), Ok(Mode::Module))
    }));
    let g = c.lock("k").acquire().unwrap();
    assert!(rlock_client::Client::open(with_module.url())
        .unwrap()
        .info("k")
        .unwrap()
        .is_some());
    g.release().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_api_waits_on_scripts_too() {
    let s = Server::start_without_module();
    let c = rlock_client::aio::Client::open(s.restricted_url())
        .await
        .unwrap();
    assert_eq!(c.mode().await.unwrap(), Mode::Scripts);
    let held = c.lock("k").acquire().await.unwrap();
    let c2 = c.clone();
    let waiter = tokio::spawn(async move {
        c2.lock("k")
            .acquire_timeout(Duration::from_secs(10))
            .await
            .unwrap()
            .is_some()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    assert!(waiter.await.unwrap());
    let sem = c.semaphore("s");
    assert!(sem.try_set_permits(1).await.unwrap());
    let p = sem.acquire(1).await.unwrap();
    p.release().await.unwrap();
}

/// Subscribers of `channel` (PUBSUB NUMSUB).
fn numsub(r: &mut redis::Connection, channel: &str) -> i64 {
    redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query::<Vec<redis::Value>>(r)
        .ok()
        .and_then(|v| match v.get(1) {
            Some(redis::Value::Int(n)) => Some(*n),
            _ => None,
        })
        .unwrap_or(-1)
}

/// A channel is unsubscribed after its last waiter, and a waiter that comes as the last
/// one leaves is never left on an unsubscribed channel: threads taking turns on one lock
/// (so that its waiters come and go all the time) each get every turn well before the
/// holder's lease would have woken a waiter that missed its unlock message.
#[test]
fn a_channel_is_unsubscribed_after_its_last_waiter_and_no_waiter_misses_a_release() {
    let s = Server::start_without_module();
    let c = scripts_client(&s);
    let mut r = s.conn();
    const THREADS: usize = 4;
    const ROUNDS: usize = 100;
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let lock = c.lock("turns");
            thread::spawn(move || {
                for _ in 0..ROUNDS {
                    // A missed unlock message would sleep until the 30 s lease's end.
                    let g = lock
                        .acquire_with(
                            AcquireOptions::new()
                                .with_lease(Duration::from_secs(30))
                                .with_wait(Wait::Up(Duration::from_secs(10))),
                        )
                        .unwrap()
                        .expect("a turn within 10 s");
                    g.release().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(wait_until(Duration::from_secs(5), || numsub(
        &mut r,
        "redisson_lock__channel:{turns}"
    ) == 0));
    // And a later wait subscribes again.
    let held = c.lock("turns").acquire().unwrap();
    let w = {
        let lock = c.lock("turns");
        thread::spawn(move || lock.acquire().unwrap().release().unwrap())
    };
    assert!(wait_until(Duration::from_secs(5), || numsub(
        &mut r,
        "redisson_lock__channel:{turns}"
    ) == 1));
    held.release().unwrap();
    w.join().unwrap();
    assert!(wait_until(Duration::from_secs(5), || numsub(
        &mut r,
        "redisson_lock__channel:{turns}"
    ) == 0));
}

/// The SHA1 that EVALSHA names for the crate's copy of `lua/<name>.lua`: the marker of
/// that script's request for the proxy. Loaded first, so that the marked EVALSHA runs
/// (not a NOSCRIPT answer, after which the EVAL would not carry the marker).
fn sha_of(s: &Server, text: &str) -> String {
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(text)
        .query(&mut s.conn())
        .unwrap();
    redis::Script::new(text).get_hash().to_owned()
}

/// A scripts-mode client through `proxy`, with quick retries.
fn lossy_scripts_client(proxy: &support::LossyProxy) -> Client {
    Client::open_with(
        proxy.url(),
        support::quick_retries().with_mode(Mode::Scripts),
    )
    .unwrap()
}

/// Issue 39: a release whose connection broke after Redisson's release script (an
/// INCRBY) reached the server is not sent again, which would add its permits twice: the
/// call answers that its outcome is unknown, and the count is up by exactly one.
#[test]
fn a_release_whose_reply_was_lost_is_not_sent_again() {
    let s = Server::start_without_module();
    let proxy = support::LossyProxy::start(s.port);
    let c = lossy_scripts_client(&proxy);
    let sem = c.semaphore("s");
    assert!(sem.try_set_permits(1).unwrap());
    let p = sem.acquire(1).unwrap();
    proxy.lose_next_reply_to(&sha_of(&s, include_str!("../lua/semaphore_release.lua")));
    let err = p.release().unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutcomeUnknown {
                script: "semaphore_release",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_transient());
    assert_eq!(proxy.lost.load(std::sync::atomic::Ordering::SeqCst), 1);
    let n: i64 = s.conn().get("s").unwrap();
    assert_eq!(n, 1, "the release was applied exactly once");
    // The client goes on, on a new connection.
    assert_eq!(sem.available().unwrap(), 1);
}

/// The same for a latch's count-down (a DECR): counted once, and the caller told.
#[test]
fn a_count_down_whose_reply_was_lost_is_not_sent_again() {
    let s = Server::start_without_module();
    let proxy = support::LossyProxy::start(s.port);
    let c = lossy_scripts_client(&proxy);
    let latch = c.latch("l");
    assert!(latch.try_set_count(3).unwrap());
    proxy.lose_next_reply_to(&sha_of(&s, include_str!("../lua/latch_count_down.lua")));
    let err = latch.count_down().unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutcomeUnknown {
                script: "latch_count_down",
                ..
            }
        ),
        "{err:?}"
    );
    let n: i64 = s.conn().get("l").unwrap();
    assert_eq!(n, 2, "counted down exactly once");
}

/// A script whose second run is harmless is still retried: a lock release (Redisson's
/// unlock latch answers the retry, under the release's one request id).
#[test]
fn a_release_of_a_lock_whose_reply_was_lost_is_retried() {
    let s = Server::start_without_module();
    let proxy = support::LossyProxy::start(s.port);
    let c = lossy_scripts_client(&proxy);
    let g = c.lock("k").acquire().unwrap();
    proxy.lose_next_reply_to(&sha_of(&s, include_str!("../lua/lock_unlock.lua")));
    g.release().unwrap();
    assert_eq!(proxy.lost.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(!exists(&mut s.conn(), "k"));
}

/// A failure before the script was written (the connection refused) is retried as
/// before: nothing can have been applied. The server is reachable only after the first
/// tries were refused.
#[test]
fn a_release_refused_before_the_write_is_retried() {
    let s = Server::start_without_module();
    assert!(Client::open(s.url())
        .unwrap()
        .semaphore("s")
        .try_set_permits(0)
        .unwrap());
    // Bound but not listening: connections are refused, and the port stays ours until the
    // forwarder listens on it (closing it and binding again would race with anything that
    // takes the freed port, the client's own refused connects included).
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let port = socket.local_addr().unwrap().as_socket().unwrap().port();
    let opts = ClientOptions::new().with_mode(Mode::Scripts).with_retry(
        rlock_client::RetryPolicy::new()
            .with_max_attempts(30)
            .with_base_delay(Duration::from_millis(50))
            .with_max_delay(Duration::from_millis(50)),
    );
    let c = Client::open_with(format!("redis://127.0.0.1:{port}/"), opts).unwrap();
    let upstream = s.port;
    // The forwarder: relays every connection to the server once it listens (a thread
    // per direction; they end with the test process).
    thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        socket.listen(128).unwrap();
        let l: std::net::TcpListener = socket.into();
        for client in l.incoming() {
            let Ok(client) = client else { return };
            let server = std::net::TcpStream::connect(("127.0.0.1", upstream)).unwrap();
            let (mut cr, mut sw) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            thread::spawn(move || std::io::copy(&mut cr, &mut sw));
            let (mut sr, mut cw) = (server, client);
            thread::spawn(move || std::io::copy(&mut sr, &mut cw));
        }
    });
    assert_eq!(c.semaphore("s").release(1).unwrap(), 1);
    let n: i64 = s.conn().get("s").unwrap();
    assert_eq!(n, 1);
}
