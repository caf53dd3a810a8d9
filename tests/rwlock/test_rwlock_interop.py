"""The read-write lock against Redisson's own scripts (tests/support/redisson_rw.py), both ways, on
the same names: a Java-style pub/sub waiter woken by a module release with the right
message, a module WAIT waiter served after a script release (7.0: keyspace events; Valkey:
the key event when the hash goes, or the queue's poll where the hash stays), and mixed
holders.
"""

import time

import pytest
import redis

from redisson_rw import READ_UNLOCK_MESSAGE, UNLOCK_MESSAGE, RedissonReadWriteLock, rw_channel, timeout_key
from test_rwlock import LONG, RW_READ_HELD, acq, info, rel, renew, rw_spawn  # noqa: F401 (fixture)
from conftest import wait_until

JAVA = "3f2a9c1e-0000-4000-8000-000000000001:1"


def subscribed(r, name):
    p = r.pubsub()
    p.subscribe(rw_channel(name))
    wait_until(lambda: p.get_message(timeout=0.05), what="subscribed")
    return p


def next_message(p, timeout=5):
    m = wait_until(lambda: p.get_message(ignore_subscribe_messages=True, timeout=0.05),
                   timeout, what="a message on the rw channel")
    return int(m["data"])


def test_a_java_waiter_hears_the_last_readers_release_and_gets_the_write_lock(r):
    java = RedissonReadWriteLock(r, "rw", JAVA)
    acq(r, "rw", "READ", "mod")
    assert java.write_lock() > 0, "the Java writer is kept out by the module's reader"
    p = subscribed(r, "rw")
    assert rel(r, "rw", "READ", "mod") == 1
    assert next_message(p) == UNLOCK_MESSAGE
    assert java.write_lock() is None, "its retry after the message succeeds"
    assert java.write_unlock() == 1
    assert next_message(p) == READ_UNLOCK_MESSAGE
    p.close()


def test_a_java_reader_hears_the_module_writers_release(r):
    java = RedissonReadWriteLock(r, "rw", JAVA)
    acq(r, "rw", "WRITE", "mod")
    assert java.read_lock() > 0
    p = subscribed(r, "rw")
    assert rel(r, "rw", "WRITE", "mod") == 1
    assert next_message(p) == READ_UNLOCK_MESSAGE
    assert java.read_lock() is None
    assert java.read_unlock() == 1
    assert next_message(p) == UNLOCK_MESSAGE
    p.close()


def test_force_release_publishes_the_sides_message(r):
    p = subscribed(r, "rw")
    acq(r, "rw", "READ", "a")
    r.execute_command("RRWLOCK.FORCERELEASE", "rw", "READ")
    assert next_message(p) == UNLOCK_MESSAGE
    acq(r, "rw", "WRITE", "w")
    r.execute_command("RRWLOCK.FORCERELEASE", "rw")
    assert next_message(p) == READ_UNLOCK_MESSAGE
    p.close()


def test_no_message_when_a_queued_module_writer_takes_the_lock(server, r, rw_spawn):
    acq(r, "rw", "READ", "a")
    w = rw_spawn(server, "rw", "WRITE", "w", queue_as=1)
    p = subscribed(r, "rw")
    rel(r, "rw", "READ", "a")
    w.granted()
    got = p.get_message(ignore_subscribe_messages=True, timeout=0.3)
    assert got is None, f"the lock never was free, yet {got!r} went out"
    p.close()


def test_a_module_waiter_is_served_after_a_java_writer_unlocks(server, r, rw_spawn):
    java = RedissonReadWriteLock(r, "rw", JAVA)
    assert java.write_lock() is None
    w = rw_spawn(server, "rw", "WRITE", "mod", queue_as=1)
    assert java.write_unlock() == 1  # the script deletes the hash
    w.granted(5)
    assert r.hgetall("rw") == {b"mode": b"write", b"mod:write": b"1"}


def test_module_readers_are_served_when_a_java_writer_leaves_but_keeps_reading(server, r, rw_spawn):
    java = RedissonReadWriteLock(r, "rw", JAVA)
    assert java.write_lock() is None
    assert java.read_lock() is None  # the writer may read
    r1 = rw_spawn(server, "rw", "READ", "r1", queue_as=1)
    r2 = rw_spawn(server, "rw", "READ", "r2", queue_as=2)
    # The script turns the hash to read mode in place: no key goes away.
    assert java.write_unlock() == 1
    assert r.hget("rw", "mode") == b"read"
    r1.granted(5)
    r2.granted(5)
    assert set(info(r, "rw")[b"readers"]) == {JAVA.encode(), b"r1", b"r2"}


def test_a_module_waiter_is_served_after_the_last_java_reader_unlocks(server, r, rw_spawn):
    a = RedissonReadWriteLock(r, "rw", JAVA)
    b = RedissonReadWriteLock(r, "rw", JAVA[:-1] + "2")
    assert a.read_lock() is None and b.read_lock() is None
    w = rw_spawn(server, "rw", "WRITE", "mod", queue_as=1)
    assert a.read_unlock() == 0  # another reader is left
    assert w.is_alive()
    assert b.read_unlock() == 1
    w.granted(5)


def test_mixed_holders_on_one_name(server, r, rw_spawn):
    java = RedissonReadWriteLock(r, "rw", JAVA)
    assert java.read_lock() is None
    assert acq(r, "rw", "READ", "mod") is None, "module reader joins a Java reader"
    assert r.hgetall("rw")[b"mode"] == b"read"
    assert r.exists(timeout_key("rw", "mod", 1)) and r.exists(timeout_key("rw", JAVA, 1))
    w = rw_spawn(server, "rw", "WRITE", "w", queue_as=1)
    # Java's script still lets a reader in (Redisson has no queue); the module doesn't.
    assert acq(r, "rw", "READ", "late") > 0
    assert rel(r, "rw", "READ", "mod") == 1
    assert w.is_alive()
    assert java.read_unlock() == 1
    w.granted(5)
    # The module writer's lock is Redisson's: a Java writer is kept out, a Java
    # force-unlock frees it.
    assert java.write_lock() > 0
    assert java.write_force_unlock() == 1
    assert not r.exists("rw")


def test_module_commands_release_and_renew_a_java_readers_holds(r):
    java = RedissonReadWriteLock(r, "rw", JAVA, lease=5_000)
    assert java.read_lock() is None and java.read_lock() is None
    assert renew(r, "rw", "READ", JAVA, 60_000) == 1
    for k in java.timeout_keys():
        assert r.pttl(k) > 50_000
    assert rel(r, "rw", "READ", JAVA) == 0
    assert java.read_unlock() == 1, "the script finds the module's state consistent"
    assert not r.exists("rw")


def test_java_scripts_release_module_holds(r):
    java = RedissonReadWriteLock(r, "rw", JAVA)
    acq(r, "rw", "READ", JAVA)
    acq(r, "rw", "READ", JAVA)
    assert java.read_unlock() == 0
    assert java.read_unlock() == 1
    assert not r.exists("rw") and not r.keys("{rw}*")
    acq(r, "rw", "WRITE", JAVA)
    assert java.write_unlock() == 1
    assert not r.exists("rw")


def test_a_dead_java_reader_ends_at_its_lease_while_a_module_reader_renews(server, r, rw_spawn):
    java = RedissonReadWriteLock(r, "rw", JAVA, lease=300)
    assert java.read_lock() is None
    acq(r, "rw", "READ", "live", 2_000)
    w = rw_spawn(server, "rw", "WRITE", "w", queue_as=1)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        renew(r, "rw", "READ", "live", 2_000)
        time.sleep(0.05)
    assert r.hgetall("rw") == {b"mode": b"read", b"live": b"1"}
    rel(r, "rw", "READ", "live")
    w.granted(5)


def test_a_queued_writer_that_started_reading_through_a_script_is_refused(server, r, rw_spawn):
    acq(r, "rw", "READ", "a")
    u = rw_spawn(server, "rw", "WRITE", "u", queue_as=1)
    # Redisson's script has no queue: owner u reads the read-held lock behind the module.
    assert RedissonReadWriteLock(r, "rw", "u").read_lock() is None
    rel(r, "rw", "READ", "a")
    u.join(5)
    assert not u.is_alive()
    assert isinstance(u.error, redis.ResponseError) and str(u.error) == RW_READ_HELD
    assert info(r, "rw")[b"waiters"] == 0
    assert r.hgetall("rw") == {b"mode": b"read", b"u": b"1"}
