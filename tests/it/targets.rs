//! Declared targets: a queue answers only for targets an operator declared, and nothing a
//! client names costs Redis memory, pump work or `/metrics` series; operator commands naming
//! an undeclared target fail and change nothing; a Redis out of memory opens no queue.

mod many;
mod types;

use std::collections::BTreeSet;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;

use vq::domain::FlagChange;

use crate::support::{RedisServer, change_flag, flag_on, open_store, spawn_app, test_settings, vq_command, wait_until};

/// Every key name and the value of every string/hash, to tell "nothing changed" exactly
/// (the live instances' acknowledgements excepted: they are rewritten every refresh).
async fn keyspace(redis: &RedisServer) -> BTreeSet<String> {
    let mut c = redis.conn().await;
    let keys: Vec<String> = c.keys("*").await.unwrap();
    let mut out = BTreeSet::new();
    // The instances' acknowledgements and reports are rewritten every few seconds, and their
    // own event log (`queue:events`: a clock drifting, Redis failing) can gain an entry on a
    // loaded machine at any time; none of them belongs to a target.
    let instances = ["virtual-queue:acks", "virtual-queue:fleet", "queue:events"];
    for k in keys.into_iter().filter(|k| !instances.contains(&k.as_str())) {
        let kind: String = redis::cmd("TYPE").arg(&k).query_async(&mut c).await.unwrap();
        let value = match kind.as_str() {
            // The waiting users' heartbeats (`…:beats`) are binary.
            "string" => format!("{:?}", c.get::<_, Vec<u8>>(&k).await.unwrap()),
            "hash" => format!("{:?}", c.hgetall::<_, std::collections::BTreeMap<String, String>>(&k).await.unwrap()),
            "set" => format!("{:?}", c.smembers::<_, BTreeSet<String>>(&k).await.unwrap()),
            other => other.to_owned(),
        };
        out.insert(format!("{k} = {value}"));
    }
    out
}

async fn used_memory(redis: &RedisServer) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query_async(&mut redis.conn().await).await.unwrap();
    info.lines().find_map(|l| l.strip_prefix("used_memory:")).unwrap().trim().parse().unwrap()
}

fn cli(redis: &RedisServer, args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = vq_command();
    cmd.args(args).env("VQ_REDIS__URL", redis.url());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run vq")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn enter_and_poll_of_an_undeclared_target_answer_404_and_write_nothing() {
    let redis = RedisServer::spawn();
    let app = spawn_app(test_settings(Some(&redis)), true).await;
    flag_on(&redis).await;
    // Declared (ids 1-100 in the tests' configuration): the queue answers.
    assert_eq!(app.json(app.enter("limited-drop/42", 7).await).await["status"], "WAITING");
    // The declared target's own keys change with the pump's ticks (it may admit user 7 at any
    // moment of a loaded run): everything else is compared, and no key may name the others.
    let others = async || -> BTreeSet<String> {
        keyspace(&redis).await.into_iter().filter(|k| !k.contains("LIMITED_DROP:42")).collect()
    };
    let before = others().await;

    for (what, resp) in [
        ("enter", app.enter("limited-drop/4242", 7).await),
        ("poll", app.poll("limited-drop/4242", 7).await),
        ("enter", app.enter("ticketing-event/101", 8).await),
        ("stats", app.client.get(app.url("/virtual-queues/limited-drop/4242/stats")).send().await.unwrap()),
    ] {
        assert_eq!(resp.status(), 404, "{what}");
        let body = app.json(resp).await;
        assert_eq!(body["code"], "UNKNOWN_TARGET", "{what}: {body}");
        assert!(body["detail"].as_str().unwrap().contains("not declared"), "{body}");
    }
    assert_eq!(others().await, before, "an undeclared target wrote something");
    let named: Vec<String> = keyspace(&redis)
        .await
        .into_iter()
        .filter(|k| k.contains("4242") || k.contains("TICKETING_EVENT:101"))
        .collect();
    assert!(named.is_empty(), "keys of an undeclared target: {named:?}");
    let active: BTreeSet<String> = redis.conn().await.smembers("queue:active").await.unwrap();
    assert_eq!(active, BTreeSet::from(["LIMITED_DROP:42".to_owned()]));
}

#[tokio::test]
async fn a_target_declared_at_runtime_answers_and_answers_404_once_removed() {
    let redis = RedisServer::spawn();
    let app = spawn_app(test_settings(Some(&redis)), false).await;
    flag_on(&redis).await;
    assert_eq!(app.enter("limited-drop/4242", 7).await.status(), 404);
    let out = cli(&redis, &["target", "add", "limited-drop:4242"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Instances read the declarations with the flag (flag.refresh_ms = 100 here).
    wait_until(Duration::from_secs(5), "the declared target answering", async || {
        app.json(app.enter("limited-drop/4242", 7).await).await["status"] == "WAITING"
    })
    .await;
    let out = cli(&redis, &["target", "remove", "limited-drop:4242"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until(Duration::from_secs(5), "the removed target answering 404", async || {
        app.poll("limited-drop/4242", 7).await.status() == 404
    })
    .await;
}

#[tokio::test]
async fn operator_commands_on_an_undeclared_target_exit_1_and_change_nothing() {
    let redis = RedisServer::spawn();
    // Far from the tests' configured ids (1-100), so only the runtime one is a near miss.
    let add = cli(&redis, &["target", "add", "limited-drop:98765"], &[]);
    assert!(add.status.success(), "{}", stderr(&add));
    let before = keyspace(&redis).await;
    for args in [
        &["flag", "off", "--target", "limited-drop:98756"][..],
        &["flag", "on", "--target", "limited-drop:98766"],
        &["sale", "pause", "limited-drop:9876"],
        &["sale", "close", "limited-drop:987651"],
        &["sale", "resume", "ticketing-event:98765"],
        &["batch", "set", "5", "--target", "limited-drop:98756"],
        &["stats", "--target", "limited-drop:98756"],
    ] {
        let out = cli(&redis, args, &[]);
        assert_eq!(out.status.code(), Some(1), "vq {args:?} must fail: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("is not a declared target: nothing changed"), "vq {args:?}: {err}");
        // Each of these is one edit (or one type) away from the declared limited-drop:98765.
        assert!(err.contains("did you mean limited-drop:98765?"), "vq {args:?}: {err}");
    }
    let far = cli(&redis, &["sale", "close", "limited-drop:55555"], &[]);
    assert_eq!(far.status.code(), Some(1));
    assert!(stderr(&far).contains("vq target list"), "{}", stderr(&far));
    assert_eq!(keyspace(&redis).await, before, "a refused command changed Redis");

    // The same commands on the declared target work.
    for args in [&["sale", "close", "limited-drop:98765"][..], &["batch", "set", "5", "--target", "limited-drop:98765"]]
    {
        let out = cli(&redis, args, &[]);
        assert!(out.status.success(), "vq {args:?}: {}", stderr(&out));
    }
}

#[tokio::test]
async fn declarations_stop_at_queue_max_targets() {
    let redis = RedisServer::spawn();
    // The tests' configuration declares 200 ids (two ranges of 100).
    let max = [("VQ_QUEUE__MAX_TARGETS", "202")];
    for t in ["limited-drop:1001", "limited-drop:1002"] {
        let out = cli(&redis, &["target", "add", t], &max);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = cli(&redis, &["target", "add", "limited-drop:1003"], &max);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("queue.max_targets"), "{}", stderr(&out));
    let out = cli(&redis, &["sale", "schedule", "limited-drop:1004", "--opens-at", "2099-01-01T00:00:00Z"], &max);
    assert_eq!(out.status.code(), Some(1), "schedule declares its target, within the limit: {}", stderr(&out));
    let declared: BTreeSet<String> = redis.conn().await.smembers("queue:targets").await.unwrap();
    assert_eq!(declared.len(), 2);
    // A configuration that declares more than the limit does not load.
    let out = cli(&redis, &["target", "list"], &[("VQ_QUEUE__MAX_TARGETS", "150")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("over queue.max_targets"), "{}", stderr(&out));
}

#[tokio::test]
async fn ten_thousand_undeclared_ids_leave_metrics_active_set_pump_and_memory_unchanged() {
    let redis = RedisServer::spawn();
    let settings = test_settings(Some(&redis));
    let app = Arc::new(spawn_app(settings.clone(), false).await);
    flag_on(&redis).await;
    for user in 1..=5 {
        assert_eq!(app.json(app.enter("limited-drop/42", user).await).await["status"], "WAITING");
    }
    // One undeclared request first, so the 404's own HTTP series exist in both scrapes.
    assert_eq!(app.enter("limited-drop/100000", 1).await.status(), 404);
    let metrics = |app: Arc<crate::support::TestApp>| async move {
        app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap()
    };
    // The first scrape creates the series of /metrics' own requests; the clock offset gauge
    // comes with the probe's first measurement.
    wait_until(Duration::from_secs(10), "the clock offset gauge", async || {
        metrics(app.clone()).await.contains("virtual_queue_clock_offset_seconds")
    })
    .await;
    let metrics_before = metrics(app.clone()).await;
    let keys_before = keyspace(&redis).await;
    let memory_before = used_memory(&redis).await;

    // 10,000 made-up ids, 32 clients at a time.
    let mut clients = tokio::task::JoinSet::new();
    for worker in 0..32u64 {
        let app = app.clone();
        clients.spawn(async move {
            let ids = (100_001..=110_000u64).filter(|id| id % 32 == worker);
            let mut statuses = Vec::new();
            for id in ids {
                statuses.push(app.enter(&format!("limited-drop/{id}"), id % 97 + 1).await.status().as_u16());
            }
            statuses
        });
    }
    let statuses: Vec<u16> = clients.join_all().await.into_iter().flatten().collect();
    assert_eq!(statuses.len(), 10_000);
    assert!(statuses.iter().all(|s| *s == 404), "every undeclared id answers 404");

    let metrics_after = metrics(app.clone()).await;
    let strip = |m: &str| -> BTreeSet<String> {
        // Same series, same names; only the figures may move (request counts, durations).
        m.lines().map(|l| l.rsplit_once(' ').map_or(l, |(series, _)| series).to_owned()).collect()
    };
    assert_eq!(strip(&metrics_after), strip(&metrics_before), "/metrics gained series");
    assert!(metrics_after.len() < metrics_before.len() + 200, "{} -> {}", metrics_before.len(), metrics_after.len());
    assert_eq!(keyspace(&redis).await, keys_before, "Redis gained keys");
    let grown = used_memory(&redis).await - memory_before;
    assert!(grown < 64 * 1024, "Redis grew by {grown} bytes");
    let pump = vq::pump::Pump::new(open_store(&settings), Arc::new(settings), "t".into());
    let round = pump.tick().await.expect("tick");
    assert_eq!(round.len(), 1, "the pump walks the one declared active target: {round:?}");
}

#[tokio::test]
async fn a_redis_out_of_memory_refuses_writes_but_opens_no_queue() {
    let redis = RedisServer::spawn();
    let mut settings = test_settings(Some(&redis));
    // Every poll goes to Redis here, so each one meets the refusal.
    settings.queue.local_polls = false;
    let app = spawn_app(settings, false).await;
    flag_on(&redis).await;
    assert_eq!(app.json(app.enter("limited-drop/1", 1).await).await["status"], "WAITING");

    // Fill Redis to its (tiny) maxmemory with noeviction, as the deployment docs advise.
    let mut c = redis.conn().await;
    let used = used_memory(&redis).await;
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg("noeviction").query_async(&mut c).await.unwrap();
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(used + 256 * 1024).query_async(&mut c).await.unwrap();
    // Big values first, then small ones: a refused big value frees its own request buffer,
    // which leaves room for small writes.
    for (size, prefix) in [(16 * 1024, "junk"), (64, "crumb")] {
        let blob = "x".repeat(size);
        for i in 0.. {
            let r: redis::RedisResult<()> = c.set(format!("{prefix}:{i}"), &blob).await;
            if r.is_err() {
                break;
            }
        }
    }

    // A write Redis refuses is no reason to let anyone in: each enter is queued (a script
    // whose first write frees or keeps memory may still run) or told the queue is full.
    let mut refused = 0;
    for (target, user) in [("limited-drop/1", 2), ("limited-drop/2", 3), ("ticketing-event/3", 4)] {
        let resp = app.enter(target, user).await;
        let status = resp.status();
        let body = app.json(resp).await;
        assert_ne!(body["status"], "DIRECT_ADMITTED", "enter {target} while Redis is full: {body}");
        if status == 429 {
            assert_eq!(body["code"], "QUEUE_FULL", "{body}");
            refused += 1;
        } else {
            assert_eq!(body["status"], "WAITING", "{body}");
        }
    }
    assert!(refused >= 2, "the new targets' first writes meet the OOM refusal");
    for _ in 0..3 {
        let resp = app.poll("limited-drop/1", 1).await;
        let status = resp.status();
        let body = app.json(resp).await;
        assert_ne!(body["status"], "DIRECT_ADMITTED", "poll while Redis is full: {body}");
        assert!(status == 503 || body["status"] == "WAITING", "{status} {body}");
    }
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("virtual_queue_store_errors_total{kind=\"data\"} ")
            && !metrics.contains("virtual_queue_store_errors_total{kind=\"data\"} 0"),
        "an OOM counts as a data error of that write"
    );
    assert!(metrics.contains("virtual_queue_store_errors_total{kind=\"unavailable\"} 0"), "not as Redis down");

    // Room again: the same instance queues as before.
    let _: () = redis::cmd("FLUSHDB").query_async(&mut c).await.unwrap();
    flag_on(&redis).await;
    app.wait_until_queued("limited-drop/2", 3).await;
}

#[tokio::test]
async fn a_purchase_of_an_undeclared_target_is_refused_and_never_forwarded() {
    let rig = crate::rig::Rig::start().await;
    let app = &rig.app;
    // With a token (of the declared target 1) or without, the gate answers before checking it.
    let token = crate::rig::token(7);
    let resp = app
        .client
        .post(app.url("/limited-drops/4242/orders"))
        .header("X-User-Id", "7")
        .header("X-Entry-Token", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(app.json(resp).await["code"], "UNKNOWN_TARGET");
    // Also with the queue off: a purchase route of an undeclared target is never unchecked.
    change_flag(rig.redis(), FlagChange::Off).await;
    let resp = app.client.post(app.url("/limited-drops/4242/orders")).header("X-User-Id", "7").send().await.unwrap();
    assert_eq!(resp.status(), 404);
    // nginx auth_request passes only 401/403: a 403 that says why.
    let resp = app
        .client
        .get(app.url("/gate/verify"))
        .header("X-Original-URI", "/limited-drops/4242/orders")
        .header("X-User-Id", "7")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    assert!(app.json(resp).await["detail"].as_str().unwrap().contains("not declared"));
    assert!(rig.recorder.take().is_empty(), "the purchase API received a purchase of an undeclared target");
}
