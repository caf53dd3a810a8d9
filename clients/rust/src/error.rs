//! The crate's error type and the mapping from server replies to it.

use std::fmt;

/// What can go wrong when taking, renewing or releasing a lock.
///
/// Server error replies keep their Redis code (`ERR`, `WRONGTYPE`, ...), as redis-rs
/// does, so callers can match on what the module said rather than on message text.
///
/// # Examples
///
/// ```
/// use rlock_client::Error;
///
/// fn explain(err: &Error) -> &'static str {
///     match err {
///         Error::NotHeld { .. } => "the critical section ran without the lock",
///         Error::ReplicaSync { .. } => "too few replicas acknowledged the lock",
///         _ if err.is_transient() => "try again later",
///         _ => "a bug or a misconfiguration",
///     }
/// }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The lock was no longer held by this owner when it was released (or renewed):
    /// it expired, was force-released, or was never taken. The work done under the
    /// guard ran unprotected for some time, and the caller must know.
    NotHeld {
        /// The lock's key.
        key: String,
    },
    /// Replica safety was asked for and fewer replicas than required acknowledged the
    /// acquire within the timeout. The lock has been released again (best-effort) so
    /// that it is not left behind, as Redisson's `checkLockSyncedSlaves` does.
    ReplicaSync {
        /// The lock's key.
        key: String,
        /// Replicas required.
        wanted: u32,
        /// Replicas that acknowledged.
        acked: u32,
    },
    /// The key exists and holds a value of another type (`WRONGTYPE ...`).
    WrongType(String),
    /// Any other error reply of the server, with its code (`ERR`, `NOPERM`, ...) and text.
    Server {
        /// The error code, the first word of the reply (`ERR`).
        code: String,
        /// The rest of the reply.
        message: String,
    },
    /// A reply the client does not understand: the module does not speak the protocol
    /// this crate was written against.
    UnexpectedReply(String),
    /// An option was out of range (a zero lease, for example).
    InvalidArgument(&'static str),
    /// A connection or transport error that outlived the retries.
    Redis(redis::RedisError),
    /// Scripts mode only: the connection broke (or the reply timed out) after a script
    /// that must not run twice (a semaphore release, a latch count-down, an acquire...)
    /// was sent, so it may or may not have been applied, and it was not sent again:
    /// without the module there is no request id to make a second run harmless
    /// (docs/scripts-mode.md). Also when such a script was applied and the read that
    /// gives the call's answer failed. Not transient: retrying blindly is the caller's
    /// choice, knowing that the first try may have counted.
    OutcomeUnknown {
        /// The script (its file name in the crate's `lua/`).
        script: &'static str,
        /// The failure that left the outcome unknown.
        cause: redis::RedisError,
    },
}

/// What a refusal of the module means, read from the code word its error reply starts
/// with (the module's `src/vocab/errors.rs` states the scheme). [`Error::Server`] keeps the
/// code itself; this is its kind, for callers that branch on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// An argument out of its range or shape (`BADLEASE`, `BADOWNER`, `BADPERMITS`, ...).
    BadArgument,
    /// The key holds something that is not this primitive (`NOTALOCK`, `NOTASEMAPHORE`,
    /// ...; Redis's `WRONGTYPE` is [`Error::WrongType`]).
    NotThisPrimitive,
    /// A count, a token or a permit total would overflow (`OVERFLOW`).
    Overflow,
    /// The key's waiter limit is reached (`TOOMANYWAITERS`, `rlock.max-waiters-per-key`).
    TooManyWaiters,
    /// An owner's read holds are at their limit (`TOOMANYHOLDS`).
    TooManyHolds,
    /// A holder of the read lock asked for the write lock, a wait that could never end
    /// (`READHELD`).
    ReadHeld,
    /// An internal command sent by a client, or its payload malformed (`INTERNALCMD`,
    /// `BADPAYLOAD`).
    Internal,
    /// A bug in the module, caught (`RLOCKBUG`; details in the server log).
    ModuleBug,
}

impl Refusal {
    /// The kind of a module error code word; `None` for codes that are not the module's
    /// (`ERR`, `NOPERM`, ...).
    pub fn of(code: &str) -> Option<Refusal> {
        Some(match code {
            "OVERFLOW" => Refusal::Overflow,
            "TOOMANYWAITERS" => Refusal::TooManyWaiters,
            "TOOMANYHOLDS" => Refusal::TooManyHolds,
            "READHELD" => Refusal::ReadHeld,
            "INTERNALCMD" | "BADPAYLOAD" => Refusal::Internal,
            "RLOCKBUG" => Refusal::ModuleBug,
            c if c.starts_with("NOTA") => Refusal::NotThisPrimitive,
            c if c.starts_with("BAD") => Refusal::BadArgument,
            _ => return None,
        })
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The kind of the module's refusal, when this is one ([`Error::Server`] with one of
    /// the module's code words).
    ///
    /// ```
    /// use rlock_client::{Error, Refusal};
    /// fn worth_reporting(err: &Error) -> bool {
    ///     matches!(err.refusal(), Some(Refusal::ModuleBug | Refusal::Internal))
    /// }
    /// ```
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::Server { code, .. } => Refusal::of(code),
            _ => None,
        }
    }

    /// Whether retrying the same operation later could succeed: connection losses,
    /// timeouts, and the server's own "not now" replies (`LOADING`, `TRYAGAIN`,
    /// `CLUSTERDOWN`, `MASTERDOWN`, `READONLY` during a failover).
    ///
    /// ```
    /// use rlock_client::Error;
    /// assert!(!Error::NotHeld { key: "k".into() }.is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Redis(e) => is_transient(e),
            Error::Server { code, .. } => TRANSIENT_CODES.contains(&code.as_str()),
            _ => false,
        }
    }
}

/// Server codes that mean "the server cannot serve this right now", not "this is wrong".
const TRANSIENT_CODES: &[&str] = &[
    "LOADING",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "READONLY",
];

/// Whether a redis-rs error is worth a retry (see [`Error::is_transient`]).
pub(crate) fn is_transient(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.code().is_some_and(|c| TRANSIENT_CODES.contains(&c))
}

/// Whether the connection that produced `e` can no longer be trusted: after a
/// timeout or I/O error a reply may still be in flight, so the connection must be
/// dropped rather than reused (a late reply would be read as the next command's).
pub(crate) fn poisons_connection(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_unrecoverable_error()
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        match e.code() {
            Some("WRONGTYPE") => Error::WrongType(e.detail().unwrap_or_default().to_owned()),
            Some(code) if !is_transient(&e) && e.kind() != redis::ErrorKind::Io => Error::Server {
                code: code.to_owned(),
                message: e.detail().unwrap_or_default().to_owned(),
            },
            _ => Error::Redis(e),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotHeld { key } => write!(f, "lock {key:?} was not held by this owner"),
            Error::ReplicaSync { key, wanted, acked } => write!(
                f,
                "lock {key:?}: {acked} of {wanted} required replicas acknowledged; released"
            ),
            Error::WrongType(m) => write!(f, "WRONGTYPE {m}"),
            Error::Server { code, message } => write!(f, "{code} {message}"),
            Error::UnexpectedReply(m) => write!(f, "unexpected reply: {m}"),
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::Redis(e) => write!(f, "redis: {e}"),
            Error::OutcomeUnknown { script, cause } => write!(
                f,
                "outcome unknown: the script {script} may or may not have been applied \
                 (not sent again: it must not run twice): {cause}"
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) | Error::OutcomeUnknown { cause: e, .. } => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: &str, detail: &str) -> redis::RedisError {
        // The parser is the one place that builds server errors with their codes.
        let reply = format!("-{code} {detail}\r\n");
        let v = redis::parse_redis_value(reply.as_bytes()).unwrap();
        match v {
            redis::Value::ServerError(e) => e.into(),
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn it_maps_wrongtype_to_its_own_variant() {
        let e = Error::from(server_error(
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value",
        ));
        assert!(matches!(e, Error::WrongType(m) if m.contains("wrong kind")));
    }

    #[test]
    fn it_keeps_the_code_of_err_replies() {
        let e = Error::from(server_error("ERR", "syntax error"));
        match e {
            Error::Server { code, message } => {
                assert_eq!(code, "ERR");
                assert_eq!(message, "syntax error");
            }
            other => panic!("{other:?}"),
        }
        assert!(!Error::from(server_error("ERR", "x")).is_transient());
    }

    #[test]
    fn it_reads_the_modules_code_words_as_refusals() {
        let cases = [
            // (code word, its kind)
            ("BADLEASE", Some(Refusal::BadArgument)),
            ("BADPERMITID", Some(Refusal::BadArgument)),
            ("NOTALOCK", Some(Refusal::NotThisPrimitive)),
            ("NOTAPERMITSET", Some(Refusal::NotThisPrimitive)),
            ("OVERFLOW", Some(Refusal::Overflow)),
            ("TOOMANYWAITERS", Some(Refusal::TooManyWaiters)),
            ("TOOMANYHOLDS", Some(Refusal::TooManyHolds)),
            ("READHELD", Some(Refusal::ReadHeld)),
            ("INTERNALCMD", Some(Refusal::Internal)),
            ("RLOCKBUG", Some(Refusal::ModuleBug)),
            ("ERR", None),
            ("NOPERM", None),
        ];
        for (code, kind) in cases {
            let e = Error::from(server_error(code, "x"));
            assert_eq!(e.refusal(), kind, "{code}");
            assert!(
                matches!(&e, Error::Server { code: c, .. } if c == code),
                "{code}"
            );
        }
    }

    #[test]
    fn it_calls_loading_and_tryagain_transient() {
        for code in [
            "LOADING",
            "TRYAGAIN",
            "CLUSTERDOWN",
            "MASTERDOWN",
            "READONLY",
        ] {
            assert!(
                Error::from(server_error(code, "x")).is_transient(),
                "{code}"
            );
        }
    }

    #[test]
    fn it_calls_io_errors_transient() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let e = Error::from(redis::RedisError::from(io));
        assert!(e.is_transient());
    }
}
