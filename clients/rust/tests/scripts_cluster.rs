//! Scripts mode (docs/scripts-mode.md) on a real 3-master Redis Cluster without the module,
//! as a user restricted like a managed service's: every primitive's waiter is woken by the
//! other side's release message, published with `SPUBLISH` as Redisson 4.7 does on a
//! cluster with sharded pub/sub, and heard on the key's node (`SSUBSCRIBE`); one subscriber
//! connection per node however many wait, subscribed again after it breaks; a waiter whose
//! slot moves (classic migration) follows it; Redisson's transcribed scripts (the Python
//! client's files) on the same names, both ways; and an acquire whose connection broke
//! after the write is not sent again (no redis-rs cluster retries).

mod support;

use std::thread;
use std::time::{Duration, Instant};

use rlock_client::{Client, Mode};
use support::{client_list, wait_until, Cluster, Server};

const LONG: Duration = Duration::from_secs(10);

/// A client of the cluster as the restricted user (made on every node), in `Auto` mode.
fn scripts_client(cluster: &Cluster) -> Client {
    let urls: Vec<String> = cluster.nodes.iter().map(Server::restricted_url).collect();
    let c = Client::open_cluster(urls).unwrap();
    assert_eq!(c.mode().unwrap(), Mode::Scripts);
    c
}

/// The node (0..3) serving `key`.
fn node_of(cluster: &Cluster, key: &str) -> usize {
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut cluster.nodes[0].conn())
        .unwrap();
    match slot {
        0..=5460 => 0,
        5461..=10922 => 1,
        _ => 2,
    }
}

/// Whether node `n` has a shard channel subscribed for `name` (`{name}` in it).
fn shard_subscribed(n: &Server, name: &str) -> bool {
    let chans: Vec<String> = redis::cmd("PUBSUB")
        .arg("SHARDCHANNELS")
        .query(&mut n.conn())
        .unwrap();
    chans.iter().any(|c| c.contains(&format!("{{{name}}}")))
}

fn calls(n: &Server, cmd: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut n.conn())
        .unwrap();
    let tag = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&tag))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Connections named as the Rust client's sharded subscriber.
fn subscriber_conns(n: &Server) -> usize {
    client_list(&mut n.conn())
        .iter()
        .filter(|(_, name)| name == "rlock-rs-subscriber")
        .count()
}

/// With `name` held, runs `wait` on a thread, waits until the waiter's channel is
/// subscribed on `name`'s node, then runs `release`: how long after the release the
/// waiter got through (it must: `wait` returns true).
fn woken_after_release(
    cluster: &Cluster,
    name: &str,
    release: impl FnOnce(),
    wait: impl FnOnce() -> bool + Send + 'static,
) -> Duration {
    let waiter = thread::spawn(move || {
        let ok = wait();
        (ok, Instant::now())
    });
    let node = &cluster.nodes[node_of(cluster, name)];
    assert!(
        wait_until(LONG, || shard_subscribed(node, name)),
        "{name}: the waiter subscribes on its node"
    );
    // Past its first try: asleep on the channel.
    thread::sleep(Duration::from_millis(50));
    let released = Instant::now();
    release();
    let (ok, done) = waiter.join().unwrap();
    assert!(ok, "{name}: the waiter got through");
    done.saturating_duration_since(released)
}

#[test]
fn every_primitive_on_a_cluster_is_woken_by_the_release_over_sharded_pub_sub() {
    let cluster = Cluster::start_without_module();
    let c = scripts_client(&cluster);
    let holder = scripts_client(&cluster);
    // Leases and permits far longer than a wake by message takes.
    let lease = Duration::from_secs(30);
    let bound = Duration::from_secs(2);
    let name = |i: usize, p: &str| cluster.key_on(i % 3, p);
    let mut took = Vec::new();

    let k = name(0, "lock");
    let g = holder
        .lock(k.as_str())
        .acquire_with(rlock_client::AcquireOptions::new().with_lease(lease))
        .unwrap()
        .expect("free");
    let (c2, k2) = (c.clone(), k.clone());
    took.push((
        "lock",
        woken_after_release(
            &cluster,
            &k,
            move || {
                g.release().unwrap();
            },
            move || {
                c2.lock(k2)
                    .acquire_timeout(LONG)
                    .unwrap()
                    .map(|g| g.release().unwrap())
                    .is_some()
            },
        ),
    ));

    let k = name(1, "fenced");
    let g = holder.fenced_lock(k.as_str()).acquire().unwrap();
    let (c2, k2) = (c.clone(), k.clone());
    took.push((
        "fenced lock",
        woken_after_release(
            &cluster,
            &k,
            move || {
                g.release().unwrap();
            },
            move || {
                c2.fenced_lock(k2)
                    .acquire_timeout(LONG)
                    .unwrap()
                    .map(|g| g.release().unwrap())
                    .is_some()
            },
        ),
    ));

    let k = name(2, "rw");
    let g = holder.rw_lock(k.as_str()).write().acquire().unwrap();
    let (c2, k2) = (c.clone(), k.clone());
    took.push((
        "rwlock",
        woken_after_release(
            &cluster,
            &k,
            move || {
                g.release().unwrap();
            },
            move || {
                c2.rw_lock(k2)
                    .read()
                    .acquire_timeout(LONG)
                    .unwrap()
                    .map(|g| g.release().unwrap())
                    .is_some()
            },
        ),
    ));

    let k = name(0, "sem");
    let sem = holder.semaphore(k.as_str());
    assert!(sem.try_set_permits(1).unwrap());
    let p = sem.acquire(1).unwrap();
    let (c2, k2) = (c.clone(), k.clone());
    took.push((
        "semaphore",
        woken_after_release(
            &cluster,
            &k,
            move || {
                p.release().unwrap();
            },
            move || {
                c2.semaphore(k2)
                    .acquire_timeout(1, LONG)
                    .unwrap()
                    .map(|p| p.release().unwrap())
                    .is_some()
            },
        ),
    ));

    let k = name(1, "pes");
    let pes = holder.expirable_semaphore(k.as_str());
    assert!(pes.try_set_permits(1).unwrap());
    let p = pes.try_acquire(Some(lease)).unwrap().expect("free");
    let (c2, k2) = (c.clone(), k.clone());
    took.push((
        "expirable semaphore",
        woken_after_release(
            &cluster,
            &k,
            move || {
                p.release().unwrap();
            },
            move || {
                c2.expirable_semaphore(k2)
                    .acquire_timeout(Some(lease), LONG)
                    .unwrap()
                    .map(|p| p.release().unwrap())
                    .is_some()
            },
        ),
    ));

    let k = name(2, "latch");
    let latch = holder.latch(k.as_str());
    assert!(latch.try_set_count(1).unwrap());
    let (c2, k2) = (c.clone(), k.clone());
    took.push((
        "latch",
        woken_after_release(
            &cluster,
            &k,
            move || {
                latch.count_down().unwrap();
            },
            move || c2.latch(k2).await_timeout(LONG).unwrap(),
        ),
    ));

    eprintln!("woken after the release: {took:?}");
    for (what, t) in &took {
        assert!(
            *t < bound,
            "{what}: woken {t:?} after the release (lease {lease:?})"
        );
    }
    // Every release went out with SPUBLISH, none with PUBLISH (which a Redisson waiter,
    // subscribed with SSUBSCRIBE, would not hear).
    let spublished: u64 = cluster.nodes.iter().map(|n| calls(n, "spublish")).sum();
    let published: u64 = cluster.nodes.iter().map(|n| calls(n, "publish")).sum();
    assert!(spublished >= 6, "{spublished} SPUBLISH");
    assert_eq!(published, 0);
}

#[test]
fn one_subscriber_connection_per_node_however_many_wait() {
    let cluster = Cluster::start_without_module();
    let c = scripts_client(&cluster);
    let holder = scripts_client(&cluster);
    // Four names on each node, each held (without waiting: the holder subscribes nowhere).
    let names: Vec<String> = (0..12)
        .map(|i| cluster.key_on(i % 3, &format!("n{i}")))
        .collect();
    let held: Vec<_> = names
        .iter()
        .map(|n| {
            holder
                .lock(n.as_str())
                .try_acquire()
                .unwrap()
                .expect("free")
        })
        .collect();
    let waiters: Vec<_> = names
        .iter()
        .map(|n| {
            let (c, n) = (c.clone(), n.clone());
            thread::spawn(move || c.lock(n).acquire_timeout(LONG).unwrap().is_some())
        })
        .collect();
    assert!(wait_until(LONG, || names.iter().all(|n| {
        shard_subscribed(&cluster.nodes[node_of(&cluster, n)], n)
    })));
    let conns: Vec<usize> = cluster.nodes.iter().map(subscriber_conns).collect();
    assert_eq!(
        conns,
        vec![1, 1, 1],
        "twelve waits, one subscriber per node"
    );
    // Node 0's subscriber connection is killed: its four waiters subscribe again on a
    // new one and are still woken by the releases (the holders' watchdog renews: a
    // waiter that missed its message would time out).
    let mut admin = cluster.nodes[0].conn();
    let old = client_list(&mut admin)
        .into_iter()
        .find(|(_, n)| n == "rlock-rs-subscriber")
        .unwrap()
        .0;
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(old)
        .query(&mut admin)
        .unwrap();
    assert!(wait_until(LONG, || {
        let list = client_list(&mut cluster.nodes[0].conn());
        list.iter()
            .any(|(id, n)| n == "rlock-rs-subscriber" && *id != old)
            && names
                .iter()
                .all(|n| shard_subscribed(&cluster.nodes[node_of(&cluster, n)], n))
    }));
    assert_eq!(subscriber_conns(&cluster.nodes[0]), 1);
    for g in held {
        g.release().unwrap();
    }
    for w in waiters {
        assert!(w.join().unwrap());
    }
}

fn node_id(n: &Server) -> String {
    redis::cmd("CLUSTER")
        .arg("MYID")
        .query(&mut n.conn())
        .unwrap()
}

#[test]
fn a_waiter_follows_its_slot_to_the_node_it_migrates_to() {
    let cluster = Cluster::start_without_module();
    let key = cluster.key_on(0, "mk");
    let (src, dst) = (&cluster.nodes[0], &cluster.nodes[1]);
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&key)
        .query(&mut src.conn())
        .unwrap();
    let c = scripts_client(&cluster);
    let holder = scripts_client(&cluster);
    let held = holder
        .lock(key.as_str())
        .try_acquire()
        .unwrap()
        .expect("free");
    let (c2, k2) = (c.clone(), key.clone());
    let waiter = thread::spawn(move || {
        let g = c2
            .lock(k2)
            .acquire_timeout(Duration::from_secs(20))
            .unwrap();
        let done = Instant::now();
        (g.map(|g| g.release().is_ok()), done)
    });
    assert!(wait_until(LONG, || shard_subscribed(src, &key)));

    // Classic migration of the slot to `dst`, the lock with it.
    let (src_id, dst_id) = (node_id(src), node_id(dst));
    cluster.settle_epochs();
    let setslot = |n: &Server, how: &str, id: &str| {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(how)
            .arg(id)
            .query(&mut n.conn())
            .unwrap();
    };
    setslot(dst, "IMPORTING", &src_id);
    setslot(src, "MIGRATING", &dst_id);
    let in_slot: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(1000)
        .query(&mut src.conn())
        .unwrap();
    assert!(in_slot.contains(&key), "{in_slot:?}");
    let _: redis::Value = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(dst.port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(&in_slot)
        .query(&mut src.conn())
        .unwrap();
    for n in [dst, src, &cluster.nodes[2]] {
        setslot(n, "NODE", &dst_id);
    }
    // The source ended the channel's subscription; the waiter subscribed again where
    // the slot went.
    assert!(
        wait_until(LONG, || shard_subscribed(dst, &key)
            && !shard_subscribed(src, &key)),
        "the waiter's channel is subscribed on the slot's new node"
    );
    thread::sleep(Duration::from_millis(50));
    let released = Instant::now();
    held.release().unwrap();
    let (got, done) = waiter.join().unwrap();
    assert_eq!(got, Some(true));
    let took = done.saturating_duration_since(released);
    eprintln!("woken {took:?} after the release on the new node");
    assert!(
        took < Duration::from_secs(2),
        "woken by the message: {took:?}"
    );
}

/// One of Redisson's scripts, read from the Python client's files, run on `key`'s node.
fn redisson(
    cluster: &Cluster,
    key: &str,
    script: &str,
    keys: &[&str],
    args: &[&str],
) -> redis::Value {
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
        .query(&mut cluster.conn_for(key))
        .unwrap()
}

#[test]
fn interop_with_redissons_scripts_over_sharded_pub_sub() {
    let cluster = Cluster::start_without_module();
    let c = scripts_client(&cluster);
    let key = cluster.key_on(2, "rk");
    let chan = format!("redisson_lock__channel:{{{key}}}");
    // Redisson holds; the client waits and is woken by Redisson's unlock, SPUBLISHed.
    let none = redisson(
        &cluster,
        &key,
        "lock_acquire",
        &[&key],
        &["30000", "redisson-uuid:7"],
    );
    assert_eq!(none, redis::Value::Nil);
    let latch = format!("redisson_unlock_latch:{{{key}}}:r1");
    let (cl, k2, ch2) = (&cluster, key.clone(), chan.clone());
    let took = woken_after_release(
        cl,
        &key,
        move || {
            let freed = redisson(
                cl,
                &k2,
                "lock_unlock",
                &[&k2, &ch2, &latch],
                &["0", "30000", "redisson-uuid:7", "spublish", "10000"],
            );
            assert_eq!(freed, redis::Value::Int(1));
        },
        {
            let (c, k) = (c.clone(), key.clone());
            move || {
                c.lock(k)
                    .acquire_timeout(LONG)
                    .unwrap()
                    .map(|g| g.release().unwrap())
                    .is_some()
            }
        },
    );
    assert!(
        took < Duration::from_secs(2),
        "woken by Redisson's message: {took:?}"
    );

    // The client holds; a Redisson waiter (SSUBSCRIBE on the key's node) hears its
    // release.
    let g = c.lock(key.as_str()).acquire().unwrap();
    let mut sub = cluster.conn_for(&key);
    sub.set_read_timeout(Some(LONG)).unwrap();
    sub.send_packed_command(&redis::cmd("SSUBSCRIBE").arg(&chan).get_packed_command())
        .unwrap();
    let _confirmed = sub.recv_response().unwrap();
    g.release().unwrap();
    match sub.recv_response().unwrap() {
        redis::Value::Array(m) => {
            assert_eq!(m[0], redis::Value::BulkString(b"smessage".to_vec()));
            assert_eq!(m[1], redis::Value::BulkString(chan.clone().into_bytes()));
            assert_eq!(m[2], redis::Value::BulkString(b"0".to_vec()));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_acquire_whose_connection_broke_after_the_write_is_not_sent_again_on_a_cluster() {
    let cluster = Cluster::start_without_module();
    let c = scripts_client(&cluster);
    let key = cluster.key_on(1, "once");
    let node = &cluster.nodes[1];
    // Warm: the probes asked, the script cached on the node, the connections open.
    let warm = cluster.key_on(1, "warm");
    drop(c.lock(warm.as_str()).try_acquire().unwrap());
    // The node holds writes back: the acquire's EVALSHA is written and waits there.
    let mut admin = node.conn();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(2000)
        .arg("WRITE")
        .query(&mut admin)
        .unwrap();
    let (c2, k2) = (c.clone(), key.clone());
    let acquire = thread::spawn(move || c2.lock(k2).try_acquire().map(|g| g.is_some()));
    assert!(wait_until(LONG, || calls_pending(node)));
    // Its connection breaks after the write; redis-rs's cluster connection with its
    // retries would connect again and write it again (run at the unpause).
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("USER")
        .arg("app")
        .query(&mut admin)
        .unwrap();
    let r = acquire.join().unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut admin)
        .unwrap();
    assert!(
        matches!(r, Err(rlock_client::Error::OutcomeUnknown { .. })),
        "{r:?}"
    );
    thread::sleep(Duration::from_millis(200));
    let held: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query(&mut node.conn())
        .unwrap();
    assert!(!held, "the acquire was not sent again");
}

/// Whether the restricted user's `EVALSHA` waits behind the node's CLIENT PAUSE (flag `b`:
/// blocked; not any connection whose last command was a script, which the warm-up's is).
fn calls_pending(n: &Server) -> bool {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut n.conn())
        .unwrap();
    list.lines().any(|l| {
        let field = |f: &str| l.split(' ').find_map(|kv| kv.strip_prefix(f)).unwrap_or("");
        field("user=") == "app" && field("cmd=") == "evalsha" && field("flags=").contains('b')
    })
}
