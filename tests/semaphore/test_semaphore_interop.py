"""Interop, both directions, between RSEMAPHORE.*/RPSEMAPHORE.* and Redisson's own scripts
(tests/support/redisson_sync.py) on the same names: a Java-style waiter (subscribed to
`redisson_sc:{name}`, retrying its script on each message) woken by a module release; a
module WAIT waiter served after a script's release (an INCRBY the module is told of by a
keyspace event on Redis 7.0, or finds by polling every 10 ms where the server reports only
removals, as Valkey); permit ids written by either side released by the other.
"""

import time

from conftest import wait_until
from redisson_sync import RedissonPermitExpirableSemaphore, RedissonSemaphore
from sem_helpers import queue


def java_waiter(r, channel):
    """A Redisson client's subscription (its waiters sleep on it between retries)."""
    p = r.pubsub()
    p.subscribe(channel)
    wait_until(lambda: p.get_message(timeout=0.1), what="subscribed")
    return p


def next_message(p):
    return wait_until(lambda: p.get_message(timeout=0.1), what="a message")["data"]


def test_a_java_waiter_is_woken_by_a_module_release(server):
    r = server.client()
    java = RedissonSemaphore(r, "s")
    assert java.try_set_permits(1)
    assert r.execute_command("RSEMAPHORE.ACQUIRE", "s", 1) == 1
    p = java_waiter(r, java.channel)
    assert not java.try_acquire(1), "Java finds none and sleeps on the channel"
    assert r.execute_command("RSEMAPHORE.RELEASE", "s", 1) == 1
    assert next_message(p) == b"1", "Redisson's message: the count"
    assert java.try_acquire(1), "the retry after the message succeeds"
    assert java.available_permits() == 0
    p.close()


def test_a_module_waiter_is_served_after_a_java_release(server):
    r = server.client()
    java = RedissonSemaphore(r, "s")
    java.try_set_permits(0)
    call = queue(server, r, "s", "RSEMAPHORE.ACQUIRE", "s", 2, "WAIT", 10_000)
    try:
        java.release(1)
        assert r.get("s") == b"1" and not call.done.is_set(), "still one short"
        start = time.time()
        java.release(1)
        assert call.wait() == 1
        print(f"served {1000 * (call.at - start):.1f} ms after the script's release")
        assert r.get("s") == b"0"
    finally:
        call.close()


def test_counts_written_by_either_side_read_the_same(r):
    java = RedissonSemaphore(r, "s")
    assert r.execute_command("RSEMAPHORE.TRYSETPERMITS", "s", 5) == 1
    assert not java.try_set_permits(3)
    assert java.try_acquire(2)
    assert r.execute_command("RSEMAPHORE.AVAILABLEPERMITS", "s") == 3
    java.add_permits(-1)
    assert r.execute_command("RSEMAPHORE.ACQUIRE", "s", 2) == 1
    assert java.available_permits() == 0
    r.execute_command("RSEMAPHORE.ADDPERMITS", "s", 4)
    assert java.drain_permits() == 4
    assert r.execute_command("RSEMAPHORE.DRAINPERMITS", "s") == 0


def test_permit_ids_of_either_side_are_released_by_the_other(r):
    java = RedissonPermitExpirableSemaphore(r, "p")
    assert java.try_set_permits(2)
    [jid] = java.try_acquire(1, lease_ms=60_000)
    mid = r.execute_command("RPSEMAPHORE.ACQUIRE", "p", 60_000).decode()
    assert java.acquired_permits() == 2 and java.available_permits() == 0
    assert 59_000 < java.lease_time(mid) <= 60_000
    assert r.execute_command("RPSEMAPHORE.RELEASE", "p", jid) == 1, "Java's hex id, the module's release"
    assert java.try_release(mid), "the module's id, Java's release"
    assert r.get("p") == b"2" and r.zcard("{p}:timeout") == 0
    # A Java permit without lease, renewed by the module, and the other way round.
    [jid] = java.try_acquire(1, lease_ms=-1)
    assert r.execute_command("RPSEMAPHORE.LEASETIME", "p", jid) == -1
    assert r.execute_command("RPSEMAPHORE.UPDATELEASETIME", "p", jid, 30_000) == 1
    assert 29_000 < java.lease_time(jid) <= 30_000


def test_a_module_waiter_is_served_after_a_java_permit_release(server):
    r = server.client()
    java = RedissonPermitExpirableSemaphore(r, "p")
    java.try_set_permits(1)
    [jid] = java.try_acquire(1, lease_ms=60_000)
    call = queue(server, r, "p", "RPSEMAPHORE.ACQUIRE", "p", 60_000, "WAIT", 10_000,
                 info="RPSEMAPHORE.INFO")
    try:
        assert java.try_release(jid)
        mid = call.wait().decode()
        assert java.lease_time(mid) > 59_000
    finally:
        call.close()


def test_a_java_permits_lease_end_serves_a_module_waiter_at_once(server):
    """Redisson would reclaim it only when some client next runs a script; the module's
    queue looks at the key again at the permit's lease end."""
    r = server.client()
    java = RedissonPermitExpirableSemaphore(r, "p")
    java.try_set_permits(1)
    java.try_acquire(1, lease_ms=300)
    end = int(r.zrange("{p}:timeout", 0, 0, withscores=True)[0][1])
    call = queue(server, r, "p", "RPSEMAPHORE.ACQUIRE", "p", 60_000, "WAIT", 10_000,
                 info="RPSEMAPHORE.INFO")
    try:
        mid = call.wait().decode()
        print(f"Java's expired permit went to the module waiter {1000 * call.at - end:.1f} ms after its lease end")
        assert java.acquired_permits() == 1 and java.lease_time(mid) > 59_000
    finally:
        call.close()


def test_a_java_waiter_hears_the_module_timers_reclaim_while_a_module_client_waits(server):
    r = server.client()
    java = RedissonPermitExpirableSemaphore(r, "p")
    p = java_waiter(r, java.channel)
    java.try_set_permits(1)
    assert next_message(p) == b"1"
    r.execute_command("RPSEMAPHORE.ACQUIRE", "p", 200)
    # A module client waits for 2 permits (more than there are): the key has waiters, so
    # the module keeps its lease timer (docs/commands/expirable-semaphore.md, "Expiry at the lease end").
    call = queue(server, r, "p", "RPSEMAPHORE.ACQUIRE", "p", 60_000, "PERMITS", 2,
                 "WAIT", 60_000, info="RPSEMAPHORE.INFO")
    try:
        # No script runs: the module's timer reclaims at the lease end and publishes the
        # count, the queued head being unable to take it.
        assert next_message(p) == b"1"
        assert r.get("p") == b"1"
        assert java.try_acquire(1, lease_ms=1000), "the permit is back for Java"
    finally:
        call.close()
    p.close()


def test_with_nobody_waiting_a_java_waiter_retries_at_the_lease_end_its_script_told(server):
    """The bound of "nothing held while nobody waits": no timer, no reclaim message. A
    Redisson waiter does not need it: its failed acquire answers the earliest lease end,
    and its retry then reclaims the permit (Redisson's own way)."""
    r = server.client()
    java = RedissonPermitExpirableSemaphore(r, "p")
    java.try_set_permits(1)
    r.execute_command("RPSEMAPHORE.ACQUIRE", "p", 200)
    assert r.info("rlock")["rlock_key_timers"] == 0
    assert java.try_acquire(1, lease_ms=1000) == []
    end = int(java.last_reply.lstrip(b":"))
    assert end == int(r.zrange("{p}:timeout", 0, 0, withscores=True)[0][1])
    wait_until(lambda: time.time() * 1000 > end + 1, what="the lease end Java was told")
    assert r.get("p") == b"0", "nothing wrote it back: no timer"
    assert r.execute_command("RPSEMAPHORE.AVAILABLEPERMITS", "p") == 1, "reads count it back"
    assert java.try_acquire(1, lease_ms=1000), "Java's retry reclaims and takes it"
