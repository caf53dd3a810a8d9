"""The logic of the redis-py-compatible Lock, once for `rlock.Lock` and `rlock.asyncio.Lock`.

redis-py's blocking and asyncio Locks have (almost) the same surface; here it is written
once, as generators of effects (`rlock._proto`) run by the class's driver (`SyncIO` or
`AsyncIO`, as for every other primitive in `rlock._ops`). The two front classes only add
what differs in redis-py itself: ``acquire``'s signature (asyncio has no ``sleep``) and
``with`` against ``async with``. Preconditions (`LockError` for an unlocked lock) are
checked when a method is called, before anything is awaited, as redis-py does.
"""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace
from typing import Any, Callable, Dict, Optional, Union

from redis.exceptions import ConnectionError, LockError, LockNotOwnedError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _ops, _plan, _proto, _replicas
from ._ops import Op, Result
from ._plan import Number
from ._proto import Call, Sleep, Watch
from ._replicas import ReplicaSync
from .errors import OutcomeUnknown

log = logging.getLogger("rlock")

#: Called when a renewal finds the lock gone: ``(name, token)`` (a coroutine function is
#: awaited under asyncio).
OnLost = Callable[[Any, bytes], Any]


class LockOps:
    """A distributed lock on the rlock module, API-compatible with redis-py's Lock.

    The key is a Redisson-layout hash ``{token: hold count}`` whose TTL is the lease, so
    Redisson clients and the Rust crate interoperate on the same keys. Differences from
    redis-py's Lock (README, "Python client"): a waiting ``acquire`` is queued in the
    server and served first come, first served; ``timeout=None`` means a watchdog lease
    (``watchdog_timeout``, renewed every third of it) rather than a key that never
    expires; acquiring again with the *same* explicit token re-enters the lock.
    """

    _io_class: Any = None

    def __init__(
        self,
        redis: Any,
        name: Any,
        timeout: Optional[Number] = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Optional[Number] = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        watchdog_timeout: Number = _plan.DEFAULT_WATCHDOG_TIMEOUT,
        on_lost: Optional[OnLost] = None,
        replica_sync: Optional[ReplicaSync] = _replicas.DEFAULT,
    ) -> None:
        """Creates the lock object (no I/O), with redis-py's arguments and two more.

        ``timeout``: the lease in seconds, or None for watchdog mode. ``sleep``: redis-py's
        polling interval; rlock does not poll, but keeps it as the margin by which a
        bounded wait ends before ``blocking_timeout`` (and uses it to poll a key that holds
        a non-lock value). ``blocking`` / ``blocking_timeout``: as redis-py's.
        ``thread_local``: keep the token per thread (redis-py's default) or shared.
        ``raise_on_release_error``: if False, leaving the ``with`` block logs instead of
        raising when the lock was no longer held (redis-py >= 5.3 passes it).
        ``watchdog_timeout``: the lease of a lock without ``timeout``, in seconds.
        ``on_lost``: called ``(name, token)`` when a renewal finds that the lock is no
        longer held (it expired or was taken away). ``replica_sync``: after each acquire,
        wait for the server's replicas to have the lock (default: every replica, 1 s;
        ``ReplicaSync(n, timeout)`` a fixed number; None: off), else release it and raise
        `ReplicaSyncError` (README, "Replicas and failover").
        """
        self.redis = redis
        self.name = name
        self.timeout = timeout
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        self.local = threading.local() if self.thread_local else SimpleNamespace()
        self.local.token = None
        self.watchdog_timeout = watchdog_timeout
        self.on_lost = on_lost
        self.replica_sync = replica_sync
        # Waits go through the client's ticket connection (rlock._io, rlock._tickets).
        self._io = self._io_class(redis)
        self._watchdogs: Dict[bytes, Any] = {}
        self._watchdogs_lock = threading.Lock()
        # What this handle's last waiting acquire found (rlock._ops.try_first).
        self._contention = _plan.Contention()

    def _run(self, op: Op) -> Result:
        if self._io.redis is not self.redis:  # code (and tests) may swap ``lock.redis``
            self._io = self._io_class(self.redis)
        return self._io.run(op)

    # ---- acquire ------------------------------------------------------------------------

    def _acquire_op(self, sleep: Optional[Number], blocking: Optional[bool],
                    blocking_timeout: Optional[Number],
                    token: Optional[Union[str, bytes]]) -> Op:
        sleep = self.sleep if sleep is None else sleep
        blocking = self.blocking if blocking is None else blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        if token is None:
            token_bytes = _plan.new_token()
        else:
            token_bytes = _plan.encode_token(token, _encoder(self.redis))
        stop_at = None if blocking_timeout is None else time.monotonic() + blocking_timeout
        lease = _plan.lease_ms(self.timeout, self.watchdog_timeout)
        request_id = _plan.new_request_id()
        failures = 0
        # A waiting acquire asks first without waiting unless this handle found the lock
        # held lately (rlock._ops.try_first); a re-entry (this token holds it) does not.
        trying = (blocking and getattr(self.local, "token", None) != token_bytes
                  and self._contention.tries_first(time.monotonic()))
        while True:
            wait = _plan.plan_wait(blocking, stop_at, sleep, time.monotonic())
            tried = trying and wait.ms is not None
            args = _plan.acquire_args(self.name, token_bytes, lease,
                                      _plan.Wait(None) if tried else wait, request_id)
            shape = None
            try:
                if tried:
                    reply = yield from _ops.try_first(
                        self._contention, args,
                        None if wait.ms == 0 else time.monotonic() + wait.ms / 1000)
                elif wait.ms is None:
                    reply = yield Call(tuple(args))
                else:
                    shape = _proto.waiting(args[:4], wait.ms, request_id)
                    # The server's wait ends sooner than ours, so that its timeout is
                    # normally in by our deadline (`_plan.plan_wait`).
                    shape.lead_ms = _plan.lead_ms(sleep)
                    reply = yield _proto.Wait(shape)
            except OutcomeUnknown:
                raise  # scripts mode: the acquire script may have run (no request id)
            except (ConnectionError, RedisTimeoutError):
                # Retried with the same request id (and what is left of the wait): if the
                # lost call did take the lock, the server answers nil again.
                failures += 1
                if failures >= _plan.ACQUIRE_ATTEMPTS:
                    raise
                continue
            except ResponseError as e:
                if not _plan.not_a_lock(e):
                    raise
                # The key holds a value that is not a lock: nothing in the server will
                # wake us when it goes, so do what redis-py's Lock does, poll every sleep.
                trying = False
                if not blocking:
                    return False
                if stop_at is not None and time.monotonic() + sleep > stop_at:
                    return False
                yield Sleep(sleep)
                continue
            if tried:
                trying = False
                if reply is not None:  # held: queue at once with what is left of the wait
                    if _plan.plan_wait(blocking, stop_at, sleep, time.monotonic()).ms is None:
                        return False
                    continue
            elif shape is not None:
                _ops.waited(self._contention, shape)
            if reply is not None:
                if reply == -2 and wait.ms is not None:
                    continue  # freed at the very instant the wait ended: try again
                return False
            self.local.token = token_bytes
            if not self.timeout:
                yield from self._start_watchdog(token_bytes, lease)

            def give_back() -> Op:
                self.local.token = None
                return self._release_op(token_bytes)

            yield from _replicas.check_op(self.redis, self.replica_sync, self.name,
                                          _plan.renew_args(self.name, token_bytes, lease),
                                          give_back)
            return True

    # ---- reads --------------------------------------------------------------------------

    def locked(self) -> Result:
        """True if the key is held by anyone (any value at the key counts, as in redis-py)."""
        return self._run(self._locked_op())

    def _locked_op(self) -> Op:
        return bool((yield Call(("EXISTS", self.name))))

    def owned(self) -> Result:
        """True if this lock's token (this thread's, by default) holds the key."""
        return self._run(self._owned_op(self.local.token))

    def _owned_op(self, token: Optional[bytes]) -> Op:
        if token is None:
            return False
        try:
            return bool((yield Call(("HEXISTS", self.name, token))))
        except ResponseError as e:
            if _plan.not_a_lock(e):
                return False
            raise

    @property
    def lost(self) -> bool:
        """True if the watchdog of the current hold found the lock gone (watchdog mode)."""
        token = self.local.token
        watchdog = self._watchdog(token) if token is not None else None
        return watchdog is not None and watchdog.lost

    # ---- release ------------------------------------------------------------------------

    def release(self) -> Result:
        """Gives back one hold; raises LockNotOwnedError if the token no longer held it.

        Raises LockError at once if nothing is held. The token is forgotten, as in
        redis-py, unless the server says the same token still holds the lock (it was
        re-entered with an explicit token).
        """
        token = self.local.token
        if token is None:
            raise LockError("Cannot release an unlocked lock", lock_name=self.name)
        self.local.token = None
        return self.do_release(token)

    def do_release(self, expected_token: bytes) -> Result:
        """RLOCK.RELEASE with a fresh request id; stops the watchdog once freed."""
        return self._run(self._release_op(expected_token))

    def _release_op(self, token: bytes) -> Op:
        watchdog = self._watchdog(token)
        if watchdog is not None:
            watchdog.releasing = True
        lease = _plan.lease_ms(self.timeout, self.watchdog_timeout)
        try:
            reply = yield Call(tuple(
                _plan.release_args(self.name, token, lease, _plan.new_request_id())))
        except ResponseError as e:
            if not _plan.not_a_lock(e):
                self._stop_watchdog(token)
                raise
            reply = None
        except BaseException:
            # The outcome is unknown and the token is forgotten (as in redis-py): stop
            # renewing, so that a lock this release did not free expires with its lease.
            self._stop_watchdog(token)
            raise
        if reply == 0:
            self.local.token = token
            if watchdog is not None:
                watchdog.releasing = False
            return None
        self._stop_watchdog(token)
        if reply is None:
            raise LockNotOwnedError("Cannot release a lock that's no longer owned",
                                    lock_name=self.name)
        return None

    # ---- extend / reacquire -------------------------------------------------------------

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Result:
        """Adds ``additional_time`` seconds to the lease (or sets it, ``replace_ttl``)."""
        self._check_lease("extend")
        return self.do_extend(additional_time, replace_ttl)

    def do_extend(self, additional_time: Number, replace_ttl: bool) -> Result:
        """Renews to PTTL + the addition; RENEW checks the owner, so a race is harmless.

        The PTTL is read one round trip before the RENEW, so the new lease is at most that
        round trip longer than asked. No script is needed (works where EVAL is denied).
        """
        return self._run(self._extend_op(additional_time, replace_ttl))

    def _extend_op(self, additional_time: Number, replace_ttl: bool) -> Op:
        pttl = -1 if replace_ttl else (yield Call(("PTTL", self.name)))
        lease = _plan.extended_lease(pttl, _plan.to_ms(additional_time), replace_ttl)
        if lease is None or not (yield from self._renew_op(self.local.token, lease)):
            raise LockNotOwnedError("Cannot extend a lock that's no longer owned",
                                    lock_name=self.name)
        return True

    def reacquire(self) -> Result:
        """Resets the lease to ``timeout``."""
        self._check_lease("reacquire")
        return self.do_reacquire()

    def do_reacquire(self) -> Result:
        """RLOCK.RENEW to ``timeout``; LockNotOwnedError if the token no longer holds it."""
        return self._run(self._reacquire_op())

    def _reacquire_op(self) -> Op:
        lease = _plan.lease_ms(self.timeout, self.watchdog_timeout)
        if not (yield from self._renew_op(self.local.token, lease)):
            raise LockNotOwnedError("Cannot reacquire a lock that's no longer owned",
                                    lock_name=self.name)
        return True

    def _check_lease(self, what: str) -> None:
        if self.local.token is None:
            raise LockError(f"Cannot {what} an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError(f"Cannot {what} a lock with no timeout", lock_name=self.name)

    def _renew_op(self, token: bytes, lease: int) -> Op:
        try:
            return bool((yield Call(tuple(_plan.renew_args(self.name, token, lease)))))
        except ResponseError as e:
            if _plan.not_a_lock(e):
                return False
            raise

    # ---- the context manager's two halves ------------------------------------------------

    def _enter_op(self) -> Op:
        if (yield from self._acquire_op(None, None, None, None)):
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    def _exit_op(self) -> Op:
        try:
            token = self.local.token
            if token is None:
                raise LockError("Cannot release an unlocked lock", lock_name=self.name)
            self.local.token = None
            yield from self._release_op(token)
        except LockError:
            if self.raise_on_release_error:
                raise
            log.warning("rlock: lock %r was no longer held when leaving its block", self.name)

    # ---- watchdog -----------------------------------------------------------------------

    def _watchdog(self, token: bytes) -> Any:
        with self._watchdogs_lock:
            return self._watchdogs.get(token)

    def _start_watchdog(self, token: bytes, lease: int) -> Op:
        with self._watchdogs_lock:
            if token in self._watchdogs:  # re-entered with the same token: already renewed
                return
        on_lost = self.on_lost
        handle = yield Watch(lambda: self._renew_op(token, lease), lease, self.name,
                             (lambda: on_lost(self.name, token)) if on_lost else None)
        with self._watchdogs_lock:
            self._watchdogs[token] = handle

    def _stop_watchdog(self, token: bytes) -> None:
        with self._watchdogs_lock:
            watchdog = self._watchdogs.pop(token, None)
        if watchdog is not None:
            watchdog.stop()


def _encoder(redis: Any) -> Any:
    """The client's encoder: on its pool for ``Redis``, on itself for a cluster client."""
    pool = getattr(redis, "connection_pool", None)
    return pool.get_encoder() if pool is not None else redis.get_encoder()
