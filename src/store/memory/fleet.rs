//! The embedded store's instance reports: one instance (this one) reports itself.

use super::MemoryStore;
use crate::domain::InstanceReport;
use crate::store::{FLEET_KEEP_MS, FleetOps, StoreError};

impl FleetOps for MemoryStore {
    async fn report_instance(&self, report: &InstanceReport, ttl_ms: u64) -> Result<(), StoreError> {
        let until = self.now_ms() + ttl_ms.max(1);
        self.lock().fleet.insert(report.instance.clone(), (report.clone(), until));
        Ok(())
    }

    async fn fleet(&self) -> Result<Vec<InstanceReport>, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        inner.fleet.retain(|_, (_, until)| *until + FLEET_KEEP_MS > now);
        Ok(inner.fleet.values().filter(|(_, until)| *until > now).map(|(r, _)| r.clone()).collect())
    }

    async fn withdraw_instance(&self, instance: &str) -> Result<(), StoreError> {
        self.lock().fleet.remove(instance);
        Ok(())
    }
}
