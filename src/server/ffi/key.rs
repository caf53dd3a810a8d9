//! [`LockKey`]: an open key, closed on drop; binary-safe hash and string reads and writes,
//! absolute expiry, the type checked before every read. A child of `ffi`.

use super::*;

/// What a key holds, as far as locks care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Empty,
    Hash,
    String,
    Zset,
    Other,
}

/// An open key, closed when dropped.
pub struct LockKey {
    ctx: *mut raw::RedisModuleCtx,
    key: *mut raw::RedisModuleKey,
}

impl LockKey {
    /// Opens `name` in the context's selected db. Opening may expire the key lazily, which
    /// fires the "expired" notification synchronously, before this returns.
    pub fn open(ctx: &Context, name: &RedisString, write: bool) -> LockKey {
        let mode = if write {
            raw::REDISMODULE_READ | raw::REDISMODULE_WRITE
        } else {
            raw::REDISMODULE_READ
        };
        let key = unsafe { raw::RedisModule_OpenKey.unwrap()(ctx.ctx, name.inner, mode as c_int) };
        LockKey {
            ctx: ctx.ctx,
            key: key.cast(),
        }
    }

    pub fn kind(&self) -> KeyKind {
        if self.key.is_null() {
            return KeyKind::Empty;
        }
        match unsafe { raw::RedisModule_KeyType.unwrap()(self.key) } as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY => KeyKind::Empty,
            raw::REDISMODULE_KEYTYPE_HASH => KeyKind::Hash,
            raw::REDISMODULE_KEYTYPE_STRING => KeyKind::String,
            raw::REDISMODULE_KEYTYPE_ZSET => KeyKind::Zset,
            _ => KeyKind::Other,
        }
    }

    /// Remaining TTL in ms, -1 when the key has no expiry and -2 when there is no key (as
    /// PTTL answers).
    ///
    /// An empty key is answered here, never asked of the server: Redis 8's `GetExpire` and
    /// `GetAbsExpire` read the expiry through the key's value without checking for one, so
    /// on an empty (missing, just deleted) key they dereference NULL and kill the server.
    /// Redis 7.0 and Valkey look the name up and answer "no expiry" instead.
    pub fn pttl(&self) -> i64 {
        if self.kind() == KeyKind::Empty {
            return -2;
        }
        let ttl = unsafe { raw::RedisModule_GetExpire.unwrap()(self.key) };
        if ttl == raw::REDISMODULE_NO_EXPIRE as i64 {
            -1
        } else {
            ttl
        }
    }

    /// The absolute expiry in ms since the epoch, or -1 without one (-2: no key). An empty
    /// key is answered here, as in [`LockKey::pttl`] (Redis 8 would crash on it).
    pub fn abs_expire(&self) -> i64 {
        if self.kind() == KeyKind::Empty {
            return -2;
        }
        match unsafe { raw::RedisModule_GetAbsExpire } {
            Some(get) => {
                let at = unsafe { get(self.key) };
                if at == raw::REDISMODULE_NO_EXPIRE as i64 {
                    -1
                } else {
                    at
                }
            }
            None => match self.pttl() {
                ttl if ttl < 0 => ttl,
                ttl => now_ms() + ttl,
            },
        }
    }

    /// The number of fields of a hash (elements of any other type).
    pub fn value_length(&self) -> usize {
        if self.kind() == KeyKind::Empty {
            return 0;
        }
        unsafe { raw::RedisModule_ValueLength.unwrap()(self.key) }
    }

    /// Calls `f` with the value of one hash field (binary-safe), if the field exists. One
    /// lookup, where reading the whole hash needs a scan cursor and a string per field.
    pub fn hash_get_with<R>(&self, field: &RedisString, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        if self.kind() != KeyKind::Hash {
            return None;
        }
        let mut value: *mut raw::RedisModuleString = ptr::null_mut();
        unsafe {
            raw::RedisModule_HashGet.unwrap()(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                ptr::addr_of_mut!(value),
                ptr::null::<c_char>(),
            );
        }
        if value.is_null() {
            return None;
        }
        let out = f(string_bytes(value));
        unsafe { raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), value) };
        Some(out)
    }

    /// All (field, value) pairs of a hash key.
    pub fn hash_fields(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        extern "C" fn collect(
            _key: *mut raw::RedisModuleKey,
            field: *mut raw::RedisModuleString,
            value: *mut raw::RedisModuleString,
            privdata: *mut c_void,
        ) {
            let out = unsafe { &mut *privdata.cast::<Vec<(Vec<u8>, Vec<u8>)>>() };
            out.push((string_bytes(field).to_vec(), string_bytes(value).to_vec()));
        }
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        if self.kind() != KeyKind::Hash {
            return out;
        }
        unsafe {
            let cursor = raw::RedisModule_ScanCursorCreate.unwrap()();
            while raw::RedisModule_ScanKey.unwrap()(
                self.key,
                cursor,
                Some(collect),
                ptr::addr_of_mut!(out).cast(),
            ) != 0
            {}
            raw::RedisModule_ScanCursorDestroy.unwrap()(cursor);
        }
        out
    }

    /// `HSET key field value` (binary-safe field).
    pub fn hash_set(&self, field: &RedisString, value: &RedisString) {
        unsafe {
            raw::RedisModule_HashSet.unwrap()(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                value.inner,
                ptr::null::<c_char>(),
            );
        }
    }

    /// `HSET key f1 v1 f2 v2` in one call.
    pub fn hash_set2(
        &self,
        f1: &RedisString,
        v1: &RedisString,
        f2: &RedisString,
        v2: &RedisString,
    ) {
        unsafe {
            raw::RedisModule_HashSet.unwrap()(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                f1.inner,
                v1.inner,
                f2.inner,
                v2.inner,
                ptr::null::<c_char>(),
            );
        }
    }

    /// `HDEL key field` (binary-safe field).
    pub fn hash_del(&self, field: &RedisString) {
        unsafe {
            raw::RedisModule_HashSet.unwrap()(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field.inner,
                raw::REDISMODULE_HASH_DELETE,
                ptr::null::<c_char>(),
            );
        }
    }

    /// The value of a string key (copied out).
    pub fn string_get(&self) -> Vec<u8> {
        self.with_string(<[u8]>::to_vec)
    }

    /// `f` of the string value where it lies in the server (no copy); `f(&[])` if the key
    /// holds no string.
    pub fn with_string<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        if self.kind() != KeyKind::String {
            return f(&[]);
        }
        let mut len: usize = 0;
        unsafe {
            let p = raw::RedisModule_StringDMA.unwrap()(
                self.key,
                &mut len,
                raw::REDISMODULE_READ as c_int,
            );
            if p.is_null() {
                f(&[])
            } else {
                f(std::slice::from_raw_parts(p.cast::<u8>(), len))
            }
        }
    }

    /// Writes the decimal `n` over the string at a key opened for writing, in place, as
    /// INCRBY does: the key keeps its TTL and its place in the keyspace. (StringSet
    /// deletes the key and adds a new one, dropping the TTL: three times the cost on a
    /// semaphore's acquire.) Creates the key if it is empty.
    pub fn string_write_number(&self, n: i64) {
        let digits = crate::vocab::apply::itoa(n);
        let digits = digits.as_bytes();
        let dma = || {
            let mut len: usize = 0;
            let p = unsafe {
                raw::RedisModule_StringDMA.unwrap()(
                    self.key,
                    &mut len,
                    raw::REDISMODULE_WRITE as c_int,
                )
            };
            (p, len)
        };
        // A count mostly keeps its number of digits: then it is written over as it lies,
        // without resizing it first. (An empty key gives a length of 0: it is created by
        // the resize.)
        let (mut p, mut len) = dma();
        if p.is_null() || len != digits.len() {
            let resized =
                unsafe { raw::RedisModule_StringTruncate.unwrap()(self.key, digits.len()) };
            if resized != raw::REDISMODULE_OK as c_int {
                return;
            }
            (p, len) = dma();
        }
        if !p.is_null() && len == digits.len() {
            unsafe { ptr::copy_nonoverlapping(digits.as_ptr(), p.cast::<u8>(), len) };
        }
    }

    /// `SET key value` on a key opened for writing.
    pub fn string_set(&self, value: &RedisString) {
        unsafe {
            raw::RedisModule_StringSet.unwrap()(self.key, value.inner);
        }
    }

    /// `ZADD key score member` on a key opened for writing (scores are integer ms, exact
    /// as doubles below 2^53).
    pub fn zset_add(&self, score: i64, member: &RedisString) {
        unsafe {
            raw::RedisModule_ZsetAdd.unwrap()(
                self.key,
                score as f64,
                member.inner,
                ptr::null_mut(),
            );
        }
    }

    /// `ZREM key member` on a key opened for writing.
    pub fn zset_rem(&self, member: &RedisString) {
        let mut deleted: c_int = 0;
        unsafe {
            raw::RedisModule_ZsetRem.unwrap()(self.key, member.inner, &mut deleted);
        }
    }

    /// Every (member, score) of a sorted set, lowest score first (non-integer scores as
    /// i64::MIN; out-of-range ones saturate).
    pub fn zset_items(&self) -> Vec<(Vec<u8>, i64)> {
        self.zset_through(|_| false)
    }

    /// [`zset_items`](Self::zset_items) from the lowest score up to and including the
    /// first member whose score `last` accepts: a reader that needs only the start of a
    /// large set (the permits whose lease ended, and the next to end) pays for that part,
    /// in one walk.
    pub fn zset_through(&self, mut last: impl FnMut(i64) -> bool) -> Vec<(Vec<u8>, i64)> {
        let mut out = Vec::new();
        if self.kind() != KeyKind::Zset {
            return out;
        }
        unsafe {
            let first = raw::RedisModule_ZsetFirstInScoreRange.unwrap()(
                self.key,
                f64::NEG_INFINITY,
                f64::INFINITY,
                0,
                0,
            );
            if first == raw::REDISMODULE_OK as c_int {
                while raw::RedisModule_ZsetRangeEndReached.unwrap()(self.key) == 0 {
                    let mut score: f64 = 0.0;
                    let member =
                        raw::RedisModule_ZsetRangeCurrentElement.unwrap()(self.key, &mut score);
                    if member.is_null() {
                        break;
                    }
                    // A score that is no integer reads as i64::MIN, which no primitive
                    // writes and every reader refuses (a spoiled permit set).
                    let score = if score.fract() == 0.0 {
                        score as i64
                    } else {
                        i64::MIN
                    };
                    out.push((string_bytes(member).to_vec(), score));
                    raw::RedisModule_FreeString.unwrap()(ptr::null_mut(), member);
                    if last(score) || raw::RedisModule_ZsetRangeNext.unwrap()(self.key) == 0 {
                        break;
                    }
                }
            }
            raw::RedisModule_ZsetRangeStop.unwrap()(self.key);
        }
        out
    }

    /// `PERSIST key`: drops the key's TTL.
    pub fn persist(&self) {
        if self.kind() == KeyKind::Empty {
            return;
        }
        unsafe {
            raw::RedisModule_SetExpire.unwrap()(self.key, raw::REDISMODULE_NO_EXPIRE as i64);
        }
    }

    /// Whether the key holds a string.
    pub fn is_string(&self) -> bool {
        !self.key.is_null()
            && unsafe { raw::RedisModule_KeyType.unwrap()(self.key) } as isize
                == raw::REDISMODULE_KEYTYPE_STRING
    }

    pub fn delete(&self) {
        unsafe {
            raw::RedisModule_DeleteKey.unwrap()(self.key);
        }
    }

    /// Sets the absolute expiry (ms since the epoch). Falls back to a relative expiry on a
    /// server without `SetAbsExpire`; the replicated PEXPIREAT is absolute either way.
    pub fn set_abs_expire(&self, at: i64) {
        if self.kind() == KeyKind::Empty {
            return;
        }
        unsafe {
            match raw::RedisModule_SetAbsExpire {
                Some(set_abs) => {
                    set_abs(self.key, at);
                }
                None => {
                    raw::RedisModule_SetExpire.unwrap()(self.key, (at - now_ms()).max(1));
                }
            }
        }
    }
}

impl Drop for LockKey {
    fn drop(&mut self) {
        if !self.key.is_null() {
            unsafe { raw::RedisModule_CloseKey.unwrap()(self.key) };
        }
        let _ = self.ctx;
    }
}
