//! The embedded store's adaptive outflow (`outflow_*.lua`, `active_count.lua`,
//! `tokens_expire.lua`).

use super::{MemoryStore, sale};
use crate::domain::{BuyerObservation, LedgerEntry, Observations, QueueTarget, UserId};
use crate::store::{BatchChange, OutflowClaim, OutflowOps, OutflowState, StoreError, TokensEnded};

impl OutflowOps for MemoryStore {
    async fn observe_purchase(
        &self,
        target: QueueTarget,
        interval: u64,
        buyer: &UserId,
        seen: BuyerObservation,
        _keep_s: u64,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let t = inner.target(target, self.now_ms());
        let buyers = t.observations.entry(interval).or_default();
        let counted = buyers.get(buyer).map_or(seen, |before| before.worst(seen));
        buyers.insert(buyer.clone(), counted);
        while t.observations.len() > 8 {
            t.observations.pop_first();
        }
        Ok(())
    }

    async fn claim_outflow(&self, target: QueueTarget, interval: u64) -> Result<OutflowClaim, StoreError> {
        let mut inner = self.lock();
        let t = inner.target(target, self.now_ms());
        if t.batch_override.is_some() {
            return Ok(OutflowClaim::Pinned);
        }
        let current = t.outflow.as_ref().map(|o| o.batch);
        if t.outflow_interval.is_some_and(|i| i >= interval) {
            return Ok(OutflowClaim::Decided { current });
        }
        t.outflow_interval = Some(interval);
        let counters = TokensEnded { used: t.queue.tokens_used, expired: t.queue.tokens_expired };
        let (no_show_bp, ended) = match &t.outflow {
            Some(o) => {
                (o.no_show_bp, Some(counters.since(TokensEnded { used: o.tokens_used, expired: o.tokens_expired })))
            }
            None => (None, None),
        };
        let seen = t.observations.get(&interval).map(|b| Observations::of_buyers(b.values())).unwrap_or_default();
        Ok(OutflowClaim::Decide { current, seen, no_show_bp, ended, counters })
    }

    async fn active_buyers(&self, target: QueueTarget) -> Result<u64, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let t = inner.target(target, now);
        let admitted = t.queue.waiting.range(..=t.queue.mark).count() as u64;
        Ok(admitted + t.unused.values().filter(|expiry| **expiry > now).count() as u64)
    }

    async fn expire_tokens(&self, target: QueueTarget) -> Result<u64, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let t = inner.target(target, now);
        let before = t.unused.len();
        t.unused.retain(|_, expiry| *expiry > now);
        let expired = (before - t.unused.len()) as u64;
        t.queue.tokens_expired += expired;
        Ok(expired)
    }

    async fn set_outflow(
        &self,
        target: QueueTarget,
        state: &OutflowState,
        change: Option<BatchChange>,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        inner.target(target, self.now_ms()).outflow = Some(state.clone());
        if let Some(c) = change {
            let entry = LedgerEntry::Batch {
                at_ms: state.decided_at_ms,
                from: c.from,
                to: state.batch,
                instance: c.instance,
                reason: state.reason.clone(),
            };
            let now = self.now_ms();
            sale::ledger_entry(&mut inner, target, now, entry);
        }
        Ok(())
    }
}
