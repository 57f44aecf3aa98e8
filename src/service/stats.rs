//! Cluster-wide figures of one target, from the store's snapshot only: what the stats
//! endpoint answers, what `vq stats` shows and what the `/metrics` queue gauges say.

use super::QueueService;
use crate::config::Settings;
use crate::domain::{QueueTarget, QueueTargetType, SaleState, admission_rate_per_sec, batch_in_force};
use crate::store::prelude::*;
use crate::store::{AnyStore, StoreError, TargetSnapshot};

/// Cluster-wide figures of one target, computed from the store's snapshot only,
/// so every instance and `vq stats` answer the same.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStats {
    pub waiting_count: u64,
    pub admitted_count: u64,
    /// Over the last minute.
    pub admission_rate_per_sec: f64,
    pub avg_wait_seconds: f64,
    pub p95_wait_seconds: f64,
    pub evicted_count: u64,
    pub batch_size: u64,
    /// The admission tick: one batch per tick.
    pub tick_ms: u64,
    /// What the pump aims at: batch size / tick seconds.
    pub target_rate_per_sec: f64,
    pub max_capacity: u64,
    pub tokens_issued: u64,
    pub tokens_used: u64,
    /// Purchases with stateless (DIRECT_ADMITTED or minted) tokens, never issued by the queue.
    pub direct_tokens_used: u64,
    /// Tokens issued through the queue that expired without a purchase (no-shows).
    #[serde(default)]
    pub tokens_expired: u64,
    /// The sale's state; absent without a sale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sale_state: Option<SaleState>,
    /// The sale's opening time, ISO-8601; absent without a schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<String>,
    /// Users in the sale's pre-queue, not yet given a position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prequeued_count: Option<u64>,
    /// `fixed`, `adaptive` or `active` (`queue.outflow`, or the type's): where `batch_size`
    /// comes from (in active-buyer mode the pump admits up to `max_active` buyers at once
    /// instead).
    #[serde(default)]
    pub outflow: String,
    /// The adaptive controller's last decision and why; absent before it made one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outflow_reason: Option<String>,
    /// What the adaptive controller's last decision saw; absent before its first decision and
    /// unless the outflow is adaptive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outflow_signals: Option<OutflowSignals>,
    /// A target with lanes: each lane's figures, the public lane first (the counts above add
    /// them up); absent for a target without lanes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<LaneStats>,
}

/// One lane of a target (`[[targets.types.lanes]]`, `vq lane add`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneStats {
    /// `public`, or the lane's name.
    pub lane: String,
    /// Percent of each batch while its users wait.
    pub share: u32,
    /// How long before the sale's opening the lane opens.
    pub opens_before_s: u64,
    pub waiting_count: u64,
    pub admitted_count: u64,
    pub prequeued_count: u64,
}

/// The signals of the adaptive controller's last decision (`queue:{T}:outflow`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutflowSignals {
    /// Buyers whose purchases the gates forwarded with a valid token in the interval decided
    /// on, each counted once.
    pub purchases: u64,
    /// The P95 of their slowest purchases' latency, as the upper bound of its bucket (ms);
    /// absent without purchases or past the last bounded bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_ms: Option<u64>,
    /// The share of them with an error (5xx, 429, timeouts, unreachable).
    pub error_ratio: f64,
    /// The smoothed share of admitted buyers whose token expired unused; absent before
    /// enough tokens ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_show_ratio: Option<f64>,
    /// When the decision was made, ISO-8601 (Redis' clock).
    pub decided_at: String,
}

/// The batch of a target of `kind` while no runtime batch pins one: the adaptive
/// controller's last choice (`queue.outflow = "adaptive"`, as the pump admits: pump.rs), else
/// the type's configured one.
pub fn unpinned_batch(settings: &Settings, kind: QueueTargetType, snap: &TargetSnapshot) -> u64 {
    match &snap.outflow {
        Some(o) if settings.is_adaptive(kind) => o.batch,
        _ => settings.type_batch_size(kind),
    }
}

impl QueueStats {
    /// The one computation behind the stats endpoint, `/metrics` gauges and `vq stats`.
    /// `global_batch` is the operator's runtime batch size for every target, if set.
    pub fn from_snapshot(
        snap: &TargetSnapshot,
        kind: QueueTargetType,
        global_batch: Option<u64>,
        settings: &Settings,
        now_ms: u64,
    ) -> Self {
        let queue = &settings.queue;
        let adaptive = settings.is_adaptive(kind);
        let batch_size = batch_in_force(snap.batch_override, global_batch, unpinned_batch(settings, kind, snap));
        Self {
            waiting_count: snap.waiting,
            admitted_count: snap.admitted_total,
            admission_rate_per_sec: admission_rate_per_sec(&snap.admissions, queue.tick_ms, now_ms),
            avg_wait_seconds: snap.waits.avg_seconds(),
            p95_wait_seconds: snap.waits.quantile_seconds(0.95),
            evicted_count: snap.evicted,
            batch_size,
            tick_ms: queue.tick_ms,
            target_rate_per_sec: batch_size as f64 * 1000.0 / queue.tick_ms.max(1) as f64,
            max_capacity: snap.capacity.unwrap_or(settings.type_max_capacity(kind)),
            tokens_issued: snap.tokens_issued,
            tokens_used: snap.tokens_used,
            direct_tokens_used: snap.direct_tokens_used,
            tokens_expired: snap.tokens_expired,
            sale_state: snap.sale.as_ref().map(|v| v.record.state_at(v.now_ms)),
            opens_at: snap.sale.as_ref().and_then(|v| v.record.opens_at_ms).map(crate::domain::format_instant),
            prequeued_count: snap.sale.as_ref().map(|_| snap.prequeued),
            outflow: match settings.type_outflow(kind) {
                crate::config::Outflow::Fixed => "fixed",
                crate::config::Outflow::Adaptive => "adaptive",
                crate::config::Outflow::Active => "active",
            }
            .to_owned(),
            outflow_reason: snap.outflow.as_ref().filter(|_| adaptive).map(|o| o.reason.clone()),
            outflow_signals: snap.outflow.as_ref().filter(|_| adaptive).map(|o| OutflowSignals {
                purchases: o.purchases,
                p95_ms: o.p95_ms,
                error_ratio: o.error_bp as f64 / 10_000.0,
                no_show_ratio: o.no_show_bp.map(|bp| bp as f64 / 10_000.0),
                decided_at: crate::domain::format_instant(o.decided_at_ms),
            }),
            lanes: Vec::new(),
        }
    }
}

/// Reads one target's figures from the store: what the stats endpoint answers and what
/// `vq stats` shows, so the two cannot drift. The global batch size is read with the
/// snapshot (not an instance's cached copy), so two instances at the same moment agree.
pub async fn read_target_stats(
    store: &AnyStore,
    target: QueueTarget,
    settings: &Settings,
) -> Result<(TargetSnapshot, QueueStats), StoreError> {
    let global_batch = store.global_batch_size().await?;
    let snap = store.snapshot(target).await?;
    let mut stats = QueueStats::from_snapshot(&snap, target.kind, global_batch, settings, store.now_ms());
    stats.lanes = store
        .lane_figures(target)
        .await?
        .into_iter()
        .map(|f| LaneStats {
            lane: f.lane.shown().to_owned(),
            share: f.share,
            opens_before_s: f.opens_before_s,
            waiting_count: f.waiting,
            admitted_count: f.admitted,
            prequeued_count: f.prequeued,
        })
        .collect();
    Ok((snap, stats))
}

impl QueueService {
    pub async fn stats(&self, target: QueueTarget) -> Result<QueueStats, StoreError> {
        Ok(read_target_stats(&self.store, target, &self.settings).await?.1)
    }

    /// Sets the `/metrics` queue gauges of every active declared target from the store, and
    /// drops the series of every other target.
    pub async fn record_queue_gauges(&self) -> Result<(), StoreError> {
        crate::metrics::set_capacity(self.settings.queue.max_capacity);
        let active: std::collections::HashSet<QueueTarget> =
            self.store.active_targets().await?.into_iter().filter(|t| self.is_declared(*t)).collect();
        // Series of targets removed or gone idle go before the new figures are read.
        crate::metrics::retain_targets(|t| active.contains(&t));
        for &target in &active {
            let s = self.stats(target).await?;
            crate::metrics::set_queue_state(target, s.waiting_count, s.batch_size, s.target_rate_per_sec, s.sale_state);
            let signals = s
                .outflow_signals
                .as_ref()
                .map(|o| (o.p95_ms.map(|p| p as f64 / 1000.0), o.error_ratio, o.no_show_ratio));
            crate::metrics::set_target_outcomes(target, [s.tokens_issued, s.tokens_used, s.tokens_expired], signals);
            let floor = self.settings.is_adaptive(target.kind).then(|| self.settings.type_batch_bounds(target.kind).0);
            crate::metrics::set_adaptive_batch_min(target, floor);
            crate::metrics::set_lane_lengths(
                target,
                s.lanes.iter().map(|l| (l.lane.clone(), l.waiting_count)).collect(),
            );
        }
        Ok(())
    }
}
