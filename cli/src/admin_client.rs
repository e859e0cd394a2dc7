//! Where `llmgw keys` and `llmgw users` send their commands: a running
//! server's admin API (any server: a standby or a router-only server
//! forwards to the leader), or, when none answers, the same routes served
//! in this process over the store: deciding under the append lease while
//! no server leads, else sending the command on to the admin address the
//! leader recorded (never with --offline). One code path either way.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use llmgw_api::admin as api;
use llmgw_decider::Origin;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Where the tenancy routes are served.
/// Where a command is sent, shared by `keys` and `users`.
#[derive(Debug, clap::Args)]
pub(crate) struct AdminArgs {
    /// A server's admin API; when none answers there, the command goes to
    /// the leader's recorded address, or is decided here, on --store,
    /// under the append lease while no server leads. A --store given on
    /// the command line (and no --admin there) sends the command to that
    /// log that way, whatever answers here. A server with admin_token is
    /// sent LLMGW_ADMIN_TOKEN (the token, or @FILE).
    #[arg(
        long,
        global = true,
        env = "LLMGW_ADMIN",
        default_value = "http://127.0.0.1:9090",
        value_parser = admin_url
    )]
    pub admin: String,
    /// Write to --store directly even if a server answers at --admin.
    #[arg(long, global = true)]
    pub offline: bool,
    /// The operator the log names (default: the OS user).
    #[arg(long = "as", global = true, value_name = "NAME")]
    pub as_name: Option<String>,
}

pub(crate) enum Api {
    Remote {
        base: String,
        http: reqwest::Client,
    },
    /// No server answered: the routes, here, over the store, opened at
    /// the first call as that call needs it (see [`Opened`]).
    Local {
        store: String,
        admin: String,
        /// Asked for (`--offline`), rather than fallen back to.
        offline: bool,
        may_start_a_log: bool,
        opened: tokio::sync::Mutex<Option<Box<Opened>>>,
    },
}

/// The store a command decided here works on, with the routes over it.
/// A read (`keys list`, `keys groups`, `users list`) opens it read-only
/// and replays the views without saving a snapshot: opened for writing,
/// a read-only backup was refused ("attempt to write a readonly
/// database") and a large one rewritten by the snapshot the catch-up
/// saved. A command that writes opens it for writing, once it first
/// writes (a read it made first is opened again).
pub(crate) struct Opened {
    routes: axum::Router,
    /// Settled when the command ends, when it was written.
    log: llmgw_eventstore::AnyStore,
    writes: bool,
    /// A writer's views follow the log; a reader's stay as replayed.
    follower: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Opened {
    fn drop(&mut self) {
        if let Some(f) = &self.follower {
            f.abort();
        }
    }
}

/// The admin API's token the operator gave (`LLMGW_ADMIN_TOKEN`: the
/// token, or `@FILE` holding it), for a server with `admin_token` set.
pub(crate) fn admin_token() -> anyhow::Result<Option<String>> {
    match std::env::var("LLMGW_ADMIN_TOKEN") {
        Ok(v) if !v.trim().is_empty() => {
            Ok(Some(crate::config::secret_value("LLMGW_ADMIN_TOKEN", &v)?))
        }
        _ => Ok(None),
    }
}

/// Headers every request to an admin API carries: its token, when given.
pub(crate) fn token_headers() -> anyhow::Result<reqwest::header::HeaderMap> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = admin_token()? {
        let mut bearer = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
            .context("LLMGW_ADMIN_TOKEN cannot be sent in a header")?;
        bearer.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, bearer);
    }
    Ok(headers)
}

/// A server that answers at `admin`, or None when nothing listens there.
async fn remote(admin: &str) -> anyhow::Result<Option<reqwest::Client>> {
    let http = reqwest::Client::builder()
        .default_headers(token_headers()?)
        .timeout(Duration::from_secs(30))
        .no_proxy()
        .build()?;
    let health = format!("{}/health", admin.trim_end_matches('/'));
    match http
        .get(&health)
        .timeout(Duration::from_secs(2))
        .send()
        .await
    {
        Ok(r) if r.status().is_success() => Ok(Some(http)),
        Ok(r) => bail!(
            "{admin} answered {} to /health: is it an llmgw admin listener?",
            r.status()
        ),
        Err(e) if e.is_connect() => Ok(None),
        Err(e) => {
            Err(e).with_context(|| format!("{admin} did not answer like an llmgw admin listener"))
        }
    }
}

/// Whether `address` holds an llmgw log, of whatever schema: its lease
/// row reads.
async fn is_older_log(address: &llmgw_eventstore::StoreAddress) -> bool {
    use llmgw_eventstore::EventStore;
    let options = llmgw_eventstore::OpenOptions {
        schema: llmgw_eventstore::Schema::Unchecked,
        ..llmgw_eventstore::OpenOptions::reading()
    };
    match llmgw_eventstore::AnyStore::open(address, options).await {
        Ok(store) => store.lease_info().await.is_ok(),
        Err(_) => false,
    }
}

/// An admin API's address as `--admin` takes it: http(s)://HOST:PORT.
/// A malformed one is a usage error, not a server that cannot be reached.
pub(crate) fn admin_url(s: &str) -> Result<String, String> {
    http_address(s, "an admin API", "http://127.0.0.1:9090")
}

/// `s` if it is an http(s) URL with a host, else why not: `what` it should
/// have been, and an `example`.
pub(crate) fn http_address(s: &str, what: &str, example: &str) -> Result<String, String> {
    match reqwest::Url::parse(s) {
        Ok(u)
            if matches!(u.scheme(), "http" | "https")
                && u.host_str().is_some_and(|h| !h.is_empty()) =>
        {
            Ok(s.to_owned())
        }
        _ => Err(format!(
            "{s:?} is not {what} address: give http://HOST:PORT, e.g. {example}"
        )),
    }
}

/// Opens `store` for a command decided here: for writing when `writes`,
/// else read-only.
async fn open_local(
    store: &str,
    offline: bool,
    may_start_a_log: bool,
    writes: bool,
) -> anyhow::Result<Opened> {
    let address = llmgw_eventstore::StoreAddress::parse(store)?;
    // Only the first `keys init` or `users add` starts a log (and gives
    // it its schema, as a server would). Any other command refuses a
    // store that is not one: a typo in --store made an empty log to
    // answer from, and another program's database got llmgw's tables.
    let options = match (writes, may_start_a_log) {
        (false, _) => llmgw_eventstore::OpenOptions::reading(),
        (true, true) => llmgw_eventstore::OpenOptions::migrating(),
        (true, false) => llmgw_eventstore::OpenOptions::default(),
    };
    let log = match llmgw_eventstore::AnyStore::open(&address, options).await {
        Err(llmgw_eventstore::StoreError::NoSuchFile { address }) => {
            bail!(
                "there is no log at {address}: no such file; `llmgw keys init` or `llmgw users add` starts one"
            )
        }
        // A log of an older schema (after an upgrade) is brought up to
        // date by a command that writes, as a server would; a read
        // changes nothing, and says how. Anything else is not a log.
        Err(llmgw_eventstore::StoreError::NotMigrated { address: said }) => {
            if !is_older_log(&address).await {
                bail!(
                    "{said} holds no llmgw log; `llmgw keys init` or `llmgw users add` starts one there"
                )
            }
            if !writes {
                bail!(
                    "the log at {said} has an older schema, and reading it here changes nothing: `llmgw store migrate --store {said}` brings it up to date (a server does at its start)"
                )
            }
            llmgw_eventstore::AnyStore::open(&address, llmgw_eventstore::OpenOptions::migrating())
                .await?
        }
        opened => opened?,
    };
    let (door, follower) = if writes {
        let (door, follower) = following_door(&log, "cli-keys").await?;
        (door, Some(follower))
    } else {
        // Replayed whole: a snapshot is a cache of the writers', and
        // this leaves none behind.
        let mut views = llmgw_projections::Projections::default();
        llmgw_projections::replay_to(&log, &mut views, u64::MAX).await?;
        let (_, views_at) = tokio::sync::watch::channel(views.checkpoint.position);
        let door = llmgw_control::Door::Lease {
            store: log.clone(),
            views: Arc::new(std::sync::RwLock::new(views)),
            views_at,
        };
        (door, None)
    };
    // Claim links and password resets touch the people tables of the
    // same store.
    let routes = llmgw_control::tenancy_api::router(
        door,
        Arc::new(llmgw_people::People::new(&log, Default::default())),
    );
    // Without --offline, a command that a leading server's lease refuses
    // here goes to the admin address that server recorded.
    let routes = if offline {
        routes
    } else {
        let token = admin_token()?;
        llmgw_control::ToLeader::for_cli(log.clone(), token).around(routes)
    };
    Ok(Opened {
        routes,
        log,
        writes,
        follower,
    })
}

/// Whether `base` is an llmgw admin listener: asked only after a bare 404,
/// which any HTTP service answers (an engine, another program); llmgw's
/// admin listener serves its metrics, every series named `llmgw_…`.
pub(crate) async fn is_llmgw_admin(http: &reqwest::Client, base: &str) -> bool {
    let page = http
        .get(format!("{}/metrics", base.trim_end_matches('/')))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    match page {
        Ok(r) if r.status().is_success() => r.text().await.is_ok_and(|t| t.contains("llmgw_")),
        _ => false,
    }
}

/// What to say of a bare 404 from `base` when it is not llmgw's.
pub(crate) fn not_llmgw(base: &str) -> String {
    format!(
        "{base} is not an llmgw admin listener (it answers, but not as llmgw does); the admin listener is `admin_listen`, 127.0.0.1:9090 by default"
    )
}

/// An answer in HTML is a page, not the admin API's: the client listener
/// (its pages and the OpenAI API) given as --admin, most often.
pub(crate) fn not_admin(base: &str, status: reqwest::StatusCode) -> String {
    format!(
        "{base} answered {status} with a web page: it is not an llmgw admin API (the admin listener is `admin_listen`, 127.0.0.1:9090 by default)"
    )
}

/// When the answer is the leader's, sent on by a router-only server or by
/// this process, says so on stderr: "{how} the leader NAME at URL".
/// Says on stderr which leader answered, when another server sent the
/// request on; whether it said so.
pub(crate) fn say_forwarded(headers: &reqwest::header::HeaderMap, how: &str) -> bool {
    let Some(to) = headers
        .get(api::FORWARDED_TO_HEADER)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let (holder, url) = to.split_once(' ').unwrap_or((to, ""));
    eprintln!("{how} the leader {holder} at {url}");
    true
}

/// Which of `--store` and `--admin` the command line itself gave (not a
/// variable, not the default).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Named {
    pub store: bool,
    /// Where the store's address came from, as the notice names it.
    pub store_from: &'static str,
    /// --admin on the command line.
    pub admin: bool,
    /// --admin on the command line or in `LLMGW_ADMIN`: a server was
    /// meant, so a new log is never started in its place.
    pub admin_chosen: bool,
}

impl Api {
    /// At the end of a command decided here: a SQLite log's write-ahead
    /// log is folded into its file, so that the file alone (copied, backed
    /// up) holds what the command wrote. A server does this at its stop;
    /// a command that exits without it left its events beside the file.
    pub(crate) async fn settle(&self) {
        if let Api::Local { opened, .. } = self
            && let Some(o) = opened.lock().await.as_ref().filter(|o| o.writes)
        {
            o.log.fold_wal().await;
        }
    }

    /// `admin` when a server answers there (unless `offline`), else the
    /// routes here over `store`. A store the command line names, without
    /// an admin address it names too, is where the command goes: through
    /// that log's leader, or decided here while none leads. A server that
    /// happens to answer at the default or ambient address keeps another
    /// log, perhaps. Only a command that `may_start_a_log` (the first
    /// `keys init`, `users add`) makes a SQLite log where none is.
    pub(crate) async fn connect(
        store: &str,
        to: &AdminArgs,
        named: Named,
        may_start_a_log: bool,
    ) -> anyhow::Result<Api> {
        let store_only = named.store && !named.admin;
        if !to.offline && !store_only {
            if let Some(http) = remote(&to.admin).await? {
                return Ok(Api::Remote {
                    base: to.admin.clone(),
                    http,
                });
            }
            // Said, not done quietly: a mistyped --admin or a stopped
            // server otherwise reads another log and answers as if it
            // were the cluster's.
            let address = llmgw_eventstore::StoreAddress::parse(store);
            let at = (address.as_ref()).map_or_else(|_| store.to_owned(), |a| a.redacted());
            // Nor is a new, empty log made to answer from where none was
            // asked for (the default ./llmgw.db of whatever directory
            // this runs in).
            // Nor where a server was named: a mistyped --admin on the
            // first `keys init` made a log of its own, which no server
            // reads.
            if let Ok(llmgw_eventstore::StoreAddress::Sqlite(path)) = &address
                && !named.store
                && (!may_start_a_log || named.admin_chosen)
                && !path.exists()
            {
                anyhow::bail!(
                    "nothing answers at {} and there is no log at {at}: start the server, or name its admin API (--admin) or its log (--store)",
                    to.admin
                );
            }
            eprintln!(
                "nothing answers at {}: using the log at {at} ({})",
                to.admin, named.store_from
            );
        }
        // The log is opened at the first call, as that call needs it; a
        // file that is not there is said now, before a password is asked.
        if let Ok(address @ llmgw_eventstore::StoreAddress::Sqlite(path)) =
            &llmgw_eventstore::StoreAddress::parse(store)
            && !may_start_a_log
            && !path.exists()
        {
            bail!(
                "{}; `llmgw keys init` or `llmgw users add` starts one",
                llmgw_eventstore::StoreError::NoSuchFile {
                    address: address.redacted()
                }
            )
        }
        Ok(Api::Local {
            store: store.to_owned(),
            admin: to.admin.clone(),
            offline: to.offline,
            may_start_a_log,
            opened: tokio::sync::Mutex::new(None),
        })
    }

    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        origin: &Origin,
        method: reqwest::Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> anyhow::Result<T> {
        let body = body.map(serde_json::to_vec).transpose()?;
        let (status, bytes) = match self {
            Api::Remote { base, http } => {
                let mut r = http
                    .request(method, format!("{}{path}", base.trim_end_matches('/')))
                    .header(api::ACTOR_HEADER, api::actor_to_header(origin.actor.name()))
                    .header(api::COMMAND_HEADER, &origin.command_id);
                if let Some(b) = body {
                    r = r.header("content-type", "application/json").body(b);
                }
                let resp = r
                    .send()
                    .await
                    .with_context(|| format!("the admin API at {base} stopped answering"))?;
                (resp.status().as_u16(), resp.bytes().await?.to_vec())
            }
            Api::Local {
                store,
                offline,
                may_start_a_log,
                opened,
                ..
            } => {
                use tower::ServiceExt;
                let writes = method != reqwest::Method::GET;
                let routes = {
                    let mut opened = opened.lock().await;
                    if !opened.as_ref().is_some_and(|o| o.writes || !writes) {
                        // The reader goes first: one store open at a time.
                        *opened = None;
                        *opened = Some(Box::new(
                            open_local(store, *offline, *may_start_a_log, writes).await?,
                        ));
                    }
                    opened
                        .as_ref()
                        .map(|o| o.routes.clone())
                        .unwrap_or_default()
                };
                let request = axum::http::Request::builder()
                    .method(method.as_str())
                    .uri(path)
                    .header(api::ACTOR_HEADER, api::actor_to_header(origin.actor.name()))
                    .header(api::COMMAND_HEADER, &origin.command_id)
                    .header("content-type", "application/json")
                    .body(axum::body::Body::from(body.unwrap_or_default()))?;
                let resp = routes.clone().oneshot(request).await?;
                say_forwarded(resp.headers(), "sent to");
                let status = resp.status().as_u16();
                let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await?;
                (status, bytes.to_vec())
            }
        };
        if !(200..300).contains(&status) {
            let why = serde_json::from_slice::<api::ErrorBody>(&bytes)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            if status == 404 && why.is_empty() {
                if let Api::Remote { base, http } = self
                    && !is_llmgw_admin(http, base).await
                {
                    bail!("{}", not_llmgw(base));
                }
                bail!(
                    "the server at --admin keeps no keys: it runs without auth and record_usage (or is an older llmgw); pass --offline to write to --store instead"
                );
            }
            if let Api::Remote { base, .. } = self
                && why.trim_start().starts_with('<')
            {
                bail!(
                    "{}",
                    not_admin(base, reqwest::StatusCode::from_u16(status)?)
                );
            }
            if let Api::Local { admin, offline, .. } = self
                && status == 423
            {
                if *offline {
                    bail!(
                        "{why}; --offline writes only while no server holds the lease: leave it out, and the command goes to the leader (at --admin {admin} when a server answers there, else at the admin address the leader recorded)"
                    );
                }
                bail!(
                    "{why}; no admin API answers at {admin}, and the leader recorded no admin address to send it to: pass --admin with a server's admin address (any server forwards to the leader)"
                );
            }
            bail!("{why}");
        }
        Ok(serde_json::from_slice(&bytes)?)
    }
}

/// A door that decides under the append lease here, over views that
/// follow the log (their runner snapshots as `name`), and the task that
/// keeps them following: for commands run against a store with no server.
pub(crate) async fn following_door(
    log: &llmgw_eventstore::AnyStore,
    name: &str,
) -> anyhow::Result<(llmgw_control::Door, tokio::task::JoinHandle<()>)> {
    let mut runner = llmgw_projections::Runner::start(log.clone(), name).await?;
    let door = llmgw_control::Door::Lease {
        store: log.clone(),
        views: runner.views(),
        views_at: runner.watch_position(),
    };
    let follower = tokio::spawn(async move {
        if let Err(e) = runner.follow().await {
            tracing::warn!(error = %e, "the views stopped following the event log");
        }
    });
    Ok((door, follower))
}
