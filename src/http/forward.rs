//! Forwarding a request the gate has decided on to the purchase API (`gate.upstream`): the
//! purchase API receives the request the gate checked, and only that.
//!
//! - The path is the canonical one the gate matched (the caller gives it).
//! - Headers that frameworks read as the request's real path, method or host
//!   ([`REROUTING_HEADERS`], in either spelling, `-` or `_`) are removed, and `Host` is
//!   `gate.upstream_host` (default: the upstream's own authority), never the client's.
//! - Hop-by-hop headers are dropped, the identity headers never (the edge layer refuses a
//!   request whose `Connection` names them).
//! - The body streams through [`ClientBody`], which tells a client's bad framing, or a body
//!   that stops arriving, from the purchase API failing: the first is the client's 400, only
//!   the second a 502/504. A body not in full within `http.body_read_timeout_ms` is cut off
//!   there (400), so a client that never sends it holds no place for longer. It also notes when
//!   the body ended, so the purchase API's time to answer leaves out how slowly the client sent
//!   it.
//!
//! It must not decide anything: whether the request may pass is the gate's call.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::Uri;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::request::Parts;
use axum::response::Response;
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{ApiError, ErrorCode};
use crate::config::{GateSettings, SettingError};
use crate::gate::CanonicalPath;

/// Request headers by which Spring (`ForwardedHeaderFilter`), Symfony and Laravel (trusted
/// proxies, `X-HTTP-Method-Override` on POST), Rails (`Rack::MethodOverride`), Express
/// (`method-override`, `trust proxy`), ASP.NET (`UseHttpMethodOverride`, OData's
/// `X-HTTP-Method`), IIS URL Rewrite and Zend/Laminas (`X-Original-URL`, `X-Rewrite-URL`), or
/// proxies' conventions (Traefik, Envoy, nginx `auth_request`) take a request for another path,
/// method or host than its request line and `Host` say. None may reach the purchase API: the
/// gate decided on the request line. Removed, not refused: a client library that tunnels a
/// method this way (POST + `X-HTTP-Method-Override: PATCH`) gets the method it sent, which every
/// gated route checks anyway, and nginx can do exactly the same (`proxy_set_header X "";`).
/// A `_method` form or query parameter (Rails, Symfony, Laravel, Spring's
/// `HiddenHttpMethodFilter`) is left in the body and query as sent: reading bodies would stop
/// them streaming, and it changes only the method, which the gate does not decide on.
pub const REROUTING_HEADERS: [&str; 10] = [
    "x-original-url",
    "x-rewrite-url",
    "x-original-uri",
    "x-forwarded-uri",
    "x-forwarded-path",
    "x-envoy-original-path",
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-forwarded-host",
];

/// The purchase API behind the gate and the pooled client that reaches it.
pub struct Upstream {
    /// `gate.upstream` without a trailing `/`.
    base: String,
    /// `Host` of every forwarded request.
    host: HeaderValue,
    timeout: Duration,
    /// `http.body_read_timeout_ms`.
    body_timeout: Duration,
    client: Client<HttpConnector, Body>,
}

/// Why a request did not get the purchase API's answer.
#[derive(Debug)]
pub enum ForwardError {
    /// The client's body: bad framing (chunk sizes, line ends), cut short, or stalled while the
    /// purchase API waited for it.
    ClientBody(String),
    /// The canonical path does not make a URI with the upstream's base.
    Path,
    Unreachable,
    Timeout,
}

impl Upstream {
    /// `None` when `gate.upstream` is unset.
    pub fn new(settings: &GateSettings, body_timeout: Duration) -> Result<Option<Self>, SettingError> {
        let Some(upstream) = &settings.upstream else { return Ok(None) };
        let base = upstream.trim_end_matches('/').to_owned();
        let host = match &settings.upstream_host {
            Some(h) => h.clone(),
            None => authority_of(&base).ok_or_else(|| SettingError::UpstreamNotHttp(upstream.clone()))?.to_owned(),
        };
        let host = HeaderValue::from_str(&host).map_err(|_| SettingError::UpstreamHostNotAHost(host.clone()))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        Ok(Some(Self {
            base,
            host,
            timeout: Duration::from_millis(settings.timeout_ms),
            body_timeout,
            client: Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(connector),
        }))
    }

    /// The purchase API's answer, and how long it took to answer once it had the whole request
    /// (from sending, or from the body's last bytes if the client sent them later).
    pub async fn forward(
        &self,
        mut parts: Parts,
        path: &CanonicalPath,
        body: Body,
    ) -> Result<(Response, Duration), ForwardError> {
        let query = parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        parts.uri = format!("{}{}{query}", self.base, path.as_str()).parse::<Uri>().map_err(|_| ForwardError::Path)?;
        strip_hop_by_hop(&mut parts.headers);
        strip_rerouting(&mut parts.headers);
        parts.headers.insert(header::HOST, self.host.clone());
        let state = Arc::new(BodyState::default());
        let deadline = Box::pin(tokio::time::sleep(self.body_timeout));
        let body = Body::new(ClientBody { inner: body, state: state.clone(), deadline, limit: self.body_timeout });
        let req = Request::from_parts(parts, body);
        let sent = Instant::now();
        match tokio::time::timeout(self.timeout, self.client.request(req)).await {
            Err(_) if state.waiting.load(Ordering::Relaxed) => Err(ForwardError::ClientBody(format!(
                "the request body stopped arriving: the purchase API waited {} ms for the rest",
                self.timeout.as_millis()
            ))),
            Err(_) => Err(ForwardError::Timeout),
            Ok(Err(e)) => match state.failed.get() {
                Some(why) => Err(ForwardError::ClientBody(why.clone())),
                None => {
                    tracing::warn!(error = %e, upstream = %self.base, "purchase API unreachable");
                    Err(ForwardError::Unreachable)
                }
            },
            Ok(Ok(resp)) => {
                let whole = state.ended.get().map_or(sent, |ended| (*ended).max(sent));
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Ok((Response::from_parts(parts, Body::new(body)), whole.elapsed()))
            }
        }
    }

    /// The answer for a request that did not get the purchase API's.
    pub fn error(&self, e: ForwardError) -> ApiError {
        match e {
            ForwardError::ClientBody(why) => ApiError::invalid(format!("request body refused: {why}")),
            ForwardError::Path => ApiError::invalid("the request path cannot be forwarded"),
            ForwardError::Unreachable => {
                ApiError::new(ErrorCode::UpstreamUnavailable, "the purchase API is unreachable")
            }
            ForwardError::Timeout => ApiError::new(
                ErrorCode::UpstreamTimeout,
                format!("the purchase API did not answer within {} ms", self.timeout.as_millis()),
            ),
        }
    }
}

/// `host[:port]` of an `http://host[:port][/base]` URL.
fn authority_of(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("http://")?;
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    (!authority.is_empty()).then_some(authority)
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

/// Removes [`REROUTING_HEADERS`], also spelt with `_` for `-` (which CGI-style servers read
/// the same).
fn strip_rerouting(headers: &mut HeaderMap) {
    let rerouting = |name: &HeaderName| {
        let n = name.as_str().as_bytes();
        REROUTING_HEADERS
            .iter()
            .any(|r| r.len() == n.len() && n.iter().zip(r.bytes()).all(|(a, b)| *a == b || (*a == b'_' && b == b'-')))
    };
    let found: Vec<HeaderName> = headers.keys().filter(|k| rerouting(k)).cloned().collect();
    for name in found {
        headers.remove(name);
    }
}

/// Why a request's framing is refused before anything else: a `Transfer-Encoding` other than
/// one `chunked` (`chunked, chunked`, or two header lines) is one that a proxy in front may
/// have framed differently, so its body is not the one the proxy passed. hyper refuses the
/// rest itself, with a bare 400 (a `Transfer-Encoding` not ending in `chunked`, an unreadable
/// or repeated `Content-Length`), and takes a message with both `Content-Length` and
/// `Transfer-Encoding` as RFC 9112 §6.3 says: chunked, the `Content-Length` removed, the
/// connection closed after it.
pub fn framing_refusal(headers: &HeaderMap) -> Option<&'static str> {
    let mut codings = headers.get_all(header::TRANSFER_ENCODING).iter();
    let first = codings.next()?;
    let chunked_once = first.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked") && codings.next().is_none();
    (!chunked_once).then_some("Transfer-Encoding must be `chunked`, once")
}

/// `e` and its sources, as `outer: inner: …` (hyper says what was wrong with the bytes only in
/// the innermost).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// What the purchase API's reading of the client's body has met.
#[derive(Default)]
struct BodyState {
    /// Why reading the client's body failed, once it has.
    failed: OnceLock<String>,
    /// The last read is waiting for the client's bytes (not for the purchase API to take them).
    waiting: AtomicBool,
    /// When the client's last bytes arrived (unset for a body the purchase API never read).
    ended: OnceLock<Instant>,
}

/// The client's body as the purchase API reads it, noting failures and waits in [`BodyState`],
/// cut off once `deadline` has passed with the rest still to come.
struct ClientBody {
    inner: Body,
    state: Arc<BodyState>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    limit: Duration,
}

impl hyper::body::Body for ClientBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if polled.is_pending() && self.deadline.as_mut().poll(cx).is_ready() {
            let why = format!(
                "the request body did not arrive in full within {} ms (http.body_read_timeout_ms)",
                self.limit.as_millis()
            );
            let _ = self.state.failed.set(why.clone());
            return Poll::Ready(Some(Err(axum::Error::new(why))));
        }
        self.state.waiting.store(polled.is_pending(), Ordering::Relaxed);
        match &polled {
            Poll::Ready(Some(Err(e))) => {
                let _ = self.state.failed.set(error_chain(e));
            }
            Poll::Ready(None) => {
                let _ = self.state.ended.set(Instant::now());
            }
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => {
                let _ = self.state.ended.set(Instant::now());
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rerouting_headers_go_in_either_spelling_and_others_stay() {
        let mut h = HeaderMap::new();
        for (k, v) in [("x-original-url", "/a"), ("x_http_method_override", "DELETE"), ("x-custom", "kept")] {
            h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h.insert(header::HOST, HeaderValue::from_static("client.example"));
        strip_rerouting(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["host", "x-custom"]);
    }

    #[test]
    fn the_default_host_is_the_upstreams_authority() {
        assert_eq!(authority_of("http://127.0.0.1:9000"), Some("127.0.0.1:9000"));
        assert_eq!(authority_of("http://shop/base"), Some("shop"));
        assert_eq!(authority_of("http://"), None);
    }
}
