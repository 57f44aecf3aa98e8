//! `vq target add | list | remove`: the declared targets, the only ones a queue answers for;
//! and the check every operator command naming a target makes first.

use std::process::ExitCode;

use clap::Subcommand;

use super::{ConfigArg, runtime};
use crate::app::open_store;
use crate::config::Settings;
use crate::domain::{DeclaredTargets, QueueTarget};
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

/// Every declared target: those of `settings` and those declared at runtime in the store.
pub async fn declared(store: &AnyStore, settings: &Settings) -> anyhow::Result<DeclaredTargets> {
    let configured = settings.declared_targets()?;
    let runtime =
        store.declared_targets().await.map_err(|e| anyhow::anyhow!("cannot read the declared targets: {e}"))?;
    Ok(configured.with(runtime))
}

/// Fails unless `target`'s type is one of `targets.types`.
fn require_configured_type(settings: &Settings, target: QueueTarget) -> anyhow::Result<()> {
    let types = settings.target_types()?;
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

/// Fails (changing nothing) unless `target` is declared, naming a near miss if there is one.
pub async fn require_declared(store: &AnyStore, settings: &Settings, target: QueueTarget) -> anyhow::Result<()> {
    require_configured_type(settings, target)?;
    let declared = declared(store, settings).await?;
    if declared.contains(target) {
        return Ok(());
    }
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
    require_configured_type(settings, target)?;
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
            Action::List { json } => {
                let configured = settings.declared_targets()?;
                let runtime = store
                    .declared_targets()
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot read the declared targets: {e}"))?;
                let mut runtime: Vec<QueueTarget> =
                    runtime.into_iter().filter(|t| !configured.listed.contains(t)).collect();
                runtime.sort();
                let name = |t: &QueueTarget| format!("{}:{}", t.kind.slug(), t.id);
                if json {
                    let out = serde_json::json!({
                        "configured": configured.listed.iter().map(name).collect::<Vec<_>>(),
                        "ranges": configured.ranges.iter().map(ToString::to_string).collect::<Vec<_>>(),
                        "runtime": runtime.iter().map(name).collect::<Vec<_>>(),
                        "maxTargets": settings.queue.max_targets,
                    });
                    println!("{out}");
                } else {
                    for t in &configured.listed {
                        println!("{}  (configuration)", name(t));
                    }
                    for r in &configured.ranges {
                        println!("{r}  (configuration, {} ids)", r.count());
                    }
                    for t in &runtime {
                        println!("{}", name(t));
                    }
                    println!(
                        "{} declared of queue.max_targets = {}",
                        configured.len() + runtime.len() as u64,
                        settings.queue.max_targets
                    );
                }
            }
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
