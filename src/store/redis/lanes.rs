//! A target's lanes (`targets.types.*.lanes`, `vq lane add`): which lanes a target has, the
//! lane each user is in, joining a lane with a code or a verified claim, the access codes, and
//! the tick's admission plan that shares the batch between the lanes by weight.
//!
//! A lane is a set of parts of its target, like shards: its keys under a hash tag of its own
//! (`TYPE:id~lane`, each shard of a sharded type `TYPE:id~lane#s.k`), the same scripts as
//! the public lane, which is the target itself. A target without lanes is never touched here:
//! its keys, calls and commands are those it had before lanes existed. With lanes, each enter,
//! poll, leave, token issue and claim first reads the user's lane (one `HGET` of
//! `queue:{T}:lane_of`, absent = public), so a lane costs one command per request.
//!
//! Runtime lanes live in `queue:{T}:lanes` (HASH name -> `share:opens_before_s`) and the
//! targets that have some in `queue:lanes` (SET); every instance reads them with the flag
//! (`flag.refresh_ms`) and every pump before each tick, so a lane added at runtime admits
//! from the next tick and is joinable within `flag.refresh_ms`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use redis::AsyncCommands;

use super::layout::{LaneJoinArgs, LeaveArgs};
use super::scripts::{LANE_JOIN, LANE_JOIN_KEYS, LEAVE, LEAVE_KEYS, on_target};
use super::{RedisStore, keys};
use crate::domain::{Lane, LaneName, QueueTarget, UserId, allot, share_by_weight, user_shard};
use crate::store::{AdmitOutcome, StoreError};

/// SET of the targets with lanes added at runtime (`LIMITED_DROP:42`); outside any target's
/// slot, read on its own.
pub const LANED: &str = "queue:lanes";

/// How long a tick's plan is kept, in ticks: long enough for a late pump to find it.
const PLAN_KEPT_TICKS: u64 = 10;

/// The lanes added at runtime, per target, as last read.
pub(super) type RuntimeLanes = Arc<RwLock<HashMap<QueueTarget, Arc<[Lane]>>>>;

/// One lane's figures, its parts added up (`vq stats`, the stats endpoint, `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneFigures {
    pub lane: LaneName,
    /// Percent of each batch while its users wait (the public lane: what the others leave).
    pub share: u32,
    pub opens_before_s: u64,
    pub waiting: u64,
    pub admitted: u64,
    pub prequeued: u64,
}

/// What joining a lane answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinOutcome {
    Joined(LaneName),
    /// No such code, or its lane is gone.
    Unknown,
    /// The code has no use left for another user.
    Used,
}

impl RedisStore {
    /// The lanes of `target` besides the public one: its type's configured lanes, then those
    /// added at runtime (a runtime lane of a configured name replaces it).
    pub fn lanes_of(&self, target: QueueTarget) -> Vec<Lane> {
        let mut lanes: Vec<Lane> = self.limits.lanes(target.kind).to_vec();
        let book = self.lane_book.read().unwrap_or_else(|e| e.into_inner());
        if let Some(runtime) = book.get(&target.whole()) {
            for l in runtime.iter() {
                match lanes.iter_mut().find(|c| c.name == l.name) {
                    Some(c) => *c = *l,
                    None => lanes.push(*l),
                }
            }
        }
        lanes
    }

    /// Whether `target` (the whole target) has lanes.
    pub fn has_lanes(&self, target: QueueTarget) -> bool {
        target.shard.is_whole()
            && (!self.limits.lanes(target.kind).is_empty()
                || self.lane_book.read().unwrap_or_else(|e| e.into_inner()).contains_key(&target))
    }

    /// The parts of `lane` of `target`: one, or one per shard of a sharded type.
    pub(super) fn lane_parts(&self, target: QueueTarget, lane: LaneName) -> Vec<QueueTarget> {
        if lane.is_public() {
            return self.parts_of_public(target.whole());
        }
        let base = target.whole().in_lane(lane);
        match self.limits.shards(target.kind) {
            n if n > 1 => (0..n).map(|s| base.on_shard(s, n)).collect(),
            _ => vec![base],
        }
    }

    /// Every part of `target` that can hold `user`: their part of the public lane, then their
    /// part of each lane (see [`Self::user_part`]).
    pub(super) fn user_parts(&self, target: QueueTarget, user: &UserId) -> Vec<QueueTarget> {
        let mut parts = vec![self.user_part(target, user)];
        if self.has_lanes(target) {
            parts.extend(self.lanes_of(target).into_iter().map(|l| self.user_part_in(target, l.name, user)));
        }
        parts
    }

    /// The part of `lane` holding `user`.
    fn user_part_in(&self, target: QueueTarget, lane: LaneName, user: &UserId) -> QueueTarget {
        if lane.is_public() {
            return self.user_part(target, user);
        }
        let base = target.whole().in_lane(lane);
        match self.limits.shards(target.kind) {
            n if n > 1 => base.on_shard(user_shard(user.as_str(), n), n),
            _ => base,
        }
    }

    /// The lane `user` is in at `target` (public unless they joined one).
    pub async fn user_lane(&self, target: QueueTarget, user: &UserId) -> Result<LaneName, StoreError> {
        if !self.has_lanes(target) {
            return Ok(LaneName::PUBLIC);
        }
        let lane: Option<String> = self.conn().hget(keys::of(target.whole(), "lane_of"), user.as_str()).await?;
        // A lane removed since is the public lane again.
        let lanes = self.lanes_of(target);
        Ok(lane
            .and_then(|l| l.parse::<LaneName>().ok())
            .filter(|l| lanes.iter().any(|x| x.name == *l))
            .unwrap_or(LaneName::PUBLIC))
    }

    /// `w` with the lane of `part` when its target has lanes.
    pub(super) fn lane_shown(&self, w: crate::store::Waiting, part: QueueTarget) -> crate::store::Waiting {
        match self.has_lanes(part.whole()) {
            true => crate::store::Waiting { lane: Some(part.shard.lane), ..w },
            false => w,
        }
    }

    /// The part holding `user`'s place: their lane's (their shard of it), read from Redis
    /// only when the target has lanes.
    pub(super) async fn user_place(&self, target: QueueTarget, user: &UserId) -> Result<QueueTarget, StoreError> {
        if !self.has_lanes(target) {
            return Ok(self.user_part(target, user));
        }
        let lane = self.user_lane(target, user).await?;
        Ok(self.user_part_in(target, lane, user))
    }

    /// `user` joins a lane of `target`: with the code whose hash is `code_hash`, or the lane
    /// of a claim the service verified (`lane`, with an empty hash). A user already waiting
    /// in the public lane moves: their public place is left once the lane holds them (the
    /// caller enters them there next).
    pub async fn join_lane(
        &self,
        target: QueueTarget,
        user: &UserId,
        code_hash: &str,
        lane: Option<LaneName>,
    ) -> Result<JoinOutcome, StoreError> {
        let lanes = self.lanes_of(target);
        let names: Vec<&str> = lanes.iter().map(|l| l.name.as_str()).collect();
        let r: (u64, String) = on_target(&LANE_JOIN, target.whole(), LANE_JOIN_KEYS)
            .args(&LaneJoinArgs {
                user: user.as_str(),
                code_hash,
                lane: lane.as_ref().map_or("", |l| l.as_str()),
                lanes: &names.join(" "),
                key_ttl_s: self.limits.key_ttl_s,
            })
            .invoke_async(&mut self.conn())
            .await?;
        match r {
            (1, l) => Ok(JoinOutcome::Joined(l.parse().unwrap_or(LaneName::PUBLIC))),
            (2, _) => Ok(JoinOutcome::Used),
            _ => Ok(JoinOutcome::Unknown),
        }
    }

    /// `user` leaves the public lane of `target` (their shard of it), having joined another:
    /// whether they were waiting there.
    pub async fn leave_public(&self, target: QueueTarget, user: &UserId) -> Result<bool, StoreError> {
        let part = self.user_part(target.whole(), user);
        // Still in the target (in the other lane): their holds keep it.
        let removed: u64 = on_target(&LEAVE, part, LEAVE_KEYS)
            .args(&LeaveArgs {
                user: user.as_str(),
                key_ttl_s: self.limits.key_ttl_s,
                record_ttl_s: self.limits.record_ttl_s,
                hold_target: "",
                hold_generation: 0,
                hold_generation_ms: 0,
            })
            .invoke_async(&mut self.conn())
            .await?;
        Ok(removed > 0)
    }

    /// Each lane's figures, the public lane first; empty for a target without lanes.
    pub async fn lane_figures(&self, target: QueueTarget) -> Result<Vec<LaneFigures>, StoreError> {
        if !self.has_lanes(target) {
            return Ok(Vec::new());
        }
        let lanes = self.lanes_of(target);
        let public_share = 100u32.saturating_sub(lanes.iter().map(|l| l.share).sum::<u32>()).max(1);
        let mut all = vec![Lane { name: LaneName::PUBLIC, share: public_share, opens_before_s: 0 }];
        all.extend(lanes);
        let mut out = Vec::with_capacity(all.len());
        for l in all {
            let mut f = LaneFigures {
                lane: l.name,
                share: l.share,
                opens_before_s: l.opens_before_s,
                waiting: 0,
                admitted: 0,
                prequeued: 0,
            };
            for part in self.lane_parts(target, l.name) {
                let s = self.snapshot_part(part).await?;
                f.waiting += s.waiting;
                f.admitted += s.admitted_total;
                f.prequeued += s.prequeued;
            }
            out.push(f);
        }
        Ok(out)
    }

    /// Each lane's own record (its parts added up), the public lane first; empty for a target
    /// without lanes.
    pub async fn lane_records(
        &self,
        target: QueueTarget,
    ) -> Result<Vec<(LaneName, crate::domain::TargetRecord)>, StoreError> {
        if !self.has_lanes(target) {
            return Ok(Vec::new());
        }
        let mut names = vec![LaneName::PUBLIC];
        names.extend(self.lanes_of(target).iter().map(|l| l.name));
        let mut out = Vec::with_capacity(names.len());
        for lane in names {
            let fields = self.record_fields_of(self.lane_parts(target, lane)).await?;
            out.push((lane, super::codec::decode_record(fields.iter().map(|(f, v)| (f.as_str(), v.as_str())))));
        }
        Ok(out)
    }

    /// Reads the runtime lanes of every target that has some (`queue:lanes`); on error the
    /// last set read stays in force.
    pub async fn refresh_lanes(&self) -> Result<(), StoreError> {
        let members: Vec<String> = self.conn().smembers(LANED).await?;
        let mut read = HashMap::new();
        for m in members {
            let Ok(target) = m.parse::<QueueTarget>() else { continue };
            let lanes = self.read_runtime_lanes(target).await?;
            if !lanes.is_empty() {
                read.insert(target, Arc::from(lanes));
            }
        }
        *self.lane_book.write().unwrap_or_else(|e| e.into_inner()) = read;
        Ok(())
    }

    /// The lanes added to `target` at runtime, by name.
    pub async fn read_runtime_lanes(&self, target: QueueTarget) -> Result<Vec<Lane>, StoreError> {
        let fields: Vec<(String, String)> = self.conn().hgetall(keys::of(target.whole(), "lanes")).await?;
        let mut lanes: Vec<Lane> = fields.iter().filter_map(|(n, v)| Lane::from_stored(n, v)).collect();
        lanes.sort_by_key(|l| l.name);
        Ok(lanes)
    }

    /// Reads `target`'s runtime lanes now (an enter with a proof: a lane added since the last
    /// refresh is joinable at once).
    pub async fn refresh_target_lanes(&self, target: QueueTarget) -> Result<(), StoreError> {
        let target = target.whole();
        let lanes = self.read_runtime_lanes(target).await?;
        let mut book = self.lane_book.write().unwrap_or_else(|e| e.into_inner());
        if lanes.is_empty() {
            book.remove(&target);
        } else {
            book.insert(target, Arc::from(lanes));
        }
        Ok(())
    }

    /// Adds or changes a runtime lane of `target` (and takes it in at once here).
    pub async fn put_lane(&self, target: QueueTarget, lane: Lane) -> Result<(), StoreError> {
        let target = target.whole();
        let _: u64 = self.conn().hset(keys::of(target, "lanes"), lane.name.as_str(), lane.stored()).await?;
        let _: u64 = self.conn().sadd(LANED, target.to_string()).await?;
        let lanes = self.read_runtime_lanes(target).await?;
        self.lane_book.write().unwrap_or_else(|e| e.into_inner()).insert(target, Arc::from(lanes));
        Ok(())
    }

    /// Removes a runtime lane of `target`; whether it was there.
    pub async fn drop_lane(&self, target: QueueTarget, lane: LaneName) -> Result<bool, StoreError> {
        let target = target.whole();
        let removed: u64 = self.conn().hdel(keys::of(target, "lanes"), lane.as_str()).await?;
        let lanes = self.read_runtime_lanes(target).await?;
        if lanes.is_empty() {
            let _: u64 = self.conn().srem(LANED, target.to_string()).await?;
        }
        let mut book = self.lane_book.write().unwrap_or_else(|e| e.into_inner());
        if lanes.is_empty() {
            book.remove(&target);
        } else {
            book.insert(target, Arc::from(lanes));
        }
        Ok(removed > 0)
    }

    /// Users waiting or pre-queued in `lane` of `target` (across its shards).
    pub async fn lane_holds(&self, target: QueueTarget, lane: LaneName) -> Result<(u64, u64), StoreError> {
        let (mut waiting, mut prequeued) = (0, 0);
        for part in self.lane_parts(target, lane) {
            let mark: Option<u64> = self.conn().get(keys::of(part, "admitted_count")).await?;
            let w: u64 =
                self.conn().zcount(keys::of(part, "waiting"), format!("({}", mark.unwrap_or(0)), "+inf").await?;
            let p: u64 = self.conn().zcard(keys::of(part, "prequeue")).await?;
            let o: u64 = self.conn().zcard(keys::of(part, "opening")).await?;
            waiting += w;
            prequeued += p + o;
        }
        Ok((waiting, prequeued))
    }

    /// Imports access codes (their hashes) for `lane` of `target`, each good for `uses`
    /// users; a code already there keeps its users and gets the new count. Returns how many
    /// were new.
    pub async fn import_codes(
        &self,
        target: QueueTarget,
        lane: LaneName,
        hashes: &[String],
        uses: u64,
    ) -> Result<u64, StoreError> {
        let key = keys::of(target.whole(), "lane_codes");
        let mut new = 0;
        for chunk in hashes.chunks(500) {
            let mut pipe = redis::pipe();
            for h in chunk {
                pipe.hset(&key, h, format!("{}:{uses}", lane.as_str()));
            }
            let added: Vec<u64> = pipe.query_async(&mut self.conn()).await?;
            new += added.iter().sum::<u64>();
        }
        Ok(new)
    }

    /// Every code's hash with its lane, its uses left and the users bound to it.
    pub async fn export_codes(&self, target: QueueTarget) -> Result<Vec<(String, String, u64, u64)>, StoreError> {
        let fields: Vec<(String, String)> = self.conn().hgetall(keys::of(target.whole(), "lane_codes")).await?;
        let mut bound: HashMap<&str, u64> = HashMap::new();
        for (f, _) in &fields {
            if let Some((h, _)) = f.split_once('|') {
                *bound.entry(h).or_default() += 1;
            }
        }
        let mut out: Vec<(String, String, u64, u64)> = fields
            .iter()
            .filter(|(f, _)| !f.contains('|'))
            .filter_map(|(h, v)| {
                let (lane, left) = v.split_once(':')?;
                Some((h.clone(), lane.to_owned(), left.parse().ok()?, bound.get(h.as_str()).copied().unwrap_or(0)))
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// One tick's admission of a target with lanes: the batch shared between the lanes by
    /// weight (`domain::share_by_weight`, with the credit carried from the ticks before),
    /// each lane's share between its shards by their waiting (`domain::allot`); the plan
    /// stored on the target's own part with `SET NX GET` keyed by the tick, as a sharded
    /// target's, and each part's `admit.lua` admits its share at most once per tick.
    pub(super) async fn admit_laned(
        &self,
        target: QueueTarget,
        default_batch: u64,
        tick_ms: u64,
        instance: &str,
    ) -> Result<AdmitOutcome, StoreError> {
        let lanes = self.lanes_of(target);
        let public_share = 100u32.saturating_sub(lanes.iter().map(|l| l.share).sum::<u32>()).max(1);
        let mut groups: Vec<(u32, Vec<QueueTarget>)> = vec![(public_share, self.parts_of_public(target))];
        for l in &lanes {
            groups.push((l.share, self.lane_parts(target, l.name)));
        }
        let mut conn = self.conn();
        let tick = crate::clock::now_epoch_ms().saturating_add_signed(self.clock_offset_ms().unwrap_or(0)) / tick_ms;
        let pinned: Option<u64> = conn.get(keys::of(target, "batch_size")).await?;
        let batch = pinned.unwrap_or(default_batch);
        let mut waiting: Vec<Vec<u64>> = Vec::with_capacity(groups.len());
        for (_, parts) in &groups {
            let mut w = Vec::with_capacity(parts.len());
            for part in parts {
                let mark: Option<u64> = conn.get(keys::of(*part, "admitted_count")).await?;
                w.push(conn.zcount(keys::of(*part, "waiting"), format!("({}", mark.unwrap_or(0)), "+inf").await?);
            }
            waiting.push(w);
        }
        let credit_key = keys::of(target, "lane_credit");
        let stored: Option<String> = conn.get(&credit_key).await?;
        // The credit of the lanes as they were: kept only while the lanes are the same.
        let names: String = lanes.iter().map(|l| l.name.as_str()).collect::<Vec<_>>().join(",");
        let credit: Vec<f64> = stored
            .as_deref()
            .and_then(|s| s.split_once('|'))
            .filter(|(n, _)| *n == names)
            .map(|(_, c)| c.split(',').filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default();
        let per_lane: Vec<(u32, u64)> = groups.iter().zip(&waiting).map(|((s, _), w)| (*s, w.iter().sum())).collect();
        let (shares, credit) = share_by_weight(batch, &per_lane, &credit);
        let mine: Vec<u64> = shares.iter().zip(&waiting).flat_map(|(s, w)| allot(*s, w)).collect();
        let mine = mine.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let won: Option<String> = redis::cmd("SET")
            .arg(keys::of(target, &format!("plan:{tick}")))
            .arg(&mine)
            .arg("NX")
            .arg("GET")
            .arg("PX")
            .arg(tick_ms * PLAN_KEPT_TICKS)
            .query_async(&mut conn)
            .await?;
        if won.is_none() {
            let c = credit.iter().map(|c| format!("{c:.4}")).collect::<Vec<_>>().join(",");
            let _: () = conn.set_ex(&credit_key, format!("{names}|{c}"), self.limits.key_ttl_s).await?;
        }
        let parts: Vec<QueueTarget> = groups.into_iter().flat_map(|(_, p)| p).collect();
        let out = self
            .admit_plan(target, &parts, won.as_deref().unwrap_or(&mine), tick, default_batch, tick_ms, instance)
            .await?;
        let all_waiting = waiting.iter().flatten().sum();
        self.announce_milestones(target, tick, batch, all_waiting, &out).await?;
        Ok(out)
    }

    /// Each part's share of a stored plan (`a,b,c` in `parts`' order) admitted in the plan's
    /// tick. `advanced` only when every part advanced, so the pump still looks for an
    /// opening while a part's sale holds admission.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn admit_plan(
        &self,
        target: QueueTarget,
        parts: &[QueueTarget],
        plan: &str,
        tick: u64,
        default_batch: u64,
        tick_ms: u64,
        instance: &str,
    ) -> Result<AdmitOutcome, StoreError> {
        let plan: Vec<u64> = plan.split(',').filter_map(|n| n.parse().ok()).collect();
        if plan.len() != parts.len() {
            return Err(StoreError::Reply {
                what: "admission plan",
                detail: format!("{} shares for {} parts of {target}", plan.len(), parts.len()),
            });
        }
        let mut out = AdmitOutcome { advanced: true, mark: 0, tick, admitted: 0, batch: plan.iter().sum() };
        for (part, share) in parts.iter().zip(plan) {
            let a = self.admit_part(*part, default_batch, tick_ms, instance, Some((tick, share))).await?;
            out.advanced &= a.advanced;
            out.mark += a.mark;
            out.admitted += a.admitted;
        }
        Ok(out)
    }
}
