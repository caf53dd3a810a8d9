"""Writes fire the keyspace notifications of the equivalent plain commands and invalidate
WATCH like them; commands that change nothing do neither."""

import pytest
import redis

from conftest import wait_until


@pytest.fixture
def events(server):
    """Subscribes to every keyevent and returns a function draining (event, key) pairs."""
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


def test_acquire_release_notify_like_hset_hincrby_pexpire_del(server, events):
    r = server.client()
    r.execute_command("RLOCK.ACQUIRE", "k", "a", 1000)
    assert events(2) == [("hset", "k"), ("expire", "k")]
    r.execute_command("RLOCK.ACQUIRE", "k", "a", 1000)
    assert events(2) == [("hincrby", "k"), ("expire", "k")]
    r.execute_command("RLOCK.RELEASE", "k", "a")
    assert events(1) == [("hincrby", "k")]
    r.execute_command("RLOCK.RENEW", "k", "a", 5000)
    assert events(1) == [("expire", "k")]
    r.execute_command("RLOCK.RELEASE", "k", "a")
    assert events(1) == [("del", "k")]


def test_a_request_id_record_notifies_like_set_pxat(server, events):
    """The record is written as `SET <id key> <reply> PXAT <at>` would write it, so it fires
    what that command fires: "set", then "expire"."""
    r = server.client()
    r.execute_command("RLOCK.ACQUIRE", "k", "a", 1000, "ID", "r1")
    got = events(4)
    assert got[:2] == [("hset", "k"), ("expire", "k")]
    record = got[2][1]
    assert got[2:] == [("set", record), ("expire", record)]
    assert r.pttl(record) > 0


def test_commands_that_change_nothing_notify_nothing(server, events):
    r = server.client()
    r.hset("k", "a", 1)
    assert events(1) == [("hset", "k")]
    r.execute_command("RLOCK.ACQUIRE", "k", "b", 1000)
    r.execute_command("RLOCK.RELEASE", "k", "b")
    r.execute_command("RLOCK.RENEW", "k", "b", 1000)
    r.execute_command("RLOCK.INFO", "k")
    assert events(0) == []


def watched_exec(server, key, between):
    """Runs WATCH key; between(); MULTI/EXEC. True if EXEC ran (not invalidated)."""
    r = server.client()
    with r.pipeline() as pipe:
        pipe.watch(key)
        between(server.client())
        pipe.multi()
        pipe.set("marker", 1)
        try:
            pipe.execute()
            return True
        except redis.WatchError:
            return False


def test_writes_invalidate_watch(server):
    rlock = lambda *a: (lambda c: c.execute_command(*a))
    assert not watched_exec(server, "k", rlock("RLOCK.ACQUIRE", "k", "a", 1000))
    assert not watched_exec(server, "k", rlock("RLOCK.RENEW", "k", "a", 5000))
    assert not watched_exec(server, "k", rlock("RLOCK.RELEASE", "k", "a"))
    server.client().execute_command("RLOCK.ACQUIRE", "k", "a", 1000)
    assert not watched_exec(server, "k", rlock("RLOCK.FORCERELEASE", "k"))


def test_contended_and_refused_calls_leave_watch_intact(server):
    server.client().execute_command("RLOCK.ACQUIRE", "k", "a", 10_000)
    assert watched_exec(server, "k", lambda c: c.execute_command("RLOCK.ACQUIRE", "k", "b", 1000))
    assert watched_exec(server, "k", lambda c: c.execute_command("RLOCK.RELEASE", "k", "b"))
    assert watched_exec(server, "k", lambda c: c.execute_command("RLOCK.INFO", "k"))
