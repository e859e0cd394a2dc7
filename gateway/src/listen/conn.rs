//! Connections as a listener hands them out: at most a configured number
//! open at once, and, where asked, closed when the peer has sent nothing
//! for a while.
//!
//! A listener at its cap stops accepting: further connections wait in the
//! operating system's queue until one closes (the way HAProxy's `maxconn`
//! behaves), rather than taking file descriptors and memory the process
//! cannot afford. The timeouts are what make a full listener free itself.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// The listeners whose connections are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Client,
    Admin,
    Metrics,
    Agent,
}

impl Which {
    pub const ALL: [Which; 4] = [Which::Client, Which::Admin, Which::Metrics, Which::Agent];

    /// The `listener` label and the `connections.max.*` key.
    pub fn name(self) -> &'static str {
        match self {
            Which::Client => "client",
            Which::Admin => "admin",
            Which::Metrics => "metrics",
            Which::Agent => "agent",
        }
    }
}

/// One listener's figures, read by the metrics page.
#[derive(Debug, Default)]
pub struct ListenerStats {
    open: AtomicU64,
    /// 0 until the listener is bound.
    max: AtomicU64,
    full: AtomicU64,
    /// When the log last said the listener was full (ms since the
    /// listener's creation + 1; 0 for never), so a flood says it once a
    /// minute, not once a connection.
    warned_ms: AtomicU64,
}

impl ListenerStats {
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    /// Times a connection found the listener full and waited.
    pub fn full(&self) -> u64 {
        self.full.load(Ordering::Relaxed)
    }
}

/// Every listener's figures.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    client: ListenerStats,
    admin: ListenerStats,
    metrics: ListenerStats,
    agent: ListenerStats,
}

impl ConnectionStats {
    pub fn of(&self, which: Which) -> &ListenerStats {
        match which {
            Which::Client => &self.client,
            Which::Admin => &self.admin,
            Which::Metrics => &self.metrics,
            Which::Agent => &self.agent,
        }
    }
}

/// A TCP listener that hands out at most `max` connections at once.
#[derive(Debug)]
pub struct Acceptor {
    tcp: TcpListener,
    slots: Arc<Semaphore>,
    max: usize,
    /// Close a connection that sends nothing this long (None: never, for
    /// HTTP, where the server's own timers know when a request is in
    /// progress).
    read_idle: Option<Duration>,
    stats: Arc<ConnectionStats>,
    which: Which,
    created: Instant,
}

impl Acceptor {
    /// `max` is at least 1 (the configuration refuses 0).
    pub fn new(
        tcp: TcpListener,
        which: Which,
        max: usize,
        read_idle: Option<Duration>,
        stats: Arc<ConnectionStats>,
    ) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        stats.of(which).max.store(max as u64, Ordering::Relaxed);
        Acceptor {
            tcp,
            slots: Arc::new(Semaphore::new(max)),
            max,
            read_idle,
            stats,
            which,
            created: Instant::now(),
        }
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// The next connection, once one of the listener's slots is free.
    pub async fn accept(&self) -> (Conn, SocketAddr) {
        loop {
            let slot = match self.slots.clone().try_acquire_owned() {
                Ok(s) => s,
                Err(_) => {
                    self.full();
                    match self.slots.clone().acquire_owned().await {
                        Ok(s) => s,
                        // The semaphore is never closed.
                        Err(_) => std::future::pending().await,
                    }
                }
            };
            match self.tcp.accept().await {
                Ok((io, peer)) => {
                    let _ = io.set_nodelay(true);
                    let stats = self.stats.clone();
                    stats.of(self.which).open.fetch_add(1, Ordering::Relaxed);
                    let slot = Slot {
                        _permit: slot,
                        stats,
                        which: self.which,
                    };
                    return (Conn::new(io, slot, self.read_idle), peer);
                }
                // A peer that gave up before it was accepted.
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    // Out of file descriptors and the like: the pause
                    // axum's own listener takes.
                    tracing::warn!(listener = self.which.name(), error = %e, "accepting a connection");
                    drop(slot);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn full(&self) {
        let stats = self.stats.of(self.which);
        stats.full.fetch_add(1, Ordering::Relaxed);
        let now = self.created.elapsed().as_millis() as u64 + 1;
        let last = stats.warned_ms.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= 60_000)
            && stats
                .warned_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                listener = self.which.name(),
                max = self.max,
                "the listener is at its cap of connections (connections.max.{}): new ones wait until one closes",
                self.which.name()
            );
        }
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::ConnectionRefused | K::ConnectionAborted | K::ConnectionReset
    )
}

/// Holds one of a listener's slots for as long as the connection lives.
#[derive(Debug)]
struct Slot {
    _permit: OwnedSemaphorePermit,
    stats: Arc<ConnectionStats>,
    which: Which,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.stats
            .of(self.which)
            .open
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// When a connection that sends nothing is closed.
#[derive(Debug)]
struct ReadIdle {
    after: Duration,
    /// The last time bytes arrived; the timer is moved forward lazily,
    /// when it fires, rather than on every read.
    last: Instant,
    timer: Pin<Box<Sleep>>,
}

/// An accepted connection: a TCP stream holding one of its listener's
/// slots until it is dropped.
#[derive(Debug)]
pub struct Conn {
    io: TcpStream,
    idle: Option<ReadIdle>,
    _slot: Slot,
}

impl Conn {
    fn new(io: TcpStream, slot: Slot, read_idle: Option<Duration>) -> Self {
        let idle = read_idle.map(|after| {
            let last = Instant::now();
            ReadIdle {
                after,
                last,
                timer: Box::pin(tokio::time::sleep_until(last + after)),
            }
        });
        Conn {
            io,
            idle,
            _slot: slot,
        }
    }

    pub fn peer_addr(&self) -> std::io::Result<SocketAddr> {
        self.io.peer_addr()
    }

    /// The bytes the peer has sent, left to be read.
    pub async fn peek(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.io.peek(buf).await
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut me.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if let Some(idle) = &mut me.idle
                    && buf.filled().len() > before
                {
                    idle.last = Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                let Some(idle) = &mut me.idle else {
                    return Poll::Pending;
                };
                while idle.timer.as_mut().poll(cx).is_ready() {
                    let due = idle.last + idle.after;
                    if due <= Instant::now() {
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!(
                                "nothing received for {} s: the connection is closed",
                                idle.after.as_secs_f64()
                            ),
                        )));
                    }
                    idle.timer.as_mut().reset(due);
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// So that the agent listener (tonic) still learns who connected, and,
/// over mutual TLS, which certificate they presented.
impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::Connected::connect_info(&self.io)
    }
}

impl axum::serve::Listener for Acceptor {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        Acceptor::accept(self).await
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
