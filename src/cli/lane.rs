//! `vq lane add | list | remove | codes import | codes export | claim`: a target's lanes at
//! runtime (a presale, members first), the access codes that let buyers into them, and a
//! signed lane claim as the shop would make one.

use std::io::Read;
use std::process::ExitCode;

use clap::Subcommand;

use super::{ConfigArg, runtime};
use crate::app::open_store;
use crate::domain::{Lane, LaneName, MAX_LANES, QueueTarget, UserId};
use crate::store::AnyStore;

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  vq lane add limited-drop:42 members --share 70 --opens-before 3600\n  vq lane list \
                     limited-drop:42\n  vq lane codes import limited-drop:42 members --uses 1 < codes.txt\n  vq lane \
                     codes export limited-drop:42\n  vq lane remove limited-drop:42 members\n\nLanes may also be \
                     configured per type: [[targets.types.lanes]] name = \"members\", share = 70.\nInstances and \
                     pumps take a lane added or removed here in within flag.refresh_ms (pumps: by the next tick)."
)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
    #[command(flatten)]
    config: ConfigArg,
}

#[derive(Subcommand)]
enum Action {
    /// Add a lane to a target, or change its share or opening
    Add {
        /// e.g. limited-drop:42
        target: QueueTarget,
        /// 1 to 14 of a-z, 0-9 and -
        lane: String,
        /// Percent of each batch while the lane has users waiting (1 to 99); the public lane
        /// has what the lanes leave
        #[arg(long)]
        share: u64,
        /// Seconds before the sale's opening the lane opens (a presale); 0: with the public
        #[arg(long, default_value_t = 0)]
        opens_before: u64,
    },
    /// List a target's lanes: share, opening, users waiting and pre-queued, codes
    List {
        target: QueueTarget,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Remove a lane added at runtime; refused while users wait or are pre-queued in it
    Remove { target: QueueTarget, lane: String },
    /// Access codes: import (one code per line on stdin), export (hashes and uses left)
    Codes {
        #[command(subcommand)]
        action: CodesAction,
    },
    /// Print a signed lane claim for a user (what the shop's side computes; the key is the
    /// type's lane_secret_env)
    Claim {
        target: QueueTarget,
        lane: String,
        /// The user the claim is for
        #[arg(long)]
        user: UserId,
        /// Seconds the claim is valid
        #[arg(long, default_value_t = 600)]
        ttl: u64,
    },
}

#[derive(Subcommand)]
enum CodesAction {
    /// Import codes for a lane from stdin, one per line (blank lines skipped); stored hashed
    Import {
        target: QueueTarget,
        lane: String,
        /// Users each code lets in (1: single-use)
        #[arg(long, default_value_t = 1)]
        uses: u64,
    },
    /// Print every code's hash, lane, uses left and users bound (never the codes)
    Export {
        target: QueueTarget,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
}

fn lane_name(s: &str) -> anyhow::Result<LaneName> {
    s.parse().map_err(|e: crate::domain::BadLaneName| anyhow::anyhow!("{e}"))
}

fn store_err(what: &str) -> impl FnOnce(crate::store::StoreError) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("cannot {what}: {e}")
}

/// The lane `name` of `target`, which must exist.
fn existing(store: &AnyStore, target: QueueTarget, name: &str) -> anyhow::Result<LaneName> {
    let lane = lane_name(name)?;
    if !store.lanes_of(target).iter().any(|l| l.name == lane) {
        let names: Vec<String> = store.lanes_of(target).iter().map(|l| l.name.to_string()).collect();
        anyhow::bail!(
            "{target} has no lane `{lane}` (lanes: {}): `vq lane add` adds one",
            if names.is_empty() { "none".to_owned() } else { names.join(", ") }
        );
    }
    Ok(lane)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.config.load_shared("lane")?;
    runtime()?.block_on(async move {
        let store = open_store(&settings)?;
        store.refresh_lanes().await.map_err(store_err("read the lanes"))?;
        match args.action {
            Action::Add { target, lane, share, opens_before } => {
                super::target::require_declared(&store, &settings, target).await?;
                let name = lane_name(&lane)?;
                if !(1..=99).contains(&share) {
                    anyhow::bail!("--share must be between 1 and 99 (percent of each batch), got {share}");
                }
                let others: Vec<Lane> = store.lanes_of(target).into_iter().filter(|l| l.name != name).collect();
                let total = others.iter().map(|l| u64::from(l.share)).sum::<u64>() + share;
                if total > 99 {
                    anyhow::bail!(
                        "the lanes of {target} would share {total} % of each batch; at most 99, so the public lane \
                         keeps a share (`vq lane list {}` shows them)",
                        target
                    );
                }
                if others.len() >= MAX_LANES {
                    anyhow::bail!("{target} has {MAX_LANES} lanes already, the most a target may have");
                }
                let lane = Lane { name, share: share as u32, opens_before_s: opens_before };
                store.put_lane(target, lane).await.map_err(store_err("add the lane"))?;
                let scheduled = store.schedule_lane(target, name).await.map_err(store_err("schedule the lane"))?;
                println!(
                    "{target}: lane {name} takes {share} % of each batch while its users wait{}{}",
                    if opens_before > 0 { format!(", opening {opens_before} s before the sale") } else { String::new() },
                    if scheduled { " (scheduled with the sale)" } else { "" }
                );
            }
            Action::List { target, json } => list(&store, target, json).await?,
            Action::Remove { target, lane } => {
                let name = lane_name(&lane)?;
                if settings.type_lanes(target.kind).iter().any(|l| l.name == name) {
                    anyhow::bail!(
                        "lane {name} of {target} is configured (targets.types.{}.lanes): remove it there",
                        target.kind.slug()
                    );
                }
                let name = existing(&store, target, &lane)?;
                let (waiting, prequeued) = store.lane_holds(target, name).await.map_err(store_err("read the lane"))?;
                if waiting + prequeued > 0 {
                    anyhow::bail!(
                        "lane {name} of {target} holds {waiting} waiting and {prequeued} pre-queued users: nothing \
                         changed; remove it once they are admitted or gone"
                    );
                }
                store.drop_lane(target, name).await.map_err(store_err("remove the lane"))?;
                println!("{target}: lane {name} removed; its codes are refused from now on");
            }
            Action::Codes { action: CodesAction::Import { target, lane, uses } } => {
                let lane = existing(&store, target, &lane)?;
                if uses == 0 {
                    anyhow::bail!("--uses must be at least 1");
                }
                let mut text = String::new();
                std::io::stdin().read_to_string(&mut text)?;
                let mut hashes = Vec::new();
                for (i, line) in text.lines().enumerate() {
                    let code = line.trim();
                    if code.is_empty() {
                        continue;
                    }
                    if !crate::lane::is_code(code) {
                        anyhow::bail!(
                            "line {}: a code is 1 to {} visible ASCII characters: nothing imported",
                            i + 1,
                            crate::lane::MAX_CODE_LEN
                        );
                    }
                    hashes.push(crate::lane::code_hash(target, code));
                }
                if hashes.is_empty() {
                    anyhow::bail!("no codes on stdin (one per line): nothing imported");
                }
                let new = store.import_codes(target, lane, &hashes, uses).await.map_err(store_err("import"))?;
                println!("{target}: {} codes for lane {lane} ({new} new), {uses} use(s) each", hashes.len());
            }
            Action::Codes { action: CodesAction::Export { target, json } } => {
                let codes = store.export_codes(target).await.map_err(store_err("read the codes"))?;
                if json {
                    let rows: Vec<serde_json::Value> = codes
                        .iter()
                        .map(|(h, l, left, bound)| serde_json::json!({"hash": h, "lane": l, "usesLeft": left, "users": bound}))
                        .collect();
                    println!("{}", serde_json::Value::Array(rows));
                } else {
                    println!("{:<64}  {:<16} {:>9} {:>6}", "HASH (sha-256 of target and code)", "LANE", "USES LEFT", "USERS");
                    for (h, l, left, bound) in codes {
                        println!("{h:<64}  {l:<16} {left:>9} {bound:>6}");
                    }
                }
            }
            Action::Claim { target, lane, user, ttl } => {
                let lane = lane_name(&lane)?;
                let Some(key) = settings.type_lane_secret(target.kind) else {
                    anyhow::bail!(
                        "targets.types.{}.lane_secret_env is not set, or its variable is empty: no key to sign with",
                        target.kind.slug()
                    );
                };
                let expires = store.now_ms() / 1000 + ttl;
                println!("{}", crate::lane::sign_claim(&key, target, lane, &user, expires));
            }
        }
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

async fn list(store: &AnyStore, target: QueueTarget, json: bool) -> anyhow::Result<()> {
    let lanes = store.lanes_of(target);
    let public_share = 100u32.saturating_sub(lanes.iter().map(|l| l.share).sum::<u32>()).max(1);
    let mut rows = vec![(LaneName::PUBLIC, public_share, 0u64)];
    rows.extend(lanes.iter().map(|l| (l.name, l.share, l.opens_before_s)));
    let mut out = Vec::new();
    for (name, share, before) in rows {
        let (waiting, prequeued) = store.lane_holds(target, name).await.map_err(store_err("read the lane"))?;
        out.push((name, share, before, waiting, prequeued));
    }
    if json {
        let rows: Vec<serde_json::Value> = out
            .iter()
            .map(|(n, s, b, w, p)| {
                serde_json::json!({"lane": n.shown(), "share": s, "opensBeforeS": b, "waiting": w, "prequeued": p})
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    println!("{target}");
    println!("  {:<32} {:>6} {:>13} {:>8} {:>10}", "LANE", "SHARE", "OPENS BEFORE", "WAITING", "PRE-QUEUED");
    for (n, s, b, w, p) in out {
        println!("  {:<32} {:>5}% {:>12}s {w:>8} {p:>10}", n.shown(), s, b);
    }
    Ok(())
}
