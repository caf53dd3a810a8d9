"""Every reply branch of every RLOCK command, bad input, configs and INFO, on a real server."""

import pytest
import redis

import errors
from conftest import wait_until

LEASE = 30_000

ERR_LEASE = errors.text(errors.LEASE)
ERR_TIMEOUT = errors.text(errors.TIMEOUT)
ERR_OWNER = errors.text(errors.EMPTY_OWNER)
ERR_NOT_A_LOCK = errors.text(errors.NOT_A_LOCK)
ERR_WRONGTYPE = errors.WRONGTYPE


def acquire(r, key, owner, lease=LEASE, *extra):
    return r.execute_command("RLOCK.ACQUIRE", key, owner, lease, *extra)


# --- RLOCK.ACQUIRE ---------------------------------------------------------------------

def test_acquire_creates_a_redisson_hash_with_the_lease(r):
    assert acquire(r, "k", "uuid:1", 10_000) is None
    assert r.hgetall("k") == {b"uuid:1": b"1"}
    assert 9_000 < r.pttl("k") <= 10_000


def test_acquire_reenters_and_rearms_the_lease(r):
    assert acquire(r, "k", "a", 1_000) is None
    assert acquire(r, "k", "a", 50_000) is None
    assert acquire(r, "k", "a", 50_000) is None
    assert r.hgetall("k") == {b"a": b"3"}
    assert r.pttl("k") > 40_000


def test_acquire_by_another_owner_gets_the_pttl_and_changes_nothing(r):
    acquire(r, "k", "a", 20_000)
    before = r.dump("k")
    ttl = acquire(r, "k", "b")
    assert isinstance(ttl, int) and 15_000 < ttl <= 20_000
    assert r.dump("k") == before


def test_acquire_on_a_lock_without_ttl_reports_minus_one(r):
    r.hset("k", "a", 1)
    assert acquire(r, "k", "b") == -1
    assert r.ttl("k") == -1


def test_binary_keys_and_owners_are_kept_exactly(r):
    key, owner = b"lock\x00\xff{x}", b"\x00owner\r\n\xfe"
    assert acquire(r, key, owner) is None
    assert r.hgetall(key) == {owner: b"1"}
    assert acquire(r, key, b"\x00owner\r\n\xff") > 0
    assert r.execute_command("RLOCK.RELEASE", key, owner) == 1
    assert r.exists(key) == 0


# --- RLOCK.RELEASE ---------------------------------------------------------------------

def test_release_counts_down_and_keeps_the_expiry_without_a_lease(r):
    acquire(r, "k", "a", 20_000)
    acquire(r, "k", "a", 20_000)
    r.pexpire("k", 5_000)
    assert r.execute_command("RLOCK.RELEASE", "k", "a") == 0
    assert r.hgetall("k") == {b"a": b"1"}
    assert r.pttl("k") <= 5_000


def test_release_with_a_lease_rearms_the_expiry(r):
    acquire(r, "k", "a", 1_000)
    acquire(r, "k", "a", 1_000)
    assert r.execute_command("RLOCK.RELEASE", "k", "a", 60_000) == 0
    assert r.pttl("k") > 50_000


def test_last_release_frees_the_lock(r):
    acquire(r, "k", "a")
    assert r.execute_command("RLOCK.RELEASE", "k", "a", 100) == 1
    assert r.exists("k") == 0


def test_release_by_a_non_owner_changes_nothing(r):
    acquire(r, "k", "a")
    before = r.dump("k")
    assert r.execute_command("RLOCK.RELEASE", "k", "b") is None
    assert r.execute_command("RLOCK.RELEASE", "nokey", "b") is None
    assert r.dump("k") == before


def test_release_of_one_owner_of_a_shared_hash_leaves_the_others(r):
    r.hset("k", mapping={"a": 1, "b": 2})
    assert r.execute_command("RLOCK.RELEASE", "k", "a") == 1
    assert r.hgetall("k") == {b"b": b"2"}


# --- RLOCK.RENEW / FORCERELEASE --------------------------------------------------------

def test_renew_rearms_for_the_holder_only(r):
    acquire(r, "k", "a", 1_000)
    acquire(r, "k", "a", 1_000)
    assert r.execute_command("RLOCK.RENEW", "k", "a", 60_000) == 1
    assert r.pttl("k") > 50_000
    assert r.hget("k", "a") == b"2"
    before = r.dump("k")
    assert r.execute_command("RLOCK.RENEW", "k", "b", 60_000) == 0
    assert r.execute_command("RLOCK.RENEW", "none", "a", 60_000) == 0
    assert r.dump("k") == before


def test_forcerelease_frees_whatever_the_count(r):
    for _ in range(5):
        acquire(r, "k", "a")
    assert r.execute_command("RLOCK.FORCERELEASE", "k") == 1
    assert r.exists("k") == 0
    assert r.execute_command("RLOCK.FORCERELEASE", "k") == 0


# --- RLOCK.INFO ------------------------------------------------------------------------

def test_info_is_nil_without_a_lock(r):
    assert r.execute_command("RLOCK.INFO", "k") is None


def test_info_resp2_gives_flat_pairs(r):
    acquire(r, "k", "a", 20_000)
    acquire(r, "k", "a", 20_000)
    reply = r.execute_command("RLOCK.INFO", "k")
    assert reply[0::2] == [b"owners", b"pttl", b"waiters"]
    assert reply[1] == [b"a", 2]
    assert 15_000 < reply[3] <= 20_000
    assert reply[5] == 0


def test_info_resp3_gives_a_map(server):
    r3 = server.client(protocol=3)
    acquire(r3, "k", "a", 20_000)
    reply = r3.execute_command("RLOCK.INFO", "k")
    assert isinstance(reply, dict)
    assert reply[b"owners"] == {b"a": 1}
    assert reply[b"waiters"] == 0


def test_info_works_on_a_read_only_replica_where_writes_are_refused(make_server):
    master = make_server("m")
    replica = make_server("r", args=["--replicaof", "127.0.0.1", str(master.port)])
    m, rr = master.client(), replica.client()
    wait_until(lambda: rr.info("replication").get("master_link_status") == "up",
               timeout=20, what="replica link up")
    acquire(m, "k", "a")
    m.execute_command("WAIT", 1, 5000)
    assert rr.execute_command("RLOCK.INFO", "k")[1] == [b"a", 1]
    for cmd in (["RLOCK.ACQUIRE", "k", "b", 100], ["RLOCK.RELEASE", "k", "a"],
                ["RLOCK.RENEW", "k", "a", 100], ["RLOCK.FORCERELEASE", "k"]):
        with pytest.raises(redis.ReadOnlyError):
            rr.execute_command(*cmd)


# --- bad input -------------------------------------------------------------------------

def arity(cmd):
    return f"wrong number of arguments for '{cmd.lower()}' command"


BAD_CALLS = [
    # (header comment, call, exact error)
    ("acquire without lease", ["RLOCK.ACQUIRE", "k", "o"], arity("rlock.acquire")),
    ("acquire without owner", ["RLOCK.ACQUIRE", "k"], arity("rlock.acquire")),
    ("release without owner", ["RLOCK.RELEASE", "k"], arity("rlock.release")),
    ("renew without lease", ["RLOCK.RENEW", "k", "o"], arity("rlock.renew")),
    ("renew with extra argument", ["RLOCK.RENEW", "k", "o", "1", "x"], arity("rlock.renew")),
    ("forcerelease with extra", ["RLOCK.FORCERELEASE", "k", "x"], arity("rlock.forcerelease")),
    ("info without key", ["RLOCK.INFO"], arity("rlock.info")),
    ("lease not a number", ["RLOCK.ACQUIRE", "k", "o", "abc"], ERR_LEASE),
    ("lease zero", ["RLOCK.ACQUIRE", "k", "o", "0"], ERR_LEASE),
    ("lease negative", ["RLOCK.ACQUIRE", "k", "o", "-1"], ERR_LEASE),
    ("lease a float", ["RLOCK.ACQUIRE", "k", "o", "1.5"], ERR_LEASE),
    ("lease overflowing i64", ["RLOCK.ACQUIRE", "k", "o", "99999999999999999999"], ERR_LEASE),
    ("lease over 100 years", ["RLOCK.ACQUIRE", "k", "o", "3153600000001"], ERR_LEASE),
    ("release lease zero", ["RLOCK.RELEASE", "k", "o", "0"], ERR_LEASE),
    ("renew lease text", ["RLOCK.RENEW", "k", "o", "ten"], ERR_LEASE),
    ("wait timeout negative", ["RLOCK.ACQUIRE", "k", "o", "10", "WAIT", "-1"], ERR_TIMEOUT),
    ("wait timeout text", ["RLOCK.ACQUIRE", "k", "o", "10", "WAIT", "soon"], ERR_TIMEOUT),
    ("wait without timeout", ["RLOCK.ACQUIRE", "k", "o", "10", "WAIT"], "syntax error"),
    ("wait given twice", ["RLOCK.ACQUIRE", "k", "o", "10", "WAIT", "1", "WAIT", "1"], "syntax error"),
    ("unknown option", ["RLOCK.ACQUIRE", "k", "o", "10", "NOWAIT"], "syntax error"),
    ("release extra argument", ["RLOCK.RELEASE", "k", "o", "10", "x"], "syntax error"),
    ("release far too many", ["RLOCK.RELEASE", "k", "o", "10", "ID", "r", "x"], arity("rlock.release")),
    # More arguments than the entry point lends from its stack buffer (ffi/commands.rs).
    ("acquire with 40 arguments", ["RLOCK.ACQUIRE", "k", "o", "10", *["x"] * 36],
     "syntax error"),
    ("empty owner on acquire", ["RLOCK.ACQUIRE", "k", "", "10"], ERR_OWNER),
    ("empty owner on release", ["RLOCK.RELEASE", "k", ""], ERR_OWNER),
    ("empty owner on renew", ["RLOCK.RENEW", "k", "", "10"], ERR_OWNER),
]


@pytest.mark.parametrize("name,call,error", BAD_CALLS, ids=[row[0] for row in BAD_CALLS])
def test_malformed_calls_get_their_exact_error_and_change_nothing(r, name, call, error):
    acquire(r, "k", "o", 20_000)
    before = r.dump("k")
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command(*call)
    assert str(e.value) == error
    assert r.dump("k") == before


WRONG_KEYS = [
    ("string", lambda r: r.set("w", "v"), ERR_WRONGTYPE),
    ("list", lambda r: r.rpush("w", "v"), ERR_WRONGTYPE),
    ("hash with a text value", lambda r: r.hset("w", "o", "x"), ERR_NOT_A_LOCK),
    ("hash with a zero count", lambda r: r.hset("w", mapping={"o": "1", "p": "0"}), ERR_NOT_A_LOCK),
    ("hash with a negative count", lambda r: r.hset("w", "p", "-2"), ERR_NOT_A_LOCK),
]
COMMANDS = [
    ["RLOCK.ACQUIRE", "w", "o", "100"],
    ["RLOCK.ACQUIRE", "w", "o", "100", "WAIT", "10"],
    ["RLOCK.RELEASE", "w", "o"],
    ["RLOCK.RENEW", "w", "o", "100"],
    ["RLOCK.FORCERELEASE", "w"],
    ["RLOCK.INFO", "w"],
]


@pytest.mark.parametrize("kind,make,error", WRONG_KEYS, ids=[w[0] for w in WRONG_KEYS])
@pytest.mark.parametrize("call", COMMANDS, ids=[" ".join(c[:1] + c[4:5]) for c in COMMANDS])
def test_keys_that_are_not_locks_are_refused_untouched(r, kind, make, error, call):
    make(r)
    r.pexpire("w", 50_000)
    before = r.dump("w")
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command(*call)
    assert str(e.value) == error
    assert r.dump("w") == before


def test_a_reentry_that_would_overflow_the_count_is_refused(r):
    r.hset("k", "o", 2**63 - 1)
    with pytest.raises(redis.ResponseError) as e:
        acquire(r, "k", "o")
    assert str(e.value) == errors.text(errors.COUNT_OVERFLOW)
    assert r.hget("k", "o") == str(2**63 - 1).encode()


# --- configs and INFO ------------------------------------------------------------------

def test_config_has_a_documented_default_and_enforced_range(r):
    assert r.config_get("rlock.max-waiters-per-key") == {"rlock.max-waiters-per-key": "10000"}
    r.config_set("rlock.max-waiters-per-key", 5)
    assert r.config_get("rlock.max-waiters-per-key")["rlock.max-waiters-per-key"] == "5"
    for bad in ("-1", "10000001", "lots"):
        with pytest.raises(redis.ResponseError):
            r.config_set("rlock.max-waiters-per-key", bad)
    assert r.config_get("rlock.max-waiters-per-key")["rlock.max-waiters-per-key"] == "5"


def test_request_id_window_has_a_default_and_a_range(r):
    assert r.config_get("rlock.request-id-window-ms") == {"rlock.request-id-window-ms": "60000"}
    for bad in ("0", "86400001"):
        with pytest.raises(redis.ResponseError):
            r.config_set("rlock.request-id-window-ms", bad)


def test_config_is_accepted_as_a_loadmodule_argument(make_server):
    s = make_server(module_args=["max-waiters-per-key", "7", "request-id-window-ms", "1000"])
    got = s.client().config_get("rlock.*")
    assert got["rlock.max-waiters-per-key"] == "7"
    assert got["rlock.request-id-window-ms"] == "1000"


def test_info_rlock_counts_what_happened(r):
    acquire(r, "k", "a")
    acquire(r, "k", "a")
    acquire(r, "k", "b")
    r.execute_command("RLOCK.RENEW", "k", "a", 100_000)
    r.execute_command("RLOCK.RELEASE", "k", "a")
    r.execute_command("RLOCK.FORCERELEASE", "k")
    info = r.info("rlock")
    assert info["rlock_acquisitions"] == 1
    assert info["rlock_reentries"] == 1
    assert info["rlock_contended"] == 1
    assert info["rlock_renewals"] == 1
    assert info["rlock_releases"] == 1
    assert info["rlock_forced_releases"] == 1
    for field in ("handoffs", "wait_timeouts", "expired_with_waiters", "waiters", "keys_with_waiters"):
        assert info[f"rlock_{field}"] == 0


def test_the_module_unloads_cleanly(r):
    acquire(r, "k", "a")
    assert r.execute_command("MODULE", "UNLOAD", "rlock") == b"OK"
    assert r.hgetall("k") == {b"a": b"1"}, "locks are plain hashes: they outlive the module"
