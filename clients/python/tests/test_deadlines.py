"""A timed wait ends by its own deadline, on the client's clock, and a grant that races
that deadline is taken or given back, never left held by a caller that was told no.

redis-py's asyncio `test_blocking_timeout` (redis_py_suite) failed on a loaded machine:
the ticket's wait used to end when the server's `timeout` message, and the collect that
followed it, had made their way back, each hop waiting for a CPU. Here the server is
frozen (`DEBUG SLEEP`) across the waiter's deadline, so that everything the server sends
comes late by the whole freeze: a client that ends its wait by its own clock is on time
regardless. The round trips before a wait (connecting, subscribing, `QUEUED`) count
against its deadline too: with the server paused (`CLIENT PAUSE ALL`) across them, a
fresh client's first wait and a wait whose `QUEUED` is late are told no in time, and a
lock that their command takes after the deadline is given back. The races are swept: a
release lands at offsets around the waiter's deadline, for the lock (held on its
`granted` message) and the semaphore (held on its message as well), threads and
asyncio. A fresh client's first call asks the server whether the module is loaded
(`RLOCK.HELLO`, mode ``auto``): before a timed wait, that probe is bounded by the wait's
deadline too, with the server's process stopped (SIGSTOP) across it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from typing import Any, Iterator, List

import pytest
import redis
import redis.asyncio
from conftest import stat, wait_until

import rlock
import rlock.asyncio as arlock

pytestmark = pytest.mark.module_only

#: As redis-py's test_blocking_timeout: a wait of BT with SLEEP, which must end within
#: (BT - SLEEP, BT] (redis-py's Lock gives up at its last poll before the deadline); its
#: 0.2 and 0.05 leave 12.5 ms to get a CPU after the client's own deadline, these 50 ms.
BT, SLEEP = 0.4, 0.2


def _freeze_once_queued(port: int, at: float, seconds: float) -> threading.Thread:
    """`DEBUG SLEEP seconds` on a connection of its own, `at` seconds after a ticket is
    queued: the server runs nothing meanwhile (no timer, no reply, no message)."""
    def run() -> None:
        c = redis.Redis(port=port, socket_timeout=10)
        try:
            wait_until(lambda: int(c.info("rlock")["rlock_waiters"]) >= 1, what="queued")
            time.sleep(at)
            c.execute_command("DEBUG", "SLEEP", seconds)
        finally:
            c.close()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_timed_wait_ends_by_its_deadline_while_the_server_is_frozen(server, r):
    holder = r.lock("k", timeout=30, lock_class=rlock.Lock)
    assert holder.acquire(blocking=False)
    waiter = r.lock("k", timeout=30, sleep=SLEEP, blocking_timeout=BT, lock_class=rlock.Lock)
    freeze = _freeze_once_queued(server.port, 0.05, 0.6)
    start = time.monotonic()
    assert waiter.acquire() is False
    elapsed = time.monotonic() - start
    freeze.join(10)
    assert BT >= elapsed > BT - SLEEP, elapsed
    # The server's own timeout comes after its freeze, to the orphan the waiter left.
    wait_until(lambda: stat(r, "waiters") == 0, what="the ticket timed out in the server")
    assert holder.owned()


async def test_an_asyncio_timed_wait_ends_by_its_deadline_while_the_server_is_frozen(
        server, ar):
    holder = arlock.Lock(ar, "k", timeout=30)
    assert await holder.acquire(blocking=False)
    waiter = arlock.Lock(ar, "k", timeout=30, sleep=SLEEP, blocking_timeout=BT)
    freeze = _freeze_once_queued(server.port, 0.05, 0.6)
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await waiter.acquire() is False
    elapsed = loop.time() - start
    await loop.run_in_executor(None, freeze.join, 10)
    assert BT >= elapsed > BT - SLEEP, elapsed
    assert await holder.owned()


def test_a_grant_made_while_the_waiter_left_at_its_deadline_is_given_back(server, r):
    """The holder's release reaches the frozen server before the waiter's deadline and
    runs when it wakes, after that deadline: the waiter has answered False, so the grant
    its ticket gets is collected and released by the client, not left held."""
    holder = r.lock("k", timeout=30, thread_local=False, lock_class=rlock.Lock)
    assert holder.acquire(blocking=False)
    waiter = r.lock("k", timeout=30, sleep=SLEEP, blocking_timeout=BT, lock_class=rlock.Lock)
    handoffs = stat(r, "handoffs")
    freeze = _freeze_once_queued(server.port, 0.02, 0.6)
    release = threading.Timer(0.1, holder.release)
    release.start()
    assert waiter.acquire() is False
    freeze.join(10)
    release.join(10)
    wait_until(lambda: r.exists("k") == 0, what="the lock free")
    assert waiter.local.token is None
    # Granted to the ticket (the release ran before its deadline's timer) or timed out
    # first: either way nobody holds it.
    assert stat(r, "handoffs") - handoffs in (0, 1)
    wait_until(lambda: stat(r, "waiters") == 0, what="no ticket left")


def _sweep_offsets(n: int, wait: float) -> List[float]:
    """Release times around a wait's end: from 10 ms before to 10 ms after."""
    return [wait - 0.01 + 0.02 * i / (n - 1) for i in range(n)]


def test_a_lock_released_around_a_waiters_deadline_is_taken_or_given_back(r):
    outcomes = {True: 0, False: 0}
    wait = 0.05
    for offset in _sweep_offsets(21, wait):
        holder = rlock.Lock(r, "k", timeout=30, thread_local=False)
        assert holder.acquire(blocking=False)
        waiter = rlock.Lock(r, "k", timeout=30, sleep=0.002)
        release = threading.Timer(offset, holder.release)
        release.start()
        took = waiter.acquire(blocking_timeout=wait)
        release.join(10)
        outcomes[took] += 1
        if took:
            assert waiter.owned()
            waiter.release()
        # Told no: the lock is free, or held only until its late grant is given back.
        wait_until(lambda: r.exists("k") == 0, what=f"the lock free (offset {offset})")
    wait_until(lambda: stat(r, "waiters") == 0, what="no ticket left")
    assert outcomes[True] + outcomes[False] == 21


def test_a_permit_added_around_a_waiters_deadline_is_taken_or_given_back(r):
    sem = rlock.Semaphore(r, "s")
    assert sem.try_set_permits(0)
    wait = 0.05
    for offset in _sweep_offsets(21, wait):
        add = threading.Timer(offset, sem.add_permits, (1,))
        add.start()
        took = sem.acquire(blocking_timeout=wait)
        add.join(10)
        if took:
            assert sem.available_permits() == 0
            sem.release()
        wait_until(lambda: sem.available_permits() == 1, what=f"the permit back ({offset})")
        assert sem.acquire(blocking=False)  # none left for the next round
    wait_until(lambda: stat(r, "waiters") == 0, what="no ticket left")


async def test_asyncio_a_lock_released_around_a_deadline_is_taken_or_given_back(ar):
    loop = asyncio.get_running_loop()
    wait = 0.05
    for offset in _sweep_offsets(21, wait):
        holder = arlock.Lock(ar, "k", timeout=30)
        assert await holder.acquire(blocking=False)
        waiter = arlock.Lock(ar, "k", timeout=30, sleep=0.002)

        async def release_later(h: Any = holder, at: float = offset) -> None:
            await asyncio.sleep(at)
            await h.release()
        release = loop.create_task(release_later())
        took = await waiter.acquire(blocking_timeout=wait)
        await release
        if took:
            assert await waiter.owned()
            await waiter.release()
        deadline = loop.time() + 5
        while await ar.exists("k"):
            assert loop.time() < deadline, f"the lock free (offset {offset})"
            await asyncio.sleep(0.002)


# ---- the round trips before the wait: connecting, subscribing, QUEUED ---------------------


class _Paused:
    """The server paused (`CLIENT PAUSE seconds ALL`, in effect once it answers): it
    accepts connections in the kernel and runs no command of any client meanwhile (no
    handshake, no SUBSCRIBE, no ticket), then runs them all; ``thaw`` waits for that."""

    def __init__(self, port: int, seconds: float) -> None:
        self.client = redis.Redis(port=port, socket_timeout=10)
        self.client.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "ALL")

    def thaw(self) -> None:
        """Blocks until the pause is over (this client's own PING waits for it)."""
        try:
            self.client.ping()
        finally:
            self.client.close()


def _fresh(server: Any) -> redis.Redis:
    """A client without a ticket connection yet (its mode found by a first command)."""
    c = redis.Redis(port=server.port, socket_timeout=5)
    rlock.set_blocking_waits(c, 0)
    return c


def _within_bt(elapsed: float) -> None:
    assert BT >= elapsed > BT - SLEEP, elapsed


#: Whether the waiter's handle found the lock held lately (spec/vectors/waits.json): then
#: its wait queues a ticket at once (the ticket connection's round trips are what the
#: deadline bounds); else it first asks without waiting on a pool connection (that try is
#: what the deadline bounds, and a late reply that took the lock is given back).
QUEUES_AT_ONCE = pytest.mark.parametrize("queues_at_once", [True, False],
                                         ids=["queues-at-once", "tries-first"])


def _starts(waiter: Any, queues_at_once: bool) -> Any:
    """The waiter, its handle made to have found the lock held just now (or not)."""
    if queues_at_once:
        waiter._contention.found(rlock._plan.HELD, time.monotonic())
    return waiter


def _told_no_in_time(waiter: Any, paused: _Paused) -> None:
    """The waiter's acquire, run across the pause, answers no within its deadline."""
    start = time.monotonic()
    assert waiter.acquire() is False
    elapsed = time.monotonic() - start
    paused.thaw()
    _within_bt(elapsed)


async def _atold_no_in_time(waiter: Any, paused: _Paused) -> None:
    """As `_told_no_in_time`, for an asyncio lock (the thaw in a thread: the loop goes on)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await waiter.acquire() is False
    elapsed = loop.time() - start
    await loop.run_in_executor(None, paused.thaw)
    _within_bt(elapsed)


@QUEUES_AT_ONCE
def test_a_first_wait_ends_by_its_deadline_while_the_server_is_paused(server, r,
                                                                      queues_at_once):
    """The client's first wait connects its ticket connection (handshake, RLOCK.HELLO)
    to a paused server: the connecting counts against the wait, which ends by its
    deadline (it used to wait out the pause). So does a try first."""
    fresh = _fresh(server)
    try:
        holder = fresh.lock("k", timeout=30, lock_class=rlock.Lock)
        assert holder.acquire(blocking=False)
        waiter = _starts(fresh.lock("k", timeout=30, sleep=SLEEP, blocking_timeout=BT,
                                    lock_class=rlock.Lock), queues_at_once)
        _told_no_in_time(waiter, _Paused(server.port, 0.6))
        assert holder.owned() and stat(r, "waiters") == 0
        # The ticket connection comes up on the next wait.
        assert waiter.acquire(blocking_timeout=0.2) is False
        holder.release()
        assert waiter.acquire(blocking_timeout=1)
        waiter.release()
    finally:
        rlock.close_tickets(fresh)
        fresh.close()


@QUEUES_AT_ONCE
def test_a_wait_whose_queued_is_late_ends_by_its_deadline_and_gives_a_grant_back(
        r, queues_at_once):
    """The ticket connection is up and subscribed to the key's channel (an earlier
    wait); the server is paused before the wait's command: the wait ends by its deadline,
    told no. The lock was free, so the command takes it when the pause ends (answered
    at once, no message follows): the client gives it back rather than leave it held by
    a caller that was told no. The same for a try first whose reply is late."""
    warm = rlock.Lock(r, "k", timeout=30, thread_local=False)
    assert warm.acquire(blocking=False)
    assert rlock.Lock(r, "k", timeout=30).acquire(blocking_timeout=0.05) is False
    warm.release()
    waiter = _starts(r.lock("k", timeout=30, sleep=SLEEP, blocking_timeout=BT,
                            lock_class=rlock.Lock), queues_at_once)
    acquisitions = stat(r, "acquisitions")
    _told_no_in_time(waiter, _Paused(r.connection_pool.connection_kwargs["port"], 0.6))
    wait_until(lambda: stat(r, "acquisitions") > acquisitions, what="the late acquisition")
    wait_until(lambda: r.exists("k") == 0, what="the late grant given back")
    wait_until(lambda: stat(r, "waiters") == 0, what="no ticket left")


@QUEUES_AT_ONCE
async def test_an_asyncio_first_wait_ends_by_its_deadline_while_the_server_is_paused(
        server, r, queues_at_once):
    fresh = redis.asyncio.Redis(port=server.port, socket_timeout=5)
    rlock.set_blocking_waits(fresh, 0)
    try:
        holder = arlock.Lock(fresh, "k", timeout=30)
        assert await holder.acquire(blocking=False)
        waiter = _starts(arlock.Lock(fresh, "k", timeout=30, sleep=SLEEP,
                                     blocking_timeout=BT), queues_at_once)
        await _atold_no_in_time(waiter, _Paused(server.port, 0.6))
        assert await holder.owned() and stat(r, "waiters") == 0
        assert await waiter.acquire(blocking_timeout=0.2) is False
        await holder.release()
        assert await waiter.acquire(blocking_timeout=1)
        await waiter.release()
    finally:
        await arlock.aclose_tickets(fresh)
        await fresh.aclose()


@QUEUES_AT_ONCE
async def test_an_asyncio_wait_whose_queued_is_late_gives_a_grant_back(r, ar, queues_at_once):
    """As the threads' twin."""
    warm = arlock.Lock(ar, "k", timeout=30)
    assert await warm.acquire(blocking=False)
    assert await arlock.Lock(ar, "k", timeout=30).acquire(blocking_timeout=0.05) is False
    await warm.release()
    waiter = _starts(arlock.Lock(ar, "k", timeout=30, sleep=SLEEP, blocking_timeout=BT),
                     queues_at_once)
    acquisitions = stat(r, "acquisitions")
    await _atold_no_in_time(waiter, _Paused(r.connection_pool.connection_kwargs["port"], 0.6))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while stat(r, "acquisitions") == acquisitions or r.exists("k") or stat(r, "waiters"):
        assert loop.time() < deadline, "the late grant given back, no ticket left"
        await asyncio.sleep(0.002)


# ---- the mode probe before a fresh client's first wait ---------------------------------

#: How late past its deadline a timed wait may return on a loaded machine: a CPU for the
#: waiter's timer and thread (the Rust client's DEADLINE_MARGIN, tests/tickets.rs).
DEADLINE_MARGIN = 0.15


@contextlib.contextmanager
def _stopped(server: Any) -> Iterator[None]:
    """The server's process stopped (SIGSTOP): the kernel still accepts connections, and
    nothing answers them (no handshake, no probe) until it goes on (SIGCONT)."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def _on_time(elapsed: float) -> None:
    """A native primitive's timed wait (no ``sleep``): told no at its deadline."""
    assert BT - 0.01 <= elapsed <= BT + DEADLINE_MARGIN, elapsed


def test_a_fresh_clients_first_timed_waits_end_by_their_deadline_while_the_server_is_stopped(
        server, r):
    """The first call of a fresh ``auto`` client probes the server before anything else;
    with the server stopped, a timed acquire's probe ends at the acquire's deadline (it
    used to wait out the socket timeout, three times over with the retries) and the
    caller is told no. Nothing is cached from the unanswered probe: once the server
    answers, the next call probes again and the lock and the permit are taken."""
    fresh = redis.Redis(port=server.port, socket_timeout=2)
    rlock.set_blocking_waits(fresh, 0)
    try:
        lock = fresh.lock("k", timeout=30, sleep=SLEEP, blocking_timeout=BT,
                          lock_class=rlock.Lock)
        sem = rlock.Semaphore(fresh, "s")
        with _stopped(server):
            start = time.monotonic()
            assert lock.acquire() is False
            _within_bt(time.monotonic() - start)
            start = time.monotonic()
            assert sem.acquire(blocking_timeout=BT) is False
            _on_time(time.monotonic() - start)
            assert rlock.get_mode(fresh) is None
        assert lock.acquire()
        assert rlock.get_mode(fresh) == "module"
        lock.release()
        assert sem.try_set_permits(1)
        assert sem.acquire(blocking_timeout=1)
        sem.release()
    finally:
        rlock.close_tickets(fresh)
        fresh.close()


async def test_an_asyncio_fresh_clients_first_timed_waits_end_by_their_deadline(server, r):
    """As the threads' twin, on an asyncio client."""
    fresh = redis.asyncio.Redis(port=server.port, socket_timeout=2)
    rlock.set_blocking_waits(fresh, 0)
    loop = asyncio.get_running_loop()
    try:
        lock = arlock.Lock(fresh, "k", timeout=30, sleep=SLEEP, blocking_timeout=BT)
        sem = arlock.Semaphore(fresh, "s")
        with _stopped(server):
            start = loop.time()
            assert await lock.acquire() is False
            _within_bt(loop.time() - start)
            start = loop.time()
            assert await sem.acquire(blocking_timeout=BT) is False
            _on_time(loop.time() - start)
            assert rlock.get_mode(fresh) is None
        assert await lock.acquire()
        assert rlock.get_mode(fresh) == "module"
        await lock.release()
        assert await sem.try_set_permits(1)
        assert await sem.acquire(blocking_timeout=1)
        await sem.release()
    finally:
        await arlock.aclose_tickets(fresh)
        await fresh.aclose()
