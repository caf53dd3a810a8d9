"""The module's refusals as exception classes, chosen by the code word each error reply
starts with (the module's src/vocab/errors.rs states the scheme: ``BAD<ARG>``,
``NOTA<KIND>``, ``OVERFLOW``, ...).

Every class is a redis-py ``ResponseError``, so code that catches that keeps working; its
message is the server's whole reply, code word first, and ``code`` is the word. The
driver (`rlock._io`) turns each ``ResponseError`` of a module command into its class
with `module_error`, in one place for threads and asyncio.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

from redis.exceptions import ConnectionError, ResponseError


class OutcomeUnknown(ConnectionError):
    """Scripts mode: a script that must not run twice was sent, and the connection broke
    (or timed out) before its reply came: the script may or may not have been applied, and
    it is not sent again (`rlock._scripts.MAY_RETRY`; docs/scripts-mode.md). A redis-py
    ``ConnectionError``, which rlock's own retries never retry."""


class RlockError(ResponseError):
    """A refusal of the rlock module; ``code`` is its code word (``BADLEASE``...)."""

    @property
    def code(self) -> str:
        return str(self).split(" ", 1)[0]


class BadArgument(RlockError):
    """An argument out of its range or shape (``BADLEASE``, ``BADOWNER``, ...)."""


class NotThisPrimitive(RlockError):
    """The key holds something that is not this primitive (``NOTALOCK``, ...)."""


class Overflow(RlockError):
    """A count, a token or a permit total would overflow (``OVERFLOW``)."""


class TooManyWaiters(RlockError):
    """The key's waiter limit is reached (``TOOMANYWAITERS``)."""


class TooManyHolds(RlockError):
    """An owner's read holds are at their limit (``TOOMANYHOLDS``)."""


class ReadHeld(RlockError):
    """A holder of the read lock asked for the write lock: a wait that could never end
    (``READHELD``)."""


class InternalCommand(RlockError):
    """An internal command sent by a client, or its payload malformed (``INTERNALCMD``,
    ``BADPAYLOAD``)."""


class ModuleBug(RlockError):
    """A bug in the module, caught; details in the server log (``RLOCKBUG``)."""


_EXACT: Dict[str, Type[RlockError]] = {
    "OVERFLOW": Overflow,
    "TOOMANYWAITERS": TooManyWaiters,
    "TOOMANYHOLDS": TooManyHolds,
    "READHELD": ReadHeld,
    "INTERNALCMD": InternalCommand,
    "BADPAYLOAD": InternalCommand,
    "RLOCKBUG": ModuleBug,
}


#: The module's texts for the refusals scripts mode (no module, `rlock._scripts`) makes
#: itself, so that a caller sees the same error on any server. Keyed by their names in
#: the module (src/vocab/errors.rs); the client's vectors test holds each to
#: spec/vectors/errors.json.
TEXTS: Dict[str, str] = {
    "ERR_RW_READ_HELD": "READHELD this owner holds the read lock: release the read lock "
                        "first (a writer waiting on its own read would wait forever)",
    "ERR_PERMITS": "BADPERMITS permits must be an integer from 0 to 2147483647",
}


def error_class(code: str) -> Optional[Type[RlockError]]:
    """The class of a module code word; None for codes that are not the module's."""
    if code in _EXACT:
        return _EXACT[code]
    if code.startswith("NOTA"):
        return NotThisPrimitive
    if code.startswith("BAD"):
        return BadArgument
    return None


def module_error(error: BaseException) -> BaseException:
    """``error`` as its class when it is a refusal of the module, else unchanged."""
    if not isinstance(error, ResponseError) or isinstance(error, RlockError):
        return error
    cls = error_class(str(error).split(" ", 1)[0])
    if cls is None:
        return error
    mapped = cls(*error.args)
    mapped.__cause__ = error.__cause__
    return mapped
