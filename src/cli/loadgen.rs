//! `vq loadgen`: drives [`crate::loadgen`] and renders it — a live view on stderr while it
//! runs (indicatif), the final report as a table on stdout (comfy-table), `--json FILE`, and
//! the `--assert-…` bounds as the exit code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

mod render;

use self::render::{LiveView, print_report, print_sweep};
use super::{ConfigArg, runtime};
use crate::config::{Overrides, Settings, StoreKind};
use crate::domain::QueueTarget;
use crate::loadgen::{self, ArrivalCurve, Arrivals, Bounds, Live, Options, ServerFacts, Sink, SinkModel, check_bounds};
use crate::store::RedisStore;
use crate::store::prelude::*;

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
    /// With --purchase: each buyer sends the purchase N times, one after the other (a token
    /// must buy once however often it is sent; the sink counts the repeats it received)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10))]
    purchase_times: u32,
    /// Start a counting upstream on ADDR (point gate.upstream at it)
    #[arg(long, value_name = "ADDR")]
    sink: Option<SocketAddr>,
    /// The sink as a purchase API of limited capacity: purchases per second, changing at
    /// offsets from the start, e.g. 50,20@30s,50@60s. One purchase at a time, first come first
    /// served (latency grows with the backlog); a purchase that would wait over
    /// --sink-max-wait-ms is answered 503 with Retry-After: 1. Without it the sink answers at once
    #[arg(long, value_name = "N[,N@SECS]…", requires = "sink")]
    sink_capacity: Option<crate::loadgen::CapacitySchedule>,
    /// With --sink-capacity: the longest wait for a turn before the sink answers 503
    #[arg(long, value_name = "MS", default_value_t = 1000, requires = "sink_capacity")]
    sink_max_wait_ms: u64,
    /// With --purchase: share of admitted buyers (0–1) who buy; the others never use their
    /// token (no-shows)
    #[arg(long, value_name = "SHARE", default_value_t = 1.0)]
    conversion: f64,
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
        if !(0.0..=1.0).contains(&self.conversion) {
            anyhow::bail!("--conversion must be between 0 and 1");
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

    fn options(&self, settings: &Settings, server: Option<ServerFacts>) -> anyhow::Result<Options> {
        let routes = crate::gate::GateRoutes::compile(&settings.gate.routes)?;
        let purchase_path = match routes.path_of(self.target) {
            Some(p) => p,
            None if self.purchase => anyhow::bail!(
                "--purchase: gate.routes has no route for {} (the purchase a buyer of {} sends)",
                self.target.kind.slug(),
                self.target
            ),
            None => String::new(),
        };
        Ok(Options {
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
            purchase_path,
            purchase_times: self.purchase_times,
            conversion: self.conversion,
            concurrency: self.concurrency,
            leave_at_end: false,
            batch_size: server.map_or(settings.queue.batch_size, |f| f.batch_size),
            tick_ms: server.map_or(settings.queue.tick_ms, |f| f.tick_ms),
            seed: self.seed,
            follow_poll_after: self.follow_poll_after,
            opening_in: self.opening_in.map(Duration::from_secs_f64),
        })
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
    let opts = args.options(&settings, server)?;
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
                let model = SinkModel {
                    capacity: args.sink_capacity.clone(),
                    max_wait: Duration::from_millis(args.sink_max_wait_ms),
                };
                Some(Sink::start(addr, opts.tick_ms, model).await.with_context(|| format!("cannot bind the sink on {addr}"))?)
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
        if let Some(cause) = purchase_failure_cause(report, args.sink) {
            eprintln!("{cause}");
        }
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

/// Why purchases failed, when the gate answered 502 `UPSTREAM_UNAVAILABLE`: vq has no
/// purchase API to forward them to (`gate.upstream` unset: `scripts/dev.sh` sets one) or
/// nothing answers there. The run's figures alone would show only a count of 5xx.
fn purchase_failure_cause(report: &loadgen::Report, sink: Option<SocketAddr>) -> Option<String> {
    let purchases = report.status_counts_by_kind.get("purchase")?;
    let bad = purchases.get("502").copied().filter(|n| *n > 0)?;
    let all: u64 = purchases.values().sum();
    let point = match sink {
        Some(addr) => format!("point it at this run's sink (VQ_GATE__UPSTREAM=http://{addr})"),
        None => "point it at the purchase API, or at a counting one with --sink ADDR".to_owned(),
    };
    Some(format!(
        "{bad} of {all} purchases got 502 UPSTREAM_UNAVAILABLE: the vq at {} cannot forward purchases: it has no \
         gate.upstream (VQ_GATE__UPSTREAM) or nothing answers there; {point}",
        report.url
    ))
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
