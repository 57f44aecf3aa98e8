//! What store operations answer, in domain words: outcomes, views and snapshots shared by
//! every backend. Storage formats (hash fields, acknowledgement strings) are not here: each
//! backend reads its own into these types.

use crate::domain::{Observations, QueueTarget, SaleRecord, UserId, WaitHistogram};

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
    /// The lane the user waits in, for a target with lanes (the position is the lane's).
    pub lane: Option<crate::domain::LaneName>,
}

impl Waiting {
    /// A shard's answer in the whole target's numbers (`part` names the shard; the answer
    /// itself for a whole target): the shards' seqs interleaved (shard s's k-th seq is the
    /// whole target's (k − 1)·N + s + 1), the mark and the users ahead scaled by N. Exact
    /// for the user's own shard, an estimate of the others; seq ≤ mark holds as in the shard.
    pub fn in_whole_target(self, part: QueueTarget) -> Self {
        if part.shard.is_whole() || part.shard.count <= 1 {
            return self;
        }
        let (n, s) = (u64::from(part.shard.count), u64::from(part.shard.index));
        Waiting { seq: self.seq.saturating_sub(1) * n + s + 1, mark: self.mark * n, ahead: self.ahead * n, ..self }
    }

    /// The shard's own seq of a seq in the whole target's numbers ([`Self::in_whole_target`]).
    pub fn shard_seq(whole: u64, part: QueueTarget) -> u64 {
        if part.shard.is_whole() || part.shard.count <= 1 {
            return whole;
        }
        whole.saturating_sub(1) / u64::from(part.shard.count) + 1
    }
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
    /// Refused by the count of queues (`QueueOps::enter_counted`): the user holds a place in
    /// its `max` already, these (each with the ms since it was counted). Not recorded.
    TooMany(Vec<(QueueTarget, u64)>),
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
    /// Counted (and marked used with its last purchase); `previous` is what the token key
    /// held, to restore on failure.
    Claimed { previous: Option<String> },
    /// The token made its `purchases_per_admission` purchases already.
    AlreadyUsed,
    /// The user made their `purchases_per_user` purchases of the target already.
    UserLimit,
}

/// What [`super::GateOps::claim_token_paced`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PacedClaim {
    /// The claim's outcome, and the purchase's place in a tick when it was reserved in the same
    /// step (`None`: not reserved there, reserve it with `pace_purchase`). A refused claim
    /// holds no place.
    Claim(TokenClaim, Option<PaceSlot>),
    /// Every tick the purchase may wait for is full: nothing claimed, nothing reserved.
    Full,
}

/// A place reserved for one purchase in a tick (see [`super::GateOps::pace_purchase`]), as times
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
    /// The flag the instance applies, one line ([`crate::domain::FlagState::summary`]); empty if unknown.
    pub state: String,
    /// `None` while the acknowledgement is live; else for how long it has been expired (the
    /// instance stopped refreshing it: frozen, cut off from Redis, or gone without a
    /// shutdown). Listed for [`super::FLAG_ACK_KEEP_MS`] after it expired.
    pub silent_ms: Option<u64>,
}

impl FlagAck {
    /// The acknowledgement as every store keeps it: its state without ':' (the contract,
    /// fixed by Redis' `version:applied_at_ms:missing:state` value), not silent.
    pub fn stored(self) -> Self {
        Self { state: self.state.replace(':', " "), silent_ms: None, ..self }
    }

    /// The instance applies flag `version` or a later one. One that keeps a lost flag has not
    /// read that write, whatever its version says.
    pub fn applied(&self, version: u64) -> bool {
        self.version >= version && !self.kept_missing
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

impl TokensEnded {
    /// The tokens that ended since the counters stood at `earlier` (the last decision's).
    pub fn since(self, earlier: TokensEnded) -> TokensEnded {
        TokensEnded {
            used: self.used.saturating_sub(earlier.used),
            expired: self.expired.saturating_sub(earlier.expired),
        }
    }
}

/// What [`super::OutflowOps::claim_outflow`] found.
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

/// What one eviction call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Users evicted by the call.
    pub users: u64,
    /// Whether a next call may find more stale users.
    pub more: bool,
}
