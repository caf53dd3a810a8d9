//! Waiting with queued tickets (design.md 5, docs/commands/tickets.md), used by the client (the
//! blocking API through the async one): instead of blocking a connection of its own in the server (`WAIT`),
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
//! Each client has a notification tag (16 random hex digits). Where the connection's
//! probe (`RLOCK.HELLO`) names `ticket-notify`, every ticket goes with `NOTIFY tag` and
//! its messages come on the key's channel tagged for this client
//! (`rlock_ticket:{key}:<tag>`), which only this client subscribes to: a handoff wakes its
//! new holder's client alone, where the key channel woke every waiting client to read a
//! message for one (the fan-out that bounded tickets at 64 processes). Otherwise (an older
//! module, or a server whose ACL refuses the tagged channel: from the next connection on)
//! the key channel, as before. Refcounting is per key either way.
//!
//! Tickets live as long as that connection: when it breaks, the server drops them. Every
//! waiter is then told `Lost` and re-sends its command with the same request id on a new
//! connection (resubscribed first): a grant made meanwhile is replayed, anything else is
//! queued again.
//!
//! A lock, RW lock, fenced lock or semaphore waiter holds on its `granted`
//! message (design.md 5), its reply read from the message ([`Hold::reply`]: the token or
//! the permit ids are its detail): the reader
//! thread wakes it first, then writes the confirmation (the same command and id, without
//! `WAIT`) on the same connection, off the holder's path. Its reply settles the call's
//! [`Confirm`]: confirmed, or `TAKENBACK` (the connection had closed and the server's
//! grace ran out), which the lock reports as lost and after which a semaphore's permits
//! are not released (their release waits for this outcome: [`Confirm::outcome`]). A connection that breaks before the
//! reply came has the confirmation sent again on a connection of its own, within the
//! server's grace (`rlock.ticket-confirm-ms`); a message whose detail cannot be read (an
//! older module's) is collected first.
//!
//! A timed wait ends at its own deadline on the client's clock ([`Machine::deadline`]),
//! whatever the server has answered by then; the server's wait is asked to end a little
//! sooner ([`TIMEOUT_LEAD_MS`]), so its `timeout` message is normally in first. A waiter
//! that leaves while its ticket may still be queued (its deadline come first, a dropped
//! future) stays registered as an *orphan*: if its grant comes after all, a helper
//! thread collects it and releases what was granted (`undo_commands`).
//!
//! On a Redis Cluster each node that has waiters gets a ticket connection of its own
//! ([`Tickets::for_node`], made and routed by `cluster_tickets`): the same machinery on
//! shard channels (`SSUBSCRIBE`/`SUNSUBSCRIBE`, one channel per command since channels
//! of one command must share a slot; messages come as `smessage`). A shard channel
//! refused with a redirection is not a refusal of tickets: the waiter's command behind
//! it is redirected too, and `cluster_tickets` sends it to the right node.
//!
//! Files: `machine.rs`, the pure parts (channel, message, command shape, the waiter's
//! state machine, undo); this one, the connection and its reader thread.
//!
//! Layering: below `cluster_tickets` and `aio` (which call
//! [`Tickets::wait_async`]), above `cmd`, `error` and
//! `options`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ErrorKind, RedisError, RedisResult, Value};

use crate::options::WaitMode;
use crate::proto::hello;
use crate::proto::logic::lock_ignoring_poison;

/// The name the ticket connection gives itself (`CLIENT LIST` shows it).
pub(crate) const CONNECTION_NAME: &str = "rlock-tickets";

/// How long connecting and the handshake of the ticket connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a wait without a limit keeps connecting again after its command went out and
/// the server refused the connection (long enough for a restart that reloads an AOF):
/// past it the refusal is the wait's answer.
const UNTIMED_RECONNECT: Duration = Duration::from_secs(5);

mod machine;
mod stream;
pub(crate) use machine::*;
use stream::*;

// ---- the ticket connection --------------------------------------------------------------

/// Where an event for a waiter goes (a channel's sender).
pub(crate) type Sink = Arc<dyn Fn(Event) + Send + Sync>;
/// A grant held on its `granted` message and confirmed off the holder's path: its
/// outcome, and what to do if it was lost (the lock's lost signal), registered by the
/// holder once it exists, before or after the outcome is known. A call whose grant came
/// as a reply (free at once, or collected) never had anything to confirm: its outcome is
/// [`Outcome::Confirmed`] at once.
#[derive(Default)]
pub(crate) struct Confirm {
    state: Mutex<Confirmation>,
    /// Wakes [`Confirm::outcome`]'s waiters once settled.
    settled: tokio::sync::Notify,
}

#[derive(Default)]
struct Confirmation {
    /// The waiter held on its message and the confirmation went out (or will).
    in_flight: bool,
    /// The ticket's command was answered with the grant itself: the lock was free.
    at_once: bool,
    /// The connection that heard the grant, and the grant's request id, while its
    /// confirmation may still go out there ([`Confirm::send_behind`]).
    heard_on: Option<(Weak<Shared>, String)>,
    outcome: Option<Outcome>,
    /// Runs once if the outcome is a loss.
    hook: Option<Box<dyn FnOnce() + Send>>,
}

/// What a held grant's confirmation answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The server replayed the grant: it stands.
    Confirmed,
    /// `TAKENBACK`: the server gave the grant to the next waiter (a semaphore's permits
    /// went back to the pool), so releasing it would return what is not ours.
    TakenBack,
    /// No definite answer (another refusal, or none within the retry bound): reported
    /// lost, as the hold cannot be trusted, though the server may still have it.
    Doubt,
}

impl Outcome {
    /// The outcome a confirmation's reply says.
    fn of(r: &RedisResult<Value>) -> Outcome {
        match r {
            Ok(_) => Outcome::Confirmed,
            Err(e) if e.code() == Some("TAKENBACK") => Outcome::TakenBack,
            Err(_) => Outcome::Doubt,
        }
    }
}

impl Confirm {
    /// Runs `f` (once) if the grant turns out lost, at once if it was already.
    pub(crate) fn on_taken_back(&self, f: impl FnOnce() + Send + 'static) {
        let mut st = lock_ignoring_poison(&self.state);
        match st.outcome {
            None => st.hook = Some(Box::new(f)),
            Some(Outcome::Confirmed) => {}
            Some(Outcome::TakenBack | Outcome::Doubt) => {
                drop(st);
                f();
            }
        }
    }

    /// The waiter holds on its message, heard on `conn` under request id `id`: from now
    /// on its outcome waits for the confirmation's answer. Called before the holder is
    /// woken.
    fn begin(&self, conn: Weak<Shared>, id: String) {
        let mut st = lock_ignoring_poison(&self.state);
        st.in_flight = true;
        st.heard_on = Some((conn, id));
    }

    /// Writes `cmd` (the hold's release) on the connection that heard the grant, right
    /// behind its confirmation, while that confirmation is unanswered there (the same
    /// write when it was still held back for the next one): its reply, or an error once
    /// that connection broke before answering (`cmd` may then have run or not; resend it
    /// under the same request id once [`Self::outcome`] says the grant stands). `None`
    /// when the confirmation went elsewhere or is answered: send it the usual way.
    ///
    /// Where the server collects a grant in a release (`release-collects`) and the
    /// confirmation is still held back, it is not sent at all: `cmd` goes with
    /// `COLLECT <grant id>`, and its reply settles the grant as the confirmation's would
    /// (`TAKENBACK`: the release changed nothing, and the caller's usual path finds the
    /// hold gone). The handoff then runs the commands a blocked one does (design.md 5).
    ///
    /// Safe for a release of the grant's permits: the server takes a grant back only
    /// after its connection closed, and runs one connection's commands in order, so a
    /// release it runs there comes after a confirmation that stood. The server then reads
    /// both at once and answers both in one write, where the confirmation alone cost it a
    /// read and a write per grant, and the release waited for its answer.
    pub(crate) fn send_behind(
        &self,
        cmd: &redis::Cmd,
    ) -> Option<tokio::sync::oneshot::Receiver<RedisResult<Value>>> {
        // Not under this lock: the reader takes the connection's state, then this.
        let (weak, id) = lock_ignoring_poison(&self.state).heard_on.clone()?;
        let shared = weak.upgrade()?;
        let mut st = lock_ignoring_poison(&shared.state);
        if !matches!(st.waiters.get(&id), Some(Slot::Confirming { .. })) || st.writer.is_none() {
            return None;
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if withdraw_locked(&mut st, &id) {
            // Its confirmation not written yet: the release collects the grant itself
            // (`COLLECT`), and the server runs no confirmation at all.
            let mut collecting = cmd.clone();
            collecting.arg("COLLECT").arg(id.as_str());
            let mut bytes = fenced(&mut st);
            st.pending.push_back(Pending::Collecting(id, Answer(tx)));
            bytes.extend_from_slice(&collecting.get_packed_command());
            write_locked(&mut st, &bytes);
            return Some(rx);
        }
        let mut bytes = fenced(&mut st);
        st.pending.push_back(Pending::Command(Answer(tx)));
        bytes.extend_from_slice(&cmd.get_packed_command());
        write_locked(&mut st, &bytes);
        Some(rx)
    }

    /// Whether the wait's command was answered with the grant itself (the lock was
    /// free), not queued: what the lock's next acquire goes by (`LockShared::found`).
    pub(crate) fn answered_at_once(&self) -> bool {
        lock_ignoring_poison(&self.state).at_once
    }

    fn settle(&self, outcome: Outcome) {
        let hook = {
            let mut st = lock_ignoring_poison(&self.state);
            st.outcome = Some(outcome);
            st.hook.take()
        };
        self.settled.notify_waiters();
        if let (Some(f), false) = (hook, outcome == Outcome::Confirmed) {
            f();
        }
    }

    /// The outcome once known (at once for a grant that was a reply). A confirmation
    /// whose connection broke is retried for at most [`CONFIRM_RETRY_FOR`]; one whose
    /// reply never comes on a live connection is [`Outcome::Doubt`] past twice that, so
    /// this ends.
    pub(crate) async fn outcome(&self) -> Outcome {
        tokio::time::timeout(2 * CONFIRM_RETRY_FOR, self.settled_outcome())
            .await
            .unwrap_or(Outcome::Doubt)
    }

    async fn settled_outcome(&self) -> Outcome {
        loop {
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            {
                let st = lock_ignoring_poison(&self.state);
                match st.outcome {
                    Some(o) => return o,
                    None if !st.in_flight => return Outcome::Confirmed,
                    None => {}
                }
            }
            settled.await;
        }
    }

    /// The outcome if known now (`None` while the confirmation is out).
    pub(crate) fn outcome_now(&self) -> Option<Outcome> {
        let st = lock_ignoring_poison(&self.state);
        st.outcome.or((!st.in_flight).then_some(Outcome::Confirmed))
    }

    /// Whether it is known confirmed (tests).
    #[cfg(test)]
    pub(crate) fn is_confirmed(&self) -> bool {
        lock_ignoring_poison(&self.state).outcome == Some(Outcome::Confirmed)
    }
}

/// A waiter's registration.
enum Slot {
    Live {
        sink: Sink,
        channel: Vec<u8>,
        /// Holds on its `granted` message: the confirmation to send then, its outcome,
        /// and how the grant's reply reads from the message.
        hold: Option<(Vec<Vec<u8>>, Arc<Confirm>, Hold)>,
    },
    /// Held on its `granted` message; the confirmation's reply is awaited.
    Confirming {
        channel: Vec<u8>,
        look: Vec<Vec<u8>>,
        confirm: Arc<Confirm>,
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
            Slot::Live { channel, .. }
            | Slot::Orphan { channel, .. }
            | Slot::Confirming { channel, .. } => channel,
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
    /// A cluster node's `SSUBSCRIBE` of this key channel: one `ssubscribe` push, or a
    /// redirection when the node does not serve the key's slot (any more), after which
    /// the channel is not subscribed there ([`State::unheard`]).
    SubscribeShard(Vec<u8>),
    /// An `UNSUBSCRIBE` of this many channels: as many `unsubscribe` pushes.
    Unsubscribe(usize),
    /// A cluster node's `SUNSUBSCRIBE` of this key channel: one `sunsubscribe` push for
    /// it. One for another channel is the node dropping that one by itself.
    UnsubscribeShard(Vec<u8>),
    /// A command written behind a held grant's confirmation ([`Confirm::send_behind`]):
    /// its reply goes to the caller; dropped unanswered when the connection breaks.
    Command(Answer),
    /// A release written in place of waiter `id`'s held-back confirmation, collecting its
    /// grant (`COLLECT`, [`Confirm::send_behind`]): its reply goes to the caller and
    /// settles the grant as the confirmation's would; dropped unanswered when the
    /// connection breaks (the waiter, still confirming, confirms on a connection of its
    /// own).
    Collecting(String, Answer),
    /// A waiter's ticket sent `QUIET`: no reply if the server queued it (its message is
    /// then its answer, and takes this entry out), one reply otherwise (granted at once,
    /// an error, the server's own refusal such as `MOVED`). Nothing is written behind it
    /// but a [`Pending::Fence`], which tells the two apart.
    Quiet(String),
    /// `RLOCK.HELLO`, written right behind a [`Pending::Quiet`] still unanswered before
    /// anything else goes out ([`fenced`]): a reply in front of its own is the ticket's.
    Fence,
}

/// Where a [`Pending::Command`]'s reply goes.
struct Answer(tokio::sync::oneshot::Sender<RedisResult<Value>>);

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Answer")
    }
}

impl PartialEq for Answer {
    /// Only itself: no two callers wait for the same reply.
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

#[derive(Default)]
struct State {
    /// Shard channels (`SSUBSCRIBE`, `smessage`): a cluster node's ticket connection.
    shard: bool,
    /// The client's notification tag (one per client, every node's connection alike).
    tag: Arc<str>,
    /// The current connection's probe named `ticket-notify`: its tickets are queued with
    /// `NOTIFY tag` and its channels are the tagged ones ([`State::wire`]). Set on each
    /// connect, before any subscription or ticket goes out on it, so that one
    /// connection's subscriptions and tickets always agree; a reconnect that finds
    /// another answer (a failover to an older module) resubscribes and re-queues under it.
    notify: bool,
    /// The current connection's probe named `ticket-quiet`: its tickets go `QUIET`, and
    /// the server writes nothing for one it queues ([`Pending::Quiet`]).
    quiet: bool,
    writer: Option<Stream>,
    gen: u64,
    pending: VecDeque<Pending>,
    /// Waiters per key channel (the registration's name; subscribed as [`State::wire`]).
    channels: HashMap<Vec<u8>, usize>,
    waiters: HashMap<String, Slot>,
    /// Request ids whose late grant was given back (their waiter had left), newest last,
    /// at most [`GIVEN_BACK_KEPT`]. A retry of that call must not use the id again: the
    /// server would replay the grant, and the permit or lock would be both given back
    /// and used (found by the fault harness: a waiter paused past its limit).
    given_back: VecDeque<String>,
    /// Key channels subscribed on this connection with no waiter left, idle the longest
    /// first, at most [`IDLE_CHANNELS_KEPT`]: a next wait on the key subscribes nothing.
    /// Only tagged channels (`notify`), where no other client's message comes.
    idle: VecDeque<Vec<u8>>,
    /// Key channels counted in [`State::channels`] whose `SSUBSCRIBE` the node redirected
    /// (the key's slot had left it): not subscribed, whatever the count says. The next
    /// waiter on one subscribes again; the last one leaving keeps nothing idle for it. A
    /// channel believed subscribed that was not left a later waiter there deaf to its
    /// grant once the slot came back (the fault harness's `migrate` cell, with idle
    /// channels kept: acquires timed out).
    unheard: HashSet<Vec<u8>>,
    /// The current connection's probe named `release-collects`: a release may collect
    /// its grant in place of a held-back confirmation ([`Confirm::send_behind`]).
    collects: bool,
    /// Confirmations of held grants not written yet ([`CONFIRM_DEFER`]): they go out in
    /// front of the connection's next write, or with the flusher's.
    deferred: Vec<u8>,
    /// The last confirmation in `deferred`: its waiter's request id and where its
    /// command starts there ([`withdraw_locked`]). Cleared whenever `deferred` is.
    deferred_last: Option<(String, usize)>,
    /// The flusher writes `deferred` out once [`CONFIRM_DEFER`] has passed.
    flush_armed: bool,
}

/// How many key channels a ticket connection keeps subscribed with nobody waiting on
/// them. A process that waits on one lock at a time would otherwise send `SUBSCRIBE`
/// before each ticket and `UNSUBSCRIBE` after it: two commands per acquisition, a tenth
/// of the server's CPU for it (design.md 5). The bound keeps a client that touches many
/// keys from holding a subscription for each (a subscription costs the server a little
/// memory, no work: nothing is published on an idle tagged channel).
const IDLE_CHANNELS_KEPT: usize = 64;

/// How many given-back ids are remembered: a retry follows its failed attempt within
/// the client's retry delays, so only recent ones matter.
const GIVEN_BACK_KEPT: usize = 1024;

impl State {
    /// The name the key channel `channel` is subscribed under on this connection.
    fn wire(&self, channel: &[u8]) -> Vec<u8> {
        if self.notify {
            tagged_channel(channel, &self.tag)
        } else {
            channel.to_vec()
        }
    }

    /// The key channel a subscribed name stands for ([`State::wire`] undone).
    fn key_channel<'c>(&self, wire: &'c [u8]) -> &'c [u8] {
        if !self.notify {
            return wire;
        }
        wire.strip_suffix(self.tag.as_bytes())
            .and_then(|w| w.strip_suffix(b":"))
            .unwrap_or(wire)
    }

    fn gave_back(&mut self, id: &str) {
        if self.given_back.len() >= GIVEN_BACK_KEPT {
            self.given_back.pop_front();
        }
        self.given_back.push_back(id.to_owned());
    }
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
    /// The last connection's server names `ticket-holds` (design.md 5): a lock's waiter
    /// may hold on its `granted` message. Until a connection says so, waiters collect.
    holds: std::sync::atomic::AtomicBool,
    /// Why the server refused a ticket channel (`SUBSCRIBE` answered an error).
    refused: Mutex<Option<RedisError>>,
    /// The server refused a tagged channel (an ACL that allows the key's channel only,
    /// design.md 5): tickets go without `NOTIFY`, heard on the key's channel, from the
    /// next connection on.
    untagged: std::sync::atomic::AtomicBool,
    /// Wakes the flusher ([`flusher`]) when a confirmation is deferred.
    flush: Condvar,
    /// The flusher thread was started (once, at the first deferred confirmation).
    flusher: std::sync::atomic::AtomicBool,
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
    packed_cmd(args).get_packed_command()
}

fn packed_cmd(args: &[Vec<u8>]) -> redis::Cmd {
    let mut c = redis::Cmd::new();
    for a in args {
        c.arg(a.as_slice());
    }
    c
}

fn io_err(what: &'static str, detail: String) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        format!("{what}: {detail}"),
    ))
}

impl Tickets {
    /// Tickets for a single-server client, per `mode` (None for `Blocking`), notified
    /// under the client's `tag` where the server can.
    pub(crate) fn new(client: &redis::Client, mode: WaitMode, tag: Arc<str>) -> Option<Tickets> {
        Self::with_channels(client, mode, false, tag)
    }

    /// Tickets on one cluster node (`client`), heard on shard channels.
    pub(crate) fn for_node(
        client: &redis::Client,
        mode: WaitMode,
        tag: Arc<str>,
    ) -> Option<Tickets> {
        Self::with_channels(client, mode, true, tag)
    }

    fn with_channels(
        client: &redis::Client,
        mode: WaitMode,
        shard: bool,
        tag: Arc<str>,
    ) -> Option<Tickets> {
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
                    tag,
                    ..State::default()
                }),
                mode: AtomicU8::new(start),
                forced: mode == WaitMode::Tickets,
                holds: std::sync::atomic::AtomicBool::new(false),
                refused: Mutex::new(None),
                untagged: std::sync::atomic::AtomicBool::new(false),
                flush: Condvar::new(),
                flusher: std::sync::atomic::AtomicBool::new(false),
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

    /// Registers the waiter of `shape` on its key's channel with `sink`, subscribing to
    /// the channel if it is new. A retry of a call that left (same id) takes over its
    /// orphan: its ticket is still queued on the current connection, whose generation is
    /// returned, and the retry waits for it instead of queueing a second one. A retry
    /// whose orphan's grant was already given back gets a new id first (in the same
    /// critical section as the check, so no grant slips in between): it then waits anew.
    fn join(&self, shape: &mut Shape, sink: Sink, confirm: Option<&Arc<Confirm>>) -> Option<u64> {
        let channel = channel(shape.key());
        let mut st = lock_ignoring_poison(&self.shared.state);
        if let Some(at) = st.given_back.iter().position(|g| g == shape.id()) {
            st.given_back.remove(at);
            shape.renew_id();
        }
        let id = shape.id();
        let resumed = match st.waiters.remove(id) {
            // The channel is still counted for the old registration.
            Some(Slot::Orphan { .. }) => Some(st.gen),
            Some(Slot::Live { .. } | Slot::Confirming { .. }) => None,
            None => {
                let n = st.channels.entry(channel.clone()).or_insert(0);
                *n += 1;
                let first = *n == 1;
                let unheard = st.unheard.remove(&channel);
                if first && take_idle(&mut st, &channel) {
                    // Still subscribed on this connection: nothing to send.
                } else if (first || unheard) && st.writer.is_some() {
                    subscribe(&mut st, &channel);
                }
                None
            }
        };
        let hold = confirm
            .filter(|_| shape.holds())
            .map(|c| (shape.look(), c.clone(), shape.hold()));
        st.waiters.insert(
            id.to_owned(),
            Slot::Live {
                sink,
                channel,
                hold,
            },
        );
        resumed
    }

    /// A waiter registered before any connection had said whether the server's grants
    /// hold (a fresh client's first wait: `holds` is learnt from the connection's
    /// `RLOCK.HELLO`) holds on its `granted` message after all, if the connection made for
    /// it says so. Called once connected, before its first command goes out, so no
    /// message for it can have come yet. True if it now holds.
    fn hold_if_known(&self, shape: &Shape, confirm: &Arc<Confirm>) -> bool {
        if !self.shared.holds.load(Ordering::Relaxed) || !shape.holds() {
            return false;
        }
        let mut st = lock_ignoring_poison(&self.shared.state);
        match st.waiters.get_mut(shape.id()) {
            Some(Slot::Live {
                hold: hold @ None, ..
            }) => {
                *hold = Some((shape.look(), confirm.clone(), shape.hold()));
                true
            }
            _ => false,
        }
    }

    /// Unregisters waiter `id`; with `orphan` (its ticket may still be queued) it stays
    /// registered until its ticket's fate is known.
    fn leave(&self, id: &str, orphan: Option<(Vec<Vec<u8>>, bool)>) {
        leave_locked(&mut lock_ignoring_poison(&self.shared.state), id, orphan);
    }

    /// Sends `args` for waiter `id`, connecting first if needed; the connection's
    /// generation. A ticket (`ticketed`) goes with `NOTIFY tag` where this connection's
    /// probe named `ticket-notify`: decided here, under the lock that also orders the
    /// connection's subscriptions, so the ticket's messages go to the channel it
    /// subscribed. A ticket goes `QUIET` where the probe named `ticket-quiet` and nothing
    /// else is in flight: then the server answers it only if it did not queue it (the
    /// second value says so). A write
    /// error closes the connection: every waiter then gets `Lost`.
    fn send(&self, id: &str, args: &[Vec<u8>], ticketed: bool) -> RedisResult<(u64, bool)> {
        let mut st = lock_ignoring_poison(&self.shared.state);
        if st.writer.is_none() {
            connect_locked(&self.shared, &mut st)?;
        }
        // Quiet only with nothing else in flight: then the server has nothing to write
        // until the ticket's message, and no fence follows unless another command must go
        // out before it. Behind other replies, `QUEUED` would share their write anyway.
        let quiet = ticketed && st.quiet && st.pending.is_empty();
        let mut bytes = fenced(&mut st);
        st.pending.push_back(if quiet {
            Pending::Quiet(id.to_owned())
        } else {
            Pending::Reply(id.to_owned())
        });
        if ticketed && (st.notify || quiet) {
            let mut c = packed_cmd(args);
            if st.notify {
                c.arg("NOTIFY").arg(st.tag.as_bytes());
            }
            if quiet {
                c.arg("QUIET");
            }
            bytes.extend_from_slice(&c.get_packed_command());
        } else {
            bytes.extend_from_slice(&pack(args));
        }
        write_locked(&mut st, &bytes);
        Ok((st.gen, quiet))
    }

    /// Whether a connection is up (an async waiter connects on a blocking thread otherwise).
    fn connected(&self) -> bool {
        lock_ignoring_poison(&self.shared.state).writer.is_some()
    }

    /// Waits for `cmd` (a waiting command) with a ticket. `None`: the module refuses
    /// `ASYNC` (or `cmd` is not a waiting command): wait the old way. `limit` bounds the
    /// wait for the final reply, like a blocked wait's read timeout. Cancel safe (a
    /// dropped future leaves an orphan whose late grant is given back).
    ///
    /// With `confirm`, a lock or RW lock wait returns on its `granted` message and the
    /// grant is confirmed off the path; `confirm` tells if it was taken back.
    pub(crate) async fn wait_async(
        &self,
        cmd: &redis::Cmd,
        limit: Option<Duration>,
        confirm: Option<&Arc<Confirm>>,
    ) -> Option<RedisResult<Value>> {
        self.wait_async_since(cmd, limit, Instant::now(), confirm)
            .await
    }

    /// [`Self::wait_async`] for a call that began at `started`.
    pub(crate) async fn wait_async_since(
        &self,
        cmd: &redis::Cmd,
        limit: Option<Duration>,
        started: Instant,
        confirm: Option<&Arc<Confirm>>,
    ) -> Option<RedisResult<Value>> {
        let shape = Shape::of(cmd)?;
        let until = limit.map(|l| tokio::time::Instant::from_std(started + l));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let sink: Sink = Arc::new(move |ev| {
            let _ = tx.send(ev);
        });
        let (mut member, mut step) = Member::join(self, shape, started, sink, confirm);
        // Pause before connecting again after a refused connection (a restarting server),
        // and how long to keep trying when the wait itself has no limit.
        let mut backoff = Duration::from_millis(10);
        let reconnect_until =
            until.unwrap_or_else(|| tokio::time::Instant::now() + UNTIMED_RECONNECT);
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
                            // A command of this wait already went out (`known`): the
                            // server may have granted it under its request id while the
                            // connection was away (a restart reloads the grant from the
                            // AOF). Giving up now would leave that hold unknown to its
                            // owner, so connect again until the wait's own limit; the
                            // same id then answers the grant, or queues the ticket again.
                            Ok(Err(e))
                                if member.m.known
                                    && e.is_connection_refusal()
                                    && tokio::time::Instant::now() + backoff < reconnect_until =>
                            {
                                tokio::time::sleep(backoff).await;
                                backoff = (backoff * 2).min(Duration::from_millis(200));
                                step = Step::Send(args);
                                continue;
                            }
                            Ok(Err(e)) => return self.send_failed(&member, e),
                            Err(e) => return Some(Err(io_err("connect", e.to_string()))),
                        }
                    }
                    if let Some(c) = confirm.filter(|_| !member.m.known && !member.m.hold_on_grant)
                    {
                        member.m.hold_on_grant = self.hold_if_known(member.m.shape(), c);
                    }
                    let ticketed = member.m.shape().is_ticketed(&args);
                    match self.send(member.id(), &args, ticketed) {
                        Ok((gen, quiet)) => {
                            member.m.sent(gen);
                            // The probe said so: a quiet ticket's `QUEUED` never comes.
                            member.m.known |= quiet;
                            step = Step::Wait;
                        }
                        Err(e) => return self.send_failed(&member, e),
                    }
                }
                Step::Wait => {
                    // A timed wait ends at its own deadline on this client's clock, not
                    // when the server's answer comes back (a frozen or loaded server's
                    // comes late): whatever has been heard by then.
                    let deadline = member.m.deadline().map(tokio::time::Instant::from_std);
                    let ev = match (deadline, until) {
                        (None, None) => rx.recv().await.ok_or(false),
                        (d, u) => {
                            let at = d.into_iter().chain(u).min().expect("one is set");
                            match tokio::time::timeout_at(at, rx.recv()).await {
                                Ok(ev) => ev.ok_or(false),
                                Err(_) => Err(deadline.is_some_and(|d| d <= at)),
                            }
                        }
                    };
                    match ev {
                        Ok(ev) => {
                            if let (Event::Lost(_), Some(out)) = (&ev, self.refusal()) {
                                return out;
                            }
                            if let (Some(c), Event::Reply(Ok(v))) = (confirm, &ev) {
                                if !matches!(v, Value::SimpleString(s) if s == "QUEUED") {
                                    lock_ignoring_poison(&c.state).at_once = true;
                                }
                            }
                            step = member.m.on(ev, Instant::now());
                        }
                        Err(true) => step = self.expire(&mut member, &mut rx),
                        Err(false) => return Some(Err(no_reply())),
                    }
                }
                Step::Done(r) => return Some(member.finish(r)),
            }
        }
    }

    /// The deadline of `member`'s wait came first: its outcome ([`Machine::expire`]),
    /// from the events already sent to it (`rx`), read under the state lock so that no
    /// more can come; under the same lock it leaves its ticket as an orphan, or gives
    /// back a grant heard and not collected.
    fn expire(
        &self,
        member: &mut Member<'_>,
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<Event>,
    ) -> Step {
        let mut st = lock_ignoring_poison(&self.shared.state);
        let mut heard = Vec::new();
        while let Ok(ev) = rx.try_recv() {
            heard.push(ev);
        }
        let (step, leaves) = member.m.expire(heard, Instant::now());
        let shape = member.m.shape();
        let id = shape.id().to_owned();
        match leaves {
            Leaves::Nothing => {}
            // As `Member`'s drop would, but now: a message after this goes to the orphan.
            Leaves::Orphan => leave_locked(&mut st, &id, Some((shape.look(), shape.latch))),
            Leaves::Undo => {
                leave_locked(&mut st, &id, None);
                if !shape.latch {
                    st.gave_back(&id);
                    undo_later(&self.shared, shape.look(), None);
                }
            }
        }
        step
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
    /// try again); a server refusing the handshake (no `HELLO 3`, no TLS support here) or
    /// whose capability probe names no tickets ([`no_tickets`]) turns tickets off for a
    /// client not yet known to use them: `None`, wait the old way.
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

/// The capability probe names no `tickets`: the server has no rlock module, or one
/// without tickets. Not a transport error: a client not yet known to use tickets waits
/// the old way instead (`send_failed`).
fn no_tickets() -> RedisError {
    RedisError::from((
        ErrorKind::Client,
        "the server queues no tickets",
        "RLOCK.HELLO names no 'tickets' feature".to_owned(),
    ))
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
    fn join(
        t: &'a Tickets,
        mut shape: Shape,
        started: Instant,
        sink: Sink,
        confirm: Option<&Arc<Confirm>>,
    ) -> (Self, Step) {
        // Read once, for the registration and the machine alike: holds only if the
        // server said so.
        let confirm = confirm.filter(|_| t.shared.holds.load(Ordering::Relaxed));
        let resumed = t.join(&mut shape, sink, confirm);
        let mut m = Machine::new(shape, started, t.known());
        m.hold_on_grant = confirm.is_some();
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
        if self.m.held {
            // Held on its grant message: the reader made the registration a confirming
            // one in the same critical section that woke us, and settles it; taking the
            // lock here would only wait behind the confirmation's write.
            return;
        }
        let shape = self.m.shape();
        let orphan = self.m.outstanding.then(|| (shape.look(), shape.latch));
        self.t.leave(shape.id(), orphan);
    }
}

/// [`Tickets::leave`], under the state lock.
fn leave_locked(st: &mut State, id: &str, orphan: Option<(Vec<Vec<u8>>, bool)>) {
    let Some(slot) = st.waiters.remove(id) else {
        return;
    };
    if let Slot::Confirming { .. } = slot {
        st.waiters.insert(id.to_owned(), slot); // its confirmation's reply routes it
        return;
    }
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
        _ => release_channel(st, slot.channel()),
    }
}

/// Subscribes `channel` on the current connection.
fn subscribe(st: &mut State, channel: &[u8]) {
    let mut bytes = fenced(st);
    bytes.extend_from_slice(&pack(&[subscribe_cmd(st.shard).to_vec(), st.wire(channel)]));
    st.pending.push_back(if st.shard {
        Pending::SubscribeShard(channel.to_vec())
    } else {
        Pending::Subscribe(1)
    });
    write_locked(st, &bytes);
}

/// One reference less on `channel`; unsubscribes after the last.
fn release_channel(st: &mut State, channel: &[u8]) {
    if let Some(n) = st.channels.get_mut(channel) {
        *n -= 1;
        if *n == 0 {
            st.channels.remove(channel);
            if st.writer.is_none() || st.unheard.remove(channel) {
                return; // nothing subscribed to keep or to undo
            }
            if !st.notify {
                // The key's own channel: idle, it would hear every other client's grants.
                return unsubscribe(st, channel);
            }
            // Kept idle. A cluster node drops a shard channel by itself when the key's
            // slot leaves it (Valkey's atomic slot migration) and says so (`slot_left`);
            // one it never subscribed (redirected) is not kept (`unheard`).
            st.idle.push_back(channel.to_vec());
            if st.idle.len() > IDLE_CHANNELS_KEPT {
                if let Some(oldest) = st.idle.pop_front() {
                    unsubscribe(st, &oldest);
                }
            }
        }
    }
}

fn unsubscribe(st: &mut State, channel: &[u8]) {
    let verb: &[u8] = if st.shard {
        b"SUNSUBSCRIBE"
    } else {
        b"UNSUBSCRIBE"
    };
    let mut bytes = fenced(st);
    bytes.extend_from_slice(&pack(&[verb.to_vec(), st.wire(channel)]));
    st.pending.push_back(if st.shard {
        Pending::UnsubscribeShard(channel.to_vec())
    } else {
        Pending::Unsubscribe(1)
    });
    write_locked(st, &bytes);
}

/// What goes on the wire in front of the next command: a fence (`RLOCK.HELLO`) when the
/// last thing written is a quiet ticket still unanswered, registered as
/// [`Pending::Fence`]; nothing otherwise. The server writes nothing for a quiet ticket it
/// queued and one reply for any other outcome, including its own refusals that no module
/// code sees (`MOVED`, `OOM`, `LOADING`), so a reply read in that ticket's turn may be
/// its own or the next command's. The fence's reply, a map no waiting command answers,
/// settles it. The fence has no key and is allowed while the server loads, is stale or
/// runs a long script, so it is refused only where the connection cannot work at all.
/// At most one per quiet ticket, and rare: a ticket goes quiet only with nothing else in
/// flight, its message takes its entry out, and a process waiting in a loop writes
/// nothing between its ticket and that message.
fn fenced(st: &mut State) -> Vec<u8> {
    if matches!(st.pending.back(), Some(Pending::Quiet(_))) {
        st.pending.push_back(Pending::Fence);
        pack(&hello::hello_args())
    } else {
        Vec::new()
    }
}

/// Takes waiter `id`'s confirmation back out of `deferred` before it was written, where
/// the server collects a grant in a release (`release-collects`) and it is the last thing
/// deferred (its reply expected last): true if it did, and the caller's release collects
/// the grant instead. A fence deferred in front of it stays: the release goes behind it.
fn withdraw_locked(st: &mut State, id: &str) -> bool {
    let last = matches!(&st.deferred_last, Some((d, _)) if d == id);
    if !(st.collects && last && matches!(st.pending.back(), Some(Pending::Reply(r)) if r == id)) {
        return false;
    }
    let (_, at) = st.deferred_last.take().expect("just seen");
    st.deferred.truncate(at);
    st.pending.pop_back();
    true
}

/// The reply `r` of a release that collected waiter `id`'s grant ([`Pending::Collecting`])
/// settles it as its confirmation's would: run (the grant stood and is collected), or
/// `TAKENBACK` (the release changed nothing). Another error leaves it open (the release
/// may have been refused after it collected, or before): the confirmation is sent on a
/// connection of its own, whose answer decides.
fn collected(shared: &Arc<Shared>, st: &mut State, id: &str, r: &RedisResult<Value>) {
    if !matches!(st.waiters.get(id), Some(Slot::Confirming { .. })) {
        return;
    }
    let Some(Slot::Confirming {
        channel,
        confirm,
        look,
    }) = st.waiters.remove(id)
    else {
        return;
    };
    release_channel(st, &channel);
    match r {
        Ok(_) => confirm.settle(Outcome::Confirmed),
        Err(e) if e.code() == Some("TAKENBACK") => confirm.settle(Outcome::TakenBack),
        Err(e) => confirm_later(shared, look, confirm, redirection(e).then(|| e.clone())),
    }
}

/// Whether `v` is the fence's reply (`RLOCK.HELLO`'s map): no waiting command's.
fn fence_answer(v: &Value) -> bool {
    match v {
        Value::Map(fields) => fields
            .iter()
            .any(|(k, _)| matches!(k, Value::BulkString(b) if b == b"module")),
        _ => false,
    }
}

/// Takes `channel` out of the idle ones; true if it was there (still subscribed).
fn take_idle(st: &mut State, channel: &[u8]) -> bool {
    match st.idle.iter().position(|c| c.as_slice() == channel) {
        Some(at) => {
            st.idle.remove(at);
            true
        }
        None => false,
    }
}

/// Writes on the current connection, if any; a failed write closes it (the reader then
/// reports it lost).
/// Writes `bytes` on the current connection, after the confirmations deferred so far (in
/// the order their replies are expected).
fn write_locked(st: &mut State, bytes: &[u8]) {
    let joined;
    let bytes = if st.deferred.is_empty() {
        bytes
    } else {
        st.deferred_last = None;
        let mut all = std::mem::take(&mut st.deferred);
        all.extend_from_slice(bytes);
        joined = all;
        &joined
    };
    if bytes.is_empty() {
        return;
    }
    if let Some(w) = st.writer.as_mut() {
        if w.write_all(bytes).is_err() {
            w.shutdown();
        }
    }
}

/// How long a held grant's confirmation may wait to go out with the ticket connection's
/// next write. A process that waits in a loop queues its next ticket right after its
/// release, and the confirmation rides in the same write: the server reads both with one
/// read and answers both with one write, where alone the confirmation costs it a read and
/// a write of their own per handoff. It stays far below the server's grace
/// (`rlock.ticket-confirm-ms`), which only starts when the connection closes; a
/// connection that breaks first confirms on another ([`confirm_later`]), as a
/// confirmation written and not answered does. A plain semaphore's release, which must
/// come after its grant's confirmation, goes right behind it ([`Confirm::send_behind`]).
const CONFIRM_DEFER: Duration = Duration::from_millis(10);

/// How often an idle flusher looks whether its tickets are gone.
const FLUSHER_IDLE_CHECK: Duration = Duration::from_secs(1);

/// Queues `packed` (a held grant's confirmation) for the connection's next write, and
/// makes sure the flusher writes it within [`CONFIRM_DEFER`] if nothing else goes out.
fn defer_locked(shared: &Arc<Shared>, st: &mut State, packed: &[u8]) {
    st.deferred.extend_from_slice(packed);
    if st.flush_armed {
        return;
    }
    st.flush_armed = true;
    if !shared.flusher.swap(true, Ordering::Relaxed) {
        let weak = Arc::downgrade(shared);
        let started = std::thread::Builder::new()
            .name("rlock-tickets-flush".into())
            .spawn(move || flusher(weak));
        if started.is_err() {
            shared.flusher.store(false, Ordering::Relaxed);
            st.flush_armed = false;
            return write_locked(st, &[]);
        }
    }
    shared.flush.notify_one();
}

/// The flusher of one ticket connection's deferred confirmations: once armed, waits
/// [`CONFIRM_DEFER`] and writes what is still deferred. Ends once its tickets are gone.
fn flusher(weak: Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else {
            return;
        };
        let armed = {
            let st = lock_ignoring_poison(&shared.state);
            if st.flush_armed {
                true
            } else {
                let (st, _) = shared
                    .flush
                    .wait_timeout(st, FLUSHER_IDLE_CHECK)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                st.flush_armed
            }
        };
        if armed {
            std::thread::sleep(CONFIRM_DEFER);
            let mut st = lock_ignoring_poison(&shared.state);
            st.flush_armed = false;
            write_locked(&mut st, &[]);
        }
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
    // The capability probe, last: on every connect, so that a reconnect to another
    // server (a failover) learns what that one can do.
    setup.extend(pack(&hello::hello_args()));
    stream.write_all(&setup)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut parser = redis::Parser::new();
    for _ in 0..replies {
        parser.parse_value(&mut reader)?.extract_error()?;
    }
    let caps = hello::parse(parser.parse_value(&mut reader)?.extract_error())?;
    if !caps.tickets() {
        return Err(no_tickets());
    }
    shared
        .holds
        .store(caps.has("ticket-holds"), Ordering::Relaxed);
    // Before any subscription below: this connection's channels follow its answer.
    st.notify = caps.has("ticket-notify") && !shared.untagged.load(Ordering::Relaxed);
    st.quiet = caps.has("ticket-quiet");
    st.collects = caps.has("release-collects");
    stream.set_read_timeout(None)?;
    // A new connection: a channel refused on the old one may be allowed now.
    *lock_ignoring_poison(&shared.refused) = None;
    st.gen += 1;
    st.pending.clear();
    st.deferred.clear();
    st.deferred_last = None;
    // The old connection's subscriptions went with it; only waiters' are made again.
    st.idle.clear();
    st.unheard.clear();
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
        let channels: Vec<Vec<u8>> = st.channels.keys().cloned().collect();
        for ch in channels {
            stream.write_all(&pack(&[b"SSUBSCRIBE".to_vec(), st.wire(&ch)]))?;
            st.pending.push_back(Pending::SubscribeShard(ch));
        }
    } else if !st.channels.is_empty() {
        let mut sub = vec![b"SUBSCRIBE".to_vec()];
        sub.extend(st.channels.keys().map(|ch| st.wire(ch)));
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
                    route_note(&shared, &mut st, id, note);
                }
            }
            Value::Push {
                kind: redis::PushKind::Subscribe | redis::PushKind::SSubscribe,
                ..
            } => count_down(&mut st.pending, true),
            Value::Push {
                kind: redis::PushKind::Unsubscribe | redis::PushKind::SUnsubscribe,
                data,
            } => {
                let channel = match data.first() {
                    Some(Value::BulkString(wire)) => Some(st.key_channel(wire).to_vec()),
                    _ => None,
                };
                match (st.pending.front(), channel) {
                    (Some(Pending::Unsubscribe(_)), _) => count_down(&mut st.pending, false),
                    (Some(Pending::UnsubscribeShard(ours)), Some(c)) if *ours == c => {
                        st.pending.pop_front();
                    }
                    // Not an answer to ours: the node dropped the channel by itself.
                    (_, Some(c)) => slot_left(&mut st, &c, gen),
                    (_, None) => {}
                }
            }
            Value::Push { .. } => {}
            other => match st.pending.pop_front() {
                Some(Pending::Reply(id)) => {
                    route_reply(&shared, &mut st, &id, other.extract_error())
                }
                // The fence's reply: the quiet ticket was queued, and said nothing.
                Some(Pending::Quiet(_))
                    if st.pending.front() == Some(&Pending::Fence) && fence_answer(&other) =>
                {
                    st.pending.pop_front();
                }
                Some(Pending::Quiet(id)) => {
                    route_reply(&shared, &mut st, &id, other.extract_error())
                }
                Some(Pending::Fence) if fence_answer(&other) => {}
                // Out of step (a fence refused): no reply after this one can be placed.
                // Closing the connection tells every waiter `Lost`; they send again.
                Some(Pending::Fence) => {
                    if let Some(w) = st.writer.as_ref() {
                        w.shutdown();
                    }
                }
                Some(Pending::Command(Answer(tx))) => {
                    let _ = tx.send(other.extract_error());
                }
                Some(Pending::Collecting(id, Answer(tx))) => {
                    let r = other.extract_error();
                    collected(&shared, &mut st, &id, &r);
                    let _ = tx.send(r);
                }
                // A cluster node that does not serve the channel's slot (any more): the
                // command written after it is redirected too, and its waiter re-routes.
                Some(Pending::SubscribeShard(channel)) if redirected(&other) => {
                    if st.channels.contains_key(&channel) {
                        st.unheard.insert(channel);
                    }
                }
                Some(Pending::Subscribe(_) | Pending::SubscribeShard(_)) => {
                    // A channel we may not hear: no waiter on it could ever be told of
                    // its grant. Close the connection; every waiter is told `Lost`. A
                    // tagged channel refused: they send again on a new connection that
                    // uses the key's channel, as before `NOTIFY`. The key's channel
                    // refused: they find the refusal (see `Tickets::refusal`).
                    if st.notify {
                        shared.untagged.store(true, Ordering::Relaxed);
                    } else {
                        let e = other.extract_error().err().unwrap_or_else(|| {
                            io_err("ticket channel", "SUBSCRIBE refused".to_owned())
                        });
                        *lock_ignoring_poison(&shared.refused) = Some(e);
                    }
                    if let Some(w) = st.writer.as_ref() {
                        w.shutdown();
                    }
                }
                Some(Pending::Unsubscribe(_) | Pending::UnsubscribeShard(_)) | None => {}
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
    // Confirmations not written went with the connection too: their holders are
    // `Confirming` and confirm on a connection of their own, below.
    st.deferred.clear();
    st.deferred_last = None;
    for slot in st.waiters.values() {
        if let Slot::Live { sink, .. } = slot {
            sink(Event::Lost(gen));
        }
    }
    // Holders whose confirmation went with the connection confirm on one of their own.
    let confirming: Vec<String> = st
        .waiters
        .iter()
        .filter(|(_, s)| matches!(s, Slot::Confirming { .. }))
        .map(|(id, _)| id.clone())
        .collect();
    for id in confirming {
        if let Some(Slot::Confirming {
            channel,
            look,
            confirm,
        }) = st.waiters.remove(&id)
        {
            drop_channel_ref(&mut st, &channel);
            confirm_later(&shared, look, confirm, None);
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
        Err(e) => redirection(&e),
        Ok(_) => false,
    }
}

/// Whether `e` sends the command elsewhere or asks to send it again: it says nothing of
/// the command's own outcome.
fn redirection(e: &RedisError) -> bool {
    matches!(e.code(), Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN"))
}

/// The server dropped our subscription to `channel` by itself: the key's slot left the
/// node (an atomic slot migration, Valkey 9). A ticket queued there is answered `MOVED` on
/// that channel, which we no longer hear; its waiters are told `Lost` instead and send
/// their ticket again with the same request id, which the node answers `MOVED`: the
/// cluster layer then queues it on the slot's new owner. The node never grants a ticket
/// of a slot it no longer serves.
fn slot_left(st: &mut State, channel: &[u8], gen: u64) {
    st.channels.remove(channel);
    st.unheard.remove(channel);
    take_idle(st, channel);
    for slot in st.waiters.values() {
        if let Slot::Live {
            sink, channel: c, ..
        } = slot
        {
            if c.as_slice() == channel {
                sink(Event::Lost(gen));
            }
        }
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
        Some(Pending::SubscribeShard(_)) => subscribe,
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
        Some(Slot::Confirming { .. }) => {
            if let Some(Slot::Confirming {
                channel,
                confirm,
                look,
            }) = st.waiters.remove(id)
            {
                release_channel(st, &channel);
                match r {
                    // The slot moved between the grant and its confirmation (an atomic
                    // slot migration carries the lock and its request id's record to the
                    // new owner): confirm there, not report a hold that still stands lost.
                    Err(e) if redirection(&e) => confirm_later(shared, look, confirm, Some(e)),
                    r => confirm.settle(Outcome::of(&r)),
                }
            }
        }
        Some(Slot::Orphan { .. }) => match r {
            Ok(Value::SimpleString(s)) if s == "QUEUED" => {}
            Ok(v) => {
                // Granted at once to a waiter that had left: give it back.
                let slot = st.waiters.remove(id).expect("just seen");
                release_channel(st, slot.channel());
                if let Slot::Orphan { look, .. } = slot {
                    st.gave_back(id);
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
    // A quiet ticket that has its message was queued: no reply of its own will come.
    if let Some(at) = st
        .pending
        .iter()
        .position(|p| matches!(p, Pending::Quiet(q) if q == id))
    {
        st.pending.remove(at);
    }
    match st.waiters.get_mut(id) {
        Some(Slot::Live {
            sink,
            hold: hold @ Some(_),
            ..
        }) if matches!((&note, &*hold), (Note::Granted(d), Some((_, _, h))) if h.reply(d).is_some()) =>
        {
            // Held now (the machine reads the same reply from the same detail): wake the
            // holder first, then confirm on the same connection (the one that queued the
            // ticket, so the grant cannot be taken back before it).
            //
            // The holder's path from the grant message to its code (issue 40): one thread
            // hop, this reader to the waiting thread (the blocking API polls the call on
            // the caller's thread, so the sink's wake-up unparks it directly; the async
            // API's task runs on the runtime's worker): the reader blocks on the socket
            // so that no runtime thread must, and the waiter cannot read it itself without
            // taking the reader's part in turn. Allocations before the wake-up: redis-rs's
            // parse of the push (its array, the kind, channel and payload strings: four,
            // about a tenth of a microsecond against a handoff's hundreds), none in
            // `parse_message` for a lock (empty detail) nor in the sink (the channel's
            // block was made with it). Everything below runs after the wake-up, and the
            // holder does not take this lock on its way out (`Member`'s drop skips
            // `leave` for a held grant), so the confirmation's write does not delay it.
            if let Some((_, confirm, _)) = &*hold {
                // Before the holder wakes: its release may ride behind the confirmation
                // at once (`Confirm::send_behind` then waits for this lock, under which
                // the waiter becomes `Confirming` below).
                confirm.begin(Arc::downgrade(shared), id.to_owned());
            }
            sink(Event::Note(note));
            let (look, confirm, _) = hold.take().expect("just seen");
            let Some((id, Slot::Live { channel, .. })) = st.waiters.remove_entry(id) else {
                return;
            };
            let mut packed = fenced(st);
            let at = st.deferred.len() + packed.len();
            packed.extend_from_slice(&pack(&look));
            st.pending.push_back(Pending::Reply(id.clone()));
            st.deferred_last = Some((id.clone(), at));
            st.waiters.insert(
                id,
                Slot::Confirming {
                    channel,
                    look,
                    confirm,
                },
            );
            defer_locked(shared, st, &packed);
        }
        Some(Slot::Live { sink, .. }) => sink(Event::Note(note)),
        Some(Slot::Confirming { .. }) => {}
        Some(Slot::Orphan { .. }) => {
            let slot = st.waiters.remove(id).expect("just seen");
            release_channel(st, slot.channel());
            // A kind this client does not know may stand for a grant too: collected and
            // given back the same way (a look that finds the lock free takes it, and the
            // undo gives that back as well).
            if let (
                Note::Granted(_) | Note::Other,
                Slot::Orphan {
                    look, latch: false, ..
                },
            ) = (note, slot)
            {
                st.gave_back(id);
                undo_later(shared, look, None);
            }
        }
        None => {}
    }
}

/// How long a confirmation whose connection broke is tried again on connections of its
/// own, until a definite answer: the grant (kept) or `TAKENBACK` (lost); past it, the
/// hold is reported lost. Longer than the server's grace (`rlock.ticket-confirm-ms`,
/// 1 s) on purpose: a server that took the grant back answers `TAKENBACK` from then on,
/// so trying longer never keeps a hold the server gave away, and a server that restarted
/// (down for longer than the grace) reloads the grant from its AOF and answers it.
const CONFIRM_RETRY_FOR: Duration = Duration::from_secs(5);

/// The first pause between a late confirmation's tries (doubled up to
/// [`CONFIRM_RETRY_MAX_PAUSE`]): a broken connection is usually back at once, a
/// restarting server takes a while.
const CONFIRM_RETRY_PAUSE: Duration = Duration::from_millis(10);
const CONFIRM_RETRY_MAX_PAUSE: Duration = Duration::from_millis(200);

/// On a thread of its own (rare: the ticket connection broke between a grant and its
/// confirmation's reply, or the grant's slot moved to another node before the
/// confirmation arrived, `redirect`): confirms with `look` on a new connection, to the
/// node a `MOVED`/`ASK` names, retrying within [`CONFIRM_RETRY_FOR`] while the server
/// is unreachable or still loading; `TAKENBACK`, another error or no answer in time
/// settle it lost.
fn confirm_later(
    shared: &Arc<Shared>,
    look: Vec<Vec<u8>>,
    confirm: Arc<Confirm>,
    redirect: Option<RedisError>,
) {
    let home = shared.client.clone();
    let spawned = std::thread::Builder::new()
        .name("rlock-tickets-confirm".into())
        .spawn({
            let confirm = confirm.clone();
            move || {
                let until = Instant::now() + CONFIRM_RETRY_FOR;
                let mut c = redis::Cmd::new();
                for a in &look {
                    c.arg(a.as_slice());
                }
                let mut target = Target::Home;
                if let Some(e) = redirect {
                    target = target.after(&e, &home);
                }
                let mut pause = CONFIRM_RETRY_PAUSE;
                let mut backoff = |left: Duration| {
                    std::thread::sleep(pause.min(left));
                    pause = (pause * 2).min(CONFIRM_RETRY_MAX_PAUSE);
                };
                loop {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return confirm.settle(Outcome::Doubt);
                    }
                    let client = match &target {
                        Target::Home => home.clone(),
                        Target::Moved(client) | Target::Asked(client) => client.clone(),
                    };
                    let r = client
                        .get_connection_with_timeout(left)
                        .and_then(|mut conn| {
                            conn.set_read_timeout(Some(left))?;
                            if matches!(target, Target::Asked(_)) {
                                redis::cmd("ASKING").query::<()>(&mut conn)?;
                            }
                            c.query::<Value>(&mut conn)
                        });
                    match r {
                        Ok(_) => return confirm.settle(Outcome::Confirmed),
                        Err(e) if redirection(&e) => {
                            if matches!(e.code(), Some("TRYAGAIN" | "CLUSTERDOWN")) {
                                std::thread::sleep(Duration::from_millis(20).min(left));
                            }
                            target = target.after(&e, &home);
                        }
                        // A restarted server still reading its AOF: the grant may be
                        // in it.
                        Err(e) if e.code() == Some("LOADING") => backoff(left),
                        // A server at its `maxclients` turns new connections away
                        // for now; it is up and may answer once one closes.
                        Err(e) if e.to_string().contains("max number of clients") => backoff(left),
                        // The server answered: taken back, or a refusal.
                        Err(e) if e.code().is_some() => {
                            return confirm.settle(Outcome::of(&Err(e)))
                        }
                        Err(_) => backoff(left),
                    }
                }
            }
        });
    if spawned.is_err() {
        confirm.settle(Outcome::Doubt);
    }
}

/// Where a late confirmation goes: the ticket connection's node, or the node a
/// redirection named (`ASK`: once, after `ASKING`).
enum Target {
    Home,
    Moved(redis::Client),
    Asked(redis::Client),
}

impl Target {
    /// Where to send next after the redirection `e`: the named node for `MOVED`/`ASK`,
    /// the same one for `TRYAGAIN`/`CLUSTERDOWN` (or an address that cannot be used).
    fn after(self, e: &RedisError, home: &redis::Client) -> Target {
        let Some((addr, _slot)) = e.redirect_node() else {
            return self;
        };
        let Some((host, port)) = addr.rsplit_once(':') else {
            return self;
        };
        let Ok(port) = port.parse::<u16>() else {
            return self;
        };
        let info = home
            .get_connection_info()
            .clone()
            .set_addr(ConnectionAddr::Tcp(host.to_owned(), port));
        match (redis::Client::open(info), e.code()) {
            (Ok(c), Some("ASK")) => Target::Asked(c),
            (Ok(c), _) => Target::Moved(c),
            (Err(_), _) => self,
        }
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
mod tests;
