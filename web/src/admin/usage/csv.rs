//! `/admin/usage.csv`: the usage page's figures as a spreadsheet takes
//! them, every group (none stacked as "other", the operators' keys
//! together by person) and every bar of the range that had requests, for
//! whoever reconciles it with an invoice. Spend is exact, twice: a whole
//! number of micro-units (`spend_micros`, as `events usage` has
//! `cost_micros`) and the same in units (`spend_units`, six decimals).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use llmgw_projections::Bucket;

use super::{Groups, Shown, UsageQuery, day_of, display_name, shown};
use crate::{Viewer, Web, WebError};

pub(crate) async fn csv(
    State(web): State<Arc<Web>>,
    _viewer: Viewer,
    Query(q): Query<UsageQuery>,
) -> Result<Response, WebError> {
    let Shown {
        by,
        range,
        start,
        end,
        people,
        ..
    } = shown(&web, &q).await?;
    let mut out = format!(
        "start,end,{},name,requests,tokens,errors,spend_micros,spend_units\n",
        by.name()
    );
    {
        let views = web.views();
        // (bar's start, group) → the bar's figures.
        let mut cells: BTreeMap<(i64, &String), Bucket> = BTreeMap::new();
        let groups = Groups::of(&views.usage, by, start, end);
        for (id, series) in groups.iter() {
            for (t, b) in series.buckets(range.step_ms, start, end) {
                let bar = start + (t - start).div_euclid(range.step_ms) * range.step_ms;
                cells.entry((bar, id)).or_default().merge(b);
            }
        }
        for ((bar, id), b) in cells.iter().filter(|(_, b)| b.requests > 0) {
            let name = display_name(&views, by, id, &people);
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{}",
                instant(*bar),
                instant(bar + range.step_ms),
                cell(id),
                cell(&name),
                b.requests,
                b.tokens,
                b.errors,
                b.micros,
                units(b.micros),
            );
        }
    }
    let file = format!(
        "llmgw-usage-by-{}-{}-to-{}.csv",
        by.name(),
        range.name,
        day_of(end - 1)
    );
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{file}\""),
            ),
        ],
        out,
    )
        .into_response())
}

/// RFC 3339, UTC, to the second.
fn instant(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// Micro-units as units, exactly: `1234567` → `1.234567`.
fn units(micros: u64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// A field as RFC 4180 has it, quoted when it must be. A name someone
/// chose that starts like a formula (`=`, `+`, `-`, `@`) is read as text
/// by a spreadsheet, not run.
fn cell(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_owned()
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_quoted_and_formulas_kept_as_text() {
        assert_eq!(cell("acme"), "acme");
        assert_eq!(cell("Acme, Inc."), "\"Acme, Inc.\"");
        assert_eq!(cell("the \"A\" team"), "\"the \"\"A\"\" team\"");
        assert_eq!(cell("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(cell("-1"), "'-1");
        assert_eq!(units(0), "0.000000");
        assert_eq!(units(1_234_567), "1.234567");
        assert_eq!(units(240), "0.000240");
        assert_eq!(instant(86_400_000), "1970-01-02T00:00:00Z");
    }
}
