//! What an instance tells the fleet about its configuration (`domain::InstanceReport`): its
//! declarations, and the settings every instance of a cluster must share, so that a buyer
//! meets the same queue whichever replica answers. Never a secret: the token keys are named
//! by their ids.

use std::collections::BTreeMap;

use super::Settings;
use crate::domain::InstanceReport;

/// The version of vq, and of its Lua scripts (a digest of `lua/`, made by `build.rs`).
pub const VQ_VERSION: &str = env!("CARGO_PKG_VERSION");
pub const LUA_DIGEST: &str = env!("LUA_SCRIPTS_DIGEST");

impl Settings {
    /// The settings that must agree across instances, by name, as compared.
    pub fn fleet_settings(&self, key_ids: &str) -> BTreeMap<String, String> {
        let q = &self.queue;
        let ev = &self.events;
        let webhooks: Vec<String> = ev.all_webhooks().into_iter().map(|w| format!("{}={}", w.name, w.url)).collect();
        let pairs: [(&str, String); 14] = [
            ("token.key_ids", key_ids.to_owned()),
            ("token.ttl_s", self.token.ttl_s.to_string()),
            ("queue.tick_ms", q.tick_ms.to_string()),
            ("queue.batch_size", q.batch_size.to_string()),
            ("queue.max_capacity", q.max_capacity.to_string()),
            (
                "queue.outflow",
                format!("{} (batch {}-{}, max_active {})", json(&q.outflow), q.batch_min, q.batch_max, q.max_active),
            ),
            ("queue.on_store_failure", json(&q.on_store_failure)),
            (
                "queue.purchases",
                format!("per admission {}, per user {}", q.purchases_per_admission, q.purchases_per_user),
            ),
            (
                "events",
                format!(
                    "max_len {}, admitted_every {}, webhooks [{}]",
                    ev.max_len,
                    ev.admitted_every,
                    webhooks.join(" ")
                ),
            ),
            ("targets.types", json(&self.targets.types)),
            ("gate.routes", json(&self.gate.routes)),
            ("identity.mode", json(&self.identity.mode)),
            ("entry.pow", format!("bits {}, ttl {} s", self.entry.pow_bits, self.entry.pow_ttl_s)),
            ("version", format!("vq {VQ_VERSION}, lua {LUA_DIGEST}")),
        ];
        pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
    }

    /// This instance's report: its types, its configured declarations and
    /// [`Self::fleet_settings`].
    pub fn instance_report(&self, instance: &str, key_ids: &str) -> Result<InstanceReport, crate::domain::ParseError> {
        Ok(InstanceReport {
            instance: instance.to_owned(),
            types: self.target_types()?,
            declared: self.declared_targets()?,
            settings: self.fleet_settings(key_ids),
        })
    }
}

/// A setting's value in JSON, without quotes around a plain string.
fn json<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(v) => v.to_string(),
        Err(_) => String::from("?"),
    }
}
