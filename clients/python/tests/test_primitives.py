"""The blocking primitives against a module-loaded server: RwLock, FencedLock, Semaphore,
ExpirableSemaphore (leases, watchdog, lost permits) and CountDownLatch, each waiting as a
queued ticket. The asyncio classes run the same logic (rlock._ops): test_async_primitives
covers their front end.
"""

from __future__ import annotations

import threading
import time

import pytest
from conftest import command, stat, wait_until
from redis.exceptions import LockError, LockNotOwnedError, ResponseError

import rlock


def run(fn):
    """Starts `fn` on a thread; returns (thread, results list)."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


# ---- FencedLock ---------------------------------------------------------------------------


def test_fenced_tokens_grow_with_every_acquire_and_handoff(r):
    a = rlock.FencedLock(r, "f", timeout=10)
    b = rlock.FencedLock(r, "f", timeout=10)
    assert a.acquire(blocking=False)
    first = a.token
    assert a.acquire(blocking=False) and a.token > first  # re-entry: a new, larger token
    assert not b.acquire(blocking=False) and b.token is None
    t, out = run(lambda: b.acquire(blocking_timeout=5))
    wait_until(lambda: stat(r, "waiters") == 1, what="b queued")
    a.release()
    assert r.exists("f")  # one hold left
    a.release()
    t.join(5)
    assert out == [True] and b.token > a.token
    assert b.get_token() == b.token
    assert r.hgetall("f") == {b.owner.encode(): b"1"}  # Redisson's layout
    b.release()
    with pytest.raises(LockError):
        b.release()


def test_fenced_release_of_a_lost_lock_raises(r):
    lock = rlock.FencedLock(r, "f", timeout=10)
    with pytest.raises(LockNotOwnedError):
        with lock:
            command(r, "RLOCK.FORCERELEASE", "f")


# ---- RwLock -------------------------------------------------------------------------------


@pytest.mark.module_only  # a queued writer goes first
def test_readers_share_and_a_writer_waits_for_them(r):
    a = rlock.RwLock(r, "rw", timeout=10)
    b = rlock.RwLock(r, "rw", timeout=10)
    w = rlock.RwLock(r, "rw", timeout=10)
    assert a.read.acquire(blocking=False) and b.read.acquire(blocking=False)
    assert not w.write.acquire(blocking=False)
    t, out = run(lambda: w.write.acquire(blocking_timeout=5))
    wait_until(lambda: stat(r, "waiters") == 1, what="writer queued")
    # A queued writer goes before readers that come after it (no writer starvation).
    assert not rlock.RwLock(r, "rw").read.acquire(blocking=False)
    a.read.release()
    b.read.release()
    t.join(5)
    assert out == [True]
    assert r.hget("rw", "mode") == b"write"
    with w.read:  # the writer may read
        assert r.hget("rw", w.owner) == b"1"
    w.write.release()
    assert not r.exists("rw")


def test_a_reader_asking_for_the_write_lock_is_refused_at_once(r):
    rw = rlock.RwLock(r, "rw", timeout=10)
    with rw.read:
        started = time.monotonic()
        with pytest.raises(rlock.errors.ReadHeld, match="release the read lock first") as e:
            rw.write.acquire(blocking_timeout=5)
        assert time.monotonic() - started < 1
        # A redis-py ResponseError all the same, its code word kept.
        assert isinstance(e.value, ResponseError) and e.value.code == "READHELD"


@pytest.mark.parametrize("code, cls", [
    ("BADLEASE", rlock.errors.BadArgument),
    ("NOTASEMAPHORE", rlock.errors.NotThisPrimitive),
    ("OVERFLOW", rlock.errors.Overflow),
    ("TOOMANYWAITERS", rlock.errors.TooManyWaiters),
    ("RLOCKBUG", rlock.errors.ModuleBug),
    ("INTERNALCMD", rlock.errors.InternalCommand),
])
def test_each_module_code_word_has_its_exception_class(code, cls):
    mapped = rlock.errors.module_error(ResponseError(f"{code} some text"))
    assert type(mapped) is cls and mapped.code == code and str(mapped) == f"{code} some text"
    plain = ResponseError("syntax error")  # redis-py's ERR: not the module's
    assert rlock.errors.module_error(plain) is plain


def test_a_bad_argument_is_raised_as_its_class(r):
    sem = rlock.Semaphore(r, "s")
    with pytest.raises(rlock.errors.BadArgument) as e:
        sem.try_set_permits(-1)
    assert e.value.code == "BADPERMITS"


def test_the_watchdog_renews_a_read_hold_and_reports_it_lost(r):
    lost = threading.Event()
    rw = rlock.RwLock(r, "rw", watchdog_timeout=1.0, on_lost=lost.set)
    assert rw.read.acquire()
    wait_until(lambda: stat(r, "rw_renewals") >= 6, 15, what="renewals")  # two leases
    assert rw.read.held and not rw.read.lost
    command(r, "RRWLOCK.FORCERELEASE", "rw")
    assert lost.wait(5) and rw.read.lost
    with pytest.raises(LockNotOwnedError):
        rw.read.release()


# ---- Semaphore ----------------------------------------------------------------------------


@pytest.mark.module_only  # FIFO order
def test_semaphore_counts_permits_and_serves_a_big_request_first(r):
    sem = rlock.Semaphore(r, "s")
    assert sem.try_set_permits(2) and not sem.try_set_permits(5)
    assert sem.acquire(2, blocking=False)
    t5, big = run(lambda: sem.acquire(2, blocking_timeout=5))
    wait_until(lambda: stat(r, "waiters") == 1, what="big request queued")
    t1, small = run(lambda: sem.acquire(1, blocking_timeout=5))
    wait_until(lambda: stat(r, "waiters") == 2, what="small request queued")
    assert sem.release(1) == 1
    time.sleep(0.1)  # on purpose: the small request must not jump the queue meanwhile
    assert big == [] and small == []
    sem.release(1)
    t5.join(5)
    assert big == [True] and small == []
    sem.release(2)
    t1.join(5)
    assert small == [True] and sem.available_permits() == 1
    assert sem.drain_permits() == 1 and sem.available_permits() == 0
    assert sem.add_permits(3) == 3
    with sem:
        assert sem.available_permits() == 2
    assert r.get("s") == b"3"  # Redisson's layout: a string count


def test_a_timed_out_semaphore_wait_returns_false_and_leaves_no_ticket(r):
    sem = rlock.Semaphore(r, "s")
    sem.try_set_permits(0)
    started = time.monotonic()
    assert sem.acquire(blocking_timeout=0.3) is False
    assert 0.25 < time.monotonic() - started < 2
    wait_until(lambda: stat(r, "waiters") == 0, what="the wait gone")
    assert sem.available_permits() == 0


# ---- ExpirableSemaphore -------------------------------------------------------------------


def test_an_expired_permit_goes_to_the_waiter_at_its_lease_end(r):
    sem = rlock.ExpirableSemaphore(r, "p")
    assert sem.try_set_permits(1)
    permit = sem.acquire(lease=0.3)
    assert len(permit.id) == 32 and sem.acquired_permits() == 1
    started = time.monotonic()
    second = sem.acquire(lease=10, blocking_timeout=5)
    assert second is not None and 0.2 < time.monotonic() - started < 2
    with pytest.raises(LockNotOwnedError):
        permit.release()  # expired: the work ran unprotected
    second.release()
    assert sem.available_permits() == 1


def test_a_permit_without_lease_is_renewed_and_reported_lost(r):
    sem = rlock.ExpirableSemaphore(r, "p", watchdog_timeout=1.0)
    sem.try_set_permits(2)
    lost = threading.Event()
    with sem.acquire(permits=2, on_lost=lost.set) as permit:
        assert len(permit.ids) == 2
        wait_until(lambda: stat(r, "psem_lease_updates") >= 6, 15, what="renewals")
        assert sem.acquired_permits() == 2 and not permit.lost
        assert sem.release(permit.ids[0]) is True  # taken away by someone else
        assert lost.wait(5) and permit.lost
        with pytest.raises(LockNotOwnedError):
            permit.release()
    assert sem.available_permits() == 2


def test_permit_lease_can_be_updated(r):
    sem = rlock.ExpirableSemaphore(r, "p")
    sem.try_set_permits(1)
    permit = sem.acquire(lease=10)
    assert permit.update_lease_time(60)
    assert 50_000 < command(r, "RPSEMAPHORE.LEASETIME", "p", permit.id) <= 60_000
    assert sem.acquire(lease=1, blocking=False) is None
    permit.release()


# ---- CountDownLatch -----------------------------------------------------------------------


def test_every_latch_waiter_is_released_when_the_count_reaches_zero(r):
    latch = rlock.CountDownLatch(r, "l")
    assert latch.try_set_count(2) and not latch.try_set_count(5)
    assert latch.wait(0) is False and latch.wait(0.1) is False
    waiters = [run(lambda: latch.wait(5)) for _ in range(5)]
    wait_until(lambda: stat(r, "waiters") == 5, what="five waiters queued")
    assert latch.count_down() == 1
    assert latch.get_count() == 1
    assert latch.count_down() == 0
    for t, out in waiters:
        t.join(5)
        assert out == [True]
    assert latch.wait() is True and not latch.delete()
