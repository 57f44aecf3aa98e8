//! The embedded store's flag, batch sizes and acknowledgements (`flag_*.lua`). Acknowledgements
//! are kept as [`FlagAck`] values, not in Redis' string form.

use super::{Inner, MemoryStore};
use crate::domain::{FlagChange, FlagFields, FlagState, QueueTarget};
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
    /// What `flag_set.lua` does, under the lock: overrides cleared with the write, the new
    /// version above every acknowledged one.
    fn write_flag_fields(&self, fields: FlagFields) -> u64 {
        let now = self.now_ms();
        let mut inner = self.lock();
        if fields.clear_overrides {
            inner.flag.retain(|k, _| !k.starts_with("target:"));
        }
        inner.flag.extend(fields.set);
        for k in fields.delete {
            inner.flag.remove(&k);
        }
        let floor = flag_version_floor(inner.live_acks(now).iter().map(|a| a.version));
        let next = inner.flag.get("version").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) + 1;
        let version = next.max(floor);
        inner.flag.insert("version".into(), version.to_string());
        version
    }
}

impl FlagOps for MemoryStore {
    async fn read_stored_flag(&self) -> Result<Option<FlagState>, StoreError> {
        let inner = self.lock();
        Ok((!inner.flag.is_empty()).then(|| FlagState::from_fields(&inner.flag)))
    }

    async fn write_flag(&self, set: Vec<(String, String)>, delete: Vec<String>) -> Result<u64, StoreError> {
        Ok(self.write_flag_fields(FlagFields { set, delete, clear_overrides: false }))
    }

    async fn change_flag(&self, change: FlagChange) -> Result<u64, StoreError> {
        Ok(self.write_flag_fields(change.fields()))
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
