"""Redisson interop: its own lock scripts and RLOCK commands on the same keys must exclude
each other, re-enter across each other, and wake each other's pub/sub waiters."""

import pytest

from conftest import someone_waits, wait_until
from redisson import Redisson, channel


def rlock(r, *args):
    return r.execute_command(*args)


def subscriber(r, key):
    p = r.pubsub()
    p.subscribe(channel(key))
    assert wait_until(lambda: p.get_message(timeout=0.1), what="subscribe confirmation")["type"] == "subscribe"
    return p


def next_message(p, timeout=3.0):
    return wait_until(lambda: p.get_message(timeout=0.1), timeout=timeout, what="a pub/sub message")


def test_a_redisson_lock_excludes_rlock_clients(r):
    java = Redisson(r, "k", "9f1c:1", lease=20_000)
    assert java.try_lock() is None
    ttl = rlock(r, "RLOCK.ACQUIRE", "k", "rust:1", 5_000)
    assert 15_000 < ttl <= 20_000
    assert rlock(r, "RLOCK.RELEASE", "k", "rust:1") is None
    assert r.hgetall("k") == {b"9f1c:1": b"1"}


def test_an_rlock_lock_excludes_redisson_clients(r):
    assert rlock(r, "RLOCK.ACQUIRE", "k", "rust:1", 20_000) is None
    java = Redisson(r, "k", "9f1c:1")
    assert 15_000 < java.try_lock() <= 20_000
    assert java.unlock() is None
    assert r.hgetall("k") == {b"rust:1": b"1"}


def test_reentry_counts_are_shared_between_the_two(r):
    owner = "9f1c:7"
    java = Redisson(r, "k", owner)
    assert java.try_lock() is None
    assert rlock(r, "RLOCK.ACQUIRE", "k", owner, 30_000) is None
    assert java.try_lock() is None
    assert r.hget("k", owner) == b"3"
    assert rlock(r, "RLOCK.RELEASE", "k", owner) == 0
    assert java.unlock() == 0
    assert rlock(r, "RLOCK.RELEASE", "k", owner) == 1
    assert r.exists("k") == 0


def test_an_rlock_release_wakes_a_redisson_subscriber(server):
    r = server.client()
    p = subscriber(server.client(), "k")
    rlock(r, "RLOCK.ACQUIRE", "k", "rust:1", 30_000)
    rlock(r, "RLOCK.ACQUIRE", "k", "rust:1", 30_000)
    assert rlock(r, "RLOCK.RELEASE", "k", "rust:1") == 0
    assert p.get_message(timeout=0.2) is None, "no message while still held"
    assert rlock(r, "RLOCK.RELEASE", "k", "rust:1") == 1
    msg = next_message(p)
    assert (msg["type"], msg["channel"], msg["data"]) == ("message", b"redisson_lock__channel:{k}", b"0")
    p.close()


def test_rlock_forcerelease_wakes_a_redisson_subscriber(server):
    r = server.client()
    p = subscriber(server.client(), "k")
    Redisson(r, "k", "9f1c:1").try_lock()
    assert rlock(r, "RLOCK.FORCERELEASE", "k") == 1
    assert next_message(p)["data"] == b"0"
    p.close()


def test_a_redisson_unlock_is_heard_on_the_same_channel(server):
    r = server.client()
    p = subscriber(server.client(), "k")
    java = Redisson(r, "k", "9f1c:1")
    java.try_lock()
    assert java.unlock() == 1
    assert next_message(p)["channel"] == b"redisson_lock__channel:{k}"
    p.close()


def test_keys_with_braces_use_the_key_itself_as_the_channel_suffix(server):
    r = server.client()
    p = subscriber(server.client(), "{app}:lock")
    rlock(r, "RLOCK.ACQUIRE", "{app}:lock", "rust:1", 30_000)
    rlock(r, "RLOCK.RELEASE", "{app}:lock", "rust:1")
    assert next_message(p)["channel"] == b"redisson_lock__channel:{app}:lock"
    p.close()


def test_a_redisson_unlock_hands_the_lock_to_an_rlock_waiter(server):
    """Redisson's unlock deletes the key; the module notices and serves its queue."""
    import threading

    r = server.client()
    java = Redisson(r, "k", "9f1c:1")
    java.try_lock()
    got = {}
    waiter = server.client()
    t = threading.Thread(target=lambda: got.update(
        reply=waiter.execute_command("RLOCK.ACQUIRE", "k", "rust:2", 30_000, "WAIT", 10_000)))
    t.start()
    wait_until(lambda: (rlock(r, "RLOCK.INFO", "k") or [0] * 6)[5] == 1, what="waiter queued")
    assert java.unlock() == 1
    t.join(10)
    assert not t.is_alive() and got["reply"] is None
    assert r.hgetall("k") == {b"rust:2": b"1"}
    # The Redisson client, arriving later, is excluded by the handed-off lock.
    assert Redisson(r, "k", "9f1c:2").try_lock() > 0


FREEING_WAYS = {
    "expiry": lambda r: r.pexpire("k", 1),
    "DEL": lambda r: r.delete("k"),
    "UNLINK": lambda r: r.unlink("k"),
    "FLUSHDB": lambda r: r.flushdb(),
    "FLUSHALL": lambda r: r.flushall(),
    "overwrite by SET": lambda r: r.set("k", "v"),
    "RENAME away": lambda r: r.rename("k", "elsewhere"),
}


@pytest.mark.parametrize("way", FREEING_WAYS, ids=list(FREEING_WAYS))
def test_a_lock_freed_any_other_way_publishes_the_unlock_message(server, way):
    """While the module watches (somebody waits in it, for any key), a lock it wrote then
    gets its unlock message however it goes away."""
    r = server.client()
    someone_waits(server)
    p = subscriber(server.client(), "k")
    rlock(r, "RLOCK.ACQUIRE", "k", "rust:1", 30_000)
    FREEING_WAYS[way](r)
    msg = next_message(p)
    assert (msg["channel"], msg["data"]) == (b"redisson_lock__channel:{k}", b"0")
    assert p.get_message(timeout=0.2) is None, "published once"
    assert r.info("rlock")["rlock_tracked_locks"] == 0
    p.close()


@pytest.mark.parametrize("way", ["expiry", "DEL", "overwrite by SET"])
def test_with_nobody_waiting_a_lock_freed_any_other_way_publishes_nothing(server, way):
    """The documented bound of "nothing held while nobody waits": with no client waiting in
    the module it holds no event subscription, so a lock freed by expiry, DEL or overwrite
    gets no unlock message, as with Redisson itself (whose pub/sub waiters retry at the
    lease end they were told). A RELEASE still publishes."""
    r = server.client()
    p = subscriber(server.client(), "k")
    rlock(r, "RLOCK.ACQUIRE", "k", "rust:1", 30_000)
    assert r.info("rlock")["rlock_event_subscriptions"] == 0
    FREEING_WAYS[way](r)
    wait_until(lambda: r.type("k") != b"hash", what="the lock gone")
    r.ping()  # a turn of the event loop, where a zero-delay timer would have run
    assert p.get_message(timeout=0.3) is None
    r.delete("k")
    rlock(r, "RLOCK.ACQUIRE", "k", "rust:1", 30_000)
    rlock(r, "RLOCK.RELEASE", "k", "rust:1")
    msg = next_message(p)
    assert (msg["channel"], msg["data"]) == (b"redisson_lock__channel:{k}", b"0")
    p.close()


def test_touching_a_held_lock_or_deleting_a_plain_hash_publishes_nothing(server):
    r = server.client()
    p = subscriber(server.client(), "k")
    rlock(r, "RLOCK.ACQUIRE", "k", "rust:1", 30_000)
    r.pexpire("k", 60_000)
    r.hincrby("k", "rust:1", 1)
    r.hset("other", "f", 1)
    r.delete("other")
    assert p.get_message(timeout=0.3) is None
    assert r.hgetall("k") == {b"rust:1": b"2"}
    p.close()
