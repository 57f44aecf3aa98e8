//! The `virtual-queue.enabled` flag: global on/off, canary percentage, per-target overrides.
//!
//! The queue and the gate call [`FlagState::applies`] with the same user and target, so they
//! always agree on whether a user goes through the queue.

use std::collections::{BTreeMap, HashMap};

use super::{QueueTarget, UserId};

/// A per-target setting that wins over the global one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetOverride {
    Off,
    On { percent: u8 },
}

/// The flag as stored in Redis (one hash) and cached by every instance.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlagState {
    pub enabled: bool,
    /// Share of users (by a stable hash of the user id) that go through the queue, 0–100.
    pub percent: u8,
    pub overrides: BTreeMap<QueueTarget, TargetOverride>,
    /// Bumped by every change, so instances can say which change they applied.
    pub version: u64,
    /// The proof-of-work difficulty set at runtime (`vq pow set`), over `entry.pow_bits`.
    pub pow_bits: Option<u8>,
}

/// One operator change to the flag (`vq flag on | off | clear`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagChange {
    /// The queue on for this share of users, for every target without an override.
    On { percent: u8 },
    /// The rollback: the queue off everywhere. Every target override goes in the same write,
    /// so no target stays queued.
    Off,
    /// A per-target override that wins over the global setting.
    Target(QueueTarget, TargetOverride),
    /// Removes a per-target override: the target follows the global setting again.
    ClearTarget(QueueTarget),
    /// The proof-of-work difficulty at entry (`None`: back to `entry.pow_bits`).
    Pow(Option<u8>),
}

/// The hash fields one change writes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlagFields {
    pub set: Vec<(String, String)>,
    pub delete: Vec<String>,
    /// Delete every `target:*` field too.
    pub clear_overrides: bool,
}

impl FlagChange {
    pub fn fields(self) -> FlagFields {
        match self {
            FlagChange::On { percent } => FlagFields {
                set: vec![("enabled".into(), "1".into()), ("percent".into(), percent.min(100).to_string())],
                ..Default::default()
            },
            FlagChange::Off => {
                FlagFields { set: vec![("enabled".into(), "0".into())], clear_overrides: true, ..Default::default() }
            }
            FlagChange::Target(t, o) => FlagFields { set: vec![FlagState::override_field(t, o)], ..Default::default() },
            FlagChange::ClearTarget(t) => FlagFields { delete: vec![override_key(t)], ..Default::default() },
            FlagChange::Pow(Some(bits)) => {
                FlagFields { set: vec![("pow_bits".into(), bits.to_string())], ..Default::default() }
            }
            FlagChange::Pow(None) => FlagFields { delete: vec!["pow_bits".into()], ..Default::default() },
        }
    }
}

/// The stable bucket of a user, 0–99: FNV-1a over the user id's characters (for an integer
/// id, its decimal digits). Every instance and
/// every language computes the same bucket for the same user.
pub fn user_bucket(user: &UserId) -> u8 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in user.as_str().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % 100) as u8
}

impl FlagState {
    /// Whether this user goes through the queue (and the gate) for this target.
    pub fn applies(&self, target: QueueTarget, user: &UserId) -> bool {
        let percent = match self.overrides.get(&target) {
            Some(TargetOverride::Off) => return false,
            Some(TargetOverride::On { percent }) => *percent,
            None if self.enabled => self.percent,
            None => return false,
        };
        user_bucket(user) < percent
    }

    /// Whether the queue applies to at least some users of this target.
    pub fn may_apply(&self, target: QueueTarget) -> bool {
        match self.overrides.get(&target) {
            Some(TargetOverride::Off) => false,
            Some(TargetOverride::On { percent }) => *percent > 0,
            None => self.enabled && self.percent > 0,
        }
    }

    /// Whether the queue is on for at least some users of this target (the pump still runs
    /// for every active target; this is for display).
    pub fn describe(&self, target: Option<QueueTarget>) -> String {
        let global = if self.enabled { format!("on {}%", self.percent) } else { "off".to_owned() };
        match target.and_then(|t| self.overrides.get(&t)) {
            Some(TargetOverride::Off) => "off (target override)".to_owned(),
            Some(TargetOverride::On { percent }) => format!("on {percent}% (target override)"),
            None => global,
        }
    }

    /// One line for logs and the operator: "on 100%, 2 target override(s)".
    pub fn summary(&self) -> String {
        let global = if self.enabled { format!("on {}%", self.percent) } else { "off".to_owned() };
        match self.overrides.len() {
            0 => global,
            n => format!("{global}, {n} target override(s)"),
        }
    }

    /// Reads the flag from the fields of its Redis hash. Unknown or malformed fields are
    /// ignored so that a hand edit cannot take every instance down.
    pub fn from_fields(fields: &HashMap<String, String>) -> Self {
        let mut state = FlagState {
            enabled: fields.get("enabled").is_some_and(|v| v == "1"),
            percent: fields.get("percent").and_then(|v| v.parse::<u8>().ok()).map_or(100, |p| p.min(100)),
            version: fields.get("version").and_then(|v| v.parse().ok()).unwrap_or(0),
            overrides: BTreeMap::new(),
            pow_bits: fields.get("pow_bits").and_then(|v| v.parse::<u8>().ok()).map(|b| b.min(32)),
        };
        for (k, v) in fields {
            let Some(target) = k.strip_prefix("target:").and_then(|t| t.parse().ok()) else {
                continue;
            };
            if let Some(o) = parse_override(v) {
                state.overrides.insert(target, o);
            }
        }
        state
    }

    /// The hash field and value that store an override.
    pub fn override_field(target: QueueTarget, o: TargetOverride) -> (String, String) {
        let value = match o {
            TargetOverride::Off => "off".to_owned(),
            TargetOverride::On { percent } => format!("on:{percent}"),
        };
        (override_key(target), value)
    }
}

fn override_key(target: QueueTarget) -> String {
    format!("target:{target}")
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
    fn off_by_default() {
        assert!(!FlagState::default().applies(t(1), &UserId::from(1)));
    }

    #[test]
    fn canary_takes_about_the_given_share_of_users() {
        let f = FlagState { enabled: true, percent: 50, ..Default::default() };
        let inside = (1..=10_000).filter(|u| f.applies(t(1), &UserId::from(*u))).count();
        assert!((4_500..=5_500).contains(&inside), "{inside}");
        let all = FlagState { enabled: true, percent: 100, ..Default::default() };
        assert!((1..=1000).all(|u| all.applies(t(1), &UserId::from(u))));
    }

    #[test]
    fn target_override_wins_over_global() {
        let mut f = FlagState { enabled: true, percent: 100, ..Default::default() };
        f.overrides.insert(t(2), TargetOverride::Off);
        assert!(f.applies(t(1), &UserId::from(5)));
        assert!(!f.applies(t(2), &UserId::from(5)));
        let mut g = FlagState::default();
        g.overrides.insert(t(3), TargetOverride::On { percent: 100 });
        assert!(g.applies(t(3), &UserId::from(5)));
        assert!(!g.applies(t(1), &UserId::from(5)));
    }

    #[test]
    fn round_trips_through_hash_fields() {
        let mut fields = HashMap::new();
        fields.insert("enabled".into(), "1".into());
        fields.insert("percent".into(), "30".into());
        fields.insert("version".into(), "9".into());
        let (k, v) = FlagState::override_field(t(4), TargetOverride::On { percent: 10 });
        fields.insert(k, v);
        fields.insert("target:garbage".into(), "on:5".into());
        let f = FlagState::from_fields(&fields);
        assert!(f.enabled);
        assert_eq!(f.percent, 30);
        assert_eq!(f.version, 9);
        assert_eq!(f.overrides.get(&t(4)), Some(&TargetOverride::On { percent: 10 }));
        assert_eq!(f.overrides.len(), 1);
    }

    #[test]
    fn off_clears_every_override_and_clear_removes_one() {
        let off = FlagChange::Off.fields();
        assert!(off.clear_overrides);
        assert_eq!(off.set, vec![("enabled".to_owned(), "0".to_owned())]);
        let clear = FlagChange::ClearTarget(t(42)).fields();
        assert_eq!(clear.delete, vec!["target:LIMITED_DROP:42".to_owned()]);
        assert!(!clear.clear_overrides && clear.set.is_empty());
        assert!(!FlagChange::On { percent: 10 }.fields().clear_overrides);
    }

    #[test]
    fn bucket_is_stable() {
        // Pinned values (FNV-1a 64 of the decimal id, mod 100, computed independently):
        // changing the hash would move users in and out of a running canary.
        let users = [1, 2, 3, 4, 5, 42, 1_000_000, u64::MAX];
        let buckets: Vec<u8> = users.iter().map(|u| user_bucket(&UserId::from(*u))).collect();
        assert_eq!(buckets, [68, 1, 90, 35, 24, 91, 96, 60]);
    }
}
