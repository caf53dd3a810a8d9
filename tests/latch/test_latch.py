"""The countdown latch (RLATCH.*, design.md 4.5, issue 13) on real servers: every command and
reply, hundreds of awaiters released in the turn the count reaches zero, timeouts, a latch
deleted or expired releasing its awaiters, request ids after a lost reply, replication
and the AOF as plain effects, keyspace notifications, named errors for bad input, and
interop both ways with Redisson's own scripts (tests/support/redisson_sync.py) on the same names.

Awaiters are raw sockets (hostile_helpers.Raw): hundreds of blocked calls need no thread
each, and every reply is read exactly as the server sent it.
"""

import re

import pytest
import redis

from cluster_helpers import (aof_commands, info_field, snapshot, wait_link_up, wait_online,
                             wait_replicated)
from conftest import EFFECTS, wait_until
import errors
from errors import (ASYNC, EMPTY_ID, LATCH_COUNT, LATCH_OVERFLOW, NOT_A_LATCH, QUIET_ASYNC, SYNTAX,
                    TIMEOUT, WRONGTYPE)
from hostile_helpers import Map, Raw, ReplyError, arity_error, blocked_clients, rlock_stat
from redisson_sync import NEW_COUNT_MESSAGE, ZERO_COUNT_MESSAGE, RedissonCountDownLatch, latch_channel

AWAITERS = 300


def latch(r, *args):
    return r.execute_command(*args)


def waiters(r):
    return rlock_stat(r, "waiters")


def start_awaiters(server, key, n, timeout_ms=0):
    """n raw connections blocked in `RLATCH.AWAIT key WAIT timeout_ms`, all queued."""
    probe = server.client()
    before = waiters(probe)
    conns = []
    for _ in range(n):
        c = Raw(server.port)
        c.send("RLATCH.AWAIT", key, "WAIT", timeout_ms)
        conns.append(c)
    wait_until(lambda: waiters(probe) == before + n, what=f"{n} awaiters queued")
    return conns


def replies(conns, timeout=5.0):
    out = [c.read(timeout) for c in conns]
    for c in conns:
        c.close()
    return out


def subscriber(r, channel):
    p = r.pubsub()
    p.subscribe(channel)
    assert wait_until(lambda: p.get_message(timeout=0.1), what="subscribed")["type"] == "subscribe"
    return p


def next_message(p, timeout=3.0):
    return wait_until(lambda: p.get_message(timeout=0.1), timeout=timeout, what="a message")["data"]


def no_message(p):
    assert p.get_message(timeout=0.2) is None


# ---------------------------------------------------------------------------------------
# Commands and replies


def test_every_command_and_its_replies(r):
    assert latch(r, "RLATCH.GETCOUNT", "l") == 0, "no latch: count 0"
    assert latch(r, "RLATCH.AWAIT", "l") == 1, "no latch: open"
    assert latch(r, "RLATCH.INFO", "l") == [b"count", 0, b"pttl", -2, b"waiters", 0]
    assert latch(r, "RLATCH.TRYSETCOUNT", "l", 3) == 1
    assert r.get("l") == b"3" and r.ttl("l") == -1, "Redisson's layout: a plain string count"
    assert latch(r, "RLATCH.TRYSETCOUNT", "l", 7) == 0, "already set: nothing changes"
    assert r.get("l") == b"3"
    assert latch(r, "RLATCH.GETCOUNT", "l") == 3
    assert latch(r, "RLATCH.AWAIT", "l") == 0, "closed, no WAIT: answers at once"
    assert latch(r, "RLATCH.INFO", "l") == [b"count", 3, b"pttl", -1, b"waiters", 0]
    assert latch(r, "RLATCH.COUNTDOWN", "l") == 2
    assert latch(r, "RLATCH.COUNTDOWN", "l") == 1
    assert latch(r, "RLATCH.COUNTDOWN", "l") == 0
    assert r.exists("l") == 0, "at zero the key goes (Redisson's countDown)"
    assert latch(r, "RLATCH.COUNTDOWN", "l") == 0, "no latch: 0, nothing changes"
    assert r.exists("l") == 0
    assert latch(r, "RLATCH.AWAIT", "l", "WAIT", 1000) == 1, "open: no wait"
    assert latch(r, "RLATCH.DELETE", "l") == 0
    assert latch(r, "RLATCH.TRYSETCOUNT", "l", 2, "ID", "t1") == 1
    assert latch(r, "RLATCH.DELETE", "l") == 1
    assert r.exists("l") == 0
    # The largest count, and a Java count set to 0 or below (Redisson does not check).
    assert latch(r, "RLATCH.TRYSETCOUNT", "big", 2**63 - 1) == 1
    assert latch(r, "RLATCH.COUNTDOWN", "big") == 2**63 - 2
    r.set("neg", -5)
    assert latch(r, "RLATCH.GETCOUNT", "neg") == -5
    assert latch(r, "RLATCH.AWAIT", "neg") == 1, "a count <= 0 is open"
    assert latch(r, "RLATCH.COUNTDOWN", "neg") == 0 and r.exists("neg") == 0


def test_info_is_a_map_under_resp3(server):
    c = Raw(server.port)
    assert isinstance(c.call("HELLO", 3), Map)
    c.call("RLATCH.TRYSETCOUNT", "l", 4)
    c.call("PEXPIRE", "l", 60_000)
    info = dict(c.call("RLATCH.INFO", "l"))
    assert info[b"count"] == 4 and 0 < info[b"pttl"] <= 60_000 and info[b"waiters"] == 0
    c.close()


def test_info_counts_waiters_and_inform_counters(server):
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "l", 1)
    conns = start_awaiters(server, "l", 3)
    assert latch(r, "RLATCH.INFO", "l")[-1] == 3
    assert latch(r, "RLATCH.COUNTDOWN", "l") == 0
    assert replies(conns) == [1, 1, 1]
    stats = r.info("rlock")
    assert stats["rlock_latch_sets"] == 1
    assert stats["rlock_latch_count_downs"] == 1
    assert stats["rlock_latch_openings"] == 1
    assert stats["rlock_latch_awaits_queued"] == 3
    assert stats["rlock_latch_awaits_released"] == 3
    assert stats["rlock_waiters"] == 0


# ---------------------------------------------------------------------------------------
# Awaiters


def test_300_awaiters_all_released_in_the_turn_the_count_reaches_zero(server):
    r = server.client()
    assert latch(r, "RLATCH.TRYSETCOUNT", "l", 2) == 1
    java = subscriber(server.client(), latch_channel("l"))
    conns = start_awaiters(server, "l", AWAITERS)
    assert latch(r, "RLATCH.COUNTDOWN", "l") == 1
    assert all(not c.has_reply(0) for c in conns), "nobody goes before zero"
    assert waiters(r) == AWAITERS
    # The count-down and INFO in one pipeline: INFO runs right after the count-down's turn,
    # and by then every awaiter has been granted and has left the queue.
    control = Raw(server.port)
    got = control.pipeline([("RLATCH.COUNTDOWN", "l"), ("INFO", "rlock")])
    assert got[0] == 0
    info = dict(line.split(":", 1) for line in got[1].decode().splitlines() if ":" in line)
    assert info["rlock_waiters"] == "0"
    assert info["rlock_latch_awaits_released"] == str(AWAITERS)
    assert replies(conns) == [1] * AWAITERS, "every awaiter is answered 1"
    assert next_message(java) == str(ZERO_COUNT_MESSAGE).encode(), "Redisson's zero message"
    no_message(java)
    assert blocked_clients(r) == 0
    control.close()


def test_an_await_that_times_out_answers_0_and_leaves_the_queue(server):
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "l", 1)
    assert latch(r, "RLATCH.AWAIT", "l", "WAIT", 30) == 0
    assert waiters(r) == 0 and blocked_clients(r) == 0
    assert r.info("rlock")["rlock_latch_await_timeouts"] == 1
    # CLIENT UNBLOCK ... TIMEOUT answers the same way.
    (c,) = start_awaiters(server, "l", 1)
    ids = [int(line.split("id=")[1].split()[0])
           for line in r.execute_command("CLIENT", "LIST").decode().splitlines()
           if "cmd=rlatch.await" in line]
    assert len(ids) == 1
    assert r.execute_command("CLIENT", "UNBLOCK", ids[0], "TIMEOUT") == 1
    assert c.read(5) == 0
    c.close()
    assert waiters(r) == 0
    assert latch(r, "RLATCH.GETCOUNT", "l") == 1, "awaiting changes nothing"


def test_awaiters_of_one_key_only_are_released(server):
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "a", 1)
    latch(r, "RLATCH.TRYSETCOUNT", "b", 1)
    on_a = start_awaiters(server, "a", 2)
    on_b = start_awaiters(server, "b", 2)
    latch(r, "RLATCH.COUNTDOWN", "a")
    assert replies(on_a) == [1, 1]
    assert all(not c.has_reply(0.05) for c in on_b)
    assert waiters(r) == 2
    latch(r, "RLATCH.DELETE", "b")
    assert replies(on_b) == [1, 1]


def release_by_delete(r):
    assert latch(r, "RLATCH.DELETE", "l") == 1


def release_by_plain_del(r):
    assert r.delete("l") == 1


def release_by_unlink(r):
    assert r.unlink("l") == 1


def release_by_expiry(r):
    assert r.pexpire("l", 50)


def release_by_flushall(r):
    r.flushall()


@pytest.mark.parametrize("release", [release_by_delete, release_by_plain_del, release_by_unlink,
                                     release_by_expiry, release_by_flushall])
def test_a_latch_that_goes_away_releases_its_awaiters(server, release):
    """A missing latch reads as count 0, open: whatever removed it, awaiters go."""
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "l", 5)
    conns = start_awaiters(server, "l", 4)
    release(r)
    assert replies(conns) == [1] * 4
    assert waiters(r) == 0 and blocked_clients(r) == 0


def test_a_latch_with_a_ttl_releases_its_awaiters_at_expiry(server):
    """The head's check reports the key's TTL: the engine looks again when it runs out
    instead of waiting for Redis's sampling expiry."""
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "l", 5)
    # The TTL must outlast queueing the awaiters (a loaded machine took longer than 80 ms,
    # and an awaiter arriving after the expiry is answered at once, never queued).
    r.pexpire("l", 1000)
    conns = start_awaiters(server, "l", 3)
    assert replies(conns) == [1, 1, 1]
    assert r.exists("l") == 0


def test_a_new_count_after_a_pending_opening_does_not_strand_awaiters(server):
    """A DEL and a TRYSETCOUNT in one pipeline: the awaiters of the deleted latch are
    answered before the new count closes it again (the command serves the queue first)."""
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "l", 5)
    conns = start_awaiters(server, "l", 3)
    control = Raw(server.port)
    assert control.pipeline([("DEL", "l"), ("RLATCH.TRYSETCOUNT", "l", 2)]) == [1, 1]
    assert replies(conns) == [1, 1, 1]
    assert latch(r, "RLATCH.GETCOUNT", "l") == 2
    control.close()


def test_a_disconnected_awaiter_leaves_nothing_behind(server):
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "l", 1)
    conns = start_awaiters(server, "l", 5, timeout_ms=60_000)
    for c in conns[:4]:
        c.close()
    wait_until(lambda: waiters(r) == 1, what="closed awaiters gone")
    assert blocked_clients(r) == 1
    assert latch(r, "RLATCH.COUNTDOWN", "l") == 0
    assert replies(conns[4:]) == [1]
    assert waiters(r) == 0 and blocked_clients(r) == 0
    assert r.info("rlock")["rlock_keys_with_waiters"] == 0


def test_await_in_multi_or_lua_answers_at_once(r):
    latch(r, "RLATCH.TRYSETCOUNT", "l", 1)
    with r.pipeline(transaction=True) as p:
        p.execute_command("RLATCH.AWAIT", "l", "WAIT", 0)
        assert p.execute() == [0]
    assert r.eval("return redis.call('RLATCH.AWAIT', KEYS[1], 'WAIT', 0)", 1, "l") == 0
    assert waiters(r) == 0


def test_quiet_await_tickets_answer_only_by_their_message(server):
    """`ASYNC QUIET`: a queued await gets no reply; its `granted` message, when the count
    reaches zero, is its whole answer. An open latch answers a quiet await at once."""
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "l", 1)
    c = Raw(server.port)
    c.call("HELLO", "3")
    assert c.call("SUBSCRIBE", "rlock_ticket:{l}")[0] == b"subscribe"
    c.send_many([("RLATCH.AWAIT", "l", "WAIT", 0, "ASYNC", "QUIET", "ID", f"a{i}")
                 for i in range(5)] + [("PING",)])
    assert c.read() == b"PONG", "no reply for the five queued awaits"
    assert waiters(r) == 5
    assert latch(r, "RLATCH.COUNTDOWN", "l") == 0
    got = [c.read() for _ in range(5)]
    assert [m[:2] for m in got] == [[b"message", b"rlock_ticket:{l}"]] * 5
    assert [m[2] for m in got] == [f"granted:2:0:a{i}".encode() for i in range(5)]
    assert waiters(r) == 0
    assert c.call("RLATCH.AWAIT", "l", "WAIT", 0, "ASYNC", "QUIET", "ID", "a5") == 1
    assert c.call("PING") == b"PONG"
    assert not c.has_reply(0.1)
    c.close()


def test_await_on_a_key_that_is_no_latch_waits_until_it_goes(server):
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "l", 1)
    conns = start_awaiters(server, "l", 2)
    r.delete("l")
    r.set("l", "not a number")  # after the opening: the awaiters were answered already
    assert replies(conns) == [1, 1]
    with pytest.raises(redis.ResponseError, match=re.escape(errors.text(NOT_A_LATCH))):
        latch(r, "RLATCH.AWAIT", "l", "WAIT", 0)


# ---------------------------------------------------------------------------------------
# Request ids


def test_a_retried_count_down_after_a_lost_reply_counts_once(server):
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "l", 3)
    lost = Raw(server.port)
    lost.send("RLATCH.COUNTDOWN", "l", "ID", "cd-1")
    lost.close()  # the reply is lost with the connection
    wait_until(lambda: latch(r, "RLATCH.GETCOUNT", "l") == 2, what="first count-down applied")
    assert latch(r, "RLATCH.COUNTDOWN", "l", "ID", "cd-1") == 2, "the first reply, again"
    assert latch(r, "RLATCH.GETCOUNT", "l") == 2, "counted once"
    assert r.pttl("rlock_request:{l}:cd-1") > 0, "remembered in the latch's slot for the window"
    assert latch(r, "RLATCH.COUNTDOWN", "l", "ID", "cd-2") == 1
    assert latch(r, "RLATCH.COUNTDOWN", "l", "ID", "cd-3") == 0
    # A new latch later: the retried opening count-down must not count it down.
    assert latch(r, "RLATCH.TRYSETCOUNT", "l", 5) == 1
    assert latch(r, "RLATCH.COUNTDOWN", "l", "ID", "cd-3") == 0
    assert latch(r, "RLATCH.GETCOUNT", "l") == 5


def test_retried_set_and_delete_are_applied_once(r):
    assert latch(r, "RLATCH.TRYSETCOUNT", "l", 2, "ID", "s") == 1
    latch(r, "RLATCH.DELETE", "l", "ID", "d")
    assert latch(r, "RLATCH.TRYSETCOUNT", "l", 9) == 1
    assert latch(r, "RLATCH.DELETE", "l", "ID", "d") == 1, "replayed, not deleted again"
    assert latch(r, "RLATCH.TRYSETCOUNT", "l", 2, "ID", "s") == 1, "replayed"
    assert r.get("l") == b"9"


def test_calls_that_changed_nothing_remember_nothing(r):
    assert latch(r, "RLATCH.COUNTDOWN", "l", "ID", "x") == 0
    assert latch(r, "RLATCH.DELETE", "l", "ID", "y") == 0
    assert r.exists("rlock_request:{l}:x", "rlock_request:{l}:y") == 0


# ---------------------------------------------------------------------------------------
# Replication, AOF, keyspace


MASTER_ARGS = ["--hz", "100", "--repl-diskless-sync-delay", "0", "--shutdown-on-sigterm", "now"]


def test_a_module_less_replica_gets_plain_effects_and_the_messages(make_server):
    master = make_server("master", args=MASTER_ARGS, module_args=EFFECTS)
    replica = make_server("replica", module=False, args=["--replicaof", "127.0.0.1", str(master.port)])
    m, rc = master.client(), replica.client()
    wait_link_up(rc)
    wait_online(m)
    java_on_replica = subscriber(replica.client(), latch_channel("l"))
    steps = [
        (("RLATCH.TRYSETCOUNT", "l", 3), 1, b"3"),
        (("RLATCH.COUNTDOWN", "l"), 2, b"2"),
        (("RLATCH.COUNTDOWN", "l", "ID", "r"), 1, b"1"),
        (("RLATCH.COUNTDOWN", "l"), 0, None),
        (("RLATCH.TRYSETCOUNT", "l", 4), 1, b"4"),
        (("RLATCH.DELETE", "l"), 1, None),
    ]
    for cmd, reply, value in steps:
        assert m.execute_command(*cmd) == reply, cmd
        wait_replicated(m, rc)
        assert rc.get("l") == value, cmd
        assert snapshot(rc, "l") == snapshot(m, "l"), cmd
    assert snapshot(rc, "rlock_request:{l}:r") == snapshot(m, "rlock_request:{l}:r")
    heard = [next_message(java_on_replica) for _ in range(4)]
    assert heard == [b"1", b"0", b"1", b"1"], "set, zero, set, delete"


def test_a_module_loaded_replica_answers_await_at_once_and_refuses_writes(make_server):
    master = make_server("master", args=MASTER_ARGS)
    replica = make_server("replica", args=["--replicaof", "127.0.0.1", str(master.port)])
    m, rc = master.client(), replica.client()
    wait_link_up(rc)
    wait_online(m)
    latch(m, "RLATCH.TRYSETCOUNT", "l", 2)
    wait_replicated(m, rc)
    assert latch(rc, "RLATCH.GETCOUNT", "l") == 2
    assert latch(rc, "RLATCH.AWAIT", "l", "WAIT", 0) == 0, "a replica never queues an await"
    assert latch(rc, "RLATCH.INFO", "l") == [b"count", 2, b"pttl", -1, b"waiters", 0]
    with pytest.raises(redis.ReadOnlyError):
        latch(rc, "RLATCH.COUNTDOWN", "l")
    latch(m, "RLATCH.COUNTDOWN", "l")
    latch(m, "RLATCH.COUNTDOWN", "l")
    wait_replicated(m, rc)
    assert latch(rc, "RLATCH.AWAIT", "l", "WAIT", 0) == 1


def test_the_aof_holds_plain_effects_and_a_restart_keeps_the_count(make_server):
    s = make_server(module_args=EFFECTS, args=["--appendonly", "yes", "--appendfsync", "always"])
    c = s.client()
    latch(c, "RLATCH.TRYSETCOUNT", "l", 5)
    latch(c, "RLATCH.COUNTDOWN", "l")
    latch(c, "RLATCH.COUNTDOWN", "l", "ID", "q")
    latch(c, "RLATCH.TRYSETCOUNT", "gone", 1)
    latch(c, "RLATCH.COUNTDOWN", "gone")
    latch(c, "RLATCH.AWAIT", "l", "WAIT", 5)
    names = {cmd[0].upper() for cmd in aof_commands(s)}
    assert not [n for n in names if n.startswith(b"RLATCH")], names
    assert names <= {b"SELECT", b"MULTI", b"EXEC", b"SET", b"DECRBY", b"DEL", b"PUBLISH"}, names
    s.restart()
    c = s.client()
    assert int(info_field(c, "persistence", "aof_enabled")) == 1
    assert latch(c, "RLATCH.GETCOUNT", "l") == 3
    assert latch(c, "RLATCH.COUNTDOWN", "l", "ID", "q") == 3, "the request id survived too"
    assert latch(c, "RLATCH.COUNTDOWN", "l") == 2
    assert c.exists("gone") == 0


@pytest.fixture
def events(server):
    admin = server.client()
    admin.config_set("notify-keyspace-events", "KEA")
    p = server.client().pubsub()
    p.psubscribe("__keyevent@0__:*")
    wait_until(lambda: p.get_message(timeout=0.1), what="psubscribe confirmation")

    def drain(expect):
        got = []
        while len(got) < expect:
            msg = p.get_message(timeout=2.0)
            if msg is None:
                break
            if msg["type"] == "pmessage":
                got.append((msg["channel"].split(b":", 1)[1].decode(), msg["data"].decode()))
        assert p.get_message(timeout=0.05) is None, "no further events"
        return got

    yield drain
    p.close()


def test_writes_notify_like_set_decrby_del_and_reads_notify_nothing(server, events):
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "l", 2)
    assert events(1) == [("set", "l")]
    latch(r, "RLATCH.TRYSETCOUNT", "l", 2)
    latch(r, "RLATCH.GETCOUNT", "l")
    latch(r, "RLATCH.AWAIT", "l")
    latch(r, "RLATCH.INFO", "l")
    assert events(0) == []
    latch(r, "RLATCH.COUNTDOWN", "l")
    assert events(1) == [("decrby", "l")]
    latch(r, "RLATCH.COUNTDOWN", "l")
    assert events(1) == [("del", "l")]
    latch(r, "RLATCH.COUNTDOWN", "l")
    latch(r, "RLATCH.DELETE", "l")
    assert events(0) == []
    latch(r, "RLATCH.TRYSETCOUNT", "l", 2)
    latch(r, "RLATCH.DELETE", "l")
    assert events(2) == [("set", "l"), ("del", "l")]


def test_a_count_down_invalidates_watch(server):
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "l", 2)
    with r.pipeline() as p:
        p.watch("l")
        latch(server.client(), "RLATCH.COUNTDOWN", "l")
        p.multi()
        p.get("l")
        with pytest.raises(redis.WatchError):
            p.execute()


# ---------------------------------------------------------------------------------------
# Bad input: exact named errors, nothing changed


BAD = [
    (("RLATCH.TRYSETCOUNT", "l"), arity_error("RLATCH.TRYSETCOUNT")),
    (("RLATCH.TRYSETCOUNT", "l", 1, "ID", "a", "x"), arity_error("RLATCH.TRYSETCOUNT")),
    (("RLATCH.TRYSETCOUNT", "new", 0), LATCH_COUNT),
    (("RLATCH.TRYSETCOUNT", "new", -1), LATCH_COUNT),
    (("RLATCH.TRYSETCOUNT", "new", "1.5"), LATCH_COUNT),
    (("RLATCH.TRYSETCOUNT", "new", " 1"), LATCH_COUNT),
    (("RLATCH.TRYSETCOUNT", "new", str(2**63)), LATCH_COUNT),
    (("RLATCH.TRYSETCOUNT", "new", 1, "ID", ""), EMPTY_ID),
    (("RLATCH.TRYSETCOUNT", "new", 1, "ID"), SYNTAX),
    (("RLATCH.TRYSETCOUNT", "new", 1, "WAIT", 5), SYNTAX),
    (("RLATCH.TRYSETCOUNT", "str", 1), NOT_A_LATCH),
    (("RLATCH.TRYSETCOUNT", "hash", 1), WRONGTYPE),
    (("RLATCH.COUNTDOWN",), arity_error("RLATCH.COUNTDOWN")),
    (("RLATCH.COUNTDOWN", "l", "ID", "a", "ID", "b"), arity_error("RLATCH.COUNTDOWN")),
    (("RLATCH.COUNTDOWN", "l", "junk"), SYNTAX),
    (("RLATCH.COUNTDOWN", "l", "NX", "1"), SYNTAX),
    (("RLATCH.COUNTDOWN", "l", "ID", ""), EMPTY_ID),
    (("RLATCH.COUNTDOWN", "str"), NOT_A_LATCH),
    (("RLATCH.COUNTDOWN", "hash"), WRONGTYPE),
    (("RLATCH.COUNTDOWN", "min"), LATCH_OVERFLOW),
    (("RLATCH.GETCOUNT", "l", "x"), arity_error("RLATCH.GETCOUNT")),
    (("RLATCH.GETCOUNT", "str"), NOT_A_LATCH),
    (("RLATCH.GETCOUNT", "list"), WRONGTYPE),
    (("RLATCH.AWAIT", "l", "WAIT", -1), TIMEOUT),
    (("RLATCH.AWAIT", "l", "WAIT", "x"), TIMEOUT),
    (("RLATCH.AWAIT", "l", "WAIT"), SYNTAX),
    (("RLATCH.AWAIT", "l", "ID", "r"), SYNTAX),
    (("RLATCH.AWAIT", "l", "WAIT", 1, "WAIT", 1), SYNTAX),
    (("RLATCH.AWAIT", "l", "WAIT", 1, "ASYNC"), ASYNC),
    (("RLATCH.AWAIT", "l", "ID", "t", "ASYNC"), ASYNC),
    (("RLATCH.AWAIT", "l", "WAIT", 1, "ASYNC", "ID", "t", "X"), SYNTAX),
    (("RLATCH.AWAIT", "l", "WAIT", 1, "QUIET", "ID", "t"), QUIET_ASYNC),
    (("RLATCH.AWAIT", "l", "QUIET"), QUIET_ASYNC),
    (("RLATCH.AWAIT", "l", "WAIT", 1, "ASYNC", "QUIET", "QUIET", "ID", "t"), SYNTAX),
    (("RLATCH.TRYSETCOUNT", "new", 1, "QUIET"), SYNTAX),
    (("RLATCH.COUNTDOWN", "l", "QUIET"), SYNTAX),
    (("RLATCH.AWAIT", "l", "WAIT", 1, "ASYNC", "ID", "t", "NOTIFY", "n", "X"), SYNTAX),
    (("RLATCH.AWAIT", "l", "WAIT", 1, "ASYNC", "ID", "t", "NOTIFY", "n", "QUIET", "X"),
     arity_error("RLATCH.AWAIT")),
    (("RLATCH.AWAIT", "str", "WAIT", 0), NOT_A_LATCH),
    (("RLATCH.AWAIT", "hash", "WAIT", 0), WRONGTYPE),
    (("RLATCH.DELETE", "l", "x"), SYNTAX),
    (("RLATCH.DELETE", "str"), NOT_A_LATCH),
    (("RLATCH.DELETE", "hash"), WRONGTYPE),
    (("RLATCH.INFO",), arity_error("RLATCH.INFO")),
    (("RLATCH.INFO", "str"), NOT_A_LATCH),
    (("RLATCH.INFO", "hash"), WRONGTYPE),
]


def test_bad_input_gets_a_named_error_and_changes_nothing(server):
    r = server.client()
    latch(r, "RLATCH.TRYSETCOUNT", "l", 3)
    r.set("str", "three")
    r.hset("hash", "a", 1)
    r.rpush("list", 1)
    r.set("min", -2**63)
    keys = ["l", "str", "hash", "list", "min", "new"]
    before = [snapshot(r, k) for k in keys], r.dbsize()
    c = Raw(server.port)
    for cmd, error in BAD:
        assert c.call(*cmd) == ReplyError(error), cmd
    c.close()
    assert ([snapshot(r, k) for k in keys], r.dbsize()) == before
    assert waiters(r) == 0


# ---------------------------------------------------------------------------------------
# Interop with Redisson's scripts on the same names (both directions)


@pytest.mark.parametrize("name", ["l", "{app}:l"])
def test_a_java_waiter_is_woken_with_0_by_a_module_count_down(server, name):
    """Redisson's await: subscribe, then wait while getCount() > 0 for a `0` message."""
    r = server.client()
    java = RedissonCountDownLatch(server.client(), name)
    p = subscriber(server.client(), java.channel)
    assert latch(r, "RLATCH.TRYSETCOUNT", name, 2) == 1
    assert next_message(p) == str(NEW_COUNT_MESSAGE).encode(), "Java awaiters keep waiting"
    assert java.get_count() == 2
    latch(r, "RLATCH.COUNTDOWN", name)
    no_message(p)
    latch(r, "RLATCH.COUNTDOWN", name)
    assert next_message(p) == str(ZERO_COUNT_MESSAGE).encode()
    assert java.get_count() == 0, "the Java awaiter's loop ends"


def test_module_awaiters_are_released_by_redissons_count_down_to_zero(server):
    r = server.client()
    java = RedissonCountDownLatch(server.client(), "l")
    assert java.try_set_count(2)
    assert latch(r, "RLATCH.GETCOUNT", "l") == 2
    assert latch(r, "RLATCH.TRYSETCOUNT", "l", 5) == 0, "Java's latch is the module's"
    conns = start_awaiters(server, "l", 50)
    java.count_down()
    assert all(not c.has_reply(0.05) for c in conns), "1 left: still closed"
    assert waiters(r) == 50
    java.count_down()  # DECR to 0, DEL, PUBLISH 0
    assert replies(conns) == [1] * 50
    assert waiters(r) == 0 and blocked_clients(r) == 0


def test_module_awaiters_are_released_by_redissons_delete(server):
    r = server.client()
    java = RedissonCountDownLatch(server.client(), "l")
    latch(r, "RLATCH.TRYSETCOUNT", "l", 3)
    conns = start_awaiters(server, "l", 5)
    assert java.delete()
    assert replies(conns) == [1] * 5


def test_module_count_downs_and_redissons_share_one_count(server):
    r = server.client()
    java = RedissonCountDownLatch(server.client(), "l")
    java.try_set_count(4)
    java.count_down()
    assert latch(r, "RLATCH.COUNTDOWN", "l") == 2
    java.count_down()
    assert java.get_count() == 1
    p = subscriber(server.client(), java.channel)
    assert latch(r, "RLATCH.COUNTDOWN", "l") == 0
    assert next_message(p) == b"0"
