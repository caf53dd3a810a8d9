"""Issue 37, part 2 (design.md 10): rlock through an atomic slot migration (Valkey 9's
`CLUSTER MIGRATESLOTS`), on a real 3-master cluster with the module on every node.

- Every primitive's state arrives on the target exactly, in both `rlock.replication`
  modes: DUMP and PEXPIRETIME of every key of the slot equal the source's just before the
  handover, both for what the snapshot carries and for what the module wrote while the
  slot streamed (`RLOCK.ACQUIREAT`, `RRWLOCK.ACQUIREAT`, `RFENCED.ACQUIREAT`,
  `RLOCK.APPLY`, a timer's handoff; under `effects` the plain commands): the internal
  commands carry their key first in cluster mode, so the server streams them
  (src/server/ffi/replication.rs).
- Waiters queued on the source, blocked and tickets, are answered with `MOVED` to the
  target, never granted on the source; the source keeps no waiter, timer or tracked key.
- A release on the target serves the waiters queued there, and its unlock message reaches
  the target's sharded subscribers.

Skipped on servers without atomic slot migration (Redis, Valkey before 9.0). The cluster
is shared by the file (its start is most of the time); every test uses slots of its own,
moved from the first master to the second.
"""

import threading

import pytest
import redis

from cluster_helpers import Cluster, key_in_slot, snapshot, waiters, start_waiter
from conftest import RedisServer, REDIS_SERVER, wait_until

LEASE = 60000


def valkey_9(workdir):
    probe = RedisServer(workdir, module=False)
    probe.start()
    try:
        return probe.kind() == "valkey" and probe.version() >= (9, 0)
    finally:
        probe.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if not valkey_9(tmp_path_factory.mktemp("probe")):
        pytest.skip(f"no atomic slot migration on {REDIS_SERVER} (Valkey 9.0+ has it)")
    yield from started(tmp_path_factory.mktemp("asm"))


@pytest.fixture(scope="module")
def effects_cluster(tmp_path_factory):
    """The same under `rlock.replication effects` (plain commands, in MULTI/EXEC)."""
    if not valkey_9(tmp_path_factory.mktemp("probe")):
        pytest.skip(f"no atomic slot migration on {REDIS_SERVER} (Valkey 9.0+ has it)")
    yield from started(tmp_path_factory.mktemp("asm-effects"), ["replication", "effects"])


def started(workdir, module_args=()):
    c = Cluster(workdir, module_args=module_args)
    try:
        c.start()
        yield c
    finally:
        crashed = c.stop()
    assert not crashed, "a cluster node crashed:\n" + "\n".join(
        s.log.read_text()[-3000:] for s in crashed)


def job_state(client):
    """The state of the newest slot migration this node knows of."""
    jobs = client.execute_command("CLUSTER", "GETSLOTMIGRATIONS")
    job = dict(zip(jobs[0][::2], jobs[0][1::2]))
    return job[b"state"].decode()


def migrate(cluster, slot, source, target, hold_streaming=False):
    """Starts moving `slot` from `source` to `target`. With `hold_streaming`, the source
    keeps streaming and does not pause for the handover until `finish` (Valkey's
    `DEBUG SLOTMIGRATION PREVENT-PAUSE`): writes made then reach the target through the
    migration's stream, not its snapshot."""
    s = source.client()
    if hold_streaming:
        s.execute_command("DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", 1)
    assert s.execute_command("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot,
                             "NODE", cluster.node_id(target)) == b"OK"
    if hold_streaming:
        wait_until(lambda: job_state(s) in ("replicating", "waiting-to-pause"), 20,
                   what="the migration streams")


def finish(cluster, slot, source, target, held=False):
    s = source.client()
    if held:
        s.execute_command("DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", 0)
    wait_until(lambda: job_state(s) in ("success", "failed", "cancelled"), 30,
               what="the migration ends")
    assert job_state(s) == "success", s.execute_command("CLUSTER", "GETSLOTMIGRATIONS")
    for node in (source, target):
        wait_until(lambda: cluster.owner_of(slot, via=node) is target, 20,
                   what=f"node {node.port} sees the slot on the target")


def keys_of(client, slot):
    return sorted(client.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000))


def state_of(client, slot):
    return {k: snapshot(client, k) for k in keys_of(client, slot)}


def rlock_stat(client, name):
    return client.info("rlock")[f"rlock_{name}"]


def assert_nothing_left(source):
    """No waiter, no key timer, no tracked lock on the source, and soon no subscription."""
    s = source.client()
    wait_until(lambda: rlock_stat(s, "waiters") == 0, 10, what="no waiter on the source")
    assert rlock_stat(s, "key_timers") == 0
    assert rlock_stat(s, "tracked_locks") == 0
    wait_until(lambda: rlock_stat(s, "watching") == 0, 10, what="the source stops watching")
    assert s.info("clients")["blocked_clients"] == 0


@pytest.mark.parametrize("mode", ["commands", "effects"])
def test_every_primitive_arrives_exactly_from_snapshot_and_stream(request, mode):
    cluster = request.getfixturevalue("cluster" if mode == "commands" else "effects_cluster")
    assert cluster.nodes[0].client().config_get("rlock.replication") == {
        "rlock.replication": mode}
    source, target = cluster.nodes[0], cluster.nodes[1]
    slot = 101
    k = {n: key_in_slot(slot, n) for n in
         ["lock", "re", "rw", "fenced", "sem", "psem", "latch", "expiring", "w2"]}
    s = source.client()
    # Before the snapshot.
    s.execute_command("RLOCK.ACQUIRE", k["lock"], "o1", LEASE)
    s.execute_command("RRWLOCK.ACQUIRE", k["rw"], "READ", "r1", LEASE)
    s.execute_command("RSEMAPHORE.TRYSETPERMITS", k["sem"], 5)
    s.execute_command("RPSEMAPHORE.TRYSETPERMITS", k["psem"], 3)
    s.execute_command("RLATCH.TRYSETCOUNT", k["latch"], 3)
    s.execute_command("RFENCED.ACQUIRE", k["fenced"], "f0", LEASE)
    s.execute_command("RLOCK.RELEASE", k["fenced"], "f0")
    s.execute_command("RLOCK.ACQUIRE", k["expiring"], "x", 1500)
    s.execute_command("RLOCK.ACQUIRE", k["w2"], "h", LEASE)
    with waiters() as pool:
        # Queued before the snapshot: handed the lock by the lease-end timer while the
        # slot streams (an RLOCK.APPLY from a timer), and by a release (from a command).
        timer_waiter = start_waiter(pool, source, k["expiring"], "y", LEASE, 20000)
        release_waiter = start_waiter(pool, source, k["w2"], "w", LEASE, 20000)
        migrate(cluster, slot, source, target, hold_streaming=True)
        # While the slot streams: each primitive's writes, as the module replicates them.
        s.execute_command("RLOCK.ACQUIRE", k["re"], "o2", LEASE)        # RLOCK.ACQUIREAT
        s.execute_command("RLOCK.ACQUIRE", k["re"], "o2", LEASE)        # a re-entry
        s.execute_command("RLOCK.RENEW", k["lock"], "o1", LEASE * 2)
        s.execute_command("RRWLOCK.ACQUIRE", k["rw"], "READ", "r2", LEASE)  # RRWLOCK.ACQUIREAT
        s.execute_command("RFENCED.ACQUIRE", k["fenced"], "f1", LEASE)  # RFENCED.ACQUIREAT
        s.execute_command("RSEMAPHORE.ACQUIRE", k["sem"], 2)
        s.execute_command("RPSEMAPHORE.ACQUIRE", k["psem"], LEASE)      # RLOCK.APPLY
        s.execute_command("RLATCH.COUNTDOWN", k["latch"])
        s.execute_command("RLOCK.RELEASE", k["w2"], "h")                # a handoff
        assert release_waiter.wait(10) is None, "handed the lock on the source"
        assert timer_waiter.wait(10) is None, "handed the lock by the lease-end timer"
        before = state_of(s, slot)
        assert len(before) >= len(k) + 2, "the RW lock's read holds have timeout keys"
        finish(cluster, slot, source, target, held=True)
    after = state_of(target.client(), slot)
    assert after == before, "the target holds the source's keys exactly"
    assert keys_of(s, slot) == [], "the source kept none of the slot's keys"
    assert_nothing_left(source)


def test_waiters_on_the_source_are_redirected_never_granted_there(cluster):
    source, target = cluster.nodes[0], cluster.nodes[1]
    slot = 102
    lock, sem, tk = (key_in_slot(slot, p) for p in ("lock", "sem", "ticket"))
    s = source.client()
    s.execute_command("RLOCK.ACQUIRE", lock, "holder", LEASE)
    s.execute_command("RLOCK.ACQUIRE", tk, "holder", LEASE)
    addr = f"127.0.0.1:{target.port}"
    # A ticket, queued on a connection that listens on the key's ticket channel.
    ticket_conn = source.client(single_connection_client=True)
    sub = source.client().pubsub()
    channel = f"rlock_ticket:{{{tk}}}"
    sub.ssubscribe(channel)
    assert ticket_conn.execute_command(
        "RLOCK.ACQUIRE", tk, "t", LEASE, "WAIT", 20000, "ASYNC", "ID", "ticket-1") == b"QUEUED"
    with waiters() as pool:
        blocked = start_waiter(pool, source, lock, "w", LEASE, 20000)
        # A semaphore nobody set up: the waiter's key is not on the source at all, so no
        # delete can tell the module it left; the migration's event does.
        sem_result = {}

        def sem_wait():
            try:
                sem_result["reply"] = source.client().execute_command(
                    "RSEMAPHORE.ACQUIRE", sem, 1, "WAIT", 20000)
            except redis.ResponseError as e:
                sem_result["error"] = str(e)
        t = threading.Thread(target=sem_wait, daemon=True)
        t.start()
        wait_until(lambda: rlock_stat(s, "waiters") == 3, 10, what="three waiters queued")
        migrate(cluster, slot, source, target)
        finish(cluster, slot, source, target)
        blocked.wait(10)
        assert blocked.error is not None and str(blocked.error) == f"MOVED {slot} {addr}"
        t.join(10)
        assert sem_result.get("error") == f"MOVED {slot} {addr}", sem_result
    # The ticket: ended with the redirect, if the message still reached its subscriber
    # (the server drops shard subscriptions of a slot it lost); its retry is redirected.
    notes = []
    wait_until(lambda: (m := sub.get_message(timeout=0.05)) is None or notes.append(m) or False,
               2, what="the subscription drained")
    ends = [m["data"] for m in notes if m["type"] == "smessage"]
    assert all(b"error" in e and f"MOVED {slot}".encode() in e for e in ends), ends
    with pytest.raises(redis.ResponseError, match=f"MOVED {slot} "):
        ticket_conn.execute_command(
            "RLOCK.ACQUIRE", tk, "t", LEASE, "WAIT", 20000, "ASYNC", "ID", "ticket-1")
    sub.close()
    # Nothing was granted on the source: the locks are still their holder's on the target.
    t_client = target.client()
    assert t_client.hgetall(lock) == {b"holder": b"1"}
    assert t_client.hgetall(tk) == {b"holder": b"1"}
    assert not t_client.exists(sem)
    assert_nothing_left(source)


def test_a_release_on_the_target_serves_its_waiters_and_shard_subscribers(cluster):
    source, target = cluster.nodes[0], cluster.nodes[1]
    slot = 103
    lock = key_in_slot(slot, "lock")
    source.client().execute_command("RLOCK.ACQUIRE", lock, "holder", LEASE)
    migrate(cluster, slot, source, target)
    finish(cluster, slot, source, target)
    t = target.client()
    sub = target.client().pubsub()
    sub.ssubscribe(f"redisson_lock__channel:{{{lock}}}")
    with waiters() as pool:
        w = start_waiter(pool, target, lock, "next", LEASE, 20000)
        assert t.execute_command("RLOCK.RELEASE", lock, "holder") == 1
        assert w.wait(10) is None, "the waiter on the target got the lock"
    assert t.hgetall(lock) == {b"next": b"1"}
    assert t.execute_command("RLOCK.RELEASE", lock, "next") == 1  # freed: the message
    got = []
    wait_until(lambda: (m := sub.get_message(timeout=0.05)) is not None
               and m["type"] == "smessage" and not got.append(m), 5,
               what="the unlock message on the target's shard channel")
    sub.close()
