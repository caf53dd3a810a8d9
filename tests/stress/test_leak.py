"""Memory does not grow with use (issue 7): many acquire / re-enter / renew / wait / hand
off / time out / disconnect cycles leave `used_memory` where it started, and the module
unloads afterwards.

$RLOCK_LEAK_CYCLES sets the number of cycles (20 000 by default, so `make test` spends a
few seconds here; a long run uses 1 000 000). The module allocates through Redis's
allocator (see src/lib.rs), so its leaks show up in `used_memory`.
"""

import os
import time

from conftest import wait_until
from hostile_helpers import Raw, connected_clients, rlock_stat, settle_memory, used_memory

CYCLES = int(os.environ.get("RLOCK_LEAK_CYCLES", "20000"))
WIDTH = 50  # locks (and waiting connections) per batch: one cycle each per batch

# Why this margin: both readings are taken in the same state (FLUSHALL, slow log and stats
# reset, only the control connections open), after a warm-up that has already grown every
# table that keeps its capacity (Redis's dicts, the module's handle and timer maps) to its
# peak. What is left is allocator rounding and Redis's small lazily-made objects: a few KB.
# 64 KB is under 4 bytes per cycle at the default 20 000 cycles, so a leak of even one
# small allocation per cycle (a handle, a key copy, an owner copy: >= 8 bytes) fails.
MARGIN = 64 * 1024


class Crowd:
    """WIDTH waiting connections, one per lock key."""

    def __init__(self, port):
        self.port = port
        self.socks = [Raw(port) for _ in range(WIDTH)]

    def close(self):
        for s in self.socks:
            s.close()
        self.socks = []


def run_batch(ctl, crowd, kind, batch):
    keys = [f"leak:{j}" if j % 2 else f"{{leak}}:{j}:{batch % 7}" for j in range(WIDTH)]
    setup = []
    for k in keys:
        setup += [("RLOCK.ACQUIRE", k, "holder", 60000),
                  ("RLOCK.ACQUIRE", k, "holder", 60000),
                  ("RLOCK.RENEW", k, "holder", 60000)]
    assert ctl.pipeline(setup) == [None, None, 1] * WIDTH
    timeout = {"handoff": 0, "timeout": 1, "disconnect": 60000}[kind]
    for k, s, j in zip(keys, crowd.socks, range(WIDTH)):
        s.send_many([("RLOCK.ACQUIRE", k, f"w:{j}", 30000, "WAIT", timeout),
                     ("RLOCK.RELEASE", k, f"w:{j}")])
    if kind == "timeout":
        for s in crowd.socks:
            pttl, release = s.read(), s.read()
            assert 0 < pttl <= 60000 and release is None, (pttl, release)
    else:
        wait_until(lambda: rlock_stat(ctl, "waiters") == WIDTH, what="the crowd queued")
    if kind == "disconnect":
        crowd.close()
        crowd.socks = [Raw(crowd.port) for _ in range(WIDTH)]
        wait_until(lambda: rlock_stat(ctl, "waiters") == 0, what="the crowd gone")
    releases = [("RLOCK.RELEASE", k, "holder") for k in keys for _ in range(2)]
    assert ctl.pipeline(releases) == [0, 1] * WIDTH
    if kind == "handoff":
        for s in crowd.socks:
            assert (s.read(), s.read()) == (None, 1)
    assert ctl.call("DBSIZE") == 0


def run_cycles(ctl, port, cycles):
    crowd = Crowd(port)
    try:
        for batch in range(max(1, cycles // WIDTH)):
            kind = "timeout" if batch % 8 == 3 else "disconnect" if batch % 16 == 7 else "handoff"
            run_batch(ctl, crowd, kind, batch)
    finally:
        crowd.close()


def quiet_memory(ctl, clients):
    wait_until(lambda: connected_clients(ctl) == clients, what="only the control clients left")
    settle_memory(ctl)
    return used_memory(ctl)


def test_many_lock_cycles_leave_memory_at_its_baseline(make_server):
    server = make_server(args=["--hz", "500"])
    ctl = Raw(server.port)
    try:
        clients = connected_clients(ctl)
        run_cycles(ctl, server.port, 16 * WIDTH)  # warm-up: every kind of batch, twice
        baseline = quiet_memory(ctl, clients)

        started = time.monotonic()
        handoffs_before = rlock_stat(ctl, "handoffs")
        run_cycles(ctl, server.port, CYCLES)
        elapsed = time.monotonic() - started
        after = quiet_memory(ctl, clients)

        assert rlock_stat(ctl, "handoffs") - handoffs_before >= CYCLES * 3 // 4
        assert (rlock_stat(ctl, "waiters"), rlock_stat(ctl, "keys_with_waiters")) == (0, 0)
        assert after - baseline <= MARGIN, (
            f"used_memory grew by {after - baseline} bytes over {CYCLES} cycles "
            f"({(after - baseline) / CYCLES:.2f} B/cycle; {elapsed:.1f}s)")
        assert ctl.call("MODULE", "UNLOAD", "rlock") == b"OK"
    finally:
        ctl.close()


def test_a_large_batch_replicated_leaves_no_buffer_behind(make_server):
    """The replication glue keeps its `RLOCK.APPLY` payload buffer from one lock command to
    the next (ffi/replication.rs), at a lock command's usual size: a command that carried
    megabytes (a 1 MB owner id, written and replicated twice) must not keep them for good.
    An AOF makes the module replicate on every server."""
    s = make_server(args=["--appendonly", "yes", "--appendfsync", "no"])
    c = Raw(s.port)
    ctl = Raw(s.port)
    try:
        c.call("RLOCK.ACQUIRE", "warm", "o", 60_000)
        c.call("RLOCK.RELEASE", "warm", "o")
        settle_memory(ctl)
        baseline = used_memory(ctl)
        owner = "o" * (1 << 20)
        clients = connected_clients(ctl)
        big = Raw(s.port)  # closed before reading: its query buffer held the megabyte
        assert big.call("RLOCK.ACQUIRE", "big", owner, 60_000) is None
        assert big.call("RLOCK.RELEASE", "big", owner) == 1
        big.close()
        c.call("RLOCK.ACQUIRE", "small", "o", 60_000)  # a batch after it, of usual size
        c.call("RLOCK.RELEASE", "small", "o")
        wait_until(lambda: connected_clients(ctl) == clients, 5, what="the big client gone")

        def back():
            settle_memory(ctl)
            return used_memory(ctl) - baseline <= MARGIN

        wait_until(back, 10, what="memory back to its baseline")
    finally:
        c.close()
        ctl.close()
