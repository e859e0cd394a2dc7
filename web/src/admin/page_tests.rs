//! The admin pages over HTTP: what the admin listener shows (read-only),
//! and approve and suspend from a signed-in admin's browser.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use axum::Router;
use axum::body::Body;
use axum::extract::Path;
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::routing::post;
use chrono::Utc;
use llmgw_api::admin::{ACTOR_HEADER, Changed, GroupRow, LevelLimits, ThreadsRow};
use llmgw_domain::Event;
use llmgw_domain::catalog::{CatalogEvent, Engine, Model, Price, Profile};
use llmgw_domain::nodes::{Gpu, Inventory, NodeEvent};
use llmgw_domain::replicas::{Placement, ReplicaEvent, ShardPlacement, ShardState};
use llmgw_domain::tenancy::{Band, Key, TenancyEvent};
use llmgw_domain::usage::{UsageEvent, UsageRecorded};
use llmgw_eventstore::{AnyStore, OpenOptions, StoreAddress};
use llmgw_people::{People, PeopleConfig};
use llmgw_projections::{Projections, Stamp, View};
use llmgw_testkit::until;
use serde_json::Value;
use tower::ServiceExt;

use crate::{Web, WebSettings};

fn web(views: Projections, people: Option<Arc<People>>, admin: Router) -> Arc<Web> {
    Arc::new(Web {
        settings: WebSettings {
            accounts: people.is_some(),
            ..WebSettings::default()
        },
        views: Arc::new(RwLock::new(views)),
        store: None,
        people,
        gateway: llmgw_gateway::Gateway::new(llmgw_gateway::GatewayConfig::default(), None)
            .expect("gateway"),
        admin,
        decider: None,
        instance: "test".into(),
    })
}

fn feed(p: &mut Projections, events: impl IntoIterator<Item = Event>) {
    let stamp = Stamp {
        position: 0,
        recorded_at_ms: 0,
    };
    for e in events {
        p.router.apply_event(stamp, &e);
        p.cluster.apply_event(stamp, &e);
        p.tenancy.apply_event(stamp, &e);
        p.usage.apply_event(stamp, &e);
    }
}

fn gpu(index: u32) -> Gpu {
    Gpu {
        index,
        uuid: format!("GPU-{index}"),
        class: "h100-80g".into(),
        memory_mb: 81_920,
        nvlink_peers: Vec::new(),
        problems: Vec::new(),
    }
}

fn model(name: &str, gpus: u32, min: u32) -> Model {
    let mut m = Model::named(name);
    m.scaling.min = min;
    m.price = Some(Price {
        prompt_per_1k: 1000,
        completion_per_1k: 2000,
    });
    m.profiles.push(Profile {
        name: format!("h100x{gpus}"),
        engine: Engine::Vllm,
        gpu_class: Some("h100-80g".into()),
        tp: gpus,
        pp: 1,
        nodes: 1,
        gpus_per_node: gpus,
        priority: 0,
        weight: 1,
        startup_timeout_s: None,
        min_disk_gb: 0,
        memory_mb: 0,
        node_selector: BTreeMap::new(),
        args: Vec::new(),
        env: BTreeMap::new(),
    });
    m
}

fn tree() -> Vec<Event> {
    vec![
        Event::Tenancy(TenancyEvent::OrgCreated {
            org_id: "acme".into(),
            name: "Acme".into(),
        }),
        Event::Tenancy(TenancyEvent::TeamCreated {
            team_id: "ml".into(),
            org_id: "acme".into(),
            name: "ML".into(),
        }),
        Event::Tenancy(TenancyEvent::ProjectCreated {
            project_id: "chatbot".into(),
            team_id: "ml".into(),
            name: "Chat bot".into(),
        }),
        Event::Tenancy(TenancyEvent::ProjectCreated {
            project_id: "search".into(),
            team_id: "ml".into(),
            name: "Search".into(),
        }),
    ]
}

fn key(id: &str, name: &str, owner: Option<&str>) -> Event {
    Event::Tenancy(TenancyEvent::KeyIssued(Key {
        key_id: id.into(),
        project_id: "chatbot".into(),
        name: name.into(),
        hash: format!("{id:0>64}"),
        prefix: "llmgw-ab".into(),
        band: Band::Gold,
        routing_profile: None,
        revoked: false,
        owner: owner.map(str::to_owned),
        claim_by: None,
        expires_at: None,
        previous: None,
    }))
}

fn used(key_id: &str, micros: u64, at: i64, status: u16) -> Event {
    Event::Usage(UsageEvent::UsageRecorded(UsageRecorded {
        request_id: format!("req-{key_id}-{at}-{micros}"),
        key_id: key_id.into(),
        project_id: "chatbot".into(),
        model_asked: "small".into(),
        model_served: "small".into(),
        prompt_tokens: 100,
        completion_tokens: 20,
        cost_micros: micros,
        status,
        latency_ms: 400,
        ttft_ms: Some(50),
        band: Band::Gold,
        at: llmgw_domain::UnixMillis(at),
    }))
}

/// One node with two GPUs, a model that runs on one, and one that needs
/// four and so fits nowhere.
fn cluster() -> Vec<Event> {
    let small = model("small", 1, 1);
    let fp = small.profiles[0].fingerprint();
    vec![
        Event::Catalog(CatalogEvent::ModelAdded { model: small }),
        Event::Catalog(CatalogEvent::ModelAdded {
            model: model("huge", 4, 1),
        }),
        Event::Node(NodeEvent::NodeRegistered {
            node_id: "gpu-1".into(),
            inventory: Inventory {
                hostname: "gpu-1.lab".into(),
                gpus: vec![gpu(0), gpu(1)],
                memory_total_mb: 524_288,
                ..Inventory::default()
            },
        }),
        Event::Replica(ReplicaEvent::ReplicaPlaced(Placement {
            replica_id: "r-small-1".into(),
            model: "small".into(),
            profile: "h100x1".into(),
            profile_fp: fp,
            pool: "h100-80g".into(),
            fabric: None,
            shards: vec![ShardPlacement {
                shard_id: "r-small-1-0".into(),
                rank: 0,
                node_id: "gpu-1".into(),
                gpu_indices: vec![1],
                hcas: Vec::new(),
                port: 20000,
                memory_mb: 0,
            }],
            why: "test".into(),
        })),
        Event::Replica(ReplicaEvent::ShardStateChanged {
            replica_id: "r-small-1".into(),
            shard_id: "r-small-1-0".into(),
            state: ShardState::Ready,
            error: None,
            exit_code: None,
            log_tail: None,
        }),
    ]
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, String, HeaderMap) {
    let response = app.clone().oneshot(request).await.expect("response");
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), 8 << 20)
        .await
        .expect("body");
    (status, String::from_utf8_lossy(&body).into_owned(), headers)
}

async fn get(app: &Router, uri: &str) -> (StatusCode, String) {
    let (status, body, _) =
        send(app, Request::get(uri).body(Body::empty()).expect("request")).await;
    (status, body)
}

#[tokio::test]
async fn the_dashboard_shows_nodes_replicas_models_and_why_one_is_not_placed() {
    let mut views = Projections::default();
    feed(&mut views, tree());
    feed(&mut views, cluster());
    feed(&mut views, [key("k-1", "<script>alert(1)</script>", None)]);
    let app = crate::admin_routes(web(views, None, Router::new()));
    let (status, body) = get(&app, "/admin").await;
    assert_eq!(status, StatusCode::OK);
    // The node and its GPUs, one held by the running replica.
    assert!(
        body.contains("gpu-1.lab") && body.contains("h100-80g · 80 GiB"),
        "{body}"
    );
    assert!(body.contains("r-small-1"));
    assert!(body.contains("gpu-1: GPU 1 (ready)"));
    // The model that fits nowhere, with the node's verdict.
    assert!(body.contains("Why not placed"));
    assert!(body.contains("huge fits nowhere"), "{body}");
    assert!(body.contains("wants 1 replica(s), has 0 starting or ready"));
    assert!(
        !body.contains("<h3 class=\"mono\">small</h3>"),
        "a model with all it wants needs no explanation"
    );
    assert!(
        body.contains("0.0010 in / 0.0020 out per 1k"),
        "micro-units per 1k tokens"
    );
    // Names are data: escaped.
    assert!(!body.contains("<script>alert(1)"));
    assert!(body.contains("&#60;script&#62;alert(1)&#60;/script&#62;"));
}

#[tokio::test]
async fn usage_per_key_is_paged_biggest_spender_first_and_a_person_counts_their_keys_and_chat() {
    let mut views = Projections::default();
    feed(&mut views, tree());
    let now = Utc::now().timestamp_millis();
    let mut events = Vec::new();
    for i in 0..120u64 {
        events.push(key(&format!("k-{i:03}"), "k", (i == 7).then_some("ada")));
        events.push(used(&format!("k-{i:03}"), 1000 + i * 10, now, 200));
    }
    events.push(used("session:ada", 5, now, 502));
    events.push(Event::Tenancy(TenancyEvent::UserSignedUp {
        user_id: "ada".into(),
    }));
    feed(&mut views, events);
    let app = crate::admin_routes(web(views, None, Router::new()));

    let (_, first) = get(&app, "/admin").await;
    assert!(
        first.contains("k-119") && first.contains("k-070"),
        "the top 50"
    );
    assert!(!first.contains(">k-069<"), "the 51st is on page 2");
    assert!(first.contains("keys 1–50 of 120"));
    assert!(first.contains("href=\"/admin?page=2&#38;people=1#keys\""));
    let (_, last) = get(&app, "/admin?page=3").await;
    assert!(last.contains(">k-000<") && !last.contains(">k-119<"));
    assert!(last.contains("keys 101–120 of 120"));

    // ada: her key (1,070 micros) and her chat (5), one error among two;
    // 1,075 micros show rounded.
    let row = first
        .split("<tr>")
        .find(|r| r.contains(">ada<"))
        .expect("ada's row");
    assert!(row.contains(">2<") && row.contains(">0.0011<"), "{row}");
}

#[tokio::test]
async fn the_usage_page_draws_charts_by_group_and_range() {
    let mut views = Projections::default();
    feed(&mut views, tree());
    let now = Utc::now().timestamp_millis();
    feed(
        &mut views,
        [
            key("k-ada", "ada's", Some("ada")),
            used("k-ada", 2_000_000, now, 200),
            used("k-ada", 1_000_000, now - 3_600_000, 200),
            Event::Tenancy(TenancyEvent::UserSignedUp {
                user_id: "ada".into(),
            }),
        ],
    );
    let app = crate::admin_routes(web(views, None, Router::new()));
    let (status, body) = get(&app, "/admin/usage?by=org&range=24h").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body.matches("<svg class=\"chart\"").count(),
        3,
        "requests, tokens, spend"
    );
    assert!(body.contains("<title>Spend</title>"));
    assert!(body.contains(">acme</text>"), "the org in the legend");
    assert!(body.contains("<td>Acme</td>"));
    assert!(body.contains(">3.000000<"), "the range's spend");
    assert!(!body.contains("<script"), "no script, inline or not");

    // The same figures as a file: every bar with requests, to the
    // micro-unit, linked from the page with its grouping and range.
    assert!(
        body.contains("href=\"/admin/usage.csv?by=org&#38;range=24h\" download"),
        "{body}"
    );
    let request = Request::get("/admin/usage.csv?by=org&range=24h")
        .body(Body::empty())
        .expect("request");
    let (status, csv, headers) = send(&app, request).await;
    assert_eq!(status, StatusCode::OK, "{csv}");
    assert_eq!(headers[header::CONTENT_TYPE], "text/csv; charset=utf-8");
    assert!(
        headers[header::CONTENT_DISPOSITION]
            .to_str()
            .is_ok_and(|d| d.starts_with("attachment; filename=\"llmgw-usage-by-org-24h-to-")),
        "{headers:?}"
    );
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "start,end,org,name,requests,tokens,errors,spend_micros,spend_units"
    );
    assert_eq!(lines.len(), 3, "one row an hour that had requests: {csv}");
    assert!(
        lines[1].ends_with(",acme,Acme,1,120,0,1000000,1.000000"),
        "{csv}"
    );
    assert!(
        lines[2].ends_with(",acme,Acme,1,120,0,2000000,2.000000"),
        "{csv}"
    );
    let (status, _) = get(&app, "/admin/usage.csv?range=nonsense").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    let (_, people) = get(&app, "/admin/usage?by=person&range=30d").await;
    assert!(people.contains(">ada</text>"));
    let (_, none) = get(&app, "/admin/usage?by=team").await;
    assert!(none.contains("aria-current=\"page\">7d<"), "no range is 7d");
    // A mistyped address is said to be, not shown as the default view.
    for (query, says) in [
        ("range=nonsense", "nonsense&#34;: one of 24h, 7d, 30d"),
        ("by=nonsense", "nonsense&#34;: one of org, team, project"),
        ("until=notadate", "is not a day: write YYYY-MM-DD"),
    ] {
        let (status, body) = get(&app, &format!("/admin/usage?{query}")).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{query}");
        assert!(body.contains(says), "{query}: {body}");
    }
}

/// The cells of each row of the usage page's totals table, its "all"
/// row last.
fn totals_table(body: &str) -> Vec<Vec<String>> {
    let table = body
        .split("<h2>Totals")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .unwrap_or_else(|| panic!("no totals table: {body}"));
    table
        .split("<tr>")
        .skip(2)
        .map(|row| {
            let row = row.split("</tr>").next().unwrap_or_default();
            // What comes before each closing tag, the row's own last.
            let mut cells: Vec<&str> = row.split("</t").collect();
            cells.pop();
            cells
                .into_iter()
                .filter_map(|cell| cell.rsplit_once('>'))
                .map(|(_, text)| text.replace("&#39;", "'"))
                .collect()
        })
        .collect()
}

fn used_in(project: &str, key_id: &str, micros: u64, at: i64) -> Event {
    match used(key_id, micros, at, 200) {
        Event::Usage(UsageEvent::UsageRecorded(mut u)) => {
            u.project_id = project.into();
            Event::Usage(UsageEvent::UsageRecorded(u))
        }
        _ => unreachable!("used makes a UsageRecorded"),
    }
}

/// By person, the keys no person owns are one row, `(operators)`, as
/// `events usage --by person` has them, so "all" is everything, as by
/// project: the page showed the people alone and "all" was theirs.
#[tokio::test]
async fn usage_by_person_adds_the_operators_keys_up_to_everything() {
    let mut views = Projections::default();
    feed(&mut views, tree());
    let now = Utc::now().timestamp_millis();
    feed(
        &mut views,
        [
            Event::Tenancy(TenancyEvent::UserSignedUp {
                user_id: "ada".into(),
            }),
            key("k-ada", "ada's", Some("ada")),
            key("k-ops", "deploy", None),
            key("k-ci", "ci", None),
            used("k-ops", 700, now, 200),
            used("k-ci", 150, now, 502),
            used("k-ada", 100, now, 200),
            used("session:ada", 50, now, 200),
        ],
    );
    let app = crate::admin_routes(web(views, None, Router::new()));
    let (status, body) = get(&app, "/admin/usage?by=person&range=24h").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let operators = "every key made without an owner (an operator's)";
    assert_eq!(
        totals_table(&body),
        [
            vec!["(operators)", operators, "2", "240", "1", "0.000850"],
            vec!["ada", "", "2", "240", "0", "0.000150"],
            vec!["all", "", "4", "480", "1", "0.001000"],
        ],
        "{body}"
    );
    assert!(
        body.contains(">(operators)</text>"),
        "in the charts' legend"
    );
    let (_, by_project) = get(&app, "/admin/usage?by=project&range=24h").await;
    assert_eq!(
        totals_table(&by_project).last().map(Vec::as_slice),
        Some(&["all", "", "4", "480", "1", "0.001000"].map(str::to_owned)[..]),
        "the same everything: {by_project}"
    );

    let (status, csv) = get(&app, "/admin/usage.csv?by=person&range=24h").await;
    assert_eq!(status, StatusCode::OK, "{csv}");
    let rows: Vec<&str> = csv
        .lines()
        .skip(1)
        .map(|l| l.splitn(3, ',').nth(2).unwrap_or_default())
        .collect();
    assert_eq!(
        rows,
        [
            format!("(operators),{operators},2,240,1,850,0.000850"),
            "ada,,2,240,0,150,0.000150".to_owned(),
        ],
        "{csv}"
    );
}

/// Spend on the page is exact, so an auditor's sum of the rows is the
/// "all" under them: rounded to four decimals, 0.000660 and 0.000060
/// showed as 0.0007 and 0.0001 over an "all" of 0.0007.
#[tokio::test]
async fn usage_rows_add_up_to_all_to_the_micro_unit() {
    let mut views = Projections::default();
    feed(&mut views, tree());
    let now = Utc::now().timestamp_millis();
    feed(
        &mut views,
        [
            used_in("chatbot", "k-1", 660, now),
            used_in("search", "k-2", 60, now),
        ],
    );
    let app = crate::admin_routes(web(views, None, Router::new()));
    let (_, body) = get(&app, "/admin/usage?by=project&range=24h").await;
    assert_eq!(
        totals_table(&body),
        [
            vec!["chatbot", "Chat bot", "1", "120", "0", "0.000660"],
            vec!["search", "Search", "1", "120", "0", "0.000060"],
            vec!["all", "", "2", "240", "0", "0.000720"],
        ],
        "{body}"
    );
    assert!(body.contains("exact to the micro-unit"), "and says so");
}

/// Router-only, the dashboard shows the static endpoints that serve, and
/// says that the cluster the log holds is as a control plane last left it
/// (an operator read stale nodes and replicas as live).
#[tokio::test]
async fn a_router_only_dashboard_shows_its_endpoints_and_says_the_cluster_is_not_live() {
    let mut views = Projections::default();
    feed(&mut views, cluster());
    let endpoint: llmgw_gateway::EndpointSpec =
        "e0=http://127.0.0.1:9=demo".parse().expect("endpoint");
    let gateway = llmgw_gateway::Gateway::new(
        llmgw_gateway::GatewayConfig {
            endpoints: vec![endpoint],
            ..llmgw_gateway::GatewayConfig::default()
        },
        None,
    )
    .expect("gateway");
    let web = Arc::new(Web {
        settings: WebSettings {
            router_only: true,
            ..WebSettings::default()
        },
        views: Arc::new(RwLock::new(views)),
        store: None,
        people: None,
        gateway,
        admin: Router::new(),
        decider: None,
        instance: "test".into(),
    });
    let (status, body) = get(&crate::admin_routes(web), "/admin").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("This server is router-only"), "{body}");
    assert!(body.contains("not what runs now"), "{body}");
    assert!(
        body.contains("<td class=\"mono\">e0</td>") && body.contains("http://127.0.0.1:9"),
        "{body}"
    );
}

/// A stand-in engine whose `/metrics` page is `page`; its address.
async fn metrics_page(page: &'static str) -> String {
    let app = Router::new().route("/metrics", axum::routing::get(move || async move { page }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// An address nothing listens on.
async fn dead_address() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    format!("http://{}", listener.local_addr().expect("addr"))
}

/// The state the Endpoints table shows for `id`.
fn endpoint_state<'a>(body: &'a str, id: &str) -> Option<&'a str> {
    let row = &body[body.find(&format!("<td class=\"mono\">{id}</td>"))?..];
    let row = &row[..row.find("</tr>")?];
    let badge = &row[row.find("<span class=\"badge")?..];
    let text = &badge[badge.find('>')? + 1..];
    Some(&text[..text.find('<')?])
}

/// The Endpoints table says what `/metrics` says of each endpoint: a dead
/// engine read `serving` there (the breaker alone was asked, closed again
/// five seconds after each cool-down) while `llmgw_endpoint_breaker_open`
/// and `llmgw_endpoint_metrics_stale` said 1.
#[tokio::test]
async fn the_router_only_dashboard_says_which_endpoints_are_down_stale_or_open() {
    let live = metrics_page(
        "vllm:num_requests_running{model_name=\"demo\"} 0\nvllm:num_requests_waiting{model_name=\"demo\"} 0\n",
    )
    .await;
    let mute = metrics_page("# no figures here\n").await;
    let dead = dead_address().await;
    let spec = |id: &str, url: &str| -> llmgw_gateway::EndpointSpec {
        format!("{id}={url}=demo").parse().expect("endpoint")
    };
    let gateway = llmgw_gateway::Gateway::new(
        llmgw_gateway::GatewayConfig {
            endpoints: vec![
                spec("e-live", &live),
                spec("e-mute", &mute),
                spec("e-dead", &dead),
                spec("e-failing", &live),
            ],
            // Figures older than 0.6 s are stale; a breaker stays open
            // for the whole test.
            scrape_interval: std::time::Duration::from_millis(200),
            breaker: llmgw_gateway::BreakerConfig {
                threshold: 3,
                cool_down: std::time::Duration::from_secs(3600),
            },
            ..llmgw_gateway::GatewayConfig::default()
        },
        None,
    )
    .expect("gateway");
    let failing = (gateway.endpoints.snapshot().into_iter())
        .find(|e| e.spec.id == "e-failing")
        .expect("e-failing");
    for _ in 0..3 {
        failing.record(false);
    }
    let web = Arc::new(Web {
        settings: WebSettings {
            router_only: true,
            ..WebSettings::default()
        },
        views: Arc::new(RwLock::new(Projections::default())),
        store: None,
        people: None,
        gateway: gateway.clone(),
        admin: Router::new(),
        decider: None,
        instance: "test".into(),
    });
    let app = crate::admin_routes(web);
    let want = [
        ("e-live", "serving"),
        ("e-mute", "stale"),
        ("e-dead", "down"),
        ("e-failing", "open"),
    ];
    let body = until("each endpoint's state", || async {
        llmgw_gateway::scrape::scrape_once(&gateway).await;
        let (status, body) = get(&app, "/admin").await;
        assert_eq!(status, StatusCode::OK);
        want.iter()
            .all(|(id, state)| endpoint_state(&body, id) == Some(state))
            .then_some(body)
    })
    .await;
    assert!(body.contains("nothing answers at its address"), "{body}");
}

#[tokio::test]
async fn the_admin_listener_shows_people_without_forms_and_refuses_to_act() {
    let mut views = Projections::default();
    feed(&mut views, tree());
    feed(
        &mut views,
        [
            Event::Tenancy(TenancyEvent::UserSignedUp {
                user_id: "usr-a".into(),
            }),
            Event::Tenancy(TenancyEvent::UserApproved {
                user_id: "usr-a".into(),
                project_id: "search".into(),
                by: "op".into(),
            }),
            Event::Tenancy(TenancyEvent::UserSignedUp {
                user_id: "usr-z".into(),
            }),
        ],
    );
    let asked: Asked = Arc::default();
    let app = crate::admin_routes(web(views, None, admin_api(asked.clone())));
    let (status, body) = get(&app, "/admin/users").await;
    assert_eq!(status, StatusCode::OK);
    let (z, a) = (
        body.find("usr-z").expect("z"),
        body.find("usr-a").expect("a"),
    );
    assert!(z < a, "pending first");
    assert!(body.contains("1</strong> waiting for approval"));
    assert!(body.contains("keys they made keep working until revoked"));
    assert!(body.contains("llmgw users promote ID"));
    assert!(!body.contains("<form"), "read-only: {body}");
    let (status, _, _) = send(
        &app,
        Request::post("/admin/users/usr-z/approve")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from("csrf=x&project=search"))
            .expect("request"),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(asked.lock().expect("lock").is_empty());
}

/// What the stand-in admin API was asked: `(path, actor, body)`.
type Asked = Arc<Mutex<Vec<(String, String, Value)>>>;

fn admin_api(asked: Asked) -> Router {
    let actor = |h: &HeaderMap| {
        h.get(ACTOR_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (approved, suspended) = (asked.clone(), asked);
    Router::new()
        .route(
            "/api/v1/users/{id}/approve",
            post(
                move |h: HeaderMap, Path(id): Path<String>, body: axum::body::Bytes| {
                    let v: Value = serde_json::from_slice(&body).expect("json");
                    approved
                        .lock()
                        .expect("lock")
                        .push((format!("approve {id}"), actor(&h), v));
                    async move {
                        if id == "usr-gone" {
                            return Err(StatusCode::NOT_FOUND);
                        }
                        Ok(axum::Json(Changed {
                            events: vec!["UserApproved".into()],
                            message: "ok".into(),
                        }))
                    }
                },
            ),
        )
        .route(
            "/api/v1/users/{id}/suspend",
            post(move |h: HeaderMap, Path(id): Path<String>| {
                suspended.lock().expect("lock").push((
                    format!("suspend {id}"),
                    actor(&h),
                    Value::Null,
                ));
                async move {
                    axum::Json(Changed {
                        events: vec!["UserSuspended".into()],
                        message: "ok".into(),
                    })
                }
            }),
        )
}

static DIRS: AtomicU64 = AtomicU64::new(0);

/// A signed-in admin's browser against the client listener, a pending
/// person to approve, and the stand-in admin API.
struct Signed {
    app: Router,
    cookie: String,
    csrf: String,
    admin_id: String,
    pending_id: String,
    asked: Asked,
    dir: std::path::PathBuf,
}

impl Drop for Signed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn signed_in_admin() -> Signed {
    let dir = std::env::temp_dir().join(format!(
        "llmgw-web-admin-{}-{}",
        std::process::id(),
        DIRS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let address = StoreAddress::parse(&dir.join("log.db").display().to_string()).expect("address");
    let store: AnyStore = AnyStore::open(&address, OpenOptions::migrating())
        .await
        .expect("store");
    let people = Arc::new(People::new(&store, PeopleConfig::default()));
    let now = Utc::now();
    let password = "a long enough passphrase";
    let admin_id = people
        .sign_up("root@example.org", "Root", password, now)
        .await
        .expect("sign up")
        .expect("new");
    let pending_id = people
        .sign_up("new@example.org", "New <b>Person</b>", password, now)
        .await
        .expect("sign up")
        .expect("new");
    let opened = people
        .sign_in(
            "root@example.org",
            password,
            |_| Some(llmgw_domain::tenancy::UserStatus::Active),
            now,
        )
        .await
        .expect("sign in");
    let mut views = Projections::default();
    feed(&mut views, tree());
    feed(
        &mut views,
        [
            Event::Tenancy(TenancyEvent::UserSignedUp {
                user_id: admin_id.clone(),
            }),
            Event::Tenancy(TenancyEvent::UserApproved {
                user_id: admin_id.clone(),
                project_id: "chatbot".into(),
                by: "op".into(),
            }),
            Event::Tenancy(TenancyEvent::UserPromoted {
                user_id: admin_id.clone(),
                by: "op".into(),
            }),
            Event::Tenancy(TenancyEvent::UserSignedUp {
                user_id: pending_id.clone(),
            }),
        ],
    );
    let asked: Asked = Arc::default();
    let app = crate::client_routes(web(views, Some(people), admin_api(asked.clone())));
    Signed {
        app,
        cookie: format!(
            "{}={}; {}={}",
            crate::session::SESSION_COOKIE,
            opened.token,
            crate::session::CSRF_COOKIE,
            opened.csrf
        ),
        csrf: opened.csrf,
        admin_id,
        pending_id,
        asked,
        dir,
    }
}

impl Signed {
    async fn get(&self, uri: &str) -> (StatusCode, String) {
        let request = Request::get(uri)
            .header(header::COOKIE, &self.cookie)
            .body(Body::empty())
            .expect("request");
        let (status, body, _) = send(&self.app, request).await;
        (status, body)
    }

    async fn post(&self, uri: &str, form: &str) -> (StatusCode, Option<String>) {
        let request = Request::post(uri)
            .header(header::COOKIE, &self.cookie)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(form.to_owned()))
            .expect("request");
        let (status, _, headers) = send(&self.app, request).await;
        let location = headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (status, location)
    }
}

#[tokio::test]
async fn an_admin_approves_a_pending_person_into_a_project_from_the_page() {
    let s = signed_in_admin().await;
    let (status, body) = s.get("/admin/users").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("new@example.org"));
    assert!(
        body.contains("New &#60;b&#62;Person&#60;/b&#62;"),
        "names are escaped: {body}"
    );
    let action = format!("action=\"/admin/users/{}/approve\"", s.pending_id);
    assert!(
        body.contains(&action),
        "an approve form for the pending person"
    );
    assert!(body.contains(&format!("name=\"csrf\" value=\"{}\"", s.csrf)));
    assert!(
        body.contains("<option value=\"search\""),
        "every project to pick"
    );

    let uri = format!("/admin/users/{}/approve", s.pending_id);
    let (status, location) = s
        .post(&uri, &format!("csrf={}&project=search", s.csrf))
        .await;
    assert_eq!(
        (status, location.as_deref()),
        (StatusCode::SEE_OTHER, Some("/admin/users"))
    );
    let asked = s.asked.lock().expect("lock").clone();
    assert_eq!(
        asked,
        vec![(
            format!("approve {}", s.pending_id),
            s.admin_id.clone(),
            serde_json::json!({"project": "search"})
        )]
    );
}

/// Every row had the same "Approve" and "Suspend": a screen reader could
/// not tell whom each acted on. Each names its person.
#[tokio::test]
async fn each_persons_buttons_name_whom_they_act_on() {
    let s = signed_in_admin().await;
    let (status, body) = s.get("/admin/users").await;
    assert_eq!(status, StatusCode::OK);
    let new = "New &#60;b&#62;Person&#60;/b&#62; (new@example.org)";
    for label in [
        format!(r#"aria-label="Approve {new}">Approve</button>"#),
        format!(r#"aria-label="Suspend {new}">Suspend</button>"#),
        r#"aria-label="Suspend Root (root@example.org)">Suspend</button>"#.to_owned(),
    ] {
        assert!(body.contains(&label), "{label}: {body}");
    }
}

#[tokio::test]
async fn a_form_without_this_sessions_token_is_refused_and_nothing_is_asked() {
    let s = signed_in_admin().await;
    let uri = format!("/admin/users/{}/approve", s.pending_id);
    let (status, _) = s.post(&uri, "csrf=forged&project=search").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = s.post(&uri, "project=search").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let suspend = format!("/admin/users/{}/suspend", s.pending_id);
    let (status, _) = s.post(&suspend, "csrf=").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(s.asked.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn an_admin_suspends_and_a_refusal_of_the_api_is_the_pages_answer() {
    let s = signed_in_admin().await;
    let uri = format!("/admin/users/{}/suspend", s.pending_id);
    let (status, location) = s.post(&uri, &format!("csrf={}", s.csrf)).await;
    assert_eq!(
        (status, location.as_deref()),
        (StatusCode::SEE_OTHER, Some("/admin/users"))
    );
    let (status, _) = s
        .post(
            "/admin/users/usr-gone/approve",
            &format!("csrf={}&project=search", s.csrf),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let asked: Vec<String> = s
        .asked
        .lock()
        .expect("lock")
        .iter()
        .map(|(what, who, _)| format!("{what} by {who}"))
        .collect();
    assert_eq!(
        asked,
        vec![
            format!("suspend {} by {}", s.pending_id, s.admin_id),
            format!("approve usr-gone by {}", s.admin_id),
        ]
    );
}

#[tokio::test]
async fn the_usage_page_shows_an_earlier_range_and_links_to_its_neighbours() {
    let mut views = Projections::default();
    feed(&mut views, tree());
    let then = Utc::now() - chrono::Duration::days(3);
    feed(
        &mut views,
        [
            key("k-ops", "ops", None),
            used("k-ops", 7_000_000, then.timestamp_millis(), 200),
        ],
    );
    let app = crate::admin_routes(web(views, None, Router::new()));
    let (_, today) = get(&app, "/admin/usage?range=24h").await;
    assert!(today.contains("No requests in this range."));
    let day = then.format("%Y-%m-%d").to_string();
    let (_, that_day) = get(&app, &format!("/admin/usage?range=24h&until={day}")).await;
    assert!(that_day.contains("7.0000"), "{that_day}");
    let before = (then - chrono::Duration::days(1)).format("%Y-%m-%d");
    let after = (then + chrono::Duration::days(1)).format("%Y-%m-%d");
    assert!(that_day.contains(&format!("range=24h&#38;until={before}\">← earlier")));
    assert!(that_day.contains(&format!("range=24h&#38;until={after}\">later →")));
}

#[tokio::test]
async fn the_dashboard_shows_each_groups_limits_spend_and_what_it_keeps() {
    let row = |scope: &str, id: &str, name: &str| GroupRow {
        scope: scope.into(),
        id: id.into(),
        name: name.into(),
        parent: None,
        limits: LevelLimits::default(),
        spent_micros: 0,
        spent_period: "month".into(),
        requests: 0,
        keys: 3,
        threads: None,
        memory_retain_hours: None,
    };
    let mut team = row("team", "ml", "<b>ML</b>");
    team.limits = LevelLimits {
        rpm: Some(1200),
        budget_micros: Some(5_000_000),
        period: Some("day".into()),
        ..LevelLimits::default()
    };
    team.spent_micros = 1_250_000;
    team.spent_period = "day".into();
    let mut project = row("project", "chat", "chat");
    project.limits.models = Some(Vec::new());
    project.threads = Some(ThreadsRow {
        capture: true,
        retain_hours: 24,
    });
    project.memory_retain_hours = Some(48);
    let rows = vec![row("org", "acme", "Acme"), team, project];
    let admin = Router::new().route(
        "/api/v1/groups",
        axum::routing::get(move || {
            let rows = rows.clone();
            async move { axum::Json(rows) }
        }),
    );
    let app = crate::admin_routes(web(Projections::default(), None, admin));
    let (status, body) = get(&app, "/admin").await;
    assert_eq!(status, StatusCode::OK);
    let table = body.split("id=\"groups\"").nth(1).expect("the groups");
    let table = table.split("</table>").next().expect("their table");
    let lines: Vec<&str> = table.split("<tr>").skip(2).collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[0].contains("depth-0") && lines[0].contains("Acme"));
    assert!(lines[1].contains("depth-1") && lines[1].contains("1,200 rpm"));
    assert!(lines[1].contains("5.0000 a day") && lines[1].contains("1.2500 this day"));
    assert!(
        lines[1].contains("&#60;b&#62;ML"),
        "names are escaped: {}",
        lines[1]
    );
    assert!(lines[2].contains("depth-2") && lines[2].contains("none (suspended)"));
    assert!(
        lines[2].contains("threads with replies, 24 h; memory, 48 h"),
        "{}",
        lines[2]
    );

    // Without tenancy routes (no keys, no usage) the section says so.
    let app = crate::admin_routes(web(Projections::default(), None, Router::new()));
    let (_, body) = get(&app, "/admin").await;
    assert!(body.contains("No org has been made"));

    // A long tree is cut, and says where the rest is; the page asks for
    // one row more than it shows, not for the whole tree.
    let many: Vec<GroupRow> = (0..1000)
        .map(|i| row("project", &format!("p-{i:03}"), "p"))
        .collect();
    let admin = Router::new().route(
        "/api/v1/groups",
        axum::routing::get(
            move |axum::extract::Query(q): axum::extract::Query<BTreeMap<String, usize>>| {
                let limit = q.get("limit").copied().unwrap_or(usize::MAX);
                assert_eq!(limit, 201, "the page asks for what it shows, and one more");
                let first = many.iter().take(limit).cloned().collect::<Vec<_>>();
                async move { axum::Json(first) }
            },
        ),
    );
    let app = crate::admin_routes(web(Projections::default(), None, admin));
    let (_, body) = get(&app, "/admin").await;
    assert!(body.contains(">p-199<") && !body.contains(">p-200<"));
    assert!(body.contains("These are the first 200 groups"));

    // A failure to read them is not "no org".
    let admin = Router::new().route(
        "/api/v1/groups",
        axum::routing::get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "store away") }),
    );
    let app = crate::admin_routes(web(Projections::default(), None, admin));
    let (_, body) = get(&app, "/admin").await;
    assert!(
        body.contains("The groups could not be read: store away"),
        "{body}"
    );
    assert!(!body.contains("No org has been made"));
}

/// A key that no longer works says why, as `llmgw keys list` does: every
/// one read "revoked", a claim link's key that ran out included.
#[tokio::test]
async fn usage_per_key_says_why_a_key_stopped() {
    let mut views = Projections::default();
    feed(&mut views, tree());
    let past = llmgw_domain::UnixMillis(Utc::now().timestamp_millis() - 60_000);
    let future = llmgw_domain::UnixMillis(Utc::now().timestamp_millis() + 3_600_000);
    let claim = |id: &str, by| match key(id, id, None) {
        Event::Tenancy(TenancyEvent::KeyIssued(mut k)) => {
            k.claim_by = Some(by);
            Event::Tenancy(TenancyEvent::KeyIssued(k))
        }
        _ => unreachable!("key makes a KeyIssued"),
    };
    feed(
        &mut views,
        [
            key("k-live", "k-live", None),
            key("k-gone", "k-gone", None),
            Event::Tenancy(TenancyEvent::KeyRevoked {
                key_id: "k-gone".into(),
                by: "alice".into(),
            }),
            claim("k-lapsed", past),
            claim("k-waiting", future),
            Event::Tenancy(TenancyEvent::UserSignedUp {
                user_id: "bo".into(),
            }),
            key("k-erased", "k-erased", Some("bo")),
            Event::Tenancy(TenancyEvent::UserErased {
                user_id: "bo".into(),
                by: "alice".into(),
            }),
        ],
    );
    let app = crate::admin_routes(web(views, None, Router::new()));
    let (status, page) = get(&app, "/admin").await;
    assert_eq!(status, StatusCode::OK);
    let badge = |id: &str| {
        let row = page
            .split("<tr>")
            .find(|r| r.contains(&format!(">{id}<")))
            .unwrap_or_else(|| panic!("{id}'s row: {page}"));
        row.split(r#"<span class="badge bad">"#)
            .nth(1)
            .and_then(|b| b.split('<').next())
            .map(str::to_owned)
    };
    assert_eq!(badge("k-live"), None);
    assert_eq!(badge("k-waiting"), None);
    assert_eq!(badge("k-gone").as_deref(), Some("revoked"));
    assert_eq!(badge("k-lapsed").as_deref(), Some("expired"));
    assert_eq!(badge("k-erased").as_deref(), Some("stopped"));
}

/// Usage per person names each person (their name, escaped), as
/// `/admin/usage` does: the ids alone told an admin nothing.
#[tokio::test]
async fn usage_per_person_names_people() {
    let s = signed_in_admin().await;
    let (status, body) = s.get("/admin").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let section = body
        .split(r#"id="people""#)
        .nth(1)
        .and_then(|b| b.split(r#"id="keys""#).next())
        .expect("the people table");
    let row = |id: &str| {
        section
            .split("<tr>")
            .find(|r| r.contains(id))
            .unwrap_or_else(|| panic!("{id}'s row: {section}"))
            .to_owned()
    };
    assert!(row(&s.admin_id).contains("Root"), "{section}");
    assert!(
        row(&s.pending_id).contains("New &#60;b&#62;Person&#60;/b&#62;"),
        "{section}"
    );
}

/// A person whose keys span projects shows every project their use was
/// in, most requests first: the row named only the project they were
/// approved into (Dee · chatbot · 6 requests, 3 of them in search).
#[tokio::test]
async fn usage_per_person_names_every_project_used() {
    let mut views = Projections::default();
    feed(&mut views, tree());
    let in_search = |id: &str| match key(id, id, Some("dee")) {
        Event::Tenancy(TenancyEvent::KeyIssued(mut k)) => {
            k.project_id = "search".into();
            Event::Tenancy(TenancyEvent::KeyIssued(k))
        }
        _ => unreachable!("key makes a KeyIssued"),
    };
    let now = Utc::now().timestamp_millis();
    let mut events = vec![
        Event::Tenancy(TenancyEvent::UserSignedUp {
            user_id: "dee".into(),
        }),
        Event::Tenancy(TenancyEvent::UserApproved {
            user_id: "dee".into(),
            project_id: "chatbot".into(),
            by: "op".into(),
        }),
        Event::Tenancy(TenancyEvent::UserSignedUp {
            user_id: "eli".into(),
        }),
        Event::Tenancy(TenancyEvent::UserApproved {
            user_id: "eli".into(),
            project_id: "chatbot".into(),
            by: "op".into(),
        }),
        key("k-chat", "k-chat", Some("dee")),
        in_search("k-search"),
    ];
    for i in 0..4 {
        events.push(used("k-search", 10, now + i, 200));
    }
    for i in 0..2 {
        events.push(used("k-chat", 10, now + i, 200));
    }
    feed(&mut views, events);
    let app = crate::admin_routes(web(views, None, Router::new()));
    let (status, page) = get(&app, "/admin").await;
    assert_eq!(status, StatusCode::OK);
    let section = page
        .split(r#"id="people""#)
        .nth(1)
        .and_then(|b| b.split(r#"id="keys""#).next())
        .expect("the people table");
    let row = |id: &str| {
        section
            .split("<tr>")
            .find(|r| r.contains(&format!(">{id}<")))
            .unwrap_or_else(|| panic!("{id}'s row: {section}"))
            .to_owned()
    };
    let dee = row("dee");
    assert!(
        dee.contains(r#"<td class="mono">search, chatbot</td>"#),
        "{dee}"
    );
    assert!(dee.contains(">6<"), "{dee}");
    // No use yet: the project they were approved into.
    let eli = row("eli");
    assert!(eli.contains(r#"<td class="mono">chatbot</td>"#), "{eli}");
}
