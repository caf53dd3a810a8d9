"""Memory does not grow with latch use (as tests/stress/test_leak.py for the lock): many set /
await / count down to zero / time out / disconnect / delete cycles leave `used_memory`
where it started, and the module unloads afterwards.

$RLOCK_LEAK_CYCLES sets the number of cycles, as in test_leak.py (default here 5 000: the
engine's bookkeeping is the lock's, already run 20 000 times there).
"""

import os

from conftest import wait_until
from hostile_helpers import Raw, connected_clients, rlock_stat
from test_leak import MARGIN, WIDTH, quiet_memory

CYCLES = int(os.environ.get("RLOCK_LEAK_CYCLES", "5000"))


def run_batch(ctl, socks, kind, batch):
    keys = [f"latch:{j}" if j % 2 else f"{{latch}}:{j}:{batch % 7}" for j in range(WIDTH)]
    assert ctl.pipeline([("RLATCH.TRYSETCOUNT", k, 2) for k in keys]) == [1] * WIDTH
    timeout = {"opened": 0, "deleted": 0, "timeout": 1, "disconnect": 60000}[kind]
    for k, s in zip(keys, socks):
        s.send_many([("RLATCH.AWAIT", k, "WAIT", timeout), ("RLATCH.GETCOUNT", k)])
    if kind == "timeout":
        for s in socks:
            assert (s.read(), s.read()) == (0, 2)
    else:
        wait_until(lambda: rlock_stat(ctl, "waiters") == WIDTH, what="the crowd queued")
    if kind == "disconnect":
        for s in socks:
            s.close()
        socks[:] = [Raw(ctl_port(ctl)) for _ in range(WIDTH)]
        wait_until(lambda: rlock_stat(ctl, "waiters") == 0, what="the crowd gone")
    if kind == "deleted":
        assert ctl.pipeline([("RLATCH.DELETE", k) for k in keys]) == [1] * WIDTH
    else:
        downs = [("RLATCH.COUNTDOWN", k) for k in keys for _ in range(2)]
        assert ctl.pipeline(downs) == [1, 0] * WIDTH
    if kind in ("opened", "deleted"):
        for s in socks:
            assert (s.read(), s.read()) == (1, 0)
    assert ctl.call("DBSIZE") == 0


def ctl_port(ctl):
    return ctl.sock.getpeername()[1]


def run_cycles(ctl, cycles):
    socks = [Raw(ctl_port(ctl)) for _ in range(WIDTH)]
    try:
        for batch in range(max(1, cycles // WIDTH)):
            kind = ("timeout" if batch % 8 == 3 else "disconnect" if batch % 16 == 7
                    else "deleted" if batch % 4 == 1 else "opened")
            run_batch(ctl, socks, kind, batch)
    finally:
        for s in socks:
            s.close()


def test_many_latch_cycles_leave_memory_at_its_baseline(make_server):
    server = make_server(args=["--hz", "500"])
    ctl = Raw(server.port)
    try:
        clients = connected_clients(ctl)
        run_cycles(ctl, 16 * WIDTH)  # warm-up: every kind of batch
        baseline = quiet_memory(ctl, clients)
        released = rlock_stat(ctl, "latch_awaits_released")
        run_cycles(ctl, CYCLES)
        after = quiet_memory(ctl, clients)
        assert rlock_stat(ctl, "latch_awaits_released") - released >= CYCLES // 2
        assert (rlock_stat(ctl, "waiters"), rlock_stat(ctl, "keys_with_waiters")) == (0, 0)
        assert after - baseline <= MARGIN, (
            f"used_memory grew by {after - baseline} bytes over {CYCLES} cycles")
        assert ctl.call("MODULE", "UNLOAD", "rlock") == b"OK"
    finally:
        ctl.close()
