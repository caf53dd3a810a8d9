"""Fixtures for redis-py's tests/test_asyncio/test_lock.py: its `create_redis` factory
(one run on a single-connection client, one on a pool, as redis-py does) and `r`, on the
module-loaded server of ../conftest.py. run.py copies this file to
<suite>/tests/test_asyncio/conftest.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest_asyncio
import redis.asyncio as redis_asyncio

import rlock.asyncio

from ..conftest import server_url


@pytest_asyncio.fixture(params=[True, False], ids=["single", "pool"])
async def create_redis(request: Any) -> Any:
    """Factory of asyncio clients on a flushed database, closed at teardown with their
    ticket connections (whose reader task would otherwise outlive the test's loop)."""
    single_connection = request.param
    clients = []

    async def client_factory(cls: Any = redis_asyncio.Redis, flushdb: bool = True,
                             **kwargs: Any) -> Any:
        if kwargs.get("protocol") is None:
            kwargs["protocol"] = int(request.config.getoption("--protocol"))
        single = kwargs.pop("single_connection_client", False) or single_connection
        options = redis_asyncio.connection.parse_url(server_url())
        options.update(kwargs)
        client = cls(connection_pool=redis_asyncio.ConnectionPool(**options))
        if single:
            client = client.client()
            await client.initialize()
        clients.append((client, flushdb))
        return client

    yield client_factory
    for client, flushdb in clients:
        await rlock.asyncio.aclose_tickets(client)
        if flushdb:
            await client.flushdb()
        await client.aclose()
        await client.connection_pool.disconnect()
    me = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not me and not t.done() and "/rlock/" in
            getattr(getattr(t.get_coro(), "cr_code", None), "co_filename", "")]
    assert not left, f"tasks of rlock left after the clients closed: {left}"


@pytest_asyncio.fixture()
async def r(create_redis: Any) -> Any:
    """redis-py's asyncio `r`."""
    return await create_redis()
