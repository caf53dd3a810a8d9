//! Semaphores, the implementation (the blocking API wraps it): [`Semaphore`] over `RSEMAPHORE.*` with [`SemaphorePermit`]
//! guards, and [`ExpirableSemaphore`] over `RPSEMAPHORE.*` with [`ExpirablePermit`]
//! guards that carry a permit id, a lease renewed by a watchdog when none is given, and
//! lost-permit reporting like a lost lock's.
//!
//! Both keep Redisson's layouts (a Java service using `RSemaphore` /
//! `RPermitExpirableSemaphore` on the same names interoperates). Waiting is done in the
//! server (first come first served, a big request at the head is not starved), by a
//! queued ticket that holds on its `granted` message (design.md 5). Every call that changes something sends a request id, the
//! same with each of its retries, so a retry after a lost reply never takes or returns
//! permits twice.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Value;
use tokio::sync::Notify;

use crate::aio::{Client, ClientInner, ReleaseOnce};
use crate::error::{Error, Result};
use crate::net::tickets::{Confirm, Outcome};
use crate::proto::cmd::request_id;
use crate::proto::logic::lock_ignoring_poison;
use crate::proto::state::{Contention, LostReason};

impl Client {
    /// A handle on the semaphore `name` (see [`crate::Client::semaphore`]).
    pub fn semaphore(&self, name: impl Into<String>) -> Semaphore {
        Semaphore {
            client: self.inner.clone(),
            name: name.into(),
            contention: Arc::default(),
        }
    }

    /// A handle on the permit-expirable semaphore `name` (see
    /// [`crate::Client::expirable_semaphore`]).
    pub fn expirable_semaphore(&self, name: impl Into<String>) -> ExpirableSemaphore {
        ExpirableSemaphore {
            client: self.inner.clone(),
            name: name.into(),
            contention: Arc::default(),
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

async fn call(c: &ClientInner, cmd: redis::Cmd) -> Result<i64> {
    c.with_retries(c.retries(), || c.run(&cmd))
        .await
        .and_then(int)
}

/// `wait`: None no wait; Some(None) without limit; Some(Some(d)) at most `d`. The same
/// request id goes with every retry. With `confirm`, a ticket's grant returns on its
/// `granted` message (the expirable semaphore's permit ids read from it) and is confirmed
/// off the path (design.md 5); `confirm` then says whether it was taken back.
///
/// A wait asks without waiting first unless `hint` says an acquire found the permits
/// taken lately ([`Contention`]).
async fn acquire_call(
    c: &ClientInner,
    verb: &str,
    name: &str,
    first: u64,
    wait: Option<Option<Duration>>,
    confirm: &Arc<Confirm>,
    hint: Hint<'_>,
) -> Result<Value> {
    let Hint { seen: hint, took } = hint;
    let started = Instant::now();
    let deadline = wait.flatten().map(|w| started + w);
    if wait.is_some() && hint.tries_first(started) {
        // A try that found nothing free changed nothing: the wait gets an id of its own.
        let tried = acquire_once(c, verb, name, first, None, None, None).await?;
        if took(&tried) {
            hint.found(false, Instant::now());
            return Ok(tried);
        }
    }
    let r = acquire_once(c, verb, name, first, wait, deadline, Some(confirm)).await;
    if wait.is_some() {
        let held = !matches!(&r, Ok(v) if took(v)) || !confirm.answered_at_once();
        hint.found(held, Instant::now());
    }
    r
}

/// What a semaphore handle's acquires found lately, and how to tell a reply that took
/// the permits.
struct Hint<'a> {
    seen: &'a Contention,
    took: fn(&Value) -> bool,
}

/// One acquire call of [`acquire_call`], with its retries.
async fn acquire_once(
    c: &ClientInner,
    verb: &str,
    name: &str,
    first: u64,
    wait: Option<Option<Duration>>,
    deadline: Option<Instant>,
    confirm: Option<&Arc<Confirm>>,
) -> Result<Value> {
    let id = request_id();
    let margin = c.opts.response_timeout.unwrap_or(Duration::from_secs(3));
    c.with_retries(c.retries(), || {
        let mut cmd = redis::cmd(verb);
        cmd.arg(name).arg(first);
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        match wait {
            None => {}
            Some(None) => {
                cmd.arg("WAIT").arg(0);
            }
            Some(Some(_)) => {
                cmd.arg("WAIT").arg(ms(left.unwrap_or_default()));
            }
        }
        cmd.arg("ID").arg(&id);
        async move {
            match wait {
                None => c.run(&cmd).await,
                Some(_) => c.wait_query(left.map(|l| l + margin), &cmd, confirm).await,
            }
        }
    })
    .await
}

/// A handle on one semaphore (async). See [`crate::Semaphore`].
#[derive(Clone)]
pub struct Semaphore {
    client: Arc<ClientInner>,
    name: String,
    // Shared by the handle's clones.
    contention: Arc<Contention>,
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

    async fn once(&self, verb: &str, args: &[i64]) -> Result<i64> {
        let mut cmd = redis::cmd(verb);
        cmd.arg(&self.name).arg(args).arg("ID").arg(request_id());
        call(&self.client, cmd).await
    }

    /// Sets the permits if there is no count yet; true if set.
    pub async fn try_set_permits(&self, permits: u32) -> Result<bool> {
        Ok(self
            .once("RSEMAPHORE.TRYSETPERMITS", &[permits.into()])
            .await?
            == 1)
    }

    /// Adds (or removes) permits; the new count.
    pub async fn add_permits(&self, delta: i32) -> Result<i64> {
        self.once("RSEMAPHORE.ADDPERMITS", &[delta.into()]).await
    }

    /// Takes every available permit; how many.
    pub async fn drain(&self) -> Result<i64> {
        self.once("RSEMAPHORE.DRAINPERMITS", &[]).await
    }

    /// Returns permits without a guard; the count after. Permits taken by an acquire are
    /// returned by their guard, which knows whether the server took its grant back (see
    /// [`SemaphorePermit`]); this knows nothing of them.
    pub async fn release(&self, permits: u32) -> Result<i64> {
        self.once("RSEMAPHORE.RELEASE", &[permits.into()]).await
    }

    /// The permits available now.
    pub async fn available(&self) -> Result<i64> {
        let mut cmd = redis::cmd("RSEMAPHORE.AVAILABLEPERMITS");
        cmd.arg(&self.name);
        call(&self.client, cmd).await
    }

    async fn acquire_with(
        &self,
        permits: u32,
        wait: Option<Option<Duration>>,
    ) -> Result<Option<SemaphorePermit>> {
        let confirm = Arc::new(Confirm::default());
        let reply = acquire_call(
            &self.client,
            "RSEMAPHORE.ACQUIRE",
            &self.name,
            permits.into(),
            wait,
            &confirm,
            Hint {
                seen: &self.contention,
                took: |v| matches!(v, Value::Int(1)),
            },
        )
        .await?;
        Ok((int(reply)? == 1).then(|| SemaphorePermit {
            sem: self.clone(),
            permits,
            confirm,
            done: false,
        }))
    }

    /// Waits (in the server, without limit) for `permits` permits.
    ///
    /// # Cancel safety
    /// Dropping the future while it waits closes its connection, which takes the caller
    /// out of the server's queue (a grant not yet told is given back).
    pub async fn acquire(&self, permits: u32) -> Result<SemaphorePermit> {
        self.acquire_with(permits, Some(None))
            .await?
            .ok_or_else(|| Error::UnexpectedReply("a wait without limit answered 0".into()))
    }

    /// Takes `permits` permits if free now and nobody waits before us.
    pub async fn try_acquire(&self, permits: u32) -> Result<Option<SemaphorePermit>> {
        self.acquire_with(permits, None).await
    }

    /// Waits at most `wait` for `permits` permits.
    pub async fn acquire_timeout(
        &self,
        permits: u32,
        wait: Duration,
    ) -> Result<Option<SemaphorePermit>> {
        self.acquire_with(permits, Some(Some(wait.max(Duration::from_millis(1)))))
            .await
    }
}

/// Permits of an async [`Semaphore`].
///
/// A waiter holds its permits as soon as the server's `granted` message names it, and the
/// grant is confirmed off its path (design.md 5). Permits have no owner in the server, so
/// the release waits for that confirmation's answer (normally in long before): a grant the
/// server took back (its confirmation answered `TAKENBACK`: the ticket's connection
/// closed and nothing confirmed it within `rlock.ticket-confirm-ms`) already returned its
/// permits, and releasing them again would add permits that never existed; a release that
/// reached the server before the confirmation, from a client that then died, would have
/// the grant taken back on top of it. A confirmation left in doubt (no answer within its
/// retries: the server was unreachable for several times its grace) is released as held.
///
/// # Drop
/// Releases best-effort on the client's runtime (a spawned task, never blocking).
#[must_use = "dropping the guard releases the permits at once"]
pub struct SemaphorePermit {
    sem: Semaphore,
    permits: u32,
    confirm: Arc<Confirm>,
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

    /// False once the server is known to have taken the grant back, or its confirmation
    /// got no definite answer (the permits may be someone else's now).
    pub fn is_held(&self) -> bool {
        matches!(self.confirm.outcome_now(), None | Some(Outcome::Confirmed))
    }

    /// Returns the permits (one request id across retries); the count after.
    /// [`Error::NotHeld`] without sending anything when the server had taken the grant
    /// back (its permits are back in the pool already).
    pub async fn release(mut self) -> Result<i64> {
        self.done = true;
        give_back(&self.sem, self.permits, &self.confirm, true)
            .await?
            .ok_or_else(|| Error::NotHeld {
                key: self.sem.name.clone(),
            })
    }
}

/// Returns `permits` taken under `confirm` (one request id across retries, `retries` or
/// one attempt): the count after, or `None` without sending anything when the server had
/// taken the grant back (its permits are back in the pool already). While the grant's
/// confirmation is unanswered on the connection that heard it, the release goes right
/// behind it there, in the same write if it was still held back ([`Confirm::send_behind`]).
async fn give_back(
    sem: &Semaphore,
    permits: u32,
    confirm: &Confirm,
    retries: bool,
) -> Result<Option<i64>> {
    let mut cmd = redis::cmd("RSEMAPHORE.RELEASE");
    cmd.arg(&sem.name).arg(permits).arg("ID").arg(request_id());
    if let Some(reply) = confirm.send_behind(&cmd) {
        // Any other end (the connection broke first, a refusal, a redirection on a
        // cluster whose slot moved): as below, under the same id, which the server
        // answers from its record if the release did run.
        if let Ok(Ok(v)) = reply.await {
            return int(v).map(Some);
        }
    }
    if confirm.outcome().await == Outcome::TakenBack {
        return Ok(None);
    }
    if retries {
        call(&sem.client, cmd).await.map(Some)
    } else {
        sem.client.run(&cmd).await.and_then(int).map(Some)
    }
}

impl ReleaseOnce for SemaphorePermit {
    fn release_once(mut self) -> impl Future<Output = ()> + Send + 'static {
        self.done = true;
        release_permits_once(self.sem.clone(), self.permits, self.confirm.clone())
    }
}

/// Releases unless the grant was taken back (see [`SemaphorePermit`]).
async fn release_permits_once(sem: Semaphore, permits: u32, confirm: Arc<Confirm>) {
    let _ = give_back(&sem, permits, &confirm, false).await;
}

impl Drop for SemaphorePermit {
    fn drop(&mut self) {
        if !self.done {
            let release =
                release_permits_once(self.sem.clone(), self.permits, self.confirm.clone());
            self.sem.client.runtime.spawn(release);
        }
    }
}

/// A handle on one permit-expirable semaphore (async). See [`crate::ExpirableSemaphore`].
#[derive(Clone)]
pub struct ExpirableSemaphore {
    client: Arc<ClientInner>,
    name: String,
    // Shared by the handle's clones.
    contention: Arc<Contention>,
}

impl std::fmt::Debug for ExpirableSemaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpirableSemaphore")
            .field("name", &self.name)
            .finish()
    }
}

impl ExpirableSemaphore {
    /// The semaphore's key.
    pub fn name(&self) -> &str {
        &self.name
    }

    async fn int_call(&self, verb: &str, args: &[i64], with_id: bool) -> Result<i64> {
        let mut cmd = redis::cmd(verb);
        cmd.arg(&self.name).arg(args);
        if with_id {
            cmd.arg("ID").arg(request_id());
        }
        call(&self.client, cmd).await
    }

    /// Sets the permits if there is no count yet; true if set.
    pub async fn try_set_permits(&self, permits: u32) -> Result<bool> {
        Ok(self
            .int_call("RPSEMAPHORE.TRYSETPERMITS", &[permits.into()], true)
            .await?
            == 1)
    }

    /// Makes available + held equal `permits`; the available count.
    pub async fn set_permits(&self, permits: u32) -> Result<i64> {
        self.int_call("RPSEMAPHORE.SETPERMITS", &[permits.into()], true)
            .await
    }

    /// Adds (or removes) available permits; the new count.
    pub async fn add_permits(&self, delta: i32) -> Result<i64> {
        self.int_call("RPSEMAPHORE.ADDPERMITS", &[delta.into()], true)
            .await
    }

    /// Permits available now.
    pub async fn available(&self) -> Result<i64> {
        self.int_call("RPSEMAPHORE.AVAILABLEPERMITS", &[], false)
            .await
    }

    /// Permits held and not expired.
    pub async fn acquired(&self) -> Result<i64> {
        self.int_call("RPSEMAPHORE.ACQUIREDPERMITS", &[], false)
            .await
    }

    async fn acquire_with(
        &self,
        lease: Option<Duration>,
        wait: Option<Option<Duration>>,
    ) -> Result<Option<ExpirablePermit>> {
        if lease == Some(Duration::ZERO) {
            return Err(Error::InvalidArgument("a lease must be at least 1 ms"));
        }
        let c = &self.client;
        let (lease_ms, watchdog) = match lease {
            Some(d) => (ms(d), false),
            None => (ms(c.opts.watchdog_timeout), true),
        };
        let sent = Instant::now();
        let confirm = Arc::new(Confirm::default());
        let reply = acquire_call(
            c,
            "RPSEMAPHORE.ACQUIRE",
            &self.name,
            lease_ms,
            wait,
            &confirm,
            Hint {
                seen: &self.contention,
                took: |v| !matches!(v, Value::Nil),
            },
        )
        .await?;
        let Some(mut ids) = hex_ids(reply)? else {
            return Ok(None);
        };
        let id = ids
            .pop()
            .ok_or_else(|| Error::UnexpectedReply("no id".into()))?;
        let permit = ExpirablePermit::start(self.clone(), id, lease_ms, watchdog, sent);
        // A grant held on its message and then taken back (design.md 5): a lost permit.
        let lost = permit.shared.clone();
        confirm.on_taken_back(move || lost.mark_lost(LostReason::NotHeld));
        if watchdog && sent.elapsed() > Duration::from_millis(lease_ms / 3) {
            // Granted late in a long wait: re-arm before trusting the lease.
            if !permit.update_lease(Duration::from_millis(lease_ms)).await? {
                return Err(Error::NotHeld {
                    key: self.name.clone(),
                });
            }
        }
        Ok(Some(permit))
    }

    /// Waits (in the server, without limit) for a permit; `lease` None: the watchdog's.
    pub async fn acquire(&self, lease: Option<Duration>) -> Result<ExpirablePermit> {
        self.acquire_with(lease, Some(None))
            .await?
            .ok_or_else(|| Error::UnexpectedReply("a wait without limit answered nil".into()))
    }

    /// Takes a permit if one is free now and nobody waits before us.
    pub async fn try_acquire(&self, lease: Option<Duration>) -> Result<Option<ExpirablePermit>> {
        self.acquire_with(lease, None).await
    }

    /// Waits at most `wait` for a permit.
    pub async fn acquire_timeout(
        &self,
        lease: Option<Duration>,
        wait: Duration,
    ) -> Result<Option<ExpirablePermit>> {
        self.acquire_with(lease, Some(Some(wait.max(Duration::from_millis(1)))))
            .await
    }
}

#[derive(Default)]
struct PermitState {
    lost: Option<LostReason>,
    done: bool,
    deadline: Option<Instant>,
    callbacks: Vec<Box<dyn FnOnce(LostReason) + Send + 'static>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<PermitState>,
    changed: Notify,
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
        self.changed.notify_waiters();
        for f in callbacks {
            f(reason);
        }
    }
}

/// One permit of an async [`ExpirableSemaphore`]. See [`crate::ExpirablePermit`]; the
/// renewal runs as a task on the client's runtime.
///
/// # Drop
/// Stops the renewal and releases best-effort on the client's runtime.
#[must_use = "dropping the guard releases the permit at once"]
pub struct ExpirablePermit {
    sem: ExpirableSemaphore,
    id: String,
    shared: Arc<Shared>,
    task: tokio::task::AbortHandle,
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
        let shared = Arc::new(Shared::default());
        lock_ignoring_poison(&shared.state).deadline = Some(at + lease);
        let (s, c, name, pid) = (
            shared.clone(),
            sem.client.clone(),
            sem.name.clone(),
            id.clone(),
        );
        let task = sem
            .client
            .runtime
            .spawn(async move { watch(&s, &c, &name, &pid, lease, watchdog).await })
            .abort_handle();
        ExpirablePermit {
            sem,
            id,
            shared,
            task,
            done: false,
        }
    }

    /// The permit id (32 hex digits).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// False once the permit is known lost or its lease ran out.
    pub fn is_held(&self) -> bool {
        let st = lock_ignoring_poison(&self.shared.state);
        st.lost.is_none() && st.deadline.is_none_or(|d| Instant::now() < d)
    }

    /// Why the permit was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        lock_ignoring_poison(&self.shared.state).lost
    }

    /// Completes when the permit is lost.
    pub async fn lost(&self) -> LostReason {
        loop {
            let notified = self.shared.changed.notified();
            if let Some(r) = self.lost_reason() {
                return r;
            }
            notified.await;
        }
    }

    /// Runs `f` once the permit is lost (at once if it already is).
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        let mut st = lock_ignoring_poison(&self.shared.state);
        match st.lost {
            Some(r) => {
                drop(st);
                f(r);
            }
            None => st.callbacks.push(Box::new(f)),
        }
    }

    /// Re-arms the lease to `lease` from now; false when the permit is not held.
    pub async fn update_lease(&self, lease: Duration) -> Result<bool> {
        let now = Instant::now();
        let mut cmd = redis::cmd("RPSEMAPHORE.UPDATELEASETIME");
        cmd.arg(&self.sem.name).arg(&self.id).arg(ms(lease));
        let held = call(&self.sem.client, cmd).await? == 1;
        if held {
            lock_ignoring_poison(&self.shared.state).deadline = Some(now + lease);
        } else {
            self.shared.mark_lost(LostReason::NotHeld);
        }
        Ok(held)
    }

    fn stop(&mut self) {
        self.done = true;
        lock_ignoring_poison(&self.shared.state).done = true;
        self.task.abort();
    }

    /// Releases the permit; [`Error::NotHeld`] when the server no longer had it.
    pub async fn release(mut self) -> Result<()> {
        self.stop();
        let mut cmd = redis::cmd("RPSEMAPHORE.RELEASE");
        cmd.arg(&self.sem.name)
            .arg(&self.id)
            .arg("ID")
            .arg(request_id());
        match call(&self.sem.client, cmd).await? {
            1 => Ok(()),
            _ => Err(Error::NotHeld {
                key: self.sem.name.clone(),
            }),
        }
    }
}

impl ReleaseOnce for ExpirablePermit {
    fn release_once(mut self) -> impl Future<Output = ()> + Send + 'static {
        self.stop();
        release_permit_once(self.sem.clone(), self.id.clone())
    }
}

async fn release_permit_once(sem: ExpirableSemaphore, id: String) {
    let mut cmd = redis::cmd("RPSEMAPHORE.RELEASE");
    cmd.arg(&sem.name).arg(&id).arg("ID").arg(request_id());
    let _ = sem.client.run(&cmd).await;
}

impl Drop for ExpirablePermit {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.stop();
        let release = release_permit_once(self.sem.clone(), self.id.clone());
        self.sem.client.runtime.spawn(release);
    }
}

/// Renews a watchdog lease every third of it, or waits out a fixed one; reports loss.
async fn watch(s: &Shared, c: &ClientInner, name: &str, id: &str, lease: Duration, watchdog: bool) {
    let every = (lease / 3).max(Duration::from_millis(1));
    loop {
        let (deadline, done) = {
            let st = lock_ignoring_poison(&s.state);
            (
                st.deadline.unwrap_or_else(Instant::now),
                st.done || st.lost.is_some(),
            )
        };
        if done {
            return;
        }
        let now = Instant::now();
        if now >= deadline {
            s.mark_lost(LostReason::LeaseExpired);
            return;
        }
        let next = if watchdog {
            deadline
                .checked_sub(lease)
                .map_or(now, |t| t + every)
                .min(deadline)
        } else {
            deadline
        };
        if now < next {
            tokio::time::sleep(next - now).await;
            continue;
        }
        let sent = Instant::now();
        let mut cmd = redis::cmd("RPSEMAPHORE.UPDATELEASETIME");
        cmd.arg(name).arg(id).arg(ms(lease));
        match c.run(&cmd).await.and_then(int) {
            Ok(1) => lock_ignoring_poison(&s.state).deadline = Some(sent + lease),
            Ok(_) => {
                s.mark_lost(LostReason::NotHeld);
                return;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(10).min(every)).await,
        }
    }
}
