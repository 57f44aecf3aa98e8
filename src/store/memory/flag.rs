//! The embedded store's flag, batch sizes and acknowledgements (`flag_*.lua`). The flag is kept
//! as a [`FlagState`] and acknowledgements as [`FlagAck`] values, not in Redis' forms.

use super::{Inner, MemoryStore};
use crate::domain::{FlagChange, FlagState, QueueTarget};
use crate::store::rules::flag_version_floor;
use crate::store::{FLAG_ACK_KEEP_MS, FlagAck, FlagOps, StoreError};

impl Inner {
    /// The acknowledgements still listed, by instance, silent ones with how long they have been.
    fn live_acks(&self, now: u64) -> Vec<FlagAck> {
        let mut acks: Vec<FlagAck> = self
            .acks
            .values()
            .filter(|(_, until)| until + FLAG_ACK_KEEP_MS > now)
            .map(|(ack, until)| FlagAck { silent_ms: (*until <= now).then(|| now - until), ..ack.clone() })
            .collect();
        acks.sort_by(|a, b| a.instance.cmp(&b.instance));
        acks
    }
}

impl MemoryStore {
    /// What `flag_set.lua` does, under the lock: the change applied (overrides cleared with
    /// `Off`), the new version above every acknowledged one.
    fn apply_flag_change(&self, change: FlagChange) -> u64 {
        let now = self.now_ms();
        let mut inner = self.lock();
        let floor = flag_version_floor(inner.live_acks(now).iter().map(|a| a.version));
        let flag = inner.flag.get_or_insert_with(FlagState::blank);
        flag.apply(change);
        flag.version = (flag.version + 1).max(floor);
        flag.version
    }
}

impl FlagOps for MemoryStore {
    async fn read_stored_flag(&self) -> Result<Option<FlagState>, StoreError> {
        Ok(self.lock().flag.clone())
    }

    async fn change_flag(&self, change: FlagChange) -> Result<u64, StoreError> {
        Ok(self.apply_flag_change(change))
    }

    async fn global_batch_size(&self) -> Result<Option<u64>, StoreError> {
        Ok(self.lock().global_batch)
    }

    async fn set_batch_size(&self, target: Option<QueueTarget>, batch: Option<u64>) -> Result<(), StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        match target {
            Some(t) => inner.target(t, now).batch_override = batch,
            None => inner.global_batch = batch,
        }
        Ok(())
    }

    async fn ack_flag(&self, ack: FlagAck, ttl_ms: u64) -> Result<(), StoreError> {
        let until = self.now_ms() + ttl_ms.max(1);
        let ack = ack.stored();
        self.lock().acks.insert(ack.instance.clone(), (ack, until));
        Ok(())
    }

    async fn flag_acks(&self) -> Result<Vec<FlagAck>, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        inner.acks.retain(|_, (_, until)| *until + FLAG_ACK_KEEP_MS > now);
        Ok(inner.live_acks(now))
    }

    async fn withdraw_flag_ack(&self, instance: &str) -> Result<(), StoreError> {
        self.lock().acks.remove(instance);
        Ok(())
    }
}
