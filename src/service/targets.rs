//! The declared targets as this instance knows them: those of its configuration, and those
//! declared at runtime (`queue:targets`), read with the flag every `flag.refresh_ms`.
//!
//! A queue answers only for declared targets: the check is a lookup in this copy, so a
//! request naming an undeclared target costs no Redis call and writes nothing.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use super::QueueService;
use crate::domain::{DeclaredTargets, QueueTarget, QueueTargetType};
use crate::store::StoreError;
use crate::store::prelude::*;

pub(super) struct TargetCache {
    /// The configured types: a target of another type is never declared, whatever Redis holds
    /// (a type removed from the configuration takes its runtime declarations with it).
    types: Vec<QueueTargetType>,
    config: DeclaredTargets,
    runtime: RwLock<Arc<HashSet<QueueTarget>>>,
    /// The runtime set was read at least once.
    read: AtomicBool,
}

impl TargetCache {
    pub(super) fn new(types: Vec<QueueTargetType>, config: DeclaredTargets) -> Self {
        Self { types, config, runtime: RwLock::new(Arc::default()), read: AtomicBool::new(false) }
    }
}

impl QueueService {
    /// Whether the queue answers for `target`: one of a configured type, declared. Until the runtime set has been read once (Redis
    /// unreachable since start), a target outside the configuration counts as declared only
    /// while the store is silent: such requests fail open without touching Redis anyway.
    pub fn is_declared(&self, target: QueueTarget) -> bool {
        let t = &self.targets;
        if !t.types.contains(&target.kind) {
            return false;
        }
        t.config.contains(target)
            || t.runtime.read().unwrap_or_else(|e| e.into_inner()).contains(&target)
            || (!t.read.load(Ordering::Relaxed) && self.store.silent(Some(target)))
    }

    /// Every declared target this instance knows of.
    pub fn declared_targets(&self) -> DeclaredTargets {
        let runtime = self.targets.runtime.read().unwrap_or_else(|e| e.into_inner()).clone();
        self.targets.config.with(runtime.iter().copied())
    }

    /// Reads the runtime declarations; on error the last set read stays in force.
    pub async fn refresh_targets(&self) -> Result<(), StoreError> {
        // The lanes added at runtime (`vq lane add`), read with the declarations.
        self.store.refresh_lanes().await?;
        let read: HashSet<QueueTarget> = self.store.declared_targets().await?.into_iter().collect();
        let mut current = self.targets.runtime.write().unwrap_or_else(|e| e.into_inner());
        if **current != read {
            tracing::info!(declared_at_runtime = read.len(), "declared targets changed");
            *current = Arc::new(read);
        }
        self.targets.read.store(true, Ordering::Relaxed);
        Ok(())
    }
}
