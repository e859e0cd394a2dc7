//! `llmgw server init`: a machine made ready for `llmgw-server.service` in
//! one command. Every step looks first and says what it found: run again,
//! it changes nothing; a new `--host` reissues the server certificate (the
//! authority stays). A configuration, an environment file or an authority
//! is never overwritten, and the admin's password is printed once, when
//! the admin is created.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use llmgw_decider::Origin;
use llmgw_domain::Command;
use llmgw_domain::tenancy::{TenancyCommand as T, UserStatus};

use crate::Outcome;

#[derive(Debug, Args)]
pub(crate) struct InitArgs {
    /// The first admin's email; their password is printed once.
    #[arg(long)]
    admin: String,
    /// Another DNS name or address clients and agents reach this server
    /// by (the hostname and every local address are included); repeat. A
    /// name the certificate lacks reissues it.
    #[arg(long = "host", value_name = "NAME", value_parser = crate::cert::host_name)]
    hosts: Vec<String>,
    /// The configuration directory: server.yaml, server.env, the
    /// authority and the server certificate.
    #[arg(long, default_value = "/etc/llmgw")]
    dir: PathBuf,
    /// The state directory (the unit's StateDirectory): the SQLite event
    /// log unless --store names another.
    #[arg(long, default_value = "/var/lib/llmgw")]
    state_dir: PathBuf,
}

/// The global `--store` when nobody gave one: a relative file in the
/// working directory, which means nothing to a service.
const UNSET_STORE: &str = "llmgw.db";
/// The tenancy tree the admin (and, until an operator makes others, every
/// approved person) belongs to.
const DEFAULT_ID: &str = "default";
/// The system user `llmgw-server.service` runs as.
const SERVICE_USER: &str = "llmgw";

struct Report(std::io::StdoutLock<'static>);

impl Report {
    fn done(&mut self, what: impl std::fmt::Display) -> anyhow::Result<()> {
        writeln!(self.0, "created  {what}")?;
        Ok(())
    }
    fn skipped(&mut self, what: impl std::fmt::Display) -> anyhow::Result<()> {
        writeln!(self.0, "skipped  {what}")?;
        Ok(())
    }
    fn line(&mut self, what: impl std::fmt::Display) -> anyhow::Result<()> {
        writeln!(self.0, "{what}")?;
        Ok(())
    }
}

pub(crate) async fn run(store: &str, a: InitArgs) -> anyhow::Result<Outcome> {
    let mut say = Report(std::io::stdout().lock());
    let admin = llmgw_people::check_email(&a.admin)
        .map_err(|e| anyhow::anyhow!("--admin {:?}: {e}", a.admin))?;
    // `--store @FILE` keeps a password off the command line; the unit reads
    // server.env as root but runs as llmgw, who may not read FILE (under
    // /root, say): the address itself goes into the root-only server.env.
    let given = (store != UNSET_STORE)
        .then(|| match store.trim().strip_prefix('@') {
            Some(file) => std::fs::read_to_string(file)
                .map(|text| text.trim().to_owned())
                .with_context(|| format!("--store @{file}: cannot read {file}")),
            None => Ok(store.to_owned()),
        })
        .transpose()?;
    // Checked before anything is written with it (the file may be empty,
    // or name yet another file).
    if let Some(g) = &given {
        let address =
            llmgw_eventstore::StoreAddress::parse(g).with_context(|| format!("--store {store}"))?;
        // A SQLite file is made where its directory is (the directories
        // this makes count as there).
        if let llmgw_eventstore::StoreAddress::Sqlite(path) = &address
            && let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
            && !parent.is_dir()
            && !parent.starts_with(&a.state_dir)
            && !parent.starts_with(&a.dir)
        {
            bail!(
                "--store {store}: there is no directory {}",
                parent.display()
            );
        }
    }
    for (what, dir) in [("configuration", &a.dir), ("state", &a.state_dir)] {
        if dir.is_dir() {
            say.skipped(format!("{what} directory {}: exists", dir.display()))?;
        } else {
            create_dir(dir, if what == "state" { 0o750 } else { 0o755 })?;
            say.done(format!("{what} directory {}", dir.display()))?;
        }
    }
    let dir = a.dir.canonicalize()?;
    let state = a.state_dir.canonicalize()?;

    // The authority and the server's certificate.
    let (ca, ca_key) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
    match (ca.exists(), ca_key.exists()) {
        (true, true) => say.skipped(format!("authority {}: exists", ca.display()))?,
        (false, false) => {
            crate::cert::init_ca(&dir, "llmgw CA")?;
            say.done(format!(
                "authority {} (its key {} stays root's)",
                ca.display(),
                ca_key.display()
            ))?;
        }
        _ => bail!(
            "{} holds half an authority (ca.pem or ca-key.pem alone): restore the other or move both away",
            dir.display()
        ),
    }
    server_certificate(&dir, &a.hosts, &mut say)?;

    // The store's address lives in server.env, which systemd reads as root
    // (a PostgreSQL DSN carries a password); server.yaml holds no secret.
    let env_file = dir.join("server.env");
    let given = given.as_deref();
    let store = if env_file.exists() {
        let text = std::fs::read_to_string(&env_file)
            .with_context(|| format!("cannot read {}", env_file.display()))?;
        let named = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("LLMGW_STORE="))
            .map(|v| v.trim().trim_matches('"').to_owned())
            .with_context(|| format!("{} sets no LLMGW_STORE", env_file.display()))?;
        // The same database with or without its password is the same
        // store; the file's, password and all, is kept (and never shown).
        if let Some(g) = given
            && without_password(g) != without_password(&named)
        {
            bail!(
                "{} names another store ({}); edit it, or run without --store",
                env_file.display(),
                redact(&named)
            );
        }
        say.skipped(format!("{}: exists", env_file.display()))?;
        named
    } else {
        let store = match given {
            Some(s) => s.to_owned(),
            None => format!("sqlite://{}", state.join("llmgw.db").display()),
        };
        write_new(
            &env_file,
            &format!(
                "# The event log, for llmgw-server.service (root-only: a DSN may\n\
                 # carry a password). Written by `llmgw server init`.\n\
                 LLMGW_STORE={store}\n"
            ),
            0o600,
        )?;
        say.done(format!(
            "{} (LLMGW_STORE={})",
            env_file.display(),
            redact(&store)
        ))?;
        store
    };

    let config = dir.join("server.yaml");
    if config.exists() {
        say.skipped(format!("{}: exists (never overwritten)", config.display()))?;
    } else {
        write_new(&config, &server_yaml(&dir, &store), 0o644)?;
        say.done(config.display())?;
    }

    tenancy_and_admin(&store, &admin, &mut say).await?;
    hand_over(&state, &dir, &mut say)?;
    say.line(format!(
        "next: install deploy/systemd/llmgw-server.service, then `systemctl enable --now llmgw-server`; sign in on the client listener as {admin}"
    ))?;
    Ok(Outcome::Ok)
}

/// A DSN's password is not printed, in its user part or its query.
fn redact(store: &str) -> String {
    llmgw_eventstore::StoreAddress::parse(store)
        .map_or_else(|_| with_password(store, ":***"), |a| a.redacted())
}

/// The address that names the same database whatever its password.
fn without_password(store: &str) -> String {
    with_password(store, "")
}

fn with_password(store: &str, shown: &str) -> String {
    match (store.find("://"), store.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &store[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}{shown}{}", &store[..scheme + 3], &store[at..]),
                None => store.to_owned(),
            }
        }
        _ => store.to_owned(),
    }
}

fn create_dir(dir: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
}

fn write_new(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// `server.pem` for the hostname, every local address and each `--host`;
/// names an existing certificate has are kept, so a rerun without
/// `--host` changes nothing.
fn server_certificate(dir: &Path, hosts: &[String], say: &mut Report) -> anyhow::Result<()> {
    let (cert, key) = (dir.join("server.pem"), dir.join("server-key.pem"));
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    let host = llmgw_agent::discovery::host::hostname();
    if !host.is_empty() {
        wanted.insert(host);
    }
    wanted.insert("localhost".into());
    wanted.extend(local_addresses().iter().map(ToString::to_string));
    for h in hosts {
        let h = h.trim();
        if h.is_empty() || h.contains(char::is_whitespace) {
            bail!("--host {h:?} is not a DNS name or address");
        }
        wanted.insert(h.to_owned());
    }
    let have: BTreeSet<String> = if cert.exists() && key.exists() {
        let pem =
            std::fs::read(&cert).with_context(|| format!("cannot read {}", cert.display()))?;
        crate::cert::names_in(&pem)
            .with_context(|| format!("{} is not a certificate", cert.display()))?
            .into_iter()
            .collect()
    } else {
        BTreeSet::new()
    };
    let missing: Vec<&String> = wanted.difference(&have).collect();
    if missing.is_empty() {
        return say.skipped(format!(
            "server certificate {}: has every name",
            cert.display()
        ));
    }
    let reissue = !have.is_empty();
    let names: Vec<String> = wanted.union(&have).cloned().collect();
    // Issued aside, then renamed over the old pair: a reader never sees a
    // certificate without its key.
    let aside = dir.join(".server-cert.new");
    if aside.exists() {
        std::fs::remove_dir_all(&aside)?;
    }
    create_dir(&aside, 0o700)?;
    let (new_cert, new_key) = crate::cert::issue(
        dir,
        Some(&aside),
        "server",
        names.clone(),
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    std::fs::rename(&new_key, &key)?;
    std::fs::rename(&new_cert, &cert)?;
    std::fs::remove_dir(&aside)?;
    let what = format!(
        "server certificate {} for {}",
        cert.display(),
        names.join(", ")
    );
    if reissue {
        let added: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
        say.line(format!("reissued {what} (added {})", added.join(", ")))
    } else {
        say.done(what)
    }
}

/// The machine's own addresses: IPv4 from the kernel's routing trie (its
/// LOCAL host entries), IPv6 from if_inet6 (link-local ones left out: a
/// certificate cannot name their scope).
fn local_addresses() -> BTreeSet<std::net::IpAddr> {
    let mut out = BTreeSet::new();
    out.insert(std::net::IpAddr::from([127, 0, 0, 1]));
    if let Ok(trie) = std::fs::read_to_string("/proc/net/fib_trie") {
        let lines: Vec<&str> = trie.lines().collect();
        for pair in lines.windows(2) {
            if pair[1].trim() == "/32 host LOCAL"
                && let Some(ip) = pair[0].trim().strip_prefix("|-- ")
                && let Ok(ip) = ip.parse::<std::net::Ipv4Addr>()
            {
                out.insert(ip.into());
            }
        }
    }
    if let Ok(v6) = std::fs::read_to_string("/proc/net/if_inet6") {
        for line in v6.lines() {
            let Some(hex) = line.split_whitespace().next() else {
                continue;
            };
            if let Ok(bits) = u128::from_str_radix(hex, 16) {
                let ip = std::net::Ipv6Addr::from(bits);
                if (ip.segments()[0] & 0xffc0) != 0xfe80 {
                    out.insert(ip.into());
                }
            }
        }
    }
    out
}

/// A SQLite `store` goes in too, so that `llmgw server --config` run by
/// hand opens the log the unit does (it opened a new `./llmgw.db`); a
/// database's address, which may hold a password, stays in server.env.
fn server_yaml(dir: &Path, store: &str) -> String {
    let at = |f: &str| dir.join(f).display().to_string();
    // SQLite alone is sure to hold no secret: a DSN's password may be in
    // its query (`?password=`) as well as before the host.
    let sqlite = matches!(
        llmgw_eventstore::StoreAddress::parse(store),
        Ok(llmgw_eventstore::StoreAddress::Sqlite(_))
    );
    let store_line = if sqlite {
        format!("# The event log (LLMGW_STORE in server.env says the same).\nstore: {store:?}\n")
    } else {
        format!(
            "# The event log's address may hold a password: it is LLMGW_STORE in\n\
             # {env} alone. By hand: sudo sh -c 'set -a; . {env}; llmgw server --config {yaml}'\n",
            env = at("server.env"),
            yaml = at("server.yaml"),
        )
    };
    format!(
        "# Written by `llmgw server init`; never overwritten by it. Every key:\n\
         # docs/configuration.md.\n\
         {store_line}\
         listen: \":8080\"\n\
         admin_listen: \"127.0.0.1:9090\"\n\
         agent_listen: \":7443\"\n\
         # With a second server: admin_listen on an address it reaches,\n\
         # admin_token: \"@{token}\" (one token on both servers;\n\
         # operators export LLMGW_ADMIN_TOKEN=@that file), and\n\
         # advertise_admin: \"http://THAT:9090\" under control (docs/install.md).\n\
         control:\n  enabled: true\n\
         auth:\n  enabled: true\n\
         # Agents connect with mutual TLS: give each node a certificate with\n\
         # `llmgw ctl cert issue-client NODE --dir {dir}`, or let nodes join\n\
         # with a token (`llmgw ctl node token`): uncomment ca_key, and let\n\
         # the server read the authority's key (chgrp llmgw {ca_key};\n\
         # chmod 0640 {ca_key}).\n\
         tls:\n  ca: {ca}\n  cert: {cert}\n  key: {key}\n  # ca_key: {ca_key}\n\
         # HTTPS for clients and the pages, with the same certificate (clients\n\
         # then trust {ca}):\n\
         # client_tls:\n#   cert: {cert}\n#   key: {key}\n",
        dir = dir.display(),
        ca = at("ca.pem"),
        ca_key = at("ca-key.pem"),
        cert = at("server.pem"),
        key = at("server-key.pem"),
        token = at("admin-token"),
    )
}

/// The default org, team and project, and the admin in them: each command
/// only when the log lacks its effect, through the door `llmgw keys` uses
/// with no server (decided under the append lease), so a rerun needs no
/// lease and works while the server runs.
async fn tenancy_and_admin(store: &str, admin: &str, say: &mut Report) -> anyhow::Result<()> {
    let address = llmgw_eventstore::StoreAddress::parse(store)?;
    let log =
        llmgw_eventstore::AnyStore::open(&address, llmgw_eventstore::OpenOptions::migrating())
            .await?;
    let (door, follower) = crate::admin_client::following_door(&log, "server-init").await?;
    let result = async {
        let origin = Origin::operator_from_env(None);
        let decide = |commands: Vec<T>| {
            let door = door.clone();
            let origin = origin.clone();
            async move {
                let decided = door
                    .execute(&origin, commands.into_iter().map(Command::Tenancy).collect())
                    .await?;
                door.views_reach(decided.position).await;
                anyhow::Ok(())
            }
        };
        let tenancy = |door: &llmgw_control::Door| {
            let views = door.views();
            let v = views.read().unwrap_or_else(|p| p.into_inner());
            v.tenancy.tenancy.clone()
        };

        let t = tenancy(&door);
        let name = || DEFAULT_ID.to_owned();
        let tree = [
            (
                t.orgs.contains_key(DEFAULT_ID),
                "org",
                T::CreateOrg {
                    org_id: name(),
                    name: name(),
                },
            ),
            (
                t.teams.contains_key(DEFAULT_ID),
                "team",
                T::CreateTeam {
                    team_id: name(),
                    org_id: name(),
                    name: name(),
                },
            ),
            (
                t.projects.contains_key(DEFAULT_ID),
                "project",
                T::CreateProject {
                    project_id: name(),
                    team_id: name(),
                    name: name(),
                },
            ),
        ];
        for (exists, what, command) in tree {
            if exists {
                say.skipped(format!("{what} {DEFAULT_ID}: exists"))?;
            } else {
                decide(vec![command]).await?;
                say.done(format!("{what} {DEFAULT_ID}"))?;
            }
        }

        let people = llmgw_people::People::new(&log, Default::default());
        let found = people
            .people()
            .await?
            .into_iter()
            .find(|p| p.email == admin);
        let user_id = match found {
            Some(p) => {
                say.skipped(format!(
                    "admin {admin} ({}): exists, so no password is printed (`llmgw users reset-password {}` sets a new one)",
                    p.user_id, p.user_id
                ))?;
                p.user_id
            }
            None => {
                let password = new_password()?;
                let user_id = people
                    .sign_up(admin, "", &password, chrono::Utc::now())
                    .await?
                    .with_context(|| format!("{admin} signed up meanwhile: run init again"))?;
                // Without its fact in the log the account could never be
                // approved, and no command would see it: a refused decision
                // (a server holding the lease, say) takes the row back out,
                // before a password that opens nothing is shown.
                if let Err(refused) = decide(vec![T::SignUp {
                    user_id: user_id.clone(),
                }])
                .await
                {
                    if let Err(e) = people.erase(&user_id).await {
                        tracing::error!(user_id = %user_id, error = %e, "erasing a sign-up the log did not take");
                    }
                    return Err(refused.context(format!("{admin} was not made")));
                }
                // Printed before anything else can fail: it is never shown again.
                say.done(format!("admin {admin} ({user_id})"))?;
                say.line(format!("admin password (shown only now): {password}"))?;
                user_id
            }
        };
        let by = origin.actor.name().to_owned();
        let user = tenancy(&door).users.get(&user_id).cloned();
        if user.is_none() {
            decide(vec![T::SignUp {
                user_id: user_id.clone(),
            }])
            .await?;
        }
        let user = tenancy(&door).users.get(&user_id).cloned();
        let active_here = user.as_ref().is_some_and(|u| {
            u.status == UserStatus::Active && u.project_id.as_deref() == Some(DEFAULT_ID)
        });
        if active_here {
            say.skipped(format!("{admin} is in project {DEFAULT_ID} already"))?;
        } else {
            decide(vec![T::Approve {
                user_id: user_id.clone(),
                project_id: DEFAULT_ID.into(),
                by: by.clone(),
            }])
            .await?;
            say.done(format!("{admin} approved to project {DEFAULT_ID}"))?;
        }
        if user.as_ref().is_some_and(|u| u.admin) {
            say.skipped(format!("{admin} is an admin already"))?;
        } else {
            decide(vec![T::Promote {
                user_id: user_id.clone(),
                by,
            }])
            .await?;
            say.done(format!("{admin} promoted to admin"))?;
        }
        anyhow::Ok(())
    }
    .await;
    follower.abort();
    result
}

/// 128 bits from the OS's generator, as 32 hex digits: long enough for
/// the pages' minimum, easy to type once and change on the profile.
fn new_password() -> anyhow::Result<String> {
    let token = llmgw_people::random_hex_token()?;
    Ok(token[..32].to_owned())
}

/// With the service user present (and this run as root), the state
/// directory and the server's key become its: the server writes the
/// SQLite log and reads its key as `llmgw`. The authority's key and
/// server.env stay root's.
fn hand_over(state: &Path, dir: &Path, say: &mut Report) -> anyhow::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Some((uid, gid)) = service_user() else {
        return say.line(format!(
            "note: no user {SERVICE_USER} here: create it (deploy/systemd/llmgw.sysusers.conf) and run init again to hand it {} and the server key",
            state.display()
        ));
    };
    let mut paths = vec![state.to_path_buf()];
    for entry in std::fs::read_dir(state)? {
        paths.push(entry?.path());
    }
    let key = dir.join("server-key.pem");
    paths.push(key.clone());
    let mut changed = 0;
    for p in &paths {
        let meta = std::fs::metadata(p)?;
        if meta.uid() != uid || meta.gid() != gid {
            match std::os::unix::fs::chown(p, Some(uid), Some(gid)) {
                Ok(()) => changed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    return say.line(format!(
                        "note: only root may hand {} and the server key to {SERVICE_USER}: run init again as root",
                        state.display()
                    ));
                }
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("cannot hand {} to {SERVICE_USER}", p.display()));
                }
            }
        }
    }
    if std::fs::metadata(&key)?.permissions().mode() & 0o777 != 0o400 {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400))?;
        changed += 1;
    }
    if changed == 0 {
        say.skipped(format!(
            "ownership: {SERVICE_USER} has the state directory and the server key"
        ))
    } else {
        say.done(format!(
            "ownership: {} and {} belong to {SERVICE_USER}",
            state.display(),
            key.display()
        ))
    }
}

/// The service user's uid and gid, from /etc/passwd.
fn service_user() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 3 && f[0] == SERVICE_USER)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dsn_password_is_not_printed() {
        assert_eq!(
            redact("postgres://llmgw:s3cret@db:5432/llmgw"),
            "postgres://llmgw:***@db:5432/llmgw"
        );
        assert_eq!(
            redact("sqlite:///var/lib/llmgw/llmgw.db"),
            "sqlite:///var/lib/llmgw/llmgw.db"
        );
        assert_eq!(
            redact("postgres://llmgw@db/llmgw"),
            "postgres://llmgw@db/llmgw"
        );
    }

    #[test]
    fn local_addresses_include_loopback() {
        assert!(local_addresses().contains(&std::net::IpAddr::from([127, 0, 0, 1])));
    }
}
