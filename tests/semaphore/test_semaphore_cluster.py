"""RSEMAPHORE/RPSEMAPHORE in a real local Redis Cluster: commands route by their key (the
permit zset `{name}:timeout` shares the name's slot), a WAIT waiter is served on the node
that owns the key, and Redisson's message goes out with SPUBLISH to the shard."""

import pytest
from redis.cluster import RedisCluster

from cluster_helpers import Cluster, key_on
from conftest import wait_until
from sem_helpers import queue


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("semcluster"))
    try:
        c.start()
        yield c
    finally:
        crashed = c.stop()
    assert not crashed


def test_semaphores_route_wait_and_publish_sharded(cluster):
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, socket_timeout=30)
    try:
        for m in cluster.masters():
            lo, hi = cluster.slot_ranges(m)[0]
            key = key_on(lo, hi, f"sem:{m.port}")
            assert rc.execute_command("RSEMAPHORE.TRYSETPERMITS", key, 1) == 1
            assert rc.execute_command("RPSEMAPHORE.TRYSETPERMITS", key + "p", 1) == 1
            pid = rc.execute_command("RPSEMAPHORE.ACQUIRE", key + "p", 60_000)
            assert rc.execute_command("RPSEMAPHORE.RELEASE", key + "p", pid) == 1
            node = m.client()
            shard = node.pubsub()
            channel = "redisson_sc:{%s}" % key
            shard.ssubscribe(channel)
            assert shard.get_message(timeout=5)["type"] == "ssubscribe"
            assert node.execute_command("RSEMAPHORE.ACQUIRE", key, 1) == 1
            call = queue(m, node, key, "RSEMAPHORE.ACQUIRE", key, 1, "WAIT", 10_000)
            try:
                assert node.execute_command("RSEMAPHORE.RELEASE", key, 2) == 2
                assert call.wait() == 1
            finally:
                call.close()
            msg = wait_until(lambda: shard.get_message(timeout=0.1), what="sharded message")
            assert (msg["type"], msg["data"]) == ("smessage", b"1"), msg
            shard.close()
    finally:
        rc.close()
