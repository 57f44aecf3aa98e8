//! The one integration-test binary. Every test starts its own `redis-server`.

mod cli;
mod cluster;
mod conformance;
mod failover;
pub mod gate;
mod loadgen;
mod processes;
mod pump;
mod queue_api;
mod readme;
mod scripts;
mod secrets;
mod serve_limits;
mod stats;
mod support;
mod token_format;
