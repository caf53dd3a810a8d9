"""Every primitive's logic, written once for threads and asyncio.

Each public method here builds a generator of effects (`rlock._proto`) and hands it to
``self._io.run``: the blocking classes (`rlock.primitives`) get `SyncIO`, whose ``run``
returns the value; the asyncio classes (`rlock.asyncio`) get `AsyncIO`, whose ``run``
returns a coroutine. So ``sem.acquire()`` is a bool in one and an awaitable bool in the
other, from the same body; only the context-manager dunders differ (`SyncContext`,
`AsyncContext`). The server's protocol for each command: README.md, docs/*.md.

Ownership follows the Rust client: one handle is one owner (``<uuid>:<n>``, or the
``owner=`` given); acquiring again through the same handle re-enters; two handles on
one name exclude each other, even in one thread.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from typing import Any, Callable, Generator, List, Optional, Sequence, Union

from redis.exceptions import ConnectionError, LockError, LockNotOwnedError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _permits, _plan, _replicas
from ._replicas import ReplicaSync
from ._plan import FREE, HELD, Contention
from ._proto import (BUSY, Call, Settled, Shape, Sleep, Wait, Watch, new_request_id, to_bytes, took,
                     waiting)
from ._tickets import CONFIRM_RETRY_S
from .errors import OutcomeUnknown

log = logging.getLogger("rlock")

Number = Union[int, float]
#: What a public method returns: the value (blocking classes) or an awaitable of it
#: (the asyncio classes).
Result = Any
Op = Generator[Any, Any, Any]

_PROCESS = uuid.uuid4().hex
_COUNTER = itertools.count(1)


def new_owner() -> str:
    """A fresh owner id, ``<process uuid>:<n>`` (Redisson's ``<client uuid>:<thread>``)."""
    return f"{_PROCESS}:{next(_COUNTER)}"


def call(*args: Any) -> Op:
    """One command; connection errors are retried (3 attempts) with the same arguments,
    which carry the same request id where the command changes something. Not
    `OutcomeUnknown`: scripts mode's answer that a script that must not run twice may
    have run (no request id makes its retry safe)."""
    return (yield from call_effect(Call(tuple(args))))


def call_effect(effect: Call) -> Op:
    """`call` of a `Call` as given."""
    attempts = 0
    while True:
        try:
            return (yield effect)
        except OutcomeUnknown:
            raise
        except (ConnectionError, RedisTimeoutError):
            attempts += 1
            if attempts >= _plan.ACQUIRE_ATTEMPTS:
                raise


def wait_ms_for(blocking: bool, blocking_timeout: Optional[Number]) -> Optional[int]:
    """The server-side wait: None = one try, 0 = no limit, else milliseconds."""
    if not blocking:
        return None
    if blocking_timeout is None:
        return 0
    if blocking_timeout <= 0:
        return None
    return _plan.to_ms(blocking_timeout)


#: `try_first`'s answer when the handle found the lock held lately: queue at once.
NOT_TRIED: Any = object()


def try_first(contention: Optional[Contention], args: List[Any],
              by: Optional[float]) -> Op:
    """How a waiting acquire starts (spec/vectors/waits.json): unless its handle found
    the lock (or the permits) held less than `_plan.CONTENDED_FOR_S` ago, ``args`` (the
    acquire without ``WAIT``, with its request id) once on the client's quick path, by
    the wait's deadline ``by`` (None: no limit); its reply, the finding noted. Else
    `NOT_TRIED`: the caller queues at once. A try that found it held changed nothing
    (the server records no reply for it), so the wait reuses its request id. No
    ``contention`` (a re-entry, the latch): `NOT_TRIED`."""
    if contention is None or not contention.tries_first(time.monotonic()):
        return NOT_TRIED
    reply = yield from call_effect(Call(tuple(args), tries=True, by=by))
    if reply is BUSY:  # not sent: its client has enough tries in flight
        return NOT_TRIED
    contention.found(FREE if took(to_bytes(args[0]).upper(), reply) else HELD,
                     time.monotonic())
    return reply


def waited(contention: Optional[Contention], shape: Optional[Shape]) -> None:
    """Notes what a wait found: free if its command was answered with the grant itself
    (``shape.at_once``), else held (``QUEUED``, a timeout, a blocked ``WAIT``; ``shape``
    None: a look after the wait ran out)."""
    if contention is not None:
        at_once = shape is not None and shape.at_once
        contention.found(FREE if at_once else HELD, time.monotonic())


def attempt(base: List[Any], wait_ms: Optional[int], latch: bool = False,
            contention: Optional[Contention] = None) -> Op:
    """``base`` once (``wait_ms`` None) or waiting in the server, with a request id.

    A wait whose connection fails is retried (3 attempts in all) with the same request
    id and what is left of the wait: a grant made meanwhile is replayed, never doubled.
    With ``contention`` (the handle's: `try_first`), a wait may start with a try.
    """
    return (yield from attempt_held(base, wait_ms, latch, contention))[0]


def attempt_held(base: List[Any], wait_ms: Optional[int], latch: bool = False,
                 contention: Optional[Contention] = None) -> Op:
    """`attempt`, returning (the reply, the `rlock._tickets.Confirm` of a grant held on
    its ``granted`` message, or None where the reply was collected or answered at once)."""
    rid = new_request_id()
    if wait_ms is None:
        return (yield from call(*(base if latch else base + ["ID", rid]))), None
    started = time.monotonic()
    shape = waiting(base, wait_ms, rid, latch)
    reply = yield from try_first(contention, base + ["ID", rid],
                                 None if wait_ms == 0 else started + wait_ms / 1000)
    if reply is not NOT_TRIED and (took(shape.verb, reply)
                                   or shape.wait_left(time.monotonic() - started) is None):
        return reply, None  # taken; or held, with no time left to wait
    since: Optional[float] = started  # what the try took counts against the wait
    attempts = 0
    while True:
        try:
            reply = yield Wait(shape, since=since)
            waited(contention, shape)
            return reply, (shape.confirm if shape.held_on_message else None)
        except OutcomeUnknown:
            raise
        except (ConnectionError, RedisTimeoutError):
            attempts += 1
            if attempts >= _plan.ACQUIRE_ATTEMPTS:
                raise
        left = waiting(base, wait_ms, rid, latch).wait_left(time.monotonic() - started)
        if left is None:  # the wait is over: one look, which replays a grant if any
            reply = yield from call(*shape.with_wait(None, False))
            waited(contention, None)
            return reply, None
        shape, since = waiting(base, left, rid, latch), None


def watchdog(renew: Callable[[], Op], lease_ms: int, name: Any) -> Op:
    """Renews every third of the lease until stopped (``Sleep`` answers True; asyncio
    cancels the task). Returns False once a renewal answers that the hold is gone or the
    lease ran out while the server could not be reached."""
    interval = lease_ms / 1000 * _plan.RENEW_FRACTION
    deadline = time.monotonic() + lease_ms / 1000
    delay = interval
    while True:
        if (yield Sleep(delay)):
            return True
        sent_at = time.monotonic()
        try:
            held = yield from renew()
        except (ConnectionError, RedisTimeoutError) as e:
            if time.monotonic() < deadline:
                log.debug("rlock: renewal of %r failed (%s); retrying", name, e)
                delay = min(interval, _plan.RENEW_RETRY_DELAY)
                continue
            return False
        except Exception:  # noqa: BLE001 - a watchdog must not die silently
            log.exception("rlock: renewal of %r failed", name)
            delay = min(interval, _plan.RENEW_RETRY_DELAY)
            continue
        if not held:
            return False
        deadline = sent_at + lease_ms / 1000
        delay = interval


class _Front:
    """What every handle has: the client, the key and the driver."""

    #: The driver class (`SyncIO` or `AsyncIO`), set by the concrete class.
    _io_class: Any = None

    def __init__(self, redis: Any, name: Any, use_tickets: bool = True) -> None:
        self.redis = redis
        self.name = name
        self._io = self._io_class(redis, use_tickets)

    def _run(self, op: Op) -> Result:
        return self._io.run(op)

    def _enter_op(self) -> Op:
        raise NotImplementedError

    def _exit_op(self) -> Op:
        raise NotImplementedError


class SyncContext:
    """``with handle:`` for the blocking classes."""

    def __enter__(self) -> Any:
        return self._run(self._enter_op())  # type: ignore[attr-defined]

    def __exit__(self, *exc: Any) -> None:
        self._run(self._exit_op())  # type: ignore[attr-defined]


class AsyncContext:
    """``async with handle:`` for the asyncio classes."""

    async def __aenter__(self) -> Any:
        return await self._run(self._enter_op())  # type: ignore[attr-defined]

    async def __aexit__(self, *exc: Any) -> None:
        await self._run(self._exit_op())  # type: ignore[attr-defined]


# ---- held locks: the fenced lock and the two halves of the read-write lock ------------


class _HoldOps(_Front):
    """A re-entrant hold with a lease or a watchdog, its owner fixed per handle."""

    def __init__(self, redis: Any, name: Any, timeout: Optional[Number] = None,
                 blocking: bool = True, blocking_timeout: Optional[Number] = None, *,
                 owner: Optional[str] = None,
                 watchdog_timeout: Number = _plan.DEFAULT_WATCHDOG_TIMEOUT,
                 on_lost: Optional[Callable[[], Any]] = None,
                 use_tickets: bool = True,
                 replica_sync: Optional[ReplicaSync] = _replicas.DEFAULT) -> None:
        """No I/O. ``timeout``: the lease in seconds (None: a ``watchdog_timeout`` lease
        renewed every third of it while held; ``on_lost()`` is called if a renewal finds
        the hold gone). ``blocking``/``blocking_timeout``: the defaults of ``acquire``, as
        in redis-py's Lock. ``owner``: the owner id (default ``<uuid>:<n>``).
        ``use_tickets=False`` waits blocked in the server on a connection of its own.
        ``replica_sync``: after each acquire, wait for the server's replicas to have the
        hold (default: every replica, 1 s; ``ReplicaSync(n, timeout)``: a fixed number;
        None: off), else release it and raise `ReplicaSyncError`."""
        super().__init__(redis, name, use_tickets)
        self.replica_sync = replica_sync
        self.timeout = timeout
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.owner = owner or new_owner()
        self.watchdog_timeout = watchdog_timeout
        self.on_lost = on_lost
        self._holds = 0
        self._watch: Any = None
        self._contention = Contention()

    # What a concrete hold says: its commands and what its acquire reply means.
    def _acquire_base(self, lease: int) -> List[Any]:
        raise NotImplementedError

    def _release_base(self, lease: int) -> List[Any]:
        raise NotImplementedError

    def _renew_base(self, lease: int) -> List[Any]:
        raise NotImplementedError

    def _acquired(self, reply: Any) -> bool:
        return reply is None

    @property
    def _lease(self) -> int:
        return _plan.lease_ms(self.timeout, self.watchdog_timeout)

    def acquire(self, blocking: Optional[bool] = None,
                blocking_timeout: Optional[Number] = None) -> Result:
        """Takes (or re-enters) the hold: True once held, False if not within the wait.

        A blocking acquire waits in the server, first come first served, as a queued
        ticket on the client's shared ticket connection. Arguments left None take the
        constructor's values (``blocking_timeout`` None: no limit).
        """
        return self._run(self._acquire_op(blocking, blocking_timeout))

    def _acquire_op(self, blocking: Optional[bool], blocking_timeout: Optional[Number]) -> Op:
        blocking = self.blocking if blocking is None else blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        lease = self._lease
        # A re-entry is answered at once: it neither tries first nor tells of contention.
        reply = yield from attempt(self._acquire_base(lease),
                                   wait_ms_for(blocking, blocking_timeout),
                                   contention=None if self._holds else self._contention)
        if not self._acquired(reply):
            return False
        self._holds += 1
        if self._holds == 1 and not self.timeout:
            self._watch = yield Watch(lambda: self._renew_op(lease), lease, self.name,
                                      self.on_lost)
        yield from _replicas.check_op(self.redis, self.replica_sync, self.name,
                                      self._renew_base(lease), self._release_op)
        return True

    def release(self) -> Result:
        """Gives back one hold; raises ``LockNotOwnedError`` if it was no longer held (the
        critical section ran unprotected) and ``LockError`` if this handle holds none."""
        return self._run(self._release_op())

    def _release_op(self) -> Op:
        if self._holds == 0:
            raise LockError("Cannot release an unlocked lock", lock_name=self.name)
        if self._holds == 1:
            self._stop_watch()
        reply = yield from call(*self._release_base(self._lease), "ID", new_request_id())
        if reply == 0:
            self._holds -= 1
            return None
        self._holds = 0
        self._stop_watch()
        if reply is None:
            raise LockNotOwnedError("Cannot release a lock that's no longer owned",
                                    lock_name=self.name)
        return None

    def renew(self) -> Result:
        """Re-arms the lease of every hold of this owner; True if held."""
        return self._run(self._renew_op(self._lease))

    def _renew_op(self, lease: int) -> Op:
        return bool((yield from call(*self._renew_base(lease))))

    @property
    def held(self) -> bool:
        """True while this handle holds (as far as it knows: see ``lost``)."""
        return self._holds > 0

    @property
    def lost(self) -> bool:
        """True if the watchdog found the hold gone (watchdog mode only)."""
        return self._watch is not None and self._watch.lost

    def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    def _enter_op(self) -> Op:
        if not (yield from self._acquire_op(None, None)):
            raise LockError("Unable to acquire lock within the time specified",
                            lock_name=self.name)
        return self

    def _exit_op(self) -> Op:
        return (yield from self._release_op())


class FencedLockOps(_HoldOps):
    """The fenced lock (``RFENCED.ACQUIRE`` + ``RLOCK.*``): every acquire returns a
    fencing token larger than any issued before for the name."""

    #: The token of this handle's last acquire (None before the first).
    token: Optional[int] = None

    def _acquire_base(self, lease: int) -> List[Any]:
        return ["RFENCED.ACQUIRE", self.name, self.owner, lease]

    def _release_base(self, lease: int) -> List[Any]:
        return ["RLOCK.RELEASE", self.name, self.owner, lease]

    def _renew_base(self, lease: int) -> List[Any]:
        return ["RLOCK.RENEW", self.name, self.owner, lease]

    def _acquired(self, reply: Any) -> bool:
        if isinstance(reply, list) and len(reply) == 2 and reply[0] is None:
            self.token = int(reply[1])
            return True
        return False

    def get_token(self) -> Result:
        """The last token the server issued for the name (any holder), or None."""
        return self._run(self._get_token_op())

    def _get_token_op(self) -> Op:
        reply = yield from call("RFENCED.GETTOKEN", self.name)
        return None if reply is None else int(reply)


class RwHalfOps(_HoldOps):
    """One side (``READ`` or ``WRITE``) of a read-write lock (``RRWLOCK.*``)."""

    side = "READ"

    def __init__(self, *args: Any, side: str = "READ", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.side = side

    def _acquire_base(self, lease: int) -> List[Any]:
        return ["RRWLOCK.ACQUIRE", self.name, self.side, self.owner, lease]

    def _release_base(self, lease: int) -> List[Any]:
        return ["RRWLOCK.RELEASE", self.name, self.side, self.owner, lease]

    def _renew_base(self, lease: int) -> List[Any]:
        return ["RRWLOCK.RENEW", self.name, self.side, self.owner, lease]


class RwLockOps:
    """Redisson's ``RReadWriteLock``: ``read`` and ``write`` halves of one owner. Many
    readers or one writer, both re-entrant; the writer may also read; a queued writer is
    served before readers that came after it; each read hold has its own lease. Reading
    and then asking for the write lock is refused at once (``ResponseError``)."""

    _half_class: Any = RwHalfOps

    def __init__(self, redis: Any, name: Any, timeout: Optional[Number] = None,
                 blocking: bool = True, blocking_timeout: Optional[Number] = None, *,
                 owner: Optional[str] = None,
                 watchdog_timeout: Number = _plan.DEFAULT_WATCHDOG_TIMEOUT,
                 on_lost: Optional[Callable[[], Any]] = None,
                 use_tickets: bool = True,
                 replica_sync: Optional[ReplicaSync] = _replicas.DEFAULT) -> None:
        """No I/O; the arguments are those of each half (`FencedLock`'s)."""
        self.name = name
        self.owner = owner or new_owner()
        kwargs = dict(timeout=timeout, blocking=blocking, blocking_timeout=blocking_timeout,
                      owner=self.owner, watchdog_timeout=watchdog_timeout, on_lost=on_lost,
                      use_tickets=use_tickets, replica_sync=replica_sync)
        self.read = self._half_class(redis, name, side="READ", **kwargs)
        self.write = self._half_class(redis, name, side="WRITE", **kwargs)


# ---- semaphores -------------------------------------------------------------------------


class SemaphoreOps(_Front):
    """Redisson's ``RSemaphore`` (``RSEMAPHORE.*``): a count of permits, FIFO waiters.

    Nobody records who holds permits: a holder that dies keeps them forever (use
    `ExpirableSemaphore` when holders may crash).

    A waiter holds on its grant's ``granted`` message where the server names
    ``ticket-holds`` (design.md 5) and confirms off its path. Because the server takes an
    unconfirmed grant back by releasing its permits, the client keeps, per semaphore name,
    the confirmations in flight and the permits taken back (`rlock._permits`): a release
    waits for the first and pays the second before it sends anything.
    """

    def __init__(self, redis: Any, name: Any, blocking: bool = True,
                 blocking_timeout: Optional[Number] = None, *,
                 use_tickets: bool = True) -> None:
        """No I/O; ``blocking``/``blocking_timeout`` are ``acquire``'s defaults."""
        super().__init__(redis, name, use_tickets)
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self._contention = Contention()

    def try_set_permits(self, permits: int, ttl: Optional[Number] = None) -> Result:
        """Sets the count if the semaphore does not exist (``ttl`` seconds: its TTL)."""
        args: List[Any] = ["RSEMAPHORE.TRYSETPERMITS", self.name, permits]
        if ttl is not None:
            args += ["PX", _plan.to_ms(ttl)]
        return self._run(self._bool(call(*args, "ID", new_request_id())))

    def add_permits(self, delta: int) -> Result:
        """Adds (or, negative, removes) permits; the new count."""
        return self._run(call("RSEMAPHORE.ADDPERMITS", self.name, delta, "ID",
                              new_request_id()))

    def acquire(self, permits: int = 1, blocking: Optional[bool] = None,
                blocking_timeout: Optional[Number] = None) -> Result:
        """Takes ``permits``: True once taken, False if not within the wait. Waiters are
        served in arrival order; a big request at the head holds back later small ones."""
        return self._run(self._acquire_op(permits, blocking, blocking_timeout))

    def _acquire_op(self, permits: int, blocking: Optional[bool],
                    blocking_timeout: Optional[Number]) -> Op:
        blocking = self.blocking if blocking is None else blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        reply, confirm = yield from attempt_held(["RSEMAPHORE.ACQUIRE", self.name, permits],
                                                 wait_ms_for(blocking, blocking_timeout),
                                                 contention=self._contention)
        if reply == 1 and confirm is not None:
            _permits.held(self.redis, self.name, confirm, permits)
        return reply == 1

    def release(self, permits: int = 1) -> Result:
        """Gives back ``permits`` (nobody checks they were held: Redisson's rule); the
        count after the release, or None when nothing was sent: the server had taken back
        a grant of this client's on this name (its ticket connection closed before the
        grant's confirmation landed; logged at WARNING) and returned those permits itself,
        so as many permits of the next releases are not sent again.

        Waits first for this client's confirmations of grants on this name still in
        flight (normally settled long before; each at most `CONFIRM_RETRY_S`): a release
        sent before its grant's confirmation, by a client that then died, would be
        followed by the grant's take-back, and the count would gain permits that never
        existed."""
        return self._run(self._release_op(permits))

    def _release_op(self, permits: int) -> Op:
        pending = _permits.in_flight(self.redis, self.name)
        if pending:
            yield Settled(pending, CONFIRM_RETRY_S)
        send = _permits.release(self.redis, self.name, permits)
        if send == 0 and permits > 0:
            return None  # all paid to the debt: the server returned them already
        return (yield from call("RSEMAPHORE.RELEASE", self.name, send, "ID",
                                new_request_id()))

    def available_permits(self) -> Result:
        """The count of free permits (0 without the key)."""
        return self._run(call("RSEMAPHORE.AVAILABLEPERMITS", self.name))

    def drain_permits(self) -> Result:
        """Takes every free permit; how many there were."""
        return self._run(call("RSEMAPHORE.DRAINPERMITS", self.name, "ID", new_request_id()))

    def _bool(self, op: Op) -> Op:
        return bool((yield from op))

    def _enter_op(self) -> Op:
        if not (yield from self._acquire_op(1, None, None)):
            raise LockError("Unable to acquire a permit within the time specified",
                            lock_name=self.name)
        return self

    def _exit_op(self) -> Op:
        yield from self._release_op(1)


class PermitOps:
    """Permits taken from an `ExpirableSemaphore` (``ids``: one per permit), released
    together; renewed by a watchdog when taken without a lease."""

    def __init__(self, semaphore: "ExpirableSemaphoreOps", ids: Sequence[Any],
                 lease: Optional[Number]) -> None:
        self.semaphore = semaphore
        self.ids = list(ids)
        self.lease = lease
        self._watch: Any = None
        self.released = False

    @property
    def id(self) -> Any:
        """The first (usually only) permit id: 32 hex digits, Redisson's format."""
        return self.ids[0]

    @property
    def lost(self) -> bool:
        """True if the watchdog found a permit gone (its lease ran out, or released by
        someone else): the work it guarded ran unprotected."""
        return self._watch is not None and self._watch.lost

    def _run(self, op: Op) -> Result:
        return self.semaphore._run(op)

    def release(self) -> Result:
        """Gives the permits back; raises ``LockNotOwnedError`` if any was no longer held."""
        return self._run(self._release_op())

    def _release_op(self) -> Op:
        if self._watch is not None:
            self._watch.stop()
        self.released = True
        missing = 0
        for permit in self.ids:
            reply = yield from call("RPSEMAPHORE.RELEASE", self.semaphore.name, permit,
                                    "ID", new_request_id())
            missing += reply != 1
        if missing:
            raise LockNotOwnedError(f"{missing} permit(s) were no longer held",
                                    lock_name=self.semaphore.name)

    def update_lease_time(self, lease: Optional[Number]) -> Result:
        """Sets the permits' lease (seconds; None: no lease); True if all were held."""
        return self._run(self._update_op(-1 if lease is None else _plan.to_ms(lease)))

    def _update_op(self, lease_ms: int) -> Op:
        held = True
        for permit in self.ids:
            reply = yield from call("RPSEMAPHORE.UPDATELEASETIME", self.semaphore.name,
                                    permit, lease_ms)
            held = held and reply == 1
        return held

    def _enter_op(self) -> Op:
        return self
        yield  # a generator

    def _exit_op(self) -> Op:
        if not self.released:
            yield from self._release_op()


class ExpirableSemaphoreOps(_Front):
    """Redisson's ``RPermitExpirableSemaphore`` (``RPSEMAPHORE.*``): permits with ids and
    leases; an expired permit goes back to the pool, and to the first waiter, at its
    lease end. Without a lease the permit is renewed by a watchdog (a holder that dies
    loses it within ``watchdog_timeout``)."""

    _permit_class: Any = PermitOps

    def __init__(self, redis: Any, name: Any, blocking: bool = True,
                 blocking_timeout: Optional[Number] = None, *,
                 watchdog_timeout: Number = _plan.DEFAULT_WATCHDOG_TIMEOUT,
                 use_tickets: bool = True) -> None:
        """No I/O; ``blocking``/``blocking_timeout`` are ``acquire``'s defaults and
        ``watchdog_timeout`` the lease of a permit taken without one."""
        super().__init__(redis, name, use_tickets)
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.watchdog_timeout = watchdog_timeout
        self._contention = Contention()

    def try_set_permits(self, permits: int) -> Result:
        """Sets the number of permits if none was set; True if set."""
        return self._run(SemaphoreOps._bool(self, call(  # type: ignore[arg-type]
            "RPSEMAPHORE.TRYSETPERMITS", self.name, permits, "ID", new_request_id())))

    def set_permits(self, permits: int) -> Result:
        """Makes available + held = ``permits``; the available count."""
        return self._run(call("RPSEMAPHORE.SETPERMITS", self.name, permits, "ID",
                              new_request_id()))

    def add_permits(self, delta: int) -> Result:
        """Adds (or removes) permits; the new available count."""
        return self._run(call("RPSEMAPHORE.ADDPERMITS", self.name, delta, "ID",
                              new_request_id()))

    def available_permits(self) -> Result:
        """Free permits (expired ones count as free)."""
        return self._run(call("RPSEMAPHORE.AVAILABLEPERMITS", self.name))

    def acquired_permits(self) -> Result:
        """Permits held and not expired."""
        return self._run(call("RPSEMAPHORE.ACQUIREDPERMITS", self.name))

    def acquire(self, lease: Optional[Number] = None, permits: int = 1,
                blocking: Optional[bool] = None, blocking_timeout: Optional[Number] = None,
                on_lost: Optional[Callable[[], Any]] = None) -> Result:
        """Takes ``permits`` with a ``lease`` in seconds (None: a watchdog lease renewed
        while held); the `Permit`, or None if not taken within the wait. ``on_lost`` is
        called once if the watchdog finds a permit gone."""
        return self._run(self._acquire_op(lease, permits, blocking, blocking_timeout, on_lost))

    def _acquire_op(self, lease: Optional[Number], permits: int, blocking: Optional[bool],
                    blocking_timeout: Optional[Number],
                    on_lost: Optional[Callable[[], Any]]) -> Op:
        blocking = self.blocking if blocking is None else blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        lease_ms = _plan.lease_ms(lease, self.watchdog_timeout)
        base: List[Any] = ["RPSEMAPHORE.ACQUIRE", self.name, lease_ms]
        if permits != 1:
            base += ["PERMITS", permits]
        reply = yield from attempt(base, wait_ms_for(blocking, blocking_timeout),
                                   contention=self._contention)
        if reply is None:
            return None
        permit = self._permit_class(self, reply if isinstance(reply, list) else [reply], lease)
        if not lease:
            permit._watch = yield Watch(lambda: permit._update_op(lease_ms), lease_ms,
                                        self.name, on_lost)
        return permit

    def release(self, permit: Union[PermitOps, Any]) -> Result:
        """Releases a `Permit`, or a permit id (True if it was held)."""
        if isinstance(permit, PermitOps):
            return permit.release()
        return self._run(self._release_id_op(permit))

    def _release_id_op(self, permit_id: Any) -> Op:
        reply = yield from call("RPSEMAPHORE.RELEASE", self.name, permit_id, "ID",
                                new_request_id())
        return reply == 1


# ---- countdown latch ------------------------------------------------------------------


class CountDownLatchOps(_Front):
    """Redisson's ``RCountDownLatch`` (``RLATCH.*``): every waiter is released in the
    event-loop turn the count reaches zero."""

    def try_set_count(self, count: int) -> Result:
        """Sets the count if no latch exists; True if set."""
        return self._run(SemaphoreOps._bool(self, call(  # type: ignore[arg-type]
            "RLATCH.TRYSETCOUNT", self.name, count, "ID", new_request_id())))

    def count_down(self) -> Result:
        """Counts down once (retried safely with a request id); the count after."""
        return self._run(call("RLATCH.COUNTDOWN", self.name, "ID", new_request_id()))

    def get_count(self) -> Result:
        """The count (0: open, or no latch)."""
        return self._run(call("RLATCH.GETCOUNT", self.name))

    def delete(self) -> Result:
        """Deletes the latch (which opens it); True if one existed."""
        return self._run(SemaphoreOps._bool(self, call(  # type: ignore[arg-type]
            "RLATCH.DELETE", self.name, "ID", new_request_id())))

    def wait(self, timeout: Optional[Number] = None) -> Result:
        """Waits until the count reaches zero (Redisson's ``await``): True if open, False
        if ``timeout`` seconds passed first (None: no limit; 0: just look)."""
        return self._run(self._wait_op(timeout))

    def _wait_op(self, timeout: Optional[Number]) -> Op:
        reply = yield from attempt(["RLATCH.AWAIT", self.name],
                                   wait_ms_for(True, timeout), latch=True)
        return reply == 1
