"""Helpers for the durability and cluster tests: replicas, AOF reading, waiter threads, and
a real local Redis Cluster (3 masters with the module, optionally a replica) built from
conftest's `RedisServer`."""

import contextlib
import random
import socket
import re
import threading
import time
from pathlib import Path

import redis
from redis.crc import key_slot

from conftest import RedisServer, wait_until

SLOTS = 16384


# ---------------------------------------------------------------------------------------
# Small helpers shared by both files


def info_field(client, section, field):
    """One field of INFO <section>, as a string (None when absent)."""
    text = client.execute_command("INFO", section)
    if isinstance(text, dict):  # redis-py parses INFO into a dict
        value = text.get(field)
        return None if value is None else str(value)
    for line in text.decode().splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1]
    return None


def snapshot(client, key):
    """What a replica must agree on: the serialized value and the absolute expiry."""
    return client.dump(key), client.execute_command("PEXPIRETIME", key)


def lock_state(client, key):
    """Owners with counts and the absolute expiry, readable without the module."""
    return client.hgetall(key), client.execute_command("PEXPIRETIME", key)


def wait_replicated(master, replica=None, timeout_ms=5000):
    """WAIT 1 on the master connection; with `replica`, also waits until the replica has
    applied the master's whole stream (WAIT only covers this connection's own writes, not
    writes made by other clients or by module timers)."""
    target = int(info_field(master, "replication", "master_repl_offset"))
    acked = master.execute_command("WAIT", 1, timeout_ms)
    assert acked >= 1, "the replica did not acknowledge within WAIT's timeout"
    if replica is not None:
        wait_until(lambda: int(info_field(replica, "replication", "slave_repl_offset")) >= target,
                   timeout_ms / 1000, what="replica caught up with the master's offset")


def wait_link_up(replica_client, timeout=10):
    wait_until(lambda: info_field(replica_client, "replication", "master_link_status") == "up",
               timeout, what="replica link up")


def wait_online(master_client, timeout=10):
    """The master streams to its replica (after a diskless full sync Redis 7.0 waits for
    the replica's first ACK, up to a second later, before it does)."""
    wait_until(lambda: master_client.info("replication").get("slave0", {}).get("state") == "online",
               timeout, what="replica online on the master")


class Waiter:
    """A client blocked in `RLOCK.ACQUIRE ... WAIT` on its own connection and thread."""

    def __init__(self, server_or_port, key, owner, lease, timeout_ms, host="127.0.0.1"):
        port = server_or_port if isinstance(server_or_port, int) else server_or_port.port
        self.conn = redis.Redis(host=host, port=port, socket_timeout=30)
        self.key, self.owner = key, owner
        self.result = None
        self.error = None
        self.done = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(key, owner, lease, timeout_ms), daemon=True)

    def _run(self, key, owner, lease, timeout_ms):
        try:
            self.result = self.conn.execute_command("RLOCK.ACQUIRE", key, owner, lease,
                                                    "WAIT", timeout_ms)
        except Exception as e:  # noqa: BLE001 - reported to the test
            self.error = e
        finally:
            self.done.set()

    def start(self):
        self.thread.start()
        return self

    def wait(self, timeout=10):
        assert self.done.wait(timeout), f"waiter {self.owner!r} did not get an answer in {timeout}s"
        return self.result

    def close(self):
        try:
            self.conn.close()  # a blocked waiter wakes with a connection error
        except Exception:
            pass
        self.thread.join(10)
        assert not self.thread.is_alive(), "a waiter thread did not finish"


@contextlib.contextmanager
def waiters():
    """Yields a list to append started `Waiter`s to; every one is closed and joined."""
    started = []
    try:
        yield started
    finally:
        for w in started:
            w.close()


def start_waiter(pool, server, key, owner, lease=30000, timeout_ms=10000, probe=None):
    """Starts a waiter and waits until the server has queued it (RLOCK.INFO waiters)."""
    probe = probe or redis.Redis(host="127.0.0.1", port=server.port if not isinstance(server, int) else server)
    before = rlock_waiters(probe, key)
    w = Waiter(server, key, owner, lease, timeout_ms).start()
    pool.append(w)
    wait_until(lambda: rlock_waiters(probe, key) > before or w.done.is_set(), 5,
               what=f"{owner!r} queued on {key!r}")
    assert not w.done.is_set(), f"waiter answered at once: {w.result!r} {w.error!r}"
    return w


def rlock_waiters(client, key):
    info = client.execute_command("RLOCK.INFO", key)
    if info is None:
        return 0
    pairs = dict(zip(info[::2], info[1::2]))
    return pairs[b"waiters"]


def owners(client, key):
    info = client.execute_command("RLOCK.INFO", key)
    if info is None:
        return None
    pairs = dict(zip(info[::2], info[1::2]))
    o = pairs[b"owners"]
    return dict(zip(o[::2], o[1::2]))


# ---------------------------------------------------------------------------------------
# AOF


def read_resp_commands(data):
    """Parses a file of RESP arrays (an AOF without RDB preamble) into command lists."""
    out, i = [], 0
    while i < len(data):
        assert data[i:i + 1] == b"*", f"not a RESP array at byte {i}: {data[i:i+20]!r}"
        end = data.index(b"\r\n", i)
        n = int(data[i + 1:end])
        i = end + 2
        cmd = []
        for _ in range(n):
            assert data[i:i + 1] == b"$"
            end = data.index(b"\r\n", i)
            ln = int(data[i + 1:end])
            i = end + 2
            cmd.append(data[i:i + ln])
            i += ln + 2
        out.append(cmd)
    return out


def aof_files(server, dirname="appendonlydir"):
    d = Path(server.dir) / dirname
    manifest = (d / "appendonly.aof.manifest").read_text()
    names = re.findall(r"file (\S+) seq \d+ type \w", manifest)
    return [d / n for n in names]


def aof_commands(server):
    """Every command in the server's RESP AOF files (listed by the manifest), in order."""
    cmds = []
    for f in aof_files(server):
        if f.name.endswith(".aof"):
            cmds += read_resp_commands(f.read_bytes())
    return cmds


# ---------------------------------------------------------------------------------------
# Redis Cluster


def key_on(slot_lo, slot_hi, prefix="lock"):
    """A key name whose slot is in [slot_lo, slot_hi]."""
    for n in range(200000):
        k = f"{prefix}:{n}"
        if slot_lo <= key_slot(k.encode()) <= slot_hi:
            return k
    raise AssertionError("no key found for the slot range")


def key_in_slot(slot, prefix="lock"):
    return key_on(slot, slot, prefix)


def _port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port():
    """A free port whose cluster bus port (+10000) is free and in range too."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 55535)
        if _port_free(port) and _port_free(port + 10000):
            return port
    raise AssertionError("no free port pair for a cluster node")


class Cluster:
    """Three masters (module loaded) splitting 0-16383, plus optional replicas."""

    def __init__(self, base_dir, replicas_of=(), node_timeout=2000, module_args=()):
        self.base = Path(base_dir)
        self.nodes = []
        self.node_timeout = node_timeout
        self.replicas_of = list(replicas_of)
        self.module_args = list(module_args)  # for every node's module (`replication effects`)

    def _node(self, name):
        s = RedisServer(self.base / name, module=True, module_args=self.module_args, args=[
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout), "--hz", "100",
            "--repl-diskless-sync-delay", "0", "--shutdown-on-sigterm", "now"])
        s.port = cluster_port()
        self.nodes.append(s)
        return s.start()

    def start(self):
        t0 = time.monotonic()
        masters = [self._node(f"m{i}") for i in range(3)]
        ranges = [(0, 5460), (5461, 10922), (10923, 16383)]
        for i, (s, (lo, hi)) in enumerate(zip(masters, ranges)):
            s.client().execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            # Distinct config epochs from the start, as redis-cli --cluster create sets
            # them: left at 0 they are told apart by collisions over several gossip
            # rounds, and a slot moved meanwhile can be claimed back by its old owner.
            s.client().execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        c0 = masters[0].client()
        for s in masters[1:]:
            c0.execute_command("CLUSTER", "MEET", "127.0.0.1", s.port)
        reps = []
        for i, m in enumerate(self.replicas_of):
            r = self._node(f"r{i}")
            r.client().execute_command("CLUSTER", "MEET", "127.0.0.1", masters[0].port)
            reps.append((r, masters[m]))
        self.wait_ok(timeout=20)
        for r, m in reps:
            mid = self.node_id(m)
            wait_until(lambda: self._knows(r, mid), 10, what="replica knows its master")
            r.client().execute_command("CLUSTER", "REPLICATE", mid)
        for r, m in reps:
            wait_link_up(r.client(), 15)
            self.wait_replica_known(r, m)
        self.wait_ok(timeout=20)
        self.startup_seconds = time.monotonic() - t0
        return self

    def wait_replica_known(self, replica, master, timeout=15):
        """Every node lists `replica` as a replica of `master` (gossip): until then a
        master does not forward sharded messages to it, nor would a failover be clean."""
        rid, mid = self.node_id(replica), self.node_id(master)

        def known():
            for s in self.nodes:
                for line in s.client().execute_command("CLUSTER", "NODES").decode().splitlines():
                    f = line.split()
                    if f[0] == rid and not ("slave" in f[2] and f[3] == mid):
                        return False
            return True
        wait_until(known, timeout, interval=0.05, what="replica known to every node")

    def settle_epochs(self, timeout=20):
        """Waits until every node knows every master's config epoch alike, the epochs are
        distinct, and every node's current epoch is their maximum. A slot's new owner then
        takes an epoch above all others when it claims the slot in a classic migration;
        with a stale current epoch it could take one another node has, and gossip the old
        owner sent before its SETSLOT could win the slot back where the claim was unheard."""
        def view(s):
            c = s.client()
            epochs = {}
            for line in c.execute_command("CLUSTER", "NODES").decode().splitlines():
                f = line.split()
                if len(f) >= 8 and "master" in f[2]:
                    epochs[f[0]] = int(f[6])
            info = c.execute_command("CLUSTER", "INFO").decode()
            top = max(epochs.values(), default=0)
            ok = (len(set(epochs.values())) == len(epochs)
                  and f"cluster_current_epoch:{top}\r" in info)
            return epochs if ok else None

        def settled():
            views = [view(s) for s in self.nodes]
            return views[0] is not None and all(v == views[0] for v in views)
        wait_until(settled, timeout, interval=0.05, what="config epochs agreed, distinct and current")

    def _knows(self, server, node_id):
        return node_id.encode() in server.client().execute_command("CLUSTER", "NODES")

    def wait_ok(self, timeout=15):
        def all_ok():
            for s in self.nodes:
                info = s.client().execute_command("CLUSTER", "INFO").decode()
                if "cluster_state:ok" not in info:
                    return False
                # Every node sees every other node.
                if f"cluster_known_nodes:{len(self.nodes)}" not in info:
                    return False
            return True
        wait_until(all_ok, timeout, interval=0.05, what="cluster_state:ok on every node")

    def node_id(self, server):
        return server.client().execute_command("CLUSTER", "MYID").decode()

    def by_port(self, port):
        return next(s for s in self.nodes if s.port == int(port))

    def owner_of(self, slot, via=None):
        """The node serving `slot` as `via` (default: first node) sees it."""
        via = via or self.nodes[0]
        for lo, hi, master, *_ in via.client().execute_command("CLUSTER", "SLOTS"):
            if lo <= slot <= hi:
                return self.by_port(master[1])
        raise AssertionError(f"slot {slot} unassigned")

    def masters(self):
        return [s for s in self.nodes
                if info_field(s.client(), "replication", "role") == "master"]

    def slot_ranges(self, server):
        """The slot ranges `server` owns, as it itself sees them."""
        out = []
        for lo, hi, master, *_ in server.client().execute_command("CLUSTER", "SLOTS"):
            if int(master[1]) == server.port:
                out.append((lo, hi))
        return out

    def stop(self):
        crashed = [s for s in self.nodes if s.proc is not None and s.proc.poll() is not None]
        for s in self.nodes:
            s.stop()
        return crashed
