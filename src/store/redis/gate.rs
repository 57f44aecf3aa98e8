//! The gate's operations on Redis: the purchase limits of tokens and users (`token_claim.lua`,
//! `token_release.lua`), proof-of-work spends, and the pacing of purchases into ticks
//! (`gate_pace.lua`).

use std::time::Duration;

use super::RedisStore;
use super::claims;
use super::keys;
use super::layout::*;
use super::scripts::{GATE_PACE, GATE_PACE_KEYS, on_target};
use crate::domain::{Ms, PurchaseLimits, QueueTarget, Ticks, UserId, Users};
use crate::store::GateOps;
use crate::store::coalesce::Coalescer;
use crate::store::{PaceSlot, PacedClaim, RecordedPurchase, StoreError};

impl GateOps for RedisStore {
    // `token_claim.lua`, in a call shared with the other claims of the user's part of the
    // target (`claims.rs`); with `pace` where that part is the whole target (its pacing keys
    // then share the user's slot).
    async fn claim_token_paced(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        ttl_s: u64,
        limits: PurchaseLimits,
        pace: Option<(Users, Ms, Ticks)>,
    ) -> Result<PacedClaim, StoreError> {
        let part = self.user_place(target, &user).await?;
        let pace = pace.filter(|_| part == target);
        let lanes = self.claims.get_or_init(|| {
            let ctx = claims::Ctx {
                conn: self.conn.clone(),
                durable: self.durable.clone(),
                pulse: self.pulse.clone(),
                key_ttl_s: self.limits.key_ttl_s,
            };
            Coalescer::spawn(self.limits.coalesce_wait, move |lane, jobs| claims::execute(ctx.clone(), lane, jobs))
        });
        let lane = claims::Lane { part, limits, pace };
        lanes.ask(lane, |reply| claims::Job { user, token: token.to_owned(), ttl_s, reply }).await
    }
    async fn release_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        previous: Option<String>,
        limits: PurchaseLimits,
    ) -> Result<(), StoreError> {
        let part = self.user_place(target, &user).await?;
        claims::release(&mut self.conn(), part, &user, token, previous.as_deref(), limits).await
    }

    async fn confirm_token_used(
        &self,
        target: QueueTarget,
        user: UserId,
        through_queue: bool,
        recorded: Option<RecordedPurchase>,
    ) -> Result<(), StoreError> {
        let part = self.user_place(target, &user).await?;
        // The purchase's count goes in the same MULTI where the record is the part's own.
        let (with, apart) = match recorded {
            Some(r) if part == target => (Some(r), None),
            r => (None, r),
        };
        let lanes = self.settled.get_or_init(|| {
            let (conn, ttl) = (self.conn.clone(), self.limits.record_ttl_s);
            Coalescer::spawn(Duration::ZERO, move |part, jobs| claims::settle(conn.clone(), ttl, part, jobs))
        });
        lanes.ask(part, |reply| claims::Settled { user, through_queue, recorded: with, reply }).await?;
        if let Some(r) = apart {
            crate::store::SaleOps::record_purchase(self, target, r.tick, r.answer).await?;
        }
        Ok(())
    }

    async fn spend_once(&self, target: QueueTarget, id: &str, until_ms: u64) -> Result<bool, StoreError> {
        let set: Option<String> = redis::cmd("SET")
            .arg(keys::of(target, &format!("pow:{id}")))
            .arg(1)
            .arg("NX")
            .arg("PXAT")
            .arg(until_ms)
            .query_async(&mut self.conn())
            .await?;
        Ok(set.is_some())
    }

    async fn token_used(&self, target: QueueTarget, user: UserId, token: &str) -> Result<bool, StoreError> {
        let target = self.user_place(target, &user).await?;
        let (v, score): (Option<String>, Option<f64>) = redis::pipe()
            .get(keys::token(target, &user))
            .zscore(keys::used_tokens(target, &user), token)
            .query_async(&mut self.conn())
            .await?;
        // A member past its expiry belongs to an expired token, which verify refused already.
        Ok(score.is_some() || v.is_some_and(|v| keys::used_token(&v) == Some(token)))
    }

    async fn pace_purchase(
        &self,
        target: QueueTarget,
        default_budget: Users,
        tick: Ms,
        ahead: Ticks,
    ) -> Result<Option<PaceSlot>, StoreError> {
        let (default_budget, tick_ms, ahead) = (default_budget.get(), tick.get(), ahead.get());
        let r: Vec<u64> = on_target(&GATE_PACE, target, GATE_PACE_KEYS)
            .args(&GatePaceArgs { tick_ms, default_budget, ahead })
            .invoke_async(&mut self.conn())
            .await?;
        match r.as_slice() {
            [1, starts_in_ms, ends_in_ms] => {
                Ok(Some(PaceSlot { starts_in_ms: *starts_in_ms, ends_in_ms: *ends_in_ms }))
            }
            [0, _] => Ok(None),
            _ => Err(StoreError::Reply { what: "gate_pace.lua", detail: format!("{r:?}") }),
        }
    }
}
