//! The glue that acts on the queues: blocking and queueing waiters, deadlines,
//! disconnects, tickets' grants and ends, and [`serve`], the handoff loop that grants the
//! head for as long as its primitive allows. A child of `engine`.

use super::*;

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
/// by `events::init`.
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
    // Asked several times by every command: nobody waiting is one load, not a borrow.
    anyone_waits() && with(|q| q.len(db, key) > 0)
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
    let limit = crate::server::config::max_waiters_per_key();
    if with(|q| q.len(db, key)) >= limit {
        return Err(ERR_TOO_MANY_WAITERS);
    }
    // Subscribed before the waiter is queued: no removal it waits for can be missed.
    events::watch(ctx);
    let handle = ffi::block_client(ctx);
    waiter.who = Who::Blocked(handle).into();
    let request = waiter.request.clone();
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
        events::idle_soon(ctx);
        return Ok(());
    }
    request.queued(ctx, db, name);
    note_expiry(ctx, db, key, pttl);
    Ok(())
}

/// Queues a ticket for the current connection (`… WAIT timeout-ms ASYNC [NOTIFY tag]`,
/// design.md 5): it waits in the key's queue like a blocked client, but the connection
/// goes on; its end is published on the key's ticket channel, or on that channel with
/// `:tag` appended when it names a tag. `pttl` as for [`wait`].
pub fn queue_ticket(
    ctx: &Context,
    db: i32,
    name: &RedisString,
    request: Request,
    timeout_ms: i64,
    notify: Option<&[u8]>,
    pttl: i64,
) -> Result<(), &'static str> {
    let key = name.as_slice();
    let waiter = Waiter {
        request: request.clone(),
        who: Who::Ticket(ffi::client_id(ctx)).into(),
        tag: notify.map(|tag| with(|q| q.intern_tag(tag))),
        deadline_timer: 0,
        deadline_at: if timeout_ms > 0 {
            ffi::now_ms() + timeout_ms
        } else {
            0
        },
    };
    let limit = crate::server::config::max_waiters_per_key();
    // Subscribed before the ticket is queued: no removal it waits for can be missed.
    events::watch(ctx);
    if let Err(_refused) = with(|q| q.push(db, key, waiter, limit)) {
        events::idle_soon(ctx);
        return Err(ERR_TOO_MANY_WAITERS);
    }
    stats::bump(|s| &s.tickets_queued);
    request.queued(ctx, db, name);
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

/// Publishes how a ticket left its queue, on the key's ticket channel (with the ticket's
/// `NOTIFY` tag appended, if it has one: then only its own client hears it), to this
/// node's subscribers only (not replicated: the clients that queued tickets listen where
/// they queued them).
fn publish_end(ctx: &Context, key: &[u8], request: &Request, tag: Option<&Tag>, end: ticket::End) {
    let (owner, id) = request.names();
    let message = ticket::message(end, id.unwrap_or_default(), owner);
    let channel = ticket::tagged_channel(key, tag.map(|t| &t[..]));
    store::publish_here(ctx, &channel, &message);
}

thread_local! {
    /// Grant messages to publish once the running command has written its reply:
    /// (channel, message), in grant order.
    static GRANT_MESSAGES: RefCell<Vec<(Vec<u8>, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
}

/// Publishes a ticket's grant message; from inside one of the module's commands, once the
/// command has written its reply (design.md 5).
///
/// Why: the server writes a turn's replies in the order their clients first got output,
/// the last one first (its pending-write list is pushed at its head). Published from
/// inside `RLOCK.RELEASE`, before the releaser's reply, the message would be written
/// after that reply and the releasing process woken first; a blocked waiter's reply is
/// added after the command (the server's before-sleep), so it goes out first. Published
/// after the reply, the message goes out first too, whether or not others still wait.
/// The grant itself is written at once, and kept as the ticket connection's: only the
/// message waits, and only for the rest of the command's call. A timer's or a server
/// event's grant has no reply to follow: its message goes out at once.
fn publish_grant(ctx: &Context, key: &[u8], request: &Request, tag: Option<&Tag>, detail: &[u8]) {
    if !ffi::in_command() {
        return publish_end(ctx, key, request, tag, ticket::End::Granted(detail));
    }
    let (owner, id) = request.names();
    let message = ticket::message(ticket::End::Granted(detail), id.unwrap_or_default(), owner);
    let channel = ticket::tagged_channel(key, tag.map(|t| &t[..]));
    GRANT_MESSAGES.with(|m| m.borrow_mut().push((channel, message)));
}

/// After each of the module's commands has written its reply: the grant messages it
/// deferred go out (see [`publish_grant`]).
pub fn publish_grants(ctx: &Context) {
    if GRANT_MESSAGES.with(|m| m.borrow().is_empty()) {
        return; // most commands
    }
    let messages = GRANT_MESSAGES.with(|m| std::mem::take(&mut *m.borrow_mut()));
    for (channel, message) in &messages {
        store::publish_here(ctx, channel, message);
    }
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
    let record = RedisString::create_from_slice(std::ptr::null_mut(), &args::request_key(key, id));
    // A grant taken back counts as spent too: its id is never granted again.
    if store::record(ctx, &record).is_none() {
        return false;
    }
    with(|q| q.take(db, key));
    true
}

/// A ticket was granted (written already): publish it (with the `reply` as detail where
/// its client needs it to hold), and keep the grant as the ticket's connection's until
/// its client collects it.
fn granted_ticket(
    ctx: &Context,
    db: i32,
    name: &RedisString,
    client: u64,
    waiter: Waiter,
    reply: &Reply,
) {
    let Waiter { request, tag, .. } = waiter;
    stats::bump(|s| &s.tickets_granted);
    let detail = if request.detail_on_grant() {
        ticket::reply_detail(reply)
    } else {
        Vec::new() // no allocation: the lock's path
    };
    publish_grant(ctx, name.as_slice(), &request, tag.as_ref(), &detail);
    if !request.grant_is_written() {
        return;
    }
    if let Some(id) = request.names().1 {
        let record = args::request_key(name.as_slice(), id);
        let untold = Untold {
            db,
            key: Rc::from(name.as_slice()),
            request: request.clone(),
        };
        let window = crate::server::config::request_id_window_ms();
        with(|q| q.granted_ticket(client, &record, untold, ffi::now_ms(), window));
    }
}

/// A request id's first reply was replayed: if it was a ticket's grant, it is collected.
pub fn collected(request_key: &[u8]) {
    with(|q| q.collected(request_key));
}

/// A connection closed: its queued tickets leave their queues, and the grants its tickets
/// were given and never collected are taken back and passed on unless a confirmation
/// comes on another connection within `rlock.ticket-confirm-ms` (design.md 5: the client
/// may already hold on the `granted` message, and confirms again after a broken
/// connection). Runs while the server frees the client: writes wait for a timer.
pub fn on_client_gone(ctx: &Context, client: u64) {
    let (dropped, heads) = with(|q| q.drop_tickets_of(client));
    let grace = crate::server::config::ticket_confirm_ms();
    let orphaned = with(|q| q.orphan_grants_of(client, ffi::now_ms() + grace));
    for (db, key, waiter) in &dropped {
        stats::bump(|s| &s.tickets_dropped);
        stop_deadline(ctx, waiter);
        forget_if_empty(ctx, *db, key);
    }
    for (db, key) in heads {
        schedule_after_loop(ctx, db, &key); // the next head may be grantable now
    }
    if orphaned {
        arm_take_back(ctx, grace);
    }
    if !anyone_waits() {
        events::idle_soon(ctx); // maybe the last grant that kept this event hooked
    }
}

/// Makes sure a key with waiters is looked at again when its lock expires (`pttl` from
/// now; negative means no TTL, so only a release or a keyspace event can free it).
///
/// This is what makes an expired lock with waiters change hands within a few ms of its
/// TTL: Redis's own active expiry samples keys and may take far longer to notice.
pub fn note_expiry(ctx: &Context, db: i32, key: &[u8], pttl: i64) {
    // The flag first: every lock command that sets a lease ends here, and the queues'
    // borrow costs a hundred instructions or so that the common case, nobody waiting
    // anywhere, need not pay (the pipeline's opening has just asked for this key).
    if pttl < 0 || !anyone_waits() || !has_waiters(db, key) {
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
    // A turn left to script-side waiters (turns.rs): the module's own commands wait for
    // its end, when the queue's timer comes back; anything else that brings the key here
    // means a script changed it (took the lock), which ends the turn.
    if let Some(left) = turns::turn_left(db, key_bytes, ffi::now_ms()) {
        if path == Path::Command {
            note_expiry(ctx, db, key_bytes, left);
            return Served::StillHeld;
        }
        turns::end_turn(db, key_bytes);
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
            Check::Grant(write) => {
                // After a script turn: the lock still free means nobody took it.
                turns::settle_turn(db, key_bytes, false);
                write
            }
            Check::Wait { pttl } => {
                turns::settle_turn(db, key_bytes, true);
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
            Who::Ticket(client) => granted_ticket(ctx, db, name, client, waiter, &grant.reply),
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

/// The key's slot left this node (an atomic slot migration done, `events.rs`): its waiters
/// are answered with the redirect to where it went, or, should this node not see the new
/// owner yet, served as after any removal (which redirects them once it does).
pub fn redirect_away(ctx: &Context, db: i32, key: &[u8]) {
    match cluster::route_of(ctx, key) {
        cluster::Route::Redirect(error) => redirect(ctx, db, key, error),
        cluster::Route::Here => schedule(ctx, db, key),
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
            waiter.tag.as_ref(),
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

/// Drops a key's queue once its last waiter left: its timers stop, the key timers armed
/// for it too (nobody waits for what they would bring), and once nobody waits anywhere
/// the module looks at stopping watching.
fn forget_if_empty(ctx: &Context, db: i32, key: &[u8]) {
    let Some(timers) = with(|q| (q.len(db, key) == 0).then(|| q.forget_if_empty(db, key))) else {
        return;
    };
    for timer in timers {
        ffi::stop_timer(ctx, timer.id);
    }
    disarm_key_timers_of(ctx, db, key);
    if !anyone_waits() {
        events::idle_soon(ctx);
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
    if was_head && has_waiters(db, &name) {
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
    settle_now(ctx); // the last waiter may unload the module as soon as it is told
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
pub(super) fn on_queue_timer(ctx: &Context, tag: u64) {
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
                let tag = waiter.tag.as_ref();
                publish_end(ctx, &name, &waiter.request, tag, ticket::End::TimedOut);
            }
            arm_ticket_timer(ctx, db, &name);
            forget_if_empty(ctx, db, &name);
            if head_left {
                serve(ctx, db, &name_rs, Path::Event);
            }
            settle_now(ctx);
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
    for (_, name, waiter) in drained.tickets {
        let tag = waiter.tag.as_ref();
        publish_end(ctx, &name, &waiter.request, tag, ticket::End::Error(error));
    }
    disarm_all_key_timers(ctx);
    events::idle_soon(ctx);
}
