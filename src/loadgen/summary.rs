//! A run's [`Report`], made of what its buyers recorded ([`Recorder`], [`Live`](super::Live)) and what the
//! sink saw.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::buyer::Ctx;
use super::opening::opening_figures;
use super::recorder::{KINDS, Kind, Recorder, ShardedHistogram};
use super::report::{
    ClientFigures, EtaError, LatencySummary, OrderError, PowFigures, Report, TimelinePoint, WaitSummary, client_limit,
};
use super::sink::{SinkFigures, SinkSecond};

/// The run second by second: the sink's figures beside the batch last seen at or before
/// each second.
pub(super) fn timeline(seconds: &[SinkSecond], batches: &BTreeMap<u64, u64>, wall_start_ms: u64) -> Vec<TimelinePoint> {
    let first = wall_start_ms / 1000;
    seconds
        .iter()
        .map(|s| TimelinePoint {
            second: s.second.saturating_sub(first),
            batch: batches.range(..=s.second).next_back().map(|(_, b)| *b),
            capacity_per_sec: s.capacity,
            served: s.served,
            refused: s.refused,
            sink_p95_ms: s.p95_ms,
        })
        .collect()
}

/// The report of a run, from what its buyers recorded.
pub(super) fn build_report(
    ctx: &Ctx,
    scheduled_users: u64,
    batch_size: u64,
    redis_bytes: Option<f64>,
    sink: Option<SinkFigures>,
    elapsed: Duration,
    cpu_secs: Option<f64>,
) -> Report {
    let o = &ctx.opts;
    let r = &ctx.rec;
    let latency = |k: Kind| LatencySummary::from_micros(&r.kinds[k as usize].latency_us.merged(false));
    let mut status_counts: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_kind = BTreeMap::new();
    for (k, name) in KINDS {
        let counts = r.kinds[k as usize].counts();
        for (code, n) in &counts {
            *status_counts.entry(code.clone()).or_default() += n;
        }
        if !counts.is_empty() {
            by_kind.insert(name.to_owned(), counts);
        }
    }
    let enters_sent = ctx.live.enters_sent.load(Ordering::Relaxed);
    let first = r.first_enter_sent.load(Ordering::Relaxed);
    let last = r.last_enter_sent.load(Ordering::Relaxed);
    let offered =
        if enters_sent > 1 && last > first { (enters_sent - 1) as f64 / ((last - first) as f64 / 1e6) } else { 0.0 };
    let answered = r.enters_answered.load(Ordering::Relaxed);
    let last_answer = r.last_enter_answered.load(Ordering::Relaxed);
    let achieved =
        if answered > 1 && last_answer > first { answered as f64 / ((last_answer - first) as f64 / 1e6) } else { 0.0 };
    let scheduled_rate = o.arrivals.scheduled_rate(scheduled_users);
    let p99_ms = |h: &ShardedHistogram| h.merged(false).value_at_quantile(0.99) as f64 / 1000.0;
    let lag_p99_ms = p99_ms(&r.enter_lag_us);
    let rate_shortfall = (scheduled_users > 1 && (offered < 0.95 * scheduled_rate || lag_p99_ms > 100.0)).then(|| {
        format!(
            "could not offer the requested rate: scheduled {scheduled_rate:.0} enters/s, sent {offered:.0}/s, \
             p99 send lag {lag_p99_ms:.0} ms (latencies still count from the schedule)"
        )
    });
    let admitted = ctx.live.admitted.load(Ordering::Relaxed);
    let secs = o.duration.as_secs_f64();
    // Requests in flight at the deadline finish after it: rates use the real length.
    let elapsed_secs = elapsed.as_secs_f64().max(secs);
    let eta = r.eta_errors_ms.lock().map(|e| EtaError::from_errors_ms(&e)).unwrap_or_default();
    let requests: u64 = r.kinds.iter().map(|k| k.counts().values().sum::<u64>()).sum();
    let client = ClientFigures {
        cpu_cores: cpu_secs.map(|c| c / elapsed_secs.max(1e-3)),
        cores_available: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        timer_lag_p99_ms: p99_ms(&r.timer_lag_us),
        send_lag_p99_ms: lag_p99_ms.max(p99_ms(&r.poll_lag_us)),
        waited_for_slot_share: if requests > 0 {
            r.waited_for_slot.load(Ordering::Relaxed) as f64 / requests as f64
        } else {
            0.0
        },
        concurrency: o.concurrency as u64,
    };
    Report {
        url: o.url.clone(),
        target: o.target.to_string(),
        arrival: format!("{:?}", o.arrivals.curve).to_lowercase(),
        users: o.users,
        users_scheduled: scheduled_users,
        duration_secs: secs,
        requested_enter_rate: o.arrivals.rate,
        scheduled_enter_rate: scheduled_rate,
        offered_enter_rate: offered,
        achieved_enter_rate: achieved,
        enter_send_lag_p99_ms: lag_p99_ms,
        rate_shortfall,
        client_limit: client_limit(&client),
        client,
        enter: latency(Kind::Enter),
        poll: latency(Kind::Poll),
        poll_rate_per_sec: ctx.live.polls_sent.load(Ordering::Relaxed) as f64 / elapsed_secs.max(1e-3),
        follow_poll_after: o.follow_poll_after,
        purchase: latency(Kind::Purchase),
        status_counts,
        status_counts_by_kind: by_kind,
        entered: ctx.live.entered.load(Ordering::Relaxed),
        queue_full: r.queue_full.load(Ordering::Relaxed),
        direct_admitted: r.direct_admitted.load(Ordering::Relaxed),
        admitted,
        abandoned: r.abandoned.load(Ordering::Relaxed),
        evicted_seen: r.evicted_seen.load(Ordering::Relaxed),
        still_waiting: r.still_waiting.load(Ordering::Relaxed),
        purchase_attempts: r.purchase_attempts.load(Ordering::Relaxed),
        purchases: ctx.live.purchased.load(Ordering::Relaxed),
        conversion: o.conversion,
        no_shows: r.no_shows.load(Ordering::Relaxed),
        downstream_max_per_tick: sink.map(|s| s.max_per_tick),
        downstream_total: sink.map(|s| s.total),
        downstream_rate_per_sec: sink.map(|s| s.rate_per_sec),
        downstream_repeated_tokens: sink.map(|s| s.repeated_tokens),
        downstream_refused: sink.map(|s| s.refused),
        downstream_p95_ms: sink.and_then(|s| s.p95_ms),
        timeline: Vec::new(),
        admitted_rate_per_sec: if elapsed_secs > 0.0 { admitted as f64 / elapsed_secs } else { 0.0 },
        elapsed_secs,
        batch_size,
        tick_ms: o.tick_ms,
        wait_seconds: r.waits_ms.lock().map(|h| WaitSummary::from_millis(&h)).unwrap_or_default(),
        eta_error_seconds: eta,
        redis_bytes_per_waiting_user: redis_bytes,
        opening: o.opening_in.map(|_| opening_figures(r)),
        order_error: OrderError::of(&r.admissions.lock().map(|v| v.clone()).unwrap_or_default()),
        proof_of_work: pow_figures(r),
    }
}

fn pow_figures(r: &Recorder) -> Option<PowFigures> {
    let solved = r.pow_solved.load(Ordering::Relaxed);
    let h = r.pow_us.lock().ok()?;
    (solved > 0).then(|| PowFigures {
        solved,
        hashes: r.pow_hashes.load(Ordering::Relaxed),
        p50_ms: h.value_at_quantile(0.5) as f64 / 1000.0,
        p95_ms: h.value_at_quantile(0.95) as f64 / 1000.0,
        cpu_seconds: h.mean() * h.len() as f64 / 1e6,
    })
}
