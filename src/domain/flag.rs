//! The `virtual-queue.enabled` flag: global on/off, canary percentage, per-target overrides.
//!
//! The queue and the gate call [`FlagState::applies`] with the same user and target, so they
//! always agree on whether a user goes through the queue.

use std::collections::BTreeMap;

use super::{QueueTarget, UserId};

/// A per-target setting that wins over the global one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetOverride {
    Off,
    On { percent: u8 },
}

/// The flag as the store keeps it (its stored form is `store::redis`'s) and every instance caches.
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
    /// What a first change starts from, and what a stored flag's absent settings read as:
    /// off, for every user once turned on, no override nor difficulty, version 0. (A flag
    /// that does not exist at all is [`FlagState::default`]: off, 0 %.)
    pub fn blank() -> Self {
        FlagState { percent: 100, ..FlagState::default() }
    }

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

    /// The flag after `change`, its version aside (the store sets it): what the stored form
    /// reads back as, shares within 0–100 and a difficulty within 0–32.
    pub fn apply(&mut self, change: FlagChange) {
        match change {
            FlagChange::On { percent } => {
                self.enabled = true;
                self.percent = percent.min(100);
            }
            FlagChange::Off => {
                self.enabled = false;
                self.overrides.clear();
            }
            FlagChange::Target(target, o) => {
                self.overrides.insert(target, o.bounded());
            }
            FlagChange::ClearTarget(target) => {
                self.overrides.remove(&target);
            }
            FlagChange::Pow(bits) => self.pow_bits = bits.map(|b| b.min(32)),
        }
    }
}

impl TargetOverride {
    /// The override with its share within 0–100.
    fn bounded(self) -> Self {
        match self {
            TargetOverride::Off => TargetOverride::Off,
            TargetOverride::On { percent } => TargetOverride::On { percent: percent.min(100) },
        }
    }
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
    fn off_clears_every_override_and_clear_removes_one() {
        let mut f = FlagState::default();
        f.apply(FlagChange::On { percent: 130 });
        assert!(f.enabled && f.percent == 100, "a share is at most 100 %");
        f.apply(FlagChange::Target(t(42), TargetOverride::On { percent: 10 }));
        f.apply(FlagChange::Target(t(7), TargetOverride::Off));
        f.apply(FlagChange::ClearTarget(t(7)));
        assert_eq!(f.overrides.into_iter().collect::<Vec<_>>(), vec![(t(42), TargetOverride::On { percent: 10 })]);
        let mut f = FlagState { enabled: true, percent: 30, ..Default::default() };
        f.overrides.insert(t(1), TargetOverride::On { percent: 5 });
        f.apply(FlagChange::Off);
        assert!(!f.enabled && f.overrides.is_empty() && f.percent == 30, "off keeps the share for the next on");
        f.apply(FlagChange::Pow(Some(40)));
        assert_eq!(f.pow_bits, Some(32));
        f.apply(FlagChange::Pow(None));
        assert_eq!(f.pow_bits, None);
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
