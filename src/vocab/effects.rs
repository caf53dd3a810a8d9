//! The write vocabulary of the pure cores beyond the plain lock (`rwlock`, `fenced`, and
//! later the semaphores and the latch): each [`Effect`] is one plain Redis command on one
//! key, so the glue can apply it, replicate it verbatim (with absolute expiries, design.md 1.4)
//! and fire the keyspace notification the command would. Pure data: no Redis types.
//!
//! Also the names Redisson derives from a lock name (its `prefixName`/`suffixName` rules),
//! which put every auxiliary key and channel in the name's cluster slot.

/// The bytes an effect writes (a field, a value): a word of the layout (`mode`, `write`,
/// `1`) lent for the program's life, or bytes made for this call. A constant is neither
/// copied when planned nor made into a server string on every call (the glue keeps one
/// per word), which is most of a new RW lock's own cost.
pub type Bytes = std::borrow::Cow<'static, [u8]>;

/// The value `1`: a new hold's count, a timeout key's value.
pub const ONE: Bytes = Bytes::Borrowed(b"1");

/// A plan's effects, in order. Inline up to five (a count-down, a permit taken, a new
/// write lock's mode, hold and lease, a new read lock's mode, hold, timeout key and its
/// lease, and the hash's lease), so planning a command allocates nothing for them; more
/// spill to the heap.
pub type Effects = smallvec::SmallVec<[Effect; 5]>;

/// Which key an effect writes. Auxiliary keys are named by their bytes; they are always
/// built by [`prefix_name`] or [`suffix_name`] from the main key, so they share its slot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum KeyRef {
    /// The key the command was called on (position 1).
    Main,
    Aux(Vec<u8>),
}

/// One plain command. Applied in list order; a plan's list is what the command replicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// `DEL key` (a no-op on a missing key: the glue need not replicate it then).
    Del(KeyRef),
    /// `HSET key field value`.
    HSet(KeyRef, Bytes, Bytes),
    /// `HINCRBY key field delta`; the last value is the field's value after it, so the glue
    /// can write the result without reading the field again (and tests can check it).
    HIncrBy(KeyRef, Bytes, i64, i64),
    /// `HDEL key field`.
    HDel(KeyRef, Bytes),
    /// `SET key value`, or `SET key value PXAT at` with a deadline (ms since the epoch).
    /// Without one it drops any TTL, like SET.
    Set(KeyRef, Bytes, Option<i64>),
    /// `PEXPIREAT key at`, `at` in ms since the epoch.
    PExpireAt(KeyRef, i64),
    /// `PERSIST key`: the lease became unbounded (only when some hold had no TTL).
    Persist(KeyRef),
    // Semaphores and latch:
    /// `INCRBY key delta` on a string counter (a missing key counts as 0); the last value
    /// is the counter after it. A negative delta goes out as `DECRBY key -delta`, which is
    /// what Redisson's acquire and countDown send (keyspace event `decrby`).
    IncrBy(KeyRef, i64, i64),
    /// `ZADD key score member [score member ...]`: scores are integer ms.
    ZAdd(KeyRef, Vec<(i64, Vec<u8>)>),
    /// `ZREM key member [member ...]`.
    ZRem(KeyRef, Vec<Vec<u8>>),
}

/// Redisson's `RedissonObject.prefixName`: `prefix:{name}`, or `prefix:name` when the name
/// already has a `{` (then its own hash tag decides the slot).
pub fn prefix_name(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + name.len() + 3);
    out.extend_from_slice(prefix);
    out.push(b':');
    push_tagged(&mut out, name);
    out
}

/// Redisson's `RedissonObject.suffixName`: `{name}:suffix`, or `name:suffix` when the name
/// already has a `{`.
pub fn suffix_name(name: &[u8], suffix: &[u8]) -> Vec<u8> {
    suffix_name_with(name, suffix, &[])
}

/// [`suffix_name`] followed by `more`, in one allocation (names built on every call,
/// such as a read hold's timeout key).
pub fn suffix_name_with(name: &[u8], suffix: &[u8], more: &[&[u8]]) -> Vec<u8> {
    let rest: usize = more.iter().map(|m| m.len()).sum();
    let mut out = Vec::with_capacity(name.len() + suffix.len() + 3 + rest);
    push_tagged(&mut out, name);
    out.push(b':');
    out.extend_from_slice(suffix);
    for m in more {
        out.extend_from_slice(m);
    }
    out
}

fn push_tagged(out: &mut Vec<u8>, name: &[u8]) {
    if name.contains(&b'{') {
        out.extend_from_slice(name);
    } else {
        out.push(b'{');
        out.extend_from_slice(name);
        out.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_redissons_prefix_and_suffix_rules() {
        for (prefix, name, want) in [
            ("redisson_rwlock", "rw", "redisson_rwlock:{rw}"),
            ("redisson_rwlock", "{app}:rw", "redisson_rwlock:{app}:rw"),
            ("redisson_lock_token", "f", "redisson_lock_token:{f}"),
            ("p", "a{b", "p:a{b"),
        ] {
            assert_eq!(
                prefix_name(prefix.as_bytes(), name.as_bytes()),
                want.as_bytes(),
                "{name}"
            );
        }
        assert_eq!(suffix_name(b"rw", b"o:1"), b"{rw}:o:1".to_vec());
        assert_eq!(suffix_name(b"{app}:rw", b"o:1"), b"{app}:rw:o:1".to_vec());
    }
}
