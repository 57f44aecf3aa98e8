//! Lanes of one target (a presale before the public, members beside everyone else): a lane's
//! name, its weight and opening, and how one tick's batch is shared between the lanes.
//!
//! Pure: no IO, no clock. The store (`store/redis/lanes.rs`) names the keys and reads the
//! counts; this decides the numbers.

use std::fmt;
use std::str::FromStr;

/// The longest lane name. Short because every part of a target carries its lane inline
/// (`QueueTarget` is `Copy` and goes through every store call by value): with 14 bytes a
/// target stays 56 bytes, as small as the error types that hold two of them allow.
pub const MAX_LANE_LEN: usize = 14;

/// The most lanes one target may have besides the public one.
pub const MAX_LANES: usize = 16;

/// What a lane name is, as operators are told.
pub const LANE_NAME_RULE: &str = "expected 1 to 14 characters, each a lower-case letter, a digit or -";

/// A lane's name, `members`: 1 to 14 of `a-z`, `0-9`, `-`. Held inline (no allocation,
/// `Copy`), zero-padded, since every part of a target carries one; the empty name is the
/// public lane (every buyer without a claim), whose keys are the target's own.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LaneName([u8; MAX_LANE_LEN]);

impl LaneName {
    /// The public lane: the target itself.
    pub const PUBLIC: LaneName = LaneName([0; MAX_LANE_LEN]);

    pub fn is_public(&self) -> bool {
        self.0[0] == 0
    }

    pub fn as_str(&self) -> &str {
        let len = self.0.iter().position(|b| *b == 0).unwrap_or(MAX_LANE_LEN);
        // Only ASCII is ever stored.
        std::str::from_utf8(&self.0[..len]).unwrap_or_default()
    }

    /// The name shown to buyers and operators: `public` for the public lane.
    pub fn shown(&self) -> &str {
        if self.is_public() { "public" } else { self.as_str() }
    }
}

/// Why a lane name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a lane name: {LANE_NAME_RULE} (`public` is the lane of every buyer without a claim)")]
pub struct BadLaneName(pub String);

impl FromStr for LaneName {
    type Err = BadLaneName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let b = s.as_bytes();
        let ok = (1..=MAX_LANE_LEN).contains(&b.len())
            && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && s != "public";
        if !ok {
            return Err(BadLaneName(s.chars().take(40).collect()));
        }
        let mut name = [0; MAX_LANE_LEN];
        name[..b.len()].copy_from_slice(b);
        Ok(LaneName(name))
    }
}

impl fmt::Display for LaneName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.shown())
    }
}

impl fmt::Debug for LaneName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.shown())
    }
}

/// One lane of a target: its weight against the others' (the public lane's is
/// `public_share`, set with the lanes) and how long before the sale's opening it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lane {
    pub name: LaneName,
    /// Weight, > 0: the lane's share of each batch is share / (sum of the open lanes').
    pub share: u32,
    /// The lane opens this long before the sale's opening (0: with the public); a target
    /// without a scheduled sale has every lane open.
    pub opens_before_s: u64,
}

impl Lane {
    /// Its stored form in `queue:{T}:lanes` (field: the name): `share:opens_before_s`.
    pub fn stored(&self) -> String {
        format!("{}:{}", self.share, self.opens_before_s)
    }

    /// The lane `name` from its stored form; `None` when it is not one.
    pub fn from_stored(name: &str, value: &str) -> Option<Lane> {
        let (share, before) = value.split_once(':')?;
        let share: u32 = share.parse().ok().filter(|s| *s > 0)?;
        Some(Lane { name: name.parse().ok()?, share, opens_before_s: before.parse().ok()? })
    }
}

/// One tick's share of `batch` for each lane, and the carried credit for the next tick.
///
/// `lanes[i] = (weight, waiting)`; `credit[i]` is what each lane was owed (+) or was given
/// beyond its weight (−) after the ticks before, in users. Only lanes with users waiting take
/// part: each earns `batch · weight / Σ weights of those lanes`, and the batch goes one user at
/// a time to the lane owed most (ties to the first) that still has users left, so a lane
/// with fewer users than its share passes the rest on to the others. A lane without users
/// waiting starts again from nothing when users come (its credit is reset, so it never
/// catches up in a burst). Never more than `batch` in all; over ticks every lane that keeps
/// users waiting stays within one user of its weight's share. When fewer wait than the
/// batch, the room left is spread by weight over every lane (arrivals before the lane's
/// admission step are admitted this tick, as with shards).
pub fn share_by_weight(batch: u64, lanes: &[(u32, u64)], credit: &[f64]) -> (Vec<u64>, Vec<f64>) {
    let n = lanes.len();
    let mut credit: Vec<f64> = (0..n).map(|i| credit.get(i).copied().unwrap_or(0.0)).collect();
    let mut out = vec![0u64; n];
    let active: Vec<usize> = (0..n).filter(|i| lanes[*i].1 > 0 && lanes[*i].0 > 0).collect();
    for (i, c) in credit.iter_mut().enumerate() {
        if !active.contains(&i) {
            *c = 0.0;
        }
    }
    let total_waiting: u64 = active.iter().map(|i| lanes[*i].1).sum();
    let weights: u64 = active.iter().map(|i| u64::from(lanes[*i].0)).sum();
    if weights == 0 {
        return (spread_room(batch, lanes), credit);
    }
    let given = batch.min(total_waiting);
    for i in &active {
        credit[*i] += batch as f64 * f64::from(lanes[*i].0) / weights as f64;
    }
    for _ in 0..given {
        let pick = active
            .iter()
            .copied()
            .filter(|i| out[*i] < lanes[*i].1)
            .fold(None, |best: Option<usize>, i| match best {
                Some(b) if credit[b] >= credit[i] => Some(b),
                _ => Some(i),
            })
            .expect("fewer given than waiting");
        out[pick] += 1;
        credit[pick] -= 1.0;
    }
    // What a lane is owed stays bounded (a lane short of users leaves its share to others).
    for i in &active {
        credit[*i] = credit[*i].clamp(-(batch as f64) - 1.0, batch as f64 + 1.0);
    }
    let room = spread_room(batch - given, lanes);
    for (o, r) in out.iter_mut().zip(room) {
        *o += r;
    }
    (out, credit)
}

/// `room` spread by weight over every lane (largest remainder, ties to the first).
fn spread_room(room: u64, lanes: &[(u32, u64)]) -> Vec<u64> {
    let weights: u64 = lanes.iter().map(|(w, _)| u64::from(*w)).sum();
    if weights == 0 || room == 0 {
        return vec![0; lanes.len()];
    }
    let exact: Vec<(u64, u64)> = lanes
        .iter()
        .map(|(w, _)| {
            let p = room * u64::from(*w);
            (p / weights, p % weights)
        })
        .collect();
    let mut out: Vec<u64> = exact.iter().map(|(q, _)| *q).collect();
    let left = room - out.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|a, b| exact[*b].1.cmp(&exact[*a].1).then(a.cmp(b)));
    for i in order.into_iter().take(left as usize) {
        out[i] += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lane_names_are_short_lower_case_slugs() {
        for good in ["members", "fan-club", "a", "2026", &"a".repeat(MAX_LANE_LEN)] {
            assert_eq!(good.parse::<LaneName>().unwrap().as_str(), good);
        }
        for bad in ["", "Members", "a_b", "a b", "a.b", "é", "public", &"a".repeat(MAX_LANE_LEN + 1)] {
            assert!(bad.parse::<LaneName>().is_err(), "{bad:?}");
        }
        assert!(LaneName::PUBLIC.is_public());
        assert_eq!(std::mem::size_of::<crate::domain::QueueTarget>(), 56, "a target stays small");
        assert_eq!(LaneName::PUBLIC.to_string(), "public");
    }

    #[test]
    fn a_stored_lane_reads_back() {
        let l = Lane { name: "members".parse().unwrap(), share: 70, opens_before_s: 3600 };
        assert_eq!(Lane::from_stored("members", &l.stored()), Some(l));
        assert_eq!(Lane::from_stored("members", "0:0"), None, "a weight is > 0");
        assert_eq!(Lane::from_stored("Members", "1:0"), None);
    }

    /// Runs `ticks` ticks with every lane always holding `waiting` users.
    fn run(batch: u64, weights: &[u32], waiting: u64, ticks: usize) -> Vec<Vec<u64>> {
        let lanes: Vec<(u32, u64)> = weights.iter().map(|w| (*w, waiting)).collect();
        let mut credit = vec![];
        let mut totals = vec![0u64; weights.len()];
        let mut after = vec![];
        for _ in 0..ticks {
            let (shares, c) = share_by_weight(batch, &lanes, &credit);
            assert_eq!(shares.iter().sum::<u64>(), batch);
            credit = c;
            for (t, s) in totals.iter_mut().zip(shares) {
                *t += s;
            }
            after.push(totals.clone());
        }
        after
    }

    #[test]
    fn one_user_a_tick_follows_the_weights_within_one_user() {
        for (t, totals) in run(1, &[30, 70], 1, 200).into_iter().enumerate() {
            let given = (t + 1) as f64;
            for (total, w) in totals.iter().zip([0.3, 0.7]) {
                assert!((*total as f64 - given * w).abs() <= 1.0, "tick {t}: {totals:?}");
            }
        }
        for (t, totals) in run(7, &[1, 2, 5], 50, 100).into_iter().enumerate() {
            let given = 7.0 * (t + 1) as f64;
            for (total, w) in totals.iter().zip([1.0 / 8.0, 2.0 / 8.0, 5.0 / 8.0]) {
                assert!((*total as f64 - given * w).abs() <= 1.0, "tick {t}: {totals:?}");
            }
        }
    }

    #[test]
    fn a_lane_without_users_passes_its_share_on_and_never_more_than_the_batch() {
        let (s, _) = share_by_weight(10, &[(70, 0), (30, 100)], &[]);
        assert_eq!(s, vec![0, 10], "members not open yet (none waiting): the public takes the batch");
        let (s, _) = share_by_weight(10, &[(70, 3), (30, 100)], &[]);
        assert_eq!(s, vec![3, 7], "members short of their share");
        let (s, _) = share_by_weight(10, &[(70, 2), (30, 3)], &[]);
        assert_eq!(s.iter().sum::<u64>(), 10, "room spread: {s:?}");
        assert!(s[0] >= 2 && s[1] >= 3);
        let (s, c) = share_by_weight(10, &[(70, 0), (30, 0)], &[5.0, -5.0]);
        assert_eq!((s.iter().sum::<u64>(), c), (10, vec![0.0, 0.0]));
        let (s, _) = share_by_weight(0, &[(70, 5), (30, 5)], &[]);
        assert_eq!(s, vec![0, 0]);
    }
}
