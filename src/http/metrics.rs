//! `GET /metrics` and the middleware that times every request by route template and status.
//!
//! The queue-length gauges are read from Redis at scrape time, so every instance reports the
//! cluster's figures; a Redis failure leaves the last values and still renders the rest.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::SharedState;
use crate::metrics;

/// The route template of a gated purchase, set on its response by the gate, which has matched
/// the canonical path already.
#[derive(Clone)]
pub struct RouteLabel(pub Arc<str>);

/// Times a request; the label is the matched route template (vq's own routes, or the gated
/// route from `gate.routes`), never the raw path. Other forwarded paths are `unmatched`.
pub async fn track(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let matched = req.extensions().get::<MatchedPath>().cloned();
    let resp = next.run(req).await;
    let gated = resp.extensions().get::<RouteLabel>();
    let route = matched.as_ref().map(MatchedPath::as_str).or(gated.map(|l| &*l.0)).unwrap_or("unmatched");
    metrics::http_request(route, resp.status().as_u16(), started.elapsed());
    resp
}

pub async fn render(State(st): State<SharedState>) -> impl IntoResponse {
    if let Err(e) = st.service.record_queue_gauges().await {
        tracing::debug!(error = %e, "queue gauges not refreshed: redis unavailable");
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics::render())
}
