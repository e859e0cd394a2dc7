//! Where a server without a control plane (router-only), and the CLI with
//! no server at `--admin`, send the operator writes that a control plane's
//! lease keeps them from deciding: to the admin address the leader
//! recorded on taking office, as a standby does (`forward.rs`). So any
//! server will do for an operator, whatever its mode.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use llmgw_api::admin as api;
use llmgw_domain::Event;
use llmgw_domain::event::LeadershipEvent;
use llmgw_eventstore::{AnyStore, EventFilter, EventStore, StoreError};

use crate::admin::AdminError;
use crate::forward::{buffered, client, forward, token_refused};

/// The store whose lease tells who leads, and how this process names
/// itself in the forward's mark.
#[derive(Debug, Clone)]
pub struct ToLeader {
    store: AnyStore,
    instance: String,
    /// The leader's admin token (admin_token), sent with what is forwarded.
    token: Option<String>,
    /// The token sent is the operator's own (the CLI's), not this
    /// server's admin_token: a leader refusing it refused the operator.
    operators_token: bool,
    http: reqwest::Client,
    /// A control plane has led this store (see [`ToLeader::ever_led`]).
    led: Arc<std::sync::atomic::AtomicBool>,
}

impl ToLeader {
    /// For a server, sending its own admin_token with what it forwards.
    pub fn new(store: AnyStore, instance: String, token: Option<String>) -> Arc<ToLeader> {
        Arc::new(ToLeader {
            store,
            instance,
            token,
            operators_token: false,
            http: client(),
            led: Default::default(),
        })
    }

    /// For the CLI, named `cli` in a forward's mark, sending the
    /// operator's own token.
    pub fn for_cli(store: AnyStore, token: Option<String>) -> Arc<ToLeader> {
        Arc::new(ToLeader {
            store,
            instance: "cli".to_owned(),
            token,
            operators_token: true,
            http: client(),
            led: Default::default(),
        })
    }

    /// The holder of the lease and the admin address it recorded on taking
    /// office, while a server holds it. The newest `LeadershipAcquired` is
    /// read through the stream's index, however long the log.
    async fn leader(&self) -> Result<Option<Leader>, StoreError> {
        let info = self.store.lease_info().await?;
        let Some(holder) = info.holder.filter(|_| info.held) else {
            return Ok(None);
        };
        let filter = acquired();
        let newest = self
            .store
            .read_backward_raw(&filter, 0..info.head + 1, 1)
            .await?;
        let admin = newest.iter().find_map(|r| {
            match Event::decode(&r.event_type, r.schema_version, &r.payload) {
                Ok(Event::Leadership(LeadershipEvent::LeadershipAcquired {
                    epoch,
                    admin: Some(a),
                    ..
                })) if epoch == info.epoch => Some(a),
                _ => None,
            }
        });
        Ok(admin.map(|url| Leader {
            holder,
            url,
            expires_at: info.expires_at,
        }))
    }

    /// Whether a control plane has ever led this store: then a moment
    /// with none (an election, a takeover) is not router-only mode. Once
    /// true, it stays true (the log only grows).
    async fn ever_led(&self) -> bool {
        if self.led.load(std::sync::atomic::Ordering::Relaxed) {
            return true;
        }
        let filter = acquired();
        let led = match self.store.head().await {
            Ok((head, _)) => self
                .store
                .read_backward_raw(&filter, 0..head + 1, 1)
                .await
                .is_ok_and(|found| !found.is_empty()),
            Err(_) => false,
        };
        self.led.store(led, std::sync::atomic::Ordering::Relaxed);
        led
    }
}

/// Who holds the lease, the admin address it recorded on taking office,
/// and when its lease runs out unless renewed.
struct Leader {
    holder: String,
    url: String,
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// What to do about a leader that does not answer: most often it has
/// stopped without giving up its lease (killed, its machine lost), and the
/// lease frees itself; else its recorded address is one others cannot
/// reach. Both are said, the wait first: after a crash the address advice
/// alone sent operators to edit a configuration that was right.
fn silent_leader(holder: &str, expires_at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    let wait = match expires_at {
        Some(at) => {
            let left = (at - chrono::Utc::now()).num_seconds().max(1);
            format!(
                "if {holder} has stopped or crashed, its lease runs out in {left} s ({}) and another server takes office: send the command again then",
                at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )
        }
        None => format!(
            "if {holder} has stopped or crashed, send the command again once another server takes office"
        ),
    };
    format!(
        "{wait}; if it is up, it records that address on taking office (control.advertise_admin): set it where others reach it, or send the command to an address where the leader answers"
    )
}

/// The leaders' taking office, read newest first through the stream's
/// index.
fn acquired() -> EventFilter {
    EventFilter {
        event_type: Some("LeadershipAcquired".to_owned()),
        streams: vec!["leadership".to_owned()],
        ..EventFilter::default()
    }
}

impl ToLeader {
    /// The routes of a door without a control plane, made to reach the
    /// leader while one leads their store: the writes their lease refuses
    /// ([`forward_refused_writes`]) and the control plane's own routes,
    /// which they lack ([`forward_control_routes`]). The one place a
    /// router-only server and the CLI both get this from.
    pub fn around(self: Arc<Self>, routes: Router) -> Router {
        routes
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                forward_refused_writes,
            ))
            .route(
                "/api/v1/{*rest}",
                axum::routing::any(forward_control_routes).with_state(self),
            )
    }

    /// The leader's answer to the request, marked with where it came from;
    /// None while no server that recorded an admin address leads.
    async fn send(&self, parts: &Parts, body: Bytes) -> Option<Response> {
        let Leader {
            holder,
            url,
            expires_at,
        } = match self.leader().await {
            Ok(Some(leader)) => leader,
            Ok(None) => return None,
            Err(e) => return Some(AdminError::from(crate::ControlError::from(e)).into_response()),
        };
        Some(
            match forward(
                &self.http,
                (&self.instance, self.token.as_deref()),
                &url,
                parts,
                body,
            )
            .await
            {
                // What answers at the recorded address does not lead: most
                // often this very server, or another one's loopback, because
                // the leader recorded a loopback address.
                Ok(answer) if answer.status() == StatusCode::LOCKED => {
                    let bytes = axum::body::to_bytes(answer.into_body(), 64 * 1024)
                        .await
                        .unwrap_or_default();
                    let said = serde_json::from_slice::<api::ErrorBody>(&bytes)
                        .map(|e| e.error)
                        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
                    AdminError(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "the leader {holder} recorded its admin address as {url}, but what answers there does not lead ({said}); set control.advertise_admin on the servers to an address the others reach"
                    ),
                )
                .into_response()
                }
                Ok(answer) => {
                    // The CLI sends the operator's own token, which the
                    // leader's refusal rightly blames; a server sends its own
                    // admin_token, in place of the operator's.
                    let mut answer = if self.operators_token {
                        answer
                    } else {
                        token_refused(answer, &self.instance, &holder, &url)
                    };
                    if let Ok(v) = HeaderValue::from_str(&format!("{holder} {url}")) {
                        answer.headers_mut().insert(api::FORWARDED_TO_HEADER, v);
                    }
                    answer
                }
                Err(why) => AdminError(
                    StatusCode::BAD_GATEWAY,
                    why.say(&holder, &url, &silent_leader(&holder, expires_at)),
                )
                .into_response(),
            },
        )
    }
}

/// The control plane's own routes (`/api/v1/nodes`, `/models`, `/status`,
/// …), which a server without one does not serve: while a control plane
/// leads its store, they are sent to the leader, reads and writes alike,
/// so that `llmgw ctl` works through any server; with none leading, 503
/// when one has led (an election), else 404 with an empty body, which
/// `llmgw ctl` reads as "router-only mode".
async fn forward_control_routes(State(to): State<Arc<ToLeader>>, request: Request) -> Response {
    if request.headers().contains_key(api::FORWARDED_HEADER) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let (parts, body) = match buffered(request).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    match to.send(&parts, body).await {
        Some(answer) => answer,
        None if to.ever_led().await => AdminError(
            StatusCode::SERVICE_UNAVAILABLE,
            "no control plane leads this store now: if one is starting or taking over, try again in a few seconds; if none runs any more, this server is router-only and has no control plane routes".into(),
        )
        .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// A write the door refused because a control plane leads (423) goes to
/// that leader, once, and the leader's answer is handed back with
/// [`api::FORWARDED_TO_HEADER`] naming where it went. A write the door
/// decided, or refused for any other reason, is answered as it is. The
/// refusal comes from taking the lease, before anything is decided or
/// changed here, so a forwarded command is decided once.
async fn forward_refused_writes(
    State(to): State<Arc<ToLeader>>,
    request: Request,
    next: Next,
) -> Response {
    let read = matches!(*request.method(), Method::GET | Method::HEAD);
    if read || request.headers().contains_key(api::FORWARDED_HEADER) {
        return next.run(request).await;
    }
    let (parts, body) = match buffered(request).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    let here = next
        .run(Request::from_parts(parts.clone(), Body::from(body.clone())))
        .await;
    if here.status() != StatusCode::LOCKED {
        return here;
    }
    // None: a CLI's moment under the lease, or a leader that recorded no
    // address; the refusal stands.
    to.send(&parts, body).await.unwrap_or(here)
}
