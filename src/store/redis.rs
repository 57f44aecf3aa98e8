//! The Redis store: the key contract of SPEC §3 and one Lua script per atomic operation.
//!
//! Every key of a target carries the hash tag `{TYPE:id}`, so each script touches one slot.
//! `queue:active`, the flag and the global batch size are outside any target's slot and are
//! never touched by a target's script.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, Script};

use super::{AdmitOutcome, EnterOutcome, QueueStore, StatusOutcome, StoreError, StoreLimits, TargetSnapshot, Waiting};
use crate::domain::{FlagState, QueueTarget, UserId, WaitHistogram};

static ENTER: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/enter.lua")));
static STATUS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/status.lua")));
static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/leave.lua")));
static ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/admit.lua")));
static EVICT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/evict.lua")));
static FLAG_SET: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/flag_set.lua")));

/// Key names. Operators and tests read these with redis-cli; they are a contract.
pub mod keys {
    use crate::domain::{QueueTarget, UserId};

    pub const ACTIVE: &str = "queue:active";
    pub const FLAG: &str = "virtual-queue:flag";
    pub const GLOBAL_BATCH_SIZE: &str = "queue:config:batch_size";

    pub fn of(target: QueueTarget, name: &str) -> String {
        format!("queue:{{{target}}}:{name}")
    }
    pub fn token(target: QueueTarget, user: UserId) -> String {
        format!("queue:{{{target}}}:token:{user}")
    }
    pub fn admission_lock(target: QueueTarget) -> String {
        format!("queue:admission:{{{target}}}")
    }
}

/// Production store on one Redis server.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    limits: StoreLimits,
}

impl RedisStore {
    /// Connects lazily: `vq serve` starts (and fails open) even while Redis is down, and the
    /// manager reconnects by itself. `timeout` bounds every command on the request path.
    pub fn connect(url: &str, limits: StoreLimits, timeout: Duration) -> Result<Self, StoreError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Self { conn, limits })
    }

    fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Redis' own `used_memory` (INFO memory), for the loadgen's bytes-per-waiting-user figure.
    pub async fn used_memory_bytes(&self) -> Result<u64, StoreError> {
        let info: String = redis::cmd("INFO").arg("memory").query_async(&mut self.conn()).await?;
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| StoreError::Reply { what: "INFO memory", detail: "no used_memory line".into() })
    }
}

fn reply_err(what: &'static str, reply: &[String]) -> StoreError {
    StoreError::Reply { what, detail: format!("{reply:?}") }
}

fn num(what: &'static str, reply: &[String], i: usize) -> Result<u64, StoreError> {
    reply.get(i).and_then(|s| s.parse::<u64>().ok()).ok_or_else(|| reply_err(what, reply))
}

/// Reads `{'WAITING', seq, mark, ahead, batch}` or `{'ADMITTED', token}`; `None` for any
/// other first word, which the caller handles.
fn parse_position(what: &'static str, reply: &[String]) -> Result<Option<Result<Waiting, String>>, StoreError> {
    match reply.first().map(String::as_str) {
        Some("WAITING") => {
            let batch = num(what, reply, 4)?;
            Ok(Some(Ok(Waiting {
                seq: num(what, reply, 1)?,
                mark: num(what, reply, 2)?,
                ahead: num(what, reply, 3)?,
                batch_override: (batch > 0).then_some(batch),
            })))
        }
        Some("ADMITTED") => {
            let token = reply.get(1).ok_or_else(|| reply_err(what, reply))?;
            Ok(Some(Err(token.clone())))
        }
        _ => Ok(None),
    }
}

impl QueueStore for RedisStore {
    async fn enter(&self, target: QueueTarget, user: UserId, candidate: &str) -> Result<EnterOutcome, StoreError> {
        let reply: Vec<String> = ENTER
            .key(keys::of(target, "waiting"))
            .key(keys::of(target, "heartbeat"))
            .key(keys::of(target, "seq"))
            .key(keys::of(target, "admitted_count"))
            .key(keys::token(target, user))
            .key(keys::of(target, "batch_size"))
            .key(keys::of(target, "entered_at"))
            .key(keys::of(target, "waits"))
            .arg(user.0)
            .arg(self.limits.max_capacity)
            .arg(self.limits.key_ttl_s)
            .arg(candidate)
            .arg(self.limits.token_ttl_s)
            .invoke_async(&mut self.conn())
            .await?;
        match parse_position("enter.lua", &reply)? {
            Some(Ok(w)) => Ok(EnterOutcome::Waiting(w)),
            Some(Err(token)) => Ok(EnterOutcome::Admitted(token)),
            None if reply.first().map(String::as_str) == Some("FULL") => Ok(EnterOutcome::Full),
            None => Err(reply_err("enter.lua", &reply)),
        }
    }

    async fn status(&self, target: QueueTarget, user: UserId, candidate: &str) -> Result<StatusOutcome, StoreError> {
        let reply: Vec<String> = STATUS
            .key(keys::of(target, "waiting"))
            .key(keys::of(target, "heartbeat"))
            .key(keys::of(target, "seq"))
            .key(keys::of(target, "admitted_count"))
            .key(keys::token(target, user))
            .key(keys::of(target, "batch_size"))
            .key(keys::of(target, "entered_at"))
            .key(keys::of(target, "waits"))
            .arg(user.0)
            .arg(self.limits.key_ttl_s)
            .arg(candidate)
            .arg(self.limits.token_ttl_s)
            .invoke_async(&mut self.conn())
            .await?;
        match parse_position("status.lua", &reply)? {
            Some(Ok(w)) => Ok(StatusOutcome::Waiting(w)),
            Some(Err(token)) => Ok(StatusOutcome::Admitted(token)),
            None if reply.first().map(String::as_str) == Some("NOT_IN_QUEUE") => Ok(StatusOutcome::NotInQueue),
            None => Err(reply_err("status.lua", &reply)),
        }
    }

    async fn leave(&self, target: QueueTarget, user: UserId) -> Result<bool, StoreError> {
        let removed: u64 = LEAVE
            .key(keys::of(target, "waiting"))
            .key(keys::of(target, "heartbeat"))
            .key(keys::of(target, "entered_at"))
            .key(keys::of(target, "waits"))
            .arg(user.0)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(removed > 0)
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
        let r: Vec<String> = ADMIT
            .key(keys::of(target, "waiting"))
            .key(keys::of(target, "admitted_count"))
            .key(keys::of(target, "last_tick"))
            .key(keys::of(target, "batch_size"))
            .key(keys::of(target, "admissions"))
            .key(keys::of(target, "entered_at"))
            .key(keys::of(target, "waits"))
            .arg(default_batch)
            .arg(tick_ms)
            .arg(self.limits.key_ttl_s)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(AdmitOutcome {
            advanced: num("admit.lua", &r, 0)? == 1,
            mark: num("admit.lua", &r, 1)?,
            tick: num("admit.lua", &r, 2)?,
            admitted: num("admit.lua", &r, 3)?,
            batch: num("admit.lua", &r, 4)?,
        })
    }

    async fn evict(&self, target: QueueTarget, timeout_ms: u64, max: u64) -> Result<u64, StoreError> {
        Ok(EVICT
            .key(keys::of(target, "waiting"))
            .key(keys::of(target, "heartbeat"))
            .key(keys::of(target, "entered_at"))
            .key(keys::of(target, "evicted"))
            .arg(timeout_ms)
            .arg(max)
            .arg(self.limits.key_ttl_s)
            .invoke_async(&mut self.conn())
            .await?)
    }

    async fn register_active(&self, target: QueueTarget) -> Result<(), StoreError> {
        let _: u64 = self.conn().sadd(keys::ACTIVE, target.to_string()).await?;
        Ok(())
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
        Ok(true)
    }

    async fn read_flag(&self) -> Result<FlagState, StoreError> {
        let fields: HashMap<String, String> = self.conn().hgetall(keys::FLAG).await?;
        Ok(FlagState::from_fields(&fields))
    }

    async fn write_flag(&self, set: Vec<(String, String)>, delete: Vec<String>) -> Result<u64, StoreError> {
        let mut inv = FLAG_SET.key(keys::FLAG);
        inv.arg(set.len());
        for (k, v) in &set {
            inv.arg(k).arg(v);
        }
        for k in &delete {
            inv.arg(k);
        }
        Ok(inv.invoke_async(&mut self.conn()).await?)
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

    async fn snapshot(&self, target: QueueTarget) -> Result<TargetSnapshot, StoreError> {
        let mut conn = self.conn();
        #[allow(clippy::type_complexity)]
        let (mark, seq, evicted, batch, lock, admissions, waits): (
            Option<u64>,
            Option<u64>,
            Option<u64>,
            Option<u64>,
            Option<String>,
            Vec<String>,
            HashMap<String, u64>,
        ) = redis::pipe()
            .get(keys::of(target, "admitted_count"))
            .get(keys::of(target, "seq"))
            .get(keys::of(target, "evicted"))
            .get(keys::of(target, "batch_size"))
            .get(keys::admission_lock(target))
            .lrange(keys::of(target, "admissions"), 0, -1)
            .hgetall(keys::of(target, "waits"))
            .query_async(&mut conn)
            .await?;
        let mark = mark.unwrap_or(0);
        let waiting: u64 = conn.zcount(keys::of(target, "waiting"), format!("({mark}"), "+inf").await?;
        Ok(TargetSnapshot {
            waiting,
            mark,
            seq: seq.unwrap_or(0),
            evicted: evicted.unwrap_or(0),
            batch_override: batch,
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
            waits: WaitHistogram {
                buckets: waits.iter().filter_map(|(k, v)| Some((k.strip_prefix("b:")?.parse().ok()?, *v))).collect(),
                count: waits.get("count").copied().unwrap_or(0),
                sum_ms: waits.get("sum_ms").copied().unwrap_or(0),
            },
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let _: String = redis::cmd("PING").query_async(&mut self.conn()).await?;
        Ok(())
    }
}
