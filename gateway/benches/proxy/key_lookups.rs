//! `--key-lookups`: what finding a request's key costs, from the key cache
//! and when the cache was emptied by a change of the tenancy view (the
//! key's entry composed again from its limits at four levels), the
//! bench's own key and limits ([`super::tenancy`]). Three rounds.

use std::time::Instant;

use llmgw_domain::Event;
use llmgw_domain::tenancy::TenancyEvent;
use llmgw_gateway::auth::KeyDirectory;
use llmgw_projections::{Stamp, View};

const LOOKUPS: u32 = 200_000;

pub async fn run() {
    let (t, _usage) = super::tenancy().await;
    let keys = KeyDirectory::new(t.views.clone());
    let mut headers = axum::http::HeaderMap::new();
    let bearer = format!("Bearer {}", super::SECRET);
    headers.insert(axum::http::header::AUTHORIZATION, bearer.parse().unwrap());
    // Any tenancy event moves the view's revision; a person signing up
    // changes no key, so every lookup still finds the same entry.
    let change = Event::Tenancy(TenancyEvent::UserSignedUp {
        user_id: "u".into(),
    });
    let stamp = Stamp {
        position: 0,
        recorded_at_ms: 0,
    };
    println!("a request's key looked up (ns a lookup, {LOOKUPS} lookups a round):");
    for round in 1..=3 {
        let started = Instant::now();
        for _ in 0..LOOKUPS {
            std::hint::black_box(keys.authenticate(&headers).unwrap());
        }
        let hit = started.elapsed().as_nanos() as f64 / f64::from(LOOKUPS);
        let started = Instant::now();
        for _ in 0..LOOKUPS {
            let mut views = t.views.write().unwrap();
            views.tenancy.apply_event(stamp, &change);
            drop(views);
            std::hint::black_box(keys.authenticate(&headers).unwrap());
        }
        let miss = started.elapsed().as_nanos() as f64 / f64::from(LOOKUPS);
        println!(
            "round {round}: from the cache {hit:.0} ns; the tenancy view changed before each (composed again) {miss:.0} ns"
        );
    }
}
