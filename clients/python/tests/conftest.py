"""Fixtures for the Python client's own tests: one redis-server per session (the module's
integration tests in ../../../tests cover the server; these cover the client), a flushed
database per test, `wait_until` for bounded waits, and `confirmations` (how held grants'
confirmations settle).

Two modes, as the client has (docs/scripts-mode.md): by default the server loads the
module and the clients use it; with RLOCK_PY_MODE=scripts the server is a plain one (no
module, what a managed service runs), the clients log in as a user restricted like a
managed service's (``+@all -@dangerous``) and, in mode ``auto``, find no module and run
Redisson's scripts. Tests of what only the module does are marked ``module_only``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import redis
import redis.asyncio

import rlock
import rlock._io
import rlock._mode
import rlock._ops
import rlock._tickets
import rlock.asyncio

# The module suite's transcriptions of Redisson's scripts (tests/support/redisson*.py) are imported
# from there, not copied: appended to the path, so that `conftest` stays this file.
MODULE_TESTS = Path(__file__).resolve().parents[3] / "tests" / "support"
if str(MODULE_TESTS) not in sys.path:
    sys.path.append(str(MODULE_TESTS))

# The one server launcher of every Python suite (tests/support/rlock_server.py).
from rlock_server import RESTRICTED_USER, RedisServer  # noqa: E402


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


#: "module" (the default) or "scripts": see the module docstring.
MODE = os.environ.get("RLOCK_PY_MODE", "module")
SCRIPTS = MODE == "scripts"


def pytest_configure(config: Any) -> None:
    config.addinivalue_line("markers", "module_only: what scripts mode does not give "
                            "(FIFO order, tickets, the module's counters and commands)")


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    if SCRIPTS:
        skip = pytest.mark.skip(reason="the module's own behaviour (RLOCK_PY_MODE=scripts)")
        for item in items:
            if "module_only" in item.keywords:
                item.add_marker(skip)


def client_kwargs() -> dict:
    """How the tests' clients log in: as the restricted user in scripts mode."""
    if SCRIPTS:
        return {"username": RESTRICTED_USER[0], "password": RESTRICTED_USER[1]}
    return {}


@pytest.fixture(scope="session")
def server() -> Iterator[RedisServer]:
    s = RedisServer(module=False if SCRIPTS else None).start()
    if SCRIPTS:
        s.add_restricted_user()
    yield s
    alive = s.alive()
    s.stop()
    assert alive, "the redis-server died during the tests"


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    """The server's default user: what the tests themselves may do (pause, kill) that the
    restricted user of scripts mode may not."""
    client = redis.Redis(port=server.port, socket_timeout=5)
    yield client
    client.close()


@pytest.fixture
def r(server: RedisServer) -> Iterator[redis.Redis]:
    """A client on a flushed database (socket_timeout 5 s, shorter than no test's wait),
    whose every wait is a ticket (no lone blocked wait first: see set_blocking_waits)."""
    redis.Redis(port=server.port, socket_timeout=5).flushall()  # the admin: FLUSHALL
    client = redis.Redis(port=server.port, socket_timeout=5, **client_kwargs())
    rlock.set_blocking_waits(client, 0)
    yield client
    rlock.close_tickets(client)
    client.close()


@pytest.fixture
async def ar(server: RedisServer) -> Any:
    """An asyncio client on a flushed database, every wait a ticket (as `r`)."""
    admin = redis.asyncio.Redis(port=server.port, socket_timeout=5)
    await admin.flushall()
    await admin.aclose()
    client = redis.asyncio.Redis(port=server.port, socket_timeout=5, **client_kwargs())
    rlock.set_blocking_waits(client, 0)
    yield client
    await rlock.asyncio.aclose_tickets(client)
    await client.aclose()


@pytest.fixture
def confirmations(monkeypatch: Any) -> list:
    """The outcomes of held grants' confirmations, as they settle (True: the grant
    stands; False: reported lost)."""
    settled: list = []
    settle = rlock._tickets.Confirm.settle

    def record(self, confirmed: bool, taken_back: bool = False) -> None:
        if self.outcome is None:
            settled.append(confirmed)
        settle(self, confirmed, taken_back)
    monkeypatch.setattr(rlock._tickets.Confirm, "settle", record)
    return settled


def grant_and_pause_writes(admin: redis.Redis, key: str, kill_subscriber: bool = False) -> None:
    """Releases `key` held by "outside" (granting the queued ticket; with an AOF of fsync
    always, the grant is on disk before EXEC answers) and pauses writes, in one
    transaction, so the holder's confirmation (a write) waits; with `kill_subscriber`,
    the client's pub/sub connection is killed in between, so the grant's message reaches
    nobody."""
    p = admin.pipeline(transaction=True)
    p.execute_command("RLOCK.RELEASE", key, "outside")
    if kill_subscriber:
        p.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    p.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    p.execute()


def stat(r: redis.Redis, name: str) -> int:
    """One `INFO rlock` counter. In scripts mode, "waiters" is what the server shows of
    them: the subscriptions to Redisson's channels (one per channel and client)."""
    if SCRIPTS:
        return scripts_stat(r, name)
    return int(r.info("rlock").get(f"rlock_{name}", 0))


#: The module's counters of renewals; in scripts mode, the scripts the server ran.
RENEWAL_STATS = ("renewals", "rw_renewals", "psem_lease_updates")


_ADMINS: dict = {}


def scripts_stat(r: Any, name: str) -> int:
    """What scripts mode shows of a module counter: "waiters" from the client's own
    subscriptions (`scripts_waiters`); a renewal count from the scripts the server ran
    (INFO commandstats, read by the admin: the restricted user may not run INFO; only
    the watchdog runs scripts while those tests wait); others 0."""
    if name == "waiters":
        return scripts_waiters(r)
    if name not in RENEWAL_STATS:
        return 0
    kwargs = r.connection_pool.connection_kwargs
    admin = _ADMINS.get(kwargs["port"])
    if admin is None:  # one per server: the tests poll this every few milliseconds
        admin = _ADMINS[kwargs["port"]] = redis.Redis(
            host=kwargs.get("host", "127.0.0.1"), port=kwargs["port"], socket_timeout=5)
    stats = admin.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def scripts_waiters(r: Any) -> int:
    """Scripts mode's waiters of client `r`: its subscriptions to Redisson's channels
    that the server has confirmed (the server only sees one per channel and client)."""
    subs = list(rlock._mode.backend(r).subscribers.values())
    return sum(c.refs for s in subs for c in list(s.channels.values()) if c.confirmed)


def command(r: Any, *args: Any) -> Any:
    """One of the module's commands through the client's backend: the module's own where
    it is loaded, Redisson's scripts in scripts mode (the same reply)."""
    return rlock._io.SyncIO(r).run(rlock._ops.call(*args))


async def acommand(r: Any, *args: Any) -> Any:
    """`command` for an asyncio client."""
    return await rlock._io.AsyncIO(r).run(rlock._ops.call(*args))


def clients_named(r: redis.Redis, name: str) -> int:
    """How many connections `CLIENT LIST` shows with this name."""
    return sum(1 for c in r.client_list() if c.get("name") == name)


def blocked_clients(r: redis.Redis) -> int:
    """Clients blocked in the server (a WAIT without ASYNC)."""
    return int(r.info("clients")["blocked_clients"])
