//! The admission ledger's rows (`queue:{T}:ledger`), typed: admission steps, the sale's
//! changes and the outflow's batch changes. Their stored form is `store::redis::codec`'s.

use super::SaleSource;

/// One row of a target's admission ledger (`queue:{T}:ledger`, newest first; its stored form
/// is `store::redis::codec`'s).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum LedgerEntry {
    /// One admission step: the mark before and after, users admitted, the instance that ran it.
    #[serde(rename_all = "camelCase")]
    Admission { at_ms: u64, mark_before: u64, mark_after: u64, admitted: u64, instance: String },
    #[serde(rename_all = "camelCase")]
    Opening { at_ms: u64, prequeued: u64, seed_commitment: String, seed: String },
    #[serde(rename_all = "camelCase")]
    Pause { at_ms: u64, source: SaleSource },
    #[serde(rename_all = "camelCase")]
    Resume { at_ms: u64, source: SaleSource },
    #[serde(rename_all = "camelCase")]
    Close { at_ms: u64, source: SaleSource, message: String },
    #[serde(rename_all = "camelCase")]
    Clear { at_ms: u64, source: SaleSource },
    /// A schedule written (`vq sale schedule`, first or again), with the times now in force.
    #[serde(rename_all = "camelCase")]
    Schedule { at_ms: u64, opens_at_ms: u64, prequeue_from_ms: Option<u64>, closes_at_ms: Option<u64> },
    /// The adaptive outflow changed the batch (`from` is `None` at its first decision).
    #[serde(rename_all = "camelCase")]
    Batch { at_ms: u64, from: Option<u64>, to: u64, instance: String, reason: String },
}

impl LedgerEntry {
    pub fn at_ms(&self) -> u64 {
        match self {
            Self::Admission { at_ms, .. }
            | Self::Opening { at_ms, .. }
            | Self::Pause { at_ms, .. }
            | Self::Resume { at_ms, .. }
            | Self::Close { at_ms, .. }
            | Self::Clear { at_ms, .. }
            | Self::Schedule { at_ms, .. }
            | Self::Batch { at_ms, .. } => *at_ms,
        }
    }
}

/// Users admitted in all the ledger's admission rows.
pub fn ledger_admitted(entries: &[LedgerEntry]) -> u64 {
    entries.iter().map(|e| if let LedgerEntry::Admission { admitted, .. } = e { *admitted } else { 0 }).sum()
}
