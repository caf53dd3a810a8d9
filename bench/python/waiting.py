"""Python waiting bench: the threads of one redis-py client contending, side by side.

The issue's setting: one ``redis.Redis`` shared by many threads (a web worker, a job
runner), all waiting on one lock or one semaphore. For each variant, T threads loop
acquire -> critical section -> release for D seconds against one private module-loaded
server, one variant after the other in one run:

* lock (critical section: GET counter, SET counter+1; the final counter must equal the
  acquisitions, which checks mutual exclusion): `rlock.Lock` (queued tickets on one
  ticket connection), python-redis-lock (SET NX + BLPOP on a signal list: the popular
  choice; each waiting thread blocks a connection), redis-py's Lock (SET NX, polling every
  0.1 s);
* semaphore (P permits; critical section: 1 ms): `rlock.Semaphore` against Redisson's
  RSemaphore algorithm in redis-py (its tryAcquire and release scripts, imported from the
  module suite's tests/support/redisson_sync.py; a failed try waits for a release message on
  ``redisson_sc:{name}`` through one subscription shared by the process's threads, as one
  Redisson client has, then tries again). No semaphore on PyPI beats that design: pottery
  has none, and the list-of-tokens BLPOP ones block a connection per waiter.

Every wait ends a little after the round; a wait still going at the end of the round
counts as lasting until then (a thread that starved all round shows in the p99).
Reported per variant: handoffs/s (acquisitions that passed the lock, or a permit, to a
thread other than the one that had it last: a releaser that takes it straight back hands
nothing to anyone), acquisitions/s, p50/p99 wait per acquire, Jain's fairness index over
the threads' acquisition counts, and connections (the most the server saw, sampled every
50 ms, minus the bench's own). `make bench-python` writes bench/python/contention.md.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import redis
import redis_lock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python" / "tests"))
sys.path.append(str(ROOT / "tests"))
sys.path.append(str(ROOT / "tests" / "support"))
from redisson_sync import SEM_RELEASE, SEM_TRY_ACQUIRE, semaphore_channel  # noqa: E402
from rlock_server import RedisServer  # noqa: E402  (the tests' one server launcher)

import rlock  # noqa: E402

LOCK = "bench:lock"
COUNTER = "bench:counter"
SEM = "bench:sem"
LEASE_S = 30


class RedissonSemaphorePort:
    """Redisson's RSemaphore algorithm on redis-py (see the module docstring)."""

    def __init__(self, r: redis.Redis, name: str) -> None:
        self.name = name
        self.channel = semaphore_channel(name)
        self._try = r.register_script(SEM_TRY_ACQUIRE)
        self._release = r.register_script(SEM_RELEASE)
        self.cond = threading.Condition()
        self.gen = 0
        self.pubsub = r.pubsub()
        self.pubsub.subscribe(self.channel)
        self.pubsub.get_message(timeout=5)  # the subscription's confirmation
        self.running = True
        self.listener = threading.Thread(target=self._listen, daemon=True)
        self.listener.start()

    def _listen(self) -> None:
        while self.running:
            m = self.pubsub.get_message(timeout=0.1)
            if m is not None and m["type"] == "message":
                with self.cond:
                    self.gen += 1
                    self.cond.notify_all()

    def acquire(self, deadline: float) -> bool:
        while True:
            with self.cond:
                seen = self.gen
            if self._try(keys=[self.name], args=[1]) == 1:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with self.cond:
                self.cond.wait_for(lambda: self.gen != seen, timeout=min(left, 1.0))

    def release(self) -> None:
        self._release(keys=[self.name, self.channel], args=[1, "publish"])

    def close(self) -> None:
        self.running = False
        self.listener.join(1)
        self.pubsub.close()


def lock_variants() -> Dict[str, Callable[[redis.Redis], Callable[[], Any]]]:
    """name -> (client -> (a new lock object))."""
    return {
        "rlock.Lock": lambda r: lambda: r.lock(LOCK, timeout=LEASE_S, lock_class=rlock.Lock),
        "python-redis-lock": lambda r: lambda: redis_lock.Lock(r, LOCK, expire=LEASE_S),
        "redis-py Lock": lambda r: lambda: r.lock(LOCK, timeout=LEASE_S),
    }


def acquire(obj: Any, left: float) -> bool:
    """Acquires with a wait of `left` seconds, in each library's terms."""
    if isinstance(obj, redis_lock.Lock):
        return obj.acquire(timeout=max(1, math.ceil(left)))  # whole seconds only
    if isinstance(obj, RedissonSemaphorePort):
        return obj.acquire(time.monotonic() + left)
    return obj.acquire(blocking_timeout=left)


def jain(xs: List[int]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 0.0


def pct(xs: List[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_round(port: int, threads: int, duration: float, kind: str, variant: str,
              permits: int) -> Dict[str, Any]:
    """One variant: `threads` threads of one client for `duration` seconds."""
    admin = redis.Redis(port=port)
    admin.flushall()
    r = redis.Redis(port=port)  # the shared client; its pool grows as the threads need
    sem_port = None
    if kind == "lock":
        make = lock_variants()[variant](r)
    else:
        if variant == "rlock.Semaphore":
            sem = rlock.Semaphore(r, SEM)
            assert sem.try_set_permits(permits)
            make = lambda: sem  # noqa: E731
        else:
            admin.set(SEM, permits)
            sem_port = RedissonSemaphorePort(r, SEM)
            make = lambda: sem_port  # noqa: E731
    r.ping()
    baseline = len(admin.client_list())
    counts = [0] * threads
    waits: List[float] = []
    last = [-1]
    handoffs = [0]
    in_cs = [0]
    peak = [0]
    start = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def worker(i: int) -> None:
        start.wait()
        while True:
            obj = make()
            t0 = time.monotonic()
            if t0 >= stop_at[0]:
                return
            # Waits end a little after the round (the end of the round is the cut-off); a
            # wait still going at the end counts as lasting until the end (censored), so
            # that a thread starved all round shows in the p99.
            if not acquire(obj, stop_at[0] - t0 + 0.5):
                waits.append(stop_at[0] - t0)
                return
            t1 = time.monotonic()
            if kind == "lock":
                value = r.get(COUNTER)
                r.set(COUNTER, int(value or 0) + 1)
                in_cs[0] += 1
            else:
                time.sleep(0.001)
            if t1 < stop_at[0]:
                counts[i] += 1
                waits.append(t1 - t0)
                if last[0] != i:
                    handoffs[0] += 1
                last[0] = i
            else:
                waits.append(stop_at[0] - t0)
            obj.release()

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    stop_at[0] = time.monotonic() + 0.05 + duration
    start.wait()
    while time.monotonic() < stop_at[0]:
        peak[0] = max(peak[0], len(admin.client_list()) - baseline)
        time.sleep(0.05)
    for t in pool:
        t.join(60)
    alive = sum(t.is_alive() for t in pool)
    if kind == "lock":
        assert int(admin.get(COUNTER) or 0) == in_cs[0], "mutual exclusion broken"
    if sem_port is not None:
        sem_port.close()
    rlock.close_tickets(r)
    r.close()
    admin.close()
    total = sum(counts)
    return {"variant": variant, "acq": total / duration, "handoffs": handoffs[0] / duration,
            "p50": pct(waits, 0.5), "p99": pct(waits, 0.99), "jain": jain(counts),
            "connections": peak[0], "stuck": alive}


def table(rows: List[Dict[str, Any]], title: str) -> List[str]:
    ref = rows[0]
    out = [f"### {title}", "",
           "| variant | handoffs/s | rlock × | acquisitions/s | p50 wait | p99 wait | "
           "p99: rlock ÷ | Jain | connections |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        ratio = ref["handoffs"] / row["handoffs"] if row["handoffs"] else float("inf")
        p99 = ref["p99"] / row["p99"] if row["p99"] else float("nan")
        out.append(f"| {row['variant']} | {row['handoffs']:.0f} | {ratio:.1f} | "
                   f"{row['acq']:.0f} | {row['p50'] * 1000:.1f} ms | "
                   f"{row['p99'] * 1000:.0f} ms | {p99:.3f} | {row['jain']:.3f} | "
                   f"{row['connections']} |")
    return out + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", required=True)
    ap.add_argument("--threads", type=int, default=200)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--permits", type=int, default=4)
    ap.add_argument("--report")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 20 threads, 0.5 s")
    args = ap.parse_args()
    if args.quick:
        args.threads, args.duration = 20, 0.5
    server = RedisServer(module=args.module).start()
    try:
        version = redis.Redis(port=server.port).info("server")["redis_version"]
        locks = [run_round(server.port, args.threads, args.duration, "lock", v, 0)
                 for v in lock_variants()]
        sems = [run_round(server.port, args.threads, args.duration, "semaphore", v,
                          args.permits)
                for v in ("rlock.Semaphore", "Redisson's algorithm (redis-py port)")]
    finally:
        server.stop()
    lines = ["# Python waiting bench", "",
             f"`bench/python/waiting.py`: {args.threads} threads of one `redis.Redis` on one "
             f"lock, then on one semaphore of {args.permits} permits; {args.duration:g} s "
             "per variant, one variant after the other in one run.", "",
             f"Machine: 2 cores, {platform.platform()}; Python {platform.python_version()}; "
             f"redis-py {redis.__version__}; python-redis-lock {redis_lock.__version__}; "
             f"server {version} with the module's release build.", ""]
    lines += table(locks, "Lock (critical section: GET + SET of a counter)")
    lines += table(sems, f"Semaphore ({args.permits} permits, critical section: 1 ms)")
    lines += ["Handoffs: acquisitions by another thread than the previous one (a releaser "
              "that takes it straight back hands nothing over). `rlock ×`: rlock's handoffs/s "
              "divided by the variant's; `p99: rlock ÷`: rlock's p99 wait divided by the "
              "variant's (the goal is at most 0.1). Connections: the most the server saw "
              "during the round beyond the bench's own. Jain's index is over the threads' "
              "acquisition counts (1.0 = all equal)."]
    stuck = [r for r in locks + sems if r["stuck"]]
    if stuck:
        lines.append(f"\nThreads still waiting at the end: {stuck}")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        Path(args.report).write_text(text)


if __name__ == "__main__":
    main()
