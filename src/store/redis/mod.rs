//! The Redis store: the key contract (README, Redis) and one Lua script per atomic operation.
//!
//! Every key of a target carries the hash tag `{TYPE:id}`, so each script touches one slot.
//! `queue:active`, the flag and the global batch size are outside any target's slot and are
//! never touched by a target's script.
//!
//! One server or a Redis Cluster: [`RedisStore`] talks through [`Conn`], which is either a
//! `ConnectionManager` or a lazily opened cluster connection, so the scripts and the key
//! contract are the same code in both modes. No command here may need more than one slot, and
//! none may depend on seeing the whole keyspace (no KEYS, no SCAN).
//!
//! One file (over 400 lines): the `QueueStore` impl, one method per operation, each a few
//! lines building one script call; the keys, scripts, connection and coalesced calls live in
//! the sibling modules.
//!
//! Layout: this file holds [`RedisStore`] and its `QueueStore` impl (one method per store
//! operation, which is why it is long); `keys.rs` the key names, `scripts.rs` the scripts and
//! their invocation, `conn.rs` the connection (one server or cluster), `coalesced.rs` the shared
//! enter/poll calls and their per-user answers.

mod coalesced;
mod conn;
mod error;
mod fence;
mod flag_ack;
pub mod keys;
mod pulse;
mod scripts;
mod view;

pub use self::view::{TargetView, ViewSync};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;

use self::coalesced::{Answer, Job, Op};
use self::conn::{Conn, LazyCluster};
use self::fence::Fences;
use self::pulse::Pulse;
use self::scripts::{
    ACTIVE_COUNT, ACTIVE_COUNT_KEYS, ADMIT, ADMIT_KEYS, EVICT, EVICT_KEYS, FLAG_ACK, FLAG_ACKS, FLAG_SET, GATE_PACE,
    GATE_PACE_KEYS, LEAVE, LEAVE_KEYS, OUTFLOW_CLAIM, OUTFLOW_SET, OUTFLOW_SET_KEYS, SALE_CONTROL, SALE_CONTROL_KEYS,
    SALE_PLACE, SALE_PLACE_KEYS, SALE_READ, SALE_READ_KEYS, SALE_SCHEDULE, SALE_SCHEDULE_KEYS, TOKEN_CLAIM,
    TOKEN_RELEASE, TOKENS_EXPIRE, TOKENS_EXPIRE_KEYS, USER_HOLD, num, on_target, reply_err,
};
use super::coalesce::Coalescer;
use super::{
    AdmitOutcome, BUSY_WAIT_MAX, BatchChange, Candidate, ClearOutcome, DeclareOutcome, EnterOutcome, FLAG_ACK_KEEP_MS,
    FlagAck, FlagOps, GateOps, LEDGER_MAX_ROWS, OutflowClaim, OutflowOps, OutflowState, PaceSlot, PendingOpening,
    QueueOps, SaleOps, SaleView, ScheduleOutcome, StatusOutcome, StoreError, StoreLimits, TargetOps, TargetSnapshot,
    TokenClaim, TokensEnded,
};
use crate::domain::{
    AnswerClass, FlagChange, FlagFields, FlagState, LedgerEntry, Observations, QueueTarget, SaleControl, SaleRecord,
    SaleSchedule, TargetRecord, UserId, WaitHistogram,
};

/// Production store on one Redis server or a Redis Cluster.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    limits: StoreLimits,
    /// Enters and polls go out coalesced per target (see [`Coalescer`]); started at first use,
    /// on the runtime of the caller.
    lanes: Arc<OnceLock<Coalescer<(Op, QueueTarget), Job>>>,
    /// Whether Redis answers and what time it is there, from a thread of its own.
    pulse: Arc<Pulse>,
    /// What this instance has seen of each target's counters, sent with the scripts so that a
    /// failover that lost writes never takes them back (`fence.rs`).
    fences: Arc<Fences>,
}

impl RedisStore {
    /// Connects lazily: `vq serve` starts (and fails open) even while Redis is down, and the
    /// manager reconnects by itself. `timeout` bounds connecting; a command's answer may take
    /// up to [`BUSY_WAIT_MAX`] (the request path decides when to stop waiting:
    /// `QueueService::bounded`).
    pub fn connect(url: &str, limits: StoreLimits, timeout: Duration) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout.max(BUSY_WAIT_MAX)))
            .set_connection_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        let pulse = Arc::new(Pulse::start(&[url.to_owned()], false)?);
        let fences = Arc::new(Fences::new(limits.key_ttl_s));
        Ok(Self { conn: Conn::Single(conn), limits, lanes: Arc::default(), pulse, fences })
    }

    /// Redis Cluster mode: `nodes` are some of the cluster's nodes (`redis://host:port`), the
    /// rest is discovered. Connects lazily too, at the first command, and again after a failed
    /// attempt (at most every `conn::CLUSTER_RETRY_AFTER`, so a dead cluster causes no storm).
    pub fn connect_cluster(nodes: &[String], limits: StoreLimits, timeout: Duration) -> Result<Self, StoreError> {
        let client = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(timeout)
            .response_timeout(timeout.max(BUSY_WAIT_MAX))
            // Redirections (MOVED/ASK after a resharding) need a retry or two within the bound.
            .overall_response_timeout(Some(timeout.max(BUSY_WAIT_MAX) * 2))
            .retries(2)
            .build()?;
        let lazy = LazyCluster { client, conn: tokio::sync::OnceCell::new(), failed_at: Mutex::new(None), timeout };
        let pulse = Arc::new(Pulse::start(nodes, true)?);
        let fences = Arc::new(Fences::new(limits.key_ttl_s));
        Ok(Self { conn: Conn::Cluster(Arc::new(lazy)), limits, lanes: Arc::default(), pulse, fences })
    }

    /// Whether the Redis node holding `target`'s keys (any node, without a target) failed its
    /// last liveness probe: down, refusing or stalled (see `pulse.rs`).
    pub fn silent(&self, target: Option<QueueTarget>) -> bool {
        self.pulse.silent(target)
    }

    /// Redis' clock minus this host's, in ms, once known.
    pub fn clock_offset_ms(&self) -> Option<i64> {
        self.pulse.clock_offset_ms()
    }

    fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// The sale (with Redis' clock) and the users pre-queued, in one `sale_read.lua` call.
    async fn read_sale_and_prequeue(&self, target: QueueTarget) -> Result<(Option<SaleView>, u64), StoreError> {
        let r: Vec<String> = on_target(&SALE_READ, target, SALE_READ_KEYS).invoke_async(&mut self.conn()).await?;
        let now_ms = num("sale_read.lua", &r, 0)?;
        let prequeued = num("sale_read.lua", &r, 1)?;
        let fields: HashMap<String, String> = r[2..].chunks_exact(2).map(|kv| (kv[0].clone(), kv[1].clone())).collect();
        Ok((SaleRecord::from_fields(&fields).map(|record| SaleView { record, now_ms }), prequeued))
    }

    /// Redis' own `used_memory` (INFO memory), for the loadgen's bytes-per-waiting-user figure.
    pub async fn used_memory_bytes(&self) -> Result<u64, StoreError> {
        let info: String = redis::cmd("INFO").arg("memory").query_async(&mut self.conn()).await?;
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| StoreError::Reply { what: "INFO memory", detail: "no used_memory line".into() })
    }

    /// `flag_set.lua` with a version floor one above the highest acknowledged version. The
    /// flag and the acks hash live in different slots on a cluster, so the floor is read
    /// first; an instance acknowledges only versions it read from the flag hash.
    /// One `sale_control.lua` call; `force` matters for a clear only.
    async fn sale_control(
        &self,
        target: QueueTarget,
        action: &str,
        source: &str,
        message: &str,
        force: bool,
    ) -> Result<Vec<String>, StoreError> {
        Ok(on_target(&SALE_CONTROL, target, SALE_CONTROL_KEYS)
            .arg(action)
            .arg(source)
            .arg(message)
            .arg(self.limits.key_ttl_s)
            .arg(LEDGER_MAX_ROWS)
            .arg(self.limits.record_ttl_s)
            .arg(u8::from(force))
            .invoke_async(&mut self.conn())
            .await?)
    }

    async fn write_flag_fields(&self, fields: FlagFields) -> Result<u64, StoreError> {
        let floor = self.flag_acks().await?.iter().map(|a| a.version + 1).max().unwrap_or(0);
        let mut inv = FLAG_SET.key(keys::FLAG);
        inv.arg(fields.set.len()).arg(if fields.clear_overrides { "1" } else { "0" }).arg(floor);
        for (k, v) in &fields.set {
            inv.arg(k).arg(v);
        }
        for k in &fields.delete {
            inv.arg(k);
        }
        Ok(inv.invoke_async(&mut self.conn()).await?)
    }
}

/// The gate's pacing never reserves a tick that starts within this many ms (by Redis' clock):
/// a purchase reserved in a tick must have the time to be forwarded and reach the purchase API
/// inside that tick, so that it is counted in the tick it arrives in.
pub const PACE_GUARD_MS: u64 = 50;

impl QueueOps for RedisStore {
    async fn enter(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> Result<EnterOutcome, StoreError> {
        // A user admitted, then evicted or gone before the token was stored enters again.
        for _ in 0..2 {
            let mut answer = self.coalesced(Op::Enter, target, user.clone()).await?;
            if let Answer::Issue = answer {
                answer = self.issue(target, &user, candidate).await?;
            }
            match answer {
                Answer::Waiting(w) => return Ok(EnterOutcome::Waiting(w)),
                Answer::Admitted(token) => return Ok(EnterOutcome::Admitted(token)),
                Answer::Full => return Ok(EnterOutcome::Full),
                Answer::PreQueue(n) => return Ok(EnterOutcome::PreQueue(n)),
                Answer::Scheduled(n) => return Ok(EnterOutcome::Scheduled(n)),
                Answer::Closed(n) => return Ok(EnterOutcome::Closed(n)),
                Answer::NotInQueue | Answer::Issue => {}
            }
        }
        Err(StoreError::Reply { what: "enter.lua", detail: "user left the queue while being admitted".into() })
    }

    async fn status(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> Result<StatusOutcome, StoreError> {
        let mut answer = self.coalesced(Op::Status, target, user.clone()).await?;
        if let Answer::Issue = answer {
            answer = self.issue(target, &user, candidate).await?;
        }
        match answer {
            Answer::Waiting(w) => Ok(StatusOutcome::Waiting(w)),
            Answer::Admitted(token) => Ok(StatusOutcome::Admitted(token)),
            Answer::NotInQueue => Ok(StatusOutcome::NotInQueue),
            Answer::PreQueue(n) => Ok(StatusOutcome::PreQueue(n)),
            Answer::Closed(n) => Ok(StatusOutcome::Closed(n)),
            Answer::Full | Answer::Issue | Answer::Scheduled(_) => Err(StoreError::Reply {
                what: "status.lua",
                detail: "an enter-only answer (full, scheduled) or a second issue".into(),
            }),
        }
    }

    async fn leave(&self, target: QueueTarget, user: UserId) -> Result<bool, StoreError> {
        let removed: u64 = on_target(&LEAVE, target, LEAVE_KEYS)
            .arg(user.as_str())
            .arg(self.limits.key_ttl_s)
            .arg(self.limits.record_ttl_s)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(removed > 0)
    }

    async fn hold_queue(
        &self,
        user: UserId,
        target: QueueTarget,
        max: u64,
    ) -> Result<Vec<(QueueTarget, u64)>, StoreError> {
        let held: Vec<(String, u64)> = USER_HOLD
            .key(keys::user_queues(&user))
            .arg(target.to_string())
            .arg(max)
            .arg(self.limits.key_ttl_s)
            .invoke_async(&mut self.conn())
            .await?;
        // A member that no longer parses counts for nothing.
        Ok(held.into_iter().filter_map(|(t, age)| Some((t.parse().ok()?, age))).collect())
    }

    async fn release_queues(&self, user: UserId, targets: &[QueueTarget]) -> Result<(), StoreError> {
        if targets.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = targets.iter().map(ToString::to_string).collect();
        let _: u64 = self.conn().zrem(keys::user_queues(&user), names).await?;
        Ok(())
    }

    async fn holds_place(&self, target: QueueTarget, user: UserId) -> Result<bool, StoreError> {
        let (waiting, prequeued, opening): (Option<f64>, Option<f64>, Option<f64>) = redis::pipe()
            .zscore(keys::of(target, "waiting"), user.as_str())
            .zscore(keys::of(target, "prequeue"), user.as_str())
            .zscore(keys::of(target, "opening"), user.as_str())
            .query_async(&mut self.conn())
            .await?;
        Ok(waiting.is_some() || prequeued.is_some() || opening.is_some())
    }

    async fn try_lock_admission(&self, target: QueueTarget, holder: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let ok: Option<String> = redis::cmd("SET")
            .arg(keys::admission_lock(target))
            .arg(holder)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut self.conn())
            .await?;
        Ok(ok.is_some())
    }

    async fn admit(&self, target: QueueTarget, default_batch: u64, tick_ms: u64) -> Result<AdmitOutcome, StoreError> {
        self.admit_by(target, default_batch, tick_ms, "").await
    }

    async fn admit_by(
        &self,
        target: QueueTarget,
        default_batch: u64,
        tick_ms: u64,
        instance: &str,
    ) -> Result<AdmitOutcome, StoreError> {
        let fence = self.fences.fence(target);
        let r: Vec<String> = on_target(&ADMIT, target, ADMIT_KEYS)
            .arg(default_batch)
            .arg(tick_ms)
            .arg(self.limits.key_ttl_s)
            .arg(instance)
            .arg(LEDGER_MAX_ROWS)
            .arg(fence.mark)
            .arg(fence.seq_seen)
            .arg(fence.seq_to)
            .arg(fence.tick)
            .arg(self.limits.record_ttl_s)
            .invoke_async(&mut self.conn())
            .await?;
        let advanced = num("admit.lua", &r, 0)? == 1;
        let mark = num("admit.lua", &r, 1)?;
        let tick = num("admit.lua", &r, 2)?;
        self.fences.observe(target, None, mark, advanced.then_some(tick), num("admit.lua", &r, 6)?, true);
        // The waits go to the Prometheus histogram of the instance that admitted.
        for w in r.get(5).map_or("", String::as_str).split(',').filter_map(|w| w.parse::<u64>().ok()) {
            crate::metrics::wait_observed(w);
        }
        Ok(AdmitOutcome { advanced, mark, tick, admitted: num("admit.lua", &r, 3)?, batch: num("admit.lua", &r, 4)? })
    }

    async fn evict(&self, target: QueueTarget, timeout_ms: u64, max: u64) -> Result<u64, StoreError> {
        Ok(on_target(&EVICT, target, EVICT_KEYS)
            .arg(timeout_ms)
            .arg(max)
            .arg(self.limits.key_ttl_s)
            .arg(self.limits.record_ttl_s)
            .invoke_async(&mut self.conn())
            .await?)
    }

    async fn snapshot(&self, target: QueueTarget) -> Result<TargetSnapshot, StoreError> {
        let mut conn = self.conn();
        #[allow(clippy::type_complexity)]
        let (mark, seq, evicted, batch, capacity, lock, admissions, waits, oldest): (
            Option<u64>,
            Option<u64>,
            Option<u64>,
            Option<u64>,
            Option<u64>,
            Option<String>,
            Vec<String>,
            HashMap<String, u64>,
            Vec<String>,
        ) = redis::pipe()
            .get(keys::of(target, "admitted_count"))
            .get(keys::of(target, "seq"))
            .get(keys::of(target, "evicted"))
            .get(keys::of(target, "batch_size"))
            .get(keys::of(target, "capacity"))
            .get(keys::admission_lock(target))
            .lrange(keys::of(target, "admissions"), 0, -1)
            .hgetall(keys::of(target, "waits"))
            // The lowest member of entry_times is the oldest call with a seq the mark has not
            // passed (admit.lua drops the others): member "<first>-<last>:<ms>".
            .zrange(keys::of(target, "entry_times"), 0, 0)
            .query_async(&mut conn)
            .await?;
        let mark = mark.unwrap_or(0);
        let waiting: u64 = conn.zcount(keys::of(target, "waiting"), format!("({mark}"), "+inf").await?;
        let oldest_entry_ms = (waiting > 0)
            .then(|| oldest.first().and_then(|m| m.rsplit_once(':')).and_then(|(_, ms)| ms.parse().ok()))
            .flatten();
        let (sale, prequeued) = self.read_sale_and_prequeue(target).await?;
        let outflow: HashMap<String, String> = conn.hgetall(keys::of(target, "outflow")).await?;
        let outflow = outflow.get("batch").and_then(|b| b.parse().ok()).map(|batch| OutflowState {
            batch,
            reason: outflow.get("reason").cloned().unwrap_or_default(),
            decided_at_ms: outflow.get("at").and_then(|a| a.parse().ok()).unwrap_or(0),
            no_show_bp: outflow.get("no_show").and_then(|n| n.parse().ok()),
            tokens_used: outflow.get("used").and_then(|n| n.parse().ok()).unwrap_or(0),
            tokens_expired: outflow.get("expired").and_then(|n| n.parse().ok()).unwrap_or(0),
            purchases: outflow.get("purchases").and_then(|n| n.parse().ok()).unwrap_or(0),
            p95_ms: outflow.get("p95").and_then(|n| n.parse().ok()),
            error_bp: outflow.get("error_bp").and_then(|n| n.parse().ok()).unwrap_or(0),
        });
        Ok(TargetSnapshot {
            outflow,
            sale,
            prequeued,
            waiting,
            mark,
            seq: seq.unwrap_or(0),
            evicted: evicted.unwrap_or(0),
            batch_override: batch,
            capacity,
            lock_holder: lock,
            admissions: admissions
                .iter()
                .filter_map(|a| {
                    let (t, n) = a.split_once(':')?;
                    Some((t.parse().ok()?, n.parse().ok()?))
                })
                .collect(),
            admitted_total: waits.get("admitted").copied().unwrap_or(0),
            tokens_issued: waits.get("tokens_issued").copied().unwrap_or(0),
            tokens_used: waits.get("tokens_used").copied().unwrap_or(0),
            direct_tokens_used: waits.get("direct_tokens_used").copied().unwrap_or(0),
            tokens_expired: waits.get("tokens_expired").copied().unwrap_or(0),
            waits: WaitHistogram {
                buckets: waits.iter().filter_map(|(k, v)| Some((k.strip_prefix("b:")?.parse().ok()?, *v))).collect(),
                count: waits.get("count").copied().unwrap_or(0),
                sum_ms: waits.get("sum_ms").copied().unwrap_or(0),
            },
            oldest_entry_ms,
        })
    }
}

impl SaleOps for RedisStore {
    async fn schedule_sale(
        &self,
        target: QueueTarget,
        schedule: SaleSchedule,
        seed: [u8; 32],
    ) -> Result<ScheduleOutcome, StoreError> {
        let last_ms = schedule.closes_at_ms.unwrap_or(schedule.opens_at_ms).max(schedule.opens_at_ms);
        let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        let r: Vec<String> = on_target(&SALE_SCHEDULE, target, SALE_SCHEDULE_KEYS)
            .arg(schedule.opens_at_ms)
            .arg(opt(schedule.prequeue_from_ms))
            .arg(opt(schedule.closes_at_ms))
            .arg(crate::domain::hex(&seed))
            .arg(crate::domain::seed_commitment(&seed))
            .arg(last_ms / 1000 + self.limits.key_ttl_s)
            .arg(LEDGER_MAX_ROWS)
            .arg(self.limits.record_ttl_s)
            .invoke_async(&mut self.conn())
            .await?;
        match r.first().map(String::as_str) {
            Some("1") => {
                // Another slot than the target's keys on a cluster: a command of its own.
                let _: u64 = self.conn().sadd(keys::SALES, target.to_string()).await?;
                Ok(ScheduleOutcome::Scheduled { commitment: r.get(1).cloned().unwrap_or_default() })
            }
            Some("0") => Ok(ScheduleOutcome::AlreadyOpened { frozen_at_ms: num("sale_schedule.lua", &r, 1)? }),
            _ => Err(reply_err("sale_schedule.lua", &r)),
        }
    }

    async fn read_sale(&self, target: QueueTarget) -> Result<Option<SaleView>, StoreError> {
        Ok(self.read_sale_and_prequeue(target).await?.0)
    }

    async fn control_sale(&self, target: QueueTarget, control: SaleControl) -> Result<bool, StoreError> {
        let (action, source, message) = match &control {
            SaleControl::Pause => ("pause", "command", ""),
            SaleControl::Resume => ("resume", "command", ""),
            SaleControl::Close { message, source } => ("close", source.as_str(), message.as_str()),
            SaleControl::Clear => return Ok(self.clear_sale(target, true).await? == ClearOutcome::Cleared),
        };
        let r = self.sale_control(target, action, source, message, true).await?;
        Ok(num("sale_control.lua", &r, 0)? == 1)
    }

    async fn clear_sale(&self, target: QueueTarget, force: bool) -> Result<ClearOutcome, StoreError> {
        let r = self.sale_control(target, "clear", "command", "", force).await?;
        let outcome = match num("sale_control.lua", &r, 0)? {
            1 => ClearOutcome::Cleared,
            0 => ClearOutcome::NoSale,
            2 => ClearOutcome::Refused {
                opening: num("sale_control.lua", &r, 1)? == 3,
                prequeued: num("sale_control.lua", &r, 2)?,
            },
            _ => return Err(reply_err("sale_control.lua", &r)),
        };
        if !matches!(outcome, ClearOutcome::Refused { .. }) {
            // Another slot than the target's keys on a cluster: a command of its own (also
            // when the sale's hash had expired and only this listing was left).
            let _: u64 = self.conn().srem(keys::SALES, target.to_string()).await?;
        }
        Ok(outcome)
    }

    async fn target_record(&self, target: QueueTarget) -> Result<Option<TargetRecord>, StoreError> {
        let fields: Vec<(String, String)> = self.conn().hgetall(keys::of(target, "record")).await?;
        if fields.is_empty() {
            return Ok(None);
        }
        Ok(Some(TargetRecord::from_fields(fields.iter().map(|(f, v)| (f.as_str(), v.as_str())))))
    }

    async fn record_purchase(&self, target: QueueTarget, tick: u64, answer: AnswerClass) -> Result<(), StoreError> {
        let key = keys::of(target, "record");
        let _: () = redis::pipe()
            .hincr(&key, format!("p:{tick}:{}", answer.name()), 1)
            .ignore()
            .expire(&key, self.limits.record_ttl_s as i64)
            .ignore()
            .query_async(&mut self.conn())
            .await?;
        Ok(())
    }

    async fn sale_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        let members: Vec<String> = self.conn().smembers(keys::SALES).await?;
        Ok(members.iter().filter_map(|m| m.parse().ok()).collect())
    }

    async fn pending_opening(&self, target: QueueTarget) -> Result<Option<PendingOpening>, StoreError> {
        let mut conn = self.conn();
        let fields: HashMap<String, String> = conn.hgetall(keys::of(target, "sale")).await?;
        let get = |k: &str| fields.get(k).and_then(|v| v.parse::<u64>().ok());
        let (Some(frozen), Some(base), Some(opens_at_ms)) = (get("frozen"), get("base"), get("opens_at")) else {
            return Ok(None);
        };
        // A closed sale admits nobody again: its pre-queue is never ordered.
        if fields.contains_key("opened_at") || fields.get("closed").is_some_and(|c| c == "1") {
            return Ok(None);
        }
        let bad = |detail: String| StoreError::Reply { what: "sale opening", detail };
        let seed = fields
            .get("seed")
            .and_then(|s| crate::domain::unhex(s))
            .ok_or_else(|| bad("the sale has no seed".into()))?;
        // The frozen set does not change: read it in slices so no one reply blocks Redis long.
        const SLICE: u64 = 10_000;
        let mut users = Vec::with_capacity(usize::try_from(frozen).unwrap_or(0));
        let mut from = 0;
        while from < frozen {
            let part: Vec<String> =
                conn.zrange(keys::of(target, "opening"), from as isize, (from + SLICE - 1) as isize).await?;
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
        inv.arg(if last { "1" } else { "0" })
            .arg(opens_at_ms)
            .arg(self.limits.key_ttl_s)
            .arg(LEDGER_MAX_ROWS)
            .arg(self.limits.record_ttl_s);
        for (seq, user) in places {
            inv.arg(*seq).arg(user.as_str());
        }
        let applied: u64 = inv.invoke_async(&mut self.conn()).await?;
        Ok(applied == 1)
    }

    async fn sale_ledger(&self, target: QueueTarget) -> Result<Vec<LedgerEntry>, StoreError> {
        let rows: Vec<String> = self.conn().lrange(keys::of(target, "ledger"), 0, -1).await?;
        Ok(rows.iter().filter_map(|r| LedgerEntry::decode(r)).collect())
    }
}

impl FlagOps for RedisStore {
    async fn read_stored_flag(&self) -> Result<Option<FlagState>, StoreError> {
        // HGETALL of a missing key is empty; Redis deletes a hash whose last field goes.
        let fields: HashMap<String, String> = self.conn().hgetall(keys::FLAG).await?;
        Ok((!fields.is_empty()).then(|| FlagState::from_fields(&fields)))
    }

    async fn write_flag(&self, set: Vec<(String, String)>, delete: Vec<String>) -> Result<u64, StoreError> {
        self.write_flag_fields(FlagFields { set, delete, clear_overrides: false }).await
    }

    async fn change_flag(&self, change: FlagChange) -> Result<u64, StoreError> {
        self.write_flag_fields(change.fields()).await
    }

    async fn global_batch_size(&self) -> Result<Option<u64>, StoreError> {
        Ok(self.conn().get(keys::GLOBAL_BATCH_SIZE).await?)
    }

    async fn set_batch_size(&self, target: Option<QueueTarget>, batch: Option<u64>) -> Result<(), StoreError> {
        let key = target.map_or_else(|| keys::GLOBAL_BATCH_SIZE.to_owned(), |t| keys::of(t, "batch_size"));
        let mut conn = self.conn();
        match batch {
            Some(b) => {
                let _: () = conn.set(&key, b).await?;
            }
            None => {
                let _: u64 = conn.del(&key).await?;
            }
        }
        Ok(())
    }

    async fn ack_flag(&self, ack: FlagAck, ttl_ms: u64) -> Result<(), StoreError> {
        let (missing, state) = ack.encode_rest();
        let _: u64 = FLAG_ACK
            .key(keys::FLAG_ACKS)
            .arg(&ack.instance)
            .arg(ack.version)
            .arg(ack.applied_at_ms)
            .arg(ttl_ms.max(1))
            .arg(missing)
            .arg(state)
            .arg(FLAG_ACK_KEEP_MS)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }

    async fn flag_acks(&self) -> Result<Vec<FlagAck>, StoreError> {
        let listed: Vec<String> =
            FLAG_ACKS.key(keys::FLAG_ACKS).arg(FLAG_ACK_KEEP_MS).invoke_async(&mut self.conn()).await?;
        let mut acks: Vec<FlagAck> =
            listed.chunks_exact(3).filter_map(|a| FlagAck::decode(&a[0], &a[1], a[2].parse::<u64>().ok())).collect();
        acks.sort_by(|a, b| a.instance.cmp(&b.instance));
        Ok(acks)
    }

    async fn withdraw_flag_ack(&self, instance: &str) -> Result<(), StoreError> {
        let _: u64 = self.conn().hdel(keys::FLAG_ACKS, instance).await?;
        Ok(())
    }
}

impl GateOps for RedisStore {
    async fn claim_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        ttl_s: u64,
    ) -> Result<TokenClaim, StoreError> {
        let r: Vec<String> = TOKEN_CLAIM
            .key(keys::token(target, &user))
            .key(keys::used_tokens(target, &user))
            .arg(token)
            .arg(ttl_s.max(1))
            .invoke_async(&mut self.conn())
            .await?;
        match r.first().map(String::as_str) {
            Some("1") => Ok(TokenClaim::Claimed { previous: r.get(1).filter(|p| !p.is_empty()).cloned() }),
            Some("0") => Ok(TokenClaim::AlreadyUsed),
            _ => Err(reply_err("token_claim.lua", &r)),
        }
    }

    async fn release_token(
        &self,
        target: QueueTarget,
        user: UserId,
        token: &str,
        previous: Option<String>,
    ) -> Result<(), StoreError> {
        let _: u64 = TOKEN_RELEASE
            .key(keys::token(target, &user))
            .key(keys::used_tokens(target, &user))
            .arg(token)
            .arg(previous.unwrap_or_default())
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }

    async fn confirm_token_used(
        &self,
        target: QueueTarget,
        user: UserId,
        through_queue: bool,
    ) -> Result<(), StoreError> {
        let (field, in_record) = if through_queue { ("tokens_used", "tu") } else { ("direct_tokens_used", "tud") };
        let record = keys::of(target, "record");
        // One MULTI (the keys share the target's slot): the counts, and a queue token's place
        // among the unused ones, together.
        let mut p = redis::pipe();
        p.atomic()
            .hincr(keys::of(target, "waits"), field, 1)
            .ignore()
            .hincr(&record, in_record, 1)
            .ignore()
            .expire(&record, self.limits.record_ttl_s as i64)
            .ignore();
        if through_queue {
            p.zrem(keys::of(target, "unused"), user.as_str()).ignore();
        }
        let _: () = p.query_async(&mut self.conn()).await?;
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
        let (v, score): (Option<String>, Option<f64>) = redis::pipe()
            .get(keys::token(target, &user))
            .zscore(keys::used_tokens(target, &user), token)
            .query_async(&mut self.conn())
            .await?;
        // A member past its expiry belongs to an expired token, which verify refused already.
        Ok(score.is_some() || v.is_some_and(|v| v.strip_prefix("used:") == Some(token)))
    }

    async fn pace_purchase(
        &self,
        target: QueueTarget,
        default_budget: u64,
        tick_ms: u64,
        ahead: u64,
    ) -> Result<Option<PaceSlot>, StoreError> {
        let r: Vec<u64> = on_target(&GATE_PACE, target, GATE_PACE_KEYS)
            .arg(tick_ms)
            .arg(default_budget)
            .arg(PACE_GUARD_MS)
            .arg(ahead)
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

impl OutflowOps for RedisStore {
    async fn observe_purchase(
        &self,
        target: QueueTarget,
        interval: u64,
        bucket: usize,
        error: bool,
        backoff: bool,
    ) -> Result<(), StoreError> {
        let key = keys::of(target, &format!("outflow:obs:{interval}"));
        let mut p = redis::pipe();
        p.hincr(&key, "n", 1).hincr(&key, format!("l{bucket}"), 1);
        if error {
            p.hincr(&key, "e", 1);
        }
        if backoff {
            p.hincr(&key, "b", 1);
        }
        // A few intervals: the pump reads the one just ended.
        let _: () = p.expire(&key, 600).ignore().query_async(&mut self.conn()).await?;
        Ok(())
    }

    async fn claim_outflow(&self, target: QueueTarget, interval: u64) -> Result<OutflowClaim, StoreError> {
        let reply: Vec<String> = OUTFLOW_CLAIM
            .key(keys::of(target, "outflow"))
            .key(keys::of(target, "batch_size"))
            .key(keys::of(target, &format!("outflow:obs:{interval}")))
            .key(keys::of(target, "waits"))
            .arg(interval)
            .arg(self.limits.key_ttl_s)
            .invoke_async(&mut self.conn())
            .await?;
        let bad = || StoreError::Reply { what: "outflow_claim.lua", detail: format!("unexpected reply {reply:?}") };
        let current = |v: Option<&String>| v.and_then(|b| b.parse().ok());
        match reply.first().map(String::as_str) {
            Some("pinned") => Ok(OutflowClaim::Pinned),
            Some("decided") => Ok(OutflowClaim::Decided { current: current(reply.get(1)) }),
            Some("decide") if reply.len() >= 7 => {
                let num = |i: usize| reply[i].parse::<u64>().ok();
                let counters = TokensEnded { used: num(5).ok_or_else(bad)?, expired: num(6).ok_or_else(bad)? };
                let ended = num(2).zip(num(3)).map(|(used, expired)| TokensEnded {
                    used: counters.used.saturating_sub(used),
                    expired: counters.expired.saturating_sub(expired),
                });
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
            LedgerEntry::encode_batch(state.decided_at_ms, c.from, state.batch, &c.instance, &state.reason)
        });
        let mut call = on_target(&OUTFLOW_SET, target, OUTFLOW_SET_KEYS);
        call.arg(self.limits.key_ttl_s).arg(row).arg(LEDGER_MAX_ROWS);
        let opt = |v: Option<u64>| v.map(|n| n.to_string()).unwrap_or_default();
        for (field, value) in [
            ("batch", state.batch.to_string()),
            ("reason", state.reason.clone()),
            ("at", state.decided_at_ms.to_string()),
            ("used", state.tokens_used.to_string()),
            ("expired", state.tokens_expired.to_string()),
            ("no_show", opt(state.no_show_bp)),
            ("purchases", state.purchases.to_string()),
            ("p95", opt(state.p95_ms)),
            ("error_bp", state.error_bp.to_string()),
        ] {
            call.arg(field).arg(value);
        }
        let _: u64 = call.invoke_async(&mut self.conn()).await?;
        Ok(())
    }

    async fn active_buyers(&self, target: QueueTarget) -> Result<u64, StoreError> {
        Ok(on_target(&ACTIVE_COUNT, target, ACTIVE_COUNT_KEYS).invoke_async(&mut self.conn()).await?)
    }

    async fn expire_tokens(&self, target: QueueTarget) -> Result<u64, StoreError> {
        Ok(on_target(&TOKENS_EXPIRE, target, TOKENS_EXPIRE_KEYS).invoke_async(&mut self.conn()).await?)
    }
}

impl TargetOps for RedisStore {
    async fn register_active(&self, target: QueueTarget) -> Result<(), StoreError> {
        let _: u64 = self.conn().sadd(keys::ACTIVE, target.to_string()).await?;
        Ok(())
    }

    async fn publish_capacity(&self, target: QueueTarget) -> Result<(), StoreError> {
        let key = keys::of(target, "capacity");
        let _: () = self.conn().set_ex(key, self.limits.capacity(target.kind), self.limits.key_ttl_s).await?;
        Ok(())
    }

    async fn deactivate(&self, target: QueueTarget) -> Result<(), StoreError> {
        let _: u64 = self.conn().srem(keys::ACTIVE, target.to_string()).await?;
        Ok(())
    }

    async fn declared_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        let members: Vec<String> = self.conn().smembers(keys::TARGETS).await?;
        Ok(members.iter().filter_map(|m| m.parse().ok()).collect())
    }

    async fn declare_target(&self, target: QueueTarget, room: u64) -> Result<DeclareOutcome, StoreError> {
        // Operators' commands, not clients': the check and the add need not be one step.
        let mut conn = self.conn();
        if conn.sismember(keys::TARGETS, target.to_string()).await? {
            return Ok(DeclareOutcome::AlreadyDeclared);
        }
        let count: u64 = conn.scard(keys::TARGETS).await?;
        if count >= room {
            return Ok(DeclareOutcome::Full { room });
        }
        let _: u64 = conn.sadd(keys::TARGETS, target.to_string()).await?;
        Ok(DeclareOutcome::Added)
    }

    async fn undeclare_target(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let removed: u64 = self.conn().srem(keys::TARGETS, target.to_string()).await?;
        Ok(removed > 0)
    }

    async fn active_targets(&self) -> Result<Vec<QueueTarget>, StoreError> {
        let members: Vec<String> = self.conn().smembers(keys::ACTIVE).await?;
        // A member that does not parse was written by hand; skip it rather than stop the pump.
        Ok(members.iter().filter_map(|m| m.parse().ok()).collect())
    }

    async fn forget_if_expired(&self, target: QueueTarget) -> Result<bool, StoreError> {
        let mut conn = self.conn();
        let alive: bool = conn.exists(keys::of(target, "seq")).await?;
        if alive {
            return Ok(false);
        }
        let _: u64 = conn.srem(keys::ACTIVE, target.to_string()).await?;
        self.fences.forget(target);
        Ok(true)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let _: String = redis::cmd("PING").query_async(&mut self.conn()).await?;
        Ok(())
    }
}
