//! API errors: a status and a `{code, detail}` body. 4xx codes are stable; 5xx bodies say
//! nothing internal (the cause is logged where it happens).

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::service::QueueError;

/// `Retry-After` of 429 QUEUE_FULL: places free up as the pump admits and evicts, a few
/// ticks at a time; sooner retries only add load.
const QUEUE_FULL_RETRY_AFTER_S: u64 = 5;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub detail: String,
    /// Seconds for `Retry-After`, on answers a client should retry later (429, 503).
    pub retry_after_s: Option<u64>,
}

#[derive(Serialize)]
struct Body<'a> {
    code: &'a str,
    detail: &'a str,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self { status, code, detail: detail.into(), retry_after_s: None }
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds.max(1));
        self
    }

    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST", detail)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, Json(Body { code: self.code, detail: &self.detail })).into_response();
        if let Some(s) = self.retry_after_s {
            resp.headers_mut().insert(header::RETRY_AFTER, s.into());
        }
        resp
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Full(_) => Self::new(StatusCode::TOO_MANY_REQUESTS, "QUEUE_FULL", e.to_string())
                .retry_after(QUEUE_FULL_RETRY_AFTER_S),
            QueueError::NotInQueue(_) => Self::new(StatusCode::NOT_FOUND, "NOT_IN_QUEUE", e.to_string()),
        }
    }
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", "this route does not take that method")
}
