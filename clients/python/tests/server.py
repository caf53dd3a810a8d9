"""A redis-server on a free port, for the Python client's tests: module-loaded, or
plain (``module=False``: what a managed service is, for scripts mode).

Used by tests/conftest.py here and copied next to redis-py's lock tests by
redis_py_suite/run.py. Finds the module through $RLOCK_MODULE (the Makefile sets it) and
the server through $REDIS_SERVER, like the module's own tests/conftest.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import redis

ROOT = Path(__file__).resolve().parents[3]


def _default_module() -> str:
    return os.environ.get("RLOCK_MODULE", str(ROOT / "target" / "debug" / "librlock.so"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: A user restricted like a managed service's: every command but the dangerous ones (no
#: MODULE, CONFIG, DEBUG, CLIENT KILL, INFO...), every key and channel.
RESTRICTED_USER = ("app", "app-secret")


class RedisServer:
    """One redis-server process, with the rlock module unless ``module=False``;
    `start()`, then `stop()`."""

    def __init__(self, module: "Optional[str] | bool" = None) -> None:
        # The server chdirs to --dir: an absolute path.
        self.module = (None if module is False
                       else os.path.abspath(module or _default_module()))
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="rlock-py-")
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        """redis:// URL of the server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        """Starts the server and waits (bounded) until it answers PING."""
        binary = (os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
                  or "/usr/bin/redis-server")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir]
            + (["--loadmodule", self.module] if self.module else []),
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        client = redis.Redis(port=self.port, socket_timeout=5)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not answer PING in 10 s")
                time.sleep(0.01)
        finally:
            client.close()

    def add_restricted_user(self) -> None:
        """Creates `RESTRICTED_USER` (``+@all -@dangerous``, all keys and channels)."""
        name, password = RESTRICTED_USER
        client = redis.Redis(port=self.port, socket_timeout=5)
        try:
            client.execute_command("ACL", "SETUSER", name, "on", f">{password}", "~*", "&*",
                                   "+@all", "-@dangerous")
        finally:
            client.close()

    def alive(self) -> bool:
        """True while the server process runs."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Terminates the server (killing it if it does not stop in 10 s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)
