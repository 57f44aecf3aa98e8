//! Fail-open and overload bookkeeping: counts and logs store failures and shed requests, at
//! most one line per interval and kind.
//!
//! Whether the request path skips Redis is not decided here: the store's liveness probe
//! (`AnyStore::silent`) says whether Redis is down, from a thread that a busy runtime cannot
//! hold back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::domain::QueueTarget;
use crate::log_every::LogEvery;
use crate::store::{StoreError, StoreErrorKind};

/// At most one log line per this interval for Redis failures on the request path.
const DEGRADED_LOG_EVERY: Duration = Duration::from_secs(10);
/// The log slot of [`Degraded::missed`], after the [`Failure`]s'.
const MISSED_LOG: usize = 5;

/// Counts Redis failures and requests shed for overload, and logs them at most once per
/// interval (per kind).
///
/// A failure confined to one call (a corrupt key of one target, a script error) fails open
/// that request only, and the next request, of any target, asks Redis again. Two failures
/// fail nothing open, and say so: a write Redis refused for lack of memory, and a write its
/// replicas did not confirm in time (`redis.wait_replicas`).
pub(super) struct Degraded {
    /// Per [`Failure`], then one for [`Degraded::missed`].
    logs: [LogEvery; 6],
    /// Requests answered without the store since start, per `metrics::DEGRADED_ANSWERS`
    /// (for the `store.degraded` events, `crate::events`).
    answered: [AtomicU64; 3],
}

/// What a store failure was, for its log line and its count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Unavailable = 0,
    Data = 1,
    Overloaded = 2,
    OutOfMemory = 3,
    NotReplicated = 4,
}

impl Failure {
    fn of(err: &StoreError) -> Self {
        match err {
            StoreError::Busy => Failure::Overloaded,
            StoreError::NotReplicated { .. } => Failure::NotReplicated,
            e if e.is_out_of_memory() => Failure::OutOfMemory,
            e => match e.kind() {
                StoreErrorKind::Unavailable => Failure::Unavailable,
                StoreErrorKind::Data => Failure::Data,
            },
        }
    }

    /// The `answer` label of `virtual_queue_redis_degraded_total` (see `metrics::DEGRADED_ANSWERS`).
    fn answer(self) -> &'static str {
        match self {
            Failure::OutOfMemory => "out_of_memory",
            Failure::NotReplicated => "not_replicated",
            Failure::Unavailable | Failure::Data | Failure::Overloaded => "failed_open",
        }
    }
}

impl Degraded {
    pub(super) fn new() -> Self {
        crate::metrics::register_store_errors(&StoreErrorKind::ALL.map(StoreErrorKind::label));
        Self {
            logs: std::array::from_fn(|_| LogEvery::new(DEGRADED_LOG_EVERY)),
            answered: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Requests answered without the store since start, by answer (`failed_open`,
    /// `out_of_memory`, `not_replicated`).
    pub(super) fn answered(&self) -> [(&'static str, u64); 3] {
        std::array::from_fn(|i| (crate::metrics::DEGRADED_ANSWERS[i], self.answered[i].load(Ordering::Relaxed)))
    }

    fn count_answer(&self, answer: &'static str) {
        crate::metrics::redis_degraded(answer);
        if let Some(i) = crate::metrics::DEGRADED_ANSWERS.iter().position(|a| *a == answer) {
            self.answered[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request that failed open without calling the store (the probe finds Redis down).
    pub(super) fn record_skipped(&self) {
        self.count_answer(Failure::Unavailable.answer());
    }

    /// A step done on the side of a request failed (a heartbeat sync, a leave, a target's
    /// registration, a count of queues dropped, a claim settled after the purchase API
    /// answered): counted as a store error and logged, but not as a request answered without
    /// the store (`virtual_queue_redis_degraded_total`), since none was.
    pub(super) fn missed(&self, what: &str, target: QueueTarget, err: &StoreError) {
        if !matches!(err, StoreError::Busy) {
            crate::metrics::store_error(err.kind().label());
        }
        let Some(n) = self.logs[MISSED_LOG].due() else { return };
        tracing::warn!(
            error = %err, target_queue = %target, failures_since_last_log = n,
            "redis failed on {what}, a step on the side of a request: skipped (tried again later or \
             left to expiry); no request was answered without the queue for it"
        );
    }

    pub(super) fn record(&self, what: &str, target: QueueTarget, err: &StoreError) {
        let failure = Failure::of(err);
        if failure == Failure::Overloaded {
            crate::metrics::overloaded();
        } else {
            self.count_answer(failure.answer());
            crate::metrics::store_error(err.kind().label());
        }
        let Some(n) = self.logs[failure as usize].due() else { return };
        match failure {
            Failure::Overloaded => tracing::warn!(
                events_since_last_log = n,
                "instance overloaded on {what}: redis answers but this instance did not get through its work in time; \
                 shedding (503 OVERLOADED, places kept) — add CPU or instances"
            ),
            Failure::OutOfMemory => tracing::error!(
                error = %err, target_queue = %target, failures_since_last_log = n,
                "redis refused a write on {what} for lack of memory (maxmemory reached): refused, nobody let in \
                 — enters answer 429 QUEUE_FULL, polls 503 OVERLOADED (places kept), a purchase whose use cannot \
                 be recorded 503; free memory or raise maxmemory"
            ),
            Failure::NotReplicated => tracing::warn!(
                error = %err, target_queue = %target, failures_since_last_log = n,
                "redis replicas did not confirm a write on {what} within redis.wait_timeout_ms: held, nobody let \
                 in — 503 QUEUE_UNAVAILABLE, the token not handed out or the purchase not forwarded, places kept; \
                 a replica lags or is gone (redis.wait_replicas)"
            ),
            Failure::Unavailable => tracing::warn!(
                error = %err, failures_since_last_log = n,
                "redis unavailable on {what}: failing open (DIRECT_ADMITTED with stateless tokens)"
            ),
            Failure::Data => tracing::error!(
                error = %err, target_queue = %target, failures_since_last_log = n,
                "redis failed on {what} for one target (corrupt key or script error): failing open this request only"
            ),
        }
    }
}
