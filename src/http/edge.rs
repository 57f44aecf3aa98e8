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
//! - A bounded number of requests in flight, by class ([`super::shed`]): the queue API's calls,
//!   `/gate/verify` and gated purchases (`http.max_in_flight`), and the requests the gate
//!   forwards unchecked (`http.max_forwarded_in_flight`). Past a class's budget a request is
//!   answered at once with 503 OVERLOADED and `Retry-After` (a 403 that says so on
//!   `/gate/verify`, which nginx passes on), instead of queueing behind work the instance
//!   cannot get through; the heaviest client's requests go first.
//! - CORS for the queue API: web apps on the origins of `http.cors_origins` may call it from
//!   the browser. `X-User-Id` makes every call "non-simple", so the browser first sends a
//!   preflight `OPTIONS`, answered here; other origins get no CORS headers (the browser then
//!   refuses to hand the answer to the page).

use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::OVERLOADED_RETRY_AFTER_S;
use super::shed::{Budget, Class, Client};
use super::{ApiError, ErrorCode};
use crate::config::HttpSettings;
use crate::gate::{CanonicalPath, GateRoutes};
use crate::metrics;

/// What the edge layer holds: the CORS origins, the in-flight budgets and the gated routes
/// (which class a forwarded request counts in).
pub struct Edge {
    cors: Cors,
    queue: Budget,
    forwarded: Budget,
    routes: GateRoutes,
    /// Keyed per process, so nobody can choose user ids that count as another user's.
    hasher: std::hash::RandomState,
}

impl Edge {
    pub fn new(cors_origins: Vec<String>, http: &HttpSettings, routes: GateRoutes) -> Arc<Self> {
        Arc::new(Self {
            cors: Cors(cors_origins),
            queue: Budget::new(http.max_in_flight),
            forwarded: Budget::new(http.max_forwarded_in_flight),
            routes,
            hasher: std::hash::RandomState::new(),
        })
    }

    /// The class `path` counts in, if any: health probes, metrics, the OpenAPI document, the
    /// waiting page and CORS preflights are answered whatever the load.
    fn class(&self, path: &str, preflight: bool) -> Option<Class> {
        if preflight || !counts_in_flight(path) {
            return None;
        }
        // `/gate/release` gives a buyer's token back: never behind the app's traffic either.
        if is_api(path) || is_verify(path) || path == "/gate/release" {
            return Some(Class::Queue);
        }
        // Spellings the gate refuses are answered 400 at once, in either class.
        let gated = CanonicalPath::parse(path).is_ok_and(|p| self.routes.match_path(&p).is_some());
        Some(if gated { Class::Queue } else { Class::Forwarded })
    }

    fn budget(&self, class: Class) -> &Budget {
        match class {
            Class::Queue => &self.queue,
            Class::Forwarded => &self.forwarded,
        }
    }

    /// Who sent `req`: the peer's address, and the user id or visitor token it names (as sent:
    /// whoever forges ids still comes from one address).
    fn client(&self, req: &Request) -> Client {
        let addr = req
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip().to_canonical());
        let h = req.headers();
        let named = h
            .get("x-user-id")
            .or_else(|| h.get("x-visitor-token"))
            .map(HeaderValue::as_bytes)
            .or_else(|| visitor_cookie(h));
        Client { addr, user: named.map_or(0, |n| self.hasher.hash_one(n)) }
    }
}

/// The `vq_visitor` cookie's value, if sent.
fn visitor_cookie(headers: &HeaderMap) -> Option<&[u8]> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .find_map(|v| v.as_bytes().split(|b| *b == b';').find_map(|c| c.trim_ascii().strip_prefix(b"vq_visitor=")))
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

/// The answer to a CORS preflight from an allowed origin.
fn preflight_answer() -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, DELETE"));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(
            "X-User-Id, X-Entry-Token, X-Visitor-Token, X-Pow-Seed, X-Pow-Nonce, X-VQ-Lane, Content-Type",
        ),
    );
    h.insert(header::ACCESS_CONTROL_MAX_AGE, MAX_AGE_S.into());
    r
}

/// The answer to a request shed at the door, or preempted by another client's.
fn shed(class: Class, verify: bool) -> Response {
    let detail = match class {
        Class::Queue => {
            metrics::shed();
            "this instance has as many requests in flight as it takes (http.max_in_flight): retry shortly, your place is kept"
        }
        Class::Forwarded => {
            metrics::shed_forwarded();
            "this instance forwards as many requests at once as it takes (http.max_forwarded_in_flight): retry shortly"
        }
    };
    if verify {
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
    let (api, verify) = (is_api(path), is_verify(path));
    let origin = if api { state.cors.allowed(req.headers().get(header::ORIGIN)) } else { None };
    let class = state.class(path, preflight);
    // The place (held until the answer is made), or `Some(None)`: none left.
    // Abandoning these changes nothing: a queue API call runs to its end in Redis as when its
    // client hangs up; a safe method forwarded unchecked acts on nothing.
    let preemptable = api || (class == Some(Class::Forwarded) && req.method().is_safe());
    let slot = class.map(|c| (c, state.budget(c).admit(state.client(&req), preemptable)));
    let mut resp = match (&slot, &origin, preflight) {
        // Shed answers carry the CORS headers too: the page reads their Retry-After.
        (Some((c, None)), _, _) => shed(*c, verify),
        (_, Some(_), true) => preflight_answer(),
        // Another client's request may take the place: then answered at once, as if shed.
        (Some((c, Some(held))), _, _) => tokio::select! {
            resp = next.run(req) => resp,
            () = held.preempted() => shed(*c, verify),
        },
        _ => next.run(req).await,
    };
    drop(slot);
    if !api {
        return resp;
    }
    let cors = &state.cors;
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
