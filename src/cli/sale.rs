//! `vq sale schedule | show | pause | resume | close | clear | ledger | report`: a target's
//! sale lifecycle, changed at runtime, and its report afterwards. Every instance reads the
//! sale from Redis in its scripts, so a change applies at the next enter, poll or tick.

mod report;
mod show;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use self::show::{LedgerReport, SaleShow, print_changes, print_ledger};
use super::{ConfigArg, runtime};
use crate::app::open_store;
use crate::config::Settings;
use crate::domain::{
    QueueTarget, SaleControl, SaleReport, SaleSchedule, SaleSource, format_instant, ledger_admitted, parse_instant,
};
use crate::service::{DEFAULT_CLOSE_MESSAGE, now_epoch_ms};
use crate::store::prelude::*;
use crate::store::{AnyStore, ClearOutcome, ScheduleOutcome};

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  vq sale schedule limited-drop:42 --opens-at 2026-12-24T10:00:00Z --prequeue-from 2026-12-24T09:30:00Z\n  vq sale show limited-drop:42 --json        # seedCommitment now, seed and prequeued from the opening\n  vq sale pause limited-drop:42\n  vq sale resume limited-drop:42\n  vq sale close limited-drop:42 --message \"Sold out\"\n  vq sale ledger limited-drop:42\n  vq sale report limited-drop:42 --html report.html   # after the sale, for queue.record_ttl_days\n  vq sale clear limited-drop:42              # back to always open; refused while users are pre-queued
  vq sale pause --target limited-drop:42     # --target, as vq flag, batch and stats take it"
)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
    #[command(flatten)]
    config: ConfigArg,
}

/// The target of a sale command, positional (`vq sale pause limited-drop:42`) or with
/// `--target` as `vq flag`, `batch` and `stats` take it.
#[derive(clap::Args)]
#[group(required = true, multiple = false)]
struct TargetArg {
    /// The target, e.g. limited-drop:42
    #[arg(value_name = "TARGET")]
    target: Option<QueueTarget>,
    /// The target, as the other commands take it (the same as the positional TARGET)
    #[arg(long = "target", id = "target_opt", value_name = "T")]
    target_opt: Option<QueueTarget>,
}

impl TargetArg {
    fn get(&self) -> QueueTarget {
        self.target.or(self.target_opt).expect("clap requires one of TARGET and --target")
    }
}

/// [`TargetArg`] for `vq sale show`, where the target is optional.
#[derive(clap::Args)]
struct MaybeTargetArg {
    /// The target, e.g. limited-drop:42 (default: every active declared target)
    #[arg(value_name = "TARGET", conflicts_with = "target_opt")]
    target: Option<QueueTarget>,
    /// The target, as the other commands take it (the same as the positional TARGET)
    #[arg(long = "target", id = "target_opt", value_name = "T")]
    target_opt: Option<QueueTarget>,
}

#[derive(Subcommand)]
enum Action {
    /// Schedule the opening (and optionally the pre-queue and the close); ISO-8601 times with Z or an offset.
    /// On a target with a schedule, the times not given stay as they are
    Schedule {
        #[command(flatten)]
        target: TargetArg,
        /// When admission starts and the pre-queue gets its random order (required for a new schedule)
        #[arg(long, value_name = "TIME")]
        opens_at: Option<String>,
        /// From when entries are recorded in the pre-queue (default: none, entries before the opening are told SCHEDULED)
        #[arg(long, value_name = "TIME", conflicts_with = "no_prequeue")]
        prequeue_from: Option<String>,
        /// When the sale closes by itself
        #[arg(long, value_name = "TIME", conflicts_with = "no_close")]
        closes_at: Option<String>,
        /// Remove the pre-queue window of an existing schedule
        #[arg(long)]
        no_prequeue: bool,
        /// Remove the scheduled close of an existing schedule
        #[arg(long)]
        no_close: bool,
    },
    /// Show the sale of one target, or of every active declared target that has one
    Show {
        #[command(flatten)]
        target: MaybeTargetArg,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Stop admitting (enter and poll go on; answers say paused)
    Pause {
        #[command(flatten)]
        target: TargetArg,
    },
    /// Admit again after a pause
    Resume {
        #[command(flatten)]
        target: TargetArg,
    },
    /// Close the sale: waiting and pre-queued users are told CLOSED; admitted users keep their tokens
    Close {
        #[command(flatten)]
        target: TargetArg,
        /// What users are told
        #[arg(long, value_name = "TEXT", default_value = DEFAULT_CLOSE_MESSAGE)]
        message: String,
    },
    /// Remove the sale: the target is always open again (the ledger stays). Pre-queued users
    /// lose their place (they get NOT_IN_QUEUE), so it is refused while the pre-queue holds
    /// users or the opening is under way, unless --force
    Clear {
        #[command(flatten)]
        target: TargetArg,
        /// Clear even though pre-queued users lose their place (`vq sale close` tells them instead)
        #[arg(long)]
        force: bool,
    },
    /// The admission ledger: every admission step, the opening, pauses, resumes and closes
    Ledger {
        #[command(flatten)]
        target: TargetArg,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// The sale's report from the target's record, which outlives the queue keys
    /// (queue.record_ttl_days): arrivals, admissions, waits, abandonment, evictions, tokens,
    /// purchases and the purchase API's answers per tick, the opening, pauses and closes
    Report {
        #[command(flatten)]
        target: TargetArg,
        /// Print the report as JSON (the source of the other forms)
        #[arg(long, group = "form")]
        json: bool,
        /// Print the series per tick as CSV
        #[arg(long, group = "form")]
        csv: bool,
        /// Write one self-contained HTML file with charts
        #[arg(long, group = "form", value_name = "FILE")]
        html: Option<PathBuf>,
    },
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.config.load_shared("sale")?;
    let url = settings.redis.url.clone();
    runtime()?.block_on(async move {
        let store = open_store(&settings)?;
        let fail = |what: &str, t: QueueTarget, e: crate::store::StoreError| {
            anyhow::anyhow!("cannot {what} the sale of {t} in {url}: {e}")
        };
        match &args.action {
            Action::Schedule { target, .. } => {
                let target = target.get();
                if super::target::declare(&store, &settings, target).await? {
                    println!("{target} declared (vq target list)");
                }
            }
            Action::Show { target: MaybeTargetArg { target: None, target_opt: None }, .. } => {}
            Action::Show {
                target: MaybeTargetArg { target: Some(t), .. } | MaybeTargetArg { target_opt: Some(t), .. },
                ..
            } => super::target::require_declared(&store, &settings, *t).await?,
            Action::Pause { target: t }
            | Action::Resume { target: t }
            | Action::Close { target: t, .. }
            | Action::Clear { target: t, .. }
            | Action::Ledger { target: t, .. }
            | Action::Report { target: t, .. } => super::target::require_declared(&store, &settings, t.get()).await?,
        }
        // A sale's steps reach each of a sharded target's shards: only with the fleet's count.
        let named = match &args.action {
            Action::Schedule { target, .. } => Some(target.get()),
            Action::Show { target: MaybeTargetArg { target: Some(t), .. } | MaybeTargetArg { target_opt: Some(t), .. }, .. } => {
                Some(*t)
            }
            Action::Show { .. } => None,
            Action::Pause { target: t }
            | Action::Resume { target: t }
            | Action::Close { target: t, .. }
            | Action::Clear { target: t, .. }
            | Action::Ledger { target: t, .. }
            | Action::Report { target: t, .. } => Some(t.get()),
        };
        if let Some(t) = named {
            super::target::require_same_shards(&store, &settings, t).await?;
            // The sale reaches every lane of the target, those added at runtime too.
            store.refresh_lanes().await.map_err(|e| anyhow::anyhow!("cannot read the lanes of {t}: {e}"))?;
        }
        match args.action {
            Action::Schedule { target, opens_at, prequeue_from, closes_at, no_prequeue, no_close } => {
                let target = target.get();
                let parse = |flag: &str, t: Option<String>| {
                    t.map(|t| parse_instant(&t)).transpose().map_err(|e| anyhow::anyhow!("{flag}: {e}"))
                };
                let given = SaleSchedule {
                    opens_at_ms: parse("--opens-at", opens_at)?.unwrap_or(0),
                    prequeue_from_ms: parse("--prequeue-from", prequeue_from)?,
                    closes_at_ms: parse("--closes-at", closes_at)?,
                };
                // A schedule already there: what is not given stays (and is said to).
                let current = store.read_sale(target).await.map_err(|e| fail("read", target, e))?;
                let current = current.and_then(|v| {
                    let r = v.record;
                    r.opens_at_ms.map(|opens_at_ms| SaleSchedule {
                        opens_at_ms,
                        prequeue_from_ms: r.prequeue_from_ms,
                        closes_at_ms: r.closes_at_ms,
                    })
                });
                let schedule = match current {
                    None if given.opens_at_ms == 0 => anyhow::bail!(
                        "{target} has no schedule: --opens-at is required (`vq sale schedule {target} --opens-at …`)"
                    ),
                    None => given,
                    Some(old) => {
                        let new = SaleSchedule {
                            opens_at_ms: if given.opens_at_ms == 0 { old.opens_at_ms } else { given.opens_at_ms },
                            prequeue_from_ms: if no_prequeue {
                                None
                            } else {
                                given.prequeue_from_ms.or(old.prequeue_from_ms)
                            },
                            closes_at_ms: if no_close { None } else { given.closes_at_ms.or(old.closes_at_ms) },
                        };
                        print_changes(target, &old, &new);
                        new
                    }
                };
                schedule.validate(now_epoch_ms())?;
                let mut seed = [0u8; 32];
                getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("cannot draw the seed: {e}"))?;
                match store.schedule_sale(target, schedule, seed).await.map_err(|e| fail("schedule", target, e))? {
                    ScheduleOutcome::Scheduled { commitment } => {
                        println!("sale of {target} scheduled: opens at {}", format_instant(schedule.opens_at_ms));
                        println!("seed commitment (SHA-256 of the seed, revealed at the opening): {commitment}");
                    }
                    ScheduleOutcome::AlreadyOpened { frozen_at_ms } => anyhow::bail!(
                        "the sale of {target} opened at {}: `vq sale clear {target}` first to schedule a new one",
                        format_instant(frozen_at_ms)
                    ),
                }
            }
            Action::Show { target, json } => {
                let target = target.target.or(target.target_opt);
                let targets = match target {
                    Some(t) => vec![t],
                    None => listed_targets(&store, &settings).await?,
                };
                let mut shown = Vec::new();
                for t in targets {
                    if let Some(view) = store.read_sale(t).await.map_err(|e| fail("read", t, e))? {
                        shown.push(SaleShow::of(t, &view));
                    }
                }
                if let (Some(t), true) = (target, shown.is_empty()) {
                    anyhow::bail!("{t} has no sale: it is always open (`vq sale schedule {t} --opens-at …`)");
                }
                if json {
                    let out = if target.is_some() {
                        serde_json::to_string_pretty(&shown[0])?
                    } else {
                        serde_json::to_string_pretty(&shown)?
                    };
                    println!("{out}");
                } else if shown.is_empty() {
                    println!("no active target has a sale");
                } else {
                    shown.iter().for_each(SaleShow::print);
                }
            }
            Action::Pause { target } => {
                control(&store, target.get(), SaleControl::Pause, "paused", "was paused already").await?
            }
            Action::Resume { target } => {
                control(&store, target.get(), SaleControl::Resume, "resumed", "was not paused").await?;
            }
            Action::Close { target, message } => {
                let close = SaleControl::Close { message, source: SaleSource::Command };
                control(&store, target.get(), close, "closed", "was closed already").await?;
            }
            Action::Clear { target, force } => {
                let target = target.get();
                match store.clear_sale(target, force).await.map_err(|e| fail("clear", target, e))? {
                    ClearOutcome::Cleared => println!("sale of {target} cleared (always open)"),
                    ClearOutcome::NoSale => println!("sale of {target} had no sale: nothing changed"),
                    ClearOutcome::Refused { opening, prequeued } => refused_clear(target, opening, prequeued)?,
                }
            }
            Action::Report { target, json, csv, html } => {
                let target = target.get();
                let record = store.target_record(target).await.map_err(|e| fail("read the record of", target, e))?;
                let Some(record) = record else {
                    anyhow::bail!(
                        "{target} has no record: nothing was counted for it in the last {} days (queue.record_ttl_days; \
                         the record expires that long after its last write), or nobody ever entered its queue",
                        settings.queue.record_ttl_days
                    );
                };
                let token_ttl_ms = settings.token.ttl_s * 1000;
                let mut report =
                    SaleReport::build(&target.to_string(), &record, store.now_ms(), settings.queue.tick_ms, token_ttl_ms);
                let lanes = store.lane_records(target).await.map_err(|e| fail("read the lanes' records of", target, e))?;
                report.lanes = lanes
                    .iter()
                    .map(|(l, r)| crate::domain::LaneTotals::of(l.shown(), r, settings.queue.tick_ms))
                    .collect();
                if json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else if csv {
                    print!("{}", report::csv(&report));
                } else if let Some(path) = html {
                    std::fs::write(&path, report::html(&report))
                        .map_err(|e| anyhow::anyhow!("cannot write the report to {}: {e}", path.display()))?;
                    println!("report of {target} written to {}", path.display());
                } else {
                    print!("{}", report::text(&report));
                }
            }
            Action::Ledger { target, json } => {
                let target = target.get();
                let mut entries = store.sale_ledger(target).await.map_err(|e| fail("read the ledger of", target, e))?;
                entries.reverse();
                let snap = store.snapshot(target).await.map_err(|e| fail("read", target, e))?;
                let report = LedgerReport {
                    target: target.to_string(),
                    admitted: ledger_admitted(&entries),
                    admitted_count: snap.admitted_total,
                    entries,
                };
                if json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    print_ledger(&report);
                }
            }
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `vq sale clear` without `--force`, refused by the store (the check and the clear are one
/// script): clearing would drop pre-queued users (they get NOT_IN_QUEUE and the next user to
/// enter is first), or those the opening is giving their places.
fn refused_clear(target: QueueTarget, opening: bool, n: u64) -> anyhow::Result<()> {
    let users = if n == 1 { "1 user".to_owned() } else { format!("{n} users") };
    let instead = format!(
        "`vq sale close {target}` tells them the sale is closed instead; `vq sale clear {target} --force` clears anyway"
    );
    if opening {
        anyhow::bail!(
            "refused: the sale of {target} is opening (its pre-queue of {users} is being given its order); clearing now \
             drops them: {users} would lose their place (NOT_IN_QUEUE). Wait until `vq sale show {target}` says open, \
             or {instead}"
        )
    }
    anyhow::bail!(
        "refused: the pre-queue of {target} holds {users}; clearing the sale drops them: {users} would lose their \
         place (NOT_IN_QUEUE) and the next user to enter would be first. {instead}"
    )
}

/// The declared targets that are active or have a sale scheduled (before anyone entered),
/// and any target with users waiting, sorted: what `vq sale show` and `vq stats` list.
pub(super) async fn listed_targets(store: &AnyStore, settings: &Settings) -> anyhow::Result<Vec<QueueTarget>> {
    let declared = super::target::declared(store, settings).await?;
    let mut all = store.active_targets().await.map_err(|e| anyhow::anyhow!("cannot list targets: {e}"))?;
    for t in store.sale_targets().await.map_err(|e| anyhow::anyhow!("cannot list sales: {e}"))? {
        // A sale whose keys expired, or a target nobody entered since, is not listed.
        if !all.contains(&t) && store.read_sale(t).await.map_err(|e| anyhow::anyhow!("cannot read {t}: {e}"))?.is_some()
        {
            all.push(t);
        }
    }
    all.sort();
    all.dedup();
    // Undeclared (its instance gone, say) yet with users waiting: still shown.
    let mut listed = Vec::with_capacity(all.len());
    for t in all {
        if declared.contains(t) || super::target::in_use(store, t).await? {
            listed.push(t);
        }
    }
    Ok(listed)
}

async fn control(
    store: &AnyStore,
    target: QueueTarget,
    control: SaleControl,
    done: &str,
    unchanged: &str,
) -> anyhow::Result<()> {
    let changed = store
        .control_sale(target, control)
        .await
        .map_err(|e| anyhow::anyhow!("cannot change the sale of {target}: {e}"))?;
    if changed {
        println!("sale of {target} {done}");
    } else {
        println!("sale of {target} {unchanged}: nothing changed");
    }
    Ok(())
}
