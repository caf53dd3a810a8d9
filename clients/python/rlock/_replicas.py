"""Replica sync after an acquire, written once for threads and asyncio (as `rlock._ops`).

Redisson's ``checkLockSyncedSlaves``: once a lock, a fenced lock or a read-write lock side
is taken, ``RENEW`` then ``WAIT n timeout`` on one connection (the RENEW is a write of
that connection, so the WAIT counts the replicas that have the lock; the acquire itself
may have been served on the ticket connection). Fewer acknowledgements than wanted: the
hold is released again and the acquire raises `ReplicaSyncError`. The Rust client's
``proto/replicas.rs`` and ``aio/lock.rs`` (``acquire_as``) are the reference.

By default ``n`` is every replica the server has, read with ``ROLE`` at most once per
`REFRESH` per client (a refused ``ROLE``, e.g. ``-@dangerous``, counts as none), so a
server without replicas pays that one command now and then and nothing per acquire. In
scripts mode the RENEW is Redisson's renew script, and the check follows Redisson's own
acquire script, as Redisson's does.

On a cluster client the check runs on the node that owns the key: ``ROLE`` is asked
there (a count per client and node), and RENEW + WAIT go down one connection of that
node (``Pipe(at=key)``). Anywhere else the WAIT would count another node's replicas and
another connection's writes (redis-py's cluster client sends a keyless WAIT to every
node and sums the replies). Pure but for the per-client cache of counts and the cluster
client's slot map (read, not asked); the drivers (`rlock._io`) run the effects.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generator, List, Optional

from redis.exceptions import LockError, ResponseError

from . import _mode, _scripts
from ._proto import Call, Pipe, to_bytes

Op = Generator[Any, Any, Any]

#: How long a replica count is trusted, in seconds (Redisson rescans topology every second).
REFRESH = 1.0


@dataclass(frozen=True)
class ReplicaSync:
    """How an acquire waits for replicas: ``replicas`` acknowledgements (None: every
    replica the server has) within ``timeout`` seconds (Redisson's ``slavesSyncTimeout``,
    1 s). Pass ``replica_sync=None`` to a lock to turn the check off."""

    replicas: Optional[int] = None
    timeout: float = 1.0

    def __post_init__(self) -> None:
        if self.replicas is not None and (not isinstance(self.replicas, int)
                                          or self.replicas < 0):
            raise ValueError(f"replicas must be None or an int >= 0, not {self.replicas!r}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {self.timeout!r}")


#: The default of every lock: wait up to 1 s for every replica the server has.
DEFAULT = ReplicaSync()


class ReplicaSyncError(LockError):
    """Fewer replicas than wanted acknowledged an acquire in time; the hold was released."""

    def __init__(self, name: Any, wanted: int, acked: int) -> None:
        message = (f"lock {name!r}: {acked} of {wanted} replicas acknowledged the acquire "
                   f"in time; released it")
        super().__init__(message, lock_name=name)
        self.args = (message,)  # str() is the message, not the constructor's arguments
        self.wanted = wanted
        self.acked = acked


def role_replicas(reply: Any) -> int:
    """The replicas connected to the master that answered ``ROLE`` (0 for a replica's or
    a sentinel's reply: nothing to wait for there)."""
    if not isinstance(reply, (list, tuple)) or len(reply) < 3:
        return 0
    role = reply[0]
    if isinstance(role, bytes):
        role = role.decode(errors="replace")
    if role != "master" or not isinstance(reply[2], (list, tuple)):
        return 0
    return len(reply[2])


class _Count:
    """One client's last replica count of one server and when it was read (monotonic
    seconds)."""

    def __init__(self) -> None:
        self.read_at: Optional[float] = None
        self.count = 0

    def stale(self, now: float) -> bool:
        return self.read_at is None or now - self.read_at >= REFRESH


# Per client, per server: None for a plain client, the node's name ("host:port") on a
# cluster (each master has its own replicas).
_COUNTS: "weakref.WeakKeyDictionary[Any, Dict[Optional[str], _Count]]" = \
    weakref.WeakKeyDictionary()
_COUNTS_LOCK = threading.Lock()


def _count_of(redis: Any, node: Optional[str]) -> _Count:
    with _COUNTS_LOCK:
        per_node = _COUNTS.get(redis)
        if per_node is None:
            per_node = _COUNTS[redis] = {}
        c = per_node.get(node)
        if c is None:
            c = per_node[node] = _Count()
        return c


def _is_cluster(redis: Any) -> bool:
    return hasattr(redis, "get_node_from_key") and hasattr(redis, "nodes_manager")


def node_of(redis: Any, key: bytes) -> Optional[str]:
    """The name of the node that owns ``key`` in a cluster client's slot map (None off a
    cluster). A lookup: the acquire that precedes the check has filled the map."""
    if not _is_cluster(redis):
        return None
    return str(redis.get_node_from_key(key).name)


def wanted_op(redis: Any, setting: ReplicaSync, key: Optional[bytes] = None) -> Op:
    """How many replicas to wait for (0: no check), reading ``ROLE`` when the count is
    stale: on a cluster, the count of the node that owns ``key``, asked there. Two
    acquires racing on a stale count may both read it: harmless."""
    if setting.replicas is not None:
        return setting.replicas
    at = key if _is_cluster(redis) else None
    c = _count_of(redis, None if at is None else node_of(redis, at))
    now = time.monotonic()
    if c.stale(now):
        c.read_at = now  # before the read: a failing read is not retried at once either
        try:
            c.count = role_replicas((yield Call(("ROLE",), at=at)))
        except ResponseError:
            c.count = 0  # not allowed (a managed service's -@dangerous): none known
    return c.count


def applies(redis: Any, setting: Optional[ReplicaSync]) -> bool:
    """Whether an acquire through ``redis`` checks replicas (see the module docstring)."""
    return setting is not None


def sync_op(redis: Any, setting: Optional[ReplicaSync], renew: List[Any]) -> Op:
    """None once ``setting``'s replicas have the hold just taken (``renew`` re-arms its
    lease), else ``(wanted, acked)`` (the caller releases and raises)."""
    if not applies(redis, setting):
        return None
    assert setting is not None
    key = to_bytes(renew[1])  # every RENEW names its key first
    wanted = yield from wanted_op(redis, setting, key)
    if wanted == 0:
        return None
    timeout_ms = max(1, int(setting.timeout * 1000))
    if _mode.get_mode(redis) == "scripts":
        renew_call = _scripts.renew_eval(renew)  # Redisson's renew script, as Redisson
    else:
        renew_call = tuple(renew)
    # One connection (of the key's node, on a cluster): WAIT counts its own writes.
    replies = yield Pipe((renew_call, ("WAIT", wanted, timeout_ms)), at=key)
    acked = replies[-1] if isinstance(replies[-1], int) else 0
    return (wanted, acked) if acked < wanted else None


def check_op(redis: Any, setting: Optional[ReplicaSync], name: Any, renew: List[Any],
             release: Callable[[], Op]) -> Op:
    """`sync_op` for a hold just taken, which ``release()`` gives back when the replicas
    fall short (`ReplicaSyncError`) or the check itself fails (its error is raised): an
    acquire that raises must not leave a hold the caller does not know it has."""
    try:
        short = yield from sync_op(redis, setting, renew)
    except Exception:
        try:
            yield from release()
        except Exception:  # noqa: BLE001 - the check's error is the one to report
            pass  # the hold then ends with its lease (a watchdog is stopped by release)
        raise
    if short is not None:
        yield from release()
        raise ReplicaSyncError(name, *short)
