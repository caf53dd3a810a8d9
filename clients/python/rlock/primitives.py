"""The blocking primitives: `RwLock`, `FencedLock`, `Semaphore`, `ExpirableSemaphore`
(with its `Permit`) and `CountDownLatch`, on a redis-py ``Redis`` or ``RedisCluster``.

Each class is its shared logic (`rlock._ops`) run by the threads driver (`SyncIO`) plus
``with`` support; `rlock.asyncio` pairs the same logic with the asyncio driver. Waiting
calls queue tickets on the client's one ticket connection (`rlock._tickets`).
"""

from __future__ import annotations

from ._io import SyncIO
from ._ops import (CountDownLatchOps, ExpirableSemaphoreOps, FencedLockOps, PermitOps,
                   RwHalfOps, RwLockOps, SemaphoreOps, SyncContext)


class FencedLock(SyncContext, FencedLockOps):
    """A lock whose every acquire gets a fencing token (``lock.token``) larger than any
    issued before for the name (Redisson's ``RFencedLock``). ``with lock:`` acquires
    (``LockError`` if the wait runs out) and releases."""

    _io_class = SyncIO


class RwLockHalf(SyncContext, RwHalfOps):
    """``rw.read`` or ``rw.write``: ``acquire``/``release``/``renew``, ``with rw.read:``."""

    _io_class = SyncIO


class RwLock(RwLockOps):
    """A read-write lock: ``with rw.read: ...`` / ``with rw.write: ...`` (see `RwLockOps`)."""

    _half_class = RwLockHalf


class Semaphore(SyncContext, SemaphoreOps):
    """A counting semaphore; ``with sem:`` takes and gives back one permit."""

    _io_class = SyncIO


class Permit(SyncContext, PermitOps):
    """Permits of an `ExpirableSemaphore`; ``with sem.acquire() as permit:`` releases them
    at the end of the block."""


class ExpirableSemaphore(ExpirableSemaphoreOps):
    """A semaphore of permits with ids and leases (see `ExpirableSemaphoreOps`)."""

    _io_class = SyncIO
    _permit_class = Permit


class CountDownLatch(CountDownLatchOps):
    """A countdown latch: ``try_set_count``, ``count_down``, ``wait(timeout)``."""

    _io_class = SyncIO
