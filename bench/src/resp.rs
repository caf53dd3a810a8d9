//! A bare RESP2 connection for the pipelined throughput runs, bulk loading and the
//! thousands of parked waiters of the memory run. redis-rs allocates a `Value` per
//! reply; at several hundred thousand replies a second on a 2-core machine the client
//! would then compete with the server for CPU and compress every ratio toward 1, so
//! here replies are parsed in place and only their kind is kept.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::Res;

/// The kind of a reply, without its payload (enough to check a lock outcome).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Nil,
    Int(i64),
    /// A simple string such as `+OK`.
    Status,
    Bulk,
    Array,
    Error(String),
}

/// Appends one command in RESP to `buf`.
pub fn encode(buf: &mut Vec<u8>, args: &[&[u8]]) {
    buf.push(b'*');
    push_num(buf, args.len() as i64);
    for a in args {
        buf.push(b'$');
        push_num(buf, a.len() as i64);
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
}

fn push_num(buf: &mut Vec<u8>, n: i64) {
    // itoa without allocation; the hot path of batch building.
    let mut tmp = [0u8; 20];
    let mut i = tmp.len();
    let neg = n < 0;
    let mut v = n.unsigned_abs();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if neg {
        buf.push(b'-');
    }
    buf.extend_from_slice(&tmp[i..]);
    buf.extend_from_slice(b"\r\n");
}

pub struct RawConn {
    stream: TcpStream,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
}

impl RawConn {
    pub fn connect(port: u16) -> Res<RawConn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        // Bounded: a server that stops answering fails the run instead of hanging it.
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(RawConn {
            stream,
            buf: vec![0; 64 * 1024],
            pos: 0,
            end: 0,
        })
    }

    /// Sends `n` commands in pipelined batches of 1000: `command(j, buf)` encodes the
    /// j-th into `buf`, `check` judges each reply (an error stops the load).
    pub fn load(
        &mut self,
        n: u64,
        mut command: impl FnMut(u64, &mut Vec<u8>),
        mut check: impl FnMut(Reply) -> Res<()>,
    ) -> Res<()> {
        let mut buf = Vec::new();
        let mut i = 0;
        while i < n {
            buf.clear();
            let batch = (n - i).min(1000);
            for j in i..i + batch {
                command(j, &mut buf);
            }
            self.send(&buf)?;
            for _ in 0..batch {
                check(self.read_reply()?)?;
            }
            i += batch;
        }
        Ok(())
    }

    pub fn send(&mut self, bytes: &[u8]) -> Res<()> {
        self.stream.write_all(bytes)?;
        Ok(())
    }

    /// Sends one command and reads its reply.
    pub fn call(&mut self, args: &[&[u8]]) -> Res<Reply> {
        let mut b = Vec::new();
        encode(&mut b, args);
        self.send(&b)?;
        self.read_reply()
    }

    pub fn read_reply(&mut self) -> Res<Reply> {
        let line = self.read_line()?;
        let (kind, rest) = (line[0], &line[1..]);
        let reply = match kind {
            b'+' => Reply::Status,
            b'-' => Reply::Error(String::from_utf8_lossy(rest).into_owned()),
            b':' => Reply::Int(parse_int(rest)?),
            b'$' => {
                let n = parse_int(rest)?;
                if n < 0 {
                    Reply::Nil
                } else {
                    self.skip(n as usize + 2)?;
                    Reply::Bulk
                }
            }
            b'*' => {
                let n = parse_int(rest)?;
                if n < 0 {
                    Reply::Nil
                } else {
                    for _ in 0..n {
                        self.read_reply()?;
                    }
                    Reply::Array
                }
            }
            other => return Err(format!("unexpected RESP type byte {other:#x}").into()),
        };
        Ok(reply)
    }

    /// Returns the next line without its CRLF (copied: lines are short).
    fn read_line(&mut self) -> Res<Vec<u8>> {
        loop {
            if let Some(i) = self.buf[self.pos..self.end]
                .windows(2)
                .position(|w| w == b"\r\n")
            {
                let line = self.buf[self.pos..self.pos + i].to_vec();
                self.pos += i + 2;
                return Ok(line);
            }
            self.fill()?;
        }
    }

    fn skip(&mut self, mut n: usize) -> Res<()> {
        while n > 0 {
            if self.pos == self.end {
                self.fill()?;
            }
            let k = n.min(self.end - self.pos);
            self.pos += k;
            n -= k;
        }
        Ok(())
    }

    fn fill(&mut self) -> Res<()> {
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
        }
        if self.end == self.buf.len() {
            self.buf.resize(self.buf.len() * 2, 0);
        }
        let n = self.stream.read(&mut self.buf[self.end..])?;
        if n == 0 {
            return Err("connection closed by server".into());
        }
        self.end += n;
        Ok(())
    }
}

fn parse_int(b: &[u8]) -> Res<i64> {
    Ok(std::str::from_utf8(b)?.parse::<i64>()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_encodes_a_command_as_a_resp_array_of_bulk_strings() {
        let mut b = Vec::new();
        encode(&mut b, &[b"SET", b"k", b"-10"]);
        assert_eq!(b, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\n-10\r\n");
    }
}
