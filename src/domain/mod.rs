//! Pure domain: queue targets, users, positions and ETA, flag evaluation, the sale lifecycle.
//!
//! Nothing here does IO, reads a clock or touches tokio: every function takes the data and
//! the time it needs as arguments, so the admission arithmetic is unit-tested without Redis.

mod declared;
mod event;
mod flag;
mod fleet;
mod lane;
mod ledger;
mod opening;
mod outflow;
mod position;
mod purchase;
mod record;
mod sale;
mod shard;
mod stats;
mod target;
mod units;

pub use declared::{DeclaredTargets, TargetRange};
pub use event::{Event, EventId, EventIdError, EventKind, EventLog, parse_since};
pub use flag::{FlagChange, FlagState, TargetOverride};
pub use fleet::{Drift, InstanceReport, UNREPORTED, drift, fleet_declared, fleet_types, served_by};
pub use lane::{BadLaneName, LANE_NAME_RULE, Lane, LaneName, MAX_LANES, share_by_weight};
pub use ledger::{LedgerEntry, ledger_admitted};
pub use opening::{hex, opening_order, seed_commitment, unhex};
pub use outflow::{
    BuyerObservation, Controller, Decision, LATENCY_BUCKETS_MS, Observations, latency_bucket, smooth_no_show,
};
pub use position::{QueuePosition, batch_in_force, eta_seconds, poll_after_seconds};
pub use purchase::{PurchaseLimits, PurchaseRefusal, Refusals};
pub use record::{AnswerClass, Answers, LaneTotals, SaleReport, TargetRecord, TickRow};
pub use sale::{
    SaleControl, SalePhase, SaleRecord, SaleSchedule, SaleSource, SaleState, ScheduleError, format_instant,
    parse_instant,
};
pub use shard::{MAX_SHARDS, Shard, allot, shard_cap, shard_tag, slot_range, tag_slot, user_shard};
pub use stats::{
    WAIT_BUCKETS, WAIT_METRIC_EDGES_S, WaitHistogram, admission_rate_over, admission_rate_per_sec, wait_bucket,
};
pub use target::{MAX_USER_ID_LEN, ParseError, QueueTarget, QueueTargetType, USER_ID_RULE, UserId, is_user_id_byte};
pub use units::{Ms, Ticks, Users};
