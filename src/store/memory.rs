//! The embedded store: the semantics of the Lua scripts, in one process, under one mutex.
//!
//! For trial runs of a single `vq serve` only: two processes on it are two separate queues.
//! Its clock is the process clock (the Redis store uses Redis' `TIME`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{
    AdmitOutcome, Candidate, EnterOutcome, FlagAck, PaceSlot, PendingOpening, QueueStore, SaleView, ScheduleOutcome,
    StatusOutcome, StoreError, StoreLimits, TargetSnapshot, TokenClaim, Waiting,
};
use crate::domain::{
    FlagChange, FlagFields, FlagState, LedgerEntry, QueueTarget, SaleControl, SaleSchedule, UserId, WaitHistogram,
};

use crate::clock::now_epoch_ms as now_ms;

mod sale;

#[derive(Default)]
struct TargetState {
    waiting: BTreeMap<u64, UserId>,
    seq_of: HashMap<UserId, u64>,
    heartbeat: HashMap<UserId, u64>,
    seq: u64,
    mark: u64,
    last_tick: Option<u64>,
    /// token and its expiry (ms)
    tokens: HashMap<UserId, (String, u64)>,
    /// Every token each user bought with, and its expiry (ms): `queue:{T}:used:{user}`.
    used: HashMap<UserId, HashMap<String, u64>>,
    lock: Option<(String, u64)>,
    batch_override: Option<u64>,
    evicted: u64,
    admissions: Vec<(u64, u64)>,
    entered_at: HashMap<UserId, u64>,
    waits: WaitHistogram,
    admitted_total: u64,
    tokens_issued: u64,
    tokens_used: u64,
    direct_tokens_used: u64,
    /// Last time any of the target's state was written (ms): the sliding key TTL.
    touched: u64,
}

impl TargetState {
    fn remove(&mut self, user: UserId) -> bool {
        self.heartbeat.remove(&user);
        self.entered_at.remove(&user);
        match self.seq_of.remove(&user) {
            Some(seq) => {
                self.waiting.remove(&seq);
                true
            }
            None => false,
        }
    }

    fn ahead(&self, seq: u64) -> u64 {
        self.waiting.range(self.mark + 1..seq).count() as u64
    }

    fn waiting_count(&self) -> u64 {
        self.waiting.range(self.mark + 1..).count() as u64
    }

    fn live_token(&mut self, user: UserId, now: u64) -> Option<String> {
        match self.tokens.get(&user) {
            Some((t, exp)) if *exp > now => Some(t.strip_prefix("used:").unwrap_or(t).to_owned()),
            Some(_) => {
                self.tokens.remove(&user);
                None
            }
            None => None,
        }
    }

    /// The shared tail of enter and status for a user holding `seq`.
    fn position(
        &mut self,
        user: UserId,
        seq: u64,
        candidate: &dyn Candidate,
        token_ttl_s: u64,
        now: u64,
    ) -> Result<Waiting, String> {
        if seq <= self.mark {
            let token = candidate.token();
            self.tokens.insert(user, (token.clone(), now + token_ttl_s * 1000));
            self.tokens_issued += 1;
            self.remove(user);
            return Err(token);
        }
        self.heartbeat.insert(user, now);
        self.touched = now;
        Ok(Waiting { seq, mark: self.mark, ahead: self.ahead(seq), batch_override: self.batch_override, paused: false })
    }
}

#[derive(Default)]
struct Inner {
    targets: HashMap<QueueTarget, TargetState>,
    active: BTreeSet<QueueTarget>,
    flag: HashMap<String, String>,
    global_batch: Option<u64>,
    acks: HashMap<String, (FlagAck, u64)>,
    /// (target, tick) -> purchases forwarded by the gate
    forwarded: HashMap<(QueueTarget, u64), u64>,
    /// Each target's sale and ledger (`queue:{T}:sale`, `prequeue`, `ledger`).
    sales: HashMap<QueueTarget, sale::MemSale>,
}

/// In-process store with the semantics of [`super::RedisStore`].
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    limits: StoreLimits,
}

impl MemoryStore {
    pub fn new(limits: StoreLimits) -> Self {
        Self { inner: Arc::default(), limits }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What `flag_set.lua` does, under the lock: overrides cleared with the write, the new
    /// version above every acknowledged one.
    fn write_flag_fields(&self, fields: FlagFields) -> u64 {
        let now = now_ms();
        let mut inner = self.lock();
        if fields.clear_overrides {
            inner.flag.retain(|k, _| !k.starts_with("target:"));
        }
        inner.flag.extend(fields.set);
        for k in fields.delete {
            inner.flag.remove(&k);
        }
        let floor = inner.acks.values().filter(|(_, until)| *until > now).map(|(a, _)| a.version + 1).max();
        let next = inner.flag.get("version").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) + 1;
        let version = next.max(floor.unwrap_or(0));
        inner.flag.insert("version".into(), version.to_string());
        version
    }
}

impl QueueStore for MemoryStore {
    async fn enter(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> Result<EnterOutcome, StoreError> {
        let now = now_ms();
        let mut inner = self.lock();
        let t = inner.targets.entry(target).or_default();
        if let Some(token) = t.live_token(user, now) {
            return Ok(EnterOutcome::Admitted(token));
        }
        if let Some(answer) = sale::enter_gate(&mut inner, target, user, now, self.limits.max_capacity) {
            return Ok(answer);
        }
        let paused = sale::paused(&inner, target);
        let t = inner.targets.entry(target).or_default();
        let seq = match t.seq_of.get(&user) {
            Some(seq) => *seq,
            None => {
                if t.waiting_count() >= self.limits.max_capacity {
                    return Ok(EnterOutcome::Full);
                }
                t.seq += 1;
                t.waiting.insert(t.seq, user);
                t.seq_of.insert(user, t.seq);
                t.entered_at.insert(user, now);
                t.seq
            }
        };
        Ok(match t.position(user, seq, candidate, self.limits.token_ttl_s, now) {
            Ok(w) => EnterOutcome::Waiting(Waiting { paused, ..w }),
            Err(token) => EnterOutcome::Admitted(token),
        })
    }

    async fn status(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> Result<StatusOutcome, StoreError> {
        let now = now_ms();
        let mut inner = self.lock();
        let Some(t) = inner.targets.get_mut(&target) else {
            return Ok(StatusOutcome::NotInQueue);
        };
        if let Some(token) = t.live_token(user, now) {
            return Ok(StatusOutcome::Admitted(token));
        }
        if let Some(answer) = sale::status_gate(&mut inner, target, user, now) {
            return Ok(answer);
        }
        let paused = sale::paused(&inner, target);
        let Some(t) = inner.targets.get_mut(&target) else {
            return Ok(StatusOutcome::NotInQueue);
        };
        let Some(seq) = t.seq_of.get(&user).copied() else {
            return Ok(StatusOutcome::NotInQueue);
        };
        Ok(match t.position(user, seq, candidate, self.limits.token_ttl_s, now) {
            Ok(w) => StatusOutcome::Waiting(Waiting { paused, ..w }),
            Err(token) => StatusOutcome::Admitted(token),
        })
    }

    async fn leave(&self, target: QueueTarget, user: UserId) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        sale::forget_prequeued(&mut inner, target, user);
        Ok(inner.targets.get_mut(&target).is_some_and(|t| t.remove(user)))
    }

    async fn try_lock_admission(&self, target: QueueTarget, holder: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let now = now_ms();
        let mut inner = self.lock();
        let t = inner.targets.entry(target).or_default();
        if t.lock.as_ref().is_some_and(|(_, until)| *until > now) {
            return Ok(false);
        }
        t.lock = Some((holder.to_owned(), now + ttl_ms));
        Ok(true)
    }

    async fn admit(&self, target: QueueTarget, default_batch: u64, tick_ms: u64) -> Result<AdmitOutcome, StoreError> {
        let now = now_ms();
        let tick = now / tick_ms.max(1);
        let mut inner = self.lock();
        let t = inner.targets.entry(target).or_default();
        let batch = t.batch_override.unwrap_or(default_batch);
        if t.last_tick.is_some_and(|last| tick <= last) {
            return Ok(AdmitOutcome { advanced: false, mark: t.mark, tick, admitted: 0, batch });
        }
        if sale::admission_held(&mut inner, target, now) {
            let t = inner.targets.entry(target).or_default();
            t.touched = now;
            return Ok(AdmitOutcome { advanced: false, mark: t.mark, tick, admitted: 0, batch });
        }
        let t = inner.targets.entry(target).or_default();
        let before = t.mark;
        t.last_tick = Some(tick);
        let front: Vec<(u64, UserId)> =
            t.waiting.range(t.mark + 1..).take(batch as usize).map(|(s, u)| (*s, *u)).collect();
        if let Some((last, _)) = front.last() {
            t.mark = *last;
        }
        for (_, user) in &front {
            if let Some(at) = t.entered_at.remove(user) {
                t.waits.record(now.saturating_sub(at));
                crate::metrics::wait_observed(now.saturating_sub(at));
            }
        }
        let admitted = front.len() as u64;
        t.admitted_total += admitted;
        t.admissions.insert(0, (tick, admitted));
        t.admissions.truncate(60);
        t.touched = now;
        let mark = t.mark;
        if admitted > 0 {
            let step = LedgerEntry::Admission {
                at_ms: now,
                mark_before: before,
                mark_after: mark,
                admitted,
                instance: "embedded".into(),
            };
            sale::ledger_entry(&mut inner, target, step);
        }
        Ok(AdmitOutcome { advanced: true, mark, tick, admitted, batch })
    }

    async fn evict(&self, target: QueueTarget, timeout_ms: u64, max: u64) -> Result<u64, StoreError> {
        let cutoff = now_ms().saturating_sub(timeout_ms);
        let mut inner = self.lock();
        let Some(t) = inner.targets.get_mut(&target) else {
            return Ok(0);
        };
        let mut stale: Vec<(u64, UserId)> =
            t.heartbeat.iter().filter(|(_, hb)| **hb < cutoff).map(|(u, hb)| (*hb, *u)).collect();
        stale.sort_unstable();
        stale.truncate(max as usize);
        for (_, user) in &stale {
            t.remove(*user);
        }
        t.evicted += stale.len() as u64;
        for (_, user) in &stale {
            sale::forget_prequeued(&mut inner, target, *user);
        }
        Ok(stale.len() as u64)
    }

    async fn register_active(&self, target: QueueTarget) -> Result<(), StoreError> {
        self.lock().active.insert(target);
        Ok(())
    }

    async fn publish_capacity(&self, _target: QueueTarget) -> Result<(), StoreError> {
        // One instance holds the embedded store: its own capacity is the one in force.
        Ok(())
    }

    async fn active_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        Ok(self.lock().active.iter().copied().collect())
    }

    async fn forget_if_expired(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let now = now_ms();
        let ttl_ms = self.limits.key_ttl_s * 1000;
        let mut inner = self.lock();
        let expired = inner.targets.get(&target).is_none_or(|t| t.touched + ttl_ms < now);
        if expired {
            inner.targets.remove(&target);
            inner.active.remove(&target);
        }
        Ok(expired)
    }

    async fn read_stored_flag(&self) -> Result<Option<FlagState>, StoreError> {
        let inner = self.lock();
        Ok((!inner.flag.is_empty()).then(|| FlagState::from_fields(&inner.flag)))
    }

    async fn write_flag(&self, set: Vec<(String, String)>, delete: Vec<String>) -> Result<u64, StoreError> {
        Ok(self.write_flag_fields(FlagFields { set, delete, clear_overrides: false }))
    }

    async fn change_flag(&self, change: FlagChange) -> Result<u64, StoreError> {
        Ok(self.write_flag_fields(change.fields()))
    }

    async fn global_batch_size(&self) -> Result<Option<u64>, StoreError> {
        Ok(self.lock().global_batch)
    }

    async fn set_batch_size(&self, target: Option<QueueTarget>, batch: Option<u64>) -> Result<(), StoreError> {
        let mut inner = self.lock();
        match target {
            Some(t) => inner.targets.entry(t).or_default().batch_override = batch,
            None => inner.global_batch = batch,
        }
        Ok(())
    }

    async fn snapshot(&self, target: QueueTarget) -> Result<TargetSnapshot, StoreError> {
        let now = now_ms();
        let inner = self.lock();
        let Some(t) = inner.targets.get(&target) else {
            return Ok(TargetSnapshot::default());
        };
        Ok(TargetSnapshot {
            waiting: t.waiting_count(),
            mark: t.mark,
            seq: t.seq,
            evicted: t.evicted,
            batch_override: t.batch_override,
            capacity: Some(self.limits.max_capacity),
            lock_holder: t.lock.as_ref().filter(|(_, until)| *until > now).map(|(h, _)| h.clone()),
            admissions: t.admissions.clone(),
            admitted_total: t.admitted_total,
            tokens_issued: t.tokens_issued,
            tokens_used: t.tokens_used,
            direct_tokens_used: t.direct_tokens_used,
            waits: t.waits.clone(),
            sale: sale::read(&inner, target, now).0,
            prequeued: sale::read(&inner, target, now).1,
        })
    }

    async fn claim_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        ttl_s: u64,
    ) -> Result<TokenClaim, StoreError> {
        let now = now_ms();
        let mut inner = self.lock();
        let t = inner.targets.entry(target).or_default();
        let used = format!("used:{token}");
        let previous = t.tokens.get(&user).filter(|(_, exp)| *exp > now).map(|(v, _)| v.clone());
        let spent = t.used.entry(user).or_default();
        spent.retain(|_, exp| *exp > now);
        if previous.as_deref() == Some(used.as_str()) || spent.contains_key(token) {
            return Ok(TokenClaim::AlreadyUsed);
        }
        let expires = now + ttl_s.max(1) * 1000;
        spent.insert(token.to_owned(), expires);
        t.tokens.insert(user, (used, expires));
        Ok(TokenClaim::Claimed { previous })
    }

    async fn release_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        previous: Option<String>,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let Some(t) = inner.targets.get_mut(&target) else { return Ok(()) };
        if let Some(spent) = t.used.get_mut(&user) {
            spent.remove(token);
        }
        let used = format!("used:{token}");
        if t.tokens.get(&user).is_some_and(|(v, _)| *v == used) {
            match previous {
                Some(p) => {
                    if let Some(entry) = t.tokens.get_mut(&user) {
                        entry.0 = p;
                    }
                }
                None => {
                    t.tokens.remove(&user);
                }
            }
        }
        Ok(())
    }

    async fn confirm_token_used(&self, target: QueueTarget, through_queue: bool) -> Result<(), StoreError> {
        let mut state = self.lock();
        let t = state.targets.entry(target).or_default();
        if through_queue {
            t.tokens_used += 1;
        } else {
            t.direct_tokens_used += 1;
        }
        Ok(())
    }

    async fn token_used(&self, target: QueueTarget, user: UserId, token: &str) -> Result<bool, StoreError> {
        let now = now_ms();
        let inner = self.lock();
        let Some(t) = inner.targets.get(&target) else { return Ok(false) };
        let spent = t.used.get(&user).and_then(|s| s.get(token)).is_some_and(|exp| *exp > now);
        Ok(spent || t.tokens.get(&user).is_some_and(|(v, exp)| *exp > now && v.strip_prefix("used:") == Some(token)))
    }

    async fn pace_purchase(
        &self,
        target: QueueTarget,
        default_budget: u64,
        tick_ms: u64,
        ahead: u64,
    ) -> Result<Option<PaceSlot>, StoreError> {
        let now = now_ms();
        let tick_ms = tick_ms.max(1);
        let first = (now + super::redis::PACE_GUARD_MS) / tick_ms;
        let mut inner = self.lock();
        let budget = inner.targets.get(&target).and_then(|t| t.batch_override).unwrap_or(default_budget);
        inner.forwarded.retain(|(_, tick), _| *tick + 3 > first);
        for tick in first..=first + ahead {
            let n = inner.forwarded.entry((target, tick)).or_default();
            if *n < budget {
                *n += 1;
                return Ok(Some(PaceSlot {
                    starts_in_ms: (tick * tick_ms).saturating_sub(now),
                    ends_in_ms: ((tick + 1) * tick_ms).saturating_sub(now),
                }));
            }
        }
        Ok(None)
    }

    async fn ack_flag(&self, ack: FlagAck, ttl_ms: u64) -> Result<(), StoreError> {
        let until = now_ms() + ttl_ms;
        self.lock().acks.insert(ack.instance.clone(), (ack, until));
        Ok(())
    }

    async fn flag_acks(&self) -> Result<Vec<FlagAck>, StoreError> {
        let now = now_ms();
        let inner = self.lock();
        let mut acks: Vec<FlagAck> =
            inner.acks.values().filter(|(_, until)| *until > now).map(|(a, _)| a.clone()).collect();
        acks.sort_by(|a, b| a.instance.cmp(&b.instance));
        Ok(acks)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn schedule_sale(
        &self,
        target: QueueTarget,
        schedule: SaleSchedule,
        seed: [u8; 32],
    ) -> Result<ScheduleOutcome, StoreError> {
        Ok(sale::schedule(&mut self.lock(), target, schedule, seed))
    }

    async fn read_sale(&self, target: QueueTarget) -> Result<Option<SaleView>, StoreError> {
        Ok(sale::read(&self.lock(), target, now_ms()).0)
    }

    async fn control_sale(&self, target: QueueTarget, control: SaleControl) -> Result<bool, StoreError> {
        Ok(sale::control(&mut self.lock(), target, control, now_ms()))
    }

    async fn pending_opening(&self, _target: QueueTarget) -> Result<Option<PendingOpening>, StoreError> {
        // The embedded store writes the opening order in the step that freezes the pre-queue.
        Ok(None)
    }

    async fn place_opening(
        &self,
        _target: QueueTarget,
        _places: &[(u64, UserId)],
        _opens_at_ms: u64,
        _last: bool,
    ) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn sale_ledger(&self, target: QueueTarget) -> Result<Vec<LedgerEntry>, StoreError> {
        Ok(sale::ledger(&self.lock(), target))
    }
}
