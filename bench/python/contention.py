"""Python contention benchmark: N processes on one lock, rlock.Lock against python-redis-lock
and redis-py's Lock.

Each process loops acquire -> GET counter -> SET counter+1 -> release on one key for the
round's duration; the unprotected read-modify-write proves mutual exclusion (the final
counter must equal the number of acquisitions). Variants, run side by side against one
private module-loaded redis-server, in alternating rounds: rlock.Lock (waits in the
server), python-redis-lock (SET NX, then BLPOP on a signal list), redis-py's Lock with its
default sleep (0.1 s) and with sleep=0.001. Reports
handoffs/s, Jain's fairness index over the processes and the p99 wait per acquire, and
writes a Markdown report. `make bench-python` runs it; `make test-pyclient` runs --quick.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import redis
import redis.lock
import redis_lock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "clients" / "python" / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "support"))
from rlock_server import RedisServer  # noqa: E402  (the tests' one server launcher)

import rlock  # noqa: E402
from rlock import _io as rlock_io  # noqa: E402

KEY = "bench:lock"
COUNTER = "bench:counter"
LAST = "bench:last-holder"
LEASE_S = 10  # longer than any hold: no lock expires during a round

class BlockingLock(rlock.Lock):
    """rlock.Lock waiting blocked in WAIT on a connection of its own (no tickets)."""

    @staticmethod
    def _io_class(redis):  # noqa: ANN001,ANN205
        return rlock_io.SyncIO(redis, use_tickets=False)


class RedisLockAdapter:
    """python-redis-lock (SET NX + BLPOP on a signal list) with redis-py's acquire
    arguments; its own timeout is in whole seconds."""

    def __init__(self, r: redis.Redis) -> None:
        self.lock = redis_lock.Lock(r, KEY, expire=LEASE_S)

    def acquire(self, blocking_timeout: float) -> bool:
        return self.lock.acquire(timeout=max(1, math.ceil(blocking_timeout)))

    def release(self) -> None:
        self.lock.release()


VARIANTS = {
    "rlock.Lock": lambda r: r.lock(KEY, timeout=LEASE_S, lock_class=rlock.Lock),
    "rlock.Lock, blocking WAIT": lambda r: BlockingLock(r, KEY, timeout=LEASE_S),
    "python-redis-lock": RedisLockAdapter,
    "redis-py Lock, sleep=0.1": lambda r: r.lock(KEY, timeout=LEASE_S),
    "redis-py Lock, sleep=0.001": lambda r: r.lock(KEY, timeout=LEASE_S, sleep=0.001),
}


def worker(port: int, variant: str, duration: float, barrier, start_at, results) -> None:
    """One contender: loops until the round ends, then reports (acquisitions, waits)."""
    r = redis.Redis(port=port)
    lock = VARIANTS[variant](r)
    r.ping()
    barrier.wait()  # everyone connected: the main process sets start_at
    barrier.wait()
    # One start and one stop instant for all (CLOCK_MONOTONIC is system-wide), so that a
    # process scheduled late does not get a shorter round and skew the fairness index.
    time.sleep(max(0.0, start_at.value - time.monotonic()))
    stop_at = start_at.value + duration
    waits: list[float] = []
    me = str(os.getpid()).encode()
    changes = 0  # acquisitions that took the lock from another process
    while True:
        started = time.monotonic()
        left = stop_at - started
        if left <= 0:
            break
        if not lock.acquire(blocking_timeout=left):
            break
        waits.append(time.monotonic() - started)
        pipe = r.pipeline(transaction=False)
        pipe.get(COUNTER).getset(LAST, me)
        value, previous = pipe.execute()
        if previous != me:
            changes += 1
        r.set(COUNTER, int(value or 0) + 1)
        lock.release()
    results.put((len(waits), changes, waits))
    r.close()


def jain(counts: list[int]) -> float:
    """Jain's fairness index: 1.0 when every process got the lock equally often."""
    total = sum(counts)
    squares = sum(c * c for c in counts)
    return total * total / (len(counts) * squares) if squares else 0.0


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def run_round(port: int, variant: str, processes: int, duration: float) -> dict:
    """One round of one variant: `processes` contenders for `duration` seconds."""
    r = redis.Redis(port=port)
    r.delete(KEY, COUNTER, LAST)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    start_at = ctx.Value("d", 0.0)
    procs = [ctx.Process(target=worker,
                         args=(port, variant, duration, barrier, start_at, results))
             for _ in range(processes)]
    for p in procs:
        p.start()
    barrier.wait(timeout=60)
    start_at.value = time.monotonic() + 0.2
    barrier.wait(timeout=60)
    outcomes = [results.get(timeout=duration + 60) for _ in procs]
    elapsed = duration
    for p in procs:
        p.join(30)
    counts = [n for n, _, _ in outcomes]
    changes = sum(c for _, c, _ in outcomes)
    waits = [w for _, _, ws in outcomes for w in ws]
    counter = int(r.get(COUNTER) or 0)
    if counter != sum(counts):
        raise SystemExit(f"{variant}: mutual exclusion broken: counter {counter} "
                         f"after {sum(counts)} acquisitions")
    r.close()
    return {"variant": variant, "elapsed": elapsed, "counts": counts, "changes": changes,
            "waits": waits}


def summarize(rounds: list[dict], variant: str) -> dict:
    mine = [x for x in rounds if x["variant"] == variant]
    handoffs = sum(sum(x["counts"]) for x in mine)
    elapsed = sum(x["elapsed"] for x in mine)
    waits = [w for x in mine for w in x["waits"]]
    fairness = [jain(x["counts"]) for x in mine]
    changes = sum(x["changes"] for x in mine)
    return {"variant": variant, "handoffs": handoffs, "per_s": handoffs / elapsed,
            "changes_per_s": changes / elapsed,
            "jain": statistics.mean(fairness), "jain_min": min(fairness),
            "p50_ms": statistics.median(waits) * 1000 if waits else float("nan"),
            "p99_ms": p99(waits) * 1000}


def report(rows: list[dict], args: argparse.Namespace, server_version: str) -> str:
    base = rows[0]
    lines = [
        "# Python contention benchmark",
        "",
        f"`bench/python/contention.py`: {args.processes} processes on one lock, each looping "
        "acquire -> GET -> SET -> release; "
        f"{args.rounds} alternating round(s) of {args.duration:g} s per variant.",
        "",
        f"Machine: {os.cpu_count()} cores, {platform.platform()}; Python "
        f"{platform.python_version()}; redis-py {redis.__version__}; redis-server "
        f"{server_version} with the module's release build.",
        "",
        "| variant | handoffs/s | rlock × | owner changes/s | rlock × | Jain (mean / worst) "
        "| p50 wait | p99 wait |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        ratio = base["per_s"] / row["per_s"] if row["per_s"] else float("inf")
        cratio = (base["changes_per_s"] / row["changes_per_s"] if row["changes_per_s"]
                  else float("inf"))
        lines.append(f"| {row['variant']} | {row['per_s']:.0f} | {ratio:.1f} | "
                     f"{row['changes_per_s']:.0f} | {cratio:.1f} | "
                     f"{row['jain']:.3f} / {row['jain_min']:.3f} | {row['p50_ms']:.1f} ms | "
                     f"{row['p99_ms']:.1f} ms |")
    lines += ["", "Handoffs: acquisitions (as the Rust benchmark counts them). Owner changes: "
              "acquisitions by another process than the previous holder's (a releaser that "
              "takes the lock straight back is not a handoff to anyone). `rlock ×`: "
              "rlock.Lock's figure divided by the variant's. Jain's index is over the "
              "processes' acquisition counts (1.0 = all equal)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default=os.environ.get("RLOCK_MODULE"),
                        help="librlock.so to load (use the release build for numbers)")
    parser.add_argument("--processes", type=int, default=32)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per variant")
    parser.add_argument("--report", type=Path, help="write the Markdown report here")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 4 processes, one 1 s round (checks, no numbers)")
    args = parser.parse_args()
    if args.quick:
        args.processes, args.duration, args.rounds = 4, 1.0, 1
    server = RedisServer(module=args.module).start()
    try:
        version = redis.Redis(port=server.port).info("server")["redis_version"]
        rounds = []
        for n in range(args.rounds):
            for variant in VARIANTS:
                result = run_round(server.port, variant, args.processes, args.duration)
                print(f"round {n + 1} {variant}: {sum(result['counts'])} handoffs "
                      f"in {result['elapsed']:.1f} s, Jain {jain(result['counts']):.3f}",
                      flush=True)
                rounds.append(result)
    finally:
        server.stop()
    rows = [summarize(rounds, v) for v in VARIANTS]
    text = report(rows, args, version)
    print(text)
    if args.report:
        args.report.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
