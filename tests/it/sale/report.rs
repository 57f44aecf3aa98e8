//! `vq sale report` after the sale: a short sale with real buyers on a real Redis and a real
//! purchase API behind the gate, paused, resumed and closed with the CLI, whose queue keys then
//! expire (a key TTL of 2 s); the report still has every figure, from the target's record.

use super::*;
use crate::rig::Recorder;

/// The CLI with the test's record lifetime (what `vq serve` here runs with too).
fn report_cli(redis: &RedisServer, args: &[&str]) -> Output {
    vq_command()
        .args(args)
        .env("VQ_REDIS__URL", redis.url())
        .env("VQ_QUEUE__RECORD_TTL_DAYS", "3")
        .output()
        .expect("run vq")
}

fn report_json(redis: &RedisServer) -> Value {
    let out = report_cli(redis, &["sale", "report", "limited-drop:7", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("report json")
}

fn sum(series: &Value, field: &str) -> u64 {
    series.as_array().expect("series").iter().map(|r| r[field].as_u64().expect("count")).sum()
}

#[tokio::test]
async fn the_report_outlives_the_queue_keys_with_every_figure_of_the_sale() {
    let redis = RedisServer::spawn();
    let (recorder, backend) = Recorder::spawn().await;
    let mut s = test_settings(Some(&redis));
    s.queue.key_ttl_s = 2;
    s.queue.batch_size = 3;
    s.queue.record_ttl_days = 3;
    s.gate.upstream = Some(format!("http://{backend}"));
    let app = spawn_app(s, true).await;
    flag_on(&redis).await;

    // Scheduled by the CLI: the pre-queue is open, the opening 2 s away.
    let opens_at = now_ms() + 2000;
    let out = report_cli(
        &redis,
        &[
            "sale",
            "schedule",
            "limited-drop:7",
            "--opens-at",
            &vq::domain::format_instant(opens_at),
            "--prequeue-from",
            &vq::domain::format_instant(now_ms() - 1000),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    for u in 1..=4 {
        assert_eq!(app.json(app.enter(T, u).await).await["status"], "PRE_QUEUE");
    }
    assert_eq!(app.leave(T, 4).await.status(), 204, "user 4 gives up in the pre-queue");
    until(opens_at + 700).await;
    for u in 5..=9 {
        let b = app.json(app.enter(T, u).await).await;
        assert!(b["status"] == "WAITING" || b["status"] == "ADMITTED", "{b}");
    }
    // Paused and resumed by the CLI: nobody is admitted between the two.
    let out = report_cli(&redis, &["sale", "pause", "limited-drop:7"]);
    assert!(out.status.success(), "{}", stderr(&out));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let out = report_cli(&redis, &["sale", "resume", "--target", "limited-drop:7"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // Every remaining buyer is admitted and all but user 9 buy once through the gate.
    let buyers = [1, 2, 3, 5, 6, 7, 8, 9];
    let mut bought = 0;
    for u in buyers {
        let token = app.admitted_token(T, u).await;
        if u == 9 {
            continue;
        }
        let r = app
            .client
            .post(app.url("/limited-drops/7/orders"))
            .header("X-User-Id", u.to_string())
            .header("X-Entry-Token", token)
            .body("{\"qty\":1}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "the purchase API answers user {u}");
        bought += 1;
    }
    assert_eq!(recorder.take().len(), bought, "the purchase API got every purchase");
    let out = report_cli(&redis, &["sale", "close", "limited-drop:7", "--message", "Sold out"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = show_json(&redis);

    // The queue keys expire (2 s after the queue emptied): the stats' figures are gone.
    let mut c = redis.conn().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: u64 = redis::cmd("EXISTS")
            .arg(format!("{P}waits"))
            .arg(format!("{P}seq"))
            .arg(format!("{P}admitted_count"))
            .arg(format!("{P}waiting"))
            .query_async(&mut c)
            .await
            .unwrap();
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the queue keys never expired ({left} left)");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let snapshot = open_store(&test_settings(Some(&redis))).snapshot(target()).await.unwrap();
    assert_eq!(snapshot.admitted_total, 0, "the queue's own figures expired with its keys");

    // The report has every figure.
    let r = report_json(&redis);
    let t = &r["totals"];
    assert_eq!(t["arrivals"], 9, "4 pre-queued and 5 after the opening: {r}");
    assert_eq!(t["admitted"], 8, "{r}");
    assert_eq!(t["left"], 1, "{r}");
    assert_eq!(t["evicted"], 0, "{r}");
    assert_eq!(t["purchasesForwarded"], bought, "{r}");
    assert_eq!(t["answers"]["2xx"], bought, "{r}");
    assert_eq!(t["answers"]["5xx"], 0, "{r}");
    assert_eq!(r["tokens"]["issued"], 8, "{r}");
    assert_eq!(r["tokens"]["used"], bought, "{r}");
    assert_eq!(r["tokens"]["unused"], 1, "user 9's token, still valid: {r}");
    assert!(r["tokens"]["expired"].is_null(), "{r}");
    assert_eq!(r["waits"]["counted"], 8, "{r}");
    let (p50, p95, max) = (
        r["waits"]["p50Seconds"].as_f64().unwrap(),
        r["waits"]["p95Seconds"].as_f64().unwrap(),
        r["waits"]["maxSeconds"].as_f64().unwrap(),
    );
    assert!(p50 <= p95 && max > 1.0 && max < 30.0, "the pause made them wait: {r}");
    let opening = &r["opening"];
    assert_eq!(opening["prequeued"], 3, "user 4 left before the opening: {r}");
    assert_eq!(opening["seed"], shown["seed"], "the seed revealed at the opening");
    assert_eq!(opening["seedCommitment"], shown["seedCommitment"]);
    let events: Vec<(String, String)> = r["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["kind"].as_str().unwrap().to_owned(), e["source"].as_str().unwrap_or("").to_owned()))
        .collect();
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["schedule", "opening", "pause", "resume", "close"], "{r}");
    assert_eq!(events[2].1, "command", "who paused");
    assert_eq!(events[4].1, "command", "who closed");
    assert_eq!(r["events"][4]["message"], "Sold out");

    // The series per tick adds up to the totals; no admission between the pause and the resume.
    let series = &r["series"];
    assert_eq!(sum(series, "arrivals"), 9);
    assert_eq!(sum(series, "admitted"), 8);
    assert_eq!(sum(series, "forwarded"), bought as u64);
    let tick_ms = r["tickMs"].as_u64().unwrap();
    assert_eq!(tick_ms, 500);
    let at = |i: usize| r["events"][i]["atMs"].as_u64().unwrap();
    let (paused, resumed) = (at(2) / tick_ms, at(3) / tick_ms);
    for row in series.as_array().unwrap() {
        let tick = row["tick"].as_u64().unwrap();
        if tick > paused && tick < resumed {
            assert_eq!(row["admitted"], 0, "admitted while paused: {row}");
        }
    }

    // CSV: the same series in rows; text: the totals.
    let out = report_cli(&redis, &["sale", "report", "--target", "limited-drop:7", "--csv"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let csv = stdout(&out);
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("tick,at,arrivals,admitted,forwarded,answers_2xx,answers_3xx,answers_4xx,answers_5xx,answers_unreached")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), series.as_array().unwrap().len());
    assert_eq!(rows.iter().map(|r| r[3].parse::<u64>().unwrap()).sum::<u64>(), 8, "{csv}");
    let out = report_cli(&redis, &["sale", "report", "limited-drop:7"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("admitted: 8") && text.contains("paused (by command)"), "{text}");

    // Kept queue.record_ttl_days after its last write, not the key TTL.
    let ttl: i64 = redis::cmd("TTL").arg(format!("{P}record")).query_async(&mut c).await.unwrap();
    assert!((3 * 86_400 - 600..=3 * 86_400).contains(&ttl), "record ttl {ttl}");
    app.stop().await;
}

#[tokio::test]
async fn report_of_an_unknown_target_or_one_without_a_record_says_so_and_fails() {
    let redis = RedisServer::spawn();
    let out = report_cli(&redis, &["sale", "report", "limited-drop:999"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains("not a declared target"), "{}", stderr(&out));
    let out = report_cli(&redis, &["sale", "report", "limited-drop:8", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("has no record") && err.contains("3 days"), "{err}");
    assert!(!err.contains("panicked") && out.stdout.is_empty(), "{err}");
    let both = report_cli(&redis, &["sale", "report", "limited-drop:7", "--json", "--csv"]);
    assert_eq!(both.status.code(), Some(2), "one form at a time: {}", stderr(&both));
}
