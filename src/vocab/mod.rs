//! The shared vocabulary, pure (no Redis): what every layer above speaks.
//!
//! - `args`: integers, leases, timeouts, owners, the `WAIT`/`ASYNC`/`ID` options, and the
//!   key that remembers a request id's first reply.
//! - `errors`: every error reply, one named constant each, with its Redis code prefix.
//! - `reply`: the replies a command sends, whatever the primitive.
//! - `effects`: a plan's writes as plain commands (replication as effects) and Redisson's
//!   key-naming rules (`prefixName`, `suffixName`).
//! - `apply`: the layout of `RLOCK.APPLY`, the one replicated command that carries a
//!   module command's effects (`rlock.replication commands`, design.md 1.4).
//! - `slot`: a key's hash slot (Redis Cluster's CRC16).

pub mod apply;
pub mod args;
pub mod effects;
pub mod errors;
pub mod reply;
pub mod slot;
