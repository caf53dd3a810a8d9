"""rlock.Lock against a module-loaded server: what redis-py's own suite does not cover —
waiting in the server (FIFO, handoff, waits longer than socket_timeout, a waiter whose
connection is killed), the watchdog, re-entry with an explicit token, non-lock values.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis
from conftest import client_kwargs, command, stat, wait_until
from redis.exceptions import LockError, LockNotOwnedError

import rlock


def test_it_is_what_redis_lock_returns_with_lock_class(r):
    lock = r.lock("k", timeout=5, lock_class=rlock.Lock)
    assert isinstance(lock, rlock.Lock)
    assert lock.acquire(blocking=False)
    assert r.hgetall("k") == {lock.local.token: b"1"}  # Redisson's layout
    assert 4000 < r.pttl("k") <= 5000
    lock.release()
    assert r.exists("k") == 0


@pytest.mark.module_only  # FIFO order and direct handoff
def test_waiters_are_served_in_arrival_order_with_direct_handoff(r):
    holder = r.lock("k", timeout=10, lock_class=rlock.Lock)
    assert holder.acquire(blocking=False)
    order: list[int] = []
    threads = []
    for i in range(5):
        def waiter(i=i):
            lock = r.lock("k", timeout=10, blocking_timeout=10, lock_class=rlock.Lock)
            assert lock.acquire()
            order.append(i)
            lock.release()
        t = threading.Thread(target=waiter)
        t.start()
        threads.append(t)
        # Each waiter queues in the server before the next one starts.
        wait_until(lambda: stat(r, "waiters") == i + 1, what=f"waiter {i} queued")
    handoffs = stat(r, "handoffs")
    holder.release()
    for t in threads:
        t.join(10)
    assert order == [0, 1, 2, 3, 4]
    assert stat(r, "handoffs") - handoffs == 5  # never freed in between: handed over


def test_a_wait_may_outlast_the_clients_socket_timeout(server, r):
    short = redis.Redis(port=server.port, socket_timeout=0.2, **client_kwargs())
    holder = r.lock("k", timeout=10, lock_class=rlock.Lock)
    assert holder.acquire(blocking=False)
    # Times out in the server after ~0.75 s, well past the 0.2 s socket timeout.
    lock = short.lock("k", timeout=10, blocking_timeout=0.8, thread_local=False,
                      lock_class=rlock.Lock)
    started = time.monotonic()
    assert lock.acquire() is False
    # Past the socket timeout (the point), and bounded; the envelope itself (never after
    # blocking_timeout) is redis-py's own test_blocking_timeout, run by redis_py_suite.
    assert 0.6 < time.monotonic() - started < 2
    # And is handed the lock after more than the socket timeout.
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(lock.acquire(blocking_timeout=5)))
    t.start()
    wait_until(lambda: stat(short, "waiters") == 1, what="waiter queued")
    time.sleep(0.4)  # on purpose: longer than the waiter's socket timeout
    holder.release()
    t.join(5)
    assert result == [True]
    assert lock.owned()
    lock.release()
    short.close()


@pytest.mark.module_only  # a waiter blocked in RLOCK.ACQUIRE
def test_a_waiter_whose_connection_dies_queues_again(r):
    holder = r.lock("k", timeout=10, lock_class=rlock.Lock)
    assert holder.acquire(blocking=False)
    waiter = r.lock("k", timeout=10, blocking_timeout=10, thread_local=False,
                    lock_class=rlock.Lock)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(waiter.acquire()))
    t.start()
    wait_until(lambda: stat(r, "waiters") == 1, what="waiter queued")
    # The ticket connection (the waiter's try went before it on a pool connection).
    blocked = [c for c in r.client_list() if c["cmd"] == "rlock.acquire"
               and c["name"] == rlock.TICKET_CONNECTION_NAME]
    assert len(blocked) == 1
    r.client_kill_filter(_id=blocked[0]["id"])
    # The client retries (same request id) on a new connection and queues again.
    wait_until(lambda: stat(r, "waiters") == 1 and any(
        c["cmd"] == "rlock.acquire" and c["id"] != blocked[0]["id"] for c in r.client_list()),
        what="waiter queued again")
    holder.release()
    t.join(10)
    assert result == [True]
    waiter.release()


def test_same_explicit_token_re_enters_and_each_acquire_needs_its_release(r):
    lock = r.lock("k", timeout=10, lock_class=rlock.Lock)
    assert lock.acquire(blocking=False, token="me")
    assert lock.acquire(blocking=False, token="me")
    assert r.hget("k", "me") == b"2"
    lock.release()
    assert lock.owned() and lock.local.token == b"me"  # one hold left: token kept
    lock.release()
    assert r.exists("k") == 0 and lock.local.token is None
    with pytest.raises(LockError):
        lock.release()


def test_a_fresh_token_is_not_re_entrant(r):
    lock = r.lock("k", timeout=10, lock_class=rlock.Lock)
    assert lock.acquire(blocking=False)
    assert not lock.acquire(blocking=False)  # like redis-py: a new token, so contended
    lock.release()


def test_a_non_lock_value_is_polled_like_redis_py_does(r):
    r.set("k", "someone else's")
    lock = r.lock("k", timeout=10, sleep=0.01, blocking_timeout=5, thread_local=False,
                  lock_class=rlock.Lock)
    result: list[bool] = []
    t = threading.Thread(target=lambda: result.append(lock.acquire()))
    t.start()
    wait_until(lambda: stat(r, "contended") >= 0 and t.is_alive(), what="acquire running")
    r.delete("k")
    t.join(5)
    assert result == [True]
    lock.release()


def test_the_watchdog_renews_until_release(r):
    lock = r.lock("k", lock_class=rlock.Lock)  # no timeout: watchdog mode
    lock.watchdog_timeout = 1.0  # renewed every 1/3 s (a shorter lease is lost on a busy machine)
    assert lock.acquire(blocking=False)
    renewals = stat(r, "renewals")
    # Held for three leases: only renewals can keep it.
    wait_until(lambda: stat(r, "renewals") - renewals >= 9, 15, what="nine renewals")
    assert lock.owned() and not lock.lost
    watchdog = lock._watchdog(lock.local.token)
    with pytest.raises(LockError):
        lock.extend(1)  # no timeout: as redis-py
    lock.release()
    wait_until(lambda: not watchdog.is_alive(), what="watchdog stopped")
    assert r.exists("k") == 0


def test_the_default_watchdog_lease_is_30_s(r):
    lock = r.lock("k", lock_class=rlock.Lock)
    assert lock.acquire(blocking=False)
    assert 29000 < r.pttl("k") <= 30000
    lock.release()


def test_the_watchdog_reports_a_lost_lock(r):
    lost: list[tuple] = []
    lock = rlock.Lock(r, "k", watchdog_timeout=0.3, on_lost=lambda *a: lost.append(a))
    assert lock.acquire(blocking=False)
    token = lock.local.token
    command(r, "RLOCK.FORCERELEASE", "k")
    wait_until(lambda: lost, what="on_lost called")
    assert lost == [("k", token)]
    assert lock.lost
    with pytest.raises(LockNotOwnedError):
        lock.release()
    assert not lock.lost and lock.local.token is None


def test_extend_adds_to_the_remaining_lease(r):
    lock = r.lock("k", timeout=10, lock_class=rlock.Lock)
    assert lock.acquire(blocking=False)
    r.pexpire("k", 2000)
    assert lock.extend(3)
    assert 4000 < r.pttl("k") <= 5100
    command(r, "RLOCK.FORCERELEASE", "k")
    with pytest.raises(LockNotOwnedError):
        lock.extend(3)
    with pytest.raises(LockNotOwnedError):
        lock.reacquire()


def test_raise_on_release_error_false_logs_instead(r, caplog):
    with rlock.Lock(r, "k", timeout=10, raise_on_release_error=False):
        command(r, "RLOCK.FORCERELEASE", "k")
    assert "no longer held" in caplog.text
    with pytest.raises(LockNotOwnedError):
        with rlock.Lock(r, "k", timeout=10):
            command(r, "RLOCK.FORCERELEASE", "k")


def test_a_failed_release_stops_the_watchdog(server, admin, r):
    lock = rlock.Lock(r, "k", watchdog_timeout=0.3)
    assert lock.acquire(blocking=False)
    watchdog = lock._watchdog(lock.local.token)
    admin.client_pause(2000, all=True)  # the release times out against a paused server...
    lock.redis = redis.Redis(port=server.port, socket_timeout=0.2, **client_kwargs())
    with pytest.raises(redis.exceptions.TimeoutError):
        lock.release()
    admin.client_unpause()
    wait_until(lambda: not watchdog.is_alive(), what="watchdog stopped")
    wait_until(lambda: r.exists("k") == 0, what="lease ran out")  # ...and nobody renews
