"""A lock freed by being overwritten or moved away (design.md 1.3): RESTORE, RENAME and COPY
onto the lock's key, SET-like *STORE commands, MOVE of the lock to another db.

Each is a different way for a server to report the change to modules: a keyspace event
of some class on Redis 7.0, the key server event (deleted / overwritten) on 7.2+ and
Valkey. Whichever, a waiter is handed the lock; with nobody waiting the unlock message
is published once. The handoff reaches a module-less replica and the AOF after its cause.
Runs on whatever server REDIS_SERVER names (Redis 7.0, Valkey).
"""

import pytest

from conftest import EFFECTS, someone_waits

from cluster_helpers import aof_commands, snapshot, wait_link_up, wait_online, wait_replicated
from test_waiting import (HOLDER_LEASE, WAITER_LEASE, acquire, channel,  # noqa: F401
                          check_the_waiter_is_handed_the_freed_lock, lock_info,
                          rlock_stats, spawn, unlock_messages)


def restore_onto(r):
    r.set("src", "not a lock")
    assert r.restore("k", 0, r.dump("src"), replace=True) == b"OK"


def rename_onto(r):
    r.set("src", "not a lock")
    assert r.rename("src", "k")


def copy_replace_onto(r):
    r.set("src", "not a lock")
    assert r.copy("src", "k", replace=True) == 1


def move_away(r):
    assert r.move("k", 1)


def sunionstore_onto(r):
    r.sadd("src", "x")
    assert r.sunionstore("k", "src") == 1


def zunionstore_onto(r):
    r.zadd("src", {"x": 1})
    assert r.zunionstore("k", ["src"]) == 1


FREEING = {
    "restore": restore_onto,
    "rename": rename_onto,
    "copy_replace": copy_replace_onto,
    "move": move_away,
    "sunionstore": sunionstore_onto,
    "zunionstore": zunionstore_onto,
}

# How each cause reaches the AOF and replicas.
CAUSE_IN_AOF = {
    "restore": b"RESTORE", "rename": b"RENAME", "copy_replace": b"COPY", "move": b"MOVE",
    "sunionstore": b"SUNIONSTORE", "zunionstore": b"ZUNIONSTORE",
}


@pytest.mark.parametrize("how", FREEING)
def test_an_overwritten_or_moved_lock_goes_to_the_waiter(server, r, spawn, how):
    check_the_waiter_is_handed_the_freed_lock(server, r, spawn, FREEING[how])


@pytest.mark.parametrize("how", FREEING)
def test_an_overwritten_or_moved_lock_with_nobody_waiting_publishes_its_unlock_message(
        server, r, how):
    # Nobody waits for this key, but somebody waits in the module (for another key): it
    # watches, and tracks the lock written now (docs/design.md 1, "nothing held while nobody waits").
    someone_waits(server)
    assert acquire(r, "k", "holder") is None
    sub = server.client().pubsub()
    sub.subscribe(channel("k"))
    FREEING[how](r)
    assert unlock_messages(sub, 0.5) == [b"0"]
    # Forgotten once published: touching the key again publishes nothing more.
    r.delete("k")
    assert acquire(r, "k", "next") is None
    assert unlock_messages(sub, 0.2) == []
    sub.close()


def test_a_lock_replaced_by_sort_store_is_noticed_by_the_next_rlock_command(server, r):
    # SORT ... STORE is a list command: on 7.0 the module does not watch list events (they
    # cost every LPUSH), so it notices the replaced lock at the next RLOCK command on the
    # key at the latest. Servers with the key event notice it at once. (While the module
    # watches: somebody waits for another key.)
    someone_waits(server)
    assert acquire(r, "k", "holder") is None
    sub = server.client().pubsub()
    sub.subscribe(channel("k"))
    r.rpush("src", 3, 1, 2)
    assert r.sort("src", store="k") == 3
    with pytest.raises(Exception, match="WRONGTYPE"):
        acquire(r, "k", "next")
    assert unlock_messages(sub, 0.5) == [b"0"]
    sub.close()


def test_a_lock_replaced_by_sort_store_goes_to_the_waiter(server, r, spawn):
    # With a waiter, at the old lease's end at the latest (its expiry timer), or at once
    # where the server reports the overwrite.
    assert acquire(r, "k", "holder", 500) is None
    w = spawn(server, "k", "waiter", queue_as=1)
    r.rpush("src", 3, 1, 2)
    assert r.sort("src", store="k") == 3
    w.granted(timeout=5)
    assert r.hgetall("k") == {b"waiter": b"1"}


# ---------------------------------------------------------------------------------------
# Replication and AOF: the cause first, then the handoff

@pytest.mark.parametrize("how", FREEING)
def test_the_handoff_after_an_overwrite_reaches_a_module_less_replica(make_server, spawn, how):
    master = make_server("master", args=["--hz", "100", "--repl-diskless-sync-delay", "0"],
                         module_args=EFFECTS)
    replica = make_server("replica", module=False,
                          args=["--replicaof", "127.0.0.1", str(master.port)])
    m, rc = master.client(), replica.client()
    wait_link_up(rc)
    wait_online(m)
    assert acquire(m, "k", "holder") is None
    w = spawn(master, "k", "waiter", queue_as=1)
    FREEING[how](m)
    w.granted()
    wait_replicated(m, rc)
    assert rc.hgetall("k") == {b"waiter": b"1"}
    assert snapshot(rc, "k") == snapshot(m, "k")
    assert rc.execute_command("PEXPIRETIME", "k") == m.execute_command("PEXPIRETIME", "k")


@pytest.mark.parametrize("how", FREEING)
def test_the_aof_holds_the_overwrite_before_the_handoff_and_replays_to_the_waiters_lock(
        make_server, spawn, how):
    s = make_server(module_args=EFFECTS, args=["--appendonly", "yes", "--appendfsync", "always"])
    r = s.client()
    assert acquire(r, "k", "holder") is None
    w = spawn(s, "k", "waiter", queue_as=1)
    FREEING[how](r)
    w.granted()
    cmds = aof_commands(s)
    names = [c[0].upper() for c in cmds]
    cause = max(i for i, n in enumerate(names) if n == CAUSE_IN_AOF[how])
    grant = max(i for i, c in enumerate(cmds) if c[0].upper() == b"HSET" and c[1:3] == [b"k", b"waiter"])
    assert cause < grant, names[cause:]
    expire_at = r.execute_command("PEXPIRETIME", "k")
    s.restart()
    r = s.client()
    assert r.hgetall("k") == {b"waiter": b"1"}
    assert r.execute_command("PEXPIRETIME", "k") == expire_at
