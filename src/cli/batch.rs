//! `vq batch set N [--target T] | clear [--target T] | show [--target T]`: the runtime batch
//! size, tuned without a redeploy. The pump reads it every tick.

use std::process::ExitCode;

use clap::Subcommand;

use super::{ConfigArg, runtime};
use crate::app::open_store;
use crate::domain::QueueTarget;
use crate::store::prelude::*;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  vq batch show\n  vq batch set 150                       # every target, from the next tick\n  vq batch set 50 --target limited-drop:42\n  vq batch clear --target limited-drop:42  # back to the global value\n  vq batch clear                         # back to queue.batch_size"
)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Subcommand)]
enum Action {
    /// Show the batch size in force (config default, global and per-target runtime values)
    Show {
        /// Only this target, e.g. limited-drop:42 (default: the global value and every active
        /// target that has its own)
        #[arg(long, value_name = "T")]
        target: Option<QueueTarget>,
    },
    /// Set the runtime batch size, for every target or one
    Set {
        /// Users admitted per tick (1 to 100000)
        #[arg(value_parser = clap::value_parser!(u64).range(crate::config::BATCH_SIZE))]
        size: u64,
        /// Only this target, e.g. limited-drop:42
        #[arg(long, value_name = "T")]
        target: Option<QueueTarget>,
    },
    /// Remove the runtime batch size, for every target or one
    Clear {
        /// Only this target's own value, e.g. limited-drop:42 (it falls back to the global one)
        #[arg(long, value_name = "T")]
        target: Option<QueueTarget>,
    },
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.config.load_shared("batch")?;
    let url = settings.redis.url.clone();
    runtime()?.block_on(async move {
        let store = open_store(&settings)?;
        if let Action::Set { target: Some(t), .. } | Action::Show { target: Some(t) } = &args.action {
            super::target::require_declared(&store, &settings, *t).await?;
            super::target::require_same_shards(&store, &settings, *t).await?;
        }
        let shown = match args.action {
            Action::Show { target } => target,
            Action::Set { size, target } => {
                store
                    .set_batch_size(target, Some(size))
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot set the batch size in {url}: {e}"))?;
                if let Some(t) = target {
                    // Listed by `batch show` from now on; the pump forgets it again while
                    // nobody is queued for it.
                    store.register_active(t).await.map_err(|e| anyhow::anyhow!("cannot register {t} in {url}: {e}"))?;
                }
                println!("batch size {size} set for {}", scope(target));
                target
            }
            Action::Clear { target } => {
                store
                    .set_batch_size(target, None)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot clear the batch size in {url}: {e}"))?;
                println!("runtime batch size cleared for {}", scope(target));
                target
            }
        };
        let global = store
            .global_batch_size()
            .await
            .map_err(|e| anyhow::anyhow!("cannot read the batch size from {url}: {e}"))?;
        let configured = settings.queue.batch_size;
        println!("queue.batch_size (config default): {configured}");
        for t in settings.targets.types.iter().filter(|t| t.batch_size.is_some()) {
            println!("targets.types {} batch_size (config): {}", t.slug, t.batch_size.unwrap_or(configured));
        }
        println!("global runtime batch size: {}", global.map_or_else(|| "not set".to_owned(), |b| b.to_string()));
        let mut in_force = crate::domain::batch_in_force(None, global, configured);
        if shown.is_none() {
            let targets = store
                .active_targets()
                .await
                .map_err(|e| anyhow::anyhow!("cannot list the active targets in {url}: {e}"))?;
            let mut own = Vec::new();
            for t in targets {
                let snap = store.snapshot(t).await.map_err(|e| anyhow::anyhow!("cannot read {t} from {url}: {e}"))?;
                if let Some(b) = snap.batch_override {
                    own.push(format!("{t}: {b}"));
                }
            }
            own.sort();
            if own.is_empty() {
                println!("per-target runtime batch sizes: none among the active targets");
            } else {
                println!("per-target runtime batch sizes (active targets): {}", own.join(", "));
            }
        }
        if let Some(t) = shown {
            let snap = store.snapshot(t).await.map_err(|e| anyhow::anyhow!("cannot read {t} from {url}: {e}"))?;
            println!(
                "{t} runtime batch size: {}",
                snap.batch_override.map_or_else(|| "not set".into(), |b| b.to_string())
            );
            let adaptive = settings.is_adaptive(t.kind);
            let base = crate::service::unpinned_batch(&settings, t.kind, &snap);
            if adaptive {
                let pinned = snap.batch_override.is_some() || global.is_some();
                match (&snap.outflow, pinned) {
                    (_, true) => println!(
                        "queue.outflow = adaptive, pinned by the runtime batch size: `vq batch clear` hands it back"
                    ),
                    (Some(o), false) => println!(
                        "queue.outflow = adaptive: the controller's batch {} ({}, {})",
                        o.batch,
                        o.reason,
                        crate::domain::format_instant(o.decided_at_ms)
                    ),
                    (None, false) => println!("queue.outflow = adaptive: no decision yet (starts at {base})"),
                }
            }
            in_force = crate::domain::batch_in_force(snap.batch_override, global, base);
        }
        println!(
            "in force{}: {in_force} per {} ms tick",
            shown.map(|t| format!(" for {t}")).unwrap_or_default(),
            settings.queue.tick_ms
        );
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn scope(target: Option<QueueTarget>) -> String {
    target.map_or_else(|| "every target".to_owned(), |t| t.to_string())
}
