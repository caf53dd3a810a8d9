"""A mixed fleet stays live (design.md 1.8, issue 39 item 5): waiters that run Redisson's
scripts (Redisson, rlock clients in scripts mode) beside clients that wait in the module,
on one module-loaded server and one lock name. The module hands a freed lock straight to
its own queue; while somebody listens on the lock's channel it leaves the lock free for a
short turn (`rlock.script-waiter-grace-ms`) at most once per `rlock.script-waiter-window-ms`,
so the script-side waiter gets in, and the module's waiters keep their order. The scripts
are Redisson's own (tests/support/redisson.py); the looping clients use RLOCK commands."""

import threading
import time

import pytest

from conftest import wait_until
from redisson import Redisson, channel

LEASE = 30_000
HOLD_S = 0.002


def subscribe(r, key):
    p = r.pubsub()
    p.subscribe(channel(key))
    assert wait_until(lambda: p.get_message(timeout=0.1), what="subscribed")["type"] == "subscribe"
    return p


def turns(r):
    return r.info("rlock")["rlock_script_turns"]


class Waiter(threading.Thread):
    """A module waiter: `RLOCK.ACQUIRE key owner LEASE WAIT timeout` on a connection of its
    own; `reply` once answered."""

    def __init__(self, server, key, owner, timeout=10_000):
        super().__init__(daemon=True)
        self.c, self.key, self.owner, self.timeout = server.client(), key, owner, timeout
        self.reply, self.done = "unanswered", threading.Event()

    def run(self):
        self.reply = self.c.execute_command("RLOCK.ACQUIRE", self.key, self.owner, LEASE,
                                            "WAIT", self.timeout)
        self.done.set()


def queued(r, key, n):
    """Waits until `n` clients wait in the module (each test waits on one key only)."""
    wait_until(lambda: r.info("rlock")["rlock_waiters"] == n, what=f"{n} waiters queued")


def test_a_release_with_module_waiters_publishes_to_a_listening_script_waiter(server):
    """The issue's transcript: a subscriber on Redisson's channel, a holder, a queued
    module waiter; the release now publishes `0` and leaves the lock free for the turn,
    then the module waiter holds it."""
    r = server.client()
    r.config_set("rlock.script-waiter-grace-ms", 300)
    p = subscribe(server.client(), "k")
    assert r.execute_command("RLOCK.ACQUIRE", "k", "a", LEASE) is None
    b = Waiter(server, "k", "b")
    b.start()
    queued(r, "k", 1)
    assert r.execute_command("RLOCK.RELEASE", "k", "a") == 1
    msg = wait_until(lambda: p.get_message(timeout=0.1), what="the unlock message")
    assert (msg["channel"], msg["data"]) == (channel("k").encode(), b"0")
    assert r.exists("k") == 0, "free during the turn"
    assert turns(r) == 1
    assert b.done.wait(5) and b.reply is None
    assert r.hgetall("k") == {b"b": b"1"}
    p.close()


def test_without_a_listener_the_handoff_is_immediate_and_silent(server):
    r = server.client()
    r.config_set("rlock.script-waiter-grace-ms", 300)
    assert r.execute_command("RLOCK.ACQUIRE", "k", "a", LEASE) is None
    b = Waiter(server, "k", "b")
    b.start()
    queued(r, "k", 1)
    assert r.execute_command("RLOCK.RELEASE", "k", "a") == 1
    assert r.hgetall("k") == {b"b": b"1"}, "handed over inside the release"
    assert turns(r) == 0
    assert b.done.wait(5) and b.reply is None


def test_grace_0_turns_it_off(server):
    r = server.client()
    r.config_set("rlock.script-waiter-grace-ms", 0)
    p = subscribe(server.client(), "k")
    assert r.execute_command("RLOCK.ACQUIRE", "k", "a", LEASE) is None
    b = Waiter(server, "k", "b")
    b.start()
    queued(r, "k", 1)
    assert r.execute_command("RLOCK.RELEASE", "k", "a") == 1
    assert r.hgetall("k") == {b"b": b"1"}
    assert p.get_message(timeout=0.2) is None, "a handoff publishes nothing"
    assert turns(r) == 0
    p.close()


def test_a_script_waiter_takes_the_turn_and_the_module_queue_follows(server):
    """Redisson's acquire script runs during the turn and gets the lock; the module's
    waiter is served at Redisson's release (its DEL), as after any Redisson release."""
    r = server.client()
    r.config_set("rlock.script-waiter-grace-ms", 5_000)
    p = subscribe(server.client(), "k")
    java = Redisson(server.client(), "k", "9f1c:1")
    assert r.execute_command("RLOCK.ACQUIRE", "k", "a", LEASE) is None
    b = Waiter(server, "k", "b")
    b.start()
    queued(r, "k", 1)
    assert r.execute_command("RLOCK.RELEASE", "k", "a") == 1
    assert wait_until(lambda: p.get_message(timeout=0.1), what="the unlock message")["data"] == b"0"
    assert java.try_lock() is None, "the script gets the free lock"
    assert not b.done.wait(0.2), "the module waiter waits for Redisson's hold"
    assert java.unlock() == 1
    assert b.done.wait(2), "served at Redisson's release, long before the turn's end"
    assert b.reply is None and r.hgetall("k") == {b"b": b"1"}
    p.close()


def test_module_commands_during_a_turn_queue_behind_the_module_waiters(server):
    """FIFO among module waiters is kept: an ACQUIRE during the turn is contended (told
    the turn's time left), and a waiting one queues behind the waiters already there."""
    r = server.client()
    r.config_set("rlock.script-waiter-grace-ms", 2_000)
    p = subscribe(server.client(), "k")
    assert r.execute_command("RLOCK.ACQUIRE", "k", "a", LEASE) is None
    b = Waiter(server, "k", "b")
    b.start()
    queued(r, "k", 1)
    assert r.execute_command("RLOCK.RELEASE", "k", "a") == 1
    left = r.execute_command("RLOCK.ACQUIRE", "k", "c", LEASE)
    assert 0 < left <= 2_000, "contended during the turn, told its time left"
    fenced = r.execute_command("RFENCED.ACQUIRE", "k", "f", LEASE)
    assert fenced[1] is None and 0 < fenced[0] <= 2_000, "the fenced lock too"
    c = Waiter(server, "k", "c")
    c.start()
    queued(r, "k", 2)
    assert r.exists("k") == 0
    assert b.done.wait(5) and b.reply is None, "the head first, at the turn's end"
    assert not c.done.is_set()
    assert r.execute_command("RLOCK.RELEASE", "k", "b") == 1
    assert c.done.wait(5) and c.reply is None
    assert r.hgetall("k") == {b"c": b"1"}
    p.close()


def test_at_most_one_turn_per_window(server):
    r = server.client()
    r.config_set("rlock.script-waiter-grace-ms", 1)
    r.config_set("rlock.script-waiter-window-ms", 600_000)
    p = subscribe(server.client(), "k")
    assert r.execute_command("RLOCK.ACQUIRE", "k", "o0", LEASE) is None
    for i in range(1, 4):
        w = Waiter(server, "k", f"o{i}")
        w.start()
        queued(r, "k", 1)
        assert r.execute_command("RLOCK.RELEASE", "k", f"o{i - 1}") == 1
        assert w.done.wait(5) and w.reply is None
    assert turns(r) == 1, "later releases in the window hand over at once"
    p.close()


def waiters_on(c, key):
    info = c.execute_command("RLOCK.INFO", key)
    return dict(zip(info[::2], info[1::2]))[b"waiters"] if info else 0


def run_fleet(server, grace_ms, attempts, give_up_s, loopers=2, steady=False):
    """`loopers` module clients loop ACQUIRE WAIT / 2 ms / RELEASE on one lock while a waiter on
    Redisson's algorithm (try the script; on a PTTL, wait for the unlock message or that
    PTTL, try again) takes it `attempts` times, holding 2 ms each. Returns its waits in ms
    (None for an attempt that gave up after `give_up_s`) and the module's acquisitions.
    `steady`: a looper releases only once another waits in the module (a machine stalling
    both loopers for a whole hold would otherwise free the lock with nobody queued)."""
    r = server.client()
    r.config_set("rlock.script-waiter-grace-ms", grace_ms)
    stop = threading.Event()
    counts = [0] * loopers

    def loop(i):
        c = server.client()
        while not stop.is_set():
            if c.execute_command("RLOCK.ACQUIRE", "k", f"rust:{i}", LEASE, "WAIT", 1_000) is None:
                counts[i] += 1
                time.sleep(HOLD_S)
                while steady and not stop.is_set() and waiters_on(c, "k") == 0:
                    time.sleep(0.0005)
                c.execute_command("RLOCK.RELEASE", "k", f"rust:{i}")

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(loopers)]
    for t in threads:
        t.start()
    wait_until(lambda: sum(counts) > 20, what="the module clients looping")
    java = Redisson(server.client(), "k", "9f1c:1", lease=LEASE)
    waits = []
    try:
        for _ in range(attempts):
            p = subscribe(server.client(), "k")  # Redisson subscribes, then tries again
            start = time.monotonic()
            end = start + give_up_s
            got = False
            while time.monotonic() < end:
                ttl = java.try_lock()
                if ttl is None:
                    got = True
                    break
                p.get_message(timeout=min(ttl / 1000, end - time.monotonic()))
            waits.append((time.monotonic() - start) * 1000 if got else None)
            p.close()
            if not got:
                break
            time.sleep(HOLD_S)
            java.unlock()
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    return waits, sum(counts)


def test_a_redisson_waiter_beside_two_looping_module_clients_gets_in_within_the_bound(server):
    """The issue's scenario. The bound stated in design.md 1.8: one window (50 ms) plus
    one hold plus the waiter's wake-up, which must fit in the grace (10 ms). A waiter
    whose wake-up does not (a stalled thread on a loaded machine) misses that turn and
    takes the next one, a window later: asserted with room for that."""
    waits, acquisitions = run_fleet(server, grace_ms=10, attempts=30, give_up_s=4)
    assert None not in waits, f"the Redisson waiter starved: {waits}"
    waits.sort()
    median, p90, worst = waits[15], waits[27], waits[-1]
    print(f"\nRedisson waiter, 30 attempts: median {median:.1f} ms, p90 {p90:.1f} ms, "
          f"worst {worst:.1f} ms; module acquisitions meanwhile: {acquisitions}")
    assert median < 100, waits
    assert p90 < 500, waits
    assert acquisitions > 100, "the module clients kept going"


def test_without_turns_the_redisson_waiter_starves(server):
    """The same scenario with turns off (grace 0): the module's handoffs publish nothing,
    and the waiter, told a 30 s PTTL, never sees the lock free. This is what the test
    above would meet without the change. Each release waits until the other looper is
    queued, so that no release finds the queue empty (which publishes) because a loaded
    machine stalled a looper for a whole hold."""
    waits, _ = run_fleet(server, grace_ms=0, attempts=1, give_up_s=1.5, steady=True)
    assert waits == [None]


def test_a_listener_that_never_takes_the_lock_is_given_fewer_and_fewer_turns(server):
    """A monitoring SUBSCRIBE on the lock's channel beside two looping module clients
    (design.md 1.8, Cost): after two unused turns in a row the window between looks doubles
    with each further one, up to 16 windows, so the idle listener costs the lock a grace
    every 16 windows, not every window. A Redisson-style waiter arriving then still gets in
    within the backed-off window, and the turn it takes brings the window back."""
    r = server.client()
    window = int(r.config_get("rlock.script-waiter-window-ms")["rlock.script-waiter-window-ms"])
    idle = subscribe(server.client(), "k")
    stop = threading.Event()
    counts = [0, 0]

    def loop(i):
        c = server.client()
        while not stop.is_set():
            if c.execute_command("RLOCK.ACQUIRE", "k", f"m:{i}", LEASE, "WAIT", 1_000) is None:
                counts[i] += 1
                time.sleep(HOLD_S)
                c.execute_command("RLOCK.RELEASE", "k", f"m:{i}")

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(2)]
    try:
        base = turns(r)
        start = time.monotonic()
        for t in threads:
            t.start()
        # Long enough for the looks to back off fully (2 + 2 + 4 + 8 windows) and then
        # run at the widest for several more.
        wait_until(lambda: time.monotonic() - start > 40 * window / 1000 + 1.5, 30,
                   what="the fleet ran")
        elapsed_ms = (time.monotonic() - start) * 1000
        idle_turns = turns(r) - base
        # Without the back-off: a turn at the first release of every window.
        unbacked = elapsed_ms / (window + 10)
        print(f"\nidle listener: {idle_turns} turns in {elapsed_ms:.0f} ms "
              f"(one per window would be ~{unbacked:.0f}); module acquisitions {sum(counts)}")
        assert 3 <= idle_turns <= 6 + elapsed_ms / (16 * window), idle_turns
        assert sum(counts) > 100, "the module clients kept going"

        # A Redisson-style waiter now: its turn comes within the widest window (plus the
        # hold and its own wake-up), and taking it brings the window back.
        java = Redisson(server.client(), "k", "9f1c:1", lease=LEASE)
        waits = []
        for _ in range(2):
            p = subscribe(server.client(), "k")
            t0 = time.monotonic()
            while (ttl := java.try_lock()) is not None and time.monotonic() - t0 < 10:
                p.get_message(timeout=min(ttl / 1000, 0.5))
            assert ttl is None, "the Redisson-style waiter got in"
            waits.append((time.monotonic() - t0) * 1000)
            p.close()
            time.sleep(HOLD_S)
            java.unlock()
        print(f"Redisson-style waiter after the back-off: {waits[0]:.0f} ms, then {waits[1]:.0f} ms")
        assert waits[0] < 16 * window + 2_000, waits
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        idle.close()


def test_the_turn_configs_have_documented_defaults_and_ranges(r):
    got = r.config_get("rlock.script-waiter-*")
    assert got == {"rlock.script-waiter-grace-ms": "10", "rlock.script-waiter-window-ms": "50"}
    for name, bad in (("grace", "-1"), ("grace", "10001"), ("window", "0"),
                      ("window", "3600001")):
        with pytest.raises(Exception):
            r.config_set(f"rlock.script-waiter-{name}-ms", bad)
    assert r.config_get("rlock.script-waiter-*") == got
