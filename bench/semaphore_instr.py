#!/usr/bin/env python3
"""Instructions per call (callgrind, bench/instr.py's method) of RSEMAPHORE.ACQUIRE and
RSEMAPHORE.RELEASE against Redisson's own tryAcquire and release scripts (EVALSHA), on
the same server, uncontended (1 000 semaphores with plenty of permits).

    .venv/bin/python bench/semaphore_instr.py --module target/release/librlock.so
"""

import argparse
import hashlib
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
from instr import run_server, server_version  # noqa: E402
from redisson_sync import SEM_RELEASE, SEM_TRY_ACQUIRE  # noqa: E402

KEYS = 1000


def k(i):
    return f"sem:{(i * 7919 + 13) % KEYS}"


def ch(i):
    return "redisson_sc:{%s}" % k(i)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", required=True)
    ap.add_argument("--server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    ap.add_argument("--n1", type=int, default=2000)
    ap.add_argument("--n2", type=int, default=12000)
    a = ap.parse_args()
    sha_acq = hashlib.sha1(SEM_TRY_ACQUIRE.encode()).hexdigest()
    sha_rel = hashlib.sha1(SEM_RELEASE.encode()).hexdigest()
    setup = [["SCRIPT", "LOAD", SEM_TRY_ACQUIRE], ["SCRIPT", "LOAD", SEM_RELEASE]]
    setup += [["SET", k(i), 10**9] for i in range(KEYS)]
    workloads = [
        ("RSEMAPHORE.ACQUIRE", [], lambda i: ["RSEMAPHORE.ACQUIRE", k(i), 1]),
        ("Redisson tryAcquire (EVALSHA)", [], lambda i: ["EVALSHA", sha_acq, 1, k(i), 1]),
        ("RSEMAPHORE.RELEASE", [], lambda i: ["RSEMAPHORE.RELEASE", k(i), 1]),
        ("Redisson release (EVALSHA)", [],
         lambda i: ["EVALSHA", sha_rel, 2, k(i), ch(i), 1, "publish"]),
    ]
    workdir = tempfile.mkdtemp(prefix="rlock-sem-instr-")
    try:
        got = run_server(a.server, [os.path.abspath(a.module)], setup, workloads,
                         a.n1, a.n2, workdir, "sem")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"# {server_version(a.server)}; instructions per call (callgrind, N1={a.n1}, N2={a.n2})")
    print("| call | instructions | Redisson's script / module |")
    print("|---|---|---|")
    for mod, lua in (("RSEMAPHORE.ACQUIRE", "Redisson tryAcquire (EVALSHA)"),
                     ("RSEMAPHORE.RELEASE", "Redisson release (EVALSHA)")):
        print(f"| {mod} | {got[mod]:.0f} | |")
        print(f"| {lua} | {got[lua]:.0f} | {got[lua] / got[mod]:.2f}x |")


if __name__ == "__main__":
    main()
