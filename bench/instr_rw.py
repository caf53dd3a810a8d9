#!/usr/bin/env python3
"""`make bench-instr`: the read-write lock's cost in instructions per call, RRWLOCK
commands against Redisson's own RW scripts (RedissonReadLock/RedissonWriteLock, the text
tests/support/redisson_rw.py runs), counted by callgrind exactly as bench/instr.py counts the
plain lock (its `run_server`: segments of N1 then N2 calls split by PING, per call =
difference / (N2 - N1)). Writes a table between the `instr-rw` markers of BENCHMARK.md.
"""

import argparse
import hashlib
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
from instr import (LEASE, OTHER, OWNER, key, run_server, server_version, slot,  # noqa: E402
                   write_report)
from redisson_rw import (READ_ACQUIRE, READ_UNLOCK, READ_UNLOCK_MESSAGE, UNLOCK_MESSAGE,  # noqa: E402
                         WRITE_ACQUIRE, WRITE_UNLOCK, key_prefix, rw_channel, timeout_prefix,
                         unlock_latch)

SCRIPTS = {"read_acquire": READ_ACQUIRE, "read_unlock": READ_UNLOCK,
           "write_acquire": WRITE_ACQUIRE, "write_unlock": WRITE_UNLOCK}
SHA = {n: hashlib.sha1(s.encode()).hexdigest() for n, s in SCRIPTS.items()}
LOAD = [["SCRIPT", "LOAD", s] for s in SCRIPTS.values()]
WRITER_FIELD = OWNER + ":write"


def r_read(name):
    return ["EVALSHA", SHA["read_acquire"], 2, name, timeout_prefix(name, OWNER), LEASE,
            OWNER, WRITER_FIELD]


def r_read_unlock(name, i):
    return ["EVALSHA", SHA["read_unlock"], 5, name, rw_channel(name),
            timeout_prefix(name, OWNER), key_prefix(name, OWNER),
            unlock_latch(name, f"u{slot(i)}"), UNLOCK_MESSAGE, OWNER, "publish", 1000]


def r_write(name, owner=OWNER):
    return ["EVALSHA", SHA["write_acquire"], 1, name, LEASE, owner + ":write"]


def r_write_unlock(name, i):
    return ["EVALSHA", SHA["write_unlock"], 3, name, rw_channel(name),
            unlock_latch(name, f"w{slot(i)}"), READ_UNLOCK_MESSAGE, LEASE, WRITER_FIELD,
            "publish", 1000]


def m_acq(name, side, owner=OWNER):
    return ["RRWLOCK.ACQUIRE", name, side, owner, LEASE]


def m_rel(name, side):
    return ["RRWLOCK.RELEASE", name, side, OWNER]


# (operation, implementation) -> (set-up commands, call(i))
RLOCK = [
    (("read acquire, new lock", "RRWLOCK"), [], lambda i: m_acq(key("rwm", i), "READ")),
    (("read acquire, joining 1 reader", "RRWLOCK"),
     [], lambda i: [m_acq(key("rwj", i), "READ", OTHER), m_acq(key("rwj", i), "READ")]),
    (("write acquire, new lock", "RRWLOCK"), [], lambda i: m_acq(key("rww", i), "WRITE")),
    (("read acquire + full release", "RRWLOCK"), [],
     lambda i: [m_acq(key("rwc", i), "READ"), m_rel(key("rwc", i), "READ")]),
    (("write acquire + full release", "RRWLOCK"), [],
     lambda i: [m_acq(key("rwx", i), "WRITE"), m_rel(key("rwx", i), "WRITE")]),
    (("read acquire, contended (write-held)", "RRWLOCK"), [m_acq("rw:c", "WRITE", OTHER)],
     lambda i: m_acq("rw:c", "READ")),
]
REDISSON = [
    (("read acquire, new lock", "Redisson script"), LOAD, lambda i: r_read(key("rwm", i))),
    (("read acquire, joining 1 reader", "Redisson script"), LOAD,
     lambda i: [["EVALSHA", SHA["read_acquire"], 2, key("rwj", i),
                 timeout_prefix(key("rwj", i), OTHER), LEASE, OTHER, OTHER + ":write"],
                r_read(key("rwj", i))]),
    (("write acquire, new lock", "Redisson script"), LOAD, lambda i: r_write(key("rww", i))),
    (("read acquire + full release", "Redisson script"), LOAD,
     lambda i: [r_read(key("rwc", i)), r_read_unlock(key("rwc", i), i)]),
    (("write acquire + full release", "Redisson script"), LOAD,
     lambda i: [r_write(key("rwx", i)), r_write_unlock(key("rwx", i), i)]),
    (("read acquire, contended (write-held)", "Redisson script"),
     LOAD + [r_write("rw:c", OTHER)], lambda i: r_read("rw:c")),
]
# The "joining" rows run two calls per operation (the other reader's, then ours): both
# sides pay for both, so the ratio still compares like with like.


def table(results, version):
    lines = [f"### {version}", "",
             "| operation | RRWLOCK | Redisson script | Redisson / RRWLOCK |",
             "|---|---:|---:|---:|"]
    for label, _, _ in RLOCK:
        op = label[0]
        m, r = results[(op, "RRWLOCK")], results[(op, "Redisson script")]
        lines.append(f"| {op} | {m:.0f} | {r:.0f} | {r / m:.2f}x |")
    return lines + [""]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module", required=True)
    ap.add_argument("--server", action="append", required=True)
    ap.add_argument("--report")
    ap.add_argument("--n1", type=int, default=1_000)
    ap.add_argument("--n2", type=int, default=6_000)
    a = ap.parse_args()
    sections = ["## Read-write lock: instructions per call (`make bench-instr`)", "",
                "RRWLOCK commands against Redisson's RW scripts (EVALSHA), counted by "
                "callgrind as in `make bench-instr`; keys spread over 100 000 names, "
                f"N1={a.n1}, N2={a.n2}.", ""]
    with tempfile.TemporaryDirectory() as workdir:
        for server in a.server:
            results = {}
            for n, (mods, workloads) in enumerate([([a.module], RLOCK), ([], REDISSON)]):
                out = run_server(server, mods, [], workloads, a.n1, a.n2, workdir,
                                 f"rw{n}")
                results.update(out)
            sections += table(results, server_version(server))
            print("\n".join(sections[-len(RLOCK) - 4:]), flush=True)
    if a.report:
        write_report(a.report, sections, "instr-rw")


if __name__ == "__main__":
    main()
