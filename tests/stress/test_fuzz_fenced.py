"""Protocol fuzz of the fenced lock (issue 12, design.md 4.2): random argument lists sent to
RFENCED.ACQUIRE and RFENCED.GETTOKEN (with RLOCK.RELEASE / RLOCK.FORCERELEASE on the same
keys so that tokens keep being issued), from test_fuzz.py's seeded generator and oracle.

RFENCED.ACQUIRE takes RLOCK.ACQUIRE's arguments, so a malformed call must get exactly the
error test_fuzz.py's oracle predicts for RLOCK.ACQUIRE; a well-formed one `[nil, token]`
or `[pttl, nil]`, or the named error of a key prepared to be wrong (another type, a
hash that is no lock, a token key that is no integer). Beyond the shapes: every token
seen for a key is larger than every one seen before for it (replies arrive in the order
the server issued them: one connection at a time, and a blocked call holds its
connection's later calls), except a retry with a request id already answered "acquired",
which must get that first reply again. Afterwards the server is up, nobody waits, and `used_memory`
is back at its baseline. Same knobs as test_fuzz.py: $RLOCK_FUZZ_SEED, $RLOCK_FUZZ_CALLS.
"""

import errors
from conftest import wait_until
from hostile_helpers import (fill_module_client_pool, memory_back, ERR_INTERNAL_PREFIX, ERR_NOT_A_LOCK, ERR_WRONGTYPE, MAX_MS, Raw,
                             ReplyError, arity_error, blocked_clients, connected_clients,
                             rlock_stat, settle_memory, used_memory)
from redisson_rw import token_key
from test_fuzz import (CALLS, CHUNK, HELD_KEY, KEYS, NOT_A_LOCK_KEY, SEED, WRONG_TYPE_KEYS, Gen,
                       expected_error, parse_ms, show)

ERR_NOT_A_TOKEN = errors.NOT_A_TOKEN
SPOILED_KEY = b"fz:spoiled"  # its token key holds a string that is no integer
FENCED_KEYS = KEYS + [SPOILED_KEY]


class FencedGen(Gen):
    def key(self):
        return self.pick(FENCED_KEYS)

    def call(self):
        roll = self.rng.random()
        if roll < 0.6:
            # RLOCK.ACQUIRE's generator, long leases and capped WAITs included.
            while True:
                call = super().call()
                # Without ASYNC: a ticket granted in the background would remember
                # tokens this model does not follow (test_fuzz.py fuzzes the flag).
                if call[0] == "RLOCK.ACQUIRE" and b"ASYNC" not in call:
                    return ["RFENCED.ACQUIRE", *call[1:]]
        if roll < 0.75:
            if self.rng.random() < 0.2:
                return ["RFENCED.GETTOKEN", *[self.token() for _ in range(self.rng.choice([0, 2, 3]))]]
            return ["RFENCED.GETTOKEN", self.key()]
        if roll < 0.95:
            return ["RLOCK.RELEASE", self.key(), self.owner()]
        return ["RLOCK.FORCERELEASE", self.key()]


def expected(call):
    """The error a call must get (None: a reply of its shape)."""
    name, args = call[0], call[1:]
    if name == "RFENCED.GETTOKEN":
        if len(args) != 1:
            return arity_error(name)
        want = None
    elif name == "RFENCED.ACQUIRE":
        want = expected_error(["RLOCK.ACQUIRE", *args])
        if want is not None:
            return want.replace("rlock.acquire", "rfenced.acquire")
    else:
        want = expected_error(call)
        if want is not None:
            return want
    key = args[0]
    if key in WRONG_TYPE_KEYS and name != "RFENCED.GETTOKEN":
        return ERR_WRONGTYPE
    if key == NOT_A_LOCK_KEY and name != "RFENCED.GETTOKEN":
        return ERR_NOT_A_LOCK
    if key == SPOILED_KEY and name != "RLOCK.RELEASE" and name != "RLOCK.FORCERELEASE":
        return ERR_NOT_A_TOKEN  # never held, so every acquire needs a token
    return None


def request_id(call):
    """The ID of a well-formed RFENCED.ACQUIRE (options are pairs after the lease)."""
    opts = call[4:]
    ids = [opts[i + 1] for i in range(0, len(opts) - 1, 2) if opts[i].upper() == b"ID"]
    return ids[0] if ids else None


def check(call, reply, last_tokens, remembered):
    if isinstance(reply, ReplyError) and reply.text.startswith(ERR_INTERNAL_PREFIX):
        return "internal error"
    want = expected(call)
    if want is not None:
        return None if reply == ReplyError(want) else f"expected error {want!r}"
    if isinstance(reply, ReplyError):
        return "unexpected error"
    name, key = call[0], call[1]
    if name == "RFENCED.ACQUIRE":
        if not (isinstance(reply, list) and len(reply) == 2):
            return "malformed reply"
        pttl, token = reply
        if token is None:
            if (key, request_id(call)) in remembered:
                return "a remembered acquire answered contended"
            return None if type(pttl) is int and (pttl in (-2, -1) or 0 <= pttl <= MAX_MS) \
                else "malformed contended reply"
        if pttl is not None or type(token) is not int or token <= 0:
            return "malformed acquired reply"
        rid = request_id(call)
        if (key, rid) in remembered:
            # A retry of an acquire with this id: the first reply, token and all.
            return None if reply == remembered[(key, rid)] else "not the remembered reply"
        if rid is not None:
            remembered[(key, rid)] = reply
        if token <= last_tokens.get(key, 0):
            return f"token {token} not above {last_tokens.get(key)}"
        last_tokens[key] = token
        return None
    if name == "RFENCED.GETTOKEN":
        if reply is None:
            return None if key not in last_tokens else "token lost"
        return None if reply == last_tokens.get(key) else f"token {reply} != {last_tokens.get(key)}"
    return None if reply in (None, 0, 1) else "malformed reply"


def prepare(ctl):
    assert ctl.pipeline([("SET", "fz:str", "v"), ("RPUSH", "fz:list", "a"),
                         ("ZADD", "fz:zset", 1, "m"), ("HSET", NOT_A_LOCK_KEY, "o1", "x"),
                         ("SET", token_key(SPOILED_KEY.decode()), "x1"),
                         ("RLOCK.ACQUIRE", HELD_KEY, "the-holder", 600000)]) == [
        b"OK", 1, 1, 1, b"OK", None]


def fuzz(port, seed, calls, short_leases=False):
    gen = FencedGen(seed, short_leases)
    ctl = Raw(port)
    conns = [Raw(port, timeout=5), Raw(port, timeout=5)]
    failures, well_formed, last_tokens, remembered = [], 0, {}, {}
    try:
        prepare(ctl)
        for n in range(0, calls, CHUNK):
            batch = [gen.call() for _ in range(min(CHUNK, calls - n))]
            conn = conns[(n // CHUNK) % 2]
            for call, reply in zip(batch, conn.pipeline(batch)):
                well_formed += expected(call) is None
                problem = check(call, reply, last_tokens, remembered)
                if problem and len(failures) < 20:
                    failures.append((problem, show(call), reply))
            ctl.call("RLOCK.ACQUIRE", HELD_KEY, "the-holder", 600000)
    finally:
        for c in (ctl, *conns):
            c.close()
    return failures, well_formed, last_tokens


def test_random_fenced_calls_get_valid_replies_and_leave_no_trace(make_server):
    server = make_server(args=["--hz", "500"])
    ctl = Raw(server.port)
    try:
        clients = connected_clients(ctl)
        fuzz(server.port, SEED + 1, 1000)  # warm-up, as test_fuzz.py
        fill_module_client_pool(server.port)
        wait_until(lambda: connected_clients(ctl) == clients, what="fuzz clients gone")
        settle_memory(ctl)
        baseline = used_memory(ctl)

        failures, well_formed, last_tokens = fuzz(server.port, SEED, CALLS)
        assert not failures, "\n".join(f"{p}: {c!r} -> {r!r}" for p, c, r in failures)
        assert well_formed > CALLS // 3, "the generator must reach the commands' logic"
        assert len(last_tokens) >= 3, "tokens must be issued on several keys"
        server.assert_alive()
        wait_until(lambda: connected_clients(ctl) == clients, what="fuzz clients gone")
        assert blocked_clients(ctl) == 0
        assert (rlock_stat(ctl, "waiters"), rlock_stat(ctl, "keys_with_waiters")) == (0, 0)
        memory_back(ctl, baseline)
    finally:
        ctl.close()


def test_random_fenced_calls_with_leases_of_a_few_ms_keep_tokens_increasing(make_server):
    server = make_server(args=["--hz", "500"])
    failures, _, last_tokens = fuzz(server.port, SEED, CALLS, short_leases=True)
    assert not failures, "\n".join(f"{p}: {c!r} -> {r!r}" for p, c, r in failures)
    assert last_tokens
