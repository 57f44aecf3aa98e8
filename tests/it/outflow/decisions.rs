//! Who decides the adaptive batch, and when it holds: two pumps decide each interval once;
//! without purchases, through a stopped Redis and under a pin (`vq batch set --target`) the
//! batch holds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use vq::domain::QueueTarget;
use vq::store::prelude::*;

use super::{OUTFLOW, adaptive_settings, batch_now};
use crate::support::{RedisServer, flag_on, next_tick, open_store, spawn_app};

/// The batch changes in the target's ledger, newest first: (from, to, instance, at_ms).
async fn batch_changes(store: &vq::store::AnyStore) -> Vec<(Option<u64>, u64, String, u64)> {
    let target: QueueTarget = "limited-drop:42".parse().unwrap();
    store
        .sale_ledger(target)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e {
            vq::domain::LedgerEntry::Batch { from, to, instance, at_ms, .. } => Some((from, to, instance, at_ms)),
            _ => None,
        })
        .collect()
}

/// Two pumps on one Redis: each interval is decided by one of them. With no minimum of
/// samples every decision adds one, so a decision made twice would show as two changes from
/// the same batch.
#[tokio::test]
async fn two_pumps_decide_each_interval_once() {
    let redis = RedisServer::spawn();
    let s = adaptive_settings(&redis, 0);
    let app = spawn_app(s.clone(), false).await;
    flag_on(&redis).await;
    for u in 1..=50u64 {
        app.enter("limited-drop/42", u).await;
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let pumps: Vec<_> = ["pump-a", "pump-b"]
        .into_iter()
        .map(|id| {
            let pump = vq::pump::Pump::new(open_store(&s), Arc::new(s.clone()), id.into());
            tokio::spawn(pump.run(stop.clone()))
        })
        .collect();
    let store = open_store(&s);
    let deadline = Instant::now() + Duration::from_secs(20);
    while batch_changes(&store).await.len() < 12 {
        assert!(Instant::now() < deadline, "the pumps made fewer than 12 decisions in 20 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    for p in pumps {
        let _ = p.await;
    }
    let changes = batch_changes(&store).await;
    for pair in changes.windows(2) {
        let (newer, older) = (&pair[0], &pair[1]);
        assert_eq!(newer.0, Some(older.1), "each decision starts where the one before ended: {changes:?}");
        assert_eq!(newer.1, older.1 + 1, "{changes:?}");
        assert!(newer.3 / 200 > older.3 / 200, "one decision per 200-ms interval: {changes:?}");
    }
}

/// Without purchases the batch holds; while Redis is stopped nothing decides, and afterwards
/// the batch goes on from where it was. `vq batch set --target` pins it (the pump admits the
/// pin and the controller decides nothing), `vq batch clear --target` hands it back.
#[tokio::test]
async fn the_batch_holds_without_purchases_and_through_a_stopped_redis_and_a_pin_overrides_it() {
    let redis = RedisServer::spawn();
    let s = adaptive_settings(&redis, 3);
    let app = spawn_app(s.clone(), false).await;
    flag_on(&redis).await;
    for u in 1..=400u64 {
        app.enter("limited-drop/42", u).await;
    }
    let pump = vq::pump::Pump::new(open_store(&s), Arc::new(s.clone()), "pump-a".into());
    let decided_at = || async {
        let at: Option<u64> = redis.conn().await.hget(OUTFLOW, "at").await.unwrap();
        at
    };
    let reason = || async {
        let r: Option<String> = redis.conn().await.hget(OUTFLOW, "reason").await.unwrap();
        r.unwrap_or_default()
    };
    // Ticks until a few intervals were decided: no purchases, so each holds.
    let ticks = |n: usize| {
        let pump = pump.clone();
        async move {
            let mut admitted = Vec::new();
            for _ in 0..n {
                next_tick(200).await;
                let t = tokio::time::timeout(Duration::from_secs(3), pump.tick()).await;
                if let Ok(Ok(results)) = t {
                    admitted.extend(results.into_iter().flatten().filter_map(|t| t.admit).map(|a| a.admitted));
                }
            }
            admitted
        }
    };
    ticks(5).await;
    assert_eq!(batch_now(&redis).await, Some(10), "held at the configured batch");
    assert!(reason().await.starts_with("hold"), "{}", reason().await);
    let before = decided_at().await.unwrap();

    // Redis stopped (SIGSTOP: alive, silent) for a few ticks, then continued.
    let pid = redis.pid().to_string();
    assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    let stopped = tokio::spawn(ticks(3));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(std::process::Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    let _ = stopped.await;
    ticks(3).await;
    assert_eq!(batch_now(&redis).await, Some(10), "the batch held through the outage");
    assert!(decided_at().await.unwrap() > before, "decisions go on after it");

    // A pin: the pump admits it, the controller decides nothing.
    let vq = |args: &[&str]| {
        let out = crate::support::vq_command()
            .args(args)
            .env("VQ_REDIS__URL", redis.url())
            .env("VQ_QUEUE__OUTFLOW", "adaptive")
            .env("VQ_TARGETS__RANGES", crate::support::test_ranges_env())
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    vq(&["batch", "set", "3", "--target", "limited-drop:42"]);
    let pinned_at = decided_at().await;
    let admitted = ticks(4).await;
    assert!(!admitted.is_empty() && admitted.iter().all(|n| *n == 3), "the pin is admitted: {admitted:?}");
    assert_eq!(decided_at().await, pinned_at, "no decision while pinned");
    vq(&["batch", "clear", "--target", "limited-drop:42"]);
    let admitted = ticks(4).await;
    assert!(decided_at().await > pinned_at, "decisions resume once cleared");
    assert_eq!(admitted.last(), Some(&10), "the controller's batch again: {admitted:?}");
}
