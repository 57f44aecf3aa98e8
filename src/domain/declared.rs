//! Declared targets: the only targets a queue answers for. An operator declares them, in
//! configuration (single targets and bounded id ranges) or at runtime (`vq target add`); a
//! client can name any target but makes none exist.
//!
//! Pure: the set, its size (which `queue.max_targets` bounds) and the "did you mean" of an
//! operator's near miss.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use super::target::{ParseError, QueueTarget, QueueTargetType};

/// A whole range of ids of one type, `limited-drop:1000-1999`, for shops with many drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetRange {
    pub kind: QueueTargetType,
    pub first: u64,
    pub last: u64,
}

impl TargetRange {
    pub fn contains(&self, t: QueueTarget) -> bool {
        t.kind == self.kind && (self.first..=self.last).contains(&t.id)
    }

    /// Targets in the range (each counts against `queue.max_targets`); never 0.
    pub fn count(&self) -> u64 {
        self.last - self.first + 1
    }
}

impl FromStr for TargetRange {
    type Err = ParseError;

    /// `limited-drop:1000-1999` (or `LIMITED_DROP:…`), first ≤ last.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseError::BadRange(s.to_owned());
        let (kind, ids) = s.split_once(':').ok_or_else(bad)?;
        let (first, last) = ids.split_once('-').ok_or_else(bad)?;
        let first = QueueTarget::from_parts(kind, first)?;
        let last = QueueTarget::from_parts(kind, last)?;
        if first.id > last.id {
            return Err(bad());
        }
        Ok(Self { kind: first.kind, first: first.id, last: last.id })
    }
}

impl fmt::Display for TargetRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}-{}", self.kind.slug(), self.first, self.last)
    }
}

/// The declared targets: single ones and ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeclaredTargets {
    pub listed: BTreeSet<QueueTarget>,
    pub ranges: Vec<TargetRange>,
}

/// Suggestions a "did you mean" gives at most.
const NEAR_MISSES: usize = 3;

impl DeclaredTargets {
    pub fn contains(&self, t: QueueTarget) -> bool {
        self.listed.contains(&t) || self.ranges.iter().any(|r| r.contains(t))
    }

    /// Declared targets, counting each range's ids (an overlap counts twice: an upper bound).
    pub fn len(&self) -> u64 {
        self.listed.len() as u64 + self.ranges.iter().map(TargetRange::count).sum::<u64>()
    }

    pub fn is_empty(&self) -> bool {
        self.listed.is_empty() && self.ranges.is_empty()
    }

    /// The types these declarations name.
    pub fn kinds(&self) -> BTreeSet<QueueTargetType> {
        self.listed.iter().map(|t| t.kind).chain(self.ranges.iter().map(|r| r.kind)).collect()
    }

    /// These declarations plus single targets declared elsewhere (at runtime).
    pub fn with(&self, more: impl IntoIterator<Item = QueueTarget>) -> Self {
        let mut out = self.clone();
        out.listed.extend(more);
        out
    }

    /// Declared targets an operator who typed `t` may have meant: the same type with the id
    /// one edit away (a digit changed, dropped, added, or two neighbours swapped), or the same
    /// id of another declared type. At most three, in order.
    pub fn near_misses(&self, t: QueueTarget) -> Vec<QueueTarget> {
        let mut found = BTreeSet::new();
        for id in one_edit_away(&t.id.to_string()) {
            if let Ok(id) = id.parse::<u64>() {
                let c = QueueTarget::new(t.kind, id);
                if id > 0 && c != t && self.contains(c) {
                    found.insert(c);
                }
            }
        }
        for kind in self.kinds().into_iter().filter(|k| *k != t.kind) {
            let c = QueueTarget::new(kind, t.id);
            if self.contains(c) {
                found.insert(c);
            }
        }
        found.into_iter().take(NEAR_MISSES).collect()
    }
}

/// Digit strings one edit from `s`: substitution, deletion, insertion, adjacent transposition.
fn one_edit_away(s: &str) -> Vec<String> {
    let b = s.as_bytes();
    let digits = b'0'..=b'9';
    let mut out = Vec::new();
    for i in 0..b.len() {
        for d in digits.clone() {
            let mut v = b.to_vec();
            v[i] = d;
            out.push(v);
        }
        let mut v = b.to_vec();
        v.remove(i);
        out.push(v);
        if i + 1 < b.len() {
            let mut v = b.to_vec();
            v.swap(i, i + 1);
            out.push(v);
        }
    }
    for i in 0..=b.len() {
        for d in digits.clone() {
            let mut v = b.to_vec();
            v.insert(i, d);
            out.push(v);
        }
    }
    out.into_iter().filter(|v| !v.is_empty() && v[0] != b'0').filter_map(|v| String::from_utf8(v).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> QueueTarget {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_parse_bounded_and_count_their_ids() {
        let r: TargetRange = "limited-drop:1000-1999".parse().unwrap();
        assert_eq!(r.count(), 1000);
        assert!(r.contains(t("LIMITED_DROP:1500")));
        assert!(!r.contains(t("LIMITED_DROP:2000")));
        assert!(!r.contains(t("ticketing-event:1500")));
        for bad in ["limited-drop:5-1", "limited-drop:0-3", "limited-drop:1", "nope-:1-2", "limited-drop"] {
            assert!(bad.parse::<TargetRange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn near_misses_name_a_typo_or_the_other_type() {
        let d = DeclaredTargets {
            listed: [t("limited-drop:42"), t("ticketing-event:77"), t("limited-drop:1234")].into(),
            ranges: vec![],
        };
        assert_eq!(d.near_misses(t("limited-drop:24")), vec![t("limited-drop:42")]);
        assert_eq!(d.near_misses(t("limited-drop:43")), vec![t("limited-drop:42")]);
        assert_eq!(d.near_misses(t("limited-drop:422")), vec![t("limited-drop:42")]);
        assert_eq!(d.near_misses(t("limited-drop:77")), vec![t("ticketing-event:77")]);
        assert_eq!(d.near_misses(t("limited-drop:1243")), vec![t("limited-drop:1234")]);
        assert!(d.near_misses(t("limited-drop:9999")).is_empty());
        assert_eq!(d.len(), 3);
    }
}
