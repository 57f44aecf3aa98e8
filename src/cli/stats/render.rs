//! `vq stats`' text: the table (compact when the terminal is narrow), its headline and the
//! adaptive outflow's notes under it.

use std::io::IsTerminal;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, Color, ContentArrangement, Table};

use super::{Report, TargetRow};
use crate::domain::{LedgerEntry, format_instant};
use crate::service::{QueueStats, now_epoch_ms};

/// The lines under the table for a target with an adaptive outflow: the batch, the signals
/// its last decision saw, and its last changes.
fn outflow_notes(r: &TargetRow) -> String {
    let s = &r.stats;
    let Some(sig) = &s.outflow_signals else { return String::new() };
    let p95 = sig.p95_ms.map_or_else(|| "-".to_owned(), |p| format!("≤ {p} ms"));
    let no_show = sig.no_show_ratio.map_or_else(|| "-".to_owned(), |n| format!("{n:.2}"));
    let mut out = format!(
        "{} outflow adaptive: batch {} ({}); last interval {} buyers, P95 {p95}, errors {:.3}, no-shows {no_show}\n",
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
pub(super) fn columns(wide: bool) -> Option<u16> {
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
    let head = match columns {
        Some(max) if redis.chars().count() + 2 + rest.chars().count() > usize::from(max) => {
            format!("{redis}\n{rest}\n")
        }
        _ => format!("{redis}  {rest}\n"),
    };
    format!("{head}{}\n", fleet_line(report))
}

/// Who serves, and whether they agree: `serving vq-a, vq-b  no drift`, or `DRIFT` naming the
/// settings.
fn fleet_line(report: &Report) -> String {
    let serving = if report.instances.is_empty() {
        "no serving instance reports".to_owned()
    } else {
        format!("serving {}", report.instances.join(", "))
    };
    if report.drift.is_empty() {
        format!("{serving}  no drift")
    } else {
        let names: Vec<&str> = report.drift.iter().map(|d| d.setting.as_str()).collect();
        format!("{serving}  DRIFT in {} (vq fleet)", names.join(", "))
    }
}

/// The lines under the table for every target: where it is declared, and with `--watch`
/// its change since the last refresh.
fn target_notes(r: &TargetRow) -> String {
    let mut out = format!("{} from {}\n", r.target, r.sources.join("; "));
    if let Some(t) = &r.trend {
        out.push_str(&format!(
            "{} since last refresh ({:.1} s): waiting {:+}, admitted {:+}\n",
            r.target,
            t.over_ms as f64 / 1000.0,
            t.waiting,
            t.admitted
        ));
    }
    // A target with lanes: one line per lane (its share, who waits, who was admitted).
    for l in &r.stats.lanes {
        let opens = if l.opens_before_s > 0 { format!(", opens {} s early", l.opens_before_s) } else { String::new() };
        let pre = if l.prequeued_count > 0 { format!(", {} pre-queued", l.prequeued_count) } else { String::new() };
        out.push_str(&format!(
            "{} lane {} ({} %{opens}): waiting {}, admitted {}{pre}\n",
            r.target, l.lane, l.share, l.waiting_count, l.admitted_count
        ));
    }
    out
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
        notes.push_str(&target_notes(r));
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
            out.push_str(&target_notes(r));
        }
    }
    out
}
