//! (being written)

use std::sync::Arc;

use axum::Router;

use crate::Web;

pub(crate) fn routes() -> Router<Arc<Web>> {
    Router::new()
}
