//! Counters for `INFO rlock`. Main-thread only, like every module callback.
//!
//! Layer: a leaf every layer may bump; it imports nothing of the crate. The gauges it
//! reports (waiters, tracked locks) are handed to [`info`] by lib.rs, never read from
//! above.

use std::cell::Cell;

use redis_module::{InfoContext, RedisResult};

#[derive(Default)]
pub struct Stats {
    pub acquisitions: Cell<u64>,
    pub reentries: Cell<u64>,
    pub contended: Cell<u64>,
    pub handoffs: Cell<u64>,
    pub wait_timeouts: Cell<u64>,
    pub releases: Cell<u64>,
    pub forced_releases: Cell<u64>,
    pub renewals: Cell<u64>,
    pub expired_with_waiters: Cell<u64>,
    pub revoked_handoffs: Cell<u64>,
    /// Grants that could have been taken back, forgotten because their key was deleted
    /// since (engine::void_grants_of).
    pub voided_handoffs: Cell<u64>,
    /// Locks left free for script-side waiters before a handoff (engine/turns.rs).
    pub script_turns: Cell<u64>,
    // Countdown latch (latch/commands.rs).
    pub latch_sets: Cell<u64>,
    pub latch_count_downs: Cell<u64>,
    pub latch_openings: Cell<u64>,
    pub latch_deletes: Cell<u64>,
    pub latch_awaits_open: Cell<u64>,
    pub latch_awaits_queued: Cell<u64>,
    pub latch_awaits_released: Cell<u64>,
    pub latch_await_timeouts: Cell<u64>,
    // Fenced lock (design.md 4.2): tokens issued by RFENCED.ACQUIRE and its handoffs.
    pub fenced_tokens_issued: Cell<u64>,
    // Semaphores (RSEMAPHORE.*, RPSEMAPHORE.*): acquires answered at once, refused
    // (queued or not), granted after waiting, releases; for RPSEMAPHORE also lease updates
    // and permits that came back at their lease end.
    pub sem_acquisitions: Cell<u64>,
    pub sem_contended: Cell<u64>,
    pub sem_granted_after_wait: Cell<u64>,
    pub sem_releases: Cell<u64>,
    pub psem_acquisitions: Cell<u64>,
    pub psem_contended: Cell<u64>,
    pub psem_granted_after_wait: Cell<u64>,
    pub psem_releases: Cell<u64>,
    pub psem_lease_updates: Cell<u64>,
    pub psem_permits_expired: Cell<u64>,
    // Read-write lock (RRWLOCK.*)
    pub rw_read_acquisitions: Cell<u64>,
    pub rw_write_acquisitions: Cell<u64>,
    pub rw_contended: Cell<u64>,
    pub rw_releases: Cell<u64>,
    pub rw_forced_releases: Cell<u64>,
    pub rw_renewals: Cell<u64>,
    pub rw_read_leases_ended: Cell<u64>,
    // Queued tickets (design.md 5, docs/commands/tickets.md): queued, granted, timed out, dropped with
    // their connection.
    pub tickets_queued: Cell<u64>,
    pub tickets_granted: Cell<u64>,
    pub tickets_timed_out: Cell<u64>,
    pub tickets_dropped: Cell<u64>,
}

/// What INFO reports that lives elsewhere (the engine's queues, the tracked set).
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauges {
    pub waiters: usize,
    /// Of `waiters`, the queued tickets.
    pub tickets: usize,
    pub keys_with_waiters: usize,
    pub tracked_locks: usize,
}

thread_local! {
    static STATS: Stats = Stats::default();
}

/// Adds one to the counter `pick` selects.
pub fn bump(pick: impl FnOnce(&Stats) -> &Cell<u64>) {
    STATS.with(|s| {
        let c = pick(s);
        c.set(c.get() + 1);
    });
}

/// Adds `n` to the counter `pick` selects.
pub fn add(pick: impl FnOnce(&Stats) -> &Cell<u64>, n: u64) {
    STATS.with(|s| {
        let c = pick(s);
        c.set(c.get() + n);
    });
}

/// The semaphores' counters (RSEMAPHORE.*, RPSEMAPHORE.*), after the lock's.
fn semaphore_fields(s: &Stats) -> [(&'static str, u64); 10] {
    [
        ("sem_acquisitions", s.sem_acquisitions.get()),
        ("sem_contended", s.sem_contended.get()),
        ("sem_granted_after_wait", s.sem_granted_after_wait.get()),
        ("sem_releases", s.sem_releases.get()),
        ("psem_acquisitions", s.psem_acquisitions.get()),
        ("psem_contended", s.psem_contended.get()),
        ("psem_granted_after_wait", s.psem_granted_after_wait.get()),
        ("psem_releases", s.psem_releases.get()),
        ("psem_lease_updates", s.psem_lease_updates.get()),
        ("psem_permits_expired", s.psem_permits_expired.get()),
    ]
}

/// INFO's sections, `rlock_<section>` (`INFO rlock` gives them all, `INFO rlock_lock` one).
///
/// Naming rule: a section per primitive (`lock`, `rwlock`, `fenced`, `semaphore`, `latch`)
/// plus `waits` (waiters and tickets of every primitive) and `server` (what the module holds
/// of the server: timers, event subscriptions, the replication gate), written by lib.rs.
/// Every field is `rlock_` (the server's prefix for a module's fields) then the primitive's
/// word (`rw_`, `fenced_`, `sem_` / `psem_`, `latch_`; none for the plain lock, whose
/// fields came first) then the counter, so a field keeps its name whichever section holds it.
pub const SECTIONS: [&str; 7] = [
    "lock",
    "rwlock",
    "fenced",
    "semaphore",
    "latch",
    "waits",
    "server",
];

/// Writes every section but `server`, which lib.rs writes from what it alone reads.
pub fn info(ctx: &InfoContext, gauges: Gauges) -> RedisResult<()> {
    let Gauges {
        waiters,
        tickets,
        keys_with_waiters: keys,
        tracked_locks,
    } = gauges;
    STATS.with(|s| {
        let lock: [(&str, u64); 13] = [
            ("acquisitions", s.acquisitions.get()),
            ("reentries", s.reentries.get()),
            ("contended", s.contended.get()),
            ("handoffs", s.handoffs.get()),
            ("wait_timeouts", s.wait_timeouts.get()),
            ("releases", s.releases.get()),
            ("forced_releases", s.forced_releases.get()),
            ("renewals", s.renewals.get()),
            ("expired_with_waiters", s.expired_with_waiters.get()),
            ("revoked_handoffs", s.revoked_handoffs.get()),
            ("voided_handoffs", s.voided_handoffs.get()),
            ("script_turns", s.script_turns.get()),
            ("tracked_locks", tracked_locks as u64),
        ];
        let rw: [(&str, u64); 7] = [
            ("rw_read_acquisitions", s.rw_read_acquisitions.get()),
            ("rw_write_acquisitions", s.rw_write_acquisitions.get()),
            ("rw_contended", s.rw_contended.get()),
            ("rw_releases", s.rw_releases.get()),
            ("rw_forced_releases", s.rw_forced_releases.get()),
            ("rw_renewals", s.rw_renewals.get()),
            ("rw_read_leases_ended", s.rw_read_leases_ended.get()),
        ];
        // Fenced lock (design.md 4.2).
        let fenced: [(&str, u64); 1] = [("fenced_tokens_issued", s.fenced_tokens_issued.get())];
        let semaphore = semaphore_fields(s);
        // Countdown latch (latch/commands.rs): counts set, count-downs, openings (by count-down
        // to zero or delete), awaits answered open at once, queued, released, timed out.
        let latch: [(&str, u64); 8] = [
            ("latch_sets", s.latch_sets.get()),
            ("latch_count_downs", s.latch_count_downs.get()),
            ("latch_openings", s.latch_openings.get()),
            ("latch_deletes", s.latch_deletes.get()),
            ("latch_awaits_open", s.latch_awaits_open.get()),
            ("latch_awaits_queued", s.latch_awaits_queued.get()),
            ("latch_awaits_released", s.latch_awaits_released.get()),
            ("latch_await_timeouts", s.latch_await_timeouts.get()),
        ];
        // Waiting, every primitive's (design.md 5): the gauges, then the tickets' counters.
        let waits: [(&str, u64); 7] = [
            ("waiters", waiters as u64),
            ("keys_with_waiters", keys as u64),
            ("tickets", tickets as u64),
            ("tickets_queued", s.tickets_queued.get()),
            ("tickets_granted", s.tickets_granted.get()),
            ("tickets_timed_out", s.tickets_timed_out.get()),
            ("tickets_dropped", s.tickets_dropped.get()),
        ];
        section(ctx, SECTIONS[0], &lock);
        section(ctx, SECTIONS[1], &rw);
        section(ctx, SECTIONS[2], &fenced);
        section(ctx, SECTIONS[3], &semaphore);
        section(ctx, SECTIONS[4], &latch);
        section(ctx, SECTIONS[5], &waits);
    });
    Ok(())
}

/// One INFO section and its fields.
#[allow(deprecated)]
pub fn section(ctx: &InfoContext, name: &str, fields: &[(&str, u64)]) {
    ctx.add_info_section(Some(name));
    for &(field, value) in fields {
        ctx.add_info_field_long_long(field, value as i64);
    }
}
