//! The adaptive outflow turned against everyone else: while a healthy purchase API serves the
//! real buyers, an attacker floods the gate with purchases that fail — malformed bodies, early
//! hang-ups, refused tokens, purchases that need no token, a purchase API failing only the
//! attacker's account — with 0, 1 and 5 tokens. The controller hears the purchase API, not the
//! attacker: the batch climbs to `batch_max` as the healthy purchase API has it, and no
//! decision goes down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;
use vq::domain::{FlagState, QueueTarget, UserId};
use vq::store::prelude::*;

use super::{OUTFLOW, batch_now, buy_as_admitted};
use crate::forwarding::{BAD_BODIES, framed};
use crate::rig::send_bytes;
use crate::support::{RedisServer, TestApp, flag_on, open_store, secret, spawn_app, test_settings};

const ORDER: &str = "/limited-drops/42/orders";
/// The attacker's accounts start so; the purchase API fails every purchase of theirs.
const ATTACKER: &str = "mallory-";
const BATCH_MAX: u64 = 30;
/// The queue applies to half of limited drop 42's users.
const CANARY_PERCENT: u8 = 50;

/// A purchase API that serves every buyer at once, and fails the attacker's accounts (a
/// request crafted to make it fail, or one account it fails or rate-limits): 500, or the
/// status their `X-Fail-With` asks for, with `Retry-After` on a 429 or 503.
async fn purchase_api() -> String {
    // It reads the whole body before it answers, as a purchase API does.
    let handler = |headers: HeaderMap, _body: axum::body::Bytes| async move {
        let user = headers.get("x-user-id").and_then(|v| v.to_str().ok()).unwrap_or_default();
        if !user.starts_with(ATTACKER) {
            return (StatusCode::OK, [("x-served", "1")]);
        }
        let status = headers.get("x-fail-with").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(500);
        (StatusCode::from_u16(status).unwrap(), [("retry-after", "1")])
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, axum::Router::new().fallback(handler)).await });
    addr
}

fn target() -> QueueTarget {
    "limited-drop:42".parse().unwrap()
}

/// Whether the queue applies to `user` under the canary.
fn in_canary(user: &str) -> bool {
    let flag = FlagState { enabled: true, percent: CANARY_PERCENT, ..Default::default() };
    flag.applies(target(), &user.parse().unwrap())
}

/// The first `n` attacker accounts inside (or outside) the canary.
fn accounts(n: usize, inside: bool) -> Vec<String> {
    (0..).map(|i| format!("{ATTACKER}{i}")).filter(|u| in_canary(u) == inside).take(n).collect()
}

/// A token for `user` at limited drop 42 (as if they had waited), valid `ttl_s` from `now_s`.
fn token_for(user: &str, at: &str, now_s: u64, ttl_s: u64) -> String {
    vq::token::mint(&secret(), at.parse().unwrap(), &user.parse::<UserId>().unwrap(), now_s, ttl_s).raw
}

fn now_s() -> u64 {
    vq::service::now_epoch_ms() / 1000
}

/// A sale of limited drop 42 with an adaptive outflow (tick 200 ms, interval 600 ms, batch 10
/// within 2–30, +5, ×0.5, error ratio 0.3, 10 buyers at least), the queue on for half its
/// users, the users of 1..=2000 inside the canary entered, a pump, and every admitted user
/// buying at once through the gate with their token; returns once real buyers are served (the
/// first decision up).
async fn sale(redis: &RedisServer) -> (TestApp, CancellationToken, Vec<tokio::task::JoinHandle<()>>) {
    let mut s = test_settings(Some(redis));
    s.queue.tick_ms = 200;
    s.queue.batch_size = 10;
    s.queue.heartbeat_timeout_s = 600;
    s.queue.outflow = vq::config::Outflow::Adaptive;
    (s.queue.batch_min, s.queue.batch_max) = (2, BATCH_MAX);
    s.adaptive = vq::config::AdaptiveSettings {
        interval_ms: 600,
        latency_ms: 2500,
        error_ratio: 0.3,
        increase: 5,
        decrease: 0.5,
        min_samples: 10,
        target_purchases_per_tick: None,
    };
    s.gate.upstream = Some(purchase_api().await);
    let app = spawn_app(s.clone(), false).await;
    flag_on(redis).await;
    canary(&s).await;
    for u in (1..=2000u64).filter(|u| in_canary(&u.to_string())) {
        app.enter("limited-drop/42", u).await;
    }
    let pump = vq::pump::Pump::new(open_store(&s), std::sync::Arc::new(s.clone()), "test-pump".into());
    let stop = CancellationToken::new();
    let tasks = vec![tokio::spawn(pump.run(stop.clone())), buy_as_admitted(&app, redis, stop.clone())];
    let deadline = Instant::now() + Duration::from_secs(20);
    while batch_now(redis).await.is_none_or(|b| b <= 10) {
        assert!(Instant::now() < deadline, "the batch never rose with real buyers alone: {}", changes(redis).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (app, stop, tasks)
}

/// Puts limited drop 42 on a canary of [`CANARY_PERCENT`] and waits until the app applies it.
async fn canary(s: &vq::config::Settings) {
    let store = open_store(s);
    let change = vq::domain::FlagChange::Target(target(), vq::domain::TargetOverride::On { percent: CANARY_PERCENT });
    let version = store.change_flag(change).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let acks = store.flag_acks().await.unwrap_or_default();
        if acks.iter().any(|a| a.silent_ms.is_none() && a.version >= version) {
            return;
        }
        assert!(Instant::now() < deadline, "the app never applied the canary: {acks:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What one attacking request does.
#[derive(Debug, Clone, Copy)]
enum Attack {
    /// A chunked body that is malformed (a chunk size that is not hex).
    Malformed,
    /// A body announced and cut short by a hang-up.
    HangUp,
    /// A well-formed purchase.
    Purchase,
}

/// Sends `attack` with the headers `who(lane)` gives again and again, `lanes` at a time, each
/// lane at most 4000 times, until `stop`; the statuses it met.
fn flood(
    stop: &CancellationToken,
    app: &Arc<TestApp>,
    lanes: usize,
    attack: Attack,
    who: impl Fn(usize) -> Vec<(&'static str, String)> + Send + Sync + 'static,
) -> tokio::task::JoinHandle<Vec<u16>> {
    let (stop, app, who) = (stop.clone(), app.clone(), Arc::new(who));
    tokio::spawn(async move {
        let lanes: Vec<_> = (0..lanes)
            .map(|lane| {
                let (stop, app, who) = (stop.clone(), app.clone(), who.clone());
                tokio::spawn(async move {
                    let headers = who(lane);
                    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    let mut seen = Vec::new();
                    for _ in 0..4000 {
                        if stop.is_cancelled() {
                            break;
                        }
                        seen.push(match attack {
                            Attack::Malformed => malformed(&app, &headers).await,
                            Attack::HangUp => hang_up(&app, &headers).await,
                            Attack::Purchase => purchase(&app, &headers).await,
                        });
                    }
                    seen
                })
            })
            .collect();
        let mut seen = Vec::new();
        for lane in lanes {
            seen.extend(lane.await.unwrap());
        }
        seen.sort_unstable();
        seen.dedup();
        seen
    })
}

/// A purchase whose chunked body is malformed (a chunk size that is not hex).
async fn malformed(app: &TestApp, who: &[(&str, &str)]) -> u16 {
    let framing = BAD_BODIES.iter().find(|(what, _)| what.contains("not hex")).unwrap().1;
    send_bytes(app.addr.trim_start_matches("http://"), framed(ORDER, who, framing)).await.0
}

/// A purchase announcing 100 bytes of body, sending 10 and hanging up: no answer read (0).
async fn hang_up(app: &TestApp, who: &[(&str, &str)]) -> u16 {
    let head = framed(ORDER, who, "Content-Length: 100\r\n\r\n{\"sku\": 1,");
    if let Ok(c) = tokio::net::TcpStream::connect(app.addr.trim_start_matches("http://")).await
        && c.writable().await.is_ok()
    {
        let _ = c.try_write(&head);
        // Long enough for the gate to forward the head before the connection goes.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    0
}

/// A well-formed purchase with these headers; its status.
async fn purchase(app: &TestApp, who: &[(&str, &str)]) -> u16 {
    let mut req = app.client.post(app.url(ORDER)).body("{\"sku\": 1}");
    for (k, v) in who {
        req = req.header(*k, *v);
    }
    req.send().await.map_or(0, |r| r.status().as_u16())
}

/// Waits (25 s at most) until the batch reached [`BATCH_MAX`] and three more intervals were
/// decided, then says whether any decision of the run went down (with the decisions).
async fn batch_follows_the_purchase_api(redis: &RedisServer) {
    let interval = || async {
        let i: Option<u64> = redis.conn().await.hget(OUTFLOW, "interval").await.unwrap();
        i.unwrap_or(0)
    };
    let deadline = Instant::now() + Duration::from_secs(25);
    while batch_now(redis).await != Some(BATCH_MAX) {
        assert!(Instant::now() < deadline, "the batch never reached {BATCH_MAX}: {}", changes(redis).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reached = interval().await;
    while interval().await < reached + 3 {
        assert!(Instant::now() < deadline, "no decisions after reaching {BATCH_MAX}: {}", changes(redis).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reason: String = redis.conn().await.hget(OUTFLOW, "reason").await.unwrap();
    let changes = changes(redis).await;
    assert!(!changes.contains("down"), "a decision went down under the attack: {changes}");
    assert_eq!(batch_now(redis).await, Some(BATCH_MAX), "{reason}; {changes}");
}

/// The batch's changes in the ledger, oldest first, with their reasons.
async fn changes(redis: &RedisServer) -> String {
    let store = open_store(&test_settings(Some(redis)));
    let mut rows: Vec<String> = store
        .sale_ledger(target())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            vq::domain::LedgerEntry::Batch { from, to, reason, .. } => Some(format!("{from:?} → {to}: {reason}")),
            _ => None,
        })
        .collect();
    rows.reverse();
    rows.join("; ")
}

async fn finish(stop: CancellationToken, tasks: Vec<tokio::task::JoinHandle<()>>) {
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
}

/// No token at all: a user outside the canary sends malformed bodies, hangs up early and sends
/// purchases the purchase API fails (none needs a token, so the gate forwards them all); a
/// user inside it sends purchases without a token, with a forged one, an expired one and one
/// minted for another target (403, never forwarded).
#[tokio::test]
async fn with_no_token_a_flood_of_failing_purchases_leaves_the_batch_to_the_purchase_api() {
    let redis = RedisServer::spawn();
    let (app, stop, tasks) = sale(&redis).await;
    let app = Arc::new(app);
    let outside = accounts(1, false).remove(0);
    let inside = accounts(1, true).remove(0);
    let expired = token_for(&inside, "LIMITED_DROP:42", now_s() - 600, 60);
    let elsewhere = token_for(&inside, "LIMITED_DROP:43", now_s(), 300);
    let as_outside = move |_| vec![("X-User-Id", outside.clone())];
    let tokens = ["".to_owned(), "v1.forged.AAAA".to_owned(), expired, elsewhere];
    let floods = vec![
        flood(&stop, &app, 2, Attack::Malformed, as_outside.clone()),
        flood(&stop, &app, 2, Attack::HangUp, as_outside.clone()),
        flood(&stop, &app, 2, Attack::Purchase, as_outside),
        flood(&stop, &app, tokens.len(), Attack::Purchase, move |lane| {
            vec![("X-User-Id", inside.clone()), ("X-Entry-Token", tokens[lane].clone())]
        }),
    ];
    batch_follows_the_purchase_api(&redis).await;
    finish(stop, tasks).await;
    let seen: Vec<Vec<u16>> = futures_join(floods).await;
    assert_eq!(seen[0], [400], "malformed bodies are the client's 400");
    assert_eq!(seen[2], [500], "the purchase API failed the outside user's purchases");
    assert_eq!(seen[3], [403], "no valid token: refused");
}

/// One token: its holder sends malformed bodies with it, hangs up early with it, and sends
/// purchases the purchase API fails (each gives the token back, so it is used again and again,
/// and concurrently: 403 while another purchase holds it).
#[tokio::test]
async fn with_one_token_a_flood_of_failing_purchases_leaves_the_batch_to_the_purchase_api() {
    let redis = RedisServer::spawn();
    let (app, stop, tasks) = sale(&redis).await;
    let app = Arc::new(app);
    let u = accounts(1, true).remove(0);
    let t = token_for(&u, "LIMITED_DROP:42", now_s(), 300);
    let holder = move |lane: usize| {
        // One lane rate-limited by the purchase API (429 + Retry-After: backing off).
        let fail = if lane == 0 { "429" } else { "500" };
        vec![("X-User-Id", u.clone()), ("X-Entry-Token", t.clone()), ("X-Fail-With", fail.to_owned())]
    };
    let floods = vec![
        flood(&stop, &app, 1, Attack::Malformed, holder.clone()),
        flood(&stop, &app, 1, Attack::HangUp, holder.clone()),
        flood(&stop, &app, 3, Attack::Purchase, holder),
    ];
    batch_follows_the_purchase_api(&redis).await;
    finish(stop, tasks).await;
    let seen = futures_join(floods).await;
    assert!(
        seen[2].contains(&500) && seen[2].contains(&429),
        "the purchase API failed the token's purchases: {:?}",
        seen[2]
    );
    assert!(seen[2].contains(&403), "a token held by a purchase in flight is refused: {:?}", seen[2]);
}

/// Five tokens of five accounts, each used over and over for purchases the purchase API fails
/// (500) or backs off from (503, 429 with `Retry-After`), and for malformed bodies: at most
/// five buyers in error per interval beside the real buyers, under the error ratio.
#[tokio::test]
async fn with_five_tokens_a_flood_of_failing_purchases_leaves_the_batch_to_the_purchase_api() {
    let redis = RedisServer::spawn();
    let (app, stop, tasks) = sale(&redis).await;
    let app = Arc::new(app);
    let holders: Vec<(String, String)> =
        accounts(5, true).into_iter().map(|u| (token_for(&u, "LIMITED_DROP:42", now_s(), 300), u)).collect();
    let holder = move |lane: usize| {
        let (t, u) = holders[lane].clone();
        let fail = ["500", "503", "429"][lane % 3];
        vec![("X-User-Id", u), ("X-Entry-Token", t), ("X-Fail-With", fail.to_owned())]
    };
    let floods =
        vec![flood(&stop, &app, 5, Attack::Purchase, holder.clone()), flood(&stop, &app, 5, Attack::Malformed, holder)];
    batch_follows_the_purchase_api(&redis).await;
    finish(stop, tasks).await;
    let seen = futures_join(floods).await;
    assert!(seen[0].contains(&500), "the purchase API failed the tokens' purchases: {:?}", seen[0]);
}

async fn futures_join(floods: Vec<tokio::task::JoinHandle<Vec<u16>>>) -> Vec<Vec<u16>> {
    let mut seen = Vec::new();
    for f in floods {
        seen.push(f.await.unwrap());
    }
    seen
}

/// A buyer with a valid token who sends the body slowly (four chunks 300 ms apart) makes the
/// purchase look slow only by their own upload: the controller counts the purchase API's time
/// from the body's last bytes, so the buyer's observation is a fast one.
#[tokio::test]
async fn a_body_sent_slowly_counts_the_purchase_apis_time_not_the_clients() {
    use std::io::{Read, Write};
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.queue.outflow = vq::config::Outflow::Adaptive;
    s.gate.upstream = Some(purchase_api().await);
    let app = spawn_app(s, false).await;
    flag_on(&redis).await;
    let user = "slow-buyer";
    let t = token_for(user, "LIMITED_DROP:42", now_s(), 300);
    let head = framed(ORDER, &[("X-User-Id", user), ("X-Entry-Token", &t)], "Transfer-Encoding: chunked\r\n\r\n");
    let addr = app.addr.trim_start_matches("http://").to_owned();
    let answer = tokio::task::spawn_blocking(move || {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(&head).unwrap();
        for chunk in ["{\"sku\"", ": 1", ", \"n\"", ": 2}"] {
            std::thread::sleep(Duration::from_millis(300));
            c.write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes()).unwrap();
        }
        c.write_all(b"0\r\n\r\n").unwrap();
        let mut text = String::new();
        let _ = c.read_to_string(&mut text);
        text
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The observation, written off the response path: the buyer's latency bucket.
    let deadline = Instant::now() + Duration::from_secs(5);
    let seen = loop {
        let mut c = redis.conn().await;
        let keys: Vec<String> = c.keys("queue:{LIMITED_DROP:42}:outflow:buyers:*").await.unwrap();
        let mut found = None;
        for k in keys {
            let v: Option<String> = c.hget(&k, user).await.unwrap();
            found = found.or(v);
        }
        if let Some(v) = found {
            break v;
        }
        assert!(Instant::now() < deadline, "no observation of the buyer's purchase");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let bucket: usize = seen.split(':').next().unwrap().parse().unwrap();
    let upper = vq::domain::LATENCY_BUCKETS_MS[bucket];
    assert!(upper <= 250, "counted as the purchase API's {upper} ms, the 1.2 s upload included ({seen})");
    app.stop().await;
}
