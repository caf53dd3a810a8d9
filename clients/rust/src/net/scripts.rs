//! Scripts mode's commands: each of the module's commands done with the scripts Redisson
//! 4.7 sends (`proto::scripts`: the same keys, KEYS/ARGV, channels and messages), answering
//! what the module would have answered, so that the shared logic (`aio`, and through it
//! the blocking API) needs no second implementation. `aio::ClientInner` routes a module
//! command here when the server has no module (docs/scripts-mode.md).
//!
//! Every script goes as EVALSHA and, on NOSCRIPT (a failover or SCRIPT FLUSH emptied the
//! script cache), as EVAL, which caches it again. A waiting command is `wait`: Redisson's
//! way, on the client's one subscriber connection (`net::pubsub`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use redis::{RedisResult, Value};

use crate::error::{Error, Result};
use crate::net::pubsub::{Heard, Subscribers};
use crate::proto::cmd::request_id;
use crate::proto::scripts::{self as s, renew_reply, renew_script, Args, Resend, Script};

/// How many times a command a cluster refused before running it (`MOVED`, `ASK`,
/// `TRYAGAIN`, `CLUSTERDOWN`) is sent again: scripts mode's cluster connection does not
/// follow them itself (it has no redis-rs retries, which would also re-send a script
/// whose reply was lost), so this does, pausing 1 ms doubling (a slot in migration).
const REFUSED_ATTEMPTS: u32 = 9;

/// `c` on `conn`, sent again while a cluster refuses it before running it (see
/// [`REFUSED_ATTEMPTS`]); on a connection that follows redirections itself, one send.
async fn query<T: redis::FromRedisValue, C: ConnectionLike + Send>(
    conn: &mut C,
    c: &redis::Cmd,
) -> RedisResult<T> {
    let mut attempt = 0;
    loop {
        match c.query_async::<Value>(conn).await {
            Err(e)
                if attempt < REFUSED_ATTEMPTS
                    && matches!(e.code(), Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN")) =>
            {
                // (After a MOVED, redis-rs reads the slot map again meanwhile.)
                tokio::time::sleep(Duration::from_millis(1 << attempt)).await;
                attempt += 1;
            }
            r => return Ok(redis::from_redis_value(r?)?),
        }
    }
}

/// EVALSHA of `script`; EVAL (which caches it again) on NOSCRIPT. A script that must not
/// run twice (`Resend::No`) whose connection failed after the write comes back as
/// `Error::OutcomeUnknown`, which is not transient: the caller's retries stop there.
async fn eval<C: ConnectionLike + Send>(
    conn: &mut C,
    script: &Script,
    keys: &[&[u8]],
    args: &[&[u8]],
) -> Result<Value> {
    let mut c = redis::cmd("EVALSHA");
    c.arg(script.sha()).arg(keys.len()).arg(keys).arg(args);
    let r = match query::<Value, _>(conn, &c).await {
        Err(e) if e.code() == Some("NOSCRIPT") => {
            let mut c = redis::cmd("EVAL");
            c.arg(script.text).arg(keys.len()).arg(keys).arg(args);
            query(conn, &c).await
        }
        r => r,
    };
    r.map_err(|e| once(script, e))
}

/// `e` as the error of a call that ran (or may have run) `script`: `OutcomeUnknown` if
/// the script must not run twice and the failure may have come after the server received
/// it (a broken connection, a timeout); as is otherwise (a refusal before the write, or a
/// server's error reply: the script did not run).
fn once(script: &Script, e: redis::RedisError) -> Error {
    let after_write = (e.is_io_error() || e.is_timeout() || e.is_connection_dropped())
        && !e.is_connection_refusal();
    if script.resend == Resend::No && after_write {
        Error::OutcomeUnknown {
            script: script.name,
            cause: e,
        }
    } else {
        e.into()
    }
}

/// The read that answers a call after `script` ran: its failure must not make the caller
/// run the script again.
async fn get_int_after<C: ConnectionLike + Send>(
    conn: &mut C,
    key: &[u8],
    script: &Script,
) -> Result<i64> {
    let v: RedisResult<Value> = query(conn, redis::cmd("GET").arg(key)).await;
    Ok(int_of(&v.map_err(|e| once(script, e))?))
}

fn num(n: impl ToString) -> Vec<u8> {
    n.to_string().into_bytes()
}

fn now_ms() -> i64 {
    // Redisson passes the client's System.currentTimeMillis() to the permit scripts.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

fn int_of(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        Value::BulkString(b) => s::parse_int(b).unwrap_or_default(),
        _ => 0,
    }
}

async fn get_int<C: ConnectionLike + Send>(conn: &mut C, key: &[u8]) -> Result<i64> {
    let v: Value = query(conn, redis::cmd("GET").arg(key)).await?;
    Ok(int_of(&v))
}

fn refused(code: &str, message: &str) -> Error {
    Error::Server {
        code: code.into(),
        message: message.into(),
    }
}

fn bad_permits() -> Error {
    refused(
        "BADPERMITS",
        "permits must be an integer from 0 to 2147483647",
    )
}

fn raw_id(a: &Args, i: usize) -> Result<Vec<u8>> {
    s::raw_permit_id(a.at(i)).ok_or_else(|| {
        refused(
            "BADPERMITID",
            "scripts mode takes Redisson's permit ids: 32 hex digits",
        )
    })
}

/// One module command done with Redisson's scripts: the module's reply and, for an
/// acquire that did not succeed, how many ms until the holder's lease (or the first
/// permit's) ends: when to look again without a message.
pub(crate) async fn command<C: ConnectionLike + Send>(
    conn: &mut C,
    words: &[Vec<u8>],
    publish: &str,
) -> Result<(Value, Option<i64>)> {
    let p = publish.as_bytes();
    let verb = words
        .first()
        .map(|w| w.to_ascii_uppercase())
        .unwrap_or_default();
    let a = |fixed| Args::parse(words, fixed);
    let rid = |a: &Args| a.id.clone().unwrap_or_else(|| request_id().into_bytes());
    let latch_ms = num(s::UNLOCK_LATCH_MS);
    let none = |v: Value| Ok((v, None));
    match verb.as_slice() {
        b"RLOCK.ACQUIRE" => {
            let a = a(3);
            let v = eval(conn, &s::LOCK_ACQUIRE, &[a.at(0)], &[a.at(2), a.at(1)]).await?;
            let hint = matches!(v, Value::Int(_)).then(|| int_of(&v));
            Ok((v, hint))
        }
        b"RLOCK.RELEASE" => {
            let a = a(2);
            let name = a.at(0);
            let lease = a.pos.get(2).cloned().unwrap_or_else(|| b"30000".to_vec());
            let keys = [
                name,
                &s::lock_channel(name),
                &s::unlock_latch(name, &rid(&a)),
            ];
            let msg = num(s::UNLOCK_MESSAGE);
            none(
                eval(
                    conn,
                    &s::LOCK_UNLOCK,
                    &keys,
                    &[&msg, &lease, a.at(1), p, &latch_ms],
                )
                .await?,
            )
        }
        b"RLOCK.RENEW" | b"RRWLOCK.RENEW" => {
            let (script, keys, args) = renew_script(words);
            let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            none(renew_reply(eval(conn, script, &keys, &args).await?))
        }
        b"RLOCK.FORCERELEASE" => {
            let name = a(1).pos.first().cloned().unwrap_or_default();
            let msg = num(s::UNLOCK_MESSAGE);
            let keys = [name.as_slice(), &s::lock_channel(&name)];
            none(eval(conn, &s::LOCK_FORCE_UNLOCK, &keys, &[&msg, p]).await?)
        }
        b"RFENCED.ACQUIRE" => {
            let a = a(3);
            let keys = [a.at(0), &s::token_key(a.at(0))];
            let v = eval(conn, &s::FENCED_ACQUIRE_TOKEN, &keys, &[a.at(2), a.at(1)]).await?;
            let (ttl, token) = match &v {
                Value::Array(x) if x.len() == 2 => (int_of(&x[0]), int_of(&x[1])),
                _ => {
                    return Err(Error::UnexpectedReply(format!(
                        "fenced_acquire_token: {v:?}"
                    )))
                }
            };
            if ttl == -1 {
                return none(Value::Array(vec![Value::Nil, Value::Int(token)]));
            }
            Ok((Value::Array(vec![Value::Int(ttl), Value::Nil]), Some(ttl)))
        }
        b"RFENCED.GETTOKEN" => {
            let name = a(1).pos.first().cloned().unwrap_or_default();
            let v: Value = query(conn, redis::cmd("GET").arg(s::token_key(&name))).await?;
            none(match v {
                Value::Nil => Value::Nil,
                v => Value::Int(int_of(&v)),
            })
        }
        b"RRWLOCK.ACQUIRE" => {
            let a = a(4);
            let (name, owner, lease) = (a.at(0), a.at(2), a.at(3));
            let writer = s::writer(owner);
            let v = if a.at(1).eq_ignore_ascii_case(b"READ") {
                let keys = [name, &s::rw_timeout_prefix(name, owner)];
                eval(conn, &s::READ_ACQUIRE, &keys, &[lease, owner, &writer]).await?
            } else {
                let v = eval(conn, &s::WRITE_ACQUIRE, &[name], &[lease, &writer]).await?;
                if v != Value::Nil {
                    // The module refuses an upgrade at once; Redisson's script would let
                    // the owner wait for itself until its own read leases end. Only this
                    // owner changes its own read field, so looking after the script is
                    // not a race.
                    let hmget = redis::cmd("HMGET")
                        .arg(name)
                        .arg("mode")
                        .arg(owner)
                        .to_owned();
                    let (mode, reads): (Option<Vec<u8>>, Option<Vec<u8>>) =
                        query(conn, &hmget).await?;
                    if mode.as_deref() == Some(b"read") && reads.is_some() {
                        return Err(refused(
                            "READHELD",
                            "this owner holds the read lock: release the read lock first \
                             (a writer waiting on its own read would wait forever)",
                        ));
                    }
                }
                v
            };
            let hint = matches!(v, Value::Int(_)).then(|| int_of(&v));
            Ok((v, hint))
        }
        b"RRWLOCK.RELEASE" => {
            let a = a(3);
            let (name, owner) = (a.at(0), a.at(2));
            let latch = s::unlock_latch(name, &rid(&a));
            let chan = s::rw_channel(name);
            if a.at(1).eq_ignore_ascii_case(b"READ") {
                let keys = [
                    name,
                    &chan,
                    &s::rw_timeout_prefix(name, owner),
                    &s::key_prefix(name),
                    &latch,
                ];
                let msg = num(s::UNLOCK_MESSAGE);
                none(eval(conn, &s::READ_UNLOCK, &keys, &[&msg, owner, p, &latch_ms]).await?)
            } else {
                let lease = a.pos.get(3).cloned().unwrap_or_else(|| b"30000".to_vec());
                let msg = num(s::READ_UNLOCK_MESSAGE);
                let w = s::writer(owner);
                let args = [msg.as_slice(), &lease, &w, p, &latch_ms];
                none(eval(conn, &s::WRITE_UNLOCK, &[name, &chan, &latch], &args).await?)
            }
        }
        b"RRWLOCK.FORCERELEASE" => {
            let name = a(1).pos.first().cloned().unwrap_or_default();
            let mode: Option<Vec<u8>> =
                query(conn, redis::cmd("HGET").arg(&name).arg("mode")).await?;
            let Some(mode) = mode else {
                return none(Value::Int(0));
            };
            let read = mode == b"read";
            let (script, msg) = if read {
                (&s::READ_FORCE_UNLOCK, s::UNLOCK_MESSAGE)
            } else {
                (&s::WRITE_FORCE_UNLOCK, s::READ_UNLOCK_MESSAGE)
            };
            let keys = [name.as_slice(), &s::rw_channel(&name)];
            none(eval(conn, script, &keys, &[&num(msg), p]).await?)
        }
        b"RSEMAPHORE.TRYSETPERMITS" | b"RPSEMAPHORE.TRYSETPERMITS" => {
            let a = a(2);
            if !s::valid_permits(a.at(1)) {
                return Err(bad_permits());
            }
            let keys = [a.at(0), &s::semaphore_channel(a.at(0))];
            none(match &a.px {
                Some(px) if verb.starts_with(b"RSEMAPHORE") => {
                    eval(conn, &s::SEMAPHORE_TRY_SET_TTL, &keys, &[a.at(1), p, px]).await?
                }
                _ => eval(conn, &s::SEMAPHORE_TRY_SET, &keys, &[a.at(1), p]).await?,
            })
        }
        b"RSEMAPHORE.ADDPERMITS" => {
            let a = a(2);
            let keys = [a.at(0), &s::semaphore_channel(a.at(0))];
            eval(conn, &s::SEMAPHORE_ADD, &keys, &[a.at(1), p]).await?;
            none(Value::Int(
                get_int_after(conn, a.at(0), &s::SEMAPHORE_ADD).await?,
            ))
        }
        b"RSEMAPHORE.ACQUIRE" => {
            let a = a(2);
            if a.int(1) == Some(0) {
                return none(Value::Int(1)); // Redisson answers without a call
            }
            none(eval(conn, &s::SEMAPHORE_TRY_ACQUIRE, &[a.at(0)], &[a.at(1)]).await?)
        }
        b"RSEMAPHORE.RELEASE" => {
            let a = a(2);
            if a.int(1) != Some(0) {
                let keys = [a.at(0), &s::semaphore_channel(a.at(0))];
                eval(conn, &s::SEMAPHORE_RELEASE, &keys, &[a.at(1), p]).await?;
                return none(Value::Int(
                    get_int_after(conn, a.at(0), &s::SEMAPHORE_RELEASE).await?,
                ));
            }
            none(Value::Int(get_int(conn, a.at(0)).await?))
        }
        b"RSEMAPHORE.AVAILABLEPERMITS" => none(Value::Int(get_int(conn, a(1).at(0)).await?)),
        b"RSEMAPHORE.DRAINPERMITS" => {
            let v = eval(conn, &s::SEMAPHORE_DRAIN, &[a(1).at(0)], &[]).await?;
            none(Value::Int(int_of(&v)))
        }
        b"RPSEMAPHORE.SETPERMITS" => {
            let a = a(2);
            if !s::valid_permits(a.at(1)) {
                return Err(bad_permits());
            }
            let name = a.at(0);
            let keys = [name, &s::semaphore_channel(name), &s::timeout_zset(name)];
            eval(conn, &s::PES_SET_PERMITS, &keys, &[a.at(1), p]).await?;
            none(Value::Int(pes_available(conn, name, p).await?))
        }
        b"RPSEMAPHORE.ADDPERMITS" => {
            let a = a(2);
            let keys = [a.at(0), &s::semaphore_channel(a.at(0))];
            eval(conn, &s::PES_ADD, &keys, &[a.at(1), p]).await?;
            // The read after it must not make the caller add again.
            let left = pes_available(conn, a.at(0), p).await.map_err(|e| match e {
                Error::Redis(e) => once(&s::PES_ADD, e),
                e => e,
            })?;
            none(Value::Int(left))
        }
        b"RPSEMAPHORE.AVAILABLEPERMITS" => {
            none(Value::Int(pes_available(conn, a(1).at(0), p).await?))
        }
        b"RPSEMAPHORE.ACQUIREDPERMITS" => {
            let name = a(1).pos.first().cloned().unwrap_or_default();
            let v = eval(
                conn,
                &s::PES_ACQUIRED,
                &pes_keys(&name).each(),
                &[&num(now_ms()), p],
            )
            .await?;
            none(Value::Int(int_of(&v)))
        }
        b"RPSEMAPHORE.ACQUIRE" => {
            let a = a(2);
            let permits = a
                .permits
                .as_deref()
                .and_then(s::parse_int)
                .unwrap_or(1)
                .max(1);
            let ids: Vec<Vec<u8>> = (0..permits)
                .map(|_| uuid::Uuid::new_v4().as_bytes().to_vec())
                .collect();
            let now = now_ms();
            let lease = a.int(1).unwrap_or(-1);
            let (n, exp, now_b, ne) = (
                num(permits),
                num(s::expiry(lease, now)),
                num(now),
                num(s::NON_EXPIRABLE),
            );
            let mut args: Vec<&[u8]> = vec![&n, &exp, &now_b, &ne, p];
            args.extend(ids.iter().map(Vec::as_slice));
            let keys = pes_keys(a.at(0));
            let v = eval(conn, &s::PES_TRY_ACQUIRE, &keys.each(), &args).await?;
            match s::pes_outcome(&v) {
                (true, _) => {
                    let hexed: Vec<Value> = ids
                        .iter()
                        .map(|i| Value::BulkString(s::hex(i).into_bytes()))
                        .collect();
                    none(if permits == 1 {
                        hexed.into_iter().next().unwrap_or(Value::Nil)
                    } else {
                        Value::Array(hexed)
                    })
                }
                (false, at) => Ok((Value::Nil, at.map(|at| (at - now).max(1)))),
            }
        }
        b"RPSEMAPHORE.RELEASE" => {
            let a = a(2);
            let name = a.at(0);
            let keys = [name, &s::semaphore_channel(name), &s::timeout_zset(name)];
            let args = [raw_id(&a, 1)?, b"1".to_vec(), num(now_ms()), p.to_vec()];
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            none(eval(conn, &s::PES_RELEASE, &keys, &args).await?)
        }
        b"RPSEMAPHORE.UPDATELEASETIME" => {
            let a = a(3);
            let now = now_ms();
            let lease = a.int(2).unwrap_or(-1);
            let args = [
                raw_id(&a, 1)?,
                num(s::expiry(lease, now)),
                num(now),
                p.to_vec(),
            ];
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let keys = pes_keys(a.at(0));
            none(eval(conn, &s::PES_UPDATE_LEASE, &keys.each(), &args).await?)
        }
        b"RLATCH.TRYSETCOUNT" => {
            let a = a(2);
            let keys = [a.at(0), &s::latch_channel(a.at(0))];
            let msg = num(s::NEW_COUNT_MESSAGE);
            none(eval(conn, &s::LATCH_TRY_SET, &keys, &[&msg, a.at(1), p]).await?)
        }
        b"RLATCH.COUNTDOWN" => {
            let a = a(1);
            let keys = [a.at(0), &s::latch_channel(a.at(0))];
            let msg = num(s::ZERO_COUNT_MESSAGE);
            eval(conn, &s::LATCH_COUNT_DOWN, &keys, &[&msg, p]).await?;
            let left = get_int_after(conn, a.at(0), &s::LATCH_COUNT_DOWN).await?;
            none(Value::Int(left.max(0)))
        }
        b"RLATCH.GETCOUNT" => none(Value::Int(get_int(conn, a(1).at(0)).await?.max(0))),
        b"RLATCH.DELETE" => {
            let a = a(1);
            let keys = [a.at(0), &s::latch_channel(a.at(0))];
            let msg = num(s::NEW_COUNT_MESSAGE);
            none(eval(conn, &s::LATCH_DELETE, &keys, &[&msg, p]).await?)
        }
        b"RLATCH.AWAIT" => {
            let zero = get_int(conn, a(1).at(0)).await? <= 0;
            none(Value::Int(zero.into()))
        }
        other => Err(refused(
            "ERR",
            &format!(
                "rlock scripts mode: {} needs the rlock module (no Redisson script does it)",
                String::from_utf8_lossy(other)
            ),
        )),
    }
}

/// The reclaiming permit scripts' KEYS: name, timeout zset, channel.
struct PesKeys([Vec<u8>; 3]);

impl PesKeys {
    fn each(&self) -> [&[u8]; 3] {
        [&self.0[0], &self.0[1], &self.0[2]]
    }
}

fn pes_keys(name: &[u8]) -> PesKeys {
    PesKeys([
        name.to_vec(),
        s::timeout_zset(name),
        s::semaphore_channel(name),
    ])
}

async fn pes_available<C: ConnectionLike + Send>(
    conn: &mut C,
    name: &[u8],
    publish: &[u8],
) -> Result<i64> {
    let keys = pes_keys(name);
    let v = eval(
        conn,
        &s::PES_AVAILABLE,
        &keys.each(),
        &[&num(now_ms()), publish],
    )
    .await?;
    Ok(int_of(&v))
}

/// A waiting command, Redisson's way: subscribe the primitive's channel first (so no
/// release is missed), try, and until the wait ends sleep until a message on the channel
/// or the holder's lease end (the PTTL, or the first permit's expiry) before trying again.
/// `limit`: how long the whole wait may take (None: no limit). The module's reply. With
/// `publish` "spublish" (a cluster with sharded pub/sub) the subscription is the node's.
pub(crate) async fn wait<C: ConnectionLike + Send>(
    conn: &mut C,
    subscribers: &Subscribers,
    words: &[Vec<u8>],
    limit: Option<Duration>,
    publish: &str,
) -> Result<Value> {
    // The try is the command without its WAIT (and ASYNC): one look.
    let a = Args::parse(words, s::fixed_of(words));
    let wait_ms = a.wait.as_deref().and_then(s::parse_int);
    let deadline = match wait_ms {
        Some(0) | None => limit.map(|l| Instant::now() + l),
        Some(ms) => Some(Instant::now() + Duration::from_millis(ms as u64)),
    };
    let try_words = without_wait(words);
    let channel = s::channel_of(&try_words)
        .ok_or_else(|| refused("ERR", "rlock scripts mode: this command does not wait"))?;
    let sharded = publish.eq_ignore_ascii_case("spublish");
    let mut sub = subscribers.subscribe(conn, &channel, sharded).await?;
    loop {
        let seen = sub.mark();
        let (reply, hint) = command(conn, &try_words, publish).await?;
        if s::granted(&a.verb, &reply) {
            return Ok(reply);
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) {
            return Ok(reply);
        }
        if hint == Some(-2) {
            continue; // the holder's key went between the script's two looks: try again
        }
        // Just past the lease end (the server's PTTL is in whole ms): one look.
        let wake = hint
            .filter(|h| *h >= 0)
            .map(|h| Duration::from_millis(h as u64 + s::LEASE_END_MARGIN_MS));
        let sleep = match (left, wake) {
            (Some(l), Some(w)) => Some(l.min(w)),
            (l, w) => l.or(w),
        };
        if let Heard::Broken = sub.listen(seen, sleep).await {
            // The connection broke, or the slot left its node (a release may have been
            // missed): subscribe again, on a new connection or the slot's new node,
            // before the next try.
            sub = subscribers.subscribe(conn, &channel, sharded).await?;
        }
    }
}

fn without_wait(words: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let a = Args::parse(words, s::fixed_of(words));
    let mut out = vec![a.verb.clone()];
    out.extend(a.pos.iter().cloned());
    if let Some(n) = &a.permits {
        out.extend([b"PERMITS".to_vec(), n.clone()]);
    }
    if let Some(id) = &a.id {
        out.extend([b"ID".to_vec(), id.clone()]);
    }
    out
}
