//! Queued tickets (design.md 5, docs/commands/tickets.md): the notification's channel and message, and
//! the owner and request id a queued request names.
//!
//! Layer: pure (no Redis), beside the cores; the engine publishes what this builds when a
//! ticket leaves its queue. A ticket is a waiter that holds no connection: the engine
//! keeps it in the key's FIFO queue like a blocked client, and announces its end on the
//! key's ticket channel instead of answering a blocked call.

use crate::vocab::effects::prefix_name;
use crate::vocab::reply::Reply;

/// How a ticket left its queue: the first word of its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End<'a> {
    /// Granted: written in the server, its reply remembered under the request id. The
    /// bytes are the message's detail: empty, or what the holder needs of the grant's
    /// reply (the fenced lock's token, an expirable semaphore's permit ids; see
    /// [`reply_detail`]), so that it holds on the message without collecting first.
    Granted(&'a [u8]),
    /// Its deadline passed; nothing was granted.
    TimedOut,
    /// It can never be granted here (a redirection, a role change, the primitive's
    /// refusal): the error text.
    Error(&'a str),
}

/// The ticket channel of a key: `rlock_ticket:{key}`, or `rlock_ticket:key` when the key
/// has a `{` (Redisson's `prefixName` rule), so that it hashes to the key's cluster slot
/// and SPUBLISH reaches the subscribers of the node that owns it.
pub fn channel(key: &[u8]) -> Vec<u8> {
    prefix_name(b"rlock_ticket", key)
}

/// The channel of a ticket's messages: the key's [`channel`], with `:tag` appended for a
/// ticket queued with `NOTIFY tag` (`rlock_ticket:{orders:42}:c7f3a9e1`). The tag has no
/// braces (`args::parse_tag`), so where the key's channel has a hash tag the tagged
/// channel hashes to the same cluster slot.
pub fn tagged_channel(key: &[u8], tag: Option<&[u8]>) -> Vec<u8> {
    let mut out = channel(key);
    if let Some(tag) = tag {
        out.reserve_exact(1 + tag.len());
        out.push(b':');
        out.extend_from_slice(tag);
    }
    out
}

/// `<kind>:<id-length>:<owner-length>:<id><owner><detail>`: the lengths make it
/// unambiguous whatever bytes the id and owner hold (Redisson's owners contain `:`).
pub fn message(end: End, id: &[u8], owner: &[u8]) -> Vec<u8> {
    let (kind, detail): (&str, &[u8]) = match end {
        End::Granted(detail) => ("granted", detail),
        End::TimedOut => ("timeout", b""),
        End::Error(text) => ("error", text.as_bytes()),
    };
    let head = format!("{kind}:{}:{}:", id.len(), owner.len());
    let mut out = Vec::with_capacity(head.len() + id.len() + owner.len() + detail.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(id);
    out.extend_from_slice(owner);
    out.extend_from_slice(detail);
    out
}

/// A grant's reply as a `granted` message's detail (design.md 5): an integer in decimal,
/// a bulk string as it is, an array's items so written and joined by `,` with nils left
/// out, nil as nothing. The fenced lock's `[nil, token]` reads `<token>`; an expirable
/// semaphore's permit id `<id>`, and its ids (`PERMITS n`) `<id>,<id>,...` (ids are hex).
pub fn reply_detail(reply: &Reply) -> Vec<u8> {
    let mut out = Vec::new();
    detail_into(reply, &mut out);
    out
}

fn detail_into(reply: &Reply, out: &mut Vec<u8>) {
    match reply {
        Reply::Nil => {}
        Reply::Int(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Reply::Bulk(bytes) => out.extend_from_slice(bytes),
        Reply::Array(items) => {
            for item in items.iter().filter(|i| **i != Reply::Nil) {
                if !out.is_empty() {
                    out.push(b',');
                }
                detail_into(item, out);
            }
        }
    }
}

/// A queued request's owner and request id in one allocation (a queued ticket holds
/// thousands of requests, and its message names both): the lock's and the RW lock's asks
/// keep theirs this way.
#[derive(Debug, Clone)]
pub struct Names {
    bytes: Box<[u8]>,
    owner_len: u32,
    has_id: bool,
}

impl Names {
    pub fn new(owner: &[u8], id: Option<&[u8]>) -> Names {
        Names {
            bytes: [owner, id.unwrap_or_default()].concat().into_boxed_slice(),
            owner_len: owner.len() as u32,
            has_id: id.is_some(),
        }
    }

    pub fn owner(&self) -> &[u8] {
        &self.bytes[..self.owner_len as usize]
    }

    pub fn id(&self) -> Option<&[u8]> {
        self.has_id.then(|| &self.bytes[self.owner_len as usize..])
    }
}

/// What a message says, read back (clients parse it the same way; used by the tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<'a> {
    pub kind: &'a [u8],
    pub id: &'a [u8],
    pub owner: &'a [u8],
    pub detail: &'a [u8],
}

/// Parses a ticket message; `None` if it is not one.
pub fn parse(message: &[u8]) -> Option<Parsed<'_>> {
    let mut fields = message.splitn(4, |&b| b == b':');
    let kind = fields.next()?;
    let number = |f: Option<&[u8]>| -> Option<usize> {
        let f = f?;
        if f.is_empty() || f.len() > 10 || !f.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(f).ok()?.parse().ok()
    };
    let id_len = number(fields.next())?;
    let owner_len = number(fields.next())?;
    let rest = fields.next()?;
    if rest.len() < id_len.checked_add(owner_len)? {
        return None;
    }
    let (id, rest) = rest.split_at(id_len);
    let (owner, detail) = rest.split_at(owner_len);
    Some(Parsed {
        kind,
        id,
        owner,
        detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn channel_is_in_the_keys_slot() {
        assert_eq!(channel(b"lock"), b"rlock_ticket:{lock}".to_vec());
        assert_eq!(channel(b"{app}:lock"), b"rlock_ticket:{app}:lock".to_vec());
    }

    #[test]
    fn a_tagged_channel_is_the_keys_with_the_tag_appended() {
        assert_eq!(tagged_channel(b"lock", None), channel(b"lock"));
        assert_eq!(
            tagged_channel(b"orders:42", Some(b"c7f3a9e1")),
            b"rlock_ticket:{orders:42}:c7f3a9e1".to_vec()
        );
        assert_eq!(
            tagged_channel(b"{app}:lock", Some(b"c7f3a9e1")),
            b"rlock_ticket:{app}:lock:c7f3a9e1".to_vec()
        );
    }

    #[test]
    fn messages_name_the_request_and_owner() {
        assert_eq!(
            message(End::Granted(b""), b"r1", b"client-1"),
            b"granted:2:8:r1client-1".to_vec()
        );
        assert_eq!(
            message(End::Granted(b"1025"), b"r1", b"o"),
            b"granted:2:1:r1o1025".to_vec()
        );
        assert_eq!(message(End::TimedOut, b"r", b""), b"timeout:1:0:r".to_vec());
        let m = message(End::Error("MOVED 12 127.0.0.1:7001"), b"id", b"uuid:7");
        assert_eq!(m, b"error:2:6:iduuid:7MOVED 12 127.0.0.1:7001".to_vec());
        let p = parse(&m).unwrap();
        assert_eq!(
            (p.kind, p.id, p.owner, p.detail),
            (
                &b"error"[..],
                &b"id"[..],
                &b"uuid:7"[..],
                &b"MOVED 12 127.0.0.1:7001"[..]
            )
        );
    }

    #[test]
    fn a_grants_detail_is_what_its_holder_needs_of_the_reply() {
        let id = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
        for (reply, detail) in [
            (Reply::Nil, ""),
            (Reply::Int(1), "1"),
            (
                Reply::Array(vec![Reply::Nil, Reply::Int(4_194_305)]),
                "4194305",
            ),
            (id("0a1b"), "0a1b"),
            (Reply::Array(vec![id("0a1b"), id("ff00")]), "0a1b,ff00"),
        ] {
            assert_eq!(reply_detail(&reply), detail.as_bytes(), "{reply:?}");
        }
    }

    #[test]
    fn names_keep_owner_and_id_apart() {
        let n = Names::new(b"uuid:7", Some(b"r1"));
        assert_eq!((n.owner(), n.id()), (&b"uuid:7"[..], Some(&b"r1"[..])));
        let n = Names::new(b"uuid:7", None);
        assert_eq!((n.owner(), n.id()), (&b"uuid:7"[..], None));
        assert_eq!(Names::new(b"o", Some(b"")).id(), Some(&b""[..]));
    }

    #[test]
    fn parse_refuses_what_is_no_ticket_message() {
        for bad in [
            &b""[..],
            b"granted",
            b"granted:1:1:",
            b"granted:x:0:",
            b"granted:-1:0:a",
            b"g:99999999999:0:",
        ] {
            assert!(parse(bad).is_none(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    proptest! {
        #[test]
        fn messages_read_back(id in proptest::collection::vec(any::<u8>(), 1..40),
                              owner in proptest::collection::vec(any::<u8>(), 0..60),
                              err in "[ -~]{0,30}") {
            for (end, kind, detail) in [
                (End::Granted(b""), &b"granted"[..], &b""[..]),
                (End::Granted(err.as_bytes()), b"granted", err.as_bytes()),
                (End::TimedOut, b"timeout", b""),
                (End::Error(&err), b"error", err.as_bytes()),
            ] {
                let m = message(end, &id, &owner);
                let p = parse(&m).unwrap();
                prop_assert_eq!((p.kind, p.id, p.owner, p.detail), (kind, &id[..], &owner[..], detail));
            }
        }
    }
}
