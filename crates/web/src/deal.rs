//! Connections dealt in turn to per-core processes, instead of spread by SO_REUSEPORT.
//!
//! Why: SO_REUSEPORT picks a listener by a hash of each connection's addresses, so a few
//! long-lived connections land unevenly. Ten keep-alive connections over two processes split
//! 5/5 only a quarter of the time and 7/3 or worse a third of the time (binomial); thirty over
//! sixteen processes leave a given process without any 14% of the time ((15/16)^30), and its
//! core idles while others queue. The `adaptive` layout instead lets the parent accept and pass
//! each connection to the next child in turn over a Unix socket (SCM_RIGHTS), so children hold
//! equal shares to within one connection. (On the 2-core development host, with the load
//! generator at raised priority, the split's effect on throughput stayed within the host's own
//! noise: docs/benchmarks/web.md.)
//!
//! Costs: one accept, one sendmsg and one recvmsg per *connection*, none per request; the
//! connection is then the child's alone, as with SO_REUSEPORT.
//!
//! Concurrency: the parent's [`Dealer`] thread is the only writer of every channel and each
//! child the only reader of its own, so messages need no further ordering. A channel is a
//! SOCK_SEQPACKET pair: one message carries one descriptor, and a child whose receive buffer is
//! full blocks the dealer (back-pressure into the listen backlog, never unbounded memory).

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// The byte every message carries (a message needs at least one byte of data).
const MESSAGE_BYTE: u8 = b'c';
/// Pause after a failed accept (e.g. out of descriptors), so the dealer does not spin.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(10);

/// One channel per child: the parent keeps the first end, the child inherits the second.
pub fn channel() -> std::io::Result<(OwnedFd, OwnedFd)> {
    // Close-on-exec on both ends: only the child the end is meant for clears it (see
    // `inherit_in_child`), so no other child or unrelated process holds a copy.
    Ok(rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Clears close-on-exec on `fd`. Meant for `CommandExt::pre_exec`, between fork and exec.
pub fn inherit_in_child(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl(F_SETFD) only changes the descriptor's flags; it is async-signal-safe,
    // as code between fork and exec must be, and an invalid fd is reported as an error.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The parent's side: accepts on `listener` and passes each connection to the next channel.
pub struct Dealer {
    stopping: Arc<AtomicBool>,
    listener: Arc<TcpListener>,
    thread: Option<JoinHandle<()>>,
}

impl Dealer {
    pub fn start(listener: TcpListener, channels: Vec<OwnedFd>) -> std::io::Result<Dealer> {
        assert!(!channels.is_empty());
        let stopping = Arc::new(AtomicBool::new(false));
        let listener = Arc::new(listener);
        let thread = std::thread::Builder::new().name("web-dealer".into()).spawn({
            let (stopping, listener) = (Arc::clone(&stopping), Arc::clone(&listener));
            move || deal(&listener, &channels, &stopping)
        })?;
        Ok(Dealer { stopping, listener, thread: Some(thread) })
    }
}

fn deal(listener: &TcpListener, channels: &[OwnedFd], stopping: &AtomicBool) {
    let mut next = 0;
    loop {
        let accepted = listener.accept();
        // Acquire: pairs with the Release store in `Drop`, made before it shuts the socket down.
        if stopping.load(Ordering::Acquire) {
            return;
        }
        match accepted {
            Ok((stream, _)) => next = pass_to_next(&stream, channels, next),
            Err(error) => {
                tracing::warn!(%error, "accepting a connection to deal");
                std::thread::sleep(ACCEPT_RETRY_DELAY);
            }
        }
    }
}

/// Passes `stream` to the first channel from `next` on that takes it, and returns the channel
/// after that one. A child that died refuses (EPIPE) and is skipped; if every child refuses,
/// the connection is closed, which its client sees as a reset.
fn pass_to_next(stream: &TcpStream, channels: &[OwnedFd], next: usize) -> usize {
    for attempt in 0..channels.len() {
        let index = (next + attempt) % channels.len();
        match send_connection(&channels[index], stream.as_fd()) {
            Ok(()) => return (index + 1) % channels.len(),
            Err(error) => tracing::warn!(%error, child = index, "passing a connection"),
        }
    }
    next
}

fn send_connection(channel: &OwnedFd, connection: BorrowedFd<'_>) -> std::io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let descriptors = [connection];
    let pushed = control.push(SendAncillaryMessage::ScmRights(&descriptors));
    assert!(pushed, "the buffer is sized for one descriptor");
    // NOSIGNAL: a dead child is an EPIPE error to handle, not a SIGPIPE for the whole process.
    rustix::net::sendmsg(
        channel,
        &[IoSlice::new(&[MESSAGE_BYTE])],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

impl Drop for Dealer {
    fn drop(&mut self) {
        // Release: the dealer thread, woken by the shutdown below, must see the flag.
        self.stopping.store(true, Ordering::Release);
        // Wakes the blocked accept (Linux answers it with EINVAL); a failure means the socket
        // is already unusable, and the accept has returned or will.
        let _ = rustix::net::shutdown(&*self.listener, rustix::net::Shutdown::Both);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The child's side: an axum listener whose connections arrive over the channel.
pub struct DealtListener {
    channel: AsyncFd<OwnedFd>,
}

impl DealtListener {
    /// Wraps the inherited channel end; call inside the tokio runtime that will serve.
    pub fn new(channel: OwnedFd) -> std::io::Result<DealtListener> {
        // SAFETY: an OwnedFd's descriptor is valid and open until the OwnedFd drops, which is
        // when the AsyncFd owning it drops, and `as_raw_fd` always returns that descriptor.
        let channel = unsafe { AsyncFd::register_with_interest(channel, Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        Ok(DealtListener { channel })
    }

    async fn next_connection(&self) -> std::io::Result<Option<OwnedFd>> {
        loop {
            let mut ready = self.channel.readable().await?;
            match ready.try_io(|channel| receive_connection(channel.get_ref())) {
                Ok(received) => return received,
                Err(_would_block) => continue,
            }
        }
    }
}

/// One passed descriptor; `None` once the parent closed its end.
fn receive_connection(channel: &OwnedFd) -> std::io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let flags = RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC;
    let message =
        rustix::net::recvmsg(channel, &mut [IoSliceMut::new(&mut byte)], &mut control, flags)?;
    if message.bytes == 0 {
        return Ok(None);
    }
    let mut received = None;
    for part in control.drain() {
        if let RecvAncillaryMessage::ScmRights(mut descriptors) = part {
            received = received.or(descriptors.next());
        }
    }
    received.map(Some).ok_or_else(|| std::io::Error::other("a dealt message without a descriptor"))
}

impl axum::serve::Listener for DealtListener {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.next_connection().await {
                Ok(Some(fd)) => match adopt(fd) {
                    Ok(connection) => return connection,
                    // E.g. the client already closed it: that connection only.
                    Err(error) => tracing::debug!(%error, "dropping a dealt connection"),
                },
                // The parent is gone: no more connections will come. Keep serving the open
                // ones; the parent's death signal ends this process.
                Ok(None) => std::future::pending::<()>().await,
                Err(error) => {
                    tracing::warn!(%error, "receiving a dealt connection");
                    tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Err(std::io::Error::other("dealt connections have no listening address here"))
    }
}

fn adopt(fd: OwnedFd) -> std::io::Result<(tokio::net::TcpStream, SocketAddr)> {
    let stream = TcpStream::from(fd);
    let peer = stream.peer_addr()?;
    stream.set_nonblocking(true)?;
    Ok((tokio::net::TcpStream::from_std(stream)?, peer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Ten connections over two channels: five each, and each received descriptor is the
    /// connection its client opened (a byte written by the client is read through it).
    #[test]
    fn connections_are_dealt_in_turn_and_arrive_whole() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (parents, children): (Vec<_>, Vec<_>) = (0..2).map(|_| channel().unwrap()).unzip();
        let dealer = Dealer::start(listener, parents).unwrap();
        let mut clients = Vec::new();
        let mut received = [0usize; 2];
        for index in 0..10u8 {
            let mut client = TcpStream::connect(addr).unwrap();
            client.write_all(&[index]).unwrap();
            let child = usize::from(index % 2);
            let fd = blocking_receive(&children[child]);
            let mut dealt = TcpStream::from(fd);
            let mut byte = [0u8; 1];
            dealt.read_exact(&mut byte).unwrap();
            assert_eq!(byte[0], index, "child {child} got connection {index}");
            received[child] += 1;
            clients.push(client);
        }
        assert_eq!(received, [5, 5]);
        drop(dealer);
        assert!(TcpStream::connect(addr).is_err(), "a stopped dealer no longer listens");
    }

    fn blocking_receive(channel: &OwnedFd) -> OwnedFd {
        for _ in 0..1000 {
            match receive_connection(channel) {
                Ok(Some(fd)) => return fd,
                Ok(None) => panic!("channel closed"),
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(error) => panic!("{error}"),
            }
        }
        panic!("no connection dealt within a second");
    }

    #[test]
    fn a_closed_parent_end_reads_as_the_end() {
        let (parent, child) = channel().unwrap();
        drop(parent);
        assert!(receive_connection(&child).unwrap().is_none());
    }
}
