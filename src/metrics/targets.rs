//! The per-target series: state read from Redis at scrape time and this instance's pump
//! counts, kept in one map so that a target's series go when the target does.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{
    ADAPTIVE_BATCH_MIN, ADAPTIVE_ERROR_RATIO, ADAPTIVE_NO_SHOW_RATIO, ADAPTIVE_P95, ADMITTED_TOTAL, BATCH_SIZE,
    EVICTED_TOTAL, LANE_LENGTH, QUEUE_LENGTH, SALE_STATE, TARGET_ADMISSION_RATE, TARGET_TOKENS, sale_state_label,
    sale_state_labels,
};
use crate::domain::{QueueTarget, SaleState};

/// The per-target series of this process, kept here rather than in the recorder so that a
/// target's series go when the target does: only active declared targets have them
/// ([`retain_targets`] at every scrape), so their number is bounded by `queue.max_targets`.
#[derive(Debug, Clone, Default)]
struct TargetSeries {
    /// A target with lanes: users waiting per lane (none for a target without lanes, so the
    /// `lane` label exists only where lanes do: at most `queue.max_targets` × 17 series).
    lanes: Vec<(String, u64)>,
    waiting: u64,
    target_rate_per_sec: f64,
    /// The batch in force (the adaptive controller's, a pin, or the configured one).
    batch: u64,
    /// `None` without a sale.
    sale_state: Option<SaleState>,
    admitted: u64,
    evicted: u64,
    /// Cluster-wide: tokens issued through the queue, used by a purchase, expired unused.
    tokens: [u64; 3],
    /// The adaptive controller's last signals: P95 (s), error ratio, no-show ratio.
    signals: Option<(Option<f64>, f64, Option<f64>)>,
    /// With an adaptive outflow, the batch's floor (the type's `batch_min`, else
    /// `queue.batch_min`).
    batch_min: Option<u64>,
}

static TARGETS: Mutex<BTreeMap<QueueTarget, TargetSeries>> = Mutex::new(BTreeMap::new());

fn with_target(target: QueueTarget, f: impl FnOnce(&mut TargetSeries)) {
    f(TARGETS.lock().unwrap_or_else(|e| e.into_inner()).entry(target).or_default());
}

/// A target's state as read from Redis at scrape time (creates its series). `sale_state`:
/// the sale's state, `None` without a sale.
pub fn set_queue_state(
    target: QueueTarget,
    waiting: u64,
    batch: u64,
    target_rate_per_sec: f64,
    sale_state: Option<SaleState>,
) {
    with_target(target, |s| {
        s.waiting = waiting;
        s.batch = batch;
        s.target_rate_per_sec = target_rate_per_sec;
        s.sale_state = sale_state;
    });
}

/// The target's tokens (cluster-wide, from Redis) and, with an adaptive outflow, the signals
/// of its controller's last decision.
pub fn set_target_outcomes(target: QueueTarget, tokens: [u64; 3], signals: Option<(Option<f64>, f64, Option<f64>)>) {
    with_target(target, |s| {
        s.tokens = tokens;
        s.signals = signals;
    });
}

/// A target's users waiting per lane, from Redis at scrape time; empty for a target without
/// lanes (no series).
pub fn set_lane_lengths(target: QueueTarget, lanes: Vec<(String, u64)>) {
    with_target(target, |s| s.lanes = lanes);
}

/// Drops the series of every target `keep` refuses (no longer declared, or idle: out of
/// `queue:active`).
pub fn retain_targets(keep: impl Fn(QueueTarget) -> bool) {
    TARGETS.lock().unwrap_or_else(|e| e.into_inner()).retain(|t, _| keep(*t));
}

/// The per-target series in Prometheus text.
pub(super) fn render_targets(out: &mut String) {
    use std::fmt::Write;
    let targets = TARGETS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    /// Name, Prometheus type, help, value.
    type Series = (&'static str, &'static str, &'static str, fn(&TargetSeries) -> f64);
    let series: [Series; 5] = [
        (QUEUE_LENGTH, "gauge", "Users waiting and not yet admitted, per target (from Redis at scrape time)", |s| {
            s.waiting as f64
        }),
        (
            BATCH_SIZE,
            "gauge",
            "Users admitted per tick in force: the adaptive controller's, a pin or the configured",
            |s| s.batch as f64,
        ),
        (TARGET_ADMISSION_RATE, "gauge", "Admissions per second the pump aims at: batch size / tick seconds", |s| {
            s.target_rate_per_sec
        }),
        (ADMITTED_TOTAL, "counter", "Users admitted by this instance's pump, per target", |s| s.admitted as f64),
        (EVICTED_TOTAL, "counter", "Users evicted for not polling by this instance's pump, per target (churn)", |s| {
            s.evicted as f64
        }),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (t, s) in &targets {
            let _ = writeln!(out, "{name}{{target=\"{t}\"}} {}", value(s));
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "# HELP {TARGET_TOKENS} Tokens issued through the queue, used by a purchase, expired unused (no-shows), per target (cluster-wide, from Redis at scrape time)\n# TYPE {TARGET_TOKENS} gauge"
    );
    for (t, s) in &targets {
        for (i, outcome) in ["issued", "used", "expired"].iter().enumerate() {
            let _ = writeln!(out, "{TARGET_TOKENS}{{target=\"{t}\",outcome=\"{outcome}\"}} {}", s.tokens[i]);
        }
    }
    out.push('\n');
    type Signal = (&'static str, &'static str, fn((Option<f64>, f64, Option<f64>)) -> Option<f64>);
    let signals: [Signal; 3] = [
        (
            ADAPTIVE_P95,
            "P95 latency of buyers' slowest purchases in the adaptive controller's last interval (bucket upper bound)",
            |s| s.0,
        ),
        (ADAPTIVE_ERROR_RATIO, "Share of buyers failed (5xx, 429, timeout, unreachable) in its last interval", |s| {
            Some(s.1)
        }),
        (ADAPTIVE_NO_SHOW_RATIO, "Smoothed share of admitted buyers whose token expired unused", |s| s.2),
    ];
    let floors: Vec<_> = targets.iter().filter_map(|(t, s)| s.batch_min.map(|m| (t, m))).collect();
    if !floors.is_empty() {
        let _ = writeln!(
            out,
            "# HELP {ADAPTIVE_BATCH_MIN} The adaptive batch's floor (batch_min) of each target with an adaptive outflow\n# TYPE {ADAPTIVE_BATCH_MIN} gauge"
        );
        for (t, m) in floors {
            let _ = writeln!(out, "{ADAPTIVE_BATCH_MIN}{{target=\"{t}\"}} {m}");
        }
        out.push('\n');
    }
    for (name, help, value) in signals {
        let rows: Vec<_> = targets.iter().filter_map(|(t, s)| s.signals.and_then(value).map(|v| (t, v))).collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (t, v) in rows {
            let _ = writeln!(out, "{name}{{target=\"{t}\"}} {v}");
        }
        out.push('\n');
    }
    if targets.values().any(|s| !s.lanes.is_empty()) {
        let _ = writeln!(
            out,
            "# HELP {LANE_LENGTH} Users waiting per lane of each target with lanes (from Redis at scrape time)\n# TYPE {LANE_LENGTH} gauge"
        );
        for (t, s) in &targets {
            for (lane, n) in &s.lanes {
                let _ = writeln!(out, "{LANE_LENGTH}{{target=\"{t}\",lane=\"{lane}\"}} {n}");
            }
        }
        out.push('\n');
    }
    // One series per state, 1 for the state the sale is in: the alert rules tell a sale held
    // on purpose (scheduled, pre-queue, paused, closed) from a pump that fails.
    let _ = writeln!(
        out,
        "# HELP {SALE_STATE} 1 for the state of the target's sale (none: no sale), 0 for the others\n# TYPE {SALE_STATE} gauge"
    );
    for (t, s) in &targets {
        for state in sale_state_labels() {
            let (label, is) = (sale_state_label(state), u8::from(state == s.sale_state));
            let _ = writeln!(out, "{SALE_STATE}{{target=\"{t}\",state=\"{label}\"}} {is}");
        }
    }
    out.push('\n');
}

/// A target's adaptive floor (its type's `batch_min`, else `queue.batch_min`), exported only
/// for targets with an adaptive outflow: a batch sitting at it (the alert
/// VirtualQueueBatchAtFloor) means the purchase API is struggling.
pub fn set_adaptive_batch_min(target: QueueTarget, batch_min: Option<u64>) {
    with_target(target, |s| s.batch_min = batch_min);
}

/// Called by the pump that advanced the mark.
pub fn admitted(target: QueueTarget, users: u64) {
    with_target(target, |s| s.admitted += users);
}

pub fn evicted(target: QueueTarget, users: u64) {
    with_target(target, |s| s.evicted += users);
}
