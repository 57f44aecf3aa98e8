//! What every request meets first, in one layer (each layer costs allocations per request):
//!
//! - Every request is timed by route template and status (`virtual_queue_http_request_duration_seconds`):
//!   the matched route (vq's own, or the gated route the gate sets on its response as
//!   [`RouteLabel`]), never the raw path; other forwarded paths are `unmatched`.
//! - `X-User-Id` or `X-Entry-Token` sent twice, named in `Connection`, or spelt with `_` is
//!   refused on every route (400, [`identity_refusal`] says why): servers behind vq would read
//!   another value than vq decided on, or none. `/gate/verify` answers 403 for it itself
//!   (nginx turns a 400 into a 500).
//! - Queue API answers are per user and change every tick: `Cache-Control: no-store`.
//! - A bounded number of requests in flight (`http.max_in_flight`): the queue API's calls and
//!   the gate's (they wait on Redis or the purchase API); past it a request is answered at once
//!   with 503 OVERLOADED and `Retry-After` (a 403 that says so on `/gate/verify`, which nginx
//!   passes on), instead of queueing behind work the instance cannot get through.
//! - CORS for the queue API: web apps on the origins of `http.cors_origins` may call it from
//!   the browser. `X-User-Id` makes every call "non-simple", so the browser first sends a
//!   preflight `OPTIONS`, answered here; other origins get no CORS headers (the browser then
//!   refuses to hand the answer to the page).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::OVERLOADED_RETRY_AFTER_S;
use super::{ApiError, ErrorCode};
use crate::metrics;

/// What the edge layer holds: the CORS origins and the in-flight count.
pub struct Edge {
    cors: Cors,
    in_flight: AtomicU64,
    max_in_flight: u64,
}

impl Edge {
    pub fn new(cors_origins: Vec<String>, max_in_flight: u64) -> Arc<Self> {
        Arc::new(Self { cors: Cors(cors_origins), in_flight: AtomicU64::new(0), max_in_flight })
    }

    /// A place among the requests in flight, or `None` when they are all taken.
    fn admit(&self) -> Option<InFlight<'_>> {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let slot = InFlight(&self.in_flight);
        (before < self.max_in_flight).then_some(slot)
    }
}

/// One request in flight; its place frees when the answer is made (or the client hangs up).
struct InFlight<'a>(&'a AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The requests that count in flight: those that may wait on Redis or the purchase API. Health
/// probes, metrics, the OpenAPI document and the waiting page are answered whatever the load.
fn counts_in_flight(path: &str) -> bool {
    !matches!(path, "/healthz" | "/readyz" | "/metrics" | "/openapi.json") && !path.starts_with("/waiting-room/")
}

/// `/gate/verify`, also with an original path appended (Envoy `ext_authz`): it answers its
/// refusals itself, as 403 (nginx turns anything but 2xx/401/403 into a 500).
fn is_verify(path: &str) -> bool {
    path.strip_prefix("/gate/verify").is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The answer to a request shed at the door.
fn shed(path: &str) -> Response {
    metrics::shed();
    let detail = "this instance has as many requests in flight as it takes (http.max_in_flight): retry shortly, your place is kept";
    if is_verify(path) {
        // nginx passes only 401 and 403 on to the buyer.
        return ApiError::new(ErrorCode::QueueBypassDenied, detail)
            .retry_after(OVERLOADED_RETRY_AFTER_S)
            .into_response();
    }
    ApiError::overloaded(detail).into_response()
}

/// The route template of a gated purchase, set on its response by the gate, which has matched
/// the canonical path already.
#[derive(Clone)]
pub struct RouteLabel(pub Arc<str>);

/// The allowed origins, lower-case.
struct Cors(Vec<String>);

impl Cors {
    fn allowed(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        let o = origin?;
        let text = o.to_str().ok()?.to_ascii_lowercase();
        self.0.contains(&text).then(|| o.clone())
    }
}

/// The identity headers (lower-case, as written), which the gate and the purchase API must
/// read alike.
const IDENTITY_HEADERS: [(&str, &str); 3] =
    [("x-user-id", "X-User-Id"), ("x-entry-token", "X-Entry-Token"), ("x-visitor-token", "X-Visitor-Token")];

/// Why this request's identity headers could be read one way by vq and another by a server
/// behind it, if they could; such a request is refused on every route (400; 403 on
/// `/gate/verify`):
///
/// - sent twice: one server reads the first value, another joins them;
/// - named in `Connection`: a proxy that honours it (RFC 9110 §7.6.1, vq's forwarding did)
///   drops the header, one that does not (nginx) keeps it, so the gate and the purchase API
///   would see different users. Refused rather than ignored for them: RFC 9110 forbids
///   connection options for end-to-end fields, no client that means well sends one, and
///   ignoring it would make vq the one hop on the path that reads it differently;
/// - spelt with `_` (`X_User_Id`): servers that turn headers into CGI variables (PHP, WSGI,
///   Rack) read it as `X-User-Id`, beside or instead of the one vq checked.
pub(super) fn identity_refusal(headers: &HeaderMap) -> Option<String> {
    let repeated = IDENTITY_HEADERS.into_iter().find(|(id, _)| headers.get_all(*id).iter().nth(1).is_some());
    if let Some((_, shown)) = repeated {
        return Some(format!("{shown} sent more than once: send it once"));
    }
    let named = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .find_map(|option| identity_header(option.trim_ascii()));
    if let Some(shown) = named {
        return Some(format!(
            "Connection names {shown}: an identity header is end-to-end and cannot be dropped on the way"
        ));
    }
    let respelt = headers.keys().find(|k| k.as_str().contains('_')).map(|k| k.as_str().as_bytes());
    if let Some((raw, shown)) = respelt.and_then(|raw| identity_header(raw).map(|shown| (raw, shown))) {
        let raw = String::from_utf8_lossy(raw);
        return Some(format!("{raw}: spell it {shown} (servers behind vq would read both as {shown})"));
    }
    None
}

/// The identity header that `name` stands for, ignoring case and taking `_` for `-`.
fn identity_header(name: &[u8]) -> Option<&'static str> {
    let same = |id: &str| {
        id.len() == name.len()
            && name.iter().zip(id.bytes()).all(|(a, b)| a.to_ascii_lowercase() == b || (*a == b'_' && b == b'-'))
    };
    IDENTITY_HEADERS.into_iter().find(|(id, _)| same(id)).map(|(_, shown)| shown)
}

/// Whether `name` (lower-case) is an identity header: never dropped as hop-by-hop.
pub(super) fn is_identity(name: &str) -> bool {
    IDENTITY_HEADERS.iter().any(|(id, _)| *id == name)
}

/// Browsers cache a preflight answer this long.
const MAX_AGE_S: u32 = 600;

/// Whether this is the queue API or its document (CORS and no-store apply), not something the
/// gate forwards (the purchase API answers for itself).
fn is_api(path: &str) -> bool {
    path.starts_with("/virtual-queues/") || path == "/openapi.json"
}

pub async fn layer(State(edge_state): State<Arc<Edge>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let matched = req.extensions().get::<MatchedPath>().cloned();
    let resp = edge(&edge_state, req, next).await;
    let gated = resp.extensions().get::<RouteLabel>();
    let route = matched.as_ref().map(MatchedPath::as_str).or(gated.map(|l| &*l.0)).unwrap_or("unmatched");
    metrics::http_request(route, resp.status().as_u16(), started.elapsed());
    resp
}

async fn edge(state: &Edge, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if !is_verify(path)
        && let Some(detail) = identity_refusal(req.headers())
    {
        return ApiError::invalid(detail).into_response();
    }
    let preflight =
        req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    // The place (held until the answer is made), or `Some(None)`: none left.
    let slot = (counts_in_flight(path) && !preflight).then(|| state.admit());
    let shed_now = matches!(slot, Some(None));
    if !is_api(path) {
        return if shed_now { shed(path) } else { next.run(req).await };
    }
    let cors = &state.cors;
    let origin = cors.allowed(req.headers().get(header::ORIGIN));
    let mut resp = match (&origin, preflight) {
        // Shed answers carry the CORS headers too: the page reads their Retry-After.
        _ if shed_now => shed(path),
        (Some(_), true) => {
            let mut r = StatusCode::NO_CONTENT.into_response();
            let h = r.headers_mut();
            h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, DELETE"));
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static(
                    "X-User-Id, X-Entry-Token, X-Visitor-Token, X-Pow-Seed, X-Pow-Nonce, Content-Type",
                ),
            );
            h.insert(header::ACCESS_CONTROL_MAX_AGE, MAX_AGE_S.into());
            r
        }
        _ => next.run(req).await,
    };
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if !cors.0.is_empty() {
        // Answers differ by Origin only where some origin is allowed.
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    if let Some(o) = origin {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static("Retry-After"));
    }
    resp
}
