//! What every request meets first, in one layer (each layer costs allocations per request):
//!
//! - Every request is timed by route template and status (`virtual_queue_http_request_duration_seconds`):
//!   the matched route (vq's own, or the gated route the gate sets on its response as
//!   [`RouteLabel`]), never the raw path; other forwarded paths are `unmatched`.
//! - `X-User-Id` or `X-Entry-Token` sent twice is refused on every route (400): servers behind
//!   vq read one value or join them, and vq must not decide on another than they use.
//!   `/gate/verify` answers 403 for it itself (nginx turns a 400 into a 500).
//! - Queue API answers are per user and change every tick: `Cache-Control: no-store`.
//! - CORS for the queue API: web apps on the origins of `http.cors_origins` may call it from
//!   the browser. `X-User-Id` makes every call "non-simple", so the browser first sends a
//!   preflight `OPTIONS`, answered here; other origins get no CORS headers (the browser then
//!   refuses to hand the answer to the page).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::metrics;

/// The route template of a gated purchase, set on its response by the gate, which has matched
/// the canonical path already.
#[derive(Clone)]
pub struct RouteLabel(pub Arc<str>);

/// The allowed origins, lower-case.
pub struct Cors(Vec<String>);

impl Cors {
    pub fn new(origins: Vec<String>) -> Arc<Self> {
        Arc::new(Self(origins))
    }

    fn allowed(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        let o = origin?;
        let text = o.to_str().ok()?.to_ascii_lowercase();
        self.0.contains(&text).then(|| o.clone())
    }
}

/// The identity headers, which the gate and the purchase API must read alike: sent twice,
/// one would check the first value and the other see both.
const IDENTITY_HEADERS: [&str; 2] = ["x-user-id", "x-entry-token"];

/// The identity header sent more than once, if any.
pub(super) fn repeated_identity(headers: &HeaderMap) -> Option<&'static str> {
    IDENTITY_HEADERS.into_iter().find(|name| headers.get_all(*name).iter().nth(1).is_some())
}

pub(super) fn repeated_detail(name: &str) -> String {
    format!("{} sent more than once: send it once", if name == "x-user-id" { "X-User-Id" } else { "X-Entry-Token" })
}

/// Browsers cache a preflight answer this long.
const MAX_AGE_S: u32 = 600;

/// Whether this is the queue API or its document (CORS and no-store apply), not something the
/// gate forwards (the purchase API answers for itself).
fn is_api(path: &str) -> bool {
    path.starts_with("/virtual-queues/") || path == "/openapi.json"
}

pub async fn layer(State(cors): State<Arc<Cors>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let matched = req.extensions().get::<MatchedPath>().cloned();
    let resp = edge(&cors, req, next).await;
    let gated = resp.extensions().get::<RouteLabel>();
    let route = matched.as_ref().map(MatchedPath::as_str).or(gated.map(|l| &*l.0)).unwrap_or("unmatched");
    metrics::http_request(route, resp.status().as_u16(), started.elapsed());
    resp
}

async fn edge(cors: &Cors, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if let Some(name) = repeated_identity(req.headers())
        && path != "/gate/verify"
    {
        return ApiError::invalid(repeated_detail(name)).into_response();
    }
    if !is_api(path) {
        return next.run(req).await;
    }
    let origin = cors.allowed(req.headers().get(header::ORIGIN));
    let preflight =
        req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut resp = match (&origin, preflight) {
        (Some(_), true) => {
            let mut r = StatusCode::NO_CONTENT.into_response();
            let h = r.headers_mut();
            h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, DELETE"));
            h.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static("X-User-Id, X-Entry-Token, Content-Type"),
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
