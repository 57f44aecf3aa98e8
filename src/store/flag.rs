//! The rollout flag and the runtime batch sizes (outside any target), and the instances'
//! acknowledgements of the flag they apply.

use std::future::Future;

use super::{FlagAck, StoreError};
use crate::domain::{FlagChange, FlagState, QueueTarget};

/// The flag and batch sizes. Every method is one atomic step.
pub trait FlagOps: Send + Sync + 'static {
    /// The flag as stored; `None` when its hash does not exist (never written, or lost with
    /// a Redis restart without persistence, a FLUSHALL, a failover to an empty replica).
    fn read_stored_flag(&self) -> impl Future<Output = Result<Option<FlagState>, StoreError>> + Send;

    /// The flag as stored, off when its hash does not exist.
    fn read_flag(&self) -> impl Future<Output = Result<FlagState, StoreError>> + Send {
        async { Ok(self.read_stored_flag().await?.unwrap_or_default()) }
    }

    /// One operator change (`vq flag on | off | clear`, `vq pow`, `vq serve --flag-on`) in one
    /// atomic write that bumps the version; `Off` removes every target override in the same
    /// step. Returns the new version: above every version an instance acknowledged, also
    /// when the flag was lost.
    fn change_flag(&self, change: FlagChange) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The runtime batch size for every target, if an operator set one.
    fn global_batch_size(&self) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Sets (or with `None` clears) the runtime batch size, for one target or all.
    fn set_batch_size(
        &self,
        target: Option<QueueTarget>,
        batch: Option<u64>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records that `instance` applied flag `version`; the record lives `ttl_ms`.
    fn ack_flag(&self, ack: FlagAck, ttl_ms: u64) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The acknowledgements of every live instance, and of those silent for less than
    /// [`super::FLAG_ACK_KEEP_MS`] (with [`FlagAck::silent_ms`]).
    fn flag_acks(&self) -> impl Future<Output = Result<Vec<FlagAck>, StoreError>> + Send;

    /// Removes `instance`'s acknowledgement: it shuts down, and is no longer an instance that
    /// should apply the flag.
    fn withdraw_flag_ack(&self, instance: &str) -> impl Future<Output = Result<(), StoreError>> + Send;
}
