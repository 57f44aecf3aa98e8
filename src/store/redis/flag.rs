//! The `virtual-queue.enabled` flag on Redis: reading and writing its hash (`flag_set.lua`,
//! versions never reused; the hash's form is `flag_form.rs`'s) and the instances'
//! acknowledgements (`flag_ack.lua`, `flag_acks.lua`; the value's form is the prelude's
//! `ack_value`).

use std::collections::HashMap;

use redis::AsyncCommands;

use super::RedisStore;
use super::flag_form::{FlagFields, decode_flag, encode_change};
use super::keys;
use super::layout::*;
use super::scripts::{FLAG_ACK, FLAG_ACKS, FLAG_SET};
use crate::domain::QueueTarget;
use crate::domain::{FlagChange, FlagState};
use crate::store::FlagOps;
use crate::store::rules::flag_version_floor;
use crate::store::{FlagAck, StoreError};

impl RedisStore {
    /// `flag_set.lua` with a version floor one above the highest acknowledged version. The
    /// flag and the acks hash live in different slots on a cluster, so the floor is read
    /// first; an instance acknowledges only versions it read from the flag hash.
    async fn write_flag_fields(&self, fields: FlagFields) -> Result<u64, StoreError> {
        let floor = flag_version_floor(self.flag_acks().await?.iter().map(|a| a.version));
        let mut inv = FLAG_SET.key(&FLAG_SET_KEYS[..]);
        inv.args(&FlagSetArgs {
            set_count: fields.set.len(),
            clear_overrides: if fields.clear_overrides { "1" } else { "0" },
            version_floor: floor,
        });
        for (k, v) in &fields.set {
            inv.arg(k).arg(v);
        }
        for k in &fields.delete {
            inv.arg(k);
        }
        Ok(inv.invoke_async(&mut self.conn()).await?)
    }
}

impl FlagOps for RedisStore {
    async fn read_stored_flag(&self) -> Result<Option<FlagState>, StoreError> {
        // HGETALL of a missing key is empty; Redis deletes a hash whose last field goes.
        let fields: HashMap<String, String> = self.conn().hgetall(keys::FLAG).await?;
        Ok((!fields.is_empty()).then(|| decode_flag(&fields)))
    }

    async fn change_flag(&self, change: FlagChange) -> Result<u64, StoreError> {
        self.write_flag_fields(encode_change(change)).await
    }

    async fn ack_flag(&self, ack: FlagAck, ttl_ms: u64) -> Result<(), StoreError> {
        let (missing, state) = ack.encode_rest();
        let _: u64 = FLAG_ACK
            .key(&FLAG_ACK_KEYS[..])
            .args(&FlagAckArgs {
                instance: &ack.instance,
                version: ack.version,
                applied_at_ms: ack.applied_at_ms,
                ttl_ms: ttl_ms.max(1),
                missing,
                state: &state,
            })
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }

    async fn flag_acks(&self) -> Result<Vec<FlagAck>, StoreError> {
        let listed: Vec<String> =
            FLAG_ACKS.key(&FLAG_ACK_KEYS[..]).args(&FlagAcksArgs {}).invoke_async(&mut self.conn()).await?;
        let mut acks: Vec<FlagAck> =
            listed.chunks_exact(3).filter_map(|a| FlagAck::decode(&a[0], &a[1], a[2].parse::<u64>().ok())).collect();
        acks.sort_by(|a, b| a.instance.cmp(&b.instance));
        Ok(acks)
    }

    async fn withdraw_flag_ack(&self, instance: &str) -> Result<(), StoreError> {
        let _: u64 = self.conn().hdel(keys::FLAG_ACKS, instance).await?;
        Ok(())
    }

    async fn global_batch_size(&self) -> Result<Option<u64>, StoreError> {
        Ok(self.conn().get(keys::GLOBAL_BATCH_SIZE).await?)
    }

    async fn set_batch_size(&self, target: Option<QueueTarget>, batch: Option<u64>) -> Result<(), StoreError> {
        let key = target.map_or_else(|| keys::GLOBAL_BATCH_SIZE.to_owned(), |t| keys::of(t, "batch_size"));
        let mut conn = self.conn();
        match batch {
            Some(b) => {
                let _: () = conn.set(&key, b).await?;
            }
            None => {
                let _: u64 = conn.del(&key).await?;
            }
        }
        Ok(())
    }
}
