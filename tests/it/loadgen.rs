//! `vq loadgen` and `vq batch`, run as real processes against `vq serve` on a real Redis:
//! here the report and the run's failures; `vq batch` and the batch sweep (`batch.rs`), the
//! purchase API sink (`sink.rs`), the purchase contract against a stand-in server
//! (`stand_in.rs`) and a simulated sale opening (`opening.rs`) in their own files. These
//! tests assert behaviour and report shape, never speed.

mod batch;
mod opening;
mod sink;
mod stand_in;

use self::stand_in::{options, stand_in};

use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, Uri};
use redis::AsyncCommands;
use vq::domain::QueueTarget;
use vq::loadgen::{ArrivalCurve, Arrivals, Live, Options, Sink};

use crate::support::{RedisServer, VqProcess, flag_on, free_port, vq_command};

fn serve_env() -> Vec<(&'static str, String)> {
    vec![
        ("VQ_QUEUE__TICK_MS", "500".to_owned()),
        ("VQ_QUEUE__BATCH_SIZE", "10".to_owned()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
    ]
}

/// Runs `vq <args>` with the test Redis and the same queue settings as the server.
fn vq(redis: &RedisServer, args: &[&str]) -> Output {
    let mut cmd = vq_command();
    cmd.args(args).env("VQ_REDIS__URL", redis.url()).env("RUST_LOG", "warn");
    for (k, v) in serve_env() {
        cmd.env(k, v);
    }
    cmd.output().expect("run vq")
}

fn loadgen_args<'a>(addr: &'a str, json: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "loadgen",
        "--url",
        addr,
        "--target",
        "limited-drop:7",
        "--users",
        "400",
        "--rate",
        "400",
        "--arrival",
        "constant",
        "--duration",
        "3",
        "--poll-min-ms",
        "200",
        "--poll-max-ms",
        "300",
        "--abandon",
        "0.1",
        "--concurrency",
        "64",
        "--json",
        json,
        "--quiet",
    ];
    a.extend_from_slice(extra);
    a
}

fn read_json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("json report written")).expect("valid json")
}

#[tokio::test]
async fn loadgen_writes_a_sane_json_report_with_every_contract_field() {
    let redis = RedisServer::spawn();
    // The gate in vq serve forwards purchases to the loadgen's counting sink.
    let sink = format!("127.0.0.1:{}", free_port());
    let mut env = serve_env();
    env.push(("VQ_GATE__UPSTREAM", format!("http://{sink}")));
    let server = VqProcess::serve(&redis, &env).await;
    flag_on(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let out = vq(
        &redis,
        &loadgen_args(&server.addr, json.to_str().unwrap(), &["--purchase", "--sink", &sink, "--assert-no-5xx"]),
    );
    assert!(out.status.success(), "loadgen failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("poll") && stdout.contains("enters/s offered"), "{stdout}");

    let r = read_json(&json);
    for field in [
        "offeredEnterRate",
        "achievedEnterRate",
        "enter",
        "poll",
        "statusCounts",
        "admitted",
        "purchases",
        "downstreamMaxPerTick",
        "batchSize",
        "tickMs",
        "waitSeconds",
        "etaErrorSeconds",
        "redisBytesPerWaitingUser",
    ] {
        assert!(r.get(field).is_some(), "missing {field} in {r:#}");
    }
    for kind in ["enter", "poll"] {
        for f in ["count", "p50Ms", "p95Ms", "p99Ms", "maxMs"] {
            assert!(r[kind][f].is_number(), "{kind}.{f} in {r:#}");
        }
    }
    for f in ["p50", "p95", "max"] {
        assert!(r["waitSeconds"][f].is_number(), "waitSeconds.{f}");
    }
    for f in ["mean", "p95"] {
        assert!(r["etaErrorSeconds"][f].is_number(), "etaErrorSeconds.{f}");
    }
    assert_eq!(r["enter"]["count"], 400);
    assert!(r["poll"]["count"].as_u64().unwrap() > 0);
    assert!(r["offeredEnterRate"].as_f64().unwrap() > 0.0);
    assert!(r["achievedEnterRate"].as_f64().unwrap() > 0.0);
    assert!(r["admitted"].as_u64().unwrap() > 0, "{r:#}");
    assert_eq!(r["batchSize"], 10);
    assert_eq!(r["tickMs"], 500);
    assert!(r["abandoned"].as_u64().unwrap() > 0);
    let statuses = r["statusCounts"].as_object().unwrap();
    assert!(statuses.keys().all(|k| !k.starts_with('5')), "{statuses:?}");
    assert!(statuses["200"].as_u64().unwrap() > 400);
    // Every admitted user tried to purchase (DIRECT_ADMITTED ones too: a loaded debug
    // vq serve fails open when Redis answers late), through the gate to the sink.
    let admitted_all = r["admitted"].as_u64().unwrap() + r["directAdmitted"].as_u64().unwrap();
    assert_eq!(r["purchaseAttempts"].as_u64().unwrap(), admitted_all, "{r:#}");
    assert_eq!(r["purchases"], r["purchaseAttempts"], "every purchase passed the gate: {r:#}");
    let max_per_tick = r["downstreamMaxPerTick"].as_u64().unwrap();
    assert!(max_per_tick >= 1, "the sink counted the purchases: {r:#}");
    if r["directAdmitted"] == 0 {
        // The gate paces purchases into the downstream's budget: one batch per tick window.
        assert!(max_per_tick <= 10, "at most one batch per tick downstream: {r:#}");
    }
    assert!(r["redisBytesPerWaitingUser"].as_f64().unwrap() > 0.0, "{r:#}");
}

#[tokio::test]
async fn a_broken_bound_makes_loadgen_exit_non_zero_naming_it() {
    let redis = RedisServer::spawn();
    let server = VqProcess::serve(&redis, &serve_env()).await;
    flag_on(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let out = vq(&redis, &loadgen_args(&server.addr, json.to_str().unwrap(), &["--assert-poll-p95-ms", "0"]));
    assert_eq!(out.status.code(), Some(3), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--assert-poll-p95-ms"), "{stderr}");
    // The report is still written, for the script that asserted.
    assert!(read_json(&json)["poll"]["count"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn unusable_loadgen_input_is_refused_before_the_run() {
    let dead = format!("http://127.0.0.1:{}", free_port());
    for (args, says) in [
        (vec!["--url", "notaurl"], "--url must be a base URL"),
        (vec!["--url", "https://127.0.0.1:8443"], "plain HTTP"),
        (vec!["--url", "ftp://127.0.0.1:21"], "--url must be a base URL"),
        (vec!["--url", "http://127.0.0.1:8080/virtual-queues"], "--url must be a base URL"),
        (vec!["--url", dead.as_str()], "no HTTP answer"),
        (vec!["--url", "http://127.0.0.1:8080", "--users", "0"], "--users must be at least 1"),
    ] {
        let mut all = vec!["loadgen", "--target", "limited-drop:1", "--quiet", "--assert-no-5xx"];
        all.extend(args.iter().copied());
        let out = vq_command().args(&all).env("VQ_REDIS__URL", "redis://127.0.0.1:1").output().expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// A server that stops answering mid-run fails the run, with or without `--assert-…` flags.
#[tokio::test]
async fn a_run_with_requests_that_got_no_http_answer_fails() {
    let redis = RedisServer::spawn();
    let server = VqProcess::serve(&redis, &serve_env()).await;
    flag_on(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let child = vq_command()
        .args(loadgen_args(&server.addr, json.to_str().unwrap(), &[]))
        .env("VQ_REDIS__URL", redis.url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn loadgen");
    // Once users are polling, the server goes away.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut conn = redis.conn().await;
    loop {
        let waiting: u64 = conn.zcard("queue:{LIMITED_DROP:7}:waiting").await.unwrap_or(0);
        if waiting > 0 || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(server);
    let out = child.wait_with_output().expect("loadgen ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("got no HTTP answer"), "{stderr}");
}

/// With --follow-poll-after, simulated users poll when the server says (here every second: a
/// 4 s heartbeat caps it at 1 s) instead of every 100–150 ms: several times fewer polls.
#[tokio::test]
async fn following_poll_after_polls_at_the_servers_pace() {
    let redis = RedisServer::spawn();
    let envs = [
        ("VQ_QUEUE__TICK_MS", "500".to_owned()),
        ("VQ_QUEUE__BATCH_SIZE", "1".to_owned()),
        ("VQ_QUEUE__HEARTBEAT_TIMEOUT_S", "4".to_owned()),
        ("VQ_FLAG__REFRESH_MS", "100".to_owned()),
    ];
    let server = VqProcess::serve(&redis, &envs).await;
    flag_on(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let run = |json: &std::path::Path, first: &str, follow: bool| {
        let mut args = vec![
            "loadgen",
            "--url",
            &server.addr,
            "--target",
            "limited-drop:8",
            "--users",
            "100",
            "--rate",
            "1000",
            "--arrival",
            "constant",
            "--duration",
            "3",
            "--poll-min-ms",
            "100",
            "--poll-max-ms",
            "150",
            "--first-user",
            first,
            "--quiet",
            "--json",
            json.to_str().unwrap(),
        ];
        if follow {
            args.push("--follow-poll-after");
        }
        let out = vq_command().args(&args).env("VQ_REDIS__URL", redis.url()).output().expect("loadgen");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        read_json(json)
    };
    let fixed = run(&dir.path().join("fixed.json"), "1", false);
    let paced = run(&dir.path().join("paced.json"), "1001", true);
    assert_eq!(paced["followPollAfter"], true);
    let (f, p) = (fixed["poll"]["count"].as_u64().unwrap(), paced["poll"]["count"].as_u64().unwrap());
    assert!(p > 0 && p * 4 < f, "polls: fixed {f}, following pollAfterSeconds {p}: {paced}");
}

/// One slot for a rate no single connection can carry: enters leave late, and the report
/// says the figures are loadgen's limit, naming the slots.
#[tokio::test]
async fn a_run_held_back_by_its_own_concurrency_says_the_client_was_the_limit() {
    let (url, _) = stand_in(None).await;
    let mut o = options(url, "limited-drop:9");
    o.users = 3000;
    o.arrivals.rate = 1_000_000.0;
    o.concurrency = 1;
    o.purchase = false;
    let report = vq::loadgen::run(o, Arc::new(Live::default()), None, None).await;
    let why = report.client_limit.as_deref().expect("client named the limit");
    assert!(why.contains("the figures are the client's limit, not the server's"), "{why}");
    assert!(why.contains("--concurrency 1 slots"), "{why}");
    assert!(report.client.cpu_cores.is_some(), "{:?}", report.client);
}

/// A vq without `gate.upstream` answers every purchase 502: loadgen says that is the cause.
#[tokio::test]
async fn purchases_refused_for_want_of_an_upstream_are_explained() {
    let redis = RedisServer::spawn();
    let server = VqProcess::serve(&redis, &serve_env()).await;
    flag_on(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let out = vq(&redis, &loadgen_args(&server.addr, json.to_str().unwrap(), &["--purchase", "--assert-no-5xx"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("purchases got 502 UPSTREAM_UNAVAILABLE"), "{stderr}");
    assert!(stderr.contains("gate.upstream (VQ_GATE__UPSTREAM)"), "{stderr}");
}

/// With proof of work on, loadgen's buyers solve the challenge as a page does, enter with the
/// solution, and the report says what the work cost.
#[tokio::test]
async fn loadgen_solves_the_proof_of_work_and_reports_its_cost() {
    let redis = RedisServer::spawn();
    let mut env = serve_env();
    env.push(("VQ_ENTRY__POW_BITS", "10".to_owned()));
    let server = VqProcess::serve(&redis, &env).await;
    flag_on(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let mut args = loadgen_args(&server.addr, json.to_str().unwrap(), &[]);
    let users = args.iter().position(|a| *a == "--users").unwrap() + 1;
    args[users] = "60";
    let out = vq(&redis, &args);
    assert!(out.status.success(), "loadgen failed: {}", String::from_utf8_lossy(&out.stderr));
    let r = read_json(&json);
    let pow = &r["proofOfWork"];
    assert_eq!(pow["solved"], 60, "every buyer solved one challenge: {r:#}");
    assert!(pow["hashes"].as_u64().unwrap() >= 60, "{pow}");
    assert!(pow["p50Ms"].is_number() && pow["cpuSeconds"].is_number(), "{pow}");
    assert_eq!(r["entered"], 60, "every solution entered: {r:#}");
    assert_eq!(r["statusCounts"].get("403"), None, "no solution refused: {r:#}");
    let mut c = redis.conn().await;
    let waiting: u64 = c.zcard("queue:{LIMITED_DROP:7}:waiting").await.unwrap();
    let admitted: u64 = r["admitted"].as_u64().unwrap();
    assert!(waiting + admitted <= 60, "no place without a solution: {waiting} + {admitted}");
}
