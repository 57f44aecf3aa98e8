//! Fail-open and overload bookkeeping: counts and logs store failures and shed requests, at
//! most one line per interval and kind.
//!
//! Whether the request path skips Redis is not decided here: the store's liveness probe
//! (`AnyStore::silent`) says whether Redis is down, from a thread that a busy runtime cannot
//! hold back.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::domain::QueueTarget;
use crate::store::{StoreError, StoreErrorKind};

/// At most one log line per this interval for Redis failures on the request path.
const DEGRADED_LOG_EVERY: Duration = Duration::from_secs(10);

/// Counts Redis failures and requests shed for overload, and logs them at most once per
/// interval (per kind).
///
/// A failure confined to one call (a corrupt key of one target, a script error) fails open
/// that request only, and the next request, of any target, asks Redis again.
pub(super) struct Degraded {
    /// Per kind (unavailable, data, overloaded): last log line, events since.
    logs: [(Mutex<Option<Instant>>, AtomicU64); 3],
}

impl Degraded {
    pub(super) fn new() -> Self {
        crate::metrics::register_store_errors(&StoreErrorKind::ALL.map(StoreErrorKind::label));
        Self { logs: std::array::from_fn(|_| (Mutex::new(None), AtomicU64::new(0))) }
    }

    /// A request that failed open without calling the store (the probe finds Redis down).
    pub(super) fn record_skipped(&self) {
        crate::metrics::redis_degraded();
    }

    pub(super) fn record(&self, what: &str, target: QueueTarget, err: &StoreError) {
        let slot = if matches!(err, StoreError::Busy) {
            crate::metrics::overloaded();
            2
        } else {
            let kind = err.kind();
            crate::metrics::redis_degraded();
            crate::metrics::store_error(kind.label());
            kind as usize
        };
        let (last_log, since_log) = &self.logs[slot];
        let n = since_log.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = last_log.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < DEGRADED_LOG_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        since_log.store(0, Ordering::Relaxed);
        if matches!(err, StoreError::Busy) {
            tracing::warn!(
                events_since_last_log = n,
                "instance overloaded on {what}: redis answers but this instance did not get through its work in time; \
                 shedding (503 OVERLOADED, places kept) — add CPU or instances"
            );
            return;
        }
        match err.kind() {
            StoreErrorKind::Unavailable => tracing::warn!(
                error = %err, failures_since_last_log = n,
                "redis unavailable on {what}: failing open (DIRECT_ADMITTED with stateless tokens)"
            ),
            StoreErrorKind::Data => tracing::error!(
                error = %err, target_queue = %target, failures_since_last_log = n,
                "redis failed on {what} for one target (corrupt key or script error): failing open this request only"
            ),
        }
    }
}
