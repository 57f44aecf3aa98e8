//! `vq fleet [--json] [--check]`: the serving instances side by side, from their reports
//! (`store::FleetOps`): what each declares, and every setting on which they disagree
//! (DRIFT), naming the instances on each side. `--check` exits 1 on drift, for deploy
//! pipelines.

use std::process::ExitCode;

use serde::Serialize;

use super::{ConfigArg, runtime};
use crate::app::open_store;
use crate::domain::{Drift, InstanceReport, drift};

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  vq fleet\n  vq fleet --check     # exit 1 when the instances disagree on a setting\n  vq fleet --json | jq '.drift'"
)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArg,
    /// Print JSON
    #[arg(long)]
    json: bool,
    /// Exit 1 when the live instances disagree on a setting that must agree
    #[arg(long)]
    check: bool,
}

/// One setting in drift, as printed: each value and who holds it.
#[derive(Debug, Serialize)]
pub struct DriftRow {
    pub setting: String,
    pub sides: Vec<DriftSide>,
}

#[derive(Debug, Serialize)]
pub struct DriftSide {
    pub value: String,
    pub instances: Vec<String>,
}

impl From<Drift> for DriftRow {
    fn from(d: Drift) -> Self {
        Self {
            setting: d.setting,
            sides: d.sides.into_iter().map(|(value, instances)| DriftSide { value, instances }).collect(),
        }
    }
}

impl DriftRow {
    /// `token.key_ids: 1a2b… on vq-a; 3c4d… on vq-b`.
    pub fn describe(&self) -> String {
        let sides: Vec<String> =
            self.sides.iter().map(|s| format!("{} on {}", s.value, s.instances.join(", "))).collect();
        format!("{}: {}", self.setting, sides.join("; "))
    }
}

/// The drift among `reports`, as printed.
pub fn drift_rows(reports: &[InstanceReport]) -> Vec<DriftRow> {
    drift(reports).into_iter().map(DriftRow::from).collect()
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let settings = args.config.load_shared("fleet")?;
    runtime()?.block_on(async move {
        let store = open_store(&settings)?;
        let reports = super::target::fleet(&store).await?;
        let drift = drift_rows(&reports);
        if args.json {
            let instances: Vec<_> = reports
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "instance": r.instance,
                        "types": r.types.iter().map(|t| t.slug().to_string()).collect::<Vec<_>>(),
                        "declared": r.declared.listed.iter().map(|t| format!("{}:{}", t.kind.slug(), t.id)).collect::<Vec<_>>(),
                        "ranges": r.declared.ranges.iter().map(ToString::to_string).collect::<Vec<_>>(),
                        "settings": r.settings,
                    })
                })
                .collect();
            println!("{}", serde_json::json!({ "instances": instances, "drift": drift }));
        } else {
            print_text(&reports, &drift);
        }
        let code = if args.check && !drift.is_empty() { ExitCode::FAILURE } else { ExitCode::SUCCESS };
        anyhow::Ok(code)
    })
}

fn print_text(reports: &[InstanceReport], drift: &[DriftRow]) {
    if reports.is_empty() {
        println!("no serving instance reports to this Redis (vq serve reports itself every few seconds)");
        return;
    }
    println!(
        "{} serving instance(s): {}",
        reports.len(),
        reports.iter().map(|r| r.instance.as_str()).collect::<Vec<_>>().join(", ")
    );
    for r in reports {
        println!("\n{}", r.instance);
        let declared: Vec<String> = r
            .declared
            .listed
            .iter()
            .map(|t| format!("{}:{}", t.kind.slug(), t.id))
            .chain(r.declared.ranges.iter().map(ToString::to_string))
            .collect();
        println!(
            "  declares                 {}",
            if declared.is_empty() { "-".to_owned() } else { declared.join(" ") }
        );
        for (k, v) in &r.settings {
            let marker = if drift.iter().any(|d| d.setting == *k) { "  DRIFT" } else { "" };
            println!("  {k:<24} {v}{marker}");
        }
    }
    println!();
    if drift.is_empty() {
        println!("no drift: every instance holds the same settings");
    } else {
        for d in drift {
            println!("DRIFT {}", d.describe());
        }
    }
}
