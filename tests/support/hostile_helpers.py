"""Helpers for the hostile-input and fault tests (issue 7): a raw RESP client that shows
replies exactly as the server sent them, and readers for `INFO` sections.

redis-py rewrites error replies (it strips known code prefixes) and cannot keep hundreds of
blocked calls open without hundreds of threads; a plain socket does both, and its strict
parser doubles as a check that every reply is well-formed RESP.
"""

import select
import socket
import time

# The module's error texts, defined once in errors.py (the spec: assert exact texts).
from errors import EMPTY_ID as ERR_EMPTY_ID
from errors import EMPTY_OWNER as ERR_EMPTY_OWNER
from errors import LEASE as ERR_LEASE
from errors import NOT_A_LOCK as ERR_NOT_A_LOCK
from errors import SYNTAX as ERR_SYNTAX
from errors import TIMEOUT as ERR_TIMEOUT
from errors import WRONGTYPE as ERR_WRONGTYPE

from errors import INTERNAL as _INTERNAL

# The internal error's text up to its parenthesis (a fuzz call may see it with more).
ERR_INTERNAL_PREFIX = _INTERNAL.split(" (")[0]
MAX_MS = 100 * 365 * 24 * 3600 * 1000


def arity_error(command):
    return f"ERR wrong number of arguments for '{command.lower()}' command"


class ReplyError(Exception):
    """An error reply (`-...` or RESP3 `!...`), kept as the exact text the server sent."""

    def __init__(self, text):
        super().__init__(text)
        self.text = text

    def __eq__(self, other):
        return isinstance(other, ReplyError) and other.text == self.text

    def __hash__(self):
        return hash(self.text)

    def __repr__(self):
        return f"ReplyError({self.text!r})"


class ProtocolViolation(AssertionError):
    """The server sent bytes that are not valid RESP."""


class Map(list):
    """A RESP3 map reply, as a list of (key, value) pairs in the server's order."""


class Raw:
    """One connection speaking RESP by hand. Replies come back as Python values:
    None (nil), int, bytes, list, Map, float, bool; errors as ReplyError (returned, not raised).
    """

    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = bytearray()
        self.pos = 0
        # perf_counter() when the last bytes came in: when a reply reached this process,
        # apart from the time this pure-Python reader then takes to parse it (benches).
        self.received_at = 0.0

    @staticmethod
    def encode(args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            if isinstance(a, str):
                a = a.encode()
            elif isinstance(a, int):
                a = str(a).encode()
            out.append(b"$%d\r\n" % len(a))
            out.append(a)
            out.append(b"\r\n")
        return b"".join(out)

    def send(self, *args):
        self.sock.sendall(self.encode(args))

    def send_many(self, commands):
        self.sock.sendall(b"".join(self.encode(c) for c in commands))

    def call(self, *args):
        self.send(*args)
        return self.read()

    def pipeline(self, commands):
        self.send_many(commands)
        return [self.read() for _ in commands]

    def has_reply(self, timeout=0.0):
        """True when a reply (or part of one) has arrived; False after `timeout` seconds."""
        if self.pos < len(self.buf):
            return True
        ready, _, _ = select.select([self.sock], [], [], timeout)
        return bool(ready)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    # -- parser ----------------------------------------------------------------------------
    def _fill(self, deadline):
        if self.pos > 65536 and self.pos == len(self.buf):
            self.buf.clear()
            self.pos = 0
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no reply within the timeout")
        self.sock.settimeout(remaining)
        chunk = self.sock.recv(1 << 20)
        self.received_at = time.perf_counter()
        if not chunk:
            raise ConnectionError("connection closed by the server")
        self.buf += chunk

    def _line(self, deadline):
        while True:
            end = self.buf.find(b"\r\n", self.pos)
            if end >= 0:
                line = bytes(self.buf[self.pos:end])
                self.pos = end + 2
                return line
            self._fill(deadline)

    def _exact(self, n, deadline):
        while len(self.buf) - self.pos < n + 2:
            self._fill(deadline)
        data = bytes(self.buf[self.pos:self.pos + n])
        if self.buf[self.pos + n:self.pos + n + 2] != b"\r\n":
            raise ProtocolViolation(f"bulk string of {n} bytes not followed by CRLF")
        self.pos += n + 2
        return data

    def read(self, timeout=None):
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        return self._value(deadline)

    def _int(self, text):
        try:
            return int(text)
        except ValueError:
            raise ProtocolViolation(f"not an integer: {text!r}") from None

    def _value(self, deadline):
        line = self._line(deadline)
        if not line:
            raise ProtocolViolation("empty reply line")
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            return ReplyError(rest.decode("utf-8", "replace"))
        if kind == b":":
            return self._int(rest)
        if kind in (b"$", b"=", b"!"):
            n = self._int(rest)
            if n == -1 and kind == b"$":
                return None
            if n < 0:
                raise ProtocolViolation(f"bad length {n}")
            data = self._exact(n, deadline)
            return ReplyError(data.decode("utf-8", "replace")) if kind == b"!" else data
        if kind in (b"*", b"~", b">"):
            n = self._int(rest)
            if n == -1 and kind == b"*":
                return None
            return [self._value(deadline) for _ in range(n)]
        if kind == b"%":
            n = self._int(rest)
            return Map((self._value(deadline), self._value(deadline)) for _ in range(n))
        if kind == b"_":
            return None
        if kind == b"#":
            return rest == b"t"
        if kind == b",":
            return float(rest)
        if kind == b"(":
            return self._int(rest)
        raise ProtocolViolation(f"unknown reply type {line[:40]!r}")


def info_section(client, section):
    """`INFO <section>` as a dict of str -> str, from a redis-py client or a Raw one."""
    if isinstance(client, Raw):
        text = client.call("INFO", section)
        assert isinstance(text, bytes), text
        text = text.decode()
    else:
        text = client.execute_command("INFO", section)
        if isinstance(text, dict):  # redis-py parses INFO itself
            return {k: str(v) for k, v in text.items()}
        text = text.decode() if isinstance(text, bytes) else text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            k, v = line.split(":", 1)
            out[k] = v
    return out


def rlock_stat(client, name):
    return int(info_section(client, "rlock")[f"rlock_{name}"])


def blocked_clients(client):
    return int(info_section(client, "clients")["blocked_clients"])


def used_memory(client):
    return int(info_section(client, "memory")["used_memory"])


def connected_clients(client):
    return int(info_section(client, "clients")["connected_clients"])


def fill_module_client_pool(port, n=16):
    """Blocks `n` clients in RLOCK.ACQUIRE ... WAIT at once, then lets them all go.

    For every client a module blocks, Redis and Valkey take an internal reply client
    (16 KiB of buffer) from a pool of temporary module clients, and keep up to 8 idle
    ones in that pool for good (`modulesCron`'s `min_client`): about 120 KB that the first
    burst of waiters adds once and no later burst adds again. A memory baseline taken
    after this compares the module's own allocations, not whether that pool was full."""
    holder = Raw(port)
    waiters = [Raw(port) for _ in range(n)]
    try:
        holder.call("RLOCK.ACQUIRE", "{rlock-test}:pool", "holder", 60_000)
        for i, w in enumerate(waiters):
            w.send("RLOCK.ACQUIRE", "{rlock-test}:pool", f"w{i}", 60_000, "WAIT", 0)
        deadline = time.monotonic() + 10
        while blocked_clients(holder) < n:
            assert time.monotonic() < deadline, "waiters did not block"
            time.sleep(0.005)
        for _ in range(n + 1):
            holder.call("RLOCK.FORCERELEASE", "{rlock-test}:pool")
        for w in waiters:
            w.read()
        holder.call("DEL", "{rlock-test}:pool")
    finally:
        for c in waiters + [holder]:
            c.close()


def memory_back(client, baseline, margin=64 * 1024, timeout=10.0):
    """Waits until `used_memory`, after `settle_memory`, is within `margin` of `baseline`;
    fails with both readings if it is not within `timeout`. Not a single reading: blocked
    clients leave the module-client pool Redis keeps for them (7.0's RM_BlockClient reply
    clients, Valkey's alike) a few per cron tick after they go (README, Performance), so
    right after a run with many WAITs the server is still giving that memory back."""
    last = [None]

    def back():
        settle_memory(client)
        last[0] = used_memory(client)
        return last[0] - baseline <= margin

    deadline = time.monotonic() + timeout
    while not back():
        assert time.monotonic() < deadline, (baseline, last[0])
        time.sleep(0.05)
    return last[0]


def settle_memory(client):
    """Empties what Redis keeps around between commands so two `used_memory` readings
    compare the keyspace and the module's own allocations, not incidental caches. The
    flush is SYNC: Valkey (lazyfree-lazy-user-flush) would otherwise still be freeing the
    keys in the background while `used_memory` is read."""
    if isinstance(client, Raw):
        client.call("FLUSHALL", "SYNC")
    else:
        client.execute_command("FLUSHALL", "SYNC")
    for cmd in (("SLOWLOG", "RESET"), ("CONFIG", "RESETSTAT")):
        if isinstance(client, Raw):
            client.call(*cmd)
        else:
            client.execute_command(*cmd)
