//! `vq flag status | on [--percent N] [--target T] | off [--target T] | clear --target T`.

use std::process::ExitCode;

use std::time::{Duration, Instant};

use clap::Subcommand;
use comfy_table::Table;

use super::redis_location;
use super::{ConfigArg, runtime};
use crate::app::{FLAG_ACK_TTL_MS, open_store};
use crate::clock::now_epoch_ms;
use crate::domain::{FlagChange, FlagState, QueueTarget, TargetOverride};
use crate::store::prelude::*;
use crate::store::{AnyStore, FlagAck};

#[derive(clap::Args)]
#[command(after_help = "Examples:
  vq flag status [--json]
  vq flag on                      # every user goes through the queue
  vq flag on --percent 10         # canary: 10 % of users
  vq flag off --target limited-drop:42
  vq flag clear --target limited-drop:42
  vq flag off                     # rollback: no target queued on any instance within 3 s

Exit status of on/off/clear: 0 when every live instance applied the change; 1 when one did
not, when no instance is live to acknowledge it (the change is written all the same), or on
an error.")]
pub struct Args {
    #[command(subcommand)]
    action: Action,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Subcommand)]
enum Action {
    /// Show the flag as stored in Redis, its target overrides, and what each instance applies
    Status {
        /// One JSON object: the stored flag (null when its hash is missing), whether instances
        /// keep a lost flag, and each instance's acknowledgement
        #[arg(long)]
        json: bool,
    },
    /// Turn the queue on, for everyone or a canary share, globally or for one target
    On {
        /// Share of users (0–100) that go through the queue
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u8).range(0..=100))]
        percent: u8,
        /// Only this target (an override that wins over the global setting), e.g. limited-drop:42
        #[arg(long, value_name = "T")]
        target: Option<QueueTarget>,
    },
    /// Turn the queue off: without --target everywhere, removing every target override
    Off {
        /// Only this target (an override that wins over the global setting), e.g. limited-drop:42;
        /// a later global `vq flag off` removes it
        #[arg(long, value_name = "T")]
        target: Option<QueueTarget>,
    },
    /// Remove one target's override: the target follows the global setting again
    Clear {
        /// The target whose override goes, e.g. limited-drop:42
        #[arg(long, value_name = "T")]
        target: QueueTarget,
    },
}

/// A flag change takes effect on every instance within 3 s.
const CONFIRM_WITHIN: Duration = Duration::from_secs(3);

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.config.load_shared("flag")?;
    let location = redis_location(&settings);
    runtime()?.block_on(async move {
        let store = open_store(&settings)?;
        if let Action::On { target: Some(t), .. } | Action::Off { target: Some(t) } = &args.action {
            super::target::require_declared(&store, &settings, *t).await?;
        }
        let stored =
            store.read_stored_flag().await.map_err(|e| anyhow::anyhow!("cannot reach Redis at {location}: {e}"))?;
        let live = store.flag_acks().await.map_err(|e| anyhow::anyhow!("cannot read acknowledgements: {e}"))?;
        let kept = stored.is_none() && live.iter().any(|a| a.kept_missing && a.silent_ms.is_none());
        let change = match args.action {
            Action::Status { json } => {
                // The instances' settings side by side: drift is named here too (`vq fleet`).
                let drift = super::fleet::drift_rows(&super::target::fleet(&store).await?);
                if json {
                    let mut out = status_json(stored.as_ref(), &live);
                    out["drift"] = serde_json::to_value(&drift)?;
                    println!("{out}");
                } else {
                    print_status(stored.as_ref(), &live);
                    for d in &drift {
                        println!("DRIFT {} (vq fleet)", d.describe());
                    }
                }
                return Ok(ExitCode::SUCCESS);
            }
            Action::On { percent, target: None } => FlagChange::On { percent },
            Action::On { percent, target: Some(t) } => FlagChange::Target(t, TargetOverride::On { percent }),
            Action::Off { target: None } => FlagChange::Off,
            Action::Off { target: Some(t) } => FlagChange::Target(t, TargetOverride::Off),
            Action::Clear { target } => {
                if !stored.as_ref().is_some_and(|f| f.overrides.contains_key(&target)) {
                    println!("{target} has no override: nothing to remove (writing anyway, so instances confirm)");
                }
                FlagChange::ClearTarget(target)
            }
        };
        if kept && matches!(change, FlagChange::Target(..) | FlagChange::ClearTarget(_)) {
            // A hash holding only this override would read as "global off" on every instance.
            anyhow::bail!(
                "the flag hash is missing from Redis and instances keep their last known flag: nothing written. \
                 Write the global flag first (`vq flag on [--percent N]` or `vq flag off`), then the override"
            );
        }
        change_and_confirm(&store, change, live, kept, &location).await
    })
}

/// Writes the change, then waits up to [`CONFIRM_WITHIN`] for every instance that was live
/// (or became live) to acknowledge it, and prints who did.
pub(super) async fn change_and_confirm(
    store: &AnyStore,
    change: FlagChange,
    live: Vec<FlagAck>,
    kept: bool,
    location: &str,
) -> anyhow::Result<ExitCode> {
    let written_at = now_epoch_ms();
    let version = store.change_flag(change).await.map_err(|e| anyhow::anyhow!("cannot write the flag: {e}"))?;
    if kept {
        println!("the flag hash was missing from Redis; instances kept their last known flag until now");
    }
    println!("flag written: version {version}");
    match store.read_stored_flag().await.map_err(|e| anyhow::anyhow!("cannot read the flag back: {e}"))? {
        Some(flag) => print_flag(&flag),
        None => println!("the flag hash is missing again right after the write (is something deleting it?)"),
    }
    let deadline = Instant::now() + CONFIRM_WITHIN;
    let acks = loop {
        let acks = store.flag_acks().await.map_err(|e| anyhow::anyhow!("cannot read acknowledgements: {e}"))?;
        let rows = rows(&live, &acks);
        if rows.iter().all(|r| r.applied(version)) || Instant::now() >= deadline {
            break acks;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let rows = rows(&live, &acks);
    print_table(&rows, version, Some(written_at));
    if rows.iter().all(|r| r.ack.as_ref().is_none_or(|a| a.silent_ms.is_some())) {
        eprintln!(
            "error: no instance acknowledged version {version}: no vq instance is live on {location}. The \
             change IS written in Redis (instances apply it when they start); check that they use this Redis"
        );
        return Ok(ExitCode::FAILURE);
    }
    let laggards: Vec<&str> = rows.iter().filter(|r| !r.applied(version)).map(|r| r.instance.as_str()).collect();
    if laggards.is_empty() {
        println!("applied by all {} live instance(s)", rows.len());
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "error: version {version} is written but not applied within {} s by: {}",
            CONFIRM_WITHIN.as_secs(),
            laggards.join(", ")
        );
        Ok(ExitCode::FAILURE)
    }
}

/// One instance in the confirmation table: its acknowledgement now, if it still has one.
struct Row {
    instance: String,
    ack: Option<FlagAck>,
}

impl Row {
    /// [`FlagAck::applied`]; an instance whose acknowledgement expired has not.
    fn applied(&self, version: u64) -> bool {
        self.ack.as_ref().is_some_and(|a| a.applied(version))
    }
}

/// Every instance live before the write or acknowledging now: one that was live and whose
/// acknowledgement expired during the wait stays in the table, without one.
fn rows(before: &[FlagAck], now: &[FlagAck]) -> Vec<Row> {
    let mut names: Vec<&str> = before.iter().chain(now).map(|a| a.instance.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|n| Row { instance: n.to_owned(), ack: now.iter().find(|a| a.instance == n).cloned() })
        .collect()
}

/// `version`: the one each instance should apply; `written_at`: when it was written, for the
/// delay column (only right after a change).
fn print_table(rows: &[Row], version: u64, written_at: Option<u64>) {
    if rows.is_empty() {
        return;
    }
    let mut table = Table::new();
    table.load_style(comfy_table::presets::UTF8_BORDERS_ONLY);
    table.set_header(vec!["instance", "applied version", "flag in force", "delay", "state"]);
    for r in rows {
        let Some(a) = &r.ack else {
            let state = "NOT APPLIED (acknowledgement expired: stopped, or cut off from Redis)";
            table.add_row(vec![r.instance.clone(), "-".into(), "-".into(), "-".into(), state.into()]);
            continue;
        };
        let delay = match written_at {
            Some(w) if a.version >= version => format!("{} ms", a.applied_at_ms.saturating_sub(w)),
            _ => "-".to_owned(),
        };
        let state = match (a.kept_missing, a.version < version) {
            (true, _) => "KEEPS LAST KNOWN (flag hash missing)".to_owned(),
            (false, true) => "NOT APPLIED".to_owned(),
            (false, false) => "applied".to_owned(),
        };
        // Its acknowledgement expired: what it last said, and for how long it has said nothing.
        let state = match a.silent_ms {
            Some(ms) => format!(
                "{state}, SILENT for {} s (no acknowledgement: frozen, cut off from Redis, or stopped without a shutdown)",
                (ms + FLAG_ACK_TTL_MS) / 1000
            ),
            None => state,
        };
        let in_force = if a.state.is_empty() { "-".to_owned() } else { a.state.clone() };
        table.add_row(vec![r.instance.clone(), a.version.to_string(), in_force, delay, state]);
    }
    println!("{table}");
}

fn print_status(stored: Option<&FlagState>, acks: &[FlagAck]) {
    match stored {
        Some(flag) => print_flag(flag),
        None if acks.iter().any(|a| a.kept_missing) => {
            println!("virtual-queue.enabled: FLAG HASH MISSING from Redis (virtual-queue:flag)");
            println!("  instances that read it before keep their last known flag (table below); instances");
            println!("  starting now treat it as off. Re-assert it with `vq flag on` or `vq flag off`.");
            eprintln!("warning: the flag hash is missing from Redis; instances keep their last known flag");
        }
        None => println!("virtual-queue.enabled: off (never set: no flag hash in Redis)"),
    }
    let rows: Vec<Row> = acks.iter().map(|a| Row { instance: a.instance.clone(), ack: Some(a.clone()) }).collect();
    print_table(&rows, stored.map_or(0, |f| f.version), None);
}

fn status_json(stored: Option<&FlagState>, acks: &[FlagAck]) -> serde_json::Value {
    let flag = stored.map(|f| {
        let overrides: serde_json::Map<String, serde_json::Value> =
            f.overrides.iter().map(|(t, o)| (t.to_string(), override_text(*o).into())).collect();
        serde_json::json!({"enabled": f.enabled, "percent": f.percent, "version": f.version, "overrides": overrides})
    });
    let instances: Vec<serde_json::Value> = acks
        .iter()
        .map(|a| {
            serde_json::json!({
                "instance": a.instance,
                "version": a.version,
                "appliedAtMs": a.applied_at_ms,
                "keepsMissingFlag": a.kept_missing,
                "state": a.state,
                "silentMs": a.silent_ms.map(|ms| ms + FLAG_ACK_TTL_MS),
            })
        })
        .collect();
    serde_json::json!({
        "flag": flag,
        "missing": stored.is_none() && acks.iter().any(|a| a.kept_missing),
        "instances": instances,
    })
}

fn override_text(o: TargetOverride) -> String {
    match o {
        TargetOverride::Off => "off".to_owned(),
        TargetOverride::On { percent } => format!("on {percent}%"),
    }
}

fn print_flag(flag: &FlagState) {
    println!("virtual-queue.enabled: {} (version {})", flag.describe(None), flag.version);
    if flag.overrides.is_empty() {
        println!("target overrides: none");
        return;
    }
    println!("target overrides (win over the global setting; `vq flag clear --target T` removes one):");
    for (target, o) in &flag.overrides {
        println!("  {target}: {}", override_text(*o));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Settings;

    #[test]
    fn the_redis_location_loses_its_credentials() {
        let mut s = Settings::default();
        s.redis.url = "redis://:hunter2@10.0.0.1:6379/0".into();
        assert_eq!(redis_location(&s), "redis://:***@10.0.0.1:6379/0");
        s.redis.url = "rediss://app:p@ss@host".into();
        assert_eq!(redis_location(&s), "rediss://app:***@host");
        s.redis.url = "redis://127.0.0.1:6379".into();
        assert_eq!(redis_location(&s), "redis://127.0.0.1:6379");
        s.redis.cluster_nodes = Some("redis://:a@h:1,redis://u:b@g:2".into());
        assert_eq!(redis_location(&s), "cluster redis://:***@h:1,redis://u:***@g:2");
    }

    fn ack(instance: &str, version: u64) -> FlagAck {
        FlagAck {
            instance: instance.into(),
            version,
            applied_at_ms: 0,
            kept_missing: false,
            state: String::new(),
            silent_ms: None,
        }
    }

    #[test]
    fn an_instance_whose_acknowledgement_expired_stays_in_the_table() {
        let rows = rows(&[ack("a", 1), ack("b", 1)], &[ack("a", 2), ack("c", 2)]);
        let names: Vec<&str> = rows.iter().map(|r| r.instance.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(rows[0].applied(2) && !rows[1].applied(2) && rows[2].applied(2));
        assert!(rows[1].ack.is_none());
        let kept = FlagAck { kept_missing: true, ..ack("d", 9) };
        assert!(!super::rows(&[], &[kept])[0].applied(2), "keeping a lost flag is not applying a new one");
    }
}
