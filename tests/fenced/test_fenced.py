"""Issue 12 / design.md 4.2: the fenced lock (RFENCED.ACQUIRE, RFENCED.GETTOKEN) on real servers.

The fenced lock is the plain lock's hash plus Redisson's token key
`redisson_lock_token:{name}`; tokens are `max(last + 1, now_ms << 10)`, written with SET.
What is checked here: tokens strictly increase for one name over acquires, re-entries and
handoffs (WAIT), across an AOF restart, across a failover that lost the last tokens, and
with Redisson's own script incrementing the same key in between; replication as plain
effects; named errors with nothing changed; request-id retries; cluster routing.
"""

import threading
import time

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

import errors
from cluster_helpers import (Cluster, aof_commands, info_field, key_on, snapshot, wait_link_up,
                             wait_online, wait_replicated)
from conftest import EFFECTS, wait_until
from redisson_rw import RedissonFencedLock, token_key

LEASE = 60000
SHIFT = 10
MASTER_ARGS = ["--hz", "100", "--repl-diskless-sync-delay", "0", "--shutdown-on-sigterm", "now"]
NOT_A_TOKEN = errors.NOT_A_TOKEN


def acquire(c, key, owner, lease=LEASE, *opts):
    """RFENCED.ACQUIRE -> (pttl, token): (None, token) acquired, (pttl, None) contended."""
    reply = c.execute_command("RFENCED.ACQUIRE", key, owner, lease, *opts)
    assert isinstance(reply, list) and len(reply) == 2, reply
    pttl, token = reply
    assert (pttl is None) != (token is None), reply
    return pttl, token


def token_of(c, key, owner, lease=LEASE, *opts):
    pttl, token = acquire(c, key, owner, lease, *opts)
    assert token is not None, f"{owner!r} did not get {key!r}: pttl {pttl}"
    return token


def now_ms():
    return int(time.time() * 1000)


def assert_increasing(tokens):
    assert all(a < b for a, b in zip(tokens, tokens[1:])), tokens


class FencedWaiter:
    """A client blocked in `RFENCED.ACQUIRE ... WAIT` on its own connection and thread."""

    def __init__(self, server, key, owner, timeout_ms=10000, lease=LEASE, *opts):
        self.conn = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=30)
        self.cmd = ("RFENCED.ACQUIRE", key, owner, lease, "WAIT", timeout_ms, *opts)
        self.result = self.error = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            self.result = self.conn.execute_command(*self.cmd)
        except Exception as e:  # noqa: BLE001 - reported to the test
            self.error = e
        finally:
            self.done.set()

    def wait(self, timeout=10):
        assert self.done.wait(timeout), f"{self.cmd!r} got no answer in {timeout}s"
        return self.result

    def close(self):
        self.conn.close()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def fenced_waiters():
    started = []

    def start(server, probe, key, owner, *args, **kw):
        before = waiters_of(probe, key)
        w = FencedWaiter(server, key, owner, *args, **kw)
        w.thread.start()
        started.append(w)
        wait_until(lambda: waiters_of(probe, key) > before or w.done.is_set(), 5,
                   what=f"{owner} queued")
        assert not w.done.is_set(), (w.result, w.error)
        return w
    yield start
    for w in started:
        w.close()


def waiters_of(c, key):
    info = c.execute_command("RLOCK.INFO", key)
    return 0 if info is None else dict(zip(info[::2], info[1::2]))[b"waiters"]


def everything(c):
    """Every key with its DUMP and absolute expiry: 'nothing changed' means this is equal."""
    return {k: snapshot(c, k) for k in sorted(c.keys("*"))}


# ---------------------------------------------------------------------------------------
# One server

def test_tokens_increase_over_acquires_reentries_and_releases(r):
    tokens = []
    t0 = now_ms()
    tokens.append(token_of(r, "f", "a"))
    # The first token comes from the clock: now_ms << 10.
    assert t0 <= tokens[0] >> SHIFT <= now_ms()
    assert tokens[0] < 2 ** 53
    tokens.append(token_of(r, "f", "a"))  # re-entry: a new token, as Redisson
    assert r.hgetall("f") == {b"a": b"2"}
    pttl, token = acquire(r, "f", "b")
    assert token is None and 0 < pttl <= LEASE
    assert r.execute_command("RFENCED.GETTOKEN", "f") == tokens[-1]
    assert r.execute_command("RLOCK.RELEASE", "f", "a") == 0
    assert r.execute_command("RLOCK.RELEASE", "f", "a") == 1
    for owner in ("b", "c", "b"):
        tokens.append(token_of(r, "f", owner))
        assert r.execute_command("RLOCK.RELEASE", "f", owner) == 1
    for _ in range(200):  # many in one millisecond count on by last + 1
        tokens.append(token_of(r, "f", "a"))
    assert_increasing(tokens)
    assert r.execute_command("RFENCED.GETTOKEN", "f") == tokens[-1]
    assert r.get(token_key("f")) == str(tokens[-1]).encode()
    assert r.ttl(token_key("f")) == -1, "the token key never expires"
    assert int(info_field(r, "rlock", "rlock_fenced_tokens_issued")) == len(tokens)


def test_gettoken_is_nil_before_the_first_token_and_reads_a_java_counter(r):
    assert r.execute_command("RFENCED.GETTOKEN", "g") is None
    r.set(token_key("g"), 41)  # a Java client's INCR counter
    assert r.execute_command("RFENCED.GETTOKEN", "g") == 41
    token = token_of(r, "g", "a")
    assert token >> SHIFT >= now_ms() - 60000, "the clock term takes over from a small counter"


def test_resp3_replies_have_the_same_shape(server):
    c3 = server.client(protocol=3)
    pttl, token = c3.execute_command("RFENCED.ACQUIRE", "r3", "a", LEASE)
    assert pttl is None and token > 0
    assert c3.execute_command("RFENCED.ACQUIRE", "r3", "b", LEASE)[1] is None
    assert c3.execute_command("RFENCED.GETTOKEN", "r3") == token


def test_a_lock_without_ttl_is_still_contended_not_acquired(r):
    # Redisson answers {-1, -1} here, which its client reads as acquired.
    r.hset("nottl", "java", 1)
    assert acquire(r, "nottl", "b") == (-1, None)
    assert r.exists(token_key("nottl")) == 0


def test_handoffs_carry_increasing_tokens_and_mix_with_plain_waiters(server, r, fenced_waiters):
    first = token_of(r, "h", "a")
    b = fenced_waiters(server, r, "h", "b")
    plain = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=30)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault(
        "c", plain.execute_command("RLOCK.ACQUIRE", "h", "c", LEASE, "WAIT", 10000)), daemon=True)
    t.start()
    wait_until(lambda: waiters_of(r, "h") == 2, 5, what="c queued")
    d = fenced_waiters(server, r, "h", "d")
    # RLOCK.RELEASE frees fenced waiters: the queue is per key.
    assert r.execute_command("RLOCK.RELEASE", "h", "a") == 1
    pttl, tb = b.wait()
    assert pttl is None and tb > first
    assert r.hgetall("h") == {b"b": b"1"}
    assert r.execute_command("RFENCED.GETTOKEN", "h") == tb
    assert r.execute_command("RLOCK.RELEASE", "h", "b") == 1
    t.join(10)
    assert result == {"c": None}, "a plain waiter gets the plain reply and no token"
    assert r.execute_command("RFENCED.GETTOKEN", "h") == tb
    assert r.execute_command("RLOCK.FORCERELEASE", "h") == 1
    pttl, td = d.wait()
    assert pttl is None and td > tb
    plain.close()


def test_a_handoff_by_expiry_carries_a_token(server, r, fenced_waiters):
    first = token_of(r, "e", "a", 100)
    w = fenced_waiters(server, r, "e", "b")
    pttl, token = w.wait()
    assert pttl is None and token > first
    assert r.hgetall("e") == {b"b": b"1"}


@pytest.mark.parametrize("free", ["DEL", "FLUSHALL"])
def test_a_lock_freed_by_a_plain_command_goes_to_the_fenced_waiter_with_a_token(
        server, r, fenced_waiters, free):
    first = token_of(r, "z", "a")
    w = fenced_waiters(server, r, "z", "b")
    # FLUSHALL loses the token key: the next token is the clock's, larger once the clock
    # has passed the first token's millisecond (the bound of a lost token key).
    wait_until(lambda: now_ms() > first >> SHIFT, 1, what="the clock passes the first token")
    r.execute_command(*(["DEL", "z"] if free == "DEL" else ["FLUSHALL"]))
    pttl, token = w.wait()
    # After FLUSHALL the token key is gone too: the clock term alone still exceeds it.
    assert pttl is None and token > first
    assert r.hgetall("z") == {b"b": b"1"}
    assert r.execute_command("RFENCED.GETTOKEN", "z") == token


def test_a_wait_that_runs_out_answers_the_pttl_and_no_token(server, r, fenced_waiters):
    token_of(r, "t", "a")
    w = fenced_waiters(server, r, "t", "b", 50)
    pttl, token = w.wait()
    assert token is None and 0 < pttl <= LEASE
    assert r.execute_command("RFENCED.GETTOKEN", "t") is not None
    assert waiters_of(r, "t") == 0


def test_a_queued_acquire_is_refused_when_the_token_key_is_spoiled(server, r, fenced_waiters):
    token_of(r, "s", "a")
    w = fenced_waiters(server, r, "s", "b")
    r.set(token_key("s"), "not a number")
    assert r.execute_command("RLOCK.RELEASE", "s", "a") == 1
    w.wait()
    assert isinstance(w.error, redis.ResponseError) and str(w.error) == errors.text(NOT_A_TOKEN)
    # Refused, nothing written: the lock is free, not held by a client that got an error.
    assert r.exists("s") == 0 and waiters_of(r, "s") == 0
    assert r.get(token_key("s")) == b"not a number"


def test_a_request_id_retry_returns_the_same_token(server, r, fenced_waiters):
    first = acquire(r, "q", "a", LEASE, "ID", "r1")
    assert acquire(r, "q", "a", LEASE, "ID", "r1") == first
    assert r.hgetall("q") == {b"a": b"1"}, "a retry does not re-enter"
    assert r.execute_command("RFENCED.GETTOKEN", "q") == first[1]
    # A contended call is not remembered: its retry looks again.
    assert acquire(r, "q", "b", LEASE, "ID", "r2")[1] is None
    # A handoff remembers its token under the waiter's id.
    w = fenced_waiters(server, r, "q", "b", 10000, LEASE, "ID", "r3")
    assert r.execute_command("RLOCK.RELEASE", "q", "a") == 1
    handed = w.wait()
    assert handed[0] is None and handed[1] > first[1]
    assert acquire(r, "q", "b", LEASE, "ID", "r3") == tuple(handed)
    assert r.hgetall("q") == {b"b": b"1"}


def test_a_handoff_taken_back_forgets_its_id_and_its_token_stays_spent(server):
    """A fenced waiter killed between the handoff and its reply: the lock is taken back
    (as the plain lock's), its remembered reply forgotten, and the token it was issued is
    never issued again (tokens may skip numbers, never repeat them)."""
    r = server.client()
    first = token_of(r, "k", "holder")
    w = server.client()
    w_id = w.client_id()

    def wait():
        try:
            w.execute_command("RFENCED.ACQUIRE", "k", "a", 30_000, "WAIT", 10_000, "ID", "r7")
        except redis.ConnectionError:
            pass
    t = threading.Thread(target=wait)
    t.start()
    wait_until(lambda: r.info("rlock")["rlock_waiters"] == 1, what="waiter queued")
    with r.pipeline(transaction=False) as p:
        p.execute_command("RLOCK.RELEASE", "k", "holder")
        p.execute_command("CLIENT", "KILL", "ID", w_id)
        p.execute()
    t.join(10)
    wait_until(lambda: r.info("rlock")["rlock_revoked_handoffs"] == 1, what="handoff taken back")
    assert r.exists("k") == 0
    assert r.exists("rlock_request:{k}:r7") == 0
    spent = r.execute_command("RFENCED.GETTOKEN", "k")
    assert spent > first
    retried = token_of(r, "k", "a", LEASE, "ID", "r7")
    assert retried > spent, "the retry really acquired, with a new token"
    assert r.hgetall("k") == {b"a": b"1"}


def test_wait_is_ignored_in_multi(r):
    token_of(r, "m", "a")
    p = r.pipeline(transaction=True)
    p.execute_command("RFENCED.ACQUIRE", "m", "b", LEASE, "WAIT", 0)
    p.execute_command("RFENCED.ACQUIRE", "m", "a", LEASE)
    contended, reentered = p.execute()
    assert contended[1] is None and contended[0] > 0
    assert reentered[0] is None and reentered[1] > 0


# ---------------------------------------------------------------------------------------
# Bad input: named errors, nothing changed

BAD_CALLS = [
    (("RFENCED.ACQUIRE", "k", "o"), "wrong number of arguments"),
    (("RFENCED.ACQUIRE",), "wrong number of arguments"),
    (("RFENCED.GETTOKEN",), "wrong number of arguments"),
    (("RFENCED.GETTOKEN", "k", "x"), "wrong number of arguments"),
    (("RFENCED.ACQUIRE", "k", "o", 0), errors.LEASE),
    (("RFENCED.ACQUIRE", "k", "o", "1.5"), errors.LEASE),
    (("RFENCED.ACQUIRE", "k", "o", 3153600000001), errors.LEASE),
    (("RFENCED.ACQUIRE", "k", "o", LEASE, "WAIT", -1), errors.TIMEOUT),
    (("RFENCED.ACQUIRE", "k", "o", LEASE, "WAIT"), errors.SYNTAX),
    (("RFENCED.ACQUIRE", "k", "o", LEASE, "NOPE", 1), errors.SYNTAX),
    (("RFENCED.ACQUIRE", "k", "", LEASE), errors.EMPTY_OWNER),
    (("RFENCED.ACQUIRE", "k", "o", LEASE, "ID", ""), errors.EMPTY_ID),
    (("RFENCED.ACQUIRE", "k", "o", LEASE, "ID", "a", "ID", "b"), errors.SYNTAX),
]


@pytest.mark.parametrize("cmd,error", BAD_CALLS, ids=[" ".join(map(str, c[:1] + c[3:])) for c, _ in BAD_CALLS])
def test_bad_arguments_get_named_errors(r, cmd, error):
    r.hset("k", "o", 1)
    r.set(token_key("k"), 5)
    before = everything(r)
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command(*cmd)
    assert errors.text(error) in str(e.value)
    assert everything(r) == before


def test_spoiled_keys_get_named_errors_and_stay_as_they_are(r):
    # The token key holding a non-integer string, or another type.
    r.set(token_key("s1"), "abc")
    r.rpush(token_key("s2"), "x")
    r.set(token_key("s3"), 2 ** 63 - 1)
    # A RW lock's hash, and a string, at the lock key.
    r.hset("rw", mapping={"mode": "read", "a": 1})
    r.set("str", "x")
    before = everything(r)
    for key, error in [("s1", NOT_A_TOKEN), ("s2", NOT_A_TOKEN),
                       ("s3", errors.TOKEN_OVERFLOW),
                       ("rw", errors.NOT_A_LOCK), ("str", errors.WRONGTYPE)]:
        with pytest.raises(redis.ResponseError) as e:
            r.execute_command("RFENCED.ACQUIRE", key, "a", LEASE)
        assert errors.text(error) in str(e.value), key
    for key in ("s1", "s2"):
        with pytest.raises(redis.ResponseError) as e:
            r.execute_command("RFENCED.GETTOKEN", key)
        assert errors.text(NOT_A_TOKEN) in str(e.value)
    assert everything(r) == before
    # A contended call does not read the token key: it answers the PTTL.
    r.hset("s1", "java", 1)
    assert acquire(r, "s1", "a")[0] == -1


# ---------------------------------------------------------------------------------------
# Redisson's script on the same name

def test_redissons_script_and_rfenced_share_one_increasing_counter(r):
    java = RedissonFencedLock(r, "x", "uuid-1:1")
    tokens = []
    for round_ in range(20):
        tokens.append(token_of(r, "x", "rust"))
        assert r.execute_command("RLOCK.RELEASE", "x", "rust") == 1
        # Redisson's lockAndGetToken INCRs the value rlock SET: still exact through Lua
        # (tokens are < 2^53), and equal to what a plain GET reads.
        jt = java.try_lock_and_get_token()
        assert jt is not None and jt == java.get_token() == r.execute_command("RFENCED.GETTOKEN", "x")
        assert jt < 2 ** 53
        tokens.append(jt)
        if round_ % 2:  # re-entry and contention across both clients
            tokens.append(java.try_lock_and_get_token())
            assert acquire(r, "x", "rust")[1] is None
            assert java.unlock() == 0
        assert java.unlock() == 1
    assert_increasing(tokens)
    # rlock's reply agrees with a Java client's reading of the same key through Lua.
    lua = r.eval("return tonumber(redis.call('get', KEYS[1]))", 1, token_key("x"))
    assert lua == tokens[-1]


def test_redisson_holding_the_lock_contends_rfenced_and_its_unlock_hands_over(server, r, fenced_waiters):
    java = RedissonFencedLock(r, "y", "uuid-2:7")
    jt = java.try_lock_and_get_token()
    w = fenced_waiters(server, r, "y", "rust")
    assert java.unlock() == 1
    pttl, token = w.wait()
    assert pttl is None and token > jt


# ---------------------------------------------------------------------------------------
# Replication and persistence

@pytest.fixture
def pair(make_server):
    """A module-loaded master and a module-less replica, synced."""
    master = make_server("master", args=MASTER_ARGS, module_args=EFFECTS)
    replica = make_server("replica", module=False,
                          args=["--replicaof", "127.0.0.1", str(master.port)])
    m, rc = master.client(), replica.client()
    wait_link_up(rc)
    wait_online(m)
    wait_replicated(m, rc)
    return master, replica, m, rc


def test_the_token_reaches_a_module_less_replica_as_its_value(pair, fenced_waiters):
    master, replica, m, rc = pair
    token_of(m, "p", "a")
    token_of(m, "p", "a")
    w = fenced_waiters(master, m, "p", "b")
    assert m.execute_command("RLOCK.RELEASE", "p", "a") == 0
    assert m.execute_command("RLOCK.RELEASE", "p", "a") == 1
    last = w.wait()[1]
    wait_replicated(m, rc)
    for key in ("p", token_key("p")):
        assert snapshot(rc, key) == snapshot(m, key), key
    assert rc.get(token_key("p")) == str(last).encode()


def test_the_aof_holds_set_of_the_token_and_tokens_increase_after_a_restart(make_server):
    s = make_server(module_args=EFFECTS, args=["--appendonly", "yes", "--appendfsync", "always"])
    c = s.client()
    before = [token_of(c, "d", "a") for _ in range(5)]
    cmds = aof_commands(s)
    sets = [cmd for cmd in cmds if cmd[:2] == [b"SET", token_key("d").encode()]]
    assert [int(cmd[2]) for cmd in sets] == before, "each token is written as its value"
    assert not any(cmd[0].upper() in (b"INCR", b"RFENCED.ACQUIRE") for cmd in cmds)
    s.restart()
    c = s.client()
    assert c.execute_command("RFENCED.GETTOKEN", "d") == before[-1]
    assert c.hgetall("d") == {b"a": b"5"}
    after = [token_of(c, "d", "a") for _ in range(5)]
    assert_increasing(before + after)


def test_tokens_increase_across_a_failover_that_lost_the_last_tokens(make_server):
    master = make_server("master", args=MASTER_ARGS)
    replica = make_server("replica", args=["--replicaof", "127.0.0.1", str(master.port)])
    m, rc = master.client(), replica.client()
    wait_link_up(rc)
    wait_online(m)
    issued = []
    for owner in ("a", "b", "c"):
        issued.append(token_of(m, "fo", owner))
        assert m.execute_command("RLOCK.RELEASE", "fo", owner) == 1
    wait_replicated(m, rc)
    # A replica answers the read command and refuses the write one.
    assert rc.execute_command("RFENCED.GETTOKEN", "fo") == issued[-1]
    with pytest.raises(redis.ReadOnlyError):
        rc.execute_command("RFENCED.ACQUIRE", "fo", "x", LEASE)
    # The replica is cut off (as by a partition); the master goes on issuing tokens that
    # never reach it, in a burst, then dies without a word.
    assert rc.execute_command("REPLICAOF", "NO", "ONE")
    replicated = int(rc.get(token_key("fo")))
    assert replicated == issued[-1]
    for n in range(300):
        owner = f"lost{n % 3}"
        issued.append(token_of(m, "fo", owner))
        assert m.execute_command("RLOCK.RELEASE", "fo", owner) == 1
    assert int(rc.get(token_key("fo"))) == replicated, "the replica missed them"
    # Redisson's INCR on the promoted replica would hand out the lost numbers again.
    assert replicated + 1 <= max(issued)
    master.stop(sig_kill=True)
    # The documented bound: the new master's clock reads a later millisecond than the old
    # master's last token encodes (one machine, one clock: a millisecond at most).
    wait_until(lambda: now_ms() > max(issued) >> SHIFT, 1, what="the clock passes the last token")
    after = []
    for owner in ("x", "y", "z"):
        after.append(token_of(rc, "fo", owner))
        assert rc.execute_command("RLOCK.RELEASE", "fo", owner) == 1
    assert min(after) > max(issued), "every new token exceeds every token handed out before"
    assert_increasing(after)


# ---------------------------------------------------------------------------------------
# A real 3-master cluster: the token key lands in the lock's slot

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("fenced-cluster"))
    try:
        c.start()
        yield c
    finally:
        crashed = c.stop()
    assert not crashed, "a cluster node crashed"


def test_a_cluster_client_routes_rfenced_and_the_token_key_shares_the_slot(cluster):
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, socket_timeout=30)
    try:
        for node in cluster.masters():
            lo, hi = cluster.slot_ranges(node)[0]
            for key in (key_on(lo, hi, f"fenced:{node.port}"), "{" + key_on(lo, hi, "tag") + "}:f"):
                slot = key_slot(key.encode())
                assert key_slot(token_key(key).encode()) == slot
                assert rc.get_node_from_key(key).port == node.port
                pttl, t1 = rc.execute_command("RFENCED.ACQUIRE", key, "o", LEASE)
                assert pttl is None and t1 > 0
                pttl, t2 = rc.execute_command("RFENCED.ACQUIRE", key, "o", LEASE)
                assert t2 > t1
                assert rc.execute_command("RFENCED.GETTOKEN", key) == t2
                n = node.client()
                assert n.get(token_key(key)) == str(t2).encode()
                assert n.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 2
                for other in cluster.masters():
                    if other is not node:
                        with pytest.raises(redis.ResponseError) as e:
                            other.client().execute_command("RFENCED.GETTOKEN", key)
                        assert str(e.value).startswith("MOVED")
                        assert other.client().execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
                assert rc.execute_command("RLOCK.FORCERELEASE", key) == 1
    finally:
        rc.close()
