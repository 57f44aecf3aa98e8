//! What one run measures: per kind of request latency and status counts, and the
//! simulation's own counters, shared by every buyer task.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::sync::atomic::{AtomicU64, AtomicUsize};

use hdrhistogram::Histogram;

use super::MAX_STATUS;

pub(super) fn micros_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("static histogram bounds are valid")
}

/// Histogram shards: each runtime thread records into its own, so the buyer tasks of two
/// threads do not wait on one lock per request; read merged.
const SHARDS: usize = 4;

pub(super) struct ShardedHistogram {
    shards: [Mutex<Histogram<u64>>; SHARDS],
}

thread_local! {
    /// This thread's shard, handed out round-robin on first use.
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
}
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

impl ShardedHistogram {
    /// Of microseconds, 1 µs to 120 s.
    pub(super) fn micros() -> Self {
        Self { shards: std::array::from_fn(|_| Mutex::new(micros_histogram())) }
    }

    pub(super) fn record(&self, value: u64) {
        let i = SHARD.with(|s| *s);
        if let Ok(mut h) = self.shards[i].lock() {
            h.saturating_record(value);
        }
    }

    /// Every shard's values together; `reset` empties the shards.
    pub(super) fn merged(&self, reset: bool) -> Histogram<u64> {
        let mut all = micros_histogram();
        for shard in &self.shards {
            if let Ok(mut h) = shard.lock() {
                // Same bounds on both sides: adding cannot fail.
                let _ = all.add(&*h);
                if reset {
                    h.reset();
                }
            }
        }
        all
    }
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
    pub(super) latency_us: ShardedHistogram,
    pub(super) statuses: Vec<AtomicU64>,
    pub(super) transport_errors: AtomicU64,
}

impl KindStats {
    pub(super) fn new() -> Self {
        Self {
            latency_us: ShardedHistogram::micros(),
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
    /// How late enters and polls left against their schedule (timer lateness plus the
    /// wait for a free slot), µs.
    pub(super) enter_lag_us: ShardedHistogram,
    pub(super) poll_lag_us: ShardedHistogram,
    /// How late the run's timers fired (a user's arrival, a user's next poll), µs: the
    /// generator's own scheduling delay, before any wait for a slot.
    pub(super) timer_lag_us: ShardedHistogram,
    /// Requests that found all `--concurrency` slots busy.
    pub(super) waited_for_slot: AtomicU64,
    /// µs since the run's start; u64::MAX / 0 until set.
    pub(super) first_enter_sent: AtomicU64,
    pub(super) last_enter_sent: AtomicU64,
    pub(super) last_enter_answered: AtomicU64,
    pub(super) enters_answered: AtomicU64,
    pub(super) waits_ms: Mutex<Histogram<u64>>,
    pub(super) eta_errors_ms: Mutex<Vec<i64>>,
    pub(super) queue_full: AtomicU64,
    pub(super) direct_admitted: AtomicU64,
    /// Proof of work: challenges solved, hashes they took, and each solve's time (µs).
    pub(super) pow_solved: AtomicU64,
    pub(super) pow_hashes: AtomicU64,
    pub(super) pow_us: Mutex<Histogram<u64>>,
    pub(super) abandoned: AtomicU64,
    pub(super) evicted_seen: AtomicU64,
    pub(super) still_waiting: AtomicU64,
    pub(super) purchase_attempts: AtomicU64,
    /// Admitted buyers who chose not to buy (`--conversion`).
    pub(super) no_shows: AtomicU64,
    /// With an opening: users pre-queued, and (arrival index, place) of those placed by it
    /// and of those who entered after it.
    pub(super) prequeued: AtomicU64,
    pub(super) prequeued_places: Mutex<Vec<(u64, u64)>>,
    pub(super) later_places: Mutex<Vec<(u64, u64)>>,
    /// (entered, seen admitted), µs since the run's start, of every user admitted through
    /// the queue: the order error (`report::OrderError`).
    pub(super) admissions: Mutex<Vec<(u64, u64)>>,
}

impl Recorder {
    pub(super) fn new() -> Self {
        Self {
            kinds: [KindStats::new(), KindStats::new(), KindStats::new(), KindStats::new()],
            enter_lag_us: ShardedHistogram::micros(),
            poll_lag_us: ShardedHistogram::micros(),
            timer_lag_us: ShardedHistogram::micros(),
            waited_for_slot: AtomicU64::new(0),
            first_enter_sent: AtomicU64::new(u64::MAX),
            last_enter_sent: AtomicU64::new(0),
            last_enter_answered: AtomicU64::new(0),
            enters_answered: AtomicU64::new(0),
            waits_ms: Mutex::new(Histogram::new_with_bounds(1, 24 * 3_600_000, 3).expect("valid bounds")),
            eta_errors_ms: Mutex::new(Vec::new()),
            queue_full: AtomicU64::new(0),
            direct_admitted: AtomicU64::new(0),
            pow_solved: AtomicU64::new(0),
            pow_hashes: AtomicU64::new(0),
            pow_us: Mutex::new(micros_histogram()),
            abandoned: AtomicU64::new(0),
            evicted_seen: AtomicU64::new(0),
            still_waiting: AtomicU64::new(0),
            purchase_attempts: AtomicU64::new(0),
            no_shows: AtomicU64::new(0),
            prequeued: AtomicU64::new(0),
            prequeued_places: Mutex::new(Vec::new()),
            later_places: Mutex::new(Vec::new()),
            admissions: Mutex::new(Vec::new()),
        }
    }
}
