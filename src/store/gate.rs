//! What the gate asks before it forwards a purchase: one-time use of tokens and proof-of-work
//! challenges, and the pacing of purchases per tick.

use std::future::Future;

use super::{PaceSlot, PacedClaim, StoreError, TokenClaim};
use crate::domain::{AnswerClass, Ms, PurchaseLimits, QueueTarget, Ticks, UserId, Users};

/// A forwarded purchase as the target's record counts it (`SaleOps::record_purchase`): the tick
/// it was sent in and the purchase API's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedPurchase {
    pub tick: u64,
    pub answer: AnswerClass,
}

/// What the gate checks per purchase. Every method is one atomic step.
pub trait GateOps: Send + Sync + 'static {
    /// Counts one purchase against the token's and the user's limits before it is forwarded,
    /// and marks the token used once it made `limits.per_admission` purchases (one-time use at
    /// 1); refuses, counting nothing, a token used up or a user at `limits.per_user`. With
    /// `pace`, first reserves the purchase's place in a tick as [`Self::pace_purchase`] does
    /// (`default_budget`, `tick`, `ahead` as there), in the same step where the user's keys and
    /// the target's pacing share a node (the user's part of the target is the whole target: no
    /// shards, no lanes); a refused claim gives the place back, and with every tick full
    /// nothing is claimed.
    fn claim_token_paced(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        ttl_s: u64,
        limits: PurchaseLimits,
        pace: Option<(Users, Ms, Ticks)>,
    ) -> impl Future<Output = Result<PacedClaim, StoreError>> + Send;

    /// [`Self::claim_token_paced`] without pacing.
    fn claim_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        ttl_s: u64,
        limits: PurchaseLimits,
    ) -> impl Future<Output = Result<TokenClaim, StoreError>> + Send {
        async move {
            match self.claim_token_paced(target, user, token, ttl_s, limits, None).await? {
                PacedClaim::Claim(claim, _) => Ok(claim),
                PacedClaim::Full => {
                    Err(StoreError::Reply { what: "token_claim.lua", detail: "full without pacing".into() })
                }
            }
        }
    }

    /// Undoes a claim after a purchase that did not succeed: the use goes back to the token's
    /// count and the user's (`limits` as the claim was made with).
    fn release_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        previous: Option<String>,
        limits: PurchaseLimits,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Counts a token consumed by a successful purchase: one the queue issued (no longer
    /// waiting to expire unused), or a stateless one; with `recorded`, also counts the purchase
    /// in the target's record as `SaleOps::record_purchase` does, in the same round trip where
    /// the user's part of the target is the whole target (no shards, no lanes).
    fn confirm_token_used(
        &self,
        target: QueueTarget,
        user: UserId,
        through_queue: bool,
        recorded: Option<RecordedPurchase>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Marks `id` (a proof of work's challenge, a release receipt's nonce) used at `target` until `until_ms` (epoch ms,
    /// Redis' clock): true the first time, false while the mark lives.
    fn spend_once(
        &self,
        target: QueueTarget,
        id: &str,
        until_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Whether this token was already used (read-only, for `/gate/verify`).
    fn token_used(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Reserves a place for one purchase in the earliest tick (at most `ahead` ticks later)
    /// whose forwarded purchases are still under the batch size; `None` when all are full.
    fn pace_purchase(
        &self,
        target: QueueTarget,
        default_budget: Users,
        tick: Ms,
        ahead: Ticks,
    ) -> impl Future<Output = Result<Option<PaceSlot>, StoreError>> + Send;
}
