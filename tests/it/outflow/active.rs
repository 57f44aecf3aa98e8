//! Active-buyer mode (`outflow = "active"`, `max_active`): a place frees only when a buyer
//! finishes (a purchase, or a token expiring unused); and the waiting page's ETA under the
//! adaptive batch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;

use super::{adaptive_settings, batch_now};
use crate::support::{RedisServer, flag_on, next_tick, open_store, spawn_app, test_settings};

/// Users of limited drop 42 holding a place, read from the keys themselves: admitted
/// (seq ≤ mark) and still in `waiting` (token not collected), or holding a stored token no
/// purchase used (its key expires with the token).
async fn holding_a_place(redis: &RedisServer, users: u64) -> u64 {
    let mut c = redis.conn().await;
    let mark: u64 = c.get("queue:{LIMITED_DROP:42}:admitted_count").await.unwrap_or(0);
    let uncollected: u64 = c.zcount("queue:{LIMITED_DROP:42}:waiting", "-inf", mark).await.unwrap();
    let mut holding = 0;
    for u in 1..=users {
        let token: Option<String> = c.get(format!("queue:{{LIMITED_DROP:42}}:token:{u}")).await.unwrap();
        holding += u64::from(token.is_some_and(|t| !t.starts_with("used:")));
    }
    uncollected + holding
}

/// Active-buyer mode: never more than `max_active` buyers hold a place; a purchase frees
/// exactly one, and so does each token that expires unused.
#[tokio::test]
async fn in_active_mode_a_purchase_or_an_expiry_frees_exactly_one_place() {
    let redis = RedisServer::spawn();
    let sink = vq::loadgen::Sink::start("127.0.0.1:0".parse().unwrap(), 200, Default::default()).await.unwrap();
    let mut s = test_settings(Some(&redis));
    s.queue.tick_ms = 200;
    s.queue.heartbeat_timeout_s = 600;
    s.token.ttl_s = 2;
    let drops = s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").unwrap();
    (drops.outflow, drops.max_active) = (Some(vq::config::Outflow::Active), Some(5));
    s.gate.upstream = Some(format!("http://{}", sink.addr));
    let app = spawn_app(s.clone(), false).await;
    flag_on(&redis).await;
    let users = 30;
    for u in 1..=users {
        app.enter("limited-drop/42", u).await;
    }
    let pump = vq::pump::Pump::new(open_store(&s), Arc::new(s.clone()), "pump-a".into());
    // One tick: the users it admitted, and the places held afterwards (never over 5).
    let tick = || async {
        next_tick(200).await;
        let results = pump.tick().await.unwrap();
        let admitted = results.into_iter().flatten().filter_map(|t| t.admit).map(|a| a.admitted).sum::<u64>();
        let held = holding_a_place(&redis, users).await;
        assert!(held <= 5, "{held} buyers hold a place, max_active 5");
        admitted
    };
    let collect = |u: u64| {
        let app = &app;
        async move {
            let body = app.json(app.poll("limited-drop/42", u).await).await;
            body["entryToken"].as_str().expect("admitted").to_owned()
        }
    };
    assert_eq!(tick().await, 5, "the first five");
    assert_eq!(tick().await, 0, "nobody finished");
    let mut tokens = Vec::new();
    for u in 1..=5 {
        tokens.push(collect(u).await);
    }
    assert_eq!(tick().await, 0, "collecting a token finishes nothing");
    // User 1 buys: one place.
    let bought = app
        .client
        .post(app.url("/limited-drops/42/orders"))
        .header("X-User-Id", "1")
        .header("X-Entry-Token", &tokens[0])
        .send()
        .await
        .unwrap();
    assert_eq!(bought.status(), 200);
    assert_eq!(tick().await, 1, "a purchase frees one place");
    assert_eq!(tick().await, 0);
    let sixth = collect(6).await;
    assert!(!sixth.is_empty());
    // Users 2–5 never buy: their four tokens expire (2 s) before user 6's.
    let expired_by = Instant::now() + Duration::from_secs(3);
    let mut freed = 0;
    while freed < 4 {
        assert!(Instant::now() < expired_by, "the four tokens expired within 3 s; {freed} places freed");
        freed += tick().await;
    }
    assert_eq!(freed, 4, "each expiry frees one place");
    assert_eq!(holding_a_place(&redis, users).await, 5);
    let stats = app.json(app.client.get(app.url("/virtual-queues/limited-drop/42/stats")).send().await.unwrap()).await;
    assert_eq!(stats["outflow"], "active", "{stats}");
    assert_eq!((stats["tokensUsed"].as_u64(), stats["tokensExpired"].as_u64()), (Some(1), Some(4)), "{stats}");
}

/// The waiting page's ETA counts with the adaptive batch the instance's pump sees, not the
/// configured one.
#[tokio::test]
async fn the_eta_counts_with_the_adaptive_batch() {
    let redis = RedisServer::spawn();
    let mut s = adaptive_settings(&redis, 0);
    s.adaptive.increase = 20;
    let drops = s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").unwrap();
    drops.batch_max = Some(50);
    let app = spawn_app(s.clone(), true).await;
    flag_on(&redis).await;
    for u in 1..=3000u64 {
        app.enter("limited-drop/42", u).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while batch_now(&redis).await != Some(50) {
        assert!(Instant::now() < deadline, "the batch reached batch_max 50 within 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A tick for the instance's pump to read the batch, then the last user's ETA.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let body = app.json(app.poll("limited-drop/42", 3000).await).await;
    let ahead = body["aheadCount"].as_u64().expect("still waiting");
    let eta = body["etaSeconds"].as_u64().unwrap();
    let at = |batch: u64| vq::domain::eta_seconds(ahead, batch, 200);
    assert_eq!(eta, at(50), "{ahead} ahead at 50 per 200-ms tick (at the configured 10: {} s)", at(10));
}
