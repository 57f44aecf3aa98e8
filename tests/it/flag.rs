//! The flag as an operator drives it: `vq flag` (the real binary) against real `vq serve`
//! processes on a real redis-server, including the flag hash vanishing with Redis.

use std::process::Output;
use std::time::{Duration, Instant};

use redis::AsyncCommands;

use crate::support::{RedisServer, VqProcess, vq_command};

fn vq_flag(redis_url: &str, args: &[&str]) -> Output {
    let mut full = vec!["flag"];
    full.extend_from_slice(args);
    vq_command().args(&full).env("VQ_REDIS__URL", redis_url).output().expect("run vq flag")
}

fn out(o: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Gated `vq serve` processes named vq-a, vq-b, … in front of an echo upstream.
async fn gated_instances(redis: &RedisServer, n: usize) -> (Vec<VqProcess>, String) {
    let upstream = crate::gate::spawn_echo().await;
    let mut procs = Vec::new();
    for name in ["vq-a", "vq-b", "vq-c"].into_iter().take(n) {
        let envs = [
            ("VQ_INSTANCE_ID", name.to_owned()),
            ("VQ_GATE__UPSTREAM", upstream.clone()),
            ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
        ];
        procs.push(VqProcess::serve(redis, &envs).await);
    }
    (procs, upstream)
}

/// A purchase of user 3 on `limited-drops/{drop}/orders` without any token: its status.
async fn purchase_without_token(p: &VqProcess, drop: u64) -> u16 {
    reqwest::Client::new()
        .post(format!("{}/limited-drops/{drop}/orders", p.addr))
        .header("X-User-Id", "3")
        .send()
        .await
        .expect("purchase")
        .status()
        .as_u16()
}

async fn readyz(p: &VqProcess) -> serde_json::Value {
    reqwest::get(format!("{}/readyz", p.addr)).await.expect("readyz").json().await.expect("readyz json")
}

async fn metric(p: &VqProcess, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("{}/metrics", p.addr)).await.expect("metrics").text().await.expect("text");
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Waits (bounded) until every instance's /readyz says the flag hash is missing or not.
async fn wait_flag_missing(procs: &[VqProcess], missing: bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    for p in procs {
        loop {
            let r = readyz(p).await;
            if r["flag"]["missing"] == missing {
                break;
            }
            assert!(Instant::now() < deadline, "{}: /readyz never said flag missing = {missing}: {r}", p.addr);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// For about a second (ten flag refreshes), no instance lets a purchase without a token through.
async fn gate_stays_closed(procs: &[VqProcess], what: &str) {
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        for p in procs {
            assert_eq!(
                purchase_without_token(p, 1).await,
                403,
                "{what}: {} forwarded a purchase without token",
                p.addr
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn flag_off_removes_every_target_override_on_every_instance() {
    let redis = RedisServer::spawn();
    let (procs, _up) = gated_instances(&redis, 2).await;
    let on = vq_flag(&redis.url(), &["on", "--target", "limited-drop:42"]);
    assert!(on.status.success(), "{}", out(&on));
    let on7 = vq_flag(&redis.url(), &["on", "--percent", "100", "--target", "limited-drop:7"]);
    assert!(on7.status.success(), "{}", out(&on7));
    for p in &procs {
        assert_eq!(purchase_without_token(p, 42).await, 403, "the override queues limited-drop:42");
        assert_eq!(purchase_without_token(p, 1).await, 200, "the queue is off globally");
    }
    let status = vq_flag(&redis.url(), &["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("LIMITED_DROP:42: on 100%") && text.contains("LIMITED_DROP:7: on 100%"), "{text}");
    let json = vq_flag(&redis.url(), &["status", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("status --json");
    assert_eq!(v["flag"]["overrides"]["LIMITED_DROP:42"], "on 100%", "{v}");
    assert_eq!((v["missing"].as_bool(), v["instances"].as_array().map(Vec::len)), (Some(false), Some(2)), "{v}");

    let off = vq_flag(&redis.url(), &["off"]);
    assert!(off.status.success(), "{}", out(&off));
    // The command returned once both instances applied the change: nothing is queued now.
    for p in &procs {
        assert_eq!(purchase_without_token(p, 42).await, 200, "{}: limited-drop:42 still queued", p.addr);
        assert_eq!(purchase_without_token(p, 7).await, 200, "{}: limited-drop:7 still queued", p.addr);
    }
    let fields: std::collections::HashMap<String, String> =
        redis.conn().await.hgetall("virtual-queue:flag").await.unwrap();
    assert!(!fields.keys().any(|k| k.starts_with("target:")), "overrides left in Redis: {fields:?}");
    let status = vq_flag(&redis.url(), &["status"]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("target overrides: none"), "{}", out(&status));
}

#[tokio::test]
async fn flag_clear_removes_one_target_override() {
    let redis = RedisServer::spawn();
    let (procs, _up) = gated_instances(&redis, 1).await;
    assert!(vq_flag(&redis.url(), &["on"]).status.success());
    assert!(vq_flag(&redis.url(), &["off", "--target", "limited-drop:42"]).status.success());
    assert!(vq_flag(&redis.url(), &["on", "--percent", "0", "--target", "limited-drop:9"]).status.success());
    assert_eq!(purchase_without_token(&procs[0], 42).await, 200, "override off");
    assert_eq!(purchase_without_token(&procs[0], 1).await, 403, "global on");
    let status = vq_flag(&redis.url(), &["status"]);
    let text = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(text.contains("LIMITED_DROP:42: off") && text.contains("LIMITED_DROP:9: on 0%"), "{text}");

    let clear = vq_flag(&redis.url(), &["clear", "--target", "limited-drop:42"]);
    assert!(clear.status.success(), "{}", out(&clear));
    assert_eq!(purchase_without_token(&procs[0], 42).await, 403, "limited-drop:42 follows the global flag again");
    let status = vq_flag(&redis.url(), &["status"]);
    let text = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(!text.contains("LIMITED_DROP:42") && text.contains("LIMITED_DROP:9: on 0%"), "{text}");
    let usage = vq_flag(&redis.url(), &["clear"]);
    assert_eq!(usage.status.code(), Some(2), "clear needs --target: {}", out(&usage));
}

/// FLUSHALL during a sale: the instances keep the queue on, say so (/readyz, metric, status),
/// and `vq flag off` written again turns it off, confirmed.
#[tokio::test]
async fn a_flushed_flag_keeps_the_gate_closed_until_the_operator_writes_it_again() {
    let redis = RedisServer::spawn();
    let (procs, _up) = gated_instances(&redis, 2).await;
    assert_eq!(metric(&procs[0], "virtual_queue_flag_missing").await, Some(0.0), "the gauge exists from start");
    for _ in 0..3 {
        // Several writes, so the version counter is well above where a fresh hash starts.
        let on = vq_flag(&redis.url(), &["on"]);
        assert!(on.status.success(), "{}", out(&on));
    }
    for p in &procs {
        assert_eq!(purchase_without_token(p, 1).await, 403);
    }
    let _: () = redis::cmd("FLUSHALL").query_async(&mut redis.conn().await).await.unwrap();
    gate_stays_closed(&procs, "after FLUSHALL").await;
    wait_flag_missing(&procs, true).await;
    let r = readyz(&procs[0]).await;
    assert_eq!(r["status"], "ready", "{r}");
    assert_eq!(r["flag"]["state"], "on 100%", "{r}");
    assert!(r["flag"]["detail"].as_str().unwrap_or("").contains("vq flag on"), "{r}");
    assert_eq!(metric(&procs[1], "virtual_queue_flag_missing").await, Some(1.0));
    let status = vq_flag(&redis.url(), &["status"]);
    let text = out(&status);
    assert!(text.contains("MISSING") && text.contains("vq-a") && text.contains("KEEPS LAST KNOWN"), "{text}");
    assert!(text.contains("on 100%"), "status names what instances keep: {text}");
    let stats =
        crate::support::vq_command().args(["stats"]).env("VQ_REDIS__URL", redis.url()).output().expect("vq stats");
    let text = String::from_utf8_lossy(&stats.stdout);
    assert!(
        text.contains("flag MISSING") && !text.contains("flag off"),
        "vq stats does not call a lost flag off: {text}"
    );
    let v: serde_json::Value =
        serde_json::from_slice(&vq_flag(&redis.url(), &["status", "--json"]).stdout).expect("status --json");
    assert_eq!((v["flag"].is_null(), v["missing"].as_bool()), (true, Some(true)), "{v}");
    assert_eq!(
        (v["instances"][0]["keepsMissingFlag"].as_bool(), v["instances"][0]["state"].as_str()),
        (Some(true), Some("on 100%"))
    );

    // An override alone would write a hash that reads as "global off": refused.
    let partial = vq_flag(&redis.url(), &["on", "--target", "limited-drop:9"]);
    assert_eq!(partial.status.code(), Some(1), "{}", out(&partial));
    assert!(String::from_utf8_lossy(&partial.stderr).contains("nothing written"), "{}", out(&partial));
    assert_eq!(purchase_without_token(&procs[0], 1).await, 403);

    let off = vq_flag(&redis.url(), &["off"]);
    assert!(off.status.success(), "{}", out(&off));
    let text = String::from_utf8_lossy(&off.stdout);
    assert!(text.contains("version 4"), "the new version is above every acknowledged one: {text}");
    for p in &procs {
        assert_eq!(purchase_without_token(p, 1).await, 200, "{}: `vq flag off` confirmed, yet gated", p.addr);
    }
    wait_flag_missing(&procs, false).await;
    assert_eq!(metric(&procs[0], "virtual_queue_flag_missing").await, Some(0.0));
}

/// Redis killed and started again empty on the same port: the same, and a flag written by
/// hand with a version lower than the one applied is applied.
#[tokio::test]
async fn a_redis_restarted_empty_keeps_the_gate_closed_and_a_lower_version_is_applied() {
    let mut redis = RedisServer::spawn();
    let port = redis.port;
    let (procs, _up) = gated_instances(&redis, 2).await;
    for _ in 0..3 {
        assert!(vq_flag(&redis.url(), &["on"]).status.success());
    }
    redis.kill();
    let redis = RedisServer::spawn_on(port);
    gate_stays_closed(&procs, "after a restart without persistence").await;
    wait_flag_missing(&procs, true).await;

    let mut c = redis.conn().await;
    let _: () = c.hset_multiple("virtual-queue:flag", &[("enabled", "0"), ("version", "1")]).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    for p in &procs {
        while purchase_without_token(p, 1).await != 200 {
            assert!(Instant::now() < deadline, "{}: a flag at version 1 (below the 3 applied) was ignored", p.addr);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    wait_flag_missing(&procs, false).await;
    let on = vq_flag(&redis.url(), &["on"]);
    assert!(on.status.success(), "{}", out(&on));
    for p in &procs {
        assert_eq!(purchase_without_token(p, 1).await, 403, "{}: re-asserted on", p.addr);
    }
}

/// An instance that never read a flag treats a missing hash as off, as before.
#[tokio::test]
async fn a_fresh_instance_on_an_empty_redis_has_the_queue_off() {
    let redis = RedisServer::spawn();
    let (procs, _up) = gated_instances(&redis, 1).await;
    assert_eq!(purchase_without_token(&procs[0], 1).await, 200);
    let r = readyz(&procs[0]).await;
    assert_eq!((r["flag"]["missing"].as_bool(), r["flag"]["state"].as_str()), (Some(false), Some("off")), "{r}");
    let status = vq_flag(&redis.url(), &["status"]);
    assert!(String::from_utf8_lossy(&status.stdout).contains("never set"), "{}", out(&status));
}

/// The gauge exists from start even when Redis is down and no flag was ever read.
#[tokio::test]
async fn the_flag_missing_gauge_is_present_while_redis_is_down() {
    let url = format!("redis://127.0.0.1:{}", crate::support::free_port());
    let p = VqProcess::serve_env(&[("VQ_REDIS__URL", url)]).await;
    assert_eq!(metric(&p, "virtual_queue_flag_missing").await, Some(0.0));
    assert_eq!(readyz(&p).await["flag"]["missing"], false);
}

#[tokio::test]
async fn flag_on_without_any_live_instance_says_so_and_fails_but_writes() {
    let redis = RedisServer::spawn();
    let on = vq_flag(&redis.url(), &["on"]);
    assert_eq!(on.status.code(), Some(1), "{}", out(&on));
    let err = String::from_utf8_lossy(&on.stderr);
    assert!(err.contains("no instance acknowledged") && err.contains("IS written"), "{err}");
    let enabled: Option<String> = redis.conn().await.hget("virtual-queue:flag", "enabled").await.unwrap();
    assert_eq!(enabled.as_deref(), Some("1"), "the write itself happened");
}

#[tokio::test]
async fn flag_on_against_a_wrong_redis_url_fails_naming_it_without_the_password() {
    let port = crate::support::free_port();
    let url = format!("redis://:hunter2-s3cret@127.0.0.1:{port}");
    let on = vq_flag(&url, &["on"]);
    assert_eq!(on.status.code(), Some(1), "{}", out(&on));
    let err = String::from_utf8_lossy(&on.stderr);
    assert!(err.contains(&format!("cannot reach Redis at redis://:***@127.0.0.1:{port}")), "{err}");
    assert!(!out(&on).contains("hunter2-s3cret"), "{}", out(&on));
}

/// An instance frozen (SIGSTOP) before `vq flag off` loses its acknowledgement during the
/// 3 s wait: it stays in the table as NOT APPLIED, and the command fails naming it.
#[tokio::test]
async fn an_instance_whose_acknowledgement_expires_during_the_wait_shows_as_not_applied() {
    let redis = RedisServer::spawn();
    let (procs, _up) = gated_instances(&redis, 2).await;
    assert!(vq_flag(&redis.url(), &["on"]).status.success());
    let frozen = procs[1].child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-STOP", &frozen]).status().unwrap().success());
    let off = vq_flag(&redis.url(), &["off"]);
    let _ = std::process::Command::new("kill").args(["-CONT", &frozen]).status();
    assert_eq!(off.status.code(), Some(1), "{}", out(&off));
    let stdout = String::from_utf8_lossy(&off.stdout);
    assert!(stdout.lines().any(|l| l.contains("vq-b") && l.contains("NOT APPLIED")), "{}", out(&off));
    assert!(stdout.lines().any(|l| l.contains("vq-a") && l.contains("applied")), "{}", out(&off));
    assert!(String::from_utf8_lossy(&off.stderr).contains("vq-b"), "{}", out(&off));
}

/// A frozen instance does not vanish from `vq flag status` once its acknowledgement expires:
/// it stays listed as NOT APPLIED, silent, with how long it has said nothing. An instance
/// that shuts down (SIGTERM) withdraws its acknowledgement and is no longer listed.
#[tokio::test]
async fn a_frozen_instance_stays_listed_as_not_applied_after_its_acknowledgement_expires() {
    let redis = RedisServer::spawn();
    let (mut procs, _up) = gated_instances(&redis, 3).await;
    assert!(vq_flag(&redis.url(), &["on"]).status.success());
    let frozen = procs[1].child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-STOP", &frozen]).status().unwrap().success());
    let off = vq_flag(&redis.url(), &["off"]);
    assert_eq!(off.status.code(), Some(1), "{}", out(&off));
    // Until its acknowledgement has expired (3 s after its last refresh), then some more.
    let deadline = Instant::now() + Duration::from_secs(15);
    let silent = loop {
        let json = vq_flag(&redis.url(), &["status", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("status json");
        let b = v["instances"].as_array().expect("instances").iter().find(|i| i["instance"] == "vq-b").cloned();
        let b = b.unwrap_or_else(|| panic!("vq-b vanished from vq flag status: {v}"));
        if b["silentMs"].as_u64().is_some_and(|ms| ms > 4000) {
            break b;
        }
        assert!(Instant::now() < deadline, "vq-b never shown silent: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let status = vq_flag(&redis.url(), &["status"]);
    let _ = std::process::Command::new("kill").args(["-CONT", &frozen]).status();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.lines().any(|l| l.contains("vq-b") && l.contains("NOT APPLIED") && l.contains("SILENT for")),
        "{}\n{silent}",
        out(&status)
    );
    assert!(text.lines().any(|l| l.contains("vq-a") && l.contains("applied") && !l.contains("SILENT")), "{text}");

    // vq-c stops on purpose: its acknowledgement goes with it.
    let c = procs[2].child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &c]).status().unwrap().success());
    procs[2].child.wait().expect("vq-c exits on SIGTERM");
    let status = vq_flag(&redis.url(), &["status"]);
    assert!(!String::from_utf8_lossy(&status.stdout).contains("vq-c"), "{}", out(&status));
}

/// The flag operations of both stores: the rollback clears overrides in the same write, the
/// version never falls back to one an instance acknowledged, a lost hash reads as missing.
#[tokio::test]
async fn both_stores_clear_overrides_with_off_and_keep_versions_above_acknowledged_ones() {
    use vq::domain::{FlagChange, TargetOverride};
    use vq::store::FlagAck;
    use vq::store::prelude::*;
    let redis = RedisServer::spawn();
    let stores = [
        crate::support::open_store(&crate::support::test_settings(Some(&redis))),
        crate::support::open_store(&crate::support::test_settings(None)),
    ];
    let t42: vq::domain::QueueTarget = "limited-drop:42".parse().unwrap();
    let t7: vq::domain::QueueTarget = "limited-drop:7".parse().unwrap();
    for s in stores {
        assert_eq!(s.read_stored_flag().await.unwrap(), None, "no hash yet");
        s.change_flag(FlagChange::Target(t42, TargetOverride::On { percent: 100 })).await.unwrap();
        s.change_flag(FlagChange::Target(t7, TargetOverride::Off)).await.unwrap();
        let v = s.change_flag(FlagChange::ClearTarget(t7)).await.unwrap();
        let f = s.read_stored_flag().await.unwrap().expect("stored");
        assert_eq!((f.version, f.overrides.len()), (v, 1));
        let off = s.change_flag(FlagChange::Off).await.unwrap();
        let f = s.read_stored_flag().await.unwrap().expect("stored");
        assert!(f.overrides.is_empty() && !f.enabled && f.version == off, "{f:?}");

        let ack = FlagAck {
            instance: "vq-a".into(),
            version: 41,
            applied_at_ms: 5,
            kept_missing: true,
            state: "on 100%, 1 target override(s)".into(),
            silent_ms: None,
        };
        s.ack_flag(ack.clone(), 3000).await.unwrap();
        assert_eq!(s.flag_acks().await.unwrap(), vec![ack]);
        assert_eq!(s.change_flag(FlagChange::On { percent: 5 }).await.unwrap(), 42, "above the acknowledged 41");
    }
}

/// An instance acknowledges the flag it read at start-up before it answers anything, so
/// `vq flag` (and its confirmation that every live instance applied a change) never misses
/// one that already serves. Writes are held back in Redis (`CLIENT PAUSE … WRITE`) while it
/// starts: reads pass, so an instance that served before its acknowledgement would answer
/// with none written.
#[tokio::test]
async fn an_instance_answers_only_once_its_flag_acknowledgement_is_written() {
    let redis = RedisServer::spawn();
    let mut c = redis.conn().await;
    // Loads vq's function library first: loading it is a write too.
    let probe = VqProcess::serve(&redis, &[("VQ_INSTANCE_ID", "vq-probe".to_owned())]).await;
    drop(probe);
    let _: () = redis::cmd("DEL").arg("virtual-queue:acks").query_async(&mut c).await.unwrap();
    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(1500).arg("WRITE").query_async(&mut c).await.unwrap();
    let p = VqProcess::serve(&redis, &[("VQ_INSTANCE_ID", "vq-a".to_owned())]).await;
    let acks: std::collections::HashMap<String, String> = c.hgetall("virtual-queue:acks").await.unwrap();
    assert!(acks.contains_key("vq-a"), "vq-a answered /healthz with no acknowledgement written: {acks:?}");
    drop(p);
}
