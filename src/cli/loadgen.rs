//! `vq loadgen`: drives [`crate::loadgen`] and renders it — a live view on stderr while it
//! runs (indicatif), the final report as a table on stdout (comfy-table), `--json FILE`, and
//! the `--assert-…` bounds as the exit code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use comfy_table::{Cell, CellAlignment, Table, presets::UTF8_FULL_CONDENSED};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio_util::sync::CancellationToken;

use super::{ConfigArg, runtime};
use crate::config::{Overrides, Settings, StoreKind};
use crate::domain::QueueTarget;
use crate::loadgen::{self, ArrivalCurve, Arrivals, Bounds, Live, Options, Report, ServerFacts, Sink, check_bounds};
use crate::store::{QueueStore, RedisStore};

/// Exit code when the run completed but broke an `--assert-…` bound.
const EXIT_BOUND_BROKEN: u8 = 3;

#[derive(clap::Args)]
#[command(after_help = "Examples:
  vq loadgen --url http://127.0.0.1:8080 --target limited-drop:42 --users 100000 --rate 20000 --duration 10
  vq loadgen --url http://127.0.0.1:8080 --target limited-drop:42 --purchase --sink 127.0.0.1:9900 \\
      --assert-poll-p95-ms 300 --assert-downstream-max-per-tick 100 --assert-no-5xx --json report.json
  VQ_REDIS__URL=redis://127.0.0.1:6379 vq loadgen --url http://127.0.0.1:8080 --target limited-drop:42 \\
      --users 5000 --rate 2000 --duration 20 --sweep-batch 50,100,200

Latencies count from each request's scheduled send time. The batch size and tick come from the
server's stats answer; a URL without an HTTP answer is refused before the run. Redis (redis.url / VQ_REDIS__URL) is
used when reachable: batch size in force, bytes per waiting user, and --sweep-batch.
Exit codes: 0 ok, 1 error, 3 an --assert-… bound was broken or requests got no HTTP answer
(named on stderr).")]
pub struct Args {
    /// Base URL of vq serve or the load balancer in front of it
    #[arg(long)]
    url: String,
    /// The queue to load, e.g. limited-drop:42
    #[arg(long, value_name = "T")]
    target: QueueTarget,
    /// Simulated users (each enters once, then polls)
    #[arg(long, default_value_t = 10_000)]
    users: u64,
    /// Peak enters per second
    #[arg(long, value_name = "PER_SEC", default_value_t = 20_000.0)]
    rate: f64,
    /// Shape of the inflow
    #[arg(long, value_enum, default_value_t = ArrivalCurve::Step)]
    arrival: ArrivalCurve,
    /// Seconds of trickle (step) or rise (ramp) before the peak
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    warmup: f64,
    /// Length of the run in seconds (arrivals and polls stop at its end)
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    duration: f64,
    /// Share of users (0–1) that stop polling after a few polls
    #[arg(long, default_value_t = 0.0)]
    abandon: f64,
    /// Admitted users call the gated purchase route with their token
    #[arg(long)]
    purchase: bool,
    /// Start a counting upstream on ADDR (point gate.upstream at it)
    #[arg(long, value_name = "ADDR")]
    sink: Option<SocketAddr>,
    /// Write the report as JSON
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Requests in flight at most
    #[arg(long, default_value_t = 256)]
    concurrency: usize,
    /// First user id (users are FIRST .. FIRST+users)
    #[arg(long, default_value_t = 1)]
    first_user: u64,
    /// Polls are spaced uniformly between these two bounds
    #[arg(long, default_value_t = 2000)]
    poll_min_ms: u64,
    #[arg(long, default_value_t = 3000)]
    poll_max_ms: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Poll after the server's pollAfterSeconds (as the waiting page does) instead of every
    /// --poll-min-ms..--poll-max-ms
    #[arg(long)]
    follow_poll_after: bool,
    /// Simulate a sale's opening SECS after the start: the target's sale is scheduled through
    /// Redis with its pre-queue open from the start; the report shows how the pre-queued
    /// users' places relate to their arrival order (the fair opening's shuffle)
    #[arg(long, value_name = "SECS", conflicts_with = "sweep_batch")]
    opening_in: Option<f64>,
    /// One short round per batch size, set at runtime on the target through Redis
    #[arg(long, value_name = "N,N,…", value_delimiter = ',')]
    sweep_batch: Vec<u64>,
    /// Fail (exit 3) when the poll p95 is above N ms
    #[arg(long, value_name = "N")]
    assert_poll_p95_ms: Option<u64>,
    /// Fail (exit 3) when more than N requests reach the sink within one tick (needs --sink)
    #[arg(long, value_name = "N")]
    assert_downstream_max_per_tick: Option<u64>,
    /// Fail (exit 3) on any 5xx answer
    #[arg(long)]
    assert_no_5xx: bool,
    /// No live view
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    config: ConfigArg,
}

impl Args {
    fn check(&self) -> anyhow::Result<()> {
        check_url(&self.url)?;
        if self.users == 0 {
            anyhow::bail!("--users must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.abandon) {
            anyhow::bail!("--abandon must be between 0 and 1");
        }
        if !(self.rate > 0.0 && self.rate.is_finite() && self.duration > 0.0 && self.duration.is_finite()) {
            anyhow::bail!("--rate and --duration must be positive");
        }
        if !(self.warmup >= 0.0 && self.warmup.is_finite()) {
            anyhow::bail!("--warmup must be zero or positive");
        }
        if self.poll_min_ms > self.poll_max_ms || self.poll_max_ms == 0 {
            anyhow::bail!("--poll-min-ms must not exceed --poll-max-ms");
        }
        if self.assert_downstream_max_per_tick.is_some() && self.sink.is_none() {
            anyhow::bail!("--assert-downstream-max-per-tick needs --sink: the downstream is measured there");
        }
        if self.sweep_batch.contains(&0) {
            anyhow::bail!("--sweep-batch sizes must be at least 1");
        }
        if self.concurrency == 0 {
            anyhow::bail!("--concurrency must be at least 1");
        }
        if let Some(s) = self.opening_in
            && !(s > 0.0 && s.is_finite() && s < self.duration)
        {
            anyhow::bail!("--opening-in must be positive and shorter than --duration ({} s)", self.duration);
        }
        Ok(())
    }

    fn options(&self, settings: &Settings, server: Option<ServerFacts>) -> Options {
        Options {
            url: self.url.trim_end_matches('/').to_owned(),
            target: self.target,
            users: self.users,
            first_user: self.first_user,
            arrivals: Arrivals { curve: self.arrival, rate: self.rate, warmup: Duration::from_secs_f64(self.warmup) },
            duration: Duration::from_secs_f64(self.duration),
            poll_min: Duration::from_millis(self.poll_min_ms),
            poll_max: Duration::from_millis(self.poll_max_ms),
            abandon: self.abandon,
            purchase: self.purchase,
            concurrency: self.concurrency,
            leave_at_end: false,
            batch_size: server.map_or(settings.queue.batch_size, |f| f.batch_size),
            tick_ms: server.map_or(settings.queue.tick_ms, |f| f.tick_ms),
            seed: self.seed,
            follow_poll_after: self.follow_poll_after,
            opening_in: self.opening_in.map(Duration::from_secs_f64),
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    args.check()?;
    let settings = args.config.load(&Overrides::default())?;
    let rt = runtime()?;
    let server = rt.block_on(loadgen::probe(&args.url, args.target)).map_err(|e| anyhow::anyhow!("{e}"))?;
    if server.is_none() {
        eprintln!(
            "note: {} did not give its batch size and tick (stats unavailable): using the local config ({} per {} ms)",
            args.url, settings.queue.batch_size, settings.queue.tick_ms
        );
    }
    let opts = args.options(&settings, server);
    let bounds = Bounds {
        poll_p95_ms: args.assert_poll_p95_ms,
        downstream_max_per_tick: args.assert_downstream_max_per_tick,
        no_5xx: args.assert_no_5xx,
    };
    let reports = rt.block_on(async {
        let redis = reachable_redis(&settings).await;
        if args.opening_in.is_some() && redis.is_none() {
            anyhow::bail!(
                "--opening-in schedules the target's sale in Redis, but {} does not answer (set VQ_REDIS__URL or --config)",
                settings.redis.url
            );
        }
        if !args.sweep_batch.is_empty() && redis.is_none() {
            anyhow::bail!(
                "--sweep-batch sets the batch size in Redis, but {} does not answer (set VQ_REDIS__URL or --config)",
                settings.redis.url
            );
        }
        let sink = match args.sink {
            Some(addr) => {
                Some(Sink::start(addr, opts.tick_ms).await.with_context(|| format!("cannot bind the sink on {addr}"))?)
            }
            None => None,
        };
        let live = Arc::new(Live::default());
        let view = (!args.quiet).then(|| LiveView::start(live.clone(), opts.duration));
        let reports = match redis {
            Some(store) if !args.sweep_batch.is_empty() => {
                let progress = view.as_ref().map(|v| v.bar.clone());
                loadgen::sweep(opts, &args.sweep_batch, live, store, sink.as_ref(), |size| {
                    if let Some(p) = &progress {
                        p.set_prefix(format!("batch {size}"));
                    }
                })
                .await
                .map_err(|e| anyhow::anyhow!("cannot set the batch size in {}: {e}", settings.redis.url))?
            }
            redis => vec![loadgen::run(opts, live, redis, sink.as_ref()).await],
        };
        if let Some(v) = view {
            v.finish();
        }
        if let Some(s) = &sink {
            s.stop();
        }
        anyhow::Ok(reports)
    })?;

    if args.sweep_batch.is_empty() {
        print_report(&reports[0], args.sink.is_some());
    } else {
        print_sweep(&reports);
    }
    if let Some(path) = &args.json {
        let json = if args.sweep_batch.is_empty() {
            serde_json::to_string_pretty(&reports[0])?
        } else {
            serde_json::to_string_pretty(&serde_json::json!({ "rounds": reports }))?
        };
        std::fs::write(path, json + "\n").with_context(|| format!("cannot write {}", path.display()))?;
    }
    let mut broken = false;
    for report in &reports {
        if let Some(n) = report.status_counts.get("transportError") {
            broken = true;
            eprintln!("run failed: {n} requests got no HTTP answer from {}", report.url);
        }
        for f in check_bounds(report, &bounds) {
            broken = true;
            eprintln!("assertion failed: {} ({}, batch size {})", f.flag, f.detail, report.batch_size);
        }
    }
    Ok(if broken { ExitCode::from(EXIT_BOUND_BROKEN) } else { ExitCode::SUCCESS })
}

/// The base URL of a plain-HTTP server: loadgen speaks HTTP/1.1 without TLS, as vq serves.
fn check_url(url: &str) -> anyhow::Result<()> {
    let usage = || format!("--url must be a base URL such as http://127.0.0.1:8080, got `{url}`");
    let uri: hyper::Uri = url.parse().map_err(|_| anyhow::anyhow!(usage()))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => anyhow::bail!(
            "--url {url}: loadgen speaks plain HTTP (as vq serves); load the vq instances or the load balancer's http:// address"
        ),
        _ => anyhow::bail!(usage()),
    }
    if uri.host().is_none_or(str::is_empty) || uri.query().is_some() || !matches!(uri.path(), "" | "/") {
        anyhow::bail!(usage());
    }
    Ok(())
}

/// The Redis store if the configured one answers within a second; loadgen works without it.
async fn reachable_redis(settings: &Settings) -> Option<RedisStore> {
    if settings.store != StoreKind::Redis {
        return None;
    }
    let store = RedisStore::connect(&settings.redis.url, settings.limits(), Duration::from_secs(1)).ok()?;
    store.ping().await.ok().map(|()| store)
}

/// The live line on stderr, redrawn twice a second; hidden when stderr is not a terminal.
struct LiveView {
    bar: ProgressBar,
    cancel: CancellationToken,
}

impl LiveView {
    fn start(live: Arc<Live>, duration: Duration) -> Self {
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

    fn finish(self) {
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

fn print_report(r: &Report, with_sink: bool) {
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

fn print_sweep(reports: &[Report]) {
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
