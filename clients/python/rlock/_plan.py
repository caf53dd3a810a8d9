"""The pure part of the rlock Python client: durations, wait budgets, replies, errors.

Shared by the blocking `rlock.Lock` and the asyncio `rlock.asyncio.Lock`, which differ only
in how they send commands. Nothing here does I/O or reads a clock: callers pass `now`.
"""

from __future__ import annotations

import inspect
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

from redis.exceptions import ResponseError

Number = Union[int, float]

#: The lease of a lock taken without ``timeout`` (watchdog mode), in seconds. Redisson's
#: ``lockWatchdogTimeout`` and the Rust crate's ``DEFAULT_WATCHDOG_TIMEOUT``.
DEFAULT_WATCHDOG_TIMEOUT: float = 30.0

#: The watchdog renews the lease every this fraction of it, so that two renewals in a row
#: can fail before the lease runs out.
RENEW_FRACTION: float = 1 / 3

#: After a failed renewal (connection error), the watchdog tries again this soon rather
#: than a whole interval later, as long as the lease has not run out.
RENEW_RETRY_DELAY: float = 1.0

#: Attempts of an acquire whose connection fails (the first try included). The
#: retries carry the same request id, so an acquire that did succeed is not applied twice.
ACQUIRE_ATTEMPTS: int = 3


#: A handle that found its lock (or its permits) held by another within this long
#: queues its next waiting acquire at once; otherwise that acquire asks first without
#: waiting (spec/vectors/waits.json, ``contended_for_ms``). A contended loop acquires
#: far more often than this, so it does not pay a failed try before every wait.
CONTENDED_FOR_S: float = 1.0

#: What a handle's last waiting acquire found (`Contention`).
HELD, FREE = "held", "free"


class Contention:
    """What a handle's last waiting acquire found: the lock (or permits) ``held`` by
    another, when; or ``free``. Tells whether the next waiting acquire asks first without
    waiting, on the client's quick path: an uncontended lock is then taken without the
    hand-off of a ticket's reply from the ticket connection's reader to the caller. A
    hint, shared by a handle's threads: one tuple, replaced whole."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        #: ``(finding, when)`` (`time.monotonic` seconds), or None before any.
        self.last: Optional[tuple] = None

    def tries_first(self, now: float) -> bool:
        """True unless an acquire found it held less than `CONTENDED_FOR_S` before ``now``."""
        last = self.last
        return last is None or last[0] != HELD or now - last[1] >= CONTENDED_FOR_S

    def found(self, finding: str, now: float) -> None:
        """Records a waiting acquire's finding (`HELD` or `FREE`) at ``now``."""
        self.last = (finding, now)


def to_ms(seconds: Number) -> int:
    """Seconds (int or float, as redis-py takes them) to whole milliseconds, at least 1."""
    return max(1, int(seconds * 1000))


def lease_ms(timeout: Optional[Number], watchdog_timeout: Number) -> int:
    """The lease sent to the server: ``timeout``, or the watchdog's lease when there is none.

    redis-py treats a ``timeout`` of 0 like None (``if self.timeout:``), and so does rlock.
    """
    return to_ms(timeout) if timeout else to_ms(watchdog_timeout)


def new_token() -> bytes:
    """A fresh lock token, made like redis-py's (a uuid1 in hex, as bytes)."""
    return uuid.uuid1().hex.encode()


def new_request_id() -> str:
    """A request id for one ACQUIRE or RELEASE call and its retries."""
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Wait:
    """How one ACQUIRE attempt waits: ``ms is None`` = do not wait, ``0`` = without limit."""

    ms: Optional[int]


#: A bounded wait of the Lock ends this many ``sleep`` before its deadline, on the client's
#: clock (`plan_wait`).
CUTOFF_SLEEPS = 0.25
#: ... and in the server this many ``sleep`` before that (`lead_ms`): at most
#: 0.85 ``sleep`` before the deadline, still inside redis-py's last ``sleep``.
LEAD_SLEEPS = 0.6


def lead_ms(sleep: Number) -> int:
    """How much sooner than the client's wait the Lock's server-side wait ends."""
    return int(sleep * LEAD_SLEEPS * 1000)


def plan_wait(blocking: bool, stop_at: Optional[float], sleep: Number, now: float) -> Wait:
    """The wait of the next ACQUIRE, given the caller's deadline ``stop_at``.

    redis-py's Lock polls every ``sleep`` seconds and gives up at its last try before
    ``blocking_timeout``, so it returns somewhere in the last ``sleep`` before the
    deadline, never after it; with ``sleep > blocking_timeout`` it tries exactly once.
    rlock waits in the server instead and keeps that envelope: the client's wait ends a
    quarter of a ``sleep`` before the deadline (`CUTOFF_SLEEPS`: room for the waiter to
    get a CPU again), the server's `LEAD_SLEEPS` of a ``sleep`` sooner (`lead_ms`: room
    for its answer to come back by then), and when less than that quarter is left the
    ACQUIRE is sent without WAIT, a single try.
    """
    if not blocking:
        return Wait(None)
    if stop_at is None:
        return Wait(0)
    budget_ms = int((stop_at - now - sleep * CUTOFF_SLEEPS) * 1000)
    return Wait(budget_ms) if budget_ms >= 1 else Wait(None)


def acquire_args(name: object, token: bytes, lease: int, wait: Wait, request_id: str) -> list:
    """The RLOCK.ACQUIRE call for one attempt."""
    args: list = ["RLOCK.ACQUIRE", name, token, lease]
    if wait.ms is not None:
        args += ["WAIT", wait.ms]
    return args + ["ID", request_id]


def release_args(name: object, token: bytes, lease: int, request_id: str) -> list:
    """The RLOCK.RELEASE call; the lease re-arms the expiry if re-entrant holds remain."""
    return ["RLOCK.RELEASE", name, token, lease, "ID", request_id]


def renew_args(name: object, token: bytes, lease: int) -> list:
    """The RLOCK.RENEW call that the watchdog, ``extend`` and ``reacquire`` send."""
    return ["RLOCK.RENEW", name, token, lease]


def not_a_lock(error: ResponseError) -> bool:
    """True when the server refused because the key holds something that is not a lock.

    redis-py's own tests (and real code) overwrite a lock key with another value; for
    redis-py's Lock the key is then simply taken by someone else. rlock answers WRONGTYPE
    (a string, a list...) or NOTALOCK (a hash that is not a lock); the client maps both to
    "not held by this token" so that the same code sees the same outcome.
    """
    return str(error).startswith(("WRONGTYPE", "NOTALOCK"))


def extended_lease(pttl: int, additional_ms: int, replace_ttl: bool) -> Optional[int]:
    """The lease that ``extend`` renews to, or None when the key has no lease to extend."""
    if replace_ttl:
        return max(1, additional_ms)
    if pttl < 0:
        return None
    return max(1, pttl + additional_ms)


def encode_token(token: Union[str, bytes], encoder: object) -> bytes:
    """A caller's token as bytes, encoded like redis-py does (the client's encoder)."""
    if isinstance(token, bytes):
        return token
    return encoder.encode(token)  # type: ignore[attr-defined]


def get_connection_args(pool: Any, command: str) -> tuple:
    """Arguments for ``pool.get_connection``: redis-py 5 requires the command name, redis-py
    6 deprecates passing it (and warns), so pass it only where the signature requires it."""
    cls = type(pool)
    needs = _NEEDS_COMMAND_NAME.get(cls)
    if needs is None:
        # Cached per class: inspect.signature costs tens of microseconds, once per acquire.
        needs = _NEEDS_COMMAND_NAME[cls] = _needs_command_name(cls)
    return (command,) if needs else ()


_NEEDS_COMMAND_NAME: Dict[type, bool] = {}


def _needs_command_name(pool_class: type) -> bool:
    try:
        method = getattr(pool_class, "get_connection")
        params = list(inspect.signature(method).parameters.values())[1:]  # after self
    except (TypeError, ValueError, AttributeError):
        return True
    if not params:
        return False
    first = params[0]
    positional = first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD)
    return positional and first.default is first.empty
