//! The purchase gate: a reverse proxy in front of the purchase API (`gate.upstream`).
//!
//! Requests to a gated route (`gate.routes`) need a valid entry token when the flag applies
//! to the user and target; everything else that is not vq's own is forwarded unchecked, so vq
//! can stand in front of the whole app. `/gate/verify` offers the same check to nginx
//! `auth_request`. Bodies stream both ways; hop-by-hop headers are dropped.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName};
use axum::http::request::Parts;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{ApiError, SharedState};
use crate::config::GateSettings;
use crate::gate::GateRoutes;
use crate::service::{ClaimMode, GatePass, Pace};
use crate::token::TokenError;

/// The gate's routes, upstream and pooled HTTP client.
pub struct Gate {
    routes: GateRoutes,
    upstream: Option<String>,
    timeout: Duration,
    client: Client<HttpConnector, Body>,
}

impl Gate {
    pub fn new(settings: &GateSettings) -> Result<Self, String> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        Ok(Self {
            routes: GateRoutes::compile(&settings.routes)?,
            upstream: settings.upstream.as_ref().map(|u| u.trim_end_matches('/').to_owned()),
            timeout: Duration::from_millis(settings.timeout_ms),
            client: Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector),
        })
    }

    async fn forward(&self, mut parts: Parts, body: Body) -> Result<Response, ApiError> {
        let Some(base) = &self.upstream else {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "UPSTREAM_UNAVAILABLE",
                "no purchase API behind the gate: set gate.upstream (VQ_GATE__UPSTREAM)",
            ));
        };
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = format!("{base}{pq}")
            .parse::<Uri>()
            .map_err(|_| ApiError::invalid("the request path cannot be forwarded"))?;
        strip_hop_by_hop(&mut parts.headers);
        let req = Request::from_parts(parts, body);
        match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Err(_) => Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "UPSTREAM_TIMEOUT",
                format!("the purchase API did not answer within {} ms", self.timeout.as_millis()),
            )),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, upstream = %base, "purchase API unreachable");
                Err(ApiError::new(StatusCode::BAD_GATEWAY, "UPSTREAM_UNAVAILABLE", "the purchase API is unreachable"))
            }
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Ok(Response::from_parts(parts, Body::new(body)))
            }
        }
    }
}

/// Headers that belong to one connection, not to the request (RFC 9110 §7.6.1).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// 429 when the purchase API's budget is taken for every tick the gate may wait for; the token
/// stays usable.
fn busy(tick_ms: u64) -> Response {
    let retry_s = tick_ms.div_ceil(1000).max(1);
    let detail = "the purchase API takes one batch per tick and the next ticks are full: retry shortly (your entry token is still valid)";
    let mut resp = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "DOWNSTREAM_BUSY", detail).into_response();
    resp.headers_mut().insert(header::RETRY_AFTER, retry_s.into());
    resp
}

fn denied(e: &TokenError) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "QUEUE_BYPASS_DENIED", e.to_string())
}

/// Everything that is not one of vq's own routes.
pub async fn proxy(State(st): State<SharedState>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let mut paced_target = None;
    let claim = match st.gate.routes.match_request(parts.method.as_str(), path) {
        None if path.starts_with("/virtual-queues/") || st.gate.upstream.is_none() => {
            return ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", "no such route").into_response();
        }
        None => None,
        Some(Err(e)) => return ApiError::invalid(e.to_string()).into_response(),
        Some(Ok(target)) => {
            let user = header_str(&parts.headers, "x-user-id").and_then(|u| u.parse().ok());
            let token = header_str(&parts.headers, "x-entry-token");
            match st.service.gate_check(target, user, token, ClaimMode::Claim).await {
                Ok(GatePass::FlagOff) => None,
                Ok(GatePass::Verified { claim }) => {
                    paced_target = Some(target);
                    claim
                }
                Err(e) => return denied(&e).into_response(),
            }
        }
    };
    if let Some(target) = paced_target {
        match st.service.pace_purchase(target).await {
            Pace::Now => {}
            Pace::Full => {
                if let Some(claim) = claim {
                    st.service.settle_claim(claim, false).await;
                }
                return busy(st.service.settings().queue.tick_ms);
            }
        }
    }
    let result = st.gate.forward(parts, body).await;
    if let Some(claim) = claim {
        let succeeded = result.as_ref().is_ok_and(|r| r.status().is_success());
        st.service.settle_claim(claim, succeeded).await;
    }
    result.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /gate/verify` for nginx `auth_request`: 204 when the original request may pass, 403
/// otherwise (nginx turns any other status into a 500, so a bad id is a 403 here too). The
/// check is read-only: nginx does not tell vq whether the purchase succeeded, so one-time
/// use is enforced only for tokens the proxy gate has consumed.
pub async fn verify(State(st): State<SharedState>, headers: HeaderMap) -> Response {
    let Some(uri) = header_str(&headers, "x-original-uri") else {
        return ApiError::invalid("missing X-Original-URI header").into_response();
    };
    let method = header_str(&headers, "x-original-method").unwrap_or("GET");
    let path = uri.split('?').next().unwrap_or(uri);
    let target = match st.gate.routes.match_request(method, path) {
        None => return StatusCode::NO_CONTENT.into_response(),
        Some(Err(e)) => {
            let detail = format!("invalid target id in the original URI: {e}");
            return ApiError::new(StatusCode::FORBIDDEN, "QUEUE_BYPASS_DENIED", detail).into_response();
        }
        Some(Ok(t)) => t,
    };
    let user = header_str(&headers, "x-user-id").and_then(|u| u.parse().ok());
    let token = header_str(&headers, "x-entry-token");
    match st.service.gate_check(target, user, token, ClaimMode::CheckOnly).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => denied(&e).into_response(),
    }
}
