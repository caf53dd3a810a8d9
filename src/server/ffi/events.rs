//! Noticing removed keys (keyspace events, or the key server event on 7.2+) and
//! post-notification jobs (Redis 7.2+, Valkey), and the server events the module listens
//! to only while it watches (subscribed and dropped at run time). A child of `ffi`.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8};

use super::*;

// ---------------------------------------------------------------------------------------
// Noticing removed keys: keyspace events (every server) or the key server event (7.2+)

/// How a key left (or was replaced), as the key server event reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    Deleted,
    Expired,
    Evicted,
    Overwritten,
}

/// How deep the module is inside the server's event callbacks (keyspace or server events;
/// main thread only). No subscription may be dropped there: the server goes on using the
/// listener list it is walking.
static IN_EVENT: AtomicU32 = AtomicU32::new(0);

/// True while a server or keyspace event's callback of the module runs.
pub fn in_event() -> bool {
    IN_EVENT.load(Relaxed) != 0
}

/// Marks an event callback for its lifetime (see [`in_event`]).
pub(super) struct InEvent(());

impl InEvent {
    pub(super) fn enter() -> InEvent {
        IN_EVENT.fetch_add(1, Relaxed);
        InEvent(())
    }
}

impl Drop for InEvent {
    fn drop(&mut self) {
        IN_EVENT.fetch_sub(1, Relaxed);
    }
}

/// Called with the db, how the key left, and the key's name.
pub type KeyHandler = fn(&Context, i32, Removal, &[u8]);

/// What the removal callbacks call: `watching` is asked first by the keyspace callback,
/// `anyone_waits` lets strings through the key server event, `f` gets the key.
struct KeyHandlers {
    watching: fn() -> bool,
    anyone_waits: fn() -> bool,
    f: KeyHandler,
}

static KEY_HANDLERS: OnceLock<KeyHandlers> = OnceLock::new();

/// Installs the removal handlers (once, from init). Subscribing is separate
/// ([`hook`] with [`Hook::Key`], or [`subscribe_keyspace`]): the module listens only while
/// it has a reason to (design.md 1: it holds nothing while nobody waits).
pub fn set_key_handlers(watching: fn() -> bool, anyone_waits: fn() -> bool, f: KeyHandler) {
    let _ = KEY_HANDLERS.set(KeyHandlers {
        watching,
        anyone_waits,
        f,
    });
}

extern "C" fn keyspace_cb(
    ctx: *mut raw::RedisModuleCtx,
    class: c_int,
    _event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if let Some(h) = KEY_HANDLERS.get() {
        if !(h.watching)() {
            return raw::REDISMODULE_OK as c_int;
        }
        let _in = InEvent::enter();
        let context = Context::new(ctx);
        let removal = if class & raw::REDISMODULE_NOTIFY_EXPIRED != 0 {
            Removal::Expired
        } else if class & raw::REDISMODULE_NOTIFY_EVICTED != 0 {
            Removal::Evicted
        } else {
            Removal::Deleted
        };
        let db = selected_db(&context);
        (h.f)(&context, db, removal, string_bytes(key));
    }
    raw::REDISMODULE_OK as c_int
}

/// The keyspace event classes that can remove, replace or spoil a lock hash: generic (DEL,
/// UNLINK, RENAME, MOVE, COPY, RESTORE), string (SET, BITOP), set and zset (the *STORE
/// commands), hash (a field written that is no hold count), expired, evicted. Not list or
/// stream: no command of theirs touches a hash (SORT ... STORE replaces one, and is
/// noticed lazily, see engine/events.rs).
const KEYSPACE_CLASSES: c_int = (raw::REDISMODULE_NOTIFY_GENERIC
    | raw::REDISMODULE_NOTIFY_STRING
    | raw::REDISMODULE_NOTIFY_SET
    | raw::REDISMODULE_NOTIFY_ZSET
    | raw::REDISMODULE_NOTIFY_HASH
    | raw::REDISMODULE_NOTIFY_EXPIRED
    | raw::REDISMODULE_NOTIFY_EVICTED) as c_int;

/// Whether the module's keyspace subscription is in place (main thread only). A second
/// subscription would add a second listener: the callback would run twice per event.
static KEYSPACE_ON: AtomicBool = AtomicBool::new(false);

/// Subscribes the removal handler to `KEYSPACE_CLASSES` (Redis 7.0, which has no key
/// server event), unless already subscribed. `watching` is asked first on every event,
/// before the key's name is read: false turns the event away.
pub fn subscribe_keyspace(ctx: &Context) {
    if KEYSPACE_ON.load(Relaxed) {
        return;
    }
    let Some(subscribe) = (unsafe { raw::RedisModule_SubscribeToKeyspaceEvents }) else {
        return;
    };
    if unsafe { subscribe(ctx.ctx, KEYSPACE_CLASSES, Some(keyspace_cb)) }
        == raw::REDISMODULE_OK as c_int
    {
        KEYSPACE_ON.store(true, Relaxed);
    }
}

/// Drops the keyspace subscription where the server can (`UnsubscribeFromKeyspaceEvents`,
/// Redis 8.2; not Redis 7.0 nor Valkey 9.1). True when the module is no longer subscribed;
/// false when it must stay (the callback then turns events away at its first check).
/// Never call it from inside the keyspace callback.
pub fn unsubscribe_keyspace(ctx: &Context) -> bool {
    if !KEYSPACE_ON.load(Relaxed) {
        return true;
    }
    let Some(unsubscribe) = (unsafe { raw::RedisModule_UnsubscribeFromKeyspaceEvents }) else {
        return false;
    };
    if unsafe { unsubscribe(ctx.ctx, KEYSPACE_CLASSES, Some(keyspace_cb)) }
        == raw::REDISMODULE_OK as c_int
    {
        KEYSPACE_ON.store(false, Relaxed);
    }
    !KEYSPACE_ON.load(Relaxed)
}

/// True while the keyspace subscription is in place (INFO, tests).
pub fn keyspace_subscribed() -> bool {
    KEYSPACE_ON.load(Relaxed)
}

extern "C" fn key_event_cb(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    let Some(h) = KEY_HANDLERS.get() else {
        return;
    };
    let info = unsafe { &*data.cast::<raw::RedisModuleKeyInfo>() };
    // Only a hash can be a lock, and only a string a semaphore or latch (which matter only
    // with waiters): everything else is turned away here, before the key's name is even
    // looked at. (For an overwrite this is the old value's type.)
    match unsafe { raw::RedisModule_KeyType.unwrap()(info.key) } as isize {
        raw::REDISMODULE_KEYTYPE_HASH => {}
        raw::REDISMODULE_KEYTYPE_STRING if (h.anyone_waits)() => {}
        _ => return,
    }
    let removal = match subevent {
        raw::REDISMODULE_SUBEVENT_KEY_EXPIRED => Removal::Expired,
        raw::REDISMODULE_SUBEVENT_KEY_EVICTED => Removal::Evicted,
        raw::REDISMODULE_SUBEVENT_KEY_OVERWRITTEN => Removal::Overwritten,
        _ => Removal::Deleted,
    };
    let _in = InEvent::enter();
    let context = Context::new(ctx);
    let name = unsafe { raw::RedisModule_GetKeyNameFromModuleKey.unwrap()(info.key) };
    let db = selected_db(&context);
    (h.f)(&context, db, removal, string_bytes(name));
}

/// True where the server reports every key removed, expired, evicted or overwritten to
/// modules directly (the key server event of Redis 7.2+ and Valkey; checked as the
/// post-notification jobs that came with it). False on 7.0: keyspace events there.
pub fn key_event_available() -> bool {
    has_post_jobs() && unsafe { raw::RedisModule_SubscribeToServerEvent }.is_some()
}

// ---------------------------------------------------------------------------------------
// Server events, subscribed and dropped at run time

/// The server events the module listens to while it watches (engine/events.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// A key removed, expired, evicted or overwritten (7.2+, Valkey).
    Key,
    /// FLUSHDB / FLUSHALL done.
    Flush,
    /// The server turned replica.
    RoleChanged,
    /// SWAPDB.
    SwapDb,
    /// A client connected or disconnected (queued tickets die with their connection).
    ClientChange,
    /// An atomic slot migration of Valkey 9 started, completed or was aborted (only where
    /// the module declared it handles them: see `options.rs`).
    SlotMigration,
    /// A link to a master came up or went down: the replication gate's
    /// (`replication.rs`), not the watching's, so not in [`ALL_HOOKS`].
    MasterLink,
}

pub const ALL_HOOKS: [Hook; 6] = [
    Hook::Key,
    Hook::Flush,
    Hook::RoleChanged,
    Hook::SwapDb,
    Hook::ClientChange,
    Hook::SlotMigration,
];

impl Hook {
    fn bit(self) -> u8 {
        1 << (self as u8)
    }

    fn event(self) -> raw::RedisModuleEvent {
        let (id, dataver) = match self {
            Hook::Key => (raw::REDISMODULE_EVENT_KEY, raw::REDISMODULE_KEYINFO_VERSION),
            Hook::Flush => (
                raw::REDISMODULE_EVENT_FLUSHDB,
                raw::REDISMODULE_FLUSHINFO_VERSION,
            ),
            Hook::RoleChanged => (
                raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
                raw::REDISMODULE_REPLICATIONINFO_VERSION,
            ),
            Hook::SwapDb => (
                raw::REDISMODULE_EVENT_SWAPDB,
                raw::REDISMODULE_SWAPDBINFO_VERSION,
            ),
            Hook::ClientChange => (
                raw::REDISMODULE_EVENT_CLIENT_CHANGE,
                raw::REDISMODULE_CLIENTINFO_VERSION,
            ),
            Hook::MasterLink => (raw::REDISMODULE_EVENT_MASTER_LINK_CHANGE, 1),
            Hook::SlotMigration => (VALKEYMODULE_EVENT_ATOMIC_SLOT_MIGRATION, 1),
        };
        raw::RedisModuleEvent {
            id,
            dataver: dataver as u64,
        }
    }

    fn callback(self) -> raw::RedisModuleEventCallback {
        match self {
            Hook::Key => Some(key_event_cb),
            Hook::Flush => Some(flush_cb),
            Hook::RoleChanged => Some(role_changed_cb),
            Hook::SwapDb => Some(swapdb_cb),
            Hook::ClientChange => Some(client_change_cb),
            Hook::MasterLink => Some(super::replication::propagation_possible_cb),
            Hook::SlotMigration => Some(slot_migration_cb),
        }
    }
}

/// The hooks subscribed now, one bit each (main thread only).
static HOOKED: AtomicU8 = AtomicU8::new(0);

/// Subscribes to a server event, unless already subscribed. False where the server has no
/// such event (the key event on 7.0) or refuses it.
pub fn hook(ctx: &Context, h: Hook) -> bool {
    if HOOKED.load(Relaxed) & h.bit() != 0 {
        return true;
    }
    if h == Hook::Key && !key_event_available() {
        return false;
    }
    // Event 19 is Valkey's slot migration (another server may number another event so),
    // and slots migrate only in cluster mode.
    if h == Hook::SlotMigration
        && !(super::options::slot_migration_declared() && super::replication::cluster_mode())
    {
        return false;
    }
    let Some(subscribe) = (unsafe { raw::RedisModule_SubscribeToServerEvent }) else {
        return false;
    };
    let ok = unsafe { subscribe(ctx.ctx, h.event(), h.callback()) } == raw::REDISMODULE_OK as c_int;
    if ok {
        HOOKED.fetch_or(h.bit(), Relaxed);
    }
    ok
}

/// Drops a server event subscription, if there is one. The server drops a listener when it
/// is subscribed again with a NULL callback, but only one that exists: a NULL callback
/// without a subscription *adds* a listener with no callback, which the server would call
/// (Redis and Valkey `moduleFireServerEvent`), hence the bit checked first.
///
/// Never call it from inside a server event callback: the server would go on using the
/// listener it is iterating over (a timer is the safe place).
pub fn unhook(ctx: &Context, h: Hook) {
    if HOOKED.load(Relaxed) & h.bit() == 0 {
        return;
    }
    let Some(subscribe) = (unsafe { raw::RedisModule_SubscribeToServerEvent }) else {
        return;
    };
    unsafe { subscribe(ctx.ctx, h.event(), None) };
    HOOKED.fetch_and(!h.bit(), Relaxed);
}

/// Forgets every subscription the module had (called at load): the server starts a module
/// with none, but a library unloaded and loaded again may keep its statics (dlclose need
/// not unmap it), and a stale bit would make [`unhook`] register a NULL callback.
pub fn reset_subscriptions() {
    HOOKED.store(0, Relaxed);
    KEYSPACE_ON.store(false, Relaxed);
    IN_EVENT.store(0, Relaxed);
}

/// True while subscribed to `h` (INFO, tests).
pub fn hooked(h: Hook) -> bool {
    HOOKED.load(Relaxed) & h.bit() != 0
}

static FLUSH_HANDLER: OnceLock<fn(&Context)> = OnceLock::new();
static REPLICA_HANDLER: OnceLock<fn(&Context)> = OnceLock::new();

/// Installs what runs once a FLUSHDB/FLUSHALL is done, and what runs when the server turns
/// replica (once, from init; they run only while hooked).
pub fn set_flush_and_replica_handlers(on_flushed: fn(&Context), on_replica: fn(&Context)) {
    let _ = FLUSH_HANDLER.set(on_flushed);
    let _ = REPLICA_HANDLER.set(on_replica);
}

extern "C" fn flush_cb(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_SUBEVENT_FLUSHDB_END {
        return;
    }
    run_handler(ctx, &FLUSH_HANDLER);
}

extern "C" fn role_changed_cb(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    if subevent != raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_REPLICA {
        return;
    }
    run_handler(ctx, &REPLICA_HANDLER);
}

/// Runs an installed handler from a server event, marked as inside an event.
fn run_handler(ctx: *mut raw::RedisModuleCtx, handler: &OnceLock<fn(&Context)>) {
    let _in = InEvent::enter();
    if let Some(f) = handler.get() {
        let context = Context::new(ctx);
        crate::server::guard::quietly(|| f(&context));
    }
}

// ---------------------------------------------------------------------------------------
// Post-notification jobs (Redis 7.2+, Valkey)

/// True where the server runs post-notification jobs. Checked at run time: on 7.0 the
/// function pointer is simply missing.
pub fn has_post_jobs() -> bool {
    unsafe { raw::RedisModule_AddPostNotificationJob }.is_some()
}

static JOB_HANDLER: OnceLock<fn(&Context)> = OnceLock::new();

/// Installs the function every post-notification job runs. Called once from init.
pub fn set_post_job_handler(f: fn(&Context)) {
    let _ = JOB_HANDLER.set(f);
}

extern "C" fn post_job_cb(ctx: *mut raw::RedisModuleCtx, _pd: *mut c_void) {
    // A job may run inside a server event's listener loop: the server runs pending jobs
    // when it frees the context of an event fired outside any command (moduleFreeContext),
    // before it moves to the next listener. So no subscription is dropped from here.
    let _in = InEvent::enter();
    let context = Context::new(ctx);
    if let Some(f) = JOB_HANDLER.get() {
        crate::server::guard::quietly(|| f(&context));
    }
}

/// Asks the server to run the job handler once the current command (or expiry, eviction)
/// is done and propagated, still inside it: its writes reach replicas and the AOF after
/// the cause, and no other client runs in between. False where the server has no such
/// jobs, or refuses them (a read-only replica, while loading).
pub fn add_post_job(ctx: &Context) -> bool {
    let Some(add) = (unsafe { raw::RedisModule_AddPostNotificationJob }) else {
        return false;
    };
    unsafe {
        add(ctx.ctx, Some(post_job_cb), ptr::null_mut(), None) == raw::REDISMODULE_OK as c_int
    }
}

// ---------------------------------------------------------------------------------------
// Atomic slot migration (Valkey 9.0+)

/// `VALKEYMODULE_EVENT_ATOMIC_SLOT_MIGRATION` and the subevent the module acts on (from
/// valkeymodule.h; the redis-module crate's header has neither).
const VALKEYMODULE_EVENT_ATOMIC_SLOT_MIGRATION: u64 = 19;
const VALKEYMODULE_SUBEVENT_ATOMIC_SLOT_MIGRATION_EXPORT_COMPLETED: u64 = 5;

/// `ValkeyModuleSlotRange`: inclusive.
#[repr(C)]
struct SlotRange {
    start: c_int,
    end: c_int,
}

/// `ValkeyModuleAtomicSlotMigrationInfoV1`.
#[repr(C)]
struct SlotMigrationInfo {
    version: u64,
    job_name: [c_char; 41],
    slot_ranges: *const SlotRange,
    num_slot_ranges: u32,
}

/// Called with the slot ranges (inclusive) this node exported.
pub type SlotsHandler = fn(&Context, &[(u16, u16)]);

static EXPORTED_HANDLER: OnceLock<SlotsHandler> = OnceLock::new();

/// Installs what runs when slots this node exported now belong to another node (once,
/// from init; it runs only while hooked).
pub fn on_slots_exported(f: SlotsHandler) {
    let _ = EXPORTED_HANDLER.set(f);
}

extern "C" fn slot_migration_cb(
    ctx: *mut raw::RedisModuleCtx,
    _eid: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    if subevent != VALKEYMODULE_SUBEVENT_ATOMIC_SLOT_MIGRATION_EXPORT_COMPLETED || data.is_null() {
        return;
    }
    let info = unsafe { &*data.cast::<SlotMigrationInfo>() };
    if info.version < 1 || info.slot_ranges.is_null() {
        return;
    }
    let ranges: Vec<(u16, u16)> = (0..info.num_slot_ranges as usize)
        .map(|i| unsafe { &*info.slot_ranges.add(i) })
        .map(|r| (r.start.clamp(0, 16383) as u16, r.end.clamp(0, 16383) as u16))
        .collect();
    let _in = InEvent::enter();
    if let Some(f) = EXPORTED_HANDLER.get() {
        let context = Context::new(ctx);
        crate::server::guard::quietly(|| f(&context, &ranges));
    }
}
