"""The countdown latch (RLATCH.*) in a real local Redis Cluster: every command redirects
(MOVED) from a node that does not own the key, and on each master a count-down to zero
releases its awaiters and publishes Redisson's messages with SPUBLISH, heard by shard
subscribers of the owning node (Redisson's sharded mode), not by plain subscribers.
"""

import pytest
import redis
from redis.crc import key_slot

from cluster_helpers import Cluster, key_on
from conftest import wait_until
from hostile_helpers import Raw, rlock_stat
from redisson_sync import latch_channel

LATCH_CALLS = [
    ("RLATCH.TRYSETCOUNT", 1),
    ("RLATCH.COUNTDOWN",),
    ("RLATCH.GETCOUNT",),
    ("RLATCH.AWAIT", "WAIT", 100),
    ("RLATCH.DELETE",),
    ("RLATCH.INFO",),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("latch-cluster"))
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


def test_every_latch_command_is_moved_to_the_node_owning_the_key(cluster):
    keys = master_keys(cluster, "lmoved")
    for here in cluster.masters():
        c = here.client()
        for owner_node, key in keys.items():
            if owner_node is here:
                continue
            for name, *rest in LATCH_CALLS:
                with pytest.raises(redis.ResponseError) as e:
                    c.execute_command(name, key, *rest)
                kind, slot, addr = str(e.value).split()
                assert (kind, int(slot), addr) == (
                    "MOVED", key_slot(key.encode()), f"127.0.0.1:{owner_node.port}"), name
            assert owner_node.client().exists(key) == 0


def test_a_count_down_to_zero_releases_awaiters_and_spublishes_on_every_master(cluster):
    keys = master_keys(cluster, "lzero")
    for node, key in keys.items():
        c = node.client()
        channel = latch_channel(key)
        shard, plain = node.client().pubsub(), node.client().pubsub()
        awaiters = []
        try:
            shard.ssubscribe(channel)
            plain.subscribe(channel)
            assert shard.get_message(timeout=5)["type"] == "ssubscribe"
            assert plain.get_message(timeout=5)["type"] == "subscribe"
            assert c.execute_command("RLATCH.TRYSETCOUNT", key, 2) == 1
            msg = shard.get_message(timeout=5)
            assert (msg["type"], msg["data"]) == ("smessage", b"1")
            for _ in range(5):
                a = Raw(node.port)
                a.send("RLATCH.AWAIT", key, "WAIT", 0)
                awaiters.append(a)
            wait_until(lambda: rlock_stat(c, "waiters") == 5, what="awaiters queued")
            assert c.execute_command("RLATCH.COUNTDOWN", key) == 1
            assert c.execute_command("RLATCH.COUNTDOWN", key) == 0
            assert [a.read(5) for a in awaiters] == [1] * 5
            msg = shard.get_message(timeout=5)
            assert (msg["type"], msg["channel"], msg["data"]) == (
                "smessage", channel.encode(), b"0")
            assert plain.get_message(timeout=0.2) is None, "SPUBLISH, not PUBLISH"
            assert rlock_stat(c, "waiters") == 0
        finally:
            for a in awaiters:
                a.close()
            shard.close()
            plain.close()
