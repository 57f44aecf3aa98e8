//! The purchase gate in front of a real upstream that echoes what it received.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use serde_json::{Value, json};
use vq::domain::{QueueTarget, UserId};
use vq::token::{Secret, mint};

use crate::support::{RedisServer, TestApp, flag_on, secret, spawn_app, test_settings, wait_for};

const ORDER: &str = "/limited-drops/42/orders";

/// An upstream that answers with what it got. `x-echo-status` sets the status, and
/// `x-echo-sleep-ms` delays the answer.
pub async fn spawn_echo() -> String {
    async fn echo(method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> (StatusCode, axum::Json<Value>) {
        if let Some(ms) = headers.get("x-echo-sleep-ms").and_then(|v| v.to_str().ok()?.parse().ok()) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let status = headers
            .get("x-echo-status")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .and_then(|s| StatusCode::from_u16(s).ok())
            .unwrap_or(StatusCode::OK);
        let hdrs: serde_json::Map<String, Value> =
            headers.iter().map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or("")))).collect();
        let body = json!({
            "method": method.as_str(), "path": uri.path(), "query": uri.query(),
            "headers": hdrs, "body": String::from_utf8_lossy(&body),
            "receivedAtMs": vq::service::now_epoch_ms(),
        });
        (status, axum::Json(body))
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, axum::Router::new().fallback(echo)).await });
    addr
}

fn target() -> QueueTarget {
    "LIMITED_DROP:42".parse().unwrap()
}

fn now() -> u64 {
    vq::service::now_epoch_ms() / 1000
}

fn token_for(target: QueueTarget, user: u64) -> String {
    mint(&secret(), target, &UserId::from(user), now(), 300).raw
}

async fn gated_app(redis: &RedisServer) -> TestApp {
    let mut s = test_settings(Some(redis));
    s.gate.upstream = Some(spawn_echo().await);
    s.gate.timeout_ms = 500;
    let app = spawn_app(s, false).await;
    flag_on(redis).await;
    app
}

async fn purchase(app: &TestApp, user: Option<u64>, token: Option<&str>) -> reqwest::Response {
    let mut req = app.client.post(app.url(ORDER)).body("{\"qty\":1}");
    if let Some(u) = user {
        req = req.header("X-User-Id", u.to_string());
    }
    if let Some(t) = token {
        req = req.header("X-Entry-Token", t);
    }
    req.send().await.unwrap()
}

async fn assert_denied(r: reqwest::Response, detail_has: &str) {
    assert_eq!(r.status(), 403);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "QUEUE_BYPASS_DENIED");
    let detail = v["detail"].as_str().unwrap();
    assert!(detail.contains(detail_has), "detail `{detail}` should mention `{detail_has}`");
}

#[tokio::test]
async fn gate_refuses_each_kind_of_bad_token_with_its_reason() {
    let redis = RedisServer::spawn();
    let app = gated_app(&redis).await;
    let good = token_for(target(), 7);
    assert_denied(purchase(&app, Some(7), None).await, "no entry token").await;
    assert_denied(purchase(&app, Some(7), Some("garbage")).await, "malformed").await;
    let forged = mint(&Secret::new(vec![b'z'; 40]).unwrap(), target(), &UserId::from(7), now(), 300).raw;
    assert_denied(purchase(&app, Some(7), Some(&forged)).await, "signature").await;
    let (_, sig) = good.split_once('.').unwrap();
    let tampered = format!("{}.{sig}", base64_url(&format!("LIMITED_DROP|42|7|{}", now() + 9999)));
    assert_denied(purchase(&app, Some(7), Some(&tampered)).await, "signature").await;
    let expired = mint(&secret(), target(), &UserId::from(7), now() - 400, 300).raw;
    assert_denied(purchase(&app, Some(7), Some(&expired)).await, "expired").await;
    assert_denied(purchase(&app, Some(8), Some(&good)).await, "another user").await;
    let other_drop = token_for("LIMITED_DROP:43".parse().unwrap(), 7);
    assert_denied(purchase(&app, Some(7), Some(&other_drop)).await, "LIMITED_DROP:43").await;
    let other_type = token_for("TICKETING_EVENT:42".parse().unwrap(), 7);
    assert_denied(purchase(&app, Some(7), Some(&other_type)).await, "TICKETING_EVENT").await;
    assert_denied(purchase(&app, None, Some(&good)).await, "X-User-Id").await;
    // The good token passes once; a second purchase after the 2xx is refused.
    assert_eq!(purchase(&app, Some(7), Some(&good)).await.status(), 200);
    assert_denied(purchase(&app, Some(7), Some(&good)).await, "already used").await;
}

fn base64_url(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
}

#[tokio::test]
async fn valid_token_forwards_the_request_unchanged() {
    let redis = RedisServer::spawn();
    let app = gated_app(&redis).await;
    let token = token_for(target(), 7);
    let r = app
        .client
        .post(app.url("/limited-drops/42/orders?coupon=A1&x=%20y"))
        .header("X-User-Id", "7")
        .header("X-Entry-Token", &token)
        .header("X-Custom", "kept")
        .header("Content-Type", "application/json")
        .body("{\"qty\":2}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["method"], "POST");
    assert_eq!(v["path"], "/limited-drops/42/orders");
    assert_eq!(v["query"], "coupon=A1&x=%20y");
    assert_eq!(v["body"], "{\"qty\":2}");
    assert_eq!(v["headers"]["x-custom"], "kept");
    assert_eq!(v["headers"]["x-entry-token"], token.as_str());
    assert_eq!(v["headers"]["content-type"], "application/json");
    let mut c = redis.conn().await;
    // A minted token was never issued by the queue: it counts as a direct one.
    let (used, direct): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
        .arg("queue:{LIMITED_DROP:42}:waits")
        .arg("tokens_used")
        .arg("direct_tokens_used")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!((used, direct), (None, Some(1)));
}

#[tokio::test]
async fn upstream_409_passes_through_and_leaves_the_token_usable() {
    let redis = RedisServer::spawn();
    let app = gated_app(&redis).await;
    let token = token_for(target(), 7);
    let r = app
        .client
        .post(app.url(ORDER))
        .header("X-User-Id", "7")
        .header("X-Entry-Token", &token)
        .header("X-Echo-Status", "409")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 409, "seat taken: the upstream's answer, as is");
    assert_eq!(purchase(&app, Some(7), Some(&token)).await.status(), 200, "token still usable");
    assert_denied(purchase(&app, Some(7), Some(&token)).await, "already used").await;
}

#[tokio::test]
async fn queue_token_from_a_poll_opens_the_gate_once() {
    let redis = RedisServer::spawn();
    let app = gated_app(&redis).await;
    app.enter("limited-drop/42", 5).await;
    let s = test_settings(Some(&redis));
    let pump = vq::pump::Pump::new(crate::support::open_store(&s), std::sync::Arc::new(s), "p".into());
    // Admitted by the first tick after the one it entered in.
    let token = wait_for(Duration::from_secs(5), "user 5 admitted by a tick", async || {
        pump.tick().await.unwrap();
        app.json(app.poll("limited-drop/42", 5).await).await["entryToken"].as_str().map(str::to_owned)
    })
    .await;
    assert_eq!(purchase(&app, Some(5), Some(&token)).await.status(), 200);
    assert_denied(purchase(&app, Some(5), Some(&token)).await, "already used").await;
    // The user still sees the same token (ADMITTED), which the gate will not take again.
    let v = app.json(app.poll("limited-drop/42", 5).await).await;
    assert_eq!((v["status"].as_str(), v["entryToken"].as_str()), (Some("ADMITTED"), Some(token.as_str())));
    // Issued through the queue, used once; a stateless token of another user counts apart.
    let other = token_for(target(), 6);
    assert_eq!(purchase(&app, Some(6), Some(&other)).await.status(), 200);
    let stats = app.json(app.client.get(app.url("/virtual-queues/limited-drop/42/stats")).send().await.unwrap()).await;
    assert_eq!(
        (stats["tokensIssued"].as_u64(), stats["tokensUsed"].as_u64(), stats["directTokensUsed"].as_u64()),
        (Some(1), Some(1), Some(1)),
        "{stats}"
    );
}

#[tokio::test]
async fn flag_off_lets_purchases_through_without_a_token() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.gate.upstream = Some(spawn_echo().await);
    let app = spawn_app(s, false).await;
    assert_eq!(purchase(&app, Some(7), None).await.status(), 200);
    assert_eq!(purchase(&app, None, None).await.status(), 200);
}

#[tokio::test]
async fn other_paths_are_forwarded_unchecked_and_upstream_failures_are_clear() {
    let redis = RedisServer::spawn();
    let app = gated_app(&redis).await;
    let r = app.client.get(app.url("/products/1?full=1")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(app.json(r).await["path"], "/products/1");
    let r = app.client.get(app.url("/limited-drops/42/orders")).send().await.unwrap();
    assert_eq!(r.status(), 403, "every method on a gated path is gated");
    let r = app.client.post(app.url("/limited-drops/xyz/orders")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(app.json(r).await["code"], "INVALID_REQUEST");
    let r = app.client.get(app.url("/virtual-queues/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404, "vq's own namespace is never forwarded");

    let token = token_for(target(), 7);
    let r = app
        .client
        .post(app.url(ORDER))
        .header("X-User-Id", "7")
        .header("X-Entry-Token", &token)
        .header("X-Echo-Sleep-Ms", "1500")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    assert_eq!(app.json(r).await["code"], "UPSTREAM_TIMEOUT");
    assert_eq!(purchase(&app, Some(7), Some(&token)).await.status(), 200, "a timeout does not burn the token");

    let mut s = test_settings(Some(&redis));
    s.gate.upstream = Some(format!("http://127.0.0.1:{}", crate::support::free_port()));
    let down = spawn_app(s, false).await;
    flag_on(&redis).await;
    let r = purchase(&down, Some(8), Some(&token_for(target(), 8))).await;
    assert_eq!(r.status(), 502);
    assert_eq!(down.json(r).await["code"], "UPSTREAM_UNAVAILABLE");
}

#[tokio::test]
async fn gate_verify_answers_204_or_403_for_auth_request() {
    let redis = RedisServer::spawn();
    let app = gated_app(&redis).await;
    let verify = |uri: &str, method: &str, user: &str, token: &str| {
        app.client
            .get(app.url("/gate/verify"))
            .header("X-Original-URI", uri)
            .header("X-Original-Method", method)
            .header("X-User-Id", user)
            .header("X-Entry-Token", token)
            .send()
    };
    let token = token_for(target(), 7);
    assert_eq!(verify("/limited-drops/42/orders?x=1", "POST", "7", &token).await.unwrap().status(), 204);
    assert_eq!(verify("/limited-drops/42/orders", "POST", "8", &token).await.unwrap().status(), 403);
    assert_eq!(verify("/limited-drops/43/orders", "POST", "7", &token).await.unwrap().status(), 403);
    assert_eq!(verify("/limited-drops/abc/orders", "POST", "7", &token).await.unwrap().status(), 403);
    assert_eq!(verify("/products/1", "GET", "7", "").await.unwrap().status(), 204, "not gated");
    // The original URI is read as the proxy gate reads a path, whatever the method.
    // Each check of a purchase claims its token (one-time use), so each uses a token of its own.
    for (user, uri) in (10u64..).zip([
        "/limited-drops/42//Orders/",
        "/limited-drops/x/../42/%6Frders.json",
        "http://shop/limited-drops/42/orders",
    ]) {
        let (u, t) = (user.to_string(), token_for(target(), user));
        assert_eq!(verify(uri, "GET", &u, "").await.unwrap().status(), 403, "{uri}");
        assert_eq!(verify(uri, "PUT", &u, &t).await.unwrap().status(), 204, "{uri}");
        assert_eq!(verify(uri, "PUT", &u, &t).await.unwrap().status(), 403, "{uri}: the token is used");
    }
    let token = token_for(target(), 9);
    for uri in [
        "/limited-drops/42/orders%2F",
        "/limited-drops%2F42%2Forders",
        "/limited-drops/42/orders%00",
        "//virtual-queues/x",
        "//limited-drops/42/orders",
        "/limited-drops/42/orders%23",
        "/limited-drops/42/orders#",
        "/x#/../limited-drops/42/orders",
    ] {
        let r = verify(uri, "POST", "9", &token).await.unwrap();
        assert_eq!(r.status(), 403, "{uri}");
        assert_eq!(app.json(r).await["code"], "QUEUE_BYPASS_DENIED");
    }
    let clean = verify("/limited-drops/42/orders", "POST", "9", &token).await.unwrap();
    assert_eq!(clean.status(), 204, "the refusals above were the paths', not the token's");
    let no_method = app
        .client
        .get(app.url("/gate/verify"))
        .header("X-Original-URI", ORDER)
        .header("X-User-Id", "7")
        .send()
        .await
        .unwrap();
    assert_eq!(no_method.status(), 403, "no X-Original-Method: gated all the same");
    // nginx turns a 400 into a 500 for the buyer: a request it cannot check is a 403 too.
    let r = app.client.get(app.url("/gate/verify")).send().await.unwrap();
    assert_eq!(r.status(), 403);
    let v = app.json(r).await;
    assert_eq!(v["code"], "QUEUE_BYPASS_DENIED");
    assert!(v["detail"].as_str().unwrap().contains("X-Original-URI"), "{v}");
}

#[tokio::test]
async fn redis_down_keeps_the_gate_shut_for_tokenless_requests_and_open_for_fail_open_tokens() {
    let mut redis = RedisServer::spawn();
    let port = redis.port;
    let app = gated_app(&redis).await;
    redis.kill();
    let mut statuses = Vec::new();
    for u in 1..=30u64 {
        let r = app.enter("limited-drop/42", u).await;
        statuses.push(r.status().as_u16());
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["status"], "DIRECT_ADMITTED");
        let token = v["entryToken"].as_str().unwrap().to_owned();
        let ok = purchase(&app, Some(u), Some(&token)).await;
        statuses.push(ok.status().as_u16());
        assert_eq!(ok.status(), 200, "a fail-open token opens the gate");
        let denied = purchase(&app, Some(u), None).await;
        statuses.push(denied.status().as_u16());
        assert_eq!(denied.status(), 403, "no token is still refused");
    }
    assert!(statuses.iter().all(|s| *s < 500), "no 5xx while Redis is down: {statuses:?}");
    let back = RedisServer::spawn_on(port);
    flag_on(&back).await;
    app.wait_until_queued("limited-drop/42", 999).await;
}

/// A burst of purchases (admitted users learning it at once) reaches the purchase API at most
/// one batch per tick; past the ticks the gate may wait for, it answers 429 and the token
/// stays usable.
#[tokio::test]
async fn gate_paces_purchases_to_one_batch_per_tick() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.queue.batch_size = 3;
    s.queue.tick_ms = 500;
    s.gate.pace_max_ticks = 2;
    s.gate.upstream = Some(spawn_echo().await);
    let app = std::sync::Arc::new(spawn_app(s, false).await);
    flag_on(&redis).await;
    // Start the burst just after a tick begins, so it lands within one tick.
    let now = vq::service::now_epoch_ms();
    tokio::time::sleep(Duration::from_millis(500 - now % 500 + 60)).await;
    let mut tasks = Vec::new();
    for u in 1..=12u64 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let token = token_for(target(), u);
            let r = purchase(&app, Some(u), Some(&token)).await;
            let status = r.status().as_u16();
            let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
            let v: Value = r.json().await.unwrap();
            (u, token, status, retry, v)
        }));
    }
    let mut windows = std::collections::BTreeMap::<u64, u64>::new();
    let mut busy = Vec::new();
    for t in tasks {
        let (u, token, status, retry, v) = t.await.unwrap();
        match status {
            200 => *windows.entry(v["receivedAtMs"].as_u64().unwrap() / 500).or_default() += 1,
            429 => {
                assert_eq!(v["code"], "DOWNSTREAM_BUSY");
                assert_eq!(retry.as_deref(), Some("1"));
                busy.push((u, token));
            }
            other => panic!("user {u}: {other} {v}"),
        }
    }
    assert!(windows.values().all(|n| *n <= 3), "at most one batch per tick upstream: {windows:?}");
    let passed: u64 = windows.values().sum();
    // A burst within one tick: three ticks of three pass (a request that straggles into the
    // next tick may get a place one tick later), the rest are told to come back.
    assert!((9..=10).contains(&passed), "{windows:?}");
    assert_eq!(passed + busy.len() as u64, 12);
    assert!(!busy.is_empty());
    tokio::time::sleep(Duration::from_millis(1600)).await;
    for (u, token) in busy {
        assert_eq!(purchase(&app, Some(u), Some(&token)).await.status(), 200, "token of user {u} still usable");
    }
}
