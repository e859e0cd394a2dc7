//! Keys, limits, budgets and prices on the request path: a real store, the
//! views following it, a real gateway over loopback sockets.

use std::time::Duration;

use llmgw_domain::Command;
use llmgw_domain::catalog::{Model, Price};
use llmgw_domain::tenancy::{Band, Key, Limits, Period, Scope, TenancyCommand as T};
use llmgw_eventstore::{AnyStore, EventStore, Writer};
use llmgw_gateway::auth::{KeyDirectory, key_hash};
use llmgw_gateway::{Gateway, GatewayConfig};
use serde_json::{Value, json};

use crate::support::{self, sim, spec};

/// A store with an org `o`, team `t` and project `p`, and the views
/// following it.
pub(crate) struct Tenants {
    store: AnyStore,
    writer: Writer,
    decider: llmgw_decider::Decider,
    origin: llmgw_decider::Origin,
    views: std::sync::Arc<std::sync::RwLock<llmgw_projections::Projections>>,
    position: tokio::sync::watch::Receiver<u64>,
    follower: tokio::task::JoinHandle<()>,
    _scratch: llmgw_testkit::Scratch,
}

impl Drop for Tenants {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

impl Tenants {
    pub(crate) async fn new() -> Self {
        let (store, scratch) = support::sqlite_log().await;
        let lease = store
            .acquire_lease("ctl", Duration::from_secs(60))
            .await
            .unwrap();
        let mut runner = llmgw_projections::Runner::start(store.clone(), "gateway")
            .await
            .unwrap();
        let views = runner.views();
        let position = runner.watch_position();
        let follower = tokio::spawn(async move {
            let _ = runner.follow().await;
        });
        let mut t = Tenants {
            decider: llmgw_decider::Decider::new(store.clone(), "test".into()),
            origin: llmgw_decider::Origin::new(llmgw_decider::Actor::Recorder("test".into())),
            store,
            writer: Writer::Leader(lease.token),
            views,
            position,
            follower,
            _scratch: scratch,
        };
        t.run(T::CreateOrg {
            org_id: "o".into(),
            name: "Acme".into(),
        })
        .await;
        t.run(T::CreateTeam {
            team_id: "t".into(),
            org_id: "o".into(),
            name: "ML".into(),
        })
        .await;
        t.project("p").await;
        t
    }

    /// An observed fact (usage), through the decider's observer path.
    async fn append(&self, events: Vec<llmgw_domain::Event>) {
        self.decider.observe(&self.origin, events).await.unwrap();
    }

    /// A command, decided and appended through the one door.
    async fn run(&mut self, c: T) {
        self.decider
            .execute(&self.writer, &self.origin, vec![Command::Tenancy(c)])
            .await
            .unwrap();
        self.caught_up().await;
    }

    async fn project(&mut self, id: &str) {
        self.run(T::CreateProject {
            project_id: id.into(),
            team_id: "t".into(),
            name: id.into(),
        })
        .await;
    }

    /// Issues key `id` in `project`; returns its secret.
    pub(crate) async fn key(&mut self, id: &str, project: &str) -> String {
        self.key_until(id, project, None).await
    }

    /// Issues key `id` in `project` that ends at `expires_at`.
    async fn key_until(
        &mut self,
        id: &str,
        project: &str,
        expires_at: Option<llmgw_domain::time::UnixMillis>,
    ) -> String {
        let secret = format!("llmgw-sk-{id}-0123456789");
        self.run(T::IssueKey(Key {
            key_id: id.into(),
            project_id: project.into(),
            name: id.into(),
            hash: key_hash(&secret),
            prefix: secret[..10].into(),
            band: Band::Bronze,
            routing_profile: None,
            revoked: false,
            owner: None,
            claim_by: None,
            expires_at,
            previous: None,
        }))
        .await;
        secret
    }

    pub(crate) async fn limit(&mut self, scope: Scope, id: &str, limits: Limits) {
        self.run(T::SetLimits {
            scope,
            scope_id: id.into(),
            limits,
        })
        .await;
    }

    /// Another gateway's request, as the log records it.
    async fn spent_elsewhere(&self, key: &str, project: &str, micros: u64) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        self.append(vec![llmgw_domain::Event::Usage(
            llmgw_domain::usage::UsageEvent::UsageRecorded(llmgw_domain::usage::UsageRecorded {
                request_id: format!("elsewhere-{key}-{micros}"),
                key_id: key.into(),
                project_id: project.into(),
                model_asked: "m".into(),
                model_served: "m".into(),
                prompt_tokens: 100,
                completion_tokens: 100,
                cost_micros: micros,
                status: 200,
                latency_ms: 10,
                ttft_ms: None,
                band: Band::Bronze,
                at: llmgw_domain::UnixMillis(now),
            }),
        )])
        .await;
        self.caught_up().await;
    }

    async fn caught_up(&self) {
        let head = self.store.head().await.unwrap().0;
        let mut p = self.position.clone();
        tokio::time::timeout(Duration::from_secs(20), p.wait_for(|p| *p >= head))
            .await
            .unwrap()
            .unwrap();
    }

    pub(crate) fn directory(&self) -> KeyDirectory {
        KeyDirectory::new(self.views.clone())
    }

    /// A gateway with keys on, serving model `m` from `engine`, with no
    /// usage queue.
    async fn serve_keyed(&self, engine: &std::net::SocketAddr) -> support::Running {
        let gw = Gateway::with_keys(
            GatewayConfig {
                endpoints: vec![spec("a", engine, &["m"])],
                ..GatewayConfig::default()
            },
            None,
            Some(self.directory()),
        )
        .unwrap();
        support::serve(gw).await
    }
}

fn chat(model: &str, max_tokens: u32) -> Value {
    json!({"model": model, "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": "tell me a story"}]})
}

async fn call(base: &str, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .header("x-llmgw-band", "platinum")
        .json(body);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    r.send().await.unwrap()
}

async fn get(url: String, key: Option<&str>) -> reqwest::Response {
    let mut r = reqwest::Client::new().get(url);
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    r.send().await.unwrap()
}

fn retry_after(r: &reqwest::Response) -> u64 {
    r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn with_keys_on_the_key_decides_who_gets_in_which_band_and_which_models() {
    let mut t = Tenants::new().await;
    t.limit(
        Scope::Project,
        "p",
        Limits {
            models: Some(vec!["m".into()]),
            ..Limits::default()
        },
    )
    .await;
    let secret = t.key("k1", "p").await;
    let (queue, mut usage) = llmgw_gateway::usage::UsageQueue::new(16);
    let engine = sim(llmgw_sim::SimConfig {
        models: vec!["m".into(), "other".into()],
        ..support::sim_config()
    })
    .await;
    let gw = Gateway::with_keys(
        GatewayConfig {
            endpoints: vec![spec("a", &engine, &["m", "other"])],
            // Every model is priced: budgets apply.
            default_price: Price {
                prompt_per_1k: 1_000,
                completion_per_1k: 1_000,
            },
            ..GatewayConfig::default()
        },
        Some(queue),
        Some(t.directory()),
    )
    .unwrap();
    let gw = support::serve(gw).await;
    let base = gw.base.as_str();
    // No key, a wrong key: the same refusal, naming nothing.
    let mut refusals = Vec::new();
    for key in [None, Some("llmgw-sk-wrong")] {
        let r = call(base, key, &chat("m", 1)).await;
        assert_eq!(r.status(), 401);
        refusals.push(r.text().await.unwrap());
    }
    assert_eq!(refusals[0], refusals[1]);
    assert!(refusals[0].contains("invalid_api_key"));
    // The right key: served, accounted to its key and project, in the key's
    // band whatever the header says.
    assert_eq!(call(base, Some(&secret), &chat("m", 1)).await.status(), 200);
    let record = usage.recv().await.unwrap();
    assert_eq!(
        (&*record.key_id, &*record.project_id, record.band),
        ("k1", "p", Band::Bronze)
    );
    // Outside its allowlist a model does not exist for the key; asked by
    // an alias, the refusal names the alias, not the model behind it.
    assert_eq!(
        call(base, Some(&secret), &chat("other", 1)).await.status(),
        404
    );
    {
        use llmgw_projections::View;
        let mut view = llmgw_projections::RouterView::default();
        let mut other = llmgw_domain::catalog::Model::named("other");
        other.aliases = vec!["nickname".into()];
        view.apply_event(
            llmgw_projections::Stamp {
                position: 0,
                recorded_at_ms: 0,
            },
            &llmgw_domain::Event::Catalog(llmgw_domain::catalog::CatalogEvent::ModelAdded {
                model: other,
            }),
        );
        gw.gateway.apply_router_view(&view);
    }
    let r = call(base, Some(&secret), &chat("nickname", 1)).await;
    assert_eq!(r.status(), 404);
    let said = r.text().await.unwrap();
    assert!(
        said.contains("nickname") && !said.contains("`other`"),
        "{said}"
    );
    let listed: Value = get(format!("{base}/v1/models"), Some(&secret))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(support::model_ids(&listed), vec!["m"]);
    assert_eq!(get(format!("{base}/v1/models"), None).await.status(), 401);

    // Requests per minute: counted from when the limit applies.
    t.limit(
        Scope::Key,
        "k1",
        Limits {
            rpm: Some(2),
            ..Limits::default()
        },
    )
    .await;
    // Each answer says what is left, as OpenAI's headers do.
    for left in ["1", "0"] {
        let r = call(base, Some(&secret), &chat("m", 1)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-ratelimit-limit-requests"], "2");
        assert_eq!(r.headers()["x-ratelimit-remaining-requests"], left);
        let reset = r.headers()["x-ratelimit-reset-requests"].to_str().unwrap();
        assert!(reset.ends_with('s'), "{reset}");
        assert!(r.headers().get("x-ratelimit-limit-tokens").is_none());
        usage.recv().await.unwrap();
    }
    let r = call(base, Some(&secret), &chat("m", 1)).await;
    assert_eq!(r.status(), 429);
    assert!((1..=60).contains(&retry_after(&r)));
    // Both say when the request passes, the same whole second (rounded
    // up: one rounded down sent a client back a moment early).
    let reset = r.headers()["x-ratelimit-reset-requests"].to_str().unwrap();
    let (m, s) = match reset.split_once('m') {
        Some((m, s)) => (m.parse::<u64>().unwrap(), s),
        None => (0, reset),
    };
    let reset_s = m * 60 + s.trim_end_matches('s').parse::<u64>().unwrap();
    assert_eq!(retry_after(&r), reset_s, "{reset}");
    assert_eq!(r.headers()["x-ratelimit-remaining-requests"], "0");
    let body = r.text().await.unwrap();
    assert!(
        body.contains("rate_limit_exceeded") && body.contains("key k1 may make 2 requests"),
        "{body}"
    );

    // Tokens per minute: a key that used its minute's tokens waits.
    let token_key = t.key("k3", "p").await;
    t.limit(
        Scope::Key,
        "k3",
        Limits {
            tpm: Some(5),
            ..Limits::default()
        },
    )
    .await;
    let mut served = 0;
    let refused = loop {
        let r = call(base, Some(&token_key), &chat("m", 1)).await;
        if r.status() == 429 {
            break r.text().await.unwrap();
        }
        assert_eq!(r.status(), 200);
        usage.recv().await.unwrap();
        served += 1;
        assert!(served <= 5, "every request uses at least one token");
    };
    assert!(
        served >= 1 && refused.contains("5 tokens a minute"),
        "{refused}"
    );

    // A budget: spent (by any gateway, as the log says) means refused when
    // the model has no fallback.
    let budget_key = t.key("k2", "p").await;
    t.limit(
        Scope::Key,
        "k2",
        Limits {
            budget_micros: Some(1_000),
            period: Some(Period::Day),
            ..Limits::default()
        },
    )
    .await;
    assert_eq!(
        call(base, Some(&budget_key), &chat("m", 1)).await.status(),
        200
    );
    usage.recv().await.unwrap();
    t.spent_elsewhere("k2", "p", 1_000).await;
    let r = call(base, Some(&budget_key), &chat("m", 1)).await;
    assert_eq!(r.status(), 429);
    // A spent budget does not come back in seconds: OpenAI's SDKs retry
    // every 429 unless told not to.
    assert_eq!(r.headers()["x-should-retry"], "false");
    assert!(r.headers().get("retry-after").is_none());
    let body = r.text().await.unwrap();
    assert!(
        body.contains("insufficient_quota") && body.contains("day budget of key k2 is spent"),
        "{body}"
    );

    // Revoked: refused as soon as the view has the revocation.
    t.run(T::RevokeKey {
        key_id: "k1".into(),
        by: "ops".into(),
    })
    .await;
    assert_eq!(call(base, Some(&secret), &chat("m", 1)).await.status(), 401);
}

#[tokio::test]
async fn a_keys_entry_outlives_usage_in_the_log_but_not_a_change_of_its_limits() {
    let mut t = Tenants::new().await;
    let secret = t.key("k1", "p").await;
    let keys = t.directory();
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(
        axum::http::header::AUTHORIZATION,
        format!("Bearer {secret}").parse().unwrap(),
    );
    let first = keys.authenticate(&headers).unwrap();
    assert_eq!(first.limits.rpm, None);
    // The scheme's case does not matter (RFC 9110); some clients send it
    // in lower case.
    let mut lower = axum::http::HeaderMap::new();
    lower.insert(
        axum::http::header::AUTHORIZATION,
        format!("bearer {secret}").parse().unwrap(),
    );
    assert!(keys.authenticate(&lower).is_ok());

    // Usage moves the views but says nothing of keys: the entry composed
    // before is the one given, not made again.
    t.spent_elsewhere("k1", "p", 1_000).await;
    let again = keys.authenticate(&headers).unwrap();
    assert!(
        std::sync::Arc::ptr_eq(&first, &again),
        "a usage batch emptied the key cache"
    );

    // A limit set on the key's team counts from the next request.
    t.limit(
        Scope::Team,
        "t",
        Limits {
            rpm: Some(7),
            ..Limits::default()
        },
    )
    .await;
    let limited = keys.authenticate(&headers).unwrap();
    assert_eq!(limited.limits.rpm, Some(7));

    // And so does a revocation, with usage in between.
    t.spent_elsewhere("k1", "p", 2_000).await;
    assert!(std::sync::Arc::ptr_eq(
        &limited,
        &keys.authenticate(&headers).unwrap()
    ));
    t.run(T::RevokeKey {
        key_id: "k1".into(),
        by: "ops".into(),
    })
    .await;
    assert!(keys.authenticate(&headers).is_err());
}

/// The status `/v1/models` answers `secret` with: whether the key opens
/// the gateway.
async fn models_status(base: &str, secret: String) -> axum::http::StatusCode {
    get(format!("{base}/v1/models"), Some(&secret))
        .await
        .status()
}

#[tokio::test]
async fn a_key_handed_out_by_a_claim_link_stops_when_the_link_ends_unused() {
    let mut t = Tenants::new().await;
    let now = llmgw_domain::time::UnixMillis::now();
    let offer = |key: &str, until| T::OfferClaim {
        key_id: key.into(),
        by: "ops".into(),
        until: Some(until),
    };
    let lapsed = t.key("lapsed", "p").await;
    t.run(offer("lapsed", llmgw_domain::time::UnixMillis(now.0 - 1)))
        .await;
    let open = t.key("open", "p").await;
    t.run(offer(
        "open",
        llmgw_domain::time::UnixMillis(now.0 + 3_600_000),
    ))
    .await;
    let engine = sim(support::sim_config()).await;
    let gw = t.serve_keyed(&engine).await;
    let models = |secret: String| models_status(&gw.base, secret);
    // Nobody opened its link in time: whoever finds the secret later
    // gets the answer an unknown key gets.
    assert_eq!(models(lapsed.clone()).await, 401);
    assert_eq!(models(open.clone()).await, 200);
    // A link used in its last moment is recorded just after it ended:
    // the claim gives the key back to its holder.
    t.run(T::Claim {
        key_id: "lapsed".into(),
    })
    .await;
    assert_eq!(models(lapsed).await, 200);
}

#[tokio::test]
async fn a_key_stops_at_its_end_and_a_rotated_one_s_old_secret_at_its_grace() {
    use llmgw_domain::time::UnixMillis;
    let mut t = Tenants::new().await;
    let now = UnixMillis::now();
    let ended = t.key_until("ended", "p", Some(UnixMillis(now.0 - 1))).await;
    let ending = t
        .key_until("ending", "p", Some(UnixMillis(now.0 + 3_600_000)))
        .await;
    let rotate = |secret: &str, until: Option<i64>| T::RotateKey {
        key_id: "ending".into(),
        replaces: None,
        hash: key_hash(secret),
        prefix: secret[..10].into(),
        previous_until: until.map(UnixMillis),
        by: "ops".into(),
    };
    let engine = sim(support::sim_config()).await;
    let gw = t.serve_keyed(&engine).await;
    let models = |secret: String| models_status(&gw.base, secret);
    assert_eq!(models(ended).await, 401, "its end came");
    assert_eq!(models(ending.clone()).await, 200);
    // /me says when the secret presented stops, to renew it in time.
    let me: serde_json::Value = get(format!("{}/me", gw.base), Some(&ending))
        .await
        .json()
        .await
        .unwrap();
    assert!(
        me["expires_at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{me}"
    );

    // In its grace the old secret works beside the new one; after it, or
    // after a rotation with none, only the newest does.
    let second = "llmgw-sk-second-0123456789".to_owned();
    t.run(rotate(&second, Some(now.0 + 3_600_000))).await;
    assert_eq!(models(ending.clone()).await, 200);
    assert_eq!(models(second.clone()).await, 200);
    let third = "llmgw-sk-third-0123456789".to_owned();
    t.run(rotate(&third, Some(now.0 - 1))).await;
    assert_eq!(models(second).await, 401, "its grace ended");
    assert_eq!(
        models(ending).await,
        401,
        "a second rotation ends the first's"
    );
    assert_eq!(models(third).await, 200);
}

#[tokio::test]
async fn a_team_limit_counts_every_key_of_the_team_and_says_so() {
    let mut t = Tenants::new().await;
    t.project("q").await;
    let a = t.key("ka", "p").await;
    let b = t.key("kb", "q").await;
    t.limit(
        Scope::Team,
        "t",
        Limits {
            rpm: Some(3),
            ..Limits::default()
        },
    )
    .await;
    t.limit(
        Scope::Key,
        "ka",
        Limits {
            rpm: Some(100),
            ..Limits::default()
        },
    )
    .await;
    let engine = sim(support::sim_config()).await;
    let gw = t.serve_keyed(&engine).await;
    // Two keys in two projects of the team share its three requests.
    for key in [&a, &b, &a] {
        assert_eq!(call(&gw.base, Some(key), &chat("m", 1)).await.status(), 200);
    }
    let r = call(&gw.base, Some(&b), &chat("m", 1)).await;
    assert_eq!(r.status(), 429);
    assert!((1..=60).contains(&retry_after(&r)));
    let body: Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("team t may make 3 requests a minute (all its keys together"),
        "{message}"
    );
}

#[tokio::test]
async fn tokens_are_charged_before_sending_so_a_burst_cannot_overshoot_tpm() {
    let mut t = Tenants::new().await;
    let key = t.key("k", "p").await;
    t.limit(
        Scope::Project,
        "p",
        Limits {
            tpm: Some(200),
            ..Limits::default()
        },
    )
    .await;
    // Slow enough that the first answer is still streaming when the second
    // request comes.
    let engine = sim(llmgw_sim::SimConfig {
        tokens_per_s: 20,
        ..support::sim_config()
    })
    .await;
    let gw = t.serve_keyed(&engine).await;
    let mut streamed = chat("m", 100);
    streamed["stream"] = json!(true);
    let first = call(&gw.base, Some(&key), &streamed).await;
    assert_eq!(first.status(), 200);
    // Nothing is counted from the engine yet, but 100 + the prompt (45 with
    // its framing) are charged: another 100 would overshoot the project's
    // 200.
    let r = call(&gw.base, Some(&key), &chat("m", 100)).await;
    assert_eq!(r.status(), 429);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("project p may use 200 tokens a minute"),
        "{body}"
    );
    // A small one still fits.
    assert_eq!(
        call(&gw.base, Some(&key), &chat("m", 5)).await.status(),
        200
    );
    drop(first);
}

/// The estimate counts what a chat template adds to a message, not only
/// its text: a burst of "hi"s, a byte or two each, passed as a token each
/// while the engine counted several, and spent tpm several times over.
#[tokio::test]
async fn a_burst_of_short_messages_cannot_overshoot_tpm() {
    let mut t = Tenants::new().await;
    let key = t.key("k", "p").await;
    t.limit(
        Scope::Key,
        "k",
        Limits {
            tpm: Some(100),
            ..Limits::default()
        },
    )
    .await;
    // Every request is still running when the last is admitted.
    let engine = sim(llmgw_sim::SimConfig {
        ttft: Duration::from_millis(300),
        ..support::sim_config()
    })
    .await;
    let gw = t.serve_keyed(&engine).await;
    let hi = json!({"model": "m", "max_tokens": 1,
                    "messages": [{"role": "user", "content": "hi"}]});
    let answers =
        futures_util::future::join_all((0..40).map(|_| call(&gw.base, Some(&key), &hi))).await;
    let mut used = 0;
    let mut served = 0;
    for r in answers {
        if r.status() == 200 {
            let body: Value = r.json().await.unwrap();
            used += body["usage"]["total_tokens"].as_u64().unwrap();
            served += 1;
        } else {
            assert_eq!(r.status(), 429);
        }
    }
    assert!(served >= 1, "one request fits the minute");
    assert!(used <= 100, "{served} requests used {used} tokens of 100");
}

/// `big` is priced; its fallbacks are `tiny` (free, not every key's) and
/// `free` (free).
async fn priced_catalog(
    t: &Tenants,
    usage: Option<std::sync::Arc<llmgw_gateway::usage::UsageQueue>>,
) -> support::Running {
    let engine = sim(llmgw_sim::SimConfig {
        models: vec!["big".into(), "tiny".into(), "free".into()],
        ..support::sim_config()
    })
    .await;
    let mut big = Model::named("big");
    big.fallbacks = vec!["tiny".into(), "free".into()];
    big.price = Some(Price {
        prompt_per_1k: 1_000,
        completion_per_1k: 2_000,
    });
    big.description = "the big one".into();
    let mut tiny = Model::named("tiny");
    tiny.price = Some(Price::ZERO);
    let mut free = Model::named("free");
    free.price = Some(Price::ZERO);
    // Catalogued, never started: no capacity, so its fallbacks serve.
    let mut gone = Model::named("gone");
    gone.fallbacks = vec!["tiny".into(), "free".into()];
    gone.price = Some(Price::ZERO);
    let mut later = Model::named("later");
    later.description = "started when asked".into();
    for m in [&mut big, &mut tiny, &mut free, &mut gone] {
        m.scaling.min = 1;
    }
    let view = support::router_view(
        vec![big, tiny, free, gone, later],
        &[("big", engine), ("tiny", engine), ("free", engine)],
    );
    let gw = Gateway::with_keys(
        GatewayConfig {
            default_price: Price {
                prompt_per_1k: 5,
                completion_per_1k: 5,
            },
            ..GatewayConfig::default()
        },
        usage,
        Some(t.directory()),
    )
    .unwrap();
    gw.apply_router_view(&view);
    support::serve(gw).await
}

#[tokio::test]
async fn a_spent_budget_falls_back_to_a_free_model_the_key_may_use() {
    let mut t = Tenants::new().await;
    t.project("q").await;
    let key = t.key("k", "p").await;
    let narrow = t.key("kn", "q").await;
    t.limit(
        Scope::Project,
        "p",
        Limits {
            models: Some(vec!["big".into(), "free".into(), "gone".into()]),
            budget_micros: Some(1_000),
            period: Some(Period::Month),
            ..Limits::default()
        },
    )
    .await;
    t.limit(
        Scope::Project,
        "q",
        Limits {
            models: Some(vec!["big".into()]),
            budget_micros: Some(1_000),
            period: Some(Period::Day),
            ..Limits::default()
        },
    )
    .await;
    let (queue, mut usage) = llmgw_gateway::usage::UsageQueue::new(16);
    let gw = priced_catalog(&t, Some(queue)).await;
    assert_eq!(gw.gateway.price_of("big").completion_per_1k, 2_000);
    assert_eq!(gw.gateway.price_of("free"), Price::ZERO);
    assert_eq!(gw.gateway.price_of("later").prompt_per_1k, 5, "the default");
    // Within budget: the model asked for serves.
    let r = call(&gw.base, Some(&key), &chat("big", 2)).await;
    assert_eq!(r.headers()["x-llmgw-served-model"], "big");
    let record = usage.recv().await.unwrap();
    assert_eq!(
        (&*record.model_asked, &*record.model_served),
        ("big", "big")
    );
    // No capacity: the fallbacks the key may use, and only those.
    let r = call(&gw.base, Some(&key), &chat("gone", 2)).await;
    assert_eq!(r.headers()["x-llmgw-served-model"], "free");
    usage.recv().await.unwrap();
    // Spent: the first free fallback the key may use (not `tiny`).
    t.spent_elsewhere("k", "p", 1_000).await;
    let r = call(&gw.base, Some(&key), &chat("big", 2)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-llmgw-served-model"], "free");
    let reply: Value = r.json().await.unwrap();
    assert_eq!(reply["model"], "free", "the engine was asked for it");
    let record = usage.recv().await.unwrap();
    assert_eq!(
        (&*record.model_asked, &*record.model_served),
        ("big", "free")
    );
    // A key that may use no free fallback: 429, naming the spent scope.
    t.spent_elsewhere("kn", "q", 1_000).await;
    let r = call(&gw.base, Some(&narrow), &chat("big", 2)).await;
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "insufficient_quota");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("day budget of project q is spent"),
        "{body}"
    );
    // A request that would overrun what is left is refused the same way.
    t.project("r").await;
    t.limit(
        Scope::Project,
        "r",
        Limits {
            models: Some(vec!["big".into()]),
            budget_micros: Some(1_000),
            period: Some(Period::Day),
            ..Limits::default()
        },
    )
    .await;
    let roomy = t.key("kr", "r").await;
    let r = call(&gw.base, Some(&roomy), &chat("big", 4_000)).await;
    assert_eq!(r.status(), 429);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("day budget of project r has 1000 micro-units left"),
        "{body}"
    );
    // So is one that sets no max_tokens: it may run to the context's end,
    // and is counted at 4,096 completion tokens (it passed as if it asked
    // for none).
    let unbounded = json!({"model": "big", "messages": [{"role": "user", "content": "hi"}]});
    let r = call(&gw.base, Some(&roomy), &unbounded).await;
    assert_eq!(r.status(), 429);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("max_tokens (max_output_tokens on /v1/responses)"),
        "{body}"
    );
    assert_eq!(
        call(&gw.base, Some(&roomy), &chat("big", 2)).await.status(),
        200
    );
    // A budget of 0 allows only free models: said so, not "spent, renews
    // tomorrow" (it never does).
    t.project("z").await;
    t.limit(
        Scope::Project,
        "z",
        Limits {
            models: Some(vec!["big".into()]),
            budget_micros: Some(0),
            period: Some(Period::Day),
            ..Limits::default()
        },
    )
    .await;
    let nothing = t.key("kz", "z").await;
    let r = call(&gw.base, Some(&nothing), &chat("big", 2)).await;
    assert_eq!(r.status(), 429);
    let body = r.text().await.unwrap();
    assert!(
        body.contains("project z has a budget of 0: it may use only models priced 0"),
        "{body}"
    );
}

/// A request is charged the price its model had when it was served: a
/// price changed before the flush that records it does not reach back
/// (the batcher priced every waiting request at the price of the flush).
#[tokio::test]
async fn a_request_is_charged_the_price_it_was_served_at() {
    let mut t = Tenants::new().await;
    let key = t.key("k", "p").await;
    let engine = sim(support::sim_config()).await;
    let priced = |prompt_per_1k: u64| {
        let mut m = Model::named("m");
        m.scaling.min = 1;
        m.price = Some(Price {
            prompt_per_1k,
            completion_per_1k: 0,
        });
        support::router_view(vec![m], &[("m", engine)])
    };
    let (queue, mut usage) = llmgw_gateway::usage::UsageQueue::new(16);
    let gw =
        Gateway::with_keys(GatewayConfig::default(), Some(queue), Some(t.directory())).unwrap();
    gw.apply_router_view(&priced(1_000));
    let gw = support::serve(gw).await;
    assert_eq!(
        call(&gw.base, Some(&key), &chat("m", 2)).await.status(),
        200
    );
    let first = usage.recv().await.unwrap();
    // The price goes up before the first request's flush.
    gw.gateway.apply_router_view(&priced(50_000));
    assert_eq!(
        call(&gw.base, Some(&key), &chat("m", 2)).await.status(),
        200
    );
    let second = usage.recv().await.unwrap();
    assert_eq!(
        (first.price.prompt_per_1k, second.price.prompt_per_1k),
        (1_000, 50_000)
    );
    // One flush of both records each at its own price.
    let (batch, _) = llmgw_domain::usage::record_batch("gw", [first.clone(), second.clone()]);
    let costs: Vec<u64> = batch
        .unwrap()
        .rows()
        .iter()
        .map(|u| u.cost_micros)
        .collect();
    let at = |per_1k: u64, tokens: u64| tokens * per_1k / 1000;
    assert_eq!(
        costs,
        [
            at(1_000, first.prompt_tokens),
            at(50_000, second.prompt_tokens)
        ]
    );
}

/// Requests still running count against a budget by their estimate: two
/// streams that together nearly spend it leave no room for a third sent
/// while they run (before, each was checked against finished spend only,
/// and any number at once passed). Once they end, what they cost counts.
#[tokio::test]
async fn requests_in_flight_count_against_a_budget_so_concurrency_cannot_overshoot_it() {
    let mut t = Tenants::new().await;
    let key = t.key("k", "p").await;
    t.limit(
        Scope::Project,
        "p",
        Limits {
            budget_micros: Some(350),
            period: Some(Period::Day),
            ..Limits::default()
        },
    )
    .await;
    // Ten tokens a second: fifty take five seconds, so the first two are
    // still streaming when the third is asked for.
    let engine = sim(llmgw_sim::SimConfig {
        models: vec!["big".into()],
        tokens_per_s: 10,
        ..support::sim_config()
    })
    .await;
    let mut big = Model::named("big");
    big.price = Some(Price {
        prompt_per_1k: 1_000,
        completion_per_1k: 2_000,
    });
    big.scaling.min = 1;
    let view = support::router_view(vec![big], &[("big", engine)]);
    let (queue, _usage) = llmgw_gateway::usage::UsageQueue::new(16);
    let gw =
        Gateway::with_keys(GatewayConfig::default(), Some(queue), Some(t.directory())).unwrap();
    gw.apply_router_view(&view);
    let gw = support::serve(gw).await;
    let mut stream = chat("big", 50);
    stream["stream"] = json!(true);
    // 145 micro-units each (50 completion tokens at 2, the prompt with its
    // template's framing, 45 tokens, at 1): two fit 350, a third would not.
    let first = call(&gw.base, Some(&key), &stream).await;
    let second = call(&gw.base, Some(&key), &stream).await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let third = call(&gw.base, Some(&key), &stream).await;
    assert_eq!(third.status(), 429, "two running hold most of the budget");
    let body: Value = third.json().await.unwrap();
    assert_eq!(body["error"]["code"], "insufficient_quota", "{body}");
    drop((first, second));
}

#[tokio::test]
async fn me_shows_the_keys_limits_spend_and_models() {
    let mut t = Tenants::new().await;
    let key = t.key("k", "p").await;
    t.limit(
        Scope::Team,
        "t",
        Limits {
            rpm: Some(50),
            ..Limits::default()
        },
    )
    .await;
    t.limit(
        Scope::Key,
        "k",
        Limits {
            tpm: Some(1_000),
            models: Some(vec!["big".into(), "later".into()]),
            budget_micros: Some(10_000),
            period: Some(Period::Day),
            ..Limits::default()
        },
    )
    .await;
    t.spent_elsewhere("k", "p", 1_234).await;
    let gw = priced_catalog(&t, None).await;
    assert_eq!(get(format!("{}/me", gw.base), None).await.status(), 401);
    let me: Value = get(format!("{}/me", gw.base), Some(&key))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            &me["key_id"],
            &me["project_id"],
            &me["team_id"],
            &me["band"]
        ),
        (&json!("k"), &json!("p"), &json!("t"), &json!("bronze"))
    );
    assert_eq!(
        me["limits"]["rates"],
        json!([
            {"scope": "team", "scope_id": "t", "rpm": 50},
            {"scope": "key", "scope_id": "k", "tpm": 1000},
        ])
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let spent = t
        .views
        .read()
        .unwrap()
        .usage
        .spend_of(Scope::Key, "k")
        .in_period(Period::Day, now);
    assert_eq!(spent, 1_234);
    assert_eq!(
        me["spend"],
        json!([{"scope": "key", "scope_id": "k", "period": "day",
                "budget_micros": 10_000, "spent_micros": spent, "left_micros": 10_000 - spent}])
    );
    assert_eq!(me["models"], json!(["big", "later"]));
    // Its own use, budget or none.
    assert_eq!(me["used"]["day_micros"], spent, "{me}");
    assert_eq!(me["used"]["month_micros"], spent, "{me}");

    // With authentication off there is no `me`.
    let open = support::gateway(vec![]).await;
    let r = get(format!("{}/me", open.base), None).await;
    assert_eq!(r.status(), 404);
    assert!(r.text().await.unwrap().contains("authentication is off"));
}

#[tokio::test]
async fn models_lists_on_demand_models_with_descriptions_for_the_key() {
    let mut t = Tenants::new().await;
    let key = t.key("k", "p").await;
    t.limit(
        Scope::Key,
        "k",
        Limits {
            models: Some(vec!["big".into(), "later".into(), "free".into()]),
            ..Limits::default()
        },
    )
    .await;
    let gw = priced_catalog(&t, None).await;
    let listed: Value = get(format!("{}/v1/models", gw.base), Some(&key))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(support::model_ids(&listed), vec!["big", "free", "later"]);
    assert_eq!(listed["data"][0]["description"], "the big one");
    assert_eq!(listed["data"][2]["description"], "started when asked");
    assert!(listed["data"][1].get("description").is_none());
    let one: Value = get(format!("{}/v1/models/later", gw.base), Some(&key))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (&one["id"], &one["description"]),
        (&json!("later"), &json!("started when asked"))
    );
    // `created` is when the catalog added the model, not 0.
    assert_eq!(one["created"], json!(support::ADDED_MS / 1000));
    for m in listed["data"].as_array().unwrap() {
        assert_eq!(m["created"], json!(support::ADDED_MS / 1000), "{m}");
    }
    // Not the key's, or not at all: the same answer.
    let mut answers = Vec::new();
    for id in ["tiny", "nope"] {
        let r = get(format!("{}/v1/models/{id}", gw.base), Some(&key)).await;
        assert_eq!(r.status(), 404);
        let body: Value = r.json().await.unwrap();
        answers.push((body["error"]["code"].clone(), body["error"]["type"].clone()));
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0].0, "model_not_found");
    assert_eq!(
        get(format!("{}/v1/models/big", gw.base), None)
            .await
            .status(),
        401
    );
}
