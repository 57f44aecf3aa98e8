//! A target's sale: its schedule and controls, the opening's pre-queue, the record and the
//! admission ledger.

use std::future::Future;

use super::{ClearOutcome, PendingOpening, SaleView, ScheduleOutcome, StoreError};
use crate::domain::{AnswerClass, LedgerEntry, QueueTarget, Refusals, SaleControl, SaleSchedule, TargetRecord, UserId};

/// A target's sale and record. Every method is one atomic step.
pub trait SaleOps: Send + Sync + 'static {
    /// Sets the sale's schedule; draws nothing itself: `seed` is used unless the sale has one.
    fn schedule_sale(
        &self,
        target: QueueTarget,
        schedule: SaleSchedule,
        seed: [u8; 32],
    ) -> impl Future<Output = Result<ScheduleOutcome, StoreError>> + Send;

    /// The sale as stored, with the store's clock; `None` without one.
    fn read_sale(&self, target: QueueTarget) -> impl Future<Output = Result<Option<SaleView>, StoreError>> + Send;

    /// The targets a sale was scheduled for (and not cleared since); their sales may have
    /// expired ([`SaleOps::read_sale`] says).
    fn sale_targets(&self) -> impl Future<Output = Result<Vec<QueueTarget>, StoreError>> + Send;

    /// Pause, resume, close or clear, recorded in the ledger; false when it changed nothing.
    fn control_sale(
        &self,
        target: QueueTarget,
        control: SaleControl,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The frozen pre-queue, when the opening time passed and its order is not written yet.
    fn pending_opening(
        &self,
        target: QueueTarget,
    ) -> impl Future<Output = Result<Option<PendingOpening>, StoreError>> + Send;

    /// Writes one chunk of the opening order (`(seq, user)`, seqs ascending and contiguous),
    /// idempotently; `last` marks the opening done. False when it was done already.
    fn place_opening(
        &self,
        target: QueueTarget,
        places: &[(u64, UserId)],
        opens_at_ms: u64,
        last: bool,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Clears the sale (as `SaleControl::Clear`), unless `force` is false and it would drop
    /// users: pre-queued ones before the opening, or those the opening is placing. One step.
    fn clear_sale(
        &self,
        target: QueueTarget,
        force: bool,
    ) -> impl Future<Output = Result<ClearOutcome, StoreError>> + Send;

    /// The target's record (`queue:{T}:record`), which outlives its queue keys by
    /// `queue.record_ttl_days`; `None` when there is none (never written, or expired).
    fn target_record(
        &self,
        target: QueueTarget,
    ) -> impl Future<Output = Result<Option<TargetRecord>, StoreError>> + Send;

    /// Counts one purchase the gate forwarded in `tick` and the purchase API's answer, in the
    /// target's record.
    fn record_purchase(
        &self,
        target: QueueTarget,
        tick: u64,
        answer: AnswerClass,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Adds purchases the gate refused (counted in an instance since its last call) to the
    /// target's record, per reason: one write per target and call, never one per refusal.
    fn record_refusals(
        &self,
        target: QueueTarget,
        refused: Refusals,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The admission ledger, newest first.
    fn sale_ledger(&self, target: QueueTarget) -> impl Future<Output = Result<Vec<LedgerEntry>, StoreError>> + Send;
}
