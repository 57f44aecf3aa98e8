//! The serving instances' reports of themselves (`domain::InstanceReport`): what each one
//! declares in its configuration and the settings that must agree across a cluster. Written
//! every few seconds by each `vq serve`, off the request path; read by the operator commands
//! and by every instance (its drift gauge).

use std::future::Future;

use super::StoreError;
use crate::domain::InstanceReport;

/// The instances' reports. Every method is one step.
pub trait FleetOps: Send + Sync + 'static {
    /// Records `report` for its instance; it counts as live for `ttl_ms` by the store's clock.
    fn report_instance(
        &self,
        report: &InstanceReport,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The reports of the live instances, by instance name. Reports expired for over
    /// [`super::FLEET_KEEP_MS`] are dropped from the store on the way.
    fn fleet(&self) -> impl Future<Output = Result<Vec<InstanceReport>, StoreError>> + Send;

    /// Removes `instance`'s report: it shuts down and serves nothing any more.
    fn withdraw_instance(&self, instance: &str) -> impl Future<Output = Result<(), StoreError>> + Send;
}
