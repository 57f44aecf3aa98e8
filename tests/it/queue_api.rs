//! The queue API over real HTTP on a real Redis.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use crate::support::{RedisServer, TestApp, flag_on, spawn_app, test_settings};

const T: &str = "limited-drop/42";

async fn app_with_queue_on(redis: &RedisServer, tweak: impl FnOnce(&mut vq::config::Settings)) -> TestApp {
    let mut s = test_settings(Some(redis));
    tweak(&mut s);
    let app = spawn_app(s, false).await;
    flag_on(redis).await;
    app
}

#[tokio::test]
async fn thousand_concurrent_enters_get_seqs_one_to_thousand() {
    let redis = RedisServer::spawn();
    // redis.timeout_ms bounds each request from its arrival, so on a loaded machine some of a
    // burst of 1000 may fail open after 250 ms; this test is about numbering, not fail-open.
    let app = Arc::new(app_with_queue_on(&redis, |s| s.redis.timeout_ms = 5000).await);
    let mut tasks = Vec::new();
    for u in 1..=1000u64 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let r = app.enter(T, u).await;
            assert_eq!(r.status(), 200);
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["status"], "WAITING");
            v["position"].as_u64().unwrap()
        }));
    }
    let mut seqs = Vec::new();
    for t in tasks {
        seqs.push(t.await.unwrap());
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=1000).collect::<Vec<_>>(), "no gap, no duplicate");
}

#[tokio::test]
async fn hundred_concurrent_enters_of_one_user_get_one_seq() {
    let redis = RedisServer::spawn();
    let app = Arc::new(app_with_queue_on(&redis, |s| s.redis.timeout_ms = 5000).await);
    app.enter(T, 1).await;
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move { app.json(app.enter(T, 2).await).await["position"].as_u64().unwrap() }));
    }
    let mut seen = HashSet::new();
    for t in tasks {
        seen.insert(t.await.unwrap());
    }
    assert_eq!(seen, HashSet::from([2]));
    let mut c = redis.conn().await;
    let n: u64 = redis::cmd("ZCARD").arg("queue:{LIMITED_DROP:42}:waiting").query_async(&mut c).await.unwrap();
    assert_eq!(n, 2);
}

#[tokio::test]
async fn enter_answers_the_documented_json() {
    let redis = RedisServer::spawn();
    let app = app_with_queue_on(&redis, |s| s.queue.batch_size = 2).await;
    for u in 1..=4 {
        app.enter(T, u).await;
    }
    let v = app.json(app.enter(T, 5).await).await;
    assert_eq!(v["status"], "WAITING");
    assert_eq!(v["position"], 5);
    assert_eq!(v["aheadCount"], 4);
    assert_eq!(v["etaSeconds"], 2, "3 ticks of 0.5 s for 4 ahead + self at 2 per tick, rounded up");
    assert!(v["entryToken"].is_null() && v["tokenExpiresAt"].is_null());
}

#[tokio::test]
async fn full_queue_answers_429_queue_full() {
    let redis = RedisServer::spawn();
    let app = app_with_queue_on(&redis, |s| s.queue.max_capacity = 2).await;
    assert_eq!(app.enter(T, 1).await.status(), 200);
    assert_eq!(app.enter(T, 2).await.status(), 200);
    let r = app.enter(T, 3).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "QUEUE_FULL");
    assert!(v["detail"].as_str().unwrap().contains("full"));
}

#[tokio::test]
async fn leave_answers_204_and_the_next_poll_404() {
    let redis = RedisServer::spawn();
    let app = app_with_queue_on(&redis, |_| {}).await;
    app.enter(T, 9).await;
    assert_eq!(app.poll(T, 9).await.status(), 200);
    assert_eq!(app.leave(T, 9).await.status(), 204);
    let r = app.poll(T, 9).await;
    assert_eq!(r.status(), 404);
    assert_eq!(app.json(r).await["code"], "NOT_IN_QUEUE");
    assert_eq!(app.leave(T, 9).await.status(), 204, "leaving twice is fine");
}

#[tokio::test]
async fn user_who_stops_polling_is_evicted_and_gets_404() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.queue.heartbeat_timeout_s = 1;
    s.queue.batch_size = 1;
    let app = spawn_app(s, true).await;
    flag_on(&redis).await;
    for u in 1..=3 {
        app.enter(T, u).await;
    }
    // Users 2 and 3 keep polling; user 1... is admitted at the first tick. User 3 stops.
    for _ in 0..8 {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        app.poll(T, 2).await;
    }
    let r = app.poll(T, 3).await;
    assert_eq!(r.status(), 404, "no poll for longer than heartbeat_timeout_s");
    assert_eq!(app.json(r).await["code"], "NOT_IN_QUEUE");
    let mut c = redis.conn().await;
    let evicted: u64 = redis::cmd("GET").arg("queue:{LIMITED_DROP:42}:evicted").query_async(&mut c).await.unwrap();
    assert!(evicted >= 1);
}

#[tokio::test]
async fn admitted_user_gets_the_same_token_on_every_poll_and_enter() {
    let redis = RedisServer::spawn();
    let app = app_with_queue_on(&redis, |s| s.queue.batch_size = 1).await;
    app.enter(T, 1).await;
    let pump = vq::pump::Pump::new(
        crate::support::open_store(&test_settings(Some(&redis))),
        Arc::new(test_settings(Some(&redis))),
        "test".into(),
    );
    pump.tick().await.unwrap();
    let v = app.json(app.poll(T, 1).await).await;
    assert_eq!(v["status"], "ADMITTED");
    let token = v["entryToken"].as_str().unwrap().to_owned();
    assert!(v["tokenExpiresAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(app.json(app.poll(T, 1).await).await["entryToken"], token.as_str());
    assert_eq!(app.json(app.enter(T, 1).await).await["entryToken"], token.as_str());
    let mut c = redis.conn().await;
    let stored: String = redis::cmd("GET").arg("queue:{LIMITED_DROP:42}:token:1").query_async(&mut c).await.unwrap();
    assert_eq!(stored, token);
    let ttl: i64 = redis::cmd("TTL").arg("queue:{LIMITED_DROP:42}:token:1").query_async(&mut c).await.unwrap();
    assert!((290..=300).contains(&ttl), "{ttl}");
}

#[tokio::test]
async fn flag_off_admits_directly_with_a_token() {
    let redis = RedisServer::spawn();
    let app = spawn_app(test_settings(Some(&redis)), false).await;
    let v = app.json(app.enter(T, 5).await).await;
    assert_eq!(v["status"], "DIRECT_ADMITTED");
    assert!(v["entryToken"].as_str().is_some_and(|t| t.contains('.')));
    let v = app.json(app.poll(T, 5).await).await;
    assert_eq!(v["status"], "DIRECT_ADMITTED");
    let mut c = redis.conn().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("queue:*").query_async(&mut c).await.unwrap();
    assert!(keys.is_empty(), "flag off does not touch the queue: {keys:?}");
}

#[tokio::test]
async fn malformed_requests_get_400_invalid_request() {
    let redis = RedisServer::spawn();
    let app = app_with_queue_on(&redis, |_| {}).await;
    let too_long = "7".repeat(129);
    let cases: Vec<(&str, Option<&str>)> = vec![
        ("/virtual-queues/limited-drop/42/entries", None),
        ("/virtual-queues/limited-drop/42/entries", Some("")),
        ("/virtual-queues/limited-drop/42/entries", Some("a|b")),
        ("/virtual-queues/limited-drop/42/entries", Some("{7}")),
        ("/virtual-queues/limited-drop/42/entries", Some("a b")),
        ("/virtual-queues/limited-drop/42/entries", Some(&too_long)),
        ("/virtual-queues/LIMITED_DROP/42/entries", Some("1")),
        ("/virtual-queues/Concert/42/entries", Some("1")),
        ("/virtual-queues/concert-/42/entries", Some("1")),
        ("/virtual-queues/limited-drop/0/entries", Some("1")),
        ("/virtual-queues/limited-drop/x1/entries", Some("1")),
        ("/virtual-queues/limited-drop/%FF/entries", Some("1")),
    ];
    for (path, user) in cases {
        let mut req = app.client.post(app.url(path));
        if let Some(u) = user {
            req = req.header("X-User-Id", u);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 400, "{path} {user:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["code"], "INVALID_REQUEST", "{path} {user:?}");
        assert!(!v["detail"].as_str().unwrap().is_empty());
    }
    // A well-formed type nobody configured: unknown, as an undeclared target.
    let r = app.enter("concert/42", 1).await;
    assert_eq!(r.status(), 404);
    assert_eq!(app.json(r).await["code"], "UNKNOWN_TARGET");
    let r = app.client.get(app.url("/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(app.json(r).await["code"], "NOT_FOUND");
    let r = app.client.put(app.url("/virtual-queues/limited-drop/42/entries")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(app.json(r).await["code"], "METHOD_NOT_ALLOWED");
}

#[tokio::test]
async fn redis_down_fails_open_without_5xx_and_recovers() {
    let mut redis = RedisServer::spawn();
    let port = redis.port;
    let app = app_with_queue_on(&redis, |_| {}).await;
    assert_eq!(app.json(app.enter(T, 1).await).await["status"], "WAITING");
    redis.kill();
    for u in 1..=20 {
        let r = app.enter(T, u).await;
        assert_eq!(r.status(), 200);
        assert_eq!(app.json(r).await["status"], "DIRECT_ADMITTED");
        let r = app.poll(T, u).await;
        assert_eq!(r.status(), 200);
    }
    let health = app.json(app.client.get(app.url("/readyz")).send().await.unwrap()).await;
    assert_eq!(health["store"], "unreachable");
    let _redis = RedisServer::spawn_on(port);
    flag_on(&_redis).await;
    app.wait_until_queued(T, 77).await;
}

/// `queue.on_store_failure = "closed"`: while Redis is down nobody new is let in (503
/// QUEUE_UNAVAILABLE with Retry-After, never DIRECT_ADMITTED), a token issued before still
/// buys at the gate, a purchase without one is refused; the queue resumes when Redis returns.
#[tokio::test]
async fn redis_down_holds_buyers_when_the_queue_fails_closed() {
    let mut redis = RedisServer::spawn();
    let port = redis.port;
    let upstream = crate::gate::spawn_echo().await;
    let app = app_with_queue_on(&redis, |s| {
        s.queue.on_store_failure = vq::config::OnStoreFailure::Closed;
        s.queue.batch_size = 1;
        s.gate.upstream = Some(upstream);
        s.gate.pace = false;
    })
    .await;
    assert_eq!(app.json(app.enter(T, 1).await).await["status"], "WAITING");
    // User 1 is admitted (the mark moved past them, as the pump does) and holds a token
    // before Redis goes.
    let mut c = redis.conn().await;
    let _: () = redis::AsyncCommands::set(&mut c, "queue:{LIMITED_DROP:42}:admitted_count", 1).await.unwrap();
    let v = app.json(app.poll(T, 1).await).await;
    assert_eq!(v["status"], "ADMITTED", "{v}");
    let token = v["entryToken"].as_str().unwrap().to_owned();
    redis.kill();
    for u in 2..=21 {
        for r in [app.enter(T, u).await, app.poll(T, u).await] {
            assert_eq!(r.status(), 503);
            assert!(r.headers().get("retry-after").is_some(), "{:?}", r.headers());
            assert_eq!(app.json(r).await["code"], "QUEUE_UNAVAILABLE");
        }
    }
    let order = |user: u64, token: Option<&str>| {
        let mut req = app.client.post(app.url("/limited-drops/42/orders")).header("X-User-Id", user.to_string());
        if let Some(t) = token {
            req = req.header("X-Entry-Token", t);
        }
        req.send()
    };
    assert_eq!(order(1, Some(&token)).await.unwrap().status(), 200, "a token issued before buys");
    assert_eq!(order(2, None).await.unwrap().status(), 403, "no token, no purchase");
    let _redis = RedisServer::spawn_on(port);
    flag_on(&_redis).await;
    app.wait_until_queued(T, 77).await;
}

#[tokio::test]
async fn stats_are_served_per_target() {
    let redis = RedisServer::spawn();
    let app = app_with_queue_on(&redis, |_| {}).await;
    for u in 1..=3 {
        app.enter(T, u).await;
    }
    let v = app.json(app.client.get(app.url("/virtual-queues/limited-drop/42/stats")).send().await.unwrap()).await;
    assert_eq!(v["waitingCount"], 3);
    assert_eq!(v["admittedCount"], 0);
    for k in ["admissionRatePerSec", "avgWaitSeconds", "p95WaitSeconds"] {
        assert!(v[k].is_number(), "{k}");
    }
}

/// Waiting users are told when to poll next (body and `Retry-After`), later the further back
/// they are; answers to retry later carry `Retry-After`; no queue answer may be cached.
#[tokio::test]
async fn answers_pace_polls_and_are_never_cached() {
    let redis = RedisServer::spawn();
    // A Redis answer later than redis.timeout_ms fails open (200): on a loaded machine that
    // would turn the 429 below into a 200; this test is about headers, not fail-open.
    let app = app_with_queue_on(&redis, |s| {
        s.queue.batch_size = 10;
        s.queue.max_capacity = 2000;
        s.redis.timeout_ms = 5000;
    })
    .await;
    let no_store =
        |r: &reqwest::Response| r.headers().get("cache-control").and_then(|v| v.to_str().ok()) == Some("no-store");
    let retry_after =
        |r: &reqwest::Response| r.headers().get("retry-after").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let mut paced = Vec::new();
    for u in 1..=2000u64 {
        let r = app.enter(T, u).await;
        if [1, 20, 200, 2000].contains(&u) {
            assert!(no_store(&r), "{:?}", r.headers());
            let header = retry_after(&r);
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["status"], "WAITING");
            assert_eq!(header, v["pollAfterSeconds"].as_u64(), "the header and the body agree: {v}");
            paced.push(header.expect("Retry-After on a waiting answer"));
        }
    }
    // batch 10 per tick of test_settings: the front polls every tick, the back a quarter of the heartbeat.
    let s = test_settings(None);
    let tick_s = s.queue.tick_ms.div_ceil(1000).max(1);
    assert_eq!(paced[0], tick_s.min(s.queue.heartbeat_timeout_s / 4), "{paced:?}");
    assert!(paced.windows(2).all(|w| w[0] <= w[1]), "further back, less often: {paced:?}");
    assert_eq!(*paced.last().unwrap(), (s.queue.heartbeat_timeout_s / 4).max(1), "{paced:?}");

    let r = app.poll(T, 1).await;
    assert!(no_store(&r) && retry_after(&r).is_some());
    let full = app.enter(T, 5000).await;
    assert_eq!(full.status(), 429);
    assert!(no_store(&full) && retry_after(&full).is_some_and(|s| s >= 1), "{:?}", full.headers());
    let unknown = app.poll(T, 9999).await;
    assert_eq!(unknown.status(), 404);
    assert!(no_store(&unknown) && retry_after(&unknown).is_none());
    let bad = app.client.post(app.url("/virtual-queues/limited-drop/42/entries")).send().await.unwrap();
    assert_eq!(bad.status(), 400);
    assert!(no_store(&bad));
    let stats = app.client.get(app.url("/virtual-queues/limited-drop/42/stats")).send().await.unwrap();
    assert!(no_store(&stats));
}

#[tokio::test]
async fn admitted_answers_carry_no_poll_pacing_and_redis_down_stats_say_when_to_retry() {
    let mut redis = RedisServer::spawn();
    let app = spawn_app(test_settings(Some(&redis)), false).await;
    // Flag off: DIRECT_ADMITTED, nothing to poll for.
    let r = app.enter(T, 1).await;
    assert!(r.headers().get("retry-after").is_none());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "DIRECT_ADMITTED");
    assert!(v.get("pollAfterSeconds").is_none(), "{v}");
    redis.kill();
    let stats = app.client.get(app.url("/virtual-queues/limited-drop/42/stats")).send().await.unwrap();
    assert_eq!(stats.status(), 503);
    assert!(stats.headers().get("retry-after").is_some(), "{:?}", stats.headers());
}

/// A web app on an allowed origin may call the queue API from the browser: its preflight
/// (X-User-Id makes every call non-simple) is answered, and the answers name its origin.
/// Other origins get no CORS headers.
#[tokio::test]
async fn cors_lets_the_configured_origins_call_the_queue_api_and_no_other() {
    let redis = RedisServer::spawn();
    let app =
        app_with_queue_on(&redis, |s| s.http.cors_origins = Some("https://shop.example, http://127.0.0.1:3000".into()))
            .await;
    let url = app.url("/virtual-queues/limited-drop/42/entries");
    let preflight = |origin: &'static str| {
        app.client
            .request(reqwest::Method::OPTIONS, &url)
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .header("Access-Control-Request-Headers", "x-user-id")
            .send()
    };
    let ok = preflight("https://shop.example").await.unwrap();
    assert_eq!(ok.status(), 204);
    let h = ok.headers();
    assert_eq!(h["access-control-allow-origin"], "https://shop.example");
    let allowed = h["access-control-allow-headers"].to_str().unwrap();
    // Every header a waiting page sends: the buyer, the token, the visitor, the proof of work,
    // a signed lane claim and the JSON body of a lane code.
    for name in
        ["X-User-Id", "X-Entry-Token", "X-Visitor-Token", "X-Pow-Seed", "X-Pow-Nonce", "X-VQ-Lane", "Content-Type"]
    {
        assert!(allowed.split(", ").any(|a| a == name), "{name} not in {allowed}");
    }
    assert!(h["access-control-allow-methods"].to_str().unwrap().contains("POST"));
    let other = preflight("https://evil.example").await.unwrap();
    assert!(other.headers().get("access-control-allow-origin").is_none(), "{:?}", other.headers());
    assert_ne!(other.status(), 204);

    let r =
        app.client.post(&url).header("Origin", "http://127.0.0.1:3000").header("X-User-Id", "1").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], "http://127.0.0.1:3000");
    assert!(r.headers()["access-control-expose-headers"].to_str().unwrap().contains("Retry-After"));
    assert!(r.headers().get_all("vary").iter().any(|v| v == "Origin"));
    let r =
        app.client.post(&url).header("Origin", "https://evil.example").header("X-User-Id", "2").send().await.unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

#[test]
fn cors_origins_must_be_plain_origins() {
    for bad in ["shop.example", "https://*.shop.example", "https://shop.example/app", "*"] {
        let mut s = test_settings(None);
        s.http.cors_origins = Some(bad.into());
        let err = s.http.cors_origin_list().unwrap_err().to_string();
        assert!(err.contains("http.cors_origins") && err.contains(bad), "{bad}: {err}");
    }
}
