"""SWAPDB exchanges two databases without per-key events; waiters keep their db number,
so the lock they wait for may be free after the swap, and must be handed over at once."""

import threading

from conftest import someone_waits, wait_until
from redisson import channel


def test_a_waiter_is_served_when_swapdb_brings_a_free_key(server):
    r = server.client()
    # A lock without TTL: only the swap can free it for the waiter.
    r.hset("k", "holder", 1)
    got = {}
    w = server.client()
    t = threading.Thread(target=lambda: got.update(
        reply=w.execute_command("RLOCK.ACQUIRE", "k", "waiter", 10_000, "WAIT", 10_000)))
    t.start()
    wait_until(lambda: r.info("rlock")["rlock_waiters"] == 1, what="waiter queued")
    r.swapdb(0, 3)
    t.join(5)
    assert not t.is_alive() and got["reply"] is None
    assert r.hgetall("k") == {b"waiter": b"1"}
    r3 = server.client(db=3)
    assert r3.hgetall("k") == {b"holder": b"1"}, "the old lock moved to db 3 untouched"


def test_a_lock_moved_away_by_swapdb_publishes_its_unlock_message(server):
    r = server.client()
    someone_waits(server, db=1)  # the module watches (docs/design.md 1, "nothing held while nobody waits")
    p = server.client().pubsub()
    p.subscribe(channel("k"))
    wait_until(lambda: p.get_message(timeout=0.1), what="subscribed")
    r.execute_command("RLOCK.ACQUIRE", "k", "holder", 30_000)
    r.swapdb(0, 5)
    msg = wait_until(lambda: p.get_message(timeout=0.1), what="unlock message")
    assert msg["data"] == b"0"
    # The lock, now in db 5, is still tracked there: releasing it publishes again.
    r5 = server.client(db=5)
    assert r5.execute_command("RLOCK.RELEASE", "k", "holder") == 1
    assert wait_until(lambda: p.get_message(timeout=0.1), what="second message")["data"] == b"0"
    p.close()
