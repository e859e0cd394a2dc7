//! Usage: one record per finished request, priced by the model that served
//! it. Prices are integer micro-units per 1,000 tokens, each side rounded up
//! on its own, so that no request is ever free by rounding.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::catalog::Price;
use crate::tenancy::Band;
use crate::{Millis, Rejection, UnixMillis};

mod columns;

/// The most requests one usage batch carries (`auth.batch_size` is refused
/// above it): a batch is one event, read whole.
pub const MAX_BATCH_ROWS: usize = 100_000;

pub(crate) use columns::Rows as BatchRowsV1;

impl Price {
    pub const ZERO: Price = Price {
        prompt_per_1k: 0,
        completion_per_1k: 0,
    };

    /// A zero-priced model is exempt from budgets: this is what lets a key
    /// whose budget is spent still be served a cheap fallback.
    pub fn is_zero(&self) -> bool {
        self.prompt_per_1k == 0 && self.completion_per_1k == 0
    }

    /// `ceil(p·prompt/1000) + ceil(c·completion/1000)`, exact, saturating
    /// at `u64::MAX` only when the true cost does not fit.
    pub fn cost(&self, prompt_tokens: u64, completion_tokens: u64) -> u64 {
        let side =
            |per_1k: u64, tokens: u64| (u128::from(per_1k) * u128::from(tokens)).div_ceil(1000);
        let total = side(self.prompt_per_1k, prompt_tokens)
            + side(self.completion_per_1k, completion_tokens);
        u64::try_from(total).unwrap_or(u64::MAX)
    }
}

/// A finished request, as recorded. No prompt or completion text: that is
/// not an event (an immutable log cannot honour a retention window).
///
/// The names are shared, not owned: a gateway's record takes them from
/// its key and its routing table, and a batch read back gives each of its
/// distinct names once to every row that names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecorded {
    pub request_id: String,
    pub key_id: Arc<str>,
    pub project_id: Arc<str>,
    pub model_asked: Arc<str>,
    pub model_served: Arc<str>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cost_micros: u64,
    /// The HTTP status returned to the client.
    pub status: u16,
    pub latency_ms: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<u32>,
    pub band: Band,
    pub at: UnixMillis,
}

/// The requests one gateway finished since its last flush, appended as
/// one event: a busy gateway writes one event per flush, not one per
/// request, and the log's per-event cost (ids, hash, positions, indexes) is
/// paid once for all its rows. Stored column by column (schema version 2,
/// [`columns`]); version 1's list of rows still reads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "columns::Columns<String>")]
pub struct UsageBatchRecorded {
    /// The gateway that served the requests (its writer name); the batch's
    /// stream is `usage-batches-<gateway>`.
    pub gateway: String,
    pub rows: Vec<UsageRecorded>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum UsageEvent {
    /// One request per event: how usage was written before batches. No
    /// longer appended, still read (as a batch of one, [`UsageEvent::rows`])
    /// so that older logs replay to the same views.
    UsageRecorded(UsageRecorded),
    UsageBatchRecorded(UsageBatchRecorded),
}

impl UsageEvent {
    /// The requests the event records, whichever its shape: what every
    /// reader of usage goes through.
    pub fn rows(&self) -> &[UsageRecorded] {
        match self {
            UsageEvent::UsageRecorded(u) => std::slice::from_ref(u),
            UsageEvent::UsageBatchRecorded(b) => &b.rows,
        }
    }
}

/// A request the gateway finished, with the price it was served at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FinishedRequest {
    pub request_id: String,
    pub key_id: Arc<str>,
    pub project_id: Arc<str>,
    pub model_asked: Arc<str>,
    pub model_served: Arc<str>,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub status: u16,
    pub latency_ms: u32,
    pub ttft_ms: Option<u32>,
    pub band: Band,
    pub at: UnixMillis,
    /// The price of the model that served it, in force when it was
    /// served (what its budgets were charged then): a price changed
    /// before the flush that records it does not reach back.
    pub price: Price,
}

/// Prices a flush's requests, each at its own price, into one batch; a
/// request that cannot be recorded is left out and returned with its
/// reason. `None` when no row is left.
pub fn record_batch(
    gateway: &str,
    requests: impl IntoIterator<Item = FinishedRequest>,
) -> (Option<UsageEvent>, Vec<Rejection>) {
    let mut rows = Vec::new();
    let mut refused = Vec::new();
    for r in requests {
        match row(r) {
            Ok(u) => rows.push(u),
            Err(e) => refused.push(e),
        }
    }
    let batch = (!rows.is_empty()).then(|| {
        UsageEvent::UsageBatchRecorded(UsageBatchRecorded {
            gateway: gateway.to_owned(),
            rows,
        })
    });
    (batch, refused)
}

/// A finished request as a single-row event, the shape older logs hold
/// (gateways append [`record_batch`]; fixtures that stand for older logs
/// use this).
pub fn record(request: FinishedRequest) -> Result<UsageEvent, Rejection> {
    row(request).map(UsageEvent::UsageRecorded)
}

/// Prices a finished request at the price it was served at.
pub fn row(request: FinishedRequest) -> Result<UsageRecorded, Rejection> {
    if request.request_id.is_empty() {
        return Err(Rejection::invalid("a usage record needs a request id"));
    }
    if !(100..=599).contains(&request.status) {
        return Err(Rejection::invalid(format!(
            "{} is not an HTTP status",
            request.status
        )));
    }
    Ok(UsageRecorded {
        cost_micros: request
            .price
            .cost(request.prompt_tokens, request.completion_tokens),
        request_id: request.request_id,
        key_id: request.key_id,
        project_id: request.project_id,
        model_asked: request.model_asked,
        model_served: request.model_served,
        prompt_tokens: request.prompt_tokens,
        completion_tokens: request.completion_tokens,
        status: request.status,
        latency_ms: request.latency_ms,
        ttft_ms: request.ttft_ms,
        band: request.band,
        at: request.at,
    })
}

/// The start of the budget period containing `at` (UTC): midnight for a
/// day, midnight on the 1st for a month.
pub fn period_start(period: crate::tenancy::Period, at: Millis) -> Millis {
    const DAY: i64 = 86_400_000;
    let day_start = at.div_euclid(DAY) * DAY;
    match period {
        crate::tenancy::Period::Day => day_start,
        crate::tenancy::Period::Month => {
            let (y, m, _) = civil_from_days(at.div_euclid(DAY));
            days_from_civil(y, m, 1) * DAY
        }
    }
}

// Howard Hinnant's civil-calendar algorithms: days since 1970-01-01 <-> (y, m, d).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
