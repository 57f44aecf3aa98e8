//! Extractors that turn path segments and headers into domain types once, answering
//! 400 `INVALID_REQUEST` with a detail for anything malformed.

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;

use super::{ApiError, SharedState};
use crate::domain::{QueueTarget, USER_ID_RULE, UserId};

/// `{kind}/{id}` of `/virtual-queues/{kind}/{id}/…`, a declared target: an undeclared one is
/// answered 404 `UNKNOWN_TARGET` before any handler (or Redis) sees it.
pub struct TargetPath(pub QueueTarget);

impl FromRequestParts<SharedState> for TargetPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &SharedState) -> Result<Self, ApiError> {
        let Path((kind, id)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid(e.body_text()))?;
        let target = QueueTarget::from_path(&kind, &id).map_err(|e| ApiError::invalid(e.to_string()))?;
        if !state.service.is_declared(target) {
            return Err(ApiError::unknown_target(target));
        }
        Ok(TargetPath(target))
    }
}

/// The `X-User-Id` header: the shop's id of the buyer, as [`UserId`] takes it (sent twice, the
/// edge layer has already refused the request).
pub struct User(pub UserId);

impl<S: Send + Sync> FromRequestParts<S> for User {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let raw = parts.headers.get("x-user-id").ok_or_else(|| ApiError::invalid("missing X-User-Id header"))?;
        let text =
            raw.to_str().map_err(|_| ApiError::invalid(format!("X-User-Id is not a user id: {USER_ID_RULE}")))?;
        text.parse::<UserId>().map(User).map_err(|e| ApiError::invalid(format!("X-User-Id: {e}")))
    }
}
