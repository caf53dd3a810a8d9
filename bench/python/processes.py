"""Python contenders in separate processes (issue 40): 1, 8 and 64 processes on one lock
and on one semaphore of 4 permits, rlock's Python client against the other ways to wait.

Variants, run one after the other against one private module-loaded redis-server:
rlock's queued tickets (the client's default), rlock blocked in ``WAIT`` on a connection
of its own (``use_tickets=False``), Redisson's algorithm (the same client in scripts mode:
Redisson's Lua scripts, its pub/sub channel and its retry) and polling (redis-py's Lock,
``SET NX PX`` then a 0.1 s sleep, its default; for the semaphore a non-blocking acquire
then the same sleep). Each process loops acquire -> read-and-swap a mark -> release on
one key until the run ends; the lock's unprotected read-modify-write of a counter proves
mutual exclusion, the semaphore's INCR/DECR of a holder count that at most 4 hold.

Reported per row: owner changes/s (acquisitions that found another process's mark),
acquisitions/s, p50/p99 wait (asking to holding), Jain's index over the processes'
acquisitions, connections (the server's peak ``connected_clients`` during the run, less
the bench's own) and the server's CPU (INFO cpu, user + sys) per acquisition. The 1 and
8 contender rows are bounded by the machine as much as by the protocol: note the load
average printed with the table. `make bench-python-procs` runs it (not in `make test`).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from rlock_server import RedisServer  # noqa: E402  (the tests' one server launcher)

import rlock  # noqa: E402

LOCK = "bench:lock"
SEM = "bench:sem"
PERMITS = 4
COUNTER = "bench:counter"
HOLDERS = "bench:holders"
LAST = "bench:last"
LEASE_S = 10  # longer than any hold: nothing expires during a run
POLL_S = 0.1  # redis-py Lock's default sleep between tries


class Polling:
    """A semaphore waited for by polling: a non-blocking acquire, then `POLL_S`."""

    def __init__(self, sem: rlock.Semaphore) -> None:
        self.sem = sem

    def acquire(self, blocking_timeout: float) -> bool:
        deadline = time.monotonic() + blocking_timeout
        while not self.sem.acquire(blocking=False):
            if time.monotonic() + POLL_S > deadline:
                return False
            time.sleep(POLL_S)
        return True

    def release(self) -> None:
        self.sem.release()


def make(r: redis.Redis, primitive: str, variant: str):
    """The contender's handle: ``acquire(blocking_timeout=s)`` and ``release()``."""
    if variant == "redisson":
        rlock.set_mode(r, "scripts")
    if primitive == "lock":
        if variant == "polling":
            return r.lock(LOCK, timeout=LEASE_S, sleep=POLL_S)
        return rlock.Lock(r, LOCK, timeout=LEASE_S, replica_sync=None) \
            if variant != "blocked" else BlockedLock(r, LOCK, timeout=LEASE_S,
                                                     replica_sync=None)
    sem = rlock.Semaphore(r, SEM, use_tickets=variant != "blocked")
    return Polling(sem) if variant == "polling" else sem


class BlockedLock(rlock.Lock):
    """rlock.Lock waiting blocked in ``WAIT`` on a connection of its own (no tickets)."""

    @staticmethod
    def _io_class(redis):  # noqa: ANN001,ANN205
        from rlock import _io
        return _io.SyncIO(redis, use_tickets=False)


VARIANTS = {
    "tickets": "rlock, queued tickets (default)",
    "blocked": "rlock, blocked WAIT",
    "redisson": "Redisson's algorithm (scripts mode)",
    "polling": "polling, 0.1 s sleep (SET NX; semaphore: try-acquire)",
}


def worker(port: int, primitive: str, variant: str, duration: float, barrier, start_at,
           results) -> None:
    r = redis.Redis(port=port)
    handle = make(r, primitive, variant)
    for _ in range(3):  # warm-up: connections (and, contended, the ticket connection) made
        if handle.acquire(blocking_timeout=30):
            handle.release()
    barrier.wait()
    barrier.wait()
    time.sleep(max(0.0, start_at.value - time.monotonic()))
    stop_at = start_at.value + duration
    me = str(os.getpid()).encode()
    waits: list[float] = []
    changes = acquired = broken = 0
    while True:
        started = time.monotonic()
        left = stop_at - started
        if left <= 0:
            break
        if not handle.acquire(blocking_timeout=left):
            waits.append(left)  # a wait cut by the end of the run counts as its length
            break
        waits.append(time.monotonic() - started)
        acquired += 1
        pipe = r.pipeline(transaction=False)
        if primitive == "lock":
            pipe.get(COUNTER).getset(LAST, me)
            value, previous = pipe.execute()
            r.set(COUNTER, int(value or 0) + 1)
        else:
            pipe.incr(HOLDERS).getset(LAST, me)
            holders, previous = pipe.execute()
            broken += holders > PERMITS
            r.decr(HOLDERS)
        changes += previous is not None and previous != me
        handle.release()
    results.put((acquired, changes, waits, broken))
    r.close()


def server_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def run(port: int, primitive: str, variant: str, processes: int, duration: float) -> dict:
    r = redis.Redis(port=port)
    r.delete(LOCK, SEM, COUNTER, HOLDERS, LAST)
    if primitive == "semaphore":
        rlock.Semaphore(r, SEM).try_set_permits(PERMITS)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    start_at = ctx.Value("d", 0.0)
    procs = [ctx.Process(target=worker, args=(port, primitive, variant, duration, barrier,
                                              start_at, results))
             for _ in range(processes)]
    for p in procs:
        p.start()
    barrier.wait(timeout=120)
    start_at.value = time.monotonic() + 0.2
    barrier.wait(timeout=120)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        s = redis.Redis(port=port)
        while not done.wait(0.1):
            peak[0] = max(peak[0], int(s.info("clients")["connected_clients"]))
        s.close()

    sampler = threading.Thread(target=sample, daemon=True)
    time.sleep(max(0.0, start_at.value - time.monotonic()))
    cpu0 = server_cpu(r)
    sampler.start()
    outcomes = [results.get(timeout=duration + 120) for _ in procs]
    cpu = server_cpu(r) - cpu0
    done.set()
    sampler.join(5)
    for p in procs:
        p.join(30)
    counts = [n for n, _, _, _ in outcomes]
    acquired = sum(counts)
    if primitive == "lock" and int(r.get(COUNTER) or 0) != acquired:
        raise SystemExit(f"{variant}: mutual exclusion broken: counter {r.get(COUNTER)} "
                         f"after {acquired} acquisitions")
    if sum(b for _, _, _, b in outcomes):
        raise SystemExit(f"{variant}: more than {PERMITS} holders at once")
    waits = sorted(w for _, _, ws, _ in outcomes for w in ws)
    r.close()
    return {
        "primitive": primitive, "processes": processes, "variant": variant,
        "changes_s": sum(c for _, c, _, _ in outcomes) / duration,
        "acq_s": acquired / duration,
        "p50": statistics.median(waits) * 1000 if waits else float("nan"),
        "p99": waits[min(len(waits) - 1, int(len(waits) * 0.99))] * 1000 if waits
        else float("nan"),
        "jain": jain(counts),
        "connections": max(0, peak[0] - 2),  # less the bench's own two
        "cpu_us": cpu / acquired * 1e6 if acquired else float("nan"),
    }


def jain(counts: list) -> float:
    total, squares = sum(counts), sum(c * c for c in counts)
    return total * total / (len(counts) * squares) if squares else 0.0


def table(rows: list, version: str, duration: float, loads: tuple) -> str:
    out = [
        "## Python contenders in separate processes (`make bench-python-procs`)",
        "",
        f"One run of {duration:g} s per row on Redis {version} with the module's release "
        f"build, this machine's {os.cpu_count()} cores shared with other work (load average "
        f"{loads[0]:.1f} before, {loads[1]:.1f} after); Python "
        f"{platform.python_version()}, redis-py {redis.__version__}. Each process loops "
        "acquire -> pipelined read-and-swap of a mark -> release (the lock: and a counter's "
        "unprotected read-modify-write). Owner changes: acquisitions that found another "
        "process's mark. Wait: asking to holding (a wait cut by the run's end counts as its "
        "length). Jain: over the processes' acquisitions (1 = equal). Connections: the "
        "server's peak `connected_clients`. CPU: the server's user + sys per acquisition. "
        "`×`: rlock's tickets over the variant (owner changes/s, acquisitions/s), the "
        "variant's p99 over the tickets' (above 1: tickets ahead).",
        "",
        "| primitive | processes | variant | owner changes/s | acquisitions/s | p50 wait | "
        "p99 wait | Jain | connections | server CPU/acq | × changes/s | × acq/s | × p99 |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = {}
    for row in rows:
        if row["variant"] == "tickets":
            base[(row["primitive"], row["processes"])] = row
    for row in rows:
        b = base[(row["primitive"], row["processes"])]

        def ratio(x: float, y: float) -> str:
            return f"{x / y:.2f}" if y else "–"
        out.append(
            f"| {row['primitive']} | {row['processes']} | {VARIANTS[row['variant']]} | "
            f"{row['changes_s']:.0f} | {row['acq_s']:.0f} | {row['p50']:.1f} ms | "
            f"{row['p99']:.1f} ms | {row['jain']:.3f} | {row['connections']} | "
            f"{row['cpu_us']:.0f} µs | "
            + ("– | – | – |" if row is b else
               f"{ratio(b['changes_s'], row['changes_s'])} | {ratio(b['acq_s'], row['acq_s'])}"
               f" | {ratio(row['p99'], b['p99'])} |"))
    return "\n".join(out) + "\n"


BEGIN, END = "<!-- bench-python-procs:begin -->", "<!-- bench-python-procs:end -->"


def write_into(path: Path, text: str) -> None:
    """Replaces the table between its markers in ``path`` (appends it the first time)."""
    doc = path.read_text(encoding="utf-8")
    block = f"{BEGIN}\n{text}{END}"
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        doc = head + block + rest.split(END, 1)[1]
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(doc, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default=os.environ.get("RLOCK_MODULE"))
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per row")
    parser.add_argument("--processes", default="1,8,64")
    parser.add_argument("--primitives", default="lock,semaphore")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--report", type=Path, help="write the table between its markers here")
    args = parser.parse_args()
    server = RedisServer(module=args.module).start()
    rows = []
    before = os.getloadavg()[0]
    try:
        version = redis.Redis(port=server.port).info("server")["redis_version"]
        for primitive in args.primitives.split(","):
            for n in (int(x) for x in args.processes.split(",")):
                for variant in args.variants.split(","):
                    row = run(server.port, primitive, variant, n, args.duration)
                    print(f"{primitive} {n} {variant}: {row['changes_s']:.0f} changes/s "
                          f"{row['acq_s']:.0f} acq/s p99 {row['p99']:.1f} ms "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
                    rows.append(row)
    finally:
        server.stop()
    text = table(rows, version, args.duration, (before, os.getloadavg()[0]))
    print(text)
    if args.report:
        write_into(args.report, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
