//! The gate's purchase claims, shared per target as enters and polls are (`shared_calls.rs`):
//! the claims of one target (or one part of it) that reach an instance while its previous
//! claim call is in flight go out as one `token_claim.lua` call, which makes each as if alone,
//! one after the other. The call's replicas are waited for once (`durable.rs`) before any of
//! its claims is forwarded; when they do not confirm, each claim made is given back. The
//! purchases that succeed are counted the same way, one `MULTI` for those of a part that reach
//! an instance together.

use std::sync::Arc;

use redis::Value;
use tokio::sync::oneshot;

use super::conn::Conn;
use super::durable::Durable;
use super::layout::*;
use super::pulse::Pulse;
use super::scripts::{TOKEN_CLAIM, TOKEN_RELEASE};
use super::{codec, keys};
use crate::domain::{Ms, PurchaseLimits, QueueTarget, Ticks, UserId, Users};
use crate::store::coalesce::Coalescer;
use crate::store::{PaceSlot, PacedClaim, RecordedPurchase, StoreError, TokenClaim};

/// What every claim of one call shares: the target's part that holds the users' keys, the
/// purchase limits, and the pacing asked (default budget, tick, ticks ahead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lane {
    pub part: QueueTarget,
    pub limits: PurchaseLimits,
    pub pace: Option<(Users, Ms, Ticks)>,
}

/// One claim, waiting for its answer.
pub(super) struct Job {
    pub user: UserId,
    pub token: String,
    pub ttl_s: u64,
    pub reply: oneshot::Sender<Result<PacedClaim, StoreError>>,
}

pub(super) type Lanes = Arc<std::sync::OnceLock<Coalescer<Lane, Job>>>;

/// What the claim call needs besides its jobs.
#[derive(Clone)]
pub(super) struct Ctx {
    pub conn: Conn,
    pub durable: Arc<Durable>,
    pub pulse: Arc<Pulse>,
    pub key_ttl_s: u64,
}

/// A claim's answer as `token_claim.lua` gives it: made (with the token key's previous value
/// and the reserved tick, if one was asked), refused, or failed alone.
enum Made {
    Claimed { previous: Option<String>, slot: Option<PaceSlot> },
    Other(Result<PacedClaim, StoreError>),
}

/// Sends one lane's queued claims as one `token_claim.lua` call and answers each. A claim whose
/// caller gave up before the call went out (its request timed out or its client hung up) is
/// left out: nothing is claimed for it, and it was not forwarded.
pub(super) async fn execute(ctx: Ctx, lane: Lane, jobs: Vec<Job>) {
    let (stale, jobs): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|j| j.reply.is_closed());
    for job in stale {
        let _ = job.reply.send(Err(StoreError::Timeout));
    }
    if jobs.is_empty() {
        return;
    }
    let Lane { part, limits, pace } = lane;
    let keys = token_claim_shared_keys(part, jobs.iter().map(|j| &j.user));
    let mut conn = ctx.conn.clone();
    let mut cmd = TOKEN_CLAIM.cmd(&conn, keys.len());
    for key in &keys {
        cmd.arg(key.as_str());
    }
    let (budget, tick, ahead) = pace.map_or((0, 0, 0), |(b, t, a)| (b.get(), t.get(), a.get()));
    TOKEN_CLAIM.put_args(
        &mut cmd,
        &TokenClaimArgs {
            per_admission: limits.per_admission,
            per_user: limits.per_user,
            key_ttl_s: ctx.key_ttl_s,
            pace_tick_ms: tick,
            pace_budget: budget,
            pace_ahead: ahead,
        },
    );
    for job in &jobs {
        cmd.arg(job.token.as_str()).arg(job.ttl_s.max(1)).arg(job.user.as_str());
    }
    let made = match TOKEN_CLAIM.call::<Value>(&mut conn, &cmd).await {
        Ok(reply) => parse(reply, jobs.len(), pace.is_some()),
        Err(e) => Err(e.into()),
    };
    let made = match made {
        Ok(made) => made,
        Err(e) => {
            for job in jobs {
                let _ = job.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    // Forwarded only once a failover cannot lose the marks; otherwise given back, so each buyer
    // can try again with the same token (a place reserved stays taken). Given back last claim
    // first: a user's later claim in the call may have moved an earlier one's mark (two tokens
    // of one user), and each release puts back what its claim found.
    let any = made.iter().any(|m| matches!(m, Made::Claimed { .. }));
    let durable = if any { ctx.durable.confirm(part, &ctx.pulse).await } else { Ok(()) };
    let mut answers = Vec::with_capacity(jobs.len());
    for (job, made) in jobs.iter().zip(made).rev() {
        answers.push(match (made, &durable) {
            (Made::Claimed { previous, slot }, Ok(())) => Ok(PacedClaim::Claim(TokenClaim::Claimed { previous }, slot)),
            (Made::Claimed { previous, .. }, Err(e)) => {
                match release(&mut conn, part, &job.user, &job.token, previous.as_deref(), limits).await {
                    Ok(()) => Err(e.clone()),
                    Err(released) => Err(released),
                }
            }
            (Made::Other(answer), _) => answer,
        });
    }
    for (job, answer) in jobs.into_iter().zip(answers.into_iter().rev()) {
        let _ = job.reply.send(answer);
    }
}

/// Gives a claim back (`token_release.lua`).
pub(super) async fn release(
    conn: &mut Conn,
    part: QueueTarget,
    user: &UserId,
    token: &str,
    previous: Option<&str>,
    limits: PurchaseLimits,
) -> Result<(), StoreError> {
    let _: u64 = TOKEN_RELEASE
        .key(&token_claim_keys(part, user)[..])
        .args(&TokenReleaseArgs {
            token,
            previous: previous.unwrap_or_default(),
            per_admission: limits.per_admission,
            per_user: limits.per_user,
            user: user.as_str(),
        })
        .invoke_async(conn)
        .await?;
    Ok(())
}

/// Reads four items per claim (see `lua/token_claim.lua`).
fn parse(reply: Value, claims: usize, paced: bool) -> Result<Vec<Made>, StoreError> {
    let bad = |detail: String| StoreError::Reply { what: "token_claim.lua", detail };
    let Value::Array(items) = reply else {
        return Err(bad(format!("{reply:?}")));
    };
    if items.len() != 4 * claims {
        return Err(bad(format!("{items:?}")));
    }
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    };
    let ms = |v: &Value| text(v).and_then(|t| t.parse::<u64>().ok());
    let made = items
        .chunks_exact(4)
        .map(|a| {
            let code = match &a[0] {
                Value::Int(n) => *n,
                other => return Made::Other(Err(bad(format!("{other:?}")))),
            };
            match code {
                1 => {
                    let previous = text(&a[1]).filter(|p| !p.is_empty());
                    let slot = ms(&a[2])
                        .zip(ms(&a[3]))
                        .map(|(starts_in_ms, ends_in_ms)| PaceSlot { starts_in_ms, ends_in_ms });
                    if paced && slot.is_none() {
                        return Made::Other(Err(bad(format!("{a:?}"))));
                    }
                    Made::Claimed { previous, slot }
                }
                0 => Made::Other(Ok(PacedClaim::Claim(TokenClaim::AlreadyUsed, None))),
                2 => Made::Other(Ok(PacedClaim::Claim(TokenClaim::UserLimit, None))),
                3 if paced => Made::Other(Ok(PacedClaim::Full)),
                4 => Made::Other(Err(bad(text(&a[1]).unwrap_or_default()))),
                _ => Made::Other(Err(bad(format!("{a:?}")))),
            }
        })
        .collect();
    Ok(made)
}

/// A purchase that succeeded, to be counted: its claim's user, whether the token was the
/// queue's, and the purchase's count in the record (only where the user's part is the target).
pub(super) struct Settled {
    pub user: UserId,
    pub through_queue: bool,
    pub recorded: Option<RecordedPurchase>,
    pub reply: oneshot::Sender<Result<(), StoreError>>,
}

pub(super) type SettleLanes = Arc<std::sync::OnceLock<Coalescer<QueueTarget, Settled>>>;

/// Counts one part's settled purchases in one `MULTI` (the keys share the part's slot): the
/// tokens used (`waits`, and the record's `tu`/`tud`), each purchase's count in the record, and
/// the queue tokens' places among the unused ones; the counts of a call add up its purchases.
pub(super) async fn settle(mut conn: Conn, record_ttl_s: u64, part: QueueTarget, jobs: Vec<Settled>) {
    let (queue, direct) = jobs.iter().fold((0, 0), |(q, d), j| if j.through_queue { (q + 1, d) } else { (q, d + 1) });
    let record = keys::of(part, "record");
    let waits = keys::of(part, "waits");
    let mut p = redis::pipe();
    p.atomic();
    for (field, in_record, n) in [("tokens_used", "tu", queue), ("direct_tokens_used", "tud", direct)] {
        if n > 0 {
            p.hincr(&waits, field, n).ignore().hincr(&record, in_record, n).ignore();
        }
    }
    let mut purchases: Vec<(RecordedPurchase, u64)> = Vec::new();
    for r in jobs.iter().filter_map(|j| j.recorded) {
        match purchases.iter_mut().find(|(p, _)| *p == r) {
            Some((_, n)) => *n += 1,
            None => purchases.push((r, 1)),
        }
    }
    for (r, n) in purchases {
        p.hincr(&record, codec::purchase_field(r.tick, r.answer), n).ignore();
    }
    p.expire(&record, record_ttl_s as i64).ignore();
    let unused: Vec<&str> = jobs.iter().filter(|j| j.through_queue).map(|j| j.user.as_str()).collect();
    if !unused.is_empty() {
        p.zrem(keys::of(part, "unused"), unused).ignore();
    }
    let result: Result<(), StoreError> = p.query_async(&mut conn).await.map_err(Into::into);
    for job in jobs {
        let _ = job.reply.send(result.clone());
    }
}
