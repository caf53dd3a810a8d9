//! The ticket connection's socket: TCP or a Unix socket, opened from the client's
//! connection info with a timeout. A child of `tickets`.

use super::*;

pub(super) enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

impl Stream {
    pub(super) fn try_clone(&self) -> std::io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            #[cfg(unix)]
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    pub(super) fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            #[cfg(unix)]
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }

    pub(super) fn set_read_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(d),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_read_timeout(d),
        }
    }

    pub(super) fn set_write_timeout(&self, d: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(d),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_write_timeout(d),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            #[cfg(unix)]
            Stream::Unix(s) => s.flush(),
        }
    }
}

pub(super) fn open_stream(info: &redis::ConnectionInfo) -> RedisResult<Stream> {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) => {
            let mut last = None;
            for addr in (host.as_str(), *port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
                    Ok(s) => {
                        let _ = s.set_nodelay(true);
                        return Ok(Stream::Tcp(s));
                    }
                    Err(e) => last = Some(e),
                }
            }
            Err(last
                .unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))
                .into())
        }
        #[cfg(unix)]
        ConnectionAddr::Unix(path) => Ok(Stream::Unix(UnixStream::connect(path)?)),
        _ => Err(RedisError::from((
            ErrorKind::InvalidClientConfig,
            "ticket connection",
            "TLS is not supported for tickets".to_owned(),
        ))),
    }
}
