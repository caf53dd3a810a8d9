"""Scripts mode (docs/scripts-mode.md) where it differs from a module-loaded server: what
a managed service does to a client (a restricted user, SCRIPT FLUSH, a failover to a
server without the module), Redisson's way of waiting (one subscriber connection, woken
by the message or at the holder's lease end, no polling), the read lock's undeclared
timeout keys, and interop on one module-loaded server between a scripts-mode client and a
module-mode client. The primitive suites (test_primitives.py, test_lock.py, their asyncio
twins, test_interop.py) run in scripts mode too: `make test-pyclient`, RLOCK_PY_MODE.

Self-contained: it starts its own plain and module-loaded servers, so it runs once, in
the module-mode run.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Iterator

import pytest
import redis
from conftest import scripts_waiters, wait_until
from redis.crc import key_slot
from redis.exceptions import NoPermissionError, ResponseError
from redisson import Redisson
from redisson_rw import RedissonReadWriteLock
from rlock_server import RESTRICTED_USER, RedisServer

import rlock
import rlock._mode
from rlock import _scripts


@pytest.fixture(scope="module")
def plain() -> Iterator[RedisServer]:
    """A server without the module (what a managed service runs), with a restricted user."""
    s = RedisServer(module=False).start()
    s.add_restricted_user()
    yield s
    alive = s.alive()
    s.stop()
    assert alive, "the plain redis-server died during the tests"


@pytest.fixture(scope="module")
def native() -> Iterator[RedisServer]:
    """A module-loaded server of this file's own (the interop tests)."""
    s = RedisServer().start()
    yield s
    alive = s.alive()
    s.stop()
    assert alive, "the module-loaded redis-server died during the tests"


def _clients(server: RedisServer, user: bool):
    made = []

    def make(mode: str = "auto") -> redis.Redis:
        kwargs = {}
        if user:
            kwargs = {"username": RESTRICTED_USER[0], "password": RESTRICTED_USER[1]}
        c = redis.Redis(port=server.port, socket_timeout=5, **kwargs)
        rlock.set_mode(c, mode)
        made.append(c)
        return c
    return make, made


@pytest.fixture
def admin(plain: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis(port=plain.port, socket_timeout=5)
    c.flushall()
    yield c
    c.close()


@pytest.fixture
def app(plain: RedisServer, admin: redis.Redis) -> Iterator:
    """Makes clients logged in as the restricted user (mode ``auto`` unless told)."""
    make, made = _clients(plain, user=True)
    yield make
    for c in made:
        rlock.close_tickets(c)
        c.close()


@pytest.fixture
def on_native(native: RedisServer) -> Iterator:
    """Makes clients of the module-loaded server in the mode asked for."""
    redis.Redis(port=native.port).flushall()
    make, made = _clients(native, user=False)
    yield make
    for c in made:
        rlock.close_tickets(c)
        c.close()


def evalsha_calls(admin: redis.Redis) -> int:
    stats = admin.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def subscribers(admin: redis.Redis) -> int:
    return sum(1 for c in admin.client_list() if c.get("name") == "rlock-py-subscriber")


# ---- a managed service's user and server ------------------------------------------------


def test_a_restricted_user_on_a_server_without_the_module_gets_every_primitive(app):
    r = app()
    for refused in (("MODULE", "LIST"), ("CONFIG", "GET", "maxmemory"),
                    ("CLIENT", "KILL", "ID", 1), ("INFO",)):
        with pytest.raises(NoPermissionError):
            r.execute_command(*refused)
    with pytest.raises(ResponseError):  # refused to the restricted user, and to all here
        r.execute_command("DEBUG", "SLEEP", 0)
    with rlock.Lock(r, "k", timeout=10) as lock:
        assert rlock.get_mode(r) == "scripts"
        assert r.hget("k", lock.local.token) == b"1"  # Redisson's layout
    rw = rlock.RwLock(r, "rw", timeout=10)
    with rw.write, rw.read:
        assert r.hget("rw", "mode") == b"write"
    with rlock.FencedLock(r, "f", timeout=10) as f:
        assert f.token == 1 and r.get("redisson_lock_token:{f}") == b"1"
    sem = rlock.Semaphore(r, "s")
    assert sem.try_set_permits(2) and sem.acquire(2) and sem.release(2) == 2
    pes = rlock.ExpirableSemaphore(r, "p")
    assert pes.try_set_permits(1)
    with pes.acquire(lease=10) as permit:
        assert r.zscore("{p}:timeout", bytes.fromhex(permit.id.decode())) is not None
    latch = rlock.CountDownLatch(r, "l")
    assert latch.try_set_count(1) and latch.count_down() == 0 and latch.wait(0)


def test_module_mode_without_the_module_says_so(app):
    r = app("module")
    with pytest.raises(ResponseError, match="unknown command"):
        rlock.Lock(r, "k", timeout=10).acquire(blocking=False)
    with pytest.raises(ValueError, match="auto, module, scripts"):
        rlock.set_mode(r, "lua")


def test_a_user_refused_the_probe_on_a_module_server_still_finds_the_module(native):
    admin = redis.Redis(port=native.port, socket_timeout=5)
    admin.execute_command("ACL", "SETUSER", "nohello", "on", ">pw", "~*", "&*", "+@all",
                          "-rlock.hello")
    r = redis.Redis(port=native.port, socket_timeout=5, username="nohello", password="pw")
    try:
        with pytest.raises(NoPermissionError):
            r.execute_command("RLOCK.HELLO")
        with rlock.Lock(r, "probe", timeout=10):
            assert rlock.get_mode(r) == "module"  # RLOCK.ACQUIRE without arguments told
    finally:
        rlock.close_tickets(r)
        r.close()
        admin.close()


def test_a_flushed_script_cache_is_loaded_again(app, admin):
    r = app()
    lock = rlock.Lock(r, "k", timeout=10, thread_local=False)
    assert lock.acquire(blocking=False)
    admin.script_flush()  # a failover or SCRIPT FLUSH: EVALSHA answers NOSCRIPT
    lock.release()
    assert not r.exists("k")
    sha = _scripts.script("lock_unlock").sha
    assert admin.script_exists(sha) == [True]  # EVAL cached it again
    admin.script_flush()
    waiter = rlock.Lock(r, "k", timeout=10, thread_local=False)
    holder = rlock.Lock(r, "k", timeout=10, thread_local=False)
    assert holder.acquire(blocking=False)
    out: list = []
    t = threading.Thread(target=lambda: out.append(waiter.acquire(blocking_timeout=10)))
    t.start()
    wait_until(lambda: subscribers(admin) == 1 and t.is_alive(), what="waiter subscribed")
    admin.script_flush()
    holder.release()
    t.join(10)
    assert out == [True]
    waiter.release()


def test_a_failover_to_a_server_without_the_module_and_back_is_probed_again(monkeypatch):
    first = RedisServer().start()
    port = first.port
    r = redis.Redis(port=port, socket_timeout=5)
    try:
        lock = rlock.Lock(r, "k", timeout=10, thread_local=False)
        assert lock.acquire(blocking=False) and rlock.get_mode(r) == "module"
        first.stop()
        second = RedisServer(module=False)
        second.port = port  # the same address, now without the module
        second.start()
        try:
            # The first call after the switch fails on the dead connection (and is
            # retried by the client); the backend is asked again: Redisson's scripts.
            assert rlock.Lock(r, "k", timeout=10).acquire(blocking=False)
            assert rlock.get_mode(r) == "scripts"
            assert r.hlen("k") == 1
        finally:
            second.stop()
        third = RedisServer()
        third.port = port  # and back to a server with the module
        third.start()
        try:
            # redis-py reconnects silently and the scripts work there too: nothing fails,
            # so scripts mode asks again every REPROBE_SECONDS (here: at once).
            monkeypatch.setattr(rlock._mode, "REPROBE_SECONDS", 0.0)
            assert rlock.Lock(r, "k", timeout=10).acquire(blocking=False)
            assert rlock.get_mode(r) == "module"
        finally:
            third.stop()
    finally:
        first.stop()
        rlock.close_tickets(r)
        r.close()


# ---- Redisson's way of waiting -----------------------------------------------------------


def test_a_waiter_wakes_at_the_holders_lease_end_without_a_message_and_without_polling(
        app, admin):
    r = app()
    java = Redisson(r, "k", f"{uuid.uuid4()}:1", lease=800)
    assert java.try_lock() is None  # a holder that dies: no unlock, no message
    lock = rlock.Lock(r, "k", timeout=10, thread_local=False)
    before = evalsha_calls(admin)
    started = time.monotonic()
    assert lock.acquire(blocking_timeout=10)
    assert time.monotonic() - started >= 0.5  # not before the lease ended
    # One try, then one just past the PTTL the try answered (another if the server had
    # not yet expired the key then): a handful, where polling over 0.8 s would be tens.
    assert evalsha_calls(admin) - before <= 5
    lock.release()


def test_all_waits_of_a_client_share_one_subscriber_connection(app, admin):
    r = app()
    holders = [rlock.Lock(r, f"k{i}", timeout=30, thread_local=False) for i in range(20)]
    for h in holders:
        assert h.acquire(blocking=False)
    results: list = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        rlock.Lock(r, f"k{i}", timeout=30).acquire(blocking_timeout=20))) for i in range(20)]
    sem = rlock.Semaphore(r, "s")
    sem.try_set_permits(0)
    threads.append(threading.Thread(
        target=lambda: results.append(sem.acquire(blocking_timeout=20))))
    for t in threads:
        t.start()
    wait_until(lambda: len(admin.pubsub_channels("redisson*")) == 21, what="21 channels")
    assert subscribers(admin) == 1
    for h in holders:
        h.release()
    sem.release()
    for t in threads:
        t.join(20)
    assert results == [True] * 21
    wait_until(lambda: admin.pubsub_channels("redisson*") == [], what="unsubscribed")
    assert subscribers(admin) == 1


def test_a_broken_subscriber_connection_wakes_its_waiters_and_asks_the_mode_again(
        app, admin):
    r = app()
    holder = rlock.Lock(r, "k", timeout=30, thread_local=False)
    assert holder.acquire(blocking=False)
    out: list = []
    t = threading.Thread(target=lambda: out.append(
        rlock.Lock(r, "k", timeout=30).acquire(blocking_timeout=20)))
    t.start()
    wait_until(lambda: admin.pubsub_numsub("redisson_lock__channel:{k}")[0][1] == 1,
               what="waiter subscribed")
    assert rlock.get_mode(r) == "scripts"
    admin.client_kill_filter(_type="pubsub")  # a failover, as the subscriber sees it
    wait_until(lambda: rlock.get_mode(r) is None, what="mode forgotten")
    wait_until(lambda: admin.pubsub_numsub("redisson_lock__channel:{k}")[0][1] == 1,
               what="subscribed again")
    holder.release()  # the message reaches the new subscription: served long before 30 s
    t.join(20)
    assert out == [True] and rlock.get_mode(r) == "scripts"


WAITERS = 10


def test_an_unlock_message_wakes_one_waiter_of_the_client_and_none_is_lost(app, admin):
    """Redisson's LockPubSub: the unlock message wakes one waiter (no herd of script
    runs), and a chain of releases reaches every waiter long before any 60 s lease."""
    r = app()
    holder = rlock.Lock(r, "k", timeout=60, thread_local=False)
    assert holder.acquire(blocking=False)
    order: list = []

    def waiter(i: int) -> None:
        lock = rlock.Lock(r, "k", timeout=60, thread_local=False)
        assert lock.acquire(blocking_timeout=30)
        order.append(i)
        lock.release()

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(WAITERS)]
    for i, t in enumerate(threads):
        t.start()
        wait_until(lambda i=i: scripts_waiters(r) == i + 1, what=f"waiter {i} subscribed")
    before = evalsha_calls(admin)
    holder.release()
    for t in threads:
        t.join(30)
    assert sorted(order) == list(range(WAITERS))
    runs = evalsha_calls(admin) - before
    # WAITERS + 1 releases and WAITERS acquires, and at most a look more per waiter (a
    # message kept for a waiter between two tries: how many depends on the scheduling, 6
    # were seen once on a loaded machine); waking every waiter at each release would add
    # up to 9 + 8 + ... + 1 = 45 tries more.
    assert runs <= 3 * WAITERS + 1


# ---- the read lock's timeout keys ----------------------------------------------------------


@pytest.mark.parametrize("name", ["rw", "{app}:rw", "a{b}c"])
def test_every_key_the_read_lock_scripts_touch_is_in_the_names_slot(app, admin, name):
    """Redisson's read-lock scripts build the per-hold timeout keys from a declared prefix
    instead of declaring them. Scripts mode keeps the scripts as they are (any change
    would not be Redisson's) and relies on the hash tag: every such key is in the name's
    slot, which a cluster accepts (test_cluster.py runs them there)."""
    r = app()
    a, b = rlock.RwLock(r, name, timeout=10), rlock.RwLock(r, name, timeout=10)
    java = RedissonReadWriteLock(r, name, f"{uuid.uuid4()}:1")
    assert a.read.acquire() and a.read.acquire() and b.read.acquire()
    assert java.read_lock() is None
    keys = admin.keys("*")
    assert len(keys) >= 1 + 2 + 1 + 1  # the hash and a timeout key per read hold
    assert {key_slot(k) for k in keys} == {key_slot(name.encode())}
    a.read.release()  # the unlock script reads every reader's timeout keys
    b.read.renew()
    assert {key_slot(k) for k in admin.keys("*")} == {key_slot(name.encode())}


# ---- scripts mode and module mode on one module-loaded server -------------------------------


def test_scripts_and_module_clients_exclude_each_other_and_wake_each_other(on_native):
    scripts, module = on_native("scripts"), on_native("module")
    s_lock = rlock.Lock(scripts, "k", timeout=30, thread_local=False)
    m_lock = rlock.Lock(module, "k", timeout=30, thread_local=False)
    assert s_lock.acquire(blocking=False) and not m_lock.acquire(blocking=False)
    out: list = []
    t = threading.Thread(target=lambda: out.append(m_lock.acquire(blocking_timeout=10)))
    t.start()
    wait_until(lambda: int(module.info("rlock")["rlock_waiters"]) == 1, what="module waiter")
    started = time.monotonic()
    s_lock.release()  # a script deletes the key: the module serves its waiter
    t.join(10)
    assert out == [True] and time.monotonic() - started < 5  # long before the 30 s lease
    t = threading.Thread(target=lambda: out.append(s_lock.acquire(blocking_timeout=10)))
    t.start()
    wait_until(lambda: scripts.pubsub_numsub("redisson_lock__channel:{k}")[0][1] == 1,
               what="scripts waiter subscribed")
    started = time.monotonic()
    m_lock.release()  # the module publishes Redisson's unlock message
    t.join(10)
    assert out == [True, True] and time.monotonic() - started < 5
    s_lock.release()


def test_scripts_and_module_clients_share_each_primitive(on_native):
    scripts, module = on_native("scripts"), on_native("module")
    assert rlock.Semaphore(scripts, "s").try_set_permits(1)
    assert not rlock.Semaphore(module, "s").try_set_permits(5)
    assert rlock.Semaphore(module, "s").acquire(blocking=False)
    assert not rlock.Semaphore(scripts, "s").acquire(blocking=False)
    assert rlock.Semaphore(module, "s").release() == 1
    assert rlock.Semaphore(scripts, "s").acquire(blocking=False)

    assert rlock.ExpirableSemaphore(module, "p").try_set_permits(1)
    permit = rlock.ExpirableSemaphore(scripts, "p").acquire(lease=10)
    assert rlock.ExpirableSemaphore(module, "p").acquire(lease=10, blocking=False) is None
    assert rlock.ExpirableSemaphore(module, "p").release(permit.id) is True
    assert rlock.ExpirableSemaphore(scripts, "p").available_permits() == 1

    f_module = rlock.FencedLock(module, "f", timeout=10)
    f_scripts = rlock.FencedLock(scripts, "f", timeout=10)
    assert f_module.acquire(blocking=False) and not f_scripts.acquire(blocking=False)
    f_module.release()
    assert f_scripts.acquire(blocking=False) and f_scripts.token > f_module.token
    f_scripts.release()

    rw_m, rw_s = rlock.RwLock(module, "rw", timeout=10), rlock.RwLock(scripts, "rw", timeout=10)
    assert rw_m.read.acquire(blocking=False) and rw_s.read.acquire(blocking=False)
    assert not rlock.RwLock(scripts, "rw").write.acquire(blocking=False)
    rw_m.read.release()
    rw_s.read.release()
    assert rw_s.write.acquire(blocking=False) and not rw_m.read.acquire(blocking=False)
    rw_s.write.release()

    latch = rlock.CountDownLatch(module, "l")
    assert latch.try_set_count(2)
    assert rlock.CountDownLatch(scripts, "l").count_down() == 1
    out: list = []
    t = threading.Thread(target=lambda: out.append(rlock.CountDownLatch(scripts, "l").wait(10)))
    t.start()
    wait_until(lambda: scripts.pubsub_numsub(b"redisson_countdownlatch__channel__{l}")[0][1] == 1,
               what="scripts latch waiter subscribed")
    assert latch.count_down() == 0
    t.join(10)
    assert out == [True]
