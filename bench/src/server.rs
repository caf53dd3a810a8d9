//! One private redis-server per benchmark run, on a free loopback port, killed on drop.
//! Only the child started here is ever killed: other tests share this machine.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::Res;

pub struct Server {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Server {
    /// Starts `redis_server` with persistence off and, when given, the module loaded.
    /// A free port is found by binding port 0; another process may grab it before
    /// redis-server binds, so a failed start is retried on a fresh port.
    pub fn start(redis_server: &Path, module: Option<&Path>) -> Res<Server> {
        let mut last_err = String::new();
        for attempt in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let dir = std::env::temp_dir().join(format!(
                "rlock-bench-{}-{}-{}",
                std::process::id(),
                port,
                attempt
            ));
            std::fs::create_dir_all(&dir)?;
            let mut cmd = Command::new(redis_server);
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                // 10 000 queued waiters each need a connection of their own.
                .args(["--maxclients", "12000"])
                .arg("--dir")
                .arg(&dir)
                .args(["--logfile", "redis.log"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some(m) = module {
                cmd.arg("--loadmodule").arg(m);
            }
            let child = cmd.spawn()?;
            let mut server = Server { child, port, dir };
            match server.wait_ready(Duration::from_secs(10)) {
                Ok(()) => return Ok(server),
                Err(e) => {
                    last_err = format!("{e}; log: {}", server.log_tail());
                    drop(server);
                }
            }
        }
        Err(format!("redis-server did not start: {last_err}").into())
    }

    fn wait_ready(&mut self, limit: Duration) -> Res<()> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(format!("redis-server exited: {status}").into());
            }
            if let Ok(mut c) = self.client() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err("redis-server did not answer PING".into());
            }
            sleep(Duration::from_millis(20));
        }
    }

    pub fn client(&self) -> Res<redis::Connection> {
        let c = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        Ok(c.get_connection_with_timeout(Duration::from_secs(5))?)
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
