"""Queued tickets (design.md 5, docs/commands/tickets.md): `WAIT timeout-ms ASYNC ID id` queues a ticket
in the key's FIFO queue instead of blocking the connection; its end is published on the
key's ticket channel; the grant is collected (and thereby confirmed) by sending the same
command again with the same ID; a ticket lives as long as the connection that queued it.

Every test reads the notification from a real subscriber connection and checks the keys
themselves, not only the replies.
"""

import re
import time

import pytest
import redis

import errors
from conftest import wait_until
from hostile_helpers import Map, Raw, ReplyError, settle_memory, used_memory

LEASE = 30_000
ERR_ASYNC = errors.text(errors.ASYNC)


def channel(key):
    return f"rlock_ticket:{{{key}}}" if "{" not in key else f"rlock_ticket:{key}"


def parse(message):
    """`<kind>:<id-len>:<owner-len>:<id><owner><detail>` -> (kind, id, owner, detail)."""
    kind, id_len, owner_len, rest = message.split(b":", 3)
    id_len, owner_len = int(id_len), int(owner_len)
    return (kind.decode(), rest[:id_len].decode(), rest[id_len:id_len + owner_len].decode(),
            rest[id_len + owner_len:].decode())


class Listener:
    """A subscriber on some keys' ticket channels (a connection of its own); with `tag`,
    on their `NOTIFY tag` channels instead."""

    def __init__(self, server, *keys, tag=None):
        self.pubsub = server.client().pubsub()
        self.pubsub.subscribe(*(channel(k) + (f":{tag}" if tag else "") for k in keys))
        for _ in keys:  # the subscribe confirmations
            assert self.pubsub.get_message(timeout=5)["type"] == "subscribe"

    def next(self, timeout=5.0):
        """The next ticket message, parsed; fails if none comes within `timeout`."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            m = self.pubsub.get_message(timeout=left)
            if m is not None and m["type"] == "message":
                return (m["channel"].decode(),) + parse(m["data"])
        raise AssertionError("no ticket message")

    def none(self, seconds=0.2):
        """Asserts no message comes within `seconds` (only where nothing may come)."""
        m = self.pubsub.get_message(timeout=seconds)
        assert m is None, m


def acquire(r, key, owner, *extra, lease=LEASE):
    return r.execute_command("RLOCK.ACQUIRE", key, owner, lease, *extra)


def ticket(r, key, owner, rid, timeout=0, lease=LEASE, tag=None):
    notify = ("NOTIFY", tag) if tag else ()
    return acquire(r, key, owner, "WAIT", timeout, "ASYNC", "ID", rid, *notify, lease=lease)


def owners(r, key):
    raw = r.execute_command("RLOCK.INFO", key)
    if raw is None:
        return {}
    info = dict(zip(raw[::2], raw[1::2]))
    o = info[b"owners"]
    return {k.decode(): v for k, v in zip(o[::2], o[1::2])}


def waiters(r, key):
    raw = r.execute_command("RLOCK.INFO", key)
    return 0 if raw is None else dict(zip(raw[::2], raw[1::2]))[b"waiters"]


def stats(r):
    return {k.removeprefix("rlock_"): v for k, v in r.info("rlock").items()}


# ---- the protocol ----

def test_a_ticket_is_queued_granted_on_release_published_and_collected(server, r):
    listen = Listener(server, "k")
    assert acquire(r, "k", "holder") is None
    t = server.client()
    assert ticket(t, "k", "waiter", "r1") == b"QUEUED"
    assert waiters(r, "k") == 1 and stats(r)["tickets"] == 1
    listen.none()
    assert r.execute_command("RLOCK.RELEASE", "k", "holder") == 1
    assert listen.next() == ("rlock_ticket:{k}", "granted", "r1", "waiter", "")
    # Granted in the server at once, in the same turn as the release.
    assert owners(r, "k") == {"waiter": 1}
    assert 0 < r.pttl("k") <= LEASE
    # Collecting replays the grant's reply; it does not enter the lock a second time.
    assert ticket(t, "k", "waiter", "r1") is None
    assert owners(r, "k") == {"waiter": 1}
    s = stats(r)
    assert (s["tickets"], s["tickets_queued"], s["tickets_granted"]) == (0, 1, 1)
    # Nothing else was published per ticket.
    listen.none()


def test_served_at_once_answers_as_without_async_and_publishes_nothing(server, r):
    listen = Listener(server, "k")
    assert ticket(r, "k", "me", "r1") is None
    assert owners(r, "k") == {"me": 1}
    assert ticket(r, "k", "me", "r1") is None, "a retry replays"
    assert owners(r, "k") == {"me": 1}
    listen.none()


@pytest.mark.parametrize("extra", [
    ("ASYNC",), ("WAIT", 100, "ASYNC"), ("ASYNC", "ID", "r"), ("ID", "r", "ASYNC"),
])
def test_async_without_wait_or_id_is_an_error_and_changes_nothing(r, extra):
    assert acquire(r, "k", "holder") is None
    with pytest.raises(redis.ResponseError, match=f"^{ERR_ASYNC}$"):
        acquire(r, "k", "other", *extra)
    assert owners(r, "k") == {"holder": 1} and waiters(r, "k") == 0


def test_async_twice_is_a_syntax_error(r):
    with pytest.raises(redis.ResponseError, match=f"^{errors.text(errors.SYNTAX)}$"):
        acquire(r, "k", "o", "WAIT", 1, "ASYNC", "ASYNC", "ID", "r")
    assert r.exists("k") == 0


def test_inside_multi_and_scripts_async_answers_at_once(r):
    assert acquire(r, "k", "holder") is None
    p = r.pipeline(transaction=True)
    p.execute_command("RLOCK.ACQUIRE", "k", "o", LEASE, "WAIT", 0, "ASYNC", "ID", "m")
    (pttl,) = p.execute()
    assert 0 < pttl <= LEASE
    got = r.eval("return redis.call('RLOCK.ACQUIRE', KEYS[1], 'o', 1000, 'WAIT', 0, 'ASYNC', 'ID', 's')",
                 1, "k")
    assert 0 < got <= LEASE
    assert waiters(r, "k") == 0


def test_tickets_and_blocked_waiters_are_served_in_arrival_order(server, r):
    listen = Listener(server, "k")
    assert acquire(r, "k", "h") is None
    t = server.client()
    blocked = []
    order = []
    for i in range(4):
        if i % 2 == 0:
            conn = server.client(single_connection_client=True).connection
            conn.send_command("RLOCK.ACQUIRE", "k", f"b{i}", LEASE, "WAIT", 0)
            blocked.append((i, conn))
        else:
            assert ticket(t, "k", f"t{i}", f"r{i}") == b"QUEUED"
        wait_until(lambda n=i + 1: waiters(r, "k") == n, what=f"{i + 1} queued")
    holder = "h"
    for i in range(4):
        assert r.execute_command("RLOCK.RELEASE", "k", holder) == 1
        holder = f"b{i}" if i % 2 == 0 else f"t{i}"
        assert owners(r, "k") == {holder: 1}, f"turn {i}"
        if i % 2 == 0:
            conn = dict(blocked)[i]
            assert conn.read_response() is None
        else:
            assert listen.next()[1:4] == ("granted", f"r{i}", holder)
            assert ticket(t, "k", holder, f"r{i}") is None
        order.append(holder)
    assert order == ["b0", "t1", "b2", "t3"]


def two_tickets_behind_a_holder(server, r):
    """`k` held by `h`; tickets r1 (owner w1, connection t1) then r2 (w2, t2) queued;
    a listener on `k`'s ticket channel."""
    listen = Listener(server, "k")
    assert acquire(r, "k", "h") is None
    t1, t2 = server.client(), server.client()
    assert ticket(t1, "k", "w1", "r1") == b"QUEUED"
    assert ticket(t2, "k", "w2", "r2") == b"QUEUED"
    return listen, t1, t2


# ---- deadlines, connections, take-back ----

def test_a_ticket_times_out_at_its_deadline_with_a_message(server, r):
    listen = Listener(server, "k")
    assert acquire(r, "k", "h") is None
    t = server.client()
    started = time.monotonic()
    assert ticket(t, "k", "w", "r1", timeout=150) == b"QUEUED"
    assert listen.next()[1:4] == ("timeout", "r1", "w")
    assert time.monotonic() - started >= 0.14
    assert waiters(r, "k") == 0 and owners(r, "k") == {"h": 1}
    s = stats(r)
    assert (s["tickets"], s["tickets_timed_out"]) == (0, 1)
    # Released later: nobody is granted (the ticket is gone), Redisson's message goes out.
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert r.exists("k") == 0


def test_deadlines_out_of_arrival_order_each_end_on_time(server, r):
    listen = Listener(server, "k")
    assert acquire(r, "k", "h") is None
    # One batch: the four arrive together, so each deadline counts from the same moment
    # however slow this process's own round trips are on a loaded machine.
    p = server.client().pipeline(transaction=False)
    for rid, timeout in (("a", 400), ("b", 100), ("c", 0), ("d", 250)):
        ticket(p, "k", rid, rid, timeout=timeout)
    assert p.execute() == [b"QUEUED"] * 4
    ends = [listen.next(timeout=2)[1:3] for _ in range(3)]
    assert ends == [("timeout", "b"), ("timeout", "d"), ("timeout", "a")]
    assert waiters(r, "k") == 1
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert listen.next()[1:3] == ("granted", "c")


def test_a_closed_connection_drops_its_tickets_and_the_next_waiter_is_served(server, r):
    listen, t1, t2 = two_tickets_behind_a_holder(server, r)
    assert ticket(t1, "k", "w3", "r3") == b"QUEUED"
    r.client_kill_filter(_id=t1.client_id())
    wait_until(lambda: waiters(r, "k") == 1, what="t1's tickets dropped")
    assert stats(r)["tickets_dropped"] == 2
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert listen.next()[1:3] == ("granted", "r2")
    assert owners(r, "k") == {"w2": 1}


def test_an_unconfirmed_grant_is_taken_back_when_its_connection_closes(server, r):
    """The grant outlives its connection by `rlock.ticket-confirm-ms` (a client that
    proceeded on the message confirms again on a new connection); unconfirmed by then it
    is taken back, passed on, and its request id answers TAKENBACK (design.md 5)."""
    r.config_set("rlock.ticket-confirm-ms", 300)
    listen, t1, t2 = two_tickets_behind_a_holder(server, r)
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert listen.next()[1:3] == ("granted", "r1")
    assert owners(r, "k") == {"w1": 1}
    r.client_kill_filter(_id=t1.client_id())  # gone before confirming
    assert listen.next()[1:3] == ("granted", "r2")
    assert owners(r, "k") == {"w2": 1}
    assert stats(r)["revoked_handoffs"] == 1
    # A late confirmation (or retry) of the first request learns that it lost the hold,
    # and changes nothing: no second grant, no ticket.
    with pytest.raises(redis.ResponseError, match="^" + re.escape(errors.TAKEN_BACK) + "$"):
        ticket(r, "k", "w1", "r1")
    with pytest.raises(redis.ResponseError, match="TAKENBACK"):
        acquire(r, "k", "w1", "ID", "r1")
    assert owners(r, "k") == {"w2": 1}
    assert waiters(r, "k") == 0


def test_a_grant_confirmed_within_the_grace_after_its_connection_closed_stays(server, r):
    """A client whose ticket connection broke after the `granted` message confirms on a
    new connection: the grant is its own, never taken back."""
    r.config_set("rlock.ticket-confirm-ms", 60_000)
    listen, t1, t2 = two_tickets_behind_a_holder(server, r)
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert listen.next()[1:3] == ("granted", "r1")
    r.client_kill_filter(_id=t1.client_id())
    assert ticket(server.client(), "k", "w1", "r1") is None  # confirmed on a new connection
    assert ticket(server.client(), "k", "w1", "r1") is None  # and again: idempotent
    assert owners(r, "k") == {"w1": 1}
    assert r.execute_command("RLOCK.RELEASE", "k", "w1") == 1
    assert listen.next()[1:3] == ("granted", "r2")
    assert stats(r)["revoked_handoffs"] == 0


def test_a_collected_grant_stays_when_its_connection_closes(server, r):
    r.config_set("rlock.ticket-confirm-ms", 0)  # a take-back would come at once
    listen, t1, t2 = two_tickets_behind_a_holder(server, r)
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert listen.next()[1:3] == ("granted", "r1")
    # Collected on another connection (the client's subscriber or a pool's).
    assert ticket(r, "k", "w1", "r1") is None
    r.client_kill_filter(_id=t1.client_id())
    # A take-back would come from a zero-delay timer right after the kill: give it a few
    # turns (this asserts that nothing happens, which no wait-until can observe).
    time.sleep(0.05)
    assert owners(r, "k") == {"w1": 1}
    assert stats(r)["revoked_handoffs"] == 0
    listen.none()


def test_a_grant_racing_its_connections_close_is_taken_back_and_passed_on(server, r):
    r.config_set("rlock.ticket-confirm-ms", 0)
    listen, t1, t2 = two_tickets_behind_a_holder(server, r)
    # The release grants w1 and w1's connection is killed in the same transaction.
    p = r.pipeline(transaction=True)
    p.execute_command("RLOCK.RELEASE", "k", "h")
    p.execute_command("CLIENT", "KILL", "ID", t1.client_id())
    assert p.execute() == [1, 1]
    got = [listen.next()[1:3], listen.next()[1:3]]
    assert got == [("granted", "r1"), ("granted", "r2")]
    assert owners(r, "k") == {"w2": 1}


def test_ticket_confirm_ms_is_a_bounded_config(server, r):
    assert r.config_get("rlock.ticket-confirm-ms") == {"rlock.ticket-confirm-ms": "1000"}
    for bad in (-1, 60_001):
        with pytest.raises(redis.ResponseError):
            r.config_set("rlock.ticket-confirm-ms", bad)
    assert r.config_get("rlock.ticket-confirm-ms") == {"rlock.ticket-confirm-ms": "1000"}


def test_a_retried_ticket_is_never_granted_twice(server, r):
    listen = Listener(server, "k")
    assert acquire(r, "k", "h") is None
    t = server.client()
    assert ticket(t, "k", "w", "r1") == b"QUEUED"
    assert ticket(t, "k", "w", "r1") == b"QUEUED"  # a retry while the first still queues
    assert ticket(t, "k", "x", "r2") == b"QUEUED"
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert listen.next()[1:3] == ("granted", "r1")
    assert ticket(t, "k", "w", "r1") is None
    assert r.execute_command("RLOCK.RELEASE", "k", "w") == 1
    # The duplicate reaches the head, is dropped silently, and r2 is granted.
    assert listen.next()[1:3] == ("granted", "r2")
    assert owners(r, "k") == {"x": 1}
    assert waiters(r, "k") == 0


def test_a_freed_lock_goes_to_the_first_ticket(server, r):
    listen = Listener(server, "k")
    assert acquire(r, "k", "h", lease=100) is None
    t = server.client()
    assert ticket(t, "k", "w", "r1") == b"QUEUED"
    assert listen.next()[1:3] == ("granted", "r1")  # the holder's lease ran out
    assert owners(r, "k") == {"w": 1}
    assert ticket(t, "k", "x", "r2") == b"QUEUED"
    r.delete("k")
    assert listen.next()[1:3] == ("granted", "r2")
    assert owners(r, "k") == {"x": 1}


def test_tickets_get_an_error_when_the_server_becomes_a_replica(make_server):
    master = make_server("m")
    s = make_server("s")
    r = s.client()
    listen = Listener(s, "k")
    assert acquire(r, "k", "h") is None
    assert ticket(s.client(), "k", "w", "r1") == b"QUEUED"
    r.replicaof("127.0.0.1", master.port)
    kind, rid, owner, detail = listen.next()[1:]
    assert (kind, rid, owner, detail) == ("error", "r1", "w", errors.ROLE_CHANGED)
    assert stats(r)["tickets"] == 0


# ---- every primitive that waits ----

def test_fenced_ticket_is_granted_with_its_token_in_the_message(server, r):
    """The `granted` message carries the token (design.md 5: the holder proceeds on it);
    the confirmation replays the same token."""
    listen = Listener(server, "f")
    assert r.execute_command("RFENCED.ACQUIRE", "f", "h", LEASE)[0] is None
    t = server.client()
    cmd = ("RFENCED.ACQUIRE", "f", "w", LEASE, "WAIT", 0, "ASYNC", "ID", "r1")
    assert t.execute_command(*cmd) == b"QUEUED"
    assert r.execute_command("RLOCK.RELEASE", "f", "h") == 1
    _, kind, rid, owner, detail = listen.next()
    assert (kind, rid, owner) == ("granted", "r1", "w")
    token = r.execute_command("RFENCED.GETTOKEN", "f")
    assert detail == str(token)
    nil, confirmed = t.execute_command(*cmd)
    assert nil is None and confirmed == token


def test_an_unconfirmed_fenced_grant_is_taken_back_and_its_token_stays_spent(server, r):
    """A fenced ticket's holder may proceed on the message's token: unconfirmed when its
    connection closed, the grant is taken back, passed on with a larger token, and its
    request id answers TAKENBACK (the late confirmation's lost signal)."""
    r.config_set("rlock.ticket-confirm-ms", 200)
    listen = Listener(server, "f")
    assert r.execute_command("RFENCED.ACQUIRE", "f", "h", LEASE)[0] is None
    t1, t2 = server.client(), server.client()
    c1 = ("RFENCED.ACQUIRE", "f", "w1", LEASE, "WAIT", 0, "ASYNC", "ID", "r1")
    c2 = ("RFENCED.ACQUIRE", "f", "w2", LEASE, "WAIT", 0, "ASYNC", "ID", "r2")
    assert t1.execute_command(*c1) == b"QUEUED"
    assert t2.execute_command(*c2) == b"QUEUED"
    assert r.execute_command("RLOCK.RELEASE", "f", "h") == 1
    first = listen.next()
    assert first[1:3] == ("granted", "r1")
    r.client_kill_filter(_id=t1.client_id())  # gone before confirming
    second = listen.next()
    assert second[1:3] == ("granted", "r2")
    assert int(second[4]) > int(first[4])
    assert owners(r, "f") == {"w2": 1}
    assert stats(r)["revoked_handoffs"] == 1
    with pytest.raises(redis.ResponseError, match="^" + re.escape(errors.TAKEN_BACK) + "$"):
        r.execute_command(*c1[:4], "ID", "r1")
    nil, token = t2.execute_command(*c2)
    assert nil is None and token == int(second[4])


def test_rwlock_write_ticket_behind_readers(server, r):
    listen = Listener(server, "rw")
    assert r.execute_command("RRWLOCK.ACQUIRE", "rw", "READ", "r", LEASE) is None
    t = server.client()
    cmd = ("RRWLOCK.ACQUIRE", "rw", "WRITE", "w", LEASE, "WAIT", 0, "ASYNC", "ID", "x")
    assert t.execute_command(*cmd) == b"QUEUED"
    assert r.execute_command("RRWLOCK.RELEASE", "rw", "READ", "r") == 1
    assert listen.next()[1:4] == ("granted", "x", "w")
    assert r.hget("rw", "mode") == b"write"
    assert t.execute_command(*cmd) is None


def test_semaphore_tickets_are_granted_as_permits_come_back(server, r):
    listen = Listener(server, "s")
    assert r.execute_command("RSEMAPHORE.TRYSETPERMITS", "s", 1) == 1
    assert r.execute_command("RSEMAPHORE.ACQUIRE", "s", 1) == 1
    t = server.client()
    cmd = ("RSEMAPHORE.ACQUIRE", "s", 1, "WAIT", 0, "ASYNC", "ID", "p1")
    assert t.execute_command(*cmd) == b"QUEUED"
    r.execute_command("RSEMAPHORE.RELEASE", "s", 1)
    assert listen.next()[1:3] == ("granted", "p1")
    assert r.get("s") == b"0"
    assert t.execute_command(*cmd) == 1


def test_expirable_semaphore_ticket_is_granted_with_its_permit_id_in_the_message(server, r):
    listen = Listener(server, "e")
    assert r.execute_command("RPSEMAPHORE.TRYSETPERMITS", "e", 1) == 1
    first = r.execute_command("RPSEMAPHORE.ACQUIRE", "e", 200)
    assert first is not None
    t = server.client()
    cmd = ("RPSEMAPHORE.ACQUIRE", "e", 10_000, "WAIT", 0, "ASYNC", "ID", "p1")
    assert t.execute_command(*cmd) == b"QUEUED"
    _, kind, rid, _, detail = listen.next()  # the first permit's lease ran out
    assert (kind, rid) == ("granted", "p1")
    permit = t.execute_command(*cmd)
    assert permit not in (None, first, b"QUEUED")
    assert detail == permit.decode()
    assert r.zscore("{e}:timeout", bytes.fromhex(permit.decode())) is not None


def test_expirable_ticket_of_several_permits_names_every_id(server, r):
    listen = Listener(server, "e")
    assert r.execute_command("RPSEMAPHORE.TRYSETPERMITS", "e", 2) == 1
    held = r.execute_command("RPSEMAPHORE.ACQUIRE", "e", LEASE)
    t = server.client()
    cmd = ("RPSEMAPHORE.ACQUIRE", "e", LEASE, "PERMITS", 2, "WAIT", 0, "ASYNC", "ID", "p2")
    assert t.execute_command(*cmd) == b"QUEUED"
    assert r.execute_command("RPSEMAPHORE.RELEASE", "e", held) == 1
    _, kind, _, _, detail = listen.next()
    assert kind == "granted"
    assert detail.split(",") == [p.decode() for p in t.execute_command(*cmd)]


def test_an_unconfirmed_expirable_grant_is_taken_back_and_passed_on(server, r):
    """The permit id in the message is held at once; a holder gone before confirming
    loses it: released, granted to the next ticket, and TAKENBACK to a late confirm."""
    r.config_set("rlock.ticket-confirm-ms", 200)
    listen = Listener(server, "e")
    assert r.execute_command("RPSEMAPHORE.TRYSETPERMITS", "e", 1) == 1
    held = r.execute_command("RPSEMAPHORE.ACQUIRE", "e", LEASE)
    t1, t2 = server.client(), server.client()
    c1 = ("RPSEMAPHORE.ACQUIRE", "e", LEASE, "WAIT", 0, "ASYNC", "ID", "p1")
    c2 = ("RPSEMAPHORE.ACQUIRE", "e", LEASE, "WAIT", 0, "ASYNC", "ID", "p2")
    assert t1.execute_command(*c1) == b"QUEUED"
    assert t2.execute_command(*c2) == b"QUEUED"
    assert r.execute_command("RPSEMAPHORE.RELEASE", "e", held) == 1
    _, kind, rid, _, lost = listen.next()
    assert (kind, rid) == ("granted", "p1")
    r.client_kill_filter(_id=t1.client_id())  # gone before confirming
    _, kind, rid, _, second = listen.next()
    assert (kind, rid) == ("granted", "p2")
    assert r.zscore("{e}:timeout", bytes.fromhex(lost)) is None
    assert r.zscore("{e}:timeout", bytes.fromhex(second)) is not None
    assert stats(r)["revoked_handoffs"] == 1
    with pytest.raises(redis.ResponseError, match="^" + re.escape(errors.TAKEN_BACK) + "$"):
        r.execute_command(*c1[:3], "ID", "p1")
    assert r.execute_command("RPSEMAPHORE.RELEASE", "e", lost) == 0
    assert t2.execute_command(*c2).decode() == second


def test_latch_ticket_is_told_when_the_count_reaches_zero(server, r):
    listen = Listener(server, "l")
    assert r.execute_command("RLATCH.TRYSETCOUNT", "l", 1) == 1
    t = server.client()
    cmd = ("RLATCH.AWAIT", "l", "WAIT", 0, "ASYNC", "ID", "a1")
    assert t.execute_command(*cmd) == b"QUEUED"
    with pytest.raises(redis.ResponseError, match=f"^{errors.text(errors.SYNTAX)}$"):
        t.execute_command("RLATCH.AWAIT", "l", "WAIT", 0, "ID", "a1")
    r.execute_command("RLATCH.COUNTDOWN", "l")
    assert listen.next()[1:4] == ("granted", "a1", "")
    assert t.execute_command(*cmd) == 1


# ---- scale and memory ----

def queue_tickets(client, key, n, prefix, timeout=0, batch=2000):
    """`n` tickets on `key`, pipelined; owners of 40 bytes (Redisson's `uuid:thread`
    shape) and request ids of 24 bytes, like the client crate's."""
    for start in range(0, n, batch):
        p = client.pipeline(transaction=False)
        for i in range(start, min(n, start + batch)):
            owner = f"{prefix:>2}3e4567-e89b-12d3-a456-4266141{i:05d}:{i % 1000:03d}"
            rid = f"{prefix:>2}-req-000000000{i:08d}"
            p.execute_command("RLOCK.ACQUIRE", key, owner, LEASE,
                              "WAIT", timeout, "ASYNC", "ID", rid)
        assert set(p.execute()) == {b"QUEUED"}


def test_ten_thousand_tickets_on_one_connection_killed_at_once_leave_nothing(server, r):
    r.config_set("rlock.max-waiters-per-key", 100_000)
    settle_memory(r)
    base = used_memory(r)
    assert acquire(r, "k", "h") is None
    t = server.client()
    queue_tickets(t, "k", 10_000, "t")
    assert stats(r)["tickets"] == 10_000
    r.client_kill_filter(_id=t.client_id())
    wait_until(lambda: stats(r)["tickets"] == 0, what="tickets dropped")
    assert waiters(r, "k") == 0
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert r.exists("k") == 0, "no lock left behind"
    s = stats(r)
    assert (s["waiters"], s["keys_with_waiters"], s["tickets_dropped"]) == (0, 0, 10_000)
    settle_memory(r)
    assert used_memory(r) - base < 64 * 1024


# Each primitive's holder, and its ticket command for (owner, request id).
TICKETED = {
    "lock": (("RLOCK.ACQUIRE", "k", "h", LEASE),
             lambda o, i: ("RLOCK.ACQUIRE", "k", o, LEASE, "WAIT", 600_000, "ASYNC", "ID", i)),
    "fenced": (("RFENCED.ACQUIRE", "f", "h", LEASE),
               lambda o, i: ("RFENCED.ACQUIRE", "f", o, LEASE, "WAIT", 600_000, "ASYNC", "ID", i)),
    "rwlock": (("RRWLOCK.ACQUIRE", "rw", "WRITE", "h", LEASE),
               lambda o, i: ("RRWLOCK.ACQUIRE", "rw", "WRITE", o, LEASE, "WAIT", 600_000, "ASYNC",
                             "ID", i)),
    "semaphore": (("RSEMAPHORE.TRYSETPERMITS", "s", 0),
                  lambda o, i: ("RSEMAPHORE.ACQUIRE", "s", 1, "WAIT", 600_000, "ASYNC", "ID", i)),
    "expirable": (("RPSEMAPHORE.TRYSETPERMITS", "e", 0),
                  lambda o, i: ("RPSEMAPHORE.ACQUIRE", "e", LEASE, "WAIT", 600_000, "ASYNC", "ID",
                                i)),
    "latch": (("RLATCH.TRYSETCOUNT", "l", 1),
              lambda o, i: ("RLATCH.AWAIT", "l", "WAIT", 600_000, "ASYNC", "ID", i)),
}


@pytest.mark.parametrize("tagged", [False, True], ids=["key-channel", "notify-tag"])
@pytest.mark.parametrize("primitive", list(TICKETED))
def test_memory_per_queued_ticket_is_at_most_256_bytes(server, r, primitive, tagged):
    """Owner 40 bytes (a Redisson-like `uuid:thread`), request id 24: what the client
    crate sends. Measured with 20 000 tickets from 10 connections, deadlines included;
    with `NOTIFY` and a 16-byte tag per connection (a client's), or without."""
    holder, bare = TICKETED[primitive]
    command = bare
    if tagged:
        def command(o, i):
            return bare(o, i) + ("NOTIFY", f"{i[:2]}c7f3a9e1d2b4c6")
    r.config_set("rlock.max-waiters-per-key", 100_000)
    conns = [server.client() for _ in range(10)]
    for c in conns:
        c.ping()
    settle_memory(r)
    r.execute_command(*holder)
    before = used_memory(r)
    for n, c in enumerate(conns):
        p = c.pipeline(transaction=False)
        for i in range(2_000):
            owner = f"{n:02d}3e4567-e89b-12d3-a456-4266141{i:05d}:{i % 1000:03d}"
            p.execute_command(*command(owner, f"{n:02d}-req-000000000{i:08d}"))
        assert set(p.execute()) == {b"QUEUED"}
    per_ticket = (used_memory(r) - before) / 20_000
    print(f"{primitive} {'tagged' if tagged else 'untagged'}: server memory per queued ticket:"
          f" {per_ticket:.0f} B")
    assert stats(r)["tickets"] == 20_000
    assert per_ticket <= 256


def test_ticket_churn_leaves_no_memory_behind(server, r):
    """Thousands of tickets granted and collected, timed out, and dropped with their
    connections: afterwards nobody waits, nothing is uncollected, and `used_memory` is
    back (the engine gives its indexes' memory back once nobody waits)."""
    listen = Listener(server, "churn")
    settle_memory(r)
    base = used_memory(r)
    worker = server.client()
    for round_ in range(300):
        assert acquire(r, "churn", "h") is None
        # Five tickets: two granted in turn and collected, one times out, two dropped.
        assert ticket(worker, "churn", "a", f"a{round_}") == b"QUEUED"
        assert ticket(worker, "churn", "b", f"b{round_}") == b"QUEUED"
        assert ticket(worker, "churn", "c", f"c{round_}", timeout=1) == b"QUEUED"
        doomed = server.client()
        assert ticket(doomed, "churn", "d", f"d{round_}") == b"QUEUED"
        assert ticket(doomed, "churn", "e", f"e{round_}") == b"QUEUED"
        assert listen.next()[1:3] == ("timeout", f"c{round_}")
        r.client_kill_filter(_id=doomed.client_id())
        doomed.close()
        for who in ("h", "a"):
            assert r.execute_command("RLOCK.RELEASE", "churn", who) == 1
            nxt = "a" if who == "h" else "b"
            assert listen.next()[1:3] == ("granted", f"{nxt}{round_}")
            assert ticket(worker, "churn", nxt, f"{nxt}{round_}") is None
        assert r.execute_command("RLOCK.RELEASE", "churn", "b") == 1
        wait_until(lambda: waiters(r, "churn") == 0, what="d and e dropped")
    s = stats(r)
    assert (s["tickets"], s["waiters"], s["keys_with_waiters"]) == (0, 0, 0)
    assert (s["tickets_granted"], s["tickets_timed_out"], s["tickets_dropped"]) == (600, 300, 600)
    settle_memory(r)
    assert used_memory(r) - base < 64 * 1024


def test_tickets_count_against_the_waiter_limit(server, r):
    r.config_set("rlock.max-waiters-per-key", 2)
    assert acquire(r, "k", "h") is None
    t = server.client()
    assert ticket(t, "k", "a", "r1") == b"QUEUED"
    assert ticket(t, "k", "b", "r2") == b"QUEUED"
    with pytest.raises(redis.ResponseError, match=re.escape(errors.text(errors.TOO_MANY_WAITERS))):
        ticket(t, "k", "c", "r3")
    assert waiters(r, "k") == 2 and stats(r)["tickets"] == 2


# ---- NOTIFY: a ticket's own channel (docs/commands/tickets.md, design.md 5) ----

TAG1, TAG2 = "c7f3a9e1d2b4c6a8", "0123456789abcdef"
ERR_NOTIFY_ASYNC = errors.text(errors.NOTIFY_ASYNC)
ERR_NOTIFY_TAG = errors.text(errors.NOTIFY_TAG)


def test_hello_names_ticket_notify(r):
    raw = r.execute_command("RLOCK.HELLO")
    hello = dict(zip(raw[::2], raw[1::2]))
    assert b"ticket-notify" in hello[b"features"]


def test_a_tagged_tickets_messages_reach_only_its_own_channel(server, r):
    """Two clients (two tags) and a listener on the key's channel: each handoff's message
    arrives on its ticket's tag channel only; the key channel hears nothing, nor does the
    other tag's subscriber (counted, not sampled: PUBSUB NUMSUB shows each is listening)."""
    key_channel = Listener(server, "k")
    one, two = Listener(server, "k", tag=TAG1), Listener(server, "k", tag=TAG2)
    numsub = dict(r.pubsub_numsub(channel("k"), f"{channel('k')}:{TAG1}",
                                  f"{channel('k')}:{TAG2}"))
    assert set(numsub.values()) == {1}
    assert acquire(r, "k", "h") is None
    t1, t2 = server.client(), server.client()
    assert ticket(t1, "k", "w1", "r1", tag=TAG1) == b"QUEUED"
    assert ticket(t2, "k", "w2", "r2", tag=TAG2) == b"QUEUED"
    assert ticket(t1, "k", "w3", "r3", tag=TAG1) == b"QUEUED"
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert one.next() == (f"rlock_ticket:{{k}}:{TAG1}", "granted", "r1", "w1", "")
    assert owners(r, "k") == {"w1": 1}
    assert ticket(t1, "k", "w1", "r1", tag=TAG1) is None, "collected as before"
    two.none()
    assert r.execute_command("RLOCK.RELEASE", "k", "w1") == 1
    assert two.next() == (f"rlock_ticket:{{k}}:{TAG2}", "granted", "r2", "w2", "")
    one.none()
    assert r.execute_command("RLOCK.RELEASE", "k", "w2") == 1
    assert one.next()[1:4] == ("granted", "r3", "w3")
    two.none()
    key_channel.none()
    assert stats(r)["tickets_granted"] == 3


def test_untagged_and_tagged_tickets_share_one_fifo_each_on_its_channel(server, r):
    key_channel, tagged = Listener(server, "k"), Listener(server, "k", tag=TAG1)
    assert acquire(r, "k", "h") is None
    t = server.client()
    assert ticket(t, "k", "plain", "r1") == b"QUEUED"
    assert ticket(t, "k", "own", "r2", tag=TAG1) == b"QUEUED"
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert key_channel.next()[1:4] == ("granted", "r1", "plain")
    tagged.none()
    assert r.execute_command("RLOCK.RELEASE", "k", "plain") == 1
    assert tagged.next()[1:4] == ("granted", "r2", "own")
    key_channel.none()


def test_a_grant_message_follows_the_releasers_reply(server, r):
    """A ticket's `granted` message is published once the command that granted it has
    written its reply (design.md 5): the server writes a turn's output last-first, so a
    message published inside `RLOCK.RELEASE`, before its reply, would reach the new
    holder after the releaser's reply and wake the releasing process first. Seen on one
    RESP3 connection that both releases and listens on the ticket's channel, where the
    order is the order of its output: the reply, then the message, whether others still
    wait or the grant empties the queue. This tells the two apart on Redis 7.0 only:
    Redis 7.2+ and Valkey hold a command's pushes to its own caller until after its
    reply, so there one connection shows the same order either way."""
    c = Raw(server.port)
    c.call("HELLO", "3")
    assert c.call("SUBSCRIBE", f"{channel('k')}:{TAG1}")[0] == b"subscribe"
    assert c.call("RLOCK.ACQUIRE", "k", "h", LEASE) is None
    t = server.client()
    assert ticket(t, "k", "w1", "r1", tag=TAG1) == b"QUEUED"
    assert ticket(t, "k", "w2", "r2", tag=TAG2) == b"QUEUED"
    c.send("RLOCK.RELEASE", "k", "h")
    assert c.read() == 1, "the release's reply first, while another waits"
    message = c.read()
    assert message[0] == b"message" and parse(message[2])[:2] == ("granted", "r1")
    assert owners(r, "k") == {"w1": 1}
    assert r.execute_command("RLOCK.RELEASE", "k", "w1") == 1  # w2 granted; none waits
    assert owners(r, "k") == {"w2": 1}
    assert ticket(t, "k", "w3", "r3", tag=TAG1) == b"QUEUED"
    c.send("RLOCK.RELEASE", "k", "w2")
    assert c.read() == 1, "the release's reply first, as the last waiter is granted"
    message = c.read()
    assert message[0] == b"message" and parse(message[2])[:2] == ("granted", "r3")
    assert waiters(r, "k") == 0 and owners(r, "k") == {"w3": 1}
    c.close()


def test_a_braced_keys_tagged_channel_appends_the_tag(server, r):
    sub = server.client().pubsub()
    sub.subscribe(f"rlock_ticket:{{app}}:lock:{TAG1}")
    assert sub.get_message(timeout=5)["type"] == "subscribe"
    assert acquire(r, "{app}:lock", "h") is None
    assert ticket(server.client(), "{app}:lock", "w", "r1", tag=TAG1) == b"QUEUED"
    assert r.execute_command("RLOCK.RELEASE", "{app}:lock", "h") == 1
    m = sub.get_message(timeout=5)
    assert m["type"] == "message" and parse(m["data"])[:2] == ("granted", "r1")


def test_a_tagged_tickets_timeout_goes_to_its_channel(server, r):
    key_channel, tagged = Listener(server, "k"), Listener(server, "k", tag=TAG1)
    assert acquire(r, "k", "h") is None
    assert ticket(server.client(), "k", "w", "r1", timeout=100, tag=TAG1) == b"QUEUED"
    assert tagged.next()[1:4] == ("timeout", "r1", "w")
    key_channel.none()
    assert waiters(r, "k") == 0 and owners(r, "k") == {"h": 1}


def test_a_tagged_tickets_error_goes_to_its_channel(make_server):
    master, s = make_server("m"), make_server("s")
    r = s.client()
    key_channel, tagged = Listener(s, "k"), Listener(s, "k", tag=TAG1)
    assert acquire(r, "k", "h") is None
    assert ticket(s.client(), "k", "w", "r1", tag=TAG1) == b"QUEUED"
    r.replicaof("127.0.0.1", master.port)
    assert tagged.next()[1:] == ("error", "r1", "w", errors.ROLE_CHANGED)
    key_channel.none()


def test_a_latch_opening_tells_each_ticket_on_its_own_channel(server, r):
    key_channel = Listener(server, "l")
    one, two = Listener(server, "l", tag=TAG1), Listener(server, "l", tag=TAG2)
    assert r.execute_command("RLATCH.TRYSETCOUNT", "l", 1) == 1
    t1, t2 = server.client(), server.client()
    for t, rid, tag in ((t1, "a1", TAG1), (t2, "a2", TAG2), (t1, "a3", TAG1), (t2, "a4", None)):
        notify = ("NOTIFY", tag) if tag else ()
        assert t.execute_command("RLATCH.AWAIT", "l", "WAIT", 0, "ASYNC", "ID", rid,
                                 *notify) == b"QUEUED"
    r.execute_command("RLATCH.COUNTDOWN", "l")
    assert [one.next()[1:3], one.next()[1:3]] == [("granted", "a1"), ("granted", "a3")]
    assert two.next()[1:3] == ("granted", "a2")
    assert key_channel.next()[1:3] == ("granted", "a4")
    one.none(0.05)
    two.none(0.05)
    key_channel.none(0.05)


@pytest.mark.parametrize("primitive", ["fenced", "rwlock", "semaphore", "expirable"])
def test_every_primitives_ticket_takes_notify(server, r, primitive):
    holder, command = TICKETED[primitive]
    key = command("o", "i")[1]
    key_channel, tagged = Listener(server, key), Listener(server, key, tag=TAG1)
    r.execute_command(*holder)
    t = server.client()
    assert t.execute_command(*command("w", "r1"), "NOTIFY", TAG1) == b"QUEUED"
    release = {
        "fenced": ("RLOCK.RELEASE", "f", "h"),
        "rwlock": ("RRWLOCK.RELEASE", "rw", "WRITE", "h"),
        "semaphore": ("RSEMAPHORE.ADDPERMITS", "s", 1),
        "expirable": ("RPSEMAPHORE.ADDPERMITS", "e", 1),
    }[primitive]
    r.execute_command(*release)
    assert tagged.next()[1:3] == ("granted", "r1")
    key_channel.none()


BAD_NOTIFY = [
    (("WAIT", 0, "ID", "r", "NOTIFY", TAG1), ERR_NOTIFY_ASYNC),
    (("NOTIFY", TAG1), ERR_NOTIFY_ASYNC),
    (("WAIT", 0, "ASYNC", "ID", "r", "NOTIFY", ""), ERR_NOTIFY_TAG),
    (("WAIT", 0, "ASYNC", "ID", "r", "NOTIFY", "{k}"), ERR_NOTIFY_TAG),
    (("WAIT", 0, "ASYNC", "ID", "r", "NOTIFY", "a:b"), ERR_NOTIFY_TAG),
    (("WAIT", 0, "ASYNC", "ID", "r", "NOTIFY", "x" * 65), ERR_NOTIFY_TAG),
]


@pytest.mark.parametrize("extra,error", BAD_NOTIFY)
def test_a_bad_notify_is_an_error_and_changes_nothing(server, r, extra, error):
    listen = Listener(server, "k")
    assert acquire(r, "k", "holder") is None
    with pytest.raises(redis.ResponseError, match=f"^{re.escape(error)}$"):
        acquire(r, "k", "other", *extra)
    assert owners(r, "k") == {"holder": 1} and waiters(r, "k") == 0
    assert stats(r)["tickets_queued"] == 0
    # On a free key too: nothing is taken, no request id is remembered.
    with pytest.raises(redis.ResponseError, match=f"^{re.escape(error)}$"):
        acquire(r, "free", "other", *extra)
    assert r.exists("free") == 0 and r.keys("rlock_request*") == []
    listen.none(0.05)


@pytest.mark.parametrize("primitive", list(TICKETED))
def test_every_waiting_command_refuses_a_bad_notify(server, r, primitive):
    holder, command = TICKETED[primitive]
    r.execute_command(*holder)
    before = sorted(r.keys("*"))
    with pytest.raises(redis.ResponseError, match=f"^{re.escape(ERR_NOTIFY_TAG)}$"):
        r.execute_command(*command("w", "r1"), "NOTIFY", "{no}")
    words = [w for w in command("w", "r1") if w != "ASYNC"]
    with pytest.raises(redis.ResponseError, match=f"^{re.escape(ERR_NOTIFY_ASYNC)}$"):
        r.execute_command(*words, "NOTIFY", TAG1)
    assert sorted(r.keys("*")) == before and stats(r)["tickets"] == 0


def test_inside_multi_and_scripts_notify_is_checked_then_ignored(server, r):
    tagged = Listener(server, "k", tag=TAG1)
    assert acquire(r, "k", "holder") is None
    p = r.pipeline(transaction=True)
    p.execute_command("RLOCK.ACQUIRE", "k", "o", LEASE, "WAIT", 0, "ASYNC", "ID", "m",
                      "NOTIFY", TAG1)
    (pttl,) = p.execute()
    assert 0 < pttl <= LEASE
    got = r.eval("return redis.call('RLOCK.ACQUIRE', KEYS[1], 'o', 1000, 'WAIT', 0, 'ASYNC',"
                 " 'ID', 's', 'NOTIFY', ARGV[1])", 1, "k", TAG1)
    assert 0 < got <= LEASE
    p = r.pipeline(transaction=True)
    p.execute_command("RLOCK.ACQUIRE", "k", "o", LEASE, "WAIT", 0, "ASYNC", "ID", "m",
                      "NOTIFY", "{bad}")
    with pytest.raises(redis.ResponseError, match=re.escape(ERR_NOTIFY_TAG)):
        p.execute()
    assert waiters(r, "k") == 0
    assert r.execute_command("RLOCK.RELEASE", "k", "holder") == 1
    tagged.none(0.05)


# ---- QUIET: no reply while queued (docs/commands/tickets.md) ----
#
# A quiet ticket that is queued gets no reply at all; its message is its only answer.
# Seen on one RESP3 connection that queues and listens (the order of its output is the
# order of the server's writes): a command sent behind the quiet ticket in the same write
# gets the first reply read; a refused or served quiet ticket answers as usual.

ERR_QUIET_ASYNC = errors.text(errors.QUIET_ASYNC)


def quiet(key, owner, rid, timeout=0, lease=LEASE, tag=None):
    notify = ("NOTIFY", tag) if tag else ()
    return ("RLOCK.ACQUIRE", key, owner, lease, "WAIT", timeout, "ASYNC", "QUIET", "ID", rid,
            *notify)


def quiet_listener(server, *channels):
    """A RESP3 connection subscribed to `channels`, where it may also send commands."""
    c = Raw(server.port)
    assert dict(c.call("HELLO", "3"))[b"proto"] == 3
    for ch in channels:
        assert c.call("SUBSCRIBE", ch)[:2] == [b"subscribe", ch.encode()]
    return c


def is_hello(reply):
    """RLOCK.HELLO's reply on a RESP3 connection (a map), not a ticket's or a message."""
    return isinstance(reply, Map) and dict(reply)[b"module"] == b"rlock"


def ticket_message(reply):
    """A pushed ticket message -> (channel, kind, id, owner, detail)."""
    assert isinstance(reply, list) and reply[0] == b"message", reply
    return (reply[1].decode(),) + parse(reply[2])


def test_hello_names_ticket_quiet(r):
    raw = r.execute_command("RLOCK.HELLO")
    hello = dict(zip(raw[::2], raw[1::2]))
    assert b"ticket-quiet" in hello[b"features"]


def test_a_quiet_ticket_queued_gets_no_reply_its_message_is_its_answer(server, r):
    c = quiet_listener(server, channel("k"))
    assert acquire(r, "k", "h") is None
    # The ticket and a fence in one write: the first reply read is the fence's.
    c.send_many([quiet("k", "w", "q1"), ("RLOCK.HELLO",)])
    assert is_hello(c.read())
    assert waiters(r, "k") == 1
    s = stats(r)
    assert (s["tickets"], s["tickets_queued"]) == (1, 1)
    assert not c.has_reply(0.1), "nothing more for the queued ticket"
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert ticket_message(c.read()) == ("rlock_ticket:{k}", "granted", "q1", "w", "")
    assert owners(r, "k") == {"w": 1}
    # The connection goes on: each command gets its own reply, nothing stale in between.
    assert c.call("PING") == b"PONG"
    assert c.call(*quiet("k", "w", "q1")) is None, "collected: the grant's reply replayed"
    assert c.call("PING") == b"PONG"
    assert owners(r, "k") == {"w": 1} and waiters(r, "k") == 0
    assert not c.has_reply(0.05)
    c.close()


def test_quiet_queued_tickets_pipelined_answer_only_by_message_in_order(server, r):
    c = quiet_listener(server, channel("k"))
    assert acquire(r, "k", "h") is None
    c.send_many([quiet("k", f"w{i}", f"q{i}") for i in range(3)] + [("PING",)])
    assert c.read() == b"PONG"
    assert waiters(r, "k") == 3
    holder = "h"
    for i in range(3):
        assert r.execute_command("RLOCK.RELEASE", "k", holder) == 1
        holder = f"w{i}"
        assert ticket_message(c.read())[1:4] == ("granted", f"q{i}", holder)
    assert c.call("PING") == b"PONG"
    c.close()


def test_a_quiet_ticket_that_finds_the_lock_free_gets_its_grant_reply(server, r):
    c = quiet_listener(server, channel("k"))
    c.send_many([quiet("k", "w", "q1"), ("PING",)])
    assert c.read() is None, "the grant's ordinary reply"
    assert c.read() == b"PONG"
    assert owners(r, "k") == {"w": 1} and waiters(r, "k") == 0
    # Re-entered at once by the same owner (a new request id): its reply too.
    assert c.call(*quiet("k", "w", "q2")) is None
    assert owners(r, "k") == {"w": 2}
    # A retry of the first request id replays its reply; nothing is entered again.
    assert c.call(*quiet("k", "w", "q1")) is None
    assert owners(r, "k") == {"w": 2}
    assert not c.has_reply(0.1), "no message for a ticket served at once"
    c.close()


def test_a_quiet_timeout_is_its_message_only(server, r):
    c = quiet_listener(server, channel("k"))
    assert acquire(r, "k", "h") is None
    c.send_many([quiet("k", "w", "q1", timeout=100), ("RLOCK.HELLO",)])
    assert is_hello(c.read())
    assert ticket_message(c.read(timeout=5)) == ("rlock_ticket:{k}", "timeout", "q1", "w", "")
    assert c.call("PING") == b"PONG"
    assert waiters(r, "k") == 0 and owners(r, "k") == {"h": 1}
    assert stats(r)["tickets_timed_out"] == 1
    c.close()


REFUSED_QUIET = [
    # (the ticket's arguments after the lease, on key `k` held by another, the error)
    (("WAIT", 0, "ASYNC", "QUIET", "ID", "q", "NOTIFY", "{bad}"), errors.NOTIFY_TAG),
    (("WAIT", -1, "ASYNC", "QUIET", "ID", "q"), errors.TIMEOUT),
    (("WAIT", 0, "ASYNC", "QUIET", "ID", ""), errors.EMPTY_ID),
    (("WAIT", 0, "ASYNC", "QUIET"), errors.ASYNC),
    (("WAIT", 0, "ASYNC", "QUIET", "QUIET", "ID", "q"), errors.SYNTAX),
]


@pytest.mark.parametrize("extra,error", REFUSED_QUIET)
def test_a_refused_quiet_ticket_gets_its_error_reply_before_the_fence(server, r, extra, error):
    c = quiet_listener(server, channel("k"))
    assert acquire(r, "k", "h") is None
    c.send_many([("RLOCK.ACQUIRE", "k", "w", LEASE, *extra), ("RLOCK.HELLO",)])
    assert c.read() == ReplyError(error)
    assert is_hello(c.read())
    assert owners(r, "k") == {"h": 1} and waiters(r, "k") == 0
    assert stats(r)["tickets_queued"] == 0
    assert not c.has_reply(0.05)
    c.close()


def test_a_quiet_ticket_refused_on_a_key_of_another_type_gets_its_error(server, r):
    # (A hash is a lock here, Redisson's: one without this owner is held, and queues.)
    r.set("str", "x")
    r.rpush("list", 1)
    c = quiet_listener(server)
    for key in ("str", "list"):
        c.send_many([quiet(key, "w", f"q-{key}"), ("RLOCK.HELLO",)])
        assert c.read() == ReplyError(errors.WRONGTYPE), key
        assert is_hello(c.read())
    assert stats(r)["tickets_queued"] == 0
    c.close()


def test_too_many_waiters_answers_a_quiet_ticket_between_two_fences(server, r):
    """What a pipelining client relies on: a fence after each quiet ticket tells the
    ticket's possible reply from the next command's. A queued one answers nothing before
    its fence; a refused one its error."""
    r.config_set("rlock.max-waiters-per-key", 1)
    c = quiet_listener(server, channel("k"))
    assert acquire(r, "k", "h") is None
    c.send_many([quiet("k", "a", "q1"), ("RLOCK.HELLO",), quiet("k", "b", "q2"),
                 ("RLOCK.HELLO",)])
    assert is_hello(c.read()), "q1 queued: nothing before its fence"
    assert c.read() == ReplyError(errors.TOO_MANY_WAITERS), "q2 refused"
    assert is_hello(c.read())
    assert waiters(r, "k") == 1 and stats(r)["tickets"] == 1
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert ticket_message(c.read())[1:4] == ("granted", "q1", "a")
    assert not c.has_reply(0.1), "nothing for the refused q2"
    c.close()


@pytest.mark.parametrize("extra", [
    ("WAIT", 0, "QUIET", "ID", "r"), ("QUIET",), ("QUIET", "WAIT", 0), ("ID", "r", "QUIET"),
])
def test_quiet_without_async_is_badquiet_and_changes_nothing(server, r, extra):
    listen = Listener(server, "k")
    assert acquire(r, "k", "holder") is None
    with pytest.raises(redis.ResponseError, match=f"^{re.escape(ERR_QUIET_ASYNC)}$"):
        acquire(r, "k", "other", *extra)
    assert owners(r, "k") == {"holder": 1} and waiters(r, "k") == 0
    # On a free key too: nothing is taken, no request id is remembered.
    with pytest.raises(redis.ResponseError, match=f"^{re.escape(ERR_QUIET_ASYNC)}$"):
        acquire(r, "free", "other", *extra)
    assert r.exists("free") == 0 and r.keys("rlock_request*") == []
    assert stats(r)["tickets_queued"] == 0
    listen.none(0.05)


@pytest.mark.parametrize("command", [
    ("RSEMAPHORE.TRYSETPERMITS", "s", 1, "QUIET"),
    ("RPSEMAPHORE.TRYSETPERMITS", "e", 1, "QUIET"),
    ("RLATCH.TRYSETCOUNT", "l", 1, "QUIET"),
])
def test_commands_that_never_wait_refuse_quiet(r, command):
    with pytest.raises(redis.ResponseError, match=f"^{errors.text(errors.SYNTAX)}$"):
        r.execute_command(*command)
    assert r.dbsize() == 0


def test_inside_multi_and_scripts_a_quiet_ticket_answers_at_once(server, r):
    """Where a client may not block, ASYNC is ignored and so is QUIET: the contended
    reply comes, in EXEC's array or as the script's result, and every reply after it is
    the next command's."""
    assert acquire(r, "k", "holder") is None
    c = quiet_listener(server, channel("k"))
    c.send_many([("MULTI",), quiet("k", "o", "m"), ("EXEC",), ("PING",)])
    assert c.read() == b"OK"
    assert c.read() == b"QUEUED", "MULTI's own QUEUED"
    (pttl,) = c.read()
    assert 0 < pttl <= LEASE
    assert c.read() == b"PONG"
    c.send_many([("EVAL", "return redis.call('RLOCK.ACQUIRE', KEYS[1], 'o', 1000, 'WAIT', 0,"
                          " 'ASYNC', 'QUIET', 'ID', 's')", 1, "k"), ("PING",)])
    got = c.read()
    assert isinstance(got, int) and 0 < got <= LEASE
    assert c.read() == b"PONG"
    assert waiters(r, "k") == 0 and stats(r)["tickets_queued"] == 0
    # Without ASYNC, QUIET is refused there too (in EXEC's array).
    c.send_many([("MULTI",), ("RLOCK.ACQUIRE", "k", "o", LEASE, "WAIT", 0, "QUIET", "ID", "m2"),
                 ("EXEC",)])
    assert c.read() == b"OK" and c.read() == b"QUEUED"
    assert c.read() == [ReplyError(errors.QUIET_ASYNC)]
    assert owners(r, "k") == {"holder": 1}
    assert r.execute_command("RLOCK.RELEASE", "k", "holder") == 1
    assert not c.has_reply(0.1), "nothing was queued, so nothing is published"
    c.close()


def test_a_quiet_tagged_tickets_message_goes_to_its_own_channel(server, r):
    key_channel = Listener(server, "k")
    own = f"{channel('k')}:{TAG1}"
    c = quiet_listener(server, own)
    assert acquire(r, "k", "h") is None
    c.send_many([quiet("k", "w", "q1", tag=TAG1), ("RLOCK.HELLO",)])
    assert is_hello(c.read())
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert ticket_message(c.read()) == (own, "granted", "q1", "w", "")
    assert c.call("PING") == b"PONG"
    key_channel.none(0.05)
    c.close()


def test_a_closed_connection_drops_its_quiet_tickets(server, r):
    listen = Listener(server, "k")
    assert acquire(r, "k", "h") is None
    c = quiet_listener(server)
    c.send_many([quiet("k", "w1", "q1"), quiet("k", "w2", "q2"), ("PING",)])
    assert c.read() == b"PONG"
    assert waiters(r, "k") == 2
    c.close()
    wait_until(lambda: waiters(r, "k") == 0, what="the quiet tickets dropped")
    assert stats(r)["tickets_dropped"] == 2
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    listen.none(0.05)


# Each primitive's release (what grants its queued ticket in TICKETED).
RELEASE = {
    "lock": ("RLOCK.RELEASE", "k", "h"),
    "fenced": ("RLOCK.RELEASE", "f", "h"),
    "rwlock": ("RRWLOCK.RELEASE", "rw", "WRITE", "h"),
    "semaphore": ("RSEMAPHORE.ADDPERMITS", "s", 1),
    "expirable": ("RPSEMAPHORE.ADDPERMITS", "e", 1),
    "latch": ("RLATCH.COUNTDOWN", "l"),
}

def quiet_primitives():
    for primitive in TICKETED:
        for tagged in (False, True):
            yield pytest.param(primitive, tagged,
                               id=f"{primitive}-{'notify-tag' if tagged else 'key-channel'}")


@pytest.mark.parametrize("primitive,tagged", quiet_primitives())
def test_every_primitives_quiet_ticket_gets_no_reply_when_queued(server, r, primitive, tagged):
    holder, command = TICKETED[primitive]
    key = command("o", "i")[1]
    notify = ("NOTIFY", TAG1) if tagged else ()
    own = channel(key) + (f":{TAG1}" if tagged else "")
    c = quiet_listener(server, own)
    r.execute_command(*holder)
    cmd = (*command("w", "q1"), *notify, "QUIET")
    c.send_many([cmd, ("RLOCK.HELLO",)])
    assert is_hello(c.read()), "the fence's reply first: none for the queued ticket"
    assert stats(r)["tickets"] == 1
    r.execute_command(*RELEASE[primitive])
    got = ticket_message(c.read())
    assert (got[0], got[1], got[2]) == (own, "granted", "q1")
    assert c.call("PING") == b"PONG"
    if primitive != "latch":  # a latch's opening writes nothing, there is nothing to collect
        collected = c.call(*cmd)  # the grant's reply replayed, never a wait again
        assert collected != b"QUEUED" and not isinstance(collected, ReplyError), collected
        assert c.call("PING") == b"PONG"
    assert not c.has_reply(0.05)
    c.close()


def test_an_expirable_quiet_ticket_of_several_permits_with_notify(server, r):
    """The longest waiting call there is, every option at once."""
    c = quiet_listener(server, f"{channel('e')}:{TAG1}")
    assert r.execute_command("RPSEMAPHORE.TRYSETPERMITS", "e", 0) == 1
    c.send_many([("RPSEMAPHORE.ACQUIRE", "e", LEASE, "PERMITS", 2, "WAIT", 0, "ASYNC", "ID",
                  "p2", "NOTIFY", TAG1, "QUIET"), ("RLOCK.HELLO",)])
    assert is_hello(c.read())
    r.execute_command("RPSEMAPHORE.ADDPERMITS", "e", 2)
    _, kind, rid, _, detail = ticket_message(c.read())
    assert (kind, rid) == ("granted", "p2") and len(detail.split(",")) == 2
    c.close()


# ---- a release collects the grant it gives back (COLLECT) ----

def test_hello_names_release_collects(r):
    hello = r.execute_command("RLOCK.HELLO")
    assert b"release-collects" in dict(zip(hello[::2], hello[1::2]))[b"features"]


def one_ticket_granted(server, r, key="k"):
    """`key` held by `h`, a ticket r1 (owner w1, connection t) queued and then granted by
    h's release; the listener and t."""
    listen = Listener(server, key)
    assert acquire(r, key, "h") is None
    t = server.client()
    assert ticket(t, key, "w1", "r1") == b"QUEUED"
    assert r.execute_command("RLOCK.RELEASE", key, "h") == 1
    assert listen.next()[1:3] == ("granted", "r1")
    return listen, t


@pytest.mark.parametrize("collect", [True, False], ids=["collected", "plain-release"])
def test_a_release_that_collects_its_grant_keeps_the_owners_next_hold(server, r, collect):
    """The holder of an unconfirmed grant releases it and takes the lock again (the same
    owner, count 1: exactly what the grant wrote), then its ticket connection closes. A
    release that collected the grant leaves nothing to take back; a plain one leaves the
    grant unconfirmed, and its take-back frees the owner's new hold (design.md 5)."""
    r.config_set("rlock.ticket-confirm-ms", 0)  # a take-back comes at once
    listen, t = one_ticket_granted(server, r)
    extra = ("COLLECT", "r1") if collect else ()
    assert r.execute_command("RLOCK.RELEASE", "k", "w1", *extra) == 1
    assert acquire(r, "k", "w1") is None
    r.client_kill_filter(_id=t.client_id())
    if collect:
        # A take-back would come from a zero-delay timer right after the kill: give it a
        # few turns (this asserts that nothing happens, which no wait-until can observe).
        time.sleep(0.05)
        assert owners(r, "k") == {"w1": 1}
        assert stats(r)["revoked_handoffs"] == 0
        # The grant's record still answers a late confirmation: it was the client's.
        assert ticket(r, "k", "w1", "r1") is None
    else:
        wait_until(lambda: owners(r, "k") == {}, what="the new hold taken back")
        assert stats(r)["revoked_handoffs"] == 1


def test_a_release_collecting_a_grant_taken_back_answers_takenback_and_changes_nothing(
        server, r):
    r.config_set("rlock.ticket-confirm-ms", 0)
    listen, t1, t2 = two_tickets_behind_a_holder(server, r)
    assert r.execute_command("RLOCK.RELEASE", "k", "h") == 1
    assert listen.next()[1:3] == ("granted", "r1")
    r.client_kill_filter(_id=t1.client_id())  # gone before confirming: taken back
    assert listen.next()[1:3] == ("granted", "r2")
    with pytest.raises(redis.ResponseError, match="^" + re.escape(errors.TAKEN_BACK) + "$"):
        r.execute_command("RLOCK.RELEASE", "k", "w1", "ID", "rel", "COLLECT", "r1")
    assert owners(r, "k") == {"w2": 1}
    # Nothing was remembered under the release's own id: it answers the same again.
    with pytest.raises(redis.ResponseError, match="TAKENBACK"):
        r.execute_command("RLOCK.RELEASE", "k", "w1", "ID", "rel", "COLLECT", "r1")


def test_a_collecting_release_with_an_id_is_replayed_like_any_other(server, r):
    listen, t = one_ticket_granted(server, r)
    release = ("RLOCK.RELEASE", "k", "w1", "ID", "rel", "COLLECT", "r1")
    assert r.execute_command(*release) == 1
    assert acquire(r, "k", "w2") is None
    assert r.execute_command(*release) == 1  # the first reply, nothing released again
    assert owners(r, "k") == {"w2": 1}


def test_a_collect_with_no_record_releases_as_without_it(server, r):
    """No grant under that id (never made, or past the request-id window): the release
    goes on as it would without the option."""
    assert acquire(r, "k", "w1") is None
    assert r.execute_command("RLOCK.RELEASE", "k", "w1", 30_000, "COLLECT", "nope") == 1
    assert owners(r, "k") == {}


def test_a_bad_collect_is_an_error_and_changes_nothing(server, r):
    r.config_set("rlock.ticket-confirm-ms", 0)
    listen, t = one_ticket_granted(server, r)
    with pytest.raises(redis.ResponseError, match="^" + re.escape(errors.EMPTY_ID) + "$"):
        r.execute_command("RLOCK.RELEASE", "k", "w1", "COLLECT", "")
    with pytest.raises(redis.ResponseError, match="syntax"):
        r.execute_command("RLOCK.RELEASE", "k", "w1", "ID", "COLLECT", "r1")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("RLOCK.RELEASE", "k", "w1", 30_000, "ID", "x", "y", "COLLECT", "r1")
    assert owners(r, "k") == {"w1": 1}
    # The grant was not collected by any of them: still taken back with its connection.
    r.client_kill_filter(_id=t.client_id())
    wait_until(lambda: owners(r, "k") == {}, what="the uncollected grant taken back")


def test_an_owner_named_collect_is_an_owner(r):
    assert acquire(r, "k", "COLLECT") is None
    assert r.execute_command("RLOCK.RELEASE", "k", "COLLECT", 30_000) == 1
    assert owners(r, "k") == {}


def test_a_rwlock_release_collects_its_write_grant(server, r):
    r.config_set("rlock.ticket-confirm-ms", 0)
    listen = Listener(server, "rw")
    assert r.execute_command("RRWLOCK.ACQUIRE", "rw", "WRITE", "h", LEASE) is None
    t = server.client()
    cmd = ("RRWLOCK.ACQUIRE", "rw", "WRITE", "w", LEASE, "WAIT", 0, "ASYNC", "ID", "x")
    assert t.execute_command(*cmd) == b"QUEUED"
    assert r.execute_command("RRWLOCK.RELEASE", "rw", "WRITE", "h") == 1
    assert listen.next()[1:3] == ("granted", "x")
    assert r.execute_command("RRWLOCK.RELEASE", "rw", "WRITE", "w", "COLLECT", "x") == 1
    assert r.execute_command("RRWLOCK.ACQUIRE", "rw", "WRITE", "w", LEASE) is None
    r.client_kill_filter(_id=t.client_id())
    time.sleep(0.05)  # as above: a take-back would come at once
    assert r.hget("rw", "mode") == b"write" and stats(r)["revoked_handoffs"] == 0


def one_permit_granted(server, r):
    """Semaphore `s` of 1 permit, taken, a ticket p1 (connection t) queued and then granted
    by the permit's release, with take-backs at once (`rlock.ticket-confirm-ms` 0); t."""
    r.config_set("rlock.ticket-confirm-ms", 0)
    listen = Listener(server, "s")
    assert r.execute_command("RSEMAPHORE.TRYSETPERMITS", "s", 1) == 1
    assert r.execute_command("RSEMAPHORE.ACQUIRE", "s", 1) == 1
    t = server.client()
    assert t.execute_command("RSEMAPHORE.ACQUIRE", "s", 1, "WAIT", 0, "ASYNC", "ID",
                             "p1") == b"QUEUED"
    r.execute_command("RSEMAPHORE.RELEASE", "s", 1)
    assert listen.next()[1:3] == ("granted", "p1")
    return t


@pytest.mark.parametrize("collect", [True, False], ids=["collected", "plain-release"])
def test_a_semaphore_release_that_collects_its_grant_is_not_followed_by_a_take_back(
        server, r, collect):
    """A permit has no owner, so only the collect tells a holder's release from the
    take-back of the same grant: released with a plain release and then taken back, the
    pool gains a permit that never existed."""
    t = one_permit_granted(server, r)
    extra = ("COLLECT", "p1") if collect else ()
    assert r.execute_command("RSEMAPHORE.RELEASE", "s", 1, *extra) == 1
    r.client_kill_filter(_id=t.client_id())
    if collect:
        time.sleep(0.05)  # as above: a take-back would come at once
        assert r.get("s") == b"1"
    else:
        wait_until(lambda: r.get("s") == b"2", what="the take-back's extra permit")


def test_a_semaphore_release_collecting_a_grant_taken_back_returns_nothing(server, r):
    t = one_permit_granted(server, r)
    r.client_kill_filter(_id=t.client_id())
    wait_until(lambda: r.get("s") == b"1", what="the grant taken back")
    with pytest.raises(redis.ResponseError, match="^" + re.escape(errors.TAKEN_BACK) + "$"):
        r.execute_command("RSEMAPHORE.RELEASE", "s", 1, "COLLECT", "p1")
    assert r.get("s") == b"1"
