//! `GET /metrics` and the middleware that times every request by route template and status.
//!
//! The queue-length gauges are read from Redis at scrape time, so every instance reports the
//! cluster's figures; a Redis failure leaves the last values and still renders the rest.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::SharedState;
use crate::gate::CanonicalPath;
use crate::metrics;

/// Times a request; the label is the matched route template (vq's own routes, or the gated
/// route from `gate.routes`), never the raw path. Other forwarded paths are `unmatched`.
pub async fn track(State(st): State<SharedState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let matched = req.extensions().get::<MatchedPath>().cloned();
    let gated = match matched {
        Some(_) => None,
        None => {
            CanonicalPath::parse(req.uri().path()).ok().and_then(|p| st.gate.routes().template(&p).map(str::to_owned))
        }
    };
    let resp = next.run(req).await;
    let route = matched.as_ref().map(MatchedPath::as_str).or(gated.as_deref()).unwrap_or("unmatched");
    metrics::http_request(route, resp.status().as_u16(), started.elapsed());
    resp
}

pub async fn render(State(st): State<SharedState>) -> impl IntoResponse {
    if let Err(e) = st.service.record_queue_gauges().await {
        tracing::debug!(error = %e, "queue gauges not refreshed: redis unavailable");
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics::render())
}
