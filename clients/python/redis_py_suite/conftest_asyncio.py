"""Fixtures for redis-py's tests/test_asyncio/test_lock.py: its `create_redis` factory
(one run on a single-connection client, one on a pool, as redis-py does) and `r`, on the
module-loaded server of ../conftest.py. run.py copies this file to
<suite>/tests/test_asyncio/conftest.py.
"""

from __future__ import annotations

from typing import Any

import pytest_asyncio
import redis.asyncio as redis_asyncio

from ..conftest import server_url


@pytest_asyncio.fixture(params=[True, False], ids=["single", "pool"])
async def create_redis(request: Any) -> Any:
    """Factory of asyncio clients on a flushed database, closed at teardown."""
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
        if flushdb:
            await client.flushdb()
        await client.aclose()
        await client.connection_pool.disconnect()


@pytest_asyncio.fixture()
async def r(create_redis: Any) -> Any:
    """redis-py's asyncio `r`."""
    return await create_redis()
