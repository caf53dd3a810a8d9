"""Memory does not grow with use of the read-write lock, as tests/stress/test_leak.py checks for
RLOCK: read holds with their timeout keys, re-entries, renewals, writers and readers
waiting, handed the lock, timing out and disconnecting leave `used_memory` where it
started, and the module unloads afterwards.

$RLOCK_LEAK_CYCLES sets the number of cycles (shared with test_leak.py; 2 000 here by
default so `make test` stays fast; a long run uses more).
"""

import os

from conftest import wait_until
from hostile_helpers import Raw, rlock_stat
from test_leak import MARGIN, WIDTH, Crowd, quiet_memory, connected_clients

CYCLES = int(os.environ.get("RLOCK_LEAK_CYCLES", "2000"))


def run_batch(ctl, crowd, kind, batch):
    keys = [f"rwleak:{j}" if j % 2 else f"{{rwleak}}:{j}:{batch % 7}" for j in range(WIDTH)]
    setup = []
    for k in keys:
        setup += [("RRWLOCK.ACQUIRE", k, "READ", "r1", 60000),
                  ("RRWLOCK.ACQUIRE", k, "READ", "r1", 60000),
                  ("RRWLOCK.ACQUIRE", k, "READ", "r2", 60000),
                  ("RRWLOCK.RENEW", k, "READ", "r1", 60000)]
    assert ctl.pipeline(setup) == [None, None, None, 1] * WIDTH
    timeout = {"handoff": 0, "timeout": 1, "disconnect": 60000}[kind]
    # One writer per key waits behind two readers (with a request id, whose record a
    # handoff writes and a disconnect leaves alone).
    for k, s, j in zip(keys, crowd.socks, range(WIDTH)):
        s.send_many([("RRWLOCK.ACQUIRE", k, "WRITE", f"w:{j}", 30000, "WAIT", timeout,
                      "ID", f"id{batch}:{j}"),
                     ("RRWLOCK.RELEASE", k, "WRITE", f"w:{j}")])
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
    releases = []
    for k in keys:
        releases += [("RRWLOCK.RELEASE", k, "READ", "r1"), ("RRWLOCK.RELEASE", k, "READ", "r1"),
                     ("RRWLOCK.RELEASE", k, "READ", "r2")]
    assert ctl.pipeline(releases) == [0, 1, 1] * WIDTH
    if kind == "handoff":
        for s in crowd.socks:
            assert (s.read(), s.read()) == (None, 1)
    # The request-id records stay for their window: drop them, then nothing is left.
    ctl.call("FLUSHALL")
    assert ctl.call("DBSIZE") == 0


def run_cycles(ctl, port, cycles):
    crowd = Crowd(port)
    try:
        for batch in range(max(1, cycles // WIDTH)):
            kind = "timeout" if batch % 8 == 3 else "disconnect" if batch % 16 == 7 else "handoff"
            run_batch(ctl, crowd, kind, batch)
    finally:
        crowd.close()


def test_many_rw_cycles_leave_memory_at_its_baseline(make_server):
    server = make_server(args=["--hz", "500"])
    ctl = Raw(server.port)
    try:
        clients = connected_clients(ctl)
        run_cycles(ctl, server.port, 16 * WIDTH)
        baseline = quiet_memory(ctl, clients)
        handoffs_before = rlock_stat(ctl, "handoffs")
        run_cycles(ctl, server.port, CYCLES)
        after = quiet_memory(ctl, clients)
        assert rlock_stat(ctl, "handoffs") - handoffs_before >= CYCLES // 2
        assert (rlock_stat(ctl, "waiters"), rlock_stat(ctl, "keys_with_waiters")) == (0, 0)
        assert after - baseline <= MARGIN, f"used_memory grew by {after - baseline} bytes"
        assert ctl.call("MODULE", "UNLOAD", "rlock") == b"OK"
    finally:
        ctl.close()
