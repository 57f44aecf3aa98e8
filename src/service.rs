//! The queue service: flag decision, store call, token issue, fail-open. HTTP handlers call
//! this and nothing else; it knows no status codes.
//!
//! A store error never reaches a client: enter and poll answer DIRECT_ADMITTED with a
//! stateless token, the error is counted and logged at most once per interval.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::config::{QueueSettings, Settings};
use crate::domain::{
    FlagState, QueuePosition, QueueTarget, SaleControl, SaleSource, UserId, admission_rate_per_sec, batch_in_force,
};
use crate::store::{
    AnyStore, EnterOutcome, QueueStore, SaleNotice, StatusOutcome, StoreError, StoreErrorKind, TargetSnapshot,
    TokenClaim, Waiting,
};

/// What a closed sale tells users when it was closed without a message.
pub const DEFAULT_CLOSE_MESSAGE: &str = "The sale is closed";
use crate::token::{self, EntryToken, Secret, TokenError};

/// How often a given instance re-adds a target it serves to `queue:active`, in case the pump
/// dropped it between its keys expiring and a new entry.
const REGISTER_EVERY: Duration = Duration::from_secs(5);
/// At most one log line per this interval for Redis failures on the request path.
const DEGRADED_LOG_EVERY: Duration = Duration::from_secs(10);

pub use crate::clock::now_epoch_ms;

/// What a user is told by enter and poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueStatus {
    Waiting {
        position: u64,
        ahead: u64,
        eta_seconds: u64,
        /// The sale is paused: nobody is admitted until it resumes.
        paused: bool,
    },
    Admitted(EntryToken),
    /// Recorded in the sale's pre-queue; the order is drawn at `opens_at_ms`.
    PreQueue {
        opens_at_ms: u64,
        paused: bool,
    },
    /// The sale opens later; entries are recorded from `prequeue_from_ms` (or the opening).
    Scheduled {
        opens_at_ms: u64,
        prequeue_from_ms: Option<u64>,
    },
    /// The sale is closed.
    Closed {
        message: String,
    },
    /// The queue is off for this user (flag) or Redis is down (fail-open).
    DirectAdmitted(EntryToken),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("the queue for {0} is full: try again shortly")]
    Full(QueueTarget),
    #[error("user is not in the queue for {0}: enter first (users who stop polling are evicted)")]
    NotInQueue(QueueTarget),
}

/// Cluster-wide figures of one target, computed from the store's snapshot only,
/// so every instance and `vq stats` answer the same.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueStats {
    pub waiting_count: u64,
    pub admitted_count: u64,
    /// Over the last minute.
    pub admission_rate_per_sec: f64,
    pub avg_wait_seconds: f64,
    pub p95_wait_seconds: f64,
    pub evicted_count: u64,
    pub batch_size: u64,
    /// The admission tick: one batch per tick.
    pub tick_ms: u64,
    /// What the pump aims at: batch size / tick seconds.
    pub target_rate_per_sec: f64,
    pub max_capacity: u64,
    pub tokens_issued: u64,
    pub tokens_used: u64,
    /// Purchases with stateless (DIRECT_ADMITTED or minted) tokens, never issued by the queue.
    pub direct_tokens_used: u64,
    /// The sale's state (scheduled, pre-queue, opening, open, paused, closed); absent without a sale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sale_state: Option<String>,
    /// The sale's opening time, ISO-8601; absent without a schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<String>,
    /// Users in the sale's pre-queue, not yet given a position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prequeued_count: Option<u64>,
}

impl QueueStats {
    /// The one computation behind the stats endpoint, `/metrics` gauges and `vq stats`.
    /// `global_batch` is the operator's runtime batch size for every target, if set.
    pub fn from_snapshot(snap: &TargetSnapshot, global_batch: Option<u64>, queue: &QueueSettings, now_ms: u64) -> Self {
        let batch_size = batch_in_force(snap.batch_override, global_batch, queue.batch_size);
        Self {
            waiting_count: snap.waiting,
            admitted_count: snap.admitted_total,
            admission_rate_per_sec: admission_rate_per_sec(&snap.admissions, queue.tick_ms, now_ms),
            avg_wait_seconds: snap.waits.avg_seconds(),
            p95_wait_seconds: snap.waits.quantile_seconds(0.95),
            evicted_count: snap.evicted,
            batch_size,
            tick_ms: queue.tick_ms,
            target_rate_per_sec: batch_size as f64 * 1000.0 / queue.tick_ms.max(1) as f64,
            max_capacity: snap.capacity.unwrap_or(queue.max_capacity),
            tokens_issued: snap.tokens_issued,
            tokens_used: snap.tokens_used,
            direct_tokens_used: snap.direct_tokens_used,
            sale_state: snap.sale.as_ref().map(|v| v.record.state_at(v.now_ms).to_owned()),
            opens_at: snap.sale.as_ref().and_then(|v| v.record.opens_at_ms).map(crate::domain::format_instant),
            prequeued_count: snap.sale.as_ref().map(|_| snap.prequeued),
        }
    }
}

/// Reads one target's figures from the store: what the stats endpoint answers and what
/// `vq stats` shows, so the two cannot drift. The global batch size is read with the
/// snapshot (not an instance's cached copy), so two instances at the same moment agree.
pub async fn read_target_stats(
    store: &AnyStore,
    target: QueueTarget,
    queue: &QueueSettings,
) -> Result<(TargetSnapshot, QueueStats), StoreError> {
    let global_batch = store.global_batch_size().await?;
    let snap = store.snapshot(target).await?;
    let stats = QueueStats::from_snapshot(&snap, global_batch, queue, now_epoch_ms());
    Ok((snap, stats))
}

/// What the gate lets through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatePass {
    /// The queue does not apply to this user and target: no token needed.
    FlagOff,
    /// A valid token; `claim` is the one-time-use mark to settle after the purchase (none when
    /// Redis could not be reached, or for a read-only check).
    Verified { claim: Option<PendingClaim> },
}

/// A token marked used before forwarding; settle it with [`QueueService::settle_claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingClaim {
    target: QueueTarget,
    user: UserId,
    token: String,
    previous: Option<String>,
}

/// When a verified purchase may go to the purchase API (see `gate.pace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Now, inside the tick reserved for it (or unpaced).
    Now,
    /// Every tick the gate may wait for is full.
    Full,
}

/// A paced purchase is forwarded only this long before its tick ends at the latest, so it
/// reaches the purchase API inside that tick (reservations keep twice that from the end).
const PACE_FORWARD_MARGIN_MS: u64 = crate::store::PACE_GUARD_MS / 2;
/// Reservations a purchase may make when pauses keep it from its reserved tick.
const PACE_ATTEMPTS: usize = 3;

/// Whether a gate check marks the token used (a purchase) or only reads (nginx auth_request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    Claim,
    CheckOnly,
}

/// After a store failure, requests skip the store for this long and fail open at once,
/// instead of each one paying for a reconnection attempt; the flag refresher probes Redis
/// meanwhile and closes the window as soon as it answers.
const SKIP_STORE_AFTER_FAILURE_MS: u64 = 1000;

/// Counts Redis failures, logs them at most once per interval (per kind), and remembers until
/// when the request path should not try Redis.
///
/// Only a store that cannot serve anyone ([`StoreErrorKind::Unavailable`]) opens that window:
/// a failure confined to one call (a corrupt key of one target, a script error) fails open
/// that request only, and the next request, of any target, asks Redis again.
struct Degraded {
    /// Per kind: last log line, failures since.
    logs: [(Mutex<Option<Instant>>, AtomicU64); 2],
    /// Epoch ms before which enter/poll/gate do not call the store (0 = call it).
    skip_until_ms: AtomicU64,
}

impl Degraded {
    fn new() -> Self {
        crate::metrics::register_store_errors(&StoreErrorKind::ALL.map(StoreErrorKind::label));
        Self { logs: std::array::from_fn(|_| (Mutex::new(None), AtomicU64::new(0))), skip_until_ms: AtomicU64::new(0) }
    }

    fn skipping(&self) -> bool {
        let until = self.skip_until_ms.load(Ordering::Relaxed);
        until != 0 && now_epoch_ms() < until
    }

    /// A request that failed open without calling the store.
    fn record_skipped(&self) {
        crate::metrics::redis_degraded();
    }

    fn record(&self, what: &str, target: QueueTarget, err: &StoreError) {
        let kind = err.kind();
        if kind == StoreErrorKind::Unavailable {
            self.skip_until_ms.store(now_epoch_ms() + SKIP_STORE_AFTER_FAILURE_MS, Ordering::Relaxed);
        }
        crate::metrics::redis_degraded();
        crate::metrics::store_error(kind.label());
        let (last_log, since_log) = &self.logs[kind as usize];
        let n = since_log.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = last_log.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() >= DEGRADED_LOG_EVERY) {
            *last = Some(Instant::now());
            since_log.store(0, Ordering::Relaxed);
            match kind {
                StoreErrorKind::Unavailable => tracing::warn!(
                    error = %err, failures_since_last_log = n,
                    "redis unavailable on {what}: failing open (DIRECT_ADMITTED with stateless tokens)"
                ),
                StoreErrorKind::Data => tracing::error!(
                    error = %err, target_queue = %target, failures_since_last_log = n,
                    "redis failed on {what} for one target (corrupt key or script error): failing open this request only"
                ),
            }
        }
    }
}

/// The flag as this instance applies it.
struct FlagCache {
    state: RwLock<Arc<FlagState>>,
    /// A flag hash was read at least once: from then on a missing hash is a lost flag (Redis
    /// restarted empty, FLUSHALL, failover to an empty replica), not "off".
    seen: AtomicBool,
    /// The hash is missing now and `state` is the last one read.
    missing: AtomicBool,
}

/// The flag version an instance applies after a refresh, for its acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedFlag {
    pub version: u64,
    /// The flag hash is missing from the store; the last known flag stays in force.
    pub kept_missing: bool,
    /// [`FlagState::summary`] of the flag in force.
    pub state: String,
}

pub struct QueueService {
    pub store: AnyStore,
    secret: Secret,
    settings: Arc<Settings>,
    flag: FlagCache,
    /// Runtime batch size for every target (0 = none set), refreshed with the flag.
    global_batch: AtomicU64,
    degraded: Degraded,
    registered: Mutex<HashMap<QueueTarget, Instant>>,
}

impl QueueService {
    pub fn new(store: AnyStore, secret: Secret, settings: Arc<Settings>) -> Self {
        Self {
            store,
            secret,
            settings,
            flag: FlagCache {
                state: RwLock::new(Arc::new(FlagState::default())),
                seen: AtomicBool::new(false),
                missing: AtomicBool::new(false),
            },
            global_batch: AtomicU64::new(0),
            degraded: Degraded::new(),
            registered: Mutex::new(HashMap::new()),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn flag(&self) -> Arc<FlagState> {
        self.flag.state.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether the flag hash is missing from the store while this instance keeps the last
    /// flag it read (see [`QueueService::refresh_flag`]).
    pub fn flag_missing(&self) -> bool {
        self.flag.missing.load(Ordering::Relaxed)
    }

    /// Whether this user goes through the queue (and the gate) for this target.
    pub fn queue_applies(&self, target: QueueTarget, user: UserId) -> bool {
        self.flag().applies(target, user)
    }

    /// Reads the flag and the runtime batch size from the store. On error the last values
    /// stay in force. A missing flag hash is "off" only until this instance has read one:
    /// after that it keeps the last flag read, says so (warning, `virtual_queue_flag_missing`,
    /// its acknowledgement, `/readyz`), and applies the next flag written, whatever its version.
    pub async fn refresh_flag(&self) -> Result<AppliedFlag, StoreError> {
        let stored = self.store.read_stored_flag().await?;
        // Redis answers again: let requests use it at once.
        self.degraded.skip_until_ms.store(0, Ordering::Relaxed);
        let batch = self.store.global_batch_size().await?;
        self.global_batch.store(batch.unwrap_or(0), Ordering::Relaxed);
        let mut current = self.flag.state.write().unwrap_or_else(|e| e.into_inner());
        let was_missing = self.flag.missing.load(Ordering::Relaxed);
        let missing = match stored {
            Some(flag) => {
                self.flag.seen.store(true, Ordering::Relaxed);
                if was_missing {
                    tracing::warn!(version = flag.version, state = %flag.summary(), "flag hash virtual-queue:flag is back: applying it");
                }
                if **current != flag {
                    tracing::info!(version = flag.version, state = %flag.summary(), "flag changed");
                    *current = Arc::new(flag);
                }
                false
            }
            None if self.flag.seen.load(Ordering::Relaxed) => {
                if !was_missing {
                    tracing::warn!(
                        kept_version = current.version,
                        kept_state = %current.summary(),
                        "flag hash virtual-queue:flag is missing from Redis (restart without persistence, FLUSHALL or failover to an empty replica?): keeping the last known flag; re-assert it with `vq flag on` or `vq flag off`"
                    );
                }
                true
            }
            // Never read a flag: nobody turned the queue on, it is off.
            None => false,
        };
        self.flag.missing.store(missing, Ordering::Relaxed);
        crate::metrics::set_flag_missing(missing);
        Ok(AppliedFlag { version: current.version, kept_missing: missing, state: current.summary() })
    }

    /// The batch size in force: the target's runtime value, else the global one, else config.
    pub fn batch_size(&self, target_override: Option<u64>) -> u64 {
        let global = match self.global_batch.load(Ordering::Relaxed) {
            0 => None,
            b => Some(b),
        };
        batch_in_force(target_override, global, self.settings.queue.batch_size)
    }

    /// One deadline (`redis.timeout_ms`) for all of a request's store work, however many
    /// commands it takes (an enter that finds the user admitted is two scripts) and however
    /// long it queued for a shared call. Past it the request fails open; the store takes a
    /// user told DIRECT_ADMITTED out of the queue if the late call gave them a place.
    async fn bounded<T>(&self, work: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        tokio::time::timeout(self.settings.redis_timeout(), work).await.unwrap_or(Err(StoreError::Timeout))
    }

    fn now_s() -> u64 {
        now_epoch_ms() / 1000
    }

    fn candidate(&self, target: QueueTarget, user: UserId) -> EntryToken {
        token::mint(&self.secret, target, user, Self::now_s(), self.settings.token.ttl_s)
    }

    fn direct(&self, target: QueueTarget, user: UserId) -> QueueStatus {
        QueueStatus::DirectAdmitted(self.candidate(target, user))
    }

    fn stored_token(raw: String) -> QueueStatus {
        // Our own token, read back from the store; its expiry is in its payload.
        let expires_at = token::decode(&raw).map_or(0, |(c, _, _)| c.expires_at);
        QueueStatus::Admitted(EntryToken { raw, expires_at })
    }

    /// The store asks for a candidate only when it issues the token in this call, and keeps
    /// it unless another call issued one first. (Two calls in the same second mint equal
    /// candidates, so a race can rarely count twice.)
    fn count_issue(raw: String, minted: &OnceLock<EntryToken>) -> String {
        if minted.get().is_some_and(|c| c.raw == raw) {
            crate::metrics::token_issued();
        }
        raw
    }

    fn waiting(&self, w: Waiting) -> QueueStatus {
        let pos = QueuePosition { seq: w.seq, admitted_mark: w.mark, ahead: w.ahead };
        QueueStatus::Waiting {
            position: w.seq,
            ahead: w.ahead,
            eta_seconds: pos.eta_seconds(self.batch_size(w.batch_override), self.settings.queue.tick_ms),
            paused: w.paused,
        }
    }

    fn pre_queue(n: SaleNotice) -> QueueStatus {
        QueueStatus::PreQueue { opens_at_ms: n.opens_at_ms.unwrap_or(0), paused: n.paused }
    }

    fn closed(n: SaleNotice) -> QueueStatus {
        QueueStatus::Closed { message: n.message.unwrap_or_else(|| DEFAULT_CLOSE_MESSAGE.to_owned()) }
    }

    /// Closes the target's sale because the purchase API said so (`gate.close_header`).
    pub async fn close_by_purchase_api(&self, target: QueueTarget, message: String) {
        let close = SaleControl::Close { message, source: SaleSource::PurchaseApi };
        match self.bounded(self.store.control_sale(target, close)).await {
            Ok(true) => tracing::info!(target_queue = %target, "the purchase API closed the sale"),
            Ok(false) => {}
            Err(e) => self.degraded.record("sale close", target, &e),
        }
    }

    /// DIRECT_ADMITTED without asking the store: the queue is off for this user and target,
    /// or Redis failed moments ago (fail-open).
    fn bypass_store(&self, target: QueueTarget, user: UserId) -> Option<QueueStatus> {
        if !self.queue_applies(target, user) {
            return Some(self.direct(target, user));
        }
        if self.degraded.skipping() {
            self.degraded.record_skipped();
            return Some(self.direct(target, user));
        }
        None
    }

    pub async fn enter(&self, target: QueueTarget, user: UserId) -> Result<QueueStatus, QueueError> {
        if let Some(direct) = self.bypass_store(target, user) {
            return Ok(direct);
        }
        let minted = OnceLock::new();
        let candidate = || minted.get_or_init(|| self.candidate(target, user)).raw.clone();
        match self.bounded(self.store.enter(target, user, &candidate)).await {
            Ok(EnterOutcome::Waiting(w)) => {
                self.register_active(target).await;
                Ok(self.waiting(w))
            }
            Ok(EnterOutcome::Admitted(raw)) => Ok(Self::stored_token(Self::count_issue(raw, &minted))),
            Ok(EnterOutcome::Full) => Err(QueueError::Full(target)),
            Ok(EnterOutcome::PreQueue(n)) => {
                self.register_active(target).await;
                Ok(Self::pre_queue(n))
            }
            Ok(EnterOutcome::Scheduled(n)) => Ok(QueueStatus::Scheduled {
                opens_at_ms: n.opens_at_ms.unwrap_or(0),
                prequeue_from_ms: n.prequeue_from_ms,
            }),
            Ok(EnterOutcome::Closed(n)) => Ok(Self::closed(n)),
            Err(e) => {
                self.degraded.record("enter", target, &e);
                Ok(self.direct(target, user))
            }
        }
    }

    pub async fn status(&self, target: QueueTarget, user: UserId) -> Result<QueueStatus, QueueError> {
        if let Some(direct) = self.bypass_store(target, user) {
            return Ok(direct);
        }
        let minted = OnceLock::new();
        let candidate = || minted.get_or_init(|| self.candidate(target, user)).raw.clone();
        match self.bounded(self.store.status(target, user, &candidate)).await {
            Ok(StatusOutcome::Waiting(w)) => Ok(self.waiting(w)),
            Ok(StatusOutcome::Admitted(raw)) => Ok(Self::stored_token(Self::count_issue(raw, &minted))),
            Ok(StatusOutcome::NotInQueue) => Err(QueueError::NotInQueue(target)),
            Ok(StatusOutcome::PreQueue(n)) => Ok(Self::pre_queue(n)),
            Ok(StatusOutcome::Closed(n)) => Ok(Self::closed(n)),
            Err(e) => {
                self.degraded.record("poll", target, &e);
                Ok(self.direct(target, user))
            }
        }
    }

    /// Leaving is best effort: with Redis down the user is evicted later by the heartbeat.
    pub async fn leave(&self, target: QueueTarget, user: UserId) {
        if self.degraded.skipping() {
            self.degraded.record_skipped();
            return;
        }
        if let Err(e) = self.bounded(self.store.leave(target, user)).await {
            self.degraded.record("leave", target, &e);
        }
    }

    pub async fn stats(&self, target: QueueTarget) -> Result<QueueStats, StoreError> {
        Ok(read_target_stats(&self.store, target, &self.settings.queue).await?.1)
    }

    /// Sets the `/metrics` queue gauges of every active target from the store.
    pub async fn record_queue_gauges(&self) -> Result<(), StoreError> {
        crate::metrics::set_capacity(self.settings.queue.max_capacity);
        for target in self.store.active_targets().await? {
            let s = self.stats(target).await?;
            crate::metrics::set_queue_state(target, s.waiting_count, s.target_rate_per_sec);
        }
        Ok(())
    }

    /// The gate's decision for a request to a gated route of `target`: with the flag
    /// applying to this user, the token must be well-formed, signed, unexpired, for this type,
    /// target and user, and not used yet (when Redis answers).
    pub async fn gate_check(
        &self,
        target: QueueTarget,
        user: Option<UserId>,
        token: Option<&str>,
        mode: ClaimMode,
    ) -> Result<GatePass, TokenError> {
        let flag = self.flag();
        let applies = match user {
            Some(u) => flag.applies(target, u),
            None => flag.may_apply(target),
        };
        if !applies {
            return Ok(GatePass::FlagOff);
        }
        let verdict = self.verify_and_claim(target, user, token, mode).await;
        if let Err(e) = &verdict {
            crate::metrics::bypass_attempt();
            if matches!(e, TokenError::Expired { .. }) {
                crate::metrics::token_expired();
            }
        }
        verdict
    }

    async fn verify_and_claim(
        &self,
        target: QueueTarget,
        user: Option<UserId>,
        token: Option<&str>,
        mode: ClaimMode,
    ) -> Result<GatePass, TokenError> {
        let user = user.ok_or(TokenError::NoUser)?;
        let raw = token.filter(|t| !t.is_empty()).ok_or(TokenError::Missing)?;
        let now = Self::now_s();
        let claims = token::verify(&self.secret, raw, target, user, now)?;
        if self.degraded.skipping() {
            self.degraded.record_skipped();
            return Ok(GatePass::Verified { claim: None });
        }
        let outcome = match mode {
            ClaimMode::CheckOnly => match self.bounded(self.store.token_used(target, user, raw)).await {
                Ok(true) => return Err(TokenError::AlreadyUsed),
                Ok(false) => GatePass::Verified { claim: None },
                Err(e) => {
                    self.degraded.record("gate", target, &e);
                    GatePass::Verified { claim: None }
                }
            },
            ClaimMode::Claim => {
                match self.bounded(self.store.claim_token(target, user, raw, claims.expires_at - now)).await {
                    Ok(TokenClaim::AlreadyUsed) => return Err(TokenError::AlreadyUsed),
                    Ok(TokenClaim::Claimed { previous }) => GatePass::Verified {
                        claim: Some(PendingClaim { target, user, token: raw.to_owned(), previous }),
                    },
                    Err(e) => {
                        // Best effort: without Redis, HMAC and expiry still hold.
                        self.degraded.record("gate", target, &e);
                        GatePass::Verified { claim: None }
                    }
                }
            }
        };
        Ok(outcome)
    }

    /// Keeps verified purchases within one batch per tick per target (`gate.pace`): reserves a
    /// place, waits for its tick, and answers [`Pace::Now`] only while that tick lasts. A
    /// process paused past the reserved tick (a long GC pause, a throttled container) reserves
    /// again instead of forwarding late. Without Redis the purchase goes at once (fail-open;
    /// the downstream database is the last line).
    pub async fn pace_purchase(&self, target: QueueTarget) -> Pace {
        let gate = &self.settings.gate;
        if !gate.pace || self.degraded.skipping() {
            return Pace::Now;
        }
        let tick_ms = self.settings.queue.tick_ms;
        for _ in 0..PACE_ATTEMPTS {
            let asked = tokio::time::Instant::now();
            match self
                .bounded(self.store.pace_purchase(target, self.batch_size(None), tick_ms, gate.pace_max_ticks))
                .await
            {
                Ok(Some(slot)) => {
                    // Both ends err on the safe side: the start counts from the answer, the
                    // end from the question (Redis' clock read in between).
                    let answered = tokio::time::Instant::now();
                    let starts = answered + Duration::from_millis(slot.starts_in_ms);
                    let forward_by =
                        asked + Duration::from_millis(slot.ends_in_ms.saturating_sub(PACE_FORWARD_MARGIN_MS));
                    tokio::time::sleep_until(starts).await;
                    if tokio::time::Instant::now() < forward_by {
                        return Pace::Now;
                    }
                }
                Ok(None) => return Pace::Full,
                Err(e) => {
                    self.degraded.record("gate pace", target, &e);
                    return Pace::Now;
                }
            }
        }
        Pace::Full
    }

    /// After the upstream answered: a 2xx consumes the token, anything else gives it back.
    pub async fn settle_claim(&self, claim: PendingClaim, purchase_succeeded: bool) {
        let result = if purchase_succeeded {
            // The queue's own token is what the claim found stored for the user.
            let through_queue = claim.previous.as_deref() == Some(claim.token.as_str());
            crate::metrics::token_consumed(through_queue);
            self.bounded(self.store.confirm_token_used(claim.target, through_queue)).await
        } else {
            self.bounded(self.store.release_token(claim.target, claim.user, &claim.token, claim.previous)).await
        };
        if let Err(e) = result {
            self.degraded.record("gate settle", claim.target, &e);
        }
    }

    async fn register_active(&self, target: QueueTarget) {
        {
            let mut seen = self.registered.lock().unwrap_or_else(|e| e.into_inner());
            if seen.get(&target).is_some_and(|t| t.elapsed() < REGISTER_EVERY) {
                return;
            }
            seen.insert(target, Instant::now());
        }
        let register = async {
            self.store.register_active(target).await?;
            self.store.publish_capacity(target).await
        };
        if let Err(e) = self.bounded(register).await {
            // Try again at the next entry rather than in REGISTER_EVERY.
            self.registered.lock().unwrap_or_else(|e| e.into_inner()).remove(&target);
            self.degraded.record("register", target, &e);
        }
    }
}
