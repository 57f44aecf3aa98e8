//! What one run measures: per kind of request latency and status counts, and the
//! simulation's own counters, shared by every buyer task.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;

use hdrhistogram::Histogram;

use super::MAX_STATUS;

pub(super) fn micros_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("static histogram bounds are valid")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Enter = 0,
    Poll = 1,
    Purchase = 2,
    Leave = 3,
}

pub(super) const KINDS: [(Kind, &str); 4] =
    [(Kind::Enter, "enter"), (Kind::Poll, "poll"), (Kind::Purchase, "purchase"), (Kind::Leave, "leave")];

/// Counters of one kind of request.
pub(super) struct KindStats {
    pub(super) latency_us: Mutex<Histogram<u64>>,
    pub(super) statuses: Vec<AtomicU64>,
    pub(super) transport_errors: AtomicU64,
}

impl KindStats {
    pub(super) fn new() -> Self {
        Self {
            latency_us: Mutex::new(micros_histogram()),
            statuses: (0..MAX_STATUS).map(|_| AtomicU64::new(0)).collect(),
            transport_errors: AtomicU64::new(0),
        }
    }

    pub(super) fn counts(&self) -> BTreeMap<String, u64> {
        let mut m: BTreeMap<String, u64> = self
            .statuses
            .iter()
            .enumerate()
            .filter_map(|(code, n)| {
                let n = n.load(Ordering::Relaxed);
                (n > 0).then(|| (code.to_string(), n))
            })
            .collect();
        let t = self.transport_errors.load(Ordering::Relaxed);
        if t > 0 {
            m.insert("transportError".into(), t);
        }
        m
    }
}

/// Everything measured during one run, shared by the user tasks.
pub(super) struct Recorder {
    pub(super) kinds: [KindStats; 4],
    /// How late enters left against their schedule, µs.
    pub(super) enter_lag_us: Mutex<Histogram<u64>>,
    /// µs since the run's start; u64::MAX / 0 until set.
    pub(super) first_enter_sent: AtomicU64,
    pub(super) last_enter_sent: AtomicU64,
    pub(super) last_enter_answered: AtomicU64,
    pub(super) enters_answered: AtomicU64,
    pub(super) waits_ms: Mutex<Histogram<u64>>,
    pub(super) eta_errors_ms: Mutex<Vec<i64>>,
    pub(super) queue_full: AtomicU64,
    pub(super) direct_admitted: AtomicU64,
    pub(super) abandoned: AtomicU64,
    pub(super) evicted_seen: AtomicU64,
    pub(super) still_waiting: AtomicU64,
    pub(super) purchase_attempts: AtomicU64,
}

impl Recorder {
    pub(super) fn new() -> Self {
        Self {
            kinds: [KindStats::new(), KindStats::new(), KindStats::new(), KindStats::new()],
            enter_lag_us: Mutex::new(micros_histogram()),
            first_enter_sent: AtomicU64::new(u64::MAX),
            last_enter_sent: AtomicU64::new(0),
            last_enter_answered: AtomicU64::new(0),
            enters_answered: AtomicU64::new(0),
            waits_ms: Mutex::new(Histogram::new_with_bounds(1, 24 * 3_600_000, 3).expect("valid bounds")),
            eta_errors_ms: Mutex::new(Vec::new()),
            queue_full: AtomicU64::new(0),
            direct_admitted: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            evicted_seen: AtomicU64::new(0),
            still_waiting: AtomicU64::new(0),
            purchase_attempts: AtomicU64::new(0),
        }
    }
}
