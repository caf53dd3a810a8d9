"""Fixtures for the integration tests: real redis-server processes with the module loaded.

Each server listens on 127.0.0.1 on a free port, keeps its files in a pytest tmp dir and
is killed at teardown. The module is found through $RLOCK_MODULE (the Makefile sets it),
the server binary through $REDIS_SERVER: Redis 7.0, Redis 8.2 or Valkey 9.1 (`make test`
runs the suite on each); tests whose expected text differs between them ask
`server.kind()` and `server.version()`.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
# The suite is grouped by primitive and kind (lock/, rwlock/, ..., server/, stress/); the
# helpers they share (Redisson's scripts transcribed, error texts, cluster and hostile-input
# helpers) live in support/ and are imported by module name from every group.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
MODULE = os.environ.get("RLOCK_MODULE", str(ROOT / "target" / "debug" / "librlock.so"))
REDIS_SERVER = os.environ.get("REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"


# Module arguments for a server whose writes must reach replicas and the AOF as plain
# effects (`rlock.replication effects`, SPEC 1.4): for tests with a replica that has no
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
    writes for their unlock message, only while somebody waits in it (SPEC 1, README
    "Nothing held while nobody waits"). A lock is held at `key` and a ticket queued for it
    without deadline, on a connection of its own, which is returned: closing it ends the
    wait. Locks written from now on are tracked."""
    c = server.client(db=db)
    c.execute_command("RLOCK.ACQUIRE", key, "bystander-holder", 600_000)
    assert c.execute_command("RLOCK.ACQUIRE", key, "bystander", 600_000, "WAIT", 0,
                             "ASYNC", "ID", "bystander") == b"QUEUED"
    wait_until(lambda: c.info("rlock")["rlock_watching"] == 1, what="the module watching")
    return c


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server process. `args` are extra command-line config pairs."""

    def __init__(self, workdir, module=True, args=(), module_args=()):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.module = module
        self.args = list(args)
        self.module_args = list(module_args)
        self.proc = None
        self.log = self.dir / "redis.log"
        self._clients = []

    def command_line(self):
        cmd = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--dir", str(self.dir),
               "--logfile", str(self.log), "--enable-module-command", "yes",
               "--enable-debug-command", "yes"]
        if self.module:
            cmd += ["--loadmodule", MODULE, *self.module_args]
        return cmd + self.args

    def start(self):
        self.proc = subprocess.Popen(self.command_line(), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.proc.stderr.read().decode()}\n"
                                   f"{self.log.read_text() if self.log.exists() else ''}")
            try:
                if self.client().ping():
                    break
            except (redis.ConnectionError, redis.BusyLoadingError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING in 10s")
            time.sleep(0.01)
        return self

    def kind(self):
        """"valkey" or "redis": whose wording and defaults to expect (Valkey names itself
        in INFO server; it also reports a redis_version, 7.2.4, for compatibility)."""
        info = self.client().info("server")
        return "valkey" if info.get("server_name") == "valkey" else "redis"

    def version(self):
        """(major, minor) of the server's own version: Valkey's from `valkey_version`, as
        its `redis_version` stays at 7.2.4 for compatibility."""
        info = self.client().info("server")
        v = info.get("valkey_version") if self.kind() == "valkey" else info["redis_version"]
        major, minor = str(v).split(".")[:2]
        return int(major), int(minor)

    def client(self, **kw):
        kw.setdefault("socket_timeout", 30)
        c = redis.Redis(host="127.0.0.1", port=self.port, **kw)
        self._clients.append(c)
        return c

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig_kill=False):
        for c in self._clients:
            try:
                c.close()
            except Exception:
                pass
        self._clients.clear()
        if self.proc is None:
            return
        if self.proc.poll() is None:
            if sig_kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def restart(self):
        """Stops (SIGTERM, so AOF/RDB are flushed as configured) and starts again on the same dir."""
        self.stop()
        return self.start()

    def assert_alive(self):
        assert self.alive(), f"redis-server died:\n{self.log.read_text()[-3000:]}"


def crash_report(log):
    """The part of a server log that says why it died: from the crash line ("crashed by
    signal", an assertion, a panic) through the main thread's stack trace, where the
    frames name the module call that crashed; else the log's tail."""
    text = log.read_text(errors="replace") if log.exists() else ""
    for marker in ("crashed by signal", "ASSERTION FAILED", "Guru Meditation", "panicked"):
        at = text.find(marker)
        if at >= 0:
            start = text.rfind("\n", 0, max(0, at - 200)) + 1
            end = text.find("------ REGISTERS", at)
            return text[start:end if end > 0 else at + 6000][:8000]
    return text[-3000:]


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
