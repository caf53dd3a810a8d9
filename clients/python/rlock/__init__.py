"""rlock: redis-py locks that wait in the server (the rlock Redis module's RLOCK.* commands).

`rlock.Lock` is a drop-in for `redis.lock.Lock` (``r.lock("name", lock_class=rlock.Lock)``)
and `rlock.asyncio.Lock` for `redis.asyncio.lock.Lock`. The exceptions are redis-py's own.
"""

from redis.exceptions import LockError, LockNotOwnedError

from ._plan import DEFAULT_WATCHDOG_TIMEOUT
from .lock import Lock
from .primitives import (CountDownLatch, ExpirableSemaphore, FencedLock, Permit, RwLock,
                         RwLockHalf, Semaphore)

__all__ = ["Lock", "RwLock", "RwLockHalf", "FencedLock", "Semaphore", "ExpirableSemaphore",
           "Permit", "CountDownLatch", "LockError", "LockNotOwnedError",
           "DEFAULT_WATCHDOG_TIMEOUT"]
__version__ = "0.1.0"
