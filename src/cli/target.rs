//! `vq target add | list | remove`: the declared targets, the only ones a queue answers for;
//! and the check every operator command naming a target makes first.

use std::collections::BTreeSet;
use std::process::ExitCode;

use clap::Subcommand;

use super::{ConfigArg, runtime};
use crate::app::open_store;
use crate::config::Settings;
use crate::domain::{DeclaredTargets, InstanceReport, QueueTarget, QueueTargetType, fleet_declared, fleet_types};
use crate::store::prelude::*;
use crate::store::{AnyStore, DeclareOutcome};

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  vq target add limited-drop:42\n  vq target list\n  vq target remove limited-drop:42\n\nTargets may also be declared in configuration: [targets] declared = [\"limited-drop:42\"], ranges = [\"limited-drop:1000-1999\"].\nInstances answer for a target declared at runtime within flag.refresh_ms."
)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Subcommand)]
enum Action {
    /// Declare targets: from now on their queues answer (at most queue.max_targets in all)
    Add {
        /// e.g. limited-drop:42
        #[arg(required = true)]
        targets: Vec<QueueTarget>,
    },
    /// List the declared targets: configured ones and those declared at runtime
    List {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Remove a target declared at runtime: its queue answers 404 UNKNOWN_TARGET, the pump
    /// stops admitting for it and its keys expire after queue.key_ttl_s
    Remove {
        /// e.g. limited-drop:42
        target: QueueTarget,
    },
}

/// Every declared target: those of `settings` (this shell's configuration), those declared
/// at runtime in the store, and those the serving instances declare in their configuration
/// (their reports, `store::FleetOps`): an operator's shell rarely holds the servers' settings.
pub async fn declared(store: &AnyStore, settings: &Settings) -> anyhow::Result<DeclaredTargets> {
    let configured = settings.declared_targets()?;
    let runtime =
        store.declared_targets().await.map_err(|e| anyhow::anyhow!("cannot read the declared targets: {e}"))?;
    let served = fleet_declared(&fleet(store).await?);
    let mut all = configured.with(runtime).with(served.listed);
    for r in served.ranges {
        if !all.ranges.contains(&r) {
            all.ranges.push(r);
        }
    }
    Ok(all)
}

/// The live serving instances' reports.
pub async fn fleet(store: &AnyStore) -> anyhow::Result<Vec<InstanceReport>> {
    store.fleet().await.map_err(|e| anyhow::anyhow!("cannot read the instances' reports: {e}"))
}

/// Fails when a serving instance spreads `target`'s type over another number of shards than
/// this command's configuration would (`targets.types.*.shards`): the command would reach
/// some of the target's shards only.
pub async fn require_same_shards(store: &AnyStore, settings: &Settings, target: QueueTarget) -> anyhow::Result<()> {
    same_shards(&fleet(store).await?, settings, target)
}

/// [`require_same_shards`] against the fleet's `reports`, already read.
pub fn same_shards(reports: &[InstanceReport], settings: &Settings, target: QueueTarget) -> anyhow::Result<()> {
    let here = settings.type_shards(target.kind);
    for report in reports {
        let Some(types) = report.settings.get("targets.types") else { continue };
        let Ok(types) = serde_json::from_str::<Vec<crate::config::TargetTypeSettings>>(types) else { continue };
        let Some(def) = types.iter().find(|t| QueueTargetType::parse_any(&t.slug).ok() == Some(target.kind)) else {
            continue;
        };
        let there = def.shards.unwrap_or(1);
        if there != u64::from(here) {
            anyhow::bail!(
                "{} spreads each target over {there} shards on the serving instance {} and over {here} here: \
                 run this command with the fleet's configuration (targets.types.{}.shards)",
                target.kind.slug(),
                report.instance,
                target.kind.slug()
            );
        }
    }
    Ok(())
}

/// Fails unless `target`'s type is one of `targets.types` here or on a serving instance.
async fn require_configured_type(store: &AnyStore, settings: &Settings, target: QueueTarget) -> anyhow::Result<()> {
    let mut types: Vec<_> = settings.target_types()?;
    types.extend(fleet_types(&fleet(store).await?).into_iter().filter(|t| !types.contains(t)).collect::<Vec<_>>());
    if types.contains(&target.kind) {
        return Ok(());
    }
    let names: Vec<String> = types.iter().map(|t| t.slug().to_string()).collect();
    anyhow::bail!(
        "{target}: `{}` is not a configured target type (targets.types: {}): nothing changed",
        target.kind.slug(),
        names.join(", ")
    )
}

/// Whether users wait in `target`'s queue or a sale is scheduled for it: a target an operator
/// command acts on whatever is declared (an instance that served it may be gone).
pub async fn in_use(store: &AnyStore, target: QueueTarget) -> anyhow::Result<bool> {
    let snap = store.snapshot(target).await.map_err(|e| anyhow::anyhow!("cannot read {target}: {e}"))?;
    Ok(snap.waiting > 0 || snap.prequeued > 0 || snap.sale.is_some())
}

/// Fails (changing nothing) unless `target` is declared, naming a near miss if there is one.
pub async fn require_declared(store: &AnyStore, settings: &Settings, target: QueueTarget) -> anyhow::Result<()> {
    // Every command naming a target acts on all its parts: the lanes added at runtime too.
    store.refresh_lanes().await.map_err(|e| anyhow::anyhow!("cannot read the lanes: {e}"))?;
    let declared = declared(store, settings).await?;
    if declared.contains(target) || in_use(store, target).await? {
        return Ok(());
    }
    require_configured_type(store, settings, target).await?;
    let near = declared.near_misses(target);
    let hint = if near.is_empty() {
        "`vq target list` shows the declared ones, `vq target add` declares one".to_owned()
    } else {
        let names: Vec<String> = near.iter().map(|t| format!("{}:{}", t.kind.slug(), t.id)).collect();
        format!("did you mean {}?", names.join(" or "))
    };
    anyhow::bail!("{target} is not a declared target: nothing changed; {hint}")
}

/// Declares `target` at runtime within `queue.max_targets`; true when it was added now.
pub async fn declare(store: &AnyStore, settings: &Settings, target: QueueTarget) -> anyhow::Result<bool> {
    require_configured_type(store, settings, target).await?;
    let configured = settings.declared_targets()?;
    if configured.contains(target) {
        return Ok(false);
    }
    let room = settings.queue.max_targets.saturating_sub(configured.len());
    match store.declare_target(target, room).await.map_err(|e| anyhow::anyhow!("cannot declare {target}: {e}"))? {
        DeclareOutcome::Added => Ok(true),
        DeclareOutcome::AlreadyDeclared => Ok(false),
        DeclareOutcome::Full { room } => anyhow::bail!(
            "cannot declare {target}: {} targets are declared already ({} in configuration, {room} at runtime), the \
             limit queue.max_targets (VQ_QUEUE__MAX_TARGETS); `vq target remove` one that is over",
            configured.len() + room,
            configured.len()
        ),
    }
}

/// Where a declaration comes from: `runtime` (`vq target add`), `configuration of vq-a, vq-b`
/// (the serving instances that declare it), `this shell's configuration`.
pub(super) fn sources(runtime: bool, instances: &[&str], here: bool) -> Vec<String> {
    let mut out = Vec::new();
    if runtime {
        out.push("runtime".to_owned());
    }
    if !instances.is_empty() {
        out.push(format!("configuration of {}", instances.join(", ")));
    }
    if here {
        out.push("this shell's configuration".to_owned());
    }
    out
}

/// `vq target list`: every declaration (single targets, then ranges) with its sources.
async fn list(store: &AnyStore, settings: &Settings, json: bool) -> anyhow::Result<()> {
    let here = settings.declared_targets()?;
    let runtime: BTreeSet<QueueTarget> = store
        .declared_targets()
        .await
        .map_err(|e| anyhow::anyhow!("cannot read the declared targets: {e}"))?
        .into_iter()
        .collect();
    let reports = fleet(store).await?;
    let served = fleet_declared(&reports);
    let name = |t: &QueueTarget| format!("{}:{}", t.kind.slug(), t.id);
    let mut rows: Vec<(String, Option<u64>, Vec<String>)> = Vec::new();
    let singles: BTreeSet<QueueTarget> = here.listed.iter().chain(&served.listed).chain(&runtime).copied().collect();
    for t in &singles {
        let instances: Vec<&str> =
            reports.iter().filter(|r| r.declared.listed.contains(t)).map(|r| r.instance.as_str()).collect();
        rows.push((name(t), None, sources(runtime.contains(t), &instances, here.listed.contains(t))));
    }
    let mut ranges = here.ranges.clone();
    ranges.extend(served.ranges.iter().filter(|r| !here.ranges.contains(r)));
    for r in &ranges {
        let instances: Vec<&str> =
            reports.iter().filter(|x| x.declared.ranges.contains(r)).map(|x| x.instance.as_str()).collect();
        rows.push((r.to_string(), Some(r.count()), sources(false, &instances, here.ranges.contains(r))));
    }
    let total: u64 = rows.iter().map(|(_, ids, _)| ids.unwrap_or(1)).sum();
    if json {
        let declarations: Vec<_> = rows
            .iter()
            .map(|(t, ids, sources)| match ids {
                Some(n) => serde_json::json!({ "range": t, "ids": n, "sources": sources }),
                None => serde_json::json!({ "target": t, "sources": sources }),
            })
            .collect();
        let out = serde_json::json!({
            "configured": here.listed.iter().chain(&served.listed).collect::<BTreeSet<_>>().iter().map(|t| name(t)).collect::<Vec<_>>(),
            "ranges": ranges.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "runtime": runtime.iter().filter(|t| !here.listed.contains(t)).map(name).collect::<Vec<_>>(),
            "declarations": declarations,
            "instances": reports.iter().map(|r| r.instance.as_str()).collect::<Vec<_>>(),
            "maxTargets": settings.queue.max_targets,
        });
        println!("{out}");
        return Ok(());
    }
    for (t, ids, sources) in &rows {
        match ids {
            Some(n) => println!("{t}  ({}, {n} ids)", sources.join("; ")),
            None => println!("{t}  ({})", sources.join("; ")),
        }
    }
    let serving = match reports.len() {
        0 => "no serving instance reports".to_owned(),
        _ => {
            format!("serving instances: {}", reports.iter().map(|r| r.instance.as_str()).collect::<Vec<_>>().join(", "))
        }
    };
    println!("{total} declared of queue.max_targets = {}; {serving}", settings.queue.max_targets);
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.config.load_shared("target")?;
    runtime()?.block_on(async move {
        let store = open_store(&settings)?;
        match args.action {
            Action::Add { targets } => {
                for t in targets {
                    if declare(&store, &settings, t).await? {
                        println!("{t} declared");
                    } else {
                        println!("{t} was declared already: nothing changed");
                    }
                }
            }
            Action::List { json } => list(&store, &settings, json).await?,
            Action::Remove { target } => {
                if settings.declared_targets()?.contains(target) {
                    anyhow::bail!("{target} is declared in configuration ([targets]): remove it there");
                }
                if !store.undeclare_target(target).await.map_err(|e| anyhow::anyhow!("cannot remove {target}: {e}"))? {
                    require_declared(&store, &settings, target).await?;
                }
                println!("{target} removed: its queue answers 404 UNKNOWN_TARGET within flag.refresh_ms");
            }
        }
        anyhow::Ok(ExitCode::SUCCESS)
    })
}
