//! The embedded store's gate: the purchase limits of tokens and users (`token_*.lua`), proof-of-work challenges
//! and the pacing of purchases (`gate_pace.lua`). A token's state is typed ([`super::TokenState`]).

use super::{MemoryStore, StoredToken, TokenState};
use crate::domain::{PurchaseLimits, QueueTarget, UserId};
use crate::store::{GateOps, PACE_GUARD_MS, PaceSlot, StoreError, TokenClaim};

impl GateOps for MemoryStore {
    async fn claim_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        ttl_s: u64,
        limits: PurchaseLimits,
    ) -> Result<TokenClaim, StoreError> {
        let now = self.now_ms();
        let key_ttl_ms = self.key_ttl_ms();
        let mut inner = self.lock();
        let t = inner.target(target, now);
        let previous = t.tokens.get(&user).filter(|p| p.expires_at > now).cloned();
        let spent = t.used.entry(user.clone()).or_default();
        spent.retain(|_, exp| *exp > now);
        if previous.as_ref().is_some_and(|p| p.is_used(token)) || spent.contains_key(token) {
            return Ok(TokenClaim::AlreadyUsed);
        }
        let expires_at = now + ttl_s.max(1) * 1000;
        // The caller gets the previous token's text back (to hand to `release_token`); what it
        // was, typed, stays here.
        let shown = previous.as_ref().map(|p| p.token.clone());
        if limits.per_user > 0 {
            let (bought, until) = &mut t.bought;
            if *until <= now {
                bought.clear();
            }
            let n = bought.entry(user.clone()).or_default();
            if *n >= limits.per_user {
                return Ok(TokenClaim::UserLimit);
            }
            *n += 1;
            *until = now + key_ttl_ms;
        }
        if limits.per_admission > 1 {
            let (counts, until) = t.uses.entry(user.clone()).or_default();
            if *until <= now {
                counts.clear();
            }
            *until = (*until).max(expires_at);
            let n = counts.entry(token.to_owned()).or_default();
            *n += 1;
            if *n < limits.per_admission {
                return Ok(TokenClaim::Claimed { previous: shown });
            }
        }
        t.used.entry(user.clone()).or_default().insert(token.to_owned(), expires_at);
        let claimed = StoredToken {
            token: token.to_owned(),
            state: TokenState::Used,
            expires_at,
            replaced: previous.map(Box::new),
        };
        t.tokens.insert(user, claimed);
        Ok(TokenClaim::Claimed { previous: shown })
    }

    async fn release_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        previous: Option<String>,
        limits: PurchaseLimits,
    ) -> Result<(), StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let Some(t) = inner.existing(target, now) else { return Ok(()) };
        if let Some(spent) = t.used.get_mut(&user) {
            spent.remove(token);
        }
        // A count is never taken below zero (expired or cleared since the claim).
        if limits.per_admission > 1
            && let Some((counts, until)) = t.uses.get_mut(&user)
            && *until > now
            && let Some(n) = counts.get_mut(token)
        {
            *n = n.saturating_sub(1);
        }
        if limits.per_user > 0
            && t.bought.1 > now
            && let Some(n) = t.bought.0.get_mut(&user)
        {
            *n = n.saturating_sub(1);
        }
        let Some(claimed) = t.tokens.remove(&user) else { return Ok(()) };
        if !claimed.is_used(token) {
            t.tokens.insert(user, claimed);
        } else if let (Some(_), Some(replaced)) = (previous, claimed.replaced) {
            // Back to what the token was, for as long as the claim would have lived.
            t.tokens.insert(user, StoredToken { expires_at: claimed.expires_at, ..*replaced });
        }
        Ok(())
    }

    async fn confirm_token_used(
        &self,
        target: QueueTarget,
        user: UserId,
        through_queue: bool,
    ) -> Result<(), StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let t = inner.target(target, now);
        let q = &mut t.queue;
        if through_queue {
            q.tokens_used += 1;
            t.unused.remove(&user);
        } else {
            q.direct_tokens_used += 1;
        }
        let r = inner.record(target, now);
        if through_queue {
            r.tokens_used += 1;
        } else {
            r.direct_tokens_used += 1;
        }
        Ok(())
    }

    async fn spend_once(&self, target: QueueTarget, id: &str, until_ms: u64) -> Result<bool, StoreError> {
        let now = self.now_ms();
        let mut inner = self.lock();
        let spent = &mut inner.target(target, now).spent;
        spent.retain(|_, until| *until > now);
        if spent.contains_key(id) {
            return Ok(false);
        }
        spent.insert(id.to_owned(), until_ms);
        Ok(true)
    }

    async fn token_used(&self, target: QueueTarget, user: UserId, token: &str) -> Result<bool, StoreError> {
        let now = self.now_ms();
        let inner = self.lock();
        let Some(t) = inner.targets.get(&target) else { return Ok(false) };
        let spent = t.used.get(&user).and_then(|s| s.get(token)).is_some_and(|exp| *exp > now);
        Ok(spent || t.tokens.get(&user).is_some_and(|s| s.expires_at > now && s.is_used(token)))
    }

    async fn pace_purchase(
        &self,
        target: QueueTarget,
        default_budget: u64,
        tick_ms: u64,
        ahead: u64,
    ) -> Result<Option<PaceSlot>, StoreError> {
        let now = self.now_ms();
        let tick_ms = tick_ms.max(1);
        let first = (now + PACE_GUARD_MS) / tick_ms;
        let mut inner = self.lock();
        let budget = inner.targets.get(&target).and_then(|t| t.batch_override).unwrap_or(default_budget);
        inner.forwarded.retain(|(_, tick), _| *tick + 3 > first);
        for tick in first..=first + ahead {
            let n = inner.forwarded.entry((target, tick)).or_default();
            if *n < budget {
                *n += 1;
                return Ok(Some(PaceSlot {
                    starts_in_ms: (tick * tick_ms).saturating_sub(now),
                    ends_in_ms: ((tick + 1) * tick_ms).saturating_sub(now),
                }));
            }
        }
        Ok(None)
    }
}
