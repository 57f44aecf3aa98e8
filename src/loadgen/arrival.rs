//! Arrival curves: when the i-th simulated user enters, relative to the start of the run.
//! Pure arithmetic, no clock.

use std::time::Duration;

/// The shape of the inflow at sale start; `rate` is always the peak rate in enters/s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ArrivalCurve {
    /// The peak rate from the first second on.
    Constant,
    /// A trickle (a twentieth of the peak) for `warmup`, then the peak: the sale opens.
    Step,
    /// The rate rises linearly from zero to the peak over `warmup`, then stays there.
    Ramp,
}

/// A curve with its peak rate and warm-up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrivals {
    pub curve: ArrivalCurve,
    /// Peak enters per second.
    pub rate: f64,
    pub warmup: Duration,
}

impl Arrivals {
    /// Offset from the start at which user `i` (0-based) is scheduled to enter.
    pub fn offset(&self, i: u64) -> Duration {
        let i = i as f64;
        let r = self.rate.max(f64::MIN_POSITIVE);
        let w = self.warmup.as_secs_f64();
        let secs = match self.curve {
            ArrivalCurve::Constant => i / r,
            ArrivalCurve::Step => {
                let trickle = r / 20.0;
                let before = trickle * w;
                if i < before { i / trickle } else { w + (i - before) / r }
            }
            ArrivalCurve::Ramp => {
                // Users entered by t < w: r t² / (2w).
                let before = r * w / 2.0;
                if w > 0.0 && i < before { (2.0 * i * w / r).sqrt() } else { w + (i - before) / r }
            }
        };
        Duration::from_secs_f64(secs)
    }

    /// Average scheduled rate of the first `users` enters (enters / span of their schedule).
    pub fn scheduled_rate(&self, users: u64) -> f64 {
        if users < 2 {
            return self.rate;
        }
        let span = self.offset(users - 1).as_secs_f64();
        if span <= 0.0 { self.rate } else { (users - 1) as f64 / span }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrivals(curve: ArrivalCurve) -> Arrivals {
        Arrivals { curve, rate: 20_000.0, warmup: Duration::from_secs(2) }
    }

    #[test]
    fn constant_spaces_users_by_one_over_the_rate() {
        let a = arrivals(ArrivalCurve::Constant);
        assert_eq!(a.offset(0), Duration::ZERO);
        assert_eq!(a.offset(20_000), Duration::from_secs(1));
        assert!((a.scheduled_rate(100_000) - 20_000.0).abs() < 1.0);
    }

    #[test]
    fn step_trickles_then_jumps_to_the_peak() {
        let a = arrivals(ArrivalCurve::Step);
        // 1,000/s for 2 s = 2,000 users, then 20,000/s.
        assert_eq!(a.offset(1_000), Duration::from_secs(1));
        assert_eq!(a.offset(2_000), Duration::from_secs(2));
        assert_eq!(a.offset(22_000), Duration::from_secs(3));
    }

    #[test]
    fn ramp_is_monotonic_and_reaches_the_peak_after_the_warmup() {
        let a = arrivals(ArrivalCurve::Ramp);
        let mut last = Duration::ZERO;
        for i in 0..50_000 {
            let t = a.offset(i);
            assert!(t >= last);
            last = t;
        }
        // 20,000 users arrive during the 2 s ramp, then 20,000/s.
        assert!((a.offset(20_000).as_secs_f64() - 2.0).abs() < 1e-9);
        assert!((a.offset(40_000).as_secs_f64() - 3.0).abs() < 1e-9);
    }
}
