//! The Redis store: the key contract (README, Redis) and one Lua script per atomic operation.
//!
//! Every key of a target carries the hash tag `{TYPE:id}`, so each script touches one slot.
//! `queue:active`, the flag and the global batch size are outside any target's slot and are
//! never touched by a target's script.
//!
//! One server or a Redis Cluster: [`RedisStore`] talks through [`Conn`], which is either a
//! `ConnectionManager` or a lazily opened cluster connection, so the scripts and the key
//! contract are the same code in both modes. No command here may need more than one slot, and
//! none may depend on seeing the whole keyspace (no KEYS, no SCAN).
//!
//! Layout, by concern: this file holds [`RedisStore`] (connecting, the liveness probe) and its
//! `QueueStore` impl, one-line delegations to the inherent methods in `queue.rs` (enter, poll,
//! admit, evict, targets, snapshot), `sale.rs` (the sale and its opening, ledger, record),
//! `flag.rs` (the flag and its acknowledgements), `gate.rs` (one-time tokens, pacing) and
//! `outflow.rs` (the adaptive outflow). Beside them: `keys.rs` the key names, `scripts.rs` the
//! scripts and their invocation, `codec.rs` the stored forms of ledger rows and hashes,
//! `conn.rs` the connection (one server or cluster), `shared_calls.rs` the shared enter/poll
//! script calls and their per-user answers, `fence.rs` the counters seen against lost writes,
//! `view.rs` an instance's copy of a target, `pulse.rs` the liveness probe.

mod codec;
mod conn;
mod fence;
mod flag;
mod gate;
pub mod keys;
mod outflow;
mod pulse;
mod queue;
mod sale;
mod scripts;
mod shared_calls;
mod view;

pub use self::gate::PACE_GUARD_MS;
pub use self::view::{TargetView, ViewSync};

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;

use self::conn::{Conn, LazyCluster};
use self::fence::Fences;
use self::pulse::Pulse;
use self::shared_calls::{Job, Op};
use super::coalesce::Coalescer;
use super::{
    AdmitOutcome, BUSY_WAIT_MAX, BatchChange, Candidate, ClearOutcome, DeclareOutcome, EnterOutcome, FlagAck,
    OutflowClaim, OutflowState, PaceSlot, PendingOpening, QueueStore, SaleView, ScheduleOutcome, StatusOutcome,
    StoreError, StoreLimits, TargetSnapshot, TokenClaim,
};
use crate::domain::{
    AnswerClass, FlagChange, FlagState, LedgerEntry, QueueTarget, SaleControl, SaleSchedule, TargetRecord, UserId,
};

/// Production store on one Redis server or a Redis Cluster.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    limits: StoreLimits,
    /// Enters and polls go out coalesced per target (see [`Coalescer`]); started at first use,
    /// on the runtime of the caller.
    lanes: Arc<OnceLock<Coalescer<(Op, QueueTarget), Job>>>,
    /// Whether Redis answers and what time it is there, from a thread of its own.
    pulse: Arc<Pulse>,
    /// What this instance has seen of each target's counters, sent with the scripts so that a
    /// failover that lost writes never takes them back (`fence.rs`).
    fences: Arc<Fences>,
}

impl RedisStore {
    /// Connects lazily: `vq serve` starts (and fails open) even while Redis is down, and the
    /// manager reconnects by itself. `timeout` bounds connecting; a command's answer may take
    /// up to [`BUSY_WAIT_MAX`] (the request path decides when to stop waiting:
    /// `QueueService::bounded`).
    pub fn connect(url: &str, limits: StoreLimits, timeout: Duration) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout.max(BUSY_WAIT_MAX)))
            .set_connection_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        let pulse = Arc::new(Pulse::start(&[url.to_owned()], false)?);
        let fences = Arc::new(Fences::new(limits.key_ttl_s));
        Ok(Self { conn: Conn::Single(conn), limits, lanes: Arc::default(), pulse, fences })
    }

    /// Redis Cluster mode: `nodes` are some of the cluster's nodes (`redis://host:port`), the
    /// rest is discovered. Connects lazily too, at the first command, and again after a failed
    /// attempt (at most every `conn::CLUSTER_RETRY_AFTER`, so a dead cluster causes no storm).
    pub fn connect_cluster(nodes: &[String], limits: StoreLimits, timeout: Duration) -> Result<Self, StoreError> {
        let client = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(timeout)
            .response_timeout(timeout.max(BUSY_WAIT_MAX))
            // Redirections (MOVED/ASK after a resharding) need a retry or two within the bound.
            .overall_response_timeout(Some(timeout.max(BUSY_WAIT_MAX) * 2))
            .retries(2)
            .build()?;
        let lazy = LazyCluster { client, conn: tokio::sync::OnceCell::new(), failed_at: Mutex::new(None), timeout };
        let pulse = Arc::new(Pulse::start(nodes, true)?);
        let fences = Arc::new(Fences::new(limits.key_ttl_s));
        Ok(Self { conn: Conn::Cluster(Arc::new(lazy)), limits, lanes: Arc::default(), pulse, fences })
    }

    /// Whether the Redis node holding `target`'s keys (any node, without a target) failed its
    /// last liveness probe: down, refusing or stalled (see `pulse.rs`).
    pub fn silent(&self, target: Option<QueueTarget>) -> bool {
        self.pulse.silent(target)
    }

    /// Redis' clock minus this host's, in ms, once known.
    pub fn clock_offset_ms(&self) -> Option<i64> {
        self.pulse.clock_offset_ms()
    }

    fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// Redis' own `used_memory` (INFO memory), for the loadgen's bytes-per-waiting-user figure.
    pub async fn used_memory_bytes(&self) -> Result<u64, StoreError> {
        let info: String = redis::cmd("INFO").arg("memory").query_async(&mut self.conn()).await?;
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| StoreError::Reply { what: "INFO memory", detail: "no used_memory line".into() })
    }
}

impl QueueStore for RedisStore {
    async fn enter(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> Result<EnterOutcome, StoreError> {
        RedisStore::enter(self, target, user, candidate).await
    }

    async fn status(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> Result<StatusOutcome, StoreError> {
        RedisStore::status(self, target, user, candidate).await
    }

    async fn leave(&self, target: QueueTarget, user: UserId) -> Result<bool, StoreError> {
        RedisStore::leave(self, target, user).await
    }

    async fn observe_purchase(
        &self,
        target: QueueTarget,
        interval: u64,
        bucket: usize,
        error: bool,
        backoff: bool,
    ) -> Result<(), StoreError> {
        RedisStore::observe_purchase(self, target, interval, bucket, error, backoff).await
    }

    async fn claim_outflow(&self, target: QueueTarget, interval: u64) -> Result<OutflowClaim, StoreError> {
        RedisStore::claim_outflow(self, target, interval).await
    }

    async fn set_outflow(
        &self,
        target: QueueTarget,
        state: &OutflowState,
        change: Option<BatchChange>,
    ) -> Result<(), StoreError> {
        RedisStore::set_outflow(self, target, state, change).await
    }

    async fn hold_queue(
        &self,
        user: UserId,
        target: QueueTarget,
        max: u64,
    ) -> Result<Vec<(QueueTarget, u64)>, StoreError> {
        RedisStore::hold_queue(self, user, target, max).await
    }

    async fn release_queues(&self, user: UserId, targets: &[QueueTarget]) -> Result<(), StoreError> {
        RedisStore::release_queues(self, user, targets).await
    }

    async fn holds_place(&self, target: QueueTarget, user: UserId) -> Result<bool, StoreError> {
        RedisStore::holds_place(self, target, user).await
    }

    async fn try_lock_admission(&self, target: QueueTarget, holder: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        RedisStore::try_lock_admission(self, target, holder, ttl_ms).await
    }

    async fn admit(&self, target: QueueTarget, default_batch: u64, tick_ms: u64) -> Result<AdmitOutcome, StoreError> {
        RedisStore::admit(self, target, default_batch, tick_ms).await
    }

    async fn admit_by(
        &self,
        target: QueueTarget,
        default_batch: u64,
        tick_ms: u64,
        instance: &str,
    ) -> Result<AdmitOutcome, StoreError> {
        RedisStore::admit_by(self, target, default_batch, tick_ms, instance).await
    }

    async fn evict(&self, target: QueueTarget, timeout_ms: u64, max: u64) -> Result<u64, StoreError> {
        RedisStore::evict(self, target, timeout_ms, max).await
    }

    async fn register_active(&self, target: QueueTarget) -> Result<(), StoreError> {
        RedisStore::register_active(self, target).await
    }

    async fn publish_capacity(&self, target: QueueTarget) -> Result<(), StoreError> {
        RedisStore::publish_capacity(self, target).await
    }

    async fn deactivate(&self, target: QueueTarget) -> Result<(), StoreError> {
        RedisStore::deactivate(self, target).await
    }

    async fn declared_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        RedisStore::declared_targets(self).await
    }

    async fn declare_target(&self, target: QueueTarget, room: u64) -> Result<DeclareOutcome, StoreError> {
        RedisStore::declare_target(self, target, room).await
    }

    async fn undeclare_target(&self, target: QueueTarget) -> Result<bool, StoreError> {
        RedisStore::undeclare_target(self, target).await
    }

    async fn active_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        RedisStore::active_targets(self).await
    }

    async fn forget_if_expired(&self, target: QueueTarget) -> Result<bool, StoreError> {
        RedisStore::forget_if_expired(self, target).await
    }

    async fn read_stored_flag(&self) -> Result<Option<FlagState>, StoreError> {
        RedisStore::read_stored_flag(self).await
    }

    async fn write_flag(&self, set: Vec<(String, String)>, delete: Vec<String>) -> Result<u64, StoreError> {
        RedisStore::write_flag(self, set, delete).await
    }

    async fn change_flag(&self, change: FlagChange) -> Result<u64, StoreError> {
        RedisStore::change_flag(self, change).await
    }

    async fn global_batch_size(&self) -> Result<Option<u64>, StoreError> {
        RedisStore::global_batch_size(self).await
    }

    async fn set_batch_size(&self, target: Option<QueueTarget>, batch: Option<u64>) -> Result<(), StoreError> {
        RedisStore::set_batch_size(self, target, batch).await
    }

    async fn snapshot(&self, target: QueueTarget) -> Result<TargetSnapshot, StoreError> {
        RedisStore::snapshot(self, target).await
    }

    async fn claim_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        ttl_s: u64,
    ) -> Result<TokenClaim, StoreError> {
        RedisStore::claim_token(self, target, user, token, ttl_s).await
    }

    async fn release_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        previous: Option<String>,
    ) -> Result<(), StoreError> {
        RedisStore::release_token(self, target, user, token, previous).await
    }

    async fn confirm_token_used(
        &self,
        target: QueueTarget,
        user: UserId,
        through_queue: bool,
    ) -> Result<(), StoreError> {
        RedisStore::confirm_token_used(self, target, user, through_queue).await
    }

    async fn active_buyers(&self, target: QueueTarget) -> Result<u64, StoreError> {
        RedisStore::active_buyers(self, target).await
    }

    async fn expire_tokens(&self, target: QueueTarget) -> Result<u64, StoreError> {
        RedisStore::expire_tokens(self, target).await
    }

    async fn spend_once(&self, target: QueueTarget, id: &str, until_ms: u64) -> Result<bool, StoreError> {
        RedisStore::spend_once(self, target, id, until_ms).await
    }

    async fn token_used(&self, target: QueueTarget, user: UserId, token: &str) -> Result<bool, StoreError> {
        RedisStore::token_used(self, target, user, token).await
    }

    async fn pace_purchase(
        &self,
        target: QueueTarget,
        default_budget: u64,
        tick_ms: u64,
        ahead: u64,
    ) -> Result<Option<PaceSlot>, StoreError> {
        RedisStore::pace_purchase(self, target, default_budget, tick_ms, ahead).await
    }

    async fn ack_flag(&self, ack: FlagAck, ttl_ms: u64) -> Result<(), StoreError> {
        RedisStore::ack_flag(self, ack, ttl_ms).await
    }

    async fn flag_acks(&self) -> Result<Vec<FlagAck>, StoreError> {
        RedisStore::flag_acks(self).await
    }

    async fn withdraw_flag_ack(&self, instance: &str) -> Result<(), StoreError> {
        RedisStore::withdraw_flag_ack(self, instance).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let _: String = redis::cmd("PING").query_async(&mut self.conn()).await?;
        Ok(())
    }

    async fn schedule_sale(
        &self,
        target: QueueTarget,
        schedule: SaleSchedule,
        seed: [u8; 32],
    ) -> Result<ScheduleOutcome, StoreError> {
        RedisStore::schedule_sale(self, target, schedule, seed).await
    }

    async fn read_sale(&self, target: QueueTarget) -> Result<Option<SaleView>, StoreError> {
        RedisStore::read_sale(self, target).await
    }

    async fn control_sale(&self, target: QueueTarget, control: SaleControl) -> Result<bool, StoreError> {
        RedisStore::control_sale(self, target, control).await
    }

    async fn clear_sale(&self, target: QueueTarget, force: bool) -> Result<ClearOutcome, StoreError> {
        RedisStore::clear_sale(self, target, force).await
    }

    async fn target_record(&self, target: QueueTarget) -> Result<Option<TargetRecord>, StoreError> {
        RedisStore::target_record(self, target).await
    }

    async fn record_purchase(&self, target: QueueTarget, tick: u64, answer: AnswerClass) -> Result<(), StoreError> {
        RedisStore::record_purchase(self, target, tick, answer).await
    }

    async fn sale_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        RedisStore::sale_targets(self).await
    }

    async fn pending_opening(&self, target: QueueTarget) -> Result<Option<PendingOpening>, StoreError> {
        RedisStore::pending_opening(self, target).await
    }

    async fn place_opening(
        &self,
        target: QueueTarget,
        places: &[(u64, UserId)],
        opens_at_ms: u64,
        last: bool,
    ) -> Result<bool, StoreError> {
        RedisStore::place_opening(self, target, places, opens_at_ms, last).await
    }

    async fn sale_ledger(&self, target: QueueTarget) -> Result<Vec<LedgerEntry>, StoreError> {
        RedisStore::sale_ledger(self, target).await
    }
}
