//! `vq events [--since ID] [--target T] [--follow]`: the event logs as JSON lines (one event
//! per line, as a webhook receives it), oldest first; with `--follow`, then every new event
//! as it is appended, until Ctrl-C.

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use super::{ConfigArg, runtime};
use crate::app::open_store;
use crate::domain::{EventId, QueueTarget, parse_since};

/// How often `--follow` looks for new events.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  vq events                                  # every event kept, then exit\n  vq events --follow                         # and every new one, until Ctrl-C\n  vq events --since limited-drop:42/1733400000000-0   # after the event with this id\n  vq events --target limited-drop:42 --follow | jq -r .type"
)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArg,
    /// Only events after this one: an event's id (`limited-drop:42/1733400000000-0`), or
    /// `<ms>-<seq>` / `<ms>` (epoch ms) for every log
    #[arg(long, value_name = "ID", value_parser = parse_since_arg)]
    since: Option<EventId>,
    /// Only this target's events, e.g. limited-drop:42
    #[arg(long, value_name = "T")]
    target: Option<QueueTarget>,
    /// Keep printing new events until Ctrl-C
    #[arg(long)]
    follow: bool,
}

fn parse_since_arg(s: &str) -> Result<EventId, String> {
    parse_since(s).map_err(|e| e.to_string())
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.config.load_shared("events")?;
    runtime()?.block_on(async move {
        let store = open_store(&settings)?;
        if let Some(t) = args.target {
            super::target::require_declared(&store, &settings, t).await?;
        }
        let since = args.since.unwrap_or(EventId::ZERO);
        let mut seen = HashMap::new();
        loop {
            let events = crate::events::read_new(&store, since, &mut seen).await.map_err(|e| {
                anyhow::anyhow!("cannot read the event logs from {}: {e}", super::redis_location(&settings))
            })?;
            let mut out = std::io::stdout().lock();
            for e in events.iter().filter(|e| args.target.is_none_or(|t| e.log.target() == Some(t))) {
                writeln!(out, "{}", e.to_json())?;
            }
            out.flush()?;
            drop(out);
            if !args.follow {
                return anyhow::Ok(());
            }
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return anyhow::Ok(()),
                () = tokio::time::sleep(FOLLOW_EVERY) => {}
            }
        }
    })?;
    Ok(ExitCode::SUCCESS)
}
