//! One-time use of entry tokens through the real gate: a token that bought once stays used
//! until it expires, whichever other valid tokens its user holds.

use std::time::Duration;

use serde_json::Value;
use vq::domain::{QueueTarget, UserId};
use vq::token::mint;

use crate::gate::spawn_echo;
use crate::support::{RedisServer, TestApp, flag_on, secret, spawn_app, test_settings};

const ORDER: &str = "/limited-drops/42/orders";

fn target() -> QueueTarget {
    "LIMITED_DROP:42".parse().expect("target")
}

async fn gated_app(redis: &RedisServer) -> TestApp {
    let mut s = test_settings(Some(redis));
    s.gate.upstream = Some(spawn_echo().await);
    // Pacing is not what is tested here: every purchase goes at once.
    s.gate.pace = false;
    let app = spawn_app(s, false).await;
    flag_on(redis).await;
    app
}

async fn purchase(app: &TestApp, user: u64, token: &str) -> u16 {
    let r = app
        .client
        .post(app.url(ORDER))
        .header("X-User-Id", user.to_string())
        .header("X-Entry-Token", token)
        .send()
        .await
        .expect("purchase request");
    r.status().as_u16()
}

#[tokio::test]
async fn alternating_two_valid_tokens_buys_once_with_each() {
    let redis = RedisServer::spawn();
    let app = gated_app(&redis).await;
    let now = vq::service::now_epoch_ms() / 1000;
    // Two distinct valid tokens of user 7 (minted a second apart), and one of user 8.
    let a = mint(&secret(), target(), &UserId::from(7), now, 300).raw;
    let b = mint(&secret(), target(), &UserId::from(7), now - 1, 300).raw;
    assert_ne!(a, b);
    let mut forwarded = 0;
    let mut statuses = Vec::new();
    for token in [&a, &b, &a, &b, &a, &b] {
        let s = purchase(&app, 7, token).await;
        statuses.push(s);
        forwarded += u32::from(s == 200);
    }
    assert_eq!(forwarded, 2, "each token buys once: {statuses:?}");
    assert_eq!(statuses[2..], [403, 403, 403, 403], "{statuses:?}");
    // Another user's token is not affected by user 7's.
    let c = mint(&secret(), target(), &UserId::from(8), now, 300).raw;
    assert_eq!(purchase(&app, 8, &c).await, 200);
}

/// A purchase the upstream refuses gives its token back, and only that token.
#[tokio::test]
async fn a_failed_purchase_gives_back_its_token_and_no_other() {
    let redis = RedisServer::spawn();
    let app = gated_app(&redis).await;
    let now = vq::service::now_epoch_ms() / 1000;
    let a = mint(&secret(), target(), &UserId::from(7), now, 300).raw;
    let b = mint(&secret(), target(), &UserId::from(7), now - 1, 300).raw;
    assert_eq!(purchase(&app, 7, &a).await, 200);
    let failed = app
        .client
        .post(app.url(ORDER))
        .header("X-User-Id", "7")
        .header("X-Entry-Token", &b)
        .header("x-echo-status", "409")
        .send()
        .await
        .unwrap();
    assert_eq!(failed.status(), 409);
    assert_eq!(purchase(&app, 7, &a).await, 403, "releasing B does not give A back");
    assert_eq!(purchase(&app, 7, &b).await, 200, "B is usable again after its failed purchase");
    assert_eq!(purchase(&app, 7, &b).await, 403);
}

/// A user polling through a Redis outage collects several DIRECT_ADMITTED tokens; after the
/// recovery, cycling them buys at most once with each.
#[tokio::test]
async fn fail_open_tokens_collected_during_an_outage_buy_once_each() {
    let mut redis = RedisServer::spawn();
    let port = redis.port;
    let app = gated_app(&redis).await;
    redis.kill();
    let mut tokens: Vec<String> = Vec::new();
    while tokens.len() < 3 {
        let v: Value = app.json(app.enter("limited-drop/42", 5).await).await;
        assert_eq!(v["status"], "DIRECT_ADMITTED", "{v}");
        let t = v["entryToken"].as_str().unwrap().to_owned();
        if !tokens.contains(&t) {
            tokens.push(t);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let back = RedisServer::spawn_on(port);
    flag_on(&back).await;
    app.wait_until_queued("limited-drop/42", 999).await;
    let mut statuses = Vec::new();
    for i in 0..12 {
        statuses.push(purchase(&app, 5, &tokens[i % 3]).await);
    }
    let forwarded = statuses.iter().filter(|s| **s == 200).count();
    assert!(forwarded <= 3, "{forwarded} purchases forwarded with 3 tokens: {statuses:?}");
    assert_eq!(forwarded, 3, "each token buys once: {statuses:?}");
}

/// Pacing is a place in a tick per purchase: a buyer replaying a spent token, again and again,
/// holds none of them (the refused claim gives its place back in the same step), so the buyers
/// after them still get the tick's places. With three places a tick and one tick ahead, twenty
/// replays would otherwise take every place the next buyers may wait for.
#[tokio::test]
async fn replaying_a_spent_token_takes_no_paced_place_from_the_next_buyers() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.gate.upstream = Some(spawn_echo().await);
    s.queue.tick_ms = 2000;
    s.queue.batch_size = 3;
    s.gate.pace_max_ticks = 1;
    let app = spawn_app(s.clone(), false).await;
    flag_on(&redis).await;
    let now = vq::service::now_epoch_ms() / 1000;
    let spent = mint(&secret(), target(), &UserId::from(7), now, 300).raw;
    crate::support::tick_room(s.queue.tick_ms, 1500).await;
    assert_eq!(purchase(&app, 7, &spent).await, 200);
    for _ in 0..20 {
        assert_eq!(purchase(&app, 7, &spent).await, 403, "a spent token is refused");
    }
    // Five places left (two this tick, three the next), whatever the replays tried.
    let mut statuses = Vec::new();
    for user in 8..=12u64 {
        let token = mint(&secret(), target(), &UserId::from(user), now, 300).raw;
        statuses.push(purchase(&app, user, &token).await);
    }
    assert_eq!(statuses, [200; 5], "the next buyers get the paced places: {statuses:?}");
}

/// A token that bought while its user still had a place in the queue (one the queue handed
/// out while it was turned off or failed open) stays used once the queue admits that user and
/// stores their new token in the same key: whether the poll that finds them admitted stores it
/// (users 9 and 11) or their enter (user 10), and with two such tokens used one after the other
/// (user 11: the first's mark already moved to their used tokens by the second's purchase).
/// Each token buys once, in any order after.
#[tokio::test]
async fn a_token_used_before_its_user_is_admitted_stays_used_after_the_admission() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.gate.upstream = Some(spawn_echo().await);
    s.gate.pace = false;
    let app = spawn_app(s, true).await;
    flag_on(&redis).await;
    let now = vq::service::now_epoch_ms() / 1000;
    for (user, earlier_tokens) in [(9_u64, 1_u64), (10, 1), (11, 2)] {
        let v: Value = app.json(app.enter("limited-drop/42", user).await).await;
        assert_eq!(v["status"], "WAITING", "{v}");
        // Tokens of this user from outside the queue's admission buy while they wait.
        let earlier: Vec<String> =
            (0..earlier_tokens).map(|k| mint(&secret(), target(), &UserId::from(user), now - 2 - k, 300).raw).collect();
        for t in &earlier {
            assert_eq!(purchase(&app, user, t).await, 200);
        }
        let token = if user == 10 {
            crate::support::wait_for(Duration::from_secs(20), "admitted at an enter", async || {
                let v: Value = app.json(app.enter("limited-drop/42", user).await).await;
                v["entryToken"].as_str().map(str::to_owned)
            })
            .await
        } else {
            app.admitted_token("limited-drop/42", user).await
        };
        assert!(!earlier.contains(&token));
        let mut statuses = Vec::new();
        for t in earlier.iter().chain([&token, &token]).chain(&earlier) {
            statuses.push(purchase(&app, user, t).await);
        }
        let mut want = vec![403; statuses.len()];
        want[earlier.len()] = 200;
        assert_eq!(statuses, want, "user {user}: the earlier tokens stay used, the new one buys once");
    }
}

/// Two purchases of one user, each with a token of their own, claimed in one shared call whose
/// replicas do not confirm it (`redis.wait_replicas = 1` and no replica): both are given back,
/// last first, so the token key holds the queue's token again, not the first claim's mark (which
/// the second claim moved aside), and neither token is kept among the used ones.
#[tokio::test]
async fn two_claims_of_one_user_in_one_call_are_both_given_back_when_the_replicas_do_not_confirm() {
    use vq::store::prelude::*;
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.redis.wait_replicas = vq::store::ReplicaWait::Count(1);
    s.redis.wait_timeout_ms = 50;
    let store = crate::support::open_store(&s);
    let user = UserId::from(21_u64);
    let key = format!("queue:{{LIMITED_DROP:42}}:token:{user}");
    let mut c = redis.conn().await;
    let _: () = redis::cmd("SET").arg(&key).arg("queued").arg("EX").arg(300).query_async(&mut c).await.unwrap();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut c).await.unwrap();
    let limits = vq::domain::PurchaseLimits::default();
    // Both submitted before the coalescer's runner first runs: one drain, one call.
    let (first, second) = tokio::join!(
        store.claim_token(target(), user.clone(), "queued", 300, limits),
        store.claim_token(target(), user.clone(), "other", 300, limits)
    );
    for claim in [&first, &second] {
        assert!(matches!(claim, Err(vq::store::StoreError::NotReplicated { .. })), "{claim:?}");
    }
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.unwrap();
    // One call's replicas waited for: the two claims went together.
    let waits =
        stats.lines().find_map(|l| l.strip_prefix("cmdstat_wait:calls=")?.split(',').next()?.parse::<u64>().ok());
    assert_eq!(waits, Some(1), "one claim call: {stats}");
    let held: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut c).await.unwrap();
    assert_eq!(held.as_deref(), Some("queued"), "the queue's token is the user's again");
    let used: u64 =
        redis::cmd("ZCARD").arg(format!("queue:{{LIMITED_DROP:42}}:used:{user}")).query_async(&mut c).await.unwrap();
    assert_eq!(used, 0, "no token kept as used");
}
