"""RSEMAPHORE.* (design.md 4.3, docs/internals/sync-commands.md) against a real module-loaded server:
every command and reply, FIFO waiting (a big request at the head is served before later
small ones), grants in the releasing command's own turn, request ids after lost replies,
replication as plain effects, AOF restart, keyspace notifications, bad input, disconnects.
"""

import pytest
import redis

import errors
from cluster_helpers import snapshot, wait_link_up, wait_online, wait_replicated
from conftest import EFFECTS, wait_until
from hostile_helpers import Raw
from sem_helpers import BlockedCall, info_map, queue, rlock_info, waiters


def sem(r, *args):
    return r.execute_command(*args)


def info(r, key):
    return info_map(r, "RSEMAPHORE.INFO", key)


def test_every_command_and_its_reply(r):
    assert sem(r, "RSEMAPHORE.AVAILABLEPERMITS", "s") == 0, "no key: 0 permits"
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 1) == 0, "no key: nothing to take"
    assert sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 3) == 1
    assert r.get("s") == b"3" and r.pttl("s") == -1
    assert sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 9) == 0, "only where there is no count"
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 2) == 1
    assert r.get("s") == b"1"
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 2) == 0
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 0) == 1, "zero permits are always granted"
    assert sem(r, "RSEMAPHORE.RELEASE", "s", 2) == 3, "the count after the release"
    assert sem(r, "RSEMAPHORE.RELEASE", "s", 0) == 3
    assert sem(r, "RSEMAPHORE.ADDPERMITS", "s", -5) == -2, "Redisson lets it go negative"
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 1) == 0
    assert sem(r, "RSEMAPHORE.DRAINPERMITS", "s") == -2, "the old value, as Redisson"
    assert r.get("s") == b"0"
    assert sem(r, "RSEMAPHORE.ADDPERMITS", "s", 4) == 4
    assert sem(r, "RSEMAPHORE.DRAINPERMITS", "s") == 4
    assert sem(r, "RSEMAPHORE.DRAINPERMITS", "nokey") == 0 and r.exists("nokey") == 0
    assert sem(r, "RSEMAPHORE.RELEASE", "new", 2) == 2, "a release creates the count"
    assert info(r, "s") == {"available": 0, "pttl": -1, "waiters": 0, "waiting_permits": 0}
    assert info(r, "none") == {"available": 0, "pttl": -2, "waiters": 0, "waiting_permits": 0}


def test_try_set_with_a_ttl_and_add_drops_it_as_redisson_does(r):
    assert sem(r, "RSEMAPHORE.TRYSETPERMITS", "t", 2, "PX", 60_000) == 1
    assert 0 < r.pttl("t") <= 60_000
    assert 0 < info(r, "t")["pttl"] <= 60_000
    sem(r, "RSEMAPHORE.ACQUIRE", "t", 1)
    sem(r, "RSEMAPHORE.RELEASE", "t", 1)
    assert r.pttl("t") > 0, "DECRBY/INCRBY keep the TTL"
    sem(r, "RSEMAPHORE.ADDPERMITS", "t", 1)
    assert r.pttl("t") == -1, "ADDPERMITS SETs, which drops it (Redisson's addPermits)"


def test_a_count_written_in_place_grows_and_shrinks_its_digits(r):
    """The count is written over as it lies when its number of digits stays, else resized
    first: every length change, both ways and across the sign, keeps the TTL."""
    assert sem(r, "RSEMAPHORE.TRYSETPERMITS", "d", 10, "PX", 60_000) == 1
    steps = [("ACQUIRE", 1, b"9"), ("ACQUIRE", 1, b"8"), ("RELEASE", 2, b"10"),
             ("RELEASE", 90, b"100"), ("ACQUIRE", 100, b"0"), ("RELEASE", 12345, b"12345"),
             ("ACQUIRE", 12345, b"0"), ("RELEASE", 7, b"7")]
    for op, n, want in steps:
        sem(r, f"RSEMAPHORE.{op}", "d", n)
        assert r.get("d") == want, (op, n)
        assert 0 < r.pttl("d") <= 60_000, (op, n)
    assert sem(r, "RSEMAPHORE.RELEASE", "fresh", 3) == 3 and r.get("fresh") == b"3"
    r.set("enc", 5)  # an int-encoded value, shared with nobody after the write
    assert sem(r, "RSEMAPHORE.RELEASE", "enc", 5) == 10 and r.get("enc") == b"10"
    assert sem(r, "RSEMAPHORE.ACQUIRE", "enc", 1) == 1 and r.get("enc") == b"9"


def test_a_big_request_at_the_head_is_served_before_later_small_ones(server):
    r = server.client()
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 0)
    big = queue(server, r, "s", "RSEMAPHORE.ACQUIRE", "s", 5, "WAIT", 10_000)
    small = queue(server, r, "s", "RSEMAPHORE.ACQUIRE", "s", 1, "WAIT", 10_000)
    try:
        assert info(r, "s")["waiting_permits"] == 6
        for _ in range(4):
            sem(r, "RSEMAPHORE.RELEASE", "s", 1)
        assert r.get("s") == b"4", "4 free, but the head asks for 5: nobody served"
        assert waiters(r, "s") == 2 and not small.done.is_set()
        # A newcomer does not overtake the queue either.
        assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 1) == 0
        sem(r, "RSEMAPHORE.RELEASE", "s", 2)
        assert big.wait() == 1 and small.wait() == 1
        # Both in the release's own turn (the head first: the small one was held back
        # until then), so their replies' arrival order says nothing more.
        assert r.get("s") == b"0"
    finally:
        big.close()
        small.close()


def test_a_release_serves_every_head_it_can_in_its_own_turn(server):
    r = server.client()
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 0)
    calls = [queue(server, r, "s", "RSEMAPHORE.ACQUIRE", "s", n, "WAIT", 10_000) for n in (1, 2, 1, 3)]
    try:
        with r.pipeline(transaction=False) as p:
            p.execute_command("RSEMAPHORE.RELEASE", "s", 5)
            p.execute_command("RSEMAPHORE.INFO", "s")
            p.get("s")
            released, flat, count = p.execute()
        assert released == 5, "the count after the release, before the queue was served"
        # Already done when the next command of the pipeline ran: the same turn.
        assert dict(zip(flat[::2], flat[1::2]))[b"waiters"] == 1
        assert count == b"1"
        assert [c.wait() for c in calls[:3]] == [1, 1, 1]
        assert not calls[3].done.is_set(), "3 asked, 1 left"
        sem(r, "RSEMAPHORE.RELEASE", "s", 2)
        assert calls[3].wait() == 1
        assert rlock_info(r, "sem_granted_after_wait") == 4
    finally:
        for c in calls:
            c.close()


def test_a_wait_times_out_with_0_and_leaves_nothing(server):
    r = server.client()
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 0)
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 1, "WAIT", 50) == 0
    assert waiters(r, "s") == 0 and rlock_info(r, "waiters") == 0
    sem(r, "RSEMAPHORE.RELEASE", "s", 1)
    assert r.get("s") == b"1", "nobody took it"


def test_wait_is_ignored_inside_multi(r):
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 0)
    with r.pipeline(transaction=True) as p:
        p.execute_command("RSEMAPHORE.ACQUIRE", "s", 1, "WAIT", 0)
        assert p.execute() == [0]


def test_a_disconnected_waiter_leaves_nothing_behind(server):
    r = server.client()
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 0)
    call = queue(server, r, "s", "RSEMAPHORE.ACQUIRE", "s", 2, "WAIT", 0)
    r.client_kill_filter(_id=call.client_id)
    wait_until(lambda: waiters(r, "s") == 0, what="waiter gone")
    call.close()
    assert rlock_info(r, "waiters") == 0 and rlock_info(r, "keys_with_waiters") == 0
    sem(r, "RSEMAPHORE.RELEASE", "s", 2)
    assert r.get("s") == b"2", "nothing handed to a ghost"


def test_messages_follow_redisson_capped_by_what_the_queue_left(server):
    r = server.client()
    p = r.pubsub()
    p.subscribe("redisson_sc:{s}")
    wait_until(lambda: p.get_message(timeout=0.1), what="subscribed")
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 2)
    assert wait_until(lambda: p.get_message(timeout=0.1))["data"] == b"2"
    sem(r, "RSEMAPHORE.ACQUIRE", "s", 2)
    call = queue(server, r, "s", "RSEMAPHORE.ACQUIRE", "s", 1, "WAIT", 10_000)
    try:
        sem(r, "RSEMAPHORE.RELEASE", "s", 1)
        assert call.wait() == 1
        sem(r, "RSEMAPHORE.RELEASE", "s", 1)
        # The first release went to the queue: no message; the second is published.
        assert wait_until(lambda: p.get_message(timeout=0.1))["data"] == b"1"
        assert p.get_message(timeout=0.2) is None
    finally:
        call.close()
        p.close()


# ---- request ids -----------------------------------------------------------------------

def test_a_retried_release_never_returns_permits_twice(r):
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 0)
    assert sem(r, "RSEMAPHORE.RELEASE", "s", 2, "ID", "r1") == 2
    assert sem(r, "RSEMAPHORE.RELEASE", "s", 2, "ID", "r1") == 2, "the first reply"
    assert r.get("s") == b"2"
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 1, "ID", "a1") == 1
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 1, "ID", "a1") == 1
    assert r.get("s") == b"1", "taken once"
    assert sem(r, "RSEMAPHORE.ADDPERMITS", "s", 3, "ID", "d1") == 4
    assert sem(r, "RSEMAPHORE.ADDPERMITS", "s", 3, "ID", "d1") == 4
    assert sem(r, "RSEMAPHORE.DRAINPERMITS", "s", "ID", "x1") == 4
    sem(r, "RSEMAPHORE.RELEASE", "s", 1)
    assert sem(r, "RSEMAPHORE.DRAINPERMITS", "s", "ID", "x1") == 4
    assert r.get("s") == b"1", "the drain was not run again"
    # A refused acquire is not remembered: retried, it simply runs again.
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 5, "ID", "a2") == 0
    sem(r, "RSEMAPHORE.RELEASE", "s", 4)
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 5, "ID", "a2") == 1
    assert r.get("rlock_request:{s}:a2") is not None


def test_a_grant_after_waiting_remembers_its_request_id(server):
    r = server.client()
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 0)
    call = queue(server, r, "s", "RSEMAPHORE.ACQUIRE", "s", 2, "WAIT", 10_000, "ID", "w1")
    try:
        sem(r, "RSEMAPHORE.RELEASE", "s", 3)
        assert call.wait() == 1
    finally:
        call.close()
    # The reply was "lost": the retry is told 1 and takes nothing more.
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 2, "WAIT", 1000, "ID", "w1") == 1
    assert r.get("s") == b"1"


def test_a_grant_taken_back_returns_the_permits_and_forgets_the_id(server):
    r = server.client()
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 0)
    call = queue(server, r, "s", "RSEMAPHORE.ACQUIRE", "s", 2, "WAIT", 10_000, "ID", "w7")
    with r.pipeline(transaction=False) as p:
        p.execute_command("RSEMAPHORE.RELEASE", "s", 2)
        p.execute_command("CLIENT", "KILL", "ID", call.client_id)
        p.execute()
    call.close()
    wait_until(lambda: rlock_info(r, "revoked_handoffs") == 1, what="grant taken back")
    assert r.get("s") == b"2", "the permits came back"
    assert r.exists("rlock_request:{s}:w7") == 0
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 2, "ID", "w7") == 1
    assert r.get("s") == b"0", "the retry really acquired"


def test_a_grant_whose_semaphore_was_deleted_and_made_anew_is_not_taken_back_into_it(server):
    """A grant its waiter never learned of is taken back by a release; once its key was
    deleted, what it took went with the key, and the release would give permits to the
    semaphore made anew under the name (found by the Python contenders bench, which
    deletes and initializes its semaphore between runs: "more than 4 holders at once")."""
    r = server.client()
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 0)
    call = queue(server, r, "s", "RSEMAPHORE.ACQUIRE", "s", 2, "WAIT", 10_000, "ID", "w9")
    with r.pipeline(transaction=False) as p:
        p.execute_command("RSEMAPHORE.RELEASE", "s", 2)
        p.execute_command("CLIENT", "KILL", "ID", call.client_id)
        p.execute_command("DEL", "s")
        p.execute_command("RSEMAPHORE.TRYSETPERMITS", "s", 3)
        p.execute()
    call.close()
    wait_until(lambda: settled_grants(r) == 1, what="the grant forgotten or taken back")
    assert rlock_info(r, "revoked_handoffs") == 0, "taken back into the new semaphore"
    assert r.get("s") == b"3"


def test_a_ticket_grant_whose_semaphore_was_deleted_is_not_taken_back_into_a_new_one(server):
    """The same for a ticket whose connection closed unconfirmed: at its grace's end the
    key had been deleted and made anew, so nothing is given back."""
    r = server.client()
    r.config_set("rlock.ticket-confirm-ms", 200)
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 0)
    t = server.client()
    assert t.execute_command("RSEMAPHORE.ACQUIRE", "s", 2, "WAIT", 10_000, "ASYNC",
                             "ID", "w10") == b"QUEUED"
    ticket = t.client_id()
    with r.pipeline(transaction=False) as p:
        p.execute_command("RSEMAPHORE.RELEASE", "s", 2)
        p.execute_command("CLIENT", "KILL", "ID", ticket)
        p.execute()
    sem(r, "DEL", "s")
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 3)
    # Forgotten at once (nothing left to take back when the grace ends), or taken back
    # at the grace's end.
    wait_until(lambda: settled_grants(r) == 1, what="the grant forgotten or taken back")
    assert rlock_info(r, "revoked_handoffs") == 0, "taken back into the new semaphore"
    assert r.get("s") == b"3"


def test_a_quiet_ticket_gets_no_reply_and_is_granted_when_all_its_permits_are_back(server):
    """`ASYNC QUIET` (docs/commands/tickets.md): queued, the ticket gets no reply at all;
    its `granted` message is its answer, once the count covers all it asks for."""
    r = server.client()
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 0)
    c = Raw(server.port)
    c.call("HELLO", "3")
    assert c.call("SUBSCRIBE", "rlock_ticket:{s}")[0] == b"subscribe"
    cmd = ("RSEMAPHORE.ACQUIRE", "s", 2, "WAIT", 10_000, "ASYNC", "QUIET", "ID", "q2")
    c.send_many([cmd, ("RLOCK.HELLO",)])
    assert dict(c.read())[b"module"] == b"rlock", "the fence's reply first"
    assert waiters(r, "s") == 1
    assert sem(r, "RSEMAPHORE.RELEASE", "s", 1) == 1, "one permit back: not enough yet"
    assert c.call("PING") == b"PONG", "no message in between"
    sem(r, "RSEMAPHORE.RELEASE", "s", 1)  # both back: granted in this release
    assert c.read() == [b"message", b"rlock_ticket:{s}", b"granted:2:0:q2"]
    assert r.get("s") == b"0" and waiters(r, "s") == 0
    assert c.call(*cmd) == 1, "confirmed: the grant's reply, replayed"
    # Permits free: a quiet ticket is served at once and answers as without QUIET.
    sem(r, "RSEMAPHORE.RELEASE", "s", 1)
    assert c.call("RSEMAPHORE.ACQUIRE", "s", 1, "WAIT", 0, "ASYNC", "QUIET", "ID", "q3") == 1
    assert c.call("PING") == b"PONG"
    c.close()


def settled_grants(r):
    """Grants taken back or forgotten so far."""
    info = r.info("rlock")
    return info["rlock_revoked_handoffs"] + info.get("rlock_voided_handoffs", 0)


# ---- replication, persistence, keyspace -----------------------------------------------------

MASTER_ARGS = ["--hz", "100", "--repl-diskless-sync-delay", "0"]


def test_a_module_less_replica_holds_the_same_counts(make_server):
    master = make_server("master", args=MASTER_ARGS, module_args=EFFECTS)
    replica = make_server("replica", module=False, args=["--replicaof", "127.0.0.1", str(master.port)])
    m, rc = master.client(), replica.client()
    wait_link_up(rc)
    wait_online(m)
    steps = [("RSEMAPHORE.TRYSETPERMITS", "s", 3, "PX", 60_000), ("RSEMAPHORE.ACQUIRE", "s", 2),
             ("RSEMAPHORE.RELEASE", "s", 1), ("RSEMAPHORE.ADDPERMITS", "s", -1),
             ("RSEMAPHORE.RELEASE", "s", 4, "ID", "r"), ("RSEMAPHORE.DRAINPERMITS", "s"),
             ("RSEMAPHORE.RELEASE", "{app}:s", 1)]
    for step in steps:
        m.execute_command(*step)
        wait_replicated(m, rc)
        for key in ("s", "{app}:s", "rlock_request:{s}:r"):
            assert snapshot(rc, key) == snapshot(m, key), (step, key)
    # A grant after waiting replicates too.
    call = queue(master, m, "s", "RSEMAPHORE.ACQUIRE", "s", 1, "WAIT", 10_000)
    m.execute_command("RSEMAPHORE.RELEASE", "s", 2)
    assert call.wait() == 1
    call.close()
    wait_replicated(m, rc)
    assert rc.get("s") == m.get("s") == b"1"


def test_the_aof_keeps_the_counts_across_a_restart(make_server):
    s = make_server(args=["--appendonly", "yes", "--appendfsync", "always"])
    r = s.client()
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 5, "PX", 600_000)
    sem(r, "RSEMAPHORE.ACQUIRE", "s", 2)
    sem(r, "RSEMAPHORE.RELEASE", "t", 7)
    before = r.execute_command("PEXPIRETIME", "s")
    s.restart()
    r = s.client()
    assert r.get("s") == b"3" and r.get("t") == b"7"
    assert r.execute_command("PEXPIRETIME", "s") == before
    assert sem(r, "RSEMAPHORE.ACQUIRE", "s", 3) == 1


def test_writes_fire_the_keyspace_events_of_the_plain_commands(server):
    r = server.client()
    r.config_set("notify-keyspace-events", "KEA")
    p = r.pubsub()
    p.psubscribe("__keyspace@0__:s")
    wait_until(lambda: p.get_message(timeout=0.1), what="subscribed")
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 3, "PX", 10_000)
    sem(r, "RSEMAPHORE.ACQUIRE", "s", 2)
    sem(r, "RSEMAPHORE.RELEASE", "s", 1)
    sem(r, "RSEMAPHORE.ADDPERMITS", "s", 1)
    sem(r, "RSEMAPHORE.DRAINPERMITS", "s")
    events = []
    wait_until(lambda: events.append(p.get_message(timeout=0.1)) or
               len([e for e in events if e]) >= 6, what="events")
    assert [e["data"] for e in events if e] == [b"set", b"expire", b"decrby", b"incrby", b"set", b"set"]
    p.close()


def test_watch_sees_a_semaphore_write(server):
    r, other = server.client(), server.client()
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 1)
    with r.pipeline() as p:
        p.watch("s")
        sem(other, "RSEMAPHORE.ACQUIRE", "s", 1)
        p.multi()
        p.get("s")
        with pytest.raises(redis.WatchError):
            p.execute()


# ---- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("call,error", [
    (("RSEMAPHORE.ACQUIRE", "s"), "wrong number of arguments for 'rsemaphore.acquire' command"),
    (("RSEMAPHORE.RELEASE", "s"), "wrong number of arguments for 'rsemaphore.release' command"),
    (("RSEMAPHORE.TRYSETPERMITS", "s"), "wrong number of arguments for 'rsemaphore.trysetpermits' command"),
    (("RSEMAPHORE.AVAILABLEPERMITS", "s", "x"), "wrong number of arguments for 'rsemaphore.availablepermits' command"),
    (("RSEMAPHORE.INFO",), "wrong number of arguments for 'rsemaphore.info' command"),
    (("RSEMAPHORE.ACQUIRE", "s", -1), errors.PERMITS),
    (("RSEMAPHORE.ACQUIRE", "s", "x"), errors.PERMITS),
    (("RSEMAPHORE.ACQUIRE", "s", 2**31), errors.PERMITS),
    (("RSEMAPHORE.ACQUIRE", "s", 1, "WAIT", -1), errors.TIMEOUT),
    (("RSEMAPHORE.ACQUIRE", "s", 1, "WAIT"), errors.SYNTAX),
    (("RSEMAPHORE.ACQUIRE", "s", 1, "PX", 10), errors.SYNTAX),
    (("RSEMAPHORE.ACQUIRE", "s", 1, "ID", ""), errors.EMPTY_ID),
    (("RSEMAPHORE.RELEASE", "s", 1, "WAIT", 1), errors.SYNTAX),
    (("RSEMAPHORE.RELEASE", "s", "1.5"), errors.PERMITS),
    (("RSEMAPHORE.ADDPERMITS", "s", -2**31), errors.PERMITS_DELTA),
    (("RSEMAPHORE.TRYSETPERMITS", "s", 1, "PX", 0), errors.TTL),
    (("RSEMAPHORE.DRAINPERMITS", "s", "ID"), errors.SYNTAX),
])
def test_bad_arguments_are_named_and_change_nothing(r, call, error):
    r.set("s", 4)
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command(*call)
    assert errors.text(error) in str(e.value)
    assert r.get("s") == b"4" and r.dbsize() == 1


@pytest.mark.parametrize("setup,error", [
    (lambda r: r.execute_command("RLOCK.ACQUIRE", "s", "owner", 60_000), errors.WRONGTYPE),
    (lambda r: r.rpush("s", 1), errors.WRONGTYPE),
    (lambda r: r.set("s", "many"), errors.NOT_A_SEMAPHORE),
    (lambda r: r.set("s", "1.5"), errors.NOT_A_SEMAPHORE),
])
def test_a_key_that_is_no_semaphore_is_refused_and_untouched(r, setup, error):
    setup(r)
    before = r.dump("s")
    for call in (("RSEMAPHORE.ACQUIRE", "s", 1), ("RSEMAPHORE.RELEASE", "s", 1),
                 ("RSEMAPHORE.ADDPERMITS", "s", 1), ("RSEMAPHORE.DRAINPERMITS", "s"),
                 ("RSEMAPHORE.TRYSETPERMITS", "s", 1), ("RSEMAPHORE.AVAILABLEPERMITS", "s"),
                 ("RSEMAPHORE.INFO", "s")):
        with pytest.raises(redis.ResponseError) as e:
            r.execute_command(*call)
        assert str(e.value) == errors.text(error) or str(e.value) == error
    assert r.dump("s") == before


def test_an_overflowing_release_is_refused(r):
    r.set("s", 2**63 - 1)
    with pytest.raises(redis.ResponseError) as e:
        sem(r, "RSEMAPHORE.RELEASE", "s", 1)
    assert str(e.value) == errors.text(errors.PERMITS_OVERFLOW)
    assert r.get("s") == str(2**63 - 1).encode()


def test_many_waiters_of_many_sizes_all_end_served_in_order(server):
    r = server.client()
    sem(r, "RSEMAPHORE.TRYSETPERMITS", "s", 0)
    sizes = [3, 1, 2, 1, 4, 1]
    calls = [queue(server, r, "s", "RSEMAPHORE.ACQUIRE", "s", n, "WAIT", 20_000) for n in sizes]
    suffixes = {sum(sizes[k:]): len(sizes) - k for k in range(len(sizes) + 1)}
    try:
        for _ in range(sum(sizes)):
            sem(r, "RSEMAPHORE.RELEASE", "s", 1)
            now = info(r, "s")
            # Whatever is still queued is a tail of the arrival order (grants are done
            # within the release's own turn, so INFO right after it is exact).
            assert suffixes.get(now["waiting_permits"]) == now["waiters"], now
        for c in calls:
            assert c.wait() == 1
        assert r.get("s") == b"0"
    finally:
        for c in calls:
            c.close()
