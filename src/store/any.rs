//! [`AnyStore`]: the store chosen by configuration, one value the service and the pump hold.
//! Every operation goes to the chosen store unchanged (one `delegate!` per trait); what only
//! one backend has (Redis' liveness probe, clock offset and poll views) is asked here in words
//! that hold for both.

use super::{
    AdmitOutcome, BatchChange, Candidate, ClearOutcome, DeclareOutcome, EnterOutcome, EventOps, Evicted, FlagAck,
    FlagOps, FleetOps, GateOps, MemoryStore, OutflowClaim, OutflowOps, OutflowState, PaceSlot, PendingOpening,
    QueueOps, RedisStore, SaleOps, SaleView, ScheduleOutcome, StatusOutcome, StoreError, TargetOps, TargetSnapshot,
    TokenClaim, ViewSync,
};
use crate::domain::{
    AnswerClass, BuyerObservation, Event, EventId, EventKind, EventLog, FlagChange, FlagState, InstanceReport,
    LedgerEntry, PurchaseLimits, QueueTarget, Refusals, SaleControl, SaleSchedule, TargetRecord, UserId,
};

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

    /// Now by the store's clock, in epoch ms: the embedded store's own clock; for Redis, this
    /// host's clock corrected by the measured offset (this host's alone until measured).
    pub fn now_ms(&self) -> u64 {
        match self {
            AnyStore::Redis(r) => crate::clock::now_epoch_ms().saturating_add_signed(r.clock_offset_ms().unwrap_or(0)),
            AnyStore::Memory(m) => m.now_ms(),
        }
    }

    /// Whether polls can be answered by this instance from a synced view of the queue
    /// (`queue.local_polls`): only a shared store needs it; the embedded one answers in-process.
    pub fn serves_local_polls(&self) -> bool {
        matches!(self, AnyStore::Redis(_))
    }

    /// Sends the heartbeats of the polls answered here (`polled`) and reads the target's view
    /// back; `None` for a store without local polls ([`Self::serves_local_polls`]).
    pub async fn sync_poll_view(&self, target: QueueTarget, polled: &[UserId]) -> Option<Result<ViewSync, StoreError>> {
        let AnyStore::Redis(r) = self else { return None };
        Some(r.sync_view(target, polled).await)
    }
}

/// Implements one store trait for [`AnyStore`]: each listed operation goes to the chosen store.
macro_rules! delegate {
    ($trait:ident { $(fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)* }) => {
        impl $trait for AnyStore {
            $(async fn $name(&self $(, $arg: $ty)*) -> Result<$ret, StoreError> {
                match self {
                    AnyStore::Redis(s) => s.$name($($arg),*).await,
                    AnyStore::Memory(s) => s.$name($($arg),*).await,
                }
            })*
        }
    };
}

delegate!(QueueOps {
    fn enter(&self, t: QueueTarget, u: UserId, c: &dyn Candidate) -> EnterOutcome;
    fn status(&self, t: QueueTarget, u: UserId, c: &dyn Candidate) -> StatusOutcome;
    fn leave(&self, t: QueueTarget, u: UserId) -> bool;
    fn hold_queue(&self, u: UserId, t: QueueTarget, max: u64) -> Vec<(QueueTarget, u64)>;
    fn release_queues(&self, u: UserId, ts: &[QueueTarget]) -> ();
    fn holds_place(&self, t: QueueTarget, u: UserId) -> bool;
    fn try_lock_admission(&self, t: QueueTarget, holder: &str, ttl_ms: u64) -> bool;
    fn admit(&self, t: QueueTarget, batch: u64, tick_ms: u64) -> AdmitOutcome;
    fn admit_by(&self, t: QueueTarget, batch: u64, tick_ms: u64, instance: &str) -> AdmitOutcome;
    fn evict(&self, t: QueueTarget, timeout_ms: u64, max: u64) -> Evicted;
    fn snapshot(&self, t: QueueTarget) -> TargetSnapshot;
});

delegate!(SaleOps {
    fn schedule_sale(&self, t: QueueTarget, schedule: SaleSchedule, seed: [u8; 32]) -> ScheduleOutcome;
    fn read_sale(&self, t: QueueTarget) -> Option<SaleView>;
    fn sale_targets(&self) -> Vec<QueueTarget>;
    fn control_sale(&self, t: QueueTarget, control: SaleControl) -> bool;
    fn pending_opening(&self, t: QueueTarget) -> Option<PendingOpening>;
    fn place_opening(&self, t: QueueTarget, places: &[(u64, UserId)], opens_at_ms: u64, last: bool) -> bool;
    fn clear_sale(&self, t: QueueTarget, force: bool) -> ClearOutcome;
    fn target_record(&self, t: QueueTarget) -> Option<TargetRecord>;
    fn record_purchase(&self, t: QueueTarget, tick: u64, answer: AnswerClass) -> ();
    fn record_refusals(&self, t: QueueTarget, refused: Refusals) -> ();
    fn sale_ledger(&self, t: QueueTarget) -> Vec<LedgerEntry>;
});

delegate!(FlagOps {
    fn read_stored_flag(&self) -> Option<FlagState>;
    fn change_flag(&self, change: FlagChange) -> u64;
    fn global_batch_size(&self) -> Option<u64>;
    fn set_batch_size(&self, t: Option<QueueTarget>, batch: Option<u64>) -> ();
    fn ack_flag(&self, ack: FlagAck, ttl_ms: u64) -> ();
    fn flag_acks(&self) -> Vec<FlagAck>;
    fn withdraw_flag_ack(&self, instance: &str) -> ();
});

delegate!(GateOps {
    fn claim_token(&self, t: QueueTarget, u: UserId, token: &str, ttl_s: u64, limits: PurchaseLimits) -> TokenClaim;
    fn release_token(&self, t: QueueTarget, u: UserId, token: &str, previous: Option<String>, limits: PurchaseLimits) -> ();
    fn confirm_token_used(&self, t: QueueTarget, u: UserId, through_queue: bool) -> ();
    fn token_used(&self, t: QueueTarget, u: UserId, token: &str) -> bool;
    fn spend_once(&self, t: QueueTarget, id: &str, until_ms: u64) -> bool;
    fn pace_purchase(&self, t: QueueTarget, budget: u64, tick_ms: u64, ahead: u64) -> Option<PaceSlot>;
});

delegate!(OutflowOps {
    fn observe_purchase(&self, t: QueueTarget, interval: u64, buyer: &UserId, seen: BuyerObservation, keep_s: u64) -> ();
    fn claim_outflow(&self, t: QueueTarget, interval: u64) -> OutflowClaim;
    fn set_outflow(&self, t: QueueTarget, state: &OutflowState, change: Option<BatchChange>) -> ();
    fn active_buyers(&self, t: QueueTarget) -> u64;
    fn expire_tokens(&self, t: QueueTarget) -> u64;
});

delegate!(TargetOps {
    fn register_active(&self, t: QueueTarget) -> ();
    fn deactivate(&self, t: QueueTarget) -> ();
    fn declared_targets(&self) -> Vec<QueueTarget>;
    fn declare_target(&self, t: QueueTarget, room: u64) -> DeclareOutcome;
    fn undeclare_target(&self, t: QueueTarget) -> bool;
    fn publish_capacity(&self, t: QueueTarget) -> ();
    fn active_targets(&self) -> Vec<QueueTarget>;
    fn forget_if_expired(&self, t: QueueTarget) -> bool;
    fn ping(&self) -> ();
});

delegate!(FleetOps {
    fn report_instance(&self, r: &InstanceReport, ttl_ms: u64) -> ();
    fn fleet(&self) -> Vec<InstanceReport>;
    fn withdraw_instance(&self, instance: &str) -> ();
});
delegate!(EventOps {
    fn read_events(&self, log: EventLog, after: EventId, count: usize) -> Vec<Event>;
    fn append_instance_event(&self, at_ms: u64, kind: &EventKind) -> ();
    fn register_event_logs(&self, targets: &[QueueTarget]) -> ();
    fn event_log_targets(&self) -> Vec<QueueTarget>;
    fn lease_events(&self, name: &str, holder: &str, ttl_ms: u64) -> bool;
    fn event_cursor(&self, subscriber: &str, log: EventLog) -> Option<EventId>;
    fn save_event_cursor(&self, subscriber: &str, log: EventLog, id: EventId) -> ();
});
