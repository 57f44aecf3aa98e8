//! The one integration-test binary. Every test starts its own `redis-server`.

mod bounds;
mod cli;
mod cluster;
mod conformance;
mod failover;
mod flag;
pub mod gate;
mod gate_paths;
mod loadgen;
mod openapi;
mod processes;
mod pump;
mod queue_api;
mod readme;
mod scripts;
mod stats;
mod support;
mod token_format;
