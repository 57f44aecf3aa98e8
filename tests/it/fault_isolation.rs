//! A fault in one target stays in that target: a corrupt key fails open the requests of its
//! own target only, while the healthy targets keep queueing.

use redis::AsyncCommands;
use serde_json::Value;

use crate::support::{RedisServer, flag_on, spawn_app, test_settings};

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
