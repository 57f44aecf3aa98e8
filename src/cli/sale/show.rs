//! What `vq sale show` and `vq sale ledger` print: a sale's state and times, a schedule's
//! changes, the ledger as a table; the same figures as JSON.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{ContentArrangement, Table};
use serde::Serialize;

use crate::domain::{LedgerEntry, QueueTarget, SaleSchedule, SaleSource, SaleState, format_instant};
use crate::store::SaleView;

/// What `vq sale show --json` prints per target.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SaleShow {
    target: String,
    state: SaleState,
    opens_at: Option<String>,
    prequeue_opens_at: Option<String>,
    closes_at: Option<String>,
    paused: bool,
    /// Lowercase hex SHA-256 of the seed bytes, published before the opening.
    seed_commitment: Option<String>,
    /// Lowercase hex seed, from the opening on.
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<String>,
    /// Users pre-queued at the opening, from the opening on.
    #[serde(skip_serializing_if = "Option::is_none")]
    prequeued: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    opened_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    close_source: Option<SaleSource>,
}

impl SaleShow {
    pub(super) fn of(target: QueueTarget, view: &SaleView) -> Self {
        let r = &view.record;
        let opened = r.opened_at_ms.is_some();
        Self {
            target: target.to_string(),
            state: r.state_at(view.now_ms),
            opens_at: r.opens_at_ms.map(format_instant),
            prequeue_opens_at: r.prequeue_from_ms.map(format_instant),
            closes_at: r.closes_at_ms.map(format_instant),
            paused: r.paused,
            seed_commitment: r.commitment.clone(),
            seed: r.revealed_seed().map(str::to_owned),
            prequeued: r.prequeued.filter(|_| opened),
            opened_at: r.opened_at_ms.map(format_instant),
            message: r.message.clone(),
            close_source: r.close_source,
        }
    }

    pub(super) fn print(&self) {
        println!(
            "{}: {}{}",
            self.target,
            self.state,
            if self.paused && self.state != SaleState::Paused { " (paused)" } else { "" }
        );
        let line = |name: &str, v: &Option<String>| {
            if let Some(v) = v {
                println!("  {name}: {v}");
            }
        };
        line("opens at", &self.opens_at);
        line("pre-queue from", &self.prequeue_opens_at);
        line("closes at", &self.closes_at);
        line("seed commitment (SHA-256 of the seed)", &self.seed_commitment);
        line("opened at", &self.opened_at);
        line("seed", &self.seed);
        if let Some(n) = self.prequeued {
            println!("  pre-queued at the opening: {n}");
        }
        line("message", &self.message);
        line("closed by", &self.close_source.map(|s| s.to_string()));
    }
}

/// What `vq sale ledger --json` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct LedgerReport {
    pub(super) target: String,
    /// Oldest first.
    pub(super) entries: Vec<LedgerEntry>,
    /// Users admitted in all of the ledger's admission rows.
    pub(super) admitted: u64,
    /// The stats' `admittedCount`, which `admitted` equals while the ledger holds every row.
    pub(super) admitted_count: u64,
}

/// What a schedule written over another changes, one line per time.
pub(super) fn print_changes(target: QueueTarget, old: &SaleSchedule, new: &SaleSchedule) {
    let show = |v: Option<u64>| v.map_or_else(|| "none".to_owned(), format_instant);
    println!("{target} had a schedule; changing it (times not given stay):");
    for (name, a, b) in [
        ("opens at", Some(old.opens_at_ms), Some(new.opens_at_ms)),
        ("pre-queue from", old.prequeue_from_ms, new.prequeue_from_ms),
        ("closes at", old.closes_at_ms, new.closes_at_ms),
    ] {
        if a == b {
            println!("  {name}: {} (kept)", show(a));
        } else {
            println!("  {name}: {} -> {}", show(a), show(b));
        }
    }
}

pub(super) fn print_ledger(report: &LedgerReport) {
    let mut table = Table::new();
    table.load_style(UTF8_FULL_CONDENSED).set_content_arrangement(ContentArrangement::Dynamic);
    table.set_header(["time (Redis)", "event", "mark", "admitted", "by"]);
    for e in &report.entries {
        let at = format_instant(e.at_ms());
        let row: [String; 5] = match e {
            LedgerEntry::Admission { mark_before, mark_after, admitted, instance, .. } => [
                at,
                "admission".into(),
                format!("{mark_before} → {mark_after}"),
                admitted.to_string(),
                instance.clone(),
            ],
            LedgerEntry::Opening { prequeued, seed_commitment, seed, .. } => [
                at,
                format!("opening: {prequeued} pre-queued, seed {seed} (commitment {seed_commitment})"),
                String::new(),
                String::new(),
                "pump".into(),
            ],
            LedgerEntry::Pause { source, .. } => [at, "pause".into(), String::new(), String::new(), source.to_string()],
            LedgerEntry::Resume { source, .. } => {
                [at, "resume".into(), String::new(), String::new(), source.to_string()]
            }
            LedgerEntry::Close { source, message, .. } => {
                [at, format!("close: {message}"), String::new(), String::new(), source.to_string()]
            }
            LedgerEntry::Clear { source, .. } => [at, "clear".into(), String::new(), String::new(), source.to_string()],
            LedgerEntry::Schedule { opens_at_ms, prequeue_from_ms, closes_at_ms, .. } => {
                let show = |v: &Option<u64>| v.map_or_else(|| "none".to_owned(), format_instant);
                let what = format!(
                    "schedule: opens {}, pre-queue from {}, closes {}",
                    format_instant(*opens_at_ms),
                    show(prequeue_from_ms),
                    show(closes_at_ms)
                );
                [at, what, String::new(), String::new(), "command".into()]
            }
            LedgerEntry::Batch { from, to, instance, reason, .. } => {
                let from = from.map_or_else(|| "-".to_owned(), |f| f.to_string());
                [at, format!("batch {from} → {to}: {reason}"), String::new(), String::new(), instance.clone()]
            }
        };
        table.add_row(row);
    }
    println!("{} ledger (oldest first)", report.target);
    println!("{table}");
    println!("admitted in the ledger: {}; stats admittedCount: {}", report.admitted, report.admitted_count);
}
