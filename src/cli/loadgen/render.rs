//! How `vq loadgen` shows a run: the live line on stderr while it runs (indicatif) and the
//! final report and sweep as tables on stdout (comfy-table).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use comfy_table::{Cell, CellAlignment, Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio_util::sync::CancellationToken;

use crate::loadgen::{Live, Report, TimelinePoint};

/// The live line on stderr, redrawn twice a second; hidden when stderr is not a terminal.
pub(super) struct LiveView {
    pub(super) bar: ProgressBar,
    cancel: CancellationToken,
}

impl LiveView {
    pub(super) fn start(live: Arc<Live>, duration: Duration) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {prefix} [{elapsed}] {msg}") {
            bar.set_style(style);
        }
        let cancel = CancellationToken::new();
        let (b, stop) = (bar.clone(), cancel.clone());
        tokio::spawn(async move {
            let mut last = (Instant::now(), 0u64, 0u64);
            let mut p95 = 0.0;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
                let now = Instant::now();
                let enters = live.enters_sent.load(Ordering::Relaxed);
                let polls = live.polls_sent.load(Ordering::Relaxed);
                let secs = now.duration_since(last.0).as_secs_f64().max(1e-3);
                if let Some(p) = live.take_recent_poll_p95_ms() {
                    p95 = p;
                }
                b.set_message(format!(
                    "entered {} waiting {} admitted {} purchased {} | enter {:.0}/s poll {:.0}/s poll p95 {:.0} ms | run {} s",
                    live.entered.load(Ordering::Relaxed),
                    live.waiting.load(Ordering::Relaxed).max(0),
                    live.admitted.load(Ordering::Relaxed),
                    live.purchased.load(Ordering::Relaxed),
                    enters.saturating_sub(last.1) as f64 / secs,
                    polls.saturating_sub(last.2) as f64 / secs,
                    p95,
                    duration.as_secs_f64(),
                ));
                b.tick();
                last = (now, enters, polls);
            }
        });
        Self { bar, cancel }
    }

    pub(super) fn finish(self) {
        self.cancel.cancel();
        self.bar.finish_and_clear();
    }
}

fn table() -> Table {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED);
    t
}

fn ms(v: f64) -> String {
    format!("{v:.1}")
}

pub(super) fn print_report(r: &Report, with_sink: bool) {
    let mut t = table();
    t.set_header(vec!["", "value"]);
    let mut row = |k: &str, v: String| {
        t.add_row(vec![Cell::new(k), Cell::new(v).set_alignment(CellAlignment::Right)]);
    };
    row("target", format!("{} at {}", r.target, r.url));
    row("arrival", format!("{} up to {:.0} enters/s, {:.0} s run", r.arrival, r.requested_enter_rate, r.duration_secs));
    row("elapsed s (start to last answer)", format!("{:.1}", r.elapsed_secs));
    row("users scheduled / asked", format!("{} / {}", r.users_scheduled, r.users));
    row(
        "polls/s (clients)",
        format!(
            "{:.0} ({})",
            r.poll_rate_per_sec,
            if r.follow_poll_after { "follow pollAfterSeconds" } else { "fixed interval" }
        ),
    );
    row("enters/s scheduled", format!("{:.0}", r.scheduled_enter_rate));
    row("enters/s offered (sent)", format!("{:.0}", r.offered_enter_rate));
    row("enters/s achieved (answered)", format!("{:.0}", r.achieved_enter_rate));
    row("enter send lag p99 ms", ms(r.enter_send_lag_p99_ms));
    row(
        "loadgen CPU cores used / available",
        format!(
            "{} / {}",
            r.client.cpu_cores.map_or_else(|| "-".to_owned(), |c| format!("{c:.2}")),
            r.client.cores_available
        ),
    );
    row("loadgen timer lag p99 ms", ms(r.client.timer_lag_p99_ms));
    row("batch size / tick ms", format!("{} / {}", r.batch_size, r.tick_ms));
    row("entered / queue full", format!("{} / {}", r.entered, r.queue_full));
    row("admitted / direct", format!("{} / {}", r.admitted, r.direct_admitted));
    row("admitted per s", format!("{:.1}", r.admitted_rate_per_sec));
    if let Some(p) = &r.proof_of_work {
        row(
            "proof of work solved / p50 / p95 ms / CPU s",
            format!("{} / {:.1} / {:.1} / {:.1} ({} hashes)", p.solved, p.p50_ms, p.p95_ms, p.cpu_seconds, p.hashes),
        );
    }
    row("abandoned / evicted / still waiting", format!("{} / {} / {}", r.abandoned, r.evicted_seen, r.still_waiting));
    row("purchases 2xx / attempts", format!("{} / {}", r.purchases, r.purchase_attempts));
    if with_sink {
        row(
            "downstream max per tick / total / per s",
            format!(
                "{} / {} / {:.1}",
                r.downstream_max_per_tick.unwrap_or(0),
                r.downstream_total.unwrap_or(0),
                r.downstream_rate_per_sec.unwrap_or(0.0)
            ),
        );
        row("downstream tokens received twice", r.downstream_repeated_tokens.unwrap_or(0).to_string());
        row(
            "downstream refused (503) / served p95 ms",
            format!(
                "{} / {}",
                r.downstream_refused.unwrap_or(0),
                r.downstream_p95_ms.map_or_else(|| "-".to_owned(), |p| p.to_string())
            ),
        );
    }
    if r.conversion < 1.0 {
        row("conversion / no-shows", format!("{} / {}", r.conversion, r.no_shows));
    }
    row(
        "wait s p50 / p95 / max",
        format!("{:.1} / {:.1} / {:.1}", r.wait_seconds.p50, r.wait_seconds.p95, r.wait_seconds.max),
    );
    row(
        "ETA error s mean / |mean| / p95",
        format!(
            "{:+.1} / {:.1} / {:.1}",
            r.eta_error_seconds.mean, r.eta_error_seconds.mean_abs, r.eta_error_seconds.p95
        ),
    );
    row(
        "redis bytes per waiting user",
        r.redis_bytes_per_waiting_user.map_or_else(|| "not measured".to_owned(), |b| format!("{b:.0}")),
    );
    let o = &r.order_error;
    row(
        "order error: arrival vs admission (Spearman / largest / mean displacement)",
        format!(
            "{} / {} / {:.1} ({} users)",
            o.rank_correlation.map_or_else(|| "too few".to_owned(), |x| format!("{x:+.4}")),
            o.max_displacement,
            o.mean_displacement,
            o.users
        ),
    );
    row("status counts", r.status_counts.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", "));
    if let Some(o) = &r.opening {
        let rho = |v: Option<f64>| v.map_or_else(|| "too few".to_owned(), |x| format!("{x:+.3}"));
        row("pre-queued / placed by the opening", format!("{} / {}", o.prequeued, o.prequeued_placed));
        row("arrival vs place, pre-queued (Spearman)", rho(o.prequeued_rank_correlation));
        row(
            "arrival vs place, after the opening (Spearman)",
            format!("{} ({} users)", rho(o.later_rank_correlation), o.later),
        );
    }
    println!("{t}");

    let mut lat = table();
    lat.set_header(vec!["latency ms (from schedule)", "count", "p50", "p95", "p99", "max"]);
    for (name, l) in [("enter", &r.enter), ("poll", &r.poll), ("purchase", &r.purchase)] {
        lat.add_row(vec![name.to_owned(), l.count.to_string(), ms(l.p50_ms), ms(l.p95_ms), ms(l.p99_ms), ms(l.max_ms)]);
    }
    println!("{lat}");
    if !r.timeline.is_empty() {
        println!("{}", timeline_table(&r.timeline));
    }
    if let Some(msg) = &r.rate_shortfall {
        println!("WARNING: {msg}");
    }
    if let Some(msg) = &r.client_limit {
        println!("WARNING: {msg}");
    }
    if let Some(n) = r.status_counts.get("transportError") {
        println!("WARNING: {n} requests got no HTTP answer (connection refused, reset or timed out after 10 s)");
    }
    if r.users_scheduled < r.users {
        println!(
            "note: only {} of {} users arrive within {:.0} s at this curve; raise --duration or --rate",
            r.users_scheduled, r.users, r.duration_secs
        );
    }
}

/// The batch over time beside the sink: one row per second, or per few seconds in a long run
/// (at most about 30 rows; rates are per second over the row, the batch and capacity the
/// last of the row, the latency the highest second's P95).
fn timeline_table(points: &[TimelinePoint]) -> Table {
    let per_row = points.len().div_ceil(30).max(1);
    let mut t = table();
    t.set_header(vec!["s", "batch", "sink capacity/s", "served/s", "refused (503)/s", "sink p95 ms"]);
    for rows in points.chunks(per_row) {
        let last = &rows[rows.len() - 1];
        let n = rows.len() as f64;
        let served: u64 = rows.iter().map(|p| p.served).sum();
        let refused: u64 = rows.iter().map(|p| p.refused).sum();
        let p95 = rows.iter().filter_map(|p| p.sink_p95_ms).max();
        t.add_row(vec![
            rows[0].second.to_string(),
            last.batch.map_or_else(|| "-".to_owned(), |b| b.to_string()),
            last.capacity_per_sec.map_or_else(|| "unlimited".to_owned(), |c| format!("{c}")),
            format!("{:.1}", served as f64 / n),
            format!("{:.1}", refused as f64 / n),
            p95.map_or_else(|| "-".to_owned(), |p| p.to_string()),
        ]);
    }
    t
}

pub(super) fn print_sweep(reports: &[Report]) {
    let mut t = table();
    t.set_header(vec![
        "batch",
        "admitted/s",
        "downstream/s",
        "downstream max/tick",
        "wait p50 s",
        "wait p95 s",
        "ETA err mean s",
        "ETA err p95 s",
        "poll p95 ms",
        "5xx",
    ]);
    for r in reports {
        t.add_row(vec![
            r.batch_size.to_string(),
            format!("{:.1}", r.admitted_rate_per_sec),
            r.downstream_rate_per_sec.map_or_else(|| "-".into(), |d| format!("{d:.1}")),
            r.downstream_max_per_tick.map_or_else(|| "-".into(), |d| d.to_string()),
            format!("{:.1}", r.wait_seconds.p50),
            format!("{:.1}", r.wait_seconds.p95),
            format!("{:+.1}", r.eta_error_seconds.mean),
            format!("{:.1}", r.eta_error_seconds.p95),
            ms(r.poll.p95_ms),
            r.count_5xx().to_string(),
        ]);
    }
    println!("{t}");
    for r in reports {
        for msg in [&r.rate_shortfall, &r.client_limit].into_iter().flatten() {
            println!("WARNING (batch {}): {msg}", r.batch_size);
        }
    }
}
