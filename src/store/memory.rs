//! The embedded store: the semantics of the Lua scripts, in one process, under one mutex.
//!
//! For trial runs of a single `vq serve` only: two processes on it are two separate queues.
//! Its clock is a [`crate::clock::Clock`]: the system's in the binary, a manual one tests step
//! (the Redis store uses Redis' `TIME`). State expires as the
//! Redis keys it stands for do (checked when next touched): a target's queue `key_ttl_s` after
//! the last refresh `admit.lua` or `enter.lua` would make, tokens and used marks with the
//! token, the lock with its lease. Redis is the reference: `tests/it/conformance.rs` runs
//! every operation on both, and a difference is fixed here.
//!
//! This file holds the state model (typed: a token is [`TokenState::Issued`] or `Used`, an
//! acknowledgement a [`FlagAck`], a ledger row a `LedgerEntry`; no Redis string encodings);
//! the operations are in files by concern, each naming the scripts it mirrors: `queue.rs`,
//! `sale.rs`, `flag.rs`, `token.rs` (the gate), `outflow.rs`, `targets.rs`, `events.rs`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Candidate, EventLimits, FlagAck, OutflowState, StoreLimits, Waiting};
use crate::domain::{
    BuyerObservation, EventId, EventLog, FlagState, InstanceReport, QueueTarget, TargetRecord, UserId, WaitHistogram,
};

use crate::clock::{SharedClock, system};

mod events;
mod flag;
mod fleet;
mod outflow;
mod queue;
mod sale;
mod targets;
mod token;

/// What Redis keeps in the keys `admit.lua` refreshes together (waiting, heartbeat, seq, mark,
/// entry times, waits, evicted, departed): they expire `key_ttl_s` after the last refresh, and
/// a refresh happens only while someone waits (every tick) or when `enter.lua` gives a seq one
/// past a multiple of `rules::TTL_REFRESH_EVERY`. Expired, the target's queue starts again from
/// nothing.
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
    /// Each user's stored token (`queue:{T}:token:{user}`).
    tokens: HashMap<UserId, StoredToken>,
    /// Users holding a token issued and not used yet, with its expiry (ms): `queue:{T}:unused`.
    unused: HashMap<UserId, u64>,
    /// Every token each user bought with, and its expiry (ms): `queue:{T}:used:{user}`.
    used: HashMap<UserId, HashMap<String, u64>>,
    /// Purchases claimed with each token of a user (`purchases_per_admission` > 1), and when
    /// that user's counts expire (ms): `queue:{T}:uses:{user}`.
    uses: HashMap<UserId, (HashMap<String, u64>, u64)>,
    /// Purchases claimed per user in the sale (`purchases_per_user` > 0), and when the counts
    /// expire (ms, `key_ttl_s` after the last claim): `queue:{T}:bought`.
    bought: (HashMap<UserId, u64>, u64),
    /// Proof-of-work challenges used, until their expiry (ms): `queue:{T}:pow:{id}`.
    spent: HashMap<String, u64>,
    lock: Option<(String, u64)>,
    batch_override: Option<u64>,
    /// (tick, users admitted), newest first, and when the list expires (ms).
    admissions: (Vec<(u64, u64)>, u64),
    /// The capacity in force and when it expires (ms).
    capacity: Option<(u64, u64)>,
    /// The adaptive outflow: the last decision, the last interval claimed, and what the gates
    /// saw per interval (the newest few), per buyer.
    outflow: Option<OutflowState>,
    outflow_interval: Option<u64>,
    observations: BTreeMap<u64, HashMap<UserId, BuyerObservation>>,
}

/// Whether a stored token was given to its user or used by a purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenState {
    Issued,
    Used,
}

/// A user's stored token: issued by the queue, or the one a purchase claimed.
#[derive(Debug, Clone)]
struct StoredToken {
    token: String,
    state: TokenState,
    expires_at: u64,
    /// What the user's token was before a purchase claimed this one, put back if the purchase
    /// fails (`release_token`).
    replaced: Option<Box<StoredToken>>,
}

impl StoredToken {
    fn issued(token: String, expires_at: u64) -> Self {
        Self { token, state: TokenState::Issued, expires_at, replaced: None }
    }

    /// This very token, claimed by a purchase.
    fn is_used(&self, token: &str) -> bool {
        self.state == TokenState::Used && self.token == token
    }
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
            && self.tokens.values().all(|t| t.expires_at <= now)
            && self.used.values().flat_map(HashMap::values).all(|exp| *exp <= now)
            && self.spent.values().all(|until| *until <= now)
            && self.uses.values().all(|(_, until)| *until <= now)
            && (self.bought.0.is_empty() || self.bought.1 <= now)
            && self.lock.as_ref().is_none_or(|(_, until)| *until <= now)
            && self.admissions.1 <= now
            && self.capacity.is_none_or(|(_, until)| until <= now)
    }

    fn live_token(&mut self, user: &UserId, now: u64) -> Option<String> {
        match self.tokens.get(user) {
            Some(t) if t.expires_at > now => Some(t.token.clone()),
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
            let stored = StoredToken::issued(token.clone(), now + token_ttl_s * 1000);
            self.tokens.insert(user.clone(), stored);
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
    /// The flag, `None` until first written (Redis: no hash).
    flag: Option<FlagState>,
    global_batch: Option<u64>,
    /// instance -> (its acknowledgement, expiry ms)
    acks: HashMap<String, (FlagAck, u64)>,
    /// instance -> (its report of itself, expiry ms)
    fleet: BTreeMap<String, (InstanceReport, u64)>,
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
    /// The event logs (`queue:{T}:events`, `queue:events`), the webhooks' cursors
    /// ((subscriber, log) -> last delivered) and delivery leases (name -> holder, until ms).
    events: HashMap<EventLog, events::MemLog>,
    event_cursors: HashMap<(String, EventLog), EventId>,
    event_leases: HashMap<String, (String, u64)>,
    /// `queue:events:logs`: targets remembered as having a log.
    event_log_targets: BTreeSet<QueueTarget>,
    event_limits: EventLimits,
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
        let inner = Inner {
            record_ttl_ms: limits.record_ttl_s * 1000,
            tick_ms: limits.tick_ms,
            event_limits: limits.events,
            ..Inner::default()
        };
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::prelude::*;

    #[tokio::test]
    async fn a_forgotten_target_is_dropped_once_nothing_of_it_lives() {
        let clock = ManualClock::starting_at(1_000_000);
        let limits = StoreLimits {
            max_capacity: 5,
            type_capacity: Vec::new(),
            type_shards: Vec::new(),
            key_ttl_s: 1,
            token_ttl_s: 1,
            record_ttl_s: 1,
            tick_ms: 1000,
            durable: Default::default(),
            events: Default::default(),
        };
        let s = MemoryStore::with_clock(limits, Arc::new(clock.clone()));
        let t: QueueTarget = "limited-drop:1".parse().expect("target");
        s.register_active(t).await.expect("register");
        s.claim_token(t, UserId::from(1), "A", 1, Default::default()).await.expect("claim");
        assert!(s.forget_if_expired(t).await.expect("forget"), "no queue, nothing keeps it active");
        assert_eq!(s.lock().targets.len(), 1, "the used mark outlives the queue");
        // The pump no longer asks about `t`, only about the targets still active.
        let other: QueueTarget = "limited-drop:2".parse().expect("target");
        clock.advance(999);
        s.forget_if_expired(other).await.expect("forget");
        assert!(s.lock().targets.contains_key(&t), "the used mark lives 1 s");
        clock.advance(1);
        s.forget_if_expired(other).await.expect("forget");
        assert!(!s.lock().targets.contains_key(&t), "the state of a forgotten target is never dropped");
    }
}
