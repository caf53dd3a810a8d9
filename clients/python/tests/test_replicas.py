"""Replica sync after an acquire (rlock._replicas), against a real primary with a real
replica: on by default it waits for the replica once per acquire, a replica that does not
acknowledge (its process stopped with SIGSTOP) fails the acquire and leaves no lock, a
server without replicas pays only a ``ROLE`` now and then, and ``replica_sync=None`` turns
it off. Module mode only: scripts mode does not check replicas (README, "Replicas and
failover").
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Iterator, Tuple

import pytest
import redis
import redis.asyncio
from conftest import wait_until
from rlock_server import RedisServer

import rlock
import rlock.asyncio

pytestmark = pytest.mark.module_only


def calls(r: Any, command: str) -> int:
    """How many times the server ran ``command`` since the last CONFIG RESETSTAT."""
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


@pytest.fixture(scope="module")
def pair() -> Iterator[Tuple[RedisServer, RedisServer]]:
    """A primary and one replica in sync with it, both with the module."""
    primary = RedisServer().start()
    replica = RedisServer().start()
    try:
        rc = redis.Redis(port=replica.port, socket_timeout=5)
        rc.execute_command("REPLICAOF", "127.0.0.1", primary.port)
        wait_until(lambda: rc.info("replication").get("master_link_status") == "up",
                   timeout=30, what="the replica's link up")
        pc = redis.Redis(port=primary.port, socket_timeout=5)
        wait_until(lambda: pc.execute_command("WAIT", 1, 100) == 1, timeout=30,
                   what="the replica acknowledging")
        rc.close()
        pc.close()
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


@pytest.fixture
def pr(pair: Tuple[RedisServer, RedisServer]) -> Iterator[redis.Redis]:
    """A client of the primary on a flushed database, with its command stats reset."""
    client = redis.Redis(port=pair[0].port, socket_timeout=5)
    client.flushall()
    client.execute_command("WAIT", 1, 5000)  # the flush reached the replica
    client.config_resetstat()
    yield client
    rlock.close_tickets(client)
    client.close()


@pytest.fixture
def replica_client(pair: Tuple[RedisServer, RedisServer]) -> Iterator[redis.Redis]:
    client = redis.Redis(port=pair[1].port, socket_timeout=5)
    yield client
    client.close()


def test_each_acquire_waits_once_and_the_replica_has_the_lock(
        pr: redis.Redis, replica_client: redis.Redis) -> None:
    lock = pr.lock("rs:lock", lock_class=rlock.Lock)
    assert lock.acquire(blocking=False)
    assert calls(pr, "wait") == 1
    # No read of the replica's offset needed: WAIT returned only once it acknowledged.
    assert replica_client.hexists("rs:lock", lock.local.token)
    lock.release()

    fenced = rlock.FencedLock(pr, "rs:fenced")
    assert fenced.acquire(blocking=False)
    assert replica_client.hexists("rs:fenced", fenced.owner)
    rw = rlock.RwLock(pr, "rs:rw")
    assert rw.read.acquire(blocking=False)
    assert replica_client.exists("rs:rw")
    assert calls(pr, "wait") == 3
    assert calls(pr, "role") == 1  # the count is kept for a second
    fenced.release()
    rw.read.release()


async def test_asyncio_waits_too(pair: Tuple[RedisServer, RedisServer],
                                 pr: redis.Redis, replica_client: redis.Redis) -> None:
    client = redis.asyncio.Redis(port=pair[0].port, socket_timeout=5)
    try:
        lock = client.lock("rs:alock", lock_class=rlock.asyncio.Lock)
        assert await lock.acquire(blocking=False)
        assert calls(pr, "wait") == 1
        assert replica_client.hexists("rs:alock", lock.local.token)
        await lock.release()
    finally:
        await rlock.asyncio.aclose_tickets(client)
        await client.aclose()


def test_a_replica_that_does_not_acknowledge_fails_the_acquire_and_leaves_no_lock(
        pair: Tuple[RedisServer, RedisServer], pr: redis.Redis) -> None:
    assert pair[1].proc is not None
    os.kill(pair[1].proc.pid, signal.SIGSTOP)
    try:
        lock = rlock.Lock(pr, "rs:stopped",
                          replica_sync=rlock.ReplicaSync(timeout=0.2))
        with pytest.raises(rlock.ReplicaSyncError) as e:
            lock.acquire(blocking=False)
        assert (e.value.wanted, e.value.acked) == (1, 0)
        assert isinstance(e.value, rlock.LockError)
        assert not pr.exists("rs:stopped")
        assert lock.local.token is None

        fenced = rlock.FencedLock(pr, "rs:stopped-fenced",
                                  replica_sync=rlock.ReplicaSync(timeout=0.2))
        with pytest.raises(rlock.ReplicaSyncError):
            fenced.acquire(blocking=False)
        assert not fenced.held and not pr.exists("rs:stopped-fenced")
    finally:
        os.kill(pair[1].proc.pid, signal.SIGCONT)
    wait_until(lambda: pr.execute_command("WAIT", 1, 100) == 1, timeout=30,
               what="the replica acknowledging again")


def test_a_fixed_count_above_the_replicas_fails(pr: redis.Redis) -> None:
    lock = rlock.Lock(pr, "rs:two",
                      replica_sync=rlock.ReplicaSync(2, timeout=0.1))
    with pytest.raises(rlock.ReplicaSyncError, match="1 of 2"):
        lock.acquire(blocking=False)
    assert not pr.exists("rs:two")
    assert calls(pr, "role") == 0  # a fixed count reads nothing


def test_turned_off_it_neither_waits_nor_reads_role(pr: redis.Redis) -> None:
    lock = rlock.Lock(pr, "rs:off", replica_sync=None)
    rw = rlock.RwLock(pr, "rs:rw-off", replica_sync=None)
    for _ in range(3):
        assert lock.acquire(blocking=False)
        lock.release()
        assert rw.write.acquire(blocking=False)
        rw.write.release()
    assert calls(pr, "wait") == 0 and calls(pr, "role") == 0


def test_without_replicas_no_wait_and_role_about_once_a_second(r: redis.Redis) -> None:
    r.config_resetstat()
    lock = r.lock("rs:alone", lock_class=rlock.Lock)
    started = time.monotonic()
    n = 0
    while time.monotonic() - started < 1.5:
        assert lock.acquire(blocking=False)
        lock.release()
        n += 1
    elapsed = time.monotonic() - started
    assert calls(r, "wait") == 0
    assert 1 <= calls(r, "role") <= int(elapsed) + 1 < n


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        rlock.ReplicaSync(-1)
    with pytest.raises(ValueError):
        rlock.ReplicaSync(timeout=0)


def test_role_replies_are_counted() -> None:
    from rlock._replicas import role_replicas
    master = [b"master", 10, [[b"127.0.0.1", b"7001", b"10"], [b"127.0.0.1", b"7002", b"9"]]]
    assert role_replicas(master) == 2
    assert role_replicas([b"master", 0, []]) == 0
    assert role_replicas([b"slave", b"127.0.0.1", 6379, b"connected", 10]) == 0
    assert role_replicas(None) == 0




def test_a_refused_wait_raises_and_leaves_no_lock(pair: Tuple[RedisServer, RedisServer],
                                                  pr: redis.Redis) -> None:
    pr.execute_command("ACL", "SETUSER", "nowait", "on", ">pw", "~*", "&*", "+@all", "-wait")
    client = redis.Redis(port=pair[0].port, socket_timeout=5, username="nowait",
                         password="pw")
    try:
        lock = rlock.Lock(client, "rs:nowait")
        with pytest.raises(redis.exceptions.NoPermissionError):
            lock.acquire(blocking=False)
        assert not pr.exists("rs:nowait") and lock.local.token is None
    finally:
        rlock.close_tickets(client)
        client.close()
        pr.execute_command("ACL", "DELUSER", "nowait")


@pytest.mark.parametrize("restricted", [False, True])
def test_scripts_mode_waits_after_redissons_script(pair: Tuple[RedisServer, RedisServer],
                                                   pr: redis.Redis,
                                                   replica_client: redis.Redis,
                                                   restricted: bool) -> None:
    """Scripts mode renews with Redisson's script then WAITs, as Redisson; a managed
    service's user (``-@dangerous``: no ROLE) finds no replicas and sends no WAIT."""
    kwargs = {}
    if restricted:
        pr.execute_command("ACL", "SETUSER", "managed", "on", ">pw", "~*", "&*", "+@all",
                           "-@dangerous")
        kwargs = {"username": "managed", "password": "pw"}
    client = redis.Redis(port=pair[0].port, socket_timeout=5, **kwargs)
    rlock.set_mode(client, "scripts")
    try:
        lock = rlock.Lock(client, "rs:scripts")
        assert lock.acquire(blocking=False)
        rw = rlock.RwLock(client, "rs:scripts-rw")
        assert rw.read.acquire(blocking=False)
        assert calls(pr, "rlock.acquire") == 0 and calls(pr, "evalsha") >= 2
        if restricted:
            assert calls(pr, "wait") == 0
        else:
            assert calls(pr, "wait") == 2
            assert replica_client.hexists("rs:scripts", lock.local.token)
            assert replica_client.exists("rs:scripts-rw")
        lock.release()
        rw.read.release()
    finally:
        rlock.close_tickets(client)
        client.close()
        if restricted:
            pr.execute_command("ACL", "DELUSER", "managed")
