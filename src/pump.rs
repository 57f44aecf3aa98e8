//! The admission pump: every tick, for each active declared target, the instance that wins the
//! target's lock admits one batch, evicts stale users and forgets expired targets.
//!
//! `tick()` is one round (tests call it directly); `run()` is a short loop around it. The pump's
//! time is its store's ([`AnyStore::now_ms`], and every admission by the store's own clock):
//! Redis' `TIME`, or the embedded store's clock, which tests step. One
//! failing target is logged and never stops the loop or the other targets. Targets are worked
//! on [`PUMP_CONCURRENCY`] at a time, all admissions before any eviction.
//!
//! Eviction runs after every target's admission, in slices of [`EVICT_SLICE`] users per
//! `evict.lua` call (about a millisecond of Redis time each, so Redis never blocks on a huge queue), as
//! many slices per tick as there are stale users, up to `queue.max_evict_per_tick` per target
//! and half a tick of time in all: abandonment at any arrival rate is cleared within ticks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::{Outflow, Settings};
use crate::domain::{DeclaredTargets, Ms, QueueTarget, Users, smooth_no_show};
use crate::service::OutflowBatches;
use crate::store::prelude::*;
use crate::store::{AdmitOutcome, AnyStore, BatchChange, OutflowClaim, OutflowState, StoreError};

/// What the pump did for one target in one tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetTick {
    pub target: QueueTarget,
    /// False when another instance holds the lock this tick.
    pub locked: bool,
    pub admit: Option<AdmitOutcome>,
    pub evicted: u64,
    /// `evict.lua` calls it took, each removing at most [`EVICT_SLICE`] users.
    pub evict_calls: u64,
    /// The target's keys had expired and it left `queue:active`.
    pub forgotten: bool,
}

/// Most users one `evict.lua` call removes: about 1 ms of Redis time at a million waiting
/// (~6 µs a user, see `store::redis::slices`), so other commands wait at most that long
/// behind it.
pub const EVICT_SLICE: u64 = 150;

/// Targets the pump works on at once. Their calls share the connection (pipelined), so a
/// round over many targets takes about `targets / PUMP_CONCURRENCY` round trips of each step
/// rather than one per target (measured: 1,000 targets in `queue:active`, see README).
pub const PUMP_CONCURRENCY: usize = 32;

/// Runs `work` for every item, at most [`PUMP_CONCURRENCY`] at a time, each as its own task
/// (a panic in one is logged and loses only its own result).
async fn run_concurrently<I, T, F, Fut>(items: Vec<I>, work: F) -> Vec<T>
where
    I: Send + 'static,
    T: Send + 'static,
    F: Fn(I) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let mut pending = items.into_iter();
    let mut running = tokio::task::JoinSet::new();
    let mut out = Vec::new();
    loop {
        while running.len() < PUMP_CONCURRENCY {
            let Some(item) = pending.next() else { break };
            running.spawn(work(item));
        }
        match running.join_next().await {
            None => return out,
            Some(Ok(result)) => out.push(result),
            Some(Err(e)) => tracing::error!(error = %e, "a pump task failed"),
        }
    }
}

/// Pre-queued users placed per `sale_place.lua` call at a sale's opening: about a millisecond
/// of Redis time at a million pre-queued, where each of its three lookups per user (placed,
/// departed, heartbeat) finds its member in a million-member set (measured with
/// `scripts/bench.sh scale`: a chunk of 300 took over 2 ms there).
pub const OPENING_CHUNK: usize = 150;

#[derive(Clone)]
pub struct Pump {
    store: AnyStore,
    settings: Arc<Settings>,
    instance_id: String,
    /// Where the adaptive batch of each target is published for this instance's ETAs.
    batches: Option<Arc<OutflowBatches>>,
}

impl Pump {
    pub fn new(store: AnyStore, settings: Arc<Settings>, instance_id: String) -> Self {
        Self { store, settings, instance_id, batches: None }
    }

    /// Publishes each target's adaptive batch, as this pump chooses or reads it every tick,
    /// into `batches` (the serving instance's, for its ETAs).
    pub fn publishing_batches(mut self, batches: Arc<OutflowBatches>) -> Self {
        self.batches = Some(batches);
        self
    }

    /// One round over every active target: admissions first, then evictions.
    pub async fn tick(&self) -> Result<Vec<Result<TargetTick, (QueueTarget, StoreError)>>, StoreError> {
        let started = Instant::now();
        // Only declared targets are walked; one no longer declared leaves `queue:active`.
        let declared = self.declared().await?;
        let mut targets = self.store.active_targets().await?;
        for gone in targets.iter().filter(|t| !declared.contains(**t)) {
            self.store.deactivate(*gone).await?;
            tracing::info!(target_queue = %gone, "target no longer declared: the pump stops admitting for it");
        }
        targets.retain(|t| declared.contains(*t));
        // The operator's runtime batch size, read each tick; the type's configured one is the
        // fallback.
        let global = self.store.global_batch_size().await.ok().flatten();
        let mut out = Vec::with_capacity(targets.len());
        {
            let pump = self.clone();
            let results = run_concurrently(targets, move |target| {
                let pump = pump.clone();
                async move {
                    let batch = pump.batch_for(target, global).await.map_err(|e| (target, e))?;
                    pump.admit_target(target, batch).await.map_err(|e| (target, e))
                }
            })
            .await;
            out.extend(results);
        }
        // Evictions share half a tick, so the next tick starts on time whatever is stale.
        let deadline = started + Duration::from_millis(self.settings.queue.tick_ms / 2);
        let to_evict: Vec<TargetTick> =
            out.iter().filter_map(|r| r.as_ref().ok()).filter(|t| t.locked && !t.forgotten).cloned().collect();
        let pump = self.clone();
        let evicted = run_concurrently(to_evict, move |mut tick| {
            let pump = pump.clone();
            async move {
                let target = tick.target;
                pump.evict_target(&mut tick, deadline).await.map(|()| tick).map_err(|e| (target, e))
            }
        })
        .await;
        for result in evicted {
            let target = match &result {
                Ok(t) => t.target,
                Err((t, _)) => *t,
            };
            if let Some(slot) = out.iter_mut().find(|r| matches!(r, Ok(t) if t.target == target)) {
                *slot = result;
            }
        }
        out.sort_by_key(|r| match r {
            Ok(t) => t.target,
            Err((t, _)) => *t,
        });
        Ok(out)
    }

    /// The batch this tick admits for `target` (a per-target pin in Redis overrides it inside
    /// admit.lua): the operator's global runtime batch; else by the type's outflow (its own or
    /// `queue.outflow`): fixed, the type's configured batch; active, `max_active` minus the
    /// active buyers, which is `None` here: the lock's holder counts them (`admit_target`);
    /// adaptive, the controller's (deciding the interval just ended if no pump has yet). A
    /// failed claim skips the target this tick, so no batch but the chosen one is ever
    /// admitted.
    async fn batch_for(&self, target: QueueTarget, global: Option<u64>) -> Result<Option<u64>, StoreError> {
        let configured = self.settings.type_batch_size(target.kind);
        if let Some(g) = global {
            return Ok(Some(g));
        }
        match self.settings.type_outflow(target.kind) {
            Outflow::Fixed => return Ok(Some(configured)),
            // A place per buyer who finished since: counted in admit_target.
            Outflow::Active => return Ok(None),
            Outflow::Adaptive => {}
        }
        let controller = self.settings.controller(target.kind);
        let now = self.store.now_ms();
        let interval = (now / self.settings.outflow_interval_ms()).saturating_sub(1);
        let batch = match self.store.claim_outflow(target, interval).await? {
            OutflowClaim::Pinned => configured,
            OutflowClaim::Decided { current } => {
                current.unwrap_or(configured).clamp(controller.batch_min, controller.batch_max)
            }
            OutflowClaim::Decide { current, seen, no_show_bp, ended, counters } => {
                let previous = no_show_bp.map(|bp| bp as f64 / 10_000.0);
                let no_show = match ended {
                    Some(e) => smooth_no_show(previous, e.used, e.expired),
                    None => previous,
                };
                let d = controller.decide(current.unwrap_or(configured), &seen, no_show);
                if current != Some(d.batch) {
                    tracing::info!(target_queue = %target, from = ?current, to = d.batch, reason = %d.reason, "adaptive outflow");
                }
                let state = OutflowState {
                    batch: d.batch,
                    reason: d.reason,
                    decided_at_ms: now,
                    no_show_bp: no_show.map(|n| (n * 10_000.0).round() as u64),
                    tokens_used: counters.used,
                    tokens_expired: counters.expired,
                    purchases: seen.purchases,
                    // Past the last bucket there is no figure to keep.
                    p95_ms: seen.p95_ms().filter(|&p| p != u64::MAX),
                    error_bp: (seen.error_ratio() * 10_000.0).round() as u64,
                };
                let change = (current != Some(d.batch))
                    .then(|| BatchChange { from: current, instance: self.instance_id.clone() });
                self.store.set_outflow(target, &state, change).await?;
                d.batch
            }
        };
        if let Some(b) = &self.batches {
            b.set(target, batch);
        }
        Ok(Some(batch))
    }

    /// The declared targets: the configured ones and those declared at runtime, of the
    /// configured types.
    async fn declared(&self) -> Result<DeclaredTargets, StoreError> {
        let configured = self.settings.declared_targets().unwrap_or_default();
        let types = self.settings.target_types().unwrap_or_default();
        let runtime = self.store.declared_targets().await?.into_iter().filter(|t| types.contains(&t.kind));
        Ok(configured.with(runtime))
    }

    /// Admits `target`'s batch, `None` in active-buyer mode: the room left under `max_active`,
    /// counted once the lock is held (never by the instances that do not admit).
    async fn admit_target(&self, target: QueueTarget, batch: Option<u64>) -> Result<TargetTick, StoreError> {
        let q = &self.settings.queue;
        let mut tick = TargetTick { target, locked: false, admit: None, evicted: 0, evict_calls: 0, forgotten: false };
        if self.store.forget_if_expired(target).await? {
            tick.forgotten = true;
            return Ok(tick);
        }
        if !self.store.try_lock_admission(target, &self.instance_id, self.settings.lock_ttl_ms()).await? {
            return Ok(tick);
        }
        tick.locked = true;
        let batch = match batch {
            Some(b) => b,
            // Never more than max_active at once.
            None => self.settings.type_max_active(target.kind).saturating_sub(self.store.active_buyers(target).await?),
        };
        let mut admit = self.store.admit_by(target, Users(batch), Ms(q.tick_ms), &self.instance_id).await?;
        // A tick a sale held back may be its opening: write the order, then admit this tick.
        if !admit.advanced && self.open_sale(target).await? {
            admit = self.store.admit_by(target, Users(batch), Ms(q.tick_ms), &self.instance_id).await?;
        }
        tick.admit = Some(admit);
        if admit.admitted > 0 {
            crate::metrics::admitted(target, admit.admitted);
        }
        // No-shows: tokens that expired unused are counted once, by the lock's holder. A
        // failure only delays the count to a later tick.
        if let Err(e) = self.store.expire_tokens(target).await {
            tracing::warn!(target_queue = %target, error = %e, "counting expired tokens failed");
        }
        Ok(tick)
    }

    /// Writes the opening order of a sale whose pre-queue was frozen, in chunks of
    /// [`OPENING_CHUNK`] (each one `sale_place.lua` call); returns whether the opening is done
    /// (by this call or another instance's). Exactly once under lock loss: every instance
    /// computes the same order from the same frozen set and seed, and the store writes each
    /// seq once.
    async fn open_sale(&self, target: QueueTarget) -> Result<bool, StoreError> {
        // A sharded target's shards each order their own pre-queue with the sale's one seed
        // (shard 0's), so the order of the whole restricted to a shard is that shard's order.
        let mut opened = false;
        for part in self.store.parts(target) {
            opened |= self.open_part(part).await?;
        }
        Ok(opened)
    }

    /// [`Self::open_sale`] of one shard (the whole target unless it is sharded).
    async fn open_part(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let Some(opening) = self.store.pending_opening(target).await? else { return Ok(false) };
        let order = crate::domain::opening_order(&opening.seed, &opening.users);
        let places: Vec<(u64, crate::domain::UserId)> =
            order.into_iter().enumerate().map(|(i, u)| (opening.base + 1 + i as u64, u)).collect();
        let chunks: Vec<&[(u64, crate::domain::UserId)]> =
            if places.is_empty() { vec![&[]] } else { places.chunks(OPENING_CHUNK).collect() };
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            if !self.store.place_opening(target, chunk, opening.opens_at_ms, i == last).await? {
                break;
            }
        }
        tracing::info!(target_queue = %target, prequeued = places.len(), "sale opened: pre-queue ordered");
        Ok(true)
    }

    /// Slices of at most [`EVICT_SLICE`] users until one says no stale user is left, the
    /// target's bound is reached or `deadline` passes (every locked target gets at least one
    /// slice).
    async fn evict_target(&self, tick: &mut TargetTick, deadline: Instant) -> Result<(), StoreError> {
        let q = &self.settings.queue;
        loop {
            let slice = EVICT_SLICE.min(q.max_evict_per_tick - tick.evicted);
            let evicted = self.store.evict(tick.target, Ms(q.heartbeat_timeout_s * 1000), Users(slice)).await?;
            tick.evict_calls += 1;
            tick.evicted += evicted.users;
            if evicted.users > 0 {
                crate::metrics::evicted(tick.target, evicted.users);
            }
            if !evicted.more || tick.evicted >= q.max_evict_per_tick || Instant::now() >= deadline {
                return Ok(());
            }
        }
    }

    /// Ticks until `cancel`, aligned to the tick boundaries of Redis' clock (plus a small
    /// offset), so every instance tries at the same moment and each tick of admit.lua's
    /// clock gets exactly one attempt, whatever this host's clock says. A tick in progress finishes before returning.
    pub async fn run(self, cancel: CancellationToken) {
        let tick_ms = self.settings.queue.tick_ms;
        tracing::info!(instance = %self.instance_id, tick_ms, "admission pump started");
        loop {
            let now = self.store.now_ms();
            let wait = tick_ms - now % tick_ms + 20;
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(Duration::from_millis(wait)) => {}
            }
            // The lanes added at runtime (`vq lane add`): a tick shares its batch over them.
            if let Err(e) = self.store.refresh_lanes().await {
                tracing::debug!(error = %e, "cannot read the lanes: keeping the last set read");
            }
            match self.tick().await {
                Ok(results) => {
                    for r in results {
                        match r {
                            Ok(t) => {
                                if let Some(a) = t.admit.filter(|a| a.admitted > 0) {
                                    tracing::debug!(target_queue = %t.target, admitted = a.admitted, mark = a.mark, "admitted");
                                }
                                if t.evicted > 0 {
                                    tracing::info!(target_queue = %t.target, evicted = t.evicted, "evicted users who stopped polling");
                                }
                            }
                            Err((target, e)) => {
                                tracing::warn!(target_queue = %target, error = %e, "pump tick failed for target")
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "pump could not list active targets"),
            }
        }
        tracing::info!("admission pump stopped");
    }
}
