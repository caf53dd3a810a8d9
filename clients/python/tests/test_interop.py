"""Interop with Redisson, as the module suite proves it (tests/lock/test_redisson.py,
test_rwlock_interop.py, test_semaphore_interop.py, test_latch.py): Redisson's own Lua
scripts (transcribed in the module suite's tests/support/redisson*.py, imported from there) run
against the Python client on the same names, both ways, for each primitive. A client
waiter (a queued ticket) is served when Redisson lets go; Redisson is excluded while the
client holds, and gets in after the client lets go.
"""

from __future__ import annotations

import threading
import uuid

from conftest import stat, wait_until
from redisson import Redisson
from redisson_rw import RedissonFencedLock, RedissonReadWriteLock
from redisson_sync import RedissonCountDownLatch, RedissonPermitExpirableSemaphore
from redisson_sync import RedissonSemaphore

import rlock


def java_owner() -> str:
    """An owner id as Redisson makes one: ``<client uuid>:<thread id>``."""
    return f"{uuid.uuid4()}:1"


def in_thread(fn):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


def queued(r, n: int = 1) -> None:
    wait_until(lambda: stat(r, "waiters") == n, what=f"{n} waiter(s) queued")


def test_lock_both_ways(r):
    java = Redisson(r, "k", java_owner())
    assert java.try_lock() is None
    lock = r.lock("k", timeout=30, thread_local=False, lock_class=rlock.Lock)
    t, out = in_thread(lambda: lock.acquire(blocking_timeout=10))
    queued(r)
    assert java.unlock() == 1
    t.join(10)
    assert out == [True]
    assert isinstance(java.try_lock(), int)  # excluded by the client's hold
    lock.release()
    assert java.try_lock() is None


def test_read_write_lock_both_ways(r):
    java = RedissonReadWriteLock(r, "rw", java_owner())
    assert java.write_lock() is None
    rw = rlock.RwLock(r, "rw", timeout=30)
    t, out = in_thread(lambda: rw.read.acquire(blocking_timeout=10))
    queued(r)
    assert java.write_unlock() == 1
    t.join(10)
    assert out == [True]
    assert java.read_lock() is None  # readers share with Redisson's readers
    assert isinstance(RedissonReadWriteLock(r, "rw", java_owner()).write_lock(), int)
    assert java.read_unlock() == 0  # Redisson's answer while other readers hold
    rw.read.release()
    with rw.write:
        assert isinstance(java.read_lock(), int)
    assert java.read_lock() is None


def test_fenced_lock_tokens_interleave(r):
    java = RedissonFencedLock(r, "f", java_owner())
    first = java.try_lock_and_get_token()
    assert first is not None
    lock = rlock.FencedLock(r, "f", timeout=30)
    t, out = in_thread(lambda: lock.acquire(blocking_timeout=10))
    queued(r)
    assert java.unlock() == 1
    t.join(10)
    assert out == [True] and lock.token > first
    assert java.try_lock_and_get_token() is None
    lock.release()
    assert java.try_lock_and_get_token() > lock.token
    assert java.get_token() == lock.get_token()


def test_semaphore_both_ways(r):
    java = RedissonSemaphore(r, "s")
    assert java.try_set_permits(1)
    assert java.try_acquire()
    sem = rlock.Semaphore(r, "s")
    t, out = in_thread(lambda: sem.acquire(blocking_timeout=10))
    queued(r)
    java.release()
    t.join(10)
    assert out == [True]
    assert not java.try_acquire()
    sem.release()
    assert java.try_acquire() and java.available_permits() == 0


def test_expirable_semaphore_both_ways(r):
    java = RedissonPermitExpirableSemaphore(r, "p")
    assert java.try_set_permits(1)
    [java_permit] = java.try_acquire(lease_ms=30_000)
    sem = rlock.ExpirableSemaphore(r, "p")
    t, out = in_thread(lambda: sem.acquire(lease=30, blocking_timeout=10))
    queued(r)
    assert java.try_release(java_permit)
    t.join(10)
    permit = out[0]
    assert permit is not None and java.acquired_permits() == 1
    assert java.try_acquire(lease_ms=30_000) == []
    assert java.lease_time(permit.id.decode()) > 20_000
    assert java.try_release(permit.id.decode())  # Redisson releases the client's permit
    assert java.try_acquire(lease_ms=30_000) != []


def test_countdown_latch_both_ways(r):
    java = RedissonCountDownLatch(r, "l")
    assert java.try_set_count(2)
    latch = rlock.CountDownLatch(r, "l")
    t, out = in_thread(lambda: latch.wait(10))
    queued(r)
    java.count_down()
    assert latch.get_count() == 1
    assert latch.count_down() == 0
    t.join(10)
    assert out == [True] and java.get_count() == 0
    assert latch.try_set_count(1)
    t, out = in_thread(lambda: latch.wait(10))
    queued(r)
    java.count_down()  # Redisson's count-down opens the client's waiter
    t.join(10)
    assert out == [True]
