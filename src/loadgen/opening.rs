//! The simulated opening of `--opening-in`: the sale scheduled for the run, and what the
//! shuffle did to the order (Spearman's rank correlation of arrival and place).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::recorder::Recorder;
use super::{OpeningFigures, epoch_ms};
use crate::domain::QueueTarget;
use crate::store::RedisStore;
use crate::store::prelude::*;

/// Schedules the target's sale for [`Options::opening_in`]: pre-queue from now, opening
/// `opens_in` from now, a seed drawn from the run's seed (loadgen's order is reproducible; a
/// real sale's seed comes from `vq sale schedule`).
pub(super) async fn schedule_opening(store: &RedisStore, target: QueueTarget, opens_in: Duration, seed: u64) {
    let now = epoch_ms();
    let schedule = crate::domain::SaleSchedule {
        opens_at_ms: now + opens_in.as_millis() as u64,
        prequeue_from_ms: Some(now),
        closes_at_ms: None,
    };
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(i as u64).to_be_bytes());
    }
    if let Err(e) = store.schedule_sale(target, schedule, bytes).await {
        tracing::warn!(error = %e, "the opening could not be scheduled: the run goes on without it");
    }
}

/// Spearman's rank correlation of (arrival index, place) pairs; `None` below 3 pairs.
pub fn rank_correlation(pairs: &[(u64, u64)]) -> Option<f64> {
    let n = pairs.len();
    if n < 3 {
        return None;
    }
    let ranks = |key: &dyn Fn(&(u64, u64)) -> u64| {
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by_key(|&i| key(&pairs[i]));
        let mut r = vec![0f64; n];
        for (rank, i) in idx.into_iter().enumerate() {
            r[i] = rank as f64;
        }
        r
    };
    let (a, b) = (ranks(&|p| p.0), ranks(&|p| p.1));
    let mean = (n as f64 - 1.0) / 2.0;
    let (mut cov, mut va, mut vb) = (0.0, 0.0, 0.0);
    for i in 0..n {
        let (x, y) = (a[i] - mean, b[i] - mean);
        cov += x * y;
        va += x * x;
        vb += y * y;
    }
    Some(cov / (va * vb).sqrt())
}

pub(super) fn opening_figures(r: &Recorder) -> OpeningFigures {
    let pre = r.prequeued_places.lock().map(|v| v.clone()).unwrap_or_default();
    let later = r.later_places.lock().map(|v| v.clone()).unwrap_or_default();
    OpeningFigures {
        prequeued: r.prequeued.load(Ordering::Relaxed),
        prequeued_placed: pre.len() as u64,
        prequeued_rank_correlation: rank_correlation(&pre),
        later: later.len() as u64,
        later_rank_correlation: rank_correlation(&later),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_correlation_is_one_for_the_same_order_minus_one_reversed_none_for_too_few() {
        let same: Vec<(u64, u64)> = (0..10).map(|i| (i, i * 7 + 3)).collect();
        assert!((rank_correlation(&same).unwrap() - 1.0).abs() < 1e-12);
        let reversed: Vec<(u64, u64)> = (0..10).map(|i| (i, 100 - i)).collect();
        assert!((rank_correlation(&reversed).unwrap() + 1.0).abs() < 1e-12);
        // Ranks, not values: a monotonic but uneven map is still 1.
        let uneven = [(1, 1), (2, 50), (3, 51), (4, 1000)];
        assert!((rank_correlation(&uneven).unwrap() - 1.0).abs() < 1e-12);
        // 1..5 against a fixed shuffle: Σd² = 14 → 1 - 6·14/(5·24) = 0.3.
        let shuffled = [(1, 2), (2, 4), (3, 1), (4, 5), (5, 3)];
        assert!((rank_correlation(&shuffled).unwrap() - 0.3).abs() < 1e-12);
        assert_eq!(rank_correlation(&[(1, 1), (2, 2)]), None);
    }
}
