//! `vq pow show | set BITS | clear`: the proof-of-work difficulty at entry, changed mid-sale
//! without a redeploy. It travels in the flag hash, so every instance applies it within the
//! flag's refresh and confirms it as it confirms a flag change.

use std::process::ExitCode;

use clap::Subcommand;

use super::flag::change_and_confirm;
use super::{ConfigArg, redis_location, runtime};
use crate::app::open_store;
use crate::domain::FlagChange;
use crate::store::prelude::*;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  vq pow show\n  vq pow set 18     # a new user solves ~262,000 hashes before getting a place\n  vq pow set 0      # off, whatever entry.pow_bits says\n  vq pow clear      # back to entry.pow_bits"
)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Subcommand)]
enum Action {
    /// Show the difficulty in force
    Show,
    /// Set the difficulty: leading zero bits of SHA-256 a new user's solution must have
    Set {
        /// 0 (off) to 32
        #[arg(value_parser = clap::value_parser!(u8).range(0..=32))]
        bits: u8,
    },
    /// Remove the runtime difficulty: entry.pow_bits applies again
    Clear,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.config.load_shared("pow")?;
    let location = redis_location(&settings);
    let configured = settings.entry.pow_bits;
    runtime()?.block_on(async move {
        let store = open_store(&settings)?;
        let stored =
            store.read_stored_flag().await.map_err(|e| anyhow::anyhow!("cannot reach Redis at {location}: {e}"))?;
        let change = match args.action {
            Action::Show => {
                let runtime_bits = stored.and_then(|f| f.pow_bits);
                println!("entry.pow_bits (config): {configured}");
                println!(
                    "runtime difficulty: {}",
                    runtime_bits.map_or_else(|| "not set".to_owned(), |b| b.to_string())
                );
                let bits = runtime_bits.unwrap_or(configured);
                match bits {
                    0 => println!("in force: off (enter needs no proof of work)"),
                    b => println!("in force: {b} bits (~{} hashes per new user)", 1u64 << b),
                }
                return Ok(ExitCode::SUCCESS);
            }
            Action::Set { bits } => FlagChange::Pow(Some(bits)),
            Action::Clear => FlagChange::Pow(None),
        };
        if stored.is_none() {
            anyhow::bail!(
                "the flag hash is missing from Redis: nothing written (a hash holding only the difficulty would \
                 read as the queue off). Turn the queue on first (`vq flag on`)"
            );
        }
        let live = store.flag_acks().await.map_err(|e| anyhow::anyhow!("cannot read acknowledgements: {e}"))?;
        change_and_confirm(&store, change, live, false, &location).await
    })
}
