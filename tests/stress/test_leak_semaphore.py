"""Memory does not grow with semaphore use: many acquire / wait / grant / time out /
disconnect / lease-end cycles of RSEMAPHORE.* and RPSEMAPHORE.* leave `used_memory` where
it started, no waiter and no lease timer behind, and the module unloads afterwards.

$RLOCK_LEAK_CYCLES sets the number of cycles, as for tests/stress/test_leak.py (whose margin,
helpers and reasoning this reuses; 20 000 by default).
"""

import time

from conftest import wait_until
from hostile_helpers import Raw, connected_clients, rlock_stat, settle_memory, used_memory
from test_leak import CYCLES, MARGIN, WIDTH, Crowd


def run_batch(ctl, crowd, kind, batch):
    """WIDTH keys, one waiter each: a semaphore on even keys, a permit-expirable one on odd
    keys. The waiters are granted (handoff), time out, or disconnect while queued."""
    keys = [f"ls:{j}" if j % 2 else f"{{ls}}:{j}:{batch % 7}" for j in range(WIDTH)]
    setup = []
    for j, k in enumerate(keys):
        if j % 2 == 0:
            setup += [("RSEMAPHORE.TRYSETPERMITS", k, 1), ("RSEMAPHORE.ACQUIRE", k, 1)]
        else:
            setup += [("RPSEMAPHORE.TRYSETPERMITS", k, 1), ("RPSEMAPHORE.ACQUIRE", k, 60000)]
    replies = ctl.pipeline(setup)
    held = {k: replies[2 * j + 1] for j, k in enumerate(keys) if j % 2}
    timeout = {"handoff": 0, "timeout": 1, "disconnect": 60000}[kind]
    for j, (k, s) in enumerate(zip(keys, crowd.socks)):
        if j % 2 == 0:
            s.send_many([("RSEMAPHORE.ACQUIRE", k, 1, "WAIT", timeout)])
        else:
            s.send_many([("RPSEMAPHORE.ACQUIRE", k, 50, "WAIT", timeout)])
    if kind == "timeout":
        for s in crowd.socks:
            assert s.read() in (0, None)
    else:
        wait_until(lambda: rlock_stat(ctl, "waiters") == WIDTH, what="the crowd queued")
    if kind == "disconnect":
        crowd.close()
        crowd.socks = [Raw(crowd.port) for _ in range(WIDTH)]
        wait_until(lambda: rlock_stat(ctl, "waiters") == 0, what="the crowd gone")
    releases = []
    for j, k in enumerate(keys):
        releases.append(("RSEMAPHORE.RELEASE", k, 1) if j % 2 == 0 else ("RPSEMAPHORE.RELEASE", k, held[k]))
    ctl.pipeline(releases)
    if kind == "handoff":
        for j, s in enumerate(crowd.socks):
            got = s.read()
            assert got == 1 if j % 2 == 0 else len(got) == 32, got
    ctl.call("FLUSHALL")


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
    # The handed-over permits had 50 ms leases: their timers fire on flushed keys.
    wait_until(lambda: rlock_stat(ctl, "key_timers") == 0, what="lease timers fired")
    settle_memory(ctl)
    return used_memory(ctl)


def test_many_semaphore_cycles_leave_memory_at_its_baseline(make_server):
    server = make_server(args=["--hz", "500"])
    ctl = Raw(server.port)
    try:
        clients = connected_clients(ctl)
        run_cycles(ctl, server.port, 16 * WIDTH)
        baseline = quiet_memory(ctl, clients)
        started = time.monotonic()
        before = rlock_stat(ctl, "sem_granted_after_wait") + rlock_stat(ctl, "psem_granted_after_wait")
        run_cycles(ctl, server.port, CYCLES)
        after = quiet_memory(ctl, clients)
        granted = rlock_stat(ctl, "sem_granted_after_wait") + rlock_stat(ctl, "psem_granted_after_wait")
        assert granted - before >= CYCLES * 3 // 4
        assert (rlock_stat(ctl, "waiters"), rlock_stat(ctl, "keys_with_waiters")) == (0, 0)
        assert after - baseline <= MARGIN, (
            f"used_memory grew by {after - baseline} bytes over {CYCLES} cycles "
            f"({time.monotonic() - started:.1f}s)")
        assert ctl.call("MODULE", "UNLOAD", "rlock") == b"OK"
    finally:
        ctl.close()
