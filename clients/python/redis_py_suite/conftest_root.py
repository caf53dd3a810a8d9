"""Fixtures for redis-py's own lock tests, run against a module-loaded server with rlock's
Lock classes swapped in. run.py copies this file to <suite>/tests/conftest.py, beside
redis-py's tests/test_lock.py, whose `from .conftest import _get_client` it satisfies.

What is replaced: redis-py's conftest (which wants a server at --redis-url, Docker
extras, cluster and SSL set-ups) by the little its lock tests use: `_get_client`, the `r`
fixture and the --protocol option. What is swapped: each lock test module's global `Lock`,
which its `get_lock` helper passes as `lock_class` to `r.lock(...)`, becomes `rlock.Lock`
(or `rlock.asyncio.Lock` under test_asyncio/). Tests that read redis-py's storage format
are skipped with their reason (EXCLUDED); the session fails if rlock was never used.
With RLOCK_PY_MODE=scripts the server has no module: rlock's Lock runs on Redisson's
scripts (docs/scripts-mode.md), and the same suite proves it.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import redis

import rlock
import rlock.asyncio

from .rlock_server import RedisServer

_FORMAT = ("reads the key with GET and compares it to the token: redis-py's storage format "
           "(a string holding the token); an rlock lock is a Redisson-layout hash "
           "{token: hold count}, on which GET answers WRONGTYPE")

#: Test function name -> why it cannot apply to rlock. The same names are excluded in
#: test_lock.py and test_asyncio/test_lock.py (their async twins read the key the same way).
EXCLUDED = {
    "test_lock": _FORMAT + "; it also expects no TTL without timeout (rlock: a watchdog lease)",
    "test_lock_token": _FORMAT,
    "test_lock_token_thread_local_false": _FORMAT,
    "test_context_manager": _FORMAT,
}

_server: RedisServer | None = None
_passed = 0
_SCRIPTS = os.environ.get("RLOCK_PY_MODE") == "scripts"


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--protocol", default="2", help="RESP version of the clients (2 or 3)")


def pytest_sessionstart(session: Any) -> None:
    global _server
    _server = RedisServer(module=False if _SCRIPTS else None).start()


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    global _server
    if _server is None:
        return
    try:
        if _passed and exitstatus == 0 and _SCRIPTS:
            stats = redis.Redis(port=_server.port).info("commandstats")
            scripts = sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0))
                          for c in ("evalsha", "eval"))
            print(f"\nplain server (scripts mode): {scripts} of Redisson's scripts run")
            if scripts == 0:
                print("the redis-py lock tests never reached rlock: is the Lock swap broken?")
                session.exitstatus = 1
        elif _passed and exitstatus == 0:
            stats = redis.Redis(port=_server.port).info("rlock")
            acquired = stats.get("rlock_acquisitions", 0) + stats.get("rlock_handoffs", 0)
            print(f"\nrlock server: {acquired} locks taken through RLOCK.ACQUIRE "
                  f"({stats.get('rlock_handoffs', 0)} handed over to a waiter)")
            if acquired == 0:
                print("the redis-py lock tests never reached rlock: is the Lock swap broken?")
                session.exitstatus = 1
    finally:
        _server.stop()
        _server = None


def pytest_runtest_logreport(report: Any) -> None:
    global _passed
    if report.when == "call" and report.passed:
        _passed += 1


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    for item in items:
        reason = EXCLUDED.get(getattr(item, "originalname", item.name))
        if reason is not None and item.cls is not None and item.cls.__name__ == "TestLock":
            item.add_marker(pytest.mark.skip(reason=f"rlock: {reason}"))


@pytest.fixture(autouse=True)
def rlock_lock_class(request: Any, monkeypatch: Any) -> None:
    """Swaps the test module's `Lock` (what its get_lock passes as lock_class) for rlock's."""
    module = request.module
    if module.__name__.rsplit(".", 1)[-1] != "test_lock":
        return
    asyncio = ".test_asyncio." in f".{module.__name__}."
    swap = rlock.asyncio.Lock if asyncio else rlock.Lock
    assert module.Lock.__module__.startswith("redis."), "not redis-py's lock test module"
    monkeypatch.setattr(module, "Lock", swap)


def server_url() -> str:
    """URL of the session's module-loaded server."""
    assert _server is not None, "the session's redis-server was not started"
    return _server.url


def _get_client(cls: Any, request: Any, single_connection_client: bool = True,
                flushdb: bool = True, **kwargs: Any) -> Any:
    """A client of the session's server, flushed and closed at teardown (redis-py's helper)."""
    if request is not None and kwargs.get("protocol") is None:
        kwargs["protocol"] = int(request.config.getoption("--protocol"))
    options = redis.connection.parse_url(server_url())
    options.update(kwargs)
    client = cls(connection_pool=redis.ConnectionPool(**options))
    if single_connection_client:
        client = client.client()
    if request is not None:
        def teardown() -> None:
            if flushdb:
                client.flushdb()
            client.close()
            client.connection_pool.disconnect()

        request.addfinalizer(teardown)
    return client


@pytest.fixture()
def r(request: Any) -> Any:
    """redis-py's `r`: a single-connection client on a flushed database."""
    with _get_client(redis.Redis, request) as client:
        yield client
