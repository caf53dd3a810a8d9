#!/usr/bin/env python3
"""`make bench-turns`: what script-side waiters' turns (design.md 1.8) cost a release that
hands the lock to a module waiter, in instructions per call under callgrind, with
bench/instr.py's method (two segments, the difference, median of rounds; fixed hash seed).

Each operation is an RLOCK.RELEASE that finds a queued waiter (a ticket, so one pipelined
connection can queue it), plus the ACQUIREs that set it up. Two workloads:
- a new key every time: every release is the first of its key, so every release looks
  for listeners (a subscriber count, `PUBSUB NUMSUB` as a nested call): the worst case;
- one hot key: a look at most once per `rlock.script-waiter-window-ms`, the usual case.
Nobody subscribes, so no turn is ever opened: this is the cost where no script-side
waiter exists, against the same build with turns off (`script-waiter-grace-ms 0`, which
skips the look). What a turn costs when one is opened is not counted here (its handoff
runs from a timer, outside the counted command): tests/interop/test_mixed_fleet.py and
BENCHMARK.md give that in owner changes.

Usage: bench/instr_turns.py --module target/release/librlock.so --server redis-server
"""

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import instr  # noqa: E402

LEASE = instr.LEASE


def new_key(i):
    k = f"turns:{i}"
    return [["RLOCK.ACQUIRE", k, "a", LEASE],
            ["RLOCK.ACQUIRE", k, "b", LEASE, "WAIT", 0, "ASYNC", "ID", f"n{i}"],
            ["RLOCK.RELEASE", k, "a"]]


HOT_SETUP = [["RLOCK.ACQUIRE", "hot", "o0", LEASE],
             ["RLOCK.ACQUIRE", "hot", "o1", LEASE, "WAIT", 0, "ASYNC", "ID", "h1"]]


def hot_key(i):
    # o{i} holds and o{i+1} is queued: queue o{i+2}, then release o{i} (o{i+1} is granted).
    return [["RLOCK.ACQUIRE", "hot", f"o{i + 2}", LEASE, "WAIT", 0, "ASYNC", "ID", f"h{i + 2}"],
            ["RLOCK.RELEASE", "hot", f"o{i}"]]


WORKLOADS = [("release with a waiter, a new key each time", [], new_key),
             ("release with a waiter, one hot key", HOT_SETUP, hot_key)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", required=True)
    ap.add_argument("--server", default="redis-server")
    ap.add_argument("--n1", type=int, default=1_000)
    ap.add_argument("--n2", type=int, default=6_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for label, grace in (("turns off (grace 0)", "0"), ("turns on (default)", "10")):
            module = [a.module, "script-waiter-grace-ms", grace]
            print(f"-- {label}", file=sys.stderr)
            results[label] = instr.run_server(a.server, [module], [], WORKLOADS, a.n1, a.n2,
                                              workdir, f"turns{grace}", rounds=a.rounds)
    print(f"Instructions per operation, {instr.server_version(a.server)}:")
    print("| workload | turns off | turns on, nobody listening | difference |")
    print("|---|---|---|---|")
    off, on = results["turns off (grace 0)"], results["turns on (default)"]
    for label, _, _ in WORKLOADS:
        print(f"| {label} | {off[label]:.0f} | {on[label]:.0f} | {on[label] - off[label]:+.0f} |")


if __name__ == "__main__":
    main()
