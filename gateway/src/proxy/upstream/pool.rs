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
//! closed while traffic stopped is not held open), and dropped after
//! [`IDLE`]. A request that a closed connection handed back unsent is
//! sent again on another, as hyper-util's client did.

use std::collections::HashMap;
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
    idle: Mutex<HashMap<Authority, Vec<(Conn, Instant)>>>,
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
            idle: Mutex::new(HashMap::new()),
            connector,
            sweeping: AtomicBool::new(false),
        })
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, HashMap<Authority, Vec<(Conn, Instant)>>> {
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
            let answer = poll_fn(|cx| {
                if let Some(d) = driver.as_mut()
                    && Pin::new(d).poll(cx).is_ready()
                {
                    // Closed: the request's future is told why.
                    driver = None;
                }
                // Only the driver, just polled, answers the request's
                // future: it is looked at without a waker of its own, as a
                // waker called during this poll would be a wake of this
                // very task, which tokio's scheduler takes for a yield,
                // waking another worker thread to steal it.
                sending
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
            })
            .await;
            match answer {
                Ok(head) => {
                    let conn = driver.map(|driver| Conn { send, driver });
                    return Ok(head.map(|body| Driven {
                        body,
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
            tokio::spawn(sweep(Arc::downgrade(self)));
        }
    }
}

/// Drops idle connections that closed or expired while no request came,
/// until the pool itself is dropped.
async fn sweep(pool: Weak<Pool>) {
    let mut every = tokio::time::interval(SWEEP);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let now = Instant::now();
        for list in pool.idle().values_mut() {
            list.retain_mut(|(conn, since)| now - *since < IDLE && conn.open());
        }
    }
}

/// An engine's answer's body, driving its connection as it is read; at its
/// end the connection goes back to the pool if it is still open, and if
/// it is dropped before then the connection closes with it (HTTP/1.1 has
/// no other way to leave an answer unread).
pub(crate) struct Driven {
    body: Incoming,
    conn: Option<Conn>,
    pool: Arc<Pool>,
    address: Authority,
}

impl Driven {
    fn done(&mut self) {
        if let Some(mut conn) = self.conn.take()
            && conn.open()
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
        // Fed only by the driver, just polled: no waker (see Pool::send).
        let quiet = &mut Context::from_waker(Waker::noop());
        let frame = ready!(Pin::new(&mut this.body).poll_frame(quiet));
        match &frame {
            None => this.done(),
            Some(Ok(_)) if this.body.is_end_stream() => this.done(),
            Some(Err(_)) => this.conn = None,
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.body)
    }

    fn size_hint(&self) -> SizeHint {
        http_body::Body::size_hint(&self.body)
    }
}
