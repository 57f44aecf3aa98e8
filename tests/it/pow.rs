//! Proof of work at entry over HTTP: a new user gets a challenge and no place, a solution
//! enters once, and every kind of bad solution is refused with POW_REFUSED saying why.
//! `vq pow set` raises the difficulty mid-sale.

use serde_json::Value;
use vq::domain::UserId;
use vq::pow;

use crate::support::{RedisServer, TestApp, flag_on, secret, spawn_app, test_settings, vq_command};

const T: &str = "limited-drop/42";

async fn pow_app(redis: &RedisServer, bits: u8) -> TestApp {
    let mut s = test_settings(Some(redis));
    s.entry.pow_bits = bits;
    let app = spawn_app(s, false).await;
    flag_on(redis).await;
    app
}

async fn enter(app: &TestApp, user: &str, solution: Option<(&str, &str)>) -> (u16, Value) {
    let mut req = app.client.post(app.url(&format!("/virtual-queues/{T}/entries"))).header("X-User-Id", user);
    if let Some((seed, nonce)) = solution {
        req = req.header("X-Pow-Seed", seed).header("X-Pow-Nonce", nonce);
    }
    let r = req.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn challenge_of(v: &Value) -> (String, u8) {
    assert_eq!(v["status"], "CHALLENGE", "{v}");
    (v["challenge"]["seed"].as_str().unwrap().to_owned(), v["challenge"]["bits"].as_u64().unwrap() as u8)
}

async fn waiting(redis: &RedisServer) -> u64 {
    let mut c = redis.conn().await;
    redis::cmd("ZCARD").arg("queue:{LIMITED_DROP:42}:waiting").query_async(&mut c).await.unwrap()
}

fn refused(answer: (u16, Value), says: &str) {
    let (status, v) = answer;
    assert_eq!((status, v["code"].as_str()), (403, Some("POW_REFUSED")), "{v}");
    assert!(v["detail"].as_str().unwrap().contains(says), "{v} should say {says}");
}

#[tokio::test]
async fn a_new_user_solves_a_challenge_once_and_bad_solutions_are_refused() {
    let redis = RedisServer::spawn();
    let app = pow_app(&redis, 10).await;
    // No solution: a challenge, no place, nothing stored.
    let (status, v) = enter(&app, "alice", None).await;
    assert_eq!(status, 200);
    let (seed, bits) = challenge_of(&v);
    assert_eq!(bits, 10);
    assert_eq!(waiting(&redis).await, 0);
    let mut c = redis.conn().await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("queue:*pow*").query_async(&mut c).await.unwrap();
    assert!(keys.is_empty(), "an unsolved challenge is never stored: {keys:?}");
    let polled = app.poll(T, "alice").await;
    assert_eq!(polled.status(), 404, "no place before the solution");

    let (nonce, _) = pow::solve(&seed, bits);
    // Wrong nonce, another user's challenge, an altered seed: refused, still no place.
    let wrong = (0u64..).map(|n| n.to_string()).find(|n| !pow::solves(&seed, n, bits)).unwrap();
    refused(enter(&app, "alice", Some((&seed, &wrong))).await, "does not solve");
    refused(enter(&app, "bob", Some((&seed, &nonce))).await, "not issued by vq");
    let easier = seed.replacen(".10.", ".1.", 1);
    refused(enter(&app, "alice", Some((&easier, &pow::solve(&easier, 1).0))).await, "not issued by vq");
    refused(enter(&app, "alice", Some(("garbage", "1"))).await, "malformed");
    let (status, v) = enter(&app, "alice", Some((&seed, "not a nonce"))).await;
    assert_eq!((status, &v["code"]), (400, &"INVALID_REQUEST".into()), "a nonce of another form: {v}");
    assert_eq!(waiting(&redis).await, 0);

    // The solution enters; used again (by the same user), it is refused.
    let (status, v) = enter(&app, "alice", Some((&seed, &nonce))).await;
    assert_eq!((status, &v["status"], &v["position"]), (200, &"WAITING".into(), &1.into()), "{v}");
    refused(enter(&app, "alice", Some((&seed, &nonce))).await, "already used");
    // Holding a place, alice enters again without work.
    let (_, v) = enter(&app, "alice", None).await;
    assert_eq!((&v["status"], &v["position"]), (&"WAITING".into(), &1.into()), "{v}");

    // Expired: a challenge vq signed that ran out.
    let now = vq::service::now_epoch_ms() / 1000;
    let old = pow::challenge(&secret(), [9; 16], "LIMITED_DROP:42".parse().unwrap(), &UserId::from(5), 10, now - 1);
    refused(enter(&app, "5", Some((&old.seed, &pow::solve(&old.seed, 10).0))).await, "expired");
    assert_eq!(waiting(&redis).await, 1);
    app.stop().await;
}

/// `vq pow set`, as an operator runs it. (The app of these tests runs in the test process and
/// sends no acknowledgement, so the command says no instance confirmed; the write is what
/// counts here: `flag.rs` checks confirmations with real processes.)
fn pow_set(redis: &RedisServer, bits: &str) {
    let out = vq_command().args(["pow", "set", bits]).env("VQ_REDIS__URL", redis.url()).output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("flag written"), "{said}{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn raising_the_difficulty_mid_sale_refuses_easier_challenges_and_asks_more() {
    let redis = RedisServer::spawn();
    let app = pow_app(&redis, 4).await;
    let (_, v) = enter(&app, "carol", None).await;
    let (seed, bits) = challenge_of(&v);
    assert_eq!(bits, 4);
    pow_set(&redis, "12");
    // Every instance takes it within the flag's refresh.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let v = loop {
        let (_, v) = enter(&app, "dave", None).await;
        if v["challenge"]["bits"] == 12 || std::time::Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(v["challenge"]["bits"], 12, "{v}");
    refused(enter(&app, "carol", Some((&seed, &pow::solve(&seed, bits).0))).await, "asks for 4 bits, the queue now 12");
    let show = vq_command().args(["pow", "show"]).env("VQ_REDIS__URL", redis.url()).output().unwrap();
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("in force: 12 bits"), "{text}");
    // Off at runtime: no work asked.
    pow_set(&redis, "0");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (_, v) = enter(&app, "erin", None).await;
        if v["status"] == "WAITING" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{v}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let bad = vq_command().args(["pow", "set", "33"]).env("VQ_REDIS__URL", redis.url()).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("33"));
    app.stop().await;
}
