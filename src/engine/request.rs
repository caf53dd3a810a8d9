//! What waits in a queue: the primitive-neutral request ([`Ask`]: can the head be granted
//! now, and with what plan), the grant it gets, and the waiter (blocked client or queued
//! ticket) that carries it. A child of `engine`.

use super::*;

/// A lock key: its db and name. Shared (`Rc`) between the queue map and the handle index.
pub type KeyName = Rc<[u8]>;

/// What a waiter asks for: one primitive's request, behind the few questions the engine
/// asks of it. Each primitive implements it beside its commands (`lock::commands`, ...), above
/// this layer, so the engine never names a primitive and imports none of them.
pub trait Ask: std::fmt::Debug {
    /// Can this request, at the head of its key's queue, be granted in the key's current
    /// state (`name` in the selected db)? Reads only: the grant is written by the
    /// returned [`Check::Grant`], which the engine runs after its own checks.
    fn check(&self, ctx: &Context, name: &RedisString, now: i64) -> Check;
    /// The reply of a waiter whose wait ran out (the lock: the holder's PTTL).
    fn timed_out(&self, ctx: &Context, name: &RedisString) -> Reply;
    /// Takes back a grant handed to a client that vanished before being told, if the key
    /// still holds exactly what the grant wrote, and passes it on (or publishes what a
    /// release would). Runs from a timer, `db` selected.
    fn take_back(&self, ctx: &Context, db: i32, name: &RedisString);
    /// How many units the request asks for (a semaphore's permits), which `…INFO`
    /// commands sum over a queue ([`queued_units`]); 1 where there is no such notion.
    fn units(&self) -> i64 {
        1
    }
    /// The owner and request id a ticket's message names (docs/commands/tickets.md); a queued
    /// ticket always has an id. The latch has no owner.
    fn names(&self) -> (&[u8], Option<&[u8]>) {
        (b"", None)
    }
    /// Whether a grant writes something a client must collect (and which is taken back if
    /// it never does). The latch's opening writes nothing.
    fn grant_is_written(&self) -> bool {
        true
    }
    /// Whether a ticket's `granted` message carries the grant's reply as its detail
    /// ([`super::ticket::reply_detail`]): where the reply holds something the client needs
    /// to proceed (the fenced lock's token, an expirable semaphore's permit ids), so that
    /// it holds on the message like the lock's waiter rather than collect first
    /// (design.md 5). The lock's, RW lock's and semaphore's replies are known.
    fn detail_on_grant(&self) -> bool {
        false
    }
    /// Told the [`Grant::memo`] of its grant, once written (on the queued request itself,
    /// which a take-back later asks).
    fn granted(&self, _memo: i64) {}

    /// The request was just queued on `name` (`db` selected), blocked or as a ticket: a
    /// primitive whose state changes by itself arms its key timer now that the key has
    /// waiters (with nobody waiting it holds none, design.md 1); the latch counts its queued
    /// awaits.
    fn queued(&self, _ctx: &Context, _db: i32, _name: &RedisString) {}
}

/// A queued request (shared: the granted list keeps it until the reply goes out).
pub type Request = Rc<dyn Ask>;

/// Writes a grant on the key named by the second argument and says what to tell the
/// waiter.
pub type GrantWrite = Box<dyn FnOnce(&Context, &RedisString) -> Grant>;

/// What [`Ask::check`] answers.
pub enum Check {
    /// Grantable: the engine runs this to write the grant.
    Grant(GrantWrite),
    /// The head waits; the time in ms until the state may change by itself (a lease or a
    /// permit running out), to look again then (negative: only a write or a keyspace
    /// event can change the answer).
    Wait { pttl: i64 },
    /// The head can never be granted as asked (the fenced lock: its token key holds
    /// somebody else's data; the RW lock: a writer-to-be that started reading while it
    /// waited): it leaves the queue with this error, nothing written, and the next head
    /// is asked.
    Refuse(&'static str),
}

/// A grant written by a [`GrantWrite`].
#[derive(Debug)]
pub struct Grant {
    /// What the woken waiter is answered.
    pub reply: Reply,
    /// `Some(pttl)` when nobody behind the head can be granted before that many ms (the
    /// lock: its lease); `None` to keep asking the next head (readers, permits, a latch).
    pub look_again: Option<i64>,
    /// What the request keeps of its grant, handed to [`Ask::granted`] (the RW lock: the
    /// owner's hold count right after it, to take back only a grant nobody touched).
    pub memo: i64,
}

/// Who waits: a client blocked in its call, or a ticket (design.md 5, docs/commands/tickets.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    Blocked(Blocked),
    /// A queued ticket: the id of the connection that queued it, which keeps going (the
    /// ticket lives as long as that connection). Its end is published, not replied.
    Ticket(u64),
}

/// [`Who`] in 8 bytes (a queued ticket is a few dozen bytes in all, so its queue slot
/// counts): a ticket's connection id with the top bit set, else a blocked client's handle
/// (a pointer). Client ids count up from 1 and pointers stay below 2^63.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PackedWho(u64);

const TICKET_BIT: u64 = 1 << 63;

impl From<Who> for PackedWho {
    fn from(who: Who) -> PackedWho {
        match who {
            Who::Blocked(handle) => PackedWho(handle.0 as u64),
            Who::Ticket(client) => PackedWho(client | TICKET_BIT),
        }
    }
}

impl PackedWho {
    pub(super) fn get(self) -> Who {
        if self.0 & TICKET_BIT != 0 {
            Who::Ticket(self.0 & !TICKET_BIT)
        } else {
            Who::Blocked(Blocked(self.0 as usize))
        }
    }
}

/// A ticket's `NOTIFY` tag (docs/commands/tickets.md): its messages go to the key's ticket
/// channel with `:tag` appended. Interned ([`Queues::intern_tag`]): a client's tickets
/// share one copy, and a queue slot keeps a thin pointer.
pub type Tag = Rc<Box<[u8]>>;

/// One waiter for a key: a blocked client or a ticket.
#[derive(Debug)]
pub struct Waiter {
    pub request: Request,
    pub(super) who: PackedWho,
    /// A ticket's `NOTIFY` tag (`None`: the key's channel; always `None` when blocked).
    pub tag: Option<Tag>,
    /// The timer that ends a blocked client's wait (0: waits without limit, or a ticket,
    /// whose deadlines share one timer per queue), see [`wait`].
    pub deadline_timer: TimerId,
    /// When the wait ends, in ms since the epoch (0: no limit).
    pub deadline_at: i64,
}

impl Waiter {
    /// A blocked waiter not yet blocked (its handle is set by [`wait`]).
    pub fn new(request: Request) -> Waiter {
        Waiter {
            request,
            who: Who::Blocked(Blocked(0)).into(),
            tag: None,
            deadline_timer: 0,
            deadline_at: 0,
        }
    }

    /// A blocked client or a ticket.
    pub fn who(&self) -> Who {
        self.who.get()
    }

    /// The blocked client's handle (`None` for a ticket).
    pub fn handle(&self) -> Option<Blocked> {
        match self.who() {
            Who::Blocked(handle) => Some(handle),
            Who::Ticket(_) => None,
        }
    }
}

/// A grant handed to a waiter that has not been told yet: what it asked for, to take back
/// (and its request id's remembered reply to forget) if it vanishes untold.
#[derive(Debug, Clone)]
pub struct Untold {
    pub db: i32,
    pub key: KeyName,
    pub request: Request,
}
