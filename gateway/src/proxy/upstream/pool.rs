//! The plain-http hop's connections, each polled by the task that uses it.
//!
//! hyper-util's pooled client gives every connection a task of its own and
//! hands it each request and answer over channels, so a request crossed
//! between tasks twice each way and that task was ~7 µs of a saturated
//! gateway's CPU a request (docs/benchmarks.md). Here a connection is
//! polled by whoever holds it: the request's future until the answer's
//! head, then the answer's body ([`Driven`]), which the client
//! connection's task polls as it relays.
//!
//! An idle connection sits in the pool unpolled. It is polled once, waking
//! no one, as it is taken (an engine that closed it, say at its keep-alive
//! timeout, has left it readable at its end) and every [`SWEEP`] (so one
//! closed while traffic stopped is held half-closed for at most that
//! long), and dropped after [`IDLE`]. A request that a closed connection
//! handed back unsent is sent again on another, as hyper-util's client
//! did, and an answer dropped unread (an error's, which the proxy does not
//! relay) leaves its connection in the pool if the rest of it had already
//! come.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker, ready};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::uri::Authority;
use axum::http::{Request, Response};
use http_body::{Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::{Connector, Error};
use crate::FastMap;

/// How long an idle connection is kept: reqwest's default, which the hop
/// had before it had its own client.
pub(super) const IDLE: Duration = Duration::from_secs(90);
/// How often idle connections are looked at when no request takes them.
const SWEEP: Duration = Duration::from_secs(15);

type Io = TokioIo<TcpStream>;

/// One connection: the handle a request is given to and the state machine
/// that writes it and reads the answer, polled by its holder.
struct Conn {
    send: http1::SendRequest<Full<Bytes>>,
    driver: http1::Connection<Io, Full<Bytes>>,
}

impl Conn {
    /// Polls the connection once, waking no one (it is idle, or being put
    /// down): whether it is still open.
    fn open(&mut self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        Pin::new(&mut self.driver).poll(&mut cx).is_pending() && !self.send.is_closed()
    }
}

/// Idle connections by engine address, oldest first.
pub(super) struct Pool {
    idle: Mutex<FastMap<Authority, Vec<(Conn, Instant)>>>,
    connector: Connector,
    sweeping: AtomicBool,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

impl Pool {
    pub(super) fn new(connector: Connector) -> Arc<Self> {
        Arc::new(Pool {
            idle: Mutex::default(),
            connector,
            sweeping: AtomicBool::new(false),
        })
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, FastMap<Authority, Vec<(Conn, Instant)>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends `request` (origin-form, with its Host) to `address` and
    /// returns the answer's head; its body drives the connection on.
    pub(super) async fn send(
        self: &Arc<Self>,
        address: &Authority,
        uri: &axum::http::Uri,
        mut request: Request<Full<Bytes>>,
    ) -> Result<Response<Driven>, Error> {
        loop {
            let (conn, reused) = match self.take(address) {
                Some(conn) => (conn, true),
                None => (self.connect(uri).await?, false),
            };
            let Conn { mut send, driver } = conn;
            let mut driver = Some(driver);
            let mut sending = pin!(send.try_send_request(request));
            // The driver's wakes of this task while it is polled are the
            // client connection's to absorb (`listen::quiet`); both get
            // the task's waker, so that none is lost (the request's future
            // spends tokio's budget, and wakes on its own when it is out).
            let answer = poll_fn(|cx| {
                if let Some(d) = driver.as_mut()
                    && Pin::new(d).poll(cx).is_ready()
                {
                    // Closed: the request's future is told why.
                    driver = None;
                }
                sending.as_mut().poll(cx)
            })
            .await;
            match answer {
                Ok(head) => {
                    let conn = driver.map(|driver| Conn { send, driver });
                    return Ok(head.map(|body| Driven {
                        body: Some(body),
                        conn,
                        pool: self.clone(),
                        address: address.clone(),
                    }));
                }
                Err(mut e) => match e.take_message() {
                    // Handed back unsent by a connection that had closed
                    // while idle: another one, or a new one.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(Error::Send(e.into_error())),
                },
            }
        }
    }

    async fn connect(self: &Arc<Self>, uri: &axum::http::Uri) -> Result<Conn, Error> {
        let mut connector = self.connector.clone();
        let io = tower_service::Service::call(&mut connector, uri.clone())
            .await
            .map_err(Error::Connect)?;
        let (send, driver) = http1::handshake(io).await.map_err(Error::Send)?;
        Ok(Conn { send, driver })
    }

    /// The newest idle connection to `address` that is still open.
    fn take(&self, address: &Authority) -> Option<Conn> {
        loop {
            let (mut conn, since) = self.idle().get_mut(address)?.pop()?;
            // Looked at outside the lock: polling may read.
            if since.elapsed() < IDLE && conn.open() {
                return Some(conn);
            }
        }
    }

    fn put(self: &Arc<Self>, address: Authority, conn: Conn) {
        let now = Instant::now();
        {
            let mut idle = self.idle();
            let list = idle.entry(address).or_default();
            let expired = list.partition_point(|(_, since)| now - *since >= IDLE);
            list.drain(..expired);
            list.push((conn, now));
        }
        if !self.sweeping.swap(true, Ordering::Relaxed) {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(sweep(Arc::downgrade(self)))),
                // A body dropped outside any runtime: the next put sweeps.
                Err(_) => self.sweeping.store(false, Ordering::Relaxed),
            }
        }
    }
}

/// Drops idle connections that closed or expired while no request came,
/// until the pool itself is dropped.
async fn sweep(pool: Weak<Pool>) {
    /// Says the sweep has stopped, however it stops (its runtime may shut
    /// down under it), so that the next put starts another.
    struct Stopped(Weak<Pool>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            if let Some(pool) = self.0.upgrade() {
                pool.sweeping.store(false, Ordering::Relaxed);
            }
        }
    }
    let _stopped = Stopped(pool.clone());
    let mut every = tokio::time::interval(SWEEP);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        // Looked at outside the lock, as in take().
        let idle = std::mem::take(&mut *pool.idle());
        let now = Instant::now();
        let kept: Vec<_> = idle
            .into_iter()
            .map(|(address, mut list)| {
                list.retain_mut(|(conn, since)| now - *since < IDLE && conn.open());
                (address, list)
            })
            .collect();
        let mut idle = pool.idle();
        for (address, mut list) in kept {
            // Older than any put since: in front, oldest first.
            let newer = idle.remove(&address).unwrap_or_default();
            list.extend(newer);
            if !list.is_empty() {
                idle.insert(address, list);
            }
        }
    }
}

/// An engine's answer's body, driving its connection as it is read; at its
/// end the connection goes back to the pool if it is still open. Dropped
/// before then, it keeps the connection only if the rest of the answer
/// has already come; otherwise the connection closes with it (HTTP/1.1
/// has no other way to leave an answer unread).
pub(crate) struct Driven {
    /// None once dropped (see Drop).
    body: Option<Incoming>,
    conn: Option<Conn>,
    pool: Arc<Pool>,
    address: Authority,
}

impl Driven {
    /// The answer is over: its connection back to the pool if it is open
    /// and free for the next request.
    fn done(&mut self) {
        if let Some(mut conn) = self.conn.take()
            && conn.open()
            && conn.send.is_ready()
        {
            self.pool.put(self.address.clone(), conn);
        }
    }
}

impl http_body::Body for Driven {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if let Some(conn) = this.conn.as_mut()
            && Pin::new(&mut conn.driver).poll(cx).is_ready()
        {
            // Closed: the body says how it ended.
            this.conn = None;
        }
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = ready!(Pin::new(&mut *body).poll_frame(cx));
        match &frame {
            None => this.done(),
            Some(Ok(_)) if body.is_end_stream() => this.done(),
            Some(Err(_)) => this.conn = None,
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body
            .as_ref()
            .is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), http_body::Body::size_hint)
    }
}

impl Drop for Driven {
    /// Dropped unread (an error's body, a client gone): what is left of
    /// the answer is read if it is already here, and the connection kept,
    /// as hyper-util's client did; otherwise it closes.
    fn drop(&mut self) {
        if self.conn.is_some() {
            // The driver sees its reader gone only once the body is.
            self.body = None;
            self.done();
        }
    }
}
