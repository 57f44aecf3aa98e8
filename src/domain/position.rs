//! Where a waiting user stands: admitted or not, users ahead, ETA.

/// The batch size in force for a target, the one rule for it: the target's runtime value,
/// else the global runtime value, else `queue.batch_size`. (`admit.lua` applies the same
/// rule inside Redis: the pump passes it the global-or-configured value and the script reads
/// the target's own key.)
pub fn batch_in_force(target: Option<u64>, global: Option<u64>, configured: u64) -> u64 {
    target.or(global).unwrap_or(configured)
}

/// Seconds until a user with `ahead` users before them is admitted: the ticks needed to let
/// them and the user through, times the tick length.
pub fn eta_seconds(ahead: u64, batch_size: u64, tick_ms: u64) -> u64 {
    let batch = batch_size.max(1);
    let ticks = (ahead + 1).div_ceil(batch);
    (ticks * tick_ms).div_ceil(1000)
}

/// When a waiting user should poll next, in whole seconds: half the ETA, at least one tick
/// (nothing changes for a user between ticks) and at most a quarter of the heartbeat timeout
/// (so a client that follows it is never evicted, even after a lost poll or two). Users far
/// back poll seldom, users about to be admitted every tick.
pub fn poll_after_seconds(eta_seconds: u64, tick_ms: u64, heartbeat_timeout_s: u64) -> u64 {
    let cap = (heartbeat_timeout_s / 4).max(1);
    let floor = tick_ms.div_ceil(1000).clamp(1, cap);
    (eta_seconds / 2).clamp(floor, cap)
}

/// A user's place in a queue, decided from the fixed sequence number, never the rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuePosition {
    /// The fixed sequence number given at entry (1-based).
    pub seq: u64,
    /// The admission high-water mark: every seq at or below it is admitted.
    pub admitted_mark: u64,
    /// Users ahead that are still waiting and not yet admitted.
    pub ahead: u64,
}

impl QueuePosition {
    /// Admitted ⇔ seq ≤ mark. Users who leave shrink `ahead` but never admit anyone early.
    pub fn is_admitted(&self) -> bool {
        self.seq <= self.admitted_mark
    }

    pub fn eta_seconds(&self, batch_size: u64, tick_ms: u64) -> u64 {
        if self.is_admitted() { 0 } else { eta_seconds(self.ahead, batch_size, tick_ms) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eta_counts_ticks_for_users_ahead_plus_self() {
        assert_eq!(eta_seconds(0, 100, 2000), 2);
        assert_eq!(eta_seconds(99, 100, 2000), 2);
        assert_eq!(eta_seconds(100, 100, 2000), 4);
        assert_eq!(eta_seconds(1199, 100, 2000), 24);
        assert_eq!(eta_seconds(0, 100, 500), 1);
        assert_eq!(eta_seconds(5, 0, 2000), 12, "a zero batch is treated as one");
    }

    #[test]
    fn poll_pacing_follows_the_eta_within_a_tick_and_a_quarter_of_the_heartbeat() {
        assert_eq!(poll_after_seconds(2, 2000, 60), 2, "about to be admitted: every tick");
        assert_eq!(poll_after_seconds(0, 2000, 60), 2);
        assert_eq!(poll_after_seconds(10, 2000, 60), 5);
        assert_eq!(poll_after_seconds(2000, 2000, 60), 15, "far back: a quarter of the heartbeat timeout");
        assert_eq!(poll_after_seconds(3, 500, 60), 1, "a sub-second tick still gives whole seconds");
        assert_eq!(poll_after_seconds(100, 2000, 1), 1, "never 0, never beyond the timeout");
        assert_eq!(poll_after_seconds(100, 10_000, 8), 2, "the cap wins over a tick longer than it");
        for eta in 0..10_000 {
            for hb in [1, 5, 60, 3600] {
                let p = poll_after_seconds(eta, 2000, hb);
                assert!(p >= 1 && (p < hb || hb == 1), "eta {eta} hb {hb}: {p}");
            }
        }
    }

    /// What pacing does to the poll load of the standard sale: 100k users waiting, 100 per
    /// 2 s tick, 60 s heartbeat. Naive clients polling every 2.5 s send 40k polls/s.
    #[test]
    fn paced_polling_of_a_100k_queue_is_a_fraction_of_naive_polling() {
        let per_sec: f64 =
            (0..100_000u64).map(|ahead| 1.0 / poll_after_seconds(eta_seconds(ahead, 100, 2000), 2000, 60) as f64).sum();
        assert!((6_000.0..7_500.0).contains(&per_sec), "{per_sec:.0} polls/s");
    }

    #[test]
    fn the_batch_in_force_is_the_targets_then_the_global_then_the_configured() {
        assert_eq!(batch_in_force(Some(5), Some(50), 100), 5);
        assert_eq!(batch_in_force(None, Some(50), 100), 50);
        assert_eq!(batch_in_force(None, None, 100), 100);
        assert_eq!(batch_in_force(Some(5), None, 100), 5);
    }

    #[test]
    fn admission_follows_the_fixed_seq_not_the_rank() {
        let p = QueuePosition { seq: 150, admitted_mark: 100, ahead: 0 };
        assert!(!p.is_admitted(), "nobody ahead, but the mark has not reached the seq");
        let p = QueuePosition { seq: 100, admitted_mark: 100, ahead: 0 };
        assert!(p.is_admitted());
        assert_eq!(p.eta_seconds(100, 2000), 0);
    }
}
