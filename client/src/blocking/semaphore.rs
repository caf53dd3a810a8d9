//! Semaphores (blocking API): [`Semaphore`] over `RSEMAPHORE.*` with [`SemaphorePermit`]
//! guards, and [`ExpirableSemaphore`] over `RPSEMAPHORE.*` with [`ExpirablePermit`]
//! guards that carry a permit id, a lease renewed by a watchdog when none is given, and
//! lost-permit reporting like a lost lock's.
//!
//! Both keep Redisson's layouts (a Java service using `RSemaphore` /
//! `RPermitExpirableSemaphore` on the same names interoperates). Waiting is done in the
//! server (`WAIT`, first come first served, a big request at the head is not starved) on
//! a connection of its own. Every call that changes something sends a request id, the
//! same with each of its retries, so a retry after a lost reply never takes or returns
//! permits twice.

use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;

use crate::blocking::{Client, ClientInner};
use crate::error::{Error, Result};
use crate::proto::cmd::request_id;
use crate::proto::logic::lock_ignoring_poison;
use crate::proto::state::LostReason;

impl Client {
    /// A handle on the semaphore `name` (Redisson's `RSemaphore` layout).
    ///
    /// ```no_run
    /// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// let jobs = client.semaphore("jobs");
    /// jobs.try_set_permits(4)?;
    /// let permit = jobs.acquire(1)?; // waits in the server, FIFO
    /// // ... at most 4 of these at once ...
    /// permit.release()?;
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn semaphore(&self, name: impl Into<String>) -> Semaphore {
        Semaphore {
            client: self.inner.clone(),
            name: name.into(),
        }
    }

    /// A handle on the permit-expirable semaphore `name` (Redisson's
    /// `RPermitExpirableSemaphore` layout).
    ///
    /// ```no_run
    /// # let client = rlock_client::Client::open("redis://127.0.0.1/")?;
    /// let slots = client.expirable_semaphore("slots");
    /// slots.try_set_permits(2)?;
    /// let permit = slots.acquire(None)?; // watchdog lease, renewed while held
    /// println!("holding {}", permit.id());
    /// permit.release()?; // Err(NotHeld) if it expired meanwhile
    /// # Ok::<_, rlock_client::Error>(())
    /// ```
    pub fn expirable_semaphore(&self, name: impl Into<String>) -> ExpirableSemaphore {
        ExpirableSemaphore {
            client: self.inner.clone(),
            name: name.into(),
        }
    }
}

pub(crate) fn int(v: Value) -> Result<i64> {
    match v {
        Value::Int(n) => Ok(n),
        other => Err(Error::UnexpectedReply(format!("{other:?}"))),
    }
}

pub(crate) fn hex_ids(v: Value) -> Result<Option<Vec<String>>> {
    let one = |v: Value| match v {
        Value::BulkString(b) => {
            String::from_utf8(b).map_err(|e| Error::UnexpectedReply(e.to_string()))
        }
        other => Err(Error::UnexpectedReply(format!("{other:?}"))),
    };
    match v {
        Value::Nil => Ok(None),
        Value::Array(items) => items.into_iter().map(one).collect::<Result<_>>().map(Some),
        other => one(other).map(|id| Some(vec![id])),
    }
}

pub(crate) fn ms(d: Duration) -> u64 {
    d.as_millis().clamp(1, u64::MAX as u128) as u64
}

/// How long the reply of a command waiting `wait` may take (None: no limit).
fn reply_limit(c: &ClientInner, wait: Option<Duration>) -> Option<Duration> {
    let margin = c.opts.response_timeout.unwrap_or(Duration::from_secs(3));
    wait.map(|w| w + margin)
}

/// Runs `build(remaining wait)` until it is answered, retrying transient failures with
/// the same request id; waits, when `wait` is given, on a connection of its own.
/// `Wait::Forever` is `Some(None)`, no wait `None`.
fn acquire_call(
    c: &ClientInner,
    wait: Option<Option<Duration>>,
    build: impl Fn(Option<Duration>) -> redis::Cmd,
) -> Result<Value> {
    let deadline = wait.flatten().map(|w| Instant::now() + w);
    c.with_retries(c.retries(), || match wait {
        None => c.run(&build(None)),
        Some(limit) => {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let cmd = build(left.or(limit));
            let read = if limit.is_none() {
                None
            } else {
                reply_limit(c, left)
            };
            c.wait_query(read, &cmd).map_err(Error::from)
        }
    })
}

/// Appends `WAIT ms` (a wait without limit is `WAIT 0`).
fn with_wait(cmd: &mut redis::Cmd, wait: Option<Option<Duration>>, left: Option<Duration>) {
    match wait {
        None => {}
        Some(None) => {
            cmd.arg("WAIT").arg(0);
        }
        Some(Some(_)) => {
            // At least 1 ms: WAIT 0 would mean "forever".
            cmd.arg("WAIT").arg(ms(left.unwrap_or(Duration::ZERO)));
        }
    }
}

// ---- RSEMAPHORE --------------------------------------------------------------------------

/// A handle on one semaphore. Cheap to clone.
///
/// Redisson's semaphore records nobody's permits: a process that dies holding some
/// leaks them for good. Use [`ExpirableSemaphore`] when holders may crash.
#[derive(Clone)]
pub struct Semaphore {
    client: Arc<ClientInner>,
    name: String,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .finish()
    }
}

impl Semaphore {
    /// The semaphore's key.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn once(&self, verb: &str, args: &[i64]) -> Result<i64> {
        let id = request_id();
        let mut cmd = redis::cmd(verb);
        cmd.arg(&self.name).arg(args).arg("ID").arg(&id);
        let c = &self.client;
        c.with_retries(c.retries(), || c.run(&cmd)).and_then(int)
    }

    /// Sets the number of permits if the semaphore has none yet; true if it was set.
    pub fn try_set_permits(&self, permits: u32) -> Result<bool> {
        Ok(self.once("RSEMAPHORE.TRYSETPERMITS", &[permits.into()])? == 1)
    }

    /// Adds (or, negative, removes) permits; returns the new count.
    pub fn add_permits(&self, delta: i32) -> Result<i64> {
        self.once("RSEMAPHORE.ADDPERMITS", &[delta.into()])
    }

    /// Takes every available permit; returns how many.
    pub fn drain(&self) -> Result<i64> {
        self.once("RSEMAPHORE.DRAINPERMITS", &[])
    }

    /// Returns `permits` permits without a guard (Redisson lets anyone release); returns
    /// the count after the release.
    pub fn release(&self, permits: u32) -> Result<i64> {
        self.once("RSEMAPHORE.RELEASE", &[permits.into()])
    }

    /// The permits available now.
    pub fn available(&self) -> Result<i64> {
        let mut cmd = redis::cmd("RSEMAPHORE.AVAILABLEPERMITS");
        cmd.arg(&self.name);
        let c = &self.client;
        c.with_retries(c.retries(), || c.run(&cmd)).and_then(int)
    }

    fn acquire_with(
        &self,
        permits: u32,
        wait: Option<Option<Duration>>,
    ) -> Result<Option<SemaphorePermit>> {
        let id = request_id();
        let reply = acquire_call(&self.client, wait, |left| {
            let mut cmd = redis::cmd("RSEMAPHORE.ACQUIRE");
            cmd.arg(&self.name).arg(permits);
            with_wait(&mut cmd, wait, left);
            cmd.arg("ID").arg(&id);
            cmd
        })?;
        Ok((int(reply)? == 1).then(|| SemaphorePermit {
            sem: self.clone(),
            permits,
            done: false,
        }))
    }

    /// Waits (in the server, without limit) for `permits` permits.
    pub fn acquire(&self, permits: u32) -> Result<SemaphorePermit> {
        self.acquire_with(permits, Some(None))?
            .ok_or_else(|| Error::UnexpectedReply("a wait without limit answered 0".into()))
    }

    /// Takes `permits` permits if they are free now and nobody waits before us.
    pub fn try_acquire(&self, permits: u32) -> Result<Option<SemaphorePermit>> {
        self.acquire_with(permits, None)
    }

    /// Waits at most `wait` for `permits` permits.
    pub fn acquire_timeout(&self, permits: u32, wait: Duration) -> Result<Option<SemaphorePermit>> {
        self.acquire_with(permits, Some(Some(wait.max(Duration::from_millis(1)))))
    }
}

/// Permits taken from a [`Semaphore`]. Release them with [`SemaphorePermit::release`].
///
/// # Drop
/// Dropping the guard releases its permits best-effort (one attempt; inside a tokio
/// runtime on a blocking task, never blocking the runtime).
#[must_use = "dropping the guard releases the permits at once"]
pub struct SemaphorePermit {
    sem: Semaphore,
    permits: u32,
    done: bool,
}

impl std::fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemaphorePermit")
            .field("name", &self.sem.name)
            .field("permits", &self.permits)
            .finish()
    }
}

impl SemaphorePermit {
    /// How many permits this guard holds.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// Returns the permits (retrying transient failures with one request id, so they
    /// are never returned twice); returns the count after the release.
    pub fn release(mut self) -> Result<i64> {
        self.done = true;
        self.sem.release(self.permits)
    }
}

impl Drop for SemaphorePermit {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (sem, permits) = (self.sem.clone(), self.permits);
        let job = move || {
            let mut cmd = redis::cmd("RSEMAPHORE.RELEASE");
            cmd.arg(&sem.name).arg(permits).arg("ID").arg(request_id());
            let _ = sem.client.run(&cmd);
        };
        spawn_or_run(job);
    }
}

fn spawn_or_run(job: impl FnOnce() + Send + 'static) {
    #[cfg(feature = "tokio")]
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        drop(rt.spawn_blocking(job));
        return;
    }
    job();
}

// ---- RPSEMAPHORE -------------------------------------------------------------------------

/// A handle on one permit-expirable semaphore. Cheap to clone.
///
/// Each permit has an id and a lease: a holder that dies loses its permit at the lease
/// end, when the module returns it to the pool (and to the first waiter) at once.
#[derive(Clone)]
pub struct ExpirableSemaphore {
    client: Arc<ClientInner>,
    name: String,
}

impl std::fmt::Debug for ExpirableSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpirableSemaphore")
            .field("name", &self.name)
            .finish()
    }
}

impl ExpirableSemaphore {
    /// The semaphore's key (its permits are in `{name}:timeout`).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn call(&self, verb: &str, args: &[i64], with_id: bool) -> Result<i64> {
        let mut cmd = redis::cmd(verb);
        cmd.arg(&self.name).arg(args);
        if with_id {
            cmd.arg("ID").arg(request_id());
        }
        let c = &self.client;
        c.with_retries(c.retries(), || c.run(&cmd)).and_then(int)
    }

    /// Sets the number of permits if there is no count yet; true if it was set.
    pub fn try_set_permits(&self, permits: u32) -> Result<bool> {
        Ok(self.call("RPSEMAPHORE.TRYSETPERMITS", &[permits.into()], true)? == 1)
    }

    /// Makes available + held equal `permits`; returns the available count.
    pub fn set_permits(&self, permits: u32) -> Result<i64> {
        self.call("RPSEMAPHORE.SETPERMITS", &[permits.into()], true)
    }

    /// Adds (or removes) available permits; returns the new available count.
    pub fn add_permits(&self, delta: i32) -> Result<i64> {
        self.call("RPSEMAPHORE.ADDPERMITS", &[delta.into()], true)
    }

    /// Permits available now (expired ones count as back).
    pub fn available(&self) -> Result<i64> {
        self.call("RPSEMAPHORE.AVAILABLEPERMITS", &[], false)
    }

    /// Permits held and not expired.
    pub fn acquired(&self) -> Result<i64> {
        self.call("RPSEMAPHORE.ACQUIREDPERMITS", &[], false)
    }

    fn acquire_with(
        &self,
        lease: Option<Duration>,
        wait: Option<Option<Duration>>,
    ) -> Result<Option<ExpirablePermit>> {
        if lease == Some(Duration::ZERO) {
            return Err(Error::InvalidArgument("a lease must be at least 1 ms"));
        }
        let c = &self.client;
        // No lease: the watchdog's (renewed every third of it), never Redisson's
        // lease-less permit, which a crashed holder would keep forever.
        let (lease_ms, watchdog) = match lease {
            Some(d) => (ms(d), false),
            None => (ms(c.opts.watchdog_timeout), true),
        };
        let id = request_id();
        let sent = Instant::now();
        let reply = acquire_call(c, wait, |left| {
            let mut cmd = redis::cmd("RPSEMAPHORE.ACQUIRE");
            cmd.arg(&self.name).arg(lease_ms);
            with_wait(&mut cmd, wait, left);
            cmd.arg("ID").arg(&id);
            cmd
        })?;
        let Some(mut ids) = hex_ids(reply)? else {
            return Ok(None);
        };
        let permit_id = ids
            .pop()
            .ok_or_else(|| Error::UnexpectedReply("no id".into()))?;
        // A waiting acquire's lease started at the grant, after `sent`: counting from
        // `sent` is on the safe side.
        let mut taken_at = sent;
        if watchdog && sent.elapsed() > Duration::from_millis(lease_ms / 3) {
            // Granted late in a long wait: re-arm before trusting the lease.
            let now = Instant::now();
            let renewed = update(&self.client, &self.name, &permit_id, lease_ms)?;
            if !renewed {
                return Err(Error::NotHeld {
                    key: self.name.clone(),
                });
            }
            taken_at = now;
        }
        Ok(Some(ExpirablePermit::start(
            self.clone(),
            permit_id,
            lease_ms,
            watchdog,
            taken_at,
        )))
    }

    /// Waits (in the server, without limit) for a permit. `lease` None: the watchdog's
    /// lease, renewed while the guard lives.
    pub fn acquire(&self, lease: Option<Duration>) -> Result<ExpirablePermit> {
        self.acquire_with(lease, Some(None))?
            .ok_or_else(|| Error::UnexpectedReply("a wait without limit answered nil".into()))
    }

    /// Takes a permit if one is free now and nobody waits before us.
    pub fn try_acquire(&self, lease: Option<Duration>) -> Result<Option<ExpirablePermit>> {
        self.acquire_with(lease, None)
    }

    /// Waits at most `wait` for a permit.
    pub fn acquire_timeout(
        &self,
        lease: Option<Duration>,
        wait: Duration,
    ) -> Result<Option<ExpirablePermit>> {
        self.acquire_with(lease, Some(Some(wait.max(Duration::from_millis(1)))))
    }
}

/// `RPSEMAPHORE.UPDATELEASETIME` (idempotent: no request id needed).
fn update(c: &ClientInner, name: &str, id: &str, lease_ms: u64) -> Result<bool> {
    let mut cmd = redis::cmd("RPSEMAPHORE.UPDATELEASETIME");
    cmd.arg(name).arg(id).arg(lease_ms);
    Ok(c.with_retries(c.retries(), || c.run(&cmd)).and_then(int)? == 1)
}

type Callback = Box<dyn FnOnce(LostReason) + Send + 'static>;

#[derive(Default)]
struct PermitState {
    lost: Option<LostReason>,
    /// Released or dropped: the renewal thread stops, nothing more is reported.
    done: bool,
    deadline: Option<Instant>,
    callbacks: Vec<Callback>,
}

struct Shared {
    state: Mutex<PermitState>,
    cond: Condvar,
}

impl Shared {
    fn mark_lost(&self, reason: LostReason) {
        let callbacks = {
            let mut st = lock_ignoring_poison(&self.state);
            if st.done || st.lost.is_some() {
                return;
            }
            st.lost = Some(reason);
            std::mem::take(&mut st.callbacks)
        };
        self.cond.notify_all();
        for f in callbacks {
            f(reason);
        }
    }
}

/// One permit of an [`ExpirableSemaphore`], with its id.
///
/// Without a lease it is renewed (`RPSEMAPHORE.UPDATELEASETIME`) every third of the
/// watchdog timeout by a thread of its own; with a lease it ends there. A permit found
/// lost (renewal answered 0, or renewals failed until the lease ran out, or a fixed lease
/// ran out while the guard lived) is reported: [`ExpirablePermit::is_held`],
/// [`ExpirablePermit::wait_lost`], [`ExpirablePermit::on_lost`]; and
/// [`ExpirablePermit::release`] then answers [`Error::NotHeld`].
///
/// # Drop
/// Dropping stops the renewal and releases the permit best-effort (one attempt).
#[must_use = "dropping the guard releases the permit at once"]
pub struct ExpirablePermit {
    sem: ExpirableSemaphore,
    id: String,
    shared: Arc<Shared>,
    done: bool,
}

impl std::fmt::Debug for ExpirablePermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpirablePermit")
            .field("name", &self.sem.name)
            .field("id", &self.id)
            .finish()
    }
}

impl ExpirablePermit {
    fn start(
        sem: ExpirableSemaphore,
        id: String,
        lease_ms: u64,
        watchdog: bool,
        at: Instant,
    ) -> Self {
        let lease = Duration::from_millis(lease_ms);
        let shared = Arc::new(Shared {
            state: Mutex::new(PermitState {
                deadline: Some(at + lease),
                ..PermitState::default()
            }),
            cond: Condvar::new(),
        });
        let (s, client, name, pid) = (
            shared.clone(),
            sem.client.clone(),
            sem.name.clone(),
            id.clone(),
        );
        let spawned = thread::Builder::new()
            .name("rlock-permit".into())
            .spawn(move || watch(&s, &client, &name, &pid, lease, watchdog));
        if spawned.is_err() {
            // Out of threads: not renewed; is_held still turns false at the deadline.
        }
        ExpirablePermit {
            sem,
            id,
            shared,
            done: false,
        }
    }

    /// The permit id (32 hex digits, as Redisson's).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// False once the permit is known lost or its lease has run out.
    pub fn is_held(&self) -> bool {
        let st = lock_ignoring_poison(&self.shared.state);
        st.lost.is_none() && st.deadline.is_none_or(|d| Instant::now() < d)
    }

    /// Why the permit was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        lock_ignoring_poison(&self.shared.state).lost
    }

    /// Blocks until the permit is lost (Some) or `timeout` passes (None).
    pub fn wait_lost(&self, timeout: Option<Duration>) -> Option<LostReason> {
        let end = timeout.map(|t| Instant::now() + t);
        let mut st = lock_ignoring_poison(&self.shared.state);
        loop {
            if st.lost.is_some() {
                return st.lost;
            }
            let wait = match end {
                Some(e) => e.checked_duration_since(Instant::now())?,
                None => Duration::from_secs(3600),
            };
            st = self
                .shared
                .cond
                .wait_timeout(st, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Runs `f` once the permit is lost (at once if it already is).
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        let mut st = lock_ignoring_poison(&self.shared.state);
        match st.lost {
            Some(reason) => {
                drop(st);
                f(reason);
            }
            None => st.callbacks.push(Box::new(f)),
        }
    }

    /// Re-arms a fixed lease to `lease` from now; false when the permit is not held.
    pub fn update_lease(&self, lease: Duration) -> Result<bool> {
        let now = Instant::now();
        let held = update(&self.sem.client, &self.sem.name, &self.id, ms(lease))?;
        if held {
            lock_ignoring_poison(&self.shared.state).deadline = Some(now + lease);
            self.shared.cond.notify_all();
        } else {
            self.shared.mark_lost(LostReason::NotHeld);
        }
        Ok(held)
    }

    fn stop(&mut self) {
        self.done = true;
        lock_ignoring_poison(&self.shared.state).done = true;
        self.shared.cond.notify_all();
    }

    /// Releases the permit (retried with one request id).
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the server no longer had it (it expired or was lost): the
    /// work under the guard ran unprotected for a while.
    pub fn release(mut self) -> Result<()> {
        self.stop();
        let mut cmd = redis::cmd("RPSEMAPHORE.RELEASE");
        cmd.arg(&self.sem.name)
            .arg(&self.id)
            .arg("ID")
            .arg(request_id());
        let c = &self.sem.client;
        match c.with_retries(c.retries(), || c.run(&cmd)).and_then(int)? {
            1 => Ok(()),
            _ => Err(Error::NotHeld {
                key: self.sem.name.clone(),
            }),
        }
    }
}

impl Drop for ExpirablePermit {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.stop();
        let (client, name, id) = (
            self.sem.client.clone(),
            self.sem.name.clone(),
            self.id.clone(),
        );
        spawn_or_run(move || {
            let mut cmd = redis::cmd("RPSEMAPHORE.RELEASE");
            cmd.arg(&name).arg(&id).arg("ID").arg(request_id());
            let _ = client.run(&cmd);
        });
    }
}

/// The permit's own thread: renews a watchdog lease every third of it (transient failures
/// retried until the lease would have run out), or waits out a fixed lease; reports loss.
fn watch(s: &Shared, c: &ClientInner, name: &str, id: &str, lease: Duration, watchdog: bool) {
    let every = (lease / 3).max(Duration::from_millis(1));
    let mut st = lock_ignoring_poison(&s.state);
    loop {
        if st.done || st.lost.is_some() {
            return;
        }
        let deadline = st.deadline.unwrap_or_else(Instant::now);
        let now = Instant::now();
        if now >= deadline {
            drop(st);
            s.mark_lost(LostReason::LeaseExpired);
            return;
        }
        let next = if watchdog {
            // Every third of the lease after the last renewal.
            deadline
                .checked_sub(lease)
                .map_or(now, |t| t + every)
                .min(deadline)
        } else {
            deadline
        };
        if now < next {
            st = s
                .cond
                .wait_timeout(st, next - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            continue;
        }
        drop(st);
        let sent = Instant::now();
        let mut cmd = redis::cmd("RPSEMAPHORE.UPDATELEASETIME");
        cmd.arg(name).arg(id).arg(ms(lease));
        match c.run(&cmd).and_then(int) {
            Ok(1) => {
                lock_ignoring_poison(&s.state).deadline = Some(sent + lease);
            }
            Ok(_) => {
                s.mark_lost(LostReason::NotHeld);
                return;
            }
            Err(_) => thread::sleep(Duration::from_millis(10).min(every)),
        }
        st = lock_ignoring_poison(&s.state);
    }
}
