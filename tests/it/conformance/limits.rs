//! The purchase limits on both stores: purchases per entry token (`purchases_per_admission`),
//! per user and sale (`purchases_per_user`), a release giving the use back to both counts, the
//! per-user counts dropped with a sale's clear or `key_ttl_s` after the last purchase, and the
//! refused purchases added to the record.

use vq::domain::{PurchaseLimits, PurchaseRefusal, Refusals};
use vq::store::TokenClaim;

use super::*;

fn claimed(c: TokenClaim) -> bool {
    matches!(c, TokenClaim::Claimed { .. })
}

/// Three purchases per admission: the token is counted, not marked, until its third purchase;
/// the fourth is refused as a used token is; a release gives one use back.
#[tokio::test]
async fn a_token_makes_purchases_per_admission_purchases_and_a_release_gives_one_back() {
    with_both(async |s, _| {
        let (u, ttl) = (UserId::from(7), 300);
        let three = PurchaseLimits { per_admission: 3, per_user: 0 };
        // A purchase given back before the token is used up counts for nothing.
        let c = s.claim_token(t(), u.clone(), "A", ttl, three).await.unwrap();
        let TokenClaim::Claimed { previous } = c else { panic!("{c:?}") };
        s.release_token(t(), u.clone(), "A", previous, three).await.unwrap();
        let mut previous = None;
        for i in 1..=3 {
            let c = s.claim_token(t(), u.clone(), "A", ttl, three).await.unwrap();
            let TokenClaim::Claimed { previous: p } = c else { panic!("purchase {i}: {c:?}") };
            assert_eq!(s.token_used(t(), u.clone(), "A").await.unwrap(), i == 3, "marked used with its last purchase");
            previous = p;
        }
        assert_eq!(s.claim_token(t(), u.clone(), "A", ttl, three).await.unwrap(), TokenClaim::AlreadyUsed);
        s.release_token(t(), u.clone(), "A", previous, three).await.unwrap();
        assert!(!s.token_used(t(), u.clone(), "A").await.unwrap(), "the use given back");
        assert!(claimed(s.claim_token(t(), u.clone(), "A", ttl, three).await.unwrap()));
        assert_eq!(s.claim_token(t(), u.clone(), "A", ttl, three).await.unwrap(), TokenClaim::AlreadyUsed);
        // Another token of the user and another user's token count on their own.
        assert!(claimed(s.claim_token(t(), u.clone(), "B", ttl, three).await.unwrap()));
        assert!(claimed(s.claim_token(t(), UserId::from(8), "A", ttl, three).await.unwrap()));
    })
    .await;
}

/// Two purchases per user: a third token of the user is refused before anything is counted
/// (it stays unused), a release gives the user's use back, other users are not affected, and
/// a clear of the sale starts every user's count again.
#[tokio::test]
async fn a_user_makes_purchases_per_user_purchases_whatever_their_tokens() {
    with_both(async |s, _| {
        let (u, ttl) = (UserId::from(7), 300);
        let two = PurchaseLimits { per_admission: 1, per_user: 2 };
        assert!(claimed(s.claim_token(t(), u.clone(), "A", ttl, two).await.unwrap()));
        let b = s.claim_token(t(), u.clone(), "B", ttl, two).await.unwrap();
        let TokenClaim::Claimed { previous } = b else { panic!("B: {b:?}") };
        assert_eq!(s.claim_token(t(), u.clone(), "C", ttl, two).await.unwrap(), TokenClaim::UserLimit);
        assert!(!s.token_used(t(), u.clone(), "C").await.unwrap(), "a refused token stays unused");
        assert_eq!(s.claim_token(t(), u.clone(), "A", ttl, two).await.unwrap(), TokenClaim::AlreadyUsed, "used first");
        s.release_token(t(), u.clone(), "B", previous, two).await.unwrap();
        assert!(claimed(s.claim_token(t(), u.clone(), "C", ttl, two).await.unwrap()), "B's use given back");
        assert_eq!(s.claim_token(t(), u.clone(), "D", ttl, two).await.unwrap(), TokenClaim::UserLimit);
        assert!(claimed(s.claim_token(t(), UserId::from(8), "E", ttl, two).await.unwrap()), "per user");
        assert_eq!(s.clear_sale(t(), true).await.unwrap(), vq::store::ClearOutcome::NoSale);
        assert!(claimed(s.claim_token(t(), u.clone(), "D", ttl, two).await.unwrap()), "a clear drops the counts");
    })
    .await;
}

/// The per-user counts live `queue.key_ttl_s` after the target's last purchase.
#[tokio::test]
async fn per_user_counts_expire_key_ttl_after_the_last_purchase() {
    with_both_configured(short_key_ttl, async |s, time| {
        let u = UserId::from(3);
        let one = PurchaseLimits { per_admission: 1, per_user: 1 };
        assert!(claimed(s.claim_token(t(), u.clone(), "A", 300, one).await.unwrap()));
        assert_eq!(s.claim_token(t(), u.clone(), "B", 300, one).await.unwrap(), TokenClaim::UserLimit);
        time.pass(1100).await;
        assert!(claimed(s.claim_token(t(), u.clone(), "B", 300, one).await.unwrap()));
    })
    .await;
}

/// Refusals counted by an instance are added to the record, per reason.
#[tokio::test]
async fn refused_purchases_are_added_to_the_record_per_reason() {
    with_both(async |s, _| {
        let mut batch = Refusals::default();
        batch.add(PurchaseRefusal::TokenUsed, 3);
        batch.add(PurchaseRefusal::NoValidToken, 1);
        s.record_refusals(t(), batch).await.unwrap();
        let mut more = Refusals::default();
        more.add(PurchaseRefusal::UserLimit, 2);
        more.add(PurchaseRefusal::TokenUsed, 1);
        s.record_refusals(t(), more).await.unwrap();
        let r = s.target_record(t()).await.unwrap().expect("a record");
        assert_eq!(r.refused.0, [4, 2, 1], "token_used, user_limit, no_valid_token");
    })
    .await;
}
