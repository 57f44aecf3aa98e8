//! The one integration-test binary. Every test starts its own `redis-server`.

mod bounds;
mod browser;
mod cli;
mod cluster;
mod conformance;
mod eviction;
mod failover;
mod fault_isolation;
mod flag;
pub mod gate;
mod gate_paths;
mod loadgen;
mod one_time_use;
mod openapi;
mod pacing;
mod processes;
mod pump;
mod queue_api;
mod readme;
mod sale;
mod scripts;
mod secrets;
mod serve_limits;
mod stall;
mod stats;
mod support;
mod token_format;
