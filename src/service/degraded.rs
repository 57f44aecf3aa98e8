//! Fail-open bookkeeping: counts and logs store failures, and keeps the request path off an
//! unreachable store for a moment.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::now_epoch_ms;
use crate::domain::QueueTarget;
use crate::store::{StoreError, StoreErrorKind};

/// At most one log line per this interval for Redis failures on the request path.
const DEGRADED_LOG_EVERY: Duration = Duration::from_secs(10);

/// After a store failure, requests skip the store for this long and fail open at once,
/// instead of each one paying for a reconnection attempt; the flag refresher probes Redis
/// meanwhile and closes the window as soon as it answers.
const SKIP_STORE_AFTER_FAILURE_MS: u64 = 1000;

/// Counts Redis failures, logs them at most once per interval (per kind), and remembers until
/// when the request path should not try Redis.
///
/// Only a store that cannot serve anyone ([`StoreErrorKind::Unavailable`]) opens that window:
/// a failure confined to one call (a corrupt key of one target, a script error) fails open
/// that request only, and the next request, of any target, asks Redis again.
pub(super) struct Degraded {
    /// Per kind: last log line, failures since.
    logs: [(Mutex<Option<Instant>>, AtomicU64); 2],
    /// Epoch ms before which enter/poll/gate do not call the store (0 = call it).
    skip_until_ms: AtomicU64,
    /// Epoch ms of the last answer of the store (0 = none yet).
    answered_ms: AtomicU64,
}

impl Degraded {
    pub(super) fn new() -> Self {
        crate::metrics::register_store_errors(&StoreErrorKind::ALL.map(StoreErrorKind::label));
        Self {
            logs: std::array::from_fn(|_| (Mutex::new(None), AtomicU64::new(0))),
            skip_until_ms: AtomicU64::new(0),
            answered_ms: AtomicU64::new(0),
        }
    }

    pub(super) fn skipping(&self) -> bool {
        let until = self.skip_until_ms.load(Ordering::Relaxed);
        until != 0 && now_epoch_ms() < until
    }

    /// The store answered (the flag refresher's probe): requests use it again at once.
    pub(super) fn store_answers(&self) {
        self.skip_until_ms.store(0, Ordering::Relaxed);
        self.answered();
    }

    /// A store call of this instance got its answer.
    pub(super) fn answered(&self) {
        self.answered_ms.store(now_epoch_ms(), Ordering::Relaxed);
    }

    /// Whether the store answered a call of this instance within `window`: it is serving,
    /// and a call still waiting waits behind the others, not on a dead or stalled store.
    pub(super) fn answering_within(&self, window: Duration) -> bool {
        let at = self.answered_ms.load(Ordering::Relaxed);
        at != 0 && now_epoch_ms().saturating_sub(at) < window.as_millis() as u64
    }

    /// A request that failed open without calling the store.
    pub(super) fn record_skipped(&self) {
        crate::metrics::redis_degraded();
    }

    pub(super) fn record(&self, what: &str, target: QueueTarget, err: &StoreError) {
        let kind = err.kind();
        if kind == StoreErrorKind::Unavailable {
            self.skip_until_ms.store(now_epoch_ms() + SKIP_STORE_AFTER_FAILURE_MS, Ordering::Relaxed);
        }
        crate::metrics::redis_degraded();
        crate::metrics::store_error(kind.label());
        let (last_log, since_log) = &self.logs[kind as usize];
        let n = since_log.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = last_log.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_none_or(|t| t.elapsed() >= DEGRADED_LOG_EVERY) {
            *last = Some(Instant::now());
            since_log.store(0, Ordering::Relaxed);
            match kind {
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
}
