//! The purchase limits the gate keeps (`purchases_per_admission`, `purchases_per_user`),
//! through the real gate, `/gate/verify` and two `vq serve` processes on one Redis; and the
//! refused purchases in the sale report, per reason.

use std::time::{Duration, Instant};

use serde_json::Value;
use vq::config::Settings;
use vq::domain::{QueueTarget, UserId};
use vq::token::mint;

use crate::gate::spawn_echo;
use crate::support::{RedisServer, TestApp, VqProcess, flag_on, secret, spawn_app, test_settings, vq_command};

const ORDER: &str = "/limited-drops/42/orders";
const T: &str = "limited-drop/42";

fn target() -> QueueTarget {
    "LIMITED_DROP:42".parse().expect("target")
}

/// A valid token of `user` (a second older per `age`, so one user's tokens differ).
fn token(user: u64, age: u64) -> String {
    let now = vq::service::now_epoch_ms() / 1000;
    mint(&secret(), target(), &UserId::from(user), now - age, 300).raw
}

/// The limits set on the `limited-drop` type itself (the queue's defaults stay 1 and 0).
fn with_limits(s: &mut Settings, per_admission: u64, per_user: u64) {
    let t = s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").expect("shipped type");
    t.purchases_per_admission = Some(per_admission);
    t.purchases_per_user = Some(per_user);
}

async fn gated_app(redis: &RedisServer, change: impl FnOnce(&mut Settings), pump: bool) -> TestApp {
    let mut s = test_settings(Some(redis));
    s.gate.upstream = Some(spawn_echo().await);
    // Pacing is not what is tested here: every purchase goes at once.
    s.gate.pace = false;
    change(&mut s);
    let app = spawn_app(s, pump).await;
    flag_on(redis).await;
    app
}

/// A purchase at `base` (an app or a process): the status and the body (JSON, or null).
async fn buy(client: &reqwest::Client, base: &str, user: u64, token: Option<&str>, echo_status: u16) -> (u16, Value) {
    let mut req = client.post(format!("{base}{ORDER}")).header("X-User-Id", user.to_string());
    if let Some(t) = token {
        req = req.header("X-Entry-Token", t);
    }
    let r = req.header("x-echo-status", echo_status.to_string()).send().await.expect("purchase");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn refused_with(answer: &(u16, Value), code: &str, names: &str) {
    let (status, body) = answer;
    assert_eq!(*status, 403, "{body}");
    assert_eq!(body["code"], code, "{body}");
    let detail = body["detail"].as_str().expect("detail");
    assert!(detail.contains(names), "the detail names the limit ({names}): {detail}");
}

#[tokio::test]
async fn three_purchases_per_admission_pass_and_the_fourth_is_refused_naming_the_limit() {
    let redis = RedisServer::spawn();
    let app = gated_app(&redis, |s| with_limits(s, 3, 0), false).await;
    let a = token(7, 0);
    for i in 1..=3 {
        assert_eq!(buy(&app.client, &app.addr, 7, Some(&a), 200).await.0, 200, "purchase {i}");
    }
    let fourth = buy(&app.client, &app.addr, 7, Some(&a), 200).await;
    refused_with(&fourth, "QUEUE_BYPASS_DENIED", "purchases_per_admission = 3");
    // The other type keeps the queue's default: one purchase per token.
    let now = vq::service::now_epoch_ms() / 1000;
    let e = mint(&secret(), "TICKETING_EVENT:42".parse().unwrap(), &UserId::from(7), now, 300).raw;
    let seats = |t: &str| {
        app.client
            .post(app.url("/events/42/seats/select"))
            .header("X-User-Id", "7")
            .header("X-Entry-Token", t.to_owned())
            .send()
    };
    assert_eq!(seats(&e).await.unwrap().status(), 200);
    let second: Value = seats(&e).await.unwrap().json().await.unwrap();
    assert!(second["detail"].as_str().unwrap().contains("purchases_per_admission = 1"), "{second}");
}

/// Enter, admitted, buy; the token expires; enter again, admitted, buy; a third purchase is
/// refused, even with a fresh valid token.
#[tokio::test]
async fn a_user_makes_purchases_per_user_purchases_across_re_entries() {
    let redis = RedisServer::spawn();
    let app = gated_app(
        &redis,
        |s| {
            with_limits(s, 1, 2);
            s.token.ttl_s = 2;
        },
        true,
    )
    .await;
    let mut tokens = Vec::new();
    for round in 1..=2 {
        assert_eq!(app.enter(T, 5).await.status(), 200, "enter {round}");
        let t = app.admitted_token(T, 5).await;
        assert!(!tokens.contains(&t), "a new admission, a new token");
        assert_eq!(buy(&app.client, &app.addr, 5, Some(&t), 200).await.0, 200, "purchase {round}");
        tokens.push(t);
        // The used token is the user's answer until it expires; then they may queue again.
        tokio::time::sleep(Duration::from_millis(2_100)).await;
    }
    let fresh = token(5, 0);
    refused_with(&buy(&app.client, &app.addr, 5, Some(&fresh), 200).await, "PURCHASE_LIMIT", "purchases_per_user = 2");
    // Another user is not affected.
    assert_eq!(buy(&app.client, &app.addr, 6, Some(&token(6, 0)), 200).await.0, 200);
}

/// A purchase the purchase API fails gives its use back to the token's count and the user's.
#[tokio::test]
async fn a_failed_purchase_gives_the_use_back_to_both_counts() {
    let redis = RedisServer::spawn();
    let app = gated_app(&redis, |s| with_limits(s, 2, 3), false).await;
    let (a, b) = (token(7, 0), token(7, 1));
    let c = &app.client;
    assert_eq!(buy(c, &app.addr, 7, Some(&a), 200).await.0, 200);
    assert_eq!(buy(c, &app.addr, 7, Some(&a), 502).await.0, 502, "the purchase API fails");
    assert_eq!(buy(c, &app.addr, 7, Some(&a), 200).await.0, 200, "the token's second use, given back");
    refused_with(&buy(c, &app.addr, 7, Some(&a), 200).await, "QUEUE_BYPASS_DENIED", "purchases_per_admission = 2");
    assert_eq!(buy(c, &app.addr, 7, Some(&b), 502).await.0, 502);
    assert_eq!(buy(c, &app.addr, 7, Some(&b), 200).await.0, 200, "the user's third purchase, given back");
    refused_with(&buy(c, &app.addr, 7, Some(&b), 200).await, "PURCHASE_LIMIT", "purchases_per_user = 3");
}

/// 50 purchases at once with one token, half through each of two `vq serve` on one Redis:
/// exactly `purchases_per_admission` reach the purchase API; the same through `/gate/verify`.
#[tokio::test]
async fn concurrent_purchases_with_one_token_across_two_instances_pass_exactly_the_limit() {
    let redis = RedisServer::spawn();
    let envs = [
        ("VQ_GATE__UPSTREAM", spawn_echo().await),
        ("VQ_GATE__PACE", "false".to_owned()),
        ("VQ_QUEUE__PURCHASES_PER_ADMISSION", "3".to_owned()),
    ];
    let procs = [VqProcess::serve(&redis, &envs).await, VqProcess::serve(&redis, &envs).await];
    flag_on(&redis).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // both read the flag
    let client = reqwest::Client::new();
    for (user, through_verify) in [(7u64, false), (8, true)] {
        let t = token(user, 0);
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let (client, base, t) = (client.clone(), procs[i % 2].addr.clone(), t.clone());
                tokio::spawn(async move {
                    if through_verify {
                        let r = client
                            .get(format!("{base}/gate/verify"))
                            .header("X-Original-URI", ORDER)
                            .header("X-User-Id", user.to_string())
                            .header("X-Entry-Token", t)
                            .send()
                            .await
                            .expect("verify");
                        r.status().as_u16()
                    } else {
                        buy(&client, &base, user, Some(&t), 200).await.0
                    }
                })
            })
            .collect();
        let mut statuses = Vec::new();
        for task in tasks {
            statuses.push(task.await.expect("task"));
        }
        let passed = statuses.iter().filter(|s| **s == 200 || **s == 204).count();
        assert_eq!(passed, 3, "user {user} (verify: {through_verify}): {statuses:?}");
        assert!(statuses.iter().all(|s| matches!(s, 200 | 204 | 403)), "{statuses:?}");
    }
}

/// The sale report counts refused purchases per reason: counted in the instance and added to
/// the record once per tick.
#[tokio::test]
async fn the_sale_report_counts_refused_purchases_per_reason() {
    let redis = RedisServer::spawn();
    let app = gated_app(&redis, |s| with_limits(s, 1, 1), false).await;
    let c = &app.client;
    let a = token(7, 0);
    assert_eq!(buy(c, &app.addr, 7, None, 200).await.0, 403, "no token");
    assert_eq!(buy(c, &app.addr, 7, Some("forged.token"), 200).await.0, 403, "no valid token");
    assert_eq!(buy(c, &app.addr, 7, Some(&a), 200).await.0, 200);
    for _ in 0..3 {
        assert_eq!(buy(c, &app.addr, 7, Some(&a), 200).await.0, 403, "used");
    }
    assert_eq!(buy(c, &app.addr, 7, Some(&token(7, 1)), 200).await.0, 403, "the user's limit");
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let out = vq_command()
            .args(["sale", "report", "limited-drop:42", "--json"])
            .env("VQ_REDIS__URL", redis.url())
            .output()
            .expect("vq sale report");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let refused = report["totals"]["refused"].clone();
        if refused["no_valid_token"] == 2 && refused["token_used"] == 3 && refused["user_limit"] == 1 {
            break refused;
        }
        assert!(Instant::now() < deadline, "the report never counted the refusals: {report}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(refused, serde_json::json!({"token_used": 3, "user_limit": 1, "no_valid_token": 2}));
    let text = vq_command()
        .args(["sale", "report", "limited-drop:42"])
        .env("VQ_REDIS__URL", redis.url())
        .output()
        .expect("vq sale report");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("purchases refused: 6 (token_used 3, user_limit 1, no_valid_token 2)"), "{text}");
}
