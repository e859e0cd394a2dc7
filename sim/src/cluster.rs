//! Multi-node rendezvous, as a tensor-parallel group across machines does
//! it: rank 0 binds the rendezvous port and waits for every worker; a
//! worker dials it (retrying while rank 0 starts), says its rank, and stays.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone)]
pub struct Cluster {
    pub nnodes: u32,
    pub rank: u32,
    pub rendezvous: SocketAddr,
    /// How long a worker keeps dialling before giving up.
    pub join_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("rank {rank} is outside a {nnodes}-node group")]
    BadRank { rank: u32, nnodes: u32 },
    #[error("cannot bind the rendezvous port {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("rank 0 at {addr} did not answer within {timeout:?}")]
    NoLeader { addr: SocketAddr, timeout: Duration },
    #[error("rank 0 closed the rendezvous")]
    LeaderGone,
    #[error("rendezvous i/o")]
    Io(#[from] std::io::Error),
}

impl Cluster {
    fn check(&self) -> Result<(), ClusterError> {
        if self.rank >= self.nnodes {
            return Err(ClusterError::BadRank {
                rank: self.rank,
                nnodes: self.nnodes,
            });
        }
        Ok(())
    }

    /// Rank 0: returns once ranks 1..nnodes have all joined. Their
    /// connections are kept open for the process's life.
    /// `on_bound` learns the rendezvous address (useful with port 0).
    pub async fn gather_workers(
        &self,
        on_bound: impl FnOnce(SocketAddr),
    ) -> Result<(), ClusterError> {
        self.check()?;
        let listener =
            TcpListener::bind(self.rendezvous)
                .await
                .map_err(|source| ClusterError::Bind {
                    addr: self.rendezvous,
                    source,
                })?;
        on_bound(listener.local_addr()?);
        let mut joined = BTreeSet::new();
        while joined.len() < (self.nnodes - 1) as usize {
            let (stream, peer) = listener.accept().await?;
            let mut lines = BufReader::new(stream);
            let mut line = String::new();
            lines.read_line(&mut line).await?;
            match line
                .trim()
                .strip_prefix("rank ")
                .and_then(|r| r.parse::<u32>().ok())
            {
                Some(r) if r > 0 && r < self.nnodes => {
                    tracing::info!(rank = r, %peer, "worker joined");
                    joined.insert(r);
                    let mut stream = lines.into_inner();
                    stream.write_all(b"ok\n").await?;
                    // Hold the connection; the worker exits when it closes.
                    tokio::spawn(async move {
                        let mut sink = [0u8; 64];
                        while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                    });
                }
                _ => tracing::warn!(%peer, "ignoring a rendezvous peer that named no valid rank"),
            }
        }
        Ok(())
    }

    /// A worker: joins rank 0 and returns only when rank 0 goes away.
    pub async fn join_as_worker(&self) -> Result<(), ClusterError> {
        self.check()?;
        let deadline = tokio::time::Instant::now() + self.join_timeout;
        let mut stream = loop {
            match TcpStream::connect(self.rendezvous).await {
                Ok(s) => break s,
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(_) => {
                    return Err(ClusterError::NoLeader {
                        addr: self.rendezvous,
                        timeout: self.join_timeout,
                    });
                }
            }
        };
        stream
            .write_all(format!("rank {}\n", self.rank).as_bytes())
            .await?;
        let mut buf = [0u8; 64];
        // "ok", then silence until rank 0 closes.
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return Err(ClusterError::LeaderGone),
                Ok(_) => {}
            }
        }
    }
}
