"""Fixtures for the Python client's own tests: one module-loaded redis-server per session
(the module's integration tests in ../../../tests cover the server; these cover the
client), a flushed database per test, and `wait_until` for bounded waits.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import redis
import redis.asyncio

from server import RedisServer

import rlock
import rlock.asyncio

# The module suite's transcriptions of Redisson's scripts (tests/support/redisson*.py) are imported
# from there, not copied: appended to the path, so that `conftest` stays this file.
MODULE_TESTS = Path(__file__).resolve().parents[3] / "tests" / "support"
if str(MODULE_TESTS) not in sys.path:
    sys.path.append(str(MODULE_TESTS))


def wait_until(pred: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
    """Polls `pred` until truthy; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.002)


@pytest.fixture(scope="session")
def server() -> Iterator[RedisServer]:
    s = RedisServer().start()
    yield s
    alive = s.alive()
    s.stop()
    assert alive, "the redis-server died during the tests"


@pytest.fixture
def r(server: RedisServer) -> Iterator[redis.Redis]:
    """A client on a flushed database (socket_timeout 5 s, shorter than no test's wait),
    whose every wait is a ticket (no lone blocked wait first: see set_blocking_waits)."""
    client = redis.Redis(port=server.port, socket_timeout=5)
    rlock.set_blocking_waits(client, 0)
    client.flushall()
    yield client
    rlock.close_tickets(client)
    client.close()


@pytest.fixture
async def ar(server: RedisServer) -> Any:
    """An asyncio client on a flushed database, every wait a ticket (as `r`)."""
    client = redis.asyncio.Redis(port=server.port, socket_timeout=5)
    rlock.set_blocking_waits(client, 0)
    await client.flushall()
    yield client
    await rlock.asyncio.aclose_tickets(client)
    await client.aclose()


def stat(r: redis.Redis, name: str) -> int:
    """One `INFO rlock` counter."""
    return int(r.info("rlock").get(f"rlock_{name}", 0))


def clients_named(r: redis.Redis, name: str) -> int:
    """How many connections `CLIENT LIST` shows with this name."""
    return sum(1 for c in r.client_list() if c.get("name") == name)


def blocked_clients(r: redis.Redis) -> int:
    """Clients blocked in the server (a WAIT without ASYNC)."""
    return int(r.info("clients")["blocked_clients"])
