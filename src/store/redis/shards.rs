//! A target spread over shards (`targets.types.*.shards`): which shard's keys each operation
//! goes to, and the operations that span every shard — the tick's admission plan, and the
//! figures (snapshot, record) added up over the shards.
//!
//! The store's callers name the whole target; here it becomes the user's shard
//! ([`RedisStore::user_part`]: enter, poll, leave, token issue, claim and release) or every
//! shard ([`RedisStore::parts`], shard 0 first: the sale's controls, eviction, the expired
//! tokens, stats). Target-wide state stays where a 1-shard target has it, under the target's
//! own hash tag, which is shard 0's: the admission lock, the plans, the batch pinned, the
//! adaptive outflow, pacing, the ledger and the event log. A 1-shard target is never touched
//! here: its keys, calls and commands are those of an unsharded one.
//!
//! Admission: the instance holding the lock reads every shard's waiting users, shares the
//! tick's batch out (`domain::allot`) and stores the plan on shard 0 with `SET NX GET`, keyed
//! by the tick, so two pumps that both believe they hold the lock apply the one plan that won;
//! each shard's `admit.lua` admits its share at most once per tick, and only while its own
//! clock is in the plan's tick. A pump that stops mid-plan only admits fewer.

use std::collections::{BTreeMap, HashMap};

use redis::AsyncCommands;

use super::layout::{ADMIT_MILESTONES_KEYS, AdmitMilestonesArgs};
use super::scripts::{ADMIT_MILESTONES, on_target};
use super::{RedisStore, keys};
use crate::domain::{QueueTarget, UserId, allot, user_shard};
use crate::store::{AdmitOutcome, Evicted, SaleOps, StoreError, TargetSnapshot};

/// How long a tick's plan is kept, in ticks: long enough for a late pump to find it.
const PLAN_KEPT_TICKS: u64 = 10;

impl RedisStore {
    /// The shards `target` is spread over: 1 for an unsharded type and for a value that
    /// already names one shard.
    pub(super) fn shard_count(&self, target: QueueTarget) -> u8 {
        if target.shard.is_whole() { self.limits.shards(target.kind) } else { 1 }
    }

    /// The part of `target` holding `user`: the target itself unless it is sharded.
    pub fn user_part(&self, target: QueueTarget, user: &UserId) -> QueueTarget {
        match self.shard_count(target) {
            n if n > 1 => target.on_shard(user_shard(user.as_str(), n), n),
            _ => target,
        }
    }

    /// Every part of `target`, shard 0 first: the target alone unless it is sharded or has
    /// lanes; then each lane's parts (`lanes.rs`), in the order of `lanes_of`.
    pub fn parts(&self, target: QueueTarget) -> Vec<QueueTarget> {
        let mut parts = self.parts_of_public(target);
        if self.has_lanes(target) {
            for lane in self.lanes_of(target) {
                parts.extend(self.lane_parts(target, lane.name));
            }
        }
        parts
    }

    /// The public lane's parts of `target`, shard 0 first: the target alone unless sharded.
    pub(super) fn parts_of_public(&self, target: QueueTarget) -> Vec<QueueTarget> {
        match self.shard_count(target) {
            n if n > 1 => (0..n).map(|s| target.on_shard(s, n)).collect(),
            _ => vec![target],
        }
    }

    /// Whether `target` is more than one part (sharded, or with lanes).
    pub(super) fn is_split(&self, target: QueueTarget) -> bool {
        self.shard_count(target) > 1 || self.has_lanes(target)
    }

    /// The users who may wait in `target` (one shard: its share of its type's capacity).
    pub(super) fn capacity_of(&self, target: QueueTarget) -> u64 {
        let cap = self.limits.capacity(target.kind);
        if target.shard.is_whole() {
            cap
        } else {
            crate::domain::shard_cap(cap, target.shard.index, target.shard.count)
        }
    }

    /// One tick's admission of a sharded target: the plan (made here or by another pump for
    /// the same tick), then each shard's share. `advanced` only when every shard advanced, so
    /// the pump still looks for an opening while a shard's sale holds admission.
    pub(super) async fn admit_sharded(
        &self,
        target: QueueTarget,
        default_batch: u64,
        tick_ms: u64,
        instance: &str,
    ) -> Result<AdmitOutcome, StoreError> {
        let parts = self.parts(target);
        let mut conn = self.conn();
        let tick = crate::clock::now_epoch_ms().saturating_add_signed(self.clock_offset_ms().unwrap_or(0)) / tick_ms;
        let pinned: Option<u64> = conn.get(keys::of(target, "batch_size")).await?;
        let batch = pinned.unwrap_or(default_batch);
        let mut waiting = Vec::with_capacity(parts.len());
        for part in &parts {
            let mark: Option<u64> = conn.get(keys::of(*part, "admitted_count")).await?;
            let n: u64 = conn.zcount(keys::of(*part, "waiting"), format!("({}", mark.unwrap_or(0)), "+inf").await?;
            waiting.push(n);
        }
        let mine = allot(batch, &waiting).iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let won: Option<String> = redis::cmd("SET")
            .arg(keys::of(target, &format!("plan:{tick}")))
            .arg(&mine)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(tick_ms * PLAN_KEPT_TICKS)
            .query_async(&mut conn)
            .await?;
        let out = self
            .admit_plan(target, &parts, won.as_deref().unwrap_or(&mine), tick, default_batch, tick_ms, instance)
            .await?;
        self.announce_milestones(target, tick, batch, waiting.iter().sum(), &out).await?;
        Ok(out)
    }

    /// The whole target's admission milestones in its event log, once a tick's plan is
    /// applied (`admit_milestones.lua`; each shard's `admit.lua` announces none under a plan).
    pub(super) async fn announce_milestones(
        &self,
        target: QueueTarget,
        tick: u64,
        batch: u64,
        waiting: u64,
        applied: &AdmitOutcome,
    ) -> Result<(), StoreError> {
        let _: u64 = on_target(&ADMIT_MILESTONES, target, ADMIT_MILESTONES_KEYS)
            .args(&AdmitMilestonesArgs {
                tick,
                admitted: applied.admitted,
                batch,
                waiting,
                mark: applied.mark,
                admitted_every: self.limits.events.admitted_every,
                events_max: self.limits.events.max_len,
                events_ttl_s: self.limits.record_ttl_s,
            })
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }

    /// The event log's length sent to a script working on `part`: 0 (no log) on a shard after
    /// the first or a lane's part, whose target's log is its first shard's.
    pub(super) fn events_max(&self, part: QueueTarget) -> u64 {
        if part.shard.is_first() { self.limits.events.max_len } else { 0 }
    }

    /// Evicts up to `max` stale users from each shard.
    pub(super) async fn evict_sharded(
        &self,
        target: QueueTarget,
        timeout_ms: u64,
        max: u64,
    ) -> Result<Evicted, StoreError> {
        let mut all = Evicted::default();
        for part in self.parts(target) {
            let e = self.evict_part(part, timeout_ms, max).await?;
            all.users += e.users;
            all.more |= e.more;
        }
        Ok(all)
    }

    /// The figures of every shard added up: counters summed, the admissions per tick summed
    /// by tick, the oldest entry the oldest of any; the sale, the batch pinned, the lock and
    /// the adaptive outflow are shard 0's (the target's own).
    pub(super) async fn snapshot_sharded(&self, target: QueueTarget) -> Result<TargetSnapshot, StoreError> {
        let mut parts = self.parts(target).into_iter();
        let first = parts.next().expect("a target has a shard 0");
        let mut all = self.snapshot_part(first).await?;
        let mut ticks: BTreeMap<u64, u64> = all.admissions.iter().copied().collect();
        for part in parts {
            let s = self.snapshot_part(part).await?;
            all.waiting += s.waiting;
            all.mark += s.mark;
            all.seq += s.seq;
            all.evicted += s.evicted;
            all.capacity = match (all.capacity, s.capacity) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            for (t, n) in s.admissions {
                *ticks.entry(t).or_default() += n;
            }
            all.admitted_total += s.admitted_total;
            all.prequeued += s.prequeued;
            all.tokens_issued += s.tokens_issued;
            all.tokens_used += s.tokens_used;
            all.direct_tokens_used += s.direct_tokens_used;
            all.tokens_expired += s.tokens_expired;
            for (b, n) in s.waits.buckets {
                *all.waits.buckets.entry(b).or_default() += n;
            }
            all.waits.count += s.waits.count;
            all.waits.sum_ms += s.waits.sum_ms;
            all.oldest_entry_ms = match (all.oldest_entry_ms, s.oldest_entry_ms) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        all.admissions = ticks.into_iter().rev().collect();
        all.sale = self.read_sale(target).await?;
        Ok(all)
    }

    /// The record's hash fields of every shard as one: counters summed, `wmax` the largest;
    /// the sale's events (`events`, `e:<n>`) and `tick_ms` are shard 0's.
    pub(super) async fn record_fields(&self, target: QueueTarget) -> Result<Vec<(String, String)>, StoreError> {
        self.record_fields_of(self.parts(target)).await
    }

    /// The record's fields of `parts` as one (the first's events and tick), as [`Self::record_fields`].
    pub(super) async fn record_fields_of(&self, parts: Vec<QueueTarget>) -> Result<Vec<(String, String)>, StoreError> {
        let mut parts = parts.into_iter();
        let first = parts.next().expect("a target has a shard 0");
        let fields: Vec<(String, String)> = self.conn().hgetall(keys::of(first, "record")).await?;
        let mut merged: HashMap<String, String> = fields.into_iter().collect();
        for part in parts {
            let more: Vec<(String, String)> = self.conn().hgetall(keys::of(part, "record")).await?;
            for (f, v) in more {
                if f == "events" || f == "tick_ms" || f.starts_with("e:") {
                    merged.entry(f).or_insert(v);
                    continue;
                }
                let Ok(n) = v.parse::<i64>() else {
                    merged.entry(f).or_insert(v);
                    continue;
                };
                let slot = merged.entry(f.clone()).or_insert_with(|| "0".into());
                let had = slot.parse::<i64>().unwrap_or(0);
                *slot = if f == "wmax" { had.max(n) } else { had + n }.to_string();
            }
        }
        Ok(merged.into_iter().collect())
    }
}
