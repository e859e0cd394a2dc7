//! The listeners' side of connections: how many may be open at once, how
//! long one may sit idle or take to send a request, and the HTTP/1.1
//! serving loop that applies it (axum's own `serve` has no timers).
//!
//! - A connection with no request in progress (between requests, or
//!   still sending a request's headers) is closed after `idle_timeout`;
//!   a request being answered, a stream included, is never cut by it.
//! - A request's body must arrive whole within `body_timeout` of its
//!   headers: 408 otherwise ([`body`]).
//! - Each listener holds at most its cap of connections; more wait until
//!   one closes ([`conn`]).

pub mod admin_guard;
pub(crate) mod body;
pub mod conn;
pub(crate) mod edge;
pub mod grpc;
mod quiet;
pub(crate) mod signal;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::task::AtomicWaker;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;

pub(crate) use edge::Edge;
pub(crate) use signal::Signal;

/// Caps and timeouts for every listener (`connections:` in the server's
/// configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// HTTP: a connection with no request in progress is closed after
    /// this. Agents: a connection that sends nothing this long is closed
    /// (an agent pings every few seconds).
    pub idle_timeout: Duration,
    /// A request's body must arrive whole within this of its headers.
    pub body_timeout: Duration,
    pub max_client: usize,
    pub max_admin: usize,
    pub max_metrics: usize,
    pub max_agent: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(30),
            max_client: 8192,
            max_admin: 256,
            max_metrics: 64,
            max_agent: 4096,
        }
    }
}

impl ConnectionLimits {
    pub fn max(&self, which: conn::Which) -> usize {
        match which {
            conn::Which::Client => self.max_client,
            conn::Which::Admin => self.max_admin,
            conn::Which::Metrics => self.max_metrics,
            conn::Which::Agent => self.max_agent,
        }
    }
}

/// Serves `app` over HTTP/1.1 on every connection `listener` hands out,
/// until `drain`: then it stops accepting, lets idle connections close
/// and requests in flight finish, and returns once every connection has
/// closed. Each connection's task is woken at the app's cut, so that the
/// requests and streams it carries see it ([`crate::shutdown`]).
pub(crate) async fn serve_http<L>(
    mut listener: L,
    app: Edge,
    idle_timeout: Duration,
    drain: impl Future<Output = ()>,
) where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
{
    let stop = Signal::default();
    // Every connection holds a receiver; the sender's `closed` says when
    // the last has gone.
    let (open_tx, open_rx) = watch::channel(());
    let mut drain = std::pin::pin!(drain);
    loop {
        let (io, peer) = tokio::select! {
            c = listener.accept() => c,
            () = &mut drain => break,
        };
        let (stop, cut) = (stop.clone(), app.cut.clone());
        let mut app = app.clone();
        app.peer = Some(peer.ip().to_canonical());
        let service = TowerToHyperService::new(app);
        let open = open_rx.clone();
        tokio::spawn(async move {
            // HTTP/1 on purpose for the cut: hyper's HTTP/1 dispatcher
            // polls the request in flight and its answer's body on this
            // task, which the cut wakes ([`Edge`] only reads the flag).
            // An HTTP/2 server runs each stream as a task of its own and
            // would need the requests to wait on the signal themselves.
            let mut builder = hyper::server::conn::http1::Builder::new();
            // The header timer runs whenever the connection waits for a
            // request's head: from the connection's start and after every
            // answer. So it bounds both slow headers and idle keep-alive.
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(idle_timeout);
            let conn = builder.serve_connection(TokioIo::new(io), service);
            // The connection's own wakes while it is polled (see quiet.rs).
            let mut conn = quiet::Quiet::new(conn);
            let task = Arc::new(AtomicWaker::new());
            stop.wakes(&task);
            cut.wakes(&task);
            let mut stopping = false;
            let ended = std::future::poll_fn(|cx| {
                // Registered before the flag is read: a signal fired in
                // between wakes this task again.
                task.register(cx.waker());
                if !stopping && stop.fired() {
                    stopping = true;
                    conn.inner().graceful_shutdown();
                }
                std::pin::Pin::new(&mut conn).poll(cx)
            })
            .await;
            if let Err(e) = ended {
                tracing::trace!(error = %e, "a connection ended with an error");
            }
            drop(open);
        });
    }
    // No new connections from here.
    drop(listener);
    drop(open_rx);
    stop.fire();
    open_tx.closed().await;
}
