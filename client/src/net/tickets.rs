//! Waiting with queued tickets (SPEC 5, docs/tickets.md), shared by the blocking and
//! async clients: instead of blocking a connection of its own in the server (`WAIT`),
//! a waiting call sends its command with `WAIT t ASYNC ID id` on the client's one
//! **ticket connection**, gets `QUEUED` (or the ordinary reply), and waits for the
//! `granted` / `timeout` / `error` message of its request id on the same connection.
//!
//! The ticket connection speaks RESP3 (`HELLO 3`), so it is a subscriber and a command
//! connection at once: the `SUBSCRIBE` of a key's ticket channel is written before the
//! `ASYNC` command on the same socket, which makes a missed grant impossible without any
//! round trip to confirm the subscription. Channels are refcounted per key (subscribed
//! for the first waiter, unsubscribed after the last). One reader thread per client
//! routes replies (in order) and messages (by request id) to the waiters' event sinks.
//!
//! Tickets live as long as that connection: when it breaks, the server drops them and
//! takes back the grants not yet collected. Every waiter is then told `Lost` and re-sends
//! its command with the same request id on a new connection (resubscribed first): a
//! grant collected meanwhile is replayed, anything else is queued again.
//!
//! A waiter that leaves while its ticket may still be queued (a dropped future, a
//! client-side limit) stays registered as an *orphan*: if its grant comes after all, a
//! helper thread collects it and releases what was granted (`undo_commands`).
//!
//! On a Redis Cluster each node that has waiters gets a ticket connection of its own
//! ([`Tickets::for_node`], made and routed by `cluster_tickets`): the same machinery on
//! shard channels (`SSUBSCRIBE`/`SUNSUBSCRIBE`, one channel per command since channels
//! of one command must share a slot; messages come as `smessage`). A shard channel
//! refused with a redirection is not a refusal of tickets: the waiter's command behind
//! it is redirected too, and `cluster_tickets` sends it to the right node.
//!
//! Layering: below `cluster_tickets`, `blocking` and `aio` (which call
//! [`Tickets::wait_async`]), above `cmd`, `error` and
//! `options`.

use std::collections::{HashMap, VecDeque};
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ErrorKind, RedisError, RedisResult, Value};

use crate::options::WaitMode;
use crate::proto::logic::lock_ignoring_poison;

/// The name the ticket connection gives itself (`CLIENT LIST` shows it).
pub(crate) const CONNECTION_NAME: &str = "rlock-tickets";

/// How long connecting and the handshake of the ticket connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

// ---- pure parts: channel, message, command shape, state machine, undo ----------------------

/// The ticket channel of `key`: `rlock_ticket:{key}`, or `rlock_ticket:key` when the key
/// already has a `{` (Redisson's `prefixName`).
pub(crate) fn channel(key: &[u8]) -> Vec<u8> {
    let mut out = b"rlock_ticket:".to_vec();
    if key.contains(&b'{') {
        out.extend_from_slice(key);
    } else {
        out.push(b'{');
        out.extend_from_slice(key);
        out.push(b'}');
    }
    out
}

/// How a ticket left its queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Note {
    Granted,
    Timeout,
    /// It can never be granted here; the server's error text (`MOVED ...`, ...).
    Error(String),
}

/// A ticket message `<kind>:<id-len>:<owner-len>:<id><owner><detail>`: the note and the
/// request id. `None` if it is not one.
pub(crate) fn parse_message(payload: &[u8]) -> Option<(Note, String)> {
    let mut parts = payload.splitn(4, |&b| b == b':');
    let kind = parts.next()?;
    let num = |p: Option<&[u8]>| -> Option<usize> {
        let p = p?;
        if p.is_empty() || !p.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(p).ok()?.parse().ok()
    };
    let id_len = num(parts.next())?;
    let owner_len = num(parts.next())?;
    let rest = parts.next()?;
    if rest.len() < id_len.checked_add(owner_len)? {
        return None;
    }
    let id = String::from_utf8(rest[..id_len].to_vec()).ok()?;
    let detail = &rest[id_len + owner_len..];
    let note = match kind {
        b"granted" if detail.is_empty() => Note::Granted,
        b"timeout" if detail.is_empty() => Note::Timeout,
        b"error" => Note::Error(String::from_utf8_lossy(detail).into_owned()),
        _ => return None,
    };
    Some((note, id))
}

/// The error an `error` note stands for, as if the server had answered it.
pub(crate) fn note_error(detail: &str) -> RedisError {
    let mut wire = b"-".to_vec();
    wire.extend_from_slice(detail.replace(['\r', '\n'], " ").as_bytes());
    wire.extend_from_slice(b"\r\n");
    match redis::parse_redis_value(&wire).and_then(Value::extract_error) {
        Err(e) => e,
        Ok(_) => RedisError::from((
            ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "ticket error",
            detail.to_owned(),
        )),
    }
}

/// A waiting command taken apart: what it is, its key, its wait and its request id.
#[derive(Debug, Clone)]
pub(crate) struct Shape {
    args: Vec<Vec<u8>>,
    /// Index of the value after `WAIT`.
    wait_at: usize,
    wait_ms: u64,
    id: String,
    /// The caller's command had no `ID` (the latch): one is added for `ASYNC` only.
    added_id: bool,
    /// `RLATCH.AWAIT`: a `granted` note is the whole answer.
    latch: bool,
}

impl Shape {
    /// `None` for a command that does not wait (no `WAIT`) or has no key.
    pub(crate) fn of(cmd: &redis::Cmd) -> Option<Shape> {
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        if args.len() < 2 {
            return None;
        }
        let opt = |name: &[u8]| {
            (2..args.len().saturating_sub(1))
                .rev()
                .find(|&i| args[i].eq_ignore_ascii_case(name))
                .map(|i| i + 1)
        };
        let wait_at = opt(b"WAIT")?;
        let wait_ms = std::str::from_utf8(&args[wait_at]).ok()?.parse().ok()?;
        let (id, added_id) = match opt(b"ID") {
            Some(i) => (String::from_utf8(args[i].clone()).ok()?, false),
            None => (crate::proto::cmd::request_id(), true),
        };
        let latch = args[0].eq_ignore_ascii_case(b"RLATCH.AWAIT");
        Some(Shape {
            args,
            wait_at,
            wait_ms,
            id,
            added_id,
            latch,
        })
    }

    pub(crate) fn key(&self) -> &[u8] {
        &self.args[1]
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The command with `ASYNC` (and an `ID`), waiting `wait_ms` (0: no limit).
    pub(crate) fn ticketed(&self, wait_ms: u64) -> Vec<Vec<u8>> {
        let mut a = self.args.clone();
        a[self.wait_at] = wait_ms.to_string().into_bytes();
        a.push(b"ASYNC".to_vec());
        if self.added_id {
            a.push(b"ID".to_vec());
            a.push(self.id.clone().into_bytes());
        }
        a
    }

    /// The command without `WAIT`: answers at once, the ordinary reply (a replay of a
    /// remembered grant under the same id, or the reply of a timed-out wait).
    pub(crate) fn look(&self) -> Vec<Vec<u8>> {
        let mut a = self.args.clone();
        a.drain(self.wait_at - 1..=self.wait_at);
        a
    }

    /// The command (without `ASYNC`) for the wait left after `elapsed`: a blocked wait
    /// taking over from a ticket (a cluster slot half-way through a migration).
    pub(crate) fn rewaited(&self, elapsed: Duration) -> redis::Cmd {
        let args = match self.wait_left(elapsed) {
            Some(left) => {
                let mut a = self.args.clone();
                a[self.wait_at] = left.to_string().into_bytes();
                a
            }
            None => self.look(),
        };
        let mut c = redis::Cmd::new();
        for a in &args {
            c.arg(a.as_slice());
        }
        c
    }

    /// The wait left after `elapsed`: `Some(0)` for no limit, `None` when it is over.
    fn wait_left(&self, elapsed: Duration) -> Option<u64> {
        if self.wait_ms == 0 {
            return Some(0);
        }
        let spent = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        self.wait_ms.checked_sub(spent).filter(|&l| l > 0)
    }
}

/// What happened to a waiter.
#[derive(Debug)]
pub(crate) enum Event {
    /// The reply to its last command.
    Reply(RedisResult<Value>),
    /// Its ticket's message.
    Note(Note),
    /// The ticket connection of generation `.0` broke: anything queued there is gone.
    Lost(u64),
}

/// What a waiter does next.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Send these arguments on the ticket connection.
    Send(Vec<Vec<u8>>),
    /// Wait for the next event.
    Wait,
    /// The call's outcome.
    Done(Result<Value, String>),
    /// The module does not know `ASYNC`: wait the old way (a blocked `WAIT`).
    Fallback,
}

/// One ticketed wait, as a state machine over [`Event`]s; no I/O.
pub(crate) struct Machine {
    shape: Shape,
    started: Instant,
    /// A ticket of ours may be queued, granted and uncollected, or a command in flight.
    pub(crate) outstanding: bool,
    /// The generation of the connection that carried our last command.
    gen: u64,
    /// Whether the module is already known to take `ASYNC`.
    known: bool,
    /// The last error, kept as a `RedisError` for the caller ([`Machine::take_error`]).
    error: Option<RedisError>,
}

impl Machine {
    pub(crate) fn new(shape: Shape, started: Instant, known: bool) -> Self {
        Machine {
            shape,
            started,
            outstanding: false,
            gen: 0,
            known,
            error: None,
        }
    }

    pub(crate) fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The first command.
    pub(crate) fn start(&mut self, now: Instant) -> Step {
        self.resend(now)
    }

    /// Our command went out on connection generation `gen`.
    pub(crate) fn sent(&mut self, gen: u64) {
        self.gen = gen;
        self.outstanding = true;
    }

    /// The error of a `Done(Err(..))`.
    pub(crate) fn take_error(&mut self) -> Option<RedisError> {
        self.error.take()
    }

    fn resend(&self, now: Instant) -> Step {
        match self
            .shape
            .wait_left(now.saturating_duration_since(self.started))
        {
            Some(left) => Step::Send(self.shape.ticketed(left)),
            None => Step::Send(self.shape.look()),
        }
    }

    pub(crate) fn on(&mut self, ev: Event, now: Instant) -> Step {
        match ev {
            Event::Reply(Ok(Value::SimpleString(s))) if s == "QUEUED" => {
                self.known = true;
                Step::Wait
            }
            Event::Reply(Ok(v)) => {
                self.known = true;
                self.outstanding = false;
                Step::Done(Ok(v))
            }
            Event::Reply(Err(e)) => {
                self.outstanding = false;
                if !self.known && refuses_async(&e) {
                    return Step::Fallback;
                }
                let text = e.to_string();
                self.error = Some(e);
                Step::Done(Err(text))
            }
            Event::Note(Note::Granted) if self.shape.latch => {
                self.outstanding = false;
                Step::Done(Ok(Value::Int(1)))
            }
            // Collect: the same command and id again; the server replays the grant.
            Event::Note(Note::Granted) => Step::Send(self.shape.look()),
            // The ordinary reply of a timed-out wait: look once.
            Event::Note(Note::Timeout) => Step::Send(self.shape.look()),
            Event::Note(Note::Error(detail)) => {
                self.outstanding = false;
                self.error = Some(note_error(&detail));
                Step::Done(Err(detail))
            }
            Event::Lost(gen) if gen == self.gen => {
                self.outstanding = false;
                self.resend(now)
            }
            // A connection our last command never went on.
            Event::Lost(_) => Step::Wait,
        }
    }
}

/// Whether `e` is how a module without tickets answers `ASYNC`.
pub(crate) fn refuses_async(e: &RedisError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    e.code() == Some("ERR")
        && (text.contains("syntax")
            || text.contains("wrong number of arguments")
            || text.contains("unknown"))
}

/// The commands that give back what `reply` (to the command `args`) granted, for a
/// grant nobody will use (its waiter left).
pub(crate) fn undo_commands(args: &[Vec<u8>], reply: &Value) -> Vec<redis::Cmd> {
    let name = String::from_utf8_lossy(args.first().map_or(&[][..], |a| a)).to_ascii_uppercase();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let id = crate::proto::cmd::request_id();
    let mut out = Vec::new();
    match (name.as_str(), reply) {
        ("RLOCK.ACQUIRE", Value::Nil) => {
            let mut c = redis::cmd("RLOCK.RELEASE");
            c.arg(arg(1)).arg(arg(2)).arg("ID").arg(&id);
            out.push(c);
        }
        ("RFENCED.ACQUIRE", Value::Array(items)) if items.first() == Some(&Value::Nil) => {
            let mut c = redis::cmd("RLOCK.RELEASE");
            c.arg(arg(1)).arg(arg(2)).arg("ID").arg(&id);
            out.push(c);
        }
        ("RRWLOCK.ACQUIRE", Value::Nil) => {
            let mut c = redis::cmd("RRWLOCK.RELEASE");
            c.arg(arg(1)).arg(arg(2)).arg(arg(3)).arg("ID").arg(&id);
            out.push(c);
        }
        ("RSEMAPHORE.ACQUIRE", Value::Int(1)) => {
            let mut c = redis::cmd("RSEMAPHORE.RELEASE");
            c.arg(arg(1)).arg(arg(2)).arg("ID").arg(&id);
            out.push(c);
        }
        ("RPSEMAPHORE.ACQUIRE", _) => {
            let ids: Vec<Vec<u8>> = match reply {
                Value::BulkString(b) => vec![b.clone()],
                Value::Array(items) => items
                    .iter()
                    .filter_map(|v| match v {
                        Value::BulkString(b) => Some(b.clone()),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            };
            for (n, permit) in ids.into_iter().enumerate() {
                let mut c = redis::cmd("RPSEMAPHORE.RELEASE");
                c.arg(arg(1)).arg(permit).arg("ID").arg(format!("{id}-{n}"));
                out.push(c);
            }
        }
        _ => {}
    }
    out
}

// ---- the ticket connection --------------------------------------------------------------

/// Where an event for a waiter goes (a channel's sender).
pub(crate) type Sink = Arc<dyn Fn(Event) + Send + Sync>;

enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            #[cfg(unix)]
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            #[cfg(unix)]
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(d),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_read_timeout(d),
        }
    }

    fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(d),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_write_timeout(d),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            #[cfg(unix)]
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// A waiter's registration.
enum Slot {
    Live {
        sink: Sink,
        channel: Vec<u8>,
    },
    /// Its waiter left with a ticket possibly queued: a grant is collected and undone.
    Orphan {
        channel: Vec<u8>,
        look: Vec<Vec<u8>>,
        latch: bool,
    },
}

impl Slot {
    fn channel(&self) -> &[u8] {
        match self {
            Slot::Live { channel, .. } | Slot::Orphan { channel, .. } => channel,
        }
    }
}

/// What the ticket connection owes an answer to, in order.
#[derive(Debug, PartialEq)]
enum Pending {
    /// A waiter's command: one reply.
    Reply(String),
    /// A `SUBSCRIBE` of this many channels: as many `subscribe` pushes, or one error
    /// (ACL: a user without access to the channel), which must not be taken for the next
    /// waiter's reply.
    Subscribe(usize),
    /// An `UNSUBSCRIBE` of this many channels: as many `unsubscribe` pushes.
    Unsubscribe(usize),
}

#[derive(Default)]
struct State {
    /// Shard channels (`SSUBSCRIBE`, `smessage`): a cluster node's ticket connection.
    shard: bool,
    writer: Option<Stream>,
    gen: u64,
    pending: VecDeque<Pending>,
    channels: HashMap<Vec<u8>, usize>,
    waiters: HashMap<String, Slot>,
}

/// Modes of [`Tickets::mode`].
const UNKNOWN: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;

pub(crate) struct Shared {
    client: redis::Client,
    state: Mutex<State>,
    mode: AtomicU8,
    /// `WaitMode::Tickets`: never fall back.
    forced: bool,
    /// Why the server refused a ticket channel (`SUBSCRIBE` answered an error).
    refused: Mutex<Option<RedisError>>,
}

/// One client's ticket connection and waiters. Dropping it closes the connection.
pub(crate) struct Tickets {
    shared: Arc<Shared>,
}

impl Drop for Tickets {
    fn drop(&mut self) {
        if let Some(w) = lock_ignoring_poison(&self.shared.state).writer.take() {
            w.shutdown();
        }
    }
}

fn pack(args: &[Vec<u8>]) -> Vec<u8> {
    let mut c = redis::Cmd::new();
    for a in args {
        c.arg(a.as_slice());
    }
    c.get_packed_command()
}

fn io_err(what: &'static str, detail: String) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        format!("{what}: {detail}"),
    ))
}

impl Tickets {
    /// Tickets for a single-server client, per `mode` (None for `Blocking`).
    pub(crate) fn new(client: &redis::Client, mode: WaitMode) -> Option<Tickets> {
        Self::with_channels(client, mode, false)
    }

    /// Tickets on one cluster node (`client`), heard on shard channels.
    pub(crate) fn for_node(client: &redis::Client, mode: WaitMode) -> Option<Tickets> {
        Self::with_channels(client, mode, true)
    }

    fn with_channels(client: &redis::Client, mode: WaitMode, shard: bool) -> Option<Tickets> {
        let start = match mode {
            WaitMode::Blocking => return None,
            WaitMode::Tickets => ON,
            WaitMode::Auto => UNKNOWN,
        };
        Some(Tickets {
            shared: Arc::new(Shared {
                client: client.clone(),
                state: Mutex::new(State {
                    shard,
                    ..State::default()
                }),
                mode: AtomicU8::new(start),
                forced: mode == WaitMode::Tickets,
                refused: Mutex::new(None),
            }),
        })
    }

    /// Whether waits should try tickets (not known to be unsupported).
    pub(crate) fn enabled(&self) -> bool {
        self.shared.mode.load(Ordering::Relaxed) != OFF
    }

    fn known(&self) -> bool {
        self.shared.mode.load(Ordering::Relaxed) == ON
    }

    fn learned(&self, m: &Machine) {
        if m.known {
            let _ = self.shared.mode.compare_exchange(
                UNKNOWN,
                ON,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    fn give_up(&self) {
        let _ =
            self.shared
                .mode
                .compare_exchange(UNKNOWN, OFF, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Registers waiter `id` on `channel` with `sink`, subscribing to the channel if it
    /// is new. A retry of a call that left (same id) takes over its orphan: its ticket is
    /// still queued on the current connection, whose generation is returned, and the
    /// retry waits for it instead of queueing a second one.
    fn join(&self, id: &str, channel: Vec<u8>, sink: Sink) -> Option<u64> {
        let mut st = lock_ignoring_poison(&self.shared.state);
        let resumed = match st.waiters.remove(id) {
            // The channel is still counted for the old registration.
            Some(Slot::Orphan { .. }) => Some(st.gen),
            Some(Slot::Live { .. }) => None,
            None => {
                let n = st.channels.entry(channel.clone()).or_insert(0);
                *n += 1;
                if *n == 1 && st.writer.is_some() {
                    let packed = pack(&[subscribe_cmd(st.shard).to_vec(), channel.clone()]);
                    st.pending.push_back(Pending::Subscribe(1));
                    write_locked(&mut st, &packed);
                }
                None
            }
        };
        st.waiters
            .insert(id.to_owned(), Slot::Live { sink, channel });
        resumed
    }

    /// Unregisters waiter `id`; with `orphan` (its ticket may still be queued) it stays
    /// registered until its ticket's fate is known.
    fn leave(&self, id: &str, orphan: Option<(Vec<Vec<u8>>, bool)>) {
        let mut st = lock_ignoring_poison(&self.shared.state);
        let Some(slot) = st.waiters.remove(id) else {
            return;
        };
        match orphan {
            Some((look, latch)) if st.writer.is_some() => {
                let channel = slot.channel().to_vec();
                st.waiters.insert(
                    id.to_owned(),
                    Slot::Orphan {
                        channel,
                        look,
                        latch,
                    },
                );
            }
            _ => release_channel(&mut st, slot.channel()),
        }
    }

    /// Sends `args` for waiter `id`, connecting first if needed; the connection's
    /// generation. A write error closes the connection: every waiter then gets `Lost`.
    fn send(&self, id: &str, args: &[Vec<u8>]) -> RedisResult<u64> {
        let mut st = lock_ignoring_poison(&self.shared.state);
        if st.writer.is_none() {
            connect_locked(&self.shared, &mut st)?;
        }
        st.pending.push_back(Pending::Reply(id.to_owned()));
        write_locked(&mut st, &pack(args));
        Ok(st.gen)
    }

    /// Whether a connection is up (an async waiter connects on a blocking thread otherwise).
    fn connected(&self) -> bool {
        lock_ignoring_poison(&self.shared.state).writer.is_some()
    }

    /// Waits for `cmd` (a waiting command) with a ticket. `None`: the module refuses
    /// `ASYNC` (or `cmd` is not a waiting command): wait the old way. `limit` bounds the
    /// wait for the final reply, like a blocked wait's read timeout. Cancel safe (a
    /// dropped future leaves an orphan whose late grant is given back).
    pub(crate) async fn wait_async(
        &self,
        cmd: &redis::Cmd,
        limit: Option<Duration>,
    ) -> Option<RedisResult<Value>> {
        self.wait_async_since(cmd, limit, Instant::now()).await
    }

    /// [`Self::wait_async`] for a call that began at `started`.
    pub(crate) async fn wait_async_since(
        &self,
        cmd: &redis::Cmd,
        limit: Option<Duration>,
        started: Instant,
    ) -> Option<RedisResult<Value>> {
        let shape = Shape::of(cmd)?;
        let until = limit.map(|l| tokio::time::Instant::from_std(started + l));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let sink: Sink = Arc::new(move |ev| {
            let _ = tx.send(ev);
        });
        let (mut member, mut step) = Member::join(self, shape, started, sink);
        loop {
            match step {
                Step::Send(args) => {
                    if !self.connected() {
                        // Connecting blocks: not on a runtime thread.
                        let shared = self.shared.clone();
                        let r = tokio::task::spawn_blocking(move || {
                            let mut st = lock_ignoring_poison(&shared.state);
                            match st.writer {
                                Some(_) => Ok(()),
                                None => connect_locked(&shared, &mut st),
                            }
                        })
                        .await;
                        match r {
                            Ok(Ok(())) => {}
                            Ok(Err(e)) => return self.send_failed(&member, e),
                            Err(e) => return Some(Err(io_err("connect", e.to_string()))),
                        }
                    }
                    match self.send(member.id(), &args) {
                        Ok(gen) => {
                            member.m.sent(gen);
                            step = Step::Wait;
                        }
                        Err(e) => return self.send_failed(&member, e),
                    }
                }
                Step::Wait => {
                    let ev = match until {
                        None => rx.recv().await,
                        Some(u) => tokio::time::timeout_at(u, rx.recv()).await.ok().flatten(),
                    };
                    match ev {
                        Some(ev) => {
                            if let (Event::Lost(_), Some(out)) = (&ev, self.refusal()) {
                                return out;
                            }
                            step = member.m.on(ev, Instant::now());
                        }
                        None => return Some(Err(no_reply())),
                    }
                }
                Step::Done(r) => return Some(member.finish(r)),
                Step::Fallback => {
                    self.give_up();
                    return None;
                }
            }
        }
    }

    /// After a `Lost`: when the server refused a ticket channel (ACL), the wait's
    /// outcome: wait the old way from now on (`Some(None)`), or with forced tickets the
    /// refusal itself.
    fn refusal(&self) -> Option<Option<RedisResult<Value>>> {
        let e = lock_ignoring_poison(&self.shared.refused).clone()?;
        if self.shared.forced {
            return Some(Some(Err(e)));
        }
        self.shared.mode.store(OFF, Ordering::Relaxed);
        Some(None)
    }

    /// A send that could not connect: a transport error is the call's (its retries
    /// try again); a server refusing the handshake (no `HELLO 3`, no TLS support here)
    /// turns tickets off for a client not yet known to use them: `None`, wait the old way.
    fn send_failed(&self, member: &Member<'_>, e: RedisError) -> Option<RedisResult<Value>> {
        if member.m.known || e.is_io_error() || e.is_timeout() || e.is_connection_refusal() {
            return Some(Err(e));
        }
        self.give_up();
        None
    }

    /// Registered waiters and subscribed channels (tests).
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let st = lock_ignoring_poison(&self.shared.state);
        (st.waiters.len(), st.channels.len())
    }
}

fn no_reply() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer to a ticketed wait",
    ))
}

/// A waiter's registration for the length of one wait: leaving (also by a dropped
/// future) unregisters it, as an orphan if its ticket may still be queued.
struct Member<'a> {
    t: &'a Tickets,
    m: Machine,
}

impl<'a> Member<'a> {
    /// Registers a waiter; its first step (a send, or waiting for the ticket an orphan
    /// of the same id left queued).
    fn join(t: &'a Tickets, shape: Shape, started: Instant, sink: Sink) -> (Self, Step) {
        let resumed = t.join(shape.id(), channel(shape.key()), sink);
        let mut m = Machine::new(shape, started, t.known());
        let step = match resumed {
            Some(gen) => {
                m.sent(gen);
                Step::Wait
            }
            None => m.start(started),
        };
        (Member { t, m }, step)
    }

    fn id(&self) -> &str {
        self.m.shape().id()
    }

    fn finish(&mut self, r: Result<Value, String>) -> RedisResult<Value> {
        self.t.learned(&self.m);
        match r {
            Ok(v) => Ok(v),
            Err(text) => Err(self
                .m
                .take_error()
                .unwrap_or_else(|| io_err("ticket", text))),
        }
    }
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        let shape = self.m.shape();
        let orphan = self.m.outstanding.then(|| (shape.look(), shape.latch));
        self.t.leave(shape.id(), orphan);
    }
}

/// One reference less on `channel`; unsubscribes after the last.
fn release_channel(st: &mut State, channel: &[u8]) {
    if let Some(n) = st.channels.get_mut(channel) {
        *n -= 1;
        if *n == 0 {
            st.channels.remove(channel);
            if st.writer.is_some() {
                let verb: &[u8] = if st.shard {
                    b"SUNSUBSCRIBE"
                } else {
                    b"UNSUBSCRIBE"
                };
                let packed = pack(&[verb.to_vec(), channel.to_vec()]);
                st.pending.push_back(Pending::Unsubscribe(1));
                write_locked(st, &packed);
            }
        }
    }
}

/// Writes on the current connection, if any; a failed write closes it (the reader then
/// reports it lost).
fn write_locked(st: &mut State, bytes: &[u8]) {
    if let Some(w) = st.writer.as_mut() {
        if w.write_all(bytes).is_err() {
            w.shutdown();
        }
    }
}

fn open_stream(info: &redis::ConnectionInfo) -> RedisResult<Stream> {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => {
            let mut last = None;
            for addr in (host.as_str(), *port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(Stream::Tcp(s));
                    }
                    Err(e) => last = Some(e),
                }
            }
            Err(last
                .unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))
                .into())
        }
        #[cfg(unix)]
        ConnectionAddr::Unix(path) => Ok(Stream::Unix(UnixStream::connect(path)?)),
        _ => Err(RedisError::from((
            ErrorKind::InvalidClientConfig,
            "ticket connection",
            "TLS is not supported for tickets".to_owned(),
        ))),
    }
}

/// Opens a connection (`HELLO 3`, `SELECT`), subscribes to every channel with waiters,
/// and starts its reader. Orphans of the previous connection are gone with it.
fn connect_locked(shared: &Arc<Shared>, st: &mut State) -> RedisResult<()> {
    let info = shared.client.get_connection_info();
    let mut stream = open_stream(info)?;
    stream.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    // Writes happen under the state lock (an async task's too): a server that stops
    // reading must not hold every waiter; a timed-out write closes the connection.
    stream.set_write_timeout(Some(CONNECT_TIMEOUT))?;
    let settings = info.redis_settings();
    let mut hello: Vec<Vec<u8>> = vec![b"HELLO".to_vec(), b"3".to_vec()];
    if let Some(pw) = settings.password() {
        hello.push(b"AUTH".to_vec());
        hello.push(settings.username().unwrap_or("default").as_bytes().to_vec());
        hello.push(pw.as_bytes().to_vec());
    }
    hello.push(b"SETNAME".to_vec());
    hello.push(CONNECTION_NAME.as_bytes().to_vec());
    let mut setup = pack(&hello);
    let mut replies = 1;
    if settings.db() != 0 {
        setup.extend(pack(&[
            b"SELECT".to_vec(),
            settings.db().to_string().into_bytes(),
        ]));
        replies += 1;
    }
    stream.write_all(&setup)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut parser = redis::Parser::new();
    for _ in 0..replies {
        parser.parse_value(&mut reader)?.extract_error()?;
    }
    stream.set_read_timeout(None)?;
    // A new connection: a channel refused on the old one may be allowed now.
    *lock_ignoring_poison(&shared.refused) = None;
    st.gen += 1;
    st.pending.clear();
    // Orphans lived on the old connection: their tickets and grants went with it.
    let orphans: Vec<String> = st
        .waiters
        .iter()
        .filter(|(_, s)| matches!(s, Slot::Orphan { .. }))
        .map(|(id, _)| id.clone())
        .collect();
    for id in orphans {
        if let Some(slot) = st.waiters.remove(&id) {
            drop_channel_ref(st, slot.channel());
        }
    }
    if st.shard {
        // One `SSUBSCRIBE` per channel: the channels of one command must share a slot.
        for ch in st.channels.keys() {
            stream.write_all(&pack(&[b"SSUBSCRIBE".to_vec(), ch.clone()]))?;
            st.pending.push_back(Pending::Subscribe(1));
        }
    } else if !st.channels.is_empty() {
        let mut sub = vec![b"SUBSCRIBE".to_vec()];
        sub.extend(st.channels.keys().cloned());
        stream.write_all(&pack(&sub))?;
        st.pending.push_back(Pending::Subscribe(st.channels.len()));
    }
    st.writer = Some(stream);
    let (shared2, gen) = (shared.clone(), st.gen);
    std::thread::Builder::new()
        .name("rlock-tickets".into())
        .spawn(move || reader_loop(shared2, gen, reader, parser))
        .map_err(|e| io_err("spawn", e.to_string()))?;
    Ok(())
}

/// Reads the connection of generation `gen` until it breaks, routing replies and notes.
fn reader_loop(
    shared: Arc<Shared>,
    gen: u64,
    mut reader: BufReader<Stream>,
    mut parser: redis::Parser,
) {
    loop {
        let v = match parser.parse_value(&mut reader) {
            Ok(v) => v,
            Err(_) => break,
        };
        let mut st = lock_ignoring_poison(&shared.state);
        if st.gen != gen {
            return;
        }
        match v {
            Value::Push {
                kind: redis::PushKind::Message | redis::PushKind::SMessage,
                data,
            } => {
                let Some(Value::BulkString(payload)) = data.get(1) else {
                    continue;
                };
                if let Some((note, id)) = parse_message(payload) {
                    route_note(&shared, &mut st, &id, note);
                }
            }
            Value::Push {
                kind: redis::PushKind::Subscribe | redis::PushKind::SSubscribe,
                ..
            } => count_down(&mut st.pending, true),
            Value::Push {
                kind: redis::PushKind::Unsubscribe | redis::PushKind::SUnsubscribe,
                ..
            } => count_down(&mut st.pending, false),
            Value::Push { .. } => {}
            other => match st.pending.pop_front() {
                Some(Pending::Reply(id)) => {
                    route_reply(&shared, &mut st, &id, other.extract_error())
                }
                // A cluster node that does not serve the channel's slot (any more): the
                // command written after it is redirected too, and its waiter re-routes.
                Some(Pending::Subscribe(_)) if st.shard && redirected(&other) => {}
                Some(Pending::Subscribe(_)) => {
                    // A channel we may not hear: no waiter on it could ever be told of
                    // its grant. Close the connection; every waiter is told `Lost` and
                    // finds the refusal (see `Tickets::refusal`).
                    let e = other.extract_error().err().unwrap_or_else(|| {
                        io_err("ticket channel", "SUBSCRIBE refused".to_owned())
                    });
                    *lock_ignoring_poison(&shared.refused) = Some(e);
                    if let Some(w) = st.writer.as_ref() {
                        w.shutdown();
                    }
                }
                Some(Pending::Unsubscribe(_)) | None => {}
            },
        }
    }
    let mut st = lock_ignoring_poison(&shared.state);
    if st.gen != gen {
        return;
    }
    if let Some(w) = st.writer.take() {
        w.shutdown();
    }
    st.pending.clear();
    for slot in st.waiters.values() {
        if let Slot::Live { sink, .. } = slot {
            sink(Event::Lost(gen));
        }
    }
    // Orphans' tickets and uncollected grants went with the connection.
    let orphans: Vec<String> = st
        .waiters
        .iter()
        .filter(|(_, s)| matches!(s, Slot::Orphan { .. }))
        .map(|(id, _)| id.clone())
        .collect();
    for id in orphans {
        if let Some(slot) = st.waiters.remove(&id) {
            drop_channel_ref(&mut st, slot.channel());
        }
    }
}

fn subscribe_cmd(shard: bool) -> &'static [u8] {
    if shard {
        b"SSUBSCRIBE"
    } else {
        b"SUBSCRIBE"
    }
}

/// Whether `v` is a cluster redirection (or the cluster being down or reshaped).
fn redirected(v: &Value) -> bool {
    match v.clone().extract_error() {
        Err(e) => matches!(e.code(), Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN")),
        Ok(_) => false,
    }
}

/// One `subscribe` (or `unsubscribe`) push answered: counts down the pending
/// `SUBSCRIBE` (`UNSUBSCRIBE`) at the front.
fn count_down(pending: &mut VecDeque<Pending>, subscribe: bool) {
    let done = match pending.front_mut() {
        Some(Pending::Subscribe(n)) if subscribe => {
            *n = n.saturating_sub(1);
            *n == 0
        }
        Some(Pending::Unsubscribe(n)) if !subscribe => {
            *n = n.saturating_sub(1);
            *n == 0
        }
        _ => false,
    };
    if done {
        pending.pop_front();
    }
}

/// One reference less on `channel`, without a connection to unsubscribe on.
fn drop_channel_ref(st: &mut State, channel: &[u8]) {
    if let Some(n) = st.channels.get_mut(channel) {
        *n -= 1;
        if *n == 0 {
            st.channels.remove(channel);
        }
    }
}

fn route_reply(shared: &Arc<Shared>, st: &mut State, id: &str, r: RedisResult<Value>) {
    match st.waiters.get(id) {
        Some(Slot::Live { sink, .. }) => sink(Event::Reply(r)),
        Some(Slot::Orphan { .. }) => match r {
            Ok(Value::SimpleString(s)) if s == "QUEUED" => {}
            Ok(v) => {
                // Granted at once to a waiter that had left: give it back.
                let slot = st.waiters.remove(id).expect("just seen");
                release_channel(st, slot.channel());
                if let Slot::Orphan { look, .. } = slot {
                    undo_later(shared, look, Some(v));
                }
            }
            Err(_) => {
                let slot = st.waiters.remove(id).expect("just seen");
                release_channel(st, slot.channel());
            }
        },
        None => {}
    }
}

fn route_note(shared: &Arc<Shared>, st: &mut State, id: &str, note: Note) {
    match st.waiters.get(id) {
        Some(Slot::Live { sink, .. }) => sink(Event::Note(note)),
        Some(Slot::Orphan { .. }) => {
            let slot = st.waiters.remove(id).expect("just seen");
            release_channel(st, slot.channel());
            if let (
                Note::Granted,
                Slot::Orphan {
                    look, latch: false, ..
                },
            ) = (note, slot)
            {
                undo_later(shared, look, None);
            }
        }
        None => {}
    }
}

/// On a thread of its own (rare: a grant whose waiter left): collects the grant with
/// `look` unless its `reply` is known, then releases what it granted.
fn undo_later(shared: &Arc<Shared>, look: Vec<Vec<u8>>, reply: Option<Value>) {
    let client = shared.client.clone();
    let _ = std::thread::Builder::new()
        .name("rlock-tickets-undo".into())
        .spawn(move || {
            let Ok(mut conn) = client.get_connection() else {
                return;
            };
            let _ = conn.set_read_timeout(Some(CONNECT_TIMEOUT));
            let reply = match reply {
                Some(v) => v,
                None => {
                    let mut c = redis::Cmd::new();
                    for a in &look {
                        c.arg(a.as_slice());
                    }
                    match c.query::<Value>(&mut conn) {
                        Ok(v) => v,
                        Err(_) => return,
                    }
                }
            };
            for c in undo_commands(&look, &reply) {
                let _ = c.query::<Value>(&mut conn);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[Vec<u8>]) -> Vec<String> {
        v.iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    }

    fn lock_cmd(wait: u64) -> redis::Cmd {
        crate::proto::cmd::acquire("k", None, "o:1", 30000, Some(wait), "r1")
    }

    #[test]
    fn it_names_the_channel_like_redissons_prefix_name() {
        assert_eq!(channel(b"lock"), b"rlock_ticket:{lock}".to_vec());
        assert_eq!(channel(b"{app}:lock"), b"rlock_ticket:{app}:lock".to_vec());
    }

    #[test]
    fn it_parses_ticket_messages() {
        // Table: payload -> (note, id) or None.
        for (payload, want) in [
            (&b"granted:2:8:r1client-1"[..], Some((Note::Granted, "r1"))),
            (b"timeout:2:0:r9", Some((Note::Timeout, "r9"))),
            (
                b"error:1:1:xoMOVED 12 127.0.0.1:7001",
                Some((Note::Error("MOVED 12 127.0.0.1:7001".into()), "x")),
            ),
            // Ids and owners may contain the separator.
            (b"granted:3:3:a:bc:d", Some((Note::Granted, "a:b"))),
            (b"granted:2:8:r1client-", None),
            (b"granted:2:0:r1extra", None),
            (b"granted:x:0:r1", None),
            (b"granted:-1:0:r1", None),
            (b"bogus:2:0:r1", None),
            (b"granted", None),
            (b"", None),
        ] {
            let got = parse_message(payload);
            let want = want.map(|(n, id)| (n, id.to_owned()));
            assert_eq!(got, want, "{}", String::from_utf8_lossy(payload));
        }
    }

    #[test]
    fn it_turns_an_error_note_into_the_servers_error() {
        let e = note_error("MOVED 12 127.0.0.1:7001");
        assert_eq!(e.code(), Some("MOVED"));
        let e = note_error("ERR too many waiters");
        assert_eq!(e.code(), Some("ERR"));
    }

    #[test]
    fn it_adds_async_and_keeps_the_id() {
        let s = Shape::of(&lock_cmd(250)).unwrap();
        assert_eq!(s.key(), b"k");
        assert_eq!(s.id(), "r1");
        assert_eq!(
            args(&s.ticketed(100)),
            [
                "RLOCK.ACQUIRE",
                "k",
                "o:1",
                "30000",
                "WAIT",
                "100",
                "ID",
                "r1",
                "ASYNC"
            ]
        );
        assert_eq!(
            args(&s.look()),
            ["RLOCK.ACQUIRE", "k", "o:1", "30000", "ID", "r1"]
        );
    }

    #[test]
    fn it_adds_an_id_to_the_latch_for_async_only() {
        let mut c = redis::cmd("RLATCH.AWAIT");
        c.arg("l").arg("WAIT").arg(0);
        let s = Shape::of(&c).unwrap();
        let t = args(&s.ticketed(0));
        assert_eq!(t[..5], ["RLATCH.AWAIT", "l", "WAIT", "0", "ASYNC"]);
        assert_eq!(t[5], "ID");
        assert_eq!(t[6], s.id());
        assert_eq!(args(&s.look()), ["RLATCH.AWAIT", "l"]);
    }

    #[test]
    fn it_leaves_commands_without_wait_alone() {
        assert!(Shape::of(&crate::proto::cmd::acquire("k", None, "o", 1, None, "r")).is_none());
        assert!(Shape::of(&redis::cmd("PING")).is_none());
    }

    #[test]
    fn it_counts_down_the_wait_of_a_resend() {
        let s = Shape::of(&lock_cmd(1000)).unwrap();
        assert_eq!(s.wait_left(Duration::from_millis(400)), Some(600));
        assert_eq!(s.wait_left(Duration::from_millis(1000)), None);
        let forever = Shape::of(&lock_cmd(0)).unwrap();
        assert_eq!(forever.wait_left(Duration::from_secs(99)), Some(0));
    }

    #[test]
    fn it_rewrites_the_wait_left_for_a_blocked_wait_taking_over() {
        let cmd_args = |c: redis::Cmd| {
            c.args_iter()
                .map(|a| match a {
                    redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => String::new(),
                })
                .collect::<Vec<_>>()
        };
        let s = Shape::of(&lock_cmd(1000)).unwrap();
        let left = cmd_args(s.rewaited(Duration::from_millis(300)));
        assert_eq!(
            left,
            [
                "RLOCK.ACQUIRE",
                "k",
                "o:1",
                "30000",
                "WAIT",
                "700",
                "ID",
                "r1"
            ]
        );
        let over = cmd_args(s.rewaited(Duration::from_secs(2)));
        assert_eq!(over, ["RLOCK.ACQUIRE", "k", "o:1", "30000", "ID", "r1"]);
        let forever = Shape::of(&lock_cmd(0)).unwrap();
        assert_eq!(cmd_args(forever.rewaited(Duration::from_secs(9)))[5], "0");
    }

    fn machine(wait: u64, known: bool) -> (Machine, Instant) {
        let now = Instant::now();
        (
            Machine::new(Shape::of(&lock_cmd(wait)).unwrap(), now, known),
            now,
        )
    }

    fn sent(step: &Step) -> Vec<String> {
        match step {
            Step::Send(a) => args(a),
            other => panic!("expected a send, got {other:?}"),
        }
    }

    #[test]
    fn it_collects_a_grant_with_the_same_id() {
        let (mut m, now) = machine(0, false);
        assert!(sent(&m.start(now)).contains(&"ASYNC".to_owned()));
        m.sent(1);
        let queued = Event::Reply(Ok(Value::SimpleString("QUEUED".into())));
        assert_eq!(m.on(queued, now), Step::Wait);
        assert!(m.outstanding, "a queued ticket is outstanding");
        let collect = sent(&m.on(Event::Note(Note::Granted), now));
        assert_eq!(collect, ["RLOCK.ACQUIRE", "k", "o:1", "30000", "ID", "r1"]);
        m.sent(1);
        assert_eq!(
            m.on(Event::Reply(Ok(Value::Nil)), now),
            Step::Done(Ok(Value::Nil))
        );
        assert!(!m.outstanding);
        assert!(m.known);
    }

    #[test]
    fn it_takes_an_ordinary_reply_at_once() {
        let (mut m, now) = machine(0, false);
        m.start(now);
        m.sent(1);
        assert_eq!(
            m.on(Event::Reply(Ok(Value::Int(5))), now),
            Step::Done(Ok(Value::Int(5)))
        );
    }

    #[test]
    fn it_looks_once_after_a_timeout() {
        let (mut m, now) = machine(500, true);
        m.start(now);
        m.sent(1);
        m.on(Event::Reply(Ok(Value::SimpleString("QUEUED".into()))), now);
        let look = sent(&m.on(Event::Note(Note::Timeout), now));
        assert!(!look.contains(&"WAIT".to_owned()) && !look.contains(&"ASYNC".to_owned()));
        m.sent(1);
        assert_eq!(
            m.on(Event::Reply(Ok(Value::Int(80))), now),
            Step::Done(Ok(Value::Int(80)))
        );
    }

    #[test]
    fn it_reports_an_error_note_as_the_servers_error() {
        let (mut m, now) = machine(0, true);
        m.start(now);
        m.sent(1);
        let step = m.on(Event::Note(Note::Error("MOVED 1 h:1".into())), now);
        assert!(matches!(step, Step::Done(Err(_))));
        assert_eq!(m.take_error().unwrap().code(), Some("MOVED"));
    }

    #[test]
    fn it_resends_after_its_connection_is_lost_with_the_wait_left() {
        let (mut m, t0) = machine(1000, true);
        m.start(t0);
        m.sent(3);
        m.on(Event::Reply(Ok(Value::SimpleString("QUEUED".into()))), t0);
        // A connection it never used: nothing of ours was lost.
        assert_eq!(m.on(Event::Lost(2), t0), Step::Wait);
        let again = sent(&m.on(Event::Lost(3), t0 + Duration::from_millis(300)));
        assert_eq!(again[5], "700");
        assert_eq!(again[7], "r1", "the same id");
        // The wait ran out while disconnected: look once.
        m.sent(4);
        let look = sent(&m.on(Event::Lost(4), t0 + Duration::from_secs(2)));
        assert!(!look.contains(&"WAIT".to_owned()));
    }

    #[test]
    fn it_falls_back_when_the_module_refuses_async_before_it_was_seen_to_work() {
        let (mut m, now) = machine(0, false);
        m.start(now);
        m.sent(1);
        let e = note_error("ERR syntax error");
        assert!(refuses_async(&e));
        assert!(!refuses_async(&note_error(
            "WRONGTYPE Operation against a key"
        )));
        assert_eq!(m.on(Event::Reply(Err(e)), now), Step::Fallback);
        let (mut known, now) = machine(0, true);
        known.start(now);
        known.sent(1);
        let step = known.on(Event::Reply(Err(note_error("ERR syntax error"))), now);
        assert!(
            matches!(step, Step::Done(Err(_))),
            "known to work: a real error"
        );
    }

    #[test]
    fn it_releases_what_an_abandoned_grant_took() {
        let a = |v: &[&str]| v.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        let packed = |cs: Vec<redis::Cmd>| {
            cs.iter()
                .map(|c| {
                    let s = Shape::of(c);
                    assert!(s.is_none());
                    c.args_iter()
                        .take(4)
                        .map(|x| match x {
                            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                            _ => String::new(),
                        })
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        };
        let lock = a(&["RLOCK.ACQUIRE", "k", "o", "100", "ID", "r"]);
        assert_eq!(
            packed(undo_commands(&lock, &Value::Nil))[0],
            ["RLOCK.RELEASE", "k", "o", "ID"]
        );
        assert!(
            undo_commands(&lock, &Value::Int(50)).is_empty(),
            "not granted"
        );
        let fenced = a(&["RFENCED.ACQUIRE", "k", "o", "100", "ID", "r"]);
        let tok = Value::Array(vec![Value::Nil, Value::Int(7)]);
        assert_eq!(packed(undo_commands(&fenced, &tok))[0][0], "RLOCK.RELEASE");
        let rw = a(&["RRWLOCK.ACQUIRE", "k", "READ", "o", "100", "ID", "r"]);
        assert_eq!(
            packed(undo_commands(&rw, &Value::Nil))[0],
            ["RRWLOCK.RELEASE", "k", "READ", "o"]
        );
        let sem = a(&["RSEMAPHORE.ACQUIRE", "s", "3", "ID", "r"]);
        assert_eq!(
            packed(undo_commands(&sem, &Value::Int(1)))[0],
            ["RSEMAPHORE.RELEASE", "s", "3", "ID"]
        );
        assert!(undo_commands(&sem, &Value::Int(0)).is_empty());
        let exp = a(&["RPSEMAPHORE.ACQUIRE", "e", "100", "ID", "r"]);
        let ids = Value::Array(vec![
            Value::BulkString(b"aa".to_vec()),
            Value::BulkString(b"bb".to_vec()),
        ]);
        let got = packed(undo_commands(&exp, &ids));
        assert_eq!(got.len(), 2);
        assert_eq!(got[1][..3], ["RPSEMAPHORE.RELEASE", "e", "bb"]);
        assert!(undo_commands(&a(&["RLATCH.AWAIT", "l"]), &Value::Int(1)).is_empty());
    }

    #[test]
    fn it_counts_subscribe_pushes_apart_from_replies() {
        let mut p: VecDeque<Pending> = [
            Pending::Subscribe(2),
            Pending::Reply("r".into()),
            Pending::Unsubscribe(1),
        ]
        .into();
        count_down(&mut p, false);
        assert_eq!(
            p.len(),
            3,
            "an unsubscribe push does not answer a SUBSCRIBE"
        );
        count_down(&mut p, true);
        assert_eq!(p.front(), Some(&Pending::Subscribe(1)));
        count_down(&mut p, true);
        assert_eq!(p.front(), Some(&Pending::Reply("r".into())));
        count_down(&mut p, true);
        assert_eq!(p.len(), 2, "a reply is owed first");
        p.pop_front();
        count_down(&mut p, false);
        assert!(p.is_empty());
    }

    #[test]
    fn it_refcounts_channels_and_keeps_orphans_until_their_fate_is_known() {
        let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        let t = Tickets::new(&client, WaitMode::Auto).unwrap();
        let sink: Sink = Arc::new(|_| {});
        t.join("a", channel(b"k"), sink.clone());
        t.join("b", channel(b"k"), sink.clone());
        t.join("c", channel(b"j"), sink.clone());
        assert_eq!(t.counts(), (3, 2));
        t.leave("a", None);
        assert_eq!(t.counts(), (2, 2), "k still has b");
        t.leave("b", None);
        assert_eq!(t.counts(), (1, 1), "k unsubscribed");
        // Without a connection nothing can be queued: no orphan is kept.
        t.leave("c", Some((vec![], false)));
        assert_eq!(t.counts(), (0, 0));
        // A retry of the same id takes over its registration without a second reference.
        assert_eq!(t.join("d", channel(b"k"), sink.clone()), None);
        assert_eq!(t.join("d", channel(b"k"), sink.clone()), None);
        t.leave("d", None);
        assert_eq!(t.counts(), (0, 0));
        // ... and an orphan's queued ticket, on the current connection.
        t.join("e", channel(b"k"), sink.clone());
        {
            let mut st = lock_ignoring_poison(&t.shared.state);
            st.gen = 7;
            let slot = st.waiters.remove("e").unwrap();
            let channel = slot.channel().to_vec();
            st.waiters.insert(
                "e".into(),
                Slot::Orphan {
                    channel,
                    look: vec![],
                    latch: false,
                },
            );
        }
        assert_eq!(t.join("e", channel(b"k"), sink), Some(7));
        assert_eq!(t.counts(), (1, 1));
        t.leave("e", None);
        assert_eq!(t.counts(), (0, 0));
    }
}
