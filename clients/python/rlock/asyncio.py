"""`rlock.asyncio.Lock`: the asyncio twin of `rlock.Lock`, a drop-in for redis-py's
`redis.asyncio.lock.Lock` (``r.lock("name", lock_class=rlock.asyncio.Lock)`` on a
`redis.asyncio.Redis`).

Same decisions as the blocking Lock (`rlock._plan`); the differences are asyncio's: the
waiting ACQUIRE is awaited on a pool connection of its own, and the watchdog is an
asyncio task on the loop that acquired the lock, cancelled on release.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from types import SimpleNamespace, TracebackType
from typing import Any, Awaitable, Callable, Dict, Optional, Type, Union

from redis.exceptions import ConnectionError, LockError, LockNotOwnedError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _plan, _proto
from ._io import AsyncIO
from ._plan import Number

log = logging.getLogger("rlock")

#: Called when a renewal finds the lock gone: ``(name, token)``; may be a coroutine function.
OnLost = Callable[[Any, bytes], Union[None, Awaitable[None]]]


class Lock:
    """A distributed lock on the rlock module, API-compatible with redis-py's asyncio Lock.

    Behaves as `rlock.Lock` (server-side FIFO waiting, watchdog when ``timeout`` is None,
    same-token re-entry), with coroutine methods where redis-py's asyncio Lock has them.
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
        """Creates the lock object (no I/O); the arguments are `rlock.Lock`'s."""
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
        self._io = AsyncIO(redis)
        self._watchdogs: Dict[bytes, _Watchdog] = {}

    async def __aenter__(self) -> "Lock":
        """Acquires (blocking as configured); raises LockError if that times out."""
        if await self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        """Releases the lock (see ``raise_on_release_error``)."""
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            log.warning("rlock: lock %r was no longer held when leaving its block", self.name)

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
        sleep = self.sleep
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
        while True:
            wait = _plan.plan_wait(blocking, stop_at, sleep, time.monotonic())
            args = _plan.acquire_args(self.name, token_bytes, lease, wait, request_id)
            try:
                if wait.ms is None:
                    reply = await self.redis.execute_command(*args)
                else:
                    reply = await self._io.wait(_proto.waiting(args[:4], wait.ms, request_id))
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
                # A non-lock value at the key: poll every sleep, as redis-py's Lock does.
                if not blocking:
                    return False
                if stop_at is not None and time.monotonic() + sleep > stop_at:
                    return False
                await asyncio.sleep(sleep)
                continue
            if reply is not None:
                if reply == -2 and wait.ms is not None:
                    continue  # freed at the very instant the wait ended: try again
                return False
            self.local.token = token_bytes
            if not self.timeout:
                self._start_watchdog(token_bytes, lease)
            return True

    async def locked(self) -> bool:
        """True if the key is held by anyone (any value at the key counts, as in redis-py)."""
        return bool(await self.redis.exists(self.name))

    async def owned(self) -> bool:
        """True if this lock's token (this thread's, by default) holds the key."""
        token = self.local.token
        if token is None:
            return False
        try:
            return bool(await self.redis.hexists(self.name, token))
        except ResponseError as e:
            if _plan.not_a_lock(e):
                return False
            raise

    def release(self) -> Awaitable[None]:
        """Gives back one hold (a coroutine, checked at call time as in redis-py).

        Raises LockError now if nothing is held; the awaitable raises LockNotOwnedError
        if the token no longer held the lock.
        """
        token = self.local.token
        if token is None:
            raise LockError("Cannot release an unlocked lock", lock_name=self.name)
        self.local.token = None
        return self.do_release(token)

    async def do_release(self, expected_token: bytes) -> None:
        """RLOCK.RELEASE with a fresh request id; stops the watchdog once freed."""
        watchdog = self._watchdogs.get(expected_token)
        if watchdog is not None:
            watchdog.releasing = True
        lease = _plan.lease_ms(self.timeout, self.watchdog_timeout)
        args = _plan.release_args(self.name, expected_token, lease, _plan.new_request_id())
        try:
            reply = await self.redis.execute_command(*args)
        except ResponseError as e:
            if not _plan.not_a_lock(e):
                self._stop_watchdog(expected_token)
                raise
            reply = None
        except BaseException:
            # The outcome is unknown and the token is forgotten (as in redis-py): stop
            # renewing, so that a lock this release did not free expires with its lease.
            self._stop_watchdog(expected_token)
            raise
        if reply == 0:
            self.local.token = expected_token
            if watchdog is not None:
                watchdog.releasing = False
            return
        self._stop_watchdog(expected_token)
        if reply is None:
            raise LockNotOwnedError("Cannot release a lock that's no longer owned",
                                    lock_name=self.name)

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Awaitable[bool]:
        """Adds ``additional_time`` seconds to the lease (or sets it, ``replace_ttl``)."""
        if self.local.token is None:
            raise LockError("Cannot extend an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError("Cannot extend a lock with no timeout", lock_name=self.name)
        return self.do_extend(additional_time, replace_ttl)

    async def do_extend(self, additional_time: Number, replace_ttl: bool) -> bool:
        """Renews to PTTL + the addition (see `rlock.Lock.do_extend`)."""
        pttl = -1 if replace_ttl else await self.redis.pttl(self.name)
        lease = _plan.extended_lease(pttl, _plan.to_ms(additional_time), replace_ttl)
        if lease is None or not await self._renew(self.local.token, lease):
            raise LockNotOwnedError("Cannot extend a lock that's no longer owned",
                                    lock_name=self.name)
        return True

    def reacquire(self) -> Awaitable[bool]:
        """Resets the lease to ``timeout``."""
        if self.local.token is None:
            raise LockError("Cannot reacquire an unlocked lock", lock_name=self.name)
        if self.timeout is None:
            raise LockError("Cannot reacquire a lock with no timeout", lock_name=self.name)
        return self.do_reacquire()

    async def do_reacquire(self) -> bool:
        """RLOCK.RENEW to ``timeout``; LockNotOwnedError if the token no longer holds it."""
        lease = _plan.lease_ms(self.timeout, self.watchdog_timeout)
        if not await self._renew(self.local.token, lease):
            raise LockNotOwnedError("Cannot reacquire a lock that's no longer owned",
                                    lock_name=self.name)
        return True

    @property
    def lost(self) -> bool:
        """True if the watchdog of the current hold found the lock gone (watchdog mode)."""
        token = self.local.token
        watchdog = self._watchdogs.get(token) if token is not None else None
        return watchdog is not None and watchdog.lost

    async def _renew(self, token: bytes, lease: int) -> bool:
        try:
            args = _plan.renew_args(self.name, token, lease)
            return bool(await self.redis.execute_command(*args))
        except ResponseError as e:
            if _plan.not_a_lock(e):
                return False
            raise

    def _start_watchdog(self, token: bytes, lease: int) -> None:
        if token in self._watchdogs:  # re-entered with the same token: already renewed
            return
        watchdog = _Watchdog(self, token, lease)
        self._watchdogs[token] = watchdog
        watchdog.task = asyncio.get_running_loop().create_task(watchdog.run())

    def _stop_watchdog(self, token: bytes) -> None:
        watchdog = self._watchdogs.pop(token, None)
        if watchdog is not None and watchdog.task is not None:
            watchdog.task.cancel()


def _encoder(redis: Any) -> Any:
    """The client's encoder: on its pool for redis.asyncio.Redis, on itself for a cluster."""
    pool = getattr(redis, "connection_pool", None)
    return pool.get_encoder() if pool is not None else redis.get_encoder()


async def _close(pool: Any, conn: Any) -> None:
    await conn.disconnect()
    await pool.release(conn)


class _Watchdog:
    """Renews one hold's lease every third of it, as an asyncio task, until cancelled."""

    def __init__(self, lock: Lock, token: bytes, lease_ms: int) -> None:
        self.lock = lock
        self.token = token
        self.lease_ms = lease_ms
        self.task: Optional[asyncio.Task] = None
        self.lost = False
        # Set while a release is in flight: a renewal answered 0 then is the release
        # winning the race, not a lost lock.
        self.releasing = False

    async def run(self) -> None:
        interval = self.lease_ms / 1000 * _plan.RENEW_FRACTION
        deadline = time.monotonic() + self.lease_ms / 1000
        delay = interval
        while True:
            await asyncio.sleep(delay)
            sent_at = time.monotonic()
            try:
                held = await self.lock._renew(self.token, self.lease_ms)
            except (ConnectionError, RedisTimeoutError) as e:
                if time.monotonic() < deadline:
                    log.debug("rlock: renewal of %r failed (%s); retrying", self.lock.name, e)
                    delay = min(interval, _plan.RENEW_RETRY_DELAY)
                    continue
                held = False
            except Exception:  # noqa: BLE001 - a watchdog must not die silently
                log.exception("rlock: renewal of %r failed", self.lock.name)
                delay = min(interval, _plan.RENEW_RETRY_DELAY)
                continue
            if self.releasing:
                return
            if held:
                deadline = sent_at + self.lease_ms / 1000
                delay = interval
                continue
            await self._report_lost()
            return

    async def _report_lost(self) -> None:
        self.lost = True
        log.warning("rlock: lock %r was lost (its lease ran out or it was taken away)",
                    self.lock.name)
        if self.lock.on_lost is not None:
            try:
                result = self.lock.on_lost(self.lock.name, self.token)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001 - a callback's bug must not kill the task
                log.exception("rlock: on_lost callback raised")


# ---- every other primitive: the shared logic of rlock._ops on the asyncio driver -------

from ._io import AsyncIO, aclose_tickets, ticket_connections  # noqa: E402,F401
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
