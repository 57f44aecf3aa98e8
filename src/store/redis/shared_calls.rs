//! The Redis side of the shared enter/poll calls: builds the one `enter.lua` (`status.lua`)
//! call that carries every user `store::coalesce` gathered for a target, splits its reply into
//! per-user answers, and stores the token of a user an enter found admitted (`issue.lua`; a
//! poll's call stores it itself). `store/coalesce.rs` is
//! the backend-neutral part: the per-target lanes that gather the users and hand them here.

use std::fmt::Write as _;
use std::sync::Arc;

use redis::Value;
use tokio::sync::oneshot;

use super::conn::Conn;
use super::fence::Fences;
use super::holds::HoldDrop;
use super::layout::*;
use super::scripts::{Code, ENTER, ENTER_KEYS, Function, ISSUE, SALE_KEYS, STATUS, STATUS_KEYS};
use super::{RedisStore, keys};
use crate::domain::{QueueTarget, UserId};
use crate::store::coalesce::Coalescer;
use crate::store::{Candidate, SaleNotice, StoreError, StoreLimits, Waiting};

impl RedisStore {
    /// One user's enter or poll, sent with whatever else is queued for the same target; a
    /// poll carries the token signed for its user (`candidate`), stored if the call finds them
    /// admitted.
    pub(super) async fn shared_call(
        &self,
        op: Op,
        target: QueueTarget,
        user: UserId,
        candidate: Option<&dyn Candidate>,
    ) -> Result<Answer, StoreError> {
        let lanes = self.lanes.get_or_init(|| {
            let (conn, limits) = (self.conn.clone(), Arc::new(self.limits.clone()));
            let (fences, pulse, clock) = (self.fences.clone(), self.pulse.clone(), self.clock.clone());
            // A shard's lane gets a shard's part of its target's users: it waits for as many
            // as the whole target's lane would.
            let spread: fn(&(Op, QueueTarget)) -> usize = |(_, target)| target.shard.count.into();
            Coalescer::spawn_lanes(self.limits.coalesce_wait, spread, move |(op, target), jobs| {
                let now = super::store_now(clock.as_ref(), &pulse);
                execute(conn.clone(), limits.clone(), fences.clone(), Call { op, target, now }, jobs)
            })
        });
        let token = candidate.map(|c| c.token());
        lanes.ask((op, target), |reply| Job { user, token, reply }).await
    }

    /// Stores the token of a user found admitted (`issue.lua`); the candidate is signed only now.
    pub(super) async fn issue(
        &self,
        target: QueueTarget,
        user: &UserId,
        candidate: &dyn Candidate,
    ) -> Result<Answer, StoreError> {
        let drop = self.hold_drop(target);
        let (hold_target, hold_generation, hold_generation_ms) = HoldDrop::args(drop.as_ref());
        let reply: Value = ISSUE
            .key(&issue_keys(target, user, drop.as_ref().map(|d| d.generation))[..])
            .args(&IssueArgs {
                user: user.as_str(),
                token: &candidate.token(),
                token_ttl_s: self.limits.token_ttl_s,
                record_ttl_s: self.limits.record_ttl_s,
                hold_target,
                hold_generation,
                hold_generation_ms,
            })
            .invoke_async(&mut self.conn())
            .await?;
        // Shaped like a one-user status.lua reply.
        let (mut answers, seen) = parse_answers("issue.lua", reply, 1, false)?;
        self.fences.observe(target, None, seen.mark, None, seen.raised, false);
        answers.pop().ok_or_else(|| StoreError::Reply { what: "issue.lua", detail: "no answer".into() })
    }
}

/// Which shared script a job is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// `hold_max` > 0: the call also counts the queues each user given a place holds
    /// (`queue.max_queues_per_user`), on a single node, where the holds' bucket and the target
    /// are on one server (`holds.rs` counts them in calls of their own on a cluster).
    Enter {
        hold_max: u64,
    },
    Status,
}

/// One shared call: its script, its target (or shard), and now by the store's clock (the
/// holds' generation).
pub(super) struct Call {
    op: Op,
    target: QueueTarget,
    now: u64,
}

/// One user's enter or poll, waiting for its answer.
pub(super) struct Job {
    user: UserId,
    /// A poll's candidate token (`status.lua` stores it if the user is admitted).
    token: Option<String>,
    reply: oneshot::Sender<Result<Answer, StoreError>>,
}

/// One user's part of a shared reply.
pub(super) enum Answer {
    Waiting(Waiting),
    Admitted(String),
    Full,
    NotInQueue,
    /// Admitted and still in the queue: sign a token and store it with `issue.lua`.
    Issue,
    /// Refused by the count of queues: the ones the user holds, ms since each was counted.
    TooMany(Vec<(QueueTarget, u64)>),
    PreQueue(SaleNotice),
    Scheduled(SaleNotice),
    Closed(SaleNotice),
}

/// Sends one target's queued enters (or polls) as one `enter.lua` (`status.lua`) call and
/// answers each job. A job whose caller gave up before the call went out (its request failed
/// open because Redis is silent, or its client hung up) is left out, so a stalled Redis cannot
/// pile them up. A caller that gives up while the call is in Redis changes nothing here: the
/// user keeps the place the call gave them (a client that hung up polls again); a request
/// that failed open takes its user out itself (`QueueService::failed`).
async fn execute(conn: Conn, limits: Arc<StoreLimits>, fences: Arc<Fences>, call: Call, jobs: Vec<Job>) {
    let Call { op, target, now } = call;
    let (stale, jobs): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|j| j.reply.is_closed());
    for job in stale {
        let _ = job.reply.send(Err(StoreError::Timeout));
    }
    if jobs.is_empty() {
        return;
    }
    let fence = fences.fence(target);
    let (script, what, names): (&Function, _, &[&str]) = match op {
        Op::Enter { .. } => (&ENTER, "enter.lua", ENTER_KEYS),
        Op::Status => (&STATUS, "status.lua", STATUS_KEYS),
    };
    // The holds' generations, as holds.rs names them (a generation lasts the key TTL).
    let hold_max = match op {
        Op::Enter { hold_max } => hold_max,
        Op::Status => 0,
    };
    let gen_ms = limits.key_ttl_s.max(1) * 1000;
    // An enter counts the target among the user's queues; a poll that stores a token drops it
    // (a single server, where the holds and the target share the node).
    let holds = match op {
        Op::Enter { hold_max } => hold_max > 0,
        Op::Status => super::holds::drops_holds_in_call(&limits, &conn),
    };
    let hold_keys = holds.then(|| enter_hold_keys(now / gen_ms));
    let mut conn = conn;
    let mut cmd =
        script.cmd(&conn, names.len() + jobs.len() + SALE_KEYS.len() + hold_keys.as_ref().map_or(0, |k| k.len()));
    let prefix = keys::of(target, "");
    let mut key = String::with_capacity(prefix.len() + 24);
    for name in names {
        key.clear();
        key.push_str(&prefix);
        key.push_str(name);
        cmd.arg(key.as_str());
    }
    for job in &jobs {
        key.clear();
        let _ = write!(key, "{prefix}token:{}", job.user);
        cmd.arg(key.as_str());
    }
    for name in SALE_KEYS {
        cmd.arg(format!("{prefix}{name}"));
    }
    for key in hold_keys.iter().flatten() {
        cmd.arg(key.as_str());
    }
    let hold_target = target.whole().to_string();
    match op {
        Op::Enter { .. } => script.put_args(
            &mut cmd,
            &EnterArgs {
                // A shard's part of the target's capacity (the parts add up to it).
                capacity: if target.shard.is_whole() {
                    limits.capacity(target.kind)
                } else {
                    crate::domain::shard_cap(limits.capacity(target.kind), target.shard.index, target.shard.count)
                },
                key_ttl_s: limits.key_ttl_s,
                seq_seen: fence.seq_seen,
                seq_to: fence.seq_to,
                mark_seen: fence.mark,
                tick_ms: limits.tick_ms,
                record_ttl_s: limits.record_ttl_s,
                hold_max,
                hold_target: &hold_target,
                hold_generation: now / gen_ms,
                hold_generation_ms: gen_ms,
            },
        ),
        Op::Status => script.put_args(
            &mut cmd,
            &StatusArgs {
                mark_seen: fence.mark,
                key_ttl_s: limits.key_ttl_s,
                token_ttl_s: limits.token_ttl_s,
                record_ttl_s: limits.record_ttl_s,
                hold_target: if holds { &hold_target } else { "" },
                hold_generation: now / gen_ms,
                hold_generation_ms: gen_ms,
            },
        ),
    }
    for job in &jobs {
        cmd.arg(job.user.as_str());
    }
    if op == Op::Status {
        for job in &jobs {
            cmd.arg(job.token.as_deref().unwrap_or_default());
        }
    }
    let answers = match script.call::<Value>(&mut conn, &cmd).await {
        Ok(reply) => parse_answers(what, reply, jobs.len(), true),
        Err(e) => Err(e.into()),
    };
    match answers {
        Ok((answers, seen)) => {
            let seq = matches!(op, Op::Enter { .. }).then_some(seen.seq);
            fences.observe(target, seq, seen.mark, None, seen.raised, false);
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

/// What a reply says of the target's counters, for the fences.
pub(super) struct Seen {
    mark: u64,
    /// The seq counter after the call (enter.lua; 0 from the others).
    seq: u64,
    /// The fences the call raised (`fence::SEQ_RAISED`, …).
    raised: u64,
}

/// Reads `{mark, batch_override_or_0, then per user: code, a, b}`, with `with_sale` the sale's
/// five trailing items, then the seq counter and the fences raised (see `lua/enter.lua`).
fn parse_answers(
    what: &'static str,
    reply: Value,
    users: usize,
    with_sale: bool,
) -> Result<(Vec<Answer>, Seen), StoreError> {
    let bad = |reply: &[Value]| StoreError::Reply { what, detail: format!("{reply:?}") };
    let Value::Array(items) = reply else {
        return Err(StoreError::Reply { what, detail: format!("{reply:?}") });
    };
    let int = |v: &Value| match v {
        Value::Int(n) => u64::try_from(*n).ok(),
        _ => None,
    };
    let (Some(mark), Some(batch)) = (items.first().and_then(int), items.get(1).and_then(int)) else {
        return Err(bad(&items));
    };
    if items.len() != 2 + 3 * users + if with_sale { 5 } else { 0 } + 2 {
        return Err(bad(&items));
    }
    let (Some(seq), Some(raised)) = (items.get(items.len() - 2).and_then(int), items.last().and_then(int)) else {
        return Err(bad(&items));
    };
    let seen = Seen { mark, seq, raised };
    let notice = match &items[2 + 3 * users..items.len() - 2] {
        [_phase, opens, from, paused, message] => SaleNotice {
            opens_at_ms: int(opens).filter(|t| *t > 0),
            prequeue_from_ms: int(from).filter(|t| *t > 0),
            paused: int(paused) == Some(1),
            message: match message {
                Value::BulkString(m) if !m.is_empty() => Some(String::from_utf8_lossy(m).into_owned()),
                _ => None,
            },
        },
        _ => SaleNotice::default(),
    };
    items[2..2 + 3 * users]
        .chunks_exact(3)
        .map(|a| match (int(&a[0]).and_then(Code::of), &a[1], int(&a[2])) {
            (Some(Code::Waiting), v, Some(ahead)) => Ok(Answer::Waiting(Waiting {
                seq: int(v).ok_or_else(|| bad(&items))?,
                mark,
                ahead,
                batch_override: (batch > 0).then_some(batch),
                paused: notice.paused,
                lane: None,
            })),
            (Some(Code::PreQueue), _, _) => Ok(Answer::PreQueue(notice.clone())),
            (Some(Code::Scheduled), _, _) => Ok(Answer::Scheduled(notice.clone())),
            (Some(Code::Closed), _, _) => Ok(Answer::Closed(notice.clone())),
            (Some(Code::Admitted), Value::BulkString(token), _) => {
                Ok(Answer::Admitted(String::from_utf8(token.clone()).map_err(|_| bad(&items))?))
            }
            (Some(Code::Full), _, _) => Ok(Answer::Full),
            (Some(Code::NotInQueue), _, _) => Ok(Answer::NotInQueue),
            (Some(Code::Issue), _, _) => Ok(Answer::Issue),
            (Some(Code::TooMany), Value::BulkString(held), _) => Ok(Answer::TooMany(parse_held(held))),
            _ => Err(bad(&items)),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(|answers| (answers, seen))
}

/// The queues a user holds, as `enter.lua` names them with TOO_MANY: "TARGET=ms TARGET=ms ...",
/// the ms since each was counted. A target that no longer parses counts for nothing (as in
/// `holds.rs`).
fn parse_held(held: &[u8]) -> Vec<(QueueTarget, u64)> {
    String::from_utf8_lossy(held)
        .split(' ')
        .filter_map(|e| {
            let (t, ms) = e.rsplit_once('=')?;
            Some((t.parse().ok()?, ms.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_held_queues_of_a_refused_enter_are_read_by_name() {
        let held = parse_held(b"LIMITED_DROP:1=1500 TICKETING_EVENT:4=0 not a target");
        let t = |s: &str| s.parse::<QueueTarget>().expect("target");
        assert_eq!(held, [(t("LIMITED_DROP:1"), 1500), (t("TICKETING_EVENT:4"), 0)]);
    }
}
