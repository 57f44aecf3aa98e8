//! Every list of the sale's states kept outside the code is checked here against
//! `domain::SaleState` (the enum `/stats`, `vq stats`, `vq sale show` and `/metrics` name the
//! states by): the OpenAPI document's `saleState`, the shipped alert rule that stays quiet
//! while a sale holds admission on purpose, the README's `/metrics` table and the Grafana
//! dashboard. A new state (or phase) fails here until each of them names it.

use std::collections::BTreeSet;

use serde_json::Value;
use strum::VariantArray;
use vq::domain::SaleState;

const OPENAPI: &str = include_str!("../../../docs/openapi.json");
const ALERTS: &str = include_str!("../../../deploy/prometheus/alerts.yml");
const README: &str = include_str!("../../../README.md");
const DASHBOARD: &str = include_str!("../../../deploy/grafana/vq-dashboard.json");

fn names(states: impl IntoIterator<Item = SaleState>) -> BTreeSet<String> {
    states.into_iter().map(|s| s.as_str().to_owned()).collect()
}

/// The `state` label values of `virtual_queue_sale_state`, as `/metrics` writes them.
fn labels() -> Vec<&'static str> {
    vq::metrics::sale_state_labels().map(vq::metrics::sale_state_label).collect()
}

#[test]
fn the_openapi_document_names_every_sale_state_and_no_other() {
    let doc: Value = serde_json::from_str(OPENAPI).unwrap();
    let documented: BTreeSet<String> = doc["components"]["schemas"]["Stats"]["properties"]["saleState"]["enum"]
        .as_array()
        .expect("Stats.saleState has an enum")
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(documented, names(SaleState::VARIANTS.iter().copied()), "docs/openapi.json's Stats.saleState");
}

/// VirtualQueueAdmissionSlow stays quiet while the sale admits nobody on purpose, as
/// `vq stats`' RATE_UNDER_50 does (`SaleState::holds_admission_on_purpose`).
#[test]
fn the_alert_rules_hold_quiet_in_the_states_that_hold_admission_on_purpose() {
    let matchers: Vec<&str> = ALERTS.split("virtual_queue_sale_state{state=~\"").skip(1).collect();
    assert!(!matchers.is_empty(), "deploy/prometheus/alerts.yml no longer matches virtual_queue_sale_state by state");
    let held = names(SaleState::VARIANTS.iter().copied().filter(|s| s.holds_admission_on_purpose()));
    for m in matchers {
        let listed: BTreeSet<String> = m[..m.find('"').unwrap()].split('|').map(str::to_owned).collect();
        assert_eq!(listed, held, "deploy/prometheus/alerts.yml: the states a sale holds admission in on purpose");
    }
}

#[test]
fn the_readme_and_the_dashboard_name_every_state_label() {
    let labels = labels();
    assert_eq!(labels.len(), SaleState::VARIANTS.len() + 1, "none, then every state: {labels:?}");
    let row = README
        .lines()
        .find(|l| l.starts_with("| `virtual_queue_sale_state{"))
        .expect("README's /metrics table has a row for virtual_queue_sale_state");
    for label in &labels {
        assert!(row.contains(&format!("`{label}`")), "README's virtual_queue_sale_state row lacks `{label}`: {row}");
    }
    let others = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"];
    let others = format!("the other {}", others[labels.len() - 1]);
    assert!(row.contains(&others), "README's virtual_queue_sale_state row should say \"{others}\": {row}");

    let dashboard: Value = serde_json::from_str(DASHBOARD).unwrap();
    let panel = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["title"] == "Sale state")
        .expect("the dashboard has a Sale state panel");
    let description = panel["description"].as_str().unwrap();
    for label in &labels {
        assert!(description.contains(label), "the Sale state panel's description lacks {label}: {description}");
    }
}
