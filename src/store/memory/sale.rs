//! The embedded store's sale lifecycle: what `enter.lua`, `status.lua`, `admit.lua` and the
//! `sale_*.lua` scripts do with a target's sale, under the store's one mutex.
//!
//! One process holds the embedded store, so the opening is written in the same step that
//! freezes the pre-queue (no pump race to guard against); the order is the same function of
//! the seed as on Redis.

use std::collections::{HashMap, VecDeque};

use super::{Inner, MemoryStore};
use crate::domain::{
    AnswerClass, EventKind, LedgerEntry, QueueTarget, Refusals, SaleControl, SalePhase, SaleRecord, SaleSchedule,
    SaleSource, TargetRecord, UserId,
};
use crate::store::{
    ClearOutcome, LEDGER_MAX_ROWS, PendingOpening, SaleNotice, SaleOps, SaleView, ScheduleOutcome, StoreError,
};

/// One target's sale.
#[derive(Default)]
pub(super) struct MemSale {
    pub(super) record: SaleRecord,
    seed: Vec<u8>,
    /// Pre-queued users and their arrival (ms).
    pub(super) prequeue: HashMap<UserId, u64>,
    /// When the pre-queue was frozen (ms).
    frozen_at: Option<u64>,
    /// Newest first.
    ledger: VecDeque<LedgerEntry>,
    /// The pre-queue's opening is in the event log (`prequeue_told` in the sale's hash).
    prequeue_told: bool,
}

impl MemSale {
    fn record(&mut self, entry: LedgerEntry) {
        self.ledger.push_front(entry);
        self.ledger.truncate(LEDGER_MAX_ROWS as usize);
    }

    fn notice(&self) -> SaleNotice {
        SaleNotice {
            opens_at_ms: self.record.opens_at_ms,
            prequeue_from_ms: self.record.prequeue_from_ms,
            paused: self.record.paused,
            message: self.record.message.clone(),
        }
    }
}

/// A schedule, opening, pause, resume, close or clear: in the ledger, in the target's record
/// and in its event log.
fn event(inner: &mut Inner, target: QueueTarget, now: u64, entry: LedgerEntry) {
    inner.record(target, now).events.push(entry.clone());
    ledger_entry(inner, target, now, entry);
}

/// The ledger keeps existing after a clear; the schedule goes. A row with an event (all but
/// an admission step) is in the event log too.
pub(super) fn ledger_entry(inner: &mut Inner, target: QueueTarget, now: u64, entry: LedgerEntry) {
    if let Some(kind) = crate::domain::EventKind::of_ledger(&entry) {
        inner.append_event(crate::domain::EventLog::Target(target), now, entry.at_ms(), kind);
    }
    inner.sales.entry(target).or_default().record(entry);
}

/// What the sale decides for one enter or poll before the queue is looked at.
pub(super) enum Gate {
    /// Answer this (the user is not let into the queue).
    PreQueue(SaleNotice),
    Scheduled(SaleNotice),
    Closed(SaleNotice),
    Full,
    /// Go on into the queue as without a sale.
    Queue,
}

/// The phase of `target`'s sale at `now`, writing the opening first if it is due.
fn phase(inner: &mut Inner, target: QueueTarget, now: u64, ttl_ms: u64) -> Option<SalePhase> {
    let phase = inner.sales.get(&target)?.record.phase(now)?;
    if phase == SalePhase::Opening {
        open(inner, target, now, ttl_ms);
        return Some(SalePhase::Open);
    }
    Some(phase)
}

/// Whether anything of the sale is stored (Redis: the sale hash or a pre-queue exists), which
/// `read` shows and a clear removes: a schedule, a pause, a resume, a close.
fn is_stored(sale: &MemSale) -> bool {
    sale.record != SaleRecord::default() || !sale.prequeue.is_empty()
}

/// Freezes the pre-queue and writes its order: seqs after the last one given, in the order
/// of HMAC-SHA256(seed, user id); users without a heartbeat any more are not placed.
fn open(inner: &mut Inner, target: QueueTarget, now: u64, ttl_ms: u64) {
    let Some(sale) = inner.sales.get_mut(&target) else { return };
    let users: Vec<UserId> = sale.prequeue.drain().map(|(u, _)| u).collect();
    let order = crate::domain::opening_order(&sale.seed, &users);
    sale.frozen_at = Some(now);
    sale.record.prequeued = Some(order.len() as u64);
    sale.record.opened_at_ms = Some(now);
    let entry = LedgerEntry::Opening {
        at_ms: now,
        prequeued: order.len() as u64,
        seed_commitment: sale.record.commitment.clone().unwrap_or_default(),
        seed: sale.record.seed.clone().unwrap_or_default(),
    };
    let opens_at = sale.record.opens_at_ms.unwrap_or(now);
    event(inner, target, now, entry);
    let q = &mut inner.target(target, now).queue;
    for user in order {
        q.seq += 1;
        if q.heartbeat.contains_key(&user) {
            q.waiting.insert(q.seq, user.clone());
            q.seq_of.insert(user.clone(), q.seq);
            q.entered_at.insert(user, opens_at);
        }
    }
    q.expires_at = Some(now + ttl_ms);
}

/// The sale's decision for a user who is neither waiting nor holding a token.
pub(super) fn gate_newcomer(
    inner: &mut Inner,
    target: QueueTarget,
    user: &UserId,
    now: u64,
    entering: bool,
    max_capacity: u64,
    ttl_ms: u64,
) -> Gate {
    let Some(phase) = phase(inner, target, now, ttl_ms) else { return Gate::Queue };
    let waiting = inner.targets.get(&target).map_or(0, |t| t.queue.waiting_count());
    let Some(sale) = inner.sales.get_mut(&target) else { return Gate::Queue };
    let notice = sale.notice();
    match phase {
        SalePhase::Closed => Gate::Closed(notice),
        SalePhase::Scheduled if entering => Gate::Scheduled(notice),
        SalePhase::PreQueue if sale.prequeue.contains_key(user) => {
            inner.target(target, now).queue.heartbeat.insert(user.clone(), now);
            Gate::PreQueue(notice)
        }
        SalePhase::PreQueue if entering => {
            if waiting + sale.prequeue.len() as u64 >= max_capacity {
                return Gate::Full;
            }
            sale.prequeue.insert(user.clone(), now);
            let tick = inner.record_tick(now);
            *inner.record(target, now).arrivals.entry(tick).or_default() += 1;
            let q = &mut inner.target(target, now).queue;
            q.heartbeat.insert(user.clone(), now);
            q.expires_at = Some(now + ttl_ms);
            Gate::PreQueue(notice)
        }
        // A poll before the pre-queue or of a user not pre-queued, and an open sale (the
        // opening was written by `phase`).
        SalePhase::Scheduled | SalePhase::PreQueue | SalePhase::Opening | SalePhase::Open => Gate::Queue,
    }
}

/// For a user already waiting: a closed sale answers CLOSED (unless admitted).
pub(super) fn gate_waiting(inner: &mut Inner, target: QueueTarget, now: u64, ttl_ms: u64) -> Gate {
    match phase(inner, target, now, ttl_ms) {
        Some(SalePhase::Closed) => Gate::Closed(inner.sales.get(&target).map(MemSale::notice).unwrap_or_default()),
        Some(SalePhase::Scheduled | SalePhase::PreQueue | SalePhase::Opening | SalePhase::Open) | None => Gate::Queue,
    }
}

/// Whether admission is held this tick (before the opening, paused, closed); closes the sale
/// when `closes_at` has passed, once, recorded with the schedule as source.
pub(super) fn admission_held(inner: &mut Inner, target: QueueTarget, now: u64, ttl_ms: u64) -> bool {
    if let Some(sale) = inner.sales.get_mut(&target)
        && !sale.record.closed
        && sale.record.closes_at_ms.is_some_and(|c| now >= c)
    {
        sale.record.closed = true;
        sale.record.close_source = Some(SaleSource::Schedule);
        let message = sale.record.message.clone().unwrap_or_default();
        event(inner, target, now, LedgerEntry::Close { at_ms: now, source: SaleSource::Schedule, message });
    }
    let phase = phase(inner, target, now, ttl_ms);
    if phase == Some(SalePhase::PreQueue)
        && let Some(sale) = inner.sales.get_mut(&target)
        && !std::mem::replace(&mut sale.prequeue_told, true)
    {
        let kind = EventKind::PrequeueOpened {
            opens_at_ms: sale.record.opens_at_ms.unwrap_or_default(),
            prequeue_from_ms: sale.record.prequeue_from_ms,
        };
        inner.target_event(target, now, kind);
    }
    phase.is_some_and(SalePhase::holds_admission) || paused(inner, target)
}

/// Whether `user` is in `target`'s pre-queue.
pub(super) fn holds_prequeued(inner: &Inner, target: QueueTarget, user: &UserId) -> bool {
    inner.sales.get(&target).is_some_and(|s| s.prequeue.contains_key(user))
}

/// Takes a user out of the pre-queue (left, or evicted).
pub(super) fn forget_prequeued(inner: &mut Inner, target: QueueTarget, user: &UserId) -> bool {
    inner.sales.get_mut(&target).is_some_and(|s| s.prequeue.remove(user).is_some())
}

pub(super) fn schedule(
    inner: &mut Inner,
    target: QueueTarget,
    s: SaleSchedule,
    seed: [u8; 32],
    now: u64,
) -> ScheduleOutcome {
    let sale = inner.sales.entry(target).or_default();
    if let Some(frozen_at_ms) = sale.frozen_at {
        return ScheduleOutcome::AlreadyOpened { frozen_at_ms };
    }
    if sale.record.commitment.is_none() {
        sale.seed = seed.to_vec();
        sale.record.seed = Some(crate::domain::hex(&seed));
        sale.record.commitment = Some(crate::domain::seed_commitment(&seed));
    }
    sale.record.opens_at_ms = Some(s.opens_at_ms);
    sale.record.prequeue_from_ms = s.prequeue_from_ms;
    sale.record.closes_at_ms = s.closes_at_ms;
    sale.record.closed = false;
    sale.record.close_source = None;
    sale.record.message = None;
    sale.prequeue_told = false;
    let commitment = sale.record.commitment.clone().unwrap_or_default();
    let entry = LedgerEntry::Schedule {
        at_ms: now,
        opens_at_ms: s.opens_at_ms,
        prequeue_from_ms: s.prequeue_from_ms,
        closes_at_ms: s.closes_at_ms,
    };
    event(inner, target, now, entry);
    ScheduleOutcome::Scheduled { commitment }
}

pub(super) fn read(inner: &Inner, target: QueueTarget, now: u64) -> (Option<SaleView>, u64) {
    let Some(sale) = inner.sales.get(&target).filter(|s| is_stored(s)) else {
        return (None, 0);
    };
    (Some(SaleView { record: sale.record.clone(), now_ms: now }), sale.prequeue.len() as u64)
}

pub(super) fn control(inner: &mut Inner, target: QueueTarget, control: SaleControl, now: u64) -> bool {
    let sale = inner.sales.entry(target).or_default();
    let r = &mut sale.record;
    let entry = match control {
        SaleControl::Pause if !r.paused => {
            r.paused = true;
            LedgerEntry::Pause { at_ms: now, source: SaleSource::Command }
        }
        SaleControl::Resume if r.paused => {
            r.paused = false;
            r.resumed_at_ms = Some(now);
            LedgerEntry::Resume { at_ms: now, source: SaleSource::Command }
        }
        SaleControl::Close { message, source } if !r.closed => {
            r.closed = true;
            r.close_source = Some(source);
            r.message = Some(message.clone());
            LedgerEntry::Close { at_ms: now, source, message }
        }
        SaleControl::Clear if is_stored(sale) => {
            let ledger = std::mem::take(&mut sale.ledger);
            *sale = MemSale { ledger, ..MemSale::default() };
            LedgerEntry::Clear { at_ms: now, source: SaleSource::Command }
        }
        // Nothing to change: paused already, not paused, closed already, nothing stored.
        SaleControl::Pause | SaleControl::Resume | SaleControl::Close { .. } | SaleControl::Clear => return false,
    };
    event(inner, target, now, entry);
    true
}

/// `vq sale clear`: without `force`, refused while it would drop users (pre-queued before the
/// opening, or being placed at it), as `sale_control.lua` decides.
pub(super) fn clear(inner: &mut Inner, target: QueueTarget, force: bool, now: u64) -> ClearOutcome {
    if !force
        && let Some(sale) = inner.sales.get(&target)
        && let Some(phase) = sale.record.phase(now)
    {
        let users = sale.prequeue.len() as u64;
        match phase {
            SalePhase::Opening => return ClearOutcome::Refused { opening: true, prequeued: users },
            SalePhase::Scheduled | SalePhase::PreQueue if users > 0 => {
                return ClearOutcome::Refused { opening: false, prequeued: users };
            }
            SalePhase::Scheduled | SalePhase::PreQueue | SalePhase::Open | SalePhase::Closed => {}
        }
    }
    // The purchases counted per user (`queue:{T}:bought`) go with the sale, or without one.
    if let Some(t) = inner.targets.get_mut(&target) {
        t.bought = Default::default();
    }
    if control(inner, target, SaleControl::Clear, now) { ClearOutcome::Cleared } else { ClearOutcome::NoSale }
}

pub(super) fn ledger(inner: &Inner, target: QueueTarget) -> Vec<LedgerEntry> {
    inner.sales.get(&target).map(|s| s.ledger.iter().cloned().collect()).unwrap_or_default()
}

/// The sale's gate for a user of `target`: `None` without a sale or for an admitted user;
/// `capacity` is the enter's bound (`None`: a poll, which records nobody new).
fn gate_of(
    inner: &mut Inner,
    target: QueueTarget,
    user: &UserId,
    now: u64,
    capacity: Option<u64>,
    ttl_ms: u64,
) -> Option<Gate> {
    if !inner.sales.contains_key(&target) {
        return None;
    }
    let (known, mark) =
        inner.targets.get(&target).map_or((None, 0), |t| (t.queue.seq_of.get(user).copied(), t.queue.mark));
    Some(match known {
        Some(seq) if seq <= mark => return None,
        Some(_) => gate_waiting(inner, target, now, ttl_ms),
        None => {
            let entering = capacity.is_some();
            gate_newcomer(inner, target, user, now, entering, capacity.unwrap_or(u64::MAX), ttl_ms)
        }
    })
}

/// The sale's answer to an enter that found no stored token, if it keeps the user out of the
/// queue (`None`: on into the queue as without a sale).
pub(super) fn enter_gate(
    inner: &mut Inner,
    target: QueueTarget,
    user: &UserId,
    now: u64,
    max_capacity: u64,
    ttl_ms: u64,
) -> Option<crate::store::EnterOutcome> {
    use crate::store::EnterOutcome;
    match gate_of(inner, target, user, now, Some(max_capacity), ttl_ms)? {
        Gate::PreQueue(n) => Some(EnterOutcome::PreQueue(n)),
        Gate::Scheduled(n) => Some(EnterOutcome::Scheduled(n)),
        Gate::Closed(n) => Some(EnterOutcome::Closed(n)),
        Gate::Full => Some(EnterOutcome::Full),
        Gate::Queue => None,
    }
}

/// The sale's answer to a poll that found no stored token, as [`enter_gate`].
pub(super) fn status_gate(
    inner: &mut Inner,
    target: QueueTarget,
    user: &UserId,
    now: u64,
    ttl_ms: u64,
) -> Option<crate::store::StatusOutcome> {
    use crate::store::StatusOutcome;
    match gate_of(inner, target, user, now, None, ttl_ms)? {
        Gate::PreQueue(n) => Some(StatusOutcome::PreQueue(n)),
        Gate::Closed(n) => Some(StatusOutcome::Closed(n)),
        Gate::Scheduled(_) | Gate::Full | Gate::Queue => None,
    }
}

/// Whether waiting answers say paused.
pub(super) fn paused(inner: &Inner, target: QueueTarget) -> bool {
    inner.sales.get(&target).is_some_and(|s| s.record.paused)
}

/// The targets scheduled since their last clear (Redis: `queue:sales`, added by a schedule).
pub(super) fn scheduled_targets(inner: &Inner) -> Vec<QueueTarget> {
    inner.sales.iter().filter(|(_, s)| s.record.commitment.is_some()).map(|(t, _)| *t).collect()
}

impl SaleOps for MemoryStore {
    async fn schedule_sale(
        &self,
        target: QueueTarget,
        schedule: SaleSchedule,
        seed: [u8; 32],
    ) -> Result<ScheduleOutcome, StoreError> {
        Ok(self::schedule(&mut self.lock(), target, schedule, seed, self.now_ms()))
    }

    async fn sale_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        Ok(scheduled_targets(&self.lock()))
    }

    async fn read_sale(&self, target: QueueTarget) -> Result<Option<SaleView>, StoreError> {
        Ok(read(&self.lock(), target, self.now_ms()).0)
    }

    async fn control_sale(&self, target: QueueTarget, control: SaleControl) -> Result<bool, StoreError> {
        Ok(self::control(&mut self.lock(), target, control, self.now_ms()))
    }

    async fn clear_sale(&self, target: QueueTarget, force: bool) -> Result<ClearOutcome, StoreError> {
        Ok(clear(&mut self.lock(), target, force, self.now_ms()))
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

    async fn record_refusals(&self, target: QueueTarget, refused: Refusals) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let r = inner.record(target, self.now_ms());
        for (why, n) in refused.counted() {
            r.refused.add(why, n);
        }
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
        Ok(ledger(&self.lock(), target))
    }
}
