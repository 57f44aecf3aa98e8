//! Where queue state lives, behind a contract in domain words, split by concern.
//!
//! The contract: [`QueueOps`] (a target's line: enter, poll, admit, evict), [`SaleOps`] (a
//! sale, its record and ledger), [`FlagOps`] (the flag, batch sizes, acknowledgements),
//! [`GateOps`] (one-time use and pacing of purchases), [`OutflowOps`] (the adaptive outflow),
//! [`TargetOps`] (which targets exist), [`FleetOps`] (the serving instances' reports) and
//! [`EventOps`] (the event logs); [`QueueStore`] is all of them, for callers that
//! need every part (`use crate::store::prelude::*` brings the methods into scope). What they
//! answer is in `outcome.rs`; how they fail, in `error.rs`.
//!
//! [`RedisStore`] is the one store: every multi-key change is one Lua script from `lua/`, and
//! the key layout is a contract (README, Redis). It runs on Redis (one server or a cluster) or,
//! for trial runs of a single instance, on the embedded server in this process
//! ([`RedisStore::embedded`], `embedded/`: a keyspace with Redis' semantics and a Lua host that
//! runs the same scripts), so each queue rule has one home, `lua/`. The conformance suite
//! (`tests/it/conformance.rs`) runs on both. Nothing outside this module sees a `redis::Value`;
//! [`AnyStore`] is the one chosen by configuration.

mod coalesce;
mod durable;
pub mod embedded;
mod error;
mod events;
mod flag;
mod fleet;
mod gate;
mod outcome;
mod outflow;
mod queue;
mod redis;
mod rules;
mod sale;
mod targets;

/// The store chosen by configuration, one value the service and the pump hold: Redis (one
/// server or a cluster) or the embedded server, both behind the same [`RedisStore`] (its
/// constructor decides). One implementation of each operation, so each signature is written
/// twice: in its trait and in `redis/`.
pub type AnyStore = RedisStore;
pub use self::durable::{DurableWrites, ReplicaWait};
pub use self::error::{BUSY_WAIT_MAX, BackendError, StoreError, StoreErrorKind};
pub use self::events::EventOps;
pub use self::flag::FlagOps;
pub use self::fleet::FleetOps;
pub use self::gate::{GateOps, RecordedPurchase};
pub use self::outcome::*;
pub use self::outflow::OutflowOps;
pub use self::queue::{Candidate, QueueOps};
pub use self::redis::{JoinOutcome, LANED, LaneFigures, RedisStore, SALE_FIELDS, TargetView, ViewSync, keys};
pub use self::redis::{layout, slices};
pub use self::rules::{FLAG_ACK_KEEP_MS, FLEET_KEEP_MS, LEDGER_MAX_ROWS, PACE_GUARD_MS};
pub use self::sale::SaleOps;
pub use self::targets::TargetOps;

use crate::domain::QueueTargetType;

/// Every part of the store contract: the one bound for callers that use them all.
pub trait QueueStore: QueueOps + SaleOps + FlagOps + GateOps + OutflowOps + TargetOps + FleetOps + EventOps {}

impl<S: QueueOps + SaleOps + FlagOps + GateOps + OutflowOps + TargetOps + FleetOps + EventOps> QueueStore for S {}

/// The contract's traits, to call store operations on a concrete store.
pub mod prelude {
    pub use super::{EventOps, FlagOps, FleetOps, GateOps, OutflowOps, QueueOps, QueueStore, SaleOps, TargetOps};
}

/// Records the waits (ms) of the users one admission let in, in this instance's wait
/// histogram: the one place every store reports them (the instance that admitted does).
pub(crate) fn observe_waits(waits: &[u64]) {
    for w in waits {
        crate::metrics::wait_observed(*w);
    }
}

/// What the store needs to know of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLimits {
    /// Users waiting (not yet admitted) beyond which enter answers full.
    pub max_capacity: u64,
    /// The types configured with a capacity of their own (`targets.types.*.max_capacity`).
    pub type_capacity: Vec<(QueueTargetType, u64)>,
    /// The types whose targets are spread over more than one shard (`targets.types.*.shards`);
    /// the Redis store only (`store/redis/shards.rs`).
    pub type_shards: Vec<(QueueTargetType, u8)>,
    /// The types whose targets have lanes in configuration (`targets.types.*.lanes`); a
    /// target's lanes added at runtime are read from Redis (`store/redis/lanes.rs`).
    pub type_lanes: Vec<(QueueTargetType, Vec<crate::domain::Lane>)>,
    /// Sliding expiry of a target's keys.
    pub key_ttl_s: u64,
    /// Lifetime of the stored token key (= the token's own lifetime).
    pub token_ttl_s: u64,
    /// Expiry of a target's sale record after its last write (`queue.record_ttl_days`).
    pub record_ttl_s: u64,
    /// The tick, the width of the record's per-tick buckets (arrivals are counted by enter).
    pub tick_ms: u64,
    /// The replicas a token issued or a purchase claimed waits for (`redis/durable.rs`).
    pub durable: DurableWrites,
    /// The event logs' length and the admission milestones (`[events]`).
    pub events: EventLimits,
    /// Whether the queues each user holds are counted (`queue.max_queues_per_user` > 0).
    pub hold_queues: bool,
    /// Longest a coalesced call waits for more users (`redis.coalesce_wait_ms`,
    /// `store/coalesce.rs`).
    pub coalesce_wait: std::time::Duration,
}

/// What the scripts that append to a target's event log are told (`[events]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventLimits {
    /// Entries kept per log, about (`XADD MAXLEN ~`): `events.max_len`.
    pub max_len: u64,
    /// An event each time the users admitted in all pass a multiple of this; 0: none
    /// (`events.admitted_every`).
    pub admitted_every: u64,
}

impl Default for EventLimits {
    fn default() -> Self {
        Self { max_len: 10_000, admitted_every: 1000 }
    }
}

impl StoreLimits {
    /// The users who may wait per target of `kind`.
    pub fn capacity(&self, kind: QueueTargetType) -> u64 {
        self.type_capacity.iter().find(|(k, _)| *k == kind).map_or(self.max_capacity, |(_, c)| *c)
    }

    /// The lanes of `kind`'s targets in configuration.
    pub fn lanes(&self, kind: QueueTargetType) -> &[crate::domain::Lane] {
        self.type_lanes.iter().find(|(k, _)| *k == kind).map_or(&[], |(_, l)| l.as_slice())
    }

    /// The shards a target of `kind` is spread over: 1 unless configured.
    pub fn shards(&self, kind: QueueTargetType) -> u8 {
        self.type_shards.iter().find(|(k, _)| *k == kind).map_or(1, |(_, n)| *n)
    }
}
