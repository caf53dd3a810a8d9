//! Every error reply the module sends, each defined once. Each starts with a code word a
//! client matches, as Redis's own `WRONGTYPE` and `NOSCRIPT` (the rest is for people):
//! - `BAD<ARG>`: an argument out of its range or shape (`BADLEASE`, `BADTIMEOUT`,
//!   `BADOWNER`, `BADID`, `BADSIDE`, `BADPERMITS`, `BADPERMITID`, `BADDEADLINE`, `BADTTL`,
//!   `BADCOUNT`, `BADASYNC`, `BADNOTIFY`, `BADQUIET`);
//! - `NOTA<KIND>`: the key holds a value of the right Redis type that is not this
//!   primitive's (`NOTALOCK`, `NOTARWLOCK`, `NOTATOKEN`, `NOTASEMAPHORE`, `NOTAPERMITSET`,
//!   `NOTALATCH`); a value of another type is Redis's `WRONGTYPE`;
//! - `OVERFLOW`: a count, token or permit total would pass its limit;
//! - `TOOMANYWAITERS`, `TOOMANYHOLDS`: a limit of the server's memory; `READHELD`: a wait
//!   that could never end; `INTERNALCMD`: an internal command from a client;
//!   `RLOCKBUG`: a caught panic; `BADPAYLOAD`: an internal command's payload that does not
//!   parse (vocab/apply.rs, only ever from a primary's stream or an AOF).
//!
//! Redis's own texts stay: arity (the server's), `ERR syntax error`, `WRONGTYPE`,
//! `READONLY`. The Python tests assert these exact texts; the clients map the code words
//! to their error kinds.

pub const ERR_SYNTAX: &str = "ERR syntax error";
pub const ERR_LEASE: &str = "BADLEASE lease-ms must be an integer from 1 to 3153600000000";
pub const ERR_TIMEOUT: &str = "BADTIMEOUT timeout-ms must be an integer from 0 to 3153600000000";
pub const ERR_EMPTY_OWNER: &str = "BADOWNER owner must not be empty";
pub const ERR_EMPTY_ID: &str = "BADID request-id must not be empty";
pub const ERR_NOT_A_LOCK: &str =
    "NOTALOCK key holds a hash that is not a lock (every field value must be a positive integer hold count)";
pub const ERR_WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
pub const ERR_COUNT_OVERFLOW: &str = "OVERFLOW hold count would overflow";
pub const ERR_TOO_MANY_WAITERS: &str =
    "TOOMANYWAITERS too many clients waiting for this lock (see rlock.max-waiters-per-key)";
/// `ASYNC` queues a ticket (docs/commands/tickets.md): it waits (`WAIT`) and is collected by its
/// request id (`ID`).
pub const ERR_ASYNC: &str = "BADASYNC ASYNC needs WAIT and ID";
/// `NOTIFY tag` names the channel of a queued ticket's messages (docs/commands/tickets.md):
/// only a ticket has messages.
pub const ERR_NOTIFY_ASYNC: &str = "BADNOTIFY NOTIFY needs ASYNC";
/// `QUIET` leaves a queued ticket's `QUEUED` reply out (docs/commands/tickets.md): only a
/// ticket is queued.
pub const ERR_QUIET_ASYNC: &str = "BADQUIET QUIET needs ASYNC";
/// A tag is appended to the key's ticket channel: short, and without braces, which would
/// move the channel to another cluster slot than the key's.
pub const ERR_NOTIFY_TAG: &str = "BADNOTIFY tag must be 1 to 64 bytes of A-Z a-z 0-9 . _ -";
/// What a request id answers once its ticket's grant was taken back (design.md 5): the
/// connection that queued the ticket closed and no confirmation came within
/// `rlock.ticket-confirm-ms`. A client that already proceeded on the `granted` message
/// learns from it that its hold is lost; the retry changes nothing.
pub const ERR_TAKEN_BACK: &str =
    "TAKENBACK the grant of this request id was taken back: its ticket's connection closed and no confirmation came in time";
pub const ERR_INTERNAL: &str = "RLOCKBUG rlock internal error (details in the server log)";
/// Sent to waiters still queued when the server stops being a master (Redis 7.0 normally
/// unblocks them itself first): a replica cannot grant locks.
pub const ERR_ROLE_CHANGED: &str =
    "READONLY this server became a replica while the client waited for the lock";

// Read-write lock and fenced lock (design.md 4.1, 4.2).
pub const ERR_RW_SIDE: &str = "BADSIDE lock side must be READ or WRITE";
pub const ERR_RW_OWNER_SUFFIX: &str =
    "BADOWNER owner must not end with ':write' (the suffix of the write lock's field)";
pub const ERR_NOT_A_RWLOCK: &str =
    "NOTARWLOCK key holds a hash that is not a read-write lock (a 'mode' field of read or write, one writer at most, positive integer hold counts)";
pub const ERR_RW_READ_HELD: &str =
    "READHELD this owner holds the read lock: release the read lock first (a writer waiting on its own read would wait forever)";
pub const ERR_RW_TOO_MANY_HOLDS: &str =
    "TOOMANYHOLDS an owner may hold the read lock at most 1024 times";
pub const ERR_NOT_A_TOKEN: &str =
    "NOTATOKEN the fencing token key holds a value that is not an integer";
pub const ERR_TOKEN_OVERFLOW: &str = "OVERFLOW fencing token would overflow";

// Semaphores and latch
pub const ERR_NOT_A_SEMAPHORE: &str =
    "NOTASEMAPHORE key holds a string that is not a permit count (it must be a decimal integer)";
pub const ERR_NOT_A_PERMIT_SET: &str =
    "NOTAPERMITSET the permit set is not a semaphore's (every score must be an integer expiry in ms)";
pub const ERR_NOT_A_LATCH: &str =
    "NOTALATCH key holds a string that is not a latch count (it must be a decimal integer)";
pub const ERR_PERMITS: &str = "BADPERMITS permits must be an integer from 0 to 2147483647";
pub const ERR_PERMITS_DELTA: &str =
    "BADPERMITS permits must be an integer from -2147483647 to 2147483647";
pub const ERR_PERMIT_COUNT: &str = "BADPERMITS permits must be an integer from 1 to 1024";
pub const ERR_PERMITS_OVERFLOW: &str = "OVERFLOW permit count would overflow";
pub const ERR_PERMIT_LEASE: &str =
    "BADLEASE lease-ms must be -1 (no lease) or an integer from 1 to 3153600000000";
pub const ERR_PERMIT_ID: &str =
    "BADPERMITID permit-id must be 2 to 64 hex digits, an even number of them";
pub const ERR_DEADLINE: &str =
    "BADDEADLINE deadline-ms must be an integer from 1 to 9223372036854775807";
pub const ERR_TTL: &str = "BADTTL ttl-ms must be an integer from 1 to 3153600000000";
pub const ERR_LATCH_COUNT: &str = "BADCOUNT count must be an integer from 1 to 9223372036854775807";
pub const ERR_LATCH_OVERFLOW: &str = "OVERFLOW latch count would overflow";

/// `RLOCK.APPLY` from anyone but a primary's replication stream or an AOF being loaded.
pub const ERR_APPLY_INTERNAL: &str =
    "INTERNALCMD RLOCK.APPLY is internal: only a primary's replication stream or an AOF reload may send it";
pub const ERR_ACQUIREAT_INTERNAL: &str =
    "INTERNALCMD RLOCK.ACQUIREAT is internal: only a primary's replication stream or an AOF reload may send it";
pub const ERR_RW_ACQUIREAT_INTERNAL: &str =
    "INTERNALCMD RRWLOCK.ACQUIREAT is internal: only a primary's replication stream or an AOF reload may send it";
pub const ERR_FENCED_ACQUIREAT_INTERNAL: &str =
    "INTERNALCMD RFENCED.ACQUIREAT is internal: only a primary's replication stream or an AOF reload may send it";
