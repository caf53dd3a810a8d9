//! How the module's writes reach replicas and the AOF (design.md 1.4). A child of `ffi`.
//!
//! Every write of the module is replicated through [`replicate`] or [`replicate_argv`],
//! named as the plain command with the same result (HSET, PEXPIREAT with the absolute
//! time, ...). What happens to it depends on `rlock.replication`:
//! - `effects`: each goes out at once, as that plain command (a replica or an AOF reload
//!   needs no module);
//! - `commands` (the default): they are collected while a unit of work runs (a command,
//!   a timer, an event: `server::guard` opens and closes units) and go out when it ends
//!   as **one** command: the plain command itself when there is only one, else one
//!   `RLOCK.APPLY` whose one argument carries them all (`vocab::apply`). The server then
//!   propagates one command, not a MULTI/EXEC of several: under real propagation (a
//!   replica or an AOF) that is most of what a lock command costs. A command whose own
//!   writes follow from its arguments and the key's state goes out as itself instead
//!   ([`as_called`], [`as_called_alone`]), or, where they also follow from the clock, as
//!   itself made deterministic ([`as_rewritten_alone`]: `RLOCK.ACQUIREAT`,
//!   `RRWLOCK.ACQUIREAT`, `RFENCED.ACQUIREAT`).
//!
//! A batch is kept per db (a timer may serve keys of several dbs: each db's writes go out
//! with that db selected) and is sent by the unit that opened it, with that unit's
//! context, so a nested unit (a keyspace event fired by our own write) adds to the
//! enclosing command's batch instead of splitting it.
//!
//! In cluster mode a batch is also kept per hash slot, and `RLOCK.APPLY` and the
//! `*.ACQUIREAT` commands go out with a key of that slot as their first argument
//! (`RLOCK.APPLY <key> <payload>`): a server finds the slot of what it propagates from
//! the command's key, and an atomic slot migration (Valkey 9) streams to the new owner
//! only what names a key of the moving slot; a command without one is dropped from that
//! stream. Outside cluster mode they keep their one argument.

use super::*;

use std::cell::RefCell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering::Relaxed};

use crate::vocab::apply::{self, Word};
use crate::vocab::slot::key_slot;

/// `RedisModule_Replicate` with the command name as a static C string and a format
/// string, without the per-call `CString` and argument `Vec` of redis-module's
/// `Context::replicate`: replication runs on every lock write, so its allocations show
/// up in profiles. Integers go as `l` (long long), so no `RedisString` is built for them
/// in `effects` mode.
#[derive(Clone, Copy)]
pub enum Arg<'a> {
    Str(&'a RedisString),
    Int(i64),
    /// A constant word (an option name such as PXAT).
    Word(&'static CStr),
}

static COMMANDS_MODE: AtomicBool = AtomicBool::new(true);

/// `rlock.replication`: true for `commands`, false for `effects`.
pub fn set_commands_mode(on: bool) {
    COMMANDS_MODE.store(on, Relaxed);
}

pub fn commands_mode() -> bool {
    COMMANDS_MODE.load(Relaxed)
}

static CLUSTER_MODE: AtomicBool = AtomicBool::new(false);

/// Whether the server runs in cluster mode (set at load: it cannot change while running).
/// Batches are then kept per slot and name their key (see the top of file).
pub fn set_cluster_mode(on: bool) {
    CLUSTER_MODE.store(on, Relaxed);
}

pub(super) fn cluster_mode() -> bool {
    CLUSTER_MODE.load(Relaxed)
}

/// `rlock.replication-gate` (see *Whether anything can receive what is replicated*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatePolicy {
    /// Skip where watching costs other commands nothing (Redis 7.0).
    Auto = 0,
    /// Skip wherever nothing can receive the writes.
    Yes = 1,
    /// Never skip.
    No = 2,
}

static GATE_POLICY: AtomicU8 = AtomicU8::new(GatePolicy::Auto as u8);

pub fn set_gate_policy(p: GatePolicy) {
    GATE_POLICY.store(p as u8, Relaxed);
}

pub fn gate_policy() -> GatePolicy {
    match GATE_POLICY.load(Relaxed) {
        1 => GatePolicy::Yes,
        2 => GatePolicy::No,
        _ => GatePolicy::Auto,
    }
}

/// The writes of the running unit of work not yet replicated.
struct Batch {
    /// The depth of the unit that opened the batch: it sends it when it ends.
    owner: u32,
    ctx: *mut raw::RedisModuleCtx,
    db: i32,
    /// The commands, as `RLOCK.APPLY`'s payload (`vocab::apply`).
    payload: Vec<u8>,
    /// The first command, kept as given (its strings retained) and written into `payload`
    /// only when a second one comes: sent alone, it costs what it costs in `effects` mode.
    first: Option<&'static CStr>,
    first_args: Vec<Held>,
    commands: usize,
    /// How many of the commands the running command's own writes are, when they follow
    /// from its arguments and the key's state alone (see [`as_called`]); 0 otherwise.
    as_called: usize,
    /// While the own writes of a command that writes nothing else run
    /// ([`as_called_alone`]): they are counted in `unrecorded`, not recorded.
    skip_own: bool,
    /// Own writes counted and not recorded: the command itself stands for them.
    unrecorded: usize,
    /// What goes out for them when it is not the command as it was called (see
    /// [`as_rewritten_alone`]).
    stand_in: Option<StandIn>,
    /// While the one write of a command that writes nothing else runs ([`direct`]): it
    /// goes out at once, not through the batch.
    direct: bool,
    /// In cluster mode, the key of the batch's first command and its slot: every command
    /// of the batch names a key of that slot, and the batch goes out with this key.
    route: Vec<u8>,
    route_slot: u16,
}

/// An argument as it goes to `RedisModule_Replicate`: a string (in the batch, one we hold
/// a reference to), an integer, or a constant word.
#[derive(Clone, Copy)]
enum Held {
    Str(*mut raw::RedisModuleString),
    Int(i64),
    Word(&'static CStr),
}

thread_local! {
    // Redis calls modules on its main thread only; the batch never crosses threads.
    static BATCH: RefCell<Batch> = const {
        RefCell::new(Batch {
            owner: 0,
            ctx: ptr::null_mut(),
            db: 0,
            payload: Vec::new(),
            first: None,
            first_args: Vec::new(),
            commands: 0,
            as_called: 0,
            skip_own: false,
            unrecorded: 0,
            stand_in: None,
            direct: false,
            route: Vec::new(),
            route_slot: 0,
        })
    };
}

/// Units of work entered and not left (nesting: an event inside a command). A static, not
/// a field of the batch: the module's thread-locals cost a call each (`__tls_get_addr`,
/// in a library loaded at run time), and this is read on every write.
static DEPTH: AtomicU32 = AtomicU32::new(0);

fn depth() -> u32 {
    DEPTH.load(Relaxed)
}

/// A unit of work starts (see `server::guard`).
pub fn unit_enter() {
    DEPTH.store(depth() + 1, Relaxed);
}

/// A unit of work ends: if it opened the batch, the batch goes out now, as one command.
pub fn unit_leave() {
    let depth = depth();
    DEPTH.store(depth.saturating_sub(1), Relaxed);
    BATCH.with(|b| {
        let mut b = b.borrow_mut();
        if b.commands > 0 && b.owner == depth {
            send(&mut b);
        }
        if depth <= 1 {
            SILENT.store(false, Relaxed); // also after a panic inside the writes
            b.as_called = 0; // a spoiled mark with nothing sent ends with its command
            b.skip_own = false;
            b.unrecorded = 0;
            b.stand_in = None;
            b.direct = false;
        }
    });
}

/// True when a write joins the running unit's batch (see [`direct`] for the exception).
fn batching() -> bool {
    let depth = depth();
    commands_mode() && depth > 0 && !(depth == 1 && BATCH.with(|b| b.borrow().direct))
}

/// Runs `write`, the running command's only write, when its plan says nothing follows it
/// (no grant, no message, no request-id record) and it cannot go out as the command
/// itself (a renewed lease carries the time): it goes out at once as its plain command,
/// as `effects` mode sends it, without being held in the batch and released after
/// (about 250 instructions). Should anything be written after it after all, that goes
/// out when the unit ends, after it, in the order it ran.
pub fn direct<R>(write: impl FnOnce() -> R) -> R {
    with_fresh_flag(|b| &mut b.direct, write)
}

/// Runs `write` with one of the batch's flags set, if the running command has replicated
/// nothing yet (else the flag would not say the truth about its writes).
fn with_fresh_flag<R>(flag: fn(&mut Batch) -> &mut bool, write: impl FnOnce() -> R) -> R {
    if !fresh() {
        return write();
    }
    BATCH.with(|b| *flag(&mut b.borrow_mut()) = true);
    let r = write();
    BATCH.with(|b| *flag(&mut b.borrow_mut()) = false);
    r
}

/// Runs `write`, the running command's own writes, when they follow from its arguments
/// and the key's state alone (no clock, no other client's request): if they turn out to
/// be all the command replicates, it goes out as it was called
/// (`RedisModule_ReplicateVerbatim`: no command lookup, no argument built), the first
/// form of design.md 1.4; a replica or an AOF reload runs the same command on the same state.
/// Writes before them (the queue served first) or after them (a grant, a message, a
/// request-id record) make the batch go out as usual.
pub fn as_called<R>(write: impl FnOnce() -> R) -> R {
    let fresh = fresh();
    let r = write();
    if fresh {
        BATCH.with(|b| {
            let mut b = b.borrow_mut();
            if b.as_called == 0 {
                b.as_called = b.commands;
            }
        });
    }
    r
}

/// [`as_called`] for a command whose plan says it writes, publishes and records nothing
/// after `write` (no grant, no message, no request-id record): its own writes are
/// counted, not recorded, since the command itself will stand for them (no argument
/// held, none released).
pub fn as_called_alone<R>(write: impl FnOnce() -> R) -> R {
    with_fresh_flag(|b| &mut b.skip_own, write)
}

/// [`as_called_alone`] for own writes that carry a time, so the command as it was called
/// would not repeat them (a new lock's or a re-entry's lease end, computed from this
/// server's clock): they are counted, not recorded, and `cmd` goes out for them with
/// `words` as its one argument, a RESP array (`vocab::apply::push_words`): the command
/// made deterministic, design.md 1.4's first form (`RLOCK.ACQUIREAT` with the key, the owner
/// and the lease's absolute end). One argument, not one per word: the server frames,
/// copies and writes out each argument of a propagated command (with the AOF on, three
/// cost more than this payload). Recording the writes would send an `RLOCK.APPLY` of two
/// commands, twice as long and costlier to build.
pub fn as_rewritten_alone<R>(
    ctx: &Context,
    cmd: &'static CStr,
    words: &[Word],
    write: impl FnOnce() -> R,
) -> R {
    if !fresh() || !propagating(ctx) {
        return write();
    }
    // The writes are not even recorded: [`replicate`] only counts them, at its first line
    // (the gate was asked above, once).
    SILENT.store(true, Relaxed);
    SILENT_WRITES.store(0, Relaxed);
    let r = write();
    SILENT.store(false, Relaxed);
    if SILENT_WRITES.load(Relaxed) > 0 {
        BATCH.with(|b| {
            let mut b = b.borrow_mut();
            b.ctx = ctx.ctx;
            b.db = selected_db(ctx);
            b.owner = 1;
            b.commands = 1;
            b.unrecorded = 1;
            b.as_called = 1;
            if cluster_mode() {
                // The words start with the key (the stand-ins' layouts).
                if let Some(Word::Bytes(key)) = words.first() {
                    set_route(&mut b, key);
                }
            }
            // Fresh: the payload is empty; the stand-in's argument is its start.
            apply::push_words(&mut b.payload, words.iter().copied());
            b.stand_in = Some(StandIn {
                cmd,
                len: b.payload.len(),
            });
        });
    }
    r
}

/// The command that goes out for a command's own writes (see [`as_rewritten_alone`]):
/// its name, and its one argument, the first `len` bytes of the batch's payload.
#[derive(Clone, Copy)]
struct StandIn {
    cmd: &'static CStr,
    len: usize,
}

/// Set while the own writes of [`as_rewritten_alone`] run, at the command's own depth
/// (1): a nested unit's writes (an event fired by them) are replicated as usual, and would
/// go out before the stand-in, which is queued once the writes are done. None happen
/// today: the lock's own notifications are marked as its own (`tracking::OwnWrite`) and
/// start nothing in the module.
static SILENT: AtomicBool = AtomicBool::new(false);
/// How many writes [`SILENT`] swallowed.
static SILENT_WRITES: AtomicU32 = AtomicU32::new(0);

/// True (and counted) for a write that a stand-in will replicate.
fn silenced() -> bool {
    if SILENT.load(Relaxed) && depth() == 1 {
        SILENT_WRITES.store(SILENT_WRITES.load(Relaxed) + 1, Relaxed);
        return true;
    }
    false
}

/// Nothing replicated yet by the running command, outside any nested unit: its next
/// writes may be all it replicates.
fn fresh() -> bool {
    commands_mode()
        && depth() == 1
        && BATCH.with(|b| {
            let b = b.borrow();
            !b.direct && b.commands == 0 && b.as_called == 0
        })
}

/// The running command did something a second run would repeat without the batch
/// showing it (a message published): it goes out as usual, never as itself.
pub fn not_as_called() {
    if batching() {
        BATCH.with(|b| {
            let mut b = b.borrow_mut();
            debug_assert!(b.unrecorded == 0, "a command said alone published");
            b.as_called = usize::MAX;
        });
    }
}

// ---- Whether anything can receive what is replicated ----
//
// A server propagates a write only to an AOF or to a replication backlog (which exists
// once a replica has synced, or while the server is or was a replica); with neither, it
// drops what a module replicates, after paying for building it (a command lookup, an
// argv: a third of an uncontended RLOCK.ACQUIRE). The module skips that work until
// propagation becomes possible, and from then on never skips again. Writes skipped before
// then are in the dataset, which is what an AOF rewrite and a full sync start from.
//
// The gate asks the server at the first write it would skip, then watches:
// - **asking** (`propagation_possible_now`): an AOF, a master, or a backlog (INFO
//   replication). Asked then and not at load: a master restarted from an RDB that
//   carries its replication id makes its backlog while it loads its data, after the
//   modules, and its replicas continue from that backlog without a fork;
// - **watching**, from that answer on, for either of:
//   - a fork (a replica's first sync, an AOF turned on: the backlog before the fork
//     holds nothing a replica needs, the snapshot carries every earlier write). The
//     process's fork handler (`pthread_atfork`, registered at load) notes it, which
//     costs the server nothing between forks. A server event listener would: Redis 8.2
//     and Valkey walk every module listener on each key deleted or overwritten (about
//     40 instructions each). glibc drops the handler when the library is unloaded;
//   - a master link coming up (the server turned replica: its backlog serves its own
//     replicas, and its old master after a failover), the one server event listened to.
//   Either opens the gate for good; the next write drops the listener (or a 0-ms timer,
//   from inside the server's walk over its listeners).
// A server on which no lock was ever written listens to nothing. One that has skipped a
// write keeps the one listener until the gate opens (README, *Replication*, on why it
// stays while the writes pause).
//
// That listener is not free everywhere: Redis 7.2+ and Valkey call every module's
// listeners, whatever their event, on each key deleted or overwritten (about 30
// instructions, +1.1-1.3 % on a DEL), and nothing else tells a module that its server
// turned replica. So the gate skips only where its policy allows (`rlock.replication-gate`):
// `auto` (the default) where watching costs other commands nothing (Redis 7.0, no key
// event), `yes` everywhere (a server with neither an AOF nor a replica then runs lock
// commands about a third cheaper, and pays the listener on every DEL while it skips),
// `no` nowhere. Where it may not skip, every write is built and replicated, as the gate
// open; a change of policy takes effect at the next write (a listener it leaves is
// dropped then), and a gate opened by what it watched for stays open.

static MAY_PROPAGATE: AtomicBool = AtomicBool::new(false);
/// Set while the gate watches (see above): a fork then opens it.
static FORK_OPENS: AtomicBool = AtomicBool::new(false);
/// A fork came while the gate watched; the next write opens the gate.
static FORKED: AtomicBool = AtomicBool::new(false);
/// The fork handler is registered (once per loaded copy of the library: a copy that
/// stays mapped after MODULE UNLOAD keeps both it and this flag).
static FORK_HANDLER: AtomicBool = AtomicBool::new(false);

extern "C" {
    // glibc's (libc_nonshared's) version registers the handler under this library's
    // `__dso_handle`, and `dlclose` unregisters it before the code is unmapped.
    fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> c_int;
}

/// In the server after each fork (any: a save, a rewrite, a replica's sync), on the
/// thread that forked. Only flags: no server API is called here.
extern "C" fn after_fork_in_parent() {
    if FORK_OPENS.load(Relaxed) {
        FORKED.store(true, Relaxed);
    }
}

/// Registers the fork handler (from init). Without it, a gate that would have to watch
/// opens instead.
pub fn watch_forks() {
    FORK_OPENS.store(false, Relaxed);
    FORKED.store(false, Relaxed);
    MAY_PROPAGATE.store(false, Relaxed);
    if !FORK_HANDLER.load(Relaxed) {
        let ok = unsafe { pthread_atfork(None, Some(after_fork_in_parent), None) } == 0;
        FORK_HANDLER.store(ok, Relaxed);
    }
}

/// From now on every write is replicated (see above).
pub fn note_may_propagate() {
    MAY_PROPAGATE.store(true, Relaxed);
    FORK_OPENS.store(false, Relaxed);
}

/// True when a write must be replicated; false when the server would drop it (see above).
fn propagating(ctx: &Context) -> bool {
    if MAY_PROPAGATE.load(Relaxed) {
        return true;
    }
    if !may_skip() {
        if watching_propagation() {
            unwatch(ctx.ctx);
        }
        return true;
    }
    if FORKED.load(Relaxed) {
        open_and_unwatch(ctx.ctx);
        return true;
    }
    if watching_propagation() {
        return false;
    }
    if propagation_possible_now(ctx) || !start_watching(ctx) {
        note_may_propagate();
        return true;
    }
    false
}

/// True where the policy lets the gate skip writes (see above).
fn may_skip() -> bool {
    match gate_policy() {
        GatePolicy::Yes => true,
        GatePolicy::No => false,
        GatePolicy::Auto => !key_event_available(),
    }
}

/// Opens the gate and drops the master-link listener (see [`unwatch`]).
fn open_and_unwatch(ctx: *mut raw::RedisModuleCtx) {
    note_may_propagate();
    unwatch(ctx);
}

/// Drops the master-link listener: now, or from a 0-ms timer when the server is walking
/// its listeners (inside an event callback of ours).
fn unwatch(ctx: *mut raw::RedisModuleCtx) {
    FORK_OPENS.store(false, Relaxed);
    if !in_event() {
        unhook(&Context::new(ctx), Hook::MasterLink);
        return;
    }
    if UNWATCH_PENDING.swap(true, Relaxed) {
        return;
    }
    unsafe {
        if let Some(create) = raw::RedisModule_CreateTimer {
            create(ctx, 0, Some(unwatch_cb), ptr::null_mut());
        }
    }
}

/// A 0-ms timer will drop the listener: the writes before it need not arm another.
static UNWATCH_PENDING: AtomicBool = AtomicBool::new(false);

/// A master link came up or went down: propagation is possible (see above).
pub(super) extern "C" fn propagation_possible_cb(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    if MAY_PROPAGATE.load(Relaxed) {
        return;
    }
    let _in_event = InEvent::enter();
    open_and_unwatch(ctx);
}

extern "C" fn unwatch_cb(ctx: *mut raw::RedisModuleCtx, _data: *mut c_void) {
    UNWATCH_PENDING.store(false, Relaxed);
    unhook(&Context::new(ctx), Hook::MasterLink);
}

/// Starts watching for a fork or a master link. False if the fork handler is missing or
/// the server refused the listener (then every write is replicated).
fn start_watching(ctx: &Context) -> bool {
    if !FORK_HANDLER.load(Relaxed) || !hook(ctx, Hook::MasterLink) {
        return false;
    }
    FORK_OPENS.store(true, Relaxed);
    true
}

/// True while the module listens for propagation becoming possible (INFO, tests).
pub fn watching_propagation() -> bool {
    hooked(Hook::MasterLink)
}

/// True once every write is replicated (INFO, tests): the gate opened, or its policy
/// lets it skip nothing on this server.
pub fn propagation_open() -> bool {
    MAY_PROPAGATE.load(Relaxed) || FORKED.load(Relaxed) || !may_skip()
}

/// An AOF, a master (the server is a replica), or a backlog (it has had replicas, or
/// been one, or was restarted with its replication id).
fn propagation_possible_now(ctx: &Context) -> bool {
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx.ctx) } as u32;
    flags & (raw::REDISMODULE_CTX_FLAGS_AOF | raw::REDISMODULE_CTX_FLAGS_SLAVE) != 0
        || backlog_active(ctx)
}

/// INFO replication's `repl_backlog_active`: about 140 000 instructions, hence asked
/// once. Unknown counts as active.
fn backlog_active(ctx: &Context) -> bool {
    unsafe {
        let (Some(get), Some(field), Some(free)) = (
            raw::RedisModule_GetServerInfo,
            raw::RedisModule_ServerInfoGetFieldSigned,
            raw::RedisModule_FreeServerInfo,
        ) else {
            return true;
        };
        let info = get(ctx.ctx, c"replication".as_ptr());
        if info.is_null() {
            return true;
        }
        let mut err: c_int = 0;
        let active = field(info, c"repl_backlog_active".as_ptr(), &mut err);
        free(ctx.ctx, info);
        err != 0 || active != 0
    }
}

fn create(bytes: &[u8]) -> *mut raw::RedisModuleString {
    unsafe {
        raw::RedisModule_CreateString.unwrap()(
            ptr::null_mut(),
            bytes.as_ptr().cast::<c_char>(),
            bytes.len(),
        )
    }
}

fn create_long(n: i64) -> *mut raw::RedisModuleString {
    unsafe { raw::RedisModule_CreateStringFromLongLong.unwrap()(ptr::null_mut(), n) }
}

/// The key a batch goes out with in cluster mode (see the top of file).
fn set_route(b: &mut Batch, key: &[u8]) {
    b.route.clear();
    b.route.extend_from_slice(key);
    b.route_slot = key_slot(key);
}

/// The key a command writes (its first argument, in every shape the module replicates).
fn key_of<'a>(args: &'a [Arg]) -> Option<&'a [u8]> {
    match args.first()? {
        Arg::Str(s) => Some(s.as_slice()),
        Arg::Word(w) => Some(w.to_bytes()),
        Arg::Int(_) => None,
    }
}

/// Adds one command to the batch.
fn record(ctx: &Context, cmd: &'static CStr, args: &[Arg]) {
    BATCH.with(|b| {
        let mut b = b.borrow_mut();
        let b = &mut *b;
        let key = if cluster_mode() { key_of(args) } else { None };
        if let Some(key) = key {
            if b.commands > 0 && key_slot(key) != b.route_slot {
                send(b); // another slot: the batch so far goes out first, in order
            }
            if b.commands == 0 {
                set_route(b, key);
            }
        }
        if b.skip_own && depth() == 1 {
            // The command's own writes, all in its db: asked once, at the first.
            if b.commands == 0 {
                b.ctx = ctx.ctx;
                b.db = selected_db(ctx);
                b.owner = depth();
            }
            b.commands += 1;
            b.unrecorded += 1;
            b.as_called = b.commands;
            return;
        }
        let db = selected_db(ctx);
        if b.commands > 0 && b.db != db {
            send(b);
        }
        debug_assert!(b.unrecorded == 0, "a command said alone wrote more");
        match b.commands - b.unrecorded {
            0 => {
                b.ctx = ctx.ctx;
                b.db = db;
                b.owner = depth();
                b.first = Some(cmd);
                b.first_args.extend(args.iter().map(|arg| match arg {
                    Arg::Str(s) => Held::Str(retain(s)),
                    Arg::Int(n) => Held::Int(*n),
                    Arg::Word(w) => Held::Word(w),
                }));
            }
            n => {
                if n == 1 {
                    write_first(b);
                }
                let words = args.iter().map(|arg| match arg {
                    Arg::Str(s) => Word::Bytes(s.as_slice()),
                    Arg::Int(n) => Word::Int(*n),
                    Arg::Word(w) => Word::Bytes(w.to_bytes()),
                });
                apply::push_command(&mut b.payload, cmd.to_bytes(), words);
            }
        }
        b.commands += 1;
    });
}

fn retain(s: &RedisString) -> *mut raw::RedisModuleString {
    unsafe { raw::RedisModule_RetainString.unwrap()(ptr::null_mut(), s.inner) };
    s.inner
}

fn free(s: *mut raw::RedisModuleString) {
    unsafe { raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), s) };
}

/// The most payload capacity kept from one batch to the next, in bytes.
const PAYLOAD_KEPT: usize = 4096;

/// Writes the held first command into the payload (a second command came) and lets go
/// of its strings.
fn write_first(b: &mut Batch) {
    let Some(name) = b.first else { return };
    let words = b.first_args.iter().map(|held| match *held {
        Held::Str(s) => Word::Bytes(string_bytes(s)),
        Held::Int(n) => Word::Int(n),
        Held::Word(w) => Word::Bytes(w.to_bytes()),
    });
    apply::push_command(&mut b.payload, name.to_bytes(), words);
    release_first(b);
}

fn release_first(b: &mut Batch) {
    for held in b.first_args.drain(..) {
        if let Held::Str(s) = held {
            free(s);
        }
    }
}

/// Replicates the batch as one command, with its db selected, and empties it: the plain
/// command when there is one, else `RLOCK.APPLY` with the payload as its one argument.
fn send(b: &mut Batch) {
    let ctx = b.ctx;
    unsafe {
        let selected = raw::RedisModule_GetSelectedDb.unwrap()(ctx);
        if selected != b.db {
            raw::RedisModule_SelectDb.unwrap()(ctx, b.db);
        }
        let replicate = raw::RedisModule_Replicate;
        if replicate.is_some() {
            // The command itself for its own writes that were not recorded (they came
            // first); then what was recorded after them, if anything (a bug: see
            // `as_called_alone`), which still replays in the order it ran.
            let recorded = b.commands - b.unrecorded;
            if b.unrecorded > 0 {
                match b.stand_in.take() {
                    Some(s) => {
                        replicate_payload(ctx, s.cmd, &b.route, &b.payload[..s.len]);
                        b.payload.drain(..s.len);
                    }
                    None => {
                        if let Some(verbatim) = raw::RedisModule_ReplicateVerbatim {
                            verbatim(ctx);
                        }
                    }
                }
            }
            match (b.first, recorded) {
                (_, 0) => {}
                (_, n) if b.unrecorded == 0 && n == b.as_called => {
                    if let Some(verbatim) = raw::RedisModule_ReplicateVerbatim {
                        verbatim(ctx);
                    }
                }
                (Some(name), 1) => replicate_now(ctx, name, &b.first_args),
                _ => replicate_payload(ctx, c"RLOCK.APPLY", &b.route, &b.payload),
            }
        }
        if selected != b.db {
            raw::RedisModule_SelectDb.unwrap()(ctx, selected);
        }
    }
    b.payload.clear();
    // Kept for the next batch at a lock command's usual size; a batch that carried large
    // values (a long owner, a big grant) does not hold that memory for good.
    b.payload.shrink_to(PAYLOAD_KEPT);
    release_first(b);
    b.first = None;
    b.commands = 0;
    b.as_called = 0;
    b.unrecorded = 0;
    b.stand_in = None;
    b.owner = 0;
    b.route.clear();
}

/// Replicates `cmd` with its one payload argument, preceded in cluster mode by the key it
/// routes by (see the top of file).
fn replicate_payload(ctx: *mut raw::RedisModuleCtx, cmd: &CStr, route: &[u8], payload: &[u8]) {
    let Some(f) = (unsafe { raw::RedisModule_Replicate }) else {
        return;
    };
    let p = payload.as_ptr().cast::<c_char>();
    unsafe {
        if cluster_mode() && !route.is_empty() {
            let r = route.as_ptr().cast::<c_char>();
            f(
                ctx,
                cmd.as_ptr(),
                c"bb".as_ptr(),
                r,
                route.len(),
                p,
                payload.len(),
            );
        } else {
            f(ctx, cmd.as_ptr(), c"b".as_ptr(), p, payload.len());
        }
    }
}

/// Replicates `cmd` with `args`: at once in `effects` mode, else into the unit's batch.
pub fn replicate(ctx: &Context, cmd: &'static CStr, args: &[Arg]) {
    if silenced() || !propagating(ctx) {
        return;
    }
    if batching() {
        record(ctx, cmd, args);
        return;
    }
    // The shapes the lock writes have at most four arguments: no vector on its hot path.
    let mut held = [Held::Int(0); 4];
    if args.len() > held.len() {
        let held: Vec<Held> = args.iter().map(as_held).collect();
        replicate_now(ctx.ctx, cmd, &held);
        return;
    }
    for (slot, arg) in held.iter_mut().zip(args) {
        *slot = as_held(arg);
    }
    replicate_now(ctx.ctx, cmd, &held[..args.len()]);
}

/// An argument as it is passed on at once (`effects` mode): the caller's string itself.
fn as_held(arg: &Arg) -> Held {
    match arg {
        Arg::Str(s) => Held::Str(s.inner),
        Arg::Int(n) => Held::Int(*n),
        Arg::Word(w) => Held::Word(w),
    }
}

/// Replicates one plain command now, written once for both modes (`effects`, and a
/// `commands` batch of one). The shapes the module writes go as a format string and its
/// values: no argument vector to build, no string made for an integer. Any other shape
/// goes as a vector.
fn replicate_now(ctx: *mut raw::RedisModuleCtx, cmd: &CStr, args: &[Held]) {
    use std::ffi::c_longlong as L;
    let Some(f) = (unsafe { raw::RedisModule_Replicate }) else {
        return;
    };
    let n = cmd.as_ptr();
    unsafe {
        match *args {
            [Held::Str(a)] => f(ctx, n, c"s".as_ptr(), a),
            [Held::Str(a), Held::Str(b)] => f(ctx, n, c"ss".as_ptr(), a, b),
            [Held::Str(a), Held::Int(i)] => f(ctx, n, c"sl".as_ptr(), a, i as L),
            [Held::Str(a), Held::Str(b), Held::Int(i)] => f(ctx, n, c"ssl".as_ptr(), a, b, i as L),
            [Held::Str(a), Held::Str(b), Held::Word(w), Held::Int(i)] => {
                f(ctx, n, c"sscl".as_ptr(), a, b, w.as_ptr(), i as L)
            }
            _ => {
                let mut argv: Vec<*mut raw::RedisModuleString> = args
                    .iter()
                    .map(|held| match *held {
                        Held::Str(s) => {
                            raw::RedisModule_RetainString.unwrap()(ptr::null_mut(), s);
                            s
                        }
                        Held::Int(i) => create_long(i),
                        Held::Word(w) => create(w.to_bytes()),
                    })
                    .collect();
                let r = f(ctx, n, c"v".as_ptr(), argv.as_mut_ptr(), argv.len());
                argv.into_iter().for_each(free);
                r
            }
        };
    }
}

/// [`replicate`] with any number of string arguments (the effects of the other
/// primitives: ZADD with many members, ...). The fixed shapes of [`replicate`] stay for
/// the lock's hot path, which they keep free of a vector.
pub fn replicate_argv(ctx: &Context, cmd: &'static CStr, args: &[&RedisString]) {
    if silenced() || !propagating(ctx) {
        return;
    }
    if batching() {
        // The usual few from a buffer on the stack, not a vector per write.
        const INLINE: usize = 8;
        if args.len() <= INLINE {
            let mut buf = [Arg::Int(0); INLINE];
            for (slot, s) in buf.iter_mut().zip(args) {
                *slot = Arg::Str(s);
            }
            record(ctx, cmd, &buf[..args.len()]);
        } else {
            let args: Vec<Arg> = args.iter().map(|s| Arg::Str(s)).collect();
            record(ctx, cmd, &args);
        }
        return;
    }
    let Some(f) = (unsafe { raw::RedisModule_Replicate }) else {
        return;
    };
    let mut argv: Vec<*mut raw::RedisModuleString> = args.iter().map(|a| a.inner).collect();
    unsafe {
        f(
            ctx.ctx,
            cmd.as_ptr(),
            c"v".as_ptr(),
            argv.as_mut_ptr(),
            argv.len(),
        );
    }
}

/// Runs the plain command `words[0]` with the arguments `words[1..]` as a nested call,
/// not replicated by itself (`RLOCK.APPLY` on a replica or an AOF reload, which
/// replicates itself verbatim). It fires its keyspace notifications and signals WATCH as
/// the command does. An error reply is returned as its text.
pub fn call_plain(ctx: &Context, words: &[&[u8]]) -> Result<(), String> {
    let (name, args) = words
        .split_first()
        .ok_or_else(|| "empty command".to_string())?;
    let name = std::ffi::CString::new(*name).map_err(|_| "bad command name")?;
    let mut args: Vec<*mut raw::RedisModuleString> = args.iter().map(|a| create(a)).collect();
    let result = unsafe {
        let reply = raw::RedisModule_Call.unwrap()(
            ctx.ctx,
            name.as_ptr(),
            c"v".as_ptr(),
            args.as_mut_ptr(),
            args.len(),
        );
        if reply.is_null() {
            Err(format!("{} failed", name.to_string_lossy()))
        } else {
            let failed = raw::RedisModule_CallReplyType.unwrap()(reply)
                == raw::REDISMODULE_REPLY_ERROR as c_int;
            let text = failed.then(|| {
                let mut len = 0usize;
                let p = raw::RedisModule_CallReplyStringPtr.unwrap()(reply, &mut len);
                if p.is_null() {
                    String::new()
                } else {
                    String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len))
                        .into_owned()
                }
            });
            raw::RedisModule_FreeCallReply.unwrap()(reply);
            text.map_or(Ok(()), Err)
        }
    };
    for s in args {
        unsafe { raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), s) };
    }
    result
}

/// Replicates the running command as it was called (`RLOCK.APPLY` on a replica: its own
/// AOF gets it as the primary sent it).
pub fn replicate_verbatim(ctx: &Context) {
    unsafe {
        if let Some(f) = raw::RedisModule_ReplicateVerbatim {
            f(ctx.ctx);
        }
    }
}
