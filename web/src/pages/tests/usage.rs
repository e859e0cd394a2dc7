//! `/profile/usage` and the profile's summary: a person sees their own
//! use (their keys and their chat, together and apart) today and this
//! month as the log recorded it, and the limits that bind them, and
//! nothing of anyone else's.

use axum::http::StatusCode;
use llmgw_decider::{Actor, Origin};
use llmgw_domain::Event;
use llmgw_domain::catalog::Price;
use llmgw_domain::tenancy::{Band, Key, Limits, Period, Scope, TenancyEvent};
use llmgw_domain::time::UnixMillis;
use llmgw_domain::usage::{FinishedRequest, period_start, record_batch};
use llmgw_projections::DAY_MS;

use super::accounts::signed_in;
use super::harness::{Browser, Site};

/// Appends `events` as the log would hold them, and catches the views up.
async fn log(site: &Site, events: Vec<Event>) {
    site.web
        .decider
        .as_ref()
        .expect("decider")
        .observe(&Origin::new(Actor::Operator("admin".into())), events)
        .await
        .expect("append");
    site.catch_up().await;
}

fn tenancy(e: TenancyEvent) -> Event {
    Event::Tenancy(e)
}

fn key(id: &str, name: &str, owner: Option<&str>) -> Event {
    tenancy(TenancyEvent::KeyIssued(Key {
        key_id: id.into(),
        project_id: "p1".into(),
        name: name.into(),
        hash: format!("{:0>64}", id.len()),
        prefix: format!("sk-{}", &id[..3]),
        band: Band::Gold,
        routing_profile: None,
        revoked: false,
        owner: owner.map(str::to_owned),
        claim_by: None,
        expires_at: None,
        previous: None,
    }))
}

fn limits(scope: Scope, id: &str, limits: Limits) -> Event {
    tenancy(TenancyEvent::LimitsSet {
        scope,
        scope_id: id.into(),
        limits,
    })
}

/// A gateway's batch of finished requests `(key, at, prompt, completion)`
/// in project p1, at one unit (a million micro-units) per 1,000 tokens
/// each way: a token costs 1,000 micro-units.
fn served(requests: &[(&str, i64, u64, u64)]) -> Event {
    let finished = requests
        .iter()
        .enumerate()
        .map(|(i, (key, at, prompt, completion))| FinishedRequest {
            request_id: format!("req-{i}"),
            key_id: (*key).into(),
            project_id: "p1".into(),
            model_asked: "tiny".into(),
            model_served: "tiny".into(),
            prompt_tokens: *prompt,
            completion_tokens: *completion,
            status: 200,
            latency_ms: 20,
            ttft_ms: None,
            band: Band::Gold,
            at: UnixMillis(*at),
            price: Price {
                prompt_per_1k: 1_000_000,
                completion_per_1k: 1_000_000,
            },
        });
    let (batch, refused) = record_batch("gw-1", finished);
    assert!(refused.is_empty(), "{refused:?}");
    Event::Usage(batch.expect("a batch"))
}

/// The figures of the row `id` (its numeric cells), as the page prints
/// them.
fn figures(body: &str, id: &str) -> Vec<String> {
    let start = body
        .find(&format!("<tr id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no row {id}: {body}"));
    let row = &body[start..];
    let row = &row[..row.find("</tr>").expect("end of row")];
    row.split("class=\"num\">")
        .skip(1)
        .map(|cell| cell[..cell.find('<').expect("end of cell")].to_owned())
        .collect()
}

/// The page without its charts, whose coordinates are numbers too.
fn without_charts(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some(start) = rest.find("<svg") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find("</svg>").expect("end of chart");
        rest = &rest[start + end..];
    }
    out.push_str(rest);
    out
}

/// The text of the section `id` (a limits block).
fn section<'a>(body: &'a str, id: &str) -> &'a str {
    let start = body
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no section {id}: {body}"));
    let rest = &body[start..];
    &rest[..rest.find("</section>").expect("end of section")]
}

#[tokio::test]
async fn a_person_sees_their_own_use_and_limits_and_no_one_elses() {
    let site = Site::open(true, Vec::new()).await;
    log(
        &site,
        vec![
            tenancy(TenancyEvent::OrgCreated {
                org_id: "o1".into(),
                name: "O".into(),
            }),
            tenancy(TenancyEvent::TeamCreated {
                team_id: "t1".into(),
                org_id: "o1".into(),
                name: "T".into(),
            }),
            tenancy(TenancyEvent::ProjectCreated {
                project_id: "p1".into(),
                team_id: "t1".into(),
                name: "P".into(),
            }),
        ],
    )
    .await;
    let mut ada = Browser::default();
    let ada_id = signed_in(&site, &mut ada, "ada@example.org").await;
    let mut bob = Browser::default();
    let bob_id = signed_in(&site, &mut bob, "bob@example.org").await;

    let now = UnixMillis::now().0;
    let month_start = period_start(Period::Month, now);
    // Yesterday counts in this month, unless today is the 1st.
    let yesterday = now - DAY_MS;
    let yesterday_this_month = yesterday >= month_start;
    let ada_chat = format!("session:{ada_id}");
    let bob_chat = format!("session:{bob_id}");
    log(
        &site,
        vec![
            limits(
                Scope::Project,
                "p1",
                Limits {
                    rpm: Some(60),
                    tpm: Some(20_000),
                    budget_micros: Some(5_000_000),
                    period: Some(Period::Month),
                    models: Some(vec!["tiny".into()]),
                },
            ),
            limits(
                Scope::Team,
                "t1",
                Limits {
                    rpm: Some(600),
                    ..Limits::default()
                },
            ),
            key("ada-laptop", "laptop", Some(&ada_id)),
            key("ada-phone", "phone", Some(&ada_id)),
            key("bob-key", "bobs-secret-project", Some(&bob_id)),
            key("ops-key", "ops-ci", None),
            limits(
                Scope::Key,
                "ada-phone",
                Limits {
                    rpm: Some(5),
                    ..Limits::default()
                },
            ),
            served(&[
                ("ada-laptop", now, 100, 20),
                ("ada-laptop", now, 100, 20),
                (&ada_chat, now, 30, 5),
                ("ada-phone", now, 7, 3),
                (&ada_chat, yesterday, 50, 0),
                // Last month: ever, but neither today nor this month.
                ("ada-laptop", month_start - DAY_MS, 1000, 0),
                ("bob-key", now, 1200, 34),
                (&bob_chat, now, 999, 0),
                ("ops-key", now, 500, 0),
            ]),
        ],
    )
    .await;

    let page = ada.get(&site, "/profile/usage").await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let body = &page.body;
    // How far behind the figures may be is the operators' setting
    // (`auth.flush_interval`): the page said a minute whatever it was.
    assert!(
        body.contains("up to one usage flush behind") && !body.contains("a minute behind"),
        "{body}"
    );
    let (chat_month, chat_month_tokens, chat_month_spend) = if yesterday_this_month {
        ("2", "85", "0.085000")
    } else {
        ("1", "35", "0.035000")
    };
    // today: requests, tokens, spend; this month: the same; ever:
    // requests, spend.
    assert_eq!(
        figures(body, "use-key-ada-laptop"),
        [
            "2", "240", "0.240000", "2", "240", "0.240000", "3", "1.240000"
        ]
    );
    assert_eq!(
        figures(body, "use-key-ada-phone"),
        [
            "1", "10", "0.010000", "1", "10", "0.010000", "1", "0.010000"
        ]
    );
    assert_eq!(
        figures(body, "use-chat"),
        [
            "1",
            "35",
            "0.035000",
            chat_month,
            chat_month_tokens,
            chat_month_spend,
            "2",
            "0.085000"
        ]
    );
    let (month, month_tokens, month_spend) = if yesterday_this_month {
        ("5", "335", "0.335000")
    } else {
        ("4", "285", "0.285000")
    };
    assert_eq!(
        figures(body, "use-total"),
        [
            "4",
            "285",
            "0.285000",
            month,
            month_tokens,
            month_spend,
            "6",
            "1.335000"
        ],
        "keys and chat together"
    );
    assert!(body.contains("laptop") && body.contains("phone"), "{body}");

    // The limits: the project's on the chat and the laptop; the phone's
    // own rate beside them. The project's budget counts everyone in it.
    let shared = section(body, "limits-1");
    assert!(
        shared.contains("your chat on these pages") && shared.contains("the key laptop"),
        "{shared}"
    );
    assert!(!shared.contains("the key phone"), "{shared}");
    assert!(
        shared.contains("<td class=\"limit-rpm\">60</td>"),
        "{shared}"
    );
    assert!(
        shared.contains("<td class=\"limit-tpm\">20,000</td>"),
        "{shared}"
    );
    assert!(
        shared.contains("<td class=\"limit-models\">tiny</td>"),
        "{shared}"
    );
    assert!(
        shared.contains("team t1") && shared.contains("600"),
        "{shared}"
    );
    // Everything spent in p1 this month: ada's, bob's and the operators'.
    let p1_month =
        335_000 + 1_234_000 + 999_000 + 500_000 - 50_000 * i64::from(!yesterday_this_month);
    let spent = format!("{}.{:04}", p1_month / 1_000_000, p1_month % 1_000_000 / 100);
    let left = 5_000_000 - p1_month;
    let left = format!("{}.{:04}", left / 1_000_000, left % 1_000_000 / 100);
    assert!(
        shared.contains(&format!("<td class=\"num budget-spent\">{spent}</td>"))
            && shared.contains(&format!("<td class=\"num budget-left\">{left}</td>"))
            && shared.contains("a month (UTC)"),
        "{spent} of 5.0000 spent, {left} left: {shared}"
    );
    let phone = section(body, "limits-2");
    assert!(
        phone.contains("the key phone") && phone.contains("<td class=\"limit-rpm\">5</td>"),
        "{phone}"
    );

    // The chart by day has today's requests (keys and chat).
    let today = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(now)
        .expect("now")
        .format("%m-%d");
    assert!(
        body.contains(&format!("<title>{today} · you: 4</title>")),
        "{body}"
    );

    // Nothing of anyone else: not bob's key, id or figures, nor the
    // operators' key.
    let text = without_charts(body);
    for theirs in [
        "bobs-secret-project",
        "bob-key",
        bob_id.as_str(),
        "1,234",
        "1.234000",
        "999",
        "ops-ci",
        "ops-key",
    ] {
        assert!(!text.contains(theirs), "{theirs} shown to ada: {text}");
    }

    // The profile sums it up and links here.
    let profile = ada.get(&site, "/profile").await;
    assert_eq!(
        figures(&profile.body, "used-today"),
        ["4", "285", "0.285000"],
        "{}",
        profile.body
    );
    assert_eq!(
        figures(&profile.body, "used-month"),
        [month, month_tokens, month_spend]
    );
    assert!(profile.body.contains("href=\"/profile/usage\""));

    // Bob sees his own, and nothing of ada's.
    let his = bob.get(&site, "/profile/usage").await;
    assert_eq!(
        figures(&his.body, "use-total"),
        [
            "2", "2,233", "2.233000", "2", "2,233", "2.233000", "2", "2.233000"
        ]
    );
    for hers in ["laptop", "phone", "ada-laptop", ada_id.as_str(), "0.2400"] {
        assert!(
            !his.body.contains(hers),
            "{hers} shown to bob: {}",
            his.body
        );
    }

    // Signed out, the page asks for a sign-in.
    let stranger = Browser::default().get(&site, "/profile/usage").await;
    assert_eq!(stranger.status, StatusCode::SEE_OTHER);
}
