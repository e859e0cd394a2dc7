//! Printing for operators: aligned tables for people, JSON for scripts.

use std::io::Write;

use llmgw_eventstore::RecordedEvent;
use serde::Serialize;

pub(crate) fn json_line<T: Serialize>(out: &mut impl Write, value: &T) -> anyhow::Result<()> {
    serde_json::to_writer(&mut *out, value)?;
    out.write_all(b"\n")?;
    Ok(())
}

/// A table whose columns are as wide as their widest cell.
pub(crate) struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(header: Vec<&'static str>) -> Self {
        Table {
            header,
            rows: Vec::new(),
        }
    }

    /// A row; stored text in it (a key's name, a person's email, an
    /// operator's name) is printed escaped, never raw to the terminal
    /// (older stores and imported logs may hold what is refused now).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(crate::events::shown::cells(cells));
    }

    pub(crate) fn print(&self, out: &mut impl Write) -> anyhow::Result<()> {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let header: Vec<String> = self.header.iter().map(|h| h.to_string()).collect();
        for row in std::iter::once(&header).chain(&self.rows) {
            let last = row.len().saturating_sub(1);
            let mut line = String::new();
            for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
                if i == last {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}  "));
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

pub(crate) const EVENT_HEADER: [&str; 5] =
    ["POSITION", "RECORDED", "STREAM@VERSION", "TYPE", "PAYLOAD"];

pub(crate) fn event_cells(e: &RecordedEvent) -> Vec<String> {
    vec![
        e.position.to_string(),
        e.recorded_at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        format!("{}@{}", e.stream_id, e.stream_version),
        format!("{} v{}", e.event_type, e.schema_version),
        shorten(&payload_summary(e), 80),
    ]
}

/// The payload on one line; a usage batch as its row count and totals
/// (its rows are hundreds of records: `events show` or `--json` lists them).
pub(crate) fn payload_summary(e: &RecordedEvent) -> String {
    if let Some((_, rows)) = usage_rows(e) {
        let keys: std::collections::BTreeSet<&str> = rows.iter().map(|u| &*u.key_id).collect();
        let tokens: u64 = (rows.iter())
            .map(|u| u.prompt_tokens.saturating_add(u.completion_tokens))
            .fold(0, u64::saturating_add);
        let micros: u64 = (rows.iter().map(|u| u.cost_micros)).fold(0, u64::saturating_add);
        let errors = rows.iter().filter(|u| u.status >= 400).count();
        return format!(
            "{} rows, {} keys, {tokens} tokens, {micros} micros, {errors} errors",
            rows.len(),
            keys.len(),
        );
    }
    e.payload.to_string()
}

/// A usage batch's gateway and requests, whichever shape it is stored in;
/// None for any other event.
pub(crate) fn usage_rows(
    e: &RecordedEvent,
) -> Option<(String, Vec<llmgw_domain::usage::UsageRecorded>)> {
    use llmgw_domain::Event;
    use llmgw_domain::usage::UsageEvent;
    if e.event_type != "UsageBatchRecorded" {
        return None;
    }
    match Event::decode(&e.event_type, e.schema_version, &e.payload) {
        Ok(Event::Usage(UsageEvent::UsageBatchRecorded(b))) => Some((b.gateway, b.rows)),
        _ => None,
    }
}

/// A batch's requests, one a line.
pub(crate) fn usage_table(rows: &[llmgw_domain::usage::UsageRecorded]) -> Table {
    let mut t = Table::new(vec![
        "REQUEST", "KEY", "PROJECT", "MODEL", "TOKENS", "MICROS", "STATUS", "MS", "TTFT", "BAND",
        "AT",
    ]);
    for u in rows {
        let model = if u.model_asked == u.model_served {
            u.model_served.to_string()
        } else {
            format!("{} → {}", u.model_asked, u.model_served)
        };
        let at = chrono::DateTime::from_timestamp_millis(u.at.0).map_or_else(
            || u.at.0.to_string(),
            |t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        );
        t.row(vec![
            u.request_id.clone(),
            u.key_id.to_string(),
            u.project_id.to_string(),
            model,
            format!("{}+{}", u.prompt_tokens, u.completion_tokens),
            u.cost_micros.to_string(),
            u.status.to_string(),
            u.latency_ms.to_string(),
            u.ttft_ms.map_or_else(|| "-".into(), |t| t.to_string()),
            u.band.name().to_owned(),
            at,
        ]);
    }
    t
}

/// One line per event, for `tail --follow` where no table can be aligned.
pub(crate) fn event_line(e: &RecordedEvent) -> String {
    event_cells(e).join("  ")
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// A closed pipe (`llmgw events tail | head`) is how a reader says it has
/// seen enough; it is not an error worth reporting.
pub(crate) fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The error and its causes on one line, skipping a cause whose text the
/// line already holds (database drivers often repeat their message).
pub(crate) fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `users list` printed an email taken before such characters were
    /// refused raw: its escape sequence recoloured the operator's terminal.
    #[test]
    fn a_tables_cells_print_hidden_characters_escaped() {
        let mut t = Table::new(vec!["EMAIL", "NAME"]);
        t.row(vec!["eve\u{1b}]0;pwned\u{7}@x.com".into(), "Eve".into()]);
        let mut out = Vec::new();
        t.print(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("eve\\u{001b}]0;pwned\\u{0007}@x.com"),
            "{text}"
        );
        assert!(!text.contains('\u{1b}'));
    }
}
