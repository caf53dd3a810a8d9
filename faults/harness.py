"""The fault harness (faults/README.md; design.md section 7): runs client processes against
real module-loaded servers, injects one fault (a nemesis) while they work, checks the
recorded histories with faults/checker, and writes the report table.

One *cell* is one primitive under one fault: servers set up for the fault, W worker
processes (faults/worker for the Rust client, faults/pyworker.py for `rlock.Lock`,
faults/goworker for the Go client's `rlock.Mutex`)
running up to N operations or S seconds between them, the nemesis acting meanwhile,
the resource's final values read, the checker run on every history file of the cell.

  python faults/harness.py --cells lock:pause,fenced:kill --ops 10000 --seconds 40 \
      --server redis --out /tmp/faults --report faults/REPORT.md [--expect]

`--cells all` is the full matrix, `--cells slice` the short slice `make test` runs,
`--cells scripts` the scripts-mode matrix: each primitive's `-scripts` twin (`lock-scripts`,
`lock-py-scripts`...) is the same worker in its client's default mode (auto) against servers
WITHOUT the module, logged in as a user restricted like a managed service's
(`+@all -@dangerous`), so it runs on Redisson's scripts (docs/scripts-mode.md).
With `--expect` the run fails (exit 1) when a cell whose guarantee holds shows any
anomaly, or when fencing let a stale write through anywhere.

The `migrate` fault (Valkey 9.0+ only) runs the cell on a 3-master cluster with the module
on every node: the workers use the Rust client's cluster client, the name's slot (holding
also 1 000 locks held for the whole cell and the queues of 100 waiter threads of the
harness, on locks and a semaphore) moves from master to master with `CLUSTER MIGRATESLOTS`
again and again, and besides the checker's models the cell fails on a held lock that did
not arrive intact, or a waiter not answered within its timeout (plus a bound).

Network partitions use the harness's own network namespaces (`ip netns`), one veth
pair between them with addresses in 10.213.1.0/30 that exist only there, and
`tc netem loss 100%` on both ends; nothing else is ever addressed. Every other cell
runs on 127.0.0.1.
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import redis

ROOT = Path(__file__).resolve().parent.parent
PRIMITIVES = ["lock", "lock-py", "lock-go", "fenced", "rwlock", "semaphore", "expirable", "latch"]
# Scripts mode (design.md 9): each primitive's twin, run without the module.
SCRIPTS_SUFFIX = "-scripts"
SCRIPTS_PRIMITIVES = [p + SCRIPTS_SUFFIX for p in PRIMITIVES]
FAULTS = ["none", "pause", "kill", "clientkill", "partition", "restart-always",
          "restart-everysec", "failover", "failover-wait", "failover-commands", "migrate"]
# The scripts-mode matrix: every fault that does not need the module on the server
# (failover-commands is the module's replication mode; migrate's waiters and held locks
# are module commands, and the Rust client's scripts mode is not yet tested on a cluster).
SCRIPTS_FAULTS = ["none", "pause", "kill", "clientkill", "partition", "restart-always",
                  "failover", "failover-wait"]
# The restricted user the scripts-mode workers log in as: a managed service's realities
# (no MODULE, CONFIG, DEBUG, CLIENT KILL, ROLE); the harness itself stays the default user.
SCRIPTS_USER = ["app", "on", ">rlock-faults", "~*", "&*", "+@all", "-@dangerous"]
# Where the guarantee cannot hold, and why (docs/guarantees.md's "Guarantees under faults" says
# the same in words). Everything not listed here must show zero anomalies.
CANNOT_HOLD = {
    "pause": "a holder paused past its lease acts after losing it",
    "partition": "a holder cut off past its lease may still write once healed",
    "restart-everysec": "the AOF may lose the last second of writes",
    "failover": "asynchronous replication may lose the last writes",
    "failover-commands": "asynchronous replication may lose the last writes",
    "failover-wait": "releases and renewals are not waited for; the promoted replica may miss a grant",
}
# Leases do not exist for these: a pause or a cut-off holder keeps its hold.
NO_LEASE = {"semaphore", "latch"}
# Where every permit must be free again at the end: no process dies and every holder
# releases (a plain semaphore records no holders, so a killed one's permits stay taken).
# One more than the semaphore has is a grant taken back that its holder released anyway
# (design.md 5); one fewer, a grant or a release lost. Module mode only: scripts mode has
# no request ids, and an acquire whose reply was lost may have taken its permit.
CONSERVED = {("semaphore", f) for f in ("none", "pause", "clientkill")}
# Where scripts mode gives less than the module under a fault that the module survives
# (docs/scripts-mode.md, "What the module adds"): the anomalies it may show there, and why.
# The primitives whose histories Porcupine checks (faults/README.md, "Checkers").
LINEARIZED = {"lock", "lock-py", "lock-go", "fenced"}
# Everything else is held to the module's expectation: the same faults cannot hold (a lease
# is a lease, whoever keeps it), the others must show zero anomalies.
_RETRIED = ("an acquire whose reply was lost may have been applied (no request ids without the "
            "module): answered outcome-unknown, not re-sent, but the "
            "owner's next acquire re-enters it, one hold too many, which its later releases "
            "answer as still held until it leaves the lock for a lease; Porcupine reports it")
SCRIPTS_ALLOWED: Dict[str, Dict[str, str]] = {
    "clientkill": {"not-linearizable": _RETRIED},
    "restart-always": {"not-linearizable": _RETRIED},
}
# And where scripts mode cannot hold what the module holds (faults/REPORT.md, findings):
# none left since the clients no longer send a script that must not run twice
# again after its connection broke past the write (docs/scripts-mode.md, "Retries")
# (the semaphore and latch cells are the Rust worker's; a
# release or count-down re-sent after a lost reply used to count twice, findings 6 and 7).
SCRIPTS_CANNOT_HOLD: Dict[Tuple[str, str], str] = {}
# The migrate cells: the fault needs Valkey 9's atomic slot migration; the Python and Go
# workers have no cluster client, so lock-py and lock-go have no migrate cell.
MIGRATE_HELD = 1000
MIGRATE_WAITERS = 100
MIGRATE_WAIT_MS = 2000
# How late past its timeout a waiter's answer may come on a loaded machine before the cell
# counts it as left hanging.
MIGRATE_ANSWER_SLACK_S = 10.0
# The Go client's lock gets one cell in the slice (CLIENT KILL: its tickets are dropped
# and must be queued again); its other cells are in the full matrix.
# Scripts mode gets one cell: the Rust client's lock, its holders and waiters killed.
SLICE = ([f"{p}:kill" for p in PRIMITIVES if p != "lock-go"] + [f"{p}:clientkill" for p in PRIMITIVES]
         + ["fenced:pause", "semaphore:pause", "lock:partition", "lock:restart-always",
            "lock-scripts:kill"])

WATCHDOG_MS = 1000
# Hold times (ms) by fault: longer where the nemesis must catch a holder inside its
# critical section (between its read and its write of the resource, or holding across
# the failover while another client reconnects to the promoted replica).
HOLD_MS = {"pause": "10", "partition": "10", "failover": "50"}
MODULE_ARGS: List[str] = []
PERMITS = 2


def base(primitive: str) -> str:
    """The primitive a cell drives, without its mode: `lock-py-scripts` -> `lock-py`."""
    return primitive[:-len(SCRIPTS_SUFFIX)] if primitive.endswith(SCRIPTS_SUFFIX) else primitive


def scripts_mode(primitive: str) -> bool:
    return primitive.endswith(SCRIPTS_SUFFIX)


def free_cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        port = random.randrange(20000, 55535)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return
        except Exception:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"timed out waiting for {what}")


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


class Server:
    """One redis-server (or valkey-server) process, optionally in a namespace."""

    def __init__(self, binary: str, host: str, port: int, workdir: Path, module: Optional[str],
                 extra: List[str], netns: Optional[str] = None) -> None:
        self.binary, self.host, self.port, self.workdir = binary, host, port, workdir
        self.module, self.extra, self.netns = module, extra, netns
        # Module arguments (`replication MODE`, the config rlock.replication), given only
        # where the module has it.
        self.module_args: List[str] = list(MODULE_ARGS)
        self.proc: Optional[subprocess.Popen] = None
        workdir.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        cmd = [self.binary, "--port", str(self.port), "--bind", self.host, "--save", "",
               "--dir", str(self.workdir), "--enable-debug-command", "yes",
               "--logfile", str(self.workdir / "server.log")] + self.extra
        if self.host != "127.0.0.1":
            # Bound only to the harness's own veth address: clients come from its namespace.
            cmd += ["--protected-mode", "no"]
        if self.module:
            cmd += ["--loadmodule", self.module] + self.module_args
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns] + cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: self.client().ping(), 15, f"server on {self.host}:{self.port}")

    def client(self) -> redis.Redis:
        return redis.Redis(self.host, self.port, socket_timeout=2, socket_connect_timeout=1)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()


class Proxy:
    """A TCP forwarder on 127.0.0.1 that plays the failover's virtual address: clients
    connect to it, it forwards to the current primary; `switch` drops every forwarded
    connection and sends new ones to the promoted replica (what a Sentinel-aware client
    or a floating IP achieves)."""

    def __init__(self, backend_port: int) -> None:
        self.backend = backend_port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.conns: List[socket.socket] = []
        self.mu = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(("127.0.0.1", self.backend), timeout=1)
                b.settimeout(None)
            except OSError:
                c.close()
                continue
            with self.mu:
                self.conns += [c, b]
            for src, dst in ((c, b), (b, c)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def switch(self, backend_port: int) -> None:
        self.backend = backend_port
        with self.mu:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self.closed = True
        self.sock.close()
        self.switch(self.backend)


class Netns:
    """The harness's own network namespace `c`, joined to the host by one veth pair:
    10.213.1.1 on the host end (the servers bind it; it exists only while the cell
    runs) and 10.213.1.2 in `c`, where the workers a partition cuts off run."""

    def __init__(self) -> None:
        tag = f"rlkf{os.getpid()}"
        self.c = f"{tag}c"
        self.vs, self.vc = f"{tag}a", f"{tag}b"
        self.addr_s, self.addr_c = "10.213.1.1", "10.213.1.2"

    def up(self) -> None:
        sh("ip", "netns", "add", self.c)
        sh("ip", "link", "add", self.vs, "type", "veth", "peer", "name", self.vc, "netns", self.c)
        sh("ip", "addr", "add", f"{self.addr_s}/30", "dev", self.vs)
        sh("ip", "link", "set", self.vs, "up")
        sh("ip", "-n", self.c, "addr", "add", f"{self.addr_c}/30", "dev", self.vc)
        sh("ip", "-n", self.c, "link", "set", self.vc, "up")
        sh("ip", "-n", self.c, "link", "set", "lo", "up")

    # A token bucket whose burst (1 byte) is smaller than any packet drops every packet:
    # a blackhole. `netem loss 100%` would say it more plainly, but this machine's kernel
    # has no sch_netem (tc answers "Specified qdisc kind is unknown") and no iptables.
    BLACKHOLE = ["tbf", "rate", "1kbit", "burst", "1", "latency", "1ms"]

    def cut(self) -> None:
        """Both directions blackholed: every packet on either end of the pair is dropped."""
        sh("tc", "qdisc", "add", "dev", self.vs, "root", *self.BLACKHOLE)
        sh("ip", "netns", "exec", self.c, "tc", "qdisc", "add", "dev", self.vc, "root", *self.BLACKHOLE)

    def heal(self) -> None:
        sh("tc", "qdisc", "del", "dev", self.vs, "root", check=False)
        sh("ip", "netns", "exec", self.c, "tc", "qdisc", "del", "dev", self.vc, "root", check=False)

    def down(self) -> None:
        # Deleting the namespace deletes its veth end, and with it the host end.
        sh("ip", "netns", "del", self.c, check=False)
        sh("ip", "link", "del", self.vs, check=False)


@dataclass
class Worker:
    proc_id: int
    hist: Path
    popen: subprocess.Popen
    netns: Optional[str]
    owner: Optional[str] = None


@dataclass
class Cell:
    primitive: str
    fault: str
    server: str
    ops: int
    seconds: float
    workers: int
    out: Path
    replication: str
    result: Dict = field(default_factory=dict)
    note: str = ""
    elapsed: float = 0.0


class Run:
    """Sets up, runs and tears down one cell."""

    def __init__(self, cell: Cell, binary: str, module: str, worker_bin: str) -> None:
        self.cell, self.binary, self.worker_bin = cell, binary, worker_bin
        # The primitive without its mode, and whether the servers go without the module.
        self.kind = base(cell.primitive)
        self.scripts = scripts_mode(cell.primitive)
        self.module: Optional[str] = None if self.scripts else module
        # Scripts mode: every server the workers reach has the restricted user.
        self.server_extra = ["--user", *SCRIPTS_USER] if self.scripts else []
        self.creds = f"{SCRIPTS_USER[0]}:{SCRIPTS_USER[2][1:]}@" if self.scripts else ""
        self.dir = cell.out / f"{cell.primitive}-{cell.fault}"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.name = f"faults:{cell.primitive}"
        self.servers: List[Server] = []
        self.workers: List[Worker] = []
        self.next_proc = 1
        self.netns: Optional[Netns] = None
        self.proxy: Optional[Proxy] = None
        self.primary: Optional[Server] = None
        self.replica: Optional[Server] = None
        self.resource: Optional[Server] = None
        self.url = ""
        self.stop_at = 0.0
        self.faults_done = 0
        self.cluster: List[Server] = []
        self.extra_anomalies: Dict[str, int] = {}
        self.extra_info: Dict[str, int] = {}
        self.waiter_threads: List[threading.Thread] = []

    # ---- topology ----
    def setup(self) -> None:
        f = self.cell.fault
        if f == "migrate":
            return self.setup_cluster()
        host = "127.0.0.1"
        ns = None
        if f == "partition":
            self.netns = Netns()
            self.netns.up()
            host = self.netns.addr_s
        extra: List[str] = list(self.server_extra)
        if f.startswith("restart"):
            extra += ["--appendonly", "yes", "--appendfsync", f.split("-")[1]]
        mod = self.module
        self.primary = Server(self.binary, host, free_port(), self.dir / "primary", mod, extra, ns)
        self.primary.start()
        self.servers.append(self.primary)
        self.resource = Server(self.binary, host, free_port(), self.dir / "resource", None, [], ns)
        self.resource.start()
        self.servers.append(self.resource)
        self.url = f"redis://{self.creds}{host}:{self.primary.port}/"
        if f.startswith("failover"):
            self.replica = self._replica_of(self.primary)
            self.proxy = Proxy(self.primary.port)
            self.url = f"redis://{self.creds}127.0.0.1:{self.proxy.port}/"

    def setup_cluster(self) -> None:
        """Three masters with the module splitting the slots; the workers' URL names the
        first, the cluster client finds the rest."""
        for i in range(3):
            port = free_cluster_port()
            n = Server(self.binary, "127.0.0.1", port, self.dir / f"node{i}", self.module,
                       ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                        "--cluster-node-timeout", "3000", "--hz", "100"])
            n.start()
            self.servers.append(n)
            self.cluster.append(n)
        ranges = [(0, 5460), (5461, 10922), (10923, 16383)]
        for i, (n, (lo, hi)) in enumerate(zip(self.cluster, ranges)):
            n.client().execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            # Distinct config epochs, as redis-cli --cluster create sets them (left at 0
            # they are told apart by collisions over several gossip rounds).
            n.client().execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        for n in self.cluster[1:]:
            self.cluster[0].client().execute_command("CLUSTER", "MEET", "127.0.0.1", n.port)

        def ok() -> bool:
            for n in self.cluster:
                info = n.client().execute_command("CLUSTER", "INFO").decode()
                if "cluster_state:ok" not in info or "cluster_known_nodes:3" not in info:
                    return False
            return True
        wait_until(ok, 30, "cluster_state:ok on every node")
        self.primary = self.cluster[0]
        self.resource = Server(self.binary, "127.0.0.1", free_port(), self.dir / "resource", None, [])
        self.resource.start()
        self.servers.append(self.resource)
        self.url = f"redis://127.0.0.1:{self.cluster[0].port}/"
        rc = self.cluster_client()
        # Locks held all along, in the name's slot: they must arrive intact every time.
        pipe = rc.pipeline()
        for i in range(MIGRATE_HELD):
            pipe.execute_command("RLOCK.ACQUIRE", f"{{{self.name}}}:held:{i}", f"holder-{i}", 600_000)
        pipe.execute()
        rc.execute_command("RSEMAPHORE.TRYSETPERMITS", f"{{{self.name}}}:gate-sem", 3)
        rc.close()

    def cluster_client(self):
        from redis.cluster import RedisCluster
        return RedisCluster(host="127.0.0.1", port=self.cluster[0].port, socket_timeout=30)

    def slot_owner(self) -> Server:
        """The master serving the name's slot, as the first node that answers sees it."""
        slot = self.cluster[0].client().execute_command("CLUSTER", "KEYSLOT", self.name)
        for n in self.cluster:
            try:
                for lo, hi, master, *_ in n.client().execute_command("CLUSTER", "SLOTS"):
                    if lo <= slot <= hi:
                        return next(s for s in self.cluster if s.port == int(master[1]))
            except redis.RedisError:
                continue
        raise RuntimeError("no node serves the slot")

    def start_waiters(self) -> None:
        """MIGRATE_WAITERS threads that wait, blocked, on ten locks and a semaphore of the
        name's slot while it moves; each answer must come within its timeout (plus slack),
        as a grant or a timeout: the cluster client follows the MOVED a waiter on the old
        node gets."""
        mu = threading.Lock()
        counts = {"served": 0, "timed_out": 0, "late": 0, "errors": 0}

        def note(k: str) -> None:
            with mu:
                counts[k] += 1

        def waiter(i: int) -> None:
            rc = self.waiter_clients[i]
            sem = i % 2 == 1
            key = f"{{{self.name}}}:gate-sem" if sem else f"{{{self.name}}}:gate:{i % 10}"
            try:
                while time.monotonic() < self.stop_at:
                    t0 = time.monotonic()
                    try:
                        if sem:
                            got = rc.execute_command("RSEMAPHORE.ACQUIRE", key, 1, "WAIT",
                                                     MIGRATE_WAIT_MS)
                        else:
                            got = rc.execute_command("RLOCK.ACQUIRE", key, f"w{i}", 5000,
                                                     "WAIT", MIGRATE_WAIT_MS)
                    except redis.RedisError:
                        note("errors")
                        time.sleep(0.05)
                        continue
                    if time.monotonic() - t0 > MIGRATE_WAIT_MS / 1000 + MIGRATE_ANSWER_SLACK_S:
                        note("late")
                    granted = got == 1 if sem else got is None
                    if not granted:
                        note("timed_out")
                        continue
                    note("served")
                    time.sleep(0.005)
                    try:
                        if sem:
                            rc.execute_command("RSEMAPHORE.RELEASE", key, 1)
                        else:
                            rc.execute_command("RLOCK.RELEASE", key, f"w{i}")
                    except redis.RedisError:
                        note("errors")
            finally:
                rc.close()

        for i in range(MIGRATE_WAITERS):
            t = threading.Thread(target=waiter, args=(i,), daemon=True)
            t.start()
            self.waiter_threads.append(t)
        self.waiter_counts = counts

    def check_migrate(self) -> None:
        """After the cell: the waiters all returned, none late; every held lock is where
        the slot is, with its holder and a lease."""
        for t in self.waiter_threads:
            t.join(MIGRATE_WAIT_MS / 1000 + MIGRATE_ANSWER_SLACK_S + 5)
        hung = sum(t.is_alive() for t in self.waiter_threads)
        c = self.waiter_counts
        self.extra_anomalies["waiter-late"] = c["late"] + hung
        self.extra_info.update({f"waiters_{k}": v for k, v in c.items()})
        rc = self.cluster_client()
        pipe = rc.pipeline()
        for i in range(MIGRATE_HELD):
            pipe.hgetall(f"{{{self.name}}}:held:{i}")
        held = pipe.execute()
        rc.close()
        lost = sum(1 for i, h in enumerate(held) if h != {f"holder-{i}".encode(): b"1"})
        self.extra_anomalies["held-lost"] = lost

    def _replica_of(self, primary: Server) -> Server:
        r = Server(self.binary, "127.0.0.1", free_port(), self.dir / f"replica{len(self.servers)}",
                   self.module, ["--replicaof", "127.0.0.1", str(primary.port)] + self.server_extra)
        r.start()
        self.servers.append(r)
        wait_until(lambda: r.client().info("replication").get("master_link_status") == "up", 15,
                   "replica link up")
        return r

    def teardown(self) -> None:
        for w in self.workers:
            if w.popen.poll() is None:
                try:
                    os.kill(w.popen.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                w.popen.kill()
                w.popen.wait()
        if self.proxy:
            self.proxy.close()
        for s in self.servers:
            s.kill()
        if self.netns:
            self.netns.down()

    # ---- workers ----
    def spawn(self, ops: int, seconds: float, netns: Optional[str] = None) -> Worker:
        p = self.next_proc
        self.next_proc += 1
        hist = self.dir / f"w{p}.jsonl"
        common = ["--name", self.name, "--hist", str(hist), "--proc", str(p),
                  "--ops", str(max(ops, 1)), "--seconds", str(max(int(seconds), 1)),
                  "--watchdog-ms", str(WATCHDOG_MS),
                  # A longer hold where the nemesis stops a holder: it is then more
                  # often caught between its read and its write of the resource.
                  "--hold-ms", HOLD_MS.get(self.cell.fault.split("-")[0], "2")]
        res = f"redis://{self.resource.host}:{self.resource.port}/"
        if self.kind == "lock-py":
            cmd = [sys.executable, str(ROOT / "faults" / "pyworker.py"), "--url", self.url,
                   "--resource", res] + common
            if self.cell.fault == "failover-wait":
                cmd += ["--replica-sync", "1"]
        elif self.kind == "lock-go":
            cmd = [str(ROOT / "target" / "faults" / "rlock-goworker"), "--url", self.url,
                   "--resource", res] + common
            if self.cell.fault == "failover-wait":
                cmd += ["--replica-sync", "1"]
        else:
            cmd = [self.worker_bin, "--url", self.url, "--primitive", self.kind,
                   "--permits", str(PERMITS), "--latch-count", str(self.cell.workers)] + common
            if self.kind in ("lock", "fenced"):
                cmd += ["--resource", res]
            if self.cell.fault == "failover-wait":
                cmd += ["--replica-sync", "1"]
            if self.cell.fault == "migrate":
                cmd += ["--cluster", "1"]
        # Scripts mode: the client's default mode (auto) finds no module and runs
        # Redisson's scripts, asking again after every reconnect (failover, restart).
        if self.scripts:
            cmd += ["--mode", "auto"]
        if netns:
            cmd = ["ip", "netns", "exec", netns] + cmd
        env = dict(os.environ, PYTHONPATH=str(ROOT / "clients" / "python"))
        popen = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                 stderr=open(self.dir / f"w{p}.err", "w"), env=env)
        w = Worker(p, hist, popen, netns)
        self.workers.append(w)
        return w

    def alive(self) -> List[Worker]:
        return [w for w in self.workers if w.popen.poll() is None]

    def owner_of(self, w: Worker) -> Optional[str]:
        if w.owner is None and w.hist.exists():
            with open(w.hist) as fh:
                first = fh.readline()
            if first.strip():
                w.owner = json.loads(first).get("owner")
        return w.owner

    def holder(self) -> Optional[Worker]:
        """The worker holding the lock now (lock family), else a random live worker."""
        live = self.alive()
        if not live:
            return None
        if self.kind in ("lock", "fenced", "lock-py", "lock-go"):
            try:
                if self.scripts:
                    # Redisson's layout: the lock is a hash of owner -> hold count.
                    owners = [o.decode() for o in self.primary.client().hkeys(self.name)]
                else:
                    info = self.primary.client().execute_command("RLOCK.INFO", self.name)
                    flat = [x.decode() if isinstance(x, bytes) else x for x in (info or [])]
                    owners = flat[flat.index("owners") + 1] if "owners" in flat else []
                    owners = [o.decode() if isinstance(o, bytes) else o for o in owners][::2]
                for w in live:
                    if self.owner_of(w) in owners:
                        return w
            except Exception:
                pass
        return random.choice(live)

    # ---- nemeses ----
    def nemesis(self) -> None:
        f = self.cell.fault
        if f == "none":
            return
        pause_s = 2.5 * WATCHDOG_MS / 1000
        while time.monotonic() < self.stop_at and self.alive():
            time.sleep(0.5 + random.random() * 0.5)
            if time.monotonic() >= self.stop_at or not self.alive():
                break
            if f == "pause":
                w = self.holder()
                if w is None:
                    continue
                os.kill(w.popen.pid, signal.SIGSTOP)
                time.sleep(pause_s)
                os.kill(w.popen.pid, signal.SIGCONT)
            elif f == "kill":
                w = self.holder() if random.random() < 0.5 else random.choice(self.alive())
                w.popen.kill()
                w.popen.wait()
                with open(w.hist, "a") as fh:
                    fh.write("\n" + json.dumps({"p": w.proc_id, "f": "crash", "type": "event",
                                                "t": time.monotonic_ns()}) + "\n")
                left = self.stop_at - time.monotonic()
                self.spawn(self.cell.ops // self.cell.workers, left, w.netns)
            elif f == "clientkill":
                try:
                    self.primary.client().execute_command("CLIENT", "KILL", "TYPE", "normal")
                except redis.RedisError:
                    pass
            elif f == "partition":
                self.netns.cut()
                time.sleep(pause_s)
                self.netns.heal()
                time.sleep(1)
            elif f.startswith("restart"):
                self.primary.kill()
                time.sleep(0.2)
                self.primary.start()
                time.sleep(1.5)
            elif f == "migrate":
                src = self.slot_owner()
                dst = random.choice([n for n in self.cluster if n is not src])
                slot = src.client().execute_command("CLUSTER", "KEYSLOT", self.name)
                dst_id = dst.client().execute_command("CLUSTER", "MYID").decode()
                src.client().execute_command("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot,
                                             "NODE", dst_id)
                wait_until(lambda: self.slot_owner() is dst, 30, "the slot moved")
            elif f.startswith("failover"):
                old = self.primary
                # The replica is promoted while the old primary still serves clients
                # for 300 ms before it dies (as when a Sentinel promotes a replica of a
                # primary it can no longer see): what the old primary acknowledged in
                # that time never reaches the new one. (On loopback a replica is
                # otherwise microseconds behind, and a cut link is re-synced from the
                # backlog within the same 300 ms: nothing would be lost.)
                self.replica.client().execute_command("REPLICAOF", "NO", "ONE")
                time.sleep(0.3)
                old.kill()
                self.primary = self.replica
                self.proxy.switch(self.primary.port)
                self.servers.remove(old)
                time.sleep(0.5)
                self.replica = self._replica_of(self.primary)
                time.sleep(2.5)
            self.faults_done += 1

    # ---- the cell ----
    def run(self) -> None:
        c = self.cell
        t0 = time.monotonic()
        try:
            self.setup()
            if c.fault == "migrate":
                # Their cluster clients first: mapping the cluster takes a while for 100.
                self.waiter_clients = [self.cluster_client() for _ in range(MIGRATE_WAITERS)]
            self.stop_at = time.monotonic() + c.seconds
            per = c.ops // c.workers
            for i in range(c.workers):
                # In a partition cell half the workers sit in the namespace that is cut off.
                ns = None
                if self.netns:
                    ns = self.netns.c if i % 2 == 0 else None
                self.spawn(per, c.seconds, ns)
            if c.fault == "migrate":
                self.start_waiters()
            self.nemesis()
            # Workers stop by themselves at their deadline; give stragglers a bound.
            end = self.stop_at + 20
            while self.alive() and time.monotonic() < end:
                time.sleep(0.05)
            stragglers = self.alive()
            for w in stragglers:
                w.popen.kill()
            self.final()
            self.check()
            if (c.primitive, c.fault) in CONSERVED and not stragglers:
                self.check_conserved()
            if c.fault == "migrate":
                self.check_migrate()
                self.cell.result.setdefault("anomalies", {}).update(self.extra_anomalies)
                self.cell.result.setdefault("info", {}).update(self.extra_info)
        finally:
            self.teardown()
            c.elapsed = time.monotonic() - t0

    def final(self) -> None:
        r = self.resource.client()
        plain = r.get(f"res:plain:{self.name}")
        fenced = r.hget(f"res:fenced:{self.name}", "value")
        rec = {"p": 0, "f": "final", "type": "event", "t": time.monotonic_ns()}
        if self.kind in ("lock", "lock-py", "lock-go", "fenced"):
            rec["plain"] = int(plain or 0)
        if self.kind == "fenced":
            rec["fenced"] = int(fenced or 0)
        (self.dir / "harness.jsonl").write_text(json.dumps(rec) + "\n")

    def check_conserved(self) -> None:
        """Every permit is free again (see CONSERVED), once the server has taken back the
        grants nobody confirmed: a waiter whose wait timed out just as its grant came (a
        paused one wakes past its deadline with the grant unread) leaves the grant to be
        given back, and when its process exits first, the server takes it back
        `rlock.ticket-confirm-ms` after its connection closed. More permits than there
        were is never waited out."""
        c = self.primary.client()
        grace = int(next(iter(c.config_get("rlock.ticket-confirm-ms").values()), 0))
        count = lambda: int(c.execute_command("RSEMAPHORE.AVAILABLEPERMITS", self.name))
        t0 = time.monotonic()
        try:
            wait_until(lambda: count() >= PERMITS, 2 * grace / 1000 + 2, "every permit free")
        except TimeoutError:
            pass
        free = count()
        if time.monotonic() - t0 > 0.1:
            self.cell.result.setdefault("info", {})["permits_back_after"] = (
                f"{time.monotonic() - t0:.1f} s")
        anomalies = self.cell.result.setdefault("anomalies", {})
        anomalies["permits-not-conserved"] = abs(free - PERMITS)
        if free != PERMITS:
            self.cell.result.setdefault("examples", []).append(
                f"{free} permits free at the end out of {PERMITS}")

    def check(self) -> None:
        files = sorted(str(p) for p in self.dir.glob("*.jsonl"))
        checker = str(ROOT / "target" / "faults" / "rlock-check")
        out = sh(checker, "-model", self.kind, "-permits", str(PERMITS), "-count",
                 str(self.cell.workers), "-timeout", "60s", *files, check=False)
        if out.returncode not in (0, 1):
            raise RuntimeError(f"checker failed: {out.stderr}")
        self.cell.result = json.loads(out.stdout)
        self.cell.result["faults"] = self.faults_done


def replication_config(binary: str, module: str, out: Path) -> bool:
    """Whether the module has the `rlock.replication` config at all."""
    s = Server(binary, "127.0.0.1", free_port(), out / "probe", module, [])
    s.start()
    try:
        return bool(s.client().config_get("rlock.replication"))
    finally:
        s.kill()


def slot_migration(binary: str) -> bool:
    """Whether the server has atomic slot migration (Valkey 9.0+)."""
    v = sh(binary, "--version").stdout
    if not v.startswith("Valkey"):
        return False
    major = v.split("v=", 1)[1].split(".", 1)[0] if "v=" in v else "0"
    return major.isdigit() and int(major) >= 9


def expected(cell: Cell) -> bool:
    """True where the guarantee holds (and the cell must show no anomaly)."""
    if scripts_mode(cell.primitive) and (base(cell.primitive), cell.fault) in SCRIPTS_CANNOT_HOLD:
        return False
    if cell.fault in CANNOT_HOLD:
        if cell.fault in ("pause", "partition") and base(cell.primitive) in NO_LEASE:
            return True
        return False
    return True


def allowed(cell: Cell) -> Dict[str, str]:
    """Anomalies a cell whose guarantee holds may still show, and why (scripts mode only;
    Porcupine checks the lock family only)."""
    if not scripts_mode(cell.primitive) or base(cell.primitive) not in LINEARIZED:
        return {}
    return SCRIPTS_ALLOWED.get(cell.fault, {})


def row(c: Cell) -> str:
    r = c.result
    if c.note:
        return f"| {c.primitive} | {c.fault} | – | – | – | – | {c.note} |"
    anomalies = ", ".join(f"{k} {v}" for k, v in sorted(r.get("anomalies", {}).items()))
    fen = r.get("fencing", {})
    fenced = ", ".join(f"{k} {v}" for k, v in sorted(fen.items())) or "–"
    st = r.get("by_status", {})
    outcomes = f"{st.get('ok', 0)}/{st.get('fail', 0)}/{st.get('unknown', 0)}"
    lin = r.get("linearizable", "–")
    info = r.get("info", {})
    extra = []
    if info.get("lost_signals"):
        extra.append(f"lost signals {info['lost_signals']}")
    if info.get("released_not_held"):
        extra.append(f"releases answered not held {info['released_not_held']}")
    if info.get("crashes"):
        extra.append(f"crashes {info['crashes']}")
    if info.get("permits_back_after"):
        extra.append(f"every permit free {info['permits_back_after']} after the workers "
                     "(a grant taken back)")
    if "waiters_served" in info:
        extra.append(f"{MIGRATE_HELD} locks held across every move; {MIGRATE_WAITERS} waiter "
                     f"threads: served {info['waiters_served']}, timed out "
                     f"{info['waiters_timed_out']}, errors {info['waiters_errors']}")
    extra.append(f"faults {r.get('faults', 0)}")
    why = (SCRIPTS_CANNOT_HOLD.get((base(c.primitive), c.fault)) if scripts_mode(c.primitive)
           else None) or CANNOT_HOLD.get(c.fault)
    verdict = "holds" if expected(c) else f"cannot hold: {why}"
    for k, why in allowed(c).items():
        verdict += f" (mutual exclusion; {k} allowed: {why})"
    return (f"| {c.primitive} | {c.fault} | {r.get('ops', 0)} ({outcomes}) | {anomalies} | {lin} | "
            f"{fenced} | {verdict}; {'; '.join(extra)}; {c.elapsed:.0f} s |")


HEADER = ("| primitive | fault | operations (ok/fail/unknown) | anomalies | linearizable (Porcupine) "
          "| fenced resource | guarantee; notes |\n|---|---|---|---|---|---|---|")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default="slice", help="all | scripts | slice | primitive:fault,...")
    ap.add_argument("--ops", type=int, default=10_000, help="operations per cell (all workers)")
    ap.add_argument("--seconds", type=float, default=40, help="time limit per cell")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--server", default="redis", help="redis | redis8 | valkey | a path")
    ap.add_argument("--replication", default="effects", choices=["effects", "commands"],
                    help="the module's rlock.replication mode for the failover cells")
    ap.add_argument("--module", default=os.environ.get("RLOCK_MODULE", str(ROOT / "target/debug/librlock.so")))
    ap.add_argument("--worker", default=str(ROOT / "target/debug/rlock-faults-worker"))
    ap.add_argument("--out", default="/tmp/rlock-faults")
    ap.add_argument("--report", help="write the table to this file")
    ap.add_argument("--merge", action="store_true", help="replace only the rows of these cells in --report")
    ap.add_argument("--expect", action="store_true", help="fail on an anomaly where the guarantee holds")
    a = ap.parse_args()

    if a.cells == "all":
        cells = [f"{p}:{f}" for f in FAULTS for p in PRIMITIVES]
    elif a.cells == "scripts":
        cells = [f"{p}:{f}" for f in SCRIPTS_FAULTS for p in SCRIPTS_PRIMITIVES]
    elif a.cells == "slice":
        cells = SLICE
    else:
        cells = [c.strip() for c in a.cells.split(",") if c.strip()]
    for spec in cells:
        p, _, f = spec.partition(":")
        if base(p) not in PRIMITIVES or f not in FAULTS:
            ap.error(f"unknown cell {spec!r}: primitives {PRIMITIVES} (each also with "
                     f"{SCRIPTS_SUFFIX!r}), faults {FAULTS}")
    binary = sh(str(ROOT / "scripts" / "server-path.sh"), a.server).stdout.strip()
    out = Path(a.out).resolve()  # the servers chdir to their --dir
    out.mkdir(parents=True, exist_ok=True)
    version = sh(binary, "--version").stdout.strip()
    done: List[Cell] = []
    failures: List[str] = []
    # A module without the rlock.replication config (before issue 24) propagates effects only.
    has_mode_config = replication_config(binary, a.module, out)
    for spec in cells:
        p, _, f = spec.partition(":")
        mode = "commands" if f == "failover-commands" else a.replication
        c = Cell(p, f, a.server, a.ops, a.seconds, a.workers, out, mode)
        MODULE_ARGS[:] = ["replication", mode] if has_mode_config else []
        if f == "failover-commands" or (f.startswith("failover") and a.replication == "commands"):
            if not has_mode_config:
                c.note = "not yet implemented: rlock.replication commands (design.md 1.4, issue 24)"
                done.append(c)
                print(row(c), flush=True)
                continue
        if scripts_mode(p) and f not in SCRIPTS_FAULTS:
            c.note = ("not applicable: the module's replication mode" if f == "failover-commands"
                      else "not yet: the migrate cell's waiters and held locks are module "
                      "commands, and the Rust client's scripts mode is untested on a cluster")
            done.append(c)
            print(row(c), flush=True)
            continue
        if f == "migrate" and (p in ("lock-py", "lock-go") or not slot_migration(binary)):
            c.note = ("skipped: atomic slot migration needs Valkey 9.0+"
                      if p not in ("lock-py", "lock-go") else
                      "skipped: this worker has no cluster client")
            done.append(c)
            print(row(c), flush=True)
            continue
        if f == "partition" and os.geteuid() != 0:
            c.note = "skipped: network namespaces (ip netns) need root"
            done.append(c)
            print(row(c), flush=True)
            continue
        try:
            Run(c, binary, a.module, a.worker).run()
        except Exception as e:  # a cell that could not run is reported, not hidden
            c.note = f"did not run: {e}"
            failures.append(f"{spec}: {e}")
        done.append(c)
        print(row(c), flush=True)
        if a.expect and not c.note:
            r = c.result
            bad = {k: v for k, v in r.get("anomalies", {}).items() if v and k not in allowed(c)}
            fen = {k: v for k, v in r.get("fencing", {}).items() if v and k != "refused"}
            if expected(c) and bad:
                failures.append(f"{spec}: anomalies where the guarantee holds: {bad} {r.get('examples')}")
            if fen:
                failures.append(f"{spec}: fencing let stale writes through: {fen}")
    if a.report:
        # The hand-written findings under the table survive a re-run.
        old = Path(a.report).read_text() if Path(a.report).exists() else ""
        keep = old[old.index("\n## Findings"):] if "\n## Findings" in old else ""
        text = ("# rlock under faults: the matrix (generated by `make faults`; "
                "how to read it: faults/README.md)\n\n" + f"Server: {version}\nModule: {a.module}\nWorkers per cell: {a.workers}; "
                f"operations per cell: {a.ops}; time limit per cell: {a.seconds:.0f} s; "
                f"replication mode: {a.replication}; lease (watchdog): {WATCHDOG_MS} ms.\n\n"
                + HEADER + "\n" + "\n".join(row(c) for c in done) + "\n" + keep)
        if a.merge and old:
            # Re-run cells replace their rows in the existing report; the rest stays.
            rows = {tuple(x.strip() for x in line.split("|")[1:3]): line for line in
                    (row(c) for c in done)}
            lines = old.split("\n")
            seen = set()
            for i, line in enumerate(lines):
                cell = tuple(x.strip() for x in line.split("|")[1:3])
                if cell in rows:
                    lines[i] = rows[cell]
                    seen.add(cell)
            # Cells new to the report go at the end of its table.
            last = max((i for i, line in enumerate(lines) if line.startswith("|")), default=-1)
            lines[last + 1:last + 1] = [r for cell, r in rows.items() if cell not in seen]
            text = "\n".join(lines)
        Path(a.report).write_text(text)
    for fl in failures:
        print("FAIL", fl, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
