//! Real `vq` processes on one Redis.

use std::time::{Duration, Instant};

use redis::AsyncCommands;

use crate::support::{RedisServer, VqProcess, flag_on};

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
    let procs = vec![
        VqProcess::serve(&redis, &envs).await,
        VqProcess::serve(&redis, &envs).await,
        VqProcess::serve(&redis, &envs).await,
    ];
    flag_on(&redis).await;
    let client = reqwest::Client::new();
    for u in 1..=1000u64 {
        let p = &procs[(u % 3) as usize];
        let r = client
            .post(format!("{}/virtual-queues/limited-drop/42/entries", p.addr))
            .header("X-User-Id", u.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
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
