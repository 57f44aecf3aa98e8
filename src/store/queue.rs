//! A target's line: entering, polling, leaving, admitting, evicting, the per-user queue count and
//! the admission lock.

use std::future::Future;

use super::{AdmitOutcome, EnterOutcome, Evicted, StatusOutcome, StoreError, TargetSnapshot};
use crate::domain::{Ms, QueueTarget, UserId, Users};

/// Queue state of one target, in domain words. Every method is one atomic step.
pub trait QueueOps: Send + Sync + 'static {
    /// Idempotent: a user already waiting keeps their seq; an admitted user gets their token.
    fn enter(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> impl Future<Output = Result<EnterOutcome, StoreError>> + Send;

    /// As [`enter`](Self::enter), and a user given a place counts `target` among the queues
    /// they hold (as [`hold_queue`](Self::hold_queue) does), unless `max` are counted already:
    /// then [`EnterOutcome::TooMany`] and nothing is written. A user the queue knows already
    /// (waiting, admitted, pre-queued) is not counted again. `max` 0: [`enter`](Self::enter).
    fn enter_counted(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
        max: u64,
    ) -> impl Future<Output = Result<EnterOutcome, StoreError>> + Send;

    /// The poll: refreshes the heartbeat, issues the token once the mark reaches the seq.
    fn status(
        &self,
        target: QueueTarget,
        user: UserId,
        candidate: &dyn Candidate,
    ) -> impl Future<Output = Result<StatusOutcome, StoreError>> + Send;

    /// Returns whether the user was waiting.
    fn leave(&self, target: QueueTarget, user: UserId) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Counts `target` among the queues `user` holds a place in, unless `max` are counted
    /// already: empty when counted (now or before), else the targets counted, each with the
    /// ms since it was counted. The count is per user across targets
    /// (`queue.max_queues_per_user`) and lives `queue.key_ttl_s` after its last change, as a
    /// target's keys do.
    fn hold_queue(
        &self,
        user: UserId,
        target: QueueTarget,
        max: u64,
    ) -> impl Future<Output = Result<Vec<(QueueTarget, u64)>, StoreError>> + Send;

    /// Whether a token issued (by `enter` or `status`) and a `leave` stop counting the target
    /// among the user's queues in the same call, so the caller sends no `release_queues` for
    /// them: the Redis store on a single server, where the counts and the target are on one node.
    fn drops_holds_itself(&self) -> bool {
        false
    }

    /// Stops counting `targets` among `user`'s queues.
    fn release_queues(
        &self,
        user: UserId,
        targets: &[QueueTarget],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether `user` holds a place at `target`: waiting (admitted but not yet told included)
    /// or pre-queued.
    fn holds_place(&self, target: QueueTarget, user: UserId) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// `SET NX PX` on the target's admission lock.
    fn try_lock_admission(
        &self,
        target: QueueTarget,
        holder: &str,
        ttl_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Advances the mark by one batch of live users, at most once per `tick` of the store's clock.
    fn admit(
        &self,
        target: QueueTarget,
        default_batch: Users,
        tick: Ms,
    ) -> impl Future<Output = Result<AdmitOutcome, StoreError>> + Send;

    /// [`Self::admit`], naming the instance that runs the step in the admission ledger.
    fn admit_by(
        &self,
        target: QueueTarget,
        default_batch: Users,
        tick: Ms,
        instance: &str,
    ) -> impl Future<Output = Result<AdmitOutcome, StoreError>> + Send {
        let _ = instance;
        self.admit(target, default_batch, tick)
    }

    /// Removes up to `max` users whose last poll is at least `timeout` old, and says
    /// whether a next call may find more (the Redis store sweeps the waiting users' heartbeats
    /// a bounded slice a call, so a call that evicts nobody may still have seqs left to read).
    fn evict(
        &self,
        target: QueueTarget,
        timeout: Ms,
        max: Users,
    ) -> impl Future<Output = Result<Evicted, StoreError>> + Send;

    fn snapshot(&self, target: QueueTarget) -> impl Future<Output = Result<TargetSnapshot, StoreError>> + Send;
}

/// The token to store if a call admits the user now. An enter makes it only then (signing
/// costs an HMAC, and nearly every enter finds the user new or waiting); a poll that reaches
/// the store makes it first and sends it along, so the call that finds its user admitted
/// stores it there and then.
pub trait Candidate: Sync {
    fn token(&self) -> String;
}

impl Candidate for &str {
    fn token(&self) -> String {
        (*self).to_owned()
    }
}

impl<F: Fn() -> String + Sync> Candidate for F {
    fn token(&self) -> String {
        self()
    }
}
