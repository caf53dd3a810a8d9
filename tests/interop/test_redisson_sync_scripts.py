"""Checks tests/support/redisson_sync.py against a plain redis-server (no module): Redisson's own
semaphore, permit-expirable semaphore and countdown latch scripts must behave as
docs/internals/redisson-sync-layouts.md says, so that the interop tests built on them later test the
module against the real protocol. Time moves through the scripts' `now` argument, not
through sleeps."""

import re

import pytest

from conftest import wait_until
from redisson_sync import (NEW_COUNT_MESSAGE, NON_EXPIRABLE, ZERO_COUNT_MESSAGE,
                           RedissonCountDownLatch, RedissonPermitExpirableSemaphore,
                           RedissonSemaphore, latch_channel, now_ms, semaphore_channel,
                           timeout_name)


@pytest.fixture
def r(make_server):
    # Bytes, not text: the permit zset's members are raw random bytes.
    return make_server(module=False).client()


def subscriber(r, channel):
    p = r.pubsub()
    p.subscribe(channel)
    assert wait_until(lambda: p.get_message(timeout=0.1), what="subscribe confirmation")["type"] == "subscribe"
    return p


def next_message(p, timeout=3.0):
    return wait_until(lambda: p.get_message(timeout=0.1), timeout=timeout, what="a pub/sub message")["data"]


def no_message(p):
    assert p.get_message(timeout=0.2) is None


def test_names_follow_redissons_rules():
    assert semaphore_channel("s") == "redisson_sc:{s}"
    assert semaphore_channel("{app}:s") == "redisson_sc:{app}:s"
    assert timeout_name("s") == "{s}:timeout"
    assert timeout_name("{app}:s") == "{app}:s:timeout"
    assert latch_channel("l") == "redisson_countdownlatch__channel__{l}"
    # The latch channel ignores the prefixName rule: a tagged name gets a second brace.
    assert latch_channel("{app}:l") == "redisson_countdownlatch__channel__{{app}:l}"


# ---- RSemaphore ----------------------------------------------------------------------

def test_semaphore_try_set_permits_creates_a_string_and_publishes_the_permits(r):
    s = RedissonSemaphore(r, "s")
    p = subscriber(r, s.channel)
    assert s.try_set_permits(3)
    assert r.get("s") == b"3" and r.type("s") == b"string" and r.pttl("s") == -1
    assert next_message(p) == b"3"
    assert not s.try_set_permits(5), "only on a missing key"
    assert r.get("s") == b"3"
    no_message(p)
    t = RedissonSemaphore(r, "t")
    assert t.try_set_permits(2, ttl_ms=10_000)
    assert 9_000 < r.pttl("t") <= 10_000


def test_semaphore_acquire_decrements_and_release_publishes_the_new_count(r):
    s = RedissonSemaphore(r, "s")
    assert not s.try_acquire(1), "no key: no permits"
    assert r.exists("s") == 0
    s.try_set_permits(3)
    p = subscriber(r, s.channel)
    assert s.try_acquire(2)
    assert r.get("s") == b"1"
    assert not s.try_acquire(2)
    assert s.try_acquire(0), "Java answers 0 permits without a call"
    no_message(p)
    s.release(2)
    assert r.get("s") == b"3"
    assert next_message(p) == b"3", "the message is the count after INCRBY"
    assert s.available_permits() == 3


def test_semaphore_release_creates_the_key_and_release_if_exists_does_not(r):
    s = RedissonSemaphore(r, "s")
    assert not s.release_if_exists(1)
    assert r.exists("s") == 0
    s.release(2)
    assert r.get("s") == b"2"


def test_semaphore_acquire_and_release_keep_the_ttl_add_and_drain_drop_it(r):
    s = RedissonSemaphore(r, "s")
    s.try_set_permits(5, ttl_ms=10_000)
    s.try_acquire(1)
    s.release(1)
    assert r.pttl("s") > 9_000
    p = subscriber(r, s.channel)
    s.add_permits(2)
    assert r.get("s") == b"7" and r.pttl("s") == -1, "addPermits uses SET"
    assert next_message(p) == b"7", "the message is the new count"
    r.pexpire("s", 10_000)
    assert s.drain_permits() == 7
    assert r.get("s") == b"0" and r.pttl("s") == -1, "drainPermits uses SET 0"
    assert s.drain_permits() == 0
    assert RedissonSemaphore(r, "none").drain_permits() == 0
    assert r.exists("none") == 0


def test_semaphore_add_permits_may_go_negative(r):
    s = RedissonSemaphore(r, "s")
    s.try_set_permits(1)
    p = subscriber(r, s.channel)
    s.add_permits(-3)
    assert r.get("s") == b"-2"
    assert next_message(p) == b"-2", "published even when negative"
    assert not s.try_acquire(1)
    RedissonSemaphore(r, "new").add_permits(4)
    assert r.get("new") == b"4"


# ---- RPermitExpirableSemaphore ---------------------------------------------------------

def test_expirable_acquire_stores_raw_id_bytes_with_the_expiry_as_score(r):
    s = RedissonPermitExpirableSemaphore(r, "e")
    assert s.try_set_permits(2)
    p = subscriber(r, s.channel)
    t = now_ms()
    [pid] = s.try_acquire(lease_ms=5_000, now=t)
    assert re.fullmatch(r"[0-9a-f]{32}", pid), "16 random bytes, lowercase hex"
    assert s.last_reply == b"OK"
    assert r.get("e") == b"1"
    assert r.type("{e}:timeout") == b"zset"
    assert r.zrange("{e}:timeout", 0, -1, withscores=True) == [(bytes.fromhex(pid), t + 5_000)]
    [forever] = s.try_acquire(now=t)
    assert r.zscore("{e}:timeout", bytes.fromhex(forever)) == NON_EXPIRABLE
    no_message(p)
    assert s.lease_time(pid, now=t + 1_000) == 4_000
    assert s.lease_time(forever, now=t) == -1
    assert s.acquired_permits(now=t) == 2 and s.get_permits(now=t) == 2


def test_expirable_acquire_of_several_permits_adds_one_member_each(r):
    s = RedissonPermitExpirableSemaphore(r, "e")
    s.try_set_permits(3)
    ids = s.try_acquire(permits=2, lease_ms=1_000)
    assert len(ids) == 2 and r.zcard("{e}:timeout") == 2 and r.get("e") == b"1"
    assert s.try_acquire(permits=2) == []


def test_expirable_refusal_reports_the_earliest_expiry_unless_none_expires(r):
    s = RedissonPermitExpirableSemaphore(r, "e")
    assert s.try_acquire(now=1_000) == [] and s.last_reply is None, "no key"
    s.try_set_permits(1)
    s.try_acquire(now=1_000)
    assert s.try_acquire(now=1_000) == [] and s.last_reply is None, "only non-expiring permits"
    s.add_permits(1)
    s.try_acquire(lease_ms=500, now=1_000)
    assert s.try_acquire(now=1_200) == []
    assert s.last_reply == b":1500"


def test_expirable_permit_returns_to_the_pool_exactly_at_its_lease_end(r):
    s = RedissonPermitExpirableSemaphore(r, "e")
    s.try_set_permits(1)
    t = now_ms()
    [pid] = s.try_acquire(lease_ms=100, now=t)
    p = subscriber(r, s.channel)
    assert s.available_permits(now=t + 99) == 0
    assert r.zcard("{e}:timeout") == 1
    no_message(p)
    assert s.available_permits(now=t + 100) == 1, "score <= now: reclaimed at the lease end"
    assert r.zcard("{e}:timeout") == 0 and r.get("e") == b"1"
    assert next_message(p) == b"1", "the reclaim publishes the new count"
    assert not s.try_release(pid, now=t + 100), "gone"
    no_message(p)


def test_expirable_try_acquire_reclaims_only_as_many_as_it_asks_for(r):
    s = RedissonPermitExpirableSemaphore(r, "e")
    s.try_set_permits(3)
    for _ in range(3):
        s.try_acquire(lease_ms=10, now=1_000)
    p = subscriber(r, s.channel)
    assert len(s.try_acquire(permits=1, now=2_000)) == 1
    assert next_message(p) == b"1"
    assert r.zcard("{e}:timeout") == 3, "2 expired left, 1 new"
    assert r.get("e") == b"0"
    assert s.available_permits(now=2_000) == 2, "the others wait for the next script"


def test_expirable_release_returns_the_permit_and_publishes_the_count(r):
    s = RedissonPermitExpirableSemaphore(r, "e")
    s.try_set_permits(2)
    t = now_ms()
    [a] = s.try_acquire(lease_ms=10_000, now=t)
    [b] = s.try_acquire(lease_ms=10, now=t)
    p = subscriber(r, s.channel)
    assert s.try_release(a, now=t + 1)
    assert r.get("e") == b"1"
    assert next_message(p) == b"1"
    assert not s.try_release(a, now=t + 1)
    no_message(p)
    # An expired permit nobody reclaimed yet: released (count +1, message) but answered 0.
    assert not s.try_release(b, now=t + 20)
    assert r.get("e") == b"2" and r.zcard("{e}:timeout") == 0
    assert next_message(p) == b"2"


def test_expirable_release_many_is_all_or_nothing_and_publishes_how_many(r):
    s = RedissonPermitExpirableSemaphore(r, "e")
    s.try_set_permits(3)
    ids = s.try_acquire(permits=3, lease_ms=10_000, now=1_000)
    p = subscriber(r, s.channel)
    assert s.try_release_many([ids[0], "00" * 16], now=1_000) == 0
    assert r.zcard("{e}:timeout") == 3
    no_message(p)
    assert s.try_release_many(ids[:2], now=1_000) == 2
    assert r.get("e") == b"2"
    assert next_message(p) == b"2"


def test_expirable_update_lease_time_moves_the_score(r):
    s = RedissonPermitExpirableSemaphore(r, "e")
    s.try_set_permits(1)
    [pid] = s.try_acquire(lease_ms=100, now=1_000)
    assert s.update_lease_time(pid, 5_000, now=1_050)
    assert r.zscore("{e}:timeout", bytes.fromhex(pid)) == 6_050
    assert s.update_lease_time(pid, -1, now=1_050)
    assert r.zscore("{e}:timeout", bytes.fromhex(pid)) == NON_EXPIRABLE
    assert not s.update_lease_time("ab" * 16, 100, now=1_050)
    s.update_lease_time(pid, 10, now=2_000)
    assert not s.update_lease_time(pid, 10_000, now=2_010), "expired: reclaimed first"
    assert r.get("e") == b"1"


def test_expirable_acquire_copies_the_count_keys_ttl_to_the_zset(r):
    s = RedissonPermitExpirableSemaphore(r, "e")
    s.try_set_permits(2)
    s.try_acquire()
    assert r.pttl("{e}:timeout") == -1
    r.pexpire("e", 20_000)
    s.try_acquire()
    assert 19_000 < r.pttl("{e}:timeout") <= 20_000


def test_expirable_add_publishes_the_delta_and_set_fixes_the_total(r):
    s = RedissonPermitExpirableSemaphore(r, "e")
    p = subscriber(r, s.channel)
    s.add_permits(3)
    assert r.get("e") == b"3"
    assert next_message(p) == b"3"
    s.try_acquire(now=1_000)
    s.add_permits(2)
    assert r.get("e") == b"4"
    assert next_message(p) == b"2", "the delta, not the count"
    s.add_permits(-1)
    no_message(p)
    s.set_permits(10)
    assert r.get("e") == b"9", "9 available + 1 acquired = 10"
    assert next_message(p) == b"10"
    s.set_permits(10)
    no_message(p)


# ---- RCountDownLatch -------------------------------------------------------------------

def test_latch_try_set_count_publishes_new_count_and_count_down_zero_at_zero(r):
    latch = RedissonCountDownLatch(r, "l")
    p = subscriber(r, latch.channel)
    assert latch.try_set_count(2)
    assert r.get("l") == b"2" and r.pttl("l") == -1
    assert next_message(p) == str(NEW_COUNT_MESSAGE).encode()
    assert not latch.try_set_count(5)
    latch.count_down()
    assert latch.get_count() == 1
    no_message(p)
    latch.count_down()
    assert r.exists("l") == 0 and latch.get_count() == 0
    assert next_message(p) == str(ZERO_COUNT_MESSAGE).encode()
    latch.count_down()
    assert r.exists("l") == 0, "DECR made -1, then the key went"
    no_message(p)


def test_latch_delete_publishes_new_count(r):
    latch = RedissonCountDownLatch(r, "{app}:l")
    latch.try_set_count(3)
    p = subscriber(r, "redisson_countdownlatch__channel__{{app}:l}")
    assert latch.delete()
    assert next_message(p) == b"1"
    assert not latch.delete()
    no_message(p)
