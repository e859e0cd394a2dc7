//! `events usage`: what the log says was used, added up by key, project,
//! person, model or day over a window; a table, CSV or JSON lines, for
//! chargeback and for checking a bill against the log itself.

use std::collections::BTreeMap;
use std::io::Write;

use chrono::{DateTime, Duration, Utc};
use clap::ValueEnum;
use llmgw_domain::Event;
use llmgw_domain::tenancy::TenancyEvent;
use llmgw_eventstore::{AnyStore, EventFilter, EventStore};
use llmgw_projections::OPERATORS;
use serde::Serialize;

use crate::Outcome;
use crate::output::{Table, json_line};

/// What a row of the report stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub(crate) enum By {
    Key,
    Project,
    /// The model that served (a fallback's, when one did): what was charged.
    Model,
    /// The UTC day.
    Day,
    /// The person a request counts for, as the admin usage page counts
    /// them: their own keys (`keys create --owner`, or made on their
    /// profile) and their chat on the pages (`session:<id>`) together;
    /// keys made without an owner together as [`OPERATORS`].
    Person,
}

impl By {
    fn header(self) -> &'static str {
        match self {
            By::Key => "KEY",
            By::Project => "PROJECT",
            By::Model => "MODEL",
            By::Day => "DAY",
            By::Person => "PERSON",
        }
    }

    fn name(self) -> &'static str {
        match self {
            By::Key => "key",
            By::Project => "project",
            By::Model => "model",
            By::Day => "day",
            By::Person => "person",
        }
    }
}

/// A moment as the options take it: a time or a date (as `events diff`
/// reads them), or a span back from now (`30s`, `10m`, `24h`, `7d`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Moment {
    first: DateTime<Utc>,
    last: DateTime<Utc>,
}

impl std::str::FromStr for Moment {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // Checked throughout: the number is anyone's to type.
        let ago = |n: &str, unit: fn(i64) -> Option<Duration>| {
            let back = unit(n.parse::<u32>().ok()?.into())?;
            let at = Utc::now().checked_sub_signed(back)?;
            Some(Moment {
                first: at,
                last: at,
            })
        };
        let relative = match s.char_indices().last() {
            Some((i, 's')) => ago(&s[..i], Duration::try_seconds),
            Some((i, 'm')) => ago(&s[..i], Duration::try_minutes),
            Some((i, 'h')) => ago(&s[..i], Duration::try_hours),
            Some((i, 'd')) => ago(&s[..i], Duration::try_days),
            _ => None,
        };
        relative
            .or_else(|| {
                llmgw_projections::parse_span(s).map(|(first, last)| Moment { first, last })
            })
            .ok_or_else(|| {
                format!(
                    "{s:?} is not a time: 2026-12-01T10:00:00Z, \"2026-12-01 10:00:00\" in UTC, a date, or a span back from now (30s, 10m, 24h, 7d)"
                )
            })
    }
}

/// Usage events read at a time: each holds a flush's rows (hundreds, up
/// to `MAX_BATCH_ROWS`), all decoded at once.
const PAGE: usize = 16;

/// One row's sums.
#[derive(Debug, Default, Clone, Serialize)]
struct Sums {
    requests: u64,
    /// Answered with a status of 400 or more (499: the client left).
    errors: u64,
    prompt_tokens: u64,
    completion_tokens: u64,
    cost_micros: u64,
}

impl Sums {
    fn add(&mut self, u: &llmgw_domain::usage::UsageRecorded) {
        self.requests += 1;
        self.errors += u64::from(u.status >= 400);
        self.prompt_tokens = self.prompt_tokens.saturating_add(u.prompt_tokens);
        self.completion_tokens = self.completion_tokens.saturating_add(u.completion_tokens);
        self.cost_micros = self.cost_micros.saturating_add(u.cost_micros);
    }

    fn merge(&mut self, o: &Sums) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.prompt_tokens = self.prompt_tokens.saturating_add(o.prompt_tokens);
        self.completion_tokens = self.completion_tokens.saturating_add(o.completion_tokens);
        self.cost_micros = self.cost_micros.saturating_add(o.cost_micros);
    }

    fn cells(&self) -> [String; 6] {
        [
            self.requests.to_string(),
            self.errors.to_string(),
            self.prompt_tokens.to_string(),
            self.completion_tokens.to_string(),
            self.cost_micros.to_string(),
            usd(self.cost_micros),
        ]
    }
}

/// Micro-dollars as dollars, exactly.
fn usd(micros: u64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

const SUM_HEADER: [&str; 6] = [
    "REQUESTS",
    "ERRORS",
    "PROMPT_TOKENS",
    "COMPLETION_TOKENS",
    "COST_MICROS",
    "COST_USD",
];

pub(crate) enum Format {
    Table,
    Csv,
    Json,
}

pub(crate) async fn report(
    store: &AnyStore,
    since: Option<Moment>,
    until: Option<Moment>,
    by: &[By],
    format: Format,
) -> anyhow::Result<Outcome> {
    // In the order asked, each once.
    let mut by = by.to_vec();
    let mut seen = Vec::new();
    by.retain(|b| {
        let first = !seen.contains(b);
        seen.push(*b);
        first
    });
    let from = since.map(|m| m.first);
    let to = until.map(|m| m.last);
    if let (Some(f), Some(t)) = (from, to)
        && f > t
    {
        return Err(crate::config::ConfigError(format!(
            "--since ({f}) is after --until ({t}): nothing lies between them"
        ))
        .into());
    }
    let rows = sums(store, from, to, &by).await?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match format {
        Format::Json => {
            for (groups, s) in &rows {
                let mut line = serde_json::Map::new();
                for (b, g) in by.iter().zip(groups) {
                    line.insert(b.name().into(), g.clone().into());
                }
                if let serde_json::Value::Object(sums) = serde_json::to_value(s)? {
                    line.extend(sums);
                }
                line.insert("cost_usd".into(), usd(s.cost_micros).into());
                json_line(&mut out, &line)?;
            }
        }
        Format::Csv => {
            let header = by
                .iter()
                .map(|b| b.name().to_owned())
                .chain(SUM_HEADER.iter().map(|h| h.to_ascii_lowercase()));
            writeln!(out, "{}", header.collect::<Vec<_>>().join(","))?;
            for (groups, s) in &rows {
                let cells = groups.iter().map(|g| csv_field(g)).chain(s.cells());
                writeln!(out, "{}", cells.collect::<Vec<_>>().join(","))?;
            }
        }
        Format::Table => {
            if rows.is_empty() {
                eprintln!("no usage recorded in that window");
                return Ok(Outcome::Ok);
            }
            let header = by.iter().map(|b| b.header()).chain(SUM_HEADER);
            let mut t = Table::new(header.collect());
            let mut total = Sums::default();
            for (groups, s) in &rows {
                total.merge(s);
                t.row(groups.iter().cloned().chain(s.cells()).collect());
            }
            if rows.len() > 1 {
                let mut cells = vec!["TOTAL".to_owned()];
                cells.resize(by.len().max(1), String::new());
                t.row(cells.into_iter().chain(total.cells()).collect());
            }
            t.print(&mut out)?;
            if by.contains(&By::Person) && rows.keys().any(|g| g.iter().any(|c| c == OPERATORS)) {
                writeln!(
                    out,
                    "{OPERATORS}: every key made without an owner (an operator's), together"
                )?;
            }
        }
    }
    out.flush()?;
    Ok(Outcome::Ok)
}

/// The sums per group of every request answered in `[from, to]`. A batch
/// is appended after its requests were answered, so one recorded before
/// `from` holds none of them (an hour before it is read, for a gateway's
/// clock ahead of the database's), and one recorded after `to` may.
async fn sums(
    store: &AnyStore,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    by: &[By],
) -> anyhow::Result<BTreeMap<Vec<String>, Sums>> {
    let (from_ms, to_ms) = (
        from.map_or(i64::MIN, |t| t.timestamp_millis()),
        to.map_or(i64::MAX, |t| t.timestamp_millis()),
    );
    let (head, _) = store.head().await?;
    let owners = if by.contains(&By::Person) {
        owners(store, head).await?
    } else {
        BTreeMap::new()
    };
    let mut rows: BTreeMap<Vec<String>, Sums> = BTreeMap::new();
    // The single-row events of logs written before batches, and batches.
    for kind in ["UsageRecorded", "UsageBatchRecorded"] {
        let filter = EventFilter {
            event_type: Some(kind.to_owned()),
            from: from.map(|f| f - Duration::hours(1)),
            ..EventFilter::default()
        };
        each_event(store, &filter, head, PAGE, "the usage event", |event| {
            let Event::Usage(usage) = event else {
                return;
            };
            for u in usage.rows() {
                if !(from_ms..=to_ms).contains(&u.at.0) {
                    continue;
                }
                let group = by.iter().map(|b| group_of(*b, u, &owners)).collect();
                rows.entry(group).or_default().add(u);
            }
        })
        .await?;
    }
    Ok(rows)
}

/// Each person's own keys (key id → person id), from the keys issued up
/// to `head`: a key's owner is set when it is made and never changes.
async fn owners(store: &AnyStore, head: u64) -> anyhow::Result<BTreeMap<String, String>> {
    let filter = EventFilter {
        event_type: Some("KeyIssued".to_owned()),
        ..EventFilter::default()
    };
    let mut owners = BTreeMap::new();
    each_event(store, &filter, head, PAGE * 64, "the key issued", |event| {
        if let Event::Tenancy(TenancyEvent::KeyIssued(k)) = event
            && let Some(owner) = k.owner
        {
            owners.insert(k.key_id, owner);
        }
    })
    .await?;
    Ok(owners)
}

/// Every event `filter` matches up to `head`, newest first, upcast and
/// decoded, read `page` at a time; `what` names one in an error.
async fn each_event(
    store: &AnyStore,
    filter: &EventFilter,
    head: u64,
    page: usize,
    what: &str,
    mut each: impl FnMut(Event),
) -> anyhow::Result<()> {
    let mut below = head + 1;
    while below > 1 {
        let events = store.read_backward_raw(filter, 0..below, page).await?;
        let Some(last) = events.last() else {
            break;
        };
        below = last.position;
        for e in store.upcasters().upcast_all(events)? {
            let event = Event::decode(&e.event_type, e.schema_version, &e.payload)
                .map_err(|err| anyhow::anyhow!("{what} at position {}: {err}", e.position))?;
            each(event);
        }
    }
    Ok(())
}

/// Who a request counts for: the person of a chat, a key's owner, else
/// the operators (a key made without one); `-` for a request without a
/// key (a server without authentication).
fn person_of(key_id: &str, owners: &BTreeMap<String, String>) -> String {
    if key_id.is_empty() {
        return "-".to_owned();
    }
    llmgw_projections::person_of_key(key_id, |k| owners.get(k).map(String::as_str))
        .unwrap_or(OPERATORS)
        .to_owned()
}

fn group_of(
    by: By,
    u: &llmgw_domain::usage::UsageRecorded,
    owners: &BTreeMap<String, String>,
) -> String {
    let or_dash = |s: &str| {
        if s.is_empty() {
            "-".to_owned()
        } else {
            s.to_owned()
        }
    };
    match by {
        By::Key => or_dash(&u.key_id),
        By::Project => or_dash(&u.project_id),
        By::Model => or_dash(&u.model_served),
        By::Person => person_of(&u.key_id, owners),
        By::Day => DateTime::from_timestamp_millis(u.at.0)
            .map_or_else(|| "-".to_owned(), |t| t.format("%Y-%m-%d").to_string()),
    }
}

/// A CSV field, quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_read_times_dates_and_spans_back() {
        let m: Moment = "2026-12-01".parse().unwrap();
        assert_eq!(m.first.to_rfc3339(), "2026-12-01T00:00:00+00:00");
        assert!(m.last > m.first, "a date is its whole day");
        let m: Moment = "7d".parse().unwrap();
        let back = Utc::now() - m.first;
        assert!(back >= Duration::days(7) && back < Duration::days(7) + Duration::minutes(1));
        let m: Moment = "10m".parse().unwrap();
        let back = Utc::now() - m.first;
        assert!(back >= Duration::minutes(10) && back < Duration::minutes(11));
        let m: Moment = "90s".parse().unwrap();
        let back = Utc::now() - m.first;
        assert!(back >= Duration::seconds(90) && back < Duration::seconds(150));
        for garbage in ["last week", "10x", "m", "1.5h"] {
            let e = garbage.parse::<Moment>().unwrap_err();
            assert!(e.contains("30s, 10m, 24h, 7d"), "{e}");
        }
        // Too far back, or forward, is no time rather than a panic.
        for far in ["99999999999999999d", "4000000000d", "-5d"] {
            assert!(far.parse::<Moment>().is_err(), "{far}");
        }
        assert_eq!(usd(1_234_567), "1.234567");
        assert_eq!(usd(7), "0.000007");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"x\""), "\"say \"\"x\"\"\"");
    }

    #[test]
    fn a_request_counts_for_its_chats_person_its_keys_owner_or_the_operators() {
        let owners = BTreeMap::from([("key-g".to_owned(), "usr-g".to_owned())]);
        assert_eq!(person_of("session:usr-h", &owners), "usr-h");
        assert_eq!(person_of("key-g", &owners), "usr-g");
        assert_eq!(person_of("key-ops", &owners), OPERATORS);
        assert_eq!(person_of("", &owners), "-");
    }
}
