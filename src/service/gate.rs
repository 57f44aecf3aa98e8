//! The gate's decision: token check and the claim that keeps the purchase limits (one-time
//! use by default), pacing to one batch per tick, settling the claim after the purchase API
//! answered; and the count of refused purchases the record gets once per tick.

use std::time::Duration;

use super::QueueService;
use crate::domain::{AnswerClass, Ms, PurchaseLimits, PurchaseRefusal, QueueTarget, Ticks, UserId, Users};
use crate::store::prelude::*;
use crate::store::{PaceSlot, PacedClaim, RecordedPurchase, StoreError, StoreErrorKind, TokenClaim};
use crate::token::{self, TokenError};

/// What the gate lets through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatePass {
    /// The queue does not apply to this user and target: no token needed.
    FlagOff,
    /// A valid token; `claim` is the one-time-use mark to settle after the purchase (none when
    /// Redis could not be reached, or for a read-only check).
    Verified { claim: Option<PendingClaim> },
}

/// A token marked used before forwarding; settle it with [`QueueService::settle_claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingClaim {
    target: QueueTarget,
    user: UserId,
    token: String,
    previous: Option<String>,
    /// The limits the claim counted against, to give the use back to the same counts.
    limits: PurchaseLimits,
    /// The purchase's place in a tick, reserved with the claim (`gate.pace`), for
    /// [`QueueService::pace_purchase`]'s first attempt.
    reserved: Option<Reserved>,
}

/// A place in a tick the store reserved, and when this instance asked and heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reserved {
    slot: PaceSlot,
    asked: tokio::time::Instant,
    answered: tokio::time::Instant,
}

/// Why the gate does not let a request through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateDenial {
    #[error(transparent)]
    Token(#[from] TokenError),
    /// Redis answers but this instance could not get the token's claim through in time: the
    /// purchase is not forwarded (never unclaimed), the buyer retries.
    #[error("this instance is overloaded: retry shortly, your entry token stays valid")]
    Overloaded,
    /// The token's use could not be recorded to last (Redis' replicas did not confirm it in
    /// time, `redis.wait_replicas`, or Redis refused the write for lack of memory): a purchase
    /// is forwarded only once it is, so nothing is forwarded; the token stays unused.
    #[error("the queue could not record this purchase ({0}): retry shortly, your entry token stays valid")]
    NotRecorded(&'static str),
    /// The entry token made its `purchases_per_admission` purchases (one-time use at 1).
    #[error(
        "the entry token was already used for {limit} purchase{s} (purchases_per_admission = {limit}): enter the queue again for another",
        s = if *limit == 1 { "" } else { "s" }
    )]
    TokenUsedUp { limit: u64 },
    /// The user made `purchases_per_user` purchases of the target's sale, across re-entries.
    #[error(
        "this user has made {limit} purchase{s} of {target}, the most one user may make in this sale (purchases_per_user = {limit})",
        s = if *limit == 1 { "" } else { "s" }
    )]
    PurchaseLimit { target: QueueTarget, limit: u64 },
    /// The gated route names a target nobody declared: nothing is forwarded.
    #[error("there is no queue for {0}: the target is not declared (vq target add)")]
    UnknownTarget(QueueTarget),
    /// Every tick the purchase may wait for is full (`gate.pace`): nothing claimed.
    #[error(
        "the purchase API takes one batch per tick and the next ticks are full: retry shortly (your entry token is still valid)"
    )]
    Busy,
}

/// When a verified purchase may go to the purchase API (see `gate.pace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Now, inside the tick reserved for it (or unpaced).
    Now,
    /// Every tick the gate may wait for is full.
    Full,
}

/// A paced purchase is forwarded only this long before its tick ends at the latest, so it
/// reaches the purchase API inside that tick (reservations keep twice that from the end).
const PACE_FORWARD_MARGIN_MS: u64 = crate::store::PACE_GUARD_MS / 2;
/// Reservations a purchase may make when pauses keep it from its reserved tick.
const PACE_ATTEMPTS: usize = 3;

/// Whether a gate check marks the token used (a purchase) or only reads (nginx auth_request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimMode {
    Claim,
    CheckOnly,
}

impl QueueService {
    /// The gate's decision for a request to a gated route of `target`: with the flag
    /// applying to this user, the token must be well-formed, signed, unexpired, for this type,
    /// target and user, and not used yet (when Redis answers).
    pub async fn gate_check(
        &self,
        target: QueueTarget,
        user: Option<UserId>,
        token: Option<&str>,
        mode: ClaimMode,
    ) -> Result<GatePass, GateDenial> {
        if !self.is_declared(target) {
            return Err(GateDenial::UnknownTarget(target));
        }
        let flag = self.flag();
        let applies = match &user {
            Some(u) => flag.applies(target, u),
            None => flag.may_apply(target),
        };
        if !applies {
            return Ok(GatePass::FlagOff);
        }
        let verdict = self.verify_and_claim(target, user, token, mode).await;
        let refused = match &verdict {
            Err(GateDenial::Token(e)) => {
                crate::metrics::bypass_attempt();
                if matches!(e, TokenError::Expired { .. }) {
                    crate::metrics::token_expired();
                }
                Some(PurchaseRefusal::NoValidToken)
            }
            Err(GateDenial::TokenUsedUp { .. }) => {
                crate::metrics::bypass_attempt();
                Some(PurchaseRefusal::TokenUsed)
            }
            Err(GateDenial::PurchaseLimit { .. }) => Some(PurchaseRefusal::UserLimit),
            _ => None,
        };
        if let Some(why) = refused {
            self.count_refusal(target, why);
        }
        verdict
    }

    /// Counts a refused purchase of a declared target in this instance, for the next
    /// [`Self::flush_refusals`]: no Redis work on the refusal's path.
    fn count_refusal(&self, target: QueueTarget, why: PurchaseRefusal) {
        let mut counts = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        counts.entry(target).or_default().add(why, 1);
    }

    /// Adds the purchases refused here since the last call to each target's record (one write
    /// per target with refusals): called once per tick off the request path (app.rs) and at
    /// shutdown. A failed write loses those counts, logged.
    pub async fn flush_refusals(&self) {
        let counts = std::mem::take(&mut *self.refusals.lock().unwrap_or_else(|e| e.into_inner()));
        for (target, refused) in counts {
            if let Err(e) = self.bounded(target, self.store.record_refusals(target, refused)).await {
                tracing::debug!(target_queue = %target, error = %e, "refused purchases were not counted in the record");
            }
        }
    }

    async fn verify_and_claim(
        &self,
        target: QueueTarget,
        user: Option<UserId>,
        token: Option<&str>,
        mode: ClaimMode,
    ) -> Result<GatePass, GateDenial> {
        let user = user.ok_or(TokenError::NoUser)?;
        let raw = token.filter(|t| !t.is_empty()).ok_or(TokenError::Missing)?;
        let now = self.now_s();
        let claims = token::verify(&self.secret, raw, target, &user, now)?;
        if self.store.silent_for(target, &user) {
            // Redis is down: HMAC and expiry still hold; one-time use waits for Redis.
            self.degraded.record_skipped();
            return Ok(GatePass::Verified { claim: None });
        }
        let limits = self.settings.type_purchase_limits(target.kind);
        let outcome = match mode {
            ClaimMode::CheckOnly => {
                match self.bounded_for(target, Some(&user), self.store.token_used(target, user.clone(), raw)).await {
                    Ok(true) => return Err(GateDenial::TokenUsedUp { limit: limits.per_admission }),
                    Ok(false) => GatePass::Verified { claim: None },
                    Err(e) => return self.unchecked(target, &user, &e),
                }
            }
            ClaimMode::Claim => {
                let ttl_s = claims.expires_at - now;
                // With pacing, the purchase's first place in a tick is reserved in the same step.
                let pace = self.pace_ask(target);
                let claim = async || {
                    let asked = tokio::time::Instant::now();
                    let claim = self.store.claim_token_paced(target, user.clone(), raw, ttl_s, limits, pace);
                    (self.bounded_for(target, Some(&user), claim).await, asked, tokio::time::Instant::now())
                };
                let mut claimed = claim().await;
                // The connection broke under the claim while Redis answers (a failover moved
                // it): once more, on the connection made again.
                if claimed.0.as_ref().is_err_and(|e| self.connection_broke(target, &user, e)) {
                    claimed = claim().await;
                }
                let (claimed, asked, answered) = claimed;
                match claimed {
                    Ok(PacedClaim::Full) => return Err(GateDenial::Busy),
                    Ok(PacedClaim::Claim(TokenClaim::AlreadyUsed, _)) => {
                        return Err(GateDenial::TokenUsedUp { limit: limits.per_admission });
                    }
                    Ok(PacedClaim::Claim(TokenClaim::UserLimit, _)) => {
                        return Err(GateDenial::PurchaseLimit { target, limit: limits.per_user });
                    }
                    Ok(PacedClaim::Claim(TokenClaim::Claimed { previous }, slot)) => {
                        let reserved = slot.map(|slot| Reserved { slot, asked, answered });
                        GatePass::Verified {
                            claim: Some(PendingClaim {
                                target,
                                user,
                                token: raw.to_owned(),
                                previous,
                                limits,
                                reserved,
                            }),
                        }
                    }
                    Err(e) => return self.unchecked(target, &user, &e),
                }
            }
        };
        Ok(outcome)
    }

    /// A verified token whose one-time use Redis could not check: overloaded (Redis answers,
    /// this instance is behind), the use not confirmed by the replicas or refused for lack of
    /// memory, a connection broken while Redis answers → not forwarded; Redis silent or a
    /// data error of the call (a corrupt key) → HMAC and expiry hold.
    fn unchecked(&self, target: QueueTarget, user: &UserId, e: &StoreError) -> Result<GatePass, GateDenial> {
        let answer = match e {
            StoreError::Busy => Err(GateDenial::Overloaded),
            StoreError::NotReplicated { .. } => Err(GateDenial::NotRecorded("its replica did not confirm it")),
            e if e.is_out_of_memory() => Err(GateDenial::NotRecorded("redis is out of memory")),
            e if self.connection_broke(target, user, e) => {
                // Refused, not forwarded: no purchase went through without its check.
                self.degraded.missed("gate", target, e);
                return Err(GateDenial::NotRecorded("redis did not answer"));
            }
            _ => Ok(GatePass::Verified { claim: None }),
        };
        self.degraded.record("gate", target, e);
        answer
    }

    /// A connection error while the probe finds Redis answering: a connection broken (Redis
    /// restarted or failed over), not an outage to forward unclaimed for.
    fn connection_broke(&self, target: QueueTarget, user: &UserId, e: &StoreError) -> bool {
        e.kind() == StoreErrorKind::Unavailable
            && !e.is_timeout()
            && !matches!(e, StoreError::NotReplicated { .. })
            && !self.store.silent_for(target, user)
    }

    /// The purchase is paced (`gate.pace`): its budget per tick, the tick and how many ticks
    /// ahead it may wait, as the store reserves a place with them.
    fn pace_ask(&self, target: QueueTarget) -> Option<(Users, Ms, Ticks)> {
        let gate = &self.settings.gate;
        if !gate.pace {
            return None;
        }
        // Adaptive outflow: the batch moves up to queue.batch_max, the most the operator says
        // the purchase API takes per tick; pacing caps at that.
        let batch = match self.settings.type_outflow(target.kind) {
            crate::config::Outflow::Adaptive => self.settings.type_batch_bounds(target.kind).1,
            crate::config::Outflow::Fixed => self.batch_size(target.kind, None),
            // Active buyers: at most max_active hold a token, so at most that many buy at once.
            crate::config::Outflow::Active => self.settings.type_max_active(target.kind),
        };
        Some((Users(batch), Ms(self.settings.queue.tick_ms), Ticks(gate.pace_max_ticks)))
    }

    /// Keeps verified purchases within one batch per tick per target (`gate.pace`): reserves a
    /// place (or takes the one `claim` reserved with the token's claim), waits for its tick, and
    /// answers [`Pace::Now`] only while that tick lasts. A process paused past the reserved tick
    /// (a long GC pause, a throttled container) reserves again instead of forwarding late.
    /// Without Redis the purchase goes at once (fail-open; the downstream database is the last
    /// line); an instance too busy to reserve in time (Redis answering) does not forward:
    /// [`Pace::Full`].
    pub async fn pace_purchase(&self, target: QueueTarget, claim: Option<&PendingClaim>) -> Pace {
        let Some((batch, tick, ahead)) = self.pace_ask(target) else { return Pace::Now };
        let mut reserved = claim.and_then(|c| c.reserved);
        if reserved.is_none() && self.store.silent(Some(target)) {
            return Pace::Now;
        }
        for _ in 0..PACE_ATTEMPTS {
            let (slot, asked, answered) = match reserved.take() {
                Some(r) => (Ok(Some(r.slot)), r.asked, r.answered),
                None => {
                    let asked = tokio::time::Instant::now();
                    let slot = self.bounded(target, self.store.pace_purchase(target, batch, tick, ahead)).await;
                    (slot, asked, tokio::time::Instant::now())
                }
            };
            match slot {
                Ok(Some(slot)) => {
                    // Both ends err on the safe side: the start counts from the answer, the
                    // end from the question (Redis' clock read in between).
                    let starts = answered + Duration::from_millis(slot.starts_in_ms);
                    let forward_by =
                        asked + Duration::from_millis(slot.ends_in_ms.saturating_sub(PACE_FORWARD_MARGIN_MS));
                    tokio::time::sleep_until(starts).await;
                    if tokio::time::Instant::now() < forward_by {
                        return Pace::Now;
                    }
                }
                Ok(None) => return Pace::Full,
                Err(e) => {
                    self.degraded.record("gate pace", target, &e);
                    return if matches!(e, StoreError::Busy) { Pace::Full } else { Pace::Now };
                }
            }
        }
        Pace::Full
    }

    /// After the upstream answered: a 2xx consumes the token, anything else gives it back.
    pub async fn settle_claim(&self, claim: PendingClaim, purchase_succeeded: bool) {
        self.settle(claim, purchase_succeeded, None).await;
    }

    /// After the upstream answered a purchase the gate forwarded and the target's record counts
    /// (`record_purchase`, sent in `tick`, `status` the purchase API's or none): settles the
    /// claim, and on a 2xx counts the purchase in the same round trip as the token's use.
    pub async fn settle_purchase(&self, claim: PendingClaim, tick: u64, status: Option<u16>) {
        let answer = status.map_or(AnswerClass::Unreached, AnswerClass::of_status);
        if answer != AnswerClass::Success {
            self.record_purchase(claim.target, tick, status);
            self.settle(claim, false, None).await;
            return;
        }
        self.settle(claim, true, Some(RecordedPurchase { tick, answer })).await;
    }

    async fn settle(&self, claim: PendingClaim, purchase_succeeded: bool, recorded: Option<RecordedPurchase>) {
        let result = if purchase_succeeded {
            // The queue's own token is what the claim found stored for the user.
            let through_queue = claim.previous.as_deref() == Some(claim.token.as_str());
            crate::metrics::token_consumed(through_queue);
            let confirm = self.store.confirm_token_used(claim.target, claim.user, through_queue, recorded);
            self.bounded(claim.target, confirm).await
        } else {
            let release =
                self.store.release_token(claim.target, claim.user, &claim.token, claim.previous, claim.limits);
            self.bounded(claim.target, release).await
        };
        if let Err(e) = result {
            self.degraded.missed("gate settle", claim.target, &e);
        }
    }
}

/// Why `/gate/release` released nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseRefusal {
    #[error(transparent)]
    Receipt(#[from] crate::release::ReceiptError),
    #[error("the release receipt was used already")]
    Spent,
    #[error("the release could not be recorded: the entry token stays used")]
    Store,
}

/// A receipt stays valid this long past `gate.timeout_ms`: the proxy's own wait for the
/// purchase API, measured from the check's answer, plus its way back to vq.
const RELEASE_SLACK_MS: u64 = 2_000;

impl QueueService {
    /// The receipt of a claim `/gate/verify` made, for the proxy to hand back to
    /// `/gate/release` if the purchase API fails: valid `gate.timeout_ms` (and a little) from
    /// now, once.
    pub fn release_receipt(&self, claim: &PendingClaim) -> String {
        let mut random = [0u8; 12];
        // Without randomness every receipt of this claim has the same nonce: still one release.
        let _ = getrandom::fill(&mut random);
        let receipt = crate::release::Receipt {
            until_ms: self.now_ms() + self.settings.gate.timeout_ms + RELEASE_SLACK_MS,
            nonce: crate::release::nonce(random),
            target: claim.target,
            user: claim.user.clone(),
            token: claim.token.clone(),
            previous: claim.previous.clone(),
        };
        crate::release::sign(&self.secret, &receipt)
    }

    /// Gives back the token a receipt names (the purchase API failed after `/gate/verify`
    /// let the purchase through): signed by vq, not expired, and never used before.
    pub async fn release_by_receipt(&self, raw: &str) -> Result<(), ReleaseRefusal> {
        let r = crate::release::verify(&self.secret, raw, self.now_ms())?;
        let id = format!("release:{}", r.nonce);
        match self.bounded(r.target, self.store.spend_once(r.target, &id, r.until_ms)).await {
            Ok(true) => {}
            Ok(false) => return Err(ReleaseRefusal::Spent),
            Err(e) => {
                self.degraded.missed("gate release", r.target, &e);
                return Err(ReleaseRefusal::Store);
            }
        }
        // The receipt does not carry the limits: the ones in force (the same on every instance).
        let limits = self.settings.type_purchase_limits(r.target.kind);
        let release = self.store.release_token(r.target, r.user, &r.token, r.previous, limits);
        self.bounded(r.target, release).await.map_err(|e| {
            self.degraded.missed("gate release", r.target, &e);
            ReleaseRefusal::Store
        })
    }
}
