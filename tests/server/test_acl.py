"""ACLs apply to the RLOCK commands like to any key command (issue 7, hostile input).

On Redis 7.0 module commands have no ACL category, so users are granted them by name; the
key at position 1 is checked against the user's key patterns like any other key.
"""

import pytest

from conftest import wait_until
from hostile_helpers import Raw, ReplyError, rlock_stat


# The server's own ACL refusals: same meaning, each server's words (Valkey names the user).
def noperm_key(server):
    # Redis 8 took Valkey's shorter wording; Redis 7.0 has the long one.
    if server.kind() == "valkey" or server.version() >= (8, 0):
        return "NOPERM No permissions to access a key"
    return "NOPERM this user has no permissions to access one of the keys used as arguments"


def noperm_command(server, user, name):
    # Redis 8 names the user, as Valkey does; Redis 7.0 says "this user".
    if server.kind() == "valkey" or server.version() >= (8, 0):
        return f"NOPERM User {user} has no permissions to run the '{name}' command"
    return f"NOPERM this user has no permissions to run the '{name}' command"


def login(server, user):
    c = Raw(server.port)
    assert c.call("AUTH", user, "pw") == b"OK"
    return c


@pytest.fixture
def clients():
    opened = []
    yield opened
    for c in opened:
        c.close()


def test_a_user_allowed_only_rlock_info_cannot_acquire(server, clients):
    admin = Raw(server.port)
    clients.append(admin)
    assert admin.call("ACL", "SETUSER", "watcher", "on", ">pw", "~*", "+rlock.info") == b"OK"
    assert admin.call("RLOCK.ACQUIRE", "locks:a", "someone", 60000) is None
    watcher = login(server, "watcher")
    clients.append(watcher)

    info = watcher.call("RLOCK.INFO", "locks:a")
    assert info[:2] == [b"owners", [b"someone", 1]]
    for cmd in (("RLOCK.ACQUIRE", "locks:a", "w", 1000),
                ("RLOCK.ACQUIRE", "locks:b", "w", 1000, "WAIT", 10),
                ("RLOCK.RELEASE", "locks:a", "someone"),
                ("RLOCK.RENEW", "locks:a", "someone", 1000),
                ("RLOCK.FORCERELEASE", "locks:a")):
        assert watcher.call(*cmd) == ReplyError(noperm_command(server, "watcher", cmd[0].lower()))
    # Nothing changed: the lock is still someone's, once, and locks:b was never created.
    assert admin.call("HGETALL", "locks:a") == [b"someone", b"1"]
    assert admin.call("EXISTS", "locks:b") == 0


def test_a_user_limited_to_a_key_pattern_locks_only_those_keys(server, clients):
    admin = Raw(server.port)
    clients.append(admin)
    assert admin.call("ACL", "SETUSER", "app", "on", ">pw", "~locks:*",
                      "+rlock.acquire", "+rlock.release", "+rlock.renew",
                      "+rlock.forcerelease", "+rlock.info") == b"OK"
    assert admin.call("RLOCK.ACQUIRE", "other:held", "someone", 60000) is None
    app = login(server, "app")
    clients.append(app)

    assert app.call("RLOCK.ACQUIRE", "locks:a", "app-1", 60000) is None
    assert app.call("RLOCK.ACQUIRE", "locks:a", "app-1", 60000) is None
    assert app.call("RLOCK.RENEW", "locks:a", "app-1", 60000) == 1
    assert app.call("RLOCK.RELEASE", "locks:a", "app-1") == 0
    assert admin.call("HGETALL", "locks:a") == [b"app-1", b"1"]

    for cmd in (("RLOCK.ACQUIRE", "other:a", "app-1", 60000),
                ("RLOCK.ACQUIRE", "other:held", "app-1", 60000, "WAIT", 10),
                ("RLOCK.RELEASE", "other:held", "someone"),
                ("RLOCK.RENEW", "other:held", "someone", 1000),
                ("RLOCK.FORCERELEASE", "other:held"),
                ("RLOCK.INFO", "other:held")):
        assert app.call(*cmd) == ReplyError(noperm_key(server)), cmd
    # Plain commands stay forbidden even on the allowed keys.
    assert app.call("HGETALL", "locks:a") == ReplyError(noperm_command(server, "app", "hgetall"))
    assert app.call("DEL", "locks:a") == ReplyError(noperm_command(server, "app", "del"))
    assert admin.call("EXISTS", "other:a") == 0
    assert admin.call("HGETALL", "other:held") == [b"someone", b"1"]

    # The permitted user can wait for a permitted lock and is handed it.
    assert admin.call("RLOCK.ACQUIRE", "locks:b", "someone", 60000) is None
    app.send("RLOCK.ACQUIRE", "locks:b", "app-2", 60000, "WAIT", 5000)
    wait_until(lambda: rlock_stat(admin, "waiters") == 1, what="app queued for locks:b")
    assert not app.has_reply(0)
    assert admin.call("RLOCK.RELEASE", "locks:b", "someone") == 1
    assert app.read() is None
    assert admin.call("HGETALL", "locks:b") == [b"app-2", b"1"]
    assert app.call("RLOCK.RELEASE", "locks:a", "app-1") == 1
    assert admin.call("EXISTS", "locks:a") == 0
