//! E2B's control-plane REST API (not yet served: issue 15).

use crate::Daemon;
use axum::Router;
use std::sync::Arc;

/// The control-plane routes (none yet).
pub fn router(_d: Arc<Daemon>) -> Router {
    Router::new()
}
