//! The bounds of every setting and the rules between settings, checked once at load.

use std::ops::RangeInclusive;

use super::events::{is_webhook_name, webhook_url_problem};
use super::{EVENTS_SECRET_ENV, Settings, env_name};
use crate::domain::QueueTargetType;
use crate::gate::RouteError;

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

/// Upper bound of `queue.max_evict_per_tick` (eviction runs in slices of a thousand users and
/// half a tick of time at most, whatever this says).
const MAX_EVICT_PER_TICK: u64 = 10_000_000;
/// Purchases one entry token may make (`purchases_per_admission`): at least one.
const PURCHASES_PER_ADMISSION: RangeInclusive<u64> = 1..=1_000;
/// Purchases one user may make per sale (`purchases_per_user`); 0 = no limit.
const PURCHASES_PER_USER: RangeInclusive<u64> = 0..=1_000_000;

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
    #[error("{key} must be an http:// URL such as http://127.0.0.1:9000/hooks/vq ({why}), got `{value}`")]
    WebhookUrl { key: String, value: String, why: &'static str },
    #[error("events.webhooks: the name `{0}` must be 1-64 letters, digits, `-` or `_`")]
    WebhookName(String),
    #[error("events.webhooks: `{0}` names two webhooks (names keep each one's place in the log)")]
    WebhookTwice(String),
    #[error(
        "events.webhooks.{name}.secret_env: `{env}` starts with VQ_, which vq reads as configuration keys; use VQ_EVENTS_SECRET or a name of your own"
    )]
    WebhookSecretEnv { name: String, env: String },
    #[error("events.retry_max_ms ({max}) must be at least events.retry_min_ms ({min})")]
    RetryMaxUnderMin { min: u64, max: u64 },
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
    #[error("targets.types.{slug}.lanes: {why}")]
    Lanes { slug: String, why: String },
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
    pub(super) fn check(&self) -> Result<(), SettingError> {
        let (q, g) = (&self.queue, &self.gate);
        let a = &self.adaptive;
        let wait_replicas = match self.redis.wait_replicas {
            crate::store::ReplicaWait::Auto => 0,
            crate::store::ReplicaWait::Count(n) => n,
        };
        let bounded: [(&'static str, u64, RangeInclusive<u64>); 41] = [
            ("events.max_len", self.events.max_len, 10..=10_000_000),
            ("events.admitted_every", self.events.admitted_every, 0..=1_000_000_000),
            ("events.timeout_ms", self.events.timeout_ms, 100..=60_000),
            ("events.retry_min_ms", self.events.retry_min_ms, 10..=600_000),
            ("events.poll_ms", self.events.poll_ms, 50..=60_000),
            ("queue.purchases_per_admission", q.purchases_per_admission, PURCHASES_PER_ADMISSION),
            ("queue.purchases_per_user", q.purchases_per_user, PURCHASES_PER_USER),
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
            ("redis.wait_replicas", wait_replicas, 0..=100),
            // Under the 5 s a request waits for an answering Redis (store::BUSY_WAIT_MAX).
            ("redis.wait_timeout_ms", self.redis.wait_timeout_ms, 1..=4_000),
            ("redis.coalesce_wait_ms", self.redis.coalesce_wait_ms, 0..=50),
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
            ("http.max_forwarded_in_flight", self.http.max_forwarded_in_flight, 1..=1_000_000),
            ("http.body_read_timeout_ms", self.http.body_read_timeout_ms, 100..=600_000),
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
            // A floor of its own stays at or below the ceiling it gets: its own (checked next)
            // or queue.batch_max.
            let min_cap = if def.batch_max.is_some() { *BATCH_SIZE.end() } else { self.queue.batch_max };
            for (key, value, range) in [
                ("batch_size", def.batch_size, BATCH_SIZE),
                ("max_capacity", def.max_capacity, 1..=1_000_000_000),
                ("batch_min", def.batch_min, *BATCH_SIZE.start()..=min_cap),
                ("batch_max", def.batch_max, min.max(1)..=*BATCH_SIZE.end()),
                ("max_active", def.max_active, 1..=1_000_000_000),
                ("purchases_per_admission", def.purchases_per_admission, PURCHASES_PER_ADMISSION),
                ("purchases_per_user", def.purchases_per_user, PURCHASES_PER_USER),
                ("shards", def.shards, 1..=u64::from(crate::domain::MAX_SHARDS)),
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
        for (t, def) in types.iter().zip(&self.targets.types) {
            check_lanes(&t.slug(), def)?;
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
        self.check_events()
    }

    fn check_events(&self) -> Result<(), SettingError> {
        let e = &self.events;
        if e.retry_max_ms < e.retry_min_ms {
            return Err(SettingError::RetryMaxUnderMin { min: e.retry_min_ms, max: e.retry_max_ms });
        }
        for (i, u) in e.webhook_urls.iter().enumerate() {
            if let Some(why) = webhook_url_problem(u) {
                return Err(SettingError::WebhookUrl {
                    key: format!("events.webhook_urls[{i}]"),
                    value: u.clone(),
                    why,
                });
            }
        }
        for w in &e.webhooks {
            if !is_webhook_name(&w.name) {
                return Err(SettingError::WebhookName(w.name.clone()));
            }
            if let Some(why) = webhook_url_problem(&w.url) {
                return Err(SettingError::WebhookUrl {
                    key: format!("events.webhooks.{}.url", w.name),
                    value: w.url.clone(),
                    why,
                });
            }
            let env = w.secret_env();
            if env.starts_with("VQ_") && env != EVENTS_SECRET_ENV {
                return Err(SettingError::WebhookSecretEnv { name: w.name.clone(), env: env.to_owned() });
            }
        }
        let all = e.all_webhooks();
        for (i, w) in all.iter().enumerate() {
            if all[..i].iter().any(|o| o.name == w.name) {
                return Err(SettingError::WebhookTwice(w.name.clone()));
            }
        }
        Ok(())
    }
}

/// A type's lanes: well-formed names, each once, shares of 1 to 99 adding up to 99 at most (the
/// public lane keeps at least 1 %), at most `MAX_LANES`, and a claim key's variable named
/// outside `VQ_`.
fn check_lanes(slug: &str, def: &super::queue::TargetTypeSettings) -> Result<(), SettingError> {
    let err = |why: String| SettingError::Lanes { slug: slug.to_owned(), why };
    if def.lanes.len() > crate::domain::MAX_LANES {
        return Err(err(format!("at most {} lanes, got {}", crate::domain::MAX_LANES, def.lanes.len())));
    }
    let mut names = Vec::new();
    for l in &def.lanes {
        let name: crate::domain::LaneName =
            l.name.parse().map_err(|e: crate::domain::BadLaneName| err(e.to_string()))?;
        if names.contains(&name) {
            return Err(err(format!("`{}` is named twice", l.name)));
        }
        names.push(name);
        if !(1..=99).contains(&l.share) {
            return Err(err(format!(
                "`{}`: share must be between 1 and 99 (percent of each batch), got {}",
                l.name, l.share
            )));
        }
    }
    let total: u64 = def.lanes.iter().map(|l| l.share).sum();
    if total > 99 {
        return Err(err(format!("the shares add up to {total}; at most 99, so the public lane keeps a share")));
    }
    if let Some(env) = def.lane_secret_env.as_ref().filter(|e| e.starts_with("VQ_") || e.is_empty()) {
        return Err(err(format!(
            "lane_secret_env `{env}` must name a variable outside VQ_ (which vq reads as configuration keys)"
        )));
    }
    Ok(())
}
