//! The fleet as the operator sees it: every instance exports every series, and the operator
//! commands, run with nothing but the Redis URL, see what the serving instances serve.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use redis::AsyncCommands;

use crate::support::{RedisServer, VqProcess, flag_on, vq_bin};

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

/// `vq …` as an operator runs it on a laptop or a bastion: none of the servers' settings,
/// only the Redis URL.
fn operator(redis: &RedisServer, args: &[&str]) -> Output {
    let mut cmd = Command::new(vq_bin());
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("VQ_")) {
        cmd.env_remove(k);
    }
    cmd.args(args).env("VQ_REDIS__URL", redis.url()).output().expect("run vq")
}

fn said(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `vq serve` with `limited-drop:42` declared only in its environment, and 30 buyers waiting:
/// the operator commands, given nothing but the Redis URL, see the target and its buyers and
/// act on it; `vq target list` names the instance whose configuration declares it; once the
/// instance is gone, the declaration leaves the list within the report's lifetime while the
/// waiting buyers keep the target on `vq stats`.
#[tokio::test]
async fn operator_commands_with_only_the_redis_url_see_and_act_on_what_the_fleet_serves() {
    let redis = RedisServer::spawn();
    let envs = [
        ("VQ_INSTANCE_ID", "vq-a".to_owned()),
        ("VQ_TARGETS__DECLARED", "[\"limited-drop:42\"]".to_owned()),
        ("VQ_TARGETS__RANGES", "[]".to_owned()),
        // Nobody is admitted during the test: the buyers keep waiting.
        ("VQ_QUEUE__BATCH_SIZE", "1".to_owned()),
        ("VQ_QUEUE__TICK_MS", "60000".to_owned()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
    ];
    let mut server = VqProcess::serve(&redis, &envs).await;
    flag_on(&redis).await;
    let client = reqwest::Client::new();
    for user in 1..=30 {
        let r = client
            .post(format!("{}/virtual-queues/limited-drop/42/entries", server.addr))
            .header("X-User-Id", user.to_string())
            .send()
            .await
            .expect("enter");
        assert_eq!(r.status(), 200);
    }
    let json = |o: &Output| -> serde_json::Value { serde_json::from_slice(&o.stdout).expect("json") };

    let stats = operator(&redis, &["stats", "--json"]);
    assert!(stats.status.success(), "{}", said(&stats));
    let report = json(&stats);
    let row = &report["targets"][0];
    assert_eq!(row["target"], "LIMITED_DROP:42", "{report}");
    assert!(row["stats"]["waitingCount"].as_u64().unwrap() >= 29, "{report}");
    assert_eq!(row["sources"][0], "configuration of vq-a", "{report}");
    assert_eq!(report["instances"][0], "vq-a", "{report}");
    let text = operator(&redis, &["stats", "--wide"]);
    assert!(text.status.success(), "{}", said(&text));
    let text = said(&text);
    assert!(text.contains("LIMITED_DROP:42") && text.contains("serving vq-a"), "{text}");
    assert!(!text.contains("no active targets"), "{text}");

    let list = operator(&redis, &["target", "list"]);
    assert!(said(&list).contains("limited-drop:42  (configuration of vq-a)"), "{}", said(&list));
    for args in [
        &["stats", "--target", "limited-drop:42"][..],
        &["sale", "pause", "limited-drop:42"],
        &["sale", "resume", "limited-drop:42"],
        &["flag", "off", "--target", "limited-drop:42"],
        &["batch", "set", "5", "--target", "limited-drop:42"],
        &["sale", "report", "limited-drop:42"],
    ] {
        let out = operator(&redis, args);
        assert!(out.status.success(), "vq {args:?}: {}", said(&out));
    }
    let batch: Option<u64> = redis.conn().await.get("queue:{LIMITED_DROP:42}:batch_size").await.unwrap();
    assert_eq!(batch, Some(5), "vq batch set acted on the target");
    // A target nobody serves is still refused.
    let out = operator(&redis, &["batch", "set", "5", "--target", "limited-drop:43"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(said(&out).contains("did you mean limited-drop:42?"), "{}", said(&out));

    // Killed (no withdrawal): its report expires, and the declaration with it.
    let _ = server.child.kill();
    let _ = server.child.wait();
    let killed = Instant::now();
    loop {
        let list = said(&operator(&redis, &["target", "list"]));
        if !list.contains("limited-drop:42") {
            assert!(list.contains("0 declared"), "{list}");
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(15), "the report outlived its lifetime: {list}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(killed.elapsed() >= Duration::from_secs(5), "the report lives its lifetime");
    let report = json(&operator(&redis, &["stats", "--json"]));
    assert_eq!(report["targets"][0]["target"], "LIMITED_DROP:42", "buyers still wait there: {report}");
    assert_eq!(report["targets"][0]["sources"][0], "users waiting (no serving instance declares it)", "{report}");
}
