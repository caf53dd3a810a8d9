"""The Python client on a real Redis Cluster (3 masters with the module, started by the
module suite's tests/support/cluster_helpers.py, reused here) through redis-py's `RedisCluster`:
every primitive waits as a ticket on the node owning its key (one ticket connection per
node, shard channels), and a ticket whose slot migrates while it waits (MIGRATE, or
Valkey 9's atomic slot migration) is redirected and still served, on the new node. On a
cluster with a replica per master, replica sync after an acquire runs on the key's node:
its ROLE, and RENEW + WAIT down one of its connections.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import sys
import threading
import time

import pytest
from conftest import MODULE_TESTS, blocked_clients, clients_named, scripts_waiters, wait_until
from redis.cluster import RedisCluster

import rlock


def _load(name: str, filename: str):
    spec = importlib.util.spec_from_file_location(name, MODULE_TESTS / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# cluster_helpers imports the module suite's conftest by the name `conftest`, which in
# this directory is ours: lend it theirs while it loads.
_ours = sys.modules["conftest"]
sys.modules["conftest"] = _load("rlock_suite_conftest", "../conftest.py")
try:
    helpers = _load("rlock_suite_cluster_helpers", "cluster_helpers.py")
finally:
    sys.modules["conftest"] = _ours


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = helpers.Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.start()
        yield c
    finally:
        crashed = c.stop()
    assert not crashed, "a cluster node crashed"


@pytest.fixture
def rc(cluster):
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    yield client
    rlock.close_tickets(client)
    client.close()


def waiters(node) -> int:
    return int(node.client().info("rlock")["rlock_waiters"])


def test_every_primitive_waits_with_a_ticket_on_each_master(cluster, rc):
    masters = sorted(cluster.masters(), key=lambda s: s.port)
    for i, node in enumerate(masters):
        lo, hi = cluster.slot_ranges(node)[0]
        key = helpers.key_on(lo, hi, f"py{i}")
        holders = [rlock.FencedLock(rc, key, timeout=30),
                   rlock.RwLock(rc, "{%s}:rw" % key, timeout=30).write]
        for h in holders:
            assert h.acquire(blocking=False)
        sem = rlock.Semaphore(rc, "{%s}:sem" % key)
        sem.try_set_permits(0)
        latch = rlock.CountDownLatch(rc, "{%s}:latch" % key)
        latch.try_set_count(1)
        reader = rlock.RwLock(rc, "{%s}:rw" % key, timeout=30).read
        calls = [lambda: rlock.FencedLock(rc, key, timeout=30).acquire(blocking_timeout=10),
                 lambda: reader.acquire(blocking_timeout=10),
                 lambda: sem.acquire(blocking_timeout=10),
                 lambda: latch.wait(10)]
        results: list = []
        threads = [threading.Thread(target=lambda c=c: results.append(c())) for c in calls]
        for t in threads:
            t.start()
        wait_until(lambda: waiters(node) == len(calls), what="queued on the key's node")
        assert blocked_clients(node.client()) == 0
        assert clients_named(node.client(), rlock.TICKET_CONNECTION_NAME) == 1
        for h in holders:
            h.release()
        sem.release()
        latch.count_down()
        for t in threads:
            t.join(10)
        assert results == [True] * len(calls)
    # A node's shard channels are unsubscribed after their last waiter, tagged or not (an
    # idle one the node dropped unheard in a slot migration would miss a later grant).
    wait_until(lambda: all(m.client().execute_command(
        "PUBSUB", "SHARDCHANNELS", "rlock_ticket:*") == [] for m in masters),
        what="no shard channel left subscribed")


def test_a_ticket_whose_slot_migrates_while_it_waits_is_served_on_the_new_node(cluster, rc):
    src, dst = sorted(cluster.masters(), key=lambda s: s.port)[:2]
    slot = cluster.slot_ranges(src)[-1][1]
    key = helpers.key_on(slot, slot, "py-mig")
    holder = rlock.FencedLock(rc, key, timeout=30)
    assert holder.acquire()
    waiter = rlock.FencedLock(rc, key, timeout=30)
    result: list = []
    t = threading.Thread(target=lambda: result.append(waiter.acquire(blocking_timeout=20)))
    t.start()
    wait_until(lambda: waiters(src) == 1, what="ticket queued on the source")
    assert blocked_clients(src.client()) == 0
    # Migrate the slot (as redis-cli --cluster reshard does) with the lock in it: the
    # ticket is told ASK, and the client waits on the destination from then on.
    cluster.settle_epochs()
    dst.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(src))
    src.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(dst))
    # Every key of the slot, as a resharding moves them: the fencing token's key and the
    # request-id records too. A key left on the source made its SETSLOT NODE below fail
    # ("still hold keys") whenever it came before the source had heard of the new owner.
    in_slot = src.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
    assert key.encode() in in_slot
    assert src.client().execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000,
                                        "KEYS", *in_slot)
    assert src.client().execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    wait_until(lambda: waiters(dst) == 1, what="the waiter waits on the destination")
    assert waiters(src) == 0
    dst_id = cluster.node_id(dst)
    for node in [dst] + [n for n in cluster.masters() if n is not dst]:
        node.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    holder.release()
    t.join(20)
    assert result == [True] and waiter.token > holder.token
    assert dst.client().hgetall(key) == {waiter.owner.encode(): b"1"}
    waiter.release()
    # The ticket connection of the destination node is used from now on.
    again = rlock.Semaphore(rc, "{%s}:s" % key)
    again.try_set_permits(0)
    t = threading.Thread(target=lambda: result.append(again.acquire(blocking_timeout=10)))
    t.start()
    wait_until(lambda: waiters(dst) == 1, what="a ticket on the destination")
    assert blocked_clients(dst.client()) == 0
    again.release()
    t.join(10)
    assert result == [True, True]


def test_a_ticket_whose_slot_migrates_atomically_is_served_on_the_new_node(cluster, rc):
    """Valkey 9's `CLUSTER MIGRATESLOTS` (issue 37): the source answers the queued ticket
    `MOVED` after the handover, never grants it there; the client waits on the new owner
    and is served by the release made there."""
    src, dst = sorted(cluster.masters(), key=lambda s: s.port)[:2]
    info = src.client().info("server")
    if info.get("server_name") != "valkey" or int(str(info["valkey_version"]).split(".")[0]) < 9:
        pytest.skip("atomic slot migration (CLUSTER MIGRATESLOTS) is Valkey 9.0+")
    slot = cluster.slot_ranges(src)[-1][1] - 1
    key = helpers.key_on(slot, slot, "py-asm")
    holder = rlock.FencedLock(rc, key, timeout=30)
    assert holder.acquire()
    waiter = rlock.FencedLock(rc, key, timeout=30)
    result: list = []
    t = threading.Thread(target=lambda: result.append(waiter.acquire(blocking_timeout=20)))
    t.start()
    wait_until(lambda: waiters(src) == 1, what="ticket queued on the source")
    assert src.client().execute_command("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot,
                                        "NODE", cluster.node_id(dst)) == b"OK"
    wait_until(lambda: waiters(dst) == 1, timeout=20, what="the waiter waits on the new owner")
    assert waiters(src) == 0
    assert result == [], "not granted anywhere while the holder holds"
    holder.release()
    t.join(20)
    assert result == [True] and waiter.token > holder.token
    assert dst.client().hgetall(key) == {waiter.owner.encode(): b"1"}
    waiter.release()


async def test_asyncio_cluster_clients_wait_with_tickets_too(cluster):
    import redis.asyncio.cluster

    import rlock.asyncio as arlock
    arc = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    try:
        for i, node in enumerate(sorted(cluster.masters(), key=lambda s: s.port)):
            lo, hi = cluster.slot_ranges(node)[0]
            key = helpers.key_on(lo, hi, f"apy{i}")
            sem = arlock.Semaphore(arc, key)
            await sem.try_set_permits(0)
            latch = arlock.CountDownLatch(arc, "{%s}:l" % key)
            await latch.try_set_count(1)
            tasks = [asyncio.create_task(sem.acquire(blocking_timeout=10)),
                     asyncio.create_task(latch.wait(10))]
            deadline = time.monotonic() + 5
            while waiters(node) < 2:
                assert time.monotonic() < deadline, "queued on the key's node"
                await asyncio.sleep(0.005)
            assert blocked_clients(node.client()) == 0
            assert clients_named(node.client(), rlock.TICKET_CONNECTION_NAME) == 1
            await sem.release()
            await latch.count_down()
            assert await asyncio.wait_for(asyncio.gather(*tasks), 10) == [True, True]
    finally:
        await arlock.aclose_tickets(arc)
        await arc.aclose()


def test_scripts_mode_waits_on_each_keys_node_with_shard_channels(cluster):
    """Scripts mode on a cluster: Redisson's scripts with its hash tags (every key a
    script touches, the read lock's timeout keys too, in the name's slot), SPUBLISH and
    one subscriber connection per node with waiters (SSUBSCRIBE on the key's node). The
    cluster has the module; the client is told to use the scripts, which touch none of
    the module's commands."""
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    rlock.set_mode(rc, "scripts")
    try:
        for i, node in enumerate(sorted(cluster.masters(), key=lambda s: s.port)):
            lo, hi = cluster.slot_ranges(node)[0]
            key = helpers.key_on(lo, hi, f"spy{i}")
            holders = [rlock.FencedLock(rc, key, timeout=30),
                       rlock.RwLock(rc, "{%s}:rw" % key, timeout=30).write]
            for h in holders:
                assert h.acquire(blocking=False)
            readers = [rlock.RwLock(rc, "{%s}:rd" % key, timeout=30).read for _ in range(2)]
            for rd in readers:  # two owners' timeout keys, read by each other's unlock
                assert rd.acquire(blocking=False) and rd.acquire(blocking=False)
            sem = rlock.Semaphore(rc, "{%s}:sem" % key)
            sem.try_set_permits(0)
            # Redisson's latch channel wraps the whole name in braces (no prefixName rule),
            # so a latch name with braces of its own is refused on a cluster (CROSSSLOT),
            # as Redisson's is: a plain name on the node.
            latch = rlock.CountDownLatch(rc, helpers.key_on(lo, hi, f"spy{i}-latch"))
            latch.try_set_count(1)
            calls = [lambda: rlock.FencedLock(rc, key, timeout=30).acquire(blocking_timeout=10),
                     lambda: rlock.RwLock(rc, "{%s}:rw" % key, timeout=30)
                     .read.acquire(blocking_timeout=10),
                     lambda: rlock.RwLock(rc, "{%s}:rd" % key, timeout=30)
                     .write.acquire(blocking_timeout=10),
                     lambda: sem.acquire(blocking_timeout=10),
                     lambda: latch.wait(10)]
            results: list = []
            threads = [threading.Thread(target=lambda c=c: results.append(c())) for c in calls]
            for t in threads:
                t.start()
            wait_until(lambda: scripts_waiters(rc) == len(calls), what="subscribed waiters")
            assert rlock._mode.backend(rc).publish == "spublish"
            assert clients_named(node.client(), "rlock-py-subscriber") == 1
            for h in holders:
                h.release()
            for rd in readers:
                rd.release()
                rd.release()
            sem.release()
            latch.count_down()
            for t in threads:
                t.join(10)
            assert results == [True] * len(calls)
    finally:
        rlock.close_tickets(rc)
        rc.close()


async def test_scripts_mode_on_an_asyncio_cluster_client(cluster):
    """The asyncio cluster client in scripts mode: the probe goes to the key's node (the
    client maps its nodes lazily), tasks wait on the one subscriber of each node."""
    import redis.asyncio.cluster

    import rlock.asyncio as arlock
    arc = redis.asyncio.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    rlock.set_mode(arc, "scripts")
    try:
        for i, node in enumerate(sorted(cluster.masters(), key=lambda s: s.port)):
            lo, hi = cluster.slot_ranges(node)[0]
            key = helpers.key_on(lo, hi, f"sapy{i}")
            sem = arlock.Semaphore(arc, key)
            await sem.try_set_permits(0)
            lock = arlock.FencedLock(arc, "{%s}:f" % key, timeout=30)
            assert await lock.acquire(blocking=False)
            tasks = [asyncio.create_task(sem.acquire(blocking_timeout=10)),
                     asyncio.create_task(arlock.FencedLock(arc, "{%s}:f" % key, timeout=30)
                                         .acquire(blocking_timeout=10))]
            deadline = time.monotonic() + 5
            while scripts_waiters(arc) < 2:
                assert time.monotonic() < deadline, "subscribed on the key's node"
                await asyncio.sleep(0.005)
            assert clients_named(node.client(), "rlock-py-subscriber") == 1
            await sem.release()
            await lock.release()
            assert await asyncio.wait_for(asyncio.gather(*tasks), 10) == [True, True]
    finally:
        await arlock.aclose_tickets(arc)
        await arc.aclose()


# ---- replica sync on a cluster with a replica per master ------------------------------


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    """Three masters, each with one replica (nodes[3 + i] replicates nodes[i])."""
    c = helpers.Cluster(tmp_path_factory.mktemp("replicated"), replicas_of=(0, 1, 2))
    try:
        c.start()
        yield c
    finally:
        crashed = c.stop()
    assert not crashed, "a cluster node crashed"


def _calls(node, command: str) -> int:
    stats = node.client().info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def _replica_has(replica, key: str, field: str = None) -> bool:
    """Whether ``replica`` has ``key`` (READONLY: a cluster replica serves reads of its
    master's slots on that connection only)."""
    import redis
    with redis.Redis(port=replica.port, single_connection_client=True) as c:
        c.execute_command("READONLY")
        return bool(c.hexists(key, field) if field is not None else c.exists(key))


def _masters_keys(c, prefix: str):
    """(master, its replica, a key in its slots) for each master."""
    out = []
    for i in range(3):
        master, replica = c.nodes[i], c.nodes[3 + i]
        lo, hi = c.slot_ranges(master)[0]
        out.append((master, replica, helpers.key_on(lo, hi, f"{prefix}{i}")))
    return out


@pytest.mark.module_only
def test_replica_sync_waits_on_the_keys_node_for_its_replica(replicated):
    """Each acquire runs ROLE and WAIT on the node that owns its key and no other, and
    the WAIT returns once that node's replica has the hold (no wait for its offset)."""
    rc = RedisCluster(host="127.0.0.1", port=replicated.nodes[0].port)
    try:
        for master, replica, key in _masters_keys(replicated, "rsy"):
            for n in replicated.nodes[:3]:
                n.client().config_resetstat()
            lock = rlock.Lock(rc, key)
            assert lock.acquire(blocking=False)
            assert _replica_has(replica, key, lock.local.token)
            fenced = rlock.FencedLock(rc, "{%s}:f" % key)
            assert fenced.acquire(blocking=False)
            assert _replica_has(replica, "{%s}:f" % key, fenced.owner)
            rw = rlock.RwLock(rc, "{%s}:rw" % key)
            assert rw.read.acquire(blocking=False)
            assert _replica_has(replica, "{%s}:rw" % key)
            assert [_calls(n, "wait") for n in replicated.nodes[:3]] == \
                [3 if n is master else 0 for n in replicated.nodes[:3]]
            assert _calls(master, "role") == 1  # counted once, for the three acquires
            lock.release()
            fenced.release()
            rw.read.release()
    finally:
        rlock.close_tickets(rc)
        rc.close()


@pytest.mark.module_only
def test_a_stopped_replica_fails_the_acquire_on_its_masters_keys_only(replicated):
    """A replica whose process is stopped (SIGSTOP) does not acknowledge: an acquire on
    its master's keys raises ReplicaSyncError and leaves no lock; one on another
    master's keys still succeeds."""
    (m0, r0, k0), (m1, r1, k1), _ = _masters_keys(replicated, "rst")
    rc = RedisCluster(host="127.0.0.1", port=replicated.nodes[0].port)
    os.kill(r0.proc.pid, signal.SIGSTOP)
    try:
        lock = rlock.Lock(rc, k0, replica_sync=rlock.ReplicaSync(timeout=0.2))
        with pytest.raises(rlock.ReplicaSyncError) as e:
            lock.acquire(blocking=False)
        assert (e.value.wanted, e.value.acked) == (1, 0)
        assert not m0.client().exists(k0) and lock.local.token is None
        other = rlock.Lock(rc, k1, replica_sync=rlock.ReplicaSync(timeout=0.2))
        assert other.acquire(blocking=False)
        other.release()
    finally:
        os.kill(r0.proc.pid, signal.SIGCONT)
        rlock.close_tickets(rc)
        rc.close()
    wait_until(lambda: m0.client().execute_command("WAIT", 1, 100) == 1, timeout=30,
               what="the replica acknowledging again")


@pytest.mark.module_only
async def test_asyncio_cluster_replica_sync_waits_on_the_keys_node(replicated):
    import redis.asyncio.cluster

    import rlock.asyncio as arlock
    arc = redis.asyncio.cluster.RedisCluster(host="127.0.0.1",
                                             port=replicated.nodes[0].port)
    try:
        for master, replica, key in _masters_keys(replicated, "arsy"):
            for n in replicated.nodes[:3]:
                n.client().config_resetstat()
            lock = arlock.Lock(arc, key)
            assert await lock.acquire(blocking=False)
            assert _replica_has(replica, key, lock.local.token)
            assert [_calls(n, "wait") for n in replicated.nodes[:3]] == \
                [1 if n is master else 0 for n in replicated.nodes[:3]]
            await lock.release()
    finally:
        await arlock.aclose_tickets(arc)
        await arc.aclose()
