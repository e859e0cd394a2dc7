use chrono::{DateTime, TimeDelta, Utc};
use llmgw_convo::{Convo, Owner};
use llmgw_eventstore::{AnyStore, OpenOptions, StoreAddress};
pub(crate) use llmgw_testkit::Backend;
use llmgw_testkit::Scratch;

pub(crate) const BOTH: [Backend; 2] = [Backend::Sqlite, Backend::Postgres];

pub(crate) fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2025-03-01T09:00:00Z")
        .unwrap()
        .with_timezone(&Utc)
}

pub(crate) fn hours(h: i64) -> DateTime<Utc> {
    t0() + TimeDelta::hours(h)
}

pub(crate) fn owner(project: &str, agent: &str) -> Owner {
    Owner {
        project: project.into(),
        agent: agent.into(),
    }
}

pub(crate) struct Fx {
    pub convo: Convo,
    _scratch: Scratch,
}

impl Fx {
    pub(crate) async fn new(backend: Backend) -> Fx {
        let (address, scratch) = Scratch::new(backend).await;
        let store = AnyStore::open(
            &StoreAddress::parse(&address).unwrap(),
            OpenOptions::migrating(),
        )
        .await
        .unwrap();
        Fx {
            convo: Convo::new(&store),
            _scratch: scratch,
        }
    }
}
