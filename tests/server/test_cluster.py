"""Issue 6, server side: RLOCK commands in a real local Redis Cluster (design.md 1.5).

One module-scoped cluster: three masters with the module, splitting slots 0-16383, and one
replica of the first master. Tests look topology up as they go (a migration moves a slot,
the failover test, last, swaps a master and its replica and swaps them back).
"""

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from cluster_helpers import (Cluster, key_on, info_field, lock_state, owners,
                             start_waiter, wait_link_up, wait_replicated, waiters)
from conftest import wait_until

LEASE = 60000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"), replicas_of=[0])
    try:
        c.start()
        yield c
    finally:
        crashed = c.stop()
    assert not crashed, "a cluster node crashed:\n" + "\n".join(
        s.log.read_text()[-3000:] for s in crashed)


@pytest.fixture
def rc(cluster):
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, socket_timeout=30)
    yield client
    client.close()


def master_keys(cluster, prefix):
    """One key per current master, each in a slot that master serves: {server: key}."""
    out = {}
    for m in cluster.masters():
        lo, hi = cluster.slot_ranges(m)[0]
        out[m] = key_on(lo, hi, f"{prefix}:{m.port}")
    assert len(out) == 3
    return out


def asking(server, *cmd):
    """One command on a node that is importing the key's slot (after ASKING)."""
    c = redis.Redis(host="127.0.0.1", port=server.port, single_connection_client=True)
    try:
        assert c.execute_command("ASKING")
        return c.execute_command(*cmd)
    finally:
        c.close()


def replica_client(server):
    """A connection that reads from a cluster replica (READONLY), not redirected."""
    c = redis.Redis(host="127.0.0.1", port=server.port, single_connection_client=True)
    assert c.execute_command("READONLY")
    return c


def moved_or_ask(err):
    kind, slot, addr = str(err).split()
    host, port = addr.rsplit(":", 1)
    return kind, int(slot), host, int(port)


# ---------------------------------------------------------------------------------------
# Routing

RLOCK_CALLS = [
    ("RLOCK.ACQUIRE", "o", LEASE),
    ("RLOCK.ACQUIRE", "o", LEASE, "WAIT", 100),
    ("RLOCK.RELEASE", "o"),
    ("RLOCK.RENEW", "o", LEASE),
    ("RLOCK.FORCERELEASE",),
    ("RLOCK.INFO",),
]


def test_a_plain_client_gets_moved_to_the_node_owning_the_lock_key(cluster):
    keys = master_keys(cluster, "moved")
    for here in cluster.masters():
        c = here.client()
        for owner_node, key in keys.items():
            if owner_node is here:
                continue
            for name, *rest in RLOCK_CALLS:
                with pytest.raises(redis.ResponseError) as e:
                    c.execute_command(name, key, *rest)
                assert moved_or_ask(e.value) == ("MOVED", key_slot(key.encode()), "127.0.0.1",
                                                 owner_node.port), name
            assert owner_node.client().exists(key) == 0


def test_every_node_answers_hello_with_sharded_channels(cluster):
    """RLOCK.HELLO has no key: any node answers it, with `sharded-channels` in cluster
    mode (its messages go out with SPUBLISH, heard with SSUBSCRIBE on the key's node)."""
    for node in cluster.nodes:
        fields = node.client().execute_command("RLOCK.HELLO")
        features = dict(zip(fields[::2], fields[1::2]))[b"features"]
        assert b"sharded-channels" in features and b"tickets" in features


def test_a_cluster_client_routes_rlock_commands_to_every_master(cluster, rc):
    keys = master_keys(cluster, "routed")
    for node, key in keys.items():
        assert rc.get_node_from_key(key).port == node.port
        assert rc.execute_command("RLOCK.ACQUIRE", key, "o", LEASE) is None
        assert rc.execute_command("RLOCK.ACQUIRE", key, "o", LEASE) is None
        pttl = rc.execute_command("RLOCK.ACQUIRE", key, "other", LEASE)
        assert isinstance(pttl, int) and 0 < pttl <= LEASE
        # The lock lives on the owning master and nowhere else.
        assert node.client().hgetall(key) == {b"o": b"2"}
        for other in cluster.masters():
            if other is not node:
                assert other.client().execute_command("CLUSTER", "COUNTKEYSINSLOT",
                                                      key_slot(key.encode())) == 0
        assert rc.execute_command("RLOCK.RENEW", key, "o", LEASE) == 1
        assert rc.execute_command("RLOCK.RELEASE", key, "o") == 0
        assert rc.execute_command("RLOCK.RELEASE", key, "o") == 1
        assert rc.execute_command("RLOCK.INFO", key) is None
        assert node.client().exists(key) == 0


# ---------------------------------------------------------------------------------------
# Unlock messages are sharded

def test_the_unlock_message_goes_to_shard_subscribers_of_the_owning_node(cluster):
    keys = master_keys(cluster, "spub")
    replica = next(s for s in cluster.nodes if s not in keys)
    replica_master = cluster.by_port(info_field(replica.client(), "replication", "master_port"))
    subs = []
    try:
        for node, key in keys.items():
            channel = f"redisson_lock__channel:{{{key}}}"
            shard = node.client().pubsub()
            plain = node.client().pubsub()
            subs += [shard, plain]
            shard.ssubscribe(channel)
            plain.subscribe(channel)
            assert shard.get_message(timeout=5)["type"] == "ssubscribe"
            assert plain.get_message(timeout=5)["type"] == "subscribe"
            on_replica = None
            if node is replica_master:
                on_replica = replica.client().pubsub()
                subs.append(on_replica)
                on_replica.ssubscribe(channel)
                assert on_replica.get_message(timeout=5)["type"] == "ssubscribe"
            c = node.client()
            assert c.execute_command("RLOCK.ACQUIRE", key, "o", LEASE) is None
            assert c.execute_command("RLOCK.RELEASE", key, "o") == 1
            msg = shard.get_message(timeout=5)
            assert msg is not None, f"no sharded unlock message on {node.port}"
            assert (msg["type"], msg["channel"], msg["data"]) == (
                "smessage", channel.encode(), b"0")
            if on_replica is not None:
                msg = on_replica.get_message(timeout=5)
                assert msg is not None, "no sharded unlock message on the shard's replica"
                assert (msg["type"], msg["data"]) == ("smessage", b"0")
            # SPUBLISH, not PUBLISH: a plain subscriber hears nothing.
            assert plain.get_message(timeout=0.2) is None
            # FORCERELEASE publishes the same way.
            assert c.execute_command("RLOCK.ACQUIRE", key, "o", LEASE) is None
            assert c.execute_command("RLOCK.FORCERELEASE", key) == 1
            msg = shard.get_message(timeout=5)
            assert msg is not None and msg["data"] == b"0"
    finally:
        for s in subs:
            s.close()


def test_a_replica_hears_each_sharded_message_once(cluster):
    """In cluster mode a module's SPUBLISH is not in the replication stream: the master
    sends it to its shard's nodes over the cluster bus. A command that publishes must then
    never reach the replica as itself (ffi::not_as_called): run again there, it would
    publish a second time. A latch counted down to zero (a DEL and its message) and a
    lock released (a DEL and its unlock message), each heard exactly once on the replica,
    whose stream is applied before the marker the master publishes last."""
    replica = next(s for s in cluster.nodes
                   if info_field(s.client(), "replication", "role") == "slave")
    master = cluster.by_port(info_field(replica.client(), "replication", "master_port"))
    lo, hi = cluster.slot_ranges(master)[0]
    latch, lock = key_on(lo, hi, "once-latch"), key_on(lo, hi, "once-lock")
    c, rc = master.client(), replica.client()
    cases = [
        (f"redisson_countdownlatch__channel__{{{latch}}}",
         [("RLATCH.TRYSETCOUNT", latch, 2), ("RLATCH.COUNTDOWN", latch),
          ("RLATCH.COUNTDOWN", latch)], [b"1", b"0"]),
        (f"redisson_lock__channel:{{{lock}}}",
         [("RLOCK.ACQUIRE", lock, "o", LEASE), ("RLOCK.ACQUIRE", lock, "o", LEASE),
          ("RLOCK.RELEASE", lock, "o"), ("RLOCK.RELEASE", lock, "o")], [b"0"]),
    ]
    for channel, calls, heard in cases:
        sub = rc.pubsub()
        try:
            sub.ssubscribe(channel)
            assert sub.get_message(timeout=5)["type"] == "ssubscribe"
            for call in calls:
                c.execute_command(*call)
            wait_replicated(c, rc)
            c.execute_command("SPUBLISH", channel, "marker")
            got = []
            for _ in range(20):
                msg = sub.get_message(timeout=5)
                assert msg is not None, f"no marker on the replica after {got}"
                if msg["data"] == b"marker":
                    break
                got.append(msg["data"])
            assert got == heard, channel
            assert c.exists(latch) == 0 and c.exists(lock) == 0
        finally:
            sub.close()


def test_a_subscriber_to_the_channel_of_a_braced_key_is_on_the_same_node(cluster):
    # Redisson's prefixName: key "a{tag}b" -> channel "redisson_lock__channel:a{tag}b",
    # which hashes to the tag's slot, so SSUBSCRIBE reaches the lock's node.
    key = "a{tag}b"
    node = cluster.owner_of(key_slot(key.encode()))
    channel = "redisson_lock__channel:" + key
    assert key_slot(channel.encode()) == key_slot(key.encode())
    sub = node.client().pubsub()
    try:
        sub.ssubscribe(channel)
        assert sub.get_message(timeout=5)["type"] == "ssubscribe"
        c = node.client()
        assert c.execute_command("RLOCK.ACQUIRE", key, "o", LEASE) is None
        assert c.execute_command("RLOCK.RELEASE", key, "o") == 1
        msg = sub.get_message(timeout=5)
        assert msg is not None and (msg["channel"], msg["data"]) == (channel.encode(), b"0")
    finally:
        sub.close()


# ---------------------------------------------------------------------------------------
# Waiting

@pytest.mark.parametrize("path", ["release", "expiry"])
def test_wait_handoffs_work_on_every_master(cluster, path):
    keys = master_keys(cluster, f"wait-{path}")
    with waiters() as pool:
        for node, key in keys.items():
            c = node.client()
            assert c.execute_command("RLOCK.ACQUIRE", key, "holder", LEASE) is None
            w = start_waiter(pool, node, key, "w", lease=LEASE, timeout_ms=10000, probe=c)
            if path == "release":
                assert c.execute_command("RLOCK.RELEASE", key, "holder") == 1
            else:
                assert c.execute_command("RLOCK.RENEW", key, "holder", 100) == 1
            assert w.wait() is None and w.error is None, w.error
            assert owners(c, key) == {b"w": 1}
            assert c.execute_command("RLOCK.FORCERELEASE", key) == 1


# ---------------------------------------------------------------------------------------
# Slot migration

def begin_migration(cluster, slot, src, dst):
    cluster.settle_epochs()
    dst.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(src))
    src.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(dst))


def finish_migration(cluster, slot, dst):
    dst_id = cluster.node_id(dst)
    for s in [dst] + [n for n in cluster.masters() if n is not dst]:
        s.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    wait_until(lambda: all(cluster.owner_of(slot, via=n) is dst for n in cluster.nodes), 10,
               what="every node sees the slot's new owner")


def two_masters(cluster):
    ms = sorted(cluster.masters(), key=lambda s: s.port)
    return ms[0], ms[1]


def test_a_held_lock_survives_its_slot_migrating_and_asks_redirect_during_it(cluster):
    src, dst = two_masters(cluster)
    lo, hi = cluster.slot_ranges(src)[-1]
    slot = hi  # the last slot of the source's range
    key = key_on(slot, slot, "mig")
    fresh = key_on(slot, slot, "mig-fresh")
    s = src.client()
    for _ in range(2):
        assert s.execute_command("RLOCK.ACQUIRE", key, "holder", LEASE) is None
    before = lock_state(s, key)

    begin_migration(cluster, slot, src, dst)
    # The key still lives on the source: served there.
    assert s.execute_command("RLOCK.ACQUIRE", key, "holder", LEASE) is None
    assert s.execute_command("RLOCK.RELEASE", key, "holder") == 0
    before = lock_state(s, key)
    # A key the source no longer has: ASK to the importing node.
    with pytest.raises(redis.ResponseError) as e:
        s.execute_command("RLOCK.ACQUIRE", fresh, "x", LEASE)
    assert moved_or_ask(e.value) == ("ASK", slot, "127.0.0.1", dst.port)
    # The importing node refuses without ASKING, serves with it.
    d = redis.Redis(host="127.0.0.1", port=dst.port, single_connection_client=True)
    try:
        with pytest.raises(redis.ResponseError) as e:
            d.execute_command("RLOCK.ACQUIRE", fresh, "x", LEASE)
        assert moved_or_ask(e.value)[:2] == ("MOVED", slot)
        assert d.execute_command("ASKING")
        assert d.execute_command("RLOCK.ACQUIRE", fresh, "x", LEASE) is None
    finally:
        d.close()

    assert s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", key)
    finish_migration(cluster, slot, dst)

    dc = dst.client()
    # MIGRATE carries the TTL relative (RESTORE without ABSTTL), so the new node's absolute
    # expiry may move by the transfer time: a few ms at most on loopback.
    (held, expire_at), (held_before, expire_before) = lock_state(dc, key), before
    assert held == held_before == {b"holder": b"2"}
    assert abs(expire_at - expire_before) <= 50, (expire_at, expire_before)
    assert owners(dc, key) == {b"holder": 2}
    assert owners(dc, fresh) == {b"x": 1}
    with pytest.raises(redis.ResponseError) as e:
        s.execute_command("RLOCK.RELEASE", key, "holder")
    assert moved_or_ask(e.value) == ("MOVED", slot, "127.0.0.1", dst.port)
    # RLOCK commands work on the new node, waiting included.
    pttl = dc.execute_command("RLOCK.ACQUIRE", key, "other", LEASE)
    assert isinstance(pttl, int) and 0 < pttl <= LEASE
    with waiters() as pool:
        w = start_waiter(pool, dst, key, "other", probe=dc)
        assert dc.execute_command("RLOCK.RELEASE", key, "holder") == 0
        assert dc.execute_command("RLOCK.RELEASE", key, "holder") == 1
        assert w.wait() is None and w.error is None
    assert owners(dc, key) == {b"other": 1}
    assert dc.execute_command("RLOCK.FORCERELEASE", key) == 1
    assert dc.execute_command("RLOCK.FORCERELEASE", fresh) == 1


def test_a_lock_migrated_away_is_not_handed_to_a_waiter_left_on_the_old_node(cluster):
    src, dst = two_masters(cluster)
    lo, hi = cluster.slot_ranges(src)[-1]
    slot = hi
    key = key_on(slot, slot, "mig-waited")
    s = src.client()
    assert s.execute_command("RLOCK.ACQUIRE", key, "holder", LEASE) is None
    with waiters() as pool:
        w = start_waiter(pool, src, key, "waiter", lease=LEASE, timeout_ms=3000, probe=s)
        begin_migration(cluster, slot, src, dst)
        try:
            assert s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", key)
            # Give a (wrong) zero-delay handoff on the source every chance to run.
            s.ping()
            assert asking(dst, "HGETALL", key) == {b"holder": b"1"}
            leftover = s.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)
            granted = w.done.is_set() and w.result is None and w.error is None
            assert (leftover, granted) == (0, False), (
                "the old node wrote a second lock for the migrated key")
            # The waiter is redirected where the key went, as a client asking for a
            # missing key in a migrating slot would be.
            wait_until(w.done.is_set, 5, what="the waiter to be answered")
            assert f"{slot} 127.0.0.1:{dst.port}" in str(w.error), repr(w.error)
            assert "ASK" in f"{type(w.error).__name__} {w.error}", repr(w.error)
        finally:
            # Leave the cluster usable whatever happened: drop any stray lock on the
            # source, then finish moving the slot.
            w.close()
            if s.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot):
                s.delete(key)
            finish_migration(cluster, slot, dst)
            dst.client().delete(key)


def test_a_ticket_on_a_key_whose_slot_migrates_is_told_where_the_key_went(cluster):
    """Queued tickets (docs/commands/tickets.md) are redirected like blocked waiters: the ticket's
    `error` message, published with SPUBLISH on the old node, carries the ASK."""
    src, dst = two_masters(cluster)
    lo, hi = cluster.slot_ranges(src)[-1]
    slot = hi
    key = key_on(slot, slot, "mig-ticket")
    s = src.client()
    assert s.execute_command("RLOCK.ACQUIRE", key, "holder", LEASE) is None
    sub = src.client().pubsub()
    sub.ssubscribe(f"rlock_ticket:{{{key}}}")
    assert sub.get_message(timeout=5)["type"] == "ssubscribe"
    t = src.client()
    assert t.execute_command("RLOCK.ACQUIRE", key, "waiter", LEASE, "WAIT", 0, "ASYNC",
                             "ID", "t1") == b"QUEUED"
    begin_migration(cluster, slot, src, dst)
    try:
        assert s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", key)
        m = None
        for _ in range(50):
            m = sub.get_message(timeout=0.1)
            if m is not None and m["type"] == "smessage":
                break
        assert m is not None and m["type"] == "smessage", m
        assert m["data"] == f"error:2:6:t1waiterASK {slot} 127.0.0.1:{dst.port}".encode()
        assert s.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0, "no lock left behind"
        assert int(info_field(s, "rlock", "rlock_tickets")) == 0
    finally:
        sub.close()
        if s.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot):
            s.delete(key)
        finish_migration(cluster, slot, dst)
        dst.client().delete(key)


def test_a_tagged_ticket_hears_its_grant_and_its_ask_on_its_own_sharded_channel(cluster):
    """`NOTIFY tag` (docs/commands/tickets.md): the ticket's messages go out with SPUBLISH on
    the key's ticket channel with `:tag` appended, which hashes to the key's slot (SSUBSCRIBE
    on the key's node is accepted), and nothing goes to the key's own channel."""
    src, dst = two_masters(cluster)
    lo, hi = cluster.slot_ranges(src)[-1]
    slot = hi
    key = key_on(slot, slot, "mig-tagged")
    tag = "c7f3a9e1d2b4c6a8"
    s = src.client()
    assert s.execute_command("RLOCK.ACQUIRE", key, "holder", LEASE) is None
    tagged, plain = src.client().pubsub(), src.client().pubsub()
    tagged.ssubscribe(f"rlock_ticket:{{{key}}}:{tag}")
    plain.ssubscribe(f"rlock_ticket:{{{key}}}")
    for sub in (tagged, plain):
        assert sub.get_message(timeout=5)["type"] == "ssubscribe"

    def next_smessage(sub):
        for _ in range(50):
            m = sub.get_message(timeout=0.1)
            if m is not None and m["type"] == "smessage":
                return m["data"]
        raise AssertionError("no smessage")

    t = src.client()
    def ticket(owner, rid):
        return t.execute_command("RLOCK.ACQUIRE", key, owner, LEASE, "WAIT", 0, "ASYNC",
                                 "ID", rid, "NOTIFY", tag)

    assert ticket("waiter", "t1") == b"QUEUED"
    assert s.execute_command("RLOCK.RELEASE", key, "holder") == 1
    assert next_smessage(tagged) == b"granted:2:6:t1waiter"
    # Queued again behind the new holder, then the slot leaves: the ASK, on the tag.
    assert ticket("second", "t2") == b"QUEUED"
    begin_migration(cluster, slot, src, dst)
    try:
        assert s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", key)
        assert next_smessage(tagged) == f"error:2:6:t2secondASK {slot} 127.0.0.1:{dst.port}".encode()
        assert plain.get_message(timeout=0.2) is None, "nothing on the key's channel"
        assert int(info_field(s, "rlock", "rlock_tickets")) == 0
    finally:
        tagged.close()
        plain.close()
        # The first grant's request-id record stayed (same slot, not migrated).
        for left in s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            s.delete(left)
        finish_migration(cluster, slot, dst)
        dst.client().delete(key)


# ---------------------------------------------------------------------------------------
# Failover (last: it swaps a master and its replica, then swaps them back)

def failover_to(cluster, new_master, old_master, *how):
    new_master.client().execute_command("CLUSTER", "FAILOVER", *how)
    wait_until(lambda: info_field(new_master.client(), "replication", "role") == "master"
               and info_field(old_master.client(), "replication", "role") == "slave", 20,
               interval=0.05, what="failover done")
    wait_link_up(old_master.client(), 20)
    cluster.wait_ok(20)
    for lo, hi in [r for r in cluster.slot_ranges(new_master)]:
        wait_until(lambda: all(cluster.owner_of(lo, via=n) is new_master for n in cluster.nodes),
                   20, interval=0.05, what="every node sees the new master")


def test_replicated_locks_survive_a_cluster_failover_with_the_same_owner(cluster):
    replica = next(s for s in cluster.nodes
                   if info_field(s.client(), "replication", "role") == "slave")
    master = cluster.by_port(info_field(replica.client(), "replication", "master_port"))
    ranges = cluster.slot_ranges(master)
    keys = [key_on(lo, hi, f"fo{i}") for i, (lo, hi) in enumerate(ranges * 3)][:3]
    m = master.client()
    for i, key in enumerate(keys):
        for _ in range(i + 1):
            assert m.execute_command("RLOCK.ACQUIRE", key, f"owner{i}", LEASE) is None
    assert m.execute_command("WAIT", 1, 5000) == 1
    before = {k: lock_state(m, k) for k in keys}
    rr = replica_client(replica)
    assert {k: lock_state(rr, k) for k in keys} == before
    rr.close()

    with waiters() as pool:
        w = start_waiter(pool, master, keys[0], "waiter", timeout_ms=20000, probe=m)
        failover_to(cluster, replica, master)
        # The old master became a replica: its waiter gets an error, not a lock and not
        # silence. (On 7.0 Redis itself answers blocked clients first with -UNBLOCKED, so
        # the module's own READONLY text is not what arrives.)
        w.wait(10)
        assert w.result is None and w.error is not None
        assert str(w.error).startswith(("UNBLOCKED", "READONLY", "this server became")), w.error

    p = replica.client()
    assert {k: lock_state(p, k) for k in keys} == before
    for i, key in enumerate(keys):
        assert owners(p, key) == {f"owner{i}".encode(): i + 1}
    # The promoted node serves RLOCK commands, and a cluster client finds it.
    client = RedisCluster(host="127.0.0.1", port=replica.port, socket_timeout=30)
    try:
        assert client.get_node_from_key(keys[0]).port == replica.port
        pttl = client.execute_command("RLOCK.ACQUIRE", keys[0], "other", LEASE)
        assert isinstance(pttl, int) and 0 < pttl <= LEASE
        assert client.execute_command("RLOCK.RELEASE", keys[0], "owner0") == 1
        assert client.execute_command("RLOCK.ACQUIRE", keys[0], "other", LEASE) is None
        assert client.execute_command("RLOCK.RELEASE", keys[2], "owner2") == 0
    finally:
        client.close()
    # The old master, now a replica, follows: WAIT then compare.
    old = replica_client(master)
    wait_replicated(p, old)
    assert {k: lock_state(old, k) for k in keys} == {k: lock_state(p, k) for k in keys}
    old.close()
    with pytest.raises(redis.ResponseError):
        master.client().execute_command("RLOCK.ACQUIRE", keys[1], "x", LEASE)

    # Swap back, and the locks come back with it. Masters refuse to vote for the same
    # shard twice within 2 x node-timeout, so this one is a TAKEOVER (no vote), safe here
    # because the old master acknowledged everything (WAIT above).
    failover_to(cluster, master, replica, "TAKEOVER")
    assert owners(master.client(), keys[0]) == {b"other": 1}
    for key in keys:
        master.client().execute_command("RLOCK.FORCERELEASE", key)
