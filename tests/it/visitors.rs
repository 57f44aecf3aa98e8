//! `identity.mode = "visitor"` over HTTP: vq names visitors, a forged, altered or expired
//! visitor token is a new visitor, the `Secure` cookie is `__Host-vq_visitor` (and only the
//! name vq sets is read), the gate checks entry tokens against the visitor and tells the
//! purchase API who bought (the waiting page in a browser: `browser.rs`).

use std::time::{Duration, Instant};

use reqwest::header::{COOKIE, SET_COOKIE};
use serde_json::Value;
use vq::config::IdentityMode;

use vq::config::Settings;

use crate::support::{RedisServer, TestApp, flag_on, spawn_app, test_settings};

const ENTER: &str = "/virtual-queues/limited-drop/42/entries";
const POLL: &str = "/virtual-queues/limited-drop/42/entries/me";
const ORDER: &str = "/limited-drops/42/orders";

async fn visitor_app(redis: &RedisServer, pump: bool) -> TestApp {
    visitor_app_with(redis, pump, |_| {}).await
}

async fn visitor_app_with(redis: &RedisServer, pump: bool, change: impl FnOnce(&mut Settings)) -> TestApp {
    let mut s = test_settings(Some(redis));
    s.identity.mode = IdentityMode::Visitor;
    s.gate.upstream = Some(crate::gate::spawn_echo().await);
    change(&mut s);
    let app = spawn_app(s, pump).await;
    flag_on(redis).await;
    app
}

/// An answer's status, body and the visitor cookie it set (`None`: none set): `Secure`, so
/// `__Host-vq_visitor` with `Path=/` and no `Domain`.
async fn call(req: reqwest::RequestBuilder) -> (u16, Value, Option<String>) {
    let r = req.send().await.unwrap();
    let cookie = r.headers().get_all(SET_COOKIE).iter().find_map(|v| {
        let v = v.to_str().ok()?;
        assert!(v.contains("HttpOnly") && v.contains("Secure") && v.contains("SameSite=Lax"), "{v}");
        assert!(v.contains("; Path=/;") && !v.to_ascii_lowercase().contains("domain="), "{v}");
        Some(v.strip_prefix("__Host-vq_visitor=")?.split(';').next()?.to_owned())
    });
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null), cookie)
}

fn with_cookie(req: reqwest::RequestBuilder, token: &str) -> reqwest::RequestBuilder {
    req.header(COOKIE, format!("theme=dark; __Host-vq_visitor={token}"))
}

/// The visitor id a visitor token names (`id.expiry.signature`).
fn id_of(token: &str) -> &str {
    token.split_once('.').unwrap().0
}

#[tokio::test]
async fn visitors_are_named_by_vq_and_a_forged_token_is_a_new_visitor() {
    let redis = RedisServer::spawn();
    let app = visitor_app(&redis, false).await;
    let (status, v, cookie) = call(app.client.post(app.url(ENTER))).await;
    assert_eq!((status, &v["status"], &v["position"]), (200, &"WAITING".into(), &1.into()), "{v}");
    let first = cookie.expect("a new visitor gets the cookie");
    assert_eq!(v["visitorToken"], first.as_str(), "apps without cookies get it in the body");
    assert!(first.starts_with("v_"), "{first}");

    // The cookie or X-Visitor-Token names the same visitor: same place, no new cookie.
    let (_, v, cookie) = call(with_cookie(app.client.post(app.url(ENTER)), &first)).await;
    assert_eq!((v["position"].as_u64(), cookie), (Some(1), None), "{v}");
    let (_, v, _) = call(app.client.get(app.url(POLL)).header("X-Visitor-Token", &first)).await;
    assert_eq!((&v["status"], v["position"].as_u64()), (&"WAITING".into(), Some(1)), "{v}");

    // Whatever is forged names nobody: each is a new visitor at the back, never visitor 1.
    let (signed, sig) = first.rsplit_once('.').unwrap();
    let (id, expiry) = signed.split_once('.').unwrap();
    let later = expiry.parse::<u64>().unwrap() + 86_400;
    let other_key = vq::token::Secret::new(vec![b'k'; 40]).unwrap();
    let other_id: vq::domain::UserId = "v_AAAAAAAAAAAAAAAAAAAAAA".parse().unwrap();
    let forged = [
        format!("{signed}.{}", sig.chars().rev().collect::<String>()),
        format!("{id}x.{expiry}.{sig}"),
        format!("{other_id}.{expiry}.{sig}"),
        format!("{id}.{later}.{sig}"),
        format!("{id}.{sig}"),
        vq::visitor::sign(&other_key, &other_id, later),
        id.to_owned(),
        "garbage".to_owned(),
    ];
    for (i, token) in forged.iter().enumerate() {
        let (status, v, cookie) = call(with_cookie(app.client.post(app.url(ENTER)), token)).await;
        assert_eq!((status, v["position"].as_u64()), (200, Some(i as u64 + 2)), "{token}: {v}");
        let new = cookie.expect("a new visitor gets a new cookie");
        assert!(new != first && &new != token);
        let (status, v, _) = call(app.client.get(app.url(POLL)).header("X-Visitor-Token", token)).await;
        assert_eq!((status, &v["code"]), (404, &"NOT_IN_QUEUE".into()), "{token}: a poll by it finds no place");
    }
    // X-User-Id would let anyone name any visitor: refused.
    let (status, v, _) = call(app.client.post(app.url(ENTER)).header("X-User-Id", id)).await;
    assert_eq!((status, &v["code"]), (400, &"INVALID_REQUEST".into()), "{v}");
    assert!(v["detail"].as_str().unwrap().contains("identity.mode"), "{v}");
    app.stop().await;
}

#[tokio::test]
async fn the_gate_checks_the_token_against_the_visitor_and_tells_the_purchase_api_who_bought() {
    let redis = RedisServer::spawn();
    let app = visitor_app(&redis, true).await;
    let (_, _, a) = call(app.client.post(app.url(ENTER))).await;
    let (_, _, b) = call(app.client.post(app.url(ENTER))).await;
    let (a, b) = (a.unwrap(), b.unwrap());
    let deadline = Instant::now() + Duration::from_secs(15);
    let token = loop {
        assert!(Instant::now() < deadline, "visitor a never admitted");
        let (_, v, _) = call(with_cookie(app.client.get(app.url(POLL)), &a)).await;
        if v["status"] == "ADMITTED" {
            break v["entryToken"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let visitor_a = id_of(&a);
    let buy = |visitor: Option<&str>, user_header: Option<&str>| {
        let mut req = app.client.post(app.url(ORDER)).header("X-Entry-Token", &token).body("{}");
        if let Some(v) = visitor {
            req = with_cookie(req, v);
        }
        if let Some(u) = user_header {
            req = req.header("X-User-Id", u);
        }
        req.send()
    };
    // No visitor, another visitor, or a client naming visitor a in X-User-Id: refused.
    for (visitor, header) in [(None, None), (Some(b.as_str()), None), (None, Some(visitor_a))] {
        let r = buy(visitor, header).await.unwrap();
        assert_eq!(r.status(), 403, "{visitor:?} {header:?}");
    }
    // /gate/verify names the visitor for nginx to pass on.
    let verify = app
        .client
        .get(app.url("/gate/verify"))
        .header("X-Original-URI", ORDER)
        .header("X-Entry-Token", &token)
        .header(COOKIE, format!("__Host-vq_visitor={a}"))
        .send()
        .await
        .unwrap();
    assert_eq!(verify.status(), 204);
    assert_eq!(verify.headers()["x-user-id"], visitor_a);
    // The check claimed the token; the proxy's release (the purchase API failed) gives it back.
    let receipt = verify.headers()["x-vq-release"].to_str().unwrap().to_owned();
    let released = app.client.get(app.url("/gate/release")).header("X-Vq-Release", receipt).send().await.unwrap();
    assert_eq!(released.status(), 502);
    // Visitor a buys; the purchase API hears of visitor a, whatever X-User-Id the client sent.
    let r = buy(Some(&a), Some("someone-else")).await.unwrap();
    assert_eq!(r.status(), 200);
    let echoed: Value = r.json().await.unwrap();
    assert_eq!(echoed["headers"]["x-user-id"], visitor_a);
    assert_eq!(buy(Some(&a), None).await.unwrap().status(), 403, "used");
    app.stop().await;
}

/// The cookie's name follows `Secure`: `__Host-vq_visitor` (which browsers take only over HTTPS,
/// with `Path=/` and no `Domain`, so no sibling subdomain or plain-HTTP page can plant it), and
/// `vq_visitor` for trials over plain HTTP. Only the name vq sets names a visitor: a valid token
/// in the other cookie is a new visitor.
#[tokio::test]
async fn a_secure_visitor_cookie_is_host_prefixed_and_only_the_name_vq_sets_is_read() {
    let redis = RedisServer::spawn();
    let app = visitor_app(&redis, false).await;
    let r = app.client.post(app.url(ENTER)).send().await.unwrap();
    let set = r.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    assert!(set.starts_with("__Host-vq_visitor=v_") && set.contains("; Path=/;") && set.ends_with("; Secure"), "{set}");
    assert!(!set.to_ascii_lowercase().contains("domain="), "{set}");
    let token = set.strip_prefix("__Host-vq_visitor=").unwrap().split(';').next().unwrap().to_owned();
    let (_, v, renewed) = call(with_cookie(app.client.get(app.url(POLL)), &token)).await;
    assert_eq!((&v["status"], v["position"].as_u64(), renewed), (&"WAITING".into(), Some(1), None), "{v}");
    // The same token in a cookie without the prefix (what a sibling subdomain could set): not read.
    let unprefixed = app.client.get(app.url(POLL)).header(COOKIE, format!("vq_visitor={token}"));
    let (status, v, renewed) = call(unprefixed).await;
    assert_eq!((status, &v["code"]), (404, &"NOT_IN_QUEUE".into()), "{v}");
    assert!(renewed.is_some_and(|t| t != token), "a new visitor, with a cookie of their own");
    app.stop().await;

    // Not Secure: `vq_visitor`, and that is the one read.
    let redis = RedisServer::spawn();
    let app = visitor_app_with(&redis, false, |s| s.identity.cookie_secure = false).await;
    let r = app.client.post(app.url(ENTER)).send().await.unwrap();
    let set = r.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    assert!(set.starts_with("vq_visitor=v_") && !set.contains("Secure"), "{set}");
    let token = set.strip_prefix("vq_visitor=").unwrap().split(';').next().unwrap().to_owned();
    let r = app.client.get(app.url(POLL)).header(COOKIE, format!("vq_visitor={token}")).send().await.unwrap();
    assert!(r.headers().get(SET_COOKIE).is_none(), "the same visitor: no new cookie");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["position"].as_u64(), Some(1), "{v}");
    app.stop().await;
}

/// A visitor token carries its signed expiry, the cookie's `Max-Age` after it was issued, and
/// is checked on every use. Replayed two minutes later (at a `vq serve` whose clock libfaketime
/// sets two minutes on: the embedded store, so no Redis corrects it), past a `Max-Age` of 60 s,
/// it names nobody and its bearer is a new visitor; a token still in its time there names its
/// visitor.
#[tokio::test]
async fn a_visitor_token_replayed_after_its_max_age_is_a_new_visitor() {
    const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    assert!(std::path::Path::new(FAKETIME).exists(), "{FAKETIME} is missing: scripts/test.sh installs faketime");
    let redis = RedisServer::spawn();
    let now = visitor_app_with(&redis, false, |s| s.identity.visitor_ttl_s = 60).await;
    let later = crate::support::VqProcess::serve_env(&[
        ("VQ_STORE", "memory".to_owned()),
        ("VQ_IDENTITY__MODE", "visitor".to_owned()),
        ("VQ_IDENTITY__VISITOR_TTL_S", "600".to_owned()),
        ("LD_PRELOAD", FAKETIME.to_owned()),
        ("FAKETIME", "+120s".to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ])
    .await;
    let client = reqwest::Client::new();
    let at_later = |path: &str| format!("{}{path}", later.addr);

    let (_, v, cookie) = call(now.client.post(now.url(ENTER))).await;
    let token = cookie.expect("a new visitor gets the cookie");
    assert!(v["visitorToken"] == token.as_str() && token.matches('.').count() == 2, "{v}");
    let (_, expiry) = token.rsplit_once('.').unwrap().0.split_once('.').unwrap();
    let issued = vq::service::now_epoch_ms() / 1000;
    let max_age = expiry.parse::<u64>().unwrap().saturating_sub(issued);
    assert!((55..=60).contains(&max_age), "the token expires with its cookie's Max-Age (60 s): {token}");

    // Two minutes on, past the cookie's Max-Age: a new visitor, with a new cookie, whether the
    // token comes as the cookie or as X-Visitor-Token.
    let (status, v, renewed) = call(with_cookie(client.post(at_later(ENTER)), &token)).await;
    assert_eq!(status, 200, "{v}");
    let renewed = renewed.expect("an expired visitor token names nobody: a new visitor's cookie");
    assert_ne!(id_of(&renewed), id_of(&token), "{v}");
    let (_, _, again) = call(client.post(at_later(ENTER)).header("X-Visitor-Token", &token)).await;
    assert!(again.is_some_and(|t| id_of(&t) != id_of(&token)), "X-Visitor-Token is checked the same way");
    // A token the later instance issued, 600 s from its clock, names its visitor there.
    let (_, v, none) = call(with_cookie(client.post(at_later(ENTER)), &renewed)).await;
    assert_eq!(none, None, "the same visitor: {v}");
    assert_eq!(v["visitorToken"], renewed.as_str(), "{v}");
    now.stop().await;
}
