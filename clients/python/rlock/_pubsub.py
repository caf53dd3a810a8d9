"""Scripts mode's one subscriber connection per client (per server, or per cluster node).

Redisson waits without the module by subscribing the primitive's channel and sleeping
until a message or the holder's lease end; every wait of one client shares one
subscriber connection. `Subscriber` is that connection: a daemon thread reads it (RESP2,
named ``rlock-py-subscriber`` in CLIENT LIST) and wakes the waiters of a channel when a
message comes, for threads (`Subscription.wait`) and asyncio tasks
(`Subscription.await_message`) alike, so the asyncio client needs no second
implementation. As in Redisson (LockPubSub), a lock's unlock message (``0``) wakes one
waiter of the client, the one waiting longest, and is kept for the next waiter if none
is asleep (a waiter between two tries must not miss it); every other message wakes all. Channels are reference-counted: subscribed while someone waits on them.
If the connection breaks, every waiter is woken (it tries again: a release may have been
missed) and the thread reconnects and subscribes again. Used by `rlock._io`'s drivers for
the `Subscribe` and `Listen` effects of `rlock._scripts.wait`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from typing import Any, Callable, Dict, Optional, Set, Tuple

import redis.connection
from redis.exceptions import ConnectionError

log = logging.getLogger("rlock")

#: The name the subscriber connection gives itself (CLIENT LIST shows it).
SUBSCRIBER_NAME = "rlock-py-subscriber"

#: How long a subscribe may take to be confirmed before the wait fails.
SUBSCRIBE_TIMEOUT = 10.0


def node_of(client: Any, key: bytes) -> Tuple[Optional[Tuple[str, int]], Any, Dict[str, Any]]:
    """The address (None off a cluster), connection class and keyword arguments of the
    server that owns ``key`` for a redis-py client (blocking or asyncio, plain or cluster)."""
    if hasattr(client, "get_node_from_key") and hasattr(client, "nodes_manager"):
        node = client.get_node_from_key(key)
        addr: Optional[Tuple[str, int]] = (node.host, int(node.port))
        if hasattr(node, "connection_kwargs"):  # redis.asyncio.cluster.ClusterNode
            return addr, node.connection_class, node.connection_kwargs
        pool = node.redis_connection.connection_pool
        return addr, pool.connection_class, pool.connection_kwargs
    pool = client.connection_pool
    return None, pool.connection_class, pool.connection_kwargs


def _accepted(cls: type) -> Set[str]:
    names: Set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            names |= set(inspect.signature(init).parameters)
    return names


def sync_connection(cls: Any, kwargs: Dict[str, Any]) -> Any:
    """A blocking connection to the server that ``cls(**kwargs)`` (blocking or asyncio)
    would reach: RESP2, bytes, no read timeout (the reader thread waits on it)."""
    name = getattr(cls, "__name__", "")
    if "UnixDomainSocket" in name:
        sync_cls: Any = redis.connection.UnixDomainSocketConnection
    elif "SSL" in name:
        sync_cls = redis.connection.SSLConnection
    else:
        sync_cls = redis.connection.Connection
    accepted = _accepted(sync_cls)
    args = {k: v for k, v in kwargs.items() if k in accepted and not callable(v)
            and k not in ("retry", "connection_pool", "encoder_class", "parser_class",
                          "redis_connect_func", "credential_provider", "event_dispatcher")}
    if "credential_provider" in kwargs and "credential_provider" in accepted:
        args["credential_provider"] = kwargs["credential_provider"]
    args.update(protocol=2, decode_responses=False, socket_timeout=None,
                client_name=SUBSCRIBER_NAME)
    return sync_cls(**args)


#: The channels whose message ``0`` wakes one waiter (Redisson's UNLOCK_MESSAGE: the
#: lock, fenced lock and read-lock unlocks); ``1`` there, and any other channel's
#: message, wakes every waiter.
_WAKE_ONE_PREFIXES = (b"redisson_lock__channel:", b"redisson_rwlock:")


def _wakes_one(channel: bytes, payload: Any) -> bool:
    return payload == b"0" and channel.startswith(_WAKE_ONE_PREFIXES)


class _Channel:
    def __init__(self) -> None:
        self.refs = 0
        self.confirmed = False
        self.events = 0  # messages heard and breaks seen: every waiter looks again
        self.permits = 0  # wake-one messages not yet taken by a waiter (at most refs)
        # Asleep waiters' wake-up calls, oldest first (a dict keeps insertion order).
        self.wakers: Dict[Callable[[], None], None] = {}

    def wake_one(self) -> None:
        for wake in self.wakers:
            wake()
            return


class Subscription:
    """One waiter's hold on a channel: ``wait``/``await_message`` until something new is
    heard (True) or the subscription broke (False); ``close()`` once done."""

    def __init__(self, subscriber: "Subscriber", channel: bytes, chan: _Channel) -> None:
        self.subscriber = subscriber
        self.channel = channel
        self._chan = chan
        self.seen = chan.events
        self.closed = False

    def _outcome(self) -> Optional[bool]:
        """Under the lock: None while nothing is new for this waiter; else whether the
        subscription still stands (a wake-one message is taken here, by one waiter)."""
        chan = self._chan
        if chan.events != self.seen:
            self.seen = chan.events
            return chan.confirmed
        if chan.permits > 0:
            chan.permits -= 1
            return True
        return None

    def _leave(self, wake: Callable[[], None]) -> None:
        """Under the lock: stop listening; a wake-one message this waiter did not take
        goes on to the next asleep waiter."""
        self._chan.wakers.pop(wake, None)
        if self._chan.permits > 0:
            self._chan.wake_one()

    def wait(self, timeout: Optional[float]) -> bool:
        """Blocks until a message (True), a break (False) or ``timeout`` (True)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        event = threading.Event()
        with self.subscriber.lock:
            got = self._outcome()
            if got is not None:
                return got
            self._chan.wakers[event.set] = None
        try:
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return True
                event.wait(left)
                with self.subscriber.lock:
                    event.clear()
                    got = self._outcome()
                if got is not None:
                    return got
        finally:
            with self.subscriber.lock:
                self._leave(event.set)

    async def await_message(self, timeout: Optional[float]) -> bool:
        """As `wait`, for a task."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        woken = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(woken.set)

        with self.subscriber.lock:
            got = self._outcome()
            if got is not None:
                return got
            self._chan.wakers[wake] = None
        try:
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return True
                try:
                    await asyncio.wait_for(woken.wait(), left)
                except asyncio.TimeoutError:
                    pass
                with self.subscriber.lock:
                    woken.clear()
                    got = self._outcome()
                if got is not None:
                    return got
        finally:
            with self.subscriber.lock:
                self._leave(wake)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.subscriber.release(self.channel)


class Subscriber:
    """The subscriber connection to one server: ``subscribe(channel)`` (blocking) or
    ``asubscribe`` returns a confirmed `Subscription`."""

    def __init__(self, conn_class: Any, conn_kwargs: Dict[str, Any], sharded: bool,
                 on_break: Optional[Callable[[], None]] = None) -> None:
        """``on_break()``: called when the connection breaks (a failover, maybe to a
        server with the module: `rlock._mode` asks again)."""
        self.on_break = on_break
        self.conn_class = conn_class
        self.conn_kwargs = conn_kwargs
        self.sharded = sharded
        self.lock = threading.Lock()
        self.channels: Dict[bytes, _Channel] = {}
        self.conn: Any = None
        self.thread: Optional[threading.Thread] = None
        self.closed = False

    # ---- the waiters' side ------------------------------------------------------------

    def _take(self, channel: bytes) -> _Channel:
        with self.lock:
            if self.closed:
                raise ConnectionError("rlock: the subscriber connection is closed")
            chan = self.channels.get(channel)
            if chan is None:
                chan = self.channels[channel] = _Channel()
            chan.refs += 1
            if not chan.confirmed and self.conn is not None:  # new, or lost by a break
                self._send(b"SSUBSCRIBE" if self.sharded else b"SUBSCRIBE", channel)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, daemon=True,
                                               name="rlock-subscriber")
                self.thread.start()
            return chan

    def subscribe(self, channel: bytes) -> Subscription:
        chan = self._take(channel)
        deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
        while True:
            with self.lock:
                if chan.confirmed:
                    return Subscription(self, channel, chan)
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                self.release(channel)
                raise ConnectionError(f"rlock: could not subscribe {channel!r}")
            event = threading.Event()
            with self.lock:
                chan.wakers[event.set] = None
                ready = chan.confirmed
            if not ready:
                event.wait(min(left, 0.5))
            with self.lock:
                chan.wakers.pop(event.set, None)

    async def asubscribe(self, channel: bytes) -> Subscription:
        chan = self._take(channel)
        sub = Subscription(self, channel, chan)
        deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
        try:
            while True:
                with self.lock:
                    if chan.confirmed:
                        sub.seen = chan.events
                        return sub
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    raise ConnectionError(f"rlock: could not subscribe {channel!r}")
                sub.seen = chan.events
                await sub.await_message(min(left, 0.5))
        except BaseException:
            sub.close()
            raise

    def release(self, channel: bytes) -> None:
        with self.lock:
            chan = self.channels.get(channel)
            if chan is None:
                return
            chan.refs -= 1
            if chan.refs == 0:
                del self.channels[channel]
                if self.conn is not None:
                    self._send(b"SUNSUBSCRIBE" if self.sharded else b"UNSUBSCRIBE", channel)

    def close(self) -> None:
        with self.lock:
            self.closed = True
            conn, self.conn = self.conn, None
            self._wake_all(confirmed=False)
        if conn is not None:
            try:
                conn.disconnect()
            except Exception:  # noqa: BLE001 - closing anyway
                pass

    # ---- the reader thread --------------------------------------------------------------

    def _send(self, *args: bytes) -> None:
        """Under ``self.lock``; a failed send is noticed by the reader, which reconnects."""
        try:
            self.conn.send_command(*args, check_health=False)
        except Exception as e:  # noqa: BLE001
            log.debug("rlock: subscriber send failed (%s)", e)

    def _wake_all(self, confirmed: bool) -> None:
        for chan in self.channels.values():
            chan.confirmed = confirmed and chan.confirmed
            chan.events += 1
            for wake in list(chan.wakers):
                wake()

    def _run(self) -> None:
        backoff = 0.05
        while not self.closed:
            conn = None
            try:
                conn = sync_connection(self.conn_class, self.conn_kwargs)
                conn.connect()
                with self.lock:
                    if self.closed:
                        break
                    self.conn = conn
                    if self.sharded:  # one by one: an SSUBSCRIBE's channels share a slot
                        for channel in self.channels:
                            self._send(b"SSUBSCRIBE", channel)
                    elif self.channels:
                        self._send(b"SUBSCRIBE", *self.channels)
                backoff = 0.05
                while not self.closed:
                    if not conn.can_read(timeout=1.0):
                        continue
                    self._handle(conn.read_response(disconnect_on_error=True))
            except Exception as e:  # noqa: BLE001 - any failure: wake everyone, reconnect
                if self.closed:
                    break
                log.debug("rlock: subscriber connection broke (%s); reconnecting", e)
                if self.on_break is not None:
                    self.on_break()
            with self.lock:
                if self.conn is conn:
                    self.conn = None
                self._wake_all(confirmed=False)
            if conn is not None:
                try:
                    conn.disconnect()
                except Exception:  # noqa: BLE001
                    pass
            if not self.closed:
                time.sleep(backoff)
                backoff = min(1.0, backoff * 2)

    def _handle(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind, channel, payload = bytes(reply[0]).lower(), bytes(reply[1]), reply[2]
        with self.lock:
            chan = self.channels.get(channel)
            if chan is None:
                return
            if kind in (b"subscribe", b"ssubscribe"):
                chan.confirmed = True
            elif kind in (b"unsubscribe", b"sunsubscribe"):
                # Ours (then a subscribe we sent after it follows) or the server's: a
                # shard channel whose slot left the node. Either way, not subscribed now.
                chan.confirmed = False
            elif kind not in (b"message", b"smessage"):
                return
            elif _wakes_one(channel, payload):
                chan.permits = min(chan.permits + 1, chan.refs)
                chan.wake_one()
                return
            chan.events += 1
            for wake in list(chan.wakers):
                wake()
