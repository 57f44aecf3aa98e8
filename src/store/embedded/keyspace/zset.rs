//! The keyspace's sorted sets: members by score, ties by member bytes, as Redis orders them.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use super::args::{edge, fmt_score, int, range_options, rank_range, score, scored};
use super::{Args, Fail, Keyspace, arity};
use crate::store::embedded::reply::{Reply, SYNTAX};

/// A sorted set's score, ordered as Redis orders them (no NaN is ever stored).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Score(pub(super) f64);

impl Eq for Score {}

impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Score {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Members by score, ties by member bytes (Redis' order), and each member's score.
#[derive(Debug, Default, Clone)]
pub(super) struct ZSet {
    pub(super) scores: HashMap<Vec<u8>, f64>,
    pub(super) order: BTreeSet<(Score, Vec<u8>)>,
}

impl ZSet {
    pub(super) fn insert(&mut self, member: Vec<u8>, score: f64) {
        if let Some(old) = self.scores.insert(member.clone(), score) {
            self.order.remove(&(Score(old), member.clone()));
        }
        self.order.insert((Score(score), member));
    }

    pub(super) fn remove(&mut self, member: &[u8]) -> bool {
        match self.scores.remove(member) {
            Some(old) => {
                self.order.remove(&(Score(old), member.to_vec()));
                true
            }
            None => false,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.scores.len()
    }

    /// Members with `min <= score <= max` (each end exclusive where said), lowest first.
    pub(super) fn by_score(&self, min: Edge, max: Edge) -> impl DoubleEndedIterator<Item = &(Score, Vec<u8>)> {
        let lo = match min {
            Edge { value, exclusive: false } if value == f64::NEG_INFINITY => Bound::Unbounded,
            Edge { value, exclusive: false } => Bound::Included((Score(value), Vec::new())),
            Edge { value, exclusive: true } => Bound::Included((Score(value.next_up()), Vec::new())),
        };
        let hi = match max {
            Edge { value, exclusive: false } if value == f64::INFINITY => Bound::Unbounded,
            Edge { value, exclusive: false } => Bound::Excluded((Score(value.next_up()), Vec::new())),
            Edge { value, exclusive: true } => Bound::Excluded((Score(value), Vec::new())),
        };
        let empty = min.value > max.value
            || (min.value == max.value && (min.exclusive || max.exclusive))
            || (min.exclusive && min.value == f64::INFINITY)
            || (max.exclusive && max.value == f64::NEG_INFINITY);
        let range = if empty { None } else { Some(self.order.range((lo, hi))) };
        range.into_iter().flatten()
    }
}

/// One end of a score range: `5`, `(5`, `-inf`, `+inf`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Edge {
    pub(super) value: f64,
    pub(super) exclusive: bool,
}

impl Keyspace {
    /// Sorted-set commands.
    pub(super) fn zset_command(&mut self, name: &str, a: Args) -> Result<Reply, Fail> {
        match name {
            // Sorted sets.
            "ZADD" => self.zadd(a),
            "ZREM" => {
                arity(a, 2, usize::MAX)?;
                if self.zset(&a[0])?.is_none() {
                    return Ok(Reply::Int(0));
                }
                let z = self.zset_mut(&a[0])?;
                let n = a[1..].iter().filter(|m| z.remove(m)).count();
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(n as i64))
            }
            "ZCARD" => {
                arity(a, 1, 1)?;
                Ok(Reply::Int(self.zset(&a[0])?.map_or(0, |z| z.len() as i64)))
            }
            "ZSCORE" => {
                arity(a, 2, 2)?;
                Ok(self
                    .zset(&a[0])?
                    .and_then(|z| z.scores.get(&a[1]))
                    .map_or(Reply::Nil, |s| Reply::Bulk(fmt_score(*s))))
            }
            "ZMSCORE" => {
                arity(a, 2, usize::MAX)?;
                let z = self.zset(&a[0])?;
                Ok(Reply::Array(
                    a[1..]
                        .iter()
                        .map(|m| z.and_then(|z| z.scores.get(m)).map_or(Reply::Nil, |s| Reply::Bulk(fmt_score(*s))))
                        .collect(),
                ))
            }
            "ZCOUNT" => {
                arity(a, 3, 3)?;
                let (min, max) = (edge(&a[1])?, edge(&a[2])?);
                Ok(Reply::Int(self.zset(&a[0])?.map_or(0, |z| z.by_score(min, max).count() as i64)))
            }
            "ZRANGEBYSCORE" | "ZREVRANGEBYSCORE" => self.zrange_by_score(name == "ZREVRANGEBYSCORE", a),
            "ZRANGE" => self.zrange(a),
            "ZREMRANGEBYSCORE" => {
                arity(a, 3, 3)?;
                let (min, max) = (edge(&a[1])?, edge(&a[2])?);
                let Some(z) = self.zset(&a[0])? else { return Ok(Reply::Int(0)) };
                let gone: Vec<Vec<u8>> = z.by_score(min, max).map(|(_, m)| m.clone()).collect();
                let z = self.zset_mut(&a[0])?;
                for m in &gone {
                    z.remove(m);
                }
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(gone.len() as i64))
            }
            "ZREMRANGEBYRANK" => {
                arity(a, 3, 3)?;
                let (start, stop) = (int(&a[1])?, int(&a[2])?);
                let Some(z) = self.zset(&a[0])? else { return Ok(Reply::Int(0)) };
                let Some((from, to)) = rank_range(start, stop, z.len()) else { return Ok(Reply::Int(0)) };
                let gone: Vec<Vec<u8>> =
                    z.order.iter().skip(from).take(to - from + 1).map(|(_, m)| m.clone()).collect();
                let z = self.zset_mut(&a[0])?;
                for m in &gone {
                    z.remove(m);
                }
                self.drop_if_empty(&a[0]);
                Ok(Reply::Int(gone.len() as i64))
            }
            _ => Err(Fail::Unknown),
        }
    }

    fn zadd(&mut self, a: Args) -> Result<Reply, Fail> {
        arity(a, 3, usize::MAX)?;
        let (mut nx, mut xx, mut gt, mut lt, mut ch) = (false, false, false, false, false);
        let mut i = 1;
        while i < a.len() {
            match String::from_utf8_lossy(&a[i]).to_ascii_uppercase().as_str() {
                "NX" => nx = true,
                "XX" => xx = true,
                "GT" => gt = true,
                "LT" => lt = true,
                "CH" => ch = true,
                _ => break,
            }
            i += 1;
        }
        let pairs = &a[i..];
        if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
            return Err(Fail::Reply(Reply::err(SYNTAX)));
        }
        if nx && xx {
            return Err(Fail::Reply(Reply::err("ERR XX and NX options at the same time are not compatible")));
        }
        if (gt && lt) || (nx && (gt || lt)) {
            return Err(Fail::Reply(Reply::err("ERR GT, LT, and/or NX options at the same time are not compatible")));
        }
        let mut parsed = Vec::with_capacity(pairs.len() / 2);
        for p in pairs.chunks(2) {
            parsed.push((score(&p[0])?, p[1].clone()));
        }
        let z = self.zset_mut(&a[0])?;
        let (mut added, mut changed) = (0, 0);
        for (s, m) in parsed {
            match z.scores.get(&m).copied() {
                None if !xx => {
                    z.insert(m, s);
                    added += 1;
                }
                None => {}
                Some(old) => {
                    if nx || (gt && s <= old) || (lt && s >= old) || s == old {
                        continue;
                    }
                    z.insert(m, s);
                    changed += 1;
                }
            }
        }
        self.drop_if_empty(&a[0]);
        Ok(Reply::Int(if ch { added + changed } else { added }))
    }

    fn zrange_by_score(&mut self, rev: bool, a: Args) -> Result<Reply, Fail> {
        arity(a, 3, 7)?;
        let (lo, hi) = if rev { (edge(&a[2])?, edge(&a[1])?) } else { (edge(&a[1])?, edge(&a[2])?) };
        let (withscores, offset, count) = range_options(&a[3..])?;
        let Some(z) = self.zset(&a[0])? else { return Ok(Reply::Array(Vec::new())) };
        let it = z.by_score(lo, hi);
        let items: Box<dyn Iterator<Item = &(Score, Vec<u8>)>> = if rev { Box::new(it.rev()) } else { Box::new(it) };
        Ok(scored(items.skip(offset).take(count), withscores))
    }

    fn zrange(&mut self, a: Args) -> Result<Reply, Fail> {
        arity(a, 3, 4)?;
        let (start, stop) = (int(&a[1])?, int(&a[2])?);
        let withscores = match a.get(3) {
            None => false,
            Some(o) if o.eq_ignore_ascii_case(b"WITHSCORES") => true,
            Some(_) => return Err(Fail::Reply(Reply::err(SYNTAX))),
        };
        let Some(z) = self.zset(&a[0])? else { return Ok(Reply::Array(Vec::new())) };
        let Some((from, to)) = rank_range(start, stop, z.len()) else { return Ok(Reply::Array(Vec::new())) };
        Ok(scored(z.order.iter().skip(from).take(to - from + 1), withscores))
    }
}
