//! User ids as shops have them (integers, UUIDs, strings), end to end: enter, poll, admission,
//! token, gate, stats and ledger, on Redis and on the embedded store (Redis Cluster:
//! `cluster.rs`; the store contract: `conformance/queue.rs`). And the ids vq refuses.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use reqwest::header::HeaderValue;
use serde_json::Value;
use vq::domain::{MAX_USER_ID_LEN, is_user_id_byte};

use crate::support::{RedisServer, TestApp, flag_on, spawn_app, spawn_app_flag_on, test_settings};

const T: &str = "limited-drop/42";
const ORDER: &str = "/limited-drops/42/orders";
const UUID: &str = "3f2a9c1e-7b4d-4c1e-9a8f-2b6c1d0e9f3a";

/// Ids of every shape vq takes, `7` and `007` among them (two users).
fn shop_ids() -> Vec<String> {
    let longest = "u".repeat(MAX_USER_ID_LEN);
    [UUID, "user_8f3k", "a.b+c@shop.example", "tenant:42", "7", "007", "Ab9-_.:@+", longest.as_str()]
        .map(str::to_owned)
        .to_vec()
}

async fn app(redis: Option<&RedisServer>) -> TestApp {
    let mut s = test_settings(redis);
    s.gate.upstream = Some(crate::gate::spawn_echo().await);
    s.gate.timeout_ms = 2000;
    match redis {
        Some(r) => {
            let app = spawn_app(s, true).await;
            flag_on(r).await;
            app
        }
        None => spawn_app_flag_on(s, true).await,
    }
}

async fn purchase(app: &TestApp, user: &str, token: &str) -> reqwest::Response {
    app.client
        .post(app.url(ORDER))
        .header("X-User-Id", user)
        .header("X-Entry-Token", token)
        .body("{}")
        .send()
        .await
        .unwrap()
}

/// The user field of a token's payload.
fn token_user(token: &str) -> String {
    let payload = URL_SAFE_NO_PAD.decode(token.split_once('.').unwrap().0).unwrap();
    String::from_utf8(payload).unwrap().split('|').nth(2).unwrap().to_owned()
}

async fn every_shape_of_id_waits_is_admitted_and_buys(redis: Option<&RedisServer>) {
    let app = app(redis).await;
    let ids = shop_ids();
    for (i, id) in ids.iter().enumerate() {
        let v = app.json(app.enter(T, id).await).await;
        assert_eq!(v["status"], "WAITING", "{id}: {v}");
        assert_eq!(v["position"], i + 1, "{id}: a place of its own");
    }
    assert_eq!(app.json(app.enter(T, "007").await).await["position"], 6, "entering again keeps the place");
    if let Some(redis) = redis {
        // The queue's members are the ids as sent; the per-user count is a field per id, in the
        // shared count's HASHes.
        let mut c = redis.conn().await;
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg("queue:{LIMITED_DROP:42}:waiting")
            .arg(0)
            .arg(-1)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(members, ids);
        let counts: Vec<String> = redis::cmd("KEYS").arg("queue:holds:*").query_async(&mut c).await.unwrap();
        let mut held = Vec::new();
        for key in &counts {
            let field: Option<String> = redis::cmd("HGET").arg(key).arg(UUID).query_async(&mut c).await.unwrap();
            held.extend(field);
        }
        assert_eq!(held.len(), 1, "one count of the UUID's queues: {held:?}");
        let targets: Vec<&str> = held[0].split(' ').map(|t| t.split_once('=').unwrap().0).collect();
        assert_eq!(targets, ["LIMITED_DROP:42"], "{held:?}");
    }

    let mut tokens = vec![None; ids.len()];
    let deadline = Instant::now() + Duration::from_secs(15);
    while tokens.iter().any(Option::is_none) {
        assert!(Instant::now() < deadline, "not everyone admitted: {tokens:?}");
        for (id, token) in ids.iter().zip(tokens.iter_mut()).filter(|(_, t)| t.is_none()) {
            let v = app.json(app.poll(T, id).await).await;
            match v["status"].as_str() {
                Some("ADMITTED") => *token = Some(v["entryToken"].as_str().unwrap().to_owned()),
                Some("WAITING") => {}
                _ => panic!("{id}: {v}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tokens: Vec<String> = tokens.into_iter().map(Option::unwrap).collect();

    for (id, token) in ids.iter().zip(&tokens) {
        assert_eq!(&token_user(token), id, "the token names the id as sent");
    }
    let by_id = |id: &str| &tokens[ids.iter().position(|i| i == id).unwrap()];
    // Another user's token, also one whose id differs only in case or leading zeros: refused.
    for (user, token) in [("007", by_id("7")), ("7", by_id("007")), (&*UUID.to_uppercase(), by_id(UUID))] {
        let r = purchase(&app, user, token).await;
        assert_eq!(r.status(), 403, "{user}");
        assert!(r.text().await.unwrap().contains("another user"));
    }
    for (id, token) in ids.iter().zip(&tokens) {
        let r = purchase(&app, id, token).await;
        assert_eq!(r.status(), 200, "{id}");
        let echoed: Value = r.json().await.unwrap();
        assert_eq!(echoed["headers"]["x-user-id"], id.as_str(), "the purchase API gets the id as sent");
        assert_eq!(purchase(&app, id, token).await.status(), 403, "{id}: used");
    }

    let stats = app.json(app.client.get(app.url(&format!("/virtual-queues/{T}/stats"))).send().await.unwrap()).await;
    assert_eq!(stats["admittedCount"], ids.len(), "{stats}");
    assert_eq!(stats["waitingCount"], 0, "{stats}");
    // Leaving works by id too.
    assert_eq!(app.json(app.enter(T, "late:1").await).await["status"], "WAITING");
    assert_eq!(app.leave(T, "late:1").await.status(), 204);
    assert_eq!(app.poll(T, "late:1").await.status(), 404);
    app.stop().await;
}

#[tokio::test]
async fn every_shape_of_id_waits_is_admitted_and_buys_on_redis() {
    let redis = RedisServer::spawn();
    every_shape_of_id_waits_is_admitted_and_buys(Some(&redis)).await;
}

#[tokio::test]
async fn every_shape_of_id_waits_is_admitted_and_buys_on_the_embedded_store() {
    every_shape_of_id_waits_is_admitted_and_buys(None).await;
}

async fn refused(app: &TestApp, user: HeaderValue) -> (u16, Value) {
    let r = app
        .client
        .post(app.url(&format!("/virtual-queues/{T}/entries")))
        .header("X-User-Id", user)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn ids_outside_the_rule_are_refused_saying_the_rule_and_never_queued() {
    let redis = RedisServer::spawn();
    let app = app(Some(&redis)).await;
    let mut bad: Vec<Vec<u8>> =
        vec![Vec::new(), "7".repeat(MAX_USER_ID_LEN + 1).into_bytes(), "é7".as_bytes().to_vec(), b"\xff7".to_vec()];
    // (Spaces around a header value are not part of it in HTTP: ` 7` arrives as `7`.)
    // Every visible ASCII character outside the set, inside an id (a header value cannot
    // hold control characters).
    bad.extend((b' '..=b'~').filter(|b| !is_user_id_byte(*b)).map(|b| vec![b'a', b, b'b']));
    assert!(bad.len() > 30);
    for raw in &bad {
        let Ok(value) = HeaderValue::from_bytes(raw) else { continue };
        let (status, v) = refused(&app, value).await;
        assert_eq!(status, 400, "{raw:?}: {v}");
        assert_eq!(v["code"], "INVALID_REQUEST", "{raw:?}");
        let detail = v["detail"].as_str().unwrap();
        assert!(detail.contains("1 to 128 characters") && detail.contains("- _ . : @ +"), "{raw:?}: {detail}");
    }
    // The gate refuses them as no user; nothing was queued.
    let r = app.client.post(app.url(ORDER)).header("X-User-Id", "a|b").header("X-Entry-Token", "x.y").send().await;
    let r = r.unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.text().await.unwrap().contains("not a user id"));
    let mut c = redis.conn().await;
    let waiting: u64 = redis::cmd("ZCARD").arg("queue:{LIMITED_DROP:42}:waiting").query_async(&mut c).await.unwrap();
    assert_eq!(waiting, 0);
    // The longest id is taken.
    let longest = "u".repeat(MAX_USER_ID_LEN);
    assert_eq!(app.json(app.enter(T, &longest).await).await["status"], "WAITING");
    app.stop().await;
}

/// A token minted for an integer id before ids became strings (the shared vectors' first
/// case, signed then) still verifies, with vq's own verifier and through the gate.
#[test]
fn a_token_minted_for_an_integer_id_before_ids_were_strings_still_verifies() {
    let old = "TElNSVRFRF9EUk9QfDQyfDd8MTc2NzIyNTYwMA.Mxk4Hk-ALMbIUnaiysciRLvYCIm5tbDGSbBxBaz4-KI";
    let secret = vq::token::Secret::from_source(b"vq-vectors-current-key-7d1f0c93a4be2265".to_vec(), "test").unwrap();
    let claims =
        vq::token::verify(&secret, old, "LIMITED_DROP:42".parse().unwrap(), &"7".parse().unwrap(), 1_767_225_300);
    assert_eq!(claims.map(|c| c.user.to_string()), Ok("7".to_owned()));
}
