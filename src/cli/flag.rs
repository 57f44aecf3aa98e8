//! `vq flag status | on [--percent N] [--target T] | off [--target T]`.

use std::process::ExitCode;

use clap::Subcommand;

use super::{ConfigArg, runtime};
use crate::app::open_store;
use crate::config::{Overrides, StoreKind};
use crate::domain::{FlagState, QueueTarget, TargetOverride};
use crate::store::{AnyStore, QueueStore};

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  vq flag status\n  vq flag on                      # every user goes through the queue\n  vq flag on --percent 10         # canary: 10 % of users\n  vq flag off --target limited-drop:42\n  vq flag off                     # rollback: every instance stops queueing within 3 s"
)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Subcommand)]
enum Action {
    /// Show the flag as stored in Redis
    Status,
    /// Turn the queue on, for everyone or a canary share, globally or for one target
    On {
        /// Share of users (0–100) that go through the queue
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u8).range(0..=100))]
        percent: u8,
        /// Only this target, e.g. limited-drop:42
        #[arg(long, value_name = "T")]
        target: Option<QueueTarget>,
    },
    /// Turn the queue off, globally or for one target
    Off {
        #[arg(long, value_name = "T")]
        target: Option<QueueTarget>,
    },
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.config.load(&Overrides::default())?;
    if settings.store == StoreKind::Memory {
        anyhow::bail!("vq flag needs store = redis: the embedded store lives inside one vq serve");
    }
    runtime()?.block_on(async move {
        let store = open_store(&settings)?;
        let version = match args.action {
            Action::Status => None,
            Action::On { percent, target } => Some(set(&store, true, percent, target).await?),
            Action::Off { target } => Some(set(&store, false, 0, target).await?),
        };
        let flag = store
            .read_flag()
            .await
            .map_err(|e| anyhow::anyhow!("cannot read the flag from {}: {e}", settings.redis.url))?;
        if let Some(v) = version {
            println!("flag changed: version {v}");
        }
        print_flag(&flag);
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

async fn set(store: &AnyStore, on: bool, percent: u8, target: Option<QueueTarget>) -> anyhow::Result<u64> {
    let fields = match target {
        Some(t) => {
            let o = if on { TargetOverride::On { percent } } else { TargetOverride::Off };
            vec![FlagState::override_field(t, o)]
        }
        None if on => vec![("enabled".into(), "1".into()), ("percent".into(), percent.to_string())],
        None => vec![("enabled".into(), "0".into())],
    };
    store.write_flag(fields, Vec::new()).await.map_err(|e| anyhow::anyhow!("cannot write the flag: {e}"))
}

fn print_flag(flag: &FlagState) {
    println!("virtual-queue.enabled: {} (version {})", flag.describe(None), flag.version);
    for (target, o) in &flag.overrides {
        let state = match o {
            TargetOverride::Off => "off".to_owned(),
            TargetOverride::On { percent } => format!("on {percent}%"),
        };
        println!("  {target}: {state}");
    }
}
