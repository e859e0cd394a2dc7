//! Stage one and three: who asks, and whether they may go now. The key
//! (when authentication is on) is checked before the body is read; once
//! the model is resolved, the request's rates are charged at every level
//! and it waits, bounded, for its band's turn.

use std::sync::Arc;

use axum::http::HeaderMap;
use llmgw_domain::tenancy::Band;
use llmgw_projections::KeyEntry;

use crate::limits::Charge;
use crate::routes::Routes;
use crate::{ApiError, Gateway};

/// Who is asking, from the headers alone.
#[derive(Debug)]
pub(crate) struct Caller {
    /// None when authentication is off.
    pub(crate) key: Option<Arc<KeyEntry>>,
    band_header: Option<String>,
    /// The session header's value, for session affinity.
    pub(crate) session: Option<String>,
}

impl Caller {
    /// A caller with no headers: `key` is whom it stands for.
    pub(crate) fn standing_for(key: Option<KeyEntry>) -> Self {
        Caller {
            key: key.map(Arc::new),
            band_header: None,
            session: None,
        }
    }
}

/// The key in the headers, or the one refusal for every failure; a
/// browser page on a foreign origin is refused first, key or none
/// ([`crate::cors::foreign_origin`]).
pub(crate) fn identify(gw: &Gateway, headers: &HeaderMap) -> Result<Caller, ApiError> {
    if let Some(refused) = crate::cors::foreign_origin(gw, headers) {
        return Err(refused);
    }
    let key = match &gw.keys {
        Some(directory) => Some(directory.authenticate(headers)?),
        None => None,
    };
    let text = |name: &str| {
        headers
            .get(name)
            .map(|v| v.to_str().unwrap_or("?").to_owned())
    };
    Ok(Caller {
        key,
        band_header: text("x-llmgw-band"),
        session: text(&gw.config.session_header),
    })
}

/// A request let through: its band, the tokens charged for it, and the
/// model of the plan it goes to first (an index into the models admitted
/// against).
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) band: Band,
    pub(crate) charge: Charge,
    pub(crate) model: usize,
}

/// Charges the request's rates (every level must admit it) and waits for
/// its band's turn on the pool of the first of `models` (the plan's, in
/// order) with room for it: a model held back goes to a fallback that
/// has room rather than wait or be refused.
pub(crate) async fn admit(
    gw: &Gateway,
    routes: &Routes,
    caller: &Caller,
    models: &[&str],
    estimate: u64,
) -> Result<Admitted, ApiError> {
    // With authentication off the header picks the band; with it on, the
    // key does, so that clients cannot promote themselves.
    let band = match (&caller.key, &caller.band_header) {
        (Some(k), _) => k.band,
        (None, None) => gw.admission.config.default_band,
        (None, Some(b)) => Band::parse(b).ok_or_else(|| {
            ApiError::bad_request(format!(
                "unknown band {b:?}: bronze, silver, gold or platinum"
            ))
        })?,
    };
    let charge = match &caller.key {
        Some(k) => gw
            .rates
            .admit(&k.limits.rates, estimate, tokio::time::Instant::now())
            .map_err(ApiError::rate_limited)?,
        None => Charge::default(),
    };
    // Held back (or the client left while waiting): not served, so its
    // request and tokens are given back.
    let mut held = GiveBack(gw, caller.key.as_deref(), Some(charge));
    let cfg = &gw.admission.config;
    let saturation = |i: usize| {
        let model = models.get(i)?;
        match gw
            .endpoints
            .saturation_of(model, cfg.waiting_ceiling, cfg.kv_ceiling)
        {
            Some(s) => Some(s),
            // The model asked for without an endpoint to take it: let
            // through, for the stages after to start it or say why not.
            None if i == 0 => Some(0.0),
            // A fallback started on demand has all its room ahead of it;
            // any other without an endpoint cannot take the request.
            None => (routes.on_demand(model) && !gw.fits_nowhere(model)).then_some(0.0),
        }
    };
    let Ok(model) = (gw.admission)
        .admit_first(band, models.len().max(1), saturation)
        .await
    else {
        let name = band.name();
        gw.metrics.rejected(name);
        return Err(ApiError::overloaded(name));
    };
    let charge = held.2.take().unwrap_or_default();
    Ok(Admitted {
        band,
        charge,
        model,
    })
}

/// The charge to give back, with the key whose levels it was charged at.
struct GiveBack<'a>(&'a Gateway, Option<&'a KeyEntry>, Option<Charge>);

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        if let (Some(key), Some(c)) = (self.1, &self.2) {
            let now = tokio::time::Instant::now();
            self.0.rates.refund(&key.limits.rates, c, now);
        }
    }
}
