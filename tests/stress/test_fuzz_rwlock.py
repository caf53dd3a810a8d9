"""Protocol fuzz of the read-write lock (RRWLOCK.*), as tests/stress/test_fuzz.py does for RLOCK.*:
seeded random argument lists on RESP2 and RESP3 connections, every reply checked against
an oracle of the argument rules (the side word first, then RLOCK's rules for the rest,
then the owner's `:write` suffix), keys of other types and a plain RLOCK lock answered
with their named errors. Afterwards nobody waits and `used_memory` is at its baseline.

$RLOCK_FUZZ_CALLS sets the number of calls (shared with test_fuzz.py; 1500 here by default,
so `make test` stays fast); $RLOCK_FUZZ_SEED the seed.
"""

import os

import errors
from conftest import wait_until
from hostile_helpers import (fill_module_client_pool, memory_back, ERR_INTERNAL_PREFIX, ERR_WRONGTYPE, MAX_MS, Map, Raw, ReplyError,
                             arity_error, blocked_clients, connected_clients, rlock_stat, settle_memory,
                             used_memory)
from test_fuzz import CHUNK, NOT_A_LOCK_KEY, WRONG_TYPE_KEYS, Gen, expected_error, show

SEED = int(os.environ.get("RLOCK_FUZZ_SEED", "20240607"))
CALLS = int(os.environ.get("RLOCK_FUZZ_CALLS", "1500"))

ERR_RW_SIDE = errors.RW_SIDE
ERR_RW_OWNER_SUFFIX = errors.RW_OWNER_SUFFIX
ERR_NOT_A_RWLOCK = errors.NOT_A_RWLOCK
# Well-formed acquires may be refused by the lock's own rules.
ACQUIRE_REFUSALS = {errors.RW_READ_HELD, errors.RW_TOO_MANY_HOLDS}
HELD_KEY = b"fz:held"
PLAIN_LOCK_KEY = b"fz:plain"
KEYS = [b"fz:a", b"fz:b", b"{fz}c", b"fz:{x", HELD_KEY, PLAIN_LOCK_KEY, NOT_A_LOCK_KEY,
        *WRONG_TYPE_KEYS]
SIDES = [b"READ", b"WRITE", b"read", b"Write", b"READS", b"", b"W"]
OWNERS_RW = [b"o1", b"o2", b"o1:write", b"\x00", b"3f2504e0-4f89-11d3-9a0c-0305e82c3301:1"]
RLOCK_NAME = {"RRWLOCK.ACQUIRE": "RLOCK.ACQUIRE", "RRWLOCK.RELEASE": "RLOCK.RELEASE",
              "RRWLOCK.RENEW": "RLOCK.RENEW"}
COMMANDS = ["RRWLOCK.ACQUIRE", "RRWLOCK.RELEASE", "RRWLOCK.RENEW", "RRWLOCK.FORCERELEASE",
            "RRWLOCK.INFO"]


class RwGen(Gen):
    def key(self):
        return self.pick(KEYS)

    def side(self):
        return self.rng.choice(SIDES[:4]) if self.rng.random() < 0.85 else self.pick(SIDES)

    def owner(self):
        return self.pick(OWNERS_RW) if self.rng.random() < 0.7 else super().owner()

    def call(self):
        # An RLOCK call from the base generator, with a side word after the key.
        base = super().call()
        name = {"RLOCK.ACQUIRE": "RRWLOCK.ACQUIRE", "RLOCK.RELEASE": "RRWLOCK.RELEASE",
                "RLOCK.RENEW": "RRWLOCK.RENEW", "RLOCK.FORCERELEASE": "RRWLOCK.FORCERELEASE",
                "RLOCK.INFO": "RRWLOCK.INFO"}[base[0]]
        args = base[1:]
        if name == "RRWLOCK.INFO":
            return [name, *args]
        if name == "RRWLOCK.FORCERELEASE":
            if args and self.rng.random() < 0.6:
                args = args[:1] + [self.side()] + args[1:]
            return [name, *args]
        if args and self.rng.random() < 0.97:
            args = args[:1] + [self.side()] + args[1:]
        return [name, *args]


def rw_expected_error(call):
    name, args = call[0], call[1:]
    arity = {"RRWLOCK.ACQUIRE": (4, None), "RRWLOCK.RELEASE": (3, 6), "RRWLOCK.RENEW": (4, 4),
             "RRWLOCK.FORCERELEASE": (1, 2), "RRWLOCK.INFO": (1, 1)}[name]
    if len(args) < arity[0] or (arity[1] is not None and len(args) > arity[1]):
        return arity_error(name)
    if name == "RRWLOCK.INFO":
        return None
    if name == "RRWLOCK.FORCERELEASE":
        if len(args) == 2 and args[1].upper() not in (b"READ", b"WRITE"):
            return ERR_RW_SIDE
        return None
    if args[1].upper() not in (b"READ", b"WRITE"):
        return ERR_RW_SIDE
    plain = [RLOCK_NAME[name], args[0], *args[2:]]
    err = expected_error(plain)
    if err is not None:
        return err
    if args[2].endswith(b":write"):
        return ERR_RW_OWNER_SUFFIX
    return None


def shape_ok(name, reply):
    if name == "RRWLOCK.ACQUIRE":
        # QUEUED: a queued ticket (ASYNC, docs/commands/tickets.md; the lock generator adds it).
        return reply is None or reply == b"QUEUED" or (type(reply) is int and (reply in (-2, -1) or 0 <= reply <= MAX_MS))
    if name == "RRWLOCK.RELEASE":
        return reply in (None, 0, 1) and type(reply) in (type(None), int)
    if name in ("RRWLOCK.RENEW", "RRWLOCK.FORCERELEASE"):
        return type(reply) is int and reply in (0, 1)
    if reply is None:
        return True
    keys = [k for k, _ in reply] if isinstance(reply, Map) else reply[0::2]
    return keys == [b"mode", b"pttl", b"readers", b"waiters", b"writer"]


def check(call, reply):
    if isinstance(reply, ReplyError) and reply.text.startswith(ERR_INTERNAL_PREFIX):
        return "internal error"
    want = rw_expected_error(call)
    if want is None:
        key = call[1]
        if key in WRONG_TYPE_KEYS:
            want = ERR_WRONGTYPE
        elif key in (NOT_A_LOCK_KEY, PLAIN_LOCK_KEY):
            want = ERR_NOT_A_RWLOCK
    if want is not None:
        return None if reply == ReplyError(want) else f"expected error {want!r}"
    if isinstance(reply, ReplyError):
        ok = call[0] == "RRWLOCK.ACQUIRE" and reply.text in ACQUIRE_REFUSALS
        return None if ok else "unexpected error"
    return None if shape_ok(call[0], reply) else "malformed reply"


def prepare(ctl):
    assert ctl.pipeline([("SET", "fz:str", "v"), ("RPUSH", "fz:list", "a"),
                         ("ZADD", "fz:zset", 1, "m"), ("HSET", NOT_A_LOCK_KEY, "o1", "x"),
                         ("RLOCK.ACQUIRE", PLAIN_LOCK_KEY, "p", 600000),
                         ("RRWLOCK.ACQUIRE", HELD_KEY, "WRITE", "the-holder", 600000)]) == [
        b"OK", 1, 1, 1, None, None]


def fuzz(port, seed, calls, short_leases=False):
    gen = RwGen(seed, short_leases)
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
                well_formed += rw_expected_error(call) is None
                problem = check(call, reply)
                if problem and len(failures) < 20:
                    failures.append((problem, show(call), reply))
            ctl.call("RRWLOCK.ACQUIRE", HELD_KEY, "WRITE", "the-holder", 600000)
            ctl.call("RLOCK.ACQUIRE", PLAIN_LOCK_KEY, "p", 600000)
    finally:
        for c in (ctl, *conns):
            c.close()
    return failures, well_formed


def test_random_rw_calls_get_valid_replies_and_leave_no_trace(make_server):
    server = make_server(args=["--hz", "500"])
    ctl = Raw(server.port)
    try:
        clients = connected_clients(ctl)
        fuzz(server.port, SEED + 1, 500)
        fill_module_client_pool(server.port)
        wait_until(lambda: connected_clients(ctl) == clients, what="fuzz clients gone")
        settle_memory(ctl)
        baseline = used_memory(ctl)

        failures, well_formed = fuzz(server.port, SEED, CALLS)
        assert not failures, "\n".join(f"{p}: {c!r} -> {r!r}" for p, c, r in failures)
        assert well_formed > CALLS // 4, "the generator must reach the commands' logic"
        assert ctl.call("PING") == b"PONG"
        wait_until(lambda: connected_clients(ctl) == clients, what="fuzz clients gone")
        assert blocked_clients(ctl) == 0
        assert (rlock_stat(ctl, "waiters"), rlock_stat(ctl, "keys_with_waiters")) == (0, 0)
        assert rlock_stat(ctl, "wait_timeouts") > 0, "some WAITs must have blocked"
        memory_back(ctl, baseline)
    finally:
        ctl.close()


def test_random_rw_calls_with_leases_of_a_few_ms_get_a_reply_each(make_server):
    server = make_server(args=["--hz", "500"])
    failures, _ = fuzz(server.port, SEED, CALLS, short_leases=True)
    assert not failures, "\n".join(f"{p}: {c!r} -> {r!r}" for p, c, r in failures)
    ctl = Raw(server.port)
    try:
        wait_until(lambda: rlock_stat(ctl, "waiters") == 0, what="every waiter answered")
    finally:
        ctl.close()


