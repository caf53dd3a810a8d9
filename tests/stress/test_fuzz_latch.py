"""Protocol fuzz of the countdown latch (RLATCH.*), as tests/stress/test_fuzz.py does for RLOCK.*:
seeded random argument lists (its generator and number pool), every reply checked against
a small oracle of the argument rules (docs/internals/sync-commands.md), then the server is up,
nobody waits, and `used_memory` is back at its baseline.

Same knobs as test_fuzz.py: $RLOCK_FUZZ_SEED, $RLOCK_FUZZ_CALLS (default here 2000: the
lock's fuzz already covers the shared parsing paths, this one the latch's).
"""

import os
import re

from conftest import wait_until
from errors import ASYNC as ERR_ASYNC, LATCH_COUNT, NOT_A_LATCH
from hostile_helpers import (fill_module_client_pool, memory_back, ERR_EMPTY_ID, ERR_INTERNAL_PREFIX, ERR_SYNTAX, ERR_TIMEOUT,
                             ERR_WRONGTYPE, MAX_MS, Map, Raw, ReplyError, arity_error,
                             blocked_clients, connected_clients, rlock_stat, settle_memory,
                             used_memory)
from test_fuzz import CHUNK, OWNERS, Gen

SEED = int(os.environ.get("RLOCK_FUZZ_SEED", "20240607"))
CALLS = int(os.environ.get("RLOCK_FUZZ_CALLS", "2000"))

WRONG_TYPE_KEYS = {b"fl:hash", b"fl:list", b"fl:zset"}
NOT_A_LATCH_KEY = b"fl:str"
CLOSED_KEY = b"fl:closed"  # a latch kept at a huge count, so awaits block and time out
KEYS = [b"fl:a", b"{fl}b", b"fl:{x", CLOSED_KEY, NOT_A_LATCH_KEY, *WRONG_TYPE_KEYS]
COMMANDS = ["RLATCH.TRYSETCOUNT", "RLATCH.COUNTDOWN", "RLATCH.GETCOUNT", "RLATCH.AWAIT",
            "RLATCH.DELETE", "RLATCH.INFO"]
# Arguments after the command name: (fewest, most).
ARITY = {"RLATCH.TRYSETCOUNT": (2, 4), "RLATCH.COUNTDOWN": (1, 3), "RLATCH.GETCOUNT": (1, 1),
         "RLATCH.AWAIT": (1, 8), "RLATCH.DELETE": (1, 3), "RLATCH.INFO": (1, 1)}
INT = re.compile(rb"-?(0|[1-9][0-9]*)\Z")


def parse_int(b, low, high):
    """The module's integer rule: strict decimal (no '+', spaces, leading zeros, '-0')."""
    if len(b) > 30 or not INT.match(b) or b == b"-0":
        return None
    n = int(b)
    return n if low <= n <= high else None


class LatchGen(Gen):
    def key(self):
        return self.pick(KEYS)

    def call(self):
        name = self.rng.choice(COMMANDS + ["RLATCH.COUNTDOWN", "RLATCH.AWAIT"])
        if self.rng.random() < 0.15:  # any arity, any tokens
            args = [self.token() for _ in range(self.rng.randrange(0, 6))]
        else:
            args = [self.key()]
            if name == "RLATCH.TRYSETCOUNT":
                args.append(self.rng.choice([b"1", b"2", b"3", str(2**63 - 1).encode()])
                            if self.rng.random() < 0.5 else self.number())
            reads = name in ("RLATCH.GETCOUNT", "RLATCH.INFO")
            for _ in range(self.rng.choice([0, 0, 0, 1] if reads else [0, 0, 1, 1, 2])):
                roll = self.rng.random()
                if roll < 0.4:
                    args += [b"WAIT", self.number(valid=0.8)]
                elif roll < 0.8:
                    args += [b"ID", self.pick(OWNERS)]
                else:
                    args += [self.option(), self.number()]
            if self.rng.random() < 0.05:
                args.append(self.option())
            if name == "RLATCH.AWAIT" and self.rng.random() < 0.2:
                # A queued ticket (docs/commands/tickets.md): needs WAIT and ID.
                args.insert(self.rng.randrange(1, len(args) + 1), b"ASYNC")
        if name == "RLATCH.AWAIT":
            # A valid WAIT may block: cap it at a few ms (WAIT 0 would wait forever).
            for i in range(1, len(args) - 1):
                if args[i].upper() == b"WAIT" and parse_int(args[i + 1], 0, MAX_MS) is not None:
                    args[i + 1] = str(self.rng.randint(1, 5)).encode()
        return [name, *args]


def options_error(rest, wait_allowed):
    """parse_options: pairs in any order, WAIT (where allowed) and ID each once, the flag
    ASYNC (with WAIT) once; ASYNC needs WAIT and ID."""
    waited = has_id = queued = False
    while rest:
        if wait_allowed and not queued and rest[0].upper() == b"ASYNC":
            queued, rest = True, rest[1:]
            continue
        if len(rest) < 2:
            break
        option, value = rest[0].upper(), rest[1]
        if option == b"WAIT" and wait_allowed and not waited:
            if parse_int(value, 0, MAX_MS) is None:
                return ERR_TIMEOUT
            waited = True
        elif option == b"ID" and not has_id:
            if value == b"":
                return ERR_EMPTY_ID
            has_id = True
        else:
            return ERR_SYNTAX
        rest = rest[2:]
    if rest:
        return ERR_SYNTAX
    if queued and not (waited and has_id):
        return ERR_ASYNC
    if has_id and wait_allowed and not queued:
        return ERR_SYNTAX  # AWAIT changes nothing: an id only names a queued ticket
    return None


def expected_error(call):
    name, args = call[0], call[1:]
    low, high = ARITY[name]
    if not low <= len(args) <= high:
        return arity_error(name)
    if name == "RLATCH.TRYSETCOUNT":
        if parse_int(args[1], 1, 2**63 - 1) is None:
            return LATCH_COUNT
        return options_error(args[2:], False)
    if name in ("RLATCH.COUNTDOWN", "RLATCH.DELETE"):
        return options_error(args[1:], False)
    if name == "RLATCH.AWAIT":
        return options_error(args[1:], True)
    return None


def shape_ok(name, reply):
    if name == "RLATCH.AWAIT" and reply == b"QUEUED":
        return True  # a queued ticket (ASYNC)
    if name in ("RLATCH.TRYSETCOUNT", "RLATCH.AWAIT", "RLATCH.DELETE"):
        return type(reply) is int and reply in (0, 1)
    if name in ("RLATCH.COUNTDOWN", "RLATCH.GETCOUNT"):
        return type(reply) is int and reply >= 0
    pairs = list(reply) if isinstance(reply, Map) else (
        list(zip(reply[0::2], reply[1::2])) if isinstance(reply, list) else [])
    return ([k for k, _ in pairs] == [b"count", b"pttl", b"waiters"]
            and all(type(v) is int for _, v in pairs) and pairs[0][1] >= 0
            and pairs[1][1] >= -2 and pairs[2][1] >= 0)


def check(call, reply):
    if isinstance(reply, ReplyError) and reply.text.startswith(ERR_INTERNAL_PREFIX):
        return "internal error"
    want = expected_error(call)
    if want is None:
        key = call[1]
        if key in WRONG_TYPE_KEYS:
            want = ERR_WRONGTYPE
        elif key == NOT_A_LATCH_KEY:
            want = NOT_A_LATCH
    if want is not None:
        return None if reply == ReplyError(want) else f"expected error {want!r}"
    if isinstance(reply, ReplyError):
        return "unexpected error"
    if any(a.upper() == b"ID" for a in call[2:]):
        # A request id names one call, whatever the command: a reused id is a replay of
        # the first call's reply (a count-down's count may come back to a TRYSETCOUNT).
        if call[0] == "RLATCH.AWAIT" and reply == b"QUEUED":
            return None  # an AWAIT's id only names its queued ticket: no replay
        return None if type(reply) is int and reply >= 0 else "malformed replayed reply"
    return None if shape_ok(call[0], reply) else "malformed reply"


def show(call):
    return [a if len(a) <= 40 else a[:20] + b"...(%d bytes)" % len(a) for a in
            (c if isinstance(c, bytes) else c.encode() for c in call)]


def prepare(ctl):
    assert ctl.pipeline([("SET", NOT_A_LATCH_KEY, "v"), ("RPUSH", "fl:list", "a"),
                         ("ZADD", "fl:zset", 1, "m"), ("HSET", "fl:hash", "o1", "1"),
                         ("SET", CLOSED_KEY, 10**15)]) == [b"OK", 1, 1, 1, b"OK"]


def fuzz(port, seed, calls):
    gen = LatchGen(seed)
    ctl = Raw(port)
    conns = [Raw(port, timeout=5), Raw(port, timeout=5)]
    failures, well_formed = [], 0
    try:
        assert isinstance(conns[1].call("HELLO", "3"), Map)
        prepare(ctl)
        for n in range(0, calls, CHUNK):
            batch = [gen.call() for _ in range(min(CHUNK, calls - n))]
            conn = conns[(n // CHUNK) % 2]
            for call, reply in zip(batch, conn.pipeline(batch)):
                well_formed += expected_error(call) is None
                problem = check(call, reply)
                if problem and len(failures) < 20:
                    failures.append((problem, show(call), reply))
            ctl.call("SET", CLOSED_KEY, 10**15)  # keep it closed (DELETE may have opened it)
    finally:
        for c in (ctl, *conns):
            c.close()
    return failures, well_formed


def test_random_latch_calls_get_valid_replies_and_leave_no_trace(make_server):
    server = make_server(args=["--hz", "500"])
    ctl = Raw(server.port)
    try:
        clients = connected_clients(ctl)
        fuzz(server.port, SEED + 1, 500)  # warm-up: tables and buffers at working size
        fill_module_client_pool(server.port)
        wait_until(lambda: connected_clients(ctl) == clients, what="fuzz clients gone")
        settle_memory(ctl)
        baseline = used_memory(ctl)

        failures, well_formed = fuzz(server.port, SEED, CALLS)
        assert not failures, "\n".join(f"{p}: {c!r} -> {r!r}" for p, c, r in failures)
        assert well_formed > CALLS // 3, "the generator must reach the commands' logic"
        server.assert_alive()
        assert ctl.call("PING") == b"PONG"
        wait_until(lambda: connected_clients(ctl) == clients, what="fuzz clients gone")
        assert blocked_clients(ctl) == 0
        assert (rlock_stat(ctl, "waiters"), rlock_stat(ctl, "keys_with_waiters")) == (0, 0)
        assert rlock_stat(ctl, "latch_await_timeouts") > 0, "some awaits must have blocked"
        assert rlock_stat(ctl, "latch_openings") > 0, "some latches must have opened"

        # The margin of test_fuzz.py, for the same reasons.
        memory_back(ctl, baseline)
    finally:
        ctl.close()

