//! A TCP relay a test owns, between a program and its database, so that the
//! test can break the link the way networks and servers break it without
//! touching the shared server behind it.
//!
//! - [`Relay::pause`]: a partition that drops packets. Nothing flows either
//!   way and new connections wait; no connection is closed, so a program
//!   sees only silence (its queries hang) until [`Relay::restore`], when
//!   everything held is delivered, as TCP does once a partition heals.
//! - [`Relay::cut`]: the server gone (restarted, or a firewall that
//!   rejects): every connection is closed and new ones are reset at once,
//!   until [`Relay::restore`].
//! - [`Relay::lose_reply`]: on the next connection whose client sends bytes
//!   containing one needle (say an event type) and then bytes containing
//!   another (say `COMMIT`), the second reach the server, its answer is
//!   read and thrown away, and the connection is closed: the program cannot
//!   know whether what it sent took effect.
//! - [`Relay::lose_commit_reply`]: the same for the answer that ends the
//!   transaction holding a needle, however it ends: an explicit `COMMIT`,
//!   or a statement run on its own (PostgreSQL commits it implicitly, and
//!   no `COMMIT` is ever sent). The relay reads the server's answers on
//!   that connection message by message and loses the first that says the
//!   session is idle again (ReadyForQuery, status `I`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the link does now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Open,
    Paused,
    Cut,
}

#[derive(Debug, Default)]
struct Trap {
    armed: Option<Armed>,
    sprung: u64,
}

#[derive(Debug, Clone)]
enum Armed {
    /// What a connection sends first, then what it sends next.
    Reply { after: Vec<u8>, to: Vec<u8> },
    /// What a connection sends in the transaction whose end is lost.
    Commit { after: Vec<u8> },
}

impl Armed {
    fn after(&self) -> &[u8] {
        match self {
            Armed::Reply { after, .. } | Armed::Commit { after } => after,
        }
    }
}

/// The trap a connection has taken.
enum Taken {
    /// Sprung when the client sends bytes containing this.
    Reply(Vec<u8>),
    /// Sprung by the server's first ReadyForQuery saying "idle"; its
    /// answers are held here until a ReadyForQuery.
    Commit(Vec<u8>),
}

/// PostgreSQL's ReadyForQuery message type, and its status for "no
/// transaction open" (the one before it ended, committed or rolled back).
const READY_FOR_QUERY: u8 = b'Z';
const IDLE: u8 = b'I';

/// Splits what the server sent after a trapped request: `Some(n)`: the
/// first `n` bytes end with a ReadyForQuery inside a transaction and go to
/// the client; `None` with `idle` set: the transaction ended (lose it all);
/// `None` otherwise: wait for more.
fn ready(held: &[u8], idle: &mut bool) -> Option<usize> {
    let mut at = 0;
    while held.len() >= at + 5 {
        let len = u32::from_be_bytes([held[at + 1], held[at + 2], held[at + 3], held[at + 4]]);
        let end = at + 1 + len as usize;
        if held.len() < end {
            return None;
        }
        if held[at] == READY_FOR_QUERY && end == at + 6 {
            if held[at + 5] == IDLE {
                *idle = true;
                return None;
            }
            return Some(end);
        }
        at = end;
    }
    None
}

/// A relay on `127.0.0.1:0` to an upstream address; it stops with its value.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    link: watch::Sender<Link>,
    trap: Arc<Mutex<Trap>>,
    accept: tokio::task::JoinHandle<()>,
}

/// PostgreSQL's SSLRequest: length 8, code 80877103.
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

impl Relay {
    /// Relays to `upstream`, a `host:port`.
    pub async fn start(upstream: &str) -> Relay {
        Relay::bind(upstream, false).await
    }

    /// A relay to the PostgreSQL server of `url`; see [`Relay::url`]. It
    /// answers a client's request for TLS with PostgreSQL's "no", so that
    /// the conversation stays readable to [`Relay::lose_reply`].
    pub async fn to_postgres(url: &str) -> Relay {
        Relay::bind(&host_port(url), true).await
    }

    async fn bind(upstream: &str, postgres: bool) -> Relay {
        let upstream = tokio::net::lookup_host(upstream)
            .await
            .expect("resolve the relay's upstream")
            .next()
            .expect("the relay's upstream has an address");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a relay");
        let addr = listener.local_addr().expect("the relay's address");
        let (link, _) = watch::channel(Link::Open);
        let trap = Arc::new(Mutex::new(Trap::default()));
        let accept = {
            let (link, trap) = (link.clone(), trap.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (state, trap) = (link.subscribe(), trap.clone());
                    tokio::spawn(async move {
                        let _ = relay(client, upstream, postgres, state, trap).await;
                    });
                }
            })
        };
        Relay {
            addr,
            link,
            trap,
            accept,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` (a `postgres://` URL) with its host and port replaced by the
    /// relay's.
    pub fn url(&self, url: &str) -> String {
        let (start, end) = host_span(url);
        format!("{}{}{}", &url[..start], self.addr, &url[end..])
    }

    /// Nothing flows and new connections wait, until [`Relay::restore`].
    pub fn pause(&self) {
        self.link.send_replace(Link::Paused);
    }

    /// Every connection is closed and new ones are reset at once, until
    /// [`Relay::restore`].
    pub fn cut(&self) {
        self.link.send_replace(Link::Cut);
    }

    /// The link works again; what a pause held is delivered.
    pub fn restore(&self) {
        self.link.send_replace(Link::Open);
    }

    pub fn link(&self) -> Link {
        *self.link.borrow()
    }

    /// Arms a one-shot trap: the first connection whose client sends bytes
    /// containing `after` (empty: any connection) and later bytes
    /// containing `to` has those delivered, the server's answer swallowed,
    /// and is closed.
    pub fn lose_reply(&self, after: &[u8], to: &[u8]) {
        self.trap.lock().unwrap_or_else(|p| p.into_inner()).armed = Some(Armed::Reply {
            after: after.to_vec(),
            to: to.to_vec(),
        });
    }

    /// Arms a one-shot trap for a PostgreSQL conversation: the first
    /// connection whose client sends bytes containing `after` has the
    /// answer that ends that transaction lost (the transaction done on the
    /// server, committed or not) and is closed. Unlike
    /// [`Relay::lose_reply`] with `COMMIT`, it also catches a statement
    /// that commits on its own.
    pub fn lose_commit_reply(&self, after: &[u8]) {
        self.trap.lock().unwrap_or_else(|p| p.into_inner()).armed = Some(Armed::Commit {
            after: after.to_vec(),
        });
    }

    /// How many times a trap has been sprung.
    pub fn replies_lost(&self) -> u64 {
        self.trap.lock().unwrap_or_else(|p| p.into_inner()).sprung
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        self.link.send_replace(Link::Cut);
    }
}

/// The `host:port` of a `postgres://` URL (port 5432 when none is given).
fn host_port(url: &str) -> String {
    let (start, end) = host_span(url);
    let host = &url[start..end];
    if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        host.to_owned()
    } else {
        format!("{host}:5432")
    }
}

/// Where the `host[:port]` of a URL lies.
fn host_span(url: &str) -> (usize, usize) {
    let mut start = url.find("://").map_or(0, |i| i + 3);
    let path = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    if let Some(at) = url[start..path].rfind('@') {
        start += at + 1;
    }
    (start, path)
}

/// Waits while the link is paused; false once it is cut (or the relay gone).
async fn open(link: &mut watch::Receiver<Link>) -> bool {
    match link.wait_for(|l| *l != Link::Paused).await {
        Ok(l) => *l == Link::Open,
        Err(_) => false,
    }
}

async fn relay(
    mut client: TcpStream,
    upstream: SocketAddr,
    postgres: bool,
    mut link: watch::Receiver<Link>,
    trap: Arc<Mutex<Trap>>,
) -> std::io::Result<()> {
    if !open(&mut link).await {
        // Reset, as a port nobody listens on answers: the client reads
        // ECONNRESET, never a conversation that ends early.
        let _ = client.set_zero_linger();
        return Ok(());
    }
    // Every PostgreSQL client's first message is at least 8 bytes: an
    // SSLRequest is answered here, anything else goes on to the server.
    let mut first = Vec::new();
    if postgres {
        let mut head = [0u8; 8];
        client.read_exact(&mut head).await?;
        if head == SSL_REQUEST {
            client.write_all(b"N").await?;
        } else {
            first.extend_from_slice(&head);
        }
    }
    let mut server = TcpStream::connect(upstream).await?;
    server.write_all(&first).await?;
    let (mut from_client, mut from_server) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let mut taken: Option<Taken> = None;
    // One task for both directions, so that a sprung trap holds back the
    // server's answer with no race against a second copier.
    loop {
        if !open(&mut link).await {
            return Ok(());
        }
        tokio::select! {
            n = client.read(&mut from_client) => {
                let n = n?;
                if n == 0 || !open(&mut link).await {
                    return Ok(());
                }
                let bytes = &from_client[..n];
                if taken.is_none() {
                    let mut t = trap.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(armed) = &t.armed
                        && (armed.after().is_empty() || contains(bytes, armed.after()))
                    {
                        taken = t.armed.take().map(|a| match a {
                            Armed::Reply { to, .. } => Taken::Reply(to),
                            Armed::Commit { .. } => Taken::Commit(Vec::new()),
                        });
                    }
                }
                let sprung =
                    matches!(&taken, Some(Taken::Reply(to)) if contains(bytes, to));
                if sprung {
                    trap.lock().unwrap_or_else(|p| p.into_inner()).sprung += 1;
                }
                server.write_all(bytes).await?;
                if sprung {
                    // The server has the request: wait for its answer, so
                    // that what was asked has happened, then lose it.
                    let _ = server.read(&mut from_server).await;
                    return Ok(());
                }
            }
            n = server.read(&mut from_server) => {
                let n = n?;
                if n == 0 || !open(&mut link).await {
                    return Ok(());
                }
                let Some(Taken::Commit(held)) = &mut taken else {
                    client.write_all(&from_server[..n]).await?;
                    continue;
                };
                // The client waits for each answer before it asks again,
                // so what the server sends from here starts at a message.
                held.extend_from_slice(&from_server[..n]);
                let mut idle = false;
                while let Some(end) = ready(held, &mut idle) {
                    client.write_all(&held[..end]).await?;
                    held.drain(..end);
                }
                if idle {
                    // The transaction is over on the server: lose it.
                    trap.lock().unwrap_or_else(|p| p.into_inner()).sprung += 1;
                    return Ok(());
                }
            }
            _ = link.changed() => {}
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_come_out_of_postgres_urls() {
        assert_eq!(
            host_port("postgres://postgres@127.0.0.1:5432/postgres"),
            "127.0.0.1:5432"
        );
        assert_eq!(host_port("postgres://u:p@db/x?sslmode=disable"), "db:5432");
        assert_eq!(host_port("postgres://h:6000"), "h:6000");
        let addr: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let (start, end) = host_span("postgres://u@db/x?y=1");
        let url = "postgres://u@db/x?y=1";
        assert_eq!(
            format!("{}{addr}{}", &url[..start], &url[end..]),
            "postgres://u@127.0.0.1:4000/x?y=1"
        );
    }
}
