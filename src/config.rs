//! The typed configuration tree, loaded once: defaults ← `vq.toml` ← `VQ_…` env ← flags.
//!
//! Unknown keys are an error naming the key. The token secret is never part of this tree:
//! it comes from `VQ_TOKEN_SECRET` or the file named by `VQ_TOKEN_SECRET_FILE` only.
//!
//! Each setting's type, default and bound stand in this one file (over 400 lines with its
//! tests) so they are read together; `redis_url` (credential redaction) and `secret` (the
//! token secret) are their own modules.

use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::domain::{DeclaredTargets, QueueTargetType};
use crate::gate::{GateRoute, RouteError};
use crate::store::StoreLimits;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Redis,
    Memory,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub listen: SocketAddr,
    /// Threads running `vq serve` / `vq pump`: 0 = one per core; 1 = everything on one thread
    /// (no hand-offs between threads, so fewer CPU seconds per request where vq shares a small
    /// machine, but no second core when its own is busy; docs/deploy.md has both measured).
    pub threads: usize,
    /// Names this process in locks, acknowledgements and stats; hostname + pid when unset.
    pub instance_id: Option<String>,
    pub store: StoreKind,
    pub redis: RedisSettings,
    pub queue: QueueSettings,
    pub token: TokenSettings,
    pub flag: FlagSettings,
    pub gate: GateSettings,
    pub log: LogSettings,
    pub page: PageSettings,
    pub http: HttpSettings,
    pub targets: TargetsSettings,
    pub adaptive: AdaptiveSettings,
    pub identity: IdentitySettings,
    pub entry: EntrySettings,
}

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

/// The targets declared in configuration: a queue answers only for declared targets (these,
/// and those declared at runtime with `vq target add`, kept in Redis).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TargetsSettings {
    /// Single targets, `limited-drop:42`.
    pub declared: Vec<String>,
    /// Whole id ranges of a type, `limited-drop:1000-1999`; each id counts against
    /// `queue.max_targets`.
    pub ranges: Vec<String>,
    /// The kinds of sale this deployment queues for; a target of any other type answers
    /// 404 UNKNOWN_TARGET. Shipped: `limited-drop` and `ticketing-event`.
    pub types: Vec<TargetTypeSettings>,
}

/// One kind of sale (`[[targets.types]]`): its slug and its defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetTypeSettings {
    /// `flash-coupon` in URLs (`/virtual-queues/flash-coupon/7/...`), `FLASH_COUPON` in keys
    /// and tokens; the name (`FLASH_COUPON`) is accepted too.
    pub slug: String,
    /// Users admitted per tick for this type's targets (else `queue.batch_size`); `vq batch
    /// set` overrides it as it does the global value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<u64>,
    /// Users who may wait per target of this type (else `queue.max_capacity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_capacity: Option<u64>,
    /// `fixed` or `adaptive` for this type's targets (else `queue.outflow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outflow: Option<Outflow>,
    /// The adaptive batch's bounds for this type's targets (else `queue.batch_min`/`_max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_min: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_max: Option<u64>,
    /// Active buyers at most for this type's targets in active-buyer mode (else
    /// `queue.max_active`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active: Option<u64>,
}

impl TargetTypeSettings {
    fn shipped(slug: &str) -> Self {
        Self {
            slug: slug.to_owned(),
            batch_size: None,
            max_capacity: None,
            outflow: None,
            batch_min: None,
            batch_max: None,
            max_active: None,
        }
    }
}

impl Default for TargetsSettings {
    fn default() -> Self {
        Self {
            declared: Vec::new(),
            ranges: Vec::new(),
            types: vec![TargetTypeSettings::shipped("limited-drop"), TargetTypeSettings::shipped("ticketing-event")],
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisSettings {
    /// Shown redacted wherever it is formatted (it may carry a password).
    pub url: RedisUrl,
    /// Comma-separated `redis://host:port`; set = Redis Cluster mode.
    pub cluster_nodes: Option<String>,
    /// A request's Redis work, so a dead or stalled Redis cannot hang requests: past it, enter
    /// and poll fail open, unless Redis answered other calls of this instance within the last
    /// second (the instance is busy, not Redis dead: the request waits on, up to 5 s).
    pub timeout_ms: u64,
}

mod redis_url;
mod secret;

pub use self::redis_url::{RedisUrl, redact_credentials};
pub use self::secret::secret_from_env;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueSettings {
    pub batch_size: u64,
    pub tick_ms: u64,
    pub max_capacity: u64,
    pub heartbeat_timeout_s: u64,
    pub max_evict_per_tick: u64,
    pub key_ttl_s: u64,
    /// Days a target's sale record (`queue:{T}:record`, what `vq sale report` reads) is kept
    /// after its last write: long after the queue keys (`key_ttl_s`) are gone.
    pub record_ttl_days: u64,
    /// Answer waiting users' polls from this instance's copy of the admission mark, with
    /// their heartbeats sent to Redis in one call per target every quarter tick (Redis store).
    pub local_polls: bool,
    /// Most targets that may be declared, in configuration (a range counts its ids) and at
    /// runtime together: what the pump, `/metrics`, `vq stats` and Redis hold grows with
    /// declared targets only, and this bounds them.
    pub max_targets: u64,
    /// Queues one user may hold a place in at once (waiting or pre-queued), across targets;
    /// beyond it enter answers 409 TOO_MANY_QUEUES naming them. 0: no limit.
    pub max_queues_per_user: u64,
    /// How many users each tick admits: `fixed` (the batch in force) or `adaptive` (a batch
    /// between `batch_min` and `batch_max` that follows the purchase API's health, `[adaptive]`).
    pub outflow: Outflow,
    pub batch_min: u64,
    pub batch_max: u64,
    /// Active-buyer mode (`outflow = "active"`): buyers admitted and not finished (token not
    /// yet collected, or held unused and unexpired) at most.
    pub max_active: u64,
    /// What enters and polls answer while Redis is down: let buyers through (`open`) or hold
    /// them with 503 QUEUE_UNAVAILABLE until it is back (`closed`).
    pub on_store_failure: OnStoreFailure,
}

/// `queue.outflow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outflow {
    #[default]
    Fixed,
    Adaptive,
    /// Active buyers: a new buyer is admitted as one finishes, never more than `max_active`
    /// at once.
    Active,
}

/// `[adaptive]`: the controller of `queue.outflow = "adaptive"` (domain::Controller).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdaptiveSettings {
    /// One decision per interval, cluster-wide, from the gates' observations of the one before
    /// (at least one tick: a shorter one counts as `queue.tick_ms`).
    pub interval_ms: u64,
    /// P95 latency of purchases the purchase API should stay under.
    pub latency_ms: u64,
    /// Share of purchases answered 5xx/429, timed out or not reached that it may give.
    pub error_ratio: f64,
    /// Users added to the batch after a healthy interval.
    pub increase: u64,
    /// Factor applied to the batch after an unhealthy one.
    pub decrease: f64,
    /// Fewer purchases than this in an interval: the batch holds.
    pub min_samples: u64,
    /// Purchases per tick to aim at: a healthy interval moves the batch to
    /// `target / (1 − no_show)` (admitted buyers whose token expired unused, smoothed) instead
    /// of adding `increase`. Unset: AIMD alone.
    pub target_purchases_per_tick: Option<u64>,
}

impl Default for AdaptiveSettings {
    fn default() -> Self {
        Self {
            interval_ms: 6000,
            latency_ms: 1000,
            error_ratio: 0.05,
            increase: 10,
            decrease: 0.7,
            min_samples: 10,
            target_purchases_per_tick: None,
        }
    }
}

/// `queue.on_store_failure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnStoreFailure {
    /// DIRECT_ADMITTED with a stateless token: the purchase API gets the burst, the sale goes on.
    #[default]
    Open,
    /// 503 QUEUE_UNAVAILABLE with Retry-After: nobody new is let in; tokens already issued
    /// keep working at the gate (their HMAC needs no Redis).
    Closed,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenSettings {
    pub ttl_s: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FlagSettings {
    pub refresh_ms: u64,
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
    /// Queue API calls and gated requests this instance works on at once; the next ones are
    /// answered 503 OVERLOADED with `Retry-After` (their places kept) rather than queued
    /// behind them, so latency stays bounded when the instance cannot keep up.
    pub max_in_flight: u64,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self { header_read_timeout_ms: 10_000, drain_timeout_ms: 10_000, cors_origins: None, max_in_flight: 1024 }
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
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    pub format: LogFormat,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            threads: 0,
            instance_id: None,
            store: StoreKind::Redis,
            redis: RedisSettings::default(),
            queue: QueueSettings::default(),
            token: TokenSettings::default(),
            flag: FlagSettings::default(),
            gate: GateSettings::default(),
            log: LogSettings::default(),
            page: PageSettings::default(),
            http: HttpSettings::default(),
            targets: TargetsSettings::default(),
            adaptive: AdaptiveSettings::default(),
            identity: IdentitySettings::default(),
            entry: EntrySettings::default(),
        }
    }
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self { url: "redis://127.0.0.1:6379".into(), cluster_nodes: None, timeout_ms: 250 }
    }
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            batch_size: 100,
            tick_ms: 2000,
            max_capacity: 100_000,
            heartbeat_timeout_s: 60,
            max_evict_per_tick: 1_000_000,
            key_ttl_s: 1800,
            record_ttl_days: 30,
            local_polls: true,
            on_store_failure: OnStoreFailure::Open,
            max_targets: 1000,
            max_queues_per_user: 10,
            outflow: Outflow::Fixed,
            batch_min: 10,
            batch_max: 1000,
            max_active: 1000,
        }
    }
}

impl Default for TokenSettings {
    fn default() -> Self {
        Self { ttl_s: 300 }
    }
}

impl Default for FlagSettings {
    fn default() -> Self {
        Self { refresh_ms: 1000 }
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

impl Default for LogSettings {
    fn default() -> Self {
        Self { format: LogFormat::Text }
    }
}

/// Batch sizes vq accepts, in `queue.batch_size` and `vq batch set`: beyond this one tick's
/// admission would be a single Redis call of unbounded length.
pub const BATCH_SIZE: RangeInclusive<u64> = 1..=100_000;
/// Proof-of-work difficulties vq accepts, in `entry.pow_bits` and `vq pow set`: at 32 bits a
/// browser needs hours.
pub const POW_BITS: RangeInclusive<u64> = 0..=32;
/// Token lifetimes vq accepts, in `token.ttl_s` and `vq mint --ttl`.
pub const TOKEN_TTL_S: RangeInclusive<u64> = 1..=86_400;
/// Under 10 ms a healthy Redis on another host times out; over 10 s a dead one holds requests.
pub const REDIS_TIMEOUT_MS: RangeInclusive<u64> = 10..=10_000;

/// The environment variable that sets a configuration key: `queue.batch_size` →
/// `VQ_QUEUE__BATCH_SIZE`.
pub fn env_name(key: &str) -> String {
    format!("VQ_{}", key.replace('.', "__").to_ascii_uppercase())
}
/// Upper bound of `queue.max_evict_per_tick` (eviction runs in slices of a thousand users and
/// half a tick of time at most, whatever this says).
const MAX_EVICT_PER_TICK: u64 = 10_000_000;

/// Environment variables with the `VQ_` prefix that are not configuration keys.
const NOT_KEYS: [&str; 5] =
    ["TOKEN_SECRET", "TOKEN_SECRET_FILE", "TOKEN_SECRET_PREVIOUS", "TOKEN_SECRET_PREVIOUS_FILE", "URL"];

/// Settings from the command line that win over every other source.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
}

/// Why the configuration cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {} does not exist", .0.display())]
    MissingFile(PathBuf),
    /// An unknown key or a value of the wrong type, with where it came from.
    #[error(transparent)]
    Parse(Box<figment::Error>),
    #[error(transparent)]
    Invalid(#[from] SettingError),
}

/// A setting that parses but is out of its bounds or does not fit with another.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingError {
    #[error("{key} ({}) must be between {min} and {max}, got {value}", env_name(.key))]
    OutOfRange { key: &'static str, min: u64, max: u64, value: u64 },
    #[error("{key} ({}) must be a fraction above 0 and at most 1 (decrease: under 1), got {value}", env_name(.key))]
    NotAFraction { key: &'static str, value: String },
    #[error("{key} must be between {min} and {max}, got {value}")]
    TypeOutOfRange { key: String, min: u64, max: u64, value: u64 },
    #[error("queue.key_ttl_s ({key_ttl_s}) must be longer than queue.heartbeat_timeout_s ({heartbeat_timeout_s})")]
    KeyTtlNotAboveHeartbeat { key_ttl_s: u64, heartbeat_timeout_s: u64 },
    #[error("gate.routes: {0}")]
    GateRoute(#[from] RouteError),
    #[error(
        "http.cors_origins (VQ_HTTP__CORS_ORIGINS): `{0}` is not an origin such as https://shop.example (scheme and host, no path, no wildcard)"
    )]
    CorsOrigin(String),
    #[error("{key} ({}) must be an http:// or https:// URL, got `{value}`", env_name(.key))]
    NotWebUrl { key: &'static str, value: String },
    #[error("gate.upstream must be an http:// URL, got `{0}`")]
    UpstreamNotHttp(String),
    #[error("gate.close_header (VQ_GATE__CLOSE_HEADER) must be an HTTP header name such as X-Queue-Close, got `{0}`")]
    CloseHeaderNotAName(String),
    #[error(
        "gate.upstream_host (VQ_GATE__UPSTREAM_HOST) must be a host such as shop.internal or shop.internal:8443, got `{0}`"
    )]
    UpstreamHostNotAHost(String),
    #[error("targets: {0}")]
    Target(#[from] crate::domain::ParseError),
    #[error(
        "targets.types: no type is configured: a queue needs at least one ([[targets.types]] slug = \"limited-drop\")"
    )]
    NoTypes,
    #[error("targets.types: `{0}` is configured twice")]
    TypeTwice(String),
    #[error("{what} names the type `{slug}`, which targets.types does not configure (configured: {configured})")]
    TypeNotConfigured { what: String, slug: String, configured: String },
    #[error(
        "targets.declared and targets.ranges declare {declared} targets, over queue.max_targets (VQ_QUEUE__MAX_TARGETS) = {max}"
    )]
    TooManyTargets { declared: u64, max: u64 },
}

/// Whether `host` can be `gate.upstream_host`: a DNS name or IP address (`[v6]`), and an
/// optional `:port`; no user info, no path.
fn is_host(host: &str) -> bool {
    let (name_ok, port) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, port)) => (ip.parse::<std::net::Ipv6Addr>().is_ok(), port),
            None => return false,
        },
        None => {
            let (name, port) = host.find(':').map_or((host, ""), |i| host.split_at(i));
            let label = |l: &str| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            (name.split('.').all(label), port)
        }
    };
    let port_ok = port.is_empty() || port.strip_prefix(':').is_some_and(|p| p.parse::<u16>().is_ok());
    name_ok && port_ok
}

impl Settings {
    /// Loads defaults ← `file` (when given, it must exist) ← `VQ_…` env ← `overrides`.
    pub fn load(file: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let mut fig = Figment::from(Serialized::defaults(Settings::default()));
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError::MissingFile(path.to_owned()));
            }
            fig = fig.merge(Toml::file_exact(path));
        }
        fig = fig.merge(Env::prefixed("VQ_").split("__").ignore(&NOT_KEYS)).merge(Serialized::defaults(overrides));
        let settings: Settings = fig.extract().map_err(|e| ConfigError::Parse(Box::new(e)))?;
        settings.check()?;
        Ok(settings)
    }

    fn check(&self) -> Result<(), SettingError> {
        let (q, g) = (&self.queue, &self.gate);
        let a = &self.adaptive;
        let bounded: [(&'static str, u64, RangeInclusive<u64>); 29] = [
            ("queue.max_active", q.max_active, 1..=1_000_000_000),
            ("adaptive.target_purchases_per_tick", a.target_purchases_per_tick.unwrap_or(1), BATCH_SIZE),
            ("queue.batch_min", q.batch_min, BATCH_SIZE),
            ("queue.batch_max", q.batch_max, q.batch_min.max(1)..=*BATCH_SIZE.end()),
            ("adaptive.interval_ms", a.interval_ms, 200..=600_000),
            ("adaptive.latency_ms", a.latency_ms, 1..=600_000),
            ("adaptive.increase", a.increase, 1..=*BATCH_SIZE.end()),
            ("adaptive.min_samples", a.min_samples, 0..=1_000_000),
            ("queue.max_targets", q.max_targets, 1..=1_000_000),
            ("queue.max_queues_per_user", q.max_queues_per_user, 0..=1_000_000),
            ("threads", self.threads as u64, 0..=1024),
            ("redis.timeout_ms", self.redis.timeout_ms, REDIS_TIMEOUT_MS),
            ("queue.batch_size", q.batch_size, BATCH_SIZE),
            ("queue.tick_ms", q.tick_ms, 200..=60_000),
            ("queue.max_capacity", q.max_capacity, 1..=1_000_000_000),
            ("queue.heartbeat_timeout_s", q.heartbeat_timeout_s, 1..=86_400),
            ("queue.max_evict_per_tick", q.max_evict_per_tick, 1..=MAX_EVICT_PER_TICK),
            ("queue.key_ttl_s", q.key_ttl_s, 60..=604_800),
            ("queue.record_ttl_days", q.record_ttl_days, 1..=3650),
            ("token.ttl_s", self.token.ttl_s, TOKEN_TTL_S),
            ("identity.visitor_ttl_s", self.identity.visitor_ttl_s, 60..=31_536_000),
            ("entry.pow_bits", u64::from(self.entry.pow_bits), POW_BITS),
            ("entry.pow_ttl_s", self.entry.pow_ttl_s, 10..=3_600),
            ("flag.refresh_ms", self.flag.refresh_ms, 1..=1000),
            ("gate.timeout_ms", g.timeout_ms, 100..=600_000),
            ("gate.pace_max_ticks", g.pace_max_ticks, 0..=60),
            ("http.header_read_timeout_ms", self.http.header_read_timeout_ms, 100..=600_000),
            ("http.drain_timeout_ms", self.http.drain_timeout_ms, 0..=600_000),
            ("http.max_in_flight", self.http.max_in_flight, 1..=1_000_000),
        ];
        for (key, value, range) in bounded {
            if !range.contains(&value) {
                return Err(SettingError::OutOfRange { key, min: *range.start(), max: *range.end(), value });
            }
        }
        for (key, value, ok) in [
            ("adaptive.error_ratio", a.error_ratio, a.error_ratio > 0.0 && a.error_ratio <= 1.0),
            ("adaptive.decrease", a.decrease, a.decrease > 0.0 && a.decrease < 1.0),
        ] {
            if !ok {
                return Err(SettingError::NotAFraction { key, value: value.to_string() });
            }
        }
        if q.key_ttl_s <= q.heartbeat_timeout_s {
            return Err(SettingError::KeyTtlNotAboveHeartbeat {
                key_ttl_s: q.key_ttl_s,
                heartbeat_timeout_s: q.heartbeat_timeout_s,
            });
        }
        let types = self.target_types()?;
        let mut seen = Vec::new();
        for (t, def) in types.iter().zip(&self.targets.types) {
            if seen.contains(t) {
                return Err(SettingError::TypeTwice(def.slug.clone()));
            }
            seen.push(*t);
            let what = |key| format!("targets.types.{}.{key}", t.slug());
            let (min, _) = self.type_batch_bounds(*t);
            for (key, value, range) in [
                ("batch_size", def.batch_size, BATCH_SIZE),
                ("max_capacity", def.max_capacity, 1..=1_000_000_000),
                ("batch_min", def.batch_min, BATCH_SIZE),
                ("batch_max", def.batch_max, min.max(1)..=*BATCH_SIZE.end()),
                ("max_active", def.max_active, 1..=1_000_000_000),
            ] {
                if let Some(v) = value.filter(|v| !range.contains(v)) {
                    return Err(SettingError::TypeOutOfRange {
                        key: what(key),
                        min: *range.start(),
                        max: *range.end(),
                        value: v,
                    });
                }
            }
        }
        if types.is_empty() {
            return Err(SettingError::NoTypes);
        }
        let not_configured = |what: String, kind: QueueTargetType| SettingError::TypeNotConfigured {
            what,
            slug: kind.slug().to_string(),
            configured: types.iter().map(|t| t.slug().to_string()).collect::<Vec<_>>().join(", "),
        };
        for r in &g.routes {
            let kind = QueueTargetType::parse_any(&r.target).map_err(RouteError::from)?;
            if !types.contains(&kind) {
                return Err(not_configured(format!("gate.routes ({})", r.path), kind));
            }
        }
        crate::gate::GateRoutes::compile(&g.routes)?;
        let declared = self.declared_targets()?;
        for kind in declared.kinds() {
            if !types.contains(&kind) {
                return Err(not_configured("targets.declared / targets.ranges".to_owned(), kind));
            }
        }
        if declared.len() > q.max_targets {
            return Err(SettingError::TooManyTargets { declared: declared.len(), max: q.max_targets });
        }
        self.http.cors_origin_list()?;
        for (key, url) in [("page.return_url", &self.page.return_url), ("page.embed_origin", &self.page.embed_origin)] {
            if let Some(u) = url.as_ref().filter(|u| !(u.starts_with("https://") || u.starts_with("http://"))) {
                return Err(SettingError::NotWebUrl { key, value: u.clone() });
            }
        }
        if let Some(u) = g.upstream.as_ref().filter(|u| !(u.starts_with("http://") && u.len() > 7)) {
            return Err(SettingError::UpstreamNotHttp(u.clone()));
        }
        if axum::http::HeaderName::from_bytes(g.close_header.as_bytes()).is_err() {
            return Err(SettingError::CloseHeaderNotAName(g.close_header.clone()));
        }
        if let Some(h) = g.upstream_host.as_ref().filter(|h| !is_host(h)) {
            return Err(SettingError::UpstreamHostNotAHost(h.clone()));
        }
        Ok(())
    }

    pub fn instance_id(&self) -> String {
        self.instance_id.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "vq".to_owned());
            format!("{host}-{}", std::process::id())
        })
    }

    /// The adaptive outflow's control interval: `adaptive.interval_ms`, at least one tick.
    pub fn outflow_interval_ms(&self) -> u64 {
        self.adaptive.interval_ms.max(self.queue.tick_ms)
    }

    /// The adaptive outflow's controller of a target of `kind` (its bounds, `[adaptive]`).
    pub fn controller(&self, kind: QueueTargetType) -> crate::domain::Controller {
        let a = &self.adaptive;
        let (batch_min, batch_max) = self.type_batch_bounds(kind);
        crate::domain::Controller {
            batch_min,
            batch_max,
            latency_ms: a.latency_ms,
            error_ratio: a.error_ratio,
            increase: a.increase,
            decrease: a.decrease,
            min_samples: a.min_samples,
            target_purchases: a.target_purchases_per_tick,
        }
    }

    /// The configured target types (`[[targets.types]]`), in order.
    pub fn target_types(&self) -> Result<Vec<QueueTargetType>, crate::domain::ParseError> {
        self.targets.types.iter().map(|t| QueueTargetType::parse_any(&t.slug)).collect()
    }

    fn type_settings(&self, kind: QueueTargetType) -> Option<&TargetTypeSettings> {
        self.targets.types.iter().find(|t| t.slug == *kind.slug() || t.slug == kind.as_str())
    }

    /// The batch a target of `kind` is admitted by unless `vq batch set` says otherwise.
    pub fn type_batch_size(&self, kind: QueueTargetType) -> u64 {
        self.type_settings(kind).and_then(|t| t.batch_size).unwrap_or(self.queue.batch_size)
    }

    /// How a target of `kind` is admitted: its type's `outflow`, else `queue.outflow`.
    pub fn type_outflow(&self, kind: QueueTargetType) -> Outflow {
        self.type_settings(kind).and_then(|t| t.outflow).unwrap_or(self.queue.outflow)
    }

    /// Whether a target of `kind` has an adaptive outflow.
    pub fn is_adaptive(&self, kind: QueueTargetType) -> bool {
        self.type_outflow(kind) == Outflow::Adaptive
    }

    /// The adaptive batch's bounds for a target of `kind`: its type's, else `queue.batch_min`
    /// and `queue.batch_max`.
    pub fn type_batch_bounds(&self, kind: QueueTargetType) -> (u64, u64) {
        let t = self.type_settings(kind);
        (
            t.and_then(|t| t.batch_min).unwrap_or(self.queue.batch_min),
            t.and_then(|t| t.batch_max).unwrap_or(self.queue.batch_max),
        )
    }

    /// Active buyers at most for a target of `kind` (active-buyer mode).
    pub fn type_max_active(&self, kind: QueueTargetType) -> u64 {
        self.type_settings(kind).and_then(|t| t.max_active).unwrap_or(self.queue.max_active)
    }

    /// The users who may wait per target of `kind`.
    pub fn type_max_capacity(&self, kind: QueueTargetType) -> u64 {
        self.type_settings(kind).and_then(|t| t.max_capacity).unwrap_or(self.queue.max_capacity)
    }

    /// The targets declared in configuration (`[targets]`).
    pub fn declared_targets(&self) -> Result<DeclaredTargets, crate::domain::ParseError> {
        let listed = self.targets.declared.iter().map(|t| t.parse()).collect::<Result<_, _>>()?;
        let ranges = self.targets.ranges.iter().map(|r| r.parse()).collect::<Result<_, _>>()?;
        Ok(DeclaredTargets { listed, ranges })
    }

    pub fn limits(&self) -> StoreLimits {
        StoreLimits {
            max_capacity: self.queue.max_capacity,
            type_capacity: self
                .targets
                .types
                .iter()
                .filter_map(|t| Some((QueueTargetType::parse_any(&t.slug).ok()?, t.max_capacity?)))
                .collect(),
            key_ttl_s: self.queue.key_ttl_s,
            token_ttl_s: self.token.ttl_s,
            record_ttl_s: self.queue.record_ttl_days * 86_400,
            tick_ms: self.queue.tick_ms,
        }
    }

    /// The cluster's seed nodes when Redis Cluster mode is on (`redis.cluster_nodes` set and
    /// not blank).
    pub fn redis_cluster_nodes(&self) -> Option<Vec<String>> {
        let nodes: Vec<String> = self
            .redis
            .cluster_nodes
            .as_deref()?
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        (!nodes.is_empty()).then_some(nodes)
    }

    pub fn redis_timeout(&self) -> Duration {
        Duration::from_millis(self.redis.timeout_ms)
    }

    /// The admission lock lives one tick minus 100 ms, so it is free again at the next tick.
    pub fn lock_ttl_ms(&self) -> u64 {
        self.queue.tick_ms - 100
    }
}

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
mod tests {
    use super::*;
    use figment::Jail;

    #[test]
    fn defaults_match_the_spec() {
        Jail::expect_with(|_| {
            let s = Settings::load(None, &Overrides::default()).unwrap();
            assert_eq!(s.listen.to_string(), "127.0.0.1:8080");
            assert_eq!(s.queue.batch_size, 100);
            assert_eq!(s.queue.tick_ms, 2000);
            assert_eq!(s.queue.max_capacity, 100_000);
            assert_eq!(s.token.ttl_s, 300);
            assert_eq!(s.lock_ttl_ms(), 1900);
            assert_eq!(s.threads, 0, "one worker per core unless told otherwise");
            let routes = crate::gate::GateRoutes::compile(&s.gate.routes).unwrap();
            let gated = |p: &str| routes.match_path(&crate::gate::CanonicalPath::parse(p).unwrap());
            assert_eq!(gated("/limited-drops/42/orders"), Some(Ok("LIMITED_DROP:42".parse().unwrap())));
            assert_eq!(gated("/events/7/seats/select"), Some(Ok("TICKETING_EVENT:7".parse().unwrap())));
            Ok(())
        });
    }

    #[test]
    fn file_then_env_then_flags() {
        Jail::expect_with(|jail| {
            jail.create_file("vq.toml", "listen = \"127.0.0.1:9000\"\n[queue]\nbatch_size = 50\ntick_ms = 1000\n")?;
            jail.set_env("VQ_QUEUE__BATCH_SIZE", "70");
            jail.set_env("VQ_REDIS__URL", "redis://127.0.0.1:7000");
            jail.set_env("VQ_TOKEN_SECRET", "not a key");
            let s = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap();
            assert_eq!(s.queue.batch_size, 70);
            assert_eq!(s.queue.tick_ms, 1000);
            assert_eq!(s.redis.url, "redis://127.0.0.1:7000");
            assert_eq!(s.listen.to_string(), "127.0.0.1:9000");
            let o = Overrides { listen: Some("127.0.0.1:9100".parse().unwrap()) };
            let s = Settings::load(Some(Path::new("vq.toml")), &o).unwrap();
            assert_eq!(s.listen.to_string(), "127.0.0.1:9100");
            Ok(())
        });
    }

    #[test]
    fn target_types_come_from_the_file_with_their_routes_and_defaults() {
        Jail::expect_with(|jail| {
            let types = "[[targets.types]]\nslug = \"limited-drop\"\n\n[[targets.types]]\nslug = \"flash-coupon\"\n\
                         batch_size = 20\nmax_capacity = 500\n";
            let routes =
                "[[gate.routes]]\nmethod = \"POST\"\npath = \"/coupons/{id}/claim\"\ntarget = \"flash-coupon\"\n";
            jail.create_file("vq.toml", &format!("[targets]\ndeclared = [\"flash-coupon:3\"]\n\n{types}\n{routes}"))?;
            let s = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap();
            let coupon = QueueTargetType::from_slug("flash-coupon").unwrap();
            assert_eq!(s.target_types().unwrap(), vec![QueueTargetType::LIMITED_DROP, coupon]);
            assert_eq!((s.type_batch_size(coupon), s.type_max_capacity(coupon)), (20, 500));
            assert_eq!(s.type_batch_size(QueueTargetType::LIMITED_DROP), 100, "queue.batch_size");
            assert_eq!(s.limits().capacity(coupon), 500);
            assert_eq!(s.limits().capacity(QueueTargetType::LIMITED_DROP), 100_000);
            let compiled = crate::gate::GateRoutes::compile(&s.gate.routes).unwrap();
            let path = crate::gate::CanonicalPath::parse("/coupons/3/claim").unwrap();
            assert_eq!(compiled.match_path(&path), Some(Ok("flash-coupon:3".parse().unwrap())));
            assert_eq!(compiled.path_of("flash-coupon:3".parse().unwrap()).as_deref(), Some("/coupons/3/claim"));

            // What the configuration cannot say.
            for (file, says) in [
                ("[targets]\ntypes = []\n", "no type is configured"),
                (&format!("{types}[[targets.types]]\nslug = \"FLASH_COUPON\"\n"), "configured twice"),
                ("[[targets.types]]\nslug = \"flash_coupon\"\n", "not a target type"),
                (
                    &format!(
                        "{types}{routes}[[gate.routes]]\nmethod = \"POST\"\npath = \"/x/{{id}}\"\ntarget = \"mega-sale\"\n"
                    ),
                    "gate.routes (/x/{id}) names the type `mega-sale`, which targets.types does not configure",
                ),
                (
                    "[targets]\ndeclared = [\"flash-coupon:3\"]\n",
                    "targets.declared / targets.ranges names the type `flash-coupon`",
                ),
                (
                    "[[targets.types]]\nslug = \"limited-drop\"\nbatch_size = 0\n",
                    "targets.types.limited-drop.batch_size must be between 1 and",
                ),
                ("[[targets.types]]\nslug = \"limited-drop\"\nbatchsize = 5\n", "unknown field"),
            ] {
                jail.create_file("vq.toml", file)?;
                let err = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap_err().to_string();
                assert!(err.contains(says), "{file}: {err}");
            }
            Ok(())
        });
    }

    #[test]
    fn adaptive_outflow_settings_are_bounded() {
        Jail::expect_with(|jail| {
            jail.set_env("VQ_QUEUE__OUTFLOW", "adaptive");
            let s = Settings::load(None, &Overrides::default()).unwrap();
            assert_eq!(s.queue.outflow, Outflow::Adaptive);
            let c = s.controller(QueueTargetType::LIMITED_DROP);
            assert_eq!((c.batch_min, c.batch_max), (10, 1000));
            for (key, value, says) in [
                ("VQ_ADAPTIVE__DECREASE", "1.5", "adaptive.decrease (VQ_ADAPTIVE__DECREASE) must be a fraction"),
                ("VQ_ADAPTIVE__ERROR_RATIO", "0", "adaptive.error_ratio"),
                ("VQ_QUEUE__BATCH_MIN", "2000", "queue.batch_max (VQ_QUEUE__BATCH_MAX) must be between 2000 and"),
                ("VQ_QUEUE__OUTFLOW", "auto", "found `auto`, expected"),
            ] {
                jail.set_env(key, value);
                let err = Settings::load(None, &Overrides::default()).unwrap_err().to_string();
                assert!(err.contains(says), "{key}={value}: {err}");
                jail.clear_env();
                jail.set_env("VQ_QUEUE__OUTFLOW", "adaptive");
            }
            Ok(())
        });
    }

    #[test]
    fn a_target_type_may_have_its_own_outflow_and_bounds() {
        Jail::expect_with(|jail| {
            let types = "[[targets.types]]\nslug = \"limited-drop\"\noutflow = \"adaptive\"\nbatch_min = 5\nbatch_max = 50\n\n\
                         [[targets.types]]\nslug = \"ticketing-event\"\n";
            jail.create_file("vq.toml", types)?;
            let s = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap();
            let event = QueueTargetType::from_slug("ticketing-event").unwrap();
            assert!(s.is_adaptive(QueueTargetType::LIMITED_DROP) && !s.is_adaptive(event), "queue.outflow is fixed");
            let c = s.controller(QueueTargetType::LIMITED_DROP);
            assert_eq!((c.batch_min, c.batch_max), (5, 50));
            assert_eq!(s.type_batch_bounds(event), (10, 1000), "queue.batch_min / batch_max");
            for (file, says) in [
                ("[[targets.types]]\nslug = \"limited-drop\"\nbatch_min = 60\nbatch_max = 50\n", "batch_max"),
                ("[[targets.types]]\nslug = \"limited-drop\"\noutflow = \"auto\"\n", "auto"),
            ] {
                jail.create_file("vq.toml", file)?;
                let err = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap_err().to_string();
                assert!(err.contains(says), "{file}: {err}");
            }
            Ok(())
        });
    }

    #[test]
    fn cluster_nodes_from_env_switch_to_cluster_mode() {
        Jail::expect_with(|jail| {
            assert_eq!(Settings::load(None, &Overrides::default()).unwrap().redis_cluster_nodes(), None);
            jail.set_env("VQ_REDIS__CLUSTER_NODES", "redis://10.0.0.1:7000, redis://10.0.0.2:7000,");
            let s = Settings::load(None, &Overrides::default()).unwrap();
            assert_eq!(
                s.redis_cluster_nodes(),
                Some(vec!["redis://10.0.0.1:7000".to_owned(), "redis://10.0.0.2:7000".to_owned()])
            );
            jail.set_env("VQ_REDIS__CLUSTER_NODES", " ");
            assert_eq!(Settings::load(None, &Overrides::default()).unwrap().redis_cluster_nodes(), None);
            Ok(())
        });
    }

    #[test]
    fn threads_from_env_and_bounded() {
        Jail::expect_with(|jail| {
            jail.set_env("VQ_THREADS", "1");
            assert_eq!(Settings::load(None, &Overrides::default()).unwrap().threads, 1);
            jail.set_env("VQ_THREADS", "5000");
            let err = Settings::load(None, &Overrides::default()).unwrap_err();
            assert!(err.to_string().contains("threads (VQ_THREADS) must be between 0 and 1024"), "{err}");
            jail.set_env("VQ_THREADS", "two");
            assert!(Settings::load(None, &Overrides::default()).is_err());
            Ok(())
        });
    }

    #[test]
    fn the_record_is_kept_record_ttl_days_and_the_store_gets_it_in_seconds() {
        Jail::expect_with(|jail| {
            let s = Settings::load(None, &Overrides::default()).unwrap();
            assert_eq!((s.queue.record_ttl_days, s.limits().record_ttl_s), (30, 30 * 86_400));
            jail.set_env("VQ_QUEUE__RECORD_TTL_DAYS", "2");
            assert_eq!(Settings::load(None, &Overrides::default()).unwrap().limits().record_ttl_s, 2 * 86_400);
            jail.set_env("VQ_QUEUE__RECORD_TTL_DAYS", "0");
            let err = Settings::load(None, &Overrides::default()).unwrap_err();
            assert_eq!(
                err.to_string(),
                "queue.record_ttl_days (VQ_QUEUE__RECORD_TTL_DAYS) must be between 1 and 3650, got 0"
            );
            Ok(())
        });
    }

    #[test]
    fn a_value_that_parses_but_breaks_a_rule_says_which() {
        Jail::expect_with(|jail| {
            let load = || Settings::load(None, &Overrides::default()).unwrap_err();
            jail.set_env("VQ_QUEUE__KEY_TTL_S", "60");
            jail.set_env("VQ_QUEUE__HEARTBEAT_TIMEOUT_S", "60");
            let err = load();
            assert!(matches!(err, ConfigError::Invalid(SettingError::KeyTtlNotAboveHeartbeat { .. })), "{err:?}");
            assert_eq!(err.to_string(), "queue.key_ttl_s (60) must be longer than queue.heartbeat_timeout_s (60)");
            jail.set_env("VQ_QUEUE__KEY_TTL_S", "10");
            let err = load();
            let range = SettingError::OutOfRange { key: "queue.key_ttl_s", min: 60, max: 604_800, value: 10 };
            assert!(matches!(&err, ConfigError::Invalid(e) if *e == range), "{err:?}");
            assert_eq!(err.to_string(), "queue.key_ttl_s (VQ_QUEUE__KEY_TTL_S) must be between 60 and 604800, got 10");
            jail.set_env("VQ_QUEUE__KEY_TTL_S", "120");
            jail.set_env("VQ_GATE__UPSTREAM", "https://shop");
            assert!(matches!(load(), ConfigError::Invalid(SettingError::UpstreamNotHttp(_))));
            jail.set_env("VQ_GATE__UPSTREAM", "http://127.0.0.1:9000");
            for bad in ["", "Sold Out", "x-queue-close:", "\u{e9}t\u{e9}"] {
                jail.set_env("VQ_GATE__CLOSE_HEADER", bad);
                let err = load();
                let named = SettingError::CloseHeaderNotAName(bad.into());
                assert!(matches!(&err, ConfigError::Invalid(e) if *e == named), "{bad:?}: {err:?}");
                assert!(err.to_string().contains("gate.close_header (VQ_GATE__CLOSE_HEADER)"), "{err}");
            }
            jail.set_env("VQ_GATE__CLOSE_HEADER", "X-Sold-Out");
            for bad in ["", "shop internal", "user@shop", "shop/x", "shop:port"] {
                jail.set_env("VQ_GATE__UPSTREAM_HOST", bad);
                let named = SettingError::UpstreamHostNotAHost(bad.into());
                assert!(matches!(&load(), ConfigError::Invalid(e) if *e == named), "{bad:?}");
            }
            for good in ["shop.internal", "shop.internal:8443", "[::1]:9000"] {
                jail.set_env("VQ_GATE__UPSTREAM_HOST", good);
                assert_eq!(
                    Settings::load(None, &Overrides::default()).unwrap().gate.upstream_host.as_deref(),
                    Some(good)
                );
            }
            assert_eq!(Settings::load(None, &Overrides::default()).unwrap().gate.close_header, "X-Sold-Out");
            let missing = Settings::load(Some(Path::new("nope.toml")), &Overrides::default()).unwrap_err();
            assert_eq!(missing.to_string(), "config file nope.toml does not exist");
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        Jail::expect_with(|jail| {
            jail.create_file("vq.toml", "[queue]\nbatch_sise = 5\n")?;
            let err = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap_err();
            assert!(err.to_string().contains("batch_sise"), "{err}");
            Ok(())
        });
        Jail::expect_with(|jail| {
            jail.set_env("VQ_QUEUE__TICKMS", "5");
            let err = Settings::load(None, &Overrides::default()).unwrap_err();
            assert!(err.to_string().contains("tickms"), "{err}");
            Ok(())
        });
    }
}
