//! The agent listener's server: gRPC on a capped listener's connections,
//! after their TLS handshakes when the listener has TLS. The binary runs
//! it, and so does the control plane's scale bench, which then measures
//! what ships.

use std::future::Future;

use crate::{Acceptor, ServerTls};

/// Serves `routes` over HTTP/2 on each connection `acceptor` hands out,
/// after its handshake when `tls` is given (a failed one is logged with
/// the peer and the reason, at warn: an agent that cannot connect is an
/// operator's to see), until `stop`.
pub async fn serve_grpc(
    acceptor: Acceptor,
    tls: Option<&ServerTls>,
    routes: tonic::service::Routes,
    stop: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let mut server = tonic::transport::Server::builder();
    let router = server.add_routes(routes);
    match tls {
        Some(tls) => {
            let (ready, accepting) = crate::tls::handshakes(acceptor, tls, true);
            let incoming = futures_util::stream::unfold(ready, |mut ready| async move {
                let (stream, _) = ready.recv().await?;
                Some((Ok::<_, std::io::Error>(stream), ready))
            });
            let served = router.serve_with_incoming_shutdown(incoming, stop).await;
            accepting.abort();
            served
        }
        None => {
            let incoming = futures_util::stream::unfold(acceptor, |l| async move {
                let (conn, _) = l.accept().await;
                Some((Ok::<_, std::io::Error>(conn), l))
            });
            router.serve_with_incoming_shutdown(incoming, stop).await
        }
    }
}
