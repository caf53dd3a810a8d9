"""How a waiting acquire starts, against a real server with the module (the rule:
spec/vectors/waits.json, read by test_vectors.py): a handle that has not found its lock
held within the last second asks first without waiting, on the client's own connection,
and queues a ticket only if the lock is held; one that found it held lately queues at
once. Counted in the server: `INFO rlock` (``tickets_queued``, ``waiters``) and `INFO
commandstats` (the acquire commands it ran). First come, first served is kept: a try
never takes a lock that a queued waiter is owed.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List

import pytest
from conftest import clients_named, stat, wait_until

import rlock
import rlock.asyncio as arlock

pytestmark = pytest.mark.module_only


def calls(r: Any, command: str) -> int:
    """How many times the server ran ``command`` (INFO commandstats)."""
    stats = r.info("commandstats")
    return int(stats.get(f"cmdstat_{command.lower()}", {}).get("calls", 0))


#: Each waiting primitive: (a handle on "k" of client r, its acquire with a wait of
#: ``timeout`` seconds or None, returning whether it took it; its release).
def _lock(r: Any) -> tuple:
    h = rlock.Lock(r, "k", timeout=30, thread_local=False, replica_sync=None)
    return (lambda t: h.acquire(blocking_timeout=t)), h.release


def _fenced(r: Any) -> tuple:
    h = rlock.FencedLock(r, "k", timeout=30, replica_sync=None)
    return (lambda t: h.acquire(blocking_timeout=t)), h.release


def _rw(r: Any) -> tuple:
    h = rlock.RwLock(r, "k", timeout=30, replica_sync=None).write
    return (lambda t: h.acquire(blocking_timeout=t)), h.release


def _sem(r: Any) -> tuple:
    h = rlock.Semaphore(r, "k")
    h.try_set_permits(1)
    return (lambda t: h.acquire(blocking_timeout=t)), h.release


def _expirable(r: Any) -> tuple:
    h = rlock.ExpirableSemaphore(r, "k")
    h.try_set_permits(1)
    held: List[Any] = []

    def acquire(t: Any) -> bool:
        permit = h.acquire(lease=30, blocking_timeout=t)
        if permit is not None:
            held.append(permit)
        return permit is not None
    return acquire, (lambda: held.pop().release())


WAITERS = {"lock": (_lock, "rlock.acquire"), "fenced": (_fenced, "rfenced.acquire"),
           "rwlock": (_rw, "rrwlock.acquire"), "semaphore": (_sem, "rsemaphore.acquire"),
           "expirable": (_expirable, "rpsemaphore.acquire")}


@pytest.mark.parametrize("timeout", [None, 5], ids=["no-limit", "timed"])
@pytest.mark.parametrize("kind", sorted(WAITERS))
def test_an_uncontended_waiting_acquire_queues_no_ticket(r, kind, timeout):
    """Taken by its try, on the client's own connection: no ticket queued, no ticket
    connection opened, one acquire command per acquisition."""
    make, command = WAITERS[kind]
    acquire, release = make(r)
    queued, sent = stat(r, "tickets_queued"), calls(r, command)
    for _ in range(3):
        assert acquire(timeout)
        release()
    assert stat(r, "tickets_queued") == queued
    assert calls(r, command) == sent + 3
    assert clients_named(r, rlock._proto.CONNECTION_NAME) == 0


async def test_an_uncontended_asyncio_waiting_acquire_queues_no_ticket(r, ar):
    queued = stat(r, "tickets_queued")
    lock = arlock.Lock(ar, "k", timeout=30, replica_sync=None)
    sem = arlock.Semaphore(ar, "s")
    assert await sem.try_set_permits(1)
    for timeout in (None, 5):
        assert await lock.acquire(blocking_timeout=timeout)
        await lock.release()
        assert await sem.acquire(blocking_timeout=timeout)
        await sem.release()
    assert stat(r, "tickets_queued") == queued
    assert clients_named(r, rlock._proto.CONNECTION_NAME) == 0


def _in_thread(fn: Callable[[], Any]) -> tuple:
    out: List[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("kind", sorted(WAITERS))
def test_a_handle_that_had_to_queue_queues_at_once_within_the_second(r, kind):
    """Its first wait tries (held), then queues; handed the lock on release, it found it
    held, so its next wait within the second queues without a failed try first."""
    make, command = WAITERS[kind]
    h_acquire, h_release = make(r)
    w_acquire, w_release = make(r)
    assert h_acquire(None)
    queued, sent = stat(r, "tickets_queued"), calls(r, command)
    t, out = _in_thread(lambda: w_acquire(5))
    wait_until(lambda: stat(r, "tickets_queued") == queued + 1, what="the first ticket")
    assert calls(r, command) == sent + 2  # the try (held), then the ticket
    h_release()
    t.join(10)
    assert out == [True]
    # The grant's confirmation (or collect) is in before the release: a release that
    # overtook it would leave a confirmation for the next test's server to take.
    wait_until(lambda: calls(r, command) == sent + 3, what="the first grant confirmed")
    w_release()
    assert h_acquire(None)
    sent = calls(r, command)
    t, out = _in_thread(lambda: w_acquire(5))
    wait_until(lambda: stat(r, "tickets_queued") == queued + 2, what="the second ticket")
    assert calls(r, command) == sent + 1  # the ticket alone: no try first
    h_release()
    t.join(10)
    assert out == [True]
    wait_until(lambda: calls(r, command) == sent + 2, what="the second grant confirmed")
    w_release()


def test_a_try_that_finds_the_lock_held_queues_and_first_come_first_served_holds(r):
    """Fresh handles (no finding): each tries, finds it held, queues; the releases go in
    arrival order, and a later try (held: a queued waiter is owed it) never jumps the
    queue."""
    holder = rlock.Lock(r, "k", timeout=30, replica_sync=None)
    first = rlock.Lock(r, "k", timeout=30, replica_sync=None)
    second = rlock.Lock(r, "k", timeout=30, replica_sync=None)
    assert holder.acquire(blocking=False)
    order: List[str] = []

    def wait(name: str, lock: Any) -> None:
        assert lock.acquire(blocking_timeout=10)
        order.append(name)
        lock.release()

    t1, _ = _in_thread(lambda: wait("first", first))
    wait_until(lambda: stat(r, "waiters") == 1, what="the first waiter")
    t2, _ = _in_thread(lambda: wait("second", second))
    wait_until(lambda: stat(r, "waiters") == 2, what="the second waiter")
    late = rlock.Lock(r, "k", timeout=30, replica_sync=None)
    assert late.acquire(blocking_timeout=0.2) is False  # tried, queued, timed out
    holder.release()
    t1.join(10)
    t2.join(10)
    assert order == ["first", "second"]
    assert not r.exists("k")
