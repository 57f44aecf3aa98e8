//! A target's record: counters per tick and totals that the scripts add to as things happen
//! (`queue:{T}:record`, one HASH), kept `queue.record_ttl_days` after its last write so it
//! outlives the queue keys, and the report `vq sale report` makes of it.
//!
//! Fields: `a:<tick>` arrivals, `t:<tick>` admitted, `p:<tick>:<class>` purchases forwarded
//! by the purchase API's answer, `wb:<bucket>` / `wc` / `ws` / `wmax` the waits (as the stats'
//! histogram), `admitted`, `left`, `evicted`, `ti` / `ti_last` / `tu` / `tud` tokens issued,
//! last issued (ms), used, used without the queue, `rf:<reason>` purchases the gate refused
//! (`domain::PurchaseRefusal`), `tick_ms`, and `e:<n>` the sale's events (ledger rows; `events`
//! their count). Nothing here does IO or reads a clock.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{LedgerEntry, Refusals, WaitHistogram, format_instant};

/// The class of the purchase API's answer to a forwarded purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerClass {
    Success,
    Redirect,
    ClientError,
    ServerError,
    /// No answer: timed out, refused, not reached.
    Unreached,
}

impl AnswerClass {
    pub const ALL: [Self; 5] = [Self::Success, Self::Redirect, Self::ClientError, Self::ServerError, Self::Unreached];

    pub fn of_status(status: u16) -> Self {
        match status {
            200..=299 => Self::Success,
            300..=399 => Self::Redirect,
            400..=499 => Self::ClientError,
            500..=599 => Self::ServerError,
            _ => Self::Unreached,
        }
    }

    /// Its name in the record's fields, the JSON and the CSV.
    pub fn name(self) -> &'static str {
        match self {
            Self::Success => "2xx",
            Self::Redirect => "3xx",
            Self::ClientError => "4xx",
            Self::ServerError => "5xx",
            Self::Unreached => "unreached",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Purchases per answer class, in [`AnswerClass::ALL`] order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Answers(pub [u64; 5]);

impl Answers {
    pub fn get(&self, class: AnswerClass) -> u64 {
        self.0[class.index()]
    }

    /// Counts one answer of `class`.
    pub fn count(&mut self, class: AnswerClass) {
        self.0[class.index()] += 1;
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    fn add(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }
}

impl Serialize for Answers {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(5))?;
        for c in AnswerClass::ALL {
            m.serialize_entry(c.name(), &self.get(c))?;
        }
        m.end()
    }
}

/// What a target's record holds, as read from the store (decoded by `store::redis::codec`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetRecord {
    /// The tick the per-tick fields were counted in (the pump's; `None` before its first admission).
    pub tick_ms: Option<u64>,
    /// tick -> users who entered (a new place or the pre-queue).
    pub arrivals: BTreeMap<u64, u64>,
    /// tick -> users admitted.
    pub admissions: BTreeMap<u64, u64>,
    /// tick -> purchases forwarded, by answer.
    pub purchases: BTreeMap<u64, Answers>,
    pub waits: WaitHistogram,
    pub wait_max_ms: Option<u64>,
    pub admitted: u64,
    /// Users who left the queue or the pre-queue themselves (abandonment).
    pub left: u64,
    /// Users dropped for not polling within the heartbeat timeout.
    pub evicted: u64,
    pub tokens_issued: u64,
    pub last_issue_ms: Option<u64>,
    pub tokens_used: u64,
    /// Purchases with stateless tokens (queue off for the user, or Redis down): never issued here.
    pub direct_tokens_used: u64,
    /// Purchases of gated routes the gate refused, per reason (added by each instance once
    /// per tick, `service::gate`).
    pub refused: Refusals,
    /// The sale's schedules, opening, pauses, resumes, closes and clears, oldest first.
    pub events: Vec<LedgerEntry>,
}

/// What `vq sale report --json` prints: the source of the CSV and HTML forms.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SaleReport {
    pub target: String,
    pub generated_at: String,
    pub tick_ms: u64,
    /// The first and last tick with anything counted (ISO-8601, UTC).
    pub first_at: Option<String>,
    pub last_at: Option<String>,
    pub totals: Totals,
    pub waits: WaitFigures,
    pub tokens: TokenFigures,
    /// The sale's opening: when, how many were pre-queued, the seed and its commitment.
    pub opening: Option<Opening>,
    /// Schedules, the opening, pauses, resumes, closes and clears with who ran them, oldest first.
    pub events: Vec<LedgerEntry>,
    /// One row per tick with anything counted, oldest first (ticks with nothing are left out).
    pub series: Vec<TickRow>,
    /// A target with lanes: each lane's own figures, the public lane first (`totals` adds
    /// them up); absent for a target without lanes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lanes: Vec<LaneTotals>,
}

/// One lane's figures in a sale report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LaneTotals {
    /// `public`, or the lane's name.
    pub lane: String,
    pub arrivals: u64,
    pub admitted: u64,
    pub left: u64,
    pub evicted: u64,
    /// The first tick it admitted anyone (ISO-8601, UTC): a presale lane's is before the public's.
    pub first_admitted_at: Option<String>,
    pub avg_wait_seconds: f64,
}

impl LaneTotals {
    /// A lane's figures from its own record (its parts added up).
    pub fn of(lane: &str, r: &TargetRecord, tick_ms: u64) -> Self {
        let tick_ms = r.tick_ms.unwrap_or(tick_ms).max(1);
        LaneTotals {
            lane: lane.to_owned(),
            arrivals: r.arrivals.values().sum(),
            admitted: r.admitted,
            left: r.left,
            evicted: r.evicted,
            first_admitted_at: r.admissions.iter().find(|(_, n)| **n > 0).map(|(t, _)| format_instant(t * tick_ms)),
            avg_wait_seconds: r.waits.avg_seconds(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    pub arrivals: u64,
    pub admitted: u64,
    /// Users who left by themselves (abandonment).
    pub left: u64,
    pub evicted: u64,
    pub purchases_forwarded: u64,
    pub answers: Answers,
    /// Purchases of gated routes the gate refused, per reason (`token_used`: the entry token
    /// made its `purchases_per_admission`; `user_limit`: the user made their
    /// `purchases_per_user`; `no_valid_token`: none, or one that does not hold).
    pub refused: Refusals,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitFigures {
    /// Admitted users whose wait was measured.
    pub counted: u64,
    pub avg_seconds: f64,
    pub p50_seconds: f64,
    pub p95_seconds: f64,
    pub max_seconds: f64,
    /// The histogram: users per bucket, by the bucket's lower bound (whole seconds below 2 min,
    /// 10 s up to 10 min, 1 min up to an hour, then one bucket).
    pub histogram: Vec<WaitBucket>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitBucket {
    pub from_seconds: u64,
    pub users: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenFigures {
    pub issued: u64,
    pub used: u64,
    /// Issued and not used: expired once the last one issued is older than the token ttl.
    pub unused: u64,
    /// `unused` once every token issued has expired; `null` while some may still be used.
    pub expired: Option<u64>,
    /// Purchases with stateless tokens, which the queue never issued.
    pub direct_used: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Opening {
    pub at: String,
    pub prequeued: u64,
    pub seed: String,
    pub seed_commitment: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TickRow {
    pub tick: u64,
    /// The tick's start, ISO-8601 UTC.
    pub at: String,
    pub arrivals: u64,
    pub admitted: u64,
    pub forwarded: u64,
    pub answers: Answers,
}

impl SaleReport {
    /// The report of `target`'s record at `now_ms`; `tick_ms` is used when the record has none
    /// of its own, `token_ttl_ms` tells expired tokens from unused ones.
    pub fn build(target: &str, r: &TargetRecord, now_ms: u64, tick_ms: u64, token_ttl_ms: u64) -> Self {
        let tick_ms = r.tick_ms.unwrap_or(tick_ms).max(1);
        let ticks: std::collections::BTreeSet<u64> =
            r.arrivals.keys().chain(r.admissions.keys()).chain(r.purchases.keys()).copied().collect();
        let series: Vec<TickRow> = ticks
            .iter()
            .map(|&tick| {
                let answers = r.purchases.get(&tick).copied().unwrap_or_default();
                TickRow {
                    tick,
                    at: format_instant(tick * tick_ms),
                    arrivals: r.arrivals.get(&tick).copied().unwrap_or(0),
                    admitted: r.admissions.get(&tick).copied().unwrap_or(0),
                    forwarded: answers.total(),
                    answers,
                }
            })
            .collect();
        let mut answers = Answers::default();
        r.purchases.values().for_each(|a| answers.add(a));
        let unused = r.tokens_issued.saturating_sub(r.tokens_used);
        let all_expired = r.last_issue_ms.is_none_or(|t| t + token_ttl_ms <= now_ms);
        let max_wait = r.wait_max_ms.unwrap_or(0) as f64 / 1000.0;
        let opening = r.events.iter().rev().find_map(|e| match e {
            LedgerEntry::Opening { at_ms, prequeued, seed_commitment, seed } => Some(Opening {
                at: format_instant(*at_ms),
                prequeued: *prequeued,
                seed: seed.clone(),
                seed_commitment: seed_commitment.clone(),
            }),
            _ => None,
        });
        Self {
            target: target.to_owned(),
            generated_at: format_instant(now_ms),
            tick_ms,
            first_at: ticks.first().map(|t| format_instant(t * tick_ms)),
            last_at: ticks.last().map(|t| format_instant(t * tick_ms)),
            totals: Totals {
                arrivals: r.arrivals.values().sum(),
                admitted: r.admitted,
                left: r.left,
                evicted: r.evicted,
                purchases_forwarded: answers.total(),
                answers,
                refused: r.refused,
            },
            waits: WaitFigures {
                counted: r.waits.count,
                avg_seconds: r.waits.avg_seconds(),
                // Read from the buckets, so never past the longest wait measured.
                p50_seconds: r.waits.quantile_seconds(0.5).min(max_wait),
                p95_seconds: r.waits.quantile_seconds(0.95).min(max_wait),
                max_seconds: max_wait,
                histogram: r.waits.buckets.iter().map(|(b, n)| WaitBucket { from_seconds: *b, users: *n }).collect(),
            },
            tokens: TokenFigures {
                issued: r.tokens_issued,
                used: r.tokens_used,
                unused,
                expired: all_expired.then_some(unused),
                direct_used: r.direct_tokens_used,
            },
            opening,
            events: r.events.clone(),
            series,
            lanes: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_still_valid_are_not_called_expired() {
        let r = TargetRecord { tokens_issued: 3, tokens_used: 1, last_issue_ms: Some(50_000), ..Default::default() };
        let report = SaleReport::build("LIMITED_DROP:1", &r, 100_000, 2000, 60_000);
        assert_eq!((report.tokens.unused, report.tokens.expired), (2, None));
    }

    #[test]
    fn answer_classes_follow_the_status() {
        assert_eq!(AnswerClass::of_status(201), AnswerClass::Success);
        assert_eq!(AnswerClass::of_status(429), AnswerClass::ClientError);
        assert_eq!(AnswerClass::of_status(503), AnswerClass::ServerError);
    }
}
