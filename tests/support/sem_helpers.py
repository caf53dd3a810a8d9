"""Helpers shared by the semaphore tests (test_semaphore.py, test_expirable.py, the
interop, fuzz and leak files): a call blocked in the server on its own connection and
thread, and the INFO/queue probes that tell when it is queued."""

import threading
import time

import redis

from conftest import wait_until


class BlockedCall:
    """One command (typically `... WAIT t`) sent on a connection of its own, in a thread.
    `result` / `error` once `done` is set; `at` is when the reply arrived (time.time())."""

    def __init__(self, server, *command):
        self.client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=60)
        self.client_id = self.client.client_id()
        self.command = command
        self.result = self.error = self.at = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            self.result = self.client.execute_command(*self.command)
        except Exception as e:  # noqa: BLE001 (a closed connection ends the thread too)
            self.error = e
        finally:
            self.at = time.time()
            self.done.set()

    def start(self):
        self.thread.start()
        return self

    def wait(self, timeout=10):
        assert self.done.wait(timeout), f"{self.command!r} still blocked after {timeout}s"
        return self.result

    def close(self):
        try:
            self.client.close()
        except Exception:
            pass
        self.thread.join(10)


def info_map(r, command, key):
    """`RSEMAPHORE.INFO` / `RPSEMAPHORE.INFO` as a dict of str -> int (RESP2 flat pairs)."""
    flat = r.execute_command(command, key)
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in zip(flat[::2], flat[1::2])}


def waiters(r, key, command="RSEMAPHORE.INFO"):
    return info_map(r, command, key)["waiters"]


def queue(server, r, key, *command, info="RSEMAPHORE.INFO"):
    """Starts a blocked call and returns it once the server has queued it."""
    before = waiters(r, key, info)
    call = BlockedCall(server, *command).start()
    wait_until(lambda: waiters(r, key, info) > before or call.done.is_set(),
               what=f"{command!r} queued")
    assert not call.done.is_set(), f"answered at once: {call.result!r} {call.error!r}"
    return call


def rlock_info(r, field):
    return r.info("rlock")[f"rlock_{field}"]
