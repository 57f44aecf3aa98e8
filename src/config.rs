//! The typed configuration tree, loaded once: defaults ← `vq.toml` ← `VQ_…` env ← flags.
//!
//! Unknown keys are an error naming the key. The token secret is never part of this tree:
//! it comes from `VQ_TOKEN_SECRET` or the file named by `VQ_TOKEN_SECRET_FILE` only.
//!
//! This file holds the tree's root ([`Settings`]), its loading and the accessors the rest of
//! vq reads; `queue.rs` the admission settings (`[queue]`, `[adaptive]`, `[targets]`),
//! `edge.rs` what a request meets (`[gate]`, `[http]`, `[page]`, `[identity]`, `[entry]`),
//! `events.rs` the event logs and their webhooks (`[events]`),
//! `check.rs` every bound and cross-setting rule ([`SettingError`]), `redis_url.rs` credential
//! redaction and `secret.rs` the token secret.

mod check;
mod edge;
mod events;
mod fleet;
mod queue;
mod redis_url;
mod secret;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

pub use self::check::{BATCH_SIZE, POW_BITS, REDIS_TIMEOUT_MS, SettingError, TOKEN_TTL_S};
pub use self::edge::{EntrySettings, GateSettings, HttpSettings, IdentityMode, IdentitySettings, PageSettings};
pub use self::events::{EVENTS_SECRET_ENV, EventsSettings, WebhookSettings};
pub use self::fleet::{LUA_DIGEST, VQ_VERSION};
pub use self::queue::{
    AdaptiveSettings, LaneSettings, OnStoreFailure, Outflow, QueueSettings, TargetTypeSettings, TargetsSettings,
};
pub use self::redis_url::{RedisUrl, redact_credentials};
pub use self::secret::secret_from_env;
use crate::domain::{DeclaredTargets, QueueTargetType};
use crate::store::{DurableWrites, EventLimits, ReplicaWait, StoreLimits};

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
    pub events: EventsSettings,
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
    /// Replicas that must hold a token issued or a purchase's claim before vq answers for it,
    /// so a failover cannot lose them: `"auto"` (those connected to the primary), a number,
    /// or 0 (never wait).
    pub wait_replicas: ReplicaWait,
    /// How long such a write waits for them; past it the buyer is told 503 (place kept).
    pub wait_timeout_ms: u64,
    /// Longest an enter, poll or purchase claim waits for others to share its script call
    /// while they arrive faster than it can fill (`store/coalesce.rs`); 0 = never wait.
    pub coalesce_wait_ms: u64,
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
            events: EventsSettings::default(),
        }
    }
}

impl Default for RedisSettings {
    fn default() -> Self {
        let durable = DurableWrites::default();
        Self {
            url: "redis://127.0.0.1:6379".into(),
            cluster_nodes: None,
            timeout_ms: 250,
            wait_replicas: durable.replicas,
            wait_timeout_ms: durable.timeout_ms,
            coalesce_wait_ms: 2,
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

impl Default for LogSettings {
    fn default() -> Self {
        Self { format: LogFormat::Text }
    }
}

/// The environment variable that sets a configuration key: `queue.batch_size` →
/// `VQ_QUEUE__BATCH_SIZE`.
pub fn env_name(key: &str) -> String {
    format!("VQ_{}", key.replace('.', "__").to_ascii_uppercase())
}

/// Environment variables with the `VQ_` prefix that are not configuration keys.
const NOT_KEYS: [&str; 6] = [
    "TOKEN_SECRET",
    "TOKEN_SECRET_FILE",
    "TOKEN_SECRET_PREVIOUS",
    "TOKEN_SECRET_PREVIOUS_FILE",
    "URL",
    "EVENTS_SECRET",
];

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

    /// The purchase limits the gate keeps for a target of `kind`: its type's, else
    /// `queue.purchases_per_admission` and `queue.purchases_per_user`.
    pub fn type_purchase_limits(&self, kind: QueueTargetType) -> crate::domain::PurchaseLimits {
        let t = self.type_settings(kind);
        crate::domain::PurchaseLimits {
            per_admission: t.and_then(|t| t.purchases_per_admission).unwrap_or(self.queue.purchases_per_admission),
            per_user: t.and_then(|t| t.purchases_per_user).unwrap_or(self.queue.purchases_per_user),
        }
    }

    /// The shards each target of `kind` is spread over on Redis (`targets.types.*.shards`).
    pub fn type_shards(&self, kind: QueueTargetType) -> u8 {
        self.type_settings(kind)
            .and_then(|t| t.shards)
            .map_or(1, |n| n.clamp(1, u64::from(crate::domain::MAX_SHARDS)) as u8)
    }

    /// The lanes every target of `kind` has besides the public one (`targets.types.*.lanes`);
    /// names that do not parse are left out (the configuration's check refuses them).
    pub fn type_lanes(&self, kind: QueueTargetType) -> Vec<crate::domain::Lane> {
        self.type_settings(kind)
            .map(|t| {
                t.lanes
                    .iter()
                    .filter_map(|l| {
                        Some(crate::domain::Lane {
                            name: l.name.parse().ok()?,
                            share: u32::try_from(l.share).ok()?,
                            opens_before_s: l.opens_before_s,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The key the shop signs lane claims of `kind`'s targets with (`lane_secret_env`'s
    /// variable), when set and not empty.
    pub fn type_lane_secret(&self, kind: QueueTargetType) -> Option<Vec<u8>> {
        let env = self.type_settings(kind)?.lane_secret_env.as_ref()?;
        std::env::var(env).ok().filter(|v| !v.is_empty()).map(String::into_bytes)
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
            type_shards: self
                .target_types()
                .unwrap_or_default()
                .into_iter()
                .map(|t| (t, self.type_shards(t)))
                .filter(|(_, n)| *n > 1)
                .collect(),
            type_lanes: self
                .target_types()
                .unwrap_or_default()
                .into_iter()
                .map(|t| (t, self.type_lanes(t)))
                .filter(|(_, l)| !l.is_empty())
                .collect(),
            key_ttl_s: self.queue.key_ttl_s,
            token_ttl_s: self.token.ttl_s,
            record_ttl_s: self.queue.record_ttl_days * 86_400,
            tick_ms: self.queue.tick_ms,
            durable: DurableWrites { replicas: self.redis.wait_replicas, timeout_ms: self.redis.wait_timeout_ms },
            hold_queues: self.queue.max_queues_per_user > 0,
            coalesce_wait: Duration::from_millis(self.redis.coalesce_wait_ms),
            events: EventLimits { max_len: self.events.max_len, admitted_every: self.events.admitted_every },
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
mod tests;
