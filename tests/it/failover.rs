//! Three `vq serve` processes on one Redis, one of them killed mid-run: the other two keep
//! serving and the pump keeps admitting one batch per tick.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::AsyncCommands;

use crate::support::{RedisServer, VqProcess, enter_round_robin, flag_on, three_instances};

const TICK_MS: u64 = 300;
const BATCH: u64 = 5;

/// admit.lua's log of the target: tick number -> users admitted in that tick.
async fn admissions(redis: &RedisServer) -> BTreeMap<u64, u64> {
    let mut c = redis.conn().await;
    let log: Vec<String> = c.lrange("queue:{LIMITED_DROP:77}:admissions", 0, -1).await.unwrap();
    let mut per_tick = BTreeMap::new();
    for entry in log {
        let (tick, n) = entry.split_once(':').unwrap();
        let previous = per_tick.insert(tick.parse().unwrap(), n.parse().unwrap());
        assert!(previous.is_none(), "tick {tick} advanced twice");
    }
    per_tick
}

async fn redis_tick(redis: &RedisServer) -> u64 {
    let mut c = redis.conn().await;
    let (s, us): (String, String) = redis::cmd("TIME").query_async(&mut c).await.unwrap();
    (s.parse::<u64>().unwrap() * 1000 + us.parse::<u64>().unwrap() / 1000) / TICK_MS
}

#[tokio::test]
async fn killing_one_of_three_instances_keeps_serving_and_one_batch_per_tick() {
    let redis = RedisServer::spawn();
    let envs = [
        ("VQ_QUEUE__TICK_MS", TICK_MS.to_string()),
        ("VQ_QUEUE__BATCH_SIZE", BATCH.to_string()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
    ];
    let mut procs = three_instances(&redis, &envs).await;
    flag_on(&redis).await;
    enter_round_robin(&procs, "limited-drop/77", 600).await;
    let client = reqwest::Client::new();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Kill the instance holding the admission lock right now, if one does (the worst case:
    // its lock must expire before another instance takes over), else the first.
    let before_kill = redis_tick(&redis).await;
    let mut c = redis.conn().await;
    let holder: Option<String> = c.get("queue:admission:{LIMITED_DROP:77}").await.unwrap();
    let victim =
        holder.and_then(|h| procs.iter().position(|p| h.ends_with(&format!("-{}", p.child.id())))).unwrap_or(0);
    procs.swap(0, victim);
    let victim = 0;
    procs[victim].child.kill().unwrap();
    procs[victim].child.wait().unwrap();
    let survivors: Vec<&VqProcess> = procs.iter().skip(1).collect();

    // The survivors keep answering, while ticks go by.
    let until = tokio::time::Instant::now() + Duration::from_millis(3000);
    let mut answered = 0;
    while tokio::time::Instant::now() < until {
        for p in &survivors {
            let r = client
                .get(format!("{}/virtual-queues/limited-drop/77/entries/me", p.addr))
                .header("X-User-Id", "599")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{} after the kill", p.addr);
            answered += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = redis_tick(&redis).await;
    let log = admissions(&redis).await;
    assert!(log.values().all(|n| *n <= BATCH), "one batch per tick at most: {log:?}");
    let ticks_after_kill = after - before_kill - 1;
    let admitting_after_kill = log.range(before_kill + 1..after).filter(|(_, n)| **n == BATCH).count() as u64;
    // The dead instance's lock lives tick - 100 ms: at most one tick may go without a batch.
    assert!(
        admitting_after_kill + 1 >= ticks_after_kill,
        "{admitting_after_kill} full batches in {ticks_after_kill} ticks after the kill: {log:?}"
    );
    assert!(answered > 20);
    drop(procs);
}
