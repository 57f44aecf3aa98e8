//! Adaptive outflow (`queue.outflow = "adaptive"`): the batch follows the purchase API's
//! health as the gate measures it, within `queue.batch_min` and `queue.batch_max`; a pinned
//! batch (`vq batch set --target`) holds.

mod active;
mod attack;
mod decisions;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use redis::AsyncCommands;
use vq::domain::{QueueTarget, UserId};
use vq::store::prelude::*;

use crate::support::{RedisServer, flag_on, open_store, secret, spawn_app, test_settings};

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
    // A fixed batch of 10 per tick against 4 per tick would have 60 % refused throughout. The
    // controller cuts when an interval's share of buyers refused passes the error ratio, so
    // the share swings about it.
    let target = s.adaptive.error_ratio;
    assert!(late.0 <= 1.5 * target, "the refused share stayed about {target}: {early:?} then {late:?}");
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
