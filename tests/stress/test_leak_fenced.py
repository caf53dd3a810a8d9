"""Memory does not grow with fenced-lock use (issue 12, design.md 4.2): the leak cycles of
test_leak.py (acquire, re-enter, renew, wait, hand off, time out, disconnect) done with
RFENCED.ACQUIRE, request ids and RLOCK.RELEASE, leave `used_memory` where it started and
the module unloads afterwards. Same knob: $RLOCK_LEAK_CYCLES (20 000 by default).
"""

import time

from conftest import wait_until
from hostile_helpers import Raw, connected_clients, rlock_stat
from test_leak import CYCLES, MARGIN, WIDTH, Crowd, quiet_memory


def is_token(reply):
    return isinstance(reply, list) and reply[0] is None and isinstance(reply[1], int) and reply[1] > 0


def run_batch(ctl, crowd, kind, batch):
    keys = [f"fleak:{j}" if j % 2 else f"{{fleak}}:{j}:{batch % 7}" for j in range(WIDTH)]
    setup = []
    for k in keys:
        setup += [("RFENCED.ACQUIRE", k, "holder", 60000, "ID", f"h{batch}"),
                  ("RFENCED.ACQUIRE", k, "holder", 60000),
                  ("RLOCK.RENEW", k, "holder", 60000),
                  ("RFENCED.GETTOKEN", k)]
    replies = ctl.pipeline(setup)
    for j in range(WIDTH):
        first, second, renewed, token = replies[4 * j:4 * j + 4]
        assert is_token(first) and is_token(second) and renewed == 1, replies[4 * j:4 * j + 4]
        assert second[1] > first[1] and token == second[1]
    timeout = {"handoff": 0, "timeout": 1, "disconnect": 60000}[kind]
    for k, s, j in zip(keys, crowd.socks, range(WIDTH)):
        s.send_many([("RFENCED.ACQUIRE", k, f"w:{j}", 30000, "WAIT", timeout, "ID", f"w{batch}"),
                     ("RLOCK.RELEASE", k, f"w:{j}")])
    if kind == "timeout":
        for s in crowd.socks:
            (pttl, token), release = s.read(), s.read()
            assert 0 < pttl <= 60000 and token is None and release is None
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
            handed, release = s.read(), s.read()
            assert is_token(handed) and release == 1, (handed, release)
    # Left behind: the token keys (they never expire, as Redisson's) and request records.
    assert all(ctl.call("EXISTS", k) == 0 for k in keys)


def run_cycles(ctl, port, cycles):
    crowd = Crowd(port)
    try:
        for batch in range(max(1, cycles // WIDTH)):
            kind = "timeout" if batch % 8 == 3 else "disconnect" if batch % 16 == 7 else "handoff"
            run_batch(ctl, crowd, kind, batch)
    finally:
        crowd.close()


def quiet(ctl, clients):
    """test_leak.py's quiet reading, after a synchronous flush: Valkey 8+ flushes lazily
    by default (lazyfree-lazy-user-flush), and the 40 000 request records of a run were
    still being freed in the background when `used_memory` was read (2 MB "growth")."""
    assert ctl.call("FLUSHALL", "SYNC") == b"OK"
    return quiet_memory(ctl, clients)


def test_many_fenced_cycles_leave_memory_at_its_baseline(make_server):
    server = make_server(args=["--hz", "500"])
    ctl = Raw(server.port)
    try:
        clients = connected_clients(ctl)
        run_cycles(ctl, server.port, 16 * WIDTH)  # warm-up: every kind of batch, twice
        baseline = quiet(ctl, clients)

        started = time.monotonic()
        issued_before = rlock_stat(ctl, "fenced_tokens_issued")
        run_cycles(ctl, server.port, CYCLES)
        elapsed = time.monotonic() - started
        after = quiet(ctl, clients)

        assert rlock_stat(ctl, "fenced_tokens_issued") - issued_before >= CYCLES * 2
        assert (rlock_stat(ctl, "waiters"), rlock_stat(ctl, "keys_with_waiters")) == (0, 0)
        assert after - baseline <= MARGIN, (
            f"used_memory grew by {after - baseline} bytes over {CYCLES} cycles "
            f"({(after - baseline) / CYCLES:.2f} B/cycle; {elapsed:.1f}s)")
        assert ctl.call("MODULE", "UNLOAD", "rlock") == b"OK"
    finally:
        ctl.close()
