//! What a request meets: `[gate]`, `[http]`, `[page]`, `[identity]` and `[entry]`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::SettingError;
use crate::gate::GateRoute;

/// Who a buyer is.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdentitySettings {
    pub mode: IdentityMode,
    /// How long a visitor keeps their id (the cookie's `Max-Age`), in seconds.
    pub visitor_ttl_s: u64,
    /// The visitor cookie's `Secure` attribute: browsers then send it over HTTPS only (and to
    /// `localhost`/`127.0.0.1`). Off only for trials over plain HTTP on another host.
    pub cookie_secure: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IdentityMode {
    /// `X-User-Id`, set by the authenticating proxy in front of vq.
    Header,
    /// Anonymous visitors: vq names each one with a random id, signed, in a cookie (or the
    /// `X-Visitor-Token` header, for apps without cookies); `X-User-Id` is refused.
    Visitor,
}

/// What entering costs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EntrySettings {
    /// Proof of work at entry: a new user solves a challenge of this many leading zero bits
    /// of SHA-256 before getting a place (0: off). `vq pow set` changes it at runtime.
    pub pow_bits: u8,
    /// How long a challenge can be solved and used, in seconds.
    pub pow_ttl_s: u64,
}

impl Default for IdentitySettings {
    fn default() -> Self {
        Self { mode: IdentityMode::Header, visitor_ttl_s: 86_400, cookie_secure: true }
    }
}

impl Default for EntrySettings {
    fn default() -> Self {
        Self { pow_bits: 0, pow_ttl_s: 120 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GateSettings {
    /// The purchase API behind the gate, e.g. `http://127.0.0.1:9000`.
    pub upstream: Option<String>,
    /// Time to wait for the upstream's response headers before answering 504.
    pub timeout_ms: u64,
    /// Routes whose requests need a valid entry token (when the flag applies).
    pub routes: Vec<GateRoute>,
    /// Forward at most one batch of purchases per target per tick: purchases over the budget
    /// wait for a later tick instead of reaching the purchase API in a burst.
    pub pace: bool,
    /// How many ticks a purchase may wait for room; past that it gets 429 DOWNSTREAM_BUSY.
    pub pace_max_ticks: u64,
    /// A response header of the purchase API that closes the purchase's target (sold out),
    /// its value being the message waiting users get; the gate strips it from the response.
    pub close_header: String,
    /// `Host` of every request forwarded to the purchase API (unset: the authority of
    /// `upstream`); the client's own `Host` never reaches it.
    pub upstream_host: Option<String>,
}

/// Limits of the HTTP server, so misbehaving clients cannot hold connections or the shutdown.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// A connection must send a complete request head within this time of opening or of its
    /// previous response, else it is closed: bounds slow senders and idle keep-alive alike.
    pub header_read_timeout_ms: u64,
    /// After SIGTERM, how long in-flight requests may run before their connections are dropped.
    pub drain_timeout_ms: u64,
    /// Comma-separated origins (`https://shop.example`) whose web apps may call the queue API
    /// from the browser (CORS); unset: same-origin only.
    pub cors_origins: Option<String>,
    /// Queue API calls, `/gate/verify` checks and gated requests this instance works on at
    /// once; the next ones are answered 503 OVERLOADED with `Retry-After` (their places kept)
    /// rather than queued behind them, so latency stays bounded when the instance cannot keep
    /// up. The heaviest client's requests are shed first.
    pub max_in_flight: u64,
    /// Requests the gate forwards unchecked (paths that are not gated routes) this instance
    /// works on at once: a budget of their own, so slow traffic to the rest of the app never
    /// takes the queue's places.
    pub max_forwarded_in_flight: u64,
    /// A request body the gate forwards must arrive in full within this time of the forward's
    /// start, else the request is answered 400 and its place freed.
    pub body_read_timeout_ms: u64,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: 10_000,
            drain_timeout_ms: 10_000,
            cors_origins: None,
            max_in_flight: 1024,
            max_forwarded_in_flight: 1024,
            body_read_timeout_ms: 10_000,
        }
    }
}

impl HttpSettings {
    /// The origins of `cors_origins`, each `http(s)://host[:port]`, or why one is not.
    pub fn cors_origin_list(&self) -> Result<Vec<String>, SettingError> {
        let Some(list) = &self.cors_origins else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for origin in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            let rest = origin.strip_prefix("https://").or_else(|| origin.strip_prefix("http://"));
            match rest {
                Some(host) if !host.is_empty() && !host.contains('/') && !host.contains('*') => {
                    out.push(origin.to_ascii_lowercase());
                }
                _ => return Err(SettingError::CorsOrigin(origin.to_owned())),
            }
        }
        Ok(out)
    }

    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }

    pub fn drain_timeout(&self) -> Duration {
        Duration::from_millis(self.drain_timeout_ms)
    }

    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }
}

impl Default for GateSettings {
    fn default() -> Self {
        let route = |method: &str, path: &str, target: &str| GateRoute {
            method: method.into(),
            path: path.into(),
            target: target.into(),
        };
        Self {
            upstream: None,
            timeout_ms: 10_000,
            pace: true,
            pace_max_ticks: 2,
            close_header: "X-Queue-Close".into(),
            upstream_host: None,
            routes: vec![
                route("POST", "/limited-drops/{dropId}/orders", "LIMITED_DROP"),
                route("POST", "/events/{id}/seats/select", "TICKETING_EVENT"),
            ],
        }
    }
}

/// The waiting page at `/waiting-room/{type}/{id}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PageSettings {
    /// Let `?user=ID` stand in for `X-User-Id` (trials without an authenticating proxy only:
    /// anyone can then claim any id).
    pub allow_query_user: bool,
    /// Where an admitted buyer is sent, e.g. `https://shop.example/drops/{id}/buy?entryToken={token}`
    /// (`{type}`, `{id}`, `{user}`, `{token}` substituted, URL-encoded). Unset: the page shows
    /// the token and raises its events only.
    pub return_url: Option<String>,
    /// The origin of an app embedding the page in a frame, which receives the token by
    /// `postMessage` (unset: no message leaves the page).
    pub embed_origin: Option<String>,
    /// An HTML file to serve instead of the built-in page; it must hold `{{config}}` and
    /// `{{script}}` (docs/waiting-page.md).
    pub template: Option<std::path::PathBuf>,
}
