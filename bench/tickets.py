#!/usr/bin/env python3
"""Queued tickets bench (design.md 5, issue 14; docs/commands/tickets.md): what waiting without a
connection per waiter costs and gains, side by side in one run on one module-loaded server.

1. Memory: server `used_memory` per queued ticket, 100 000 tickets from 10 connections
   (Redisson-shaped owners `<36-char uuid>:<thread id>`, 40 bytes; request ids of 24
   bytes), over 100 keys, on one key, and on one key with a deadline; beside it a blocked
   waiter's (`WAIT` without `ASYNC`, one raw connection each) and the ratio; then the 10
   connections are killed: `tickets` must be 0 and the memory must come back (the residual
   is reported).
2. Grant latency, waiters in processes of their own: 1 and 64 waiting processes on one
   lock, each blocked in WAIT, or a ticket told on the key's channel (every process
   subscribed to it), or a ticket told on its own NOTIFY tag channel; the time from the
   holder sending RLOCK.RELEASE until the next process holds (its WAIT reply, or its
   `granted` message, design.md 5), with the waiting processes' and the server's CPU per
   handoff.
3. Handoffs/s: 1 000 asyncio tasks (redis.asyncio) on one lock over a pool of 10 command
   connections + 1 subscriber, rlock tickets (a `NOTIFY` tag per process, held on the
   `granted` message, confirmed off the holder's path) vs Redisson's lock algorithm (its acquire
   script, a shared pub/sub connection whose unlock messages wake one waiting task, retry
   after the message or the TTL), alternating rounds; connections counted from CLIENT LIST.
4. The same 1 000 tasks as 10 processes of 100 (a service of 10 JVMs): 1 command connection
   and 1 subscriber each; Redisson's unlock messages now reach every process.

Standard library + redis-py (the tests' virtualenv):
    .venv/bin/python bench/tickets.py --module target/release/librlock.so [--quick]
"""

import argparse
import asyncio
import gc
import multiprocessing
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import redis
import redis.asyncio as aredis

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
sys.path.insert(0, HERE)
from hostile_helpers import (Raw, blocked_clients, fill_module_client_pool,  # noqa: E402
                             info_section, settle_memory, used_memory)
from redisson import ACQUIRE as RS_ACQUIRE, UNLOCK as RS_UNLOCK  # noqa: E402
from redisson import channel as rs_channel  # noqa: E402
from semaphore import jain, pct, start_server  # noqa: E402

LEASE = 60_000
NODE = "123e4567-e89b-12d3-a456-426614174000"  # one client's uuid, Redisson's shape


def ticket_channel(key):
    return f"rlock_ticket:{{{key}}}" if "{" not in key else f"rlock_ticket:{key}"


def parse_ticket(message):
    """`<kind>:<id-len>:<owner-len>:<id><owner><detail>` -> (kind, id, owner, detail)."""
    kind, id_len, owner_len, rest = message.split(b":", 3)
    id_len, owner_len = int(id_len), int(owner_len)
    return kind, rest[:id_len], rest[id_len:id_len + owner_len], rest[id_len + owner_len:]


def rstats(r):
    return {k.removeprefix("rlock_"): int(v) for k, v in info_section(r, "rlock").items()
            if k.startswith("rlock_") and v.lstrip("-").isdigit()}


def wait_until(what, cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.005)


def owner(conn, i):
    """Redisson's `<uuid>:<thread id>`: a uuid per connection (client), a thread id per task."""
    return f"{NODE[:-4]}{conn:04d}:{100 + i}"


def request_id(conn, i):
    return f"req-{conn:04d}-{i:015d}"  # 24 bytes


# ---- 1. memory -------------------------------------------------------------------------

def settled(ctl):
    """`used_memory` after the tests' settling, and after a second of clientsCron (which
    shrinks idle connections' query buffers), so two readings compare like with like."""
    settle_memory(ctl)
    time.sleep(1.0)
    settle_memory(ctl)
    return used_memory(ctl)


def memory_tickets(port, total, conns, keys, timeout=0):
    ctl = Raw(port)
    ctl.call("CONFIG", "SET", "rlock.max-waiters-per-key", str(max(total, 10_000)))
    empty = settled(ctl)
    clients = [Raw(port) for _ in range(conns)]
    ids = [c.call("CLIENT", "ID") for c in clients]
    names = [f"mem:{k}" for k in range(keys)]
    settle_memory(ctl)
    for k in names:
        assert ctl.call("RLOCK.ACQUIRE", k, "holder", LEASE) is None
    before = used_memory(ctl)
    per_conn = total // conns
    t0 = time.monotonic()
    for n, c in enumerate(clients):
        for start in range(0, per_conn, 2000):
            cmds = [("RLOCK.ACQUIRE", names[(n * per_conn + i) % keys], owner(n, i), LEASE,
                     "WAIT", timeout, "ASYNC", "ID", request_id(n, i))
                    for i in range(start, min(per_conn, start + 2000))]
            got = c.pipeline(cmds)
            assert set(got) == {b"QUEUED"}, set(got)
    queue_s = time.monotonic() - t0
    after_now = used_memory(ctl)
    # clientsCron gives the 10 connections' grown query buffers back within a second or so:
    # read again until two readings agree, so the delta is the tickets' own.
    time.sleep(1.0)
    after = used_memory(ctl)
    s = rstats(ctl)
    assert s["tickets"] == per_conn * conns, s
    for i in ids:
        ctl.call("CLIENT", "KILL", "ID", i)
    t0 = time.monotonic()
    wait_until("tickets dropped", lambda: rstats(ctl)["tickets"] == 0)
    drop_ms = 1000 * (time.monotonic() - t0)
    s2 = rstats(ctl)
    released = sum(ctl.call("RLOCK.RELEASE", k, "holder") for k in names)
    left = sum(ctl.call("EXISTS", k) for k in names)
    residual = settled(ctl) - empty
    deadline = time.monotonic() + 5
    while residual > 64 * 1024 and time.monotonic() < deadline:
        residual = settled(ctl) - empty
    for c in clients:
        c.close()
    ctl.close()
    n = per_conn * conns
    return {"n": n, "keys": keys, "per_ticket": (after - before) / n,
            "per_ticket_now": (after_now - before) / n, "queue_s": queue_s,
            "drop_ms": drop_ms, "tickets_after_kill": s2["tickets"],
            "waiters_after_kill": s2["waiters"], "released": released, "left": left,
            "residual": residual}


def memory_control(port, total, conns):
    """The residual of the same connections doing the same pipelining without tickets
    (PING), killed the same way: what the server itself keeps or gives back."""
    ctl = Raw(port)
    empty = settled(ctl)
    clients = [Raw(port) for _ in range(conns)]
    ids = [c.call("CLIENT", "ID") for c in clients]
    for c in clients:
        for start in range(0, total // conns, 2000):
            assert set(c.pipeline([("PING", f"{NODE}:{i}") for i in range(2000)])) != {None}
    for i in ids:
        ctl.call("CLIENT", "KILL", "ID", i)
    residual = settled(ctl) - empty
    for c in clients:
        c.close()
    ctl.close()
    return residual


def memory_blocked(port, n):
    """A waiter blocked in `RLOCK.ACQUIRE ... WAIT 0`, its connection included."""
    fill_module_client_pool(port)
    ctl = Raw(port)
    settle_memory(ctl)
    base = used_memory(ctl)
    conns = [Raw(port) for _ in range(n)]
    for c in conns:
        assert c.call("PING") == b"PONG"
    settle_memory(ctl)
    idle = used_memory(ctl)
    assert ctl.call("RLOCK.ACQUIRE", "memb", "holder", LEASE) is None
    held = used_memory(ctl)
    for i, c in enumerate(conns):
        c.send("RLOCK.ACQUIRE", "memb", owner(9000 + i, i), LEASE, "WAIT", 0,
               "ID", request_id(9000 + i, i))
    wait_until("waiters blocked", lambda: blocked_clients(ctl) >= n)
    blocked = used_memory(ctl)
    for c in conns:
        c.close()
    wait_until("blocked waiters gone", lambda: blocked_clients(ctl) == 0)
    ctl.call("RLOCK.FORCERELEASE", "memb")
    ctl.close()
    return {"n": n, "per_conn_idle": (idle - base) / n, "per_blocked_only": (blocked - held) / n,
            "per_waiter": (blocked - held + idle - base) / n}


# ---- 2. grant latency, waiters in processes of their own ----------------------------------

# How a waiting process waits: blocked in WAIT on its connection, or as a ticket told on the
# key's channel (every waiting process subscribed to it), or on its own NOTIFY tag channel.
MODES = ("blocked", "key", "tag")


def _chain_member(port, key, mode, i, t0, n, arrived, target, ready, waiting, replied):
    """One process of a handoff chain on `key`: it waits, holds when told (blocked: its
    WAIT reply; a ticket: its `granted` message, which means held), records the time since
    the releaser stamped `t0` just before sending its RLOCK.RELEASE, then (once the
    previous holder is queued again: `waiting` others wait) stamps `t0` itself, releases,
    and waits again at the back. Once `target` handoffs are recorded it
    releases without queueing again and exits. Only the holder touches `t0`, `n` and
    `arrived` (the lock itself orders them). `n` is when the wait ended, its reply or
    message read; `arrived` when its bytes came in, before this reader parsed them (a
    three-element message costs the pure-Python reader more than a nil reply: a cost of
    the bench, not of the server's handoff). `replied[j]` is when the releaser of handoff
    j (n's index) received its RELEASE reply, since its `t0`: with `arrived`, which of the
    two processes the server woke first."""
    gc.disable()
    me = owner(i, i)
    cmd = Raw(port, timeout=120)
    tag = uuid.UUID(int=i + 1).hex[-16:]
    sub, seq = None, 0
    if mode != "blocked":
        sub = Raw(port, timeout=120)
        ch = ticket_channel(key) + (f":{tag}" if mode == "tag" else "")
        assert sub.call("SUBSCRIBE", ch)[0] == b"subscribe"

    def queue():
        nonlocal seq
        seq += 1
        if mode == "blocked":
            cmd.send("RLOCK.ACQUIRE", key, me, LEASE, "WAIT", 0)
            return None
        rid = f"{i:03d}-{seq:09d}"
        notify = ("NOTIFY", tag) if mode == "tag" else ()
        got = cmd.call("RLOCK.ACQUIRE", key, me, LEASE, "WAIT", 0, "ASYNC", "ID", rid,
                       *notify)
        if got is None:  # the lock was free: only once the chain winds down
            assert int(n[0]) >= target
            assert cmd.call("RLOCK.RELEASE", key, me) == 1
            return None
        assert got == b"QUEUED", got
        return rid.encode()

    rid = queue()
    ready.release()
    while True:
        if mode == "blocked":
            got = cmd.read()
            t1 = time.perf_counter()
            ta = cmd.received_at
            assert got is None, got
        else:
            while True:  # on the key's channel, every other waiter's message too
                msg = sub.read()
                t1 = time.perf_counter()
                ta = sub.received_at
                kind, mid, _, _ = parse_ticket(msg[2])
                if mid == rid:
                    break
            assert kind == b"granted", msg
            # Confirmed off the holder's path, as the clients do (read after the release).
            cmd.send("RLOCK.ACQUIRE", key, me, LEASE, "WAIT", 0, "ASYNC", "ID", rid)
        k = int(n[0])
        done = k >= target
        if not done:
            n[k + 1] = t1 - t0.value
            arrived[k + 1] = ta - t0.value
            n[0] = k + 1
        if mode != "blocked":
            assert cmd.read() is None  # the confirmation's replay
        # The one who released to us must be queued again before we release (with one
        # waiting process it would otherwise find the lock free: no handoff to measure).
        while not done and rlock_waiters(cmd, key) < waiting:
            pass
        t0.value = time.perf_counter()
        cmd.send("RLOCK.RELEASE", key, me)
        assert cmd.read() == 1
        if done:
            break
        replied[k + 2] = cmd.received_at - t0.value  # the handoff it starts
        rid = queue()
        if rid is None and mode != "blocked":
            break
    cmd.close()
    if sub:
        sub.close()


def chain_round(port, key, mode, waiting, target):
    """`waiting` + 1 processes hand `key` around (one holds, `waiting` wait) until `target`
    handoffs are recorded; returns the latencies (s) to the wait's end and to its bytes'
    arrival, the waiting processes' CPU seconds per handoff, the server's, and per handoff
    whether the new holder's bytes came in before the releaser's reply did."""
    ctx = multiprocessing.get_context("fork")
    t0 = ctx.RawValue("d", 0.0)
    n = ctx.RawArray("d", target + 1)  # n[0]: how many recorded; then the latencies
    arrived = ctx.RawArray("d", target + 1)
    replied = ctx.RawArray("d", target + 2)
    ready = ctx.Semaphore(0)
    ctl = Raw(port)
    assert ctl.call("RLOCK.ACQUIRE", key, "bench-holder", LEASE) is None
    before = os.times()
    cpu0 = server_cpu(ctl)
    procs = [ctx.Process(target=_chain_member, args=(port, key, mode, i, t0, n, arrived, target, ready,
                                                            waiting, replied))
             for i in range(waiting + 1)]
    for p in procs:
        p.start()
    for _ in procs:
        assert ready.acquire(timeout=60), "a chain member did not start"
    wait_until("chain queued", lambda: rlock_waiters(ctl, key) == waiting + 1)
    t0.value = time.perf_counter()
    assert ctl.call("RLOCK.RELEASE", key, "bench-holder") == 1
    for p in procs:
        p.join(300)
        assert p.exitcode == 0, f"chain member exit {p.exitcode}"
    cpu = server_cpu(ctl) - cpu0
    after = os.times()
    ctl.close()
    got = int(n[0])
    handoffs = got + waiting + 1  # the ones after the target, as each process leaves
    children = (after.children_user + after.children_system
                - before.children_user - before.children_system)
    # Handoff j: the new holder's bytes came in at arrived[j], the releaser's at replied[j].
    first = [arrived[j] < replied[j] for j in range(2, got + 1) if replied[j] > 0]
    return (list(n[1:got + 1]), list(arrived[1:got + 1]), children / handoffs,
            cpu / handoffs, first)


def server_cpu(ctl):
    info = ctl.call("INFO", "cpu").decode()
    f = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    return float(f["used_cpu_user"]) + float(f["used_cpu_sys"])


def rlock_waiters(ctl, key):
    raw = ctl.call("RLOCK.INFO", key)
    return 0 if raw is None else dict(zip(raw[::2], raw[1::2]))[b"waiters"]


def latency(port, sizes, rounds, per_round):
    """Every (waiting processes, mode) chain, `rounds` rounds of `per_round` handoffs each,
    the modes' order rotating from round to round so that the machine's load falls on all
    alike. {(waiting, mode): (latencies to the wait's end, latencies to the bytes'
    arrival, waiters' CPU s per handoff, server CPU s per handoff, share of handoffs where
    the new holder's bytes came in before the releaser's reply did)}."""
    out = {}
    gc.disable()  # a collection pause would land on whichever side happened to be running
    try:
        for rnd in range(rounds):
            for waiting in sizes:
                order = MODES[rnd % 3:] + MODES[:rnd % 3]
                for mode in order:
                    lat, arr, wcpu, scpu, first = chain_round(
                        port, f"lat:{mode}:{waiting}:{rnd}", mode, waiting, per_round)
                    got = out.setdefault((waiting, mode), ([], [], [], [], []))
                    got[0].extend(lat)
                    got[1].extend(arr)
                    got[2].append(wcpu)
                    got[3].append(scpu)
                    got[4].extend(first)
    finally:
        gc.enable()
    return {k: (v[0], v[1], statistics.mean(v[2]), statistics.mean(v[3]),
                sum(v[4]) / max(len(v[4]), 1)) for k, v in out.items()}


# ---- 3. handoffs/s, 1 000 tasks over 10 connections ------------------------------------

class Run:
    """What the tasks of one process saw: per-task acquisition counts, waits, and a log of
    (acquired, releasing) monotonic times per acquisition (Linux's CLOCK_MONOTONIC is one
    clock for every process, so logs of several processes merge)."""

    def __init__(self, tasks):
        self.counts = [0] * tasks
        self.waits = []
        self.log = []


def analyse(logs):
    """Handoffs (owner changes) and mutual exclusion violations (an acquisition seen before
    the previous holder sent its release) over the merged logs, in acquisition order."""
    entries = sorted(e for log in logs for e in log)
    handoffs, violations, last = 0, 0, None
    for n, (t_acq, _, who) in enumerate(entries):
        if who != last:
            handoffs += 1
            last = who
        if n and t_acq < entries[n - 1][1]:
            violations += 1
    return handoffs, violations


async def count_connections(port, stop, out, warmup):
    r = aredis.Redis(port=port)
    me = await r.client_id()
    try:
        await asyncio.wait_for(stop.wait(), warmup)  # the pool opens its connections lazily
    except asyncio.TimeoutError:
        pass
    while not stop.is_set():
        clients = await r.client_list()
        out.append(sum(1 for c in clients if int(c["id"]) != me))
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except asyncio.TimeoutError:
            pass
    await r.aclose()


def command_client(port, connections):
    """The tasks' command connections: a blocking pool of `connections`, or for one a single
    connection behind redis-py's lock, which queues the tasks in FIFO order (a one-connection
    pool hands the connection back to whichever task asks first: the releasing task, which
    then never lets the others send their first command)."""
    if connections == 1:
        return aredis.Redis(port=port, single_connection_client=True)
    pool = aredis.BlockingConnectionPool(port=port, max_connections=connections, timeout=None)
    return aredis.Redis(connection_pool=pool)


async def rlock_side(port, key, tasks, stop_at, pool_size, done, node=0):
    """What the clients do (design.md 5, clients/python/rlock/_tickets.py): every wait is a
    ticket with this process's own `NOTIFY` tag, so a grant reaches only the process whose
    ticket it is; the subscriber sends the confirmation as it reads the `granted` message
    and wakes the task at once, which holds on the message; the confirmation's reply is
    checked after the critical section."""
    r = command_client(port, pool_size)
    tag = f"{node:02d}{uuid.uuid4().hex[:14]}"  # one per client instance, no braces
    sub = aredis.Redis(port=port).pubsub()
    await sub.subscribe(f"{ticket_channel(key)}:{tag}")
    waiting = {}  # request id -> (future, owner)
    run = Run(tasks)

    async def dispatch():
        async for m in sub.listen():
            if m["type"] != "message":
                continue
            kind, rid, _, detail = parse_ticket(m["data"])
            if kind != b"granted":
                raise RuntimeError(f"ticket {rid!r} ended {kind!r} {detail!r}")
            fut, me = waiting.pop(rid)
            # The confirmation goes out before the holder runs, off its path.
            fut.set_result(asyncio.ensure_future(r.execute_command(
                "RLOCK.ACQUIRE", key, me, LEASE, "WAIT", 0, "ASYNC", "ID", rid)))

    async def worker(i):
        me = owner(node, i)
        seq = 0
        loop = asyncio.get_running_loop()
        while time.monotonic() < stop_at:
            seq += 1
            rid = f"t{node:02d}{i:04d}-{seq:017d}"  # 24 bytes
            fut = loop.create_future()
            waiting[rid.encode()] = (fut, me)
            t0 = time.monotonic()
            got = await r.execute_command("RLOCK.ACQUIRE", key, me, LEASE, "WAIT", 0,
                                          "ASYNC", "ID", rid, "NOTIFY", tag)
            confirm = None
            if got is None:
                waiting.pop(rid.encode(), None)
            else:
                assert got == b"QUEUED", got
                confirm = await fut  # held on the message (design.md 5)
            t_acq = time.monotonic()
            run.waits.append(t_acq - t0)
            run.counts[i] += 1  # the critical section
            run.log.append((t_acq, time.monotonic(), (node, i)))
            assert await r.execute_command("RLOCK.RELEASE", key, me) == 1
            if confirm is not None:
                assert await confirm is None

    d = asyncio.create_task(dispatch())
    t0 = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    elapsed = time.monotonic() - t0
    if done is not None:
        done.set()
    d.cancel()
    await sub.aclose()
    await r.aclose(close_connection_pool=True)
    return run, elapsed


async def redisson_side(port, key, tasks, stop_at, pool_size, done, node=0):
    """Redisson's RedissonLock.lock(): tryAcquire (its script); on a TTL, the lock entry's
    subscription on the shared pub/sub connection (subscribed once here: with 1 000 tasks
    there is always a waiter, so Redisson never unsubscribes), then loop: tryAcquire, on a
    TTL wait on the entry's latch (a semaphore an unlock message releases one permit of) up
    to the TTL. Unlock: its unlock script (with the unlock latch key), PUBLISH."""
    r = command_client(port, pool_size)
    acquire, unlock = r.register_script(RS_ACQUIRE), r.register_script(RS_UNLOCK)
    chan = rs_channel(key)
    sub = aredis.Redis(port=port).pubsub()
    await sub.subscribe(chan)
    latch = asyncio.Semaphore(0)
    run = Run(tasks)

    async def dispatch():
        async for m in sub.listen():
            if m["type"] == "message":
                latch.release()

    async def worker(i):
        me = owner(node, i)
        n = 0
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            while True:
                ttl = await acquire(keys=[key], args=[LEASE, me])
                if ttl is None:
                    break
                try:
                    await asyncio.wait_for(latch.acquire(), max(ttl, 1) / 1000)
                except asyncio.TimeoutError:
                    pass
            t_acq = time.monotonic()
            run.waits.append(t_acq - t0)
            run.counts[i] += 1  # the critical section
            n += 1
            run.log.append((t_acq, time.monotonic(), (node, i)))
            latch_key = f"redisson_unlock_latch:{{{key}}}:{me}:{n}"
            got = await unlock(keys=[key, chan, latch_key], args=[0, LEASE, me, "publish", 1000])
            assert got == 1, got

    d = asyncio.create_task(dispatch())
    t0 = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    elapsed = time.monotonic() - t0
    if done is not None:
        done.set()
    d.cancel()
    await sub.aclose()
    await r.aclose(close_connection_pool=True)
    return run, elapsed


async def throughput_round(port, side, key, tasks, seconds, pool_size):
    stop, conns = asyncio.Event(), []
    counter = asyncio.create_task(count_connections(port, stop, conns, min(1.0, seconds / 4)))
    fn = rlock_side if side == "rlock" else redisson_side
    before, cpu0 = server_work(port), time.process_time()
    run, elapsed = await fn(port, key, tasks, time.monotonic() + seconds, pool_size, stop)
    after, cpu1 = server_work(port), time.process_time()
    await counter
    total = sum(run.counts)
    handoffs, violations = analyse([run.log])
    return {"handoffs_s": handoffs / elapsed, "acq_s": total / elapsed,
            "elapsed": elapsed, "handoffs": handoffs, "total": total,
            "counts": run.counts, "waits": run.waits, "violations": violations,
            "conns": (min(conns), max(conns)) if conns else (0, 0),
            "cmds": after[0] - before[0], "server_cpu": after[1] - before[1],
            "server_busy": (after[1] - before[1]) / elapsed, "client_busy": (cpu1 - cpu0) / elapsed}


def say_totals(say, res, names):
    """Says the all-rounds table of a handoff section (each side's rounds summed, see
    summary) and returns the totals by side."""
    say()
    say("| side, all rounds | handoffs/s | acquisitions/s | Jain | p50 wait ms | p99 wait ms "
        "| tasks that never held | server commands per acquisition | server CPU µs per "
        "acquisition |")
    say("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    tot = {}
    for side in ("rlock", "redisson"):
        t = tot[side] = summary(res[side])
        say(f"| {names[side]} | **{t['handoffs_s']:.0f}** | {t['acq_s']:.0f} | "
            f"{t['jain']:.4f} | {t['p50_ms']:.0f} | {t['p99_ms']:.0f} | {t['idle_tasks']} | "
            f"{t['cmds_per_acq']:.2f} | {t['cpu_us_per_acq']:.0f} |")
    return tot


def summary(rounds):
    """One side's rounds together: rates over the summed time, fairness over each task's
    acquisitions summed over the rounds, waits of every round."""
    elapsed = sum(g["elapsed"] for g in rounds)
    total = sum(g["total"] for g in rounds)
    counts = [sum(c) for c in zip(*(g["counts"] for g in rounds))]
    waits = [w for g in rounds for w in g["waits"]]
    return {"handoffs_s": sum(g["handoffs"] for g in rounds) / elapsed, "acq_s": total / elapsed,
            "jain": jain(counts), "p50_ms": 1000 * pct(waits, 0.5),
            "p99_ms": 1000 * pct(waits, 0.99), "idle_tasks": sum(1 for c in counts if c == 0),
            "cmds_per_acq": sum(g["cmds"] for g in rounds) / max(total, 1),
            "cpu_us_per_acq": 1e6 * sum(g["server_cpu"] for g in rounds) / max(total, 1)}


def _fleet_member(port, side, key, tasks, node, stop_at, barrier, out):
    """One process of the fleet: `tasks` tasks over 1 command connection + 1 subscriber."""
    async def main():
        fn = rlock_side if side == "rlock" else redisson_side
        barrier.wait()
        return await fn(port, key, tasks, stop_at, 1, None, node)
    run, _ = asyncio.run(main())
    out.put((node, run.counts, run.waits, run.log))


def fleet_round(port, side, key, procs, tasks, seconds):
    """`procs` processes of `tasks` tasks each (as many JVMs of one service): each with one
    command connection and its own subscriber, so every unlock message reaches every
    process."""
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(procs + 1), ctx.Queue()
    stop_at = time.monotonic() + seconds + 1.0  # the processes start within that second
    before = server_work(port)
    ps = [ctx.Process(target=_fleet_member,
                      args=(port, side, key, tasks, n + 1, stop_at, barrier, out))
          for n in range(procs)]
    for p in ps:
        p.start()
    barrier.wait()
    start = time.monotonic()
    conns, results = [], []
    r = redis.Redis(port=port)
    me = r.client_id()
    while len(results) < procs:
        try:
            results.append(out.get(timeout=0.25))
        except queue.Empty:
            if start + 1.0 < time.monotonic() < stop_at:
                conns.append(sum(1 for c in r.client_list() if int(c["id"]) != me))
        if time.monotonic() > stop_at + 30:
            raise RuntimeError("fleet did not finish")
    for p in ps:
        p.join(10)
    after = server_work(port)
    r.close()
    logs = [log for *_, log in results]
    end = max(t_rel for log in logs for _, t_rel, _ in log)
    elapsed = end - start
    handoffs, violations = analyse(logs)
    counts = [c for _, cs, _, _ in sorted(results, key=lambda x: x[0]) for c in cs]
    total = sum(counts)
    return {"handoffs_s": handoffs / elapsed, "acq_s": total / elapsed, "elapsed": elapsed,
            "handoffs": handoffs, "total": total, "counts": counts,
            "waits": [w for _, _, ws, _ in results for w in ws], "violations": violations,
            "conns": (min(conns), max(conns)) if conns else (0, 0),
            "cmds": after[0] - before[0], "server_cpu": after[1] - before[1],
            "server_busy": (after[1] - before[1]) / elapsed, "client_busy": float("nan")}


def server_work(port):
    """(commands processed, server CPU seconds) so far: what a round cost the server."""
    r = redis.Redis(port=port)
    stats, cpu = r.info("stats"), r.info("cpu")
    r.close()
    return stats["total_commands_processed"], cpu["used_cpu_user"] + cpu["used_cpu_sys"]


# ---- the report ------------------------------------------------------------------------

def fleet(port, cfg, say, names):
    procs, tasks = cfg["fleet_procs"], cfg["tasks"] // cfg["fleet_procs"]
    say()
    say(f"#### Handoffs/s: the same {procs * tasks} tasks as {procs} processes of {tasks}")
    say()
    say(f"As a service of {procs} processes (JVMs) would run them: each process has 1 command "
        f"connection and its own subscriber ({procs} + {procs} connections), the same "
        f"algorithms as above (Redisson: each process's subscriber hears every unlock "
        f"message and wakes one of its own waiting tasks). {cfg['fleet_rounds']} rounds of "
        f"{cfg['fleet_seconds']:.0f} s per side, order alternating; handoffs and mutual "
        f"exclusion from the processes' merged logs.")
    say()
    say("| round | side | handoffs/s | acquisitions/s | connections | mutual exclusion "
        "violations | server CPU |")
    say("|---|---|---:|---:|---:|---:|---:|")
    res = {}
    for rnd in range(cfg["fleet_rounds"]):
        for side in ("rlock", "redisson") if rnd % 2 == 0 else ("redisson", "rlock"):
            g = fleet_round(port, side, f"fl:{side}:{rnd}", procs, tasks, cfg["fleet_seconds"])
            res.setdefault(side, []).append(g)
            say(f"| {rnd + 1} | {names[side]} | {g['handoffs_s']:.0f} | {g['acq_s']:.0f} | "
                f"{g['conns'][0]}-{g['conns'][1]} | {g['violations']} | "
                f"{100 * g['server_busy']:.0f} % |")
    tot = say_totals(say, res, names)
    handoffs = ratio(tot["rlock"]["handoffs_s"], tot["redisson"]["handoffs_s"])
    say()
    say(f"rlock tickets / Redisson, {procs} processes: handoffs/s **{handoffs:.2f}×**, "
        f"p99 wait {ratio(tot['rlock']['p99_ms'], tot['redisson']['p99_ms']):.2f}×, server CPU "
        f"per acquisition "
        f"{ratio(tot['rlock']['cpu_us_per_acq'], tot['redisson']['cpu_us_per_acq']):.2f}×.")


def ratio(a, b):
    """a / b, or nan when b is 0: a quick run's one-second round may see no handoff on a
    side (a loaded machine), and its report still comes out, saying so ("nan")."""
    return a / b if b else float("nan")


def handoffs_report(port, cfg, say):
    """Sections 3 and 4: handoffs/s of 1 000 tasks, in one process and as 10 processes."""
    say(f"#### Handoffs/s: {cfg['tasks']} tasks on one lock over {cfg['pool']} connections")
    say()
    say(f"redis.asyncio in one process, {cfg['tasks']} tasks, a `BlockingConnectionPool` of "
        f"{cfg['pool']} command connections + 1 subscriber connection per side; each task "
        f"loops acquire → tiny critical section (no I/O) → release for {cfg['seconds']:.0f} s; "
        f"{cfg['tp_rounds']} rounds, each running both sides one after the other, the order "
        f"alternating from round to round.")
    say("- **rlock tickets**, as the clients wait (design.md 5): `RLOCK.ACQUIRE … WAIT 0 "
        "ASYNC ID id NOTIFY tag`, one tag per process, so only its own grants reach its "
        "subscriber; `QUEUED` → the task awaits its `granted` message (the subscriber "
        "dispatches by request id, sends the confirmation, the same command, and wakes the "
        "task at once) → holds on the message; `RLOCK.RELEASE`; the confirmation's reply is "
        "checked after.")
    say("- **Redisson's algorithm**: its acquire script; on a TTL, wait on the lock entry's "
        "latch (a semaphore each unlock message on the shared subscriber releases one permit "
        "of, as LockPubSub does) up to the TTL, retry; its unlock script (PUBLISH).")
    say()
    say("Handoffs = owner changes; Jain over the tasks' acquisition counts; wait = from the "
        "first acquire call to holding; connections = CLIENT LIST (minus the counting "
        "connection) every 250 ms after the first second, min-max.")
    say()
    say("| round | side | handoffs/s | acquisitions/s | connections | mutual exclusion "
        "violations | server CPU | client CPU |")
    say("|---|---|---:|---:|---:|---:|---:|---:|")
    res = {}
    names = {"rlock": "rlock tickets", "redisson": "Redisson algorithm"}
    for rnd in range(cfg["tp_rounds"]):
        for side in ("rlock", "redisson") if rnd % 2 == 0 else ("redisson", "rlock"):
            g = asyncio.run(throughput_round(port, side, f"tp:{side}:{rnd}", cfg["tasks"],
                                             cfg["seconds"], cfg["pool"]))
            res.setdefault(side, []).append(g)
            say(f"| {rnd + 1} | {names[side]} | {g['handoffs_s']:.0f} | {g['acq_s']:.0f} | "
                f"{g['conns'][0]}-{g['conns'][1]} | {g['violations']} | "
                f"{100 * g['server_busy']:.0f} % | {100 * g['client_busy']:.0f} % |")
    tot = say_totals(say, res, names)
    pairs = sorted(ratio(a["handoffs_s"], b["handoffs_s"])
                   for a, b in zip(res["rlock"], res["redisson"]))
    handoffs = ratio(tot["rlock"]["handoffs_s"], tot["redisson"]["handoffs_s"])
    say()
    say(f"rlock tickets / Redisson: handoffs/s **{handoffs:.2f}×** "
        f"over all rounds (per round, sorted: {', '.join(f'{x:.2f}' for x in pairs)}; "
        f"median {statistics.median(pairs):.2f}×), acquisitions/s "
        f"{ratio(tot['rlock']['acq_s'], tot['redisson']['acq_s']):.2f}×, server CPU per "
        f"acquisition "
        f"{ratio(tot['rlock']['cpu_us_per_acq'], tot['redisson']['cpu_us_per_acq']):.2f}×. Server "
        f"commands count the scripts' inner `redis.call`s; server and client CPU are shares "
        f"of one core over the round (the client is the one Python process running all the "
        f"tasks; on this shared machine neither reaches a whole core, so the rates follow "
        f"the machine's load from round to round: read the ratios).")
    fleet(port, cfg, say, names)


def fmt_ms(v):
    return f"{1000 * v:.3f}"


def latency_report(port, cfg, say):
    sizes = cfg["chain_sizes"]
    say("#### Grant latency: blocked `WAIT` vs tickets (key channel, `NOTIFY` tag), waiters "
        "in processes of their own")
    say()
    say(f"One lock; {' and '.join(str(w) for w in sizes)} waiting processes plus the holder, "
        f"each a Python process with its own connections (raw sockets, garbage collector "
        f"off). The holder stamps the time just before sending `RLOCK.RELEASE`; the next "
        f"waiter, a separate process, records when the bytes that end its wait came in "
        f"(\"arrived\": blocked, its `WAIT` reply; a ticket, its `granted` message, which "
        f"means held, design.md 5; its confirmation is sent after, off the path) and when "
        f"it had read them (\"read\": the bench's pure-Python reader parses a three-element "
        f"message more slowly than a nil reply, a cost of this reader, not of the server's "
        f"handoff; the clients' readers are compiled or far cheaper). Once the previous "
        f"holder is queued again (it polls `RLOCK.INFO`: with one waiting process the lock "
        f"would otherwise be found free), it releases to the next one and queues again at "
        f"the back. Tickets are told either on the key's channel, to which every waiting "
        f"process subscribes (each handoff's message reaches them all), or on each "
        f"process's own `NOTIFY` tag channel. {cfg['lat_rounds']} rounds of "
        f"{cfg['lat_per_round']} handoffs per row, the rows' order rotating from round to "
        f"round, so the machine's load falls on all alike; CPU = the waiting processes' "
        f"(user + system, all of them) and the server's, per handoff. \"New holder's bytes "
        f"first\": the share of handoffs in which the new holder's bytes came in before the "
        f"releasing process's `RLOCK.RELEASE` reply did, i.e. which of the two the server "
        f"wrote to and woke first (it writes a turn's replies last-first; the module "
        f"publishes a ticket's grant after the releasing command's reply so that, like a "
        f"blocked waiter's reply, it goes out first, design.md 5). On this 2-core machine "
        f"the process woken second waits for a core.")
    say()
    lat = latency(port, sizes, cfg["lat_rounds"], cfg["lat_per_round"])
    names = {"blocked": "blocked `WAIT`: reply", "key": "ticket, key channel: `granted`",
             "tag": "ticket, `NOTIFY` tag: `granted`"}
    say("| waiting processes | waiting | samples | arrived p50 ms | arrived p99 ms "
        "| arrived p50 / blocked | arrived p99 / blocked | read p50 ms | read p99 ms "
        "| read p50 / blocked | read p99 / blocked | new holder's bytes first "
        "| waiters' CPU µs per handoff | server CPU µs per handoff |")
    say("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for waiting in sizes:
        bv, ba = lat[(waiting, "blocked")][:2]
        for mode in MODES:
            v, a, wcpu, scpu, first = lat[(waiting, mode)]
            say(f"| {waiting} | {names[mode]} | {len(v)} | {fmt_ms(pct(a, 0.5))} | "
                f"{fmt_ms(pct(a, 0.99))} | **{ratio(pct(a, 0.5), pct(ba, 0.5)):.2f}×** | "
                f"**{ratio(pct(a, 0.99), pct(ba, 0.99)):.2f}×** | {fmt_ms(pct(v, 0.5))} | "
                f"{fmt_ms(pct(v, 0.99))} | {ratio(pct(v, 0.5), pct(bv, 0.5)):.2f}× | "
                f"{ratio(pct(v, 0.99), pct(bv, 0.99)):.2f}× | "
                f"{100 * first:.0f} % | {1e6 * wcpu:.0f} | {1e6 * scpu:.0f} |")
    say()
    for what, i in (("arrived", 1), ("read by the bench's reader", 0)):
        verdicts = []
        for waiting in sizes:
            b = lat[(waiting, "blocked")][i]
            t = lat[(waiting, "tag")][i]
            r50, r99 = ratio(pct(t, 0.5), pct(b, 0.5)), ratio(pct(t, 0.99), pct(b, 0.99))
            verdicts.append(f"{waiting} waiting: p50 {r50:.2f}×, p99 {r99:.2f}× "
                            f"(**{'met' if max(r50, r99) <= 1.10 else 'missed'}**)")
        say(f"`NOTIFY` tag ticket / blocked `WAIT`, {what} (goal: within 10 %, p50 and "
            f"p99): " + "; ".join(verdicts) + ".")
        say()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", required=True)
    ap.add_argument("--server", action="append",
                    help="a server binary; repeat for several (one section each); default "
                         "$REDIS_SERVER or redis-server on PATH")
    ap.add_argument("--quick", action="store_true", help="a seconds-long smoke run")
    ap.add_argument("--report", help="also write the markdown here")
    ap.add_argument("--block", help="replace the bench-tickets block in this file (BENCHMARK.md)")
    ap.add_argument("--only-latency", action="store_true",
                    help="only the grant latency section (with --block: its own block there)")
    ap.add_argument("--only-handoffs", action="store_true",
                    help="only the handoffs/s sections (1 000 tasks in one process and in 10; "
                         "with --block: their own block there)")
    a = ap.parse_args()
    servers = a.server or [os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
                           or "/usr/bin/redis-server"]
    q = a.quick
    cfg = {
        "tickets": 5_000 if q else 100_000, "conns": 10, "keys": 100,
        "blocked": 50 if q else 500,
        "chain_sizes": (1, 64), "lat_rounds": 2 if q else 3, "lat_per_round": 30 if q else 400,
        "tasks": 100 if q else 1000, "seconds": 1.0 if q else 5.0, "pool": 10,
        "tp_rounds": 2 if q else 6,
        "fleet_procs": 10, "fleet_rounds": 2 if q else 4, "fleet_seconds": 1.0 if q else 5.0,
    }
    out = []

    def say(line=""):
        print(line, flush=True)
        out.append(line)

    only = ("latency" if a.only_latency else "handoffs" if a.only_handoffs else None)
    if only:
        report, title, section = {
            "latency": (latency_report, "Ticket grant latency across processes", "section 2"),
            "handoffs": (handoffs_report, "Ticket handoffs/s, 1 000 tasks on one lock",
                         "sections 3 and 4"),
        }[only]
        for server in servers:
            workdir = tempfile.mkdtemp(prefix="rlock-tickets-bench-")
            srv = start_server(server, os.path.abspath(a.module), workdir)
            port = srv.port
            try:
                say(f"On `{subprocess.run([server, '--version'], capture_output=True, text=True).stdout.strip()}`; "
                    f"load average at start `{open('/proc/loadavg').read().strip()}`")
                say()
                report(port, cfg, say)
                say()
                say(f"Load average at end `{open('/proc/loadavg').read().strip()}`.")
                say()
            finally:
                srv.stop()
                shutil.rmtree(workdir, ignore_errors=True)
        if a.block:
            write_block(a.block, f"bench-tickets-{only}",
                        f"## {title} (`make bench-tickets-{only}`)"
                        f"\n\nGenerated by `bench/tickets.py --only-{only}` (also {section} "
                        "of `make bench-tickets`).\n\n" + "\n".join(out).rstrip() + "\n")
        return
    for server in servers:
        version = subprocess.run([server, "--version"], capture_output=True, text=True).stdout.strip()
        say(f"### On {version.split(' sha=')[0]}")
        say()
        run_one(server, version, os.path.abspath(a.module), cfg, q, say)
        say()
    body = "\n".join(out).rstrip() + "\n"
    if a.report:
        with open(a.report, "w") as f:
            f.write("# Queued tickets bench (`make bench-tickets`)\n\nGenerated by "
                    "`bench/tickets.py`; do not edit by hand. design.md 5, issue 14, "
                    "docs/commands/tickets.md.\n\n" + body)
    if a.block:
        write_block(a.block, "bench-tickets", "## Queued tickets (`make bench-tickets`)\n\n"
                    "Generated by `bench/tickets.py` (full report: bench/tickets.md).\n\n" + body)


def run_one(server, version, module, cfg, q, say):
    workdir = tempfile.mkdtemp(prefix="rlock-tickets-bench-")
    srv = start_server(server, module, workdir)
    port = srv.port
    started = time.monotonic()
    try:
        say(f"Server: `{version}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
            f"load average at start `{open('/proc/loadavg').read().strip()}`"
            + ("; **--quick** (smoke run, numbers not meaningful)" if q else ""))
        say()
        say(f"#### Memory per queued ticket ({cfg['tickets']} tickets from {cfg['conns']} connections)")
        say()
        say("Owners of Redisson's shape `<36-char uuid>:<thread id>` (40 bytes), request ids of 24 "
            "bytes, `WAIT 0 ASYNC ID` (no deadline) and `WAIT 600000 ASYNC ID` (a deadline: the "
            "queue's deadline heap holds it too). `used_memory` after the tests' settling (FLUSHALL SYNC, "
            "SLOWLOG RESET, CONFIG RESETSTAT) with the holders in place, then after queueing "
            "(read again 1 s later, once clientsCron has shrunk the connections' query buffers). "
            "Then the 10 connections are killed (CLIENT KILL ID): the tickets must be dropped, "
            "the holders released and the memory back to the reading before the connections "
            "were opened.")
        say()
        say("| layout | tickets | B per ticket | (read at once) | queueing s | tickets after kill "
            "| waiters after kill | dropped in ms | locks left | residual B |")
        say("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        mems = []
        control = memory_control(port, cfg["tickets"], cfg["conns"])
        for keys, timeout in ((cfg["keys"], 0), (1, 0), (1, 600_000)):
            m = memory_tickets(port, cfg["tickets"], cfg["conns"], keys, timeout)
            mems.append(m)
            say(f"| {keys} key{'s' if keys > 1 else ''}, `WAIT {timeout}` | {m['n']} | **{m['per_ticket']:.0f}** | "
                f"{m['per_ticket_now']:.0f} | {m['queue_s']:.2f} | {m['tickets_after_kill']} | "
                f"{m['waiters_after_kill']} | {m['drop_ms']:.0f} | {m['left']} | {m['residual']} |")
        say()
        say(f"Control, run first: the same 10 connections pipelining as many `PING`s instead, "
            f"killed the same way, leave a residual of {control} B (the server's own bookkeeping: "
            f"a fresh server's first killed connections leave it below where it started).")
        b = memory_blocked(port, cfg["blocked"])
        worst = max(m["per_ticket"] for m in mems)
        say()
        say(f"Blocked waiters (`RLOCK.ACQUIRE … WAIT 0 ID`, one raw connection each, "
            f"{b['n']} on one key, after `fill_module_client_pool`): idle connection "
            f"{b['per_conn_idle']:.0f} B, blocking in the module {b['per_blocked_only']:.0f} B, "
            f"**a blocked waiter with its connection {b['per_waiter']:.0f} B**.")
        say()
        say(f"Blocked waiter / ticket: **{ratio(b['per_waiter'], worst):.0f}×** (against the larger "
            f"ticket figure, {worst:.0f} B; goal ≤ 256 B per ticket: "
            f"**{'met' if worst <= 256 else 'missed'}**).")
        say()

        latency_report(port, cfg, say)

        handoffs_report(port, cfg, say)
        ctl = redis.Redis(port=port)
        wait_until("tickets gone", lambda: rstats(ctl)["tickets"] == 0, timeout=10)
        s = rstats(ctl)
        say()
        say(f"After the run: INFO rlock `tickets`={s['tickets']}, `tickets_queued`="
            f"{s['tickets_queued']}, `tickets_granted`={s['tickets_granted']}, "
            f"`tickets_timed_out`={s['tickets_timed_out']}, `tickets_dropped`="
            f"{s['tickets_dropped']}, `waiters`={s['waiters']}; run time "
            f"{time.monotonic() - started:.0f} s; load average at end "
            f"`{open('/proc/loadavg').read().strip()}`.")
    finally:
        srv.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def write_block(path, marker, body):
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    text = open(path).read() if os.path.exists(path) else ""
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
