//! Where a waiting user stands: admitted or not, users ahead, ETA.

/// Seconds until a user with `ahead` users before them is admitted: the ticks needed to let
/// them and the user through, times the tick length.
pub fn eta_seconds(ahead: u64, batch_size: u64, tick_ms: u64) -> u64 {
    let batch = batch_size.max(1);
    let ticks = (ahead + 1).div_ceil(batch);
    (ticks * tick_ms).div_ceil(1000)
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
    fn admission_follows_the_fixed_seq_not_the_rank() {
        let p = QueuePosition { seq: 150, admitted_mark: 100, ahead: 0 };
        assert!(!p.is_admitted(), "nobody ahead, but the mark has not reached the seq");
        let p = QueuePosition { seq: 100, admitted_mark: 100, ahead: 0 };
        assert!(p.is_admitted());
        assert_eq!(p.eta_seconds(100, 2000), 0);
    }
}
