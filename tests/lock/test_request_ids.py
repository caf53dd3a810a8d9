"""Request ids: a retry with the id of a call that already changed the lock gets the first
reply and changes nothing, so a client retrying after a lost reply never double-counts a
re-entry or double-releases."""

import threading

import pytest
import redis

import errors
from conftest import EFFECTS, wait_until


def acq(r, key, owner, *extra, lease=30_000):
    return r.execute_command("RLOCK.ACQUIRE", key, owner, lease, *extra)


def rel(r, key, owner, *extra):
    return r.execute_command("RLOCK.RELEASE", key, owner, *extra)


def test_a_retried_reentry_is_counted_once(r):
    assert acq(r, "k", "a", "ID", "r1") is None
    assert acq(r, "k", "a", "ID", "r2") is None
    assert acq(r, "k", "a", "ID", "r2") is None, "the retry gets the first reply"
    assert r.hget("k", "a") == b"2"


def test_a_retried_release_is_applied_once(r):
    acq(r, "k", "a")
    acq(r, "k", "a")
    assert rel(r, "k", "a", "ID", "u1") == 0
    assert rel(r, "k", "a", "ID", "u1") == 0
    assert r.hget("k", "a") == b"1"
    assert rel(r, "k", "a", 5_000, "ID", "u2") == 1
    # Someone else takes the lock; the late retry of the release must not touch it.
    acq(r, "k", "b")
    assert rel(r, "k", "a", 5_000, "ID", "u2") == 1
    assert r.hgetall("k") == {b"b": b"1"}


def test_calls_that_changed_nothing_are_simply_run_again(r):
    acq(r, "k", "holder", lease=20_000)
    assert isinstance(acq(r, "k", "a", "ID", "r1"), int)
    rel(r, "k", "holder")
    assert acq(r, "k", "a", "ID", "r1") is None, "the first try did not acquire; this one does"
    assert r.hgetall("k") == {b"a": b"1"}


def test_the_reply_is_remembered_in_a_key_in_the_locks_slot_for_the_window(r):
    r.config_set("rlock.request-id-window-ms", 5_000)
    acq(r, "{app}:k", "a", "ID", "r1")
    acq(r, "k", "a", "ID", "r1")
    assert r.get("rlock_request:{k}:r1") == b"nil"
    assert r.get("rlock_request:{app}:k:r1") == b"nil"
    assert 4_000 < r.pttl("rlock_request:{k}:r1") <= 5_000


def test_after_the_window_the_same_id_applies_again(r):
    r.config_set("rlock.request-id-window-ms", 30)
    acq(r, "k", "a", "ID", "r1")
    wait_until(lambda: r.exists("rlock_request:{k}:r1") == 0, what="request id window to end")
    acq(r, "k", "a", "ID", "r1")
    assert r.hget("k", "a") == b"2"


def test_a_handoff_remembers_the_waiters_request_id(server):
    r = server.client()
    acq(r, "k", "holder")
    got = {}
    w = server.client()
    t = threading.Thread(target=lambda: got.update(
        reply=w.execute_command("RLOCK.ACQUIRE", "k", "a", 30_000, "WAIT", 10_000, "ID", "r9")))
    t.start()
    wait_until(lambda: r.info("rlock")["rlock_waiters"] == 1, what="waiter queued")
    assert rel(r, "k", "holder") == 1
    t.join(10)
    assert got["reply"] is None
    # The reply was lost, say; the client retries with the same id: no second hold.
    assert acq(r, "k", "a", "WAIT", 10_000, "ID", "r9") is None
    assert r.hgetall("k") == {b"a": b"1"}


def test_request_ids_reach_replicas_with_the_same_expiry(make_server):
    master = make_server("m", module_args=EFFECTS)
    replica = make_server("r", module=False, args=["--replicaof", "127.0.0.1", str(master.port)])
    m, rr = master.client(), replica.client()
    wait_until(lambda: rr.info("replication").get("master_link_status") == "up", timeout=20,
               what="replica link up")
    acq(m, "k", "a", "ID", "r1")
    assert m.execute_command("WAIT", 1, 5000) == 1
    assert rr.get("rlock_request:{k}:r1") == b"nil"
    assert rr.execute_command("PEXPIRETIME", "rlock_request:{k}:r1") == \
        m.execute_command("PEXPIRETIME", "rlock_request:{k}:r1")


def test_a_foreign_value_at_the_request_key_is_never_overwritten(r):
    r.rpush("rlock_request:{k}:r1", "mine")
    assert acq(r, "k", "a", "ID", "r1") is None
    assert acq(r, "k", "a", "ID", "r1") is None
    assert r.lrange("rlock_request:{k}:r1", 0, -1) == [b"mine"]
    assert r.hget("k", "a") == b"2", "without a usable record the retry is applied"


@pytest.mark.parametrize("call,error", [
    (["RLOCK.ACQUIRE", "k", "a", "10", "ID", ""], errors.text(errors.EMPTY_ID)),
    (["RLOCK.ACQUIRE", "k", "a", "10", "ID"], errors.text(errors.SYNTAX)),
    (["RLOCK.ACQUIRE", "k", "a", "10", "ID", "x", "ID", "y"], errors.text(errors.SYNTAX)),
    (["RLOCK.RELEASE", "k", "a", "ID", ""], errors.text(errors.EMPTY_ID)),
    (["RLOCK.RELEASE", "k", "a", "10", "ID"], errors.text(errors.SYNTAX)),
])
def test_malformed_request_ids_are_refused(r, call, error):
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command(*call)
    assert str(e.value) == error
    assert r.exists("k") == 0


def test_a_handoff_taken_back_forgets_its_request_id(server):
    """A waiter killed between the handoff and its reply never learns it got the lock: the
    module takes the lock back and must forget the remembered reply, or the client's retry
    would be told "acquired" for a lock it does not hold."""
    r = server.client()
    acq(r, "k", "holder")
    w = server.client()
    w_id = w.client_id()
    t = threading.Thread(target=lambda: _swallow(
        lambda: w.execute_command("RLOCK.ACQUIRE", "k", "a", 30_000, "WAIT", 10_000, "ID", "r7")))
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
    assert acq(r, "k", "a", "ID", "r7") is None
    assert r.hgetall("k") == {b"a": b"1"}, "the retry really acquired"


def _swallow(call):
    try:
        call()
    except redis.ConnectionError:
        pass
