//! The flag as this instance applies it, refreshed from the store, and the batch size in
//! force.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use super::QueueService;
use crate::config::Outflow;
use crate::domain::{FlagState, QueueTarget, QueueTargetType, UserId, batch_in_force};
use crate::store::StoreError;
use crate::store::prelude::*;

/// The flag as this instance applies it.
pub(super) struct FlagCache {
    state: RwLock<Arc<FlagState>>,
    /// A flag hash was read at least once: from then on a missing hash is a lost flag (Redis
    /// restarted empty, FLUSHALL, failover to an empty replica), not "off".
    seen: AtomicBool,
    /// The hash is missing now and `state` is the last one read.
    missing: AtomicBool,
}

impl FlagCache {
    pub(super) fn new() -> Self {
        Self {
            state: RwLock::new(Arc::new(FlagState::default())),
            seen: AtomicBool::new(false),
            missing: AtomicBool::new(false),
        }
    }
}

/// The flag version an instance applies after a refresh, for its acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedFlag {
    pub version: u64,
    /// The flag hash is missing from the store; the last known flag stays in force.
    pub kept_missing: bool,
    /// [`FlagState::summary`] of the flag in force.
    pub state: String,
}

impl QueueService {
    pub fn flag(&self) -> Arc<FlagState> {
        self.flag.state.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether the flag hash is missing from the store while this instance keeps the last
    /// flag it read (see [`QueueService::refresh_flag`]).
    pub fn flag_missing(&self) -> bool {
        self.flag.missing.load(Ordering::Relaxed)
    }

    /// Whether this user goes through the queue (and the gate) for this target.
    pub fn queue_applies(&self, target: QueueTarget, user: &UserId) -> bool {
        self.flag().applies(target, user)
    }

    /// Reads the flag and the runtime batch size from the store. On error the last values
    /// stay in force. A missing flag hash is "off" only until this instance has read one:
    /// after that it keeps the last flag read, says so (warning, `virtual_queue_flag_missing`,
    /// its acknowledgement, `/readyz`), and applies the next flag written, whatever its version.
    pub async fn refresh_flag(&self) -> Result<AppliedFlag, StoreError> {
        let stored = self.store.read_stored_flag().await?;
        let batch = self.store.global_batch_size().await?;
        self.global_batch.store(batch.unwrap_or(0), Ordering::Relaxed);
        let mut current = self.flag.state.write().unwrap_or_else(|e| e.into_inner());
        let was_missing = self.flag.missing.load(Ordering::Relaxed);
        let missing = match stored {
            Some(flag) => {
                self.flag.seen.store(true, Ordering::Relaxed);
                if was_missing {
                    tracing::warn!(version = flag.version, state = %flag.summary(), "flag hash virtual-queue:flag is back: applying it");
                }
                if **current != flag {
                    tracing::info!(version = flag.version, state = %flag.summary(), "flag changed");
                    *current = Arc::new(flag);
                }
                false
            }
            None if self.flag.seen.load(Ordering::Relaxed) => {
                if !was_missing {
                    tracing::warn!(
                        kept_version = current.version,
                        kept_state = %current.summary(),
                        "flag hash virtual-queue:flag is missing from Redis (restart without persistence, FLUSHALL or failover to an empty replica?): keeping the last known flag; re-assert it with `vq flag on` or `vq flag off`"
                    );
                }
                true
            }
            // Never read a flag: nobody turned the queue on, it is off.
            None => false,
        };
        self.flag.missing.store(missing, Ordering::Relaxed);
        crate::metrics::set_flag_missing(missing);
        Ok(AppliedFlag { version: current.version, kept_missing: missing, state: current.summary() })
    }

    /// The batch size in force for a target of `kind`: the target's runtime value, else the
    /// global one, else the type's configured one.
    pub fn batch_size(&self, kind: QueueTargetType, target_override: Option<u64>) -> u64 {
        let global = match self.global_batch.load(Ordering::Relaxed) {
            0 => None,
            b => Some(b),
        };
        batch_in_force(target_override, global, self.settings.type_batch_size(kind))
    }

    /// The most a tick may admit for `target`: the batch in force with a fixed outflow or a
    /// runtime batch; else `batch_max` (adaptive) or `max_active` (active buyers). What a copy
    /// of the mark may lag by per tick (local polls).
    pub fn most_per_tick(&self, target: QueueTarget, target_override: Option<u64>) -> u64 {
        let pinned = target_override.is_some() || self.global_batch.load(Ordering::Relaxed) > 0;
        match self.settings.type_outflow(target.kind) {
            Outflow::Adaptive if !pinned => self.settings.type_batch_bounds(target.kind).1,
            Outflow::Active if !pinned => self.settings.type_max_active(target.kind),
            _ => self.batch_size(target.kind, target_override),
        }
    }

    /// The batch a waiting user's ETA counts with: a runtime batch if one is set, else the
    /// adaptive controller's current batch as this instance's pump last saw it (the type's
    /// configured one until it has), else the type's configured one.
    pub fn eta_batch(&self, target: QueueTarget, target_override: Option<u64>) -> u64 {
        let pinned = target_override.is_some() || self.global_batch.load(Ordering::Relaxed) > 0;
        match self.outflow_batches.get(target) {
            Some(b) if !pinned && self.settings.is_adaptive(target.kind) => b,
            _ => self.batch_size(target.kind, target_override),
        }
    }
}
