//! What the gate tells the adaptive outflow (`queue.outflow = "adaptive"`): each purchase it
//! forwarded with a valid entry token, its latency and outcome, counted per control interval
//! and per buyer in the store, where the pump that claims the interval reads every instance's
//! observations together (pump.rs); and what it tells the target's record (`vq sale report`):
//! each such purchase and the purchase API's answer, per tick.
//!
//! The controller hears the purchase API, not the clients: the gate tells it nothing of a
//! request vq refused itself, of a body the client framed wrongly or stopped sending, or of a
//! purchase that needed no token, and the store counts each buyer once per interval.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::QueueService;
use crate::domain::{AnswerClass, BuyerObservation, QueueTarget, UserId, latency_bucket};

/// Seconds past its interval that the store remembers which buyers an interval counted.
const BUYERS_KEEP_MARGIN_S: u64 = 10;
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

    /// Counts one purchase the gate forwarded for `target` with `buyer`'s valid token and the
    /// purchase API answered (or failed to): how long it took, whether it failed (5xx, 429,
    /// timed out, not reached) and whether the purchase API backed off (503, 429,
    /// `Retry-After`), as that buyer's observation of the interval (the worst of theirs). Off
    /// the response path: the count is sent by a task of its own, and a failed count is only a
    /// missing observation.
    pub fn observe_purchase(&self, target: QueueTarget, buyer: UserId, took: Duration, error: bool, backoff: bool) {
        if !self.settings.is_adaptive(target.kind) {
            return;
        }
        let interval_ms = self.settings.outflow_interval_ms();
        let interval = self.store.now_ms() / interval_ms;
        let bucket = latency_bucket(u64::try_from(took.as_millis()).unwrap_or(u64::MAX));
        let seen = BuyerObservation { bucket, error, backoff };
        // Only the interval's own purchases write who was counted: the interval, and a margin
        // for instances whose clocks differ.
        let keep_s = interval_ms.div_ceil(1000) + BUYERS_KEEP_MARGIN_S;
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.observe_purchase(target, interval, &buyer, seen, keep_s).await {
                tracing::debug!(target_queue = %target, error = %e, "a purchase's observation was lost");
            }
        });
    }
}
