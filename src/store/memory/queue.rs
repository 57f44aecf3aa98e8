//! The embedded store's queue: what `enter.lua`, `status.lua`, `leave.lua`, `admit.lua` and
//! `evict.lua` do, under the store's one mutex.

use super::{MemoryStore, Place, sale};
use crate::domain::{EventKind, LedgerEntry, QueueTarget, UserId};
use crate::store::rules::{ADMISSIONS_KEPT, TTL_REFRESH_EVERY};
use crate::store::{
    AdmitOutcome, Candidate, EnterOutcome, Evicted, QueueOps, StatusOutcome, StoreError, TargetSnapshot, Waiting,
};

impl QueueOps for MemoryStore {
    async fn enter(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> Result<EnterOutcome, StoreError> {
        let user = &user;
        let now = self.now_ms();
        let ttl_ms = self.key_ttl_ms();
        let mut inner = self.lock();
        let t = inner.target(target, now);
        if !t.queue.seq_of.contains_key(user)
            && let Some(token) = t.live_token(user, now)
        {
            return Ok(EnterOutcome::Admitted(token));
        }
        if let Some(answer) = sale::enter_gate(&mut inner, target, user, now, self.limits.capacity(target.kind), ttl_ms)
        {
            return Ok(answer);
        }
        let paused = sale::paused(&inner, target);
        let t = inner.target(target, now);
        let seq = match t.queue.seq_of.get(user) {
            Some(seq) => *seq,
            None => {
                if let Some(token) = t.live_token(user, now) {
                    return Ok(EnterOutcome::Admitted(token));
                }
                let q = &mut t.queue;
                if q.waiting_count() >= self.limits.capacity(target.kind) {
                    return Ok(EnterOutcome::Full);
                }
                q.seq += 1;
                q.waiting.insert(q.seq, user.clone());
                q.seq_of.insert(user.clone(), q.seq);
                q.entered_at.insert(user.clone(), now);
                if q.seq % TTL_REFRESH_EVERY == 1 {
                    q.expires_at = Some(now + ttl_ms);
                }
                let seq = q.seq;
                let tick = inner.record_tick(now);
                *inner.record(target, now).arrivals.entry(tick).or_default() += 1;
                seq
            }
        };
        let t = inner.target(target, now);
        Ok(match t.position(user, seq, candidate, self.limits.token_ttl_s, now) {
            Place::Waiting(w) => EnterOutcome::Waiting(Waiting { paused, ..w }),
            Place::Admitted(token) => {
                inner.record_issue(target, now);
                EnterOutcome::Admitted(token)
            }
        })
    }

    async fn status(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> Result<StatusOutcome, StoreError> {
        let user = &user;
        let now = self.now_ms();
        let mut inner = self.lock();
        if let Some(t) = inner.existing(target, now)
            && !t.queue.seq_of.contains_key(user)
            && let Some(token) = t.live_token(user, now)
        {
            return Ok(StatusOutcome::Admitted(token));
        }
        // Before the target's queue holds anyone, a sale may still answer (closed: CLOSED).
        if let Some(answer) = sale::status_gate(&mut inner, target, user, now, self.key_ttl_ms()) {
            return Ok(answer);
        }
        let paused = sale::paused(&inner, target);
        let Some(t) = inner.existing(target, now) else {
            return Ok(StatusOutcome::NotInQueue);
        };
        let Some(seq) = t.queue.seq_of.get(user).copied() else {
            return Ok(match t.live_token(user, now) {
                Some(token) => StatusOutcome::Admitted(token),
                None => StatusOutcome::NotInQueue,
            });
        };
        Ok(match t.position(user, seq, candidate, self.limits.token_ttl_s, now) {
            Place::Waiting(w) => StatusOutcome::Waiting(Waiting { paused, ..w }),
            Place::Admitted(token) => {
                inner.record_issue(target, now);
                StatusOutcome::Admitted(token)
            }
        })
    }

    async fn leave(&self, target: QueueTarget, user: UserId) -> Result<bool, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let prequeued = sale::forget_prequeued(&mut inner, target, &user);
        let waiting = inner.existing(target, now).is_some_and(|t| t.queue.remove(&user));
        if waiting || prequeued {
            inner.record(target, now).left += 1;
        }
        Ok(waiting)
    }

    async fn hold_queue(
        &self,
        user: UserId,
        target: QueueTarget,
        max: u64,
    ) -> Result<Vec<(QueueTarget, u64)>, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let until = now + self.key_ttl_ms();
        let held = inner.user_queues.entry(user).or_default();
        if held.1 <= now {
            held.0.clear();
        }
        if !held.0.contains_key(&target) && held.0.len() as u64 >= max {
            return Ok(held.0.iter().map(|(t, at)| (*t, now.saturating_sub(*at))).collect());
        }
        held.0.entry(target).or_insert(now);
        held.1 = until;
        Ok(Vec::new())
    }

    async fn release_queues(&self, user: UserId, targets: &[QueueTarget]) -> Result<(), StoreError> {
        let mut inner = self.lock();
        if let Some(held) = inner.user_queues.get_mut(&user) {
            for t in targets {
                held.0.remove(t);
            }
        }
        Ok(())
    }

    async fn holds_place(&self, target: QueueTarget, user: UserId) -> Result<bool, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let waiting = inner.existing(target, now).is_some_and(|t| t.queue.seq_of.contains_key(&user));
        Ok(waiting || sale::holds_prequeued(&inner, target, &user))
    }

    async fn try_lock_admission(&self, target: QueueTarget, holder: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let t = inner.target(target, now);
        if t.lock.as_ref().is_some_and(|(_, until)| *until > now) {
            return Ok(false);
        }
        t.lock = Some((holder.to_owned(), now + ttl_ms));
        Ok(true)
    }

    async fn admit(&self, target: QueueTarget, default_batch: u64, tick_ms: u64) -> Result<AdmitOutcome, StoreError> {
        let now = self.now_ms();
        let tick = now / tick_ms.max(1);
        let ttl_ms = self.key_ttl_ms();
        let mut inner = self.lock();
        let t = inner.target(target, now);
        let batch = t.batch_override.unwrap_or(default_batch);
        if t.last_tick.is_some_and(|last| tick <= last) {
            return Ok(AdmitOutcome { advanced: false, mark: t.queue.mark, tick, admitted: 0, batch });
        }
        if sale::admission_held(&mut inner, target, now, ttl_ms) {
            let t = inner.target(target, now);
            t.queue.expires_at = Some(now + ttl_ms);
            return Ok(AdmitOutcome { advanced: false, mark: t.queue.mark, tick, admitted: 0, batch });
        }
        let t = inner.target(target, now);
        t.last_tick = Some(tick);
        let q = &mut t.queue;
        let before = q.mark;
        let front: Vec<(u64, UserId)> =
            q.waiting.range(q.mark + 1..).take(batch as usize).map(|(s, u)| (*s, u.clone())).collect();
        if let Some((last, _)) = front.last() {
            q.mark = *last;
        }
        let mut waits = Vec::with_capacity(front.len());
        for (_, user) in &front {
            if let Some(at) = q.entered_at.remove(user) {
                q.waits.record(now.saturating_sub(at));
                waits.push(now.saturating_sub(at));
            }
        }
        crate::store::observe_waits(&waits);
        let admitted = front.len() as u64;
        q.admitted_total += admitted;
        // The sliding TTL of admit.lua: only while anyone waits (admitted users count until
        // their token is stored).
        if admitted > 0 || !q.waiting.is_empty() {
            q.expires_at = Some(now + ttl_ms);
        }
        let mark = q.mark;
        let total = q.admitted_total;
        let (admissions, until) = &mut t.admissions;
        if *until <= now {
            admissions.clear();
        }
        // The line is gone: the tick before filled its batch, this one does not.
        let emptied = admitted < batch && admissions.first().is_some_and(|(_, n)| *n >= batch);
        admissions.insert(0, (tick, admitted));
        admissions.truncate(ADMISSIONS_KEPT as usize);
        *until = now + ttl_ms;
        if admitted > 0 {
            let r = inner.record(target, now);
            r.tick_ms = Some(tick_ms.max(1));
            *r.admissions.entry(tick).or_default() += admitted;
            r.admitted += admitted;
            for w in waits {
                r.waits.record(w);
                r.wait_max_ms = r.wait_max_ms.max(Some(w));
            }
            let step = LedgerEntry::Admission {
                at_ms: now,
                mark_before: before,
                mark_after: mark,
                admitted,
                instance: "embedded".into(),
            };
            sale::ledger_entry(&mut inner, target, now, step);
            // Milestones: the first users admitted, and each multiple of events.admitted_every.
            let (was, every) = (total - admitted, inner.event_limits.admitted_every);
            if was == 0 {
                inner.target_event(target, now, EventKind::FirstAdmission { admitted: total });
            }
            if every > 0 && was / every < total / every {
                inner.target_event(target, now, EventKind::AdmissionMilestone { admitted: total });
            }
        }
        if emptied {
            inner.target_event(target, now, EventKind::QueueEmptied { mark });
        }
        Ok(AdmitOutcome { advanced: true, mark, tick, admitted, batch })
    }

    async fn evict(&self, target: QueueTarget, timeout_ms: u64, max: u64) -> Result<Evicted, StoreError> {
        let now = self.now_ms();
        let cutoff = now.saturating_sub(timeout_ms);
        let mut inner = self.lock();
        let Some(t) = inner.existing(target, now) else {
            return Ok(Evicted::default());
        };
        let q = &mut t.queue;
        let mut stale: Vec<(u64, UserId)> =
            q.heartbeat.iter().filter(|(_, hb)| **hb < cutoff).map(|(u, hb)| (*hb, u.clone())).collect();
        stale.sort_unstable();
        stale.truncate(max as usize);
        for (_, user) in &stale {
            q.remove(user);
        }
        q.evicted += stale.len() as u64;
        for (_, user) in &stale {
            sale::forget_prequeued(&mut inner, target, user);
        }
        if !stale.is_empty() {
            inner.record(target, now).evicted += stale.len() as u64;
        }
        Ok(Evicted { users: stale.len() as u64, more: stale.len() as u64 == max })
    }

    async fn snapshot(&self, target: QueueTarget) -> Result<TargetSnapshot, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let (sale, prequeued) = sale::read(&inner, target, now);
        let Some(t) = inner.existing(target, now) else {
            return Ok(TargetSnapshot::default());
        };
        let q = &t.queue;
        Ok(TargetSnapshot {
            waiting: q.waiting_count(),
            mark: q.mark,
            seq: q.seq,
            evicted: q.evicted,
            batch_override: t.batch_override,
            outflow: t.outflow.clone(),
            capacity: t.capacity.filter(|(_, until)| *until > now).map(|(c, _)| c),
            lock_holder: t.lock.as_ref().filter(|(_, until)| *until > now).map(|(h, _)| h.clone()),
            admissions: if t.admissions.1 > now { t.admissions.0.clone() } else { Vec::new() },
            admitted_total: q.admitted_total,
            tokens_issued: q.tokens_issued,
            tokens_used: q.tokens_used,
            direct_tokens_used: q.direct_tokens_used,
            tokens_expired: q.tokens_expired,
            waits: q.waits.clone(),
            oldest_entry_ms: q.waiting.range(q.mark + 1..).find_map(|(_, u)| q.entered_at.get(u).copied()),
            sale,
            prequeued,
        })
    }
}
