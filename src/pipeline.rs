//! The command pipeline: what every primitive's changing commands share, written once.
//! A primitive declares how to parse a command, its plan (read, rule, write, reply) and,
//! for a command that may wait, its grant rule (an `engine::Ask`); [`write_command`] is
//! the journey around the plan (arity, parsing, request-id replay, the key's queue served
//! first), and [`waiting_command`] adds the end of a command that may wait (wait blocked,
//! queue a ticket, or reply). Every changing command of every primitive runs on them, so
//! the pieces they are made of (replay, serving the queue first, "may this client
//! block?", waiting or queueing) are private here: there is one way to do each. Beside
//! them, what the primitives' own parts share: error mapping, the request-id key and
//! record ([`remember`]), an `…INFO` map.
//!
//! Layer: the top, beside the primitives' folders (`lock::commands`, ...) that use it;
//! calls down into `engine` and `store` only, and back into a primitive only through the
//! closures it is handed (its parser and its plan).

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::engine;
use crate::server::ffi;
use crate::server::store;
use crate::vocab::args;
use crate::vocab::errors;
use crate::vocab::reply::Reply;

/// A named error constant (`errors.rs`) as a command's error reply.
pub fn err(msg: &'static str) -> RedisError {
    RedisError::Str(msg)
}

/// Runs a core's parser on the arguments after the key, as bytes: from a buffer on the
/// stack for the usual few (a heap vector made and freed per call showed in the lock's
/// profile), from a vector beyond that.
fn parse_after_key<'a, R>(args: &'a [RedisString], parse: impl FnOnce(&[&'a [u8]]) -> R) -> R {
    const INLINE: usize = 12;
    let rest = args.get(2..).unwrap_or_default();
    if rest.len() <= INLINE {
        let mut words: [&'a [u8]; INLINE] = [&[]; INLINE];
        for (word, arg) in words.iter_mut().zip(rest) {
            *word = arg.as_slice();
        }
        parse(&words[..rest.len()])
    } else {
        parse(&rest.iter().map(RedisString::as_slice).collect::<Vec<_>>())
    }
}

/// The key remembering a request id's reply, if the call has an id. It is named after the
/// primitive's key, so it lives in the key's cluster slot.
pub fn request_key(name: &RedisString, id: Option<&[u8]>) -> Option<RedisString> {
    id.map(|id| {
        RedisString::create_from_slice(
            std::ptr::null_mut(),
            &args::request_key(name.as_slice(), id),
        )
    })
}

/// The first reply of a call retried with the same request id, if it is remembered. A
/// queued ticket's grant is collected this way (docs/commands/tickets.md): from then on it is its
/// client's, not taken back when the ticket's connection closes.
///
/// A ticket's grant taken back (its connection closed, no confirmation in time) answers
/// [`errors::ERR_TAKEN_BACK`]: its client may have proceeded on the `granted` message and
/// must learn that it lost the hold, not be served afresh (design.md 5).
fn replay(ctx: &Context, request: Option<&RedisString>) -> Option<RedisResult> {
    let request = request?;
    match store::record(ctx, request)? {
        // A grant whose grace ended is taken back by the sweep that follows the take-back
        // timer; in between its record still holds the grant's reply.
        store::Record::Reply(_) if engine::taking_back(request.as_slice()) => {
            Some(Err(err(errors::ERR_TAKEN_BACK)))
        }
        store::Record::Reply(first) => {
            engine::collected(request.as_slice());
            Some(Ok(ffi::value(first)))
        }
        store::Record::TakenBack => Some(Err(err(errors::ERR_TAKEN_BACK))),
    }
}

/// How a call that cannot be served now waits: blocked in the server (`WAIT`), or as a
/// queued ticket (`WAIT … ASYNC`, `waiting.queued`, with its `NOTIFY` tag if any),
/// answered `QUEUED` at once while the connection goes on, or not at all (`QUIET`: its
/// message will be its only answer). `pttl`: when the state may change by itself (see
/// `engine::wait`).
fn wait_or_queue(
    ctx: &Context,
    db: i32,
    name: &RedisString,
    request: engine::Request,
    timeout: i64,
    waiting: Waiting,
    pttl: i64,
) -> RedisResult {
    if waiting.queued {
        engine::queue_ticket(ctx, db, name, request, timeout, waiting.notify, pttl).map_err(err)?;
        // Quiet: the server writes nothing to the ticket's client until its message, as
        // for a blocked wait, which saves a handoff a write on both sides (design.md 5).
        // Only here, where the ticket is queued: every other outcome is the usual reply,
        // and only where a client may block (`may_block`): never in MULTI, a script or a
        // replicated stream, whose replies are counted.
        if waiting.quiet {
            return Ok(RedisValue::NoReply);
        }
        Ok(RedisValue::SimpleStringStatic("QUEUED"))
    } else {
        engine::wait(ctx, db, name, engine::Waiter::new(request), timeout, pttl).map_err(err)?;
        Ok(RedisValue::NoReply)
    }
}

/// Remembers a call's reply under its request id (when it has one and `changed` says the
/// call changed something: re-running a call that changed nothing is as good as a replay).
pub fn remember(ctx: &Context, request: Option<&RedisString>, changed: bool, reply: &Reply) {
    if let Some(req) = request.filter(|_| changed) {
        store::remember(ctx, req, reply, ffi::now_ms());
    }
}

/// Where a client may not block (MULTI/EXEC, scripts, replicated or loading streams,
/// deny-blocking contexts), WAIT is ignored and the command answers at once.
fn may_block(ctx: &Context) -> bool {
    let no = ContextFlags::MULTI
        | ContextFlags::LUA
        | ContextFlags::DENY_BLOCKING
        | ContextFlags::REPLICATED
        | ContextFlags::LOADING;
    !ctx.get_flags().intersects(no)
}

/// Serves a key's queue before a command looks at it, if anybody waits: a key freed a
/// moment ago (DEL, expiry, a permit's lease) whose handoff is still pending goes to the
/// first waiter, so no command barges past the queue.
fn serve_first(ctx: &Context, db: i32, name: &RedisString) {
    if engine::has_waiters(db, name.as_slice()) {
        engine::serve(ctx, db, name, engine::Path::Command);
    }
}

/// An `…INFO` reply of integers (semaphores): an ordered map, a map under RESP3 and flat
/// pairs under RESP2, keys in a stable order.
pub fn int_map(fields: &[(&str, i64)]) -> RedisValue {
    RedisValue::OrderedMap(
        fields
            .iter()
            .map(|&(k, v)| {
                (
                    redis_module::redisvalue::RedisValueKey::String(k.into()),
                    RedisValue::Integer(v),
                )
            })
            .collect(),
    )
}

/// What a command's parser hands the pipeline: the arguments after the key as the
/// primitive's plan takes them, and the call's request id (`ID`), if it has one.
pub type Parsed<'a, P> = Result<(P, Option<&'a [u8]>), &'static str>;

/// The opening every changing command of the synchronizers shares, written once: the
/// arity, the arguments after the key parsed (with the call's request id), the first
/// reply of a retried call replayed, and a pending queue served before anything is read.
/// `body` gets the db, the key, the parsed arguments and the request-id key, and does the
/// primitive's own part (read, plan, write, reply).
pub fn write_command<'a, P>(
    ctx: &Context,
    args: &'a [RedisString],
    arity: std::ops::RangeInclusive<usize>,
    parse: impl FnOnce(&[&'a [u8]]) -> Parsed<'a, P>,
    body: impl FnOnce(i32, &RedisString, P, Option<&RedisString>) -> RedisResult,
) -> RedisResult {
    command(ctx, args, arity, None, parse, body)
}

/// [`write_command`] for a release, which may end with `COLLECT grant-id` (feature word
/// `release-collects`, design.md 5): the ticket grant it gives back is collected in the
/// same command, so that a holder whose confirmation had not gone out yet sends no
/// confirmation at all and a ticket handoff runs the commands a blocked one does. The
/// first `fixed` words (the command, the key and the release's own arguments) are never
/// read as the option: an owner may be named `COLLECT`. Once the rest parsed and the
/// release's own `ID` replayed nothing, the grant's record decides: taken back (or being
/// taken back), the release answers `TAKENBACK` and changes nothing (the holder's hold
/// was lost and the take-back already gave it away); its reply, the grant is collected
/// (never taken back from now on) and the release goes on; no record (a grant past the
/// request-id window, or none), it goes on as without the option.
pub fn release_command<'a, P>(
    ctx: &Context,
    args: &'a [RedisString],
    fixed: usize,
    arity: std::ops::RangeInclusive<usize>,
    parse: impl FnOnce(&[&'a [u8]]) -> Parsed<'a, P>,
    body: impl FnOnce(i32, &RedisString, P, Option<&RedisString>) -> RedisResult,
) -> RedisResult {
    let n = args.len();
    let collect = match n.checked_sub(2).filter(|&at| at >= fixed) {
        Some(at) => args::parse_collect(args[at].as_slice(), args[at + 1].as_slice()),
        None => None,
    };
    match collect {
        None => command(ctx, args, arity, None, parse, body),
        Some(grant) => command(
            ctx,
            &args[..n - 2],
            arity,
            Some(grant.map_err(err)?),
            parse,
            body,
        ),
    }
}

/// The opening of [`write_command`] and [`release_command`] (`grant`: the release's
/// `COLLECT grant-id`).
fn command<'a, P>(
    ctx: &Context,
    args: &'a [RedisString],
    arity: std::ops::RangeInclusive<usize>,
    grant: Option<&[u8]>,
    parse: impl FnOnce(&[&'a [u8]]) -> Parsed<'a, P>,
    body: impl FnOnce(i32, &RedisString, P, Option<&RedisString>) -> RedisResult,
) -> RedisResult {
    if !arity.contains(&args.len()) {
        return Err(RedisError::WrongArity);
    }
    let (parsed, id) = parse_after_key(args, parse).map_err(err)?;
    let name = &args[1];
    let request = request_key(name, id);
    if let Some(first) = replay(ctx, request.as_ref()) {
        return first;
    }
    if let Some(Err(taken_back)) = replay(ctx, request_key(name, grant).as_ref()) {
        return Err(taken_back);
    }
    let db = ffi::selected_db(ctx);
    serve_first(ctx, db, name);
    body(db, name, parsed, request.as_ref())
}

/// How a waiting command may wait, as its parser read it: `WAIT timeout-ms` (`None`:
/// answer at once), `ASYNC` (wait as a queued ticket, not a blocked client), `NOTIFY
/// tag` (the ticket's own channel) and `QUIET` (no `QUEUED` reply).
#[derive(Debug, Clone, Copy, Default)]
pub struct Waiting<'a> {
    pub timeout: Option<i64>,
    pub queued: bool,
    pub notify: Option<&'a [u8]>,
    pub quiet: bool,
}

/// What a waiting command's own part found, once its plan is applied.
pub enum Answer<F> {
    /// Done: the reply.
    Now(RedisValue),
    /// Contended: `reply` for a call that may not wait; for one that may, `ask` builds
    /// its queued request and the time in ms until the state may change by itself (see
    /// `engine::wait`). Built only then: a contended call without `WAIT` allocates nothing.
    Contended { reply: RedisValue, ask: F },
}

/// A command that may wait (`… [WAIT timeout-ms [ASYNC [NOTIFY tag] [QUIET]]] [ID request-id]`), written
/// once: [`write_command`]'s opening (arity, parsing, request-id replay, the queue served
/// first), the primitive's own part (`body`: read, plan, write, remember), then waiting
/// or queueing where the call is contended, asked to wait, and may block; else the reply.
pub fn waiting_command<'a, P, F>(
    ctx: &Context,
    args: &'a [RedisString],
    arity: std::ops::RangeInclusive<usize>,
    parse: impl FnOnce(&[&'a [u8]]) -> Result<(P, Option<&'a [u8]>, Waiting<'a>), &'static str>,
    body: impl FnOnce(i32, &RedisString, P, Option<&RedisString>) -> Result<Answer<F>, RedisError>,
) -> RedisResult
where
    F: FnOnce() -> (engine::Request, i64),
{
    let waiting = std::cell::Cell::new(Waiting::default());
    let parse = |a: &[&'a [u8]]| {
        let (parsed, id, w) = parse(a)?;
        waiting.set(w);
        Ok((parsed, id))
    };
    write_command(
        ctx,
        args,
        arity,
        parse,
        |db, name, parsed, request| match body(db, name, parsed, request)? {
            Answer::Now(reply) => Ok(reply),
            Answer::Contended { reply, ask } => match waiting.get() {
                w @ Waiting {
                    timeout: Some(timeout),
                    ..
                } if may_block(ctx) => {
                    let (ask, pttl) = ask();
                    wait_or_queue(ctx, db, name, ask, timeout, w, pttl)
                }
                _ => Ok(reply),
            },
        },
    )
}
