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

/// `Retry-After` of 503 OVERLOADED: the instance sheds for as long as it cannot keep up,
/// which is usually a moment; the buyer keeps their place meanwhile.
pub const OVERLOADED_RETRY_AFTER_S: u64 = 1;

/// `Retry-After` of 503 QUEUE_UNAVAILABLE (Redis down, `queue.on_store_failure = "closed"`).
const QUEUE_UNAVAILABLE_RETRY_AFTER_S: u64 = 2;

/// Every error code vq answers with, and its HTTP status: the one place that pairs them.
/// 4xx codes are stable (clients and docs/openapi.json name them): each is its variant's name
/// in SCREAMING_SNAKE_CASE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumIter)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    InvalidRequest,
    NotInQueue,
    UnknownTarget,
    QueueFull,
    TooManyQueues,
    StoreUnavailable,
    Overloaded,
    QueueUnavailable,
    QueueBypassDenied,
    DownstreamBusy,
    UpstreamUnavailable,
    UpstreamTimeout,
    NotFound,
    MethodNotAllowed,
    PowRefused,
    PurchaseLimit,
    LaneCodeInvalid,
    LaneCodeUsed,
    LaneClaimInvalid,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn status(self) -> StatusCode {
        match self {
            Self::InvalidRequest => StatusCode::BAD_REQUEST,
            Self::NotInQueue => StatusCode::NOT_FOUND,
            Self::UnknownTarget => StatusCode::NOT_FOUND,
            Self::QueueFull => StatusCode::TOO_MANY_REQUESTS,
            Self::TooManyQueues => StatusCode::CONFLICT,
            Self::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Self::QueueUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::QueueBypassDenied => StatusCode::FORBIDDEN,
            Self::DownstreamBusy => StatusCode::TOO_MANY_REQUESTS,
            Self::UpstreamUnavailable => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::PowRefused => StatusCode::FORBIDDEN,
            Self::PurchaseLimit => StatusCode::FORBIDDEN,
            Self::LaneCodeInvalid => StatusCode::FORBIDDEN,
            Self::LaneCodeUsed => StatusCode::CONFLICT,
            Self::LaneClaimInvalid => StatusCode::FORBIDDEN,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
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
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Self { code, detail: detail.into(), retry_after_s: None }
    }

    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds.max(1));
        self
    }

    pub fn invalid(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, detail)
    }

    /// 404 UNKNOWN_TARGET: no queue answers for this target (nobody declared it).
    pub fn unknown_target(target: crate::domain::QueueTarget) -> Self {
        Self::new(
            ErrorCode::UnknownTarget,
            format!("there is no queue for {target}: the target is not declared (vq target add)"),
        )
    }

    /// 503 QUEUE_UNAVAILABLE: a token issued or a purchase's claim could not be recorded to
    /// last (the replicas did not confirm it in time, `redis.wait_replicas`; at the gate also
    /// Redis out of memory); nothing was handed out or forwarded.
    pub fn not_replicated(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::QueueUnavailable, detail).retry_after(QUEUE_UNAVAILABLE_RETRY_AFTER_S)
    }

    /// 503 OVERLOADED: this instance cannot keep up right now; nothing was decided.
    pub fn overloaded(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::Overloaded, detail).retry_after(OVERLOADED_RETRY_AFTER_S)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp =
            (self.code.status(), Json(Body { code: self.code.as_str(), detail: &self.detail })).into_response();
        if let Some(s) = self.retry_after_s {
            resp.headers_mut().insert(header::RETRY_AFTER, s.into());
        }
        resp
    }
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Full(_) => Self::new(ErrorCode::QueueFull, e.to_string()).retry_after(QUEUE_FULL_RETRY_AFTER_S),
            QueueError::NotInQueue(_) => Self::new(ErrorCode::NotInQueue, e.to_string()),
            QueueError::Overloaded => Self::overloaded(e.to_string()),
            QueueError::TooManyQueues { .. } => Self::new(ErrorCode::TooManyQueues, e.to_string()),
            QueueError::LaneCodeInvalid(_) => Self::new(ErrorCode::LaneCodeInvalid, e.to_string()),
            QueueError::LaneCodeUsed => Self::new(ErrorCode::LaneCodeUsed, e.to_string()),
            QueueError::LaneClaimInvalid(_) => Self::new(ErrorCode::LaneClaimInvalid, e.to_string()),
            QueueError::Unavailable => {
                Self::new(ErrorCode::QueueUnavailable, e.to_string()).retry_after(QUEUE_UNAVAILABLE_RETRY_AFTER_S)
            }
            QueueError::NotReplicated => Self::not_replicated(e.to_string()),
        }
    }
}

pub async fn method_not_allowed() -> ApiError {
    ApiError::new(ErrorCode::MethodNotAllowed, "this route does not take that method")
}
