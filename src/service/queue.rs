//! The queue's enter, poll and leave: the flag decision, the store call, the token issued, and
//! fail-open (DIRECT_ADMITTED with a stateless token) when the store fails.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{DEFAULT_CLOSE_MESSAGE, QueueError, QueueService, QueueStatus, REGISTER_EVERY};
use crate::config::OnStoreFailure;
use crate::domain::{QueuePosition, QueueTarget, SaleControl, SaleSource, UserId};
use crate::store::prelude::*;
use crate::store::{EnterOutcome, SaleNotice, StatusOutcome, StoreError, Waiting};
use crate::token::{self, EntryToken};

/// How long after a target is counted among a user's queues its enter has surely run (an
/// enter's store work ends within `BUSY_WAIT_MAX`), so that a target without the user's place
/// is one they left, not one still being entered.
const HOLD_SETTLED: Duration = Duration::from_secs(10);

impl QueueService {
    fn candidate(&self, target: QueueTarget, user: &UserId) -> EntryToken {
        token::mint(&self.secret, target, user, self.now_s(), self.settings.token.ttl_s)
    }

    fn direct(&self, target: QueueTarget, user: &UserId) -> QueueStatus {
        QueueStatus::DirectAdmitted(self.candidate(target, user))
    }

    /// A user's queue token, read back from the store (its expiry is in its payload), and
    /// remembered: from now on it is this user's answer here (`tokens.rs`).
    fn stored_token(&self, target: QueueTarget, user: &UserId, raw: String) -> QueueStatus {
        let expires_at = token::decode(&raw).map_or(0, |(c, _, _)| c.expires_at);
        let token = EntryToken { raw, expires_at };
        self.issued.remember(target, user, &token, self.now_s());
        QueueStatus::Admitted(token)
    }

    /// The store asks for a candidate when it may issue the token in this call (a poll sends
    /// one along, an enter asks only once it found the user admitted), and keeps it unless
    /// another call issued one first. (Two calls in the same second mint equal candidates, so
    /// a race can rarely count twice.)
    /// Admitted now, the user no longer holds a place at `target`: it stops counting among
    /// their queues (`queue.max_queues_per_user`; best effort, a stale count is dropped when
    /// the limit is reached).
    async fn count_issue(
        &self,
        target: QueueTarget,
        user: &UserId,
        raw: String,
        minted: &OnceLock<EntryToken>,
    ) -> String {
        if minted.get().is_some_and(|c| c.raw == raw) {
            crate::metrics::token_issued();
            if self.settings.queue.max_queues_per_user > 0
                && !self.store.drops_holds_itself()
                && let Err(e) = self.bounded(target, self.store.release_queues(user.clone(), &[target])).await
            {
                self.degraded.missed("release", target, &e);
            }
        }
        raw
    }

    fn waiting(&self, target: QueueTarget, w: Waiting) -> QueueStatus {
        let pos = QueuePosition { seq: w.seq, admitted_mark: w.mark, ahead: w.ahead };
        QueueStatus::Waiting {
            position: w.seq,
            ahead: w.ahead,
            eta_seconds: pos.eta_seconds(self.eta_batch(target, w.batch_override), self.settings.queue.tick_ms),
            paused: w.paused,
            lane: w.lane,
        }
    }

    fn pre_queue(n: SaleNotice) -> QueueStatus {
        QueueStatus::PreQueue { opens_at_ms: n.opens_at_ms.unwrap_or(0), paused: n.paused }
    }

    fn closed(n: SaleNotice) -> QueueStatus {
        QueueStatus::Closed { message: n.message.unwrap_or_else(|| DEFAULT_CLOSE_MESSAGE.to_owned()) }
    }

    /// Closes the target's sale because the purchase API said so (`gate.close_header`).
    pub async fn close_by_purchase_api(&self, target: QueueTarget, message: String) {
        let close = SaleControl::Close { message, source: SaleSource::PurchaseApi };
        match self.bounded(target, self.store.control_sale(target, close)).await {
            Ok(true) => tracing::info!(target_queue = %target, "the purchase API closed the sale"),
            Ok(false) => {}
            Err(e) => self.degraded.missed("sale close", target, &e),
        }
    }

    /// Answered without asking the store: DIRECT_ADMITTED when the queue is off for this user
    /// and target, ADMITTED with the token this instance handed the user before, or
    /// DIRECT_ADMITTED when the store's liveness probe finds Redis down or stalled (fail-open).
    pub(super) fn bypass_store(&self, target: QueueTarget, user: &UserId) -> Option<Result<QueueStatus, QueueError>> {
        if !self.queue_applies(target, user) {
            return Some(Ok(self.direct(target, user)));
        }
        // Told ADMITTED with this token here: whatever Redis holds now (a failover may have
        // lost the token or the admission), or while it is down, the answer stays.
        if let Some(token) = self.issued.get(target, user, self.now_s()) {
            return Some(Ok(QueueStatus::Admitted(token)));
        }
        if self.store.silent_for(target, user) {
            self.degraded.record_skipped();
            return Some(self.store_down(target, user));
        }
        None
    }

    /// The answer while Redis is down (`queue.on_store_failure`): DIRECT_ADMITTED (open), or
    /// 503 QUEUE_UNAVAILABLE (closed).
    fn store_down(&self, target: QueueTarget, user: &UserId) -> Result<QueueStatus, QueueError> {
        match self.settings.queue.on_store_failure {
            OnStoreFailure::Open => Ok(self.direct(target, user)),
            OnStoreFailure::Closed => Err(QueueError::Unavailable),
        }
    }

    pub async fn enter(&self, target: QueueTarget, user: &UserId) -> Result<QueueStatus, QueueError> {
        if let Some(answer) = self.bypass_store(target, user) {
            return answer;
        }
        let minted = OnceLock::new();
        let candidate = || minted.get_or_init(|| self.candidate(target, user)).raw.clone();
        // A user given a place counts the target among their queues in the same step
        // (`queue.max_queues_per_user`, 0: no limit); one this instance knows waiting here is
        // counted already.
        let mut max = self.settings.queue.max_queues_per_user;
        if self.local_answer(target, user).is_some() {
            max = 0;
        }
        let enter =
            || self.bounded_for(target, Some(user), self.store.enter_counted(target, user.clone(), &candidate, max));
        let mut outcome = enter().await;
        if let Ok(EnterOutcome::TooMany(held)) = &outcome {
            match self.drop_left_queues(target, user, held).await {
                Ok(true) => outcome = enter().await,
                Ok(false) => {}
                Err(e) => return self.failed("enter", target, user, &e),
            }
        }
        match outcome {
            Ok(EnterOutcome::Waiting(w)) => {
                self.local_learn(target, user, Some(w.seq));
                self.register_active(target).await;
                Ok(self.waiting(target, w))
            }
            Ok(EnterOutcome::Admitted(raw)) => {
                Ok(self.stored_token(target, user, self.count_issue(target, user, raw, &minted).await))
            }
            Ok(EnterOutcome::Full) => Err(QueueError::Full(target)),
            Ok(EnterOutcome::TooMany(held)) => {
                Err(QueueError::TooManyQueues { target, held: held.into_iter().map(|(t, _)| t).collect() })
            }
            Ok(EnterOutcome::PreQueue(n)) => {
                self.register_active(target).await;
                Ok(Self::pre_queue(n))
            }
            Ok(EnterOutcome::Scheduled(n)) => Ok(QueueStatus::Scheduled {
                opens_at_ms: n.opens_at_ms.unwrap_or(0),
                prequeue_from_ms: n.prequeue_from_ms,
            }),
            Ok(EnterOutcome::Closed(n)) => {
                self.local_learn(target, user, None);
                Ok(Self::closed(n))
            }
            Err(e) => self.failed("enter", target, user, &e),
        }
    }

    pub async fn status(&self, target: QueueTarget, user: &UserId) -> Result<QueueStatus, QueueError> {
        if let Some(answer) = self.bypass_store(target, user) {
            // Held while Redis is down: a place the copy knows is still the best answer.
            return match (answer, self.local_answer(target, user)) {
                (Err(QueueError::Unavailable), Some(w)) => Ok(self.waiting(target, w)),
                (answer, _) => answer,
            };
        }
        if let Some(w) = self.local_answer(target, user) {
            return Ok(self.waiting(target, w));
        }
        let minted = OnceLock::new();
        let candidate = || minted.get_or_init(|| self.candidate(target, user)).raw.clone();
        match self.bounded_for(target, Some(user), self.store.status(target, user.clone(), &candidate)).await {
            Ok(StatusOutcome::Waiting(w)) => {
                self.local_learn(target, user, Some(w.seq));
                Ok(self.waiting(target, w))
            }
            Ok(StatusOutcome::Admitted(raw)) => {
                self.local_learn(target, user, None);
                Ok(self.stored_token(target, user, self.count_issue(target, user, raw, &minted).await))
            }
            Ok(StatusOutcome::NotInQueue) => {
                self.local_learn(target, user, None);
                Err(QueueError::NotInQueue(target))
            }
            Ok(StatusOutcome::PreQueue(n)) => Ok(Self::pre_queue(n)),
            Ok(StatusOutcome::Closed(n)) => {
                self.local_learn(target, user, None);
                Ok(Self::closed(n))
            }
            Err(e) => self.failed("poll", target, user, &e),
        }
    }

    /// At the limit of queues (`queue.max_queues_per_user`): stops counting the targets of
    /// `held` where the user no longer holds a place (admitted, evicted, a sale closed);
    /// whether any was dropped, so that the enter is worth trying again.
    async fn drop_left_queues(
        &self,
        target: QueueTarget,
        user: &UserId,
        held: &[(QueueTarget, u64)],
    ) -> Result<bool, StoreError> {
        // Only targets counted long enough ago for their enter to have run: on a cluster a
        // target is counted before its enter, so one counted just now by a racing enter holds
        // no place yet, and must not be dropped.
        let mut gone = Vec::new();
        for &(t, age_ms) in held {
            let settled = age_ms > HOLD_SETTLED.as_millis() as u64;
            if settled && !self.bounded(target, self.store.holds_place(t, user.clone())).await? {
                gone.push(t);
            }
        }
        if gone.is_empty() {
            return Ok(false);
        }
        self.bounded(target, self.store.release_queues(user.clone(), &gone)).await?;
        Ok(true)
    }

    /// Leaving is best effort: with Redis down the user is evicted later by the heartbeat.
    pub async fn leave(&self, target: QueueTarget, user: &UserId) {
        self.local_learn(target, user, None);
        if self.store.silent(Some(target)) {
            // Nobody is let in by a leave not sent: not a request answered without the queue.
            return;
        }
        if let Err(e) = self.bounded(target, self.store.leave(target, user.clone())).await {
            self.degraded.missed("leave", target, &e);
        }
        if self.settings.queue.max_queues_per_user > 0
            && !self.store.drops_holds_itself()
            && let Err(e) = self.bounded(target, self.store.release_queues(user.clone(), &[target])).await
        {
            self.degraded.missed("leave", target, &e);
        }
    }

    /// An enter or poll whose store work failed. Overloaded (Redis answers, this instance is
    /// behind): 503, the user keeps their place and retries. Otherwise fail-open: DIRECT_ADMITTED
    /// with a stateless token (but not for a write Redis refused for lack of memory); when the call may still run late in Redis (a stall), the user is
    /// taken out of the queue behind it, so they do not also hold a place.
    pub(super) fn failed(
        &self,
        what: &str,
        target: QueueTarget,
        user: &UserId,
        e: &StoreError,
    ) -> Result<QueueStatus, QueueError> {
        self.degraded.record(what, target, e);
        if matches!(e, StoreError::Busy) {
            return Err(QueueError::Overloaded);
        }
        if matches!(e, StoreError::NotReplicated { .. }) {
            // Redis took the token but its replicas did not confirm it: a failover now could
            // lose it, and another instance would hand the user a second one. Held: the next
            // poll gets the stored token once they do.
            return Err(QueueError::NotReplicated);
        }
        if e.is_out_of_memory() {
            // Redis refuses writes for lack of memory: it still answers, so this is no outage
            // to fail open for. Nobody is let in by it: a new entry is told the queue is full,
            // a waiting user to retry (their place is kept).
            return Err(if what == "enter" { QueueError::Full(target) } else { QueueError::Overloaded });
        }
        if self.settings.queue.on_store_failure == OnStoreFailure::Closed {
            // Held: a place the late call may give the user is theirs to keep.
            return Err(QueueError::Unavailable);
        }
        if e.is_timeout() {
            let (store, user) = (self.store.clone(), user.clone());
            // Sent after the late call on the same connection, so Redis runs it after that call.
            tokio::spawn(async move {
                let _ = store.leave(target, user).await;
            });
        }
        Ok(self.direct(target, user))
    }

    async fn register_active(&self, target: QueueTarget) {
        {
            let mut seen = self.registered.lock().unwrap_or_else(|e| e.into_inner());
            if seen.get(&target).is_some_and(|t| t.elapsed() < REGISTER_EVERY) {
                return;
            }
            seen.insert(target, Instant::now());
        }
        let register = async {
            self.store.register_active(target).await?;
            self.store.publish_capacity(target).await
        };
        if let Err(e) = self.bounded(target, register).await {
            // Try again at the next entry rather than in REGISTER_EVERY.
            self.registered.lock().unwrap_or_else(|e| e.into_inner()).remove(&target);
            self.degraded.missed("register", target, &e);
        }
    }
}
