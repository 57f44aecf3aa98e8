//! The fleet as the operator sees it: every instance exports every series, and the operator
//! commands, run with nothing but the Redis URL, see what the serving instances serve.

use std::time::{Duration, Instant};

use crate::support::{RedisServer, VqProcess, flag_on};

/// The series the README's `/metrics` table lists, but for the rows it says exist only in
/// some cases (`only for` targets of a kind, `absent` before an event).
fn readme_series() -> Vec<String> {
    let readme = include_str!("../../README.md");
    let section = readme.split("### /metrics").nth(1).expect("README has a /metrics section");
    let section = section.split("\n### ").next().expect("section");
    let mut names = Vec::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        if cells.get(1).is_some_and(|kind| kind.contains("only for") || kind.contains("absent")) {
            continue;
        }
        for (i, span) in cells[0].split('`').enumerate() {
            if i % 2 == 1 && span.starts_with("virtual_queue_") {
                names.push(span.split('{').next().expect("name").to_owned());
            }
        }
    }
    assert!(names.len() >= 15, "the README's table lists the series: {names:?}");
    names
}

/// Whether `text` (Prometheus exposition) has a sample of the series `name` (a histogram's
/// `_bucket`/`_count`/`_sum` count).
fn has_series(text: &str, name: &str) -> bool {
    text.lines().filter(|l| !l.starts_with('#')).any(|l| {
        let metric = l.split(['{', ' ']).next().unwrap_or("");
        metric == name || ["_bucket", "_count", "_sum"].iter().any(|s| metric.strip_suffix(s) == Some(name))
    })
}

async fn scrape(addr: &str) -> String {
    reqwest::get(format!("{addr}/metrics")).await.expect("metrics").text().await.expect("text")
}

/// Two instances on one Redis, one of them without a pump: after the other's pump admitted
/// users, both export every series the README lists (a histogram with zero counts included),
/// so a dashboard summing them across the fleet has no gaps and `absent()` never fires.
#[tokio::test]
async fn every_instance_exports_every_listed_series_whoever_admitted() {
    let redis = RedisServer::spawn();
    let envs = [("VQ_QUEUE__TICK_MS", "300".to_owned()), ("VQ_FLAG__REFRESH_MS", "100".to_owned())];
    let pumping = VqProcess::serve(&redis, &envs).await;
    let quiet = VqProcess::serve_args(&redis, &["--no-pump"], &envs).await;
    flag_on(&redis).await;
    let client = reqwest::Client::new();
    for user in 1..=20 {
        let r = client
            .post(format!("{}/virtual-queues/limited-drop/42/entries", pumping.addr))
            .header("X-User-Id", user.to_string())
            .send()
            .await
            .expect("enter");
        assert_eq!(r.status(), 200);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !scrape(&pumping.addr).await.contains("virtual_queue_wait_seconds_count 20") {
        assert!(Instant::now() < deadline, "the pump admitted the 20 users: {}", scrape(&pumping.addr).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let series = readme_series();
    for (who, p) in [("the pumping instance", &pumping), ("the instance without a pump", &quiet)] {
        let text = scrape(&p.addr).await;
        let missing: Vec<_> = series.iter().filter(|s| !has_series(&text, s)).collect();
        assert!(missing.is_empty(), "{who} lacks {missing:?}:\n{text}");
    }
}
