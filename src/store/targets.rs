//! Which targets exist: the active set the pump walks, runtime declarations, the capacity in
//! force, and the store's liveness.

use std::future::Future;

use super::{DeclareOutcome, StoreError};
use crate::domain::QueueTarget;

/// The targets the store knows of. Every method is one atomic step.
pub trait TargetOps: Send + Sync + 'static {
    fn register_active(&self, target: QueueTarget) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Takes the target out of `queue:active` (it is no longer declared): the pump stops
    /// walking it; its keys expire on their own.
    fn deactivate(&self, target: QueueTarget) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The targets declared at runtime (`vq target add`), the set `queue:targets`.
    fn declared_targets(&self) -> impl Future<Output = Result<Vec<QueueTarget>, StoreError>> + Send;

    /// Declares a target at runtime, unless `room` targets are declared at runtime already.
    fn declare_target(
        &self,
        target: QueueTarget,
        room: u64,
    ) -> impl Future<Output = Result<DeclareOutcome, StoreError>> + Send;

    /// Removes a runtime declaration; returns whether there was one.
    fn undeclare_target(&self, target: QueueTarget) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Records this instance's `queue.max_capacity` as the capacity in force for `target`, so
    /// every instance's stats and `vq stats` show the capacity enter is checked against, not
    /// the reader's own configuration. Expires with the target's keys.
    fn publish_capacity(&self, target: QueueTarget) -> impl Future<Output = Result<(), StoreError>> + Send;

    fn active_targets(&self) -> impl Future<Output = Result<Vec<QueueTarget>, StoreError>> + Send;

    /// Drops the target from the active set when its keys have expired; returns whether it did.
    fn forget_if_expired(&self, target: QueueTarget) -> impl Future<Output = Result<bool, StoreError>> + Send;

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}
