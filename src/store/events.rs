//! The event logs: one per target, appended to by the scripts that change its sale, its
//! outflow or pass an admission milestone (in the same step as the change), and one for the
//! instances (what an instance saw of the store). Read by `vq events` and the webhooks,
//! which keep where each subscriber is (a cursor per subscriber and log) and hand the
//! delivery to one instance at a time (a lease).

use std::future::Future;

use super::StoreError;
use crate::domain::{Event, EventId, EventKind, EventLog, QueueTarget};

/// The event logs. Every method is one atomic step.
pub trait EventOps: Send + Sync + 'static {
    /// The events of `log` after `after`, oldest first, at most `count`.
    fn read_events(
        &self,
        log: EventLog,
        after: EventId,
        count: usize,
    ) -> impl Future<Output = Result<Vec<Event>, StoreError>> + Send;

    /// Appends an instance's event to the instances' log (the targets' logs are written by
    /// the steps that change them).
    fn append_instance_event(
        &self,
        at_ms: u64,
        kind: &EventKind,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Remembers that `targets` have event logs, so they are read after the targets leave
    /// every other set (a sale cleared, a queue expired).
    fn register_event_logs(&self, targets: &[QueueTarget]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The targets remembered by [`EventOps::register_event_logs`] (or whose log was
    /// appended to by a step that registers it: schedule, pause, resume, close, clear).
    fn event_log_targets(&self) -> impl Future<Output = Result<Vec<QueueTarget>, StoreError>> + Send;

    /// Takes or keeps the lease `name` for `holder` for `ttl_ms`; false while another holds it.
    fn lease_events(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The last event of `log` delivered to `subscriber`; `None` before the first.
    fn event_cursor(
        &self,
        subscriber: &str,
        log: EventLog,
    ) -> impl Future<Output = Result<Option<EventId>, StoreError>> + Send;

    /// Records `id` as the last event of `log` delivered to `subscriber`.
    fn save_event_cursor(
        &self,
        subscriber: &str,
        log: EventLog,
        id: EventId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
