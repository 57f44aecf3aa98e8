//! Adaptive outflow (`queue.outflow = "adaptive"`): the batch follows the purchase API's
//! health as the gate measures it, within `queue.batch_min` and `queue.batch_max`; a pinned
//! batch (`vq batch set --target`) holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use redis::AsyncCommands;
use vq::domain::{QueueTarget, UserId};
use vq::store::prelude::*;

use crate::support::{RedisServer, flag_on, next_tick, open_store, secret, spawn_app, test_settings};

/// Every user of limited drop 42 the mark passes buys at once, with a token minted for them,
/// until `stop`.
fn buy_as_admitted(
    app: &crate::support::TestApp,
    redis: &RedisServer,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let target: QueueTarget = "limited-drop:42".parse().unwrap();
    let (client, url, redis_url) = (app.client.clone(), app.url("/limited-drops/42/orders"), redis.url());
    tokio::spawn(async move {
        let mut c = redis::Client::open(redis_url).unwrap().get_multiplexed_async_connection().await.unwrap();
        let mut last = 0u64;
        while !stop.is_cancelled() {
            let mark: u64 = c.get("queue:{LIMITED_DROP:42}:admitted_count").await.unwrap_or(0);
            if mark > last {
                let users: Vec<u64> =
                    c.zrangebyscore("queue:{LIMITED_DROP:42}:waiting", format!("({last}"), mark).await.unwrap();
                for u in users {
                    let now = vq::service::now_epoch_ms() / 1000;
                    let token = vq::token::mint(&secret(), target, &UserId::from(u), now, 300).raw;
                    let req = client.post(&url).header("X-User-Id", u.to_string()).header("X-Entry-Token", token);
                    tokio::spawn(req.send());
                }
                last = mark;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// A purchase API whose capacity drops from 50 to 20 purchases per second and returns (the
/// loadgen sink: one purchase at a time, 503 past 300 ms of waiting): the batch falls within
/// a few intervals and the refusals with it, and rises again after, never past batch_max.
#[tokio::test]
async fn when_the_purchase_apis_capacity_drops_the_batch_and_the_refusals_fall_and_the_batch_rises_after() {
    let redis = RedisServer::spawn();
    let model = vq::loadgen::SinkModel {
        capacity: Some("50,20@6s,50@14s".parse().unwrap()),
        max_wait: Duration::from_millis(300),
    };
    let mut s = adaptive_settings(&redis, 3);
    s.adaptive = vq::config::AdaptiveSettings { interval_ms: 600, increase: 2, ..s.adaptive.clone() };
    let drops = s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").unwrap();
    (drops.batch_min, drops.batch_max) = (Some(2), Some(20));
    let port = crate::support::free_port();
    s.gate.upstream = Some(format!("http://127.0.0.1:{port}"));
    let (app, stop, pump_task) = sale_with_a_pump(&s, &redis, 3000).await;
    // The capacity's schedule counts from the sink's start: the users have entered by then.
    let sink = vq::loadgen::Sink::start(([127, 0, 0, 1], port).into(), 200, model).await.unwrap();
    let (started, sink_start) = (Instant::now(), sink.now_ms());
    let buyers = buy_as_admitted(&app, &redis, stop.clone());

    // The batch sampled through the three phases (offsets from the sink's start).
    let mut phases: Vec<(&str, Vec<u64>)> = Vec::new();
    for (name, until) in [("50/s", 6), ("20/s", 14), ("50/s again", 20)] {
        let mut seen = Vec::new();
        while started.elapsed() < Duration::from_secs(until) {
            if let Some(b) = batch_now(&redis).await {
                seen.push(b);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        phases.push((name, seen));
    }
    stop.cancel();
    let _ = pump_task.await;
    let _ = buyers.await;

    let summary = format!("{phases:?}");
    eprintln!("batch by phase: {summary}");
    let all: Vec<u64> = phases.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    assert!(all.iter().all(|b| (2..=20).contains(b)), "within [2, 20]: {summary}");
    let (before, during, after) = (&phases[0].1, &phases[1].1, &phases[2].1);
    let low = *during.iter().min().unwrap();
    assert!(low < *before.last().unwrap() && low <= 6, "the batch fell to what 20/s takes (4 per tick): {summary}");
    assert!(after.iter().max().unwrap() > &low, "the batch rose again once the capacity returned: {summary}");
    // Refusals: the second half of the drop against its first seconds.
    let share = |from_s: u64, to_s: u64| {
        let secs = sink.seconds(sink_start + from_s * 1000, sink_start + to_s * 1000 - 1);
        let (served, refused) = secs.iter().fold((0, 0), |(a, b), x| (a + x.served, b + x.refused));
        (refused as f64 / (served + refused).max(1) as f64, served, refused)
    };
    let (early, late) = (share(6, 8), share(10, 14));
    eprintln!("refused share: first 2 s of the drop {early:?}, last 4 s {late:?}");
    // A fixed batch of 10 per tick against 4 per tick would have 60 % refused throughout.
    let target = s.adaptive.error_ratio;
    assert!(late.0 <= target, "the refused share returned under {target}: {early:?} then {late:?}");
}

/// A purchase API that answers 200 after `delay` ms.
async fn purchase_api(delay: Arc<AtomicU64>) -> String {
    let handler = move || {
        let delay = delay.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(delay.load(Ordering::Relaxed))).await;
            StatusCode::OK
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, axum::Router::new().fallback(handler)).await });
    addr
}

const OUTFLOW: &str = "queue:{LIMITED_DROP:42}:outflow";

/// An app on `s` (flag on) with users 1..=`users` entered into limited-drop 42 one after the
/// other, and a pump running until the token is cancelled.
async fn sale_with_a_pump(
    s: &vq::config::Settings,
    redis: &RedisServer,
    users: u64,
) -> (crate::support::TestApp, tokio_util::sync::CancellationToken, tokio::task::JoinHandle<()>) {
    let app = spawn_app(s.clone(), false).await;
    flag_on(redis).await;
    for u in 1..=users {
        app.enter("limited-drop/42", u).await;
    }
    let pump = vq::pump::Pump::new(open_store(s), Arc::new(s.clone()), "test-pump".into());
    let stop = tokio_util::sync::CancellationToken::new();
    let pump_task = tokio::spawn(pump.run(stop.clone()));
    (app, stop, pump_task)
}

async fn batch_now(redis: &RedisServer) -> Option<u64> {
    redis.conn().await.hget(OUTFLOW, "batch").await.unwrap()
}

#[tokio::test]
async fn the_batch_falls_when_the_purchase_api_slows_and_rises_again_within_its_bounds() {
    let redis = RedisServer::spawn();
    let delay = Arc::new(AtomicU64::new(5));
    let mut s = test_settings(Some(&redis));
    s.queue.tick_ms = 200;
    s.queue.batch_size = 10;
    s.queue.outflow = vq::config::Outflow::Adaptive;
    (s.queue.batch_min, s.queue.batch_max) = (4, 30);
    s.adaptive = vq::config::AdaptiveSettings {
        interval_ms: 600,
        latency_ms: 250,
        error_ratio: 0.2,
        increase: 4,
        decrease: 0.5,
        min_samples: 3,
        target_purchases_per_tick: None,
    };
    s.gate.upstream = Some(purchase_api(delay.clone()).await);
    s.gate.timeout_ms = 5000;
    let (app, stop, pump_task) = sale_with_a_pump(&s, &redis, 6000).await;
    let target: QueueTarget = "limited-drop:42".parse().unwrap();

    // Buyers: everyone admitted buys at once with their token.
    let buyers = buy_as_admitted(&app, &redis, stop.clone());

    // Healthy, slow, healthy again; the controller's batch sampled throughout.
    let mut phases: Vec<(&str, Vec<u64>)> = Vec::new();
    for (name, ms, secs) in [("healthy", 5, 5), ("slow", 600, 5), ("recovered", 5, 6)] {
        delay.store(ms, Ordering::Relaxed);
        let mut seen = Vec::new();
        let until = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < until {
            if let Some(b) = batch_now(&redis).await {
                seen.push(b);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        phases.push((name, seen));
    }
    let stats = app.json(app.client.get(app.url("/virtual-queues/limited-drop/42/stats")).send().await.unwrap()).await;
    stop.cancel();
    let _ = pump_task.await;
    let _ = buyers.await;

    let summary = format!("{phases:?}");
    eprintln!("batch samples by phase: {summary}");
    let all: Vec<u64> = phases.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    assert!(all.iter().all(|b| (4..=30).contains(b)), "outside [batch_min, batch_max]: {summary}");
    let (healthy, slow, recovered) = (&phases[0].1, &phases[1].1, &phases[2].1);
    let peak = *healthy.iter().max().expect("decisions while healthy");
    assert!(peak > 10, "the batch rose above its start while the API was healthy: {summary}");
    let low = *slow.iter().min().unwrap();
    assert!(low <= peak / 2, "the batch fell while the API was slow: {summary}");
    assert!(*recovered.last().unwrap() > low, "the batch rose again once the API recovered: {summary}");
    assert_eq!(stats["outflow"], "adaptive", "{stats}");
    // The pump has stopped: the batch no longer moves between the two reads.
    let stats = app.json(app.client.get(app.url("/virtual-queues/limited-drop/42/stats")).send().await.unwrap()).await;
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let gauge = format!("virtual_queue_batch_size{{target=\"LIMITED_DROP:42\"}} {}", stats["batchSize"]);
    assert!(metrics.contains(&gauge), "{gauge} in /metrics");
    assert!(
        metrics.contains("virtual_queue_adaptive_batch_min{target=\"LIMITED_DROP:42\"} 4"),
        "batch_min in /metrics"
    );
    assert!(stats["outflowReason"].as_str().is_some_and(|r| !r.is_empty()), "{stats}");

    // Every change of the batch is a ledger row with its reason, each from where the one
    // before it left the batch.
    let store = open_store(&s);
    let changes: Vec<(Option<u64>, u64, String)> = store
        .sale_ledger(target)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            vq::domain::LedgerEntry::Batch { from, to, reason, .. } => Some((from, to, reason)),
            _ => None,
        })
        .collect();
    assert!(changes.len() >= 3, "{changes:?}");
    for pair in changes.windows(2) {
        assert_eq!(pair[0].0, Some(pair[1].1), "newest first, a chain of changes: {changes:?}");
    }
    assert!(changes.iter().any(|c| c.2.starts_with("down")) && changes.iter().any(|c| c.2.starts_with("up")));
    // `vq stats` shows the signals and the last changes.
    let out = crate::support::vq_command()
        .args(["stats", "--target", "limited-drop:42"])
        .env("VQ_REDIS__URL", redis.url())
        .env("VQ_QUEUE__OUTFLOW", "adaptive")
        .env("VQ_TARGETS__RANGES", crate::support::test_ranges_env())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("LIMITED_DROP:42 outflow adaptive: batch") && text.contains("last interval"), "{text}");
    assert!(text.matches(" batch ").count() >= 3 && text.contains(" → "), "the last changes: {text}");

    // `vq batch show` says where the batch comes from.
    let show = || {
        let out = crate::support::vq_command()
            .args(["batch", "show", "--target", "limited-drop:42"])
            .env("VQ_REDIS__URL", redis.url())
            .env("VQ_QUEUE__OUTFLOW", "adaptive")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = show();
    assert!(text.contains("queue.outflow = adaptive: the controller's batch"), "{text}");

    // A pinned batch holds: the controller decides nothing while `vq batch set --target` is.
    store.set_batch_size(Some(target), Some(7)).await.unwrap();
    let text = show();
    assert!(text.contains("pinned") && text.contains("in force for LIMITED_DROP:42: 7"), "{text}");
    let interval = store.now_ms() / 600 + 5;
    assert_eq!(store.claim_outflow(target, interval).await.unwrap(), vq::store::OutflowClaim::Pinned);
    store.set_batch_size(Some(target), None).await.unwrap();
    assert!(matches!(store.claim_outflow(target, interval).await.unwrap(), vq::store::OutflowClaim::Decide { .. }));
}

/// No-show compensation: half of the admitted buyers never buy (their token expires unused);
/// with a target of 10 purchases per tick the controller admits about 10 / (1 − 0.5) = 20,
/// and the purchase API gets about the target, never more than `batch_max` in a tick.
#[tokio::test]
async fn with_half_the_buyers_not_showing_purchases_per_tick_reach_the_target_within_bounds() {
    let redis = RedisServer::spawn();
    let tick_ms = 200;
    let sink = vq::loadgen::Sink::start("127.0.0.1:0".parse().unwrap(), tick_ms, Default::default()).await.unwrap();
    let mut s = test_settings(Some(&redis));
    s.queue.tick_ms = tick_ms;
    s.queue.batch_size = 10;
    s.queue.heartbeat_timeout_s = 600;
    s.queue.outflow = vq::config::Outflow::Adaptive;
    (s.queue.batch_min, s.queue.batch_max) = (4, 40);
    s.token.ttl_s = 1;
    s.adaptive = vq::config::AdaptiveSettings {
        interval_ms: 600,
        latency_ms: 1000,
        error_ratio: 0.2,
        increase: 4,
        decrease: 0.5,
        min_samples: 3,
        target_purchases_per_tick: Some(10),
    };
    s.gate.upstream = Some(format!("http://{}", sink.addr));
    // Entered one after the other: user n holds seq n.
    let (app, stop, pump_task) = sale_with_a_pump(&s, &redis, 4000).await;

    // Buyers: each admitted user collects their token with a poll; the even ones buy with it.
    let buyers = {
        let (client, base, redis_url) = (app.client.clone(), app.addr.clone(), redis.url());
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut c = redis::Client::open(redis_url).unwrap().get_multiplexed_async_connection().await.unwrap();
            let mut last = 0u64;
            while !stop.is_cancelled() {
                let mark: u64 = c.get("queue:{LIMITED_DROP:42}:admitted_count").await.unwrap_or(0);
                for u in last + 1..=mark {
                    let (client, base) = (client.clone(), base.clone());
                    tokio::spawn(async move {
                        let me = format!("{base}/virtual-queues/limited-drop/42/entries/me");
                        let poll = client.get(me).header("X-User-Id", u.to_string()).send().await.unwrap();
                        let body: serde_json::Value = poll.json().await.unwrap();
                        let Some(token) = body["entryToken"].as_str().filter(|_| u % 2 == 0) else { return };
                        let order = format!("{base}/limited-drops/42/orders");
                        let _ = client
                            .post(order)
                            .header("X-User-Id", u.to_string())
                            .header("X-Entry-Token", token)
                            .send()
                            .await;
                    });
                }
                last = last.max(mark);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // Until the controller has seen the no-shows and settled (at most 20 s), then 3 s measured.
    let settled = Instant::now() + Duration::from_secs(20);
    while Instant::now() < settled && batch_now(&redis).await.is_none_or(|b| b < 18) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let from = sink.now_ms();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let to = sink.now_ms();
    let stats = app.json(app.client.get(app.url("/virtual-queues/limited-drop/42/stats")).send().await.unwrap()).await;
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    stop.cancel();
    let _ = pump_task.await;
    let _ = buyers.await;

    let batch = batch_now(&redis).await.unwrap();
    let f = sink.figures(from, to);
    let per_tick = f.total as f64 / ((to - from) as f64 / tick_ms as f64);
    eprintln!("batch {batch}, {per_tick:.1} purchases per tick, {f:?}, stats {stats}");
    assert!((16..=24).contains(&batch), "10 / (1 − ~0.5) ≈ 20, got {batch}: {stats}");
    let no_show = stats["outflowSignals"]["noShowRatio"].as_f64().expect("a no-show share");
    assert!((0.3..=0.7).contains(&no_show), "half the buyers never buy: {stats}");
    assert!(stats["outflowReason"].as_str().unwrap().starts_with("target"), "{stats}");
    assert!(stats["tokensExpired"].as_u64().unwrap() > 0, "{stats}");
    assert!(per_tick >= 6.0, "about the target of 10 per tick reached the purchase API: {per_tick:.1}");
    assert!(f.max_per_tick <= 40, "never more than batch_max in a tick: {f:?}");
    for series in [
        "virtual_queue_target_tokens{target=\"LIMITED_DROP:42\",outcome=\"expired\"}",
        "virtual_queue_adaptive_no_show_ratio{target=\"LIMITED_DROP:42\"}",
        "virtual_queue_adaptive_error_ratio{target=\"LIMITED_DROP:42\"}",
    ] {
        assert!(metrics.contains(series), "{series} in /metrics");
    }
}

/// Adaptive outflow for limited drops only (`[[targets.types]]`), within 1..=100000; the
/// other types and `queue.outflow` stay fixed.
fn adaptive_settings(redis: &RedisServer, min_samples: u64) -> vq::config::Settings {
    let mut s = test_settings(Some(redis));
    s.queue.tick_ms = 200;
    s.queue.batch_size = 10;
    s.queue.heartbeat_timeout_s = 600;
    let drops = s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").unwrap();
    drops.outflow = Some(vq::config::Outflow::Adaptive);
    (drops.batch_min, drops.batch_max) = (Some(1), Some(100_000));
    s.adaptive = vq::config::AdaptiveSettings {
        interval_ms: 200,
        latency_ms: 1000,
        error_ratio: 0.2,
        increase: 1,
        decrease: 0.5,
        min_samples,
        target_purchases_per_tick: None,
    };
    s
}

/// The batch changes in the target's ledger, newest first: (from, to, instance, at_ms).
async fn batch_changes(store: &vq::store::AnyStore) -> Vec<(Option<u64>, u64, String, u64)> {
    let target: QueueTarget = "limited-drop:42".parse().unwrap();
    store
        .sale_ledger(target)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            vq::domain::LedgerEntry::Batch { from, to, instance, at_ms, .. } => Some((from, to, instance, at_ms)),
            _ => None,
        })
        .collect()
}

/// Two pumps on one Redis: each interval is decided by one of them. With no minimum of
/// samples every decision adds one, so a decision made twice would show as two changes from
/// the same batch.
#[tokio::test]
async fn two_pumps_decide_each_interval_once() {
    let redis = RedisServer::spawn();
    let s = adaptive_settings(&redis, 0);
    let app = spawn_app(s.clone(), false).await;
    flag_on(&redis).await;
    for u in 1..=50u64 {
        app.enter("limited-drop/42", u).await;
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let pumps: Vec<_> = ["pump-a", "pump-b"]
        .into_iter()
        .map(|id| {
            let pump = vq::pump::Pump::new(open_store(&s), Arc::new(s.clone()), id.into());
            tokio::spawn(pump.run(stop.clone()))
        })
        .collect();
    let store = open_store(&s);
    let deadline = Instant::now() + Duration::from_secs(20);
    while batch_changes(&store).await.len() < 12 {
        assert!(Instant::now() < deadline, "the pumps made fewer than 12 decisions in 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    for p in pumps {
        let _ = p.await;
    }
    let changes = batch_changes(&store).await;
    for pair in changes.windows(2) {
        let (newer, older) = (&pair[0], &pair[1]);
        assert_eq!(newer.0, Some(older.1), "each decision starts where the one before ended: {changes:?}");
        assert_eq!(newer.1, older.1 + 1, "{changes:?}");
        assert!(newer.3 / 200 > older.3 / 200, "one decision per 200-ms interval: {changes:?}");
    }
}

/// Without purchases the batch holds; while Redis is stopped nothing decides, and afterwards
/// the batch goes on from where it was. `vq batch set --target` pins it (the pump admits the
/// pin and the controller decides nothing), `vq batch clear --target` hands it back.
#[tokio::test]
async fn the_batch_holds_without_purchases_and_through_a_stopped_redis_and_a_pin_overrides_it() {
    let redis = RedisServer::spawn();
    let s = adaptive_settings(&redis, 3);
    let app = spawn_app(s.clone(), false).await;
    flag_on(&redis).await;
    for u in 1..=400u64 {
        app.enter("limited-drop/42", u).await;
    }
    let pump = vq::pump::Pump::new(open_store(&s), Arc::new(s.clone()), "pump-a".into());
    let decided_at = || async {
        let at: Option<u64> = redis.conn().await.hget(OUTFLOW, "at").await.unwrap();
        at
    };
    let reason = || async {
        let r: Option<String> = redis.conn().await.hget(OUTFLOW, "reason").await.unwrap();
        r.unwrap_or_default()
    };
    // Ticks until a few intervals were decided: no purchases, so each holds.
    let ticks = |n: usize| {
        let pump = pump.clone();
        async move {
            let mut admitted = Vec::new();
            for _ in 0..n {
                next_tick(200).await;
                let t = tokio::time::timeout(Duration::from_secs(3), pump.tick()).await;
                if let Ok(Ok(results)) = t {
                    admitted.extend(results.into_iter().flatten().filter_map(|t| t.admit).map(|a| a.admitted));
                }
            }
            admitted
        }
    };
    ticks(5).await;
    assert_eq!(batch_now(&redis).await, Some(10), "held at the configured batch");
    assert!(reason().await.starts_with("hold"), "{}", reason().await);
    let before = decided_at().await.unwrap();

    // Redis stopped (SIGSTOP: alive, silent) for a few ticks, then continued.
    let pid = redis.pid().to_string();
    assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let stopped = tokio::spawn(ticks(3));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(std::process::Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    let _ = stopped.await;
    ticks(3).await;
    assert_eq!(batch_now(&redis).await, Some(10), "the batch held through the outage");
    assert!(decided_at().await.unwrap() > before, "decisions go on after it");

    // A pin: the pump admits it, the controller decides nothing.
    let vq = |args: &[&str]| {
        let out = crate::support::vq_command()
            .args(args)
            .env("VQ_REDIS__URL", redis.url())
            .env("VQ_QUEUE__OUTFLOW", "adaptive")
            .env("VQ_TARGETS__RANGES", crate::support::test_ranges_env())
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    vq(&["batch", "set", "3", "--target", "limited-drop:42"]);
    let pinned_at = decided_at().await;
    let admitted = ticks(4).await;
    assert!(!admitted.is_empty() && admitted.iter().all(|n| *n == 3), "the pin is admitted: {admitted:?}");
    assert_eq!(decided_at().await, pinned_at, "no decision while pinned");
    vq(&["batch", "clear", "--target", "limited-drop:42"]);
    let admitted = ticks(4).await;
    assert!(decided_at().await > pinned_at, "decisions resume once cleared");
    assert_eq!(admitted.last(), Some(&10), "the controller's batch again: {admitted:?}");
}

/// Users of limited drop 42 holding a place, read from the keys themselves: admitted
/// (seq ≤ mark) and still in `waiting` (token not collected), or holding a stored token no
/// purchase used (its key expires with the token).
async fn holding_a_place(redis: &RedisServer, users: u64) -> u64 {
    let mut c = redis.conn().await;
    let mark: u64 = c.get("queue:{LIMITED_DROP:42}:admitted_count").await.unwrap_or(0);
    let uncollected: u64 = c.zcount("queue:{LIMITED_DROP:42}:waiting", "-inf", mark).await.unwrap();
    let mut holding = 0;
    for u in 1..=users {
        let token: Option<String> = c.get(format!("queue:{{LIMITED_DROP:42}}:token:{u}")).await.unwrap();
        holding += u64::from(token.is_some_and(|t| !t.starts_with("used:")));
    }
    uncollected + holding
}

/// Active-buyer mode: never more than `max_active` buyers hold a place; a purchase frees
/// exactly one, and so does each token that expires unused.
#[tokio::test]
async fn in_active_mode_a_purchase_or_an_expiry_frees_exactly_one_place() {
    let redis = RedisServer::spawn();
    let sink = vq::loadgen::Sink::start("127.0.0.1:0".parse().unwrap(), 200, Default::default()).await.unwrap();
    let mut s = test_settings(Some(&redis));
    s.queue.tick_ms = 200;
    s.queue.heartbeat_timeout_s = 600;
    s.token.ttl_s = 2;
    let drops = s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").unwrap();
    (drops.outflow, drops.max_active) = (Some(vq::config::Outflow::Active), Some(5));
    s.gate.upstream = Some(format!("http://{}", sink.addr));
    let app = spawn_app(s.clone(), false).await;
    flag_on(&redis).await;
    let users = 30;
    for u in 1..=users {
        app.enter("limited-drop/42", u).await;
    }
    let pump = vq::pump::Pump::new(open_store(&s), Arc::new(s.clone()), "pump-a".into());
    // One tick: the users it admitted, and the places held afterwards (never over 5).
    let tick = || async {
        next_tick(200).await;
        let results = pump.tick().await.unwrap();
        let admitted = results.into_iter().flatten().filter_map(|t| t.admit).map(|a| a.admitted).sum::<u64>();
        let held = holding_a_place(&redis, users).await;
        assert!(held <= 5, "{held} buyers hold a place, max_active 5");
        admitted
    };
    let collect = |u: u64| {
        let app = &app;
        async move {
            let body = app.json(app.poll("limited-drop/42", u).await).await;
            body["entryToken"].as_str().expect("admitted").to_owned()
        }
    };
    assert_eq!(tick().await, 5, "the first five");
    assert_eq!(tick().await, 0, "nobody finished");
    let mut tokens = Vec::new();
    for u in 1..=5 {
        tokens.push(collect(u).await);
    }
    assert_eq!(tick().await, 0, "collecting a token finishes nothing");
    // User 1 buys: one place.
    let bought = app
        .client
        .post(app.url("/limited-drops/42/orders"))
        .header("X-User-Id", "1")
        .header("X-Entry-Token", &tokens[0])
        .send()
        .await
        .unwrap();
    assert_eq!(bought.status(), 200);
    assert_eq!(tick().await, 1, "a purchase frees one place");
    assert_eq!(tick().await, 0);
    let sixth = collect(6).await;
    assert!(!sixth.is_empty());
    // Users 2–5 never buy: their four tokens expire (2 s) before user 6's.
    let expired_by = Instant::now() + Duration::from_secs(3);
    let mut freed = 0;
    while freed < 4 {
        assert!(Instant::now() < expired_by, "the four tokens expired within 3 s; {freed} places freed");
        freed += tick().await;
    }
    assert_eq!(freed, 4, "each expiry frees one place");
    assert_eq!(holding_a_place(&redis, users).await, 5);
    let stats = app.json(app.client.get(app.url("/virtual-queues/limited-drop/42/stats")).send().await.unwrap()).await;
    assert_eq!(stats["outflow"], "active", "{stats}");
    assert_eq!((stats["tokensUsed"].as_u64(), stats["tokensExpired"].as_u64()), (Some(1), Some(4)), "{stats}");
}

/// The waiting page's ETA counts with the adaptive batch the instance's pump sees, not the
/// configured one.
#[tokio::test]
async fn the_eta_counts_with_the_adaptive_batch() {
    let redis = RedisServer::spawn();
    let mut s = adaptive_settings(&redis, 0);
    s.adaptive.increase = 20;
    let drops = s.targets.types.iter_mut().find(|t| t.slug == "limited-drop").unwrap();
    drops.batch_max = Some(50);
    let app = spawn_app(s.clone(), true).await;
    flag_on(&redis).await;
    for u in 1..=3000u64 {
        app.enter("limited-drop/42", u).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while batch_now(&redis).await != Some(50) {
        assert!(Instant::now() < deadline, "the batch reached batch_max 50 within 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A tick for the instance's pump to read the batch, then the last user's ETA.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let body = app.json(app.poll("limited-drop/42", 3000).await).await;
    let ahead = body["aheadCount"].as_u64().expect("still waiting");
    let eta = body["etaSeconds"].as_u64().unwrap();
    let at = |batch: u64| vq::domain::eta_seconds(ahead, batch, 200);
    assert_eq!(eta, at(50), "{ahead} ahead at 50 per 200-ms tick (at the configured 10: {} s)", at(10));
}
