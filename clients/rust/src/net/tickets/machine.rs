//! The pure parts of waiting with tickets: the ticket channel and its messages, the
//! shape of a waiting command, the state machine of one waiter, and what undoes a grant
//! nobody collected. No I/O; a child of `tickets`.

use super::*;

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

/// The channel of `key` tagged for one client (`NOTIFY tag`): the key's ticket channel,
/// `:`, the tag. Only that client subscribes to it, so a grant wakes no other client; the
/// tag has no braces, so the channel keeps the key's hash slot.
pub(crate) fn tagged_channel(key_channel: &[u8], tag: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(key_channel.len() + 1 + tag.len());
    out.extend_from_slice(key_channel);
    out.push(b':');
    out.extend_from_slice(tag.as_bytes());
    out
}

/// How a ticket left its queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Note {
    /// Granted; the message's detail (empty, or what the holder needs of the grant's
    /// reply: the fenced lock's token, an expirable semaphore's permit ids, design.md 5).
    Granted(Vec<u8>),
    Timeout,
    /// It can never be granted here; the server's error text (`MOVED ...`, ...).
    Error(String),
    /// A kind this client does not know (a later module's): the ticket left its queue
    /// all the same, so the waiter collects as after a timeout, and the reply tells
    /// (spec/vectors/tickets.json says why neither an error nor ignoring it is right).
    Other,
}

/// A ticket message `<kind>:<id-len>:<owner-len>:<id><owner><detail>`: the note and the
/// request id. `None` if it is not one. The kind word alone decides: a detail after
/// `timeout` is ignored, as a later module may add one; after `granted` it is kept for
/// the waiter that holds on it ([`Hold::reply`]), and a waiter that cannot read it
/// collects instead.
pub(crate) fn parse_message(payload: &[u8]) -> Option<(Note, &str)> {
    let mut parts = payload.splitn(4, |&b| b == b':');
    let kind = parts.next()?;
    // 1 to 10 ASCII digits, as the module writes them (no sign, space or other digit).
    let num = |p: Option<&[u8]>| -> Option<usize> {
        let p = p?;
        if p.is_empty() || p.len() > 10 || !p.iter().all(u8::is_ascii_digit) {
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
    // Borrowed: the reader looks the waiter up by it, no copy on the grant's path.
    let id = std::str::from_utf8(&rest[..id_len]).ok()?;
    let detail = &rest[id_len + owner_len..];
    let note = match kind {
        // Empty for the lock: no allocation on its path.
        b"granted" => Note::Granted(detail.to_vec()),
        b"timeout" => Note::Timeout,
        b"error" => Note::Error(String::from_utf8_lossy(detail).into_owned()),
        _ => Note::Other,
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
    /// Index of the value after `ID` in the caller's command; `None` when it had none
    /// (the latch): one is added for `ASYNC` only.
    id_at: Option<usize>,
    /// The caller's command had no `ID` (the latch): one is added for `ASYNC` only.
    added_id: bool,
    /// `RLATCH.AWAIT`: a `granted` note is the whole answer.
    pub(super) latch: bool,
    /// What a grant's reply is, where the waiter may hold on the `granted` message
    /// without collecting it (design.md 5).
    hold: Hold,
}

/// Whether, and how, a waiting command's grant is known from its `granted` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Collect first (the latch, any other command).
    No,
    /// The lock's and RW lock's acquire: the reply is nil.
    Nil,
    /// The semaphore's acquire: the reply is 1 (its release waits for the confirmation:
    /// `aio::semaphore`).
    One,
    /// `RFENCED.ACQUIRE`: `[nil, token]`, the token in the message's detail.
    Token,
    /// `RPSEMAPHORE.ACQUIRE`: the permit id in the detail, or (`PERMITS n` given: `many`)
    /// the ids joined by `,`, answered as an array.
    Permits { many: bool },
}

impl Hold {
    /// The grant's reply as read from a `granted` message's `detail`
    /// (spec/vectors/tickets.json, `holds`); `None`: collect it (the module wrote no
    /// detail, being older, or one this client cannot read).
    pub(crate) fn reply(self, detail: &[u8]) -> Option<Value> {
        match self {
            Hold::No => None,
            Hold::Nil => Some(Value::Nil),
            Hold::One => Some(Value::Int(1)),
            Hold::Token => {
                let digits = !detail.is_empty() && detail.len() <= 19;
                let token = std::str::from_utf8(detail).ok()?.parse::<i64>().ok()?;
                (digits && detail.iter().all(u8::is_ascii_digit))
                    .then_some(Value::Array(vec![Value::Nil, Value::Int(token)]))
            }
            Hold::Permits { many } => {
                let ids: Vec<Value> = detail
                    .split(|&b| b == b',')
                    .map(|id| Value::BulkString(id.to_vec()))
                    .collect();
                let hex = |id: &[u8]| {
                    !id.is_empty()
                        && id.len().is_multiple_of(2)
                        && id.iter().all(u8::is_ascii_hexdigit)
                };
                if !detail.split(|&b| b == b',').all(hex) {
                    return None;
                }
                match (many, ids.len()) {
                    (true, _) => Some(Value::Array(ids)),
                    (false, 1) => ids.into_iter().next(),
                    (false, _) => None,
                }
            }
        }
    }
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
        let id_at = opt(b"ID");
        let (id, added_id) = match id_at {
            Some(i) => (String::from_utf8(args[i].clone()).ok()?, false),
            None => (crate::proto::cmd::request_id(), true),
        };
        let latch = args[0].eq_ignore_ascii_case(b"RLATCH.AWAIT");
        let is = |name: &[u8]| args[0].eq_ignore_ascii_case(name);
        let hold = if is(b"RLOCK.ACQUIRE") || is(b"RRWLOCK.ACQUIRE") {
            Hold::Nil
        } else if is(b"RSEMAPHORE.ACQUIRE") {
            Hold::One
        } else if is(b"RFENCED.ACQUIRE") {
            Hold::Token
        } else if is(b"RPSEMAPHORE.ACQUIRE") {
            Hold::Permits {
                many: opt(b"PERMITS").is_some(),
            }
        } else {
            Hold::No
        };
        Some(Shape {
            args,
            wait_at,
            wait_ms,
            id,
            id_at,
            added_id,
            latch,
            hold,
        })
    }

    /// Whether a grant may be held on its `granted` message (the lock, the RW lock, the
    /// fenced lock, the semaphores), its reply read from the message.
    pub(crate) fn holds(&self) -> bool {
        self.hold != Hold::No
    }

    /// How a grant's reply reads from its `granted` message.
    pub(crate) fn hold(&self) -> Hold {
        self.hold
    }

    /// Gives the call a new request id: its old one names a grant that was given back
    /// (see `Tickets::join`), which the server would replay as granted.
    pub(crate) fn renew_id(&mut self) {
        self.id = crate::proto::cmd::request_id();
        if let Some(i) = self.id_at {
            self.args[i] = self.id.clone().into_bytes();
        }
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

    /// Whether `args` (a [`Step::Send`] of this shape) queue a ticket: [`Self::ticketed`]'s
    /// `ASYNC` follows the command's own arguments; [`Self::look`] is shorter.
    pub(crate) fn is_ticketed(&self, args: &[Vec<u8>]) -> bool {
        args.get(self.args.len())
            .is_some_and(|a| a.as_slice() == b"ASYNC")
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

    /// The command's "not now" reply (docs/commands/tickets.md), for a timed wait the
    /// client ended at its own deadline or whose `timeout` message came: what the server
    /// answers a wait that ran out, with `-1` where that reply carries the holder's PTTL
    /// (not known without asking; no caller reads it, and `-2` would ask to try again).
    pub(crate) fn ran_out(&self) -> Value {
        let is = |name: &[u8]| self.args[0].eq_ignore_ascii_case(name);
        if is(b"RFENCED.ACQUIRE") {
            Value::Array(vec![Value::Int(-1), Value::Nil])
        } else if is(b"RLOCK.ACQUIRE") || is(b"RRWLOCK.ACQUIRE") {
            Value::Int(-1)
        } else if is(b"RPSEMAPHORE.ACQUIRE") {
            Value::Nil
        } else {
            // RSEMAPHORE.ACQUIRE, RLATCH.AWAIT.
            Value::Int(0)
        }
    }

    /// When a timed wait that began at `started` ends, on this client's clock.
    pub(crate) fn deadline(&self, started: Instant) -> Option<Instant> {
        (self.wait_ms > 0).then(|| started + Duration::from_millis(self.wait_ms))
    }

    /// The wait left after `elapsed`: `Some(0)` for no limit, `None` when it is over.
    pub(super) fn wait_left(&self, elapsed: Duration) -> Option<u64> {
        if self.wait_ms == 0 {
            return Some(0);
        }
        let spent = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        self.wait_ms.checked_sub(spent).filter(|&l| l > 0)
    }
}

/// How much sooner than the client's own deadline a timed ticket's wait ends in the
/// server (at most a quarter of the wait): the server counts from the command's arrival
/// and its `timeout` message takes hops back (server, reader, waiter), each waiting for a
/// CPU on a loaded machine, so that message is then normally in before the deadline and
/// the waiter knows its ticket gone: it leaves no orphan.
pub(crate) const TIMEOUT_LEAD_MS: u64 = 10;

/// The server's part of a wait of `left` ms (0: no limit), [`TIMEOUT_LEAD_MS`] sooner.
pub(crate) fn server_wait(left: u64) -> u64 {
    left - TIMEOUT_LEAD_MS.min(left / 4)
}

/// What a waiter whose deadline came first leaves behind ([`Machine::expire`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Leaves {
    /// Nothing: its ticket is known gone (or went with its connection).
    Nothing,
    /// A ticket that may still be queued, or a collect in flight: an orphan, whose late
    /// grant is collected and given back.
    Orphan,
    /// A `granted` (or unknown) message heard and not collected: collect it and give it
    /// back now.
    Undo,
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
    pub(super) known: bool,
    /// Hold on the `granted` message (the reader confirms off the path).
    pub(crate) hold_on_grant: bool,
    /// Done by holding on the `granted` message: the reader owns the registration now.
    pub(crate) held: bool,
    /// The last error, kept as a `RedisError` for the caller ([`Machine::take_error`]).
    error: Option<RedisError>,
    /// Sent again after a broken connection: a `timeout` message may then hide a grant
    /// made under the same id on the old connection, which a collect replays.
    resent: bool,
    /// Its `timeout` message came before its deadline: nothing is queued any more, and
    /// the wait ends, not granted, at the deadline (a timed wait never ends sooner).
    gone: bool,
}

impl Machine {
    pub(crate) fn new(shape: Shape, started: Instant, known: bool) -> Self {
        Machine {
            shape,
            started,
            outstanding: false,
            gen: 0,
            known,
            hold_on_grant: false,
            held: false,
            error: None,
            resent: false,
            gone: false,
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
            Some(left) => Step::Send(self.shape.ticketed(server_wait(left))),
            None => Step::Send(self.shape.look()),
        }
    }

    /// When the wait ends on the client's clock (`None`: no limit).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.shape.deadline(self.started)
    }

    /// The deadline came first: the call's outcome, given the events `heard` but not yet
    /// read (taken under the ticket connection's lock, so no more can come), and what the
    /// waiter leaves behind. An answer among them is the outcome (a grant held on its
    /// message, or any reply); otherwise the "not now" reply, and a grant whose collect
    /// is not done is given back, never left held by a caller that was told no.
    pub(crate) fn expire(&mut self, heard: Vec<Event>, now: Instant) -> (Step, Leaves) {
        let mut undo = false;
        for ev in heard {
            let from_note = matches!(ev, Event::Note(_));
            match self.on(ev, now) {
                done @ Step::Done(_) => return (done, Leaves::Nothing),
                Step::Send(_) if from_note => undo = true,
                // A resend after a lost connection, or waiting on.
                Step::Send(_) | Step::Wait => {}
            }
        }
        let leaves = if undo {
            self.outstanding = false;
            Leaves::Undo
        } else if self.outstanding {
            Leaves::Orphan
        } else {
            Leaves::Nothing
        };
        (Step::Done(Ok(self.shape.ran_out())), leaves)
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
                let text = e.to_string();
                self.error = Some(e);
                Step::Done(Err(text))
            }
            Event::Note(Note::Granted(_)) if self.shape.latch => {
                self.outstanding = false;
                Step::Done(Ok(Value::Int(1)))
            }
            Event::Note(Note::Granted(detail)) => {
                match self.hold_on_grant.then(|| self.shape.hold.reply(&detail)) {
                    // Held: the reader thread sends the confirmation.
                    Some(Some(reply)) => {
                        self.outstanding = false;
                        self.held = true;
                        Step::Done(Ok(reply))
                    }
                    // Collect: the same command and id again; the server replays the grant.
                    _ => Step::Send(self.shape.look()),
                }
            }
            // Removed, nothing granted: the reply of a wait that ran out, without a
            // collect's round trip. After a broken connection the same id may have been
            // granted on the old one: the collect replays that.
            Event::Note(Note::Timeout) if !self.resent => {
                self.outstanding = false;
                match self.deadline() {
                    Some(d) if now < d => {
                        self.gone = true;
                        Step::Wait // until the deadline: see `expire`
                    }
                    _ => Step::Done(Ok(self.shape.ran_out())),
                }
            }
            // The ordinary reply of a timed-out wait: look once.
            Event::Note(Note::Timeout | Note::Other) => Step::Send(self.shape.look()),
            Event::Note(Note::Error(detail)) => {
                self.outstanding = false;
                self.error = Some(note_error(&detail));
                Step::Done(Err(detail))
            }
            // Its ticket is gone already: nothing to send again.
            Event::Lost(_) if self.gone => Step::Wait,
            Event::Lost(gen) if gen == self.gen => {
                self.outstanding = false;
                self.resent = true;
                self.resend(now)
            }
            // A connection our last command never went on.
            Event::Lost(_) => Step::Wait,
        }
    }
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
