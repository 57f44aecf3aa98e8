//! Operator visibility: cluster-wide stats, `vq stats --json`, `/metrics`, alert rules.

use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use vq::config::Settings;
use vq::pump::Pump;
use vq::store::prelude::*;

use crate::support::{
    RedisServer, TestApp, VqProcess, flag_on, flag_on_before_start, next_tick, open_store, spawn_app, test_settings,
    vq_command,
};

const T: &str = "limited-drop/5";

/// Settings with batches of 2, so 2 users are admitted per tick.
fn settings(redis: &RedisServer) -> Settings {
    let mut s = test_settings(Some(redis));
    s.queue.batch_size = 2;
    s
}

/// Enters `users` users at once, then admits a batch at each of the next ticks (the first
/// in the tick they entered). Returns each admitted user's true wait in seconds, measured here.
async fn admit_over_ticks(app: &TestApp, s: &Arc<Settings>, users: u64) -> Vec<f64> {
    let pump = Pump::new(open_store(s), s.clone(), "test-pump".into());
    next_tick(s.queue.tick_ms).await;
    let entered = Instant::now();
    for u in 1..=users {
        assert_eq!(app.enter(T, u).await.status(), 200);
    }
    let mut waits = Vec::new();
    while (waits.len() as u64) < users {
        let before = entered.elapsed().as_secs_f64();
        let ticks = pump.tick().await.expect("pump tick");
        let after = entered.elapsed().as_secs_f64();
        // A tick whose lock is still held (a late previous tick on a loaded machine) admits
        // nobody: try the next one instead of counting on the clock.
        let Some(admit) = ticks[0].as_ref().expect("target tick").admit else {
            next_tick(s.queue.tick_ms).await;
            continue;
        };
        for _ in 0..admit.admitted {
            waits.push((before + after) / 2.0);
        }
        next_tick(s.queue.tick_ms).await;
    }
    waits
}

async fn stats_of(app: &TestApp) -> serde_json::Value {
    let resp = app.client.get(app.url(&format!("/virtual-queues/{T}/stats"))).send().await.expect("stats");
    assert_eq!(resp.status(), 200);
    app.json(resp).await
}

fn f(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} is not a number in {v}"))
}

#[tokio::test]
async fn users_admitted_after_known_waits_give_avg_and_p95_within_one_bucket() {
    let redis = RedisServer::spawn();
    let s = Arc::new(settings(&redis));
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    // 10 users, 2 per 0.5 s tick: waits of about 0, 0.5, 1, 1.5 and 2 s.
    let mut truth = admit_over_ticks(&app, &s, 10).await;
    truth.sort_by(f64::total_cmp);
    let avg_true = truth.iter().sum::<f64>() / truth.len() as f64;
    let p95_true = truth[(0.95 * truth.len() as f64).ceil() as usize - 1];

    let v = stats_of(&app).await;
    assert_eq!(v["admittedCount"], 10);
    assert_eq!(v["waitingCount"], 0);
    // Buckets are 1 s wide below 2 min; the average is kept exactly (sum of ms).
    let (avg, p95) = (f(&v, "avgWaitSeconds"), f(&v, "p95WaitSeconds"));
    assert!((avg - avg_true).abs() <= 0.1, "avg {avg} vs true {avg_true}");
    assert!((p95 - p95_true).abs() <= 1.0, "p95 {p95} vs true {p95_true} (one bucket = 1 s)");
    assert!(f(&v, "admissionRatePerSec") > 0.0);
}

#[tokio::test]
async fn two_instances_answer_identical_stats() {
    let redis = RedisServer::spawn();
    let s = Arc::new(settings(&redis));
    let a = spawn_app((*s).clone(), false).await;
    let b = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    admit_over_ticks(&a, &s, 4).await;
    // More users wait; one admitted user collects a token through the other instance.
    for u in 100..105 {
        a.enter(T, u).await;
    }
    assert_eq!(b.json(b.poll(T, 1).await).await["status"], "ADMITTED");
    let (va, vb) = (stats_of(&a).await, stats_of(&b).await);
    assert_eq!(va, vb, "any instance answers the same");
    assert_eq!(va["waitingCount"], 5);
    assert_eq!(va["admittedCount"], 4);
    assert_eq!(va["tokensIssued"], 1);
    assert_eq!(va["tokensUsed"], 0);
    assert_eq!(va["evictedCount"], 0);
    assert_eq!(va["batchSize"], 2);
    assert_eq!(va["targetRatePerSec"], 4.0);
}

#[tokio::test]
async fn vq_stats_json_equals_the_endpoint() {
    let redis = RedisServer::spawn();
    let s = Arc::new(settings(&redis));
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    admit_over_ticks(&app, &s, 4).await;
    for u in 100..103 {
        app.enter(T, u).await;
    }
    let endpoint = stats_of(&app).await;
    let out = vq_command()
        .args(["stats", "--json"])
        .env("VQ_REDIS__URL", redis.url())
        .env("VQ_QUEUE__TICK_MS", s.queue.tick_ms.to_string())
        .env("VQ_QUEUE__BATCH_SIZE", s.queue.batch_size.to_string())
        .output()
        .expect("run vq stats");
    assert!(out.status.success(), "vq stats failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("vq stats --json prints JSON");
    assert_eq!(v["redis"]["ok"], true);
    assert_eq!(v["flag"], "on 100%");
    let rows = v["targets"].as_array().expect("targets");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["target"], "LIMITED_DROP:5");
    assert_eq!(rows[0]["stats"], endpoint, "vq stats --json and GET …/stats show the same figures");

    // The table without a terminal: readable, no escape codes, the target's row.
    let out = vq_command()
        .args(["stats", "--target", "limited-drop:5"])
        .env("VQ_REDIS__URL", redis.url())
        .env("VQ_QUEUE__TICK_MS", s.queue.tick_ms.to_string())
        .output()
        .expect("run vq stats");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("LIMITED_DROP:5") && !text.contains('\x1b'), "{text}");
}

#[tokio::test]
async fn vq_stats_says_redis_is_unreachable_with_a_non_zero_exit() {
    let mut redis = RedisServer::spawn();
    let url = redis.url();
    redis.kill();
    let out = vq_command().args(["stats"]).env("VQ_REDIS__URL", &url).output().expect("run vq stats");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unreachable"), "{err}");
}

#[tokio::test]
async fn metrics_show_queue_length_and_request_durations_by_route_template() {
    let redis = RedisServer::spawn();
    let s = settings(&redis);
    let app = spawn_app(s, false).await;
    flag_on(&redis).await;
    for u in [777_001, 777_002, 777_003] {
        app.enter(T, u).await;
        app.poll(T, u).await;
    }
    let text = app.client.get(app.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(text.contains("virtual_queue_length{target=\"LIMITED_DROP:5\"} 3"), "{text}");
    assert!(text.contains("virtual_queue_capacity "), "{text}");
    assert!(text.contains("route=\"/virtual-queues/{kind}/{id}/entries/me\""), "{text}");
    assert!(!text.contains("777001") && !text.contains("limited-drop/5"), "no user ids or raw paths in labels");
}

#[test]
fn alert_rules_pass_promtool() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/alerts.yml");
    let out = Command::new("promtool")
        .args(["check", "rules", rules])
        .output()
        .expect("promtool must be installed (scripts/check-alerts.sh installs it: apt-get install -y prometheus)");
    assert!(
        out.status.success(),
        "promtool check rules failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `rate()` and the shipped alerts need every series before its first event: a fresh
/// instance that has served nothing already shows each counter at 0, and a target's event
/// counters appear at 0 as soon as it is active.
#[tokio::test]
async fn a_fresh_instance_shows_every_series_at_zero() {
    let redis = RedisServer::spawn();
    flag_on_before_start(&redis).await;
    let vq = VqProcess::serve(&redis, &[]).await;
    let client = reqwest::Client::new();
    let scrape = || async {
        client.get(format!("{}/metrics", vq.addr)).send().await.expect("metrics").text().await.expect("text")
    };
    let text = scrape().await;
    for series in [
        "virtual_queue_tokens_total{event=\"issued\"} 0",
        "virtual_queue_tokens_total{event=\"consumed\"} 0",
        "virtual_queue_tokens_total{event=\"expired\"} 0",
        "virtual_queue_bypass_attempts_total 0",
        "virtual_queue_redis_degraded_total{answer=\"failed_open\"} 0",
        "virtual_queue_redis_degraded_total{answer=\"out_of_memory\"} 0",
        "virtual_queue_redis_degraded_total{answer=\"not_replicated\"} 0",
    ] {
        assert!(text.lines().any(|l| l == series), "missing `{series}` in:\n{text}");
    }
    let enter = client
        .post(format!("{}/virtual-queues/limited-drop/5/entries", vq.addr))
        .header("X-User-Id", "1")
        .send()
        .await
        .expect("enter");
    assert_eq!(enter.json::<serde_json::Value>().await.expect("json")["status"], "WAITING");
    let text = scrape().await;
    // The pump may have admitted the user already: the series exists either way.
    for series in [
        "virtual_queue_admitted_total{target=\"LIMITED_DROP:5\"} ",
        "virtual_queue_evicted_total{target=\"LIMITED_DROP:5\"} 0",
    ] {
        assert!(text.lines().any(|l| l.starts_with(series)), "missing `{series}` in:\n{text}");
    }
}

/// Purchases are labelled by their gated route's template, whatever their spelling; other
/// forwarded paths by `unmatched`; never by the raw path.
#[tokio::test]
async fn gated_purchases_are_labelled_by_their_route_template() {
    let redis = RedisServer::spawn();
    let mut s = settings(&redis);
    s.gate.upstream = Some(crate::gate::spawn_echo().await);
    let app = spawn_app(s, false).await;
    flag_on(&redis).await;
    for path in ["/limited-drops/42/orders", "/Limited-Drops/42/orders/", "/events/7/seats/select"] {
        let r = app.client.post(app.url(path)).header("X-User-Id", "1").send().await.expect("purchase");
        assert_eq!(r.status(), 403, "{path}");
    }
    let r = app.client.get(app.url("/products/9")).send().await.expect("forwarded");
    assert_eq!(r.status(), 200);
    let text = app.client.get(app.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let count = |route: &str, status: u16| {
        let prefix =
            format!("virtual_queue_http_request_duration_seconds_count{{route=\"{route}\",status=\"{status}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).map(str::to_owned)
    };
    assert_eq!(count("/limited-drops/{dropId}/orders", 403).as_deref(), Some("2"), "{text}");
    assert_eq!(count("/events/{id}/seats/select", 403).as_deref(), Some("1"), "{text}");
    assert_eq!(count("unmatched", 200).as_deref(), Some("1"), "{text}");
    assert!(!text.contains("limited-drops/42") && !text.contains("products/9"), "no raw paths in labels");
}

/// The capacity in force is the serving instances', not the reader's: `vq stats` run without
/// the servers' configuration shows it and raises OVER_CAPACITY_90 against it.
#[tokio::test]
async fn capacity_in_force_comes_from_the_instances_serving_the_target() {
    let redis = RedisServer::spawn();
    flag_on_before_start(&redis).await;
    let vq = VqProcess::serve(
        &redis,
        &[("VQ_QUEUE__MAX_CAPACITY", "2".to_owned()), ("VQ_QUEUE__TICK_MS", "60000".to_owned())],
    )
    .await;
    let client = reqwest::Client::new();
    for u in [1, 2] {
        let r = client
            .post(format!("{}/virtual-queues/limited-drop/5/entries", vq.addr))
            .header("X-User-Id", u.to_string())
            .send()
            .await
            .expect("enter");
        assert_eq!(r.json::<serde_json::Value>().await.expect("json")["status"], "WAITING");
    }
    let out = vq_command().args(["stats", "--json"]).env("VQ_REDIS__URL", redis.url()).output().expect("vq stats");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let row = &v["targets"][0];
    assert_eq!(row["stats"]["maxCapacity"], 2, "{v}");
    assert!(row["alerts"].to_string().contains("OVER_CAPACITY_90"), "{v}");
}

/// `vq stats --json --target target` of the tests' Redis, tick and batch.
fn stats_json(redis: &RedisServer, s: &Settings, target: &str) -> serde_json::Value {
    let out = vq_command()
        .args(["stats", "--json", "--target", target])
        .env("VQ_REDIS__URL", redis.url())
        .env("VQ_QUEUE__TICK_MS", s.queue.tick_ms.to_string())
        .env("VQ_QUEUE__BATCH_SIZE", s.queue.batch_size.to_string())
        .output()
        .expect("run vq stats");
    assert!(out.status.success(), "vq stats failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("vq stats --json prints JSON")
}

/// A queue a few ticks old whose pump admits a full batch every tick is not slow: its rate
/// is judged over the ticks it has existed, not spread over a minute. The same queue with no
/// pump at all is slow once its first users have waited three ticks.
#[tokio::test]
async fn a_young_queue_admitting_at_full_rate_raises_no_rate_alert_and_one_without_a_pump_does() {
    let redis = RedisServer::spawn();
    let s = Arc::new(settings(&redis));
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    let pump = Pump::new(open_store(&s), s.clone(), "test-pump".into());
    next_tick(s.queue.tick_ms).await;
    for u in 1..=40 {
        assert_eq!(app.enter(T, u).await.status(), 200);
    }
    // Six ticks (3 s) with a batch admitted in each: exactly the target rate.
    let mut admitting_ticks = 0;
    while admitting_ticks < 6 {
        if pump.tick().await.expect("pump tick")[0].as_ref().expect("target tick").admit.is_some() {
            admitting_ticks += 1;
        }
        next_tick(s.queue.tick_ms).await;
    }
    let row = &stats_json(&redis, &s, "limited-drop:5")["targets"][0];
    assert!(row["stats"]["waitingCount"].as_u64().unwrap() >= 2, "{row}");
    assert_eq!(row["alerts"], serde_json::json!([]), "a queue 3 s old admitting at its target rate: {row}");

    // Another target, no pump: waits three ticks, then it is slow.
    for u in 1..=10 {
        assert_eq!(app.enter("limited-drop/6", u).await.status(), 200);
    }
    for _ in 0..4 {
        next_tick(s.queue.tick_ms).await;
    }
    let v = stats_json(&redis, &s, "limited-drop:6");
    assert_eq!(v["targets"][0]["alerts"], serde_json::json!(["RATE_UNDER_50"]), "{v}");
}

/// A paused sale admits nobody on purpose: no rate alert in `vq stats`, its state in
/// `/metrics` (what the shipped alert rule reads), and no ETA promised to its buyers.
#[tokio::test]
async fn a_paused_sale_raises_no_rate_alert_shows_paused_in_metrics_and_promises_no_eta() {
    let redis = RedisServer::spawn();
    let s = Arc::new(settings(&redis));
    let app = spawn_app((*s).clone(), false).await;
    flag_on(&redis).await;
    let store = open_store(&s);
    let target: vq::domain::QueueTarget = "LIMITED_DROP:5".parse().unwrap();
    assert!(store.control_sale(target, vq::domain::SaleControl::Pause).await.unwrap());
    for u in 1..=10 {
        assert_eq!(app.enter(T, u).await.status(), 200);
    }
    // Longer than three ticks: the queue is old enough for the rate to count.
    for _ in 0..4 {
        next_tick(s.queue.tick_ms).await;
    }
    let row = &stats_json(&redis, &s, "limited-drop:5")["targets"][0];
    assert_eq!(row["stats"]["saleState"], "paused", "{row}");
    assert_eq!(row["alerts"], serde_json::json!([]), "paused on purpose is not slow: {row}");

    let text = app.client.get(app.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(text.contains("virtual_queue_sale_state{target=\"LIMITED_DROP:5\",state=\"paused\"} 1"), "{text}");
    assert!(text.contains("virtual_queue_sale_state{target=\"LIMITED_DROP:5\",state=\"open\"} 0"), "{text}");

    let poll = app.json(app.poll(T, 10).await).await;
    assert_eq!(poll["status"], "WAITING", "{poll}");
    assert_eq!(poll["paused"], true, "{poll}");
    assert!(poll["etaSeconds"].is_null(), "a paused sale promises no wait: {poll}");
    assert!(store.control_sale(target, vq::domain::SaleControl::Resume).await.unwrap());
    // The resume reaches the instance's copy of the target within a sync (a quarter tick).
    let deadline = Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let poll = app.json(app.poll(T, 10).await).await;
        if poll.get("paused").is_none() {
            assert!(poll["etaSeconds"].as_u64().is_some(), "resumed: an estimate again: {poll}");
            break;
        }
        assert!(Instant::now() < deadline, "the resume never reached the poll: {poll}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
