//! The one integration-test binary. Every test starts its own `redis-server`.

mod conformance;
mod loadgen;
mod processes;
mod pump;
mod queue_api;
mod support;
mod token_format;
