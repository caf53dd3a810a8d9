"""Scripts mode: the module's commands done with Redisson's own Lua scripts, for servers
where the module cannot be loaded (every managed Redis and Valkey).

The shared logic (`rlock._ops`, `rlock._lock`) speaks the module's commands. Where the
module is absent, `rlock._mode.dispatch` hands each such `Call` to `command` and each
`Wait` to `wait` here: generators of the same effects (`rlock._proto`) that send the
scripts Redisson 4.7 sends (`rlock/lua/*.lua`: the same keys, KEYS/ARGV, channels and
messages, so Redisson services, scripts-mode clients and module-loaded servers share
names) and answer what the module would have answered. Waiting is Redisson's: subscribe
the primitive's channel on the client's one subscriber connection, try, then sleep until
a message or the holder's lease end, whichever comes first; no polling.
docs/scripts-mode.md says, primitive by primitive, what this gives less than the module.

Every script is sent as EVALSHA and, on NOSCRIPT (a failover or SCRIPT FLUSH emptied the
script cache), as EVAL, which caches it again. Every key a script declares shares the
name's hash slot (Redisson's hash tags). Redisson's read-lock scripts also touch the
per-hold timeout keys, which they build from a declared prefix: those keys are
`{name}:...` too, so always in the declared keys' slot (docs/scripts-mode.md).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any, Dict, Generator, List, Optional, Tuple

from redis.exceptions import NoScriptError, ResponseError

from ._proto import Call, Listen, Shape, Subscribe, to_bytes
from .errors import TEXTS

Op = Generator[Any, Any, Any]

#: Where the scripts live (package data; the module suite's tests/support loads them too).
LUA_DIR = Path(__file__).resolve().parent / "lua"

#: How long an unlock's reply is remembered for its retries (Redisson's unlock latch).
UNLOCK_LATCH_MS = 10_000

#: A waiter behind a lease looks again this long after the PTTL its try answered, so that
#: the key has expired by then (the server counts whole milliseconds).
LEASE_END_MARGIN_MS = 2

#: RPermitExpirableSemaphore's score of a permit without a lease.
NON_EXPIRABLE = 922337203685477

#: Redisson's messages: LockPubSub's unlock (wake one) and read-unlock (wake all).
UNLOCK_MESSAGE = 0
READ_UNLOCK_MESSAGE = 1
#: CountDownLatchPubSub's: the count reached zero / a count was set or deleted.
ZERO_COUNT_MESSAGE = 0
NEW_COUNT_MESSAGE = 1

_OPTIONS = {b"ID", b"WAIT", b"ASYNC", b"PERMITS", b"PX"}


class _Script:
    """One Lua file: its text and SHA1 (what EVALSHA names)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.text = (LUA_DIR / f"{name}.lua").read_text()
        self.sha = hashlib.sha1(self.text.encode()).hexdigest()


_LOADED: Dict[str, _Script] = {}


def script(name: str) -> _Script:
    found = _LOADED.get(name)
    if found is None:
        found = _LOADED[name] = _Script(name)
    return found


#: Whether a script may be sent again after a failure that may have come after the server
#: received it (a broken connection, a timeout after the write). Without the module no
#: request id makes a re-run safe, so only a script whose second run after an applied
#: first run changes nothing and answers the same may: the others are sent once
#: (`Call.once`) and such a failure raises `rlock.OutcomeUnknown`. A failure before the
#: write (no connection) is retried as before. The same table in every client
#: (docs/scripts-mode.md, "Retries").
MAY_RETRY: Dict[str, bool] = {
    "lock_acquire": False,          # HINCRBY: a second run is a second hold
    "fenced_acquire": False,        # INCR of the token, HINCRBY
    "fenced_acquire_token": False,
    "read_acquire": False,          # HINCRBY
    "write_acquire": False,
    "lock_unlock": True,            # the unlock latch key (the release's request id)
    "read_unlock": True,            # answers a re-run what the first run answered
    "write_unlock": True,
    "lock_renew": True,             # PEXPIRE
    "read_renew": True,
    "lock_force_unlock": False,     # a re-run answers 0 where the first deleted
    "read_force_unlock": False,
    "write_force_unlock": False,
    "semaphore_try_set": False,     # a re-run answers 0 where the first set
    "semaphore_try_set_ttl": False,
    "semaphore_add": False,         # INCRBY
    "semaphore_release": False,     # INCRBY: permits beyond the count
    "semaphore_release_if_exists": False,
    "semaphore_try_acquire": False,  # DECRBY
    "semaphore_drain": False,       # a re-run answers 0: the drained count is lost
    "pes_try_acquire": False,       # DECRBY + ZADD
    "pes_add": False,               # INCRBY
    "pes_release": False,           # a re-run answers 0 (not held) where the first released
    "pes_release_many": False,
    "pes_set_permits": True,        # sets to a target: a re-run finds it set
    "pes_update_lease": True,       # ZADD of the same id's expiry
    "pes_available": True,          # reads (reclaiming expired ids happens once)
    "pes_get_permits": True,
    "pes_acquired": True,
    "pes_lease_time": True,
    "latch_try_set": False,         # a re-run answers 0 where the first set
    "latch_count_down": False,      # DECR: awaiters released early
    "latch_delete": False,          # a re-run answers 0 where the first deleted
}


def evaluate(name: str, keys: List[Any], args: List[Any]) -> Op:
    """EVALSHA of the script ``name``; EVAL (which caches it again) on NOSCRIPT (the
    script did not run). Sent once where `MAY_RETRY` says so."""
    s = script(name)
    once = not MAY_RETRY[name]
    at = to_bytes(keys[0]) if once and keys else None
    try:
        return (yield Call(("EVALSHA", s.sha, len(keys), *keys, *args), at=at, once=once))
    except NoScriptError:
        return (yield Call(("EVAL", s.text, len(keys), *keys, *args), at=at, once=once))


# ---- Redisson's names (RedissonObject.prefixName / suffixName) --------------------------


def prefix_name(prefix: bytes, name: bytes) -> bytes:
    """``prefix:{name}``, or ``prefix:name`` when the name has a ``{`` of its own."""
    return prefix + b":" + name if b"{" in name else prefix + b":{" + name + b"}"


def suffix_name(name: bytes, suffix: bytes) -> bytes:
    """``{name}:suffix``, or ``name:suffix`` when the name has a ``{`` of its own."""
    return name + b":" + suffix if b"{" in name else b"{" + name + b"}:" + suffix


def lock_channel(name: bytes) -> bytes:
    return prefix_name(b"redisson_lock__channel", name)


def rw_channel(name: bytes) -> bytes:
    return prefix_name(b"redisson_rwlock", name)


def semaphore_channel(name: bytes) -> bytes:
    return prefix_name(b"redisson_sc", name)


def latch_channel(name: bytes) -> bytes:
    """Always braces (RedissonCountDownLatch.getChannelName has no prefixName rule)."""
    return b"redisson_countdownlatch__channel__{" + name + b"}"


def token_key(name: bytes) -> bytes:
    return prefix_name(b"redisson_lock_token", name)


def timeout_zset(name: bytes) -> bytes:
    return suffix_name(name, b"timeout")


def rw_timeout_prefix(name: bytes, owner: bytes) -> bytes:
    """``{name}:<owner>:rwlock_timeout``: read hold n's timeout key is this + ``:n``."""
    return suffix_name(name, owner) + b":rwlock_timeout"


def rw_key_prefix(name: bytes) -> bytes:
    """RedissonReadLock.getKeyPrefix: ``{name}`` (``name`` when it has a ``{``)."""
    return name if b"{" in name else b"{" + name + b"}"


def unlock_latch(name: bytes, request_id: bytes) -> bytes:
    return prefix_name(b"redisson_unlock_latch", name) + b":" + request_id


def channel_of(args: List[Any]) -> bytes:
    """The channel a waiter of this (waiting) module command listens on."""
    cmd, name = to_bytes(args[0]).upper(), to_bytes(args[1])
    if cmd in (b"RLOCK.ACQUIRE", b"RFENCED.ACQUIRE"):
        return lock_channel(name)
    if cmd == b"RRWLOCK.ACQUIRE":
        return rw_channel(name)
    if cmd in (b"RSEMAPHORE.ACQUIRE", b"RPSEMAPHORE.ACQUIRE"):
        return semaphore_channel(name)
    if cmd == b"RLATCH.AWAIT":
        return latch_channel(name)
    raise ResponseError(f"rlock scripts mode: {cmd.decode()} does not wait")


# ---- the commands --------------------------------------------------------------------


def _split(args: List[Any], fixed: int) -> Tuple[List[bytes], Dict[bytes, Any]]:
    """Positional arguments (at least ``fixed`` after the command) and the options."""
    words = [to_bytes(a) for a in args[1:]]
    pos: List[bytes] = []
    i = 0
    while i < len(words) and (i < fixed or words[i].upper() not in _OPTIONS):
        pos.append(words[i])
        i += 1
    opts: Dict[bytes, Any] = {}
    while i < len(words):
        word = words[i].upper()
        if word == b"ASYNC":
            opts[word] = True
            i += 1
        else:
            opts[word] = words[i + 1] if i + 1 < len(words) else b""
            i += 2
    return pos, opts


def _now_ms() -> int:
    """Redisson passes the client's System.currentTimeMillis() to the permit scripts."""
    return int(time.time() * 1000)


def _int(value: Any) -> int:
    return 0 if value is None else int(value)


def _rid(opts: Dict[bytes, Any]) -> bytes:
    return opts.get(b"ID") or os.urandom(16).hex().encode()


def command(args: Tuple[Any, ...], publish: str) -> Op:
    """One module command done with Redisson's scripts: the module's reply."""
    reply, _ = yield from _command(list(args), publish)
    return reply


def _command(args: List[Any], publish: str) -> Op:
    """The module's reply and, for an acquire that did not succeed, how many ms until the
    holder's lease (or the first permit's) ends: when to look again without a message."""
    cmd = to_bytes(args[0]).upper()
    handler = _HANDLERS.get(cmd)
    if handler is None:
        raise ResponseError(f"rlock scripts mode: {cmd.decode()} needs the rlock module "
                            "(no Redisson script does it)")
    return (yield from handler(args, publish))


def _lock_acquire(args: List[Any], publish: str) -> Op:
    (name, owner, lease), _ = _split(args, 3)
    reply = yield from evaluate("lock_acquire", [name], [lease, owner])
    return reply, reply


def _lock_release(args: List[Any], publish: str) -> Op:
    pos, opts = _split(args, 2)
    name, owner = pos[0], pos[1]
    lease = pos[2] if len(pos) > 2 else b"30000"
    reply = yield from evaluate(
        "lock_unlock", [name, lock_channel(name), unlock_latch(name, _rid(opts))],
        [UNLOCK_MESSAGE, lease, owner, publish, UNLOCK_LATCH_MS])
    return reply, None


def _lock_renew(args: List[Any], publish: str) -> Op:
    return (yield from evaluate(*renew_script(args))), None


def renew_script(args: List[Any]) -> Tuple[str, List[Any], List[Any]]:
    """The script, keys and arguments that do ``RLOCK.RENEW`` or ``RRWLOCK.RENEW``."""
    if to_bytes(args[0]).upper() == b"RLOCK.RENEW":
        (name, owner, lease), _ = _split(args, 3)
        return "lock_renew", [name], [lease, owner]
    (name, side, owner, lease), _ = _split(args, 4)
    if side.upper() == b"READ":
        return "read_renew", [name, rw_key_prefix(name)], [lease, 1, owner]
    return "lock_renew", [name], [lease, owner + b":write"]


def renew_eval(args: List[Any]) -> Tuple[Any, ...]:
    """``RLOCK.RENEW``/``RRWLOCK.RENEW`` as one ``EVAL`` (not EVALSHA: it goes in a
    pipeline after which nothing could resend it on NOSCRIPT), for replica sync."""
    name, keys, argv = renew_script(args)
    return ("EVAL", script(name).text, len(keys), *keys, *argv)


def _lock_force(args: List[Any], publish: str) -> Op:
    (name,), _ = _split(args, 1)
    return (yield from evaluate("lock_force_unlock", [name, lock_channel(name)],
                                [UNLOCK_MESSAGE, publish])), None


def _fenced_acquire(args: List[Any], publish: str) -> Op:
    (name, owner, lease), _ = _split(args, 3)
    ttl, token = yield from evaluate("fenced_acquire_token", [name, token_key(name)],
                                     [lease, owner])
    if int(ttl) == -1:
        return [None, int(token)], None
    return int(ttl), int(ttl)


def _fenced_token(args: List[Any], publish: str) -> Op:
    (name,), _ = _split(args, 1)
    value = yield Call(("GET", token_key(name)))
    return (None if value is None else int(value)), None


def _rw_acquire(args: List[Any], publish: str) -> Op:
    (name, side, owner, lease), _ = _split(args, 4)
    writer = owner + b":write"
    if side.upper() == b"READ":
        reply = yield from evaluate("read_acquire", [name, rw_timeout_prefix(name, owner)],
                                    [lease, owner, writer])
        return reply, reply
    reply = yield from evaluate("write_acquire", [name], [lease, writer])
    if reply is not None:
        # The module refuses an upgrade at once; Redisson's script would let the owner
        # wait for itself until its own read leases end. Only this owner changes its own
        # read field, so looking after the script is not a race.
        mode, reads = yield Call(("HMGET", name, "mode", owner))
        if mode is not None and to_bytes(mode) == b"read" and reads is not None:
            raise ResponseError(TEXTS["ERR_RW_READ_HELD"])
    return reply, reply


def _rw_release(args: List[Any], publish: str) -> Op:
    pos, opts = _split(args, 3)
    name, side, owner = pos[0], pos[1], pos[2]
    lease = pos[3] if len(pos) > 3 else b"30000"
    latch = unlock_latch(name, _rid(opts))
    if side.upper() == b"READ":
        reply = yield from evaluate(
            "read_unlock", [name, rw_channel(name), rw_timeout_prefix(name, owner),
                            rw_key_prefix(name), latch],
            [UNLOCK_MESSAGE, owner, publish, UNLOCK_LATCH_MS])
    else:
        reply = yield from evaluate(
            "write_unlock", [name, rw_channel(name), latch],
            [READ_UNLOCK_MESSAGE, lease, owner + b":write", publish, UNLOCK_LATCH_MS])
    return reply, None


def _rw_renew(args: List[Any], publish: str) -> Op:
    name, keys, argv = renew_script(args)
    reply = yield from evaluate(name, keys, argv)
    return (int(reply[0]) if name == "read_renew" else reply), None


def _rw_force(args: List[Any], publish: str) -> Op:
    (name,), _ = _split(args, 1)
    mode = yield Call(("HGET", name, "mode"))
    if mode is None:
        return 0, None
    read = to_bytes(mode) == b"read"
    return (yield from evaluate("read_force_unlock" if read else "write_force_unlock",
                                [name, rw_channel(name)],
                                [UNLOCK_MESSAGE if read else READ_UNLOCK_MESSAGE,
                                 publish])), None


def _permits(value: Any) -> Any:
    """A permit count as the module takes it (0 to 2^31 - 1), else the module's error:
    Redisson's client refuses a negative count before its script runs, rlock's module
    before it writes; scripts mode refuses it the module's way."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = -1
    if not 0 <= n <= 2**31 - 1:
        raise ResponseError(TEXTS["ERR_PERMITS"])
    return value


def _sem_try_set(args: List[Any], publish: str) -> Op:
    (name, permits), opts = _split(args, 2)
    _permits(permits)
    keys = [name, semaphore_channel(name)]
    if b"PX" in opts:
        reply = yield from evaluate("semaphore_try_set_ttl", keys,
                                    [permits, publish, opts[b"PX"]])
    else:
        reply = yield from evaluate("semaphore_try_set", keys, [permits, publish])
    return reply, None


def _get_int(name: bytes) -> Op:
    return _int((yield Call(("GET", name))))


def _sem_add(args: List[Any], publish: str) -> Op:
    (name, delta), _ = _split(args, 2)
    yield from evaluate("semaphore_add", [name, semaphore_channel(name)], [delta, publish])
    return (yield from _get_int(name)), None


def _sem_acquire(args: List[Any], publish: str) -> Op:
    (name, permits), _ = _split(args, 2)
    if int(permits) == 0:
        return 1, None  # Redisson answers without a call
    return (yield from evaluate("semaphore_try_acquire", [name], [permits])), None


def _sem_release(args: List[Any], publish: str) -> Op:
    (name, permits), _ = _split(args, 2)
    if int(permits) != 0:
        yield from evaluate("semaphore_release", [name, semaphore_channel(name)],
                            [permits, publish])
    return (yield from _get_int(name)), None


def _sem_available(args: List[Any], publish: str) -> Op:
    (name,), _ = _split(args, 1)
    return (yield from _get_int(name)), None


def _sem_drain(args: List[Any], publish: str) -> Op:
    (name,), _ = _split(args, 1)
    return _int((yield from evaluate("semaphore_drain", [name], []))), None


def _pes_keys(name: bytes) -> List[bytes]:
    """The reclaiming scripts' KEYS: name, timeout zset, channel."""
    return [name, timeout_zset(name), semaphore_channel(name)]


def _pes_try_set(args: List[Any], publish: str) -> Op:
    (name, permits), _ = _split(args, 2)
    _permits(permits)
    return (yield from evaluate("semaphore_try_set", [name, semaphore_channel(name)],
                                [permits, publish])), None


def _pes_available_of(name: bytes, publish: str) -> Op:
    return _int((yield from evaluate("pes_available", _pes_keys(name), [_now_ms(), publish])))


def _pes_set(args: List[Any], publish: str) -> Op:
    (name, permits), _ = _split(args, 2)
    _permits(permits)
    yield from evaluate("pes_set_permits", [name, semaphore_channel(name), timeout_zset(name)],
                        [permits, publish])
    return (yield from _pes_available_of(name, publish)), None


def _pes_add(args: List[Any], publish: str) -> Op:
    (name, delta), _ = _split(args, 2)
    yield from evaluate("pes_add", [name, semaphore_channel(name)], [delta, publish])
    return (yield from _pes_available_of(name, publish)), None


def _pes_available(args: List[Any], publish: str) -> Op:
    (name,), _ = _split(args, 1)
    return (yield from _pes_available_of(name, publish)), None


def _pes_acquired(args: List[Any], publish: str) -> Op:
    (name,), _ = _split(args, 1)
    return _int((yield from evaluate("pes_acquired", _pes_keys(name),
                                     [_now_ms(), publish]))), None


def _expiry(lease_ms: int, now: int) -> int:
    return NON_EXPIRABLE if lease_ms < 0 else now + lease_ms


def _raw_id(permit_id: bytes) -> bytes:
    """A permit id (32 hex digits) as the 16 bytes the zset holds; ResponseError if not."""
    try:
        raw = bytes.fromhex(permit_id.decode())
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise ResponseError("BADPERMITID scripts mode takes Redisson's permit ids: "
                            "32 hex digits")
    return raw


def _pes_acquire(args: List[Any], publish: str) -> Op:
    (name, lease), opts = _split(args, 2)
    permits = int(opts.get(b"PERMITS", 1))
    ids = [os.urandom(16) for _ in range(permits)]
    now = _now_ms()
    reply = yield from evaluate(
        "pes_try_acquire", _pes_keys(name),
        [permits, _expiry(int(lease), now), now, NON_EXPIRABLE, publish, *ids])
    reply = to_bytes(reply) if reply is not None else None
    if reply == b"OK":
        hexed = [i.hex().encode() for i in ids]
        return (hexed[0] if permits == 1 else hexed), None
    if reply is not None and reply.startswith(b":"):
        return None, max(1, int(float(reply[1:])) - now)
    return None, None


def _pes_release(args: List[Any], publish: str) -> Op:
    (name, permit_id), _ = _split(args, 2)
    return (yield from evaluate("pes_release",
                                [name, semaphore_channel(name), timeout_zset(name)],
                                [_raw_id(permit_id), 1, _now_ms(), publish])), None


def _pes_update(args: List[Any], publish: str) -> Op:
    (name, permit_id, lease), _ = _split(args, 3)
    now = _now_ms()
    return (yield from evaluate("pes_update_lease", _pes_keys(name),
                                [_raw_id(permit_id), _expiry(int(lease), now), now,
                                 publish])), None


def _pes_lease_time(args: List[Any], publish: str) -> Op:
    (name, permit_id), _ = _split(args, 2)
    return (yield from evaluate("pes_lease_time", _pes_keys(name),
                                [_raw_id(permit_id), NON_EXPIRABLE, _now_ms(), publish])), None


def _latch_try_set(args: List[Any], publish: str) -> Op:
    (name, count), _ = _split(args, 2)
    return (yield from evaluate("latch_try_set", [name, latch_channel(name)],
                                [NEW_COUNT_MESSAGE, count, publish])), None


def _latch_count_down(args: List[Any], publish: str) -> Op:
    (name,), _ = _split(args, 1)
    yield from evaluate("latch_count_down", [name, latch_channel(name)],
                        [ZERO_COUNT_MESSAGE, publish])
    return max(0, (yield from _get_int(name))), None


def _latch_count(args: List[Any], publish: str) -> Op:
    (name,), _ = _split(args, 1)
    return max(0, (yield from _get_int(name))), None


def _latch_delete(args: List[Any], publish: str) -> Op:
    (name,), _ = _split(args, 1)
    return (yield from evaluate("latch_delete", [name, latch_channel(name)],
                                [NEW_COUNT_MESSAGE, publish])), None


def _latch_await(args: List[Any], publish: str) -> Op:
    count, _ = yield from _latch_count(args, publish)
    return (1 if count == 0 else 0), None


_HANDLERS = {
    b"RLOCK.ACQUIRE": _lock_acquire, b"RLOCK.RELEASE": _lock_release,
    b"RLOCK.RENEW": _lock_renew, b"RLOCK.FORCERELEASE": _lock_force,
    b"RFENCED.ACQUIRE": _fenced_acquire, b"RFENCED.GETTOKEN": _fenced_token,
    b"RRWLOCK.ACQUIRE": _rw_acquire, b"RRWLOCK.RELEASE": _rw_release,
    b"RRWLOCK.RENEW": _rw_renew, b"RRWLOCK.FORCERELEASE": _rw_force,
    b"RSEMAPHORE.TRYSETPERMITS": _sem_try_set, b"RSEMAPHORE.ADDPERMITS": _sem_add,
    b"RSEMAPHORE.ACQUIRE": _sem_acquire, b"RSEMAPHORE.RELEASE": _sem_release,
    b"RSEMAPHORE.AVAILABLEPERMITS": _sem_available, b"RSEMAPHORE.DRAINPERMITS": _sem_drain,
    b"RPSEMAPHORE.TRYSETPERMITS": _pes_try_set, b"RPSEMAPHORE.SETPERMITS": _pes_set,
    b"RPSEMAPHORE.ADDPERMITS": _pes_add, b"RPSEMAPHORE.AVAILABLEPERMITS": _pes_available,
    b"RPSEMAPHORE.ACQUIREDPERMITS": _pes_acquired, b"RPSEMAPHORE.ACQUIRE": _pes_acquire,
    b"RPSEMAPHORE.RELEASE": _pes_release, b"RPSEMAPHORE.UPDATELEASETIME": _pes_update,
    b"RPSEMAPHORE.LEASETIME": _pes_lease_time,
    b"RLATCH.TRYSETCOUNT": _latch_try_set, b"RLATCH.COUNTDOWN": _latch_count_down,
    b"RLATCH.GETCOUNT": _latch_count, b"RLATCH.DELETE": _latch_delete,
    b"RLATCH.AWAIT": _latch_await,
}


def _granted(cmd: bytes, reply: Any) -> bool:
    """Whether a waiting command's reply ends the wait (the module's meaning)."""
    if cmd in (b"RLOCK.ACQUIRE", b"RRWLOCK.ACQUIRE"):
        return reply is None
    if cmd == b"RFENCED.ACQUIRE":
        return isinstance(reply, list)
    if cmd == b"RPSEMAPHORE.ACQUIRE":
        return reply is not None
    return reply == 1  # RSEMAPHORE.ACQUIRE, RLATCH.AWAIT


def wait(shape: Shape, publish: str, since: Optional[float] = None) -> Op:
    """A waiting command, Redisson's way: subscribe the primitive's channel first (so no
    release is missed), try, and until the wait ends sleep until a message on the channel
    or the holder's lease end (the PTTL, or the first permit's expiry) before trying
    again. The module's reply to the wait. ``since``: when the wait's time began (the
    mode probe before it counts; None: now)."""
    args = shape.with_wait(None, False)
    cmd = to_bytes(args[0]).upper()
    channel = channel_of(args)
    began = time.monotonic() if since is None else since
    deadline = None if shape.wait_ms == 0 else began + shape.wait_ms / 1000
    sub = yield Subscribe(shape.key, channel)
    first = True
    try:
        while True:
            reply, hint = yield from _command(args, publish)
            if _granted(cmd, reply):
                shape.at_once = first  # taken at its first try: it was free
                return reply
            first = False
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return reply
            if hint == -2:
                continue  # the holder's key went between the script's two looks: try again
            if isinstance(hint, int) and hint >= 0:  # -1: a key without a lease
                # Just past the lease end (the server's PTTL is in whole ms): one look.
                wake = (hint + LEASE_END_MARGIN_MS) / 1000
                left = wake if left is None else min(left, wake)
            if not (yield Listen(sub, left)):
                # The subscription broke (its node went, or the slot moved): subscribe
                # again, on the node that owns the key now, before the next try.
                sub.close()
                sub = yield Subscribe(shape.key, channel)
    finally:
        sub.close()
