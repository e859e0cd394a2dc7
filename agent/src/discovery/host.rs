//! The operating system, architecture, vector CPU features and driver.

use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub os_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub os_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub os_codename: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub os_like: Vec<String>,
    /// Debian spelling: amd64, arm64, i386, armhf.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub arch: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_flags: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nvidia_driver: String,
}

/// The vector features placement and engine builds care about, in the
/// order they are reported.
const FLAGS: [&str; 9] = [
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512_bf16",
    "amx_tile",
    "asimd",
    "sve",
];

impl Host {
    /// Which package family the OS belongs to: `deb`, `rpm` or "".
    pub fn family(&self) -> &'static str {
        for id in std::iter::once(&self.os_id).chain(&self.os_like) {
            match id.as_str() {
                "debian" | "ubuntu" => return "deb",
                "rhel" | "fedora" | "centos" | "rocky" | "almalinux" | "suse" | "opensuse" => {
                    return "rpm";
                }
                _ => {}
            }
        }
        ""
    }

    pub fn has_cpu_flag(&self, flag: &str) -> bool {
        self.cpu_flags.iter().any(|f| f == flag)
    }
}

/// Reads the host under `root` (`/` on a real machine).
pub fn discover(root: &Path) -> Host {
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_default();
    let mut host = parse_os_release(&read("etc/os-release"));
    host.arch = debian_arch(std::env::consts::ARCH).to_owned();
    host.cpu_flags = parse_cpu_flags(&read("proc/cpuinfo"));
    host.nvidia_driver = parse_driver_version(&read("proc/driver/nvidia/version"));
    host
}

pub fn parse_os_release(text: &str) -> Host {
    let mut host = Host::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim_matches(|c| c == '"' || c == '\'').to_owned();
        match key {
            "ID" => host.os_id = value,
            "VERSION_ID" => host.os_version = value,
            "VERSION_CODENAME" => host.os_codename = value,
            "ID_LIKE" => host.os_like = value.split_whitespace().map(str::to_owned).collect(),
            _ => {}
        }
    }
    host
}

pub fn debian_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "i386",
        "arm" => "armhf",
        other => other,
    }
}

/// The wanted flags of the first `flags` (x86) or `Features` (ARM) line.
pub fn parse_cpu_flags(cpuinfo: &str) -> Vec<String> {
    let Some(words) = cpuinfo.lines().find_map(|l| {
        let (key, rest) = l.split_once(':')?;
        matches!(key.trim(), "flags" | "Features").then_some(rest)
    }) else {
        return Vec::new();
    };
    let present: std::collections::HashSet<&str> = words.split_whitespace().collect();
    FLAGS
        .iter()
        .filter(|f| present.contains(*f))
        .map(|f| (*f).to_owned())
        .collect()
}

/// The driver version from `/proc/driver/nvidia/version`: the first token
/// that looks like a version after `Module`, so that the open kernel
/// module's banner ("Open Kernel Module for x86_64 570.86.15") reads right.
pub fn parse_driver_version(text: &str) -> String {
    let Some(first) = text.lines().next() else {
        return String::new();
    };
    let Some((_, after)) = first.split_once("Module") else {
        return String::new();
    };
    after
        .split_whitespace()
        .find(|t| t.chars().next().is_some_and(|c| c.is_ascii_digit()) && t.contains('.'))
        .unwrap_or_default()
        .to_owned()
}

/// The kernel's host name (what `hostname` prints), the node id's default.
pub fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// This host's address on the route to `server` (a URL or `host:port`):
/// what the control plane and other nodes reach this node at, unless the
/// control plane itself is on loopback. Connecting a UDP socket sends
/// nothing; it only asks the kernel which source address it would use.
/// None when the name does not resolve or there is no route.
pub fn route_addr(server: &str) -> Option<std::net::IpAddr> {
    use std::net::{ToSocketAddrs, UdpSocket};
    let rest = server.split_once("://").map_or(server, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    // A bare host has no port; any port will do for a route lookup.
    let targets = authority
        .to_socket_addrs()
        .or_else(|_| format!("{authority}:9").to_socket_addrs())
        .ok()?;
    targets.into_iter().find_map(|target| {
        let any: std::net::SocketAddr = if target.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(any).ok()?;
        socket.connect(target).ok()?;
        Some(socket.local_addr().ok()?.ip())
    })
}

#[cfg(test)]
mod route_tests {
    use super::route_addr;

    #[test]
    fn a_control_plane_on_loopback_is_reached_from_loopback() {
        for s in [
            "http://127.0.0.1:7443",
            "https://localhost:7443/",
            "127.0.0.1:7443",
            "http://[::1]:7443",
        ] {
            let ip = route_addr(s).unwrap_or_else(|| panic!("{s}: no route"));
            assert!(ip.is_loopback(), "{s}: {ip}");
        }
        assert_eq!(route_addr("http://no-such-host.invalid:7443"), None);
    }
}
