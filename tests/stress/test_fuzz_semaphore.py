"""Protocol fuzz for RSEMAPHORE.* and RPSEMAPHORE.*: random argument lists from a seeded
RNG (the same $RLOCK_FUZZ_SEED / $RLOCK_FUZZ_CALLS as tests/stress/test_fuzz.py, whose argument
generator this reuses), against keys of every kind: counts, permit sets, a lock hash,
strings that are no count, a spoiled permit set, other types.

Every reply must be a known error (exact text from src/vocab/errors.rs, never the internal one)
or a reply of the command's shape; valid WAITs are cut to 1-5 ms. Afterwards the server is
up, nobody waits, no key timer is left once leases ran out, and `used_memory` is back at
its baseline (tests/stress/test_fuzz.py explains the margin).
"""

import errors
from conftest import wait_until
from hostile_helpers import (fill_module_client_pool, memory_back, ERR_INTERNAL_PREFIX, Map, Raw, ReplyError, arity_error,
                             blocked_clients, connected_clients, rlock_stat, settle_memory,
                             used_memory)
from test_fuzz import CALLS, CHUNK, NUMBERS, SEED, Gen, parse_ms

KEYS = [b"fs:a", b"fs:b", b"{fs}c", b"fs:{x", b"fs:lock", b"fs:str", b"fs:list", b"fs:spoiled"]
HEX = [b"00" * 16, b"ab" * 16, b"AB", b"0", b"zz", b"", b"00" * 33]
SEM = {  # command: (min args after the name, max, kind of reply)
    "RSEMAPHORE.TRYSETPERMITS": (2, 6, "int"), "RSEMAPHORE.ADDPERMITS": (2, 4, "int"),
    "RSEMAPHORE.ACQUIRE": (2, 9, "int"), "RSEMAPHORE.RELEASE": (2, 4, "int"),
    "RSEMAPHORE.DRAINPERMITS": (1, 3, "int"), "RSEMAPHORE.AVAILABLEPERMITS": (1, 1, "int"),
    "RSEMAPHORE.INFO": (1, 1, "map"),
    "RPSEMAPHORE.TRYSETPERMITS": (2, 4, "int"), "RPSEMAPHORE.SETPERMITS": (2, 4, "int"),
    "RPSEMAPHORE.ADDPERMITS": (2, 4, "int"), "RPSEMAPHORE.ACQUIRE": (2, 11, "ids"),
    "RPSEMAPHORE.RELEASE": (2, 4, "int"), "RPSEMAPHORE.UPDATELEASETIME": (3, 3, "int"),
    "RPSEMAPHORE.LEASETIME": (2, 2, "int"), "RPSEMAPHORE.AVAILABLEPERMITS": (1, 1, "int"),
    "RPSEMAPHORE.ACQUIREDPERMITS": (1, 1, "int"), "RPSEMAPHORE.INFO": (1, 1, "map"),
}
KNOWN = {row["text"] for row in errors.ROWS}


class SemGen(Gen):
    def key(self):
        return self.pick(KEYS)

    def small(self):
        roll = self.rng.random()
        if roll < 0.6:
            return str(self.rng.choice([0, 1, 2, 3, 5, -1, -3])).encode()
        if roll < 0.7:
            return str(self.rng.choice([2**31 - 1, 2**31, -2**31, 1024, 1025, 2**63])).encode()
        return self.pick(NUMBERS)

    def lease(self):
        # Leases stay short, so every lease timer has fired when the run ends.
        if self.rng.random() < 0.9:
            return self.rng.choice([b"-1", b"-1", b"1", b"20", b"50", b"0", b"-2"])
        return self.pick(NUMBERS[:5] + NUMBERS[6:12] + NUMBERS[-2:])

    def hexid(self):
        return self.rng.choice(self.ids) if self.ids and self.rng.random() < 0.6 else self.pick(HEX)

    def options(self, allowed):
        out = []
        for _ in range(self.rng.choice([0, 0, 1, 1, 2, 3])):
            opt = self.rng.choice(allowed + [b"NOPE", b"id"])
            if opt == b"ASYNC":  # a queued ticket's flag (docs/commands/tickets.md)
                out.append(opt)
            elif opt.upper() == b"WAIT":
                out += [opt, str(self.rng.randint(1, 5)).encode() if self.rng.random() < 0.8 else self.number()]
            elif opt.upper() == b"ID":
                # Request ids name one call per key: a retry of another command with the
                # same id would rightly get that command's reply. One set per command.
                out += [opt, self.rng.choice([b"r1", b"r2", b""]) and self.name + self.rng.choice([b"r1", b"r2"])]
            else:
                out += [opt, self.small()]
        return out

    def call(self):
        name = self.rng.choice(list(SEM))
        self.name = name.encode()
        verb = name.split(".")[1]
        if self.rng.random() < 0.1:
            args = [self.token() for _ in range(self.rng.randrange(0, 8))]
        elif verb in ("AVAILABLEPERMITS", "ACQUIREDPERMITS", "INFO"):
            args = [self.key()]
        elif verb == "DRAINPERMITS":
            args = [self.key()] + self.options([b"ID"])
        elif name == "RPSEMAPHORE.ACQUIRE":
            args = [self.key(), self.lease()] + self.options([b"WAIT", b"ID", b"PERMITS", b"ASYNC"])
        elif name == "RPSEMAPHORE.RELEASE":
            args = [self.key(), self.hexid()] + self.options([b"ID"])
        elif verb == "UPDATELEASETIME":
            args = [self.key(), self.hexid(), self.lease()]
        elif verb == "LEASETIME":
            args = [self.key(), self.hexid()]
        elif name == "RSEMAPHORE.ACQUIRE":
            args = [self.key(), self.small()] + self.options([b"WAIT", b"ID", b"ASYNC"])
        elif name == "RSEMAPHORE.TRYSETPERMITS":
            args = [self.key(), self.small()] + self.options([b"PX", b"ID"])
        else:
            args = [self.key(), self.small()] + self.options([b"ID"])
        # A valid WAIT may block: cap it at a few ms (WAIT 0 would wait forever).
        for i in range(1, len(args) - 1):
            if args[i].upper() == b"WAIT" and parse_ms(args[i + 1], 0) is not None:
                args[i + 1] = str(self.rng.randint(1, 5)).encode()
        return [name, *args]


def check(call, reply):
    name, args = call[0], call[1:]
    lo, hi, kind = SEM[name]
    if isinstance(reply, ReplyError):
        if reply.text.startswith(ERR_INTERNAL_PREFIX):
            return "internal error"
        if not (lo <= len(args) <= hi) and reply.text != arity_error(name):
            return "wrong arity not reported as such"
        if reply.text in KNOWN or reply.text == arity_error(name):
            return None
        return "unknown error text"
    if not (lo <= len(args) <= hi):
        return "wrong arity accepted"
    if reply == b"QUEUED" and b"ASYNC" in args:
        return None  # a queued ticket (docs/commands/tickets.md)
    if kind == "int":
        return None if isinstance(reply, int) else "not an integer"
    if kind == "map":
        return None if isinstance(reply, (list, Map)) else "not a map"
    ok = reply is None or (isinstance(reply, bytes) and len(reply) == 32) or (
        isinstance(reply, list) and all(isinstance(i, bytes) and len(i) == 32 for i in reply))
    return None if ok else "not permit ids"


def prepare(ctl):
    ctl.pipeline([("SET", "fs:str", "many"), ("RPUSH", "fs:list", "a"),
                  ("RLOCK.ACQUIRE", "fs:lock", "holder", 600000),
                  ("ZADD", "{fs:spoiled}:timeout", "1.5", "m")])


def fuzz(port, seed, calls):
    gen = SemGen(seed)
    gen.ids = []
    ctl = Raw(port)
    conns = [Raw(port, timeout=5), Raw(port, timeout=5)]
    failures = []
    try:
        assert isinstance(conns[1].call("HELLO", "3"), Map)
        prepare(ctl)
        for n in range(0, calls, CHUNK):
            batch = [gen.call() for _ in range(min(CHUNK, calls - n))]
            for call, reply in zip(batch, conns[(n // CHUNK) % 2].pipeline(batch)):
                problem = check(call, reply)
                if problem and len(failures) < 20:
                    failures.append((problem, call[:6], reply))
                got = reply if isinstance(reply, list) else [reply]
                gen.ids += [i for i in got if isinstance(i, bytes) and len(i) == 32][:2]
                gen.ids = gen.ids[-20:]
    finally:
        for c in (ctl, *conns):
            c.close()
    return failures


def test_random_semaphore_calls_get_valid_replies_and_leave_no_trace(make_server):
    server = make_server(args=["--hz", "500"])
    ctl = Raw(server.port)
    try:
        clients = connected_clients(ctl)
        fuzz(server.port, SEED + 1, 500)
        fill_module_client_pool(server.port)
        wait_until(lambda: connected_clients(ctl) == clients, what="fuzz clients gone")
        settle_memory(ctl)
        baseline = used_memory(ctl)

        failures = fuzz(server.port, SEED, CALLS)
        assert not failures, "\n".join(f"{p}: {c!r} -> {r!r}" for p, c, r in failures)
        server.assert_alive()
        wait_until(lambda: connected_clients(ctl) == clients, what="fuzz clients gone")
        assert blocked_clients(ctl) == 0
        assert (rlock_stat(ctl, "waiters"), rlock_stat(ctl, "keys_with_waiters")) == (0, 0)
        assert rlock_stat(ctl, "sem_acquisitions") + rlock_stat(ctl, "psem_acquisitions") > 0
        # At most one lease timer per key (a FLUSHALL leaves a timer to fire on nothing).
        assert rlock_stat(ctl, "key_timers") <= len(KEYS)
        memory_back(ctl, baseline)
    finally:
        ctl.close()
