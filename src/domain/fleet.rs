//! The fleet as its serving instances describe themselves: each one's configured target
//! types and declarations, and the settings that must agree across a cluster; which instances
//! serve a target, and which settings disagree (drift).
//!
//! Pure: the reports are read from the store by the caller.

use std::collections::{BTreeMap, BTreeSet};

use super::declared::DeclaredTargets;
use super::target::{QueueTarget, QueueTargetType};

/// What one serving instance publishes about itself (`vq serve`, every few seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceReport {
    pub instance: String,
    /// Its configured target types (`targets.types`).
    pub types: Vec<QueueTargetType>,
    /// The targets its configuration declares (`targets.declared`, `targets.ranges`); runtime
    /// declarations are in the store already.
    pub declared: DeclaredTargets,
    /// Setting name → value as compared across instances. Never a secret: the token keys
    /// appear as key ids.
    pub settings: BTreeMap<String, String>,
}

/// One setting on which live instances disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    pub setting: String,
    /// Each value seen and the instances holding it, the most common value first.
    pub sides: Vec<(String, Vec<String>)>,
}

/// The value a report without a setting is compared with (an older vq that does not report it).
pub const UNREPORTED: &str = "(not reported)";

/// Every setting on which `reports` disagree, by name.
pub fn drift(reports: &[InstanceReport]) -> Vec<Drift> {
    let names: BTreeSet<&String> = reports.iter().flat_map(|r| r.settings.keys()).collect();
    let mut out = Vec::new();
    for name in names {
        let mut by_value: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for r in reports {
            let value = r.settings.get(name).map_or(UNREPORTED, String::as_str);
            by_value.entry(value).or_default().push(r.instance.clone());
        }
        if by_value.len() > 1 {
            let mut sides: Vec<(String, Vec<String>)> =
                by_value.into_iter().map(|(v, instances)| (v.to_owned(), instances)).collect();
            sides.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then_with(|| a.0.cmp(&b.0)));
            out.push(Drift { setting: name.clone(), sides });
        }
    }
    out
}

/// The instances whose configuration declares `target`.
pub fn served_by(reports: &[InstanceReport], target: QueueTarget) -> Vec<&str> {
    reports
        .iter()
        .filter(|r| r.types.contains(&target.kind) && r.declared.contains(target))
        .map(|r| r.instance.as_str())
        .collect()
}

/// Every target some instance's configuration declares.
pub fn fleet_declared(reports: &[InstanceReport]) -> DeclaredTargets {
    let mut out = DeclaredTargets::default();
    for r in reports {
        out.listed.extend(r.declared.listed.iter().filter(|t| r.types.contains(&t.kind)));
        for range in r.declared.ranges.iter().filter(|g| r.types.contains(&g.kind)) {
            if !out.ranges.contains(range) {
                out.ranges.push(*range);
            }
        }
    }
    out
}

/// Every target type some instance serves.
pub fn fleet_types(reports: &[InstanceReport]) -> BTreeSet<QueueTargetType> {
    reports.iter().flat_map(|r| r.types.iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(instance: &str, declared: &[&str], settings: &[(&str, &str)]) -> InstanceReport {
        InstanceReport {
            instance: instance.to_owned(),
            types: vec![QueueTargetType::parse_any("limited-drop").unwrap()],
            declared: DeclaredTargets {
                listed: declared.iter().map(|t| t.parse().unwrap()).collect(),
                ranges: vec!["limited-drop:1000-1999".parse().unwrap()],
            },
            settings: settings.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        }
    }

    #[test]
    fn drift_names_the_setting_and_each_side() {
        let a = report("vq-a", &["limited-drop:42"], &[("queue.tick_ms", "2000"), ("token.key_ids", "k1")]);
        let b = report("vq-b", &[], &[("queue.tick_ms", "2000"), ("token.key_ids", "k2")]);
        let c = report("vq-c", &[], &[("queue.tick_ms", "2000"), ("token.key_ids", "k2")]);
        let found = drift(&[a.clone(), b, c]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].setting, "token.key_ids");
        assert_eq!(found[0].sides[0], ("k2".to_owned(), vec!["vq-b".to_owned(), "vq-c".to_owned()]));
        assert_eq!(found[0].sides[1], ("k1".to_owned(), vec!["vq-a".to_owned()]));
        assert!(drift(&[a.clone(), a]).is_empty(), "identical instances do not drift");
    }

    #[test]
    fn a_setting_one_instance_does_not_report_is_drift() {
        let a = report("vq-a", &[], &[("queue.tick_ms", "2000")]);
        let b = report("vq-b", &[], &[]);
        let found = drift(&[a, b]);
        assert!(found[0].sides.contains(&(UNREPORTED.to_owned(), vec!["vq-b".to_owned()])), "{found:?}");
    }

    #[test]
    fn served_targets_are_those_an_instance_declares_of_its_types() {
        let a = report("vq-a", &["limited-drop:42", "ticketing-event:7"], &[]);
        let b = report("vq-b", &[], &[]);
        let reports = [a, b];
        assert_eq!(served_by(&reports, "limited-drop:42".parse().unwrap()), vec!["vq-a"]);
        assert_eq!(served_by(&reports, "limited-drop:1500".parse().unwrap()), vec!["vq-a", "vq-b"]);
        let all = fleet_declared(&reports);
        assert!(all.contains("limited-drop:42".parse().unwrap()));
        assert!(!all.contains("ticketing-event:7".parse().unwrap()), "not a type either instance serves");
        assert_eq!(all.ranges.len(), 1);
    }
}
