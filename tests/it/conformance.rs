//! One suite, two stores: the embedded store must behave like the Redis scripts, or it goes.
//! Redis is the reference; every operation of the store contract runs here on both (this file:
//! entering, admitting, polling, leaving; the submodules: the rest; `admit_by`,
//! `pending_opening` and `place_opening` through the pump's tick in `sale.rs`). The embedded
//! store runs on a manual clock each check steps ([`Time`]); Redis' `TIME` cannot be stepped,
//! so there the same steps wait until Redis' clock has moved.

mod events;
mod expiry;
mod gate;
mod limits;
mod operator;
mod queue;
mod record;
mod redis_only;
mod sale;

use std::sync::Arc;
use std::time::{Duration, Instant};

use vq::clock::ManualClock;
use vq::config::{Settings, StoreKind};
use vq::domain::{FlagChange, QueueTarget, TargetOverride, UserId};
use vq::store::prelude::*;
use vq::store::{AnyStore, EnterOutcome, RedisStore, StatusOutcome, StoreLimits};

use crate::support::{RedisServer, open_store, test_settings};
use vq::domain::{Ms, Users};

fn t() -> QueueTarget {
    "limited-drop:42".parse().expect("target")
}

async fn with_both(check: impl AsyncFn(AnyStore, Time)) {
    with_both_configured(|_| {}, check).await;
}

/// Runs `check` on a Redis store, then on the embedded one (on a manual clock), both configured
/// alike (capacity 5, then `configure`); the store under test is printed first, so a failure
/// names it.
async fn with_both_configured(configure: impl Fn(&mut Settings), check: impl AsyncFn(AnyStore, Time)) {
    let redis = RedisServer::spawn();
    for mut s in [test_settings(Some(&redis)), test_settings(None)] {
        s.queue.max_capacity = 5;
        configure(&mut s);
        eprintln!("conformance: {:?} store", s.store);
        let (store, time) = Time::open(&s);
        check(store, time).await;
    }
}

/// The time a check runs on: the embedded store's manual clock, stepped at once; Redis'
/// `TIME`, waited for.
#[derive(Clone)]
struct Time {
    /// The tick the checks admit with.
    tick_ms: u64,
    store: AnyStore,
    manual: Option<ManualClock>,
}

impl Time {
    /// The store to check and its time: an embedded store is opened anew, on a manual clock
    /// standing at this host's now.
    fn open(settings: &Settings) -> (AnyStore, Time) {
        Self::open_with(settings.store.clone(), settings.limits(), || open_store(settings))
    }

    /// [`Self::open`] with the stores' limits given; `redis` opens the Redis store.
    fn open_with(kind: StoreKind, limits: StoreLimits, redis: impl FnOnce() -> AnyStore) -> (AnyStore, Time) {
        let (store, manual) = match kind {
            StoreKind::Memory => {
                let clock = ManualClock::at_system_now();
                (RedisStore::embedded(limits, Arc::new(clock.clone())).expect("embedded store"), Some(clock))
            }
            StoreKind::Redis => (redis(), None),
        };
        (store.clone(), Time { tick_ms: 500, store, manual })
    }

    /// The time of a Redis store opened by the check itself.
    fn of_redis(store: &AnyStore) -> Time {
        Time { tick_ms: 500, store: store.clone(), manual: None }
    }

    /// Now by the store's clock, epoch ms.
    fn now_ms(&self) -> u64 {
        self.store.now_ms()
    }

    /// Lets `ms` pass on the store's clock.
    async fn pass(&self, ms: u64) {
        match &self.manual {
            Some(clock) => clock.advance(ms),
            None => {
                let until = self.now_ms() + ms;
                while let Some(left) = until.checked_sub(self.now_ms()).filter(|l| *l > 0) {
                    tokio::time::sleep(Duration::from_millis(left)).await;
                }
            }
        }
    }

    /// Until just after the next boundary of a `tick_ms` tick (30 ms in).
    async fn next_tick(&self, tick_ms: u64) {
        let now = self.now_ms();
        self.pass(tick_ms - now % tick_ms + 30).await;
    }

    /// Lets time pass (50 ms at a time, 10 s at most) until `done` holds; false if it never did.
    async fn eventually(&self, done: impl AsyncFn() -> bool) -> bool {
        for _ in 0..200 {
            if done().await {
                return true;
            }
            self.pass(50).await;
        }
        false
    }
}

/// Target keys live 1 s after their last refresh, so expiry is seen within a test.
fn short_key_ttl(s: &mut Settings) {
    s.queue.key_ttl_s = 1;
}

fn seq(o: EnterOutcome) -> u64 {
    match o {
        EnterOutcome::Waiting(w) => w.seq,
        other => panic!("expected waiting, got {other:?}"),
    }
}

#[tokio::test]
async fn enter_is_idempotent_and_numbers_in_order() {
    with_both(async |s, _| {
        assert_eq!(seq(s.enter(t(), UserId::from(7), &"tok").await.unwrap()), 1);
        assert_eq!(seq(s.enter(t(), UserId::from(8), &"tok").await.unwrap()), 2);
        assert_eq!(seq(s.enter(t(), UserId::from(7), &"tok").await.unwrap()), 1, "same user keeps the seq");
        match s.enter(t(), UserId::from(9), &"tok").await.unwrap() {
            EnterOutcome::Waiting(w) => assert_eq!((w.ahead, w.mark), (2, 0)),
            o => panic!("{o:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn full_queue_refuses_new_users_but_not_waiting_ones() {
    with_both(async |s, _| {
        for u in 1..=5 {
            seq(s.enter(t(), UserId::from(u), &"tok").await.unwrap());
        }
        assert_eq!(s.enter(t(), UserId::from(6), &"tok").await.unwrap(), EnterOutcome::Full);
        assert_eq!(seq(s.enter(t(), UserId::from(3), &"tok").await.unwrap()), 3);
        assert!(s.leave(t(), UserId::from(1)).await.unwrap());
        assert_eq!(seq(s.enter(t(), UserId::from(6), &"tok").await.unwrap()), 6, "a leaver frees a place");
    })
    .await;
}

#[tokio::test]
async fn admit_counts_only_users_still_waiting_and_runs_once_per_tick() {
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        for u in 1..=5 {
            s.enter(t(), UserId::from(u), &"tok").await.unwrap();
        }
        assert!(s.leave(t(), UserId::from(2)).await.unwrap());
        time.next_tick(tick_ms).await;
        let a = s.admit(t(), Users(2), Ms(tick_ms)).await.unwrap();
        assert!(a.advanced);
        assert_eq!((a.admitted, a.mark), (2, 3), "users 1 and 3: the leaver used no slot");
        let again = s.admit(t(), Users(2), Ms(tick_ms)).await.unwrap();
        assert!(!again.advanced, "a second call in the same tick admits nobody");
        assert_eq!(again.mark, 3);
        // User 4 has nobody waiting ahead now, but is not admitted before the next tick.
        match s.status(t(), UserId::from(4), &"tok4").await.unwrap() {
            StatusOutcome::Waiting(w) => assert_eq!((w.seq, w.ahead, w.mark), (4, 0, 3)),
            o => panic!("{o:?}"),
        }
        time.next_tick(tick_ms).await;
        let b = s.admit(t(), Users(2), Ms(tick_ms)).await.unwrap();
        assert_eq!((b.admitted, b.mark), (2, 5));
        time.next_tick(tick_ms).await;
        let c = s.admit(t(), Users(2), Ms(tick_ms)).await.unwrap();
        assert_eq!((c.admitted, c.mark), (0, 5), "never above the last seq");
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!(snap.admitted_total, 4);
        assert_eq!(snap.waits.count, 4);
    })
    .await;
}

#[tokio::test]
async fn admitted_user_gets_one_token_and_leaves_the_queue() {
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        s.enter(t(), UserId::from(1), &"first").await.unwrap();
        s.enter(t(), UserId::from(2), &"first").await.unwrap();
        time.next_tick(tick_ms).await;
        s.admit(t(), Users(1), Ms(tick_ms)).await.unwrap();
        assert_eq!(s.status(t(), UserId::from(1), &"issued").await.unwrap(), StatusOutcome::Admitted("issued".into()));
        assert_eq!(s.status(t(), UserId::from(1), &"other").await.unwrap(), StatusOutcome::Admitted("issued".into()));
        assert_eq!(s.enter(t(), UserId::from(1), &"other").await.unwrap(), EnterOutcome::Admitted("issued".into()));
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!(snap.waiting, 1, "user 2 still waits; user 1 left the queue");
        assert_eq!(snap.tokens_issued, 1, "one token, however often it is read");
        assert_eq!(s.status(t(), UserId::from(3), &"x").await.unwrap(), StatusOutcome::NotInQueue);
    })
    .await;
}

#[tokio::test]
async fn users_who_stop_polling_are_evicted_in_bounded_steps() {
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        for u in 1..=4 {
            s.enter(t(), UserId::from(u), &"tok").await.unwrap();
        }
        time.pass(300).await;
        s.status(t(), UserId::from(4), &"tok").await.unwrap();
        assert_eq!(s.evict(t(), Ms(200), Users(2)).await.unwrap().users, 2, "bounded per call");
        assert_eq!(s.evict(t(), Ms(200), Users(10)).await.unwrap().users, 1);
        assert_eq!(s.evict(t(), Ms(200), Users(10)).await.unwrap().users, 0, "user 4 polled recently");
        assert_eq!(s.status(t(), UserId::from(1), &"tok").await.unwrap(), StatusOutcome::NotInQueue);
        // An evicted user re-enters at the back with a new seq.
        assert_eq!(seq(s.enter(t(), UserId::from(1), &"tok").await.unwrap()), 5);
        time.next_tick(tick_ms).await;
        let a = s.admit(t(), Users(10), Ms(tick_ms)).await.unwrap();
        assert_eq!(a.admitted, 2, "evicted users use no admission slot");
        assert_eq!(s.snapshot(t()).await.unwrap().evicted, 3);
    })
    .await;
}

#[tokio::test]
async fn admission_lock_is_exclusive_until_it_expires() {
    with_both(async |s, time| {
        assert!(s.try_lock_admission(t(), "a", 200).await.unwrap());
        assert!(!s.try_lock_admission(t(), "b", 200).await.unwrap());
        assert_eq!(s.snapshot(t()).await.unwrap().lock_holder.as_deref(), Some("a"));
        time.pass(260).await;
        assert!(s.try_lock_admission(t(), "b", 200).await.unwrap());
    })
    .await;
}

#[tokio::test]
async fn flag_and_batch_size_round_trip() {
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        assert!(!s.read_flag().await.unwrap().enabled);
        let t42: QueueTarget = "LIMITED_DROP:42".parse().unwrap();
        let v1 = s.change_flag(FlagChange::On { percent: 40 }).await.unwrap();
        let v2 = s.change_flag(FlagChange::Target(t42, TargetOverride::Off)).await.unwrap();
        assert_eq!(v2, v1 + 1);
        let f = s.read_flag().await.unwrap();
        assert!(f.enabled);
        assert_eq!((f.percent, f.version, f.overrides.len()), (40, v2, 1));
        s.change_flag(FlagChange::ClearTarget(t42)).await.unwrap();
        assert!(s.read_flag().await.unwrap().overrides.is_empty());

        s.set_batch_size(None, Some(7)).await.unwrap();
        assert_eq!(s.global_batch_size().await.unwrap(), Some(7));
        s.set_batch_size(Some(t()), Some(1)).await.unwrap();
        for u in 1..=3 {
            s.enter(t(), UserId::from(u), &"tok").await.unwrap();
        }
        time.next_tick(tick_ms).await;
        let a = s.admit(t(), Users(100), Ms(tick_ms)).await.unwrap();
        assert_eq!((a.admitted, a.batch), (1, 1), "the target's runtime batch size wins");
    })
    .await;
}

#[tokio::test]
async fn active_targets_are_registered_and_listed() {
    with_both(async |s, _| {
        let other: QueueTarget = "ticketing-event:7".parse().unwrap();
        s.register_active(t()).await.unwrap();
        s.register_active(other).await.unwrap();
        s.register_active(t()).await.unwrap();
        let mut active = s.active_targets().await.unwrap();
        active.sort();
        assert_eq!(active, vec![t(), other]);
        s.enter(t(), UserId::from(1), &"tok").await.unwrap();
        assert!(!s.forget_if_expired(t()).await.unwrap(), "live target stays");
        assert!(s.forget_if_expired(other).await.unwrap(), "target without keys goes");
        assert_eq!(s.active_targets().await.unwrap(), vec![t()]);
    })
    .await;
}

#[tokio::test]
async fn ahead_counts_only_users_still_waiting_between_the_mark_and_the_user() {
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        let ahead = async |u: u64| match s.status(t(), UserId::from(u), &"tok").await.unwrap() {
            StatusOutcome::Waiting(w) => w.ahead,
            o => panic!("user {u}: {o:?}"),
        };
        for u in 1..=5 {
            s.enter(t(), UserId::from(u), &"tok").await.unwrap();
        }
        assert!(s.leave(t(), UserId::from(2)).await.unwrap());
        assert_eq!(ahead(5).await, 3, "1, 3 and 4: the leaver is not ahead");
        time.pass(300).await;
        for u in [1, 4, 5] {
            s.status(t(), UserId::from(u), &"tok").await.unwrap();
        }
        assert_eq!(s.evict(t(), Ms(200), Users(10)).await.unwrap().users, 1, "user 3 stopped polling");
        assert_eq!(ahead(5).await, 2, "1 and 4");
        time.next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), Users(1), Ms(tick_ms)).await.unwrap().mark, 1);
        assert_eq!(ahead(5).await, 1, "only 4: 1 is admitted");
        match s.enter(t(), UserId::from(6), &"tok").await.unwrap() {
            EnterOutcome::Waiting(w) => assert_eq!((w.seq, w.ahead), (6, 2), "4 and 5 wait before a newcomer"),
            o => panic!("{o:?}"),
        }
        time.next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), Users(1), Ms(tick_ms)).await.unwrap().mark, 4, "the next live user, past the departed");
        assert_eq!(ahead(5).await, 0);
        assert_eq!(ahead(6).await, 1);
        match s.enter(t(), UserId::from(7), &"tok").await.unwrap() {
            EnterOutcome::Waiting(w) => assert_eq!((w.seq, w.ahead), (7, 2), "5 and 6"),
            o => panic!("{o:?}"),
        }
    })
    .await;
}

/// A token that bought stays used whichever other tokens its user claims; releasing one gives
/// back that one only.
#[tokio::test]
async fn every_used_token_stays_used_and_a_release_gives_back_only_its_own() {
    use vq::store::TokenClaim;
    with_both(async |s, _| {
        let (u, ttl) = (UserId::from(7), 300);
        let claimed = |c: TokenClaim| matches!(c, TokenClaim::Claimed { .. });
        assert!(claimed(s.claim_token(t(), u.clone(), "A", ttl, Default::default()).await.unwrap()));
        let b = s.claim_token(t(), u.clone(), "B", ttl, Default::default()).await.unwrap();
        let TokenClaim::Claimed { previous } = b else { panic!("B: {b:?}") };
        assert_eq!(s.claim_token(t(), u.clone(), "A", ttl, Default::default()).await.unwrap(), TokenClaim::AlreadyUsed);
        assert!(s.token_used(t(), u.clone(), "A").await.unwrap());
        s.release_token(t(), u.clone(), "B", previous, Default::default()).await.unwrap();
        assert!(!s.token_used(t(), u.clone(), "B").await.unwrap());
        assert_eq!(
            s.claim_token(t(), u.clone(), "A", ttl, Default::default()).await.unwrap(),
            TokenClaim::AlreadyUsed,
            "A stays used"
        );
        assert!(claimed(s.claim_token(t(), u.clone(), "B", ttl, Default::default()).await.unwrap()));
        assert_eq!(s.claim_token(t(), u.clone(), "B", ttl, Default::default()).await.unwrap(), TokenClaim::AlreadyUsed);
        assert!(claimed(s.claim_token(t(), UserId::from(8), "A", ttl, Default::default()).await.unwrap()), "per user");
    })
    .await;
}
