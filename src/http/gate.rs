//! The purchase gate: a reverse proxy in front of the purchase API (`gate.upstream`).
//!
//! Every request path is canonicalised once ([`CanonicalPath`]); a path that servers could
//! read differently is refused with 400. Requests whose canonical path is a gated route
//! (`gate.routes`, any method) need a valid entry token when the flag applies to the user and
//! target; everything else that is not vq's own is forwarded unchecked, so vq can stand in
//! front of the whole app. The upstream receives the canonical path, never the raw one, so
//! what the gate checked is what the purchase API routes on. A request carrying `X-User-Id`
//! or `X-Entry-Token` more than once is refused. `/gate/verify` offers the same check to
//! nginx `auth_request`. Bodies stream both ways; hop-by-hop headers are dropped.

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

use super::edge::RouteLabel;
use super::{ApiError, ErrorCode, SharedState};
use crate::config::{GateSettings, SettingError};
use crate::gate::{CanonicalPath, GateRoutes};
use crate::service::{ClaimMode, GatePass, Pace};
use crate::token::TokenError;

/// The gate's routes, upstream and pooled HTTP client.
pub struct Gate {
    routes: GateRoutes,
    upstream: Option<String>,
    timeout: Duration,
    client: Client<HttpConnector, Body>,
    /// `gate.close_header`: the purchase API's "sold out" signal, never passed to the buyer.
    close_header: HeaderName,
}

/// Longest close message taken from the purchase API's header.
const CLOSE_MESSAGE_MAX: usize = 200;

impl Gate {
    /// The same checks as loading the settings: a route that does not compile or a close
    /// header that is not a header name is an error, never a fallback.
    pub fn new(settings: &GateSettings) -> Result<Self, SettingError> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        Ok(Self {
            routes: GateRoutes::compile(&settings.routes)?,
            upstream: settings.upstream.as_ref().map(|u| u.trim_end_matches('/').to_owned()),
            timeout: Duration::from_millis(settings.timeout_ms),
            client: Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector),
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

    async fn forward(&self, mut parts: Parts, path: &CanonicalPath, body: Body) -> Result<Response, ApiError> {
        let Some(base) = &self.upstream else {
            return Err(ApiError::new(
                ErrorCode::UpstreamUnavailable,
                "no purchase API behind the gate: set gate.upstream (VQ_GATE__UPSTREAM)",
            ));
        };
        let query = parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        parts.uri = format!("{base}{}{query}", path.as_str())
            .parse::<Uri>()
            .map_err(|_| ApiError::invalid("the request path cannot be forwarded"))?;
        strip_hop_by_hop(&mut parts.headers);
        let req = Request::from_parts(parts, body);
        match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Err(_) => Err(ApiError::new(
                ErrorCode::UpstreamTimeout,
                format!("the purchase API did not answer within {} ms", self.timeout.as_millis()),
            )),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, upstream = %base, "purchase API unreachable");
                Err(ApiError::new(ErrorCode::UpstreamUnavailable, "the purchase API is unreachable"))
            }
            Ok(Ok(resp)) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Ok(Response::from_parts(parts, Body::new(body)))
            }
        }
    }
}

/// Headers that belong to one connection, not to the request (RFC 9110 §7.6.1). The identity
/// headers stay whatever `Connection` says (the edge layer has refused such a request already).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .filter(|name| !super::edge::is_identity(name.as_str()))
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
    let mut resp = ApiError::new(ErrorCode::DownstreamBusy, detail).into_response();
    resp.headers_mut().insert(header::RETRY_AFTER, retry_s.into());
    resp
}

fn denied(e: &TokenError) -> ApiError {
    ApiError::new(ErrorCode::QueueBypassDenied, e.to_string())
}

/// Everything that is not one of vq's own routes.
pub async fn proxy(State(st): State<SharedState>, req: Request) -> Response {
    // A repeated X-User-Id or X-Entry-Token never gets here: the edge layer refuses it.
    let (parts, body) = req.into_parts();
    let path = match CanonicalPath::parse(parts.uri.path()) {
        Ok(p) => p,
        Err(e) => return ApiError::invalid(e.to_string()).into_response(),
    };
    // The metrics label of a gated purchase is its route's template, whatever the spelling.
    let label = st.gate.routes.template(&path).cloned();
    let mut resp = gate_and_forward(&st, parts, path, body).await;
    if let Some(template) = label {
        resp.extensions_mut().insert(RouteLabel(template));
    }
    resp
}

/// The gate's decision on a canonical path, then the purchase API's answer.
async fn gate_and_forward(st: &SharedState, parts: Parts, path: CanonicalPath, body: Body) -> Response {
    let mut paced_target = None;
    let mut route_target = None;
    let claim = match st.gate.routes.match_path(&path) {
        None if path.is_queue_api() || st.gate.upstream.is_none() => {
            return ApiError::new(ErrorCode::NotFound, "no such route").into_response();
        }
        None => None,
        Some(Err(e)) => return ApiError::invalid(e.to_string()).into_response(),
        Some(Ok(target)) => {
            route_target = Some(target);
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
    let mut result = st.gate.forward(parts, &path, body).await;
    if let Ok(resp) = &mut result
        && let Some(message) = st.gate.take_close(resp)
        && let Some(target) = route_target
    {
        st.service.close_by_purchase_api(target, message).await;
    }
    if let Some(claim) = claim {
        let succeeded = result.as_ref().is_ok_and(|r| r.status().is_success());
        st.service.settle_claim(claim, succeeded).await;
    }
    result.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /gate/verify` for nginx `auth_request`: 204 when the original request may pass, 403
/// otherwise, every refusal included (nginx turns any other status into a 500 for the buyer).
/// `X-Original-URI` (nginx: `$request_uri`, the raw URI the backend receives) is canonicalised
/// exactly as the proxy gate does; every method is gated, so `X-Original-Method` is not needed.
/// The check is read-only: nginx does not tell vq whether the purchase succeeded, so one-time
/// use is enforced only for tokens the proxy gate has consumed.
pub async fn verify(State(st): State<SharedState>, headers: HeaderMap) -> Response {
    let refuse = |detail: String| ApiError::new(ErrorCode::QueueBypassDenied, detail).into_response();
    let Some(raw_uri) = headers.get("x-original-uri") else {
        tracing::warn!(
            "/gate/verify without X-Original-URI: nginx must send `proxy_set_header X-Original-URI $request_uri`"
        );
        return refuse("missing X-Original-URI header: the proxy must send the original request URI".into());
    };
    let Ok(uri) = raw_uri.to_str() else {
        return refuse("the original URI holds bytes outside visible ASCII".into());
    };
    if let Some(detail) = super::edge::identity_refusal(&headers) {
        return refuse(detail);
    }
    let path = match CanonicalPath::parse(original_path(uri)) {
        Ok(p) => p,
        Err(e) => return refuse(format!("original URI refused: {e}")),
    };
    if path.is_queue_api() {
        return refuse("the original URI is in vq's queue API, which is never forwarded to the backend".into());
    }
    let target = match st.gate.routes.match_path(&path) {
        None => return StatusCode::NO_CONTENT.into_response(),
        Some(Err(e)) => return refuse(format!("invalid target id in the original URI: {e}")),
        Some(Ok(t)) => t,
    };
    let user = header_str(&headers, "x-user-id").and_then(|u| u.parse().ok());
    let token = header_str(&headers, "x-entry-token");
    match st.service.gate_check(target, user, token, ClaimMode::CheckOnly).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => denied(&e).into_response(),
    }
}

/// The path of a request URI as sent (`/p?q`, or absolute `http://host/p?q`), without the
/// query or anything after a `#` (some servers drop it, so the gate does too).
fn original_path(uri: &str) -> &str {
    let uri = match uri.split_once("://") {
        Some((scheme, rest)) if !scheme.contains('/') => rest.find('/').map_or("/", |i| &rest[i..]),
        _ => uri,
    };
    let end = uri.find(['?', '#']).unwrap_or(uri.len());
    &uri[..end]
}

#[cfg(test)]
mod tests {
    use super::original_path;

    #[test]
    fn the_original_path_is_the_path_of_the_uri_as_sent() {
        assert_eq!(original_path("/limited-drops/1/orders?x=1"), "/limited-drops/1/orders");
        assert_eq!(original_path("/limited-drops/1/orders#x?y"), "/limited-drops/1/orders");
        assert_eq!(original_path("http://shop:8080/limited-drops/1/orders?x"), "/limited-drops/1/orders");
        assert_eq!(original_path("https://shop"), "/");
        assert_eq!(original_path("/a?next=http://b/c"), "/a");
        assert_eq!(original_path("*"), "*");
    }
}
