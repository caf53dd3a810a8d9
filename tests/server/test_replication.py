"""Issue 24, part 1 (design.md 1.4): both modes of `rlock.replication`, with a real replica
that has the module and a real AOF restart, for every primitive.

- `commands` (the default): each module command reaches replicas and the AOF as one
  command (the plain command when it writes one thing, else one internal RLOCK.APPLY);
- `effects`: as the plain commands it amounts to.

After every kind of change (acquire, re-entry, release, a handoff to a blocked waiter and
to a queued ticket, the lease-end timer, the expirable permit's reclaim, the latch
opening, request-id records) the replica holds exactly the primary's keys: the same
serialized values (DUMP) and the same absolute expiries (PEXPIRETIME). An AOF restart
brings the same keys back; a replica promoted mid-run serves the next command.
"""

import concurrent.futures
import contextlib

import pytest
import redis

from cluster_helpers import (aof_commands, aof_files, info_field, read_resp_commands,
                             rlock_waiters, snapshot, wait_link_up, wait_online,
                             wait_replicated)
from conftest import MODULE, server_has_post_notification_jobs, wait_until

LEASE = 60000
PRIMARY_ARGS = ["--appendonly", "yes", "--appendfsync", "always", "--hz", "100",
                "--repl-diskless-sync-delay", "0", "--shutdown-on-sigterm", "now"]


def everything(c):
    """Every key's serialized value and absolute expiry."""
    return {k: snapshot(c, k) for k in sorted(c.keys("*"))}


def agree(p, r):
    wait_replicated(p, r)
    mine, theirs = everything(p), everything(r)
    assert theirs == mine, "the replica differs from the primary"
    return mine


@pytest.fixture(params=["commands", "effects"])
def trio(request, make_server):
    """A primary with an AOF in the mode asked for, and a replica with the module."""
    mode = request.param
    primary = make_server("primary", args=PRIMARY_ARGS, module_args=["replication", mode])
    replica = make_server("replica", args=["--replicaof", "127.0.0.1", str(primary.port)])
    p, r = primary.client(), replica.client()
    assert p.config_get("rlock.replication") == {"rlock.replication": mode}
    wait_link_up(r)
    wait_online(p)
    wait_replicated(p, r)
    return mode, primary, replica, p, r


@contextlib.contextmanager
def background():
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        yield pool


def blocked(pool, server, *cmd):
    """Sends a waiting command on its own connection; its reply is the future's result."""
    c = server.client()
    return pool.submit(c.execute_command, *cmd)


def queued(probe, key, before):
    wait_until(lambda: rlock_waiters(probe, key) > before, 5, what=f"a waiter on {key}")


def sem_waiters(c, cmd, key):
    info = c.execute_command(cmd, key)
    return dict(zip(info[::2], info[1::2]))[b"waiters"] if info else 0


def test_every_kind_of_change_leaves_the_replica_identical(trio):
    mode, primary, replica, p, r = trio
    # --- the lock: acquire, re-entry, partial release, request-id record
    assert p.execute_command("RLOCK.ACQUIRE", "lk", "a", LEASE) is None
    agree(p, r)
    assert p.execute_command("RLOCK.ACQUIRE", "lk", "a", LEASE + 1000, "ID", "q1") is None
    agree(p, r)
    assert p.execute_command("RLOCK.RELEASE", "lk", "a", LEASE + 2000) == 0
    agree(p, r)
    with background() as pool:
        # a handoff to a blocked waiter
        w = blocked(pool, primary, "RLOCK.ACQUIRE", "lk", "b", LEASE, "WAIT", 10000)
        queued(p, "lk", 0)
        assert p.execute_command("RLOCK.RELEASE", "lk", "a") == 1
        assert w.result(10) is None
        assert agree(p, r)[b"lk"][0] is not None
        assert r.hgetall("lk") == {b"b": b"1"}
        # a handoff to a queued ticket (its connection stays open)
        ticket = primary.client()
        assert ticket.execute_command("RLOCK.ACQUIRE", "lk", "c", LEASE, "WAIT", 10000,
                                      "ASYNC", "ID", "t1") == b"QUEUED"
        assert p.execute_command("RLOCK.RELEASE", "lk", "b") == 1
        wait_until(lambda: p.hgetall("lk") == {b"c": b"1"}, 5, what="the ticket's grant")
        agree(p, r)
        # collected (docs/commands/tickets.md): from now on the grant outlives the connection
        assert ticket.execute_command("RLOCK.ACQUIRE", "lk", "c", LEASE, "ID", "t1") is None
        # the lease-end timer hands the lock to the next waiter
        w = blocked(pool, primary, "RLOCK.ACQUIRE", "lk", "d", LEASE, "WAIT", 10000)
        queued(p, "lk", 0)
        assert p.execute_command("RLOCK.RENEW", "lk", "c", 150) == 1
        assert w.result(10) is None
        agree(p, r)
        assert r.hgetall("lk") == {b"d": b"1"}
        # --- read-write lock: a reader, then a writer handed the lock by the release
        assert p.execute_command("RRWLOCK.ACQUIRE", "rw", "READ", "r1", LEASE) is None
        agree(p, r)
        w = blocked(pool, primary, "RRWLOCK.ACQUIRE", "rw", "WRITE", "w1", LEASE, "WAIT", 10000)
        wait_until(lambda: sem_waiters(p, "RRWLOCK.INFO", "rw") > 0, 5, what="writer queued")
        assert p.execute_command("RRWLOCK.RELEASE", "rw", "READ", "r1") == 1
        assert w.result(10) is None
        agree(p, r)
        # --- fenced lock: a token, re-entry, release
        pttl, token = p.execute_command("RFENCED.ACQUIRE", "fl", "o", LEASE)
        assert pttl is None and token > 0
        pttl, again = p.execute_command("RFENCED.ACQUIRE", "fl", "o", LEASE)
        assert pttl is None and again > token
        agree(p, r)
        p.execute_command("RLOCK.RELEASE", "fl", "o")
        p.execute_command("RLOCK.RELEASE", "fl", "o")
        agree(p, r)
        # --- semaphore: set, acquire, a waiter handed the released permit
        assert p.execute_command("RSEMAPHORE.TRYSETPERMITS", "sem", 1) == 1
        assert p.execute_command("RSEMAPHORE.ACQUIRE", "sem", 1) == 1
        agree(p, r)
        w = blocked(pool, primary, "RSEMAPHORE.ACQUIRE", "sem", 1, "WAIT", 10000)
        wait_until(lambda: sem_waiters(p, "RSEMAPHORE.INFO", "sem") > 0, 5, what="sem waiter")
        p.execute_command("RSEMAPHORE.RELEASE", "sem", 1)
        assert w.result(10) == 1
        agree(p, r)
        # --- expirable semaphore: a short lease reclaimed by the timer for a waiter
        assert p.execute_command("RPSEMAPHORE.TRYSETPERMITS", "pes", 1) == 1
        assert p.execute_command("RPSEMAPHORE.ACQUIRE", "pes", 150) is not None
        agree(p, r)
        w = blocked(pool, primary, "RPSEMAPHORE.ACQUIRE", "pes", LEASE, "WAIT", 10000)
        assert w.result(10) is not None
        agree(p, r)
        # --- latch: an awaiter, two count-downs, the opening
        assert p.execute_command("RLATCH.TRYSETCOUNT", "latch", 2) == 1
        w = blocked(pool, primary, "RLATCH.AWAIT", "latch", "WAIT", 10000)
        wait_until(lambda: sem_waiters(p, "RLATCH.INFO", "latch") > 0, 5, what="awaiter")
        p.execute_command("RLATCH.COUNTDOWN", "latch", "ID", "cd1")
        agree(p, r)
        p.execute_command("RLATCH.COUNTDOWN", "latch")
        assert w.result(10) == 1  # opened, not timed out
        agree(p, r)
    # --- an AOF restart brings back the same keys
    before = agree(p, r)
    assert b"lk" in before and b"pes" in before
    primary.restart()
    p = primary.client()
    assert everything(p) == before
    # --- the replica, promoted, serves the next commands
    wait_link_up(r)
    wait_replicated(p, r)
    assert r.execute_command("REPLICAOF", "NO", "ONE")
    wait_until(lambda: info_field(r, "replication", "role") == "master", 5, what="promoted")
    assert isinstance(r.execute_command("RLOCK.ACQUIRE", "lk", "x", LEASE), int)  # d holds it
    assert r.execute_command("RLOCK.ACQUIRE", "lk", "d", LEASE) is None  # re-entry
    assert r.hgetall("lk") == {b"d": b"2"}
    assert r.execute_command("RSEMAPHORE.ACQUIRE", "sem", 1) == 0  # the waiter holds it
    assert r.execute_command("RLATCH.GETCOUNT", "latch") == 0


# The changing calls of one run, in order, each answered as written. `commands` mode must
# replicate each as exactly one command; `effects` as several for some.
CALLS = [
    ("RLOCK.ACQUIRE", "k", "a", LEASE),                  # RLOCK.ACQUIREAT (HSET + PEXPIREAT)
    ("RLOCK.ACQUIRE", "k", "a", LEASE),                  # RLOCK.ACQUIREAT (HINCRBY + ...)
    ("RLOCK.RENEW", "k", "a", LEASE),                    # PEXPIREAT alone
    ("RLOCK.RELEASE", "k", "a", LEASE),                  # HINCRBY + PEXPIREAT
    ("RLOCK.RELEASE", "k", "a"),                         # DEL + PUBLISH
    ("RLOCK.ACQUIRE", "k", "b", LEASE, "ID", "req"),     # + the request record
    ("RRWLOCK.ACQUIRE", "rw", "READ", "o", LEASE),       # RRWLOCK.ACQUIREAT (several keys)
    ("RSEMAPHORE.TRYSETPERMITS", "s", 3),
    ("RSEMAPHORE.ACQUIRE", "s", 2),
    ("RPSEMAPHORE.TRYSETPERMITS", "e", 2),
    ("RPSEMAPHORE.ACQUIRE", "e", LEASE, "PERMITS", 2),
    ("RFENCED.ACQUIRE", "f", "o", LEASE),                # RFENCED.ACQUIREAT (+ the token)
    ("RLATCH.TRYSETCOUNT", "l", 1),
    ("RLATCH.COUNTDOWN", "l"),
    ("RLATCH.TRYSETCOUNT", "l2", 2),
    ("RLATCH.COUNTDOWN", "l2"),                          # DECR alone: as itself
]


def module_entries(server):
    return [c for c in aof_commands(server) if c[0].upper() != b"SELECT"]


def test_commands_replicated_as_themselves_agree_from_multi_scripts_and_aof(trio):
    """A command replicated as itself (its writes follow from its arguments and the key's
    state alone) runs again on the replica and at an AOF reload: called plainly, inside
    MULTI/EXEC, from a script, with a request id (its record is written with the clock:
    not as itself) and where waiters are served (a grant: not as itself), the replica
    and a restart hold exactly the primary's keys."""
    mode, primary, replica, p, r = trio
    p.execute_command("RSEMAPHORE.TRYSETPERMITS", "s", 10)
    p.execute_command("RLATCH.TRYSETCOUNT", "l", 10)
    assert p.execute_command("RSEMAPHORE.ACQUIRE", "s", 2) == 1
    assert p.execute_command("RLATCH.COUNTDOWN", "l") == 9
    tx = p.pipeline(transaction=True)
    tx.execute_command("RSEMAPHORE.ACQUIRE", "s", 1)
    tx.execute_command("RLATCH.COUNTDOWN", "l")
    tx.execute_command("RSEMAPHORE.ACQUIRE", "s", 1)
    assert tx.execute() == [1, 8, 1]
    assert p.eval("return redis.call('RSEMAPHORE.ACQUIRE', KEYS[1], 1)", 1, "s") == 1
    assert p.eval("return redis.call('RLATCH.COUNTDOWN', KEYS[1])", 1, "l") == 7
    assert p.execute_command("RSEMAPHORE.ACQUIRE", "s", 1, "ID", "once") == 1
    assert p.execute_command("RSEMAPHORE.ACQUIRE", "s", 1, "ID", "once") == 1  # replayed
    agree(p, r)
    assert r.get("s") == b"4" and r.get("l") == b"7"
    # A waiter served by a release, then an acquire as itself again.
    with background() as pool:
        got = blocked(pool, primary, "RSEMAPHORE.ACQUIRE", "s", 6, "WAIT", 10000)
        wait_until(lambda: sem_waiters(p, "RSEMAPHORE.INFO", "s") == 1, 5, what="a waiter")
        p.execute_command("RSEMAPHORE.RELEASE", "s", 2)
        assert got.result(timeout=10) == 1
    p.execute_command("RSEMAPHORE.RELEASE", "s", 1)
    assert p.execute_command("RSEMAPHORE.ACQUIRE", "s", 1) == 1
    before = agree(p, r)
    assert r.get("s") == b"0"
    primary.restart()
    assert everything(primary.client()) == before


def test_commands_mode_writes_one_aof_entry_per_module_command(make_server):
    s = make_server(args=PRIMARY_ARGS)
    c = s.client()
    assert c.config_get("rlock.replication") == {"rlock.replication": "commands"}
    for call in CALLS:
        c.execute_command(*call)
    entries = module_entries(s)
    names = [e[0].upper() for e in entries]
    assert b"MULTI" not in names and b"EXEC" not in names, names
    assert len(entries) == len(CALLS), names
    assert names.count(b"RLOCK.APPLY") >= 6, names
    assert names[2] == b"PEXPIREAT", "a command that writes one thing replicates that thing"
    # A new lock and a re-entry are the command itself, its lease's end made absolute;
    # with a request id, whose record follows, the writes go as RLOCK.APPLY. So are the
    # read-write lock's and the fenced lock's acquires (the RW lock's with the clock).
    assert names[:2] == [b"RLOCK.ACQUIREAT"] * 2, names
    assert names[5] == b"RLOCK.APPLY", names
    assert names[6] == b"RRWLOCK.ACQUIREAT" and names[11] == b"RFENCED.ACQUIREAT", names
    # A command whose writes follow from its arguments and the key's state alone (no
    # clock, no grant, no message) replicates as itself (design.md 1.4's first form).
    at = {call: entry for call, entry in zip(CALLS, entries)}
    for call in [("RSEMAPHORE.ACQUIRE", "s", 2), ("RLATCH.COUNTDOWN", "l2")]:
        assert at[call] == [str(w).encode() for w in call], at[call]
    # Setting permits or a count, and a latch's last count-down, publish Redisson's
    # message as well: RLOCK.APPLY.
    for call in [("RSEMAPHORE.TRYSETPERMITS", "s", 3), ("RLATCH.COUNTDOWN", "l")]:
        assert at[call][0].upper() == b"RLOCK.APPLY", at[call]
    # And the AOF reloads to the same keys.
    before = everything(c)
    s.restart()
    assert everything(s.client()) == before


def test_effects_mode_writes_plain_commands_only(make_server):
    s = make_server(args=PRIMARY_ARGS, module_args=["replication", "effects"])
    c = s.client()
    for call in CALLS:
        c.execute_command(*call)
    names = {e[0].upper() for e in module_entries(s)}
    assert not [n for n in names if n.startswith(b"R")], names
    assert len(module_entries(s)) > len(CALLS)
    before = everything(c)
    s.restart()
    assert everything(s.client()) == before


def test_the_mode_can_change_at_run_time(make_server):
    s = make_server(args=PRIMARY_ARGS)
    c = s.client()
    c.execute_command("RLOCK.ACQUIRE", "k1", "a", LEASE)
    assert c.config_set("rlock.replication", "effects")
    c.execute_command("RLOCK.ACQUIRE", "k2", "a", LEASE)
    assert c.config_set("rlock.replication", "commands")
    c.execute_command("RLOCK.ACQUIRE", "k3", "a", LEASE)
    names = [e[0].upper() for e in module_entries(s)]
    # effects: two plain commands, which the server wraps in MULTI/EXEC
    assert names == [b"RLOCK.ACQUIREAT", b"MULTI", b"HSET", b"PEXPIREAT", b"EXEC",
                     b"RLOCK.ACQUIREAT"], names
    with pytest.raises(redis.ResponseError):
        c.config_set("rlock.replication", "both")
    assert c.config_get("rlock.replication") == {"rlock.replication": "commands"}


INTERNAL = {"RLOCK.APPLY": ["*2\r\n$3\r\nDEL\r\n$6\r\nvictim\r\n"],
            "RLOCK.ACQUIREAT": ["*3\r\n$6\r\nvictim\r\n$1\r\no\r\n$1\r\n1\r\n"],
            "RFENCED.ACQUIREAT": ["*4\r\n$6\r\nvictim\r\n$1\r\no\r\n$1\r\n1\r\n$1\r\n1\r\n"],
            "RRWLOCK.ACQUIREAT": ["*5\r\n$6\r\nvictim\r\n$5\r\nWRITE\r\n$1\r\no\r\n"
                                  "$1\r\n1\r\n$1\r\n1\r\n"]}


@pytest.mark.parametrize("how", ["client", "multi", "script"])
@pytest.mark.parametrize("command", sorted(INTERNAL))
def test_the_internal_commands_are_refused_from_ordinary_clients(server, command, how):
    c = server.client()
    c.set("victim", "v")
    c.execute_command("RLOCK.ACQUIRE", "lock", "a", LEASE)
    words = [command, *INTERNAL[command]]
    for args in (words, [command, "lock", "a", 1], [command, words_of("lock", "b", 1)]):
        with pytest.raises(redis.ResponseError, match=f"{command} is internal"):
            if how == "client":
                c.execute_command(*args)
            elif how == "multi":
                pipe = c.pipeline(transaction=True)
                pipe.execute_command(*args)
                pipe.execute()
            else:
                c.eval("return redis.call(unpack(ARGV))", 1, "victim", *args)
    assert c.get("victim") == b"v"
    assert c.hgetall("lock") == {b"a": b"1"} and c.pttl("lock") > LEASE - 60000


def words_of(*words):
    """One RESP array of `words`: the argument of RLOCK.ACQUIREAT."""
    out = f"*{len(words)}\r\n".encode()
    for w in words:
        w = str(w).encode()
        out += b"$%d\r\n%s\r\n" % (len(w), w)
    return out


def test_a_new_lock_and_a_re_entry_replicate_as_themselves_with_the_lease_end(trio):
    """design.md 1.4's first form for the lock's hot path: RLOCK.ACQUIRE of a free lock, or by
    its holder, reaches the replica and the AOF as RLOCK.ACQUIREAT with the absolute end
    the primary computed. Called plainly, in MULTI/EXEC and from a script, the replica
    and a restart hold the same hash and the same PEXPIRETIME; with a request id or a
    queue served first, the writes go as RLOCK.APPLY and agree as well."""
    mode, primary, replica, p, r = trio
    r.config_set("appendonly", "yes")  # what the replica passes on, in its own AOF
    wait_until(lambda: not any(r.info("persistence")[f] for f in
                               ("aof_rewrite_in_progress", "aof_rewrite_scheduled")),
               10, what="the replica's AOF written")
    p.execute_command("RLOCK.ACQUIRE", "a", "o", LEASE)
    p.execute_command("RLOCK.ACQUIRE", "a", "o", LEASE + 5000)
    tx = p.pipeline(transaction=True)
    tx.execute_command("RLOCK.ACQUIRE", "b", "o", LEASE)
    tx.execute_command("RLOCK.ACQUIRE", "b", "o", LEASE)
    tx.execute_command("RLOCK.ACQUIRE", "a", "o", LEASE)
    tx.execute()
    p.eval("return redis.call('RLOCK.ACQUIRE', KEYS[1], 'o', ARGV[1])", 1, "c", LEASE)
    p.execute_command("RLOCK.ACQUIRE", "d", "o", LEASE, "ID", "req-1")
    assert p.execute_command("RLOCK.ACQUIRE", "a", "other", LEASE) > 0  # held: no write
    before = agree(p, r)
    assert r.hgetall("a") == {b"o": b"3"} and r.hgetall("b") == {b"o": b"2"}
    entries = [e for e in module_entries(primary) if e[0].upper() not in
               (b"MULTI", b"EXEC")]
    if mode == "commands":
        at = [read_resp_commands(e[1])[0] for e in entries
              if e[0].upper() == b"RLOCK.ACQUIREAT"]
        assert [e[:2] for e in at] == [[k, b"o"] for k in b"a a b b a c".split()], entries
        assert int(at[-2][2]) == p.pexpiretime("a") and int(at[-1][2]) == p.pexpiretime("c")
        assert entries[-1][0].upper() == b"RLOCK.APPLY", "the request record follows"
        # The replica's own AOF has them as they came.
        names = [e[0].upper() for e in module_entries(replica)]
        assert names.count(b"RLOCK.ACQUIREAT") == 6, names
    else:
        assert not [e for e in entries if e[0].upper().startswith(b"RLOCK")], entries
    primary.restart()
    assert everything(primary.client()) == before


def test_rw_and_fenced_acquires_replicate_as_themselves_made_deterministic(trio):
    """design.md 1.4's first form for the read-write and the fenced lock: an acquire that takes
    or re-enters a hold reaches the replica and the AOF as RRWLOCK.ACQUIREAT, with the
    primary's clock (it decides the lease ends and which read holds had ended), or as
    RFENCED.ACQUIREAT, with the lease's absolute end (the token follows from the last).
    Called plainly, in MULTI/EXEC, from a script, and dropping a reader whose lease ended,
    the replica, its own AOF and a restart hold the same hash, timeout keys, token and
    PEXPIRETIMEs; with a request id the writes go as RLOCK.APPLY and agree as well."""
    mode, primary, replica, p, r = trio
    r.config_set("appendonly", "yes")  # what the replica passes on, in its own AOF
    wait_until(lambda: not any(r.info("persistence")[f] for f in
                               ("aof_rewrite_in_progress", "aof_rewrite_scheduled")),
               10, what="the replica's AOF written")
    rw = "RRWLOCK.ACQUIRE"
    assert p.execute_command(rw, "rw", "READ", "r1", LEASE) is None
    assert p.execute_command(rw, "rw", "READ", "r2", LEASE + 1000) is None  # joins
    assert p.execute_command(rw, "rw", "READ", "r1", LEASE + 2000) is None  # re-entry
    assert p.execute_command(rw, "rw", "READ", "short", 50) is None
    # Once the short hold's lease is over, the next acquire drops it (HDEL, a new expiry).
    wait_until(lambda: not [k for k in p.keys("{rw}:short:*")], 5, what="the lease's end")
    assert p.execute_command(rw, "rw", "READ", "r2", LEASE) is None
    assert set(p.hgetall("rw")) == {b"mode", b"r1", b"r2"}
    agree(p, r)
    for owner, times in (("r1", 2), ("r2", 2)):
        for _ in range(times):
            p.execute_command("RRWLOCK.RELEASE", "rw", "READ", owner)
    assert not p.exists("rw")
    tx = p.pipeline(transaction=True)
    tx.execute_command(rw, "rw", "WRITE", "w", LEASE)
    tx.execute_command(rw, "rw", "WRITE", "w", LEASE + 3000)
    assert tx.execute() == [None, None]
    assert p.eval("return redis.call('RRWLOCK.ACQUIRE', KEYS[1], 'READ', 'w', ARGV[1])",
                  1, "rw", LEASE) is None  # the writer reads too
    assert p.execute_command(rw, "rw2", "WRITE", "w", LEASE, "ID", "req-rw") is None
    assert p.execute_command(rw, "rw", "READ", "x", LEASE) > 0  # held: no write
    fa = "RFENCED.ACQUIRE"
    got = [p.execute_command(fa, "f", "o", LEASE),
           p.execute_command(fa, "f", "o", LEASE + 1000)]  # re-entry
    tx = p.pipeline(transaction=True)
    tx.execute_command(fa, "f", "o", LEASE)
    tx.execute_command(fa, "g", "o", LEASE)
    f3, g1 = tx.execute()
    got += [f3, p.eval("return redis.call('RFENCED.ACQUIRE', KEYS[1], 'o', ARGV[1])",
                       1, "f", LEASE),
            p.execute_command(fa, "f", "o", LEASE, "ID", "req-f")]
    assert [g[0] for g in got + [g1]] == [None] * 6, got
    tokens = [g[1] for g in got]
    assert tokens == sorted(set(tokens)), tokens  # a new, larger token each time
    assert p.execute_command(fa, "f", "other", LEASE)[1] is None  # held: no write
    before = agree(p, r)
    assert r.hgetall("f") == {b"o": b"5"}
    assert r.get("redisson_lock_token:{f}") == str(tokens[-1]).encode()
    assert r.get("redisson_lock_token:{g}") == str(g1[1]).encode()
    assert r.hget("rw", "mode") == b"write"
    entries = [e for e in module_entries(primary) if e[0].upper() not in
               (b"MULTI", b"EXEC", b"DEL")]
    names = [e[0].upper() for e in entries]
    if mode == "commands":
        assert names.count(b"RRWLOCK.ACQUIREAT") == 8, names
        assert names.count(b"RFENCED.ACQUIREAT") == 5, names
        rws = [read_resp_commands(e[1])[0] for e in entries
               if e[0].upper() == b"RRWLOCK.ACQUIREAT"]
        assert [w[:3] for w in rws[:4]] == [[b"rw", b"READ", b"r1"], [b"rw", b"READ", b"r2"],
                                            [b"rw", b"READ", b"r1"], [b"rw", b"READ", b"short"]]
        assert [int(w[3]) for w in rws[:4]] == [LEASE, LEASE + 1000, LEASE + 2000, 50]
        fenced = [read_resp_commands(e[1])[0] for e in entries
                  if e[0].upper() == b"RFENCED.ACQUIREAT"]
        assert [w[:3] for w in fenced] == [[k, b"o", str(lease).encode()] for k, lease in
                                           ((b"f", LEASE), (b"f", LEASE + 1000), (b"f", LEASE),
                                            (b"g", LEASE), (b"f", LEASE))], fenced
        # The clock sent is the one the first token came from (`now << 10`).
        assert tokens[0] == int(fenced[0][3]) << 10, (tokens, fenced)
        # The replica's own AOF has them as they came.
        theirs = [e[0].upper() for e in module_entries(replica)]
        assert theirs.count(b"RRWLOCK.ACQUIREAT") == 8, theirs
        assert theirs.count(b"RFENCED.ACQUIREAT") == 5, theirs
    else:
        assert not [n for n in names if n.startswith(b"R")], names
    primary.restart()
    assert everything(primary.client()) == before


def test_internal_commands_read_from_an_aof_never_crash_and_refuse_bad_input(make_server):
    """An AOF is a file anyone may edit: each internal command (design.md 1.4) read from one
    with bad input is refused and changes nothing, and the server loads the rest."""
    s = make_server(args=PRIMARY_ARGS)
    c = s.client()
    c.execute_command("RLOCK.ACQUIRE", "held", "a", LEASE)
    c.set("str", "v")
    s.stop()
    far = 99999999999999
    now = far - 10 * LEASE
    at, rw, fa = "RLOCK.ACQUIREAT", "RRWLOCK.ACQUIREAT", "RFENCED.ACQUIREAT"
    bad = [
        [at, words_of("x1", "o", "soon")],
        [at, words_of("x2", "o", 0)],
        [at, words_of("x3", "o", -5)],
        [at, words_of("x4", "", far)],
        [at, words_of("x5", "o")],
        [at, words_of("x6", "o", 1, "extra")],
        [at, words_of("x7", "o", far) * 2],
        [at, words_of("x8", "o", far)[:-1]],
        [at, b""],
        [at, "x9", "o", far],
        [at],
        [at, words_of("str", "o", far)],                  # not a lock
        [at, words_of("held", "b", far)],                 # another holds it
        ["RLOCK.APPLY", b"*1\r\n$3\r\nDEL"],
        ["RLOCK.APPLY", b""],
        ["RLOCK.APPLY"],
        [rw, words_of("x10", "SIDEWAYS", "o", LEASE, now)],
        [rw, words_of("x11", "READ", "o", "long", now)],
        [rw, words_of("x12", "READ", "o", 0, now)],
        [rw, words_of("x13", "READ", "o", LEASE, 0)],
        [rw, words_of("x14", "READ", "", LEASE, now)],
        [rw, words_of("x15", "WRITE", "o", LEASE)],
        [rw, words_of("str", "WRITE", "o", LEASE, now)],  # not a lock
        [rw, words_of("held", "WRITE", "o", LEASE, now)],  # a plain lock, not an RW one
        [fa, words_of("x16", "o", LEASE)],
        [fa, words_of("x17", "o", -1, now)],
        [fa, words_of("x18", "o", LEASE, "now")],
        [fa, words_of("x19", "", LEASE, now)],
        [fa, words_of("str", "o", LEASE, now)],           # not a lock
        [fa, words_of("held", "b", LEASE, now)],          # another holds it
        [at, words_of("ok", "o", far)],                   # and good ones
        [rw, words_of("okrw", "READ", "o", LEASE, far - LEASE)],
        [fa, words_of("okf", "o", LEASE, far - LEASE)],
    ]
    incr = [f for f in aof_files(s) if f.name.endswith(".incr.aof")][-1]
    with incr.open("ab") as f:
        for words in bad:
            f.write(f"*{len(words)}\r\n".encode())
            for w in words:
                w = w if isinstance(w, bytes) else str(w).encode()
                f.write(b"$%d\r\n%s\r\n" % (len(w), w))
    s.start()
    c = s.client()
    assert c.hgetall("held") == {b"a": b"1"} and c.get("str") == b"v"
    assert c.hgetall("ok") == {b"o": b"1"} and c.pexpiretime("ok") == far
    assert c.hget("okrw", "mode") == b"read" and c.pexpiretime("okrw") == far
    assert c.hgetall("okf") == {b"o": b"1"} and c.pexpiretime("okf") == far
    assert c.get("redisson_lock_token:{okf}") == str((far - LEASE) << 10).encode()
    assert not [k for k in c.keys("x*")], c.keys("x*")
    assert not c.exists("redisson_lock_token:{held}", "redisson_lock_token:{str}")
    s.assert_alive()


def listening_for_propagation(client):
    return client.info("rlock")["rlock_propagation_listeners"] == 1


def gate_open(client):
    return client.info("rlock")["rlock_propagation_open"] == 1


# The gate's own mechanics (ffi/replication.rs) are tested with the policy that lets it
# skip on every server; the default, `auto`, lets it skip only where its listener costs
# other commands nothing (Redis 7.0), tested at the end of this group.
GATE = ["replication-gate", "yes"]


def test_the_gate_asks_at_the_first_write_and_listens_only_where_writes_are_dropped(
        make_server):
    """Nothing is asked or listened to at load. The first lock write asks: with an AOF or
    a master every write is replicated from then on, with no listener; with neither the
    module listens for a fork or a master link (Redis 8.2 walks every module listener on
    each key deleted or overwritten, so a server where no lock was written has none)."""
    primary = make_server("primary", args=PRIMARY_ARGS, module_args=GATE)
    p = primary.client()
    assert not listening_for_propagation(p)
    p.execute_command("RLOCK.ACQUIRE", "k", "a", LEASE)
    assert gate_open(p) and not listening_for_propagation(p)
    replica = make_server("replica", args=["--replicaof", "127.0.0.1", str(primary.port)],
                          module_args=GATE)
    assert not listening_for_propagation(replica.client())
    plain = make_server("plain", module_args=GATE)
    c = plain.client()
    assert not listening_for_propagation(c) and not gate_open(c)
    c.set("other", "traffic")
    c.delete("other")
    assert not listening_for_propagation(c)
    c.execute_command("RLOCK.ACQUIRE", "k", "a", LEASE)
    assert listening_for_propagation(c) and not gate_open(c)


def test_a_fork_opens_the_gate_without_a_listener_and_outlives_the_module(make_server):
    """The gate notes a fork with the process's fork handler, not a server event listener
    (8.2 and Valkey walk every listener on each key deleted or overwritten): while it
    watches, one listener (the master link) and no more; a BGSAVE opens it, and the next
    write drops that listener. The handler goes with the library: a fork after MODULE
    UNLOAD, and after loading it again, must not crash the server."""
    server = make_server("plain", module_args=GATE)
    c = server.client()
    c.execute_command("RLOCK.ACQUIRE", "k", "a", LEASE)
    assert listening_for_propagation(c) and not gate_open(c)
    assert c.info("rlock")["rlock_event_subscriptions"] == 0

    def fork(what):
        forks = c.info("stats")["total_forks"]
        c.bgsave()
        wait_until(lambda: c.info("stats")["total_forks"] > forks
                   and c.info("persistence")["rdb_bgsave_in_progress"] == 0, 10, what=what)

    fork("the BGSAVE")
    assert gate_open(c) and listening_for_propagation(c)
    c.execute_command("RLOCK.ACQUIRE", "k", "a", LEASE)
    assert gate_open(c) and not listening_for_propagation(c)

    # Unloaded while watching (a lock written after the module came back), then forks.
    assert c.execute_command("MODULE", "UNLOAD", "rlock") == b"OK"
    fork("a BGSAVE without the module")
    c.execute_command("MODULE", "LOAD", MODULE, *GATE)
    assert not gate_open(c)
    c.execute_command("RLOCK.ACQUIRE", "k2", "a", LEASE)
    assert listening_for_propagation(c) and not gate_open(c)
    assert c.execute_command("MODULE", "UNLOAD", "rlock") == b"OK"
    fork("a BGSAVE after unloading a watching module")
    c.execute_command("MODULE", "LOAD", MODULE, *GATE)
    c.execute_command("RLOCK.ACQUIRE", "k3", "a", LEASE)
    fork("a BGSAVE with the module loaded again")
    assert gate_open(c)
    server.assert_alive()


def test_a_primary_restarted_from_its_rdb_replicates_to_replicas_that_continue(make_server):
    """A primary without an AOF shut down with a save and started again makes its backlog
    while it loads its data, after the module loaded: its replica continues from that
    backlog (a partial resync, no fork, no master link of its own), so the gate must see
    the backlog at the first write, not at load."""
    args = ["--repl-diskless-sync-delay", "0", "--hz", "100"]
    primary = make_server("primary", args=args, module_args=GATE)
    p = primary.client()
    replica = make_server("replica", args=["--replicaof", "127.0.0.1", str(primary.port)],
                          module_args=GATE)
    r = replica.client()
    wait_link_up(r)
    wait_online(p)
    p.execute_command("RLOCK.ACQUIRE", "before", "o", LEASE)
    agree(p, r)
    with pytest.raises(redis.ConnectionError):
        p.execute_command("SHUTDOWN", "SAVE")
    primary.stop()
    primary.start()
    p = primary.client()
    assert info_field(p, "replication", "repl_backlog_active") == "1"
    wait_link_up(r)
    wait_until(lambda: int(info_field(p, "stats", "sync_partial_ok")) >= 1, 10,
               what="the replica's partial resync")
    assert int(info_field(p, "stats", "sync_full")) == 0
    p.execute_command("RLOCK.ACQUIRE", "after", "o", LEASE)
    p.execute_command("RLOCK.ACQUIRE", "before", "o", LEASE)
    assert gate_open(p)
    agree(p, r)
    assert r.hgetall("before") == {b"o": b"2"}
    assert r.hgetall("after") == {b"o": b"1"}


def test_writes_before_any_replica_or_aof_reach_both_once_they_exist(make_server):
    """Until propagation is possible the module skips building what the server would drop
    (ffi/replication.rs): the snapshot of a first sync and the AOF's first rewrite carry
    those writes, and every write after them is replicated."""
    primary = make_server("primary", args=["--repl-diskless-sync-delay", "0", "--hz", "100"],
                          module_args=GATE)
    p = primary.client()
    for i in range(5):
        p.execute_command("RLOCK.ACQUIRE", f"early{i}", "a", LEASE)
    # Nothing to propagate to: the writes were skipped, and the module listens for a fork
    # or a master link.
    assert listening_for_propagation(p) and not gate_open(p)
    p.execute_command("RLOCK.ACQUIRE", "early0", "a", LEASE)
    # An AOF turned on at run time, then more writes: a restart from it has them all.
    p.config_set("appendonly", "yes")
    wait_until(lambda: info_field(p, "persistence", "aof_rewrite_in_progress") == "0"
               and info_field(p, "persistence", "aof_rewrite_scheduled") == "0", 15,
               what="the AOF's first rewrite")
    # The rewrite's fork opened the gate for good; the next write drops the master-link
    # listener (8.2 walks it on every key deleted or overwritten).
    assert gate_open(p)
    p.execute_command("RLOCK.RELEASE", "early1", "a")
    assert not listening_for_propagation(p)
    p.execute_command("RLOCK.ACQUIRE", "late", "b", LEASE)
    # A replica attached now, its link cut and restored: partial resync from the backlog.
    replica = make_server("replica", args=["--replicaof", "127.0.0.1", str(primary.port)],
                          module_args=GATE)
    r = replica.client()
    wait_link_up(r)
    wait_online(p)
    agree(p, r)
    partial = int(info_field(p, "stats", "sync_partial_ok"))
    assert r.execute_command("CLIENT", "KILL", "TYPE", "master") == 1
    p.execute_command("RLOCK.ACQUIRE", "late", "b", LEASE)
    p.execute_command("RLOCK.RELEASE", "early2", "a")
    wait_link_up(r)
    wait_until(lambda: int(info_field(p, "stats", "sync_partial_ok")) > partial, 10,
               what="partial resync")
    before = agree(p, r)
    assert r.hgetall("late") == {b"b": b"2"}
    primary.args += ["--appendonly", "yes"]  # as CONFIG SET left it
    primary.restart()
    assert everything(primary.client()) == before


@pytest.mark.parametrize("b_wrote_first", [True, False], ids=["listening", "asking"])
def test_a_failover_without_aof_keeps_the_promoted_replicas_writes_for_the_old_primary(
        make_server, b_wrote_first):
    """B, a replica, is promoted and A, its old primary, attaches to it by partial resync:
    what B wrote in between reaches A from B's backlog, though neither has an AOF and B
    never forked. If B had written a lock before it turned replica, its master link coming
    up is what tells the module to replicate; if not, its first write asks and finds the
    backlog."""
    args = ["--repl-diskless-sync-delay", "0", "--hz", "100"]
    a_server = make_server("a", args=args, module_args=GATE)
    b_server = make_server("b", args=args, module_args=GATE)  # a replica from run time on
    a, b = a_server.client(), b_server.client()
    if b_wrote_first:
        b.execute_command("RLOCK.ACQUIRE", "own", "o", LEASE)  # skipped: b listens
        assert listening_for_propagation(b) and not gate_open(b)
    assert b.execute_command("REPLICAOF", "127.0.0.1", a_server.port)
    wait_link_up(b)
    wait_online(a)
    wait_until(lambda: not listening_for_propagation(b), 5, what="b's listeners dropped")
    assert gate_open(b) == b_wrote_first
    a.execute_command("RLOCK.ACQUIRE", "before", "o", LEASE)
    agree(a, b)
    assert b.execute_command("REPLICAOF", "NO", "ONE")
    wait_until(lambda: info_field(b, "replication", "role") == "master", 5, what="promoted")
    partial = int(info_field(b, "stats", "sync_partial_ok"))
    for i in range(3):
        b.execute_command("RLOCK.ACQUIRE", f"after{i}", "o", LEASE)
    b.execute_command("RLOCK.ACQUIRE", "before", "o", LEASE)
    assert a.execute_command("REPLICAOF", "127.0.0.1", b_server.port)
    wait_link_up(a)
    wait_until(lambda: int(info_field(b, "stats", "sync_partial_ok")) > partial, 10,
               what="the old primary's partial resync")
    agree(b, a)
    assert a.hgetall("before") == {b"o": b"2"}
    assert a.exists("after0", "after1", "after2") == 3


def test_the_gate_skips_by_default_only_where_its_listener_costs_other_commands_nothing(
        make_server):
    """`rlock.replication-gate auto` (the default): on Redis 7.0 the gate skips and watches
    as above, its master-link listener costing no other command anything; on Redis 7.2+
    and Valkey, which call every module listener on each key deleted or overwritten, it
    never skips, so no listener is ever added (a DEL costs what it costs without the
    module) and the failover of the test above needs nothing watched."""
    server = make_server("plain")
    c = server.client()
    assert c.config_get("rlock.replication-gate") == {"rlock.replication-gate": "auto"}
    c.execute_command("RLOCK.ACQUIRE", "k", "a", LEASE)
    c.set("other", "traffic")
    c.delete("other")
    if server_has_post_notification_jobs():
        assert gate_open(c) and not listening_for_propagation(c)
    else:
        assert listening_for_propagation(c) and not gate_open(c)


def test_the_gate_policy_changes_at_run_time(make_server):
    """`no` replicates every write and drops a listener the gate left; `yes` lets a gate
    that never opened skip again; a gate opened by a fork stays open whatever the policy
    (the server may have replicas now). A replica attached after writes made under each
    policy holds what the primary holds."""
    args = ["--repl-diskless-sync-delay", "0", "--hz", "100"]
    primary = make_server("primary", args=args, module_args=GATE)
    p = primary.client()
    p.execute_command("RLOCK.ACQUIRE", "k1", "a", LEASE)
    assert listening_for_propagation(p) and not gate_open(p)
    p.config_set("rlock.replication-gate", "no")
    assert gate_open(p)
    p.execute_command("RLOCK.ACQUIRE", "k2", "a", LEASE)
    assert gate_open(p) and not listening_for_propagation(p)
    p.config_set("rlock.replication-gate", "yes")
    p.execute_command("RLOCK.ACQUIRE", "k3", "a", LEASE)
    assert listening_for_propagation(p) and not gate_open(p)
    replica = make_server("replica", args=["--replicaof", "127.0.0.1", str(primary.port)])
    r = replica.client()
    wait_link_up(r)
    wait_online(p)
    # The replica's sync forked: the gate is open for good.
    p.execute_command("RLOCK.ACQUIRE", "k4", "a", LEASE)
    assert gate_open(p) and not listening_for_propagation(p)
    p.config_set("rlock.replication-gate", "yes")
    p.execute_command("RLOCK.ACQUIRE", "k1", "a", LEASE)
    assert gate_open(p) and not listening_for_propagation(p)
    agree(p, r)
    assert r.hgetall("k1") == {b"a": b"2"}
    with pytest.raises(redis.ResponseError):
        p.config_set("rlock.replication-gate", "sometimes")
    assert p.config_get("rlock.replication-gate") == {"rlock.replication-gate": "yes"}


def test_unlock_messages_reach_subscribers_on_a_replica_in_both_modes(trio):
    """design.md 1.4: the PUBLISH a release carries (inside RLOCK.APPLY, or as a plain effect)
    is published again by the replica to its own subscribers."""
    mode, primary, replica, p, r = trio
    sub = replica.client().pubsub()
    try:
        sub.subscribe("redisson_lock__channel:{k}")
        assert sub.get_message(timeout=5)["type"] == "subscribe"
        assert p.execute_command("RLOCK.ACQUIRE", "k", "o", LEASE) is None
        assert p.execute_command("RLOCK.RELEASE", "k", "o") == 1
        msg = sub.get_message(timeout=5)
        assert msg is not None, f"no unlock message on the replica ({mode})"
        assert (msg["type"], msg["channel"], msg["data"]) == (
            "message", b"redisson_lock__channel:{k}", b"0")
    finally:
        sub.close()
