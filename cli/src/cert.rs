//! `llmgw ctl cert`: a private certificate authority for the agent stream.
//! The server's certificate names its hosts; each agent's names its node
//! id as the common name, which the server checks against the id the
//! agent claims.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Subcommand;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

use crate::Outcome;

#[derive(Debug, Subcommand)]
pub(crate) enum CertCommand {
    /// Create the authority: ca.pem and ca-key.pem (never overwritten).
    InitCa {
        /// Where ca.pem and ca-key.pem are written.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The authority's name.
        #[arg(long, default_value = "llmgw agents CA")]
        name: String,
    },
    /// A server certificate for the agent listener, valid for every --host.
    IssueServer {
        /// The certificate's name: NAME.pem and NAME-key.pem.
        name: String,
        /// A DNS name or IP address agents dial; repeat.
        #[arg(long = "host", required = true, value_parser = host_name)]
        hosts: Vec<String>,
        /// Where the authority (ca.pem, ca-key.pem) is.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Where to write NAME.pem and NAME-key.pem (default: --dir).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// A client certificate for one node: its common name is the node id.
    IssueClient {
        /// The node id, which the certificate's common name must equal.
        node: String,
        /// Where the authority (ca.pem, ca-key.pem) is.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Where to write NODE.pem and NODE-key.pem (default: --dir).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// What a certificate says: names, issuer, validity, purposes.
    Inspect {
        /// A PEM certificate.
        file: PathBuf,
    },
}

fn valid_for_days(params: &mut CertificateParams, days: i64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let at = |secs: i64| {
        rcgen::date_time_ymd(1970, 1, 1) + std::time::Duration::from_secs(secs.max(0) as u64)
    };
    // A little slack for clocks behind ours.
    params.not_before = at(now - 3600);
    params.not_after = at(now + days * 86_400);
}

/// Writes a file only if it does not exist; keys readable by the owner only.
fn write_new(path: &Path, text: &str, secret: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| {
            format!(
                "cannot create {} (an existing file is never overwritten)",
                path.display()
            )
        })?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

fn load_ca(dir: &Path) -> anyhow::Result<Issuer<'static, KeyPair>> {
    // The fleet most likely has an authority elsewhere: a second one would
    // sign certificates nothing in the fleet trusts, so it is named last.
    let cert = std::fs::read_to_string(dir.join("ca.pem")).with_context(|| {
        format!(
            "no authority in {d} (ca.pem and ca-key.pem): give --dir where your fleet's CA is (`llmgw server init` puts it in /etc/llmgw), or, for a new fleet only, `llmgw ctl cert init-ca --dir {d}`",
            d = dir.display(),
        )
    })?;
    let key = std::fs::read_to_string(dir.join("ca-key.pem"))
        .with_context(|| format!("cannot read {}", dir.join("ca-key.pem").display()))?;
    let key = KeyPair::from_pem(&key).context("ca-key.pem is not a private key")?;
    Issuer::from_ca_cert_pem(&cert, key).context("ca.pem is not a certificate authority")
}

/// Issues a certificate signed by the authority in `dir`; `llmgw server
/// init` issues the server's through here too.
pub(crate) fn issue(
    dir: &Path,
    out: Option<&Path>,
    name: &str,
    sans: Vec<String>,
    purpose: ExtendedKeyUsagePurpose,
) -> anyhow::Result<(PathBuf, PathBuf)> {
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        bail!("{name:?} cannot name a certificate file");
    }
    let ca = load_ca(dir)?;
    let mut params = CertificateParams::new(sans).context("a --host is not a DNS name or IP")?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![purpose];
    valid_for_days(&mut params, 825);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;
    let out = out.unwrap_or(dir);
    std::fs::create_dir_all(out)?;
    let (c, k) = (
        out.join(format!("{name}.pem")),
        out.join(format!("{name}-key.pem")),
    );
    write_new(&k, &key.serialize_pem(), true)?;
    write_new(&c, &cert.pem(), false)?;
    Ok((c, k))
}

/// What `cert inspect` reports.
#[derive(Debug, serde::Serialize)]
struct Inspected {
    subject: String,
    issuer: String,
    not_before: String,
    not_after: String,
    ca: bool,
    /// DNS names and IP addresses it is valid for.
    names: Vec<String>,
    /// server and/or client.
    purposes: Vec<String>,
}

/// Seconds since the epoch as RFC 3339 in UTC (`2026-12-07T06:50:10Z`),
/// as the rest of the CLI writes times.
fn iso(seconds: i64) -> String {
    chrono::DateTime::from_timestamp(seconds, 0).map_or_else(
        || seconds.to_string(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

fn general_name(n: &x509_parser::extensions::GeneralName) -> String {
    use x509_parser::extensions::GeneralName;
    match n {
        GeneralName::DNSName(d) => (*d).to_owned(),
        GeneralName::IPAddress(b) => match b.len() {
            4 => std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string(),
            16 => <[u8; 16]>::try_from(*b)
                .map(|a| std::net::Ipv6Addr::from(a).to_string())
                .unwrap_or_default(),
            _ => format!("{b:?}"),
        },
        other => other.to_string(),
    }
}

/// Creates the authority (ca.pem, ca-key.pem) in `dir`; refuses if either
/// file exists.
pub(crate) fn init_ca(dir: &Path, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let (c, k) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
    if c.exists() || k.exists() {
        bail!(
            "{} already holds an authority; it is never overwritten",
            dir.display()
        );
    }
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    valid_for_days(&mut params, 3650);
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    write_new(&k, &key.serialize_pem(), true)?;
    write_new(&c, &cert.pem(), false)?;
    Ok((c, k))
}

/// The DNS names and IP addresses a PEM certificate is valid for.
pub(crate) fn names_in(pem: &[u8]) -> anyhow::Result<Vec<String>> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|e| anyhow::anyhow!("not a PEM certificate: {e}"))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| anyhow::anyhow!("no readable certificate: {e}"))?;
    Ok(match cert.subject_alternative_name() {
        Ok(Some(san)) => san.value.general_names.iter().map(general_name).collect(),
        _ => Vec::new(),
    })
}

/// What a command wrote, as `--json` says it: `{"kind", "name", "cert",
/// "key"}` (the help promised one JSON document; these printed text).
fn written(
    out: &mut impl Write,
    kind: &str,
    name: &str,
    cert: &Path,
    key: &Path,
) -> anyhow::Result<()> {
    crate::output::json_line(
        out,
        &serde_json::json!({"kind": kind, "name": name, "cert": cert, "key": key}),
    )?;
    Ok(())
}

pub(crate) fn run(cmd: CertCommand, json: bool) -> anyhow::Result<Outcome> {
    let mut out = std::io::stdout().lock();
    match cmd {
        CertCommand::InitCa { dir, name } => {
            let (c, k) = init_ca(&dir, &name)?;
            if json {
                written(&mut out, "authority", &name, &c, &k)?;
            } else {
                writeln!(
                    out,
                    "authority {name:?}: {} and {} (keep the key offline)",
                    c.display(),
                    k.display()
                )?;
            }
        }
        CertCommand::IssueServer {
            name,
            hosts,
            dir,
            out: o,
        } => {
            let (c, k) = issue(
                &dir,
                o.as_deref(),
                &name,
                hosts.clone(),
                ExtendedKeyUsagePurpose::ServerAuth,
            )?;
            if json {
                written(&mut out, "server", &name, &c, &k)?;
            } else {
                writeln!(
                    out,
                    "server {name} for {}: {} and {}",
                    hosts.join(", "),
                    c.display(),
                    k.display()
                )?;
            }
        }
        CertCommand::IssueClient { node, dir, out: o } => {
            let (c, k) = issue(
                &dir,
                o.as_deref(),
                &node,
                Vec::new(),
                ExtendedKeyUsagePurpose::ClientAuth,
            )?;
            if json {
                written(&mut out, "client", &node, &c, &k)?;
            } else {
                writeln!(out, "node {node}: {} and {}", c.display(), k.display())?;
            }
        }
        CertCommand::Inspect { file } => {
            let pem =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let (_, pem) = x509_parser::pem::parse_x509_pem(&pem)
                .map_err(|e| anyhow::anyhow!("{} is not a PEM certificate: {e}", file.display()))?;
            // x509-parser's error is a debug structure: the PEM's label
            // says what the file holds instead (a key, most often).
            let cert = pem.parse_x509().map_err(|_| {
                anyhow::anyhow!(
                    "{} holds no certificate (its PEM block is a {:?})",
                    file.display(),
                    pem.label
                )
            })?;
            let names: Vec<String> = match cert.subject_alternative_name() {
                Ok(Some(san)) => san.value.general_names.iter().map(general_name).collect(),
                _ => Vec::new(),
            };
            let purposes: Vec<&str> = match cert.extended_key_usage() {
                Ok(Some(eku)) => [
                    (eku.value.server_auth, "server"),
                    (eku.value.client_auth, "client"),
                ]
                .into_iter()
                .filter_map(|(on, p)| on.then_some(p))
                .collect(),
                _ => Vec::new(),
            };
            let inspected = Inspected {
                subject: cert.subject().to_string(),
                issuer: cert.issuer().to_string(),
                not_before: iso(cert.validity().not_before.timestamp()),
                not_after: iso(cert.validity().not_after.timestamp()),
                ca: cert.is_ca(),
                names,
                purposes: purposes.iter().map(|p| (*p).to_owned()).collect(),
            };
            if json {
                crate::output::json_line(&mut out, &inspected)?;
            } else {
                writeln!(out, "subject   {}", inspected.subject)?;
                writeln!(out, "issuer    {}", inspected.issuer)?;
                let left = cert.validity().not_after.timestamp() - chrono::Utc::now().timestamp();
                let days = left.abs() / 86_400;
                writeln!(
                    out,
                    "valid     {} to {} ({})",
                    inspected.not_before,
                    inspected.not_after,
                    if left < 0 {
                        format!("expired {days} days ago")
                    } else {
                        format!("expires in {days} days")
                    }
                )?;
                writeln!(out, "ca        {}", inspected.ca)?;
                if !inspected.names.is_empty() {
                    writeln!(out, "names     {}", inspected.names.join(", "))?;
                }
                if !inspected.purposes.is_empty() {
                    writeln!(out, "purposes  {}", inspected.purposes.join(", "))?;
                }
            }
        }
    }
    Ok(Outcome::Ok)
}

/// A name a certificate may be issued for, as `--host` takes it: an IP
/// address, or a DNS name (letters, digits, `-` and `_` in dot-separated
/// labels of up to 63, a leading `*.` wildcard allowed). Refused before
/// anything is written: a name with a space was issued, and no client
/// could ever match it.
pub(crate) fn host_name(s: &str) -> Result<String, String> {
    let bad = |why: &str| format!("{s:?} is not a DNS name or IP address: {why}");
    if s.parse::<std::net::IpAddr>().is_ok() {
        return Ok(s.to_owned());
    }
    let name = s.strip_suffix('.').unwrap_or(s);
    let name = name.strip_prefix("*.").unwrap_or(name);
    if name.is_empty() || s.len() > 253 {
        return Err(bad("empty, or longer than 253 characters"));
    }
    for label in name.split('.') {
        let fits = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !fits {
            return Err(bad(&format!(
                "the label {label:?} is not letters, digits, - and _ (1 to 63)"
            )));
        }
    }
    Ok(s.to_owned())
}
