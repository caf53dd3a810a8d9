"""`rlock.Lock`: a drop-in for redis-py's `redis.lock.Lock` on the rlock module's commands.

`r.lock("name", lock_class=rlock.Lock)` gives the same API and exceptions as redis-py's
Lock, but a contended `acquire` waits *in the server* (a queued ticket: FIFO, the lock
handed over directly on release) instead of sleeping and polling, and a lock taken
without ``timeout`` is kept alive by a watchdog thread instead of living forever. The
logic is `rlock._lock.LockOps`, shared with `rlock.asyncio.Lock`; this class adds the
blocking ``acquire`` signature and ``with``.
"""

from __future__ import annotations

from types import TracebackType
from typing import Optional, Type, Union

from ._io import SyncIO
from ._lock import LockOps, OnLost  # noqa: F401  (OnLost: re-exported for typing)
from ._plan import Number


class Lock(LockOps):
    """A distributed lock on the rlock module, API-compatible with ``redis.lock.Lock``
    (see `rlock._lock.LockOps` for the differences)."""

    _io_class = SyncIO

    def __enter__(self) -> "Lock":
        """Acquires (blocking as configured); raises LockError if that times out."""
        return self._run(self._enter_op())

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        """Releases the lock (see ``raise_on_release_error``)."""
        self._run(self._exit_op())

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Takes the lock; True once held, False if not taken (non-blocking or timed out).

        A blocking acquire waits in the server, in arrival order, until the lock is handed
        to it or the wait budget ends (`rlock._plan.plan_wait`). ``token`` (bytes or str)
        is the rlock owner id; a fresh uuid by default. Arguments left None take the
        constructor's values.
        """
        return self._run(self._acquire_op(sleep, blocking, blocking_timeout, token))
