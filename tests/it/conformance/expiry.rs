//! Expiry: what Redis forgets through key TTLs, the embedded store forgets alike.

use vq::store::TokenClaim;

use super::*;
use vq::domain::{Ms, Users};

/// Redis forgets a target through its keys' TTL, which `admit.lua` refreshes only while
/// someone waits: the pump ticking over an empty queue does not keep it alive.
#[tokio::test]
async fn a_target_is_kept_while_anyone_waits_and_forgotten_a_key_ttl_after() {
    let configure = |s: &mut Settings| {
        short_key_ttl(s);
        s.queue.max_capacity = 8;
    };
    with_both_configured(configure, async |s, time| {
        // Ticks of 250 ms, well inside the key TTL (1 s) even on a loaded machine.
        let tick_ms = 250;
        s.register_active(t()).await.unwrap();
        for u in 1..=8 {
            s.enter(t(), UserId::from(u), &"tok").await.unwrap();
        }
        // Eight ticks of one admission each: 2 s, twice the key TTL, with someone waiting.
        for _ in 1..=8 {
            time.next_tick(tick_ms).await;
            let a = s.admit(t(), Users(1), Ms(tick_ms)).await.unwrap();
            assert_eq!(a.admitted, 1);
            for u in 1..=8 {
                s.status(t(), UserId::from(u), &"tok").await.unwrap();
            }
            assert!(!s.forget_if_expired(t()).await.unwrap(), "users waited until this tick");
        }
        assert_eq!(s.snapshot(t()).await.unwrap().waiting, 0);
        // Nobody waits now: ticking on does not keep the target.
        let forgotten = time
            .eventually(async || {
                time.next_tick(tick_ms).await;
                s.admit(t(), Users(1), Ms(tick_ms)).await.unwrap();
                s.forget_if_expired(t()).await.unwrap()
            })
            .await;
        assert!(forgotten, "an idle target is forgotten although the pump ticks");
        assert!(s.active_targets().await.unwrap().is_empty());
    })
    .await;
}

/// An idle target's queue keys expire by themselves, forgotten or not: it starts again at
/// seq 1, and those who waited in it are no longer in the queue.
#[tokio::test]
async fn an_idle_target_starts_again_at_seq_1_once_its_keys_expire() {
    with_both_configured(short_key_ttl, async |s, time| {
        for u in 1..=3 {
            s.enter(t(), UserId::from(u), &"tok").await.unwrap();
        }
        assert!(time.eventually(async || s.snapshot(t()).await.unwrap().seq == 0).await, "the keys never expired");
        assert_eq!(s.status(t(), UserId::from(1), &"tok").await.unwrap(), StatusOutcome::NotInQueue);
        assert_eq!(seq(s.enter(t(), UserId::from(3), &"tok").await.unwrap()), 1);
        assert_eq!(s.snapshot(t()).await.unwrap().waiting, 1);
    })
    .await;
}

/// Forgetting a target drops its queue, not what lives in keys of their own: stored tokens
/// and used marks (the token's lifetime), the runtime batch size (no expiry), the lock.
#[tokio::test]
async fn forgetting_a_target_keeps_its_tokens_used_marks_and_batch_size() {
    with_both_configured(short_key_ttl, async |s, time| {
        let tick_ms = time.tick_ms;
        s.register_active(t()).await.unwrap();
        s.set_batch_size(Some(t()), Some(3)).await.unwrap();
        s.enter(t(), UserId::from(1), &"tok1").await.unwrap();
        time.next_tick(tick_ms).await;
        assert_eq!(s.admit(t(), Users(10), Ms(tick_ms)).await.unwrap().batch, 3);
        assert_eq!(s.status(t(), UserId::from(1), &"tok1").await.unwrap(), StatusOutcome::Admitted("tok1".into()));
        assert!(matches!(
            s.claim_token(t(), UserId::from(2), "B", 300, Default::default()).await.unwrap(),
            TokenClaim::Claimed { .. }
        ));
        assert!(time.eventually(async || s.forget_if_expired(t()).await.unwrap()).await, "never forgotten");
        assert!(s.try_lock_admission(t(), "a", 60_000).await.unwrap());
        assert_eq!(s.enter(t(), UserId::from(1), &"other").await.unwrap(), EnterOutcome::Admitted("tok1".into()));
        assert_eq!(
            s.claim_token(t(), UserId::from(2), "B", 300, Default::default()).await.unwrap(),
            TokenClaim::AlreadyUsed
        );
        assert!(s.token_used(t(), UserId::from(2), "B").await.unwrap());
        assert_eq!(s.snapshot(t()).await.unwrap().batch_override, Some(3));
        assert!(s.forget_if_expired(t()).await.unwrap(), "tokens do not keep the queue");
        assert!(!s.try_lock_admission(t(), "b", 60_000).await.unwrap(), "the lock outlives the queue");
    })
    .await;
}

#[tokio::test]
async fn the_capacity_in_force_is_known_once_published_and_expires_with_the_target() {
    with_both_configured(short_key_ttl, async |s, time| {
        assert_eq!(s.snapshot(t()).await.unwrap().capacity, None, "no instance published one");
        s.publish_capacity(t()).await.unwrap();
        assert_eq!(s.snapshot(t()).await.unwrap().capacity, Some(5));
        assert!(time.eventually(async || s.snapshot(t()).await.unwrap().capacity.is_none()).await, "never expired");
    })
    .await;
}

/// A stored token that expired no longer admits: its user enters again at the back.
#[tokio::test]
async fn a_user_whose_token_expired_enters_again_at_the_back() {
    with_both_configured(
        |s| s.token.ttl_s = 1,
        async |s, time| {
            let tick_ms = time.tick_ms;
            s.enter(t(), UserId::from(1), &"tok").await.unwrap();
            s.enter(t(), UserId::from(2), &"tok").await.unwrap();
            time.next_tick(tick_ms).await;
            s.admit(t(), Users(1), Ms(tick_ms)).await.unwrap();
            assert_eq!(s.status(t(), UserId::from(1), &"tok1").await.unwrap(), StatusOutcome::Admitted("tok1".into()));
            let expired = time
                .eventually(async || s.status(t(), UserId::from(1), &"x").await.unwrap() == StatusOutcome::NotInQueue);
            assert!(expired.await, "the token never expired");
            match s.enter(t(), UserId::from(1), &"tok").await.unwrap() {
                EnterOutcome::Waiting(w) => assert_eq!((w.seq, w.ahead), (3, 1), "behind user 2"),
                o => panic!("{o:?}"),
            }
        },
    )
    .await;
}

/// A user's count of queues (`queue.max_queues_per_user`) is forgotten when nobody counts or
/// drops a target of theirs for long enough (at most two key TTLs: Redis keeps the counts in
/// generations of one), as a key of their own would expire; another user's count is kept by
/// their own holds meanwhile.
#[tokio::test]
async fn a_users_count_of_queues_is_forgotten_after_the_key_ttl_without_a_hold() {
    with_both_configured(short_key_ttl, async |s, time| {
        let tt = |id: u64| QueueTarget::new(t().kind, id);
        let (u, busy) = (UserId::from(7), UserId::from(8));
        for id in [1, 2] {
            assert!(s.hold_queue(u.clone(), tt(id), 2).await.unwrap().is_empty());
            assert!(s.hold_queue(busy.clone(), tt(id), 2).await.unwrap().is_empty());
        }
        assert_eq!(s.hold_queue(u.clone(), tt(3), 2).await.unwrap().len(), 2, "at the limit");
        // Two and a half key TTLs, the other user holding again every quarter of one.
        for _ in 0..10 {
            time.pass(250).await;
            assert!(s.hold_queue(busy.clone(), tt(1), 2).await.unwrap().is_empty());
        }
        assert!(s.hold_queue(u.clone(), tt(3), 2).await.unwrap().is_empty(), "forgotten: a place is free");
        assert_eq!(s.hold_queue(busy.clone(), tt(3), 2).await.unwrap().len(), 2, "kept by its holds");
    })
    .await;
}
