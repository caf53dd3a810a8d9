"""The asyncio primitives (rlock.asyncio): the same logic as the blocking classes
(rlock._ops) on the asyncio driver. Each primitive once through `async with`, 1 000 tasks
of one client served FIFO over one ticket connection, and cancelled or timed-out waits
that leave no ticket and no grant behind.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio
from conftest import SCRIPTS, client_kwargs, scripts_stat
from redis.exceptions import LockNotOwnedError

import rlock
import rlock.asyncio as arlock

N = 1000


async def astat(r, name: str) -> int:
    if SCRIPTS:
        return scripts_stat(r, name)
    return int((await r.info("rlock")).get(f"rlock_{name}", 0))


async def until(pred, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.002)


async def test_each_primitive_works_with_async_with(ar):
    rw = arlock.RwLock(ar, "rw", timeout=10)
    async with rw.write:
        other = arlock.RwLock(ar, "rw", timeout=10)
        task = asyncio.create_task(other.read.acquire(blocking_timeout=5))
        await until(lambda: _eq(astat(ar, "waiters"), 1), what="reader queued")
    assert await task and other.read.held
    await other.read.release()

    fenced = arlock.FencedLock(ar, "f")  # watchdog mode
    async with fenced:
        assert fenced.token == await fenced.get_token()

    sem = arlock.Semaphore(ar, "s")
    assert await sem.try_set_permits(1)
    async with sem:
        assert await sem.available_permits() == 0

    psem = arlock.ExpirableSemaphore(ar, "p", watchdog_timeout=1.0)
    await psem.try_set_permits(1)
    permit = await psem.acquire()
    async with permit:
        await until(lambda: _ge(astat(ar, "psem_lease_updates"), 3), 15, what="renewed")
        assert not permit.lost
    assert await psem.available_permits() == 1
    with pytest.raises(LockNotOwnedError):
        await permit.release()

    latch = arlock.CountDownLatch(ar, "l")
    await latch.try_set_count(1)
    task = asyncio.create_task(latch.wait(5))
    await until(lambda: _eq(astat(ar, "waiters"), 1), what="latch waiter queued")
    assert await latch.count_down() == 0
    assert await task is True


@pytest.mark.module_only  # FIFO order, tickets
async def test_a_thousand_waiting_tasks_are_served_fifo_over_one_ticket_connection(server, ar):
    client = redis.asyncio.Redis(port=server.port)  # the default: every wait a ticket
    holder = arlock.Semaphore(ar, "s")
    await holder.try_set_permits(0)
    order: list[int] = []

    async def waiter(i: int) -> None:
        sem = arlock.Semaphore(client, "s")
        assert await sem.acquire(blocking_timeout=60)
        order.append(i)
        await sem.release()

    before = len(await ar.client_list())
    tasks = []
    for i in range(N):
        tasks.append(asyncio.create_task(waiter(i)))
        await until(lambda: _eq(astat(ar, "waiters"), i + 1), what=f"waiter {i}")
    assert int((await ar.info("clients"))["blocked_clients"]) == 0  # nobody blocks
    assert len(await ar.client_list()) - before <= 2  # the ticket connection (and one)
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert order == list(range(N))
    assert await holder.available_permits() == 1
    await arlock.aclose_tickets(client)
    await client.aclose()


@pytest.mark.module_only  # tickets
async def test_a_cancelled_permit_wait_gives_its_grant_back(ar):
    sem = arlock.ExpirableSemaphore(ar, "p")
    await sem.try_set_permits(1)
    permit = await sem.acquire(lease=30)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(sem.acquire(lease=30), 0.2)
    assert await astat(ar, "waiters") == 1  # the ticket waits for its turn ...
    await permit.release()
    # ... is granted, collected by the client and released: the permit is free again.
    await until(lambda: _eq(sem.available_permits(), 1), what="permit given back")
    assert await sem.acquired_permits() == 0 and await astat(ar, "waiters") == 0


async def test_a_timed_out_wait_leaves_no_ticket(ar):
    latch = arlock.CountDownLatch(ar, "l")
    await latch.try_set_count(1)
    assert await latch.wait(0.2) is False
    await until(lambda: _eq(astat(ar, "waiters"), 0), what="the wait gone")
    lock = arlock.FencedLock(ar, "f", timeout=10)
    assert await lock.acquire()
    other = arlock.FencedLock(ar, "f", timeout=10)
    assert await other.acquire(blocking_timeout=0.2) is False
    await until(lambda: _eq(astat(ar, "waiters"), 0), what="the wait gone")
    await lock.release()
    assert not await ar.exists("f")


async def test_sync_and_asyncio_clients_share_a_semaphore(server, ar):
    r = redis.Redis(port=server.port, **client_kwargs())
    sync = rlock.Semaphore(r, "s")
    sync.try_set_permits(0)
    task = asyncio.create_task(arlock.Semaphore(ar, "s").acquire(blocking_timeout=5))
    await until(lambda: _eq(astat(ar, "waiters"), 1), what="async waiter queued")
    sync.release()
    assert await task is True
    rlock.close_tickets(r)
    r.close()


async def _eq(value, expected) -> bool:
    return (await value) == expected


async def _ge(value, expected) -> bool:
    return (await value) >= expected
