"""Module or scripts: which backend serves a client's module commands, and the probe.

Every client has a mode, ``auto`` (the default), ``module`` or ``scripts``
(`set_mode`). In ``auto`` the client asks the server once, on its first module command,
whether the rlock module is loaded (`detect`: the capability probe ``RLOCK.HELLO`` of
`rlock._hello`, "unknown command" meaning no module), and asks again after a connection error
or when a module command comes back unknown (a failover to a server without the module).
The probe before a timed wait is bounded by that wait's deadline (design.md 5: a timed
wait ends at its deadline on the client's clock): a server that does not answer it in
time tells the caller no, and the next command asks again (nothing is cached from a
probe that got no answer).
A client in scripts mode also asks again every `REPROBE_SECONDS` and when its
subscriber connection breaks: redis-py reconnects its pool silently, and scripts keep
working on a server that gained the module, so no error would tell. `dispatch` is the
one place that routes: a module command goes to the server as is, or
through `rlock._scripts` (Redisson's scripts) where the module is absent. Both drivers
(`rlock._io`) run it, so threads and asyncio share the routing as they share the logic.
The scripts-mode subscriber connections of a client (`rlock._pubsub`) are kept here too.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from typing import Any, Dict, Generator, Optional, Tuple

from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _scripts
from ._hello import HELLO_ARGS, parse_hello
from ._proto import Call, Wait, ran_out, to_bytes
from ._pubsub import Subscriber, node_of
from ._tickets import CLOCK_SLACK_S

Op = Generator[Any, Any, Any]

MODES = ("auto", "module", "scripts")

#: How often a client in scripts mode (``auto``) asks again whether the module is there.
REPROBE_SECONDS = 30.0

#: The module's command families: what `dispatch` routes.
_FAMILIES = (b"RLOCK.", b"RFENCED.", b"RRWLOCK.", b"RSEMAPHORE.", b"RPSEMAPHORE.", b"RLATCH.")


class Backend:
    """One client's mode: the setting, what the probe found, and its subscribers."""

    def __init__(self, setting: str = "auto") -> None:
        self.setting = setting
        #: "module" or "scripts" once known (None: ask at the next module command).
        self.mode: Optional[str] = None if setting == "auto" else setting
        #: The publish command the scripts get: "spublish" on a cluster that has sharded
        #: pub/sub (Redisson's choice), else "publish".
        self.publish = "publish"
        self.sharded_known = False
        self.probed_at = 0.0  # time.monotonic() of the last probe
        self.subscribers: Dict[Optional[Tuple[str, int]], Subscriber] = {}
        self.lock = threading.Lock()

    def forget(self) -> None:
        """Ask again at the next module command (``auto`` only)."""
        if self.setting == "auto":
            self.mode = None


_BACKENDS: "weakref.WeakKeyDictionary[Any, Backend]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _close(backend: Backend) -> None:
    for sub in list(backend.subscribers.values()):
        sub.close()


def backend(redis: Any) -> Backend:
    """The client's backend record (made on first use; its subscribers close with it)."""
    found = _BACKENDS.get(redis)
    if found is None:
        with _LOCK:
            found = _BACKENDS.get(redis)
            if found is None:
                found = _BACKENDS[redis] = Backend()
                weakref.finalize(redis, _close, found)
    return found


def set_mode(redis: Any, mode: str) -> None:
    """How this redis-py client runs rlock's primitives: ``"auto"`` (the default: the
    module where the server has it, else Redisson's scripts), ``"module"`` (the module's
    commands, an error where it is absent) or ``"scripts"`` (Redisson's Lua scripts and
    pub/sub, also where the module is loaded: both interoperate on the same names)."""
    if mode not in MODES:
        raise ValueError(f"rlock mode must be one of {', '.join(MODES)}, not {mode!r}")
    b = backend(redis)
    b.setting = mode
    b.mode = None if mode == "auto" else mode


def get_mode(redis: Any) -> Optional[str]:
    """``"module"`` or ``"scripts"`` once known for this client, else None."""
    found = _BACKENDS.get(redis)
    return None if found is None else found.mode


def close_subscribers(redis: Any) -> None:
    """Closes the client's scripts-mode subscriber connections (waits on them fail)."""
    found = _BACKENDS.get(redis)
    if found is not None:
        with found.lock:
            subs, found.subscribers = list(found.subscribers.values()), {}
        for sub in subs:
            sub.close()


def subscriber(redis: Any, key: bytes) -> Subscriber:
    """The client's subscriber connection to the server (cluster node) owning ``key``."""
    b = backend(redis)
    addr, cls, kwargs = node_of(redis, key)
    with b.lock:
        sub = b.subscribers.get(addr)
        if sub is None or sub.closed:
            sub = b.subscribers[addr] = Subscriber(cls, kwargs, b.publish == "spublish",
                                                   on_break=b.forget)
        return sub


def module_command(effect: Any) -> bool:
    """A Call or Wait of one of the module's commands, not yet routed."""
    if isinstance(effect, Call):
        args = effect.args
    elif isinstance(effect, Wait):
        args = effect.shape.args
    else:
        return False
    return not effect.direct and to_bytes(args[0]).upper().startswith(_FAMILIES)


def no_such_command(error: ResponseError) -> bool:
    """The server has no such command, or this user may not run it: either way the
    module's commands cannot be used here."""
    text = str(error)
    return "unknown command" in text.lower() or text.startswith("NOPERM")


def _probe(key: bytes, *args: Any, until: Optional[float] = None) -> Op:
    """True if the server (on a cluster: the node owning ``key``) runs ``args``' command
    (any reply, or an error other than an unknown or forbidden command: a wrong number of
    arguments means it is there). ``until``: as `Call`'s."""
    try:
        yield Call(tuple(args), direct=True, at=key, until=until)
    except ResponseError as e:
        return not no_such_command(e)
    return True


def detect(b: Backend, cluster: bool, key: bytes, until: Optional[float] = None) -> Op:
    """Asks the server (on a cluster, the node owning ``key``: one node answers for the
    client) whether the module is loaded (``auto``), and on a cluster whether it has
    sharded pub/sub (for the scripts' publish command). ``until``: the deadline of the
    timed wait that asks (`Call`'s); a probe not answered by then raises redis-py's
    ``TimeoutError`` and records nothing."""
    if b.mode is None:
        try:
            reply = yield Call(HELLO_ARGS, direct=True, at=key, until=until)
        except ResponseError as e:
            reply = e
        try:
            found = parse_hello(reply).module
        except ResponseError:
            # The user may not run RLOCK.HELLO (an ACL that predates it): ask whether the
            # module's commands exist, with one that changes nothing without arguments.
            found = yield from _probe(key, "RLOCK.ACQUIRE", until=until)
        b.mode = "module" if found else "scripts"
        b.probed_at = time.monotonic()
    if b.mode == "scripts" and cluster and not b.sharded_known:
        b.publish = "spublish" if (yield from _probe(key, "SPUBLISH", until=until)) \
            else "publish"
        b.sharded_known = True


def dispatch(b: Backend, effect: Any, cluster: bool) -> Op:
    """A module command (Call or Wait) done by the backend the client's mode picks.

    A timed wait's probe is bounded by the wait's deadline, and what it took counts
    against the wait (``since``): not answered by then, the wait is told no ("not now",
    `Shape.ran_out`) with nothing of it sent; a probe's other failures are raised as
    before (the caller's retries ask again). A timed wait's try first (a `Call` with
    ``by``) is bounded the same way."""
    shape = effect.shape if isinstance(effect, Wait) else None
    args = effect.args if shape is None else shape.args
    key = to_bytes(args[1]) if len(args) > 1 else b""
    since = time.monotonic() if shape is None or effect.since is None else effect.since
    until = since + shape.wait_ms / 1000 if shape is not None and shape.wait_ms else None
    if shape is None:
        until = effect.by  # a timed wait's try first (`rlock._ops.try_first`)
    if (b.mode == "scripts" and b.setting == "auto"
            and time.monotonic() - b.probed_at >= REPROBE_SECONDS):
        b.mode = None  # has a failover brought a server with the module?
    for attempt in range(2):
        if b.mode is None or (b.mode == "scripts" and cluster and not b.sharded_known):
            try:
                yield from detect(b, cluster, key, until)
            except (ConnectionError, RedisTimeoutError):
                if until is not None and time.monotonic() >= until - CLOCK_SLACK_S:
                    return ran_out(to_bytes(args[0]).upper())  # the deadline came first
                raise
            if until is not None and time.monotonic() >= until:
                return ran_out(to_bytes(args[0]).upper())  # no time left to wait
        if b.mode == "scripts":
            try:
                if shape is not None:
                    return (yield from _scripts.wait(shape, b.publish, since))
                return (yield from _scripts.command(effect.args, b.publish))
            except (ConnectionError, RedisTimeoutError):
                b.forget()  # a failover may bring a server with the module
                raise
        try:
            if shape is not None:
                return (yield dataclasses.replace(effect, direct=True, since=since))
            return (yield dataclasses.replace(effect, direct=True))
        except ResponseError as e:
            if attempt == 0 and b.setting == "auto" and no_such_command(e):
                b.forget()  # the module went (a failover to a server without it)
                continue
            raise
        except (ConnectionError, RedisTimeoutError):
            b.forget()
            raise
    raise AssertionError("unreachable")
