//! Where queue state lives, behind one trait in domain words.
//!
//! [`RedisStore`] is production: every multi-key change is one Lua script from `lua/`, and
//! the key layout is a contract (README, Redis). [`MemoryStore`] has the same semantics in one
//! process, for trial runs of a single instance. Both pass the conformance suite in
//! `tests/it/conformance.rs`. Nothing outside this module sees a `redis::Value`.
//!
//! One file (over 400 lines): the trait is the stores' contract, and every operation's
//! signature stands next to the domain types it speaks (outcomes, views, errors), read in one
//! place by whoever implements or calls a store.

mod coalesce;
mod memory;
mod redis;
mod rules;

use std::future::Future;
use std::time::Duration;

pub use self::memory::MemoryStore;
pub use self::redis::{PACE_GUARD_MS, RedisStore, TargetView, ViewSync, keys};

use crate::domain::{
    AnswerClass, FlagChange, FlagState, LedgerEntry, Observations, QueueTarget, QueueTargetType, SaleControl,
    SaleRecord, SaleSchedule, TargetRecord, UserId, WaitHistogram,
};

/// What the store needs to know of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLimits {
    /// Users waiting (not yet admitted) beyond which enter answers full.
    pub max_capacity: u64,
    /// The types configured with a capacity of their own (`targets.types.*.max_capacity`).
    pub type_capacity: Vec<(QueueTargetType, u64)>,
    /// Sliding expiry of a target's keys.
    pub key_ttl_s: u64,
    /// Lifetime of the stored token key (= the token's own lifetime).
    pub token_ttl_s: u64,
    /// Expiry of a target's sale record after its last write (`queue.record_ttl_days`).
    pub record_ttl_s: u64,
    /// The tick, the width of the record's per-tick buckets (arrivals are counted by enter).
    pub tick_ms: u64,
}

impl StoreLimits {
    /// The users who may wait per target of `kind`.
    pub fn capacity(&self, kind: QueueTargetType) -> u64 {
        self.type_capacity.iter().find(|(k, _)| *k == kind).map_or(self.max_capacity, |(_, c)| *c)
    }
}

/// The longest a request waits for a store that is answering other calls of its instance
/// (an instance busier than `redis.timeout_ms` allows, see `QueueService::bounded`); also each
/// Redis command's own response timeout, so a command that queued behind others is not cut
/// short while its request still waits.
pub const BUSY_WAIT_MAX: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("redis: {}", describe_redis_error(.0))]
    Redis(#[from] ::redis::RedisError),
    #[error("redis command timed out")]
    Timeout,
    /// Redis answers (its liveness probe does), but this instance did not get through its
    /// work within [`BUSY_WAIT_MAX`]: the instance is overloaded, the store is not down.
    #[error("this instance is overloaded: its redis work did not finish in time while redis answers")]
    Busy,
    #[error("unexpected reply from {what}: {detail}")]
    Reply { what: &'static str, detail: String },
}

/// The client's text, except for a reply that is not the Redis protocol at all, which the
/// client reports as a byte it did not expect ("Parse error at 1 Unexpected `84`"): that is the
/// address of something else, most often an HTTP port.
fn describe_redis_error(e: &::redis::RedisError) -> String {
    let text = e.to_string();
    if e.kind() == ::redis::ErrorKind::Parse && text.contains("Parse error at") {
        return "what answers at this address does not speak the Redis protocol: is it an HTTP port, such as \
                vq's own listen address? Point redis.url (VQ_REDIS__URL) at redis-server"
            .to_owned();
    }
    text
}

/// What a store failure says about the store, which decides how far fail-open reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreErrorKind {
    /// The store cannot serve anyone now: connection refused, reset or timed out, loading,
    /// busy with a long script, cluster down, read-only after a failover, refused
    /// credentials. Every target would fail alike.
    Unavailable,
    /// The store answered, but this call failed on what it touched: a key of the wrong type
    /// (a corrupt key), a script error, a reply of the wrong shape, a write refused for lack
    /// of memory (`OOM`: reads, and writes that free memory, still work). Other calls are
    /// asked of the store as usual.
    Data,
}

impl StoreErrorKind {
    pub const ALL: [StoreErrorKind; 2] = [StoreErrorKind::Unavailable, StoreErrorKind::Data];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Data => "data",
        }
    }
}

impl StoreError {
    /// The command may have reached the store and run there after the caller stopped waiting.
    pub fn is_timeout(&self) -> bool {
        match self {
            StoreError::Timeout | StoreError::Busy => true,
            StoreError::Redis(e) => e.is_timeout(),
            StoreError::Reply { .. } => false,
        }
    }

    /// Redis refused a write for lack of memory (`maxmemory` reached with `noeviction`).
    pub fn is_out_of_memory(&self) -> bool {
        // A script's write refused inside the script carries the code too (Redis 7).
        matches!(self, StoreError::Redis(e) if e.code() == Some("OOM") || e.to_string().contains("OOM command not allowed"))
    }

    pub fn kind(&self) -> StoreErrorKind {
        use ::redis::{ErrorKind as K, ServerErrorKind as S};
        let StoreError::Redis(e) = self else {
            return match self {
                StoreError::Timeout => StoreErrorKind::Unavailable,
                _ => StoreErrorKind::Data,
            };
        };
        let unavailable = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || matches!(
                e.kind(),
                K::Server(
                    S::BusyLoading | S::ClusterDown | S::MasterDown | S::TryAgain | S::ReadOnly | S::NoPerm
                ) | K::ClusterConnectionNotFound
                    | K::AuthenticationFailed
            )
            // Codes redis-rs has no kind for: a script running too long, no auth,
            // persistence failing. (`OOM` is not one: it refuses that write, not the store.)
            || matches!(e.code(), Some("BUSY" | "NOAUTH" | "MISCONF" | "WRONGPASS"));
        if unavailable { StoreErrorKind::Unavailable } else { StoreErrorKind::Data }
    }
}

/// What declaring a target at runtime did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclareOutcome {
    Added,
    AlreadyDeclared,
    /// `room` targets are declared at runtime already: no room for another.
    Full {
        room: u64,
    },
}

/// A user's place while waiting, plus the per-target batch size if one is set at runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    pub seq: u64,
    pub mark: u64,
    pub ahead: u64,
    pub batch_override: Option<u64>,
    /// The target's sale is paused: nobody is admitted until it resumes.
    pub paused: bool,
}

/// What enter and poll tell a user about the target's sale when it keeps them out of the
/// queue (times in epoch ms).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SaleNotice {
    pub opens_at_ms: Option<u64>,
    pub prequeue_from_ms: Option<u64>,
    pub paused: bool,
    /// The close message.
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnterOutcome {
    Waiting(Waiting),
    /// Admitted: the stored token (the candidate if it was issued just now).
    Admitted(String),
    Full,
    /// Recorded in the sale's pre-queue (once): the order is drawn at the opening.
    PreQueue(SaleNotice),
    /// Before the pre-queue opens: not recorded.
    Scheduled(SaleNotice),
    /// The sale is closed: not recorded.
    Closed(SaleNotice),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusOutcome {
    Waiting(Waiting),
    Admitted(String),
    NotInQueue,
    PreQueue(SaleNotice),
    /// The sale closed before the user was admitted.
    Closed(SaleNotice),
}

/// What `vq sale clear` did. Without `force` the check and the clear are one atomic step:
/// nobody pre-queues between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClearOutcome {
    Cleared,
    /// The target had no sale.
    NoSale,
    /// Refused: clearing would drop these users, pre-queued (`opening` false) or being given
    /// their places at the opening (`opening` true).
    Refused {
        opening: bool,
        prequeued: u64,
    },
}

/// What scheduling a sale did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleOutcome {
    /// Scheduled; the seed's commitment (kept from an earlier schedule of the same sale).
    Scheduled { commitment: String },
    /// The opening froze the pre-queue already (epoch ms): clear the sale to schedule anew.
    AlreadyOpened { frozen_at_ms: u64 },
}

/// A sale as stored plus the store's clock when it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaleView {
    pub record: SaleRecord,
    pub now_ms: u64,
}

/// The pre-queue frozen at the opening, waiting for the pump to write its order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingOpening {
    /// Seqs `base + 1 ..= base + users.len()` are the pre-queued users'.
    pub base: u64,
    pub seed: Vec<u8>,
    pub opens_at_ms: u64,
    /// The frozen members, in no particular order.
    pub users: Vec<UserId>,
}

/// Ledger rows kept per target (newest first): a sale of 100k users at 100 per tick needs 1000.
pub const LEDGER_MAX_ROWS: u64 = 10_000;

/// What one admit call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmitOutcome {
    /// False when this tick had already been advanced (by this or another instance).
    pub advanced: bool,
    pub mark: u64,
    pub tick: u64,
    /// Users admitted by this call.
    pub admitted: u64,
    /// The batch size that was in force.
    pub batch: u64,
}

/// The result of claiming a token for one purchase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenClaim {
    /// Marked used; `previous` is what the token key held, to restore on failure.
    Claimed {
        previous: Option<String>,
    },
    AlreadyUsed,
}

/// A place reserved for one purchase in a tick (see [`QueueStore::pace_purchase`]), as times
/// from the moment the store answered, by its clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaceSlot {
    /// Until the reserved tick starts (0 = it has).
    pub starts_in_ms: u64,
    /// Until the reserved tick ends: a purchase not forwarded by then must not be.
    pub ends_in_ms: u64,
}

/// An instance's acknowledgement of the flag version it applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagAck {
    pub instance: String,
    pub version: u64,
    /// When the instance applied that version (epoch ms, its clock).
    pub applied_at_ms: u64,
    /// The flag hash is missing from the store and the instance keeps its last known flag.
    pub kept_missing: bool,
    /// The flag the instance applies, one line ([`FlagState::summary`]); empty if unknown.
    pub state: String,
    /// `None` while the acknowledgement is live; else for how long it has been expired (the
    /// instance stopped refreshing it: frozen, cut off from Redis, or gone without a
    /// shutdown). Listed for [`FLAG_ACK_KEEP_MS`] after it expired.
    pub silent_ms: Option<u64>,
}

/// How long an instance whose acknowledgement expired stays listed (silent) in
/// [`QueueStore::flag_acks`]: long enough for an operator to see that a frozen or cut-off
/// instance never applied the last change. An instance that shuts down withdraws its own.
pub const FLAG_ACK_KEEP_MS: u64 = 10 * 60 * 1000;

impl FlagAck {
    /// The hash value after the version and time: `missing:state`.
    fn encode_rest(&self) -> (&'static str, String) {
        (if self.kept_missing { "1" } else { "0" }, self.state.replace(':', " "))
    }

    /// Parses `version:applied_at_ms[:missing:state]`.
    fn decode(instance: &str, value: &str, silent_ms: Option<u64>) -> Option<Self> {
        let mut parts = value.splitn(4, ':');
        let version = parts.next()?.parse().ok()?;
        let applied_at_ms = parts.next()?.parse().ok()?;
        let kept_missing = parts.next() == Some("1");
        let state = parts.next().unwrap_or_default().to_owned();
        Some(Self { instance: instance.to_owned(), version, applied_at_ms, kept_missing, state, silent_ms })
    }
}

/// A target's figures as stored, for stats and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetSnapshot {
    /// Users waiting and not yet admitted.
    pub waiting: u64,
    pub mark: u64,
    pub seq: u64,
    pub evicted: u64,
    pub batch_override: Option<u64>,
    /// The capacity in force, as published by the instances serving the target.
    pub capacity: Option<u64>,
    /// Instance holding the admission lock now, if any.
    pub lock_holder: Option<String>,
    /// (tick, users admitted) for the last ticks, newest first.
    pub admissions: Vec<(u64, u64)>,
    /// Users admitted since the target's keys were created.
    pub admitted_total: u64,
    /// The target's sale, if it has one, and the store's clock when read.
    pub sale: Option<SaleView>,
    /// Users in the sale's pre-queue (or the frozen one), not yet given a seq.
    pub prequeued: u64,
    /// Tokens issued through the queue (not DIRECT_ADMITTED ones), and of those the ones a
    /// purchase used; `direct_tokens_used` counts purchases with stateless tokens (minted while
    /// the queue was off for the user or Redis was down), which were never issued here.
    pub tokens_issued: u64,
    pub tokens_used: u64,
    pub direct_tokens_used: u64,
    /// Tokens issued through the queue that expired without a purchase (no-shows), counted
    /// by the pump (`tokens_expire.lua`).
    pub tokens_expired: u64,
    /// Waits from entry to admission of every admitted user.
    pub waits: WaitHistogram,
    /// When the longest-waiting user (of those not yet admitted) entered, epoch ms of the
    /// store's clock; `None` while nobody waits.
    pub oldest_entry_ms: Option<u64>,
    /// The adaptive outflow's last decision, if it made one.
    pub outflow: Option<OutflowState>,
}

/// The adaptive outflow's state for a target (`queue:{T}:outflow`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutflowState {
    /// The batch the controller chose.
    pub batch: u64,
    /// Why, in words (domain::Decision).
    pub reason: String,
    /// When, on Redis' clock (ms).
    pub decided_at_ms: u64,
    /// The smoothed share of no-shows (domain::smooth_no_show), in basis points (1/10000);
    /// `None` before there was evidence.
    pub no_show_bp: Option<u64>,
    /// The target's `tokens_used` and `tokens_expired` counters at the decision, so the next
    /// one sees what ended in between.
    pub tokens_used: u64,
    pub tokens_expired: u64,
    /// What the decision saw of the interval before it: purchases the gates forwarded, their
    /// P95 latency (upper bound of its bucket, ms) and share of errors (basis points).
    pub purchases: u64,
    pub p95_ms: Option<u64>,
    pub error_bp: u64,
}

/// A decision that moved the batch, for the ledger: the batch before (`None` at the first
/// decision) and the instance that decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchChange {
    pub from: Option<u64>,
    pub instance: String,
}

/// The tokens that ended in a control interval: used by a purchase, or expired unused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokensEnded {
    pub used: u64,
    pub expired: u64,
}

/// What [`QueueStore::claim_outflow`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutflowClaim {
    /// The interval is this caller's to decide: the batch now (if any was chosen) and what
    /// the gates saw in the interval.
    /// `no_show_bp` is the smoothed share of no-shows so far; `ended` what ended since the
    /// last decision (`None` at the first); `counters` the target's token counters now.
    Decide {
        current: Option<u64>,
        seen: Observations,
        no_show_bp: Option<u64>,
        ended: Option<TokensEnded>,
        counters: TokensEnded,
    },
    /// Another pump decided this interval already: the batch it chose.
    Decided { current: Option<u64> },
    /// An operator pinned the target's batch (`vq batch set --target`): nothing to decide.
    Pinned,
}

/// The token to store if a call admits the user now. Made only then: signing costs an HMAC,
/// and nearly every enter and poll finds the user waiting.
pub trait Candidate: Sync {
    fn token(&self) -> String;
}

impl Candidate for &str {
    fn token(&self) -> String {
        (*self).to_owned()
    }
}

impl<F: Fn() -> String + Sync> Candidate for F {
    fn token(&self) -> String {
        self()
    }
}

/// Queue state, in domain words. Every method is one atomic step.
pub trait QueueStore: Send + Sync + 'static {
    /// Idempotent: a user already waiting keeps their seq; an admitted user gets their token.
    fn enter(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> impl Future<Output = Result<EnterOutcome, StoreError>> + Send;

    /// The poll: refreshes the heartbeat, issues the token once the mark reaches the seq.
    fn status(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> impl Future<Output = Result<StatusOutcome, StoreError>> + Send;

    /// Returns whether the user was waiting.
    fn leave(&self, target: QueueTarget, user: UserId) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Counts one purchase the gate forwarded for `target` in control interval `interval`:
    /// its latency bucket (domain::latency_bucket), whether it failed and whether the
    /// purchase API backed off.
    fn observe_purchase(
        &self,
        target: QueueTarget,
        interval: u64,
        bucket: usize,
        error: bool,
        backoff: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Claims control interval `interval` of `target`'s adaptive outflow: once per interval
    /// across every pump, and never while the target's batch is pinned.
    fn claim_outflow(
        &self,
        target: QueueTarget,
        interval: u64,
    ) -> impl Future<Output = Result<OutflowClaim, StoreError>> + Send;

    /// Records the controller's decision for `target`, and with `change` (the batch moved) an
    /// admission ledger row saying from what, to what, by whom and why, in one step.
    fn set_outflow(
        &self,
        target: QueueTarget,
        state: &OutflowState,
        change: Option<BatchChange>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Counts `target` among the queues `user` holds a place in, unless `max` are counted
    /// already: empty when counted (now or before), else the targets counted, each with the
    /// ms since it was counted. The count is per user across targets
    /// (`queue.max_queues_per_user`) and lives `queue.key_ttl_s` after its last change, as a
    /// target's keys do.
    fn hold_queue(
        &self,
        user: UserId,
        target: QueueTarget,
        max: u64,
    ) -> impl Future<Output = Result<Vec<(QueueTarget, u64)>, StoreError>> + Send;

    /// Stops counting `targets` among `user`'s queues.
    fn release_queues(
        &self,
        user: UserId,
        targets: &[QueueTarget],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether `user` holds a place at `target`: waiting (admitted but not yet told included)
    /// or pre-queued.
    fn holds_place(&self, target: QueueTarget, user: UserId) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// `SET NX PX` on the target's admission lock.
    fn try_lock_admission(
        &self,
        target: QueueTarget,
        holder: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Advances the mark by one batch of live users, at most once per tick of the store's clock.
    fn admit(
        &self,
        target: QueueTarget,
        default_batch: u64,
        tick_ms: u64,
    ) -> impl Future<Output = Result<AdmitOutcome, StoreError>> + Send;

    /// [`Self::admit`], naming the instance that runs the step in the admission ledger.
    fn admit_by(
        &self,
        target: QueueTarget,
        default_batch: u64,
        tick_ms: u64,
        instance: &str,
    ) -> impl Future<Output = Result<AdmitOutcome, StoreError>> + Send {
        let _ = instance;
        self.admit(target, default_batch, tick_ms)
    }

    /// Sets the sale's schedule; draws nothing itself: `seed` is used unless the sale has one.
    fn schedule_sale(
        &self,
        target: QueueTarget,
        schedule: SaleSchedule,
        seed: [u8; 32],
    ) -> impl Future<Output = Result<ScheduleOutcome, StoreError>> + Send;

    /// The sale as stored, with the store's clock; `None` without one.
    fn read_sale(&self, target: QueueTarget) -> impl Future<Output = Result<Option<SaleView>, StoreError>> + Send;

    /// The targets a sale was scheduled for (and not cleared since); their sales may have
    /// expired ([`QueueStore::read_sale`] says).
    fn sale_targets(&self) -> impl Future<Output = Result<Vec<QueueTarget>, StoreError>> + Send;

    /// Pause, resume, close or clear, recorded in the ledger; false when it changed nothing.
    fn control_sale(
        &self,
        target: QueueTarget,
        control: SaleControl,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The frozen pre-queue, when the opening time passed and its order is not written yet.
    fn pending_opening(
        &self,
        target: QueueTarget,
    ) -> impl Future<Output = Result<Option<PendingOpening>, StoreError>> + Send;

    /// Writes one chunk of the opening order (`(seq, user)`, seqs ascending and contiguous),
    /// idempotently; `last` marks the opening done. False when it was done already.
    fn place_opening(
        &self,
        target: QueueTarget,
        places: &[(u64, UserId)],
        opens_at_ms: u64,
        last: bool,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Clears the sale (as `SaleControl::Clear`), unless `force` is false and it would drop
    /// users: pre-queued ones before the opening, or those the opening is placing. One step.
    fn clear_sale(
        &self,
        target: QueueTarget,
        force: bool,
    ) -> impl Future<Output = Result<ClearOutcome, StoreError>> + Send;

    /// The target's record (`queue:{T}:record`), which outlives its queue keys by
    /// `queue.record_ttl_days`; `None` when there is none (never written, or expired).
    fn target_record(
        &self,
        target: QueueTarget,
    ) -> impl Future<Output = Result<Option<TargetRecord>, StoreError>> + Send;

    /// Counts one purchase the gate forwarded in `tick` and the purchase API's answer, in the
    /// target's record.
    fn record_purchase(
        &self,
        target: QueueTarget,
        tick: u64,
        answer: AnswerClass,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The admission ledger, newest first.
    fn sale_ledger(&self, target: QueueTarget) -> impl Future<Output = Result<Vec<LedgerEntry>, StoreError>> + Send;

    /// Removes up to `max` users whose last poll is older than `timeout_ms`.
    fn evict(
        &self,
        target: QueueTarget,
        timeout_ms: u64,
        max: u64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    fn register_active(&self, target: QueueTarget) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Takes the target out of `queue:active` (it is no longer declared): the pump stops
    /// walking it; its keys expire on their own.
    fn deactivate(&self, target: QueueTarget) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The targets declared at runtime (`vq target add`), the set `queue:targets`.
    fn declared_targets(&self) -> impl Future<Output = Result<Vec<QueueTarget>, StoreError>> + Send;

    /// Declares a target at runtime, unless `room` targets are declared at runtime already.
    fn declare_target(
        &self,
        target: QueueTarget,
        room: u64,
    ) -> impl Future<Output = Result<DeclareOutcome, StoreError>> + Send;

    /// Removes a runtime declaration; returns whether there was one.
    fn undeclare_target(&self, target: QueueTarget) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Records this instance's `queue.max_capacity` as the capacity in force for `target`, so
    /// every instance's stats and `vq stats` show the capacity enter is checked against, not
    /// the reader's own configuration. Expires with the target's keys.
    fn publish_capacity(&self, target: QueueTarget) -> impl Future<Output = Result<(), StoreError>> + Send;

    fn active_targets(&self) -> impl Future<Output = Result<Vec<QueueTarget>, StoreError>> + Send;

    /// Drops the target from the active set when its keys have expired; returns whether it did.
    fn forget_if_expired(&self, target: QueueTarget) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The flag as stored; `None` when its hash does not exist (never written, or lost with
    /// a Redis restart without persistence, a FLUSHALL, a failover to an empty replica).
    fn read_stored_flag(&self) -> impl Future<Output = Result<Option<FlagState>, StoreError>> + Send;

    /// The flag as stored, off when its hash does not exist.
    fn read_flag(&self) -> impl Future<Output = Result<FlagState, StoreError>> + Send {
        async { Ok(self.read_stored_flag().await?.unwrap_or_default()) }
    }

    /// Sets and deletes flag fields and bumps the version; returns the new version. The new
    /// version is above every version an instance acknowledged, also when the hash was lost.
    fn write_flag(
        &self,
        set: Vec<(String, String)>,
        delete: Vec<String>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// One operator change (`vq flag on | off | clear`) in one atomic write; `Off` removes
    /// every target override in the same step. Returns the new version, as [`Self::write_flag`].
    fn change_flag(&self, change: FlagChange) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The runtime batch size for every target, if an operator set one.
    fn global_batch_size(&self) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Sets (or with `None` clears) the runtime batch size, for one target or all.
    fn set_batch_size(
        &self,
        target: Option<QueueTarget>,
        batch: Option<u64>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    fn snapshot(&self, target: QueueTarget) -> impl Future<Output = Result<TargetSnapshot, StoreError>> + Send;

    /// Marks a token used before its purchase is forwarded (best-effort one-time use).
    fn claim_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        ttl_s: u64,
    ) -> impl Future<Output = Result<TokenClaim, StoreError>> + Send;

    /// Undoes a claim after a purchase that did not succeed.
    fn release_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        previous: Option<String>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Counts a token consumed by a successful purchase: one the queue issued (no longer
    /// waiting to expire unused), or a stateless one.
    fn confirm_token_used(
        &self,
        target: QueueTarget,
        user: UserId,
        through_queue: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Buyers of `target` holding a place in active-buyer mode: admitted and not yet given
    /// their token, or holding a token issued through the queue, unused and unexpired.
    fn active_buyers(&self, target: QueueTarget) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Counts the tokens issued through the queue that expired unused since the last call
    /// (no-shows) into `tokens_expired`; returns how many.
    fn expire_tokens(&self, target: QueueTarget) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Marks `id` (a proof of work's challenge) used at `target` until `until_ms` (epoch ms,
    /// Redis' clock): true the first time, false while the mark lives.
    fn spend_once(
        &self,
        target: QueueTarget,
        id: &str,
        until_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether this token was already used (read-only, for `/gate/verify`).
    fn token_used(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Reserves a place for one purchase in the earliest tick (at most `ahead` ticks later)
    /// whose forwarded purchases are still under the batch size; `None` when all are full.
    fn pace_purchase(
        &self,
        target: QueueTarget,
        default_budget: u64,
        tick_ms: u64,
        ahead: u64,
    ) -> impl Future<Output = Result<Option<PaceSlot>, StoreError>> + Send;

    /// Records that `instance` applied flag `version`; the record lives `ttl_ms`.
    fn ack_flag(&self, ack: FlagAck, ttl_ms: u64) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The acknowledgements of every live instance, and of those silent for less than
    /// [`FLAG_ACK_KEEP_MS`] (with [`FlagAck::silent_ms`]).
    fn flag_acks(&self) -> impl Future<Output = Result<Vec<FlagAck>, StoreError>> + Send;

    /// Removes `instance`'s acknowledgement: it shuts down, and is no longer an instance that
    /// should apply the flag.
    fn withdraw_flag_ack(&self, instance: &str) -> impl Future<Output = Result<(), StoreError>> + Send;

    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The store chosen by configuration.
#[derive(Clone)]
pub enum AnyStore {
    Redis(RedisStore),
    Memory(MemoryStore),
}

impl AnyStore {
    /// Whether the store is down, refusing or stalled for `target` (any target, without one),
    /// by a liveness probe that does not depend on how busy this instance is. The embedded
    /// store always answers.
    pub fn silent(&self, target: Option<QueueTarget>) -> bool {
        match self {
            AnyStore::Redis(r) => r.silent(target),
            AnyStore::Memory(_) => false,
        }
    }

    /// The store's clock minus this host's, in ms (0 for the embedded store, and until known).
    pub fn clock_offset_ms(&self) -> Option<i64> {
        match self {
            AnyStore::Redis(r) => r.clock_offset_ms(),
            AnyStore::Memory(_) => Some(0),
        }
    }

    /// Now by the store's clock, in epoch ms: this host's clock corrected by the measured
    /// offset (this host's clock alone until the first measurement).
    pub fn now_ms(&self) -> u64 {
        let local = crate::clock::now_epoch_ms();
        let offset = self.clock_offset_ms().unwrap_or(0);
        local.saturating_add_signed(offset)
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Redis($s) => $call.await,
            AnyStore::Memory($s) => $call.await,
        }
    };
}

impl QueueStore for AnyStore {
    async fn enter(&self, t: QueueTarget, u: UserId, c: &dyn Candidate) -> Result<EnterOutcome, StoreError> {
        delegate!(self, s => s.enter(t, u, c))
    }
    async fn status(&self, t: QueueTarget, u: UserId, c: &dyn Candidate) -> Result<StatusOutcome, StoreError> {
        delegate!(self, s => s.status(t, u, c))
    }
    async fn leave(&self, t: QueueTarget, u: UserId) -> Result<bool, StoreError> {
        delegate!(self, s => s.leave(t, u))
    }
    async fn observe_purchase(&self, t: QueueTarget, i: u64, b: usize, e: bool, o: bool) -> Result<(), StoreError> {
        delegate!(self, s => s.observe_purchase(t, i, b, e, o))
    }
    async fn claim_outflow(&self, t: QueueTarget, i: u64) -> Result<OutflowClaim, StoreError> {
        delegate!(self, s => s.claim_outflow(t, i))
    }
    async fn set_outflow(
        &self,
        t: QueueTarget,
        state: &OutflowState,
        change: Option<BatchChange>,
    ) -> Result<(), StoreError> {
        delegate!(self, s => s.set_outflow(t, state, change))
    }
    async fn hold_queue(&self, u: UserId, t: QueueTarget, max: u64) -> Result<Vec<(QueueTarget, u64)>, StoreError> {
        delegate!(self, s => s.hold_queue(u, t, max))
    }
    async fn release_queues(&self, u: UserId, ts: &[QueueTarget]) -> Result<(), StoreError> {
        delegate!(self, s => s.release_queues(u, ts))
    }
    async fn holds_place(&self, t: QueueTarget, u: UserId) -> Result<bool, StoreError> {
        delegate!(self, s => s.holds_place(t, u))
    }
    async fn try_lock_admission(&self, t: QueueTarget, h: &str, ttl: u64) -> Result<bool, StoreError> {
        delegate!(self, s => s.try_lock_admission(t, h, ttl))
    }
    async fn admit(&self, t: QueueTarget, b: u64, tick: u64) -> Result<AdmitOutcome, StoreError> {
        delegate!(self, s => s.admit(t, b, tick))
    }
    async fn admit_by(&self, t: QueueTarget, b: u64, tick: u64, instance: &str) -> Result<AdmitOutcome, StoreError> {
        delegate!(self, s => s.admit_by(t, b, tick, instance))
    }
    async fn schedule_sale(
        &self,
        t: QueueTarget,
        sch: SaleSchedule,
        seed: [u8; 32],
    ) -> Result<ScheduleOutcome, StoreError> {
        delegate!(self, s => s.schedule_sale(t, sch, seed))
    }
    async fn read_sale(&self, t: QueueTarget) -> Result<Option<SaleView>, StoreError> {
        delegate!(self, s => s.read_sale(t))
    }
    async fn control_sale(&self, t: QueueTarget, c: SaleControl) -> Result<bool, StoreError> {
        delegate!(self, s => s.control_sale(t, c))
    }
    async fn sale_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        delegate!(self, s => s.sale_targets())
    }
    async fn clear_sale(&self, t: QueueTarget, force: bool) -> Result<ClearOutcome, StoreError> {
        delegate!(self, s => s.clear_sale(t, force))
    }
    async fn target_record(&self, t: QueueTarget) -> Result<Option<TargetRecord>, StoreError> {
        delegate!(self, s => s.target_record(t))
    }
    async fn record_purchase(&self, t: QueueTarget, tick: u64, answer: AnswerClass) -> Result<(), StoreError> {
        delegate!(self, s => s.record_purchase(t, tick, answer))
    }
    async fn pending_opening(&self, t: QueueTarget) -> Result<Option<PendingOpening>, StoreError> {
        delegate!(self, s => s.pending_opening(t))
    }
    async fn place_opening(
        &self,
        t: QueueTarget,
        places: &[(u64, UserId)],
        opens_at_ms: u64,
        last: bool,
    ) -> Result<bool, StoreError> {
        delegate!(self, s => s.place_opening(t, places, opens_at_ms, last))
    }
    async fn sale_ledger(&self, t: QueueTarget) -> Result<Vec<LedgerEntry>, StoreError> {
        delegate!(self, s => s.sale_ledger(t))
    }
    async fn evict(&self, t: QueueTarget, timeout: u64, max: u64) -> Result<u64, StoreError> {
        delegate!(self, s => s.evict(t, timeout, max))
    }
    async fn register_active(&self, t: QueueTarget) -> Result<(), StoreError> {
        delegate!(self, s => s.register_active(t))
    }
    async fn publish_capacity(&self, t: QueueTarget) -> Result<(), StoreError> {
        delegate!(self, s => s.publish_capacity(t))
    }
    async fn deactivate(&self, t: QueueTarget) -> Result<(), StoreError> {
        delegate!(self, s => s.deactivate(t))
    }
    async fn declared_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        delegate!(self, s => s.declared_targets())
    }
    async fn declare_target(&self, t: QueueTarget, room: u64) -> Result<DeclareOutcome, StoreError> {
        delegate!(self, s => s.declare_target(t, room))
    }
    async fn undeclare_target(&self, t: QueueTarget) -> Result<bool, StoreError> {
        delegate!(self, s => s.undeclare_target(t))
    }
    async fn active_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        delegate!(self, s => s.active_targets())
    }
    async fn forget_if_expired(&self, t: QueueTarget) -> Result<bool, StoreError> {
        delegate!(self, s => s.forget_if_expired(t))
    }
    async fn read_stored_flag(&self) -> Result<Option<FlagState>, StoreError> {
        delegate!(self, s => s.read_stored_flag())
    }
    async fn write_flag(&self, set: Vec<(String, String)>, del: Vec<String>) -> Result<u64, StoreError> {
        delegate!(self, s => s.write_flag(set, del))
    }
    async fn change_flag(&self, change: FlagChange) -> Result<u64, StoreError> {
        delegate!(self, s => s.change_flag(change))
    }
    async fn global_batch_size(&self) -> Result<Option<u64>, StoreError> {
        delegate!(self, s => s.global_batch_size())
    }
    async fn set_batch_size(&self, t: Option<QueueTarget>, b: Option<u64>) -> Result<(), StoreError> {
        delegate!(self, s => s.set_batch_size(t, b))
    }
    async fn snapshot(&self, t: QueueTarget) -> Result<TargetSnapshot, StoreError> {
        delegate!(self, s => s.snapshot(t))
    }
    async fn claim_token(&self, t: QueueTarget, u: UserId, tok: &str, ttl: u64) -> Result<TokenClaim, StoreError> {
        delegate!(self, s => s.claim_token(t, u, tok, ttl))
    }
    async fn release_token(
        &self,
        t: QueueTarget,
        u: UserId,
        tok: &str,
        prev: Option<String>,
    ) -> Result<(), StoreError> {
        delegate!(self, s => s.release_token(t, u, tok, prev))
    }
    async fn confirm_token_used(&self, t: QueueTarget, u: UserId, through_queue: bool) -> Result<(), StoreError> {
        delegate!(self, s => s.confirm_token_used(t, u, through_queue))
    }
    async fn active_buyers(&self, t: QueueTarget) -> Result<u64, StoreError> {
        delegate!(self, s => s.active_buyers(t))
    }
    async fn expire_tokens(&self, t: QueueTarget) -> Result<u64, StoreError> {
        delegate!(self, s => s.expire_tokens(t))
    }
    async fn token_used(&self, t: QueueTarget, u: UserId, tok: &str) -> Result<bool, StoreError> {
        delegate!(self, s => s.token_used(t, u, tok))
    }
    async fn spend_once(&self, t: QueueTarget, id: &str, until_ms: u64) -> Result<bool, StoreError> {
        delegate!(self, s => s.spend_once(t, id, until_ms))
    }
    async fn pace_purchase(
        &self,
        t: QueueTarget,
        budget: u64,
        tick_ms: u64,
        ahead: u64,
    ) -> Result<Option<PaceSlot>, StoreError> {
        delegate!(self, s => s.pace_purchase(t, budget, tick_ms, ahead))
    }
    async fn ack_flag(&self, ack: FlagAck, ttl_ms: u64) -> Result<(), StoreError> {
        delegate!(self, s => s.ack_flag(ack, ttl_ms))
    }
    async fn flag_acks(&self) -> Result<Vec<FlagAck>, StoreError> {
        delegate!(self, s => s.flag_acks())
    }
    async fn withdraw_flag_ack(&self, instance: &str) -> Result<(), StoreError> {
        delegate!(self, s => s.withdraw_flag_ack(instance))
    }
    async fn ping(&self) -> Result<(), StoreError> {
        delegate!(self, s => s.ping())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unreachable_store_counts_as_unavailable() {
        let io = |kind| StoreError::Redis(::redis::RedisError::from(std::io::Error::new(kind, "x")));
        assert_eq!(io(std::io::ErrorKind::ConnectionRefused).kind(), StoreErrorKind::Unavailable);
        assert_eq!(io(std::io::ErrorKind::ConnectionReset).kind(), StoreErrorKind::Unavailable);
        assert_eq!(io(std::io::ErrorKind::TimedOut).kind(), StoreErrorKind::Unavailable);
        assert_eq!(StoreError::Timeout.kind(), StoreErrorKind::Unavailable);
        let reply = StoreError::Reply { what: "enter.lua", detail: "[]".into() };
        assert_eq!(reply.kind(), StoreErrorKind::Data);
    }
}
