//! What the event logs feed: the webhooks (`webhook.rs`: signed, retried, one instance
//! delivering each at a time), `vq events` (reads them), and the instance's own events
//! (`store.degraded`: requests it answered without the store, appended once Redis takes them).
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
use crate::domain::{Event, EventId, EventKind, EventLog};
use crate::service::QueueService;
use crate::store::prelude::*;
use crate::store::{AnyStore, StoreError};

/// Events read from one log per call.
const PAGE: usize = 500;

/// The logs that may hold events: the instances', and those of the targets that are active,
/// have a sale or were declared at runtime (a target's events come from its sale, its
/// admission or its outflow, each of which puts it in one of those sets).
pub async fn event_logs(store: &AnyStore) -> Result<Vec<EventLog>, StoreError> {
    let mut targets = BTreeSet::new();
    targets.extend(store.active_targets().await?);
    targets.extend(store.sale_targets().await?);
    targets.extend(store.declared_targets().await?);
    Ok(std::iter::once(EventLog::Instances).chain(targets.into_iter().map(EventLog::Target)).collect())
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

/// Appends a `store.degraded` event for the requests this instance answered without the store
/// (failed open, refused for lack of memory, not replicated) since the last one, every few
/// seconds while there are any. Appending needs Redis: the events of an outage land once
/// Redis takes writes again, counting every such answer once.
pub async fn record_degraded_loop(service: Arc<QueueService>, instance: String, cancel: CancellationToken) {
    let mut told = service.degraded_answers().map(|(_, n)| n);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(DEGRADED_EVERY) => {}
        }
        let now = service.store.now_ms();
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
