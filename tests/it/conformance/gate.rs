//! The gate's operations: claiming, releasing and counting tokens, pacing purchases.

use vq::store::{PacedClaim, TokenClaim};

use super::*;
use vq::domain::{Ms, Ticks, Users};

/// The claim/release cycle around one purchase, with the token the queue issued.
#[tokio::test]
async fn a_claimed_queue_token_is_still_the_users_and_a_release_restores_it() {
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        let u = UserId::from(1);
        s.enter(t(), u.clone(), &"tok").await.unwrap();
        time.next_tick(tick_ms).await;
        s.admit(t(), Users(1), Ms(tick_ms)).await.unwrap();
        assert_eq!(s.status(t(), u.clone(), &"tok").await.unwrap(), StatusOutcome::Admitted("tok".into()));
        assert!(!s.token_used(t(), u.clone(), "tok").await.unwrap());
        let claim = s.claim_token(t(), u.clone(), "tok", 300, Default::default()).await.unwrap();
        assert_eq!(claim, TokenClaim::Claimed { previous: Some("tok".into()) });
        assert!(s.token_used(t(), u.clone(), "tok").await.unwrap());
        assert_eq!(
            s.status(t(), u.clone(), &"x").await.unwrap(),
            StatusOutcome::Admitted("tok".into()),
            "used, still theirs"
        );
        assert_eq!(s.enter(t(), u.clone(), &"x").await.unwrap(), EnterOutcome::Admitted("tok".into()));
        s.release_token(t(), u.clone(), "tok", Some("tok".into()), Default::default()).await.unwrap();
        assert!(!s.token_used(t(), u.clone(), "tok").await.unwrap());
        assert_eq!(s.status(t(), u.clone(), &"x").await.unwrap(), StatusOutcome::Admitted("tok".into()));
        assert_eq!(
            s.claim_token(t(), u.clone(), "tok", 300, Default::default()).await.unwrap(),
            TokenClaim::Claimed { previous: Some("tok".into()) }
        );
        // A stateless token (no stored one): released, nothing is left behind.
        let claim = s.claim_token(t(), UserId::from(2), "direct", 300, Default::default()).await.unwrap();
        assert_eq!(claim, TokenClaim::Claimed { previous: None });
        s.release_token(t(), UserId::from(2), "direct", None, Default::default()).await.unwrap();
        assert!(!s.token_used(t(), UserId::from(2), "direct").await.unwrap());
        assert_eq!(s.status(t(), UserId::from(2), &"x").await.unwrap(), StatusOutcome::NotInQueue);
        s.confirm_token_used(t(), u.clone(), true, None).await.unwrap();
        s.confirm_token_used(t(), u.clone(), true, None).await.unwrap();
        s.confirm_token_used(t(), UserId::from(2), false, None).await.unwrap();
        let snap = s.snapshot(t()).await.unwrap();
        assert_eq!((snap.tokens_issued, snap.tokens_used, snap.direct_tokens_used), (1, 2, 1));
    })
    .await;
}

/// No-shows: an issued token that no purchase used is counted expired once, when its life
/// ends; a used one never is.
#[tokio::test]
async fn a_token_issued_and_never_used_is_counted_expired_once() {
    with_both_configured(
        |s| s.token.ttl_s = 1,
        async |s, time| {
            let tick_ms = time.tick_ms;
            for u in 1..=3 {
                s.enter(t(), UserId::from(u), &"x").await.unwrap();
            }
            time.next_tick(tick_ms).await;
            s.admit(t(), Users(3), Ms(tick_ms)).await.unwrap();
            for u in 1..=3 {
                assert!(matches!(s.status(t(), UserId::from(u), &"tok").await.unwrap(), StatusOutcome::Admitted(_)));
            }
            s.confirm_token_used(t(), UserId::from(1), true, None).await.unwrap();
            assert_eq!(s.expire_tokens(t()).await.unwrap(), 0, "none has expired yet");
            time.pass(1100).await;
            assert_eq!(s.expire_tokens(t()).await.unwrap(), 2, "users 2 and 3 never bought");
            assert_eq!(s.expire_tokens(t()).await.unwrap(), 0, "counted once");
            let snap = s.snapshot(t()).await.unwrap();
            assert_eq!((snap.tokens_issued, snap.tokens_used, snap.tokens_expired), (3, 1, 2));
        },
    )
    .await;
}

#[tokio::test]
async fn a_used_mark_lives_as_long_as_its_token() {
    with_both(async |s, time| {
        let u = UserId::from(3);
        assert!(matches!(
            s.claim_token(t(), u.clone(), "short", 1, Default::default()).await.unwrap(),
            TokenClaim::Claimed { .. }
        ));
        assert_eq!(
            s.claim_token(t(), u.clone(), "short", 1, Default::default()).await.unwrap(),
            TokenClaim::AlreadyUsed
        );
        assert!(
            time.eventually(async || !s.token_used(t(), u.clone(), "short").await.unwrap()).await,
            "the mark never expired"
        );
        assert!(matches!(
            s.claim_token(t(), u.clone(), "short", 1, Default::default()).await.unwrap(),
            TokenClaim::Claimed { .. }
        ));
    })
    .await;
}

/// The gate's pacing: a tick holds one batch of purchases, the next ones wait for a later
/// tick up to `ahead` ticks, then there is no room.
#[tokio::test]
async fn pace_purchase_fills_the_current_tick_then_the_next_then_refuses() {
    with_both(async |s, time| {
        let tick_ms = 1000;
        time.next_tick(tick_ms).await;
        for _ in 0..2 {
            let slot = s.pace_purchase(t(), Users(2), Ms(tick_ms), Ticks(1)).await.unwrap().expect("room now");
            assert_eq!(slot.starts_in_ms, 0, "{slot:?}");
            assert!(slot.ends_in_ms > 0 && slot.ends_in_ms <= tick_ms, "{slot:?}");
        }
        for _ in 0..2 {
            let slot = s.pace_purchase(t(), Users(2), Ms(tick_ms), Ticks(1)).await.unwrap().expect("room next tick");
            assert!(slot.starts_in_ms > 0 && slot.starts_in_ms <= tick_ms, "{slot:?}");
            assert_eq!(slot.ends_in_ms - slot.starts_in_ms, tick_ms, "{slot:?}");
        }
        assert_eq!(s.pace_purchase(t(), Users(2), Ms(tick_ms), Ticks(1)).await.unwrap(), None, "both ticks full");
        // The target's runtime batch size is its budget.
        let other: QueueTarget = "ticketing-event:7".parse().unwrap();
        s.set_batch_size(Some(other), Some(1)).await.unwrap();
        assert!(s.pace_purchase(other, Users(100), Ms(tick_ms), Ticks(0)).await.unwrap().is_some());
        assert_eq!(s.pace_purchase(other, Users(100), Ms(tick_ms), Ticks(0)).await.unwrap(), None);
    })
    .await;
}

/// A claim that reserves the purchase's place in a tick in the same step: a refused claim (a
/// used-up token, a user at their limit), however often it is tried, holds no place, so
/// replaying a spent token cannot fill the ticks before real buyers; with every tick full
/// nothing is claimed, so the token stays usable.
#[tokio::test]
async fn a_refused_claim_holds_no_place_in_a_tick_and_a_full_tick_claims_nothing() {
    with_both(async |s, time| {
        let tick_ms = 1000;
        time.next_tick(tick_ms).await;
        let pace = (Users(2), Ms(tick_ms), Ticks(1));
        let per_user = vq::domain::PurchaseLimits { per_admission: 1, per_user: 1 };
        let claimed = s.claim_token_paced(t(), UserId::from(1), "a", 300, per_user, Some(pace)).await.unwrap();
        let PacedClaim::Claim(TokenClaim::Claimed { .. }, Some(slot)) = claimed else { panic!("{claimed:?}") };
        assert_eq!(slot.starts_in_ms, 0, "{slot:?}");
        for _ in 0..5 {
            let again = s.claim_token_paced(t(), UserId::from(1), "a", 300, per_user, Some(pace)).await.unwrap();
            assert_eq!(again, PacedClaim::Claim(TokenClaim::AlreadyUsed, None));
            let other = s.claim_token_paced(t(), UserId::from(1), "b", 300, per_user, Some(pace)).await.unwrap();
            assert_eq!(other, PacedClaim::Claim(TokenClaim::UserLimit, None));
        }
        // Three places left (one now, two in the next tick), whatever the refusals tried.
        for u in 2..=4 {
            let c = s.claim_token_paced(t(), UserId::from(u), "c", 300, Default::default(), Some(pace)).await.unwrap();
            assert!(matches!(c, PacedClaim::Claim(TokenClaim::Claimed { .. }, Some(_))), "user {u}: {c:?}");
        }
        let full = s.claim_token_paced(t(), UserId::from(5), "d", 300, Default::default(), Some(pace)).await.unwrap();
        assert_eq!(full, PacedClaim::Full);
        assert!(!s.token_used(t(), UserId::from(5), "d").await.unwrap(), "nothing claimed when full");
        let later = s.claim_token(t(), UserId::from(5), "d", 300, Default::default()).await.unwrap();
        assert_eq!(later, TokenClaim::Claimed { previous: None });
    })
    .await;
}

/// A proof of work's challenge is spent once while its mark lives; buyers holding a place are
/// the admitted not yet told and the holders of unused, unexpired tokens.
#[tokio::test]
async fn a_challenge_is_spent_once_and_active_buyers_are_counted() {
    with_both(async |s, time| {
        let until = time.now_ms() + 200;
        assert!(s.spend_once(t(), "c1", until).await.unwrap());
        assert!(!s.spend_once(t(), "c1", until).await.unwrap(), "spent");
        assert!(s.spend_once(t(), "c2", until).await.unwrap(), "per challenge");
        time.pass(250).await;
        assert!(s.spend_once(t(), "c1", time.now_ms() + 200).await.unwrap(), "the mark expired");

        assert_eq!(s.active_buyers(t()).await.unwrap(), 0);
        for u in 1..=3 {
            s.enter(t(), UserId::from(u), &"tok").await.unwrap();
        }
        time.next_tick(time.tick_ms).await;
        s.admit(t(), Users(2), Ms(time.tick_ms)).await.unwrap();
        assert_eq!(s.active_buyers(t()).await.unwrap(), 2, "admitted, not yet told");
        s.status(t(), UserId::from(1), &"t1").await.unwrap();
        assert_eq!(s.active_buyers(t()).await.unwrap(), 2, "one told, holding an unused token");
        s.confirm_token_used(t(), UserId::from(1), true, None).await.unwrap();
        assert_eq!(s.active_buyers(t()).await.unwrap(), 1, "user 1 bought");
    })
    .await;
}

/// A token that bought while its user still waited (handed out while the queue was off or
/// failed open) stays used once the queue admits the user and stores their token, through the
/// poll and through the enter, on both stores; the queue's token buys once as well.
#[tokio::test]
async fn a_token_used_while_its_user_waited_stays_used_once_the_queue_issues_theirs() {
    with_both(async |s, time| {
        let tick_ms = time.tick_ms;
        let (polled, entered) = (UserId::from(1), UserId::from(2));
        for u in [&polled, &entered] {
            s.enter(t(), u.clone(), &"x").await.unwrap();
            let claim = s.claim_token(t(), u.clone(), "earlier", 300, Default::default()).await.unwrap();
            assert_eq!(claim, TokenClaim::Claimed { previous: None });
        }
        time.next_tick(tick_ms).await;
        s.admit(t(), Users(2), Ms(tick_ms)).await.unwrap();
        assert_eq!(
            s.status(t(), polled.clone(), &"queued-1").await.unwrap(),
            StatusOutcome::Admitted("queued-1".into())
        );
        assert_eq!(
            s.enter(t(), entered.clone(), &"queued-2").await.unwrap(),
            EnterOutcome::Admitted("queued-2".into())
        );
        for (u, queued) in [(&polled, "queued-1"), (&entered, "queued-2")] {
            assert!(s.token_used(t(), u.clone(), "earlier").await.unwrap(), "{u}: the earlier token stays used");
            assert_eq!(
                s.claim_token(t(), u.clone(), "earlier", 300, Default::default()).await.unwrap(),
                TokenClaim::AlreadyUsed
            );
            assert!(matches!(
                s.claim_token(t(), u.clone(), queued, 300, Default::default()).await.unwrap(),
                TokenClaim::Claimed { .. }
            ));
            assert_eq!(
                s.claim_token(t(), u.clone(), queued, 300, Default::default()).await.unwrap(),
                TokenClaim::AlreadyUsed
            );
        }
    })
    .await;
}
