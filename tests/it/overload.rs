//! The queue holds when vq's own machines misbehave while Redis is healthy: an instance
//! starved of CPU sheds (503 OVERLOADED, places kept) and never answers as if Redis were down;
//! a client that hangs up mid-poll keeps their place; an instance whose clock is a minute
//! behind evicts nobody and accepts no expired token.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::Value;
use vq::domain::{QueueTarget, UserId};
use vq::token::mint;

use crate::gate::spawn_echo;
use crate::pacing::{BATCH, TICK_MS, load_per_tick};
use crate::stall::stall;
use crate::support::{RedisServer, VqProcess, flag_on, secret, spawn_app, test_settings};

/// Busy loops on both cores beside the instance under test, killed (by PID) on drop; each
/// also stops by itself after two minutes. The loop is the child itself (no `timeout` in
/// between, whose kill would leave its own child spinning).
struct Hogs(Vec<Child>);

impl Hogs {
    fn start(n: usize) -> Self {
        let spawn = || {
            Command::new("bash")
                .args(["-c", "while [ $SECONDS -lt 120 ]; do :; done"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn a busy loop")
        };
        Self((0..n).map(|_| spawn()).collect())
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn target() -> QueueTarget {
    "LIMITED_DROP:42".parse().unwrap()
}

/// What an answer says: the body's `status`, else its error `code`, else the HTTP status.
async fn outcome(resp: Result<reqwest::Response, reqwest::Error>) -> String {
    match resp {
        Err(e) if e.is_timeout() => "client timeout".into(),
        Err(e) => format!("transport error {e}"),
        Ok(r) => {
            let status = r.status().as_u16();
            let v: Value = r.json().await.unwrap_or(Value::Null);
            v["status"].as_str().or(v["code"].as_str()).map_or_else(|| format!("HTTP {status}"), str::to_owned)
        }
    }
}

/// Sends one request per user, built by `request`, `at_once` of them in flight; returns each
/// user's outcome.
async fn each<F>(users: impl IntoIterator<Item = u64>, at_once: usize, request: F) -> BTreeMap<u64, String>
where
    F: Fn(u64) -> reqwest::RequestBuilder,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(at_once));
    let mut tasks = Vec::new();
    for u in users {
        let slot = slots.clone().acquire_owned().await.unwrap();
        let req = request(u);
        tasks.push(tokio::spawn(async move {
            let o = outcome(req.send().await).await;
            drop(slot);
            (u, o)
        }));
    }
    let mut out = BTreeMap::new();
    for t in tasks {
        let (u, o) = t.await.unwrap();
        out.insert(u, o);
    }
    out
}

/// How many users had each outcome.
fn tally(outcomes: &BTreeMap<u64, String>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for o in outcomes.values() {
        *out.entry(o.clone()).or_default() += 1;
    }
    out
}

/// `vq serve` at the lowest CPU priority (`nice -n 19`) with a busy loop on each core beside
/// it and the smallest Redis timeout: its requests wait far longer for a turn on the CPU than
/// Redis takes to answer them. Enters, polls and purchases sent faster than it can serve.
#[tokio::test]
async fn a_starved_instance_sheds_and_never_answers_as_if_redis_were_down() {
    let redis = RedisServer::spawn();
    let upstream = spawn_echo().await;
    let envs = [
        ("VQ_REDIS__URL", redis.url()),
        ("VQ_REDIS__TIMEOUT_MS", "10".to_owned()),
        ("VQ_QUEUE__TICK_MS", TICK_MS.to_string()),
        ("VQ_QUEUE__BATCH_SIZE", BATCH.to_string()),
        ("VQ_QUEUE__LOCAL_POLLS", "false".to_owned()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
        ("VQ_GATE__UPSTREAM", upstream),
        ("VQ_HTTP__MAX_IN_FLIGHT", "200".to_owned()),
    ];
    let vq = VqProcess::serve_wrapped(&["nice", "-n", "19"], &envs).await;
    flag_on(&redis).await;
    // Generous: the answers of a starved process come late (a shed one, after at most 5 s of
    // waiting behind the others, once the process gets the CPU to send it). Each phase has
    // a client of its own: a connection left idle by the phase before may be closed by the
    // server (http.header_read_timeout_ms) just as the client reuses it, which no server can
    // answer (HTTP keep-alive's race, not vq's).
    let client = || reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap();
    let url = |path: &str| format!("{}{path}", vq.addr);
    let _hogs = Hogs::start(2);

    let entries = url("/virtual-queues/limited-drop/42/entries");
    let enter_client = client();
    let entered = each(1..=1000, 300, |u| enter_client.post(&entries).header("X-User-Id", u.to_string())).await;
    // Those who got a place poll (a shed enter gave none: a buyer would enter again).
    let placed: Vec<u64> = entered.iter().filter(|(_, o)| *o == "WAITING").map(|(u, _)| *u).collect();
    let me = url("/virtual-queues/limited-drop/42/entries/me");
    let poll_client = client();
    let polled = each(placed.iter().copied(), 300, |u| poll_client.get(&me).header("X-User-Id", u.to_string())).await;
    let (entered, polled) = (tally(&entered), tally(&polled));
    // Purchases: 100 tokens, each sent three times at once.
    let orders = url("/limited-drops/42/orders");
    let now = vq::service::now_epoch_ms() / 1000;
    let tokens: Vec<String> = (1..=100).map(|u| mint(&secret(), target(), &UserId::from(u), now, 300).raw).collect();
    let purchase_client = client();
    let purchase = |i: u64| {
        let u = (i - 1) % 100 + 1;
        purchase_client
            .post(&orders)
            .header("X-User-Id", u.to_string())
            .header("X-Entry-Token", &tokens[(u - 1) as usize])
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(300));
    let mut tasks = Vec::new();
    for i in 1..=300u64 {
        let slot = slots.clone().acquire_owned().await.unwrap();
        let req = purchase(i);
        tasks.push(tokio::spawn(async move {
            let resp = req.send().await;
            drop(slot);
            let r = match resp {
                Ok(r) => r,
                Err(e) => return (i, 0, Value::String(format!("{e:#}"))),
            };
            let status = r.status().as_u16();
            (i, status, r.json::<Value>().await.unwrap_or(Value::Null))
        }));
    }
    let mut forwarded: BTreeMap<u64, u64> = BTreeMap::new();
    let mut arrivals = Vec::new();
    let mut purchases: BTreeMap<String, u64> = BTreeMap::new();
    for t in tasks {
        let (i, status, v) = t.await.unwrap();
        let key = match status {
            200..300 => "forwarded".to_owned(),
            0 => format!("transport error {v}"),
            _ => format!("{status} {}", v["code"]),
        };
        *purchases.entry(key).or_default() += 1;
        if (200..300).contains(&status) {
            *forwarded.entry((i - 1) % 100 + 1).or_default() += 1;
            arrivals.push(v["receivedAtMs"].as_u64().unwrap());
        }
    }
    drop(_hogs);
    let summary = format!("enters {entered:?}, polls {polled:?}, purchases {purchases:?}");
    eprintln!("{summary}");

    // Nobody was let in as if Redis were down, and every answer was the queue's (a poll may
    // find its user admitted by the pump) or a shed.
    for (what, counts) in [("enter", &entered), ("poll", &polled)] {
        for (outcome, n) in counts {
            let queue =
                matches!(outcome.as_str(), "WAITING" | "OVERLOADED") || (what == "poll" && outcome == "ADMITTED");
            assert!(queue, "{what}: {n} answered {outcome}: {summary}");
        }
    }
    // Everyone answered WAITING still holds a place in Redis, or the pump admitted them (it
    // keeps its ticks while starved): places are kept through a shed.
    let mut c = redis.conn().await;
    let mut lost = Vec::new();
    for u in &placed {
        let waiting: Option<f64> = c.zscore("queue:{LIMITED_DROP:42}:waiting", u).await.unwrap();
        let admitted: bool = c.exists(format!("queue:{{LIMITED_DROP:42}}:token:{u}")).await.unwrap();
        if waiting.is_none() && !admitted {
            lost.push(*u);
        }
    }
    assert!(lost.is_empty(), "told WAITING, neither waiting nor admitted in Redis: {lost:?}: {summary}");
    // One-time use and pacing held.
    let twice: Vec<_> = forwarded.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "tokens forwarded more than once (user, times): {twice:?}: {summary}");
    if !arrivals.is_empty() {
        let load = load_per_tick(&arrivals);
        assert!(load.values().all(|n| *n <= BATCH), "at most {BATCH} purchases per tick: {load:?}: {summary}");
    }
    for key in purchases.keys() {
        assert!(
            matches!(key.as_str(), "forwarded" | "503 \"OVERLOADED\"" | "429 \"DOWNSTREAM_BUSY\"")
                || key.starts_with("403 \"QUEUE_BYPASS_DENIED\""),
            "purchase answered {key}: {summary}"
        );
    }
}

/// Clients that give up on a poll while its call waits in Redis (a slow moment; wrk's and
/// browsers' timeouts) were never told anything: they keep their place, and their next poll
/// finds them waiting, not NOT_IN_QUEUE.
#[tokio::test]
async fn clients_who_hang_up_mid_poll_keep_their_place() {
    let redis = RedisServer::spawn();
    let mut s = test_settings(Some(&redis));
    s.queue.local_polls = false;
    let app = spawn_app(s, false).await;
    flag_on(&redis).await;
    for u in 1..=200 {
        assert_eq!(app.json(app.enter("limited-drop/42", u).await).await["status"], "WAITING");
    }
    // Redis busy for 600 ms (it answers after: not silent); every poll's client gives up
    // after 100 ms, while its call waits behind the busy script.
    let stalled = stall(&redis, 600).await;
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(100)).build().unwrap();
    let me = app.url("/virtual-queues/limited-drop/42/entries/me");
    let gave_up = tally(&each(1..=200, 200, |u| impatient.get(&me).header("X-User-Id", u.to_string())).await);
    assert_eq!(gave_up.get("client timeout"), Some(&200), "{gave_up:?}");
    stalled.await.unwrap();

    let mut answers = BTreeMap::<String, u64>::new();
    for u in 1..=200 {
        *answers.entry(app.json(app.poll("limited-drop/42", u).await).await["status"].to_string()).or_default() += 1;
    }
    assert_eq!(answers, BTreeMap::from([("\"WAITING\"".to_owned(), 200)]), "after hanging up mid-poll");
}

/// One of two instances runs a minute behind (libfaketime on its process). Heartbeats, the
/// eviction's cut-off and token expiry all go by Redis' clock, so users polling through it
/// within the heartbeat timeout are never evicted, and it refuses a token that expired
/// (by Redis' clock) half a minute ago.
#[tokio::test]
async fn an_instance_a_minute_behind_evicts_nobody_and_refuses_expired_tokens() {
    const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
    assert!(std::path::Path::new(FAKETIME).exists(), "{FAKETIME} is missing: scripts/test.sh installs faketime");
    let redis = RedisServer::spawn();
    let upstream = spawn_echo().await;
    let common = [
        ("VQ_QUEUE__TICK_MS", "500".to_owned()),
        ("VQ_QUEUE__BATCH_SIZE", "1".to_owned()),
        ("VQ_QUEUE__HEARTBEAT_TIMEOUT_S", "10".to_owned()),
        ("VQ_QUEUE__KEY_TTL_S", "600".to_owned()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
        ("VQ_GATE__UPSTREAM", upstream),
    ];
    let _on_time = VqProcess::serve(&redis, &common).await;
    let mut behind_env = common.to_vec();
    behind_env.extend([
        ("LD_PRELOAD", FAKETIME.to_owned()),
        ("FAKETIME", "-60s".to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ]);
    let behind = VqProcess::serve(&redis, &behind_env).await;
    flag_on(&redis).await;
    let client = reqwest::Client::new();
    let ready: Value = client.get(format!("{}/readyz", behind.addr)).send().await.unwrap().json().await.unwrap();
    let offset = ready["clock"]["offsetMs"].as_i64();
    assert!(offset.is_some_and(|o| (55_000..65_000).contains(&o)), "libfaketime did not take: {ready}");
    assert!(ready["clock"]["detail"].as_str().is_some_and(|d| d.contains("behind")), "{ready}");

    // 100 users enter and poll through the instance behind every 2 s, for 16 s (more than
    // the 10-s heartbeat timeout; both instances run the pump).
    let me = |u: u64| {
        client
            .get(format!("{}/virtual-queues/limited-drop/42/entries/me", behind.addr))
            .header("X-User-Id", u.to_string())
    };
    for u in 1..=100u64 {
        let r = client
            .post(format!("{}/virtual-queues/limited-drop/42/entries", behind.addr))
            .header("X-User-Id", u.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.json::<Value>().await.unwrap()["status"], "WAITING");
    }
    let mut lost = Vec::new();
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        for u in 1..=100u64 {
            let r = me(u).send().await.unwrap();
            if r.status() == 404 {
                lost.push(u);
            }
        }
    }
    let mut c = redis.conn().await;
    let evicted: u64 = c.get("queue:{LIMITED_DROP:42}:evicted").await.unwrap_or(0);
    assert!(lost.is_empty() && evicted == 0, "{evicted} evicted; told NOT_IN_QUEUE: {lost:?}");

    // Tokens by Redis' clock: one that expired 30 s ago is refused, a fresh one passes.
    let now = vq::service::now_epoch_ms() / 1000;
    let order = |user: u64, token: String| {
        client
            .post(format!("{}/limited-drops/42/orders", behind.addr))
            .header("X-User-Id", user.to_string())
            .header("X-Entry-Token", token)
    };
    let expired = mint(&secret(), target(), &UserId::from(500), now - 330, 300).raw;
    let r = order(500, expired).send().await.unwrap();
    assert_eq!(r.status(), 403, "a token that expired 30 s ago");
    let fresh = mint(&secret(), target(), &UserId::from(501), now, 300).raw;
    let r = order(501, fresh).send().await.unwrap();
    assert_eq!(r.status(), 200, "a fresh token: {:?}", r.text().await);
}
