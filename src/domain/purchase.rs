//! The purchase limits the gate keeps (`purchases_per_admission`, `purchases_per_user`) and the
//! reasons it refuses a purchase, as the target's record counts them.

use serde::Serialize;

/// How many purchases the gate lets through for one buyer of a target: the limits of the
/// target's type (`[[targets.types]]`, else the `[queue]` defaults), resolved once per check so
/// that a finer layer (a lane's own limits) can override them later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurchaseLimits {
    /// Purchases one entry token (one admission) may make; 1 = one-time use.
    pub per_admission: u64,
    /// Purchases one user may make in the target's sale, across re-entries; 0 = no limit
    /// beyond the per-admission one.
    pub per_user: u64,
}

impl Default for PurchaseLimits {
    fn default() -> Self {
        Self { per_admission: 1, per_user: 0 }
    }
}

/// Why the gate refused a purchase of a gated route (the record's `rf:<name>` fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurchaseRefusal {
    /// The entry token made its `purchases_per_admission` purchases already.
    TokenUsed,
    /// The user made their `purchases_per_user` purchases of the sale already.
    UserLimit,
    /// No entry token, or one that does not hold (signature, expiry, target, user).
    NoValidToken,
}

impl PurchaseRefusal {
    pub const ALL: [Self; 3] = [Self::TokenUsed, Self::UserLimit, Self::NoValidToken];

    /// Its name in the record's fields (`rf:<name>`), the JSON and the CSV.
    pub fn name(self) -> &'static str {
        match self {
            Self::TokenUsed => "token_used",
            Self::UserLimit => "user_limit",
            Self::NoValidToken => "no_valid_token",
        }
    }

    pub fn of_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Purchases refused, per reason, in [`PurchaseRefusal::ALL`] order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refusals(pub [u64; 3]);

impl Refusals {
    pub fn get(&self, why: PurchaseRefusal) -> u64 {
        self.0[why.index()]
    }

    pub fn add(&mut self, why: PurchaseRefusal, n: u64) {
        self.0[why.index()] += n;
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Each reason counted at least once, with its count.
    pub fn counted(&self) -> impl Iterator<Item = (PurchaseRefusal, u64)> + '_ {
        PurchaseRefusal::ALL.into_iter().map(|r| (r, self.get(r))).filter(|(_, n)| *n > 0)
    }
}

impl Serialize for Refusals {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(PurchaseRefusal::ALL.len()))?;
        for r in PurchaseRefusal::ALL {
            m.serialize_entry(r.name(), &self.get(r))?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_names_round_trip() {
        for r in PurchaseRefusal::ALL {
            assert_eq!(PurchaseRefusal::of_name(r.name()), Some(r));
        }
        let mut n = Refusals::default();
        n.add(PurchaseRefusal::UserLimit, 2);
        assert_eq!(n.counted().collect::<Vec<_>>(), vec![(PurchaseRefusal::UserLimit, 2)]);
        assert_eq!(n.total(), 2);
    }
}
