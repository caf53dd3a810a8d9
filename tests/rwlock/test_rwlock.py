"""The read-write lock (design.md 4.1): RRWLOCK.ACQUIRE/RELEASE/RENEW/FORCERELEASE/INFO on real
servers, waiting in the server (FIFO, readers together, no writer starvation), each read
hold's own lease, replication and AOF as plain effects, keyspace notifications, bad
input, request ids, and the engine's disconnect and DEL paths.

Blocked acquires run on threads with connections of their own (`RwWaiter`); the `rw_spawn`
fixture kills and joins them at teardown. A waiter counts as queued once RRWLOCK.INFO
shows it, so the order of the queue is the order the test chose.
"""

import re
import threading
import time

import pytest
import redis

import errors
from cluster_helpers import snapshot, wait_replicated
from conftest import EFFECTS, wait_until
from redisson_rw import rw_channel, timeout_key

# The read-write lock's texts as redis-py shows them (it drops the "ERR " code).
RW_SIDE = errors.text(errors.RW_SIDE)
RW_OWNER_SUFFIX = errors.text(errors.RW_OWNER_SUFFIX)
NOT_A_RWLOCK = errors.text(errors.NOT_A_RWLOCK)
RW_READ_HELD = errors.text(errors.RW_READ_HELD)
LONG = 30_000


def acq(r, key, side, owner, lease=LONG, *extra):
    return r.execute_command("RRWLOCK.ACQUIRE", key, side, owner, lease, *extra)


def rel(r, key, side, owner, *extra):
    return r.execute_command("RRWLOCK.RELEASE", key, side, owner, *extra)


def renew(r, key, side, owner, lease=LONG):
    return r.execute_command("RRWLOCK.RENEW", key, side, owner, lease)


def force(r, key, *side):
    return r.execute_command("RRWLOCK.FORCERELEASE", key, *side)


def info(r, key):
    """RRWLOCK.INFO as a dict (RESP2 flat pairs, nested maps too), or None when free."""
    raw = r.execute_command("RRWLOCK.INFO", key)
    if raw is None:
        return None
    d = dict(zip(raw[::2], raw[1::2]))
    d[b"readers"] = dict(zip(d[b"readers"][::2], d[b"readers"][1::2]))
    if d[b"writer"] is not None:
        d[b"writer"] = dict(zip(d[b"writer"][::2], d[b"writer"][1::2]))
    return d


def queued(r, key):
    i = info(r, key)
    return 0 if i is None else i[b"waiters"]


def stats(r):
    return {k.removeprefix("rlock_"): v for k, v in r.info("rlock").items()}


class RwWaiter(threading.Thread):
    """One client blocked in RRWLOCK.ACQUIRE ... WAIT on a connection of its own."""

    def __init__(self, server, key, side, owner, lease=LONG, timeout=0, extra=()):
        super().__init__(daemon=True, name=f"rw-{side}-{owner}")
        self.server, self.key, self.side, self.owner = server, key, side, owner
        self.lease, self.timeout, self.extra = lease, timeout, list(extra)
        self.conn = server.client(single_connection_client=True)
        self.id = self.conn.client_id()
        self.result = self.error = self.done_at = None

    def run(self):
        try:
            self.result = self.conn.execute_command(
                "RRWLOCK.ACQUIRE", self.key, self.side, self.owner, self.lease,
                "WAIT", self.timeout, *self.extra)
        except Exception as e:  # noqa: BLE001 - the test asserts on it
            self.error = e
        self.done_at = time.monotonic()

    def granted(self, timeout=10):
        self.join(timeout)
        assert not self.is_alive(), f"{self.owner} still blocked after {timeout}s"
        assert self.error is None, f"{self.owner} got an error: {self.error!r}"
        assert self.result is None, f"{self.owner} got {self.result!r}, not the lock"
        return self


@pytest.fixture
def rw_spawn():
    started = []

    def start(server, key, side, owner, queue_as=None, **kw):
        w = RwWaiter(server, key, side, owner, **kw)
        started.append(w)
        w.start()
        if queue_as is not None:
            probe = server.client()
            wait_until(lambda: queued(probe, key) == queue_as or not w.is_alive(),
                       what=f"{owner} queued as waiter {queue_as}")
            assert w.is_alive(), f"{owner} did not block: {w.result!r} {w.error!r}"
        return w

    yield start
    for w in started:
        if w.is_alive() and w.server.alive():
            try:
                admin = redis.Redis(port=w.server.port, socket_timeout=5)
                admin.client_kill_filter(_id=w.id)
                admin.close()
            except redis.RedisError:
                pass
        w.join(10)


# ---------------------------------------------------------------------------------------
# Each command and its replies


def test_readers_share_and_the_layout_is_redissons(r):
    assert acq(r, "rw", "READ", "a", 10_000) is None
    assert acq(r, "rw", "read", "b", 20_000) is None
    assert acq(r, "rw", "READ", "a", 5_000) is None  # re-entry: a second timeout key
    assert r.hgetall("rw") == {b"mode": b"read", b"a": b"2", b"b": b"1"}
    for owner, n, lease in (("a", 1, 10_000), ("a", 2, 5_000), ("b", 1, 20_000)):
        k = timeout_key("rw", owner, n)
        assert r.get(k) == b"1"
        assert lease - 1000 < r.pttl(k) <= lease
    assert 19_000 < r.pttl("rw") <= 20_000, "the hash lives as long as the longest lease"
    i = info(r, "rw")
    assert i[b"mode"] == b"read" and i[b"writer"] is None and i[b"waiters"] == 0
    assert i[b"readers"][b"a"][0] == 2 and i[b"readers"][b"b"][0] == 1
    assert 19_000 < i[b"pttl"] <= 20_000


def test_each_timeout_key_holds_a_value_of_its_own(r):
    """The module keeps server strings of its constant words (`mode`, `1`) for hash
    fields, which the server copies; a key's value is the string object itself, so a
    timeout key's `1` is made for it. Shared, the keys would share one LRU/LFU clock, and
    Valkey re-makes a stored value to embed its key."""
    for owner in ("a", "b", "c"):
        assert acq(r, "rw", "READ", owner) is None
    assert acq(r, "rw", "READ", "a") is None  # re-entry
    assert renew(r, "rw", "READ", "a") == 1
    keys = [timeout_key("rw", o, n) for o, n in (("a", 1), ("a", 2), ("b", 1), ("c", 1))]
    for k in keys:
        assert r.get(k) == b"1"
        assert r.object("refcount", k) == 1, k
    r.append(keys[0], "x")
    assert [r.get(k) for k in keys] == [b"1x", b"1", b"1", b"1"]


def test_a_writer_excludes_everyone_and_replies_the_pttl(r):
    assert acq(r, "rw", "WRITE", "w", 10_000) is None
    assert r.hgetall("rw") == {b"mode": b"write", b"w:write": b"1"}
    pttl = acq(r, "rw", "READ", "a")
    assert 9_000 < pttl <= 10_000
    assert 9_000 < acq(r, "rw", "WRITE", "x") <= 10_000
    assert acq(r, "rw", "WRITE", "w", 10_000) is None  # re-entry
    assert r.hget("rw", "w:write") == b"2"
    i = info(r, "rw")
    assert i[b"mode"] == b"write" and i[b"writer"] == {b"w": 2} and i[b"readers"] == {}


def test_release_replies_about_the_callers_holds(r):
    acq(r, "rw", "READ", "a")
    acq(r, "rw", "READ", "a")
    acq(r, "rw", "READ", "b")
    assert rel(r, "rw", "READ", "a") == 0, "one hold less, still held"
    assert not r.exists(timeout_key("rw", "a", 2)), "the newest hold's key goes"
    assert rel(r, "rw", "READ", "a") == 1, "the owner's last hold"
    assert rel(r, "rw", "READ", "a") is None, "not held"
    assert rel(r, "rw", "WRITE", "b") is None
    assert r.exists("rw")
    assert rel(r, "rw", "READ", "b") == 1
    assert not r.exists("rw") and not r.keys("{rw}*")


def test_release_with_a_lease_rearms_the_remaining_holds(r):
    acq(r, "rw", "READ", "a", 1_000)
    acq(r, "rw", "READ", "a", 1_000)
    assert rel(r, "rw", "READ", "a", 50_000) == 0
    assert 49_000 < r.pttl(timeout_key("rw", "a", 1)) <= 50_000
    assert 49_000 < r.pttl("rw") <= 50_000


def test_renew_rearms_every_hold_on_its_side(r):
    acq(r, "rw", "READ", "a", 1_000)
    acq(r, "rw", "READ", "a", 2_000)
    assert renew(r, "rw", "READ", "a", 60_000) == 1
    for n in (1, 2):
        assert 59_000 < r.pttl(timeout_key("rw", "a", n)) <= 60_000
    assert 59_000 < r.pttl("rw") <= 60_000
    assert renew(r, "rw", "READ", "b") == 0
    assert renew(r, "rw", "WRITE", "a") == 0
    force(r, "rw")
    acq(r, "rw", "WRITE", "w", 1_000)
    assert renew(r, "rw", "WRITE", "w", 60_000) == 1
    assert 59_000 < r.pttl("rw") <= 60_000


def test_forcerelease_any_mode_or_only_its_own(r):
    assert force(r, "rw") == 0
    acq(r, "rw", "READ", "a")
    assert force(r, "rw", "WRITE") == 0, "a write force-release leaves a read lock alone"
    assert r.exists("rw")
    assert force(r, "rw", "READ") == 1
    assert not r.exists("rw") and not r.keys("{rw}*"), "timeout keys go too"
    acq(r, "rw", "WRITE", "w")
    assert force(r, "rw", "READ") == 0
    assert force(r, "rw") == 1
    assert not r.exists("rw")


def test_read_to_write_upgrade_is_refused_at_once(r):
    acq(r, "rw", "READ", "a")
    before = r.dump("rw")
    t0 = time.monotonic()
    with pytest.raises(redis.ResponseError, match=re.escape(RW_READ_HELD)):
        acq(r, "rw", "WRITE", "a", LONG, "WAIT", 0)
    assert time.monotonic() - t0 < 2, "answered at once, not after a wait"
    assert r.dump("rw") == before


def test_the_writer_may_read_and_leaving_keeps_its_reads(server, r, rw_spawn):
    acq(r, "rw", "WRITE", "w")
    assert acq(r, "rw", "READ", "w", 40_000) is None
    assert r.hgetall("rw") == {b"mode": b"write", b"w:write": b"1", b"w": b"1"}
    reader = rw_spawn(server, "rw", "READ", "b", queue_as=1)
    p = r.pubsub()
    p.subscribe(rw_channel("rw"))
    wait_until(lambda: p.get_message(timeout=0.05), what="subscribed")
    assert rel(r, "rw", "WRITE", "w") == 1
    reader.granted()
    assert r.hgetall("rw") == {b"mode": b"read", b"w": b"1", b"b": b"1"}
    msg = wait_until(lambda: p.get_message(timeout=0.05), what="the write unlock message")
    assert msg["data"] == b"1"
    p.close()


# ---------------------------------------------------------------------------------------
# Waiting: FIFO, readers together, no writer starvation


def test_readers_at_the_head_go_in_together_and_a_writer_holds_back_the_rest(server, r, rw_spawn):
    acq(r, "rw", "WRITE", "w0")
    r1 = rw_spawn(server, "rw", "READ", "r1", queue_as=1)
    r2 = rw_spawn(server, "rw", "READ", "r2", queue_as=2)
    w1 = rw_spawn(server, "rw", "WRITE", "w1", queue_as=3)
    r3 = rw_spawn(server, "rw", "READ", "r3", queue_as=4)
    assert rel(r, "rw", "WRITE", "w0") == 1
    r1.granted()
    r2.granted()
    assert info(r, "rw")[b"waiters"] == 2
    assert set(info(r, "rw")[b"readers"]) == {b"r1", b"r2"}
    assert w1.is_alive() and r3.is_alive(), "w1 waits for the readers, r3 behind w1"
    assert rel(r, "rw", "READ", "r1") == 1
    assert w1.is_alive()
    assert rel(r, "rw", "READ", "r2") == 1
    w1.granted()
    assert r3.is_alive()
    assert rel(r, "rw", "WRITE", "w1") == 1
    r3.granted()
    assert r.hgetall("rw") == {b"mode": b"read", b"r3": b"1"}
    s = stats(r)
    assert s["rw_read_acquisitions"] >= 3 and s["rw_write_acquisitions"] >= 2


def test_no_writer_starvation_a_later_reader_queues_behind_a_waiting_writer(server, r, rw_spawn):
    acq(r, "rw", "READ", "a")
    w = rw_spawn(server, "rw", "WRITE", "w", queue_as=1)
    # Redisson would let this reader in (the lock is read-held): here it waits its turn.
    pttl = acq(r, "rw", "READ", "late")
    assert isinstance(pttl, int) and pttl > 0
    late = rw_spawn(server, "rw", "READ", "late", queue_as=2)
    assert acq(r, "rw", "READ", "a") is None, "a re-entry is always served"
    rel(r, "rw", "READ", "a")
    rel(r, "rw", "READ", "a")
    w.granted()
    assert late.is_alive()
    rel(r, "rw", "WRITE", "w")
    late.granted()


def test_a_wait_times_out_with_the_pttl(server, r, rw_spawn):
    acq(r, "rw", "WRITE", "w", 20_000)
    t = rw_spawn(server, "rw", "READ", "a", timeout=200)
    t.join(10)
    assert 15_000 < t.result <= 20_000
    assert queued(r, "rw") == 0


def test_a_dead_readers_hold_ends_at_its_own_lease_while_another_renews(server, r, rw_spawn):
    acq(r, "rw", "READ", "dead", 300)
    acq(r, "rw", "READ", "live", 2_000)
    w = rw_spawn(server, "rw", "WRITE", "w", queue_as=1)
    # "live" renews; with Redisson the hash's TTL would keep "dead" in it too.
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        assert renew(r, "rw", "READ", "live", 2_000) == 1
        time.sleep(0.05)
    assert w.is_alive(), "the live reader still holds the lock"
    assert r.hgetall("rw") == {b"mode": b"read", b"live": b"1"}, "dead's hold ended"
    assert stats(r)["rw_read_leases_ended"] >= 1
    released_at = time.monotonic()
    assert rel(r, "rw", "READ", "live") == 1
    w.granted(5)
    assert w.done_at - released_at < 1.0, "the writer got the lock at the release"


def test_a_waiter_gets_the_lock_when_the_last_readers_lease_runs_out(server, r, rw_spawn):
    # A lease long enough that the writer has queued before it ends, however loaded the
    # machine: the point is the handoff at the lease's end, not how soon it comes.
    acq(r, "rw", "READ", "dead", 2000)
    w = rw_spawn(server, "rw", "WRITE", "w", queue_as=1)
    w.granted(10)
    assert r.hgetall("rw") == {b"mode": b"write", b"w:write": b"1"}
    assert not r.exists(timeout_key("rw", "dead", 1))


def test_a_waiter_whose_client_disconnects_leaves_nothing_behind(server, r, rw_spawn):
    acq(r, "rw", "WRITE", "w")
    gone = rw_spawn(server, "rw", "READ", "gone", queue_as=1)
    r.client_kill_filter(_id=gone.id)
    gone.join(10)
    wait_until(lambda: stats(r)["waiters"] == 0, what="the waiter left")
    assert queued(r, "rw") == 0
    assert rel(r, "rw", "WRITE", "w") == 1
    assert not r.exists("rw") and not r.keys("*gone*")


def test_del_of_a_held_rw_lock_serves_its_waiters(server, r, rw_spawn):
    acq(r, "rw", "READ", "a")
    w = rw_spawn(server, "rw", "WRITE", "w", queue_as=1)
    r1 = rw_spawn(server, "rw", "READ", "r1", queue_as=2)
    r.delete("rw")
    w.granted()
    assert r1.is_alive()
    assert r.hgetall("rw") == {b"mode": b"write", b"w:write": b"1"}
    rel(r, "rw", "WRITE", "w")
    r1.granted()


# ---------------------------------------------------------------------------------------
# Replication, AOF, notifications


@pytest.fixture
def pair(make_server):
    master = make_server("master", args=["--repl-diskless-sync-delay", "0"],
                         module_args=EFFECTS)
    replica = make_server("replica", module=False,
                          args=["--replicaof", "127.0.0.1", str(master.port)])
    m, rc = master.client(), replica.client()
    wait_until(lambda: rc.info("replication")["master_link_status"] == "up", 10,
               what="replica link up")
    return master, replica, m, rc


def rw_keys(c):
    return sorted(c.keys("rw") + c.keys("{rw}*"))


def test_every_command_replicates_as_effects(pair):
    master, replica, m, rc = pair
    steps = [
        lambda: acq(m, "rw", "READ", "a", 40_000),
        lambda: acq(m, "rw", "READ", "a", 30_000),
        lambda: acq(m, "rw", "READ", "b\x00x", 20_000),
        lambda: renew(m, "rw", "READ", "a", 50_000),
        lambda: rel(m, "rw", "READ", "a", 45_000),
        lambda: rel(m, "rw", "READ", "a"),
        lambda: rel(m, "rw", "READ", "b\x00x"),
        lambda: acq(m, "rw", "WRITE", "w", 40_000),
        lambda: acq(m, "rw", "READ", "w", 60_000),
        lambda: rel(m, "rw", "WRITE", "w"),
        lambda: force(m, "rw"),
        lambda: acq(m, "rw", "WRITE", "w", 40_000, "ID", "req1"),
    ]
    for step in steps:
        step()
        wait_replicated(m, rc)
        keys = rw_keys(m)
        assert rw_keys(rc) == keys
        for k in keys:
            assert snapshot(rc, k) == snapshot(m, k), f"replica differs at {k!r}"


def test_a_handoff_replicates(pair, rw_spawn):
    master, replica, m, rc = pair
    acq(m, "rw", "READ", "a", 40_000)
    w = rw_spawn(master, "rw", "WRITE", "w", queue_as=1)
    rel(m, "rw", "READ", "a")
    w.granted()
    wait_replicated(m, rc)
    assert snapshot(rc, "rw") == snapshot(m, "rw")
    assert rc.hgetall("rw") == {b"mode": b"write", b"w:write": b"1"}


def test_aof_restart_keeps_the_holds(make_server):
    s = make_server(args=["--appendonly", "yes", "--appendfsync", "always"])
    r = s.client()
    acq(r, "rw", "READ", "a", 60_000)
    acq(r, "rw", "READ", "b", 60_000)
    rel(r, "rw", "READ", "b")
    before = {k: snapshot(r, k) for k in rw_keys(r)}
    s.restart()
    r = s.client()
    assert {k: snapshot(r, k) for k in rw_keys(r)} == before
    assert set(info(r, "rw")[b"readers"]) == {b"a"}
    assert rel(r, "rw", "READ", "a") == 1


def test_keyspace_notifications(server, r):
    r.config_set("notify-keyspace-events", "KEA")
    p = r.pubsub()
    p.psubscribe("__keyevent@0__:*")
    wait_until(lambda: p.get_message(timeout=0.05), what="psubscribed")
    acq(r, "rw", "READ", "a", 10_000)
    rel(r, "rw", "READ", "a")
    got = []
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and len(got) < 8:
        m = p.get_message(timeout=0.1)
        if m and m["type"] == "pmessage":
            got.append((m["channel"].decode().split(":", 1)[1], m["data"].decode()))
    tk = timeout_key("rw", "a", 1)
    for event in [("hset", "rw"), ("set", tk), ("expire", tk), ("expire", "rw"),
                  ("del", tk), ("del", "rw")]:
        assert event in got, f"{event} missing from {got}"
    p.close()


# ---------------------------------------------------------------------------------------
# Bad input: named errors, nothing changed


@pytest.mark.parametrize("args", [
    ("RRWLOCK.ACQUIRE", "rw", "READ", "a"),
    ("RRWLOCK.RELEASE", "rw", "READ"),
    ("RRWLOCK.RENEW", "rw", "READ", "a"),
    ("RRWLOCK.FORCERELEASE",),
    ("RRWLOCK.FORCERELEASE", "rw", "READ", "x"),
    ("RRWLOCK.INFO",),
])
def test_wrong_arity(r, args):
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command(*args)


@pytest.mark.parametrize("args,error", [
    (("RRWLOCK.ACQUIRE", "rw", "SIDEWAYS", "a", 100), RW_SIDE),
    (("RRWLOCK.ACQUIRE", "rw", "READ", "a", 0), errors.text(errors.LEASE)),
    (("RRWLOCK.ACQUIRE", "rw", "READ", "a", "1x"), errors.text(errors.LEASE)),
    (("RRWLOCK.ACQUIRE", "rw", "READ", "a", 100, "WAIT", -1), errors.text(errors.TIMEOUT)),
    (("RRWLOCK.ACQUIRE", "rw", "READ", "a", 100, "NOPE", 1), errors.text(errors.SYNTAX)),
    (("RRWLOCK.ACQUIRE", "rw", "READ", "", 100), errors.text(errors.EMPTY_OWNER)),
    (("RRWLOCK.ACQUIRE", "rw", "READ", "a", 100, "ID", ""), errors.text(errors.EMPTY_ID)),
    (("RRWLOCK.ACQUIRE", "rw", "WRITE", "a:write", 100), RW_OWNER_SUFFIX),
    (("RRWLOCK.RELEASE", "rw", "READ", "a", "-5"), errors.text(errors.LEASE)),
    (("RRWLOCK.RENEW", "rw", "WRITE", "a", "x"), errors.text(errors.LEASE)),
    (("RRWLOCK.FORCERELEASE", "rw", "BOTH"), RW_SIDE),
])
def test_bad_arguments_change_nothing(r, args, error):
    acq(r, "rw", "READ", "held")
    before = snapshot(r, "rw")
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command(*args)
    assert str(e.value) == error
    assert snapshot(r, "rw") == before


@pytest.mark.parametrize("cmd", [
    ("RRWLOCK.ACQUIRE", "k", "READ", "a", 100),
    ("RRWLOCK.RELEASE", "k", "WRITE", "a"),
    ("RRWLOCK.RENEW", "k", "READ", "a", 100),
    ("RRWLOCK.FORCERELEASE", "k"),
    ("RRWLOCK.INFO", "k"),
])
def test_wrong_type_and_a_plain_lock_are_refused(r, cmd):
    r.set("k", "v")
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command(*cmd)
    assert str(e.value) == errors.WRONGTYPE
    assert r.get("k") == b"v"
    r.delete("k")
    r.execute_command("RLOCK.ACQUIRE", "k", "a", 10_000)
    before = snapshot(r, "k")
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command(*cmd)
    assert str(e.value) == NOT_A_RWLOCK
    assert snapshot(r, "k") == before


def test_an_rw_lock_is_no_plain_lock(r):
    acq(r, "rw", "READ", "a")
    before = snapshot(r, "rw")
    for cmd in (("RLOCK.ACQUIRE", "rw", "a", 100), ("RLOCK.RELEASE", "rw", "a"),
                ("RLOCK.FORCERELEASE", "rw")):
        with pytest.raises(redis.ResponseError) as e:
            r.execute_command(*cmd)
        assert str(e.value) == errors.text(errors.NOT_A_LOCK)
    assert snapshot(r, "rw") == before


def test_a_spoiled_hash_is_refused(r):
    r.hset("rw", mapping={"mode": "read", "a": "x"})
    with pytest.raises(redis.ResponseError) as e:
        acq(r, "rw", "READ", "b")
    assert str(e.value) == NOT_A_RWLOCK
    assert r.hgetall("rw") == {b"mode": b"read", b"a": b"x"}


# ---------------------------------------------------------------------------------------
# Request ids


def test_a_retried_acquire_and_release_get_the_first_reply(r):
    assert acq(r, "rw", "READ", "a", LONG, "ID", "q1") is None
    assert acq(r, "rw", "READ", "a", LONG, "ID", "q1") is None
    assert r.hget("rw", "a") == b"1", "the retry took no second hold"
    acq(r, "rw", "READ", "a")
    assert rel(r, "rw", "READ", "a", "ID", "q2") == 0
    assert rel(r, "rw", "READ", "a", "ID", "q2") == 0
    assert r.hget("rw", "a") == b"1", "the retry released nothing more"
    assert rel(r, "rw", "READ", "a", "ID", "q3") == 1
    assert rel(r, "rw", "READ", "a", "ID", "q3") == 1


def test_a_handoff_remembers_its_reply_under_the_request_id(server, r, rw_spawn):
    acq(r, "rw", "WRITE", "w")
    waiter = rw_spawn(server, "rw", "WRITE", "x", queue_as=1, extra=("ID", "h1"))
    rel(r, "rw", "WRITE", "w")
    waiter.granted()
    # The reply was lost, say: the retry is answered "acquired" and takes no second hold.
    assert acq(r, "rw", "WRITE", "x", LONG, "ID", "h1") is None
    assert r.hget("rw", "x:write") == b"1"


def _swallow(call):
    try:
        call()
    except redis.ConnectionError:
        pass


@pytest.mark.parametrize("side", ["READ", "WRITE"])
def test_a_handoff_taken_back_forgets_its_request_id(server, r, side):
    """A waiter killed between the handoff and its reply never learns it got the lock: it
    is taken back (released as its owner would) and its request id forgotten."""
    acq(r, "rw", "WRITE", "holder")
    w = server.client()
    w_id = w.client_id()
    t = threading.Thread(target=lambda: _swallow(
        lambda: w.execute_command("RRWLOCK.ACQUIRE", "rw", side, "a", LONG, "WAIT", 10_000,
                                  "ID", "r7")))
    t.start()
    wait_until(lambda: queued(r, "rw") == 1, what="waiter queued")
    with r.pipeline(transaction=False) as p:
        p.execute_command("RRWLOCK.RELEASE", "rw", "WRITE", "holder")
        p.execute_command("CLIENT", "KILL", "ID", w_id)
        p.execute()
    t.join(10)
    wait_until(lambda: stats(r)["revoked_handoffs"] == 1, what="handoff taken back")
    assert not r.exists("rw") and not r.keys("{rw}*")
    assert not r.exists("rlock_request:{rw}:r7")
    assert acq(r, "rw", side, "a", LONG, "ID", "r7") is None
    assert r.hget("rw", "a" if side == "READ" else "a:write") == b"1", "the retry acquired"


def test_a_writer_taken_back_passes_the_lock_to_the_reader_behind(server, r, rw_spawn):
    acq(r, "rw", "WRITE", "holder")
    w = server.client()
    w_id = w.client_id()
    t = threading.Thread(target=lambda: _swallow(
        lambda: w.execute_command("RRWLOCK.ACQUIRE", "rw", "WRITE", "gone", LONG, "WAIT", 0)))
    t.start()
    wait_until(lambda: queued(r, "rw") == 1, what="writer queued")
    reader = rw_spawn(server, "rw", "READ", "next", queue_as=2)
    with r.pipeline(transaction=False) as p:
        p.execute_command("RRWLOCK.RELEASE", "rw", "WRITE", "holder")
        p.execute_command("CLIENT", "KILL", "ID", w_id)
        p.execute()
    t.join(10)
    reader.granted()
    assert r.hgetall("rw") == {b"mode": b"read", b"next": b"1"}
