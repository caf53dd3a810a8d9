//! The queues' bookkeeping, pure and unit-tested (`tests.rs`): one FIFO queue per key,
//! the handle and ticket indexes, grants not yet told or collected, the timer each key
//! has armed. No Redis call here; `serve.rs` and `pending.rs` act on what it answers.

use super::*;

/// A ticket's grant not yet collected by its client (docs/commands/tickets.md): taken back if the
/// connection that queued the ticket closes first.
#[derive(Debug)]
struct Uncollected {
    client: u64,
    granted_at: i64,
    untold: Untold,
    /// Set when that connection closed: taken back at this time (ms since the epoch)
    /// unless a confirmation comes first (design.md 5).
    take_back_at: Option<i64>,
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
pub(super) struct Queue {
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

    pub(super) fn live_waiters(&self) -> impl Iterator<Item = &Waiter> {
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
    pub(super) total: usize,
    tickets: usize,
    /// The `NOTIFY` tags of queued tickets, one copy of each (a client draws one tag and
    /// puts it on every ticket it queues). Entries no ticket holds any more are dropped
    /// when the map has doubled since the last sweep, and all of them once nobody waits.
    tags: HashMap<Box<[u8]>, Tag>,
    tags_swept: usize,
}

/// What [`Queues::drain`] empties out.
#[derive(Debug, Default)]
pub struct Drained {
    pub handles: Vec<Blocked>,
    pub timers: Vec<TimerId>,
    pub tickets: Vec<(i32, KeyName, Waiter)>,
}

/// A grant taken back after its connection's grace: the key it was granted on and what its
/// waiter was never told.
pub type TakeBack = (Box<[u8]>, Untold);

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

    pub(super) fn queue(&self, db: i32, key: &[u8]) -> Option<&Queue> {
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
                take_back_at: None,
            },
        );
    }

    /// Drops the grants past the request-id window (`now`, `window` ms), as
    /// [`Queues::granted_ticket`] does now and then; returns when the youngest grant left
    /// passes it (`None` without any): until then a closing connection's grant is taken back.
    pub fn uncollected_until(&mut self, now: i64, window: i64) -> Option<i64> {
        if self.uncollected.is_empty() {
            return None;
        }
        self.uncollected.retain(|_, u| now - u.granted_at < window);
        if self.uncollected.is_empty() {
            self.uncollected.shrink_to_fit();
        }
        self.uncollected
            .values()
            .map(|u| u.granted_at.saturating_add(window))
            .max()
    }

    /// Forgets the grants of `key` in `db` not collected yet: they are never taken back
    /// (see [`super::void_grants_of`]).
    /// How many it forgot.
    pub fn void_uncollected_of(&mut self, db: i32, key: &[u8]) -> usize {
        if self.uncollected.is_empty() {
            return 0;
        }
        let before = self.uncollected.len();
        self.uncollected
            .retain(|_, u| u.untold.db != db || *u.untold.key != *key);
        before - self.uncollected.len()
    }

    /// A ticket's grant was collected (its request id replayed).
    pub fn collected(&mut self, request_key: &[u8]) {
        if !self.uncollected.is_empty() {
            self.uncollected.remove(request_key);
        }
    }

    /// A connection closed: the grants its tickets were given and never collected are
    /// taken back at `at` unless collected first. True if it had any.
    pub fn orphan_grants_of(&mut self, client: u64, at: i64) -> bool {
        let mut any = false;
        for u in self.uncollected.values_mut() {
            if u.client == client && u.take_back_at.is_none() {
                u.take_back_at = Some(at);
                any = true;
            }
        }
        any
    }

    /// The grants whose closed connection's grace ended by `now` (removed, with their
    /// request-id keys), and when the next one ends.
    pub fn due_take_backs(&mut self, now: i64) -> (Vec<TakeBack>, Option<i64>) {
        let due: Vec<Box<[u8]>> = self
            .uncollected
            .iter()
            .filter(|(_, u)| matches!(u.take_back_at, Some(at) if at <= now))
            .map(|(k, _)| k.clone())
            .collect();
        let taken = due
            .into_iter()
            .filter_map(|k| self.uncollected.remove(&k).map(|u| (k, u.untold)))
            .collect();
        let next = self
            .uncollected
            .values()
            .filter_map(|u| u.take_back_at)
            .min();
        (taken, next)
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
    pub(super) fn shrink_when_idle(&mut self) {
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
        if self.tags.capacity() > 0 {
            self.tags = HashMap::new();
            self.tags_swept = 0;
        }
    }

    /// The shared copy of a `NOTIFY` tag, for a ticket about to be queued.
    pub fn intern_tag(&mut self, tag: &[u8]) -> Tag {
        if let Some(shared) = self.tags.get(tag) {
            return shared.clone();
        }
        if self.tags.len() >= 2 * self.tags_swept + 64 {
            self.tags.retain(|_, t| Rc::strong_count(t) > 1);
            self.tags_swept = self.tags.len();
        }
        let shared: Tag = Rc::new(tag.into());
        self.tags.insert(tag.into(), shared.clone());
        shared
    }

    /// How many distinct tags are kept (tests).
    #[cfg(test)]
    pub(super) fn tags_kept(&self) -> usize {
        self.tags.len()
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
                    out.timers
                        .extend((w.deadline_timer != 0).then_some(w.deadline_timer));
                    match w.who() {
                        Who::Blocked(handle) => out.handles.push(handle),
                        Who::Ticket(_) => out.tickets.push((db, name.clone(), w)),
                    }
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

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
