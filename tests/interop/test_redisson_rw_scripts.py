"""Checks tests/support/redisson_rw.py against a plain redis-server (no module): Redisson's own
read-write and fenced lock scripts must behave as docs/internals/redisson-layouts.md says, so that
the interop tests built on them later test the module against the real protocol."""

import pytest

from conftest import wait_until
from redisson_rw import (READ_UNLOCK_MESSAGE, UNLOCK_MESSAGE, RedissonFencedLock,
                         RedissonReadWriteLock, key_prefix, lock_channel, rw_channel,
                         timeout_key, token_key)


@pytest.fixture
def r(make_server):
    return make_server(module=False).client(decode_responses=True)


def subscriber(r, channel):
    p = r.pubsub()
    p.subscribe(channel)
    assert wait_until(lambda: p.get_message(timeout=0.1), what="subscribe confirmation")["type"] == "subscribe"
    return p


def next_message(p, timeout=3.0):
    return wait_until(lambda: p.get_message(timeout=0.1), timeout=timeout, what="a pub/sub message")


def no_message(p):
    assert p.get_message(timeout=0.2) is None


def test_names_follow_prefix_and_suffix_rules():
    assert rw_channel("rw") == "redisson_rwlock:{rw}"
    assert rw_channel("{app}:rw") == "redisson_rwlock:{app}:rw"
    assert timeout_key("rw", "u:1", 2) == "{rw}:u:1:rwlock_timeout:2"
    assert timeout_key("{app}:rw", "u:1", 1) == "{app}:rw:u:1:rwlock_timeout:1"
    assert key_prefix("rw", "u:1") == "{rw}"
    assert key_prefix("{app}:rw", "u:1") == "{app}:rw"
    assert token_key("f") == "redisson_lock_token:{f}"
    assert lock_channel("f") == "redisson_lock__channel:{f}"


def test_two_readers_share_and_exclude_a_writer(r):
    a = RedissonReadWriteLock(r, "rw", "ua:1", lease=20_000)
    b = RedissonReadWriteLock(r, "rw", "ub:1", lease=10_000)
    w = RedissonReadWriteLock(r, "rw", "uw:1", lease=5_000)
    assert a.read_lock() is None
    assert b.read_lock() is None
    assert r.hgetall("rw") == {"mode": "read", "ua:1": "1", "ub:1": "1"}
    # Each read hold has its own timeout key with that hold's lease; the hash lives as
    # long as the longest of them.
    assert 19_000 < r.pttl(timeout_key("rw", "ua:1", 1)) <= 20_000
    assert 9_000 < r.pttl(timeout_key("rw", "ub:1", 1)) <= 10_000
    assert r.get(timeout_key("rw", "ua:1", 1)) == "1"
    assert 19_000 < r.pttl("rw") <= 20_000
    ttl = w.write_lock()
    assert 19_000 < ttl <= 20_000
    assert "uw:1:write" not in r.hgetall("rw")


def test_read_reentry_adds_a_timeout_key_per_hold_and_unlock_removes_the_top_one(r):
    a = RedissonReadWriteLock(r, "rw", "ua:1", lease=5_000)
    assert a.read_lock() is None
    assert a.read_lock(lease=15_000) is None
    assert r.hget("rw", "ua:1") == "2"
    assert 14_000 < r.pttl(timeout_key("rw", "ua:1", 2)) <= 15_000
    assert r.pttl(timeout_key("rw", "ua:1", 1)) <= 5_000
    assert 14_000 < r.pttl("rw") <= 15_000, "main TTL = max(remaining, new lease)"
    # count 2 -> 1: hold :2's key goes; the hash is re-expired to the longest remaining hold.
    assert a.read_unlock() == 0
    assert r.exists(timeout_key("rw", "ua:1", 2)) == 0
    assert r.pttl("rw") <= 5_000
    p = subscriber(r, rw_channel("rw"))
    assert a.read_unlock() == 1
    assert r.exists("rw", timeout_key("rw", "ua:1", 1)) == 0
    assert next_message(p)["data"] == str(UNLOCK_MESSAGE)


def test_a_reader_leaving_others_replies_0_and_the_last_publishes_0(r):
    a = RedissonReadWriteLock(r, "rw", "ua:1")
    b = RedissonReadWriteLock(r, "rw", "ub:1")
    a.read_lock()
    b.read_lock()
    p = subscriber(r, rw_channel("rw"))
    assert a.read_unlock() == 0, "Redisson answers 0 while other readers hold the lock"
    assert r.hgetall("rw") == {"mode": "read", "ub:1": "1"}
    no_message(p)
    assert a.read_unlock() is None, "not held any more"
    assert b.read_unlock() == 1
    assert r.exists("rw") == 0
    assert next_message(p)["data"] == "0"


def test_write_lock_reenters_by_adding_its_lease_and_publishes_1(r):
    w = RedissonReadWriteLock(r, "rw", "uw:1", lease=5_000)
    o = RedissonReadWriteLock(r, "rw", "uo:1")
    assert w.write_lock() is None
    assert r.hgetall("rw") == {"mode": "write", "uw:1:write": "1"}
    assert w.write_lock() is None
    assert 9_000 < r.pttl("rw") <= 10_000, "re-entry sets PTTL + lease, not lease"
    assert 9_000 < o.read_lock() <= 10_000
    assert 9_000 < o.write_lock() <= 10_000
    p = subscriber(r, rw_channel("rw"))
    assert w.write_unlock() == 0
    assert 4_000 < r.pttl("rw") <= 5_000, "a partial unlock re-arms the lease"
    assert w.write_unlock() == 1
    assert r.exists("rw") == 0
    assert next_message(p)["data"] == str(READ_UNLOCK_MESSAGE)


def test_the_writer_may_read_and_its_write_unlock_leaves_read_mode_silently(r):
    w = RedissonReadWriteLock(r, "rw", "uw:1", lease=5_000)
    assert w.write_lock() is None
    assert w.read_lock() is None
    assert r.hgetall("rw") == {"mode": "write", "uw:1:write": "1", "uw:1": "1"}
    assert r.exists(timeout_key("rw", "uw:1", 1)) == 1
    p = subscriber(r, rw_channel("rw"))
    assert w.write_unlock() == 1
    assert r.hgetall("rw") == {"mode": "read", "uw:1": "1"}
    no_message(p)
    assert w.read_unlock() == 1
    assert next_message(p)["data"] == "0"


def test_a_reader_asking_for_the_write_lock_just_gets_a_ttl(r):
    a = RedissonReadWriteLock(r, "rw", "ua:1", lease=5_000)
    a.read_lock()
    # Redisson's writer would wait on itself until the read lease runs out.
    assert 4_000 < a.write_lock() <= 5_000


def test_renew_rearms_every_timeout_key_and_the_hash(r):
    a = RedissonReadWriteLock(r, "rw", "ua:1", lease=2_000)
    a.read_lock()
    a.read_lock()
    assert a.read_renew(lease=30_000) == [1]
    for key in a.timeout_keys():
        assert 29_000 < r.pttl(key) <= 30_000
    assert 29_000 < r.pttl("rw") <= 30_000
    stranger = RedissonReadWriteLock(r, "rw", "ux:1")
    assert stranger.read_renew() == [0]


def test_a_dead_readers_field_survives_while_another_renews(r):
    dead = RedissonReadWriteLock(r, "rw", "ud:1", lease=50)
    live = RedissonReadWriteLock(r, "rw", "ul:1", lease=5_000)
    w = RedissonReadWriteLock(r, "rw", "uw:1")
    dead.read_lock()
    live.read_lock()
    wait_until(lambda: r.exists(timeout_key("rw", "ud:1", 1)) == 0, what="dead hold's key expiry")
    assert live.read_renew() == [1]
    # The dead reader's field is still in the hash and the writer stays out: the
    # Redisson behaviour the module's per-hold leases fix (design.md 4.1).
    assert r.hget("rw", "ud:1") == "1"
    assert isinstance(w.write_lock(), int)


def test_unlock_latch_replays_the_first_reply(r):
    a = RedissonReadWriteLock(r, "rw", "ua:1")
    a.read_lock()
    assert a.read_unlock(request_id="req-1") == 1
    a.read_lock()
    assert a.read_unlock(request_id="req-1") == 1, "the latch answers without unlocking"
    assert r.hget("rw", "ua:1") == "1"


def test_force_unlock_works_only_in_its_mode(r):
    a = RedissonReadWriteLock(r, "rw", "ua:1")
    a.read_lock()
    p = subscriber(r, rw_channel("rw"))
    assert a.write_force_unlock() == 0
    assert a.read_force_unlock() == 1
    assert next_message(p)["data"] == "0"
    # The timeout keys are not deleted: they expire on their own.
    assert r.exists(timeout_key("rw", "ua:1", 1)) == 1
    a.write_lock()
    assert a.read_force_unlock() == 0
    assert a.write_force_unlock() == 1
    assert next_message(p)["data"] == "1"


def test_fenced_lock_increments_the_token_on_every_acquire_and_reentry(r):
    f = RedissonFencedLock(r, "f", "ua:1", lease=5_000)
    g = RedissonFencedLock(r, "f", "ub:1")
    assert f.get_token() is None
    assert f.try_lock_and_get_token() == 1
    assert f.try_lock_and_get_token() == 2, "re-entry issues a new token"
    assert r.hgetall("f") == {"ua:1": "2"}
    assert g.try_lock_and_get_token() is None
    ttl, token = g.last_reply
    assert 4_000 < ttl <= 5_000 and token == -1
    assert f.get_token() == 2
    assert r.pttl(token_key("f")) == -1, "the token key never expires"
    p = subscriber(r, lock_channel("f"))
    assert f.unlock() == 0
    assert f.unlock() == 1
    assert next_message(p)["data"] == "0"
    assert g.try_lock() is None, "lock()/tryLock() also increment the token"
    assert g.get_token() == 3
    assert f.try_lock() > 0
    assert g.get_token() == 3, "a refused acquire issues no token"


def test_java_tokens_continue_from_a_clock_based_token(r):
    # The module writes max(last + 1, now_ms << 10) with SET; Redisson's INCR must go on
    # from there, so Java clients on the same name still see increasing tokens.
    hlc = 1_700_000_000_000 << 10
    r.set(token_key("f"), hlc)
    f = RedissonFencedLock(r, "f", "ua:1")
    assert f.try_lock_and_get_token() == hlc + 1
    assert f.try_lock_and_get_token() == hlc + 2
    assert f.get_token() == hlc + 2


def test_tokens_above_2_pow_53_come_back_rounded_through_lua(r):
    # Why the module's clock shift is 10 bits, not 16: the script returns INCR's result
    # as a Lua number (a double).
    big = 1_700_000_000_000 << 16
    r.set(token_key("f"), big)
    f = RedissonFencedLock(r, "f", "ua:1")
    assert f.try_lock_and_get_token() == big, "big + 1 rounded down to a multiple of 16"
    assert f.get_token() == big + 1, "the key itself is exact"
