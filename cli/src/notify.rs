//! The systemd notification protocol (`sd_notify`), for `Type=notify`
//! units: one datagram per state change to the Unix socket named by
//! `$NOTIFY_SOCKET` (a path, or `@name` for an abstract socket). Without
//! the variable nothing is sent, so the same binary runs under any
//! supervisor. No library: the protocol is one `sendto`.
//!
//! systemd accepts these only from the unit's main process
//! (`NotifyAccess=main`, the default), so an engine the agent starts, which
//! inherits the variable, cannot speak for the agent.

use std::os::unix::net::UnixDatagram;

/// The service is up: every listener is bound (a server) or the agent is
/// running.
pub(crate) const READY: &str = "READY=1";
/// A stop has begun: systemd waits for the exit, up to `TimeoutStopSec`.
pub(crate) const STOPPING: &str = "STOPPING=1";

/// Tells the service manager `state` (`READY=1`, `STOPPING=1`, a
/// `STATUS=…` line…). A failure is logged, never fatal: the service works
/// the same unsupervised.
pub(crate) fn notify(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&socket, state) {
        tracing::warn!(socket = %socket.to_string_lossy(), error = %e, "cannot notify the service manager");
    }
}

fn send(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let sock = UnixDatagram::unbound()?;
    let bytes = socket.as_bytes();
    match bytes.strip_prefix(b"@") {
        Some(name) => {
            #[cfg(target_os = "linux")]
            {
                use std::os::linux::net::SocketAddrExt;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                sock.send_to_addr(state.as_bytes(), &addr)?;
            }
            #[cfg(not(target_os = "linux"))]
            {
                let _ = name;
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "abstract sockets exist only on Linux",
                ));
            }
        }
        None => {
            sock.send_to(state.as_bytes(), std::path::Path::new(socket))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "in tests an unwrap is an assertion")]

    use super::*;

    fn received(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn a_path_socket_gets_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), READY).unwrap();
        assert_eq!(received(&sock), "READY=1");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_abstract_socket_gets_the_state() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("llmgw-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let sock = UnixDatagram::bind_addr(&addr).unwrap();
        send(std::ffi::OsStr::new(&format!("@{name}")), STOPPING).unwrap();
        assert_eq!(received(&sock), "STOPPING=1");
    }

    #[test]
    fn no_socket_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        assert!(send(dir.path().join("absent").as_os_str(), READY).is_err());
    }
}
