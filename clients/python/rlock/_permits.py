"""What a client owes a plain semaphore (``RSEMAPHORE``) whose waits hold on their grant's
message: the confirmations still in flight, and the permits the server took back.

Sits beside `rlock._ops` (whose `SemaphoreOps` uses it) and does no I/O. A plain
semaphore's permits have no owner: when a ticket's connection closes before its grant
was confirmed, the module takes the grant back by *releasing* those permits
(src/semaphore/commands.rs, ``take_back``), and the request id answers ``TAKENBACK`` from
then on (design.md 5). A waiter that held on its ``granted`` message (`rlock._tickets`)
must then never release those permits itself: the count would gain permits that never
existed. And it must not send a release before its confirmation was answered: a client
that released and then died with its confirmation unsent would have the grant taken back
on top of its release.

So each client keeps, per semaphore name (a release may come from another handle on the
same name), a `Ledger`: the `Confirm` of every grant held on its message and not settled
yet, and a *debt*, the permits whose grant was answered ``TAKENBACK`` and not released by
the application since. A release first waits for the name's confirmations in flight
(normally long settled), then pays the debt from its permits (`absorb`) and sends the
rest only. This mirrors the Rust client's reference; spec/vectors/tickets.json
(``holds_about``) states the rule for every client.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Dict, Set, Tuple

from ._proto import to_bytes

log = logging.getLogger("rlock")


def absorb(debt: int, permits: int) -> Tuple[int, int]:
    """A release of ``permits`` against ``debt``: (the debt left, the permits to send).
    The debt is paid first: those permits went back to the count with the take-back."""
    paid = min(debt, permits)
    return debt - paid, permits - paid


class Ledger:
    """One client's account with one plain semaphore (see the module's docstring): kept
    while it has a confirmation in flight or a debt, dropped when it has neither (a client
    that touches many names keeps none of the settled ones). Touched by the acquiring and
    releasing threads (or tasks) and by whoever settles a confirmation (the ticket
    reader, a late confirmer): under `_LOCK`."""

    def __init__(self, name: Any, book: Dict[bytes, "Ledger"], key: bytes) -> None:
        self.name = name
        self.in_flight: Set[Any] = set()
        self.debt = 0
        # Where the client keeps it, to drop it once empty.
        self._book = book
        self._key = key

    def _drop_if_empty(self) -> None:
        if not self.in_flight and not self.debt and self._book.get(self._key) is self:
            del self._book[self._key]

    def _settled(self, confirm: Any, permits: int) -> None:
        with _LOCK:
            self.in_flight.discard(confirm)
            # Only a definite TAKENBACK: the server gave the permits back itself. A
            # confirmation left in doubt (no answer within the retry limit, another
            # refusal) makes no debt, and the release is sent: a server that took the
            # grant back answers TAKENBACK to every retry, so doubt after them means it
            # could not be reached. If it took the grant back all the same (its grant's
            # connection gone, no retry reaching it within the limit), the count gains
            # those permits: the residual risk of an unreachable server. A TAKENBACK that
            # comes after its release was sent (the release's wait ran out first) still
            # makes a debt: the next release pays it, and the count is right again.
            if confirm.taken_back:
                self.debt += permits
            self._drop_if_empty()
        if confirm.taken_back:
            log.warning("rlock: semaphore %r: a grant of %d permit(s) was taken back by the "
                        "server (its ticket connection closed before the confirmation "
                        "landed): the work it guarded ran without it, and the next "
                        "release of as many permits is not sent", self.name, permits)


#: Every ledger's state, and the ledgers of each client (by semaphore name).
_LOCK = threading.Lock()
_LEDGERS: "weakref.WeakKeyDictionary[Any, Dict[bytes, Ledger]]" = weakref.WeakKeyDictionary()


def held(redis: Any, name: Any, confirm: Any, permits: int) -> None:
    """Client ``redis`` (a redis-py client, blocking or asyncio) holds a grant of
    ``permits`` of semaphore ``name`` on its message, its confirmation ``confirm`` (a
    `rlock._tickets.Confirm`): in flight until settled; a debt if taken back."""
    key = to_bytes(name)
    with _LOCK:
        book = _LEDGERS.get(redis)
        if book is None:
            book = _LEDGERS[redis] = {}
        account = book.get(key)
        if account is None:
            account = book[key] = Ledger(name, book, key)
        if confirm.outcome is None:
            account.in_flight.add(confirm)
    confirm.when_settled(lambda: account._settled(confirm, permits))


def _account(redis: Any, name: Any) -> Any:
    book = _LEDGERS.get(redis)
    return None if book is None else book.get(to_bytes(name))


def in_flight(redis: Any, name: Any) -> Tuple[Any, ...]:
    """The confirmations of ``name``'s grants to ``redis`` not settled yet, which a
    release waits for."""
    with _LOCK:
        account = _account(redis, name)
        return () if account is None else tuple(account.in_flight)


def release(redis: Any, name: Any, permits: int) -> int:
    """A release of ``permits`` by the application: pays the debt first; returns how many
    permits to send (0: none, the whole release went to the debt)."""
    with _LOCK:
        account = _account(redis, name)
        if account is None or not account.debt or permits <= 0:
            return permits  # (a count the server refuses is sent as it is)
        account.debt, send = absorb(account.debt, permits)
        account._drop_if_empty()
        return send


def debt(redis: Any, name: Any) -> int:
    """The permits of ``name`` taken back from ``redis`` and not released since."""
    with _LOCK:
        account = _account(redis, name)
        return 0 if account is None else account.debt
