//! The queue service: flag decision, store call, token issue, fail-open. HTTP handlers call
//! this and nothing else; it knows no status codes.
//!
//! A store error never reaches a client: enter and poll answer DIRECT_ADMITTED with a
//! stateless token, the error is counted and logged at most once per interval.
//!
//! One file per job: this one holds the service and its answers; `queue.rs` the queue's
//! enter/poll/leave; `flag.rs` the flag as this instance applies it, `gate.rs` the gate's
//! decision and pacing, `stats.rs` the cluster-wide figures, `degraded.rs` the fail-open
//! bookkeeping, `local.rs` polls answered from this instance's copy of the mark, `tokens.rs`
//! the tokens handed out here, `targets.rs` the declared targets, `outflow.rs` the gate's
//! observations for the adaptive outflow and the record's purchase counts, and the adaptive
//! batches this instance's pump decided (for the ETA), `pow.rs` the proof of work at entry.

mod degraded;
mod flag;
mod gate;
mod lanes;
mod local;
mod outflow;
mod pow;
mod queue;
mod stats;
mod targets;
mod tokens;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use self::degraded::Degraded;
pub use self::flag::AppliedFlag;
use self::flag::FlagCache;
pub use self::gate::{ClaimMode, GateDenial, GatePass, Pace, PendingClaim, ReleaseRefusal};
pub use self::lanes::LaneProof;
use self::local::LocalPolls;
pub use self::local::sync_every as local_sync_every;
pub use self::outflow::OutflowBatches;
pub use self::pow::EntryCheck;
pub use self::stats::{QueueStats, read_target_stats, unpinned_batch};
use self::targets::TargetCache;
use self::tokens::IssuedTokens;
use crate::config::Settings;
use crate::domain::{QueueTarget, UserId};
use crate::store::{AnyStore, StoreError};

/// What a closed sale tells users when it was closed without a message.
pub const DEFAULT_CLOSE_MESSAGE: &str = "The sale is closed";
use crate::token::{EntryToken, Secret};

/// How often a given instance re-adds a target it serves to `queue:active`, in case the pump
/// dropped it between its keys expiring and a new entry.
const REGISTER_EVERY: Duration = Duration::from_secs(5);
/// A host clock further than this from Redis' is reported (`/readyz`, a warning, a gauge).
pub const CLOCK_OFF_MS: u64 = 1000;
/// Past `redis.timeout_ms`, how often a waiting request asks the liveness probe again (at
/// least: the timeout itself if longer).
const BUSY_RECHECK_MS: u64 = 100;

pub use crate::clock::now_epoch_ms;

/// What a user is told by enter and poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueStatus {
    Waiting {
        position: u64,
        ahead: u64,
        eta_seconds: u64,
        /// The sale is paused: nobody is admitted until it resumes.
        paused: bool,
        /// The lane the user waits in, for a target with lanes (`position` is the lane's).
        lane: Option<crate::domain::LaneName>,
    },
    Admitted(EntryToken),
    /// Recorded in the sale's pre-queue; the order is drawn at `opens_at_ms`.
    PreQueue {
        opens_at_ms: u64,
        paused: bool,
    },
    /// The sale opens later; entries are recorded from `prequeue_from_ms` (or the opening).
    Scheduled {
        opens_at_ms: u64,
        prequeue_from_ms: Option<u64>,
    },
    /// The sale is closed.
    Closed {
        message: String,
    },
    /// The queue is off for this user (flag) or Redis is down (fail-open).
    DirectAdmitted(EntryToken),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("the queue for {0} is full: try again shortly")]
    Full(QueueTarget),
    #[error("user is not in the queue for {0}: enter first (users who stop polling are evicted)")]
    NotInQueue(QueueTarget),
    /// This instance cannot keep up; the user's place (if any) is kept.
    #[error("this instance is overloaded: retry shortly, your place is kept")]
    Overloaded,
    /// Redis is down and `queue.on_store_failure` is `closed`: nobody is let in meanwhile.
    #[error("the waiting room cannot reach its queue right now: retry shortly (nobody is let in meanwhile)")]
    Unavailable,
    /// Redis' replicas did not confirm the user's token in time (`redis.wait_replicas`): it
    /// is not handed out yet, and the user's place is kept.
    #[error(
        "the waiting room could not yet confirm your entry token with its replica: retry shortly, your place is kept"
    )]
    NotReplicated,
    /// The user holds a place in `queue.max_queues_per_user` queues already.
    #[error(
        "you are waiting in {} queues already, the most one buyer may wait in at once: leave one of them (DELETE \
         /virtual-queues/{{type}}/{{id}}/entries/me) to join {target}; you wait in {}",
        .held.len(),
        .held.iter().map(|t| format!("{}/{}", t.kind.slug(), t.id)).collect::<Vec<_>>().join(", ")
    )]
    TooManyQueues { target: QueueTarget, held: Vec<QueueTarget> },
    /// No such access code for this target (or its lane is gone).
    #[error("this access code is not valid for {0}")]
    LaneCodeInvalid(QueueTarget),
    /// The access code was used by as many other buyers as it may be.
    #[error("this access code has been used already")]
    LaneCodeUsed,
    /// The lane claim proves nothing: why.
    #[error("{0}")]
    LaneClaimInvalid(String),
}

pub struct QueueService {
    pub store: AnyStore,
    secret: Secret,
    settings: Arc<Settings>,
    flag: FlagCache,
    /// Runtime batch size for every target (0 = none set), refreshed with the flag.
    global_batch: AtomicU64,
    degraded: Degraded,
    registered: Mutex<HashMap<QueueTarget, Instant>>,
    /// Waiting users' polls answered from this instance's copy (`queue.local_polls`).
    local: Option<LocalPolls>,
    /// The queue tokens handed out here, answered again to their users until they expire.
    issued: IssuedTokens,
    /// The declared targets: the only ones the queue answers for.
    targets: TargetCache,
    /// The adaptive batches this instance's pump sees, for the ETA.
    outflow_batches: Arc<outflow::OutflowBatches>,
    /// Purchases the gate refused since the last [`QueueService::flush_refusals`], per
    /// declared target and reason: added to the record once per tick, never per request.
    refusals: Mutex<HashMap<QueueTarget, crate::domain::Refusals>>,
}

impl QueueService {
    /// Requests this instance answered without the store since start, by answer (as
    /// `virtual_queue_redis_degraded_total`).
    pub fn degraded_answers(&self) -> [(&'static str, u64); 3] {
        self.degraded.answered()
    }

    pub fn new(store: AnyStore, secret: Secret, settings: Arc<Settings>) -> Self {
        // Settings::load refuses declarations that do not parse.
        let targets = TargetCache::new(
            settings.target_types().unwrap_or_default(),
            settings.declared_targets().unwrap_or_default(),
        );
        let q = &settings.queue;
        let local = (q.local_polls && store.serves_local_polls())
            .then(|| LocalPolls::new(q.tick_ms, q.max_capacity, q.heartbeat_timeout_s));
        Self {
            store,
            secret,
            settings,
            flag: FlagCache::new(),
            global_batch: AtomicU64::new(0),
            degraded: Degraded::new(),
            registered: Mutex::new(HashMap::new()),
            local,
            issued: IssuedTokens::new(tokens::MAX_TOKENS),
            targets,
            outflow_batches: Arc::default(),
            refusals: Mutex::default(),
        }
    }

    /// The keys that sign tokens, visitor tokens and challenges.
    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// One deadline (`redis.timeout_ms`) for all of a request's store work, however many
    /// commands it takes (an enter that finds the user admitted is two scripts) and however
    /// long it queued for a shared call. Past it, the request asks the store's liveness probe,
    /// which does not depend on how busy this instance is (`store/redis/pulse.rs`):
    ///
    /// - the store is silent (down, refusing, stalled): [`StoreError::Timeout`], and the
    ///   request fails open;
    /// - the store answers: this instance is the slow part, and the request waits on behind
    ///   the others, up to [`crate::store::BUSY_WAIT_MAX`] in all, then gives up with
    ///   [`StoreError::Busy`] (answered 503 OVERLOADED: the buyer keeps their place, nobody
    ///   is let in).
    async fn bounded<T>(
        &self,
        target: QueueTarget,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.bounded_for(target, None, work).await
    }

    /// [`Self::bounded`] for one user's request: the probe is asked about the parts of the
    /// target that can hold the user (`RedisStore::silent_for`), so a sharded target's node
    /// gone fails open or closed for its own shard's users only.
    async fn bounded_for<T>(
        &self,
        target: QueueTarget,
        user: Option<&UserId>,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let silent = || match user {
            Some(u) => self.store.silent_for(target, u),
            None => self.store.silent(Some(target)),
        };
        let timeout = self.settings.redis_timeout();
        // Checks after the first deadline need not wake a starved runtime every few ms.
        let step = timeout.max(Duration::from_millis(BUSY_RECHECK_MS));
        let started = tokio::time::Instant::now();
        let mut deadline = started + timeout;
        tokio::pin!(work);
        loop {
            match tokio::time::timeout_at(deadline, &mut work).await {
                // A command's own response timeout: the same question as our deadline.
                Ok(Err(e)) if e.is_timeout() && !silent() => return Err(StoreError::Busy),
                Ok(result) => return result,
                Err(_) if silent() => return Err(StoreError::Timeout),
                Err(_) if deadline - started >= crate::store::BUSY_WAIT_MAX => return Err(StoreError::Busy),
                Err(_) => deadline += step,
            }
        }
    }

    /// Now by Redis' clock (this host's, corrected by the measured offset), in epoch ms: the
    /// clock every instance shares.
    pub fn now_ms(&self) -> u64 {
        self.store.now_ms()
    }

    /// Redis' clock minus this host's, in ms, once measured (0 for the embedded store).
    pub fn clock_offset_ms(&self) -> Option<i64> {
        self.store.clock_offset_ms()
    }

    /// [`Self::now_ms`] in epoch seconds: tokens are minted and checked by Redis' clock.
    fn now_s(&self) -> u64 {
        self.store.now_ms() / 1000
    }
}
