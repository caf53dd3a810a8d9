//! The replies of every primitive, pure: what a command answers, what a woken waiter is
//! told, and what a request id remembers (encoded into a string key, see
//! [`encode`]/[`decode`]).
//!
//! Layer: pure, under the rules (`lock::rule`, `rwlock`, `fenced`, `semaphore`, `expirable`,
//! `latch`), which all answer with it; `ffi` turns it into a RESP reply.

use crate::vocab::args::parse_i64;

/// One RESP reply: nil, an integer, a bulk string (a permit id, a mode), or an array of
/// replies (permit ids; a fenced acquire's `[pttl, token]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    Bulk(Vec<u8>),
    Array(Vec<Reply>),
}

/// The reply of a command that only ever answers nil or an integer (the lock's, the RW
/// lock's), small and `Copy` so that their plans are; [`Reply`] converts from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShortReply {
    Nil,
    Int(i64),
}

/// A short reply (the lock's own, `Copy`: its plans are `Copy`), as any primitive's.
impl From<ShortReply> for Reply {
    fn from(reply: ShortReply) -> Reply {
        match reply {
            ShortReply::Nil => Reply::Nil,
            ShortReply::Int(n) => Reply::Int(n),
        }
    }
}

/// How a remembered reply is stored: `nil`, a decimal integer (the two forms the lock has
/// always written, so records written before arrays existed still read back), `$` and
/// the bytes for a bulk string, or `*<n>:` and each element as `<len>:<encoding>`.
pub fn encode(reply: &Reply) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(reply, &mut out);
    out
}

fn encode_into(reply: &Reply, out: &mut Vec<u8>) {
    match reply {
        Reply::Nil => out.extend_from_slice(b"nil"),
        Reply::Int(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Reply::Bulk(bytes) => {
            out.push(b'$');
            out.extend_from_slice(bytes);
        }
        Reply::Array(items) => {
            out.extend_from_slice(format!("*{}:", items.len()).as_bytes());
            for item in items {
                let inner = encode(item);
                out.extend_from_slice(format!("{}:", inner.len()).as_bytes());
                out.extend_from_slice(&inner);
            }
        }
    }
}

/// The reply [`encode`] stored, or `None` for bytes it never writes (a record somebody
/// else overwrote is not replayed).
pub fn decode(stored: &[u8]) -> Option<Reply> {
    match stored.first()? {
        b'$' => Some(Reply::Bulk(stored[1..].to_vec())),
        b'*' => {
            let (n, mut rest) = split_len(&stored[1..])?;
            let mut items = Vec::with_capacity(n.min(1024));
            for _ in 0..n {
                let (len, tail) = split_len(rest)?;
                if tail.len() < len {
                    return None;
                }
                items.push(decode(&tail[..len])?);
                rest = &tail[len..];
            }
            rest.is_empty().then_some(Reply::Array(items))
        }
        _ if stored == b"nil" => Some(Reply::Nil),
        _ => parse_i64(stored).map(Reply::Int),
    }
}

/// `<decimal>:` at the start of `bytes`, and what follows it.
fn split_len(bytes: &[u8]) -> Option<(usize, &[u8])> {
    let colon = bytes.iter().position(|&b| b == b':')?;
    let n = parse_i64(&bytes[..colon]).filter(|&n| n >= 0)?;
    Some((usize::try_from(n).ok()?, &bytes[colon + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reply_reads_back_as_written() {
        let cases = [
            Reply::Nil,
            Reply::Int(0),
            Reply::Int(-1),
            Reply::Int(i64::MAX),
            Reply::Bulk(Vec::new()),
            Reply::Bulk(b"nil".to_vec()),
            Reply::Bulk(b"12:*3:".to_vec()),
            Reply::Array(vec![]),
            Reply::Array(vec![Reply::Int(-1), Reply::Int(1 << 50)]),
            Reply::Array(vec![
                Reply::Bulk(b"a:b".to_vec()),
                Reply::Nil,
                Reply::Array(vec![Reply::Bulk(b"$".to_vec())]),
            ]),
        ];
        for reply in cases {
            assert_eq!(decode(&encode(&reply)), Some(reply.clone()), "{reply:?}");
        }
    }

    #[test]
    fn it_keeps_the_lock_records_written_before_arrays() {
        assert_eq!(decode(b"nil"), Some(Reply::Nil));
        assert_eq!(decode(b"42"), Some(Reply::Int(42)));
        for reply in [ShortReply::Nil, ShortReply::Int(0), ShortReply::Int(-1)] {
            let any = Reply::from(reply);
            assert_eq!(decode(&encode(&any)), Some(any));
        }
    }

    #[test]
    fn it_refuses_what_it_never_writes() {
        for stored in [
            &b""[..],
            b"x",
            b"*2:1:1",
            b"*1:5:1",
            b"*1:1:1junk",
            b"*-1:",
            b"*a:",
        ] {
            assert_eq!(
                decode(stored),
                None,
                "{:?}",
                String::from_utf8_lossy(stored)
            );
        }
    }
}
