//! Queued tickets on a Redis Cluster (design.md 5): a cluster client's waiting calls share one
//! ticket connection per node (shard channels), whatever the number of waiters; a key
//! whose slot migrates while its ticket waits is followed to its new node.
#![cfg(feature = "tokio")]

mod support;

use std::thread;
use std::time::Duration;

use redis::Value;
use rlock_client::{AcquireOptions, ClientOptions, WaitMode};
use support::{
    blocked_clients, client_list, eventually, exists, info_waiters, wait_until, write_lock, Cluster,
};

/// Bound of every wait in these tests.
const LONG: Duration = Duration::from_secs(60);

/// `waiters` of `RLOCK.INFO key` on the node serving it (0: none).
fn waiters(cluster: &Cluster, key: &str) -> i64 {
    // Asked of the node serving the key wherever its slot has moved (the others answer
    // MOVED).
    cluster
        .nodes
        .iter()
        .filter_map(|n| {
            let mut r = n.conn();
            redis::cmd("RLOCK.INFO")
                .arg(key)
                .query::<redis::Value>(&mut r)
                .ok()?;
            Some(info_waiters(&mut r, "RLOCK.INFO", key))
        })
        .sum()
}

/// Names of the connections to a node other than `r` itself.
fn other_names(r: &mut redis::Connection) -> Vec<String> {
    let me: u64 = redis::cmd("CLIENT").arg("ID").query(r).unwrap();
    client_list(r)
        .into_iter()
        .filter(|(id, _)| *id != me)
        .map(|(_, name)| name)
        .collect()
}

fn ticket_conns(r: &mut redis::Connection) -> usize {
    other_names(r)
        .iter()
        .filter(|n| *n == "rlock-tickets")
        .count()
}

fn lease() -> AcquireOptions {
    AcquireOptions::new().with_lease(Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_tasks_on_every_master_share_one_ticket_connection_per_node() {
    const N: usize = 200;
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.unwrap();
    let keys: Vec<String> = (0..3).map(|i| cluster.key_on(i, "tk")).collect();
    for k in &keys {
        write_lock(&mut cluster.conn_for(k), k, "someone-else", 60_000);
    }
    let c = rlock_client::aio::Client::open_cluster(cluster.urls())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..N {
        let lock = c.lock(keys[i % 3].as_str());
        tasks.push(tokio::spawn(async move {
            let g = lock.acquire_with(lease()).await.unwrap().unwrap();
            g.release().await.unwrap();
        }));
    }
    let all_queued = eventually(LONG, || {
        keys.iter().map(|k| waiters(&cluster, k)).sum::<i64>() == N as i64
    })
    .await;
    assert!(all_queued, "not all {N} waiters queued");
    for (i, n) in cluster.nodes.iter().enumerate() {
        let mut r = n.conn();
        let names = other_names(&mut r);
        assert_eq!(ticket_conns(&mut r), 1, "node {i}: {names:?}");
        assert!(names.len() <= 3, "node {i}: {names:?} for {N} waiters");
        assert_eq!(
            blocked_clients(&mut r),
            0,
            "node {i}: nobody blocks a connection"
        );
    }
    for k in &keys {
        let _: () = redis::cmd("DEL")
            .arg(k)
            .query(&mut cluster.conn_for(k))
            .unwrap();
    }
    for t in tasks {
        tokio::time::timeout(LONG, t).await.unwrap().unwrap();
    }
    for (k, n) in keys.iter().zip(&cluster.nodes) {
        assert!(!exists(&mut cluster.conn_for(k), k), "{k} left held");
        let mut r = n.conn();
        assert_eq!(ticket_conns(&mut r), 1, "still one ticket connection");
    }
}

#[test]
fn a_blocking_cluster_client_waits_with_tickets_on_each_node() {
    let cluster = Cluster::start();
    let keys: Vec<String> = (0..3).map(|i| cluster.key_on(i, "bk")).collect();
    let c = rlock_client::Client::open_cluster(cluster.urls()).unwrap();
    let holders: Vec<_> = keys
        .iter()
        .map(|k| c.lock(k.as_str()).acquire().unwrap())
        .collect();
    let waiters_: Vec<_> = keys
        .iter()
        .map(|k| {
            let (c, k) = (c.clone(), k.clone());
            thread::spawn(move || {
                let g = c
                    .lock(k)
                    .acquire_timeout(Duration::from_secs(30))
                    .unwrap()
                    .expect("handed the lock");
                g.release().unwrap();
            })
        })
        .collect();
    assert!(wait_until(LONG, || keys
        .iter()
        .all(|k| waiters(&cluster, k) == 1)));
    for (i, n) in cluster.nodes.iter().enumerate() {
        let mut r = n.conn();
        assert_eq!(ticket_conns(&mut r), 1, "node {i}");
        assert_eq!(
            blocked_clients(&mut r),
            0,
            "node {i}: a ticket, not a blocked WAIT"
        );
    }
    for g in holders {
        g.release().unwrap();
    }
    for w in waiters_ {
        w.join().unwrap();
    }
    for k in &keys {
        assert!(!exists(&mut cluster.conn_for(k), k));
    }
}

fn node_id(r: &mut redis::Connection) -> String {
    redis::cmd("CLUSTER").arg("MYID").query(r).unwrap()
}

fn keyslot(r: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(r)
        .unwrap()
}

#[test]
fn a_ticket_follows_its_key_to_the_node_its_slot_migrates_to() {
    let cluster = Cluster::start();
    let key = cluster.key_on(0, "mk");
    let (src, dst) = (&cluster.nodes[0], &cluster.nodes[1]);
    let (mut s, mut d) = (src.conn(), dst.conn());
    let slot = keyslot(&mut s, &key);
    let c = rlock_client::Client::open_cluster(cluster.urls()).unwrap();
    // Blocking WAIT: the only ticket connections are `c`'s.
    let holder = rlock_client::Client::open_cluster_with(
        cluster.urls(),
        ClientOptions::new().with_wait_mode(WaitMode::Blocking),
    )
    .unwrap();
    let held = holder.lock(key.as_str()).acquire().unwrap();
    let spawn_waiter = |c: &rlock_client::Client| {
        let (c, k) = (c.clone(), key.clone());
        thread::spawn(move || {
            c.lock(k)
                .acquire_timeout(Duration::from_secs(30))
                .unwrap()
                .expect("handed the lock")
        })
    };
    // A ticket queued on the source node (the client's slot map now names it).
    let first = spawn_waiter(&c);
    assert!(wait_until(LONG, || waiters(&cluster, &key) == 1));
    assert_eq!(ticket_conns(&mut s), 1);
    assert_eq!(blocked_clients(&mut s), 0);

    // The slot moves to `dst`, the lock with it: the source tells the ticket where the
    // key went (ASK), and the waiter follows.
    let (src_id, dst_id) = (node_id(&mut s), node_id(&mut d));
    cluster.settle_epochs();
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("IMPORTING")
        .arg(&src_id)
        .query(&mut d)
        .unwrap();
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg("MIGRATING")
        .arg(&dst_id)
        .query(&mut s)
        .unwrap();
    // Every key of the slot, as a resharding moves them (request-id records too).
    let in_slot: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query(&mut s)
        .unwrap();
    assert!(in_slot.contains(&key), "{in_slot:?}");
    let _: Value = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(dst.port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(&in_slot)
        .query(&mut s)
        .unwrap();
    for n in [dst, src, &cluster.nodes[2]] {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("NODE")
            .arg(&dst_id)
            .query(&mut n.conn())
            .unwrap();
    }
    let mut d3 = dst.conn();
    let mut on_dst = |key: &str| info_waiters(&mut d3, "RLOCK.INFO", key);
    assert!(
        wait_until(LONG, || on_dst(&key) == 1),
        "the first waiter waits on the new node"
    );
    // A second wait from the same client: its slot map still names the source, whose
    // MOVED sends the ticket to the new node.
    let second = spawn_waiter(&c);
    assert!(
        wait_until(LONG, || on_dst(&key) == 2),
        "the second waiter waits on the new node"
    );
    let mut d2 = dst.conn();
    assert!(wait_until(LONG, || ticket_conns(&mut d2) == 1));
    let left: i64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query(&mut s)
        .unwrap();
    assert_eq!(left, 0, "nothing left on the source");

    held.release().unwrap();
    let g1 = first.join().unwrap();
    assert!(exists(&mut d, &key));
    g1.release().unwrap();
    let g2 = second.join().unwrap();
    g2.release().unwrap();
    assert!(!exists(&mut d, &key));
}

/// Whether the server has atomic slot migration (Valkey 9.0+; Redis reports no
/// `valkey_version`).
fn atomic_slot_migration(r: &mut redis::Connection) -> bool {
    let info: String = redis::cmd("INFO").arg("server").query(r).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("valkey_version:"))
        .and_then(|v| v.trim().split('.').next()?.parse::<u32>().ok())
        .is_some_and(|major| major >= 9)
}

#[test]
fn a_ticket_follows_its_key_through_an_atomic_slot_migration() {
    let cluster = Cluster::start();
    let (src, dst) = (&cluster.nodes[0], &cluster.nodes[1]);
    let (mut s, mut d) = (src.conn(), dst.conn());
    if !atomic_slot_migration(&mut s) {
        eprintln!("skipped: atomic slot migration (CLUSTER MIGRATESLOTS) is Valkey 9.0+");
        return;
    }
    let key = cluster.key_on(0, "asm");
    let slot = keyslot(&mut s, &key);
    let c = rlock_client::Client::open_cluster(cluster.urls()).unwrap();
    let (held, waiter) = held_with_a_waiter(&cluster, &c, &key, Duration::from_secs(30));
    assert_eq!(ticket_conns(&mut s), 1, "a ticket, on the source");
    // Valkey 9 moves the slot atomically: the source answers the ticket MOVED after the
    // handover (never grants it there), and the client queues it again on the new owner.
    let dst_id = node_id(&mut d);
    let _: () = redis::cmd("CLUSTER")
        .arg("MIGRATESLOTS")
        .arg("SLOTSRANGE")
        .arg(slot)
        .arg(slot)
        .arg("NODE")
        .arg(&dst_id)
        .query(&mut s)
        .unwrap();
    // `INFO rlock` (RLOCK.INFO on the new owner is MOVED until the handover).
    let node_waiters = |r: &mut redis::Connection| {
        let info: String = redis::cmd("INFO").arg("rlock").query(r).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("rlock_waiters:")?.trim().parse::<i64>().ok())
            .unwrap_or(-1)
    };
    let mut d2 = dst.conn();
    assert!(
        wait_until(LONG, || node_waiters(&mut d2) == 1),
        "the waiter waits on the new owner"
    );
    assert_eq!(node_waiters(&mut s), 0, "nobody waits on the source");
    held.release().unwrap();
    let g = waiter.join().unwrap().expect("handed the lock");
    assert!(
        exists(&mut d, &key),
        "the new owner holds the waiter's lock"
    );
    g.release().unwrap();
    assert!(!exists(&mut d, &key));
}

/// `key` held by a client of its own (blocked waits), and a thread of `c` queued for it
/// (at most `wait`): the hold, and the waiter's outcome.
fn held_with_a_waiter(
    cluster: &Cluster,
    c: &rlock_client::Client,
    key: &str,
    wait: Duration,
) -> (
    rlock_client::LockGuard,
    thread::JoinHandle<Option<rlock_client::LockGuard>>,
) {
    let holder = rlock_client::Client::open_cluster_with(
        cluster.urls(),
        ClientOptions::new().with_wait_mode(WaitMode::Blocking),
    )
    .unwrap();
    let held = holder.lock(key).acquire().unwrap();
    let waiter = {
        let (c, k) = (c.clone(), key.to_owned());
        thread::spawn(move || c.lock(k).acquire_timeout(wait).unwrap())
    };
    assert!(wait_until(LONG, || waiters(cluster, key) == 1));
    (held, waiter)
}

/// Moves `key`'s slot from the node of `from` to the node of `to` (Valkey's atomic slot
/// migration) and waits until `to` serves it.
fn migrate_slot(key: &str, from: &mut redis::Connection, to: &mut redis::Connection) {
    let slot = keyslot(from, key);
    let _: () = redis::cmd("CLUSTER")
        .arg("MIGRATESLOTS")
        .arg("SLOTSRANGE")
        .arg(slot)
        .arg(slot)
        .arg("NODE")
        .arg(node_id(to))
        .query(from)
        .unwrap();
    // A node that does not serve the slot answers MOVED.
    let served = |r: &mut redis::Connection| redis::cmd("EXISTS").arg(key).query::<i64>(r).is_ok();
    assert!(
        wait_until(LONG, || served(to) && !served(from)),
        "the slot moved"
    );
}

/// A node's ticket connection keeps a key's shard channel subscribed between waits, and
/// only one it did subscribe: a wait sent to a node its key's slot had left (the client's
/// map not yet corrected) has its `SSUBSCRIBE` redirected with its ticket, so that node
/// must not keep the channel as subscribed. When the slot came back, a wait there would
/// otherwise send no `SSUBSCRIBE` and never hear its grant (found by the fault harness's
/// `lock:migrate` cell: acquires timed out once the slot had come back).
#[test]
fn a_shard_channel_redirected_with_its_ticket_is_subscribed_again_when_the_slot_returns() {
    let cluster = Cluster::start();
    let (mut a, mut b) = (cluster.nodes[0].conn(), cluster.nodes[1].conn());
    if !atomic_slot_migration(&mut a) {
        eprintln!("skipped: atomic slot migration (CLUSTER MIGRATESLOTS) is Valkey 9.0+");
        return;
    }
    let key = cluster.key_on(0, "back");
    let c = rlock_client::Client::open_cluster(cluster.urls()).unwrap();
    let wait = Duration::from_secs(20);
    // Each wait below finds the lock held, so that it queues a ticket (an uncontended one
    // would take it without: waits.json) and asks for its key's shard channel.
    let queue_and_take = |c: &rlock_client::Client| {
        let (held, waiter) = held_with_a_waiter(&cluster, c, &key, wait);
        held.release().unwrap();
        let g = waiter.join().unwrap().expect("granted");
        g.release().unwrap();
    };
    // The map read, the channel subscribed on A and kept idle there.
    queue_and_take(&c);
    let idle = |r: &mut redis::Connection| -> Vec<String> {
        redis::cmd("PUBSUB")
            .arg("SHARDCHANNELS")
            .arg("rlock_ticket:*")
            .query(r)
            .unwrap()
    };
    assert_eq!(
        idle(&mut a).len(),
        1,
        "the key's channel stays subscribed between waits"
    );
    // A drops the channel with the slot; the client's map still says A.
    migrate_slot(&key, &mut a, &mut b);
    // Sent to A: its SSUBSCRIBE and ticket are redirected, and it is granted on B.
    queue_and_take(&c);
    // Back to A; the map now says B. Granted on A: its channel subscribed there again.
    migrate_slot(&key, &mut b, &mut a);
    queue_and_take(&c);
    assert_eq!(idle(&mut a).len(), 1, "kept again");
}
