//! The adaptive outflow's storage on Redis: the purchase observations per interval and buyer
//! (`outflow_observe.lua`), the claim
//! of an interval's decision (`outflow_claim.lua`), the decision with its ledger row
//! (`outflow_set.lua`), and the counts it reads: active buyers, tokens expired (each added up
//! over a sharded target's shards).

use super::RedisStore;
use super::codec;
use super::keys;
use super::layout::*;
use super::scripts::{ACTIVE_COUNT, ACTIVE_COUNT_KEYS, TOKENS_EXPIRE, TOKENS_EXPIRE_KEYS};
use super::scripts::{OUTFLOW_CLAIM, OUTFLOW_OBSERVE, OUTFLOW_SET, OUTFLOW_SET_KEYS, on_target};
use super::slices::TOKENS_EXPIRE_SLICE;
use crate::domain::{BuyerObservation, Observations, QueueTarget, UserId};
use crate::store::OutflowOps;
use crate::store::{BatchChange, OutflowClaim, OutflowState, StoreError, TokensEnded};

/// How long an interval's observations stay: a few intervals, as the pump reads the one just
/// ended.
const OBSERVATIONS_KEEP_S: u64 = 600;

impl OutflowOps for RedisStore {
    async fn observe_purchase(
        &self,
        target: QueueTarget,
        interval: u64,
        buyer: &UserId,
        seen: BuyerObservation,
        keep_s: u64,
    ) -> Result<(), StoreError> {
        let _: u64 = OUTFLOW_OBSERVE
            .key(&outflow_observe_keys(target, interval)[..])
            .args(&OutflowObserveArgs {
                buyer: buyer.as_str(),
                bucket: seen.bucket,
                error: u8::from(seen.error),
                backoff: u8::from(seen.backoff),
                observations_ttl_s: OBSERVATIONS_KEEP_S,
                buyers_ttl_s: keep_s.max(1),
            })
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }

    async fn claim_outflow(&self, target: QueueTarget, interval: u64) -> Result<OutflowClaim, StoreError> {
        let reply: Vec<String> = OUTFLOW_CLAIM
            .key(&outflow_claim_keys(target, interval)[..])
            .args(&OutflowClaimArgs { interval, key_ttl_s: self.limits.key_ttl_s })
            .invoke_async(&mut self.conn())
            .await?;
        let bad = || StoreError::Reply { what: "outflow_claim.lua", detail: format!("unexpected reply {reply:?}") };
        let current = |v: Option<&String>| v.and_then(|b| b.parse().ok());
        match reply.first().map(String::as_str) {
            Some("pinned") => Ok(OutflowClaim::Pinned),
            Some("decided") => Ok(OutflowClaim::Decided { current: current(reply.get(1)) }),
            Some("decide") if reply.len() >= 7 => {
                let num = |i: usize| reply[i].parse::<u64>().ok();
                let mut counters = TokensEnded { used: num(5).ok_or_else(bad)?, expired: num(6).ok_or_else(bad)? };
                // The claim read shard 0's counters; a sharded target's tokens end on every shard.
                for part in self.parts(target).into_iter().skip(1) {
                    let (used, expired): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
                        .arg(keys::of(part, "waits"))
                        .arg("tokens_used")
                        .arg("tokens_expired")
                        .query_async(&mut self.conn())
                        .await?;
                    counters.used += used.unwrap_or(0);
                    counters.expired += expired.unwrap_or(0);
                }
                let ended = num(2).zip(num(3)).map(|(used, expired)| counters.since(TokensEnded { used, expired }));
                let no_show_bp = num(4);
                let mut seen = Observations::default();
                for pair in reply[7..].chunks(2) {
                    let [field, value] = pair else { return Err(bad()) };
                    let n: u64 = value.parse().map_err(|_| bad())?;
                    match field.as_str() {
                        "n" => seen.purchases = n,
                        "e" => seen.errors = n,
                        "b" => seen.backoffs = n,
                        l => {
                            if let Some(k) = l.strip_prefix('l').and_then(|k| k.parse::<usize>().ok())
                                && k < seen.latency.len()
                            {
                                seen.latency[k] = n;
                            }
                        }
                    }
                }
                Ok(OutflowClaim::Decide { current: current(reply.get(1)), seen, no_show_bp, ended, counters })
            }
            _ => Err(bad()),
        }
    }

    async fn set_outflow(
        &self,
        target: QueueTarget,
        state: &OutflowState,
        change: Option<BatchChange>,
    ) -> Result<(), StoreError> {
        let row = change.map_or_else(String::new, |c| {
            codec::encode_batch_row(state.decided_at_ms, c.from, state.batch, &c.instance, &state.reason)
        });
        let mut call = on_target(&OUTFLOW_SET, target, OUTFLOW_SET_KEYS);
        call.args(&OutflowSetArgs {
            key_ttl_s: self.limits.key_ttl_s,
            row: &row,
            events_max: self.limits.events.max_len,
            events_ttl_s: self.limits.record_ttl_s,
        });
        for (field, value) in codec::encode_outflow(state) {
            call.arg(field).arg(value);
        }
        let _: u64 = call.invoke_async(&mut self.conn()).await?;
        Ok(())
    }

    async fn active_buyers(&self, target: QueueTarget) -> Result<u64, StoreError> {
        let mut n = 0;
        for part in self.parts(target) {
            let c: u64 = on_target(&ACTIVE_COUNT, part, ACTIVE_COUNT_KEYS)
                .args(&ActiveCountArgs {})
                .invoke_async(&mut self.conn())
                .await?;
            n += c;
        }
        Ok(n)
    }

    async fn expire_tokens(&self, target: QueueTarget) -> Result<u64, StoreError> {
        // Calls of TOKENS_EXPIRE_SLICE while one finds a full slice, at most
        // TOKENS_EXPIRE_CALLS a tick: a larger backlog is counted over the next ticks.
        const TOKENS_EXPIRE_CALLS: u64 = 16;
        let mut expired = 0;
        for part in self.parts(target) {
            for _ in 0..TOKENS_EXPIRE_CALLS {
                let n: u64 = on_target(&TOKENS_EXPIRE, part, TOKENS_EXPIRE_KEYS)
                    .args(&TokensExpireArgs { max: TOKENS_EXPIRE_SLICE })
                    .invoke_async(&mut self.conn())
                    .await?;
                expired += n;
                if n < TOKENS_EXPIRE_SLICE {
                    break;
                }
            }
        }
        Ok(expired)
    }
}
