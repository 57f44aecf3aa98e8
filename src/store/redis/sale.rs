//! A target's sale on Redis: its schedule, controls (pause, resume, close, clear), the
//! opening's frozen pre-queue and placing it, the ledger, and the sale's record.

use std::collections::HashMap;

use redis::AsyncCommands;

use super::RedisStore;
use super::codec;
use super::keys;
use super::layout::*;
use super::scripts::{
    SALE_CONTROL, SALE_CONTROL_KEYS, SALE_PLACE, SALE_PLACE_KEYS, SALE_READ, SALE_READ_KEYS, SALE_SCHEDULE,
    SALE_SCHEDULE_KEYS, num, on_target, reply_err,
};
use super::slices::OPENING_READ_SLICE;
use crate::domain::{
    AnswerClass, LedgerEntry, QueueTarget, Refusals, SaleControl, SaleSchedule, SaleSource, TargetRecord, UserId,
};
use crate::store::{ClearOutcome, PendingOpening, SaleView, ScheduleOutcome, StoreError};
use crate::store::{EventOps, SaleOps};

impl RedisStore {
    /// The sale (with Redis' clock) and the users pre-queued, in one `sale_read.lua` call.
    pub(super) async fn read_sale_and_prequeue(
        &self,
        target: QueueTarget,
    ) -> Result<(Option<SaleView>, u64), StoreError> {
        let r: Vec<String> =
            on_target(&SALE_READ, target, SALE_READ_KEYS).args(&SaleReadArgs {}).invoke_async(&mut self.conn()).await?;
        let now_ms = num("sale_read.lua", &r, 0)?;
        let prequeued = num("sale_read.lua", &r, 1)?;
        let fields: HashMap<String, String> = r[2..].chunks_exact(2).map(|kv| (kv[0].clone(), kv[1].clone())).collect();
        Ok((codec::decode_sale(&fields).map(|record| SaleView { record, now_ms }), prequeued))
    }

    /// One `sale_control.lua` call; `force` matters for a clear only.
    async fn sale_control(
        &self,
        target: QueueTarget,
        action: &str,
        source: SaleSource,
        message: &str,
        force: bool,
    ) -> Result<Vec<String>, StoreError> {
        Ok(on_target(&SALE_CONTROL, target, SALE_CONTROL_KEYS)
            .args(&SaleControlArgs {
                action,
                source: source.as_str(),
                message,
                key_ttl_s: self.limits.key_ttl_s,
                record_ttl_s: self.limits.record_ttl_s,
                force: u8::from(force),
                events_max: self.events_max(target),
            })
            .invoke_async(&mut self.conn())
            .await?)
    }
}

impl RedisStore {
    /// The schedule of `part`: the sale's, opened earlier by its lane's `opens_before_s`
    /// (the pre-queue too, by as much).
    pub(super) fn lane_schedule(&self, target: QueueTarget, part: QueueTarget, s: SaleSchedule) -> SaleSchedule {
        let lane = part.shard.lane;
        let Some(l) = (!lane.is_public()).then(|| self.lanes_of(target).into_iter().find(|l| l.name == lane)).flatten()
        else {
            return s;
        };
        let before = l.opens_before_s * 1000;
        SaleSchedule {
            opens_at_ms: s.opens_at_ms.saturating_sub(before),
            prequeue_from_ms: s.prequeue_from_ms.map(|p| p.saturating_sub(before)),
            closes_at_ms: s.closes_at_ms,
        }
    }

    /// Schedules the parts of `lane` (added after the sale was scheduled) with the sale's
    /// schedule and seed, unless the sale opened already; whether it did.
    pub async fn schedule_lane(&self, target: QueueTarget, lane: crate::domain::LaneName) -> Result<bool, StoreError> {
        let Some(view) = self.read_sale_and_prequeue(target.whole()).await?.0 else { return Ok(false) };
        let r = view.record;
        let (Some(opens_at_ms), Some(seed)) = (r.opens_at_ms, r.seed.as_deref().and_then(crate::domain::unhex)) else {
            return Ok(false);
        };
        let Ok(seed) = <[u8; 32]>::try_from(seed) else { return Ok(false) };
        let schedule = SaleSchedule { opens_at_ms, prequeue_from_ms: r.prequeue_from_ms, closes_at_ms: r.closes_at_ms };
        for part in self.lane_parts(target, lane) {
            self.schedule_part(part, self.lane_schedule(target, part, schedule), seed).await?;
        }
        Ok(true)
    }

    async fn schedule_part(
        &self,
        target: QueueTarget,
        schedule: SaleSchedule,
        seed: [u8; 32],
    ) -> Result<ScheduleOutcome, StoreError> {
        let last_ms = schedule.closes_at_ms.unwrap_or(schedule.opens_at_ms).max(schedule.opens_at_ms);
        let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        let r: Vec<String> = on_target(&SALE_SCHEDULE, target, SALE_SCHEDULE_KEYS)
            .args(&SaleScheduleArgs {
                opens_at_ms: schedule.opens_at_ms,
                prequeue_from_ms: &opt(schedule.prequeue_from_ms),
                closes_at_ms: &opt(schedule.closes_at_ms),
                seed: &crate::domain::hex(&seed),
                commitment: &crate::domain::seed_commitment(&seed),
                expire_at_s: last_ms / 1000 + self.limits.key_ttl_s,
                record_ttl_s: self.limits.record_ttl_s,
                events_max: self.events_max(target),
            })
            .invoke_async(&mut self.conn())
            .await?;
        match r.first().map(String::as_str) {
            Some("1") => Ok(ScheduleOutcome::Scheduled { commitment: r.get(1).cloned().unwrap_or_default() }),
            Some("0") => Ok(ScheduleOutcome::AlreadyOpened { frozen_at_ms: num("sale_schedule.lua", &r, 1)? }),
            _ => Err(reply_err("sale_schedule.lua", &r)),
        }
    }

    async fn control_part(&self, target: QueueTarget, control: &SaleControl) -> Result<bool, StoreError> {
        let (action, source, message) = match &control {
            SaleControl::Pause => ("pause", SaleSource::Command, ""),
            SaleControl::Resume => ("resume", SaleSource::Command, ""),
            SaleControl::Close { message, source } => ("close", *source, message.as_str()),
            SaleControl::Clear => return Ok(self.clear_part(target, true).await? == ClearOutcome::Cleared),
        };
        let r = self.sale_control(target, action, source, message, true).await?;
        Ok(num("sale_control.lua", &r, 0)? == 1)
    }

    async fn clear_part(&self, target: QueueTarget, force: bool) -> Result<ClearOutcome, StoreError> {
        let r = self.sale_control(target, "clear", SaleSource::Command, "", force).await?;
        let outcome = match num("sale_control.lua", &r, 0)? {
            1 => ClearOutcome::Cleared,
            0 => ClearOutcome::NoSale,
            2 => ClearOutcome::Refused {
                opening: num("sale_control.lua", &r, 1)? == 1,
                prequeued: num("sale_control.lua", &r, 2)?,
            },
            _ => return Err(reply_err("sale_control.lua", &r)),
        };
        Ok(outcome)
    }
}

impl SaleOps for RedisStore {
    async fn schedule_sale(
        &self,
        target: QueueTarget,
        schedule: SaleSchedule,
        seed: [u8; 32],
    ) -> Result<ScheduleOutcome, StoreError> {
        let mut parts = self.parts(target).into_iter();
        let first = parts.next().expect("a target has a shard 0");
        let outcome = self.schedule_part(first, schedule, seed).await?;
        if let ScheduleOutcome::Scheduled { .. } = &outcome {
            // One seed for every shard: shard 0's, which a schedule changed before the
            // opening keeps.
            let fields: HashMap<String, String> = self.conn().hgetall(keys::of(first, "sale")).await?;
            let seed = fields
                .get("seed")
                .and_then(|s| crate::domain::unhex(s))
                .and_then(|s| <[u8; 32]>::try_from(s).ok())
                .unwrap_or(seed);
            for part in parts {
                self.schedule_part(part, self.lane_schedule(target, part, schedule), seed).await?;
            }
            // Another slot than the target's keys on a cluster: a command of its own.
            let _: u64 = self.conn().sadd(keys::SALES, target.to_string()).await?;
            self.register_event_logs(&[target]).await?;
        }
        Ok(outcome)
    }

    /// A sharded target's sale is shard 0's, with the users frozen at the opening added up
    /// over the shards, and opened once every shard's order is written.
    async fn read_sale(&self, target: QueueTarget) -> Result<Option<SaleView>, StoreError> {
        let mut parts = self.parts(target).into_iter();
        let first = parts.next().expect("a target has a shard 0");
        let Some(mut view) = self.read_sale_and_prequeue(first).await?.0 else { return Ok(None) };
        for part in parts {
            let other = self.read_sale_and_prequeue(part).await?.0.map(|v| v.record);
            let (prequeued, opened) = other.map_or((None, None), |r| (r.prequeued, r.opened_at_ms));
            let sale = &mut view.record;
            sale.prequeued = match (sale.prequeued, prequeued) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            sale.opened_at_ms = sale.opened_at_ms.zip(opened).map(|(a, b)| a.max(b));
        }
        Ok(Some(view))
    }

    async fn control_sale(&self, target: QueueTarget, control: SaleControl) -> Result<bool, StoreError> {
        // Shard 0 (the target's own, which the sale is read from) first, then the others.
        let mut changed = false;
        for part in self.parts(target) {
            changed |= self.control_part(part, &control).await?;
        }
        if changed {
            self.register_event_logs(&[target]).await?;
        }
        Ok(changed)
    }

    async fn clear_sale(&self, target: QueueTarget, force: bool) -> Result<ClearOutcome, StoreError> {
        let parts = self.parts(target);
        if !force && parts.len() > 1 {
            // Refused if any shard would refuse: checked on all before any is cleared.
            let (mut opening, mut prequeued) = (false, 0);
            for part in &parts {
                let (sale, n) = self.read_sale_and_prequeue(*part).await?;
                prequeued += n;
                opening |= sale.is_some_and(|s| {
                    s.record.prequeued.is_some() && s.record.opened_at_ms.is_none() && !s.record.closed
                });
            }
            if opening || prequeued > 0 {
                return Ok(ClearOutcome::Refused { opening, prequeued });
            }
        }
        let mut outcome = ClearOutcome::NoSale;
        for part in parts {
            match self.clear_part(part, force).await? {
                ClearOutcome::Cleared => outcome = ClearOutcome::Cleared,
                r @ ClearOutcome::Refused { .. } => return Ok(r),
                ClearOutcome::NoSale => {}
            }
        }
        // Another slot than the target's keys on a cluster: a command of its own (also when
        // the sale's hash had expired and only this listing was left).
        let _: u64 = self.conn().srem(keys::SALES, target.to_string()).await?;
        if outcome == ClearOutcome::Cleared {
            self.register_event_logs(&[target]).await?;
        }
        Ok(outcome)
    }

    async fn target_record(&self, target: QueueTarget) -> Result<Option<TargetRecord>, StoreError> {
        let fields = self.record_fields(target).await?;
        if fields.is_empty() {
            return Ok(None);
        }
        Ok(Some(codec::decode_record(fields.iter().map(|(f, v)| (f.as_str(), v.as_str())))))
    }

    async fn record_purchase(&self, target: QueueTarget, tick: u64, answer: AnswerClass) -> Result<(), StoreError> {
        let key = keys::of(target, "record");
        let _: () = redis::pipe()
            .hincr(&key, codec::purchase_field(tick, answer), 1)
            .ignore()
            .expire(&key, self.limits.record_ttl_s as i64)
            .ignore()
            .query_async(&mut self.conn())
            .await?;
        Ok(())
    }

    async fn record_refusals(&self, target: QueueTarget, refused: Refusals) -> Result<(), StoreError> {
        let key = keys::of(target, "record");
        let mut p = redis::pipe();
        for (why, n) in refused.counted() {
            p.hincr(&key, codec::refusal_field(why), n).ignore();
        }
        let _: () = p.expire(&key, self.limits.record_ttl_s as i64).ignore().query_async(&mut self.conn()).await?;
        Ok(())
    }

    async fn sale_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        let members: Vec<String> = self.conn().smembers(keys::SALES).await?;
        Ok(members.iter().filter_map(|m| m.parse().ok()).collect())
    }

    async fn pending_opening(&self, target: QueueTarget) -> Result<Option<PendingOpening>, StoreError> {
        let mut conn = self.conn();
        let fields: HashMap<String, String> = conn.hgetall(keys::of(target, "sale")).await?;
        let Some(sale) = codec::decode_sale(&fields) else { return Ok(None) };
        // The seq the frozen users' places start after: the opening's own field.
        let base = fields.get("base").and_then(|v| v.parse::<u64>().ok());
        let (Some(frozen), Some(base), Some(opens_at_ms)) = (sale.prequeued, base, sale.opens_at_ms) else {
            return Ok(None);
        };
        // A closed sale admits nobody again: its pre-queue is never ordered.
        if sale.opened_at_ms.is_some() || sale.closed {
            return Ok(None);
        }
        let bad = |detail: String| StoreError::Reply { what: "sale opening", detail };
        let seed =
            sale.seed.as_deref().and_then(crate::domain::unhex).ok_or_else(|| bad("the sale has no seed".into()))?;
        // The frozen set does not change: read it in slices so no one reply blocks Redis long.
        let mut users = Vec::with_capacity(usize::try_from(frozen).unwrap_or(0));
        let mut from = 0;
        while from < frozen {
            let part: Vec<String> = conn
                .zrange(keys::of(target, "opening"), from as isize, (from + OPENING_READ_SLICE - 1) as isize)
                .await?;
            if part.is_empty() {
                break;
            }
            from += part.len() as u64;
            for u in part {
                users.push(u.parse::<UserId>().map_err(|e| bad(format!("the frozen pre-queue holds {e}")))?);
            }
        }
        if users.len() as u64 != frozen {
            // Another pump finished the opening (and unlinked the set) meanwhile.
            let done: bool = conn.hexists(keys::of(target, "sale"), "opened_at").await?;
            if done {
                return Ok(None);
            }
            return Err(bad(format!("frozen pre-queue holds {} users, the sale says {frozen}", users.len())));
        }
        Ok(Some(PendingOpening { base, seed, opens_at_ms, users }))
    }

    async fn place_opening(
        &self,
        target: QueueTarget,
        places: &[(u64, UserId)],
        opens_at_ms: u64,
        last: bool,
    ) -> Result<bool, StoreError> {
        let mut inv = on_target(&SALE_PLACE, target, SALE_PLACE_KEYS);
        inv.args(&SalePlaceArgs {
            last: if last { "1" } else { "0" },
            opens_at_ms,
            key_ttl_s: self.limits.key_ttl_s,
            record_ttl_s: self.limits.record_ttl_s,
            events_max: self.events_max(target),
        });
        for (seq, user) in places {
            inv.arg(*seq).arg(user.as_str());
        }
        let applied: u64 = inv.invoke_async(&mut self.conn()).await?;
        Ok(applied == 1)
    }

    /// A sharded target's ledger is shard 0's with every other shard's admission rows (each
    /// with its shard's marks) and their users frozen at the opening added to shard 0's
    /// opening row; newest first.
    async fn sale_ledger(&self, target: QueueTarget) -> Result<Vec<LedgerEntry>, StoreError> {
        let mut all = Vec::new();
        for (i, part) in self.parts(target).into_iter().enumerate() {
            let rows: Vec<String> = self.conn().lrange(keys::of(part, "ledger"), 0, -1).await?;
            let rows = rows.iter().filter_map(|r| codec::decode_ledger_row(r));
            if i == 0 {
                all.extend(rows);
                continue;
            }
            for row in rows {
                match row {
                    LedgerEntry::Admission { .. } => all.push(row),
                    LedgerEntry::Opening { prequeued: more, .. } => {
                        if let Some(LedgerEntry::Opening { prequeued, .. }) =
                            all.iter_mut().find(|r| matches!(r, LedgerEntry::Opening { .. }))
                        {
                            *prequeued += more;
                        }
                    }
                    _ => {}
                }
            }
        }
        all.sort_by_key(|r| std::cmp::Reverse(r.at_ms()));
        Ok(all)
    }
}
