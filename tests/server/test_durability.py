"""Issue 6, server side: replication, AOF and persistence of locks (design.md 1.4).

Replicas here run WITHOUT the module unless said otherwise: everything the module writes
must reach them as plain effects (HSET, HINCRBY, HDEL, DEL, PEXPIREAT absolute, PUBLISH),
so master and replica hold byte-identical keys (DUMP) with the same absolute expiry
(PEXPIRETIME) after WAIT.
"""

import pytest
import redis

from cluster_helpers import (aof_commands, aof_files, info_field, lock_state, owners,
                             snapshot, start_waiter, wait_link_up, wait_online, wait_replicated, waiters)
from conftest import EFFECTS, wait_until

LEASE = 60000
# No 5 s wait for more replicas before a full sync; do not wait for replicas at shutdown.
MASTER_ARGS = ["--hz", "100", "--repl-diskless-sync-delay", "0", "--shutdown-on-sigterm", "now"]


@pytest.fixture
def pair(make_server):
    """A module-loaded master and a module-less replica, synced."""
    master = make_server("master", args=MASTER_ARGS, module_args=EFFECTS)
    replica = make_server("replica", module=False,
                          args=["--replicaof", "127.0.0.1", str(master.port)])
    m, rc = master.client(), replica.client()
    wait_link_up(rc)
    wait_online(m)
    wait_replicated(m, rc)
    return master, replica, m, rc


def assert_same(m, rc, *keys):
    wait_replicated(m, rc)
    for k in keys:
        assert snapshot(rc, k) == snapshot(m, k), f"replica differs from master at {k!r}"


# ---------------------------------------------------------------------------------------
# Every command, step by step

# Each row: a command sent to the master, its expected reply, and the key's hash after it
# (None: the key is gone). The replica must match the master after every row.
COMMAND_STEPS = [
    # fresh acquire creates {a: 1} with an expiry
    (("RLOCK.ACQUIRE", "k", "a", LEASE), None, {b"a": b"1"}),
    # re-entry counts up and re-arms the expiry
    (("RLOCK.ACQUIRE", "k", "a", LEASE + 1000), None, {b"a": b"2"}),
    # contended acquire changes nothing
    (("RLOCK.ACQUIRE", "k", "b", LEASE), int, {b"a": b"2"}),
    # renew re-arms the expiry only
    (("RLOCK.RENEW", "k", "a", LEASE + 2000), 1, {b"a": b"2"}),
    # renew by a non-holder changes nothing
    (("RLOCK.RENEW", "k", "b", LEASE), 0, {b"a": b"2"}),
    # partial release with a lease re-arms the expiry
    (("RLOCK.ACQUIRE", "k", "a", LEASE), None, {b"a": b"3"}),
    (("RLOCK.RELEASE", "k", "a", LEASE + 3000), 0, {b"a": b"2"}),
    # partial release without a lease keeps the expiry
    (("RLOCK.RELEASE", "k", "a"), 0, {b"a": b"1"}),
    # release by a non-holder changes nothing
    (("RLOCK.RELEASE", "k", "b"), None, {b"a": b"1"}),
    # full release deletes the key
    (("RLOCK.RELEASE", "k", "a"), 1, None),
    # acquire again, then force-release
    (("RLOCK.ACQUIRE", "k", "c", LEASE), None, {b"c": b"1"}),
    (("RLOCK.ACQUIRE", "k", "c", LEASE), None, {b"c": b"2"}),
    (("RLOCK.FORCERELEASE", "k"), 1, None),
    (("RLOCK.FORCERELEASE", "k"), 0, None),
    # a binary owner id survives replication byte for byte
    (("RLOCK.ACQUIRE", "k", b"\x00\xff uuid:1", LEASE), None, {b"\x00\xff uuid:1": b"1"}),
]


def test_every_command_leaves_a_module_less_replica_byte_identical(pair):
    master, replica, m, rc = pair
    for cmd, want, after in COMMAND_STEPS:
        got = m.execute_command(*cmd)
        if want is int:
            assert isinstance(got, int) and got > 0, (cmd, got)
        else:
            assert got == want, (cmd, got)
        assert_same(m, rc, "k")
        assert (rc.hgetall("k") or None) == after, cmd
        if after is not None:
            assert rc.execute_command("PEXPIRETIME", "k") > 0


def test_a_lock_on_a_key_with_braces_and_in_another_db_replicates(pair):
    master, replica, m, rc = pair
    m1 = master.client(db=3)
    assert m1.execute_command("RLOCK.ACQUIRE", "a{b}c", "o", LEASE) is None
    assert m1.execute_command("RLOCK.ACQUIRE", "a{b}c", "o", LEASE) is None
    wait_replicated(m1, rc)
    r1 = replica.client(db=3)
    assert snapshot(r1, "a{b}c") == snapshot(m1, "a{b}c")
    assert rc.exists("a{b}c") == 0, "the lock leaked into db 0 on the replica"


# ---------------------------------------------------------------------------------------
# Every handoff path

def free_by_release(m, key, holder):
    assert m.execute_command("RLOCK.RELEASE", key, holder) == 1


def free_by_forcerelease(m, key, holder):
    assert m.execute_command("RLOCK.FORCERELEASE", key) == 1


def free_by_del(m, key, holder):
    assert m.delete(key) == 1


def free_by_unlink(m, key, holder):
    assert m.unlink(key) == 1


def free_by_overwrite(m, key, holder):
    assert m.set(key, "x")


def free_by_flushall(m, key, holder):
    assert m.flushall()


def free_by_expiry(m, key, holder):
    assert m.execute_command("RLOCK.RENEW", key, holder, 150) == 1


FREE_PATHS = {
    "release": free_by_release,
    "forcerelease": free_by_forcerelease,
    "expiry": free_by_expiry,
    "del": free_by_del,
    "unlink": free_by_unlink,
    "overwrite": free_by_overwrite,
    "flushall": free_by_flushall,
}


@pytest.mark.parametrize("path", list(FREE_PATHS))
def test_each_handoff_path_leaves_the_replica_byte_identical(pair, path):
    master, replica, m, rc = pair
    assert m.execute_command("RLOCK.ACQUIRE", "k", "holder", LEASE) is None
    with waiters() as pool:
        w1 = start_waiter(pool, master, "k", "w1", lease=LEASE, timeout_ms=10000, probe=m)
        w2 = start_waiter(pool, master, "k", "w2", lease=LEASE + 5000, timeout_ms=10000, probe=m)
        FREE_PATHS[path](m, "k", "holder")
        assert w1.wait() is None and w1.error is None, w1.error
        assert not w2.done.is_set()
        assert m.hgetall("k") == {b"w1": b"1"}
        assert_same(m, rc, "k")
        assert rc.hgetall("k") == {b"w1": b"1"}
        # The second handoff, by release, replicates too.
        assert m.execute_command("RLOCK.RELEASE", "k", "w1") == 1
        assert w2.wait() is None and w2.error is None, w2.error
        assert_same(m, rc, "k")
        assert rc.hgetall("k") == {b"w2": b"1"}
        exp = rc.execute_command("PEXPIRETIME", "k")
        assert abs(exp - (m.time()[0] * 1000 + LEASE + 5000)) < 2000


# ---------------------------------------------------------------------------------------
# Reconnecting and new replicas

def make_some_locks(m, prefix=""):
    """A handful of lock states: single, re-entrant, binary owner, no-expiry foreign key."""
    assert m.execute_command("RLOCK.ACQUIRE", prefix + "single", "a", LEASE) is None
    for _ in range(3):
        assert m.execute_command("RLOCK.ACQUIRE", prefix + "reentrant", "b", LEASE) is None
    assert m.execute_command("RLOCK.ACQUIRE", prefix + "bin", b"\x01\x02:7", LEASE) is None
    return [prefix + "single", prefix + "reentrant", prefix + "bin"]


def test_a_replica_that_reconnects_with_a_partial_resync_agrees(pair):
    master, replica, m, rc = pair
    keys = make_some_locks(m)
    wait_replicated(m, rc)
    partial_before = int(info_field(m, "stats", "sync_partial_ok"))
    full_before = int(info_field(m, "stats", "sync_full"))
    assert rc.execute_command("CLIENT", "KILL", "TYPE", "master") == 1
    # Changes made while the link is down reach the replica from the backlog.
    assert m.execute_command("RLOCK.RELEASE", "reentrant", "b", LEASE + 7000) == 0
    assert m.execute_command("RLOCK.RELEASE", "single", "a") == 1
    assert m.execute_command("RLOCK.ACQUIRE", "later", "c", LEASE) is None
    with waiters() as pool:
        w = start_waiter(pool, master, "later", "d", probe=m)
        assert m.execute_command("RLOCK.RELEASE", "later", "c") == 1
        assert w.wait() is None
    wait_link_up(rc)
    wait_until(lambda: int(info_field(m, "stats", "sync_partial_ok")) > partial_before, 10,
               what="partial resync")
    assert int(info_field(m, "stats", "sync_full")) == full_before, "it was a full resync"
    assert_same(m, rc, *keys, "later")
    assert rc.hgetall("later") == {b"d": b"1"}
    assert rc.hgetall("reentrant") == {b"b": b"2"}
    assert rc.exists("single") == 0


def test_a_replica_attached_after_the_locks_exist_full_syncs_and_agrees(make_server):
    master = make_server("master", args=MASTER_ARGS, module_args=EFFECTS)
    m = master.client()
    keys = make_some_locks(m)
    with waiters() as pool:
        w = start_waiter(pool, master, "single", "w", probe=m)
        assert m.execute_command("RLOCK.RELEASE", "single", "a") == 1
        assert w.wait() is None
    full_before = int(info_field(m, "stats", "sync_full"))
    replica = make_server("replica", module=False,
                          args=["--replicaof", "127.0.0.1", str(master.port)])
    rc = replica.client()
    wait_link_up(rc)
    wait_online(m)
    assert int(info_field(m, "stats", "sync_full")) == full_before + 1
    assert_same(m, rc, *keys)
    assert rc.hgetall("single") == {b"w": b"1"}
    assert rc.hgetall("reentrant") == {b"b": b"3"}


def test_unlock_messages_reach_a_subscriber_connected_to_the_replica(pair):
    master, replica, m, rc = pair
    sub = replica.client().pubsub()
    try:
        sub.subscribe("redisson_lock__channel:{k}", "redisson_lock__channel:a{b}")
        for _ in range(2):
            assert sub.get_message(timeout=5)["type"] == "subscribe"
        assert m.execute_command("RLOCK.ACQUIRE", "k", "o", LEASE) is None
        assert m.execute_command("RLOCK.RELEASE", "k", "o") == 1
        msg = sub.get_message(timeout=5)
        assert msg is not None, "no unlock message on the replica"
        assert (msg["type"], msg["channel"], msg["data"]) == (
            "message", b"redisson_lock__channel:{k}", b"0")
        # Redisson's prefixName rule: a key with braces keeps them, channel unwrapped.
        assert m.execute_command("RLOCK.ACQUIRE", "a{b}", "o", LEASE) is None
        assert m.execute_command("RLOCK.FORCERELEASE", "a{b}") == 1
        msg = sub.get_message(timeout=5)
        assert msg is not None
        assert (msg["channel"], msg["data"]) == (b"redisson_lock__channel:a{b}", b"0")
    finally:
        sub.close()


# ---------------------------------------------------------------------------------------
# AOF contents

ALLOWED_IN_AOF = {b"SELECT", b"MULTI", b"EXEC", b"HSET", b"HINCRBY", b"HDEL", b"DEL",
                  b"PEXPIREAT", b"PUBLISH"}


# The one expiry below is deleted by the server itself, which writes UNLINK for it when
# lazyfree-lazy-expire is on (Valkey's default; Redis 7.0's is off) and DEL otherwise;
# the module's own deletions are DEL either way. Both settings run on either server.
@pytest.mark.parametrize("lazy_expire", ["no", "yes"])
def test_the_aof_holds_plain_effects_with_pexpireat_and_no_rlock_command(make_server,
                                                                         lazy_expire):
    s = make_server(module_args=EFFECTS,
                    args=["--appendonly", "yes", "--appendfsync", "always", "--hz", "100",
                          "--lazyfree-lazy-expire", lazy_expire])
    c = s.client()
    assert c.execute_command("RLOCK.ACQUIRE", "k", "a", LEASE) is None
    assert c.execute_command("RLOCK.ACQUIRE", "k", "a", LEASE) is None
    assert c.execute_command("RLOCK.RENEW", "k", "a", LEASE) == 1
    assert c.execute_command("RLOCK.RELEASE", "k", "a", LEASE) == 0
    with waiters() as pool:
        w = start_waiter(pool, s, "k", "b", probe=c)
        assert c.execute_command("RLOCK.RELEASE", "k", "a") == 1
        assert w.wait() is None
        w2 = start_waiter(pool, s, "k", "c", probe=c)
        assert c.execute_command("RLOCK.RENEW", "k", "b", 100) == 1  # expiry handoff
        assert w2.wait() is None
    assert c.execute_command("RLOCK.FORCERELEASE", "k") == 1
    assert c.execute_command("RLOCK.ACQUIRE", "k", "z", LEASE) is None
    expire_at = c.execute_command("PEXPIRETIME", "k")
    cmds = aof_commands(s)
    names = [cmd[0].upper() for cmd in cmds]
    assert not [n for n in names if n.startswith(b"RLOCK")], names
    expiry_delete = b"UNLINK" if lazy_expire == "yes" else b"DEL"
    allowed = ALLOWED_IN_AOF | {expiry_delete}
    assert set(names) <= allowed, set(names) - allowed
    assert names.count(b"UNLINK") == (1 if lazy_expire == "yes" else 0), names
    pexpireats = [cmd for cmd in cmds if cmd[0].upper() == b"PEXPIREAT"]
    assert pexpireats, "no PEXPIREAT in the AOF"
    assert pexpireats[-1] == [b"PEXPIREAT", b"k", str(expire_at).encode()]
    assert not [cmd for cmd in cmds if cmd[0].upper() in (b"EXPIRE", b"PEXPIRE")]
    hsets = [cmd[2] for cmd in cmds if cmd[0].upper() == b"HSET"]
    assert hsets == [b"a", b"b", b"c", b"z"], "every grant, handoffs included, is an HSET"


# ---------------------------------------------------------------------------------------
# Restarts

def held_locks(c):
    """Locks of every shape, and what they look like without the module."""
    keys = make_some_locks(c)
    assert c.execute_command("RLOCK.ACQUIRE", "short", "s", 20000) is None
    keys.append("short")
    return {k: lock_state(c, k) for k in keys}


def assert_locks_kept_and_working(c, before):
    assert {k: lock_state(c, k) for k in before} == before
    assert owners(c, "reentrant") == {b"b": 3}
    assert 0 < c.execute_command("PTTL", "short") <= 20000
    # The module works on them: contended, re-entry, release down to free.
    pttl = c.execute_command("RLOCK.ACQUIRE", "single", "intruder", LEASE)
    assert isinstance(pttl, int) and 0 < pttl <= LEASE
    assert c.execute_command("RLOCK.RELEASE", "reentrant", "b") == 0
    assert c.execute_command("RLOCK.RELEASE", "reentrant", "b") == 0
    assert c.execute_command("RLOCK.RELEASE", "reentrant", "b") == 1
    assert c.execute_command("RLOCK.ACQUIRE", "reentrant", "intruder", LEASE) is None
    assert c.execute_command("RLOCK.RENEW", "bin", b"\x01\x02:7", LEASE) == 1


def test_locks_survive_an_rdb_save_and_restart(make_server):
    s = make_server(args=["--dbfilename", "locks.rdb"])
    c = s.client()
    before = held_locks(c)
    assert c.save()
    s.restart()
    c = s.client()
    assert int(info_field(c, "persistence", "loading")) == 0
    assert_locks_kept_and_working(c, before)


@pytest.mark.parametrize("fsync", ["everysec", "always"])
def test_locks_survive_an_aof_restart(make_server, fsync):
    s = make_server(args=["--appendonly", "yes", "--appendfsync", fsync])
    c = s.client()
    before = held_locks(c)
    s.restart()
    c = s.client()
    assert int(info_field(c, "persistence", "aof_enabled")) == 1
    assert_locks_kept_and_working(c, before)


@pytest.mark.parametrize("preamble", ["yes", "no"])
def test_locks_survive_an_aof_rewrite_and_restart(make_server, preamble):
    s = make_server(args=["--appendonly", "yes", "--appendfsync", "always",
                          "--aof-use-rdb-preamble", preamble])
    c = s.client()
    before = held_locks(c)
    c.bgrewriteaof()
    wait_until(lambda: info_field(c, "persistence", "aof_rewrite_in_progress") == "0"
               and info_field(c, "persistence", "aof_rewrite_scheduled") == "0"
               and int(info_field(c, "persistence", "aof_rewrites")) >= 1, 15,
               what="AOF rewrite done")
    assert info_field(c, "persistence", "aof_last_bgrewrite_status") == "ok"
    if preamble == "no":
        base = [f for f in aof_files(s) if ".base." in f.name]
        assert base and base[0].name.endswith(".aof")
        cmds = aof_commands(s)
        assert not [x for x in cmds if x[0].upper().startswith(b"RLOCK")]
        assert [b"PEXPIREAT", b"reentrant", str(before["reentrant"][1]).encode()] in cmds
    s.restart()
    c = s.client()
    assert_locks_kept_and_working(c, before)


def test_a_module_less_replica_promoted_keeps_the_locks(pair):
    master, replica, m, rc = pair
    before = held_locks(m)
    wait_replicated(m, rc)
    assert rc.execute_command("REPLICAOF", "NO", "ONE")
    assert info_field(rc, "replication", "role") == "master"
    assert {k: lock_state(rc, k) for k in before} == before


def test_a_module_loaded_replica_promoted_keeps_the_locks_and_serves_rlock_commands(make_server):
    master = make_server("master", args=MASTER_ARGS)
    m = master.client()
    before = held_locks(m)
    replica = make_server("replica", args=["--replicaof", "127.0.0.1", str(master.port)])
    rc = replica.client()
    wait_link_up(rc)
    wait_online(m)
    wait_replicated(m, rc)
    # A replica refuses RLOCK writes and answers RLOCK.INFO.
    with pytest.raises(redis.ReadOnlyError):
        rc.execute_command("RLOCK.ACQUIRE", "single", "x", LEASE)
    assert owners(rc, "reentrant") == {b"b": 3}
    assert rc.execute_command("REPLICAOF", "NO", "ONE")
    wait_until(lambda: info_field(rc, "replication", "role") == "master", 5, what="promoted")
    assert_locks_kept_and_working(rc, before)
