//! The payload of `RLOCK.APPLY`, the internal command that carries one module command's
//! writes to replicas and the AOF (design.md 1.4, `rlock.replication commands`). Pure: the glue
//! that sends it is `server::ffi::replication`, the command that applies it is
//! `server::replication`.
//!
//! `RLOCK.APPLY` has one argument: the plain commands it carries, one after another, each
//! written as a RESP array of bulk strings, exactly as a client would send it
//! (`*3\r\n$4\r\nDEL\r\n...`). One argument, not one per word, because the server pays
//! for every argument of a propagated command (an object, and its own `$len` framing in
//! the AOF and the replication stream), on every lock command; the RESP inside keeps it
//! readable in an AOF and binary-safe.

/// The internal command's name, as the server knows it.
pub const APPLY: &str = "RLOCK.APPLY";

/// Appends one command (`name`, then `args`) to a payload.
///
/// Written for the lock's hot path (it runs for every lock command that writes more than
/// one thing): small numbers written digit by digit instead of through a buffer, large
/// ones two digits a step, fixed-size pieces in one copy each. It was a tenth of an
/// uncontended RLOCK.ACQUIRE under propagation, mostly `itoa` and two-byte pushes.
pub fn push_command<'a>(
    out: &mut Vec<u8>,
    name: &[u8],
    args: impl ExactSizeIterator<Item = Word<'a>>,
) {
    // No reservation: the sender keeps one payload buffer from batch to batch, so it has
    // grown to its size after the first few.
    push_header(out, b'*', args.len() as u64 + 1);
    push_bulk(out, name);
    for arg in args {
        push_word(out, arg);
    }
}

// Inlined: a call per word cost about 20 instructions each on a lock command's payload.
#[inline(always)]
fn push_word(out: &mut Vec<u8>, word: Word) {
    match word {
        Word::Bytes(b) => push_bulk(out, b),
        Word::Int(n) => push_bulk(out, itoa(n).as_bytes()),
    }
}

/// Appends words as one RESP array (`*3\r\n$1\r\nk...`): the one argument of an internal
/// command that stands for a module command made deterministic (`RLOCK.ACQUIREAT`'s key,
/// owner and deadline), read back by [`decode_words`].
pub fn push_words<'a>(out: &mut Vec<u8>, words: impl ExactSizeIterator<Item = Word<'a>>) {
    push_header(out, b'*', words.len() as u64);
    for word in words {
        push_word(out, word);
    }
}

/// One argument of a carried command: bytes, or an integer written in decimal.
#[derive(Debug, Clone, Copy)]
pub enum Word<'a> {
    Bytes(&'a [u8]),
    Int(i64),
}

// Fixed-size pieces go in with one `extend_from_slice` each: the compiler turns a copy of
// a known small size into a store, where separate pushes each checked the capacity.
fn push_header(out: &mut Vec<u8>, kind: u8, n: u64) {
    if n < 10 {
        out.extend_from_slice(&[kind, b'0' + n as u8, b'\r', b'\n']);
    } else if n < 100 {
        out.extend_from_slice(&[
            kind,
            b'0' + (n / 10) as u8,
            b'0' + (n % 10) as u8,
            b'\r',
            b'\n',
        ]);
    } else {
        out.push(kind);
        out.extend_from_slice(itoa(n as i64).as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

fn push_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    push_header(out, b'$', bytes.len() as u64);
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// Decimal digits of an integer without a heap allocation (the payload's integers, a
/// counter written in place by the key API, the number in a read hold's key name).
pub struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// "00" to "99": two digits per step (a 13-digit millisecond time is 7 steps, not 13).
const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

pub fn itoa(n: i64) -> Digits {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    let mut v = n.unsigned_abs();
    while v >= 100 {
        let pair = (v % 100) as usize * 2;
        v /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if v >= 10 {
        let pair = v as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + v as u8;
    }
    if n < 0 {
        i -= 1;
        buf[i] = b'-';
    }
    Digits { buf, start: i }
}

/// The commands a payload carries, each as its words (the name first). An error names
/// what is wrong; then nothing may be applied.
pub fn decode(payload: &[u8]) -> Result<Vec<Vec<&[u8]>>, &'static str> {
    const BAD: &str = "BADPAYLOAD RLOCK.APPLY: malformed payload";
    let mut commands = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        let (n, next) = header(payload, at, b'*').ok_or(BAD)?;
        at = next;
        if n == 0 {
            return Err(BAD);
        }
        let mut words = Vec::with_capacity(n);
        for _ in 0..n {
            let (len, next) = header(payload, at, b'$').ok_or(BAD)?;
            let end = next
                .checked_add(len)
                .filter(|&e| e + 2 <= payload.len())
                .ok_or(BAD)?;
            if &payload[end..end + 2] != b"\r\n" {
                return Err(BAD);
            }
            words.push(&payload[next..end]);
            at = end + 2;
        }
        commands.push(words);
    }
    if commands.is_empty() {
        return Err("BADPAYLOAD RLOCK.APPLY: nothing to apply");
    }
    Ok(commands)
}

/// The words [`push_words`] wrote: exactly one array of `n` words, or an error naming
/// what is wrong.
pub fn decode_words(payload: &[u8], n: usize) -> Result<Vec<&[u8]>, &'static str> {
    match decode(payload) {
        Ok(mut arrays) if arrays.len() == 1 && arrays[0].len() == n => Ok(arrays.remove(0)),
        _ => Err("BADPAYLOAD malformed internal command"),
    }
}

/// `<kind><decimal>\r\n` at `at`: the number and where what follows starts.
fn header(payload: &[u8], at: usize, kind: u8) -> Option<(usize, usize)> {
    if payload.get(at) != Some(&kind) {
        return None;
    }
    let mut n: usize = 0;
    let mut i = at + 1;
    while let Some(&b) = payload.get(i) {
        match b {
            b'0'..=b'9' if i - at <= 18 => n = n * 10 + usize::from(b - b'0'),
            b'\r' if i > at + 1 && payload.get(i + 1) == Some(&b'\n') => return Some((n, i + 2)),
            _ => return None,
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;

    #[test]
    fn commands_come_back_as_they_were_written() {
        let mut p = Vec::new();
        push_command(
            &mut p,
            b"HSET",
            [Word::Bytes(b"k"), Word::Bytes(b"o\r\n\0"), Word::Int(1)].into_iter(),
        );
        push_command(
            &mut p,
            b"PEXPIREAT",
            [Word::Bytes(b"k"), Word::Int(1_795_547_430_676)].into_iter(),
        );
        push_command(
            &mut p,
            b"HINCRBY",
            [Word::Bytes(b"k"), Word::Bytes(b""), Word::Int(-1)].into_iter(),
        );
        assert_eq!(
            decode(&p).unwrap(),
            vec![
                vec![&b"HSET"[..], b"k", b"o\r\n\0", b"1"],
                vec![&b"PEXPIREAT"[..], b"k", b"1795547430676"],
                vec![&b"HINCRBY"[..], b"k", b"", b"-1"],
            ]
        );
        assert!(
            p.starts_with(b"*4\r\n$4\r\nHSET\r\n$1\r\nk\r\n"),
            "plain RESP"
        );
    }

    /// The encoding as plainly as it can be written: what the one-pass writer must match.
    fn reference(name: &[u8], args: &[Word]) -> Vec<u8> {
        let mut words: Vec<Vec<u8>> = vec![name.to_vec()];
        for arg in args {
            words.push(match *arg {
                Word::Bytes(b) => b.to_vec(),
                Word::Int(n) => n.to_string().into_bytes(),
            });
        }
        let mut out = format!("*{}\r\n", words.len()).into_bytes();
        for w in words {
            out.extend_from_slice(format!("${}\r\n", w.len()).as_bytes());
            out.extend_from_slice(&w);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    #[test]
    fn every_length_and_integer_is_framed_as_resp_frames_it() {
        let ints = [
            0,
            9,
            10,
            99,
            100,
            999,
            1_000,
            9_999,
            10_000,
            99_999,
            100_000,
            -1,
            -10,
            -10_000,
            1_795_547_430_676,
            i64::MAX,
            i64::MIN,
        ];
        let lens = [0, 1, 9, 10, 99, 100, 999, 1_000, 10_000, 100_000];
        let mut p = b"*1\r\n$3\r\nDEL\r\n".to_vec(); // what a batch already holds
        let mut expected = p.clone();
        for &len in &lens {
            let bytes = vec![b'x'; len];
            let args: Vec<Word> = std::iter::once(Word::Bytes(&bytes))
                .chain(ints.iter().map(|&n| Word::Int(n)))
                .collect();
            push_command(&mut p, b"HSET", args.iter().copied());
            expected.extend_from_slice(&reference(b"HSET", &args));
        }
        // 10, 100 and 1 000 words: the count's own digits change too.
        for n in [9usize, 10, 99, 100, 999] {
            let args = vec![Word::Int(7); n];
            push_command(&mut p, b"ZADD", args.iter().copied());
            expected.extend_from_slice(&reference(b"ZADD", &args));
        }
        assert_eq!(p, expected);
        assert!(decode(&p).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn any_command_is_written_as_resp_writes_it(
            name in proptest::collection::vec(proptest::num::u8::ANY, 1..20),
            args in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::num::i64::ANY.prop_map(Err),
                    proptest::collection::vec(proptest::num::u8::ANY, 0..300).prop_map(Ok),
                ],
                0..12,
            ),
        ) {
            let words: Vec<Word> = args
                .iter()
                .map(|a| match a {
                    Ok(b) => Word::Bytes(b),
                    Err(n) => Word::Int(*n),
                })
                .collect();
            let mut p = Vec::new();
            push_command(&mut p, &name, words.iter().copied());
            proptest::prop_assert_eq!(&p, &reference(&name, &words));
            let decoded = decode(&p).unwrap();
            proptest::prop_assert_eq!(decoded.len(), 1);
            proptest::prop_assert_eq!(decoded[0].len(), words.len() + 1);
        }
    }

    #[test]
    fn words_come_back_as_one_array_of_as_many() {
        let mut p = Vec::new();
        push_words(
            &mut p,
            [
                Word::Bytes(b"k"),
                Word::Bytes(b"o\r\n"),
                Word::Int(1_795_547_430_676),
            ]
            .into_iter(),
        );
        assert_eq!(
            p,
            b"*3\r\n$1\r\nk\r\n$3\r\no\r\n\r\n$13\r\n1795547430676\r\n"
        );
        assert_eq!(
            decode_words(&p, 3).unwrap(),
            vec![&b"k"[..], b"o\r\n", b"1795547430676"]
        );
        assert!(decode_words(&p, 2).is_err(), "as many as asked");
        let mut two = p.clone();
        two.extend_from_slice(&p);
        assert!(decode_words(&two, 3).is_err(), "one array");
        assert!(decode_words(b"", 3).is_err());
        assert!(decode_words(&p[..p.len() - 1], 3).is_err());
    }

    #[test]
    fn integers_are_written_in_decimal() {
        for n in [
            0,
            7,
            -7,
            10,
            99,
            100,
            -101,
            1_795_547_430_676,
            i64::MAX,
            i64::MIN,
        ] {
            assert_eq!(itoa(n).as_bytes(), n.to_string().as_bytes());
        }
    }

    #[test]
    fn malformed_payloads_are_refused_whole() {
        for bad in [
            &b""[..],
            b"*1\r\n",
            b"*0\r\n",
            b"*1\r\n$3\r\nDEL",
            b"*1\r\n$3\r\nDELxx",
            b"*1\r\n$-1\r\n",
            b"*1\r\n$99999999999999999999\r\nDEL\r\n",
            b"$3\r\nDEL\r\n",
            b"*2\r\n$3\r\nDEL\r\n",
            b"DEL k",
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
    }
}
