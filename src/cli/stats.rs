//! `vq stats [--target T] [--watch] [--json]`: the operator's dashboard, read straight from
//! Redis (no running `vq serve` needed).
//!
//! The figures of each target come from [`read_target_stats`], the function behind the stats
//! endpoint, so `vq stats --json` and `GET …/stats` cannot drift. Rows over 90 % of capacity
//! or under 50 % of the target admission rate are flagged: a marker word always, colour too
//! on a terminal.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;

mod render;

use self::render::{columns, render_within};
use super::fleet::{DriftRow, drift_rows};
use super::{ConfigArg, runtime};
use crate::app::open_store;
use crate::config::Settings;
use crate::domain::{FlagState, LedgerEntry, QueueTarget, SaleState, admission_rate_over, served_by};
use crate::service::{QueueStats, now_epoch_ms, read_target_stats};
use crate::store::prelude::*;
use crate::store::{AnyStore, TargetSnapshot};

/// Share of capacity above which a row is flagged.
const CAPACITY_ALERT: f64 = 0.9;
/// Share of the target admission rate below which a row is flagged.
const RATE_ALERT: f64 = 0.5;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  vq stats\n  vq stats --target limited-drop:42 --watch     # redraws every tick until Ctrl-C\n  vq stats --json | jq '.targets[].stats.waitingCount'"
)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArg,
    /// Only this target, e.g. limited-drop:42 (default: every active target)
    #[arg(long, value_name = "T")]
    target: Option<QueueTarget>,
    /// Redraw in place every tick until Ctrl-C
    #[arg(long)]
    watch: bool,
    /// Print JSON (the stats endpoint's figures per target, plus flag, lock and Redis health)
    #[arg(long)]
    json: bool,
    /// Every column, however wide (by default the table fits the terminal: $COLUMNS, the
    /// terminal's width, or 100 columns without a terminal; evicted users and the lock holder
    /// show only when it is wide enough)
    #[arg(long)]
    wide: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub redis: RedisHealth,
    /// Global flag, e.g. `on 10%` or `off`.
    pub flag: String,
    pub flag_version: u64,
    pub tick_ms: u64,
    /// The serving instances (their reports, `vq fleet`).
    pub instances: Vec<String>,
    /// The settings on which they disagree (empty: no drift).
    pub drift: Vec<DriftRow>,
    pub targets: Vec<TargetRow>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RedisHealth {
    /// The Redis URL (one server), credentials replaced by `***`; absent in cluster mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The cluster's seed nodes (Redis Cluster mode), credentials replaced by `***`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_nodes: Option<Vec<String>>,
    /// What the header shows: the URL, or `cluster` and the nodes.
    pub location: String,
    pub ok: bool,
    pub latency_ms: f64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetRow {
    pub target: String,
    /// Exactly what `GET /virtual-queues/{type}/{id}/stats` answers.
    pub stats: QueueStats,
    /// The flag in force for this target (global, canary or the target's override).
    pub flag: String,
    pub lock_holder: Option<String>,
    pub capacity_percent: f64,
    /// `OVER_CAPACITY_90` and/or `RATE_UNDER_50`.
    pub alerts: Vec<&'static str>,
    /// With an adaptive outflow: the last changes of the batch, newest first (the admission
    /// ledger's `batch` rows).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub batch_changes: Vec<LedgerEntry>,
    /// Where the target's declaration comes from: `runtime`, `configuration of vq-a, …`,
    /// `this shell's configuration`, or `users waiting` when nothing declares it any more.
    pub sources: Vec<String>,
    /// With `--watch`: the change of waiting and admitted users since the last refresh.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trend: Option<Trend>,
}

/// The change since the last refresh of `--watch`.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trend {
    pub waiting: i64,
    pub admitted: i64,
    pub over_ms: u64,
}

/// Batch changes shown per target.
const BATCH_CHANGES_SHOWN: usize = 3;

/// A queue whose longest-waiting user entered fewer than this many ticks ago has not had
/// the ticks to show a rate: no `RATE_UNDER_50` yet.
const RATE_ALERT_MIN_TICKS: u64 = 3;

/// How fast the queue admits, for its rate alert: `longest_wait_ms` is how long the queue
/// has been able to admit its longest-waiting user (since that user entered, or since the
/// sale opened or resumed if later; 0 while nobody waits), `recent_rate` the admissions per
/// second over the last minute or, if shorter, that time.
struct RateSeen {
    longest_wait_ms: u64,
    recent_rate: f64,
}

/// `OVER_CAPACITY_90` over 90 % of capacity; `RATE_UNDER_50` when, with at least a batch
/// waiting for at least [`RATE_ALERT_MIN_TICKS`] ticks and the sale admitting (no sale, or
/// opening / open), the queue admits under half its target rate.
fn alerts_of(s: &QueueStats, seen: &RateSeen) -> Vec<&'static str> {
    let mut out = Vec::new();
    if s.max_capacity > 0 && s.waiting_count as f64 > CAPACITY_ALERT * s.max_capacity as f64 {
        out.push("OVER_CAPACITY_90");
    }
    let held = s.sale_state.is_some_and(SaleState::holds_admission_on_purpose);
    let young = seen.longest_wait_ms < RATE_ALERT_MIN_TICKS * s.tick_ms;
    // Only with at least a batch waiting: a short queue admits less than the target by nature.
    if !held && !young && s.waiting_count >= s.batch_size && seen.recent_rate < RATE_ALERT * s.target_rate_per_sec {
        out.push("RATE_UNDER_50");
    }
    out
}

/// The rate the alert judges: over the last minute, or since the longest-waiting user
/// entered, the sale opened or it resumed, whichever is the most recent (a queue 6 s old, or
/// resumed 6 s ago, has not had a minute to admit in).
fn rate_seen(snap: &TargetSnapshot, tick_ms: u64, now_ms: u64) -> RateSeen {
    let sale = snap.sale.as_ref().map(|v| &v.record);
    let restarted = sale.and_then(|r| r.resumed_at_ms.max(r.opened_at_ms));
    let since = snap.oldest_entry_ms.map(|at| at.max(restarted.unwrap_or(0)));
    let longest_wait_ms = since.map_or(0, |at| now_ms.saturating_sub(at));
    let window = longest_wait_ms.clamp(tick_ms, 60_000);
    RateSeen { longest_wait_ms, recent_rate: admission_rate_over(&snap.admissions, tick_ms, now_ms, window) }
}

/// What the flag columns say while the flag hash is missing from Redis.
const MISSING_FLAG: &str = "MISSING (instances keep their last known flag: vq flag status)";

/// Reads everything the dashboard shows, in one pass.
pub async fn collect(store: &AnyStore, settings: &Settings, only: Option<QueueTarget>) -> anyhow::Result<Report> {
    let location = super::redis_location(settings);
    let started = Instant::now();
    store.ping().await.map_err(|e| anyhow::anyhow!("redis at {location} is unreachable: {e}"))?;
    // Every target's lanes added at runtime, so each row adds up all of its lanes.
    store.refresh_lanes().await.map_err(|e| anyhow::anyhow!("cannot read the lanes: {e}"))?;
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    // A lost flag hash is not "off": instances that had read it keep it (`vq flag status`).
    let stored = store.read_stored_flag().await?;
    let kept = stored.is_none() && store.flag_acks().await?.iter().any(|a| a.kept_missing && a.silent_ms.is_none());
    let describe = |t: Option<QueueTarget>| match &stored {
        Some(f) => f.describe(t),
        None if kept => MISSING_FLAG.to_owned(),
        None => FlagState::default().describe(t),
    };
    // Only declared targets (active or with a sale): what clients name cannot make this longer.
    let mut targets = match only {
        Some(t) => {
            super::target::require_declared(store, settings, t).await?;
            vec![t]
        }
        None => super::sale::listed_targets(store, settings).await?,
    };
    targets.sort();
    let reports = super::target::fleet(store).await?;
    let runtime =
        store.declared_targets().await.map_err(|e| anyhow::anyhow!("cannot read the declared targets: {e}"))?;
    let here = settings.declared_targets()?;
    let mut rows = Vec::with_capacity(targets.len());
    for t in targets {
        // Another shard count than the fleet's would read a part of the target as the whole.
        super::target::same_shards(&reports, settings, t)?;
        let (snap, stats) = read_target_stats(store, t, settings).await?;
        let seen = rate_seen(&snap, stats.tick_ms, store.now_ms());
        let batch_changes = if stats.outflow_signals.is_some() {
            let ledger = store.sale_ledger(t).await?;
            ledger.into_iter().filter(|e| matches!(e, LedgerEntry::Batch { .. })).take(BATCH_CHANGES_SHOWN).collect()
        } else {
            Vec::new()
        };
        let mut sources = super::target::sources(runtime.contains(&t), &served_by(&reports, t), here.contains(t));
        if sources.is_empty() {
            sources.push("users waiting (no serving instance declares it)".to_owned());
        }
        rows.push(TargetRow {
            sources,
            trend: None,
            batch_changes,
            target: t.to_string(),
            flag: describe(Some(t)),
            lock_holder: snap.lock_holder,
            capacity_percent: if stats.max_capacity == 0 {
                0.0
            } else {
                stats.waiting_count as f64 * 100.0 / stats.max_capacity as f64
            },
            alerts: alerts_of(&stats, &seen),
            stats,
        });
    }
    Ok(Report {
        redis: RedisHealth {
            url: settings.redis_cluster_nodes().is_none().then(|| settings.redis.url.to_string()),
            cluster_nodes: settings
                .redis_cluster_nodes()
                .map(|nodes| nodes.iter().map(|n| crate::config::redact_credentials(n)).collect()),
            location,
            ok: true,
            latency_ms,
        },
        flag: describe(None),
        flag_version: stored.as_ref().map_or(0, |f| f.version),
        tick_ms: settings.queue.tick_ms,
        instances: reports.iter().map(|r| r.instance.clone()).collect(),
        drift: drift_rows(&reports),
        targets: rows,
    })
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.config.load_shared("stats")?;
    let colour = std::io::stdout().is_terminal() && !args.json;
    let columns = columns(args.wide);
    runtime()?.block_on(async move {
        let store = open_store(&settings)?;
        if !args.watch {
            let report = collect(&store, &settings, args.target).await?;
            print(&report, args.json, colour, columns, false)?;
            return anyhow::Ok(());
        }
        let every = Duration::from_millis(settings.queue.tick_ms);
        let mut last: Option<(Instant, Report)> = None;
        loop {
            match collect(&store, &settings, args.target).await {
                Ok(mut report) => {
                    if let Some((at, before)) = &last {
                        with_trend(&mut report, before, at.elapsed());
                    }
                    print(&report, args.json, colour, columns, true)?;
                    last = Some((Instant::now(), report));
                }
                // Keep watching through a Redis outage: that is when the operator looks.
                Err(e) if colour => println!("\x1b[H\x1b[2Jvq stats  {e:#}  (retrying every tick)"),
                Err(e) => eprintln!("error: {e:#}"),
            }
            match std::io::stdout().flush() {
                // The reader is gone (`vq stats --watch | head -1`): nothing left to show.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => break,
                other => other?,
            }
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                () = tokio::time::sleep(every) => {}
            }
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Sets each target's change since `before`, taken `over` ago (a target new since then has none).
fn with_trend(report: &mut Report, before: &Report, over: Duration) {
    for row in &mut report.targets {
        if let Some(old) = before.targets.iter().find(|o| o.target == row.target) {
            row.trend = Some(Trend {
                waiting: row.stats.waiting_count as i64 - old.stats.waiting_count as i64,
                admitted: row.stats.admitted_count as i64 - old.stats.admitted_count as i64,
                over_ms: over.as_millis() as u64,
            });
        }
    }
}

fn print(report: &Report, json: bool, colour: bool, columns: Option<u16>, watch: bool) -> anyhow::Result<()> {
    if json {
        // One JSON document per line in --watch, so scripts can read it line by line.
        println!("{}", serde_json::to_string(report)?);
    } else if watch && colour {
        // Home + clear: redraw in place like watch(1).
        print!("\x1b[H\x1b[2J{}", render_within(report, colour, columns));
    } else {
        print!("{}", render_within(report, colour, columns));
        if watch {
            println!("-- {} ms", now_epoch_ms());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
