//! A Redis that stalls (a slow command, a fork, a long script) while enters are in flight:
//! the requests fail open within `redis.timeout_ms`, and a user told DIRECT_ADMITTED does not
//! also keep a place in the queue once Redis runs the late calls.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::Value;

use crate::support::{RedisServer, TestApp, flag_on, spawn_app, test_settings};

/// Blocks the server for `ms` as `DEBUG SLEEP` does (the DEBUG command is disabled on the
/// test servers): one script busy-waiting on Redis' clock. Returns when it has started.
pub(crate) async fn stall(redis: &RedisServer, ms: u64) -> tokio::task::JoinHandle<()> {
    let mut c = redis.conn().await;
    let mut probe = redis.conn().await;
    let handle = tokio::spawn(async move {
        let busy = redis::Script::new(
            "local function now() local t = redis.call('TIME') return t[1] * 1000 + t[2] / 1000 end
             local start = now()
             while now() - start < tonumber(ARGV[1]) do end
             return 1",
        );
        let mut inv = busy.prepare_invoke();
        inv.arg(ms);
        // This connection may give up waiting; the script runs on regardless.
        let _: Result<u64, _> = inv.invoke_async(&mut c).await;
    });
    // Running once another connection's PING gets no answer.
    for _ in 0..100 {
        let answered = tokio::time::timeout(Duration::from_millis(100), async {
            let _: Result<String, _> = redis::cmd("PING").query_async(&mut probe).await;
        })
        .await
        .is_ok();
        if !answered {
            return handle;
        }
    }
    panic!("the stall did not start");
}

#[tokio::test]
async fn enters_during_a_stall_fail_open_and_leave_no_place_behind() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.redis.timeout_ms = 250;
    let app = std::sync::Arc::new(spawn_app(s, false).await);
    flag_on(&redis).await;
    assert_eq!(app.json(app.enter("limited-drop/1", 1).await).await["status"], "WAITING");

    let mut c = redis.conn().await;
    let mut probe = redis.conn().await;
    let _stalled = stall(&redis, 2000).await;
    let mut tasks = Vec::new();
    for u in 100..128u64 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let v: Value = app.json(app.enter("limited-drop/1", u).await).await;
            (u, v)
        }));
    }
    let mut direct = Vec::new();
    for t in tasks {
        let (u, v) = t.await.unwrap();
        assert_eq!(v["status"], "DIRECT_ADMITTED", "user {u} during the stall: {v}");
        direct.push(u);
    }
    let still_stalled = tokio::time::timeout(Duration::from_millis(100), async {
        let _: Result<String, _> = redis::cmd("PING").query_async(&mut probe).await;
    })
    .await
    .is_err();
    assert!(still_stalled, "every enter answered while Redis was still stalled");

    // Once Redis has run the late calls, none of the users told DIRECT_ADMITTED holds a place.
    let mut holding = Vec::new();
    for _ in 0..50 {
        holding.clear();
        for u in &direct {
            // Errors while the stall lasts (this connection gives up waiting) count as holding.
            let place: Result<Option<u64>, _> = c.zscore("queue:{LIMITED_DROP:1}:waiting", u.to_string()).await;
            if !matches!(place, Ok(None)) {
                holding.push(*u);
            }
        }
        if holding.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(holding.is_empty(), "told DIRECT_ADMITTED and still queued: {holding:?}");
    let waiting: u64 = c.zcard("queue:{LIMITED_DROP:1}:waiting").await.unwrap();
    assert_eq!(waiting, 1, "user 1, who entered before the stall, keeps their place");
}

/// The flash sale's own load: this instance has more requests than it can get through Redis
/// within `redis.timeout_ms`, while Redis answers every call. Buyers wait for their place; the
/// instance does not take that for a dead Redis and let them all in (DIRECT_ADMITTED, with
/// the gate unpaced) — which on a saturated machine turned tens of thousands of buyers of a
/// sale straight into buyers of the purchase API.
#[tokio::test]
async fn an_instance_slower_than_its_redis_timeout_keeps_buyers_queued_while_redis_answers() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    // The smallest timeout there is: 800 enters at a time (4000 in all) take far longer than
    // it to go through two script calls of at most 128 users at a time.
    s.redis.timeout_ms = 10;
    let app = std::sync::Arc::new(spawn_app(s, false).await);
    flag_on(&redis).await;
    let entered = at_once(&app).await;
    // Queued, or told to retry with the place kept (an instance so far behind that a request
    // waited 5 s for its turn): never let in, whatever this machine's speed.
    let queued = entered.get("WAITING").copied().unwrap_or(0);
    let retry = entered.get("OVERLOADED").copied().unwrap_or(0);
    assert_eq!(queued + retry, 4000, "while Redis answered: {entered:?}");
    assert!(queued > 0, "{entered:?}");
    let mut c = redis.conn().await;
    let waiting: u64 = c.zcard("queue:{LIMITED_DROP:1}:waiting").await.unwrap();
    assert!(waiting >= queued && waiting <= 4000, "{waiting} waiting, {entered:?}");
    // And the instance serves from the queue afterwards (no fail-open window left open).
    assert_eq!(app.json(app.enter("limited-drop/1", 5000).await).await["status"], "WAITING");
}

/// Users 1..=4000 enter, 800 requests at a time; the statuses (or error codes) answered, counted.
async fn at_once(app: &std::sync::Arc<TestApp>) -> std::collections::BTreeMap<String, u64> {
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(800));
    let mut tasks = Vec::new();
    for u in 1..=4000u64 {
        let (app, in_flight) = (app.clone(), in_flight.clone());
        tasks.push(tokio::spawn(async move {
            let _slot = in_flight.acquire().await.unwrap();
            let resp = app.enter("limited-drop/1", u).await;
            let v: Value = app.json(resp).await;
            v["status"].as_str().or(v["code"].as_str()).unwrap_or("?").to_string()
        }));
    }
    let mut statuses = std::collections::BTreeMap::new();
    for t in tasks {
        *statuses.entry(t.await.unwrap()).or_default() += 1;
    }
    statuses
}

/// A Redis that stops answering altogether (SIGSTOP, its connections open): `/readyz` still
/// answers as a load balancer's readiness probe expects, within its timeout (3 s here, the
/// client's own bound on a PING being 5 s), saying the store is unreachable and naming the
/// node; it stays 200, and answers again once Redis does.
#[tokio::test]
async fn readyz_answers_in_time_while_redis_is_stopped_and_names_the_node() {
    let redis = RedisServer::spawn();
    let app = spawn_app(test_settings(Some(&redis)), false).await;
    let probe = reqwest::Client::builder().timeout(Duration::from_secs(3)).build().unwrap();
    let readyz = || async { probe.get(app.url("/readyz")).send().await };
    let r: Value = readyz().await.expect("readyz").json().await.unwrap();
    assert_eq!((r["store"].as_str(), r["silentNodes"].as_array().map(Vec::len)), (Some("ok"), Some(0)), "{r}");
    let pid = redis.pid().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill").args([sig, pid.as_str()]).status().is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    app.wait_silent(redis.port).await;
    for _ in 0..3 {
        let resp = readyz().await.expect("/readyz within a readiness probe's timeout while Redis is stopped");
        assert_eq!(resp.status(), 200);
        let r: Value = resp.json().await.unwrap();
        assert_eq!(r["store"], "unreachable", "{r}");
        assert_eq!(r["silentNodes"], serde_json::json!([format!("127.0.0.1:{}", redis.port)]), "{r}");
    }
    signal("-CONT");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r: Value = readyz().await.expect("readyz").json().await.unwrap();
        if r["store"] == "ok" && r["silentNodes"] == serde_json::json!([]) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "Redis answers again, /readyz never said so: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
