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
    // Read-write lock (RRWLOCK.*)
    pub rw_read_acquisitions: Cell<u64>,
    pub rw_write_acquisitions: Cell<u64>,
    pub rw_contended: Cell<u64>,
    pub rw_releases: Cell<u64>,
    pub rw_forced_releases: Cell<u64>,
    pub rw_renewals: Cell<u64>,
    pub rw_read_leases_ended: Cell<u64>,
}

/// What INFO reports that lives elsewhere (the engine's queues, the tracked set).
#[derive(Debug, Clone, Copy, Default)]
pub struct Gauges {
    pub waiters: usize,
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

/// The `rlock` section of INFO. The older field API is the one that names the section
/// after the module alone (`INFO rlock`); the builder would make it `rlock_<name>`.
#[allow(deprecated)]
pub fn info(ctx: &InfoContext, gauges: Gauges) -> RedisResult<()> {
    let Gauges {
        waiters,
        keys_with_waiters: keys,
        tracked_locks,
    } = gauges;
    STATS.with(|s| {
        let fields: [(&str, u64); 13] = [
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
            ("waiters", waiters as u64),
            ("keys_with_waiters", keys as u64),
            ("tracked_locks", tracked_locks as u64),
        ];
        // Read-write lock (RRWLOCK.*)
        let rw: [(&str, u64); 7] = [
            ("rw_read_acquisitions", s.rw_read_acquisitions.get()),
            ("rw_write_acquisitions", s.rw_write_acquisitions.get()),
            ("rw_contended", s.rw_contended.get()),
            ("rw_releases", s.rw_releases.get()),
            ("rw_forced_releases", s.rw_forced_releases.get()),
            ("rw_renewals", s.rw_renewals.get()),
            ("rw_read_leases_ended", s.rw_read_leases_ended.get()),
        ];
        ctx.add_info_section(None);
        for (name, value) in fields.into_iter().chain(rw) {
            ctx.add_info_field_long_long(name, value as i64);
        }
    });
    Ok(())
}
