//! The instances' reports on Redis: one HASH (`keys::FLEET`), a field per instance holding
//! `expires_at_ms|{json}`, the expiry by Redis' clock (`TIME`). One key, so no SCAN, also on
//! Redis Cluster; written every few seconds per instance, never on a request's path. The
//! JSON form is read and written only here.

use std::collections::{BTreeMap, HashMap};

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use super::RedisStore;
use super::keys;
use crate::domain::{DeclaredTargets, InstanceReport, QueueTargetType};
use crate::store::{FLEET_KEEP_MS, FleetOps, StoreError};

/// The stored form of an [`InstanceReport`] (without its instance, the field's name).
#[derive(Serialize, Deserialize)]
struct Stored {
    types: Vec<String>,
    declared: Vec<String>,
    ranges: Vec<String>,
    settings: BTreeMap<String, String>,
}

impl Stored {
    fn of(r: &InstanceReport) -> Self {
        Self {
            types: r.types.iter().map(|t| t.slug().to_string()).collect(),
            declared: r.declared.listed.iter().map(|t| format!("{}:{}", t.kind.slug(), t.id)).collect(),
            ranges: r.declared.ranges.iter().map(ToString::to_string).collect(),
            settings: r.settings.clone(),
        }
    }

    /// The report, leaving out what does not parse (written by another version of vq).
    fn report(self, instance: &str) -> InstanceReport {
        InstanceReport {
            instance: instance.to_owned(),
            types: self.types.iter().filter_map(|t| QueueTargetType::parse_any(t).ok()).collect(),
            declared: DeclaredTargets {
                listed: self.declared.iter().filter_map(|t| t.parse().ok()).collect(),
                ranges: self.ranges.iter().filter_map(|r| r.parse().ok()).collect(),
            },
            settings: self.settings,
        }
    }
}

impl RedisStore {
    /// Redis' clock, in epoch ms.
    async fn redis_now_ms(&self) -> Result<u64, StoreError> {
        let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut self.conn()).await?;
        Ok(s * 1000 + us / 1000)
    }
}

impl FleetOps for RedisStore {
    async fn report_instance(&self, report: &InstanceReport, ttl_ms: u64) -> Result<(), StoreError> {
        let json = serde_json::to_string(&Stored::of(report)).expect("a report serialises");
        let until = self.redis_now_ms().await? + ttl_ms.max(1);
        let _: u64 = self.conn().hset(keys::FLEET, &report.instance, format!("{until}|{json}")).await?;
        Ok(())
    }

    async fn fleet(&self) -> Result<Vec<InstanceReport>, StoreError> {
        let now = self.redis_now_ms().await?;
        let fields: HashMap<String, String> = self.conn().hgetall(keys::FLEET).await?;
        let mut live = Vec::new();
        let mut gone = Vec::new();
        for (instance, value) in fields {
            let Some((until, json)) = value.split_once('|') else { continue };
            let until: u64 = until.parse().unwrap_or(0);
            if until > now {
                if let Ok(stored) = serde_json::from_str::<Stored>(json) {
                    live.push(stored.report(&instance));
                }
            } else if until + FLEET_KEEP_MS <= now {
                gone.push(instance);
            }
        }
        if !gone.is_empty() {
            let _: u64 = self.conn().hdel(keys::FLEET, gone).await?;
        }
        live.sort_by(|a, b| a.instance.cmp(&b.instance));
        Ok(live)
    }

    async fn withdraw_instance(&self, instance: &str) -> Result<(), StoreError> {
        let _: u64 = self.conn().hdel(keys::FLEET, instance).await?;
        Ok(())
    }
}
