//! A connected stream socket (TCP or Unix) that one task reads while
//! another writes, through shared references: the reader, the writer and
//! whoever resets the connection each hold it, and the last one to let go
//! closes it.

use std::io;
use std::net::Shutdown;
use std::time::Duration;

use socket2::SockRef;
use tokio::net::{TcpStream, UnixStream};

use crate::model::{Address, PortConnectionInfo};

pub enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Socket {
    /// A TCP connection, tuned for forwarding: no Nagle delay (writes are
    /// already whole chunks), and keepalives so a dead peer is noticed.
    pub(crate) fn tcp(stream: TcpStream) -> io::Result<Socket> {
        stream.set_nodelay(true)?;
        SockRef::from(&stream).set_keepalive(true)?;
        Ok(Socket::Tcp(stream))
    }

    /// Runs `operation` (a non-blocking system call on the socket) once
    /// the socket is ready for `interest`, again whenever it would block.
    pub async fn io<R>(
        &self,
        interest: tokio::io::Interest,
        mut operation: impl FnMut() -> io::Result<R>,
    ) -> io::Result<R> {
        match self {
            Socket::Tcp(stream) => stream.async_io(interest, &mut operation).await,
            Socket::Unix(stream) => stream.async_io(interest, &mut operation).await,
        }
    }

    /// Runs `operation` once if the socket is ready for `interest` (else
    /// `WouldBlock`), clearing the readiness if it would block.
    pub fn try_io<R>(
        &self,
        interest: tokio::io::Interest,
        operation: impl FnOnce() -> io::Result<R>,
    ) -> io::Result<R> {
        match self {
            Socket::Tcp(stream) => stream.try_io(interest, operation),
            Socket::Unix(stream) => stream.try_io(interest, operation),
        }
    }

    fn sock_ref(&self) -> SockRef<'_> {
        match self {
            Socket::Tcp(stream) => SockRef::from(stream),
            Socket::Unix(stream) => SockRef::from(stream),
        }
    }

    /// Waits until something can be read (bytes, end of file or an
    /// error), so a buffer is only needed once there is.
    pub async fn readable(&self) -> io::Result<()> {
        match self {
            Socket::Tcp(stream) => stream.readable().await,
            Socket::Unix(stream) => stream.readable().await,
        }
    }

    /// Ready once something can be read (see [`Socket::readable`]).
    pub fn poll_read_ready(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self {
            Socket::Tcp(stream) => stream.poll_read_ready(cx),
            Socket::Unix(stream) => stream.poll_read_ready(cx),
        }
    }

    /// Reads what has arrived without waiting (`WouldBlock` if nothing).
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(stream) => stream.try_read(buf),
            Socket::Unix(stream) => stream.try_read(buf),
        }
    }

    /// How many bytes have arrived and wait to be read (`FIONREAD`); 0
    /// also at end of file or with an error pending (a read says which).
    pub fn pending(&self) -> usize {
        use std::os::fd::AsRawFd;
        let fd = self.as_raw_fd();
        let mut count: libc::c_int = 0;
        // SAFETY: FIONREAD writes one c_int through the pointer given.
        let done = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut count) };
        if done == 0 {
            usize::try_from(count).unwrap_or(0)
        } else {
            0
        }
    }

    /// Reads what has arrived, at most `buf.len()` bytes; 0 is end of file.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let ready = match self {
                Socket::Tcp(stream) => stream.readable().await,
                Socket::Unix(stream) => stream.readable().await,
            };
            ready?;
            let read = match self {
                Socket::Tcp(stream) => stream.try_read(buf),
                Socket::Unix(stream) => stream.try_read(buf),
            };
            match read {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }

    /// Reads what has arrived into `buf` (0: end of file), or pending
    /// with `cx` woken once something can be read.
    pub fn poll_read(
        &self,
        cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<io::Result<usize>> {
        loop {
            std::task::ready!(self.poll_read_ready(cx))?;
            match self.try_read(buf) {
                // The readiness was cleared: the next poll registers `cx`.
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return std::task::Poll::Ready(other),
            }
        }
    }

    /// Writes what the kernel takes of `buf` now, or pending with `cx`
    /// woken once it can take some.
    pub fn poll_write(
        &self,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        loop {
            let ready = match self {
                Socket::Tcp(stream) => stream.poll_write_ready(cx),
                Socket::Unix(stream) => stream.poll_write_ready(cx),
            };
            std::task::ready!(ready)?;
            let written = match self {
                Socket::Tcp(stream) => stream.try_write(buf),
                Socket::Unix(stream) => stream.try_write(buf),
            };
            match written {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                other => return std::task::Poll::Ready(other),
            }
        }
    }

    /// Writes all of `data`; returns once the kernel has taken it.
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let ready = match self {
                Socket::Tcp(stream) => stream.writable().await,
                Socket::Unix(stream) => stream.writable().await,
            };
            ready?;
            let written = match self {
                Socket::Tcp(stream) => stream.try_write(data),
                Socket::Unix(stream) => stream.try_write(data),
            };
            match written {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => data = &data[n..],
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Half-closes: the peer reads end of file, and can still send.
    pub fn shutdown_write(&self) -> io::Result<()> {
        match self.sock_ref().shutdown(Shutdown::Write) {
            // The peer is gone already: nothing to tell it.
            Err(error) if error.kind() == io::ErrorKind::NotConnected => Ok(()),
            other => other,
        }
    }

    /// Makes the close, whenever the last holder lets go, a reset (TCP
    /// RST: the peer reads ECONNRESET, not end of file). A Unix socket has
    /// no reset: its peer sees it closed.
    pub fn prepare_reset(&self) {
        if let Socket::Tcp(stream) = self {
            let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
        }
    }

    /// Its own address and its peer's.
    pub fn info(&self) -> PortConnectionInfo {
        match self {
            Socket::Tcp(stream) => PortConnectionInfo {
                local: tcp_name(stream.local_addr()),
                peer: tcp_name(stream.peer_addr()),
            },
            Socket::Unix(stream) => PortConnectionInfo {
                local: unix_name(stream.local_addr()),
                peer: unix_name(stream.peer_addr()),
            },
        }
    }
}

impl std::os::fd::AsRawFd for Socket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Socket::Tcp(stream) => stream.as_raw_fd(),
            Socket::Unix(stream) => stream.as_raw_fd(),
        }
    }
}

fn tcp_name(address: io::Result<std::net::SocketAddr>) -> String {
    address
        .map(|address| Address::from_socket_addr(address).to_string())
        .unwrap_or_else(|_| "tcp:".to_string())
}

fn unix_name(address: io::Result<tokio::net::unix::SocketAddr>) -> String {
    match address.ok().as_ref().and_then(|a| a.as_pathname()) {
        Some(path) => format!("unix:{}", path.display()),
        None => "unix:".to_string(),
    }
}
