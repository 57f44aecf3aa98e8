//! Redis out of memory (a tiny `maxmemory`, `noeviction`): what vq answers is what it logs
//! and counts. A write refused for lack of memory fails nothing open, so neither the log line
//! nor `virtual_queue_redis_degraded_total` may say "failing open".

use std::process::Stdio;
use std::time::Duration;

use redis::AsyncCommands;
use tokio::time::Instant;

use crate::support::{RedisServer, SECRET, TEST_REDIS_TIMEOUT_MS, VqProcess, flag_on, free_port, secret, vq_command};

/// `maxmemory` far below what Redis holds, with `noeviction`: every write is refused, reads
/// still answer.
async fn fill(redis: &RedisServer) {
    let mut c = redis.conn().await;
    for (k, v) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        let _: () = redis::cmd("CONFIG").arg("SET").arg(k).arg(v).query_async(&mut c).await.expect("CONFIG SET");
    }
    let refused: redis::RedisResult<()> = c.set("probe", 1).await;
    assert!(refused.is_err_and(|e| e.code() == Some("OOM")), "Redis refuses writes");
}

/// The value of one series in a `/metrics` text (0 when absent).
fn series(metrics: &str, name: &str) -> f64 {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

#[tokio::test]
async fn redis_out_of_memory_is_logged_and_counted_as_refused_not_as_failing_open() {
    let redis = RedisServer::spawn();
    let upstream = crate::gate::spawn_echo().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("vq.log");
    let port = free_port();
    let child = vq_command()
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("VQ_REDIS__URL", redis.url())
        .env("VQ_REDIS__TIMEOUT_MS", TEST_REDIS_TIMEOUT_MS.to_string())
        .env("VQ_GATE__UPSTREAM", &upstream)
        .env("VQ_GATE__PACE", "false")
        .env("VQ_TOKEN_SECRET", SECRET)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn vq serve");
    let addr = format!("http://127.0.0.1:{port}");
    // Killed on drop, whatever the test finds.
    let _vq = VqProcess { child, addr: addr.clone() };
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.get(format!("{addr}/healthz")).send().await.is_err() {
        assert!(Instant::now() < deadline, "vq serve did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    flag_on(&redis).await;
    fill(&redis).await;

    // Enters of targets with no keys yet: their first write meets the refusal.
    let mut full = 0;
    for (n, target) in ["limited-drop/11", "limited-drop/12", "ticketing-event/13"].iter().enumerate() {
        let resp = client
            .post(format!("{addr}/virtual-queues/{target}/entries"))
            .header("X-User-Id", (n + 1).to_string())
            .send()
            .await
            .expect("enter");
        let status = resp.status().as_u16();
        let body: serde_json::Value = resp.json().await.expect("json");
        assert_ne!(body["status"], "DIRECT_ADMITTED", "{body}");
        if status == 429 {
            assert_eq!(body["code"], "QUEUE_FULL", "{body}");
            full += 1;
        }
    }
    assert_eq!(full, 3, "every enter meets the refusal");

    // A purchase with a valid token: its claim still takes (a script whose first write frees
    // memory runs on), so it buys once, and only once; the count after it is refused.
    let target = "LIMITED_DROP:14".parse().expect("target");
    let now = vq::service::now_epoch_ms() / 1000;
    let token = vq::token::mint(&secret(), target, &vq::domain::UserId::from(9), now, 300).raw;
    for expected in [200, 403] {
        let resp = client
            .post(format!("{addr}/limited-drops/14/orders"))
            .header("X-User-Id", "9")
            .header("X-Entry-Token", &token)
            .send()
            .await
            .expect("purchase");
        assert_eq!(resp.status(), expected, "{:?}", resp.text().await);
    }

    let metrics = client.get(format!("{addr}/metrics")).send().await.expect("metrics").text().await.expect("text");
    let refused = series(&metrics, "virtual_queue_redis_degraded_total{answer=\"out_of_memory\"}");
    let opened = series(&metrics, "virtual_queue_redis_degraded_total{answer=\"failed_open\"}");
    assert!(refused >= 3.0, "the enters (and the purchase's count) refused for lack of memory:\n{metrics}");
    assert_eq!(opened, 0.0, "nothing failed open:\n{metrics}");

    // The log says what happened: refused for lack of memory, not failing open.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("for lack of memory") || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(text.contains("refused a write on enter for lack of memory"), "{text}");
    assert!(!text.contains("failing open"), "{text}");

    // Room again: the same instance queues as before.
    let mut c = redis.conn().await;
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("0").query_async(&mut c).await.expect("CONFIG");
    let resp = client
        .post(format!("{addr}/virtual-queues/limited-drop/11/entries"))
        .header("X-User-Id", "1")
        .send()
        .await
        .expect("enter");
    let body: serde_json::Value = resp.json().await.expect("json");
    assert_eq!(body["status"], "WAITING", "{body}");
}
