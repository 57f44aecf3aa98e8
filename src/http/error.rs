//! API errors: a status and a `{code, detail}` body. 4xx codes are stable; 5xx bodies say
//! nothing internal (the cause is logged where it happens).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::service::QueueError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub detail: String,
}

#[derive(Serialize)]
struct Body<'a> {
    code: &'a str,
    detail: &'a str,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self { status, code, detail: detail.into() }
    }

    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST", detail)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(Body { code: self.code, detail: &self.detail })).into_response()
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Full(_) => Self::new(StatusCode::TOO_MANY_REQUESTS, "QUEUE_FULL", e.to_string()),
            QueueError::NotInQueue(_) => Self::new(StatusCode::NOT_FOUND, "NOT_IN_QUEUE", e.to_string()),
        }
    }
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", "this route does not take that method")
}
