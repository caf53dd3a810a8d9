"""The two drivers of the shared logic: threads (`SyncIO`) and asyncio (`AsyncIO`).

Every primitive's logic is written once, in `rlock._ops`, as generators that yield the
effects of `rlock._proto` (`Call`, `Wait`, `Sleep`, `Watch`). A driver runs such a
generator to its end, doing each effect with redis-py's blocking or asyncio client and
sending the result back (or throwing the error in). This is the sans-IO shape of h11 and
quinn-proto: a fix to the logic lands once; the drivers only know how to talk.

Waiting (`Wait`): every wait goes through the client's ticket connection
(`rlock._tickets`; one per server or cluster node, shared by all of them), with ``WAIT``
blocked on a connection of its own as the fallback when the module refuses ``ASYNC`` or, on a cluster, while the key's slot
migrates (the cluster client then follows the redirection).
The watchdog (`_ops.watchdog`) runs on a daemon thread or an asyncio task.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from typing import Any, Dict, Generator, Optional, Tuple

from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _mode, _plan
from ._hello import HELLO_ARGS, Capabilities, parse_hello
from .errors import OutcomeUnknown, module_error
from ._proto import (Call, Listen, Pipe, Settled, Shape, Sleep, Subscribe, Wait, Watch,
                     BUSY, new_notify_tag, ran_out, to_bytes, undo_args)
from ._pubsub import node_of
from ._tickets import AsyncTicketConn, Fallback, SyncTicketConn

log = logging.getLogger("rlock")

Op = Generator[Any, Any, Any]


def _is_cluster(redis: Any) -> bool:
    """A redis-py cluster client (blocking or asyncio)."""
    return hasattr(redis, "get_node_from_key") and hasattr(redis, "nodes_manager")


#: How many waits of one client may block a pool connection of their own (``WAIT``)
#: before the others queue tickets (see `set_blocking_waits`): none, every wait is a
#: ticket (a ticket holds on its grant's message, as fast as a blocked wait's reply).
DEFAULT_BLOCKING_WAITS = 0


class _Hub:
    """The ticket connections of one client (one per server / cluster node), its
    ``NOTIFY`` tag and its budget of blocked waits."""

    def __init__(self, redis: Any, conn_type: Any) -> None:
        self.blocking_waits = _BLOCKING_WAITS.get(redis, DEFAULT_BLOCKING_WAITS)
        self.blocked = 0
        self.cluster = _is_cluster(redis)
        self.redis = weakref.ref(redis)
        self.conn_type = conn_type
        # One tag for all the hub's connections: the channel is per key and client, and a
        # key stays on its node (a slot that moves takes the wait elsewhere anyway).
        self.tag = new_notify_tag()
        self.conns: Dict[Optional[Tuple[str, int]], Any] = {}
        self.lock = threading.Lock()
        # A ticket connection's capability probe (RLOCK.HELLO) named no tickets: wait the
        # blocking way from now on.
        self.refused = False

    def conn_for(self, key: bytes) -> Any:
        redis = self.redis()
        if self.cluster:
            node = redis.get_node_from_key(key)
            addr: Optional[Tuple[str, int]] = (node.host, int(node.port))
            if hasattr(node, "connection_kwargs"):  # redis.asyncio.cluster.ClusterNode
                cls, kwargs = node.connection_class, node.connection_kwargs
            else:
                pool = node.redis_connection.connection_pool
                cls, kwargs = pool.connection_class, pool.connection_kwargs
        else:
            addr = None
            pool = redis.connection_pool
            cls, kwargs = pool.connection_class, pool.connection_kwargs
        with self.lock:
            conn = self.conns.get(addr)
            if conn is None:
                conn = self.conns[addr] = self.conn_type(cls, kwargs, self.cluster, self.tag)
            return conn

    def connections(self) -> list:
        with self.lock:
            return list(self.conns.values())

    def take_blocking(self) -> bool:
        """A blocked wait may start now (the budget allows; never on a cluster, whose
        client has no pool connection to set aside for a wait)."""
        with self.lock:
            if self.cluster or self.blocked >= self.blocking_waits:
                return False
            self.blocked += 1
            return True

    def give_blocking(self) -> None:
        with self.lock:
            self.blocked -= 1


_BLOCKING_WAITS: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


def set_blocking_waits(redis: Any, n: int) -> None:
    """How many waits of this client may block a connection of their own in ``WAIT``
    before the others queue tickets on the shared ticket connection (default 0: every
    wait is a ticket, and no waiter holds a connection in the server).

    A lock's ticket holds on its grant's message (design.md 5), as soon as a blocked
    wait's reply would come; a blocked wait still saves the ticket connection's reader
    thread hop. Takes effect for hubs made afterwards (set it before the client's first
    wait)."""
    if n < 0:
        raise ValueError("blocking waits must be >= 0")
    _BLOCKING_WAITS[redis] = n
    with _HUBS_LOCK:
        for hub in [_SYNC_HUBS.get(redis)] + list((_ASYNC_HUBS.get(redis) or {}).values()):
            if hub is not None:
                hub.blocking_waits = n


_SYNC_HUBS: "weakref.WeakKeyDictionary[Any, _Hub]" = weakref.WeakKeyDictionary()
_ASYNC_HUBS: "weakref.WeakKeyDictionary[Any, Dict[Any, _Hub]]" = weakref.WeakKeyDictionary()
_HUBS_LOCK = threading.Lock()


def _close_sync(hub: _Hub) -> None:
    for conn in hub.connections():
        conn.close()


def sync_hub(redis: Any) -> _Hub:
    """The ticket hub of a blocking client (made on first use, closed with the client)."""
    with _HUBS_LOCK:
        hub = _SYNC_HUBS.get(redis)
        if hub is None:
            hub = _SYNC_HUBS[redis] = _Hub(redis, SyncTicketConn)
            weakref.finalize(redis, _close_sync, hub)
        return hub


def async_hub(redis: Any) -> _Hub:
    """The ticket hub of an asyncio client on the running loop."""
    loop = asyncio.get_running_loop()
    with _HUBS_LOCK:
        per_loop = _ASYNC_HUBS.get(redis)
        if per_loop is None:
            per_loop = _ASYNC_HUBS[redis] = {}
        hub = per_loop.get(loop)
        if hub is None:
            for old in [l for l in per_loop if l.is_closed()]:
                del per_loop[old]
            hub = per_loop[loop] = _Hub(redis, AsyncTicketConn)
        return hub


def ticket_connections(redis: Any) -> list:
    """The ticket connections a client has opened so far (for tests and close())."""
    hubs = [_SYNC_HUBS.get(redis)] + list((_ASYNC_HUBS.get(redis) or {}).values())
    return [c for h in hubs if h is not None for c in h.connections()]


def capabilities(redis: Any) -> Capabilities:
    """What the server can do (``RLOCK.HELLO``, asked now; on a cluster, any one node):
    ``module`` False when the server does not know the command. The ticket connections
    ask the same on each connect by themselves."""
    try:
        reply = redis.execute_command(*HELLO_ARGS)
    except ResponseError as e:
        reply = e
    return parse_hello(reply)


async def acapabilities(redis: Any) -> Capabilities:
    """`capabilities` for an asyncio client."""
    try:
        reply = await redis.execute_command(*HELLO_ARGS)
    except ResponseError as e:
        reply = e
    return parse_hello(reply)


def close_tickets(redis: Any) -> None:
    """Closes a blocking client's ticket connections and its scripts-mode subscriber
    connections (its waits then fail)."""
    _mode.close_subscribers(redis)
    hub = _SYNC_HUBS.pop(redis, None)
    if hub is not None:
        _close_sync(hub)


async def aclose_tickets(redis: Any) -> None:
    """Closes an asyncio client's ticket connections on the running loop, and its
    scripts-mode subscriber connections."""
    _mode.close_subscribers(redis)
    per_loop = _ASYNC_HUBS.get(redis) or {}
    hub = per_loop.pop(asyncio.get_running_loop(), None)
    if hub is not None:
        for conn in hub.connections():
            await conn.close()


class _Handle:
    """A running watchdog: ``stop()`` it; ``lost`` is True once it found the hold gone."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.lost = False
        # Set while a release is in flight: a renewal answered 0 then is the release
        # winning the race, not a lost hold.
        self.releasing = False
        self.task: Optional[asyncio.Task] = None
        self.thread: Optional[threading.Thread] = None

    def is_alive(self) -> bool:
        """True while the watchdog's thread or task runs."""
        if self.thread is not None:
            return self.thread.is_alive()
        return self.task is not None and not self.task.done()

    def stop(self) -> None:
        self.stopped.set()
        if self.task is not None:
            self.task.cancel()

    def taken_back(self, effect: Watch) -> None:
        """The hold's ticket grant was taken back before its confirmation landed
        (design.md 5): lost, reported once, renewals stopped."""
        if self.lost or self.stopped.is_set() or self.releasing:
            return
        self.lost = True
        self.stop()
        result = _report_lost(effect)
        if asyncio.iscoroutine(result):
            asyncio.get_running_loop().create_task(result)


def _held_by(effect: Any, held: Any) -> Any:
    """The `Confirm` of the last wait that held on its grant (``held``), if ``effect``
    is a `Wait` (its shape's) or else as it was; a `Watch` hands it to its handle."""
    if isinstance(effect, Wait):
        return effect.shape.confirm
    return held


def _hook(held: Any, effect: Any, handle: Any) -> None:
    """A watchdog started after a wait that held on its grant reports the grant taken
    back as a lost hold."""
    if held is not None and isinstance(effect, Watch) and isinstance(handle, _Handle):
        held.on_taken_back(lambda: handle.taken_back(effect))


class SyncIO:
    """Runs the shared logic with a blocking redis-py client (``Redis``/``RedisCluster``)."""

    def __init__(self, redis: Any, use_tickets: bool = True) -> None:
        self.redis = redis
        self.use_tickets = use_tickets

    def run(self, op: Op, stop: Optional[threading.Event] = None) -> Any:
        value: Any = None
        error: Optional[BaseException] = None
        held = None
        while True:
            try:
                effect = op.throw(error) if error is not None else op.send(value)
            except StopIteration as done:
                return done.value
            value, error = None, None
            try:
                value = self.do(effect, stop)
                held = _held_by(effect, held)
                _hook(held, effect, value)
            except BaseException as e:  # noqa: BLE001 - thrown into the logic
                error = module_error(e)

    def do(self, effect: Any, stop: Optional[threading.Event] = None) -> Any:
        if _mode.module_command(effect):  # the module, or Redisson's scripts without it
            return self.run(_mode.dispatch(_mode.backend(self.redis), effect,
                                           _is_cluster(self.redis)), stop)
        if isinstance(effect, Call):
            if effect.once:
                return _send_once(self.redis, effect)
            if effect.until is not None:
                return _send_by(self.redis, effect, effect.until)
            if effect.tries:
                tries = _tries(self.redis)
                if not tries.take():
                    return BUSY
                try:
                    if effect.by is not None:
                        return _try_by(self.redis, effect, effect.by)
                    return self.redis.execute_command(*effect.args)
                finally:
                    tries.give()
            if effect.at is not None and _is_cluster(self.redis):
                node = self.redis.get_node_from_key(effect.at)
                return self.redis.execute_command(*effect.args, target_nodes=node)
            return self.redis.execute_command(*effect.args)
        if isinstance(effect, Wait):
            return self.wait(effect.shape, effect.since)
        if isinstance(effect, Pipe):
            target = self.redis
            if effect.at is not None and _is_cluster(self.redis):
                # The node's own client: one of its connections carries every command.
                target = self.redis.get_node_from_key(effect.at).redis_connection
            with target.pipeline(transaction=False) as pipe:
                for args in effect.commands:
                    pipe.execute_command(*args)
                return pipe.execute()
        if isinstance(effect, Sleep):
            if stop is not None:
                return stop.wait(effect.seconds)
            time.sleep(effect.seconds)
            return None
        if isinstance(effect, Watch):
            return self.watch(effect)
        if isinstance(effect, Settled):
            return _settled(effect)
        if isinstance(effect, Subscribe):
            return _mode.subscriber(self.redis, effect.key).subscribe(effect.channel)
        if isinstance(effect, Listen):
            return effect.sub.wait(effect.timeout)
        raise TypeError(f"unknown effect {effect!r}")

    def wait(self, shape: Shape, since: Optional[float] = None) -> Any:
        """``shape``'s wait, its time counted from ``since`` (None: now)."""
        started = time.monotonic() if since is None else since
        hub = sync_hub(self.redis) if self.use_tickets else None
        if hub is not None and hub.take_blocking():
            try:
                left = shape.wait_left(time.monotonic() - started)
                return self.blocking(shape.with_wait(left, False), left)
            finally:
                hub.give_blocking()
        if hub is not None and not hub.refused:
            try:
                return hub.conn_for(shape.key).wait(shape, started)
            except Fallback as f:
                hub.refused = hub.refused or f.refused
        left = shape.wait_left(time.monotonic() - started)
        return self.blocking(shape.with_wait(left, False), left)

    def blocking(self, args: list, wait_ms: Optional[int]) -> Any:
        """A ``WAIT`` blocked on a pool connection of its own (not the shared ones), read
        with a timeout of the wait plus the client's ``socket_timeout``; a failure closes
        the connection, which removes the waiter from the server's queue."""
        pool = getattr(self.redis, "connection_pool", None)
        if wait_ms is None or pool is None:
            return self.redis.execute_command(*args)
        started = time.monotonic()
        conn = pool.get_connection(*_plan.get_connection_args(pool, args[0]))
        try:
            conn.send_command(*args)
            socket_timeout = getattr(conn, "socket_timeout", None)
            if wait_ms == 0 or socket_timeout is None:
                ready = conn.can_read(timeout=None)
            else:
                left = started + wait_ms / 1000 + socket_timeout - time.monotonic()
                ready = conn.can_read(timeout=max(left, 0.001))
            if not ready:
                raise RedisTimeoutError(f"no reply to a waiting {args[0]}")
            reply = conn.read_response()
        except BaseException:
            conn.disconnect()
            pool.release(conn)
            raise
        pool.release(conn)
        return reply

    def watch(self, effect: Watch) -> _Handle:
        from ._ops import watchdog
        handle = _Handle()

        def run() -> None:
            held = self.run(watchdog(effect.renew, effect.lease_ms, effect.name),
                            handle.stopped)
            if held is False and not handle.stopped.is_set() and not handle.releasing:
                handle.lost = True
                _report_lost(effect)

        handle.thread = threading.Thread(target=run, daemon=True,
                                         name=f"rlock-watchdog-{effect.name!r}")
        handle.thread.start()
        return handle


def _settled(effect: Settled) -> None:
    """Waits until each confirmation of ``effect`` is settled (on the ticket reader's or a
    late confirmer's thread) or its timeout passes."""
    done = threading.Semaphore(0)
    for confirm in effect.confirms:
        confirm.when_settled(done.release)
    deadline = time.monotonic() + effect.timeout
    for _ in effect.confirms:
        if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return


async def _asettled(effect: Settled) -> None:
    """`_settled` on a loop: a confirmation settles on the loop of its ticket connection,
    which may be another one (a client used from two loops)."""
    loop = asyncio.get_running_loop()
    futures = []
    for confirm in effect.confirms:
        future = loop.create_future()
        futures.append(future)
        confirm.when_settled(lambda future=future: _resolve(loop, future))
    await asyncio.wait(futures, timeout=effect.timeout)


def _resolve(loop: asyncio.AbstractEventLoop, future: "asyncio.Future") -> None:
    def done() -> None:
        if not future.done():
            future.set_result(None)
    try:
        loop.call_soon_threadsafe(done)
    except RuntimeError:  # the loop closed meanwhile: nobody waits any more
        pass


def _report_lost(effect: Watch) -> Any:
    log.warning("rlock: %r was lost (its lease ran out or it was taken away)", effect.name)
    if effect.on_lost is not None:
        try:
            return effect.on_lost()
        except Exception:  # noqa: BLE001 - a callback's bug must not kill the watchdog
            log.exception("rlock: on_lost callback raised")
    return None


class AsyncIO:
    """Runs the shared logic with an asyncio redis-py client (``redis.asyncio``)."""

    def __init__(self, redis: Any, use_tickets: bool = True) -> None:
        self.redis = redis
        self.use_tickets = use_tickets

    async def run(self, op: Op) -> Any:
        value: Any = None
        error: Optional[BaseException] = None
        held = None
        while True:
            try:
                effect = op.throw(error) if error is not None else op.send(value)
            except StopIteration as done:
                return done.value
            value, error = None, None
            try:
                value = await self.do(effect)
                held = _held_by(effect, held)
                _hook(held, effect, value)
            except BaseException as e:  # noqa: BLE001 - thrown into the logic
                error = module_error(e)

    async def do(self, effect: Any) -> Any:
        if _mode.module_command(effect):  # the module, or Redisson's scripts without it
            return await self.run(_mode.dispatch(_mode.backend(self.redis), effect,
                                                 _is_cluster(self.redis)))
        if isinstance(effect, Call):
            if effect.once:
                return await _asend_once(self.redis, effect)
            if effect.until is not None:
                return await _asend_by(self.redis, effect, effect.until)
            if effect.tries:
                tries = _tries(self.redis)
                if not tries.take():
                    return BUSY
                try:
                    return await _atry(self.redis, effect)
                finally:
                    tries.give()
            if effect.at is not None and _is_cluster(self.redis):
                await self.redis.initialize()  # an asyncio cluster client maps its nodes lazily
                node = self.redis.get_node_from_key(effect.at)
                return await self.redis.execute_command(*effect.args, target_nodes=node)
            return await self.redis.execute_command(*effect.args)
        if isinstance(effect, Wait):
            return await self.wait(effect.shape, effect.since)
        if isinstance(effect, Pipe):
            if effect.at is not None and _is_cluster(self.redis):
                return await _node_pipe(self.redis, effect)
            async with self.redis.pipeline(transaction=False) as pipe:
                for args in effect.commands:
                    pipe.execute_command(*args)
                return await pipe.execute()
        if isinstance(effect, Sleep):
            await asyncio.sleep(effect.seconds)
            return None
        if isinstance(effect, Watch):
            return self.watch(effect)
        if isinstance(effect, Settled):
            return await _asettled(effect)
        if isinstance(effect, Subscribe):
            return await _mode.subscriber(self.redis, effect.key).asubscribe(effect.channel)
        if isinstance(effect, Listen):
            return await effect.sub.await_message(effect.timeout)
        raise TypeError(f"unknown effect {effect!r}")

    async def wait(self, shape: Shape, since: Optional[float] = None) -> Any:
        """As `SyncIO.wait`."""
        started = time.monotonic() if since is None else since
        hub = async_hub(self.redis) if self.use_tickets else None
        if hub is not None and hub.take_blocking():
            try:
                left = shape.wait_left(time.monotonic() - started)
                return await self.blocking(shape.with_wait(left, False), left)
            finally:
                hub.give_blocking()
        if hub is not None and not hub.refused:
            try:
                return await hub.conn_for(shape.key).wait(shape, started)
            except Fallback as f:
                hub.refused = hub.refused or f.refused
        left = shape.wait_left(time.monotonic() - started)
        return await self.blocking(shape.with_wait(left, False), left)

    async def blocking(self, args: list, wait_ms: Optional[int]) -> Any:
        """As `SyncIO.blocking`; cancellation closes the connection (the waiter leaves)."""
        pool = getattr(self.redis, "connection_pool", None)
        if wait_ms is None or pool is None:
            return await self.redis.execute_command(*args)
        started = time.monotonic()
        conn = await pool.get_connection(*_plan.get_connection_args(pool, args[0]))
        socket_timeout = conn.socket_timeout
        try:
            await conn.send_command(*args)
            # With socket_timeout lifted, read_response() reads without a limit (given a
            # timeout it would return None on expiry: not to be told from a nil reply).
            conn.socket_timeout = None
            if wait_ms == 0 or socket_timeout is None:
                reply = await conn.read_response()
            else:
                left = started + wait_ms / 1000 + socket_timeout - time.monotonic()
                try:
                    reply = await asyncio.wait_for(conn.read_response(), max(left, 0.001))
                except asyncio.TimeoutError:
                    raise RedisTimeoutError(f"no reply to a waiting {args[0]}") from None
        except BaseException:
            conn.socket_timeout = socket_timeout
            await asyncio.shield(_close(pool, conn))
            raise
        conn.socket_timeout = socket_timeout
        await pool.release(conn)
        return reply

    def watch(self, effect: Watch) -> _Handle:
        from ._ops import watchdog
        handle = _Handle()

        async def run() -> None:
            held = await self.run(watchdog(effect.renew, effect.lease_ms, effect.name))
            if held is False and not handle.stopped.is_set() and not handle.releasing:
                handle.lost = True
                result = _report_lost(effect)
                if asyncio.iscoroutine(result):
                    await result

        handle.task = asyncio.get_running_loop().create_task(run())
        return handle


def _unknown(effect: Call, error: BaseException) -> OutcomeUnknown:
    return OutcomeUnknown(f"{to_bytes(effect.args[0]).decode()} of {effect.at!r}: the "
                          f"connection failed after the command was sent ({error}); it may "
                          "or may not have been applied, and is not sent again")


def _send_once(redis: Any, effect: Call) -> Any:
    """A `Call` with ``once``: on one connection of the pool, with no retry. redis-py's
    pool connects (and reconnects a stale connection) before handing it out: a failure
    there is before the write and raised as is; one from the write on is `OutcomeUnknown`.
    On a cluster the node's own command, which the cluster client does not retry (it
    cannot tell before from after the write, so every failure is `OutcomeUnknown`)."""
    if _is_cluster(redis):
        node = redis.get_node_from_key(effect.at)
        try:
            return redis.execute_command(*effect.args, target_nodes=node)
        except (ConnectionError, RedisTimeoutError) as e:
            raise _unknown(effect, e) from e
    pool = redis.connection_pool
    conn = pool.get_connection(to_bytes(effect.args[0]).decode())
    try:
        try:
            conn.send_command(*effect.args)
            return conn.read_response()
        except (ConnectionError, RedisTimeoutError) as e:
            conn.disconnect()
            raise _unknown(effect, e) from e
        except ResponseError:
            raise  # the reply was read: the connection is clean
        except BaseException:
            conn.disconnect()  # interrupted mid-reply: not reusable
            raise
    finally:
        pool.release(conn)


async def _asend_once(redis: Any, effect: Call) -> Any:
    """`_send_once` for asyncio."""
    if _is_cluster(redis):
        await redis.initialize()
        node = redis.get_node_from_key(effect.at)
        try:
            return await redis.execute_command(*effect.args, target_nodes=node)
        except (ConnectionError, RedisTimeoutError) as e:
            raise _unknown(effect, e) from e
    pool = redis.connection_pool
    conn = await pool.get_connection(to_bytes(effect.args[0]).decode())
    try:
        try:
            await conn.send_command(*effect.args)
            return await conn.read_response()
        except (ConnectionError, RedisTimeoutError) as e:
            await conn.disconnect()
            raise _unknown(effect, e) from e
        except ResponseError:
            raise  # the reply was read: the connection is clean
        except BaseException:
            await conn.disconnect()  # interrupted mid-reply: not reusable
            raise
    finally:
        await pool.release(conn)


#: What a connection made for one bounded `Call` leaves out of its client's settings: no
#: retries or health checks (each would take time the deadline does not have).
_UNBOUNDED = ("retry", "retry_on_timeout", "retry_on_error", "health_check_interval")


def _bounded_conn(redis: Any, at: Optional[bytes], left: float) -> Any:
    """A new connection (blocking or asyncio, as ``redis``'s) to the server, or cluster
    node owning ``at``, with the client's settings and its timeouts cut to ``left``."""
    _, cls, kwargs = node_of(redis, at or b"")
    connect_s = kwargs.get("socket_connect_timeout")
    over = {k: v for k, v in kwargs.items() if k not in _UNBOUNDED}
    over.update(socket_timeout=left, socket_connect_timeout=min(left, connect_s or left))
    return cls(**over)


def _no_reply(effect: Call) -> RedisTimeoutError:
    return RedisTimeoutError(f"no reply to {to_bytes(effect.args[0]).decode()} by its "
                             "wait's deadline")


#: How many tries first (`Call.tries`) of one client may be in flight at once. Each holds
#: a pool connection for its round trip: without a bound, a burst of waiters of one
#: client (200 threads starting at once) would open a pool connection each, where their
#: tickets share one. A try over the bound is not sent (`BUSY`): its acquire queues at
#: once, its handle's finding unchanged.
TRIES_IN_FLIGHT = 2


class _Tries:
    """A client's tries first in flight (threads of a blocking client, or tasks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0

    def take(self) -> bool:
        with self._lock:
            if self._n >= TRIES_IN_FLIGHT:
                return False
            self._n += 1
            return True

    def give(self) -> None:
        with self._lock:
            self._n -= 1


_TRIES: "weakref.WeakKeyDictionary[Any, _Tries]" = weakref.WeakKeyDictionary()
_TRIES_LOCK = threading.Lock()


def _tries(redis: Any) -> _Tries:
    tries = _TRIES.get(redis)
    if tries is None:
        with _TRIES_LOCK:
            tries = _TRIES.get(redis)
            if tries is None:
                tries = _TRIES[redis] = _Tries()
    return tries


def _try_by(redis: Any, effect: Call, by: float) -> Any:
    """A timed wait's try first (`Call.by`): on a pool connection, its reply read until
    ``by``; not in by then, the command's "not now" reply, and the connection is left to
    a thread that reads the late reply and gives back what it took. A cluster client's
    (no pool: redis-py routes it) is sent as any command."""
    pool = getattr(redis, "connection_pool", None)
    if pool is None:
        return redis.execute_command(*effect.args)
    verb = to_bytes(effect.args[0]).upper()
    left = by - time.monotonic()
    if left <= 0:
        return ran_out(verb)
    conn = pool.get_connection(*_plan.get_connection_args(pool, effect.args[0]))
    try:
        conn.send_command(*effect.args)
        if conn.can_read(timeout=max(by - time.monotonic(), 0.001)):
            reply = conn.read_response()
        else:
            threading.Thread(target=_late_try, args=(redis, pool, conn, effect.args),
                             daemon=True, name="rlock-late-try").start()
            return ran_out(verb)
    except ResponseError:
        pool.release(conn)
        raise
    except BaseException:
        conn.disconnect()
        pool.release(conn)
        raise
    pool.release(conn)
    return reply


def _late_try(redis: Any, pool: Any, conn: Any, args: Tuple[Any, ...]) -> None:
    """The reply of a try whose caller left at its deadline: what it took is given back."""
    try:
        reply = conn.read_response()
    except BaseException:  # noqa: BLE001 - nobody to raise to; the lease ends it
        conn.disconnect()
        pool.release(conn)
        return
    pool.release(conn)
    _give_back(redis, args, reply)


def _give_back(redis: Any, args: Tuple[Any, ...], reply: Any) -> Any:
    """Sends the commands that give back what ``reply`` to ``args`` took (a blocking
    client; an asyncio one's return an awaitable)."""
    undo = undo_args(list(args), reply)
    if not undo:
        return None
    log.debug("rlock: giving back what a late try on %r took", args[1])
    if asyncio.iscoroutinefunction(redis.execute_command):
        async def run() -> None:
            for cmd in undo:
                await redis.execute_command(*cmd)
        return run()
    for cmd in undo:
        redis.execute_command(*cmd)
    return None


async def _atry(redis: Any, effect: Call) -> Any:
    """A waiting acquire's try first on an asyncio client (`Call.tries`): its reply by
    ``by`` (if given), else the command's "not now" reply; a caller that leaves before
    the reply (its deadline, a cancelled task) leaves it to a callback that gives back
    what it took."""
    verb = to_bytes(effect.args[0]).upper()
    left = None if effect.by is None else effect.by - time.monotonic()
    if left is not None and left <= 0:
        return ran_out(verb)
    task = asyncio.ensure_future(redis.execute_command(*effect.args))
    try:
        done, _ = await asyncio.wait((task,), timeout=left)
    except asyncio.CancelledError:
        task.add_done_callback(lambda t: _late_atry(redis, effect.args, t))
        raise
    if task in done:
        return task.result()
    task.add_done_callback(lambda t: _late_atry(redis, effect.args, t))
    return ran_out(verb)


def _late_atry(redis: Any, args: Tuple[Any, ...], task: "asyncio.Future") -> None:
    if task.cancelled() or task.exception() is not None:
        return
    undo = _give_back(redis, args, task.result())
    if undo is not None:
        asyncio.ensure_future(undo)


def _send_by(redis: Any, effect: Call, until: float) -> Any:
    """A `Call` answered by ``until`` or redis-py's ``TimeoutError``: on a connection of
    its own (a pool's connects, and does its handshake, with the client's full timeout),
    closed after; the reply's read is bounded by what is left then."""
    left = until - time.monotonic()
    if left <= 0:
        raise _no_reply(effect)
    conn = _bounded_conn(redis, effect.at, left)
    try:
        conn.connect()
        conn.send_command(*effect.args)
        if not conn.can_read(timeout=max(0.0, until - time.monotonic())):
            raise _no_reply(effect)
        return conn.read_response()
    finally:
        conn.disconnect()


async def _asend_by(redis: Any, effect: Call, until: float) -> Any:
    """`_send_by` for asyncio: the whole exchange under one timeout (a cancelled read
    closes its connection)."""
    left = until - time.monotonic()
    if left <= 0:
        raise _no_reply(effect)

    async def exchange() -> Any:
        if _is_cluster(redis):
            await redis.initialize()  # an asyncio cluster client maps its nodes lazily
        conn = _bounded_conn(redis, effect.at, left)
        try:
            await conn.connect()
            await conn.send_command(*effect.args)
            return await conn.read_response()
        finally:
            await conn.disconnect()
    try:
        return await asyncio.wait_for(exchange(), left)
    except asyncio.TimeoutError:
        raise _no_reply(effect) from None


async def _node_pipe(redis: Any, effect: Pipe) -> list:
    """A `Pipe` down one connection of the asyncio cluster node owning ``effect.at``
    (that node's own pipeline: written at once, the replies read in order); the first
    error is raised, as a pipeline's ``execute()`` does."""
    from redis.asyncio.cluster import PipelineCommand
    await redis.initialize()
    node = redis.get_node_from_key(effect.at)
    commands = [PipelineCommand(i, *args) for i, args in enumerate(effect.commands)]
    await node.execute_pipeline(commands)
    for c in commands:
        if isinstance(c.result, Exception):
            raise c.result
    return [c.result for c in commands]


async def _close(pool: Any, conn: Any) -> None:
    await conn.disconnect()
    await pool.release(conn)
