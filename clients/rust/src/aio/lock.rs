//! The async [`Lock`] and [`LockGuard`]: acquiring (the loop that runs `proto::logic`'s
//! decisions over the client's connections), releasing, and the guard's lost signal.
//! The blocking API's lock wraps these (`blocking/lock.rs`).

use super::*;

/// A handle on one lock, as one owner; see [`crate::Lock`].
pub struct Lock {
    pub(super) client: Arc<ClientInner>,
    pub(super) shared: Arc<LockShared>,
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.shared.key)
            .field("owner", &self.shared.owner)
            .finish()
    }
}

impl Lock {
    /// The lock's name (its key).
    pub fn name(&self) -> &str {
        &self.shared.key
    }

    /// This handle's owner id.
    pub fn owner(&self) -> &str {
        &self.shared.owner
    }

    /// This handle's hold count as the client knows it (0: not held).
    pub fn hold_count(&self) -> u64 {
        self.shared.local_holds()
    }

    /// Takes the lock, waiting in the server without limit; watchdog lease.
    ///
    /// # Cancel safety
    /// With queued tickets (the default where the module has them; see
    /// [`WaitMode`](crate::WaitMode)), dropping the future leaves its ticket queued until
    /// its wait ends in the server; if it is granted meanwhile, the client collects the
    /// grant and releases it at once. With blocking `WAIT` (`WaitMode::Blocking`,
    /// or a cluster slot half-way through a migration), dropping the future closes its private connection, which
    /// takes it out of the server's queue; if the server handed it the lock at that very
    /// moment, the lock stays held until its lease runs out (it is never renewed).
    pub async fn acquire(&self) -> Result<LockGuard> {
        logic::taken(
            self.acquire_with(AcquireOptions::new()).await?,
            "RLOCK.ACQUIRE WAIT 0 timed out",
        )
    }

    /// Takes the lock if it is free (or already ours); never waits.
    ///
    /// ```no_run
    /// # async fn run(client: rlock_client::aio::Client) -> rlock_client::Result<()> {
    /// if let Some(guard) = client.lock("k").try_acquire().await? {
    ///     guard.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::No))
            .await
    }

    /// Takes the lock, waiting in the server at most `wait`.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<LockGuard>> {
        self.acquire_with(AcquireOptions::new().with_wait(Wait::Up(wait)))
            .await
    }

    /// Takes the lock with explicit options.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_with(&self, opts: AcquireOptions) -> Result<Option<LockGuard>> {
        self.acquire_as(opts, cmd::ACQUIRE, cmd::parse_acquire)
            .await
    }

    /// [`Self::acquire_with`] sending `command` (the fenced lock's `RFENCED.ACQUIRE`,
    /// same arguments) and reading each reply with `parse` (which may keep what else
    /// the reply carries: the fencing token).
    pub(crate) async fn acquire_as(
        &self,
        opts: AcquireOptions,
        command: &'static str,
        mut parse: impl FnMut(Value) -> Result<cmd::Acquired>,
    ) -> Result<Option<LockGuard>> {
        let c = &self.client;
        let shared = &self.shared;
        let mut run = Acquiring::new(shared, opts, &c.opts, &c.jitter)?.with_command(command);
        // A ticket's grant is held on its message and confirmed off the path (design.md
        // 5); if it turns out taken back, the hold is reported lost.
        let mut confirm = None;
        loop {
            let sent = Instant::now();
            let (command, route) = run.attempt(shared, sent);
            let reply = match route {
                Route::Shared => c.run(&command).await,
                Route::Waiting { limit } => {
                    let this = confirm.insert(Arc::new(Confirm::default()));
                    c.wait_query(limit, &command, Some(this)).await
                }
            };
            let mut next = run.after_attempt(&**c, shared, sent, reply.and_then(&mut parse));
            if let Next::Renew = next {
                let sent = Instant::now();
                let renew = run.renew_command(shared);
                let renewed = c
                    .with_retries(c.retries(), || c.run(&renew))
                    .await
                    .and_then(cmd::parse_renew);
                next = run.after_renew(&**c, shared, sent, renewed);
            }
            match next {
                Next::Taken => break,
                Next::Renew | Next::Again => {}
                Next::Backoff(pause) => tokio::time::sleep(pause).await,
                Next::NotTaken => {
                    run.found_held(shared);
                    return Ok(None);
                }
                Next::Fail(e) => return Err(e),
            }
        }
        run.found(
            shared,
            confirm.as_ref().is_some_and(|c| !c.answered_at_once()),
        );
        let took = run.finish(&**c, shared);
        if let Some(confirm) = &confirm {
            let (lost, epoch) = (shared.clone(), took.epoch);
            confirm.on_taken_back(move || {
                lost.mark_lost(epoch, LostReason::NotHeld);
            });
        }
        let guard = LockGuard {
            client: c.clone(),
            shared: shared.clone(),
            epoch: took.epoch,
            release_lease_ms: took.release_lease_ms,
            confirm,
            done: false,
        };
        if let Some(rs) = c.opts.replica_sync {
            let wanted = match rs.replicas() {
                Some(n) => n,
                None => c.connected_replicas(shared.key.as_bytes()).await,
            };
            if wanted == 0 {
                return Ok(Some(guard));
            }
            let (pipe, limit) =
                logic::replica_check(shared, took.lease_ms, rs, wanted, c.backend.scripts_now());
            let reply = c
                .on_wait_conn(Some(limit), |mut conn| async move {
                    let r = pipe.query_async::<Vec<Value>>(&mut conn).await;
                    (conn, r)
                })
                .await;
            if let Err(e) = logic::replica_outcome(shared, wanted, reply) {
                let _ = guard.release().await;
                return Err(e);
            }
        }
        Ok(Some(guard))
    }
}

impl Lock {
    /// Another handle on the same owner state, for a thread of a combined lock. Only
    /// one operation may run on a handle at a time; the caller sees to that.
    pub(crate) fn same_handle(&self) -> Lock {
        Lock {
            client: self.client.clone(),
            shared: self.shared.clone(),
        }
    }

    /// The lease an acquire with `opts` asks for.
    pub(crate) fn lease_for(&self, opts: &AcquireOptions) -> Duration {
        opts.lease_or(self.client.opts.watchdog_timeout)
    }
}

/// Releases one hold of `epoch`, retrying transient failures (if `retries`) without
/// releasing twice (the command's request id). A hold granted by a ticket's message
/// whose confirmation is still unanswered releases right behind it on the connection
/// that heard the grant, in the same write while it is held back
/// ([`Confirm::send_behind`]): the server then reads both at once and answers both in
/// one write, so the handoff costs it what a blocked one does (design.md 5). If that
/// connection breaks first, the usual path sends it again under the same id.
async fn release_inner(
    c: &ClientInner,
    shared: &LockShared,
    epoch: u64,
    lease_ms: Option<u64>,
    retries: bool,
    confirm: Option<&Confirm>,
) -> Result<ReleaseOutcome> {
    let command = logic::begin_release(c, shared, epoch, lease_ms)?;
    if let Some(reply) = confirm.and_then(|k| k.send_behind(&command)) {
        if let Ok(Ok(v)) = reply.await {
            return logic::released(c, shared, epoch, cmd::parse_release(v)?);
        }
    }
    let retries = if retries {
        c.retries()
    } else {
        c.retries().once()
    };
    let reply = c
        .with_retries(retries, || async {
            c.run(&command).await.and_then(cmd::parse_release)
        })
        .await?;
    logic::released(c, shared, epoch, reply)
}

/// One hold of a lock, async; see [`crate::LockGuard`].
///
/// # Drop
/// Dropping the guard stops its renewal at once and spawns one best-effort
/// `RLOCK.RELEASE` (no retries) on the client's runtime: it never blocks, and it
/// works from any thread. Its outcome is not reported; if it cannot run (the runtime
/// is shutting down) the lock expires with its lease.
///
/// # Cancel safety
/// [`release`](Self::release) consumes the guard: if its future is dropped before
/// completing, the release may or may not have reached the server, renewal has
/// stopped, and the lock is freed by the server or expires with its lease. The
/// [`lost`](Self::lost) future is cancel safe.
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: rlock_client::aio::Client) -> rlock_client::Result<()> {
/// let guard = client.lock("k").acquire().await?;
/// tokio::select! {
///     _ = do_work() => guard.release().await.map(drop)?,
///     why = guard.lost() => eprintln!("lock lost ({why:?}); work abandoned"),
/// }
/// # Ok(()) }
/// # async fn do_work() {}
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    client: Arc<ClientInner>,
    shared: Arc<LockShared>,
    epoch: u64,
    release_lease_ms: Option<u64>,
    /// The confirmation of the ticket grant this hold came from, if any: its release
    /// may ride behind it.
    confirm: Option<Arc<Confirm>>,
    done: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.shared.key)
            .field("owner", &self.shared.owner)
            .field("held", &self.is_held())
            .finish()
    }
}

impl LockGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.shared.key
    }

    /// The owner id holding it.
    pub fn owner(&self) -> &str {
        &self.shared.owner
    }

    /// Whether the lock is still held, as far as this client knows (no round trip).
    pub fn is_held(&self) -> bool {
        self.shared.is_held(self.epoch)
    }

    /// Why the lock was lost, if it was.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.lost_reason(self.epoch)
    }

    /// Completes when the lock is lost (`Some(reason)`) or released through another
    /// guard of the same handle (`None`). Cancel safe.
    pub fn lost(&self) -> Lost<'_> {
        Lost {
            shared: &self.shared,
            epoch: self.epoch,
        }
    }

    /// Calls `f` once when the lock is lost, or at once if it already was. It runs on
    /// whichever thread finds the loss, usually the client's renewal worker, which
    /// serves all its locks: keep it short and non-blocking. It has run by the time
    /// `wait_lost` or `lost()` report the loss. It is dropped uncalled if the lock is
    /// released normally.
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        self.shared.on_lost(self.epoch, Box::new(f));
    }

    /// Releases this hold, retrying transient failures.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the lock was no longer held by this owner.
    ///
    /// # Cancel safety
    /// See the type's documentation.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        self.done = true;
        release_inner(
            &self.client,
            &self.shared,
            self.epoch,
            self.release_lease_ms,
            true,
            self.confirm.as_deref(),
        )
        .await
    }
}

impl LockGuard {
    /// When the lease must have run out, by this client's clock (None: not held).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.shared.deadline(self.epoch)
    }

    /// Blocks the calling thread until the lock is lost (`Some(reason)`), `timeout`
    /// passes, or the lock is released through another guard of the same handle
    /// (`None`): the blocking API's `wait_lost`, on the handle's own condition variable.
    pub(crate) fn wait_lost(&self, timeout: Option<Duration>) -> Option<LostReason> {
        self.shared.wait_lost(self.epoch, timeout)
    }

    /// Marks the guard done and stops its renewal; what a best-effort release needs.
    fn give_up(&mut self) -> BestEffort {
        self.done = true;
        if self.shared.current(self.epoch) == Some(1) {
            self.client.unregister(self.shared.handle);
        }
        BestEffort {
            client: self.client.clone(),
            shared: self.shared.clone(),
            epoch: self.epoch,
            lease_ms: self.release_lease_ms,
            confirm: self.confirm.take(),
        }
    }
}

/// What a guard's best-effort release needs, taken from it.
struct BestEffort {
    client: Arc<ClientInner>,
    shared: Arc<LockShared>,
    epoch: u64,
    lease_ms: Option<u64>,
    confirm: Option<Arc<Confirm>>,
}

impl BestEffort {
    /// One `RLOCK.RELEASE` (no retries), outcome ignored.
    async fn run(self) {
        let b = self;
        let confirm = b.confirm.as_deref();
        let _ = release_inner(&b.client, &b.shared, b.epoch, b.lease_ms, false, confirm).await;
    }
}

impl ReleaseOnce for LockGuard {
    /// One `RLOCK.RELEASE` (no retries), outcome ignored.
    fn release_once(mut self) -> impl Future<Output = ()> + Send + 'static {
        self.give_up().run()
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let release = self.give_up();
        let rt = release.client.runtime.clone();
        drop(rt.spawn(release.run()));
    }
}
