//! The event logs on Redis: a STREAM per target (`queue:{T}:events`, appended to by the
//! scripts that change the target, `XADD MAXLEN ~`) and one for the instances
//! (`queue:events`); the webhooks' cursors (one HASH) and delivery leases
//! (`lua/events_lease.lua`).

use redis::AsyncCommands;

use super::RedisStore;
use super::codec;
use super::keys;
use super::layout::*;
use super::scripts::EVENTS_LEASE;
use crate::domain::{Event, EventId, EventKind, EventLog, QueueTarget};
use crate::store::{EventOps, StoreError};

fn cursor_field(subscriber: &str, log: EventLog) -> String {
    format!("{subscriber}|{}", log.name())
}

impl EventOps for RedisStore {
    async fn read_events(&self, log: EventLog, after: EventId, count: usize) -> Result<Vec<Event>, StoreError> {
        let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(keys::event_log(log))
            .arg(format!("({after}"))
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut self.conn())
            .await?;
        let mut out = Vec::with_capacity(entries.len());
        for (id, fields) in entries {
            let id: EventId =
                id.parse().map_err(|_| StoreError::Reply { what: "event log", detail: format!("entry id {id}") })?;
            let row = fields.chunks_exact(2).find(|kv| kv[0] == "row").map(|kv| kv[1].as_str());
            // A row this vq does not know (written by a newer one) is skipped, not an error.
            if let Some((at_ms, kind)) = row.and_then(codec::decode_event_row) {
                out.push(Event { log, id, at_ms, kind });
            }
        }
        Ok(out)
    }

    async fn append_instance_event(&self, at_ms: u64, kind: &EventKind) -> Result<(), StoreError> {
        let Some(row) = codec::encode_instance_event(at_ms, kind) else {
            return Err(StoreError::Reply { what: "instance event", detail: format!("{} is a target's", kind.name()) });
        };
        let _: String = redis::cmd("XADD")
            .arg(keys::INSTANCE_EVENTS)
            .arg("MAXLEN")
            .arg("~")
            .arg(self.limits.events.max_len)
            .arg("*")
            .arg("row")
            .arg(row)
            .query_async(&mut self.conn())
            .await?;
        Ok(())
    }

    async fn register_event_logs(&self, targets: &[QueueTarget]) -> Result<(), StoreError> {
        if targets.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = targets.iter().map(ToString::to_string).collect();
        let _: u64 = self.conn().sadd(keys::EVENT_LOGS, names).await?;
        Ok(())
    }

    async fn event_log_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        let members: Vec<String> = self.conn().smembers(keys::EVENT_LOGS).await?;
        Ok(members.iter().filter_map(|m| m.parse().ok()).collect())
    }

    async fn lease_events(&self, name: &str, holder: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let held: u64 = EVENTS_LEASE
            .key(&events_lease_keys(name)[..])
            .args(&EventsLeaseArgs { holder, lease_ms: ttl_ms })
            .invoke_async(&mut self.conn())
            .await?;
        Ok(held == 1)
    }

    async fn event_cursor(&self, subscriber: &str, log: EventLog) -> Result<Option<EventId>, StoreError> {
        let v: Option<String> = self.conn().hget(keys::EVENT_CURSORS, cursor_field(subscriber, log)).await?;
        Ok(v.and_then(|v| v.parse().ok()))
    }

    async fn save_event_cursor(&self, subscriber: &str, log: EventLog, id: EventId) -> Result<(), StoreError> {
        let _: u64 = self.conn().hset(keys::EVENT_CURSORS, cursor_field(subscriber, log), id.to_string()).await?;
        Ok(())
    }
}
