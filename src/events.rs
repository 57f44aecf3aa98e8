//! What the event logs feed: the webhooks (`webhook.rs`: signed, retried, one instance
//! delivering each at a time), `vq events` (reads them), and the instance's own events
//! (`store.degraded`: requests it answered without the store, appended once Redis takes them;
//! `clock.drift`: its clock off Redis').
//!
//! The logs themselves are the store's (`store::EventOps`): a target's events are appended by
//! the step that makes the change, so nothing here is on the request path or in the pump's
//! tick; a webhook that hangs or is gone holds only its own task.

mod webhook;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use self::webhook::{Delivery, DeliveryOptions, SIGNATURE_VERSION, Webhook, WebhookError, sign, webhooks_from_env};
use crate::domain::{Event, EventId, EventKind, EventLog, QueueTarget};
use crate::service::QueueService;
use crate::store::prelude::*;
use crate::store::{AnyStore, StoreError};

/// Events read from one log per call.
const PAGE: usize = 500;

/// The logs that may hold events: the instances', and those of the targets that are active
/// or have a sale (a target's events come from its sale, its admission or its outflow, each
/// of which puts it in one of those sets), or were remembered as having a log
/// ([`remember_event_logs`]; a sale's change remembers its target itself).
pub async fn event_logs(store: &AnyStore) -> Result<Vec<EventLog>, StoreError> {
    let mut targets = BTreeSet::new();
    targets.extend(store.active_targets().await?);
    targets.extend(store.sale_targets().await?);
    targets.extend(store.event_log_targets().await?);
    Ok(std::iter::once(EventLog::Instances).chain(targets.into_iter().map(EventLog::Target)).collect())
}

/// Remembers the active targets and those with a sale whose event log has entries, so their
/// events are still read once they leave those sets (a queue's keys expire after
/// `queue.key_ttl_s`; a delivery held up by a dead webhook may take longer than that). A
/// target without events is not written down.
async fn remember_event_logs(store: &AnyStore) -> Result<(), StoreError> {
    let known: BTreeSet<QueueTarget> = store.event_log_targets().await?.into_iter().collect();
    let mut candidates: BTreeSet<QueueTarget> = store.active_targets().await?.into_iter().collect();
    candidates.extend(store.sale_targets().await?);
    let mut logged = Vec::new();
    for t in candidates.difference(&known) {
        if !store.read_events(EventLog::Target(*t), EventId::ZERO, 1).await?.is_empty() {
            logged.push(*t);
        }
    }
    store.register_event_logs(&logged).await
}

/// Every event after where `seen` says each log was read to (a log not in it: after `since`),
/// oldest first across logs; `seen` moves past them.
pub async fn read_new(
    store: &AnyStore,
    since: EventId,
    seen: &mut HashMap<EventLog, EventId>,
) -> Result<Vec<Event>, StoreError> {
    let mut out = Vec::new();
    for log in event_logs(store).await? {
        let after = seen.entry(log).or_insert(since);
        loop {
            let page = store.read_events(log, *after, PAGE).await?;
            if let Some(last) = page.last() {
                *after = last.id;
            }
            let full = page.len() == PAGE;
            out.extend(page);
            if !full {
                break;
            }
        }
    }
    out.sort_by_key(|e| (e.id, e.log));
    Ok(out)
}

/// How often the instance looks at its degraded answers.
const DEGRADED_EVERY: Duration = Duration::from_secs(2);

/// Every few seconds: remembers the targets with event logs ([`remember_event_logs`]);
/// appends a `clock.drift` event when this instance's clock goes more than
/// [`crate::service::CLOCK_OFF_MS`] off Redis' and when it agrees again; and a
/// `store.degraded` event for the requests this instance answered without the store (failed
/// open, refused for lack of memory, not replicated) since the last one, while there are any. Appending needs Redis: the events of an outage land once Redis takes
/// writes again, counting every such answer once.
pub async fn upkeep_loop(service: Arc<QueueService>, instance: String, cancel: CancellationToken) {
    let mut told = service.degraded_answers().map(|(_, n)| n);
    // Whether the clock was off at the last event (none yet: only a clock off is told).
    let mut clock_off = false;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(DEGRADED_EVERY) => {}
        }
        if let Err(e) = remember_event_logs(&service.store).await {
            tracing::debug!(error = %e, "cannot remember the targets' event logs yet: trying again");
        }
        let now = service.store.now_ms();
        if let Some(offset_ms) = service.clock_offset_ms() {
            let off = offset_ms.unsigned_abs() > crate::service::CLOCK_OFF_MS;
            if off != clock_off {
                let kind = EventKind::ClockDrift { instance: instance.clone(), offset_ms, off };
                match service.store.append_instance_event(now, &kind).await {
                    Ok(()) => clock_off = off,
                    Err(e) => tracing::debug!(error = %e, "cannot append the clock event yet: trying again"),
                }
            }
        }
        for (i, (answer, count)) in service.degraded_answers().into_iter().enumerate() {
            if count <= told[i] {
                continue;
            }
            let kind =
                EventKind::Degraded { instance: instance.clone(), answer: answer.to_owned(), count: count - told[i] };
            match service.store.append_instance_event(now, &kind).await {
                Ok(()) => told[i] = count,
                Err(e) => tracing::debug!(error = %e, "cannot append the degraded event yet: trying again"),
            }
        }
    }
}
