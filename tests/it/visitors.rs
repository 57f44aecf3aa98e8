//! `identity.mode = "visitor"` over HTTP: vq names visitors, a forged or altered visitor
//! token is a new visitor, the gate checks entry tokens against the visitor and tells the
//! purchase API who bought (the waiting page in a browser: `browser.rs`).

use std::time::{Duration, Instant};

use reqwest::header::{COOKIE, SET_COOKIE};
use serde_json::Value;
use vq::config::IdentityMode;

use crate::support::{RedisServer, TestApp, flag_on, spawn_app, test_settings};

const ENTER: &str = "/virtual-queues/limited-drop/42/entries";
const POLL: &str = "/virtual-queues/limited-drop/42/entries/me";
const ORDER: &str = "/limited-drops/42/orders";

async fn visitor_app(redis: &RedisServer, pump: bool) -> TestApp {
    let mut s = test_settings(Some(redis));
    s.identity.mode = IdentityMode::Visitor;
    s.gate.upstream = Some(crate::gate::spawn_echo().await);
    let app = spawn_app(s, pump).await;
    flag_on(redis).await;
    app
}

/// An answer's status, body and the visitor cookie it set (`None`: none set).
async fn call(req: reqwest::RequestBuilder) -> (u16, Value, Option<String>) {
    let r = req.send().await.unwrap();
    let cookie = r.headers().get_all(SET_COOKIE).iter().find_map(|v| {
        let v = v.to_str().ok()?;
        assert!(v.contains("HttpOnly") && v.contains("Secure") && v.contains("SameSite=Lax"), "{v}");
        Some(v.strip_prefix("vq_visitor=")?.split(';').next()?.to_owned())
    });
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null), cookie)
}

fn with_cookie(req: reqwest::RequestBuilder, token: &str) -> reqwest::RequestBuilder {
    req.header(COOKIE, format!("theme=dark; vq_visitor={token}"))
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
    let (id, sig) = first.rsplit_once('.').unwrap();
    let other_key = vq::token::Secret::new(vec![b'k'; 40]).unwrap();
    let other_id: vq::domain::UserId = "v_AAAAAAAAAAAAAAAAAAAAAA".parse().unwrap();
    let forged = [
        format!("{id}.{}", sig.chars().rev().collect::<String>()),
        format!("{}x.{sig}", id),
        format!("{other_id}.{sig}"),
        vq::visitor::sign(&other_key, &other_id),
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
    let visitor_a = a.rsplit_once('.').unwrap().0;
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
        .header(COOKIE, format!("vq_visitor={a}"))
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
