"""A queued ticket need not be answered (design.md 5, docs/commands/tickets.md "No reply
while queued (QUIET)"): where the ticket connection's RLOCK.HELLO names ``ticket-quiet``
and nothing else is in flight on it, a ticket goes ``QUIET``: the server writes nothing
when it queues it (its message is its answer), and any other outcome (granted at once,
refused, even by the server before the module runs: ``OOM``) is its one reply. Anything
written behind a quiet ticket still unanswered goes behind a fence (``RLOCK.HELLO``), so
that replies stay in step. The routing (`rlock._tickets.Book`) is pure and tested here on
its own; the rest against a real server, on both front ends.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, List

import pytest
import redis
import redis.asyncio
from conftest import stat, wait_until
from redis.exceptions import OutOfMemoryError, ResponseError

import rlock
from rlock import _plan
from rlock._proto import Note
from rlock._tickets import Answered, Book, OutOfStep, _Push, _Quiet

pytestmark = pytest.mark.module_only


# ---- the routing, pure ------------------------------------------------------------------


class _Slot:
    def __init__(self, sub: bool = False) -> None:
        self.sub = sub
        self.values: List[Any] = []

    def put(self, value: Any) -> None:
        self.values.append(value)


class _Box:
    def __init__(self) -> None:
        self.notes: List[Note] = []
        self.look = None
        self.hold = None
        self.heard = None

    def put(self, note: Note) -> None:
        self.notes.append(note)

    def items(self) -> List[Note]:
        return list(self.notes)


HELLO = {b"module": b"rlock", b"protocol": 1}


def _book(quiet: bool = True) -> Book:
    book = Book(_Slot, _Box)
    book.quiet = quiet
    return book


def _message(kind: str, note_id: str) -> _Push:
    payload = f"{kind}:{len(note_id)}:0:{note_id}".encode()
    return _Push([b"message", b"rlock_ticket:{k}", payload])


def test_a_ticket_goes_quiet_only_with_nothing_in_flight():
    book = _book()
    slot, fence, quiet = book.expect(ticket="a")
    assert (slot, fence, quiet) == (None, False, True)
    # Behind it: a fence, then the command; a second ticket goes as before (QUEUED).
    slot, fence, quiet = book.expect(ticket="b")
    assert slot is not None and fence and not quiet
    # Nothing behind a fenced command needs another fence.
    assert book.expect()[1] is False
    assert book.fences == 1
    # Without `ticket-quiet` nothing is quiet nor fenced.
    plain = _book(quiet=False)
    assert plain.expect(ticket="a")[2] is False and plain.expect()[1] is False


def test_the_fences_map_says_the_quiet_ticket_was_queued():
    book = _book()
    book.register("a", _Box(), None)
    book.expect(ticket="a")
    slot, _, _ = book.expect()
    book.frame(HELLO)
    assert list(book.pending) == [slot]
    book.frame(b"OK")
    assert slot.values == [b"OK"] and not book.pending
    assert book.notes["a"].notes == []  # nothing for the queued ticket: its message comes


def test_a_reply_in_front_of_the_fence_is_the_quiet_tickets_own():
    book = _book()
    box = _Box()
    book.register("a", box, None)
    book.expect(ticket="a")
    slot, _, _ = book.expect()
    oom = ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
    book.frame(oom)
    assert box.notes == [Answered("error", "a", reply=oom)]
    book.frame(HELLO)  # the fence's, in its turn
    book.frame(oom)  # the next command's own
    assert slot.values == [oom] and not book.pending


def test_a_quiet_tickets_reply_with_nothing_behind_it_is_its_own():
    book = _book()
    box = _Box()
    book.register("a", box, None)
    book.expect(ticket="a")
    book.frame(None)  # the lock was free: granted at once
    assert box.notes == [Answered("reply", "a", reply=None)] and not book.pending


def test_a_message_takes_the_quiet_ticket_out_of_the_line():
    book = _book()
    box = _Box()
    book.register("a", box, None)
    book.expect(ticket="a")
    slot, _, _ = book.expect()
    book.frame(_message("timeout", "a"))
    assert [n.kind for n in box.notes] == ["timeout"]
    book.frame(HELLO)  # the fence still answers in its turn
    book.frame(b"OK")
    assert slot.values == [b"OK"]
    # Queued and answered by its message: the next command needs no fence.
    book.expect(ticket="b")
    book.frame(_message("timeout", "b"))
    assert not book.pending and book.expect()[1] is False


def test_anything_but_the_fences_map_in_its_turn_is_out_of_step():
    book = _book()
    book.expect(ticket="a")
    book.expect()
    book.frame(b"not the ticket's")  # taken for the ticket's (a waiter gone: dropped)
    with pytest.raises(OutOfStep):
        book.frame(b"OK")


def test_an_orphans_quiet_reply_is_given_back():
    """A waiter that left with its quiet ticket maybe queued: a reply after all means it
    was granted at once, and the grant is given back; an error is forgotten."""
    book = _book()
    book.register("a", _Box(), None)
    book.expect(ticket="a")
    due, stale = book.leave("a", ["RLOCK.ACQUIRE", "k"], [(b"ch", 0)])
    assert due is None and stale == [] and "a" in book.orphans
    assert book.frame(None) == (["RLOCK.ACQUIRE", "k"], b"ch")
    book.register("b", _Box(), None)
    book.expect(ticket="b")
    book.leave("b", ["RLOCK.ACQUIRE", "k"], [(b"ch", 0)])
    assert book.frame(ResponseError("OOM")) == (None, b"ch")


def test_a_waiter_that_leaves_after_its_quiet_grant_gives_it_back():
    book = _book()
    box = _Box()
    book.register("a", box, None)
    book.expect(ticket="a")
    book.frame(None)
    due, _ = book.leave("a", ["RLOCK.ACQUIRE", "k"], [(b"ch", 0)])
    assert due == ["RLOCK.ACQUIRE", "k"]


def test_a_broken_connection_tells_quiet_waiters_lost():
    book = _book()
    box = _Box()
    book.register("a", box, None)
    book.expect(ticket="a")
    slot, _, _ = book.expect()
    book.lost()
    assert not book.pending and box.notes[-1].kind == "lost"
    assert isinstance(slot.values[0], redis.ConnectionError)


# ---- against a server ------------------------------------------------------------------


def _writes(r: redis.Redis) -> int:
    """``total_writes_processed`` (INFO stats): the server's socket writes so far."""
    return int(r.info("stats")["total_writes_processed"])


def _conn(client: Any) -> Any:
    (conn,) = rlock._io.ticket_connections(client)
    return conn


def _only_quiet(conn: Any) -> bool:
    """The ticket connection expects one reply or none: a quiet ticket's, queued."""
    return [type(e) for e in conn.book.pending] == [_Quiet]


def _contended(lock: Any) -> None:
    """The handle found its lock held just now: its next waiting acquire queues at once,
    with no try first (design.md 5, "An uncontended wait does not queue")."""
    lock._contention.found(_plan.HELD, time.monotonic())


def _acquire_in_thread(lock: rlock.Lock, got: list,
                       release: bool = True) -> threading.Thread:
    def run() -> None:  # the token is the thread's (redis-py's Lock)
        try:
            got.append(lock.acquire(blocking_timeout=10))
        except Exception as e:  # noqa: BLE001 - the test looks at it
            got.append(e)
            return
        if got[-1] is True and release:
            lock.release()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _handoff(admin: redis.Redis, lock: rlock.Lock, key: str) -> None:
    """A queued wait of ``lock`` on ``key``, granted: the ticket connection is up, the
    key's channel subscribed (idle after), the handle knows the key contended."""
    holder = rlock.Lock(admin, key, timeout=30)
    assert holder.acquire(blocking=False)
    got: list = []
    t = _acquire_in_thread(lock, got)
    try:
        wait_until(lambda: stat(admin, "waiters") == 1, what=f"a ticket queued on {key}")
    finally:
        holder.release()
        t.join(10)
    assert got == [True]


def test_a_queued_quiet_ticket_costs_the_server_no_write(server, r, admin):
    """Nothing else in flight, the channel subscribed already: while the ticket is
    queued the server writes nothing but the test's own replies (the first INFO's and one
    per poll). A ticket answered ``QUEUED`` costs one write more."""
    lock = rlock.Lock(r, "k", timeout=30)
    _handoff(admin, lock, "k")
    conn = _conn(r)
    wait_until(lambda: not conn.book.pending, what="the confirmation answered")
    holder = rlock.Lock(admin, "k", timeout=30)
    assert holder.acquire(blocking=False)
    _contended(lock)
    before = _writes(admin)
    got: list = []
    t = _acquire_in_thread(lock, got)
    polls = 0
    try:
        def queued() -> bool:
            nonlocal polls
            polls += 1
            return stat(admin, "waiters") == 1
        wait_until(queued, what="the quiet ticket queued")
        assert _writes(admin) - before == 1 + polls
        assert _only_quiet(conn)  # its quiet ticket: no reply due
    finally:
        holder.release()
        t.join(10)
    assert got == [True]
    assert conn.book.fences == 0  # nothing was written behind the ticket


def _maxmemory(admin: redis.Redis, n: int) -> None:
    admin.config_set("maxmemory", n)


def test_replies_behind_a_quiet_ticket_stay_in_step(server, r, admin):
    """Waiter 1's quiet ticket is queued (no reply); waiter 2's ticket, written behind it,
    is refused by the server itself (OOM, before any module code runs). The fence tells
    the two apart: waiter 2 gets its OOM, waiter 1 its grant later. With nothing in
    flight a quiet ticket refused outright gets its OOM too."""
    l1 = rlock.Lock(r, "k1", timeout=30)
    l2 = rlock.Lock(r, "k2", timeout=30)
    _handoff(admin, l2, "k2")  # k2's channel subscribed: waiter 2 writes one command
    conn = _conn(r)
    wait_until(lambda: not conn.book.pending, what="nothing in flight")
    h1 = rlock.Lock(admin, "k1", timeout=30)
    h2 = rlock.Lock(admin, "k2", timeout=30)
    assert h1.acquire(blocking=False) and h2.acquire(blocking=False)
    got1: list = []
    t1 = _acquire_in_thread(l1, got1)
    try:
        wait_until(lambda: stat(admin, "waiters") == 1, what="waiter 1 queued")
        assert _only_quiet(conn), "waiter 1's ticket went quiet: no reply, none due"
        _maxmemory(admin, 1)
        try:
            _contended(l2)
            with pytest.raises(OutOfMemoryError):
                l2.acquire(blocking_timeout=5)
        finally:
            _maxmemory(admin, 0)
        assert conn.book.fences == 1
        assert got1 == []  # still waiting, not told waiter 2's refusal
        h1.release()
        t1.join(10)
        assert got1 == [True]
    finally:
        _maxmemory(admin, 0)
        admin.delete("k1", "k2")
        t1.join(10)
    # Nothing in flight: a quiet ticket that the server refuses outright.
    wait_until(lambda: not conn.book.pending, what="the confirmation answered")
    _contended(l1)
    _maxmemory(admin, 1)
    try:
        with pytest.raises(OutOfMemoryError):
            l1.acquire(blocking_timeout=5)
    finally:
        _maxmemory(admin, 0)
    assert conn.book.fences == 1 and stat(admin, "waiters") == 0
    assert l1.acquire(blocking_timeout=5)  # the connection still in step
    l1.release()


async def test_asyncio_replies_behind_a_quiet_ticket_stay_in_step(server, ar, admin):
    """As `test_replies_behind_a_quiet_ticket_stay_in_step`, on the asyncio front end."""
    import rlock.asyncio as arlock
    l1 = arlock.Lock(ar, "k1", timeout=30)
    l2 = arlock.Lock(ar, "k2", timeout=30)
    h1 = rlock.Lock(admin, "k1", timeout=30)
    h2 = rlock.Lock(admin, "k2", timeout=30)
    assert h2.acquire(blocking=False)
    w2 = asyncio.ensure_future(l2.acquire(blocking_timeout=10))
    while stat(admin, "waiters") != 1:
        await asyncio.sleep(0.002)
    h2.release()
    assert await w2
    await l2.release()
    conn = _conn(ar)
    assert conn.book.quiet
    while conn.book.pending:
        await asyncio.sleep(0.002)
    assert h1.acquire(blocking=False) and h2.acquire(blocking=False)
    w1 = asyncio.ensure_future(l1.acquire(blocking_timeout=10))
    try:
        while stat(admin, "waiters") != 1:
            await asyncio.sleep(0.002)
        assert _only_quiet(conn), "waiter 1's ticket went quiet: no reply, none due"
        _maxmemory(admin, 1)
        try:
            _contended(l2)
            with pytest.raises(OutOfMemoryError):
                await l2.acquire(blocking_timeout=5)
        finally:
            _maxmemory(admin, 0)
        assert conn.book.fences == 1 and not w1.done()
        h1.release()
        assert await asyncio.wait_for(w1, 10)
        await l1.release()
    finally:
        _maxmemory(admin, 0)
        admin.delete("k1", "k2")
        if not w1.done():
            w1.cancel()
    while conn.book.pending:
        await asyncio.sleep(0.002)
    _contended(l1)
    _maxmemory(admin, 1)
    try:
        with pytest.raises(OutOfMemoryError):
            await l1.acquire(blocking_timeout=5)
    finally:
        _maxmemory(admin, 0)
    assert conn.book.fences == 1
    assert await l1.acquire(blocking_timeout=5)
    await l1.release()


def test_a_quiet_ticket_granted_at_once_is_answered(server, r, admin):
    """A quiet ticket for a lock that is free (the handle's hint said held): granted at
    once, its reply the ticket's own, no message."""
    lock = rlock.Lock(r, "k", timeout=30)
    _handoff(admin, lock, "k")
    conn = _conn(r)
    wait_until(lambda: not conn.book.pending, what="nothing in flight")
    _contended(lock)
    got: list = []
    _acquire_in_thread(lock, got).join(10)
    assert got == [True] and conn.book.fences == 0 and not conn.book.pending
