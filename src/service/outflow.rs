//! What the gate tells the adaptive outflow (`queue.outflow = "adaptive"`): each forwarded
//! purchase's latency and outcome, counted per control interval in the store, where the pump
//! that claims the interval reads every instance's observations together (pump.rs); and what
//! it tells the target's record (`vq sale report`): each forwarded purchase and the purchase
//! API's answer, per tick.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::QueueService;
use crate::domain::{AnswerClass, QueueTarget, latency_bucket};
use crate::store::prelude::*;

/// The adaptive batch of each target as this instance's pump last chose or read it
/// (pump.rs), for the ETA the waiting page shows; empty on an instance without a pump.
#[derive(Debug, Default)]
pub struct OutflowBatches(Mutex<HashMap<QueueTarget, u64>>);

impl OutflowBatches {
    pub fn set(&self, target: QueueTarget, batch: u64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(target, batch);
    }

    pub fn get(&self, target: QueueTarget) -> Option<u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(&target).copied()
    }
}

impl QueueService {
    /// The adaptive batches this instance's pump publishes for the ETA.
    pub fn outflow_batches(&self) -> Arc<OutflowBatches> {
        self.outflow_batches.clone()
    }

    /// The tick (Redis' clock) a purchase forwarded now is counted in, in the target's record.
    pub fn purchase_tick(&self) -> u64 {
        self.store.now_ms() / self.settings.queue.tick_ms.max(1)
    }

    /// Counts one forwarded purchase and the purchase API's answer (`None`: none came) in the
    /// target's record, whatever the outflow. Off the response path, like the observation: a
    /// failed count is a purchase missing from `vq sale report`, logged.
    pub fn record_purchase(&self, target: QueueTarget, tick: u64, status: Option<u16>) {
        let answer = status.map_or(AnswerClass::Unreached, AnswerClass::of_status);
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.record_purchase(target, tick, answer).await {
                tracing::debug!(target_queue = %target, error = %e, "a purchase was not counted in the record");
            }
        });
    }

    /// Counts one purchase the gate forwarded for `target`: how long it took, whether it
    /// failed (5xx, 429, timed out, not reached) and whether the purchase API backed off (503,
    /// 429, `Retry-After`). Off the response path: the count is sent by a task of its own, and
    /// a failed count is only a missing observation.
    pub fn observe_purchase(&self, target: QueueTarget, took: Duration, error: bool, backoff: bool) {
        if !self.settings.is_adaptive(target.kind) {
            return;
        }
        let interval = self.store.now_ms() / self.settings.outflow_interval_ms();
        let bucket = latency_bucket(u64::try_from(took.as_millis()).unwrap_or(u64::MAX));
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.observe_purchase(target, interval, bucket, error, backoff).await {
                tracing::debug!(target_queue = %target, error = %e, "a purchase's observation was lost");
            }
        });
    }
}
