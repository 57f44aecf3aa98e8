//! The events a shop subscribes to, typed: a sale's changes, the purchase API's health as the
//! adaptive outflow sees it, admission milestones, an instance's degraded answers and its
//! clock's drift. Each is
//! an entry of an event log (one per target, one for the instances; the stored form is
//! `store::redis::codec`'s), named by its log and its place in it ([`EventId`]).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::{LedgerEntry, QueueTarget, SaleSource, format_instant};

/// An entry's place in its log: the time it was appended (ms, the store's clock) and a
/// sequence number within that ms. Ordered as the log is; written `ms-seq`, as Redis names a
/// stream entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EventId {
    pub ms: u64,
    pub seq: u64,
}

impl EventId {
    /// The id before every entry.
    pub const ZERO: EventId = EventId { ms: 0, seq: 0 };

    /// The id that follows `self` in a log whose clock reads `now_ms` (as Redis gives one).
    pub fn next_at(self, now_ms: u64) -> EventId {
        if now_ms > self.ms { EventId { ms: now_ms, seq: 0 } } else { EventId { ms: self.ms, seq: self.seq + 1 } }
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

impl FromStr for EventId {
    type Err = EventIdError;

    /// `ms-seq`, or `ms` alone (seq 0).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || EventIdError(s.to_owned());
        let (ms, seq) = s.split_once('-').unwrap_or((s, "0"));
        Ok(EventId { ms: ms.parse().map_err(|_| bad())?, seq: seq.parse().map_err(|_| bad())? })
    }
}

/// A text that is no event id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an event id: expected <target>/<ms>-<seq> (as an event's `id`), <ms>-<seq> or <ms>")]
pub struct EventIdError(pub String);

/// Which log an event is in: a target's (its sale, admission and outflow) or the instances'
/// (what an instance saw of the store).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventLog {
    Instances,
    Target(QueueTarget),
}

impl EventLog {
    /// The log's name in an event's id: the target as operators write it
    /// (`limited-drop:42`), or `vq` for the instances' log.
    pub fn name(&self) -> String {
        match self {
            EventLog::Instances => "vq".to_owned(),
            EventLog::Target(t) => format!("{}:{}", t.kind.slug(), t.id),
        }
    }

    pub fn target(&self) -> Option<QueueTarget> {
        match self {
            EventLog::Instances => None,
            EventLog::Target(t) => Some(*t),
        }
    }
}

/// An event id as a subscriber sees it (`limited-drop:42/1733400000000-0`): the log and the
/// place in it, unique across logs. `--since` takes it, or a bare [`EventId`].
pub fn parse_since(s: &str) -> Result<EventId, EventIdError> {
    let id = s.rsplit_once('/').map_or(s, |(_, id)| id);
    id.parse().map_err(|_| EventIdError(s.to_owned()))
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", content = "data")]
pub enum EventKind {
    /// A schedule written (first or again), with the times now in force.
    #[serde(rename = "sale.scheduled", rename_all = "camelCase")]
    SaleScheduled { opens_at_ms: u64, prequeue_from_ms: Option<u64>, closes_at_ms: Option<u64> },
    /// The pre-queue took its first user's tick after `prequeue_from` (said once per schedule).
    #[serde(rename = "sale.prequeue_opened", rename_all = "camelCase")]
    PrequeueOpened { opens_at_ms: u64, prequeue_from_ms: Option<u64> },
    /// The opening placed the pre-queue in the seed's order; admission starts.
    #[serde(rename = "sale.opened", rename_all = "camelCase")]
    SaleOpened { prequeued: u64, seed_commitment: String },
    #[serde(rename = "sale.paused", rename_all = "camelCase")]
    SalePaused { source: SaleSource },
    #[serde(rename = "sale.resumed", rename_all = "camelCase")]
    SaleResumed { source: SaleSource },
    /// Closed by an operator (`command`) or its schedule (`schedule`).
    #[serde(rename = "sale.closed", rename_all = "camelCase")]
    SaleClosed { source: SaleSource, message: String },
    /// Closed by the purchase API (`gate.close_header`).
    #[serde(rename = "sale.sold_out", rename_all = "camelCase")]
    SoldOut { message: String },
    /// The sale cleared: the target is always open again.
    #[serde(rename = "sale.cleared", rename_all = "camelCase")]
    SaleCleared { source: SaleSource },
    /// The adaptive outflow moved the batch: the purchase API's health as the gate sees it
    /// (`reason` says why: latency, errors, healthy).
    #[serde(rename = "outflow.batch_changed", rename_all = "camelCase")]
    BatchChanged { from: Option<u64>, to: u64, reason: String },
    /// The queue's first users were admitted (`admitted` in all).
    #[serde(rename = "admission.first", rename_all = "camelCase")]
    FirstAdmission { admitted: u64 },
    /// The users admitted in all passed a multiple of `events.admitted_every`.
    #[serde(rename = "admission.milestone", rename_all = "camelCase")]
    AdmissionMilestone { admitted: u64 },
    /// The line is gone: a tick admitted under its batch after one that filled it.
    #[serde(rename = "queue.emptied", rename_all = "camelCase")]
    QueueEmptied { mark: u64 },
    /// An instance answered without the store (`answer`: failed_open, out_of_memory,
    /// not_replicated; as `virtual_queue_redis_degraded_total`) `count` times since its
    /// previous such event.
    #[serde(rename = "store.degraded", rename_all = "camelCase")]
    Degraded { instance: String, answer: String, count: u64 },
    /// An instance's clock is more than a second off Redis' (`off`), or agrees again:
    /// `offsetMs` is Redis' clock minus the instance's. vq decides by Redis' clock; the host's
    /// time sync needs fixing.
    #[serde(rename = "clock.drift", rename_all = "camelCase")]
    ClockDrift { instance: String, offset_ms: i64, off: bool },
}

impl EventKind {
    /// The event of a sale's or the outflow's ledger row; `None` for an admission step,
    /// which the log does not hold (only its milestones).
    pub fn of_ledger(entry: &LedgerEntry) -> Option<EventKind> {
        Some(match entry.clone() {
            LedgerEntry::Admission { .. } => return None,
            LedgerEntry::Schedule { opens_at_ms, prequeue_from_ms, closes_at_ms, .. } => {
                EventKind::SaleScheduled { opens_at_ms, prequeue_from_ms, closes_at_ms }
            }
            LedgerEntry::Opening { prequeued, seed_commitment, .. } => {
                EventKind::SaleOpened { prequeued, seed_commitment }
            }
            LedgerEntry::Pause { source, .. } => EventKind::SalePaused { source },
            LedgerEntry::Resume { source, .. } => EventKind::SaleResumed { source },
            LedgerEntry::Close { source: SaleSource::PurchaseApi, message, .. } => EventKind::SoldOut { message },
            LedgerEntry::Close { source, message, .. } => EventKind::SaleClosed { source, message },
            LedgerEntry::Clear { source, .. } => EventKind::SaleCleared { source },
            LedgerEntry::Batch { from, to, reason, .. } => EventKind::BatchChanged { from, to, reason },
        })
    }

    /// The `type` of the event as subscribers see it (`sale.opened`).
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::SaleScheduled { .. } => "sale.scheduled",
            EventKind::PrequeueOpened { .. } => "sale.prequeue_opened",
            EventKind::SaleOpened { .. } => "sale.opened",
            EventKind::SalePaused { .. } => "sale.paused",
            EventKind::SaleResumed { .. } => "sale.resumed",
            EventKind::SaleClosed { .. } => "sale.closed",
            EventKind::SoldOut { .. } => "sale.sold_out",
            EventKind::SaleCleared { .. } => "sale.cleared",
            EventKind::BatchChanged { .. } => "outflow.batch_changed",
            EventKind::FirstAdmission { .. } => "admission.first",
            EventKind::AdmissionMilestone { .. } => "admission.milestone",
            EventKind::QueueEmptied { .. } => "queue.emptied",
            EventKind::Degraded { .. } => "store.degraded",
            EventKind::ClockDrift { .. } => "clock.drift",
        }
    }
}

/// One entry of an event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub log: EventLog,
    pub id: EventId,
    /// When it happened (ms, the store's clock; the id's time is when it was appended).
    pub at_ms: u64,
    pub kind: EventKind,
}

/// An event as a subscriber receives it: one JSON object (a webhook's body, a line of
/// `vq events`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Wire<'a> {
    id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    at: String,
    at_ms: u64,
    #[serde(flatten)]
    kind: &'a EventKind,
}

impl Event {
    /// The id a subscriber deduplicates by: `<log>/<ms>-<seq>`, unique across logs.
    pub fn wire_id(&self) -> String {
        format!("{}/{}", self.log.name(), self.id)
    }

    /// The event as JSON: `{"id", "type", "target", "at", "atMs", "data"}`.
    pub fn to_json(&self) -> String {
        let wire = Wire {
            id: self.wire_id(),
            target: self.log.target().map(|_| self.log.name()),
            at: format_instant(self.at_ms),
            at_ms: self.at_ms,
            kind: &self.kind,
        };
        serde_json::to_string(&wire).expect("an event serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_order_and_follow_as_redis_gives_them() {
        let a = EventId { ms: 5, seq: 0 };
        assert_eq!(a.next_at(4), EventId { ms: 5, seq: 1 }, "a clock behind never goes back");
        assert_eq!(a.next_at(5), EventId { ms: 5, seq: 1 });
        assert_eq!(a.next_at(9), EventId { ms: 9, seq: 0 });
        assert!(EventId { ms: 5, seq: 1 } > a);
        assert_eq!("17-3".parse::<EventId>(), Ok(EventId { ms: 17, seq: 3 }));
        assert_eq!("17".parse::<EventId>(), Ok(EventId { ms: 17, seq: 0 }));
        assert_eq!(parse_since("limited-drop:42/17-3"), Ok(EventId { ms: 17, seq: 3 }));
        for bad in ["", "x", "1-", "-1", "1-2-3", "a/b"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_event_is_one_json_object_with_its_id_type_and_data() {
        let target: QueueTarget = "limited-drop:42".parse().expect("target");
        let e = Event {
            log: EventLog::Target(target),
            id: EventId { ms: 1_700_000_000_000, seq: 2 },
            at_ms: 1_700_000_000_000,
            kind: EventKind::SalePaused { source: SaleSource::Command },
        };
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).expect("json");
        assert_eq!(v["id"], "limited-drop:42/1700000000000-2");
        assert_eq!(v["type"], "sale.paused");
        assert_eq!(v["target"], "limited-drop:42");
        assert_eq!(v["at"], "2023-11-14T22:13:20Z");
        assert_eq!(v["data"]["source"], "command");
        assert_eq!(e.kind.name(), "sale.paused");
    }

    #[test]
    fn a_close_by_the_purchase_api_is_sold_out() {
        let close = |source| LedgerEntry::Close { at_ms: 1, source, message: "m".into() };
        assert_eq!(
            EventKind::of_ledger(&close(SaleSource::PurchaseApi)),
            Some(EventKind::SoldOut { message: "m".into() })
        );
        assert!(matches!(EventKind::of_ledger(&close(SaleSource::Schedule)), Some(EventKind::SaleClosed { .. })));
    }
}
