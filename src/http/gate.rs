//! The purchase gate: a reverse proxy in front of the purchase API (`gate.upstream`).
//!
//! Every request path is canonicalised once ([`CanonicalPath`]); a path that servers could
//! read differently is refused with 400. Requests whose canonical path is a gated route
//! (`gate.routes`, any method) need a valid entry token when the flag applies to the user and
//! target; everything else that is not vq's own is forwarded unchecked, so vq can stand in
//! front of the whole app. The upstream receives the canonical path, never the raw one, so
//! what the gate checked is what the purchase API routes on. A request carrying `X-User-Id`
//! or `X-Entry-Token` more than once is refused. `verify.rs` offers the same check to
//! forward-auth proxies (nginx, Caddy, Traefik, Envoy). What the purchase API receives is
//! `forward`'s business.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::edge::RouteLabel;
use super::forward::{ForwardError, Upstream};
use super::{ApiError, ErrorCode, SharedState};
use crate::config::{GateSettings, IdentityMode, SettingError};
use crate::domain::UserId;
use crate::gate::{CanonicalPath, GateRoutes};
use crate::service::{ClaimMode, GateDenial, GatePass, Pace};

/// The gate's routes and the purchase API behind it.
pub struct Gate {
    pub(super) routes: GateRoutes,
    /// `None` without `gate.upstream`.
    upstream: Option<Upstream>,
    /// `gate.close_header`: the purchase API's "sold out" signal, never passed to the buyer.
    close_header: HeaderName,
}

/// Longest close message taken from the purchase API's header.
const CLOSE_MESSAGE_MAX: usize = 200;

impl Gate {
    /// The same checks as loading the settings: a route that does not compile or a close
    /// header that is not a header name is an error, never a fallback.
    pub fn new(settings: &GateSettings, body_timeout: std::time::Duration) -> Result<Self, SettingError> {
        Ok(Self {
            routes: GateRoutes::compile(&settings.routes)?,
            upstream: Upstream::new(settings, body_timeout)?,
            close_header: HeaderName::from_bytes(settings.close_header.as_bytes())
                .map_err(|_| SettingError::CloseHeaderNotAName(settings.close_header.clone()))?,
        })
    }

    /// Takes the close header out of the purchase API's response; returns its message.
    fn take_close(&self, resp: &mut Response) -> Option<String> {
        let value = resp.headers_mut().remove(&self.close_header)?;
        let text = String::from_utf8_lossy(value.as_bytes()).trim().to_owned();
        let message: String = text.chars().take(CLOSE_MESSAGE_MAX).collect();
        Some(if message.is_empty() { crate::service::DEFAULT_CLOSE_MESSAGE.to_owned() } else { message })
    }
}

/// The buyer of a gated request: `X-User-Id`, or in visitor mode the visitor the cookie or
/// `X-Visitor-Token` names (none, or a forged one: nobody, refused as without a user id).
pub(super) fn gate_user(headers: &HeaderMap, st: &SharedState) -> Option<UserId> {
    match st.service.settings().identity.mode {
        IdentityMode::Header => header_str(headers, "x-user-id").and_then(|u| u.parse().ok()),
        IdentityMode::Visitor => super::extract::visitor_of(headers, &st.service).map(|(id, _)| id),
    }
}

pub(super) fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// 429 when the purchase API's budget is taken for every tick the gate may wait for; the token
/// stays usable.
pub(super) fn busy(tick_ms: u64) -> Response {
    let retry_s = tick_ms.div_ceil(1000).max(1);
    let detail = "the purchase API takes one batch per tick and the next ticks are full: retry shortly (your entry token is still valid)";
    let mut resp = ApiError::new(ErrorCode::DownstreamBusy, detail).into_response();
    resp.headers_mut().insert(header::RETRY_AFTER, retry_s.into());
    resp
}

/// The proxy gate's refusal: 403 for a token that does not hold or is used up, 403
/// PURCHASE_LIMIT for a user who made their purchases of the sale, 503 OVERLOADED when this
/// instance could not decide in time (the token stays unused and valid).
pub(super) fn denied(e: &GateDenial) -> ApiError {
    match e {
        GateDenial::Token(t) => ApiError::new(ErrorCode::QueueBypassDenied, t.to_string()),
        GateDenial::TokenUsedUp { .. } => ApiError::new(ErrorCode::QueueBypassDenied, e.to_string()),
        GateDenial::PurchaseLimit { .. } => ApiError::new(ErrorCode::PurchaseLimit, e.to_string()),
        GateDenial::Overloaded => ApiError::overloaded(e.to_string()),
        GateDenial::NotRecorded(_) => ApiError::not_replicated(e.to_string()),
        GateDenial::UnknownTarget(t) => ApiError::unknown_target(*t),
        GateDenial::Busy => ApiError::new(ErrorCode::DownstreamBusy, e.to_string()),
    }
}

/// Everything that is not one of vq's own routes.
pub async fn proxy(State(st): State<SharedState>, req: Request) -> Response {
    // A repeated X-User-Id or X-Entry-Token never gets here: the edge layer refuses it.
    let (parts, body) = req.into_parts();
    let path = match CanonicalPath::parse(parts.uri.path()) {
        Ok(p) => p,
        Err(e) => return ApiError::invalid(e.to_string()).into_response(),
    };
    if let Some(why) = super::forward::framing_refusal(&parts.headers) {
        return ApiError::invalid(why).into_response();
    }
    // The metrics label of a gated purchase is its route's template, whatever the spelling.
    let label = st.gate.routes.template(&path).cloned();
    let mut resp = gate_and_forward(&st, parts, path, body).await;
    if let Some(template) = label {
        resp.extensions_mut().insert(RouteLabel(template));
    }
    resp
}

/// The gate's decision on a canonical path, then the purchase API's answer.
async fn gate_and_forward(st: &SharedState, mut parts: Parts, path: CanonicalPath, body: Body) -> Response {
    let buyer = gate_user(&parts.headers, st);
    if st.service.settings().identity.mode == IdentityMode::Visitor {
        // The purchase API learns the visitor from vq, never from the client.
        parts.headers.remove("x-user-id");
        if let Some(id) = buyer.as_ref().and_then(|u| HeaderValue::from_str(u.as_str()).ok()) {
            parts.headers.insert("x-user-id", id);
        }
    }
    let mut paced_target = None;
    let mut route_target = None;
    // Whose valid token let the purchase through: the only buyers the adaptive outflow hears.
    let mut token_buyer = None;
    let claim = match st.gate.routes.match_path(&path) {
        None if path.is_queue_api() || st.gate.upstream.is_none() => {
            return ApiError::new(ErrorCode::NotFound, "no such route").into_response();
        }
        None => None,
        Some(Err(e)) => return ApiError::invalid(e.to_string()).into_response(),
        Some(Ok(target)) => {
            route_target = Some(target);
            let token = header_str(&parts.headers, "x-entry-token");
            match st.service.gate_check(target, buyer.clone(), token, ClaimMode::Claim).await {
                Ok(GatePass::FlagOff) => None,
                Ok(GatePass::Verified { claim }) => {
                    paced_target = Some(target);
                    token_buyer = buyer;
                    claim
                }
                Err(GateDenial::Busy) => return busy(st.service.settings().queue.tick_ms),
                Err(e) => return denied(&e).into_response(),
            }
        }
    };
    if let Some(target) = paced_target {
        match st.service.pace_purchase(target, claim.as_ref()).await {
            Pace::Now => {}
            Pace::Full => {
                if let Some(claim) = claim {
                    st.service.settle_claim(claim, false).await;
                }
                return busy(st.service.settings().queue.tick_ms);
            }
        }
    }
    let Some(upstream) = &st.gate.upstream else {
        return ApiError::new(
            ErrorCode::UpstreamUnavailable,
            "no purchase API behind the gate: set gate.upstream (VQ_GATE__UPSTREAM)",
        )
        .into_response();
    };
    let sent = std::time::Instant::now();
    let sent_tick = st.service.purchase_tick();
    let forwarded = upstream.forward(parts, &path, body).await;
    // The client's fault (a body framed wrongly, cut short or stalled): no answer of the
    // purchase API, neither for the record nor for the adaptive outflow.
    let client_fault = matches!(forwarded, Err(ForwardError::ClientBody(_) | ForwardError::Path));
    // The purchase API's time, without the client's upload.
    let took = forwarded.as_ref().map_or_else(|_| sent.elapsed(), |(_, took)| *took);
    let mut result = forwarded.map(|(r, _)| r).map_err(|e| upstream.error(e));
    let status = result.as_ref().ok().map(|r| r.status().as_u16());
    // The purchase's count in the target's record: settled with the claim, or on its own.
    let recorded = paced_target.filter(|_| !client_fault);
    if let (Some(target), None) = (recorded, &claim) {
        st.service.record_purchase(target, sent_tick, status);
    }
    if let (Some(target), Some(buyer)) = (paced_target, token_buyer)
        && !client_fault
    {
        // For the adaptive outflow, as this buyer's: failed (5xx, 429, timed out, not reached)
        // and backing off (503, 429, Retry-After).
        let (error, backoff) = match &result {
            Ok(r) => {
                let s = r.status();
                let busy = s == StatusCode::TOO_MANY_REQUESTS;
                let retry = r.headers().contains_key(header::RETRY_AFTER);
                (s.is_server_error() || busy, busy || s == StatusCode::SERVICE_UNAVAILABLE || retry)
            }
            Err(_) => (true, false),
        };
        st.service.observe_purchase(target, buyer, took, error, backoff);
    }
    if let Ok(resp) = &mut result
        && let Some(message) = st.gate.take_close(resp)
        && let Some(target) = route_target
    {
        st.service.close_by_purchase_api(target, message).await;
    }
    if let Some(claim) = claim {
        if recorded.is_some() {
            st.service.settle_purchase(claim, sent_tick, status).await;
        } else {
            let succeeded = result.as_ref().is_ok_and(|r| r.status().is_success());
            st.service.settle_claim(claim, succeeded).await;
        }
    }
    result.unwrap_or_else(IntoResponse::into_response)
}
