//! The embedded store: the semantics of the Lua scripts, in one process, under one mutex.
//!
//! For trial runs of a single `vq serve` only: two processes on it are two separate queues.
//! Its clock is the process clock (the Redis store uses Redis' `TIME`). State expires as the
//! Redis keys it stands for do (checked when next touched): a target's queue `key_ttl_s` after
//! the last refresh `admit.lua` or `enter.lua` would make, tokens and used marks with the
//! token, the lock with its lease. Redis is the reference: `tests/it/conformance.rs` runs
//! every operation on both, and a difference is fixed here.
//!
//! One file (over 400 lines): its state model and each operation are read side by side with the
//! script that operation mirrors.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{
    AdmitOutcome, BatchChange, Candidate, ClearOutcome, DeclareOutcome, EnterOutcome, FLAG_ACK_KEEP_MS, FlagAck,
    FlagOps, GateOps, OutflowClaim, OutflowOps, OutflowState, PaceSlot, PendingOpening, QueueOps, SaleOps, SaleView,
    ScheduleOutcome, StatusOutcome, StoreError, StoreLimits, TargetOps, TargetSnapshot, TokenClaim, TokensEnded,
    Waiting,
};
use crate::domain::{
    AnswerClass, FlagChange, FlagFields, FlagState, LedgerEntry, Observations, QueueTarget, SaleControl, SaleSchedule,
    TargetRecord, UserId, WaitHistogram,
};

use crate::clock::{SharedClock, system};

mod sale;

/// What Redis keeps in the keys `admit.lua` refreshes together (waiting, heartbeat, seq, mark,
/// entry times, waits, evicted, departed): they expire `key_ttl_s` after the last refresh, and
/// a refresh happens only while someone waits (every tick) or when `enter.lua` gives seq 1,
/// 65, 129, …. Expired, the target's queue starts again from nothing.
#[derive(Default)]
struct QueueKeys {
    waiting: BTreeMap<u64, UserId>,
    seq_of: HashMap<UserId, u64>,
    heartbeat: HashMap<UserId, u64>,
    seq: u64,
    mark: u64,
    evicted: u64,
    entered_at: HashMap<UserId, u64>,
    waits: WaitHistogram,
    admitted_total: u64,
    tokens_issued: u64,
    tokens_used: u64,
    direct_tokens_used: u64,
    tokens_expired: u64,
    /// When these keys expire (ms); `None` before their first refresh.
    expires_at: Option<u64>,
}

impl QueueKeys {
    fn remove(&mut self, user: &UserId) -> bool {
        self.heartbeat.remove(user);
        self.entered_at.remove(user);
        match self.seq_of.remove(user) {
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
}

/// A target's state. Besides its queue, what Redis keeps in keys with lifetimes of their own:
/// stored tokens and used marks (the token's lifetime), the lock, the runtime batch size (no
/// expiry), the admissions list and the published capacity (`key_ttl_s` from their writes).
#[derive(Default)]
struct TargetState {
    queue: QueueKeys,
    /// The last tick advanced; ticks only grow, so an old one never stops a later tick.
    last_tick: Option<u64>,
    /// token and its expiry (ms)
    tokens: HashMap<UserId, (String, u64)>,
    /// Users holding a token issued and not used yet, with its expiry (ms): `queue:{T}:unused`.
    unused: HashMap<UserId, u64>,
    /// Every token each user bought with, and its expiry (ms): `queue:{T}:used:{user}`.
    used: HashMap<UserId, HashMap<String, u64>>,
    /// Proof-of-work challenges used, until their expiry (ms): `queue:{T}:pow:{id}`.
    spent: HashMap<String, u64>,
    lock: Option<(String, u64)>,
    batch_override: Option<u64>,
    /// (tick, users admitted), newest first, and when the list expires (ms).
    admissions: (Vec<(u64, u64)>, u64),
    /// The capacity in force and when it expires (ms).
    capacity: Option<(u64, u64)>,
    /// The adaptive outflow: the last decision, the last interval claimed, and what the gates
    /// saw per interval (the newest few).
    outflow: Option<OutflowState>,
    outflow_interval: Option<u64>,
    observations: BTreeMap<u64, Observations>,
}

/// Where a user holding a seq stands after an enter or a poll.
enum Place {
    Waiting(Waiting),
    /// Admitted now: the token stored.
    Admitted(String),
}

impl TargetState {
    /// Drops the queue once its keys have expired, as Redis does by itself.
    fn expire(&mut self, now: u64) {
        if self.queue.expires_at.is_some_and(|at| at <= now) {
            self.queue = QueueKeys::default();
        }
    }

    /// Nothing left that Redis would still hold for the target.
    fn is_gone(&self, now: u64) -> bool {
        let q = &self.queue;
        q.seq == 0
            && q.expires_at.is_none()
            && (q.tokens_used, q.direct_tokens_used, q.tokens_issued) == (0, 0, 0)
            && self.batch_override.is_none()
            && self.tokens.values().all(|(_, exp)| *exp <= now)
            && self.used.values().flat_map(HashMap::values).all(|exp| *exp <= now)
            && self.spent.values().all(|until| *until <= now)
            && self.lock.as_ref().is_none_or(|(_, until)| *until <= now)
            && self.admissions.1 <= now
            && self.capacity.is_none_or(|(_, until)| until <= now)
    }

    fn live_token(&mut self, user: &UserId, now: u64) -> Option<String> {
        match self.tokens.get(user) {
            Some((t, exp)) if *exp > now => Some(t.strip_prefix("used:").unwrap_or(t).to_owned()),
            Some(_) => {
                self.tokens.remove(user);
                None
            }
            None => None,
        }
    }

    /// The shared tail of enter and status for a user holding `seq`.
    fn position(&mut self, user: &UserId, seq: u64, candidate: &dyn Candidate, token_ttl_s: u64, now: u64) -> Place {
        let q = &mut self.queue;
        if seq <= q.mark {
            let token = candidate.token();
            self.tokens.insert(user.clone(), (token.clone(), now + token_ttl_s * 1000));
            self.unused.insert(user.clone(), now + token_ttl_s * 1000);
            q.tokens_issued += 1;
            q.remove(user);
            return Place::Admitted(token);
        }
        q.heartbeat.insert(user.clone(), now);
        Place::Waiting(Waiting {
            seq,
            mark: q.mark,
            ahead: q.ahead(seq),
            batch_override: self.batch_override,
            paused: false,
        })
    }
}

#[derive(Default)]
struct Inner {
    targets: HashMap<QueueTarget, TargetState>,
    active: BTreeSet<QueueTarget>,
    /// Targets declared at runtime (`queue:targets`).
    declared: BTreeSet<QueueTarget>,
    flag: HashMap<String, String>,
    global_batch: Option<u64>,
    /// instance -> (its acknowledgement, expiry ms)
    acks: HashMap<String, (FlagAck, u64)>,
    /// (target, tick) -> purchases forwarded by the gate
    forwarded: HashMap<(QueueTarget, u64), u64>,
    /// Each target's sale and ledger (`queue:{T}:sale`, `prequeue`, `ledger`).
    sales: HashMap<QueueTarget, sale::MemSale>,
    /// The targets each user is counted in, with when (ms), and when that expires (ms):
    /// `queue:user:{u}:queues`.
    user_queues: HashMap<UserId, (BTreeMap<QueueTarget, u64>, u64)>,
    /// Each target's record (`queue:{T}:record`) and when it expires (ms).
    records: HashMap<QueueTarget, (TargetRecord, u64)>,
    /// The record's lifetime after a write (ms) and the width of its ticks.
    record_ttl_ms: u64,
    tick_ms: u64,
}

impl Inner {
    /// The target's state, its expired queue dropped.
    fn target(&mut self, target: QueueTarget, now: u64) -> &mut TargetState {
        let t = self.targets.entry(target).or_default();
        t.expire(now);
        t
    }

    /// The target's state if it has any, its expired queue dropped.
    fn existing(&mut self, target: QueueTarget, now: u64) -> Option<&mut TargetState> {
        let t = self.targets.get_mut(&target)?;
        t.expire(now);
        Some(t)
    }

    /// The target's record for a write, which keeps it `record_ttl_ms` longer (a new one if
    /// it expired), as every script's write to `queue:{T}:record` does.
    fn record(&mut self, target: QueueTarget, now: u64) -> &mut TargetRecord {
        let until = now + self.record_ttl_ms;
        let (r, expires) = self.records.entry(target).or_default();
        if *expires <= now {
            *r = TargetRecord::default();
        }
        *expires = until;
        r
    }

    /// A user given a token: counted in the record as `issue.lua` does.
    fn record_issue(&mut self, target: QueueTarget, now: u64) {
        let r = self.record(target, now);
        r.tokens_issued += 1;
        r.last_issue_ms = Some(now);
    }

    /// The tick of the record's per-tick counts at `now`.
    fn record_tick(&self, now: u64) -> u64 {
        now / self.tick_ms.max(1)
    }

    /// The acknowledgements still listed, by instance, silent ones with how long they have been.
    fn live_acks(&self, now: u64) -> Vec<FlagAck> {
        let mut acks: Vec<FlagAck> = self
            .acks
            .values()
            .filter(|(_, until)| until + FLAG_ACK_KEEP_MS > now)
            .map(|(ack, until)| FlagAck { silent_ms: (*until <= now).then(|| now - until), ..ack.clone() })
            .collect();
        acks.sort_by(|a, b| a.instance.cmp(&b.instance));
        acks
    }
}

/// In-process store with the semantics of [`super::RedisStore`].
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    limits: StoreLimits,
    /// Its only clock (the system's, or a test's [`crate::clock::ManualClock`]).
    clock: SharedClock,
}

impl MemoryStore {
    pub fn new(limits: StoreLimits) -> Self {
        Self::with_clock(limits, system())
    }

    /// A store that reads `clock` for every decision (tests step a manual one).
    pub fn with_clock(limits: StoreLimits, clock: SharedClock) -> Self {
        let inner = Inner { record_ttl_ms: limits.record_ttl_s * 1000, tick_ms: limits.tick_ms, ..Inner::default() };
        Self { inner: Arc::new(Mutex::new(inner)), limits, clock }
    }

    /// Now by the store's clock, epoch ms.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key_ttl_ms(&self) -> u64 {
        self.limits.key_ttl_s * 1000
    }

    /// What `flag_set.lua` does, under the lock: overrides cleared with the write, the new
    /// version above every acknowledged one.
    fn write_flag_fields(&self, fields: FlagFields) -> u64 {
        let now = self.now_ms();
        let mut inner = self.lock();
        if fields.clear_overrides {
            inner.flag.retain(|k, _| !k.starts_with("target:"));
        }
        inner.flag.extend(fields.set);
        for k in fields.delete {
            inner.flag.remove(&k);
        }
        let floor = inner.live_acks(now).iter().map(|a| a.version + 1).max();
        let next = inner.flag.get("version").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) + 1;
        let version = next.max(floor.unwrap_or(0));
        inner.flag.insert("version".into(), version.to_string());
        version
    }
}

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
                if q.seq % 64 == 1 {
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
                crate::metrics::wait_observed(now.saturating_sub(at));
                waits.push(now.saturating_sub(at));
            }
        }
        let admitted = front.len() as u64;
        q.admitted_total += admitted;
        // The sliding TTL of admit.lua: only while anyone waits (admitted users count until
        // their token is stored).
        if admitted > 0 || !q.waiting.is_empty() {
            q.expires_at = Some(now + ttl_ms);
        }
        let mark = q.mark;
        let (admissions, until) = &mut t.admissions;
        if *until <= now {
            admissions.clear();
        }
        admissions.insert(0, (tick, admitted));
        admissions.truncate(60);
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
            sale::ledger_entry(&mut inner, target, step);
        }
        Ok(AdmitOutcome { advanced: true, mark, tick, admitted, batch })
    }

    async fn evict(&self, target: QueueTarget, timeout_ms: u64, max: u64) -> Result<u64, StoreError> {
        let now = self.now_ms();
        let cutoff = now.saturating_sub(timeout_ms);
        let mut inner = self.lock();
        let Some(t) = inner.existing(target, now) else {
            return Ok(0);
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
        Ok(stale.len() as u64)
    }

    async fn snapshot(&self, target: QueueTarget) -> Result<TargetSnapshot, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
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
            sale: sale::read(&inner, target, now).0,
            prequeued: sale::read(&inner, target, now).1,
        })
    }
}

impl SaleOps for MemoryStore {
    async fn schedule_sale(
        &self,
        target: QueueTarget,
        schedule: SaleSchedule,
        seed: [u8; 32],
    ) -> Result<ScheduleOutcome, StoreError> {
        Ok(sale::schedule(&mut self.lock(), target, schedule, seed, self.now_ms()))
    }

    async fn sale_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        Ok(sale::scheduled_targets(&self.lock()))
    }

    async fn read_sale(&self, target: QueueTarget) -> Result<Option<SaleView>, StoreError> {
        Ok(sale::read(&self.lock(), target, self.now_ms()).0)
    }

    async fn control_sale(&self, target: QueueTarget, control: SaleControl) -> Result<bool, StoreError> {
        Ok(sale::control(&mut self.lock(), target, control, self.now_ms()))
    }

    async fn clear_sale(&self, target: QueueTarget, force: bool) -> Result<ClearOutcome, StoreError> {
        Ok(sale::clear(&mut self.lock(), target, force, self.now_ms()))
    }

    async fn target_record(&self, target: QueueTarget) -> Result<Option<TargetRecord>, StoreError> {
        let inner = self.lock();
        Ok(inner.records.get(&target).filter(|(_, until)| *until > self.now_ms()).map(|(r, _)| r.clone()))
    }

    async fn record_purchase(&self, target: QueueTarget, tick: u64, answer: AnswerClass) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let r = inner.record(target, self.now_ms());
        r.purchases.entry(tick).or_default().count(answer);
        Ok(())
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

impl FlagOps for MemoryStore {
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
        let now = self.now_ms();
        let mut inner = self.lock();
        match target {
            Some(t) => inner.target(t, now).batch_override = batch,
            None => inner.global_batch = batch,
        }
        Ok(())
    }

    async fn ack_flag(&self, ack: FlagAck, ttl_ms: u64) -> Result<(), StoreError> {
        let until = self.now_ms() + ttl_ms.max(1);
        let ack = ack.stored();
        self.lock().acks.insert(ack.instance.clone(), (ack, until));
        Ok(())
    }

    async fn flag_acks(&self) -> Result<Vec<FlagAck>, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        inner.acks.retain(|_, (_, until)| *until + FLAG_ACK_KEEP_MS > now);
        Ok(inner.live_acks(now))
    }

    async fn withdraw_flag_ack(&self, instance: &str) -> Result<(), StoreError> {
        self.lock().acks.remove(instance);
        Ok(())
    }
}

impl GateOps for MemoryStore {
    async fn claim_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        ttl_s: u64,
    ) -> Result<TokenClaim, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let t = inner.target(target, now);
        let used = format!("used:{token}");
        let previous = t.tokens.get(&user).filter(|(_, exp)| *exp > now).map(|(v, _)| v.clone());
        let spent = t.used.entry(user.clone()).or_default();
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
        let Some(t) = inner.existing(target, self.now_ms()) else { return Ok(()) };
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

    async fn confirm_token_used(
        &self,
        target: QueueTarget,
        user: UserId,
        through_queue: bool,
    ) -> Result<(), StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let t = inner.target(target, now);
        let q = &mut t.queue;
        if through_queue {
            q.tokens_used += 1;
            t.unused.remove(&user);
        } else {
            q.direct_tokens_used += 1;
        }
        let r = inner.record(target, now);
        if through_queue {
            r.tokens_used += 1;
        } else {
            r.direct_tokens_used += 1;
        }
        Ok(())
    }

    async fn spend_once(&self, target: QueueTarget, id: &str, until_ms: u64) -> Result<bool, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let spent = &mut inner.target(target, now).spent;
        spent.retain(|_, until| *until > now);
        if spent.contains_key(id) {
            return Ok(false);
        }
        spent.insert(id.to_owned(), until_ms);
        Ok(true)
    }

    async fn token_used(&self, target: QueueTarget, user: UserId, token: &str) -> Result<bool, StoreError> {
        let now = self.now_ms();
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
        let now = self.now_ms();
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
}

impl OutflowOps for MemoryStore {
    async fn observe_purchase(
        &self,
        target: QueueTarget,
        interval: u64,
        bucket: usize,
        error: bool,
        backoff: bool,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let t = inner.target(target, self.now_ms());
        let seen = t.observations.entry(interval).or_default();
        seen.purchases += 1;
        seen.errors += u64::from(error);
        seen.backoffs += u64::from(backoff);
        if let Some(n) = seen.latency.get_mut(bucket) {
            *n += 1;
        }
        while t.observations.len() > 8 {
            t.observations.pop_first();
        }
        Ok(())
    }

    async fn claim_outflow(&self, target: QueueTarget, interval: u64) -> Result<OutflowClaim, StoreError> {
        let mut inner = self.lock();
        let t = inner.target(target, self.now_ms());
        if t.batch_override.is_some() {
            return Ok(OutflowClaim::Pinned);
        }
        let current = t.outflow.as_ref().map(|o| o.batch);
        if t.outflow_interval.is_some_and(|i| i >= interval) {
            return Ok(OutflowClaim::Decided { current });
        }
        t.outflow_interval = Some(interval);
        let counters = TokensEnded { used: t.queue.tokens_used, expired: t.queue.tokens_expired };
        let (no_show_bp, ended) = match &t.outflow {
            Some(o) => (
                o.no_show_bp,
                Some(TokensEnded {
                    used: counters.used.saturating_sub(o.tokens_used),
                    expired: counters.expired.saturating_sub(o.tokens_expired),
                }),
            ),
            None => (None, None),
        };
        let seen = t.observations.get(&interval).cloned().unwrap_or_default();
        Ok(OutflowClaim::Decide { current, seen, no_show_bp, ended, counters })
    }

    async fn active_buyers(&self, target: QueueTarget) -> Result<u64, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let t = inner.target(target, now);
        let admitted = t.queue.waiting.range(..=t.queue.mark).count() as u64;
        Ok(admitted + t.unused.values().filter(|expiry| **expiry > now).count() as u64)
    }

    async fn expire_tokens(&self, target: QueueTarget) -> Result<u64, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let t = inner.target(target, now);
        let before = t.unused.len();
        t.unused.retain(|_, expiry| *expiry > now);
        let expired = (before - t.unused.len()) as u64;
        t.queue.tokens_expired += expired;
        Ok(expired)
    }

    async fn set_outflow(
        &self,
        target: QueueTarget,
        state: &OutflowState,
        change: Option<BatchChange>,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        inner.target(target, self.now_ms()).outflow = Some(state.clone());
        if let Some(c) = change {
            let entry = LedgerEntry::Batch {
                at_ms: state.decided_at_ms,
                from: c.from,
                to: state.batch,
                instance: c.instance,
                reason: state.reason.clone(),
            };
            sale::ledger_entry(&mut inner, target, entry);
        }
        Ok(())
    }
}

impl TargetOps for MemoryStore {
    async fn register_active(&self, target: QueueTarget) -> Result<(), StoreError> {
        self.lock().active.insert(target);
        Ok(())
    }

    async fn deactivate(&self, target: QueueTarget) -> Result<(), StoreError> {
        self.lock().active.remove(&target);
        Ok(())
    }

    async fn declared_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        Ok(self.lock().declared.iter().copied().collect())
    }

    async fn declare_target(&self, target: QueueTarget, room: u64) -> Result<DeclareOutcome, StoreError> {
        let mut inner = self.lock();
        if inner.declared.contains(&target) {
            return Ok(DeclareOutcome::AlreadyDeclared);
        }
        if inner.declared.len() as u64 >= room {
            return Ok(DeclareOutcome::Full { room });
        }
        inner.declared.insert(target);
        Ok(DeclareOutcome::Added)
    }

    async fn undeclare_target(&self, target: QueueTarget) -> Result<bool, StoreError> {
        Ok(self.lock().declared.remove(&target))
    }

    async fn publish_capacity(&self, target: QueueTarget) -> Result<(), StoreError> {
        let now = self.now_ms();
        let until = now + self.key_ttl_ms();
        self.lock().target(target, now).capacity = Some((self.limits.capacity(target.kind), until));
        Ok(())
    }

    async fn active_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        Ok(self.lock().active.iter().copied().collect())
    }

    async fn forget_if_expired(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        // Redis asks whether the `seq` key still exists.
        // A pre-queue keeps it too (enter.lua writes `seq` for it).
        let prequeued = inner.sales.get(&target).is_some_and(|s| !s.prequeue.is_empty());
        let expired = !prequeued && inner.existing(target, now).is_none_or(|t| t.queue.seq == 0);
        if expired {
            inner.active.remove(&target);
            // What outlives a target's queue (tokens, used marks, the lock) is kept until it
            // expires too; targets out of the active set are not asked again, so sweep here.
            let Inner { targets, active, user_queues, .. } = &mut *inner;
            targets.retain(|target, t| {
                t.expire(now);
                active.contains(target) || !t.is_gone(now)
            });
            user_queues.retain(|_, (_, until)| *until > now);
        }
        Ok(expired)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[tokio::test]
    async fn a_forgotten_target_is_dropped_once_nothing_of_it_lives() {
        let s = MemoryStore::new(StoreLimits {
            max_capacity: 5,
            type_capacity: Vec::new(),
            key_ttl_s: 1,
            token_ttl_s: 1,
            record_ttl_s: 1,
            tick_ms: 1000,
        });
        let t: QueueTarget = "limited-drop:1".parse().expect("target");
        s.register_active(t).await.expect("register");
        s.claim_token(t, UserId::from(1), "A", 1).await.expect("claim");
        assert!(s.forget_if_expired(t).await.expect("forget"), "no queue, nothing keeps it active");
        assert_eq!(s.lock().targets.len(), 1, "the used mark outlives the queue");
        // The pump no longer asks about `t`, only about the targets still active.
        let other: QueueTarget = "limited-drop:2".parse().expect("target");
        let started = Instant::now();
        while s.lock().targets.contains_key(&t) {
            assert!(started.elapsed() < Duration::from_secs(5), "the state of a forgotten target is never dropped");
            tokio::time::sleep(Duration::from_millis(50)).await;
            s.forget_if_expired(other).await.expect("forget");
        }
    }
}
