//! A fault in one target stays in that target: a corrupt key fails open the requests of its
//! own target only, while the healthy targets keep queueing.

use std::sync::Arc;

use redis::AsyncCommands;
use serde_json::Value;
use vq::domain::{QueueTarget, UserId};
use vq::service::{QueueService, QueueStatus};

use crate::support::{RedisServer, flag_on, flag_on_before_start, open_store, secret, spawn_app, test_settings};

#[tokio::test]
async fn a_corrupt_key_of_one_target_fails_open_that_target_only() {
    let redis = RedisServer::spawn();
    let app = spawn_app(test_settings(Some(&redis)), false).await;
    flag_on(&redis).await;
    assert_eq!(app.json(app.enter("limited-drop/1", 1).await).await["status"], "WAITING");
    assert_eq!(app.json(app.enter("limited-drop/2", 1).await).await["status"], "WAITING");
    let mut c = redis.conn().await;
    // Someone overwrote target 1's queue with the wrong type: its scripts fail (WRONGTYPE).
    let _: () = c.set("queue:{LIMITED_DROP:1}:waiting", "oops").await.unwrap();
    for u in 10..15 {
        let v: Value = app.json(app.enter("limited-drop/1", u).await).await;
        assert_eq!(v["status"], "DIRECT_ADMITTED", "the broken target fails open: {v}");
        // Right after, on the same instance: the healthy target still queues.
        let v: Value = app.json(app.enter("limited-drop/2", u).await).await;
        assert_eq!(v["status"], "WAITING", "a healthy target right after a data error: {v}");
        let v: Value = app.json(app.poll("limited-drop/2", 1).await).await;
        assert_eq!(v["status"], "WAITING", "{v}");
    }
    let waiting: u64 = c.zcard("queue:{LIMITED_DROP:2}:waiting").await.unwrap();
    assert_eq!(waiting, 6);
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let line = |kind: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("virtual_queue_store_errors_total{{kind=\"{kind}\"}}")))
            .map(str::to_owned)
    };
    let data = line("data").unwrap_or_else(|| panic!("no data series: {metrics}"));
    assert!(!data.ends_with(" 0"), "data errors counted: {data}");
    assert!(line("unavailable").is_some(), "every kind is registered from the start: {metrics}");
}

/// A step on the side of a request that fails (the heartbeats' sync, a leave) is a store
/// error, not a request answered without the queue: `virtual_queue_redis_degraded_total
/// {answer="failed_open"}`, its alert and the `store.degraded` events count only requests that
/// were, such as an enter let in directly.
#[tokio::test]
async fn a_failed_step_on_the_side_is_not_counted_as_a_request_failed_open() {
    let redis = RedisServer::spawn();
    flag_on_before_start(&redis).await;
    let mut s = test_settings(Some(&redis));
    // Users past two batches of the mark are answered from the instance's copy.
    s.queue.batch_size = 1;
    let settings = Arc::new(s);
    let service = QueueService::new(open_store(&settings), secret(), settings.clone());
    service.refresh_flag().await.expect("flag");
    let failed_open = |service: &QueueService| {
        service.degraded_answers().iter().find(|(a, _)| *a == "failed_open").map(|(_, n)| *n).unwrap()
    };
    let t: QueueTarget = "limited-drop:1".parse().unwrap();
    let user = |u: u64| -> UserId { format!("buyer-{u}").parse().unwrap() };
    for u in 1..=5 {
        assert!(matches!(service.enter(t, &user(u)).await, Ok(QueueStatus::Waiting { .. })), "user {u}");
    }
    // Polls answered from the copy (made by a first sync): their heartbeats go to Redis in
    // the next sync.
    service.sync_local_views().await;
    for u in 4..=5 {
        assert!(matches!(service.status(t, &user(u)).await, Ok(QueueStatus::Waiting { .. })), "user {u}");
    }
    // Someone overwrote the target's queue with the wrong type: its scripts fail (WRONGTYPE).
    let mut c = redis.conn().await;
    let _: () = c.set("queue:{LIMITED_DROP:1}:waiting", "oops").await.unwrap();
    service.sync_local_views().await;
    service.leave(t, &user(3)).await;
    assert_eq!(failed_open(&service), 0, "no request was answered without the queue");
    // An enter of that target is: it is let in directly, and counted.
    assert!(matches!(service.enter(t, &user(9)).await, Ok(QueueStatus::DirectAdmitted(_))));
    assert_eq!(failed_open(&service), 1);
}
