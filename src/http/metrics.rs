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
use crate::metrics;

/// Times a request; the label is the matched route template, never the raw path.
pub async fn track(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = req.extensions().get::<MatchedPath>().cloned();
    let resp = next.run(req).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    metrics::http_request(route, resp.status().as_u16(), started.elapsed());
    resp
}

pub async fn render(State(st): State<SharedState>) -> impl IntoResponse {
    if let Err(e) = st.service.record_queue_gauges().await {
        tracing::debug!(error = %e, "queue gauges not refreshed: redis unavailable");
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics::render())
}
