//! The embedded store's event logs: what the scripts' `event_add` (prelude.lua) and
//! `store::redis::events` do, under the store's one mutex. Ids are given as Redis gives a
//! stream's (`EventId::next_at` the store's clock); a log keeps its newest `events.max_len`
//! entries, and a target's expires `queue.record_ttl_days` after its last entry.

use std::collections::VecDeque;

use super::{Inner, MemoryStore};
use crate::domain::{Event, EventId, EventKind, EventLog, QueueTarget};
use crate::store::{EventOps, StoreError};

/// One log.
#[derive(Default)]
pub(super) struct MemLog {
    /// The last id given (ids only grow, also once the entries are trimmed).
    last: EventId,
    entries: VecDeque<Event>,
    /// When a target's log expires (ms); the instances' log does not.
    expires_at: Option<u64>,
}

impl Inner {
    /// Appends an event to `log` at `now` (the step that made the change calls this).
    pub(super) fn append_event(&mut self, log: EventLog, now: u64, at_ms: u64, kind: EventKind) {
        let max = self.event_limits.max_len as usize;
        let record_ttl_ms = self.record_ttl_ms;
        let l = self.events.entry(log).or_default();
        if l.expires_at.is_some_and(|at| at <= now) {
            l.entries.clear();
        }
        l.last = l.last.next_at(now);
        l.entries.push_back(Event { log, id: l.last, at_ms, kind });
        while l.entries.len() > max {
            l.entries.pop_front();
        }
        if let EventLog::Target(_) = log {
            l.expires_at = Some(now + record_ttl_ms);
        }
    }

    /// An event of `target`'s log, at `now`.
    pub(super) fn target_event(&mut self, target: QueueTarget, now: u64, kind: EventKind) {
        self.append_event(EventLog::Target(target), now, now, kind);
    }
}

impl EventOps for MemoryStore {
    async fn read_events(&self, log: EventLog, after: EventId, count: usize) -> Result<Vec<Event>, StoreError> {
        let now = self.now_ms();
        let inner = self.lock();
        let Some(l) = inner.events.get(&log).filter(|l| l.expires_at.is_none_or(|at| at > now)) else {
            return Ok(Vec::new());
        };
        Ok(l.entries.iter().filter(|e| e.id > after).take(count).cloned().collect())
    }

    async fn append_instance_event(&self, at_ms: u64, kind: &EventKind) -> Result<(), StoreError> {
        let now = self.now_ms();
        self.lock().append_event(EventLog::Instances, now, at_ms, kind.clone());
        Ok(())
    }

    async fn register_event_logs(&self, targets: &[QueueTarget]) -> Result<(), StoreError> {
        self.lock().event_log_targets.extend(targets.iter().copied());
        Ok(())
    }

    async fn event_log_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        let inner = self.lock();
        let logged = inner.events.keys().filter_map(EventLog::target);
        let all: std::collections::BTreeSet<QueueTarget> =
            inner.event_log_targets.iter().copied().chain(logged).collect();
        Ok(all.into_iter().collect())
    }

    async fn lease_events(&self, name: &str, holder: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let lease = inner.event_leases.entry(name.to_owned()).or_insert_with(|| (holder.to_owned(), 0));
        if lease.0 != holder && lease.1 > now {
            return Ok(false);
        }
        *lease = (holder.to_owned(), now + ttl_ms);
        Ok(true)
    }

    async fn event_cursor(&self, subscriber: &str, log: EventLog) -> Result<Option<EventId>, StoreError> {
        Ok(self.lock().event_cursors.get(&(subscriber.to_owned(), log)).copied())
    }

    async fn save_event_cursor(&self, subscriber: &str, log: EventLog, id: EventId) -> Result<(), StoreError> {
        self.lock().event_cursors.insert((subscriber.to_owned(), log), id);
        Ok(())
    }
}
