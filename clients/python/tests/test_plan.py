"""The pure decisions of rlock._plan: one table per function."""

import pytest

from rlock import _plan
from rlock._plan import Wait


@pytest.mark.parametrize("blocking, stop_at, sleep, now, expected", [
    # Non-blocking: one try, never WAIT.
    (False, None, 0.1, 0.0, Wait(None)),
    (False, 5.0, 0.1, 0.0, Wait(None)),
    # No deadline: wait in the server without limit.
    (True, None, 0.1, 0.0, Wait(0)),
    # A deadline: the client's wait ends a quarter of a sleep before it.
    (True, 0.4, 0.05, 0.0, Wait(387)),
    (True, 10.0, 0.1, 4.0, Wait(5975)),
    # Less than a quarter of a sleep left (redis-py's "sleep > blocking_timeout"): one try.
    (True, 1.0, 60, 0.0, Wait(None)),
    (True, 0.02, 0.1, 0.0, Wait(None)),
    (True, 1.0, 0.1, 2.0, Wait(None)),
])
def test_it_plans_the_wait_within_the_deadline(blocking, stop_at, sleep, now, expected):
    assert _plan.plan_wait(blocking, stop_at, sleep, now) == expected


def test_the_servers_wait_ends_inside_redis_pys_last_sleep():
    # redis-py's test_blocking_timeout: bt 0.2, sleep 0.05, an answer in (0.15, 0.2].
    wait = _plan.plan_wait(True, 0.2, 0.05, 0.0).ms
    assert wait == 187 and 150 < wait - _plan.lead_ms(0.05) < wait


@pytest.mark.parametrize("timeout, watchdog, expected", [
    (10, 30, 10000),
    (9.5, 30, 9500),
    (0.0001, 30, 1),       # never a zero lease
    (None, 30, 30000),     # watchdog mode
    (0, 30, 30000),        # redis-py treats 0 as no timeout
    (None, 0.3, 300),
])
def test_it_picks_the_lease(timeout, watchdog, expected):
    assert _plan.lease_ms(timeout, watchdog) == expected


@pytest.mark.parametrize("pttl, add, replace, expected", [
    (8000, 10000, False, 18000),
    (8000, 10000, True, 10000),
    (-2, 10000, False, None),   # no key: nothing to extend
    (-1, 10000, False, None),   # no TTL: not an rlock lock
    (-2, 10000, True, 10000),   # replacing needs no TTL; RENEW checks the owner
])
def test_it_computes_the_extended_lease(pttl, add, replace, expected):
    assert _plan.extended_lease(pttl, add, replace) == expected


def test_it_builds_the_calls():
    assert _plan.acquire_args("k", b"t", 30000, Wait(None), "id1") == [
        "RLOCK.ACQUIRE", "k", b"t", 30000, "ID", "id1"]
    assert _plan.acquire_args("k", b"t", 30000, Wait(0), "id1") == [
        "RLOCK.ACQUIRE", "k", b"t", 30000, "WAIT", 0, "ID", "id1"]
    assert _plan.release_args("k", b"t", 500, "id2") == [
        "RLOCK.RELEASE", "k", b"t", 500, "ID", "id2"]
    assert _plan.renew_args("k", b"t", 500) == ["RLOCK.RENEW", "k", b"t", 500]


# not_a_lock against every error text of the module: test_vectors.py (spec/vectors).


def test_tokens_and_request_ids_are_fresh():
    assert _plan.new_token() != _plan.new_token()
    assert isinstance(_plan.new_token(), bytes)
    assert _plan.new_request_id() != _plan.new_request_id()


class _Pool5:
    def get_connection(self, command_name, *keys, **options): ...


class _Pool6:
    def get_connection(self, command_name=None, *keys, **options): ...


@pytest.mark.parametrize("pool, expected", [
    (_Pool5(), ("RLOCK.ACQUIRE",)),  # redis-py 5: the command name is required
    (_Pool6(), ()),                  # redis-py 6: passing it is deprecated
])
def test_it_calls_get_connection_as_the_installed_redis_py_wants(pool, expected):
    assert _plan.get_connection_args(pool, "RLOCK.ACQUIRE") == expected
