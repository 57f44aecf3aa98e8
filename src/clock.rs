//! Time in epoch milliseconds: this host's wall clock, read in one place (decisions that must
//! agree across instances use the store's clock, `AnyStore::now_ms`), and the [`Clock`] the
//! embedded store reads (the pump's time is its store's), which tests replace with a
//! [`ManualClock`] they step.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch; 0 if the system clock is before it.
pub fn now_epoch_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Where "now" comes from.
pub trait Clock: Send + Sync + 'static {
    /// Now, in epoch ms.
    fn now_ms(&self) -> u64;
}

/// The system clock: what the binary runs on.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        now_epoch_ms()
    }
}

/// A clock that moves only when told: tests step time instead of sleeping. Clones share the
/// same time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `start_ms`.
    pub fn starting_at(start_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(start_ms)))
    }

    /// A clock standing at the system's now.
    pub fn at_system_now() -> Self {
        Self::starting_at(now_epoch_ms())
    }

    /// Moves time forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A clock shared by whoever reads it.
pub type SharedClock = Arc<dyn Clock>;

/// The system clock, shared.
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}
