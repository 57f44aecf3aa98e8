//! The gate's operations on Redis: the purchase limits of tokens and users (`token_claim.lua`,
//! `token_release.lua`), proof-of-work spends, and the pacing of purchases into ticks
//! (`gate_pace.lua`).

use super::RedisStore;
use super::layout::*;
use super::scripts::{GATE_PACE, GATE_PACE_KEYS, TOKEN_CLAIM, TOKEN_RELEASE, on_target, reply_err};
use super::{codec, keys};
use crate::domain::{Ms, PurchaseLimits, QueueTarget, Ticks, UserId, Users};
use crate::store::GateOps;
use crate::store::{PaceSlot, PacedClaim, RecordedPurchase, StoreError, TokenClaim};

impl GateOps for RedisStore {
    // `token_claim.lua`; with `pace` where the user's part is the whole target (its pacing keys
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
        let keys = match pace {
            Some(_) => token_claim_paced_keys(part, &user),
            None => token_claim_keys(part, &user).to_vec(),
        };
        let (budget, tick, ahead) = pace.map_or((0, 0, 0), |(b, t, a)| (b.get(), t.get(), a.get()));
        let r: Vec<String> = TOKEN_CLAIM
            .key(&keys[..])
            .args(&TokenClaimArgs {
                token,
                ttl_s: ttl_s.max(1),
                per_admission: limits.per_admission,
                per_user: limits.per_user,
                user: user.as_str(),
                key_ttl_s: self.limits.key_ttl_s,
                pace_tick_ms: tick,
                pace_budget: budget,
                pace_ahead: ahead,
            })
            .invoke_async(&mut self.conn())
            .await?;
        let ms = |i: usize| r.get(i).and_then(|v| v.parse::<u64>().ok());
        match r.first().map(String::as_str) {
            Some("1") => {
                let previous = r.get(1).filter(|p| !p.is_empty()).cloned();
                let slot = ms(2).zip(ms(3)).map(|(starts_in_ms, ends_in_ms)| PaceSlot { starts_in_ms, ends_in_ms });
                if pace.is_some() && slot.is_none() {
                    return Err(reply_err("token_claim.lua", &r));
                }
                // Forwarded only once a failover cannot lose the mark; otherwise given back, so
                // the buyer can try again with the same token (a place reserved stays taken).
                if let Err(e) = self.replicated(part).await {
                    self.release_token(part, user, token, previous, limits).await?;
                    return Err(e);
                }
                Ok(PacedClaim::Claim(TokenClaim::Claimed { previous }, slot))
            }
            Some("0") => Ok(PacedClaim::Claim(TokenClaim::AlreadyUsed, None)),
            Some("2") => Ok(PacedClaim::Claim(TokenClaim::UserLimit, None)),
            Some("3") if pace.is_some() => Ok(PacedClaim::Full),
            _ => Err(reply_err("token_claim.lua", &r)),
        }
    }
    async fn release_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        previous: Option<String>,
        limits: PurchaseLimits,
    ) -> Result<(), StoreError> {
        let target = self.user_place(target, &user).await?;
        let _: u64 = TOKEN_RELEASE
            .key(&token_claim_keys(target, &user)[..])
            .args(&TokenReleaseArgs {
                token,
                previous: previous.as_deref().unwrap_or_default(),
                per_admission: limits.per_admission,
                per_user: limits.per_user,
                user: user.as_str(),
            })
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }

    async fn confirm_token_used(
        &self,
        target: QueueTarget,
        user: UserId,
        through_queue: bool,
        recorded: Option<RecordedPurchase>,
    ) -> Result<(), StoreError> {
        let part = self.user_place(target, &user).await?;
        let (field, in_record) = if through_queue { ("tokens_used", "tu") } else { ("direct_tokens_used", "tud") };
        let record = keys::of(part, "record");
        // One MULTI (the keys share the part's slot): the counts, and a queue token's place
        // among the unused ones, together; and the purchase's count in the record when the
        // record is the part's own.
        let mut p = redis::pipe();
        p.atomic().hincr(keys::of(part, "waits"), field, 1).ignore().hincr(&record, in_record, 1).ignore();
        let (with, apart) = match recorded {
            Some(r) if part == target => (Some(r), None),
            r => (None, r),
        };
        if let Some(r) = with {
            p.hincr(&record, codec::purchase_field(r.tick, r.answer), 1).ignore();
        }
        p.expire(&record, self.limits.record_ttl_s as i64).ignore();
        if through_queue {
            p.zrem(keys::of(part, "unused"), user.as_str()).ignore();
        }
        let _: () = p.query_async(&mut self.conn()).await?;
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
