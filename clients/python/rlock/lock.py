"""`rlock.Lock`: a drop-in for redis-py's `redis.lock.Lock` on the rlock module's commands.

`r.lock("name", lock_class=rlock.Lock)` gives the same API and exceptions as redis-py's
Lock, but a contended `acquire` waits *in the server* (RLOCK.ACQUIRE ... WAIT: FIFO, the
lock handed over directly on release) instead of sleeping and polling, and a lock taken
without ``timeout`` is kept alive by a watchdog thread instead of living forever. The
pure decisions (wait budgets, arguments, error meaning) live in `rlock._plan`; the
asyncio twin is `rlock.asyncio.Lock`.
"""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace, TracebackType
from typing import Any, Callable, Dict, Optional, Type, Union

from redis.exceptions import ConnectionError, LockError, LockNotOwnedError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _plan, _proto
from ._io import SyncIO
from ._plan import Number

log = logging.getLogger("rlock")

#: Called on the watchdog thread when a renewal finds the lock gone: ``(name, token)``.
OnLost = Callable[[Any, bytes], None]


class Lock:
    """A distributed lock on the rlock module, API-compatible with ``redis.lock.Lock``.

    The key is a Redisson-layout hash ``{token: hold count}`` whose TTL is the lease, so
    Redisson clients and the Rust crate interoperate on the same keys. Differences from
    redis-py's Lock, all documented in the README ("Python client"):

    * a waiting ``acquire`` blocks in the server and is served first come, first served;
      it returns within ``blocking_timeout`` like redis-py's (see `rlock._plan.plan_wait`);
    * ``timeout=None`` means a watchdog lease (``watchdog_timeout``, renewed every third
      of it on a daemon thread), not a key that never expires;
    * acquiring again with the *same* explicit token re-enters the lock (hold count + 1)
      where redis-py's would refuse; each acquire needs its release.
    """

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
        ``on_lost``: called ``(name, token)`` on the watchdog thread when a renewal finds
        that the lock is no longer held (it expired or was taken away).
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
        # Waits go through the client's ticket connection (rlock._io, rlock._tickets).
        self._io = SyncIO(redis)
        self._watchdogs: Dict[bytes, _Watchdog] = {}
        self._watchdogs_lock = threading.Lock()

    def __enter__(self) -> "Lock":
        """Acquires (blocking as configured); raises LockError if that times out."""
        if self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        """Releases the lock (see ``raise_on_release_error``)."""
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            log.warning("rlock: lock %r was no longer held when leaving its block", self.name)

    def acquire(
        self,
        sleep: Optional[Number] = None,
        blocking: Optional[bool] = None,
        blocking_timeout: Optional[Number] = None,
        token: Optional[Union[str, bytes]] = None,
    ) -> bool:
        """Takes the lock; True once held, False if not taken (non-blocking or timed out).

        A blocking acquire waits in the server, in arrival order, until the lock is handed
        to it or the wait budget ends. ``token`` (bytes or str) is the rlock owner id; a
        fresh uuid by default. Arguments left None take the constructor's values.
        """
        sleep = self.sleep if sleep is None else sleep
        blocking = self.blocking if blocking is None else blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        if token is None:
            token_bytes = _plan.new_token()
        else:
            token_bytes = _plan.encode_token(token, self.redis.get_encoder())
        stop_at = None if blocking_timeout is None else time.monotonic() + blocking_timeout
        lease = _plan.lease_ms(self.timeout, self.watchdog_timeout)
        request_id = _plan.new_request_id()
        failures = 0
        while True:
            wait = _plan.plan_wait(blocking, stop_at, sleep, time.monotonic())
            args = _plan.acquire_args(self.name, token_bytes, lease, wait, request_id)
            try:
                if wait.ms is None:
                    reply = self.redis.execute_command(*args)
                else:
                    reply = self._io.wait(_proto.waiting(args[:4], wait.ms, request_id))
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
                if not blocking:
                    return False
                if stop_at is not None and time.monotonic() + sleep > stop_at:
                    return False
                time.sleep(sleep)
                continue
            if reply is not None:
                if reply == -2 and wait.ms is not None:
                    continue  # freed at the very instant the wait ended: try again
                return False
            self.local.token = token_bytes
            if not self.timeout:
                self._start_watchdog(token_bytes, lease)
            return True

    def locked(self) -> bool:
        """True if the key is held by anyone (any value at the key counts, as in redis-py)."""
        return bool(self.redis.exists(self.name))

    def owned(self) -> bool:
        """True if this lock's token (this thread's, by default) holds the key."""
        token = self.local.token
        if token is None:
            return False
        try:
            return bool(self.redis.hexists(self.name, token))
        except ResponseError as e:
            if _plan.not_a_lock(e):
                return False
            raise

    def release(self) -> None:
        """Gives back one hold; raises LockNotOwnedError if the token no longer held it.

        The token is forgotten, as in redis-py, unless the server says the same token
        still holds the lock (it was re-entered with an explicit token).
        """
        token = self.local.token
        if token is None:
            raise LockError("Cannot release an unlocked lock", lock_name=self.name)
        self.local.token = None
        watchdog = self._watchdog(token)
        if watchdog is not None:
            watchdog.releasing = True
        lease = _plan.lease_ms(self.timeout, self.watchdog_timeout)
        try:
            reply = self.redis.execute_command(
                *_plan.release_args(self.name, token, lease, _plan.new_request_id()))
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
            return
        self._stop_watchdog(token)
        if reply is None:
            raise LockNotOwnedError("Cannot release a lock that's no longer owned",
                                    lock_name=self.name)

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> bool:
        """Adds ``additional_time`` seconds to the lease (or sets it, ``replace_ttl``)."""
        if self.local.token is None:
            raise LockError("Cannot extend an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError("Cannot extend a lock with no timeout", lock_name=self.name)
        return self.do_extend(additional_time, replace_ttl)

    def do_extend(self, additional_time: Number, replace_ttl: bool) -> bool:
        """Renews to PTTL + the addition; RENEW checks the owner, so a race is harmless.

        The PTTL is read one round trip before the RENEW, so the new lease is at most that
        round trip longer than asked. No script is needed (works where EVAL is denied).
        """
        pttl = -1 if replace_ttl else self.redis.pttl(self.name)
        lease = _plan.extended_lease(pttl, _plan.to_ms(additional_time), replace_ttl)
        if lease is None or not self._renew(self.local.token, lease):
            raise LockNotOwnedError("Cannot extend a lock that's no longer owned",
                                    lock_name=self.name)
        return True

    def reacquire(self) -> bool:
        """Resets the lease to ``timeout``."""
        if self.local.token is None:
            raise LockError("Cannot reacquire an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError("Cannot reacquire a lock with no timeout", lock_name=self.name)
        return self.do_reacquire()

    def do_reacquire(self) -> bool:
        """RLOCK.RENEW to ``timeout``; LockNotOwnedError if the token no longer holds it."""
        lease = _plan.lease_ms(self.timeout, self.watchdog_timeout)
        if not self._renew(self.local.token, lease):
            raise LockNotOwnedError("Cannot reacquire a lock that's no longer owned",
                                    lock_name=self.name)
        return True

    @property
    def lost(self) -> bool:
        """True if the watchdog of this thread's hold found the lock gone (watchdog mode)."""
        token = self.local.token
        watchdog = self._watchdog(token) if token is not None else None
        return watchdog is not None and watchdog.lost.is_set()

    def _renew(self, token: bytes, lease: int) -> bool:
        try:
            return bool(self.redis.execute_command(*_plan.renew_args(self.name, token, lease)))
        except ResponseError as e:
            if _plan.not_a_lock(e):
                return False
            raise

    def _watchdog(self, token: bytes) -> Optional["_Watchdog"]:
        with self._watchdogs_lock:
            return self._watchdogs.get(token)

    def _start_watchdog(self, token: bytes, lease: int) -> None:
        with self._watchdogs_lock:
            if token in self._watchdogs:  # re-entered with the same token: already renewed
                return
            watchdog = _Watchdog(self, token, lease)
            self._watchdogs[token] = watchdog
        watchdog.start()

    def _stop_watchdog(self, token: bytes) -> None:
        with self._watchdogs_lock:
            watchdog = self._watchdogs.pop(token, None)
        if watchdog is not None:
            watchdog.stop.set()


class _Watchdog(threading.Thread):
    """Renews one hold's lease every third of it until stopped; reports a lost lock once.

    A daemon thread, so it never keeps a process alive; release() stops it (without
    joining: a renewal in flight finishes on its own and is then ignored).
    """

    def __init__(self, lock: Lock, token: bytes, lease_ms: int) -> None:
        super().__init__(name=f"rlock-watchdog-{lock.name!r}", daemon=True)
        self.lock = lock
        self.token = token
        self.lease_ms = lease_ms
        self.stop = threading.Event()
        self.lost = threading.Event()
        # Set while a release is in flight: a renewal answered 0 then is the release
        # winning the race, not a lost lock.
        self.releasing = False

    def run(self) -> None:
        interval = self.lease_ms / 1000 * _plan.RENEW_FRACTION
        # The server's expiry is never earlier than (time the last renewal was sent + lease).
        deadline = time.monotonic() + self.lease_ms / 1000
        delay = interval
        while not self.stop.wait(delay):
            sent_at = time.monotonic()
            try:
                held = self.lock._renew(self.token, self.lease_ms)
            except (ConnectionError, RedisTimeoutError) as e:
                if time.monotonic() < deadline:
                    log.debug("rlock: renewal of %r failed (%s); retrying", self.lock.name, e)
                    delay = min(interval, _plan.RENEW_RETRY_DELAY)
                    continue
                held = False  # the lease ran out while the server could not be reached
            except Exception:  # noqa: BLE001 - a watchdog must not die silently
                log.exception("rlock: renewal of %r failed", self.lock.name)
                delay = min(interval, _plan.RENEW_RETRY_DELAY)
                continue
            if self.stop.is_set() or self.releasing:
                return
            if held:
                deadline = sent_at + self.lease_ms / 1000
                delay = interval
                continue
            self._report_lost()
            return

    def _report_lost(self) -> None:
        self.lost.set()
        log.warning("rlock: lock %r was lost (its lease ran out or it was taken away)",
                    self.lock.name)
        if self.lock.on_lost is not None:
            try:
                self.lock.on_lost(self.lock.name, self.token)
            except Exception:  # noqa: BLE001 - a callback's bug must not kill the thread
                log.exception("rlock: on_lost callback raised")
