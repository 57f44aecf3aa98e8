//! The sale lifecycle on a real Redis: every row of the statuses table and the lifecycle on
//! a Redis Cluster here; the fair opening (recomputed from the published seed, independently
//! of vq's code) and exactly once under lock loss in `opening.rs`; pause and resume across
//! ticks, close by command, by `closes_at` and by the purchase API's header, and the ledger's
//! sum in `close.rs`. The helpers below serve all three.

mod clear;
mod close;
mod opening;
mod report;
mod states;

use std::collections::{HashMap, HashSet};
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use redis::AsyncCommands;
use serde_json::Value;
use sha2::{Digest, Sha256};
use vq::domain::{QueueTarget, SaleControl, SaleSchedule, UserId};
use vq::pump::Pump;
use vq::store::prelude::*;
use vq::store::{AnyStore, ScheduleOutcome};

use crate::support::{
    RedisServer, TestApp, flag_on, next_tick, open_store, secret, spawn_app, test_settings, three_instances, vq_command,
};

const T: &str = "limited-drop/7";
const P: &str = "queue:{LIMITED_DROP:7}:";

/// Checks an answer's fields against the OpenAPI document's schema `name`.
fn documented(name: &str, answer: &Value) {
    let doc: Value = serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap();
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
    vq_command().args(args).env("VQ_REDIS__URL", redis.url()).output().expect("run vq")
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

/// On a real 3-primary Redis Cluster, for targets whose slots live on different nodes: the
/// pre-queue, the opening in the seed's order, pause, close and the ledger (every script
/// touches one slot, or the cluster refuses it with CROSSSLOT).
#[tokio::test]
async fn the_sale_lifecycle_works_on_a_redis_cluster() {
    use crate::support::{RedisCluster, cluster_settings};
    let cluster = RedisCluster::spawn();
    let s = Arc::new(cluster_settings(&cluster));
    let app = spawn_app((*s).clone(), false).await;
    crate::support::cluster_flag_on(&cluster).await;
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

/// A sale scheduled before anyone entered is listed by `vq sale show` and `vq stats` (it used
/// to appear only once someone entered); a schedule written again keeps the times not given,
/// says what it changes, and both writes are in the ledger.
#[tokio::test]
async fn a_scheduled_sale_is_listed_before_anyone_enters_and_a_reschedule_keeps_its_prequeue() {
    let redis = RedisServer::spawn();
    let at = |from_now_ms: u64| vq::domain::format_instant(now_ms() + from_now_ms);
    let (opens, prequeue) = (at(3_600_000), at(1_800_000));
    let first =
        cli(&redis, &["sale", "schedule", "limited-drop:7", "--opens-at", &opens, "--prequeue-from", &prequeue]);
    assert!(first.status.success(), "{}", stderr(&first));

    let show = cli(&redis, &["sale", "show", "--json"]);
    assert!(show.status.success(), "{}", stderr(&show));
    let all: Value = serde_json::from_slice(&show.stdout).expect("json");
    assert_eq!(all[0]["target"], "LIMITED_DROP:7", "{all}");
    assert_eq!(all[0]["state"], "scheduled", "{all}");
    let stats = cli(&redis, &["stats", "--json"]);
    assert!(stats.status.success(), "{}", stderr(&stats));
    let v: Value = serde_json::from_slice(&stats.stdout).expect("json");
    assert_eq!(v["targets"][0]["target"], "LIMITED_DROP:7", "{v}");
    assert_eq!(v["targets"][0]["stats"]["saleState"], "scheduled", "{v}");
    assert_eq!(v["targets"][0]["alerts"], serde_json::json!([]), "{v}");

    // Moved an hour later, nothing said about the pre-queue: it stays.
    let later = at(7_200_000);
    let again = cli(&redis, &["sale", "schedule", "limited-drop:7", "--opens-at", &later]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(stdout(&again).contains(&format!("opens at: {opens} -> {later}")), "{}", stdout(&again));
    assert!(stdout(&again).contains(&format!("pre-queue from: {prequeue} (kept)")), "{}", stdout(&again));
    let now = show_json(&redis);
    assert_eq!((now["opensAt"].as_str(), now["prequeueOpensAt"].as_str()), (Some(&*later), Some(&*prequeue)), "{now}");
    let ledger = cli(&redis, &["sale", "ledger", "limited-drop:7", "--json"]);
    let l: Value = serde_json::from_slice(&ledger.stdout).expect("ledger json");
    let rows: Vec<&Value> = l["entries"].as_array().unwrap().iter().filter(|e| e["kind"] == "schedule").collect();
    assert_eq!(rows.len(), 2, "{l}");
    assert_eq!(rows[1]["opensAtMs"].as_u64(), vq::domain::parse_instant(&later).ok(), "{l}");

    // A new schedule needs its opening.
    let none = cli(&redis, &["sale", "schedule", "limited-drop:8", "--closes-at", &later]);
    assert_eq!(none.status.code(), Some(1), "{}", stdout(&none));
    assert!(stderr(&none).contains("--opens-at is required"), "{}", stderr(&none));
}
