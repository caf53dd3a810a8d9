"""The one Python launcher of a test redis-server: a real server process on a free port of
127.0.0.1, with the rlock module loaded (or plain, ``module=False``: what a managed
service is, for the clients' scripts mode), its files in a directory of its own.

Used by the module's integration tests (tests/conftest.py re-exports it), the Python
client's tests (clients/python/tests, which put tests/support on their path), the
redis-py lock suites (clients/python/redis_py_suite/run.py copies this file beside them)
and the benches (bench/semaphore.py, bench/python/). Only two launchers stay apart, for
what they add around the process: bench/instr.py runs the server under callgrind, and
faults/harness.py inside network namespaces with its own fault controls.

The module is found through $RLOCK_MODULE (the Makefile sets it), the server binary
through $REDIS_SERVER: Redis 7.0, Redis 8.2 or Valkey 9.1.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence, Union

import redis

ROOT = Path(__file__).resolve().parents[2]
MODULE = os.environ.get("RLOCK_MODULE", str(ROOT / "target" / "debug" / "librlock.so"))
REDIS_SERVER = (os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
                or "/usr/bin/redis-server")

#: A user restricted like a managed service's: every command but the dangerous ones (no
#: MODULE, CONFIG, DEBUG, CLIENT KILL, INFO...), every key and channel.
RESTRICTED_USER = ("app", "app-secret")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortTaken(RuntimeError):
    """The server exited because its port was taken (`bind: Address already in use`)."""


class RedisServer:
    """One redis-server process; `start()`, then `stop()`.

    ``workdir``: where its files go (kept); None: a new temporary directory, removed by
    `stop()`. ``module``: True (or None) loads $RLOCK_MODULE, a path loads that file,
    False loads nothing. ``args``: extra config pairs; ``module_args``: the module's.
    ``binary``: the server to run (default $REDIS_SERVER).
    """

    def __init__(self, workdir: Union[str, Path, None] = None,
                 module: Union[bool, str, None] = True, args: Sequence[str] = (),
                 module_args: Sequence[str] = (), binary: Optional[str] = None) -> None:
        self.binary = binary or REDIS_SERVER
        self._owns_dir = workdir is None
        # The server chdirs to --dir: an absolute path.
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="rlock-")).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        if module is False:
            self.module: Optional[str] = None
        elif module is True or module is None:
            self.module = os.path.abspath(MODULE)
        else:
            self.module = os.path.abspath(module)
        self.args = list(args)
        self.module_args = list(module_args)
        self.proc: Optional[subprocess.Popen] = None
        self.log = self.dir / "redis.log"
        self._clients: list = []
        #: Answered once: later starts are restarts, on the same port.
        self._started = False

    @property
    def url(self) -> str:
        """redis:// URL of the server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def command_line(self) -> list:
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--dir", str(self.dir),
               "--logfile", str(self.log), "--enable-module-command", "yes",
               "--enable-debug-command", "yes"]
        if self.module:
            cmd += ["--loadmodule", self.module, *self.module_args]
        return cmd + self.args

    def start(self) -> "RedisServer":
        """Starts the server and waits (bounded) until it answers PING. The first start
        moves to another free port if its own was taken before the server bound it (by
        another process); a restart keeps its port."""
        for attempt in range(1, 6):
            try:
                return self._start()
            except PortTaken:
                if self._started or attempt == 5:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start(self) -> "RedisServer":
        self.proc = subprocess.Popen(self.command_line(), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        probe = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        try:
            while True:
                if self.proc.poll() is not None:
                    why = (f"redis-server exited: {self.proc.stderr.read().decode()}\n"
                           f"{self.log.read_text() if self.log.exists() else ''}")
                    if "Address already in use" in why:
                        raise PortTaken(why)
                    raise RuntimeError(why)
                try:
                    if probe.ping():
                        self._started = True
                        return self
                # (TimeoutError: whatever took the port answers nothing; the exit says.)
                except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not answer PING in 10s")
                time.sleep(0.01)
        finally:
            probe.close()

    def kind(self) -> str:
        """"valkey" or "redis": whose wording and defaults to expect (Valkey names itself
        in INFO server; it also reports a redis_version, 7.2.4, for compatibility)."""
        info = self.client().info("server")
        return "valkey" if info.get("server_name") == "valkey" else "redis"

    def version(self) -> tuple:
        """(major, minor) of the server's own version: Valkey's from `valkey_version`, as
        its `redis_version` stays at 7.2.4 for compatibility."""
        info = self.client().info("server")
        v = info.get("valkey_version") if self.kind() == "valkey" else info["redis_version"]
        major, minor = str(v).split(".")[:2]
        return int(major), int(minor)

    def client(self, **kw) -> redis.Redis:
        """A redis-py client of the server, closed by `stop()`."""
        kw.setdefault("socket_timeout", 30)
        c = redis.Redis(host="127.0.0.1", port=self.port, **kw)
        self._clients.append(c)
        return c

    def add_restricted_user(self) -> None:
        """Creates `RESTRICTED_USER` (``+@all -@dangerous``, all keys and channels)."""
        name, password = RESTRICTED_USER
        c = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        try:
            c.execute_command("ACL", "SETUSER", name, "on", f">{password}", "~*", "&*",
                              "+@all", "-@dangerous")
        finally:
            c.close()

    def alive(self) -> bool:
        """True while the server process runs."""
        return self.proc is not None and self.proc.poll() is None

    def _end_process(self, sig_kill: bool) -> None:
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

    def stop(self, sig_kill: bool = False) -> None:
        """Stops the server (SIGTERM, so AOF/RDB are flushed as configured; SIGKILL with
        ``sig_kill``, or when it does not stop in 10 s); removes a temporary directory."""
        self._end_process(sig_kill)
        if self._owns_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self, sig_kill: bool = False, down: float = 0.0) -> "RedisServer":
        """Stops (SIGTERM; SIGKILL with ``sig_kill``: nothing more is written), keeps the
        port closed for ``down`` seconds, and starts again on the same port and directory."""
        self._end_process(sig_kill)
        time.sleep(down)
        return self.start()

    def assert_alive(self) -> None:
        assert self.alive(), f"redis-server died:\n{self.log.read_text()[-3000:]}"


def crash_report(log: Path) -> str:
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
