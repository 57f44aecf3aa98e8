//! How the flag is stored in Redis: the hash `virtual-queue:flag` with the fields `enabled`
//! (`1` / `0`), `percent`, `version`, `pow_bits` and one `target:TYPE:id` per override (`off`
//! or `on:percent`), read here and written by `flag_set.lua` from [`FlagFields`]. The only
//! place that names these fields.

use std::collections::{BTreeMap, HashMap};

use crate::domain::{FlagChange, FlagState, QueueTarget, TargetOverride};

/// The prefix of an override's field; `flag_set.lua` deletes every field with it on `Off`.
const OVERRIDE_PREFIX: &str = "target:";

/// The hash fields one change writes: `flag_set.lua`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct FlagFields {
    pub(super) set: Vec<(String, String)>,
    pub(super) delete: Vec<String>,
    /// Delete every `target:*` field too.
    pub(super) clear_overrides: bool,
}

/// The fields `change` writes (the version is `flag_set.lua`'s).
pub(super) fn encode_change(change: FlagChange) -> FlagFields {
    let set = |pairs: &[(&str, String)]| FlagFields {
        set: pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect(),
        ..FlagFields::default()
    };
    match change {
        FlagChange::On { percent } => set(&[("enabled", "1".into()), ("percent", percent.min(100).to_string())]),
        FlagChange::Off => FlagFields { clear_overrides: true, ..set(&[("enabled", "0".into())]) },
        FlagChange::Target(t, o) => {
            FlagFields { set: vec![(override_key(t), override_value(o))], ..FlagFields::default() }
        }
        FlagChange::ClearTarget(t) => FlagFields { delete: vec![override_key(t)], ..FlagFields::default() },
        FlagChange::Pow(Some(bits)) => set(&[("pow_bits", bits.to_string())]),
        FlagChange::Pow(None) => FlagFields { delete: vec!["pow_bits".into()], ..FlagFields::default() },
    }
}

/// Reads the flag from the fields of its hash. Unknown or malformed fields are ignored so
/// that a hand edit cannot take every instance down; absent ones read as
/// [`FlagState::blank`]'s.
pub(super) fn decode_flag(fields: &HashMap<String, String>) -> FlagState {
    let blank = FlagState::blank();
    let mut overrides = BTreeMap::new();
    for (k, v) in fields {
        let Some(target) = k.strip_prefix(OVERRIDE_PREFIX).and_then(|t| t.parse().ok()) else {
            continue;
        };
        if let Some(o) = parse_override(v) {
            overrides.insert(target, o);
        }
    }
    FlagState {
        enabled: fields.get("enabled").is_some_and(|v| v == "1"),
        percent: fields.get("percent").and_then(|v| v.parse::<u8>().ok()).map_or(blank.percent, |p| p.min(100)),
        version: fields.get("version").and_then(|v| v.parse().ok()).unwrap_or(blank.version),
        overrides,
        pow_bits: fields.get("pow_bits").and_then(|v| v.parse::<u8>().ok()).map(|b| b.min(32)),
    }
}

fn override_key(target: QueueTarget) -> String {
    format!("{OVERRIDE_PREFIX}{target}")
}

fn override_value(o: TargetOverride) -> String {
    match o {
        TargetOverride::Off => "off".to_owned(),
        TargetOverride::On { percent } => format!("on:{percent}"),
    }
}

fn parse_override(v: &str) -> Option<TargetOverride> {
    if v == "off" {
        return Some(TargetOverride::Off);
    }
    let p = v.strip_prefix("on:")?.parse::<u8>().ok()?;
    Some(TargetOverride::On { percent: p.min(100) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::QueueTargetType;

    fn t(id: u64) -> QueueTarget {
        QueueTarget::new(QueueTargetType::LIMITED_DROP, id)
    }

    #[test]
    fn round_trips_through_hash_fields() {
        let mut fields = HashMap::new();
        fields.insert("enabled".into(), "1".into());
        fields.insert("percent".into(), "30".into());
        fields.insert("version".into(), "9".into());
        let written = encode_change(FlagChange::Target(t(4), TargetOverride::On { percent: 10 }));
        fields.extend(written.set);
        fields.insert("target:garbage".into(), "on:5".into());
        let f = decode_flag(&fields);
        assert!(f.enabled);
        assert_eq!(f.percent, 30);
        assert_eq!(f.version, 9);
        assert_eq!(f.overrides.get(&t(4)), Some(&TargetOverride::On { percent: 10 }));
        assert_eq!(f.overrides.len(), 1);
    }

    #[test]
    fn off_clears_every_override_and_clear_removes_one() {
        let off = encode_change(FlagChange::Off);
        assert!(off.clear_overrides);
        assert_eq!(off.set, vec![("enabled".to_owned(), "0".to_owned())]);
        let clear = encode_change(FlagChange::ClearTarget(t(42)));
        assert_eq!(clear.delete, vec!["target:LIMITED_DROP:42".to_owned()]);
        assert!(!clear.clear_overrides && clear.set.is_empty());
        assert!(!encode_change(FlagChange::On { percent: 10 }).clear_overrides);
    }

    /// Every change read back from its fields is the change the domain applies
    /// (`FlagState::apply`, which the embedded store keeps typed).
    #[test]
    fn a_change_reads_back_as_the_domain_applies_it() {
        let changes = [
            FlagChange::Target(t(1), TargetOverride::On { percent: 120 }),
            FlagChange::Pow(Some(40)),
            FlagChange::On { percent: 30 },
            FlagChange::Target(t(2), TargetOverride::Off),
            FlagChange::ClearTarget(t(1)),
            FlagChange::Pow(None),
            FlagChange::Off,
            FlagChange::On { percent: 200 },
        ];
        let mut fields: HashMap<String, String> = HashMap::new();
        let mut typed = FlagState::blank();
        for change in changes {
            let written = encode_change(change);
            if written.clear_overrides {
                fields.retain(|k, _| !k.starts_with(OVERRIDE_PREFIX));
            }
            fields.extend(written.set);
            for k in written.delete {
                fields.remove(&k);
            }
            typed.apply(change);
            assert_eq!(decode_flag(&fields), typed, "after {change:?}");
        }
    }
}
