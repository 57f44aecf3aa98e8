//! The shipped monitoring works as shipped: `deploy/prometheus/prometheus.yml` (with its alert
//! rules) in a real Prometheus scraping a real `vq serve` under a short load, and every query
//! of the Grafana dashboard (`deploy/grafana/vq-dashboard.json`) returning series there.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{RedisServer, VqProcess, flag_on, free_port};

const PROMETHEUS_YML: &str = include_str!("../../deploy/prometheus/prometheus.yml");
const DASHBOARD: &str = include_str!("../../deploy/grafana/vq-dashboard.json");

/// A `prometheus` child, killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The shipped scrape configuration, pointed at `target` and scraping every second.
fn scrape_config(target: &str) -> String {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/alerts.yml");
    let mut yml = PROMETHEUS_YML.to_owned();
    for (from, to) in [
        ("scrape_interval: 5s", "scrape_interval: 1s".to_owned()),
        ("scrape_timeout: 4s", "scrape_timeout: 1s".to_owned()),
        ("evaluation_interval: 15s", "evaluation_interval: 1s".to_owned()),
        ("  - alerts.yml", format!("  - {rules}")),
        (
            "          - 127.0.0.1:8081\n          - 127.0.0.1:8082\n          - 127.0.0.1:8083",
            format!("          - {target}"),
        ),
    ] {
        assert!(yml.contains(from), "deploy/prometheus/prometheus.yml no longer holds `{from}`");
        yml = yml.replacen(from, &to, 1);
    }
    yml
}

async fn start_prometheus(target: &str) -> Prometheus {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(&config, scrape_config(target)).unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
        .spawn()
        .expect("prometheus is missing: scripts/test.sh installs Debian's prometheus");
    let p = Prometheus { child, url: format!("http://127.0.0.1:{port}"), _dir: dir };
    let started = Instant::now();
    loop {
        if reqwest::get(format!("{}/-/ready", p.url)).await.is_ok_and(|r| r.status().is_success()) {
            return p;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "prometheus did not get ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn api(p: &Prometheus, path: &str, query: &[(&str, &str)]) -> Value {
    let v: Value =
        reqwest::Client::new().get(format!("{}{path}", p.url)).query(query).send().await.unwrap().json().await.unwrap();
    assert_eq!(v["status"], "success", "{path} {query:?}: {v}");
    v["data"].clone()
}

/// Every query of every panel, as Grafana would send it with All targets selected.
fn dashboard_queries() -> Vec<(String, String)> {
    let d: Value = serde_json::from_str(DASHBOARD).unwrap();
    let mut out = Vec::new();
    for panel in d["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap().replace("$__rate_interval", "30s").replace("$target", ".*");
            out.push((panel["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    out
}

#[tokio::test]
async fn the_shipped_scrape_config_and_every_dashboard_query_work_against_a_real_prometheus() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    let redis = RedisServer::spawn();
    let upstream = crate::gate::spawn_echo().await;
    let vq = VqProcess::serve(
        &redis,
        &[
            ("VQ_QUEUE__TICK_MS", "500".to_owned()),
            ("VQ_QUEUE__BATCH_SIZE", "5".to_owned()),
            ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
            ("VQ_GATE__UPSTREAM", upstream),
            // Adaptive, deciding each second on any purchase: the controller's panels have data.
            ("VQ_QUEUE__OUTFLOW", "adaptive".to_owned()),
            ("VQ_QUEUE__BATCH_MIN", "5".to_owned()),
            ("VQ_ADAPTIVE__INTERVAL_MS", "1000".to_owned()),
            ("VQ_ADAPTIVE__MIN_SAMPLES", "1".to_owned()),
        ],
    )
    .await;
    flag_on(&redis).await;
    let prometheus = start_prometheus(vq.addr.trim_start_matches("http://")).await;

    // A short sale: 40 buyers enter and poll for 8 s (the pump admits 5 per 500-ms tick),
    // admitted ones buy once with their token, and one purchase comes without a token.
    let client = reqwest::Client::new();
    let url = |p: &str| format!("{}{p}", vq.addr);
    for u in 1..=40 {
        client
            .post(url("/virtual-queues/limited-drop/42/entries"))
            .header("X-User-Id", u.to_string())
            .send()
            .await
            .unwrap();
    }
    let mut bought = std::collections::BTreeSet::new();
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        for u in 1..=40u64 {
            let r = client.get(url("/virtual-queues/limited-drop/42/entries/me")).header("X-User-Id", u.to_string());
            let v: Value = r.send().await.unwrap().json().await.unwrap_or(Value::Null);
            if let (Some(token), true) = (v["entryToken"].as_str(), v["status"] == "ADMITTED")
                && bought.insert(u)
            {
                let buy = client.post(url("/limited-drops/42/orders")).header("X-User-Id", u.to_string());
                assert!(buy.header("X-Entry-Token", token).send().await.unwrap().status().is_success());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let denied = client.post(url("/limited-drops/42/orders")).header("X-User-Id", "99").send().await.unwrap();
    assert_eq!(denied.status(), 403);
    assert!(!bought.is_empty(), "nobody was admitted");
    // Until Prometheus has scraped the sale's last event, the refused purchase.
    let started = Instant::now();
    loop {
        let data = api(&prometheus, "/api/v1/query", &[("query", "virtual_queue_bypass_attempts_total >= 1")]).await;
        if data["result"].as_array().is_some_and(|r| !r.is_empty()) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "prometheus never scraped the refused purchase");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The scrape works and the rules loaded.
    let targets = api(&prometheus, "/api/v1/targets", &[]).await;
    let active = &targets["activeTargets"];
    assert_eq!(active.as_array().map(Vec::len), Some(1), "{targets}");
    assert_eq!(active[0]["health"], "up", "{targets}");
    let rules = api(&prometheus, "/api/v1/rules", &[]).await;
    let loaded = rules["groups"][0]["rules"].as_array().map_or(0, Vec::len);
    assert!(loaded >= 5, "the alert rules did not load: {rules}");

    // The dashboard's target variable and every panel query return series.
    let labels = api(&prometheus, "/api/v1/label/target/values", &[("match[]", "virtual_queue_length")]).await;
    assert_eq!(labels, serde_json::json!(["LIMITED_DROP:42"]), "the $target variable");
    let mut empty = Vec::new();
    for (panel, expr) in &queries {
        let data = api(&prometheus, "/api/v1/query", &[("query", expr)]).await;
        if data["result"].as_array().is_none_or(Vec::is_empty) {
            empty.push(format!("{panel}: {expr}"));
        }
    }
    assert!(empty.is_empty(), "queries without series:\n{}", empty.join("\n"));
}
