"""The ticket connection: every waiting call of one client, on one RESP3 connection.

A waiting call is sent with ``WAIT t ASYNC ID id`` on the client's ticket connection
(one per server, or per cluster node that has waiters) and answered ``QUEUED``; its
``granted``/``timeout``/``error`` message arrives as a RESP3 push on the same connection.
Because the ``SUBSCRIBE`` of the ticket channel is written before the command on the
same socket, no grant can be missed and no round trip confirms the subscription.
When the connection's ``RLOCK.HELLO`` names ``ticket-notify``, every wait adds ``NOTIFY
tag`` (the client's own tag, drawn once per client and event loop) and subscribes the
key's channel with ``:tag`` appended, on which only this client's tickets are answered:
a handoff wakes the one client whose ticket it is, not every client with a waiter on the
key (design.md 5). Otherwise it subscribes the key's channel, as an older module wants.
Channels are counted per key, subscribed for the first waiter. After the last waiter a
tagged channel stays subscribed, idle (only this client's tickets are answered there, so
it hears nothing meanwhile), and the key's next wait sends no ``SUBSCRIBE``: at most
`IDLE_CHANNELS` per ticket connection, the one idle longest unsubscribed beyond that; a
key's shared channel, and a cluster node's shard channel (`_keeps`), is unsubscribed
after its last waiter (idle, the first would hear every other client's handoffs). One reader (a daemon thread, or an asyncio task) routes
replies, in order, to the senders and messages, by request id, to the waiters. This
mirrors the Rust client's `clients/rust/src/tickets.rs`.

What is written once here, for both front ends:

* `Book`: the routing state (replies pending in order, waiters by id, channel counts,
  orphans) and what each incoming frame means;
* `ticket_wait`: one ticketed wait as a generator over `TSub`/`TSend`/`TNote` effects
  (subscribe, send, collect the grant, resend after a broken connection, and `TPause`
  between connecting again through an outage of the server once its ticket went out).

A lock, RW lock, fenced lock, expirable or plain semaphore wait holds on its ``granted``
message (design.md 5), its reply read from the message (nil; the token or the permit ids
in its detail; 1): the reader sends the confirmation (the same command and id without
``WAIT``) and wakes the waiter at once, without waiting for its reply, which settles the
wait's `Confirm` later. A confirmation answered ``TAKENBACK`` (the connection had closed
and the server's grace ran out) reports the hold lost through its watchdog (the plain
semaphore, which has none: through its client's ledger, `rlock._permits`, which then
skips the release of those permits); one left unanswered (a broken connection, a
restarting or loading server, a moved slot) is tried again under the same request id
until a definite answer or `CONFIRM_RETRY_S` (`confirm_later`). A message whose detail
cannot be read (an older module) is collected before waking.

From a lock's ``granted`` message to its waiter running again (issue 40): threads, one
hop (the reader thread wakes the waiting thread by releasing a lock; the socket is shared
by every waiter of the client, so one thread reads it); asyncio, no hop and one loop turn
(the reader task resolves the waiter's future). On the way the reader parses the message
into a `Note`, packs and writes the confirmation (its reply slot: one lock, or one future,
and the callback that settles the hold) and puts the note; no round trip is awaited. The
confirmation is written before the wake, so it leaves before anything the holder sends.

A timed wait's round trips before its ticket is queued (taking the connection's lock,
connecting it with its handshake and probe, the ``SUBSCRIBE``, the command's ``QUEUED``)
are bounded by its deadline (`Late`): a ``blocking_timeout`` counts from the call's
start, whatever the server or the machine's load does to those hops. A command sent but
not answered by then leaves its waiter an orphan, and an answer that comes after it and
is not ``QUEUED`` (the lock was free: taken at once) is given back (`Book.answered`).

Where the connection's ``RLOCK.HELLO`` names ``ticket-quiet``, a ticket sent with
nothing else in flight goes ``QUIET`` (docs/commands/tickets.md, design.md 5): the
server writes nothing when it queues it, and answers any other outcome (granted at once,
refused, by the module or by the server itself: ``MOVED``, ``OOM``, ``LOADING``) with its
one reply. Its entry in the replies due (`Book.pending`) may get one reply or none, so
anything written behind it while it is unanswered goes behind a fence, ``RLOCK.HELLO``,
whose map tells the two apart (`Book.expect`, `Book.frame`); its message takes the entry
out. The waiter takes a quiet ticket as ``QUEUED``, and its reply, if one comes, as an
`Answered` note in its mailbox, as it would take the reply of a ticket sent without
``QUIET``; an orphan's is given back as `Book.answered` gives a late reply back.

`SyncTicketConn` and `AsyncTicketConn` are the two thin I/O shells (thread + lock,
task + asyncio lock). A waiter that leaves while its ticket may still be queued (a
cancelled task, KeyboardInterrupt, its deadline come on the client's clock first) stays
registered as an orphan: if its grant comes after all, it is collected and given back
(`_proto.undo_args`); a ticket that times out or errs is simply forgotten.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Generator, List, Optional, Set, Tuple

from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._hello import HELLO_ARGS, Capabilities, parse_hello
from ._proto import (CONNECTION_NAME, LOST, Note, Shape, may_be_grant, note_action,
                     parse_note, redirected, ticket_channel, undo_args)

log = logging.getLogger("rlock")

#: Attempts of one ticketed wait whose ticket connection breaks (the first included).
TICKET_ATTEMPTS = 3

#: A wait whose ticket went out keeps connecting through an outage of its server (a
#: restart that reloads the AOF keeps a grant made before it, and only the same request id
#: sent again finds it): pauses from AWAY_FIRST doubling to AWAY_MAX seconds, until the
#: wait's own limit, or AWAY_UNTIMED seconds after the outage began for a wait without one.
AWAY_FIRST = 0.01
AWAY_MAX = 0.2
AWAY_UNTIMED = 5.0

#: Tagged ticket channels kept subscribed after their last waiter left, per ticket
#: connection to one server (not a cluster node's: `_keeps`): a process waiting on one lock at a time saves a
#: SUBSCRIBE and an UNSUBSCRIBE per acquisition, and one touching many keys holds no more
#: subscriptions than this (the one idle longest goes first).
IDLE_CHANNELS = 64

#: How much sooner than the client's own deadline a timed ticket's wait ends in the
#: server (at most a quarter of the wait), so that its `timeout` message is normally in
#: before that deadline: the client then knows its ticket gone, and leaves no orphan.
TIMEOUT_LEAD_MS = 10


#: How early a timeout set for a deadline may fire on the clock that set it (an event
#: loop runs a timer within its clock's resolution): a failure that close to a wait's
#: deadline is the deadline's (`ticket_wait`).
CLOCK_SLACK_S = 0.005


class Late(Exception):
    """The wait's deadline came before the connection, its lock or a reply did (a
    timed wait's round trips before its ticket is queued are bounded by its deadline:
    `ticket_wait`). ``sent``: the command went out (its ticket may be queued)."""

    def __init__(self, sent: bool = False) -> None:
        super().__init__("sent" if sent else "not sent")
        self.sent = sent


class Fallback(Exception):
    """Wait the blocking way instead: the server's capability probe names no tickets
    (``refused``: no module, or one without tickets), or the key's slot moved to another
    node (a cluster migration) and the cluster client's own redirection should take the
    rest of the wait."""

    def __init__(self, refused: bool) -> None:
        super().__init__("refused" if refused else "redirected")
        self.refused = refused


# ---- effects of a ticketed wait -------------------------------------------------------


@dataclass(frozen=True)
class TSub:
    """Hold a reference to ``key``'s ticket channel (subscribing it on first use). The
    connection answers the ``NOTIFY`` tag the wait is to send (its channel is the one
    subscribed), or None (no ``ticket-notify`` in its ``RLOCK.HELLO``: the key's own
    channel). ``until``: the wait's deadline (`time.monotonic`), past which the shell
    raises `Late` rather than wait for the connection or the subscription."""

    key: bytes
    until: Optional[float] = None


@dataclass(frozen=True)
class TPause:
    """Sleep ``seconds`` before connecting again: the server is away."""

    seconds: float


@dataclass(frozen=True)
class TSend:
    """Send ``args``; the reply comes back. ``note_id``: register for its messages first;
    ``collect``: the command that collects a grant (or looks after a timeout), which the
    reader sends the moment the message arrives, before waking the waiter; ``hold``: the
    wait holds on its grant (a `Confirm`): the reader wakes it at once and the collect's
    reply settles ``hold``."""

    args: Tuple[Any, ...]
    note_id: Optional[str] = None
    collect: Optional[Tuple[Any, ...]] = None
    hold: Any = None
    #: The wait's deadline, past which the shell raises `Late`: a ticket whose ``QUEUED``
    #: is not in by then may still be queued (or answered at once: `Book.answered`).
    until: Optional[float] = None


class Confirm:
    """A grant held on its ``granted`` message and confirmed off the holder's path: its
    outcome, and what to run if it was taken back (the watchdog's lost report) or once it
    is settled either way (a plain semaphore's release waiting for it), whichever comes
    first."""

    def __init__(self, shape: Optional[Shape] = None) -> None:
        self._lock = threading.Lock()
        #: True: confirmed; False: lost (taken back, refused, or no answer in time).
        self.outcome: Optional[bool] = None
        #: The server answered ``TAKENBACK``: it gave the grant back itself (a plain
        #: semaphore's permits are back in its count). False for a grant merely in doubt.
        self.taken_back = False
        self._hook: Optional[Callable[[], Any]] = None
        self._then: List[Callable[[], Any]] = []
        #: The wait's shape, which reads the grant's reply from its message.
        self.shape = shape

    def holds_on(self, note: Note) -> bool:
        """Whether ``note`` is a grant its waiter holds on (its reply readable from it);
        the waiter collects otherwise."""
        return note.kind == "granted" and (
            self.shape is None or self.shape.held_reply(note.detail)[0])

    def on_taken_back(self, hook: Callable[[], Any]) -> None:
        """Runs ``hook`` once if the grant turns out taken back (at once if it was)."""
        with self._lock:
            if self.outcome is None:
                self._hook = hook
                return
        if self.outcome is False:
            hook()

    def when_settled(self, fn: Callable[[], Any]) -> None:
        """Runs ``fn`` once the outcome is known (at once if it is), on the thread or
        loop that settles it."""
        with self._lock:
            if self.outcome is None:
                self._then.append(fn)
                return
        fn()

    def settle(self, confirmed: bool, taken_back: bool = False) -> None:
        with self._lock:
            if self.outcome is not None:
                return
            self.taken_back = taken_back and not confirmed
            self.outcome = confirmed
            hook, self._hook = self._hook, None
            then, self._then = self._then, []
        if not confirmed and hook is not None:
            hook()
        for fn in then:
            fn()

    def settle_with(self, reply: Any) -> None:
        """Settles from a definite reply to the confirmation: the grant's reply (kept) or
        a refusal (lost; ``TAKENBACK``: given back by the server)."""
        self.settle(not isinstance(reply, Exception), taken_back=is_taken_back(reply))


def is_taken_back(reply: Any) -> bool:
    """A confirmation answered ``TAKENBACK``: the grant's connection closed unconfirmed and
    the server gave the grant back after its grace (design.md 5)."""
    return isinstance(reply, ResponseError) and str(reply).startswith("TAKENBACK")


@dataclass(frozen=True)
class TCollect:
    """The reply to the collecting command for ``id`` (sent by the reader already, or
    now: ``args``)."""

    id: str
    args: Tuple[Any, ...]


@dataclass(frozen=True)
class RanOut:
    """What `ticket_wait` ends with when the client's deadline came before any message:
    ``reply``, the command's "not now" reply. Its ticket may still be queued (or its
    grant on its way), so the waiter leaves as an orphan: a late grant is collected and
    given back, never left held by a caller that was told no."""

    reply: Any


@dataclass(frozen=True)
class TNote:
    """The next message for ``id`` (a `Note`), or None after ``timeout`` seconds."""

    id: str
    timeout: Optional[float]


def ticket_wait(shape: Shape, started: float) -> Generator[Any, Any, Any]:
    """One ticketed wait, from subscription to the command's ordinary reply.

    A timed wait ends at its own deadline (``started`` plus the wait) on this client's
    clock: with a `RanOut` if no message came by then. Raises `Fallback` when the key's
    slot left the node (the connection raises it when its capability probe names no
    tickets), and a server error as ``ResponseError``.
    """
    attempts = 0
    # A command of ours went out (a ticket may be queued or granted); while the server is
    # away, until when the wait connects again, and its next pause.
    out = False
    away_until: Optional[float] = None
    pause = AWAY_FIRST
    total = shape.wait_left(0)
    limit = started + total / 1000 if total else 0.0
    while True:
        try:
            # Asked again after a broken connection: the new one's probe decides. Until a
            # command of ours went out, the connecting and subscribing are bounded by the
            # wait's deadline (a blocking_timeout counts from the call's start).
            tag = yield TSub(shape.key, None if out else (limit or None))
        except Late:
            return shape.ran_out()  # nothing of ours was sent: a plain no
        except ResponseError as e:
            if redirected(str(e)):
                raise Fallback(refused=False) from e
            raise
        except (ConnectionError, RedisTimeoutError):
            if not out:
                if limit and time.monotonic() >= limit - CLOCK_SLACK_S:
                    return shape.ran_out()  # connecting timed out at the deadline
                raise
            now = time.monotonic()
            if away_until is None:
                away_until, pause = limit or now + AWAY_UNTIMED, AWAY_FIRST
            if now + pause >= away_until:
                raise
            yield TPause(pause)
            pause = min(2 * pause, AWAY_MAX)
            continue
        # After the subscription: a first wait's connecting counts against its wait.
        left = shape.wait_left(time.monotonic() - started)
        try:
            if left is None:  # the wait is over: one look (a grant may be remembered)
                if not out:
                    return shape.ran_out()
                return (yield TSend(tuple(shape.with_wait(None, False))))
            look = None if shape.latch else tuple(shape.with_wait(None, False))
            out = True
            lead = TIMEOUT_LEAD_MS if shape.lead_ms is None else shape.lead_ms
            server_ms = left - min(lead, left // 4)
            reply = yield TSend(tuple(shape.with_wait(server_ms, True, tag)), shape.id, look,
                                shape.confirm, limit or None)
            away_until = None  # answered: the server is back
        except Late as e:
            if not e.sent:
                return shape.ran_out()
            # Sent, not answered by the deadline: queued maybe, or answered at once (a
            # grant); the waiter leaves as an orphan and a late grant is given back.
            return RanOut(shape.ran_out())
        except (ConnectionError, RedisTimeoutError):
            attempts += 1
            if attempts >= TICKET_ATTEMPTS:
                raise
            continue
        except ResponseError as e:
            if redirected(str(e)):
                raise Fallback(refused=False) from e
            raise
        if reply not in (b"QUEUED", "QUEUED"):
            shape.at_once = True  # answered with the reply itself: it was free
            return reply
        # The server counts its wait from the command's arrival, and its `timeout` message
        # takes hops back (server, reader, waiter), each waiting for a CPU on a loaded
        # machine: it ends TIMEOUT_LEAD_MS sooner, and the wait ends at our deadline, by
        # our clock, whatever has been heard by then.
        until = None if left == 0 else started + shape.wait_ms / 1000
        note = yield TNote(shape.id, None if until is None
                           else max(0.0, until - time.monotonic()))
        if note is None:
            return RanOut(shape.ran_out())
        if isinstance(note, Answered):
            # A quiet ticket's own reply (it was not queued): what a ticket sent without
            # QUIET would have been answered, taken the same way.
            if isinstance(note.reply, ResponseError):
                if redirected(str(note.reply)):
                    raise Fallback(refused=False) from note.reply
                raise note.reply
            if isinstance(note.reply, Exception):
                raise note.reply
            shape.at_once = True
            return note.reply
        if note.kind == "lost":
            attempts += 1
            if attempts >= TICKET_ATTEMPTS:
                raise ConnectionError("the ticket connection broke while waiting")
            continue  # resubscribe and queue again with the same id (a grant is replayed)
        if note.kind == "timeout" and attempts == 0:
            # Removed, nothing granted: the reply of a wait that ran out, without a
            # collect's round trip. (After a broken connection the same id may have been
            # granted on the old one: the collect below replays that.)
            return shape.ran_out()
        action = note_action(note)
        if action == "granted" and shape.latch:
            return 1
        if action == "granted" and shape.confirm is not None:
            held, reply = shape.held_reply(note.detail)
            if held:  # the grant's reply, read from the message; the reader confirms it
                shape.held_on_message = True
                return reply
        if action in ("granted", "collect"):
            # Collect: the same command and id without WAIT replays the grant (or, after
            # a timeout, answers the ordinary reply of a wait that ran out).
            return (yield TCollect(shape.id, tuple(shape.with_wait(None, False))))
        if redirected(note.detail):
            raise Fallback(refused=False)
        raise ResponseError(note.detail)


# ---- routing state ------------------------------------------------------------------


class _Push(list):
    """A RESP3 push frame, told apart from a reply by its type."""


#: The reply a ticket's command is given by the shell when it went ``QUIET``: treated as
#: ``QUEUED`` (its message answers it, or its own reply comes as an `Answered` note).
QUEUED = b"QUEUED"


@dataclass(frozen=True)
class Answered(Note):
    """The reply to a ``QUIET`` ticket, which the server did not queue (granted at once,
    refused, replayed), delivered to its waiter's mailbox: ``reply`` (the error raised
    for a refusal). Its kind is ``error`` for a refusal, ``reply`` otherwise (a grant,
    maybe: `Book.leave` gives it back if the waiter is gone)."""

    reply: Any = None


class _Quiet:
    """In `Book.pending`: a ``QUIET`` ticket of waiter ``id``, which gets one reply (not
    queued) or none (queued: its message is its answer)."""

    __slots__ = ("id",)
    sub = False

    def __init__(self, note_id: str) -> None:
        self.id = note_id

    def put(self, value: Any) -> None:  # the connection broke: its waiter is told LOST
        pass


class _Fence:
    """In `Book.pending`: the ``RLOCK.HELLO`` written behind an unanswered quiet ticket
    before anything else; its reply (a map with ``module``) tells whether a reply read
    in front of it was the ticket's."""

    __slots__ = ()
    sub = False

    def put(self, value: Any) -> None:
        pass


_FENCE = _Fence()


class OutOfStep(Exception):
    """A reply read in a fence's turn is not the fence's: no reply after it can be placed;
    the shell closes the connection (its waiters send again, as on any broken one)."""


def _fence_answer(frame: Any) -> bool:
    """Whether ``frame`` is ``RLOCK.HELLO``'s reply (a map with ``module``), which no
    waiting command answers."""
    return isinstance(frame, dict) and (b"module" in frame or "module" in frame)


_SUB_KINDS = {b"subscribe", b"ssubscribe", b"unsubscribe", b"sunsubscribe"}
_MSG_KINDS = {b"message", b"smessage"}


class Book:
    """What a ticket connection knows: replies due in order, waiters by request id,
    channel reference counts, orphans. Pure state; the shells hold a lock around it.

    ``slot`` makes a one-shot reply slot (``put(value)``), ``mailbox`` a note queue
    (``put(note)``), so that the same routing serves threads and asyncio.
    """

    def __init__(self, slot: Callable[[bool], Any], mailbox: Callable[[], Any]) -> None:
        self.slot = slot
        self.mailbox = mailbox
        self.pending: Deque[Any] = deque()
        self.notes: Dict[str, Any] = {}
        # The ticket channel of each waiter in `notes` (see `moved`).
        self.note_channels: Dict[str, bytes] = {}
        self.channels: Dict[bytes, int] = {}
        # The referenced channels that stay subscribed after their last waiter: tagged
        # ones (``NOTIFY tag``), where only our tickets are answered.
        self.keep: Set[bytes] = set()
        # Tagged channels nobody waits on, kept subscribed (oldest first) so that the next
        # wait on the key needs no SUBSCRIBE; at most IDLE_CHANNELS of them. Forgotten with
        # their connection (never subscribed again on a new one) or when the server drops
        # them (`moved`).
        self.idle: "OrderedDict[bytes, None]" = OrderedDict()
        self.orphans: Dict[str, Tuple[List[Any], bytes]] = {}
        self.gen = 0
        #: Ticket messages heard (every one, for any waiter or none): what a client that
        #: shares a key's channel with others pays for their handoffs.
        self.heard = 0
        #: The connection's probe named ``ticket-quiet``: a ticket sent with nothing else
        #: in flight goes ``QUIET`` (`expect`). Set by the shell on each connect.
        self.quiet = False
        #: Fences written (`expect`): one per quiet ticket another command followed.
        self.fences = 0

    def expect(self, sub: bool = False, ticket: Optional[str] = None
               ) -> Tuple[Optional[Any], bool, bool]:
        """Registers the reply (or replies) the next command written expects, in order;
        returns (its slot, None for a quiet ticket; whether ``RLOCK.HELLO`` goes in front
        of it, as the fence; whether it goes ``QUIET``). ``ticket``: the command is the
        ticket of waiter ``ticket``, which goes ``QUIET`` where the probe named
        ``ticket-quiet`` and nothing else is in flight (then the server has nothing to
        write until its message). Anything written while the last entry is a quiet
        ticket still unanswered is fenced: a reply read in that ticket's turn may be its
        own (granted at once, or a refusal the server gives before the module runs:
        ``MOVED``, ``OOM``, ``LOADING``) or the next command's."""
        quiet = ticket is not None and self.quiet and not self.pending
        fence = bool(self.pending) and isinstance(self.pending[-1], _Quiet)
        if fence:
            self.pending.append(_FENCE)
            self.fences += 1
        if quiet:
            self.pending.append(_Quiet(ticket))  # type: ignore[arg-type]
            return None, fence, True
        slot = self.slot(sub)
        self.pending.append(slot)
        return slot, fence, False

    def _reply(self, frame: Any) -> Optional[Tuple[Any, Any]]:
        """A reply (not a push) read: to the head of `pending`. Raises `OutOfStep`."""
        head = self.pending.popleft()
        if isinstance(head, _Quiet):
            if self.pending and self.pending[0] is _FENCE and _fence_answer(frame):
                self.pending.popleft()  # the fence's: the ticket was queued, and silent
                return None
            return self.quiet_answered(head.id, frame)
        if head is _FENCE:
            if not _fence_answer(frame):
                raise OutOfStep(f"the fence was answered {frame!r}")
            return None
        head.put(frame)
        return None

    def quiet_answered(self, note_id: str, reply: Any) -> Optional[Tuple[Any, Any]]:
        """A quiet ticket's own reply (it was not queued, so no message follows): to its
        waiter's mailbox as an `Answered` note, taken as the reply of a ticket sent
        without ``QUIET`` would be; an orphan's as `answered` takes a late reply (a grant
        given back, an error forgotten)."""
        box = self.notes.get(note_id)
        if box is None:
            return self.answered(note_id, reply)
        failed = isinstance(reply, Exception)
        box.put(Answered("error" if failed else "reply", note_id, reply=reply))
        return None

    def unquiet(self, note_id: str) -> None:
        """A ticket with a message was queued: its quiet entry, if any, expects nothing
        more (a fence behind it still answers in its turn)."""
        for entry in self.pending:
            if isinstance(entry, _Quiet) and entry.id == note_id:
                self.pending.remove(entry)
                return

    def frame(self, frame: Any) -> Optional[Tuple[Any, Any]]:
        """Routes one frame read. For an orphan's message returns ``(look, channel)``:
        ``look`` (if granted) is to be collected and given back and ``channel``
        unreferenced, by the shell, outside its lock. For a waiter's grant (or timeout)
        returns ``(mailbox, note)``: the shell sends ``mailbox.look`` at once and delivers
        the note when its reply is in (``mailbox.collect``), so that the waiter wakes once,
        with its answer, instead of waking to send the collect and again for its reply."""
        if isinstance(frame, _Push) and frame:
            kind = bytes(frame[0]).lower()
            if kind in _MSG_KINDS and len(frame) >= 3:
                self.heard += 1
                note = parse_note(frame[2])
                if note is None:
                    return None
                if self.pending:
                    self.unquiet(note.id)
                box = self.notes.get(note.id)
                if box is not None:
                    if note_action(note) != "fail" and box.look is not None \
                            and note.kind != "timeout":
                        # The shell sends box.look, then delivers (a holder: at once).
                        # A timeout is delivered as it is (`ticket_wait` collects only
                        # after a broken connection).
                        # Heard already, for a waiter whose deadline comes meanwhile.
                        box.heard = note
                        return box, note
                    box.put(note)
                    return None
                orphan = self.orphans.pop(note.id, None)
                if orphan is None:
                    return None
                look, channel = orphan
                # The orphan's channel reference is released now (see `leave`).
                return (look if may_be_grant(note) else None), channel
            if kind in _SUB_KINDS:
                # The confirmation of our (un)subscribe; an unsolicited sunsubscribe (a
                # slot that left the node) finds no subscribe slot at the head.
                if self.pending and self.pending[0].sub:
                    self.pending.popleft().put(None)
                elif kind == b"sunsubscribe" and len(frame) >= 2:
                    self.moved(bytes(frame[1]))
                return None
            return None
        if self.pending:
            return self._reply(frame)
        return None

    def answered(self, note_id: str, reply: Any) -> Optional[Tuple[Any, Any]]:
        """The reply to a ticket's command that came after its waiter's deadline (`Late`).
        ``QUEUED``: its messages decide, as for any orphan. Anything else answered at once
        and no message follows: a grant maybe (the lock was free), or an error. Returns an
        orphan's ``(look, channel)`` as `frame` does (``look`` None for an error); for a
        waiter not gone yet, marks what it heard so that `leave` gives a grant back."""
        if reply in (b"QUEUED", "QUEUED"):
            return None
        failed = isinstance(reply, Exception)
        orphan = self.orphans.pop(note_id, None)
        if orphan is not None:
            return (None if failed else orphan[0]), orphan[1]
        box = self.notes.get(note_id)
        if box is not None and box.heard is None:
            box.heard = Note("error" if failed else "granted", note_id)
        return None

    def register(self, note_id: str, box: Any, channel: Optional[bytes]) -> None:
        """A waiter's mailbox, before its ticket is sent (``channel``: the ticket channel
        its messages come on)."""
        self.notes[note_id] = box
        if channel is not None:
            self.note_channels[note_id] = channel

    def moved(self, channel: bytes) -> None:
        """The server dropped our subscription to ``channel`` by itself: the key's slot
        left the node (an atomic slot migration, Valkey 9). A ticket queued there is
        answered ``MOVED`` on that channel, which we no longer hear: its waiters are told
        here instead, and wait on the slot's new owner (`Fallback`). The source never
        grants a ticket of a slot it no longer serves."""
        self.channels.pop(channel, None)
        self.keep.discard(channel)
        self.idle.pop(channel, None)
        note = f"MOVED (the slot of {channel.decode(errors='replace')} left the node)"
        for note_id, ch in list(self.note_channels.items()):
            box = self.notes.get(note_id)
            if ch == channel and box is not None:
                box.put(Note("error", note_id, b"", note))

    def last_due(self) -> Optional[Any]:
        """The newest reply slot still due (not a quiet ticket's entry, which may never be
        answered, nor a fence's): replies come in order, so once it is put, every reply
        written before it is in. What a close waits for (`CLOSE_DRAIN_S`)."""
        for entry in reversed(self.pending):
            if not isinstance(entry, (_Quiet, _Fence)):
                return entry
        return None

    def lost(self) -> None:
        """The connection broke: replies fail (a holder's confirmation too: reported
        lost), waiters are told, the server has dropped our tickets and takes back
        unconfirmed grants after its grace, so orphans are done."""
        error = ConnectionError("the ticket connection broke")
        while self.pending:
            self.pending.popleft().put(error)
        for box in self.notes.values():
            box.put(LOST)
        self.channels.clear()
        self.keep.clear()
        self.idle.clear()
        self.orphans.clear()
        self.gen += 1

    def ref(self, channel: bytes, keep: bool = False) -> bool:
        """Takes a reference to ``channel``; True if it must be subscribed now (not
        referenced, nor idle: a live subscription on this connection, so no grant on it
        can be missed). ``keep``: a tagged channel, which stays subscribed, idle, after
        its last reference."""
        count = self.channels.get(channel, 0)
        self.channels[channel] = count + 1
        if count:
            return False
        if keep:
            self.keep.add(channel)
        return self.idle.pop(channel, False) is False

    def unref(self, channel: bytes, gen: int) -> Optional[bytes]:
        """Drops a reference (taken on connection generation ``gen``); returns a channel
        to unsubscribe now, if any: the channel itself after its last reference unless it
        is tagged, or the one idle longest once more than `IDLE_CHANNELS` are."""
        if gen != self.gen or channel not in self.channels:
            return None
        self.channels[channel] -= 1
        if self.channels[channel]:
            return None
        del self.channels[channel]
        if channel not in self.keep:
            return channel
        self.keep.discard(channel)
        self.idle[channel] = None
        if len(self.idle) > IDLE_CHANNELS:
            return self.idle.popitem(last=False)[0]
        return None

    def forget(self, channel: bytes) -> None:
        """A subscription that failed: no reference, not idle."""
        if self.channels.get(channel, 0) <= 1:
            self.channels.pop(channel, None)
            self.keep.discard(channel)
        else:
            self.channels[channel] -= 1

    def unsubscribe_due(self, channel: bytes, gen: int) -> bool:
        """Whether an unsubscribe of ``channel`` decided on connection generation ``gen``
        is still due when it is written (an asyncio task, later): not if a wait referenced
        the channel since (its ``SUBSCRIBE`` went out already, before this one would), nor
        on a new connection."""
        return gen == self.gen and channel not in self.channels and channel not in self.idle

    def leave(self, note_id: str, look: Optional[List[Any]],
              subs: List[Tuple[bytes, int]]) -> Tuple[Optional[List[Any]], List[bytes]]:
        """A waiter leaves and drops its channel references (``subs``: each channel it
        subscribed and on which connection generation, the last one its ticket's). With
        ``look`` (its ticket may still be queued) it becomes an orphan that keeps its
        reference to the last channel until its message comes. Returns (``look`` if its
        grant already came, the channels to unsubscribe now)."""
        box = self.notes.pop(note_id, None)
        self.note_channels.pop(note_id, None)
        due = None
        kept = False
        if look is not None and subs:
            if box is not None and any(may_be_grant(n) for n in box.items()):
                due = look
            elif box is None or not any(n.kind in ("timeout", "error", "lost")
                                        for n in box.items()):
                self.orphans[note_id] = (look, subs[-1][0])
                kept = True
        stale = [self.unref(c, g) for c, g in (subs[:-1] if kept else subs)]
        return due, [c for c in stale if c is not None]


def _queue_on(book: Book, sub: Optional[Tuple[bytes, int]]) -> Optional[bytes]:
    """The channel a ticket about to be sent is answered on (``sub``: the channel its
    wait subscribed and the connection generation then). A connection that broke since
    then would queue the ticket on a new connection subscribed to nothing (and maybe to
    another server, whose probe may say otherwise): the wait subscribes again instead
    (`ticket_wait`'s retry of a broken connection)."""
    if sub is None:
        return None
    channel, gen = sub
    if gen != book.gen:
        raise ConnectionError("the ticket connection broke")
    return channel


def _keeps(tag: Optional[str], shard: bool) -> bool:
    """Whether a channel stays subscribed, idle, after its last waiter: a tagged one (only
    this client's grants come there), and only on one server's connection. A cluster
    node drops a shard channel by itself when the key's slot leaves (Valkey's atomic slot
    migration); an idle one whose drop went unheard would leave a later waiter deaf to
    its grant once the slot came back (the Rust client's idle shard channels lost grants
    so in the fault harness's `migrate` cell), so there it is unsubscribed as before."""
    return tag is not None and not shard


def _commands(args: Tuple[Any, ...], fence: bool, quiet: bool) -> List[Tuple[Any, ...]]:
    """What one write carries (`Book.expect`): the fence (``RLOCK.HELLO``) first if due,
    then ``args``, with ``QUIET`` last for a quiet ticket."""
    out: List[Tuple[Any, ...]] = [HELLO_ARGS] if fence else []
    out.append(tuple(args) + ("QUIET",) if quiet else tuple(args))
    return out


def _sub_command(shard: bool, on: bool) -> str:
    if shard:
        return "SSUBSCRIBE" if on else "SUNSUBSCRIBE"
    return "SUBSCRIBE" if on else "UNSUBSCRIBE"


def _conn_kwargs(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """A client's connection arguments for the ticket connection: RESP3, no socket
    timeout (its reader waits for messages as long as waiters wait), named."""
    out = dict(kwargs)
    for k in ("retry", "retry_on_timeout", "retry_on_error", "health_check_interval",
              "redis_connect_func", "parser_class", "connection_pool", "cache",
              "cache_config"):
        out.pop(k, None)
    out.update(protocol=3, socket_timeout=None, client_name=CONNECTION_NAME)
    return out


def _ticket_conns(kwargs: Dict[str, Any], connection_class: Any,
                  parser: Any) -> Callable[[Optional[float]], Any]:
    """Makes ticket connections; one made for a wait with a deadline (``until``, on
    `time.monotonic`) has its connecting and first replies (the handshake, the probe)
    bounded by it, the shell lifting the bound once connected (`_unbound`)."""
    base = _conn_kwargs(kwargs)
    connect_s = kwargs.get("socket_connect_timeout")

    def make(until: Optional[float]) -> Any:
        if until is None:
            return connection_class(parser_class=parser, **base)
        left = until - time.monotonic()
        if left <= 0:
            raise Late()
        return connection_class(parser_class=parser, **dict(
            base, socket_timeout=left, socket_connect_timeout=min(left, connect_s or left)))
    return make


def _late(until: Optional[float]) -> Optional[float]:
    """What is left before ``until`` (None: no limit); raises `Late` when nothing is."""
    if until is None:
        return None
    left = until - time.monotonic()
    if left <= 0:
        raise Late()
    return left


def _confirm_conns(kwargs: Dict[str, Any], connection_class: Any,
                   parser: Any) -> Callable[[Optional[Tuple[str, int, bool]], float], Any]:
    """Makes the connections of a late confirmation (`confirm_later`): to ``target``
    (host, port, asking), or to the ticket connection's own server when it is None, with
    this connection's settings and its socket timeouts cut to ``timeout`` seconds (what
    is left of the confirmation's time)."""
    base = _conn_kwargs(kwargs)
    read_s, connect_s = kwargs.get("socket_timeout"), kwargs.get("socket_connect_timeout")

    def make(target: Optional[Tuple[str, int, bool]], timeout: float) -> Any:
        over = dict(base, socket_timeout=min(timeout, read_s or timeout),
                    socket_connect_timeout=min(timeout, connect_s or timeout))
        if target is not None:
            over.update(host=target[0], port=target[1])
        return connection_class(parser_class=parser, **over)
    return make


def _probed(reply: Any) -> Capabilities:
    """What a new ticket connection's ``RLOCK.HELLO`` said (its reply, or the error it
    raised); raises `Fallback` (refused) when it names no tickets, or when the server
    refuses the probe itself (an ACL without ``rlock.hello``): what cannot be learnt is
    not assumed, and a blocked wait works wherever the module is."""
    try:
        caps = parse_hello(reply)
    except ResponseError as e:
        raise Fallback(refused=True) from e
    if not caps.tickets:
        raise Fallback(refused=True)
    return caps


def notify_tag(tag: Optional[str], caps: Optional[Capabilities]) -> Optional[str]:
    """The ``NOTIFY`` tag a wait sends: the client's, when the connection's latest
    ``RLOCK.HELLO`` names ``ticket-notify`` (an older module refuses the option); None
    otherwise (the key's own channel)."""
    if tag is not None and caps is not None and caps.has("ticket-notify"):
        return tag
    return None


def _undo_calls(look: List[Any], reply: Any) -> List[List[Any]]:
    return undo_args(look, reply)


def _may_hold(shape: Shape, caps: Optional[Capabilities]) -> None:
    """Once subscribed (connected, so ``caps`` is the connection's ``RLOCK.HELLO``): a
    lock's wait holds on its ``granted`` message if the server names ``ticket-holds`` (a
    ``granted`` message means held, an unconfirmed grant outlives its connection for a
    grace and then answers ``TAKENBACK``); it collects first otherwise."""
    if shape.holds and shape.confirm is None and caps is not None \
            and caps.has("ticket-holds"):
        shape.confirm = Confirm(shape)


#: How long a grant held on its message is confirmed once the first confirmation went
#: unanswered (its connection broke, the server restarting or still loading, the grant's
#: slot moved on): until a definite answer (the grant: kept; ``TAKENBACK`` or another
#: refusal: lost) or this many seconds (lost). Longer than the server's grace
#: (``rlock.ticket-confirm-ms``, 1 s) on purpose: a server that took the grant back
#: answers ``TAKENBACK`` from then on, so trying longer never keeps a hold the server gave
#: away, and a server down for longer than the grace reloads the grant from its AOF and
#: answers it. Between tries of one place: AWAY_FIRST doubling to AWAY_MAX seconds.
CONFIRM_RETRY_S = 5.0
#: How long a close waits for the replies to what its connection has written (a grant's
#: confirmation, above all): the server answered them, or is about to, and a reply cut
#: off by the close would leave a standing hold unsettled (tried again on a connection of
#: its own, or, once closed, reported lost). A bound for a server that stopped answering,
#: not a pause: the replies normally take a round trip.
CLOSE_DRAIN_S = 1.0
#: How long a blocking client's close waits for each reader thread to end (it ends as
#: soon as its socket is shut down: a bound, not a pause).
CLOSE_JOIN_S = 5.0


@dataclass(frozen=True)
class CTry:
    """One try of a late confirmation: ``args`` on a new connection to ``target`` (host,
    port, asking; None: the ticket connection's server), bounded by ``timeout`` seconds;
    its reply, or the error it raised, comes back."""

    target: Optional[Tuple[str, int, bool]]
    args: Tuple[Any, ...]
    timeout: float


def _redirect(reply: Any) -> Optional[Tuple[str, int, bool]]:
    """Where a redirected reply sends the command: (host, port, asking) for ``MOVED`` and
    ``ASK``; ("", 0, False) to send it again where it went (``TRYAGAIN``,
    ``CLUSTERDOWN``); None when the reply is not a redirection."""
    if not isinstance(reply, ResponseError):
        return None
    words = str(reply).split()
    if words[:1] in (["MOVED"], ["ASK"]) and len(words) >= 3:
        host, _, port = words[2].rpartition(":")
        return host, int(port), words[0] == "ASK"
    if words[:1] in (["TRYAGAIN"], ["CLUSTERDOWN"]):
        return "", 0, False
    return None


def _again(reply: Any) -> Optional[Tuple[str, int, bool]]:
    """Where a confirmation's reply says to try again (as `_redirect`), also when it was
    no answer (a broken or refused connection, a timeout) or ``LOADING`` (a restarted
    server still reading its AOF, where the grant may be): the same place, after a pause.
    None: the reply is definite."""
    if isinstance(reply, (ConnectionError, RedisTimeoutError)):  # BusyLoadingError too
        return "", 0, False
    if isinstance(reply, ResponseError) and str(reply).startswith("LOADING"):
        return "", 0, False
    return _redirect(reply)


def confirm_later(reply: Any, look: Tuple[Any, ...]) -> Generator[Any, Any, Any]:
    """A held grant's confirmation that ``reply`` left unsettled (see `_again`), as a
    generator over `CTry`/`TPause` effects: the same command and request id (``look``),
    sent again on connections of its own, to the node a ``MOVED``/``ASK`` names, within
    `CONFIRM_RETRY_S`. Returns the definite reply (for `Confirm.settle_with`), or a
    ``ConnectionError`` when none came in time (in doubt: lost, not taken back)."""
    deadline = time.monotonic() + CONFIRM_RETRY_S
    target: Optional[Tuple[str, int, bool]] = None
    pause = AWAY_FIRST
    tried = False
    while True:
        where = _again(reply)
        if where is None:
            return reply
        if where[0]:
            target = where
        elif tried:  # the same place again: a broken connection is usually back at
            # once, a restarting server takes a while
            left = deadline - time.monotonic()
            if left <= 0:
                return _NO_ANSWER
            yield TPause(min(pause, left))
            pause = min(2 * pause, AWAY_MAX)
        left = deadline - time.monotonic()
        if left <= 0:
            return _NO_ANSWER
        reply = yield CTry(target, look, left)
        tried = True


#: What `confirm_later` ends with when no definite answer came within `CONFIRM_RETRY_S`.
_NO_ANSWER = ConnectionError("no answer to the confirmation within its retry limit")


def _settle(hold: Any, reply: Any, look: Tuple[Any, ...],
            later: Callable[[Any, Any, Tuple[Any, ...]], None]) -> None:
    """Settles a holder's confirmation from its reply; one that leaves it open (see
    `_again`) is tried again off the reader's path (``later``: a thread, or a task),
    rather than reporting a hold that may still stand lost."""
    if _again(reply) is None:
        hold.settle_with(reply)
    else:
        later(hold, reply, look)


def _confirm(box: Any, note: Note, send: Callable[[Tuple[Any, ...]], Any],
             later: Callable[[Any, Any, Tuple[Any, ...]], None]) -> None:
    """A holder's grant (threads; the reader, under the lock): the confirmation is
    written first (a socket write, no round trip), then the holder woken; its reply
    settles ``box.hold`` later. Not sent (a broken connection): tried again (`_settle`)."""
    hold = box.hold
    try:
        slot = send(box.look)
    except Exception as e:  # noqa: BLE001 - unconfirmed: tried on a new connection
        _settle(hold, e, box.look, later)
    else:
        slot.then = lambda: _settle(hold, slot.value, box.look, later)
    box.put(note)


# ---- threads ------------------------------------------------------------------------


def _sync_confirmer(make: Callable[[Optional[Tuple[str, int, bool]], float], Any]
                    ) -> Callable[[Any, Any, Tuple[Any, ...]], None]:
    """Runs `confirm_later` on a thread of its own (rare), with connections from ``make``
    (`_confirm_conns`)."""
    def run(hold: Any, reply: Any, look: Tuple[Any, ...]) -> None:
        gen = confirm_later(reply, look)
        value: Any = None
        try:
            while True:
                effect = gen.send(value)
                if isinstance(effect, TPause):
                    time.sleep(effect.seconds)
                    value = None
                else:
                    value = _try_sync(make(effect.target, effect.timeout), effect)
        except StopIteration as done:
            hold.settle_with(done.value)
        except Exception:  # noqa: BLE001 - unsettled: reported lost
            log.exception("rlock: a late ticket confirmation failed")
            hold.settle(False)

    def later(hold: Any, reply: Any, look: Tuple[Any, ...]) -> None:
        threading.Thread(target=run, args=(hold, reply, look), daemon=True,
                         name="rlock-tickets-confirm").start()
    return later


def _try_sync(conn: Any, effect: CTry) -> Any:
    """One `CTry`: the reply, or the error (a server's, or no answer)."""
    try:
        conn.connect()
        if effect.target is not None and effect.target[2]:
            conn.send_command("ASKING")
            conn.read_response()
        conn.send_command(*effect.args)
        try:
            return conn.read_response()
        except ResponseError as e:
            return e
    except (ConnectionError, RedisTimeoutError) as e:
        return e
    except Exception as e:  # noqa: BLE001 - no answer: tried again
        return ConnectionError(str(e))
    finally:
        conn.disconnect()


class _SyncSlot:
    """One reply, put once (by the reader, or `Book.lost`), got at most once. Signalled
    with a lock made held and released by ``put``: one object, where an Event is a
    Condition, a lock and a deque, and its waiter wakes to take the Condition's lock
    again (a second wait when the reader still holds it)."""

    __slots__ = ("sub", "value", "_unset", "then")

    def __init__(self, sub: bool = False) -> None:
        self.sub = sub
        self.value: Any = None
        self._unset = threading.Lock()
        self._unset.acquire()
        self.then: Optional[Callable[[], None]] = None

    def put(self, value: Any) -> None:
        self.value = value
        self._unset.release()
        if self.then is not None:
            self.then()

    def get(self, timeout: Optional[float] = None) -> Any:
        """The reply; `Late` if ``timeout`` seconds pass first (it may come later)."""
        if not self._unset.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            raise Late()
        if isinstance(self.value, Exception):
            raise self.value
        return self.value

    def arrived(self, timeout: float) -> bool:
        """Whether the reply is in, waiting ``timeout`` seconds at most for it; leaves it
        to its ``get``."""
        if not self._unset.acquire(timeout=max(timeout, 0)):
            return False
        self._unset.release()
        return True

    def abandon(self, then: Callable[[], None]) -> bool:
        """Under the lock ``put`` runs under: True, with ``then`` to run on the reply, if
        it has not come; False if it has (``get`` returns it)."""
        if self._unset.acquire(blocking=False):
            self._unset.release()
            return False
        self.then = then
        return True


def _unbound(conn: Any) -> None:
    """A ticket connection made with its wait's deadline as its socket timeout (see
    `_ticket_conns`), once connected and probed: its reader waits for messages as long as
    waiters wait. (redis-py's blocking connection applies its timeout to the socket at
    connect, and its RESP3 parser's buffer keeps a copy for reads given a timeout.)"""
    if conn.socket_timeout is None:
        return
    conn.socket_timeout = None
    sock = getattr(conn, "_sock", None)
    if sock is not None:
        sock.settimeout(None)
    buffer = getattr(getattr(conn, "_parser", None), "_buffer", None)
    if buffer is not None and hasattr(buffer, "socket_timeout"):
        buffer.socket_timeout = None


class _SyncMailbox:
    """A waiter's notes (put by the reader, under the connection's lock; taken by the
    one waiter). Signalled with a lock held while nothing is new: a put releases it, the
    waiter's acquire wakes straight into the note (a Condition would make it take the
    Condition's lock again, and allocate a lock per wait)."""

    def __init__(self, look: Optional[Tuple[Any, ...]] = None, hold: Any = None) -> None:
        self.queue: Deque[Note] = deque()
        self._empty = threading.Lock()
        self._empty.acquire()
        self.look = look
        self.hold: Optional[Confirm] = hold
        self.collect: Optional[_SyncSlot] = None
        #: The message whose collect the reader sent (delivered when its reply is in).
        self.heard: Optional[Note] = None

    def put(self, note: Note) -> None:
        self.queue.append(note)
        try:
            self._empty.release()
        except RuntimeError:
            pass  # signalled already, and not taken yet

    def items(self) -> List[Note]:
        """The notes heard: delivered, or waiting for their collect's reply."""
        return list(self.queue) + ([self.heard] if self.heard is not None else [])

    def get(self, timeout: Optional[float]) -> Optional[Note]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.queue:
            left = -1 if deadline is None else deadline - time.monotonic()
            if deadline is not None and left <= 0:
                return None
            self._empty.acquire(timeout=left)
        # A signal left over from an earlier put makes a later get loop once more.
        return self.queue.popleft()


class _Held:
    """The connection's lock, taken (`SyncTicketConn._hold`); released on leaving."""

    __slots__ = ("lock",)

    def __init__(self, lock: threading.Lock) -> None:
        self.lock = lock

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        self.lock.release()


class SyncTicketConn:
    """One RESP3 ticket connection with a reader thread (threads front end). ``tag``:
    the client's ``NOTIFY`` tag (`rlock._proto.new_notify_tag`), used when the server
    names ``ticket-notify``."""

    def __init__(self, connection_class: Any, kwargs: Dict[str, Any], shard: bool,
                 tag: Optional[str] = None) -> None:
        from redis._parsers import _RESP3Parser
        self.make = _ticket_conns(kwargs, connection_class, _RESP3Parser)
        #: Where a confirmation its connection left unanswered is tried again.
        self.later = _sync_confirmer(_confirm_conns(kwargs, connection_class, _RESP3Parser))
        self.shard = shard
        self.tag = tag
        self.lock = threading.Lock()
        self.book = Book(_SyncSlot, _SyncMailbox)
        self.conn: Any = None
        #: What the last connection's ``RLOCK.HELLO`` said (None before the first).
        self.caps: Optional[Capabilities] = None
        #: The reader threads that may still run (a replaced connection's reads its end).
        self.readers: List[threading.Thread] = []
        self.closed = False

    def _hold(self, until: Optional[float]) -> "_Held":
        """``with self._hold(until):`` the connection's lock, waited for until ``until``
        at most (`Late`: another waiter's connecting to a server that does not answer)."""
        left = _late(until)
        if not self.lock.acquire(timeout=-1 if left is None else left):
            raise Late()
        return _Held(self.lock)

    def _connect_locked(self, until: Optional[float] = None) -> Any:
        if self.conn is None:
            if self.closed:
                raise ConnectionError("the ticket connection is closed")
            conn = self.make(until)
            conn.connect()
            # The capability probe, on every connect (a reconnect may reach another server).
            try:
                conn.send_command(*HELLO_ARGS)
                try:
                    reply: Any = conn.read_response(disable_decoding=True)
                except ResponseError as e:
                    reply = e
                self.caps = _probed(reply)
            except BaseException:
                conn.disconnect()
                raise
            conn._parser.set_pubsub_push_handler(_Push)
            _unbound(conn)
            self.conn = conn
            self.book.quiet = self.caps.has("ticket-quiet")
            reader = threading.Thread(target=self._read, args=(conn,), daemon=True,
                                      name="rlock-tickets-reader")
            self.readers = [t for t in self.readers if t.is_alive()] + [reader]
            reader.start()
        return self.conn

    def _send_locked(self, args: Tuple[Any, ...], sub: bool = False,
                     until: Optional[float] = None,
                     ticket: Optional[str] = None) -> Optional[_SyncSlot]:
        """Writes ``args`` (fenced behind an unanswered quiet ticket; ``ticket``: the
        ticket of that waiter, which may go ``QUIET``: `Book.expect`); its reply slot,
        None for a quiet ticket."""
        conn = self._connect_locked(until)
        slot, fence, quiet = self.book.expect(sub, ticket)
        try:
            if fence or quiet:
                conn.send_packed_command(conn.pack_commands(_commands(args, fence, quiet)))
            else:
                conn.send_command(*args)
        except Exception:
            self._lost_locked(conn)
            raise
        return slot

    def _lost_locked(self, conn: Any) -> None:
        if self.conn is conn:
            self.conn = None
            self.book.lost()
        try:
            conn.disconnect()
        except Exception:  # noqa: BLE001 - already broken
            pass

    def _read(self, conn: Any) -> None:
        while True:
            try:
                frame = conn.read_response(disable_decoding=True, push_request=True)
            except ResponseError as e:
                frame = e
            except Exception:  # noqa: BLE001 - any read failure ends this connection
                with self.lock:
                    self._lost_locked(conn)
                return
            with self.lock:
                if self.conn is not conn:
                    return
                try:
                    orphan = self.book.frame(frame)
                except OutOfStep as e:
                    log.warning("rlock: ticket connection out of step, closed (%s)", e)
                    self._lost_locked(conn)
                    return
                gen = self.book.gen
                if orphan is not None and isinstance(orphan[0], _SyncMailbox):
                    box, note = orphan
                    orphan = None
                    if box.hold is not None and box.hold.holds_on(note):
                        _confirm(box, note, self._send_locked, self.later)
                        continue
                    try:
                        # The waiter is woken once, when the collect's reply is in.
                        box.collect = self._send_locked(box.look)
                        box.collect.then = lambda box=box, note=note: box.put(note)
                    except Exception:  # noqa: BLE001 - the waiter collects (or learns)
                        box.collect = None
                        box.put(note)
            if orphan is not None:
                look, channel = orphan
                threading.Thread(target=self._undo, args=(look, channel, gen),
                                 daemon=True).start()

    def _undo(self, look: Optional[List[Any]], channel: Optional[bytes], gen: int) -> None:
        """Collects a grant whose waiter left and gives it back (a helper thread), then
        drops the orphan's channel reference."""
        try:
            if look is not None:
                reply = self.call(tuple(look))
                for args in _undo_calls(look, reply):
                    self.call(tuple(args))
        except Exception as e:  # noqa: BLE001 - best effort: the lease ends it anyway
            log.warning("rlock: could not give back an abandoned grant (%s)", e)
        if channel is not None:
            self.unsubscribe(channel, gen)

    def call(self, args: Tuple[Any, ...], note_id: Optional[str] = None,
             collect: Optional[Tuple[Any, ...]] = None, hold: Any = None,
             sub: Optional[Tuple[bytes, int]] = None, until: Optional[float] = None) -> Any:
        """Sends ``args`` and returns the reply (raising a server error). ``sub``: the
        ticket channel the wait ``note_id`` subscribed and on which connection generation
        (see `_queue_on`). ``until``: `Late` past it; a reply that comes after is handed
        to `Book.answered`."""
        with self._hold(until):
            if note_id is not None:
                self.book.register(note_id, _SyncMailbox(collect, hold), _queue_on(
                    self.book, sub))
            slot = self._send_locked(args, until=until, ticket=note_id)
        if slot is None:
            return QUEUED  # quiet: queued, or its own reply comes as a note (`Answered`)
        if until is None:
            return slot.get()
        try:
            return slot.get(until - time.monotonic())
        except Late:
            # The reader puts replies under the lock (held briefly while connected: a
            # reply still due means the connection stands).
            with self.lock:
                if slot.abandon(lambda: self._answered(note_id, slot.value)):
                    raise Late(sent=True) from None
        return slot.get()

    def _answered(self, note_id: Optional[str], reply: Any) -> None:
        """A late reply (the reader, under the lock): see `Book.answered`."""
        orphan = self.book.answered(note_id, reply) if note_id is not None else None
        if orphan is not None:
            threading.Thread(target=self._undo, args=(orphan[0], orphan[1], self.book.gen),
                             daemon=True).start()

    def collected(self, note_id: str, args: Tuple[Any, ...]) -> Any:
        """The reply to the collecting command the reader sent, or sends it now."""
        box = self.book.notes.get(note_id)
        slot = box.collect if box is not None else None
        if slot is None:
            return self.call(args)
        box.collect = None
        return slot.get()

    def subscribe(self, key: bytes,
                  until: Optional[float] = None) -> Tuple[bytes, int, Optional[str]]:
        """References the ticket channel of ``key`` that this connection's waits use now;
        returns it, the connection generation it holds and the ``NOTIFY`` tag to send.
        ``until``: `Late` past it (the subscription, if sent, still lands)."""
        with self._hold(until):
            self._connect_locked(until)  # its probe decides the channel
            tag = notify_tag(self.tag, self.caps)
            channel = ticket_channel(key, tag)
            gen = self.book.gen
            slot = self._send_locked((_sub_command(self.shard, True), channel), sub=True) \
                if self.book.ref(channel, keep=_keeps(tag, self.shard)) else None
        if slot is not None:
            try:
                slot.get(None if until is None else until - time.monotonic())
            except (ResponseError, Late):
                with self.lock:
                    self.book.forget(channel)
                raise
        return channel, gen, tag

    def unsubscribe(self, channel: bytes, gen: int) -> None:
        with self.lock:
            stale = self.book.unref(channel, gen)
            if stale is not None and self.conn is not None:
                try:
                    self._send_locked((_sub_command(self.shard, False), stale), sub=True)
                except Exception:  # noqa: BLE001 - the connection is gone anyway
                    pass

    def note(self, note_id: str, timeout: Optional[float]) -> Optional[Note]:
        box = self.book.notes.get(note_id)
        return box.get(timeout) if box is not None else None

    def leave(self, note_id: str, look: Optional[List[Any]],
              subs: List[Tuple[bytes, int]]) -> None:
        """A waiter leaves (see `Book.leave`), in one hold of the lock the reader takes
        for each frame."""
        with self.lock:
            due, stale = self.book.leave(note_id, look, subs)
            for channel in stale if self.conn is not None else ():
                try:
                    self._send_locked((_sub_command(self.shard, False), channel), sub=True)
                except Exception:  # noqa: BLE001 - the connection is gone anyway
                    break
        if due is not None:
            threading.Thread(target=self._undo, args=(due, None, 0), daemon=True).start()

    def close(self) -> None:
        """Closes the connection once the replies to what it has written are in (bounded
        by `CLOSE_DRAIN_S`: a confirmation the server answered settles as such), then
        waits (bounded by `CLOSE_JOIN_S`) for its reader threads to end: each sees its
        socket shut down at once, so none is left reading when this returns. A give-back
        thread after the close fails at once (the server dropped the tickets with the
        connection); a late confirmation's thread ends on its own, within
        `CONFIRM_RETRY_S`, its connections closed."""
        me = threading.current_thread()
        with self.lock:
            self.closed = True  # nothing connects again
            last = self.book.last_due() if self.conn is not None else None
        if last is not None and me not in self.readers:  # a reader cannot wait on itself
            last.arrived(CLOSE_DRAIN_S)
        with self.lock:
            if self.conn is not None:
                self._lost_locked(self.conn)
            readers, self.readers = self.readers, []
        for reader in readers:
            if reader is not me:
                reader.join(CLOSE_JOIN_S)

    def wait(self, shape: Shape, started: float) -> Any:
        """Drives `ticket_wait` on this connection (see `run_ticket_wait`)."""
        gen = ticket_wait(shape, started)
        subs: List[Tuple[bytes, int]] = []
        queued = False
        value: Any = None
        error: Optional[BaseException] = None
        try:
            while True:
                try:
                    effect = gen.throw(error) if error is not None else gen.send(value)
                except StopIteration as stop:
                    if isinstance(stop.value, RanOut):
                        return stop.value.reply  # still queued, maybe: leaves as an orphan
                    queued = False
                    return stop.value
                value, error = None, None
                try:
                    if isinstance(effect, TSub):
                        channel, g, value = self.subscribe(effect.key, effect.until)
                        subs.append((channel, g))
                        _may_hold(shape, self.caps)
                    elif isinstance(effect, TSend):
                        try:
                            value = self.call(effect.args, effect.note_id, effect.collect,
                                              effect.hold, subs[-1] if subs else None,
                                              effect.until)
                        except Late as e:
                            queued = effect.note_id is not None and e.sent  # maybe
                            raise
                        queued = effect.note_id is not None and value in (b"QUEUED", "QUEUED")
                    elif isinstance(effect, TNote):
                        value = self.note(effect.id, effect.timeout)
                        if isinstance(value, Answered):
                            queued = False  # a quiet ticket answered: not queued
                    elif isinstance(effect, TPause):
                        time.sleep(effect.seconds)
                    elif isinstance(effect, TCollect):
                        value = self.collected(effect.id, effect.args)
                        queued = False
                except BaseException as e:  # noqa: BLE001 - thrown into the wait
                    error = e
        finally:
            self.leave(shape.id, shape.with_wait(None, False) if queued else None, subs)


# ---- asyncio ------------------------------------------------------------------------


class _AsyncSlot:
    def __init__(self, sub: bool = False) -> None:
        self.sub = sub
        self.future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.then: Optional[Callable[[], None]] = None

    def put(self, value: Any) -> None:
        if not self.future.done():
            self.future.set_result(value)
        if self.then is not None:
            self.then()

    async def get(self) -> Any:
        value = await self.future
        if isinstance(value, Exception):
            raise value
        return value


class _AsyncMailbox:
    """A waiter's notes (put by the reader task). The waiter awaits one future, which
    ``put`` resolves and a timer ends: the waiter runs on the loop's next turn. (A
    ``wait_for(Event.wait())`` wraps the wait in a task of its own and resumes the waiter
    two turns later, through a second future.)"""

    def __init__(self, look: Optional[Tuple[Any, ...]] = None, hold: Any = None) -> None:
        self.queue: Deque[Note] = deque()
        self.waiter: Optional[asyncio.Future] = None
        self.look = look
        self.hold: Optional[Confirm] = hold
        self.collect: Optional[_AsyncSlot] = None
        #: The message whose collect the reader sent (delivered when its reply is in).
        self.heard: Optional[Note] = None

    def put(self, note: Note) -> None:
        self.queue.append(note)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def items(self) -> List[Note]:
        """The notes heard: delivered, or waiting for their collect's reply."""
        return list(self.queue) + ([self.heard] if self.heard is not None else [])

    async def get(self, timeout: Optional[float]) -> Optional[Note]:
        if not self.queue:
            loop = asyncio.get_running_loop()
            self.waiter = waiter = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            finally:
                self.waiter = None
                if timer is not None:
                    timer.cancel()
            if not self.queue:
                return None
        return self.queue.popleft()


def _wake(waiter: "asyncio.Future") -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _try_async(conn: Any, effect: CTry) -> Any:
    """As `_try_sync`."""
    try:
        await conn.connect()
        if effect.target is not None and effect.target[2]:
            await conn.send_command("ASKING")
            await conn.read_response()
        await conn.send_command(*effect.args)
        try:
            return await conn.read_response()
        except ResponseError as e:
            return e
    except (ConnectionError, RedisTimeoutError) as e:
        return e
    except Exception as e:  # noqa: BLE001 - no answer: tried again
        return ConnectionError(str(e))
    finally:
        await conn.disconnect()


async def _async_push(frame: List[Any]) -> _Push:
    return _Push(frame)


class AsyncTicketConn:
    """One RESP3 ticket connection with a reader task (asyncio front end), on one loop;
    ``tag`` as `SyncTicketConn`'s."""

    def __init__(self, connection_class: Any, kwargs: Dict[str, Any], shard: bool,
                 tag: Optional[str] = None) -> None:
        from redis._parsers import _AsyncRESP3Parser
        self.make = _ticket_conns(kwargs, connection_class, _AsyncRESP3Parser)
        self.confirm_conns = _confirm_conns(kwargs, connection_class, _AsyncRESP3Parser)
        self.shard = shard
        self.tag = tag
        self.lock = asyncio.Lock()
        self.book = Book(_AsyncSlot, _AsyncMailbox)
        self.conn: Any = None
        #: What the last connection's ``RLOCK.HELLO`` said (None before the first).
        self.caps: Optional[Capabilities] = None
        self.reader: Optional[asyncio.Task] = None
        #: Every task of this connection still running: its readers (a replaced
        #: connection's reader may still be reading its end) and what `_spawn` started;
        #: `close` cancels and awaits them all.
        self.tasks: set = set()
        self.closed = False

    async def _acquire(self, until: Optional[float]) -> None:
        """Takes the connection's lock, waiting until ``until`` at most (`Late`)."""
        left = _late(until)
        if left is None:
            await self.lock.acquire()
            return
        try:
            await asyncio.wait_for(self.lock.acquire(), left)
        except asyncio.TimeoutError:
            raise Late() from None

    async def _connect_locked(self, until: Optional[float] = None) -> Any:
        if self.conn is None:
            if self.closed:
                raise ConnectionError("the ticket connection is closed")
            conn = self.make(until)
            await conn.connect()
            # The capability probe, on every connect (a reconnect may reach another server).
            try:
                await conn.send_command(*HELLO_ARGS)
                try:
                    reply: Any = await conn.read_response(disable_decoding=True)
                except ResponseError as e:
                    reply = e
                self.caps = _probed(reply)
            except BaseException:
                await conn.disconnect()
                raise
            if self.closed:  # closed while this connected: nothing may outlive the close
                await conn.disconnect()
                raise ConnectionError("the ticket connection is closed")
            conn._parser.set_pubsub_push_handler(_async_push)
            conn.socket_timeout = None  # read at each read: see `_ticket_conns`
            self.conn = conn
            self.book.quiet = self.caps.has("ticket-quiet")
            self.reader = self._spawn(self._read(conn))
        return self.conn

    async def _send_locked(self, args: Tuple[Any, ...], sub: bool = False,
                           until: Optional[float] = None,
                           ticket: Optional[str] = None) -> Optional[_AsyncSlot]:
        """As `SyncTicketConn._send_locked`."""
        conn = await self._connect_locked(until)
        slot, fence, quiet = self.book.expect(sub, ticket)
        try:
            if fence or quiet:
                await conn.send_packed_command(
                    conn.pack_commands(_commands(args, fence, quiet)))
            else:
                await conn.send_command(*args)
        except BaseException:
            await self._lost(conn)
            raise
        return slot

    async def _lost(self, conn: Any) -> None:
        if self.conn is conn:
            self.conn = None
            self.book.lost()
        try:
            await conn.disconnect()
        except BaseException:  # noqa: BLE001 - already broken
            pass

    async def _read(self, conn: Any) -> None:
        while True:
            try:
                frame = await conn.read_response(disable_decoding=True, push_request=True)
            except ResponseError as e:
                frame = e
            except BaseException:  # noqa: BLE001 - any read failure ends this connection
                await self._lost(conn)
                return
            if self.conn is not conn:
                return
            try:
                orphan = self.book.frame(frame)
            except OutOfStep as e:
                log.warning("rlock: ticket connection out of step, closed (%s)", e)
                await self._lost(conn)
                return
            if orphan is not None and isinstance(orphan[0], _AsyncMailbox):
                box, note = orphan
                if box.hold is not None and box.hold.holds_on(note):
                    # The send writes to the socket buffer; no round trip before the wake.
                    try:
                        async with self.lock:
                            slot = await self._send_locked(box.look)
                    except Exception as e:  # noqa: BLE001 - unconfirmed: tried again
                        _settle(box.hold, e, box.look, self.later)
                    else:
                        slot.then = lambda slot=slot, box=box: _settle(
                            box.hold, slot.future.result(), box.look, self.later)
                    box.put(note)
                    continue
                try:
                    async with self.lock:
                        box.collect = await self._send_locked(box.look)
                        box.collect.then = lambda box=box, note=note: box.put(note)
                except Exception:  # noqa: BLE001 - the waiter collects (or learns)
                    box.collect = None
                    box.put(note)
            elif orphan is not None:
                self._spawn(self._undo(orphan[0], orphan[1], self.book.gen))

    def later(self, hold: Any, reply: Any, look: Tuple[Any, ...]) -> None:
        """Runs `confirm_later` in a task of its own (rare), on this loop: the lost
        report it may end with runs where the hold's watchdog does. Once the connection
        is closed the hold is reported lost at once (no task may outlive the close)."""
        if self.closed:
            hold.settle(False)
            return
        self._spawn(self._confirm_later(hold, reply, look))

    async def _confirm_later(self, hold: Any, reply: Any, look: Tuple[Any, ...]) -> None:
        gen = confirm_later(reply, look)
        value: Any = None
        try:
            while True:
                effect = gen.send(value)
                if isinstance(effect, TPause):
                    await asyncio.sleep(effect.seconds)
                    value = None
                else:
                    value = await _try_async(
                        self.confirm_conns(effect.target, effect.timeout), effect)
        except StopIteration as done:
            hold.settle_with(done.value)
        except Exception:  # noqa: BLE001 - unsettled: reported lost
            log.exception("rlock: a late ticket confirmation failed")
            hold.settle(False)
        except asyncio.CancelledError:  # the connection closed: unsettled, reported lost
            hold.settle(False)
            raise

    def _spawn(self, coro: Any) -> Optional[asyncio.Task]:
        """Runs ``coro`` in a task of this connection (`close` ends it); after the
        close, not at all: an unsubscribe or a give-back has no connection left to go
        on (the server dropped the tickets and subscriptions with it)."""
        if self.closed:
            coro.close()
            return None
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _undo(self, look: Optional[List[Any]], channel: Optional[bytes],
                    gen: int) -> None:
        try:
            if look is not None:
                reply = await self.call(tuple(look))
                for args in _undo_calls(look, reply):
                    await self.call(tuple(args))
        except Exception as e:  # noqa: BLE001 - best effort: the lease ends it anyway
            log.warning("rlock: could not give back an abandoned grant (%s)", e)
        if channel is not None:
            await self.unsubscribe(channel, gen)

    async def call(self, args: Tuple[Any, ...], note_id: Optional[str] = None,
                   collect: Optional[Tuple[Any, ...]] = None, hold: Any = None,
                   sub: Optional[Tuple[bytes, int]] = None,
                   until: Optional[float] = None) -> Any:
        """As `SyncTicketConn.call`."""
        await self._acquire(until)
        try:
            if note_id is not None:
                self.book.register(note_id, _AsyncMailbox(collect, hold), _queue_on(
                    self.book, sub))
            slot = await self._send_locked(args, until=until, ticket=note_id)
        finally:
            self.lock.release()
        if slot is None:
            return QUEUED  # quiet: as `SyncTicketConn.call`
        if until is not None:
            await self._until(slot, until, lambda: self._answered(note_id, slot.future))
        return await slot.get()

    async def _until(self, slot: _AsyncSlot, until: float,
                     then: Callable[[], None]) -> None:
        """Waits for ``slot``'s reply until ``until``; past it, leaves ``then`` to run on
        the reply and raises `Late`."""
        left = until - time.monotonic()
        if not slot.future.done() and left > 0:
            await asyncio.wait([slot.future], timeout=left)
        if not slot.future.done():
            slot.then = then
            raise Late(sent=True)

    def _answered(self, note_id: Optional[str], future: "asyncio.Future") -> None:
        """As `SyncTicketConn._answered` (on the loop)."""
        orphan = self.book.answered(note_id, future.result()) if note_id is not None \
            else None
        if orphan is not None:
            self._spawn(self._undo(orphan[0], orphan[1], self.book.gen))

    async def collected(self, note_id: str, args: Tuple[Any, ...]) -> Any:
        """As `SyncTicketConn.collected`."""
        box = self.book.notes.get(note_id)
        slot = box.collect if box is not None else None
        if slot is None:
            return await self.call(args)
        box.collect = None
        return await slot.get()

    async def subscribe(self, key: bytes,
                        until: Optional[float] = None) -> Tuple[bytes, int, Optional[str]]:
        """As `SyncTicketConn.subscribe`."""
        await self._acquire(until)
        try:
            await self._connect_locked(until)
            tag = notify_tag(self.tag, self.caps)
            channel = ticket_channel(key, tag)
            gen = self.book.gen
            slot = await self._send_locked((_sub_command(self.shard, True), channel),
                                           sub=True) \
                if self.book.ref(channel, keep=_keeps(tag, self.shard)) else None
        finally:
            self.lock.release()
        if slot is not None:
            try:
                if until is not None:
                    await self._until(slot, until, lambda: None)
                await slot.get()
            except (ResponseError, Late):
                self.book.forget(channel)
                raise
        return channel, gen, tag

    async def unsubscribe(self, channel: bytes, gen: int) -> None:
        stale = self.book.unref(channel, gen)
        if stale is not None:
            await self._unsubscribe_now(stale, self.book.gen)

    async def _unsubscribe_now(self, channel: bytes, gen: int) -> None:
        """Writes the unsubscribe the book decided on generation ``gen``, unless a wait
        subscribed the channel again while this waited for the lock
        (`Book.unsubscribe_due`)."""
        async with self.lock:
            if self.conn is not None and self.book.unsubscribe_due(channel, gen):
                try:
                    await self._send_locked((_sub_command(self.shard, False), channel),
                                            sub=True)
                except Exception:  # noqa: BLE001 - the connection is gone anyway
                    pass

    def leave(self, note_id: str, look: Optional[List[Any]],
              subs: List[Tuple[bytes, int]]) -> None:
        """As `SyncTicketConn.leave`. The book is the loop's alone, so it changes at once;
        only an unsubscribe to send (a key channel after its last waiter, or an idle one
        past `IDLE_CHANNELS`), and a grant to give back, take a task (a cancelled waiter
        leaves at once)."""
        due, stale = self.book.leave(note_id, look, subs)
        for channel in stale:
            self._spawn(self._unsubscribe_now(channel, self.book.gen))
        if due is not None:
            self._spawn(self._undo(due, None, 0))

    async def close(self) -> None:
        """Closes the connection and ends every task of it, cancelled and awaited: its
        readers and its give-backs, unsubscribes and late confirmations. Once this
        returns no task and no socket of the connection is left for the loop's end to
        find pending (nor a redis-py connection to close after the loop is gone). The
        replies to what the connection has written are read first (bounded by
        `CLOSE_DRAIN_S`): a confirmation the server answered settles as such, rather
        than reported lost by the close."""
        self.closed = True  # nothing connects again, no task starts
        last = self.book.last_due() if self.conn is not None else None
        if last is not None and asyncio.current_task() is not self.reader:
            await asyncio.wait([last.future], timeout=CLOSE_DRAIN_S)
        if self.conn is not None:
            await self._lost(self.conn)
        me = asyncio.current_task()
        tasks = [t for t in self.tasks if t is not me]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def wait(self, shape: Shape, started: float) -> Any:
        """Drives `ticket_wait` on this connection; cancellation-safe (an orphan)."""
        gen = ticket_wait(shape, started)
        subs: List[Tuple[bytes, int]] = []
        queued = False
        value: Any = None
        error: Optional[BaseException] = None
        try:
            while True:
                try:
                    effect = gen.throw(error) if error is not None else gen.send(value)
                except StopIteration as stop:
                    if isinstance(stop.value, RanOut):
                        return stop.value.reply  # still queued, maybe: leaves as an orphan
                    queued = False
                    return stop.value
                value, error = None, None
                try:
                    if isinstance(effect, TSub):
                        channel, g, value = await self.subscribe(effect.key, effect.until)
                        subs.append((channel, g))
                        _may_hold(shape, self.caps)
                    elif isinstance(effect, TSend):
                        try:
                            value = await self.call(effect.args, effect.note_id,
                                                    effect.collect, effect.hold,
                                                    subs[-1] if subs else None, effect.until)
                        except Late as e:
                            queued = effect.note_id is not None and e.sent  # maybe
                            raise
                        queued = effect.note_id is not None and value in (b"QUEUED", "QUEUED")
                    elif isinstance(effect, TCollect):
                        value = await self.collected(effect.id, effect.args)
                        queued = False
                    elif isinstance(effect, TPause):
                        await asyncio.sleep(effect.seconds)
                    elif isinstance(effect, TNote):
                        box = self.book.notes.get(effect.id)
                        value = await box.get(effect.timeout) if box is not None else None
                        if isinstance(value, Answered):
                            queued = False  # a quiet ticket answered: not queued
                except BaseException as e:  # noqa: BLE001 - thrown into the wait
                    error = e
        finally:
            self.leave(shape.id, shape.with_wait(None, False) if queued else None, subs)
