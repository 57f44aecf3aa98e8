//! The adaptive outflow's inputs and decisions: what the gates saw per control interval, the
//! buyers holding a place, the tokens that expired unused.

use std::future::Future;

use super::{BatchChange, OutflowClaim, OutflowState, StoreError};
use crate::domain::{BuyerObservation, QueueTarget, UserId};

/// The adaptive outflow's state. Every method is one atomic step.
pub trait OutflowOps: Send + Sync + 'static {
    /// Counts one purchase the gate forwarded for `target` with `buyer`'s valid token in
    /// control interval `interval` (its latency bucket, whether it failed, whether the purchase
    /// API backed off) as that buyer's: each buyer is one observation per interval, the worst
    /// of their purchases ([`BuyerObservation::worst`]). What tells one buyer from another
    /// lives `keep_s` seconds (the interval's own purchases write it).
    fn observe_purchase(
        &self,
        target: QueueTarget,
        interval: u64,
        buyer: &UserId,
        seen: BuyerObservation,
        keep_s: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Claims control interval `interval` of `target`'s adaptive outflow: once per interval
    /// across every pump, and never while the target's batch is pinned.
    fn claim_outflow(
        &self,
        target: QueueTarget,
        interval: u64,
    ) -> impl Future<Output = Result<OutflowClaim, StoreError>> + Send;

    /// Records the controller's decision for `target`, and with `change` (the batch moved) an
    /// admission ledger row saying from what, to what, by whom and why, in one step.
    fn set_outflow(
        &self,
        target: QueueTarget,
        state: &OutflowState,
        change: Option<BatchChange>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Buyers of `target` holding a place in active-buyer mode: admitted and not yet given
    /// their token, or holding a token issued through the queue, unused and unexpired.
    fn active_buyers(&self, target: QueueTarget) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Counts the tokens issued through the queue that expired unused since the last call
    /// (no-shows) into `tokens_expired`; returns how many.
    fn expire_tokens(&self, target: QueueTarget) -> impl Future<Output = Result<u64, StoreError>> + Send;
}
