//! Extractors that turn path segments and headers into domain types once, answering
//! 400 `INVALID_REQUEST` with a detail for anything malformed.

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;

use super::{ApiError, ErrorCode, SharedState};
use crate::config::{IdentityMode, Settings};
use crate::domain::{QueueTarget, USER_ID_RULE, UserId};
use crate::service::QueueService;
use crate::visitor;

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

/// Who a request is for. `identity.mode = "header"`: the `X-User-Id` header, the shop's id of
/// the buyer, as [`UserId`] takes it (sent twice, the edge layer has already refused the
/// request). `"visitor"`: the visitor the signed cookie or `X-Visitor-Token` names, or a new
/// visitor when neither names one (a forged or altered token included).
pub struct User {
    pub id: UserId,
    /// Visitor mode: the visitor token, and whether the visitor is new (its cookie to be set).
    pub visitor: Option<(String, bool)>,
}

impl FromRequestParts<SharedState> for User {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &SharedState) -> Result<Self, ApiError> {
        match state.service.settings().identity.mode {
            IdentityMode::Header => header_user(&parts.headers).map(|id| User { id, visitor: None }),
            IdentityMode::Visitor => User::visitor(&parts.headers, state),
        }
    }
}

impl User {
    /// The visitor the request names, or a new one (visitor mode).
    pub fn visitor(headers: &HeaderMap, state: &SharedState) -> Result<User, ApiError> {
        if headers.contains_key("x-user-id") {
            return Err(ApiError::invalid(VISITOR_MODE_REFUSES_USER_ID));
        }
        Ok(match visitor_of(headers, &state.service) {
            Some((id, token)) => User { id, visitor: Some((token, false)) },
            None => {
                let mut random = [0u8; 16];
                getrandom::fill(&mut random)
                    .map_err(|e| ApiError::new(ErrorCode::Overloaded, format!("cannot draw a visitor id: {e}")))?;
                let id = visitor::new_id(random);
                // Valid as long as the cookie that carries it: its Max-Age.
                let expires_at = state.service.now_ms() / 1000 + state.service.settings().identity.visitor_ttl_s;
                let token = visitor::sign(state.service.secret(), &id, expires_at);
                User { id, visitor: Some((token, true)) }
            }
        })
    }

    /// Gives a new visitor their cookie.
    pub fn set_cookie(&self, settings: &Settings, mut resp: Response) -> Response {
        if let Some((token, true)) = &self.visitor {
            let cookie = visitor::set_cookie(token, settings.identity.visitor_ttl_s, settings.identity.cookie_secure);
            if let Ok(v) = HeaderValue::from_str(&cookie) {
                resp.headers_mut().append(header::SET_COOKIE, v);
            }
        }
        resp
    }
}

/// Why a request in visitor mode carrying `X-User-Id` is refused: whoever sends it could name
/// any visitor.
pub const VISITOR_MODE_REFUSES_USER_ID: &str = "X-User-Id is not taken with identity.mode = \"visitor\": vq names \
     each visitor itself, in the visitor cookie (__Host-vq_visitor, or vq_visitor when not Secure) or the \
     X-Visitor-Token header";

/// The `X-User-Id` header as a user id.
pub fn header_user(headers: &HeaderMap) -> Result<UserId, ApiError> {
    let raw = headers.get("x-user-id").ok_or_else(|| ApiError::invalid("missing X-User-Id header"))?;
    let text = raw.to_str().map_err(|_| ApiError::invalid(format!("X-User-Id is not a user id: {USER_ID_RULE}")))?;
    text.parse::<UserId>().map_err(|e| ApiError::invalid(format!("X-User-Id: {e}")))
}

/// The visitor `X-Visitor-Token` names, else the first visitor cookie (by the name vq sets:
/// `__Host-vq_visitor` when `Secure`, else `vq_visitor`) that names one, now (the instance's
/// clock corrected to Redis'); with the token.
pub fn visitor_of(headers: &HeaderMap, service: &QueueService) -> Option<(UserId, String)> {
    let now_s = service.now_ms() / 1000;
    let named = |raw: &str| visitor::verify(service.secret(), raw, now_s).map(|id| (id, raw.to_owned()));
    if let Some(v) = headers.get(visitor::HEADER) {
        return named(v.to_str().ok()?);
    }
    let name = visitor::cookie_name(service.settings().identity.cookie_secure);
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| visitor::from_cookie_header(v, name))
        .find_map(named)
}
