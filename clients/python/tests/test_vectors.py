"""The Python client's reader of the protocol contract, spec/vectors/ at the repository's
root (its README: the format, and who reads what): the ticket channel and its tagged
form (``NOTIFY``), the reading of ticket messages and what a waiter does with each, and
how the client classes the module's error texts, and how a waiting acquire starts
(asking without waiting first, or queueing at once: waits.json); so that a vector changed
by hand, or a client change the vectors do not follow, fails this suite. No server
needed."""

from __future__ import annotations

import json
import pathlib
import re
import time

import pytest
import redis
from redis.exceptions import ResponseError

import rlock
import rlock.errors
from rlock import _plan
from rlock._plan import Wait
from rlock._proto import Call
from rlock._proto import Wait as ProtoWait
from rlock._proto import (new_notify_tag, new_request_id, note_action, parse_note,
                          ticket_channel, waiting)
from rlock.primitives import ExpirableSemaphore, FencedLock, RwLockHalf, Semaphore

VECTORS = pathlib.Path(__file__).resolve().parents[3] / "spec" / "vectors"


def load(name: str, field: str) -> list:
    rows = json.loads((VECTORS / name).read_text(encoding="utf-8"))[field]
    assert rows, f"no {field} in {name}"
    return rows


def ids(rows, field):
    return [repr(r[field])[:60] for r in rows]


CHANNELS = load("channels.json", "cases")
TICKETS = load("tickets.json", "cases")
ERRORS = load("errors.json", "errors")
WAITING = load("commands.json", "waiting")
BUILDERS = load("commands.json", "builders")


@pytest.mark.parametrize("case", CHANNELS, ids=ids(CHANNELS, "key"))
def test_the_ticket_channel_is_the_vectors(case):
    assert ticket_channel(case["key"].encode()) == case["ticket"].encode()


NOTIFY_TAG = json.loads((VECTORS / "channels.json").read_text(encoding="utf-8"))["notify_tag"]


@pytest.mark.parametrize("case", CHANNELS, ids=ids(CHANNELS, "key"))
def test_the_tagged_ticket_channel_is_the_vectors(case):
    """The channel of a ticket queued with ``NOTIFY tag``: the one a client subscribes
    when its server names ``ticket-notify``."""
    assert ticket_channel(case["key"].encode(), NOTIFY_TAG) == case["ticket_notify"].encode()


def test_a_clients_notify_tag_is_16_hex_characters_and_goes_after_async():
    tags = {new_notify_tag() for _ in range(100)}
    assert len(tags) == 100 and all(re.fullmatch(r"[0-9a-f]{16}", t) for t in tags)
    shape = waiting(["RLOCK.ACQUIRE", "k", "o", 30000], 500, "r1")
    assert words(shape.with_wait(500, True, "t1")) == [
        "RLOCK.ACQUIRE", "k", "o", "30000", "WAIT", "500", "ID", "r1", "ASYNC", "NOTIFY", "t1"]
    assert words(shape.with_wait(None, False)) == ["RLOCK.ACQUIRE", "k", "o", "30000",
                                                   "ID", "r1"]


def test_the_notify_refusals_are_argument_errors():
    rows = [r for r in ERRORS if r["code"] == "BADNOTIFY"]
    assert len(rows) == 2 and all(r["kind"] == "argument" for r in rows)
    for r in rows:
        assert rlock.errors.error_class(r["code"]) is rlock.errors.BadArgument


@pytest.mark.parametrize("case", TICKETS, ids=ids(TICKETS, "message"))
def test_a_ticket_message_reads_as_the_vectors_say(case):
    note = parse_note(case["message"].encode())
    want = case["parsed"]
    if want is None:
        assert note is None
        return
    assert note is not None
    assert (note.kind, note.id, note.owner, note.detail) == (
        want["kind"], want["id"], want["owner"].encode(), want["detail"])
    assert note_action(note) == case["then"]


HOLDS = load("tickets.json", "holds")
_HOLD_ARGS = {"RLOCK.ACQUIRE": ["o", 30_000], "RFENCED.ACQUIRE": ["o", 30_000],
              "RRWLOCK.ACQUIRE": ["WRITE", "o", 30_000], "RPSEMAPHORE.ACQUIRE": [30_000],
              "RSEMAPHORE.ACQUIRE": [1], "RLATCH.AWAIT": []}


def _json_reply(v):
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, list):
        return [_json_reply(i) for i in v]
    return v


@pytest.mark.parametrize("case", HOLDS, ids=[f"{c['command']} {c['detail'][:20]!r}"
                                             for c in HOLDS])
def test_a_granted_message_is_held_on_as_the_vectors_say(case):
    args = [case["command"], "k"] + _HOLD_ARGS[case["command"]]
    if case["permits"]:
        args += ["PERMITS", 2]
    shape = waiting(args, 0, "r1", latch=case["command"] == "RLATCH.AWAIT")
    held, reply = shape.held_reply(case["detail"]) if shape.holds else (False, None)
    if case["then"] == "hold":
        assert held and reply == _json_reply(case["reply"])
    else:
        assert not held


@pytest.mark.parametrize("row", ERRORS, ids=ids(ERRORS, "name"))
def test_a_key_that_is_not_a_lock_is_told_by_the_vectors_kind(row):
    # redis-py drops the "ERR " code of the errors it raises as ResponseError.
    text = row["text"].removeprefix("ERR ")
    want = row["kind"] == "wrong-type" and row.get("of") in ("lock", "any")
    assert _plan.not_a_lock(ResponseError(text)) is want


@pytest.mark.parametrize("name", sorted(rlock.errors.TEXTS))
def test_the_refusals_scripts_mode_makes_are_the_modules_texts(name):
    rows = {r["name"]: r for r in ERRORS}
    assert rlock.errors.TEXTS[name] == rows[name]["text"]
    assert rlock.errors.error_class(rows[name]["code"]) is not None


def words(args) -> list:
    """A command as the words on the wire (ints in decimal, bytes as text)."""
    return [a.decode() if isinstance(a, bytes) else str(a) for a in args]


@pytest.mark.parametrize("case", WAITING, ids=ids(WAITING, "base"))
def test_a_waiting_command_takes_the_vectors_shapes(case):
    request_id = case["id"] or new_request_id()
    shape = waiting(case["base"], case["wait_ms"], request_id, latch=case["latch"])
    mine = [request_id if w == "$id" else w for w in case["ticketed"]]
    assert words(shape.with_wait(case["wait_ms"], False)) == case["command"]
    assert words(shape.with_wait(case["wait_ms"], True)) == mine
    assert words(shape.with_wait(None, False)) == case["look"]


# The plain lock's builders (rlock.lock.Lock, redis-py's interface): the other primitives
# build their commands inline in _ops, on the waiting shapes above.
LOCK_BUILDERS = [c for c in BUILDERS if c.get("side") is None
                 and c["op"] in ("acquire", "renew")
                 or c["op"] == "release" and c.get("side") is None and c["lease_ms"] is not None]


@pytest.mark.parametrize("case", LOCK_BUILDERS, ids=ids(LOCK_BUILDERS, "wire"))
def test_the_lock_builds_the_vectors_words(case):
    token = case["owner"].encode()
    if case["op"] == "acquire":
        args = _plan.acquire_args(case["key"], token, case["lease_ms"], Wait(case["wait_ms"]),
                                  case["id"])
    elif case["op"] == "release":
        args = _plan.release_args(case["key"], token, case["lease_ms"], case["id"])
    else:
        args = _plan.renew_args(case["key"], token, case["lease_ms"])
    assert words(args) == case["wire"]


REPLIES = [c for c in load("replies.json", "cases")
           if c["send"][0] in ("RFENCED.ACQUIRE", "RRWLOCK.ACQUIRE")]


def replies(want):
    """The replies a vector stands for, as redis-py gives them: an integer known within
    bounds is each bound in turn."""
    if isinstance(want, dict):
        return list(want["between"])
    if isinstance(want, list):
        first = [replies(w)[0] for w in want]
        out = [first]
        for i, w in enumerate(want):
            for alt in replies(w)[1:]:
                out.append(first[:i] + [alt] + first[i + 1:])
        return out
    return [want]


@pytest.mark.parametrize("case", REPLIES, ids=[" ".join(c["send"]) for c in REPLIES])
def test_an_acquire_reply_reads_as_the_vectors_outcome(case):
    # The handles' own reading; making one does no I/O (the client never connects).
    client = redis.Redis(host="127.0.0.1", port=1)
    for reply in replies(case["reply"]):
        if case["send"][0] == "RFENCED.ACQUIRE":
            ops = FencedLock(client, "f")
        else:
            ops = RwLockHalf(client, "rw", side=case["send"][2])
        assert ops._acquired(reply) is (case["outcome"] == "acquired"), reply
        if case["outcome"] == "acquired" and isinstance(ops, FencedLock):
            assert ops.token == reply[1] and ops.token > 0


# ---- waits.json: how a waiting acquire starts ------------------------------------------

WAITS = json.loads((VECTORS / "waits.json").read_text(encoding="utf-8"))


def test_the_contended_window_is_the_vectors():
    assert _plan.CONTENDED_FOR_S * 1000 == WAITS["contended_for_ms"]


@pytest.mark.parametrize("case", WAITS["tries_first"], ids=ids(WAITS["tries_first"], "found"))
def test_a_handle_tries_first_as_the_vectors_say(case):
    contention = _plan.Contention()
    t0 = 1000.0
    if case["found"] is not None:
        contention.found(case["found"], t0)
    now = t0 + (case["ago_ms"] or 0) / 1000
    assert contention.tries_first(now) is case["tries_first"]


#: Each waiting primitive's handle (no I/O: the client never connects) and the module's
#: replies to its acquire: taken (the grant), held (not now).
_WAITERS = {
    "lock": (lambda c: rlock.Lock(c, "k", timeout=30, replica_sync=None), None, 5000),
    "fenced": (lambda c: FencedLock(c, "k", timeout=30, replica_sync=None), [None, 7],
               [5000, None]),
    "rwlock": (lambda c: RwLockHalf(c, "k", timeout=30, side="WRITE", replica_sync=None),
               None, 5000),
    "semaphore": (lambda c: Semaphore(c, "k"), 1, 0),
    "expirable": (lambda c: ExpirableSemaphore(c, "k"), b"ab" * 16, None),
}


def _acquire_op(handle):
    if isinstance(handle, rlock.Lock):
        return handle._acquire_op(None, True, None, None)
    if isinstance(handle, Semaphore):
        return handle._acquire_op(1, True, None)
    if isinstance(handle, ExpirableSemaphore):
        return handle._acquire_op(30, 1, True, None, None)
    return handle._acquire_op(True, None)


def _run_acquire(handle, replies, grant, held):
    """Runs the handle's own acquire over scripted replies: what it sent (``try``: a
    command without WAIT; ``wait``: a waiting one), and whether it took it."""
    op, sent, value, script = _acquire_op(handle), [], None, iter(replies)
    while True:
        try:
            effect = op.send(value)
        except StopIteration as done:
            return sent, done.value
        if isinstance(effect, Call):
            assert effect.tries and "WAIT" not in effect.args, effect
            sent.append("try")
            value = grant if next(script) == "taken" else held
        elif isinstance(effect, ProtoWait):
            sent.append("wait")
            reply = next(script)
            effect.shape.at_once = reply == "at_once"
            value = held if reply == "timeout" else grant
        else:
            raise AssertionError(f"unexpected effect {effect!r}")


@pytest.mark.parametrize("waiter", sorted(_WAITERS))
@pytest.mark.parametrize("case", WAITS["acquires"],
                         ids=[f"{c['before']}-{'-'.join(c['replies'])}" for c in WAITS["acquires"]])
def test_a_waiting_acquire_sends_and_learns_as_the_vectors_say(case, waiter):
    make, grant, held = _WAITERS[waiter]
    handle = make(redis.Redis(host="127.0.0.1", port=1))
    if case["before"] is not None:
        handle._contention.found(case["before"], time.monotonic())
    sent, result = _run_acquire(handle, case["replies"], grant, held)
    assert sent == case["sends"]
    assert bool(result) is (case["replies"][-1] != "timeout")
    assert handle._contention.last[0] == case["after"]
