//! Cluster-wide queue figures computed from what the store holds (never one instance's memory).

use std::collections::BTreeMap;

/// The wait histogram's buckets, as `(below, width)` in seconds: below each `below`, buckets
/// `width` wide (whole seconds below 2 min, 10 s up to 10 min, 1 min up to an hour); from the
/// last `below` on, one bucket. The one home of these edges: the Redis store sends them to
/// `admit.lua` (whose prelude's `wait_bucket` applies them), the embedded store calls
/// [`wait_bucket`].
pub const WAIT_BUCKETS: [(u64, u64); 3] = [(120, 1), (600, 10), (3600, 60)];

/// The bucket edges (upper bounds, s) of `/metrics`' wait histogram
/// (`virtual_queue_wait_seconds`, counted per instance for alerts and dashboards): coarser
/// than [`WAIT_BUCKETS`], and cut from them: each edge starts one of their buckets and the
/// last is where their open-ended one starts, so a wait falls between the same two edges in
/// Prometheus as in the stored histogram (`edges_of_the_metric_are_edges_of_the_buckets`).
pub const WAIT_METRIC_EDGES_S: [u64; 12] = [1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600];

/// The histogram bucket (its lower bound in seconds) of a wait of `wait_s` whole seconds.
pub fn wait_bucket(wait_s: u64) -> u64 {
    match WAIT_BUCKETS.iter().find(|(below, _)| wait_s < *below) {
        Some((_, width)) => wait_s / width * width,
        None => WAIT_BUCKETS[WAIT_BUCKETS.len() - 1].0,
    }
}

/// The width of the bucket starting at `lower` (0 for the last, open-ended one).
fn bucket_width(lower: u64) -> u64 {
    WAIT_BUCKETS.iter().find(|(below, _)| lower < *below).map_or(0, |(_, width)| *width)
}

/// Waits from entry to admission, as counted by the pump for every admitted user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaitHistogram {
    /// bucket lower bound (s) -> users
    pub buckets: BTreeMap<u64, u64>,
    pub count: u64,
    pub sum_ms: u64,
}

impl WaitHistogram {
    pub fn record(&mut self, wait_ms: u64) {
        *self.buckets.entry(wait_bucket(wait_ms / 1000)).or_default() += 1;
        self.count += 1;
        self.sum_ms += wait_ms;
    }

    pub fn avg_seconds(&self) -> f64 {
        if self.count == 0 { 0.0 } else { self.sum_ms as f64 / self.count as f64 / 1000.0 }
    }

    /// The `q` quantile (0–1), interpolated linearly inside its bucket.
    pub fn quantile_seconds(&self, q: f64) -> f64 {
        let total: u64 = self.buckets.values().sum();
        if total == 0 {
            return 0.0;
        }
        let rank = q * total as f64;
        let mut seen = 0u64;
        for (lower, n) in &self.buckets {
            if (seen + n) as f64 >= rank {
                let into = (rank - seen as f64) / *n as f64;
                return *lower as f64 + into * bucket_width(*lower) as f64;
            }
            seen += n;
        }
        self.buckets.keys().last().map_or(0.0, |b| *b as f64)
    }
}

/// Users admitted per second over the last minute, from `(tick, admitted)` pairs.
pub fn admission_rate_per_sec(admissions: &[(u64, u64)], tick_ms: u64, now_ms: u64) -> f64 {
    admission_rate_over(admissions, tick_ms, now_ms, 60_000)
}

/// Admissions per second over the last `window_ms` (at least one tick): for a queue younger
/// than a minute, the rate since it started rather than its admissions spread over a minute.
pub fn admission_rate_over(admissions: &[(u64, u64)], tick_ms: u64, now_ms: u64, window_ms: u64) -> f64 {
    let window_ms = window_ms.max(tick_ms).max(1);
    let since = now_ms.saturating_sub(window_ms);
    let n: u64 = admissions.iter().filter(|(tick, _)| tick * tick_ms >= since).map(|(_, n)| n).sum();
    n as f64 * 1000.0 / window_ms as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_of_the_metric_are_edges_of_the_buckets() {
        assert!(WAIT_METRIC_EDGES_S.windows(2).all(|w| w[0] < w[1]), "rising edges");
        for edge in WAIT_METRIC_EDGES_S {
            assert_eq!(wait_bucket(edge), edge, "{edge} s splits a bucket of WAIT_BUCKETS");
        }
        let open_ended = WAIT_BUCKETS[WAIT_BUCKETS.len() - 1].0;
        assert_eq!(WAIT_METRIC_EDGES_S.last(), Some(&open_ended), "the metric's last edge is the open bucket's start");
    }

    #[test]
    fn buckets_are_fine_for_short_waits_and_coarse_for_long() {
        assert_eq!(wait_bucket(0), 0);
        assert_eq!(wait_bucket(119), 119);
        assert_eq!(wait_bucket(125), 120);
        assert_eq!(wait_bucket(601), 600);
        assert_eq!(wait_bucket(9999), 3600);
    }

    #[test]
    fn quantiles_fall_inside_the_right_bucket() {
        let mut h = WaitHistogram::default();
        for w in [0, 2000, 4000, 6000] {
            for _ in 0..25 {
                h.record(w);
            }
        }
        assert!((h.avg_seconds() - 3.0).abs() < 1e-9);
        let p95 = h.quantile_seconds(0.95);
        assert!((6.0..=7.0).contains(&p95), "{p95}");
        let p50 = h.quantile_seconds(0.5);
        assert!((2.0..=3.0).contains(&p50), "{p50}");
    }

    #[test]
    fn rate_counts_only_the_last_minute() {
        let now = 1_000_000;
        let adm = [(500, 100), (499, 100), (100, 100)];
        assert!((admission_rate_per_sec(&adm, 2000, now) - 200.0 / 60.0).abs() < 1e-9);
    }
}
