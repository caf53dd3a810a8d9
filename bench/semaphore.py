#!/usr/bin/env python3
"""Semaphore bench: RSEMAPHORE / RPSEMAPHORE against Redisson's algorithm, side by side
in one run on one server (so the ratios mean something on a shared machine).

1. Contention: N clients (processes, each on connections of its own) loop acquire(1) ->
   hold -> release on one semaphore of P permits, for S seconds each side.
   - module: `RSEMAPHORE.ACQUIRE s 1 WAIT 0` (FIFO in the server), `RSEMAPHORE.RELEASE`.
   - Redisson: its tryAcquire script; on failure wait for a message on `redisson_sc:{s}`
     (each client its own subscription, as separate JVMs have) and retry; its release
     script (INCRBY + PUBLISH).
   Reported: permits/s, Jain's fairness index over per-client counts, p50/p99 wait.
2. Reclaim delay: a holder takes a permit of a permit-expirable semaphore with a lease
   and vanishes; a waiter waits. Delay = when the waiter holds it - the lease end.
   - module: `RPSEMAPHORE.ACQUIRE ... WAIT` (served by the module's lease timer).
   - Redisson: its waiter sleeps until the earliest expiry its script reports
     (`:<score>`), then retries (the best a Redisson waiter does).
   Also, with nobody waiting: when the count key says the permit is back (module: its
   timer; Redisson: only when some client next runs a script, i.e. never here).

Standard library + redis-py (the tests' virtualenv):
    .venv/bin/python bench/semaphore.py --module target/release/librlock.so
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import multiprocessing
import time

import redis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
from redisson_sync import (NON_EXPIRABLE, PES_TRY_ACQUIRE, SEM_RELEASE,  # noqa: E402
                           SEM_TRY_ACQUIRE, new_permit_id)
from rlock_server import RedisServer  # noqa: E402


def start_server(binary, module, workdir):
    """The tests' one launcher (tests/support/rlock_server.py), room for 10 000 clients."""
    return RedisServer(workdir, module=module, args=["--maxclients", "10000"],
                       binary=binary).start()


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * p))] if v else float("nan")


def jain(counts):
    s = sum(counts)
    return s * s / (len(counts) * sum(c * c for c in counts)) if s else 0.0


def _module_client(port, key, hold_s, barrier, stop_at, out, i):
    r = redis.Redis(port=port)
    count, waits = 0, []
    barrier.wait()
    while time.time() < stop_at.value:
        t0 = time.monotonic()
        assert r.execute_command("RSEMAPHORE.ACQUIRE", key, 1, "WAIT", 0) == 1
        waits.append(time.monotonic() - t0)
        time.sleep(hold_s)
        r.execute_command("RSEMAPHORE.RELEASE", key, 1)
        count += 1
    out.put((i, count, waits))


def _redisson_client(port, key, hold_s, barrier, stop_at, out, i):
    r = redis.Redis(port=port)
    acquire_sha, release_sha = r.script_load(SEM_TRY_ACQUIRE), r.script_load(SEM_RELEASE)
    channel = "redisson_sc:{%s}" % key
    p = r.pubsub()
    p.subscribe(channel)
    p.get_message(timeout=5)  # the subscribe confirmation
    count, waits = 0, []
    barrier.wait()
    while time.time() < stop_at.value:
        t0 = time.monotonic()
        while r.evalsha(acquire_sha, 1, key, 1) != 1:
            # Wait for "permits may be free", then retry (SemaphorePubSub's latch).
            p.get_message(timeout=1.0)
        waits.append(time.monotonic() - t0)
        time.sleep(hold_s)
        r.evalsha(release_sha, 2, key, channel, 1, "publish")
        count += 1
    p.close()
    out.put((i, count, waits))


def contention(port, side, clients, permits, seconds, hold_s):
    """One process per client (as separate JVMs or services are: no shared interpreter
    lock between them), each with connections of its own."""
    key = f"bench:{side}"
    ctl = redis.Redis(port=port)
    ctl.delete(key)
    ctl.set(key, permits)
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(clients + 1)
    stop_at = ctx.Value("d", 0.0)
    out = ctx.Queue()
    target = _module_client if side == "module" else _redisson_client
    procs = [ctx.Process(target=target, args=(port, key, hold_s, barrier, stop_at, out, i))
             for i in range(clients)]
    for p in procs:
        p.start()
    stop_at.value = time.time() + seconds + 0.2
    barrier.wait()
    t0 = time.monotonic()
    results = [out.get(timeout=seconds + 60) for _ in procs]
    elapsed = time.monotonic() - t0
    for p in procs:
        p.join(10)
    counts = [c for _, c, _ in results]
    all_waits = [w for _, _, ws in results for w in ws]
    return {"permits_s": sum(counts) / elapsed, "jain": jain(counts),
            "p50_ms": 1000 * pct(all_waits, 0.5), "p99_ms": 1000 * pct(all_waits, 0.99),
            "total": sum(counts)}


def reclaim_module(port, lease_ms, rounds):
    r = redis.Redis(port=port)
    delays = []
    for n in range(rounds):
        key = f"rc:m:{n}"
        r.execute_command("RPSEMAPHORE.TRYSETPERMITS", key, 1)
        r.execute_command("RPSEMAPHORE.ACQUIRE", key, lease_ms)  # the holder vanishes
        end = int(r.zrange("{%s}:timeout" % key, 0, 0, withscores=True)[0][1])
        w = redis.Redis(port=port)
        w.execute_command("RPSEMAPHORE.ACQUIRE", key, 60_000, "WAIT", 10_000)
        delays.append(time.time() * 1000 - end)
        w.close()
    return delays


def reclaim_redisson(port, lease_ms, rounds):
    r = redis.Redis(port=port)
    sha = r.script_load(PES_TRY_ACQUIRE)
    delays = []
    for n in range(rounds):
        key = f"rc:r:{n}"
        zset, channel = "{%s}:timeout" % key, "redisson_sc:{%s}" % key
        r.set(key, 1)

        def attempt(lease):
            now = int(time.time() * 1000)
            return r.evalsha(sha, 3, key, zset, channel, 1, now + lease, now, NON_EXPIRABLE,
                             "publish", bytes.fromhex(new_permit_id()))
        assert attempt(lease_ms) == b"OK"
        end = int(r.zrange(zset, 0, 0, withscores=True)[0][1])
        while True:
            reply = attempt(60_000)
            if reply == b"OK":
                break
            # Redisson's waiter sleeps until the earliest expiry the script reported.
            at = int(reply[1:]) if reply and reply.startswith(b":") else int(time.time() * 1000) + 10
            time.sleep(max(0.0, at / 1000 - time.time()))
        delays.append(time.time() * 1000 - end)
    return delays


def reclaim_unattended(port, lease_ms):
    """With nobody waiting: how long until the count key says the permit is back."""
    r = redis.Redis(port=port)
    r.execute_command("RPSEMAPHORE.TRYSETPERMITS", "rc:u", 1)
    r.execute_command("RPSEMAPHORE.ACQUIRE", "rc:u", lease_ms)
    end = int(r.zrange("{rc:u}:timeout", 0, 0, withscores=True)[0][1])
    while r.get("rc:u") != b"1":
        time.sleep(0.0005)
    return time.time() * 1000 - end


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", required=True)
    ap.add_argument("--server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--permits", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--hold-ms", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--lease-ms", type=int, default=50)
    a = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="rlock-sem-bench-")
    server = start_server(a.server, os.path.abspath(a.module), workdir)
    port = server.port
    try:
        version = subprocess.run([a.server, "--version"], capture_output=True, text=True).stdout.strip()
        print(f"# {version}\n# {a.clients} clients, {a.permits} permits, hold {a.hold_ms} ms, "
              f"{a.seconds} s per side\n")
        print("| side | permits/s | Jain | p50 wait ms | p99 wait ms | acquisitions |")
        print("|---|---|---|---|---|---|")
        res = {}
        for side in ("module", "redisson", "module", "redisson"):
            got = contention(port, side, a.clients, a.permits, a.seconds, a.hold_ms / 1000)
            res.setdefault(side, []).append(got)
            print(f"| {side} | {got['permits_s']:.0f} | {got['jain']:.4f} | {got['p50_ms']:.1f} | "
                  f"{got['p99_ms']:.1f} | {got['total']} |", flush=True)
        m = sum(g["permits_s"] for g in res["module"]) / 2
        rs = sum(g["permits_s"] for g in res["redisson"]) / 2
        print(f"\nmodule / Redisson permits/s: {m / rs:.2f}x\n")
        dm = reclaim_module(port, a.lease_ms, a.rounds)
        dr = reclaim_redisson(port, a.lease_ms, a.rounds)
        print(f"# reclaim delay after the lease end, {a.rounds} rounds, lease {a.lease_ms} ms, one waiter")
        print("| side | p50 ms | p99 ms | max ms |")
        print("|---|---|---|---|")
        for side, d in (("module (WAIT, lease timer)", dm), ("Redisson (waiter sleeps to the reported expiry)", dr)):
            print(f"| {side} | {pct(d, 0.5):.2f} | {pct(d, 0.99):.2f} | {max(d):.2f} |")
        print(f"\nwith nobody waiting, the count key shows the permit back "
              f"{reclaim_unattended(port, a.lease_ms):.2f} ms after the lease end (module); "
              "Redisson: not until some client runs one of its scripts")
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
