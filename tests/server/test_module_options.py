"""Issue 37, part 1 (design.md 10): loading rlock turns off no server feature.

A server turns some of its own features off while any loaded module has not declared that
it handles them (`SetModuleOptions`). rlock declares, where the server knows the bit
(src/server/ffi/options.rs; docs/internals/server-options.md for every option):
- `HANDLE_REPL_ASYNC_LOAD` (Redis 7.0+, Valkey): a replica with
  `repl-diskless-load swapdb` loads its primary's snapshot from the socket while serving
  the old data, instead of "Skipping diskless-load because there are modules that are not
  aware of async replication";
- `HANDLE_ATOMIC_SLOT_MIGRATION` (Valkey 9.0+): `CLUSTER MIGRATESLOTS` is accepted, not
  refused with "The module rlock does not support atomic slot migrations".
It does not declare `HANDLE_IO_ERRORS`: the server asks that only of modules with a data
type, and rlock has none, so diskless loading (`on-empty-db`) works either way.

Each test runs the feature with the declarations and again with
`rlock.declare-server-options no` (the module then declares none of them), to show that
the declaration is what turns the feature on. Replicas compare DUMP and PEXPIRETIME of every
key with their primary's.
"""

import re

import pytest

from cluster_helpers import (cluster_port, info_field, snapshot, wait_link_up,
                             wait_online, wait_replicated)
from conftest import RedisServer, wait_until

LEASE = 60000
SKIP_ASYNC = b"Skipping diskless-load because there are modules that are not aware of async"
SKIP_IO = b"Skipping diskless-load because there are modules that don't handle read errors"
# Both servers' wording ("master" on Redis, "primary" on Valkey): the snapshot streamed
# to the parser (diskless) or to a file on disk first; swapdb's swap of the loaded data.
FROM_SOCKET = re.compile(rb"REPLICA sync: receiving streamed RDB from \w+ with EOF to parser")
TO_DISK = re.compile(rb"REPLICA sync: receiving streamed RDB from \w+ with EOF to disk")
SWAPPED = b"Swapping active DB with loaded DB"


def declaring(declare):
    """The module arguments for a server whose rlock declares its options, or not."""
    return [] if declare else ["declare-server-options", "no"]


def fill(c):
    """A key of every primitive, with leases, on a primary."""
    c.execute_command("RLOCK.ACQUIRE", "lock", "o", LEASE)
    c.execute_command("RLOCK.ACQUIRE", "lock", "o", LEASE)
    c.execute_command("RRWLOCK.ACQUIRE", "rw", "READ", "r1", LEASE)
    c.execute_command("RFENCED.ACQUIRE", "fenced", "f", LEASE)
    c.execute_command("RSEMAPHORE.TRYSETPERMITS", "sem", 3)
    c.execute_command("RSEMAPHORE.ACQUIRE", "sem", 1)
    c.execute_command("RPSEMAPHORE.TRYSETPERMITS", "psem", 2)
    c.execute_command("RPSEMAPHORE.ACQUIRE", "psem", LEASE)
    c.execute_command("RLATCH.TRYSETCOUNT", "latch", 2)


def everything(c):
    return {k: snapshot(c, k) for k in sorted(c.keys("*"))}


def sync_replica(make_server, mode, declare):
    """A primary with every primitive's keys, then a replica with `repl-diskless-load
    mode` that syncs from it; returns (primary client, replica client, replica server)."""
    primary = make_server("primary", module_args=declaring(declare), args=[
        "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"])
    p = primary.client()
    fill(p)
    replica = make_server("replica", module_args=declaring(declare), args=[
        "--repl-diskless-load", mode])
    r = replica.client()
    if mode == "swapdb":
        r.set("old", "data")  # swapdb serves the old data while the new loads
    r.execute_command("REPLICAOF", "127.0.0.1", primary.port)
    wait_link_up(r)
    wait_online(p)
    wait_replicated(p, r)
    return p, r, replica


@pytest.mark.parametrize("declare", [True, False], ids=["declared", "not-declared"])
def test_a_replica_loads_async_from_the_socket_only_where_rlock_declares_it(
        make_server, declare):
    p, r, replica = sync_replica(make_server, "swapdb", declare)
    log = replica.log.read_bytes()
    assert everything(r) == everything(p), "the replica holds the primary's keys exactly"
    if declare:
        assert SKIP_ASYNC not in log
        assert FROM_SOCKET.search(log) and SWAPPED in log, "loaded async from the socket"
    else:
        assert SKIP_ASYNC in log, "without the declaration the server skips async loading"
        assert TO_DISK.search(log) and not FROM_SOCKET.search(log)


@pytest.mark.parametrize("declare", [True, False], ids=["declared", "not-declared"])
def test_a_replica_loads_diskless_with_or_without_io_errors_declared(make_server, declare):
    """`HANDLE_IO_ERRORS` is asked only of modules with a data type: rlock declares it
    never, and diskless loading into an empty replica works whatever it declares."""
    p, r, replica = sync_replica(make_server, "on-empty-db", declare)
    log = replica.log.read_bytes()
    assert SKIP_IO not in log and SKIP_ASYNC not in log
    assert FROM_SOCKET.search(log) and not TO_DISK.search(log), "loaded from the socket"
    assert everything(r) == everything(p)


def test_the_declaration_switch_is_fixed_at_load(server):
    r = server.client()
    assert r.config_get("rlock.declare-server-options") == {
        "rlock.declare-server-options": "yes"}
    with pytest.raises(Exception, match="(?i)immutable|protected|can't set"):
        r.config_set("rlock.declare-server-options", "no")


# ---------------------------------------------------------------------------------------
# Atomic slot migration (Valkey 9.0+)


def cluster_node(tmp_path, name, declare):
    s = RedisServer(tmp_path / name, module=True, module_args=declaring(declare), args=[
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"])
    s.port = cluster_port()
    return s.start()


@pytest.fixture
def valkey9(server):
    if server.kind() != "valkey" or server.version() < (9, 0):
        pytest.skip("atomic slot migration (CLUSTER MIGRATESLOTS) is Valkey 9.0+")


REFUSAL = "does not support atomic slot migrations"


@pytest.mark.parametrize("declare", [True, False], ids=["declared", "not-declared"])
def test_migrateslots_is_refused_only_where_rlock_does_not_declare_it(
        valkey9, tmp_path, declare):
    """The server checks every module's declaration before anything else: on a one-node
    cluster the refusal, or, declared, the next check (the unknown target node). The whole
    migration, with every primitive's state, is tests/server/test_slot_migration.py."""
    node = cluster_node(tmp_path, "n", declare)
    try:
        c = node.client()
        c.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        with pytest.raises(Exception) as refused:
            c.execute_command("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", 0, 0,
                              "NODE", "f" * 40)
        if declare:
            assert REFUSAL not in str(refused.value)
            assert "Unknown node" in str(refused.value)
        else:
            assert "The module rlock " + REFUSAL in str(refused.value)
    finally:
        node.stop()
