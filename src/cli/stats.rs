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

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, Color, ContentArrangement, Table};
use serde::Serialize;

use super::{ConfigArg, runtime};
use crate::app::open_store;
use crate::config::Settings;
use crate::domain::{FlagState, LedgerEntry, QueueTarget, admission_rate_over, format_instant};
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
}

/// Batch changes shown per target.
const BATCH_CHANGES_SHOWN: usize = 3;

/// The lines under the table for a target with an adaptive outflow: the batch, the signals
/// its last decision saw, and its last changes.
fn outflow_notes(r: &TargetRow) -> String {
    let s = &r.stats;
    let Some(sig) = &s.outflow_signals else { return String::new() };
    let p95 = sig.p95_ms.map_or_else(|| "-".to_owned(), |p| format!("≤ {p} ms"));
    let no_show = sig.no_show_ratio.map_or_else(|| "-".to_owned(), |n| format!("{n:.2}"));
    let mut out = format!(
        "{} outflow adaptive: batch {} ({}); last interval {} purchases, P95 {p95}, errors {:.3}, no-shows {no_show}\n",
        r.target,
        s.batch_size,
        s.outflow_reason.as_deref().unwrap_or("-"),
        sig.purchases,
        sig.error_ratio,
    );
    for c in &r.batch_changes {
        if let LedgerEntry::Batch { at_ms, from, to, reason, instance } = c {
            let from = from.map_or_else(|| "-".to_owned(), |f| f.to_string());
            out.push_str(&format!("  {} batch {from} → {to} by {instance}: {reason}\n", format_instant(*at_ms)));
        }
    }
    out
}

/// A queue whose longest-waiting user entered fewer than this many ticks ago has not had
/// the ticks to show a rate: no `RATE_UNDER_50` yet.
const RATE_ALERT_MIN_TICKS: u64 = 3;

/// The sale states in which admitting nobody is what the operator asked for: before the
/// opening, paused, closed. No rate alert then.
const HOLDS_ADMISSION: [&str; 4] = ["scheduled", "pre-queue", "paused", "closed"];

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
    let held = s.sale_state.as_deref().is_some_and(|st| HOLDS_ADMISSION.contains(&st));
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
    let mut rows = Vec::with_capacity(targets.len());
    for t in targets {
        let (snap, stats) = read_target_stats(store, t, settings).await?;
        let seen = rate_seen(&snap, stats.tick_ms, store.now_ms());
        let batch_changes = if stats.outflow_signals.is_some() {
            let ledger = store.sale_ledger(t).await?;
            ledger.into_iter().filter(|e| matches!(e, LedgerEntry::Batch { .. })).take(BATCH_CHANGES_SHOWN).collect()
        } else {
            Vec::new()
        };
        rows.push(TargetRow {
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
        targets: rows,
    })
}

fn secs(s: f64) -> String {
    format!("{s:.1} s")
}

/// The sale column: `-` without a sale, else its state, with a countdown before the opening.
fn sale_cell(s: &QueueStats, now_ms: u64) -> String {
    let Some(state) = &s.sale_state else { return "-".to_owned() };
    let opens = s.opens_at.as_deref().and_then(|t| crate::domain::parse_instant(t).ok());
    let pre = s.prequeued_count.filter(|n| *n > 0).map(|n| format!(", {n} pre-queued")).unwrap_or_default();
    match opens {
        Some(at) if at > now_ms => {
            let left = (at - now_ms).div_ceil(1000);
            format!("{state}{pre}, opens in {}h{:02}m{:02}s", left / 3600, (left / 60) % 60, left % 60)
        }
        _ => format!("{state}{pre}"),
    }
}

/// Columns of text `vq stats` fits its table into without a terminal or `$COLUMNS`.
pub const DEFAULT_COLUMNS: u16 = 100;

/// The width the table must fit: `None` with `--wide`; else `$COLUMNS`, the terminal's width,
/// or [`DEFAULT_COLUMNS`].
fn columns(wide: bool) -> Option<u16> {
    if wide {
        return None;
    }
    let from_env = std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse::<u16>().ok()).filter(|c| *c > 0);
    let from_terminal = || std::io::stdout().is_terminal().then(|| Table::new().width()).flatten();
    Some(from_env.or_else(from_terminal).unwrap_or(DEFAULT_COLUMNS))
}

/// The dashboard as text, fitted into `columns` (every column when `None` or when they all
/// fit); `colour` on a terminal.
pub fn render_within(report: &Report, colour: bool, columns: Option<u16>) -> String {
    let wide = render(report, colour);
    match columns {
        Some(max) if wide.lines().any(|l| visible_width(l) > usize::from(max)) => render_compact(report, colour, max),
        _ => wide,
    }
}

/// Characters a line takes on a terminal, colour escapes left out.
fn visible_width(line: &str) -> usize {
    let mut width = 0;
    let mut escape = false;
    for c in line.chars() {
        match (escape, c) {
            (false, '\x1b') => escape = true,
            (true, 'm') => escape = false,
            (true, _) => {}
            (false, _) => width += 1,
        }
    }
    width
}

/// The cells both tables open with: target, waiting (capacity used, to `cap_decimals`),
/// admitted, rate (target); red when their alert is up and `colour`.
fn leading_cells(r: &TargetRow, colour: bool, cap_decimals: usize) -> [Cell; 4] {
    let s = &r.stats;
    let red = |c: Cell, on: bool| if colour && on { c.fg(Color::Red) } else { c };
    let waiting = format!("{} ({:.*} %)", s.waiting_count, cap_decimals, r.capacity_percent);
    [
        Cell::new(&r.target),
        red(Cell::new(waiting), r.alerts.contains(&"OVER_CAPACITY_90")).set_alignment(CellAlignment::Right),
        Cell::new(s.admitted_count).set_alignment(CellAlignment::Right),
        red(
            Cell::new(format!("{:.1} ({:.1})", s.admission_rate_per_sec, s.target_rate_per_sec)),
            r.alerts.contains(&"RATE_UNDER_50"),
        )
        .set_alignment(CellAlignment::Right),
    ]
}

/// The headline: Redis, flag, tick and the number of targets, on two lines when one would not
/// fit into `columns`.
fn headline(report: &Report, columns: Option<u16>) -> String {
    let redis = format!("vq stats  redis {} ok ({:.1} ms)", report.redis.location, report.redis.latency_ms);
    let rest = format!(
        "flag {} (v{})  tick {} ms  {} target(s)",
        report.flag,
        report.flag_version,
        report.tick_ms,
        report.targets.len()
    );
    match columns {
        Some(max) if redis.chars().count() + 2 + rest.chars().count() > usize::from(max) => {
            format!("{redis}\n{rest}\n")
        }
        _ => format!("{redis}  {rest}\n"),
    }
}

/// The table within `columns`: two-line headers, the numbers that say whether the sale goes
/// well (waiting, admitted, rate, wait) and the alerts; a target's sale and a flag other than
/// the global one on a line of their own under the table; tokens, evicted users and the lock
/// holder only in the full table (`--wide`, `--json`).
fn render_compact(report: &Report, colour: bool, columns: u16) -> String {
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Dynamic).set_width(columns);
    if !colour {
        table.force_no_tty();
    }
    table.set_header(vec!["target", "waiting\n(cap %)", "admitted", "rate/s\n(target)", "wait s\navg/p95", "alert"]);
    let red = |c: Cell, on: bool| if colour && on { c.fg(Color::Red) } else { c };
    let now = now_epoch_ms();
    let mut notes = String::new();
    for r in &report.targets {
        let s = &r.stats;
        let full = r.alerts.contains(&"OVER_CAPACITY_90");
        let slow = r.alerts.contains(&"RATE_UNDER_50");
        let mut row = leading_cells(r, colour, 0).to_vec();
        row.extend([
            Cell::new(format!("{:.0}/{:.0}", s.avg_wait_seconds, s.p95_wait_seconds))
                .set_alignment(CellAlignment::Right),
            red(Cell::new(if r.alerts.is_empty() { "ok".to_owned() } else { r.alerts.join(" ") }), full || slow),
        ]);
        table.add_row(row);
        if s.sale_state.is_some() {
            notes.push_str(&format!("{} sale: {}\n", r.target, sale_cell(s, now)));
        }
        if r.flag != report.flag {
            notes.push_str(&format!("{} flag: {}\n", r.target, r.flag));
        }
        notes.push_str(&outflow_notes(r));
    }
    // The figures never wrap; the target and the alert words do when they must.
    for i in 1..5 {
        if let Some(c) = table.column_mut(i) {
            c.set_constraint(comfy_table::ColumnConstraint::ContentWidth);
        }
    }
    let mut out = headline(report, Some(columns));
    if report.targets.is_empty() {
        out.push_str("no active targets (nobody has entered a queue in the last key TTL) and no sale scheduled\n");
    } else {
        out.push_str(&table.to_string());
        out.push('\n');
        out.push_str(&notes);
    }
    out
}

/// The dashboard as text with every column; `colour` on a terminal.
pub fn render(report: &Report, colour: bool) -> String {
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Dynamic);
    if !colour {
        table.force_no_tty();
    }
    table.set_header(vec![
        "target",
        "waiting (cap %)",
        "admitted",
        "rate/s (target)",
        "avg wait",
        "p95 wait",
        "evicted",
        "tokens iss/used +direct",
        "flag",
        "sale",
        "lock holder",
        "alert",
    ]);
    let red = |c: Cell, on: bool| if colour && on { c.fg(Color::Red) } else { c };
    for r in &report.targets {
        let s = &r.stats;
        let full = r.alerts.contains(&"OVER_CAPACITY_90");
        let slow = r.alerts.contains(&"RATE_UNDER_50");
        let mut row = leading_cells(r, colour, 1).to_vec();
        row.extend([
            Cell::new(secs(s.avg_wait_seconds)).set_alignment(CellAlignment::Right),
            Cell::new(secs(s.p95_wait_seconds)).set_alignment(CellAlignment::Right),
            Cell::new(s.evicted_count).set_alignment(CellAlignment::Right),
            Cell::new(format!("{}/{} +{}", s.tokens_issued, s.tokens_used, s.direct_tokens_used))
                .set_alignment(CellAlignment::Right),
            Cell::new(&r.flag),
            Cell::new(sale_cell(s, now_epoch_ms())),
            Cell::new(r.lock_holder.as_deref().unwrap_or("-")),
            red(Cell::new(if r.alerts.is_empty() { "ok".to_owned() } else { r.alerts.join(" ") }), full || slow),
        ]);
        table.add_row(row);
    }
    let mut out = headline(report, None);
    if report.targets.is_empty() {
        out.push_str("no active targets (nobody has entered a queue in the last key TTL) and no sale scheduled\n");
    } else {
        out.push_str(&table.to_string());
        out.push('\n');
        for r in &report.targets {
            out.push_str(&outflow_notes(r));
        }
    }
    out
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
        loop {
            match collect(&store, &settings, args.target).await {
                Ok(report) => print(&report, args.json, colour, columns, true)?,
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
mod tests {
    use super::*;

    fn stats(waiting: u64, rate: f64) -> QueueStats {
        QueueStats {
            waiting_count: waiting,
            admitted_count: 0,
            admission_rate_per_sec: rate,
            avg_wait_seconds: 0.0,
            p95_wait_seconds: 0.0,
            evicted_count: 0,
            batch_size: 100,
            tick_ms: 2000,
            target_rate_per_sec: 50.0,
            max_capacity: 1000,
            tokens_issued: 0,
            tokens_used: 0,
            direct_tokens_used: 0,
            sale_state: None,
            opens_at: None,
            prequeued_count: None,
            outflow: "fixed".into(),
            outflow_reason: None,
            tokens_expired: 0,
            outflow_signals: None,
        }
    }

    /// A queue whose longest waiter has waited a minute, admitting `rate` per second.
    fn seen(rate: f64) -> RateSeen {
        RateSeen { longest_wait_ms: 60_000, recent_rate: rate }
    }

    #[test]
    fn rows_over_90_percent_or_under_half_rate_are_flagged() {
        assert_eq!(alerts_of(&stats(901, 50.0), &seen(50.0)), vec!["OVER_CAPACITY_90"]);
        assert_eq!(alerts_of(&stats(500, 24.0), &seen(24.0)), vec!["RATE_UNDER_50"]);
        assert!(alerts_of(&stats(500, 25.0), &seen(25.0)).is_empty());
        assert!(alerts_of(&stats(10, 0.0), &seen(0.0)).is_empty(), "fewer than a batch waiting is no slowness");
    }

    #[test]
    fn no_rate_alert_while_the_sale_holds_admission_or_the_queue_is_younger_than_three_ticks() {
        for state in ["scheduled", "pre-queue", "paused", "closed"] {
            let s = QueueStats { sale_state: Some(state.into()), ..stats(500, 0.0) };
            assert!(alerts_of(&s, &seen(0.0)).is_empty(), "{state}");
        }
        for state in ["opening", "open"] {
            let s = QueueStats { sale_state: Some(state.into()), ..stats(500, 0.0) };
            assert_eq!(alerts_of(&s, &seen(0.0)), vec!["RATE_UNDER_50"], "{state}");
        }
        let young = RateSeen { longest_wait_ms: 5_999, recent_rate: 0.0 };
        assert!(alerts_of(&stats(500, 0.0), &young).is_empty(), "under 3 ticks of 2 s");
        let old = RateSeen { longest_wait_ms: 6_000, recent_rate: 0.0 };
        assert_eq!(alerts_of(&stats(500, 0.0), &old), vec!["RATE_UNDER_50"], "a pump that never came");
    }

    #[test]
    fn a_queue_six_seconds_old_is_judged_on_its_six_seconds() {
        // Entered at 10.3 s, ticks of 2 s admitting 100 each at 12, 14 and 16 s; now 16.3 s.
        let snap = TargetSnapshot {
            oldest_entry_ms: Some(10_300),
            admissions: vec![(8, 100), (7, 100), (6, 100)],
            ..TargetSnapshot::default()
        };
        let r = rate_seen(&snap, 2000, 16_300);
        assert_eq!(r.longest_wait_ms, 6000);
        assert!((r.recent_rate - 50.0).abs() < 1e-9, "{}", r.recent_rate);
        assert!(alerts_of(&stats(500, 5.0), &r).is_empty());
    }

    #[test]
    fn a_sale_resumed_six_seconds_ago_is_judged_from_its_resume() {
        // Waiting since 0 s, paused until 10.3 s, then 100 admitted per 2-s tick; now 16.3 s.
        let record = crate::domain::SaleRecord { resumed_at_ms: Some(10_300), ..Default::default() };
        let snap = TargetSnapshot {
            oldest_entry_ms: Some(0),
            admissions: vec![(8, 100), (7, 100), (6, 100)],
            sale: Some(crate::store::SaleView { record, now_ms: 16_300 }),
            ..TargetSnapshot::default()
        };
        let r = rate_seen(&snap, 2000, 16_300);
        assert_eq!(r.longest_wait_ms, 6000);
        assert!(alerts_of(&stats(500, 5.0), &r).is_empty(), "{}", r.recent_rate);
    }

    #[test]
    fn without_a_terminal_the_marker_word_shows_and_no_escape_codes() {
        let report = Report {
            redis: RedisHealth {
                url: Some("redis://x".into()),
                cluster_nodes: None,
                location: "redis://x".into(),
                ok: true,
                latency_ms: 0.2,
            },
            flag: "on 100%".into(),
            flag_version: 1,
            tick_ms: 2000,
            targets: vec![TargetRow {
                target: "LIMITED_DROP:42".into(),
                stats: stats(950, 0.0),
                flag: "on 100%".into(),
                lock_holder: Some("a".into()),
                capacity_percent: 95.0,
                alerts: alerts_of(&stats(950, 0.0), &seen(0.0)),
                batch_changes: Vec::new(),
            }],
        };
        let text = render(&report, false);
        assert!(text.contains("OVER_CAPACITY_90 RATE_UNDER_50"), "{text}");
        assert!(!text.contains('\x1b'), "{text}");
    }

    /// A busy sale day: six-figure queues, a pre-queued sale with its countdown, both alerts.
    fn busy_report() -> Report {
        let row = |target: &str, waiting: u64, rate: f64, sale: bool| {
            let mut s = stats(waiting, rate);
            s.max_capacity = 100_000;
            s.admitted_count = 98_765;
            s.avg_wait_seconds = 312.4;
            s.p95_wait_seconds = 1480.2;
            s.evicted_count = 4_321;
            s.tokens_issued = 98_765;
            s.tokens_used = 95_432;
            s.direct_tokens_used = 120;
            if sale {
                s.sale_state = Some("pre-queue".into());
                s.opens_at = Some(crate::domain::format_instant(now_epoch_ms() + 3_600_000));
                s.prequeued_count = Some(95_000);
            }
            TargetRow {
                target: target.into(),
                flag: "on 100%".into(),
                lock_holder: Some("vq-7f9c2d-1234".into()),
                capacity_percent: waiting as f64 * 100.0 / 100_000.0,
                alerts: alerts_of(&s, &seen(rate)),
                batch_changes: Vec::new(),
                stats: s,
            }
        };
        Report {
            redis: RedisHealth {
                url: Some("redis://redis.internal.example:6379".into()),
                cluster_nodes: None,
                location: "redis://redis.internal.example:6379".into(),
                ok: true,
                latency_ms: 1.2,
            },
            flag: "on 100%".into(),
            flag_version: 12,
            tick_ms: 2000,
            targets: vec![row("LIMITED_DROP:42", 95_000, 12.5, true), row("TICKETING_EVENT:2026", 10_000, 50.0, false)],
        }
    }

    #[test]
    fn the_table_fits_100_columns_and_wide_shows_every_column() {
        let report = busy_report();
        let wide = render_within(&report, false, None);
        assert!(wide.lines().any(|l| l.chars().count() > 100), "the full table is wider than 100:\n{wide}");
        assert!(wide.contains("lock holder") && wide.contains("vq-7f9c2d-1234"), "{wide}");
        {
            let columns = 100;
            let text = render_within(&report, false, Some(columns));
            for line in text.lines() {
                assert!(line.chars().count() <= usize::from(columns), "over {columns} columns:\n{text}");
            }
            for shown in [
                "LIMITED_DROP:42",
                "TICKETING_EVENT:2026",
                "95000 (95 %)",
                "98765",
                "12.5 (50.0)",
                "312/1480",
                "OVER_CAPACITY_90",
                "LIMITED_DROP:42 sale: pre-queue, 95000 pre-queued, opens in",
                "flag on 100%",
            ] {
                assert!(text.contains(shown), "{shown} missing at {columns} columns:\n{text}");
            }
        }
        // A terminal wide enough gets every column.
        assert_eq!(render_within(&report, false, Some(400)), wide);
    }
}
