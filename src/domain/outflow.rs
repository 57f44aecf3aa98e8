//! Adaptive outflow (`queue.outflow = "adaptive"`): the batch follows the purchase API's
//! health, as the gate measures it. Pure: the observations of one control interval in, the
//! next batch and why out.
//!
//! What it hears: only purchases the gate forwarded with a valid entry token, counted per
//! buyer ([`BuyerObservation`]): a buyer is one observation per interval however many
//! purchases they send, failed if any failed, as slow as their slowest. So `n` buyers whose
//! purchases all fail weigh `n` against the interval's other buyers, never more: with an
//! error threshold `r` they move the batch only when they are over `r / (1 − r)` times the
//! buyers served well in the interval (and at least `min_samples` buyers took part). Backing
//! off is a share too: a purchase API that rate-limits one account (429 to that buyer alone)
//! is not asking everyone for less.
//!
//! The rule is AIMD, as TCP's congestion control: an interval where the purchase API kept its
//! latency and error targets and backed off from no more than that share of buyers adds
//! `increase` users; one where it did not multiplies the batch by `decrease`. Always within `[batch_min, batch_max]`; an interval
//! with fewer than `min_samples` purchases holds the batch (no evidence either way).
//!
//! No-show compensation (`adaptive.target_purchases_per_tick`): admitted buyers whose token
//! expires unused are no-shows; their smoothed share `no_show` ([`smooth_no_show`]) sets the
//! batch a healthy interval moves to, `target / (1 − no_show)`, so the purchase API gets the
//! purchases it can take rather than fewer; an unhealthy interval still cuts the batch.

/// Upper bounds (ms) of the latency buckets the gate counts purchases in; the last is open.
pub const LATENCY_BUCKETS_MS: [u64; 10] = [25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, u64::MAX];

/// The bucket a purchase's latency falls in.
pub fn latency_bucket(ms: u64) -> usize {
    LATENCY_BUCKETS_MS.iter().position(|b| ms <= *b).unwrap_or(LATENCY_BUCKETS_MS.len() - 1)
}

/// What one buyer's purchases in a control interval count for: the slowest one's latency
/// bucket, whether any failed, whether the purchase API backed off from any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BuyerObservation {
    /// The [`LATENCY_BUCKETS_MS`] bucket of the slowest purchase.
    pub bucket: usize,
    /// A purchase answered 5xx or 429, timed out, or not reached.
    pub error: bool,
    /// A purchase answered 503 or 429, or with `Retry-After`.
    pub backoff: bool,
}

impl BuyerObservation {
    /// One buyer's two purchases in an interval as one: the worse of each.
    pub fn worst(self, other: Self) -> Self {
        Self {
            bucket: self.bucket.max(other.bucket),
            error: self.error || other.error,
            backoff: self.backoff || other.backoff,
        }
    }
}

/// What the gates saw of the purchase API in one control interval, every instance together,
/// counted in buyers ([`BuyerObservation`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observations {
    /// Buyers whose purchases were forwarded and answered (or failed).
    pub purchases: u64,
    /// Buyers with a purchase answered 5xx or 429, timed out, or not reached.
    pub errors: u64,
    /// Buyers with a purchase answered 503 or 429, or with `Retry-After`: the purchase API asks
    /// for less.
    pub backoffs: u64,
    /// Buyers per [`LATENCY_BUCKETS_MS`] bucket of their slowest purchase.
    pub latency: [u64; LATENCY_BUCKETS_MS.len()],
}

impl Observations {
    /// The interval's observations made of each buyer's.
    pub fn of_buyers<'a>(buyers: impl IntoIterator<Item = &'a BuyerObservation>) -> Self {
        let mut seen = Self::default();
        for b in buyers {
            seen.purchases += 1;
            seen.errors += u64::from(b.error);
            seen.backoffs += u64::from(b.backoff);
            seen.latency[b.bucket.min(LATENCY_BUCKETS_MS.len() - 1)] += 1;
        }
        seen
    }

    /// The 95th percentile latency, as the upper bound of its bucket (ms); `None` without
    /// purchases.
    pub fn p95_ms(&self) -> Option<u64> {
        let total: u64 = self.latency.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (total * 95).div_ceil(100);
        let mut seen = 0;
        for (i, n) in self.latency.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(LATENCY_BUCKETS_MS[i]);
            }
        }
        Some(u64::MAX)
    }

    pub fn error_ratio(&self) -> f64 {
        if self.purchases == 0 { 0.0 } else { self.errors as f64 / self.purchases as f64 }
    }

    /// The share of buyers the purchase API backed off from.
    pub fn backoff_ratio(&self) -> f64 {
        if self.purchases == 0 { 0.0 } else { self.backoffs as f64 / self.purchases as f64 }
    }
}

/// The controller's settings (`queue.batch_min`, `queue.batch_max`, `[adaptive]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Controller {
    pub batch_min: u64,
    pub batch_max: u64,
    /// P95 latency the purchase API should stay under.
    pub latency_ms: u64,
    /// Share of buyers the purchase API may fail, or back off from.
    pub error_ratio: f64,
    /// Users added after a healthy interval.
    pub increase: u64,
    /// Factor applied after an unhealthy interval (0 < decrease < 1).
    pub decrease: f64,
    /// Fewer purchases than this in an interval: hold.
    pub min_samples: u64,
    /// Purchases per tick to aim at, compensating for no-shows (`None`: AIMD alone).
    pub target_purchases: Option<u64>,
}

/// Tokens ended (used or expired) in an interval below which the no-show share holds.
pub const NO_SHOW_MIN_TOKENS: u64 = 5;
/// Weight of the newest interval in the smoothed no-show share.
pub const NO_SHOW_WEIGHT: f64 = 0.5;
/// The most no-shows compensated for: at 90 % the batch is ten times the target already.
pub const NO_SHOW_MAX: f64 = 0.9;

/// The smoothed share of no-shows after an interval in which `used` tokens bought and
/// `expired` expired unused: an exponentially weighted mean ([`NO_SHOW_WEIGHT`]) of each
/// interval's `expired / (used + expired)`; `previous` while fewer than [`NO_SHOW_MIN_TOKENS`]
/// ended (no evidence).
pub fn smooth_no_show(previous: Option<f64>, used: u64, expired: u64) -> Option<f64> {
    let ended = used + expired;
    if ended < NO_SHOW_MIN_TOKENS {
        return previous;
    }
    let now = expired as f64 / ended as f64;
    Some(match previous {
        Some(p) => p + NO_SHOW_WEIGHT * (now - p),
        None => now,
    })
}

/// The controller's choice for the next interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub batch: u64,
    pub reason: String,
}

impl Controller {
    /// The batch that brings `target_purchases` per tick when a share `no_show` of admitted
    /// buyers never buys, within the bounds; `None` without a target.
    pub fn compensated(&self, no_show: Option<f64>) -> Option<u64> {
        let target = self.target_purchases? as f64;
        let show = 1.0 - no_show.unwrap_or(0.0).clamp(0.0, NO_SHOW_MAX);
        Some(((target / show).ceil() as u64).clamp(self.batch_min, self.batch_max))
    }

    /// The batch after an interval with `seen`, from `current` (clamped into the bounds first),
    /// with `no_show` the smoothed share of no-shows (used only with `target_purchases`).
    pub fn decide(&self, current: u64, seen: &Observations, no_show: Option<f64>) -> Decision {
        let current = current.clamp(self.batch_min, self.batch_max);
        let compensated = self.compensated(no_show);
        if seen.purchases < self.min_samples {
            return Decision {
                batch: current,
                reason: format!("hold: {} purchases, fewer than {}", seen.purchases, self.min_samples),
            };
        }
        let p95 = seen.p95_ms().unwrap_or(0);
        let ratio = seen.error_ratio();
        let trouble = if seen.backoff_ratio() > self.error_ratio {
            Some(format!("{} of {} buyers answered 503/429 or Retry-After", seen.backoffs, seen.purchases))
        } else if ratio > self.error_ratio {
            Some(format!("error ratio {ratio:.3} over {}", self.error_ratio))
        } else if p95 > self.latency_ms {
            Some(format!("P95 ≤ {p95} ms over {} ms", self.latency_ms))
        } else {
            None
        };
        match trouble {
            Some(why) => {
                let batch = ((current as f64 * self.decrease).floor() as u64).max(self.batch_min);
                Decision { batch: compensated.map_or(batch, |c| batch.min(c)), reason: format!("down: {why}") }
            }
            None => match compensated {
                Some(batch) => Decision {
                    batch,
                    reason: format!(
                        "target: {} purchases per tick / (1 − {:.2} no-shows), P95 ≤ {p95} ms, error ratio {ratio:.3}",
                        self.target_purchases.unwrap_or(0),
                        no_show.unwrap_or(0.0).clamp(0.0, NO_SHOW_MAX)
                    ),
                },
                None => Decision {
                    batch: current.saturating_add(self.increase).min(self.batch_max),
                    reason: format!("up: {} purchases, P95 ≤ {p95} ms, error ratio {ratio:.3}", seen.purchases),
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Controller = Controller {
        batch_min: 10,
        batch_max: 100,
        latency_ms: 500,
        error_ratio: 0.05,
        increase: 10,
        decrease: 0.5,
        min_samples: 5,
        target_purchases: None,
    };

    fn seen(purchases: u64, errors: u64, backoffs: u64, ms: u64) -> Observations {
        let mut latency = [0; LATENCY_BUCKETS_MS.len()];
        latency[latency_bucket(ms)] = purchases;
        Observations { purchases, errors, backoffs, latency }
    }

    #[test]
    fn healthy_intervals_add_and_unhealthy_ones_multiply_within_the_bounds() {
        assert_eq!(C.decide3(50, &seen(40, 0, 0, 100)).batch, 60);
        assert_eq!(C.decide3(95, &seen(40, 0, 0, 100)).batch, 100, "never past batch_max");
        assert_eq!(C.decide3(50, &seen(40, 0, 0, 900)).batch, 25, "slow");
        assert_eq!(C.decide3(50, &seen(40, 4, 0, 100)).batch, 25, "10 % errors");
        assert_eq!(C.decide3(50, &seen(40, 0, 3, 100)).batch, 25, "backing off from 7.5 % of the buyers");
        assert_eq!(C.decide3(50, &seen(40, 1, 1, 100)).batch, 60, "one buyer of 40 failed and backed off from");
        assert_eq!(C.decide3(12, &seen(40, 40, 0, 100)).batch, 10, "never under batch_min");
        let hold = C.decide3(50, &seen(4, 4, 4, 9000));
        assert_eq!(hold.batch, 50, "too few purchases: hold");
        assert!(hold.reason.starts_with("hold"), "{}", hold.reason);
        assert_eq!(C.decide3(500, &seen(0, 0, 0, 0)).batch, 100, "a current value out of bounds is clamped");
    }

    impl Controller {
        fn decide3(&self, current: u64, seen: &Observations) -> Decision {
            self.decide(current, seen, None)
        }
    }

    #[test]
    fn a_purchase_target_is_compensated_for_no_shows_within_the_bounds() {
        let t = Controller { target_purchases: Some(20), ..C };
        assert_eq!(t.compensated(None), Some(20));
        assert_eq!(t.compensated(Some(0.5)), Some(40), "half the admitted never buy: twice the target");
        assert_eq!(t.compensated(Some(0.99)), Some(100), "at most 90 % compensated, and never past batch_max");
        assert_eq!(Controller { target_purchases: Some(2), ..C }.compensated(Some(0.0)), Some(10), "batch_min");
        let up = t.decide(12, &seen(40, 0, 0, 100), Some(0.5));
        assert_eq!(up.batch, 40, "a healthy interval moves to the compensated batch");
        assert!(up.reason.starts_with("target"), "{}", up.reason);
        assert_eq!(t.decide(90, &seen(40, 0, 0, 100), Some(0.5)).batch, 40, "down to it as well");
        assert_eq!(t.decide(60, &seen(40, 0, 4, 100), Some(0.5)).batch, 30, "backing off still cuts");
        assert_eq!(t.decide(33, &seen(1, 0, 0, 100), Some(0.5)).batch, 33, "too few purchases: hold");
    }

    #[test]
    fn the_no_show_share_is_smoothed_and_holds_without_evidence() {
        assert_eq!(smooth_no_show(None, 2, 2), None, "fewer than 5 tokens ended");
        assert_eq!(smooth_no_show(Some(0.3), 1, 1), Some(0.3));
        assert_eq!(smooth_no_show(None, 10, 10), Some(0.5));
        assert_eq!(smooth_no_show(Some(0.0), 5, 5), Some(0.25), "half way to the interval's share");
    }

    #[test]
    fn a_buyer_counts_once_as_the_worst_of_their_purchases() {
        let fast = BuyerObservation { bucket: 1, error: false, backoff: false };
        let failed = BuyerObservation { bucket: 0, error: true, backoff: false };
        let slow = BuyerObservation { bucket: 7, error: false, backoff: true };
        assert_eq!(fast.worst(failed).worst(slow), BuyerObservation { bucket: 7, error: true, backoff: true });
        // One attacker failing 1000 times is one buyer in error beside 39 served well: 2.5 %.
        let attacker = (0..1000).map(|_| failed).reduce(BuyerObservation::worst).unwrap();
        let mut buyers = vec![fast; 39];
        buyers.push(attacker);
        let seen = Observations::of_buyers(&buyers);
        assert_eq!((seen.purchases, seen.errors, seen.latency[1], seen.latency[0]), (40, 1, 39, 1));
        assert_eq!(C.decide3(50, &seen).batch, 60, "under the 5 % threshold: up");
    }

    #[test]
    fn p95_is_the_bucket_holding_the_95th_purchase() {
        let mut o = seen(100, 0, 0, 20);
        assert_eq!(o.p95_ms(), Some(25));
        o.latency[latency_bucket(700)] = 6;
        assert_eq!(o.p95_ms(), Some(1000), "6 of 106 slow");
        assert_eq!(Observations::default().p95_ms(), None);
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(10_001), 9);
    }
}
