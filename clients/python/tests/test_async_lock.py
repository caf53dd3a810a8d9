"""rlock.asyncio.Lock against a module-loaded server: FIFO handoff, waits longer than
socket_timeout, cancellation of a waiting acquire, the watchdog task, and a restart of the
server (AOF on) ridden out by a wait and by a held grant's confirmation.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio
from conftest import (SCRIPTS, acommand, client_kwargs, clients_named, grant_and_pause_writes,
                      scripts_stat)
from redis.exceptions import LockNotOwnedError
from rlock_server import RedisServer

import rlock
import rlock.asyncio


async def astat(r, name: str) -> int:
    if SCRIPTS:
        return scripts_stat(r, name)
    return int((await r.info("rlock")).get(f"rlock_{name}", 0))


async def await_until(pred, timeout: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.002)


async def _eq(value, expected) -> bool:
    """`await_until` predicate: the awaited counter equals `expected`."""
    return (await value) == expected


async def _ge(value, expected) -> bool:
    """`await_until` predicate: the awaited counter reached `expected`."""
    return (await value) >= expected


async def _true(value) -> bool:
    """`await_until` predicate on a plain value."""
    return bool(value)


@pytest.mark.module_only  # FIFO order
async def test_waiters_are_served_in_arrival_order(ar):
    holder = ar.lock("k", timeout=10, lock_class=rlock.asyncio.Lock)
    assert await holder.acquire(blocking=False)
    order: list[int] = []

    async def waiter(i: int) -> None:
        lock = ar.lock("k", timeout=10, blocking_timeout=10, lock_class=rlock.asyncio.Lock)
        assert await lock.acquire()
        order.append(i)
        await lock.release()

    tasks = []
    for i in range(4):
        tasks.append(asyncio.create_task(waiter(i)))
        await await_until(lambda i=i: _eq(astat(ar, "waiters"), i + 1), what=f"waiter {i}")
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order == [0, 1, 2, 3]


async def test_a_wait_may_outlast_the_socket_timeout(server, ar):
    short = redis.asyncio.Redis(port=server.port, socket_timeout=0.2, **client_kwargs())
    try:
        holder = ar.lock("k", timeout=10, lock_class=rlock.asyncio.Lock)
        assert await holder.acquire(blocking=False)
        lock = short.lock("k", timeout=10, lock_class=rlock.asyncio.Lock)
        started = time.monotonic()
        assert await lock.acquire(blocking_timeout=0.8) is False
        # Past the socket timeout (the point), and bounded; the envelope itself (never
        # after blocking_timeout) is redis-py's own test_blocking_timeout, run by
        # redis_py_suite.
        assert 0.6 < time.monotonic() - started < 2
    finally:
        # Its ticket connection too, or its reader outlives the test's loop.
        await rlock.asyncio.aclose_tickets(short)
        await short.aclose()


@pytest.mark.module_only  # tickets
async def test_cancelling_a_waiting_acquire_gives_back_its_grant(ar):
    holder = ar.lock("k", timeout=10, lock_class=rlock.asyncio.Lock)
    assert await holder.acquire(blocking=False)
    waiter = ar.lock("k", timeout=10, lock_class=rlock.asyncio.Lock)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(waiter.acquire(), 0.3)
    # Its ticket stays queued (the server has no way to withdraw one but closing the
    # shared ticket connection) ...
    assert await astat(ar, "waiters") == 1
    handoffs = await astat(ar, "handoffs")
    await holder.release()
    # ... is granted when the lock comes free, and the client gives the grant back at
    # once (long before its 10 s lease would end): no ticket and no grant are left.
    await await_until(lambda: _eq(astat(ar, "handoffs"), handoffs + 1), what="granted")
    await await_until(lambda: _eq(ar.exists("k"), 0), what="grant given back")
    assert await astat(ar, "waiters") == 0
    assert await waiter.acquire(blocking=False)  # the client still works
    await waiter.release()


async def test_the_watchdog_task_renews_and_reports_a_lost_lock(ar):
    lost: list[tuple] = []

    async def on_lost(name, token):
        lost.append((name, token))

    lock = rlock.asyncio.Lock(ar, "k", watchdog_timeout=1.0, on_lost=on_lost)
    assert await lock.acquire(blocking=False)
    renewals = await astat(ar, "renewals")
    await await_until(lambda: _ge(astat(ar, "renewals"), renewals + 6), 15, what="renewals")
    assert await lock.owned()
    token = lock.local.token
    await acommand(ar, "RLOCK.FORCERELEASE", "k")
    await await_until(lambda: _true(lost), what="on_lost called")
    assert lost == [("k", token)] and lock.lost
    with pytest.raises(LockNotOwnedError):
        await lock.release()


async def test_release_stops_the_watchdog_task(ar):
    lock = rlock.asyncio.Lock(ar, "k", watchdog_timeout=0.3)
    assert await lock.acquire(blocking=False)
    task = lock._watchdogs[lock.local.token].task
    await lock.release()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 5)
    assert task.cancelled() and await ar.exists("k") == 0


# ---- a restart of the server (AOF on) while a ticket's grant is unheard or unconfirmed ----


def _aof_server() -> RedisServer:
    return RedisServer(args=["--appendonly", "yes", "--appendfsync", "always"]).start()


async def _queued_behind_outside(s: RedisServer, lock, admin) -> asyncio.Task:
    """``lock`` waits (a ticket) behind a hold of "outside" on "k"; the waiting task."""
    admin.execute_command("RLOCK.ACQUIRE", "k", "outside", 30000)
    waiter = asyncio.get_running_loop().create_task(lock.acquire(blocking_timeout=30))
    await await_until(lambda: _true(admin.info("rlock")["rlock_waiters"] == 1),
                      what="the ticket queued")
    return waiter


@pytest.mark.module_only
async def test_a_wait_rides_out_a_restart_and_finds_the_grant_made_before_it():
    """As test_tickets' twin: the grant to a queued ticket is unheard (its message gone
    with the ticket connection, its collect held by a pause) when the server dies; it
    comes back on its port from its AOF after 2 s. The asyncio wait connects again until
    then and finds the grant under the same request id."""
    s = _aof_server()
    r = redis.asyncio.Redis(port=s.port, socket_timeout=5)
    try:
        admin = s.client(socket_timeout=5)
        rlock.set_blocking_waits(r, 0)
        lock = rlock.asyncio.Lock(r, "k", timeout=30, thread_local=False)
        waiter = await _queued_behind_outside(s, lock, admin)
        grant_and_pause_writes(admin, "k", kill_subscriber=True)
        owners = admin.hkeys("k")
        assert len(owners) == 1 and owners != [b"outside"], owners
        # In a thread: the loop runs the wait's reconnects while the server is down.
        await asyncio.to_thread(s.restart, sig_kill=True, down=2.0)
        assert await asyncio.wait_for(waiter, 20) is True
        assert owners == [lock.local.token]
        admin = s.client(socket_timeout=5)
        assert admin.hgetall("k") == {owners[0]: b"1"}
        await lock.release()
        assert admin.exists("k") == 0
    finally:
        await rlock.asyncio.aclose_tickets(r)
        await r.aclose()
        s.stop(sig_kill=True)


@pytest.mark.module_only
async def test_a_held_grant_is_confirmed_after_a_restart_longer_than_the_grace(confirmations):
    """As test_tickets' twin: the waiter holds on its grant's message, its confirmation
    held back by a pause until the server is killed, down 1.5 s (longer than the grace)
    and back from its AOF. The confirmation, tried again in a task of its own, finds the
    grant: the holder keeps the lock and its release frees it."""
    settled = confirmations
    s = _aof_server()
    r = redis.asyncio.Redis(port=s.port, socket_timeout=5)
    try:
        admin = s.client(socket_timeout=5)
        rlock.set_blocking_waits(r, 0)
        lost: list = []
        lock = rlock.asyncio.Lock(r, "k", thread_local=False,
                                  on_lost=lambda *a: lost.append(a))
        waiter = await _queued_behind_outside(s, lock, admin)
        # The grant's message goes out; the pause holds its confirmation (a write).
        grant_and_pause_writes(admin, "k")
        assert await asyncio.wait_for(waiter, 10) is True, "held on the grant's message"
        await asyncio.to_thread(s.restart, sig_kill=True, down=1.5)
        await await_until(lambda: _true(settled), 10, "the confirmation settled")
        assert settled == [True] and not lost and not lock.lost
        admin = s.client(socket_timeout=5)
        assert admin.hgetall("k") == {lock.local.token: b"1"}, "the AOF kept the grant"
        await lock.release()
        assert admin.exists("k") == 0
    finally:
        await rlock.asyncio.aclose_tickets(r)
        await r.aclose()
        s.stop(sig_kill=True)


# ---- closing: nothing of the client outlives aclose_tickets -------------------------------


def _rlock_tasks() -> list:
    """The tasks still running code of the rlock package (a ticket reader, a give-back)."""
    me = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not me and not t.done()
            and "/rlock/" in getattr(getattr(t.get_coro(), "cr_code", None), "co_filename", "")]


@pytest.mark.module_only  # ticket connections
@pytest.mark.parametrize("killed", [False, True], ids=["served", "replaced"])
async def test_aclose_tickets_leaves_no_task_and_no_connection(server, ar, killed):
    """After a wait served by ticket (and, ``replaced``, one whose ticket connection was
    killed under it and connected again), `aclose_tickets` cancels and awaits the ticket
    readers and closes the connections: no task of rlock is left when it returns. Left
    pending, the loop's end destroys it ("Task was destroyed but it is pending!") and
    its redis-py connection is closed by the garbage collector after the loop is gone
    ("Event loop is closed")."""
    admin = server.client(socket_timeout=5)
    try:
        holder = rlock.asyncio.Lock(ar, "k", timeout=30, thread_local=False)
        assert await holder.acquire(blocking=False)
        lock = rlock.asyncio.Lock(ar, "k", timeout=30, thread_local=False)
        waiter = asyncio.create_task(lock.acquire(blocking_timeout=30))
        await await_until(lambda: _eq(astat(ar, "waiters"), 1), what="the ticket queued")
        if killed:
            (old,) = [c["id"] for c in admin.client_list()
                      if c["name"] == rlock.TICKET_CONNECTION_NAME]
            admin.client_kill_filter(_id=old)

            async def queued_again() -> bool:
                ids = [c["id"] for c in admin.client_list()
                       if c["name"] == rlock.TICKET_CONNECTION_NAME]
                return ids not in ([], [old]) and await astat(ar, "waiters") == 1
            await await_until(queued_again, 10, "the ticket queued on a new connection")
        await holder.release()
        assert await asyncio.wait_for(waiter, 10) is True
        await lock.release()
        assert _rlock_tasks(), "the ticket reader runs while the client is open"
        await rlock.asyncio.aclose_tickets(ar)
        assert _rlock_tasks() == []
        await await_until(
            lambda: _true(clients_named(admin, rlock.TICKET_CONNECTION_NAME) == 0),
            what="the ticket connection closed")
    finally:
        admin.close()


@pytest.mark.module_only  # a grant held on its message (ticket-holds)
@pytest.mark.parametrize("answered", [True, False], ids=["answered-in-the-close", "paused-past-it"])
async def test_aclose_tickets_with_a_confirmation_out_leaves_no_task(server, ar, confirmations,
                                                                     answered):
    """A hold's confirmation unanswered (writes paused) when the client closes its ticket
    connections. ``answered``: the pause ends 0.2 s into the close, which reads the reply
    before the socket goes (as test_tickets' twin): the hold settles as confirmed, not
    reported lost by the close. Paused past the close's wait for the replies due: the
    close fails it, and no task is left to try it again after the close (it would outlive
    the client, and the loop); the hold is reported lost, as the server takes an
    unconfirmed grant back after its grace. Either way no task of rlock is left."""
    admin = server.client(socket_timeout=5)
    try:
        lock = rlock.asyncio.Lock(ar, "k", timeout=30, thread_local=False)
        waiter = await _queued_behind_outside(server, lock, admin)
        grant_and_pause_writes(admin, "k")  # the confirmation (a write) waits
        try:
            assert await asyncio.wait_for(waiter, 10) is True, "held on the grant's message"
            assert confirmations == []
            if answered:
                asyncio.get_running_loop().call_later(
                    0.2, lambda: admin.execute_command("CLIENT", "UNPAUSE"))
            await rlock.asyncio.aclose_tickets(ar)
            assert _rlock_tasks() == []
            assert confirmations == [answered]
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
        if answered:
            held = admin.hgetall("k")  # the waiter's hold, confirmed
            assert list(held.values()) == [b"1"] and b"outside" not in held
    finally:
        admin.close()
