"""Nothing held while nobody waits (design.md 1): after clients of every primitive waited and
left every way there is (granted, timed out, disconnected, as blocked clients and as
queued tickets), with state still held (locks, permits, leased permits), the module holds
no timer and no event subscription it can drop, and `MODULE UNLOAD rlock` succeeds.

What each server allows (checked against their sources and here):
- every server refuses MODULE UNLOAD while the module has blocked clients or a timer not
  yet fired, and allows it with event subscriptions (it drops them itself);
- Redis 8.2 and Valkey 9.1 report key removals with the key server event, which the module
  drops when the last waiter left: it then holds no subscription at all;
- Redis 7.0 has only keyspace events and no `UnsubscribeFromKeyspaceEvents`: from the first
  wait since start the module keeps that one subscription (its callback turns every event
  away at its first check while nobody waits), and unloads all the same.
"""

import threading

import pytest
import redis

from conftest import server_has_post_notification_jobs, wait_until

LONG = 60_000


def stat(r, name):
    return r.info("rlock")[f"rlock_{name}"]


def sticky_subscriptions():
    """The subscriptions the module cannot drop on this server once somebody waited."""
    return 0 if server_has_post_notification_jobs() else 1


def queued(r, n):
    wait_until(lambda: stat(r, "waiters") == n, what=f"{n} waiter(s) queued")


class Waiter:
    """One blocking call on a connection of its own, run in a thread."""

    def __init__(self, server, *cmd):
        self.conn = server.client()
        self.id = self.conn.client_id()
        self.reply = self.error = None
        self.thread = threading.Thread(target=self._run, args=(cmd,), daemon=True)
        self.thread.start()

    def _run(self, cmd):
        try:
            self.reply = self.conn.execute_command(*cmd)
        except (redis.ConnectionError, redis.ResponseError) as e:
            self.error = e

    def join(self):
        self.thread.join(10)
        assert not self.thread.is_alive(), "the waiter was never answered"
        return self.reply


def leave_every_way(server, r, wait_cmd):
    """The waits that end without a grant, on a key held by somebody else (`wait_cmd(t)`
    waits up to t ms): a blocked client timed out, one disconnected, a ticket timed out, a
    ticket whose connection closed."""
    # Timed out (the module's own deadline timer).
    w = Waiter(server, *wait_cmd(50))
    w.join()
    # Disconnected while blocked.
    w = Waiter(server, *wait_cmd(LONG))
    queued(r, 1)
    r.client_kill_filter(_id=w.id)
    w.join()
    queued(r, 0)
    # A ticket timed out.
    assert r.execute_command(*wait_cmd(50), "ASYNC", "ID", "t-timeout") == b"QUEUED"
    wait_until(lambda: stat(r, "waiters") == 0, what="the ticket timed out")
    # A ticket whose connection closed.
    c = server.client()
    assert c.execute_command(*wait_cmd(LONG), "ASYNC", "ID", "t-gone") == b"QUEUED"
    queued(r, 1)
    c.close()
    wait_until(lambda: stat(r, "waiters") == 0, what="the ticket left with its connection")


def assert_nothing_held_and_unload(r, *done):
    """No waiter, no timer, only the subscription the server cannot drop: UNLOAD works.
    `done`: connections that collected ticket grants, closed now (the client-change event
    stays until a closing connection finds no uncollected grant left)."""
    for c in done:
        c.close()
    wait_until(lambda: stat(r, "waiters") == 0, what="nobody waits")
    wait_until(lambda: stat(r, "key_timers") == 0, what="no key timer")
    wait_until(lambda: stat(r, "event_subscriptions") == sticky_subscriptions(),
               what="the subscriptions dropped")
    assert stat(r, "watching") == 0
    assert r.info("clients")["blocked_clients"] == 0
    assert r.execute_command("MODULE", "UNLOAD", "rlock") == b"OK"


def lock_scenario(server, r, acquire, release, granted=None):
    """RLOCK / RFENCED / RRWLOCK WRITE: `acquire(owner, *wait)` and `release(owner)` build
    the commands; `granted` is the reply of an acquire that got the lock."""
    r.execute_command(*acquire("holder"))
    leave_every_way(server, r, lambda t: acquire("w", "WAIT", t))
    # Granted: a blocked waiter, then a ticket behind it, collected by its retry.
    g = Waiter(server, *acquire("g", "WAIT", LONG))
    queued(r, 1)
    t = server.client()
    ticket = [*acquire("t", "WAIT", LONG), "ASYNC", "ID", "t-granted"]
    assert t.execute_command(*ticket) == b"QUEUED"
    queued(r, 2)
    r.execute_command(*release("holder"))
    got = g.join()
    assert got == granted or (isinstance(got, list) and got[0] is None and granted == "fenced"), \
        "the blocked waiter was handed the lock"
    r.execute_command(*release("g"))
    queued(r, 0)
    got = t.execute_command(*ticket)
    assert got == granted or (isinstance(got, list) and got[0] is None and granted == "fenced"), \
        "the ticket's grant, collected"
    # Held: the ticket's owner keeps the lock.
    assert_nothing_held_and_unload(r, t)


def test_rlock_waiters_leave_and_the_module_unloads(server):
    r = server.client()
    lock_scenario(server, r,
                  lambda o, *w: ["RLOCK.ACQUIRE", "k", o, LONG, *w],
                  lambda o: ["RLOCK.RELEASE", "k", o])
    assert r.hgetall("k") == {b"t": b"1"}, "the lock outlives the module"


def test_rfenced_waiters_leave_and_the_module_unloads(server):
    r = server.client()
    lock_scenario(server, r,
                  lambda o, *w: ["RFENCED.ACQUIRE", "f", o, LONG, *w],
                  lambda o: ["RLOCK.RELEASE", "f", o], granted="fenced")


def test_rrwlock_waiters_leave_and_the_module_unloads(server):
    """A reader holds it; writers wait."""
    r = server.client()

    def mode(owner):
        return "READ" if owner == "holder" else "WRITE"

    lock_scenario(server, r,
                  lambda o, *w: ["RRWLOCK.ACQUIRE", "rw", mode(o), o, LONG, *w],
                  lambda o: ["RRWLOCK.RELEASE", "rw", mode(o), o])


def test_rsemaphore_waiters_leave_and_the_module_unloads(server):
    r = server.client()
    assert r.execute_command("RSEMAPHORE.TRYSETPERMITS", "s", 1) == 1
    assert r.execute_command("RSEMAPHORE.ACQUIRE", "s", 1) == 1
    wait = lambda t: ["RSEMAPHORE.ACQUIRE", "s", 1, "WAIT", t]  # noqa: E731
    leave_every_way(server, r, wait)
    g = Waiter(server, *wait(LONG))
    queued(r, 1)
    t = server.client()
    ticket = [*wait(LONG), "ASYNC", "ID", "t-granted"]
    assert t.execute_command(*ticket) == b"QUEUED"
    queued(r, 2)
    r.execute_command("RSEMAPHORE.RELEASE", "s", 1)
    assert g.join() == 1
    r.execute_command("RSEMAPHORE.RELEASE", "s", 1)
    queued(r, 0)
    assert t.execute_command(*ticket) == 1, "the ticket's grant, collected"
    assert_nothing_held_and_unload(r, t)
    assert r.get("s") == b"0", "the ticket's permit is still taken"


def test_rpsemaphore_waiters_leave_and_leased_permits_hold_no_timer(server):
    r = server.client()
    assert r.execute_command("RPSEMAPHORE.TRYSETPERMITS", "p", 2) == 1
    held = r.execute_command("RPSEMAPHORE.ACQUIRE", "p", LONG)
    blocker = r.execute_command("RPSEMAPHORE.ACQUIRE", "p", LONG)
    assert held and blocker
    wait = lambda t: ["RPSEMAPHORE.ACQUIRE", "p", LONG, "WAIT", t]  # noqa: E731
    leave_every_way(server, r, wait)
    # A short lease that ends while a client waits: the lease timer hands it over. Taken
    # only now, so that it cannot end while the waits above run (on a loaded machine they
    # outlasted a 300 ms lease), and long enough for the waiter to queue first.
    assert r.execute_command("RPSEMAPHORE.RELEASE", "p", blocker) == 1
    assert r.execute_command("RPSEMAPHORE.ACQUIRE", "p", 1000)
    g = Waiter(server, *wait(LONG))
    queued(r, 1)
    assert stat(r, "key_timers") == 1, "with a waiter, the lease timer is armed"
    got = g.join()
    assert isinstance(got, bytes), "granted the permit whose lease ended"
    t = server.client()
    ticket = [*wait(LONG), "ASYNC", "ID", "t-granted"]
    assert t.execute_command(*ticket) == b"QUEUED"
    queued(r, 1)
    r.execute_command("RPSEMAPHORE.RELEASE", "p", got)
    queued(r, 0)
    assert isinstance(t.execute_command(*ticket), bytes), "the ticket's grant, collected"
    # Two leased permits held, 60 s each, nobody waiting: no timer (issue 24's UNLOAD
    # refusal, "the module holds timer that is not fired").
    assert r.zcard("{p}:timeout") == 2
    assert_nothing_held_and_unload(r, t)


def test_rlatch_waiters_leave_and_the_module_unloads(server):
    r = server.client()
    assert r.execute_command("RLATCH.TRYSETCOUNT", "l", 1) == 1
    wait = lambda t: ["RLATCH.AWAIT", "l", "WAIT", t]  # noqa: E731
    leave_every_way(server, r, wait)
    g = Waiter(server, *wait(LONG))
    t = server.client()
    ticket = [*wait(LONG), "ASYNC", "ID", "t-granted"]
    assert t.execute_command(*ticket) == b"QUEUED"
    queued(r, 2)
    assert r.execute_command("RLATCH.COUNTDOWN", "l") == 0
    assert g.join() == 1
    queued(r, 0)
    assert t.execute_command(*ticket) == 1
    # A second latch, still closed, held while nobody waits.
    assert r.execute_command("RLATCH.TRYSETCOUNT", "l2", 3) == 1
    assert_nothing_held_and_unload(r, t)


def test_nothing_is_subscribed_before_the_first_wait(server):
    """Loaded, locks taken and released, permits leased: no event subscription, no timer,
    on every server (Redis 7.0 too, until its first wait)."""
    r = server.client()
    r.execute_command("RLOCK.ACQUIRE", "k", "a", LONG)
    r.execute_command("RLOCK.ACQUIRE", "k", "b", LONG)  # contended, no WAIT
    r.execute_command("RPSEMAPHORE.TRYSETPERMITS", "p", 1)
    r.execute_command("RPSEMAPHORE.ACQUIRE", "p", LONG)
    assert stat(r, "event_subscriptions") == 0
    assert stat(r, "watching") == 0
    assert stat(r, "key_timers") == 0
    assert stat(r, "tracked_locks") == 0
    assert r.execute_command("MODULE", "UNLOAD", "rlock") == b"OK"


def test_watching_starts_with_the_first_waiter_and_ends_after_the_last(server):
    r = server.client()
    r.execute_command("RLOCK.ACQUIRE", "k", "a", LONG)
    w = Waiter(server, "RLOCK.ACQUIRE", "k", "b", LONG, "WAIT", LONG)
    queued(r, 1)
    assert stat(r, "watching") == 1
    # Key removals (key event or keyspace), FLUSH, role change, SWAPDB, client changes.
    assert stat(r, "event_subscriptions") == 5
    r.delete("k")  # noticed: handed to the waiter
    assert w.join() is None
    wait_until(lambda: stat(r, "watching") == 0, what="watching stopped")
    assert stat(r, "event_subscriptions") == sticky_subscriptions()
    assert stat(r, "tracked_locks") == 0, "tracking stops with watching"


def ticket_granted(server):
    """`k` held by `a`, a ticket queued for `t` on its own connection (request id `x`),
    then `a` releases: the grant is written and not collected. Returns both clients."""
    r = server.client()
    r.execute_command("RLOCK.ACQUIRE", "k", "a", LONG)
    t = server.client()
    assert t.execute_command("RLOCK.ACQUIRE", "k", "t", LONG, "WAIT", LONG,
                             "ASYNC", "ID", "x") == b"QUEUED"
    queued(r, 1)
    r.execute_command("RLOCK.RELEASE", "k", "a")
    return r, t


def test_an_uncollected_ticket_grant_keeps_only_the_client_event_and_no_timer(server):
    """A ticket's grant not yet collected is taken back if its connection closes
    (docs/commands/tickets.md): the client-change event stays while one may be, and no timer; the
    first closing connection that finds none left drops it."""
    r, t = ticket_granted(server)
    wait_until(lambda: stat(r, "watching") == 0, what="watching stopped")
    assert stat(r, "event_subscriptions") == sticky_subscriptions() + 1
    assert stat(r, "key_timers") == 0
    assert r.execute_command("MODULE", "UNLOAD", "rlock") == b"OK"


def test_a_closing_connection_drops_the_client_event_once_grants_are_taken_back(server):
    r, t = ticket_granted(server)
    wait_until(lambda: r.hgetall("k") == {b"t": b"1"}, what="the ticket granted")
    t.close()  # never collected: taken back
    wait_until(lambda: not r.exists("k"), what="the grant taken back")
    wait_until(lambda: stat(r, "event_subscriptions") == sticky_subscriptions(),
               what="the client event dropped")
    assert r.execute_command("MODULE", "UNLOAD", "rlock") == b"OK"


def test_the_module_unloaded_after_waits_loads_again_and_watches_again(server):
    """A library unloaded and loaded again may keep its statics: the module starts with no
    subscription whatever it had, and subscribes and drops them again."""
    from conftest import MODULE

    r = server.client()
    for _ in range(2):
        r.execute_command("RLOCK.ACQUIRE", "k", "a", LONG)
        w = Waiter(server, "RLOCK.ACQUIRE", "k", "b", LONG, "WAIT", LONG)
        queued(r, 1)
        assert stat(r, "event_subscriptions") == 5
        r.execute_command("RLOCK.RELEASE", "k", "a")
        assert w.join() is None
        r.execute_command("RLOCK.RELEASE", "k", "b")
        assert_nothing_held_and_unload(r)
        r.execute_command("MODULE", "LOAD", MODULE)
        # The server dropped every subscription of the module it unloaded.
        assert stat(r, "event_subscriptions") == 0 and stat(r, "watching") == 0


def test_unload_succeeds_as_soon_as_the_last_timed_out_waiter_has_its_reply(server):
    """Issue 37: ten blocked waiters time out together on a held lock; `MODULE UNLOAD`
    sent right after the last reply (no wait-until in between) succeeds, every time. It was
    refused in about 3 of 8 tries ("the module holds timer that is not fired"): the last
    timed-out head left the sweep and the idle check on zero-delay timers, which fire only
    after the next command. Eight rounds, each on a fresh load of the module."""
    r = server.client()
    modules = [dict(zip(m[::2], m[1::2])) for m in r.execute_command("MODULE", "LIST")]
    path = next(m[b"path"] for m in modules if m[b"name"] == b"rlock")
    for round_ in range(8):
        key = f"u{round_}"
        r.execute_command("RLOCK.ACQUIRE", key, "holder", LONG)
        waiters = [Waiter(server, "RLOCK.ACQUIRE", key, f"w{i}", LONG, "WAIT", 200)
                   for i in range(10)]
        for w in waiters:
            assert isinstance(w.join(), int), "a timed-out waiter gets the holder's PTTL"
        assert r.execute_command("MODULE", "UNLOAD", "rlock") == b"OK", f"round {round_}"
        assert r.execute_command("MODULE", "LOAD", path) == b"OK"
