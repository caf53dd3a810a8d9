"""The pure protocol of queued tickets (docs/commands/tickets.md) and the effects vocabulary.

Sits below every other module of the package and does no I/O: the ticket channel of a
key, the parsing of a ticket message, the shape of a waiting command (with ``ASYNC``, or
without ``WAIT`` to collect a grant), what gives back a grant nobody will use, and the
*effects* that the shared primitive logic (`rlock._ops`) yields and that the two drivers
(`rlock._io`: threads, asyncio) carry out. The Rust client's `tickets.rs` is the
reference behaviour mirrored here.
"""

from __future__ import annotations

import re
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

#: The name the ticket connection gives itself (CLIENT LIST shows it).
CONNECTION_NAME = "rlock-py-tickets"


def ticket_channel(key: bytes, tag: Optional[str] = None) -> bytes:
    """``rlock_ticket:{key}``, or ``rlock_ticket:key`` when the key has a ``{`` (Redisson's
    ``prefixName`` rule: the channel hashes to the key's cluster slot). With ``tag``, the
    channel of the tickets queued with ``NOTIFY tag`` (a client's own: the key's channel
    and ``:tag``; a tag has no braces, so the slot stays the key's)."""
    channel = b"rlock_ticket:" + key if b"{" in key else b"rlock_ticket:{" + key + b"}"
    return channel if tag is None else channel + b":" + tag.encode()


def new_notify_tag() -> str:
    """A client's ``NOTIFY`` tag: 16 lowercase hex characters from a secure source, so
    that two clients never share a channel (and nobody guesses another's)."""
    return secrets.token_hex(8)


@dataclass(frozen=True)
class Note:
    """One ticket message: ``kind`` is ``granted``, ``timeout``, ``error`` or ``lost`` (the
    ticket connection broke: whatever was queued there is gone)."""

    kind: str
    id: str
    owner: bytes = b""
    detail: str = ""


LOST = Note("lost", "")


#: A length in a ticket message: 1 to 10 ASCII digits, as the module writes them (``int``
#: alone would also take a sign, spaces, ``_`` and other scripts' digits).
_LENGTH = re.compile(rb"[0-9]{1,10}")


def parse_note(payload: bytes) -> Optional[Note]:
    """``<kind>:<id-len>:<owner-len>:<id><owner><detail>``, or None if malformed
    (spec/vectors/tickets.json pins the reading)."""
    parts = payload.split(b":", 3)
    if len(parts) != 4 or not all(_LENGTH.fullmatch(p) for p in parts[1:3]):
        return None
    kind, id_len, owner_len, rest = parts
    n, m = int(id_len), int(owner_len)
    if len(rest) < n + m:
        return None
    try:
        note_id = rest[:n].decode()
    except UnicodeDecodeError:
        return None  # our ids are text: not a message for any waiter of ours
    return Note(kind.decode(errors="replace"), note_id, rest[n:n + m],
                rest[n + m:].decode(errors="replace"))


def note_action(note: Note) -> str:
    """What the waiter does with a ticket message (spec/vectors/tickets.json, ``then``):
    ``granted`` (collect the grant; the latch's await returns 1), ``fail`` (an ``error``
    note: its detail is the server's error) or ``collect`` (a timeout, and a kind this
    client does not know: the ticket left its queue all the same, and the collect's reply
    tells what happened). The kind word alone decides; a detail is ignored."""
    if note.kind == "granted":
        return "granted"
    if note.kind == "error":
        return "fail"
    return "collect"


def may_be_grant(note: Note) -> bool:
    """Whether an abandoned waiter's note may stand for a grant to give back: a grant, or
    a kind this client does not know."""
    return note.kind not in ("timeout", "error", "lost")


def new_request_id() -> str:
    """A request id for one call and its retries (also the ticket's id)."""
    return uuid.uuid4().hex


def to_bytes(value: Any) -> bytes:
    """A key or argument as the bytes the server sees (str as UTF-8, ints in decimal)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, memoryview):
        return value.tobytes()
    return str(value).encode()


@dataclass
class Shape:
    """One waiting command: ``args`` with ``WAIT <wait_ms>`` at ``wait_at`` and an ``ID``.

    ``latch``: RLATCH.AWAIT, whose ``granted`` message is the whole answer (1).
    """

    args: List[Any]
    wait_at: int
    wait_ms: int
    id: str
    latch: bool = False
    #: Set by the ticket connection for a wait that holds on its ``granted`` message: the
    #: confirmation's outcome (`rlock._tickets.Confirm`), which the driver hands to the
    #: hold's watchdog (a grant taken back is a lost hold).
    confirm: Any = None
    #: Set by the ticket connection when the wait returned the reply it read from its
    #: ``granted`` message (its grant then is confirmed by ``confirm``); False when the
    #: grant was collected, or answered at once.
    held_on_message: bool = False
    #: Set when the waiting command was answered with its reply itself, not ``QUEUED``
    #: (a ticket answered at once; scripts mode's first try): the lock was free. False
    #: where nobody can tell (a blocked ``WAIT``): the acquire then counts as having
    #: found it held (spec/vectors/waits.json, ``acquires``).
    at_once: bool = False
    #: How much sooner than the client's deadline the server's wait ends (None: the
    #: ticket connection's default, `rlock._tickets.TIMEOUT_LEAD_MS`).
    lead_ms: Optional[int] = None

    @property
    def key(self) -> bytes:
        return to_bytes(self.args[1])

    @property
    def holds(self) -> bool:
        """Whether a grant may be held on its ``granted`` message, its reply read from
        the message (design.md 5): the lock's and RW lock's acquire (nil), the fenced
        lock's (the token in the detail), the expirable semaphore's (the permit ids), the
        plain semaphore's (1; its release then waits for the confirmation:
        `rlock._permits`)."""
        return self.verb in _HOLDS

    @property
    def verb(self) -> bytes:
        return to_bytes(self.args[0]).upper()

    def held_reply(self, detail: str) -> Tuple[bool, Any]:
        """``(True, reply)``: the grant's reply as read from a ``granted`` message's
        ``detail`` (spec/vectors/tickets.json, ``holds``); ``(False, None)``: collect it
        (an older module wrote no detail, or one this client cannot read)."""
        return held_reply(self.verb, self.many, detail)

    def ran_out(self) -> Any:
        """The command's "not now" reply, for a timed wait the client ended at its own
        deadline (`rlock._tickets.ticket_wait`): what the server answers a wait that ran
        out, with ``-1`` where that reply carries the holder's PTTL (not known without
        asking; no caller reads it, and ``-2`` would ask the lock to try again)."""
        return ran_out(self.verb)

    @property
    def many(self) -> bool:
        """``PERMITS n`` given: an expirable semaphore's acquire answers an array."""
        return any(to_bytes(a).upper() == b"PERMITS" for a in self.args[2:self.wait_at - 1])

    def wait_left(self, elapsed: float) -> Optional[int]:
        """The wait left after ``elapsed`` seconds: 0 = no limit, None = over."""
        if self.wait_ms == 0:
            return 0
        left = self.wait_ms - int(elapsed * 1000)
        return left if left > 0 else None

    def with_wait(self, wait_ms: Optional[int], ticket: bool,
                  notify: Optional[str] = None) -> List[Any]:
        """The command waiting ``wait_ms`` (with ``ASYNC`` if ``ticket``, and ``NOTIFY
        notify`` if given), or without ``WAIT`` when ``wait_ms`` is None: that answers at
        once (the remembered grant of this id, or the ordinary reply)."""
        args = list(self.args)
        if self.latch and not ticket:
            # RLATCH.AWAIT takes ID only with ASYNC (it changes nothing to remember).
            args = args[:-2]
        if wait_ms is None:
            return args[:self.wait_at - 1] + args[self.wait_at + 1:]
        args[self.wait_at] = wait_ms
        if not ticket:
            return args
        if self.latch:
            # RLATCH.AWAIT's synopsis order, WAIT t ASYNC ID id (spec/vectors/commands.json).
            args = args[:-2] + ["ASYNC"] + args[-2:]
        else:
            args = args + ["ASYNC"]
        return args if notify is None else args + ["NOTIFY", notify]


#: The acquires whose grant is held on its ``granted`` message (see `held_reply`).
_HOLDS = (b"RLOCK.ACQUIRE", b"RRWLOCK.ACQUIRE", b"RFENCED.ACQUIRE", b"RPSEMAPHORE.ACQUIRE",
          b"RSEMAPHORE.ACQUIRE")

#: Each waiting command's reply to a wait that ran out (docs/commands/tickets.md, "not
#: now"), as `Shape.ran_out` gives it.
_RAN_OUT: Dict[bytes, Any] = {
    b"RLOCK.ACQUIRE": -1,
    b"RRWLOCK.ACQUIRE": -1,
    b"RFENCED.ACQUIRE": (-1, None),
    b"RSEMAPHORE.ACQUIRE": 0,
    b"RPSEMAPHORE.ACQUIRE": None,
    b"RLATCH.AWAIT": 0,
}


def ran_out(verb: bytes) -> Any:
    """``verb``'s (upper case) "not now" reply: see `Shape.ran_out`."""
    return list(_RAN_OUT[verb]) if verb == b"RFENCED.ACQUIRE" else _RAN_OUT[verb]


#: A driver's answer to a `Call` with ``tries`` that it did not send (too many tries of
#: its client in flight: `rlock._io.TRIES_IN_FLIGHT`): the acquire queues at once.
BUSY: Any = type("Busy", (), {"__repr__": lambda self: "BUSY"})()


def took(verb: bytes, reply: Any) -> bool:
    """Whether the module's ``reply`` to an acquire ``verb`` (upper case) without ``WAIT``
    took the lock or the permits; else they were held (a PTTL, 0, nil)."""
    if verb in (b"RLOCK.ACQUIRE", b"RRWLOCK.ACQUIRE"):
        return reply is None
    if verb == b"RFENCED.ACQUIRE":
        return isinstance(reply, list) and len(reply) == 2 and reply[0] is None
    if verb == b"RPSEMAPHORE.ACQUIRE":
        return reply is not None
    return reply == 1  # RSEMAPHORE.ACQUIRE


_TOKEN = re.compile(r"[0-9]{1,19}")
_PERMIT = re.compile(r"(?:[0-9a-fA-F]{2})+")


def held_reply(verb: bytes, many: bool, detail: str) -> Tuple[bool, Any]:
    """A grant's reply read from its ``granted`` message's ``detail`` for the acquire
    ``verb`` (upper case): nil for the lock and RW lock, ``[None, token]`` for the fenced
    lock, a permit id (bytes) or, with ``many``, a list of them for the expirable
    semaphore, 1 for the plain semaphore (whose grant's reply is always 1: its message
    has no detail). ``(False, None)`` when it cannot be read: collect instead."""
    if verb in (b"RLOCK.ACQUIRE", b"RRWLOCK.ACQUIRE"):
        return True, None
    if verb == b"RSEMAPHORE.ACQUIRE":
        return True, 1
    if verb == b"RFENCED.ACQUIRE" and _TOKEN.fullmatch(detail):
        token = int(detail)
        return (True, [None, token]) if token < 2 ** 63 else (False, None)
    if verb == b"RPSEMAPHORE.ACQUIRE" and detail:
        ids = detail.split(",")
        if all(_PERMIT.fullmatch(i) for i in ids) and (many or len(ids) == 1):
            permits = [i.encode() for i in ids]
            return True, (permits if many else permits[0])
    return False, None


def waiting(args: List[Any], wait_ms: int, request_id: str, latch: bool = False) -> Shape:
    """``args`` + ``WAIT wait_ms`` + ``ID request_id`` as a `Shape`."""
    full = list(args) + ["WAIT", wait_ms, "ID", request_id]
    return Shape(full, len(args) + 1, wait_ms, request_id, latch)


def redirected(text: str) -> bool:
    """A ``MOVED``/``ASK`` error (text or ticket note detail): the slot left the node."""
    return text.startswith("MOVED") or text.startswith("ASK")


def undo_args(args: List[Any], reply: Any) -> List[List[Any]]:
    """The commands that give back what ``reply`` to ``args`` granted, for a grant nobody
    will use (its waiter left: a cancelled task, a client-side limit)."""
    name = to_bytes(args[0]).upper()
    rid = new_request_id()
    if name == b"RLOCK.ACQUIRE" and reply is None:
        return [["RLOCK.RELEASE", args[1], args[2], "ID", rid]]
    if name == b"RFENCED.ACQUIRE" and isinstance(reply, list) and reply and reply[0] is None:
        return [["RLOCK.RELEASE", args[1], args[2], "ID", rid]]
    if name == b"RRWLOCK.ACQUIRE" and reply is None:
        return [["RRWLOCK.RELEASE", args[1], args[2], args[3], "ID", rid]]
    if name == b"RSEMAPHORE.ACQUIRE" and reply == 1:
        return [["RSEMAPHORE.RELEASE", args[1], args[2], "ID", rid]]
    if name == b"RPSEMAPHORE.ACQUIRE" and reply is not None:
        ids = reply if isinstance(reply, list) else [reply]
        return [["RPSEMAPHORE.RELEASE", args[1], p, "ID", f"{rid}-{i}"]
                for i, p in enumerate(ids)]
    return []


# ---- effects: what the shared logic asks its driver to do ----------------------------


@dataclass(frozen=True)
class Call:
    """Run one command on the client (redis-py's ``execute_command``); the reply is sent
    back into the generator, a server error is thrown into it. ``direct``: sent as is,
    already routed (`rlock._mode.dispatch`). ``at``: on a cluster, send it to the node
    owning this key (a command whose arguments name no key: the mode probe). ``once``: sent
    at most once (no retry of redis-py's, none of the cluster client's): a failure after
    the write raises `rlock.OutcomeUnknown`, one before it (no connection) is raised as
    is (scripts mode's scripts that must not run twice, `rlock._scripts.MAY_RETRY`).
    ``until``: a deadline (`time.monotonic`) the reply must come by, or redis-py's
    ``TimeoutError`` is raised then: sent on a connection of its own whose connecting,
    handshake and reply are bounded by it, closed after (the mode probe before a timed
    wait, `rlock._mode.dispatch`: a pool connection would connect unbounded)."""

    args: Tuple[Any, ...]
    direct: bool = False
    at: Optional[bytes] = None
    once: bool = False
    until: Optional[float] = None
    #: A waiting acquire's try without ``WAIT`` (`rlock._ops.try_first`), sent on the
    #: client's own path as any command: if its caller leaves before the reply (a
    #: cancelled task, ``by`` passed), a reply that took something is given back.
    tries: bool = False
    #: A try before a timed wait: the wait's deadline (`time.monotonic`). A reply not in
    #: by then answers the command's "not now" (`ran_out`); the mode probe of a fresh
    #: client is bounded by it too.
    by: Optional[float] = None


@dataclass(frozen=True)
class Wait:
    """Run a waiting command: as a queued ticket on the client's ticket connection when the
    module takes ``ASYNC``, else blocked in ``WAIT`` on a connection of its own. The reply
    is the command's ordinary reply to the wait. ``direct``: as `Call`'s. ``since``: when
    the wait's time began (`time.monotonic`; None: when the driver starts it), so that
    what ran before it for it (the mode probe) counts against its deadline."""

    shape: Shape
    direct: bool = False
    since: Optional[float] = None


@dataclass(frozen=True)
class Pipe:
    """Run ``commands`` in order on one connection (a pipeline, no transaction); the
    replies come back as a list. Replica sync (`rlock._replicas`): a ``WAIT`` counts
    only its own connection's writes. ``at``: on a cluster, the commands go down one
    connection of the node owning this key (redis-py's cluster pipeline would route each
    command by itself, a keyless one anywhere)."""

    commands: Tuple[Tuple[Any, ...], ...]
    at: Optional[bytes] = None


@dataclass(frozen=True)
class Sleep:
    """Sleep ``seconds`` (the watchdog's interval; a poll)."""

    seconds: float


@dataclass
class Watch:
    """Start a watchdog that renews with ``renew`` (a generator factory run by the same
    driver) every ``interval`` seconds; ``on_lost`` is called once if a renewal answers
    that the hold is gone. The driver replies with a handle that has ``stop()`` and
    ``lost`` (a bool)."""

    renew: Callable[[], Any]
    lease_ms: int
    name: Any
    on_lost: Optional[Callable[[], Any]] = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Subscribe:
    """Scripts mode: be subscribed to ``channel`` (on the node owning ``key``) through the
    client's one subscriber connection before trying; the driver replies with a
    subscription whose ``close()`` gives it back. A message published after this returns
    is never missed."""

    key: bytes
    channel: bytes


@dataclass(frozen=True)
class Listen:
    """Scripts mode: wait until ``sub`` hears a message it has not seen (or its connection
    broke, which is as good as a message: try again) or ``timeout`` seconds pass."""

    sub: Any
    timeout: float


@dataclass(frozen=True)
class Settled:
    """Wait until each of ``confirms`` (`rlock._tickets.Confirm`) is settled, or until
    ``timeout`` seconds pass (a plain semaphore's release: `rlock._permits`)."""

    confirms: Tuple[Any, ...]
    timeout: float
