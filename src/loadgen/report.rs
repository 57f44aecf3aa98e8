//! What a load run measured, in the shape scripts read (`--json`, camelCase field names are
//! a contract), and the checks behind the `--assert-…` flags. Pure: no IO, no printing.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Latency of one kind of request, measured from its scheduled send time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LatencySummary {
    pub count: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl LatencySummary {
    /// From a histogram of microseconds.
    pub fn from_micros(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Self {
            count: h.len(),
            p50_ms: ms(h.value_at_quantile(0.50)),
            p95_ms: ms(h.value_at_quantile(0.95)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
        }
    }
}

/// Seconds from entry to the poll that saw the user admitted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitSummary {
    pub count: u64,
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

impl WaitSummary {
    /// From a histogram of milliseconds.
    pub fn from_millis(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let s = |ms: u64| ms as f64 / 1000.0;
        Self { count: h.len(), p50: s(h.value_at_quantile(0.5)), p95: s(h.value_at_quantile(0.95)), max: s(h.max()) }
    }
}

/// The etaSeconds a user was shown at entry against the wait it really had.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtaError {
    pub count: u64,
    /// Mean of (shown − real): positive means the ETA was pessimistic.
    pub mean: f64,
    /// Mean of |shown − real|.
    pub mean_abs: f64,
    /// 95th percentile of |shown − real|.
    pub p95: f64,
}

impl EtaError {
    /// `errors_ms` holds (shown − real) in milliseconds, signed.
    pub fn from_errors_ms(errors_ms: &[i64]) -> Self {
        if errors_ms.is_empty() {
            return Self::default();
        }
        let n = errors_ms.len() as f64;
        let mut abs: Vec<u64> = errors_ms.iter().map(|e| e.unsigned_abs()).collect();
        abs.sort_unstable();
        let idx = ((abs.len() as f64 * 0.95).ceil() as usize).clamp(1, abs.len()) - 1;
        Self {
            count: errors_ms.len() as u64,
            mean: errors_ms.iter().sum::<i64>() as f64 / n / 1000.0,
            mean_abs: abs.iter().sum::<u64>() as f64 / n / 1000.0,
            p95: abs[idx] as f64 / 1000.0,
        }
    }
}

/// What the generator itself went through: when it is the limit, the latencies describe the
/// client, not the server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientFigures {
    /// CPU the loadgen process used, in cores (CPU seconds / elapsed seconds); None where
    /// the OS does not say.
    pub cpu_cores: Option<f64>,
    /// Cores this process may run on.
    pub cores_available: u64,
    /// How late its timers fired (arrivals, next polls) at p99, before any wait for a slot.
    pub timer_lag_p99_ms: f64,
    /// How late enters and polls went on the wire at p99 (timers plus the wait for a slot).
    pub send_lag_p99_ms: f64,
    /// Share of requests that found every `--concurrency` slot busy.
    pub waited_for_slot_share: f64,
    pub concurrency: u64,
}

/// Above this share of its cores the generator counts as CPU-bound.
const CPU_BOUND_SHARE: f64 = 0.85;
/// Timers this late at p99 mean the generator's threads were too busy to run them on time.
const TIMER_LAG_LIMIT_MS: f64 = 50.0;
/// Requests this late on the wire at p99 left late because of the generator.
const SEND_LAG_LIMIT_MS: f64 = 100.0;

/// In plain words, why the figures are the client's limit rather than the server's, if they
/// are: its CPU near the cores it may use, its timers late, or its requests waiting for a
/// free `--concurrency` slot.
pub fn client_limit(c: &ClientFigures) -> Option<String> {
    let share = c.cpu_cores.map(|used| used / c.cores_available.max(1) as f64);
    let cpu_bound = share.is_some_and(|s| s >= CPU_BOUND_SHARE);
    let timers_late = c.timer_lag_p99_ms >= TIMER_LAG_LIMIT_MS;
    let sends_late = c.send_lag_p99_ms >= SEND_LAG_LIMIT_MS;
    if !(cpu_bound || timers_late || sends_late) {
        return None;
    }
    let mut why = format!(
        "loadgen used {:.0} % of the machine's {} cores and its timers ran {:.0} ms late at p99",
        100.0 * share.unwrap_or(0.0),
        c.cores_available,
        c.timer_lag_p99_ms
    );
    if sends_late {
        why.push_str(&format!("; requests left {:.0} ms late at p99", c.send_lag_p99_ms));
        if c.waited_for_slot_share > 0.01 {
            why.push_str(&format!(
                ", {:.0} % of them waiting for one of the --concurrency {} slots",
                100.0 * c.waited_for_slot_share,
                c.concurrency
            ));
        }
    }
    why.push_str(": the figures are the client's limit, not the server's");
    Some(why)
}

/// Everything one run measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub url: String,
    pub target: String,
    pub arrival: String,
    /// Users the run was asked to simulate, and those whose arrival fell within the run.
    pub users: u64,
    pub users_scheduled: u64,
    pub duration_secs: f64,
    /// From the start to the last answer: longer than the duration when requests queued.
    pub elapsed_secs: f64,
    /// `--rate`: the peak the curve was asked to reach.
    pub requested_enter_rate: f64,
    /// Average rate of the schedule (equal to the requested rate for a constant curve).
    pub scheduled_enter_rate: f64,
    /// Enters actually put on the wire per second (first to last send).
    pub offered_enter_rate: f64,
    /// Enters answered (any HTTP status) per second (first send to last answer).
    pub achieved_enter_rate: f64,
    /// How late enters left against their schedule; large values mean the generator could
    /// not keep up (the latencies still count from the schedule).
    pub enter_send_lag_p99_ms: f64,
    /// Set, in plain words, when the requested rate could not be offered.
    pub rate_shortfall: Option<String>,
    /// Set, in plain words, when loadgen itself was the limit (see [`client_limit`]).
    pub client_limit: Option<String>,
    /// loadgen's own CPU and delays.
    pub client: ClientFigures,
    pub enter: LatencySummary,
    pub poll: LatencySummary,
    /// Polls sent per second over the run, and whether users followed `pollAfterSeconds`.
    pub poll_rate_per_sec: f64,
    pub follow_poll_after: bool,
    pub purchase: LatencySummary,
    /// Every request by HTTP status, plus `transportError`.
    pub status_counts: BTreeMap<String, u64>,
    /// The same by kind: `enter`, `poll`, `purchase`, `leave`.
    pub status_counts_by_kind: BTreeMap<String, BTreeMap<String, u64>>,
    pub entered: u64,
    pub queue_full: u64,
    pub direct_admitted: u64,
    /// Users who learnt they were admitted through the queue (not DIRECT_ADMITTED).
    pub admitted: u64,
    pub abandoned: u64,
    pub evicted_seen: u64,
    pub still_waiting: u64,
    pub purchase_attempts: u64,
    /// Purchase requests answered 2xx.
    pub purchases: u64,
    /// `--conversion`: share of admitted buyers who buy.
    pub conversion: f64,
    /// Admitted buyers who chose not to buy (their token expires unused).
    pub no_shows: u64,
    /// Max arrivals at the sink within one tick window (None without `--sink`).
    pub downstream_max_per_tick: Option<u64>,
    pub downstream_total: Option<u64>,
    pub downstream_rate_per_sec: Option<f64>,
    /// Purchases the sink received with a token it had received before (a token that bought
    /// twice; the gate's one-time use should keep it at 0).
    pub downstream_repeated_tokens: Option<u64>,
    /// Purchases the sink answered 503 for want of capacity (None without `--sink`).
    pub downstream_refused: Option<u64>,
    /// P95 of the served purchases' latency at the sink, ms.
    pub downstream_p95_ms: Option<u32>,
    /// With `--sink`: second by second, the batch beside what the sink served.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelinePoint>,
    pub admitted_rate_per_sec: f64,
    pub batch_size: u64,
    pub tick_ms: u64,
    pub wait_seconds: WaitSummary,
    pub eta_error_seconds: EtaError,
    /// Growth of Redis `used_memory` per waiting user, at the sample with most users waiting.
    pub redis_bytes_per_waiting_user: Option<f64>,
    /// Arrival order against admission order, over the users admitted through the queue.
    pub order_error: OrderError,
    /// With `--opening-in`: the shuffle's effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opening: Option<OpeningFigures>,
    /// What the proof of work at entry cost the simulated buyers (when vq asked for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof_of_work: Option<PowFigures>,
}

/// How far admission order strayed from arrival order, over the users admitted through the
/// queue: each user's rank by entry against their rank by the poll that saw them admitted.
/// That poll comes up to a tick (or `pollAfterSeconds`) after the admission itself, so even
/// a strict FIFO line shows displacements of about the users admitted in one tick; what a
/// design adds (a sharded target's shards each keep their own order) shows above that floor.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderError {
    pub users: u64,
    /// Spearman's rank correlation of entry and admission (1: the same order); `None` below
    /// 3 users.
    pub rank_correlation: Option<f64>,
    /// |entry rank − admission rank|: the largest and the mean, in users.
    pub max_displacement: u64,
    pub mean_displacement: f64,
}

impl OrderError {
    /// From (entered, seen admitted) pairs, in any unit of time.
    pub fn of(pairs: &[(u64, u64)]) -> Self {
        let n = pairs.len();
        let rank = |key: &dyn Fn(usize) -> (u64, usize)| {
            let mut idx: Vec<usize> = (0..n).collect();
            idx.sort_by_key(|&i| key(i));
            let mut r = vec![0u64; n];
            for (k, i) in idx.into_iter().enumerate() {
                r[i] = k as u64;
            }
            r
        };
        let (a, b) = (rank(&|i| (pairs[i].0, i)), rank(&|i| (pairs[i].1, i)));
        let d: Vec<u64> = a.iter().zip(&b).map(|(x, y)| x.abs_diff(*y)).collect();
        Self {
            users: n as u64,
            rank_correlation: super::rank_correlation(pairs),
            max_displacement: d.iter().copied().max().unwrap_or(0),
            mean_displacement: if n == 0 { 0.0 } else { d.iter().sum::<u64>() as f64 / n as f64 },
        }
    }
}

/// The proof of work the buyers solved: what one place cost a client of this machine's cores.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PowFigures {
    pub solved: u64,
    /// Hashes tried, over every solve.
    pub hashes: u64,
    /// One solve's time on one core, ms.
    pub p50_ms: f64,
    pub p95_ms: f64,
    /// Every solve's time together: the CPU one place costs, times the places.
    pub cpu_seconds: f64,
}

/// One second of a run with `--sink`: the batch the server admitted with (its stats answer)
/// beside the purchase API stand-in's capacity, what it served and refused, and its latency.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelinePoint {
    /// Seconds since the run's start.
    pub second: u64,
    pub batch: Option<u64>,
    /// `None`: the sink had no capacity (answers everything at once).
    pub capacity_per_sec: Option<f64>,
    pub served: u64,
    pub refused: u64,
    pub sink_p95_ms: Option<u32>,
}

/// What a simulated opening did to the order (`--opening-in`): Spearman's rank correlation
/// between arrival order and place, for the users who gathered in the pre-queue (≈ 0: where
/// they arrived did not matter) and for those who came after the opening (≈ 1: first come,
/// first served).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpeningFigures {
    /// Users whose enter answered PRE_QUEUE.
    pub prequeued: u64,
    /// Of them, those who saw their place after the opening (the others were admitted, or
    /// the run ended, before a poll showed it).
    pub prequeued_placed: u64,
    pub prequeued_rank_correlation: Option<f64>,
    /// Users who entered after the opening with a place in the answer.
    pub later: u64,
    pub later_rank_correlation: Option<f64>,
}

impl Report {
    pub fn count_5xx(&self) -> u64 {
        self.status_counts.iter().filter(|(k, _)| k.starts_with('5') && k.len() == 3).map(|(_, v)| v).sum()
    }
}

/// The `--assert-…` bounds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bounds {
    pub poll_p95_ms: Option<u64>,
    pub downstream_max_per_tick: Option<u64>,
    pub no_5xx: bool,
}

/// A bound the run broke: the flag that set it and what was measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedBound {
    pub flag: &'static str,
    pub detail: String,
}

/// Every bound `report` breaks, in flag order.
pub fn check_bounds(report: &Report, bounds: &Bounds) -> Vec<FailedBound> {
    let mut failed = Vec::new();
    if let Some(max) = bounds.poll_p95_ms
        && report.poll.p95_ms > max as f64
    {
        failed.push(FailedBound {
            flag: "--assert-poll-p95-ms",
            detail: format!("poll p95 {:.1} ms > {max} ms", report.poll.p95_ms),
        });
    }
    if let Some(max) = bounds.downstream_max_per_tick {
        match report.downstream_max_per_tick {
            Some(seen) if seen > max => failed.push(FailedBound {
                flag: "--assert-downstream-max-per-tick",
                detail: format!("downstream max {seen} per tick > {max}"),
            }),
            Some(_) => {}
            None => failed.push(FailedBound {
                flag: "--assert-downstream-max-per-tick",
                detail: "downstream not measured (needs --sink)".into(),
            }),
        }
    }
    if bounds.no_5xx {
        let n = report.count_5xx();
        if n > 0 {
            failed.push(FailedBound { flag: "--assert-no-5xx", detail: format!("{n} responses were 5xx") });
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_error_is_nil_for_fifo_and_counts_ranks_moved() {
        let fifo: Vec<(u64, u64)> = (0..10).map(|i| (i, 100 + i)).collect();
        let e = OrderError::of(&fifo);
        assert_eq!((e.users, e.max_displacement, e.mean_displacement), (10, 0, 0.0));
        assert!((e.rank_correlation.unwrap() - 1.0).abs() < 1e-12);
        // The first to arrive admitted last: moved 9 places, the others one each.
        let mut late: Vec<(u64, u64)> = (1..10).map(|i| (i, 100 + i)).collect();
        late.push((0, 1000));
        let e = OrderError::of(&late);
        assert_eq!(e.max_displacement, 9);
        assert!((e.mean_displacement - 1.8).abs() < 1e-12);
        assert!(e.rank_correlation.unwrap() < 1.0);
        assert_eq!(OrderError::of(&[]).rank_correlation, None);
    }

    #[test]
    fn latency_summary_reads_microseconds_as_milliseconds() {
        let mut h = Histogram::<u64>::new(3).unwrap();
        for us in 1..=1000u64 {
            h.record(us * 1000).unwrap();
        }
        let s = LatencySummary::from_micros(&h);
        assert_eq!(s.count, 1000);
        assert!((s.p50_ms - 500.0).abs() < 1.0, "{s:?}");
        assert!((s.p95_ms - 950.0).abs() < 1.0, "{s:?}");
        assert!((s.max_ms - 1000.0).abs() < 1.0, "{s:?}");
    }

    #[test]
    fn eta_error_keeps_the_sign_in_the_mean_and_not_in_the_p95() {
        let e = EtaError::from_errors_ms(&[2000, -2000, 4000, -4000]);
        assert_eq!(e.mean, 0.0);
        assert_eq!(e.mean_abs, 3.0);
        assert_eq!(e.p95, 4.0);
        assert_eq!(EtaError::from_errors_ms(&[]), EtaError::default());
    }

    #[test]
    fn each_broken_bound_is_named_by_its_flag() {
        let mut r = Report::default();
        r.poll.p95_ms = 420.0;
        r.downstream_max_per_tick = Some(120);
        r.status_counts.insert("200".into(), 10);
        r.status_counts.insert("503".into(), 2);
        r.status_counts.insert("transportError".into(), 1);
        let all = Bounds { poll_p95_ms: Some(300), downstream_max_per_tick: Some(100), no_5xx: true };
        let flags: Vec<_> = check_bounds(&r, &all).iter().map(|f| f.flag).collect();
        assert_eq!(flags, ["--assert-poll-p95-ms", "--assert-downstream-max-per-tick", "--assert-no-5xx"]);
        let loose = Bounds { poll_p95_ms: Some(500), downstream_max_per_tick: Some(120), no_5xx: false };
        assert!(check_bounds(&r, &loose).is_empty());
    }

    #[test]
    fn the_client_is_named_the_limit_when_its_cpu_timers_or_slots_are() {
        let idle = ClientFigures {
            cpu_cores: Some(0.4),
            cores_available: 2,
            timer_lag_p99_ms: 2.0,
            send_lag_p99_ms: 3.0,
            waited_for_slot_share: 0.0,
            concurrency: 256,
        };
        assert_eq!(client_limit(&idle), None);
        let busy = ClientFigures { cpu_cores: Some(1.9), ..idle.clone() };
        let msg = client_limit(&busy).expect("cpu-bound");
        assert!(msg.starts_with("loadgen used 95 % of the machine's 2 cores"), "{msg}");
        assert!(msg.ends_with("the figures are the client's limit, not the server's"), "{msg}");
        let late = ClientFigures { timer_lag_p99_ms: 80.0, ..idle.clone() };
        assert!(client_limit(&late).expect("timers late").contains("timers ran 80 ms late"));
        let slots = ClientFigures { send_lag_p99_ms: 900.0, waited_for_slot_share: 0.5, concurrency: 1, ..idle };
        let msg = client_limit(&slots).expect("slots");
        assert!(msg.contains("50 % of them waiting for one of the --concurrency 1 slots"), "{msg}");
    }

    #[test]
    fn a_downstream_bound_without_a_sink_fails_rather_than_passes() {
        let b = Bounds { downstream_max_per_tick: Some(100), ..Bounds::default() };
        assert_eq!(check_bounds(&Report::default(), &b).len(), 1);
    }
}
