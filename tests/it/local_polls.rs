//! Waiting users' polls answered from an instance's copy of the mark (`queue.local_polls`):
//! Redis is spared the polls, and every invariant of a poll still holds — heartbeats reach
//! Redis (nobody polling is evicted), an admitted user gets the token at the next poll,
//! `aheadCount` is exact after a sync, users who left are told so, and Redis going away still
//! fails open.

use std::time::Duration;

use redis::AsyncCommands;
use vq::config::Settings;

use crate::support::{RedisServer, TestApp, flag_on, spawn_app, test_settings};

const T: &str = "limited-drop/1";

/// Script calls Redis has run so far (`FCALL`, `EVALSHA` and `EVAL`, from `INFO commandstats`).
async fn script_calls(redis: &RedisServer) -> u64 {
    let mut c = redis.conn().await;
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut c).await.unwrap();
    info.lines()
        .filter(|l| ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"].iter().any(|c| l.starts_with(c)))
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// Polls this instance answered from its copy (its `/metrics` counter).
async fn answered_locally(app: &TestApp) -> u64 {
    let text = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find(|l| l.starts_with("virtual_queue_polls_answered_locally_total"))
        .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Polls `user` until the instance answers from its copy (after its first sync; 5 s at most).
async fn poll_until_answered_locally(app: &TestApp, user: u64) {
    let before = answered_locally(app).await;
    for _ in 0..100 {
        let r = app.json(app.poll(T, user).await).await;
        assert_eq!(r["status"], "WAITING", "user {user}: {r}");
        if answered_locally(app).await > before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the copy never answered user {user}'s polls");
}

fn settings(redis: &RedisServer, local: bool) -> Settings {
    let mut s = test_settings(Some(redis));
    s.queue.local_polls = local;
    s
}

async fn enter_all(app: &TestApp, users: std::ops::RangeInclusive<u64>) {
    for u in users {
        let r = app.json(app.enter(T, u).await).await;
        assert_eq!(r["status"], "WAITING", "user {u}: {r}");
    }
}

/// Polls `user` until `until` holds for the answer (5 s at most); returns that answer.
async fn poll_until(app: &TestApp, user: u64, until: impl Fn(u16, &serde_json::Value) -> bool) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    for _ in 0..100 {
        let resp = app.poll(T, user).await;
        let status = resp.status().as_u16();
        assert!(status < 500, "poll of user {user} answered {status}");
        last = resp.json().await.unwrap_or_default();
        if until(status, &last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("user {user}: the awaited answer never came; last {last}");
}

#[tokio::test]
async fn polls_answered_from_the_copy_spare_redis_and_still_keep_the_users_in_the_queue() {
    let redis = RedisServer::spawn();
    let mut s = settings(&redis, true);
    s.queue.batch_size = 1;
    s.queue.heartbeat_timeout_s = 2;
    let app = spawn_app(s.clone(), true).await;
    flag_on(&redis).await;
    enter_all(&app, 1..=80).await;

    // Users 21..80 poll every 500 ms for 5 s, well past the 2 s heartbeat timeout; users 1..20
    // never poll and are evicted (or admitted, one per tick).
    // With the stale users evicted, the pump admits the front of the polling users, one per
    // tick: those stop polling.
    let before = script_calls(&redis).await;
    let mut polls = 0;
    let mut waiting: Vec<u64> = (21..=80).collect();
    for _ in 0..10 {
        let mut still = Vec::new();
        for u in waiting {
            let r = app.json(app.poll(T, u).await).await;
            polls += 1;
            if r["status"] == "ADMITTED" {
                continue;
            }
            assert_eq!(r["status"], "WAITING", "user {u}: {r}");
            assert_eq!(r["position"], u, "the seq is the user's fixed place: {r}");
            still.push(u);
        }
        waiting = still;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(waiting.len() >= 40, "{} users still waiting", waiting.len());
    let calls = script_calls(&redis).await - before;
    let local = answered_locally(&app).await;
    assert!(local > polls / 2, "only {local} of {polls} polls were answered from the copy");
    assert!(calls < polls / 3, "Redis ran {calls} scripts for {polls} polls (pump and syncs included)");

    // Redis itself (status.lua, through an instance without a copy) still has every polling
    // user waiting: their heartbeats arrived.
    let direct = spawn_app(settings(&redis, false), false).await;
    for &u in &waiting {
        let resp = direct.poll(T, u).await;
        assert_eq!(resp.status(), 200, "user {u} polled within the timeout but was evicted");
        let r = direct.json(resp).await;
        assert!(matches!(r["status"].as_str(), Some("WAITING" | "ADMITTED")), "user {u}: {r}");
    }
    let evicted: u64 = redis.conn().await.get("queue:{LIMITED_DROP:1}:evicted").await.unwrap_or(0);
    assert!(evicted > 0, "the users who never polled should have been evicted");
}

#[tokio::test]
async fn a_user_admitted_while_answered_from_the_copy_gets_the_token_at_the_next_poll() {
    let redis = RedisServer::spawn();
    let mut s = settings(&redis, true);
    s.queue.batch_size = 5;
    let app = spawn_app(s, true).await;
    flag_on(&redis).await;
    enter_all(&app, 1..=60).await;
    let mut c = redis.conn().await;
    let user = 60;
    let mut waited = 0;
    loop {
        // The mark Redis holds before the poll: once it has reached the user, this very poll
        // must hand out the token, whatever the instance's copy says.
        let mark: u64 = c.get("queue:{LIMITED_DROP:1}:admitted_count").await.unwrap_or(0);
        let r = app.json(app.poll(T, user).await).await;
        if mark >= user {
            assert_eq!(r["status"], "ADMITTED", "mark {mark} had reached seq {user}: {r}");
            assert!(r["entryToken"].is_string());
            break;
        }
        assert!(matches!(r["status"].as_str(), Some("WAITING" | "ADMITTED")), "{r}");
        waited += 1;
        assert!(waited < 400, "user {user} was never admitted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(answered_locally(&app).await > 0, "the copy never answered: the test did not test it");
}

#[tokio::test]
async fn ahead_counts_from_the_copy_match_redis_after_users_leave_through_another_instance() {
    let redis = RedisServer::spawn();
    let local = spawn_app(settings(&redis, true), false).await;
    let direct = spawn_app(settings(&redis, false), false).await;
    flag_on(&redis).await;
    enter_all(&local, 1..=100).await;
    poll_until_answered_locally(&local, 100).await;
    assert_eq!(local.json(local.poll(T, 100).await).await["aheadCount"], 99);

    for u in 40..=49 {
        assert_eq!(direct.leave(T, u).await.status(), 204);
    }
    // One sync later the copy knows the ten departed seqs.
    poll_until(&local, 100, |_, r| r["aheadCount"] == 89).await;
    for u in [30, 60, 80, 100] {
        let a = local.json(local.poll(T, u).await).await;
        let b = direct.json(direct.poll(T, u).await).await;
        for field in ["status", "position", "aheadCount", "etaSeconds", "pollAfterSeconds"] {
            assert_eq!(a[field], b[field], "user {u}, {field}: copy {a} vs Redis {b}");
        }
    }
    // A user who left elsewhere is told so by this instance too (after at most one answer
    // from the copy).
    poll_until(&local, 45, |status, _| status == 404).await;
}

#[tokio::test]
async fn with_redis_gone_polls_answered_from_the_copy_fail_open() {
    let mut redis = RedisServer::spawn();
    let app = spawn_app(settings(&redis, true), false).await;
    flag_on(&redis).await;
    enter_all(&app, 1..=50).await;
    poll_until_answered_locally(&app, 50).await;
    redis.kill();
    let r = poll_until(&app, 50, |_, r| r["status"] == "DIRECT_ADMITTED").await;
    assert!(r["entryToken"].is_string(), "{r}");
}
