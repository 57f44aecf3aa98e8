//! The embedded store's targets: the active set, runtime declarations, the published
//! capacity, and forgetting a target once nothing of it lives.

use super::{Inner, MemoryStore};
use crate::domain::QueueTarget;
use crate::store::{DeclareOutcome, StoreError, TargetOps};

impl TargetOps for MemoryStore {
    async fn register_active(&self, target: QueueTarget) -> Result<(), StoreError> {
        self.lock().active.insert(target);
        Ok(())
    }

    async fn deactivate(&self, target: QueueTarget) -> Result<(), StoreError> {
        self.lock().active.remove(&target);
        Ok(())
    }

    async fn declared_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        Ok(self.lock().declared.iter().copied().collect())
    }

    async fn declare_target(&self, target: QueueTarget, room: u64) -> Result<DeclareOutcome, StoreError> {
        let mut inner = self.lock();
        if inner.declared.contains(&target) {
            return Ok(DeclareOutcome::AlreadyDeclared);
        }
        if inner.declared.len() as u64 >= room {
            return Ok(DeclareOutcome::Full { room });
        }
        inner.declared.insert(target);
        Ok(DeclareOutcome::Added)
    }

    async fn undeclare_target(&self, target: QueueTarget) -> Result<bool, StoreError> {
        Ok(self.lock().declared.remove(&target))
    }

    async fn publish_capacity(&self, target: QueueTarget) -> Result<(), StoreError> {
        let now = self.now_ms();
        let until = now + self.key_ttl_ms();
        self.lock().target(target, now).capacity = Some((self.limits.capacity(target.kind), until));
        Ok(())
    }

    async fn active_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        Ok(self.lock().active.iter().copied().collect())
    }

    async fn forget_if_expired(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        // Redis asks whether the `seq` key still exists.
        // A pre-queue keeps it too (enter.lua writes `seq` for it).
        let prequeued = inner.sales.get(&target).is_some_and(|s| !s.prequeue.is_empty());
        let expired = !prequeued && inner.existing(target, now).is_none_or(|t| t.queue.seq == 0);
        if expired {
            inner.active.remove(&target);
            // What outlives a target's queue (tokens, used marks, the lock) is kept until it
            // expires too; targets out of the active set are not asked again, so sweep here.
            let Inner { targets, active, user_queues, .. } = &mut *inner;
            targets.retain(|target, t| {
                t.expire(now);
                active.contains(target) || !t.is_gone(now)
            });
            user_queues.retain(|_, (_, until)| *until > now);
        }
        Ok(expired)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
