#!/usr/bin/env python3
"""`make bench-instr`: what replication costs a lock command, in instructions per call
(issue 24, part 1; design.md 1.4's `rlock.replication`).

Without a replica or an AOF the server skips propagation, so a figure taken without
either flatters replication. Every row here is measured twice: with the AOF off, and with
it on (`appendonly yes`, `appendfsync no`: the AOF buffer is fed inside the command,
which callgrind counts; the write to disk happens later, outside `processCommand`, as for
a replica's socket). Each primitive's acquire (and the lock's release and renew) in both
modes of `rlock.replication`, beside SET NX PX and Redisson's own scripts (EVALSHA), all
counted exactly as bench/instr.py counts (its `run_server`).

Writes a block between the `instr-replication` markers of BENCHMARK.md.
"""

import concurrent.futures
import hashlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
from instr import (LEASE, OWNER, SHA, held_with_count, instr_arguments, key,  # noqa: E402
                   load_scripts, redisson_fenced, redisson_unlock, run_server,
                   set_rounds, report_per_server, BIG_COUNT, redisson_count_down, LATCH_COUNT_DOWN)
from instr_rw import LOAD as RW_LOAD, m_acq, r_read, r_write  # noqa: E402
from redisson_rw import FENCED_ACQUIRE_TOKEN  # noqa: E402
from redisson_sync import NON_EXPIRABLE, PES_TRY_ACQUIRE, SEM_TRY_ACQUIRE  # noqa: E402

SEM_SHA = hashlib.sha1(SEM_TRY_ACQUIRE.encode()).hexdigest()
PES_SHA = hashlib.sha1(PES_TRY_ACQUIRE.encode()).hexdigest()
PERMITS = 10**9  # no run takes them all
# Calls per round (N1 + N2, set from the arguments): each round acquires expirable permits
# on 1 000 semaphores of its own. Its permit sets grow through the round (2 to 12 held per
# key at the default sizes), and the next round starts again from empty ones: rounds that
# shared the keys measured ever larger sets (the server's insert into a set walks it, for
# the script as for the module: about 420 instructions per permit held on 7.0), so their
# spread was the growth, not noise, and the median was the second round's.
SPAN = 14_000


def pes_name(i):
    return key("pes", (i // SPAN) * 1000 + i % 1000)


def redisson_pes_acquire(i):
    name = pes_name(i)
    # Redisson's tryAcquire(1, lease): an absolute expiry, "now", a 16-byte permit id.
    return ["EVALSHA", PES_SHA, 3, name, f"redisson__timeout__set:{{{name}}}",
            f"redisson_sc:{{{name}}}", 1, 1_900_000_000_000 + i, 1_700_000_000_000,
            NON_EXPIRABLE, "publish", i.to_bytes(16, "big")]


SEMAPHORES = [["SET", key("sem", i), PERMITS] for i in range(1000)]
PES = []  # filled for every round's keys (main)
PES_PLAIN = []

# (operation, implementation) -> (set-up, call(i)). One server process per list.
ROWS = [
    "acquire, new lock", "acquire, re-entry", "release, count > 1",
    "acquire + full release", "renew", "rwlock read acquire, new", "rwlock write acquire, new",
    "semaphore acquire", "expirable semaphore acquire", "fenced acquire, new lock",
    "latch count-down, count > 1",
]
RLOCK = [
    (("acquire, new lock", "rlock"), [],
     lambda i: ["RLOCK.ACQUIRE", key("lock", i), OWNER, LEASE]),
    (("acquire, re-entry", "rlock"), held_with_count("lock:re"),
     lambda i: ["RLOCK.ACQUIRE", "lock:re", OWNER, LEASE]),
    (("release, count > 1", "rlock"), held_with_count("lock:rel", 10_000_000),
     lambda i: ["RLOCK.RELEASE", "lock:rel", OWNER, LEASE]),
    (("acquire + full release", "rlock"), [],
     lambda i: [["RLOCK.ACQUIRE", key("cyc", i), OWNER, LEASE],
                ["RLOCK.RELEASE", key("cyc", i), OWNER]]),
    (("renew", "rlock"), held_with_count("lock:rn"),
     lambda i: ["RLOCK.RENEW", "lock:rn", OWNER, LEASE]),
    (("rwlock read acquire, new", "rlock"), [], lambda i: m_acq(key("rwr", i), "READ")),
    (("rwlock write acquire, new", "rlock"), [], lambda i: m_acq(key("rww", i), "WRITE")),
    (("semaphore acquire", "rlock"), SEMAPHORES,
     lambda i: ["RSEMAPHORE.ACQUIRE", key("sem", i % 1000), 1]),
    (("expirable semaphore acquire", "rlock"), PES,
     lambda i: ["RPSEMAPHORE.ACQUIRE", pes_name(i), LEASE]),
    (("fenced acquire, new lock", "rlock"), [],
     lambda i: ["RFENCED.ACQUIRE", key("fl", i), OWNER, LEASE]),
    (("latch count-down, count > 1", "rlock"), [["SET", "latch:cd", BIG_COUNT]],
     lambda i: ["RLATCH.COUNTDOWN", "latch:cd"]),
]
PLAIN = [
    (("acquire, new lock", "SET NX PX"), [],
     lambda i: ["SET", key("snx", i), OWNER, "NX", "PX", LEASE]),
    (("acquire, new lock", "Redisson"), load_scripts() + RW_LOAD + [
        ["SCRIPT", "LOAD", s] for s in (SEM_TRY_ACQUIRE, PES_TRY_ACQUIRE,
                                        FENCED_ACQUIRE_TOKEN, LATCH_COUNT_DOWN)],
     lambda i: ["EVALSHA", SHA["acquire"], 1, key("lock", i), LEASE, OWNER]),
    (("acquire, re-entry", "Redisson"), held_with_count("lock:re"),
     lambda i: ["EVALSHA", SHA["acquire"], 1, "lock:re", LEASE, OWNER]),
    (("release, count > 1", "Redisson"), held_with_count("lock:rel", 10_000_000),
     lambda i: redisson_unlock("lock:rel", i)),
    (("acquire + full release", "Redisson"), [],
     lambda i: [["EVALSHA", SHA["acquire"], 1, key("cyc", i), LEASE, OWNER],
                redisson_unlock(key("cyc", i), i)]),
    (("renew", "Redisson"), held_with_count("lock:rn"),
     lambda i: ["EVALSHA", SHA["renew"], 1, "lock:rn", LEASE, OWNER]),
    (("rwlock read acquire, new", "Redisson"), [], lambda i: r_read(key("rwr", i))),
    (("rwlock write acquire, new", "Redisson"), [], lambda i: r_write(key("rww", i))),
    (("semaphore acquire", "Redisson"), SEMAPHORES,
     lambda i: ["EVALSHA", SEM_SHA, 1, key("sem", i % 1000), 1]),
    (("expirable semaphore acquire", "Redisson"), PES_PLAIN, redisson_pes_acquire),
    (("fenced acquire, new lock", "Redisson"), [], lambda i: redisson_fenced(key("fl", i))),
    (("latch count-down, count > 1", "Redisson"), [["SET", "latch:cd", BIG_COUNT]],
     lambda i: redisson_count_down("latch:cd")),
]


def aof_args(on, tag):
    if not on:
        return []
    return ["--appendonly", "yes", "--appendfsync", "no", "--appenddirname", f"aof-{tag}",
            "--auto-aof-rewrite-percentage", "0", "--aof-use-rdb-preamble", "yes"]


def measure(server, module, n1, n2, jobs, workdir, log):
    runs = []
    for aof in (False, True):
        runs.append(((aof, "plain"), [], PLAIN))
        for mode in ("commands", "effects"):
            runs.append(((aof, mode), [module], RLOCK))
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = {}
        for n, ((aof, cfg), mods, workloads) in enumerate(runs):
            # The work directory is shared by every server measured: an AOF directory of
            # its own per server, or the next server would load the last one's keys.
            tag = f"repl{n}-" + "".join(ch for ch in os.path.basename(server) + str(abs(hash(server)))
                                        if ch.isalnum())
            extra = aof_args(aof, tag) + (["--rlock.replication", cfg] if mods else [])
            futs[pool.submit(run_server, server, mods, [], workloads, n1, n2, workdir, tag,
                             extra_args=extra)] = (aof, cfg)
        for f in concurrent.futures.as_completed(futs):
            aof, cfg = futs[f]
            for (row, impl), v in f.result().items():
                name = cfg if impl == "rlock" else impl
                results[(aof, row, name)] = v
                log(f"  aof={aof} {row} / {name}: {v:.0f}")
    return results


def table(results, aof):
    r = lambda row, name: results.get((aof, row, name))  # noqa: E731
    setnx = r("acquire, new lock", "SET NX PX")
    lines = ["| operation | rlock (`commands`) | rlock (`effects`) | Redisson | "
             "Redisson / rlock | rlock / SET NX PX | `effects` / `commands` |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for row in ROWS:
        c, e, red = r(row, "commands"), r(row, "effects"), r(row, "Redisson")
        vs_setnx = f"{c / setnx:.2f}x" if row in ("acquire, new lock", "acquire, re-entry") else ""
        lines.append(f"| {row} | {c:.0f} | {e:.0f} | {red:.0f} | {red / c:.2f}x | "
                     f"{vs_setnx} | {e / c:.2f}x |")
    lines.append(f"| SET NX PX (plain server) | | | | | {setnx:.0f} | |")
    return lines


def main():
    a = instr_arguments(__doc__).parse_args()
    set_rounds(a.rounds)
    global SPAN
    SPAN = a.n1 + a.n2
    names = [pes_name(r * SPAN + k) for r in range(a.rounds) for k in range(1000)]
    PES[:] = [["RPSEMAPHORE.TRYSETPERMITS", n, PERMITS] for n in names]
    PES_PLAIN[:] = [["SET", n, PERMITS] for n in names]
    sections = [
        "## Replication: instructions per call (`make bench-instr`)", "",
        "What a lock command costs once it is propagated (design.md 1.4). `commands` (the "
        "default) replicates each module command as one command: the command itself when "
        "its writes follow from its arguments and the key's state alone (the semaphore's "
        "acquire, the latch's count-down), or that command made deterministic when they "
        "also follow from the clock (a new lock and a re-entry: `RLOCK.ACQUIREAT`, the "
        "lease's absolute end in its one argument; the RW and fenced acquires: "
        "`RRWLOCK.ACQUIREAT`, `RFENCED.ACQUIREAT`, with the clock), else the plain "
        "command when it writes "
        "one thing, else one `RLOCK.APPLY` carrying its writes; `effects` "
        "replicates every write as its own plain command (HSET, PEXPIREAT, PUBLISH, ...), "
        "which a replica without the module can apply. Redisson's scripts are its own, "
        "by EVALSHA (Redis 7 replicates a script's effects). Counted as the tables above "
        f"(callgrind, `processCommand` only, N1 = {a.n1}, N2 = {a.n2}); *AOF on* is "
        "`appendonly yes` (the AOF buffer is fed inside the command, as a replica's would "
        "be), *AOF off* has the server drop what is propagated: the scripts' and SET's "
        "effects are not built, and rlock's are built only where its replication gate may "
        "not skip them (`rlock.replication-gate auto`: on Redis 7.2+ and Valkey, where the "
        "gate's listener would cost every DEL; README, *Replication*).", ""]
    def per_server(server, version, workdir):
        results = measure(server, os.path.abspath(a.module), a.n1, a.n2, a.jobs, workdir,
                          lambda s: print(s, file=sys.stderr))
        lines = []
        for aof in (True, False):
            lines += [f"### {version}, AOF {'on' if aof else 'off'}", ""]
            lines += table(results, aof) + [""]
        return lines

    report_per_server(a, sections, "instr-replication", per_server)

if __name__ == "__main__":
    main()
