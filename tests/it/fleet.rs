//! The fleet as the operator sees it: every instance exports every series, and the operator
//! commands, run with nothing but the Redis URL, see what the serving instances serve.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use redis::AsyncCommands;

use crate::support::{RedisServer, VqProcess, flag_on, vq_bin};

mod watch;

/// Turns the queue on and enters `users` at `addr`'s `limited-drop:42`, each until queued
/// (≤ 5 s: an instance whose probe has not yet seen a restarted Redis answers without it).
async fn flag_on_and_enter(redis: &RedisServer, addr: &str, users: std::ops::RangeInclusive<u64>) {
    flag_on(redis).await;
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    for user in users {
        loop {
            let r = client
                .post(format!("{addr}/virtual-queues/limited-drop/42/entries"))
                .header("X-User-Id", user.to_string())
                .send()
                .await
                .expect("enter");
            assert_eq!(r.status(), 200);
            let v: serde_json::Value = r.json().await.expect("json");
            if v["status"] == "WAITING" {
                break;
            }
            assert!(Instant::now() < deadline, "user {user} never queued: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

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
    flag_on_and_enter(&redis, &server.addr, 1..=30).await;
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

/// `extra` with `VQ_INSTANCE_ID` = `name`.
fn named<'a>(name: &str, extra: &[(&'a str, String)]) -> Vec<(&'a str, String)> {
    let mut envs = extra.to_vec();
    envs.push(("VQ_INSTANCE_ID", name.to_owned()));
    envs
}

/// Two instances `vq-a` and `vq-b` on `redis`, each with its own extra settings; returns once
/// both reported themselves.
async fn pair(redis: &RedisServer, a: &[(&str, String)], b: &[(&str, String)]) -> [VqProcess; 2] {
    let procs = [VqProcess::serve(redis, &named("vq-a", a)).await, VqProcess::serve(redis, &named("vq-b", b)).await];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fleet = fleet_json(redis);
        if fleet["instances"].as_array().map_or(0, Vec::len) == 2 {
            return procs;
        }
        assert!(Instant::now() < deadline, "both instances report themselves: {fleet}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn fleet_json(redis: &RedisServer) -> serde_json::Value {
    let out = operator(redis, &["fleet", "--json"]);
    assert!(out.status.success(), "{}", said(&out));
    serde_json::from_slice(&out.stdout).expect("json")
}

/// The settings `vq fleet --json` says drift, each with its sides' instances.
fn drifting(redis: &RedisServer) -> Vec<(String, Vec<Vec<String>>)> {
    let fleet = fleet_json(redis);
    fleet["drift"]
        .as_array()
        .expect("drift")
        .iter()
        .map(|d| {
            let sides = d["sides"]
                .as_array()
                .expect("sides")
                .iter()
                .map(|s| {
                    s["instances"]
                        .as_array()
                        .expect("instances")
                        .iter()
                        .map(|i| i.as_str().unwrap().to_owned())
                        .collect()
                })
                .collect();
            (d["setting"].as_str().expect("setting").to_owned(), sides)
        })
        .collect()
}

/// Waits (≤ 5 s) until `addr`'s `/metrics` says `virtual_queue_fleet_drift {n}`.
async fn drift_gauge_reaches(addr: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let want = format!("virtual_queue_fleet_drift {n}");
    loop {
        let text = scrape(addr).await;
        if text.lines().any(|l| l == want) {
            return;
        }
        assert!(Instant::now() < deadline, "{addr} never said {want}:\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Identical instances: no drift, `--check` passes, the gauge is 0. Then one instance with
/// another token secret: `vq fleet` names `token.key_ids` with each instance on its side (no
/// secret printed), `--check` exits 1, both instances' gauges say 1 and `vq stats` says DRIFT.
#[tokio::test]
async fn instances_with_different_token_secrets_are_drift_and_identical_ones_are_not() {
    let redis = RedisServer::spawn();
    let same = pair(&redis, &[], &[]).await;
    assert!(drifting(&redis).is_empty(), "identical instances: {}", fleet_json(&redis));
    let check = operator(&redis, &["fleet", "--check"]);
    assert_eq!(check.status.code(), Some(0), "{}", said(&check));
    assert!(said(&check).contains("no drift"), "{}", said(&check));
    drift_gauge_reaches(&same[0].addr, 0).await;
    let stats = said(&operator(&redis, &["stats"]));
    assert!(stats.contains("serving vq-a, vq-b  no drift"), "{stats}");
    drop(same);
    redis.conn().await.del::<_, ()>("virtual-queue:fleet").await.unwrap();

    let other = "another-secret-9876543210fedcba9876543210".to_owned();
    let procs = pair(&redis, &[], &[("VQ_TOKEN_SECRET", other.clone())]).await;
    let found = drifting(&redis);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "token.key_ids");
    let mut sides = found[0].1.clone();
    sides.sort();
    assert_eq!(sides, vec![vec!["vq-a".to_owned()], vec!["vq-b".to_owned()]]);
    let check = operator(&redis, &["fleet", "--check"]);
    assert_eq!(check.status.code(), Some(1), "{}", said(&check));
    let text = said(&check);
    assert!(text.contains("DRIFT token.key_ids: "), "{text}");
    assert!(!text.contains(&other) && !text.contains(crate::support::SECRET), "no secret printed: {text}");
    for p in &procs {
        drift_gauge_reaches(&p.addr, 1).await;
    }
    let stats = said(&operator(&redis, &["stats"]));
    assert!(stats.contains("DRIFT in token.key_ids (vq fleet)"), "{stats}");
    let status = said(&operator(&redis, &["flag", "status"]));
    assert!(status.contains("DRIFT token.key_ids: "), "{status}");
}

/// Instances with another tick, other target types, other gate routes, other purchase
/// limits or other event settings: each is drift, named.
#[tokio::test]
async fn instances_with_different_tick_types_or_routes_are_drift_named() {
    let types = "[{slug=\"limited-drop\"},{slug=\"ticketing-event\"},{slug=\"flash-coupon\"}]".to_owned();
    let routes = "[{method=\"POST\",path=\"/drops/{id}/buy\",target=\"limited-drop\"}]".to_owned();
    for (setting, env, value) in [
        ("queue.tick_ms", "VQ_QUEUE__TICK_MS", "1500".to_owned()),
        ("targets.types", "VQ_TARGETS__TYPES", types),
        ("gate.routes", "VQ_GATE__ROUTES", routes),
        ("queue.purchases", "VQ_QUEUE__PURCHASES_PER_USER", "3".to_owned()),
        ("events", "VQ_EVENTS__ADMITTED_EVERY", "500".to_owned()),
    ] {
        let redis = RedisServer::spawn();
        let _procs = pair(&redis, &[], &[(env, value)]).await;
        let found: Vec<String> = drifting(&redis).into_iter().map(|(s, _)| s).collect();
        assert_eq!(found, vec![setting.to_owned()], "{env}");
        let check = operator(&redis, &["fleet", "--check"]);
        assert_eq!(check.status.code(), Some(1), "{}", said(&check));
        assert!(said(&check).contains(&format!("DRIFT {setting}: ")), "{}", said(&check));
    }
}
