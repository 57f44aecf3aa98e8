//! `vq loadgen --opening-in`: a simulated sale opening against vq serve on a real Redis.

use super::*;

/// `--opening-in`: users arriving before the opening gather in the pre-queue and are placed
/// by the seed's shuffle, so their places do not follow their arrival order; users after the
/// opening are first come, first served. (The seed is the run's: the figures are the same on
/// every run, the bounds are loose for the 100–300 users placed, where chance alone gives
/// |r| ≈ 0.06–0.1.)
#[tokio::test]
async fn a_simulated_opening_shows_that_arrival_order_does_not_decide_the_pre_queue() {
    let redis = RedisServer::spawn();
    // Not fail-open on a loaded machine: every enter must reach the pre-queue or the queue.
    let mut env = serve_env();
    env.push(("VQ_REDIS__TIMEOUT_MS", "5000".to_owned()));
    let server = VqProcess::serve(&redis, &env).await;
    flag_on(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("opening.json");
    let out = vq(
        &redis,
        &[
            "loadgen",
            "--url",
            &server.addr,
            "--target",
            "limited-drop:12",
            "--users",
            "400",
            "--rate",
            "200",
            "--arrival",
            "constant",
            "--duration",
            "6",
            "--opening-in",
            "1.5",
            "--poll-min-ms",
            "300",
            "--poll-max-ms",
            "500",
            "--concurrency",
            "64",
            "--quiet",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("arrival vs place, pre-queued (Spearman)"), "{stdout}");
    let o = &read_json(&json)["opening"];
    let prequeued = o["prequeued"].as_u64().unwrap();
    assert!((250..=320).contains(&prequeued), "about 1.5 s × 200/s pre-queued: {o}");
    // Most see their place at a poll after the opening; on a loaded machine some are admitted
    // (10 per 500 ms) before their next poll shows it.
    assert!(o["prequeuedPlaced"].as_u64().unwrap() >= 100, "{o}");
    let shuffled = o["prequeuedRankCorrelation"].as_f64().unwrap();
    assert!(shuffled.abs() < 0.3, "pre-queued places follow arrival order: {o}");
    assert!(o["later"].as_u64().unwrap() >= 50, "{o}");
    assert!(o["laterRankCorrelation"].as_f64().unwrap() > 0.9, "after the opening, first come first served: {o}");
}

/// Without Redis the opening cannot be scheduled: a clear error, not a run without it.
#[tokio::test]
async fn an_opening_without_redis_is_a_clear_error() {
    let redis = RedisServer::spawn();
    let server = VqProcess::serve(&redis, &serve_env()).await;
    let out = crate::support::vq_command()
        .args(["loadgen", "--url", &server.addr, "--target", "limited-drop:1", "--opening-in", "2", "--quiet"])
        .env("VQ_REDIS__URL", format!("redis://127.0.0.1:{}", free_port()))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--opening-in"), "{stderr}");
}
