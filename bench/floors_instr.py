#!/usr/bin/env python3
"""`make bench-instr`: the measured floor of a module command that keeps the design's
promises, beside SET NX PX, Redisson's scripts and rlock's own commands.

Issues 11 and 12 ask RLOCK.ACQUIRE <= 1.5x SET NX PX and >= 3x cheaper than Redisson's
acquire script, RLOCK.RENEW and RRWLOCK.ACQUIRE READ >= 3x cheaper than Redisson's
renew and read-lock scripts. Whether any module command can get there is measured here,
not estimated: bench/instr/floor.c's FLOOR.* commands do only what design.md 1.4 makes such a
command do (key API write, each effect replicated as its plain command with absolute
expiries, the plain command's keyspace notifications, the WATCH signal), with no logic.
Its FLOOR.LOCK.* variants try cheaper ways to do the same (see floor.c). Issue 24 sets
its goals with the AOF on (RLOCK.ACQUIRE <= 1.3x SET NX PX, RLOCK.RENEW >= 2.5x cheaper
than Redisson's renew script): a second set of server processes per server measures those
with propagation happening, against FLOOR.LOCK.APPLY (the writes replicated as one
command with one argument, as `rlock.replication commands` does) and FLOOR.RENEW.READ.

Counted exactly as bench/instr.py counts (its `run_server`: callgrind, `processCommand`
only, segments of N1 then N2 calls split by PING, per call = difference / (N2 - N1)).
One invocation measures each server in six server processes (plain, librlock, floor
module; each with the AOF off, then on); writes a block between the `instr-floors`
markers of BENCHMARK.md.
"""

import concurrent.futures
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from instr import (LEASE, OWNER, SHA, build_floor, held_with_count,  # noqa: E402
                   instr_arguments, key, load_scripts, report_per_server, run_server,
                   set_rounds)
from instr_rw import LOAD as RW_LOAD, m_acq, r_read  # noqa: E402
from replication_instr import aof_args  # noqa: E402


def setnx(prefix):
    return lambda i: ["SET", key(prefix, i), OWNER, "NX", "PX", LEASE]


def floor_cmd(cmd, prefix):
    return lambda i: [cmd, key(prefix, i), OWNER, LEASE]


# Every server process starts with the same 300 000 keys, each with a TTL, so that no
# workload pays for growing the keyspace or expiry table, whatever its position (without
# this a figure moved by up to ~8 000 instructions on Valkey, ~2 000 on Redis). The runs
# add up to 112 000 keys; 300 000 is a count both servers size with room for them: Redis
# 7.0 doubles a dict when it is full (524 288 slots here), Valkey 9 a hashtable when its
# 7-entry buckets are (65 536 buckets, 458 752 entries). The PTTL loop finishes the
# expiry table's last incremental rehash (each lookup moves a bucket; the timer's
# rehashing is off). Valkey's figures still creep up by ~3 % as its buckets fill.
PRESIZE_KEYS = 300_000
PRESIZE = [["DEBUG", "POPULATE", PRESIZE_KEYS, "pre", 1],
           ["EVAL", f"for i = 0, {PRESIZE_KEYS - 1} do "
                    "redis.call('pexpire', 'pre:' .. i, ARGV[1]) end", 0, LEASE],
           ["EVAL", f"for i = 0, {PRESIZE_KEYS - 1} do redis.call('pttl', 'pre:' .. i) end",
            0]]

# (row, implementation) -> (set-up, call(i)); one list per server process.
PLAIN = [
    (("lock", "SET NX PX"), [], setnx("snx")),
    (("lock", "Redisson script"), load_scripts(),
     lambda i: ["EVALSHA", SHA["acquire"], 1, key("lock", i), LEASE, OWNER]),
    (("renew", "Redisson script"), held_with_count("lock:rn"),
     lambda i: ["EVALSHA", SHA["renew"], 1, "lock:rn", LEASE, OWNER]),
    (("rwread", "Redisson script"), RW_LOAD, lambda i: r_read(key("rwm", i))),
]
RLOCK = [
    (("lock", "rlock"), [], lambda i: ["RLOCK.ACQUIRE", key("lock", i), OWNER, LEASE]),
    (("renew", "rlock"), held_with_count("lock:rn"),
     lambda i: ["RLOCK.RENEW", "lock:rn", OWNER, LEASE]),
    (("rwread", "rlock"), [], lambda i: m_acq(key("rwm", i), "READ")),
    (("lock", "SET NX PX, rlock loaded"), [], setnx("snx")),
]
FLOOR = [
    (("lock", "floor"), [], floor_cmd("FLOOR.LOCK", "lock")),
    (("renew", "floor"), held_with_count("lock:rn"),
     lambda i: ["FLOOR.RENEW", "lock:rn", OWNER, LEASE]),
    (("rwread", "floor"), [], floor_cmd("FLOOR.RWREAD", "rwm")),
    (("lock", "SET NX PX, floor loaded"), [], setnx("snx")),
    (("variant", "FLOOR.NOP"), [], lambda i: ["FLOOR.NOP", key("nop", i)]),
    (("variant", "FLOOR.LOCK.NOREPL"), [], floor_cmd("FLOOR.LOCK.NOREPL", "lnr")),
    (("variant", "FLOOR.LOCK.V"), [], floor_cmd("FLOOR.LOCK.V", "lv")),
    (("variant", "FLOOR.LOCK.CALL"), [], floor_cmd("FLOOR.LOCK.CALL", "lc")),
    # FLOOR.LOCK once more, last: how far a workload's position in its server moves it.
    (("variant", "FLOOR.LOCK, again last"), [], floor_cmd("FLOOR.LOCK", "lag")),
]

# With the AOF on (propagation happens, as with a replica): the goals of issue 24 for the
# lock's acquire and renew, against the least a module command replicated as one command
# (`rlock.replication commands`) can cost. One list per server process, as above, each
# opened by a discarded warm-up: the AOF buffer still holds the presize's 300 000
# PEXPIREATs when the first workload writes, and on Valkey that first append copies them
# all (about 60 million instructions, once).
WARM_UP = (("aof warm-up", ""), [], setnx("warm"))
PLAIN_AOF = [
    WARM_UP,
    (("aof lock", "SET NX PX"), [], setnx("snx")),
    (("aof lock", "Redisson script"), load_scripts(),
     lambda i: ["EVALSHA", SHA["acquire"], 1, key("lock", i), LEASE, OWNER]),
    (("aof renew", "Redisson script"), held_with_count("lock:rn"),
     lambda i: ["EVALSHA", SHA["renew"], 1, "lock:rn", LEASE, OWNER]),
]
RLOCK_AOF = [
    WARM_UP,
    (("aof lock", "rlock"), [], lambda i: ["RLOCK.ACQUIRE", key("lock", i), OWNER, LEASE]),
    (("aof renew", "rlock"), held_with_count("lock:rn"),
     lambda i: ["RLOCK.RENEW", "lock:rn", OWNER, LEASE]),
]
FLOOR_AOF = [
    WARM_UP,
    (("aof lock", "floor"), [], floor_cmd("FLOOR.LOCK.APPLY", "lock")),
    (("aof renew", "floor"), held_with_count("lock:rn"),
     lambda i: ["FLOOR.RENEW.READ", "lock:rn", OWNER, LEASE]),
    (("aof renew", "floor, existence only"), held_with_count("lock:rn2"),
     lambda i: ["FLOOR.RENEW", "lock:rn2", OWNER, LEASE]),
]

VARIANTS = [
    ("FLOOR.NOP", "a module command that only replies nil: the dispatch of any module "
                  "command (argv wrapped, reply, the call's bookkeeping)"),
    ("FLOOR.LOCK.NOREPL", "FLOOR.LOCK without the two RM_Replicate calls (not "
                          "allowed: no replica or AOF would see the lock)"),
    ("FLOOR.LOCK.V", "FLOOR.LOCK replicating with the \"v\" format and prebuilt strings "
                     "instead of \"ssl\"/\"sl\""),
    ("FLOOR.LOCK.CALL", "RM_Call(\"HSET\", \"!sss\") + RM_Call(\"PEXPIREAT\", \"!sl\"): "
                        "the server's commands write, notify, signal and replicate"),
    ("FLOOR.LOCK, again last", "FLOOR.LOCK again, as the server's last workload: the "
                               "difference is what position alone moves a figure"),
]


def tables(r, version):
    s, s_rl, s_fl = (r[("lock", k)] for k in
                     ("SET NX PX", "SET NX PX, rlock loaded", "SET NX PX, floor loaded"))
    lines = [f"### {version}", "",
             "| operation | goal | goal in instructions | Redisson script | rlock | floor "
             "(FLOOR.*) | rlock / floor | Redisson / rlock | Redisson / floor | floor / goal |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = [("lock", "acquire, new lock (RLOCK.ACQUIRE; FLOOR.LOCK)"),
            ("renew", "renew (RLOCK.RENEW; FLOOR.RENEW)"),
            ("rwread", "read acquire, new lock (RRWLOCK.ACQUIRE READ; FLOOR.RWREAD)")]
    for op, label in rows:
        red, rl, fl = r[(op, "Redisson script")], r[(op, "rlock")], r[(op, "floor")]
        if op == "lock":
            goal = min(1.5 * s, red / 3)
            goal_text = "<= 1.5x SET NX PX and >= 3x cheaper than Redisson"
        else:
            goal = red / 3
            goal_text = ">= 3x cheaper than Redisson"
        lines.append(f"| {label} | {goal_text} | {goal:.0f} | {red:.0f} | {rl:.0f} | "
                     f"{fl:.0f} | {rl / fl:.2f}x | {red / rl:.2f}x | {red / fl:.2f}x | "
                     f"{fl / goal:.2f}x |")
    lock_rl, lock_fl = r[("lock", "rlock")], r[("lock", "floor")]
    lines += ["", f"SET NX PX: {s:.0f} on a plain server, {s_rl:.0f} with librlock loaded, "
              f"{s_fl:.0f} with the floor module loaded (the same subscriptions). "
              f"1.5x SET NX PX = {1.5 * s:.0f}; RLOCK.ACQUIRE is {lock_rl / s:.2f}x, "
              f"FLOOR.LOCK {lock_fl / s:.2f}x "
              f"({lock_fl / s_fl:.2f}x the SET NX PX of its own server). "
              f"Redisson's acquire / 3 = {r[('lock', 'Redisson script')] / 3:.0f}.", "",
              "Cheaper ways to do FLOOR.LOCK's work (same server process as FLOOR.LOCK):", "",
              "| command | what | instructions | vs FLOOR.LOCK |", "|---|---|---:|---:|",
              f"| FLOOR.LOCK | key API write, RM_Replicate \"ssl\" + \"sl\", 2 notifications, "
              f"signal (as src/server/store.rs) | {lock_fl:.0f} | |"]
    for name, what in VARIANTS:
        v = r[("variant", name)]
        lines.append(f"| {name} | {what} | {v:.0f} | {v - lock_fl:+.0f} |")
    return lines + [""] + aof_table(r, version)


def aof_table(r, version):
    """The goals of issue 24 with the AOF on, against the floor of one replicated command."""
    s = r[("aof lock", "SET NX PX")]
    lines = [f"#### {version}, AOF on", "",
             "| operation | goal | goal in instructions | Redisson script | rlock | floor "
             "| rlock / floor | Redisson / rlock | Redisson / floor | floor / goal |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = [("aof lock", "acquire, new lock (RLOCK.ACQUIRE; FLOOR.LOCK.APPLY)",
             "<= 1.3x SET NX PX", 1.3 * s),
            ("aof renew", "renew (RLOCK.RENEW; FLOOR.RENEW.READ)",
             ">= 2.5x cheaper than Redisson", r[("aof renew", "Redisson script")] / 2.5)]
    for op, label, goal_text, goal in rows:
        red, rl, fl = r[(op, "Redisson script")], r[(op, "rlock")], r[(op, "floor")]
        lines.append(f"| {label} | {goal_text} | {goal:.0f} | {red:.0f} | {rl:.0f} | "
                     f"{fl:.0f} | {rl / fl:.2f}x | {red / rl:.2f}x | {red / fl:.2f}x | "
                     f"{fl / goal:.2f}x |")
    exists = r[("aof renew", "floor, existence only")]
    lines += ["", f"SET NX PX with the AOF on: {s:.0f}. FLOOR.RENEW (the owner's field "
              f"only tested for existence, which design.md 1.6 does not allow): {exists:.0f}, "
              f"{r[('aof renew', 'Redisson script')] / exists:.2f}x cheaper than Redisson.", ""]
    return lines


def main():
    a = instr_arguments(__doc__).parse_args()
    set_rounds(a.rounds)
    sections = [
        "## Floors: the least a module command keeping the design.s promises costs "
        "(`make bench-instr`)", "",
        "Instructions per call, counted as in the tables above (callgrind, "
        f"`processCommand` only, N1 = {a.n1}, N2 = {a.n2}, `bench/floors_instr.py`). "
        "*floor* is a command of bench/instr/floor.c doing only what design.md 1.4 makes an "
        "rlock command do for that case, with no logic: open the key, write it with the "
        "key API, replicate each effect as its plain command with the absolute expiry "
        "(RM_Replicate, as src/server/store.rs), fire the keyspace notifications that command "
        "fires, signal WATCH, reply. FLOOR.LOCK: HSET key owner 1 + PEXPIREAT ('hset', "
        "'expire'); FLOOR.RENEW: the owner's field exists? then PEXPIREAT ('expire'); "
        "FLOOR.RWREAD: HSET key mode read owner 1, SET {key}:owner:rwlock_timeout:1 1 PXAT "
        "('set', 'expire'), PEXPIREAT key ('expire'), the writes and replicated commands "
        "RRWLOCK.ACQUIRE READ makes for a new lock. The floor module subscribes to the "
        "same events as librlock (its callbacks do nothing), so both pay the server's "
        "delivery of their own notifications. Redisson's scripts and SET NX PX run on a "
        "plain server, as in the tables above; no replica or AOF is attached, so "
        "RM_Replicate pays for looking the command up and building its argv, not for "
        "writing it out (the same holds for the scripts' and SET's propagation). "
        "rlock runs as on any server with neither an AOF nor a replica: on Redis 7.0 its "
        "replication gate is closed and it skips building what the server would drop "
        "(README, *Replication*), which FLOOR.* builds always (*rlock / floor* below 1 is "
        "that gate); on Redis 7.2+ and Valkey the gate's default policy "
        "(`rlock.replication-gate auto`) builds it, as FLOOR.* does. "
        "*floor / goal* above 1 means no module command that replicates these effects "
        "reaches the goal on that server. Every server here starts with the same "
        f"{PRESIZE_KEYS:,} keys with a TTL, its tables sized for every key the runs add, "
        "so that no workload pays for a table's growth (which moved a figure by up to "
        "~8 000 instructions with its position): figures are not one for one those of the "
        "tables above, whose servers start empty. The *AOF on* table below each server "
        "measures issue 24's goals where they are set, with propagation happening "
        "(`appendonly yes`, as in the *Replication* tables), against the floor of a command "
        "replicated as `rlock.replication commands` replicates it: FLOOR.LOCK.APPLY writes "
        "what FLOOR.LOCK writes and replicates one command whose one argument carries the "
        "key, the owner and the deadline, copied into one buffer (the least any encoding "
        "of them can cost); FLOOR.RENEW.READ renews as FLOOR.RENEW but reads the owner's "
        "count, as design.md 1.6 makes RLOCK.RENEW (a hash whose value is not a positive "
        "integer is not a lock). A renewal has one write, so it replicates as one "
        "`PEXPIREAT` in either mode; its lease is relative, so it cannot go out as itself.",
        ""]
    def per_server(server, version, workdir):
        floor = build_floor(workdir)
        module = os.path.abspath(a.module)
        runs = [([], PLAIN, []), ([module], RLOCK, []), ([floor], FLOOR, [])]
        # The AOF directories live in the one work directory all servers share: each
        # server's name its own (a server would load another's AOF and refuse to start).
        tag = "".join(ch for ch in version if ch.isalnum())
        runs += [(mods, w, aof_args(True, f"fla{n}-{tag}")) for n, (mods, w) in
                 enumerate([([], PLAIN_AOF), ([module], RLOCK_AOF), ([floor], FLOOR_AOF)])]
        results = {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
            futs = [pool.submit(run_server, server, mods, PRESIZE, w, a.n1, a.n2, workdir,
                                f"fl{n}", extra_args=extra)
                    for n, (mods, w, extra) in enumerate(runs)]
            for f in futs:
                for k, v in f.result().items():
                    results[k] = v
                    print(f"  {k}: {v:.0f}", file=sys.stderr)
        return tables(results, version)

    report_per_server(a, sections, "instr-floors", per_server)

if __name__ == "__main__":
    main()
