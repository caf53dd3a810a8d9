"""Scripts mode never applies a script that must not run twice twice (issue 39): a
connection that breaks after such a script was sent and before its reply was read leaves
the server changed exactly once and the call raises `rlock.OutcomeUnknown`; a failure
before the write (no connection) is retried. The breaks come from test doubles of
redis-py's connection class (below), on a real server without the module; the decision
per script is `rlock._scripts.MAY_RETRY` (docs/scripts-mode.md, "Retries").

Self-contained: it starts its own server without the module, so it runs once, in the
module-mode run.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import pytest
import redis
import redis.asyncio
from redis.exceptions import ConnectionError
from rlock_server import RedisServer

import rlock
import rlock.asyncio as arlock
from rlock import _scripts

#: What the doubles do: count the runs of the script "watch" (its EVALSHA or EVAL answered
#: without an error) in "runs", and drop the reply of the next such run while "drop";
#: fail the next "refuse" connects.
FAULT: Dict[str, Any] = {"watch": None, "drop": False, "runs": 0, "refuse": 0}


def _script_of(args: tuple) -> Optional[str]:
    if not args or str(args[0]).upper() not in ("EVALSHA", "EVAL"):
        return None
    body = args[1].decode() if isinstance(args[1], bytes) else str(args[1])
    for name in _scripts.MAY_RETRY:
        s = _scripts.script(name)
        if body in (s.sha, s.text):
            return name
    return None


def _watched(args: tuple) -> bool:
    return FAULT["watch"] is not None and _script_of(args) == FAULT["watch"]


def _ran() -> bool:
    """A watched script ran; True if its reply is to be lost."""
    FAULT["runs"] += 1
    lose, FAULT["drop"] = FAULT["drop"], False
    return lose


def arm(script: str) -> None:
    FAULT.update(watch=script, drop=True, runs=0)


class LossyConnection(redis.Connection):
    """Sends as usual; the reply of the armed script is lost (the server did run it)."""

    def connect(self) -> None:
        if FAULT["refuse"] > 0:
            FAULT["refuse"] -= 1
            raise ConnectionError("test: connection refused")
        super().connect()

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        self._watched = _watched(args)
        super().send_command(*args, **kwargs)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        reply = super().read_response(*args, **kwargs)  # NOSCRIPT: raised, not a run
        if getattr(self, "_watched", False):
            self._watched = False
            if _ran():  # the server ran it; its reply is lost with the connection
                self.disconnect()
                raise ConnectionError("test: connection closed after the write")
        return reply


class AsyncLossyConnection(redis.asyncio.Connection):
    """`LossyConnection` for asyncio."""

    async def connect(self) -> None:
        if FAULT["refuse"] > 0:
            FAULT["refuse"] -= 1
            raise ConnectionError("test: connection refused")
        await super().connect()

    async def send_command(self, *args: Any, **kwargs: Any) -> None:
        self._watched = _watched(args)
        await super().send_command(*args, **kwargs)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        reply = await super().read_response(*args, **kwargs)
        if getattr(self, "_watched", False):
            self._watched = False
            if _ran():
                await self.disconnect()
                raise ConnectionError("test: connection closed after the write")
        return reply


@pytest.fixture(scope="module")
def plain() -> Iterator[RedisServer]:
    s = RedisServer(module=False).start()
    yield s
    alive = s.alive()
    s.stop()
    assert alive, "the plain redis-server died during the tests"


@pytest.fixture
def admin(plain: RedisServer) -> Iterator[redis.Redis]:
    FAULT.update(watch=None, drop=False, runs=0, refuse=0)
    c = redis.Redis(port=plain.port, socket_timeout=5)
    c.flushall()
    yield c
    c.close()


@pytest.fixture
def lossy(plain: RedisServer, admin: redis.Redis) -> Iterator[redis.Redis]:
    pool = redis.ConnectionPool(port=plain.port, socket_timeout=5,
                                connection_class=LossyConnection)
    c = redis.Redis(connection_pool=pool)
    rlock.set_mode(c, "scripts")
    yield c
    c.close()
    pool.disconnect()


def test_a_lost_release_reply_adds_the_permits_once_and_says_the_outcome_is_unknown(
        lossy, admin):
    sem = rlock.Semaphore(lossy, "s")
    assert sem.try_set_permits(3)
    assert sem.acquire(1)
    arm("semaphore_release")
    with pytest.raises(rlock.OutcomeUnknown):
        sem.release(1)
    assert FAULT["runs"] == 1  # not sent again
    assert admin.get("s") == b"3"  # applied exactly once: no permit beyond the count
    assert sem.release(0) == 3  # the client goes on


def test_a_lost_add_permits_reply_adds_them_once(lossy, admin):
    sem = rlock.Semaphore(lossy, "s")
    assert sem.try_set_permits(1)
    arm("semaphore_add")
    with pytest.raises(rlock.OutcomeUnknown):
        sem.add_permits(2)
    assert FAULT["runs"] == 1 and admin.get("s") == b"3"


def test_a_lost_count_down_reply_counts_once(lossy, admin):
    latch = rlock.CountDownLatch(lossy, "l")
    assert latch.try_set_count(2)
    arm("latch_count_down")
    with pytest.raises(rlock.OutcomeUnknown):
        latch.count_down()
    assert FAULT["runs"] == 1
    assert admin.get("l") == b"1"  # one count down, not two: awaiters not released early
    assert latch.get_count() == 1


def test_a_lost_lock_acquire_reply_is_not_a_second_hold(lossy, admin):
    lock = rlock.FencedLock(lossy, "k", timeout=10)
    arm("fenced_acquire_token")
    with pytest.raises(rlock.OutcomeUnknown):
        lock.acquire(blocking=False)
    assert FAULT["runs"] == 1
    assert list(admin.hgetall("k").values()) == [b"1"]  # one hold, not two


def test_a_lost_unlock_reply_is_retried_under_its_request_id(lossy, admin):
    # The unlock scripts may retry (Redisson's unlock latch answers the re-run).
    lock = rlock.FencedLock(lossy, "k", timeout=10)
    assert lock.acquire(blocking=False)
    arm("lock_unlock")
    lock.release()
    assert FAULT["runs"] == 2 and not admin.exists("k")  # sent again; released once


def test_a_failure_before_the_write_is_retried(lossy, admin):
    sem = rlock.Semaphore(lossy, "s")
    assert sem.try_set_permits(0)
    lossy.connection_pool.disconnect()  # the next command connects anew
    FAULT["refuse"] = 1
    assert sem.release(1) == 1  # refused once, then sent once
    assert FAULT["refuse"] == 0 and admin.get("s") == b"1"


async def test_asyncio_a_lost_release_reply_adds_the_permits_once(plain, admin):
    pool = redis.asyncio.ConnectionPool(port=plain.port, socket_timeout=5,
                                        connection_class=AsyncLossyConnection)
    c = redis.asyncio.Redis(connection_pool=pool)
    rlock.set_mode(c, "scripts")
    try:
        sem = arlock.Semaphore(c, "s")
        assert await sem.try_set_permits(1)
        arm("semaphore_release")
        with pytest.raises(rlock.OutcomeUnknown):
            await sem.release(1)
        assert FAULT["runs"] == 1 and admin.get("s") == b"2"
        latch = arlock.CountDownLatch(c, "l")
        assert await latch.try_set_count(2)
        arm("latch_count_down")
        with pytest.raises(rlock.OutcomeUnknown):
            await latch.count_down()
        assert FAULT["runs"] == 1 and admin.get("l") == b"1"
        await pool.disconnect()
        FAULT["refuse"] = 1
        assert await sem.release(1) == 3  # refused before the write: retried
        assert FAULT["refuse"] == 0
    finally:
        await c.aclose()
        await pool.disconnect()
