//! The queues each user holds a place in (`queue.max_queues_per_user`), counted and dropped in
//! shared calls: the users' entries are gathered per bucket while earlier calls are in flight
//! (`store::coalesce`, as enters are) and go to Redis as one `user_hold.lua` call, which handles
//! them one after the other, each as if alone.
//!
//! A bucket is one set of HASHes (`keys::user_holds`, one field per user, in generations): one
//! bucket on a single server, where `enter.lua` counts the users it gives a place in the same
//! call (`shared_calls.rs`) and this file only drops targets; [`CLUSTER_BUCKETS`] on a cluster,
//! each in a slot of its own, so the users spread over the nodes and one call carries the
//! users of one bucket (counted before their enter, `QueueOps::enter_counted`).
//!
//! On a cluster a count needs no script where the fields say enough, as for most new users (a
//! single server counts in `enter.lua`'s own call): one pipeline per bucket's drain writes each
//! user's field if it is missing (`HSETNX` of the current generation), reads it back and asks
//! whether the previous generation has the user ([`count_ahead`]). A script call (~19 µs of
//! Redis' Lua for one user, docs/benchmarks.md) then carries only the users who hold other
//! queues, those the previous generation holds (a count written ahead for them is checked
//! there), and the drops.

use std::sync::Arc;

use redis::{FromRedisValue, Value};
use tokio::sync::oneshot;

use super::RedisStore;
use super::conn::Conn;
use super::layout::*;
use super::scripts::USER_HOLD;
use crate::domain::{QueueTarget, UserId};
use crate::store::StoreError;
use crate::store::coalesce::Coalescer;

/// Buckets of users on a Redis Cluster: enough to spread over the primaries of any cluster
/// this runs on, few enough that a coalesced enter's users share calls.
pub(super) const CLUSTER_BUCKETS: u32 = 16;

/// What an entry asks of the user's count.
#[derive(Debug, Clone, Copy)]
pub(super) enum HoldOp {
    /// Count the target unless the user holds this many already.
    Count {
        max: u64,
    },
    /// The target was counted ahead ([`count_ahead`]) for a user the previous generation holds
    /// too: keep it only while they hold fewer than this many others.
    Check {
        max: u64,
    },
    Drop,
}

/// Away from a generation's edge by at least this much (by the instance's estimate of Redis'
/// clock), a count may be written ahead into the generation the instance takes for Redis'
/// current one; nearer, the script decides by Redis' own clock.
const EDGE_MS: u64 = 2_000;

/// One user's entry, waiting for its answer: the targets the user holds when the count was
/// refused (with ms since each was counted), none otherwise.
pub(super) struct HoldJob {
    user: UserId,
    target: QueueTarget,
    op: HoldOp,
    reply: oneshot::Sender<Result<Vec<(QueueTarget, u64)>, StoreError>>,
}

/// Held targets per entry.
type Held = Vec<(QueueTarget, u64)>;

/// Whether the calls that end a user's place drop the target from their holds themselves (see
/// [`RedisStore::drops_holds_in_call`]), for callers without the store.
pub(super) fn drops_holds_in_call(limits: &crate::store::StoreLimits, conn: &super::conn::Conn) -> bool {
    limits.hold_queues && !conn.is_cluster()
}

/// Where a call that ends a user's place (`issue.lua`, `leave.lua`) drops the target from their
/// holds itself: the target as the holds name it, the generation now and its length.
pub(super) struct HoldDrop {
    pub target: String,
    pub generation: u64,
    pub generation_ms: u64,
}

impl HoldDrop {
    /// `(hold_target, hold_generation, hold_generation_ms)` as the scripts take them: no drop
    /// is an empty target.
    pub fn args(drop: Option<&Self>) -> (&str, u64, u64) {
        drop.map_or(("", 0, 0), |d| (d.target.as_str(), d.generation, d.generation_ms))
    }
}

impl RedisStore {
    /// Whether the calls that end a user's place drop the target from their holds themselves:
    /// the holds are counted and live on the target's node (a single server, or the embedded
    /// store).
    pub(super) fn drops_holds_in_call(&self) -> bool {
        drops_holds_in_call(&self.limits, &self.conn)
    }

    /// What such a call sends to drop `target` (its whole target) from a user's holds, when
    /// [`drops_holds_in_call`](Self::drops_holds_in_call).
    pub(super) fn hold_drop(&self, target: QueueTarget) -> Option<HoldDrop> {
        self.drops_holds_in_call().then(|| {
            let generation_ms = self.limits.key_ttl_s.max(1) * 1000;
            HoldDrop { target: target.whole().to_string(), generation: self.now_ms() / generation_ms, generation_ms }
        })
    }

    /// Whether the node of `user`'s bucket of holds failed its last probe (on a cluster; on a
    /// single server the holds live with the target).
    pub(super) fn holds_silent(&self, user: &UserId) -> bool {
        // Any node silent first, where the tag would be formatted for every enter.
        self.conn.is_cluster()
            && self.pulse.any_silent()
            && self.pulse.silent_tag(Some(&format!("h{}", bucket_of(user, CLUSTER_BUCKETS))))
    }

    /// One user's entry, sent with whatever else is queued for the same bucket.
    pub(super) async fn hold_call(&self, user: UserId, target: QueueTarget, op: HoldOp) -> Result<Held, StoreError> {
        let buckets = if self.conn.is_cluster() { CLUSTER_BUCKETS } else { 1 };
        let lanes = self.holds.get_or_init(|| {
            let conn = self.conn.clone();
            let gen_ms = self.limits.key_ttl_s.max(1) * 1000;
            let (pulse, clock, cluster) = (self.pulse.clone(), self.clock.clone(), self.conn.is_cluster());
            Coalescer::spawn_lanes(
                self.limits.coalesce_wait,
                |_| 1,
                move |bucket, jobs| {
                    let now = super::store_now(clock.as_ref(), &pulse);
                    // Written ahead only with Redis' clock known (measured, or the store's own).
                    // On a single server enter.lua counts, and its call reads the previous
                    // generation only for users the current one lacks: nothing is written ahead there.
                    let known = cluster && (clock.is_some() || pulse.clock_offset_ms().is_some());
                    let ahead = (known && now % gen_ms >= EDGE_MS && gen_ms - now % gen_ms >= EDGE_MS).then_some(now);
                    execute(conn.clone(), bucket, now / gen_ms, gen_ms, ahead, jobs)
                },
            )
        });
        let bucket = bucket_of(&user, buckets);
        lanes.ask(bucket, |reply| HoldJob { user, target, op, reply }).await
    }
}

/// The bucket of a user: FNV-1a of the id, the same on every instance and version.
fn bucket_of(user: &UserId, buckets: u32) -> u32 {
    let hash = user.as_str().bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    hash % buckets
}

/// Answers one bucket's queued entries: the counts that need no script first (with `ahead`,
/// Redis' time now by the instance's estimate, when a count may be written ahead), then the
/// rest as one `user_hold.lua` call (left out: jobs whose caller gave up before the call went
/// out, as in `shared_calls.rs`).
async fn execute(mut conn: Conn, bucket: u32, generation: u64, gen_ms: u64, ahead: Option<u64>, jobs: Vec<HoldJob>) {
    let (stale, mut jobs): (Vec<HoldJob>, Vec<HoldJob>) = jobs.into_iter().partition(|j| j.reply.is_closed());
    for job in stale {
        let _ = job.reply.send(Err(StoreError::Timeout));
    }
    if let Some(now) = ahead {
        // The counts (with their limit), apart from the rest.
        let mut counts = Vec::new();
        for job in std::mem::take(&mut jobs) {
            match job.op {
                HoldOp::Count { max } if max > 0 => counts.push((job, max)),
                _ => jobs.push(job),
            }
        }
        if !counts.is_empty() {
            match count_ahead(&mut conn, bucket, generation, gen_ms, now, &counts).await {
                Ok(decided) => {
                    for ((mut job, _), decision) in counts.into_iter().zip(decided) {
                        match decision {
                            Ahead::Answer(held) => {
                                let _ = job.reply.send(Ok(held));
                            }
                            Ahead::Script(op) => {
                                job.op = op;
                                jobs.push(job);
                            }
                        }
                    }
                }
                Err(e) => {
                    for (job, _) in counts {
                        let _ = job.reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }
    if jobs.is_empty() {
        return;
    }
    let mut cmd = USER_HOLD.cmd(&conn, 3);
    for key in user_hold_keys(bucket, generation) {
        cmd.arg(key);
    }
    USER_HOLD.put_args(&mut cmd, &UserHoldArgs { generation, generation_ms: gen_ms });
    for job in &jobs {
        cmd.arg(job.user.as_str());
        match job.op {
            HoldOp::Count { max } => cmd.arg(format!("{}={max}", job.target)),
            HoldOp::Check { max } => cmd.arg(format!("{}?{max}", job.target)),
            HoldOp::Drop => cmd.arg(job.target.to_string()),
        };
    }
    let answers = match USER_HOLD.call::<Value>(&mut conn, &cmd).await {
        Ok(reply) => parse(reply, jobs.len()),
        Err(e) => Err(e.into()),
    };
    match answers {
        Ok(answers) => {
            for (job, answer) in jobs.into_iter().zip(answers) {
                let _ = job.reply.send(Ok(answer));
            }
        }
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
        }
    }
}

/// What the fields said of a count: its answer (nothing held against it, or the queues held
/// when `max` are), or what a script must do.
enum Ahead {
    Answer(Held),
    Script(HoldOp),
}

/// Counts without a script, in one pipeline for the bucket's drain: per user `HSETNX` of the
/// current generation's field (`TARGET=ms`, ms = `now`), `HGET` of it and `HEXISTS` in the
/// previous generation; then the current generation's expiry, as `user_hold.lua` sets it.
/// A field written here is the count; one that was there answers when it holds the target
/// (counted before) or `max` others (refused). Anything else, or a user the previous
/// generation holds, goes to the script: a count written here for such a user as a check.
async fn count_ahead(
    conn: &mut Conn,
    bucket: u32,
    generation: u64,
    gen_ms: u64,
    now: u64,
    jobs: &[(HoldJob, u64)],
) -> Result<Vec<Ahead>, StoreError> {
    let [older, current, _] = user_hold_keys(bucket, generation);
    let mut p = redis::pipe();
    for (job, _) in jobs {
        let user = job.user.as_str();
        p.hset_nx(&current, user, format!("{}={now}", job.target)).hget(&current, user).hexists(&older, user);
    }
    p.cmd("PEXPIREAT").arg(&current).arg((generation + 2) * gen_ms).ignore();
    let replies: Vec<(bool, Option<String>, bool)> = {
        let flat: Vec<Value> = p.query_async(conn).await?;
        let bad = || StoreError::Reply { what: "holds pipeline", detail: format!("{flat:?}") };
        if flat.len() != 3 * jobs.len() {
            return Err(bad());
        }
        let mut out = Vec::with_capacity(jobs.len());
        for r in flat.chunks(3) {
            let (Ok(written), Ok(field), Ok(older)) = (
                bool::from_redis_value(r[0].clone()),
                Option::<String>::from_redis_value(r[1].clone()),
                bool::from_redis_value(r[2].clone()),
            ) else {
                return Err(bad());
            };
            out.push((written, field, older));
        }
        out
    };
    Ok(jobs
        .iter()
        .zip(replies)
        .map(|((job, max), (written, field, older))| {
            let max = *max;
            if older {
                return Ahead::Script(if written { HoldOp::Check { max } } else { job.op });
            }
            if written {
                return Ahead::Answer(Vec::new());
            }
            let Some(field) = field else { return Ahead::Script(job.op) };
            let target = job.target.to_string();
            let entries: Vec<(&str, u64)> = field
                .split(' ')
                .filter_map(|e| e.split_once('=').and_then(|(t, ms)| Some((t, ms.parse().ok()?))))
                .collect();
            if entries.iter().any(|(t, _)| *t == target) {
                Ahead::Answer(Vec::new())
            } else if entries.len() as u64 >= max {
                Ahead::Answer(
                    entries.into_iter().filter_map(|(t, ms)| Some((t.parse().ok()?, now.saturating_sub(ms)))).collect(),
                )
            } else {
                Ahead::Script(job.op)
            }
        })
        .collect())
}

/// Reads `n, then n pairs (target, ms since counted)` per entry. A target that no longer
/// parses counts for nothing.
fn parse(reply: Value, entries: usize) -> Result<Vec<Held>, StoreError> {
    let bad = || StoreError::Reply { what: "user_hold.lua", detail: format!("{reply:?}") };
    let Value::Array(items) = &reply else { return Err(bad()) };
    let int = |v: &Value| match v {
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    };
    let mut items = items.iter();
    let mut out = Vec::with_capacity(entries);
    for _ in 0..entries {
        let n = items.next().and_then(int).ok_or_else(bad)?;
        let mut held = Vec::new();
        for _ in 0..n {
            let (Some(Value::BulkString(t)), Some(age)) = (items.next(), items.next().and_then(int)) else {
                return Err(bad());
            };
            if let Some(t) = std::str::from_utf8(t).ok().and_then(|t| t.parse().ok()) {
                held.push((t, age));
            }
        }
        out.push(held);
    }
    if items.next().is_some() {
        return Err(bad());
    }
    Ok(out)
}

/// The coalescer's lanes, one per bucket (started at first use, on the caller's runtime).
pub(super) type HoldLanes = Arc<std::sync::OnceLock<Coalescer<u32, HoldJob>>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_keeps_their_bucket_and_users_spread_over_the_buckets() {
        let b = |u: u64| bucket_of(&UserId::from(u), CLUSTER_BUCKETS);
        assert_eq!(b(7), b(7));
        let used: std::collections::BTreeSet<u32> = (0..1000).map(b).collect();
        assert_eq!(used.len(), CLUSTER_BUCKETS as usize);
        assert_eq!(bucket_of(&UserId::from(7), 1), 0);
    }
}
