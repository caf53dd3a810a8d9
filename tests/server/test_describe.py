"""Commands that describe themselves: RLOCK.HELLO (what the module is and can do, asked
by the clients once per connection) on every tested server.

Runs against module-loaded servers (conftest's `make_server`); the cluster's
`sharded-channels` word is checked in test_cluster.py's cluster.
"""

import pytest
import redis

ALWAYS = ["tickets", "request-ids", "lock", "fenced", "rwlock", "semaphore",
          "permit-expirable-semaphore", "latch"]


def test_hello_names_the_module_its_version_protocol_and_features(server):
    resp2 = server.client()
    fields = resp2.execute_command("RLOCK.HELLO")
    # RESP2: flat pairs, keys sorted.
    assert fields[::2] == [b"features", b"module", b"protocol", b"replication", b"version"]
    hello = dict(zip(fields[::2], fields[1::2]))
    assert hello[b"module"] == b"rlock"
    assert hello[b"protocol"] == 1
    assert hello[b"replication"] == b"commands"
    assert [int(p) for p in hello[b"version"].split(b".")]  # major.minor.patch
    assert hello[b"features"] == [w.encode() for w in ALWAYS]
    # RESP3: the same fields as a map.
    resp3 = server.client(protocol=3)
    assert resp3.execute_command("RLOCK.HELLO") == hello


def test_hello_follows_the_replication_setting(r):
    r.config_set("rlock.replication", "effects")
    fields = r.execute_command("RLOCK.HELLO")
    assert dict(zip(fields[::2], fields[1::2]))[b"replication"] == b"effects"


def test_hello_takes_no_argument_and_changes_nothing(r):
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("RLOCK.HELLO", "extra")
    assert r.dbsize() == 0


def test_hello_is_a_keyless_read_only_fast_command_allowed_in_scripts_and_on_replicas(r):
    info = r.execute_command("COMMAND", "INFO", "rlock.hello")["rlock.hello"]
    assert (info["first_key_pos"], info["last_key_pos"], info["step_count"]) == (0, 0, 0)
    assert {"readonly", "fast", "stale", "loading"} <= set(info["flags"])
    assert "noscript" not in info["flags"]
    fields = r.eval("return redis.call('RLOCK.HELLO')", 0)
    assert fields[1] == [w.encode() for w in ALWAYS]


def test_hello_answers_on_a_replica(make_server):
    primary = make_server()
    replica = make_server(args=["--replicaof", "127.0.0.1", str(primary.port)])
    fields = replica.client().execute_command("RLOCK.HELLO")
    assert dict(zip(fields[::2], fields[1::2]))[b"module"] == b"rlock"
