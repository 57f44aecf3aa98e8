//! The queue's operations beyond the basics in the parent module: eviction, wait statistics.

use super::*;
use vq::domain::{Ms, Users};

/// Ids as shops have them go through every step as sent, and `7` and `007` are two users.
#[tokio::test]
async fn opaque_ids_are_kept_as_sent_through_every_step() {
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        let ids: Vec<UserId> = ["3f2a9c1e-7b4d-4c1e-9a8f-2b6c1d0e9f3a", "user_8f3k", "7", "007", "a.b+c@x:1"]
            .iter()
            .map(|i| i.parse().unwrap())
            .collect();
        for (i, u) in ids.iter().enumerate() {
            assert_eq!(seq(s.enter(t(), u.clone(), &"tok").await.unwrap()), i as u64 + 1, "{u}");
            assert!(s.holds_place(t(), u.clone()).await.unwrap(), "{u}");
            assert!(s.hold_queue(u.clone(), t(), 5).await.unwrap().is_empty(), "{u}");
        }
        time.next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), Users(3), Ms(tick_ms)).await.unwrap().admitted, 3);
        for (i, u) in ids.iter().enumerate() {
            let token = format!("token-of-{u}");
            match s.status(t(), u.clone(), &token.as_str()).await.unwrap() {
                StatusOutcome::Admitted(tok) => assert!(i < 3 && tok == token, "{u}"),
                StatusOutcome::Waiting(w) => assert!(i >= 3 && w.seq == i as u64 + 1, "{u}"),
                other => panic!("{u}: {other:?}"),
            }
        }
        let (seven, zero_seven) = (ids[2].clone(), ids[3].clone());
        let claimed = s.claim_token(t(), seven.clone(), "token-of-7", 300, Default::default()).await.unwrap();
        assert!(matches!(claimed, vq::store::TokenClaim::Claimed { .. }));
        assert!(s.token_used(t(), seven, "token-of-7").await.unwrap());
        assert!(!s.token_used(t(), zero_seven.clone(), "token-of-7").await.unwrap(), "007 is another user");
        assert!(s.leave(t(), zero_seven.clone()).await.unwrap());
        assert_eq!(s.status(t(), zero_seven, &"x").await.unwrap(), StatusOutcome::NotInQueue);
        assert!(s.leave(t(), ids[4].clone()).await.unwrap());
    })
    .await;
}

/// Admitted users who never poll again are evicted like waiting ones, and get no token.
#[tokio::test]
async fn an_admitted_user_who_stops_polling_is_evicted_without_a_token() {
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        s.enter(t(), UserId::from(1), &"tok").await.unwrap();
        s.enter(t(), UserId::from(2), &"tok").await.unwrap();
        time.next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), Users(1), Ms(tick_ms)).await.unwrap().mark, 1);
        time.pass(300).await;
        s.status(t(), UserId::from(2), &"tok").await.unwrap();
        assert_eq!(s.evict(t(), Ms(200), Users(10)).await.unwrap().users, 1);
        assert_eq!(s.status(t(), UserId::from(1), &"tok").await.unwrap(), StatusOutcome::NotInQueue);
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!((snap.evicted, snap.tokens_issued, snap.waiting, snap.admitted_total), (1, 0, 1, 1));
    })
    .await;
}

/// The wait histogram is bucketed as `domain::wait_bucket` says, in both stores.
#[tokio::test]
async fn waits_are_bucketed_by_the_domain_rule() {
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        s.enter(t(), UserId::from(1), &"tok").await.unwrap();
        time.pass(1100).await;
        time.next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), Users(1), Ms(tick_ms)).await.unwrap().admitted, 1);
        let waits = s.snapshot(t()).await.unwrap().waits;
        assert_eq!(waits.count, 1);
        assert!(waits.sum_ms >= 1100, "{waits:?}");
        let bucket = vq::domain::wait_bucket(waits.sum_ms / 1000);
        assert_eq!(waits.buckets, std::collections::BTreeMap::from([(bucket, 1)]), "{waits:?}");
    })
    .await;
}

/// A user's count of queues: a target counted once however often, none past the limit (the
/// targets counted named), released ones free their place; a place is held while waiting
/// (admitted but not yet told included) and no longer once the token is collected or the
/// user left.
#[tokio::test]
async fn a_users_queues_are_counted_up_to_the_limit_and_places_are_known() {
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        let (u, other) = (UserId::from(7), UserId::from(8));
        let tt = |id: u64| QueueTarget::new(t().kind, id);
        for id in [1, 2, 1, 2] {
            assert!(s.hold_queue(u.clone(), tt(id), 2).await.unwrap().is_empty(), "target {id}");
        }
        let mut held = s.hold_queue(u.clone(), tt(3), 2).await.unwrap();
        held.sort();
        assert_eq!(held.iter().map(|h| h.0).collect::<Vec<_>>(), vec![tt(1), tt(2)], "at the limit: the counted ones");
        assert!(held.iter().all(|(_, age_ms)| *age_ms < 5_000), "counted just now: {held:?}");
        assert!(s.hold_queue(other.clone(), tt(3), 2).await.unwrap().is_empty(), "per user");
        s.release_queues(u.clone(), &[tt(1)]).await.unwrap();
        assert!(s.hold_queue(u.clone(), tt(3), 2).await.unwrap().is_empty(), "a released target frees a place");
        assert!(!s.hold_queue(u.clone(), tt(1), 2).await.unwrap().is_empty());

        assert!(!s.holds_place(t(), u.clone()).await.unwrap());
        s.enter(t(), u.clone(), &"tok").await.unwrap();
        s.enter(t(), other.clone(), &"tok").await.unwrap();
        assert!(s.holds_place(t(), u.clone()).await.unwrap());
        time.next_tick(tick_ms).await;
        s.admit(t(), Users(1), Ms(tick_ms)).await.unwrap();
        assert!(s.holds_place(t(), u.clone()).await.unwrap(), "admitted, not yet told");
        assert!(matches!(s.status(t(), u.clone(), &"tok").await.unwrap(), StatusOutcome::Admitted(_)));
        assert!(!s.holds_place(t(), u.clone()).await.unwrap(), "the token collected");
        assert!(s.leave(t(), other.clone()).await.unwrap());
        assert!(!s.holds_place(t(), other.clone()).await.unwrap(), "left");
    })
    .await;
}

/// The adaptive outflow's interval is claimed once across pumps, with every gate's
/// observations of it, each buyer counted once as the worst of their purchases; a decision is
/// read back; a pinned batch claims nothing.
#[tokio::test]
async fn an_outflow_interval_is_decided_once_with_every_observation() {
    use vq::domain::LedgerEntry;
    use vq::domain::{BuyerObservation, Observations, latency_bucket};
    use vq::store::{BatchChange, OutflowClaim, OutflowState, TokensEnded};
    with_both(async |s, _| {
        let seen =
            |ms: u64, error: bool, backoff: bool| BuyerObservation { bucket: latency_bucket(ms), error, backoff };
        let (a, b): (UserId, UserId) = ("a".parse().unwrap(), "b".parse().unwrap());
        // Buyer a: fast, then slow and failed, then failed again, then fast: one buyer, the worst.
        s.observe_purchase(t(), 7, &a, seen(30, false, false), 60).await.unwrap();
        s.observe_purchase(t(), 7, &a, seen(700, true, false), 60).await.unwrap();
        for _ in 0..3 {
            s.observe_purchase(t(), 7, &a, seen(30, true, true), 60).await.unwrap();
        }
        s.observe_purchase(t(), 7, &a, seen(30, false, false), 60).await.unwrap();
        s.observe_purchase(t(), 7, &b, seen(30, false, false), 60).await.unwrap();
        s.observe_purchase(t(), 8, &b, seen(30, false, false), 60).await.unwrap();
        let mut seen = Observations { purchases: 2, errors: 1, backoffs: 1, ..Observations::default() };
        seen.latency[latency_bucket(30)] = 1;
        seen.latency[latency_bucket(700)] = 1;
        let none = TokensEnded::default();
        assert_eq!(
            s.claim_outflow(t(), 7).await.unwrap(),
            OutflowClaim::Decide { current: None, seen, no_show_bp: None, ended: None, counters: none }
        );
        assert_eq!(s.claim_outflow(t(), 7).await.unwrap(), OutflowClaim::Decided { current: None });
        let state = OutflowState {
            batch: 42,
            reason: "up: test".into(),
            decided_at_ms: 1,
            no_show_bp: Some(2500),
            tokens_used: 0,
            tokens_expired: 0,
            purchases: 2,
            p95_ms: Some(1000),
            error_bp: 5000,
        };
        let change = BatchChange { from: None, instance: "pump-1".into() };
        s.set_outflow(t(), &state, Some(change)).await.unwrap();
        s.set_outflow(t(), &state, None).await.unwrap();
        // One ledger row: the change, not the decision that kept the batch.
        let batch =
            LedgerEntry::Batch { at_ms: 1, from: None, to: 42, instance: "pump-1".into(), reason: "up: test".into() };
        assert_eq!(s.sale_ledger(t()).await.unwrap(), [batch]);
        assert_eq!(s.claim_outflow(t(), 6).await.unwrap(), OutflowClaim::Decided { current: Some(42) }, "an older one");
        // The next decision gets the no-show share and what ended since (nothing here).
        assert!(matches!(
            s.claim_outflow(t(), 8).await.unwrap(),
            OutflowClaim::Decide { current: Some(42), no_show_bp: Some(2500), ended: Some(e), .. } if e == none
        ));
        assert_eq!(s.snapshot(t()).await.unwrap().outflow, Some(state));
        s.set_batch_size(Some(t()), Some(5)).await.unwrap();
        assert_eq!(s.claim_outflow(t(), 9).await.unwrap(), OutflowClaim::Pinned);
    })
    .await;
}
