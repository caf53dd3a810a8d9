"""WAIT timeouts are served on time, not on Redis's next cron tick.

Redis checks blocked-client timeouts before it sleeps and, left alone, sleeps until its
next serverCron (1000/hz ms). At hz 1 that would make a 100 ms WAIT answer up to a second
late; the module's deadline timer wakes the loop just after the deadline instead.
"""

import time


def test_wait_times_out_on_time_even_at_hz_1(make_server):
    s = make_server(args=["--hz", "1"])
    r = s.client()
    r.execute_command("RLOCK.ACQUIRE", "k", "holder", 60_000)
    for _ in range(3):
        start = time.monotonic()
        reply = r.execute_command("RLOCK.ACQUIRE", "k", "waiter", 1_000, "WAIT", 100)
        elapsed = time.monotonic() - start
        assert isinstance(reply, int) and reply > 50_000, "the holder's PTTL"
        assert 0.099 <= elapsed < 0.35, f"WAIT 100 answered after {elapsed * 1000:.0f} ms"
    assert r.info("rlock")["rlock_wait_timeouts"] == 3
    assert r.info("rlock")["rlock_waiters"] == 0


def test_a_waiter_served_early_leaves_no_timer_behind(make_server):
    """The deadline timer of a waiter handed the lock is stopped: MODULE UNLOAD, which
    Redis refuses while a module has pending timers, succeeds right away."""
    import threading

    s = make_server()
    r = s.client()
    r.execute_command("RLOCK.ACQUIRE", "k", "holder", 60_000)
    got = {}
    w = s.client()
    t = threading.Thread(target=lambda: got.update(
        reply=w.execute_command("RLOCK.ACQUIRE", "k", "waiter", 1_000, "WAIT", 600_000)))
    t.start()
    deadline = time.monotonic() + 5
    while r.info("rlock")["rlock_waiters"] != 1:
        assert time.monotonic() < deadline, "waiter never queued"
        time.sleep(0.005)
    r.execute_command("RLOCK.RELEASE", "k", "holder")
    t.join(5)
    assert got["reply"] is None
    r.execute_command("RLOCK.RELEASE", "k", "waiter")
    assert r.execute_command("MODULE", "UNLOAD", "rlock") == b"OK"
