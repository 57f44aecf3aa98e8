//! The queue's operations beyond the basics in the parent module: eviction, wait statistics.

use super::*;

/// Admitted users who never poll again are evicted like waiting ones, and get no token.
#[tokio::test]
async fn an_admitted_user_who_stops_polling_is_evicted_without_a_token() {
    with_both(async |s, tick_ms| {
        s.enter(t(), UserId(1), &"tok").await.unwrap();
        s.enter(t(), UserId(2), &"tok").await.unwrap();
        next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), 1, tick_ms).await.unwrap().mark, 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.status(t(), UserId(2), &"tok").await.unwrap();
        assert_eq!(s.evict(t(), 200, 10).await.unwrap(), 1);
        assert_eq!(s.status(t(), UserId(1), &"tok").await.unwrap(), StatusOutcome::NotInQueue);
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!((snap.evicted, snap.tokens_issued, snap.waiting, snap.admitted_total), (1, 0, 1, 1));
    })
    .await;
}

/// The wait histogram is bucketed as `domain::wait_bucket` says, in both stores.
#[tokio::test]
async fn waits_are_bucketed_by_the_domain_rule() {
    with_both(async |s, tick_ms| {
        s.enter(t(), UserId(1), &"tok").await.unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), 1, tick_ms).await.unwrap().admitted, 1);
        let waits = s.snapshot(t()).await.unwrap().waits;
        assert_eq!(waits.count, 1);
        assert!(waits.sum_ms >= 1100, "{waits:?}");
        let bucket = vq::domain::wait_bucket(waits.sum_ms / 1000);
        assert_eq!(waits.buckets, std::collections::BTreeMap::from([(bucket, 1)]), "{waits:?}");
    })
    .await;
}
