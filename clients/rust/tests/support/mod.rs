//! Test support: real `redis-server` processes with the module loaded, on free
//! ports, in temp dirs, killed on drop; a bounded `wait_until`; a fault-injecting proxy.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

/// The module under test: `$RLOCK_MODULE`, else the workspace's own build of it in this
/// test binary's profile directory (`target/debug/librlock.so` for `cargo test`), built
/// first, once per test process, so that `cargo test -p rlock-client` works on a fresh
/// clone and never runs against a module older than the source.
pub fn module_path() -> PathBuf {
    if let Ok(p) = std::env::var("RLOCK_MODULE") {
        return PathBuf::from(p);
    }
    // Tests run on many threads; the first one builds, the others wait for it here.
    // Concurrent test processes (e.g. nextest) are serialised by cargo's own build lock.
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(build_module).clone()
}

/// Runs `cargo build -p rlock` in the workspace, into the target directory and profile
/// this test binary was built in (it lives in `<target>/<profile>/deps/`), and returns
/// where the module lands. Cargo releases its build-directory lock before it runs the
/// tests, so this nested build does not wait on the `cargo test` that started us.
fn build_module() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test binary");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary in <target>/<profile>/deps/");
    let target_dir = profile_dir.parent().expect("<target>/<profile>");
    let module = profile_dir.join("librlock.so");
    // The directory is named after the profile, except the dev profile's ("debug").
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(name) => name,
    };
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    // `cargo test` gives its own path in $CARGO; the one that compiled us is the fallback.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
    if !module.exists() {
        // The first build takes minutes (bindgen); say why the tests are quiet meanwhile,
        // on the real stderr (libtest captures eprintln! of test threads).
        let _ = writeln!(
            std::io::stderr(),
            "building the module under test: `cargo build -p rlock` ..."
        );
    }
    let status = Command::new(&cargo)
        .args([
            "build",
            "-q",
            "-p",
            "rlock",
            "--profile",
            profile,
            "--target-dir",
        ])
        .arg(target_dir)
        .current_dir(&workspace)
        .stdin(Stdio::null())
        .status();
    match status {
        Ok(s) if s.success() => {}
        // Not fatal when a module is there already (e.g. no cargo beside a copied binary).
        _ if module.exists() => {
            eprintln!("warning: `{cargo} build -p rlock` failed; testing the existing {module:?}")
        }
        other => panic!(
            "cannot build the module (`{cargo} build -p rlock` in {}): {other:?}; \
             build it by hand or set RLOCK_MODULE",
            workspace.display()
        ),
    }
    module
}

fn server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

fn spawn_server(args: &[std::ffi::OsString]) -> Child {
    Command::new(server_bin())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start redis-server (set REDIS_SERVER)")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `pred` every 10 ms until it holds; false after `timeout`.
pub fn wait_until(timeout: Duration, mut pred: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + timeout;
    loop {
        if pred() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// [`wait_until`] for async tests: sleeps without blocking the runtime.
pub async fn eventually(timeout: Duration, mut pred: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + timeout;
    loop {
        if pred() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether one acquire of `key` comes to wait in the server within 5 s, as `c` sees it.
pub fn queued(c: &rlock_client::Client, key: &str) -> bool {
    wait_until(Duration::from_secs(5), || {
        c.info(key).unwrap().is_some_and(|i| i.waiters == 1)
    })
}

/// Asserts that a wait that took `took` lasted at least `min` (was not cut short).
#[track_caller]
pub fn assert_took_at_least(took: Duration, min: Duration) {
    assert!(took >= min, "returned early: {took:?}");
}

/// Client options with three attempts 10 ms apart: quick to retry a lost reply.
pub fn quick_retries() -> rlock_client::ClientOptions {
    rlock_client::ClientOptions::new().with_retry(
        rlock_client::RetryPolicy::new()
            .with_max_attempts(3)
            .with_base_delay(Duration::from_millis(10)),
    )
}

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "rlock-client-test-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A module-loaded redis-server on 127.0.0.1, killed (only this one) on drop.
pub struct Server {
    child: Child,
    pub port: u16,
    dir: TempDir,
    /// What it was started with, for [`Server::restart`].
    args: Vec<std::ffi::OsString>,
}

impl Server {
    pub fn start() -> Server {
        Self::start_with(&[])
    }

    /// Starts with extra arguments; retries on another port if the chosen one was
    /// taken between choosing and binding.
    pub fn start_with(extra: &[&str]) -> Server {
        Self::launch(extra, true)
    }

    /// A server without the module, as every managed Redis and Valkey is (scripts mode).
    pub fn start_without_module() -> Server {
        Self::launch(&[], false)
    }

    fn launch(extra: &[&str], with_module: bool) -> Server {
        // Not built for a server without it.
        let module = if with_module {
            module_path()
        } else {
            PathBuf::new()
        };
        assert!(
            !with_module || module.exists(),
            "module not found at {} (build it with `cargo build -p rlock`, or set RLOCK_MODULE)",
            module.display()
        );
        let load: Vec<&std::ffi::OsStr> = if with_module {
            vec!["--loadmodule".as_ref(), module.as_os_str()]
        } else {
            vec![]
        };
        let mut last_log = String::new();
        for _ in 0..5 {
            let dir = TempDir::new();
            let port = free_port();
            let log = dir.0.join("redis.log");
            let mut args: Vec<std::ffi::OsString> = vec!["--port".into(), port.to_string().into()];
            args.extend(
                ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
                    .iter()
                    .map(Into::into),
            );
            // A replica's first sync starts at once, not after the default 5 s.
            args.extend(["--repl-diskless-sync-delay", "0"].iter().map(Into::into));
            args.extend(["--dir".into(), dir.0.clone().into_os_string()]);
            args.extend(["--logfile".into(), log.clone().into_os_string()]);
            args.extend(load.iter().map(|a| a.to_os_string()));
            args.extend(extra.iter().map(Into::into));
            let child = spawn_server(&args);
            let mut s = Server {
                child,
                port,
                dir,
                args,
            };
            if s.wait_up() {
                return s;
            }
            last_log = std::fs::read_to_string(&log).unwrap_or_default();
        }
        panic!("redis-server did not start; last log:\n{last_log}");
    }

    /// True once it answers PING (not while it loads its data); false if it exited or
    /// did not answer within 10 s.
    fn wait_up(&mut self) -> bool {
        let up = wait_until(Duration::from_secs(10), || {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return true;
            }
            self.try_conn()
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c).ok())
                .is_some()
        });
        up && self.child.try_wait().ok().flatten().is_none()
    }

    /// Kills the server (SIGKILL), keeps it down for `down`, and starts it again on the
    /// same port and directory with the same arguments (with an AOF, it reloads it).
    pub fn restart(&mut self, down: Duration) {
        self.kill();
        thread::sleep(down);
        self.child = spawn_server(&self.args);
        assert!(
            self.wait_up(),
            "redis-server did not restart; log:\n{}",
            self.log()
        );
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The URL of a user restricted as a managed service's are (`+@all -@dangerous`: no
    /// MODULE, CONFIG, DEBUG, CLIENT KILL, INFO), made now.
    pub fn restricted_url(&self) -> String {
        let _: () = redis::cmd("ACL")
            .arg(&[
                "SETUSER",
                "app",
                "on",
                ">app-secret",
                "~*",
                "&*",
                "+@all",
                "-@dangerous",
            ])
            .query(&mut self.conn())
            .unwrap();
        format!("redis://app:app-secret@127.0.0.1:{}/", self.port)
    }

    fn try_conn(&self) -> Option<redis::Connection> {
        let c = redis::Client::open(self.url()).ok()?;
        c.get_connection_with_timeout(Duration::from_secs(1)).ok()
    }

    /// A plain connection for looking at the server from outside the client.
    pub fn conn(&self) -> redis::Connection {
        let c = redis::Client::open(self.url()).unwrap();
        let conn = c
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        conn
    }

    /// SIGKILL, at once: no shutdown, no last replication bytes.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    /// Kills the server; if it had crashed during the test (the log holds a crash report),
    /// fails the test with that report, so a crash never hides behind a connection error.
    fn drop(&mut self) {
        let report = crash_report(&self.log());
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(report) = report {
            if std::thread::panicking() {
                eprintln!("redis-server crashed during the test:\n{report}");
            } else {
                panic!("redis-server crashed during the test:\n{report}");
            }
        }
    }
}

/// The part of a server log that says why it died (from the crash line through the
/// stack trace, where the frames name the module call), if it died.
pub fn crash_report(log: &str) -> Option<String> {
    let at = ["crashed by signal", "ASSERTION FAILED", "Guru Meditation"]
        .iter()
        .find_map(|m| log.find(m))?;
    let boundary = |mut i: usize| {
        i = i.min(log.len());
        while !log.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let start = log[..boundary(at.saturating_sub(200))]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let end = log[at..]
        .find("------ REGISTERS")
        .map_or(log.len(), |i| at + i);
    Some(log[start..boundary(end.min(at + 8000))].to_string())
}

pub fn pttl(c: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(c).unwrap()
}

pub fn hget(c: &mut redis::Connection, key: &str, field: &str) -> Option<u64> {
    redis::cmd("HGET").arg(key).arg(field).query(c).unwrap()
}

pub fn exists(c: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query::<i64>(c).unwrap() == 1
}

/// Writes by hand a lock of `owner` (count 1) on `key` that expires in `ms`.
pub fn write_lock(c: &mut redis::Connection, key: &str, owner: &str, ms: u64) {
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg(owner)
        .arg(1)
        .query(c)
        .unwrap();
    let _: () = redis::cmd("PEXPIRE").arg(key).arg(ms).query(c).unwrap();
}

/// A master with a replica attached and in sync.
pub fn master_and_replica() -> (Server, Server) {
    let master = Server::start();
    let replica = replica_of(&master, master.port);
    (master, replica)
}

/// A replica of `master`, reaching it at `port` (the master's own, or a proxy's),
/// started and in sync.
pub fn replica_of(master: &Server, port: u16) -> Server {
    let port = port.to_string();
    let replica = Server::start_with(&["--replicaof", "127.0.0.1", &port]);
    let mut m = master.conn();
    let synced = wait_until(Duration::from_secs(15), || {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut m).unwrap();
        info.contains("connected_slaves:1") && info.contains("state=online")
    });
    assert!(
        synced,
        "replica did not sync; replica log:\n{}",
        replica.log()
    );
    replica
}

/// A replica without the module of `master` (also without it), started and in sync.
pub fn replica_without_module(master: &Server) -> Server {
    let port = master.port.to_string();
    let replica = Server::launch(&["--replicaof", "127.0.0.1", &port], false);
    let mut m = master.conn();
    let synced = wait_until(Duration::from_secs(15), || {
        let info: String = redis::cmd("INFO").arg("replication").query(&mut m).unwrap();
        info.contains("connected_slaves:1") && info.contains("state=online")
    });
    assert!(
        synced,
        "replica did not sync; replica log:\n{}",
        replica.log()
    );
    replica
}

/// One counter of `INFO rlock`.
pub fn rlock_stat(c: &mut redis::Connection, name: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("rlock").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in INFO rlock:\n{info}"))
}

/// A local 3-master cluster (no replicas), slots split in three.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start() -> Cluster {
        Self::launch(true)
    }

    /// A cluster without the module, as a managed service's is (scripts mode).
    pub fn start_without_module() -> Cluster {
        Self::launch(false)
    }

    fn launch(with_module: bool) -> Cluster {
        let nodes: Vec<Server> = (0..3)
            .map(|_| {
                // nodes.conf lands in the server's own temp dir (--dir).
                Server::launch(
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "5000",
                    ],
                    with_module,
                )
            })
            .collect();
        let ranges = [(0, 5460), (5461, 10922), (10923, 16383)];
        for (n, (lo, hi)) in nodes.iter().zip(ranges) {
            let mut c = n.conn();
            let _: () = redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(lo)
                .arg(hi)
                .query(&mut c)
                .unwrap();
            // Distinct config epochs from the start, as redis-cli --cluster create sets
            // them: left at 0 they are told apart by collisions over several gossip rounds,
            // and a slot moved meanwhile can be claimed back by its old owner.
            let _: () = redis::cmd("CLUSTER")
                .arg("SET-CONFIG-EPOCH")
                .arg(lo / 5461 + 1)
                .query(&mut c)
                .unwrap();
        }
        let mut first = nodes[0].conn();
        for n in &nodes[1..] {
            let _: () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(n.port)
                .query(&mut first)
                .unwrap();
        }
        for n in &nodes {
            let mut c = n.conn();
            let ok = wait_until(Duration::from_secs(30), || {
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).unwrap();
                info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3")
            });
            assert!(ok, "cluster did not form; log:\n{}", n.log());
        }
        Cluster { nodes }
    }

    /// Waits until every node knows every master's config epoch alike, the epochs are
    /// distinct, and every node's current epoch is their maximum: a slot's new owner then
    /// takes an epoch above all others when it claims the slot in a classic migration.
    /// With a stale current epoch it could take one another node has, and gossip the old
    /// owner sent before its SETSLOT could win the slot back where the claim was not heard.
    pub fn settle_epochs(&self) {
        let view = |n: &Server| -> Option<String> {
            let mut c = n.conn();
            let nodes: String = redis::cmd("CLUSTER").arg("NODES").query(&mut c).ok()?;
            let mut epochs: Vec<(String, u64)> = nodes
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .filter(|f| f.len() >= 8 && f[2].contains("master"))
                .map(|f| (f[0].to_string(), f[6].parse().unwrap_or(0)))
                .collect();
            epochs.sort();
            let mut distinct: Vec<u64> = epochs.iter().map(|e| e.1).collect();
            distinct.sort_unstable();
            distinct.dedup();
            let max = distinct.last().copied().unwrap_or(0);
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).ok()?;
            let current = format!("cluster_current_epoch:{max}\r");
            (distinct.len() == self.nodes.len() && info.contains(&current))
                .then(|| format!("{epochs:?}"))
        };
        let settled = wait_until(Duration::from_secs(20), || {
            let views: Vec<Option<String>> = self.nodes.iter().map(view).collect();
            views[0].is_some() && views.iter().all(|v| *v == views[0])
        });
        assert!(settled, "config epochs did not settle on every node");
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    /// A key whose slot is served by node `i` (0..3).
    pub fn key_on(&self, i: usize, prefix: &str) -> String {
        let mut c = self.nodes[0].conn();
        let ranges = [(0, 5460), (5461, 10922), (10923, 16383)];
        let (lo, hi) = ranges[i];
        for n in 0..10_000 {
            let k = format!("{prefix}:{n}");
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(&k)
                .query(&mut c)
                .unwrap();
            if slot >= lo && slot <= hi {
                return k;
            }
        }
        panic!("no key for node {i}");
    }

    /// A plain connection to the node serving `key`.
    pub fn conn_for(&self, key: &str) -> redis::Connection {
        let mut c = self.nodes[0].conn();
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut c)
            .unwrap();
        let i = match slot {
            0..=5460 => 0,
            5461..=10922 => 1,
            _ => 2,
        };
        self.nodes[i].conn()
    }
}

/// A TCP proxy in front of a server that can lose one reply: armed with a marker,
/// it forwards the next request containing the marker, lets the server execute it,
/// then closes the client's connection instead of relaying the reply. The client
/// sees a connection error for a command that did take effect.
///
/// It can also stand for a failover address (`set_upstream`: new connections go to
/// another server) and for a slow network (`hold_replies`: bytes from the server are
/// kept back, and thrown away if the server dies meanwhile), e.g. on a replication link.
///
/// And for a server that lacks a feature (`hide`): a word in the server's replies (a
/// `RLOCK.HELLO` feature) is overwritten with as many `x`, which keeps the reply's framing.
///
/// It relays strictly one request, one reply, which is enough for the single small
/// commands the tests send through it.
pub struct LossyProxy {
    pub port: u16,
    armed: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    pub lost: Arc<AtomicUsize>,
    upstream: Arc<AtomicU16>,
    hold: Arc<AtomicBool>,
    hidden: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
}

impl LossyProxy {
    pub fn start(upstream: u16) -> LossyProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let armed: Arc<std::sync::Mutex<Option<Vec<u8>>>> = Default::default();
        let lost = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let hold = Arc::new(AtomicBool::new(false));
        let upstream = Arc::new(AtomicU16::new(upstream));
        let hidden: Arc<std::sync::Mutex<Option<Vec<u8>>>> = Default::default();
        let (a, l, s, h, u, w) = (
            armed.clone(),
            lost.clone(),
            stop.clone(),
            hold.clone(),
            upstream.clone(),
            hidden.clone(),
        );
        thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let (a, l, h) = (a.clone(), l.clone(), h.clone());
                        let hide = w.lock().unwrap().clone();
                        let port = u.load(Ordering::SeqCst);
                        thread::spawn(move || relay(client, port, a, l, h, hide));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        LossyProxy {
            port,
            armed,
            lost,
            upstream,
            hold,
            hidden,
            stop,
        }
    }

    /// New connections read `word` overwritten in every reply (a server without it).
    pub fn hide(&self, word: &str) {
        *self.hidden.lock().unwrap() = Some(word.as_bytes().to_vec());
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Loses the reply of the next request containing `marker`.
    pub fn lose_next_reply_to(&self, marker: &str) {
        *self.armed.lock().unwrap() = Some(marker.as_bytes().to_vec());
    }

    /// New connections go to the server on `port` from now on (a failover).
    pub fn set_upstream(&self, port: u16) {
        self.upstream.store(port, Ordering::SeqCst);
    }

    /// Holds back (true) or lets through again (false) every byte from the server.
    pub fn hold_replies(&self, hold: bool) {
        self.hold.store(hold, Ordering::SeqCst);
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn relay(
    mut client: TcpStream,
    upstream: u16,
    armed: Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    lost: Arc<AtomicUsize>,
    hold: Arc<AtomicBool>,
    hide: Option<Vec<u8>>,
) {
    client.set_nonblocking(false).unwrap();
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)) else {
        return;
    };
    let lose = Arc::new(AtomicBool::new(false));
    // Server to client: relays everything, except that once a request was marked
    // it closes the client instead of relaying the reply. The client sends one
    // command at a time, so the next bytes from the server are that reply. Bytes
    // held back are relayed once the hold is lifted, or dropped with the connection.
    let (mut s_read, mut c_write) = (server.try_clone().unwrap(), client.try_clone().unwrap());
    let lose2 = lose.clone();
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut held: Vec<u8> = Vec::new();
        // Short reads so that lifting the hold flushes without waiting for new bytes.
        let _ = s_read.set_read_timeout(Some(Duration::from_millis(20)));
        loop {
            let n = match s_read.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    0
                }
                Err(_) => break,
            };
            if n > 0 && lose2.load(Ordering::SeqCst) {
                lost.fetch_add(1, Ordering::SeqCst);
                break;
            }
            held.extend_from_slice(&buf[..n]);
            // The bytes that may begin a hidden word cut by this read wait for the next.
            let mut keep = 0;
            if let Some(word) = hide.as_deref() {
                let mut i = 0;
                while i + word.len() <= held.len() {
                    if held[i..].starts_with(word) {
                        held[i..i + word.len()].fill(b'x');
                        i += word.len();
                    } else {
                        i += 1;
                    }
                }
                keep = (1..word.len())
                    .rev()
                    .find(|&k| held.ends_with(&word[..k]))
                    .unwrap_or(0);
            }
            if !hold.load(Ordering::SeqCst) && held.len() > keep {
                let send = held.len() - keep;
                if c_write.write_all(&held[..send]).is_err() {
                    break;
                }
                held.drain(..send);
            }
        }
        let _ = c_write.shutdown(std::net::Shutdown::Both);
        let _ = s_read.shutdown(std::net::Shutdown::Both);
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match client.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let req = &buf[..n];
        {
            let mut g = armed.lock().unwrap();
            if g.as_ref()
                .is_some_and(|m| req.windows(m.len()).any(|w| w == m.as_slice()))
            {
                *g = None;
                lose.store(true, Ordering::SeqCst);
            }
        }
        if server.write_all(req).is_err() {
            break;
        }
    }
    let _ = server.shutdown(std::net::Shutdown::Both);
}

// ---- server introspection shared by the ticket tests (tickets.rs, cluster_tickets.rs) ----

/// `waiters` of `<info-cmd> key` (flat pairs under RESP2; nil: none).
pub fn info_waiters(r: &mut redis::Connection, info: &str, key: &str) -> i64 {
    let v: redis::Value = redis::cmd(info).arg(key).query(r).unwrap();
    let redis::Value::Array(items) = v else {
        return 0;
    };
    items
        .chunks(2)
        .find_map(|kv| match kv {
            [redis::Value::BulkString(k), redis::Value::Int(n)] if k == b"waiters" => Some(*n),
            _ => None,
        })
        .unwrap_or(0)
}

/// `CLIENT LIST` as (id, name) pairs.
pub fn client_list(r: &mut redis::Connection) -> Vec<(u64, String)> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(r).unwrap();
    list.lines()
        .map(|line| {
            let field = |f: &str| {
                line.split(' ')
                    .find_map(|kv| kv.strip_prefix(f))
                    .unwrap_or_default()
                    .to_owned()
            };
            (field("id=").parse().unwrap(), field("name="))
        })
        .collect()
}

/// Clients blocked in the server (a blocked `WAIT` is one; a queued ticket is not).
pub fn blocked_clients(r: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("clients").query(r).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}
