//! Option builders: one per scope (client, acquire, retry), each with `DEFAULT_*`
//! constants and `with_*` setters, so that new options are new methods rather than
//! new positional parameters.

use std::time::{Duration, Instant};

use crate::proto::backoff::Jitter;

/// How operations that fail transiently (connection loss, timeout, `LOADING`,
/// `TRYAGAIN`, ...) are retried: capped exponential backoff with jitter.
///
/// A retried acquire or release resends the same request id (`ID <uuid>`), so the
/// server answers a retry of a call that did take effect with its first reply; nothing
/// is applied twice as long as the retries end within the module's
/// `rlock.request-id-window-ms` (60 s by default), which the default policy does by far.
///
/// The delay before retry `n` (counting from 0) is drawn uniformly from
/// `[d/2, d]` where `d = min(max_delay, base_delay * 2^n)`; the jitter keeps many
/// clients that failed together from retrying together.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use rlock_client::RetryPolicy;
///
/// let retry = RetryPolicy::new()
///     .with_max_attempts(5)
///     .with_base_delay(Duration::from_millis(20))
///     .with_max_delay(Duration::from_secs(1));
/// assert_eq!(retry.max_attempts(), 5);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    base_delay: Duration,
    max_delay: Duration,
}

impl RetryPolicy {
    /// Attempts in all, the first included.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 4;
    /// Delay before the first retry (before jitter).
    pub const DEFAULT_BASE_DELAY: Duration = Duration::from_millis(50);
    /// Upper bound of any single delay.
    pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(2);

    /// The default policy.
    pub fn new() -> Self {
        RetryPolicy {
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            base_delay: Self::DEFAULT_BASE_DELAY,
            max_delay: Self::DEFAULT_MAX_DELAY,
        }
    }

    /// A policy that never retries.
    ///
    /// ```
    /// assert_eq!(rlock_client::RetryPolicy::none().max_attempts(), 1);
    /// ```
    pub fn none() -> Self {
        Self::new().with_max_attempts(1)
    }

    /// Attempts in all, the first included (at least 1).
    pub fn with_max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n.max(1);
        self
    }

    /// Delay before the first retry.
    pub fn with_base_delay(mut self, d: Duration) -> Self {
        self.base_delay = d;
        self
    }

    /// Upper bound of any single delay.
    pub fn with_max_delay(mut self, d: Duration) -> Self {
        self.max_delay = d;
        self
    }

    /// Attempts in all.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// Delay before the first retry.
    pub fn base_delay(&self) -> Duration {
        self.base_delay
    }

    /// Upper bound of any single delay.
    pub fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// The delay before retry number `retry` (0 = the first retry), jittered.
    pub(crate) fn delay(&self, retry: u32, jitter: &Jitter) -> Duration {
        let cap = self.max_delay.max(Duration::from_millis(1));
        let exp = self
            .base_delay
            .checked_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(cap)
            .min(cap);
        let half = exp / 2;
        half + jitter.up_to(exp - half)
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

/// Replica safety: after each acquire, `WAIT replicas timeout` on the lock's node;
/// when fewer replicas acknowledge, the lock is released again and the acquire
/// fails with [`Error::ReplicaSync`](crate::Error::ReplicaSync).
///
/// On by default, as Redisson's `checkLockSyncedSlaves`: [`ReplicaSync::connected`]
/// waits for every replica the node has (read with `ROLE`, or `CLUSTER SLOTS` on a
/// cluster, at most once a second), and costs nothing where there is none.
/// [`ClientOptions::with_replica_sync`]`(None)` turns it off; [`ReplicaSync::new`]
/// asks for a fixed number.
///
/// This narrows, but does not close, the window in which a failover to a replica
/// that never saw the lock lets a second client take it: the crate's README,
/// "Replicas and failover", says exactly what is guaranteed.
///
/// ```
/// use std::time::Duration;
/// let r = rlock_client::ReplicaSync::new(1, Duration::from_millis(500));
/// assert_eq!(r.replicas(), Some(1));
/// let all = rlock_client::ReplicaSync::connected(Duration::from_secs(1));
/// assert_eq!(all.replicas(), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaSync {
    // None: every replica the node has.
    replicas: Option<u32>,
    timeout: Duration,
}

impl ReplicaSync {
    /// How long the default waits for the replicas: Redisson's `slavesSyncTimeout`.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

    /// Require `replicas` acknowledgements within `timeout`.
    pub fn new(replicas: u32, timeout: Duration) -> Self {
        ReplicaSync {
            replicas: Some(replicas),
            timeout,
        }
    }

    /// Require every replica connected to the lock's node (none: no check) to
    /// acknowledge within `timeout`.
    pub fn connected(timeout: Duration) -> Self {
        ReplicaSync {
            replicas: None,
            timeout,
        }
    }

    /// Replicas required; `None`: every connected one.
    pub fn replicas(&self) -> Option<u32> {
        self.replicas
    }

    /// How long to wait for them.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// Options shared by every lock of one client.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use rlock_client::{ClientOptions, RetryPolicy};
///
/// let opts = ClientOptions::new()
///     .with_watchdog_timeout(Duration::from_secs(9))
///     .with_retry(RetryPolicy::none());
/// assert_eq!(opts.renew_interval(), Duration::from_secs(3));
/// ```
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub(crate) watchdog_timeout: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) response_timeout: Option<Duration>,
    pub(crate) replica_sync: Option<ReplicaSync>,
    pub(crate) idle_wait_connections: usize,
    // Queued tickets (design.md 5): how waiting calls wait.
    pub(crate) wait_mode: WaitMode,
    // Module or Redisson's scripts (docs/scripts-mode.md).
    pub(crate) mode: Mode,
}

impl ClientOptions {
    /// Lease of locks taken without an explicit lease; Redisson's
    /// `lockWatchdogTimeout` default.
    pub const DEFAULT_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(30);
    /// How long a non-waiting command may take before it counts as a transient
    /// failure (and is retried on a fresh connection).
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(3);
    /// Connections kept open for waiting acquires once their wait is over.
    pub const DEFAULT_IDLE_WAIT_CONNECTIONS: usize = 4;

    /// The defaults.
    pub fn new() -> Self {
        ClientOptions {
            watchdog_timeout: Self::DEFAULT_WATCHDOG_TIMEOUT,
            retry: RetryPolicy::new(),
            response_timeout: Some(Self::DEFAULT_RESPONSE_TIMEOUT),
            replica_sync: Some(ReplicaSync::connected(ReplicaSync::DEFAULT_TIMEOUT)),
            idle_wait_connections: Self::DEFAULT_IDLE_WAIT_CONNECTIONS,
            wait_mode: WaitMode::Auto,
            mode: Mode::Auto,
        }
    }

    /// Lease of locks taken without an explicit lease. Such locks are renewed every
    /// third of it for as long as they are held (at least 3 ms).
    pub fn with_watchdog_timeout(mut self, d: Duration) -> Self {
        self.watchdog_timeout = d.max(Duration::from_millis(3));
        self
    }

    /// How transient failures of acquire, release and renewal are retried.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Read timeout of non-waiting commands (`None`: wait forever).
    pub fn with_response_timeout(mut self, d: Option<Duration>) -> Self {
        self.response_timeout = d;
        self
    }

    /// Replica safety for every acquire of this client (see [`ReplicaSync`]; on by
    /// default, `None` turns it off).
    pub fn with_replica_sync(mut self, r: Option<ReplicaSync>) -> Self {
        self.replica_sync = r;
        self
    }

    /// Connections kept open for waiting acquires once their wait is over.
    pub fn with_idle_wait_connections(mut self, n: usize) -> Self {
        self.idle_wait_connections = n;
        self
    }

    /// How waiting calls wait (queued tickets or a blocked connection each); see
    /// [`WaitMode`].
    pub fn with_wait_mode(mut self, mode: WaitMode) -> Self {
        self.wait_mode = mode;
        self
    }

    /// How waiting calls wait.
    pub fn wait_mode(&self) -> WaitMode {
        self.wait_mode
    }

    /// Whether the primitives run on the module's commands or on Redisson's own Lua
    /// scripts; see [`Mode`].
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The mode setting (what the probe found: [`crate::aio::Client::mode`]).
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The watchdog timeout.
    pub fn watchdog_timeout(&self) -> Duration {
        self.watchdog_timeout
    }

    /// How often watchdog locks are renewed: a third of the watchdog timeout.
    pub fn renew_interval(&self) -> Duration {
        self.watchdog_timeout / 3
    }

    /// The retry policy.
    pub fn retry(&self) -> &RetryPolicy {
        &self.retry
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// How the waiting calls of a client (acquires that wait, latch awaits) wait in the server.
///
/// With queued tickets (`WAIT t ASYNC`, docs/commands/tickets.md) all waiting calls of a client
/// share one connection, however many there are; with blocking `WAIT` each waiting
/// call holds a connection of its own while it waits.
///
/// ```
/// use rlock_client::{ClientOptions, WaitMode};
/// let opts = ClientOptions::new().with_wait_mode(WaitMode::Blocking);
/// assert_eq!(opts.wait_mode(), WaitMode::Blocking);
/// assert_eq!(ClientOptions::new().wait_mode(), WaitMode::Auto);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// Tickets where the module supports them (the first `ASYNC` it refuses switches
    /// the client to blocking `WAIT` for good); on a cluster, one ticket connection per
    /// node, and blocking `WAIT` for a call whose slot is half-way through a migration.
    Auto,
    /// Always tickets (a module without them answers every wait with an error);
    /// on a cluster, blocking `WAIT` for a call whose slot is half-way through a
    /// migration all the same.
    Tickets,
    /// Always a blocked `WAIT` on a connection of its own per waiting call.
    Blocking,
}

/// Which backend runs the primitives (docs/scripts-mode.md).
///
/// ```
/// use rlock_client::{ClientOptions, Mode};
/// assert_eq!(ClientOptions::new().mode(), Mode::Auto);
/// let opts = ClientOptions::new().with_mode(Mode::Scripts);
/// assert_eq!(opts.mode(), Mode::Scripts);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The module where the server has it, else Redisson's scripts. The client asks
    /// (`RLOCK.HELLO`; "unknown command" means no module) at its first primitive call,
    /// and again after a connection error, when a module command comes back unknown (a
    /// failover to a server without the module), and in scripts mode every 30 s and when
    /// its subscriber connection breaks.
    Auto,
    /// The module's commands; where the module is absent they fail with the server's
    /// `unknown command`.
    Module,
    /// Redisson's scripts and pub/sub, also where the module is loaded (both
    /// interoperate on the same names): for any Redis or Valkey, managed ones included.
    Scripts,
}

/// How long an acquire may wait for a lock held by someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Do not wait: fail at once when it is held (`try_acquire`).
    No,
    /// Wait at most this long, in the server.
    Up(Duration),
    /// Wait without a limit, in the server.
    Forever,
}

/// Options of one acquire.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use rlock_client::{AcquireOptions, Wait};
///
/// // Wait up to 2 s; hold for at most 10 s, with no renewal.
/// let opts = AcquireOptions::new()
///     .with_wait(Wait::Up(Duration::from_secs(2)))
///     .with_lease(Duration::from_secs(10));
/// assert_eq!(opts.lease(), Some(Duration::from_secs(10)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcquireOptions {
    pub(crate) wait: Wait,
    pub(crate) lease: Option<Duration>,
}

impl AcquireOptions {
    /// Wait forever, watchdog lease.
    pub fn new() -> Self {
        AcquireOptions {
            wait: Wait::Forever,
            lease: None,
        }
    }

    /// How long to wait when the lock is held by someone else.
    pub fn with_wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// A fixed lease: the lock expires this long after the acquire and is never
    /// renewed. `None` (the default) selects the watchdog: the lease is the client's
    /// watchdog timeout, renewed every third of it while the guard lives.
    pub fn with_lease(mut self, lease: impl Into<Option<Duration>>) -> Self {
        self.lease = lease.into();
        self
    }

    /// The wait.
    pub fn wait(&self) -> Wait {
        self.wait
    }

    /// The fixed lease, if any.
    pub fn lease(&self) -> Option<Duration> {
        self.lease
    }

    /// The lease an acquire asks for on a client whose watchdog timeout is `watchdog`.
    pub(crate) fn lease_or(&self, watchdog: Duration) -> Duration {
        self.lease.unwrap_or(watchdog)
    }

    /// When a limited wait that starts `now` ends (None: no limit, or no wait).
    pub(crate) fn wait_until(&self, now: Instant) -> Option<Instant> {
        match self.wait {
            Wait::Up(d) => Some(now + d),
            _ => None,
        }
    }
}

impl Default for AcquireOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// Milliseconds for the wire, at least 1 (a lease or wait of 0 ms has another
/// meaning to the server, or none).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_grows_the_delay_exponentially_up_to_the_cap() {
        let p = RetryPolicy::new()
            .with_base_delay(Duration::from_millis(100))
            .with_max_delay(Duration::from_millis(700));
        let j = Jitter::seeded(7);
        // Table: retry number -> the undithered delay d; the drawn delay is in [d/2, d].
        for (retry, d) in [(0, 100), (1, 200), (2, 400), (3, 700), (10, 700), (40, 700)] {
            for _ in 0..50 {
                let got = p.delay(retry, &j);
                let d = Duration::from_millis(d);
                assert!(
                    got >= d / 2 && got <= d,
                    "retry {retry}: {got:?} not in [{:?}, {d:?}]",
                    d / 2
                );
            }
        }
    }

    #[test]
    fn it_jitters_the_delay() {
        let p = RetryPolicy::new().with_base_delay(Duration::from_millis(1000));
        let j = Jitter::seeded(1);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..20 {
            seen.insert(p.delay(0, &j));
        }
        assert!(seen.len() > 5, "delays not spread: {seen:?}");
    }

    #[test]
    fn it_keeps_at_least_one_attempt() {
        assert_eq!(RetryPolicy::new().with_max_attempts(0).max_attempts(), 1);
    }

    #[test]
    fn it_renews_every_third_of_the_watchdog_timeout() {
        let o = ClientOptions::new();
        assert_eq!(o.watchdog_timeout(), Duration::from_secs(30));
        assert_eq!(o.renew_interval(), Duration::from_secs(10));
        let o = o.with_watchdog_timeout(Duration::from_millis(900));
        assert_eq!(o.renew_interval(), Duration::from_millis(300));
    }

    #[test]
    fn it_never_sends_zero_milliseconds() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 1);
        assert_eq!(millis(Duration::from_secs(2)), 2000);
    }

    #[test]
    fn it_defaults_to_waiting_forever_with_the_watchdog() {
        let o = AcquireOptions::default();
        assert_eq!(o.wait(), Wait::Forever);
        assert_eq!(o.lease(), None);
    }
}
