"""rlock: redis-py locks and synchronizers that wait in the server (the rlock module).

`rlock.Lock` is a drop-in for `redis.lock.Lock` (``r.lock("name", lock_class=rlock.Lock)``)
and `rlock.asyncio.Lock` for `redis.asyncio.lock.Lock`; `RwLock`, `FencedLock`,
`Semaphore`, `ExpirableSemaphore` and `CountDownLatch` are Redisson's synchronizers on
Redisson's keys, blocking here and asyncio in `rlock.asyncio`. Every waiting call of one
client is a queued ticket on one shared connection. Where the module is not loaded (a
managed Redis), every primitive runs on Redisson's own scripts instead (`set_mode`,
docs/scripts-mode.md). The exceptions are redis-py's own; a refusal of the module is
raised as its `rlock.errors` class (a redis-py ``ResponseError``), chosen by its code
word.
"""

from redis.exceptions import LockError, LockNotOwnedError

from ._plan import DEFAULT_WATCHDOG_TIMEOUT
from ._hello import NO_MODULE, PROTOCOL_VERSION, Capabilities
from ._io import capabilities, close_tickets, set_blocking_waits, ticket_connections
from ._mode import get_mode, set_mode
from . import errors
from .errors import OutcomeUnknown
from ._replicas import ReplicaSync, ReplicaSyncError
from .lock import Lock
from .primitives import (CountDownLatch, ExpirableSemaphore, FencedLock, Permit, RwLock,
                         RwLockHalf, Semaphore)

__all__ = ["Lock", "RwLock", "RwLockHalf", "FencedLock", "Semaphore", "ExpirableSemaphore",
           "Permit", "CountDownLatch", "LockError", "LockNotOwnedError",
           "ReplicaSync", "ReplicaSyncError", "OutcomeUnknown",
           "DEFAULT_WATCHDOG_TIMEOUT", "Capabilities", "NO_MODULE", "PROTOCOL_VERSION",
           "capabilities", "close_tickets", "set_blocking_waits", "ticket_connections",
           "TICKET_CONNECTION_NAME", "set_mode", "get_mode", "errors"]

#: The name of a client's ticket connection in ``CLIENT LIST``.
from ._proto import CONNECTION_NAME as TICKET_CONNECTION_NAME  # noqa: E402
__version__ = "0.1.0"
