//! What the page tests share: a server's `Web` (with or without accounts),
//! a browser that keeps cookies, a stand-in engine and a stand-in admin
//! API.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query};
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::routing::{get as get_route, post as post_route};
use llmgw_api::admin::{ACTOR_HEADER, Changed, KeyCreated, KeyRow, LevelLimits, NewKey};
use llmgw_decider::{Actor, Decider, Origin};
use llmgw_domain::Event;
use llmgw_domain::tenancy::TenancyEvent;
use llmgw_eventstore::{AnyStore, EventStore, OpenOptions, StoreAddress};
use llmgw_gateway::{EndpointSpec, Gateway, GatewayConfig};
use llmgw_people::{People, PeopleConfig};
use llmgw_projections::Projections;
use serde_json::Value;
use tower::ServiceExt;

use crate::{Web, WebSettings, client_routes};

pub(super) fn gateway(endpoints: Vec<EndpointSpec>) -> Arc<Gateway> {
    Gateway::new(
        GatewayConfig {
            endpoints,
            ..GatewayConfig::default()
        },
        None,
    )
    .expect("gateway")
}

/// A server without accounts.
pub(crate) fn web(settings: WebSettings, endpoints: Vec<EndpointSpec>) -> Arc<Web> {
    Arc::new(Web {
        settings,
        views: Arc::new(RwLock::new(Projections::default())),
        store: None,
        people: None,
        gateway: gateway(endpoints),
        admin: Router::new(),
        decider: None,
        instance: "test".into(),
    })
}

pub(super) fn endpoint(url: &str, model: &str) -> EndpointSpec {
    format!("e1={url}={model}").parse().expect("endpoint")
}

pub(super) async fn get(app: &Router, uri: &str, host: &str) -> (StatusCode, String, HeaderMap) {
    let request = Request::get(uri)
        .header(header::HOST, host)
        .body(Body::empty())
        .expect("request");
    send(app, request).await
}

pub(super) async fn send(app: &Router, request: Request<Body>) -> (StatusCode, String, HeaderMap) {
    let response = app.clone().oneshot(request).await.expect("response");
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("body");
    (status, String::from_utf8_lossy(&body).into_owned(), headers)
}

pub(super) type Seen = Arc<Mutex<Vec<Value>>>;

/// A stand-in engine that keeps the bodies it was sent.
pub(super) async fn engine() -> (String, Seen) {
    let seen: Seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    let app = Router::new().route(
        "/v1/chat/completions",
        post_route(move |body: Bytes| {
            let keep = keep.clone();
            async move {
                let v: Value = serde_json::from_slice(&body).expect("json");
                keep.lock().expect("lock").push(v);
                axum::Json(serde_json::json!({
                    "id": "x", "object": "chat.completion", "model": "llama-8b",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

/// What the stand-in admin API was asked: `(method path, actor, body)`.
pub(super) type Asked = Arc<Mutex<Vec<(String, String, Value)>>>;

/// The admin API as far as the profile page uses it: every project has a
/// key of the asking person's, someone else's and an unowned one.
fn admin_api(asked: Asked) -> Router {
    let actor = |h: &HeaderMap| {
        h.get(ACTOR_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let row = |key_id: &str, project: &str, owner: Option<String>| KeyRow {
        key_id: key_id.into(),
        prefix: format!("sk-{key_id}"),
        project: project.into(),
        name: format!("{key_id} name"),
        band: "gold".into(),
        state: "active".into(),
        owner,
        limits: LevelLimits::default(),
        last_used: None,
        expires_at: None,
        previous_until: None,
        previous_prefix: None,
    };
    let (list, made, revoked) = (asked.clone(), asked.clone(), asked);
    // The keys made through it, listed afterwards; a name made twice by
    // the same owner in a project is refused as the domain refuses it.
    let keys: Arc<Mutex<Vec<NewKey>>> = Arc::default();
    let (listed, kept) = (keys.clone(), keys);
    Router::new()
        .route(
            "/api/v1/keys",
            get_route(
                move |h: HeaderMap, Query(q): Query<BTreeMap<String, String>>| {
                    let who = actor(&h);
                    let project = q.get("project").cloned().unwrap_or_default();
                    list.lock().expect("lock").push((
                        format!("GET keys?project={project}"),
                        who.clone(),
                        Value::Null,
                    ));
                    let mut rows = vec![
                        row("key-mine", &project, Some(who)),
                        row("key-theirs", &project, Some("usr-someone-else".into())),
                        row("key-ops", &project, None),
                    ];
                    for k in listed.lock().expect("lock").iter() {
                        rows.push(KeyRow {
                            name: k.name.clone(),
                            ..row("key-new", &k.project, k.owner.clone())
                        });
                    }
                    async move { axum::Json(rows) }
                },
            )
            .post(move |h: HeaderMap, axum::Json(body): axum::Json<NewKey>| {
                made.lock().expect("lock").push((
                    "POST keys".into(),
                    actor(&h),
                    serde_json::to_value(&body).expect("json"),
                ));
                let mut keys = kept.lock().expect("lock");
                let taken = keys.iter().any(|k| {
                    (&k.project, &k.owner, &k.name) == (&body.project, &body.owner, &body.name)
                });
                let answer = if taken {
                    let why = format!(
                        "{} already has a key named {} in project {}: choose another name",
                        body.owner.clone().unwrap_or_default(),
                        body.name,
                        body.project
                    );
                    (
                        StatusCode::CONFLICT,
                        axum::Json(serde_json::json!({ "error": why })),
                    )
                } else {
                    keys.push(body);
                    let made = KeyCreated {
                        key_id: "key-new".into(),
                        prefix: "sk-new".into(),
                        secret: Some("sk-new-0123456789abcdef".into()),
                        claim_token: None,
                        claim_expires_at: None,
                    };
                    (
                        StatusCode::OK,
                        axum::Json(serde_json::to_value(made).expect("json")),
                    )
                };
                async move { answer }
            }),
        )
        .route(
            "/api/v1/keys/{id}/revoke",
            post_route(move |h: HeaderMap, Path(id): Path<String>| {
                revoked.lock().expect("lock").push((
                    format!("POST keys/{id}/revoke"),
                    actor(&h),
                    Value::Null,
                ));
                async move {
                    axum::Json(Changed {
                        events: vec!["KeyRevoked".into()],
                        message: format!("revoked {id}"),
                    })
                }
            }),
        )
}

/// A server with accounts: people tables and the log in a fresh SQLite
/// file, the views caught up by hand.
pub(super) struct Site {
    pub app: Router,
    pub web: Arc<Web>,
    pub people: Arc<People>,
    pub store: AnyStore,
    pub asked: Asked,
    position: Mutex<u64>,
    dir: std::path::PathBuf,
}

impl Drop for Site {
    fn drop(&mut self) {
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

static SITES: AtomicU64 = AtomicU64::new(0);

impl Site {
    pub(super) async fn open(signup_open: bool, endpoints: Vec<EndpointSpec>) -> Site {
        let dir = std::env::temp_dir().join(format!(
            "llmgw-web-pages-{}-{}",
            std::process::id(),
            SITES.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let address = dir.join("log.db").display().to_string();
        Site::on(&address, dir, signup_open, endpoints).await
    }

    /// A server whose log and people tables are the PostgreSQL database
    /// at `url` (a test's own, perhaps through a relay it can cut).
    pub(super) async fn on_postgres(url: &str, signup_open: bool) -> Site {
        Site::on(url, std::path::PathBuf::new(), signup_open, Vec::new()).await
    }

    async fn on(
        address: &str,
        dir: std::path::PathBuf,
        signup_open: bool,
        endpoints: Vec<EndpointSpec>,
    ) -> Site {
        let address = StoreAddress::parse(address).expect("address");
        let store = AnyStore::open(&address, OpenOptions::migrating())
            .await
            .expect("store");
        let people = Arc::new(People::new(&store, PeopleConfig::default()));
        let asked: Asked = Arc::default();
        let web = Arc::new(Web {
            settings: WebSettings {
                accounts: true,
                signup_open,
                ..WebSettings::default()
            },
            views: Arc::new(RwLock::new(Projections::default())),
            store: Some(store.clone()),
            people: Some(people.clone()),
            gateway: gateway(endpoints),
            admin: admin_api(asked.clone()),
            decider: Some(Decider::new(store.clone(), "test".into())),
            instance: "test".into(),
        });
        Site {
            app: client_routes(web.clone()),
            web,
            people,
            store,
            asked,
            position: Mutex::new(0),
            dir,
        }
    }

    /// Serves this site as `llmgw server` does: the gateway's listeners
    /// with the pages beside its routes (request ids, the edge), on
    /// ports bound to 0; stops with the value.
    pub(super) async fn serve(&self) -> Served {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let listen = llmgw_gateway::Listen {
            client: "127.0.0.1:0".parse().expect("address"),
            client_tls: None,
            admin: "127.0.0.1:0".parse().expect("address"),
            admin_token: None,
            metrics: None,
            connections: llmgw_gateway::ConnectionLimits::default(),
        };
        let extra = llmgw_gateway::Extra {
            client: client_routes(self.web.clone()),
            admin: crate::admin_routes(self.web.clone()),
        };
        let stop = llmgw_gateway::Stop {
            signal: Box::pin(std::future::pending()),
            grace: std::time::Duration::ZERO,
        };
        let task = tokio::spawn(llmgw_gateway::serve_with(
            self.web.gateway.clone(),
            listen,
            extra,
            stop,
            move |bound| {
                let _ = tx.send(bound);
            },
        ));
        let (mut client, mut admin) = (None, None);
        while client.is_none() || admin.is_none() {
            match rx.recv().await.expect("the server binds its listeners") {
                llmgw_gateway::Listener::Client(a) => client = Some(a),
                llmgw_gateway::Listener::Admin(a) => admin = Some(a),
                llmgw_gateway::Listener::Metrics(_) => {}
            }
        }
        Served {
            client: client.expect("client listener"),
            admin: admin.expect("admin listener"),
            task,
        }
    }

    /// Applies what the log gained to the views, as the server's runner
    /// would.
    pub(super) async fn catch_up(&self) {
        let after = *self.position.lock().expect("lock");
        let events = self.store.read_all(after, 10_000).await.expect("read");
        let mut views = self.web.views.write().expect("views");
        for e in &events {
            views.apply(e);
        }
        if let Some(last) = events.last() {
            *self.position.lock().expect("lock") = last.position;
        }
    }

    /// Every event in the log: `(type, payload)`.
    pub(super) async fn events(&self) -> Vec<(String, Value)> {
        self.store
            .read_all(0, 10_000)
            .await
            .expect("read")
            .into_iter()
            .map(|e| (e.event_type, e.payload))
            .collect()
    }

    /// The same server whose log refuses every append.
    pub(super) fn without_log(&self) -> Site {
        let web = Arc::new(Web {
            settings: self.web.settings.clone(),
            views: self.web.views.clone(),
            store: None,
            people: Some(self.people.clone()),
            gateway: self.web.gateway.clone(),
            admin: self.web.admin.clone(),
            decider: None,
            instance: "test".into(),
        });
        Site {
            app: client_routes(web.clone()),
            web,
            people: self.people.clone(),
            store: self.store.clone(),
            asked: self.asked.clone(),
            position: Mutex::new(0),
            // The directory stays with the original.
            dir: std::path::PathBuf::new(),
        }
    }

    /// An administrator's approval, as the log would hold it.
    pub(super) async fn approve(&self, user_id: &str, project: &str) {
        let event = Event::Tenancy(TenancyEvent::UserApproved {
            user_id: user_id.into(),
            project_id: project.into(),
            by: "admin".into(),
        });
        self.web
            .decider
            .as_ref()
            .expect("decider")
            .observe(&Origin::new(Actor::Operator("admin".into())), vec![event])
            .await
            .expect("append");
        self.catch_up().await;
    }
}

/// A site served on real listeners (see [`Site::serve`]).
pub(super) struct Served {
    pub client: std::net::SocketAddr,
    pub admin: std::net::SocketAddr,
    task: tokio::task::JoinHandle<Result<(), llmgw_gateway::ServeError>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An answer read off the wire.
#[derive(Debug)]
pub(super) struct Wire {
    pub status: u16,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Wire {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter())
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request over a fresh connection to `addr`: `head` is the
/// request line and any headers (each ending in CRLF), `body` a form.
pub(super) async fn wire(addr: std::net::SocketAddr, head: &str, body: &str) -> Wire {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "{head}host: localhost\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = raw.split_once("\r\n\r\n").expect("an answer's head");
    let mut lines = head.split("\r\n");
    let status = (lines.next().and_then(|l| l.split(' ').nth(1)))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = (headers.iter()).any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        unchunk(rest)
    } else {
        rest.to_owned()
    };
    Wire {
        status,
        headers,
        body,
    }
}

fn unchunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || after.len() < size {
            break;
        }
        body.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    body
}

/// A browser: keeps the cookies it is given, sends them back.
#[derive(Debug, Default)]
pub(super) struct Browser {
    pub cookies: BTreeMap<String, String>,
}

#[derive(Debug)]
pub(super) struct Page {
    pub status: StatusCode,
    pub body: String,
    pub headers: HeaderMap,
}

impl Page {
    pub(super) fn location(&self) -> Option<&str> {
        self.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
    }

    /// The value of the form field `name` (the first one on the page).
    pub(super) fn field(&self, name: &str) -> String {
        let marker = format!("name=\"{name}\" value=\"");
        let start = self.body.find(&marker).expect("field") + marker.len();
        let end = self.body[start..].find('"').expect("end of value");
        self.body[start..start + end].to_owned()
    }
}

impl Browser {
    pub(super) async fn get(&mut self, site: &Site, uri: &str) -> Page {
        let request = self.request(Request::get(uri)).body(Body::empty());
        self.send(site, request.expect("request")).await
    }

    pub(super) async fn post(&mut self, site: &Site, uri: &str, form: &[(&str, &str)]) -> Page {
        let body = form
            .iter()
            .map(|(k, v)| format!("{}={}", crate::pages::encode(k), crate::pages::encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        let request = self
            .request(Request::post(uri))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(body));
        self.send(site, request.expect("request")).await
    }

    pub(super) async fn post_json(
        &mut self,
        site: &Site,
        uri: &str,
        csrf: Option<&str>,
        body: &Value,
    ) -> Page {
        let mut request = self
            .request(Request::post(uri))
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(t) = csrf {
            request = request.header("x-csrf-token", t);
        }
        let request = request.body(Body::from(body.to_string()));
        self.send(site, request.expect("request")).await
    }

    /// The `Cookie` header's value this browser sends.
    pub(super) fn cookie_header(&self) -> String {
        self.cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn request(&self, builder: axum::http::request::Builder) -> axum::http::request::Builder {
        let builder = builder.header(header::HOST, "gw.example");
        if self.cookies.is_empty() {
            return builder;
        }
        builder.header(header::COOKIE, self.cookie_header())
    }

    async fn send(&mut self, site: &Site, request: Request<Body>) -> Page {
        let (status, body, headers) = send(&site.app, request).await;
        for set in headers.get_all(header::SET_COOKIE) {
            let set = set.to_str().expect("ascii");
            let (pair, attributes) = set.split_once(';').unwrap_or((set, ""));
            let (name, value) = pair.split_once('=').expect("name=value");
            // Lax: a link from an email to a page opens signed in; posts
            // prove themselves with the CSRF token.
            assert!(attributes.contains("HttpOnly") && attributes.contains("SameSite=Lax"));
            if attributes.contains("Max-Age=0") {
                self.cookies.remove(name);
            } else {
                self.cookies.insert(name.to_owned(), value.to_owned());
            }
        }
        Page {
            status,
            body,
            headers,
        }
    }
}
