"""Redisson's RFairLock and its 4.4+ non-reentrant locks on the same names as rlock, beside
the module and beside scripts mode (RLock's own scripts on a server without the module).
What docs/migrating-from-redisson.md says, each a test: the non-reentrant RLock shares
RLock's keys, channel and unlock, so it mixes with rlock like RLock (supported); RFairLock
keeps mutual exclusion beside rlock but neither its order nor its waiters' wake-ups, so
it must not share names with rlock. Scripts from tests/support/redisson_fair.py."""

import time

import pytest

from conftest import wait_until
from redisson import Redisson, channel
from redisson_fair import (REENTRY_ERROR, RedissonFairLock, RedissonNonReentrantLock)

LEASE = 30_000


def now_ms():
    return int(time.time() * 1000)


def subscribe(r, name):
    p = r.pubsub()
    p.subscribe(name)
    assert wait_until(lambda: p.get_message(timeout=0.1), what="subscribed")["type"] == "subscribe"
    return p


# ---- the non-reentrant RLock: mixes like RLock ----------------------------------------

def test_a_non_reentrant_lock_and_rlock_exclude_each_other(r):
    java = RedissonNonReentrantLock(r, "k", "9f1c:1")
    assert java.try_lock() is None
    assert 25_000 < r.execute_command("RLOCK.ACQUIRE", "k", "rust:1", LEASE) <= LEASE
    with pytest.raises(Exception, match=REENTRY_ERROR):
        java.try_lock()
    assert Redisson(r, "k", "9f1c:1").unlock() == 1, "RLock's unlock script is its unlock"
    assert r.execute_command("RLOCK.ACQUIRE", "k", "rust:1", LEASE) is None
    assert 25_000 < java.try_lock() <= LEASE


def test_a_non_reentrant_waiter_is_woken_by_a_module_release_and_gets_its_turn(server):
    """Its waiter listens on RLock's channel: a release wakes it, and with module waiters
    queued the release leaves it a turn (design.md 1.8)."""
    r = server.client()
    r.config_set("rlock.script-waiter-grace-ms", 2_000)
    p = subscribe(server.client(), channel("k"))
    java = RedissonNonReentrantLock(server.client(), "k", "9f1c:1")
    assert r.execute_command("RLOCK.ACQUIRE", "k", "rust:1", LEASE) is None
    assert java.try_lock() > 0
    queued = server.client()
    assert queued.execute_command("RLOCK.ACQUIRE", "k", "rust:2", LEASE, "WAIT", 0, "ASYNC",
                                "ID", "q1") == b"QUEUED"
    assert r.execute_command("RLOCK.RELEASE", "k", "rust:1") == 1
    assert wait_until(lambda: p.get_message(timeout=0.1), what="the unlock message")["data"] == b"0"
    assert java.try_lock() is None
    assert r.hgetall("k") == {b"9f1c:1": b"1"}
    p.close()


def test_a_non_reentrant_lock_beside_scripts_mode(make_server):
    """Scripts mode runs RLock's scripts: the two exclude each other on a plain server."""
    r = make_server(module=False).client()
    java = RedissonNonReentrantLock(r, "k", "9f1c:1")
    rlock_scripts = Redisson(r, "k", "py:1")
    assert java.try_lock() is None
    assert rlock_scripts.try_lock() > 0
    assert Redisson(r, "k", "9f1c:1").unlock() == 1
    assert rlock_scripts.try_lock() is None
    assert java.try_lock() > 0


# ---- RFairLock: exclusion holds, order and wake-ups do not ----------------------------

def test_a_fair_lock_and_rlock_still_exclude_each_other(r):
    fair = RedissonFairLock(r, "k", "9f1c:1")
    assert fair.try_lock(now_ms()) is None
    assert 25_000 < r.execute_command("RLOCK.ACQUIRE", "k", "rust:1", LEASE) <= LEASE
    assert fair.unlock(now_ms()) == 1
    assert r.execute_command("RLOCK.ACQUIRE", "k", "rust:1", LEASE) is None
    other = RedissonFairLock(r, "k", "9f1c:2")
    assert other.try_lock(now_ms()) > 0, "refused, and queued in the fair queue"
    assert r.lrange(other.queue, 0, -1) == [b"9f1c:2"]


def test_the_module_passes_a_fair_lock_queue(r):
    """The fair queue lives in keys the module does not read: a fair waiter at its head,
    just woken on its own channel, loses the lock to an RLOCK client that asks first."""
    first = RedissonFairLock(r, "k", "9f1c:1")
    second = RedissonFairLock(r, "k", "9f1c:2")
    assert first.try_lock(now_ms()) is None
    assert second.try_lock(now_ms()) > 0
    p = subscribe(r, second.own_channel)
    assert first.unlock(now_ms()) == 1
    assert wait_until(lambda: p.get_message(timeout=0.1), what="its own wake-up")["data"] == b"0"
    assert r.execute_command("RLOCK.ACQUIRE", "k", "rust:1", LEASE) is None, "the module barges"
    assert second.try_lock(now_ms()) > 0, "the head of the fair queue waits again"
    p.close()


def test_a_fair_waiter_is_not_woken_by_a_module_release(server):
    """Its waiter listens on a channel of its own, which only RFairLock's unlock publishes
    on: a module release (with or without module waiters) tells it nothing, and it is no
    subscriber of the lock's channel, so the module leaves it no turn."""
    r = server.client()
    fair = RedissonFairLock(server.client(), "k", "9f1c:2")
    assert r.execute_command("RLOCK.ACQUIRE", "k", "rust:1", LEASE) is None
    assert fair.try_lock(now_ms()) > 0
    p = subscribe(server.client(), fair.own_channel)
    assert r.execute_command("RLOCK.RELEASE", "k", "rust:1") == 1
    assert p.get_message(timeout=0.3) is None
    assert r.info("rlock")["rlock_script_turns"] == 0
    p.close()


def test_scripts_mode_passes_a_fair_lock_queue_too(make_server):
    """Scripts mode runs RLock's acquire script, which checks only the lock's hash."""
    r = make_server(module=False).client()
    first = RedissonFairLock(r, "k", "9f1c:1")
    second = RedissonFairLock(r, "k", "9f1c:2")
    assert first.try_lock(now_ms()) is None
    assert second.try_lock(now_ms()) > 0
    assert first.unlock(now_ms()) == 1
    assert Redisson(r, "k", "py:1").try_lock() is None, "RLock's script barges"
    assert second.try_lock(now_ms()) > 0
