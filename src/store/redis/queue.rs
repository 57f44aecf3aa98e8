//! The queue's operations on Redis (`QueueOps`: enter, poll, leave, admit, evict, the per-user
//! hold on queues, the stats snapshot) and its targets (`TargetOps`: the active and declared
//! target sets, the liveness ping).

use std::collections::HashMap;

use redis::AsyncCommands;

use super::RedisStore;
use super::holds::{HoldDrop, HoldOp};
use super::keys;
use super::layout::*;
use super::scripts::{ADMIT, ADMIT_KEYS, EVICT, EVICT_KEYS, LEAVE, num, on_target};
use super::shared_calls::{Answer, Op};
use super::slices::ADMIT_SLICE;
use crate::domain::{Ms, QueueTarget, UserId, Users, WaitHistogram};
use crate::log_every::LogEvery;
use crate::store::{
    AdmitOutcome, Candidate, DeclareOutcome, EnterOutcome, Evicted, StatusOutcome, StoreError, TargetSnapshot,
};
use crate::store::{QueueOps, StoreErrorKind, TargetOps};

/// An enter given its place without counting it among the user's queues, because the node of
/// their bucket of holds is gone (`err`: the call's error; none: the probe found the node
/// silent and no call went). Counted as a store error; logged at most once every 10 s.
fn uncounted(user: &UserId, err: Option<&StoreError>) {
    static LOG: LogEvery = LogEvery::new(std::time::Duration::from_secs(10));
    crate::metrics::store_error(StoreErrorKind::Unavailable.label());
    if let Some(n) = LOG.due() {
        let error = err.map_or_else(|| "its node failed the liveness probe".to_owned(), ToString::to_string);
        tracing::warn!(
            user = user.as_str(),
            error,
            uncounted_since_last_log = n,
            "the node holding this user's count of queues is gone: places are given uncounted \
             (queue.max_queues_per_user not enforced for the users of that node's buckets)"
        );
    }
}

impl QueueOps for RedisStore {
    async fn enter(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> Result<EnterOutcome, StoreError> {
        self.enter_part(target, user, candidate, 0).await
    }

    async fn enter_counted(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
        max: u64,
    ) -> Result<EnterOutcome, StoreError> {
        if max > 0 && self.conn.is_cluster() {
            // The holds' buckets and the target live on different nodes: counted first, in
            // a call of the bucket's own (a place then not given leaves a count that the
            // service drops once the limit is reached). With the bucket's node gone the place
            // is given uncounted: the limit guards against hoarding places, and failing the
            // enter would let the user past a queue whose own node answers.
            let held = if self.holds_silent(&user) {
                uncounted(&user, None);
                Vec::new()
            } else {
                match self.hold_call(user.clone(), target, HoldOp::Count { max }).await {
                    Ok(held) => held,
                    Err(e) if e.kind() == StoreErrorKind::Unavailable => {
                        uncounted(&user, Some(&e));
                        Vec::new()
                    }
                    Err(e) => return Err(e),
                }
            };
            if !held.is_empty() {
                return Ok(EnterOutcome::TooMany(held));
            }
            return self.enter_part(target, user, candidate, 0).await;
        }
        self.enter_part(target, user, candidate, max).await
    }

    async fn status(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> Result<StatusOutcome, StoreError> {
        let target = self.user_place(target, &user).await?;
        let mut answer = self.shared_call(Op::Status, target, user.clone(), Some(candidate)).await?;
        if let Answer::Issue = answer {
            answer = self.issue(target, &user, candidate).await?;
        }
        match answer {
            Answer::Waiting(w) => Ok(StatusOutcome::Waiting(self.lane_shown(w.in_whole_target(target), target))),
            Answer::Admitted(token) => {
                // Handed to the buyer only once a failover cannot lose it.
                self.replicated(target).await?;
                Ok(StatusOutcome::Admitted(token))
            }
            Answer::NotInQueue => Ok(StatusOutcome::NotInQueue),
            Answer::PreQueue(n) => Ok(StatusOutcome::PreQueue(n)),
            Answer::Closed(n) => Ok(StatusOutcome::Closed(n)),
            Answer::Full | Answer::Issue | Answer::Scheduled(_) | Answer::TooMany(_) => Err(StoreError::Reply {
                what: "status.lua",
                detail: "an enter-only answer (full, scheduled) or a second issue".into(),
            }),
        }
    }

    async fn leave(&self, target: QueueTarget, user: UserId) -> Result<bool, StoreError> {
        let target = self.user_place(target, &user).await?;
        let drop = self.hold_drop(target);
        let (hold_target, hold_generation, hold_generation_ms) = HoldDrop::args(drop.as_ref());
        let removed: u64 = LEAVE
            .key(&leave_keys(target, drop.as_ref().map(|d| d.generation))[..])
            .args(&LeaveArgs {
                user: user.as_str(),
                key_ttl_s: self.limits.key_ttl_s,
                record_ttl_s: self.limits.record_ttl_s,
                hold_target,
                hold_generation,
                hold_generation_ms,
            })
            .invoke_async(&mut self.conn())
            .await?;
        Ok(removed > 0)
    }

    async fn hold_queue(
        &self,
        user: UserId,
        target: QueueTarget,
        max: u64,
    ) -> Result<Vec<(QueueTarget, u64)>, StoreError> {
        self.hold_call(user, target, HoldOp::Count { max }).await
    }

    fn drops_holds_itself(&self) -> bool {
        self.drops_holds_in_call()
    }

    async fn release_queues(&self, user: UserId, targets: &[QueueTarget]) -> Result<(), StoreError> {
        if targets.is_empty() {
            return Ok(());
        }
        for t in targets {
            self.hold_call(user.clone(), *t, HoldOp::Drop).await?;
        }
        Ok(())
    }

    async fn holds_place(&self, target: QueueTarget, user: UserId) -> Result<bool, StoreError> {
        let target = self.user_place(target, &user).await?;
        let (waiting, prequeued, opening): (Option<f64>, Option<f64>, Option<f64>) = redis::pipe()
            .zscore(keys::of(target, "waiting"), user.as_str())
            .zscore(keys::of(target, "prequeue"), user.as_str())
            .zscore(keys::of(target, "opening"), user.as_str())
            .query_async(&mut self.conn())
            .await?;
        Ok(waiting.is_some() || prequeued.is_some() || opening.is_some())
    }

    async fn try_lock_admission(&self, target: QueueTarget, holder: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let ok: Option<String> = redis::cmd("SET")
            .arg(keys::admission_lock(target))
            .arg(holder)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut self.conn())
            .await?;
        Ok(ok.is_some())
    }

    async fn admit(&self, target: QueueTarget, default_batch: Users, tick: Ms) -> Result<AdmitOutcome, StoreError> {
        self.admit_by(target, default_batch, tick, "").await
    }

    async fn admit_by(
        &self,
        target: QueueTarget,
        default_batch: Users,
        tick: Ms,
        instance: &str,
    ) -> Result<AdmitOutcome, StoreError> {
        let (default_batch, tick_ms) = (default_batch.get(), tick.get());
        if self.has_lanes(target) {
            return self.admit_laned(target, default_batch, tick_ms, instance).await;
        }
        if self.shard_count(target) > 1 {
            return self.admit_sharded(target, default_batch, tick_ms, instance).await;
        }
        self.admit_part(target, default_batch, tick_ms, instance, None).await
    }

    async fn evict(&self, target: QueueTarget, timeout: Ms, max: Users) -> Result<Evicted, StoreError> {
        let (timeout_ms, max) = (timeout.get(), max.get());
        if self.is_split(target) {
            return self.evict_sharded(target, timeout_ms, max).await;
        }
        self.evict_part(target, timeout_ms, max).await
    }

    async fn snapshot(&self, target: QueueTarget) -> Result<TargetSnapshot, StoreError> {
        if self.is_split(target) {
            return self.snapshot_sharded(target).await;
        }
        self.snapshot_part(target).await
    }
}

impl RedisStore {
    /// A user's enter (`enter.lua`, shared with whatever else is queued for the target's part),
    /// counting the queues the user holds in the same call when `hold_max` > 0.
    async fn enter_part(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
        hold_max: u64,
    ) -> Result<EnterOutcome, StoreError> {
        let target = self.user_place(target, &user).await?;
        // A user admitted, then evicted or gone before the token was stored enters again.
        for _ in 0..2 {
            let mut answer = self.shared_call(Op::Enter { hold_max }, target, user.clone(), None).await?;
            if let Answer::Issue = answer {
                answer = self.issue(target, &user, candidate).await?;
            }
            match answer {
                Answer::Waiting(w) => {
                    return Ok(EnterOutcome::Waiting(self.lane_shown(w.in_whole_target(target), target)));
                }
                Answer::Admitted(token) => {
                    // Handed to the buyer only once a failover cannot lose it.
                    self.replicated(target).await?;
                    return Ok(EnterOutcome::Admitted(token));
                }
                Answer::Full => return Ok(EnterOutcome::Full),
                Answer::PreQueue(n) => return Ok(EnterOutcome::PreQueue(n)),
                Answer::Scheduled(n) => return Ok(EnterOutcome::Scheduled(n)),
                Answer::Closed(n) => return Ok(EnterOutcome::Closed(n)),
                Answer::TooMany(held) => return Ok(EnterOutcome::TooMany(held)),
                Answer::NotInQueue | Answer::Issue => {}
            }
        }
        Err(StoreError::Reply { what: "enter.lua", detail: "user left the queue while being admitted".into() })
    }

    pub(super) async fn evict_part(
        &self,
        target: QueueTarget,
        timeout_ms: u64,
        max: u64,
    ) -> Result<Evicted, StoreError> {
        let (users, more): (u64, u64) = on_target(&EVICT, target, EVICT_KEYS)
            .args(&EvictArgs {
                timeout_ms,
                max,
                key_ttl_s: self.limits.key_ttl_s,
                record_ttl_s: self.limits.record_ttl_s,
            })
            .invoke_async(&mut self.conn())
            .await?;
        Ok(Evicted { users, more: more == 1 })
    }

    /// One target's (or one shard's) admission of a tick, in slices. `plan`: a shard's tick
    /// and share of a sharded target's plan (`shards.rs`), admitted only while the shard's
    /// clock is in that tick; the shards after the first keep no event log of their own.
    pub(super) async fn admit_part(
        &self,
        target: QueueTarget,
        default_batch: u64,
        tick_ms: u64,
        instance: &str,
        plan: Option<(u64, u64)>,
    ) -> Result<AdmitOutcome, StoreError> {
        let names = if !target.shard.is_first() { &ADMIT_KEYS[..ADMIT_KEYS.len() - 1] } else { ADMIT_KEYS };
        // In slices of ADMIT_SLICE users: the first call starts the tick, each later one
        // continues it with what the one before returned, until admit.lua says it is done.
        let mut out = AdmitOutcome { advanced: false, mark: 0, tick: 0, admitted: 0, batch: default_batch };
        let mut continuation = String::new();
        loop {
            let fence = self.fences.fence(target);
            let r: Vec<String> = on_target(&ADMIT, target, names)
                .args(&AdmitArgs {
                    default_batch,
                    tick_ms,
                    key_ttl_s: self.limits.key_ttl_s,
                    instance,
                    mark_seen: fence.mark,
                    seq_seen: fence.seq_seen,
                    seq_to: fence.seq_to,
                    tick_seen: fence.tick,
                    record_ttl_s: self.limits.record_ttl_s,
                    events_max: self.limits.events.max_len,
                    admitted_every: self.limits.events.admitted_every,
                    slice: ADMIT_SLICE,
                    continuation: &continuation,
                    plan_tick: plan.map(|(tick, _)| tick),
                    plan_share: plan.map(|(_, share)| share),
                })
                .invoke_async(&mut self.conn())
                .await?;
            let advanced = num("admit.lua", &r, 0)? == 1;
            let mark = num("admit.lua", &r, 1)?;
            let tick = num("admit.lua", &r, 2)?;
            self.fences.observe(target, None, mark, advanced.then_some(tick), num("admit.lua", &r, 6)?, true);
            // The waits go to the Prometheus histogram of the instance that admitted.
            let waits: Vec<u64> =
                r.get(5).map_or("", String::as_str).split(',').filter_map(|w| w.parse().ok()).collect();
            crate::store::observe_waits(&waits);
            // A continuation refused (the tick ended meanwhile) keeps what the tick admitted.
            if continuation.is_empty() || advanced {
                out.advanced |= advanced;
                out.mark = mark;
                out.tick = tick;
                out.batch = num("admit.lua", &r, 4)?;
            }
            out.admitted += num("admit.lua", &r, 3)?;
            match r.get(8).filter(|c| advanced && num("admit.lua", &r, 7).ok() == Some(1) && !c.is_empty()) {
                Some(c) => continuation.clone_from(c),
                None => return Ok(out),
            }
        }
    }

    pub(super) async fn snapshot_part(&self, target: QueueTarget) -> Result<TargetSnapshot, StoreError> {
        let mut conn = self.conn();
        #[allow(clippy::type_complexity)]
        let (mark, seq, evicted, batch, capacity, lock, admissions, waits, oldest): (
            Option<u64>,
            Option<u64>,
            Option<u64>,
            Option<u64>,
            Option<u64>,
            Option<String>,
            Vec<String>,
            HashMap<String, u64>,
            Vec<String>,
        ) = redis::pipe()
            .get(keys::of(target, "admitted_count"))
            .get(keys::of(target, "seq"))
            .get(keys::of(target, "evicted"))
            .get(keys::of(target, "batch_size"))
            .get(keys::of(target, "capacity"))
            .get(keys::admission_lock(target))
            .lrange(keys::of(target, "admissions"), 0, -1)
            .hgetall(keys::of(target, "waits"))
            // The lowest member of entry_times is the oldest call with a seq the mark has not
            // passed (admit.lua drops the others): member "<first>-<last>:<ms>".
            .zrange(keys::of(target, "entry_times"), 0, 0)
            .query_async(&mut conn)
            .await?;
        let mark = mark.unwrap_or(0);
        let waiting: u64 = conn.zcount(keys::of(target, "waiting"), format!("({mark}"), "+inf").await?;
        let oldest_entry_ms = (waiting > 0)
            .then(|| oldest.first().and_then(|m| m.rsplit_once(':')).and_then(|(_, ms)| ms.parse().ok()))
            .flatten();
        let (sale, prequeued) = self.read_sale_and_prequeue(target).await?;
        let outflow: HashMap<String, String> = conn.hgetall(keys::of(target, "outflow")).await?;
        let outflow = super::codec::decode_outflow(&outflow);
        Ok(TargetSnapshot {
            outflow,
            sale,
            prequeued,
            waiting,
            mark,
            seq: seq.unwrap_or(0),
            evicted: evicted.unwrap_or(0),
            batch_override: batch,
            capacity,
            lock_holder: lock,
            admissions: admissions
                .iter()
                .filter_map(|a| {
                    let (t, n) = a.split_once(':')?;
                    Some((t.parse().ok()?, n.parse().ok()?))
                })
                .collect(),
            admitted_total: waits.get("admitted").copied().unwrap_or(0),
            tokens_issued: waits.get("tokens_issued").copied().unwrap_or(0),
            tokens_used: waits.get("tokens_used").copied().unwrap_or(0),
            direct_tokens_used: waits.get("direct_tokens_used").copied().unwrap_or(0),
            tokens_expired: waits.get("tokens_expired").copied().unwrap_or(0),
            waits: WaitHistogram {
                buckets: waits.iter().filter_map(|(k, v)| Some((k.strip_prefix("b:")?.parse().ok()?, *v))).collect(),
                count: waits.get("count").copied().unwrap_or(0),
                sum_ms: waits.get("sum_ms").copied().unwrap_or(0),
            },
            oldest_entry_ms,
        })
    }
}

impl TargetOps for RedisStore {
    async fn register_active(&self, target: QueueTarget) -> Result<(), StoreError> {
        let _: u64 = self.conn().sadd(keys::ACTIVE, target.to_string()).await?;
        Ok(())
    }

    async fn publish_capacity(&self, target: QueueTarget) -> Result<(), StoreError> {
        for part in self.parts(target) {
            let key = keys::of(part, "capacity");
            let _: () = self.conn().set_ex(key, self.capacity_of(part), self.limits.key_ttl_s).await?;
        }
        Ok(())
    }

    async fn deactivate(&self, target: QueueTarget) -> Result<(), StoreError> {
        let _: u64 = self.conn().srem(keys::ACTIVE, target.to_string()).await?;
        Ok(())
    }

    async fn declared_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        let members: Vec<String> = self.conn().smembers(keys::TARGETS).await?;
        Ok(members.iter().filter_map(|m| m.parse().ok()).collect())
    }

    async fn declare_target(&self, target: QueueTarget, room: u64) -> Result<DeclareOutcome, StoreError> {
        // Operators' commands, not clients': the check and the add need not be one step.
        let mut conn = self.conn();
        if conn.sismember(keys::TARGETS, target.to_string()).await? {
            return Ok(DeclareOutcome::AlreadyDeclared);
        }
        let count: u64 = conn.scard(keys::TARGETS).await?;
        if count >= room {
            return Ok(DeclareOutcome::Full { room });
        }
        let _: u64 = conn.sadd(keys::TARGETS, target.to_string()).await?;
        Ok(DeclareOutcome::Added)
    }

    async fn undeclare_target(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let removed: u64 = self.conn().srem(keys::TARGETS, target.to_string()).await?;
        Ok(removed > 0)
    }

    async fn active_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        let members: Vec<String> = self.conn().smembers(keys::ACTIVE).await?;
        // A member that does not parse was written by hand; skip it rather than stop the pump.
        Ok(members.iter().filter_map(|m| m.parse().ok()).collect())
    }

    async fn forget_if_expired(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let mut conn = self.conn();
        let parts = self.parts(target);
        for part in &parts {
            let alive: bool = conn.exists(keys::of(*part, "seq")).await?;
            if alive {
                return Ok(false);
            }
        }
        let _: u64 = conn.srem(keys::ACTIVE, target.to_string()).await?;
        for part in parts {
            self.fences.forget(part);
        }
        Ok(true)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let _: String = redis::cmd("PING").query_async(&mut self.conn()).await?;
        Ok(())
    }
}
