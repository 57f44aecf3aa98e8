//! The HTTP API: routes, extractors that parse once, and [`ApiError`], the only place that
//! knows status codes. Handlers call the service and shape JSON; nothing else.

pub mod edge;
mod error;
mod extract;
mod forward;
pub mod gate;
mod metrics;
pub mod page;
mod queue;
mod shed;
mod verify;

use std::sync::Arc;

use axum::Router;
use axum::routing::get;

pub use error::{ApiError, ErrorCode};
pub use extract::{TargetPath, User};

use crate::service::QueueService;

/// Everything a handler can reach.
pub struct AppState {
    pub service: Arc<QueueService>,
    pub gate: gate::Gate,
    pub page: page::Page,
}

pub type SharedState = Arc<AppState>;

/// The API's OpenAPI 3.0 document, `docs/openapi.json`, compiled in.
const OPENAPI: &str = include_str!("../../docs/openapi.json");

async fn openapi() -> impl axum::response::IntoResponse {
    ([(axum::http::header::CONTENT_TYPE, "application/json")], OPENAPI)
}

/// The routes; `edge` holds the origins whose web apps may call the queue API and the
/// in-flight bound.
pub fn router(state: SharedState, edge: Arc<edge::Edge>) -> Router {
    Router::new()
        .route("/virtual-queues/{kind}/{id}/entries", axum::routing::post(queue::enter))
        .route("/virtual-queues/{kind}/{id}/entries/me", get(queue::poll).delete(queue::leave))
        .route("/virtual-queues/{kind}/{id}/stats", get(queue::stats))
        .route("/openapi.json", get(openapi))
        .route("/healthz", get(queue::healthz))
        .route("/readyz", get(queue::readyz))
        .route("/gate/verify", get(verify::verify))
        .route("/gate/verify/{*original}", get(verify::verify))
        .route("/gate/release", get(verify::release))
        .route("/waiting-room/{kind}/{id}", get(page::waiting_room))
        .fallback(gate::proxy)
        .route("/metrics", get(metrics::render))
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(edge, edge::layer))
        .with_state(state)
}
