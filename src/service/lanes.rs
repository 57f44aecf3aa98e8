//! Entering a lane: the proof a buyer brings (an access code, a claim the shop signed) checked,
//! the lane joined (`lane_join.lua`), a place in the public lane given up, then the enter.

use super::{QueueError, QueueService, QueueStatus};
use crate::domain::{LaneName, QueueTarget, UserId};
use crate::store::JoinOutcome;

/// What a buyer shows to join a lane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaneProof {
    /// An access code the shop issued (`vq lane codes import`).
    Code(String),
    /// A lane claim the shop signed (`crate::lane`).
    Claim(String),
}

impl QueueService {
    /// An enter with a proof of a lane: a wrong, used or expired proof is refused (the buyer
    /// keeps whatever place they hold); a valid one puts the buyer in its lane, moving them
    /// out of the public lane if they waited there (one place per user), then enters.
    pub async fn enter_with(
        &self,
        target: QueueTarget,
        user: &UserId,
        proof: Option<LaneProof>,
    ) -> Result<QueueStatus, QueueError> {
        let Some(proof) = proof else { return self.enter(target, user).await };
        // The queue off for this user, or Redis silent: the usual answer, no lane needed.
        if self.bypass_store(target, user).is_some() {
            return self.enter(target, user).await;
        }
        // Proofs are rare (once per buyer): the target's lanes are read afresh, so a lane added
        // since the last refresh is joinable at once.
        if let Err(e) = self.bounded(target, self.store.refresh_target_lanes(target)).await {
            return self.failed("enter", target, user, &e);
        }
        let lanes = self.store.lanes_of(target);
        let (hash, lane) = match &proof {
            LaneProof::Code(code) => {
                if lanes.is_empty() || !crate::lane::is_code(code) {
                    return Err(QueueError::LaneCodeInvalid(target));
                }
                (crate::lane::code_hash(target, code), None)
            }
            LaneProof::Claim(claim) => {
                let key = self.settings.type_lane_secret(target.kind);
                let lane = crate::lane::verify_claim(key.as_deref(), target, user, claim, self.now_s())
                    .map_err(|e| QueueError::LaneClaimInvalid(e.to_string()))?;
                if !lanes.iter().any(|l| l.name == lane) {
                    return Err(QueueError::LaneClaimInvalid(format!("{target} has no lane `{lane}`")));
                }
                (String::new(), Some(lane))
            }
        };
        let before = match self.bounded(target, self.store.user_lane(target, user)).await {
            Ok(l) => l,
            Err(e) => return self.failed("enter", target, user, &e),
        };
        let joined = match self.bounded(target, self.store.join_lane(target, user, &hash, lane)).await {
            Ok(JoinOutcome::Joined(l)) => l,
            Ok(JoinOutcome::Used) => return Err(QueueError::LaneCodeUsed),
            Ok(JoinOutcome::Unknown) => {
                return Err(match proof {
                    LaneProof::Code(_) => QueueError::LaneCodeInvalid(target),
                    LaneProof::Claim(_) => QueueError::LaneClaimInvalid(format!("{target} has no such lane")),
                });
            }
            Err(e) => return self.failed("enter", target, user, &e),
        };
        if before == LaneName::PUBLIC
            && !joined.is_public()
            && let Err(e) = self.bounded(target, self.store.leave_public(target, user)).await
        {
            self.degraded.missed("lane move", target, &e);
        }
        self.enter(target, user).await
    }

    /// The lane `user` waits in at `target` (public for a target without lanes, asked of
    /// Redis only for one with lanes); `None` when the store cannot tell.
    pub async fn lane_of(&self, target: QueueTarget, user: &UserId) -> Option<LaneName> {
        if !self.store.has_lanes(target) {
            return Some(LaneName::PUBLIC);
        }
        self.bounded(target, self.store.user_lane(target, user)).await.ok()
    }
}
