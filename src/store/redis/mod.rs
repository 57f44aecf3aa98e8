//! The Redis store: the key contract (README, Redis) and one Lua script per atomic operation.
//!
//! Every key of a target carries the hash tag `{TYPE:id}`, so each script touches one slot.
//! `queue:active`, the flag and the global batch size are outside any target's slot and are
//! never touched by a target's script.
//!
//! One server, a Redis Cluster or the embedded server in this process (`--store memory`,
//! `store/embedded/`): [`RedisStore`] talks through [`Conn`], which is a `ConnectionManager`, a
//! lazily opened cluster connection or the embedded server's handle, so the scripts and the key
//! contract are the same code in all three modes. No command here may need more than one slot, and
//! none may depend on seeing the whole keyspace (no KEYS, no SCAN).
//!
//! Layout, by concern: this file holds [`RedisStore`] (connecting, the liveness probe); the
//! contract's traits are implemented in `queue.rs` (`QueueOps`: enter, poll, admit, evict,
//! snapshot; `TargetOps`: the active and declared targets, ping), `sale.rs` (`SaleOps`: the
//! sale and its opening, ledger, record), `flag.rs` (`FlagOps`: the flag, batch sizes and
//! acknowledgements), `gate.rs` (`GateOps`: one-time tokens, challenges, pacing) and
//! `outflow.rs` (`OutflowOps`: the adaptive outflow, active buyers, expired tokens). Beside
//! them: `keys.rs` the key names, `scripts.rs` the scripts and their invocation, `codec.rs` and
//! `flag_ack.rs` the stored forms of ledger rows, hashes and acknowledgements, `error.rs` what a
//! Redis error means to the service, `conn.rs` the connection (one server or cluster),
//! `shared_calls.rs` the shared enter/poll script calls and their per-user answers, `claims.rs`
//! the shared purchase claims and the settling of the purchases that succeed, `fence.rs`
//! the counters seen against lost writes, `holds.rs` the shared calls that count the queues each
//! user holds, `durable.rs` the replicas' acknowledgement of a token issued or a purchase
//! claimed, `view.rs` an instance's copy of a target, `pulse.rs` the liveness probe.

mod claims;
mod codec;
mod conn;
mod durable;
mod error;
mod events;
mod fence;
mod flag;
mod flag_ack;
mod flag_form;
mod fleet;
mod gate;
mod holds;
pub mod keys;
mod lanes;
pub mod layout;
mod outflow;
mod pulse;
mod queue;
mod sale;
mod scripts;
mod shards;
mod shared_calls;
pub mod slices;
mod view;

pub use self::codec::SALE_FIELDS;
pub use self::lanes::{JoinOutcome, LANED, LaneFigures};
pub use self::view::{TargetView, ViewSync};

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;

use self::conn::{Conn, LazyCluster};
use self::durable::Durable;
use self::fence::Fences;
use self::pulse::Pulse;
use self::shared_calls::{Job, Op};
use super::coalesce::Coalescer;
use super::embedded::Embedded;
use super::{BUSY_WAIT_MAX, StoreError, StoreLimits};
use crate::clock::SharedClock;
use crate::domain::{QueueTarget, UserId};

/// Now by the store's clock: `clock` (the embedded server's) where there is one, else this
/// host's corrected by the offset `pulse` measured.
fn store_now(clock: Option<&SharedClock>, pulse: &Pulse) -> u64 {
    match clock {
        Some(clock) => clock.now_ms(),
        None => crate::clock::now_epoch_ms().saturating_add_signed(pulse.clock_offset_ms().unwrap_or(0)),
    }
}

/// Production store on one Redis server or a Redis Cluster.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    limits: StoreLimits,
    /// Enters and polls go out coalesced per target (see [`Coalescer`]); started at first use,
    /// on the runtime of the caller.
    lanes: Arc<OnceLock<Coalescer<(Op, QueueTarget), Job>>>,
    /// The gate's purchase claims go out coalesced per target too (`claims.rs`).
    claims: claims::Lanes,
    /// And the purchases they lead to, counted once they succeed.
    settled: claims::SettleLanes,
    /// Whether Redis answers and what time it is there, from a thread of its own.
    pulse: Arc<Pulse>,
    /// What this instance has seen of each target's counters, sent with the scripts so that a
    /// failover that lost writes never takes them back (`fence.rs`).
    fences: Arc<Fences>,
    /// The queues each user holds (`queue.max_queues_per_user`), counted in shared calls per
    /// bucket of users (`holds.rs`); started at first use, on the runtime of the caller.
    holds: holds::HoldLanes,
    /// Tokens issued and purchases claimed wait for the replicas here (`durable.rs`).
    durable: Arc<Durable>,
    /// The embedded server's clock, for the store on it (`--store memory`); `None` on Redis.
    clock: Option<SharedClock>,
    /// The lanes added at runtime to each target, as last read (`lanes.rs`).
    lane_book: lanes::RuntimeLanes,
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
        // A connection of its own for WAIT, which blocks the connection it is sent on.
        let waits = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        let pulse = Pulse::start(&[url.to_owned()], false)?;
        Ok(Self::assemble(Conn::single(conn), Conn::single(waits), limits, pulse))
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
        let lazy =
            |client| LazyCluster { client, conn: tokio::sync::OnceCell::new(), failed_at: Mutex::new(None), timeout };
        // Connections of their own (one per node) for WAIT, which blocks the one it is sent on.
        let waits = Conn::cluster(lazy(client.clone()));
        let pulse = Pulse::start(nodes, true)?;
        Ok(Self::assemble(Conn::cluster(lazy(client)), waits, limits, pulse))
    }

    /// The embedded store (`--store memory`): this store's glue and scripts over the embedded
    /// server in this process (`store/embedded/`), its keys expiring by `clock` (the system's
    /// in the binary, one that tests step). One process's queues only: two processes on it are
    /// two separate stores. No probe (it always answers), no replicas (WAIT answers at once) and
    /// no fences against lost writes (nothing fails over).
    pub fn embedded(limits: StoreLimits, clock: SharedClock) -> Result<Self, StoreError> {
        let server = Embedded::start(clock.clone())
            .map_err(|e| StoreError::Reply { what: "embedded store", detail: e.to_string() })?;
        let conn = Conn::embedded(server);
        // One process, one keyspace: `targets.types.*.shards` is a Redis setting (a target's
        // shards are there to spread it over nodes), so every target here is one shard.
        let limits = StoreLimits { type_shards: Vec::new(), ..limits };
        let mut store = Self::assemble(conn.clone(), conn, limits, Pulse::idle());
        store.clock = Some(clock);
        store.fences = Arc::new(Fences::off());
        Ok(store)
    }

    /// Whether this is the embedded store (one process, its own server).
    pub fn is_embedded(&self) -> bool {
        self.clock.is_some()
    }

    /// Now by the store's clock, in epoch ms: the embedded server's clock; for Redis, this
    /// host's clock corrected by the measured offset (this host's alone until measured).
    pub fn now_ms(&self) -> u64 {
        store_now(self.clock.as_ref(), &self.pulse)
    }

    /// Whether polls can be answered by this instance from a synced view of the queue
    /// (`queue.local_polls`): only a shared store needs it; the embedded one answers in-process.
    pub fn serves_local_polls(&self) -> bool {
        !self.is_embedded()
    }

    /// Sends the heartbeats of the polls answered here (`polled`) and reads the target's view
    /// back; `None` for a store without local polls ([`Self::serves_local_polls`]).
    pub async fn sync_poll_view(&self, target: QueueTarget, polled: &[UserId]) -> Option<Result<ViewSync, StoreError>> {
        if !self.serves_local_polls() {
            return None;
        }
        Some(self.sync_view(target, polled).await)
    }

    /// The store on its connections: `conn` for the scripts, `waits` for WAIT alone.
    fn assemble(conn: Conn, waits: Conn, limits: StoreLimits, pulse: Pulse) -> Self {
        let fences = Arc::new(Fences::new(limits.key_ttl_s));
        let durable = Arc::new(Durable::new(waits, limits.durable));
        Self {
            conn,
            limits,
            lanes: Arc::default(),
            claims: Arc::default(),
            settled: Arc::default(),
            pulse: Arc::new(pulse),
            fences,
            holds: Arc::default(),
            durable,
            clock: None,
            lane_book: Arc::default(),
        }
    }

    /// Whether the Redis node holding `target`'s keys (any node, without a target) failed its
    /// last liveness probe: down, refusing or stalled (see `pulse.rs`), by a probe that does
    /// not depend on how busy this instance is. The embedded store always answers. A sharded
    /// target is silent when the node of any of its shards is: asked only by a request that
    /// outlasted `redis.timeout_ms`, which the shard of its user holds up.
    pub fn silent(&self, target: Option<QueueTarget>) -> bool {
        match target {
            Some(t) if self.is_split(t) => self.parts(t).into_iter().any(|p| self.pulse.silent(Some(p))),
            _ => self.pulse.silent(target),
        }
    }

    /// Whether a request of `user`'s at `target` would meet a silent node: for a target in
    /// parts, only the parts that can hold the user (their shard, in the public lane and in
    /// each lane), so a shard's node gone fails open or closed for that shard's users alone
    /// and the users of the other shards keep queueing.
    pub fn silent_for(&self, target: QueueTarget, user: &UserId) -> bool {
        if !self.is_split(target) {
            return self.pulse.silent(Some(target));
        }
        self.user_parts(target, user).into_iter().any(|p| self.pulse.silent(Some(p)))
    }

    /// The Redis nodes (`host:port`) the liveness probe found silent in its last round.
    pub fn silent_nodes(&self) -> Vec<String> {
        let mut nodes = self.pulse.silent_nodes();
        nodes.sort();
        nodes
    }

    /// Redis' clock minus this host's, in ms, once known (0 for the embedded store).
    pub fn clock_offset_ms(&self) -> Option<i64> {
        self.pulse.clock_offset_ms()
    }

    fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// Returns once `target`'s replicas hold every write its node answered so far
    /// (`redis.wait_replicas`; `durable.rs`).
    async fn replicated(&self, target: QueueTarget) -> Result<(), StoreError> {
        self.durable.confirm(target, &self.pulse).await
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
