//! Waiting users' polls answered from this instance's copy of the target's admission state
//! (`queue.local_polls`, Redis store only).
//!
//! A waiting user's poll needs three things from Redis: their seq (fixed for good at entry),
//! the admission mark and the departed seqs between the two, and it writes a heartbeat. The
//! instance learns each user's seq from the first enter or poll Redis answers; then, while its
//! copy of the mark is fresh, it answers that user's polls itself and sends the heartbeats to
//! Redis in one `view.lua` call per target every [`sync_every`], which also refreshes the copy
//! and says which of those users are no longer waiting. Redis is asked as before for:
//!
//! - users near the front: within two batches of the copy's mark (the mark moves at most one
//!   batch per tick and the copy is never older than a tick, so every admitted user is among
//!   them and learns it at the first poll after admission);
//! - users this instance has not seen, or forgot (admitted, left, evicted: `view.lua` names
//!   them; their next poll gets the token or 404);
//! - users behind the departed seqs the copy holds, when more users left than one `view.lua`
//!   call returns (`slices::VIEW_DEPARTED_MAX`): their `aheadCount` needs Redis' count;
//! - everyone while the copy is stale (the last sync failed or is older than four intervals):
//!   the store path then fails open as always.
//!
//! `aheadCount` from the copy is exact as of the last sync: users who left since then are
//! still counted, for at most one interval.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::QueueService;
use crate::domain::{QueueTarget, UserId};
use crate::store::{TargetView, Waiting};

/// How often the heartbeats of locally answered polls go to Redis and the copy is refreshed:
/// a quarter of a tick, at most 250 ms.
pub fn sync_every(tick_ms: u64) -> Duration {
    Duration::from_millis((tick_ms / 4).clamp(10, 250))
}

/// What the instance knows of one target.
#[derive(Default)]
struct Target {
    /// The copy and when it was read; `None` before the first sync and after a failed one.
    view: RwLock<Option<(TargetView, Instant)>>,
    /// user → (seq, last poll, seconds since the [`LocalPolls`] epoch).
    seqs: Mutex<HashMap<UserId, (u64, u32)>>,
    /// Users whose polls were answered here since the last sync.
    polled: Mutex<Vec<UserId>>,
}

pub(super) struct LocalPolls {
    targets: RwLock<HashMap<QueueTarget, Arc<Target>>>,
    epoch: Instant,
    /// Seqs remembered per target, at most (the queue's capacity).
    max_users: usize,
    valid_for: Duration,
    /// Users not seen for this long are forgotten (they have been evicted by then).
    forget_after_s: u32,
}

impl LocalPolls {
    pub(super) fn new(tick_ms: u64, max_capacity: u64, heartbeat_timeout_s: u64) -> Self {
        Self {
            targets: RwLock::default(),
            epoch: Instant::now(),
            max_users: usize::try_from(max_capacity).unwrap_or(usize::MAX),
            valid_for: sync_every(tick_ms) * 4,
            forget_after_s: u32::try_from(heartbeat_timeout_s).unwrap_or(u32::MAX).saturating_add(1),
        }
    }

    fn now_s(&self) -> u32 {
        u32::try_from(self.epoch.elapsed().as_secs()).unwrap_or(u32::MAX)
    }

    fn target(&self, target: QueueTarget) -> Option<Arc<Target>> {
        self.targets.read().unwrap_or_else(|e| e.into_inner()).get(&target).cloned()
    }

    /// The user's place from the copy, or `None` when Redis must answer (see the module
    /// doc). `batch` gives the batch size in force for a target override.
    pub(super) fn answer(
        &self,
        target: QueueTarget,
        user: &UserId,
        batch: impl Fn(Option<u64>) -> u64,
    ) -> Option<Waiting> {
        let t = self.target(target)?;
        let seq = {
            let mut seqs = t.seqs.lock().unwrap_or_else(|e| e.into_inner());
            let entry = seqs.get_mut(user)?;
            entry.1 = self.now_s();
            entry.0
        };
        let w = {
            let view = t.view.read().unwrap_or_else(|e| e.into_inner());
            let (v, at) = view.as_ref()?;
            if at.elapsed() > self.valid_for
                || v.sale_asks_store
                || seq <= v.mark.saturating_add(2 * batch(v.batch_override))
                || v.departed_known_to.is_some_and(|known| seq > known)
            {
                return None;
            }
            Waiting {
                seq,
                mark: v.mark,
                ahead: v.ahead(seq),
                batch_override: v.batch_override,
                paused: v.paused,
                lane: None,
            }
        };
        t.polled.lock().unwrap_or_else(|e| e.into_inner()).push(user.clone());
        Some(w)
    }

    /// Remembers a waiting user's seq, from an answer of Redis.
    pub(super) fn learn(&self, target: QueueTarget, user: &UserId, seq: u64) {
        let t = match self.target(target) {
            Some(t) => t,
            None => self.targets.write().unwrap_or_else(|e| e.into_inner()).entry(target).or_default().clone(),
        };
        let mut seqs = t.seqs.lock().unwrap_or_else(|e| e.into_inner());
        if seqs.len() < self.max_users || seqs.contains_key(user) {
            seqs.insert(user.clone(), (seq, self.now_s()));
        }
    }

    /// The user is not waiting any more (admitted, left, unknown to Redis).
    pub(super) fn forget(&self, target: QueueTarget, user: &UserId) {
        if let Some(t) = self.target(target) {
            t.seqs.lock().unwrap_or_else(|e| e.into_inner()).remove(user);
        }
    }

    /// The targets to sync, each with the users polled here since the last sync (taken).
    /// Targets nobody here waits for any more are dropped.
    pub(super) fn take_polled(&self) -> Vec<(QueueTarget, Vec<UserId>)> {
        let now = self.now_s();
        let mut targets = self.targets.write().unwrap_or_else(|e| e.into_inner());
        targets.retain(|_, t| {
            let mut seqs = t.seqs.lock().unwrap_or_else(|e| e.into_inner());
            seqs.retain(|_, (_, seen)| now.saturating_sub(*seen) <= self.forget_after_s);
            !seqs.is_empty()
        });
        targets
            .iter()
            .map(|(target, t)| (*target, std::mem::take(&mut *t.polled.lock().unwrap_or_else(|e| e.into_inner()))))
            .collect()
    }

    /// After a sync: the fresh copy, and the users Redis says are not waiting.
    pub(super) fn synced(&self, target: QueueTarget, view: TargetView, gone: &[UserId]) {
        let Some(t) = self.target(target) else { return };
        {
            let mut seqs = t.seqs.lock().unwrap_or_else(|e| e.into_inner());
            for u in gone {
                seqs.remove(u);
            }
        }
        *t.view.write().unwrap_or_else(|e| e.into_inner()) = Some((view, Instant::now()));
    }

    /// After a failed sync: Redis answers every poll until a sync works again; the heartbeats
    /// not written go with the next sync.
    pub(super) fn sync_failed(&self, target: QueueTarget, polled: Vec<UserId>) {
        let Some(t) = self.target(target) else { return };
        *t.view.write().unwrap_or_else(|e| e.into_inner()) = None;
        t.polled.lock().unwrap_or_else(|e| e.into_inner()).extend(polled);
    }
}

impl QueueService {
    /// A waiting user's place from this instance's copy, when it may answer (module doc).
    ///
    /// A sharded target's copy is its user's shard's, in the shard's own numbers; the most a
    /// tick may admit there is the whole target's batch (a shard may get all of it).
    pub(super) fn local_answer(&self, target: QueueTarget, user: &UserId) -> Option<Waiting> {
        // A target with lanes: the user's part is known from Redis only (`lane_of`).
        if self.store.has_lanes(target) {
            return None;
        }
        let part = self.store.user_part(target, user);
        let w = self.local.as_ref()?.answer(part, user, |o| self.most_per_tick(target, o))?;
        crate::metrics::poll_answered_locally();
        Some(w.in_whole_target(part))
    }

    /// What Redis said of a user: waiting with this seq, or not waiting (`None`).
    pub(super) fn local_learn(&self, target: QueueTarget, user: &UserId, seq: Option<u64>) {
        if let Some(local) = self.local.as_ref().filter(|_| !self.store.has_lanes(target)) {
            // A sharded target's copy is kept per shard, in the shard's own seqs.
            let part = self.store.user_part(target, user);
            match seq {
                Some(seq) => local.learn(part, user, Waiting::shard_seq(seq, part)),
                None => local.forget(part, user),
            }
        }
    }

    /// Sends the heartbeats of the polls answered here and refreshes the copies: one round,
    /// every [`sync_every`] (`app.rs`). Nothing to do without `queue.local_polls`.
    pub async fn sync_local_views(&self) {
        let Some(local) = &self.local else { return };
        for (target, polled) in local.take_polled() {
            match self.store.sync_poll_view(target, &polled).await {
                None => return,
                Some(Ok(sync)) => local.synced(target, sync.view, &sync.gone),
                Some(Err(e)) => {
                    self.degraded.missed("poll heartbeats", target, &e);
                    local.sync_failed(target, polled);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::QueueTargetType;

    fn target() -> QueueTarget {
        QueueTarget::new(QueueTargetType::LIMITED_DROP, 1)
    }

    fn synced_at(mark: u64, departed: Vec<u64>) -> LocalPolls {
        let l = LocalPolls::new(2000, 100, 60);
        for (u, seq) in [(1, 5), (2, 50), (3, 500)] {
            l.learn(target(), &UserId::from(u), seq);
        }
        l.synced(target(), TargetView { mark, batch_override: None, departed, ..TargetView::default() }, &[]);
        l
    }

    #[test]
    fn users_near_the_front_and_unknown_users_ask_redis() {
        let l = synced_at(10, vec![]);
        let batch = |_: Option<u64>| 20;
        assert_eq!(l.answer(target(), &UserId::from(1), batch), None, "seq 5 is admitted");
        assert_eq!(l.answer(target(), &UserId::from(2), batch), None, "seq 50 is within two batches of mark 10");
        assert_eq!(l.answer(target(), &UserId::from(9), batch), None, "never seen");
        let w = l.answer(target(), &UserId::from(3), batch).expect("seq 500 is far back");
        assert_eq!((w.seq, w.mark, w.ahead), (500, 10, 489));
    }

    #[test]
    fn departed_seqs_between_mark_and_user_are_not_counted_ahead() {
        let l = synced_at(10, vec![11, 300, 499, 500, 900]);
        let w = l.answer(target(), &UserId::from(3), |_| 20).expect("far back");
        assert_eq!(w.ahead, 489 - 3);
    }

    #[test]
    fn users_behind_the_departed_seqs_the_copy_holds_ask_redis() {
        let l = LocalPolls::new(2000, 100, 60);
        for (u, seq) in [(2, 200), (3, 500)] {
            l.learn(target(), &UserId::from(u), seq);
        }
        let view =
            TargetView { mark: 10, departed: vec![100, 300], departed_known_to: Some(300), ..TargetView::default() };
        l.synced(target(), view, &[]);
        let w = l.answer(target(), &UserId::from(2), |_| 20).expect("seq 200 is within what the copy knows");
        assert_eq!(w.ahead, 189 - 1);
        assert_eq!(l.answer(target(), &UserId::from(3), |_| 20), None, "seq 500 is behind it: Redis counts");
    }

    #[test]
    fn a_failed_sync_or_a_gone_user_sends_polls_to_redis_again() {
        let l = synced_at(10, vec![]);
        assert!(l.answer(target(), &UserId::from(3), |_| 20).is_some());
        let polled = l.take_polled();
        assert_eq!(polled, vec![(target(), vec![UserId::from(3)])]);
        l.sync_failed(target(), vec![UserId::from(3)]);
        assert_eq!(l.answer(target(), &UserId::from(3), |_| 20), None);
        assert_eq!(l.take_polled(), vec![(target(), vec![UserId::from(3)])], "the heartbeat is sent again");
        let view = TargetView { mark: 10, ..TargetView::default() };
        l.synced(target(), view, &[UserId::from(3)]);
        assert_eq!(l.answer(target(), &UserId::from(3), |_| 20), None, "gone: Redis answers (404 or token)");
    }
}
