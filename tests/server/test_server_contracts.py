"""Module API calls whose contract differs between the tested servers (issue 21).

Redis 8 reads a key's expiry through its value (`RM_GetExpire` / `RM_GetAbsExpire`
dereference the key's object unchecked), where Redis 7.0 and Valkey look the name up and
answer "no expiry" for an empty key. Before the fix, every call below killed Redis 8.2
with SIGSEGV in `RM_GetAbsExpire`: each reaches a key that is missing when the module
looks at it (never there, deleted, or expired lazily by the command's own lookup). They
run on every tested server: the reply is the same everywhere, and `make_server` fails the
test with the server's crash report if it dies.

Several steps are sent in one pipeline on purpose: commands already in the server's
input buffer run back to back, before its timers or active expiry get a turn, so a key
whose time ran out during `DEBUG SLEEP` is still there, expired, for the next command.
"""

import pytest
import redis

from conftest import wait_until


@pytest.fixture
def r(make_server):
    server = make_server(args=["--enable-debug-command", "yes"])
    return server.client()


def pipeline(r, *commands):
    p = r.pipeline(transaction=False)
    for c in commands:
        p.execute_command(*c)
    return p.execute(raise_on_error=False)


# ---- RSEMAPHORE.RELEASE: INCRBY on a count that is not there ----

def test_a_release_on_a_missing_semaphore_creates_its_count(r):
    assert r.execute_command("RSEMAPHORE.RELEASE", "new", 2) == 2
    assert r.get("new") == b"2" and r.pttl("new") == -1


def test_a_release_on_a_count_that_expired_a_moment_ago_starts_a_new_count(r):
    out = pipeline(r, ("SET", "s", "5", "PX", "10"), ("DEBUG", "SLEEP", "0.05"),
                   ("RSEMAPHORE.RELEASE", "s", 2))
    assert out[-1] == 2, "the expired count is gone: the release starts from 0"
    assert r.get("s") == b"2" and r.pttl("s") == -1


def test_a_release_on_a_hash_that_expired_a_moment_ago_is_no_wrongtype(r):
    out = pipeline(r, ("HSET", "s", "f", "1"), ("PEXPIRE", "s", 10), ("DEBUG", "SLEEP", "0.05"),
                   ("RSEMAPHORE.RELEASE", "s", 3))
    assert out[-1] == 3
    assert r.type("s") == b"string"


def test_a_release_on_a_live_count_keeps_its_ttl(r):
    """The other side of the guard: a key that is there still has its expiry read."""
    r.set("s", 1, px=60_000)
    assert r.execute_command("RSEMAPHORE.RELEASE", "s", 1) == 2
    assert 0 < r.pttl("s") <= 60_000


# ---- RPSEMAPHORE: expired permits returned to a count that was deleted ----

def test_the_reclaim_timer_returns_a_permit_to_a_deleted_count(r):
    assert r.execute_command("RPSEMAPHORE.TRYSETPERMITS", "e", 1) == 1
    assert r.execute_command("RPSEMAPHORE.ACQUIRE", "e", 100) is not None
    # The lease timer runs while the key has waiters: one asks for more than there is.
    w = redis.Redis(**r.connection_pool.connection_kwargs)
    assert w.execute_command("RPSEMAPHORE.ACQUIRE", "e", 1000, "PERMITS", 2, "WAIT", 60_000,
                             "ASYNC", "ID", "w") == b"QUEUED"
    assert r.info("rlock")["rlock_key_timers"] == 1
    r.delete("e")  # the available count; the permit's zset stays
    # The module's timer reclaims the permit at its expiry: INCRBY on the missing count.
    wait_until(lambda: r.get("e") == b"1", what="the expired permit back in the count")
    assert r.execute_command("RPSEMAPHORE.ACQUIREDPERMITS", "e") == 0
    w.close()
    wait_until(lambda: r.info("rlock")["rlock_waiters"] == 0, what="the ticket dropped")


def test_with_nobody_waiting_the_next_write_returns_a_permit_to_a_deleted_count(r):
    """No timer while nobody waits: the next write reclaims (ZREM, INCRBY on the missing
    count), here a release of another id."""
    assert r.execute_command("RPSEMAPHORE.TRYSETPERMITS", "e", 1) == 1
    assert r.execute_command("RPSEMAPHORE.ACQUIRE", "e", 20) is not None
    r.delete("e")
    out = pipeline(r, ("DEBUG", "SLEEP", "0.06"),
                   ("RPSEMAPHORE.RELEASE", "e", "00" * 16), ("GET", "e"), ("ZCARD", "{e}:timeout"))
    assert out[2:] == [b"1", 0], "reclaimed into the deleted count"


def test_acquiredpermits_reclaims_into_a_deleted_count(r):
    assert r.execute_command("RPSEMAPHORE.TRYSETPERMITS", "e", 1) == 1
    assert r.execute_command("RPSEMAPHORE.ACQUIRE", "e", 20) is not None
    r.delete("e")
    # The permit expires while the server sleeps; the read right after it, before the
    # module's timer runs, reclaims it itself.
    out = pipeline(r, ("DEBUG", "SLEEP", "0.06"), ("RPSEMAPHORE.ACQUIREDPERMITS", "e"),
                   ("RPSEMAPHORE.AVAILABLEPERMITS", "e"))
    assert out[1:] == [0, 1]


def test_setpermits_reclaims_into_a_deleted_count(r):
    assert r.execute_command("RPSEMAPHORE.TRYSETPERMITS", "e", 2) == 1
    assert r.execute_command("RPSEMAPHORE.ACQUIRE", "e", 20) is not None
    r.delete("e")
    out = pipeline(r, ("DEBUG", "SLEEP", "0.06"), ("RPSEMAPHORE.SETPERMITS", "e", 3))
    assert out[1] == 3, "every permit free again: available = permits"
