//! The target's record (`queue:{T}:record`, what `vq sale report` reads) and the atomic
//! `vq sale clear` on both stores.

use std::time::Duration;

use vq::domain::{AnswerClass, LedgerEntry, SaleControl, SaleSchedule, SaleSource};
use vq::store::{ClearOutcome, RecordedPurchase, RedisStore, ScheduleOutcome};

use super::*;
use vq::domain::{Ms, Users};

/// Runs `check` on a Redis store and on the embedded one, each keeping records `record_ttl_s`.
async fn with_both_records(record_ttl_s: u64, check: impl AsyncFn(AnyStore, Time)) {
    let redis = RedisServer::spawn();
    for s in [test_settings(Some(&redis)), test_settings(None)] {
        let mut limits = s.limits();
        limits.record_ttl_s = record_ttl_s;
        limits.tick_ms = 250;
        eprintln!("conformance: {:?} store", s.store);
        let (store, time) = Time::open_with(s.store, limits.clone(), || {
            RedisStore::connect(&s.redis.url, limits, Duration::from_millis(500)).expect("redis store")
        });
        check(store, time).await;
    }
}

/// Every writer of the record counts on both stores alike, and the record is gone once
/// `record_ttl_s` passed without a write (the queue's own keys are not what keeps it).
#[tokio::test]
async fn the_record_counts_every_step_and_expires_a_record_ttl_after_its_last_write() {
    with_both_records(2, async |s, time| {
        s.register_active(t()).await.unwrap();
        for u in 1..=4 {
            s.enter(t(), UserId::from(u), &"tok").await.unwrap();
        }
        s.enter(t(), UserId::from(1), &"tok").await.unwrap();
        time.next_tick(250).await;
        let a = s.admit(t(), Users(2), Ms(250)).await.unwrap();
        assert_eq!(a.admitted, 2);
        assert!(matches!(s.status(t(), UserId::from(1), &"tok").await.unwrap(), StatusOutcome::Admitted(_)));
        assert!(s.leave(t(), UserId::from(4)).await.unwrap());
        // A purchase's count in the record goes with its token's use, or on its own.
        let recorded = RecordedPurchase { tick: 77, answer: AnswerClass::Success };
        s.confirm_token_used(t(), UserId::from(1), true, Some(recorded)).await.unwrap();
        s.confirm_token_used(t(), UserId::from(9), false, None).await.unwrap();
        s.record_purchase(t(), 77, AnswerClass::ServerError).await.unwrap();
        s.record_purchase(t(), 78, AnswerClass::Unreached).await.unwrap();
        assert!(s.control_sale(t(), SaleControl::Pause).await.unwrap());
        assert!(s.control_sale(t(), SaleControl::Resume).await.unwrap());
        let close = SaleControl::Close { message: "Sold out".into(), source: SaleSource::Command };
        assert!(s.control_sale(t(), close).await.unwrap());
        time.pass(5).await;
        assert_eq!(s.evict(t(), Ms(0), Users(100)).await.unwrap().users, 2, "users 2 and 3 stopped polling");

        let r = s.target_record(t()).await.unwrap().expect("a record");
        assert_eq!(r.arrivals.values().sum::<u64>(), 4, "user 1 entering again is no arrival");
        assert_eq!(r.admissions.get(&a.tick), Some(&2));
        assert_eq!(r.tick_ms, Some(250));
        assert_eq!((r.admitted, r.left, r.evicted), (2, 1, 2));
        assert_eq!((r.tokens_issued, r.tokens_used, r.direct_tokens_used), (1, 1, 1));
        assert!(r.last_issue_ms.is_some());
        assert_eq!(r.waits.count, 2);
        assert_eq!(r.waits.buckets.values().sum::<u64>(), 2);
        assert!(r.wait_max_ms.is_some_and(|w| w < 5000));
        let p77 = r.purchases[&77];
        assert_eq!((p77.get(AnswerClass::Success), p77.get(AnswerClass::ServerError)), (1, 1));
        assert_eq!(r.purchases[&78].get(AnswerClass::Unreached), 1);
        let kinds: Vec<&str> = r
            .events
            .iter()
            .map(|e| match e {
                LedgerEntry::Pause { .. } => "pause",
                LedgerEntry::Resume { .. } => "resume",
                LedgerEntry::Close { .. } => "close",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["pause", "resume", "close"]);

        // Nothing writes now: the record goes `record_ttl_s` later.
        assert!(
            time.eventually(async || s.target_record(t()).await.unwrap().is_none()).await,
            "the record never expired"
        );
    })
    .await;
}

/// `clear_sale` without force checks and clears in one step: refused while users are
/// pre-queued or the opening is under way; they keep their place. With force, cleared.
#[tokio::test]
async fn clear_without_force_refuses_to_drop_pre_queued_users_in_the_same_step() {
    with_both_records(60, async |s, time| {
        let now = time.now_ms();
        let sale = SaleSchedule { opens_at_ms: now + 60_000, prequeue_from_ms: Some(now - 1000), closes_at_ms: None };
        assert!(matches!(s.schedule_sale(t(), sale, [5; 32]).await.unwrap(), ScheduleOutcome::Scheduled { .. }));
        assert_eq!(s.clear_sale(t(), false).await.unwrap(), ClearOutcome::Cleared, "nobody pre-queued yet");
        assert_eq!(s.clear_sale(t(), false).await.unwrap(), ClearOutcome::NoSale);

        let sale = SaleSchedule { opens_at_ms: now + 700, ..sale };
        assert!(matches!(s.schedule_sale(t(), sale, [5; 32]).await.unwrap(), ScheduleOutcome::Scheduled { .. }));
        for u in 1..=2 {
            assert!(matches!(s.enter(t(), UserId::from(u), &"tok").await.unwrap(), EnterOutcome::PreQueue(_)));
        }
        assert_eq!(s.clear_sale(t(), false).await.unwrap(), ClearOutcome::Refused { opening: false, prequeued: 2 });
        assert!(matches!(s.status(t(), UserId::from(2), &"tok").await.unwrap(), StatusOutcome::PreQueue(_)), "kept");
        // Past the opening time, before anything placed them (no pump here): the opening.
        time.pass(800).await;
        assert_eq!(s.clear_sale(t(), false).await.unwrap(), ClearOutcome::Refused { opening: true, prequeued: 2 });
        assert_eq!(s.clear_sale(t(), true).await.unwrap(), ClearOutcome::Cleared);
        assert!(s.read_sale(t()).await.unwrap().is_none());
    })
    .await;
}
