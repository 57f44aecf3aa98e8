//! The purchase API stand-in (`vq loadgen --sink`): it counts every purchase in its tick
//! window, refuses what would wait past its capacity, and its figures sit in loadgen's report
//! beside the batch; sink options that cannot work are refused before the run.

use std::time::Duration;

use vq::loadgen::Sink;

use super::{loadgen_args, read_json, serve_env, vq};
use crate::support::{RedisServer, VqProcess, flag_on, free_port, vq_command};

#[tokio::test]
async fn sink_counts_every_arrival_in_its_tick_window() {
    let sink = Sink::start("127.0.0.1:0".parse().unwrap(), 60_000, Default::default()).await.unwrap();
    let from = sink.now_ms();
    let client = reqwest::Client::new();
    for path in ["/limited-drops/1/orders", "/events/2/seats/select", "/anything"] {
        let r = client.post(format!("http://{}{path}", sink.addr)).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let f = sink.figures(from, sink.now_ms());
    assert_eq!(f.total, 3);
    // 60 s windows: the three requests fall in one window, or two if a boundary passed.
    assert!(f.max_per_tick >= 2, "{f:?}");
}

#[tokio::test]
async fn a_downstream_bound_without_a_sink_is_a_usage_error() {
    let redis = RedisServer::spawn();
    let out = vq(
        &redis,
        &[
            "loadgen",
            "--url",
            "http://127.0.0.1:1",
            "--target",
            "limited-drop:1",
            "--assert-downstream-max-per-tick",
            "100",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--sink") && stderr.lines().count() == 1, "{stderr}");
}

#[tokio::test]
async fn a_sink_with_a_capacity_refuses_what_would_wait_too_long_with_retry_after() {
    let model = vq::loadgen::SinkModel { capacity: Some("10".parse().unwrap()), max_wait: Duration::from_millis(300) };
    let sink = Sink::start("127.0.0.1:0".parse().unwrap(), 60_000, model).await.unwrap();
    let from = sink.now_ms();
    let client = reqwest::Client::new();
    let url = format!("http://{}/limited-drops/1/orders", sink.addr);
    let mut sent = tokio::task::JoinSet::new();
    for _ in 0..30 {
        sent.spawn(client.post(&url).send());
    }
    let (mut ok, mut refused) = (0, 0);
    for a in sent.join_all().await {
        let a = a.unwrap();
        match a.status().as_u16() {
            200 => ok += 1,
            503 => {
                assert_eq!(a.headers()["retry-after"], "1");
                refused += 1;
            }
            other => panic!("the sink answered {other}"),
        }
    }
    // 10 per second, none waiting over 300 ms: 30 at once cannot all be served.
    assert!(refused > 0 && ok > 0, "{ok} served, {refused} refused");
    let f = sink.figures(from, sink.now_ms());
    assert_eq!((f.total, f.refused), (30, refused), "{f:?}");
    let served: u64 = sink.seconds(from, sink.now_ms()).iter().map(|s| s.served).sum();
    assert_eq!(served, ok);
}

#[tokio::test]
async fn a_token_refused_by_the_sink_and_retried_is_not_a_token_bought_twice() {
    // 10 per second, waits up to 100 ms: one purchase at once is served, the next refused.
    let model = vq::loadgen::SinkModel { capacity: Some("10".parse().unwrap()), max_wait: Duration::from_millis(100) };
    let sink = Sink::start("127.0.0.1:0".parse().unwrap(), 60_000, model).await.unwrap();
    let from = sink.now_ms();
    let client = reqwest::Client::new();
    let url = format!("http://{}/limited-drops/1/orders", sink.addr);
    let buy = async |token: &str| client.post(&url).header("x-entry-token", token).send().await.unwrap().status();
    // Until served (bounded): each refusal is answered at once, the next turn is 100 ms away.
    let buy_until_served = async |token: &str| {
        for _ in 0..100 {
            if buy(token).await == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{token} was never served");
    };
    // Two at once: one is served (answered when its 100 ms are done), the other refused.
    let (a, b) = tokio::join!(buy("a"), buy("b"));
    let (served, refused) = match (a.as_u16(), b.as_u16()) {
        (200, 503) => ("a", "b"),
        (503, 200) => ("b", "a"),
        other => panic!("expected one served and one refused, got {other:?}"),
    };
    buy_until_served(refused).await;
    assert_eq!(sink.figures(from, sink.now_ms()).repeated_tokens, 0, "{refused} bought once, after a refusal");
    buy_until_served(served).await;
    assert_eq!(sink.figures(from, sink.now_ms()).repeated_tokens, 1, "{served} bought twice");
}

#[tokio::test]
async fn loadgen_with_a_limited_sink_reports_the_batch_beside_what_the_sink_served() {
    let redis = RedisServer::spawn();
    let sink = format!("127.0.0.1:{}", free_port());
    let mut env = serve_env();
    env.push(("VQ_GATE__UPSTREAM", format!("http://{sink}")));
    let server = VqProcess::serve(&redis, &env).await;
    flag_on(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    // 20 admitted per second, half of them buy, against a purchase API that takes 4 per second.
    let extra = [
        "--purchase",
        "--sink",
        &sink,
        "--sink-capacity",
        "4,3@2s",
        "--sink-max-wait-ms",
        "300",
        "--conversion",
        "0.5",
    ];
    let out = vq(&redis, &loadgen_args(&server.addr, json.to_str().unwrap(), &extra));
    assert!(out.status.success(), "loadgen failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("sink capacity/s") && stdout.contains("conversion / no-shows"), "{stdout}");
    let r = read_json(&json);
    let timeline = r["timeline"].as_array().expect("a timeline with --sink");
    assert!(timeline.len() >= 3, "{r:#}");
    assert!(timeline.iter().filter_map(|p| p["batch"].as_u64()).all(|b| b == 10), "fixed batch 10: {r:#}");
    assert_eq!(timeline[0]["capacityPerSec"], 4.0, "{r:#}");
    assert_eq!(timeline.last().unwrap()["capacityPerSec"], 3.0, "the capacity changed at 2 s: {r:#}");
    let sum = |f: &str| timeline.iter().map(|p| p[f].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("served"), r["purchases"].as_u64().unwrap(), "{r:#}");
    assert_eq!(sum("refused"), r["downstreamRefused"].as_u64().unwrap(), "{r:#}");
    assert!(r["downstreamRefused"].as_u64().unwrap() > 0, "more buyers than capacity: {r:#}");
    let admitted_all = r["admitted"].as_u64().unwrap() + r["directAdmitted"].as_u64().unwrap();
    let no_shows = r["noShows"].as_u64().unwrap();
    assert!(no_shows > 0 && no_shows < admitted_all, "{r:#}");
    assert_eq!(r["purchaseAttempts"].as_u64().unwrap() + no_shows, admitted_all, "{r:#}");
}

#[tokio::test]
async fn a_bad_sink_capacity_or_conversion_is_refused_before_the_run() {
    for (args, says) in [
        (vec!["--sink", "127.0.0.1:1", "--sink-capacity", "0"], "positive"),
        (vec!["--sink", "127.0.0.1:1", "--sink-capacity", "50,20"], "@SECONDS"),
        (vec!["--sink-capacity", "50"], "--sink"),
        (vec!["--conversion", "1.5"], "--conversion must be between 0 and 1"),
    ] {
        let mut all = vec!["loadgen", "--url", "http://127.0.0.1:1", "--target", "limited-drop:1", "--quiet"];
        all.extend(args.iter().copied());
        let out = vq_command().args(&all).env("VQ_REDIS__URL", "redis://127.0.0.1:1").output().expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
