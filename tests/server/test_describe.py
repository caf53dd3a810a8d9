"""Commands that describe themselves: RLOCK.HELLO (what the module is and can do, asked
by the clients once per connection) and COMMAND DOCS (from commands.json at the
repository root, the one description of every command) on every tested server.

Runs against module-loaded servers (conftest's `make_server`); the cluster's
`sharded-channels` word is checked in test_cluster.py's cluster.
"""

import json

import pytest
import redis

from conftest import ROOT

COMMANDS_JSON = json.loads((ROOT / "commands.json").read_text())

ALWAYS = ["tickets", "ticket-holds", "ticket-notify", "ticket-quiet", "release-collects",
          "request-ids", "lock", "fenced", "rwlock", "semaphore", "permit-expirable-semaphore",
          "latch"]


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


def raw(r, *args):
    """A command's reply as the server sent it: redis-py's callback for COMMAND reads
    COMMAND INFO's shape into every subcommand's reply."""
    conn = r.connection_pool.get_connection("COMMAND")
    try:
        conn.send_command(*args)
        return conn.read_response()
    finally:
        r.connection_pool.release(conn)


def served(arg):
    """One argument as a server answers it, without the display_text that Redis 7.2+ and
    Valkey fill in with the argument's name (commands.json gives none; 7.0 reports none)."""
    out = {k: v for k, v in arg.items() if not (k == "display_text" and v == arg["name"])}
    if "arguments" in arg:
        out["arguments"] = [served(a) for a in arg["arguments"]]
    return out


def test_command_docs_describe_every_registered_command_as_commands_json_does(server):
    r = server.client(protocol=3, decode_responses=True)
    registered = raw(r, "COMMAND", "LIST", "FILTERBY", "MODULE", "rlock")
    # The registered set is commands.json's: nothing undescribed, nothing described twice.
    assert sorted(registered) == sorted(name.lower() for name in COMMANDS_JSON)
    docs = raw(r, "COMMAND", "DOCS", *registered)
    assert sorted(docs) == sorted(registered)
    for name, want in COMMANDS_JSON.items():
        got = docs[name.lower()]
        assert got["summary"] == want["summary"], name
        assert got["since"] == want["since"], name
        assert got["complexity"] == want["complexity"], name
        # Every module command's group is "module" in COMMAND DOCS; commands.json's own
        # group (the primitive) sorts the reference pages.
        assert (got["group"], got["module"]) == ("module", "rlock"), name
        assert [served(a) for a in got.get("arguments", [])] == \
            want["arguments"], name


def test_every_key_argument_is_the_registrations_key(server):
    """redis-cli's hints and cluster clients read the key from COMMAND DOCS and COMMAND
    INFO: each command's key argument is its first, the key position the server routes."""
    r = server.client(protocol=3, decode_responses=True)
    for name, doc in COMMANDS_JSON.items():
        keys = [a for a in doc["arguments"] if a["type"] == "key"]
        info = r.execute_command("COMMAND", "INFO", name)[name.lower()]
        if keys:
            assert doc["arguments"][0] == keys[0] and len(keys) == 1, name
            assert info["first_key_pos"] == 1, name
        else:
            assert info["first_key_pos"] == 0, name


# INFO's sections (src/server/stats.rs states the naming rule): a section per primitive,
# then the waits of every primitive and what the module holds of the server.
SECTIONS = {
    "rlock_lock": "rlock_",
    "rlock_rwlock": "rlock_rw_",
    "rlock_fenced": "rlock_fenced_",
    "rlock_semaphore": ("rlock_sem_", "rlock_psem_"),
    "rlock_latch": "rlock_latch_",
    "rlock_waits": ("rlock_waiters", "rlock_keys_with_waiters", "rlock_tickets"),
    "rlock_server": "rlock_",
}


def info_text(r, section):
    """INFO's raw text (redis-py's INFO callback would merge the sections into one dict)."""
    conn = r.connection_pool.get_connection("INFO")
    try:
        conn.send_command("INFO", section)
        return conn.read_response().decode()
    finally:
        r.connection_pool.release(conn)


def fields_by_section(text):
    out, current = {}, None
    for line in text.splitlines():
        if line.startswith("# "):
            current = line[2:].strip()
            out[current] = []
        elif ":" in line:
            out[current].append(line.split(":", 1)[0])
    return out


def test_info_rlock_gives_every_named_section_and_each_field_once(server):
    r = server.client()
    sections = fields_by_section(info_text(r, "rlock"))
    assert list(sections) == list(SECTIONS)
    every = [f for fields in sections.values() for f in fields]
    assert len(every) == len(set(every)), "a field in two sections"
    for name, prefix in SECTIONS.items():
        assert sections[name], f"{name} is empty"
        assert all(f.startswith(prefix) for f in sections[name]), (name, sections[name])
        # Each section alone, as a dashboard asks for it.
        assert fields_by_section(info_text(r, name)) == {name: sections[name]}
    # redis-py reads them all as one section, as the clients and tests do.
    values = r.info("rlock")
    assert set(values) == set(every)
    assert all(isinstance(v, int) and v >= 0 for v in values.values())
