"""The sans-IO parts, without a server: ticket channels and messages, the shapes of a
waiting command, what gives back an abandoned grant, and the ticket connection's routing
(`Book`) fed frames by hand. One row per case, as in test_plan.py.
"""

from __future__ import annotations

import pytest
from redis.exceptions import ConnectionError

from rlock._proto import Note, undo_args, waiting
from rlock._tickets import Book, _Push


# The ticket channel and the reading of ticket messages: test_vectors.py (spec/vectors).


def test_a_waiting_shape_adds_async_and_looks_without_wait():
    shape = waiting(["RLOCK.ACQUIRE", "k", b"me", 30000], 5000, "id1")
    assert shape.with_wait(4000, True) == ["RLOCK.ACQUIRE", "k", b"me", 30000, "WAIT", 4000,
                                           "ID", "id1", "ASYNC"]
    assert shape.with_wait(4000, False) == ["RLOCK.ACQUIRE", "k", b"me", 30000, "WAIT", 4000,
                                            "ID", "id1"]
    assert shape.with_wait(None, False) == ["RLOCK.ACQUIRE", "k", b"me", 30000, "ID", "id1"]
    assert shape.wait_left(1.0) == 4000 and shape.wait_left(5.0) is None
    assert waiting(["X", "k"], 0, "i").wait_left(1e6) == 0  # no limit stays no limit


def test_the_latch_takes_an_id_only_with_async():
    shape = waiting(["RLATCH.AWAIT", "l"], 1000, "id1", latch=True)
    assert shape.with_wait(1000, True) == ["RLATCH.AWAIT", "l", "WAIT", 1000, "ASYNC", "ID",
                                           "id1"]
    assert shape.with_wait(1000, False) == ["RLATCH.AWAIT", "l", "WAIT", 1000]
    assert shape.with_wait(None, False) == ["RLATCH.AWAIT", "l"]


@pytest.mark.parametrize("args, reply, first", [
    # header: the acquire, its grant's reply -> the first give-back command's name and args
    (["RLOCK.ACQUIRE", "k", b"o", 1, "ID", "i"], None, ["RLOCK.RELEASE", "k", b"o"]),
    (["RLOCK.ACQUIRE", "k", b"o", 1, "ID", "i"], 120, None),         # not granted
    (["RFENCED.ACQUIRE", "k", "o", 1, "ID", "i"], [None, 7], ["RLOCK.RELEASE", "k", "o"]),
    (["RRWLOCK.ACQUIRE", "k", "READ", "o", 1, "ID", "i"], None,
     ["RRWLOCK.RELEASE", "k", "READ", "o"]),
    (["RSEMAPHORE.ACQUIRE", "s", 2, "ID", "i"], 1, ["RSEMAPHORE.RELEASE", "s", 2]),
    (["RSEMAPHORE.ACQUIRE", "s", 2, "ID", "i"], 0, None),
    (["RPSEMAPHORE.ACQUIRE", "p", 1000, "ID", "i"], b"ab" * 16,
     ["RPSEMAPHORE.RELEASE", "p", b"ab" * 16]),
    (["RLATCH.AWAIT", "l"], 1, None),                                  # nothing to give back
])
def test_it_knows_what_gives_back_an_abandoned_grant(args, reply, first):
    undo = undo_args(args, reply)
    if first is None:
        assert undo == []
    else:
        assert undo[0][:len(first)] == first and undo[0][-2] == "ID"


class Slot:
    def __init__(self, sub=False):
        self.sub, self.value = sub, "unset"

    def put(self, value):
        self.value = value


class Box:
    def __init__(self, look=None):
        self.notes, self.look = [], look

    def put(self, note):
        self.notes.append(note)

    def items(self):
        return list(self.notes)


def test_the_book_routes_replies_in_order_and_messages_by_id():
    book = Book(Slot, Box)
    sub, cmd = Slot(sub=True), Slot()
    book.pending.extend([sub, cmd])
    book.notes["r1"] = box = Box()
    assert book.frame(_Push([b"subscribe", b"ch", 1])) is None and sub.value is None
    assert book.frame(b"QUEUED") is None and cmd.value == b"QUEUED"
    book.frame(_Push([b"message", b"ch", b"granted:2:1:r1o"]))
    book.frame(_Push([b"message", b"ch", b"granted:2:1:r9o"]))       # someone else's: dropped
    assert box.notes == [Note("granted", "r1", b"o", "")]


def test_a_grant_comes_back_with_its_collect_when_the_waiter_registered_one():
    book = Book(Slot, Box)
    book.notes["r1"] = box = Box(look=("RLOCK.ACQUIRE", "k"))
    routed = book.frame(_Push([b"message", b"ch", b"granted:2:1:r1o"]))
    assert routed == (box, Note("granted", "r1", b"o", "")) and box.notes == []


def test_an_orphans_grant_is_given_back_and_its_timeout_forgotten():
    book = Book(Slot, Box)
    book.notes["r1"], book.notes["r2"] = Box(), Box()
    book.ref(b"old", True), book.ref(b"ch", True), book.ref(b"ch", True)
    # r1 subscribed twice (its connection broke once): the older channel is dropped, the
    # ticket's kept until its message comes.
    assert book.leave("r1", ["LOOK1"], [(b"old", 0), (b"ch", 0)]) == (None, [])
    assert book.leave("r2", ["LOOK2"], [(b"ch", 0)]) == (None, [])
    assert book.channels == {b"ch": 2} and list(book.idle) == [b"old"]
    assert book.frame(_Push([b"message", b"ch", b"granted:2:0:r1"])) == (["LOOK1"], b"ch")
    assert book.frame(_Push([b"message", b"ch", b"timeout:2:0:r2"])) == (None, b"ch")
    assert book.orphans == {}


def test_a_waiter_leaving_after_its_grant_came_gives_it_back_at_once():
    book = Book(Slot, Box)
    book.notes["r1"] = box = Box()
    box.put(Note("granted", "r1"))
    book.ref(b"ch", True)
    assert book.leave("r1", ["LOOK"], [(b"ch", 0)]) == (["LOOK"], [])
    assert book.channels == {} and list(book.idle) == [b"ch"]


def test_a_waiter_leaving_past_the_idle_limit_unsubscribes_the_oldest(monkeypatch):
    import rlock._tickets as t
    monkeypatch.setattr(t, "IDLE_CHANNELS", 1)
    book = Book(Slot, Box)
    book.ref(b"a", True), book.ref(b"b", True)
    assert book.leave("r1", None, [(b"a", 0), (b"b", 0)]) == (None, [b"a"])


def test_tagged_channels_stay_subscribed_idle_up_to_a_limit(monkeypatch):
    import rlock._tickets as t
    monkeypatch.setattr(t, "IDLE_CHANNELS", 1)
    book = Book(Slot, Box)
    assert book.ref(b"a", True) is True and book.ref(b"a", True) is False  # subscribed once
    assert book.unref(b"a", 0) is None and book.unref(b"a", 0) is None  # now idle
    assert book.ref(b"a", True) is False                             # reused, no SUBSCRIBE
    assert book.unref(b"a", 0) is None
    assert book.ref(b"b", True) is True and book.unref(b"b", 0) == b"a"  # the oldest goes
    assert list(book.idle) == [b"b"] and book.unsubscribe_due(b"a", 0)


def test_the_default_limit_keeps_64_idle_channels_and_drops_the_one_idle_longest():
    book = Book(Slot, Box)
    for i in range(64):
        assert book.ref(b"c%d" % i, True) is True and book.unref(b"c%d" % i, 0) is None
    assert book.ref(b"c0", True) is False and book.unref(b"c0", 0) is None  # used again
    assert book.ref(b"c64", True) is True and book.unref(b"c64", 0) == b"c1"
    assert len(book.idle) == 64 and b"c0" in book.idle


def test_a_key_channel_is_unsubscribed_after_its_last_waiter():
    # The key's shared channel (an older module, no NOTIFY tag) hears every client's
    # handoffs: it never stays idle.
    book = Book(Slot, Box)
    assert book.ref(b"k") is True and book.ref(b"k") is False
    assert book.unref(b"k", 0) is None and book.unref(b"k", 0) == b"k"
    assert book.idle == {} and book.ref(b"k") is True                # subscribed again


def test_an_unsubscribe_is_not_due_once_a_wait_subscribed_the_channel_again():
    # asyncio writes an unsubscribe from a task, after a wait may have subscribed anew.
    book = Book(Slot, Box)
    book.ref(b"k")
    assert book.unref(b"k", 0) == b"k" and book.unsubscribe_due(b"k", 0)
    book.ref(b"k")
    assert not book.unsubscribe_due(b"k", 0)
    book.lost()
    assert not book.unsubscribe_due(b"k", 0)  # a new connection never had it


def test_a_channel_the_server_dropped_leaves_the_idle_set():
    book = Book(Slot, Box)
    book.ref(b"a", True), book.unref(b"a", 0)
    book.frame(_Push([b"sunsubscribe", b"a", 0]))  # nobody asked: a slot migration
    assert book.idle == {} and book.ref(b"a", True) is True


def test_a_lost_connection_fails_replies_and_tells_waiters():
    book = Book(Slot, Box)
    book.pending.append(slot := Slot())
    book.notes["r1"] = box = Box()
    book.ref(b"a", True), book.ref(b"b", True), book.unref(b"b", 0)
    book.lost()
    assert isinstance(slot.value, ConnectionError) and box.notes[-1].kind == "lost"
    assert book.channels == {} and book.idle == {} and book.gen == 1  # none resubscribed
    assert book.unref(b"a", 0) is None  # a reference of the old connection: ignored


def test_the_hello_probe_reads_a_map_and_flat_pairs_alike_and_unknown_command_is_no_module():
    from redis.exceptions import ResponseError

    from rlock._hello import NO_MODULE, parse_hello
    fields = {b"features": [b"tickets", b"lock"], b"module": b"rlock", b"protocol": 1,
              b"replication": b"effects", b"version": b"0.1.0", b"added-later": 7}
    caps = parse_hello(fields)
    assert caps == parse_hello([x for kv in fields.items() for x in kv])
    assert caps.tickets and caps.has("lock") and not caps.has("latch")
    assert (caps.version, caps.replication) == ("0.1.0", "effects")
    unknown = ResponseError("unknown command 'RLOCK.HELLO', with args beginning with: ")
    assert parse_hello(unknown) == NO_MODULE and not NO_MODULE.tickets
    with pytest.raises(ResponseError):
        parse_hello(ResponseError("NOPERM User has no permissions to run 'rlock.hello'"))
    with pytest.raises(ValueError):
        parse_hello({b"module": b"rlock"})  # no protocol
