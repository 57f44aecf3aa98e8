//! `GET /metrics` (every request is timed in the edge layer, `edge.rs`).
//!
//! The queue-length gauges are read from Redis at scrape time, so every instance reports the
//! cluster's figures; a Redis failure leaves the last values and still renders the rest.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use super::SharedState;
use crate::metrics;

pub async fn render(State(st): State<SharedState>) -> impl IntoResponse {
    if let Err(e) = st.service.record_queue_gauges().await {
        tracing::debug!(error = %e, "queue gauges not refreshed: redis unavailable");
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], metrics::render())
}
