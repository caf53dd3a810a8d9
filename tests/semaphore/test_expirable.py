"""RPSEMAPHORE.* (design.md 4.4, docs/internals/sync-commands.md) against a real module-loaded server:
Redisson's layout (count string, `{name}:timeout` zset of raw ids -> expiry), every
command and reply, permits back in the pool at their lease end by the module's timer
while the key has waiters, by the next write otherwise, request ids, replication, AOF, keyspace events, bad input, disconnects.
"""

import time

import pytest
import redis

import errors
from cluster_helpers import snapshot, wait_link_up, wait_online, wait_replicated
from conftest import EFFECTS, wait_until
from sem_helpers import info_map, queue, rlock_info

NO_LEASE = 922337203685477
INFO = "RPSEMAPHORE.INFO"


def ps(r, *args):
    return r.execute_command(*args)


def info(r, key):
    return info_map(r, INFO, key)


def permits(r, key="p"):
    """The zset as Redisson reads it: hex id -> score."""
    return {m.hex(): int(s) for m, s in r.zrange("{%s}:timeout" % key, 0, -1, withscores=True)}


def test_an_acquire_passes_the_count_keys_ttl_to_the_zset_as_redisson_does(r):
    """The acquire reads the count key where it will write it (one handle): its expiry
    is read there too, and copied to the permit zset, as Redisson's script does."""
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 3)
    ps(r, "RPSEMAPHORE.ACQUIRE", "p", 60_000)
    assert r.pttl("{p}:timeout") == -1, "no TTL on the count key: none on the zset"
    r.pexpireat("p", int(time.time() * 1000) + 20_000)
    ps(r, "RPSEMAPHORE.ACQUIRE", "p", 60_000)
    assert r.pexpiretime("{p}:timeout") == r.pexpiretime("p")
    assert r.get("p") == b"1" and 0 < r.pttl("p") <= 20_000, "the count keeps its TTL"


def test_every_command_and_its_reply(r):
    assert ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 3) == 1
    assert ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 5) == 0
    before = int(time.time() * 1000)
    pid = ps(r, "RPSEMAPHORE.ACQUIRE", "p", 60_000).decode()
    assert len(pid) == 32 and int(pid, 16) >= 0 and pid == pid.lower()
    held = permits(r)
    assert list(held) == [pid] and before + 60_000 <= held[pid] <= int(time.time() * 1000) + 60_000
    assert r.get("p") == b"2"
    two = [i.decode() for i in ps(r, "RPSEMAPHORE.ACQUIRE", "p", -1, "PERMITS", 2)]
    assert len(set(two)) == 2 and all(permits(r)[i] == NO_LEASE for i in two)
    assert ps(r, "RPSEMAPHORE.ACQUIRE", "p", 1000) is None, "none left"
    assert ps(r, "RPSEMAPHORE.AVAILABLEPERMITS", "p") == 0
    assert ps(r, "RPSEMAPHORE.ACQUIREDPERMITS", "p") == 3
    assert 59_000 < ps(r, "RPSEMAPHORE.LEASETIME", "p", pid) <= 60_000
    assert ps(r, "RPSEMAPHORE.LEASETIME", "p", two[0]) == -1
    assert ps(r, "RPSEMAPHORE.LEASETIME", "p", "00" * 16) == -2
    assert ps(r, "RPSEMAPHORE.UPDATELEASETIME", "p", two[0], 5000) == 1
    assert 4000 < ps(r, "RPSEMAPHORE.LEASETIME", "p", two[0]) <= 5000
    assert ps(r, "RPSEMAPHORE.UPDATELEASETIME", "p", "ab" * 16, 5000) == 0
    got = info(r, "p")
    assert got["available"] == 0 and got["acquired"] == 3 and got["permits"] == 3
    assert 4000 < got["next_expiry_ms"] <= 5000 and got["waiters"] == 0
    assert ps(r, "RPSEMAPHORE.RELEASE", "p", pid) == 1
    assert ps(r, "RPSEMAPHORE.RELEASE", "p", pid) == 0, "released already"
    assert ps(r, "RPSEMAPHORE.RELEASE", "p", pid.upper()) == 0, "hex in any case"
    assert r.get("p") == b"1"
    assert ps(r, "RPSEMAPHORE.SETPERMITS", "p", 5) == 3, "available + held = 5"
    assert ps(r, "RPSEMAPHORE.ADDPERMITS", "p", -1) == 2
    assert ps(r, "RPSEMAPHORE.ADDPERMITS", "p", 4) == 6
    assert info(r, "none") == {"available": 0, "acquired": 0, "permits": 0, "next_expiry_ms": -1,
                               "waiters": 0, "waiting_permits": 0}


def big_waiter(server, r, key="p", db_client=None):
    """A client waiting for more permits than there are: the key has waiters (so the module
    keeps its lease timer) and the waiter is never served."""
    return queue(server, db_client or r, key, "RPSEMAPHORE.ACQUIRE", key, 60_000, "PERMITS", 50,
                 "WAIT", 60_000, info=INFO)


def test_an_expired_permit_returns_to_the_pool_at_its_lease_end_without_any_command(server):
    """While the key has waiters (docs/commands/expirable-semaphore.md, "Expiry at the lease end")."""
    r = server.client()
    p = r.pubsub()
    p.subscribe("redisson_sc:{p}")
    wait_until(lambda: p.get_message(timeout=0.1), what="subscribed")
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 1)
    assert wait_until(lambda: p.get_message(timeout=0.1))["data"] == b"1"
    ps(r, "RPSEMAPHORE.ACQUIRE", "p", 150)
    end = list(permits(r).values())[0]
    w = big_waiter(server, r)
    try:
        msg = wait_until(lambda: p.get_message(timeout=0.1), what="the reclaim message")
        got_at = time.time() * 1000
        assert msg["data"] == b"1", "Redisson's reclaim publishes the new count"
        assert got_at >= end - 5, "not before the lease end"
        # Plain reads, no module command: the keys say it is back.
        assert r.get("p") == b"1" and r.zcard("{p}:timeout") == 0
        assert rlock_info(r, "psem_permits_expired") == 1
        print(f"reclaim message {got_at - end:.1f} ms after the lease end")
    finally:
        w.close()
    p.close()


def test_with_nobody_waiting_an_expired_permit_is_back_for_reads_and_the_next_write(server):
    """No timer while nobody waits (design.md 1): the bound is the next command on the key.
    Reads count the permit as available at once; the next write writes it back, with
    Redisson's message."""
    r = server.client()
    p = r.pubsub()
    p.subscribe("redisson_sc:{p}")
    wait_until(lambda: p.get_message(timeout=0.1), what="subscribed")
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 1)
    assert wait_until(lambda: p.get_message(timeout=0.1))["data"] == b"1"
    pid = ps(r, "RPSEMAPHORE.ACQUIRE", "p", 100)
    assert rlock_info(r, "key_timers") == 0
    wait_until(lambda: ps(r, "RPSEMAPHORE.LEASETIME", "p", pid) == -2, what="the lease end")
    assert ps(r, "RPSEMAPHORE.AVAILABLEPERMITS", "p") == 1
    assert ps(r, "RPSEMAPHORE.ACQUIREDPERMITS", "p") == 0
    assert r.get("p") == b"0" and r.zcard("{p}:timeout") == 1, "not written back yet"
    assert p.get_message(timeout=0.2) is None
    ps(r, "RPSEMAPHORE.ADDPERMITS", "p", 1)
    assert r.get("p") == b"2" and r.zcard("{p}:timeout") == 0, "reclaimed by the write"
    assert rlock_info(r, "psem_permits_expired") == 0, "not by the timer"
    assert wait_until(lambda: p.get_message(timeout=0.1))["data"] == b"1", "ADDPERMITS' message"
    p.close()


def test_an_acquire_reclaims_exactly_the_ended_leases_among_many_held(r):
    """An acquire reads only the permits whose lease ended and the earliest lease still
    running, not every permit held (Redisson's script reads the expired range too): the
    ended ones come back, every other permit keeps its id and score, and a new id is
    added."""
    assert ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 50) == 1
    long = [i.decode() for i in ps(r, "RPSEMAPHORE.ACQUIRE", "p", 600_000, "PERMITS", 20)]
    forever = [i.decode() for i in ps(r, "RPSEMAPHORE.ACQUIRE", "p", -1, "PERMITS", 5)]
    short = [i.decode() for i in ps(r, "RPSEMAPHORE.ACQUIRE", "p", 50, "PERMITS", 7)]
    later = ps(r, "RPSEMAPHORE.ACQUIRE", "p", 300_000).decode()
    before = permits(r)
    assert len(before) == 33 and r.get("p") == b"17"
    wait_until(lambda: all(ps(r, "RPSEMAPHORE.LEASETIME", "p", i) == -2 for i in short),
               what="the short leases' end")
    new = ps(r, "RPSEMAPHORE.ACQUIRE", "p", 1000).decode()
    after = permits(r)
    assert set(after) == set(long) | set(forever) | {later, new}
    assert all(after[i] == before[i] for i in long + forever + [later]), "untouched"
    assert r.get("p") == b"23", "17 + 7 reclaimed - 1"
    # The earliest lease still running is the new one: a contended WAIT waits for it.
    assert ps(r, "RPSEMAPHORE.ACQUIRE", "p", 1000, "PERMITS", 30) is None
    got = info(r, "p")
    assert got["acquired"] == 27 and 0 < got["next_expiry_ms"] <= 1000


def test_a_lease_timer_stays_with_the_waiters_through_swapdb(server):
    """Waiters keep their db number (as for the lock); the lease timer runs only where
    somebody waits: after SWAPDB the key's timer is stopped in the db it went to, nobody
    waiting there, and the next write reclaims its expired permit."""
    r = server.client()
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 1)
    pid = ps(r, "RPSEMAPHORE.ACQUIRE", "p", 300)
    assert r.get("p") == b"0"
    w = big_waiter(server, r)
    try:
        assert rlock_info(r, "key_timers") == 1
        r.swapdb(0, 1)
        wait_until(lambda: rlock_info(r, "key_timers") == 0, what="the moved key's timer stopped")
        other = redis.Redis(port=server.port, db=1)
        wait_until(lambda: ps(other, "RPSEMAPHORE.LEASETIME", "p", pid) == -2, what="the lease end")
        assert other.get("p") == b"0", "no timer wrote it back"
        assert ps(other, "RPSEMAPHORE.ADDPERMITS", "p", 1) == 2, "the write reclaims it"
        assert other.zcard("{p}:timeout") == 0
    finally:
        w.close()
    wait_until(lambda: rlock_info(r, "key_timers") == 0, what="no timer left")


def test_an_expired_permit_goes_to_the_first_waiter_at_its_lease_end(server):
    r = server.client()
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 1)
    ps(r, "RPSEMAPHORE.ACQUIRE", "p", 300)
    end = list(permits(r).values())[0]
    first = queue(server, r, "p", "RPSEMAPHORE.ACQUIRE", "p", 60_000, "WAIT", 10_000, info=INFO)
    second = queue(server, r, "p", "RPSEMAPHORE.ACQUIRE", "p", 60_000, "WAIT", 10_000, info=INFO)
    try:
        pid = first.wait().decode()
        delay = first.at * 1000 - end
        print(f"expired permit handed over {delay:.1f} ms after its lease end")
        assert list(permits(r)) == [pid]
        assert r.get("p") == b"0"
        assert not second.done.is_set()
        assert ps(r, "RPSEMAPHORE.RELEASE", "p", pid) == 1
        assert len(second.wait()) == 32
    finally:
        first.close()
        second.close()


def test_fifo_a_big_request_at_the_head_holds_back_a_small_one(server):
    r = server.client()
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 0)
    big = queue(server, r, "p", "RPSEMAPHORE.ACQUIRE", "p", -1, "PERMITS", 3, "WAIT", 10_000, info=INFO)
    small = queue(server, r, "p", "RPSEMAPHORE.ACQUIRE", "p", -1, "WAIT", 10_000, info=INFO)
    try:
        assert info(r, "p")["waiting_permits"] == 4
        ps(r, "RPSEMAPHORE.ADDPERMITS", "p", 2)
        assert ps(r, "RPSEMAPHORE.ACQUIRE", "p", -1) is None, "no overtaking"
        assert info(r, "p")["waiters"] == 2
        ps(r, "RPSEMAPHORE.ADDPERMITS", "p", 2)
        ids = big.wait()
        assert len(ids) == 3 and len(small.wait()) == 32
        assert r.get("p") == b"0" and r.zcard("{p}:timeout") == 4
    finally:
        big.close()
        small.close()


def test_a_timed_out_or_disconnected_waiter_leaves_nothing(server):
    r = server.client()
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 0)
    assert ps(r, "RPSEMAPHORE.ACQUIRE", "p", 1000, "WAIT", 30) is None
    call = queue(server, r, "p", "RPSEMAPHORE.ACQUIRE", "p", 1000, "WAIT", 0, info=INFO)
    r.client_kill_filter(_id=call.client_id)
    wait_until(lambda: info(r, "p")["waiters"] == 0, what="waiter gone")
    call.close()
    ps(r, "RPSEMAPHORE.ADDPERMITS", "p", 1)
    assert r.get("p") == b"1" and r.zcard("{p}:timeout") == 0
    assert rlock_info(r, "waiters") == 0


def test_a_grant_taken_back_releases_its_ids(server):
    r = server.client()
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 0)
    call = queue(server, r, "p", "RPSEMAPHORE.ACQUIRE", "p", -1, "PERMITS", 2, "WAIT", 10_000,
                 "ID", "w1", info=INFO)
    with r.pipeline(transaction=False) as p:
        p.execute_command("RPSEMAPHORE.ADDPERMITS", "p", 2)
        p.execute_command("CLIENT", "KILL", "ID", call.client_id)
        p.execute()
    call.close()
    wait_until(lambda: r.get("p") == b"2", what="permits back")
    assert r.zcard("{p}:timeout") == 0 and r.exists("rlock_request:{p}:w1") == 0


def test_request_ids_replay_the_first_reply(r):
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 2)
    first = ps(r, "RPSEMAPHORE.ACQUIRE", "p", 60_000, "ID", "a")
    assert ps(r, "RPSEMAPHORE.ACQUIRE", "p", 60_000, "ID", "a") == first
    many = ps(r, "RPSEMAPHORE.ACQUIRE", "p", 60_000, "PERMITS", 1, "ID", "b")
    assert ps(r, "RPSEMAPHORE.ACQUIRE", "p", 60_000, "PERMITS", 1, "ID", "b") == many
    assert r.get("p") == b"0" and r.zcard("{p}:timeout") == 2
    assert ps(r, "RPSEMAPHORE.RELEASE", "p", first, "ID", "c") == 1
    assert ps(r, "RPSEMAPHORE.RELEASE", "p", first, "ID", "c") == 1, "the first reply"
    assert r.get("p") == b"1"
    assert ps(r, "RPSEMAPHORE.ADDPERMITS", "p", 2, "ID", "d") == 3
    assert ps(r, "RPSEMAPHORE.ADDPERMITS", "p", 2, "ID", "d") == 3
    assert r.get("p") == b"3"


def test_a_grant_after_waiting_remembers_its_ids(server):
    r = server.client()
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 0)
    call = queue(server, r, "p", "RPSEMAPHORE.ACQUIRE", "p", 60_000, "WAIT", 10_000, "ID", "w",
                 info=INFO)
    try:
        ps(r, "RPSEMAPHORE.ADDPERMITS", "p", 1)
        pid = call.wait()
    finally:
        call.close()
    assert ps(r, "RPSEMAPHORE.ACQUIRE", "p", 60_000, "WAIT", 100, "ID", "w") == pid
    assert r.zcard("{p}:timeout") == 1


MASTER_ARGS = ["--hz", "100", "--repl-diskless-sync-delay", "0"]


def test_a_module_less_replica_holds_the_same_keys_after_each_step_and_the_timer(make_server):
    master = make_server("master", args=MASTER_ARGS, module_args=EFFECTS)
    replica = make_server("replica", module=False, args=["--replicaof", "127.0.0.1", str(master.port)])
    m, rc = master.client(), replica.client()
    wait_link_up(rc)
    wait_online(m)

    def same():
        wait_replicated(m, rc)
        for key in ("p", "{p}:timeout"):
            assert snapshot(rc, key) == snapshot(m, key), key
        assert rc.zrange("{p}:timeout", 0, -1, withscores=True) == m.zrange("{p}:timeout", 0, -1, withscores=True)

    ps(m, "RPSEMAPHORE.TRYSETPERMITS", "p", 4)
    same()
    a = ps(m, "RPSEMAPHORE.ACQUIRE", "p", 60_000)
    same()
    ps(m, "RPSEMAPHORE.ACQUIRE", "p", -1, "PERMITS", 2)
    same()
    ps(m, "RPSEMAPHORE.UPDATELEASETIME", "p", a, 120)
    same()
    # Nobody waits: no timer; the next write reclaims the short lease.
    wait_until(lambda: ps(m, "RPSEMAPHORE.LEASETIME", "p", a) == -2, what="the lease end")
    assert m.zcard("{p}:timeout") == 3
    ps(m, "RPSEMAPHORE.SETPERMITS", "p", 6)
    assert m.zcard("{p}:timeout") == 2
    same()
    ps(m, "RPSEMAPHORE.ADDPERMITS", "p", -1)
    same()
    assert rc.get("p") == m.get("p")


def test_the_aof_keeps_permits_and_leases_and_a_late_reclaim_still_happens(make_server):
    s = make_server(args=["--appendonly", "yes", "--appendfsync", "always"])
    r = s.client()
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 3)
    long_id = ps(r, "RPSEMAPHORE.ACQUIRE", "p", 600_000)
    ps(r, "RPSEMAPHORE.ACQUIRE", "p", -1)
    short_id = ps(r, "RPSEMAPHORE.ACQUIRE", "p", 400)
    before = permits(r)
    s.restart()
    r = s.client()
    after = permits(r)
    # The short lease may have run out during the restart; the others are kept exactly.
    assert {k: v for k, v in after.items() if k != short_id.decode()} == \
           {k: v for k, v in before.items() if k != short_id.decode()}
    assert ps(r, "RPSEMAPHORE.LEASETIME", "p", long_id) > 500_000
    # Reads count the short lease back once it ends; the next write reclaims it.
    wait_until(lambda: ps(r, "RPSEMAPHORE.AVAILABLEPERMITS", "p") == 1,
               what="the short permit back for reads after the restart")
    assert ps(r, "RPSEMAPHORE.ACQUIREDPERMITS", "p") == 2
    assert ps(r, "RPSEMAPHORE.UPDATELEASETIME", "p", long_id, 600_000) == 1
    assert r.get("p") == b"1" and r.zcard("{p}:timeout") == 2


def test_writes_fire_the_keyspace_events_of_redissons_commands(server):
    r = server.client()
    r.config_set("notify-keyspace-events", "KEA")
    p = r.pubsub()
    p.psubscribe("__keyspace@0__:*p*")
    wait_until(lambda: p.get_message(timeout=0.1), what="subscribed")
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 1)
    pid = ps(r, "RPSEMAPHORE.ACQUIRE", "p", 60_000)
    ps(r, "RPSEMAPHORE.RELEASE", "p", pid)
    events = []
    wait_until(lambda: events.append(p.get_message(timeout=0.1)) or
               len([e for e in events if e]) >= 5, what="events")
    got = [(e["channel"].decode().split(":", 1)[1], e["data"]) for e in events if e]
    assert got == [("p", b"set"), ("p", b"decrby"), ("{p}:timeout", b"zadd"),
                   ("{p}:timeout", b"zrem"), ("p", b"incrby")]
    p.close()


@pytest.mark.parametrize("call,error", [
    (("RPSEMAPHORE.ACQUIRE", "p"), "wrong number of arguments for 'rpsemaphore.acquire' command"),
    (("RPSEMAPHORE.UPDATELEASETIME", "p", "00"), "wrong number of arguments for 'rpsemaphore.updateleasetime' command"),
    (("RPSEMAPHORE.LEASETIME", "p"), "wrong number of arguments for 'rpsemaphore.leasetime' command"),
    (("RPSEMAPHORE.ACQUIRE", "p", 0), errors.PERMIT_LEASE),
    (("RPSEMAPHORE.ACQUIRE", "p", -2), errors.PERMIT_LEASE),
    (("RPSEMAPHORE.ACQUIRE", "p", 100, "PERMITS", 0), errors.PERMIT_COUNT),
    (("RPSEMAPHORE.ACQUIRE", "p", 100, "PERMITS", 1025), errors.PERMIT_COUNT),
    (("RPSEMAPHORE.ACQUIRE", "p", 100, "WAIT", "x"), errors.TIMEOUT),
    (("RPSEMAPHORE.ACQUIRE", "p", 100, "PX", 1), errors.SYNTAX),
    (("RPSEMAPHORE.RELEASE", "p", "xyz"), errors.PERMIT_ID),
    (("RPSEMAPHORE.RELEASE", "p", "abc"), errors.PERMIT_ID),
    (("RPSEMAPHORE.RELEASE", "p", "00", "WAIT", 1), errors.SYNTAX),
    (("RPSEMAPHORE.UPDATELEASETIME", "p", "00", 0), errors.PERMIT_LEASE),
    (("RPSEMAPHORE.LEASETIME", "p", ""), errors.PERMIT_ID),
    (("RPSEMAPHORE.SETPERMITS", "p", -1), errors.PERMITS),
    (("RPSEMAPHORE.ADDPERMITS", "p", "1e3"), errors.PERMITS_DELTA),
])
def test_bad_arguments_are_named_and_change_nothing(r, call, error):
    r.set("p", 2)
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command(*call)
    assert errors.text(error) in str(e.value)
    assert r.get("p") == b"2" and r.dbsize() == 1


@pytest.mark.parametrize("setup,error", [
    (lambda r: r.execute_command("RLOCK.ACQUIRE", "p", "owner", 60_000), errors.WRONGTYPE),
    (lambda r: r.set("{p}:timeout", "x"), errors.WRONGTYPE),
    (lambda r: r.set("p", "many"), errors.NOT_A_SEMAPHORE),
    (lambda r: r.zadd("{p}:timeout", {"\x01": 1.5}), errors.NOT_A_PERMIT_SET),
    (lambda r: r.zadd("{p}:timeout", {"\x01": -3}), errors.NOT_A_PERMIT_SET),
])
def test_keys_that_are_no_permit_semaphore_are_refused_and_untouched(r, setup, error):
    setup(r)
    before = {k: r.dump(k) for k in (b"p", b"{p}:timeout")}
    for call in (("RPSEMAPHORE.ACQUIRE", "p", 100), ("RPSEMAPHORE.RELEASE", "p", "01"),
                 ("RPSEMAPHORE.ADDPERMITS", "p", 1), ("RPSEMAPHORE.SETPERMITS", "p", 1),
                 ("RPSEMAPHORE.UPDATELEASETIME", "p", "01", 10),
                 ("RPSEMAPHORE.AVAILABLEPERMITS", "p"), ("RPSEMAPHORE.INFO", "p")):
        with pytest.raises(redis.ResponseError) as e:
            r.execute_command(*call)
        assert str(e.value) in (error, errors.text(error))
    assert {k: r.dump(k) for k in before} == before


def test_lease_timers_run_only_while_the_key_has_waiters(server):
    r = server.client()
    ps(r, "RPSEMAPHORE.TRYSETPERMITS", "p", 2)
    a = ps(r, "RPSEMAPHORE.ACQUIRE", "p", 600_000)
    b = ps(r, "RPSEMAPHORE.ACQUIRE", "p", 300_000)
    assert rlock_info(r, "key_timers") == 0, "nobody waits: no timer"
    w = big_waiter(server, r)
    try:
        assert rlock_info(r, "key_timers") == 1, "one timer per key, at the earliest lease end"
        ps(r, "RPSEMAPHORE.RELEASE", "p", b)
        assert rlock_info(r, "key_timers") == 1
        ps(r, "RPSEMAPHORE.UPDATELEASETIME", "p", a, -1)
        assert rlock_info(r, "key_timers") == 0, "no lease left: the timer is stopped"
        ps(r, "RPSEMAPHORE.UPDATELEASETIME", "p", a, 600_000)
        assert rlock_info(r, "key_timers") == 1
    finally:
        w.close()
    wait_until(lambda: rlock_info(r, "waiters") == 0, what="the waiter gone")
    assert rlock_info(r, "key_timers") == 0, "the last waiter left: the timer is stopped"
    # The idle check runs in a turn of the event loop after the last waiter left.
    wait_until(lambda: rlock_info(r, "watching") == 0, what="watching stopped")
    assert r.execute_command("MODULE", "UNLOAD", "rlock") == b"OK"
