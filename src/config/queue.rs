//! The admission settings: `[queue]`, `[adaptive]` and `[targets]` (with `[[targets.types]]`).

use serde::{Deserialize, Serialize};

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
    /// Purchases one entry token may make for this type's targets (else
    /// `queue.purchases_per_admission`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purchases_per_admission: Option<u64>,
    /// Purchases one user may make per sale of a target of this type, across re-entries (else
    /// `queue.purchases_per_user`; 0 = no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purchases_per_user: Option<u64>,
    /// Shards each target of this type is spread over (1 to 64; 1 when unset): each its own
    /// hash tag, so a Redis Cluster places them on different nodes. Redis only: the embedded
    /// store keeps every target in one shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u64>,
    /// Lanes of every target of this type besides the public one (`[[targets.types.lanes]]`):
    /// a presale, members first. `vq lane add` adds lanes to one target at runtime.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<LaneSettings>,
    /// The environment variable holding the key the shop signs lane claims with
    /// (`X-VQ-Lane`, HMAC-SHA256); unset: lanes are joined with access codes only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane_secret_env: Option<String>,
}

/// One lane of a type's targets (`[[targets.types.lanes]]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaneSettings {
    /// `members`: 1 to 14 of a-z, 0-9 and `-`.
    pub name: String,
    /// Percent of each batch while the lane has users waiting (1 to 99); the public lane has
    /// what the lanes leave (the lanes' shares add up to 99 at most).
    pub share: u64,
    /// The lane opens this many seconds before the sale's opening (a presale at 09:00 for a
    /// sale opening at 10:00: 3600); 0 (the default) opens it with the public.
    #[serde(default)]
    pub opens_before_s: u64,
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
            purchases_per_admission: None,
            purchases_per_user: None,
            shards: None,
            lanes: Vec::new(),
            lane_secret_env: None,
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
    /// Purchases the gate lets through per entry token (per admission): 1 = one-time use.
    pub purchases_per_admission: u64,
    /// Purchases the gate lets through per user and target across re-entries, counted until
    /// the sale is cleared or `key_ttl_s` after the target's last purchase; 0 = no limit
    /// beyond `purchases_per_admission`.
    pub purchases_per_user: u64,
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
    /// P95 latency (of each buyer's slowest purchase) the purchase API should stay under.
    pub latency_ms: u64,
    /// Share of an interval's buyers the purchase API may fail (5xx/429, timed out, not
    /// reached), or back off from (503/429/`Retry-After`).
    pub error_ratio: f64,
    /// Users added to the batch after a healthy interval.
    pub increase: u64,
    /// Factor applied to the batch after an unhealthy one.
    pub decrease: f64,
    /// Fewer buyers than this in an interval: the batch holds.
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
            purchases_per_admission: 1,
            purchases_per_user: 0,
        }
    }
}
