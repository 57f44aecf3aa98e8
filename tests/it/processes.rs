//! Real `vq` processes on one Redis.

use std::time::{Duration, Instant};

use redis::AsyncCommands;

use crate::support::{RedisServer, VqProcess, enter_round_robin, flag_applied_by, flag_on, three_instances};

/// Three `vq serve` processes, each with its pump, while a saboteur deletes the admission
/// lock every few milliseconds: the cluster still admits at most one batch per tick.
#[tokio::test]
async fn three_instances_admit_one_batch_per_tick_even_when_the_lock_vanishes() {
    let redis = RedisServer::spawn();
    let envs = [
        ("VQ_QUEUE__TICK_MS", "300".to_owned()),
        ("VQ_QUEUE__BATCH_SIZE", "5".to_owned()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
        ("VQ_QUEUE__MAX_CAPACITY", "100000".to_owned()),
    ];
    let procs = three_instances(&redis, &envs).await;
    flag_on(&redis).await;
    enter_round_robin(&procs, "limited-drop/42", 1000).await;
    let mut c = redis.conn().await;
    let time = |t: (String, String)| t.0.parse::<u64>().unwrap() * 1000 + t.1.parse::<u64>().unwrap() / 1000;
    let start: (String, String) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let start_ms = time(start);
    let mark_at_start: u64 = c.get("queue:{LIMITED_DROP:42}:admitted_count").await.unwrap_or(0);

    let saboteur = {
        let mut c = redis.conn().await;
        tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(3);
            let mut deletes = 0u64;
            while Instant::now() < until {
                let _: u64 = c.del("queue:admission:{LIMITED_DROP:42}").await.unwrap();
                deletes += 1;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            deletes
        })
    };
    let deletes = saboteur.await.unwrap();
    let end: (String, String) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    let end_ms = time(end);
    let mark: u64 = c.get("queue:{LIMITED_DROP:42}:admitted_count").await.unwrap();
    let ticks = end_ms / 300 - start_ms / 300 + 1;
    let admitted = mark - mark_at_start;
    assert!(deletes > 100, "the lock was deleted {deletes} times");
    assert!(admitted <= 5 * ticks, "admitted {admitted} in {ticks} ticks: more than one batch of 5 per tick");
    assert!(admitted >= 5, "the pumps kept admitting: {admitted}");
    // Every tick recorded by admit.lua admitted one batch at most.
    let log: Vec<String> = c.lrange("queue:{LIMITED_DROP:42}:admissions", 0, -1).await.unwrap();
    let mut ticks_seen = std::collections::HashSet::new();
    for entry in &log {
        let (tick, n) = entry.split_once(':').unwrap();
        assert!(ticks_seen.insert(tick.to_owned()), "tick {tick} advanced twice");
        assert!(n.parse::<u64>().unwrap() <= 5);
    }
    drop(procs);
}

fn vq_cli(redis: &RedisServer, args: &[&str]) -> std::process::Output {
    crate::support::vq_command().args(args).env("VQ_REDIS__URL", redis.url()).output().expect("run vq")
}

async fn three_gated_instances(redis: &RedisServer) -> (Vec<VqProcess>, String) {
    let upstream = crate::gate::spawn_echo().await;
    let mut procs = Vec::new();
    // The three runtimes `threads` can pick: one worker per core, one thread, two workers.
    for (name, threads) in [("vq-a", "0"), ("vq-b", "1"), ("vq-c", "2")] {
        let envs = [
            ("VQ_INSTANCE_ID", name.to_owned()),
            ("VQ_THREADS", threads.to_owned()),
            ("VQ_GATE__UPSTREAM", upstream.clone()),
            ("VQ_FLAG__REFRESH_MS", "200".to_owned()),
        ];
        procs.push(VqProcess::serve(redis, &envs).await);
    }
    (procs, upstream)
}

/// `vq flag off` returns once all three instances applied it, and then none of them gates.
#[tokio::test]
async fn flag_off_is_confirmed_by_every_instance_within_three_seconds() {
    let redis = RedisServer::spawn();
    let (procs, _up) = three_gated_instances(&redis).await;
    let on = vq_cli(&redis, &["flag", "on"]);
    assert!(on.status.success(), "{}", String::from_utf8_lossy(&on.stderr));
    let client = reqwest::Client::new();
    for p in &procs {
        let r =
            client.post(format!("{}/limited-drops/1/orders", p.addr)).header("X-User-Id", "3").send().await.unwrap();
        assert_eq!(r.status(), 403, "flag on: the gate wants a token");
    }
    // Each instance confirming within the command's own window (3 s) is the bound; how long
    // the round takes is a benchmark's business.
    let off = vq_cli(&redis, &["flag", "off"]);
    let out = String::from_utf8_lossy(&off.stdout);
    assert!(off.status.success(), "{out}\n{}", String::from_utf8_lossy(&off.stderr));
    for name in ["vq-a", "vq-b", "vq-c"] {
        assert!(out.lines().any(|l| l.contains(name) && l.contains("applied")), "{name} missing in:\n{out}");
    }
    for p in &procs {
        let r =
            client.post(format!("{}/limited-drops/1/orders", p.addr)).header("X-User-Id", "3").send().await.unwrap();
        assert_eq!(r.status(), 200, "flag off applied on {}", p.addr);
    }
}

/// An instance that stops applying changes (here: frozen with SIGSTOP) is named, with a
/// non-zero exit.
#[tokio::test]
async fn flag_off_names_the_instance_that_did_not_apply_it() {
    let redis = RedisServer::spawn();
    let (procs, _up) = three_gated_instances(&redis).await;
    assert!(vq_cli(&redis, &["flag", "on"]).status.success());
    flag_applied_by(&redis, 3).await;
    let frozen = procs[2].child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-STOP", &frozen]).status().unwrap().success());
    let off = vq_cli(&redis, &["flag", "off"]);
    let _ = std::process::Command::new("kill").args(["-CONT", &frozen]).status();
    assert_eq!(off.status.code(), Some(1));
    let err = String::from_utf8_lossy(&off.stderr);
    assert!(err.contains("vq-c") && !err.contains("vq-a"), "{err}");
}

/// A 50 % canary queues about half of the users, and the gate (on another instance) agrees
/// with the queue for each user.
#[tokio::test]
async fn canary_queues_about_half_and_the_gate_agrees_per_user() {
    let redis = RedisServer::spawn();
    let (procs, _up) = three_gated_instances(&redis).await;
    assert!(vq_cli(&redis, &["flag", "on", "--percent", "50"]).status.success());
    flag_applied_by(&redis, 3).await;
    let client = reqwest::Client::new();
    let mut queued = 0;
    for u in 1..=200u64 {
        let v: serde_json::Value = client
            .post(format!("{}/virtual-queues/limited-drop/9/entries", procs[0].addr))
            .header("X-User-Id", u.to_string())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let in_queue = v["status"] == "WAITING";
        queued += u64::from(in_queue);
        let gate = client
            .post(format!("{}/limited-drops/9/orders", procs[1].addr))
            .header("X-User-Id", u.to_string())
            .send()
            .await
            .unwrap();
        let expected = if in_queue { 403 } else { 200 };
        assert_eq!(gate.status(), expected, "user {u}: queue said {}", v["status"]);
    }
    assert!((70..=130).contains(&queued), "{queued} of 200 queued at 50 %");
}
