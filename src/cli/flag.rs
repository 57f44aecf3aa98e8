//! `vq flag status | on [--percent N] [--target T] | off [--target T]`.

use std::process::ExitCode;

use std::time::{Duration, Instant};

use clap::Subcommand;
use comfy_table::Table;

use super::{ConfigArg, runtime};
use crate::app::open_store;
use crate::domain::{FlagState, QueueTarget, TargetOverride};
use crate::service::now_epoch_ms;
use crate::store::{AnyStore, FlagAck, QueueStore};

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
    // Exit 0: applied by every live instance; 1: some did not within 3 s, or an error.
    let settings = args.config.load_shared("flag")?;
    runtime()?.block_on(async move {
        let store = open_store(&settings)?;
        let flag = store
            .read_flag()
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach Redis at {}: {e}", settings.redis.url))?;
        let change = match args.action {
            Action::Status => {
                print_flag(&flag);
                let acks = store.flag_acks().await.map_err(|e| anyhow::anyhow!("cannot read acknowledgements: {e}"))?;
                print_acks(&acks, None, flag.version);
                return Ok(ExitCode::SUCCESS);
            }
            Action::On { percent, target } => (true, percent, target),
            Action::Off { target } => (false, 0, target),
        };
        // The instances alive now must all apply the change; an instance that stops
        // acknowledging meanwhile is named too.
        let live = store.flag_acks().await.map_err(|e| anyhow::anyhow!("cannot read acknowledgements: {e}"))?;
        let written_at = now_epoch_ms();
        let version = set(&store, change.0, change.1, change.2).await?;
        println!("flag changed: version {version}");
        print_flag(&store.read_flag().await?);
        let deadline = Instant::now() + CONFIRM_WITHIN;
        let acks = loop {
            let acks = store.flag_acks().await.map_err(|e| anyhow::anyhow!("cannot read acknowledgements: {e}"))?;
            let done = live.iter().all(|l| acks.iter().any(|a| a.instance == l.instance && a.version >= version));
            if done || Instant::now() >= deadline {
                break acks;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        print_acks(&acks, Some(written_at), version);
        let laggards: Vec<&str> = live
            .iter()
            .filter(|l| !acks.iter().any(|a| a.instance == l.instance && a.version >= version))
            .map(|l| l.instance.as_str())
            .collect();
        if live.is_empty() {
            println!("no live vq instance is acknowledging flag changes (none running?)");
        }
        if laggards.is_empty() {
            println!("applied by all {} live instance(s)", live.len());
            Ok(ExitCode::SUCCESS)
        } else {
            eprintln!("error: not applied within {} s by: {}", CONFIRM_WITHIN.as_secs(), laggards.join(", "));
            Ok(ExitCode::FAILURE)
        }
    })
}

/// SPEC §1: a flag change takes effect on every instance within 3 s.
const CONFIRM_WITHIN: Duration = Duration::from_secs(3);

fn print_acks(acks: &[FlagAck], written_at: Option<u64>, version: u64) {
    if acks.is_empty() {
        return;
    }
    let mut table = Table::new();
    table.load_style(comfy_table::presets::UTF8_BORDERS_ONLY);
    table.set_header(vec!["instance", "applied version", "delay", "state"]);
    for a in acks {
        let delay = match written_at {
            Some(w) if a.version >= version => format!("{} ms", a.applied_at_ms.saturating_sub(w)),
            _ => "-".to_owned(),
        };
        let state = if a.version >= version { "applied" } else { "NOT APPLIED" };
        table.add_row(vec![a.instance.clone(), a.version.to_string(), delay, state.to_owned()]);
    }
    println!("{table}");
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
