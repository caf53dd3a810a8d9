//! The waiting engine: clients waiting in the server, and the handoff that serves them.
//!
//! Layer: below `commands` and `events` (which only translate keyspace and server events
//! into calls here), above `store`, `tracking`, `cluster`, `stats` and `ffi`. The pure
//! rules of each primitive (`core` for the lock) sit beside it: state in, plan out.
//!
//! Each key with waiters has one FIFO queue, whatever primitive its waiters ask for (a
//! [`Request`]). When the key may have changed, [`serve`] asks the head's primitive
//! "can the head be granted in this state, and with what plan?" and keeps granting heads
//! until the answer is no (the lock grants at most one). A granted waiter is answered in
//! the same event-loop turn, so nobody else ever sees the lock free (strict first come,
//! first served, no thundering herd of pub/sub wake-ups).
//!
//! Written once here for every primitive: blocking, deadline timers, expiry timers,
//! disconnects, grants taken back from clients that vanished untold, cluster redirection,
//! and the pending list that serves keys freed by DEL, expiry, overwrite, FLUSH or SWAPDB
//! once the cause has propagated (a post-notification job, or a zero-delay timer on 7.0;
//! see events.rs for why the handoff is not written from inside the notification).
//!
//! [`Queues`] is the bookkeeping, pure and unit-tested; the functions below it are the
//! glue that blocks clients, arms timers and performs handoffs.

use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use redis_module::{Context, ContextFlags, RedisString};

use crate::cluster;
use crate::core::LockState;
use crate::errors::{ERR_INTERNAL, ERR_TOO_MANY_WAITERS};
use crate::ffi::{self, Blocked, LockKey, TimerId, Wake};
use crate::reply::Reply;
use crate::stats;
use crate::store;
use crate::ticket;
use crate::tracking;

/// A lock key: its db and name. Shared (`Rc`) between the queue map and the handle index.
pub type KeyName = Rc<[u8]>;

/// What a waiter asks for: one primitive's request, behind the few questions the engine
/// asks of it. Each primitive implements it beside its commands (`cmd_lock`, ...), above
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
    /// The owner and request id a ticket's message names (docs/tickets.md); a queued
    /// ticket always has an id. The latch has no owner.
    fn names(&self) -> (&[u8], Option<&[u8]>) {
        (b"", None)
    }
    /// Whether a grant writes something a client must collect (and which is taken back if
    /// it never does). The latch's opening writes nothing.
    fn grant_is_written(&self) -> bool {
        true
    }
    /// Told the [`Grant::memo`] of its grant, once written (on the queued request itself,
    /// which a take-back later asks).
    fn granted(&self, _memo: i64) {}
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

/// Who waits: a client blocked in its call, or a ticket (SPEC 5, docs/tickets.md).
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
struct PackedWho(u64);

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
    fn get(self) -> Who {
        if self.0 & TICKET_BIT != 0 {
            Who::Ticket(self.0 & !TICKET_BIT)
        } else {
            Who::Blocked(Blocked(self.0 as usize))
        }
    }
}

/// One waiter for a key: a blocked client or a ticket.
#[derive(Debug)]
pub struct Waiter {
    pub request: Request,
    who: PackedWho,
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

/// A ticket's grant not yet collected by its client (docs/tickets.md): taken back if the
/// connection that queued the ticket closes first.
#[derive(Debug)]
struct Uncollected {
    client: u64,
    granted_at: i64,
    untold: Untold,
}

/// The expiry timer armed for a key with waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArmedTimer {
    pub id: TimerId,
    pub tag: u64,
    pub fire_at: i64,
}

/// Which of a queue's timers fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fired {
    /// The expiry timer: look at the key's state.
    Expiry,
    /// The tickets' deadline timer: time out the tickets that are due.
    Tickets,
}

#[derive(Debug, Default)]
struct Queue {
    /// Arrival order, by sequence number. A waiter that leaves from the middle (timeout,
    /// disconnect) leaves a `None` found by binary search, O(log n); holes are dropped when
    /// they reach either end, or all at once when they outnumber the waiters. A deque of
    /// 56-byte slots keeps a queued ticket small (a B-tree's half-full nodes doubled it).
    waiters: VecDeque<(u64, Option<Waiter>)>,
    /// The waiters present (the deque's length counts the holes too).
    live: usize,
    timer: Option<ArmedTimer>,
    /// The deadlines of the queue's tickets, earliest first: one timer per queue at the
    /// earliest (`ticket_timer`), none per ticket. Entries of tickets that left early stay
    /// until they surface (or a rebuild drops them), each checked against the queue.
    ticket_deadlines: BinaryHeap<Reverse<(i64, u64)>>,
    ticket_timer: Option<ArmedTimer>,
}

impl Queue {
    fn position(&self, seq: u64) -> Option<usize> {
        let i = self.waiters.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        self.waiters[i].1.is_some().then_some(i)
    }

    fn get(&self, seq: u64) -> Option<&Waiter> {
        self.waiters[self.position(seq)?].1.as_ref()
    }

    fn front(&self) -> Option<&Waiter> {
        self.waiters.iter().find_map(|(_, w)| w.as_ref())
    }

    fn live_waiters(&self) -> impl Iterator<Item = &Waiter> {
        self.waiters.iter().filter_map(|(_, w)| w.as_ref())
    }

    fn push(&mut self, seq: u64, waiter: Waiter) {
        if let (Who::Ticket(_), at) = (waiter.who(), waiter.deadline_at) {
            if at > 0 {
                self.ticket_deadlines.push(Reverse((at, seq)));
            }
        }
        self.waiters.push_back((seq, Some(waiter)));
        self.live += 1;
    }

    fn pop_front(&mut self) -> Option<Waiter> {
        while let Some((_, slot)) = self.waiters.pop_front() {
            if let Some(waiter) = slot {
                self.live -= 1;
                self.trim();
                return Some(waiter);
            }
        }
        None
    }

    fn take_at(&mut self, i: usize) -> Option<Waiter> {
        let waiter = self.waiters.get_mut(i)?.1.take()?;
        self.live -= 1;
        self.trim();
        Some(waiter)
    }

    /// Drops holes at both ends, and all of them once they outnumber the waiters.
    fn trim(&mut self) {
        while matches!(self.waiters.front(), Some((_, None))) {
            self.waiters.pop_front();
        }
        while matches!(self.waiters.back(), Some((_, None))) {
            self.waiters.pop_back();
        }
        if self.waiters.len() > 2 * self.live + 32 {
            self.waiters.retain(|(_, w)| w.is_some());
        }
        if self.waiters.capacity() > 4 * self.waiters.len() + 64 {
            self.waiters.shrink_to_fit();
        }
        // Tickets granted long before their deadline leave their entries below a live
        // earliest one: rebuilt from the queue once they are most of the heap.
        if self.ticket_deadlines.len() > 2 * self.live + 64 {
            let live: Vec<Reverse<(i64, u64)>> = self
                .waiters
                .iter()
                .filter_map(|(seq, w)| match w {
                    Some(w) if matches!(w.who(), Who::Ticket(_)) && w.deadline_at > 0 => {
                        Some(Reverse((w.deadline_at, *seq)))
                    }
                    _ => None,
                })
                .collect();
            self.ticket_deadlines = BinaryHeap::from(live);
        }
    }

    /// The earliest deadline of a ticket still queued, dropping entries of tickets gone.
    fn next_ticket_deadline(&mut self) -> Option<i64> {
        while let Some(&Reverse((at, seq))) = self.ticket_deadlines.peek() {
            if self.get(seq).is_some_and(|w| w.deadline_at == at) {
                return Some(at);
            }
            self.ticket_deadlines.pop();
        }
        if self.ticket_deadlines.capacity() > 64 {
            self.ticket_deadlines.shrink_to_fit();
        }
        None
    }
}

/// Every queue of the server, plus the indexes the callbacks need.
#[derive(Debug, Default)]
pub struct Queues {
    dbs: HashMap<i32, HashMap<KeyName, Queue>>,
    /// Timeout and disconnect callbacks only get the blocked-client handle.
    by_handle: HashMap<Blocked, (i32, KeyName, u64)>,
    /// Expiry and ticket-deadline timers carry a tag; a tag no longer here belongs to a
    /// stale timer.
    timers: HashMap<u64, (i32, KeyName)>,
    /// Waiters handed the lock whose reply is not sent yet (it goes out before Redis
    /// sleeps). If such a client disconnects or is unblocked in between, it never learns
    /// it holds the lock, so the lock is taken back (see [`on_disconnect`]).
    granted: HashMap<Blocked, Untold>,
    /// How many tickets each connection has queued (a connection that closes without any
    /// costs one lookup; one with tickets, a pass over the queues).
    tickets_of: HashMap<u64, usize>,
    /// Tickets granted and not yet collected, by their request-id key.
    uncollected: HashMap<Box<[u8]>, Uncollected>,
    /// When to next drop uncollected grants older than the request-id window.
    prune_at: usize,
    next_seq: u64,
    next_tag: u64,
    total: usize,
    tickets: usize,
}

/// What [`Queues::drain`] empties out.
#[derive(Debug, Default)]
pub struct Drained {
    pub handles: Vec<Blocked>,
    pub timers: Vec<TimerId>,
    pub tickets: Vec<(i32, KeyName, Request)>,
}

impl Queues {
    pub fn total(&self) -> usize {
        self.total
    }

    /// Queued tickets (of [`Queues::total`]).
    pub fn tickets(&self) -> usize {
        self.tickets
    }

    pub fn keys_with_waiters(&self) -> usize {
        self.dbs.values().map(HashMap::len).sum()
    }

    pub fn len(&self, db: i32, key: &[u8]) -> usize {
        self.queue(db, key).map_or(0, |q| q.live)
    }

    fn queue(&self, db: i32, key: &[u8]) -> Option<&Queue> {
        self.dbs.get(&db)?.get(key)
    }

    fn queue_mut(&mut self, db: i32, key: &[u8]) -> Option<&mut Queue> {
        self.dbs.get_mut(&db)?.get_mut(key)
    }

    /// Appends a waiter; refused (and handed back) when the key already has `limit` waiters.
    pub fn push(
        &mut self,
        db: i32,
        key: &[u8],
        waiter: Waiter,
        limit: usize,
    ) -> Result<(), Waiter> {
        let keys = self.dbs.entry(db).or_default();
        let name: KeyName = match keys.get_key_value(key) {
            Some((_, q)) if q.live >= limit => return Err(waiter),
            Some((name, _)) => name.clone(),
            None if limit == 0 => return Err(waiter),
            None => Rc::from(key),
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        match waiter.who() {
            Who::Blocked(handle) => {
                self.by_handle.insert(handle, (db, name.clone(), seq));
            }
            Who::Ticket(client) => {
                *self.tickets_of.entry(client).or_default() += 1;
                self.tickets += 1;
            }
        }
        keys.entry(name).or_default().push(seq, waiter);
        self.total += 1;
        Ok(())
    }

    /// Bookkeeping of a waiter that left its queue (the queue itself is done).
    fn left(&mut self, waiter: &Waiter) {
        self.total -= 1;
        match waiter.who() {
            Who::Blocked(handle) => {
                self.by_handle.remove(&handle);
            }
            Who::Ticket(client) => {
                self.tickets -= 1;
                if let Some(n) = self.tickets_of.get_mut(&client) {
                    *n -= 1;
                    if *n == 0 {
                        self.tickets_of.remove(&client);
                    }
                }
            }
        }
    }

    /// The first waiter of a key, without removing it.
    pub fn head(&self, db: i32, key: &[u8]) -> Option<&Waiter> {
        self.queue(db, key)?.front()
    }

    /// Removes and returns the first waiter of a key, remembering a blocked one as granted
    /// until its reply is sent.
    pub fn pop(&mut self, db: i32, key: &[u8]) -> Option<Waiter> {
        let keys = self.dbs.get_mut(&db)?;
        let name = keys.get_key_value(key)?.0.clone();
        let waiter = keys.get_mut(key)?.pop_front()?;
        self.left(&waiter);
        if let Who::Blocked(handle) = waiter.who() {
            let request = waiter.request.clone();
            self.granted.insert(
                handle,
                Untold {
                    db,
                    key: name,
                    request,
                },
            );
        }
        Some(waiter)
    }

    /// The deadline of a queued blocked waiter (0 when it waits without limit).
    pub fn deadline_of(&self, handle: Blocked) -> Option<i64> {
        let (db, name, seq) = self.by_handle.get(&handle)?;
        Some(self.queue(*db, name)?.get(*seq)?.deadline_at)
    }

    /// Removes and returns the first waiter of a key that is answered without the lock.
    pub fn take(&mut self, db: i32, key: &[u8]) -> Option<Waiter> {
        let waiter = self.queue_mut(db, key)?.pop_front()?;
        self.left(&waiter);
        Some(waiter)
    }

    /// The reply of a granted waiter went out: nothing more to watch.
    pub fn replied(&mut self, handle: Blocked) {
        self.granted.remove(&handle);
    }

    /// A granted waiter vanished before its reply: the lock it was handed, to take back.
    pub fn ungrant(&mut self, handle: Blocked) -> Option<Untold> {
        self.granted.remove(&handle)
    }

    /// Removes the blocked waiter with this handle wherever it queues; returns it with its
    /// key and whether it was the head (then the next head may be grantable now).
    pub fn remove(&mut self, handle: Blocked) -> Option<(i32, KeyName, Waiter, bool)> {
        let (db, name, seq) = self.by_handle.get(&handle).cloned()?;
        let queue = self.queue_mut(db, &name)?;
        let i = queue.position(seq)?;
        let was_head = queue
            .front()
            .is_some_and(|w| w.who() == Who::Blocked(handle));
        let waiter = queue.take_at(i)?;
        self.left(&waiter);
        Some((db, name, waiter, was_head))
    }

    /// Removes the tickets of a key whose deadline has come (`now`); says whether the head
    /// was among them.
    pub fn due_tickets(&mut self, db: i32, key: &[u8], now: i64) -> (Vec<Waiter>, bool) {
        let Some(queue) = self.queue_mut(db, key) else {
            return (Vec::new(), false);
        };
        let head_seq = queue
            .waiters
            .iter()
            .find(|(_, w)| w.is_some())
            .map(|(s, _)| *s);
        let mut due = Vec::new();
        let mut head_left = false;
        while let Some(&Reverse((at, seq))) = queue.ticket_deadlines.peek() {
            if at > now {
                break;
            }
            queue.ticket_deadlines.pop();
            let Some(i) = queue.position(seq) else {
                continue;
            };
            if queue.waiters[i]
                .1
                .as_ref()
                .is_some_and(|w| w.deadline_at == at)
            {
                head_left |= Some(seq) == head_seq;
                due.extend(queue.take_at(i));
            }
        }
        for waiter in &due {
            self.left(waiter);
        }
        (due, head_left)
    }

    /// Removes every ticket queued by a connection that closed; returns them with their
    /// keys, and the keys whose head left (their next head may be grantable now).
    #[allow(clippy::type_complexity)]
    pub fn drop_tickets_of(
        &mut self,
        client: u64,
    ) -> (Vec<(i32, KeyName, Waiter)>, Vec<(i32, KeyName)>) {
        if self.tickets_of.remove(&client).is_none() {
            return (Vec::new(), Vec::new());
        }
        let mut dropped = Vec::new();
        let mut heads = Vec::new();
        for (&db, keys) in &mut self.dbs {
            for (name, queue) in keys.iter_mut() {
                let mut head = true;
                let mut removed = 0;
                for (_, slot) in queue.waiters.iter_mut() {
                    let Some(waiter) = slot else { continue };
                    if waiter.who() == Who::Ticket(client) {
                        if head {
                            heads.push((db, name.clone()));
                        }
                        dropped.push((db, name.clone(), slot.take().expect("checked")));
                        removed += 1;
                    }
                    head = false;
                }
                if removed > 0 {
                    queue.live -= removed;
                    queue.trim();
                }
            }
        }
        self.total -= dropped.len();
        self.tickets -= dropped.len();
        (dropped, heads)
    }

    /// Remembers a ticket's grant until its client collects it (`request_key`: its
    /// request id's record).
    pub fn granted_ticket(
        &mut self,
        client: u64,
        request_key: &[u8],
        untold: Untold,
        now: i64,
        window: i64,
    ) {
        if self.uncollected.len() >= self.prune_at {
            // Past the request-id window a retry cannot collect the grant any more: it is
            // the client's to lose then, like a lease nobody renews.
            self.uncollected.retain(|_, u| now - u.granted_at < window);
            self.prune_at = (2 * self.uncollected.len()).max(1024);
        }
        self.uncollected.insert(
            request_key.into(),
            Uncollected {
                client,
                granted_at: now,
                untold,
            },
        );
    }

    /// A ticket's grant was collected (its request id replayed).
    pub fn collected(&mut self, request_key: &[u8]) {
        if !self.uncollected.is_empty() {
            self.uncollected.remove(request_key);
        }
    }

    /// The grants a closed connection's tickets were given and never collected.
    pub fn uncollected_of(&mut self, client: u64) -> Vec<Untold> {
        if self.uncollected.is_empty() {
            return Vec::new();
        }
        let keys: Vec<Box<[u8]>> = self
            .uncollected
            .iter()
            .filter(|(_, u)| u.client == client)
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter()
            .filter_map(|k| self.uncollected.remove(k))
            .map(|u| u.untold)
            .collect()
    }

    /// Drops the queue of a key that has no waiters left; returns its timers to stop.
    pub fn forget_if_empty(&mut self, db: i32, key: &[u8]) -> Vec<ArmedTimer> {
        let Some(keys) = self.dbs.get_mut(&db) else {
            return Vec::new();
        };
        if keys.get(key).is_none_or(|q| q.live > 0) {
            return Vec::new();
        }
        let Some(queue) = keys.remove(key) else {
            return Vec::new();
        };
        if keys.is_empty() {
            self.dbs.remove(&db);
        }
        let timers: Vec<ArmedTimer> = queue.timer.into_iter().chain(queue.ticket_timer).collect();
        for t in &timers {
            self.timers.remove(&t.tag);
        }
        timers
    }

    /// Decides whether a key needs its expiry timer (re)armed for a lock expiring at
    /// `expire_at`. A timer that fires earlier is kept: it finds the lock still held and
    /// re-arms, which costs less than stopping a timer on every renewal. Returns the timer
    /// to stop (if any) and the tag for the new one.
    pub fn plan_timer(
        &mut self,
        db: i32,
        key: &[u8],
        fire_at: i64,
    ) -> Option<(Option<ArmedTimer>, u64)> {
        let queue = self.queue(db, key)?;
        if queue.live == 0 {
            return None;
        }
        let old = queue.timer;
        if matches!(old, Some(t) if t.fire_at <= fire_at) {
            return None;
        }
        if let Some(t) = old {
            self.timers.remove(&t.tag);
        }
        self.next_tag += 1;
        Some((old, self.next_tag))
    }

    /// Records the timer armed after [`Queues::plan_timer`].
    pub fn set_timer(&mut self, db: i32, key: &[u8], timer: ArmedTimer) {
        self.set_armed(db, key, timer, Fired::Expiry);
    }

    fn set_armed(&mut self, db: i32, key: &[u8], timer: ArmedTimer, which: Fired) {
        let Some(keys) = self.dbs.get_mut(&db) else {
            return;
        };
        let Some(name) = keys.get_key_value(key).map(|(n, _)| n.clone()) else {
            return;
        };
        if let Some(queue) = keys.get_mut(key) {
            match which {
                Fired::Expiry => queue.timer = Some(timer),
                Fired::Tickets => queue.ticket_timer = Some(timer),
            }
            self.timers.insert(timer.tag, (db, name));
        }
    }

    /// Decides whether a key's ticket-deadline timer must be (re)armed for its earliest
    /// ticket deadline: `(timer to stop, tag, fire_at)`, or `None` when the armed one is
    /// right (or no ticket has a deadline).
    pub fn plan_ticket_timer(
        &mut self,
        db: i32,
        key: &[u8],
    ) -> Option<(Option<ArmedTimer>, u64, i64)> {
        let queue = self.queue_mut(db, key)?;
        let next = queue.next_ticket_deadline();
        let old = queue.ticket_timer;
        match (old, next) {
            (Some(t), Some(at)) if t.fire_at <= at => return None,
            (None, None) => return None,
            _ => {}
        }
        queue.ticket_timer = None;
        if let Some(t) = old {
            self.timers.remove(&t.tag);
        }
        let at = next?;
        self.next_tag += 1;
        Some((old, self.next_tag, at))
    }

    /// Records the timer armed after [`Queues::plan_ticket_timer`].
    pub fn set_ticket_timer(&mut self, db: i32, key: &[u8], timer: ArmedTimer) {
        self.set_armed(db, key, timer, Fired::Tickets);
    }

    /// The key of a firing timer and which timer it is, if still the one armed for it.
    pub fn fired(&mut self, tag: u64) -> Option<(i32, KeyName, Fired)> {
        let (db, name) = self.timers.remove(&tag)?;
        let queue = self.queue_mut(db, &name)?;
        if matches!(queue.timer, Some(t) if t.tag == tag) {
            queue.timer = None;
            Some((db, name, Fired::Expiry))
        } else if matches!(queue.ticket_timer, Some(t) if t.tag == tag) {
            queue.ticket_timer = None;
            Some((db, name, Fired::Tickets))
        } else {
            None
        }
    }

    /// All keys with waiters (for a flush, which deletes keys without per-key events).
    pub fn all_keys(&self) -> Vec<(i32, KeyName)> {
        self.dbs
            .iter()
            .flat_map(|(db, keys)| keys.keys().map(move |k| (*db, k.clone())))
            .collect()
    }

    /// Gives back the indexes' memory once nobody waits: hash maps keep the capacity of
    /// their largest moment, so a burst of 10 000 waiters would otherwise hold their
    /// index (hundreds of KB) for the server's lifetime. Cheap when already small.
    fn shrink_when_idle(&mut self) {
        if self.by_handle.capacity() > 0 && self.by_handle.is_empty() {
            self.by_handle.shrink_to_fit();
        }
        if self.granted.capacity() > 0 && self.granted.is_empty() {
            self.granted.shrink_to_fit();
        }
        if self.timers.capacity() > 0 && self.timers.is_empty() {
            self.timers.shrink_to_fit();
        }
        if self.dbs.capacity() > 0 && self.dbs.is_empty() {
            self.dbs.shrink_to_fit();
        }
        if self.tickets_of.capacity() > 0 && self.tickets_of.is_empty() {
            self.tickets_of.shrink_to_fit();
        }
        if self.uncollected.capacity() > 0 && self.uncollected.is_empty() {
            self.uncollected.shrink_to_fit();
        }
    }

    /// Empties every queue; returns the handles to answer, the timers to stop and the
    /// tickets to notify.
    pub fn drain(&mut self) -> Drained {
        let mut out = Drained {
            handles: Vec::with_capacity(self.total - self.tickets),
            ..Drained::default()
        };
        for (db, keys) in self.dbs.drain() {
            for (name, queue) in keys {
                for w in queue.waiters.into_iter().filter_map(|(_, w)| w) {
                    match w.who() {
                        Who::Blocked(handle) => out.handles.push(handle),
                        Who::Ticket(_) => out.tickets.push((db, name.clone(), w.request)),
                    }
                    out.timers
                        .extend((w.deadline_timer != 0).then_some(w.deadline_timer));
                }
                out.timers.extend(queue.timer.map(|t| t.id));
                out.timers.extend(queue.ticket_timer.map(|t| t.id));
            }
        }
        self.by_handle.clear();
        self.timers.clear();
        self.granted.clear();
        self.tickets_of.clear();
        self.uncollected.clear();
        self.total = 0;
        self.tickets = 0;
        out
    }
}

thread_local! {
    // All module callbacks run on Redis's main thread. Borrows are kept short and never
    // held across a key write or a notification: those re-enter the event handler.
    static QUEUES: RefCell<Queues> = RefCell::new(Queues::default());
}

/// `total() > 0`, kept beside the queues so that the keyspace callback, which runs on
/// every event of the server, reads one flag instead of borrowing them. A plain static:
/// only Redis's main thread touches it.
static ANYONE_WAITS: AtomicBool = AtomicBool::new(false);

pub fn with<R>(f: impl FnOnce(&mut Queues) -> R) -> R {
    QUEUES.with(|q| {
        let mut q = q.borrow_mut();
        let out = f(&mut q);
        ANYONE_WAITS.store(q.total > 0, Relaxed);
        if q.total == 0 {
            q.shrink_when_idle();
        }
        out
    })
}

/// Whether the server tells the module of every write to a key with waiters (Redis 7.0's
/// keyspace events, to which the module subscribes for strings, hashes and sorted sets),
/// or only of removals (7.2+/Valkey's key server event: no tax on other writes). Set once
/// by `events::subscribe`.
static WRITES_REPORTED: AtomicBool = AtomicBool::new(true);

pub fn set_writes_reported(reported: bool) {
    WRITES_REPORTED.store(reported, Relaxed);
}

/// How often a queue looks again at a key where a write it is not told of could let its
/// head in (a semaphore raised by a Java client's INCRBY, where only removals are
/// reported): the bound on how late such a waiter is served.
pub const UNREPORTED_WRITE_POLL_MS: i64 = 10;

/// The [`Check`] of a head that only a write can let in: wait for the write's keyspace
/// event where the server reports it, else look again every [`UNREPORTED_WRITE_POLL_MS`].
pub fn wait_for_write() -> Check {
    let pttl = if WRITES_REPORTED.load(Relaxed) {
        -1
    } else {
        UNREPORTED_WRITE_POLL_MS
    };
    Check::Wait { pttl }
}

/// True when any client waits for any lock.
pub fn anyone_waits() -> bool {
    ANYONE_WAITS.load(Relaxed)
}

/// True when somebody waits for this key. Cheap when nobody waits anywhere.
pub fn has_waiters(db: i32, key: &[u8]) -> bool {
    with(|q| q.total > 0 && q.len(db, key) > 0)
}

/// The sum of [`Ask::units`] over a key's queue (0 without waiters).
pub fn queued_units(db: i32, key: &[u8]) -> i64 {
    with(|q| {
        q.queue(db, key).map_or(0, |queue| {
            queue.live_waiters().map(|w| w.request.units()).sum()
        })
    })
}

/// Blocks the current client until it is handed the lock or `timeout_ms` passes.
/// `pttl` is the holder's remaining lease, to arm the expiry timer.
pub fn wait(
    ctx: &Context,
    db: i32,
    name: &RedisString,
    mut waiter: Waiter,
    timeout_ms: i64,
    pttl: i64,
) -> Result<(), &'static str> {
    let key = name.as_slice();
    let limit = crate::config::max_waiters_per_key();
    if with(|q| q.len(db, key)) >= limit {
        return Err(ERR_TOO_MANY_WAITERS);
    }
    let handle = ffi::block_client(ctx);
    waiter.who = Who::Blocked(handle).into();
    // The module ends the wait itself, with a timer of its own, rather than giving Redis
    // a timeout: a handoff and a timeout then both go through the queue, and whichever
    // takes the waiter out first answers it, exactly once. (Redis's timeout of a client
    // the module unblocked in the same turn sends no reply.) It is also on time, where
    // Redis checks timeouts only when serverCron wakes it, up to 1000/hz ms late.
    if timeout_ms > 0 {
        waiter.deadline_at = ffi::now_ms() + timeout_ms;
        waiter.deadline_timer = ffi::create_timer(ctx, timeout_ms, DEADLINE_BIT | handle.0 as u64);
    }
    if let Err(refused) = with(|q| q.push(db, key, waiter, limit)) {
        // Cannot happen (checked above, single-threaded), but a handle must never leak.
        stop_deadline(ctx, &refused);
        ffi::unblock(handle, Some(Wake::Error(ERR_TOO_MANY_WAITERS.into())));
    }
    note_expiry(ctx, db, key, pttl);
    Ok(())
}

/// Queues a ticket for the current connection (`… WAIT timeout-ms ASYNC`, SPEC 5): it
/// waits in the key's queue like a blocked client, but the connection goes on; its end is
/// published on the key's ticket channel. `pttl` as for [`wait`].
pub fn queue_ticket(
    ctx: &Context,
    db: i32,
    name: &RedisString,
    request: Request,
    timeout_ms: i64,
    pttl: i64,
) -> Result<(), &'static str> {
    let key = name.as_slice();
    let waiter = Waiter {
        request,
        who: Who::Ticket(ffi::client_id(ctx)).into(),
        deadline_timer: 0,
        deadline_at: if timeout_ms > 0 {
            ffi::now_ms() + timeout_ms
        } else {
            0
        },
    };
    let limit = crate::config::max_waiters_per_key();
    with(|q| q.push(db, key, waiter, limit)).map_err(|_| ERR_TOO_MANY_WAITERS)?;
    stats::bump(|s| &s.tickets_queued);
    if timeout_ms > 0 {
        arm_ticket_timer(ctx, db, key);
    }
    note_expiry(ctx, db, key, pttl);
    Ok(())
}

/// Makes sure the key's ticket-deadline timer fires at its earliest ticket deadline.
fn arm_ticket_timer(ctx: &Context, db: i32, key: &[u8]) {
    if let Some((old, tag, fire_at)) = with(|q| q.plan_ticket_timer(db, key)) {
        if let Some(old) = old {
            ffi::stop_timer(ctx, old.id);
        }
        let id = ffi::create_timer(ctx, (fire_at - ffi::now_ms()).max(0), tag);
        with(|q| q.set_ticket_timer(db, key, ArmedTimer { id, tag, fire_at }));
    }
}

/// Publishes how a ticket left its queue, on the key's ticket channel, to this node's
/// subscribers only (not replicated: the clients that queued tickets listen where they
/// queued them).
fn publish_end(ctx: &Context, key: &[u8], request: &Request, end: ticket::End) {
    let (owner, id) = request.names();
    let message = ticket::message(end, id.unwrap_or_default(), owner);
    store::publish_here(ctx, &ticket::channel(key), &message);
}

/// A ticket at the head whose request id was granted already (a retried ASYNC call whose
/// first ticket was granted): dropped, never granted twice. True if it was.
fn head_is_spent_ticket(ctx: &Context, db: i32, name: &RedisString) -> bool {
    let key = name.as_slice();
    let Some(request) = with(|q| {
        q.head(db, key)
            .filter(|w| matches!(w.who(), Who::Ticket(_)))
            .map(|w| w.request.clone())
    }) else {
        return false;
    };
    let Some(id) = request.names().1.filter(|_| request.grant_is_written()) else {
        return false;
    };
    let record =
        RedisString::create_from_slice(std::ptr::null_mut(), &crate::core::request_key(key, id));
    if store::remembered(ctx, &record).is_none() {
        return false;
    }
    with(|q| q.take(db, key));
    true
}

/// A ticket was granted (written already): publish it, and keep the grant as the ticket's
/// connection's until its client collects it.
fn granted_ticket(ctx: &Context, db: i32, name: &RedisString, client: u64, request: Request) {
    stats::bump(|s| &s.tickets_granted);
    publish_end(ctx, name.as_slice(), &request, ticket::End::Granted);
    if !request.grant_is_written() {
        return;
    }
    if let Some(id) = request.names().1 {
        let record = crate::core::request_key(name.as_slice(), id);
        let untold = Untold {
            db,
            key: Rc::from(name.as_slice()),
            request: request.clone(),
        };
        let window = crate::config::request_id_window_ms();
        with(|q| q.granted_ticket(client, &record, untold, ffi::now_ms(), window));
    }
}

/// A request id's first reply was replayed: if it was a ticket's grant, it is collected.
pub fn collected(request_key: &[u8]) {
    with(|q| q.collected(request_key));
}

/// A connection closed: its queued tickets leave their queues, and the grants its tickets
/// were given and never collected are taken back and passed on (like a grant whose
/// blocked client vanished before its reply). Runs while the server frees the client:
/// writes wait for the sweep.
pub fn on_client_gone(ctx: &Context, client: u64) {
    let (dropped, heads) = with(|q| q.drop_tickets_of(client));
    let untold = with(|q| q.uncollected_of(client));
    for (db, key, waiter) in &dropped {
        stats::bump(|s| &s.tickets_dropped);
        stop_deadline(ctx, waiter);
        forget_if_empty(ctx, *db, key);
    }
    for (db, key) in heads {
        schedule_after_loop(ctx, db, &key); // the next head may be grantable now
    }
    for granted in untold {
        revoke_later(ctx, granted);
    }
}

/// Makes sure a key with waiters is looked at again when its lock expires (`pttl` from
/// now; negative means no TTL, so only a release or a keyspace event can free it).
///
/// This is what makes an expired lock with waiters change hands within a few ms of its
/// TTL: Redis's own active expiry samples keys and may take far longer to notice.
pub fn note_expiry(ctx: &Context, db: i32, key: &[u8], pttl: i64) {
    if pttl < 0 || !has_waiters(db, key) {
        return;
    }
    // Expiry is `now > when`, so the key is gone one ms after its PTTL runs out.
    let fire_at = ffi::now_ms() + pttl + 1;
    if let Some((old, tag)) = with(|q| q.plan_timer(db, key, fire_at)) {
        if let Some(old) = old {
            ffi::stop_timer(ctx, old.id);
        }
        let id = ffi::create_timer(ctx, pttl + 1, tag);
        with(|q| q.set_timer(db, key, ArmedTimer { id, tag, fire_at }));
    }
}

/// Who is asking [`serve`] to look at a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// An RLOCK command on this key, which Redis Cluster routed here: the key is ours.
    Command,
    /// A keyspace event, flush, swap or timer: the key may have left this node.
    Event,
}

/// What [`serve`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The key's slot is migrating or lives on another node: the waiters were redirected.
    Redirected,
    /// At least the head of the queue was granted (for the lock: the first waiter holds it).
    Handed,
    /// The head cannot be granted (the lock is held); waiters keep waiting, the expiry
    /// timer is armed.
    StillHeld,
    /// Nobody waits for this key.
    NoWaiters,
}

/// Grants the waiters of `name` in `db` from the head of the queue while the head's
/// primitive says it can be granted. Must run where writes are allowed and propagated: a
/// command or a timer. `ctx` must have `db` selected.
pub fn serve(ctx: &Context, db: i32, name: &RedisString, path: Path) -> Served {
    let key_bytes = name.as_slice();
    if with(|q| q.head(db, key_bytes).is_none()) {
        forget_if_empty(ctx, db, key_bytes);
        return Served::NoWaiters;
    }
    if ffi::writes_paused() {
        retry_later(ctx, db, key_bytes);
        return Served::StillHeld;
    }
    // An RLOCK command on this key was routed here by Redis Cluster: the key is ours.
    let mut routed = path == Path::Command;
    let mut handed = false;
    // The answer when the loop stops: Handed if it granted anyone, else `otherwise`.
    let done = |handed: bool, otherwise: Served| if handed { Served::Handed } else { otherwise };
    loop {
        let Some(head) = with(|q| q.head(db, key_bytes).map(|w| w.request.clone())) else {
            forget_if_empty(ctx, db, key_bytes);
            return done(handed, Served::NoWaiters);
        };
        let write = match head.check(ctx, name, ffi::now_ms()) {
            Check::Grant(write) => write,
            Check::Wait { pttl } => {
                note_expiry(ctx, db, key_bytes, pttl);
                return done(handed, Served::StillHeld);
            }
            Check::Refuse(error) => {
                if let Some(waiter) = with(|q| q.take(db, key_bytes)) {
                    answer_error(ctx, name, waiter, error.into());
                }
                continue;
            }
        };
        if !routed {
            routed = true;
            if let cluster::Route::Redirect(error) = cluster::route_of(ctx, key_bytes) {
                redirect(ctx, db, key_bytes, error);
                return Served::Redirected;
            }
        }
        if head_is_spent_ticket(ctx, db, name) {
            continue; // a duplicate of a ticket granted already: dropped, silently
        }
        let Some(waiter) = with(|q| q.pop(db, key_bytes)) else {
            return done(handed, Served::NoWaiters);
        };
        let grant = write(ctx, name);
        waiter.request.granted(grant.memo);
        stop_deadline(ctx, &waiter);
        match waiter.who() {
            Who::Blocked(handle) => ffi::unblock(handle, Some(Wake::Reply(grant.reply))),
            Who::Ticket(client) => granted_ticket(ctx, db, name, client, waiter.request),
        }
        stats::bump(|s| &s.handoffs);
        handed = true;
        if let Some(pttl) = grant.look_again {
            forget_if_empty(ctx, db, key_bytes);
            note_expiry(ctx, db, key_bytes, pttl);
            return Served::Handed;
        }
    }
}

/// Answers every waiter of a key with a cluster redirection (the key left this node).
fn redirect(ctx: &Context, db: i32, key: &[u8], error: String) {
    let name = RedisString::create_from_slice(std::ptr::null_mut(), key);
    while let Some(waiter) = with(|q| q.take(db, key)) {
        answer_error(ctx, &name, waiter, error.clone().into());
    }
    forget_if_empty(ctx, db, key);
}

/// Answers a waiter that leaves its queue with an error: a blocked client is replied, a
/// ticket's end is published.
fn answer_error(
    ctx: &Context,
    name: &RedisString,
    waiter: Waiter,
    error: std::borrow::Cow<'static, str>,
) {
    stop_deadline(ctx, &waiter);
    match waiter.who() {
        Who::Blocked(handle) => ffi::unblock(handle, Some(Wake::Error(error))),
        Who::Ticket(_) => publish_end(
            ctx,
            name.as_slice(),
            &waiter.request,
            ticket::End::Error(&error),
        ),
    }
}

/// Timer tags with this bit end a wait; the other bits are the waiter's blocked-client
/// handle (a pointer, far below 2^63). Expiry timers use small counters, the sweep 0.
pub const DEADLINE_BIT: u64 = 1 << 63;

/// Stops a waiter's deadline timer once it leaves the queue early, so no timer outlives
/// its waiter (a pending timer would also keep MODULE UNLOAD from succeeding).
fn stop_deadline(ctx: &Context, waiter: &Waiter) {
    if waiter.deadline_timer != 0 {
        ffi::stop_timer(ctx, waiter.deadline_timer);
    }
}

fn forget_if_empty(ctx: &Context, db: i32, key: &[u8]) {
    for timer in with(|q| q.forget_if_empty(db, key)) {
        ffi::stop_timer(ctx, timer.id);
    }
}

/// A wait's deadline timer fired: the waiter leaves the queue and gets the holder's PTTL,
/// as a non-waiting ACQUIRE would (-2 if the lock is, for this instant, gone).
pub fn on_deadline(ctx: &Context, handle: Blocked) {
    // Every way out of the queue stops this timer, so the waiter is the one it was armed
    // for; the deadline check guards against a handle reused by a later waiter anyway.
    let due = with(|q| q.deadline_of(handle)).is_some_and(|at| at <= ffi::now_ms());
    let Some((db, name, waiter, was_head)) = due.then(|| with(|q| q.remove(handle))).flatten()
    else {
        return;
    };
    if was_head {
        schedule_after_loop(ctx, db, &name); // the next head may be grantable now
    }
    stats::bump(|s| &s.wait_timeouts);
    let reply = if ffi::select_db(ctx, db) {
        let name_rs = RedisString::create_from_slice(std::ptr::null_mut(), &name);
        waiter.request.timed_out(ctx, &name_rs)
    } else {
        Reply::Int(-2)
    };
    forget_if_empty(ctx, db, &name);
    ffi::unblock(handle, Some(Wake::Reply(reply)));
}

/// Timeout callback, reached only through `CLIENT UNBLOCK <id> TIMEOUT` (the module gives
/// Redis no timeout): the waiter leaves the queue and gets the holder's PTTL.
pub fn on_timeout(ctx: &Context, handle: Blocked) {
    let Some((db, name, waiter, _)) = with(|q| q.remove(handle)) else {
        // Already handed the lock: Redis does not time out an unblocked client, so this
        // is unreachable; answer something rather than leave the client hanging.
        ffi::reply_error(ctx, ERR_INTERNAL);
        return;
    };
    stats::bump(|s| &s.wait_timeouts);
    stop_deadline(ctx, &waiter); // fired already, unless this is CLIENT UNBLOCK
                                 // The timeout context belongs to the blocked client, whose db is the waiter's db.
    let name_rs = RedisString::create_from_slice(std::ptr::null_mut(), &name);
    ffi::reply_with(ctx, &waiter.request.timed_out(ctx, &name_rs));
    forget_if_empty(ctx, db, &name);
    ffi::unblock(handle, None);
}

/// Disconnect callback (also CLIENT UNBLOCK, CLIENT KILL): the waiter leaves the queue.
///
/// A client handed the lock whose reply had not gone out yet never learns it holds the
/// lock: that lock would sit unused for a whole lease while others wait. It is taken
/// back (released as its owner would) and passes to the next waiter. Its handle was
/// already given back to Redis at the handoff.
pub fn on_disconnect(ctx: &Context, handle: Blocked) {
    if let Some((db, name, waiter, was_head)) = with(|q| q.remove(handle)) {
        stop_deadline(ctx, &waiter);
        forget_if_empty(ctx, db, &name);
        ffi::unblock(handle, None);
        if was_head {
            schedule_after_loop(ctx, db, &name); // the next head may be grantable now
        }
    } else if let Some(granted) = with(|q| q.ungrant(handle)) {
        revoke_later(ctx, granted);
    }
}

/// Reply callback hook: a woken waiter was told.
pub fn on_replied(handle: Blocked) {
    with(|q| q.replied(handle));
}

/// A queue's timer fired: at the lock's expiry, serve the key if its lock is gone; at a
/// ticket deadline, time out the tickets that are due (and serve the next head if the
/// head was one of them).
fn on_queue_timer(ctx: &Context, tag: u64) {
    let Some((db, name, fired)) = with(|q| q.fired(tag)) else {
        return;
    };
    if !ffi::select_db(ctx, db) {
        return;
    }
    let name_rs = RedisString::create_from_slice(std::ptr::null_mut(), &name);
    match fired {
        Fired::Expiry => {
            serve(ctx, db, &name_rs, Path::Event);
        }
        Fired::Tickets => {
            let (due, head_left) = with(|q| q.due_tickets(db, &name, ffi::now_ms()));
            for waiter in due {
                stats::bump(|s| &s.wait_timeouts);
                stats::bump(|s| &s.tickets_timed_out);
                publish_end(ctx, &name, &waiter.request, ticket::End::TimedOut);
            }
            arm_ticket_timer(ctx, db, &name);
            forget_if_empty(ctx, db, &name);
            if head_left {
                serve(ctx, db, &name_rs, Path::Event);
            }
        }
    }
}

/// The server stopped being a master: a replica cannot grant locks, so every waiter is
/// answered with an error now rather than left waiting for a handoff that cannot come,
/// and the pending list is dropped (a replica's keys are its master's to change).
pub fn fail_all(ctx: &Context, error: &'static str) {
    PENDING.with(|p| p.borrow_mut().clear());
    let drained = with(Queues::drain);
    for id in drained.timers {
        ffi::stop_timer(ctx, id);
    }
    for handle in drained.handles {
        ffi::unblock(handle, Some(Wake::Error(error.into())));
    }
    for (_, name, request) in drained.tickets {
        publish_end(ctx, &name, &request, ticket::End::Error(error));
    }
}

// ---- The pending list: keys to look at once the current command has propagated ----

/// The tag of the pending-list timer; expiry timers use tags from 1 up.
const SWEEP_TAG: u64 = 0;

thread_local! {
    static PENDING: RefCell<Vec<(i32, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
    static SWEEP_ARMED: Cell<bool> = const { Cell::new(false) };
    static JOB_ARMED: Cell<bool> = const { Cell::new(false) };
    static REVOKES: RefCell<Vec<Untold>> = const { RefCell::new(Vec::new()) };
}

/// Puts a key on the pending list, served by a post-notification job where the server
/// has them, else by a zero-delay timer.
pub fn schedule(ctx: &Context, db: i32, key: &[u8]) {
    PENDING.with(|p| p.borrow_mut().push((db, key.to_vec())));
    if JOB_ARMED.with(Cell::get) {
        return;
    }
    if ffi::add_post_job(ctx) {
        JOB_ARMED.with(|a| a.set(true));
    } else {
        arm_sweep(ctx, 0);
    }
}

/// Puts a key on the pending list served by the zero-delay timer alone, after the
/// current loop of the server (evictions: see events.rs).
pub fn schedule_after_loop(ctx: &Context, db: i32, key: &[u8]) {
    PENDING.with(|p| p.borrow_mut().push((db, key.to_vec())));
    arm_sweep(ctx, 0);
}

fn arm_sweep(ctx: &Context, delay_ms: i64) {
    if !SWEEP_ARMED.with(|a| a.replace(true)) {
        ffi::create_timer(ctx, delay_ms, SWEEP_TAG);
    }
}

/// While writes are paused, look at the key again a little later (not at once: that
/// would spin the event loop for the whole pause).
fn retry_later(ctx: &Context, db: i32, key: &[u8]) {
    PENDING.with(|p| p.borrow_mut().push((db, key.to_vec())));
    arm_sweep(ctx, PAUSED_RETRY_MS);
}

const PAUSED_RETRY_MS: i64 = 10;

/// Takes back, on the next sweep, a grant handed to a client that vanished untold.
fn revoke_later(ctx: &Context, granted: Untold) {
    REVOKES.with(|r| r.borrow_mut().push(granted));
    arm_sweep(ctx, 0);
}

/// Every module timer lands here: the sweep, a wait's deadline, a key timer, or a key's
/// expiry timer.
pub fn on_timer(ctx: &Context, tag: u64) {
    if tag == SWEEP_TAG {
        sweep(ctx);
    } else if tag & DEADLINE_BIT != 0 {
        on_deadline(ctx, Blocked((tag & !DEADLINE_BIT) as usize));
    } else if tag & KEY_TIMER_BIT != 0 {
        on_key_timer(ctx, tag);
    } else {
        on_queue_timer(ctx, tag);
    }
}

// ---- Key timers: a primitive's state that changes by itself, waiters or not ----
//
// The expiry timer above serves waiters. Some state changes at a time of its own even when
// nobody waits, and must be written then for clients that only read the keys or listen on
// pub/sub (a permit-expirable semaphore's permit returns to the pool at its lease end, with
// Redisson's message). A primitive registers one callback at init (lib.rs) and arms a key
// timer with it; the engine keeps at most one timer per (callback, db, key), the earliest,
// and calls the callback with `db` selected where writes are allowed: not on a replica
// (its keys are its master's), and not while writes are paused (it retries shortly).
// The callback does its write and arms again for its next time, if any. Timers live in
// memory only: after a restart or a failover the state is brought up to date by the next
// command on the key (every primitive that uses them reads its state that way).

/// Timer tags with this bit (and not [`DEADLINE_BIT`]) are key timers; the other bits
/// count up. Expiry timers' counters stay far below it.
pub const KEY_TIMER_BIT: u64 = 1 << 62;

/// A key timer's callback: `db` is selected, `name` is the key it was armed for.
pub type KeyTimerFn = fn(&Context, i32, &RedisString);

/// Which registered callback a key timer runs (an index handed out by
/// [`register_key_timer`]).
pub type KeyTimerKind = usize;

type KeyTimerKey = (KeyTimerKind, i32, Vec<u8>);

#[derive(Default)]
struct KeyTimers {
    kinds: Vec<KeyTimerFn>,
    armed: HashMap<KeyTimerKey, ArmedTimer>,
    tags: HashMap<u64, KeyTimerKey>,
    next_tag: u64,
}

thread_local! {
    static KEY_TIMERS: RefCell<KeyTimers> = RefCell::new(KeyTimers::default());
}

/// Registers a primitive's key timer callback (once, at init); returns its kind.
pub fn register_key_timer(f: KeyTimerFn) -> KeyTimerKind {
    KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        t.kinds.push(f);
        t.kinds.len() - 1
    })
}

/// Makes sure `kind`'s callback runs for `key` in `db` at `fire_at` (ms since the epoch)
/// or earlier. An earlier timer already armed is kept: it fires, finds nothing due yet
/// and arms again, which costs less than stopping a timer on every renewal.
pub fn arm_key_timer(ctx: &Context, kind: KeyTimerKind, db: i32, key: &[u8], fire_at: i64) {
    let slot = (kind, db, key.to_vec());
    let old = KEY_TIMERS.with(|t| {
        let t = t.borrow();
        t.armed.get(&slot).copied()
    });
    if matches!(old, Some(t) if t.fire_at <= fire_at) {
        return;
    }
    if let Some(old) = old {
        ffi::stop_timer(ctx, old.id);
    }
    // Rounded up from the wall clock's microseconds: Redis fires a timer once its delay
    // has passed, and the callback must then read `now_ms() >= fire_at` (a permit expires
    // when its score <= now), not a millisecond short of it, which would cost a re-arm.
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    let delay = (fire_at.saturating_mul(1000) - now_us + 999).div_euclid(1000);
    let tag = KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        if let Some(old) = old {
            t.tags.remove(&old.tag);
        }
        t.next_tag += 1;
        KEY_TIMER_BIT | t.next_tag
    });
    let id = ffi::create_timer(ctx, delay, tag);
    KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        t.tags.insert(tag, slot.clone());
        t.armed.insert(slot, ArmedTimer { id, tag, fire_at });
    });
}

/// Stops `kind`'s timer for `key` in `db`, if one is armed (the state has no time of its
/// own left, say every leased permit was released): no timer outlives its reason.
pub fn disarm_key_timer(ctx: &Context, kind: KeyTimerKind, db: i32, key: &[u8]) {
    let old = KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        let old = t.armed.remove(&(kind, db, key.to_vec()))?;
        t.tags.remove(&old.tag);
        Some(old)
    });
    if let Some(old) = old {
        ffi::stop_timer(ctx, old.id);
    }
}

/// SWAPDB exchanged two dbs' contents: the key timers armed for keys of either db now
/// belong to the other number, where their keys went (else a permit's lease end would be
/// looked for in the db it left, and only the next command on the key would reclaim it).
pub fn swap_key_timers(a: i32, b: i32) {
    let other = |db: i32| {
        if db == a {
            b
        } else if db == b {
            a
        } else {
            db
        }
    };
    KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        let armed = std::mem::take(&mut t.armed);
        t.armed = armed
            .into_iter()
            .map(|((kind, db, key), timer)| ((kind, other(db), key), timer))
            .collect();
        for slot in t.tags.values_mut() {
            slot.1 = other(slot.1);
        }
    });
}

/// How many key timers are armed (INFO, leak tests).
pub fn key_timers_armed() -> usize {
    KEY_TIMERS.with(|t| t.borrow().armed.len())
}

fn on_key_timer(ctx: &Context, tag: u64) {
    let Some(((kind, db, key), f)) = KEY_TIMERS.with(|t| {
        let mut t = t.borrow_mut();
        let slot = t.tags.remove(&tag)?;
        if matches!(t.armed.get(&slot), Some(a) if a.tag == tag) {
            t.armed.remove(&slot);
        }
        let f = *t.kinds.get(slot.0)?;
        Some((slot, f))
    }) else {
        return;
    };
    if ctx.get_flags().contains(ContextFlags::SLAVE) {
        return; // a replica's keys are its master's to change
    }
    if ffi::writes_paused() {
        arm_key_timer(ctx, kind, db, &key, ffi::now_ms() + PAUSED_RETRY_MS);
        return;
    }
    if ffi::select_db(ctx, db) {
        let name = RedisString::create_from_slice(std::ptr::null_mut(), &key);
        f(ctx, db, &name);
    }
}

/// The pending list's server: a timer's callback, or a post-notification job's.
pub fn sweep(ctx: &Context) {
    SWEEP_ARMED.with(|a| a.set(false));
    JOB_ARMED.with(|a| a.set(false));
    if ctx.get_flags().contains(ContextFlags::SLAVE) {
        // A replica's keys are its master's to change.
        PENDING.with(|p| p.borrow_mut().clear());
        REVOKES.with(|r| r.borrow_mut().clear());
        return;
    }
    for granted in REVOKES.with(|r| std::mem::take(&mut *r.borrow_mut())) {
        if ffi::select_db(ctx, granted.db) {
            revoke(ctx, &granted);
        }
    }
    let mut pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    pending.sort_unstable();
    pending.dedup();
    for (db, key) in pending {
        if ffi::select_db(ctx, db) {
            let name = RedisString::create_from_slice(std::ptr::null_mut(), &key);
            settle(ctx, db, &name);
        }
    }
}

/// Takes back a grant handed to a waiter that vanished before being told (its primitive
/// checks the key still holds what the grant wrote), then serves the next waiter.
fn revoke(ctx: &Context, untold: &Untold) {
    if ffi::writes_paused() {
        REVOKES.with(|r| r.borrow_mut().push(untold.clone()));
        arm_sweep(ctx, PAUSED_RETRY_MS);
        return;
    }
    let name = RedisString::create_from_slice(std::ptr::null_mut(), &untold.key);
    untold.request.take_back(ctx, untold.db, &name);
}

/// After a lock was freed: hand it to the first waiter, or tell pub/sub waiters
/// (Redisson's) that it is free. A handoff publishes nothing: the lock never was free.
pub fn freed(ctx: &Context, db: i32, name: &RedisString, path: Path) {
    match serve(ctx, db, name, path) {
        Served::Handed | Served::Redirected => {}
        // Writes paused: the sweep serves the key once they resume.
        Served::StillHeld if ffi::writes_paused() => {}
        _ => {
            tracking::untrack(db, name.as_slice());
            store::publish_unlock(ctx, name);
        }
    }
}

/// Looks at a lock key after something touched it: a freed lock goes to the first waiter,
/// or, with nobody waiting, its unlock message is published (once: the key is forgotten).
/// Runs where writes propagate (a command or a timer), with `db` selected.
pub fn settle(ctx: &Context, db: i32, name: &RedisString) {
    if serve(ctx, db, name, Path::Event) != Served::NoWaiters {
        return;
    }
    if ffi::writes_paused() {
        retry_later(ctx, db, name.as_slice());
        return;
    }
    let held = matches!(
        store::read(&LockKey::open(ctx, name, false)),
        Ok(LockState::Held { .. })
    );
    if !held && tracking::untrack(db, name.as_slice()) {
        store::publish_unlock(ctx, name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request that is never asked anything: these tests are about the bookkeeping.
    #[derive(Debug)]
    #[allow(dead_code)] // read through Debug only
    struct Probe(usize);

    impl Ask for Probe {
        fn check(&self, _: &Context, _: &RedisString, _: i64) -> Check {
            unreachable!()
        }
        fn timed_out(&self, _: &Context, _: &RedisString) -> Reply {
            unreachable!()
        }
        fn take_back(&self, _: &Context, _: i32, _: &RedisString) {
            unreachable!()
        }
    }

    fn waiter(n: usize) -> Waiter {
        Waiter {
            who: Who::Blocked(Blocked(n)).into(),
            ..Waiter::new(Rc::new(Probe(n)))
        }
    }

    #[test]
    fn it_serves_waiters_first_come_first_served() {
        let mut q = Queues::default();
        for n in 1..=5 {
            q.push(0, b"k", waiter(n), 100).unwrap();
        }
        let order: Vec<usize> =
            std::iter::from_fn(|| q.pop(0, b"k").map(|w| w.handle().unwrap().0)).collect();
        assert_eq!(order, vec![1, 2, 3, 4, 5]);
        assert_eq!(q.total(), 0);
    }

    #[test]
    fn it_removes_a_waiter_from_the_middle_and_keeps_the_order() {
        let mut q = Queues::default();
        for n in 1..=4 {
            q.push(0, b"k", waiter(n), 100).unwrap();
        }
        let (db, name, w, was_head) = q.remove(Blocked(2)).unwrap();
        assert_eq!(
            (db, &name[..], w.handle(), was_head),
            (0, &b"k"[..], Some(Blocked(2)), false)
        );
        assert!(q.remove(Blocked(2)).is_none(), "a handle is removed once");
        assert_eq!(q.pop(0, b"k").unwrap().handle().unwrap(), Blocked(1));
        assert_eq!(q.pop(0, b"k").unwrap().handle().unwrap(), Blocked(3));
        assert_eq!(q.total(), 1);
    }

    #[test]
    fn it_keeps_keys_and_dbs_apart() {
        let mut q = Queues::default();
        q.push(0, b"a", waiter(1), 10).unwrap();
        q.push(1, b"a", waiter(2), 10).unwrap();
        q.push(0, b"b", waiter(3), 10).unwrap();
        assert_eq!((q.len(0, b"a"), q.len(1, b"a"), q.len(0, b"b")), (1, 1, 1));
        assert_eq!(q.keys_with_waiters(), 3);
        assert_eq!(q.pop(1, b"a").unwrap().handle().unwrap(), Blocked(2));
    }

    #[test]
    fn it_refuses_waiters_beyond_the_limit() {
        let mut q = Queues::default();
        q.push(0, b"k", waiter(1), 2).unwrap();
        q.push(0, b"k", waiter(2), 2).unwrap();
        assert!(q.push(0, b"k", waiter(3), 2).is_err());
        assert!(q.push(0, b"other", waiter(4), 0).is_err());
        assert_eq!(q.total(), 2);
    }

    #[test]
    fn it_forgets_an_empty_queue_and_returns_its_timer() {
        let mut q = Queues::default();
        q.push(0, b"k", waiter(1), 10).unwrap();
        let (old, tag) = q.plan_timer(0, b"k", 1000).unwrap();
        assert!(old.is_none());
        let t = ArmedTimer {
            id: 7,
            tag,
            fire_at: 1000,
        };
        q.set_timer(0, b"k", t);
        assert!(q.forget_if_empty(0, b"k").is_empty(), "not empty yet");
        q.pop(0, b"k");
        assert_eq!(q.forget_if_empty(0, b"k"), vec![t]);
        assert_eq!(q.keys_with_waiters(), 0);
        assert!(q.fired(tag).is_none(), "the stopped timer's tag is stale");
    }

    #[test]
    fn it_keeps_an_earlier_timer_and_replaces_a_later_one() {
        let mut q = Queues::default();
        q.push(0, b"k", waiter(1), 10).unwrap();
        let (_, tag) = q.plan_timer(0, b"k", 1000).unwrap();
        q.set_timer(
            0,
            b"k",
            ArmedTimer {
                id: 1,
                tag,
                fire_at: 1000,
            },
        );
        // A renewal pushes the expiry later: the armed timer fires first and re-arms.
        assert!(q.plan_timer(0, b"k", 5000).is_none());
        // A shorter lease needs an earlier timer: the old one is returned to be stopped.
        let (old, tag2) = q.plan_timer(0, b"k", 500).unwrap();
        assert_eq!(old.unwrap().id, 1);
        q.set_timer(
            0,
            b"k",
            ArmedTimer {
                id: 2,
                tag: tag2,
                fire_at: 500,
            },
        );
        assert!(q.fired(tag).is_none(), "the replaced timer is stale");
        assert_eq!(
            q.fired(tag2).map(|(db, k, f)| (db, k.to_vec(), f)),
            Some((0, b"k".to_vec(), Fired::Expiry))
        );
    }

    #[test]
    fn it_remembers_a_granted_waiter_until_its_reply_goes_out() {
        let mut q = Queues::default();
        q.push(0, b"k", waiter(1), 10).unwrap();
        q.push(0, b"k", waiter(2), 10).unwrap();
        q.pop(0, b"k").unwrap();
        q.pop(0, b"k").unwrap();
        q.replied(Blocked(1));
        assert!(
            q.ungrant(Blocked(1)).is_none(),
            "told: nothing to take back"
        );
        let g = q.ungrant(Blocked(2)).unwrap();
        assert_eq!((g.db, &g.key[..]), (0, &b"k"[..]));
        assert_eq!(format!("{:?}", g.request), "Probe(2)");
        assert!(q.ungrant(Blocked(2)).is_none());
    }

    #[test]
    fn it_drains_every_queue() {
        let mut q = Queues::default();
        q.push(0, b"a", waiter(1), 10).unwrap();
        q.push(3, b"b", waiter(2), 10).unwrap();
        let mut handles = q.drain().handles;
        handles.sort_by_key(|h| h.0);
        assert_eq!(handles, vec![Blocked(1), Blocked(2)]);
        assert_eq!((q.total(), q.keys_with_waiters()), (0, 0));
        assert!(q.remove(Blocked(1)).is_none());
    }

    #[test]
    fn it_gives_back_its_indexes_memory_once_nobody_waits() {
        let mut q = Queues::default();
        for n in 1..=1000 {
            q.push(0, format!("k{n}").as_bytes(), waiter(n), 10)
                .unwrap();
        }
        assert!(q.by_handle.capacity() >= 1000);
        q.shrink_when_idle();
        assert!(q.by_handle.capacity() >= 1000, "not while anyone waits");
        for n in 1..=1000 {
            q.remove(Blocked(n));
            q.forget_if_empty(0, format!("k{n}").as_bytes());
        }
        q.shrink_when_idle();
        assert_eq!((q.by_handle.capacity(), q.dbs.capacity()), (0, 0));
    }

    fn ticket(n: usize, client: u64, deadline_at: i64) -> Waiter {
        Waiter {
            who: Who::Ticket(client).into(),
            deadline_at,
            ..Waiter::new(Rc::new(Probe(n)))
        }
    }

    fn probe_of(w: &Waiter) -> String {
        format!("{:?}", w.request)
    }

    #[test]
    fn tickets_and_blocked_waiters_share_one_fifo() {
        let mut q = Queues::default();
        q.push(0, b"k", waiter(1), 100).unwrap();
        q.push(0, b"k", ticket(2, 7, 0), 100).unwrap();
        q.push(0, b"k", waiter(3), 100).unwrap();
        q.push(0, b"k", ticket(4, 8, 0), 100).unwrap();
        assert_eq!((q.total(), q.tickets(), q.len(0, b"k")), (4, 2, 4));
        let order: Vec<String> =
            std::iter::from_fn(|| q.pop(0, b"k").map(|w| probe_of(&w))).collect();
        assert_eq!(order, ["Probe(1)", "Probe(2)", "Probe(3)", "Probe(4)"]);
        assert_eq!((q.total(), q.tickets()), (0, 0));
        assert!(
            q.tickets_of.is_empty(),
            "per-connection counts go with their tickets"
        );
    }

    #[test]
    fn a_closed_connection_takes_its_tickets_from_every_queue() {
        let mut q = Queues::default();
        q.push(0, b"a", ticket(1, 7, 0), 100).unwrap();
        q.push(0, b"a", ticket(2, 8, 0), 100).unwrap();
        q.push(0, b"a", ticket(3, 7, 0), 100).unwrap();
        q.push(2, b"b", waiter(4), 100).unwrap();
        q.push(2, b"b", ticket(5, 7, 0), 100).unwrap();
        let (dropped, heads) = q.drop_tickets_of(7);
        let mut names: Vec<String> = dropped.iter().map(|(_, _, w)| probe_of(w)).collect();
        names.sort();
        assert_eq!(names, ["Probe(1)", "Probe(3)", "Probe(5)"]);
        assert_eq!(
            heads
                .iter()
                .map(|(db, k)| (*db, k.to_vec()))
                .collect::<Vec<_>>(),
            vec![(0, b"a".to_vec())]
        );
        assert_eq!(
            (q.total(), q.tickets(), q.len(0, b"a"), q.len(2, b"b")),
            (2, 1, 1, 1)
        );
        assert_eq!(probe_of(q.head(0, b"a").unwrap()), "Probe(2)");
        assert!(
            q.drop_tickets_of(7).0.is_empty(),
            "a connection without tickets costs a lookup"
        );
        assert!(
            q.forget_if_empty(0, b"a").is_empty(),
            "ticket 2 still queues"
        );
    }

    #[test]
    fn due_tickets_leave_in_deadline_order_and_the_timer_follows_the_earliest() {
        let mut q = Queues::default();
        q.push(0, b"k", ticket(1, 7, 300), 100).unwrap();
        q.push(0, b"k", ticket(2, 7, 100), 100).unwrap();
        q.push(0, b"k", ticket(3, 7, 0), 100).unwrap(); // no deadline
        q.push(0, b"k", ticket(4, 7, 200), 100).unwrap();
        let (old, tag, at) = q.plan_ticket_timer(0, b"k").unwrap();
        assert_eq!((old, at), (None, 100));
        q.set_ticket_timer(
            0,
            b"k",
            ArmedTimer {
                id: 1,
                tag,
                fire_at: at,
            },
        );
        assert!(
            q.plan_ticket_timer(0, b"k").is_none(),
            "the armed timer is the earliest"
        );
        assert_eq!(q.fired(tag).map(|(_, _, f)| f), Some(Fired::Tickets));
        let (due, head_left) = q.due_tickets(0, b"k", 200);
        assert_eq!(
            due.iter().map(probe_of).collect::<Vec<_>>(),
            ["Probe(2)", "Probe(4)"]
        );
        assert!(!head_left);
        // Ticket 1 leaves early (granted): its deadline entry is stale and skipped.
        assert_eq!(probe_of(&q.pop(0, b"k").unwrap()), "Probe(1)");
        assert!(
            q.plan_ticket_timer(0, b"k").is_none(),
            "ticket 3 has no deadline"
        );
        assert_eq!(q.due_tickets(0, b"k", 10_000).0.len(), 0);
        assert_eq!((q.len(0, b"k"), q.tickets()), (1, 1));
        let (due, head_left) = {
            q.push(0, b"k", ticket(5, 7, 50), 100).unwrap();
            q.pop(0, b"k"); // ticket 3 granted: ticket 5 is the head
            q.due_tickets(0, b"k", 60)
        };
        assert_eq!((due.len(), head_left), (1, true));
        assert_eq!(q.total(), 0);
    }

    #[test]
    fn deadlines_of_tickets_granted_early_do_not_pile_up() {
        let mut q = Queues::default();
        q.push(0, b"k", ticket(0, 7, 1_000_000), 10_000).unwrap(); // stays queued
        for n in 1..=1000 {
            q.push(0, b"k", ticket(n, 7, 900_000 + n as i64), 10_000)
                .unwrap();
            // Granted right away (behind the first one: taken from the middle).
            let seq = q.queue(0, b"k").unwrap().waiters.back().unwrap().0;
            let queue = q.queue_mut(0, b"k").unwrap();
            let i = queue.position(seq).unwrap();
            queue.take_at(i).unwrap();
        }
        let queue = q.queue(0, b"k").unwrap();
        assert!(
            queue.ticket_deadlines.len() <= 2 * queue.live + 64,
            "{}",
            queue.ticket_deadlines.len()
        );
        assert_eq!(
            q.queue_mut(0, b"k").unwrap().next_ticket_deadline(),
            Some(1_000_000)
        );
    }

    #[test]
    fn a_queue_slot_stays_small_and_who_round_trips() {
        // A queued ticket's slot: a request pointer, who (packed), a timer, a deadline.
        assert!(std::mem::size_of::<(u64, Option<Waiter>)>() <= 48);
        for who in [
            Who::Blocked(Blocked(0x7fff_1234_5678)),
            Who::Ticket(1),
            Who::Ticket(u32::MAX as u64 * 9),
        ] {
            assert_eq!(PackedWho::from(who).get(), who);
        }
    }

    #[test]
    fn holes_left_by_removals_are_dropped_and_order_is_kept() {
        let mut q = Queues::default();
        for n in 1..=200 {
            q.push(0, b"k", waiter(n), 1000).unwrap();
        }
        for n in (2..=200).step_by(2) {
            assert!(q.remove(Blocked(n)).is_some());
        }
        for n in (3..=199).step_by(4) {
            assert!(q.remove(Blocked(n)).is_some());
        }
        let queue = q.queue(0, b"k").unwrap();
        assert_eq!(queue.live, 50);
        assert!(
            queue.waiters.len() <= 2 * queue.live + 32,
            "holes compacted"
        );
        let order: Vec<usize> =
            std::iter::from_fn(|| q.pop(0, b"k").map(|w| w.handle().unwrap().0)).collect();
        assert_eq!(order, (1..=200).step_by(4).collect::<Vec<_>>());
        assert!(q.remove(Blocked(1)).is_none());
    }

    #[test]
    fn grants_are_uncollected_until_collected_or_their_connection_closes() {
        let mut q = Queues::default();
        let untold = |n| Untold {
            db: 0,
            key: Rc::from(&b"k"[..]),
            request: Rc::new(Probe(n)) as Request,
        };
        q.granted_ticket(7, b"r1", untold(1), 1000, 60_000);
        q.granted_ticket(7, b"r2", untold(2), 1000, 60_000);
        q.granted_ticket(8, b"r3", untold(3), 1000, 60_000);
        q.collected(b"r1");
        let back: Vec<String> = q
            .uncollected_of(7)
            .iter()
            .map(|u| format!("{:?}", u.request))
            .collect();
        assert_eq!(back, ["Probe(2)"]);
        assert!(q.uncollected_of(7).is_empty());
        assert_eq!(q.uncollected.len(), 1);
    }
}
