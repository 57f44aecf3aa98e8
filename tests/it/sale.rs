//! The sale lifecycle on a real Redis: every row of the statuses table, the fair opening
//! (recomputed here from the published seed, independently of vq's code), exactly once under
//! lock loss with three instances, pause and resume across ticks, close by command, by
//! `closes_at` and by the purchase API's header, and the ledger's sum.

use std::collections::{HashMap, HashSet};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use redis::AsyncCommands;
use serde_json::Value;
use sha2::{Digest, Sha256};
use vq::domain::{QueueTarget, SaleControl, SaleSchedule, UserId};
use vq::pump::Pump;
use vq::store::{AnyStore, QueueStore, ScheduleOutcome};

use crate::support::{
    RedisServer, TestApp, flag_on, next_tick, open_store, secret, spawn_app, test_settings, three_instances, vq_bin,
};

const T: &str = "limited-drop/7";
const P: &str = "queue:{LIMITED_DROP:7}:";

/// Checks an answer's fields against the OpenAPI document's schema `name`.
fn documented(name: &str, answer: &Value) {
    let doc: Value = serde_json::from_str(include_str!("../../docs/openapi.json")).unwrap();
    crate::openapi::conforms(&doc, name, answer);
}

fn target() -> QueueTarget {
    "LIMITED_DROP:7".parse().unwrap()
}

fn now_ms() -> u64 {
    vq::service::now_epoch_ms()
}

/// Schedules the sale with times relative to now (ms); returns the opening time.
async fn schedule(store: &AnyStore, opens_in: u64, prequeue_from: Option<i64>, closes_in: Option<u64>) -> u64 {
    let now = now_ms();
    let s = SaleSchedule {
        opens_at_ms: now + opens_in,
        prequeue_from_ms: prequeue_from.map(|d| (now as i64 + d) as u64),
        closes_at_ms: closes_in.map(|d| now + d),
    };
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).unwrap();
    match store.schedule_sale(target(), s, seed).await.unwrap() {
        ScheduleOutcome::Scheduled { .. } => s.opens_at_ms,
        other => panic!("not scheduled: {other:?}"),
    }
}

/// Waits until the wall clock (which Redis on this host shares) reaches `at_ms`.
async fn until(at_ms: u64) {
    let now = now_ms();
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now + 5)).await;
    }
}

fn cli(redis: &RedisServer, args: &[&str]) -> Output {
    Command::new(vq_bin()).args(args).env("VQ_REDIS__URL", redis.url()).output().expect("run vq")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn show_json(redis: &RedisServer) -> Value {
    let out = cli(redis, &["sale", "show", "limited-drop:7", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("json")
}

/// The opening order computed here, from the seed and the users only: HMAC-SHA256(key = seed,
/// message = decimal user id), ascending as unsigned big-endian bytes.
fn expected_order(seed: &[u8], users: &[u64]) -> Vec<u64> {
    let mut keyed: Vec<(Vec<u8>, u64)> = users
        .iter()
        .map(|u| {
            let mut mac = Hmac::<Sha256>::new_from_slice(seed).unwrap();
            mac.update(u.to_string().as_bytes());
            (mac.finalize().into_bytes().to_vec(), *u)
        })
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, u)| u).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn lower_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Seq of every user in `waiting` (admitted users stay there until they poll).
async fn seqs(redis: &RedisServer) -> HashMap<u64, u64> {
    let mut c = redis.conn().await;
    let all: Vec<(u64, u64)> = c.zrange_withscores(format!("{P}waiting"), 0, -1).await.unwrap();
    all.into_iter().collect()
}

async fn app_on(redis: &RedisServer) -> (TestApp, Arc<vq::config::Settings>) {
    let s = Arc::new(test_settings(Some(redis)));
    let app = spawn_app((*s).clone(), false).await;
    flag_on(redis).await;
    (app, s)
}

/// Polls until `done` holds for the answer (a change reaches the instance's copy of the
/// target within a sync, a quarter tick), at most two ticks.
async fn poll_until(app: &TestApp, user: u64, done: impl Fn(&Value) -> bool) -> Value {
    poll_path_until(app, T, user, done).await
}

async fn poll_path_until(app: &TestApp, path: &str, user: u64, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let b = app.json(app.poll(path, user).await).await;
        if done(&b) {
            return b;
        }
        assert!(Instant::now() < deadline, "poll of {user} never got there: {b}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn body(app: &TestApp, resp: reqwest::Response) -> (u16, Option<String>, Value) {
    let status = resp.status().as_u16();
    let retry = resp.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    (status, retry, app.json(resp).await)
}

#[tokio::test]
async fn every_row_of_the_statuses_table_before_and_at_the_opening() {
    let redis = RedisServer::spawn();
    let (app, s) = app_on(&redis).await;
    let store = open_store(&s);
    let opens_at = schedule(&store, 2500, Some(1200), None).await;

    // Before the pre-queue: SCHEDULED with both times, nothing recorded, poll 404.
    let (code, _, b) = body(&app, app.enter(T, 1).await).await;
    assert_eq!((code, b["status"].as_str()), (200, Some("SCHEDULED")), "{b}");
    assert_eq!(b["opensAt"].as_str(), Some(vq::domain::format_instant(opens_at).as_str()));
    assert!(b["prequeueOpensAt"].is_string(), "{b}");
    documented("Status", &b);
    assert_eq!(app.poll(T, 1).await.status(), 404);
    let mut c = redis.conn().await;
    let recorded: bool = c.exists(format!("{P}prequeue")).await.unwrap();
    assert!(!recorded, "a SCHEDULED user is not recorded");

    // The pre-queue: PRE_QUEUE with opensAt and a poll interval, recorded once.
    until(opens_at - 1300 + 50).await;
    for _ in 0..3 {
        let (code, retry, b) = body(&app, app.enter(T, 1).await).await;
        assert_eq!((code, b["status"].as_str()), (200, Some("PRE_QUEUE")), "{b}");
        assert!(b["opensAt"].is_string() && b["pollAfterSeconds"].as_u64().is_some(), "{b}");
        assert_eq!(retry, b["pollAfterSeconds"].as_u64().map(|s| s.to_string()));
        assert!(b["position"].is_null());
        documented("Status", &b);
    }
    app.enter(T, 2).await;
    let prequeued: u64 = c.zcard(format!("{P}prequeue")).await.unwrap();
    assert_eq!(prequeued, 2, "recorded once each (idempotent)");
    let (code, retry, b) = body(&app, app.poll(T, 1).await).await;
    assert_eq!((code, b["status"].as_str()), (200, Some("PRE_QUEUE")), "{b}");
    assert!(retry.is_some());
    assert_eq!(app.poll(T, 99).await.status(), 404, "a user who never entered is unknown");
    let stats = app.json(app.client.get(app.url(&format!("/virtual-queues/{T}/stats"))).send().await.unwrap()).await;
    assert_eq!(stats["saleState"], "pre-queue");
    assert_eq!(stats["prequeuedCount"], 2);
    assert!(stats["opensAt"].is_string());
    documented("Stats", &stats);

    // The opening: pre-queued users get positions 1..2, a later user 3, in one pump tick.
    until(opens_at).await;
    let (_, _, b) = body(&app, app.enter(T, 3).await).await;
    assert_eq!(b["status"], "WAITING", "{b}");
    assert_eq!(b["position"], 3, "after the pre-queued users: {b}");
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    let _ = pump.tick().await.unwrap();
    let placed = seqs(&redis).await;
    let mut firsts: Vec<u64> = [1, 2].iter().map(|u| placed[u]).collect();
    firsts.sort();
    assert_eq!(firsts, [1, 2]);
    assert_eq!(placed[&3], 3);
    let stats = app.json(app.client.get(app.url(&format!("/virtual-queues/{T}/stats"))).send().await.unwrap()).await;
    assert_eq!(stats["saleState"], "open");
    assert_eq!(stats["admittedCount"], 3, "the opening tick admits");
}

#[tokio::test]
async fn without_a_prequeue_entries_before_the_opening_are_scheduled() {
    let redis = RedisServer::spawn();
    let (app, s) = app_on(&redis).await;
    let store = open_store(&s);
    let opens_at = schedule(&store, 800, None, None).await;
    let b = app.json(app.enter(T, 1).await).await;
    assert_eq!(b["status"], "SCHEDULED");
    assert_eq!(b["prequeueOpensAt"], b["opensAt"]);
    until(opens_at).await;
    let b = app.json(app.enter(T, 1).await).await;
    assert_eq!((b["status"].as_str(), b["position"].as_u64()), (Some("WAITING"), Some(1)), "{b}");
}

#[tokio::test]
async fn the_opening_order_is_the_hmac_of_the_published_seed_and_later_users_come_after() {
    let redis = RedisServer::spawn();
    let (app, s) = app_on(&redis).await;
    let store = open_store(&s);
    let opens_at = schedule(&store, 1500, Some(-1000), None).await;
    let users: Vec<u64> = (1..=40).map(|u| u * 7919).collect();
    for u in &users {
        assert_eq!(app.json(app.enter(T, *u).await).await["status"], "PRE_QUEUE");
    }
    let before = show_json(&redis);
    assert_eq!(before["state"], "pre-queue");
    let commitment = before["seedCommitment"].as_str().expect("commitment published").to_owned();
    assert!(before.get("seed").is_none() && before.get("prequeued").is_none(), "seed hidden: {before}");

    until(opens_at).await;
    let late = app.json(app.enter(T, 5).await).await;
    assert_eq!(late["position"], 41, "{late}");
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    next_tick(s.queue.tick_ms).await;
    let _ = pump.tick().await.unwrap();

    let after = show_json(&redis);
    let seed = unhex(after["seed"].as_str().expect("seed revealed"));
    assert_eq!(lower_hex(&Sha256::digest(&seed)), commitment, "the seed matches the commitment");
    assert_eq!(after["prequeued"], 40);
    assert_eq!(after["seedCommitment"].as_str(), Some(commitment.as_str()));
    let placed = seqs(&redis).await;
    for (i, u) in expected_order(&seed, &users).iter().enumerate() {
        assert_eq!(placed[u], i as u64 + 1, "user {u}");
    }
    assert_eq!(placed[&5], 41);
    // The positions users see are those seqs (beyond the first batch, admitted).
    let last = expected_order(&seed, &users)[39];
    let b = app.json(app.poll(T, last).await).await;
    assert_eq!((b["status"].as_str(), b["position"].as_u64()), (Some("WAITING"), Some(40)), "{b}");
}

#[tokio::test]
async fn the_opening_happens_exactly_once_with_three_instances_losing_the_lock() {
    let redis = RedisServer::spawn();
    let store = open_store(&test_settings(Some(&redis)));
    let envs = [
        ("VQ_QUEUE__TICK_MS", "200".to_owned()),
        ("VQ_QUEUE__BATCH_SIZE", "5".to_owned()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
    ];
    let procs = three_instances(&redis, &envs).await;
    flag_on(&redis).await;
    let opens_at = schedule(&store, 8000, Some(-1000), None).await;
    let n: u64 = 2000;
    let users: Vec<u64> = (1..=n).collect();
    // Pre-queue them through all three instances, 8 at a time.
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..8u64 {
        let addrs: Vec<String> = procs.iter().map(|p| p.addr.clone()).collect();
        let client = client.clone();
        tasks.spawn(async move {
            for u in (1..=n).filter(|u| u % 8 == lane) {
                let addr = &addrs[(u % 3) as usize];
                let r = client
                    .post(format!("{addr}/virtual-queues/{T}/entries"))
                    .header("X-User-Id", u.to_string())
                    .send()
                    .await
                    .unwrap();
                let b: Value = r.json().await.unwrap();
                assert_eq!(b["status"], "PRE_QUEUE", "user {u}: {b}");
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    assert!(now_ms() < opens_at, "pre-queueing took too long for this test's schedule");
    // Every instance may take the lock in every tick.
    let lock_thief = {
        let mut c = redis.conn().await;
        tokio::spawn(async move {
            loop {
                let _: Result<u64, _> = c.del("queue:admission:{LIMITED_DROP:7}").await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let mut c = redis.conn().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let opened: bool = c.hexists(format!("{P}sale"), "opened_at").await.unwrap();
        if opened {
            break;
        }
        assert!(Instant::now() < deadline, "the sale did not open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A few more ticks with the lock stolen: nothing is placed again.
    tokio::time::sleep(Duration::from_millis(600)).await;
    lock_thief.abort();
    drop(procs);

    let seed = unhex(show_json(&redis)["seed"].as_str().unwrap());
    let placed = seqs(&redis).await;
    assert_eq!(placed.len() as u64, n, "every pre-queued user placed, once");
    let distinct: HashSet<u64> = placed.values().copied().collect();
    assert_eq!(distinct.len() as u64, n, "no seq given twice");
    assert!(placed.values().all(|s| (1..=n).contains(s)), "positions 1..N");
    for (i, u) in expected_order(&seed, &users).iter().enumerate() {
        assert_eq!(placed[u], i as u64 + 1, "user {u}");
    }
    let seq: u64 = c.get(format!("{P}seq")).await.unwrap();
    assert_eq!(seq, n, "the counter moved past N once");
    let ledger = store.sale_ledger(target()).await.unwrap();
    let openings = ledger.iter().filter(|e| matches!(e, vq::domain::LedgerEntry::Opening { .. })).count();
    assert_eq!(openings, 1, "one opening in the ledger");
    let departed: u64 = c.zcard(format!("{P}departed")).await.unwrap();
    assert_eq!(departed, 0);
}

#[tokio::test]
async fn the_opening_happens_exactly_once_with_pumps_racing_in_every_tick() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.queue.tick_ms = 200;
    let s = Arc::new(s);
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    let store = open_store(&s);
    let opens_at = schedule(&store, 6000, Some(-1000), None).await;
    let n: u64 = 2000;
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..8u64 {
        let (client, url) = (app.client.clone(), app.url(&format!("/virtual-queues/{T}/entries")));
        tasks.spawn(async move {
            for u in (1..=n).filter(|u| u % 8 == lane) {
                let r = client.post(&url).header("X-User-Id", u.to_string()).send().await.unwrap();
                assert_eq!(r.json::<Value>().await.unwrap()["status"], "PRE_QUEUE");
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    assert!(now_ms() < opens_at, "pre-queueing took too long for this test's schedule");
    until(opens_at).await;
    // Three pumps tick back to back (not aligned to ticks), the lock is deleted every 20 ms,
    // and new users enter meanwhile, for a second and a half.
    let stop = now_ms() + 1500;
    let mut racers = tokio::task::JoinSet::new();
    for name in ["a", "b", "c"] {
        let pump = Pump::new(open_store(&s), s.clone(), name.into());
        racers.spawn(async move {
            while now_ms() < stop {
                let _ = pump.tick().await;
            }
        });
    }
    let mut c = redis.conn().await;
    racers.spawn(async move {
        while now_ms() < stop {
            let _: Result<u64, _> = c.del("queue:admission:{LIMITED_DROP:7}").await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let (client, url) = (app.client.clone(), app.url(&format!("/virtual-queues/{T}/entries")));
    racers.spawn(async move {
        for u in n + 1..=n + 50 {
            client.post(&url).header("X-User-Id", u.to_string()).send().await.unwrap();
        }
    });
    while let Some(r) = racers.join_next().await {
        r.unwrap();
    }
    let seed = unhex(show_json(&redis)["seed"].as_str().expect("opened"));
    let placed = seqs(&redis).await;
    let users: Vec<u64> = (1..=n).collect();
    for (i, u) in expected_order(&seed, &users).iter().enumerate() {
        assert_eq!(placed.get(u), Some(&(i as u64 + 1)), "pre-queued user {u}");
    }
    let mut late: Vec<u64> = (n + 1..=n + 50).map(|u| placed[&u]).collect();
    late.sort();
    assert_eq!(late, (n + 1..=n + 50).collect::<Vec<_>>(), "later users after the pre-queued, without gaps");
    let distinct: HashSet<u64> = placed.values().copied().collect();
    assert_eq!(distinct.len(), placed.len(), "no seq given twice");
    let ledger = store.sale_ledger(target()).await.unwrap();
    let openings = ledger.iter().filter(|e| matches!(e, vq::domain::LedgerEntry::Opening { .. })).count();
    assert_eq!(openings, 1, "one opening in the ledger");
}

#[tokio::test]
async fn pause_holds_admission_across_ticks_and_resume_releases_it() {
    let redis = RedisServer::spawn();
    let (app, s) = app_on(&redis).await;
    for u in 1..=25 {
        app.enter(T, u).await;
    }
    let store = open_store(&s);
    assert!(store.control_sale(target(), SaleControl::Pause).await.unwrap());
    let b = poll_until(&app, 25, |b| b["paused"] == true).await;
    assert_eq!(b["status"], "WAITING");
    documented("Status", &b);
    assert_eq!(app.json(app.enter(T, 26).await).await["paused"], true);
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    for _ in 0..3 {
        next_tick(s.queue.tick_ms).await;
        let t = pump.tick().await.unwrap();
        let a = t[0].as_ref().unwrap().admit.unwrap();
        assert_eq!((a.advanced, a.admitted, a.mark), (false, 0, 0), "paused: nobody admitted");
    }
    assert!(!store.control_sale(target(), SaleControl::Pause).await.unwrap(), "pausing twice changes nothing");
    assert!(store.control_sale(target(), SaleControl::Resume).await.unwrap());
    poll_until(&app, 25, |b| b.get("paused").is_none()).await;
    next_tick(s.queue.tick_ms).await;
    let t = pump.tick().await.unwrap();
    assert_eq!(t[0].as_ref().unwrap().admit.unwrap().admitted, 10);
    let kinds: Vec<String> = store
        .sale_ledger(target())
        .await
        .unwrap()
        .iter()
        .map(|e| serde_json::to_value(e).unwrap()["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, ["admission", "resume", "pause"], "newest first");
}

#[tokio::test]
async fn a_closed_sale_answers_closed_and_admitted_users_keep_their_tokens() {
    let redis = RedisServer::spawn();
    let (app, s) = app_on(&redis).await;
    for u in 1..=15 {
        app.enter(T, u).await;
    }
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    next_tick(s.queue.tick_ms).await;
    let _ = pump.tick().await.unwrap();
    let admitted = app.json(app.poll(T, 1).await).await;
    assert_eq!(admitted["status"], "ADMITTED");
    let out = cli(&redis, &["sale", "close", "limited-drop:7", "--message", "Sold out"]);
    assert!(out.status.success(), "{}", stderr(&out));
    poll_until(&app, 15, |b| b["status"] == "CLOSED").await;
    for resp in [app.enter(T, 99).await, app.poll(T, 15).await, app.enter(T, 15).await] {
        let (code, retry, b) = body(&app, resp).await;
        assert_eq!((code, b["status"].as_str(), b["message"].as_str()), (200, Some("CLOSED"), Some("Sold out")), "{b}");
        assert!(retry.is_none() && b.get("pollAfterSeconds").is_none(), "closed: stop polling");
        documented("Status", &b);
    }
    // Admitted before the close: user 1 keeps the token, user 2 (not polled yet) gets one.
    let again = app.json(app.poll(T, 1).await).await;
    assert_eq!(again["entryToken"], admitted["entryToken"]);
    let late = app.json(app.poll(T, 2).await).await;
    assert_eq!(late["status"], "ADMITTED", "{late}");
    let token = late["entryToken"].as_str().unwrap();
    vq::token::verify(&secret(), token, target(), UserId(2), now_ms() / 1000).expect("the token still verifies");
    next_tick(s.queue.tick_ms).await;
    let t = pump.tick().await.unwrap();
    assert_eq!(t[0].as_ref().unwrap().admit.unwrap().admitted, 0, "nobody admitted after the close");
    let shown = show_json(&redis);
    assert_eq!((shown["state"].as_str(), shown["closeSource"].as_str()), (Some("closed"), Some("command")));
}

#[tokio::test]
async fn closes_at_closes_the_sale_and_the_ledger_says_by_schedule() {
    let redis = RedisServer::spawn();
    let (app, s) = app_on(&redis).await;
    let store = open_store(&s);
    let opens_at = schedule(&store, 300, None, Some(1300)).await;
    until(opens_at).await;
    assert_eq!(app.json(app.enter(T, 1).await).await["status"], "WAITING");
    until(opens_at + 1000).await;
    let b = app.json(app.poll(T, 1).await).await;
    assert_eq!(b["status"], "CLOSED", "{b}");
    assert_eq!(app.json(app.enter(T, 2).await).await["status"], "CLOSED");
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    let _ = pump.tick().await.unwrap();
    let ledger = store.sale_ledger(target()).await.unwrap();
    assert!(matches!(&ledger[0], vq::domain::LedgerEntry::Close { source, .. } if source == "schedule"), "{ledger:?}");
}

#[tokio::test]
async fn the_purchase_api_closes_the_sale_with_its_header_which_the_buyer_never_sees() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.gate.upstream = Some(spawn_closing_upstream("Sold out, sorry").await);
    s.gate.pace = false;
    let s = Arc::new(s);
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    for u in 1..=12 {
        app.enter(T, u).await;
    }
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    next_tick(s.queue.tick_ms).await;
    let _ = pump.tick().await.unwrap();
    let token = app.json(app.poll(T, 1).await).await["entryToken"].as_str().unwrap().to_owned();
    let resp = app
        .client
        .post(app.url("/limited-drops/7/orders"))
        .header("X-User-Id", "1")
        .header("X-Entry-Token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    assert!(resp.headers().get("x-queue-close").is_none(), "stripped from the buyer's response");
    let b = poll_until(&app, 12, |b| b["status"] == "CLOSED").await;
    assert_eq!((b["status"].as_str(), b["message"].as_str()), (Some("CLOSED"), Some("Sold out, sorry")), "{b}");
    let ledger = open_store(&s).sale_ledger(target()).await.unwrap();
    assert!(
        matches!(&ledger[0], vq::domain::LedgerEntry::Close { source, message, .. }
            if source == "purchase-api" && message == "Sold out, sorry"),
        "{ledger:?}"
    );
}

/// A purchase API that sells the last item: 201 with `X-Queue-Close: <message>`.
async fn spawn_closing_upstream(message: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(move || async move {
        (axum::http::StatusCode::CREATED, [("X-Queue-Close", message)], "{\"order\":1}")
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test]
async fn the_ledger_records_every_step_and_its_admissions_sum_to_admitted_count() {
    let redis = RedisServer::spawn();
    let (app, s) = app_on(&redis).await;
    for u in 1..=34 {
        app.enter(T, u).await;
    }
    let a = Pump::new(open_store(&s), s.clone(), "pump-a".into());
    let b = Pump::new(open_store(&s), s.clone(), "pump-b".into());
    for i in 0..5 {
        next_tick(s.queue.tick_ms).await;
        let _ = if i % 2 == 0 { a.tick().await } else { b.tick().await }.unwrap();
    }
    let out = cli(&redis, &["sale", "ledger", "limited-drop:7", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let stats = app.json(app.client.get(app.url(&format!("/virtual-queues/{T}/stats"))).send().await.unwrap()).await;
    assert_eq!(stats["admittedCount"], 34);
    assert_eq!(report["admitted"], 34, "{report}");
    assert_eq!(report["admittedCount"], 34);
    let rows = report["entries"].as_array().unwrap();
    let sum: u64 = rows.iter().filter(|r| r["kind"] == "admission").map(|r| r["admitted"].as_u64().unwrap()).sum();
    assert_eq!(sum, 34);
    assert_eq!(rows.len(), 4, "10 + 10 + 10 + 4, idle ticks are not rows: {rows:?}");
    assert_eq!((rows[0]["markBefore"].as_u64(), rows[0]["markAfter"].as_u64()), (Some(0), Some(10)));
    assert_eq!(rows[0]["instance"], "pump-a");
    assert_eq!(rows[1]["instance"], "pump-b");
    assert!(rows.windows(2).all(|w| w[0]["markAfter"] == w[1]["markBefore"]), "contiguous marks");
    let text = stdout(&cli(&redis, &["sale", "ledger", "limited-drop:7"]));
    assert!(text.contains("admitted in the ledger: 34; stats admittedCount: 34"), "{text}");
}

#[tokio::test]
async fn pre_queued_users_who_stop_polling_are_evicted_before_and_after_the_opening() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.queue.heartbeat_timeout_s = 1;
    s.queue.key_ttl_s = 60;
    s.queue.batch_size = 1;
    let s = Arc::new(s);
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    let store = open_store(&s);
    let opens_at = schedule(&store, 2500, Some(-1000), None).await;
    for u in 1..=6 {
        app.enter(T, u).await;
    }
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    // Users 1..=4 keep polling; 5 and 6 stop and are evicted from the pre-queue.
    let mut c = redis.conn().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        for u in 1..=4 {
            app.poll(T, u).await;
        }
        let _ = pump.tick().await;
        let left: u64 = c.zcard(format!("{P}prequeue")).await.unwrap();
        if left == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "the silent users were not evicted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(app.poll(T, 5).await.status(), 404, "an evicted pre-queued user is unknown");
    // At the opening users 1..=4 are frozen; 3 and 4 stop polling and are evicted before the
    // pump writes the order: their seqs become departed, so aheadCount stays exact.
    until(opens_at).await;
    let late = app.json(app.enter(T, 50).await).await;
    assert_eq!(late["position"], 5, "after the 4 pre-queued: {late}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        for u in [1, 2, 50] {
            app.poll(T, u).await;
        }
        store.evict(target(), 1000, 1000).await.unwrap();
        let alive: Vec<Option<f64>> =
            redis::cmd("ZMSCORE").arg(format!("{P}heartbeat")).arg(3).arg(4).query_async(&mut c).await.unwrap();
        if alive.iter().all(Option::is_none) {
            break;
        }
        assert!(Instant::now() < deadline, "users 3 and 4 were not evicted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seq_before: u64 = c.get(format!("{P}seq")).await.unwrap();
    assert_eq!(seq_before, 5);
    let _ = pump.tick().await.unwrap();
    let placed = seqs(&redis).await;
    assert!(placed.contains_key(&1) && placed.contains_key(&2), "{placed:?}");
    assert!(!placed.contains_key(&3) && !placed.contains_key(&4), "{placed:?}");
    // The evicted users' seqs are departed (those the mark passed are dropped with it).
    let mark: u64 = c.get(format!("{P}admitted_count")).await.unwrap();
    let departed: Vec<u64> = c.zrange(format!("{P}departed"), 0, -1).await.unwrap();
    let live: HashSet<u64> = placed.values().copied().collect();
    let unplaced: Vec<u64> = (1..=4).filter(|s| !live.contains(s) && *s > mark).collect();
    assert_eq!(departed, unplaced, "mark {mark}, placed {placed:?}");
    // One user admitted (batch 1): the other live pre-queued user is the only one ahead of 50.
    let b = app.json(app.poll(T, 50).await).await;
    assert_eq!((b["status"].as_str(), b["aheadCount"].as_u64()), (Some("WAITING"), Some(1)), "{b}");
}

#[test]
fn the_cli_refuses_bad_schedules_with_a_clear_message() {
    let redis = RedisServer::spawn();
    let future = vq::domain::format_instant(now_ms() + 3_600_000);
    let later = vq::domain::format_instant(now_ms() + 7_200_000);
    let cases: [(&[&str], &str); 5] = [
        (&["sale", "schedule", "limited-drop:7", "--opens-at", "tomorrow"], "not an ISO-8601 time"),
        (&["sale", "schedule", "limited-drop:7", "--opens-at", "2020-01-01T00:00:00Z"], "in the past"),
        (
            &["sale", "schedule", "limited-drop:7", "--opens-at", &future, "--prequeue-from", &later],
            "not before opens-at",
        ),
        (&["sale", "schedule", "limited-drop:7", "--opens-at", &later, "--closes-at", &future], "not after opens-at"),
        (&["sale", "schedule", "nonsense:7", "--opens-at", &future], "unknown target type"),
    ];
    for (args, expected) in cases {
        let out = cli(&redis, args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr(&out).contains(expected), "{args:?}: {}", stderr(&out));
    }
    let out = cli(&redis, &["sale", "show", "limited-drop:7"]);
    assert!(!out.status.success() && stderr(&out).contains("has no sale"), "{}", stderr(&out));
    let out = cli(&redis, &["sale", "schedule", "limited-drop:7", "--opens-at", &future]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("seed commitment"), "{}", stdout(&out));
}

#[tokio::test]
async fn scheduling_again_before_the_opening_keeps_the_seed_and_after_it_is_refused() {
    let redis = RedisServer::spawn();
    let store = open_store(&test_settings(Some(&redis)));
    schedule(&store, 400, None, None).await;
    let first = show_json(&redis)["seedCommitment"].clone();
    let opens_at = schedule(&store, 300, None, None).await;
    assert_eq!(show_json(&redis)["seedCommitment"], first, "the published commitment stays valid");
    until(opens_at).await;
    // The first enter at or after the opening freezes the (empty) pre-queue.
    let s = Arc::new(test_settings(Some(&redis)));
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    app.enter(T, 1).await;
    let s2 = SaleSchedule { opens_at_ms: now_ms() + 10_000, prequeue_from_ms: None, closes_at_ms: None };
    assert!(matches!(store.schedule_sale(target(), s2, [1; 32]).await.unwrap(), ScheduleOutcome::AlreadyOpened { .. }));
    assert!(store.control_sale(target(), SaleControl::Clear).await.unwrap());
    let b = app.json(app.enter(T, 2).await).await;
    assert_eq!(b["status"], "WAITING", "cleared: always open");
}

/// On a real 3-primary Redis Cluster, for targets whose slots live on different nodes: the
/// pre-queue, the opening in the seed's order, pause, close and the ledger (every script
/// touches one slot, or the cluster refuses it with CROSSSLOT).
#[tokio::test]
async fn the_sale_lifecycle_works_on_a_redis_cluster() {
    use crate::support::{RedisCluster, cluster_settings};
    let cluster = RedisCluster::spawn();
    let s = Arc::new(cluster_settings(&cluster));
    let app = spawn_app((*s).clone(), false).await;
    let mut c = cluster.conn().await;
    let _: () = c.hset_multiple("virtual-queue:flag", &[("enabled", "1"), ("percent", "100")]).await.unwrap();
    let _: i64 = c.hincr("virtual-queue:flag", "version", 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let mut targets: Vec<(QueueTarget, String)> = Vec::new();
    let mut nodes = HashSet::new();
    for id in 1..=100u64 {
        let t: QueueTarget = format!("LIMITED_DROP:{id}").parse().unwrap();
        if nodes.insert(cluster.node_of(&format!("queue:{{{t}}}:sale")).await) {
            targets.push((t, format!("limited-drop/{id}")));
        }
        if targets.len() == 2 {
            break;
        }
    }
    let store = open_store(&s);
    let opens_at = now_ms() + 1500;
    for (t, _) in &targets {
        let sch = SaleSchedule { opens_at_ms: opens_at, prequeue_from_ms: Some(now_ms() - 1000), closes_at_ms: None };
        assert!(matches!(store.schedule_sale(*t, sch, [9; 32]).await.unwrap(), ScheduleOutcome::Scheduled { .. }));
    }
    for (_, path) in &targets {
        for u in 1..=20 {
            assert_eq!(app.json(app.enter(path, u).await).await["status"], "PRE_QUEUE");
        }
        assert_eq!(app.json(app.poll(path, 3).await).await["status"], "PRE_QUEUE");
    }
    until(opens_at).await;
    let pump = Pump::new(open_store(&s), s.clone(), "p".into());
    next_tick(s.queue.tick_ms).await;
    let ticks = pump.tick().await.unwrap();
    assert!(ticks.iter().all(|r| r.as_ref().is_ok_and(|t| t.admit.is_some_and(|a| a.admitted == 10))), "{ticks:?}");
    let users: Vec<u64> = (1..=20).collect();
    let order = expected_order(&[9; 32], &users);
    for (t, path) in &targets {
        let view = store.read_sale(*t).await.unwrap().unwrap();
        assert_eq!(view.record.prequeued, Some(20));
        let last = app.json(app.poll(path, order[19]).await).await;
        assert_eq!((last["status"].as_str(), last["position"].as_u64()), (Some("WAITING"), Some(20)), "{t}: {last}");
        assert_eq!(app.json(app.enter(path, 21).await).await["position"], 21);
        assert!(store.control_sale(*t, SaleControl::Pause).await.unwrap());
    }
    next_tick(s.queue.tick_ms).await;
    let ticks = pump.tick().await.unwrap();
    assert!(ticks.iter().all(|r| r.as_ref().is_ok_and(|t| t.admit.is_some_and(|a| a.admitted == 0))), "paused");
    for (t, path) in &targets {
        let close = SaleControl::Close { message: "Sold out".into(), source: vq::domain::SaleSource::Command };
        assert!(store.control_sale(*t, close).await.unwrap());
        let b = poll_path_until(&app, path, order[19], |b| b["status"] == "CLOSED").await;
        assert_eq!((b["status"].as_str(), b["message"].as_str()), (Some("CLOSED"), Some("Sold out")));
        let ledger = store.sale_ledger(*t).await.unwrap();
        let snap = store.snapshot(*t).await.unwrap();
        assert_eq!(vq::domain::ledger_admitted(&ledger), snap.admitted_total);
        assert_eq!(snap.admitted_total, 10);
    }
}
