"""`rlock.asyncio.Lock`: the asyncio twin of `rlock.Lock`, a drop-in for redis-py's
`redis.asyncio.lock.Lock` (``r.lock("name", lock_class=rlock.asyncio.Lock)`` on a
`redis.asyncio.Redis`).

Every class here is the logic shared with the blocking classes (`rlock._lock`,
`rlock._ops`) on the asyncio driver (`rlock._io.AsyncIO`): waits are queued tickets on the
client's ticket connection of the running loop, and a watchdog is an asyncio task on the
loop that acquired, cancelled on release. Also here: `RwLock`, `FencedLock`, `Semaphore`,
`ExpirableSemaphore` (`Permit`), `CountDownLatch`, `aclose_tickets` and `capabilities`.
"""

from __future__ import annotations

from types import TracebackType
from typing import Optional, Type, Union

from ._io import AsyncIO
from ._lock import LockOps, OnLost  # noqa: F401  (OnLost: re-exported for typing)
from ._plan import Number


class Lock(LockOps):
    """A distributed lock on the rlock module, API-compatible with redis-py's asyncio Lock.

    Behaves as `rlock.Lock` (the same logic, `rlock._lock.LockOps`): server-side FIFO
    waiting, watchdog when ``timeout`` is None, same-token re-entry. ``locked``,
    ``owned``, ``release``, ``extend`` and ``reacquire`` return awaitables and check their
    preconditions when called, as redis-py's do.
    """

    _io_class = AsyncIO

    async def __aenter__(self) -> "Lock":
        """Acquires (blocking as configured); raises LockError if that times out."""
        return await self._run(self._enter_op())

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        """Releases the lock (see ``raise_on_release_error``)."""
        await self._run(self._exit_op())

    async def acquire(
        self,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Takes the lock; True once held, False if not taken (non-blocking or timed out).

        Same meaning as `rlock.Lock.acquire` (redis-py's asyncio acquire has no ``sleep``
        argument, so neither has this one).
        """
        return await self._run(self._acquire_op(None, blocking, blocking_timeout, token))


# ---- every other primitive: the shared logic of rlock._ops on the asyncio driver -------

from ._io import AsyncIO, aclose_tickets, ticket_connections  # noqa: E402,F401
from ._io import acapabilities as capabilities  # noqa: E402,F401
from ._ops import (AsyncContext, CountDownLatchOps, ExpirableSemaphoreOps,  # noqa: E402
                   FencedLockOps, PermitOps, RwHalfOps, RwLockOps, SemaphoreOps)


class FencedLock(AsyncContext, FencedLockOps):
    """`rlock.FencedLock` for ``redis.asyncio``: every method returns an awaitable;
    ``async with lock:``."""

    _io_class = AsyncIO


class RwLockHalf(AsyncContext, RwHalfOps):
    """``rw.read`` or ``rw.write`` of an asyncio `RwLock`; ``async with rw.write:``."""

    _io_class = AsyncIO


class RwLock(RwLockOps):
    """`rlock.RwLock` for ``redis.asyncio``."""

    _half_class = RwLockHalf


class Semaphore(AsyncContext, SemaphoreOps):
    """`rlock.Semaphore` for ``redis.asyncio``; ``async with sem:``."""

    _io_class = AsyncIO


class Permit(AsyncContext, PermitOps):
    """Permits of an asyncio `ExpirableSemaphore`; ``async with permit:`` releases them."""


class ExpirableSemaphore(ExpirableSemaphoreOps):
    """`rlock.ExpirableSemaphore` for ``redis.asyncio``."""

    _io_class = AsyncIO
    _permit_class = Permit


class CountDownLatch(CountDownLatchOps):
    """`rlock.CountDownLatch` for ``redis.asyncio``; ``await latch.wait(timeout)``."""

    _io_class = AsyncIO
