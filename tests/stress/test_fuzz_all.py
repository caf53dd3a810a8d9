"""Cross-primitive fuzz (issue 21): random calls of every module command, asked of the
server itself (`COMMAND LIST FILTERBY MODULE rlock`), interleaved with plain writes
(SET, HSET, ZADD, LPUSH, DEL, PEXPIRE of a few ms, ...) on the same small set of keys.

The per-primitive fuzz files check each command's replies against an oracle of its
argument rules; this one looks for what they cannot see: one primitive's command on a key
another primitive (or a plain command) just wrote, shortened, expired or deleted. That is
where the module meets the server's key API in states no single primitive produces, and
where Redis 8.2 used to crash (`RM_GetAbsExpire` on a key that had just expired).

The oracle is therefore small: every call gets a reply (no dropped connection), no reply
is the module's internal error (a caught panic), the server lives, and afterwards nobody
waits and no client is blocked. A crash fails the test with the server's crash report
(`make_server`). Seeded: $RLOCK_FUZZ_SEED replays a run, $RLOCK_FUZZ_CALLS sets its size
(default 3000 here; `make test-long` runs 30 000).
"""

import os
import random
import time

import pytest

import errors
from conftest import wait_until
from hostile_helpers import Raw, ReplyError, blocked_clients, rlock_stat

SEED = int(os.environ.get("RLOCK_FUZZ_SEED", "20240607"))
CALLS = int(os.environ.get("RLOCK_FUZZ_CALLS", "3000"))

ERR_INTERNAL = errors.INTERNAL

# Few keys, so that commands of different primitives keep meeting on them; a hash tag
# and a lone brace exercise the channel and auxiliary-key naming rules.
KEYS = [b"x", b"y", b"{x}", b"z:{x", b"{x}:timeout", b"{x}:permits"]
OWNERS = [b"o1", b"o2", b"o1:write", b"", b"\x00\xff"]
NUMBERS = [b"0", b"1", b"2", b"5", b"30", b"1000", b"-1", b"9223372036854775807",
           b"9223372036854775808", b"1.5", b"x", b""]
WORDS = [b"WAIT", b"ASYNC", b"ID", b"PERMITS", b"READ", b"WRITE", b"LEASE", b"NX", b"XX"]

# Plain writes on the same keys: other types, TTLs of a few ms, deletes.
PLAIN = [
    lambda g: [b"SET", g.key(), g.pick(NUMBERS)],
    lambda g: [b"SET", g.key(), g.pick(NUMBERS), b"PX", b"%d" % g.rng.randint(1, 5)],
    lambda g: [b"HSET", g.key(), g.pick(OWNERS) or b"f", g.pick(NUMBERS) or b"1"],
    lambda g: [b"HSET", g.key(), b"mode", g.pick([b"read", b"write", b"other"])],
    lambda g: [b"ZADD", g.key(), b"%d" % g.rng.randint(0, 2 ** 45), g.pick(OWNERS) or b"m"],
    lambda g: [b"LPUSH", g.key(), b"v"],
    lambda g: [b"DEL", g.key()],
    lambda g: [b"PEXPIRE", g.key(), b"%d" % g.rng.randint(1, 5)],
    lambda g: [b"PERSIST", g.key()],
    lambda g: [b"RENAME", g.key(), g.key()],
    # Per-field TTLs (Redis 7.4+, Valkey 9): a lock hash whose holder field expires on its
    # own. An unknown command on Redis 7.0, which is fine.
    lambda g: [b"HPEXPIRE", g.key(), b"%d" % g.rng.randint(1, 5), b"FIELDS", b"1",
               g.pick(OWNERS[:3] + [b"mode"])],
]


# Each command's well-formed shape after the key, one letter a slot: o owner, l lease-ms,
# n count, s side, p permit id, t timeout; the optional tails a call may add. Commands
# not listed (new ones, read from the server) get random arguments only.
SHAPES = {
    b"rlock.acquire": ("ol", "wai"), b"rfenced.acquire": ("ol", "wai"),
    b"rlock.release": ("o", "li"), b"rlock.renew": ("ol", ""),
    b"rrwlock.acquire": ("sol", "wai"), b"rrwlock.release": ("so", "i"),
    b"rrwlock.renew": ("sol", ""), b"rrwlock.forcerelease": ("", "s"),
    b"rsemaphore.acquire": ("n", "wai"), b"rsemaphore.release": ("n", "i"),
    b"rsemaphore.trysetpermits": ("n", "xi"), b"rsemaphore.addpermits": ("n", "i"),
    b"rsemaphore.drainpermits": ("", "i"),
    b"rpsemaphore.acquire": ("l", "kwai"), b"rpsemaphore.release": ("p", "i"),
    b"rpsemaphore.updateleasetime": ("pl", ""), b"rpsemaphore.leasetime": ("p", ""),
    b"rpsemaphore.setpermits": ("n", "i"), b"rpsemaphore.trysetpermits": ("n", "i"),
    b"rpsemaphore.addpermits": ("n", "i"),
    b"rlatch.trysetcount": ("n", "i"), b"rlatch.countdown": ("", "i"),
    b"rlatch.delete": ("", "i"), b"rlatch.await": ("", "w"),
    **{name: ("", "") for name in (
        b"rlock.info", b"rlock.forcerelease", b"rfenced.gettoken", b"rrwlock.info",
        b"rsemaphore.info", b"rsemaphore.availablepermits", b"rpsemaphore.info",
        b"rpsemaphore.availablepermits", b"rpsemaphore.acquiredpermits", b"rlatch.info",
        b"rlatch.getcount")},
}


class Gen:
    def __init__(self, seed, commands):
        self.rng = random.Random(seed)
        self.commands = commands
        self.permit_ids = [b"00" * 8, b"ab" * 8]

    def pick(self, items):
        return self.rng.choice(items)

    def key(self):
        return self.pick(KEYS)

    def arg(self):
        roll = self.rng.random()
        if roll < 0.35:
            return self.pick(NUMBERS)
        if roll < 0.6:
            return self.pick(WORDS)
        if roll < 0.85:
            return self.pick(OWNERS)
        return bytes(self.rng.getrandbits(8) for _ in range(self.rng.randint(0, 8)))

    def slot(self, letter):
        r = self.rng.randint
        return {
            "o": lambda: self.pick(OWNERS[:2]),
            "l": lambda: b"%d" % self.pick([r(1, 5), r(1, 5), r(10, 60_000)]),
            "n": lambda: b"%d" % r(0, 3),
            "s": lambda: self.pick([b"READ", b"WRITE"]),
            "p": lambda: self.pick(self.permit_ids),
        }[letter]()

    def tail(self, letters):
        out = []
        for letter in letters:
            if self.rng.random() < 0.4:
                out += {
                    "w": lambda: [b"WAIT", b"%d" % self.rng.randint(1, 5)],
                    "a": lambda: [b"ASYNC"],
                    "i": lambda: [b"ID", b"req:%d" % self.rng.randint(0, 20)],
                    "k": lambda: [b"PERMITS", b"%d" % self.rng.randint(1, 3)],
                    "x": lambda: [b"PX", b"%d" % self.rng.randint(1, 5)],
                    "l": lambda: [self.slot("l")],
                    "s": lambda: [self.slot("s")],
                }[letter]()
        return out

    def waited(self, args):
        """A valid WAIT timeout becomes 1-5 ms, so nothing blocks for long."""
        out = list(args)
        for i, a in enumerate(out[:-1]):
            if a == b"WAIT":
                out[i + 1] = b"%d" % self.rng.randint(1, 5)
        return out

    def call(self):
        if self.rng.random() < 0.2:
            return self.pick(PLAIN)(self)
        name = self.pick(self.commands)
        shape = SHAPES.get(name.lower())
        if shape is not None and self.rng.random() < 0.75:
            fixed, optional = shape
            return [name, self.key(), *(self.slot(c) for c in fixed), *self.tail(optional)]
        args = [self.arg() for _ in range(self.rng.randint(0, 7))]
        return [name, self.key(), *self.waited(args)]

    def saw(self, call, reply):
        """Keeps permit ids the server handed out, so later calls name real ones."""
        if call[0].lower() == b"rpsemaphore.acquire":
            ids = reply if isinstance(reply, list) else [reply]
            self.permit_ids += [i for i in ids if isinstance(i, bytes) and i != b"QUEUED"]
            del self.permit_ids[:-16]


def module_commands(ctl):
    names = ctl.call("COMMAND", "LIST", "FILTERBY", "MODULE", "rlock")
    # Internal commands are refused from clients by design; they are fuzzed all the same.
    return sorted(n for n in names if b"." in n)


def fuzz(port, seed, calls, commands):
    """Sends `calls` random calls over a few connections (so a blocked WAIT holds only its
    own); returns the failures as (why, call, reply) and how many calls got a reply that
    is no error."""
    g = Gen(seed, commands)
    conns = [Raw(port) for _ in range(4)]
    failures = []
    well_formed = 0
    try:
        for _ in range(calls):
            conn = g.pick(conns)
            call = g.call()
            try:
                reply = conn.call(*call)
            except (ConnectionError, OSError, TimeoutError) as e:
                failures.append(("no reply", call, e))
                break
            if isinstance(reply, ReplyError):
                if str(reply) == ERR_INTERNAL:
                    failures.append(("internal error", call, reply))
            else:
                well_formed += 1
                g.saw(call, reply)
    finally:
        for c in conns:
            c.close()
    return failures, well_formed


def test_every_command_with_plain_writes_on_the_same_keys_never_crashes(make_server):
    server = make_server(args=["--hz", "500"])
    ctl = Raw(server.port)
    try:
        commands = module_commands(ctl)
        assert len(commands) >= 30, f"every primitive's commands: {commands}"
        failures, well_formed = fuzz(server.port, SEED, CALLS, commands)
        assert not failures, "\n".join(f"{why}: {c!r} -> {r!r}" for why, c, r in failures)
        assert well_formed > CALLS // 3, "the generator must reach the commands' logic"
        server.assert_alive()
        assert ctl.call("PING") == b"PONG"
        wait_until(lambda: blocked_clients(ctl) == 0, what="no client blocked")
        wait_until(lambda: rlock_stat(ctl, "waiters") == 0, what="no waiter left")
        assert rlock_stat(ctl, "keys_with_waiters") == 0
    finally:
        ctl.close()


def settled_state(c, now):
    """Every key's DUMP and absolute expiry, but for keys that may expire around `now`
    (the fuzz's SET PX of a few ms): a replica hides a key once its time has passed."""
    out = {}
    for k in c.keys("*"):
        dump, at = c.dump(k), c.execute_command("PEXPIRETIME", k)
        if dump is not None and (at == -1 or at > now + 5000):
            out[k] = (dump, at)
    return out


@pytest.mark.parametrize("mode", ["commands", "effects"])
def test_the_same_calls_on_a_replica_and_its_aof_restart_never_crash(make_server, mode):
    """Replays the fuzz's writes on a replica (with the module) and through an AOF reload,
    in both replication modes; the replica then holds exactly the primary's keys."""
    primary = make_server("p", args=["--hz", "500", "--appendonly", "yes"],
                          module_args=["replication", mode])
    replica = make_server("r", args=["--replicaof", "127.0.0.1", str(primary.port)])
    ctl = Raw(primary.port)
    try:
        wait_until(lambda: replica.client().info("replication").get("master_link_status") == "up",
                   timeout=10, what="replica linked")
        failures, _ = fuzz(primary.port, SEED + 7, max(CALLS // 3, 500), module_commands(ctl))
        assert not failures, "\n".join(f"{why}: {c!r} -> {r!r}" for why, c, r in failures)
        offset = primary.client().info("replication")["master_repl_offset"]
        wait_until(lambda: replica.client().info("replication").get("slave_repl_offset", 0) >= offset,
                   timeout=10, what="replica caught up")
        primary.assert_alive()
        replica.assert_alive()
        # Writes paused (timers wait, expiry stops), the replica caught up: same keys.
        p, r = primary.client(), replica.client()
        wait_until(lambda: rlock_stat(ctl, "waiters") == 0, timeout=10, what="waiters gone")
        p.execute_command("CLIENT", "PAUSE", 10000, "WRITE")
        try:
            offset = p.info("replication")["master_repl_offset"]
            wait_until(lambda: r.info("replication").get("slave_repl_offset", 0) >= offset,
                       timeout=10, what="replica caught up after the pause")
            now = int(time.time() * 1000)
            assert settled_state(r, now) == settled_state(p, now), "the replica diverged"
        finally:
            p.execute_command("CLIENT", "UNPAUSE")
    finally:
        ctl.close()
    primary.restart()
    primary.assert_alive()
    assert primary.client().ping()
