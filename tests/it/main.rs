//! The one integration-test binary. Every test starts its own `redis-server`.

mod cli;
mod cluster;
mod conformance;
mod eviction;
mod failover;
mod fault_isolation;
pub mod gate;
mod loadgen;
mod one_time_use;
mod pacing;
mod processes;
mod pump;
mod queue_api;
mod readme;
mod scripts;
mod stall;
mod stats;
mod support;
mod token_format;
