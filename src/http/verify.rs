//! Forward auth: `GET /gate/verify` for proxies that forward to the purchase API themselves
//! (nginx `auth_request`, Caddy `forward_auth`, Traefik `forwardAuth`, Envoy `ext_authz`), and
//! `GET /gate/release`, which such a proxy calls when the purchase API failed after the check.
//!
//! The check keeps the gate's promises: the original URI is canonicalised exactly as the proxy
//! gate does, the token is claimed (one-time use) and the purchase paced (one batch per tick)
//! before the 204, which carries a release receipt (`crate::release`) for the proxy only. A
//! check abandoned before its answer (the proxy gave up while it waited for its tick) gives
//! the token back itself. It must not forward anything: the proxy does.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::HeaderMap;
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use super::error::OVERLOADED_RETRY_AFTER_S;
use super::gate::{denied, gate_user, header_str};
use super::{ApiError, ErrorCode, SharedState};
use crate::config::IdentityMode;
use crate::gate::CanonicalPath;
use crate::service::{ClaimMode, GateDenial, GatePass, Pace, PendingClaim, QueueService, ReleaseRefusal};

/// The headers in which a forward-auth proxy names the original request URI: nginx
/// `auth_request` (`proxy_set_header X-Original-URI $request_uri`), Caddy's `forward_auth` and
/// Traefik's `forwardAuth` (`X-Forwarded-Uri`). Envoy's `ext_authz` appends the original path
/// to `/gate/verify` instead.
const ORIGINAL_URI_HEADERS: [&str; 2] = ["x-original-uri", "x-forwarded-uri"];

/// The header in which the proxy tells `/gate/release` the purchase API's status (nginx
/// `$upstream_status`, Caddy `{rp.status_code}` / `{err.status_code}`).
const UPSTREAM_STATUS_HEADER: &str = "x-vq-upstream-status";

/// The original request's URI as the proxy names it. Every way it can be named must agree:
/// these proxies pass the client's own headers on to the check, so a client could add one
/// naming a harmless path beside the one the proxy set, and vq must not check another request
/// than the one forwarded. A `#` anywhere is refused: nginx passes it to the backend as sent
/// (`/x#/../limited-drops/1/orders`), where a checker that cut the URI there judged `/x`.
fn original_uri<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> Result<&'a str, String> {
    let mut named: Vec<(&str, &str)> = Vec::new();
    for name in ORIGINAL_URI_HEADERS {
        for value in headers.get_all(name) {
            let text = value.to_str().map_err(|_| format!("{name} holds bytes outside visible ASCII"))?;
            named.push((name, text));
        }
    }
    // Envoy: /gate/verify<original path>, the raw path as sent.
    if let Some(tail) = uri.path().strip_prefix("/gate/verify").filter(|t| !t.is_empty()) {
        named.push(("the path after /gate/verify", tail));
    }
    let Some(&(_, first)) = named.first() else {
        return Err("missing X-Original-URI header (or X-Forwarded-Uri, or a path after /gate/verify): the proxy \
                    must send the original request URI"
            .into());
    };
    if let Some((name, _)) = named.iter().find(|(_, v)| v.contains('#')) {
        return Err(format!(
            "{name} holds a `#`, which servers read differently (nginx forwards it as sent): send the URI without it"
        ));
    }
    if let Some((name, _)) = named.iter().find(|(_, v)| original_path(v) != original_path(first)) {
        return Err(format!(
            "{} and {name} name different requests: the proxy's check must name the request it forwards",
            named[0].0
        ));
    }
    Ok(first)
}

/// The path of a request URI as sent (`/p?q`, or absolute `http://host/p?q`), without the
/// query. A `#` stays in it (and is refused by the canonicaliser).
fn original_path(uri: &str) -> &str {
    let uri = match uri.split_once("://") {
        Some((scheme, rest)) if !scheme.contains(['/', '#']) => rest.find('/').map_or("/", |i| &rest[i..]),
        _ => uri,
    };
    let end = uri.find('?').unwrap_or(uri.len());
    &uri[..end]
}

/// A claim `/gate/verify` made and has not answered for yet: given back if the check is
/// dropped (the proxy closed the connection while the purchase waited for its tick).
struct ClaimGuard {
    service: Arc<QueueService>,
    claim: Option<PendingClaim>,
}

impl ClaimGuard {
    /// The claim, no longer given back on drop.
    fn keep(mut self) -> Option<PendingClaim> {
        self.claim.take()
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if let Some(claim) = self.claim.take() {
            let service = self.service.clone();
            tokio::spawn(async move { service.settle_claim(claim, false).await });
        }
    }
}

/// `GET /gate/verify`: 204 when the original request may pass, 403 otherwise, every refusal
/// included (nginx turns any other status into a 500 for the buyer). The original URI
/// ([`original_uri`]: the raw URI the backend receives) is canonicalised exactly as the proxy
/// gate does; every method is gated, so the original method is not needed. A gated purchase
/// with a valid token claims it and waits for its tick, as through the proxy gate; the 204
/// then carries `X-Vq-Release` for the proxy to hand to `/gate/release` if the purchase API
/// fails. Every tick the check may wait for full: 403 with `Retry-After`, the token unused.
pub async fn verify(State(st): State<SharedState>, request_uri: Uri, headers: HeaderMap) -> Response {
    let refuse = |detail: String| ApiError::new(ErrorCode::QueueBypassDenied, detail).into_response();
    let uri = match original_uri(&request_uri, &headers) {
        Ok(u) => u,
        Err(detail) => {
            if detail.starts_with("missing") {
                tracing::warn!(
                    "/gate/verify without the original URI: nginx must send `proxy_set_header X-Original-URI $request_uri`"
                );
            }
            return refuse(detail);
        }
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
        None => return pass(None, None),
        Some(Err(e)) => return refuse(format!("invalid target id in the original URI: {e}")),
        Some(Ok(t)) => t,
    };
    let user = gate_user(&headers, &st);
    let token = header_str(&headers, "x-entry-token");
    let visitor = (st.service.settings().identity.mode == IdentityMode::Visitor).then(|| user.clone()).flatten();
    // Every tick the check may wait for full: a 403 that says when to retry, the token unused.
    let busy = || {
        let tick_s = st.service.settings().queue.tick_ms.div_ceil(1000);
        ApiError::new(ErrorCode::QueueBypassDenied, GateDenial::Busy.to_string()).retry_after(tick_s).into_response()
    };
    let claim = match st.service.gate_check(target, user, token, ClaimMode::Claim).await {
        Ok(GatePass::FlagOff) => None,
        Ok(GatePass::Verified { claim }) => {
            let guard = ClaimGuard { service: st.service.clone(), claim };
            match st.service.pace_purchase(target, guard.claim.as_ref()).await {
                Pace::Now => guard.keep(),
                Pace::Full => {
                    if let Some(claim) = guard.keep() {
                        st.service.settle_claim(claim, false).await;
                    }
                    return busy();
                }
            }
        }
        Err(GateDenial::Busy) => return busy(),
        // nginx passes only 401 and 403 on to the buyer (anything else becomes a 500), so an
        // overloaded check, or a claim the replicas did not acknowledge, is a 403 that says so
        // and when to retry.
        Err(e @ (GateDenial::Overloaded | GateDenial::NotRecorded(_))) => {
            return ApiError::new(ErrorCode::QueueBypassDenied, e.to_string())
                .retry_after(OVERLOADED_RETRY_AFTER_S)
                .into_response();
        }
        // Likewise a purchase of an undeclared target: refused, saying why.
        Err(e @ GateDenial::UnknownTarget(_)) => return refuse(e.to_string()),
        Err(e) => return denied(&e).into_response(),
    };
    pass(claim.map(|c| st.service.release_receipt(&c)), visitor)
}

/// The 204: with the release receipt (or [`crate::release::NONE`]), and in visitor mode the
/// visitor's id.
fn pass(receipt: Option<String>, visitor: Option<crate::domain::UserId>) -> Response {
    let mut resp = StatusCode::NO_CONTENT.into_response();
    // In visitor mode the proxy takes the visitor's id from here for the purchase API
    // (nginx: `auth_request_set $vq_user_id $upstream_http_x_user_id`).
    if let Some(id) = visitor.and_then(|id| HeaderValue::from_str(id.as_str()).ok()) {
        resp.headers_mut().insert("x-user-id", id);
    }
    let receipt = receipt.as_deref().unwrap_or(crate::release::NONE);
    let value = HeaderValue::from_str(receipt).expect("a receipt is base64url and a dot");
    resp.headers_mut().insert(crate::release::HEADER, value);
    resp
}

/// The purchase API's failure as the proxy tells it: the last status in
/// `X-Vq-Upstream-Status` (nginx lists one per upstream tried, `502, 504`) when it is a 5xx,
/// else 502.
fn told_status(headers: &HeaderMap) -> StatusCode {
    header_str(headers, UPSTREAM_STATUS_HEADER)
        .and_then(|v| v.rsplit([',', ':', ' ']).find(|s| !s.is_empty()))
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|s| (500..=599).contains(s))
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::BAD_GATEWAY)
}

/// `GET /gate/release`, called by the proxy (never routed from outside) when the purchase API
/// failed after `/gate/verify` let the purchase through: with the check's `X-Vq-Release`, the
/// token is given back so the buyer can retry. The answer is what the buyer gets: the
/// purchase API's failure status (`X-Vq-Upstream-Status`) with a body saying whether the token
/// is usable again. A receipt vq did not sign is refused with 403; one expired or used already
/// releases nothing.
pub async fn release(State(st): State<SharedState>, headers: HeaderMap) -> Response {
    let status = told_status(&headers);
    let mut receipts = headers.get_all(crate::release::HEADER).iter();
    let (first, again) = (receipts.next(), receipts.next());
    if again.is_some() {
        return ApiError::new(ErrorCode::QueueBypassDenied, "X-Vq-Release more than once").into_response();
    }
    let outcome = match first.map(|v| v.to_str().unwrap_or("")) {
        None | Some("" | crate::release::NONE) => None,
        Some(raw) => Some(st.service.release_by_receipt(raw).await),
    };
    let upstream = format!("the purchase API failed (HTTP {})", status.as_u16());
    let detail = match outcome {
        Some(Ok(())) => format!("{upstream}: your entry token is valid again, retry the purchase"),
        Some(Err(e @ ReleaseRefusal::Receipt(crate::release::ReceiptError::Expired)))
        | Some(Err(e @ (ReleaseRefusal::Spent | ReleaseRefusal::Store))) => {
            tracing::warn!(error = %e, "/gate/release released nothing");
            upstream
        }
        Some(Err(e)) => return ApiError::new(ErrorCode::QueueBypassDenied, e.to_string()).into_response(),
        None => upstream,
    };
    let code =
        if status == StatusCode::GATEWAY_TIMEOUT { ErrorCode::UpstreamTimeout } else { ErrorCode::UpstreamUnavailable };
    let mut resp = ApiError::new(code, detail).retry_after(1).into_response();
    *resp.status_mut() = status;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_original_path_is_the_path_of_the_uri_as_sent() {
        assert_eq!(original_path("/limited-drops/1/orders?x=1"), "/limited-drops/1/orders");
        assert_eq!(original_path("/limited-drops/1/orders#x?y"), "/limited-drops/1/orders#x");
        assert_eq!(original_path("http://shop:8080/limited-drops/1/orders?x"), "/limited-drops/1/orders");
        assert_eq!(original_path("https://shop"), "/");
        assert_eq!(original_path("/a?next=http://b/c"), "/a");
        assert_eq!(original_path("*"), "*");
    }

    #[test]
    fn a_hash_anywhere_in_the_original_uri_is_refused() {
        let uri: Uri = "/gate/verify".parse().unwrap();
        for value in ["/x#/../limited-drops/1/orders", "/limited-drops/1/orders#", "/a?b#c", "http://h#/x"] {
            for name in ORIGINAL_URI_HEADERS {
                let mut h = HeaderMap::new();
                h.insert(name, HeaderValue::from_str(value).unwrap());
                let e = original_uri(&uri, &h).unwrap_err();
                assert!(e.contains('#'), "{name}: {value}: {e}");
            }
        }
    }

    #[test]
    fn the_failure_told_is_a_5xx() {
        let told = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(UPSTREAM_STATUS_HEADER, HeaderValue::from_str(v).unwrap());
            told_status(&h).as_u16()
        };
        assert_eq!(
            (told("503"), told("502, 504"), told("502 : 500"), told("200"), told("x")),
            (503, 504, 500, 502, 502)
        );
        assert_eq!(told_status(&HeaderMap::new()), StatusCode::BAD_GATEWAY);
    }
}
