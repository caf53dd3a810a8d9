"""The fault harness's Python client process (faults/README.md): drives the lock through
the Python client's public surface, `rlock.Lock` (a redis-py Lock drop-in), and records
every operation in a history file in the same JSON-lines shape as the Rust worker
(faults/worker): `invoke`, then `ok`, `fail` (definitely not done) or `info` (unknown),
with CLOCK_MONOTONIC nanoseconds (`time.monotonic_ns`), which every process shares.
Under the lock it does the plain read-modify-write of the shared resource.

usage: pyworker.py --url URL --name KEY --hist FILE --proc N [--resource URL]
                   [--ops N] [--seconds S] [--watchdog-ms MS] [--hold-ms MS] [--wait-ms MS]
                   [--replica-sync N] [--mode auto|module|scripts]
"""

import argparse
import json
import random
import sys
import threading
import time
import uuid

import redis
from redis.exceptions import LockNotOwnedError, RedisError

import rlock


class History:
    """One line per event, flushed at once so that a kill -9 loses at most one line."""

    def __init__(self, path: str, proc: int) -> None:
        self.out = open(path, "a", buffering=1)
        self.proc = proc
        self.mu = threading.Lock()

    def line(self, f: str, kind: str, **extra) -> None:
        rec = {"p": self.proc, "f": f, "type": kind, "t": time.monotonic_ns(), **extra}
        with self.mu:
            self.out.write(json.dumps(rec) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--hist", required=True)
    ap.add_argument("--proc", type=int, required=True)
    ap.add_argument("--resource")
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--watchdog-ms", type=int, default=1000)
    ap.add_argument("--hold-ms", type=int, default=2)
    ap.add_argument("--wait-ms", type=int, default=1000)
    ap.add_argument("--replica-sync", type=int, default=0,
                    help="replicas to WAIT for after each acquire (0: none)")
    ap.add_argument("--mode", default="auto", choices=["auto", "module", "scripts"],
                    help="rlock.set_mode: the scripts-mode cells run auto without the module")
    a = ap.parse_args()

    h = History(a.hist, a.proc)
    r = redis.Redis.from_url(a.url, socket_timeout=3, socket_connect_timeout=2)
    rlock.set_mode(r, a.mode)
    res = redis.Redis.from_url(a.resource, socket_timeout=2, socket_connect_timeout=2) if a.resource else None
    # One token per process: one owner, as one Rust lock handle is; acquiring again
    # with the same token re-enters.
    owner = f"py-{uuid.uuid4()}:{a.proc}"
    h.line("start", "event", owner=owner)
    lock = rlock.Lock(r, a.name, blocking_timeout=a.wait_ms / 1000, thread_local=False,
                      watchdog_timeout=a.watchdog_ms / 1000,
                      on_lost=lambda name, token: h.line("lost", "event", why="NotHeld"),
                      # The harness's cells say whether replica sync is on, so the client's
                      # default (every connected replica) is not what a "without" cell measures.
                      replica_sync=(rlock.ReplicaSync(a.replica_sync, timeout=0.5)
                                    if a.replica_sync > 0 else None))
    deadline = time.monotonic() + a.seconds
    ops = 0
    plain = f"res:plain:{a.name}"
    while ops < a.ops and time.monotonic() < deadline:
        holds = 0
        for _ in range(2 if random.random() < 0.25 else 1):
            h.line("acquire", "invoke")
            ops += 1
            try:
                if lock.acquire(token=owner):
                    h.line("acquire", "ok")
                    holds += 1
                else:
                    h.line("acquire", "fail", error="timeout")
            except rlock.ReplicaSyncError:
                h.line("acquire", "fail", error="replica-sync")  # released again
            except RedisError as e:
                h.line("acquire", "info", error=str(e))
        if not holds:
            continue
        if res is not None:
            h.line("write", "invoke")
            ops += 1
            try:
                v = int(res.get(plain) or 0)
                time.sleep(a.hold_ms / 1000)
                try:
                    res.set(plain, v + 1)
                    h.line("write", "ok", read=v, wrote=v + 1)
                except RedisError as e:
                    h.line("write", "info", read=v, error=str(e))
            except RedisError as e:
                h.line("write", "fail", error=str(e))
        for _ in range(holds):
            h.line("release", "invoke")
            ops += 1
            try:
                # rlock.Lock forgets the token on release unless still held: give it back.
                lock.local.token = owner.encode()
                lock.release()
                h.line("release", "ok", outcome="still" if lock.local.token else "freed")
            except LockNotOwnedError:
                h.line("release", "fail", error="notheld")
            except RedisError as e:
                h.line("release", "info", error=str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
