"""The read-write lock in a real local Redis Cluster (three masters with the module): each
RRWLOCK command is routed by its key at position 1, the per-hold timeout keys live in the
lock's slot (Redisson's `{name}` hash tag), waiting and handoff work on every master, and
the unlock messages go out with SPUBLISH on the owning shard.
"""

import pytest
from redis.cluster import RedisCluster
from redis.crc import key_slot

from cluster_helpers import Cluster, key_on
from redisson_rw import rw_channel, timeout_key
from test_rwlock import RwWaiter

LEASE = 60000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("rwcluster"))
    try:
        c.start()
        yield c
    finally:
        crashed = c.stop()
    assert not crashed, "a cluster node crashed:\n" + "\n".join(
        s.log.read_text()[-3000:] for s in crashed)


def master_keys(cluster, prefix):
    out = {}
    for m in cluster.masters():
        lo, hi = cluster.slot_ranges(m)[0]
        out[m] = key_on(lo, hi, f"{prefix}:{m.port}")
    assert len(out) == 3
    return out


def test_commands_route_and_timeout_keys_share_the_slot(cluster):
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, socket_timeout=30)
    try:
        for node, key in master_keys(cluster, "rw").items():
            assert rc.get_node_from_key(key).port == node.port
            assert rc.execute_command("RRWLOCK.ACQUIRE", key, "READ", "a", LEASE) is None
            assert rc.execute_command("RRWLOCK.ACQUIRE", key, "READ", "b", LEASE) is None
            pttl = rc.execute_command("RRWLOCK.ACQUIRE", key, "WRITE", "w", LEASE)
            assert isinstance(pttl, int) and 0 < pttl <= LEASE
            c = node.client()
            slot = key_slot(key.encode())
            assert key_slot(timeout_key(key, "a", 1).encode()) == slot
            assert c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 3
            assert rc.execute_command("RRWLOCK.RENEW", key, "READ", "a", LEASE) == 1
            assert rc.execute_command("RRWLOCK.RELEASE", key, "READ", "a") == 1
            assert rc.execute_command("RRWLOCK.RELEASE", key, "READ", "b") == 1
            assert rc.execute_command("RRWLOCK.INFO", key) is None
            assert c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    finally:
        rc.close()


def test_waiters_are_served_and_messages_are_sharded_on_every_master(cluster):
    for node, key in master_keys(cluster, "rwwait").items():
        c = node.client()
        shard = c.pubsub()
        shard.ssubscribe(rw_channel(key))
        assert shard.get_message(timeout=5)["type"] == "ssubscribe"
        assert c.execute_command("RRWLOCK.ACQUIRE", key, "READ", "r", LEASE) is None
        w = RwWaiter(node, key, "WRITE", "w", lease=LEASE, timeout=10000)
        w.start()
        try:
            probe = node.client()
            for _ in range(500):
                info = probe.execute_command("RRWLOCK.INFO", key)
                if info and dict(zip(info[::2], info[1::2]))[b"waiters"] == 1:
                    break
                shard.get_message(timeout=0.01)
            assert c.execute_command("RRWLOCK.RELEASE", key, "READ", "r") == 1
            w.granted()
            assert c.hgetall(key) == {b"mode": b"write", b"w:write": b"1"}
            # A handoff publishes nothing; the writer's release does, on the shard.
            assert c.execute_command("RRWLOCK.RELEASE", key, "WRITE", "w") == 1
            msg = shard.get_message(timeout=5)
            assert msg is not None and (msg["type"], msg["data"]) == ("smessage", b"1")
        finally:
            w.join(10)
            shard.close()
