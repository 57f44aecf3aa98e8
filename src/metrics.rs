//! Prometheus metrics: one small named function per thing counted, so callers
//! (service, pump, store, gate) never spell metric names or labels themselves.
//!
//! Two kinds of series, and how to add them up across instances:
//! - **events**, counted by the instance where they happen (`admitted_total`, `evicted_total`,
//!   `tokens_total`, `wait_seconds`, `bypass_attempts_total`, `redis_degraded_total`, HTTP
//!   durations): `sum` over instances is the cluster figure;
//! - **state** read from Redis at scrape time ([`set_queue_state`]: `length`, `capacity`,
//!   `target_admission_rate`, `sale_state`): every instance reports the same value; use
//!   `max by (target)`.
//!
//! Labels are bounded: a target (active targets only), a route *template* and a status code,
//! a token event. Never a user id, a raw path or a token. This module must not do IO.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};
use std::time::Duration;

use metrics::{Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use strum::VariantArray;

use crate::domain::SaleState;

mod targets;

use self::targets::render_targets;
pub use self::targets::{
    admitted, evicted, retain_targets, set_adaptive_batch_min, set_lane_lengths, set_queue_state, set_target_outcomes,
};

pub const QUEUE_LENGTH: &str = "virtual_queue_length";
pub const QUEUE_CAPACITY: &str = "virtual_queue_capacity";
pub const TARGET_ADMISSION_RATE: &str = "virtual_queue_target_admission_rate";
pub const ADMITTED_TOTAL: &str = "virtual_queue_admitted_total";
pub const EVICTED_TOTAL: &str = "virtual_queue_evicted_total";
pub const TOKENS_TOTAL: &str = "virtual_queue_tokens_total";
pub const POW_TOTAL: &str = "virtual_queue_pow_total";
pub const WAIT_SECONDS: &str = "virtual_queue_wait_seconds";
pub const BYPASS_ATTEMPTS_TOTAL: &str = "virtual_queue_bypass_attempts_total";
pub const REDIS_DEGRADED_TOTAL: &str = "virtual_queue_redis_degraded_total";
pub const HTTP_DURATION: &str = "virtual_queue_http_request_duration_seconds";
pub const FLAG_MISSING: &str = "virtual_queue_flag_missing";
pub const FLEET_DRIFT: &str = "virtual_queue_fleet_drift";
pub const POLLS_LOCAL_TOTAL: &str = "virtual_queue_polls_answered_locally_total";
pub const OVERLOADED_TOTAL: &str = "virtual_queue_overloaded_total";
pub const CLOCK_OFFSET: &str = "virtual_queue_clock_offset_seconds";
pub const FAILOVER_FENCED_TOTAL: &str = "virtual_queue_failover_fenced_total";
pub const SALE_STATE: &str = "virtual_queue_sale_state";
pub const BATCH_SIZE: &str = "virtual_queue_batch_size";
pub const ADAPTIVE_BATCH_MIN: &str = "virtual_queue_adaptive_batch_min";
pub const TARGET_TOKENS: &str = "virtual_queue_target_tokens";
pub const ADAPTIVE_P95: &str = "virtual_queue_adaptive_purchase_p95_seconds";
pub const ADAPTIVE_ERROR_RATIO: &str = "virtual_queue_adaptive_error_ratio";
pub const ADAPTIVE_NO_SHOW_RATIO: &str = "virtual_queue_adaptive_no_show_ratio";
pub const LANE_LENGTH: &str = "virtual_queue_lane_length";
pub const WEBHOOK_DELIVERIES_TOTAL: &str = "virtual_queue_webhook_deliveries_total";

/// The `state` label of [`SALE_STATE`]: the sale's state as `vq sale show` names it, `none`
/// for a target without a sale.
pub fn sale_state_label(state: Option<SaleState>) -> &'static str {
    state.map_or("none", SaleState::as_str)
}

/// Every `state` of [`SALE_STATE`], in the order `/metrics` lists them: no sale, then every
/// [`SaleState`].
pub fn sale_state_labels() -> impl Iterator<Item = Option<SaleState>> {
    std::iter::once(None).chain(SaleState::VARIANTS.iter().copied().map(Some))
}

/// Poll latency target is P95 ≤ 300 ms; most requests take well under a millisecond.
const HTTP_BUCKETS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.3, 1.0, 3.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the global recorder once per process (tests start many apps in one process) and
/// returns the handle that renders `/metrics`.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            // Waits run from seconds to an hour: the edges live beside the stored histogram's.
            let wait_edges = crate::domain::WAIT_METRIC_EDGES_S.map(|s| s as f64);
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(WAIT_SECONDS.into()), &wait_edges)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(HTTP_DURATION.into()), HTTP_BUCKETS))
                .expect("bucket lists are non-empty constants")
                .build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("another metrics recorder is installed: /metrics will be empty");
            }
            describe();
            register_at_zero();
            handle
        })
        .clone()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(QUEUE_CAPACITY, "queue.max_capacity: waiting users beyond which enter answers 429");
    describe_counter!(TOKENS_TOTAL, "Entry tokens by event: issued (through the queue), consumed, expired");
    describe_counter!(
        POW_TOTAL,
        "Proof of work at entry by outcome: challenged (a challenge handed out), solved (a solution let a user in), refused"
    );
    describe_histogram!(WAIT_SECONDS, metrics::Unit::Seconds, "Wait from entry to admission of admitted users");
    describe_counter!(BYPASS_ATTEMPTS_TOTAL, "Purchase requests refused by the gate (403 QUEUE_BYPASS_DENIED)");
    describe_counter!(
        REDIS_DEGRADED_TOTAL,
        "Requests whose Redis work failed, by what they were answered: failed_open (without the queue: Redis \
         down or a script failed), out_of_memory (a write refused for lack of memory: refused or held, nobody \
         let in), not_replicated (the replicas did not confirm a token or a purchase: held, 503)"
    );
    describe_counter!(
        POLLS_LOCAL_TOTAL,
        "Waiting users' polls answered from this instance's copy of the mark (queue.local_polls)"
    );
    describe_counter!(
        FAILOVER_FENCED_TOTAL,
        "Counters found in Redis below what this instance had seen (writes lost in a failover), raised back, by counter"
    );
    describe_histogram!(HTTP_DURATION, metrics::Unit::Seconds, "HTTP request duration by route template and status");
    describe_counter!(
        OVERLOADED_TOTAL,
        "Requests answered 503 OVERLOADED while Redis answered: shed at the door (reason in_flight; \
         forwarded for requests the gate forwards unchecked) or given up after waiting behind this instance's other work (reason slow)"
    );
    describe_gauge!(
        CLOCK_OFFSET,
        metrics::Unit::Seconds,
        "Redis' clock minus this instance's, as measured by its probe"
    );
    describe_counter!(
        WEBHOOK_DELIVERIES_TOTAL,
        "Event deliveries to the webhooks ([events]) by webhook and outcome: delivered (2xx), failed (an attempt \
         that got no 2xx in events.timeout_ms), retried (an attempt after a failed one)"
    );
    describe_gauge!(
        FLEET_DRIFT,
        "Settings on which the live vq instances sharing this Redis disagree (0: none; vq fleet names them)"
    );
    describe_gauge!(
        FLAG_MISSING,
        "1 while the flag hash is missing from Redis and this instance keeps its last known flag"
    );
}

/// Creates every series with known labels at 0, so `rate()` and the shipped alerts see them
/// from the first scrape, not from their first event. Per-target series start when the
/// target is first seen active ([`set_queue_state`]).
fn register_at_zero() {
    for event in TOKEN_EVENTS {
        counter!(TOKENS_TOTAL, "event" => event).absolute(0);
    }
    for outcome in ["challenged", "solved", "refused"] {
        counter!(POW_TOTAL, "outcome" => outcome).absolute(0);
    }
    counter!(BYPASS_ATTEMPTS_TOTAL).absolute(0);
    for answer in DEGRADED_ANSWERS {
        counter!(REDIS_DEGRADED_TOTAL, "answer" => answer).absolute(0);
    }
    counter!(POLLS_LOCAL_TOTAL).absolute(0);
    for reason in OVERLOAD_REASONS {
        counter!(OVERLOADED_TOTAL, "reason" => reason).absolute(0);
    }
    for what in FENCED_COUNTERS {
        counter!(FAILOVER_FENCED_TOTAL, "counter" => what).absolute(0);
    }
    // Histograms render once their handle exists, with zero counts: the waits are observed
    // only by the instance whose pump admitted, and a fleet-wide sum must not have gaps.
    gauge!(FLEET_DRIFT).set(0.0);
    let _ = histogram!(WAIT_SECONDS);
    // The scrape itself is the first request every instance answers; before it, its series
    // exists with zero counts.
    let _ = histogram!(HTTP_DURATION, "route" => "/metrics", "status" => "200");
}

/// The `counter` label values of [`FAILOVER_FENCED_TOTAL`].
const FENCED_COUNTERS: [&str; 3] = ["seq", "mark", "tick"];

/// A script found a target's `what` (seq, mark, tick) below this instance's fence and raised it:
/// Redis lost writes this instance had seen (store/redis/fence.rs).
pub fn failover_fenced(what: &'static str) {
    counter!(FAILOVER_FENCED_TOTAL, "counter" => what).increment(1);
}

/// The `reason` label values of [`OVERLOADED_TOTAL`].
const OVERLOAD_REASONS: [&str; 3] = ["in_flight", "slow", "forwarded"];

/// A request given up with 503 OVERLOADED after waiting behind this instance's other work.
pub fn overloaded() {
    counter!(OVERLOADED_TOTAL, "reason" => "slow").increment(1);
}

/// A request shed at the door: this instance had `http.max_in_flight` requests already (or
/// preempted by a lighter client's).
pub fn shed() {
    counter!(OVERLOADED_TOTAL, "reason" => "in_flight").increment(1);
}

/// A request to forward unchecked shed at the door: `http.max_forwarded_in_flight` taken.
pub fn shed_forwarded() {
    counter!(OVERLOADED_TOTAL, "reason" => "forwarded").increment(1);
}

/// Redis' clock minus this instance's, in ms.
pub fn set_clock_offset(ms: i64) {
    gauge!(CLOCK_OFFSET).set(ms as f64 / 1000.0);
}

/// The `event` label values of [`TOKENS_TOTAL`].
const TOKEN_EVENTS: [&str; 4] = ["issued", "consumed", "consumed_direct", "expired"];

/// Renders the Prometheus text of this process.
pub fn render() -> String {
    let mut out = install().render();
    render_targets(&mut out);
    out
}

/// Drains histogram samples into their buckets; call every few seconds so memory stays flat
/// between scrapes.
pub fn upkeep() {
    install().run_upkeep();
}

pub fn set_capacity(max_capacity: u64) {
    gauge!(QUEUE_CAPACITY).set(max_capacity as f64);
}

/// Set at every flag refresh (the first one before serving), so the series exists from start.
pub fn set_flag_missing(missing: bool) {
    install();
    gauge!(FLAG_MISSING).set(if missing { 1.0 } else { 0.0 });
}

/// How many settings the live instances disagree on, as this instance last read the fleet.
pub fn set_fleet_drift(settings: usize) {
    gauge!(FLEET_DRIFT).set(settings as f64);
}

/// One admitted user's wait, entry to admission.
pub fn wait_observed(wait_ms: u64) {
    histogram!(WAIT_SECONDS).record(wait_ms as f64 / 1000.0);
}

/// A token stored for a user admitted through the queue (not the stateless DIRECT_ADMITTED
/// ones, which are minted on every call while the queue is off).
pub fn token_issued() {
    counter!(TOKENS_TOTAL, "event" => "issued").increment(1);
}

/// The gate passed a purchase with this token and the downstream answered 2xx: `consumed`
/// for a token the queue issued, `consumed_direct` for a stateless one (minted while the queue
/// was off for the user or Redis was down), so issued and consumed compare like with like.
pub fn token_consumed(through_queue: bool) {
    let event = if through_queue { "consumed" } else { "consumed_direct" };
    counter!(TOKENS_TOTAL, "event" => event).increment(1);
}

/// The gate saw a token past its expiry.
pub fn token_expired() {
    counter!(TOKENS_TOTAL, "event" => "expired").increment(1);
}

/// The gate refused a purchase request (no, forged, expired, foreign or used token).
/// A proof-of-work step: `challenged`, `solved` or `refused`.
pub fn pow(outcome: &'static str) {
    counter!(POW_TOTAL, "outcome" => outcome).increment(1);
}

pub fn bypass_attempt() {
    counter!(BYPASS_ATTEMPTS_TOTAL).increment(1);
}

/// The `outcome` label values of [`WEBHOOK_DELIVERIES_TOTAL`].
pub const WEBHOOK_OUTCOMES: [&str; 3] = ["delivered", "failed", "retried"];

/// Creates [`WEBHOOK_DELIVERIES_TOTAL`] at 0 for every webhook and outcome.
pub fn register_webhooks(names: &[String]) {
    install();
    for name in names {
        for outcome in WEBHOOK_OUTCOMES {
            counter!(WEBHOOK_DELIVERIES_TOTAL, "webhook" => name.clone(), "outcome" => outcome).absolute(0);
        }
    }
}

/// One delivery attempt to webhook `name`, by outcome (one of [`WEBHOOK_OUTCOMES`]).
pub fn webhook_delivery(name: &str, outcome: &'static str) {
    counter!(WEBHOOK_DELIVERIES_TOTAL, "webhook" => name.to_owned(), "outcome" => outcome).increment(1);
}

/// The `answer` label values of [`REDIS_DEGRADED_TOTAL`].
pub const DEGRADED_ANSWERS: [&str; 3] = ["failed_open", "out_of_memory", "not_replicated"];

/// A request whose Redis work failed, by what it was answered (one of [`DEGRADED_ANSWERS`]).
pub fn redis_degraded(answer: &'static str) {
    counter!(REDIS_DEGRADED_TOTAL, "answer" => answer).increment(1);
}

/// A waiting user's poll answered without Redis (`service::local`).
pub fn poll_answered_locally() {
    counter!(POLLS_LOCAL_TOTAL).increment(1);
}

/// Histogram handles by status, then route template: after the first request of a kind, a
/// request costs a read lock and two lookups, no allocation.
type HttpHandles = HashMap<u16, HashMap<String, Histogram>>;
static HTTP: OnceLock<RwLock<HttpHandles>> = OnceLock::new();

/// One HTTP request. `route` is the matched route template (`/virtual-queues/{kind}/{id}/…`),
/// or `"unmatched"`: never the raw path.
pub fn http_request(route: &str, status: u16, took: Duration) {
    let map = HTTP.get_or_init(|| RwLock::new(HashMap::new()));
    let secs = took.as_secs_f64();
    {
        let read = map.read().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = read.get(&status).and_then(|m| m.get(route)) {
            h.record(secs);
            return;
        }
    }
    let h = histogram!(HTTP_DURATION, "route" => route.to_owned(), "status" => status.to_string());
    h.record(secs);
    map.write().unwrap_or_else(|e| e.into_inner()).entry(status).or_default().insert(route.to_owned(), h);
}

/// A store failure on the request path, by kind (`unavailable`: Redis refused, reset or
/// timed out the call; `data`: one call of one target failed). Either fails open that request,
/// except the count of a user's queues on a Redis Cluster node that is gone (the enter is then
/// given its place uncounted) and a step on the side of a request (`Degraded::missed`).
pub const STORE_ERRORS_TOTAL: &str = "virtual_queue_store_errors_total";

pub fn store_error(kind: &'static str) {
    counter!(STORE_ERRORS_TOTAL, "kind" => kind).increment(1);
}

/// Creates [`STORE_ERRORS_TOTAL`] at 0 for every kind, so alerts see it from the start.
pub fn register_store_errors(kinds: &[&'static str]) {
    // Called while the service is built, possibly before the server installed the recorder.
    install();
    metrics::describe_counter!(STORE_ERRORS_TOTAL, "Store failures on the request path, by kind (unavailable, data)");
    for kind in kinds {
        counter!(STORE_ERRORS_TOTAL, "kind" => *kind).increment(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::QueueTarget;

    #[test]
    fn rendered_names_match_the_spec_and_labels_stay_bounded() {
        install();
        let t: QueueTarget = "LIMITED_DROP:42".parse().expect("target");
        set_queue_state(t, 7, 100, 50.0, Some(SaleState::Paused));
        admitted(t, 3);
        wait_observed(1500);
        token_consumed(true);
        bypass_attempt();
        http_request("/virtual-queues/{kind}/{id}/entries", 200, Duration::from_micros(300));
        http_request("/virtual-queues/{kind}/{id}/entries", 200, Duration::from_micros(300));
        let text = render();
        assert!(text.contains("virtual_queue_length{target=\"LIMITED_DROP:42\"} 7"), "{text}");
        assert!(text.contains("virtual_queue_admitted_total{target=\"LIMITED_DROP:42\"} 3"), "{text}");
        assert!(text.contains("virtual_queue_sale_state{target=\"LIMITED_DROP:42\",state=\"paused\"} 1"), "{text}");
        assert!(text.contains("virtual_queue_sale_state{target=\"LIMITED_DROP:42\",state=\"open\"} 0"), "{text}");
        retain_targets(|t| t != "LIMITED_DROP:42".parse().expect("target"));
        assert!(!render().contains("LIMITED_DROP:42"), "a target's series go with it");
        assert!(text.contains("virtual_queue_tokens_total{event=\"consumed\"}"), "{text}");
        assert!(text.contains("virtual_queue_wait_seconds_bucket{le=\"2\"}"), "{text}");
        assert!(text.contains("virtual_queue_bypass_attempts_total"), "{text}");
        assert!(
            text.contains(
                "virtual_queue_http_request_duration_seconds_count{route=\"/virtual-queues/{kind}/{id}/entries\",status=\"200\"} 2"
            ),
            "{text}"
        );
    }
}
