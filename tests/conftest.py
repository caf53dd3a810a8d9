"""Fixtures for the integration tests: real redis-server processes with the module loaded.

Each server listens on 127.0.0.1 on a free port, keeps its files in a pytest tmp dir and
is killed at teardown. The module is found through $RLOCK_MODULE (the Makefile sets it),
the server binary through $REDIS_SERVER: Redis 7.0, Redis 8.2 or Valkey 9.1 (`make test`
runs the suite on each); tests whose expected text differs between them ask
`server.kind()` and `server.version()`.
"""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The suite is grouped by primitive and kind (lock/, rwlock/, ..., server/, stress/); the
# helpers they share (Redisson's scripts transcribed, error texts, cluster and hostile-input
# helpers) live in support/ and are imported by module name from every group.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
# The server launcher is the one every Python suite and bench shares (support/rlock_server.py);
# the tests import it from here, as they always have.
from rlock_server import (MODULE, REDIS_SERVER, RedisServer, crash_report,  # noqa: E402,F401
                          free_port)


# Module arguments for a server whose writes must reach replicas and the AOF as plain
# effects (`rlock.replication effects`, design.md 1.4): for tests with a replica that has no
# module, or that read the AOF's plain commands. The default, `commands`, is tested with
# module-loaded replicas (test_replication.py).
EFFECTS = ["replication", "effects"]


def wait_until(pred, timeout=5.0, interval=0.002, what="condition"):
    """Polls `pred` until it returns something truthy; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def server_has_post_notification_jobs():
    """Redis 7.2+ and Valkey run a module's post-notification jobs inside the command that
    freed a lock, and report key removals to modules with the Key server event; 7.0 has
    neither (the module falls back to a zero-delay timer and keyspace notifications)."""
    out = subprocess.run([REDIS_SERVER, "--version"], capture_output=True, text=True).stdout
    if "valkey" in out.lower():
        return True
    m = re.search(r"v=(\d+)\.(\d+)", out)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (7, 2)


def someone_waits(server, key="bystander", db=0):
    """Makes the module watch: it listens to the server's events, and tracks the locks it
    writes for their unlock message, only while somebody waits in it (design.md 1: nothing
    held while nobody waits). A lock is held at `key` and a ticket queued for it
    without deadline, on a connection of its own, which is returned: closing it ends the
    wait. Locks written from now on are tracked."""
    c = server.client(db=db)
    c.execute_command("RLOCK.ACQUIRE", key, "bystander-holder", 600_000)
    assert c.execute_command("RLOCK.ACQUIRE", key, "bystander", 600_000, "WAIT", 0,
                             "ASYNC", "ID", "bystander") == b"QUEUED"
    wait_until(lambda: c.info("rlock")["rlock_watching"] == 1, what="the module watching")
    return c


@pytest.fixture
def make_server(tmp_path):
    """Factory: make_server(module=True, args=[...]) -> started RedisServer, stopped at teardown."""
    servers = []

    def make(name=None, **kw):
        s = RedisServer(tmp_path / (name or f"s{len(servers)}"), **kw)
        servers.append(s)
        return s.start()

    yield make
    crashed = [s for s in servers if s.proc is not None and s.proc.poll() is not None]
    for s in servers:
        s.stop()
    assert not crashed, "a redis-server crashed during the test:\n" + "\n".join(
        crash_report(s.log) for s in crashed)


@pytest.fixture
def server(make_server):
    return make_server()


@pytest.fixture
def r(server):
    """A RESP2 client on a fresh module-loaded server."""
    return server.client()
