//! `RLOCK.APPLY`, the receiving end of `rlock.replication commands` (design.md 1.4): a replica
//! or an AOF reload applies the plain commands a primary's module command carried
//! (`vocab::apply` for the layout, `ffi::replication` for the sending end).
//!
//! Layer: a command of the server layer itself, beside `store`; it knows no primitive.

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::server::ffi;
use crate::server::guard;
use crate::vocab::apply;
use crate::vocab::args;
use crate::vocab::errors::{ERR_APPLY_INTERNAL, ERR_DEADLINE};

/// `RLOCK.APPLY payload`: refused from ordinary clients, which could otherwise write any
/// key through it. Each carried command runs as a nested call, as the plain command would
/// (keyspace notifications, WATCH); the whole is replicated verbatim onward (a replica's
/// own AOF, its replicas).
pub fn apply_command(ctx: &Context, args: &[RedisString]) -> RedisResult {
    guard::command(|| {
        internal_only(ctx, ERR_APPLY_INTERNAL)?;
        let (_, payload) = routed_payload(args)?;
        let commands = apply::decode(payload).map_err(RedisError::Str)?;
        for words in commands {
            if let Err(e) = ffi::call_plain(ctx, &words) {
                // The primary ran the same command on the same state: an error here means
                // the replica's data had already diverged. Say so where the operator looks.
                ctx.log_warning(&format!(
                    "rlock: RLOCK.APPLY could not apply a command: {e}"
                ));
            }
        }
        ffi::replicate_verbatim(ctx);
        Ok(RedisValue::SimpleStringStatic("OK"))
    })
}

/// The one payload argument of an internal command, and the key it is routed by: in
/// cluster mode the sender puts a key of the payload's slot first
/// (`RLOCK.APPLY <key> <payload>`, `ffi::replication`), so that a slot migration streams it
/// to the slot's new owner; outside cluster mode, and in AOFs written before, there is no
/// such key.
fn routed_payload(args: &[RedisString]) -> Result<(Option<&[u8]>, &[u8]), RedisError> {
    match args {
        [_, payload] => Ok((None, payload.as_slice())),
        [_, key, payload] => Ok((Some(key.as_slice()), payload.as_slice())),
        _ => Err(RedisError::WrongArity),
    }
}

/// Refuses an internal command (design.md 1.4: `RLOCK.APPLY` and the `*.ACQUIREAT` commands)
/// unless it comes from a primary's replication stream or an AOF being loaded: from
/// anyone else (a client, `MULTI`, a script) it could write any state.
pub fn internal_only(ctx: &Context, refusal: &'static str) -> Result<(), RedisError> {
    let flags = ctx.get_flags();
    if flags.intersects(ContextFlags::REPLICATED | ContextFlags::LOADING) {
        Ok(())
    } else {
        Err(RedisError::Str(refusal))
    }
}

/// The `n` words of a command made deterministic (an `*.ACQUIREAT`, what
/// `ffi::as_rewritten_alone` sent): [`internal_only`], then its payload decoded as the
/// RESP array of exactly `n` words it must be (an AOF is a file anyone may edit), whose
/// first word is the routing key when there is one.
pub fn internal_words<'a>(
    ctx: &Context,
    args: &'a [RedisString],
    refusal: &'static str,
    n: usize,
) -> Result<Vec<&'a [u8]>, RedisError> {
    internal_only(ctx, refusal)?;
    let (key, payload) = routed_payload(args)?;
    let words = apply::decode_words(payload, n).map_err(RedisError::Str)?;
    // The words start with the key; a routing key must be that key.
    if key.is_some_and(|key| words.first() != Some(&key)) {
        return Err(RedisError::Str(refusal));
    }
    Ok(words)
}

/// A time such a command carries (a lease's end, the primary's clock), in ms since the
/// epoch: a positive integer, or refused.
pub fn internal_time(word: &[u8]) -> Result<i64, RedisError> {
    args::parse_i64(word)
        .filter(|&ms| ms > 0)
        .ok_or(RedisError::Str(ERR_DEADLINE))
}
