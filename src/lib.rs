//! vq: a virtual waiting room for flash sales.
//!
//! Buyers enter a per-target queue in Redis with a fixed sequence number ([`store`]); a
//! cluster-wide [`pump`] admits one batch per tick no matter how many instances run; admitted
//! buyers get an HMAC-signed entry [`token`]; the [`http`] layer serves the queue API and the
//! gate. [`domain`] and [`token`] are pure; [`cli`] is the only place that prints.

pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod domain;
pub mod events;
pub mod gate;
pub mod http;
pub mod lane;
pub mod loadgen;
pub mod log_every;
pub mod metrics;
pub mod pow;
pub mod pump;
pub mod release;
pub mod service;
pub mod store;
pub mod token;
pub mod visitor;
